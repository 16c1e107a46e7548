# SPDX-License-Identifier: MIT
"""The importing side of test_ipc.py: run in spawned child processes,
which inherit CUDAMEM_SIMULATOR from the parent's environment."""

import ctypes
import os
import pickle

import numpy as np


def _drop_capability(cap):
    """Remove capability cap from this process's effective and permitted
    sets (capset(2), version 3 headers)."""

    class Header(ctypes.Structure):
        _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]

    class Data(ctypes.Structure):
        _fields_ = [("effective", ctypes.c_uint32),
                    ("permitted", ctypes.c_uint32),
                    ("inheritable", ctypes.c_uint32)]

    libc = ctypes.CDLL(None, use_errno=True)
    hdr = Header(0x20080522, 0)
    data = (Data * 2)()
    if libc.capget(ctypes.byref(hdr), data) != 0:
        raise OSError(ctypes.get_errno(), "capget")
    word, bit = divmod(cap, 32)
    data[word].effective &= ~(1 << bit)
    data[word].permitted &= ~(1 << bit)
    if libc.capset(ctypes.byref(hdr), data) != 0:
        raise OSError(ctypes.get_errno(), "capset")


def _ops():
    import cudamem as cuda
    from cudamem import _core

    def read(h):
        with h as arr:
            return arr.copy_to_host()

    def add(h, value):
        with h as arr:
            arr.copy_to_device(arr.copy_to_host() + value)
            cuda.synchronize()

    def open_(h):
        h.open()
        h.close()

    def open_twice(h):
        h.open()
        try:
            h.open()
        finally:
            h.close()

    def close_twice(h):
        h.open()
        h.close()
        h.close()

    def two_copies(h):
        h2 = pickle.loads(pickle.dumps(h))
        a1 = h.open()
        a2 = h2.open()
        same = (a1.device_ctypes_pointer.value
                == a2.device_ctypes_pointer.value)
        h.close()
        # Still mapped for the second open.
        values = a2.copy_to_host()
        h2.close()
        return same, values

    def dead_after_close(h):
        arr = h.open()
        h.close()
        arr.copy_to_host()

    def raw(handle, shape, dtype, strides, offset):
        with cuda.open_ipc_array(handle, shape, dtype, strides=strides,
                                 offset=offset) as arr:
            return arr.copy_to_host()

    def raw_raises(handle, shape, dtype):
        keep = None
        try:
            with cuda.open_ipc_array(handle, shape, dtype) as arr:
                keep = arr
                raise KeyError("in the block")
        except KeyError:
            pass
        # The block's exit closed the mapping (Q6): the array is dead.
        keep.copy_to_host()

    def ipch_read(ipch, dtype, count):
        ctx = _core.current_context()
        ptr = ipch.open(ctx)
        dt = np.dtype(dtype)
        arr = cuda.DeviceNDArray((count,), (dt.itemsize,), dt, gpu_data=ptr)
        try:
            return arr.copy_to_host()
        finally:
            ipch.close()

    def drop_unclosed(h):
        # Never closed: the mapping's owner queues the close when it goes.
        arr = h.open()
        first = float(arr.copy_to_host()[0])
        del arr
        h._ipc_handle._impl = None
        mm = _core.current_context().memory_manager
        pending = len(mm.deallocations)
        mm.reset()
        return first, pending, len(mm.deallocations)

    def open_on_device(ipch, dtype, count, dev):
        # Import into device dev's context, whatever the exporter's was:
        # mapped directly with peer access, else copied (open_staged).
        # Device 0 is the thread's device throughout.
        _core.current_context(0)
        with cuda.gpus[dev]:
            ctx = _core.current_context()
            ptr = ipch.open(ctx)
            dt = np.dtype(dtype)
            arr = cuda.DeviceNDArray((count,), (dt.itemsize,), dt,
                                     gpu_data=ptr)
            how = type(ipch._impl).__name__
        try:
            return (how, arr.__dlpack_device__(), arr.copy_to_host(),
                    _core._current_device_id())
        finally:
            ipch.close()

    def fds():
        # The process's open file descriptors: a failed import must close
        # what it took, and a closed one give its imported pool back.
        return len(os.listdir("/proc/self/fd"))

    def inject(name, nth, code):
        _core._sim_inject(name, nth, code)

    def open_failing(h, name, nth, code):
        # Open with the nth call of a driver entry point failing; the
        # error, and the descriptors open before and after.
        before = fds()
        _core._sim_inject(name, nth, code)
        try:
            h.open()
        except Exception as e:  # noqa: BLE001 - reported to the parent
            err = (type(e).__name__, str(e))
        else:
            h.close()
            err = None
        finally:
            _core._sim_inject(name, 0, 0)
        return err, before, fds()

    def drop_ptrace():
        # Give up CAP_SYS_PTRACE: a root process may otherwise take any
        # process's file descriptors.
        _drop_capability(19)

    return {
        "fds": fds, "inject": inject, "open_failing": open_failing,
        "drop_ptrace": drop_ptrace,
        "drop_unclosed": drop_unclosed,
        "open_on_device": open_on_device,
        "read": read, "add": add, "open": open_, "open_twice": open_twice,
        "close_twice": close_twice, "two_copies": two_copies,
        "dead_after_close": dead_after_close, "raw": raw,
        "raw_raises": raw_raises, "ipch_read": ipch_read,
    }


def serve(conn):
    """Answer (op, *args) requests until None: ("ok", result) or
    ("err", exception type name, message)."""
    ops = _ops()
    while True:
        msg = conn.recv()
        if msg is None:
            break
        try:
            conn.send(("ok", ops[msg[0]](*msg[1:])))
        except BaseException as e:  # noqa: BLE001 - reported to the parent
            conn.send(("err", type(e).__name__, str(e)))
    conn.close()


def read_and_write(q_in, q_out):
    """One round through Queues: read the array, add 1 to it."""
    import cudamem as cuda

    h = q_in.get()
    with h as arr:
        host = arr.copy_to_host()
        arr.copy_to_device(host + 1)
        cuda.synchronize()
    q_out.put(host)
