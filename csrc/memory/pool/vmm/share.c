/* SPDX-License-Identifier: MIT */
/*
 * memory/pool/vmm/share.c: exporting the pages of the pool on virtual memory
 * to other processes (IPC).
 *
 * Owns: each pool's table of exported pages (struct cm_vshare): the
 * physical memory of a page (its CUmemGenericAllocationHandle), the
 * POSIX file descriptor cuMemExportToShareableHandle gave for it, and a
 * name for that export (an id unique in this process).  An importer
 * takes the descriptor from this process (pidfd_getfd: features/ipc*.c),
 * imports it and maps it into a range of its own.
 *
 * A page's descriptor is made on its first export and stays open, in
 * this table, until the page's memory is given back (arena.c's release
 * passes, trim, the pool's end), when it is closed; exports of other
 * arrays on the same page name the same descriptor.  The descriptor
 * follows the memory, not the address: an idle page moved elsewhere
 * keeps it.  The page rule: pages under a block in use never move and
 * are never given back (arena.c), so while the exported array lives (an
 * IpcHandle's base keeps it alive) its pages stay where they are, with
 * their descriptors open for importers to take.  Once it is freed they
 * are idle pages like any other.  The driver keeps physical memory until
 * every handle, shareable descriptor and mapping of it is gone, so an
 * importer that mapped the pages keeps reading them after this process
 * gave them back; as with every CUDA IPC handle, memory that the
 * exporter freed may serve its next allocation meanwhile.
 *
 * Locks and the GIL: the table is guarded by the pool's mutex (mu).  An
 * export gives up the GIL (cm_gil_drop), then holds vmu (before mu, as
 * arena.c's mappers do) from its look at the pages to the end of its
 * driver calls, so no page it exports moves or is given back meanwhile;
 * mu is never held across cuMemExportToShareableHandle.  Nothing of
 * Python is touched until the GIL is back (cm_gil_take).  The table's
 * close takes no lock: the pool is dead.
 */
#include "memory/pool/vmm/vmm.h"

#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

/* One exported page. */
typedef struct {
    CUmemGenericAllocationHandle h;  /* its memory; 0: an empty slot */
    int fd;               /* its descriptor here */
    uint64_t id;          /* the export's name */
} cm_vslot;

/* A pool's exported pages: open addressing, linear probing. */
struct cm_vshare {
    cm_vslot *slot;       /* cap slots */
    size_t cap;           /* a power of two */
    size_t n;             /* slots in use, at most half of cap */
    uint64_t next_id;     /* the next export's name (random start) */
};

static size_t
cm_vshare_home(const cm_vshare *t, CUmemGenericAllocationHandle h)
{
    return (size_t)(((uint64_t)h * 0x9E3779B97F4A7C15ull) >> 17)
           & (t->cap - 1);
}

/* The slot of h, or NULL (mutex held). */
static cm_vslot *
cm_vshare_find(cm_vshare *t, CUmemGenericAllocationHandle h)
{
    size_t i;

    if (t == NULL) {
        return NULL;
    }
    for (i = cm_vshare_home(t, h); t->slot[i].h != 0;
         i = (i + 1) & (t->cap - 1)) {
        if (t->slot[i].h == h) {
            return &t->slot[i];
        }
    }
    return NULL;
}

/* Put s (whose h is not in t) into t, which has room (mutex held). */
static void
cm_vshare_put(cm_vshare *t, const cm_vslot *s)
{
    size_t i = cm_vshare_home(t, s->h);

    while (t->slot[i].h != 0) {
        i = (i + 1) & (t->cap - 1);
    }
    t->slot[i] = *s;
    t->n++;
}

/* Make room in p's table for one more page: 0, or -1 when out of host
 * memory (mutex held). */
static int
cm_vshare_room(cm_pool *p)
{
    cm_vshare *t = p->shares;
    cm_vslot *old;
    size_t cap;
    size_t i;

    if (t == NULL) {
        t = calloc(1, sizeof(*t));
        if (t == NULL) {
            return -1;
        }
        t->slot = calloc(16, sizeof(*t->slot));
        if (t->slot == NULL) {
            free(t);
            return -1;
        }
        t->cap = 16;
        if (getrandom(&t->next_id, sizeof(t->next_id), GRND_NONBLOCK)
            != (ssize_t)sizeof(t->next_id)) {
            t->next_id = (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 32)
                         ^ (uint64_t)(uintptr_t)t;
        }
        p->shares = t;
    }
    if (2 * (t->n + 1) <= t->cap) {
        return 0;
    }
    old = t->slot;
    cap = t->cap;
    t->slot = calloc(2 * cap, sizeof(*t->slot));
    if (t->slot == NULL) {
        t->slot = old;
        return -1;
    }
    t->cap = 2 * cap;
    t->n = 0;
    for (i = 0; i < cap; i++) {
        if (old[i].h != 0) {
            cm_vshare_put(t, &old[i]);
        }
    }
    free(old);
    return 0;
}

int
cm_vshare_take(cm_pool *p, CUmemGenericAllocationHandle h)
{
    cm_vshare *t = p->shares;
    cm_vslot *s = cm_vshare_find(t, h);
    size_t i;
    size_t j;
    size_t k;
    int fd;

    if (s == NULL) {
        return -1;
    }
    fd = s->fd;
    /* Backward-shift deletion: the entries after it that probed past
     * its slot move up. */
    i = (size_t)(s - t->slot);
    j = i;
    for (;;) {
        t->slot[i].h = 0;
        for (;;) {
            j = (j + 1) & (t->cap - 1);
            if (t->slot[j].h == 0) {
                t->n--;
                return fd;
            }
            k = cm_vshare_home(t, t->slot[j].h);
            /* Stays unless its home lies cyclically in (i, j]. */
            if (i <= j ? (i < k && k <= j) : (i < k || k <= j)) {
                continue;
            }
            break;
        }
        t->slot[i] = t->slot[j];
        i = j;
    }
}

void
cm_vshare_close(cm_pool *p)
{
    cm_vshare *t = p->shares;
    size_t i;

    if (t == NULL) {
        return;
    }
    p->shares = NULL;
    for (i = 0; i < t->cap; i++) {
        if (t->slot[i].h != 0) {
            cm_fd_withdraw(t->slot[i].fd);
            close(t->slot[i].fd);
        }
    }
    free(t->slot);
    free(t);
}

/* ------------------------------------------------------------------ */
/* Export                                                              */
/* ------------------------------------------------------------------ */

/* The block of segment g that contains addr, or NULL (mutex held). */
static cm_blk *
cm_vshare_block(cm_seg *g, CUdeviceptr addr)
{
    cm_blk *b;

    for (b = g->first; b != NULL; b = b->next) {
        if (addr - b->ptr < b->size) {
            return b;
        }
    }
    return NULL;
}

/* How an export ended. */
enum {
    CM_VX_OK = 0,
    CM_VX_NOT_OURS,       /* not memory of the pool's arenas */
    CM_VX_NOT_IN_USE,     /* not inside one block in use */
    CM_VX_NO_SHARE,       /* pages made without a shareable type */
    CM_VX_NO_MEMORY,      /* out of host memory */
    CM_VX_DRIVER          /* cuMemExportToShareableHandle failed */
};

int
cm_pool_export_pages(cm_context *ctx, CUdeviceptr addr, size_t span,
                     cm_vmm_pages *out)
{
    cm_pool *p = ctx->pool;
    cm_vshare *t;
    cm_vslot *s;
    cm_vslot made;
    cm_arena *a = NULL;
    cm_seg *g;
    cm_blk *b;
    CUmemGenericAllocationHandle *hs = NULL;
    int *fds = NULL;
    uint64_t *ids = NULL;
    CUdeviceptr base = 0;
    size_t first = 0;
    size_t n = 0;
    size_t i;
    int why = CM_VX_OK;
    CUresult rc = CUDA_SUCCESS;
    int got;
    cm_gil_saved gd;

    if (p == NULL || !p->vmm) {
        return 0;
    }
    gd.ts = NULL;
    gd.probe = 0;
    cm_gil_drop(&gd);
    cm_mu_lock(&p->vmu);
    cm_mu_lock(&p->mu);
    why = CM_VX_NOT_OURS;
    for (g = p->dead ? NULL : p->segs; g != NULL; g = g->next) {
        if (g->arena != NULL && addr - g->base < g->size) {
            a = g->arena;
            why = CM_VX_NOT_IN_USE;
            break;
        }
    }
    b = a != NULL ? cm_vshare_block(g, addr) : NULL;
    if (b != NULL && !b->free && !b->pending && !b->unbacked
        && (span == 0 || span <= b->ptr + b->size - addr)) {
        why = p->vshare ? CM_VX_OK : CM_VX_NO_SHARE;
    }
    if (why == CM_VX_OK) {
        if (span == 0) {
            span = b->ptr + b->size - addr;
        }
        first = (size_t)(addr - a->base) >> p->gshift;
        n = ((size_t)(addr + span - 1 - a->base) >> p->gshift) - first + 1;
        base = a->base + ((CUdeviceptr)first << p->gshift);
        hs = malloc(n * sizeof(*hs));
        fds = malloc(n * sizeof(*fds));
        ids = malloc(n * sizeof(*ids));
        if (hs == NULL || fds == NULL || ids == NULL) {
            why = CM_VX_NO_MEMORY;
        }
    }
    for (i = 0; why == CM_VX_OK && i < n; i++) {
        hs[i] = a->h[first + i];
        if (hs[i] == 0) {
            /* Not mapped: not memory in use after all. */
            why = CM_VX_NOT_IN_USE;
            break;
        }
        s = cm_vshare_find(p->shares, hs[i]);
        fds[i] = s != NULL ? s->fd : -1;
        ids[i] = s != NULL ? s->id : 0;
    }
    cm_mu_unlock(&p->mu);
    /* The pages not yet exported: vmu keeps them where they are. */
    for (i = 0; why == CM_VX_OK && i < n; i++) {
        if (fds[i] >= 0) {
            continue;
        }
        got = -1;
        rc = CM_CU_RAW(MemExportToShareableHandle,
                       (&got, hs[i], CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
                        0));
        if (rc != CUDA_SUCCESS) {
            why = CM_VX_DRIVER;
            break;
        }
        cm_mu_lock(&p->mu);
        if (cm_vshare_room(p) < 0) {
            cm_mu_unlock(&p->mu);
            close(got);
            why = CM_VX_NO_MEMORY;
            break;
        }
        t = p->shares;
        made.h = hs[i];
        made.fd = got;
        made.id = t->next_id++;
        cm_vshare_put(t, &made);
        cm_mu_unlock(&p->mu);
        /* Also over this process's socket (memory/fdserve.c). */
        (void)cm_fd_offer(got, made.id);
        fds[i] = got;
        ids[i] = made.id;
    }
    cm_mu_unlock(&p->vmu);
    cm_gil_take(&gd);
    free(hs);
    switch (why) {
    case CM_VX_OK:
        out->base = base;
        out->page = (size_t)1 << p->gshift;
        out->n = n;
        out->fds = fds;
        out->ids = ids;
        return 1;
    case CM_VX_NOT_OURS:
        return 0;
    case CM_VX_NOT_IN_USE:
        PyErr_Format(PyExc_ValueError,
                     "cannot export this memory through IPC: the range at "
                     "0x%llx (%zu bytes) is not inside one allocation of "
                     "the pool manager in use", (unsigned long long)addr,
                     span);
        break;
    case CM_VX_NO_SHARE:
        (void)cm_raise_api_msg(
            CUDA_ERROR_NOT_SUPPORTED,
            PyUnicode_FromFormat(
                "cannot export this memory through IPC: the pool "
                "manager's memory on virtual memory (CUDAMEM_POOL_VMM=1) "
                "is made with cuMemCreate, which cuIpcGetMemHandle does "
                "not accept, and device %d cannot make its pages "
                "shareable (no POSIX file-descriptor handles); export "
                "from a process without CUDAMEM_POOL_VMM=1, or under the "
                "async manager", ctx->device->id));
        break;
    case CM_VX_NO_MEMORY:
        PyErr_NoMemory();
        break;
    default:
        (void)cm_cu_check(rc, "cuMemExportToShareableHandle");
        break;
    }
    free(fds);
    free(ids);
    return -1;
}
