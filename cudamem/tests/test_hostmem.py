# SPDX-License-Identifier: MIT
"""Host memory: pinned arrays and registration, mapped (zero-copy)
arrays, managed (unified) arrays."""

import numpy as np

import cudamem as cuda


def test_pinned_array_transfers():
    p = cuda.pinned_array((256, 4), dtype=np.float32)
    p[:] = np.arange(1024, dtype=np.float32).reshape(256, 4)
    d = cuda.to_device(p)
    out = cuda.pinned_array_like(p)
    d.copy_to_host(out)
    np.testing.assert_array_equal(out, p)


def test_pinned_registration_of_an_existing_array(stream):
    host = np.arange(1 << 16, dtype=np.int32)
    with cuda.pinned(host):
        d = cuda.to_device(host, stream=stream)
        back = np.zeros_like(host)
        with cuda.pinned(back):
            d.copy_to_host(back, stream=stream)
            stream.synchronize()
    np.testing.assert_array_equal(back, host)


def test_mapped_array_is_seen_by_the_device():
    m = cuda.mapped_array(64, dtype=np.int64)
    m[:] = np.arange(64)
    # A device-side copy from a mapped array reads what the host wrote.
    d = cuda.device_array(64, dtype=np.int64)
    d.copy_to_device(m)
    np.testing.assert_array_equal(d.copy_to_host(), np.arange(64))
    cuda.synchronize()


def test_mapped_context_manager():
    host = np.arange(32, dtype=np.float64)
    with cuda.mapped(host) as dev:
        np.testing.assert_array_equal(dev.copy_to_host(), host)


def test_managed_array_host_and_device():
    m = cuda.managed_array((8, 8), dtype=np.float32)
    m[:] = 1.5
    d = cuda.to_device(np.full((8, 8), 2.0, dtype=np.float32))
    assert m.shape == (8, 8)
    cuda.synchronize()
    m += d.copy_to_host()
    np.testing.assert_array_equal(m, np.full((8, 8), 3.5, np.float32))


def test_pinned_pool_statistics():
    p = cuda.pinned_array(1024, dtype=np.uint8)
    del p
    stats = cuda.pinned_pool_stats()
    assert isinstance(stats, dict)
    cuda.pinned_pool_trim()
