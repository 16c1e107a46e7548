# SPDX-License-Identifier: MIT
"""Device memory shared with another process: the array's IPC handle,
pickled, opened by a child, read and written there."""

import base64
import pickle

import numpy as np

import cudamem as cuda
from cudamem.tests._util import run_child

CHILD = r"""
import base64, pickle
import numpy as np
handle = pickle.loads(base64.b64decode(%r))
with handle as arr:
    got = arr.copy_to_host()
    assert np.array_equal(got, np.arange(4096, dtype=np.int32)), got[:8]
    arr.copy_to_device(got * 2)
    import cudamem
    cudamem.synchronize()
print("ok")
"""


def test_ipc_handle_in_a_child_process():
    d = cuda.to_device(np.arange(4096, dtype=np.int32))
    # A small copy returns before its bytes land, as the driver's copy of
    # pageable memory does: the other process is not ordered after it.
    cuda.synchronize()
    h = d.get_ipc_handle()
    blob = base64.b64encode(pickle.dumps(h)).decode()
    assert run_child(CHILD % blob).strip() == "ok"
    np.testing.assert_array_equal(d.copy_to_host(),
                                  np.arange(4096, dtype=np.int32) * 2)
