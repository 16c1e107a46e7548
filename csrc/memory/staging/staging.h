/* SPDX-License-Identifier: MIT */
/*
 * memory/staging/staging.h: the public header of the room
 * memory/staging/, the staged pipeline for large copies between pageable
 * host memory and device memory: what its files share.  The layers above
 * call cm_staging_copy through memory/memory.h.
 * The room owns, lowest first:
 * - staging.c: the host side and its workers, the staging buffers and
 *   their caches, and the pipeline;
 * - stagecfg.c: the tunables, statistics, staging_trim, the reset in a
 *   fork's child and the init.
 *
 * Locks and the GIL, in brief: cm_stg_mu guards the workers' queue, the
 * caches and the counters, with no Python or driver call and no other
 * lock under it; the GIL guards the tunables, which a transfer copies
 * before it gives the GIL up for the whole pipeline; the workers never
 * hold the GIL.
 */
#ifndef CM_STAGING_H
#define CM_STAGING_H

#include "memory/memory.h"

#include <pthread.h>

#define CM_STG_MAXBUF 16              /* most staging buffers a transfer */
#define CM_STG_DEVICES 64             /* devices with a buffer cache */
#define CM_STG_MINCHUNK ((size_t)256 << 10)  /* adaptive chunk floor */
/* A transfer of a few chunks is cut into at least CM_STG_SPLIT chunks,
 * none under CM_STG_SPLIT_FLOOR bytes, where its share of the buffers
 * would be larger than that and smaller than the chunk size (the
 * transfers under 24 MiB by default; larger ones keep the chunk size,
 * chosen on an H200).  Quarters: on an H200, 16 MiB ran at 21-24 GB/s
 * to the device and 27-32 to the host in quarters (4 MiB), 16-18 and
 * 21-22 in eighths (2 MiB); 20 and 23 MiB at 29-45 and 36-40 in quarters,
 * 16-20 and 21-28 in 2 or 3 MiB chunks (docs/performance.md, "Copies of
 * 64 KiB to 16 MiB"). */
#define CM_STG_SPLIT 4
#define CM_STG_SPLIT_FLOOR ((size_t)2 << 20)
/* Free buffers a device's cache keeps: this many transfers' worth. */
#define CM_STG_KEEP_SETS 4
#define CM_STG_MAXRAMP 6              /* most halvings at each end */
/* The smallest synchronous copy to pageable host memory that goes
 * through a staging buffer below the threshold (cm_cfg.bounce the
 * largest): under it the driver's own call is as fast (on an H100, 16
 * KiB took 10.6 us direct and 9.5 us through a page-locked array by
 * hand, Python's two calls included; docs/performance.md, "Copies of
 * 64 KiB to 16 MiB"). */
#define CM_STG_BOUNCE_MIN ((size_t)16 << 10)

/* The tunables; NOTE: guarded by the GIL. */
typedef struct {
    int enabled;              /* CUDAMEM_STAGING=0 turns it off */
    size_t threshold;         /* bytes from which a copy is staged */
    size_t chunk;             /* bytes of a chunk (a staging buffer) */
    int buffers;              /* staging buffers per transfer */
    int threads;              /* worker threads */
    size_t part;              /* smallest share of a chunk per worker */
    int ramp;                 /* halvings of the chunks at each end: the
                               * first and last chunks, which nothing
                               * overlaps, get shorter (an experiment:
                               * 0, off, by default) */
    int nt;                   /* host-side copies with non-temporal
                               * stores (x86-64 only) */
    int spin;                 /* microseconds a worker, or a caller
                               * waiting for its shares, polls before it
                               * sleeps */
    int huge;                 /* staging buffers on transparent huge
                               * pages: mmap + madvise + cuMemHostRegister
                               * (Linux), else cuMemHostAlloc */
    size_t bounce;            /* largest synchronous copy to pageable
                               * host memory under the threshold that
                               * goes through one staging buffer (from
                               * CM_STG_BOUNCE_MIN; 0: none) */
} cm_stg_cfg;

extern cm_stg_cfg cm_cfg;

/* Copies of cm_cfg.nt and cm_cfg.spin (nanoseconds) for the workers,
 * which run without the GIL; written under the GIL, read relaxed. */
extern int cm_nt_on;
extern long cm_spin_ns;

/* One page-locked staging buffer with the event of its last copy. */
typedef struct cm_sbuf {
    void *host;               /* its page-locked memory */
    size_t size;              /* bytes */
    size_t maplen;            /* 0: from cuMemHostAlloc; else bytes
                               * mmap'd (huge pages asked for) and
                               * registered with cuMemHostRegister */
    CUevent ev;               /* recorded after each copy */
    unsigned long gen;        /* the context generation it belongs to */
    int dev;                  /* its device's ordinal */
    int pending;              /* ev follows a copy that may still run
                               * (a transfer to the device that returned
                               * early): waited for before the buffer is
                               * written, read or freed */
    struct cm_sbuf *next;     /* free list link */
} cm_sbuf;

/* One device's cache of free buffers. */
typedef struct {
    unsigned long gen;        /* generation of the buffers; 0: unused */
    cm_sbuf *free;            /* LIFO free list */
    size_t nfree;             /* buffers on it */
} cm_scache;

/* A host-side stage of one chunk (staging.c). */
typedef struct cm_batch cm_batch;

/* NOTE: everything below is guarded by cm_stg_mu. */
extern pthread_mutex_t cm_stg_mu;
extern pthread_cond_t cm_stg_work;
extern pthread_cond_t cm_stg_part_done;
extern cm_batch *cm_bq_head;          /* batches with shares to take */
extern cm_batch *cm_bq_tail;
extern int cm_bq_nonempty;            /* cm_bq_head != NULL, for polls */
extern int cm_workers;                /* worker threads made */
extern cm_scache cm_caches[CM_STG_DEVICES];
extern size_t cm_nlive;               /* buffers made and not freed */
extern size_t cm_live_bytes;          /* their bytes */
extern size_t cm_nfree_all;           /* of them, free in a cache */
extern size_t cm_inflight;            /* transfers running */
extern size_t cm_staged;              /* transfers staged, ever */
extern size_t cm_bounced;             /* copies through one buffer, ever
                                       * (atomic; not under the lock) */
/* Where the staged transfers' time went, summed (nanoseconds): waits
 * for a buffer's copy, host-side stages, issuing copies, and the whole
 * pipelines; and their chunks.  For the sweep and for diagnosis. */
extern uint64_t cm_ns_wait;
extern uint64_t cm_ns_stage;
extern uint64_t cm_ns_issue;
extern uint64_t cm_ns_total;
extern size_t cm_nchunks_all;

/* Free buffers; no lock held. */
void cm_sbuf_free_list(cm_sbuf *list);
void cm_cache_shed_locked(cm_scache *c, size_t keep, cm_sbuf **drop);
/* The cache of a device, emptied of buffers of an earlier context (their
 * memory went with it).  Lock held; NULL if the device has none. */
cm_scache *cm_cache_of_locked(int dev, unsigned long gen);

#endif /* CM_STAGING_H */
