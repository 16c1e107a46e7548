/* SPDX-License-Identifier: MIT */
/*
 * memory/default.c: the tables of the default memory manager
 * (cm_mm_default: cuMemAlloc, stream-blind, its memory freed by a
 * cuMemFree queued on the context's memory queue, which memory.c runs)
 * and of a Python EMM plugin (cm_mm_plugin: no functions, memory.c calls
 * the plugin object), and the two rules of a plugin's calls: its
 * initialize() runs before anything is allocated through it
 * (cm_mm_prepare), and a built-in manager's own methods, called by a
 * plugin that wraps it, allocate with the built-in manager
 * (cm_mm_direct).  See cm_mm_ops in memory/memory.h.
 *
 * Locks and the GIL: no lock of its own.  The default allocation gives
 * up the GIL (CM_DRIVER_BEGIN_NOGIL) around cuMemAlloc only, after the
 * limit counted the bytes (atomics: limit.c); its release runs with or
 * without the GIL (the queue's flush, PyTorch's lane) and touches no
 * Python object.  cm_mm_direct and the plugin call in progress are per
 * thread (_Thread_local); the rest runs with the GIL held.
 */
#include "memory/memory.h"
#include "memory/pool/graph/graph.h"

/* cuMemAlloc, stream-blind, with the GIL released; the bytes count
 * against the limit until their cuMemFree. */
static CUresult
cm_default_alloc(cm_context *ctx, size_t size, CUstream stream,
                 CUdeviceptr *p, uintptr_t *handle)
{
    CUresult rc;
    int relaxed;
    cm_gpool *gp = cm_gpool_for(ctx, stream);

    if (gp != NULL) {
        /* Captured: the graph's own memory (memory/pool/graph/gpool.c). */
        return cm_gpool_alloc(ctx, gp, size, stream, p, handle);
    }
    if (!cm_limit_take(ctx, size)) {
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    CM_DRIVER_BEGIN_NOGIL
    cm_capture_relax(&relaxed);
    rc = CM_CU_RAW(MemAlloc, (p, size));
    cm_capture_unrelax(relaxed);
    CM_DRIVER_END_NOGIL
    if (rc != CUDA_SUCCESS) {
        cm_limit_give(ctx, size);
    }
    *handle = (uintptr_t)*p;
    return rc;
}

/* cuMemFree (it waits for the device itself: no stream rule). */
static CUresult
cm_default_release(cm_context *ctx, int kind, uintptr_t handle, size_t size,
                   CUstream stream)
{
    CUresult rc;

    (void)kind;
    (void)stream;
    if (cm_gpool_handle(handle)) {
        return cm_gpool_release(ctx, handle, 0);
    }
    rc = CM_CU_RAW(MemFree, ((CUdeviceptr)handle));
    cm_limit_give(ctx, size);
    return rc;
}

/* Nothing is cached: nothing to trim. */
static int
cm_default_trim(cm_context *ctx)
{
    (void)ctx;
    return 0;
}

/* Nothing is held; the largest free block is unknown. */
static void
cm_default_stats(cm_context *ctx, size_t *reserved, size_t *free_b,
                 long long *largest)
{
    (void)ctx;
    *reserved = 0;
    *free_b = 0;
    *largest = -1;
}

static const char *
cm_default_alloc_fn(cm_context *ctx)
{
    (void)ctx;
    return "cuMemAlloc";
}

/* The default manager: cuMemAlloc, and cuMemFree through the context's
 * memory queue. */
const cm_mm_ops cm_mm_default = {
    .kind = CM_MM_DEFAULT,
    .name = "default",
    .emm_class = "DefaultMemoryManager",
    .ordered = 0,
    .rel = CM_REL_DEVICE,
    .rel_sync = CM_REL_DEVICE,
    .rel_after = CM_REL_DEVICE,
    .alloc = cm_default_alloc,
    .release = cm_default_release,
    .trim = cm_default_trim,
    .stats = cm_default_stats,
    .alloc_fn = cm_default_alloc_fn,
};

/* A Python EMM plugin (ctx->memory_manager): the allocation path calls
 * its memalloc; it frees when its pointer objects go. */
const cm_mm_ops cm_mm_plugin = {
    .kind = CM_MM_PLUGIN,
    .name = "plugin",
    .emm_class = "DefaultMemoryManager",
};

/* The built-in manager's own methods running on this thread (nested
 * count): a plugin that wraps the manager it replaced
 * (ctx.memory_manager = wrapper(old)) calls them, and they must not call
 * the plugin back through the context. */
_Thread_local int cm_mm_direct;

int
cm_mm_uses_plugin(const cm_context *ctx)
{
    return ctx->mm == &cm_mm_plugin && cm_mm_direct == 0;
}

const cm_mm_ops *
cm_mm_active(const cm_context *ctx)
{
    return cm_mm_direct > 0 ? ctx->mm_builtin : ctx->mm;
}

int
cm_mm_prepare(cm_context *ctx)
{
    PyObject *r;

    if (!ctx->mm_init_pending || !cm_mm_uses_plugin(ctx)
        || ctx->memory_manager == NULL) {
        return 0;
    }
    /* Cleared first: an initialize() that allocates does not recurse. */
    ctx->mm_init_pending = 0;
    r = PyObject_CallMethod(ctx->memory_manager, "initialize", NULL);
    if (r == NULL) {
        ctx->mm_init_pending = 1;
        return -1;
    }
    Py_DECREF(r);
    return 0;
}

/* The context whose plugin's memalloc this thread is in, or NULL.  A
 * plugin whose memalloc allocates from the manager of its own context
 * asks itself again, without end: the second call is refused. */
static _Thread_local const cm_context *cm_plugin_calling;

/* The refusal of a plugin that re-entered its own context's manager. */
static void
cm_plugin_loop_error(cm_context *ctx)
{
    PyErr_Format(PyExc_RuntimeError,
                 "the memory manager plugin %s of device %d's context "
                 "allocated from that context's own memory manager, which "
                 "is the plugin itself: every allocation would ask the "
                 "plugin again. A plugin of a cudamem context must take "
                 "its memory elsewhere (a plugin that takes it from "
                 "cudamem, such as cudamem.NumbaManager, belongs to "
                 "numba's contexts)",
                 Py_TYPE(ctx->memory_manager)->tp_name, ctx->device->id);
}

PyObject *
cm_mm_plugin_alloc(cm_context *ctx, size_t size, CUdeviceptr *out)
{
    const cm_context *outer = cm_plugin_calling;
    uintptr_t addr = 0;
    PyObject *mp;

    if (outer == ctx) {
        cm_plugin_loop_error(ctx);
        return NULL;
    }
    /* A Python plugin: its users pay for the calls, and for counting
     * what it hands out against the limit. */
    if (cm_mm_prepare(ctx) < 0
        || cm_limit_plugin_take(ctx, size, "memalloc", 0) < 0) {
        return NULL;
    }
    cm_plugin_calling = ctx;
    mp = PyObject_CallMethod(ctx->memory_manager, "memalloc", "n",
                             (Py_ssize_t)size);
    cm_plugin_calling = outer;
    if (mp == NULL || cm_pointer_attr(mp, "device_pointer", &addr) < 0) {
        Py_XDECREF(mp);
        cm_limit_give(ctx, size);
        return NULL;
    }
    cm_limit_plugin_track(ctx, mp, size);
    *out = (CUdeviceptr)addr;
    return mp;
}
