# SPDX-License-Identifier: MIT
"""Memory made for a stream cudamem does not own (an external stream, or
CuPy's current stream through interop.use_with_cupy) whose stream is
destroyed after the memory is released.

The pool manager used to leave such a block keyed to the stream's handle
and record an event on that handle later, the first time another stream
wanted the block: on a destroyed stream, a crash in the driver (CuPy on
the pool manager died with SIGSEGV when a CuPy stream went before the
next allocation on another stream).  The release of such memory is now
ordered at once, while the stream is alive.  Each case runs in a child
process, so that a crash fails the test instead of the suite.
"""

import json

import pytest

from helpers.crashutil import run_child

MANAGERS = ["pool", "async"]


@pytest.mark.ahead
@pytest.mark.parametrize("manager", MANAGERS)
@pytest.mark.parametrize("how", ["external_stream", "client_alloc",
                                 "cupy_shaped"])
def test_memory_of_a_stream_destroyed_after_its_release(manager, how):
    r = run_child("""
        import gc, json, sys
        import numpy as np
        import cudamem
        from cudamem import _core

        manager, how = sys.argv[1], sys.argv[2]
        cudamem.set_memory_manager(manager)
        # A block of its own segment: the next request of that size from
        # another stream wants exactly that block.
        n = 24 << 20

        class Stream:
            # CuPy's shape: the object owns its stream and destroys it
            # when it goes.
            def __init__(self):
                self.ptr = _core._raw_stream_create(1)

            def __del__(self):
                _core._raw_stream_destroy(self.ptr)

        class Unowned:
            def __init__(self, ptr, size, owner, device):
                self.owner = owner

        class MemPtr:
            def __init__(self, mem, offset):
                self.mem = mem

        current = []
        malloc = _core._cupy_allocator(lambda: current[-1], Unowned, MemPtr)
        res = {"ok": []}
        for round_ in range(3):
            if how == "cupy_shaped":
                # The stream object goes first, its memory afterwards (a
                # function's locals in any order): cudamem keeps the
                # stream until the memory is released.
                current.append(Stream())
                mp = malloc(n)
                current.clear()
                del mp
                gc.collect()
                raw = None
            else:
                raw = _core._raw_stream_create(1)  # non-blocking, foreign
            if how == "external_stream":
                ext = cudamem.external_stream(raw)
                a = cudamem.device_array(n, np.uint8, stream=ext)
                a.copy_to_device(np.full(n, 7, np.uint8), stream=ext)
                del a
                del ext
            elif how == "client_alloc":
                # What PyTorch's adapter calls: a raw handle.
                own = _core._client_alloc(0, n, raw, 0)
                del own
            gc.collect()
            if raw is not None:
                _core._raw_stream_destroy(raw)
            # Other streams now want blocks of that size (and the
            # default stream): none may touch the destroyed handle.
            s = cudamem.stream()
            b = cudamem.device_array(n, np.uint8, stream=s)
            b.copy_to_device(np.full(n, round_, np.uint8), stream=s)
            c = cudamem.device_array(n, np.uint8)
            c.copy_to_device(np.full(n, 9, np.uint8))
            got = b.copy_to_host(stream=s)
            s.synchronize()
            res["ok"].append(bool((got == round_).all())
                             and bool((c.copy_to_host() == 9).all()))
            del b, c, s
        cudamem.synchronize()
        print(json.dumps(res))
    """, args=[manager, how], timeout=120)
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["ok"] == [True, True, True]
