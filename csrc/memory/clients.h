/* SPDX-License-Identifier: MIT */
/*
 * memory/clients.h: the bytes other libraries hold through cudamem's
 * adapters, counted per device and per library (clients.c).  Private to
 * memory/: shared by clients.c and interop.c only (the owner of those
 * allocations counts them).  Guarded by the GIL.
 */
#ifndef CM_MEMORY_CLIENTS_H
#define CM_MEMORY_CLIENTS_H

#include "memory/memory.h"

/* The libraries an allocation can be tagged with (the "cudamem" entry of
 * by_client is the rest of the context's allocated bytes). */
enum {
    CM_CLIENT_CUPY = 0,
    CM_CLIENT_TORCH,
    CM_CLIENT_NUMBA,
    CM_CLIENT_N
};

extern const char *const cm_client_names[CM_CLIENT_N];

/* [device][client]: bytes held by live ClientAllocations.  NOTE: guarded
 * by the GIL. */
extern size_t cm_client_bytes[CM_MAX_DEVICES][CM_CLIENT_N];

#endif
