"""What a graph of small copies costs per copy on this machine, built in
several ways, straight through libcuda (ctypes, no cudamem): which way
of recording 1 KiB pinned round trips replays fastest.  The graph
benchmark (benchmarks/ops_graphs.py) found the driver's own graph of
cuMemcpyHtoDAsync / cuMemcpyDtoHAsync nodes slower per copy than CuPy's
graph of cudaMemcpyAsync nodes; each variant here changes one thing:

- ``htod``: cuMemcpyHtoDAsync / cuMemcpyDtoHAsync (what cudamem records);
- ``unified``: cuMemcpyAsync, the addresses' kinds left to the driver;
- ``host-flags=N``: the host buffers from cuMemHostAlloc with flags N
  (0; 1 portable; 2 device-mapped; 3 both), ``registered``: a page-aligned
  malloc'd buffer pinned with cuMemHostRegister;
- ``upload``: the graph uploaded to the stream (cuGraphUpload) before
  its first launch;
- ``runtime``: cudaMemcpyAsync through libcudart (when it loads), as CuPy
  records them;
- ``blocking-stream``: the capture on a stream made with flags 0 rather
  than non-blocking;
- ``kernel``: no copy node at all: a kernel of one block (256 threads, 4
  bytes each, from PTX the driver compiles) reads the device-mapped
  pinned source and writes the device buffer, and another reads it back
  into the mapped destination (kernel nodes, for whether a graph of
  small copies made as kernels replays faster than copy nodes);
- ``kernel-one``: the whole 100 round trips in one kernel node (one
  block: each trip reads the mapped source into the device buffer,
  waits for the block, writes it back to the mapped destination, fences
  it for the host, waits again): the floor of any graph of these copies,
  one node's launch and the bus's own latency per copy.

Each variant runs twice, in turn.  Each row: median µs per copy of
``REPLAYS`` timed replays (cuGraphLaunch then cuStreamSynchronize; 200
copies a replay), and eager copies of the same (the ctypes calls' own
cost included) for scale.  A variant the driver refuses prints why and
the rest go on.

    python tools/graph_probe.py [REPLAYS]
"""
import ctypes
import ctypes.util
import glob
import os
import statistics
import sys
import time

REPLAYS = int(sys.argv[1]) if len(sys.argv) > 1 else 31
NBYTES = 1024
TRIPS = 100

cu = ctypes.CDLL("libcuda.so.1")
vp, sz, u64 = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint64
pvp = ctypes.POINTER(vp)
cu.cuMemcpyHtoDAsync_v2.argtypes = [u64, vp, sz, vp]
cu.cuMemcpyDtoHAsync_v2.argtypes = [vp, u64, sz, vp]
cu.cuMemcpyAsync.argtypes = [u64, u64, sz, vp]
cu.cuStreamBeginCapture_v2.argtypes = [vp, ctypes.c_int]
cu.cuStreamEndCapture.argtypes = [vp, pvp]
cu.cuGraphInstantiateWithFlags.argtypes = [pvp, vp, ctypes.c_ulonglong]
cu.cuGraphLaunch.argtypes = [vp, vp]
cu.cuGraphUpload.argtypes = [vp, vp]
cu.cuStreamSynchronize.argtypes = [vp]
cu.cuStreamCreate.argtypes = [pvp, ctypes.c_uint]
cu.cuMemHostAlloc.argtypes = [pvp, sz, ctypes.c_uint]
cu.cuMemHostRegister_v2.argtypes = [vp, sz, ctypes.c_uint]
cu.cuMemAlloc_v2.argtypes = [ctypes.POINTER(u64), sz]
cu.cuMemHostGetDevicePointer_v2.argtypes = [ctypes.POINTER(u64), vp,
                                            ctypes.c_uint]
cu.cuModuleLoadData.argtypes = [pvp, ctypes.c_char_p]
cu.cuModuleGetFunction.argtypes = [pvp, vp, ctypes.c_char_p]
cu.cuLaunchKernel.argtypes = [vp] + [ctypes.c_uint] * 7 + [vp, pvp, pvp]

# A copy of n 4-byte words, one thread a word (one block): generic loads
# and stores, so a device-mapped host address works on either side.
COPY_PTX = b"""
.version 7.0
.target sm_70
.address_size 64
.visible .entry cm_probe_copy4(.param .u64 dst, .param .u64 src,
                               .param .u32 n)
{
    .reg .pred %p;
    .reg .b32 %r<4>;
    .reg .b64 %rd<6>;
    ld.param.u64 %rd1, [dst];
    ld.param.u64 %rd2, [src];
    ld.param.u32 %r1, [n];
    mov.u32 %r2, %tid.x;
    setp.ge.u32 %p, %r2, %r1;
    @%p bra DONE;
    mul.wide.u32 %rd3, %r2, 4;
    add.s64 %rd4, %rd2, %rd3;
    ld.volatile.u32 %r3, [%rd4];
    add.s64 %rd5, %rd1, %rd3;
    st.volatile.u32 [%rd5], %r3;
DONE:
    ret;
}

// trips round trips of n words in one block: src -> dst (device),
// then dst -> out, each step after the whole block's previous one.
.visible .entry cm_probe_trips(.param .u64 dst, .param .u64 src,
                               .param .u64 out, .param .u32 n,
                               .param .u32 trips)
{
    .reg .pred %p<3>;
    .reg .b32 %r<6>;
    .reg .b64 %rd<8>;
    ld.param.u64 %rd1, [dst];
    ld.param.u64 %rd2, [src];
    ld.param.u64 %rd3, [out];
    ld.param.u32 %r1, [n];
    ld.param.u32 %r2, [trips];
    mov.u32 %r3, %tid.x;
    setp.lt.u32 %p1, %r3, %r1;
    mul.wide.u32 %rd4, %r3, 4;
    add.s64 %rd5, %rd2, %rd4;
    add.s64 %rd6, %rd1, %rd4;
    add.s64 %rd7, %rd3, %rd4;
    mov.u32 %r4, 0;
LOOP:
    setp.ge.u32 %p2, %r4, %r2;
    @%p2 bra END;
    @%p1 ld.volatile.u32 %r5, [%rd5];
    @%p1 st.volatile.u32 [%rd6], %r5;
    bar.sync 0;
    @%p1 ld.volatile.u32 %r5, [%rd6];
    @%p1 st.volatile.u32 [%rd7], %r5;
    membar.sys;
    bar.sync 0;
    add.u32 %r4, %r4, 1;
    bra LOOP;
END:
    ret;
}
"""


def ck(rc, what):
    if rc != 0:
        raise SystemExit("%s failed: %d" % (what, rc))


ck(cu.cuInit(0), "cuInit")
dev = ctypes.c_int()
ck(cu.cuDeviceGet(ctypes.byref(dev), 0), "cuDeviceGet")
ctx = vp()
ck(cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev), "retain")
ck(cu.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")

rt = None
wheels = [f for d in sys.path if os.path.isdir(d)
          for f in sorted(glob.glob(os.path.join(
              d, "nvidia", "cu*", "lib", "libcudart.so*")))
          + sorted(glob.glob(os.path.join(
              d, "nvidia", "cuda_runtime", "lib", "libcudart.so*")))]
for name in ["libcudart.so", "libcudart.so.13", "libcudart.so.12",
             ctypes.util.find_library("cudart")] + wheels:
    if not name:
        continue
    try:
        rt = ctypes.CDLL(name)
        break
    except OSError:
        continue
if rt is not None:
    print("runtime: %s" % rt._name)
    rt.cudaMemcpyAsync.argtypes = [vp, vp, sz, ctypes.c_int, vp]


def host_buffers(flags):
    """Two pinned host buffers: (src, dst) addresses; src holds a pattern."""
    out = []
    for _ in range(2):
        if flags == "registered":
            raw = ctypes.create_string_buffer(NBYTES + 4096)
            addr = (ctypes.addressof(raw) + 4095) // 4096 * 4096
            ck(cu.cuMemHostRegister_v2(addr, NBYTES, 0), "cuMemHostRegister")
            out.append((addr, raw))
        else:
            p = vp()
            ck(cu.cuMemHostAlloc(ctypes.byref(p), NBYTES, flags),
               "cuMemHostAlloc")
            out.append((p.value, None))
    pattern = bytes(i % 251 for i in range(NBYTES))
    ctypes.memmove(out[0][0], pattern, NBYTES)
    ctypes.memset(out[1][0], 0, NBYTES)
    return out, pattern


KERNELS = {}


def kernel(name=b"cm_probe_copy4"):
    """A CUfunction of COPY_PTX, the module loaded on first use."""
    if "module" not in KERNELS:
        mod = vp()
        ck(cu.cuModuleLoadData(ctypes.byref(mod), COPY_PTX),
           "cuModuleLoadData")
        KERNELS["module"] = mod
    if name not in KERNELS:
        fn = vp()
        ck(cu.cuModuleGetFunction(ctypes.byref(fn), KERNELS["module"], name),
           "cuModuleGetFunction")
        KERNELS[name] = fn
    return KERNELS[name]


def launch_copy(dst, src, s):
    a = [u64(dst), u64(src), ctypes.c_uint(NBYTES // 4)]
    params = (vp * 3)(*[ctypes.addressof(x) for x in a])
    ck(cu.cuLaunchKernel(kernel(), 1, 1, 1, NBYTES // 4, 1, 1, 0, s,
                         params, None), "cuLaunchKernel")


def launch_trips(d, h, o, s):
    a = [u64(d), u64(h), u64(o), ctypes.c_uint(NBYTES // 4),
         ctypes.c_uint(TRIPS)]
    params = (vp * 5)(*[ctypes.addressof(x) for x in a])
    ck(cu.cuLaunchKernel(kernel(b"cm_probe_trips"), 1, 1, 1, NBYTES // 4,
                         1, 1, 0, s, params, None), "cuLaunchKernel")


def device_pointer(host):
    p = u64()
    ck(cu.cuMemHostGetDevicePointer_v2(ctypes.byref(p), host, 0),
       "cuMemHostGetDevicePointer")
    return p.value


def stream(flags):
    s = vp()
    ck(cu.cuStreamCreate(ctypes.byref(s), flags), "cuStreamCreate")
    return s


def record(kind, s, h, o, d):
    if kind == "kernel-one":
        launch_trips(d, h, o, s)
        return
    for _ in range(TRIPS):
        if kind == "unified":
            ck(cu.cuMemcpyAsync(d, h, NBYTES, s), "cuMemcpyAsync")
            ck(cu.cuMemcpyAsync(o, d, NBYTES, s), "cuMemcpyAsync")
        elif kind == "kernel":
            launch_copy(d, h, s)
            launch_copy(o, d, s)
        elif kind == "runtime":
            ck(rt.cudaMemcpyAsync(d, h, NBYTES, 1, s), "cudaMemcpyAsync")
            ck(rt.cudaMemcpyAsync(o, d, NBYTES, 2, s), "cudaMemcpyAsync")
        else:
            ck(cu.cuMemcpyHtoDAsync_v2(d, h, NBYTES, s), "HtoDAsync")
            ck(cu.cuMemcpyDtoHAsync_v2(o, d, NBYTES, s), "DtoHAsync")


def probe(name, kind="htod", hflags=0, sflags=1, upload=False):
    bufs, pattern = host_buffers(hflags)
    h, o = bufs[0][0], bufs[1][0]
    d = u64()
    ck(cu.cuMemAlloc_v2(ctypes.byref(d), NBYTES), "cuMemAlloc")
    d = d.value
    s = stream(sflags)
    # What the copies name: a kernel reads and writes the host buffers
    # through their device addresses.
    hs, os_ = ((device_pointer(h), device_pointer(o))
               if kind.startswith("kernel") else (h, o))
    ck(cu.cuStreamBeginCapture_v2(s, 0), "cuStreamBeginCapture")
    try:
        record(kind, s, hs, os_, d)
    finally:
        g = vp()
        ck(cu.cuStreamEndCapture(s, ctypes.byref(g)), "cuStreamEndCapture")
    x = vp()
    ck(cu.cuGraphInstantiateWithFlags(ctypes.byref(x), g, 0),
       "cuGraphInstantiateWithFlags")
    if upload:
        ck(cu.cuGraphUpload(x, s), "cuGraphUpload")
    launch, sync = cu.cuGraphLaunch, cu.cuStreamSynchronize
    launch(x, s)
    sync(s)
    if ctypes.string_at(o, NBYTES) != pattern:
        raise SystemExit("%s: the bytes did not come back" % name)
    times = []
    for _ in range(REPLAYS):
        t = time.perf_counter()
        launch(x, s)
        sync(s)
        times.append(time.perf_counter() - t)
    graph = statistics.median(times) / (2 * TRIPS) * 1e6
    times = []
    for _ in range(REPLAYS):
        t = time.perf_counter()
        record(kind, s, hs, os_, d)
        sync(s)
        times.append(time.perf_counter() - t)
    eager = statistics.median(times) / (2 * TRIPS) * 1e6
    print("%-22s graph %6.2f us/copy   eager (ctypes) %6.2f us/copy"
          % (name, graph, eager), flush=True)


VARIANTS = [("htod", {}), ("unified", {"kind": "unified"})]
VARIANTS += [("host-flags=%d" % f, {"hflags": f}) for f in (1, 2, 3)]
VARIANTS += [("registered", {"hflags": "registered"}),
             ("upload", {"upload": True}),
             ("blocking-stream", {"sflags": 0}),
             ("kernel", {"kind": "kernel", "hflags": 2}),
             ("kernel-one", {"kind": "kernel-one", "hflags": 2})]
if rt is not None:
    VARIANTS.append(("runtime", {"kind": "runtime"}))
else:
    print("runtime               (no libcudart)")
# Twice over, so that the rows' spread on this machine shows beside
# their differences.
for rnd in (1, 2):
    for name, kw in VARIANTS:
        try:
            probe("%s [%d]" % (name, rnd), **kw)
        except SystemExit as e:
            print("%-22s %s" % ("%s [%d]" % (name, rnd), e), flush=True)
