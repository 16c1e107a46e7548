# SPDX-License-Identifier: MIT
"""Fuzz the import side of CUDA IPC: ``pickle.loads`` of mutated pickles
of a real ``IpcArrayHandle`` (exported by a child process that lives as
long as the harness), ``IpcHandle`` / ``IpcArrayHandle`` built from
fuzzed bytes, sizes, offsets, source infos, pools and array
descriptions, and ``open_ipc_array``; every handle that loads is opened,
read and closed.

Pickles are loaded with an unpickler that resolves only the classes a
handle's pickle names (cudamem's IPC classes, NumPy's dtype and array
reconstruction, copyreg's): a mutated pickle must not call arbitrary
functions of this process.

Expected exceptions: TypeError, ValueError, IndexError, OverflowError,
KeyError (an array description without a key), MemoryError,
CudaAPIError (the driver refusing a handle), RuntimeError (numba's "No
device of ... is found", "IPC handle doesn't have source info"), OSError
(a memory-pool export whose exporter is gone), and from the pickle
machinery itself pickle.UnpicklingError, EOFError, AttributeError,
UnicodeDecodeError.

Oracle: a handle whose bytes and description are the exported ones
opens and reads exactly the exported data; ``close()`` after a
successful open works, and a second ``close()`` raises ValueError.
"""

import atexit
import base64
import io
import os
import pickle
import pickletools
import subprocess
import sys
import traceback

import numpy as np

from _common import CLEAN, cuda, main, pick, small_int

EXPECTED = CLEAN + (KeyError, cuda.CudaAPIError, RuntimeError, OSError)
LOAD_ERRORS = EXPECTED + (pickle.UnpicklingError, EOFError, AttributeError,
                          UnicodeDecodeError)
DATA = np.arange(10, dtype=np.float64)

_EXPORTER = r"""
import base64, pickle, sys
import numpy as np
import cudamem as cuda
d = cuda.to_device(np.arange(10, dtype=np.float64))
h = d.get_ipc_handle()
sys.stdout.write(base64.b64encode(pickle.dumps(h)).decode() + "\n")
sys.stdout.flush()
sys.stdin.read()
"""
_child = None
_pickled = None


def exported():
    """The pickle of a live export of another process."""
    global _child, _pickled
    if _pickled is None:
        env = dict(os.environ)
        env.pop("CUDAMEM_FUZZ_LAST_INPUT", None)
        _child = subprocess.Popen([sys.executable, "-c", _EXPORTER],
                                  stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, env=env)
        _pickled = base64.b64decode(_child.stdout.readline())
        assert _pickled, "the exporter gave no handle"
        atexit.register(_child.stdin.close)
    return _pickled


ALLOWED = {
    ("cudamem._ipc", "IpcArrayHandle"), ("cudamem._ipc", "IpcHandle"),
    ("cudamem._ipc", "_rebuild_ipc_handle"), ("cudamem._ipc", "_RawHandle"),
    ("numpy", "dtype"), ("numpy.core.multiarray", "_reconstruct"),
    ("numpy._core.multiarray", "_reconstruct"), ("numpy", "ndarray"),
    ("copyreg", "_reconstructor"), ("builtins", "object"),
    ("builtins", "dict"), ("builtins", "tuple"), ("builtins", "bytes"),
}


class Loader(pickle.Unpickler):
    def find_class(self, module, name):
        if (module, name) not in ALLOWED:
            raise pickle.UnpicklingError("%s.%s is not allowed here"
                                         % (module, name))
        return super().find_class(module, name)


# NumPy's dtype.__setstate__ trusts the state tuple: a mutated one (a
# 6-tuple whose "subarray" is an int, say) kills the process inside
# NumPy, with or without cudamem loaded:
#   pickle.loads(b"\x80\x04\x8c\x05numpy\x94\x8c\x05dtype\x94\x93\x94"
#                b"\x8c\x02f8\x94\x89\x88\x87\x94R\x94(K\x03\x8c\x01<\x94"
#                b"MNNJ\xff\xff\xff\xffJ\xff\xff\xff\xffK\x00t\x94b.")
# is SIGSEGV.  That is NumPy's parser, not cudamem's, so a pickle is
# first loaded dry, every class it names replaced by a stand-in, and
# skipped unless each dtype in it is given the very state NumPy writes
# for that dtype.  The dtype's arguments (its type string) may still be
# mutated: those reach cudamem.
class _Stand:
    def __init__(self, *args, **kwargs):
        self.args = args

    def __setstate__(self, state):
        pass


class _DtypeStand(_Stand):
    def __setstate__(self, state):
        try:
            want = np.dtype(*getattr(self, "args", ())).__reduce__()[2]
        except Exception:
            want = None
        if want is None or type(state) is not tuple or state != want:
            raise pickle.UnpicklingError("a dtype state NumPy did not write")


class DryLoader(pickle.Unpickler):
    def find_class(self, module, name):
        if (module, name) not in ALLOWED:
            raise pickle.UnpicklingError("%s.%s is not allowed here"
                                         % (module, name))
        return _DtypeStand if (module, name) == ("numpy", "dtype") else _Stand


def numpy_safe(data):
    """Whether loading ``data`` gives NumPy's dtype parser only states
    NumPy wrote (see _DtypeStand)."""
    try:
        DryLoader(io.BytesIO(data)).load()
    except pickle.UnpicklingError as e:
        return "dtype state" not in str(e)
    except Exception:
        pass
    return True


def mutate(fdp, raw):
    b = bytearray(raw)
    for _ in range(fdp.ConsumeIntInRange(0, 4)):
        if not b:
            break
        op = fdp.ConsumeIntInRange(0, 3)
        i = fdp.ConsumeIntInRange(0, len(b) - 1)
        if op == 0:
            b[i] = fdp.ConsumeIntInRange(0, 255)
        elif op == 1:
            del b[i:i + fdp.ConsumeIntInRange(1, 8)]
        elif op == 2:
            b[i:i] = fdp.ConsumeBytes(fdp.ConsumeIntInRange(1, 8))
        else:
            b[i] ^= 1 << fdp.ConsumeIntInRange(0, 7)
    return bytes(b)


def try_open(h, exact):
    try:
        arr = h.open()
    except EXPECTED:
        return
    try:
        got = arr.copy_to_host() if arr.size else None
        if exact:
            np.testing.assert_array_equal(got, DATA)
    except EXPECTED:
        pass
    finally:
        del arr
        h.close()
    try:
        h.close()
    except ValueError:
        pass
    else:
        raise AssertionError("a second close() of an IPC handle worked")


def from_pickle(fdp):
    raw = exported()
    data = mutate(fdp, raw)
    try:
        # The pickle's own framing first: a length field that points past
        # the end makes the unpickler allocate it whole, and a memo index
        # makes it grow its memo that far (CPython's business, not
        # cudamem's); pickletools reads both without allocating.
        for op, arg, _ in pickletools.genops(data):
            if op.name in ("PUT", "BINPUT", "LONG_BINPUT") and arg > 4096:
                return  # the unpickler grows its memo to the index
    except Exception:
        return
    if not numpy_safe(data):
        return
    try:
        h = Loader(io.BytesIO(data)).load()
    except LOAD_ERRORS:
        return
    except SystemError as e:
        # NumPy's dtype.__setstate__ raises SystemError on some malformed
        # states: NumPy's parser, not cudamem's.  One raised in cudamem's
        # reconstruction code is still a finding.
        tb = traceback.extract_tb(e.__traceback__)
        if any("cudamem" in fr.filename for fr in tb):
            raise
        return
    if isinstance(h, cuda.IpcArrayHandle):
        try_open(h, exact=data == raw)


def from_parts(fdp):
    ref = pickle.loads(exported())
    raw = bytes(ref.handle)
    kind = fdp.ConsumeIntInRange(0, 4)
    if kind == 0:
        handle = mutate(fdp, raw)
    elif kind == 1:
        handle = pick(fdp, (b"", b"\0" * 64, list(raw), raw[:63], None, 5,
                            "x" * 64, [300] * 64, bytearray(raw),
                            memoryview(raw)))
    else:
        handle = raw
    size = pick(fdp, (80, 80, 0, 1, 8, 81, -1, 2**63, 2**64, "80", None))
    offset = small_int(fdp, -8, 96)
    source = pick(fdp, (ref.source_info, ref.source_info, None, {},
                        {"pci_bus_id": 99}, "x"))
    pool = pick(fdp, (None, None, None, (os.getpid(), 0, 1), (1, 2),
                      "pool", (2**70, 0, 0)))
    try:
        ipch = cuda.IpcHandle(None, handle, size, source_info=source,
                              offset=offset, pool=pool)
    except EXPECTED:
        return
    shape = pick(fdp, ((10,), (10,), (5, 2), (11,), (0,), (-1,), 10, (),
                       (2**62,), (10.0,)))
    dtype = pick(fdp, ("f8", "f8", "u1", "V0", "c16", "O", "bogus"))
    strides = pick(fdp, (None, None, (8,), (-8,), (0,), (16, 8), 8))
    if fdp.ConsumeBool():
        desc = {"shape": shape, "strides": strides, "dtype": dtype}
        for k in ("shape", "strides", "dtype"):
            if fdp.ConsumeIntInRange(0, 15) == 0:
                del desc[k]
        try:
            h = cuda.IpcArrayHandle(ipch, desc)
        except EXPECTED:
            return
        exact = (handle == raw and size == 80 and offset == 0
                 and source == ref.source_info and pool is None
                 and shape == (10,) and dtype == "f8"
                 and strides in (None, (8,)))
        try_open(h, exact)
        return
    try:
        with cuda.open_ipc_array(handle, shape, dtype, strides=strides,
                                 offset=offset) as arr:
            if arr.size:
                arr.copy_to_host()
    except EXPECTED:
        pass


def TestOneInput(data):
    import atheris

    fdp = atheris.FuzzedDataProvider(data)
    if fdp.ConsumeBool():
        from_pickle(fdp)
    else:
        from_parts(fdp)


if __name__ == "__main__":
    main(TestOneInput)
