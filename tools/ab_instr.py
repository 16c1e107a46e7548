"""Instructions per call of one Python statement under two cudamem trees:
an A/B that does not depend on the machine's noise.

Each tree's statement runs under valgrind's callgrind twice, N0 and N1
times, on the simulator (by default) and with one BLAS thread; the
difference of the two runs over N1 - N0 is the cost of one call, start-up
and set-up taken out.  Every run has the hash seed 0 (``--env
PYTHONHASHSEED=...`` sets another), so that start-up is the same in both.
Printed per call: the whole program, cudamem's C (the self cost of every
function in the extension) and the inclusive cost of each of cudamem's
functions (``cm_*``) that either tree spends at least --min instructions
a call in, with B - A.

    python tools/ab_instr.py .ab-base . \\
        --setup "import numpy as np; f = np.float32" \\
        --stmt "cuda.device_array(256, f)" --env CUDAMEM_MEMORY_MANAGER=pool

The trees must be built in place (``pip install -e .`` or
``python setup.py build_ext --inplace``); ``cuda`` is the tree's
``cudamem``.  Counts are instructions, not time: a change that moves the
cost into the driver, or into waiting, does not show here.  With
``--calls`` (the simulator only) it also prints the driver calls per call
of the statement, by entry point (the simulator's ``sim_<Name>``
functions, which stand for ``cu<Name>``), as callgrind counted them.
"""
import argparse
import concurrent.futures
import os
import re
import shutil
import subprocess
import sys
import tempfile

DRIVER = """\
import sys
sys.path.insert(0, sys.argv[1])
import cudamem as cuda
assert cuda.__file__.startswith(sys.argv[1]), cuda.__file__
exec(sys.argv[3])
stmt = compile(sys.argv[4], "<stmt>", "exec")
for _ in range(int(sys.argv[2])):
    exec(stmt)
"""

LINE = re.compile(r"^\s*([0-9,]+)\s+(?:\([^)]*\)\s+)?(\S.*)$")


def annotate(path, inclusive):
    """{function: cost} and {function: True if in cudamem's extension}
    from a callgrind output file."""
    out = subprocess.run(
        ["callgrind_annotate", "--threshold=100",
         "--inclusive=%s" % ("yes" if inclusive else "no"), path],
        capture_output=True, text=True, check=True).stdout
    cost, ours = {}, {}
    for line in out.splitlines():
        m = LINE.match(line)
        if not m or m.group(2).startswith("=>"):
            continue
        what = m.group(2)
        if what == "PROGRAM TOTALS":
            cost[what] = int(m.group(1).replace(",", ""))
            continue
        obj = re.search(r"\[([^\]]*)\]\s*$", what)
        if not obj:
            continue        # a source line, not a function
        func = what[:obj.start()].rstrip().rsplit(":", 1)[-1]
        func = re.sub(r" \(\d[\d,]*x\)$", "", func)
        cost[func] = cost.get(func, 0) + int(m.group(1).replace(",", ""))
        ours[func] = "/_core." in obj.group(1) or obj.group(1).startswith(
            "_core.")
    return cost, ours


ENTRY = re.compile(r"^sim_[A-Z]\w*$")


def driver_calls(path):
    """{cuName: calls} of the simulator's entry points from a callgrind
    output file (the calls= lines under each cfn=, names compressed)."""
    names, calls, callee = {}, {}, None
    with open(path) as f:
        for line in f:
            if line.startswith("cfn="):
                m = re.match(r"cfn=\((\d+)\)(?: (.*))?$", line.rstrip("\n"))
                if m.group(2) is not None:
                    names[m.group(1)] = m.group(2)
                callee = names.get(m.group(1))
            elif line.startswith("fn="):
                m = re.match(r"fn=\((\d+)\)(?: (.*))?$", line.rstrip("\n"))
                if m and m.group(2) is not None:
                    names[m.group(1)] = m.group(2)
                callee = None
            elif line.startswith("calls=") and callee is not None:
                if ENTRY.match(callee):
                    name = "cu" + callee[4:]
                    calls[name] = calls.get(name, 0) + int(
                        line.split("=", 1)[1].split()[0])
                callee = None
    return calls


def profile(tree, setup, stmt, n, env, work):
    """(program, cudamem's C, {cm_ function: inclusive}, {driver call:
    count}) for n calls."""
    path = os.path.join(work, "cg.%d" % n)
    cmd = ["valgrind", "--tool=callgrind", "--callgrind-out-file=" + path,
           sys.executable, "-c", DRIVER, tree, str(n), setup, stmt]
    p = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit("%s: the statement failed under callgrind:\n%s"
                 % (tree, p.stderr[-3000:]))
    self_cost, ours = annotate(path, False)
    incl, _ = annotate(path, True)
    total = self_cost.get("PROGRAM TOTALS", 0)
    c = sum(v for k, v in self_cost.items() if ours.get(k))
    funcs = {k: v for k, v in incl.items() if k.startswith("cm_")}
    return total, c, funcs, driver_calls(path)


def start(tree, a, pool, work):
    """Tree's two runs (N0 and N1 calls), handed to pool; their files
    go to the folder work."""
    # One hash seed for every run: with Python's random one, the start-up
    # and set-up of two runs differ by up to a few hundred thousand
    # instructions, more than 200 calls of a small statement cost.
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1",
               PYTHONHASHSEED="0")
    if a.simulator:
        env["CUDAMEM_SIMULATOR"] = "1"
    else:
        env.pop("CUDAMEM_SIMULATOR", None)
    for kv in a.env:
        k, _, v = kv.partition("=")
        env[k] = v
    os.makedirs(work)
    return [pool.submit(profile, tree, a.setup, a.stmt, n, env, work)
            for n in (a.n0, a.n1)]


def per_call(a, runs):
    """What one call costs, from the two runs of start()."""
    (t0, c0, f0, d0), (t1, c1, f1, d1) = (r.result() for r in runs)
    d = float(a.n1 - a.n0)
    funcs = {k: (f1[k] - f0.get(k, 0)) / d for k in f1}
    calls = {k: (d1[k] - d0.get(k, 0)) / d for k in d1}
    return (t1 - t0) / d, (c1 - c0) / d, funcs, calls


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("tree_a")
    ap.add_argument("tree_b")
    ap.add_argument("--stmt", required=True)
    ap.add_argument("--setup", default="pass")
    ap.add_argument("--n0", type=int, default=1000)
    ap.add_argument("--n1", type=int, default=11000)
    ap.add_argument("--env", action="append", default=[],
                    help="KEY=VALUE set in the profiled process")
    ap.add_argument("--min", type=float, default=5.0,
                    help="show cm_ functions from this many a call")
    ap.add_argument("--driver", dest="simulator", action="store_false",
                    help="the real driver, not the simulator")
    ap.add_argument("--calls", action="store_true",
                    help="also the simulator's driver calls per call")
    ap.add_argument("--jobs", type=int, default=min(4, os.cpu_count() or 1),
                    help="runs under callgrind at once (default: the "
                         "cores, at most 4); instructions, not time, so "
                         "the figures do not depend on it")
    a = ap.parse_args(argv)
    if a.n1 <= a.n0:
        sys.exit("--n1 must be larger than --n0")
    if shutil.which("valgrind") is None:
        sys.exit("valgrind is not installed")
    trees = [os.path.abspath(a.tree_a), os.path.abspath(a.tree_b)]
    work = tempfile.mkdtemp(prefix="ab-instr-")
    try:
        with concurrent.futures.ThreadPoolExecutor(max(1, a.jobs)) as pool:
            runs = [start(t, a, pool, os.path.join(work, "ab"[i]))
                    for i, t in enumerate(trees)]
            (ta, ca, fa, da), (tb, cb, fb, db) = (per_call(a, r)
                                                  for r in runs)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print("instructions per call of %r (%d - %d calls)"
          % (a.stmt, a.n1, a.n0))
    print("A = %s\nB = %s" % tuple(trees))
    print("%-40s %10s %10s %9s" % ("", "A", "B", "B - A"))
    rows = [("the whole program", ta, tb), ("cudamem's C (self)", ca, cb)]
    names = sorted((k for k in fa.keys() | fb.keys()
                    if max(fa.get(k, 0), fb.get(k, 0)) >= a.min),
                   key=lambda k: -max(fa.get(k, 0), fb.get(k, 0)))
    rows += [(k + " (incl.)", fa.get(k, 0.0), fb.get(k, 0.0))
             for k in names]
    for name, x, y in rows:
        print("%-40s %10.1f %10.1f %+9.1f" % (name[:40], x, y, y - x))
    if a.calls:
        print("driver calls per call (the simulator's entry points)")
        for k in sorted(da.keys() | db.keys()):
            x, y = da.get(k, 0.0), db.get(k, 0.0)
            if max(abs(x), abs(y)) >= 0.01:
                print("  %-38s %10.2f %10.2f %+9.2f" % (k, x, y, y - x))
    if not [k for k in names if k != "cm_init"]:
        print("no cm_ function is named: the extension is stripped of its "
              "local symbols (an installed wheel); build the trees in place")


if __name__ == "__main__":
    main()
