/* SPDX-License-Identifier: MIT */
/*
 * sim.c: placeholder until the CPU simulator lands; it models nothing, so
 * every entry point reports CUDA_ERROR_NOT_SUPPORTED.
 */
#include "cm.h"

void
cm_sim_fill(cm_cu_table *t, int per_thread)
{
    (void)t;
    (void)per_thread;
}

int
cm_sim_inject(int idx, long nth, CUresult code)
{
    (void)idx;
    (void)nth;
    (void)code;
    return 0;
}
