# SPDX-License-Identifier: MIT
"""NumPy's advanced indexing on the device: ``d[idx]``, a gather of 1 M
float32 elements by 1 M random int64 indices held on the device (CuPy's
``take`` and PyTorch's ``index_select`` beside it), and ``d[mask]`` with
a device boolean mask.  Each call is synchronised.  numba's device arrays
take no index arrays: no numba column."""

import numpy as np

N = 1 << 20
_rng = np.random.default_rng(0)
_VALUES = _rng.random(N, dtype=np.float32)
_INDEX = _rng.integers(0, N, N, dtype=np.int64)
_MASK = _rng.random(N) < 0.5


def _cudamem_gather(cm):
    d = cm.to_device(_VALUES)
    idx = cm.to_device(_INDEX)
    sync = cm.synchronize

    def run():
        d[idx]
        sync()
    run.keep = (d, idx)
    return run


def _cupy_gather(cp):
    a = cp.asarray(_VALUES)
    idx = cp.asarray(_INDEX)
    sync = cp.cuda.Device().synchronize

    def run():
        cp.take(a, idx)
        sync()
    return run


def _torch_gather(torch):
    a = torch.as_tensor(_VALUES, device="cuda")
    idx = torch.as_tensor(_INDEX, device="cuda")
    sync = torch.cuda.synchronize

    def run():
        torch.index_select(a, 0, idx)
        sync()
    return run


def _cudamem_mask(cm):
    d = cm.to_device(_VALUES)
    m = cm.to_device(_MASK)
    sync = cm.synchronize

    def run():
        d[m]
        sync()
    run.keep = (d, m)
    return run


def _cupy_mask(cp):
    a = cp.asarray(_VALUES)
    m = cp.asarray(_MASK)
    sync = cp.cuda.Device().synchronize

    def run():
        a[m]
        sync()
    return run


def _torch_mask(torch):
    a = torch.as_tensor(_VALUES, device="cuda")
    m = torch.as_tensor(_MASK, device="cuda")
    sync = torch.cuda.synchronize

    def run():
        a[m]
        sync()
    return run


OPS = [
    {"name": "gather d[idx] 1M f32, 1M idx",
     "impls": {"cudamem": _cudamem_gather, "cupy": _cupy_gather,
               "torch": _torch_gather}},
    {"name": "mask read d[mask] 1M f32",
     "impls": {"cudamem": _cudamem_mask, "cupy": _cupy_mask,
               "torch": _torch_mask}},
]
