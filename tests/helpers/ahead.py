# SPDX-License-Identifier: MIT
"""Tests that only run child processes, run side by side.

A test marked ``ahead`` does nothing in the test process but start
children (``run_child``, ``subprocess.run``) and assert on what they
leave behind; its arguments are its parameters and ``tmp_path``, nothing
else (a module's autouse fixtures that its marked tests do not depend on
are named in its ``AHEAD_HARMLESS``: they still run around each test, in
the main thread).  tests/conftest.py refuses a marked test that takes
anything else.

On the simulator, when the session reaches the first of a run of such
tests (consecutive in the order they run), the whole run is handed to a
pool: one thread per core (at most 4) takes the next test of the run and
calls its function, the main thread among them, so that as many children
run at once as there are cores.  Each test then reports its own outcome, in
its turn: a failure carries its traceback, a skip its reason.  Nothing
else runs in the test process meanwhile (the run ends where a test that
is not marked begins), so the tests in between read this process as
before.

On a GPU the tests run one by one as usual (children side by side would
share the device and its memory), and so they do everywhere with
CUDAMEM_TEST_AHEAD=0 (or 1; N: at most N at once).

What a marked test prints may show among the captured output of another
test of its run, and a per-test timeout (pytest-timeout) that fires while
the main thread runs another test of the run is reported by that one.
"""

import collections
import inspect
import os
import re
import threading

# Fixtures a marked test may have beside its parameters: the autouse
# fixtures that change nothing on the simulator, and tmp_path (made here,
# as pytest makes it).
HARMLESS = frozenset({"_no_close_on_the_main_thread", "monkeypatch",
                      "request", "tmp_path_factory", "tmp_path"})


def workers(simulator):
    """How many tests of a run go at once (1: no pool)."""
    if not simulator:
        return 1
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    want = os.environ.get("CUDAMEM_TEST_AHEAD", "")
    return max(1, int(want)) if want.strip() else min(4, cores)


def why_not(item):
    """Why ``item`` cannot be marked ahead (None: it can)."""
    params = getattr(item, "callspec", None)
    params = params.params if params is not None else {}
    args = inspect.signature(item.obj).parameters
    harmless = HARMLESS | set(getattr(item.module, "AHEAD_HARMLESS", ()))
    extra = sorted((set(item.fixturenames) - set(params) - harmless)
                   | (set(args) - set(params) - {"tmp_path"}))
    if extra:
        return "it uses the fixtures %s" % ", ".join(extra)
    if item.get_closest_marker("xfail"):
        return "it is marked xfail"
    return None


def _kwargs(item):
    """The arguments of item's function: its parameters, and tmp_path a
    fresh folder of the session's, named as pytest names it."""
    params = getattr(item, "callspec", None)
    params = params.params if params is not None else {}
    args = inspect.signature(item.obj).parameters
    kwargs = {k: v for k, v in params.items() if k in args}
    if "tmp_path" in args:
        name = re.sub(r"[\W]", "_", item.name)[:30]
        kwargs["tmp_path"] = item.config._tmp_path_factory.mktemp(name)
    return kwargs


class _Job:
    """One marked test: its function and arguments, and once run, the
    exception it raised (None: it passed)."""

    def __init__(self, item):
        self.fn = item.obj
        self.kwargs = _kwargs(item)
        self.exc = None
        self.state = "pending"          # then "running", then "done"

    def run(self):
        try:
            self.fn(**self.kwargs)
        except BaseException as e:  # noqa: BLE001 - reported by its test
            self.exc = e


class Pool:
    """The runs of marked tests of one session."""

    def __init__(self, n):
        self.n = n
        self.jobs = {}                  # nodeid -> _Job
        self.queue = collections.deque()
        self.cond = threading.Condition()

    def _take(self):
        """The next pending job, marked running; None when none is
        left.  Call with cond held."""
        while self.queue:
            job = self.queue.popleft()
            if job.state == "pending":
                job.state = "running"
                return job
        return None

    def _finish(self, job):
        with self.cond:
            job.state = "done"
            self.cond.notify_all()

    def _worker(self):
        while True:
            with self.cond:
                job = self._take()
            if job is None:
                return
            job.run()
            self._finish(job)

    def _start(self, items, index, skipped):
        """Queue the run of marked tests from items[index] on (those that
        skipped() says will be skipped left out) and start the workers."""
        run = []
        for item in items[index:]:
            if not item.get_closest_marker("ahead"):
                break
            if not skipped(item):
                run.append(item)
        with self.cond:
            for item in run:
                job = _Job(item)
                self.jobs[item.nodeid] = job
                self.queue.append(job)
        for _ in range(min(self.n, len(run)) - 1):
            threading.Thread(target=self._worker, daemon=True,
                             name="ahead").start()

    def outcome(self, item, skipped):
        """Run item's function, or wait for the worker that runs it,
        helping with the rest of the run meanwhile; re-raise what it
        raised."""
        if item.nodeid not in self.jobs:
            self._start(item.session.items, item.session.items.index(item),
                        skipped)
        job = self.jobs.pop(item.nodeid, None)
        if job is None:                 # it looked skipped: run it here
            item.obj(**_kwargs(item))
            return
        while True:
            with self.cond:
                if job.state == "pending":
                    job.state = "running"
                    other = job
                elif job.state == "done":
                    break
                else:
                    other = self._take()
                    if other is None:
                        self.cond.wait()
                        continue
            other.run()
            self._finish(other)
        if job.exc is not None:
            exc, job.exc = job.exc, None
            raise exc

    def close(self):
        """Drop what has not started (the session stops early) and wait
        for what has."""
        with self.cond:
            for job in self.queue:
                if job.state == "pending":
                    job.state = "done"
            self.queue.clear()
            while any(j.state == "running" for j in self.jobs.values()):
                self.cond.wait()
