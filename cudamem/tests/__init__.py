# SPDX-License-Identifier: MIT
"""cudamem's validation suite: a selection of tests that needs nothing but
the installed package (no source tree), to check an install on a GPU
runner or on the CPU simulator.

Run it with ``python -m cudamem test`` (the device line, then a pass/fail
summary) or ``pytest --pyargs cudamem.tests``.  It covers device arrays
and transfers, streams and events, pinned / mapped / managed memory, the
memory managers, IPC between processes, and the exchange of arrays with
numba-cuda, CuPy, PyTorch and Dask when they are installed.  The backend
is the CUDA driver when one initialises, else the simulator; set
``CUDAMEM_SIMULATOR=1`` to choose the simulator.
"""
