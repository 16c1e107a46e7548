# SPDX-License-Identifier: MIT
"""Round trips from several threads at once: each of N threads (1, 2, 4,
8) has a stream of its own, a device array and two host arrays of 1 KiB
or 64 KiB, pinned or pageable, and repeats a host-to-device copy, a
device-to-host copy and a synchronize of its stream.  A row reports the
round trips of all threads together, in thousands per second.

- cudamem: ``copy_to_device(h, stream=s)``, ``copy_to_host(out,
  stream=s)``, ``s.synchronize()``; pinned arrays from ``pinned_array``;
- CuPy: ``set(h, stream=s)``, ``get(stream=s, out=out,
  blocking=False)``, ``s.synchronize()``; pinned arrays from
  ``cupyx.empty_pinned``;
- PyTorch: the thread's current stream set once, ``copy_(h,
  non_blocking=True)`` both ways, ``s.synchronize()``; pinned tensors
  from ``pin_memory=True``;
- driver: bare_driver.c, C threads making the three driver calls
  (cuMemcpyHtoDAsync, cuMemcpyDtoHAsync, cuStreamSynchronize) and nothing
  else: the driver's own limit with N threads.

Pageable host arrays are touched NumPy arrays (torch tensors) copied on
the stream; the libraries and the driver take the driver's pageable path
for them (cudamem's staging pipeline starts at 4 MiB).

After the table's rows, cudamem's round trips run once more with the
GIL probe on (``_core._gil_probe``): the ``GIL wait/rt`` rows give the
time its threads waited to take the GIL back after a driver call, per
round trip, and a short table before the main one the releases per round
trip, the time run with the GIL released and the waits' spread.  For
pinned memory they run a third time with ``_core._copy_keep_gil`` on
(the copies keep the GIL, only the synchronize releases it): the
``keep-GIL rt`` rows, in k/s beside the C program's figure.  The main
table's 1 KiB pinned rows run with the setting as cudamem has it
(``'auto'``: the copies keep the GIL only while two or more other
threads are in driver calls), and again with each setting named, timed
like the others with no probe: ``round trip 1 KiB release-GIL [N
threads]`` (False), ``keep-GIL`` (True) and ``GIL auto`` ('auto').
The pageable rows run with 'auto' as well, where under the same
contention the host-to-device copy (up to 64 KiB) and the synchronize
after the copy back keep the GIL; their ``GIL wait/rt`` rows run with
the setting False, as every probe row does but the ``keep-GIL rt`` ones.
The 1 KiB pageable rows run once more with every copy sent through
cudamem's staging pipeline (``round trip 1 KiB staged [N threads]``):
whether its page-locked buffers scale with threads where the driver's
pageable path does not.

Timing: the threads set up and make 50 round trips each, then every
sample starts them together and stops them after ``MS`` milliseconds
(each finishes the round trip it is in, and makes one at least); a
sample's figure is the time until the last one stopped over the round
trips all threads made.  The row gives the median and the 10th / 90th
percentiles of ``SAMPLES`` samples.  The Python libraries run in this
process, the C program in a child process of its own.
"""

import gc
import threading
import time

import numpy as np

import bare_driver
import harness

THREADS = (1, 2, 4, 8)
SIZES = ((1 << 10, "1 KiB"), (64 << 10, "64 KiB"))
SAMPLES = 7
MS = 50
WARM = 50


def threaded(nthreads, setup, samples=None, ms=None, warm=WARM,
             tally=None, on_start=None):
    """Time a round trip made by nthreads Python threads at once.
    setup(i) runs in thread i and returns its round trip (a callable).
    harness.Measured: seconds per round trip of all threads together.
    tally, a list, gets the round trips each sample counted; on_start()
    runs once every thread has set up and warmed up, before the first
    sample."""
    samples = SAMPLES if samples is None else samples
    ms = MS if ms is None else ms
    barrier = threading.Barrier(nthreads + 1, timeout=300)
    stop = [False]
    counts = [[0] * samples for _ in range(nthreads)]
    errors = []

    def work(i):
        step = None
        try:
            step = setup(i)
            for _ in range(warm):
                step()
        except BaseException as e:  # noqa: BLE001 - raised by the caller
            errors.append(e)
            step = None
        if on_start is not None:
            barrier.wait()
        for k in range(samples):
            barrier.wait()
            n = 0
            try:
                # At least one round trip per sample, so that a sample
                # shorter than a round trip still measures one.
                while step is not None:
                    step()
                    n += 1
                    if stop[0]:
                        break
            except BaseException as e:  # noqa: BLE001 - as above
                errors.append(e)
                step = None
            counts[i][k] = n
            barrier.wait()

    threads = [threading.Thread(target=work, args=(i,), daemon=True)
               for i in range(nthreads)]
    per = []
    gc_was = gc.isenabled()
    gc.disable()
    try:
        for t in threads:
            t.start()
        for k in range(samples):
            stop[0] = False
            if k == 0 and on_start is not None:
                barrier.wait()      # every thread set up and warm
                on_start()
                barrier.wait()
            else:
                barrier.wait()
            t0 = time.perf_counter()
            time.sleep(ms / 1e3)
            stop[0] = True
            barrier.wait()
            total = sum(c[k] for c in counts)
            if tally is not None:
                tally.append(total)
            if total:   # 0 only when every thread failed
                per.append((time.perf_counter() - t0) / total)
    finally:
        if gc_was:
            gc.enable()
        for t in threads:
            t.join(60)
    if errors:
        raise errors[0]
    if not per:
        raise RuntimeError("no round trip finished")
    return harness.Measured(harness.summarize(per))


def _cudamem(nthreads, size, pinned, tally=None, on_start=None):
    def factory(cm):
        def setup(i):
            s = cm.stream()
            if pinned:
                h = cm.pinned_array(size, np.uint8)
                out = cm.pinned_array(size, np.uint8)
            else:
                h = np.empty(size, np.uint8)
                out = np.empty(size, np.uint8)
            h[:] = i
            out[:] = 0
            d = cm.device_array(size, np.uint8)
            to_dev, to_host, sync = d.copy_to_device, d.copy_to_host, \
                s.synchronize

            def step():
                to_dev(h, stream=s)
                to_host(out, stream=s)
                sync()
            return step

        return threaded(nthreads, setup, tally=tally, on_start=on_start)

    return factory


def _cupy(nthreads, size, pinned):
    def factory(cp):
        import cupyx

        def setup(i):
            s = cp.cuda.Stream(non_blocking=False)
            if pinned:
                h = cupyx.empty_pinned((size,), np.uint8)
                out = cupyx.empty_pinned((size,), np.uint8)
            else:
                h = np.empty(size, np.uint8)
                out = np.empty(size, np.uint8)
            h[:] = i
            out[:] = 0
            d = cp.empty(size, np.uint8)
            put, sync = d.set, s.synchronize
            try:
                d.get(stream=s, out=out, blocking=False)
                s.synchronize()

                def get():
                    d.get(stream=s, out=out, blocking=False)
            except TypeError:   # a CuPy before blocking=: asynchronous
                def get():
                    d.get(stream=s, out=out)

            def step():
                put(h, stream=s)
                get()
                sync()
            return step

        return threaded(nthreads, setup)

    return factory


def _torch(nthreads, size, pinned):
    def factory(torch):
        def setup(i):
            s = torch.cuda.Stream()
            torch.cuda.set_stream(s)   # this thread's current stream
            h = torch.full((size,), i, dtype=torch.uint8, pin_memory=pinned)
            out = torch.zeros(size, dtype=torch.uint8, pin_memory=pinned)
            d = torch.empty(size, dtype=torch.uint8, device="cuda")
            sync = s.synchronize

            def step():
                d.copy_(h, non_blocking=True)
                out.copy_(d, non_blocking=True)
                sync()
            return step

        return threaded(nthreads, setup)

    return factory


# The C program's figures, by (threads, bytes, pinned), for the
# keep-GIL rows below.
_driver_seen = {}


def _driver(nthreads, size, pinned):
    def factory(core):
        m = bare_driver.run("roundtrip", nthreads, size,
                            "pinned" if pinned else "pageable", SAMPLES, MS)
        _driver_seen[(nthreads, size, pinned)] = m
        return m

    return factory


def _cudamem_keep_gil(nthreads, size, mode=True):
    """_cudamem's pinned round trips with _core._copy_keep_gil set to
    mode (False: every call releases the GIL; True: the two copies keep
    it, the synchronize releases it; 'auto': they keep it only while two
    or more other threads are in driver calls with it released), timed
    like every other column (no probe)."""
    def factory(cm):
        keep = getattr(cm._core, "_copy_keep_gil", None)
        if keep is None:
            raise harness.Skip("this build has no _copy_keep_gil")
        old = keep(mode)
        try:
            # A build before 'auto' took the string as a truth value:
            # what reads back is the mode that is timed.
            if keep() != mode:
                raise harness.Skip("this build has no _copy_keep_gil(%r)"
                                   % (mode,))
            return _cudamem(nthreads, size, True)(cm)
        finally:
            keep(old)

    return factory


def _cudamem_staged(nthreads, size):
    """_cudamem's pageable round trips through cudamem's own staging
    pipeline (_core._staging_config(threshold=0): every copy, however
    small, goes through its page-locked buffers) instead of the driver's
    pageable path, whose one staging buffer the C program shows not to
    scale with threads."""
    def factory(cm):
        cfg = getattr(cm._core, "_staging_config", None)
        if cfg is None:
            raise harness.Skip("this build has no _staging_config")
        old = cfg()
        try:
            cfg(enabled=True, threshold=0)
            return _cudamem(nthreads, size, False)(cm)
        finally:
            cfg(enabled=old["enabled"], threshold=old["threshold"])

    return factory


def row_name(size_label, pinned, nthreads):
    return "round trip %s %s [%d thread%s]" % (
        size_label, "pinned" if pinned else "pageable", nthreads,
        "" if nthreads == 1 else "s")


def _ops():
    ops = []
    for size, label in SIZES:
        for pinned in (True, False):
            for n in THREADS:
                ops.append({
                    "name": row_name(label, pinned, n), "unit": "k/s",
                    "impls": {"cudamem": _cudamem(n, size, pinned),
                              "cupy": _cupy(n, size, pinned),
                              "torch": _torch(n, size, pinned),
                              "driver": _driver(n, size, pinned)}})
    # The settings of _copy_keep_gil side by side: the smallest pinned
    # rows again with each (cudamem only: read them beside the rows
    # above; 0.5 s each).
    size, label = SIZES[0]
    for mode, tag in ((False, "release-GIL"), (True, "keep-GIL"),
                      ("auto", "GIL auto")):
        for n in THREADS:
            ops.append({
                "name": row_name(label, True, n).replace("pinned", tag),
                "unit": "k/s",
                "impls": {"cudamem": _cudamem_keep_gil(n, size, mode)}})
    # The smallest pageable rows again through cudamem's staging
    # pipeline (cudamem only, beside the pageable rows above).
    for n in THREADS:
        ops.append({
            "name": row_name(label, False, n).replace("pageable", "staged"),
            "unit": "k/s",
            "impls": {"cudamem": _cudamem_staged(n, size)}})
    return ops


OPS = _ops()


# The GIL probe and the keep-GIL rows -----------------------------------------


def _probe(cm, nthreads, size, pinned, keep_gil=False):
    """cudamem's round trip once more with _core._gil_probe on (from the
    first sample: setup and warm-up are not counted), and with the
    setting _core._copy_keep_gil at keep_gil: the probe's counts,
    the round trips they cover, the time per round trip
    (harness.Measured)."""
    core = cm._core
    tally = []
    old = core._copy_keep_gil(keep_gil)
    try:
        m = _cudamem(nthreads, size, pinned, tally,
                     lambda: core._gil_probe(True))(cm)
        stats = core._gil_probe_stats()
    finally:
        core._gil_probe(False)
        core._copy_keep_gil(old)
    return stats, sum(tally), m


def _hist_quantile(hist, q):
    """The upper bound in ns of the histogram bucket holding quantile q
    (bucket k: shorter than 2**(k + 8) ns; None for the open last one)."""
    total = sum(hist)
    seen = 0
    for k, n in enumerate(hist):
        seen += n
        if total and seen >= q * total:
            return None if k == len(hist) - 1 else 256 << k
    return None


def _summary(stats, trips, m, nthreads):
    """The probe's counts per round trip (thread time, all threads)."""
    g = stats["nogil"]
    d = stats["drop"]
    trips = max(trips, 1)
    wait = (g["wait_ns"] + d["wait_ns"]) / trips * 1e-9
    q = [_hist_quantile(g["wait_hist"], x) for x in (0.5, 0.99)]
    return {
        "round_trips": trips,
        "k_per_s": 1e-3 / m[0],
        "releases_per_rt": (g["releases"] + d["releases"]) / trips,
        "released_us_per_rt": (g["released_ns"] + d["released_ns"])
        / trips / 1e3,
        "wait_us_per_rt": wait * 1e6,
        # The threads' time spent waiting for the GIL.
        "wait_share": wait / (nthreads * m[0]),
        "wait_p50_below_us": None if q[0] is None else q[0] / 1e3,
        "wait_p99_below_us": None if q[1] is None else q[1] / 1e3,
        "max_wait_us": max(g["max_wait_ns"], d["max_wait_ns"]) / 1e3,
        "stats": stats}


def _error_row(name, e):
    return {"op": name, "unit": "us", "bytes": None, "times": {},
            "errors": {"cudamem": "%s: %s" % (type(e).__name__,
                                                str(e)[:120])}}


def probe_rows(cm, select=None):
    """For each round-trip row selected, cudamem's round trips again with
    the GIL probe on (its cost: a clock read at each end of a release):

    - ``GIL wait/rt ...`` (us): the time its threads waited to take the
      GIL back, per round trip;
    - pinned rows only, ``keep-GIL rt ...`` (k/s): the same loop with the
      setting _core._copy_keep_gil on (the two copies keep the GIL,
      only the synchronize releases it), beside the C program's figure
      of the row when it ran.

    Each row's "probe" entry holds the counts (see _summary)."""
    rows = []
    for size, label in SIZES:
        for pinned in (True, False):
            for n in THREADS:
                name = row_name(label, pinned, n)
                if select and not any(k in name for k in select):
                    continue
                tag = "%s %s [%d thread%s]" % (
                    label.replace(" KiB", "K"),
                    "pinned" if pinned else "pageable", n,
                    "" if n == 1 else "s")
                short = "GIL wait/rt " + tag
                try:
                    stats, trips, m = _probe(cm, n, size, pinned)
                except Exception as e:  # noqa: BLE001 - reported
                    rows.append(_error_row(short, e))
                    continue
                p = _summary(stats, trips, m, n)
                wait = p["wait_us_per_rt"] * 1e-6
                rows.append({"op": short, "unit": "us", "bytes": None,
                             "times": {"cudamem": (wait, wait, wait)},
                             "probe": p})
                if not pinned:
                    continue
                short = "keep-GIL rt " + tag
                try:
                    stats, trips, m = _probe(cm, n, size, pinned, True)
                except Exception as e:  # noqa: BLE001 - reported
                    rows.append(_error_row(short, e))
                    continue
                row = {"op": short, "unit": "k/s", "bytes": None,
                       "times": {"cudamem": tuple(m)},
                       "probe": _summary(stats, trips, m, n)}
                drv = _driver_seen.get((n, size, pinned))
                if drv is not None:
                    row["times"]["driver"] = tuple(drv)
                rows.append(row)
    return rows


def format_probe(rows):
    """The probe rows' counts, one line each."""
    lines = ["GIL probe, cudamem (probe on): k round trips/s; per round "
             "trip (thread time): GIL releases, us run with it released, "
             "us waited to take it back; the share of the threads' time "
             "spent waiting; a wait's median and 99th percentile (below, "
             "us); the longest wait (us)"]
    for row in rows:
        p = row.get("probe")
        if p is None:
            continue
        q = ["%g" % v if v is not None else "more"
             for v in (p["wait_p50_below_us"], p["wait_p99_below_us"])]
        lines.append(
            "  %-38s %6.1f %5.2f %8.2f %8.2f %4.0f%%  <%s <%s  %9.1f" % (
                row["op"], p["k_per_s"], p["releases_per_rt"],
                p["released_us_per_rt"], p["wait_us_per_rt"],
                100 * p["wait_share"], q[0], q[1], p["max_wait_us"]))
    return "\n".join(lines)


def run_extra(libs, select=None, repeats=None):
    """The probe's and the keep-GIL rows (see probe_rows), where
    cudamem is here and has them; the counts printed first."""
    cm = libs.get("cudamem")
    if cm is None or not hasattr(cm._core, "_gil_probe") \
            or not hasattr(cm._core, "_copy_keep_gil"):
        return []
    rows = probe_rows(cm, select)
    if rows:
        print(format_probe(rows))
    return rows
