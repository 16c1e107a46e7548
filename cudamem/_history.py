# SPDX-License-Identifier: MIT
"""The memory history and the memory snapshot.

``memory_history()`` turns on a ring buffer in C (csrc/memory/history.c) that
records every allocation and free of device, pinned, mapped and managed
memory made through cudamem; ``memory_snapshot()`` gathers that record,
the blocks alive now and the pool manager's segments into a plain dict;
``dump_snapshot()`` writes it as JSON, the input of
``python -m cudamem memviz``.
"""

import gc
import json
import os
import time
from typing import Any, Optional, Union

from . import _core

__all__ = ["dump_snapshot", "memory_history", "memory_snapshot"]

SNAPSHOT_VERSION = 1


def memory_history(enabled: bool = True, stacks: bool = False,
                   max_entries: int = 100_000) -> None:
    """Record every allocation and free of cudamem's memory.

    Parameters
    ----------
    enabled : bool
        True starts a fresh record (what an earlier one held is dropped);
        False stops recording and keeps what was recorded for
        :func:`memory_snapshot`.
    stacks : bool
        Also keep the Python stack of the code that allocated or freed
        (at most 32 frames, innermost first).  Costs a few microseconds
        per event.
    max_entries : int
        Size of the ring buffer: past it the oldest events are overwritten
        (the snapshot counts them as ``dropped``).

    Notes
    -----
    Not in numba.cuda.  Each event holds its time, ``action`` ('alloc',
    'free', or 'oom' for a failed allocation), ``kind`` ('device',
    'pinned', 'mapped', 'managed'), the context's memory ``manager``, the
    device, the stream the memory was allocated for (its raw handle; 0
    for the default stream and for host memory), the address and the
    size asked for.  Memory of a plugin memory manager (an EMM plugin) is
    the plugin's and is not recorded.
    """
    if isinstance(max_entries, bool) or not isinstance(max_entries, int):
        raise TypeError("max_entries must be an int, not %s"
                        % type(max_entries).__name__)
    _core._history_enable(bool(enabled), bool(stacks), max_entries)


def _stack_list(stack):
    if stack is None:
        return None
    return [{"filename": f, "line": ln, "function": fn}
            for f, ln, fn in stack]


def _entries(now_ns, now_wall):
    out = []
    for (seq, t_ns, action, kind, manager, device, stream, addr, size,
         stack) in _core._history_entries():
        out.append({
            "seq": seq,
            "time_ns": t_ns,
            "time": now_wall - (now_ns - t_ns) / 1e9,
            "action": action,
            "kind": kind,
            "manager": manager,
            "device": device,
            "stream": stream,
            "address": addr,
            "size": size,
            "stack": _stack_list(stack),
        })
    return out


def _live_blocks():
    """Every allocation alive now, found among the objects the garbage
    collector tracks (both owner types are)."""
    device_alloc = _core.DeviceAllocation
    host_alloc = _core.HostAllocation
    blocks = []
    for o in gc.get_objects():
        t = type(o)
        if t is device_alloc:
            info = _core._allocation_info(o)
            if info is None:
                continue
            addr, size, manager, stream, device = info
            blocks.append({"kind": "device", "device": device,
                           "manager": manager, "stream": stream,
                           "address": addr, "size": size})
        elif t is host_alloc:
            try:
                addr = o.host_pointer
                size = o.size
                kind = o.kind
                ctx = o.context
            except Exception:  # noqa: BLE001 - closed or foreign
                continue
            if not addr:
                continue
            if kind == "managed":
                addr = o.device_pointer
            blocks.append({"kind": kind, "device": ctx.device.id,
                           "manager": None, "stream": 0,
                           "address": addr, "size": size,
                           "pooled": bool(o.pooled)})
    return blocks


def _device_part(ctx):
    dev = ctx.device.id
    try:
        stats = _core.memory_stats(dev)
    except Exception:  # noqa: BLE001 - a closed context
        return None
    try:
        pinned = _core.pinned_pool_stats(dev)
    except Exception:  # noqa: BLE001
        pinned = None
    return {
        "device": dev,
        "manager": stats.get("manager"),
        "stats": stats,
        "segments": _core._pool_segments(ctx),
        "pinned_pool": pinned,
    }


def memory_snapshot() -> dict[str, Any]:
    """Where cudamem's memory is now, as a plain dict (JSON-ready).

    Returns
    -------
    dict
        ``version``; ``backend`` ('driver' or 'simulator'); ``time`` (the
        wall clock, seconds); ``devices``: per device with a context, its
        ``manager``, ``stats`` (as :func:`memory_stats`), the pool
        manager's ``segments`` (each with ``base``, ``size``, ``small``
        and ``blocks``: [address, size, 'used' | 'free' | 'pending'];
        an arena of the pool on virtual memory adds ``page_size`` and
        ``mapped``, the [start, end) address runs with memory mapped)
        and ``pinned_pool`` (as :func:`pinned_pool_stats`); ``live``:
        every allocation alive now (kind, device, manager, stream,
        address, size, and, when the history recorded it, ``time`` and
        ``stack``); ``history``: the state of :func:`memory_history` and
        its ``entries``, oldest first.

    Notes
    -----
    Not in numba.cuda.  For every device, the device blocks of ``live``
    (with its managed ones) add up to ``stats['allocated_bytes']``.  The
    live allocations are found among the objects the garbage collector
    tracks, so a snapshot of a large program takes some milliseconds;
    memory of a plugin memory manager is not listed.
    """
    state = _core._history_state()
    now_wall = time.time()
    entries = _entries(state["now_ns"], now_wall)
    blocks = _live_blocks()
    contexts = _core._live_contexts()
    # Attach to each live block the latest allocation of its address.
    last = {}
    for e in entries:
        if e["action"] == "alloc":
            last[(e["kind"], e["device"], e["address"])] = e
        elif e["action"] == "free":
            last.pop((e["kind"], e["device"], e["address"]), None)
    for b in blocks:
        e = last.get((b["kind"], b["device"], b["address"]))
        b["time"] = e["time"] if e is not None else None
        b["stack"] = e["stack"] if e is not None else None
    blocks.sort(key=lambda b: (-b["size"], b["address"]))
    devices = {}
    for ctx in contexts:
        dev = ctx.device.id
        if dev in devices:
            continue
        part = _device_part(ctx)
        if part is not None:
            devices[dev] = part
    return {
        "version": SNAPSHOT_VERSION,
        "backend": _core._backend(),
        "time": now_wall,
        "devices": [devices[d] for d in sorted(devices)],
        "live": blocks,
        "history": {
            "enabled": state["enabled"],
            "stacks": state["stacks"],
            "max_entries": state["max_entries"],
            "recorded": state["recorded"],
            "dropped": state["dropped"],
            "entries": entries,
        },
    }


def dump_snapshot(path: Union[str, os.PathLike[str]],
                  snapshot: Optional[dict[str, Any]] = None) -> str:
    """Write :func:`memory_snapshot` (or ``snapshot``) to ``path`` as JSON.

    The file is what ``python -m cudamem memviz`` reads.  Returns the
    path.
    """
    if snapshot is None:
        snapshot = memory_snapshot()
    path = os.fspath(path)
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(snapshot, f)
    os.replace(tmp, path)
    return path
