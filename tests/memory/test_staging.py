# SPDX-License-Identifier: MIT
"""The staged transfer pipeline (csrc/memory/staging/staging.c): large
pageable copies between host and device go through page-locked chunk
buffers filled and drained by worker threads.  Tiny thresholds and
chunks make it run on small arrays here; every boundary, layout, dtype,
the asynchronous forms, concurrent callers, injected failures and the
switch-off are checked."""

import os
import threading

import numpy as np
import pytest

import cudamem as cuda
from cudamem import _core
from helpers import run_py
from helpers.isolation import SIMULATOR

from helpers.arrays import DTYPES, sample

CHUNK = 4096
CUDA_ERROR_LAUNCH_FAILED = 719


@pytest.fixture
def staging(ctx):
    """A pipeline that stages from 1 byte on, in 4 KiB chunks split into
    64-byte shares; the old tunables come back afterwards, and no
    staging buffer is left in use."""
    old = _core._staging_config()
    _core._staging_config(enabled=True, threshold=1, chunk=CHUNK,
                          buffers=3, part=64)
    yield _core
    cuda.synchronize()
    _core._staging_config(**old)
    st = _core._staging_stats()
    assert st["in_use"] == 0 and st["inflight"] == 0, st
    _core._staging_trim()


def staged():
    return _core._staging_stats()["staged"]


def in_threads(work, n):
    """work(i) in n threads at once, i = 0 .. n - 1; back when all end."""
    ts = [threading.Thread(target=work, args=(i,)) for i in range(n)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()


def check_roundtrip(h):
    """h to the device and back, through the pipeline both ways."""
    n = staged()
    d = cuda.to_device(h)
    out = d.copy_to_host()
    np.testing.assert_array_equal(out, h)
    assert out.tobytes() == np.ascontiguousarray(h).tobytes() or \
        h.dtype.kind == "f"
    return staged() - n


# -- boundaries -----------------------------------------------------------


SIZES = sorted({0, 1, 2, 63, 64, 65, CHUNK - 1, CHUNK, CHUNK + 1,
                2 * CHUNK - 1, 2 * CHUNK, 2 * CHUNK + 1, 3 * CHUNK - 1,
                3 * CHUNK, 3 * CHUNK + 1, 4 * CHUNK + 1, 7 * CHUNK + 5,
                20 * CHUNK + 3})


@pytest.mark.parametrize("n", SIZES)
def test_sizes_around_chunks(staging, n):
    h = (np.arange(n, dtype=np.uint64) * 2654435761 % 251).astype(np.uint8)
    used = check_roundtrip(h)
    assert used == (2 if n > 0 else 0)


@pytest.mark.parametrize("delta", [-1, 0, 1])
def test_threshold_boundary(staging, delta):
    t = 3 * CHUNK + 17
    _core._staging_config(threshold=t)
    h = np.arange(t + delta, dtype=np.uint64).astype(np.uint8)
    used = check_roundtrip(h)
    assert used == (0 if delta < 0 else 2)


@pytest.mark.parametrize("dtype", DTYPES)
def test_all_dtypes(staging, dtype):
    h = sample((37, 129), dtype)
    assert check_roundtrip(h) == 2


def test_odd_itemsize_records(staging):
    # 3-byte and 24-byte items: chunks hold whole elements
    for dt in (np.dtype("S3"), np.dtype([("a", "f8"), ("b", "i4", 4)])):
        h = sample((5000,), dt)
        assert check_roundtrip(h) == 2


def test_item_larger_than_chunk_goes_direct(staging):
    h = sample((10,), np.dtype("S5000"))
    n = staged()
    d = cuda.to_device(h)
    assert staged() == n
    np.testing.assert_array_equal(d.copy_to_host(), h)


# -- layouts --------------------------------------------------------------


BASE = sample((40, 30, 20), np.float64)
LAYOUTS = {
    "C": BASE,
    "F": np.asfortranarray(BASE),
    "step": BASE[::2, :, ::3],
    "neg": BASE[::-1, :, ::-2],
    "perm": BASE.transpose(2, 0, 1),
    "F-step": np.asfortranarray(BASE)[:, 1::2, :],
    "row": BASE[3, :, 5],
}


@pytest.mark.parametrize("name", sorted(LAYOUTS))
def test_strided_sources(staging, name):
    h = LAYOUTS[name]
    n = staged()
    d = cuda.to_device(h)
    assert staged() == n + 1
    np.testing.assert_array_equal(d.copy_to_host(), h)


DEST = {
    "C": lambda b: b[:40, :30, :20],
    "F": lambda b: b.T[:20, :30, :40].T,
    "step": lambda b: b[:40:2, :30, :20:3],
    "neg": lambda b: b[79::-2, :30, :20][:, :, ::-2],
    "perm": lambda b: b[:20, :40, :30],
    "F-step": lambda b: b.T[:20, 1:31:2, :40].T,
    "row": lambda b: b[3, :30, 5],
}


@pytest.mark.parametrize("name", sorted(LAYOUTS))
def test_strided_destinations(staging, name):
    src = LAYOUTS[name]
    d = cuda.to_device(np.ascontiguousarray(src))
    big = np.full((80, 60, 40), -1.0)
    dst = DEST[name](big)
    assert dst.shape == src.shape
    expected = big.copy()
    DEST[name](expected)[...] = src
    n = staged()
    d.copy_to_host(dst)
    assert staged() == n + 1
    # the view holds the data and nothing outside it was written
    np.testing.assert_array_equal(big, expected)


def test_copy_to_device_strided_into_contiguous(staging):
    h = np.asfortranarray(BASE)[::3, ::-1, 1::2]
    d = cuda.device_array(h.shape, h.dtype)
    n = staged()
    d.copy_to_device(h)
    assert staged() == n + 1
    np.testing.assert_array_equal(d.copy_to_host(), h)


def test_broadcast_source(staging):
    h = np.broadcast_to(np.arange(50.0), (400, 50))
    d = cuda.device_array(h.shape, h.dtype)
    d.copy_to_device(h)
    np.testing.assert_array_equal(d.copy_to_host(), h)


def test_strided_device_side_goes_direct(staging):
    d = cuda.to_device(BASE)
    n = staged()
    out = np.empty_like(BASE[:, ::2])
    d[:, ::2].copy_to_host(out)
    assert staged() == n
    np.testing.assert_array_equal(out, BASE[:, ::2])


# -- the direct path ------------------------------------------------------


def test_disabled_falls_back(staging):
    _core._staging_config(enabled=False)
    assert check_roundtrip(BASE) == 0


def test_disabled_from_the_environment():
    rc, out = run_py("""
        import numpy as np, cudamem
        from cudamem import _core
        print(_core._staging_config()["enabled"])
        _core._staging_config(threshold=1)
        d = cudamem.to_device(np.arange(100000.0))
        assert (d.copy_to_host() == np.arange(100000.0)).all()
        print("staged", _core._staging_stats()["staged"])
        """, CUDAMEM_STAGING="0")
    assert rc == 0, out
    assert "False" in out and "staged 0" in out


def test_tunables_from_the_environment():
    rc, out = run_py("""
        from cudamem import _core
        print(sorted(_core._staging_config().items()))
        """, CUDAMEM_STAGING="1", CUDAMEM_STAGING_THREADS="3",
        CUDAMEM_STAGING_CHUNK="2M", CUDAMEM_STAGING_THRESHOLD="65536",
        CUDAMEM_STAGING_BUFFERS="4", CUDAMEM_STAGING_RAMP="2",
        CUDAMEM_STAGING_NT="1", CUDAMEM_STAGING_SPIN="25",
        CUDAMEM_STAGING_HUGE="1")
    assert rc == 0, out
    assert ("('buffers', 4), ('chunk', 2097152), ('enabled', True), "
            "('huge', True), ('nt', True), ('part', 262144), ('ramp', 2), "
            "('spin', 25), ('threads', 3), ('threshold', 65536)") in out


def test_default_tunables():
    """On by default (the H200 confirmed the pipeline); 0 turns it off."""
    rc, out = run_py("""
        import os
        from cudamem import _core
        c = _core._staging_config()
        n = os.cpu_count()
        print(c["enabled"], c["chunk"], c["buffers"], c["threshold"],
              c["threads"] == min(8, n), c["ramp"], c["nt"], c["huge"],
              c["spin"] == (50 if n >= 2 * c["threads"] else 0))
        """, CUDAMEM_STAGING="", CUDAMEM_STAGING_THREADS="",
        CUDAMEM_STAGING_CHUNK="", CUDAMEM_STAGING_THRESHOLD="",
        CUDAMEM_STAGING_BUFFERS="", CUDAMEM_STAGING_RAMP="",
        CUDAMEM_STAGING_NT="", CUDAMEM_STAGING_SPIN="",
        CUDAMEM_STAGING_HUGE="")
    assert rc == 0, out
    assert "True 8388608 3 4194304 True 0 False True True" in out
    for off in ("0", "false", "off"):
        rc, out = run_py("""
            from cudamem import _core
            print("enabled:", _core._staging_config()["enabled"])
            """, CUDAMEM_STAGING=off)
        assert rc == 0 and "enabled: False" in out, (off, out)
    rc, out = run_py("""
        from cudamem import _core
        print("spin:", _core._staging_config()["spin"])
        """, CUDAMEM_STAGING_THREADS="1", CUDAMEM_STAGING_SPIN="")
    assert rc == 0, out
    assert ("spin: 50" if (os.cpu_count() or 1) >= 2 else "spin: 0") in out


@pytest.mark.parametrize("kind", ["pinned", "mapped", "registered"])
def test_page_locked_memory_goes_direct(staging, kind):
    if kind == "pinned":
        h = cuda.pinned_array(BASE.shape, BASE.dtype)
        h[...] = BASE
    elif kind == "mapped":
        h = cuda.mapped_array(BASE.shape, BASE.dtype)
        h[...] = BASE
    else:
        h = BASE.copy()
    n = staged()
    if kind == "registered":
        with cuda.pinned(h):
            d = cuda.to_device(h)
            out = np.zeros_like(h)
            with cuda.pinned(out):
                d.copy_to_host(out)
    else:
        d = cuda.to_device(h)
        out = cuda.pinned_array(BASE.shape, BASE.dtype)
        d.copy_to_host(out)
    assert staged() == n
    np.testing.assert_array_equal(out, BASE)


@pytest.mark.sim
@pytest.mark.parametrize("kind", ["pinned", "mapped"])
@pytest.mark.parametrize("on_stream", [False, True])
def test_own_page_locked_memory_is_not_offered(staging, kind, on_stream):
    """copy_to_device / copy_to_host between a device array and cudamem's
    own page-locked memory go direct without the pipeline's check (a
    pointer query that would say page-locked): with that query made to
    fail, a copy the pipeline saw would be staged."""
    make = cuda.pinned_array if kind == "pinned" else cuda.mapped_array
    h = make(BASE.shape, BASE.dtype)
    h[...] = BASE
    out = make(BASE.shape, BASE.dtype)
    d = cuda.device_array(BASE.shape, BASE.dtype)
    s = cuda.stream() if on_stream else 0
    n = staged()
    _core._sim_inject("PointerGetAttribute", 1, 999)   # CUDA_ERROR_UNKNOWN
    try:
        d.copy_to_device(h, stream=s)
        d.copy_to_host(out, stream=s)
    finally:
        _core._sim_inject("PointerGetAttribute", 0, 0)
    cuda.synchronize()
    assert staged() == n
    np.testing.assert_array_equal(out, BASE)


# -- asynchronous copies --------------------------------------------------


def test_async_roundtrip(staging):
    s = cuda.stream()
    h = sample((300, 41), np.float32)
    d = cuda.to_device(h, stream=s)
    out = d.copy_to_host(stream=s)
    s.synchronize()
    np.testing.assert_array_equal(out, h)
    into = np.zeros_like(h.T).T
    d.copy_to_host(into, stream=s)
    d2 = cuda.device_array_like(h)
    d2.copy_to_device(h[::-1], stream=s)
    s.synchronize()
    np.testing.assert_array_equal(into, h)
    np.testing.assert_array_equal(d2.copy_to_host(), h[::-1])


def test_async_ordering_on_one_stream(staging):
    s = cuda.stream()
    d = cuda.device_array(50000, np.int64)
    outs = []
    for i in range(6):
        d.copy_to_device(np.full(50000, i, np.int64), stream=s)
        outs.append(d.copy_to_host(stream=s))
    s.synchronize()
    for i, o in enumerate(outs):
        assert (o == i).all(), i


def test_async_keeps_temporary_source_alive(staging):
    s = cuda.stream()
    d = cuda.device_array(20000, np.float64)
    d.copy_to_device([float(i) for i in range(20000)], stream=s)
    s.synchronize()
    np.testing.assert_array_equal(d.copy_to_host(), np.arange(20000.0))


# -- concurrency ----------------------------------------------------------


@pytest.mark.parametrize("use_stream", [False, True])
def test_eight_threads(staging, use_stream):
    errors = []
    barrier = threading.Barrier(8)

    def work(i):
        try:
            s = cuda.stream() if use_stream else 0
            rng = np.random.default_rng(i)
            barrier.wait()
            for k in range(4):
                h = rng.integers(0, 1 << 30, size=(97 + i, 50 + k))
                h = h if k % 2 == 0 else np.asfortranarray(h)[:, ::-1]
                d = cuda.to_device(h, stream=s)
                out = d.copy_to_host(stream=s)
                if use_stream:
                    s.synchronize()
                if not np.array_equal(out, h):
                    errors.append((i, k))
        except Exception as e:  # reported below
            errors.append((i, repr(e)))

    in_threads(work, 8)
    assert errors == []


# -- failures -------------------------------------------------------------


FAULTS = [("MemcpyHtoDAsync", 1), ("MemcpyHtoDAsync", 3),
          ("MemcpyDtoHAsync", 2), ("MemcpyDtoHAsync", 5),
          ("EventRecord", 1), ("EventRecord", 4),
          ("EventSynchronize", 2), ("MemHostAlloc", 2),
          ("EventCreate", 1)]


@pytest.mark.sim  # fault injection
@pytest.mark.parametrize("name,nth", FAULTS)
def test_sync_fault_raises_once_and_leaks_nothing(staging, name, nth):
    if name == "MemHostAlloc":
        staging._staging_config(huge=False)  # buffers from cuMemHostAlloc
    h = sample((20 * CHUNK // 8,), np.float64)
    d = cuda.to_device(h)
    _core._staging_trim()
    before = cuda.memory_stats()
    _core._sim_inject(name, nth, CUDA_ERROR_LAUNCH_FAILED)
    try:
        with pytest.raises(cuda.CudaAPIError,
                           match="CUDA_ERROR_LAUNCH_FAILED"):
            if "DtoH" in name:
                d.copy_to_host()
            elif name == "MemcpyHtoDAsync":
                d.copy_to_device(h)
            else:
                d.copy_to_device(h)
                d.copy_to_host()
    finally:
        _core._sim_inject(name, 0, 0)
    st = _core._staging_stats()
    assert st["in_use"] == 0 and st["inflight"] == 0, st
    # it raised once: the pipeline works again at once
    np.testing.assert_array_equal(d.copy_to_host(), h)
    _core._staging_trim()
    assert _core._staging_stats()["buffers"] == 0
    after = cuda.memory_stats()
    assert after["pinned_bytes"] == before["pinned_bytes"]


@pytest.mark.sim  # fault injection
@pytest.mark.parametrize("name,nth", [("MemcpyHtoDAsync", 2),
                                      ("EventRecord", 2),
                                      ("MemcpyDtoHAsync", 3)])
def test_async_fault_raises_at_call_once(staging, name, nth):
    s = cuda.stream()
    h = sample((20 * CHUNK // 8,), np.float64)
    d = cuda.to_device(h)
    _core._sim_inject(name, nth, CUDA_ERROR_LAUNCH_FAILED)
    try:
        with pytest.raises(cuda.CudaAPIError,
                           match="CUDA_ERROR_LAUNCH_FAILED"):
            if "DtoH" in name:
                d.copy_to_host(stream=s)
            else:
                d.copy_to_device(h, stream=s)
    finally:
        _core._sim_inject(name, 0, 0)
    s.synchronize()
    st = _core._staging_stats()
    assert st["in_use"] == 0 and st["inflight"] == 0, st
    # raised once: the next copies work
    d.copy_to_device(h, stream=s)
    np.testing.assert_array_equal(d.copy_to_host(stream=s), h)


@pytest.mark.sim  # fault injection
@pytest.mark.parametrize("huge", [False, True])
def test_pinned_oom_falls_back_to_direct(staging, huge):
    _core._staging_trim()
    staging._staging_config(huge=huge)
    _core._sim_inject("MemHostAlloc", 1, 2)  # CUDA_ERROR_OUT_OF_MEMORY
    _core._sim_inject("MemHostRegister", 1, 2)
    try:
        assert check_roundtrip(BASE) == 1   # the second one staged
    finally:
        _core._sim_inject("MemHostAlloc", 0, 0)
        _core._sim_inject("MemHostRegister", 0, 0)


@pytest.mark.sim  # fault injection
def test_huge_page_buffer_refused_falls_back_to_host_alloc(staging):
    # A registration the driver refuses costs nothing: that buffer comes
    # from cuMemHostAlloc instead, and every buffer is freed on trim.
    _core._staging_trim()
    staging._staging_config(huge=True)
    before = cuda.memory_stats()["pinned_bytes"]
    _core._sim_inject("MemHostRegister", 2, CUDA_ERROR_LAUNCH_FAILED)
    try:
        assert check_roundtrip(sample((5 * CHUNK,), "u1")) == 2
    finally:
        _core._sim_inject("MemHostRegister", 0, 0)
    assert _core._staging_stats()["buffers"] == 3
    _core._staging_trim()
    st = _core._staging_stats()
    assert st["buffers"] == 0 and st["bytes"] == 0, st
    assert cuda.memory_stats()["pinned_bytes"] == before


def test_buffers_are_cached_and_trimmed(staging):
    check_roundtrip(BASE)
    st = _core._staging_stats()
    assert st["buffers"] == st["free"] == 3
    assert st["bytes"] == 3 * CHUNK
    check_roundtrip(BASE)
    assert _core._staging_stats()["buffers"] == 3
    _core._staging_trim()
    assert _core._staging_stats()["buffers"] == 0


def test_chunk_change_drops_small_buffers(staging):
    check_roundtrip(BASE)
    _core._staging_config(chunk=2 * CHUNK)
    check_roundtrip(BASE)
    st = _core._staging_stats()
    assert st["buffers"] == 3 and st["bytes"] == 6 * CHUNK


def test_config_rejects_negative(staging):
    with pytest.raises(ValueError):
        _core._staging_config(chunk=-1)


def test_time_counters(staging):
    # Chunks and where the time went, summed over staged transfers: the
    # sweep (benchmarks/staging_sweep.py) reads them to tell waits for the
    # bus from host-side stages.
    before = _core._staging_stats()
    h = np.arange(10 * CHUNK, dtype=np.uint8)
    d = cuda.to_device(h)                       # 10 chunks
    np.testing.assert_array_equal(d.copy_to_host(), h)   # 10 more
    after = _core._staging_stats()
    assert after["chunks"] - before["chunks"] == 20
    grew = {k: after[k] - before[k]
            for k in ("wait_ns", "stage_ns", "issue_ns", "total_ns")}
    assert all(v >= 0 for v in grew.values()), grew
    assert grew["stage_ns"] > 0 and grew["total_ns"] > 0, grew
    assert grew["total_ns"] >= grew["stage_ns"], grew


def _schedule(elems, full, min_el, ramp):
    """The chunk boundaries memory/staging/staging.c cuts (a reference)."""
    sizes = []
    while (len(sizes) < min(ramp, 6) and (full >> (len(sizes) + 1)) >= min_el
           and (full >> (len(sizes) + 1)) > 0):
        sizes.append(full >> (len(sizes) + 1))
    if not sizes or elems < 2 * sum(sizes) + full:
        sizes = []
    end = elems - sum(sizes)
    bounds, e = [], 0
    for s in reversed(sizes):
        bounds.append(e)
        e += s
    while e < end:
        bounds.append(e)
        e += min(full, end - e)
    for s in sizes:
        bounds.append(e)
        e += s
    return bounds + [e]


@pytest.mark.parametrize("ramp", [1, 3, 6])
@pytest.mark.parametrize("nbytes", [11263, 11264, 11265, 20000, 40977])
@pytest.mark.parametrize("dtype", ["u1", "f8"])
def test_ramped_chunks(staging, ramp, nbytes, dtype):
    # CUDAMEM_STAGING_RAMP: halved chunks at both ends, whole elements,
    # nothing lost or doubled at any boundary, both ways.
    staging._staging_config(ramp=ramp)
    itemsize = np.dtype(dtype).itemsize
    n = nbytes // itemsize
    h = sample((n,), dtype)
    before = _core._staging_stats()["chunks"]
    assert check_roundtrip(h) == 2
    full = CHUNK // itemsize
    want = len(_schedule(n, full, max(64 // itemsize, 1), ramp)) - 1
    assert _core._staging_stats()["chunks"] - before == 2 * want
    if ramp and n >= 2 * (full - (full >> min(ramp, 6))) + full:
        assert want > -(-n // full)       # the ramp took effect


def test_ramped_chunks_strided_and_async(staging):
    staging._staging_config(ramp=3)
    base = sample((3, 9000), "f4")
    h = base[:, ::2]                     # a strided host side
    s = cuda.stream()
    d = cuda.to_device(h, stream=s)
    out = np.empty_like(h)
    d.copy_to_host(out, stream=s)
    s.synchronize()
    np.testing.assert_array_equal(out, h)


def test_ramp_tunable(staging):
    assert staging._staging_config(ramp=-1 + 2)["ramp"] == 1
    assert staging._staging_config(ramp=6)["ramp"] == 6
    with pytest.raises(ValueError, match=r"ramp=99\) is out of range"):
        staging._staging_config(ramp=99)
    rc, out = run_py("""
        from cudamem import _core
        import cudamem
        cudamem.current_context()
        print(_core._staging_config()["ramp"])
    """, CUDAMEM_STAGING_RAMP="2")
    assert rc == 0 and out.strip().endswith("2"), out


@pytest.mark.parametrize("nt,spin,huge", [
    (False, 0, False), (True, 0, False), (False, 50, False),
    (False, 0, True), (True, 50, True)])
@pytest.mark.parametrize("offset", [0, 1, 7, 16])
def test_nontemporal_spinning_and_huge_page_copies(staging, nt, spin, huge,
                                                    offset):
    # CUDAMEM_STAGING_NT / _SPIN / _HUGE: the host side written with
    # non-temporal stores (runs of 4 KiB and more, any alignment of
    # either side), threads that poll before they sleep, and staging
    # buffers of registered huge-page memory move the same bytes as
    # memcpy, sleeping threads and cuMemHostAlloc buffers, both ways,
    # including the tails of runs that are not a multiple of 64 bytes.
    _core._staging_trim()                # new buffers of the kind asked
    staging._staging_config(nt=nt, spin=spin, huge=huge, chunk=40000,
                            part=9000)
    raw = sample((123457 + offset,), "u1")
    h = raw[offset:]
    assert check_roundtrip(h) == 2
    rows = sample((7, 10001), "u1")[:, offset:offset + 9999]
    assert check_roundtrip(rows) == 2
    out = np.zeros(123457 + offset, np.uint8)
    d = cuda.to_device(h)
    d.copy_to_host(out[offset:])
    np.testing.assert_array_equal(out[offset:], h)
    assert not out[:offset].any()


def test_nt_spin_and_huge_tunables(staging):
    c = staging._staging_config(nt=1, spin=100000, huge=True)
    assert c["nt"] is True and c["spin"] == 100000 and c["huge"] is True
    with pytest.raises(ValueError, match="0 to 100000 microseconds"):
        staging._staging_config(spin=10 ** 9)
    c = staging._staging_config(nt=0, spin=0, huge=0)
    assert c["nt"] is False and c["spin"] == 0 and c["huge"] is False
    with pytest.raises(ValueError, match="spin"):
        staging._staging_config(spin=-1)
    rc, out = run_py("""
        from cudamem import _core
        c = _core._staging_config()
        print(c["nt"], c["spin"], c["huge"])
    """, CUDAMEM_STAGING_NT="1", CUDAMEM_STAGING_SPIN="30",
        CUDAMEM_STAGING_HUGE="1")
    assert rc == 0 and out.strip().endswith("True 30 True"), out


# -- one buffer for small copies to the host ------------------------------
#
# Under the threshold, a synchronous copy into pageable host memory of
# 16 KiB to `bounce` bytes (1 MiB by default) goes through one staging
# buffer: the driver's synchronous copy into it, then a memcpy.

BOUNCE_MIN = 16 << 10


def bounced():
    return _core._staging_stats()["bounced"]


@pytest.fixture
def bounce(ctx):
    """The default threshold, chunk and bounce limit; the old tunables
    come back afterwards, and no staging buffer is left in use."""
    old = _core._staging_config()
    _core._staging_config(enabled=True, threshold=4 << 20, chunk=8 << 20,
                          bounce=1 << 20)
    yield
    cuda.synchronize()
    _core._staging_config(**old)
    st = _core._staging_stats()
    assert st["in_use"] == 0 and st["inflight"] == 0, st
    _core._staging_trim()


def _bytes(n, seed=0):
    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8)


@pytest.mark.parametrize("n,used", [
    (BOUNCE_MIN - 1, 0), (BOUNCE_MIN, 1), (64 << 10, 1), (1 << 20, 1),
    ((1 << 20) + 1, 0), ((4 << 20) - 1, 0)])
def test_small_copies_to_the_host_go_through_one_buffer(bounce, n, used):
    h = _bytes(n)
    d = cuda.to_device(h)
    b, s = bounced(), staged()
    out = np.zeros_like(h)
    d.copy_to_host(out)
    np.testing.assert_array_equal(out, h)
    np.testing.assert_array_equal(d.copy_to_host(), h)   # a new array
    assert bounced() - b == 2 * used
    assert staged() == s


def test_bounce_limit_is_a_tunable(bounce):
    h = _bytes(64 << 10)
    d = cuda.to_device(h)
    assert _core._staging_config(bounce=32 << 10)["bounce"] == 32 << 10
    b = bounced()
    np.testing.assert_array_equal(d.copy_to_host(), h)
    assert bounced() == b
    _core._staging_config(bounce=0)
    np.testing.assert_array_equal(d.copy_to_host()[:BOUNCE_MIN],
                                  h[:BOUNCE_MIN])
    np.testing.assert_array_equal(d[:BOUNCE_MIN].copy_to_host(),
                                  h[:BOUNCE_MIN])
    assert bounced() == b
    _core._staging_config(bounce=64 << 10, enabled=False)
    np.testing.assert_array_equal(d.copy_to_host(), h)
    assert bounced() == b
    for bad in (-1, (64 << 20) + 1, 1 << 70):
        with pytest.raises(ValueError, match="bounce"):
            _core._staging_config(bounce=bad)
    assert _core._staging_config()["bounce"] == 64 << 10


def test_bounce_limit_from_the_environment():
    rc, out = run_py("""
        from cudamem import _core
        print("bounce:", _core._staging_config()["bounce"])
        """, CUDAMEM_STAGING_BOUNCE="256K")
    assert rc == 0, out
    assert "bounce: 262144" in out
    rc, out = run_py("""
        from cudamem import _core
        print("bounce:", _core._staging_config()["bounce"])
        """, CUDAMEM_STAGING_BOUNCE="")
    assert rc == 0, out
    assert "bounce: 1048576" in out


BOUNCE_BASE = sample((64, 48), np.float64)          # 24 KiB
BOUNCE_LAYOUTS = {
    # name: (device array, host destination, bounced)
    "C": (lambda: BOUNCE_BASE, lambda: np.zeros((64, 48)), 1),
    "F both": (lambda: np.asfortranarray(BOUNCE_BASE),
               lambda: np.zeros((64, 48), order="F"), 1),
    # through a compact host buffer in the device side's order: that
    # copy is bounced, then the buffer is reordered on the host
    "F into C": (lambda: np.asfortranarray(BOUNCE_BASE),
                 lambda: np.zeros((64, 48)), 1),
    # pitched rows: one 2-D copy of the driver's, not bounced
    "step": (lambda: BOUNCE_BASE,
             lambda: np.zeros((64, 96))[:, ::2], 0),
    # no 2-D copy has a negative pitch: through a compact buffer too
    "reversed": (lambda: BOUNCE_BASE,
                 lambda: np.zeros((64, 48))[::-1], 1),
    "records": (lambda: sample((1500,), np.dtype([("a", "f8"),
                                                  ("b", "i4", 4)])),
                None, 1),
}


@pytest.mark.parametrize("name", sorted(BOUNCE_LAYOUTS))
def test_bounce_only_for_a_contiguous_host_side(bounce, name):
    make, dest, used = BOUNCE_LAYOUTS[name]
    h = make()
    d = cuda.to_device(h)
    out = np.zeros_like(h) if dest is None else dest()
    b = bounced()
    d.copy_to_host(out)
    np.testing.assert_array_equal(out, h)
    assert bounced() - b == used


@pytest.mark.parametrize("kind", ["pinned", "mapped", "registered",
                                  "stream"])
def test_bounce_leaves_page_locked_and_stream_copies_alone(bounce, kind):
    h = _bytes(64 << 10, 1)
    d = cuda.to_device(h)
    b = bounced()
    if kind == "registered":
        out = np.zeros_like(h)
        with cuda.pinned(out):
            d.copy_to_host(out)
    elif kind == "stream":
        s = cuda.stream()
        out = np.zeros_like(h)
        d.copy_to_host(out, stream=s)
        s.synchronize()
    else:
        make = cuda.pinned_array if kind == "pinned" else cuda.mapped_array
        out = make(h.shape, h.dtype)
        d.copy_to_host(out)
    np.testing.assert_array_equal(out, h)
    assert bounced() == b


def test_bounce_from_eight_threads(bounce):
    """Each thread copies arrays of its own through the buffers, beside
    staged copies to the device: every result is its own array's."""
    errors = []
    barrier = threading.Barrier(8)

    def work(i):
        try:
            rng = np.random.default_rng(i)
            barrier.wait()
            for k in range(12):
                n = int(rng.integers(BOUNCE_MIN, 1 << 20))
                h = rng.integers(0, 256, n, dtype=np.uint8)
                d = cuda.to_device(h)
                if k % 4 == 3:
                    d2 = cuda.to_device(np.full(5 << 20, i, np.uint8))
                    del d2
                out = d.copy_to_host()
                if not np.array_equal(out, h):
                    errors.append((i, k))
        except Exception as e:  # reported below
            errors.append((i, repr(e)))

    b = bounced()
    in_threads(work, 8)
    assert errors == []
    assert bounced() - b == 8 * 12


@pytest.mark.sim  # fault injection
@pytest.mark.parametrize("name,nth", [("MemcpyDtoH", 1),
                                      ("EventCreate", 1)])
def test_bounce_fault_raises_once_and_leaks_nothing(bounce, name, nth):
    h = _bytes(64 << 10, 2)
    d = cuda.to_device(h)
    _core._staging_trim()
    before = cuda.memory_stats()["pinned_bytes"]
    _core._sim_inject(name, nth, CUDA_ERROR_LAUNCH_FAILED)
    try:
        with pytest.raises(cuda.CudaAPIError,
                           match="CUDA_ERROR_LAUNCH_FAILED") as e:
            d.copy_to_host()
    finally:
        _core._sim_inject(name, 0, 0)
    assert "cu" + name in str(e.value)
    st = _core._staging_stats()
    assert st["in_use"] == 0 and st["inflight"] == 0, st
    np.testing.assert_array_equal(d.copy_to_host(), h)
    _core._staging_trim()
    assert _core._staging_stats()["buffers"] == 0
    assert cuda.memory_stats()["pinned_bytes"] == before


@pytest.mark.sim  # fault injection
def test_bounce_without_page_locked_memory_goes_direct(bounce):
    h = _bytes(64 << 10, 3)
    d = cuda.to_device(h)
    _core._staging_trim()
    _core._sim_inject("MemHostAlloc", 1, 2)  # CUDA_ERROR_OUT_OF_MEMORY
    _core._sim_inject("MemHostRegister", 1, 2)
    b = bounced()
    try:
        np.testing.assert_array_equal(d.copy_to_host(), h)
    finally:
        _core._sim_inject("MemHostAlloc", 0, 0)
        _core._sim_inject("MemHostRegister", 0, 0)
    assert bounced() == b
    np.testing.assert_array_equal(d.copy_to_host(), h)
    assert bounced() == b + 1


def test_bounce_after_close_uses_the_new_contexts_buffers():
    rc, out = run_py("""
        import numpy as np, cudamem
        from cudamem import _core
        h = np.arange(1 << 14, dtype=np.float32)        # 64 KiB
        ok = bool((cudamem.to_device(h).copy_to_host() == h).all())
        cudamem.close()
        ok &= bool((cudamem.to_device(h).copy_to_host() == h).all())
        cudamem.get_current_device().reset()
        ok &= bool((cudamem.to_device(h).copy_to_host() == h).all())
        st = _core._staging_stats()
        print("data:", ok, "bounced:", st["bounced"], "buffers:",
              st["buffers"])
        """)
    assert rc == 0, out
    assert "data: True bounced: 3 buffers: 1" in out


# -- in a child, beside the next module's ---------------------------------
#
# Last in the module: a test marked ahead that only runs a child (mostly
# waiting out the simulator's slowed-down copies) runs beside the marked
# tests that follow it, test_stream_model.py's programs
# (tests/helpers/ahead.py).


@pytest.mark.ahead
def test_async_follows_its_stream_and_completes_before_returning():
    """An asynchronous staged copy is issued on its stream after the work
    queued there, and (like the driver's copies of pageable memory) is
    done with the host side when it returns (to the host: landed), its
    buffers back in the cache."""
    if not SIMULATOR:
        pytest.skip("slowed-down copies need the simulator")
    rc, out = run_py("""
        import numpy as np, cudamem
        from cudamem import _core
        _core._staging_config(enabled=True, threshold=1, chunk=1 << 14)
        s = cudamem.stream()
        h = np.arange(1 << 15, dtype=np.float64)   # 16 chunks
        src = cudamem.pinned_array(h.shape, h.dtype)
        src[:] = h[::-1]
        d = cudamem.device_array_like(h)
        d.copy_to_device(h, stream=s)        # staged
        d.copy_to_device(src, stream=s)      # direct, slowed down
        out = d.copy_to_host(stream=s)       # staged, after both
        st = _core._staging_stats()
        print("data:", bool((out == h[::-1]).all()))
        print("released:", st["in_use"] == 0 and st["inflight"] == 0)
        print("staged:", st["staged"] >= 2)
        """, CUDAMEM_SIM_DELAY_US="50000")
    assert rc == 0, out
    assert "data: True" in out
    assert "released: True" in out
    assert "staged: True" in out


@pytest.mark.ahead
def test_sync_to_device_returns_once_the_host_side_is_taken():
    """A synchronous staged copy to plain device memory returns once its
    last chunk is packed and issued, as the driver's cuMemcpyHtoD of
    pageable memory may: the default stream still runs its last copies,
    the source is free to change at once, and what follows on the
    default stream (a copy back, staged through the same buffers, which
    wait for those copies first; trimming the cache, which waits before
    freeing them) sees the bytes."""
    if not SIMULATOR:
        pytest.skip("slowed-down copies need the simulator")
    rc, out = run_py("""
        import numpy as np, cudamem
        from cudamem import _core
        _core._staging_config(enabled=True, threshold=1, chunk=1 << 14,
                              buffers=2)
        h = np.arange(1 << 13, dtype=np.float64)   # 4 chunks, 2 buffers
        want = h.copy()
        d = cudamem.device_array_like(h)
        d.copy_to_device(h)
        print("in flight:", not cudamem.default_stream().query())
        h[:] = -1                      # the source was taken
        out = d.copy_to_host()         # staged through the same buffers
        print("data:", bool((out == want).all()))
        d.copy_to_device(want[::-1].copy())
        _core._staging_trim()          # frees buffers a copy may still read
        print("trimmed:", _core._staging_stats()["buffers"] == 0)
        print("data 2:", bool((d.copy_to_host() == want[::-1]).all()))
        st = _core._staging_stats()
        print("released:", st["in_use"] == 0 and st["inflight"] == 0)
        """, CUDAMEM_SIM_DELAY_US="50000")
    assert rc == 0, out
    assert "in flight: True" in out
    assert "data: True" in out
    assert "trimmed: True" in out
    assert "data 2: True" in out
    assert "released: True" in out


@pytest.mark.ahead
def test_sync_to_device_into_managed_memory_has_landed():
    """Into memory the host reads directly (managed), a synchronous staged
    copy returns only once every chunk has landed."""
    if not SIMULATOR:
        pytest.skip("slowed-down copies need the simulator")
    rc, out = run_py("""
        import numpy as np, cudamem
        from cudamem import _core
        _core._staging_config(enabled=True, threshold=1, chunk=1 << 14,
                              buffers=2)
        h = np.arange(1 << 13, dtype=np.float64)
        m = cudamem.managed_array(h.shape, h.dtype)
        m.copy_to_device(h)
        print("landed:", cudamem.default_stream().query())
        print("data:", bool((np.asarray(m) == h).all()))
        """, CUDAMEM_SIM_DELAY_US="50000")
    assert rc == 0, out
    assert "landed: True" in out
    assert "data: True" in out


@pytest.mark.ahead
def test_buffers_left_in_flight_are_waited_for_on_another_stream():
    """A copy to the device that returned early leaves its last buffers'
    copies running on the default stream; a copy to the host on another
    stream (one that does not wait for the default stream) takes the same
    buffers and must not write them before those copies read them."""
    rc, out = run_py("""
        import numpy as np, cudamem
        from cudamem import _core
        _core._staging_config(enabled=True, threshold=1, chunk=1 << 20,
                              buffers=2)
        s = _core._stream_with_flags(1)     # CU_STREAM_NON_BLOCKING
        ok = True
        for r in range(20):
            a = np.full(1 << 18, r, np.float64)          # 2 MiB: 2 chunks
            b = np.full(1 << 18, -1.0 - r, np.float64)
            da = cudamem.device_array_like(a)
            db = cudamem.to_device(b)
            s.synchronize()
            da.copy_to_device(a)                         # returns early
            db.copy_to_host(b, stream=s)                 # same buffers
            s.synchronize()
            ok &= bool((da.copy_to_host() == r).all())
            ok &= bool((b == -1.0 - r).all())
        print("data:", ok)
        """, CUDAMEM_SIM_DELAY_US="2000" if SIMULATOR else None)
    assert rc == 0, out
    assert "data: True" in out


@pytest.mark.parametrize("manager", ["pool", "async"])
@pytest.mark.parametrize("source", ["staged", "direct", "device"])
def test_early_copy_holds_the_block_it_writes(manager, source):
    """A synchronous copy that returned before its bytes landed (from
    pageable memory: staged, or the driver's own staging under the
    threshold; device to device, which the driver never waits for) into
    an array allocated for another stream (a non-blocking one) and bound
    to the default stream: freed at once, the block is not handed out on
    that stream before the copy has run, so the next owner's bytes are
    not overwritten by the late ones."""
    rc, out = run_py("""
        import numpy as np, cudamem
        from cudamem import _core
        source, sim = %(source)r, %(sim)r
        if source == "staged":
            _core._staging_config(enabled=True, threshold=1,
                                  chunk=1 << 14, buffers=2)
        s = _core._stream_with_flags(1)     # CU_STREAM_NON_BLOCKING
        # 64 KiB on the simulator (staged: 4 chunks); on a GPU 16 MiB
        # staged, else 512 KiB (pageable: the driver's own staging).
        n = 1 << 13 if sim else 2 << 20 if source == "staged" else 1 << 16
        h = np.arange(n, dtype=np.float64)
        if source == "device":
            h = cudamem.to_device(h)
        src = cudamem.pinned_array(n, np.float64)
        busy = cudamem.device_array(16, np.float64)
        legacy = cudamem.legacy_default_stream()
        ok = True
        for r in range(2 if sim else 20):
            if sim:
                # Work ahead on the default stream: the copy there runs
                # after the next owner's (each op takes CUDAMEM_SIM_DELAY_US).
                for _ in range(3):
                    busy.copy_to_device(src[:16], stream=legacy)
            d = cudamem.device_array(n, np.float64, stream=s)
            d.bind(0).copy_to_device(h)      # may return early
            del d
            d2 = cudamem.device_array(n, np.float64, stream=s)
            src[:] = -1 - r
            d2.copy_to_device(src, stream=s)
            s.synchronize()
            cudamem.synchronize()
            ok &= bool((d2.copy_to_host() == -1 - r).all())
            del d2
        print("data:", ok)
        """ % {"source": source, "sim": SIMULATOR},
        CUDAMEM_MEMORY_MANAGER=manager,
        CUDAMEM_SIM_DELAY_US="50000" if SIMULATOR else None)
    assert rc == 0, out
    assert "data: True" in out


def test_a_few_chunks_are_cut_smaller():
    """With the default chunk (8 MiB) and buffers (3), a transfer is cut
    into a third each while that is at most 2 MiB (4 MiB: 3 chunks), into
    quarters of at least 2 MiB while a third would be under the chunk
    size (8, 16, 20 and 23 MiB: 4 chunks), and into chunks of the chunk
    size from there (24 and 32 MiB: 3 and 4, 64 MiB: 8)."""
    rc, out = run_py("""
        import numpy as np, cudamem
        from cudamem import _core
        for mib in (4, 8, 16, 20, 23, 24, 32, 64):
            h = np.ones(mib << 20, np.uint8)
            d = cudamem.device_array_like(h)
            n0 = _core._staging_stats()["chunks"]
            d.copy_to_device(h)
            print(mib, _core._staging_stats()["chunks"] - n0)
        """, CUDAMEM_STAGING_CHUNK=None, CUDAMEM_STAGING_BUFFERS=None,
        CUDAMEM_STAGING_THRESHOLD=None, CUDAMEM_STAGING=None,
        CUDAMEM_STAGING_RAMP=None)
    assert rc == 0, out
    got = dict(line.split() for line in out.split("\n") if line.strip())
    assert got == {"4": "3", "8": "4", "16": "4", "20": "4", "23": "4",
                   "24": "3", "32": "4", "64": "8"}, out


@pytest.mark.parametrize("lib", ["cupy", "torch"])
def test_peer_reads_a_copy_that_returned_early(lib):
    """Another library reading a device array right after a staged copy
    to it returned (its last chunks possibly still in flight) on its own
    default stream, which comes after cudamem's default-stream copies,
    sees every byte."""
    pytest.importorskip(lib)
    if SIMULATOR:
        pytest.skip("%s needs a GPU" % lib)
    rc, out = run_py("""
        import numpy as np, cudamem
        lib = %r
        ok = True
        for r in range(10):
            h = np.full(16 << 20, r + 1, np.uint8)      # staged: 8 chunks
            d = cudamem.to_device(h)
            if lib == "cupy":
                import cupy
                got = cupy.asnumpy(cupy.asarray(d))
            else:
                import torch
                got = torch.as_tensor(d, device="cuda").cpu().numpy()
            ok &= bool((got == r + 1).all())
        print("data:", ok)
        """ % lib)
    assert rc == 0, out
    assert "data: True" in out


@pytest.mark.ahead
def test_bounce_waits_for_a_buffer_an_early_copy_still_reads():
    """A copy to the device on a non-blocking stream that returned before
    its last chunks' copies ran leaves their buffers in the cache; a
    small synchronous copy to the host (on the default stream, which
    does not wait for that stream) takes one of them and must not write
    it before those copies read it."""
    rc, out = run_py("""
        import numpy as np, cudamem
        from cudamem import _core
        _core._staging_config(enabled=True, threshold=1 << 20,
                              chunk=1 << 20, buffers=2, bounce=1 << 20)
        s = _core._stream_with_flags(1)     # CU_STREAM_NON_BLOCKING
        ok = True
        b0 = _core._staging_stats()["bounced"]
        for r in range(10):
            a = np.full(1 << 18, r, np.float64)          # 2 MiB: 2 chunks
            small = np.full(1 << 13, -1.0 - r)           # 64 KiB
            da = cudamem.device_array_like(a)
            ds = cudamem.to_device(small)
            cudamem.synchronize()
            da.copy_to_device(a, stream=s)               # returns early
            ok &= bool((ds.copy_to_host() == -1.0 - r).all())
            s.synchronize()
            ok &= bool((da.copy_to_host() == r).all())
        print("data:", ok)
        print("bounced:", _core._staging_stats()["bounced"] - b0 >= 10)
        """, CUDAMEM_SIM_DELAY_US="2000" if SIMULATOR else None)
    assert rc == 0, out
    assert "data: True" in out
    assert "bounced: True" in out


def test_bounce_follows_registrations_of_one_host_array(bounce):
    # The driver's answer for the host range asked last is kept per
    # thread (a loop into one array asks once); cudamem's own
    # registrations are looked at first at every copy, so pinning the
    # same array, then letting it go, changes the route each time, and
    # every copy lands.
    h = np.zeros(64 << 10, np.uint8)
    src = _bytes(64 << 10, 4)
    d = cuda.to_device(src)
    for pin in (False, True, False, True):
        h[:] = 0
        b = bounced()
        if pin:
            with cuda.pinned(h):
                d.copy_to_host(h)
        else:
            d.copy_to_host(h)
        np.testing.assert_array_equal(h, src)
        assert bounced() - b == (0 if pin else 1), pin
