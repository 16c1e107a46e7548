#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Which of numba.cuda's names cudamem has: a markdown matrix.

Walks numba.cuda's public namespace, the modules numba.cuda.cudadrv.driver,
devicearray and devices, and the public members of the classes code
written for numba's lower layer uses (Context, Device, Stream, Event,
DeviceNDArray, DeviceRecord, the MemoryPointer family, IpcHandle), and
prints for each name whether cudamem has it, whether the call signatures
agree, and why cudamem lacks it where that is deliberate (REASONS below,
and the JIT rule: kernels are CUDA C in cudamem).

    python tools/compat_matrix.py                 # import numba.cuda
    python tools/compat_matrix.py --numba-source DIR
        # no numba here: read numba-cuda's source tree instead (DIR holds
        # numba/cuda/, e.g. an unpacked wheel); signatures from the source
    python tools/compat_matrix.py --out docs/numba-compat.md --check

``--check`` exits 1 when a name cudamem lacks has no reason.

The section on numba-cuda's own test suite (between the markers
``<!-- begin: numba-suite -->`` and ``<!-- end: numba-suite -->``) is
written by hand: it is copied from ``--keep-from`` (docs/numba-compat.md)
into what is generated, after the summary, or written as
NUMBA_SUITE_SECTION where that file has none.
"""

import argparse
import ast
import inspect
import os
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

# numba modules whose names only make sense inside kernels numba compiles
# (device functions, types, the compiler): cudamem's kernels are CUDA C.
JIT_MODULES = (
    "numba.cuda.stubs", "numba.cuda.intrinsics", "numba.cuda.decorators",
    "numba.cuda.dispatcher", "numba.cuda.compiler", "numba.cuda.cudadecl",
    "numba.cuda.cudaimpl", "numba.cuda.target", "numba.cuda.typing",
    "numba.cuda.types", "numba.cuda.fp16", "numba.cuda.bf16",
    "numba.cuda.fp8", "numba.cuda.vector_types", "numba.cuda.libdevice",
    "numba.cuda.cg", "numba.cuda.random", "numba.cuda.kernels",
    "numba.cuda.vectorizers", "numba.cuda.deviceufunc", "numba.cuda.np",
    "numba.cuda.extending", "numba.cuda.core", "numba.cuda.misc",
    "numba.cuda.cache_hints", "numba.cuda.args", "numba.cuda.cudamath",
    "numba.cuda.mathimpl", "numba.cuda.printimpl", "numba.cuda.models",
    "numba.cuda.datamodel", "numba.cuda.lowering", "numba.cuda.codegen",
    "numba.cuda.cudadrv.nvvm", "numba.cuda.cudadrv.linkable_code",
    "numba.cuda.cudadrv.runtime", "numba.cuda.memory_management",
    "numba.cuda.simulator", "numba.cuda.initialize", "numba.cuda.errors",
    "numba.cuda.cext", "numba.cuda.debuginfo", "numba.cuda.serialize",
    "numba.cuda.launchconfig", "numba.cuda.descriptor",
    "numba.cuda.itanium_mangler", "numba.cuda.nvvmutils",
    "numba.cuda.cgutils", "numba.cuda.ufuncs", "numba.cuda.utils",
    "numba.cuda.testing", "numba.cuda.tests", "numba.cuda.cloudpickle",
    "numba.cuda.cpython", "numba.cuda.typeconv",
    # numba's type objects (int32, float64, void, optional, ...) name
    # types in JIT signatures; cffi support (ffi) is for JIT code too
    "numba.core", "numba.np", "numba.misc", "numba.cuda.cffi",
)
JIT_REASON = ("JIT: belongs to kernels numba compiles from Python; "
              "cudamem's kernels are CUDA C (cudamem.compile, Kernel)")

# Names cudamem deliberately lacks, and why.
REASONS = {
    "api": "numba's module that holds the public functions; cudamem "
           "exports the same functions at the top level",
    "locks": "a lock numba's compiler takes; cudamem compiles nothing "
             "from Python",
    "flags": "numba's compiler flags (JIT)",
    "alias": "a name of numba's type system (numba.cuda.types), for JIT "
             "signatures",
    "ffi": JIT_REASON, "ffi_forced_object": JIT_REASON,
    # numba.cuda namespace
    "jit": JIT_REASON, "declare_device": JIT_REASON, "grid": JIT_REASON,
    "gridsize": JIT_REASON, "shared": JIT_REASON, "local": JIT_REASON,
    "const": JIT_REASON, "threadIdx": JIT_REASON, "blockIdx": JIT_REASON,
    "blockDim": JIT_REASON, "gridDim": JIT_REASON, "laneid": JIT_REASON,
    "warpsize": JIT_REASON, "syncthreads": JIT_REASON, "atomic": JIT_REASON,
    "reduce": JIT_REASON, "Reduce": JIT_REASON, "reduction": JIT_REASON,
    "In": JIT_REASON, "Out": JIT_REASON, "InOut": JIT_REASON,
    "literal_unroll": JIT_REASON, "literal": JIT_REASON,
    "compile_for_current_device": JIT_REASON, "compile_ptx": JIT_REASON,
    "compile_ptx_for_current_device": JIT_REASON, "compile_all": JIT_REASON,
    "declare_device_function": JIT_REASON, "cg": JIT_REASON,
    "runtime": "the CUDA runtime library's version query belongs to "
               "numba's compiler; cudamem has runtime_version()",
    "nvvm": JIT_REASON, "types": JIT_REASON, "config": None,
    "initialize": JIT_REASON, "KernelRuntimeError": JIT_REASON,
    "Linker": JIT_REASON, "LinkableCode": JIT_REASON, "PTXSource": JIT_REASON,
    "CUSource": JIT_REASON, "Cubin": JIT_REASON, "Fatbin": JIT_REASON,
    "Object": JIT_REASON, "Archive": JIT_REASON, "LTOIR": JIT_REASON,
    "simulator": "numba's Python simulator; cudamem has its own "
                 "(CUDAMEM_SIMULATOR=1)",
    "simulator_init": "numba's Python simulator; cudamem has its own "
                      "(CUDAMEM_SIMULATOR=1)",
    "HAS_NUMBA": "describes numba's own installation",
    "cuda_paths": "toolkit discovery for numba's compiler",
    "dispatcher": JIT_REASON, "decorators": JIT_REASON,
    "compiler": JIT_REASON, "target": JIT_REASON, "stubs": JIT_REASON,
    "intrinsics": JIT_REASON, "device_init": "numba's import machinery",
    "api_util": "numba's internal helper module",
    "get_current_device": None,
    # numba.cuda.cudadrv.driver
    "Driver": "numba's ctypes / cuda-python driver wrapper; cudamem calls "
              "the driver from C",
    "driver": "numba's driver wrapper object; cudamem calls the driver "
              "from C",
    "find_driver": "numba's driver loader; cudamem loads libcuda from C",
    "load_driver": "numba's driver loader; cudamem loads libcuda from C",
    "locate_driver_and_loader": "numba's driver loader",
    "make_logger": "numba's API-call logging (NUMBA_CUDA_LOG_LEVEL)",
    "CudaPythonModule": JIT_REASON, "CudaPythonFunction": JIT_REASON,
    "load_module_image": JIT_REASON, "inspect_obj_content": JIT_REASON,
    "LinkerError": JIT_REASON, "DeadMemoryError": "never raised by numba",
    "NumbaCUDAMemoryManager": "numba's built-in manager is private; "
                              "cudamem's are DefaultMemoryManager and the "
                              "pool and async managers",
    "get_devptr_for_active_ctx": "cuPointerGetAttribute on raw pointers, "
                                 "used by numba's kernel launcher",
    "ObjectCode": JIT_REASON, "Module": None,
    # Context members
    "create_module_ptx": JIT_REASON, "create_module_image": JIT_REASON,
    "unload_module": JIT_REASON, "modules": JIT_REASON,
    "get_active_blocks_per_multiprocessor": JIT_REASON,
    "get_max_potential_block_size": JIT_REASON,
    "extras": "numba's per-context store for its compiler",
    # Stream / Event
    "async_done": "an asyncio future of a stream: not provided (use "
                  "add_callback)",
    "ERROR_MAP": "numba's table of driver error codes; cudamem names "
                 "them with cuGetErrorName",
    "DRIVER_LOAD_ERROR_MSG": "numba's driver loader messages",
    "DRIVER_NOT_FOUND_MSG": "numba's driver loader messages",
    "cu_stream_callback_pyobj": "the ctypes type of numba's stream "
                                "callback; cudamem's callbacks are C",
    "FuncAttr": JIT_REASON, "Function": JIT_REASON,
    "config_default_cc": JIT_REASON,
    "numba_cuda_default_ptx_cc": JIT_REASON,
    "implementation": "says whether numba uses the NVIDIA bindings",
    "utils": "numba's internal helper module",
    # numba.cuda.cudadrv.devicearray
    "array_core": "a helper of numba's copy engine, which is C in "
                  "cudamem",
    "check_array_compatibility": "a helper of numba's copy engine, which "
                                 "is C in cudamem",
    "is_contiguous": "a helper of numba's copy engine, which is C in "
                     "cudamem (arrays have is_c_contiguous / "
                     "is_f_contiguous)",
    # Device
    "from_identity": "cudamem finds devices by ordinal (gpus[i]); IPC "
                     "handles resolve their source device themselves",
    "get_primary_context": "primary contexts are retained in C; "
                           "current_context(i) or gpus[i] give device i's",
    "primary_context": "primary contexts are retained in C; "
                       "current_context(i) or gpus[i] give device i's",
    "release_primary_context": "primary contexts are released by "
                               "Device.reset() and close()",
    # DeviceRecord (0-d)
    "T": "not provided on 0-d records (it is the record itself)",
    "transpose": "not provided on 0-d records (it is the record itself)",
    "squeeze": "not provided on 0-d records (nothing to squeeze)",
    "split": "not provided on 0-d records (nothing to split)",
    "view": "not provided on 0-d records; view the array the record "
            "comes from",
    # DeviceNDArray
    "_numba_type_": JIT_REASON,
    "as_cuda_arg": None,
    "get_ipc_handle": "not provided on 0-d records; export the array the "
                      "record comes from",
    "prepare_shape_strides_dtype": "numba's argument helper for its "
                                   "allocation functions (cudamem parses "
                                   "them in C)",
    "forall": JIT_REASON,
}

SECTIONS = [
    ("numba.cuda", "cudamem"),
    ("numba.cuda.cudadrv.driver", "cudamem.cudadrv.driver"),
    ("numba.cuda.cudadrv.devicearray", "cudamem.cudadrv.devicearray"),
    ("numba.cuda.cudadrv.devices", "cudamem.cudadrv.devices"),
]

# (numba module, class) -> cudamem objects that play the part (the first
# found answers; the memory owners stand in for the pointer classes).
CLASSES = [
    ("numba.cuda.cudadrv.driver", "Context", ["Context"]),
    ("numba.cuda.cudadrv.driver", "Device", ["Device"]),
    ("numba.cuda.cudadrv.driver", "Stream", ["Stream"]),
    ("numba.cuda.cudadrv.driver", "Event", ["Event"]),
    ("numba.cuda.cudadrv.driver", "IpcHandle", ["IpcHandle"]),
    ("numba.cuda.cudadrv.driver", "MemoryPointer",
     ["MemoryPointer", "DeviceAllocation"]),
    ("numba.cuda.cudadrv.driver", "AutoFreePointer",
     ["AutoFreePointer", "DeviceAllocation"]),
    ("numba.cuda.cudadrv.driver", "MappedMemory",
     ["MappedMemory", "HostAllocation"]),
    ("numba.cuda.cudadrv.driver", "PinnedMemory",
     ["PinnedMemory", "HostAllocation"]),
    ("numba.cuda.cudadrv.driver", "ManagedMemory",
     ["ManagedMemory", "HostAllocation"]),
    ("numba.cuda.cudadrv.driver", "OwnedPointer", ["OwnedPointer"]),
    ("numba.cuda.cudadrv.devicearray", "DeviceNDArray", ["DeviceNDArray"]),
    ("numba.cuda.cudadrv.devicearray", "DeviceRecord", ["DeviceRecord"]),
]
DUNDERS = ("__cuda_memory__", "__cuda_ndarray__", "__cuda_array_interface__",
           "__cuda_stream__", "__int__", "__len__", "__getitem__",
           "__setitem__", "__array__", "__enter__", "__exit__",
           "__reduce__", "__buffer__")


# ---------------------------------------------------------------------------
# numba's side: a name -> Entry table per section and per class
# ---------------------------------------------------------------------------


class Entry:
    """A numba name: its kind, its parameters (None: unknown) and the
    module that defines it."""

    def __init__(self, kind, params=None, module=""):
        self.kind = kind
        self.params = params
        self.module = module


def _params_of(obj):
    try:
        sig = inspect.signature(obj)
    except (TypeError, ValueError):
        return None
    out = []
    for p in sig.parameters.values():
        if p.name in ("self", "cls"):
            continue
        default = None if p.default is p.empty else repr(p.default)
        out.append((p.name, p.kind.name, default))
    return out


def _self_attrs(cls):
    """Names a Python class's __init__ methods (along its MRO) assign on
    self."""
    names = set()
    for klass in getattr(cls, "__mro__", ()):
        init = klass.__dict__.get("__init__")
        if init is None or not inspect.isfunction(init):
            continue
        try:
            src = inspect.getsource(init)
        except (OSError, TypeError):
            continue
        names.update(re.findall(r"self\.([A-Za-z]\w*)\s*=(?!=)", src))
    return names


def _kind(obj):
    if inspect.ismodule(obj):
        return "module"
    if inspect.isclass(obj):
        return "class"
    if callable(obj):
        return "function"
    if isinstance(obj, property):
        return "property"
    return "value"


def numba_live():
    import numpy as np

    if not hasattr(np, "row_stack"):
        np.row_stack = np.vstack
    import importlib

    sections = {}
    for modname, _ in SECTIONS:
        mod = importlib.import_module(modname)
        table = {}
        for name in dir(mod):
            if name.startswith("_"):
                continue
            obj = getattr(mod, name)
            where = getattr(obj, "__module__", None) or (
                obj.__name__ if inspect.ismodule(obj) else "")
            if modname != "numba.cuda":
                defined_here = where == modname
                if not (defined_here or name in getattr(mod, "__all__", ())):
                    continue
            table[name] = Entry(_kind(obj), _params_of(obj)
                                if callable(obj) else None, where or "")
        sections[modname] = _public(table, modname) if modname != \
            "numba.cuda" else {k: v for k, v in table.items()
                               if v.kind != "module"
                               or v.module.startswith("numba")}
    classes = {}
    for modname, clsname, _ in CLASSES:
        cls = getattr(importlib.import_module(modname), clsname)
        members = {}
        for name in dir(cls):
            if name.startswith("_") and name not in DUNDERS:
                continue
            if name in dir(object) and name not in DUNDERS:
                continue
            raw = inspect.getattr_static(cls, name)
            members[name] = Entry(_kind(raw), _params_of(getattr(cls, name))
                                  if callable(getattr(cls, name)) else None)
        for name in _self_attrs(cls):
            members.setdefault(name, Entry("attribute"))
        classes[clsname] = members
    return sections, classes


# --- the same from numba-cuda's source, without importing it --------------

def _ast_params(fn):
    a = fn.args
    out = []
    pos = a.posonlyargs + a.args
    defaults = [None] * (len(pos) - len(a.defaults)) + [
        ast.unparse(d) for d in a.defaults]
    for arg, d in zip(pos, defaults, strict=True):
        if arg.arg in ("self", "cls"):
            continue
        kind = ("POSITIONAL_ONLY" if arg in a.posonlyargs
                else "POSITIONAL_OR_KEYWORD")
        out.append((arg.arg, kind, d))
    if a.vararg:
        out.append((a.vararg.arg, "VAR_POSITIONAL", None))
    for arg, d in zip(a.kwonlyargs, a.kw_defaults, strict=True):
        out.append((arg.arg, "KEYWORD_ONLY",
                    None if d is None else ast.unparse(d)))
    if a.kwarg:
        out.append((a.kwarg.arg, "VAR_KEYWORD", None))
    return out


class _Source:
    def __init__(self, root):
        self.root = root
        self.trees = {}

    def path(self, modname):
        rel = modname.replace(".", os.sep)
        for cand in (rel + ".py", os.path.join(rel, "__init__.py")):
            p = os.path.join(self.root, cand)
            if os.path.exists(p):
                return p
        return None

    def tree(self, modname):
        if modname not in self.trees:
            p = self.path(modname)
            self.trees[modname] = (ast.parse(open(p).read())
                                   if p else None)
        return self.trees[modname]

    @staticmethod
    def resolve(modname, node):
        if node.level == 0:
            return node.module or ""
        base = modname.split(".")
        base = base[:len(base) - node.level]
        return ".".join(base + ([node.module] if node.module else []))

    def defined(self, modname, depth=0):
        """name -> Entry for the public names module ``modname`` defines
        or imports at top level (star imports followed)."""
        tree = self.tree(modname)
        out = {}
        if tree is None:
            return out
        pkg_mod = modname
        if self.path(modname).endswith("__init__.py"):
            pkg_mod = modname + ".__init__"
        for node in tree.body:
            self._node(node, modname, pkg_mod, out, depth)
        return out

    def _node(self, node, modname, pkg_mod, out, depth):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            out[node.name] = Entry("function", _ast_params(node), modname)
        elif isinstance(node, ast.ClassDef):
            init = next((b for b in node.body
                         if isinstance(b, ast.FunctionDef)
                         and b.name == "__init__"), None)
            out[node.name] = Entry("class", _ast_params(init)
                                   if init else None, modname)
        elif isinstance(node, ast.Assign):
            for t in node.targets:
                if isinstance(t, ast.Name):
                    out[t.id] = Entry("value", None, modname)
        elif isinstance(node, ast.ImportFrom):
            src = self.resolve(pkg_mod, node)
            for alias in node.names:
                if alias.name == "*":
                    if depth < 2:
                        star = self.defined(src, depth + 1)
                        out.update({k: v for k, v in star.items()
                                    if not k.startswith("_")})
                    continue
                sub = self.defined(src, depth + 1) if depth < 2 else {}
                e = sub.get(alias.name) or Entry(
                    "module" if self.path(src + "." + alias.name)
                    else "value", None, src)
                out[alias.asname or alias.name] = e
        elif isinstance(node, ast.Import):
            for alias in node.names:
                out[alias.asname or alias.name.split(".")[0]] = Entry(
                    "module", None, alias.name)
        elif isinstance(node, ast.If):
            # numba's "if config.ENABLE_CUDASIM: ... else: ..." picks the
            # simulator or the device; the device branch is the one here.
            branch = (node.orelse if "CUDASIM" in ast.unparse(node.test)
                      else node.body)
            for sub in branch:
                self._node(sub, modname, pkg_mod, out, depth)

    def class_members(self, modname, clsname, seen=None):
        tree = self.tree(modname)
        seen = seen or set()
        members = {}
        if tree is None or clsname in seen:
            return members
        seen.add(clsname)
        node = next((n for n in tree.body if isinstance(n, ast.ClassDef)
                     and n.name == clsname), None)
        if node is None:
            return members
        for base in node.bases:
            if isinstance(base, ast.Name):
                members.update(self.class_members(modname, base.id, seen))
        for b in node.body:
            if isinstance(b, ast.FunctionDef):
                if b.name.startswith("_") and b.name not in DUNDERS:
                    if b.name == "__init__":
                        for n in ast.walk(b):
                            if (isinstance(n, ast.Attribute)
                                    and isinstance(n.ctx, ast.Store)
                                    and isinstance(n.value, ast.Name)
                                    and n.value.id == "self"
                                    and not n.attr.startswith("_")):
                                members.setdefault(n.attr,
                                                   Entry("attribute"))
                    continue
                deco = {ast.unparse(d) for d in b.decorator_list}
                kind = "property" if "property" in deco else "function"
                members[b.name] = Entry(kind, None if kind == "property"
                                        else _ast_params(b))
            elif isinstance(b, ast.Assign):
                for t in b.targets:
                    if isinstance(t, ast.Name) and (
                            not t.id.startswith("_") or t.id in DUNDERS):
                        members[t.id] = Entry("value")
        return members


def _public(table, modname):
    """The public names of a section: no private names, no modules from
    outside numba (numba's own imports of sys, numpy, ...), and outside
    numba.cuda itself only what the module defines."""
    out = {}
    for k, v in table.items():
        if k.startswith("_"):
            continue
        if v.kind == "module" and not v.module.startswith("numba"):
            continue
        if modname != "numba.cuda" and v.module != modname:
            continue
        out[k] = v
    return out


def numba_from_source(root):
    src = _Source(root)
    sections = {}
    for modname, _ in SECTIONS:
        sections[modname] = _public(src.defined(modname), modname)
    classes = {clsname: src.class_members(modname, clsname)
               for modname, clsname, _ in CLASSES}
    return sections, classes


# ---------------------------------------------------------------------------
# cudamem's side and the comparison
# ---------------------------------------------------------------------------


def _has_member(objs, name):
    for obj in objs:
        if hasattr(obj, name) or name in _self_attrs(obj):
            return True
    return False


def _signature_cell(entry, ours):
    """'same', 'compatible', 'differs: ...' or '' (not comparable)."""
    if entry is None or entry.params is None or ours is None:
        return ""
    mine = _params_of(ours)
    if mine is None:
        return ""
    theirs = [(n, k) for n, k, _ in entry.params]
    names = [n for n, _, _ in mine]
    if [(n, k) for n, k, _ in mine] == theirs:
        return "same"
    if any(k == "VAR_KEYWORD" for _, k, _ in mine) or all(
            n in names for n, _ in theirs if not n.startswith("*")):
        extra = [n for n, k, d in mine
                 if n not in {t for t, _ in theirs} and d is None
                 and k not in ("VAR_POSITIONAL", "VAR_KEYWORD")]
        if not extra:
            return "compatible"
    return "differs: numba (%s), cudamem (%s)" % (
        ", ".join(n for n, _ in theirs), ", ".join(names))


def _reason(name, entry):
    if name in REASONS and REASONS[name]:
        return REASONS[name]
    mod = entry.module if entry is not None else ""
    if any(mod == m or mod.startswith(m + ".") for m in JIT_MODULES):
        return JIT_REASON
    return ""


def build(sections, classes):
    import importlib

    import cudamem

    lines = []
    missing_unexplained = []
    summary = []
    for modname, ourname in SECTIONS:
        ours = importlib.import_module(ourname)
        rows = []
        present = 0
        for name in sorted(sections.get(modname, {})):
            e = sections[modname][name]
            obj = getattr(ours, name, None)
            has = obj is not None or hasattr(ours, name)
            present += has
            sig = _signature_cell(e, obj) if has and callable(obj) else ""
            why = "" if has else _reason(name, e)
            if not has and not why:
                missing_unexplained.append("%s.%s" % (modname, name))
            rows.append("| `%s` | %s | %s | %s |" % (
                name, "yes" if has else "**no**", sig, why))
        summary.append("| `%s` | %d | %d |" % (modname, present, len(rows)))
        lines += ["", "## `%s` (cudamem: `%s`)" % (modname, ourname), "",
                  "| name | in cudamem | signature | why not |",
                  "|---|---|---|---|"] + rows
    for modname, clsname, cands in CLASSES:
        objs = [o for o in (getattr(cudamem, c, None)
                            or getattr(cudamem._core, c, None)
                            for c in cands) if o is not None]
        rows = []
        present = 0
        members = classes.get(clsname, {})
        for name in sorted(members):
            e = members[name]
            has = _has_member(objs, name)
            present += has
            sig = ""
            if has and e.params is not None:
                for o in objs:
                    attr = inspect.getattr_static(o, name, None)
                    if callable(attr):
                        sig = _signature_cell(e, getattr(o, name))
                        break
            why = "" if has else _reason(name, None)
            if not has and not why:
                missing_unexplained.append("%s.%s" % (clsname, name))
            rows.append("| `%s` | %s | %s | %s |" % (
                name, "yes" if has else "**no**", sig, why))
        summary.append("| `%s` (class) | %d | %d |" % (clsname, present,
                                                        len(rows)))
        lines += ["", "## `%s.%s` (cudamem: %s)" % (
            modname, clsname, ", ".join("`%s`" % c for c in cands)), "",
            "| member | in cudamem | signature | why not |",
            "|---|---|---|---|"] + rows
    head = ["| where | present | numba names |", "|---|---|---|"] + summary
    return head, lines, missing_unexplained


# The hand-written section on numba-cuda's suite under cudamem's plugin
# (tools/numba_suite.py reads the test ids listed in it).
KEEP_BEGIN = "<!-- begin: numba-suite -->"
KEEP_END = "<!-- end: numba-suite -->"
NUMBA_SUITE_SECTION = KEEP_BEGIN + """
## numba-cuda's test suite on cudamem's plugin

`CUDAMEM_GPU_PART=numba bash .ci/gpu` runs numba-cuda's own tests on the
GPU twice, each module in a child process of its own: with numba's own
memory manager, and with `NUMBA_CUDA_MEMORY_MANAGER=cudamem.numba_plugin`
(`tools/numba_suite.py`; `--dry-run` lists the modules and why each is
there: all of `numba.cuda.tests.cudadrv`, and the `cudapy` modules whose
tests allocate, copy, share or free device memory).  The two counts go
side by side into `benchmarks/RESULTS.md`; the tool's `numba-suite.md`
has them per module, and the tests that pass with numba's manager but
not with the plugin, each with the last line of its error.

Every test that passes with numba's manager passes with the plugin, or
is listed here with its reason.  The tool reads this list (the test ids
in backticks between this section's markers) and fails the run on a
difference that is not in it.  A test numba skips by design when an
external memory manager is in use (`skip_if_external_memmgr`) is
listed with numba's reason for skipping it.

This section is written by hand; `tools/compat_matrix.py` keeps it when
it regenerates this file.  Its rows come from a GPU run's
`numba-suite.md` (the table "Pass on numba's manager, not on
cudamem.numba_plugin"): the test's full id in backticks, its outcome
with the plugin, and the reason (the error's last line says what
happened, not why).

| test | with the plugin | reason |
|---|---|---|
""" + KEEP_END


def kept_section(path):
    """The hand-written section of ``path`` (markers included), or
    NUMBA_SUITE_SECTION when the file or the section is missing."""
    try:
        with open(path) as f:
            text = f.read()
    except OSError:
        return NUMBA_SUITE_SECTION
    m = re.search(re.escape(KEEP_BEGIN) + ".*?" + re.escape(KEEP_END),
                  text, re.S)
    return m.group(0) if m else NUMBA_SUITE_SECTION


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--numba-source", metavar="DIR",
                    help="read numba-cuda's source under DIR instead of "
                         "importing numba.cuda")
    ap.add_argument("--out", metavar="FILE",
                    help="also write the markdown to FILE")
    ap.add_argument("--check", action="store_true",
                    help="exit 1 if a missing name has no reason")
    ap.add_argument("--keep-from", metavar="FILE",
                    default=os.path.join(ROOT, "docs", "numba-compat.md"),
                    help="the file whose hand-written section on "
                         "numba-cuda's suite is kept "
                         "(docs/numba-compat.md)")
    a = ap.parse_args(argv)
    sys.path.insert(0, ROOT)
    if a.numba_source:
        sections, classes = numba_from_source(a.numba_source)
        origin = ("numba-cuda's source (%s), read without importing it"
                  % _source_version(a.numba_source))
    else:
        try:
            sections, classes = numba_live()
        except ImportError as e:
            sys.stderr.write("numba.cuda cannot be imported here (%s); "
                             "pass --numba-source DIR to read numba-cuda's "
                             "source instead\n" % e)
            return 2
        import numba.cuda

        origin = "numba-cuda %s, imported" % getattr(
            numba.cuda, "__version__", "?")
    head, body, unexplained = build(sections, classes)
    text = "\n".join([
        "# numba.cuda names in cudamem",
        "",
        "Generated by `tools/compat_matrix.py` from %s; regenerated by "
        "`.ci/gpu` against the numba-cuda installed there." % origin,
        "\"signature\": *same* (parameter names and kinds), *compatible* "
        "(cudamem accepts every numba parameter by name), or how they "
        "differ; empty where one side's signature cannot be read (C "
        "functions without a text signature, attributes).  Pointer "
        "classes: cudamem's memory owners (`DeviceAllocation`, "
        "`HostAllocation`) count too, as they are what its arrays and "
        "contexts hand out.", "",
    ] + head + [
        "", "Missing without a written reason: %s" % (
            ", ".join("`%s`" % n for n in unexplained) or "none"),
        "", kept_section(a.keep_from),
    ] + body) + "\n"
    sys.stdout.write(text)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text)
    return 1 if a.check and unexplained else 0


def _source_version(root):
    for d in (root, os.path.dirname(os.path.abspath(root))):
        for name in os.listdir(d):
            m = re.match(r"numba_cuda-([\w.]+)\.dist-info$", name)
            if m:
                return "numba-cuda " + m.group(1)
    return root


if __name__ == "__main__":
    sys.exit(main())
