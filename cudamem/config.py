# SPDX-License-Identifier: MIT
"""cudamem's configuration, with numba's attribute names.

Read from the environment at import: a ``CUDAMEM_*`` spelling wins over
the ``NUMBA_*`` one.  The values are consulted at each use, so code (and
tests) may change them at run time, e.g.
``cudamem.config.CUDA_ARRAY_INTERFACE_SYNC = False``.
"""

import os
import struct
import sys
import types

from . import _core

__all__ = [
    "CUDA_ARRAY_INTERFACE_SYNC",
    "CUDA_DEALLOCS_COUNT",
    "CUDA_DEALLOCS_RATIO",
    "CUDA_MEMORY_MANAGER",
    "CUDA_PER_THREAD_DEFAULT_STREAM",
    "CUDA_STREAM_CACHE_SIZE",
    "CUDA_WARN_ON_IMPLICIT_COPY",
    "DISABLE_CUDA",
    "ENABLE_CUDASIM",
]


def _env(names, convert, default):
    """The first of ``names`` set in the environment, converted, else
    ``default``."""
    for name in names:
        value = os.environ.get(name)
        if value is not None and value != "":
            return convert(value)
    return default


def _flag(value):
    return bool(int(value)) if value.strip().isdigit() else (
        value.strip().lower() in ("true", "yes", "on"))


CUDA_DEALLOCS_COUNT = _env(
    ("CUDAMEM_MAX_PENDING_DEALLOCS_COUNT",
     "NUMBA_CUDA_MAX_PENDING_DEALLOCS_COUNT"), int, 10)
CUDA_DEALLOCS_RATIO = _env(
    ("CUDAMEM_MAX_PENDING_DEALLOCS_RATIO",
     "NUMBA_CUDA_MAX_PENDING_DEALLOCS_RATIO"), float, 0.2)
CUDA_ARRAY_INTERFACE_SYNC = _env(
    ("CUDAMEM_ARRAY_INTERFACE_SYNC", "NUMBA_CUDA_ARRAY_INTERFACE_SYNC"),
    _flag, True)
CUDA_MEMORY_MANAGER = _env(
    ("CUDAMEM_MEMORY_MANAGER", "NUMBA_CUDA_MEMORY_MANAGER"), str, "default")
CUDA_PER_THREAD_DEFAULT_STREAM = _env(
    ("CUDAMEM_PER_THREAD_DEFAULT_STREAM",
     "NUMBA_CUDA_PER_THREAD_DEFAULT_STREAM"), _flag, False)
# cudamem only: how many idle dropped streams each context keeps for
# stream() to hand out again (0 to 16; 0 destroys every dropped stream).
CUDA_STREAM_CACHE_SIZE = _env(
    ("CUDAMEM_STREAM_CACHE_SIZE",), int, 16)
CUDA_WARN_ON_IMPLICIT_COPY = _env(
    ("CUDAMEM_WARN_ON_IMPLICIT_COPY", "NUMBA_CUDA_WARN_ON_IMPLICIT_COPY"),
    _flag, True)
DISABLE_CUDA = _env(
    ("CUDAMEM_DISABLE_CUDA", "NUMBA_DISABLE_CUDA"), _flag,
    struct.calcsize("P") < 8)
ENABLE_CUDASIM = _env(
    ("CUDAMEM_SIMULATOR", "NUMBA_ENABLE_CUDASIM"), _flag, False)


class _Config(types.ModuleType):
    """Pushes the settings the C layer reads on every release into it, so
    that assigning to them takes effect at once."""

    def __setattr__(self, name, value):
        if name == "CUDA_STREAM_CACHE_SIZE":
            _core._set_stream_cache_size(int(value))   # checks the range
        super().__setattr__(name, value)
        if name in ("CUDA_DEALLOCS_COUNT", "CUDA_DEALLOCS_RATIO"):
            _core._set_dealloc_config(int(self.CUDA_DEALLOCS_COUNT),
                                      float(self.CUDA_DEALLOCS_RATIO))


sys.modules[__name__].__class__ = _Config
_core._set_dealloc_config(int(CUDA_DEALLOCS_COUNT),
                          float(CUDA_DEALLOCS_RATIO))
_core._set_stream_cache_size(int(CUDA_STREAM_CACHE_SIZE))
