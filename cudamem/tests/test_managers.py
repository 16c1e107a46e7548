# SPDX-License-Identifier: MIT
"""The memory managers: the default one (deferred frees), "pool" and
"async", each choosing in a fresh context (a child process, so that no
other library's context is reset), and the same work under each."""

import pytest

from cudamem.tests._util import run_child

WORK = r"""
import gc
import numpy as np
import cudamem as cuda

kind = %r
cuda.set_memory_manager(kind)
ctx = cuda.current_context()
stats = cuda.memory_stats()
assert stats["manager"] == kind, stats
streams = [cuda.stream() for _ in range(3)]
host = np.arange(1 << 16, dtype=np.float32)
for round_ in range(20):
    arrays = []
    for i, s in enumerate(streams):
        d = cuda.to_device(host + round_ + i, stream=s)
        arrays.append((d, s, round_ + i))
    for d, s, k in arrays:
        out = d.copy_to_host(stream=s)
        s.synchronize()
        assert np.array_equal(out, host + k), (kind, round_)
    del arrays
    gc.collect()
with cuda.defer_cleanup():
    x = cuda.device_array(1 << 20, dtype=np.uint8)
    del x
free, total = ctx.get_memory_info()
assert 0 < free <= total
cuda.synchronize()
if kind == "pool":
    ctx.memory_manager.trim()
print("ok", kind, cuda.memory_stats()["manager"])
"""


@pytest.mark.parametrize("kind", ["default", "pool", "async"])
def test_manager(kind):
    out = run_child(WORK % kind)
    assert out.split() == ["ok", kind, kind]


def test_manager_from_the_environment():
    out = run_child("import cudamem as cuda; cuda.current_context(); "
                    "print(cuda.memory_stats()['manager'])",
                    env={"CUDAMEM_MEMORY_MANAGER": "pool"})
    assert out.strip() == "pool"
