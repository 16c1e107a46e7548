/* SPDX-License-Identifier: MIT */
/*
 * memory/staging/staging.c: the staged transfer pipeline for large copies
 * between pageable host memory and device memory.  Its tunables'
 * parsing, statistics and init are in stagecfg.c; what the two share is
 * in memory/staging/staging.h.
 *
 * A copy between a device range and pageable host memory above a size
 * threshold is cut into chunks.  Each chunk passes through one of a few
 * page-locked staging buffers: host to device, worker threads pack the
 * chunk's elements into the buffer (any host layout) and the calling
 * thread issues the buffer's copy to the device on the stream and records
 * the buffer's event; chunk i+1 is packed while chunk i is in flight.
 * Device to host is the mirror: the copy into the buffer is issued first,
 * and the workers unpack the chunk into the host array once the buffer's
 * event says it has arrived.  A buffer is refilled only after its event
 * completed.
 *
 * The pipeline runs in the calling thread, with the GIL released, and
 * returns once it is done with the host side: a synchronous copy issues
 * its chunks on the default stream, an asynchronous one on its stream S
 * (so they follow the work queued on S).  Device to host, every chunk has
 * then landed; host to device, into plain device memory of cudamem's
 * managers (cm_xfer.early), the copies of the last chunks may still run
 * on that stream, as the driver's own copies of pageable memory to the
 * device may leave their last DMA (docs/design.md, "Synchronous copies
 * of pageable memory"); a buffer whose copy may still run is marked
 * pending and waited for before its next use or its release.  The
 * driver's own asynchronous copies of pageable memory do not return
 * either before the host memory is consumed (host to device) or filled
 * (device to host).  An earlier design returned at once and held S with
 * a host function waiting for the pipeline; the driver forbids a host
 * function to wait on work not ordered before it, and on the H200 it
 * deadlocked.
 *
 * Owns: the tunables (CUDAMEM_STAGING, _THRESHOLD, _CHUNK, _BUFFERS,
 * _THREADS, _RAMP, _NT, _SPIN, _HUGE); the worker threads (made once,
 * grown on demand, never stopped) and their queue of host-side batches;
 * per device, a cache of page-locked staging buffers (huge-page memory
 * registered with the driver, or cuMemHostAlloc's), each with its own
 * event.
 *
 * Locks and the GIL: one mutex, cm_stg_mu (cm_mu_lock), guards the queue,
 * the caches and the counters, with two condition variables (work for
 * the workers, a batch's shares done).  No Python or driver call is made
 * and no other lock is taken while it is held.  The tunables are guarded
 * by the GIL and copied into each transfer before cm_staging_copy gives
 * up the GIL (CM_DRIVER_BEGIN_NOGIL) for the whole pipeline; the workers
 * are grown before, with it held.  The workers never hold the GIL and
 * make no driver calls; they read the transfer and the copies cm_nt_on
 * and cm_spin_ns.  The registry's lock (cm_stg_pinned) is taken without
 * cm_stg_mu.
 */
#include "memory/staging/staging.h"

#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <sys/mman.h>
#include <unistd.h>
#if defined(__x86_64__)
#include <emmintrin.h>
#endif

cm_stg_cfg cm_cfg = {
    1, (size_t)4 << 20, (size_t)8 << 20, 3, 8, (size_t)256 << 10, 0, 0, 0,
    1, (size_t)1 << 20,
};

/* Copies of cm_cfg.nt and cm_cfg.spin (nanoseconds) for the workers,
 * which run without the GIL; written under the GIL, read relaxed. */
int cm_nt_on;
long cm_spin_ns;

/* A transfer: the host side as a joint layout in the device side's
 * element order (the device side is one contiguous range). */
typedef struct cm_sjob {
    int htod;                 /* host to device, else device to host */
    int early;                /* host to device: return once the last
                               * chunk is issued (cm_xfer.early) */
    int ndim;                 /* >= 1 */
    Py_ssize_t shape[NPY_MAXDIMS];
    Py_ssize_t hs[NPY_MAXDIMS];  /* host strides, bytes */
    uintptr_t host;           /* host address of element 0 */
    CUdeviceptr dev;          /* device address of element 0 */
    size_t itemsize;
    size_t elems;             /* elements */
    size_t chunk_el;          /* elements of the largest chunk */
    size_t nchunks;
    size_t *bound;            /* chunk k is elements bound[k] to
                               * bound[k + 1] */
    size_t part_el;           /* smallest share of a chunk, elements */
    int nbuf;                 /* staging buffers used */
    int huge;                 /* new buffers on huge pages */
    cm_sbuf *buf[CM_STG_MAXBUF];
    CUstream stream;          /* where the chunks' copies go */
    CUcontext ctx;            /* the context current at the call */
    int devid;                /* its device's ordinal */
    unsigned long gen;        /* its generation */
    int unsure;               /* a buffer may still be in use by a copy */
    CUresult rc;              /* the first error */
    const char *fn;           /* the entry point that gave it */
    uint64_t ns_wait;         /* time in waits for a buffer's copy */
    uint64_t ns_stage;        /* time in host-side stages */
    uint64_t ns_issue;        /* time issuing copies and records */
} cm_sjob;

/* A host-side stage of one chunk, shared out among the workers. */
struct cm_batch {
    const cm_sjob *job;
    char *buf;                /* the chunk's staging buffer */
    size_t e0;                /* first element of the chunk */
    size_t n;                 /* elements */
    int pack;                 /* host to buffer, else buffer to host */
    int nparts;               /* shares */
    int next;                 /* NOTE: under cm_stg_mu: next share */
    int left;                 /* NOTE: under cm_stg_mu: shares running
                               * or not taken */
    struct cm_batch *qnext;   /* worker queue link */
};

/* NOTE: everything below is guarded by cm_stg_mu. */
pthread_mutex_t cm_stg_mu = PTHREAD_MUTEX_INITIALIZER;
pthread_cond_t cm_stg_work = PTHREAD_COND_INITIALIZER;
pthread_cond_t cm_stg_part_done = PTHREAD_COND_INITIALIZER;
cm_batch *cm_bq_head;          /* batches with shares to take */
cm_batch *cm_bq_tail;
int cm_bq_nonempty;            /* cm_bq_head != NULL, for polls */
int cm_workers;                /* worker threads made */
cm_scache cm_caches[CM_STG_DEVICES];
size_t cm_nlive;               /* buffers made and not freed */
size_t cm_live_bytes;          /* their bytes */
size_t cm_nfree_all;           /* of them, free in a cache */
size_t cm_inflight;            /* transfers running */
size_t cm_staged;              /* transfers staged, ever */
size_t cm_bounced;             /* copies through one buffer, ever */
/* Where the staged transfers' time went, summed (nanoseconds): waits
 * for a buffer's copy, host-side stages, issuing copies, and the whole
 * pipelines; and their chunks.  For the sweep and for diagnosis. */
uint64_t cm_ns_wait;
uint64_t cm_ns_stage;
uint64_t cm_ns_issue;
uint64_t cm_ns_total;
size_t cm_nchunks_all;

/* ------------------------------------------------------------------ */
/* The host side: packing and unpacking                                */
/* ------------------------------------------------------------------ */

static uint64_t cm_now_ns(void);

/* Poll *p, with no lock held, for at most cm_spin_ns until it becomes
 * nonzero (until_nonzero) or zero: a short wait costs a few polls
 * instead of a sleep and a wake-up.  Racy reads of values written under
 * cm_stg_mu; the caller checks again under the lock.  No pause
 * instruction: under a hypervisor a loop of pauses makes the virtual
 * CPU give way, which is the wake-up latency this avoids. */
static void
cm_stg_spin(const int *p, int until_nonzero)
{
    long spin = __atomic_load_n(&cm_spin_ns, __ATOMIC_RELAXED);
    uint64_t t0;
    unsigned int i = 0;

    if (spin <= 0) {
        return;
    }
    t0 = cm_now_ns();
    while ((__atomic_load_n(p, __ATOMIC_RELAXED) != 0) != until_nonzero) {
        if ((++i & 63) == 0 && cm_now_ns() - t0 > (uint64_t)spin) {
            return;
        }
    }
}

/* Runs shorter than this are copied by memcpy even with nt on. */
#define CM_NT_MIN 4096

/* memcpy for the host side of a chunk.  With nt (x86-64), long runs are
 * written with non-temporal stores: the destination's lines are not read
 * first nor left in the cache, which spares a third of the memory
 * traffic of a staged copy (the copy engine reads or writes the same
 * memory at the same time). */
static void
cm_stg_copy(char *dst, const char *src, size_t n)
{
#if defined(__x86_64__)
    if (__atomic_load_n(&cm_nt_on, __ATOMIC_RELAXED) && n >= CM_NT_MIN) {
        size_t head = (16 - ((uintptr_t)dst & 15)) & 15;
        size_t blocks;

        memcpy(dst, src, head);
        dst += head;
        src += head;
        n -= head;
        for (blocks = n / 64; blocks > 0; blocks--) {
            __m128i a = _mm_loadu_si128((const __m128i *)src);
            __m128i b = _mm_loadu_si128((const __m128i *)(src + 16));
            __m128i c = _mm_loadu_si128((const __m128i *)(src + 32));
            __m128i d = _mm_loadu_si128((const __m128i *)(src + 48));

            _mm_stream_si128((__m128i *)dst, a);
            _mm_stream_si128((__m128i *)(dst + 16), b);
            _mm_stream_si128((__m128i *)(dst + 32), c);
            _mm_stream_si128((__m128i *)(dst + 48), d);
            src += 64;
            dst += 64;
        }
        _mm_sfence();
        memcpy(dst, src, n & 63);
        return;
    }
#endif
    memcpy(dst, src, n);
}

/* Copy elements [e0, e0 + n) between the host layout of j and buf
 * (compact), towards buf when pack. */
static void
cm_stg_walk(const cm_sjob *j, size_t e0, size_t n, char *buf, int pack)
{
    Py_ssize_t idx[NPY_MAXDIMS];
    int nd = j->ndim;
    size_t is = j->itemsize;
    Py_ssize_t last = j->hs[nd - 1];
    size_t rem = e0;
    char *h;
    int i;

    if (nd == 1 && last == (Py_ssize_t)is) {
        h = (char *)j->host + e0 * is;
        if (pack) {
            cm_stg_copy(buf, h, n * is);
        }
        else {
            cm_stg_copy(h, buf, n * is);
        }
        return;
    }
    h = (char *)j->host;
    for (i = nd - 1; i >= 0; i--) {
        idx[i] = (Py_ssize_t)(rem % (size_t)j->shape[i]);
        rem /= (size_t)j->shape[i];
        h += idx[i] * j->hs[i];
    }
    while (n > 0) {
        size_t run = (size_t)(j->shape[nd - 1] - idx[nd - 1]);
        size_t k;

        if (run > n) {
            run = n;
        }
        if (last == (Py_ssize_t)is) {
            if (pack) {
                cm_stg_copy(buf, h, run * is);
            }
            else {
                cm_stg_copy(h, buf, run * is);
            }
        }
        else if (pack) {
            for (k = 0; k < run; k++) {
                memcpy(buf + k * is, h + (Py_ssize_t)k * last, is);
            }
        }
        else {
            for (k = 0; k < run; k++) {
                memcpy(h + (Py_ssize_t)k * last, buf + k * is, is);
            }
        }
        buf += run * is;
        n -= run;
        idx[nd - 1] += (Py_ssize_t)run;
        h += (Py_ssize_t)run * last;
        /* Carry into the outer dimensions. */
        for (i = nd - 1; i > 0 && idx[i] == j->shape[i]; i--) {
            h -= idx[i] * j->hs[i];
            idx[i] = 0;
            idx[i - 1]++;
            h += j->hs[i - 1];
        }
    }
}

/* Run share p of batch b. */
static void
cm_batch_share(cm_batch *b, int p)
{
    size_t per = b->n / (size_t)b->nparts;
    size_t extra = b->n % (size_t)b->nparts;
    size_t lo = (size_t)p * per + ((size_t)p < extra ? (size_t)p : extra);
    size_t cnt = per + ((size_t)p < extra ? 1 : 0);

    cm_stg_walk(b->job, b->e0 + lo, cnt,
                b->buf + lo * b->job->itemsize, b->pack);
}

/* Take the next share of the batch at the head of the queue and move
 * that batch to the tail, so that concurrent transfers take turns.  Lock
 * held; NULL when the queue is empty. */
static cm_batch *
cm_bq_take_locked(int *p)
{
    cm_batch *b = cm_bq_head;

    if (b == NULL) {
        return NULL;
    }
    *p = b->next++;
    cm_bq_head = b->qnext;
    if (cm_bq_head == NULL) {
        cm_bq_tail = NULL;
    }
    b->qnext = NULL;
    if (b->next < b->nparts) {
        if (cm_bq_tail != NULL) {
            cm_bq_tail->qnext = b;
        }
        else {
            cm_bq_head = b;
        }
        cm_bq_tail = b;
    }
    __atomic_store_n(&cm_bq_nonempty, cm_bq_head != NULL, __ATOMIC_RELAXED);
    return b;
}

/* Unlink b from the queue (it has no shares left to take).  Lock held. */
static void
cm_bq_unlink_locked(cm_batch *b)
{
    cm_batch **link = &cm_bq_head;
    cm_batch *prev = NULL;

    while (*link != NULL && *link != b) {
        prev = *link;
        link = &(*link)->qnext;
    }
    if (*link == NULL) {
        return;
    }
    *link = b->qnext;
    if (cm_bq_tail == b) {
        cm_bq_tail = prev;
    }
    b->qnext = NULL;
    __atomic_store_n(&cm_bq_nonempty, cm_bq_head != NULL, __ATOMIC_RELAXED);
}

static void *
cm_worker_main(void *arg)
{
    (void)arg;
    cm_mu_lock(&cm_stg_mu);
    for (;;) {
        cm_batch *b;
        int p;

        if ((b = cm_bq_take_locked(&p)) == NULL) {
            cm_mu_unlock(&cm_stg_mu);
            cm_stg_spin(&cm_bq_nonempty, 1);
            cm_mu_lock(&cm_stg_mu);
        }
        while (b == NULL && (b = cm_bq_take_locked(&p)) == NULL) {
            pthread_cond_wait(&cm_stg_work, &cm_stg_mu);
        }
        cm_mu_unlock(&cm_stg_mu);
        cm_batch_share(b, p);
        cm_mu_lock(&cm_stg_mu);
        if (--b->left == 0) {
            pthread_cond_broadcast(&cm_stg_part_done);
        }
    }
    return NULL;
}

/* Grow the workers to n (fewer if threads cannot be made: the callers
 * help with their own batches, so any number works). */
static void
cm_workers_grow(int n)
{
    pthread_attr_t attr;

    if (pthread_attr_init(&attr) != 0) {
        return;
    }
    (void)pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    for (;;) {
        pthread_t t;
        int have;

        cm_mu_lock(&cm_stg_mu);
        have = cm_workers;
        if (have < n) {
            cm_workers++;
        }
        cm_mu_unlock(&cm_stg_mu);
        if (have >= n) {
            break;
        }
        if (pthread_create(&t, &attr, cm_worker_main, NULL) != 0) {
            cm_mu_lock(&cm_stg_mu);
            cm_workers--;
            cm_mu_unlock(&cm_stg_mu);
            break;
        }
    }
    pthread_attr_destroy(&attr);
}

/* Pack (or unpack) chunk k of j through buf with the workers' help, and
 * return when it is done.  The caller takes shares of its own batch, so
 * it progresses even when every worker is busy. */
static void
cm_stg_host_stage(const cm_sjob *j, size_t k, char *buf, int pack)
{
    cm_batch b;
    size_t n = j->bound[k + 1] - j->bound[k];
    size_t shares;
    int workers;

    memset(&b, 0, sizeof(b));
    b.job = j;
    b.buf = buf;
    b.e0 = j->bound[k];
    b.n = n;
    b.pack = pack;
    cm_mu_lock(&cm_stg_mu);
    workers = cm_workers;
    shares = (n + j->part_el - 1) / j->part_el;
    if (shares > (size_t)workers + 1) {
        shares = (size_t)workers + 1;
    }
    b.nparts = (int)(shares > 0 ? shares : 1);
    b.left = b.nparts;
    if (b.nparts == 1) {
        b.next = 1;
        cm_mu_unlock(&cm_stg_mu);
        cm_batch_share(&b, 0);
        return;
    }
    b.next = 1;                          /* share 0 is the caller's */
    if (cm_bq_tail != NULL) {
        cm_bq_tail->qnext = &b;
    }
    else {
        cm_bq_head = &b;
    }
    cm_bq_tail = &b;
    __atomic_store_n(&cm_bq_nonempty, 1, __ATOMIC_RELAXED);
    pthread_cond_broadcast(&cm_stg_work);
    cm_mu_unlock(&cm_stg_mu);
    cm_batch_share(&b, 0);
    cm_mu_lock(&cm_stg_mu);
    b.left--;
    while (b.next < b.nparts) {
        int p = b.next++;

        if (b.next == b.nparts) {
            cm_bq_unlink_locked(&b);
        }
        cm_mu_unlock(&cm_stg_mu);
        cm_batch_share(&b, p);
        cm_mu_lock(&cm_stg_mu);
        b.left--;
    }
    cm_bq_unlink_locked(&b);
    if (b.left > 0) {
        cm_mu_unlock(&cm_stg_mu);
        cm_stg_spin(&b.left, 0);
        cm_mu_lock(&cm_stg_mu);
    }
    while (b.left > 0) {
        pthread_cond_wait(&cm_stg_part_done, &cm_stg_mu);
    }
    cm_mu_unlock(&cm_stg_mu);
}

/* ------------------------------------------------------------------ */
/* Staging buffers                                                     */
/* ------------------------------------------------------------------ */

#define CM_HUGE ((size_t)2 << 20)

/* Give up b's page-locked memory (not its event). */
static void
cm_sbuf_release_mem(cm_sbuf *b)
{
    if (b->maplen == 0) {
        if (!cm_forked) {
            (void)CM_CU_RAW(MemFreeHost, (b->host));
        }
        return;
    }
    if (!cm_forked) {
        (void)CM_CU_RAW(MemHostUnregister, (b->host));
    }
    (void)munmap(b->host, b->maplen);
}

/* Page-locked memory of size bytes for b: with huge, anonymous memory
 * aligned to 2 MiB with transparent huge pages asked for and registered
 * with the driver (fewer TLB misses while the workers fill or drain
 * it), when that works; otherwise cuMemHostAlloc. */
static CUresult
cm_sbuf_alloc_mem(cm_sbuf *b, size_t size, int huge)
{
    b->maplen = 0;
#if defined(MADV_HUGEPAGE)
    if (huge && size <= SIZE_MAX - 2 * CM_HUGE) {
        size_t len = (size + CM_HUGE - 1) & ~(CM_HUGE - 1);
        char *p = mmap(NULL, len + CM_HUGE, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

        if (p != MAP_FAILED) {
            char *a = (char *)(((uintptr_t)p + CM_HUGE - 1)
                               & ~(uintptr_t)(CM_HUGE - 1));
            size_t off;

            if (a > p) {
                (void)munmap(p, (size_t)(a - p));
            }
            if (a + len < p + len + CM_HUGE) {
                (void)munmap(a + len,
                             (size_t)(p + len + CM_HUGE - (a + len)));
            }
            (void)madvise(a, len, MADV_HUGEPAGE);
#if defined(MADV_DONTFORK)
            (void)madvise(a, len, MADV_DONTFORK);
#endif
            for (off = 0; off < len; off += CM_HUGE) {
                a[off] = 0;
            }
            if (CM_CU_RAW(MemHostRegister,
                          (a, len, CU_MEMHOSTREGISTER_PORTABLE))
                == CUDA_SUCCESS) {
                b->host = a;
                b->maplen = len;
                return CUDA_SUCCESS;
            }
            (void)munmap(a, len);
        }
    }
#else
    (void)huge;
#endif
    return CM_CU_RAW(MemHostAlloc, (&b->host, size,
                                    CU_MEMHOSTALLOC_PORTABLE));
}

/* Free buffers; no lock held. */
void
cm_sbuf_free_list(cm_sbuf *list)
{
    while (list != NULL) {
        cm_sbuf *b = list;

        list = b->next;
        if (!cm_forked) {
            if (b->pending) {
                /* A copy from it may still run. */
                (void)CM_CU_RAW(EventSynchronize, (b->ev));
            }
            (void)CM_CU_RAW(EventDestroy, (b->ev));
        }
        cm_sbuf_release_mem(b);
        free(b);
    }
}

/* The cache of a device, emptied of buffers of an earlier context (their
 * memory went with it).  Lock held; NULL if the device has none. */
cm_scache *
cm_cache_of_locked(int dev, unsigned long gen)
{
    cm_scache *c;

    if (dev < 0 || dev >= CM_STG_DEVICES) {
        return NULL;
    }
    c = &cm_caches[dev];
    if (c->gen != gen) {
        while (c->free != NULL) {
            cm_sbuf *b = c->free;

            c->free = b->next;
            cm_nlive--;
            cm_live_bytes -= b->size;
            cm_nfree_all--;
            free(b);
        }
        c->nfree = 0;
        c->gen = gen;
    }
    return c;
}

/* Give j its nbuf buffers of at least size bytes: cached ones first, then
 * new ones.  The context current, no GIL. */
static CUresult
cm_stg_acquire(cm_sjob *j, size_t size, size_t alloc_size)
{
    cm_sbuf *stale = NULL;
    cm_scache *c;
    int got = 0;
    CUresult rc = CUDA_SUCCESS;

    cm_mu_lock(&cm_stg_mu);
    c = cm_cache_of_locked(j->devid, j->gen);
    while (c != NULL && c->free != NULL && got < j->nbuf) {
        cm_sbuf *b = c->free;

        c->free = b->next;
        c->nfree--;
        cm_nfree_all--;
        b->next = NULL;
        if (b->size < size) {
            cm_nlive--;
            cm_live_bytes -= b->size;
            b->next = stale;
            stale = b;
            continue;
        }
        j->buf[got++] = b;
    }
    cm_mu_unlock(&cm_stg_mu);
    cm_sbuf_free_list(stale);
    j->fn = "cuMemHostAlloc";
    while (got < j->nbuf) {
        cm_sbuf *b = calloc(1, sizeof(*b));

        if (b == NULL) {
            rc = CUDA_ERROR_OUT_OF_MEMORY;
            break;
        }
        rc = cm_sbuf_alloc_mem(b, alloc_size, j->huge);
        if (rc != CUDA_SUCCESS) {
            free(b);
            break;
        }
        rc = CM_CU_RAW(EventCreate, (&b->ev, CU_EVENT_DISABLE_TIMING));
        if (rc != CUDA_SUCCESS) {
            j->fn = "cuEventCreate";
            cm_sbuf_release_mem(b);
            free(b);
            break;
        }
        b->size = alloc_size;
        b->gen = j->gen;
        b->dev = j->devid;
        cm_mu_lock(&cm_stg_mu);
        cm_nlive++;
        cm_live_bytes += alloc_size;
        cm_mu_unlock(&cm_stg_mu);
        j->buf[got++] = b;
    }
    if (rc != CUDA_SUCCESS) {
        /* Nothing was issued: what was got goes back. */
        j->nbuf = got;
    }
    return rc;
}


/* Unlink the free buffers of c beyond the first keep onto *drop (freed
 * by cm_sbuf_free_list once cm_stg_mu is let go).  cm_stg_mu held. */
void
cm_cache_shed_locked(cm_scache *c, size_t keep, cm_sbuf **drop)
{
    while (c->nfree > keep) {
        cm_sbuf *b = c->free;

        c->free = b->next;
        c->nfree--;
        cm_nfree_all--;
        cm_nlive--;
        cm_live_bytes -= b->size;
        b->next = *drop;
        *drop = b;
    }
}

/* Give j's buffers back: to the cache, or (unsure: a copy may still use
 * them) freed.  Trims the cache to keep at most keep free buffers. */
static void
cm_stg_release(cm_sjob *j, size_t keep)
{
    cm_sbuf *drop = NULL;
    cm_scache *c;
    int i;

    cm_mu_lock(&cm_stg_mu);
    c = cm_cache_of_locked(j->devid, j->gen);
    for (i = 0; i < j->nbuf; i++) {
        cm_sbuf *b = j->buf[i];

        j->buf[i] = NULL;
        if (b->gen != j->gen || c == NULL) {
            /* Its context is gone, and its memory with it. */
            cm_nlive--;
            cm_live_bytes -= b->size;
            free(b);
            continue;
        }
        if (j->unsure) {
            cm_nlive--;
            cm_live_bytes -= b->size;
            b->next = drop;
            drop = b;
            continue;
        }
        b->next = c->free;
        c->free = b;
        c->nfree++;
        cm_nfree_all++;
    }
    j->nbuf = 0;
    if (c != NULL) {
        cm_cache_shed_locked(c, keep, &drop);
    }
    cm_mu_unlock(&cm_stg_mu);
    cm_sbuf_free_list(drop);
}

/* ------------------------------------------------------------------ */
/* The pipeline                                                        */
/* ------------------------------------------------------------------ */

/* Bytes and device address of chunk k. */
static size_t
cm_chunk_bytes(const cm_sjob *j, size_t k)
{
    return (j->bound[k + 1] - j->bound[k]) * j->itemsize;
}

/* The device address of chunk k. */
static CUdeviceptr
cm_chunk_dev(const cm_sjob *j, size_t k)
{
    return j->dev + (CUdeviceptr)(j->bound[k] * j->itemsize);
}

/* Cut elems elements into chunks of full elements, after `ramp` halvings
 * of full at each end (full/2^ramp first, doubling up to full; the
 * mirror at the end) when the transfer is long enough and no ramp chunk
 * falls below min_el.  The boundaries (nchunks + 1 of them, malloc'd) or
 * NULL when memory is short. */
static size_t *
cm_stg_schedule(size_t elems, size_t full, size_t min_el, int ramp,
                size_t *nchunks)
{
    size_t sizes[CM_STG_MAXRAMP];
    size_t rsum = 0;
    size_t end;
    size_t e = 0;
    size_t n;
    size_t k = 0;
    size_t *bound;
    int r = 0;
    int i;

    while (r < ramp && r < CM_STG_MAXRAMP && (full >> (r + 1)) >= min_el
           && (full >> (r + 1)) > 0) {
        sizes[r] = full >> (r + 1);
        rsum += sizes[r];
        r++;
    }
    if (r == 0 || elems < 2 * rsum + full) {
        r = 0;
        rsum = 0;
    }
    end = elems - rsum;
    n = 2 * (size_t)r + (end - rsum + full - 1) / full;
    bound = malloc((n + 1) * sizeof(*bound));
    if (bound == NULL) {
        return NULL;
    }
    for (i = r - 1; i >= 0; i--) {
        bound[k++] = e;
        e += sizes[i];
    }
    while (e < end) {
        bound[k++] = e;
        e += end - e < full ? end - e : full;
    }
    for (i = 0; i < r; i++) {
        bound[k++] = e;
        e += sizes[i];
    }
    bound[k] = e;
    *nchunks = k;
    return bound;
}

static uint64_t
cm_now_ns(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* Issue the device-to-host copy of chunk k into its buffer and record
 * the buffer's event; pending[b] says what is outstanding. */
static CUresult
cm_stg_issue_dtoh(cm_sjob *j, size_t k, int *pending)
{
    int b = (int)(k % (size_t)j->nbuf);
    uint64_t t0 = cm_now_ns();
    CUresult rc;

    rc = CM_CU_RAW(MemcpyDtoHAsync,
                   (j->buf[b]->host, cm_chunk_dev(j, k),
                    cm_chunk_bytes(j, k), j->stream));
    if (rc != CUDA_SUCCESS) {
        j->fn = "cuMemcpyDtoHAsync";
        return rc;
    }
    pending[b] = -1;
    rc = CM_CU_RAW(EventRecord, (j->buf[b]->ev, j->stream));
    if (rc != CUDA_SUCCESS) {
        j->fn = "cuEventRecord";
        return rc;
    }
    pending[b] = 1;
    j->ns_issue += cm_now_ns() - t0;
    return CUDA_SUCCESS;
}

/* Wait until buffer b's copy completed. */
static CUresult
cm_stg_wait_buf(cm_sjob *j, int b, int *pending)
{
    uint64_t t0 = cm_now_ns();
    CUresult rc = CM_CU_RAW(EventSynchronize, (j->buf[b]->ev));

    j->ns_wait += cm_now_ns() - t0;
    if (rc != CUDA_SUCCESS) {
        j->fn = "cuEventSynchronize";
        return rc;
    }
    pending[b] = 0;
    return CUDA_SUCCESS;
}

/* Run j's pipeline on j->stream; the context current, no GIL.  When it
 * returns, no copy of j's is outstanding unless j->unsure is set, or
 * j->early and it went well (the last copies from its buffers, marked
 * pending).  The first error is in j->rc / j->fn. */
static void
cm_stg_run(cm_sjob *j)
{
    int pending[CM_STG_MAXBUF];
    size_t n = j->nchunks;
    size_t k;
    int b;
    uint64_t t0;
    uint64_t t1;
    CUresult rc = CUDA_SUCCESS;

    memset(pending, 0, sizeof(pending));
    /* A cached buffer may still be read by the copy of a transfer to the
     * device that returned early: waited for before the workers write it
     * (host to device, in the loop) or a copy writes it (device to host,
     * here). */
    for (b = 0; b < j->nbuf; b++) {
        if (j->buf[b]->pending) {
            j->buf[b]->pending = 0;
            pending[b] = 1;
            if (!j->htod
                && (rc = cm_stg_wait_buf(j, b, pending)) != CUDA_SUCCESS) {
                goto out_drain;
            }
        }
    }
    if (j->htod) {
        for (k = 0; k < n; k++) {
            b = (int)(k % (size_t)j->nbuf);
            if (pending[b] && (rc = cm_stg_wait_buf(j, b, pending))
                != CUDA_SUCCESS) {
                goto out_drain;
            }
            t0 = cm_now_ns();
            cm_stg_host_stage(j, k, j->buf[b]->host, 1);
            t1 = cm_now_ns();
            j->ns_stage += t1 - t0;
            rc = CM_CU_RAW(MemcpyHtoDAsync,
                           (cm_chunk_dev(j, k), j->buf[b]->host,
                            cm_chunk_bytes(j, k), j->stream));
            if (rc != CUDA_SUCCESS) {
                j->fn = "cuMemcpyHtoDAsync";
                goto out_drain;
            }
            pending[b] = -1;
            rc = CM_CU_RAW(EventRecord, (j->buf[b]->ev, j->stream));
            if (rc != CUDA_SUCCESS) {
                j->fn = "cuEventRecord";
                goto out_drain;
            }
            pending[b] = 1;
            j->ns_issue += cm_now_ns() - t1;
        }
    }
    else {
        for (k = 0; k < n && k < (size_t)j->nbuf; k++) {
            if ((rc = cm_stg_issue_dtoh(j, k, pending)) != CUDA_SUCCESS) {
                goto out_drain;
            }
        }
        for (k = 0; k < n; k++) {
            b = (int)(k % (size_t)j->nbuf);
            if ((rc = cm_stg_wait_buf(j, b, pending)) != CUDA_SUCCESS) {
                goto out_drain;
            }
            t0 = cm_now_ns();
            cm_stg_host_stage(j, k, j->buf[b]->host, 0);
            j->ns_stage += cm_now_ns() - t0;
            if (k + (size_t)j->nbuf < n
                && (rc = cm_stg_issue_dtoh(j, k + (size_t)j->nbuf, pending))
                   != CUDA_SUCCESS) {
                goto out_drain;
            }
        }
    }
out_drain:
    if (rc != CUDA_SUCCESS) {
        j->rc = rc;
    }
    /* Every buffer's last copy must have completed before it is reused;
     * what no event confirms, the stream does.  A transfer to the device
     * that may return early and went well leaves its buffers' last
     * copies running, their events to be waited for by the buffers'
     * next use (cm_sbuf.pending). */
    t0 = cm_now_ns();
    for (b = 0; b < j->nbuf; b++) {
        if (pending[b] == 1 && j->early && rc == CUDA_SUCCESS) {
            j->buf[b]->pending = 1;
            continue;
        }
        if (pending[b] == 1
            && CM_CU_RAW(EventSynchronize, (j->buf[b]->ev))
               != CUDA_SUCCESS) {
            pending[b] = -1;
        }
        if (pending[b] == -1) {
            j->unsure = 1;
        }
    }
    if (j->unsure
        && CM_CU_RAW(StreamSynchronize, (j->stream)) == CUDA_SUCCESS) {
        j->unsure = 0;
    }
    j->ns_wait += cm_now_ns() - t0;
    if (j->rc == CUDA_SUCCESS && j->unsure) {
        j->rc = CUDA_ERROR_UNKNOWN;
        j->fn = "cuEventSynchronize";
    }
}

/* ------------------------------------------------------------------ */
/* The entry point of the copy engine                                  */
/* ------------------------------------------------------------------ */

/* The driver's last answer on this thread for the range asked last:
 * a loop copying into one host array asks the driver once.  Either
 * answer is safe when stale (pinned memory bounced, or pageable memory
 * given to the driver's own copy, still lands right): only the speed of
 * the route it picks depends on it. */
static _Thread_local uintptr_t cm_stg_asked_lo;
static _Thread_local uintptr_t cm_stg_asked_hi;
static _Thread_local int cm_stg_asked_pinned;

/* Whether [lo, hi) is page-locked memory the driver knows: cudamem's
 * registrations first, then the driver's answer for its first byte. */
static int
cm_stg_pinned(uintptr_t lo, uintptr_t hi)
{
    unsigned int type = 0;

    if (cm_hostmem_registered(lo, hi)) {
        return 1;
    }
    if (lo != cm_stg_asked_lo || hi != cm_stg_asked_hi) {
        cm_stg_asked_pinned
            = CM_CU_RAW(PointerGetAttribute,
                        (&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
                         (CUdeviceptr)lo)) == CUDA_SUCCESS;
        cm_stg_asked_lo = lo;
        cm_stg_asked_hi = hi;
    }
    return cm_stg_asked_pinned;
}

/* A synchronous copy of bytes from x->dev into pageable host memory
 * through one staging buffer: the driver's synchronous copy into the
 * buffer, then a memcpy by the calling thread.  For copies under the
 * threshold, where the pipeline's workers and events cost more than
 * they overlap: on an H100 64 KiB took 18.5 us by the driver's own call
 * on the pageable memory, 14.4 us through a page-locked array by hand.
 * The host side must be contiguous in the device side's order.  1 when
 * done, 0 when the caller should copy directly (the host side strided,
 * page-locked already, or no page-locked memory to spare), -1 with an
 * exception.  The context current, GIL held (released inside). */
static int
cm_stg_bounce(const cm_xfer *x, size_t bytes, const cm_stg_cfg *cfg)
{
    cm_context *ctx;
    cm_sjob j;
    cm_sbuf *b;
    const char *fn = "cuMemcpyDtoH";
    CUresult rc = CUDA_SUCCESS;
    int done = 0;
    int i;

    for (i = 0; i < x->ndim; i++) {
        if (x->hstrides[i] != x->dstrides[i] && x->shape[i] > 1) {
            return 0;
        }
    }
    ctx = cm_context_current();
    if (ctx == NULL) {
        return -1;
    }
    memset(&j, 0, sizeof(j));
    j.nbuf = 1;
    j.huge = cfg->huge;
    j.devid = ctx->device->id;
    j.gen = ctx->gen;

    CM_DRIVER_BEGIN_NOGIL
    if (!cm_stg_pinned(x->host, x->host + bytes)) {
        rc = cm_stg_acquire(&j, bytes, cfg->chunk);
        fn = j.fn;
        if (rc == CUDA_ERROR_OUT_OF_MEMORY) {
            rc = CUDA_SUCCESS;      /* none to spare: the direct path */
        }
        else if (rc == CUDA_SUCCESS) {
            b = j.buf[0];
            /* A copy to the device that returned early may still read
             * it. */
            if (b->pending) {
                fn = "cuEventSynchronize";
                rc = CM_CU_RAW(EventSynchronize, (b->ev));
                if (rc == CUDA_SUCCESS) {
                    b->pending = 0;
                }
                else {
                    j.unsure = 1;   /* freed, not cached */
                }
            }
            if (rc == CUDA_SUCCESS) {
                fn = "cuMemcpyDtoH";
                rc = CM_CU_RAW(MemcpyDtoH, (b->host, x->dev, bytes));
            }
            if (rc == CUDA_SUCCESS) {
                memcpy((void *)x->host, b->host, bytes);
                done = 1;
                __atomic_fetch_add(&cm_bounced, 1, __ATOMIC_RELAXED);
            }
        }
        cm_stg_release(&j, (size_t)cfg->buffers * CM_STG_KEEP_SETS);
    }
    CM_DRIVER_END_NOGIL

    if (rc != CUDA_SUCCESS) {
        return cm_raise_cu(rc, fn != NULL ? fn : "cuMemcpyDtoH");
    }
    return done;
}

int
cm_staging_copy(const cm_xfer *x, CUstream stream, int async)
{
    cm_stg_cfg cfg = cm_cfg;
    cm_context *ctx;
    cm_sjob *j;
    size_t elems = 1;
    size_t bytes;
    size_t chunk;
    size_t alloc_size;
    Py_ssize_t lo = 0;
    Py_ssize_t hi = 0;
    size_t keep_free = (size_t)cfg.buffers * CM_STG_KEEP_SETS;
    CUresult rc;
    int direct = 0;
    int i;

    if (!cfg.enabled || x->itemsize <= 0 || cm_forked) {
        return 0;
    }
    for (i = 0; i < x->ndim; i++) {
        elems *= (size_t)x->shape[i];
    }
    bytes = elems * (size_t)x->itemsize;
    if (bytes == 0 || (size_t)x->itemsize > cfg.chunk) {
        return 0;
    }
    /* Under the threshold only a synchronous copy to the host of
     * CM_STG_BOUNCE_MIN .. cfg.bounce bytes, through one buffer. */
    if (bytes < cfg.threshold
        && (x->htod || async || bytes < CM_STG_BOUNCE_MIN
            || bytes > cfg.bounce || bytes > cfg.chunk)) {
        return 0;
    }
    /* The device side must be one ascending contiguous range. */
    if (x->ndim > 0) {
        Py_ssize_t want = x->itemsize;

        for (i = x->ndim - 1; i >= 0; i--) {
            if (x->dstrides[i] != want) {
                return 0;
            }
            want *= x->shape[i];
        }
    }
    if (bytes < cfg.threshold) {
        return cm_stg_bounce(x, bytes, &cfg);
    }
    /* Staged: host code runs once per chunk, which a capture could not
     * replay; refused on a capturing stream (a driver query for a
     * non-default stream: small beside a copy this large). */
    if (cm_capture_refuse_stream(stream, 1, "a staged copy of pageable "
                                 "host memory") < 0) {
        return -1;
    }
    ctx = cm_context_current();
    if (ctx == NULL) {
        return -1;
    }
    j = calloc(1, sizeof(*j));
    if (j == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    j->htod = x->htod;
    j->early = x->htod && x->early;
    j->ndim = x->ndim > 0 ? x->ndim : 1;
    j->shape[0] = 1;
    j->hs[0] = x->itemsize;
    for (i = 0; i < x->ndim; i++) {
        j->shape[i] = x->shape[i];
        j->hs[i] = x->hstrides[i];
        if (x->hstrides[i] < 0) {
            lo += (x->shape[i] - 1) * x->hstrides[i];
        }
        else {
            hi += (x->shape[i] - 1) * x->hstrides[i];
        }
    }
    j->host = x->host;
    j->dev = x->dev;
    j->itemsize = (size_t)x->itemsize;
    j->elems = elems;
    /* Chunks shrink for transfers of a few chunks, so that they still
     * overlap: a share of the buffers each, or where that is between
     * CM_STG_SPLIT_FLOOR and the chunk size, a quarter (CM_STG_SPLIT) but
     * no less than the floor; a chunk holds whole elements. */
    chunk = (bytes + (size_t)cfg.buffers - 1) / (size_t)cfg.buffers;
    if (chunk > CM_STG_SPLIT_FLOOR && chunk < cfg.chunk) {
        chunk = (bytes + CM_STG_SPLIT - 1) / CM_STG_SPLIT;
        if (chunk < CM_STG_SPLIT_FLOOR) {
            chunk = CM_STG_SPLIT_FLOOR;
        }
    }
    if (chunk < CM_STG_MINCHUNK) {
        chunk = CM_STG_MINCHUNK;
    }
    if (chunk > cfg.chunk) {
        chunk = cfg.chunk;
    }
    j->chunk_el = chunk / j->itemsize;
    if (j->chunk_el == 0) {
        j->chunk_el = 1;
    }
    j->part_el = cfg.part / j->itemsize;
    if (j->part_el == 0) {
        j->part_el = 1;
    }
    j->bound = cm_stg_schedule(elems, j->chunk_el, j->part_el, cfg.ramp,
                               &j->nchunks);
    if (j->bound == NULL) {
        free(j);
        PyErr_NoMemory();
        return -1;
    }
    j->nbuf = cfg.buffers;
    j->huge = cfg.huge;
    if ((size_t)j->nbuf > j->nchunks) {
        j->nbuf = (int)j->nchunks;
    }
    alloc_size = cfg.chunk;
    j->stream = async ? stream : NULL;   /* sync: the default stream */
    j->devid = ctx->device->id;
    j->gen = ctx->gen;
    cm_workers_grow(cfg.threads);

    CM_DRIVER_BEGIN_NOGIL
    rc = CM_CU_RAW(CtxGetCurrent, (&j->ctx));
    j->fn = "cuCtxGetCurrent";
    if (rc == CUDA_SUCCESS
        && cm_stg_pinned(j->host + (uintptr_t)lo,
                         j->host + (uintptr_t)hi + j->itemsize)) {
        direct = 1;
    }
    if (rc == CUDA_SUCCESS && !direct) {
        rc = cm_stg_acquire(j, j->chunk_el * j->itemsize, alloc_size);
        if (rc == CUDA_ERROR_OUT_OF_MEMORY) {
            /* No page-locked memory to spare: the direct path. */
            direct = 1;
            rc = CUDA_SUCCESS;
        }
        if (rc != CUDA_SUCCESS || direct) {
            cm_stg_release(j, keep_free);
        }
    }
    if (rc == CUDA_SUCCESS && !direct) {
        uint64_t t0;

        cm_mu_lock(&cm_stg_mu);
        cm_inflight++;
        cm_staged++;
        cm_mu_unlock(&cm_stg_mu);
        t0 = cm_now_ns();
        cm_stg_run(j);
        t0 = cm_now_ns() - t0;
        rc = j->rc;
        cm_stg_release(j, keep_free);
        cm_mu_lock(&cm_stg_mu);
        cm_inflight--;
        cm_ns_wait += j->ns_wait;
        cm_ns_stage += j->ns_stage;
        cm_ns_issue += j->ns_issue;
        cm_ns_total += t0;
        cm_nchunks_all += j->nchunks;
        cm_mu_unlock(&cm_stg_mu);
    }
    CM_DRIVER_END_NOGIL

    {
        const char *fn = j->fn;

        free(j->bound);
        free(j);
        if (rc != CUDA_SUCCESS) {
            return cm_raise_cu(rc, fn != NULL ? fn : "cuMemcpy");
        }
    }
    return direct ? 0 : 1;
}
