/* SPDX-License-Identifier: MIT */
/*
 * sim/vmm.h: what sim/vmm.c (the VMM's objects) and sim/vmmfuncs.c (its
 * entry points) share: reservations, physical allocations and mappings,
 * and their lists.  Private to csrc/sim/.  Guarded by the simulator lock
 * (sim.lock).
 */
#ifndef CM_SIM_VMM_H
#define CM_SIM_VMM_H

#include "sim/sim.h"

#include <stddef.h>
#include <stdint.h>

typedef struct sim_vphys sim_vphys;

typedef struct sim_vres sim_vres;

/* A physical allocation (cuMemCreate, or an import). */
struct sim_vphys {
    uint64_t id;            /* its CUmemGenericAllocationHandle value */
    int fd;                 /* the memfd holding its bytes */
    size_t size;            /* bytes, a multiple of SIM_VMM_GRANULE */
    int dev;                /* the device it lies on */
    size_t charged;         /* bytes charged to dev; 0 for an import */
    CUmemAllocationProp prop;  /* its properties, as queried */
    int refs;               /* handle references not yet released */
    size_t nmaps;           /* mappings of it, dying ones included */
    sim_vphys *next;        /* link in sim_vphys_list */
};

/* An address reservation (cuMemAddressReserve). */
struct sim_vres {
    uintptr_t base;         /* first byte */
    size_t size;            /* bytes */
    size_t nmaps;           /* mappings in it, dying ones included */
    sim_vres *next;         /* link in sim_vres_list */
};

/* One mapping (cuMemMap); its sim_alloc holds the address range. */
struct sim_vmap {
    sim_vphys *phys;        /* the memory mapped */
    sim_vres *res;          /* the reservation it lies in */
    size_t offset;          /* where in phys the mapping starts */
    uint64_t access;        /* bit d: device d may read and write */
};

/* Every physical allocation with a handle reference or a mapping left. */
extern sim_vphys *sim_vphys_list;

/* Every address reservation not yet freed. */
extern sim_vres *sim_vres_list;

/* Free p once no reference and no mapping is left. */
void sim_vphys_settle(sim_vphys *p);

/* The reservation containing address v, or NULL. */
sim_vres *sim_vres_of(uintptr_t v);

/* Put inaccessible, unbacked pages over [base, base + size) of a
 * reservation.  0, or -1 if the host refused. */
int sim_vmm_unback(uintptr_t base, size_t size);

/* Whether the mappings from a on cover [p, p + n) without a hole, all in
 * a's reservation and, if check, all accessible to device dev; p lies in
 * a. */
int sim_vmm_cover(const sim_alloc *a, uintptr_t p, size_t n, int dev,
                  int check);

#endif /* CM_SIM_VMM_H */
