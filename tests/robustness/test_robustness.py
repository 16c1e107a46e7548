# SPDX-License-Identifier: MIT
"""Adversarial sweep of the public API: bad types, shapes, dtypes,
strides and sizes, closed contexts, raising or lying dunder methods,
re-entrant callbacks.  Every case must end in a Python exception (of the
type numba raises, see docs/api.md#errors) or, where marked, in a
result; never in a crash, a hang, a SystemError or a leak.

The cases run in child processes, one per group, each printing a line
per case, so a crash is reported with the case that caused it.  They are
written in tests/helpers/robust_cases_arrays.py and
robust_cases_runtime.py, in robust_sweep.py's terms; the regression tests
of the bugs the sweep found are in test_robustness_regressions.py.  Running
this file as a script runs one group in this process (tests/ on the path
for the helpers):

    PYTHONPATH=tests CUDAMEM_SIMULATOR=1 \
        python3 tests/robustness/test_robustness.py GROUP [-v]
"""

import os
import subprocess
import sys

import pytest
from helpers import ROOT, TESTS, robust_sweep
from helpers.isolation import limit_device_memory_on_a_gpu

# On a GPU the groups run alone, not beside other test processes
# (.ci/gpu's exclusive phase): their many context resets slow down by
# minutes when other processes use the card (on the H200, beside the
# parallel phase, four groups passed their 120 s limit).  Each child is
# also held to a device memory limit (CUDAMEM_DEVICE_MEMORY_LIMIT,
# run_group), so that an absurd request fails at the limit, at once,
# whatever the card's size.
pytestmark = pytest.mark.exclusive
GROUP_MEMORY_LIMIT = "8GiB"

# Every group of cases, by name (tests/helpers/robust_sweep.py).
GROUPS = robust_sweep.groups()


# ------------------------------------------------------------------ #
# Child side                                                          #
# ------------------------------------------------------------------ #

LEAK_REPS = 6
LEAK_CONFIRM = 1000


def _child(group, verbose=False):
    import gc
    import warnings

    warnings.simplefilter("ignore")
    from helpers import robust_prelude

    cuda = robust_prelude.cuda
    ns0 = {k: getattr(robust_prelude, k) for k in dir(robust_prelude)
           if not k.startswith("__")}
    ns0["__builtins__"] = __builtins__
    import builtins

    Boom = robust_prelude.Boom

    def run(code):
        ns = dict(ns0)
        try:
            exec(code, ns)
        except BaseException as e:  # noqa: B036 - every outcome is data
            return type(e), "%s: %s" % (type(e).__name__,
                                        str(e)[:200].replace("\n", " "))
        finally:
            ns.clear()
        return None, "returned"

    def held():
        """Python memory blocks, live device allocations, pinned bytes,
        once queued work (stream callbacks hold their closures) is
        done."""
        cuda.synchronize()
        gc.collect()
        st = cuda.memory_stats()
        # Free blocks kept by the pinned pool (CUDAMEM_PINNED_POOL=1) are a
        # bounded cache, not a leak.
        cached = cuda.pinned_pool_stats()["free_bytes"]
        return (sys.getallocatedblocks(), st["allocation_count"],
                st["pinned_bytes"] - cached)

    # Objects alive now are never collected: leave them out of every
    # gc.collect() (most of the time spent here otherwise).
    cuda.current_context()
    gc.collect()
    gc.freeze()
    for name, src, expect in GROUPS[group]:
        print("START", name, flush=True)
        try:
            code = compile(src, name, "exec")
        except SyntaxError as e:
            print("FAIL %s: the case does not compile: %s" % (name, e))
            continue
        got, desc = run(code)
        bad = False
        if got is not None and issubclass(got, SystemError):
            bad = True
        elif expect == "ok":
            bad = got is not None
        elif expect == "any" or expect.endswith("|any"):
            bad = got is not None and not issubclass(got, Exception)
        elif got is None:
            bad = True
        elif expect != "raise":
            want = tuple(getattr(builtins, n, None)
                         or getattr(robust_prelude, n, None)
                         or getattr(robust_prelude.cuda, n)
                         for n in expect.split("|")) + (Boom,)
            bad = not issubclass(got, want)
        if bad or verbose:
            print("%s %s expected %s, got %s" % ("FAIL" if bad else "OUT",
                                                 name, expect, desc),
                  flush=True)
        # Cases that close the context (directly or through the prelude's
        # Close* objects) free everything each time: no leak to count, and
        # on a GPU each reset costs a tenth of a second.
        if bad or "close()" in src or "reset()" in src or "Close" in src:
            continue
        # Leaks: the same case again, LEAK_REPS times, must leave no more
        # Python blocks (one per call would be LEAK_REPS), live device
        # allocations or pinned bytes than it found.
        # A case over the threshold runs LEAK_CONFIRM times more, twice if
        # need be: caches that fill once (NumPy's, the interpreter's, the
        # pinned pool's) stay under half a block per call in the second
        # batch at the latest, and a leak does not.
        run(code)
        leaked = False
        try:
            for reps in (LEAK_REPS, LEAK_CONFIRM, LEAK_CONFIRM):
                before = held()
                for _ in range(reps):
                    run(code)
                after = held()
                if (after[0] - before[0] < reps // 2
                        and after[1] <= before[1] and after[2] <= before[2]):
                    break
            else:
                leaked = True
        except Exception as e:
            print("FAIL %s: memory_stats() after it raised %r" % (name, e),
                  flush=True)
        if leaked:
            print("FAIL %s leaks: blocks, device allocations, pinned bytes "
                  "%s -> %s in %d calls" % (name, before, after, reps),
                  flush=True)
    print("DONE", flush=True)


# ------------------------------------------------------------------ #
# Parent side                                                         #
# ------------------------------------------------------------------ #

def run_group(group, timeout=120, env=None, base=None):
    """Run one group in a child; returns (returncode, stdout, stderr).
    base: the environment to start from (default: a copy of this
    process's).  A group run from a worker thread is given a copy made
    in the main thread, which pytest changes under a thread that
    iterates os.environ (PYTEST_CURRENT_TEST, set and removed around
    each test: a KeyError in the copy)."""
    e = dict(os.environ if base is None else base)
    limit_device_memory_on_a_gpu(e, GROUP_MEMORY_LIMIT)
    e.update(env or {})
    e["PYTHONPATH"] = os.pathsep.join(
        [str(TESTS), str(ROOT)]
        + [p for p in [e.get("PYTHONPATH")] if p])
    p = subprocess.run([sys.executable, "-X", "faulthandler", __file__,
                        group], capture_output=True, text=True,
                       timeout=timeout, env=e)
    return p.returncode, p.stdout, p.stderr


def _report(group, rc, out, err):
    lines = out.splitlines()
    fails = [ln for ln in lines if ln.startswith("FAIL ")]
    started = [ln[6:] for ln in lines if ln.startswith("START ")]
    msg = []
    if rc != 0 or not lines or lines[-1] != "DONE":
        msg.append("child of group %s exited %d during case %r"
                   % (group, rc, started[-1] if started else None))
        msg.append(err[-4000:])
    msg.extend(fails)
    return "\n".join(msg)


# The groups run in children, as many at once as there are cores, all
# started by the first test that needs one (in the order the tests run);
# each test then waits for its own.
_RUNS = {}


def _group_result(group, manager=None):
    if not _RUNS:
        import concurrent.futures

        pool = concurrent.futures.ThreadPoolExecutor(
            max_workers=max(1, os.cpu_count() or 1))
        todo = [(g, None) for g in sorted(GROUPS)]
        todo += [(g, m) for m in sorted(MANAGERS) for g in MANAGED_GROUPS]
        base = dict(os.environ)
        for g, m in todo:
            _RUNS[g, m] = pool.submit(run_group, g,
                                      env=MANAGERS[m] if m else None,
                                      base=base)
        pool.shutdown(wait=False)
    return _RUNS[group, manager].result()


@pytest.mark.parametrize("group", sorted(GROUPS))
def test_adversarial(group):
    rc, out, err = _group_result(group)
    msg = _report(group, rc, out, err)
    assert not msg, msg


# The groups whose memory comes and goes most, again with the other
# memory managers and the pinned pool.
MANAGERS = {
    "pool": {"CUDAMEM_MEMORY_MANAGER": "pool", "CUDAMEM_PINNED_POOL": "1"},
    "async": {"CUDAMEM_MEMORY_MANAGER": "async"},
}


MANAGED_GROUPS = ["copies", "hostmem", "misuse", "reentrancy"]


@pytest.mark.parametrize("group", MANAGED_GROUPS)
@pytest.mark.parametrize("manager", sorted(MANAGERS))
def test_adversarial_managers(group, manager):
    rc, out, err = _group_result(group, manager)
    msg = _report(group, rc, out, err)
    assert not msg, msg


if __name__ == "__main__":
    _child(sys.argv[1], verbose="-v" in sys.argv[2:])
