"""How the driver's virtual-memory calls behave on this machine, straight
through libcuda (ctypes, no cudamem): whether cuMemUnmap, cuMemRelease,
cuMemMap, cuMemSetAccess and cuMemCreate wait for work queued on an
unrelated stream (a host function holding it for HOLD seconds), and what
each costs per 2 MiB page.  The pool on virtual memory
(csrc/memory/pool/vmm/) relies on the answer: it unmaps only pages whose
own work is done, and must not wait for, or be held by, other streams.
Then what one handle of 16 pages costs per page, and what a page's move
costs between addresses used before.  Last, which of those calls the
driver refuses on one thread while another captures in global mode, in
the default interaction mode and in the relaxed one.

    python tools/vmm_probe.py [HOLD_SECONDS]
"""
import ctypes
import sys
import threading
import time

HOLD = float(sys.argv[1]) if len(sys.argv) > 1 else 1.0

cu = ctypes.CDLL("libcuda.so.1")


def ck(rc, what):
    if rc != 0:
        raise SystemExit("%s failed: %d" % (what, rc))


class Loc(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]


class Prop(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("requestedHandleTypes", ctypes.c_int),
                ("location", Loc), ("win32HandleMetaData", ctypes.c_void_p),
                ("compressionType", ctypes.c_ubyte),
                ("gpuDirectRDMACapable", ctypes.c_ubyte),
                ("usage", ctypes.c_ushort), ("reserved", ctypes.c_ubyte * 4)]


class Access(ctypes.Structure):
    _fields_ = [("location", Loc), ("flags", ctypes.c_int)]


ck(cu.cuInit(0), "cuInit")
dev = ctypes.c_int()
ck(cu.cuDeviceGet(ctypes.byref(dev), 0), "cuDeviceGet")
ctx = ctypes.c_void_p()
ck(cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev), "retain")
ck(cu.cuCtxSetCurrent(ctx), "set current")

prop = Prop()
prop.type = 1                      # PINNED
prop.location = Loc(1, dev.value)  # DEVICE
gran = ctypes.c_size_t()
ck(cu.cuMemGetAllocationGranularity(ctypes.byref(gran), ctypes.byref(prop),
                                    0), "granularity")
G = gran.value
N = 64
va = ctypes.c_uint64()
ck(cu.cuMemAddressReserve(ctypes.byref(va), ctypes.c_size_t(N * G),
                          ctypes.c_size_t(G), ctypes.c_uint64(0),
                          ctypes.c_ulonglong(0)), "reserve")
acc = Access(Loc(1, dev.value), 3)  # READWRITE


def page(i):
    return ctypes.c_uint64(va.value + i * G)


def make(i):
    h = ctypes.c_ulonglong()
    t0 = time.perf_counter()
    ck(cu.cuMemCreate(ctypes.byref(h), ctypes.c_size_t(G), ctypes.byref(prop),
                      ctypes.c_ulonglong(0)), "create")
    t1 = time.perf_counter()
    ck(cu.cuMemMap(page(i), ctypes.c_size_t(G), ctypes.c_size_t(0), h,
                   ctypes.c_ulonglong(0)), "map")
    t2 = time.perf_counter()
    ck(cu.cuMemSetAccess(page(i), ctypes.c_size_t(G), ctypes.byref(acc),
                         ctypes.c_size_t(1)), "access")
    t3 = time.perf_counter()
    return h, (t1 - t0, t2 - t1, t3 - t2)


def drop(i, h):
    t0 = time.perf_counter()
    ck(cu.cuMemUnmap(page(i), ctypes.c_size_t(G)), "unmap")
    t1 = time.perf_counter()
    ck(cu.cuMemRelease(h), "release")
    t2 = time.perf_counter()
    return t1 - t0, t2 - t1


print("granularity %d bytes" % G)
# Cost per page, device idle.
costs = [make(i) for i in range(32)]
drops = [drop(i, h) for i, (h, _) in enumerate(costs)]


def us(xs):
    xs = sorted(xs)
    return "%.1f" % (xs[len(xs) // 2] * 1e6)


print("idle device, median us per page: create %s map %s access %s "
      "unmap %s release %s"
      % (us([c[1][0] for c in costs]), us([c[1][1] for c in costs]),
         us([c[1][2] for c in costs]), us([d[0] for d in drops]),
         us([d[1] for d in drops])))
# One access call over 16 mapped pages.
hs = []
for i in range(16):
    h = ctypes.c_ulonglong()
    ck(cu.cuMemCreate(ctypes.byref(h), ctypes.c_size_t(G), ctypes.byref(prop),
                      ctypes.c_ulonglong(0)), "create")
    ck(cu.cuMemMap(page(i), ctypes.c_size_t(G), ctypes.c_size_t(0), h,
                   ctypes.c_ulonglong(0)), "map")
    hs.append(h)
t0 = time.perf_counter()
ck(cu.cuMemSetAccess(page(0), ctypes.c_size_t(16 * G), ctypes.byref(acc),
                     ctypes.c_size_t(1)), "access 16")
print("one cuMemSetAccess over 16 pages: %.1f us"
      % ((time.perf_counter() - t0) * 1e6))
# One cuMemUnmap over the 16 pages, each mapped by its own cuMemMap:
# whether the driver takes a range of several mappings, and its cost.
t0 = time.perf_counter()
rc = cu.cuMemUnmap(page(0), ctypes.c_size_t(16 * G))
t1 = time.perf_counter()
print("one cuMemUnmap over 16 pages mapped one by one: rc %d, %.1f us"
      % (rc, (t1 - t0) * 1e6))
for i, h in enumerate(hs):
    if rc != 0:
        ck(cu.cuMemUnmap(page(i), ctypes.c_size_t(G)), "unmap")
    ck(cu.cuMemRelease(h), "release")

# One handle of 16 pages: whether the calls cost per page or per call.
h = ctypes.c_ulonglong()
t0 = time.perf_counter()
ck(cu.cuMemCreate(ctypes.byref(h), ctypes.c_size_t(16 * G),
                  ctypes.byref(prop), ctypes.c_ulonglong(0)), "create 16")
t1 = time.perf_counter()
ck(cu.cuMemMap(page(0), ctypes.c_size_t(16 * G), ctypes.c_size_t(0), h,
               ctypes.c_ulonglong(0)), "map 16")
t2 = time.perf_counter()
ck(cu.cuMemSetAccess(page(0), ctypes.c_size_t(16 * G), ctypes.byref(acc),
                     ctypes.c_size_t(1)), "access 16")
t3 = time.perf_counter()
ck(cu.cuMemUnmap(page(0), ctypes.c_size_t(16 * G)), "unmap 16")
t4 = time.perf_counter()
ck(cu.cuMemRelease(h), "release 16")
t5 = time.perf_counter()
print("one handle of 16 pages, us per page: create %.1f map %.1f access "
      "%.1f unmap %.1f release %.1f"
      % tuple((b - a) * 1e6 / 16 for a, b in
              ((t0, t1), (t1, t2), (t2, t3), (t3, t4), (t4, t5))))
# A page moved (unmapped, mapped elsewhere, access granted) between two
# addresses used before, as the pool moves idle pages: the cost of each
# step once the addresses' page tables exist.
h, _ = make(0)
steps = []
at = 0
for k in range(33):
    to = 1 if at == 0 else 0
    t0 = time.perf_counter()
    ck(cu.cuMemUnmap(page(at), ctypes.c_size_t(G)), "unmap")
    t1 = time.perf_counter()
    ck(cu.cuMemMap(page(to), ctypes.c_size_t(G), ctypes.c_size_t(0), h,
                   ctypes.c_ulonglong(0)), "map")
    t2 = time.perf_counter()
    ck(cu.cuMemSetAccess(page(to), ctypes.c_size_t(G), ctypes.byref(acc),
                         ctypes.c_size_t(1)), "access")
    t3 = time.perf_counter()
    if k:
        steps.append((t1 - t0, t2 - t1, t3 - t2))
    at = to
drop(at, h)
print("a page moved between two addresses used before, median us: unmap "
      "%s map %s access %s"
      % (us([x[0] for x in steps]), us([x[1] for x in steps]),
         us([x[2] for x in steps])))

# Does a call wait for another stream, held by a host function?
HOSTFN = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


@HOSTFN
def hold(arg):
    time.sleep(HOLD)


stream = ctypes.c_void_p()
ck(cu.cuStreamCreate(ctypes.byref(stream), 1), "stream")
h, _ = make(40)
h2, _ = make(41)
ck(cu.cuLaunchHostFunc(stream, hold, None), "host func")
time.sleep(0.05)
res = {}
t0 = time.perf_counter()
h3, _ = make(42)
res["create+map+access"] = time.perf_counter() - t0
t0 = time.perf_counter()
ck(cu.cuMemUnmap(page(40), ctypes.c_size_t(G)), "unmap")
res["unmap"] = time.perf_counter() - t0
t0 = time.perf_counter()
ck(cu.cuMemRelease(h), "release")
res["release"] = time.perf_counter() - t0
t0 = time.perf_counter()
ck(cu.cuMemMap(page(40), ctypes.c_size_t(G), ctypes.c_size_t(0), h2,
               ctypes.c_ulonglong(0)), "map again")
res["map an already mapped handle elsewhere"] = time.perf_counter() - t0
t0 = time.perf_counter()
q = cu.cuStreamQuery(stream)
res["cuStreamQuery (%d)" % q] = time.perf_counter() - t0
for k, v in res.items():
    print("while another stream is held for %.1f s: %s took %.3f s (%s)"
          % (HOLD, k, v, "WAITED" if v > HOLD / 2 else "did not wait"))
ck(cu.cuStreamSynchronize(stream), "sync")

# During a global-mode capture on another thread: which of the virtual
# memory calls does the driver refuse (CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED,
# 900, invalidating the capture), in this thread's default (global)
# interaction mode and in the relaxed one?  The pool on virtual memory
# does its page work in the relaxed mode; the simulator lets these calls
# run in either.
cu.cuStreamBeginCapture_v2.argtypes = [ctypes.c_void_p, ctypes.c_int]
cu.cuStreamEndCapture.argtypes = [ctypes.c_void_p,
                                  ctypes.POINTER(ctypes.c_void_p)]
cu.cuThreadExchangeStreamCaptureMode.argtypes = [ctypes.POINTER(ctypes.c_int)]


def vmm_calls(i):
    """Each VMM call on page i (unmapped), its return code."""
    out = {}
    h = ctypes.c_ulonglong()
    out["cuMemCreate"] = cu.cuMemCreate(
        ctypes.byref(h), ctypes.c_size_t(G), ctypes.byref(prop),
        ctypes.c_ulonglong(0))
    if out["cuMemCreate"] != 0:
        return out
    out["cuMemMap"] = cu.cuMemMap(page(i), ctypes.c_size_t(G),
                                  ctypes.c_size_t(0), h,
                                  ctypes.c_ulonglong(0))
    out["cuMemSetAccess"] = cu.cuMemSetAccess(
        page(i), ctypes.c_size_t(G), ctypes.byref(acc), ctypes.c_size_t(1))
    out["cuMemUnmap"] = cu.cuMemUnmap(page(i), ctypes.c_size_t(G))
    out["cuMemRelease"] = cu.cuMemRelease(h)
    return out


def other(relaxed, got):
    ck(cu.cuCtxSetCurrent(ctx), "set current")
    if relaxed:
        m = ctypes.c_int(2)                  # RELAXED
        ck(cu.cuThreadExchangeStreamCaptureMode(ctypes.byref(m)),
           "exchange mode")
    got.update(vmm_calls(50))


for relaxed in (False, True):
    cap = ctypes.c_void_p()
    ck(cu.cuStreamCreate(ctypes.byref(cap), 1), "stream")
    ck(cu.cuStreamBeginCapture_v2(cap, 0), "begin capture (global)")
    got = {}
    t = threading.Thread(target=other, args=(relaxed, got))
    t.start()
    t.join()
    graph = ctypes.c_void_p()
    end = cu.cuStreamEndCapture(cap, ctypes.byref(graph))
    print("another thread's global capture, this thread %s: %s; the "
          "capture's end: %d%s"
          % ("relaxed" if relaxed else "global",
             ", ".join("%s %d" % kv for kv in got.items()), end,
             " (invalidated)" if end == 901 else ""))
    if graph.value:
        cu.cuGraphDestroy(graph)
