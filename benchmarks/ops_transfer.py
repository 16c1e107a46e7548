# SPDX-License-Identifier: MIT
"""Device arrays and small transfers: per-call overhead, side by side.

Every callable leaves the device idle: copies without a stream are
synchronous in every library measured.

The ``htod 1K pageable ...`` / ``dtoh 1K pageable ...`` rows (issue
32) time a synchronous copy (no stream) of 1 KiB between a pageable NumPy
array and a device array per way of making it: cudamem with the test aid
``_core._sync_copy_call`` set to the mode in brackets (``sync``: the
synchronous call, today's default; ``async``: the asynchronous call on
the default stream after the driver's pointer query found the host
memory pageable; ``async_wait``: the same, and a copy into the host then
synchronizes that stream), and in the driver column bare_driver.c making
the same driver calls from C (``copy`` command: the pointer query too,
for the async modes).  ``[C async]`` rows have the C program alone, the
asynchronous call without the query: the difference to the ``[async]``
row's driver column is the query's cost.  ``existing``: into an existing
array (``copy_to_device(h)``, ``copy_to_host(out)``); ``new``:
``copy_to_host()``, a new host array each time.
"""

import numpy as np

import bare_driver
import harness
from ops_alloc import _cm_alloc_in

N = 256
HOST = np.arange(N, dtype=np.float32)


def _cupy_array(cp):
    return cp.asarray(HOST)


def _torch_tensor(torch):
    return torch.as_tensor(HOST, device="cuda")


# device_array_like ----------------------------------------------------------

def _like_cm(cm):
    return lambda: cm.device_array_like(HOST)


def _like_numba(cuda):
    return lambda: cuda.device_array_like(HOST)


def _like_cupy(cp):
    a = _cupy_array(cp)
    return lambda: cp.empty_like(a)


def _like_torch(torch):
    t = _torch_tensor(torch)
    return lambda: torch.empty_like(t)


# to_device -----------------------------------------------------------------

def _to_cm(cm):
    return lambda: cm.to_device(HOST)


def _to_numba(cuda):
    return lambda: cuda.to_device(HOST)


def _to_cupy(cp):
    return lambda: cp.asarray(HOST)


def _to_torch(torch):
    return lambda: torch.as_tensor(HOST, device="cuda")


def _to_driver(core):
    def run():
        p = core._device_alloc(HOST.nbytes)
        core._memcpy_htod(p, HOST)
        core._device_free(p)
    return run


# copy_to_host --------------------------------------------------------------

def _dth_cm(cm):
    d = cm.to_device(HOST)
    return d.copy_to_host


def _dth_numba(cuda):
    d = cuda.to_device(HOST)
    return d.copy_to_host


def _dth_cupy(cp):
    a = _cupy_array(cp)
    return a.get


def _dth_torch(torch):
    t = _torch_tensor(torch)
    return lambda: t.cpu().numpy()


def _dth_driver(core):
    p = core._device_alloc(HOST.nbytes)
    core._memcpy_htod(p, HOST)

    def run():
        out = np.empty_like(HOST)
        core._memcpy_dtoh(out, p)
        return out
    return run


# copy_to_device into an existing array -------------------------------------

def _htd_cm(cm):
    d = cm.device_array_like(HOST)
    return lambda: d.copy_to_device(HOST)


def _htd_numba(cuda):
    d = cuda.device_array_like(HOST)
    return lambda: d.copy_to_device(HOST)


def _htd_cupy(cp):
    a = _cupy_array(cp)
    stream = cp.cuda.get_current_stream()

    def run():
        a.set(HOST)  # enqueued on the current stream: wait for it
        stream.synchronize()
    return run


def _htd_torch(torch):
    t = _torch_tensor(torch)
    src = torch.from_numpy(HOST)
    return lambda: t.copy_(src)


def _htd_driver(core):
    p = core._device_alloc(HOST.nbytes)
    return lambda: core._memcpy_htod(p, HOST)


# Synchronous copies of pageable memory, per call (issue 32) ----------------

C_SAMPLES = 31
C_MS = 2


def _in_mode(mode, make):
    """cudamem's column with _core._sync_copy_call(mode) while it is
    timed (here: harness.Measured), the previous mode set back after."""
    def factory(cm):
        core = cm._core
        if not hasattr(core, "_sync_copy_call"):
            raise harness.Skip("this build has no _sync_copy_call")
        old = core._sync_copy_call(mode)
        try:
            fn = make(cm)
            return harness.Measured(harness.time_callable(fn))
        finally:
            core._sync_copy_call(old)
    return factory


def _dth_out_cm(cm):
    d = cm.device_array_like(HOST)
    out = np.empty_like(HOST)
    return lambda: d.copy_to_host(out)


def _dth_out_cupy(cp):
    a = _cupy_array(cp)
    out = np.empty_like(HOST)
    return lambda: a.get(out=out)


def _dth_out_torch(torch):
    t = _torch_tensor(torch)
    out = torch.from_numpy(np.empty_like(HOST))
    return lambda: out.copy_(t)


def _c_copy(direction, call):
    def factory(core):
        return bare_driver.run("copy", direction, call, HOST.nbytes,
                               C_SAMPLES, C_MS)
    return factory


# (row, cudamem's factory, CuPy's, PyTorch's, the C program's direction)
_PAGEABLE = (
    ("htod 1K pageable, existing", _htd_cm, _htd_cupy, _htd_torch,
     "htod"),
    ("dtoh 1K pageable, existing", _dth_out_cm, _dth_out_cupy,
     _dth_out_torch, "dtoh"),
    ("dtoh 1K pageable, new", _dth_cm, _dth_cupy, _dth_torch,
     "dtoh-new"),
)
# cudamem's mode and the C program's call that makes the same driver calls.
_C_CALL = {"sync": "sync", "async": "query-async",
           "async_wait": "query-async-wait"}


def _pageable_ops():
    ops = []
    for name, cm_make, cupy_make, torch_make, direction in _PAGEABLE:
        modes = ("sync", "async") if direction == "htod" \
            else ("sync", "async", "async_wait")
        for mode in modes:
            ops.append({
                "name": "%s [%s]" % (name, mode),
                "impls": {"cudamem": _in_mode(mode, cm_make),
                          "cupy": cupy_make, "torch": torch_make,
                          "driver": _c_copy(direction, _C_CALL[mode])}})
        ops.append({"name": "%s [C async]" % name,
                    "impls": {"driver": _c_copy(direction, "async")}})
    return ops


# as_cuda_array of a foreign array ------------------------------------------

def _foreign(kind):
    import importlib

    if kind == "cupy":
        cp = importlib.import_module("cupy")
        return cp.asarray(HOST)
    torch = importlib.import_module("torch")
    return torch.as_tensor(HOST, device="cuda")


def _wrap_cm(kind):
    def factory(cm):
        obj = _foreign(kind)
        return lambda: cm.as_cuda_array(obj)
    return factory


def _wrap_numba(kind):
    def factory(cuda):
        obj = _foreign(kind)
        return lambda: cuda.as_cuda_array(obj)
    return factory


def _wrap_torch_of_cupy(torch):
    obj = _foreign("cupy")
    return lambda: torch.as_tensor(obj, device="cuda")


def _wrap_cupy_of_torch(cp):
    obj = _foreign("torch")
    return lambda: cp.asarray(obj)


# __cuda_array_interface__ --------------------------------------------------

def _cai(make):
    def factory(mod):
        obj = make(mod)
        return lambda: obj.__cuda_array_interface__
    return factory


# DLPack ----------------------------------------------------------------------

# Each row consumes one producer's arrays, so that every library pays the
# same producer's __dlpack__ (PyTorch's is Python, CuPy's Cython).

def _dl_of(producer):
    def factory(consumer):
        obj = _foreign(producer)
        return lambda: consumer.from_dlpack(obj)
    return factory


def _dl_export(make):
    """__dlpack__() of an array of this library; the unconsumed capsule is
    dropped at once, so its deleter runs inside the timing too."""
    def factory(mod):
        obj = make(mod)
        return lambda: obj.__dlpack__()
    return factory


OPS = [
    {"name": "device_array_like(256 f4)",
     "impls": {"cudamem": _like_cm, "numba": _like_numba,
               "cupy": _like_cupy, "torch": _like_torch}},
    # The same with cudamem's caching allocator, as CuPy and PyTorch
    # serve theirs.
    {"name": "device_array_like(256 f4) [pool]",
     "impls": {"cudamem": _cm_alloc_in("pool", "device_array_like"),
               "numba": _like_numba, "cupy": _like_cupy,
               "torch": _like_torch}},
    {"name": "to_device(256 f4)",
     "impls": {"cudamem": _to_cm, "numba": _to_numba, "cupy": _to_cupy,
               "torch": _to_torch, "driver": _to_driver}},
    {"name": "copy_to_host(256 f4)",
     "impls": {"cudamem": _dth_cm, "numba": _dth_numba, "cupy": _dth_cupy,
               "torch": _dth_torch, "driver": _dth_driver}},
    {"name": "copy_to_device(256 f4, existing)",
     "impls": {"cudamem": _htd_cm, "numba": _htd_numba, "cupy": _htd_cupy,
               "torch": _htd_torch, "driver": _htd_driver}},
    *_pageable_ops(),
    {"name": "as_cuda_array(cupy array)",
     "impls": {"cudamem": _wrap_cm("cupy"), "numba": _wrap_numba("cupy"),
               "torch": _wrap_torch_of_cupy}},
    {"name": "as_cuda_array(torch tensor)",
     "impls": {"cudamem": _wrap_cm("torch"), "numba": _wrap_numba("torch"),
               "cupy": _wrap_cupy_of_torch}},
    {"name": "from_dlpack(torch tensor)",
     "impls": {"cudamem": _dl_of("torch"), "torch": _dl_of("torch"),
               "cupy": _dl_of("torch")}},
    {"name": "from_dlpack(cupy array)",
     "impls": {"cudamem": _dl_of("cupy"), "torch": _dl_of("cupy"),
               "cupy": _dl_of("cupy")}},
    {"name": "__dlpack__()",
     "impls": {"cudamem": _dl_export(lambda cm: cm.to_device(HOST)),
               "cupy": _dl_export(_cupy_array),
               "torch": _dl_export(_torch_tensor)}},
    {"name": "__cuda_array_interface__",
     "impls": {"cudamem": _cai(lambda cm: cm.to_device(HOST)),
               "numba": _cai(lambda cuda: cuda.to_device(HOST)),
               "cupy": _cai(_cupy_array), "torch": _cai(_torch_tensor)}},
]
