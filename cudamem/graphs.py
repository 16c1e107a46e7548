# SPDX-License-Identifier: MIT
"""CUDA graphs: what ``Stream.end_capture()`` returns, and ``graph()``.

Capture itself is in C (``Stream.begin_capture`` / ``end_capture`` /
``is_capturing``, csrc/context/graph.c); this module holds the graph
object, which launches through ``_core`` with its context current, and
the context manager that captures a block.
"""

import threading

from . import _core

__all__ = ["Graph", "GraphPool", "graph"]


class GraphPool:
    """The memory a capture allocates from: ``Graph.pool``.

    While cudamem captures a stream, every allocation for that stream
    (and, on the capturing thread, for the default stream) comes from the
    capture's graph pool, under every memory manager: memory that no
    other work is handed while a graph that used it may be replayed.  A
    block freed by the program goes back to its graph pool; a later
    capture given the same pool (``cudamem.graph(pool=g.pool)``,
    ``Stream.begin_capture(pool=g.pool)``) reuses it, so graphs that
    share a pool must be replayed in the order they were captured.  The
    pool gives its memory back to the device once no graph holds it, no
    reference to it is left and none of its blocks is in use.

    ``GraphPool(context=None)`` makes an empty one for ``context`` (None:
    the current context), to share between captures from the start.
    """

    __slots__ = ("_capsule", "_ctx")

    def __init__(self, context=None):
        if context is None:
            context = _core.current_context()
        self._ctx = context
        self._capsule = _core._graph_pool_new(context)

    def _stats(self):
        return _core._graph_pool_stats(self._capsule)

    def __repr__(self):
        st = self._stats()
        return "<cudamem.GraphPool %d bytes, %d blocks in use>" % (
            st["reserved_bytes"], st["live_blocks"])


# Graphs closed while a capture forbade their thread to wait for their
# last launch: (event, context, generation, what they kept), settled by
# the next Graph made (each capture's end makes one) or closed.
_unsettled = []
_unsettled_lock = threading.Lock()


def _settle_unsettled():
    with _unsettled_lock:
        left = []
        for u in _unsettled:
            try:
                if not _core._graph_settle(u[0], u[1], u[2], True):
                    left.append(u)
            except Exception:
                # The context's work failed (an error the context keeps):
                # nothing of it runs any more, so nothing to wait for.
                pass
        _unsettled[:] = left


class Graph:
    """An instantiated CUDA graph, ready to launch.

    Made by ``Stream.end_capture()`` or filled by ``with
    cudamem.graph() as g``.  The pointers and values of the captured work
    are fixed: a replay reads and writes the same memory, so the graph
    keeps what the capture used through cudamem (the device memory of
    its arrays, the host arrays of its copies, its graph pool) until it
    is closed; change their contents between replays.  ``close()``
    waits for the graph's last launch to finish, then destroys it and
    lets go of that memory (idempotent); where a capture forbids the
    calling thread to wait, the memory is let go once a later graph is
    made or closed after the capture.  A closed graph, or one whose
    context was closed or reset, raises ValueError.  Launches and
    ``close()`` from several threads are serialised by the graph's
    lock, so that a graph is never destroyed while a launch of it is in
    the driver (the driver orders launches of one graph anyway).  A
    launch into a stream cudamem captures is kept by that capture's
    graph.  ``pool`` is the ``GraphPool`` its capture allocated from
    (None once closed).
    """

    def __init__(self, _exec=None, _ctx=None, _gen=0, _pool=None,
                 _held=None, _done=None):
        if _unsettled:
            _settle_unsettled()
        self._lock = threading.Lock()
        self._exec = _exec
        self._ctx = _ctx
        self._gen = _gen
        self._closed = False
        self.pool = _pool
        # What the capture used (memory owners, host arrays), kept while
        # the graph may be replayed.
        self._held = _held
        # The event each launch records after itself (close() waits for
        # it, if one was).
        self._done = _done
        self._launched = False
        # graph(): the side stream made for the block; None otherwise.
        self.stream = None

    def _check(self):
        if self._closed:
            raise ValueError("the graph is closed")
        if self._exec is None:
            raise ValueError("the graph is empty: its capture has not "
                             "ended (or failed)")

    def launch(self, stream=None):
        """Launch the graph on ``stream`` (None: the default stream)."""
        with self._lock:
            self._check()
            _core._graph_launch(self._exec, self._ctx, self._gen, stream,
                                False, self._done)
            self._launched = True

    def replay(self, stream=None):
        """Alias of ``launch``, as PyTorch names it."""
        self.launch(stream)

    def upload(self, stream=None):
        """Upload the graph's work to the device ahead of a launch."""
        with self._lock:
            self._check()
            _core._graph_launch(self._exec, self._ctx, self._gen, stream,
                                True, self._done)

    def close(self):
        """Wait for the graph's last launch, destroy the graph and let go
        of what it kept; later uses raise ValueError."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            x, self._exec = self._exec, None
            done, self._done = self._done, None
            # What the pool and the capture's objects must outlive: the
            # launches.  The pool's memory may go back once no graph
            # holds it, and what the capture used once nothing else does.
            kept = (self.pool, self._held)
            self.pool = self._held = None
            try:
                if done is not None and not _core._graph_settle(
                        done, self._ctx, self._gen, self._launched):
                    with _unsettled_lock:
                        _unsettled.append((done, self._ctx, self._gen,
                                           kept))
            finally:
                if x is not None:
                    _core._graph_destroy(x, self._ctx, self._gen)
        del kept
        if _unsettled:
            _settle_unsettled()

    @property
    def closed(self):
        return self._closed

    def _fill(self, other):
        # Take over the executable graph of other (an end_capture result).
        with self._lock, other._lock:
            self._exec, self._ctx, self._gen = (other._exec, other._ctx,
                                                other._gen)
            self.pool = other.pool
            self._held = other._held
            self._done = other._done
            self._launched = other._launched
            other._exec = None
            other.pool = None
            other._held = None
            other._done = None
            other._closed = True

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    def __repr__(self):
        state = "closed" if self._closed else (
            "empty" if self._exec is None else "ready")
        return "<cudamem.Graph %s>" % state


class graph:
    """``with cudamem.graph(stream=None, pool=None, mode="global") as g:``
    captures the block into ``g``.

    cudamem has no "current stream": the block's work must name the
    capturing stream.  With ``stream=None`` a new stream is made for the
    capture (a side stream, as PyTorch's ``torch.cuda.graph`` uses) and
    is ``g.stream``; pass it to the block's copies and kernels.  At a
    normal exit the capture ends and ``g`` can be launched; if the block
    raises, the capture is ended and thrown away (``g`` stays empty) and
    the exception propagates.  Allocations for ``g.stream``, and for the
    default stream on this thread, during the block come from ``pool``
    (a ``GraphPool``, e.g. another graph's ``.pool``), or from a new
    graph pool; ``g.pool`` is it.
    """

    def __init__(self, stream=None, pool=None, mode="global"):
        if mode not in ("global", "thread_local", "relaxed"):
            raise ValueError("mode must be 'global', 'thread_local' or "
                             "'relaxed', not %r" % (mode,))
        if pool is not None and not isinstance(pool, GraphPool):
            raise TypeError("pool must be a cudamem.GraphPool (a graph's "
                            ".pool), not %s" % type(pool).__name__)
        self._stream = stream
        self._pool = pool
        self._mode = mode
        self._graph = None

    def __enter__(self):
        if self._graph is not None:
            raise RuntimeError("a cudamem.graph() block cannot be entered "
                               "twice")
        s = self._stream if self._stream is not None else _core.stream()
        g = Graph()
        g.stream = s
        s.begin_capture(self._mode, pool=self._pool)
        self._graph = g
        return g

    def __exit__(self, et, ev, tb):
        g = self._graph
        if et is not None:
            try:
                g.stream.end_capture().close()
            except Exception:
                pass
            return False
        g._fill(g.stream.end_capture())
        return False
