# SPDX-License-Identifier: MIT
"""Run Python code in a child interpreter so that a crash fails one test
instead of ending the whole session.

``run_child(code)`` starts ``sys.executable`` with faulthandler on, the
environment inherited (CUDAMEM_SIMULATOR, sanitizer settings) and the
repository and ``tests/`` put in front of PYTHONPATH.  A child killed by
a signal, or one faulthandler reports a fatal signal in (a sanitizer may
then end it with a plain exit status), becomes a test failure naming the
signal ("child died of SIGSEGV") with the child's stderr, where
faulthandler or the sanitizer wrote its report.  A child still running
after ``timeout`` seconds is sent SIGABRT, so that faulthandler prints
every thread's stack, and becomes a failure naming the timeout.
"""

import dataclasses
import os
import pathlib
import re
import signal
import subprocess
import sys
import textwrap

import pytest

# tests/ (where the helpers package and the test folders are) and the
# repository above it.
TESTS = pathlib.Path(__file__).resolve().parent.parent
ROOT = TESTS.parent

# How long a hung child may take to print its stacks after SIGABRT.
_DUMP_GRACE = 10

# faulthandler's words for the signals it reports.
_FATAL = {"Segmentation fault": "SIGSEGV", "Bus error": "SIGBUS",
          "Floating-point exception": "SIGFPE",
          "Illegal instruction": "SIGILL", "Aborted": "SIGABRT"}


@dataclasses.dataclass
class ChildResult:
    """What a child left behind."""

    returncode: int
    stdout: str
    stderr: str

    @property
    def output(self):
        """stdout then stderr."""
        return self.stdout + self.stderr

    @property
    def signame(self):
        """The name of the signal that killed the child, or None.  Under
        a sanitizer, which may end the process with a plain exit status
        after a fatal signal, faulthandler's report names it."""
        name = signal_name(self.returncode)
        if name is None:
            m = re.search(r"^Fatal Python error: (.*)$", self.stderr,
                          re.MULTILINE)
            if m:
                name = _FATAL.get(m.group(1).strip(),
                                  "a fatal error (%s)" % m.group(1))
        return name


def signal_name(returncode):
    """"SIGSEGV" for a returncode of -11; None for a normal exit."""
    if returncode >= 0:
        return None
    try:
        return signal.Signals(-returncode).name
    except ValueError:
        return "signal %d" % -returncode


def environ():
    """A copy of os.environ.  A worker thread (tests/helpers/ahead.py)
    copies it while pytest's main thread sets and removes
    PYTEST_CURRENT_TEST: a copy that met a key removed under it
    (KeyError) is taken again."""
    while True:
        try:
            return dict(os.environ)
        except KeyError:
            continue


def child_env(**env):
    """The environment of a child: this one, with the repository and
    tests/ first on PYTHONPATH and faulthandler on, updated by env (a
    value of None removes the variable)."""
    e = environ()
    path = [str(ROOT), str(TESTS)]
    if e.get("PYTHONPATH"):
        path.append(e["PYTHONPATH"])
    e["PYTHONPATH"] = os.pathsep.join(path)
    e["PYTHONFAULTHANDLER"] = "1"
    for k, v in env.items():
        if v is None:
            e.pop(k, None)
        else:
            e[k] = str(v)
    return e


def _text(data):
    """The child's output as text, newlines translated as text mode
    would."""
    if data is None:
        return ""
    if isinstance(data, bytes):
        data = data.decode("utf-8", "replace")
    return data.replace("\r\n", "\n").replace("\r", "\n")


def _tail(text, limit=6000):
    return text if len(text) <= limit else "...\n" + text[-limit:]


def run_child(code, *, timeout=120, env=None, args=(), check=True,
              allow_signals=(), stdin=None):
    """Run ``code`` (dedented) in a fresh interpreter; a ChildResult.

    Parameters
    ----------
    code : str
        Python source, run with ``python -c``; ``args`` follow it in
        ``sys.argv``.
    timeout : float
        Seconds before the child counts as hung: it is sent SIGABRT (so
        that faulthandler dumps its threads), then killed, and the test
        fails naming the timeout.
    env : dict, optional
        Variables to set (None: to remove) in the child, over
        ``child_env()``.
    check : bool
        Fail the test when the child exits with a non-zero status.
    allow_signals : iterable of signal.Signals or str
        Signals the test expects the child to die of; death by any other
        signal fails the test with the signal's name and the child's
        stderr.
    stdin : bytes or str, optional
        What the child reads on its standard input (by default it
        inherits this process's).
    """
    allowed = {s if isinstance(s, str) else signal.Signals(s).name
               for s in allow_signals}
    cmd = [sys.executable, "-X", "faulthandler", "-c",
           textwrap.dedent(code), *map(str, args)]
    if isinstance(stdin, str):
        stdin = stdin.encode()
    proc = subprocess.Popen(cmd, env=child_env(**(env or {})),
                            stdin=None if stdin is None else subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        out, err = map(_text, proc.communicate(stdin, timeout=timeout))
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGABRT)
        try:
            out, err = map(_text, proc.communicate(timeout=_DUMP_GRACE))
        except subprocess.TimeoutExpired as exc:
            proc.kill()
            rest_out, rest_err = proc.communicate()
            out = _text(exc.stdout) + _text(rest_out)
            err = _text(exc.stderr) + _text(rest_err)
        pytest.fail("child hung: still running after %g s (sent SIGABRT)"
                    "\n--- stdout ---\n%s\n--- stderr ---\n%s"
                    % (timeout, _tail(out), _tail(err)), pytrace=False)
    res = ChildResult(proc.returncode, out, err)
    sig = res.signame
    if sig is not None and sig not in allowed:
        pytest.fail("child died of %s\n--- stdout ---\n%s\n--- stderr ---\n%s"
                    % (sig, _tail(out), _tail(err)), pytrace=False)
    if check and sig is None and res.returncode != 0:
        pytest.fail("child exited with status %d\n--- stdout ---\n%s\n"
                    "--- stderr ---\n%s"
                    % (res.returncode, _tail(out), _tail(err)),
                    pytrace=False)
    return res


def run_py(code, *, timeout=120, unset=(), **env):
    """(returncode, stdout + stderr) of ``code`` in a fresh interpreter.

    The variables of ``env`` are set in the child (None: removed), those
    named in ``unset`` removed.  Unlike ``run_child`` a non-zero exit is
    returned, not a failure, for tests that expect one; a crash or a hang
    still fails the test, naming the signal.
    """
    env = dict({k: None for k in unset}, **env)
    r = run_child(code, timeout=timeout, env=env, check=False)
    return r.returncode, r.output
