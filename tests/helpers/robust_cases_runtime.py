# SPDX-License-Identifier: MIT
"""The robustness sweep's cases of the runtime: streams, events and
callbacks, contexts and devices, pinned / mapped registration and host
allocations, memory pointers and plugins, IPC, NVRTC kernels,
re-entrancy, constructors of the public classes, zero-itemsize dtypes
and the misuse of context managers, handles and registrations.

Each group is a list of (name, source, expect) of robust_sweep.py's
GROUPS; tests/robustness/test_robustness.py runs every group in a child.
"""

from helpers.robust_sweep import case, sweep


# -- streams, events, callbacks
g = "streams"
sweep(g, "cuda.external_stream({ptr})", {"ptr": "BAD_HANDLE"},
      overrides={"True": "any", "neg": "any", "-2**63-1": "any",
                 "np.int64(-5)": "any", "2**63": "any", "2**64": "any",
                 "10**30": "any"})
sweep(g, "cuda.event({timing})", {"timing": "True"}, expect="any")
for a, b, exp in [("None", "cuda.event()", "TypeError"),
                  ("cuda.event()", "object()", "TypeError"),
                  ("cuda.event()", "cuda.event()", "CudaAPIError"),
                  ("cuda.event(False)", "cuda.event(False)", "CudaAPIError"),
                  ("cuda.stream()", "cuda.event()", "TypeError"),
                  ("closed_event()", "cuda.event()", "any")]:
    pre = ("def closed_event():\n    e = cuda.event()\n    e.record()\n"
           "    cuda.close()\n    return e\n")
    case(g, "event_elapsed_time(%s, %s)" % (a, b),
         pre + "cuda.event_elapsed_time(%s, %s)" % (a, b), exp)
    case(g, "Event.elapsed_time(%s, %s)" % (a, b),
         pre + "(%s).elapsed_time(%s)" % (a, b),
         "raise" if a in ("None", "cuda.stream()") else exp)
for meth in ("record(%s)", "wait(%s)"):
    for st, exp in [("'x'", "TypeError"), ("1.5", "TypeError"),
                    ("object()", "TypeError"), ("cuda.event()", "TypeError"),
                    ("RaiseIndex()", "TypeError"), ("True", "any"),
                    ("None", "ok"), ("-1", "any"), ("2**64", "any"),
                    ("cuda.external_stream(BAD_HANDLE)", "any")]:
        case(g, "Event." + meth % st, "cuda.event()." + meth % st, exp)
for arg, exp in [("None", "TypeError"), ("object()", "TypeError"),
                 ("cuda.stream()", "TypeError"),
                 ("closed_event()", "any")]:
    pre = ("def closed_event():\n    e = cuda.event()\n    e.record()\n"
           "    cuda.close()\n    return e\n")
    case(g, "Stream.wait_event(%s)" % arg,
         pre + "cuda.stream().wait_event(%s)" % arg, exp)
for cb, exp in [("None", "TypeError"), ("5", "TypeError"),
                ("object()", "TypeError")]:
    case(g, "add_callback(%s)" % cb, "cuda.stream().add_callback(%s)" % cb,
         exp)
# Callbacks that raise, re-enter cudamem, or close the context.
case(g, "callback raises",
     "s = cuda.stream()\ns.add_callback(raiser)\ns.synchronize()", "ok")
case(g, "callback with bad signature",
     "s = cuda.stream()\ns.add_callback(lambda: None)\ns.synchronize()",
     "ok")
case(g, "callback re-enters cudamem",
     "s = cuda.stream()\nout = []\n"
     "def cb(st, status, arg):\n"
     "    d = cuda.to_device(np.arange(3.0), stream=st)\n"
     "    out.append(d.copy_to_host())\n"
     "    st.add_callback(lambda *a: out.append(1))\n"
     "s.add_callback(cb)\ns.synchronize()\ns.synchronize()", "any")
case(g, "callback synchronizes its own stream",
     "s = cuda.stream()\n"
     "s.add_callback(lambda st, status, arg: st.synchronize())\n"
     "s.synchronize()", "any")
case(g, "callback closes the context",
     "s = cuda.stream()\n"
     "s.add_callback(lambda st, status, arg: cuda.close())\n"
     "s.synchronize()", "any")
case(g, "callback after close",
     "s = cuda.stream()\ncuda.close()\ns.add_callback(lambda *a: None)",
     "any")
case(g, "auto_synchronize raising body",
     "with cuda.stream().auto_synchronize():\n    raise Boom('body')",
     "Boom")
case(g, "async_done without loop", "cuda.stream().async_done()", "any")
case(g, "stream ops after close",
     "s = cuda.stream()\ne = cuda.event()\ncuda.close()\n"
     "for f in (s.synchronize, s.query, lambda: s.wait_event(e),\n"
     "          e.record, e.query, e.synchronize, lambda: e.wait(s),\n"
     "          lambda: e.record(s)):\n"
     "    try:\n        f()\n    except (ValueError, cuda.CudaAPIError):\n"
     "        pass\n"
     "    else:\n        raise AssertionError('no error')\n"
     "raise ValueError('done')", "ValueError")
case(g, "external stream of garbage handle synchronize",
     "cuda.external_stream(BAD_HANDLE).synchronize()", "any")
case(g, "external stream of garbage handle query",
     "cuda.external_stream(BAD_HANDLE).query()", "any")
case(g, "copy on garbage external stream",
     "cuda.to_device(np.zeros(3), stream=cuda.external_stream(BAD_HANDLE))",
     "any")
case(g, "int() of stream", "int(cuda.stream())", "ok")


# -- contexts and devices
g = "context"
for fn, args, exp in [
        ("select_device", "99", "IndexError|ValueError|CudaAPIError"),
        ("select_device", "-99", "IndexError|ValueError|CudaAPIError"),
        ("select_device", "2**64", "IndexError|ValueError|OverflowError"),
        ("select_device", "1.5", "TypeError"),
        ("select_device", "None", "TypeError"),
        ("select_device", "'0'", "TypeError"),
        ("select_device", "RaiseIndex()", "TypeError"),
        ("current_context", "99", "IndexError|ValueError|CudaAPIError"),
        ("current_context", "1.5", "TypeError"),
        ("current_context", "'0'", "TypeError"),
        ("current_context", "RaiseIndex()", "TypeError"),
        ("memory_stats", "99", "IndexError|ValueError|CudaAPIError"),
        ("memory_stats", "'x'", "TypeError"),
        ("memory_stats", "1.5", "TypeError"),
        ("memory_stats", "RaiseIndex()", "TypeError"),
        ("pinned_pool_stats", "99", "IndexError|ValueError"),
        ("pinned_pool_stats", "'x'", "TypeError"),
        ("pinned_pool_trim", "-99", "IndexError|ValueError"),
        ("pinned_pool_trim", "1.5", "TypeError"),
        ("can_access_peer", "0, 99", "IndexError|ValueError|CudaAPIError"),
        ("can_access_peer", "'x', 0", "TypeError"),
        ("can_access_peer", "None, None", "TypeError"),
        ("enable_peer_access", "0, 99", "IndexError|ValueError|CudaAPIError"),
        ("enable_peer_access", "0, 0", "any"),
        ("enable_peer_access", "RaiseIndex(), 0", "TypeError"),
        ]:
    case(g, "%s(%s)" % (fn, args), "cuda.%s(%s)" % (fn, args), exp)
for key, exp in [("99", "IndexError"), ("-99", "IndexError"),
                 ("1.5", "TypeError"), ("'x'", "TypeError|ValueError"),
                 ("None", "TypeError"), ("RaiseIndex()", "TypeError"),
                 ("2**64", "IndexError|OverflowError")]:
    case(g, "gpus[%s]" % key, "cuda.gpus[%s]" % key, exp)
case(g, "gpus[0] attr", "cuda.gpus[0].no_such_attribute", "AttributeError")
case(g, "Context.memalloc(-1)", "cuda.current_context().memalloc(-1)",
     "ValueError|OverflowError|CudaAPIError|MemoryError")
case(g, "Context.memalloc(2**63)", "cuda.current_context().memalloc(2**63)",
     "ValueError|OverflowError|MemoryError")
case(g, "Context.memalloc(2**40)", "cuda.current_context().memalloc(2**40)",
     "MemoryError")
case(g, "Context.memalloc('x')", "cuda.current_context().memalloc('x')",
     "TypeError")
case(g, "Context.memalloc(RaiseIndex())",
     "cuda.current_context().memalloc(RaiseIndex())", "TypeError")
case(g, "Context.memalloc(0)", "cuda.current_context().memalloc(0)", "any")
case(g, "Context.enable_peer_access(None)",
     "cuda.current_context().enable_peer_access(None)", "TypeError")
case(g, "Context.enable_peer_access(self, 'x')",
     "c = cuda.current_context()\nc.enable_peer_access(c, 'x')", "TypeError")
case(g, "Context.can_access_peer('x')",
     "cuda.current_context().can_access_peer('x')", "TypeError")
case(g, "Context.can_access_peer(99)",
     "cuda.current_context().can_access_peer(99)",
     "IndexError|ValueError|CudaAPIError")
case(g, "double free", "m = cuda.current_context().memalloc(8)\nm.free()\n"
     "m.free()", "RuntimeError")
case(g, "use after close", "d = cuda.to_device(np.arange(3.0))\n"
     "s = cuda.stream()\ncuda.close()\nd.copy_to_host()", "ValueError")
for expr in ("d.copy_to_device(np.zeros(3))", "d[0]", "d[1:]", "d[0] = 1",
             "d.T", "np.asarray(d)", "d.__cuda_array_interface__",
             "cuda.from_dlpack(d)", "d.__dlpack__()",
             "cuda.as_cuda_array(d)", "cuda.to_device(np.zeros(3), to=d)",
             "d.gpu_data.free()", "d.reshape(3)", "d.view('i8')",
             "d.bind(cuda.stream())", "d.get_ipc_handle()",
             "cuda.device_array_like(d)", "d.copy_to_device(e)",
             "e.copy_to_device(d)", "m.copy_to_host()", "m[0]",
             "m.copy_to_device(np.zeros(3))", "mm.prefetch()",
             "mm.advise('read_mostly')", "m.__cuda_array_interface__",
             "p.copy_to_host()", "s.synchronize()", "ev.elapsed_time(ev)",
             "del d, e, m, mm, s, ev; import gc; gc.collect()"):
    case(g, "after close: " + expr,
         "d = cuda.to_device(np.arange(3.0))\nm = cuda.mapped_array(3)\n"
         "mm = cuda.managed_array(3)\np = cuda.pinned_array(3)\n"
         "s = cuda.stream()\nev = cuda.event()\ncuda.close()\n"
         "e = cuda.device_array(3)\n" + expr, "any")
case(g, "close twice", "cuda.close()\ncuda.close()", "ok")
case(g, "defer_cleanup raising body",
     "with cuda.defer_cleanup():\n    raise Boom('x')", "Boom")
case(g, "defer_cleanup close inside",
     "with cuda.defer_cleanup():\n    cuda.close()\n"
     "d = cuda.device_array(3)\ndel d", "any")
case(g, "set_memory_manager(None)", "cuda.set_memory_manager(None)", "ok")
case(g, "set_memory_manager('nope')", "cuda.set_memory_manager('nope')",
     "ValueError|ImportError|RuntimeError")
case(g, "set_memory_manager(raiser)", "cuda.set_memory_manager(raiser)",
     "raise")
case(g, "set_memory_manager(object)", "cuda.set_memory_manager(object)",
     "TypeError|RuntimeError")


# -- pinned / mapped registration and host allocations
g = "hostmem"
for args, exp in [("None", "TypeError|ValueError"), ("5", "TypeError|any"),
                  ("[1, 2]", "TypeError|any"),
                  ("noncontig()", "any"), ("readonly()", "any"),
                  ("misaligned()", "any"), ("np.zeros(0)", "ok"),
                  ("np.zeros(())", "ok"), ("odd_sub()", "any"),
                  ("np.zeros(3, object)", "any"),
                  ("np.broadcast_to(np.zeros(1), (4,))", "any"),
                  ("cuda.device_array(3)", "TypeError|ValueError"),
                  ("cuda.mapped_array(3)", "any"),
                  ("cuda.pinned_array(3)", "any"),
                  ("b'abc'", "any"), ("bytearray(8)", "any"),
                  ("memoryview(bytearray(8))", "any"),
                  ("RaiseArray()", "raise"), ("GarbageArray()", "any"),
                  ("a, a", "ok"), ("a, a[1:]", "ok")]:
    pre = "a = np.zeros(4)\n"
    case(g, "pinned(%s)" % args,
         pre + "with cuda.pinned(%s):\n    pass" % args, exp)
    case(g, "mapped(%s)" % args,
         pre + "with cuda.mapped(%s) as m:\n    pass" % args,
         "any" if exp == "ok" else exp)
case(g, "mapped(stream='x')",
     "with cuda.mapped(np.zeros(3), stream='x'):\n    pass", "TypeError")
case(g, "mapped(bogus=1)",
     "with cuda.mapped(np.zeros(3), bogus=1):\n    pass", "AssertionError")
case(g, "pinned then free array inside",
     "a = np.zeros(4)\nwith cuda.pinned(a):\n    del a", "ok")
# (resize(refcheck=False) frees memory that views still use: NumPy's own
# documented way to crash, left out.)
case(g, "mapped array resized inside",
     "a = np.zeros(4)\nwith cuda.mapped(a) as d:\n"
     "    a.resize(1000)\n", "ValueError")
case(g, "pinned array resized inside",
     "a = np.zeros(4)\nwith cuda.pinned(a):\n"
     "    a.resize(100000)\n", "ValueError")
case(g, "mapped array stream setter bad",
     "m = cuda.mapped_array(3)\nm.stream = 'x'", "TypeError")
case(g, "mapped array stream setter None",
     "m = cuda.mapped_array(3)\nm.stream = None", "any")
case(g, "managed prefetch bad device",
     "cuda.managed_array(3).prefetch(device=99)", "raise")
case(g, "managed prefetch bad device str",
     "cuda.managed_array(3).prefetch(device='gpu')", "raise")
case(g, "managed prefetch bad stream",
     "cuda.managed_array(3).prefetch(stream='x')", "TypeError")
case(g, "managed advise bad advice",
     "cuda.managed_array(3).advise('nope')", "ValueError")
case(g, "managed advise None", "cuda.managed_array(3).advise(None)",
     "TypeError|ValueError")
case(g, "managed advise bad device",
     "cuda.managed_array(3).advise('read_mostly', device=1.5)", "raise")
case(g, "managed slice of host copy prefetch",
     "(cuda.managed_array(3) + 1).prefetch()", "raise")
case(g, "mapped host copy device side",
     "(cuda.mapped_array(3) + 1).copy_to_host()", "raise")
case(g, "mapped array resize",
     "m = cuda.mapped_array(3)\nm.resize(10, refcheck=False)", "raise")
case(g, "mapped array view as object",
     "cuda.mapped_array(3).view(object)", "raise")
case(g, "mapped array 0-size", "m = cuda.mapped_array(0)\nm.copy_to_host()\n"
     "m.__cuda_array_interface__", "ok")
case(g, "pinned_array_like of device", "cuda.pinned_array_like("
     "cuda.device_array((3, 4))[:, ::2])", "ok")
for obj in ("cuda.mapped_array(3)", "cuda.managed_array(3)"):
    case(g, "copy.copy(%s)" % obj, "import copy\nc = copy.copy(%s)\n"
         "c.copy_to_host()\nc.__cuda_array_interface__" % obj, "any")
    case(g, "pickle(%s)" % obj, "import pickle\n"
         "c = pickle.loads(pickle.dumps(%s))\nc.copy_to_host()" % obj, "any")
    case(g, "ndarray(buffer=%s)" % obj, "b = np.ndarray(3, buffer=%s)\n"
         "b.view(type(%s)).copy_to_host()" % (obj, obj.split("(")[0]
                                              + "(1)"), "any")


# -- memory pointers and plugins
g = "emm"
for args, exp in [("None, 0, 8", "any"), ("cuda.current_context(), 'x', 8",
                                          "TypeError|any"),
                  ("cuda.current_context(), 0, -1", "ValueError|any"),
                  ("cuda.current_context(), 0, 'x'", "TypeError|any"),
                  ("cuda.current_context(), 0, 8, finalizer=5", "any"),
                  ("cuda.current_context(), 0, 8, finalizer=raiser",
                   "any")]:
    case(g, "MemoryPointer(%s)" % args,
         "p = cuda.MemoryPointer(%s)\ndel p" % args, exp)
for meth, exp in [("memset('x')", "TypeError"),
                  ("memset(0, -1)", "ValueError"),
                  ("memset(0, 2**63)", "ValueError"),
                  ("memset(0, 9)", "ValueError"),
                  ("memset(0, 1.5)", "TypeError"),
                  ("memset(256)", "raise"), ("memset(-1)", "raise"),
                  ("memset(0, stream='x')", "TypeError"),
                  ("view(-1)", "ValueError"), ("view(9)", "RuntimeError"),
                  ("view(0, 9)", "ValueError"),
                  ("view(5, 2)", "RuntimeError"),
                  ("view('x')", "TypeError"), ("view(1.5)", "TypeError"),
                  ("view(2**63)", "RuntimeError"),
                  ("view(0, 2**63)", "ValueError"),
                  ("view(-4, 4)", "ValueError")]:
    case(g, "MemoryPointer." + meth,
         "m = cuda.current_context().memalloc(8)\n"
         "p = cuda.MemoryPointer(m.context, m.device_pointer, 8, owner=m)\n"
         "p.%s" % meth, exp)
case(g, "EMM plugin that raises",
     "class M(cuda.HostOnlyCUDAMemoryManager):\n"
     "    def initialize(self): pass\n"
     "    def memalloc(self, size): raise Boom('alloc')\n"
     "    def get_memory_info(self): raise Boom('info')\n"
     "    def get_ipc_handle(self, memory): raise Boom('ipc')\n"
     "    @property\n    def interface_version(self): return 1\n"
     "cuda.set_memory_manager(M)\ncuda.close()\n"
     "try:\n    cuda.device_array(4)\nfinally:\n"
     "    cuda.set_memory_manager('default')\n    cuda.close()", "Boom")
case(g, "EMM plugin returning garbage",
     "class M(cuda.HostOnlyCUDAMemoryManager):\n"
     "    def initialize(self): pass\n"
     "    def memalloc(self, size): return 5\n"
     "    def get_memory_info(self): return None\n"
     "    def get_ipc_handle(self, memory): return None\n"
     "    @property\n    def interface_version(self): return 1\n"
     "cuda.set_memory_manager(M)\ncuda.close()\n"
     "try:\n    d = cuda.device_array(4)\n    d.copy_to_host()\nfinally:\n"
     "    cuda.set_memory_manager('default')\n    cuda.close()", "raise")
case(g, "EMM plugin returning a pointer to nothing",
     "class M(cuda.HostOnlyCUDAMemoryManager):\n"
     "    def initialize(self): pass\n"
     "    def memalloc(self, size):\n"
     "        return cuda.MemoryPointer(self.context, 0, size)\n"
     "    def get_memory_info(self): return cuda.MemoryInfo(0, 0)\n"
     "    def get_ipc_handle(self, memory): return None\n"
     "    @property\n    def interface_version(self): return 1\n"
     "cuda.set_memory_manager(M)\ncuda.close()\n"
     "try:\n    d = cuda.device_array(4)\n    d.copy_to_host()\nfinally:\n"
     "    cuda.set_memory_manager('default')\n    cuda.close()", "any")
case(g, "EMM plugin wrong version",
     "class M(cuda.HostOnlyCUDAMemoryManager):\n"
     "    def initialize(self): pass\n"
     "    def memalloc(self, size): pass\n"
     "    def get_memory_info(self): pass\n"
     "    def get_ipc_handle(self, memory): pass\n"
     "    @property\n    def interface_version(self): return 2\n"
     "cuda.set_memory_manager(M)", "RuntimeError")


# -- IPC
g = "ipc"
for args, exp in [("None, 4, np.float64", "TypeError|ValueError"),
                  ("b'x', 4, np.float64", "TypeError|ValueError"),
                  ("b'x' * 64, -1, np.float64", "ValueError|any"),
                  ("b'x' * 64, (2**62, 2**62), np.float64",
                   "ValueError|any"),
                  ("b'x' * 64, 4, object", "TypeError|ValueError|any"),
                  ("b'x' * 64, 4, 'nope'", "TypeError"),
                  ("b'x' * 64, 4, np.float64, strides=(8, 8)",
                   "ValueError|any"),
                  ("b'x' * 64, 4, np.float64, offset=-1", "ValueError|any"),
                  ("b'x' * 64, 4, np.float64, offset='x'",
                   "TypeError|any"),
                  ("b'\\0' * 64, 4, np.float64", "any")]:
    case(g, "open_ipc_array(%s)" % args,
         "with cuda.open_ipc_array(%s) as a:\n    a.copy_to_host()" % args,
         exp)
case(g, "get_ipc_handle 0-size", "cuda.device_array(0).get_ipc_handle()",
     "any")
case(g, "get_ipc_handle of view", "cuda.device_array(8)[2:].get_ipc_handle()",
     "any")
case(g, "get_ipc_handle of mapped",
     "cuda.as_cuda_array(cuda.mapped_array(3)).get_ipc_handle()", "any")
case(g, "ipc handle open in exporting process",
     "h = cuda.device_array(8).get_ipc_handle()\nh.open()", "raise")
case(g, "IpcArrayHandle bad setstate",
     "h = cuda.device_array(8).get_ipc_handle()\nh.__setstate__(None)",
     "any")
case(g, "IpcArrayHandle garbage",
     "cuda.IpcArrayHandle(None, None).open()", "raise")


# -- NVRTC kernels
g = "kernels"
KSRC = ('extern "C" __global__ void k(float *x, int n, double v) {}\n'
        '__device__ float g[4];\n')
for args, exp in [("None", "TypeError"), ("5", "TypeError"),
                  ("b'x'", "any"), ("'\\0'", "any"),
                  ("'this is not C'", "CompileError"),
                  ("KSRC, name_expressions=5", "TypeError"),
                  ("KSRC, name_expressions=[5]", "TypeError"),
                  ("KSRC, name_expressions=['nope<int>']", "raise"),
                  ("KSRC, options=5", "TypeError"),
                  ("KSRC, options=[None]", "TypeError"),
                  ("KSRC, options=['--bogus-option']", "CompileError"),
                  ("KSRC, options=['\\0']", "any"),
                  ("KSRC, constants=5", "TypeError"),
                  ("KSRC, constants={'x': object()}", "TypeError|ValueError"),
                  ("KSRC, constants={5: 1}", "TypeError|ValueError"),
                  ("KSRC, constants={'g': 'x'}", "any"),
                  ("KSRC, constants={'g': np.zeros(100)}", "any"),
                  ("KSRC, constants=RaiseSeq()", "raise")]:
    case(g, "compile(%s)" % args,
         "KSRC = %r\ncuda.compile(%s)" % (KSRC, args), exp)
KPRE = "m = cuda.compile(%r)\nk = m.get_function('k')\n" % KSRC
for expr, exp in [
        ("m.get_function('nope')", "raise"),
        ("m.get_function(None)", "TypeError"),
        ("m.get_function('k\\0')", "ValueError|any"),
        ("m.get_global('nope')", "raise"),
        ("m.get_global('g', dtype=object)", "raise"),
        ("m.get_global('g', dtype='f8', shape=5)", "raise"),
        ("m.get_global('g', shape=-1)", "raise"),
        ("m.get_global('g', shape=(2**62, 2**62))", "raise"),
        ("m.get_global('g', shape=RaiseSeq())", "raise"),
        ("m.get_global('g', shape=1.5)", "raise"),
        ("m.get_global('g', dtype='V0')", "any"),
        ("k[1, 1](None, 1, 1.0)", "any"),
        ("k[1, 1]()", "TypeError"),
        ("k[1, 1](1, 2, 3, 4)", "TypeError"),
        ("k[1, 1](object(), 1, 1.0)", "TypeError"),
        ("k[1, 1](cuda.device_array(3), 'x', 1.0)", "TypeError"),
        ("k[1, 1](cuda.device_array(3), 2**40, 1.0)", "OverflowError|any"),
        ("k[1, 1](cuda.device_array(3), RaiseIndex(), 1.0)", "TypeError"),
        ("k[1, 1](cuda.device_array(3), 1, 'x')", "TypeError"),
        ("k[1, 1](RaiseCAI(), 1, 1.0)", "raise"),
        ("k[1, 1](CAI(None), 1, 1.0)", "any"),
        ("k[1, 1](freed_array(), 1, 1.0)", "ValueError"),
        ("k[1, 1](freed_array()[1:], 1, 1.0)", "ValueError"),
        ("k[1, 1](cuda.as_cuda_array(freed_array()), 1, 1.0)",
         "ValueError"),
        ("a = cuda.current_context().memalloc(8)\na.free()\n"
         "k[1, 1](a, 1, 1.0)", "ValueError"),
        ("d = cuda.device_array(3)\ncuda.close()\n"
         "m2 = cuda.compile(KSRC)\n"
         "m2.get_function('k')[1, 1](d, 1, 1.0)", "ValueError"),
        ("k[1, 1](np.zeros(3, np.float32), 1, 1.0)", "any"),
        ("k[0, 1]", "ValueError|any"), ("k[1, 0]", "ValueError|any"),
        ("k[-1, 1]", "ValueError|any"), ("k[2**40, 1]", "ValueError|any"),
        ("k[1, 2**40]", "ValueError|any"),
        ("k[(1, 1, 1, 1), 1]", "ValueError"), ("k[1]", "TypeError|ValueError"),
        ("k[1, 1, 'x']", "TypeError"), ("k[1, 1, 0, -1]", "ValueError|any"),
        ("k[1, 1, 0, 2**40]", "ValueError|any"),
        ("k[1, 1, 0, 0, 0]", "TypeError|ValueError"),
        ("k[1.5, 1]", "TypeError"), ("k[None, 1]", "TypeError"),
        ("k[RaiseIndex(), 1]", "TypeError"),
        ("k['a']", "TypeError|ValueError"),
        ("k[1, 1, cuda.event()]", "TypeError"),
        ("k[1, 1, 0, 0](cuda.device_array(3), 1, float('nan'))", "any"),
        ("k[1, 1](cuda.device_array(3, 'M8[s]'), 1, 1.0)", "any")]:
    case(g, expr, "KSRC = %r\n" % KSRC + KPRE + expr, exp)



# -- re-entrancy: the context closes, or memory goes, in the middle of a
# -- call (through a dunder method the call invokes)
g = "reentrancy"
for expr in (
        "cuda.device_array(CloseIndex())",
        "cuda.device_array((CloseIndex(), 2))",
        "cuda.device_array(CloseSeq())",
        "cuda.device_array(3, strides=(CloseIndex(),))",
        "cuda.device_array(3, dtype=CloseDtype())",
        "cuda.pinned_array(CloseIndex())",
        "cuda.mapped_array(CloseIndex())",
        "cuda.managed_array(CloseIndex())",
        "cuda.mapped_array(3, portable=CloseBool())",
        "cuda.managed_array(3, attach_global=CloseBool())",
        "cuda.to_device(CloseArray())",
        "cuda.to_device(CloseCAI())",
        "cuda.to_device(np.zeros(3), copy=CloseBool())",
        "cuda.to_device(CloseArray(), to=cuda.device_array(3))",
        "cuda.as_cuda_array(CloseCAI())",
        "cuda.from_dlpack(CloseDLPack())",
        "cuda.device_array(3).copy_to_device(CloseArray())",
        "cuda.device_array(3).copy_to_device(CloseCAI())",
        "cuda.device_array(3).copy_to_host(CloseArray())",
        "d = cuda.device_array(3)\nd[:] = CloseArray()",
        "d = cuda.device_array(3)\nd[CloseIndex() if False else 0] = "
        "CloseArray()",
        "d = cuda.device_array(4)\nd[CloseIndex()]",
        "d = cuda.device_array(4)\nd[CloseIndex()] = 1",
        "d = cuda.device_array(4)\nd[1:CloseIndex()]",
        "d = cuda.device_array(4)\nd[1:CloseIndex()] = 2",
        "d = cuda.device_array(4)\nd[:] = CloseCAI()",
        "cuda.device_array((2, 3)).reshape(CloseIndex(), 2)",
        "cuda.device_array((2, 3)).reshape(CloseSeq())",
        "cuda.device_array((1, 3)).squeeze(axis=CloseIndex())",
        "cuda.device_array((2, 3)).transpose((CloseIndex(), 0))",
        "cuda.device_array((2, 3)).view(CloseDtype())",
        "np.asarray(cuda.device_array(3), dtype=CloseDtype())",
        "cuda.device_array(3).__array__(copy=CloseBool())",
        "list(cuda.device_array(9).split(CloseIndex()))",
        "cuda.device_array(3).__dlpack__(copy=CloseBool())",
        "cuda.device_array(3).__dlpack__(max_version=(CloseIndex(), 0))",
        "cuda.device_array(3).__dlpack__(dl_device=(2, CloseIndex()))",
        "cuda.event(CloseBool())",
        "cuda.external_stream(CloseIndex())",
        "cuda.select_device(CloseIndex())",
        "cuda.memory_stats(CloseIndex())",
        "cuda.current_context().memalloc(CloseIndex())",
        "with cuda.pinned(CloseArray()):\n    pass",
        "with cuda.mapped(CloseArray()) as m:\n    m.copy_to_host()",
        "m = cuda.managed_array(3)\nm.prefetch(device=CloseIndex())",
        "m = cuda.mapped_array(3)\nm.copy_to_device(CloseArray())",
        "d = cuda.device_array(3)\nd.copy_to_device(FreeArray(d))",
        "d = cuda.device_array(3)\nd[:] = FreeArray(d)",
        "d = cuda.device_array(3)\ncuda.to_device(FreeArray(d), to=d)",
        "d = cuda.device_array(3)\nd.copy_to_host(FreeArray(d))",
        ):
    case(g, expr, expr, "any")
    # The same call in a worker thread: close() there pops the thread's
    # contexts only.
    case(g, "thread: " + expr,
         "import threading\nerr = []\n"
         "def body():\n    try:\n"
         + "".join("        " + ln + "\n" for ln in expr.split("\n"))
         + "    except Exception as e:\n        err.append(e)\n"
         "t = threading.Thread(target=body)\nt.start()\nt.join()", "ok")
case(g, "close in stream callback then use",
     "s = cuda.stream()\nd = cuda.to_device(np.arange(3.0), stream=s)\n"
     "s.add_callback(lambda *a: close())\ns.synchronize()\n"
     "d.copy_to_host()", "any")
case(g, "close from another thread during copies",
     "import threading\nstop = []\n"
     "def closer():\n    while not stop:\n        cuda.close()\n"
     "t = threading.Thread(target=closer)\nt.start()\n"
     "try:\n    for _ in range(200):\n        try:\n"
     "            d = cuda.to_device(np.arange(100.0))\n"
     "            d[1:5] = 2\n            d.copy_to_host()\n"
     "        except (ValueError, cuda.CudaAPIError):\n            pass\n"
     "finally:\n    stop.append(1)\n    t.join()", "ok")
case(g, "arrays used from many threads while main closes",
     "import threading\nd = cuda.to_device(np.arange(100.0))\n"
     "def user():\n    for _ in range(50):\n        try:\n"
     "            d.copy_to_host()\n            d[3] = 1\n"
     "        except (ValueError, cuda.CudaAPIError):\n            pass\n"
     "ts = [threading.Thread(target=user) for _ in range(3)]\n"
     "[t.start() for t in ts]\ncuda.close()\n[t.join() for t in ts]",
     "ok")


# -- constructors of the public classes
g = "constructors"
sweep(g, "cuda.DeviceNDArray({shape}, {strides}, {dtype}, stream={stream}, "
      "gpu_data={gpu_data})",
      {"shape": "(3,)", "strides": "(8,)", "dtype": "np.float64",
       "stream": "0", "gpu_data": "None"}, expect="any",
      overrides={(f, v): "ValueError"
                 for f in ("shape", "strides")
                 for v in ("2**63", "2**64", "10**30", "-2**63-1")})
MEM8 = "cuda.current_context().memalloc(8)"
for args, exp in [
        ("(1000,), (8,), np.float64, gpu_data=%s" % MEM8, "ValueError"),
        ("(3,), (2**62,), np.float64, gpu_data=%s" % MEM8, "ValueError"),
        ("(3,), (-8,), np.float64, gpu_data=%s" % MEM8, "ValueError"),
        ("(1,), (8,), np.float64, gpu_data=%s" % MEM8, "ok"),
        ("(2,), (8,), np.float64, gpu_data=cuda.MemoryPointer("
         "cuda.current_context(), 8, 8)", "ValueError"),
        ("(2,), (8,), np.float64, gpu_data=(p := cuda.MemoryPointer("
         "cuda.current_context(), 8, 8)).own()", "ValueError"),
        ("(3,), (8,), object, gpu_data=%s" % MEM8, "TypeError"),
        ("(3,), (8,), np.float64, gpu_data=object()", "raise"),
        ("(3,), (8,), np.float64, gpu_data=5", "raise"),
        ("(3,), (8,), np.float64, gpu_data=cuda.device_array(3)", "any"),
        ("(3,), (8,), np.float64, gpu_data=cuda.mapped_array(3)", "any"),
        ("(0,), (8,), np.float64, gpu_data=object()", "any"),
        ("(3,), (8,), np.float64, gpu_data=Fake()", "any"),
        ("(3,), (8, 8), np.float64", "ValueError"),
        ("(3, 3), (8,), np.float64", "ValueError"),
        ("(), (), np.float64", "ok"),
        ("(3,), None, np.float64", "any"),
        ("None, None, None", "TypeError"),
        ]:
    case(g, "DeviceNDArray(%s)" % args,
         "d = cuda.DeviceNDArray(%s)\nd.copy_to_host()" % args, exp)
case(g, "DeviceNDArray subclass", "class D(cuda.DeviceNDArray):\n"
     "    def __del__(self):\n        cuda.close()\n"
     "d = D((3,), (8,), np.float64)\nv = d[1:]\ndel d\nv.copy_to_host()",
     "any")
case(g, "DeviceNDArray subclass raising __init__",
     "class D(cuda.DeviceNDArray):\n"
     "    def __init__(self, *a, **k):\n        raise Boom('init')\n"
     "D((3,), (8,), np.float64)", "Boom")
for tp in ("Stream", "Event", "Context", "Device", "HostAllocation",
           "DeviceRecord", "Module", "Kernel", "HostRegistration"):
    case(g, "%s.__new__" % tp, "cuda.%s.__new__(cuda.%s)" % (tp, tp),
         "TypeError")
    case(g, "subclass %s" % tp, "class X(cuda.%s):\n    pass" % tp, "any")



# -- zero-itemsize dtypes ('V0', 'S0', an empty struct): every division
# -- by the itemsize is a SIGFPE waiting to happen
g = "itemsize0"
for dt in ("'V0'", "'S0'", "np.dtype([])", "np.dtype((np.int8, (0,)))"):
    for expr in (
            "d = cuda.device_array(4, {dt})",
            "d = cuda.device_array((2, 3), {dt})\nd.T",
            "d = cuda.device_array((2, 3), {dt})\nd.transpose()",
            "d = cuda.device_array((2, 3), {dt}, order='F')\nd.T",
            "cuda.device_array(4, {dt}).copy_to_host()",
            "cuda.device_array(4, {dt})[1]",
            "cuda.device_array(4, {dt})[1:3].copy_to_host()",
            "cuda.device_array(4, {dt})[::-1].copy_to_host()",
            "d = cuda.device_array(4, {dt})\nd[1] = np.zeros((), {dt})",
            "d = cuda.device_array(4, {dt})\nd[:] = np.zeros(4, {dt})",
            "d = cuda.device_array(4, {dt})\nd[:] = 0",
            "cuda.device_array(4, {dt}).view('f8')",
            "cuda.device_array(4).view({dt})",
            "cuda.device_array((2, 4), 'f8').view({dt})",
            "cuda.device_array(4, {dt}).view('V0')",
            "cuda.device_array(4, {dt}).reshape(2, 2)",
            "cuda.device_array(4, {dt}).reshape(-1, 2)",
            "cuda.device_array((0, 4), {dt}).reshape(-1)",
            "cuda.device_array(4, {dt}).ravel()",
            "cuda.device_array(4, {dt}).squeeze()",
            "list(cuda.device_array(4, {dt}).split(2))",
            "cuda.device_array(4, {dt}).__cuda_array_interface__",
            "cuda.from_dlpack(cuda.device_array(4, {dt}))",
            "cuda.device_array(4, {dt}).__dlpack__()",
            "np.asarray(cuda.device_array(4, {dt}))",
            "cuda.to_device(np.zeros(4, {dt}))",
            "cuda.to_device(np.zeros((3, 4), {dt})[:, ::2])",
            "cuda.to_device(np.zeros((3, 4), {dt}).T)",
            "cuda.device_array(4, {dt}).copy_to_device(np.zeros(4, {dt}))",
            "cuda.device_array(4, {dt}, strides=(0,)).copy_to_host()",
            "cuda.device_array(4, {dt}, strides=(5,)).copy_to_host()",
            "cuda.device_array((3, 4), {dt})[:, ::2].copy_to_host()",
            "cuda.device_array_like(np.zeros((3, 4), {dt})[:, ::2])",
            "cuda.pinned_array(4, {dt})",
            "cuda.mapped_array(4, {dt}).copy_to_host()",
            "cuda.managed_array(4, {dt}).__cuda_array_interface__",
            "cuda.pinned_array_like(np.zeros((3, 4), {dt}).T)",
            "cuda.from_cuda_array_interface(dict(shape=(4,), strides=None, "
            "typestr='|V0', data=(0, False), version=3))",
            "cuda.from_cuda_array_interface(dict(shape=(4,), strides=(0,), "
            "typestr='|V0', data=(8, False), version=3))",
            "with cuda.pinned(np.zeros(4, {dt})):\n    pass",
            "with cuda.mapped(np.zeros(4, {dt})) as m:\n    m.copy_to_host()",
            ):
        src = expr.format(dt=dt)
        case(g, src, src, "any")


# -- misuse of context managers, handles and registrations
g = "misuse"
for src, exp in [
        ("with cuda.gpus[0]:\n    cuda.close()", "any"),
        ("cuda.gpus[0].__exit__(None, None, None)", "any"),
        ("for _ in range(5):\n    cuda.gpus[0].__exit__(None, None, None)",
         "any"),
        ("for _ in range(2000):\n    cuda.select_device(0)\ncuda.close()",
         "ok"),
        ("c = cuda.current_context()\nc.pop()\nc.pop()\nc.pop()", "any"),
        ("c = cuda.current_context()\ncuda.close()\nc.push()\n"
         "cuda.device_array(3).copy_to_host()", "any"),
        ("c = cuda.current_context()\nd = cuda.to_device(np.arange(3.0))\n"
         "c.reset()\nd.copy_to_host()", "any"),
        ("d = cuda.to_device(np.arange(3.0))\ncuda.get_current_device()."
         "reset()\nd.copy_to_host()", "any"),
        ("d = cuda.to_device(np.arange(3.0))\ncuda.get_current_device()."
         "reset()\nd[0] = 5", "any"),
        ("c = cuda.current_context()\ncuda.close()\nc.memalloc(8)", "any"),
        ("c = cuda.current_context()\ncuda.close()\nc.get_memory_info()",
         "any"),
        ("c = cuda.current_context()\ncuda.close()\nc.synchronize()",
         "any"),
        ("c = cuda.current_context()\ncuda.close()\n"
         "c.memory_manager.get_memory_info()", "any"),
        ("c = cuda.current_context()\ncuda.close()\n"
         "c.deallocations.clear()", "any"),
        ("a = np.zeros(4)\nwith cuda.mapped(a) as d:\n    pass\n"
         "d.copy_to_host()", "any"),
        ("a = np.zeros(4)\nwith cuda.mapped(a) as d:\n    pass\n"
         "d[0] = 5", "any"),
        ("a = np.zeros(4)\nwith cuda.mapped(a) as d:\n    pass\n"
         "del a\nd.copy_to_host()", "any"),
        ("a = np.zeros(4)\nwith cuda.mapped(a) as d:\n    cuda.close()\n",
         "any"),
        ("a = np.zeros(4)\nwith cuda.pinned(a):\n    cuda.close()\n",
         "any"),
        ("s = cuda.stream()\nwith s.auto_synchronize():\n    cuda.close()",
         "any"),
        ("s = cuda.stream()\na = s.auto_synchronize()\n"
         "a.__exit__(None, None, None)\na.__exit__(None, None, None)",
         "any"),
        ("s = cuda.stream()\na = s.auto_synchronize()\n"
         "a.__exit__(1, 2, 3)", "any"),
        ("with cuda.defer_cleanup():\n    with cuda.defer_cleanup():\n"
         "        cuda.close()\n        d = cuda.device_array(3)\n"
         "    del d\n", "any"),
        ("import asyncio\ne = cuda.event()\ne.record()\ncuda.close()\n"
         "async def w():\n    await e\nasyncio.run(w())", "any"),
        ("import asyncio\ns = cuda.stream()\ncuda.close()\n"
         "async def w():\n    await s.async_done()\nasyncio.run(w())",
         "any"),
        ("import asyncio\ns = cuda.stream()\n"
         "async def w():\n    t = asyncio.ensure_future(s.async_done())\n"
         "    t.cancel()\n    cuda.close()\n    await asyncio.sleep(0.01)\n"
         "asyncio.run(w())", "any"),
        ("import asyncio\ne = cuda.event()\n"
         "async def w():\n    t = asyncio.ensure_future(e.__await__()"
         ".__next__())\nasyncio.run(w())", "any"),
        ("e = cuda.event()\nit = e.__await__()\nnext(it)\nnext(it)",
         "any"),
        ("s = cuda.stream()\n"
         "s.add_callback(lambda *a: (_ for _ in ()).throw(SystemExit(3)))\n"
         "s.synchronize()", "any"),
        ("s = cuda.stream()\n"
         "s.add_callback(lambda *a: (_ for _ in ()).throw("
         "KeyboardInterrupt()))\ns.synchronize()", "any"),
        ("s = cuda.stream()\nfor _ in range(200):\n"
         "    s.add_callback(lambda *a: None)\ndel s", "ok"),
        ("s = cuda.stream()\n"
         "s.add_callback(lambda st, status, arg: arg.append(st), [])\n"
         "cuda.close()", "any"),
        # (Host arrays read or written after close(): see
        # test_host_arrays_survive_close below.)
        ("m = cuda.managed_array(3)\ncuda.close()\nm.prefetch()", "any"),
        ("h = cuda.device_array(8).get_ipc_handle()\nh.close()\nh.close()",
         "any"),
        ("d = cuda.device_array(3)\nd.stream = cuda.stream()\n"
         "cuda.close()\nd.copy_to_host()", "any"),
        ("s = cuda.stream()\ncuda.close()\n"
         "cuda.to_device(np.zeros(3), stream=s)", "any"),
        ("s = cuda.stream()\ncuda.close()\n"
         "cuda.mapped_array(3, stream=s).copy_to_host()", "any"),
        ("e = cuda.event()\ncuda.close()\ne.record(cuda.stream())", "any"),
        ("s = cuda.stream()\ne = cuda.event()\ncuda.close()\n"
         "s2 = cuda.stream()\ne.record(s2)\ns2.wait_event(e)", "any"),
        ("cuda.close()\ncuda.memory_stats()\ncuda.pinned_pool_stats()\n"
         "cuda.pinned_pool_trim()", "ok"),
        ]:
    case(g, src, src, exp)
