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
 * the array it indexes: the mask is walked in chunks of `chunk` (4096)
 * elements, a block of 256 threads a chunk and 16 elements a thread. */
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

/* The byte offsets of mask element e (C order) into the mask (*mo) and
 * into the array it indexes (*ao).  No division when the mask is one
 * dimension (cm_ix_mask_body merges the axes that step evenly). */
CM_FN void
cm_ixm_offsets(const cm_ixmdesc *m, long long e, long long *mo,
               long long *ao)
{
    long long q;
    long long ix;
    long long a = 0;
    long long b = 0;
    int k;

    for (k = m->ndim - 1; k > 0; k--) {
        q = e / m->shape[k];
        ix = e - q * m->shape[k];
        a += ix * m->ms[k];
        b += ix * m->as[k];
        e = q;
    }
    *mo = a + e * m->ms[0];
    *ao = b + e * m->as[0];
}

/* The nonzero flags of the 16 mask elements from e0 (a thread's share of
 * a chunk): bit i for element e0 + i, none past the mask's end. */
CM_FN unsigned int
cm_ixm_bits(const unsigned char *mask, const cm_ixmdesc *m, long long e0)
{
    unsigned int bits = 0;
    long long mo;
    long long ao;
    int i;

    for (i = 0; i < 16 && e0 + i < m->n; i++) {
        cm_ixm_offsets(m, e0 + i, &mo, &ao);
        if (mask[mo] != 0) {
            bits |= 1u << i;
        }
    }
    return bits;
}

/* Write the array byte offsets of the elements flagged in bits (from
 * cm_ixm_bits at e0) in order from out[pos]. */
CM_FN void
cm_ixm_put(long long *out, long long pos, unsigned int bits,
           const cm_ixmdesc *m, long long e0)
{
    long long mo;
    long long ao;
    int i;

    for (i = 0; i < 16; i++) {
        if ((bits >> i) & 1u) {
            cm_ixm_offsets(m, e0 + i, &mo, &ao);
            out[pos++] = ao;
        }
    }
}
)

#endif /* CM_IXCODE_H */
