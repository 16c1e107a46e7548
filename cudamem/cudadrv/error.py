# SPDX-License-Identifier: MIT
"""numba.cuda.cudadrv.error's names, re-exported from cudamem."""

from .._errors import CudaDriverError, CudaSupportError

__all__ = ["CudaDriverError", "CudaSupportError"]
