# SPDX-License-Identifier: MIT
"""Replay each fuzz harness's seed corpus (tests/fuzz/corpus/<name>/)
through its TestOneInput, in a child process per harness, so that an
input that once found a bug keeps being checked by the ordinary suite,
on the backend the suite runs on (the real driver on a GPU, under a
device memory limit so that no input can take the card).
The fuzzing itself is tests/fuzz/run.py (run by .ci/run).  Inputs that
hit bugs already filed are stepped around (CUDAMEM_FUZZ_SKIP_KNOWN=1);
skipped without atheris."""

import os
import subprocess
import sys

import pytest

from helpers import TESTS, environ
from helpers.isolation import limit_device_memory_on_a_gpu

# Each test only runs children (tests/helpers/ahead.py).
pytestmark = pytest.mark.ahead

FUZZ = TESTS / "fuzz"
NAMES = sorted(p.stem[len("fuzz_"):] for p in FUZZ.glob("fuzz_*.py"))

REPLAY = r"""
import pathlib, sys
import fuzz_{name} as m
for p in sorted(pathlib.Path(sys.argv[1]).iterdir()):
    print(p.name, flush=True)
    m.TestOneInput(p.read_bytes())
"""


@pytest.mark.parametrize("name", NAMES)
def test_seed_corpus_replays_clean(name):
    pytest.importorskip("atheris")
    seeds = FUZZ / "corpus" / name
    assert any(seeds.iterdir()), "no seed corpus for %s" % name
    env = dict(environ(), CUDAMEM_FUZZ_SKIP_KNOWN="1",
               CUDAMEM_SIMULATOR=os.environ.get("CUDAMEM_SIMULATOR", "1"))
    limit_device_memory_on_a_gpu(env, "2GiB")
    env.pop("CUDAMEM_FUZZ_LAST_INPUT", None)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(FUZZ.parent.parent), str(FUZZ)]
        + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    r = subprocess.run([sys.executable, "-c", REPLAY.format(name=name),
                        str(seeds)], env=env, capture_output=True,
                       timeout=240)
    last = r.stdout.decode().split()[-1:] or ["(none)"]
    assert r.returncode == 0, (
        "harness %s failed (exit %d) on seed %s:\n%s"
        % (name, r.returncode, last[0], r.stderr.decode()[-3000:]))
