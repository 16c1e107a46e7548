/* SPDX-License-Identifier: MIT */
/*
 * ixcode.h: the element code of advanced indexing (gather.c), written
 * once and used twice, as convert.h is: compiled here for the
 * simulator's host functions, and handed as source text
 * (cm_ixcode_src) to NVRTC for the device kernels, so both backends
 * index alike.
 *
 * The code sits inside CM_IXCODE(...): no preprocessor directives, only
 * constructs that are both C11 and CUDA C++.  Two names come from
 * outside: CM_FN ("static inline" on the host, "__device__ static
 * inline" in kernels) and CM_IX_FLAG(err, axis, value), which records
 * the first out-of-range index (plain stores on the host, where one
 * thread runs it; atomicCAS on the device).
 *
 * One element of an indexing operation: the iteration space is the
 * result's shape; its dimensions [bpos, bpos + nb) are those of the
 * broadcast index arrays, the others walk the array (as) and the other
 * side (os: the result of a read, the value of an assignment).  Each
 * index source adds to the array's offset (an integer index of any
 * width, bounds-checked against its axis, negative counting from the
 * end; or an int64 byte offset computed and checked on the host), or,
 * for assignments whose index positions were reduced to a list, to the
 * other side's offset.  A bad index skips its element and is flagged:
 * never an access outside the array.
 */
#ifndef CM_IXCODE_H
#define CM_IXCODE_H

#define CM_IXCODE(...)                                                 \
    static const char cm_ixcode_src[] = #__VA_ARGS__;                  \
    __VA_ARGS__

CM_IXCODE(
/* One index source (an index array, broadcast over the B dims). */
typedef struct {
    const unsigned char *p;  /* its element at B position (0, ..., 0) */
    long long len;           /* extent of the axis it indexes (raw) */
    long long astride;       /* byte stride of that axis (raw) */
    long long st[16];        /* byte strides over the B dims */
    int type;                /* 1..8: integers (CM_T_I8..CM_T_U64);
                              * 20: byte offsets into the array;
                              * 21: byte offsets into the other side */
    int axis;                /* the array axis, for the error report */
} cm_ixsrc;

/* One indexing operation. */
typedef struct {
    long long n;             /* elements of the iteration space */
    int ndim;                /* its dimensions (at most 32) */
    int nsrc;                /* index sources (at most 8) */
    int bpos;                /* first B dimension */
    int nb;                  /* B dimensions (at most 16) */
    int unit;                /* bytes moved at a time: 1, 2, 4 or 8 */
    int nunits;              /* units per element */
    int scatter;             /* 1: array <- other; 0: other <- array */
    int pad;
    long long shape[32];     /* extents */
    long long as[32];        /* array byte strides (0 on B dims) */
    long long os[32];        /* other side's byte strides */
    cm_ixsrc src[8];
} cm_ixdesc;

/* A boolean mask's nonzero elements, in C order, as byte offsets into
 * the array it indexes: the mask is walked in chunks of `chunk`
 * elements, one per thread. */
typedef struct {
    long long n;             /* mask elements */
    long long chunk;         /* elements per chunk */
    long long nchunks;       /* chunks */
    int ndim;                /* mask dimensions (at most 32) */
    int pad;
    long long shape[32];     /* its extents */
    long long ms[32];        /* its byte strides */
    long long as[32];        /* the byte strides of the axes it indexes */
} cm_ixmdesc;

/* An index element of a source, widened; *bad: it cannot be an index
 * (an unsigned value beyond the signed range). */
CM_FN long long
cm_ix_load(const unsigned char *q, int type, int *bad)
{
    *bad = 0;
    switch (type) {
    case 1: return (long long)*(const signed char *)q;
    case 2: return (long long)*(const unsigned char *)q;
    case 3: return (long long)*(const short *)q;
    case 4: return (long long)*(const unsigned short *)q;
    case 5: return (long long)*(const int *)q;
    case 6: return (long long)*(const unsigned int *)q;
    case 8:
        if (*(const unsigned long long *)q > 9223372036854775807ULL) {
            *bad = 1;
            return 0;
        }
        return (long long)*(const unsigned long long *)q;
    default: return *(const long long *)q;
    }
}

/* Move one element: nunits units of unit bytes. */
CM_FN void
cm_ix_move(unsigned char *dst, const unsigned char *src, int unit,
           int nunits)
{
    int u;

    for (u = 0; u < nunits; u++) {
        switch (unit) {
        case 1:
            dst[u] = src[u];
            break;
        case 2:
            ((unsigned short *)dst)[u] = ((const unsigned short *)src)[u];
            break;
        case 4:
            ((unsigned int *)dst)[u] = ((const unsigned int *)src)[u];
            break;
        default:
            ((unsigned long long *)dst)[u] =
                ((const unsigned long long *)src)[u];
            break;
        }
    }
}

/* Element i of operation d between the array (its element
 * (0, ..., 0) after the integer indices at arr) and the other side. */
CM_FN void
cm_ix_element(unsigned char *arr, unsigned char *other,
              unsigned long long *err, const cm_ixdesc *d, long long i)
{
    long long soff[8];
    long long rem = i;
    long long aoff = 0;
    long long ooff = 0;
    long long ix;
    long long v;
    int bad;
    int j;
    int k;
    int kb;

    for (j = 0; j < d->nsrc; j++) {
        soff[j] = 0;
    }
    for (k = d->ndim - 1; k >= 0; k--) {
        ix = rem % d->shape[k];
        rem /= d->shape[k];
        aoff += ix * d->as[k];
        ooff += ix * d->os[k];
        kb = k - d->bpos;
        if (kb >= 0 && kb < d->nb) {
            for (j = 0; j < d->nsrc; j++) {
                soff[j] += ix * d->src[j].st[kb];
            }
        }
    }
    for (j = 0; j < d->nsrc; j++) {
        const cm_ixsrc *s = &d->src[j];

        v = cm_ix_load(s->p + soff[j], s->type, &bad);
        if (s->type == 20) {
            aoff += v;
            continue;
        }
        if (s->type == 21) {
            ooff += v;
            continue;
        }
        if (!bad && v < 0) {
            v += s->len;
            bad = v < 0;
        }
        if (bad || v >= s->len) {
            if (err != 0) {
                CM_IX_FLAG(err, s->axis + 1,
                           cm_ix_load(s->p + soff[j], s->type, &bad));
            }
            return;
        }
        aoff += v * s->astride;
    }
    if (d->scatter) {
        cm_ix_move(arr + aoff, other + ooff, d->unit, d->nunits);
    }
    else {
        cm_ix_move(other + ooff, arr + aoff, d->unit, d->nunits);
    }
}

/* The multi-index of element e of the mask (C order) into ix[]. */
CM_FN void
cm_ixm_unravel(const cm_ixmdesc *m, long long e, long long *ix)
{
    int k;

    for (k = m->ndim - 1; k >= 0; k--) {
        ix[k] = e % m->shape[k];
        e /= m->shape[k];
    }
}

/* The nonzero elements in chunk c of the mask. */
CM_FN long long
cm_ixm_count_chunk(const unsigned char *mask, const cm_ixmdesc *m,
                   long long c)
{
    long long ix[32];
    long long e = c * m->chunk;
    long long end = e + m->chunk < m->n ? e + m->chunk : m->n;
    long long moff = 0;
    long long count = 0;
    int k;

    cm_ixm_unravel(m, e, ix);
    for (k = 0; k < m->ndim; k++) {
        moff += ix[k] * m->ms[k];
    }
    for (; e < end; e++) {
        count += mask[moff] != 0;
        for (k = m->ndim - 1; k >= 0; k--) {
            if (++ix[k] < m->shape[k]) {
                moff += m->ms[k];
                break;
            }
            moff -= (m->shape[k] - 1) * m->ms[k];
            ix[k] = 0;
        }
    }
    return count;
}

/* Write the byte offsets of chunk c's nonzero elements from out[pos]. */
CM_FN void
cm_ixm_write_chunk(const unsigned char *mask, const cm_ixmdesc *m,
                   long long c, long long pos, long long *out)
{
    long long ix[32];
    long long e = c * m->chunk;
    long long end = e + m->chunk < m->n ? e + m->chunk : m->n;
    long long moff = 0;
    long long aoff = 0;
    int k;

    cm_ixm_unravel(m, e, ix);
    for (k = 0; k < m->ndim; k++) {
        moff += ix[k] * m->ms[k];
        aoff += ix[k] * m->as[k];
    }
    for (; e < end; e++) {
        if (mask[moff] != 0) {
            out[pos++] = aoff;
        }
        for (k = m->ndim - 1; k >= 0; k--) {
            if (++ix[k] < m->shape[k]) {
                moff += m->ms[k];
                aoff += m->as[k];
                break;
            }
            moff -= (m->shape[k] - 1) * m->ms[k];
            aoff -= (m->shape[k] - 1) * m->as[k];
            ix[k] = 0;
        }
    }
}
)

#endif /* CM_IXCODE_H */
