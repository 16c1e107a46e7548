# SPDX-License-Identifier: MIT
"""Run-time settings under numba's names, read from the environment at
import (CUDAMEM_* spellings win over NUMBA_* ones) and consulted at each
use, so code and tests may change them at run time."""

import os
import sys
import types

from . import _core


def _env(name, default, conv):
    for prefix in ("CUDAMEM_", "NUMBA_CUDA_", "NUMBA_"):
        v = os.environ.get(prefix + name)
        if v:
            try:
                return conv(v)
            except ValueError:
                break
    return default


def _bool(v):
    return v.strip().lower() not in ("0", "false", "no", "off", "")


CUDA_DEALLOCS_COUNT = _env("MAX_PENDING_DEALLOCS_COUNT", 10, int)
CUDA_DEALLOCS_RATIO = _env("MAX_PENDING_DEALLOCS_RATIO", 0.2, float)
CUDA_ARRAY_INTERFACE_SYNC = _env("ARRAY_INTERFACE_SYNC", True, _bool)
CUDA_MEMORY_MANAGER = _env("MEMORY_MANAGER", "default", str)
CUDA_PER_THREAD_DEFAULT_STREAM = _env("PER_THREAD_DEFAULT_STREAM", False,
                                      _bool)
CUDA_WARN_ON_IMPLICIT_COPY = _env("WARN_ON_IMPLICIT_COPY", True, _bool)
DISABLE_CUDA = _bool(os.environ.get("NUMBA_DISABLE_CUDA", "0"))
ENABLE_CUDASIM = _bool(os.environ.get("CUDAMEM_SIMULATOR")
                       or os.environ.get("NUMBA_ENABLE_CUDASIM") or "0")


class _Config(types.ModuleType):
    """Pushes the settings the C layer reads on every release into it."""

    def __setattr__(self, name, value):
        super().__setattr__(name, value)
        if name in ("CUDA_DEALLOCS_COUNT", "CUDA_DEALLOCS_RATIO"):
            _core._set_dealloc_config(int(self.CUDA_DEALLOCS_COUNT),
                                      float(self.CUDA_DEALLOCS_RATIO))


sys.modules[__name__].__class__ = _Config
_core._set_dealloc_config(int(CUDA_DEALLOCS_COUNT),
                          float(CUDA_DEALLOCS_RATIO))
