/* SPDX-License-Identifier: MIT */
/*
 * sim/poolmem.c: the memory of the simulator's memory pools: heap memory,
 * or for a shareable pool ranges of its memfd (the layout is described in
 * sim/sim.h, "Shareable memory pools: the memory"), made, marked live in
 * the memfd's words and given back; and the freeing of a destroyed pool
 * once nothing of it is left (sim_mempool_reap).  Split from
 * sim/mempool.c so that the allocation registry's release
 * (sim_alloc_release) calls down into it; the pools, their chunks and
 * their entry points are sim/mempool.c's.  Every function here runs with
 * the simulator lock (sim.lock) held and takes no lock itself.
 */
#include "driver/cu_table.h"
#include "sim/sim.h"

#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

/* The page size, as a 64-bit offset. */
uint64_t
sim_page(void)
{
    return (uint64_t)sysconf(_SC_PAGESIZE);
}

/* Record in mp's words that the allocation at data offset off is now
 * buffer serial (0: none).  0, or -1 when the write failed. */
int
sim_pool_mark(sim_mempool *mp, uint64_t off, uint64_t serial)
{
    off_t at = (off_t)(SIM_POOL_META + off / sim_page() * 8);

    return pwrite(mp->fd, &serial, sizeof(serial), at)
           == (ssize_t)sizeof(serial) ? 0 : -1;
}

/* New memory of charged bytes for pool mp: heap memory, or for a
 * shareable pool a fresh range of its memfd, mapped (*span its bytes,
 * *off its data offset).  NULL when out of memory. */
void *
sim_pool_mem_new(sim_mempool *mp, size_t charged, size_t *span,
                 uint64_t *off)
{
    uint64_t pg = sim_page();
    /* The data pages that have words below the data. */
    uint64_t most = (SIM_POOL_DATA - SIM_POOL_META) / 8 * pg;
    uint64_t n;
    void *mem = NULL;

    *span = 0;
    *off = 0;
    if (mp->fd < 0) {
        return posix_memalign(&mem, SIM_DEVICE_ALIGN, charged) == 0 ? mem
                                                                    : NULL;
    }
    n = ((uint64_t)charged + pg - 1) / pg * pg;
    if (n < charged || n > most || mp->next_off > most - n
        || ftruncate(mp->fd, (off_t)(SIM_POOL_DATA + mp->next_off + n))
               != 0) {
        return NULL;
    }
    mem = mmap(NULL, (size_t)n, PROT_READ | PROT_WRITE, MAP_SHARED, mp->fd,
               (off_t)(SIM_POOL_DATA + mp->next_off));
    if (mem == MAP_FAILED) {
        return NULL;
    }
    *span = (size_t)n;
    *off = mp->next_off;
    mp->next_off += n;
    return mem;
}

/* Unmap a pool's memory: span bytes of a memfd, or heap memory when
 * span is 0. */
void
sim_pool_mem_unmap(void *mem, size_t span)
{
    if (span != 0) {
        munmap(mem, span);
    }
    else {
        free(mem);
    }
}

/* Give the memory of a's shareable range back: not live any more, its
 * pages punched out of the memfd (importers that still map them read
 * zeros). */
void
sim_pool_mem_unshare(sim_mempool *mp, sim_alloc *a)
{
    (void)sim_pool_mark(mp, a->off, 0);
    (void)fallocate(mp->fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
                    (off_t)(SIM_POOL_DATA + a->off), (off_t)a->span);
}

/* Give back the memory of pool allocation a now (nothing queued can use
 * it). */
void
sim_pool_mem_release(sim_mempool *mp, sim_alloc *a)
{
    if (a->span != 0) {
        sim_pool_mem_unshare(mp, a);
    }
    sim_pool_mem_unmap((void *)a->base, a->span);
}

/* Free a made or imported pool once it is destroyed and nothing of it is
 * left; unlinks it. */
void
sim_mempool_reap(sim_mempool *mp)
{
    sim_mempool **pp;

    if (!mp->destroyed || mp->used != 0 || mp->cached != NULL
        || mp->nimports != 0) {
        return;
    }
    for (pp = &sim.pools; *pp != NULL; pp = &(*pp)->next) {
        if (*pp == mp) {
            *pp = mp->next;
            break;
        }
    }
    if (mp->fd >= 0) {
        close(mp->fd);
    }
    free(mp);
}
