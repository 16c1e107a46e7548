# SPDX-License-Identifier: MIT
"""What the validation suite's modules share: the backend in use, the
device line and child processes."""

import os
import subprocess
import sys

import cudamem


def simulator():
    """True on the simulator backend (conftest.py has chosen it by now)."""
    return os.environ.get("CUDAMEM_SIMULATOR", "0") not in ("0", "", "false")


def device_line():
    """One line naming the package, where it is, the backend and the
    device."""
    head = "cudamem %s (%s)" % (cudamem.__version__,
                               os.path.dirname(cudamem.__file__))
    err = cudamem.cuda_error()
    if err is not None:
        return "%s: no backend: %s" % (head, err)
    dev = cudamem.get_current_device()
    cc = dev.compute_capability
    backend = ("CPU simulator" if simulator()
               else "CUDA driver %d.%d" % cudamem.driver_version())
    return "%s: %s, %d device(s), [0] %s (cc %d.%d)" % (
        head, backend, len(cudamem.gpus), dev.name, cc[0], cc[1])


def run_child(code, timeout=120, env=None):
    """Run Python code in a child process with this backend; return its
    standard output.  A failing child fails the test with its output."""
    e = dict(os.environ)
    e.update(env or {})
    p = subprocess.run([sys.executable, "-c", code], env=e,
                       timeout=timeout, capture_output=True, text=True)
    assert p.returncode == 0, "child failed (%d):\n%s\n%s" % (
        p.returncode, p.stdout[-3000:], p.stderr[-3000:])
    return p.stdout
