# SPDX-License-Identifier: MIT
"""What the differential programs share: a record of each step's result
(a hash of the output's bytes, and a float summary), the peak device
memory seen, the JSON they print, and the comparison of two runs.

A step is ``bitwise`` when the operation is deterministic on one GPU
(elementwise kernels, sorts, gathers, seeded random numbers, integer
arithmetic, PyTorch under ``torch.use_deterministic_algorithms(True)``):
the two runs must give the same bytes.  A step is ``close`` where the
library does not promise the same bytes from run to run (floating-point
reductions, cuBLAS and cuFFT in CuPy): the summaries must agree within a
relative tolerance, and whether the bytes were equal anyway is reported.

Nothing here imports CuPy, PyTorch or cudamem: the programs hand it host
(NumPy) arrays.
"""

import hashlib
import json
import math
import sys
import traceback

import numpy as np

#: The relative tolerance of ``close`` steps, against the sum of the
#: absolute values (a reordered float32 sum of a million terms moves by
#: far less).
RTOL = 1e-4
#: How many leading values a summary keeps.
HEAD = 8


def summarize(a):
    """Hash and float summary of a host array (or scalar)."""
    a = np.ascontiguousarray(np.asarray(a))
    h = hashlib.sha256()
    h.update(str(a.dtype.str).encode())
    h.update(repr(a.shape).encode())
    h.update(a.tobytes())
    out = {"sha256": h.hexdigest(), "dtype": a.dtype.str,
           "shape": list(a.shape)}
    if a.dtype.kind in "biufc":
        f = a.astype(np.complex128 if a.dtype.kind == "c" else np.float64)
        flat = f.ravel()
        finite = np.isfinite(flat)
        good = flat[finite]
        out["nonfinite"] = int(flat.size - good.size)
        out["sum"] = _num(good.sum()) if good.size else 0.0
        out["abs_sum"] = float(np.abs(good).sum()) if good.size else 0.0
        out["head"] = [_num(v) for v in flat[:HEAD]]
    return out


def _num(v):
    """A JSON number, or [re, im] for a complex one."""
    if isinstance(v, complex) or np.iscomplexobj(v):
        return [float(np.real(v)), float(np.imag(v))]
    return float(v)


class Record:
    """The steps of one run, the peak memory samples, and any failure."""

    def __init__(self, library, allocator, manager):
        self.data = {"library": library, "allocator": allocator,
                     "manager": manager, "steps": {}, "memory": {},
                     "error": None}
        self._sampler = None

    def sampler(self, fn):
        """``fn()`` -> {name: bytes}: called at every step; the maximum of
        each name is kept as the peak."""
        self._sampler = fn
        self.sample()

    def sample(self):
        if self._sampler is None:
            return
        try:
            got = self._sampler()
        except Exception as e:  # noqa: BLE001 - a sample is not the test
            self.data["memory"]["sample_error"] = "%s: %s" % (
                type(e).__name__, e)
            return
        mem = self.data["memory"]
        for k, v in got.items():
            if v is None:
                continue
            key = "peak_" + k
            mem[key] = max(mem.get(key, 0), int(v))

    def step(self, name, value, kind="bitwise"):
        """Record ``value`` (a host array) as step ``name``."""
        assert kind in ("bitwise", "close"), kind
        s = summarize(value)
        s["kind"] = kind
        self.data["steps"][name] = s
        self.sample()

    def note(self, key, value):
        self.data[key] = value

    def fail(self, where):
        self.data["error"] = "%s: %s" % (where, traceback.format_exc())

    def emit(self):
        """Print the record as the last line of stdout."""
        sys.stdout.flush()
        print(json.dumps(self.data, sort_keys=True))
        sys.stdout.flush()
        return 1 if self.data["error"] else 0


def _close(a, b, scale):
    if isinstance(a, list) or isinstance(b, list):
        if not (isinstance(a, list) and isinstance(b, list)
                and len(a) == len(b)):
            return False
        return all(_close(x, y, scale) for x, y in zip(a, b, strict=True))
    return abs(a - b) <= RTOL * scale + 1e-30


def compare(ref, got):
    """The differences between two runs' records: a list of sentences,
    empty when every step agrees (bitwise steps byte for byte, close steps
    within RTOL), plus the close steps whose bytes were equal anyway."""
    problems = []
    for rec in (ref, got):
        if rec.get("error"):
            problems.append("%s/%s/%s failed: %s" % (
                rec["library"], rec["allocator"], rec["manager"],
                rec["error"].strip().splitlines()[-1]))
    if problems:
        return problems, []
    who = "%s (reference) and %s" % (ref["allocator"], got["allocator"])
    a, b = ref["steps"], got["steps"]
    for name in sorted(set(a) | set(b)):
        if name not in b or name not in a:
            problems.append("step %s ran in only one of %s" % (name, who))
            continue
        x, y = a[name], b[name]
        if x["sha256"] == y["sha256"]:
            continue
        if (x["dtype"], x["shape"]) != (y["dtype"], y["shape"]):
            problems.append("step %s: %s %s against %s %s" % (
                name, x["dtype"], x["shape"], y["dtype"], y["shape"]))
            continue
        if x["kind"] == "bitwise":
            problems.append(
                "step %s (bitwise) differs between %s: sum %r against %r, "
                "first values %r against %r" % (
                    name, who, x.get("sum"), y.get("sum"), x.get("head"),
                    y.get("head")))
            continue
        scale = max(x.get("abs_sum", 0.0), y.get("abs_sum", 0.0), 1e-30)
        ok = (x.get("nonfinite") == y.get("nonfinite")
              and _close(x.get("sum"), y.get("sum"), scale)
              and _close(x.get("abs_sum"), y.get("abs_sum"), scale)
              and _close(x.get("head"), y.get("head"),
                         max(abs(v) if not isinstance(v, list)
                             else math.hypot(*v)
                             for v in x.get("head") or [1.0]) or 1.0))
        if not ok:
            problems.append(
                "step %s (close, rtol %g) differs between %s: sum %r "
                "against %r, first values %r against %r" % (
                    name, RTOL, who, x.get("sum"), y.get("sum"),
                    x.get("head"), y.get("head")))
    same_bytes = sorted(n for n in set(a) & set(b)
                        if a[n]["kind"] == "close"
                        and a[n]["sha256"] == b[n]["sha256"])
    return problems, same_bytes


def last_json(stdout):
    """The record a program printed (its last line of stdout)."""
    for line in reversed(stdout.strip().splitlines()):
        line = line.strip()
        if line.startswith("{"):
            return json.loads(line)
    raise ValueError("no JSON record in the program's output")
