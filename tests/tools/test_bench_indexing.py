# SPDX-License-Identifier: MIT
"""benchmarks/ops_indexing.py: the mask's first stage timed alone is the
stage d[mask] starts with (the offsets of the true elements)."""

import numpy as np

import cudamem as cuda
from cudamem import _core
from helpers import ROOT


def test_mask_offsets_row(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    import ops_indexing

    mask = np.zeros(ops_indexing.N, bool)
    mask[[0, 5, 7, ops_indexing.N - 1]] = True
    monkeypatch.setattr(ops_indexing, "_MASK", mask)
    run = ops_indexing._cudamem_mask_offsets(cuda)
    run()
    offs = _core._ix_mask(run.keep[0], (4,), _core.default_stream())
    assert (offs.copy_to_host() == 4 * np.flatnonzero(mask)).all()
    names = [op["name"] for op in ops_indexing.OPS]
    assert names[-1] == "mask offsets only 1M [pool]"
    assert set(ops_indexing.OPS[-1]["impls"]) == {"cudamem"}
    m = ops_indexing._measure("mask_offsets", repeats=3)
    assert len(m) == 3 and min(m) > 0
