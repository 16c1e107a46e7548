# SPDX-License-Identifier: MIT
"""Build and run bare_driver.c, the driver called from C with nothing in
between, for the driver column of the rows that need it (ops_threads.py,
the ``[C ...]`` rows of ops_alloc.py).

The program is compiled once per process with the system's C compiler
against the toolkit's ``cuda.h`` (CUDA_HOME, CUDA_PATH, /usr/local/cuda,
as setup.py looks), linked against pthreads only: it loads the driver
with dlopen (CUDAMEM_DRIVER_LIBRARY, else libcuda.so.1).  Without a
compiler, the header or a driver, a row's driver column is skipped.
"""

import os
import pathlib
import shutil
import subprocess
import tempfile

import harness

HERE = pathlib.Path(__file__).resolve().parent
SOURCE = HERE / "bare_driver.c"
CFLAGS = ["-std=c11", "-O2", "-Wall", "-Wextra"]
NO_DRIVER = 3       # the program's exit status when no driver can be had

_built = {}


def cuda_include_dir():
    """The toolkit's include folder holding cuda.h, or None."""
    roots = [os.environ.get(v) for v in ("CUDA_HOME", "CUDA_PATH")]
    for root in [r for r in roots if r] + ["/usr/local/cuda"]:
        inc = os.path.join(root, "include")
        if os.path.isfile(os.path.join(inc, "cuda.h")):
            return inc
    return None


def compile_program(out, extra=()):
    """Compile bare_driver.c to the executable out; the compiler's
    CompletedProcess.  Linked with -pthread only; where the C library
    keeps dlopen apart (glibc before 2.34) -ldl is added."""
    cc = shutil.which("cc") or shutil.which("gcc")
    inc = cuda_include_dir()
    if cc is None or inc is None:
        raise harness.Skip("no C compiler" if cc is None else
                           "no cuda.h (set CUDA_HOME)")
    cmd = [cc, *CFLAGS, *extra, "-I", inc, "-o", str(out), str(SOURCE),
           "-pthread"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    if p.returncode != 0 and "dlopen" in p.stderr:
        p = subprocess.run(cmd + ["-ldl"], capture_output=True, text=True,
                           timeout=120)
    return p


def program():
    """The path of the compiled program (built on first use)."""
    if "path" not in _built:
        out = pathlib.Path(tempfile.mkdtemp(prefix="bare_driver")) / "bd"
        p = compile_program(out)
        if p.returncode != 0:
            raise RuntimeError("bare_driver.c did not compile: "
                               + (p.stderr.strip().splitlines() or ["?"])[-1])
        _built["path"] = str(out)
    return _built["path"]


def run(*args, timeout=120):
    """Run the program with args; harness.Measured (median, p10, p90) of
    the seconds per operation over its samples."""
    p = subprocess.run([program(), *map(str, args)], capture_output=True,
                       text=True, timeout=timeout)
    last = (p.stderr.strip().splitlines() or [""])[-1]
    if p.returncode == NO_DRIVER:
        raise harness.Skip(last or "no driver")
    if p.returncode != 0:
        raise RuntimeError(last or "bare_driver exited %d" % p.returncode)
    words = p.stdout.split()
    if not words or words[0] != "ok":
        raise RuntimeError("bare_driver printed %r" % p.stdout[:80])
    samples = sorted(float(w) for w in words[1:])
    if not samples or samples[0] <= 0:
        raise RuntimeError("bare_driver measured nothing: %r"
                           % p.stdout[:80])
    return harness.Measured(harness.summarize(samples))
