# SPDX-License-Identifier: MIT
"""Streams and events: per-call overhead, side by side; and the overlap
of a host-to-device and a device-to-host copy of pinned memory issued on
two streams (reported as GB/s of both directions together: one direction
tops out at about 55 GB/s on the H200, both at once near 99)."""

import ctypes
import threading
import time

import numpy as np

from harness import Measured, Skip


# stream() create + drop -----------------------------------------------------

def _stream_cm(cm):
    return cm.stream


def _stream_numba(cuda):
    return cuda.stream


def _stream_cupy(cp):
    return lambda: cp.cuda.Stream(non_blocking=False)


def _stream_torch(torch):
    return torch.cuda.Stream


def _stream_rmm(p):
    return p.Stream                  # a new CUDA stream, destroyed with it


def _stream_core(p):
    dev = p.dev
    return lambda: dev.create_stream().close()


def _stream_driver(core):
    create, destroy = core._raw_stream_create, core._raw_stream_destroy
    return lambda: destroy(create())


# synchronize() on an idle stream -------------------------------------------

def _sync_cm(cm):
    return cm.stream().synchronize


def _sync_numba(cuda):
    return cuda.stream().synchronize


def _sync_cupy(cp):
    return cp.cuda.Stream(non_blocking=False).synchronize


def _sync_torch(torch):
    return torch.cuda.Stream().synchronize


def _sync_driver(core):
    """cuStreamSynchronize with the GIL released, as cudamem's does."""
    h = core._raw_stream_create()
    sync = core._raw_stream_synchronize
    return lambda: sync(h)


# event() create ------------------------------------------------------------

def _event_cm(cm):
    return cm.event


def _event_numba(cuda):
    return cuda.event


def _event_cupy(cp):
    return cp.cuda.Event


def _event_torch(torch):
    return lambda: torch.cuda.Event(enable_timing=True)


# record + synchronize --------------------------------------------------------

def _rec(timing):
    def cm_(cm):
        s = cm.stream()
        e = cm.event(timing=timing)

        def run():
            e.record(s)
            e.synchronize()
        return run

    def numba_(cuda):
        s = cuda.stream()
        e = cuda.event(timing=timing)

        def run():
            e.record(s)
            e.synchronize()
        return run

    def cupy_(cp):
        s = cp.cuda.Stream(non_blocking=False)
        e = cp.cuda.Event(disable_timing=not timing)

        def run():
            e.record(s)
            e.synchronize()
        return run

    def torch_(torch):
        s = torch.cuda.Stream()
        e = torch.cuda.Event(enable_timing=timing)

        def run():
            e.record(s)
            e.synchronize()
        return run

    return {"cudamem": cm_, "numba": numba_, "cupy": cupy_, "torch": torch_,
            "driver": _rec_driver(timing)}


def _event_driver(core):
    """cuEventCreate + cuEventDestroy (with timing, as event())."""
    create, destroy = core._raw_event_create, core._raw_event_destroy
    return lambda: destroy(create(0))


def _rec_driver(timing):
    def driver(core):
        s = core._raw_stream_create()
        e = core._raw_event_create(0 if timing else 2)  # DISABLE_TIMING
        rs = core._raw_event_record_sync
        return lambda: rs(e, s)
    return driver


# add_callback round trip ----------------------------------------------------

def _callback_cm(cm):
    s = cm.stream()
    done = threading.Event()

    def cb(stream, status, arg):
        done.set()

    def run():
        done.clear()
        s.add_callback(cb)
        done.wait()
    return run


def _callback_cupy(cp):
    s = cp.cuda.Stream(non_blocking=False)
    done = threading.Event()

    def cb(stream, status, arg):
        done.set()

    def run():
        done.clear()
        s.add_callback(cb, None)
        done.wait()
    return run


# both directions at once, on two streams ----------------------------------

DUPLEX = 256 << 20


def _duplex(cuda):
    """cudamem and numba-cuda: the same API, so one body."""
    up = cuda.pinned_array(DUPLEX, np.uint8)
    down = cuda.pinned_array(DUPLEX, np.uint8)
    up[:] = 1
    d_up = cuda.device_array(DUPLEX, np.uint8)
    d_down = cuda.device_array(DUPLEX, np.uint8)
    s1, s2 = cuda.stream(), cuda.stream()

    def run():
        d_up.copy_to_device(up, stream=s1)
        d_down.copy_to_host(down, stream=s2)
        s1.synchronize()
        s2.synchronize()
    return run


def _duplex_cupy(cp):
    import cupyx

    up = cupyx.empty_pinned((DUPLEX,), np.uint8)
    down = cupyx.empty_pinned((DUPLEX,), np.uint8)
    up[:] = 1
    d_up, d_down = cp.empty(DUPLEX, np.uint8), cp.empty(DUPLEX, np.uint8)
    s1 = cp.cuda.Stream(non_blocking=True)
    s2 = cp.cuda.Stream(non_blocking=True)
    rt = cp.cuda.runtime

    def run():
        rt.memcpyAsync(d_up.data.ptr, up.ctypes.data, DUPLEX,
                       rt.memcpyHostToDevice, s1.ptr)
        rt.memcpyAsync(down.ctypes.data, d_down.data.ptr, DUPLEX,
                       rt.memcpyDeviceToHost, s2.ptr)
        s1.synchronize()
        s2.synchronize()
    return run


def _duplex_torch(torch):
    up = torch.ones(DUPLEX, dtype=torch.uint8, pin_memory=True)
    down = torch.empty(DUPLEX, dtype=torch.uint8, pin_memory=True)
    d_up = torch.empty(DUPLEX, dtype=torch.uint8, device="cuda")
    d_down = torch.empty(DUPLEX, dtype=torch.uint8, device="cuda")
    s1, s2 = torch.cuda.Stream(), torch.cuda.Stream()

    def run():
        with torch.cuda.stream(s1):
            d_up.copy_(up, non_blocking=True)
        with torch.cuda.stream(s2):
            down.copy_(d_down, non_blocking=True)
        s1.synchronize()
        s2.synchronize()
    return run


def _duplex_driver(core):
    """cuMemcpyHtoDAsync and cuMemcpyDtoHAsync on two streams of their
    own, through ctypes (cudamem's context is current)."""
    try:
        cu = ctypes.CDLL("libcuda.so.1")
    except OSError as e:
        raise Skip("no libcuda") from e
    u64, vp, sz = ctypes.c_uint64, ctypes.c_void_p, ctypes.c_size_t
    cu.cuStreamCreate.argtypes = [ctypes.POINTER(vp), ctypes.c_uint]
    cu.cuMemcpyHtoDAsync_v2.argtypes = [u64, vp, sz, vp]
    cu.cuMemcpyDtoHAsync_v2.argtypes = [vp, u64, sz, vp]
    cu.cuStreamSynchronize.argtypes = [vp]
    up, down = core._host_alloc(DUPLEX, 0), core._host_alloc(DUPLEX, 0)
    ctypes.memset(up, 1, DUPLEX)
    d_up, d_down = core._device_alloc(DUPLEX), core._device_alloc(DUPLEX)
    s1, s2 = vp(), vp()
    if cu.cuStreamCreate(ctypes.byref(s1), 1) or cu.cuStreamCreate(
            ctypes.byref(s2), 1):
        raise Skip("cuStreamCreate failed")

    def run():
        cu.cuMemcpyHtoDAsync_v2(d_up, up, DUPLEX, s1)
        cu.cuMemcpyDtoHAsync_v2(down, d_down, DUPLEX, s2)
        cu.cuStreamSynchronize(s1)
        cu.cuStreamSynchronize(s2)
    return run


# d[:] = 3.0 on an array bound to a held stream -------------------------------

def _fill_held(cuda, calls=64, rounds=9):
    """Per-call time of d[:] = 3.0 on a 256-element float32 array bound
    to a stream that a host callback holds: the call must only enqueue
    (the value lands once the stream is released, checked here)."""
    samples = []
    for _ in range(rounds):
        s = cuda.stream()
        d = cuda.device_array(256, np.float32, stream=s)
        go = threading.Event()
        s.add_callback(lambda st, status, arg, go=go: go.wait(30))
        try:
            for _ in range(calls):
                t0 = time.perf_counter()
                d[:] = 3.0
                samples.append(time.perf_counter() - t0)
        finally:
            go.set()
        s.synchronize()
        if not (d.copy_to_host() == 3.0).all():
            raise RuntimeError("the value did not land")
    samples.sort()
    n = len(samples)
    return Measured((samples[n // 2], samples[n // 10],
                     samples[(9 * n) // 10]))


OPS = [
    {"name": "d[:] = 3.0 on a held stream (256 f4)",
     "impls": {"cudamem": _fill_held}},
    {"name": "stream() create+drop",
     "impls": {"cudamem": _stream_cm, "numba": _stream_numba,
               "cupy": _stream_cupy, "torch": _stream_torch,
               "rmm": _stream_rmm, "cuda.core": _stream_core,
               "driver": _stream_driver}},
    {"name": "stream.synchronize() idle",
     "impls": {"cudamem": _sync_cm, "numba": _sync_numba,
               "cupy": _sync_cupy, "torch": _sync_torch,
               "driver": _sync_driver}},
    {"name": "event() create+drop",
     "impls": {"cudamem": _event_cm, "numba": _event_numba,
               "cupy": _event_cupy, "torch": _event_torch,
               "driver": _event_driver}},
    {"name": "event record+sync (timing)", "impls": _rec(True)},
    {"name": "event record+sync (no timing)", "impls": _rec(False)},
    {"name": "add_callback round trip",
     "impls": {"cudamem": _callback_cm, "cupy": _callback_cupy}},
    {"name": "HtoD + DtoH pinned 256 MiB on two streams",
     "bytes": 2 * DUPLEX,
     "impls": {"cudamem": _duplex, "numba": _duplex,
               "cupy": _duplex_cupy, "torch": _duplex_torch,
               "driver": _duplex_driver}},
]
