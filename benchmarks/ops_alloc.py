# SPDX-License-Identifier: MIT
"""Allocation: one small device array, made and dropped."""

import numpy as np


def _numba(cuda):
    return lambda: cuda.device_array(256, np.float32)


def _cudamem(cm):
    return lambda: cm.device_array(256, np.float32)


def _cupy(cp):
    return lambda: cp.empty(256, np.float32)


def _torch(torch):
    dev = torch.device("cuda")
    return lambda: torch.empty(256, dtype=torch.float32, device=dev)


def _driver(core):
    return lambda: core._alloc_free(1024)


def _memalloc_cm(cm):
    ctx = cm.current_context()
    return lambda: ctx.memalloc(1024)


def _memalloc_numba(cuda):
    ctx = cuda.current_context()
    return lambda: ctx.memalloc(1024)


def _memalloc_cupy(cp):
    return lambda: cp.cuda.alloc(1024)


OPS = [
    {"name": "device_array(256 f4)",
     "impls": {"cudamem": _cudamem, "numba": _numba, "cupy": _cupy,
               "torch": _torch, "driver": _driver}},
    {"name": "memalloc(1 KiB)",
     "impls": {"cudamem": _memalloc_cm, "numba": _memalloc_numba,
               "cupy": _memalloc_cupy, "driver": _driver}},
]
