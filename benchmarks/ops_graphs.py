# SPDX-License-Identifier: MIT
"""CUDA graphs against eager copies: 100 round trips of 1 KiB, pinned
host to device to host, asynchronous copies on one stream (200 copies),
then a synchronize of that stream.

``[graph]``: the round trips captured once into a graph, then each timed
call replays it and synchronizes: cudamem (``cudamem.graph()``), CuPy
(``Stream.begin_capture`` / ``end_capture``, ``Graph.launch``), PyTorch
(``torch.cuda.graph``, pinned tensors, ``non_blocking`` copies) and the
bare driver (``cuStreamBeginCapture`` ... ``cuGraphLaunch`` through
ctypes: two calls a replay, so ctypes' cost hardly shows).
cudamem's ``[graph]`` records these copies as kernel copies joined into
batches, a kernel node each (its default, ``CUDAMEM_CAPTURE_KERNEL_COPY_MAX``
and ``CUDAMEM_CAPTURE_KERNEL_BATCH``); ``[kernel nodes]``: the same graph
with batches off, a kernel node a copy; ``[copy nodes]``: with kernel
copies off, copy nodes as the others record.
``[graph]`` of "registered": cudamem's graph with NumPy host memory
registered (``cudamem.pinned``) instead of its page-locked arrays.
``[eager]``: the same 200 copies issued one by one, then the
synchronize (no driver column: ctypes' cost per call would be most of
it).  Both rows read per copy: each time is the timed call's divided by
200 (the operation's ``per``).
``[graph launch]``: a graph of one round trip replayed and synchronized,
per replay: what a launch costs beside its work (cudamem's records an
event after each launch, which ``close()`` waits for).

Each factory checks once, before it is timed, that the bytes came back.
"""

import ctypes
import weakref

import numpy as np

from harness import Skip


def _libcuda():
    try:
        return ctypes.CDLL("libcuda.so.1")
    except OSError as e:
        raise Skip("no libcuda") from e


NBYTES = 1024
TRIPS = 100
COPIES = 2 * TRIPS
PATTERN = (np.arange(NBYTES) % 251).astype(np.uint8)


def _checked(run, out):
    """run, once called, must have brought PATTERN back into out (a
    NumPy view of the host buffer the copies write)."""
    run()
    if not np.array_equal(np.asarray(out), PATTERN):
        raise RuntimeError("the round trips did not bring the bytes back")
    return run


# cudamem and numba-cuda: the same API ---------------------------------------

def _buffers(cuda):
    h = cuda.pinned_array(NBYTES, np.uint8)
    h[:] = PATTERN
    out = cuda.pinned_array(NBYTES, np.uint8)
    out[:] = 0
    return h, out, cuda.device_array(NBYTES, np.uint8)


def _trips(h, out, d, s, n=TRIPS):
    for _ in range(n):
        d.copy_to_device(h, stream=s)
        d.copy_to_host(out, stream=s)


def _graph_cm(cm, n=TRIPS):
    h, out, d = _buffers(cm)
    with cm.graph() as g:
        _trips(h, out, d, g.stream, n)
    s = g.stream

    def run():
        g.replay(s)
        s.synchronize()
    run.keep = (g, h, out, d)
    return _checked(run, out)


def _graph_cm_nodes(cm):
    # The same graph, its copies recorded as copy nodes (the switch
    # CUDAMEM_CAPTURE_KERNEL_COPY_MAX off for this capture only).
    old, _ = cm._core._capture_kernel_copy(0)
    try:
        return _graph_cm(cm)
    finally:
        cm._core._capture_kernel_copy(old)


def _graph_cm_apart(cm):
    # The same graph, each kernel copy a node of its own (batches off for
    # this capture only).
    old, _ = cm._core._capture_kernel_batch(False)
    try:
        return _graph_cm(cm)
    finally:
        cm._core._capture_kernel_batch(old)


def _graph_cm_registered(cm):
    # The same graph, its host side NumPy memory registered with the
    # driver (cudamem.pinned: cuMemHostRegister) rather than cudamem's
    # page-locked allocations (cuMemHostAlloc): on the H200 a probe of
    # the driver's own graphs (tools/graph_probe.py) replayed copies of
    # registered memory faster.
    h = np.zeros(2 * 4096, np.uint8)
    h = h[-h.ctypes.data % 4096:][:4096]     # a page of its own
    out = np.zeros(2 * 4096, np.uint8)
    out = out[-out.ctypes.data % 4096:][:4096]
    h[:NBYTES] = PATTERN
    reg = cm.pinned(h, out)
    reg.__enter__()
    d = cm.device_array(NBYTES, np.uint8)
    with cm.graph() as g:
        _trips(h[:NBYTES], out[:NBYTES], d, g.stream)
    s = g.stream

    def run():
        g.replay(s)
        s.synchronize()
    run.keep = (g, h, out, d)
    # Unregistered once the row is done with (no replay follows).
    weakref.finalize(run, reg.__exit__, None, None, None)
    return _checked(run, out[:NBYTES])


def _eager(cuda):
    h, out, d = _buffers(cuda)
    s = cuda.stream()

    def run():
        _trips(h, out, d, s)
        s.synchronize()
    return _checked(run, out)


# CuPy --------------------------------------------------------------------

def _cupy_setup(cp, n=TRIPS):
    import cupyx

    h = cupyx.empty_pinned((NBYTES,), np.uint8)
    h[:] = PATTERN
    out = cupyx.empty_pinned((NBYTES,), np.uint8)
    out[:] = 0
    d = cp.empty(NBYTES, np.uint8)
    s = cp.cuda.Stream(non_blocking=True)
    rt = cp.cuda.runtime
    src, dst, dev = h.ctypes.data, out.ctypes.data, d.data.ptr

    def trips():
        for _ in range(n):
            rt.memcpyAsync(dev, src, NBYTES, rt.memcpyHostToDevice, s.ptr)
            rt.memcpyAsync(dst, dev, NBYTES, rt.memcpyDeviceToHost, s.ptr)
    return (h, out, d), s, trips


def _graph_cupy(cp, n=TRIPS):
    keep, s, trips = _cupy_setup(cp, n)
    s.begin_capture()
    try:
        trips()
    finally:
        g = s.end_capture()

    def run():
        g.launch(s)
        s.synchronize()
    run.keep = (g, keep)
    return _checked(run, keep[1])


def _eager_cupy(cp):
    keep, s, trips = _cupy_setup(cp)

    def run():
        trips()
        s.synchronize()
    run.keep = keep
    return _checked(run, keep[1])


# PyTorch -----------------------------------------------------------------

def _torch_setup(torch, n=TRIPS):
    h = torch.from_numpy(PATTERN.copy()).pin_memory()
    out = torch.zeros(NBYTES, dtype=torch.uint8, pin_memory=True)
    d = torch.empty(NBYTES, dtype=torch.uint8, device="cuda")

    def trips():
        for _ in range(n):
            d.copy_(h, non_blocking=True)
            out.copy_(d, non_blocking=True)
    return (h, out, d), torch.cuda.Stream(), trips


def _graph_torch(torch, n=TRIPS):
    keep, s, trips = _torch_setup(torch, n)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=s):
        trips()

    def run():
        with torch.cuda.stream(s):
            g.replay()
        s.synchronize()
    run.keep = (g, keep)
    return _checked(run, keep[1].numpy())


def _eager_torch(torch):
    keep, s, trips = _torch_setup(torch)

    def run():
        with torch.cuda.stream(s):
            trips()
        s.synchronize()
    run.keep = keep
    return _checked(run, keep[1].numpy())


# the bare driver, through ctypes (cudamem's context is current) ----------

def _graph_driver(core, n=TRIPS):
    cu = _libcuda()
    vp, sz, u64 = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint64
    pvp = ctypes.POINTER(vp)
    cu.cuStreamCreate.argtypes = [pvp, ctypes.c_uint]
    cu.cuStreamBeginCapture_v2.argtypes = [vp, ctypes.c_int]
    cu.cuMemcpyHtoDAsync_v2.argtypes = [u64, vp, sz, vp]
    cu.cuMemcpyDtoHAsync_v2.argtypes = [vp, u64, sz, vp]
    cu.cuStreamEndCapture.argtypes = [vp, pvp]
    cu.cuGraphInstantiateWithFlags.argtypes = [pvp, vp, ctypes.c_ulonglong]
    cu.cuGraphLaunch.argtypes = [vp, vp]
    cu.cuStreamSynchronize.argtypes = [vp]

    def ok(rc, what):
        if rc:
            raise RuntimeError("%s returned %d" % (what, rc))

    h, out = core._host_alloc(NBYTES, 0), core._host_alloc(NBYTES, 0)
    ctypes.memmove(h, PATTERN.ctypes.data, NBYTES)
    ctypes.memset(out, 0, NBYTES)
    d = core._device_alloc(NBYTES)
    s, graph, x = vp(), vp(), vp()
    ok(cu.cuStreamCreate(ctypes.byref(s), 1), "cuStreamCreate")
    ok(cu.cuStreamBeginCapture_v2(s, 0), "cuStreamBeginCapture")  # global
    try:
        for _ in range(n):
            ok(cu.cuMemcpyHtoDAsync_v2(d, h, NBYTES, s), "cuMemcpyHtoDAsync")
            ok(cu.cuMemcpyDtoHAsync_v2(out, d, NBYTES, s),
               "cuMemcpyDtoHAsync")
    finally:
        ok(cu.cuStreamEndCapture(s, ctypes.byref(graph)),
           "cuStreamEndCapture")
    ok(cu.cuGraphInstantiateWithFlags(ctypes.byref(x), graph, 0),
       "cuGraphInstantiateWithFlags")
    launch, sync = cu.cuGraphLaunch, cu.cuStreamSynchronize

    def run():
        launch(x, s)
        sync(s)
    view = np.frombuffer((ctypes.c_uint8 * NBYTES).from_address(out),
                         np.uint8)
    return _checked(run, view)


OPS = [
    {"name": "copy 1K pinned, 100 round trips [graph]", "per": COPIES,
     "impls": {"cudamem": _graph_cm, "cupy": _graph_cupy,
               "torch": _graph_torch, "driver": _graph_driver}},
    {"name": "copy 1K pinned, 1 trip [graph launch]", "per": 1,
     "impls": {"cudamem": lambda cm: _graph_cm(cm, 1),
               "cupy": lambda cp: _graph_cupy(cp, 1),
               "torch": lambda torch: _graph_torch(torch, 1),
               "driver": lambda core: _graph_driver(core, 1)}},
    {"name": "copy 1K pinned, 100 trips [copy nodes]",
     "per": COPIES, "impls": {"cudamem": _graph_cm_nodes}},
    {"name": "copy 1K pinned, 100 trips [kernel nodes]",
     "per": COPIES, "impls": {"cudamem": _graph_cm_apart}},
    {"name": "copy 1K registered, 100 trips [graph]",
     "per": COPIES, "impls": {"cudamem": _graph_cm_registered}},
    {"name": "copy 1K pinned, 100 round trips [eager]", "per": COPIES,
     "impls": {"cudamem": _eager, "numba": _eager, "cupy": _eager_cupy,
               "torch": _eager_torch}},
]
