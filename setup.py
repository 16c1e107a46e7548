# SPDX-License-Identifier: MIT
"""Build cudamem._core from csrc/**/*.c against the CUDA Toolkit headers.

Nothing links against libcuda: the driver is loaded at run time.  The
headers are looked up in CUDA_HOME, CUDA_PATH and /usr/local/cuda.
Environment switches: CUDAMEM_DEBUG=1 (-O0 -g3, asserts on, the return
check of csrc/retcheck.c),
CUDAMEM_WERROR=1 (-Werror), CUDAMEM_SANITIZE=address,undefined.
"""

import glob
import os
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext


def cuda_include_dir():
    tried = []
    for var in ("CUDA_HOME", "CUDA_PATH"):
        root = os.environ.get(var)
        if root:
            tried.append(root)
    tried.append("/usr/local/cuda")
    for root in tried:
        inc = os.path.join(root, "include")
        if os.path.isfile(os.path.join(inc, "cuda.h")):
            return inc
    sys.exit(
        "cudamem: cuda.h was not found in %s; install the CUDA Toolkit "
        "headers or set CUDA_HOME to the toolkit's root." % ", ".join(tried)
    )


class BuildExt(build_ext):
    """Adds the NumPy and CUDA include paths only when building."""

    def finalize_options(self):
        super().finalize_options()
        import numpy

        self.include_dirs = list(self.include_dirs or [])
        self.include_dirs += [numpy.get_include(), cuda_include_dir()]


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
