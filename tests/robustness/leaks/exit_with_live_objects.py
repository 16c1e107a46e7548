# SPDX-License-Identifier: MIT
"""Exit with everything still alive: device, pinned, mapped and managed
arrays, views, streams with queued callbacks, events, pending frees held
by defer_cleanup, a compiled-kernel-free internal copy in flight.  The
process must exit with status 0 and print nothing."""

import sys

import numpy as np

import cudamem as cuda

ctx = cuda.current_context()
keep = []
s = cuda.stream()
keep.append(s)
d = cuda.to_device(np.arange(1 << 16, dtype=np.float32), stream=s)
keep += [d, d[::2], d.view(np.int32)]
keep.append(cuda.device_array((64, 64), order="F"))
keep.append(cuda.pinned_array(1 << 12))
keep.append(cuda.mapped_array(1 << 12))
keep.append(cuda.managed_array(1 << 12))
e = cuda.event()
e.record(s)
keep.append(e)
s.add_callback(lambda stream, status, arg: None)
cm = cuda.defer_cleanup()
cm.__enter__()  # left open on purpose: frees stay queued at exit
for _ in range(20):
    cuda.device_array(1000)
keep.append(d.copy_to_host(stream=s))
d[:] = 1.5  # an assignment still queued on s
sys.exit(0)
