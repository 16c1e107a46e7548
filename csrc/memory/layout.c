/* SPDX-License-Identifier: MIT */
/*
 * memory/layout.c: the layout math of strided views (contiguity, byte
 * span, orders, compact strides), shared by device arrays, the
 * host-backed arrays and the registration of host arrays.  Pure
 * functions: no Python object, no driver call.
 */
#include "memory/memory.h"

#include <numpy/arrayscalars.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

/* ------------------------------------------------------------------ */
/* Layout math                                                         */
/* ------------------------------------------------------------------ */

void
cm_layout_flags(int ndim, const Py_ssize_t *shape,
                const Py_ssize_t *strides, Py_ssize_t itemsize,
                int *c_contig, int *f_contig)
{
    Py_ssize_t sd;
    int i;
    int c = 1;
    int f = 1;

    for (i = 0; i < ndim; i++) {
        if (shape[i] == 0) {
            *c_contig = 1;
            *f_contig = 1;
            return;
        }
    }
    sd = itemsize;
    for (i = ndim - 1; i >= 0; i--) {
        if (shape[i] != 1) {
            if (strides[i] != sd) {
                c = 0;
            }
            sd *= shape[i];
        }
    }
    sd = itemsize;
    for (i = 0; i < ndim; i++) {
        if (shape[i] != 1) {
            if (strides[i] != sd) {
                f = 0;
            }
            sd *= shape[i];
        }
    }
    *c_contig = c;
    *f_contig = f;
}

Py_ssize_t
cm_layout_span(int ndim, const Py_ssize_t *shape, const Py_ssize_t *strides,
               Py_ssize_t itemsize, Py_ssize_t *lo)
{
    Py_ssize_t low = 0;
    Py_ssize_t high = 0;
    int i;

    *lo = 0;
    for (i = 0; i < ndim; i++) {
        if (shape[i] == 0) {
            return 0;
        }
    }
    for (i = 0; i < ndim; i++) {
        Py_ssize_t reach = (shape[i] - 1) * strides[i];

        if (reach < 0) {
            low += reach;
        }
        else {
            high += reach;
        }
    }
    *lo = low;
    return high - low + itemsize;
}

/* Whether the layout without its zero-stride dimensions (the "core") is
 * C- or F-contiguous. */
int
cm_layout_core_contiguous(int ndim, const Py_ssize_t *shape,
                          const Py_ssize_t *strides, Py_ssize_t itemsize,
                          int *c_out, int *f_out)
{
    Py_ssize_t sh[NPY_MAXDIMS];
    Py_ssize_t st[NPY_MAXDIMS];
    int n = 0;
    int i;
    int c;
    int f;

    for (i = 0; i < ndim; i++) {
        if (strides[i] != 0 || shape[i] == 0) {
            sh[n] = shape[i];
            st[n] = strides[i];
            n++;
        }
    }
    if (n == 0) {
        c = f = 1;                       /* no core: both */
    }
    else {
        cm_layout_flags(n, sh, st, itemsize, &c, &f);
    }
    if (c_out != NULL) {
        *c_out = c;
    }
    if (f_out != NULL) {
        *f_out = f;
    }
    return c || f;
}

/* Compact strides for shape in C (fortran = 0) or F order. */
void
cm_layout_compact(int ndim, const Py_ssize_t *shape, Py_ssize_t itemsize,
                  int fortran, Py_ssize_t *strides)
{
    Py_ssize_t sd = itemsize;
    int i;

    if (fortran) {
        for (i = 0; i < ndim; i++) {
            strides[i] = sd;
            sd *= shape[i] > 0 ? shape[i] : 1;
        }
    }
    else {
        for (i = ndim - 1; i >= 0; i--) {
            strides[i] = sd;
            sd *= shape[i] > 0 ? shape[i] : 1;
        }
    }
}

/* Dimension indices ordered by descending |stride| (stable): the
 * keep-order permutation of NumPy's empty_like. */
void
cm_layout_order(int ndim, const Py_ssize_t *strides, int *perm)
{
    int i;
    int j;

    for (i = 0; i < ndim; i++) {
        perm[i] = i;
    }
    for (i = 1; i < ndim; i++) {
        int p = perm[i];
        Py_ssize_t a = strides[p] < 0 ? -strides[p] : strides[p];

        for (j = i; j > 0; j--) {
            Py_ssize_t b = strides[perm[j - 1]];

            b = b < 0 ? -b : b;
            if (b >= a) {
                break;
            }
            perm[j] = perm[j - 1];
        }
        perm[j] = p;
    }
}

/* Compact strides following key's dimension order and signs; zero where
 * key has a zero stride.  Returns the bytes needed and, in *first, the
 * offset of the first logical element in such a buffer. */
Py_ssize_t
cm_layout_compact_like(int ndim, const Py_ssize_t *shape,
                       const Py_ssize_t *key, Py_ssize_t itemsize,
                       Py_ssize_t *strides, Py_ssize_t *first)
{
    int perm[NPY_MAXDIMS];
    Py_ssize_t sd = itemsize;
    int i;

    *first = 0;
    cm_layout_order(ndim, key, perm);
    for (i = ndim - 1; i >= 0; i--) {
        int d = perm[i];

        if (key[d] == 0 || shape[d] == 1) {
            strides[d] = 0;
            continue;
        }
        strides[d] = key[d] < 0 ? -sd : sd;
        if (key[d] < 0) {
            *first += (shape[d] - 1) * sd;
        }
        sd *= shape[d];
    }
    return sd;
}
