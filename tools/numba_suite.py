#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""numba-cuda's own test suite, run twice: on numba's memory manager and on
cudamem's EMM plugin (``NUMBA_CUDA_MEMORY_MANAGER=cudamem.numba_plugin``).

numba-cuda ships its tests in the package (``numba.cuda.tests``, unittest
test cases).  Each chosen module runs in a child process of its own, once
per run, under unittest (numba's test classes carry a pytest fixture that
only numba-cuda's source tree defines, so pytest cannot collect them from
the installed package); the children run ``-j`` at a time, the two runs of
a module side by side.  Every test's outcome is written by the child as it
ends, so a module stopped by its time limit or a crash still counts the
tests it ran (the test it was in is an error, "timed out" or "crashed").

    python tools/numba_suite.py --dry-run          # what would run
    python tools/numba_suite.py -j 16 --out DIR    # both runs
    python tools/numba_suite.py --all-cudapy       # all of cudapy too
    python tools/numba_suite.py --modules cudadrv.test_cuda_memory

It prints, and writes under ``--out`` (``numba-suite.json``,
``numba-suite.md``, ``summary.md``, and each child's log under
``logs/``), per module the tests run, passed, failed, errors and skipped
under each run, and the tests that pass on numba's manager but not on the
plugin, with the last line of the plugin run's error (or the reason it
was skipped).  A module with such tests is run again, both runs, one child
at a time, where the budget leaves time: a test that then passes on the
plugin is reported as not reproduced.

The children see ``CUDAMEM_SIMULATOR=0`` and no ``NUMBA_ENABLE_CUDASIM``
(numba's tests need the real driver, and the plugin must allocate on the
same device).  In each child, before numba is imported,
``numpy.row_stack`` is set to ``numpy.vstack`` where NumPy lacks it
(numba-cuda 0.30 fails at import on NumPy 2.5 otherwise), and where the
``filecheck`` package (numba-cuda's test dependency) is not installed a
stand-in is put in its place whose use skips the test, so that the
modules import: the tests that compare generated code with FileCheck
patterns are then skipped in both runs.

Exit status: 0 when every test that passes on numba's manager passes on
the plugin or is listed in docs/numba-compat.md's section on this suite
(``--listed``); 1 when some are not listed, or a module did not run to its
end in one run only; 2 when numba-cuda cannot run here (not installed,
or no driver: "numba cannot find a driver").
"""

import argparse
import concurrent.futures
import importlib.metadata
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

PLUGIN = "cudamem.numba_plugin"
#: The two runs: name -> NUMBA_CUDA_MEMORY_MANAGER (None: unset).
RUNS = (("numba", None), ("plugin", PLUGIN))
RUN_TITLES = {"numba": "numba's manager",
              "plugin": "cudamem.numba_plugin"}
PREFIX = "numba.cuda.tests."

# The modules run by default, under numba.cuda.tests, each with why.  All
# of cudadrv (the driver layer: the memory API lives there), and the
# cudapy modules whose tests allocate, copy, share or free device memory.
MODULES = {
    # --- cudadrv: all of it --------------------------------------------
    "cudadrv.test_array_attr": "device array attributes: shape, strides, "
                               "contiguity, ravel/reshape on device",
    "cudadrv.test_context_stack": "context push/pop, get_memory_info "
                                  "through the memory manager",
    "cudadrv.test_cuda_array_slicing": "device array slices, views and "
                                       "copies into and out of them",
    "cudadrv.test_cuda_auto_context": "the context made by the first "
                                      "allocation",
    "cudadrv.test_cuda_devicerecord": "device records: to_device and "
                                      "copies of structured scalars",
    "cudadrv.test_cuda_driver": "driver-level allocation, memcpy, "
                                "streams and events",
    "cudadrv.test_cuda_memory": "memalloc, memset, memcpy, views of "
                                "device memory, host allocation",
    "cudadrv.test_cuda_ndarray": "DeviceNDArray: to_device, "
                                 "copy_to_host, device_array_like, "
                                 "setitem, strides",
    "cudadrv.test_deallocations": "deferred deallocation and "
                                  "defer_cleanup",
    "cudadrv.test_detect": "device detection (cuda.detect)",
    "cudadrv.test_emm_plugins": "EMM plugins: set_memory_manager and "
                                "its interface",
    "cudadrv.test_events": "events recorded around copies",
    "cudadrv.test_host_alloc": "pinned and mapped host allocation",
    "cudadrv.test_init": "driver initialisation and its failures",
    "cudadrv.test_inline_ptx": "a kernel with inline PTX (driver layer)",
    "cudadrv.test_is_fp16": "fp16 support query",
    "cudadrv.test_linkable_code": "linkable code objects",
    "cudadrv.test_linker": "the linker: kernels writing device arrays",
    "cudadrv.test_managed_alloc": "managed memory allocation",
    "cudadrv.test_module_callbacks": "module load/unload callbacks",
    "cudadrv.test_nvjitlink": "nvJitLink linking",
    "cudadrv.test_nvrtc": "NVRTC compilation",
    "cudadrv.test_nvvm_driver": "NVVM compilation",
    "cudadrv.test_pinned": "pinned host memory and async copies",
    "cudadrv.test_profiler": "profiler start/stop around allocations",
    "cudadrv.test_reset_device": "device reset while memory is held",
    "cudadrv.test_runtime": "the runtime API binding",
    "cudadrv.test_select_device": "select_device from threads, arrays "
                                  "on each",
    "cudadrv.test_streams": "streams: async copies, callbacks, "
                            "async_done",
    # --- cudapy: the modules that exercise memory -----------------------
    "cudapy.test_array": "kernels on device arrays, local and shared "
                         "arrays, device_array_like",
    "cudapy.test_array_args": "arrays passed to kernels (automatic "
                              "transfer of host arrays)",
    "cudapy.test_array_methods": "array methods in kernels on device "
                                 "copies",
    "cudapy.test_array_reductions": "reductions on arrays copied to and "
                                    "from the device",
    "cudapy.test_blackscholes": "a kernel on to_device arrays with a "
                                "stream, results copied back",
    "cudapy.test_constmem": "constant memory filled from host arrays",
    "cudapy.test_cuda_array_interface": "the CUDA Array Interface: "
                                        "foreign arrays, views, streams",
    "cudapy.test_cuda_jit_no_types": "lazily compiled kernels on "
                                     "to_device arrays",
    "cudapy.test_datetime": "datetime arrays to the device and back",
    "cudapy.test_device_array_capture": "device arrays captured by "
                                        "kernels as globals",
    "cudapy.test_forall": "forall launches over device arrays",
    "cudapy.test_gufunc": "gufuncs: outputs allocated on the device, "
                          "streams",
    "cudapy.test_ipc": "IPC handles of device memory across processes",
    "cudapy.test_laplace": "an iterative kernel on device arrays with "
                           "a stream",
    "cudapy.test_localmem": "local memory arrays in kernels",
    "cudapy.test_matmul": "shared-memory matmul on to_device arrays",
    "cudapy.test_multigpu": "arrays and contexts on several devices "
                            "(skips on one)",
    "cudapy.test_multiprocessing": "a fork after the driver is in use",
    "cudapy.test_multithreads": "kernels and allocations from several "
                                "threads",
    "cudapy.test_nondet": "device arrays reused by repeated launches",
    "cudapy.test_numba_interop": "device arrays and numba types",
    "cudapy.test_random": "xoroshiro128p states: device arrays made by "
                          "numba",
    "cudapy.test_record_dtype": "record arrays to the device and back",
    "cudapy.test_reduction": "cuda.reduce: temporary device arrays",
    "cudapy.test_retrieve_autoconverted_arrays": "automatic copy-back of "
                                                 "host arguments",
    "cudapy.test_sm": "shared memory: static, dynamic, in device "
                      "functions",
    "cudapy.test_slicing": "slices of device arrays passed to kernels",
    "cudapy.test_stream_api": "the stream API: async copies, "
                              "auto_synchronize",
    "cudapy.test_transpose": "cuda transpose: device arrays allocated "
                             "for the result",
    "cudapy.test_vectorize": "ufuncs: device outputs, streams, "
                             "host/device argument mixes",
    "cudapy.test_warning": "the implicit-copy warnings for host arrays",
}

# The stand-in for the filecheck package: its names exist, and their use
# skips the test (numba's FileCheck assertions build an Options first).
_FILECHECK_STUB = {
    "filecheck.matcher": ("Matcher",),
    "filecheck.options": ("Options",),
    "filecheck.parser": ("Parser", "pattern_for_opts"),
    "filecheck.finput": ("FInput",),
}


# ---------------------------------------------------------------------------
# The child: one module under unittest, an outcome per line
# ---------------------------------------------------------------------------


def _prepare_numba():
    """What a child does before numba is imported."""
    import numpy as np

    if not hasattr(np, "row_stack"):
        np.row_stack = np.vstack
    try:
        import filecheck  # noqa: F401
    except ImportError:
        import types
        import unittest

        def unavailable(*args, **kwargs):
            raise unittest.SkipTest("filecheck is not installed")

        pkg = types.ModuleType("filecheck")
        pkg.__path__ = []
        sys.modules["filecheck"] = pkg
        for modname, names in _FILECHECK_STUB.items():
            mod = types.ModuleType(modname)
            for n in names:
                setattr(mod, n, unavailable)
            sys.modules[modname] = mod
            setattr(pkg, modname.rsplit(".", 1)[1], mod)


def _last_line(text):
    lines = [ln.strip() for ln in str(text).strip().splitlines()
             if ln.strip()]
    return lines[-1] if lines else ""


def _child(module, results):
    """Run ``module``'s tests; one JSON line per event into ``results``."""
    _prepare_numba()
    import traceback
    import unittest

    out = open(results, "a", buffering=1)

    def emit(**rec):
        out.write(json.dumps(rec) + "\n")

    class Result(unittest.TextTestResult):
        def __init__(self, *a, **k):
            super().__init__(*a, **k)
            self._cur = {}

        def startTest(self, test):
            super().startTest(test)
            self._cur[test.id()] = ("passed", "")
            emit(event="start", test=test.id())

        def _set(self, test, outcome, last):
            tid = test.id()
            if tid not in self._cur:      # setUpClass and the like
                emit(event="end", test=tid, outcome=outcome, last=last)
            else:
                self._cur[tid] = (outcome, last)

        def _why(self, err, test):
            # The exception's own line ("Type: message"), as a
            # traceback ends with it; a long message is cut.
            text = "".join(traceback.format_exception_only(err[0],
                                                           err[1]))
            if "Failed to import test module" in text:
                # unittest's stand-in for a module that did not import:
                # the import's own error is the message's last line.
                line = "import: " + _last_line(text)
            else:
                line = (text.strip().splitlines() or [repr(err[1])])[0]
            return line if len(line) <= 300 else line[:297] + "..."

        def addFailure(self, test, err):
            super().addFailure(test, err)
            self._set(test, "failed", self._why(err, test))

        def addError(self, test, err):
            super().addError(test, err)
            self._set(test, "error", self._why(err, test))

        def addSkip(self, test, reason):
            super().addSkip(test, reason)
            self._set(test, "skipped", str(reason))

        def addUnexpectedSuccess(self, test):
            super().addUnexpectedSuccess(test)
            self._set(test, "failed", "unexpected success")

        def addSubTest(self, test, subtest, err):
            super().addSubTest(test, subtest, err)
            if err is not None:
                bad = ("failed" if issubclass(err[0],
                                              test.failureException)
                       else "error")
                sub = subtest.id()[len(test.id()):].strip()
                self._set(test, bad, "%s %s" % (sub, self._why(err, test)))

        def stopTest(self, test):
            super().stopTest(test)
            outcome, last = self._cur.pop(test.id(), ("passed", ""))
            emit(event="end", test=test.id(), outcome=outcome, last=last)

    try:
        suite = unittest.defaultTestLoader.loadTestsFromName(module)
    except BaseException:  # noqa: BLE001 - reported as the module's error
        emit(event="end", test=module, outcome="error",
             last="import: " + _last_line(traceback.format_exc()))
        return 0
    runner = unittest.TextTestRunner(stream=sys.stderr, verbosity=2,
                                     resultclass=Result)
    runner.run(suite)
    emit(event="done")
    return 0


def _probe():
    """Import numba.cuda as a child does; print what it finds as JSON."""
    _prepare_numba()
    rec = {}
    try:
        import numba
        from numba import cuda

        rec["numba"] = numba.__version__
        rec["numba_cuda"] = importlib.metadata.version("numba-cuda")
        rec["available"] = bool(cuda.is_available())
        if not rec["available"]:
            err = cuda.cuda_error()
            rec["error"] = " ".join(str(err).split()) or repr(err)
        else:
            name = getattr(cuda.get_current_device(), "name", "simulator")
            rec["device"] = (name.decode() if isinstance(name, bytes)
                             else str(name))
            mm = getattr(cuda.current_context(), "memory_manager", None)
            rec["memory_manager"] = (type(mm).__module__ if mm is not None
                                     else "none (numba's simulator)")
    except BaseException as e:  # noqa: BLE001 - the probe reports it
        rec["available"] = False
        rec["error"] = "%s: %s" % (type(e).__name__, _last_line(e))
    print(json.dumps(rec))
    return 0


# ---------------------------------------------------------------------------
# The parent: which modules, the children, the tables
# ---------------------------------------------------------------------------


def installed_modules():
    """The test modules of the installed numba-cuda, by name under
    numba.cuda.tests (read from its file list: numba is not imported
    here), or None when numba-cuda is not installed."""
    try:
        files = importlib.metadata.files("numba-cuda") or []
    except importlib.metadata.PackageNotFoundError:
        return None
    pat = re.compile(r"numba/cuda/tests/(cudadrv|cudapy)/(test_\w+)\.py$")
    found = set()
    for f in files:
        m = pat.search(str(f).replace(os.sep, "/"))
        if m:
            found.add("%s.%s" % m.groups())
    return found


def numba_cuda_version():
    try:
        return importlib.metadata.version("numba-cuda")
    except importlib.metadata.PackageNotFoundError:
        return None


def choose(args, installed):
    """[(module, reason)] to run, and the chosen modules this numba-cuda
    does not have."""
    if args.modules:
        names = [m.strip() for m in args.modules.split(",") if m.strip()]
        names = [m[len(PREFIX):] if m.startswith(PREFIX) else m
                 for m in names]
        chosen = [(m, MODULES.get(m, "asked for")) for m in names]
    else:
        chosen = list(MODULES.items())
        if args.all_cudapy and installed:
            have = {m for m, _ in chosen}
            chosen += [(m, "the rest of cudapy (--all-cudapy)")
                       for m in sorted(installed)
                       if m.startswith("cudapy.") and m not in have]
    if installed is None:
        return chosen, []
    missing = [m for m, _ in chosen if m not in installed]
    return [(m, r) for m, r in chosen if m in installed], missing


#: --numba-simulator: the children run on numba's CPU simulator
#: (NUMBA_ENABLE_CUDASIM=1), for checking this script without a GPU.
SIMULATE = False


def child_env(manager, cudamem_manager=None):
    """A child's environment: the real driver, numba's manager or the
    plugin, and cudamem's own manager as asked (unset: its default)."""
    env = dict(os.environ)
    env.pop("NUMBA_ENABLE_CUDASIM", None)
    env["CUDAMEM_SIMULATOR"] = "0"
    if SIMULATE:
        env["NUMBA_ENABLE_CUDASIM"] = "1"
        env["CUDAMEM_SIMULATOR"] = "1"
    env["PYTHONFAULTHANDLER"] = "1"
    env["PYTHONUNBUFFERED"] = "1"
    env.pop("CUDAMEM_MEMORY_MANAGER", None)
    if manager is None:
        env.pop("NUMBA_CUDA_MEMORY_MANAGER", None)
    else:
        env["NUMBA_CUDA_MEMORY_MANAGER"] = manager
        if cudamem_manager:
            env["CUDAMEM_MEMORY_MANAGER"] = cudamem_manager
    return env


def probe(manager, cudamem_manager=None, timeout=180):
    cmd = [sys.executable, os.path.abspath(__file__), "--probe"]
    try:
        p = subprocess.run(cmd, env=child_env(manager, cudamem_manager),
                           timeout=timeout,
                           capture_output=True, text=True)
    except subprocess.TimeoutExpired:
        return {"available": False,
                "error": "importing numba.cuda took over %d s" % timeout}
    try:
        return json.loads(p.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        return {"available": False,
                "error": "the probe printed nothing (exit %d): %s" % (
                    p.returncode, _last_line(p.stderr))}


def _signame(rc):
    try:
        return signal.Signals(-rc).name
    except ValueError:
        return "signal %d" % -rc


class Job:
    def __init__(self, module, run, manager, outdir, tag="",
                 cudamem_manager=None):
        self.module = module
        self.run = run
        self.manager = manager
        self.cudamem_manager = cudamem_manager
        base = module.replace(".", "-") + tag
        self.results = os.path.join(outdir, "logs", run, base + ".jsonl")
        self.log = os.path.join(outdir, "logs", run, base + ".log")
        self.status = "not run"   # not run, done, timed out, crashed, exit N
        self.seconds = 0.0
        self.tests = {}           # test id -> (outcome, last line)


def run_job(job, limit):
    os.makedirs(os.path.dirname(job.results), exist_ok=True)
    for p in (job.results, job.log):
        if os.path.exists(p):
            os.remove(p)
    cmd = [sys.executable, os.path.abspath(__file__), "--child",
           PREFIX + job.module, "--results", job.results]
    t0 = time.monotonic()
    with open(job.log, "w") as log:
        proc = subprocess.Popen(cmd, env=child_env(job.manager,
                                                   job.cudamem_manager),
                                stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
        try:
            rc = proc.wait(timeout=limit)
        except subprocess.TimeoutExpired:
            # SIGABRT first: faulthandler writes every thread's stack to
            # the log; then the whole process group goes.
            try:
                os.killpg(proc.pid, signal.SIGABRT)
                proc.wait(timeout=10)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                pass
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()
            rc = None
    job.seconds = time.monotonic() - t0
    started = None
    done = False
    if os.path.exists(job.results):
        with open(job.results) as f:
            for line in f:
                try:
                    rec = json.loads(line)
                except ValueError:
                    continue       # a line cut by the kill
                if rec.get("event") == "start":
                    started = rec["test"]
                elif rec.get("event") == "end":
                    job.tests[rec["test"]] = (rec["outcome"], rec["last"])
                    if rec["test"] == started:
                        started = None
                elif rec.get("event") == "done":
                    done = True
    if rc is None:
        job.status = "timed out"
        why = "timed out: the module's limit of %d s" % limit
    elif rc < 0:
        job.status = "crashed"
        why = "crashed: the child died of %s" % _signame(rc)
    elif not done:
        job.status = "exit %d" % rc
        why = "the child ended (exit %d) before the module's end" % rc
    else:
        job.status = "done"
        why = None
    if why is not None:
        job.tests[started or PREFIX + job.module] = ("error", why)
    return job


def counts(tests):
    c = {"run": 0, "passed": 0, "failed": 0, "errors": 0, "skipped": 0}
    key = {"passed": "passed", "failed": "failed", "error": "errors",
           "skipped": "skipped"}
    for outcome, _ in tests.values():
        c["run"] += 1
        c[key[outcome]] += 1
    return c


def differences(a, b):
    """Tests that passed in run a but not in run b:
    [(test, outcome in b, last line)]."""
    out = []
    for t, (o, _) in sorted(a.items()):
        if o != "passed":
            continue
        ob, last = b.get(t, ("not run", "the test did not run"))
        if ob != "passed":
            out.append((t, ob, last))
    return out


def listed_tests(path):
    """The test ids docs/numba-compat.md lists, with their reasons, in
    its section on this suite (between the begin/end markers)."""
    try:
        with open(path) as f:
            text = f.read()
    except OSError:
        return set()
    m = re.search(r"<!-- begin: numba-suite -->(.*?)<!-- end: numba-suite"
                  r" -->", text, re.S)
    body = m.group(1) if m else ""
    return set(re.findall(r"`(numba\.cuda\.tests\.[\w.]+)`", body))


def schedule(jobs, workers, deadline, per_module, progress):
    """Run the jobs, ``workers`` at a time, none started past the
    deadline; each limited to per_module seconds and what is left."""
    lock = threading.Lock()

    def one(job):
        left = deadline - time.monotonic()
        if left < 5:
            return job
        run_job(job, max(5, min(per_module, left)))
        with lock:
            progress(job)
        return job

    with concurrent.futures.ThreadPoolExecutor(max_workers=workers) as ex:
        list(ex.map(one, jobs))


def md_table(modules, by_run, reasons):
    cols = ("run", "passed", "failed", "errors", "skipped")
    head = ["| module | " + " | ".join(
        "%s %s" % (RUN_TITLES[r], c) if c == "run" else c
        for r, _ in RUNS for c in cols) + " | why it runs |",
        "|---|" + "---:|" * (len(cols) * len(RUNS)) + "---|"]
    rows = []
    total = {r: dict.fromkeys(cols, 0) for r, _ in RUNS}
    for m in modules:
        cells = []
        for r, _ in RUNS:
            job = by_run[r].get(m)
            if job is None or job.status == "not run":
                cells += ["not run"] + [""] * (len(cols) - 1)
                continue
            c = counts(job.tests)
            for k in cols:
                total[r][k] += c[k]
            cells += [str(c[k]) for k in cols]
            if job.status != "done":
                cells[-len(cols)] += " (%s)" % job.status
        rows.append("| `%s` | %s | %s |" % (m, " | ".join(cells),
                                            reasons.get(m, "")))
    rows.append("| **all** | %s | |" % " | ".join(
        "**%d**" % total[r][k] for r, _ in RUNS for k in cols))
    return head + rows, total


def main(argv=None):
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0].replace("\n", " "))
    ap.add_argument("--modules", metavar="M1,M2",
                    help="these modules (cudadrv.test_x or "
                         "numba.cuda.tests.cudadrv.test_x) instead of the "
                         "default list")
    ap.add_argument("--all-cudapy", action="store_true",
                    help="add the rest of numba.cuda.tests.cudapy, "
                         "after the default list, as the budget allows")
    ap.add_argument("-j", "--jobs", type=int,
                    default=min(16, os.cpu_count() or 1),
                    help="children at a time (default: the CPUs, at "
                         "most 16)")
    ap.add_argument("--timeout", type=float, default=240,
                    help="a module's limit in seconds, per run (240)")
    ap.add_argument("--budget", type=float, default=360,
                    help="seconds for everything; no child starts after "
                         "it (360)")
    ap.add_argument("--out", metavar="DIR", default="numba-suite-out",
                    help="where the JSON, the markdown and the logs go")
    ap.add_argument("--summary", metavar="FILE",
                    help="also write the lines for benchmarks/RESULTS.md "
                         "here")
    ap.add_argument("--listed", metavar="FILE",
                    default=os.path.join(ROOT, "docs", "numba-compat.md"),
                    help="the file whose numba-suite section lists the "
                         "known differences (docs/numba-compat.md)")
    ap.add_argument("--cudamem-manager", metavar="NAME",
                    help="CUDAMEM_MEMORY_MANAGER for the plugin's run "
                         "(default, pool, async; unset: cudamem's "
                         "default); numba's run has it unset")
    ap.add_argument("--no-recheck", action="store_true",
                    help="do not run again the modules with differences")
    ap.add_argument("--numba-simulator", action="store_true",
                    help="run the children on numba's CPU simulator "
                         "(NUMBA_ENABLE_CUDASIM=1): a check of this script "
                         "without a GPU, not of the plugin (the simulator "
                         "has no memory manager)")
    ap.add_argument("--dry-run", action="store_true",
                    help="list the modules and the commands; run nothing")
    ap.add_argument("--child", metavar="MODULE", help=argparse.SUPPRESS)
    ap.add_argument("--results", metavar="FILE", help=argparse.SUPPRESS)
    ap.add_argument("--probe", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)

    if args.child:
        return _child(args.child, args.results)
    if args.probe:
        return _probe()
    global SIMULATE
    SIMULATE = args.numba_simulator

    t0 = time.monotonic()
    deadline = t0 + args.budget
    installed = installed_modules()
    version = numba_cuda_version()
    chosen, missing = choose(args, installed)
    reasons = dict(chosen)
    modules = [m for m, _ in chosen]

    if args.dry_run:
        print("numba-cuda: %s" % (version or "not installed here"))
        print("%d modules, each run twice (%s), -j %d, %d s a module, "
              "%d s in all:" % (len(modules), " and ".join(
                  "%s: NUMBA_CUDA_MEMORY_MANAGER=%s" % (r, m or "(unset)")
                  for r, m in RUNS), args.jobs, args.timeout, args.budget))
        width = max((len(m) for m in modules), default=0)
        for m, r in chosen:
            print("  %-*s  %s" % (width, m, r))
        for m in missing:
            print("  %-*s  (not in this numba-cuda: skipped)" % (width, m))
        print("each: %s %s --child %s<module> --results FILE" % (
            os.path.basename(sys.executable), os.path.relpath(__file__),
            PREFIX))
        return 0

    if installed is None:
        print("numba-cuda is not installed here: nothing to run")
        return 2
    if missing:
        print("not in numba-cuda %s (skipped): %s" % (version,
                                                       ", ".join(missing)))
    info = probe(None)
    if not info.get("available"):
        print("numba cannot find a driver: %s" % (
            info.get("error") or "cuda.is_available() is False"))
        print("(numba-cuda's tests need a GPU; nothing was run)")
        return 2
    info_plugin = probe(PLUGIN, args.cudamem_manager)
    print("numba %s, numba-cuda %s, %s; under the plugin: %s" % (
        info.get("numba"), info.get("numba_cuda"), info.get("device"),
        info_plugin.get("memory_manager")
        or "no context: " + str(info_plugin.get("error"))))

    os.makedirs(args.out, exist_ok=True)
    by_run = {r: {} for r, _ in RUNS}
    jobs = []
    for m in modules:
        for r, mgr in RUNS:
            job = Job(m, r, mgr, args.out,
                      cudamem_manager=args.cudamem_manager)
            by_run[r][m] = job
            jobs.append(job)

    def progress(job):
        c = counts(job.tests)
        print("[%4.0f s] %-6s %-45s %3d run %3d passed %3d failed %3d "
              "errors %3d skipped  %5.1f s%s" % (
                  time.monotonic() - t0, job.run, job.module, c["run"],
                  c["passed"], c["failed"], c["errors"], c["skipped"],
                  job.seconds,
                  "" if job.status == "done" else "  (%s)" % job.status),
              flush=True)

    schedule(jobs, args.jobs, deadline, args.timeout, progress)

    # The modules with differences again, both runs, one child at a time.
    rechecked = {}
    if not args.no_recheck:
        for m in modules:
            a, b = by_run["numba"][m], by_run["plugin"][m]
            if a.status == "not run" or b.status == "not run":
                continue
            if not [d for d in differences(a.tests, b.tests)
                    if d[1] != "skipped"]:
                continue
            if deadline - time.monotonic() < 2 * min(
                    args.timeout, a.seconds + b.seconds + 30):
                continue
            again = {}
            for r, mgr in RUNS:
                job = Job(m, r, mgr, args.out, tag="-again",
                          cudamem_manager=args.cudamem_manager)
                run_job(job, max(5, min(args.timeout,
                                        deadline - time.monotonic())))
                progress(job)
                again[r] = job
            rechecked[m] = again

    listed = listed_tests(args.listed)
    diffs = []
    for m in modules:
        a, b = by_run["numba"][m], by_run["plugin"][m]
        if a.status == "not run" or b.status == "not run":
            continue
        for t, outcome, last in differences(a.tests, b.tests):
            again = rechecked.get(m)
            note = ""
            if again is not None and outcome != "skipped":
                ao = again["numba"].tests.get(t, ("not run", ""))[0]
                bo = again["plugin"].tests.get(t, ("not run", ""))[0]
                if ao == "passed" and bo != "passed":
                    note = "again: the same"
                elif ao == "passed" and bo == "passed":
                    note = "again: passed on the plugin (not reproduced)"
                else:
                    note = "again: numba %s, plugin %s" % (ao, bo)
            diffs.append({"module": m, "test": t, "plugin": outcome,
                          "last": last, "recheck": note,
                          "listed": t in listed})
    not_run = [m for m in modules
               if by_run["numba"][m].status == "not run"
               or by_run["plugin"][m].status == "not run"]
    uneven = [m for m in modules
              if (by_run["numba"][m].status == "done")
              != (by_run["plugin"][m].status == "done")
              and m not in not_run]

    table, total = md_table(modules, by_run, reasons)
    lines = ["# numba-cuda %s's suite: numba's manager and %s" % (
        version, PLUGIN), "",
        "numba %s, %s; `tools/numba_suite.py`, -j %d, %d s a module, "
        "%.0f s in all." % (info.get("numba"), info.get("device"),
                             args.jobs, args.timeout,
                             time.monotonic() - t0), ""] + table
    lines += ["", "## Pass on numba's manager, not on %s (%d)" % (
        PLUGIN, len(diffs)), ""]
    if diffs:
        lines += ["| test | on the plugin | last line | again | listed |",
                  "|---|---|---|---|---|"]
        lines += ["| `%s` | %s | %s | %s | %s |" % (
            d["test"], d["plugin"], d["last"].replace("|", "\\|"),
            d["recheck"], "yes" if d["listed"] else "**no**")
            for d in diffs]
    else:
        lines.append("none")
    if not_run:
        lines += ["", "Not run (the budget ran out): %s" % ", ".join(
            "`%s`" % m for m in not_run)]
    if uneven:
        lines += ["", "Ended early in one run only: %s" % ", ".join(
            "`%s` (numba: %s, plugin: %s)" % (
                m, by_run["numba"][m].status, by_run["plugin"][m].status)
            for m in uneven)]
    md = "\n".join(lines) + "\n"

    def fmt(c):
        return ("%(run)d run, %(passed)d passed, %(failed)d failed, "
                "%(errors)d errors, %(skipped)d skipped" % c)

    unlisted = [d for d in diffs if not d["listed"]]
    ran = len(modules) - len(not_run)
    summary = [
        "- numba-cuda %s's suite (`tools/numba_suite.py`, %d of %d "
        "modules%s): numba's manager %s | `%s` %s" % (
            version, ran, len(modules),
            ", --all-cudapy" if args.all_cudapy else "",
            fmt(total["numba"]), PLUGIN, fmt(total["plugin"])),
        "- passing on numba's manager only: %d (%d listed in "
        "docs/numba-compat.md, %d not)%s" % (
            len(diffs), len(diffs) - len(unlisted), len(unlisted),
            "; not run: " + ", ".join(not_run) if not_run else ""),
    ]
    with open(os.path.join(args.out, "numba-suite.md"), "w") as f:
        f.write(md)
    with open(os.path.join(args.out, "summary.md"), "w") as f:
        f.write("\n".join(summary) + "\n")
    if args.summary:
        with open(args.summary, "w") as f:
            f.write("\n".join(summary) + "\n")
    data = {
        "numba": info.get("numba"), "numba_cuda": version,
        "device": info.get("device"),
        "plugin_manager": info_plugin.get("memory_manager"),
        "jobs": args.jobs, "timeout": args.timeout, "budget": args.budget,
        "seconds": round(time.monotonic() - t0, 1),
        "modules": {
            m: {"reason": reasons.get(m, ""),
                **{r: {"status": by_run[r][m].status,
                       "seconds": round(by_run[r][m].seconds, 1),
                       **counts(by_run[r][m].tests)} for r, _ in RUNS}}
            for m in modules},
        "totals": total, "differences": diffs, "not_run": not_run,
        "uneven": uneven, "missing_modules": missing,
        "tests": {r: {t: o for m in modules
                      for t, o in by_run[r][m].tests.items()}
                  for r, _ in RUNS},
    }
    with open(os.path.join(args.out, "numba-suite.json"), "w") as f:
        json.dump(data, f, indent=1)
    print()
    print(md)
    print("\n".join(summary))
    return 1 if unlisted or uneven else 0


if __name__ == "__main__":
    sys.exit(main())
