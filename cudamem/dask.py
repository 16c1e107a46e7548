# SPDX-License-Identifier: MIT
"""cudamem arrays in Dask: serialisation, ``sizeof`` and a worker plugin.

``distributed`` moves data between processes through serialiser
families.  This module registers cudamem's arrays with two of them:

- ``"cuda"`` (device frames, for comms that move device memory, UCX): the
  header and the array's bytes as a one-dimensional device array, no host
  copy;
- ``"dask"`` (host frames, for TCP): the same header and the bytes copied
  to the host, copied back to a new device array on arrival.

``DeviceNDArray`` travels as its device bytes; ``MappedNDArray`` and
``ManagedNDArray`` arrive as arrays of the same kind.  A contiguous array
keeps its layout (C or Fortran order); a non-contiguous view is sent as a
C-contiguous copy of its elements, so it arrives with the same shape,
dtype and values, contiguous.

Nothing needs to import this module: the ``dask.sizeof`` entry point of
cudamem's package registers ``sizeof`` (lazily) and arranges for the
serialisers to be registered with ``distributed`` once its protocol
module is loaded (``register_lazy("cudamem")`` on its dispatchers); an
import of cudamem in a process that has already loaded ``dask`` or
``distributed`` does the same.  :func:`register` registers everything at
once.

:class:`CudamemPlugin` (a ``distributed.WorkerPlugin``) chooses the memory
manager and the staging settings on each worker.
"""

import pickle
import sys

import numpy as np

# (CudamemPlugin is made on first access: a star import must not load
# distributed.)
__all__ = [
    "cuda_deserialize_array",
    "cuda_serialize_array",
    "dask_deserialize_array",
    "dask_serialize_array",
    "register",
]

_KINDS = ("device", "mapped", "managed")


def _kind_of(x):
    from ._hostmem import ManagedNDArray, MappedNDArray

    if isinstance(x, MappedNDArray):
        return "mapped"
    if isinstance(x, ManagedNDArray):
        return "managed"
    return "device"


# ---------------------------------------------------------------------------
# Serialisers
# ---------------------------------------------------------------------------


def _contiguous(x, kind):
    """x itself when C or F contiguous, else a C-contiguous copy; and its
    order."""
    if kind == "device":
        if x.is_c_contiguous():
            return x, "C"
        if x.is_f_contiguous():
            return x, "F"
        from ._core import device_array

        t = device_array(x.shape, dtype=x.dtype)
        t.copy_to_device(x)
        return t, "C"
    if x.flags.c_contiguous:
        return x, "C"
    if x.flags.f_contiguous:
        return x, "F"
    # A copy of the same kind, so that its device frame stays mapped or
    # managed memory.
    out = _host_kind({"kind": kind, "order": "C"}, x.dtype, x.shape)
    out[...] = x
    return out, "C"


def _header(x, kind, order):
    return {
        "kind": kind,
        "shape": list(x.shape),
        "dtype": pickle.dumps(x.dtype),
        "order": order,
        "nbytes": int(x.nbytes),
    }


def _device_bytes(x, order):
    """A one-dimensional uint8 device array over contiguous x's bytes."""
    flat = x.reshape(x.size, order=order) if x.ndim != 1 else x
    return flat.view(np.uint8)


def cuda_serialize_array(x):
    """The ``"cuda"`` family: (header, [device frame]).  The frame is a
    one-dimensional uint8 array over the array's bytes (cudamem's own
    DeviceNDArray; mapped and managed arrays are their own frame)."""
    kind = _kind_of(x)
    x, order = _contiguous(x, kind)
    header = _header(x, kind, order)
    if kind == "device":
        frame = _device_bytes(x, order)
    else:
        frame = x.reshape(-1, order=order).view(np.uint8)
    return header, [frame]


def _from_bytes(frame, header):
    """A DeviceNDArray of the header's shape and dtype over the device
    frame (anything exposing ``__cuda_array_interface__``)."""
    from ._core import DeviceNDArray, as_cuda_array, device_array

    dtype = pickle.loads(header["dtype"])
    shape = tuple(header["shape"])
    if header["nbytes"] == 0:
        return device_array(shape, dtype=dtype, order=header["order"])
    if not isinstance(frame, DeviceNDArray):
        frame = as_cuda_array(frame)
    if frame.ndim != 1 or frame.dtype != np.uint8:
        frame = frame.reshape(frame.size).view(np.uint8)
    flat = frame.view(dtype)
    return flat.reshape(*shape, order=header["order"]) if shape else \
        flat.reshape(())


def _host_kind(header, dtype, shape):
    from ._core import managed_array, mapped_array

    make = mapped_array if header["kind"] == "mapped" else managed_array
    return make(shape, dtype=dtype, order=header["order"])


def cuda_deserialize_array(header, frames):
    """Rebuild what :func:`cuda_serialize_array` sent."""
    (frame,) = frames
    if header["kind"] == "device":
        return _from_bytes(frame, header)
    dtype = pickle.loads(header["dtype"])
    shape = tuple(header["shape"])
    out = _host_kind(header, dtype, shape)
    if header["nbytes"]:
        dev = _from_bytes(frame, header)
        dev.copy_to_host(out)
    return out


def dask_serialize_array(x):
    """The ``"dask"`` family: (header, [host frame])."""
    kind = _kind_of(x)
    x, order = _contiguous(x, kind)
    header = _header(x, kind, order)
    if kind == "device":
        host = _device_bytes(x, order).copy_to_host() if x.size else \
            np.empty(0, np.uint8)
    else:
        host = np.asarray(x).reshape(-1, order=order).view(np.uint8)
    return header, [memoryview(host)]


def dask_deserialize_array(header, frames):
    """Rebuild what :func:`dask_serialize_array` sent."""
    (frame,) = frames
    dtype = pickle.loads(header["dtype"])
    shape = tuple(header["shape"])
    host = np.frombuffer(frame, dtype=np.uint8, count=header["nbytes"])
    if header["kind"] != "device":
        out = _host_kind(header, dtype, shape)
        if header["nbytes"]:
            view = out.reshape(-1, order=header["order"]).view(np.uint8)
            view[...] = host
        return out
    if header["nbytes"] == 0:
        return _from_bytes(None, header)
    from ._core import to_device

    return _from_bytes(to_device(host), header)


def _sizeof_device(x):
    return int(x.nbytes)


# ---------------------------------------------------------------------------
# Registration
# ---------------------------------------------------------------------------


def _array_types():
    from ._core import DeviceNDArray
    from ._hostmem import ManagedNDArray, MappedNDArray

    return (DeviceNDArray, MappedNDArray, ManagedNDArray)


def _register_sizeof(sizeof=None):
    if sizeof is None:
        from dask.sizeof import sizeof
    from ._core import DeviceNDArray, DeviceRecord

    sizeof.register(DeviceNDArray)(_sizeof_device)
    sizeof.register(DeviceRecord)(_sizeof_device)


def _register_distributed():
    from distributed.protocol.cuda import cuda_deserialize, cuda_serialize
    from distributed.protocol.serialize import (
        dask_deserialize,
        dask_serialize,
    )

    for t in _array_types():
        cuda_serialize.register(t)(cuda_serialize_array)
        cuda_deserialize.register(t)(cuda_deserialize_array)
        dask_serialize.register(t)(dask_serialize_array)
        dask_deserialize.register(t)(dask_deserialize_array)


def register():
    """Register cudamem's arrays with ``distributed``'s serialisers and
    ``dask.sizeof`` now (importing both)."""
    _register_sizeof()
    _register_distributed()


def _lazy_distributed():
    """Tell the loaded ``distributed`` dispatchers where cudamem's
    serialisers are, registered on first use of a cudamem type; False if
    ``distributed.protocol`` is not loaded yet."""
    ser = sys.modules.get("distributed.protocol.serialize")
    cuda = sys.modules.get("distributed.protocol.cuda")
    if ser is None or cuda is None \
            or not hasattr(cuda, "cuda_deserialize") \
            or not hasattr(ser, "dask_deserialize"):
        return False
    for dispatch in (ser.dask_serialize, ser.dask_deserialize,
                     cuda.cuda_serialize, cuda.cuda_deserialize):
        dispatch.register_lazy("cudamem")(_register_distributed)
    return True


class _AfterImport:
    """A meta-path finder that runs a hook right after a module has been
    executed (by wrapping that module's loader), once per module, and
    removes itself when it has no module left to wait for.  It lets
    cudamem register with dask and distributed when they are imported
    after cudamem, without importing them."""

    def __init__(self):
        self.hooks = {}

    def find_spec(self, name, path=None, target=None):
        hook = self.hooks.pop(name, None)
        if hook is None:
            return None
        if not self.hooks:
            self._remove()
        from importlib.machinery import PathFinder

        spec = PathFinder.find_spec(name, path, target)
        if spec is None or spec.loader is None \
                or not hasattr(spec.loader, "exec_module"):
            return spec
        spec.loader = _HookedLoader(spec.loader, hook)
        return spec

    def _remove(self):
        try:
            sys.meta_path.remove(self)
        except ValueError:
            pass


class _HookedLoader:
    """A loader that runs hook() after the wrapped loader's exec_module;
    a failing hook only loses the registration."""

    def __init__(self, loader, hook):
        self._loader = loader
        self._hook = hook

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        self._loader.exec_module(module)
        try:
            self._hook()
        except Exception:  # pragma: no cover - never break the import
            pass


def _after_import(name, hook):
    """Run hook() once module ``name`` has been imported (now if it is)."""
    for f in sys.meta_path:
        if isinstance(f, _AfterImport):
            finder = f
            break
    else:
        finder = _AfterImport()
        sys.meta_path.insert(0, finder)
    finder.hooks[name] = hook


def _arrange():
    """Registration without importing dask or distributed: at once for
    what is loaded, else right after it is."""
    if _lazy_distributed():
        pass
    elif "distributed.protocol" not in sys.modules:
        # (A partly executed one is left alone: its sizeof lazy hooks
        # register the serialisers on first use.)
        _after_import("distributed.protocol", _lazy_distributed)
    sizeof_mod = sys.modules.get("dask.sizeof")
    if sizeof_mod is not None:
        if hasattr(sizeof_mod, "sizeof"):
            _register_sizeof_lazily(sizeof_mod.sizeof)
    else:
        _after_import("dask.sizeof", _sizeof_hook)


def _sizeof_hook():
    _register_sizeof_lazily(sys.modules["dask.sizeof"].sizeof)


def _register_sizeof_lazily(sizeof):
    """sizeof's first look at a cudamem type registers sizeof and, if not
    done yet, the serialisers."""

    def register_all():
        _register_sizeof(sizeof)
        if "distributed.protocol.serialize" in sys.modules:
            _lazy_distributed()

    sizeof.register_lazy("cudamem")(register_all)


def _sizeof_entry_point(sizeof):
    """The ``dask.sizeof`` entry point: run by dask when ``dask.sizeof``
    is imported (so by every ``import dask``)."""
    _register_sizeof_lazily(sizeof)
    _arrange()


# ---------------------------------------------------------------------------
# Worker plugin
# ---------------------------------------------------------------------------


_plugin_class = None


def _make_plugin_class():
    """CudamemPlugin, made on first use: its base class is distributed's
    WorkerPlugin, and this module must not import distributed."""
    global _plugin_class
    if _plugin_class is not None:
        return _plugin_class
    from distributed import WorkerPlugin

    class CudamemPlugin(WorkerPlugin):
        """A ``distributed.WorkerPlugin`` that sets cudamem up on each
        worker.

        Parameters
        ----------
        manager : str or EMM plugin class, optional
            The memory manager of the worker's contexts (``"pool"`` by
            default; ``"default"``, ``"async"`` or a plugin class), given
            to ``cudamem.set_memory_manager``.  It applies to contexts
            made afterwards: register the plugin before the worker's
            first allocation.  None leaves the worker's choice alone.
        staging : dict, optional
            Settings of the host-transfer staging pipeline (``enabled``,
            ``threshold``, ``chunk``, ``buffers``, ``threads``, ``part``,
            ...), as ``CUDAMEM_STAGING_*`` would set them.

        Use ``client.register_plugin(CudamemPlugin())``.  Setting up also
        registers cudamem's serialisers on the worker.
        """

        name = "cudamem"

        def __init__(self, manager="pool", staging=None):
            self.manager = manager
            self.staging = dict(staging) if staging else None

        def setup(self, worker=None):
            from . import _core
            from ._emm import set_memory_manager

            if self.manager is not None:
                set_memory_manager(self.manager)
            if self.staging:
                _core._staging_config(**self.staging)
            register()

        def teardown(self, worker=None):
            pass

    CudamemPlugin.__module__ = __name__
    CudamemPlugin.__qualname__ = "CudamemPlugin"
    _plugin_class = CudamemPlugin
    return CudamemPlugin


def __getattr__(name):
    if name == "CudamemPlugin":
        return _make_plugin_class()
    raise AttributeError("module %r has no attribute %r" % (__name__, name))


def _on_import():
    """What importing this module does (cudamem's import does it): see
    :func:`_arrange`."""
    _arrange()


_on_import()
