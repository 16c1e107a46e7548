# SPDX-License-Identifier: MIT
"""The importing side of the IPC tests (test_ipc.py, test_pool_vmm.py):
run in spawned child processes, which inherit CUDAMEM_SIMULATOR from the
parent's environment; ``Child`` starts one and calls its operations."""

import ctypes
import multiprocessing
import os
import pickle

import numpy as np

SPAWN = multiprocessing.get_context("spawn")


class Child:
    """A spawned process that opens what the parent sends it."""

    def __init__(self):
        self.conn, theirs = SPAWN.Pipe()
        self.proc = SPAWN.Process(target=serve, args=(theirs,))
        self.proc.start()
        theirs.close()

    def call(self, op, *args):
        import cudamem as cuda

        # Nothing orders the other process after this one's queued work,
        # and a small to_device returns before its data lands (as the
        # driver's copy of pageable memory does): the H200, with eight
        # test processes sharing it, once had the child read zeros.
        cuda.synchronize()
        self.conn.send((op,) + args)
        if not self.conn.poll(60):
            raise TimeoutError("the child did not answer %s" % op)
        r = self.conn.recv()
        if r[0] == "ok":
            return r[1]
        return Failure(r[1], r[2])

    def stop(self):
        self.conn.send(None)
        self.proc.join(30)
        if self.proc.is_alive():
            self.proc.kill()


class Failure:
    """An exception raised in the child: its type name and message."""

    def __init__(self, name, message):
        self.name = name
        self.message = message

    def __repr__(self):
        return "Failure(%s: %s)" % (self.name, self.message)


def expect_failure(r, name, text):
    assert isinstance(r, Failure), r
    assert r.name == name, r
    assert text in r.message, r


def open_on_device_1(monkeypatch, no_peer, simulator):
    """An array of device 0's current manager exported and opened in a
    child on device 1: mapped there (given access), or without peer
    access (the simulator's CUDAMEM_SIM_NO_PEER) copied through device 0.
    Checks the values, that device 0 stays the child's current device and
    how it was opened; returns (how, the DLPack device).  Skips without
    two devices, or for no_peer on a GPU."""
    import pytest

    import cudamem

    if no_peer:
        if not simulator:
            pytest.skip("needs CUDAMEM_SIM_NO_PEER")
        monkeypatch.setenv("CUDAMEM_SIM_NO_PEER", "0-1")
    if len(cudamem.gpus) < 2:
        pytest.skip("needs 2 devices")
    a = cudamem.to_device(np.arange(16, dtype=np.float32))
    h = a.get_ipc_handle()
    c = Child()
    try:
        r = c.call("open_on_device", h.ipc_handle, np.float32, 16, 1)
    finally:
        c.stop()
    assert not hasattr(r, "message"), r
    how, dldev, values, cur = r
    np.testing.assert_array_equal(values, np.arange(16, dtype=np.float32))
    assert cur == 0
    if no_peer:
        assert how == "_StagedOpen"
    else:
        assert how == ("_DirectOpen" if cudamem.can_access_peer(1, 0)
                       else "_StagedOpen")
    return how, tuple(dldev)


def sim_page_fds():
    """This process's descriptors of simulated pool pages (the pages'
    memory, and descriptors exported from or imported into it)."""
    n = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            n += "cudamem-sim-vmm" in os.readlink("/proc/self/fd/" + fd)
        except OSError:
            pass
    return n


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

    held = {}

    def hold(key, h):
        # Open h and keep it open under key (the exporter changes things
        # meanwhile); the values it reads now.
        arr = h.open()
        held[key] = (h, arr)
        return arr.copy_to_host()

    def read_held(key):
        return held[key][1].copy_to_host()

    def add_held(key, value):
        arr = held[key][1]
        arr.copy_to_device(arr.copy_to_host() + value)
        cuda.synchronize()

    def release(key):
        h, _ = held.pop(key)
        h.close()

    def close_context_holding(h):
        # Close the context while h is open in it: what it maps goes with
        # it; the handle's close afterwards frees what is left.  Then a
        # context again, so that the descriptors counted after are those
        # of a process with a context, as before: on a GPU the driver
        # holds about 20 of its own per context (an H200: 42 open with
        # one, 22 after its close).
        arr = h.open()
        first = arr.copy_to_host()
        cuda.close()
        h.close()
        cuda.current_context()
        return first

    def cai(h):
        # The CUDA Array Interface of the opened array: its pointer and
        # shape, and the mapping's own pointer.
        with h as arr:
            cai = arr.__cuda_array_interface__
            return (cai["data"][0], cai["shape"],
                    arr.gpu_data.device_pointer)

    return {
        "fds": fds, "inject": inject, "open_failing": open_failing,
        "drop_ptrace": drop_ptrace, "hold": hold, "read_held": read_held,
        "add_held": add_held, "release": release,
        "close_context_holding": close_context_holding, "cai": cai,
        "imported_pages": sim_page_fds,
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
