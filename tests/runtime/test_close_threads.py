# SPDX-License-Identifier: MIT
"""close() and Device.reset() while other threads use every kind of object.

Each scenario runs in a child process: worker threads hammer one kind of
object while the main thread closes (or resets) the device again and
again.  Whatever the timing, the child must not crash, hang or abort;
the only errors the workers may see are ValueError (an object of a closed
context) and CudaAPIError (a call that met the reset); nothing may be
reported as "Exception ignored"; and host memory written by a worker
reads back as written, across the resets.
"""

import json
import os

import pytest
from helpers import run_child

# Each test only runs children (tests/helpers/ahead.py).
pytestmark = pytest.mark.ahead

SIM = os.environ.get("CUDAMEM_SIMULATOR", "0") not in ("0", "", "false")

# How long the workers hammer, per scenario (seconds).
HAMMER_S = float(os.environ.get("CUDAMEM_CLOSE_THREADS_SECONDS", "1.0"))
# The child's own limit; a hang is reported as such.
TIMEOUT_S = 120

CHILD = r'''
import json
import sys
import threading
import time
import traceback

import numpy as np

import cudamem as cuda
from cudamem import CudaAPIError

scenario, closer, seconds, check_data, hold = sys.argv[1:6]
seconds = float(seconds)
check_data = check_data == "1"
stop = threading.Event()
lock = threading.Lock()
seen = {}          # "ExceptionType" -> count
unexpected = []    # tracebacks of anything else
counts = {}        # worker -> iterations
succeeded = {}     # worker -> iterations that raised nothing


def note(kind):
    with lock:
        seen[kind] = seen.get(kind, 0) + 1


def streams(i):
    s = cuda.stream()
    s.synchronize()
    s.query()
    if i % 4 == 0:
        done = []
        s.add_callback(lambda st, status, arg: done.append(arg), i)
        s.synchronize()


def events(i):
    s = cuda.stream()
    a = cuda.event()
    b = cuda.event()
    a.record(s)
    b.record(s)
    b.synchronize()
    a.query()
    a.elapsed_time(b)
    e = cuda.event(timing=False)
    e.record()
    e.synchronize()


def device_arrays(i):
    h = np.arange(512, dtype=np.float64) + i
    d = cuda.to_device(h)
    assert (d.copy_to_host() == h).all()
    d[3] = 7.0
    e = cuda.device_array(256, dtype=np.int32)
    s = cuda.stream()
    d2 = cuda.to_device(h, stream=s)
    d2.copy_to_host(stream=s)
    s.synchronize()
    del e


def staged(i):
    # Large pageable copies take the staging pipeline.
    h = np.full(1 << 20, float(i))
    d = cuda.to_device(h)
    out = d.copy_to_host()
    assert (out == h).all()


def bounced(i):
    # Copies to pageable memory of 16 KiB to 1 MiB take one staging
    # buffer each (the pipeline's cache, shared by the threads).
    h = np.full((16 << 10) * (1 + i % 8) // 8, float(i))
    d = cuda.to_device(h)
    out = np.empty_like(h)
    d.copy_to_host(out)
    assert (out == h).all()
    assert (d.copy_to_host() == h).all()


def registered(i, h=np.zeros(1 << 14)):
    with cuda.pinned(h):
        d = cuda.to_device(h)
        d.copy_to_host(h)
    with cuda.mapped(h) as m:
        m[:] = i
        cuda.to_device(m).copy_to_host(h)


def kernels(i):
    d = cuda.device_array((16, 32), dtype=np.float32)
    d[:] = 1.0
    t = d.T.copy_to_host()
    assert t.shape == (32, 16)


def peers(i, n=1 << 14):
    # Another device's copies, casts and kernels over this one's memory
    # (two devices: the multi_gpu tests).
    with cuda.gpus[i % 2]:
        a = cuda.to_device(np.arange(n, dtype=np.float32))
    with cuda.gpus[1 - i % 2]:
        b = cuda.device_array(n, np.float32)
        b.copy_to_device(a)
        c = cuda.device_array((128, 64), np.float64)
        c.setitem(slice(None), a.reshape(128, 128)[:, ::2])
        if check_data and not (b.copy_to_host() == np.arange(n)).all():
            raise AssertionError("a copy between devices lost bytes")


def host_check(a, v):
    # a is host memory: once written it reads back as written, whatever
    # close() did meanwhile.
    a[:] = v
    if check_data and not (a == v).all():
        raise AssertionError("host memory lost a write")


def pinned(i):
    a = cuda.pinned_array(1 << 16)
    host_check(a, i)
    d = cuda.to_device(a)
    d.copy_to_host(a)


def mapped(i):
    a = cuda.mapped_array(1 << 16)
    host_check(a, i)
    d = cuda.to_device(a)
    d.copy_to_host()


def managed(i):
    a = cuda.managed_array(1 << 16)
    host_check(a, i)


def old_host(i, arrays=[]):
    # Host arrays made once, written by this thread across many resets.
    if not arrays:
        arrays.extend([cuda.pinned_array(1 << 15), cuda.mapped_array(1 << 15),
                       cuda.managed_array(1 << 15)])
    for a in arrays:
        host_check(a, i)


WORKERS = {
    "streams": [streams, streams],
    "events": [events, events],
    "device_arrays": [device_arrays, device_arrays],
    "kernels": [kernels, kernels],
    "pinned": [pinned, pinned],
    "mapped": [mapped, mapped],
    "managed": [managed, managed],
    "old_host": [old_host, pinned],
    "staged": [staged, staged],
    "bounced": [bounced, bounced, bounced],
    "registered": [registered, device_arrays],
    "peers": [peers, peers],
    "mixed": [streams, events, device_arrays, kernels, pinned, mapped,
              managed, staged, bounced, registered],
}[scenario]


def work(k, fn):
    i = 0
    ok = 0
    while not stop.is_set():
        i += 1
        try:
            fn(i)
            ok += 1
        except (ValueError, CudaAPIError) as exc:
            note(type(exc).__name__)
        except Exception:
            with lock:
                unexpected.append(traceback.format_exc())
            return
    counts["%s-%d" % (fn.__name__, k)] = i
    succeeded["%s-%d" % (fn.__name__, k)] = ok


def close_once():
    if closer == "close":
        cuda.close()
    else:
        cuda.get_current_device().reset()


cuda.to_device(np.zeros(4))   # the first context, before the threads
if hold == "1":
    # Every driver call lets go of the GIL, as after a reset that dropped
    # queued callbacks on a GPU.
    cuda._core._gil_yield_hold(1)
threads = [threading.Thread(target=work, args=(k, fn))
           for k, fn in enumerate(WORKERS)]
for t in threads:
    t.start()
closes = 0
end = time.monotonic() + seconds
while time.monotonic() < end or closes < 5:
    close_once()
    closes += 1
    time.sleep(0.002 * (closes % 3))
stop.set()
for t in threads:
    t.join()
close_once()

# Everything works again afterwards, in a new thread as on this one.
def after():
    h = np.arange(10.0)
    assert (cuda.to_device(h).copy_to_host() == h).all()
    s = cuda.stream()
    s.synchronize()
    e = cuda.event()
    e.record(s)
    e.synchronize()

after()
t = threading.Thread(target=after)
t.start()
t.join()
print(json.dumps({"closes": closes, "seen": seen, "unexpected": unexpected,
                  "counts": counts, "succeeded": succeeded}))
'''


def run_scenario(scenario, closer, seconds=HAMMER_S, hold=False, env=None):
    """Run the child (a crash or hang fails the test, naming the signal
    or the timeout); return its summary.  hold: every driver call lets go
    of the GIL (_gil_yield_hold).  env: variables for the child (the
    memory manager)."""
    p = run_child(CHILD, timeout=TIMEOUT_S, env=env,
                  args=(scenario, closer, seconds, "1" if SIM else "0",
                        "1" if hold else "0"))
    assert "Exception ignored" not in p.stderr, p.stderr[-3000:]
    out = json.loads(p.stdout.strip().splitlines()[-1])
    assert out["unexpected"] == [], "\n".join(out["unexpected"])
    assert set(out["seen"]) <= {"ValueError", "CudaAPIError"}, out["seen"]
    return out


SCENARIOS = ["streams", "events", "device_arrays", "staged", "bounced",
             "kernels", "pinned", "mapped", "managed", "old_host",
             "registered", "mixed"]


def check_progress(out):
    assert out["closes"] >= 5
    # Every worker went round (none was stuck), and the work succeeded
    # between the resets, not only failed.
    assert out["counts"] and all(n > 0 for n in out["counts"].values())
    assert sum(out["succeeded"].values()) > 0, out


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_close_while_threads_work(scenario):
    check_progress(run_scenario(scenario, "close"))


@pytest.mark.parametrize("scenario, manager", [
    ("device_arrays", "pool"), ("staged", "pool"), ("bounced", "pool"),
    ("mixed", "pool"), ("device_arrays", "async"), ("staged", "async"),
    ("bounced", "async"), ("mixed", "async")])
def test_close_while_threads_work_under_each_manager(scenario, manager):
    """The stream-ordered managers: a close destroys their pools while
    other threads allocate from them (the async manager's driver pool
    was used after it was destroyed; the pool's pages were unmapped
    under a copy another thread queued after the destroy, and the
    destroy waited for the pool's lock holding the GIL while the lock's
    holder waited, through the driver, for a Python callback)."""
    check_progress(run_scenario(scenario, "close",
                                env={"CUDAMEM_MEMORY_MANAGER": manager}))


@pytest.mark.multi_gpu
@pytest.mark.parametrize("manager", ["default", "pool", "async"])
def test_close_while_threads_copy_between_devices(manager):
    """Copies, casting assignments and their kernels between two
    devices while the main thread closes: a device's memory goes only
    after the other device's work on it (a closing context refuses new
    peer work, and the contexts given access to it are synchronized
    first)."""
    check_progress(run_scenario("peers", "close",
                                env={"CUDAMEM_MEMORY_MANAGER": manager}))


@pytest.mark.parametrize("scenario", ["streams", "old_host", "mixed"])
def test_device_reset_while_threads_work(scenario):
    check_progress(run_scenario(scenario, "reset"))


@pytest.mark.parametrize("scenario", ["streams", "events", "mixed"])
def test_device_reset_while_threads_work_gil_released(scenario):
    """The same with every driver call letting go of the GIL, the state a
    GPU stays in once a reset dropped queued callbacks (on the H200,
    stream() once returned NULL with no exception there)."""
    check_progress(run_scenario(scenario, "reset", hold=True))


def test_close_of_idle_objects_is_quiet():
    """Objects of a closed context dropped later free nothing and say
    nothing; used, they raise ValueError."""
    code = r'''
        import numpy as np
        import cudamem as cuda
        objs = []
        for _ in range(50):
            objs.append((cuda.stream(), cuda.event(),
                         cuda.to_device(np.ones(100)),
                         cuda.device_array(10)))
        s, e, d, _ = objs[0]
        cuda.close()
        for call in (s.synchronize, e.synchronize, d.copy_to_host,
                     lambda: e.record(s)):
            try:
                call()
            except ValueError:
                pass
            else:
                raise SystemExit("no ValueError from %r" % call)
        del objs, s, e, d
        import gc
        gc.collect()
        cuda.close()
        print("ok")
    '''
    p = run_child(code, timeout=TIMEOUT_S)
    assert p.stdout.strip() == "ok"
    assert "Exception ignored" not in p.stderr, p.stderr


# --- reset races forced in one order (simulator) ----------------------------
#
# On a GPU a reset can drop host callbacks still queued, and from then on
# every driver call releases the GIL (docs/design.md, "Threads and the
# GIL"): _gil_yield_hold(1) puts the simulator in that state.  Calls armed
# with _sim_block wait inside the driver until the test lets them go, so
# another thread's reset lands exactly between two steps of a call.

RACE_PRELUDE = r'''
import threading
import time

import numpy as np

import cudamem as cuda
from cudamem import _core


def wait_for(cond, what, limit=30.0):
    end = time.monotonic() + limit
    while not cond():
        if time.monotonic() > end:
            raise SystemExit("timed out waiting for " + what)
        time.sleep(0.001)


def blocked(name):
    return lambda: _core._sim_blocked(name) > 0


def dead(ctx):
    # An object of a closed context raises ValueError before any driver
    # call.
    try:
        ctx.get_memory_info()
    except ValueError:
        return True
    return False


def outcome(fn):
    box = {}

    def run():
        try:
            box["value"] = fn()
        except BaseException as exc:
            box["error"] = exc
    t = threading.Thread(target=run)
    t.start()
    return t, box


def describe(box):
    if "error" in box:
        return "%s: %s" % (type(box["error"]).__name__, box["error"])
    return type(box.get("value")).__name__
'''


@pytest.mark.skipif(not SIM, reason="forces the order with the simulator")
def test_stream_while_another_thread_makes_and_resets_the_context():
    """stream() on a thread that retained the primary context while
    another thread made cudamem's Context: giving its own retain back
    lets go of the GIL, and a reset then cleared the registry; stream()
    returned NULL without an exception (SystemError, seen on the H200)."""
    code = RACE_PRELUDE + r'''
dev = cuda.get_current_device()
cuda.close()                      # no context: the worker's call makes one
_core._gil_yield_hold(1)
_core._sim_block("DevicePrimaryCtxRetain", 1)
worker, box = outcome(cuda.stream)
wait_for(blocked("DevicePrimaryCtxRetain"), "the worker's retain")
ctx = cuda.current_context()      # made here meanwhile
_core._sim_block("DevicePrimaryCtxRelease", 1)
_core._sim_unblock("DevicePrimaryCtxRetain")
# The worker finds the Context made, and gives its retain back.
wait_for(blocked("DevicePrimaryCtxRelease"), "the worker's release")
resetter, rbox = outcome(dev.reset)
wait_for(lambda: dead(ctx), "the reset to mark the context dead")
_core._sim_unblock("DevicePrimaryCtxRelease")
worker.join()
resetter.join()
print(describe(box), "|", describe(rbox))
'''
    p = run_child(code, timeout=TIMEOUT_S)
    out = p.stdout.strip().splitlines()[-1]
    worker, resetter = out.split(" | ")
    assert resetter == "NoneType", p.output
    # A stream of the fresh context, or a clear error about the reset.
    assert worker == "Stream" or worker.startswith("ValueError"), p.output



@pytest.mark.skipif(not SIM, reason="forces the order with the simulator")
def test_pinned_block_given_back_while_another_thread_resets():
    """A page-locked array dropped on one thread goes back to the pool
    with an event recorded after the work before it: cuEventCreate, then
    cuEventRecord, each letting go of the GIL.  A reset landed between
    the two; the record then used an event the reset had destroyed (the
    simulator aborts: "not a live event", a crash on a GPU; seen in the
    wheel's run of test_device_reset_while_threads_work_gil_released).
    Now no call after the mark reaches the driver with a handle of the
    dying context, and the block is simply forgotten."""
    code = RACE_PRELUDE + r'''
dev = cuda.get_current_device()
ctx = cuda.current_context()
held = [cuda.pinned_array(1 << 12)]
_core._gil_yield_hold(1)
_core._sim_block("EventCreate", 1)
_core._sim_block("EventRecord", 1)
worker, box = outcome(held.clear)
wait_for(blocked("EventCreate"), "the worker's cuEventCreate")
resetter, rbox = outcome(dev.reset)
wait_for(lambda: dead(ctx), "the reset to mark the context dead")
_core._sim_unblock("EventCreate")
resetter.join()
# The worker either stops before the record or reaches it, which waits
# until the reset is over.
wait_for(lambda: not worker.is_alive() or blocked("EventRecord")(),
         "the worker")
_core._sim_unblock("EventRecord")
worker.join()
_core._sim_block("EventRecord", 0)
_core._gil_yield_hold(0)
a = cuda.pinned_array(1 << 12)
a[:] = 3.0
del a
print(describe(box), "|", describe(rbox), "|", len(held))
'''
    p = run_child(code, timeout=TIMEOUT_S)
    out = p.stdout.strip().splitlines()[-1]
    worker, resetter, left = out.split(" | ")
    assert resetter == "NoneType", p.output
    assert worker == "NoneType", p.output
    assert left == "0", p.output
    assert "Exception ignored" not in p.stderr, p.output


@pytest.mark.skipif(not SIM, reason="forces the order with the simulator")
def test_reset_waits_for_a_pinned_pool_trim_in_flight():
    """pinned_pool_trim() frees the pool's blocks with the GIL released.
    Those calls were not counted, so a reset on another thread did not
    wait for them and destroyed the context under a cuMemFreeHost in
    flight.  Now the reset waits until the trim's calls are over."""
    code = RACE_PRELUDE + r'''
dev = cuda.get_current_device()
ctx = cuda.current_context()
a = cuda.pinned_array(1 << 12)
del a                              # one free block in the pool
assert cuda.pinned_pool_stats()["free_bytes"] > 0
_core._sim_block("MemFreeHost", 1)
worker, box = outcome(cuda.pinned_pool_trim)
wait_for(blocked("MemFreeHost"), "the trim's cuMemFreeHost")
resetter, rbox = outcome(dev.reset)
wait_for(lambda: dead(ctx), "the reset to mark the context dead")
time.sleep(0.3)
waited = resetter.is_alive()
_core._sim_unblock("MemFreeHost")
worker.join()
resetter.join()
_core._sim_block("MemFreeHost", 0)
print(describe(box), "|", describe(rbox), "|", waited)
'''
    p = run_child(code, timeout=TIMEOUT_S)
    out = p.stdout.strip().splitlines()[-1]
    worker, resetter, waited = out.split(" | ")
    assert worker == "NoneType", p.output
    assert resetter == "NoneType", p.output
    assert waited == "True", p.output

@pytest.mark.skipif(not SIM, reason="forces the order with the simulator")
def test_stream_query_while_another_thread_resets():
    """A Stream method checked that its context was alive, then made the
    context current (a call that lets go of the GIL), during which another
    thread reset the device; the query then used the destroyed stream (the
    simulator aborts: "not a live stream", a crash on a GPU).  Now the
    context is checked again after making it current."""
    code = RACE_PRELUDE + r'''
dev = cuda.get_current_device()
ctx = cuda.current_context()
s = cuda.stream()
_core._gil_yield_hold(1)
# The worker's calls: cuCtxGetCurrent on entering the context, and again
# in the method's own check; the second waits.
_core._sim_block("CtxGetCurrent", 2)
_core._sim_block("StreamQuery", 1)
worker, box = outcome(s.query)
wait_for(blocked("CtxGetCurrent"), "the worker's second cuCtxGetCurrent")
resetter, rbox = outcome(dev.reset)
wait_for(lambda: dead(ctx), "the reset to mark the context dead")
_core._sim_unblock("CtxGetCurrent")
resetter.join()
# The worker either stops at the check or reaches the query, which waits
# until the reset is over.
wait_for(lambda: not worker.is_alive() or blocked("StreamQuery")(),
         "the worker")
_core._sim_unblock("StreamQuery")
worker.join()
_core._sim_block("StreamQuery", 0)
print(describe(box), "|", describe(rbox))
'''
    p = run_child(code, timeout=TIMEOUT_S)
    out = p.stdout.strip().splitlines()[-1]
    worker, resetter = out.split(" | ")
    assert resetter == "NoneType", p.output
    assert worker.startswith("ValueError: the context of device 0 was "
                             "closed or reset"), p.output


def test_host_memory_put_back_past_a_mapping_in_the_hole():
    """After the reset of close() unmaps page-locked, mapped and managed
    memory, cudamem puts the saved pages back at their addresses.  A
    mapping another thread made in the hole meanwhile (a thread ending,
    its sanitizer's pages among them, made and gone; seen as a segfault
    reading a mapped array after close() under AddressSanitizer) is
    waited out: the arrays read and write what they held, and the pages
    stay theirs after that mapping goes (the test aid takes the first
    page of the first run for 50 ms)."""
    code = r'''
import time
import numpy as np
import cudamem as cuda
from cudamem import _core
m = cuda.mapped_array(3)
m[:] = [1.0, 2.0, 3.0]
p = cuda.pinned_array(3)
p[:] = 4.0
_core._restore_hole_taken(50)
cuda.close()
time.sleep(0.1)              # the taking mapping is gone by now
e = cuda.device_array(3)
m[1] = 7.0
p[2] = 8.0
print(m.tolist(), p.tolist())
'''
    r = run_child(code, timeout=TIMEOUT_S)
    assert r.stdout.strip().splitlines()[-1] == \
        "[1.0, 7.0, 3.0] [4.0, 4.0, 8.0]", r.output
