# SPDX-License-Identifier: MIT
"""A CuPy program, run on CuPy's own memory pool or on cudamem's memory
manager, that prints one JSON record of its results.

    python tests/peers/cupy_program.py --allocator cupy
    CUDAMEM_MEMORY_MANAGER=pool python tests/peers/cupy_program.py \\
        --allocator cudamem

``--allocator cudamem`` calls ``cudamem.interop.use_with_cupy()`` before
the first CuPy allocation (cudamem's manager is the one
``CUDAMEM_MEMORY_MANAGER`` names, or its default); ``cupy`` leaves CuPy's
pool in place and does not import cudamem.  The steps, each recorded
(tests/peers/peer_common.py says what ``bitwise`` and ``close`` mean):

- random: a seeded ``cupy.random.RandomState`` (normal, uniform,
  integers, a permutation) -- bitwise;
- elementwise: ufunc chains and a fused kernel -- bitwise;
- reductions: integer sums and counts, max/min/argmax -- bitwise; float
  sums and means (whole and per axis) -- close;
- matmul: float32 and float64 (cuBLAS) -- close;
- fft: complex and real transforms, 1-D and 2-D (cuFFT) -- close;
- sort: sort, argsort, unique -- bitwise;
- fancy indexing: gathers by integer arrays, boolean masks, a scatter to
  unique places, ``cupy.add.at`` of integers -- bitwise;
- streams: 120 rounds on two non-blocking streams with events between
  them, each round's temporaries freed while the other stream may still
  work, results gathered into one array -- bitwise; and a chain of
  arrays handed from one stream to the other through events -- bitwise.

The record's ``memory`` has the peaks: ``peak_device_used`` (the
device's used memory from ``cudaMemGetInfo``, less what was used when
the program started, sampled after every step), and with CuPy's pool
``peak_pool_total`` / ``peak_pool_used`` (sampled), with cudamem
``peak_allocated_bytes`` (``memory_stats()``'s counter) and
``peak_pool_reserved_bytes`` / ``peak_limit_used_bytes`` (sampled).
Exit status 1 when a step raised (the record's ``error`` says where).
"""

import argparse
import gc
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from peer_common import Record  # noqa: E402

N = 1 << 20
SEED = 1234


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--allocator", choices=("cupy", "cudamem"),
                    required=True)
    args = ap.parse_args(argv)
    manager = os.environ.get("CUDAMEM_MEMORY_MANAGER", "default")
    rec = Record("cupy", args.allocator,
                 manager if args.allocator == "cudamem" else "-")
    where = "setup"
    try:
        import cupy

        rec.note("cupy", cupy.__version__)
        free0, total = cupy.cuda.runtime.memGetInfo()
        base = total - free0
        if args.allocator == "cudamem":
            import cudamem
            from cudamem import interop

            interop.use_with_cupy()

            def sample():
                st = cudamem.memory_stats()
                free, total = cupy.cuda.runtime.memGetInfo()
                return {"device_used": total - free - base,
                        "allocated_bytes": st["peak_allocated_bytes"],
                        "pool_reserved_bytes": st["pool_reserved_bytes"],
                        "limit_used_bytes": st["limit_used_bytes"],
                        "cupy_bytes": st["by_client"]["cupy"]}
        else:
            pool = cupy.get_default_memory_pool()

            def sample():
                free, total = cupy.cuda.runtime.memGetInfo()
                return {"device_used": total - free - base,
                        "pool_total": pool.total_bytes(),
                        "pool_used": pool.used_bytes()}
        rec.sampler(sample)
        for name, fn in STEPS:
            where = name
            fn(cupy, rec)
            cupy.cuda.Device().synchronize()
        where = "teardown"
        gc.collect()
        cupy.cuda.Device().synchronize()
        cupy.fft.config.get_plan_cache().clear()
        gc.collect()
        if args.allocator == "cudamem":
            st = cudamem.memory_stats()
            rec.note("manager_in_use", st["manager"])
            rec.note("cupy_bytes_after", st["by_client"]["cupy"])
    except BaseException:  # noqa: BLE001 - the record says what failed
        rec.fail(where)
    return rec.emit()


def asnp(cupy, a):
    return cupy.asnumpy(a)


def step_random(cupy, rec):
    rs = cupy.random.RandomState(SEED)
    x = rs.standard_normal(N, dtype=cupy.float32)
    rec.step("random.normal", asnp(cupy, x))
    rec.step("random.uniform", asnp(cupy, rs.uniform(-1, 1, N // 4)))
    rec.step("random.randint",
             asnp(cupy, rs.randint(0, 1000, size=N, dtype=cupy.int64)))
    rec.step("random.permutation", asnp(cupy, rs.permutation(N // 16)))


def _inputs(cupy):
    """The same inputs for every step after random (a fresh seeded
    generator, so each step is independent of the others)."""
    rs = cupy.random.RandomState(SEED + 1)
    x = rs.standard_normal(N, dtype=cupy.float32)
    ints = rs.randint(0, 1000, size=N, dtype=cupy.int64)
    return rs, x, ints


def step_elementwise(cupy, rec):
    _, x, ints = _inputs(cupy)
    y = cupy.sin(x) * 2 + cupy.exp(-x * x) - cupy.sqrt(cupy.abs(x))
    rec.step("elementwise.ufuncs", asnp(cupy, y))
    z = cupy.where(x > 0, x * 3, -x) + (ints % 7).astype(cupy.float32)
    rec.step("elementwise.where", asnp(cupy, z))

    @cupy.fuse()
    def fused(a, b):
        return a * a + 2 * b - 1

    rec.step("elementwise.fused", asnp(cupy, fused(x, y)))
    rec.step("elementwise.ints", asnp(cupy, (ints * 31 + 7) ^ (ints >> 2)))


def step_reductions(cupy, rec):
    _, x, ints = _inputs(cupy)
    m = x.reshape(1024, -1)
    rec.step("reduce.int_sum", asnp(cupy, ints.sum()))
    rec.step("reduce.int_sum_axis",
             asnp(cupy, ints.reshape(1024, -1).sum(axis=1)))
    rec.step("reduce.count", asnp(cupy, cupy.count_nonzero(x > 0.5)))
    rec.step("reduce.max", asnp(cupy, x.max()))
    rec.step("reduce.min_axis", asnp(cupy, m.min(axis=0)))
    rec.step("reduce.argmax", asnp(cupy, m.argmax(axis=1)))
    rec.step("reduce.float_sum", asnp(cupy, x.sum()), "close")
    rec.step("reduce.mean_axis0", asnp(cupy, m.mean(axis=0)), "close")
    rec.step("reduce.std_axis1", asnp(cupy, m.std(axis=1)), "close")
    rec.step("reduce.f64_sum", asnp(cupy, x.astype(cupy.float64).sum()),
             "close")


def step_matmul(cupy, rec):
    rs, _, _ = _inputs(cupy)
    a = rs.standard_normal((512, 384), dtype=cupy.float32)
    b = rs.standard_normal((384, 256), dtype=cupy.float32)
    rec.step("matmul.f32", asnp(cupy, a @ b), "close")
    a64, b64 = a.astype(cupy.float64), b.astype(cupy.float64)
    rec.step("matmul.f64", asnp(cupy, cupy.matmul(a64, b64)), "close")
    batch = rs.standard_normal((8, 64, 64), dtype=cupy.float32)
    rec.step("matmul.batched", asnp(cupy, batch @ batch), "close")


def step_fft(cupy, rec):
    _, x, _ = _inputs(cupy)
    c = (x[: N // 2] + 1j * x[N // 2:]).astype(cupy.complex64)
    rec.step("fft.c2c", asnp(cupy, cupy.fft.fft(c)), "close")
    rec.step("fft.r2c", asnp(cupy, cupy.fft.rfft(x)), "close")
    rec.step("fft.2d", asnp(cupy, cupy.fft.fft2(c.reshape(512, -1))),
             "close")
    back = cupy.fft.ifft(cupy.fft.fft(c))
    rec.step("fft.roundtrip", asnp(cupy, back), "close")


def step_sort(cupy, rec):
    _, x, ints = _inputs(cupy)
    rec.step("sort.float", asnp(cupy, cupy.sort(x)))
    rec.step("sort.argsort", asnp(cupy, cupy.argsort(x)))
    rec.step("sort.int", asnp(cupy, cupy.sort(ints)))
    rec.step("sort.unique", asnp(cupy, cupy.unique(ints)))
    rec.step("sort.axis", asnp(cupy, cupy.sort(x.reshape(256, -1), axis=1)))


def step_indexing(cupy, rec):
    rs, x, ints = _inputs(cupy)
    idx = rs.randint(0, N, size=N // 4)
    rec.step("index.gather", asnp(cupy, x[idx]))
    rec.step("index.mask", asnp(cupy, x[x > 1.0]))
    m = x.reshape(1024, -1)
    rows = rs.randint(0, 1024, size=100)
    rec.step("index.rows", asnp(cupy, m[rows, 5:900:3]))
    y = x.copy()
    perm = rs.permutation(N)[: N // 8]
    y[perm] = cupy.arange(perm.size, dtype=cupy.float32)
    rec.step("index.scatter_unique", asnp(cupy, y))
    hist = cupy.zeros(1000, dtype=cupy.int64)
    cupy.add.at(hist, ints, 1)
    rec.step("index.add_at", asnp(cupy, hist))
    rec.step("index.take", asnp(cupy, cupy.take(ints, idx[:1000])))


def step_streams(cupy, rec):
    """Two non-blocking streams: each round allocates its temporaries on
    one stream, drops them at once (while that stream may still work),
    and the next round, on the other stream, allocates again."""
    streams = [cupy.cuda.Stream(non_blocking=True) for _ in range(2)]
    rounds = 120
    out = cupy.zeros(rounds, dtype=cupy.int64)
    cupy.cuda.Device().synchronize()
    done = []
    for i in range(rounds):
        s = streams[i % 2]
        with s:
            size = (1 << 18) + (i % 5) * 4099
            t = cupy.arange(size, dtype=cupy.int64) * (i + 1)
            for _ in range(4):                # longer work on the stream
                t = (t * 3 + i) % 1000003
            out[i] = t.sum()
            del t
            done.append(s.record())
    for e in done:
        e.synchronize()
    rec.step("streams.rounds", asnp(cupy, out))

    # A chain: made on stream 0, used on stream 1 after an event, its
    # result used back on stream 0 after another.
    s0, s1 = streams
    acc = None
    for i in range(20):
        with s0:
            a = cupy.arange(1 << 16, dtype=cupy.int64) + i
            if acc is not None:
                a += acc
            e0 = s0.record()
        s1.wait_event(e0)
        with s1:
            b = a * 2 - 1
            acc = b % 65521
            e1 = s1.record()
        s0.wait_event(e1)
        del a, b
    with s0:
        result = acc.copy()
    s0.synchronize()
    s1.synchronize()
    rec.step("streams.chain", asnp(cupy, result))


STEPS = [("random", step_random), ("elementwise", step_elementwise),
         ("reductions", step_reductions), ("matmul", step_matmul),
         ("fft", step_fft), ("sort", step_sort),
         ("indexing", step_indexing), ("streams", step_streams)]


if __name__ == "__main__":
    sys.exit(main())
