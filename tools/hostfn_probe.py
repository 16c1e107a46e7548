"""What a held host function on another stream blocks, on this machine.

On an H100 (CUDA 13.0) the first copy of a capture cudamem began hung
while a host function held another, non-blocking stream of the context
(tests/runtime/test_capture_safety.py,
test_pool_records_no_event_on_the_capturing_stream), but only with the
small copies recorded as kernels (CUDAMEM_CAPTURE_KERNEL_COPY_MAX=0 let
it pass) and not because of the kernels' lazy load
(CUDA_MODULE_LOADING=EAGER hung too).  Each case here holds a raw
non-blocking stream with a host function (cudamem's test gate), does one
thing, opens the gate and synchronises, in a process of its own; a case
that has not finished in TIMEOUT seconds is reported as blocked:

- ``copy``: an asynchronous copy of pinned memory on another stream;
- ``kernel-first``, ``kernel-warm``: a kernel compiled with NVRTC
  (cudamem.compile) launched on another stream, for the first time in
  the context or after one launch made before the gate;
- ``capture-kernel-first``, ``capture-kernel-warm``: the same launch
  into a capture cudamem began;
- ``capture-kcopy-first``, ``capture-kcopy-warm``: a copy in a capture,
  recorded as cudamem's kernel copy, with no kernel copy made before,
  or with one capture of a copy made (and its graph launched) before
  the gate;
- ``capture-kcopy-captured``: the same, the capture made before the gate
  ended and closed without a launch (does a capture alone warm it?);
- ``capture-kernel-after-kcopy``: the NVRTC kernel into a capture after
  a kernel copy was captured and launched (per kernel or per context?);
- ``capture-kernel-after-capture``: the NVRTC kernel into a capture after
  a capture of it was launched before the gate;
- ``capture-copy-node``: the copy in a capture with kernel copies off;
- ``capture-kcopy-pycallback``: the gate opened from a timer 0.3 s
  later, with a Python callback of cudamem's (add_callback) queued behind
  it on that stream: the callback needs the GIL while the capturing
  thread is in the driver, which cudamem releases the GIL around while a
  Python callback is in flight; this one must finish.

    python tools/hostfn_probe.py [TIMEOUT]
"""
import os
import subprocess
import sys

CASES = ["copy", "kernel-first", "kernel-warm", "capture-kernel-first",
         "capture-kernel-warm", "capture-kcopy-first", "capture-kcopy-warm",
         "capture-kcopy-captured", "capture-kernel-after-kcopy",
         "capture-kernel-after-capture", "capture-copy-node",
         "capture-kcopy-pycallback"]

SOURCE = r"""
extern "C" __global__ void touch(float *p) { p[threadIdx.x] += 1.0f; }
"""


def run(case):
    import numpy as np

    import cudamem
    from cudamem import _core

    n = 64
    hin = cudamem.pinned_array(n, np.float32)
    hin[:] = 3
    d = cudamem.device_array(n, np.float32)
    s = cudamem.stream()
    kern = None
    if "kernel" in case:
        kern = cudamem.compile(SOURCE).get_function("touch")
        if case.endswith("warm"):
            kern[1, n, s](d)
            s.synchronize()
    if case in ("capture-kcopy-warm", "capture-kcopy-captured",
                "capture-kernel-after-kcopy", "capture-kernel-after-capture"):
        s.begin_capture()
        if case == "capture-kernel-after-capture":
            kern[1, n, s](d)
        else:
            d.copy_to_device(hin, stream=s)
        g = s.end_capture()
        if case != "capture-kcopy-captured":
            g.launch(s)
            s.synchronize()
        g.close()
    b = _core._raw_stream_create(1)
    gate = _core._raw_gate(b)
    timer = None
    ran = []
    if case == "capture-kcopy-pycallback":
        import threading

        cudamem.external_stream(b).add_callback(
            lambda stream, status, arg: ran.append(status))
        # The timer opens the gate (once: an opened gate is freed).
        timer = threading.Timer(0.3, _core._raw_gate_open, (gate,))
        timer.start()
    try:
        if case == "copy":
            d.copy_to_device(hin, stream=s)
        elif case.startswith("kernel"):
            kern[1, n, s](d)
        else:
            s.begin_capture()
            if kern is not None:
                kern[1, n, s](d)
            else:
                d.copy_to_device(hin, stream=s)
            g = s.end_capture()
        if timer is None:
            print("returned before the gate opened", flush=True)
    finally:
        if timer is None:
            _core._raw_gate_open(gate)
        else:
            timer.join()
    s.synchronize()
    _core._raw_stream_synchronize(b)
    if timer is not None:
        assert ran == [0], ran
    _core._raw_stream_destroy(b)
    print("ok", flush=True)


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "--case":
        run(sys.argv[2])
        return
    timeout = float(sys.argv[1]) if len(sys.argv) > 1 else 8.0
    for case in CASES:
        env = dict(os.environ)
        if case == "capture-copy-node":
            env["CUDAMEM_CAPTURE_KERNEL_COPY_MAX"] = "0"
        try:
            p = subprocess.run([sys.executable, __file__, "--case", case],
                               env=env, capture_output=True, text=True,
                               timeout=timeout)
            out = (p.stdout + p.stderr).strip().splitlines()
            what = ("finished" if p.returncode == 0 and out
                    and out[-1] == "ok"
                    else "failed: " + (out[-1] if out else "rc %d"
                                       % p.returncode))
        except subprocess.TimeoutExpired:
            what = "blocked (killed after %g s)" % timeout
        print("%-30s %s" % (case, what), flush=True)


if __name__ == "__main__":
    main()
