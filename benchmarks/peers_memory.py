# SPDX-License-Identifier: MIT
"""Peak device memory of the CuPy and PyTorch differential programs
(tests/peers/) on their own allocators and on cudamem's, with whether
the results agreed: a markdown table for benchmarks/RESULTS.md.

    python benchmarks/peers_memory.py [--libs cupy,torch]
        [--managers default,pool,async] [--json FILE] [--timeout S]

Every run is a fresh process, one at a time (the device's used memory is
read from cudaMemGetInfo, so nothing else should run on the GPU): each
library's program once on its own allocator (the reference), then on
cudamem under each manager (CuPy: ``use_with_cupy``; PyTorch:
``use_with_torch`` and ``torch_mempool``).  The columns:

- device used: the program's peak of the device's used memory, less
  what was used when it started (sampled after every step);
- library peak: CuPy's pool (bytes held, ``total_bytes``, and in use,
  ``used_bytes``, sampled) or PyTorch's ``max_memory_reserved`` /
  ``max_memory_allocated``;
- cudamem peak: ``memory_stats()["peak_allocated_bytes"]`` and the
  largest ``pool_reserved_bytes`` sampled;
- results: "equal" when every step agreed with the reference (bitwise
  steps byte for byte, close steps within the tolerance), else how many
  steps differed.

Exit status 1 when a run failed or a result differed; a library that is
not installed is reported and skipped.  Never run from the test suite.
"""

import argparse
import importlib.util
import json
import os
import pathlib
import subprocess
import sys
import time

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent
PEERS = ROOT / "tests" / "peers"
sys.path.insert(0, str(PEERS))

from peer_common import compare, last_json  # noqa: E402

PROGRAMS = {"cupy": ("cupy_program.py", "cupy", ("cudamem",)),
            "torch": ("torch_program.py", "torch", ("cudamem", "mempool"))}
MiB = 1 << 20


def run(lib, allocator, manager, timeout):
    script, own, _ = PROGRAMS[lib]
    env = dict(os.environ)
    env.pop("NUMBA_ENABLE_CUDASIM", None)
    env["CUDAMEM_SIMULATOR"] = "0"
    env["CUBLAS_WORKSPACE_CONFIG"] = ":4096:8"
    env["PYTHONPATH"] = os.pathsep.join(
        [str(ROOT)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH")
                       else []))
    if allocator == own:
        env.pop("CUDAMEM_MEMORY_MANAGER", None)
    else:
        env["CUDAMEM_MEMORY_MANAGER"] = manager
    t0 = time.monotonic()
    try:
        p = subprocess.run([sys.executable, str(PEERS / script),
                            "--allocator", allocator], env=env,
                           capture_output=True, text=True, timeout=timeout)
        out, err, rc = p.stdout, p.stderr, p.returncode
    except subprocess.TimeoutExpired:
        out, err, rc = "", "ran past %d s" % timeout, None
    secs = time.monotonic() - t0
    try:
        rec = last_json(out)
    except ValueError:
        rec = {"library": lib, "allocator": allocator, "manager": manager,
               "steps": {}, "memory": {},
               "error": "exit %s without a record: %s" % (
                   rc, (err.strip().splitlines() or [""])[-1])}
    rec["seconds"] = round(secs, 1)
    return rec


def mib(v):
    return "" if v is None else "%.1f" % (v / MiB)


def pair(a, b):
    if a is None and b is None:
        return ""
    return "%s / %s" % (mib(a) or "-", mib(b) or "-")


def row(rec, verdict):
    m = rec.get("memory", {})
    if rec["library"] == "cupy":
        lib_peak = pair(m.get("peak_pool_total"), m.get("peak_pool_used"))
    else:
        lib_peak = pair(m.get("peak_torch_reserved"),
                        m.get("peak_torch_allocated"))
    cm_peak = pair(m.get("peak_allocated_bytes"),
                   m.get("peak_pool_reserved_bytes"))
    return "| %s | %s | %s | %s | %s | %s | %s | %s |" % (
        rec["library"], rec["allocator"], rec.get("manager", "-"),
        mib(m.get("peak_device_used")), lib_peak, cm_peak, verdict,
        rec.get("seconds", ""))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--libs", default="cupy,torch")
    ap.add_argument("--managers", default="default,pool,async")
    ap.add_argument("--json", metavar="FILE")
    ap.add_argument("--timeout", type=int, default=300,
                    help="seconds a run may take (300)")
    a = ap.parse_args(argv)
    libs = [x for x in a.libs.split(",") if x]
    managers = [x for x in a.managers.split(",") if x]
    lines = ["| library | allocator | cudamem manager | device used peak "
             "(MiB) | library's peak: held / in use (MiB) | cudamem peak: "
             "allocated / pool reserved (MiB) | results | s |",
             "|---|---|---|---:|---:|---:|---|---:|"]
    records = []
    status = 0
    for lib in libs:
        if lib not in PROGRAMS:
            raise SystemExit("unknown library %r (cupy, torch)" % lib)
        if importlib.util.find_spec(lib) is None:
            print("%s: not installed, skipped" % lib)
            continue
        _, own, ours = PROGRAMS[lib]
        ref = run(lib, own, "-", a.timeout)
        records.append(ref)
        verdict = "reference"
        if ref.get("error"):
            verdict = "**failed**: " + ref["error"].strip().splitlines()[-1]
            status = 1
        lines.append(row(ref, verdict))
        print(lines[-1], flush=True)
        for manager in managers:
            for allocator in ours:
                rec = run(lib, allocator, manager, a.timeout)
                records.append(rec)
                problems, _ = compare(ref, rec)
                if rec.get("error"):
                    verdict = "**failed**: " + (
                        rec["error"].strip().splitlines()[-1])
                elif problems:
                    verdict = "**%d differ**" % len(problems)
                    for p in problems:
                        print("  " + p)
                else:
                    verdict = "equal (%d steps)" % len(rec["steps"])
                if problems or rec.get("error"):
                    status = 1
                lines.append(row(rec, verdict))
                print(lines[-1], flush=True)
    print()
    print("Peak device memory of tests/peers' programs "
          "(`benchmarks/peers_memory.py`):")
    print()
    print("\n".join(lines))
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"rows": lines, "records": records}, f, indent=1)
    return status


if __name__ == "__main__":
    sys.exit(main())
