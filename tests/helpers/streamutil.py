# SPDX-License-Identifier: MIT
"""Helpers shared by the stream, event and asyncio tests.

A ``Gate`` holds a stream at a known point: a host callback that waits
(GIL released) until the test opens the gate.  It is the only way to keep
work pending without kernels, on the simulator and on a GPU alike.

The driver may run host callbacks of different streams on one thread, so
a test keeps at most one gate closed at a time and never waits, while it is
closed, for another callback.
"""

import threading

GATE_TIMEOUT = 20.0


class Gate:
    """A host callback that blocks its stream until ``open()``."""

    def __init__(self):
        self._open = threading.Event()
        self.entered = threading.Event()
        self.timed_out = False

    def _callback(self, stream, status, arg):
        self.entered.set()
        if not self._open.wait(GATE_TIMEOUT):
            self.timed_out = True

    def block(self, stream):
        """Queue the gate on stream; later work there waits for open()."""
        stream.add_callback(self._callback)
        return self

    def open(self):
        self._open.set()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.open()
        return False
