/* SPDX-License-Identifier: MIT */
/*
 * sim/primary.c: the simulator's primary contexts (retain, release,
 * reset, state) and the current context of a thread.
 *
 * Locks and the GIL: every entry point takes sim.lock after SIM_ENTER and
 * gives it back before returning; no other lock.  Destroying a context
 * (cuDevicePrimaryCtxRelease of the last retain, cuDevicePrimaryCtxReset)
 * waits for all queued work with sim_drain, and cuCtxSynchronize for its
 * context's, each releasing sim.lock on sim.cond (refused on a
 * worker).  The per-thread context stack is thread-local and read or
 * changed without the lock.  The GIL is never taken nor given up here.
 */
#include "driver/cu_table.h"
#include "sim/sim.h"

#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

/* ------------------------------------------------------------------ */
/* Primary contexts                                                    */
/* ------------------------------------------------------------------ */

/* Destroy dev's primary context: drain it, then free everything it
 * owns.  The struct stays, marked destroyed. */
CUresult
sim_ctx_destroy(int dev)
{
    sim_ctx *c = sim.dev[dev].primary, *o;
    sim_stream *s, *next;
    sim_event *e;
    sim_alloc *a;
    size_t i, j;
    int d;

    if (c == NULL) {
        return CUDA_SUCCESS;
    }
    if (tls_worker != NULL) {
        return CUDA_ERROR_NOT_PERMITTED;
    }
    c->destroyed = 1;
    sim_capture_drop_ctx(c);
    sim.dev[dev].primary = NULL;
    c->next_dead = sim.dead;
    sim.dead = c;
    for (d = 0; d < sim.ndev; d++) {
        o = sim.dev[d].primary;
        if (o != NULL) {
            o->peers &= ~(1u << dev);
        }
    }
    /* Nothing new may use its memory or events from now on. */
    for (i = 0; i < sim.nallocs; i++) {
        a = sim.allocs[i];
        if (a->ctx == c && a->dying == SIM_DYING_NO) {
            a->dying = SIM_DYING_CTX;
        }
    }
    for (i = j = 0; i < sim.events.n; i++) {
        e = (sim_event *)sim.events.v[i];
        if (e->ctx == c) {
            e->destroyed = 1;
            sim_event_unref(e);
        }
        else {
            sim.events.v[j++] = sim.events.v[i];
        }
    }
    sim.events.n = j;
    /* Work elsewhere may still read its memory: wait for all of it. */
    sim_drain(NULL);
    for (s = c->streams; s != NULL; s = next) {
        next = s->next;
        sim_stream_destroy(s);
    }
    c->legacy = NULL;
    for (i = j = 0; i < sim.nallocs; i++) {
        a = sim.allocs[i];
        if (a->ctx == c && a->dying == SIM_DYING_CTX) {
            sim_alloc_release(a);
        }
        else {
            sim.allocs[j++] = a;
        }
    }
    sim.nallocs = j;
    sim_mempool_drop_ctx(dev, c);
    return CUDA_SUCCESS;
}

CUresult
sim_DevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev)
{
    sim_device *d;

    SIM_ENTER(DevicePrimaryCtxRetain);
    if (pctx == NULL) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    if (!sim_dev_ok(dev)) {
        return CUDA_ERROR_INVALID_DEVICE;
    }
    sim_lock();
    d = &sim.dev[dev];
    if (d->primary == NULL) {
        d->primary = calloc(1, sizeof(sim_ctx));
        if (d->primary == NULL) {
            sim_unlock();
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
        d->primary->dev = dev;
        d->last = d->primary;
    }
    d->retains++;
    *pctx = sim_ctx_handle(d->primary);
    sim_unlock();
    return CUDA_SUCCESS;
}

CUresult
sim_DevicePrimaryCtxRelease(CUdevice dev)
{
    sim_device *d;
    CUresult rc = CUDA_SUCCESS;

    SIM_ENTER(DevicePrimaryCtxRelease);
    if (!sim_dev_ok(dev)) {
        return CUDA_ERROR_INVALID_DEVICE;
    }
    sim_lock();
    d = &sim.dev[dev];
    if (d->retains == 0) {
        rc = CUDA_ERROR_INVALID_CONTEXT;
    }
    else if (d->retains == 1 && d->primary != NULL && tls_worker != NULL) {
        rc = CUDA_ERROR_NOT_PERMITTED;
    }
    else if (--d->retains == 0) {
        rc = sim_ctx_destroy(dev);
    }
    sim_unlock();
    return rc;
}

CUresult
sim_DevicePrimaryCtxReset(CUdevice dev)
{
    CUresult rc;

    SIM_ENTER(DevicePrimaryCtxReset);
    if (!sim_dev_ok(dev)) {
        return CUDA_ERROR_INVALID_DEVICE;
    }
    sim_lock();
    rc = sim_ctx_destroy(dev);
    sim_unlock();
    return rc;
}

CUresult
sim_DevicePrimaryCtxGetState(CUdevice dev, unsigned int *flags, int *active)
{
    SIM_ENTER(DevicePrimaryCtxGetState);
    if (!sim_dev_ok(dev)) {
        return CUDA_ERROR_INVALID_DEVICE;
    }
    if (flags == NULL || active == NULL) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    sim_lock();
    *flags = sim.dev[dev].flags;
    *active = sim.dev[dev].primary != NULL;
    sim_unlock();
    return CUDA_SUCCESS;
}

CUresult
sim_CtxGetCurrent(CUcontext *pctx)
{
    SIM_ENTER(CtxGetCurrent);
    if (pctx == NULL) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    *pctx = tls != NULL && tls->n > 0 ? tls->stack[tls->n - 1] : NULL;
    return CUDA_SUCCESS;
}

/* Push c on this thread's stack, or replace the top if replace. */
static CUresult
sim_stack_put(CUcontext h, int replace)
{
    sim_tls *t;
    CUresult rc;

    sim_lock();
    rc = sim_ctx_check(h);
    sim_unlock();
    if (rc != CUDA_SUCCESS) {
        return rc;
    }
    t = sim_tls_get();
    if (t == NULL) {
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    if (replace && t->n > 0) {
        t->stack[t->n - 1] = h;
        return CUDA_SUCCESS;
    }
    if (t->n == t->cap) {
        size_t cap = t->cap ? t->cap * 2 : 8;
        CUcontext *v = realloc(t->stack, cap * sizeof(*v));
        if (v == NULL) {
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
        t->stack = v;
        t->cap = cap;
    }
    t->stack[t->n++] = h;
    return CUDA_SUCCESS;
}

CUresult
sim_CtxSetCurrent(CUcontext ctx)
{
    SIM_ENTER(CtxSetCurrent);
    if (ctx == NULL) {
        if (tls != NULL && tls->n > 0) {
            tls->n--;
        }
        return CUDA_SUCCESS;
    }
    return sim_stack_put(ctx, 1);
}

CUresult
sim_CtxPushCurrent(CUcontext ctx)
{
    SIM_ENTER(CtxPushCurrent);
    if (ctx == NULL) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    return sim_stack_put(ctx, 0);
}

CUresult
sim_CtxPopCurrent(CUcontext *pctx)
{
    SIM_ENTER(CtxPopCurrent);
    if (tls == NULL || tls->n == 0) {
        return CUDA_ERROR_INVALID_CONTEXT;
    }
    tls->n--;
    if (pctx != NULL) {
        *pctx = tls->stack[tls->n];
    }
    return CUDA_SUCCESS;
}

CUresult
sim_CtxGetDevice(CUdevice *device)
{
    sim_ctx *c;
    CUresult rc;

    SIM_ENTER(CtxGetDevice);
    if (device == NULL) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    sim_lock();
    rc = sim_current(&c);
    if (rc == CUDA_SUCCESS) {
        *device = c->dev;
    }
    sim_unlock();
    return rc;
}

CUresult
sim_CtxSynchronize(void)
{
    sim_ctx *c;
    CUresult rc;

    SIM_ENTER(CtxSynchronize);
    sim_lock();
    rc = sim_current(&c);
    if (rc == CUDA_SUCCESS) {
        rc = sim_capture_ctx_sync(c);
    }
    if (rc == CUDA_SUCCESS) {
        rc = sim_drain(c);
    }
    if (rc == CUDA_SUCCESS) {
        sim_mempools_settle();
    }
    sim_unlock();
    return rc;
}

CUresult
sim_CtxEnablePeerAccess(CUcontext peerContext, unsigned int Flags)
{
    sim_ctx *c, *peer;
    CUresult rc;

    SIM_ENTER(CtxEnablePeerAccess);
    if (Flags != 0) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    sim_lock();
    rc = sim_current(&c);
    if (rc == CUDA_SUCCESS) {
        rc = sim_ctx_check(peerContext);
    }
    if (rc == CUDA_SUCCESS) {
        peer = sim_ctx_of(peerContext);
        if (peer->dev == c->dev) {
            rc = CUDA_ERROR_INVALID_DEVICE;
        }
        else if (sim.no_peer[c->dev] & (1u << peer->dev)) {
            rc = CUDA_ERROR_PEER_ACCESS_UNSUPPORTED;
        }
        else if (c->peers & (1u << peer->dev)) {
            rc = CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED;
        }
        else {
            c->peers |= 1u << peer->dev;
        }
    }
    sim_unlock();
    return rc;
}
