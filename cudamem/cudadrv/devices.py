# SPDX-License-Identifier: MIT
"""numba.cuda.cudadrv.devices' names, re-exported from cudamem."""

from .._api import close as reset
from .._api import gpus, require_context
from .._core import current_context as get_context

__all__ = ["get_context", "gpus", "require_context", "reset"]
