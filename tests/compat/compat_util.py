# SPDX-License-Identifier: MIT
"""Helpers of the compat tests (a module of its own: every test directory
has a conftest, so ``conftest`` is no name to import by)."""

import os
import sys

NUMBA = os.environ.get("CUDAMEM_COMPAT_TARGET", "cudamem") == "numba"
HERE = os.path.dirname(os.path.abspath(__file__))


def run_target(code, env=None):
    """Run ``code`` in a child process against the same target (the name
    ``cuda`` bound to it, this directory importable); (rc, output)."""
    import subprocess
    import textwrap

    prelude = ("import numpy as np\n"
               "if %r:\n"
               "    np.row_stack = getattr(np, 'row_stack', np.vstack)\n"
               "    from numba import cuda\n"
               "else:\n"
               "    import cudamem as cuda\n" % NUMBA)
    full_env = dict(os.environ, **(env or {}))
    full_env["PYTHONPATH"] = os.pathsep.join(
        [HERE] + [p for p in [full_env.get("PYTHONPATH")] if p])
    r = subprocess.run([sys.executable, "-c",
                        prelude + textwrap.dedent(code)],
                       env=full_env, capture_output=True, text=True,
                       timeout=240)
    return r.returncode, r.stdout + r.stderr
