# SPDX-License-Identifier: MIT
"""CUDA IPC: exporting a device array (in this process) and opening +
closing the handle (in a spawned child: a handle cannot be opened in the
process that exported it).

``OPS`` times the export with the harness.  ``run_extra`` times the open +
close round trip inside one child process per library (the child uses the
harness's timer and sends back its numbers), so pipe latency is not part
of it.  Run alone with ``python benchmarks/ops_ipc.py``.
"""

import multiprocessing
import pathlib
import pickle
import sys

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

import harness  # noqa: E402

N = 1 << 18  # float32 elements: 1 MiB


# ---------------------------------------------------------------------------
# Export, in this process
# ---------------------------------------------------------------------------


def _export_array(lib):
    a = lib.device_array(N, np.float32)
    return lambda: a.get_ipc_handle()


def _export_cupy(cp):
    a = cp.empty(N, np.float32)
    ptr = a.data.ptr
    return lambda: cp.cuda.runtime.ipcGetMemHandle(ptr)


def _export_driver(core):
    import cudamem

    a = cudamem.device_array(N, np.float32)
    ctx = cudamem.current_context()
    ptr = a.device_ctypes_pointer.value
    return lambda: core._ipc_export(ctx, ptr)


OPS = [
    {"name": "ipc export (1 MiB array)",
     "impls": {"cudamem": _export_array, "numba": _export_array,
               "cupy": _export_cupy, "driver": _export_driver}},
]


# ---------------------------------------------------------------------------
# Open + close, in a child
# ---------------------------------------------------------------------------


def _child(lib_name, payload, repeats, conn):
    """Load lib_name, time open + close of payload, send the result."""
    try:
        lib = harness.load_lib(lib_name)
        if lib is None:
            raise harness.Skip("%s is not usable in the child" % lib_name)
        if lib_name == "cupy":
            rt = lib.cuda.runtime

            def fn():
                rt.ipcCloseMemHandle(rt.ipcOpenMemHandle(payload))
        elif lib_name == "driver":
            import cudamem

            ctx = cudamem.current_context()
            raw, size = payload

            def fn():
                lib._ipc_open(ctx, raw, size).close()
        else:
            h = pickle.loads(payload)

            def fn():
                h.open()
                h.close()
        conn.send(("ok", harness.time_callable(fn, repeats=repeats)))
    except BaseException as e:  # noqa: BLE001 - reported to the parent
        conn.send(("err", "%s: %s" % (type(e).__name__, str(e)[:120])))
    conn.close()


def _payload(lib_name, lib, keep):
    """What the child needs to open a 1 MiB array of lib_name; keep holds
    the exporting objects alive."""
    if lib_name == "cupy":
        a = lib.empty(N, np.float32)
        keep.append(a)
        return lib.cuda.runtime.ipcGetMemHandle(a.data.ptr)
    if lib_name == "driver":
        import cudamem

        a = cudamem.device_array(N, np.float32)
        keep.append(a)
        raw, _, _ = lib._ipc_export(cudamem.current_context(),
                                    a.device_ctypes_pointer.value)
        return raw, a.nbytes
    a = lib.device_array(N, np.float32)
    keep.append(a)
    return pickle.dumps(a.get_ipc_handle())


def run_extra(libs, select=None, repeats=None):
    """Rows for the table: open + close of an exported array, timed in a
    spawned child per library."""
    name = "ipc open+close in a child (1 MiB)"
    if select and not any(s in name for s in select):
        return []
    row = {"op": name, "unit": "us", "bytes": None, "times": {}}
    spawn = multiprocessing.get_context("spawn")
    for lib_name in ("cudamem", "numba", "cupy", "driver"):
        lib = libs.get(lib_name)
        if lib is None:
            continue
        keep = []
        try:
            payload = _payload(lib_name, lib, keep)
            ours, theirs = spawn.Pipe()
            p = spawn.Process(target=_child,
                              args=(lib_name, payload, repeats, theirs))
            p.start()
            theirs.close()
            if not ours.poll(300):
                p.kill()
                raise TimeoutError("the child did not answer")
            status, value = ours.recv()
            p.join(60)
            if status == "ok":
                row["times"][lib_name] = value
            else:
                row.setdefault("errors", {})[lib_name] = value
        except Exception as e:  # noqa: BLE001 - reported, not fatal
            row.setdefault("errors", {})[lib_name] = "%s: %s" % (
                type(e).__name__, str(e)[:120])
        finally:
            del keep
    return [row]


def main():
    libs = {name: harness.load_lib(name) for name in harness.LIBS}
    rows = harness.run_ops(OPS, libs) + run_extra(libs)
    print(harness.format_table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
