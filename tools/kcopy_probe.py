"""Whether a kernel can make a synchronous mid-size copy of page-locked
memory sooner than the copy engine: straight through libcuda (ctypes, no
cudamem), before cudamem builds such a route for its eager copies.

A synchronous copy between page-locked memory and the device
(``cuMemcpyHtoD`` / ``cuMemcpyDtoH``) costs about 8 µs at 64 KiB on an
H100 or H200, where a 1 MiB copy moves at 38 GB/s: the copy engine's
start, not the bus, is most of it.  Inside captures cudamem already
records small copies as a kernel reading or writing the device-mapped
host memory (context/kcopy.c), which a replay runs in a third of a copy
node's time.  This probe times, for each size and direction, calls back
to back (2 ms a sample, benchmarks/harness.py's loop, the columns
alternated over rounds):

- ``engine``: ``cuMemcpyHtoD`` / ``cuMemcpyDtoH`` (synchronous for
  page-locked memory), one call a copy;
- ``kernel/N``: a kernel of 16-byte loads and stores over the host
  buffer's device address (``cuMemHostGetDevicePointer``) launched on
  the legacy default stream with N blocks of 256 threads (``all``: one
  16-byte word a thread, at most 4096 blocks; ``2/SM``: two blocks a
  multiprocessor, each thread striding over the rest), then
  ``cuStreamSynchronize`` of that stream: two calls a copy, so the
  kernel columns carry one ctypes call more than the engine's.

Each column's bytes are checked once before it is timed.  Printed: µs a
copy (median of the rounds) and GB/s, and the best kernel over the
engine.

    python tools/kcopy_probe.py [ROUNDS]

Never run from the test suite; it needs a GPU and its driver.
"""
import ctypes
import os
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, os.pardir, "benchmarks"))

import harness  # noqa: E402

ROUNDS = 5
SIZES = [4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20]
THREADS = 256
CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT = 16
CU_MEMHOSTALLOC_DEVICEMAP = 2

# dst[i] = src[i] for the n 16-byte words, a grid-stride loop:
#   for (i = blockIdx.x * blockDim.x + threadIdx.x; i < n;
#        i += gridDim.x * blockDim.x) dst[i] = src[i];   (uint4)
COPY_PTX = b"""
.version 7.0
.target sm_70
.address_size 64
.visible .entry cm_probe_copy16(.param .u64 dst, .param .u64 src,
                                .param .u64 n)
{
    .reg .pred %p;
    .reg .b32 %r<9>;
    .reg .b64 %rd<10>;
    ld.param.u64 %rd1, [dst];
    ld.param.u64 %rd2, [src];
    ld.param.u64 %rd3, [n];
    mov.u32 %r1, %ctaid.x;
    mov.u32 %r2, %ntid.x;
    mov.u32 %r3, %tid.x;
    mov.u32 %r4, %nctaid.x;
    mul.wide.u32 %rd4, %r1, %r2;
    cvt.u64.u32 %rd5, %r3;
    add.s64 %rd4, %rd4, %rd5;
    mul.wide.u32 %rd6, %r4, %r2;
LOOP:
    setp.ge.u64 %p, %rd4, %rd3;
    @%p bra DONE;
    shl.b64 %rd7, %rd4, 4;
    add.s64 %rd8, %rd2, %rd7;
    ld.global.v4.u32 {%r5, %r6, %r7, %r8}, [%rd8];
    add.s64 %rd9, %rd1, %rd7;
    st.global.v4.u32 [%rd9], {%r5, %r6, %r7, %r8};
    add.s64 %rd4, %rd4, %rd6;
    bra LOOP;
DONE:
    ret;
}
"""

vp, sz, u64 = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint64
pvp = ctypes.POINTER(vp)


def ck(rc, what):
    if rc != 0:
        raise SystemExit("%s failed: %d" % (what, rc))


def setup():
    """libcuda with device 0's primary context current; None without."""
    try:
        cu = ctypes.CDLL("libcuda.so.1")
    except OSError as e:
        print("kcopy_probe: no driver here (%s)" % e)
        return None
    cu.cuMemcpyHtoD_v2.argtypes = [u64, vp, sz]
    cu.cuMemcpyDtoH_v2.argtypes = [vp, u64, sz]
    cu.cuLaunchKernel.argtypes = [vp] + [ctypes.c_uint] * 7 + [vp, pvp, pvp]
    cu.cuStreamSynchronize.argtypes = [vp]
    cu.cuModuleLoadData.argtypes = [pvp, ctypes.c_char_p]
    cu.cuModuleGetFunction.argtypes = [pvp, vp, ctypes.c_char_p]
    cu.cuMemHostAlloc.argtypes = [pvp, sz, ctypes.c_uint]
    cu.cuMemHostGetDevicePointer_v2.argtypes = [ctypes.POINTER(u64), vp,
                                                ctypes.c_uint]
    cu.cuMemAlloc_v2.argtypes = [ctypes.POINTER(u64), sz]
    ck(cu.cuInit(0), "cuInit")
    dev = ctypes.c_int()
    ck(cu.cuDeviceGet(ctypes.byref(dev), 0), "cuDeviceGet")
    ctx = vp()
    ck(cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev), "retain")
    ck(cu.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
    sms = ctypes.c_int()
    ck(cu.cuDeviceGetAttribute(ctypes.byref(sms),
                               CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev),
       "cuDeviceGetAttribute")
    mod, fn = vp(), vp()
    ck(cu.cuModuleLoadData(ctypes.byref(mod), COPY_PTX), "cuModuleLoadData")
    ck(cu.cuModuleGetFunction(ctypes.byref(fn), mod, b"cm_probe_copy16"),
       "cuModuleGetFunction")
    return cu, fn, sms.value


def columns(cu, fn, sms, n, htod):
    """{name: callable making one synchronous copy of n bytes}, and a
    check(name) that the last copy's bytes arrived."""
    host = vp()
    ck(cu.cuMemHostAlloc(ctypes.byref(host), n, CU_MEMHOSTALLOC_DEVICEMAP),
       "cuMemHostAlloc")
    mapped = u64()
    ck(cu.cuMemHostGetDevicePointer_v2(ctypes.byref(mapped), host, 0),
       "cuMemHostGetDevicePointer")
    dev = u64()
    ck(cu.cuMemAlloc_v2(ctypes.byref(dev), n), "cuMemAlloc")
    scratch = ctypes.create_string_buffer(n)
    pattern = bytes(i % 251 for i in range(n))
    words = n // 16
    legacy = vp(1)      # CU_STREAM_LEGACY
    if htod:
        dst, src = dev.value, mapped.value
    else:
        dst, src = mapped.value, dev.value
    args = [u64(dst), u64(src), u64(words)]
    params = (vp * 3)(*[ctypes.addressof(a) for a in args])
    launch, sync = cu.cuLaunchKernel, cu.cuStreamSynchronize
    cols = {}
    if htod:
        cols["engine"] = lambda: cu.cuMemcpyHtoD_v2(dev.value, host, n)
    else:
        cols["engine"] = lambda: cu.cuMemcpyDtoH_v2(host, dev.value, n)
    grids = {"all": max(1, min(4096, -(-words // THREADS))),
             "2/SM": 2 * sms}
    for name, blocks in grids.items():
        def kern(blocks=blocks):
            launch(fn, blocks, 1, 1, THREADS, 1, 1, 0, legacy, params,
                   None)
            return sync(legacy)
        cols["kernel/%s" % name] = kern

    def prepare():
        """The source holds the pattern, the destination zeros."""
        if htod:
            ctypes.memmove(host, pattern, n)
            ck(cu.cuMemcpyHtoD_v2(dev.value, scratch, n), "clear")
        else:
            ck(cu.cuMemcpyHtoD_v2(dev.value, pattern, n), "fill")
            ctypes.memset(host, 0, n)

    def check(name):
        prepare()
        ck(cols[name](), name)
        if htod:
            ck(cu.cuMemcpyDtoH_v2(scratch, dev.value, n), "read back")
            got = scratch.raw
        else:
            got = ctypes.string_at(host, n)
        if got != pattern:
            raise SystemExit("%s %d B: the bytes did not arrive" % (name, n))
    return cols, check


def main():
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else ROUNDS
    env = setup()
    if env is None:
        return
    cu, fn, sms = env
    print("kcopy_probe: %d multiprocessors, %d threads a block, %d rounds"
          % (sms, THREADS, rounds))
    for htod in (True, False):
        for n in SIZES:
            cols, check = columns(cu, fn, sms, n, htod)
            for name in cols:
                check(name)
            times = harness.alternated(
                lambda k, cols=cols: harness.time_callable(
                    cols[k], repeats=11)[0],
                cols, rounds)
            med = {k: statistics.median(v) for k, v in times.items()}
            best = min((k for k in med if k != "engine"), key=med.get)
            print("%-4s %5d KiB  " % ("htod" if htod else "dtoh", n >> 10)
                  + "  ".join("%s %.2f us %.1f GB/s"
                              % (k, t * 1e6, n / t / 1e9)
                              for k, t in med.items())
                  + "  best kernel / engine %.2f" % (med[best]
                                                      / med["engine"]),
                  flush=True)


if __name__ == "__main__":
    main()
