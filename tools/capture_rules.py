# SPDX-License-Identifier: MIT
"""Which calls the driver refuses while another stream of the context
captures, straight through libcuda (ctypes, no cudamem), and whether the
refusal invalidates that capture: a context-wide synchronize, a
synchronize and a query of the legacy stream, cuStreamIsCapturing of the
legacy stream, and an allocation and free.  Each made with the calling
thread's interaction mode relaxed, as cudamem's background work makes
them, on the capturing thread and on another, for captures of a
blocking and a non-blocking stream begun in each mode.  The release
queue (csrc/memory/release.c, memory/pool/order.c) relies on the
answer: a release that synchronised the context while another library
captured would invalidate that capture whatever the modes.

    python tools/capture_rules.py

Prints one line per case: the capture's mode and stream, the call, the
thread, its answer, the capture's status after it (1 active, 2
invalidated), and cuStreamEndCapture's answer.
"""

import ctypes
import threading

MODES = {0: "GLOBAL", 1: "THREAD_LOCAL", 2: "RELAXED"}
CALLS = ("ctxsync", "legacy_sync", "legacy_query", "legacy_capturing",
         "memfree")
LEGACY = ctypes.c_void_p(1)           # CU_STREAM_LEGACY

cu = ctypes.CDLL("libcuda.so.1")


def answer(rc, what):
    """what=ok, or what=NUMBER(NAME)."""
    if rc == 0:
        return "%s=ok" % what
    name = ctypes.c_char_p()
    cu.cuGetErrorName(rc, ctypes.byref(name))
    return "%s=%d(%s)" % (what, rc, name.value.decode())


def call(which):
    """One of CALLS; the driver's answer."""
    if which == "ctxsync":
        return cu.cuCtxSynchronize()
    if which == "legacy_sync":
        return cu.cuStreamSynchronize(LEGACY)
    if which == "legacy_query":
        return cu.cuStreamQuery(LEGACY)
    if which == "legacy_capturing":
        st = ctypes.c_int()
        return cu.cuStreamIsCapturing(LEGACY, ctypes.byref(st))
    b = ctypes.c_uint64()
    rc = cu.cuMemAlloc_v2(ctypes.byref(b), 4096)
    return rc if rc else cu.cuMemFree_v2(b)


def trial(ctx, buf, mode, flags, which, other_thread):
    """Begin a capture of a new stream in mode, with a memset recorded;
    make the call in the relaxed interaction mode on this thread or
    another; record another memset and end the capture."""
    s = ctypes.c_void_p()
    cu.cuStreamCreate(ctypes.byref(s), flags)
    out = [answer(cu.cuStreamBeginCapture_v2(s, mode), "begin")]
    cu.cuMemsetD8Async(buf, 1, 1 << 20, s)
    got = {}

    def body():
        cu.cuCtxSetCurrent(ctx)
        m = ctypes.c_int(2)
        cu.cuThreadExchangeStreamCaptureMode(ctypes.byref(m))
        got["rc"] = call(which)
        cu.cuThreadExchangeStreamCaptureMode(ctypes.byref(m))

    if other_thread:
        t = threading.Thread(target=body)
        t.start()
        t.join()
    else:
        body()
    out.append(answer(got["rc"], which))
    st = ctypes.c_int()
    cu.cuStreamIsCapturing(s, ctypes.byref(st))
    out.append("status_after=%d" % st.value)
    cu.cuMemsetD8Async(buf, 2, 1 << 20, s)
    g = ctypes.c_void_p()
    out.append(answer(cu.cuStreamEndCapture(s, ctypes.byref(g)), "end"))
    out.append("graph=%s" % bool(g.value))
    if g.value:
        cu.cuGraphDestroy(g)
    cu.cuCtxSynchronize()
    cu.cuStreamDestroy_v2(s)
    print("capture %-12s stream %-11s %-16s %-6s | %s"
          % (MODES[mode], "nonblocking" if flags else "blocking", which,
             "thread" if other_thread else "same", " ".join(out)),
          flush=True)


def main():
    if cu.cuInit(0) != 0:
        raise SystemExit("no GPU: cuInit failed")
    dev = ctypes.c_int()
    cu.cuDeviceGet(ctypes.byref(dev), 0)
    ctx = ctypes.c_void_p()
    cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev)
    cu.cuCtxSetCurrent(ctx)
    buf = ctypes.c_uint64()
    if cu.cuMemAlloc_v2(ctypes.byref(buf), 1 << 20) != 0:
        raise SystemExit("cuMemAlloc failed")
    for mode in MODES:
        for flags in (1, 0):
            for which in CALLS:
                for other in (0, 1):
                    trial(ctx, buf, mode, flags, which, other)
    cu.cuMemFree_v2(buf)


if __name__ == "__main__":
    main()
