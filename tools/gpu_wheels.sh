#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The wheels the GPU machine lacks (it has no network), fetched on a
# machine that has one, for its Python 3.12 on x86-64 with CUDA 13:
# Dask and distributed (the Dask tests and benchmarks/dask_transfer.py),
# RMM (the benchmarks' rmm column: rmm-cu13, librmm-cu13, rapids-logger),
# atheris (the fuzz corpus replay) and filecheck (numba-cuda's own test
# suite imports it; tools/numba_suite.py runs that suite), with whatever
# they need: about 55 MB.  .ci/gpu installs them from the folder with pip --no-index,
# never in place of a package the machine has.
#
#   bash tools/gpu_wheels.sh [DIR]        # default: .whl (git-ignored)
#
# NumPy is left out: the GPU machine's (2.5) satisfies both.  RMM_WHEEL
# names another RMM build (for example rmm-cu12 on a CUDA 12 machine).
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-.whl}
rmm=${RMM_WHEEL:-rmm-cu13}
mkdir -p "$dir"
python3 -m pip download -q --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux_2_28_x86_64 \
    --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    --platform manylinux1_x86_64 -d "$dir" "$rmm" dask distributed atheris filecheck
rm -f "$dir"/numpy-*.whl
ls -1 "$dir"
du -sh "$dir"
