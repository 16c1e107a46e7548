# SPDX-License-Identifier: MIT
"""The backend of a test session, chosen once by its conftest.py (this
suite's, and the source tree's tests/conftest.py): the CUDA driver when
one initialises, else the simulator.

Importing cudamem does not load the driver: ``CUDAMEM_SIMULATOR`` is read
at the first driver call, so a conftest may choose here, after the
package's import, and before anything uses a device.
"""

import os
import subprocess
import sys

_PROBE = "import cudamem, sys; sys.exit(0 if cudamem.is_available() else 1)"


def driver_works():
    """Whether the real driver initialises, asked of a child process so
    that this one stays free to choose the simulator."""
    env = dict(os.environ, CUDAMEM_SIMULATOR="0")
    env.pop("NUMBA_ENABLE_CUDASIM", None)
    try:
        return subprocess.run([sys.executable, "-c", _PROBE], env=env,
                              timeout=120).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def choose_backend():
    """Set ``CUDAMEM_SIMULATOR`` where it is unset ("0" when the driver
    works, else "1"; child processes inherit it), and say whether the
    session runs on the simulator."""
    if "CUDAMEM_SIMULATOR" not in os.environ:
        os.environ["CUDAMEM_SIMULATOR"] = "0" if driver_works() else "1"
    return os.environ["CUDAMEM_SIMULATOR"] not in ("0", "", "false")
