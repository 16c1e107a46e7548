# SPDX-License-Identifier: MIT
"""cudamem used the way a typed program uses it: every value annotated
with the type the stubs give it.  .ci/wheel runs mypy --strict on this file
against the installed package (py.typed and cudamem/_core.pyi); pytest runs
it as tests on either backend, so the types describe what the calls
return."""

from typing import Any

import numpy as np
import numpy.typing as npt

import cudamem
import cudamem as cuda


def _round_trip(host: npt.NDArray[np.float32],
                stream: cuda.Stream) -> npt.NDArray[Any]:
    d: cuda.DeviceNDArray = cuda.to_device(host, stream=stream)
    view: cuda.DeviceNDArray = d[1:]
    assert view.shape == (host.size - 1,)
    out: npt.NDArray[Any] = d.copy_to_host(stream=stream)
    stream.synchronize()
    return out


def test_arrays_and_transfers() -> None:
    host = np.arange(16, dtype=np.float32)
    s: cuda.Stream = cuda.stream()
    np.testing.assert_array_equal(_round_trip(host, s), host)
    d = cuda.device_array((4, 4), dtype=np.float64, order="F")
    shape: tuple[int, ...] = d.shape
    dtype: np.dtype[Any] = d.dtype
    assert shape == (4, 4) and dtype == np.float64 and d.is_f_contiguous()
    t: cuda.DeviceNDArray = d.T
    r: cuda.DeviceNDArray = d.reshape(16)
    assert t.shape == (4, 4) and r.size == 16
    like = cuda.device_array_like(d)
    like.copy_to_device(d)
    into = np.empty((4, 4))
    assert like.copy_to_host(into) is into
    cai: dict[str, Any] = d.__cuda_array_interface__
    assert cai["shape"] == (4, 4)
    assert cuda.is_cuda_array(d)
    assert cuda.as_cuda_array(d).shape == (4, 4)


def test_streams_and_events() -> None:
    s = cuda.stream()
    start: cuda.Event = cuda.event()
    end = cuda.event(timing=True)
    start.record(s)
    cuda.to_device(np.zeros(1024), stream=s)
    end.record(s)
    end.synchronize()
    ms: float = cuda.event_elapsed_time(start, end)
    assert ms >= 0.0 and end.query()
    seen: list[int] = []

    def callback(stream: cuda.Stream, status: int, arg: Any) -> None:
        seen.append(status)

    s.add_callback(callback)
    s.synchronize()
    with s.auto_synchronize() as same:
        assert same is s
    cuda.default_stream().synchronize()
    cuda.synchronize()


def test_host_memory() -> None:
    p: npt.NDArray[Any] = cuda.pinned_array(8, dtype=np.int32)
    p[:] = 3
    m: cudamem.MappedNDArray = cuda.mapped_array(8, dtype=np.int32)
    m[:] = p
    g: cudamem.ManagedNDArray = cuda.managed_array(8, dtype=np.int32)
    g[:] = m
    host = np.arange(8)
    with cuda.pinned(host):
        cuda.to_device(host)
    with cuda.mapped(host) as dev:
        assert dev.shape == (8,)
    assert int(g.sum()) == 24


def test_devices_contexts_and_memory() -> None:
    dev: cuda.Device = cuda.get_current_device()
    cc: tuple[int, int] = dev.compute_capability
    assert cc >= (1, 0) and isinstance(dev.name, str)
    ctx: cuda.Context = cuda.current_context()
    free, total = ctx.get_memory_info()
    assert 0 < free <= total
    stats: dict[str, Any] = cuda.memory_stats()
    assert "manager" in stats
    with cuda.defer_cleanup():
        cuda.device_array(16)
    ver: tuple[int, int] = cuda.driver_version()
    built: tuple[int, int] = cuda.runtime_version()
    assert ver >= (1, 0) and built >= (1, 0)
    assert cuda.is_available() and cuda.cuda_error() is None
    assert len(cuda.gpus) >= 1


def test_errors_are_typed() -> None:
    err: type[Exception] = cuda.CudaAPIError
    assert issubclass(cuda.CudaOutOfMemoryError, err)
    try:
        cuda.device_array(-1)
    except ValueError as e:
        assert str(e)
    else:
        raise AssertionError("a negative shape was accepted")


def test_ipc_handle_is_typed() -> None:
    d = cuda.to_device(np.arange(4))
    h: cudamem.IpcArrayHandle = d.get_ipc_handle()
    assert h is not None
