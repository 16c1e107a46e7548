# SPDX-License-Identifier: MIT
"""Build cudamem._core from csrc/**/*.c against the CUDA driver API headers.

Nothing links against libcuda: the driver is loaded at run time, so the
build needs only the headers (cuda.h, cudaTypedefs.h).  They come from the
first of CUDA_HOME, CUDA_PATH and /usr/local/cuda whose include/ holds
cuda.h, else from NVIDIA's ``nvidia-cuda-runtime`` distribution, which
pyproject.toml's [build-system] requires (so an isolated build, as pip's
and ``python -m build``'s, has it).  CUDAMEM_IGNORE_SYSTEM_CUDA=1 skips the
toolkit and always takes that distribution's headers.  Where the headers
came from is compiled into the module (``cudamem._core._cuda_headers``,
shown by ``python -m cudamem``).

Environment switches: CUDAMEM_DEBUG=1 (-O0 -g3, asserts on, the return
check of csrc/driver/retcheck.c),
CUDAMEM_WERROR=1 (-Werror), CUDAMEM_SANITIZE=address,undefined,
CUDAMEM_IGNORE_SYSTEM_CUDA=1.
"""

import glob
import os
import re
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

# NVIDIA's distributions of the headers the build includes, each a file
# it must bring: cuda.h and cudaTypedefs.h come with the runtime,
# cudaProfiler.h (included by cudaProfilerTypedefs.h) with the profiler
# API.  Both install into nvidia/cu13/include/.
NVIDIA_HEADERS = (
    ("nvidia-cuda-runtime", "cuda.h"),
    ("nvidia-cuda-profiler-api", "cudaProfiler.h"),
)


def _header_version(inc):
    """CUDA_VERSION of inc/cuda.h as "major.minor" ("?" when unreadable)."""
    try:
        with open(os.path.join(inc, "cuda.h"), encoding="latin-1") as f:
            m = re.search(r"^#define\s+CUDA_VERSION\s+(\d+)", f.read(), re.M)
    except OSError:
        m = None
    if m is None:
        return "?"
    v = int(m.group(1))
    return "%d.%d" % (v // 1000, (v % 1000) // 10)


def toolkit_include_dir():
    """The first toolkit include folder with cuda.h, and the roots tried."""
    tried = []
    for var in ("CUDA_HOME", "CUDA_PATH"):
        root = os.environ.get(var)
        if root:
            tried.append(root)
    tried.append("/usr/local/cuda")
    for root in tried:
        inc = os.path.join(root, "include")
        if os.path.isfile(os.path.join(inc, "cuda.h")):
            return inc, tried
    return None, tried


def wheel_include_dirs():
    """The include folders of NVIDIA's installed header distributions
    (cuda.h's first) and "name version" of each, or (None, missing names).
    Found through the import system's view of the ``nvidia`` namespace
    package, without importing anything."""
    import importlib.metadata
    import importlib.util

    try:
        spec = importlib.util.find_spec("nvidia")
    except (ImportError, ValueError):
        spec = None
    roots = list(spec.submodule_search_locations or []) if spec else []
    dirs = []
    found = []
    missing = []
    for dist, header in NVIDIA_HEADERS:
        for root in roots:
            inc = os.path.join(root, "cu13", "include")
            if os.path.isfile(os.path.join(inc, header)):
                break
        else:
            missing.append(dist)
            continue
        try:
            ver = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            ver = "?"
        if inc not in dirs:
            dirs.append(inc)
        found.append("%s %s" % (dist, ver))
    if missing:
        return None, missing
    return dirs, found


def cuda_include_dirs():
    """The include folders to build against and a line saying what they
    are."""
    ignore = os.environ.get("CUDAMEM_IGNORE_SYSTEM_CUDA") == "1"
    tried = []
    if not ignore:
        inc, tried = toolkit_include_dir()
        if inc is not None:
            return [inc], "CUDA %s headers of the toolkit in %s" % (
                _header_version(inc), inc)
    dirs, names = wheel_include_dirs()
    if dirs is not None:
        return dirs, "CUDA %s headers from %s" % (
            _header_version(dirs[0]), ", ".join(names))
    where = ("CUDAMEM_IGNORE_SYSTEM_CUDA=1 skips the toolkit" if ignore
             else "cuda.h was not found in %s" % ", ".join(tried))
    sys.exit(
        "cudamem: no CUDA headers: %s, and %s not installed.  pip install "
        "builds in an isolated environment that brings them; to build "
        "without isolation, pip install %s first, or set CUDA_HOME to a "
        "CUDA Toolkit's root." % (where, " and ".join(names),
                                   " ".join(names)))


class BuildExt(build_ext):
    """Adds the NumPy and CUDA include paths only when building."""

    def finalize_options(self):
        super().finalize_options()
        import numpy

        incs, what = cuda_include_dirs()
        print("cudamem: building against the %s" % what)
        self.include_dirs = list(self.include_dirs or [])
        self.include_dirs += [numpy.get_include()] + incs
        # Compiled into the module as a C string literal (driver.c): made
        # ASCII, then its backslashes and quotes escaped.
        what = what.encode("ascii", "backslashreplace").decode("ascii")
        lit = '"%s"' % what.replace("\\", "\\\\").replace('"', '\\"')
        for e in self.extensions:
            e.define_macros = list(e.define_macros or []) + [
                ("CM_CUDA_HEADERS", lit)]


def compile_args():
    args = ["-std=c11", "-Wall", "-Wextra", "-fvisibility=hidden",
            "-D_GNU_SOURCE"]
    if os.environ.get("CUDAMEM_DEBUG") == "1":
        args += ["-O0", "-g3", "-UNDEBUG", "-DCM_RETCHECK=1"]
    else:
        args += ["-O2"]
    if os.environ.get("CUDAMEM_WERROR") == "1":
        args += ["-Werror"]
    return args


def sanitize_args():
    san = os.environ.get("CUDAMEM_SANITIZE")
    if not san:
        return [], []
    flags = ["-fsanitize=" + san, "-fno-omit-frame-pointer"]
    return flags, flags


san_c, san_l = sanitize_args()
ext = Extension(
    "cudamem._core",
    sources=sorted(glob.glob("csrc/**/*.c", recursive=True)),
    depends=sorted(glob.glob("csrc/**/*.h", recursive=True)),
    include_dirs=["csrc"],
    extra_compile_args=compile_args() + san_c,
    extra_link_args=san_l + ["-pthread"],
    libraries=["dl"],
)

setup(ext_modules=[ext], cmdclass={"build_ext": BuildExt})
