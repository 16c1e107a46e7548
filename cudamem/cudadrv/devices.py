# SPDX-License-Identifier: MIT
"""numba.cuda.cudadrv.devices' names, re-exported from cudamem."""

from .. import _core
from .._api import close as reset
from .._api import gpus, require_context

__all__ = ["get_context", "gpus", "require_context", "reset"]


def get_context(devnum=None):
    """The primary context of device ``devnum`` (made current if needed),
    or, for None, the current context (device 0's if there is none)."""
    if devnum is None:
        return _core.current_context()
    return _core.current_context(devnum)
