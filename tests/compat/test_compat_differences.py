# SPDX-License-Identifier: MIT
"""cudamem's documented differences from numba (README, "Where cudamem
differs from numba"), each skipped for numba."""

import numpy as np
import pytest


@pytest.mark.cudamem_only("copies between layouts are made; numba raises")
def test_copy_between_layouts(cuda):
    host = np.arange(12.0).reshape(3, 4)
    d = cuda.device_array((3, 4), order="F")
    d.copy_to_device(host)
    assert (d.copy_to_host() == host).all()


@pytest.mark.cudamem_only("an array whose memory was freed raises "
                          "ValueError instead of reaching the driver")
def test_freed_memory_raises(cuda):
    d = cuda.to_device(np.arange(4))
    d.gpu_data.free()
    with pytest.raises(ValueError):
        d.copy_to_host()


@pytest.mark.cudamem_only("unreadable external stream handles raise "
                          "ValueError; numba's driver reads them unchecked")
def test_unreadable_external_stream(cuda, bad_handle):
    with pytest.raises(ValueError):
        cuda.external_stream(bad_handle)


@pytest.mark.cudamem_only("the deallocation queues hold driver releases: "
                          "no add_item(dtor, handle) as numba's have")
def test_deallocation_queues_have_no_add_item(cuda):
    ctx = cuda.current_context()
    for q in (ctx.deallocations, ctx.memory_manager.deallocations):
        assert not hasattr(q, "add_item")
        with q.disable():               # what they do have, as numba's
            assert q.is_disabled
