# SPDX-License-Identifier: MIT
"""Model-based check of the staging buffers' cache, shared by the staged
pipeline and the one-buffer copies to the host.

A seeded generator writes random programs over a few device arrays:
synchronous copies from pageable memory to the device (the larger ones
staged, returning before their last chunks land), asynchronous ones on a
non-blocking stream (staged, returning early too, their buffers left
pending in the cache), synchronous copies back into existing and new
pageable arrays (the smaller ones through one staging buffer, which may
be one that a copy still reads), scalar fills, trims of the cache and
changes of the one-buffer limit.  Every program is race-free as written:
an array written on the non-blocking stream is used again only after
that stream is synchronised, and one written on the default stream (a
copy to the device may return before its bytes land) is written on the
other stream only after the default stream is synchronised.  A plain
NumPy model, run in program order, gives each read-back, compared as
soon as the copy returns; the source of each copy to the device is
overwritten as soon as the call returns, so a copy that had not taken it
yet reads wrong bytes.  Two programs run at once, in two threads, over
the one cache.  A failing program is printed with its seed.  (With the
one-buffer copy's wait for a pending buffer taken out, seed 15 fails at
once on the simulator.)

    python tests/helpers/staging_model.py PROGRAMS [FIRST_SEED]

Exit status 0 when every program matched; 1 with the report on stderr.
"""

import random
import sys
import threading

import numpy as np

import cudamem as cuda
from cudamem import _core

THRESHOLD = 256 << 10
# Under the threshold from 16 KiB: one buffer; at or above it: staged in
# chunks of 256 KiB (two or three of them).
SIZES = [16 << 10, (40 << 10) + 3, (64 << 10) + 8, 200 << 10,
         300 << 10, (700 << 10) + 5, 1000]
LIMITS = [0, 64 << 10, 1 << 20]


def generate(seed, nops=24):
    rng = random.Random(seed)
    narrays = rng.randint(2, 4)
    sizes = [rng.choice(SIZES) for _ in range(narrays)]
    busy = set()        # arrays written on the stream, not synchronised
    dbusy = set()       # arrays written on the default stream, likewise
    ops = []
    for _ in range(nops):
        a = rng.randrange(narrays)
        kind = rng.choice(["up", "up", "up_async", "up_async", "down",
                           "down", "down_new", "fill", "trim", "limit",
                           "sync"])
        if kind in ("up", "up_async", "down", "down_new", "fill") \
                and a in busy:
            ops.append(("sync",))
            busy.clear()
        if kind == "up_async" and a in dbusy:
            ops.append(("dsync",))
            dbusy.clear()
        if kind in ("up", "up_async"):
            ops.append((kind, a, rng.randrange(1 << 30)))
            (busy if kind == "up_async" else dbusy).add(a)
        elif kind in ("down", "down_new"):
            ops.append((kind, a))
        elif kind == "fill":
            ops.append((kind, a, rng.randrange(256)))
            dbusy.add(a)
        elif kind == "trim":
            ops.append(("trim",))
        elif kind == "limit":
            ops.append(("limit", rng.choice(LIMITS)))
        else:
            ops.append(("sync",))
            busy.clear()
    ops.append(("sync",))
    return sizes, ops


def run(sizes, ops, limit_lock):
    """Run a program; a list of mismatches (empty when it matched)."""
    s = _core._stream_with_flags(1)        # CU_STREAM_NON_BLOCKING
    arrays = [cuda.device_array(n, np.uint8) for n in sizes]
    for d in arrays:
        d[:] = 0
    model = [np.zeros(n, np.uint8) for n in sizes]
    bad = []
    for i, op in enumerate(ops):
        kind = op[0]
        if kind in ("up", "up_async"):
            _, a, seed = op
            h = np.random.default_rng(seed).integers(0, 256, sizes[a],
                                                     dtype=np.uint8)
            model[a][:] = h
            if kind == "up":
                arrays[a].copy_to_device(h)
            else:
                arrays[a].copy_to_device(h, stream=s)
            h[:] = 0xEE          # the source was taken: this is not read
        elif kind in ("down", "down_new"):
            a = op[1]
            if kind == "down":
                out = np.full(sizes[a], 0xDD, np.uint8)
                arrays[a].copy_to_host(out)
            else:
                out = arrays[a].copy_to_host()
            if not np.array_equal(out, model[a]):
                bad.append("op %d %r: %d of %d bytes differ" % (
                    i, op, int(np.count_nonzero(out != model[a])),
                    sizes[a]))
        elif kind == "fill":
            _, a, value = op
            arrays[a][:] = value
            model[a][:] = value
        elif kind == "trim":
            _core._staging_trim()
        elif kind == "limit":
            with limit_lock:
                _core._staging_config(bounce=op[1])
        elif kind == "dsync":
            cuda.default_stream().synchronize()
        else:
            s.synchronize()
    s.synchronize()
    cuda.synchronize()
    return bad


def main(argv):
    programs = int(argv[1])
    first = int(argv[2]) if len(argv) > 2 else 0
    old = _core._staging_config()
    _core._staging_config(enabled=True, threshold=THRESHOLD,
                          chunk=256 << 10, buffers=2, bounce=1 << 20)
    limit_lock = threading.Lock()
    failures = []
    b0 = _core._staging_stats()["bounced"]
    s0 = _core._staging_stats()["staged"]

    def one(seed):
        sizes, ops = generate(seed)
        try:
            bad = run(sizes, ops, limit_lock)
        except Exception as e:       # reported with the seed
            bad = ["raised %r" % e]
        if bad:
            failures.append((seed, sizes, ops, bad))

    for k in range(first, first + programs, 2):
        ts = [threading.Thread(target=one, args=(seed,))
              for seed in (k, k + 1) if seed < first + programs]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        if failures:
            break
    st = _core._staging_stats()
    _core._staging_config(**old)
    if failures:
        seed, sizes, ops, bad = failures[0]
        print("seed %d (sizes %r) failed:" % (seed, sizes), file=sys.stderr)
        for line in bad:
            print("  " + line, file=sys.stderr)
        print("program:", file=sys.stderr)
        for i, op in enumerate(ops):
            print("  %3d %r" % (i, op), file=sys.stderr)
        return 1
    if st["in_use"] != 0 or st["inflight"] != 0:
        print("buffers left in use: %r" % st, file=sys.stderr)
        return 1
    print("%d programs matched (%d copies through one buffer, %d staged)"
          % (programs, st["bounced"] - b0, st["staged"] - s0))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
