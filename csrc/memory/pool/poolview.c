/* SPDX-License-Identifier: MIT */
/*
 * memory/pool/poolview.c: the pool manager's segments as Python sees them
 * (cm_pool_segments: _core._pool_segments, the snapshot of
 * cudamem/_history.py and memviz): every segment of its pool and of the
 * peers' pool beside it, with its blocks and, for an arena of virtual
 * memory, the runs of pages mapped.
 *
 * Locks and the GIL: each pool's mutex is taken through cm_pool_lock
 * (memory/pool/pool.h) only to copy the segments and blocks out into
 * plain arrays; the Python objects are made after it is let go, with the
 * GIL held.  No driver call.
 */
#include "memory/pool/pool.h"
#include "memory/pool/vmm/vmm.h"

#include <stdlib.h>

/* One block as cm_pool_segments copies it out (mutex held). */
typedef struct {
    int seg;              /* index of its segment */
    CUdeviceptr ptr;
    size_t size;
    int state;            /* 0 used, 1 free, 2 pending */
} cm_blk_view;

/* The runs of pages of arena a with memory mapped, as [lo, hi) address
 * pairs in a malloc'd array (*out, NULL when none or out of memory;
 * mutex held). */
static void
cm_pool_mapped_runs(const cm_pool *p, const cm_arena *a, CUdeviceptr **out,
                    size_t *n)
{
    CUdeviceptr *r = NULL;
    CUdeviceptr *t;
    size_t cap = 0;
    size_t i = 0;
    size_t j;

    *out = NULL;
    *n = 0;
    while (i < a->npages) {
        if (a->h[i] == 0) {
            i++;
            continue;
        }
        for (j = i; j < a->npages && a->h[j] != 0; j++) {
        }
        if (*n == cap) {
            cap = cap ? cap * 2 : 8;
            t = realloc(r, 2 * cap * sizeof(*r));
            if (t == NULL) {
                free(r);
                *n = 0;
                return;
            }
            r = t;
        }
        r[2 * *n] = a->base + ((CUdeviceptr)i << p->gshift);
        r[2 * *n + 1] = a->base + ((CUdeviceptr)j << p->gshift);
        (*n)++;
        i = j;
    }
    *out = r;
}

static void
cm_segs_view_free(cm_blk_view *v, CUdeviceptr *base, size_t *size,
                  int *small, CUdeviceptr **runs, size_t *nruns, size_t ns)
{
    size_t i;

    for (i = 0; runs != NULL && i < ns; i++) {
        free(runs[i]);
    }
    free(runs);
    free(nruns);
    free(v);
    free(base);
    free(size);
    free(small);
}

/* Append pool p's segments to list; 0, or -1 with an exception. */
static int
cm_pool_segments_one(cm_pool *p, PyObject *list)
{
    static const char *const states[] = {"used", "free", "pending"};
    cm_blk_view *v = NULL;
    CUdeviceptr *base = NULL;
    size_t *size = NULL;
    int *small = NULL;
    CUdeviceptr **runs = NULL;   /* per arena segment: mapped [lo, hi) */
    size_t *nruns = NULL;
    size_t nb = 0;
    size_t nt;
    size_t ns = 0;
    size_t i;
    cm_seg *g;
    cm_blk *b;
    PyObject *blocks = NULL;
    cm_gil_saved gd;

    if (p == NULL || p->dead || p->kind != CM_MM_POOL) {
        return 0;
    }
    /* Copied out under the mutex, turned into objects after it. */
    cm_pool_lock(p, &gd);
    for (g = p->segs; g != NULL; g = g->next) {
        ns++;
        for (b = g->first; b != NULL; b = b->next) {
            nb++;
        }
    }
    v = malloc((nb > 0 ? nb : 1) * sizeof(*v));
    base = malloc((ns > 0 ? ns : 1) * sizeof(*base));
    size = malloc((ns > 0 ? ns : 1) * sizeof(*size));
    small = malloc((ns > 0 ? ns : 1) * sizeof(*small));
    runs = calloc(ns > 0 ? ns : 1, sizeof(*runs));
    nruns = calloc(ns > 0 ? ns : 1, sizeof(*nruns));
    if (v != NULL && base != NULL && size != NULL && small != NULL
        && runs != NULL && nruns != NULL) {
        nb = 0;
        ns = 0;
        for (g = p->segs; g != NULL; g = g->next, ns++) {
            base[ns] = g->base;
            size[ns] = g->size;
            small[ns] = g->small;
            if (g->arena != NULL) {
                cm_pool_mapped_runs(p, g->arena, &runs[ns], &nruns[ns]);
            }
            for (b = g->first; b != NULL; b = b->next, nb++) {
                v[nb].seg = (int)ns;
                v[nb].ptr = b->ptr;
                v[nb].size = b->size;
                v[nb].state = b->free ? 1 : b->pending ? 2 : 0;
            }
        }
    }
    cm_pool_unlock(p, &gd);
    if (v == NULL || base == NULL || size == NULL || small == NULL
        || runs == NULL || nruns == NULL) {
        PyErr_NoMemory();
        goto err_free;
    }
    nt = nb;
    for (i = 0, nb = 0; i < ns; i++) {
        PyObject *d;
        int r;

        blocks = PyList_New(0);
        if (blocks == NULL) {
            goto err_free;
        }
        for (; nb < nt && v[nb].seg == (int)i; nb++) {
            PyObject *t = Py_BuildValue("(Kns)",
                                        (unsigned long long)v[nb].ptr,
                                        (Py_ssize_t)v[nb].size,
                                        states[v[nb].state]);

            if (t == NULL || PyList_Append(blocks, t) < 0) {
                Py_XDECREF(t);
                goto err_free;
            }
            Py_DECREF(t);
        }
        d = Py_BuildValue("{sKsnsOsOsO}", "base",
                          (unsigned long long)base[i], "size",
                          (Py_ssize_t)size[i], "small",
                          small[i] ? Py_True : Py_False, "blocks", blocks,
                          "peers", p->twin != NULL && p->peers == NULL
                                       ? Py_True : Py_False);
        Py_CLEAR(blocks);
        if (d != NULL && p->vmm) {
            /* An arena: the runs of pages with memory mapped. */
            PyObject *m = PyList_New(0);
            size_t k;

            for (k = 0; m != NULL && k < nruns[i]; k++) {
                PyObject *t = Py_BuildValue(
                    "(KK)", (unsigned long long)runs[i][2 * k],
                    (unsigned long long)runs[i][2 * k + 1]);

                if (t == NULL || PyList_Append(m, t) < 0) {
                    Py_CLEAR(m);
                }
                Py_XDECREF(t);
            }
            PyObject *ps = PyLong_FromSize_t((size_t)1 << p->gshift);

            if (m == NULL || ps == NULL
                || PyDict_SetItemString(d, "mapped", m) < 0
                || PyDict_SetItemString(d, "page_size", ps) < 0) {
                Py_CLEAR(d);
            }
            Py_XDECREF(m);
            Py_XDECREF(ps);
        }
        r = d == NULL ? -1 : PyList_Append(list, d);
        Py_XDECREF(d);
        if (r < 0) {
            goto err_free;
        }
    }
    cm_segs_view_free(v, base, size, small, runs, nruns, ns);
    return 0;
err_free:
    Py_XDECREF(blocks);
    cm_segs_view_free(v, base, size, small, runs, nruns, ns);
    return -1;
}

PyObject *
cm_pool_segments(cm_context *ctx)
{
    cm_pool *p = ctx->pool;
    PyObject *list = PyList_New(0);

    if (list == NULL) {
        return NULL;
    }
    if (cm_pool_segments_one(p, list) < 0
        || (p != NULL && p->peers != NULL
            && cm_pool_segments_one(p->peers, list) < 0)) {
        Py_DECREF(list);
        return NULL;
    }
    return list;
}
