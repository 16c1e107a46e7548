# SPDX-License-Identifier: MIT
"""A headless Chromium driven through the DevTools protocol, for the
tests that look at a page as a person would (tests/tools/test_viewer.py).

The browser is started with ``--remote-debugging-pipe``: the protocol's
JSON messages go over two pipes (the browser reads its fd 3 and writes
its fd 4, each message ended by a NUL byte), so no port, no websocket
and no Python package beyond the standard library are needed.

- ``find_chromium()``: the browser's path, or None;
- ``Browser``: one browser process; ``Browser.page()`` opens a tab;
- ``Page``: navigate, evaluate JavaScript, move or click the mouse, take
  a screenshot, and the console errors and uncaught exceptions seen;
- ``read_png(data)``: a PNG's pixels as rows of (r, g, b) tuples (8-bit
  RGB or RGBA, not interlaced: what Chromium writes), with zlib alone.
"""

import base64
import json
import os
import select
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time
import zlib

__all__ = ["Browser", "BrowserError", "Page", "find_chromium", "read_png"]

_NAMES = ("chromium", "chromium-browser", "google-chrome",
          "google-chrome-stable", "chrome")


class BrowserError(RuntimeError):
    """The browser failed, answered with an error, or did not answer."""


def find_chromium():
    """The path of a Chromium or Chrome, or None.  CUDAMEM_CHROMIUM names
    one explicitly."""
    env = os.environ.get("CUDAMEM_CHROMIUM")
    if env:
        return env if os.access(env, os.X_OK) else None
    for name in _NAMES:
        path = shutil.which(name)
        if path:
            return path
    return None


class Browser:
    """A headless browser; a context manager that ends it on exit."""

    def __init__(self, path=None, width=1280, height=900, timeout=60.0):
        self.path = path or find_chromium()
        if self.path is None:
            raise BrowserError("no Chromium or Chrome found")
        self.timeout = timeout
        self._profile = tempfile.mkdtemp(prefix="cudamem-chromium-")
        to_browser_r, self._w = os.pipe()
        self._r, from_browser_w = os.pipe()
        args = [self.path, "--headless", "--remote-debugging-pipe",
                "--no-first-run", "--no-default-browser-check",
                "--disable-gpu", "--disable-extensions",
                "--disable-background-networking", "--disable-sync",
                "--hide-scrollbars", "--mute-audio",
                "--user-data-dir=" + self._profile,
                "--window-size=%d,%d" % (width, height)]
        if hasattr(os, "geteuid") and os.geteuid() == 0:
            args.append("--no-sandbox")        # Chromium refuses root else
        # The sanitizer runs of the suite preload their runtimes: the
        # browser must not inherit them.
        env = {k: v for k, v in os.environ.items()
               if k not in ("LD_PRELOAD", "ASAN_OPTIONS", "UBSAN_OPTIONS")}
        # A small Python trampoline puts the two pipe ends on fds 3 and 4
        # and becomes the browser (no preexec_fn, which is unsafe in a
        # threaded process, and no shell, whose redirections may stop at
        # fd 9).
        trampoline = (
            "import fcntl, os, sys\n"
            "r = fcntl.fcntl(%d, fcntl.F_DUPFD, 10)\n"
            "w = fcntl.fcntl(%d, fcntl.F_DUPFD, 10)\n"
            "os.dup2(r, 3)\nos.dup2(w, 4)\n"
            "os.set_inheritable(3, True)\nos.set_inheritable(4, True)\n"
            "os.execv(sys.argv[1], sys.argv[1:])\n"
            % (to_browser_r, from_browser_w))
        self._log = tempfile.TemporaryFile()
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-c", trampoline] + args,
                pass_fds=(to_browser_r, from_browser_w),
                stdin=subprocess.DEVNULL, stdout=self._log,
                stderr=subprocess.STDOUT, env=env, start_new_session=True)
        finally:
            os.close(to_browser_r)
            os.close(from_browser_w)
        self._buf = b""
        self._next_id = 0
        self._events = []
        try:
            self.version = self.call("Browser.getVersion")["product"]
        except BaseException:
            self.close()
            raise

    # -- the protocol --------------------------------------------------------

    def _send(self, method, params=None, session=None):
        self._next_id += 1
        msg = {"id": self._next_id, "method": method,
               "params": params or {}}
        if session is not None:
            msg["sessionId"] = session
        data = json.dumps(msg).encode() + b"\0"
        try:
            while data:
                n = os.write(self._w, data)
                data = data[n:]
        except OSError as e:
            raise BrowserError("cannot send %s to the browser (%s):\n%s"
                               % (method, e, self.log())) from e
        return self._next_id

    def _read_one(self, deadline):
        """The next message from the browser, or None at the deadline."""
        while b"\0" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            ready, _, _ = select.select([self._r], [], [], left)
            if not ready:
                return None
            chunk = os.read(self._r, 1 << 20)
            if not chunk:
                raise BrowserError("the browser closed its pipe:\n"
                                   + self.log())
            self._buf += chunk
        raw, self._buf = self._buf.split(b"\0", 1)
        return json.loads(raw)

    def call(self, method, params=None, session=None, timeout=None):
        """Send one command and wait for its answer; events that arrive
        meanwhile are kept for ``events``."""
        mid = self._send(method, params, session)
        deadline = time.monotonic() + (timeout or self.timeout)
        while True:
            msg = self._read_one(deadline)
            if msg is None:
                raise BrowserError("no answer to %s in time" % method)
            if msg.get("id") == mid:
                if "error" in msg:
                    raise BrowserError("%s: %s" % (method, msg["error"]))
                return msg.get("result", {})
            if "method" in msg:
                self._events.append(msg)

    def pump(self, timeout=0.0):
        """Read the events that have arrived (waiting up to timeout for
        the first)."""
        deadline = time.monotonic() + timeout
        while True:
            msg = self._read_one(deadline)
            if msg is None:
                return
            if "method" in msg:
                self._events.append(msg)
            deadline = time.monotonic()

    def wait_event(self, method, session=None, timeout=None):
        """The first event named method (of that session), waiting for
        it; the events before it stay queued."""
        deadline = time.monotonic() + (timeout or self.timeout)
        seen = 0
        while True:
            for ev in self._events[seen:]:
                if ev["method"] == method and (
                        session is None or ev.get("sessionId") == session):
                    return ev
            seen = len(self._events)
            msg = self._read_one(deadline)
            if msg is None:
                raise BrowserError("no %s event in time" % method)
            if "method" in msg:
                self._events.append(msg)

    def events(self, session=None):
        return [e for e in self._events
                if session is None or e.get("sessionId") == session]

    def log(self):
        """What the browser printed (its stderr), for a failure's
        message."""
        if self._log is None:
            return ""
        self._log.seek(0)
        return self._log.read().decode(errors="replace")[-4000:]

    # -- pages ---------------------------------------------------------------

    def page(self, width=1280, height=900):
        """A new tab, attached, with the runtime and the log enabled."""
        target = self.call("Target.createTarget",
                           {"url": "about:blank"})["targetId"]
        session = self.call("Target.attachToTarget",
                            {"targetId": target,
                             "flatten": True})["sessionId"]
        page = Page(self, session)
        for domain in ("Page", "Runtime", "Log"):
            page.call(domain + ".enable")
        page.call("Emulation.setDeviceMetricsOverride",
                  {"width": width, "height": height,
                   "deviceScaleFactor": 1, "mobile": False})
        return page

    # -- the end -------------------------------------------------------------

    def close(self):
        if getattr(self, "proc", None) is not None:
            if self.proc.poll() is None:
                try:
                    self._send("Browser.close")
                    self.proc.wait(timeout=10)
                except (BrowserError, subprocess.TimeoutExpired):
                    # The browser's own session: its helpers go too.
                    try:
                        os.killpg(self.proc.pid, signal.SIGKILL)
                    except OSError:
                        pass
                    self.proc.wait(timeout=10)
            self.proc = None
        for fd in ("_r", "_w"):
            if getattr(self, fd, None) is not None:
                os.close(getattr(self, fd))
                setattr(self, fd, None)
        if getattr(self, "_log", None) is not None:
            self._log.close()
            self._log = None
        shutil.rmtree(self._profile, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class Page:
    """One tab of a Browser."""

    def __init__(self, browser, session):
        self.browser = browser
        self.session = session

    def call(self, method, params=None, timeout=None):
        return self.browser.call(method, params, self.session, timeout)

    def navigate(self, url, timeout=None):
        """Load url and wait for its load event; seconds it took."""
        t0 = time.perf_counter()
        res = self.call("Page.navigate", {"url": url})
        if res.get("errorText"):
            raise BrowserError("navigate %s: %s" % (url, res["errorText"]))
        self.browser.wait_event("Page.loadEventFired", self.session,
                                timeout)
        return time.perf_counter() - t0

    def evaluate(self, expression, timeout=None):
        """The JSON value of a JavaScript expression (promises awaited);
        BrowserError if it throws."""
        res = self.call("Runtime.evaluate",
                        {"expression": expression, "returnByValue": True,
                         "awaitPromise": True}, timeout)
        if "exceptionDetails" in res:
            d = res["exceptionDetails"]
            text = d.get("exception", {}).get("description") or d["text"]
            raise BrowserError("script failed: %s" % text)
        return res["result"].get("value")

    def mouse(self, kind, x, y, button="none", clicks=0):
        """One mouse event at (x, y) CSS pixels of the viewport (kind:
        mouseMoved, mousePressed, mouseReleased)."""
        self.call("Input.dispatchMouseEvent",
                  {"type": kind, "x": x, "y": y, "button": button,
                   "clickCount": clicks})

    def hover(self, x, y):
        self.mouse("mouseMoved", x, y)

    def click(self, x, y):
        self.mouse("mouseMoved", x, y)
        self.mouse("mousePressed", x, y, "left", 1)
        self.mouse("mouseReleased", x, y, "left", 1)

    def screenshot(self, full_page=True):
        """The page as PNG bytes (the whole page, not only the
        viewport, by default)."""
        params = {"format": "png"}
        if full_page:
            params["captureBeyondViewport"] = True
            m = self.call("Page.getLayoutMetrics")
            size = m.get("cssContentSize") or m["contentSize"]
            params["clip"] = {"x": 0, "y": 0, "width": size["width"],
                              "height": size["height"], "scale": 1}
        return base64.b64decode(
            self.call("Page.captureScreenshot", params)["data"])

    def problems(self):
        """The console errors, failed asserts, uncaught exceptions and
        browser log errors of this tab so far, as strings."""
        self.browser.pump()
        out = []
        for ev in self.browser.events(self.session):
            m, p = ev["method"], ev.get("params", {})
            if m == "Runtime.exceptionThrown":
                d = p["exceptionDetails"]
                out.append("exception: %s" % (
                    d.get("exception", {}).get("description")
                    or d.get("text")))
            elif m == "Runtime.consoleAPICalled" and p["type"] in (
                    "error", "assert"):
                out.append("console.%s: %s" % (p["type"], " ".join(
                    str(a.get("value", a.get("description", "")))
                    for a in p.get("args", []))))
            elif m == "Log.entryAdded" and p["entry"]["level"] == "error":
                out.append("log: %s (%s)" % (p["entry"]["text"],
                                             p["entry"].get("url", "")))
        return out


# ---------------------------------------------------------------------------
# PNG


def _paeth(a, b, c):
    p = a + b - c
    pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
    if pa <= pb and pa <= pc:
        return a
    return b if pb <= pc else c


def read_png(data):
    """(width, height, rows): rows[y][x] is (r, g, b).  8-bit RGB or RGBA
    only, not interlaced; ValueError otherwise."""
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        raise ValueError("not a PNG")
    pos = 8
    idat = []
    width = height = None
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + length]
        pos += 12 + length
        if kind == b"IHDR":
            width, height, depth, color, _, _, interlace = struct.unpack(
                ">IIBBBBB", body)
            if depth != 8 or color not in (2, 6) or interlace:
                raise ValueError("unsupported PNG (depth %d, colour type "
                                 "%d, interlace %d)" % (depth, color,
                                                        interlace))
            bpp = 3 if color == 2 else 4
        elif kind == b"IDAT":
            idat.append(body)
        elif kind == b"IEND":
            break
    if width is None:
        raise ValueError("PNG without IHDR")
    raw = zlib.decompress(b"".join(idat))
    stride = width * bpp
    rows = []
    prev = bytearray(stride)
    pos = 0
    for _ in range(height):
        ftype = raw[pos]
        line = bytearray(raw[pos + 1:pos + 1 + stride])
        pos += 1 + stride
        if ftype == 1:
            for i in range(bpp, stride):
                line[i] = (line[i] + line[i - bpp]) & 0xFF
        elif ftype == 2:
            for i in range(stride):
                line[i] = (line[i] + prev[i]) & 0xFF
        elif ftype == 3:
            for i in range(stride):
                left = line[i - bpp] if i >= bpp else 0
                line[i] = (line[i] + ((left + prev[i]) >> 1)) & 0xFF
        elif ftype == 4:
            for i in range(stride):
                left = line[i - bpp] if i >= bpp else 0
                up_left = prev[i - bpp] if i >= bpp else 0
                line[i] = (line[i] + _paeth(left, prev[i], up_left)) & 0xFF
        elif ftype != 0:
            raise ValueError("bad PNG filter %d" % ftype)
        rows.append([tuple(line[i:i + 3]) for i in range(0, stride, bpp)])
        prev = line
    return width, height, rows
