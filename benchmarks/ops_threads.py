# SPDX-License-Identifier: MIT
"""Round trips from several threads at once: each of N threads (1, 2, 4,
8) has a stream of its own, a device array and two host arrays of 1 KiB
or 64 KiB, pinned or pageable, and repeats a host-to-device copy, a
device-to-host copy and a synchronize of its stream.  A row reports the
round trips of all threads together, in thousands per second.

- cudamem: ``copy_to_device(h, stream=s)``, ``copy_to_host(out,
  stream=s)``, ``s.synchronize()``; pinned arrays from ``pinned_array``;
- CuPy: ``set(h, stream=s)``, ``get(stream=s, out=out,
  blocking=False)``, ``s.synchronize()``; pinned arrays from
  ``cupyx.empty_pinned``;
- PyTorch: the thread's current stream set once, ``copy_(h,
  non_blocking=True)`` both ways, ``s.synchronize()``; pinned tensors
  from ``pin_memory=True``;
- driver: bare_driver.c, C threads making the three driver calls
  (cuMemcpyHtoDAsync, cuMemcpyDtoHAsync, cuStreamSynchronize) and nothing
  else: the driver's own limit with N threads.

Pageable host arrays are touched NumPy arrays (torch tensors) copied on
the stream; the libraries and the driver take the driver's pageable path
for them (cudamem's staging pipeline starts at 4 MiB).

Timing: the threads set up and make 50 round trips each, then every
sample starts them together and stops them after ``MS`` milliseconds;
a sample's figure is its length over the round trips all threads
finished.  The row gives the median and the 10th / 90th percentiles of
``SAMPLES`` samples.  The Python libraries run in this process, the C
program in a child process of its own.
"""

import gc
import threading
import time

import numpy as np

import bare_driver
import harness

THREADS = (1, 2, 4, 8)
SIZES = ((1 << 10, "1 KiB"), (64 << 10, "64 KiB"))
SAMPLES = 7
MS = 50
WARM = 50


def threaded(nthreads, setup, samples=None, ms=None, warm=WARM):
    """Time a round trip made by nthreads Python threads at once.
    setup(i) runs in thread i and returns its round trip (a callable).
    harness.Measured: seconds per round trip of all threads together."""
    samples = SAMPLES if samples is None else samples
    ms = MS if ms is None else ms
    barrier = threading.Barrier(nthreads + 1, timeout=300)
    stop = [False]
    counts = [[0] * samples for _ in range(nthreads)]
    errors = []

    def work(i):
        step = None
        try:
            step = setup(i)
            for _ in range(warm):
                step()
        except BaseException as e:  # noqa: BLE001 - raised by the caller
            errors.append(e)
            step = None
        for k in range(samples):
            barrier.wait()
            n = 0
            try:
                while step is not None and not stop[0]:
                    step()
                    n += 1
            except BaseException as e:  # noqa: BLE001 - as above
                errors.append(e)
                step = None
            counts[i][k] = n
            barrier.wait()

    threads = [threading.Thread(target=work, args=(i,), daemon=True)
               for i in range(nthreads)]
    per = []
    gc_was = gc.isenabled()
    gc.disable()
    try:
        for t in threads:
            t.start()
        for k in range(samples):
            stop[0] = False
            barrier.wait()
            t0 = time.perf_counter()
            time.sleep(ms / 1e3)
            stop[0] = True
            barrier.wait()
            total = sum(c[k] for c in counts)
            if total:
                per.append((time.perf_counter() - t0) / total)
    finally:
        if gc_was:
            gc.enable()
        for t in threads:
            t.join(60)
    if errors:
        raise errors[0]
    if not per:
        raise RuntimeError("no round trip finished")
    return harness.Measured(harness.summarize(per))


def _cudamem(nthreads, size, pinned):
    def factory(cm):
        def setup(i):
            s = cm.stream()
            if pinned:
                h = cm.pinned_array(size, np.uint8)
                out = cm.pinned_array(size, np.uint8)
            else:
                h = np.empty(size, np.uint8)
                out = np.empty(size, np.uint8)
            h[:] = i
            out[:] = 0
            d = cm.device_array(size, np.uint8)
            to_dev, to_host, sync = d.copy_to_device, d.copy_to_host, \
                s.synchronize

            def step():
                to_dev(h, stream=s)
                to_host(out, stream=s)
                sync()
            return step

        return threaded(nthreads, setup)

    return factory


def _cupy(nthreads, size, pinned):
    def factory(cp):
        import cupyx

        def setup(i):
            s = cp.cuda.Stream(non_blocking=False)
            if pinned:
                h = cupyx.empty_pinned((size,), np.uint8)
                out = cupyx.empty_pinned((size,), np.uint8)
            else:
                h = np.empty(size, np.uint8)
                out = np.empty(size, np.uint8)
            h[:] = i
            out[:] = 0
            d = cp.empty(size, np.uint8)
            put, sync = d.set, s.synchronize
            try:
                d.get(stream=s, out=out, blocking=False)
                s.synchronize()

                def get():
                    d.get(stream=s, out=out, blocking=False)
            except TypeError:   # a CuPy before blocking=: asynchronous
                def get():
                    d.get(stream=s, out=out)

            def step():
                put(h, stream=s)
                get()
                sync()
            return step

        return threaded(nthreads, setup)

    return factory


def _torch(nthreads, size, pinned):
    def factory(torch):
        def setup(i):
            s = torch.cuda.Stream()
            torch.cuda.set_stream(s)   # this thread's current stream
            h = torch.full((size,), i, dtype=torch.uint8, pin_memory=pinned)
            out = torch.zeros(size, dtype=torch.uint8, pin_memory=pinned)
            d = torch.empty(size, dtype=torch.uint8, device="cuda")
            sync = s.synchronize

            def step():
                d.copy_(h, non_blocking=True)
                out.copy_(d, non_blocking=True)
                sync()
            return step

        return threaded(nthreads, setup)

    return factory


def _driver(nthreads, size, pinned):
    def factory(core):
        return bare_driver.run("roundtrip", nthreads, size,
                               "pinned" if pinned else "pageable", SAMPLES,
                               MS)

    return factory


def row_name(size_label, pinned, nthreads):
    return "round trip %s %s [%d thread%s]" % (
        size_label, "pinned" if pinned else "pageable", nthreads,
        "" if nthreads == 1 else "s")


def _ops():
    ops = []
    for size, label in SIZES:
        for pinned in (True, False):
            for n in THREADS:
                ops.append({
                    "name": row_name(label, pinned, n), "unit": "k/s",
                    "impls": {"cudamem": _cudamem(n, size, pinned),
                              "cupy": _cupy(n, size, pinned),
                              "torch": _torch(n, size, pinned),
                              "driver": _driver(n, size, pinned)}})
    return ops


OPS = _ops()
