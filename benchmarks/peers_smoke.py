# SPDX-License-Identifier: MIT
"""A quick check, on a GPU, that the RMM and cuda.core columns work: the
libraries' versions and import paths, every benchmark row that has an
rmm or cuda.core column (timed with few repeats), and ``python -m cudamem
bench --quick --compare``'s rows of theirs.

    python benchmarks/peers_smoke.py [--repeats N]

Exits 1, saying why, when a library is installed but its column is
missing or reports an error; 0 otherwise (a library that is not
installed is reported, not failed).  About a minute on the H200.
"""

import argparse
import importlib.metadata
import pathlib
import sys

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))  # the in-tree build comes first

import harness  # noqa: E402

PEERS = ("rmm", "cuda.core")
DISTS = {"rmm": ("rmm-cu13", "rmm-cu12", "rmm"),
         "cuda.core": ("cuda-core", "cuda-python")}


def _version(lib):
    for dist in DISTS[lib]:
        try:
            return "%s %s" % (dist, importlib.metadata.version(dist))
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=7)
    args = ap.parse_args(argv)

    from cudamem import _bench

    problems = []
    installed = []
    for lib in PEERS:
        v = _version(lib)
        if v is None:
            print("%s: not installed" % lib)
            continue
        installed.append(lib)
        where = ""
        if lib == "cuda.core":
            try:
                where = " (classes from %s)" % (
                    _bench.cuda_core_module().__name__)
            except ImportError as e:
                where = " (import failed: %s)" % e
        print("%s: %s%s" % (lib, v, where))
    if not installed:
        print("nothing to check")
        return 0

    libs = {name: harness.load_lib(name)
            for name in ("cudamem", "cupy", "driver") + PEERS}
    for lib in installed:
        if libs[lib] is None:
            problems.append("%s is installed but did not load" % lib)

    import ops_alloc
    import ops_hostmem
    import ops_interop
    import ops_streams

    ops = [op for mod in (ops_alloc, ops_hostmem, ops_streams, ops_interop)
           for op in mod.OPS
           if any(lib in op["impls"] for lib in installed)]
    results = harness.run_ops(ops, libs, repeats=args.repeats)
    print(harness.format_table(results))
    for row in results:
        for lib in installed:
            if lib not in ops_row(ops, row["op"])["impls"]:
                continue
            err = row.get("errors", {}).get(lib)
            if err:
                problems.append("%s: %s: %s" % (row["op"], lib, err))
            elif lib not in row["times"] and lib not in row.get(
                    "skipped", {}):
                problems.append("%s: no %s figure" % (row["op"], lib))

    print("\npython -m cudamem bench --quick --compare (16 MiB at most):")
    res = _bench.run(quick=True, compare=True, max_size=16 << 20)
    print(_bench.format_table(res))
    for lib in installed:
        if lib not in res["libraries"]:
            problems.append("bench --compare has no %s column" % lib)
        elif not any(r["library"] == lib for r in res["latency"]):
            problems.append("bench --compare timed nothing of %s" % lib)

    print()
    for p in problems:
        print("PROBLEM: " + p)
    print("peers smoke: %s" % ("FAILED" if problems else "ok"))
    return 1 if problems else 0


def ops_row(ops, name):
    return next(op for op in ops if op["name"] == name)


if __name__ == "__main__":
    sys.exit(main())
