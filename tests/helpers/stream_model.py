# SPDX-License-Identifier: MIT
"""Model-based check of stream ordering and memory reuse.

A seeded generator writes random programs over a few streams: device
arrays allocated for a stream (some of a size freed just before),
host-to-device and device-to-host copies through page-locked buffers,
device-to-device assignments, scalar fills, frees at random moments,
streams held and released by gates, and uses on another stream ordered
either by an event or by synchronising the stream that used the array
last.  Every program is race-free as written, so the value of each
read-back is defined: a plain NumPy model, run in program order, gives
it.  The program runs under cudamem and every read-back is compared with
the model once all streams are idle.  A failing program is shrunk to a
minimal one, printed with its seed.

Run as a script in a fresh process (the manager is chosen before the
first context is made):

    python tests/helpers/stream_model.py MANAGER PROGRAMS [FIRST_SEED]

MANAGER is default, pool, pool-vmm (the pool on virtual memory, with
arrays of more than a page as well; the test sets
CUDAMEM_POOL_RELEASE_THRESHOLD and _INTERVAL to 0), async or plugin.
Gates are used only under pool, pool-vmm and async: under the
default manager and a plugin a release calls cuMemFree, which waits for
the device and so for a held gate; there the simulator's
CUDAMEM_SIM_DELAY_US keeps work pending instead.  Exit status 0 when
every program matched; 1 with the report on stderr.
"""

import gc
import random
import sys
import threading

import numpy as np

SIZES = [1, 3, 512, 4096, 65536, 300000]
# Under the pool on virtual memory also arrays of more than a page (2 MiB
# on the simulator and an H200), across page boundaries: they are placed
# over idle pages where they can, and pages move between them.
SIZES_VMM = SIZES + [3 << 20, (5 << 20) + 512]
GATE_TIMEOUT = 30.0


class Gate:
    def __init__(self):
        self._open = threading.Event()
        self.timed_out = False

    def _callback(self, stream, status, arg):
        if not self._open.wait(GATE_TIMEOUT):
            self.timed_out = True

    def block(self, stream):
        stream.add_callback(self._callback)

    def open(self):
        self._open.set()


def generate(seed, gates, sizes=SIZES):
    """A program: a list of op tuples.  Arrays are named by integers;
    each op names the stream it runs on; new arrays take one of sizes."""
    rnd = random.Random(seed)
    nstreams = rnd.randint(3, 6)
    ops = []
    live = {}          # name -> (size, last stream used)
    freed_sizes = []
    held = {}          # stream -> gate name (at most one at a time: the
    #                    driver may run every host callback on one thread)
    blocked = set()    # streams that wait, directly or not, for the gate
    next_name = 0
    next_gate = 0
    for _ in range(rnd.randint(10, 40)):
        k = rnd.random()
        free_streams = [s for s in range(nstreams) if s not in held]
        if k < 0.2 or not live:
            if freed_sizes and rnd.random() < 0.5:
                size = rnd.choice(freed_sizes)
            else:
                size = rnd.choice(sizes)
            s = rnd.randrange(nstreams)
            ops.append(("alloc", next_name, size, s, rnd.randrange(1 << 30)))
            live[next_name] = (size, s)
            next_name += 1
            continue
        if gates and k < 0.3:
            if held:
                s = rnd.choice(sorted(held))
                ops.append(("open", held.pop(s), s))
                blocked.clear()
            elif free_streams:
                s = rnd.choice(free_streams)
                ops.append(("hold", next_gate, s))
                held[s] = next_gate
                blocked.add(s)
                next_gate += 1
            continue
        name = rnd.choice(sorted(live))
        size, last = live[name]
        if k < 0.4:
            ops.append(("free", name))
            del live[name]
            freed_sizes.append(size)
            continue
        s = rnd.randrange(nstreams)
        others = []
        if k >= 0.75:
            # device to device: a second array of the same size
            same = [n for n in live if n != name and live[n][0] == size]
            if not same:
                continue
            others = [rnd.choice(same)]
        for n in [name] + others:
            prev = live[n][1]
            if prev != s:
                # order after the stream that used it last: an event, or
                # (when that stream is not held) waiting for it
                if prev in blocked or rnd.random() < 0.6:
                    ops.append(("wait", prev, s))
                    if prev in blocked:
                        blocked.add(s)
                else:
                    ops.append(("sync", prev))
            live[n] = (live[n][0], s)
        if k < 0.55:
            ops.append(("h2d", name, s, rnd.randrange(1 << 30)))
        elif k < 0.65:
            ops.append(("d2h", name, s))
        elif k < 0.75:
            ops.append(("fill", name, s, rnd.randrange(256)))
        else:
            ops.append(("d2d", others[0], name, s))
    for s in sorted(held):
        ops.append(("open", held[s], s))
    return nstreams, ops


def well_formed(nstreams, ops):
    """Whether a (shrunk) program still names only live arrays, holds
    one stream at a time, opens every gate it holds and waits on the host
    for no stream that waits for a held one."""
    live = set()
    held = {}
    blocked = set()
    for op in ops:
        kind = op[0]
        if kind == "alloc":
            live.add(op[1])
        elif kind == "free":
            if op[1] not in live:
                return False
            live.discard(op[1])
        elif kind in ("h2d", "d2h", "fill"):
            if op[1] not in live:
                return False
        elif kind == "d2d":
            if op[1] not in live or op[2] not in live:
                return False
        elif kind == "hold":
            if held:
                return False
            held[op[2]] = op[1]
            blocked.add(op[2])
        elif kind == "open":
            if held.get(op[2]) != op[1]:
                return False
            del held[op[2]]
            blocked.clear()
        elif kind == "wait":
            if op[1] in blocked:
                blocked.add(op[2])
        elif kind == "sync":
            if op[1] in blocked:
                return False
    return not held


def run(cuda, nstreams, ops):
    """Run a program; a list of mismatches (empty when it matched)."""
    streams = [cuda.stream() for _ in range(nstreams)]
    model = {}
    arrays = {}
    keep = []          # page-locked host buffers of queued copies
    reads = []         # (op index, pinned buffer, expected)
    gates = {}
    try:
        for i, op in enumerate(ops):
            kind = op[0]
            if kind == "alloc":
                _, name, size, s, seed = op
                v = np.random.default_rng(seed).integers(
                    0, 256, size, dtype=np.uint8)
                h = cuda.pinned_array(size, np.uint8)
                h[:] = v
                keep.append(h)
                a = cuda.device_array(size, np.uint8, stream=streams[s])
                a.copy_to_device(h, stream=streams[s])
                arrays[name] = a
                model[name] = v.copy()
            elif kind == "free":
                del arrays[op[1]]
                del model[op[1]]
            elif kind == "h2d":
                _, name, s, seed = op
                v = np.random.default_rng(seed).integers(
                    0, 256, model[name].size, dtype=np.uint8)
                h = cuda.pinned_array(v.size, np.uint8)
                h[:] = v
                keep.append(h)
                arrays[name].copy_to_device(h, stream=streams[s])
                model[name][:] = v
            elif kind == "d2h":
                _, name, s = op
                h = cuda.pinned_array(model[name].size, np.uint8)
                arrays[name].copy_to_host(h, stream=streams[s])
                reads.append((i, h, model[name].copy()))
            elif kind == "fill":
                _, name, s, value = op
                arrays[name].setitem(slice(None), value, stream=streams[s])
                model[name][:] = value
            elif kind == "d2d":
                _, src, dst, s = op
                arrays[dst].setitem(slice(None), arrays[src],
                                    stream=streams[s])
                model[dst][:] = model[src]
            elif kind == "wait":
                _, prev, s = op
                e = cuda.event(timing=False)
                e.record(streams[prev])
                streams[s].wait_event(e)
            elif kind == "sync":
                streams[op[1]].synchronize()
            elif kind == "hold":
                g = Gate()
                g.block(streams[op[2]])
                gates[op[1]] = g
            elif kind == "open":
                gates[op[1]].open()
    finally:
        for g in gates.values():
            g.open()
        for s in streams:
            s.synchronize()
    bad = []
    for i, h, want in reads:
        if not np.array_equal(h, want):
            wrong = int(np.count_nonzero(h != want))
            bad.append("op %d %r: %d of %d bytes differ" % (
                i, ops[i], wrong, want.size))
    if any(g.timed_out for g in gates.values()):
        bad.append("a gate timed out: a stream waited for a held one")
    del arrays, keep
    gc.collect()
    return bad


def shrink(cuda, nstreams, ops, budget=300):
    """A smaller program that still fails: drop ops (and chunks of them)
    while the result stays well formed and failing."""
    tries = 0
    chunk = max(1, len(ops) // 2)
    while chunk >= 1 and tries < budget:
        i = 0
        changed = False
        while i < len(ops) and tries < budget:
            # The ordering ops stay: without them the program has races
            # and no defined result.
            cand = ops[:i] + [op for op in ops[i:i + chunk]
                              if op[0] in ("wait", "sync")] + ops[i + chunk:]
            if len(cand) < len(ops) and well_formed(nstreams, cand):
                tries += 1
                if run(cuda, nstreams, cand):
                    ops = cand
                    changed = True
                    continue
            i += chunk
        if not changed:
            chunk //= 2
    return ops


def install(cuda, manager):
    if manager == "pool-vmm":
        # The pool on virtual memory, giving back every idle page it can
        # (the threshold 0 moves and unmaps pages as often as it may).
        cuda._core._pool_vmm(True)
        cuda.set_memory_manager("pool")
    elif manager == "plugin":
        import emm_plugin
        cuda.set_memory_manager(emm_plugin.DeferringManager)
    elif manager == "pool":
        # The pool on cuMemAlloc'd segments (pool-vmm: on virtual memory).
        cuda._core._pool_vmm(False)
        cuda.set_memory_manager("pool")
    else:
        cuda.set_memory_manager(manager)


def main(argv):
    manager = argv[1]
    programs = int(argv[2])
    first = int(argv[3]) if len(argv) > 3 else 0
    import cudamem as cuda

    install(cuda, manager)
    gates = manager in ("pool", "async", "pool-vmm")
    for seed in range(first, first + programs):
        nstreams, ops = generate(
            seed, gates, SIZES_VMM if manager == "pool-vmm" else SIZES)
        bad = run(cuda, nstreams, ops)
        if bad:
            small = shrink(cuda, nstreams, ops)
            lines = ["manager %s, seed %d: %s" % (manager, seed, bad[0]),
                     "minimal program (%d streams, %d of %d ops; run it "
                     "with: python tests/helpers/stream_model.py %s 1 %d):"
                     % (nstreams, len(small), len(ops), manager, seed)]
            lines += ["  %r" % (op,) for op in small]
            lines.append("its mismatches: %s" % run(cuda, nstreams, small))
            sys.stderr.write("\n".join(lines) + "\n")
            return 1
    print("%s: %d programs matched the model" % (manager, programs))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
