# SPDX-License-Identifier: MIT
"""Streams and events: per-call overhead, side by side."""

import threading


# stream() create + drop -----------------------------------------------------

def _stream_cm(cm):
    return cm.stream


def _stream_numba(cuda):
    return cuda.stream


def _stream_cupy(cp):
    return lambda: cp.cuda.Stream(non_blocking=False)


def _stream_torch(torch):
    return torch.cuda.Stream


# synchronize() on an idle stream -------------------------------------------

def _sync_cm(cm):
    return cm.stream().synchronize


def _sync_numba(cuda):
    return cuda.stream().synchronize


def _sync_cupy(cp):
    return cp.cuda.Stream(non_blocking=False).synchronize


def _sync_torch(torch):
    return torch.cuda.Stream().synchronize


# event() create ------------------------------------------------------------

def _event_cm(cm):
    return cm.event


def _event_numba(cuda):
    return cuda.event


def _event_cupy(cp):
    return cp.cuda.Event


def _event_torch(torch):
    return lambda: torch.cuda.Event(enable_timing=True)


# record + synchronize --------------------------------------------------------

def _rec(timing):
    def cm_(cm):
        s = cm.stream()
        e = cm.event(timing=timing)

        def run():
            e.record(s)
            e.synchronize()
        return run

    def numba_(cuda):
        s = cuda.stream()
        e = cuda.event(timing=timing)

        def run():
            e.record(s)
            e.synchronize()
        return run

    def cupy_(cp):
        s = cp.cuda.Stream(non_blocking=False)
        e = cp.cuda.Event(disable_timing=not timing)

        def run():
            e.record(s)
            e.synchronize()
        return run

    def torch_(torch):
        s = torch.cuda.Stream()
        e = torch.cuda.Event(enable_timing=timing)

        def run():
            e.record(s)
            e.synchronize()
        return run

    return {"cudamem": cm_, "numba": numba_, "cupy": cupy_, "torch": torch_}


# add_callback round trip ----------------------------------------------------

def _callback_cm(cm):
    s = cm.stream()
    done = threading.Event()

    def cb(stream, status, arg):
        done.set()

    def run():
        done.clear()
        s.add_callback(cb)
        done.wait()
    return run


def _callback_cupy(cp):
    s = cp.cuda.Stream(non_blocking=False)
    done = threading.Event()

    def cb(stream, status, arg):
        done.set()

    def run():
        done.clear()
        s.add_callback(cb, None)
        done.wait()
    return run


OPS = [
    {"name": "stream() create+drop",
     "impls": {"cudamem": _stream_cm, "numba": _stream_numba,
               "cupy": _stream_cupy, "torch": _stream_torch}},
    {"name": "stream.synchronize() idle",
     "impls": {"cudamem": _sync_cm, "numba": _sync_numba,
               "cupy": _sync_cupy, "torch": _sync_torch}},
    {"name": "event() create+drop",
     "impls": {"cudamem": _event_cm, "numba": _event_numba,
               "cupy": _event_cupy, "torch": _event_torch}},
    {"name": "event record+sync (timing)", "impls": _rec(True)},
    {"name": "event record+sync (no timing)", "impls": _rec(False)},
    {"name": "add_callback round trip",
     "impls": {"cudamem": _callback_cm, "cupy": _callback_cupy}},
]
