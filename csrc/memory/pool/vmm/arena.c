/* SPDX-License-Identifier: MIT */
/*
 * memory/pool/vmm/arena.c: the pool manager's segments on virtual memory.
 *
 * Owns: arenas (struct cm_arena, vmm.h), their pages' physical memory,
 * and the release threshold.  With CUDAMEM_POOL_VMM=1, on a device that
 * supports virtual memory management, the pool's segments are arenas: a
 * reservation of virtual addresses as large as the device's memory (one
 * for small blocks, one for large ones, another when one is full), cut
 * into blocks exactly as cuMemAlloc'd segments are (pool.c: bins,
 * splitting, coalescing, stream-ordered reuse), and into pages of the
 * device's allocation granularity (2 MiB on an H200).  A page has
 * physical memory (cuMemCreate, cuMemMap, cuMemSetAccess) while a block
 * in use covers it (users > 0); freed, it stays mapped (idle), so reuse
 * on the block's stream needs no driver call.
 *
 * - A request is placed where its pages have memory when it can
 *   (cm_pool_take: a free block mapped from its start, else the place in
 *   a free block that needs the fewest pages mapped).
 * - A block taken whose pages lack memory is backed (cm_arena_back): an
 *   idle page elsewhere whose last users' work is done (quiet: its free
 *   block is usable on any stream, its event has completed, or its
 *   stream has no work left) is unmapped and mapped here; only the rest
 *   is made new.  So the pool never holds more memory than the pages its
 *   blocks in use cover, plus idle pages that are not yet quiet and the
 *   threshold below: free memory anywhere serves any request, whatever
 *   its size, without a synchronisation.
 * - Idle memory past the release threshold (CUDAMEM_POOL_RELEASE_THRESHOLD,
 *   bytes or a fraction of the device's memory; 0.1 by default) goes back
 *   to the device in passes, at most one per release interval
 *   (CUDAMEM_POOL_RELEASE_INTERVAL, 0.1 s), run by a release or an
 *   allocation: a pass gives back what stayed idle since the previous
 *   one (the low-water mark of the idle pages), quiet pages only, so no
 *   stream is waited for and memory that cycles between uses stays;
 *   trim() and cudamem.empty_cache() wait for the context and give back
 *   every idle page.
 * - The per-process limit and the pool's limit count mapped memory.
 * - Pages are made with the POSIX file-descriptor handle type where the
 *   device supports it, so that IPC can export them (share.c); a page's
 *   exported descriptor is closed when its memory is given back.
 *
 * Captures: the page work (cm_arena_back, cm_arena_release) runs with
 * this thread's capture mode relaxed, whatever cudamem knows of
 * captures, and a quiet check neither queries nor records an event on a
 * stream that captures (cuStreamIsCapturing first): another library's
 * global-mode capture on another thread stays valid while pages move.
 *
 * No page is unmapped while Python host callbacks are in flight (new
 * memory is made instead, and releases wait for a later free): the
 * driver does not say whether cuMemUnmap waits for the device as
 * cuMemFree does, and if it does it would wait for a callback that may
 * be waiting for the unmapping thread.
 *
 * Locks and the GIL: the page tables (h, users), idle_pages and the
 * page counters are guarded by the pool's mutex (mu), which is never held
 * across cuMemCreate, cuMemMap, cuMemSetAccess, cuMemUnmap, cuMemRelease
 * or cuMemAddressReserve / cuMemAddressFree: only the quiet check's event
 * calls and cuStreamQuery run under it.  The mapping calls run under vmu,
 * so one thread at a time changes mappings: vmu before mu, never after (a
 * release pass only tries vmu).  Both are taken with cm_mu_lock after the
 * GIL is given up (cm_arena_gil_drop, where this thread holds it, until
 * cm_gil_take), so no holder waits for the GIL and nothing of Python is
 * touched meanwhile.  A page whose memory is moving or being made reads
 * as unmapped (h == 0) under mu until its mapping is complete; a thread
 * that takes a block over it backs it after the mover is done.  A quiet
 * page is unmapped only after its work is done, so no queued work reads
 * memory that moves.
 */
#include "memory/pool/vmm/vmm.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "driver/bytesize.h"

/* Pages of an arena: at least this many (small devices, the simulator). */
#define CM_ARENA_MIN_PAGES 64

/* The release threshold, read at import: a fraction of the device's
 * memory (frac >= 0), else bytes. */
static double cm_keep_frac = 0.1;
static size_t cm_keep_bytes;

/* CUDAMEM_POOL_RELEASE_INTERVAL, read at import: ns between passes. */
static uint64_t cm_release_ns = 100000000;

/* New pages are made rather than idle ones moved while the pool maps at
 * most its blocks' peak use and a 32nd more (1 << this shift): memory
 * freed in one place and wanted nearby (requests that grow a little at
 * every step) then stays mapped where it is used, and the pool still
 * maps within 4 % of its peak. */
#define CM_ARENA_HEADROOM_SHIFT 5

/* CUDAMEM_POOL_VMM, read at import (_pool_vmm changes it): pools made
 * from now on put their segments on virtual memory (the default; 0 keeps
 * them cuMemAlloc'd). */
int cm_vmm_env = 1;

/* Read CUDAMEM_POOL_VMM and CUDAMEM_POOL_RELEASE_THRESHOLD; 0, or -1
 * with ValueError naming the variable. */
int
cm_arena_env(void)
{
    const char *v = getenv("CUDAMEM_POOL_VMM");
    const char *t = getenv("CUDAMEM_POOL_RELEASE_THRESHOLD");
    const char *iv = getenv("CUDAMEM_POOL_RELEASE_INTERVAL");
    unsigned long long n;
    char *end;
    double f;

    cm_vmm_env = 1;
    if (v != NULL && v[0] != '\0') {
        if (strcmp(v, "0") != 0 && strcmp(v, "1") != 0) {
            PyErr_Format(PyExc_ValueError,
                         "CUDAMEM_POOL_VMM must be 0 or 1, not %.100s", v);
            return -1;
        }
        cm_vmm_env = v[0] == '1';
    }
    cm_release_ns = 100000000;
    if (iv != NULL && iv[0] != '\0') {
        f = strtod(iv, &end);
        if (end == iv || *end != '\0' || !(f >= 0.0 && f <= 3600.0)) {
            PyErr_Format(PyExc_ValueError,
                         "CUDAMEM_POOL_RELEASE_INTERVAL must be seconds "
                         "from 0 to 3600 (0.1), not %.100s", iv);
            return -1;
        }
        cm_release_ns = (uint64_t)(f * 1e9);
    }
    cm_keep_frac = 0.1;
    cm_keep_bytes = 0;
    if (t == NULL || t[0] == '\0') {
        return 0;
    }
    if (strchr(t, '.') != NULL) {
        f = strtod(t, &end);
        if (end != t && *end == '\0' && f >= 0.0 && f <= 1.0) {
            cm_keep_frac = f;
            return 0;
        }
    }
    else if (cm_parse_bytes(t, SIZE_MAX, &n) == 0) {
        cm_keep_frac = -1.0;
        cm_keep_bytes = (size_t)n;
        return 0;
    }
    PyErr_Format(PyExc_ValueError,
                 "CUDAMEM_POOL_RELEASE_THRESHOLD must be a byte count "
                 "(512M, 1GiB, 1048576) or a fraction of the device's "
                 "memory from 0.0 to 1.0 (0.1), not %.100s", t);
    return -1;
}

int
cm_arena_setup(cm_context *ctx, cm_pool *p)
{
    CUmemAllocationProp prop;
    CUdevice_attribute fda =
        CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED;
    size_t gran = 0;
    int ok = 0;
    int shift;

    p->vmm = 0;
    if (!cm_vmm_env || cm_cu.MemAddressReserve == NULL
        || cm_cu.MemCreate == NULL || cm_cu.MemMap == NULL
        || cm_cu.MemSetAccess == NULL || cm_cu.MemUnmap == NULL
        || cm_cu.MemRelease == NULL || cm_cu.MemAddressFree == NULL
        || cm_cu.MemGetAllocationGranularity == NULL) {
        return 0;
    }
    if (CM_CU_RAW(DeviceGetAttribute,
                  (&ok,
                   CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED,
                   ctx->device->handle)) != CUDA_SUCCESS || !ok) {
        return 0;
    }
    /* Pages other processes can import (memory/pool/vmm/share.c), where the
     * device makes them. */
    ok = 0;
    p->vshare = cm_cu.MemExportToShareableHandle != NULL
                && CM_CU_RAW(DeviceGetAttribute,
                             (&ok, fda, ctx->device->handle)) == CUDA_SUCCESS
                && ok;
    memset(&prop, 0, sizeof(prop));
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.requestedHandleTypes = p->vshare
                                    ? CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
                                    : CU_MEM_HANDLE_TYPE_NONE;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = (int)ctx->device->handle;
    if (CM_CU(MemGetAllocationGranularity,
              (&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM)) < 0) {
        return -1;
    }
    if (gran == 0 || (gran & (gran - 1)) != 0) {
        return 0;   /* not a power of two: stay on cuMemAlloc */
    }
    shift = __builtin_ctzll((unsigned long long)gran);
    p->vmm = 1;
    p->gshift = shift;
    p->device = (int)ctx->device->handle;
    /* Peers given access before the pool was made. */
    p->open_to = ctx->peers_in & ~((uint64_t)1 << p->device);
    p->keep = cm_keep_frac >= 0.0
                  ? (size_t)(cm_keep_frac * (double)ctx->total_mem)
                  : cm_keep_bytes;
    p->release_ns = cm_release_ns;
    if (pthread_mutex_init(&p->vmu, NULL) != 0) {
        p->vmm = 0;
        PyErr_NoMemory();
        return -1;
    }
    return 0;
}

/* ------------------------------------------------------------------ */
/* Pages (mutex held)                                                  */
/* ------------------------------------------------------------------ */

size_t
cm_arena_largest(const cm_pool *p)
{
    const cm_bins *sets[2] = {&p->large, &p->small};
    size_t best = p->idle_pages << p->gshift;
    const cm_blk *b;
    uint64_t bits;
    int s;
    int w;
    int k;

    for (s = 0; s < 2; s++) {
        /* The bins that hold blocks only (the bitmap). */
        for (w = 0; w < CM_POOL_NWORDS; w++) {
            for (bits = sets[s]->used[w]; bits != 0; bits &= bits - 1) {
                k = w * 64 + __builtin_ctzll(bits);
                for (b = sets[s]->head[k]; b != NULL; b = b->fnext) {
                    if (b->size > best && b->seg->arena != NULL
                        && cm_arena_backed(p, b)) {
                        best = b->size;
                    }
                }
            }
        }
    }
    return best;
}

/* Whether free block b's last users' work is done, so that its memory
 * may move; records the event a later look can query when not yet.
 * While a capture forbids this thread the queries, only what a
 * context-wide synchronize tells (cm_blk_event_done); a stream that
 * captures (one cudamem began, or another library's) is not quiet.
 * Called with the thread's capture mode relaxed (cm_capture_relax_always:
 * another library may capture in global mode on another thread). */
static int
cm_blk_quiet(cm_pool *p, cm_blk *b)
{
    if (b->stream == CM_POOL_ANY) {
        return 1;
    }
    if (b->stream == CM_POOL_STUCK) {
        return 0;
    }
    if (b->event != NULL) {
        if (!cm_blk_event_done(p, b)) {
            return 0;
        }
        cm_event_put(p, b->event);
        b->event = NULL;
        b->stream = CM_POOL_ANY;
        return 1;
    }
    /* No event: the stream is alive (its end records one, pool.c). */
    if (cm_capture_stream_known((CUstream)b->stream)
        || cm_pool_stream_captures((CUstream)b->stream)) {
        return 0;
    }
    if (!cm_capture_restricted()
        && CM_CU_RAW(StreamQuery, ((CUstream)b->stream)) == CUDA_SUCCESS) {
        b->stream = CM_POOL_ANY;
        return 1;
    }
    cm_event_record(p, b);
    return 0;
}

/* A page taken out of an arena's table: where it was, and its memory. */
typedef struct {
    cm_arena *a;
    size_t i;
    CUmemGenericAllocationHandle h;
} cm_page;

/* Whether page i of arena a, which no block in use covers and free
 * block b (quiet) overlaps, is quiet: the other free blocks over it, if
 * any (neighbours not merged with b: another stream's), are too. */
static int
cm_page_quiet(cm_pool *p, const cm_arena *a, size_t i, cm_blk *b)
{
    CUdeviceptr lo = a->base + ((CUdeviceptr)i << p->gshift);
    CUdeviceptr hi = lo + ((CUdeviceptr)1 << p->gshift);
    cm_blk *n;

    for (n = b->prev; n != NULL && n->ptr + n->size > lo; n = n->prev) {
        if (!n->free || !cm_blk_quiet(p, n)) {
            return 0;
        }
    }
    for (n = b->next; n != NULL && n->ptr < hi; n = n->next) {
        if (!n->free || !cm_blk_quiet(p, n)) {
            return 0;
        }
    }
    return 1;
}

/* Take up to want idle quiet pages out of the tables into out (their
 * entries read unmapped from now on); how many.  The small blocks' pages
 * go first, then the large free blocks' from the smallest up: holes too
 * small for a large request give their pages, and the large free ranges
 * keep theirs for a request placed over them (cm_pool_take). */
static size_t
cm_arena_take_idle(cm_pool *p, cm_page *out, size_t want)
{
    cm_bins *sets[2] = {&p->small, &p->large};
    size_t got = 0;
    size_t i;
    size_t e;
    cm_arena *a;
    cm_blk *b;
    int s;
    int k;

    for (s = 0; s < 2 && got < want && p->idle_pages > 0; s++) {
        for (k = 0; k < CM_POOL_NBINS && got < want; k++) {
            if (!(sets[s]->used[k / 64] & ((uint64_t)1 << (k % 64)))) {
                continue;
            }
            for (b = sets[s]->head[k]; b != NULL && got < want;
                 b = b->fnext) {
                if ((a = b->seg->arena) == NULL) {
                    continue;
                }
                cm_arena_pages(p, b, &i, &e);
                /* Only a block over an idle page is asked whether it is
                 * quiet (which may query its stream). */
                while (i <= e && (a->h[i] == 0 || a->users[i] != 0)) {
                    i++;
                }
                if (i > e || !cm_blk_quiet(p, b)) {
                    continue;
                }
                for (; i <= e && got < want; i++) {
                    if (a->h[i] != 0 && a->users[i] == 0
                        && cm_page_quiet(p, a, i, b)) {
                        out[got].a = a;
                        out[got].i = i;
                        out[got].h = a->h[i];
                        got++;
                        a->h[i] = 0;
                        p->idle_pages--;
                    }
                }
            }
        }
    }
    if (p->idle_pages < p->idle_low) {
        p->idle_low = p->idle_pages;
    }
    return got;
}

/* Whether Python host callbacks are in flight.  Then no page is
 * unmapped: should cuMemUnmap wait for the device, as cuMemFree does, it
 * would wait for a callback that may be waiting for this thread. */
static int
cm_arena_host_waits(void)
{
    return __atomic_load_n(&cm_pycb_live, __ATOMIC_ACQUIRE) > 0;
}

/* How many pages p may make rather than move idle ones: up to its
 * peak, or its blocks' peak use and the headroom, whichever is more, or
 * a little past that while few pages are idle, within its limit and the
 * process's (mutex held). */
static size_t
cm_arena_room(cm_context *ctx, const cm_pool *p)
{
    size_t top = p->peak_used + (p->peak_used >> CM_ARENA_HEADROOM_SHIFT);
    size_t room;
    size_t slack = (p->peak_reserved >> 6) > ((size_t)2 << p->gshift)
                       ? p->peak_reserved >> 6
                       : (size_t)2 << p->gshift;
    size_t lim = cm_limit_of(ctx->device->id);
    size_t used;

    if (top < p->peak_reserved) {
        top = p->peak_reserved;
    }
    room = top > p->reserved ? top - p->reserved : 0;

    /* While few pages are idle (a 64th of the peak, at least two), new
     * ones are made rather than those moved: the pool then holds at most
     * that many pages more than its blocks need, and memory that keeps
     * being freed in one place and wanted in another (requests that
     * alternate between small and large) is not moved at every turn. */
    if ((p->idle_pages << p->gshift) <= slack && slack > room) {
        room = slack;
    }

    if (p->limit != 0) {
        size_t held = cm_pool_held(p);
        size_t r = p->limit > held ? p->limit - held : 0;

        room = r < room ? r : room;
    }
    if (lim != 0) {
        used = cm_limit_used(ctx);
        used = lim > used ? lim - used : 0;
        room = used < room ? used : room;
    }
    return room >> p->gshift;
}

/* Whether n more pages cannot be had at all: more than the idle pages
 * and the new memory the pool's limit and the process's still allow
 * (mutex held).  Such a request is refused before anything is mapped:
 * mapping pages up to the limit, then undoing, took 0.25 s a refusal on
 * an H100 (a request of twice a 20 GB limit).  The device's own free
 * memory is not asked (a driver call): a request past it fails at
 * cuMemCreate as before. */
static int
cm_arena_out_of_reach(cm_context *ctx, const cm_pool *p, size_t n)
{
    size_t lim = cm_limit_of(ctx->device->id);
    size_t fresh = SIZE_MAX;

    if (p->limit == 0 && lim == 0) {
        return 0;
    }
    if (p->limit != 0) {
        size_t held = cm_pool_held(p);

        fresh = p->limit > held ? (p->limit - held) >> p->gshift : 0;
    }
    if (lim != 0) {
        size_t used = cm_limit_used(ctx);
        size_t r = lim > used ? (lim - used) >> p->gshift : 0;

        fresh = r < fresh ? r : fresh;
    }
    return n > fresh && n - fresh > p->idle_pages;
}

int
cm_arena_cannot_serve(cm_context *ctx, const cm_pool *p, size_t size)
{
    /* At least this many pages, of which at most the idle ones and the
     * two at its ends have memory already. */
    size_t pages = size >> p->gshift;
    size_t mapped = p->idle_pages + 2;

    return pages > mapped
           && cm_arena_out_of_reach(ctx, p, pages - mapped);
}

/* The GIL released if this thread holds it (g->ts NULL otherwise). */
static void
cm_arena_gil_drop(cm_gil_saved *g)
{
    g->ts = NULL;
    g->probe = 0;
    g->epoch = 0;
    if (PyGILState_Check()) {
        cm_gil_drop(g);
    }
}

static CUresult
cm_page_map(cm_pool *p, CUdeviceptr at, CUmemGenericAllocationHandle h)
{
    return CM_CU_RAW(MemMap, (at, (size_t)1 << p->gshift, 0, h, 0));
}

/* Read-write access to [at, at + n) for the devices of mask (vmu
 * held). */
static CUresult
cm_pages_access_for(CUdeviceptr at, size_t n, uint64_t mask)
{
    CUmemAccessDesc d[CM_MAX_DEVICES];
    size_t k = 0;
    int i;

    memset(d, 0, sizeof(d));
    for (i = 0; i < CM_MAX_DEVICES && i < 64; i++) {
        if ((mask >> i) & 1) {
            d[k].location.type = CU_MEM_LOCATION_TYPE_DEVICE;
            d[k].location.id = i;
            d[k].flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
            k++;
        }
    }
    return CM_CU_RAW(MemSetAccess, (at, n, d, k));
}

/* Pages just mapped: access for the pool's device and the peers it is
 * open to (vmu held). */
static CUresult
cm_pages_access(cm_pool *p, CUdeviceptr at, size_t n)
{
    return cm_pages_access_for(at, n,
                               ((uint64_t)1 << p->device) | p->open_to);
}

/* New physical memory for one page, counted against the limits; 0 when
 * refused. */
static CUresult
cm_page_make(cm_context *ctx, cm_pool *p, CUmemGenericAllocationHandle *h)
{
    CUmemAllocationProp prop;
    size_t gran = (size_t)1 << p->gshift;
    size_t held;
    CUresult rc;

    cm_mu_lock(&p->mu);
    held = cm_pool_held(p);
    if (p->limit != 0 && (held > p->limit || gran > p->limit - held)) {
        cm_mu_unlock(&p->mu);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    __atomic_store_n(&p->reserved, p->reserved + gran, __ATOMIC_RELAXED);
    if (p->reserved > p->peak_reserved) {
        p->peak_reserved = p->reserved;
    }
    p->n_made++;
    cm_mu_unlock(&p->mu);
    if (!cm_limit_take(ctx, gran)) {
        rc = CUDA_ERROR_OUT_OF_MEMORY;
    }
    else {
        memset(&prop, 0, sizeof(prop));
        prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
        prop.requestedHandleTypes =
            p->vshare ? CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
                      : CU_MEM_HANDLE_TYPE_NONE;
        prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        prop.location.id = p->device;
        rc = CM_CU_RAW(MemCreate, (h, gran, &prop, 0));
        if (rc != CUDA_SUCCESS) {
            cm_limit_give(ctx, gran);
        }
    }
    if (rc != CUDA_SUCCESS) {
        cm_mu_lock(&p->mu);
        __atomic_store_n(&p->reserved, p->reserved - gran,
                         __ATOMIC_RELAXED);
        p->n_made--;
        cm_mu_unlock(&p->mu);
    }
    return rc;
}

/* Give one page's memory (unmapped) back to the device, and close its
 * exported descriptor, if any. */
static void
cm_page_drop(cm_context *ctx, cm_pool *p, CUmemGenericAllocationHandle h)
{
    size_t gran = (size_t)1 << p->gshift;
    int fd;

    /* Out of the table first: the driver may give h's value to new
     * memory once it is released. */
    cm_mu_lock(&p->mu);
    fd = cm_vshare_take(p, h);
    cm_mu_unlock(&p->mu);
    if (fd >= 0) {
        cm_fd_withdraw(fd);
        close(fd);
    }
    (void)CM_CU_RAW(MemRelease, (h));
    cm_limit_give(ctx, gran);
    cm_mu_lock(&p->mu);
    __atomic_store_n(&p->reserved, p->reserved - gran, __ATOMIC_RELAXED);
    p->n_released++;
    cm_mu_unlock(&p->mu);
}

/* ------------------------------------------------------------------ */
/* Backing, growing, releasing (no mutex held)                         */
/* ------------------------------------------------------------------ */

/* Unmap the *n pages of out[] taken out of the tables (idle, quiet)
 * from their old place.  On a failure, those from the failing one on
 * go back where they were, idle again, *n becomes how many were
 * unmapped, and the driver's error is returned. */
static CUresult
cm_pages_unmap(cm_context *ctx, cm_pool *p, cm_page *out, size_t *n)
{
    size_t gran = (size_t)1 << p->gshift;
    size_t i;
    size_t j;
    CUresult rc = CUDA_SUCCESS;

    (void)ctx;
    for (i = 0; i < *n; i++) {
        rc = CM_CU_RAW(MemUnmap, (out[i].a->base
                                  + ((CUdeviceptr)out[i].i << p->gshift),
                                  gran));
        if (rc != CUDA_SUCCESS) {
            break;
        }
    }
    if (i < *n) {
        cm_mu_lock(&p->mu);
        for (j = i; j < *n; j++) {
            out[j].a->h[out[j].i] = out[j].h;
            p->idle_pages++;
        }
        cm_mu_unlock(&p->mu);
        *n = i;
    }
    return rc;
}

CUresult
cm_arena_back(cm_context *ctx, cm_pool *p, cm_blk *b)
{
    size_t gran = (size_t)1 << p->gshift;
    cm_arena *a;
    cm_page *moved = NULL;
    size_t *need = NULL;
    CUmemGenericAllocationHandle *got = NULL;
    size_t first;
    size_t last;
    size_t nneed = 0;
    size_t nmoved = 0;
    size_t nmap = 0;
    size_t mv = 0;        /* moved pages used so far */
    size_t n;
    size_t i;
    int more = 0;
    int relaxed;
    CUresult rc = CUDA_SUCCESS;
    cm_gil_saved g;

    cm_capture_relax_always(&relaxed);
    cm_arena_gil_drop(&g);
    cm_mu_lock(&p->vmu);
    cm_mu_lock(&p->mu);
    if (p->dead) {
        rc = CUDA_ERROR_CONTEXT_IS_DESTROYED;
        goto out_mu;
    }
    a = b->seg->arena;
    cm_arena_pages(p, b, &first, &last);
    need = malloc((last - first + 1) * sizeof(*need));
    got = malloc((last - first + 1) * sizeof(*got));
    moved = malloc((last - first + 1) * sizeof(*moved));
    if (need == NULL || got == NULL || moved == NULL) {
        rc = CUDA_ERROR_OUT_OF_MEMORY;
        goto out_mu;
    }
    for (i = first; i <= last; i++) {
        if (a->h[i] == 0) {
            need[nneed++] = i;
        }
    }
    if (nneed > 0 && cm_arena_out_of_reach(ctx, p, nneed)) {
        rc = CUDA_ERROR_OUT_OF_MEMORY;
        goto out_mu;
    }
    if (nneed > 0 && !cm_arena_host_waits()) {
        size_t room = cm_arena_room(ctx, p);

        /* Idle pages move only for what new memory would take past the
         * room: below the pool's peak new memory costs the device nothing
         * it has not given before. */
        if (nneed > room) {
            nmoved = cm_arena_take_idle(p, moved, nneed - room);
        }
    }
    cm_mu_unlock(&p->mu);
    /* Idle pages move: unmapped where they were (their work is done). */
    if ((rc = cm_pages_unmap(ctx, p, moved, &nmoved)) != CUDA_SUCCESS) {
        goto undo;
    }
    for (i = 0; i < nneed; i++) {
        CUdeviceptr at = a->base + ((CUdeviceptr)need[i] << p->gshift);

        if (mv == nmoved) {
            rc = cm_page_make(ctx, p, &got[i]);
            if (rc == CUDA_ERROR_OUT_OF_MEMORY && !more
                && !cm_arena_host_waits()) {
                /* No new memory (a limit, or the device is full): the
                 * rest from idle pages that are quiet now, if any. */
                more = 1;
                cm_mu_lock(&p->mu);
                nmoved += cm_arena_take_idle(p, moved + nmoved, nneed - i);
                cm_mu_unlock(&p->mu);
                n = nmoved - mv;
                if ((rc = cm_pages_unmap(ctx, p, moved + mv, &n))
                    != CUDA_SUCCESS) {
                    nmoved = mv + n;
                    goto undo;
                }
                rc = CUDA_ERROR_OUT_OF_MEMORY;
            }
            if (mv == nmoved && rc != CUDA_SUCCESS) {
                break;
            }
        }
        if (mv < nmoved) {
            got[i] = moved[mv++].h;
        }
        rc = cm_page_map(p, at, got[i]);
        if (rc != CUDA_SUCCESS) {
            cm_page_drop(ctx, p, got[i]);
            break;
        }
        nmap++;
    }
    if (rc == CUDA_SUCCESS && nneed > 0) {
        CUdeviceptr lo = a->base + ((CUdeviceptr)need[0] << p->gshift);
        CUdeviceptr hi = a->base + ((CUdeviceptr)(need[nneed - 1] + 1)
                                    << p->gshift);

        /* Pages between the first and last new one are the block's:
         * all mapped now. */
        rc = cm_pages_access(p, lo, (size_t)(hi - lo));
    }
    if (rc != CUDA_SUCCESS) {
undo:
        /* Undo: the pages mapped here go back to the device, and so do
         * the moved ones not used (unmapped from their old place). */
        for (i = 0; i < nmap; i++) {
            (void)CM_CU_RAW(MemUnmap,
                            (a->base + ((CUdeviceptr)need[i] << p->gshift),
                             gran));
            cm_page_drop(ctx, p, got[i]);
        }
        for (i = mv; i < nmoved; i++) {
            cm_page_drop(ctx, p, moved[i].h);
        }
        if (rc == CUDA_SUCCESS) {
            rc = CUDA_ERROR_UNKNOWN;
        }
        goto out;
    }
    cm_mu_lock(&p->mu);
    for (i = 0; i < nneed; i++) {
        /* The block is in use: its pages are not idle. */
        a->h[need[i]] = got[i];
    }
    if (nneed > 0 && need[nneed - 1] >= a->hi) {
        a->hi = need[nneed - 1] + 1;
    }
    p->n_moved += nmoved;
out_mu:
    cm_mu_unlock(&p->mu);
out:
    cm_mu_unlock(&p->vmu);
    cm_gil_take(&g);
    cm_capture_unrelax(relaxed);
    free(need);
    free(got);
    free(moved);
    return rc;
}

int
cm_arena_open(cm_pool *p, int dev)
{
    typedef struct {
        CUdeviceptr at;
        size_t n;
    } run;
    run *runs = NULL;
    size_t nruns = 0;
    size_t cap = 0;
    size_t i;
    cm_seg *s;
    int relaxed;
    int nomem = 0;
    CUresult rc = CUDA_SUCCESS;
    cm_gil_saved g;

    if (dev == p->device || dev < 0 || dev >= CM_MAX_DEVICES) {
        return 0;
    }
    cm_capture_relax_always(&relaxed);
    cm_arena_gil_drop(&g);
    cm_mu_lock(&p->vmu);
    /* Pages are mapped under vmu only: from here on with dev's access,
     * and those mapped now are listed below. */
    p->open_to |= (uint64_t)1 << dev;
    cm_mu_lock(&p->mu);
    for (s = p->dead ? NULL : p->segs; s != NULL && rc == CUDA_SUCCESS;
         s = s->next) {
        cm_arena *a = s->arena;

        for (i = 0; a != NULL && i < a->hi; i++) {
            if (a->h[i] == 0) {
                continue;
            }
            if (nruns > 0 && runs[nruns - 1].at + runs[nruns - 1].n
                                 == a->base + ((CUdeviceptr)i << p->gshift)) {
                runs[nruns - 1].n += (size_t)1 << p->gshift;
                continue;
            }
            if (nruns == cap) {
                run *more = realloc(runs, (cap = cap ? cap * 2 : 16)
                                              * sizeof(*runs));

                if (more == NULL) {
                    nomem = 1;
                    rc = CUDA_ERROR_OUT_OF_MEMORY;
                    break;
                }
                runs = more;
            }
            runs[nruns].at = a->base + ((CUdeviceptr)i << p->gshift);
            runs[nruns].n = (size_t)1 << p->gshift;
            nruns++;
        }
    }
    cm_mu_unlock(&p->mu);
    for (i = 0; i < nruns && rc == CUDA_SUCCESS; i++) {
        rc = cm_pages_access_for(runs[i].at, runs[i].n, (uint64_t)1 << dev);
    }
    cm_mu_unlock(&p->vmu);
    cm_gil_take(&g);
    cm_capture_unrelax(relaxed);
    free(runs);
    if (nomem) {
        /* Host memory for the list of runs, not the device's. */
        PyErr_NoMemory();
        return -1;
    }
    return cm_cu_check(rc, "cuMemSetAccess");
}

CUresult
cm_arena_add(cm_context *ctx, cm_pool *p, size_t size, int small)
{
    size_t gran = (size_t)1 << p->gshift;
    size_t want = ctx->total_mem;
    CUdeviceptr base = 0;
    cm_arena *a = NULL;
    cm_seg *seg = NULL;
    cm_blk *b = NULL;
    CUresult rc;
    cm_gil_saved g;

    if (want < size) {
        want = size;
    }
    if (want < CM_ARENA_MIN_PAGES * gran) {
        want = CM_ARENA_MIN_PAGES * gran;
    }
    want = cm_round(want, gran);
    a = calloc(1, sizeof(*a));
    seg = calloc(1, sizeof(*seg));
    b = calloc(1, sizeof(*b));
    if (a != NULL) {
        a->npages = want >> p->gshift;
        a->h = calloc(a->npages, sizeof(*a->h));
        a->users = calloc(a->npages, sizeof(*a->users));
    }
    if (a == NULL || seg == NULL || b == NULL || a->h == NULL
        || a->users == NULL) {
        rc = CUDA_ERROR_OUT_OF_MEMORY;
        goto fail;
    }
    cm_arena_gil_drop(&g);
    rc = CM_CU_RAW(MemAddressReserve, (&base, want, gran, 0, 0));
    cm_gil_take(&g);
    if (rc != CUDA_SUCCESS) {
        goto fail;
    }
    a->base = base;
    a->size = want;
    seg->base = base;
    seg->size = want;
    seg->small = small;
    seg->arena = a;
    seg->first = b;
    b->ptr = base;
    b->size = want;
    b->seg = seg;
    b->stream = CM_POOL_ANY;
    cm_arena_gil_drop(&g);
    cm_mu_lock(&p->mu);
    if (p->dead) {
        cm_mu_unlock(&p->mu);
        (void)CM_CU_RAW(MemAddressFree, (base, want));
        cm_gil_take(&g);
        rc = CUDA_ERROR_CONTEXT_IS_DESTROYED;
        goto fail;
    }
    seg->next = p->segs;
    if (p->segs != NULL) {
        p->segs->prev = seg;
    }
    p->segs = seg;
    cm_pool_free_add(p, b);
    cm_mu_unlock(&p->mu);
    cm_gil_take(&g);
    return CUDA_SUCCESS;
fail:
    if (a != NULL) {
        free(a->h);
        free(a->users);
    }
    free(a);
    free(seg);
    free(b);
    return rc;
}

/* CLOCK_MONOTONIC_COARSE in ns (a few ms of resolution: enough for
 * release intervals, and read on every release while a pass is due). */
static uint64_t
cm_arena_now(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

CUresult
cm_arena_release(cm_context *ctx, cm_pool *p, size_t keep, int wait)
{
    size_t gran = (size_t)1 << p->gshift;
    size_t kp = keep >> p->gshift;
    cm_page *out = NULL;
    size_t n = 0;
    size_t want;
    size_t low;
    size_t i;
    uint64_t now = 0;
    int relaxed;
    CUresult rc = CUDA_SUCCESS;
    CUresult r;
    cm_gil_saved g;

    if (!wait) {
        if (cm_arena_host_waits()) {
            return CUDA_SUCCESS;    /* release_due stays: a later one */
        }
        now = cm_arena_now();
        if (now < __atomic_load_n(&p->release_next, __ATOMIC_RELAXED)) {
            return CUDA_SUCCESS;    /* not yet: the pass after */
        }
    }
    cm_capture_relax_always(&relaxed);
    cm_arena_gil_drop(&g);
    if (wait) {
        cm_mu_lock(&p->vmu);
    }
    else if (pthread_mutex_trylock(&p->vmu) != 0) {
        cm_gil_take(&g);
        cm_capture_unrelax(relaxed);
        return CUDA_SUCCESS;
    }
    else {
        cm_mu_depth++;
    }
    cm_mu_lock(&p->mu);
    if (p->dead) {
        want = 0;
    }
    else if (wait) {
        want = p->idle_pages - (kp < p->idle_pages ? kp : p->idle_pages);
    }
    else {
        /* A pass: only what stayed idle since the last one goes (memory
         * that cycles between uses stays), unless passes are not spaced
         * (interval 0): then what is idle now. */
        low = p->release_ns == 0 || p->idle_low > p->idle_pages
                  ? p->idle_pages
                  : p->idle_low;
        want = low > kp ? low - kp : 0;
        __atomic_store_n(&p->release_next, now + p->release_ns,
                         __ATOMIC_RELAXED);
    }
    if (want > 0 && (out = malloc(want * sizeof(*out))) != NULL) {
        n = cm_arena_take_idle(p, out, want);
    }
    /* The next interval starts now. */
    p->idle_low = p->idle_pages;
    p->release_due = (p->idle_pages << p->gshift) > keep;
    if (n < want && out != NULL) {
        /* Some are not quiet yet: a later pass looks again. */
        p->release_due = 1;
    }
    cm_mu_unlock(&p->mu);
    for (i = 0; i < n; i++) {
        r = CM_CU_RAW(MemUnmap, (out[i].a->base
                                 + ((CUdeviceptr)out[i].i << p->gshift),
                                 gran));
        if (r != CUDA_SUCCESS) {
            /* Still mapped there: idle again. */
            cm_mu_lock(&p->mu);
            out[i].a->h[out[i].i] = out[i].h;
            p->idle_pages++;
            cm_mu_unlock(&p->mu);
            if (rc == CUDA_SUCCESS) {
                rc = r;
            }
            continue;
        }
        cm_page_drop(ctx, p, out[i].h);
    }
    cm_mu_unlock(&p->vmu);
    cm_gil_take(&g);
    cm_capture_unrelax(relaxed);
    free(out);
    return rc;
}

CUresult
cm_arena_free_seg(cm_context *ctx, cm_seg *g, int driver)
{
    cm_arena *a = g->arena;
    size_t gran;
    size_t i;
    CUresult first = CUDA_SUCCESS;
    CUresult rc;

    gran = a->npages > 0 ? a->size / a->npages : 0;
    for (i = 0; driver && i < a->npages; i++) {
        if (a->h[i] == 0) {
            continue;
        }
        rc = CM_CU_RAW(MemUnmap, (a->base + i * gran, gran));
        if (rc == CUDA_SUCCESS) {
            rc = CM_CU_RAW(MemRelease, (a->h[i]));
        }
        cm_limit_give(ctx, gran);
        if (first == CUDA_SUCCESS) {
            first = rc;
        }
    }
    if (driver) {
        rc = CM_CU_RAW(MemAddressFree, (a->base, a->size));
        if (first == CUDA_SUCCESS) {
            first = rc;
        }
    }
    free(a->h);
    free(a->users);
    free(a);
    free(g);
    return first;
}
