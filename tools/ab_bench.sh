#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# An A/B of two trees' cudamem on the allocation and small-copy rows of
# the benchmarks: both trees are built in place, then the rows run in
# rounds, A then B, each run a fresh process of the B tree's
# benchmarks/run.py timing the other tree's cudamem (--tree, cudamem's
# column only), and tools/ab_table.py prints the medians of the round
# medians and B/A.
#
#   bash tools/ab_bench.sh DIR_A DIR_B
#
# DIR_A is the base, DIR_B the tree under test (on the GPU machine: the
# checkout, `.`).  The same benchmark code times both, so a row the older
# tree cannot run shows as an error in its column.  A base tree is
# prepared in the checkout as a git-ignored folder, carried by the device
# tool (CONTRIBUTING.md, "Running on the GPU"):
#
#   rm -rf .ab-base && mkdir .ab-base && git archive <sha> | tar -x -C .ab-base
#
# Settings (environment):
#   AB_ROUNDS   rounds (5; at least 3)
#   AB_REPEATS  samples per row and tree in a round (31)
#   AB_ROWS     run.py's selection, with the shell's quoting (default:
#               the allocation rows under each manager, device_array /
#               device_array_like, and the 256-float to_device,
#               copy_to_host and copy_to_device; the churn's [C, ...]
#               rows left out: their cudamem column is the [default] row)
#   AB_ENV_A, AB_ENV_B
#               environment assignments for the rounds of A, of B
#               (words of the form NAME=VALUE, with the shell's quoting):
#               with the same tree twice, an A/B of a setting, e.g.
#               AB_ENV_B="CUDAMEM_STAGING_THRESHOLD=256K" bash
#               tools/ab_bench.sh . .
#   AB_OUT      where the round files, build logs and ab.txt go
#               (/tmp/cudamem-ab)
#   AB_BUILD    0: use the trees' builds as they are
#   AB_JOBS     parallel compiles (16)
#   PYTHON      the interpreter (python3)
# Exit status: 0 when both trees built and every round ran.
set -uo pipefail
if [ $# -ne 2 ]; then
    echo "usage: bash tools/ab_bench.sh DIR_A DIR_B" >&2
    exit 2
fi
PY=${PYTHON:-python3}
rounds=${AB_ROUNDS:-5}
repeats=${AB_REPEATS:-31}
out=${AB_OUT:-/tmp/cudamem-ab}
jobs=${AB_JOBS:-16}
SECONDS=0
if [ "$rounds" -lt 3 ]; then
    echo "AB_ROUNDS=$rounds: at least 3 rounds" >&2
    exit 2
fi
mkdir -p "$out"
out=$(cd "$out" && pwd)
declare -A dir
for side in A B; do
    d=$1
    shift
    if [ ! -f "$d/setup.py" ] || [ ! -d "$d/cudamem" ]; then
        echo "$d: not a cudamem tree (no setup.py or cudamem/)" >&2
        exit 2
    fi
    dir[$side]=$(cd "$d" && pwd)
done
bench=${dir[B]}/benchmarks/run.py
rows=()
eval "rows=(${AB_ROWS:--k 'device_array(256' -k 'device_array_like(256' \
    -k 'alloc+drop' -k 'to_device(256' -k 'copy_to_host(256' \
    -k 'copy_to_device(256' -x '[C,'})"
eval "envs_A=(${AB_ENV_A:-})"
eval "envs_B=(${AB_ENV_B:-})"
for kv in "${envs_A[@]}" "${envs_B[@]}"; do
    case $kv in
        [A-Za-z_]*=*) ;;
        *) echo "AB_ENV_A/AB_ENV_B: $kv is not NAME=VALUE" >&2; exit 2 ;;
    esac
done
echo "A: ${dir[A]} ${envs_A[*]}"
echo "B: ${dir[B]} ${envs_B[*]}"
echo "rows: ${rows[*]}; $rounds rounds of $repeats samples"

status=0
if [ "${AB_BUILD:-1}" != 0 ]; then
    for side in A B; do
        echo "=== [$SECONDS s] build $side in place"
        if ! (cd "${dir[$side]}" && "$PY" setup.py build_ext --inplace \
                -j "$jobs") >"$out/build-$side.log" 2>&1; then
            tail -30 "$out/build-$side.log"
            echo "$side did not build"
            exit 1
        fi
    done
fi

# The device report, of the tree under test.
(cd "${dir[B]}" && env -u PYTHONPATH timeout 60 "$PY" -m cudamem) \
    >"$out/report-B.txt" 2>&1

# A folder holding no cudamem, so that only --tree decides which one is
# imported (the rows' subprocesses import it from PYTHONPATH, which
# run.py sets; `python -c` puts its working folder first).
neutral=$(mktemp -d)
trap 'rm -rf "$neutral"' EXIT
rm -f "$out"/ab-round-*.json
for ((r = 1; r <= rounds; r++)); do
    for side in A B; do
        echo "=== [$SECONDS s] round $r, $side"
        f=$out/ab-round-$r-$side.json
        if [ "$side" = A ]; then
            sidenv=("${envs_A[@]}")
        else
            sidenv=("${envs_B[@]}")
        fi
        (cd "$neutral" && env -u PYTHONPATH "${sidenv[@]}" "$PY" "$bench" \
            --tree "${dir[$side]}" --libs cudamem --repeats "$repeats" \
            --json "$f" "${rows[@]}") >"$out/ab-round-$r-$side.log" 2>&1
        st=$?
        got=$(grep -m1 "^cudamem: " "$out/ab-round-$r-$side.log")
        case $got in
            "cudamem: ${dir[$side]}/"*) ;;
            *) echo "round $r $side imported the wrong cudamem: ${got:-none}"
               st=1 ;;
        esac
        if [ "$st" -ne 0 ] || [ ! -s "$f" ]; then
            tail -5 "$out/ab-round-$r-$side.log"
            echo "round $r $side failed (exit $st)"
            status=1
        fi
    done
done
echo "=== [$SECONDS s] table"
"$PY" "$(dirname "$0")/ab_table.py" --a "${dir[A]} ${envs_A[*]}" \
    --b "${dir[B]} ${envs_B[*]}" \
    "$out"/ab-round-*.json | tee "$out/ab.txt"
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1
echo "A/B: $SECONDS s"
exit "$status"
