# SPDX-License-Identifier: MIT
"""csrc/context/kbatch.c's kernel, its CUDA C source (which the embedded
PTX is checked to be compiled from, test_kcopy_ptx.py) run on the host:
one block of 512 threads as POSIX threads, ``__syncthreads()`` a barrier,
the dynamic shared memory an array.  Seeded random batches over a few
buffers (preloads of sources no earlier copy writes, read-once for a
range read twice; barriers where a copy depends on one since the last;
aligned and unaligned sizes and offsets) must leave the buffers as NumPy
applying the copies in order does.  So the kernel's preload cursor and
its staged and direct copies are checked here, where no GPU is, and the
capture's analysis on the simulator (test_graph_kbatch.py)."""

import os
import random
import shutil
import struct
import subprocess

import numpy as np
import pytest

from helpers import ROOT

SRC = ROOT / "csrc" / "context" / "kbatch.c"
THREADS = 512
MAX = 160
STAGE = 32768
NBUF = 4
SIZE = 4096

HARNESS = r"""
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static pthread_barrier_t cm_emu_bar;
struct cm_emu_dim { unsigned int x, y, z; };
static thread_local cm_emu_dim threadIdx;
static cm_emu_dim blockDim;
static unsigned int cm_emu_stage[%(stage)d / 4 + 1];
#define __global__
#define __grid_constant__
#define __syncthreads() pthread_barrier_wait(&cm_emu_bar)

%(kernel)s

static cm_kb cm_emu_b;

static void *
cm_emu_thread(void *arg)
{
    threadIdx.x = (unsigned int)(unsigned long)arg;
    cm_kbatch(cm_emu_b);
    return NULL;
}

int
main(void)
{
    /* stdin: NBUF buffers of SIZE bytes, then n, npre, then per entry
     * (kind, dst buf, dst off, src buf, src off, n, f): kind 0 a
     * preload, 1 a copy (src buf -1: src off is a stage offset). */
    static unsigned char buf[%(nbuf)d][%(size)d];
    pthread_t t[%(threads)d];
    unsigned int n, npre, i;
    int k[7];

    if (fread(buf, 1, sizeof(buf), stdin) != sizeof(buf)
        || scanf("%%u %%u", &n, &npre) != 2) {
        return 2;
    }
    cm_emu_b.n = n;
    cm_emu_b.npre = npre;
    cm_emu_b.words = 0;
    for (i = 0; i < n + npre; i++) {
        if (scanf("%%d %%d %%d %%d %%d %%d %%d", &k[0], &k[1], &k[2], &k[3],
                  &k[4], &k[5], &k[6]) != 7) {
            return 2;
        }
        cm_emu_b.e[i].dst = k[1] < 0 ? 0
            : (unsigned long long)(buf[k[1]] + k[2]);
        cm_emu_b.e[i].src = k[3] < 0 ? (unsigned long long)k[4]
            : (unsigned long long)(buf[k[3]] + k[4]);
        cm_emu_b.e[i].n = (unsigned int)k[5];
        cm_emu_b.e[i].f = (unsigned int)k[6];
        if (k[0] == 0) {
            cm_emu_b.words += (unsigned int)k[5] / 4;
        }
    }
    blockDim.x = %(threads)d;
    blockDim.y = blockDim.z = 1;
    pthread_barrier_init(&cm_emu_bar, NULL, %(threads)d);
    for (i = 0; i < %(threads)d; i++) {
        if (pthread_create(&t[i], NULL, cm_emu_thread,
                           (void *)(unsigned long)i) != 0) {
            return 3;
        }
    }
    for (i = 0; i < %(threads)d; i++) {
        pthread_join(t[i], NULL);
    }
    fwrite(buf, 1, sizeof(buf), stdout);
    return 0;
}
"""


def _env():
    """The compiler's and the emulator's environment: without the
    sanitizer runtimes a sanitizer run of the suite preloads."""
    return {k: v for k, v in os.environ.items()
            if k not in ("LD_PRELOAD", "ASAN_OPTIONS", "UBSAN_OPTIONS")}


def _kernel_source():
    text = SRC.read_text()
    start = text.index("\n *\n", text.index("The kernel's CUDA C source")) + 4
    end = text.index(" * and its PTX", start)
    src = "\n".join(line[3:] if line.startswith(" * ") else ""
                    for line in text[start:end].splitlines())
    # The dynamic shared memory: the harness's array.
    src = src.replace("extern __shared__ unsigned int stage[];",
                      "unsigned int *stage = cm_emu_stage;")
    assert "cm_emu_stage" in src
    return src.replace('extern "C" ', "")


@pytest.fixture(scope="module")
def emulator(tmp_path_factory):
    cxx = shutil.which("g++") or shutil.which("clang++")
    if cxx is None:
        pytest.skip("no C++ compiler here")
    d = tmp_path_factory.mktemp("kbatch")
    (d / "emu.cpp").write_text(HARNESS % {
        "kernel": _kernel_source(), "stage": STAGE, "nbuf": NBUF,
        "size": SIZE, "threads": THREADS})
    out = subprocess.run([cxx, "-O1", "-std=c++17", "-pthread",
                          str(d / "emu.cpp"), "-o", str(d / "emu")],
                         capture_output=True, text=True, timeout=300,
                         env=_env())
    assert out.returncode == 0, out.stderr
    return d / "emu"


def _overlap(a, b):
    return a[0] == b[0] and a[1] < b[1] + b[2] and b[1] < a[1] + a[2]


def _batch(rng):
    """Copies (dst buf, dst off, src buf, src off, n) and the batch's
    entries as kbatch.c lays them out: preloads, then copies."""
    copies = []
    for _ in range(rng.randint(1, 60)):
        n = rng.choice([1, 3, 4, 8, 64, 100, 256, 1024])
        a, b = rng.randrange(NBUF), rng.randrange(NBUF)
        if rng.random() < 0.5:
            # word-aligned (preloads and word copies), else anywhere
            so = 4 * rng.randrange((SIZE - n) // 4 + 1)
            do = 4 * rng.randrange((SIZE - n) // 4 + 1)
        else:
            so, do = rng.randrange(SIZE - n + 1), rng.randrange(SIZE - n + 1)
        if a == b and so < do + n and do < so + n:
            # One copy's own source and destination never meet (one side
            # is host memory, the other device memory).
            b = (b + 1) % NBUF
        copies.append((b, do, a, so, n))
    pre, ents, stage, seg = [], [], 0, 0
    for i, (db, do, sb, so, n) in enumerate(copies):
        dst, src = (db, do, n), (sb, so, n)
        f = 0
        if rng.random() < 0.05 or any(
                _overlap(src, (c[0], c[1], c[4]))
                or _overlap(dst, (c[0], c[1], c[4]))
                or _overlap(dst, (c[2], c[3], c[4]))
                for c in copies[seg:i]):
            f |= 1
            seg = i
        written = any(_overlap(src, (c[0], c[1], c[4]))
                      for c in copies[:i])
        ent = [1, db, do, sb, so, n, f]
        if not written and so % 4 == 0 and n % 4 == 0:
            hit = [p for p in pre if p[3] == sb and p[4] == so
                   and p[5] == n]
            if not hit and stage + n <= STAGE:
                hit = [[0, -1, 0, sb, so, n, stage]]
                pre += hit
                stage += n
            if hit:
                ent = [1, db, do, -1, hit[0][6], n, f | 2]
        ents.append(ent)
    return copies, pre, ents


@pytest.mark.parametrize("block", range(4))
def test_random_batches_against_numpy(emulator, block):
    for seed in range(block * 25, (block + 1) * 25):
        rng = random.Random(seed)
        copies, pre, ents = _batch(rng)
        assert len(pre) + len(ents) <= MAX
        bufs = np.random.default_rng(seed).integers(
            0, 256, (NBUF, SIZE), dtype=np.uint8)
        text = "%d %d\n" % (len(ents), len(pre)) + "".join(
            "%d %d %d %d %d %d %d\n" % tuple(e) for e in pre + ents)
        out = subprocess.run([str(emulator)],
                             input=bufs.tobytes() + text.encode(),
                             capture_output=True, timeout=120, env=_env())
        assert out.returncode == 0, (seed, out.stderr)
        got = np.frombuffer(out.stdout, np.uint8).reshape(NBUF, SIZE)
        model = bufs.copy()
        for db, do, sb, so, n in copies:
            model[db, do:do + n] = model[sb, so:so + n].copy()
        np.testing.assert_array_equal(got, model,
                                      err_msg="seed %d" % seed)


def test_parameter_layout():
    """The harness fills the kernel's struct as kbatch.c declares it:
    entries of 24 bytes after a 16-byte head, 3856 bytes in all."""
    assert struct.calcsize("=IIII") + MAX * struct.calcsize("=QQII") == 3856
