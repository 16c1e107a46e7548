# SPDX-License-Identifier: MIT
"""Model-based check of cudamem's background work during a CUDA graph
capture another library began (raw driver calls, as CuPy's and
PyTorch's are), which cudamem does not know of.

A seeded generator writes random programs.  Before the capture: a few
source and destination device arrays of one size, page-locked outputs,
and junk: device arrays on the default stream, on streams of cudamem's
and on the stream about to capture (some used on a second of these, so
that their releases are ordered after two streams), streams with
finished work, events.
The release queues' count threshold is drawn (1 to 30).  Then a raw
capture of a non-blocking or blocking stream begins, in global or
thread-local mode, and the program records copies on it (a source to an
output, a source to a destination, a destination to an output) between
drops of junk (arrays, streams, events; on this thread or on another),
garbage collections, flushes of the queues by hand and, under the pool
on virtual memory, allocations on streams that do not capture.  The
capture must end valid; the graph is then replayed twice over fresh
sources, and each output compared with a plain NumPy model of the
recorded copies.  Nothing may be reported as unraisable, and the
thread's capture interaction mode must be global again.  A failing
program is printed with its seed.

    python tests/helpers/capture_model.py PROGRAMS [FIRST_SEED]

The memory manager is the process's (CUDAMEM_MEMORY_MANAGER).  Exit
status 0 when every program matched; 1 with the report on stderr.
"""

import gc
import os
import random
import sys
import threading

import numpy as np

import cudamem as cuda
from cudamem import _core

GLOBAL, THREAD_LOCAL = 0, 1
SIZES = [64, 1000, 4096, 20000]


def generate(seed, nops=24):
    rng = random.Random(seed)
    p = {
        "n": rng.choice([256, 1024, 5000]),
        "nsrc": rng.randint(1, 3),
        "ndst": rng.randint(1, 2),
        "njunk": rng.randint(0, 50),
        "nstreams": rng.randint(0, 5),
        "nevents": rng.randint(0, 5),
        "count": rng.choice([1, 3, 10, 30]),
        "flags": rng.choice([0, 1]),
        "mode": rng.choice([GLOBAL, THREAD_LOCAL]),
    }
    # Junk array k: (size, where, also): where 0 the default stream, 1..
    # a junk stream, -1 the capturing stream; also None, or a second
    # stream (the same numbering) the array is used on before the
    # capture, so that its release is ordered after both.
    places = [0, -1] + list(range(1, p["nstreams"] + 1))
    p["junk"] = [(rng.choice(SIZES), rng.choice(places),
                  rng.choice(places) if rng.random() < 0.3 else None)
                 for _ in range(p["njunk"])]
    ops = []
    alive = set(range(p["njunk"]))
    streams = set(range(p["nstreams"]))
    events = set(range(p["nevents"]))
    for _ in range(nops):
        kind = rng.choice(["rec", "rec", "rec", "drop", "drop", "drop_t",
                           "drop_stream", "drop_event", "gc", "clear",
                           "alloc"])
        if kind == "rec":
            what = rng.choice(["src_out", "src_dst", "dst_out"])
            ops.append(("rec", what, rng.randrange(p["nsrc"]),
                        rng.randrange(p["ndst"])))
        elif kind in ("drop", "drop_t") and alive:
            ks = rng.sample(sorted(alive), rng.randint(1, len(alive)))
            alive -= set(ks)
            ops.append((kind, ks))
        elif kind == "drop_stream" and streams:
            k = rng.choice(sorted(streams))
            streams.discard(k)
            ops.append((kind, k))
        elif kind == "drop_event" and events:
            k = rng.choice(sorted(events))
            events.discard(k)
            ops.append((kind, k))
        elif kind in ("gc", "clear"):
            ops.append((kind,))
        elif kind == "alloc":
            ops.append((kind, rng.choice(SIZES),
                        rng.choice([0] + sorted(k + 1 for k in streams))))
    p["ops"] = ops
    return p


class Failure(Exception):
    pass


def run(p, rng_values, allocs_ok):
    seen = []
    old_hook = sys.unraisablehook
    sys.unraisablehook = seen.append
    _core._set_dealloc_config(p["count"], 0.2)
    h = _core._raw_stream_create(p["flags"])
    try:
        _program(p, rng_values, allocs_ok, h, seen)
    finally:
        sys.unraisablehook = old_hook
        # Every object of cudamem's that used the stream is gone (the
        # pool orders a release after the streams its memory was used
        # on), then the handle, as another library's stream must go.
        gc.collect()
        _core._raw_stream_destroy(h)
        _core._set_dealloc_config(10, 0.2)


def _program(p, rng_values, allocs_ok, h, seen):
    ctx = cuda.current_context()
    memq = ctx.memory_manager.deallocations
    ext = cuda.external_stream(h)
    n = p["n"]
    src = [cuda.device_array(n, np.float32) for _ in range(p["nsrc"])]
    dst = [cuda.device_array(n, np.float32) for _ in range(p["ndst"])]
    outs = []           # (pinned array, model function)
    streams = [cuda.stream() for _ in range(p["nstreams"])]
    events = [cuda.event() for _ in range(p["nevents"])]
    for e in events:
        e.record(streams[0] if streams else 0)
    where = [0] + streams
    junk = []
    for size, w, also in p["junk"]:
        s = ext if w == -1 else where[w]
        junk.append(cuda.device_array(size, np.float32, stream=s))
        if also is not None:
            junk[-1].copy_to_device(np.ones(size, np.float32),
                                    stream=ext if also == -1
                                    else where[also])
    for s in streams:
        src[0].copy_to_host(stream=s)
    nout = sum(1 for op in p["ops"]
               if op[0] == "rec" and op[1] != "src_dst")
    # Page-locked outputs made before: cuMemHostAlloc is the user's
    # call, which the driver refuses during such a capture.
    spare = [cuda.pinned_array(n, np.float32) for _ in range(nout)]
    cuda.synchronize()
    # The model: what each output holds after a replay, from the
    # sources' values then.
    model_dst = {}
    _core._raw_begin_capture(h, p["mode"])
    try:
        for op in p["ops"]:
            if op[0] == "rec":
                _, what, i, j = op
                out = spare.pop() if what != "src_dst" else None
                if what == "src_out":
                    src[i].copy_to_host(out, stream=ext)
                    outs.append((out, ("src", i)))
                elif what == "src_dst":
                    dst[j].copy_to_device(src[i], stream=ext)
                    model_dst[j] = ("src", i)
                else:
                    dst[j].copy_to_host(out, stream=ext)
                    outs.append((out, model_dst.get(j, ("dst", j))))
            elif op[0] == "drop":
                for k in op[1]:
                    junk[k] = None
            elif op[0] == "drop_t":
                def drop(ks=op[1]):
                    for k in ks:
                        junk[k] = None
                    gc.collect()
                t = threading.Thread(target=drop)
                t.start()
                t.join()
            elif op[0] == "drop_stream":
                k = op[1]
                where[k + 1] = 0
                streams[k] = None
            elif op[0] == "drop_event":
                events[op[1]] = None
            elif op[0] == "gc":
                gc.collect()
            elif op[0] == "clear":
                memq.clear()
                ctx.deallocations.clear()
            elif op[0] == "alloc" and allocs_ok:
                s = where[op[2]] if op[2] < len(where) else 0
                junk.append(cuda.device_array(op[1], np.float32,
                                              stream=s))
    finally:
        g = ext.end_capture()       # raises if invalidated
    try:
        # The destinations' values at a replay: recorded copies into
        # them happen in order, so a read of dst j sees its last
        # recorded source, else what it held before the launch.
        for rep in range(2):
            vals = [rng_values.standard_normal(n).astype(np.float32)
                    for _ in src]
            dvals = [rng_values.standard_normal(n).astype(np.float32)
                     for _ in dst]
            for a, v in zip(src, vals, strict=True):
                a.copy_to_device(v)
            for a, v in zip(dst, dvals, strict=True):
                a.copy_to_device(v)
            for out, _ in outs:
                out[:] = np.nan
            cuda.synchronize()
            g.launch(ext)
            _core._raw_stream_synchronize(h)
            for out, (kind, i) in outs:
                want = vals[i] if kind == "src" else dvals[i]
                if not np.array_equal(out, want):
                    raise Failure("replay %d: an output differs from "
                                  "the model (%s %d)" % (rep, kind, i))
    finally:
        g.close()
    junk.clear()
    del streams, events, where, outs
    gc.collect()
    memq.clear()
    ctx.deallocations.clear()
    if _core._raw_capture_mode(GLOBAL) != GLOBAL:
        raise Failure("the thread's capture mode was not given back")
    if seen:
        raise Failure("unraisable: %s" % "; ".join(
            "%s: %s" % (type(u.exc_value).__name__, u.exc_value)
            for u in seen[:3]))


def main(argv):
    count = int(argv[1]) if len(argv) > 1 else 200
    first = int(argv[2]) if len(argv) > 2 else 0
    # Allocations during the capture: only where growing the pool is made
    # in the relaxed mode (the pool on virtual memory); elsewhere a
    # growth's cuMemAlloc is the user's call, which the driver refuses.
    allocs_ok = (os.environ.get("CUDAMEM_MEMORY_MANAGER") == "pool"
                 and os.environ.get("CUDAMEM_POOL_VMM", "1") != "0")
    for seed in range(first, first + count):
        if os.environ.get("CAPTURE_MODEL_ONLY") not in (None, str(seed)):
            continue
        p = generate(seed)
        try:
            run(p, np.random.default_rng(seed), allocs_ok)
        except Exception as e:  # noqa: BLE001 - any failure is reported
            print("seed %d failed: %s: %s\nprogram: %r"
                  % (seed, type(e).__name__, e, p), file=sys.stderr)
            return 1
    print("%d programs matched" % count)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
