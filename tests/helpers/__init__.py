# SPDX-License-Identifier: MIT
"""Helpers shared by the test folders.

tests/conftest.py puts tests/ on sys.path, so every test module imports
them as ``from helpers import run_py`` or ``from helpers.streamutil import
Gate``, and a child process started through ``run_child`` / ``run_py``
finds them the same way (its PYTHONPATH starts with the repository and
tests/).

- crashutil: ``run_child`` and ``run_py``, code in a fresh interpreter
  whose crash or hang fails one test instead of the session;
- ahead: the tests marked ``ahead`` (they only run children), run side
  by side on the simulator;
- isolation: the backend gates (``SIMULATOR``, ``ISOLATED``), a test
  module that runs in a process of its own on a GPU, and ``use_manager``;
- arrays: dtypes, deterministic sample values and a stand-in stream
  object for the array tests;
- streamutil: ``Gate``, a host callback that holds a stream;
- emm_plugin: EMM plugins written against numba's interface;
- ipc_child: the importing side of the IPC tests (spawned processes);
- robust_prelude: the adversarial objects of the robustness sweep;
- robust_sweep: the robustness sweep's bad values, groups and ways to
  add cases; robust_cases_arrays, robust_cases_runtime: its cases;
- stream_model: the model-based stream test, run as a script;
- torch_entry: PyTorch's entry points of the extension, typed for ctypes;
- browser: a headless Chromium over the DevTools protocol's pipe, and a
  PNG reader, for the tests that look at a page as a person would.
"""

from .crashutil import ChildResult, child_env, environ, run_child, run_py
from .crashutil import ROOT, TESTS, signal_name

__all__ = ["ChildResult", "ROOT", "TESTS", "child_env", "environ",
           "run_child", "run_py", "signal_name"]
