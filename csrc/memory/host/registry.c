/* SPDX-License-Identifier: MIT */
/*
 * memory/host/registry.c: the registry of the host ranges cudamem registered
 * with the driver (pinned() / mapped()), which the staging pipeline asks
 * whether host memory is already page-locked.
 */
#include "memory/host/host.h"

#include <errno.h>
#include <signal.h>
#include <string.h>
#include <strings.h>
#include <sys/mman.h>
#include <unistd.h>


/* Registered memory is portable (the registry is process-wide) and
 * mapped (mapped() and pinned() share pieces). */
#define CM_REG_FLAGS (CU_MEMHOSTREGISTER_PORTABLE \
                      | CU_MEMHOSTREGISTER_DEVICEMAP)

/* NOTE: the pieces, sorted and disjoint, and their byte total are
 * guarded by cm_reg_lock, which is taken only with the GIL released. */
cm_piece *cm_pieces;
size_t cm_reg_bytes;
PyThread_type_lock cm_reg_lock;

static int
cm_held_reserve(cm_held *h)
{
    cm_piece **v;
    Py_ssize_t cap;

    if (h->n < h->cap) {
        return 0;
    }
    cap = h->cap ? 2 * h->cap : 8;
    v = PyMem_RawRealloc(h->v, (size_t)cap * sizeof(*v));
    if (v == NULL) {
        return -1;
    }
    h->v = v;
    h->cap = cap;
    return 0;
}

/* Drop h's pieces, newest first; unregister those left without users
 * (only when driver is set: a dead context took them already).  Lock
 * held, no GIL, the context current.  The first error. */
CUresult
cm_reg_release_locked(cm_held *h, int driver)
{
    CUresult first = CUDA_SUCCESS;

    while (h->n > 0) {
        cm_piece *p = h->v[--h->n];
        cm_piece **link = &cm_pieces;

        if (--p->users > 0) {
            continue;
        }
        while (*link != p) {
            link = &(*link)->next;
        }
        *link = p->next;
        cm_reg_bytes -= p->hi - p->lo;
        if (driver) {
            CUresult rc = CM_CU_RAW(MemHostUnregister, ((void *)p->lo));

            if (first == CUDA_SUCCESS) {
                first = rc;
            }
        }
        PyMem_RawFree(p);
    }
    return first;
}

/* Hold pieces covering [lo, hi), registering the gaps between existing
 * pieces.  Lock held, no GIL, the context current. */
CUresult
cm_reg_acquire_locked(uintptr_t lo, uintptr_t hi, cm_held *h)
{
    cm_piece **link = &cm_pieces;
    uintptr_t cur = lo;

    while (cur < hi) {
        cm_piece *p;
        cm_piece *np;
        uintptr_t end;
        CUresult rc;

        while (*link != NULL && (*link)->hi <= cur) {
            link = &(*link)->next;
        }
        p = *link;
        if (cm_held_reserve(h) < 0) {
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
        if (p != NULL && p->lo <= cur) {
            p->users++;
            h->v[h->n++] = p;
            cur = p->hi;
            link = &p->next;
            continue;
        }
        end = (p != NULL && p->lo < hi) ? p->lo : hi;
        np = PyMem_RawMalloc(sizeof(*np));
        if (np == NULL) {
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
        rc = CM_CU_RAW(MemHostRegister, ((void *)cur, (size_t)(end - cur),
                                         CM_REG_FLAGS));
        if (rc != CUDA_SUCCESS) {
            PyMem_RawFree(np);
            return rc;
        }
        np->lo = cur;
        np->hi = end;
        np->users = 1;
        np->next = p;
        *link = np;
        cm_reg_bytes += end - cur;
        h->v[h->n++] = np;
        link = &np->next;
        cur = end;
    }
    return CUDA_SUCCESS;
}
