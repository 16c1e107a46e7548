# SPDX-License-Identifier: MIT
"""Run the fuzz harnesses (tests/fuzz/fuzz_*.py) for a bounded time each,
on the simulator, each in a child process, and fail naming the harness
and the input that found something.

    python3 tests/fuzz/run.py                 # every harness, 20 s each
    python3 tests/fuzz/run.py cai dlpack      # some of them
    CUDAMEM_FUZZ_SECONDS=1800 python3 tests/fuzz/run.py   # a long run
    python3 tests/fuzz/run.py --replay        # the seed corpus only
    python3 tests/fuzz/run.py --runs 5000     # a number of inputs

Each harness starts from its committed seed corpus (tests/fuzz/corpus/
<name>/, never written to) plus a working corpus under the artifacts
directory, tests/fuzz/artifacts/<name>/ (git-ignored), where libFuzzer
also writes a crashing, hanging or out-of-memory input (crash-*,
timeout-*, oom-*) and the run's log.  A child that dies without
libFuzzer's report (a fault in a thread that blocks signals, a kill)
still leaves the input it was running, saved as crash-silent-*.  Add an
input to the seed corpus once the bug it found is fixed.

``--keep-going`` runs every harness even after a finding.  With
CUDAMEM_FUZZ_SKIP_KNOWN=1 the harnesses step around bugs already filed
(see tests/fuzz/FINDINGS.md), to look for new ones.

Without atheris installed (``pip install atheris``, the ``fuzz`` extra)
the runner says so and exits 0.

Sanitizers: atheris's libFuzzer is built with clang, so under
AddressSanitizer the harnesses need a clang build of the extension and
clang's ASan runtime preloaded (GCC's libasan, which the project's
sanitizer build links, cannot share a process with it).  .ci/run does
both after the run on the normal build:

    CC=clang LDSHARED="clang -shared" CFLAGS=-shared-libasan \\
        LDFLAGS=-shared-libasan CUDAMEM_DEBUG=1 CUDAMEM_SANITIZE=address \\
        python3 setup.py build_ext --force --inplace
    LD_PRELOAD=$(clang -print-file-name=libclang_rt.asan-x86_64.so) \\
        ASAN_OPTIONS=detect_leaks=0:verify_asan_link_order=0 \\
        python3 tests/fuzz/run.py
"""

import argparse
import hashlib
import os
import pathlib
import re
import shutil
import subprocess
import sys

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent.parent
ARTIFACTS = HERE / "artifacts"


def harnesses():
    return sorted(p.stem[len("fuzz_"):] for p in HERE.glob("fuzz_*.py"))


def have_atheris():
    try:
        import atheris  # noqa: F401
    except ImportError:
        return False
    return True


def run_one(name, seconds, runs, replay, extra):
    art = ARTIFACTS / name
    work = art / "corpus"
    work.mkdir(parents=True, exist_ok=True)
    seeds = HERE / "corpus" / name
    last = art / "last-input"
    if last.exists():
        last.unlink()
    env = dict(os.environ)
    env["CUDAMEM_SIMULATOR"] = "1"
    env["PYTHONPATH"] = os.pathsep.join(
        [str(ROOT), str(HERE)] + ([env["PYTHONPATH"]]
                                  if env.get("PYTHONPATH") else []))
    env["CUDAMEM_FUZZ_LAST_INPUT"] = str(last)
    env.setdefault("PYTHONUNBUFFERED", "1")
    args = [sys.executable, str(HERE / ("fuzz_%s.py" % name))]
    if replay:
        args += ["-runs=0", str(seeds)]
    else:
        args += [str(work), str(seeds)]
        args.append("-runs=%d" % runs if runs else
                    "-max_total_time=%d" % seconds)
    args += ["-timeout=30", "-rss_limit_mb=3072", "-print_final_stats=1",
             "-artifact_prefix=%s/" % art] + list(extra)
    limit = (seconds if not (replay or runs) else 600) + 180
    try:
        r = subprocess.run(args, env=env, cwd=str(ROOT), timeout=limit,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        out, rc = r.stdout.decode(errors="replace"), r.returncode
    except subprocess.TimeoutExpired as e:
        out = (e.stdout or b"").decode(errors="replace")
        out += "\n[run.py] no result after %d s: killed" % limit
        rc = -9
    (art / "log.txt").write_text(out)
    execs = re.findall(r"stat::number_of_executed_units:\s*(\d+)", out)
    execs = int(execs[-1]) if execs else None
    if rc == 0:
        return True, execs, None, out
    out += "\n[run.py] the harness exited with status %d%s" % (
        rc, " (signal %d)" % -rc if rc < 0 else "")
    found = re.findall(r"Test unit written to (\S+)", out)
    if found:
        unit = found[-1]
    elif last.exists():
        data = last.read_bytes()
        unit = str(art / ("crash-silent-%s"
                          % hashlib.sha1(data).hexdigest()))
        shutil.copyfile(last, unit)
    else:
        unit = None
    return False, execs, unit, out


def excerpt(out):
    """The part of a log that says what happened."""
    lines = out.splitlines()
    tail = lines[-1:]
    for i, line in enumerate(lines):
        if ("Uncaught Python exception" in line or "ERROR: libFuzzer" in line
                or "deadly signal" in line or "AddressSanitizer" in line):
            return "\n".join(lines[max(i - 2, 0):i + 40] + tail)
    return "\n".join(lines[-12:])


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("names", nargs="*", help="harnesses (default: all)")
    ap.add_argument("--seconds", type=int,
                    default=int(os.environ.get("CUDAMEM_FUZZ_SECONDS", 20)))
    ap.add_argument("--runs", type=int, default=0)
    ap.add_argument("--replay", action="store_true")
    ap.add_argument("--keep-going", action="store_true")
    ap.add_argument("--libfuzzer", action="append", default=[],
                    help="an extra libFuzzer flag, e.g. -jobs=2")
    a = ap.parse_args(argv)
    if not have_atheris():
        print("fuzz: atheris is not installed (pip install atheris): "
              "skipped")
        return 0
    names = a.names or harnesses()
    unknown = set(names) - set(harnesses())
    if unknown:
        ap.error("no harness %s (have: %s)" % (", ".join(sorted(unknown)),
                                               ", ".join(harnesses())))
    failed = []
    for name in names:
        ok, execs, unit, out = run_one(name, a.seconds, a.runs, a.replay,
                                       a.libfuzzer)
        print("fuzz %-8s %s  %s executions" % (
            name, "ok  " if ok else "FAIL", "?" if execs is None else execs),
              flush=True)
        if not ok:
            failed.append((name, unit))
            print("  input: %s\n  log:   %s\n%s\n" % (
                unit, ARTIFACTS / name / "log.txt", excerpt(out)),
                  flush=True)
            if not a.keep_going:
                break
    if failed:
        print("fuzz: findings in %s; reproduce with: python3 "
              "tests/fuzz/fuzz_<name>.py <input>" % ", ".join(
                  "%s (%s)" % f for f in failed))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
