# SPDX-License-Identifier: MIT
"""Memory managers and deferred cleanup, as numba.cuda exposes them.

The default manager's work is done in C (cudamem._core): its allocations
never pass through Python.  The class here is the Python face every
context shows as ``context.memory_manager``.
"""

import contextlib

from . import _core


class DefaultMemoryManager:
    """cudamem's built-in manager: cuMemAlloc, with frees deferred on the
    context's queue (``deallocations``) and flushed past the thresholds of
    ``config.CUDA_DEALLOCS_COUNT`` / ``CUDA_DEALLOCS_RATIO``."""

    interface_version = 1

    def __init__(self, context):
        self.context = context

    @property
    def deallocations(self):
        """The queue of pending memory frees."""
        return self.context._memory_deallocations

    def initialize(self):
        """Nothing to prepare; may be called any number of times."""

    def memalloc(self, size):
        """Allocate ``size`` bytes of device memory."""
        return self.context.memalloc(size)

    def get_memory_info(self):
        """(free, total) bytes of device memory."""
        return self.context.get_memory_info()

    def reset(self):
        """Run the pending frees now."""
        q = self.deallocations
        if not q.is_disabled:
            q.clear()

    @contextlib.contextmanager
    def defer_cleanup(self):
        """Hold this manager's frees until the block exits."""
        q = self.deallocations
        q._disable(1)
        try:
            yield
        finally:
            q._disable(-1)


@contextlib.contextmanager
def defer_cleanup():
    """Hold every deallocation of the current context until the outermost
    block exits; nestable.

    Both queues are held: memory frees and stream / event / module
    destroys.  Unregistering host memory pinned by ``pinned()`` or
    ``mapped()`` still happens at once.  On leaving the outermost block
    the thresholds apply again, so a queue that grew past them is flushed
    then.
    """
    ctx = _core.current_context()
    mq = ctx._memory_deallocations
    cq = ctx.deallocations
    mq._disable(1)
    try:
        cq._disable(1)
        try:
            yield
        finally:
            cq._disable(-1)
    finally:
        mq._disable(-1)
