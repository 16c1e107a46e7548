/* SPDX-License-Identifier: MIT */
/*
 * torch_floor.c: the cheapest allocator PyTorch's CUDAPluggableAllocator
 * can call, for the benchmark row that measures what that interface
 * itself costs (ops_interop.py, "torch.empty(256) [pluggable floor]").
 * It hands out blocks of one device region that the benchmark allocates
 * beforehand (floor_init): freed blocks of at most FLOOR_BLOCK bytes go
 * on a stack and come back first; larger ones are never reused.  One
 * thread, no stream ordering: a benchmark, not an allocator to use.
 * Compiled by the benchmark at run time (cc -O2 -shared -fPIC).
 */
#include <stddef.h>
#include <stdint.h>

#define FLOOR_BLOCK 4096
#define FLOOR_SLOTS 4096

static uintptr_t floor_base;
static size_t floor_size;
static size_t floor_used;
static void *floor_stack[FLOOR_SLOTS];
static int floor_top;

void
floor_init(uintptr_t base, size_t size)
{
    floor_base = base;
    floor_size = size;
    floor_used = 0;
    floor_top = 0;
}

void *
floor_alloc(ptrdiff_t size, int device, void *stream)
{
    size_t want;
    void *p;

    (void)device;
    (void)stream;
    if (size <= 0) {
        return NULL;
    }
    if ((size_t)size <= FLOOR_BLOCK && floor_top > 0) {
        return floor_stack[--floor_top];
    }
    want = (size_t)size <= FLOOR_BLOCK ? FLOOR_BLOCK
                                       : ((size_t)size + 511) & ~(size_t)511;
    if (want > floor_size - floor_used) {
        return NULL;
    }
    p = (void *)(floor_base + floor_used);
    floor_used += want;
    return p;
}

void
floor_free(void *ptr, ptrdiff_t size, int device, void *stream)
{
    (void)device;
    (void)stream;
    if (ptr != NULL && size > 0 && (size_t)size <= FLOOR_BLOCK
        && floor_top < FLOOR_SLOTS) {
        floor_stack[floor_top++] = ptr;
    }
}
