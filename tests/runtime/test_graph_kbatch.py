# SPDX-License-Identifier: MIT
"""Kernel copies recorded one after another on a stream cudamem
captures join one kernel node, a batch (``_core._capture_kernel_batch``,
``CUDAMEM_CAPTURE_KERNEL_BATCH``): which copies join, which start a new
batch (other work on the stream, a join of another stream's work, a full
batch, a read of host memory the batch wrote), and that replays move
the same bytes as copies apart.  The seeded random programs of
test_graph_kcopy.py run with batches on and off; on the simulator a
batch makes each segment's copies in reverse order, so a barrier or a
preload the capture got wrong shows there."""

import os
import subprocess
import sys

import numpy as np
import pytest

import cudamem
from cudamem import _core


@pytest.fixture
def batches():
    old, _ = _core._capture_kernel_copy(4096)
    old_batch, _ = _core._capture_kernel_batch(True)
    try:
        yield
    finally:
        _core._capture_kernel_copy(old)
        _core._capture_kernel_batch(old_batch)


def _joined():
    return _core._capture_kernel_batch()[1]


def _pattern(n, k=0):
    return ((np.arange(n) + 7 * k) % 251).astype(np.uint8)


def test_switch_reads_and_sets():
    old, joined = _core._capture_kernel_batch()
    try:
        assert _core._capture_kernel_batch(False) == (old, joined)
        assert _core._capture_kernel_batch()[0] is False
        assert _core._capture_kernel_batch(1)[0] is False
        assert _core._capture_kernel_batch()[0] is True
    finally:
        _core._capture_kernel_batch(old)
    with pytest.raises(TypeError):
        _core._capture_kernel_batch(1, 2)


def test_environment_variable():
    code = ("from cudamem import _core; "
            "print(_core._capture_kernel_batch()[0])")
    env = dict(os.environ, CUDAMEM_CAPTURE_KERNEL_BATCH="0")
    out = subprocess.run([sys.executable, "-c", code], env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"
    env["CUDAMEM_CAPTURE_KERNEL_BATCH"] = "yes"
    out = subprocess.run([sys.executable, "-c", "import cudamem"], env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode != 0
    assert "CUDAMEM_CAPTURE_KERNEL_BATCH=yes" in out.stderr


@pytest.mark.parametrize("on", [True, False])
def test_round_trips_join_one_batch(batches, on):
    """100 round trips of 1 KiB: with batches, all but the first copy of
    each batch join (a batch holds at most 160 entries, its one preload
    of the host input among them); without, none; replays right either
    way, the host input changed between them."""
    _core._capture_kernel_batch(on)
    s = cudamem.stream()
    h = cudamem.pinned_array(1024, np.uint8)
    out = cudamem.pinned_array(1024, np.uint8)
    d = cudamem.device_array(1024, np.uint8)
    before = _joined()
    with cudamem.graph(stream=s) as g:
        for _ in range(100):
            d.copy_to_device(h, stream=s)
            d.copy_to_host(out, stream=s)
    joined = _joined() - before
    assert joined == (198 if on else 0)
    for k in range(3):
        h[:] = _pattern(1024, k)
        out[:] = 0
        g.replay(s)
        s.synchronize()
        np.testing.assert_array_equal(out, h)
    g.close()


def test_distinct_inputs_and_outputs(batches):
    """Round trips through 40 distinct host inputs and outputs (40
    preloads of 1 KiB: more than the stage holds, the rest read in
    place), every output its input after each replay."""
    s = cudamem.stream()
    ins = [cudamem.pinned_array(1024, np.uint8) for _ in range(40)]
    outs = [cudamem.pinned_array(1024, np.uint8) for _ in range(40)]
    d = cudamem.device_array(1024, np.uint8)
    with cudamem.graph(stream=s) as g:
        for i, o in zip(ins, outs, strict=True):
            d.copy_to_device(i, stream=s)
            d.copy_to_host(o, stream=s)
    for k in range(3):
        for j, i in enumerate(ins):
            i[:] = _pattern(1024, k * 40 + j)
        g.replay(s)
        s.synchronize()
        for i, o in zip(ins, outs, strict=True):
            np.testing.assert_array_equal(o, i)
    g.close()


def test_other_work_on_the_stream_starts_a_new_batch(batches):
    """A memset recorded between kernel copies sits between them in the
    replay: the copies after it read what it wrote."""
    s = cudamem.stream()
    h = cudamem.pinned_array(512, np.uint8)
    out = cudamem.pinned_array(512, np.uint8)
    d = cudamem.device_array(512, np.uint8)
    before = _joined()
    with cudamem.graph(stream=s) as g:
        d.copy_to_device(h, stream=s)
        d.copy_to_host(out, stream=s)       # joins
        cudamem.driver.device_memset(d, 0x5A, 256, stream=s)
        d.copy_to_host(out, stream=s)       # a batch of its own
    assert _joined() - before == 1
    h[:] = 9
    g.replay(s)
    s.synchronize()
    assert (out[:256] == 0x5A).all() and (out[256:] == 9).all()
    g.close()


def test_a_join_of_another_streams_work_starts_a_new_batch(batches):
    """Stream a waits on stream b's copy (captured together): a's copies
    after the wait read what b's wrote, not what was there before."""
    a, b = cudamem.stream(), cudamem.stream()
    h = cudamem.pinned_array(256, np.uint8)
    h2 = cudamem.pinned_array(256, np.uint8)
    out = cudamem.pinned_array(256, np.uint8)
    d = cudamem.device_array(256, np.uint8)
    before = _joined()
    with cudamem.graph(stream=a) as g:
        d.copy_to_device(h, stream=a)
        d.copy_to_host(out, stream=a)       # joins
        e = cudamem.event(timing=False)
        e.record(a)
        b.wait_event(e)
        d.copy_to_device(h2, stream=b)      # b's: after a's copies
        e2 = cudamem.event(timing=False)
        e2.record(b)
        a.wait_event(e2)
        d.copy_to_host(out, stream=a)       # after b's: a new batch
    assert _joined() - before == 1
    h[:] = 1
    h2[:] = 2
    g.replay(a)
    a.synchronize()
    assert (out == 2).all()
    g.close()


def test_a_read_of_host_memory_the_batch_wrote_starts_a_new_batch(
        batches):
    """A copy reading host memory an earlier copy of the batch wrote is
    not in that batch (the device's view of host memory across a block
    barrier is not relied on)."""
    s = cudamem.stream()
    h = cudamem.pinned_array(256, np.uint8)
    mid = cudamem.pinned_array(256, np.uint8)
    d = cudamem.device_array(256, np.uint8)
    d2 = cudamem.device_array(256, np.uint8)
    before = _joined()
    with cudamem.graph(stream=s) as g:
        d.copy_to_device(h, stream=s)
        d.copy_to_host(mid, stream=s)       # joins
        d2.copy_to_device(mid, stream=s)    # reads mid: a new batch
    assert _joined() - before == 1
    h[:] = 4
    g.replay(s)
    s.synchronize()
    assert (d2.copy_to_host() == 4).all()
    g.close()


def test_overlapping_copies_keep_their_order(batches):
    """Copies into overlapping ranges of one device buffer from a host
    input, and out of ranges of it into overlapping ranges of a host
    output, all in one batch: the replay equals NumPy applying them in
    order (barriers where a copy reads or overwrites what one since the
    last barrier wrote or read)."""
    s = cudamem.stream()
    h = cudamem.pinned_array(4096, np.uint8)
    out = cudamem.pinned_array(4096, np.uint8)
    d = cudamem.device_array(4096, np.uint8)
    rng = np.random.default_rng(5)
    steps = []
    for _ in range(60):
        n = int(rng.choice([1, 4, 7, 64, 256, 1000]))
        steps.append((bool(rng.integers(2)),
                      int(rng.integers(0, 4096 - n + 1)),
                      int(rng.integers(0, 4096 - n + 1)), n))
    before = _joined()
    with cudamem.graph(stream=s) as g:
        for to_dev, so, do, n in steps:
            if to_dev:
                d[do:do + n].copy_to_device(h[so:so + n], stream=s)
            else:
                d[so:so + n].copy_to_host(out[do:do + n], stream=s)
    assert _joined() - before == len(steps) - 1
    for k in range(3):
        h[:] = _pattern(4096, k)
        out[:] = 0
        d.copy_to_device(np.zeros(4096, np.uint8))
        model_d = np.zeros(4096, np.uint8)
        model_out = np.zeros(4096, np.uint8)
        for to_dev, so, do, n in steps:
            if to_dev:
                model_d[do:do + n] = h[so:so + n]
            else:
                model_out[do:do + n] = model_d[so:so + n]
        g.replay(s)
        s.synchronize()
        np.testing.assert_array_equal(d.copy_to_host(), model_d)
        np.testing.assert_array_equal(out, model_out)
    g.close()
