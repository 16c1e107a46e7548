# SPDX-License-Identifier: MIT
"""Small copies recorded as kernel nodes while cudamem captures
(``CUDAMEM_CAPTURE_KERNEL_COPY_MAX``, ``_core._capture_kernel_copy``):
which copies take the kernel, and that every replay moves the same bytes
as copy nodes would, checked against NumPy (seeded random programs, the
failing seed printed)."""

import os
import random
import subprocess
import sys

import numpy as np
import pytest

import cudamem
from cudamem import _core

MAX = 4096


@pytest.fixture
def kernel_copies():
    old, _ = _core._capture_kernel_copy(MAX)
    try:
        yield
    finally:
        _core._capture_kernel_copy(old)


def _count():
    return _core._capture_kernel_copy()[1]


def _roundtrips(s, hin, hout, d, trips):
    for _ in range(trips):
        d.copy_to_device(hin, stream=s)
        d.copy_to_host(hout, stream=s)


def test_switch_reads_and_sets():
    old, count = _core._capture_kernel_copy()
    try:
        assert _core._capture_kernel_copy(123) == (old, count)
        assert _core._capture_kernel_copy()[0] == 123
    finally:
        _core._capture_kernel_copy(old)
    with pytest.raises(ValueError):
        _core._capture_kernel_copy(-1)
    with pytest.raises(TypeError):
        _core._capture_kernel_copy("4096")
    with pytest.raises(TypeError):
        _core._capture_kernel_copy(1, 2)


def test_round_trips_replay_as_kernels(kernel_copies):
    s = cudamem.stream()
    hin = cudamem.pinned_array(256, np.float32)
    hout = cudamem.pinned_array(256, np.float32)
    d = cudamem.device_array(256, np.float32)
    before = _count()
    with cudamem.graph(stream=s) as g:
        _roundtrips(s, hin, hout, d, 10)
    assert _count() - before == 20
    rng = np.random.default_rng(1)
    for _ in range(50):
        hin[:] = rng.standard_normal(256)
        hout[:] = 0
        g.replay(s)
        s.synchronize()
        np.testing.assert_array_equal(hout, hin)
    g.close()


def test_switch_off_or_too_large_makes_copy_nodes(kernel_copies):
    s = cudamem.stream()
    small = cudamem.pinned_array(64, np.uint8)
    large = cudamem.pinned_array(MAX + 1, np.uint8)
    dsmall = cudamem.device_array(64, np.uint8)
    dlarge = cudamem.device_array(MAX + 1, np.uint8)
    before = _count()
    with cudamem.graph(stream=s) as g:
        dlarge.copy_to_device(large, stream=s)
        dlarge.copy_to_host(large, stream=s)
    assert _count() == before
    g.close()
    _core._capture_kernel_copy(0)
    with cudamem.graph(stream=s) as g:
        dsmall.copy_to_device(small, stream=s)
    assert _count() == before
    small[:] = 7
    g.replay(s)
    s.synchronize()
    assert (dsmall.copy_to_host() == 7).all()
    g.close()


def test_outside_a_capture_no_kernel(kernel_copies):
    s = cudamem.stream()
    h = cudamem.pinned_array(64, np.uint8)
    h[:] = 5
    d = cudamem.device_array(64, np.uint8)
    before = _count()
    d.copy_to_device(h, stream=s)
    d.copy_to_host(h, stream=s)
    s.synchronize()
    assert _count() == before
    assert (h == 5).all()


def test_pageable_and_device_copies_keep_copy_nodes(kernel_copies):
    s = cudamem.stream()
    d = cudamem.device_array(64, np.uint8)
    d2 = cudamem.device_array(64, np.uint8)
    h = cudamem.pinned_array(64, np.uint8)
    before = _count()
    with cudamem.graph(stream=s) as g:
        d.copy_to_device(h, stream=s)
        d2.copy_to_device(d, stream=s)
    assert _count() - before == 1
    h[:] = 9
    g.replay(s)
    s.synchronize()
    assert (d2.copy_to_host() == 9).all()
    g.close()


def test_unaligned_bytes(kernel_copies):
    """Odd sizes and offsets take the byte loop of the kernel."""
    s = cudamem.stream()
    hin = cudamem.pinned_array(1001, np.uint8)
    hout = cudamem.pinned_array(1001, np.uint8)
    d = cudamem.device_array(1001, np.uint8)
    before = _count()
    with cudamem.graph(stream=s) as g:
        d[3:1000].copy_to_device(hin[1:998], stream=s)
        d[3:1000].copy_to_host(hout[2:999], stream=s)
    assert _count() - before == 2
    for k in range(5):
        hin[:] = np.arange(1001) * (k + 3) % 251
        hout[:] = 0
        g.replay(s)
        s.synchronize()
        np.testing.assert_array_equal(hout[2:999], hin[1:998])
        assert hout[:2].sum() == 0 and hout[999:].sum() == 0
    g.close()


def _program(seed, nhost=3, ndev=3, size=2048):
    """A random capture over pinned and device buffers of size bytes: a
    list of ops, each copying n bytes (1 to size) from one buffer at an
    offset to another at an offset, never within one buffer."""
    rng = random.Random(seed)
    ops = []
    for _ in range(rng.randint(1, 12)):
        src = (rng.choice("hd"), rng.randrange(nhost))
        dst = (rng.choice("hd"), rng.randrange(ndev))
        if src[0] == "h" and dst[0] == "h":
            dst = ("d", dst[1])
        if src == dst:      # no copy within one buffer (ranges may overlap)
            dst = (dst[0], (dst[1] + 1) % ndev)
        n = rng.choice([1, 3, 4, 64, 1000, 1024, size])
        n = min(n, size)
        so = rng.randrange(size - n + 1)
        do = rng.randrange(size - n + 1)
        ops.append((src, so, dst, do, n))
    return ops


@pytest.mark.parametrize("batch", [True, False], ids=["batched", "apart"])
@pytest.mark.parametrize("block", range(4))
def test_random_programs_against_numpy(kernel_copies, block, batch):
    """250 seeded programs per block: captured once, replayed three
    times with new host inputs, every buffer compared with the model;
    copies of at most 1 KiB with pinned memory take the kernel, the
    rest copy nodes; kernel copies one after another join one node
    (context/kbatch.c) or each keep their own."""
    old_batch, _ = _core._capture_kernel_batch(batch)
    try:
        _random_programs(block)
    finally:
        _core._capture_kernel_batch(old_batch)


def _random_programs(block):
    size = 2048
    _core._capture_kernel_copy(1024)    # 2048 B copies: copy nodes
    before = _count()
    s = cudamem.stream()
    hosts = [cudamem.pinned_array(size, np.uint8) for _ in range(3)]
    devs = [cudamem.device_array(size, np.uint8) for _ in range(3)]
    for seed in range(block * 250, (block + 1) * 250):
        ops = _program(seed)
        rng = np.random.default_rng(seed)
        for h in hosts:
            h[:] = rng.integers(0, 256, size, dtype=np.uint8)
        for d in devs:
            d.copy_to_device(rng.integers(0, 256, size, dtype=np.uint8))
        with cudamem.graph(stream=s) as g:
            for (sk, si), so, (dk, di), do, n in ops:
                src = (hosts if sk == "h" else devs)[si][so:so + n]
                dst = (hosts if dk == "h" else devs)[di][do:do + n]
                if dk == "h":
                    src.copy_to_host(dst, stream=s)
                else:
                    dst.copy_to_device(src, stream=s)
        try:
            for rep in range(3):
                for h in hosts:
                    h[:] = rng.integers(0, 256, size, dtype=np.uint8)
                model_h = [h.copy() for h in hosts]
                model_d = [d.copy_to_host() for d in devs]
                for (sk, si), so, (dk, di), do, n in ops:
                    src = (model_h if sk == "h" else model_d)[si]
                    dst = (model_h if dk == "h" else model_d)[di]
                    dst[do:do + n] = src[so:so + n].copy()
                g.replay(s)
                s.synchronize()
                for k in range(3):
                    np.testing.assert_array_equal(
                        hosts[k], model_h[k],
                        err_msg="seed %d replay %d host %d" % (seed, rep, k))
                    np.testing.assert_array_equal(
                        devs[k].copy_to_host(), model_d[k],
                        err_msg="seed %d replay %d device %d"
                        % (seed, rep, k))
        finally:
            g.close()
    # Both routes ran: kernels, and (n = 2048 among the sizes) copy nodes.
    assert _count() > before


def test_environment_variable():
    code = ("from cudamem import _core; "
            "print(_core._capture_kernel_copy()[0])")
    env = dict(os.environ, CUDAMEM_CAPTURE_KERNEL_COPY_MAX="8K")
    out = subprocess.run([sys.executable, "-c", code], env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "8192"
    env["CUDAMEM_CAPTURE_KERNEL_COPY_MAX"] = "lots"
    out = subprocess.run([sys.executable, "-c", "import cudamem"], env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode != 0
    assert "CUDAMEM_CAPTURE_KERNEL_COPY_MAX=lots" in out.stderr


@pytest.mark.parametrize("kcopy", [0, MAX])
def test_graph_keeps_what_its_capture_used(kernel_copies, kcopy):
    """Arrays dropped after the capture stay the graph's (kernel copies
    or copy nodes): the pinned pool's trim gives back no block a replay
    reads or writes, the device memory is not handed to other arrays, and
    the replays touch nothing else; closing the graph lets them go."""
    import gc
    import weakref

    _core._capture_kernel_copy(kcopy)
    s = cudamem.stream()
    hin = cudamem.pinned_array(256, np.uint8)
    hin[:] = 3
    hout = cudamem.pinned_array(256, np.uint8)
    d = cudamem.device_array(256, np.uint8)
    with cudamem.graph(stream=s) as g:
        d.copy_to_device(hin, stream=s)
        d.copy_to_host(hout, stream=s)
    refs = [weakref.ref(x) for x in (hin, hout, d.gpu_data)]
    del hin, hout, d
    gc.collect()
    assert all(r() is not None for r in refs)
    cudamem.pinned_pool_trim()
    other = [cudamem.device_array(256, np.uint8) for _ in range(8)]
    pins = [cudamem.pinned_array(256, np.uint8) for _ in range(8)]
    for o, p in zip(other, pins, strict=True):
        o.copy_to_device(np.full(256, 7, np.uint8))
        p[:] = 9
    for _ in range(3):
        g.replay(s)
        s.synchronize()
    assert (refs[1]() == 3).all()
    for o, p in zip(other, pins, strict=True):
        assert (o.copy_to_host() == 7).all()
        assert (p == 9).all()
    g.close()
    gc.collect()
    assert all(r() is None for r in refs)


def test_a_failed_capture_lets_go(kernel_copies):
    import gc
    import weakref

    s = cudamem.stream()
    h = cudamem.pinned_array(64, np.uint8)
    d = cudamem.device_array(64, np.uint8)
    ref = weakref.ref(d.gpu_data)
    s.begin_capture()
    d.copy_to_device(h, stream=s)
    s.end_capture().close()
    del d
    gc.collect()
    assert ref() is None


@pytest.mark.multi_gpu
def test_kernel_copies_on_the_second_device(kernel_copies):
    """A capture on device 1 records its small copies as kernels in
    device 1's context (the kernel loaded there; the device side's
    ordinal is 1), and pinned memory made on device 0 (not portable)
    keeps copy nodes there, both replaying right."""
    with cudamem.gpus[0]:
        h0 = cudamem.pinned_array(64, np.uint8)
    with cudamem.gpus[1]:
        s = cudamem.stream()
        h = cudamem.pinned_array(64, np.uint8)
        out = cudamem.pinned_array(64, np.uint8)
        d = cudamem.device_array(64, np.uint8)
        before = _count()
        with cudamem.graph(stream=s) as g:
            d.copy_to_device(h, stream=s)
            d.copy_to_host(out, stream=s)
        assert _count() - before == 2
        with cudamem.graph(stream=s) as g0:
            d.copy_to_device(h0, stream=s)
        assert _count() - before == 2
        for k in range(3):
            h[:] = k + 1
            g.replay(s)
            s.synchronize()
            assert (out == k + 1).all()
        h0[:] = 42
        g0.replay(s)
        s.synchronize()
        assert (d.copy_to_host() == 42).all()
        g.close()
        g0.close()
