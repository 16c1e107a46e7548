# SPDX-License-Identifier: MIT
"""cudamem's configuration, with numba's attribute names.

Read from the environment at import: a ``CUDAMEM_*`` spelling wins over
the ``NUMBA_*`` one.  The values are consulted at each use, so code (and
tests) may change them at run time, e.g.
``cudamem.config.CUDA_ARRAY_INTERFACE_SYNC = False``.

Every tunable has a range; a value outside it (in the environment, read
at import, or assigned here at run time) raises ValueError naming the
variable and the range, rather than being clamped or ignored:

======================================  ===================  ============
Variable (``NUMBA_*`` spelling too)     Accepted             Default
======================================  ===================  ============
CUDAMEM_MAX_PENDING_DEALLOCS_COUNT      integer 0 .. 2**31-1 10
CUDAMEM_MAX_PENDING_DEALLOCS_RATIO      number 0.0 .. 1.0    0.2
CUDAMEM_STREAM_CACHE_SIZE               integer 0 .. 16      16
CUDAMEM_ARRAY_INTERFACE_SYNC            flag                 on
CUDAMEM_PER_THREAD_DEFAULT_STREAM       flag                 off
CUDAMEM_WARN_ON_IMPLICIT_COPY           flag                 on
CUDAMEM_DISABLE_CUDA                    flag                 off (on for
                                                             32-bit)
CUDAMEM_SIMULATOR (NUMBA_ENABLE_CUDASIM)  flag               off
CUDAMEM_MEMORY_MANAGER                  default, pool, async default
                                        or a plugin module
CUDAMEM_PINNED_POOL                     flag                 on
CUDAMEM_PINNED_POOL_LIMIT               size 0 .. 2**63-1    min(1 GiB,
                                                             RAM / 16)
CUDAMEM_POOL_LIMIT                      size 0 .. 2**63-1    0 (none)
CUDAMEM_ASYNC_RELEASE_THRESHOLD         size 0 .. 2**64-1    2**64-1
CUDAMEM_DEVICE_MEMORY_LIMIT             size 1 .. the        none
                                        device's memory, or
                                        a fraction 0 < f <= 1
CUDAMEM_POOL_POISON (checked by _core)  integer 0 .. 255     0 (off)
CUDAMEM_SIM_DEVICES                     integer 1 .. 16      1
CUDAMEM_SIM_MEMORY                      size 2**20 .. 2**50  1 GiB
CUDAMEM_SIM_DELAY_US                    integer 0 .. 6e7     0
CUDAMEM_SIM_NO_PEER                     "all", or pairs      none
                                        "0-1,2-3" of 0 .. 15
CUDAMEM_SIM_NO_FD_HANDLES               integer 0 .. 1       0
CUDAMEM_SIM_CAPTURE_WAIT_S              integer 1 .. 3600    10
======================================  ===================  ============

A flag is 1/0, true/false, yes/no or on/off (any case); a size is digits
with an optional K, M or G (powers of 1024; KiB, MiB, GiB and KB, MB, GB
mean the same).  ``CUDAMEM_DEVICE_MEMORY_LIMIT`` (see
``cudamem.set_memory_limit``) takes a size or a fraction of each
device's memory written with a point (``0.25``); its syntax is checked
here, its comparison with a device's memory when that device is first
used.  The staging pipeline's
variables (``CUDAMEM_STAGING*``) are checked by ``cudamem._core`` at
import with the same rule; their ranges are in docs/performance.md.  Paths
(``CUDAMEM_DRIVER_LIBRARY``, ``CUDAMEM_NVRTC_LIBRARY``,
``CUDAMEM_CACHE_DIR``) are taken as given.  At run time,
``PoolMemoryManager.limit`` takes 0 .. 2**63-1 and
``AsyncMemoryManager.release_threshold`` 0 .. 2**64-1.
"""

import os
import re
import struct
import sys
import types

try:
    from . import _core
except ImportError as _e:
    _here = os.path.dirname(os.path.abspath(__file__))
    if any(n.startswith("_core.") and not n.endswith(".pyi")
           for n in os.listdir(_here)):
        raise        # built, but it does not load: the error says why
    raise ImportError(
        "cudamem's C extension (cudamem._core) is not built in %s: "
        "install cudamem (pip install .) or build it in place (python "
        "setup.py build_ext --inplace); outside a source checkout Python "
        "imports an installed cudamem instead" % _here,
        name="cudamem._core") from _e

__all__ = [
    "CUDA_ARRAY_INTERFACE_SYNC",
    "CUDA_DEALLOCS_COUNT",
    "CUDA_DEALLOCS_RATIO",
    "CUDA_MEMORY_MANAGER",
    "CUDA_PER_THREAD_DEFAULT_STREAM",
    "CUDA_STREAM_CACHE_SIZE",
    "CUDA_WARN_ON_IMPLICIT_COPY",
    "DISABLE_CUDA",
    "ENABLE_CUDASIM",
]

_FLAGS = {"1": True, "true": True, "yes": True, "on": True,
          "0": False, "false": False, "no": False, "off": False}
_SIZE = re.compile(r"\s*(\d+)\s*([KMG]?)(I?B)?\s*", re.IGNORECASE)
_SHIFT = {"": 0, "K": 10, "M": 20, "G": 30}


def _flag(value, name="value"):
    """A flag: 1/0, true/false, yes/no, on/off (any case)."""
    if isinstance(value, bool):
        return value
    got = _FLAGS.get(str(value).strip().lower())
    if got is None:
        raise ValueError("%s=%s is not valid: expected 1/0, true/false, "
                         "yes/no or on/off" % (name, value))
    return got


def _integer(lo, hi, what=None):
    """A converter to an int in [lo, hi]."""
    what = what or "an integer from %d to %d" % (lo, hi)

    def convert(value, name="value"):
        try:
            if isinstance(value, str):
                v = int(value.strip(), 10)
            elif isinstance(value, (bool, float)):
                raise TypeError
            else:
                v = int(value)
        except (TypeError, ValueError):
            v = None
        if v is None or not lo <= v <= hi:
            raise ValueError("%s=%s is not valid: expected %s"
                             % (name, value, what))
        return v
    return convert


def _number(lo, hi):
    """A converter to a float in [lo, hi]."""

    def convert(value, name="value"):
        try:
            v = float(value)
        except (TypeError, ValueError):
            v = None
        if v is None or not lo <= v <= hi:
            raise ValueError("%s=%s is not valid: expected a number from "
                             "%s to %s" % (name, value, lo, hi))
        return v
    return convert


def _size(lo, hi, what=None):
    """A converter of a byte count (digits with an optional K, M or G) to
    an int in [lo, hi]."""
    what = what or ("a size from %d to %d bytes (digits with an optional "
                    "K, M or G)" % (lo, hi))

    def convert(value, name="value"):
        m = _SIZE.fullmatch(value) if isinstance(value, str) else None
        v = None
        if m is not None:
            v = int(m.group(1)) << _SHIFT[m.group(2).upper()]
        if v is None or not lo <= v <= hi:
            raise ValueError("%s=%s is not valid: expected %s"
                             % (name, value, what))
        return v
    return convert


_FRACTION = re.compile(r"\s*(\d+\.\d*|\.\d+)\s*")


def _memory_limit(value, name="CUDAMEM_DEVICE_MEMORY_LIMIT"):
    """CUDAMEM_DEVICE_MEMORY_LIMIT: a size above 0 (digits with an
    optional K, M or G), or a fraction of the device's memory above 0 and
    at most 1, written with a point.  Bytes, or a float."""
    m = _SIZE.fullmatch(value)
    if m is not None:
        v = int(m.group(1)) << _SHIFT[m.group(2).upper()]
        if 0 < v <= 2 ** 63 - 1:
            return v
    elif _FRACTION.fullmatch(value) is not None:
        v = float(value)
        if 0.0 < v <= 1.0:
            return v
    raise ValueError("%s=%s is not valid: expected a byte count above 0 "
                     "(digits with an optional K, M or G, such as 512M or "
                     "1GiB) or a fraction of the device's memory above 0 "
                     "and at most 1 (such as 0.25)" % (name, value))


def _no_peer(value, name="CUDAMEM_SIM_NO_PEER"):
    """CUDAMEM_SIM_NO_PEER: "all", or pairs of device ordinals."""
    if value.strip() == "all":
        return value
    for pair in value.split(","):
        m = re.fullmatch(r"\s*(\d+)-(\d+)\s*", pair)
        if (m is None or int(m.group(1)) > 15 or int(m.group(2)) > 15
                or m.group(1) == m.group(2)):
            raise ValueError("%s=%s is not valid: expected \"all\" or "
                             "pairs of distinct devices 0 to 15, as "
                             "\"0-1,2-3\"" % (name, value))
    return value


_DEALLOCS_COUNT = _integer(0, 2 ** 31 - 1)
_DEALLOCS_RATIO = _number(0.0, 1.0)
_STREAM_CACHE_SIZE = _integer(0, 16)


def _env(names, convert, default):
    """The first of ``names`` set in the environment, converted (and
    checked: ValueError naming it), else ``default``."""
    for name in names:
        value = os.environ.get(name)
        if value is not None and value != "":
            return convert(value, name)
    return default


def _str(value, name=None):
    return value


CUDA_DEALLOCS_COUNT = _env(
    ("CUDAMEM_MAX_PENDING_DEALLOCS_COUNT",
     "NUMBA_CUDA_MAX_PENDING_DEALLOCS_COUNT"), _DEALLOCS_COUNT, 10)
CUDA_DEALLOCS_RATIO = _env(
    ("CUDAMEM_MAX_PENDING_DEALLOCS_RATIO",
     "NUMBA_CUDA_MAX_PENDING_DEALLOCS_RATIO"), _DEALLOCS_RATIO, 0.2)
CUDA_ARRAY_INTERFACE_SYNC = _env(
    ("CUDAMEM_ARRAY_INTERFACE_SYNC", "NUMBA_CUDA_ARRAY_INTERFACE_SYNC"),
    _flag, True)
CUDA_MEMORY_MANAGER = _env(
    ("CUDAMEM_MEMORY_MANAGER", "NUMBA_CUDA_MEMORY_MANAGER"), _str,
    "default")
CUDA_PER_THREAD_DEFAULT_STREAM = _env(
    ("CUDAMEM_PER_THREAD_DEFAULT_STREAM",
     "NUMBA_CUDA_PER_THREAD_DEFAULT_STREAM"), _flag, False)
# cudamem only: how many idle dropped streams each context keeps for
# stream() to hand out again (0 to 16; 0 destroys every dropped stream).
CUDA_STREAM_CACHE_SIZE = _env(
    ("CUDAMEM_STREAM_CACHE_SIZE",), _STREAM_CACHE_SIZE, 16)
CUDA_WARN_ON_IMPLICIT_COPY = _env(
    ("CUDAMEM_WARN_ON_IMPLICIT_COPY", "NUMBA_CUDA_WARN_ON_IMPLICIT_COPY"),
    _flag, True)
DISABLE_CUDA = _env(
    ("CUDAMEM_DISABLE_CUDA", "NUMBA_DISABLE_CUDA"), _flag,
    struct.calcsize("P") < 8)
ENABLE_CUDASIM = _env(
    ("CUDAMEM_SIMULATOR", "NUMBA_ENABLE_CUDASIM"), _flag, False)

# Read in C (at import, or when the driver loads); checked here, at
# import, so that a bad value is not silently replaced by the default.
_env(("CUDAMEM_PINNED_POOL",), _flag, True)
_env(("CUDAMEM_PINNED_POOL_LIMIT",), _size(0, 2 ** 63 - 1), 0)
_env(("CUDAMEM_POOL_LIMIT",), _size(0, 2 ** 63 - 1), 0)
_env(("CUDAMEM_ASYNC_RELEASE_THRESHOLD",), _size(0, 2 ** 64 - 1), 0)
_env(("CUDAMEM_DEVICE_MEMORY_LIMIT",), _memory_limit, None)
_env(("CUDAMEM_SIM_DEVICES",), _integer(1, 16), 1)
_env(("CUDAMEM_SIM_MEMORY",), _size(
    2 ** 20, 2 ** 50, "a size from 1048576 (1 MiB) to 2**50 bytes (digits "
    "with an optional K, M or G, such as 512M or 1GiB)"), 0)
_env(("CUDAMEM_SIM_DELAY_US",), _integer(0, 60000000), 0)
_env(("CUDAMEM_SIM_NO_PEER",), _no_peer, None)
_env(("CUDAMEM_SIM_NO_FD_HANDLES",), _integer(0, 1), 0)
_env(("CUDAMEM_SIM_CAPTURE_WAIT_S",), _integer(1, 3600), 10)


class _Config(types.ModuleType):
    """Pushes the settings the C layer reads on every release into it, so
    that assigning to them takes effect at once."""

    def __setattr__(self, name, value):
        if name == "CUDA_STREAM_CACHE_SIZE":
            _core._set_stream_cache_size(int(value))   # checks the range
        elif name == "CUDA_DEALLOCS_COUNT":
            value = _DEALLOCS_COUNT(value, name)
        elif name == "CUDA_DEALLOCS_RATIO":
            value = _DEALLOCS_RATIO(value, name)
        super().__setattr__(name, value)
        if name in ("CUDA_DEALLOCS_COUNT", "CUDA_DEALLOCS_RATIO"):
            _core._set_dealloc_config(int(self.CUDA_DEALLOCS_COUNT),
                                      float(self.CUDA_DEALLOCS_RATIO))


sys.modules[__name__].__class__ = _Config
_core._set_dealloc_config(int(CUDA_DEALLOCS_COUNT),
                          float(CUDA_DEALLOCS_RATIO))
_core._set_stream_cache_size(int(CUDA_STREAM_CACHE_SIZE))
