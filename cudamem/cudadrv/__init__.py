# SPDX-License-Identifier: MIT
"""numba-style module paths (``cudamem.cudadrv.driver`` and friends) that
re-export cudamem's own objects, for code written against numba.cuda."""
