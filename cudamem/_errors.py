# SPDX-License-Identifier: MIT
"""Exception classes and small value types shared by cudamem's layers.

The C extension fetches these once at import, so they are plain Python
classes that pickle by value.
"""

from collections import namedtuple

__all__ = [
    "CompileError",
    "CudaAPIError",
    "CudaDriverError",
    "CudaOutOfMemoryError",
    "CudaSupportError",
    "MemoryInfo",
    "StreamCaptureError",
]


class CudaSupportError(ImportError):
    """CUDA cannot be used: no driver, no device, or CUDA disabled.

    ``msg`` holds the reason, as in numba.
    """

    def __init__(self, msg=""):
        super().__init__(msg)
        self.msg = msg

    def __reduce__(self):
        return (type(self), (self.msg,))


class CudaDriverError(Exception):
    """An error in cudamem's use of the driver that is not a CUresult."""


class CudaAPIError(CudaDriverError):
    """A driver call returned an error.

    Attributes: ``code`` (the CUresult, an int), ``name`` (for example
    ``"CUDA_ERROR_OUT_OF_MEMORY"``), ``fn`` (the driver function) and
    ``msg`` ("Call to cuMemAlloc results in CUDA_ERROR_OUT_OF_MEMORY").
    ``str()`` is ``"[code] msg"``, as in numba.
    """

    def __init__(self, code, fn, name=None):
        if name is None:
            # CudaAPIError(code, msg), numba's own signature.
            msg, fn, name = fn, None, None
        else:
            msg = "Call to %s results in %s" % (fn, name)
        self.code = int(code)
        self.fn = fn
        self.name = name
        self.msg = msg
        super().__init__(self.code, msg)

    def __str__(self):
        return "[%s] %s" % (self.code, self.msg)

    def __reduce__(self):
        if self.name is None:
            return (type(self), (self.code, self.msg))
        return (type(self), (self.code, self.fn, self.name))


class StreamCaptureError(CudaAPIError):
    """Work was refused because a stream it touches is capturing a CUDA
    graph.

    Where cudamem knows of the capture (one it began), the error comes
    before any driver call and the capture stays valid: code 900,
    CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED (what the driver answers for
    the same call), a message that names the stream and what to do
    instead.  Where only the driver knows (another library's capture),
    the driver's refusal (its codes 900 to 908) raises it, with the
    driver's code and wording; the driver has then invalidated that
    capture.  A CudaAPIError, so that code catching numba's driver
    errors catches it too.
    """

    CODE = 900

    def __init__(self, msg, fn=None, name=None):
        if fn is not None:
            # cm_raise_cu: StreamCaptureError(code, fn, name).
            super().__init__(msg, fn, name)
            return
        super().__init__(self.CODE, msg)
        self.name = "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED"

    def __reduce__(self):
        if self.fn is not None:
            return (type(self), (self.code, self.fn, self.name))
        return (type(self), (self.msg,))


class CudaOutOfMemoryError(CudaAPIError, MemoryError):
    """CUDA_ERROR_OUT_OF_MEMORY: a CudaAPIError that is also a MemoryError.

    ``dump(path)`` writes a memory snapshot with what the error reported
    (the input of ``python -m cudamem memviz``).
    """

    def dump(self, path):
        """Write ``cudamem.memory_snapshot()``, taken now, with this
        error's figures under ``oom``, to ``path`` as JSON; the path.

        The arrays alive at the failure normally still are while the
        error is handled; turn on ``cudamem.memory_history`` beforehand
        to have the events (and stacks) that led to it.
        """
        from ._history import dump_snapshot, memory_snapshot

        snap = memory_snapshot()
        oom = {"message": str(self), "fn": self.fn}
        for name in ("requested", "free", "total", "pending_bytes",
                     "pool_reserved", "largest_free_block", "limit",
                     "limit_used"):
            oom[name] = getattr(self, name, None)
        snap["oom"] = oom
        return dump_snapshot(path, snap)


class CompileError(Exception):
    """NVRTC rejected a CUDA C source (``cudamem.compile``).

    ``msg`` is the message (NVRTC's error name and the program name
    followed by the log); ``log`` is NVRTC's program log alone, with the
    file, line and text of every error and warning.
    """

    def __init__(self, msg="", log=""):
        super().__init__(msg)
        self.msg = msg
        self.log = log

    def __str__(self):
        return self.msg

    def __reduce__(self):
        return (type(self), (self.msg, self.log))


MemoryInfo = namedtuple("MemoryInfo", "free,total")
MemoryInfo.__doc__ = "Free and total device memory, in bytes."
