# SPDX-License-Identifier: MIT
"""PyTorch's pluggable-allocator entry points of the extension, loaded
with ctypes and typed as PyTorch calls them (ctypes releases the GIL
around each call, as PyTorch does)."""

import ctypes


def entry_points():
    """The extension as a ctypes library with cudamem_torch_alloc and
    cudamem_torch_free typed."""
    from cudamem import _core

    lib = ctypes.CDLL(_core.__file__)
    lib.cudamem_torch_alloc.restype = ctypes.c_void_p
    lib.cudamem_torch_alloc.argtypes = [ctypes.c_size_t, ctypes.c_int,
                                        ctypes.c_void_p]
    lib.cudamem_torch_free.restype = None
    lib.cudamem_torch_free.argtypes = [ctypes.c_void_p, ctypes.c_size_t,
                                       ctypes.c_int, ctypes.c_void_p]
    return lib
