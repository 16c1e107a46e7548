# SPDX-License-Identifier: MIT
"""Python stream callbacks while other threads call into the driver.

The driver runs a stream callback on a thread of its own that holds the
driver's lock, and a Python callback waits there for the GIL.  A thread
that holds the GIL and enters the driver meanwhile waits for that lock:
neither moves again.  cudamem releases the GIL around its driver calls
while a Python callback is in flight, so this must never hang.  The
simulator models the lock (another thread's driver call waits while a
callback runs), so the hang shows there as it does on a GPU.

Each case runs in a child process with a limit: a hang is reported with
every thread's stack.
"""

import pytest
from helpers.crashutil import run_child

# Each test only runs children (tests/helpers/ahead.py).
pytestmark = pytest.mark.ahead

CHILD = r'''
import sys
import threading
import time

import numpy as np

import cudamem as cuda

which = sys.argv[1]
seconds = float(sys.argv[2])
stop = threading.Event()
errors = []
done = [0]


def callbacks():
    # Callbacks that do some Python work, always one or more in flight.
    s = cuda.stream()
    d = cuda.device_array(1 << 12, dtype=np.float32)
    while not stop.is_set():
        for i in range(4):
            d.copy_to_host(stream=s)
            s.add_callback(lambda st, status, arg: sum(range(200)), i)
        s.synchronize()
        done[0] += 1


def streams():
    s = cuda.stream()
    s.synchronize()
    s.query()


def events():
    a = cuda.event()
    a.record()
    a.synchronize()
    b = cuda.event(timing=False)
    b.record()
    b.query()


def device_arrays():
    h = np.arange(256, dtype=np.float32)
    d = cuda.to_device(h)
    assert (d.copy_to_host() == h).all()
    e = cuda.device_array(1000)
    del e


def kernels():
    d = cuda.device_array((16, 32), dtype=np.float32)
    d[:] = 1.0
    assert d.T.copy_to_host().shape == (32, 16)


def hostmem():
    a = cuda.pinned_array(1 << 12)
    m = cuda.mapped_array(1 << 12)
    g = cuda.managed_array(1 << 12)
    del a, m, g


def context():
    ctx = cuda.current_context()
    ctx.get_memory_info()
    ctx.synchronize()


def assign_async(counter=[0]):
    # d[...] = value on a stream reads the value from a mapped buffer
    # taken for it; buffers taken by threads whose GIL was released in
    # between must never be shared: each thread reads back its own.
    counter[0] += 1
    v = float(counter[0] * 1000 + threading.get_ident() % 997)
    s = cuda.stream()
    d = cuda.device_array(64, dtype=np.float64, stream=s)
    d.copy_to_device(np.zeros(64), stream=s)
    d[:] = v
    d[1:9] = np.arange(8.0) + v
    out = d.copy_to_host(stream=s)
    s.synchronize()
    want = np.full(64, v)
    want[1:9] = np.arange(8.0) + v
    assert (out == want).all(), (v, out[:10])


def pool_stats(counter=[0]):
    # Allocations of changing sizes (the pool manager grows) and
    # memory_stats(): both take the pool's mutex, which other threads hold
    # across driver calls.
    counter[0] += 1
    n = (1 << 20) * (1 + counter[0] % 7) + 64 * (counter[0] % 13)
    d = cuda.device_array(n, dtype=np.uint8)
    cuda.memory_stats()
    del d


WORKERS = {"streams": streams, "events": events,
           "device_arrays": device_arrays, "kernels": kernels,
           "hostmem": hostmem, "context": context,
           "assign_async": assign_async, "pool_stats": pool_stats}


def work(fn):
    while not stop.is_set():
        try:
            fn()
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(repr(exc))
            return


cuda.to_device(np.zeros(4))
fns = list(WORKERS.values()) if which == "all" else [WORKERS[which]]
threads = [threading.Thread(target=callbacks)]
threads += [threading.Thread(target=work, args=(fn,)) for fn in fns * 2]
for t in threads:
    t.start()
time.sleep(seconds)
stop.set()
for t in threads:
    t.join()
assert not errors, errors
assert done[0] > 0
print("ok", done[0])
'''


@pytest.mark.parametrize("which", ["streams", "events", "device_arrays",
                                   "kernels", "hostmem", "context",
                                   "assign_async", "pool_stats", "all"])
def test_driver_calls_beside_python_callbacks(which):
    p = run_child(CHILD, timeout=60, args=(which, "1.0"))
    assert p.stdout.startswith("ok"), p.output[-3000:]


@pytest.mark.parametrize("manager", ["pool", "async"])
def test_driver_calls_beside_python_callbacks_under_manager(manager):
    p = run_child(CHILD, timeout=60, args=("all", "1.0"),
                  env={"CUDAMEM_MEMORY_MANAGER": manager})
    assert p.stdout.startswith("ok"), p.output[-3000:]
