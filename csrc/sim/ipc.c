/* SPDX-License-Identifier: MIT */
/*
 * sim/ipc.c: the simulator's interprocess memory (the section
 * "Interprocess memory" of sim/sim.h explains the model):
 * cuIpcGetMemHandle, cuIpcOpenMemHandle and what an allocation's release
 * must undo (sim_ipc_release).  cuIpcCloseMemHandle, a free, is
 * sim/memory.c's, over the registry's release.
 *
 * Locks and the GIL: both entry points take sim.lock after SIM_ENTER and
 * give it back before returning; no other lock.  The first export of an
 * allocation waits until no work is queued anywhere (sim_ipc_quiesce,
 * sim_drain: sim.lock released on sim.cond meanwhile, refused on a worker),
 * then writes the memfd and opens another process's under sim.lock.  The
 * GIL is never taken nor given up here.
 */
#include "driver/cu_table.h"
#include "sim/sim.h"

#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>


_Static_assert(sizeof(sim_ipc_key) <= CU_IPC_HANDLE_SIZE,
               "the key must fit in a CUipcMemHandle");

/* Every mapping this process imported and has not closed. */
static sim_ipc *sim_ipc_imports;

/* The memfd name of an exported allocation. */
static void
sim_ipc_name(char *buf, size_t n, uint64_t nonce, uint64_t id)
{
    snprintf(buf, n, "cudamem-sim-%016llx-%llu", (unsigned long long)nonce,
             (unsigned long long)id);
}

/* Wait until no operation is queued or running anywhere: all work
 * submitted before, and none submitted meanwhile.  The lock is released
 * while waiting. */
static CUresult
sim_ipc_quiesce(void)
{
    uint64_t g;
    CUresult rc;

    do {
        g = sim.gseq;
        rc = sim_drain(NULL);
        if (rc != CUDA_SUCCESS) {
            return rc;
        }
    } while (g != sim.gseq);
    return CUDA_SUCCESS;
}

/* Move the device allocation at base p into a memfd, in place. */
static CUresult
sim_ipc_share(uintptr_t p)
{
    char name[64];
    sim_alloc *a;
    sim_ipc *x;
    size_t span;
    size_t done = 0;
    ssize_t w;
    CUresult rc;
    int fd;

    rc = sim_ipc_quiesce();
    if (rc != CUDA_SUCCESS) {
        return rc;
    }
    /* It may have been freed, or shared, while the lock was released. */
    a = sim_alloc_find(p);
    if (a == NULL || a->base != p || a->kind != SIM_MEM_DEVICE) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    if (a->ipc != NULL) {
        return CUDA_SUCCESS;
    }
    (void)sim_nonce();
    x = calloc(1, sizeof(*x));
    if (x == NULL) {
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    span = sim_device_span(a->size);
    sim_ipc_name(name, sizeof(name), sim_ipc_nonce, a->id);
    fd = memfd_create(name, MFD_CLOEXEC);
    if (fd < 0 || ftruncate(fd, (off_t)span) != 0) {
        goto fail;
    }
    while (done < a->size) {
        w = pwrite(fd, (const char *)a->base + done, a->size - done,
                   (off_t)done);
        if (w < 0 && errno == EINTR) {
            continue;
        }
        if (w <= 0) {
            goto fail;
        }
        done += (size_t)w;
    }
    if (mmap((void *)a->base, span, PROT_READ | PROT_WRITE,
             MAP_SHARED | MAP_FIXED, fd, 0) == MAP_FAILED) {
        goto fail;
    }
#ifdef SIM_ASAN
    ASAN_POISON_MEMORY_REGION((char *)a->base + a->size, span - a->size);
#endif
    x->fd = fd;
    x->key.magic = SIM_IPC_MAGIC;
    x->key.pid = (uint32_t)getpid();
    x->key.fd = fd;
    x->key.dev = a->ctx->dev;
    x->key.nonce = sim_ipc_nonce;
    x->key.id = a->id;
    x->key.size = a->size;
    x->key.span = span;
    a->ipc = x;
    return CUDA_SUCCESS;
fail:
    rc = errno == EMFILE || errno == ENFILE || errno == ENOMEM
         ? CUDA_ERROR_OUT_OF_MEMORY : CUDA_ERROR_OPERATING_SYSTEM;
    if (fd >= 0) {
        close(fd);
    }
    free(x);
    return rc;
}

/* Undo what sim_ipc_share or an open did to a; from sim_alloc_release. */
void
sim_ipc_release(sim_alloc *a)
{
    sim_ipc *x = a->ipc;
    sim_ipc **pp;

    if (x->fd >= 0) {
        /* Private pages again, so the heap may reuse the addresses.  If
         * that fails the shared pages stay: still memory, never a hole. */
        (void)mmap((void *)a->base, (size_t)x->key.span,
                   PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
        close(x->fd);
    }
    else {
        munmap((void *)a->base, (size_t)x->key.span);
        for (pp = &sim_ipc_imports; *pp != NULL; pp = &(*pp)->next) {
            if (*pp == x) {
                *pp = x->next;
                break;
            }
        }
    }
    free(x);
    a->ipc = NULL;
}

/* Open and map the memfd a key names (no lock needed). */
static CUresult
sim_ipc_map(const sim_ipc_key *k, void **out)
{
    char path[64];
    char link[128];
    char want[128];
    char name[64];
    struct stat st;
    ssize_t n;
    void *m;
    int fd;

    snprintf(path, sizeof(path), "/proc/%u/fd/%d", (unsigned int)k->pid,
             (int)k->fd);
    fd = open(path, O_RDWR | O_CLOEXEC);
    if (fd < 0) {
        /* Gone: the allocation was freed or its process exited. */
        return errno == EACCES || errno == EPERM ? CUDA_ERROR_NOT_PERMITTED
                                                 : CUDA_ERROR_INVALID_VALUE;
    }
    snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
    n = readlink(path, link, sizeof(link) - 1);
    sim_ipc_name(name, sizeof(name), k->nonce, k->id);
    snprintf(want, sizeof(want), "/memfd:%s (deleted)", name);
    if (n < 0 || (link[n] = '\0', strcmp(link, want) != 0)
        || fstat(fd, &st) != 0 || (uint64_t)st.st_size < k->span) {
        close(fd);
        return CUDA_ERROR_INVALID_VALUE;
    }
    m = mmap(NULL, (size_t)k->span, PROT_READ | PROT_WRITE, MAP_SHARED, fd,
             0);
    close(fd);
    if (m == MAP_FAILED) {
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *out = m;
    return CUDA_SUCCESS;
}

CUresult
sim_IpcGetMemHandle(CUipcMemHandle *pHandle, CUdeviceptr dptr)
{
    sim_ctx *c;
    sim_alloc *a;
    CUresult rc;

    SIM_ENTER(IpcGetMemHandle);
    if (pHandle == NULL) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    sim_lock();
    rc = sim_current(&c);
    if (rc == CUDA_SUCCESS) {
        a = sim_alloc_find((uintptr_t)dptr);
        if (a == NULL || a->base != (uintptr_t)dptr
            || a->kind != SIM_MEM_DEVICE) {
            rc = CUDA_ERROR_INVALID_VALUE;
        }
        else if (a->ipc == NULL) {
            rc = sim_ipc_share(a->base);
        }
    }
    if (rc == CUDA_SUCCESS) {
        a = sim_alloc_find((uintptr_t)dptr);
        memset(pHandle, 0, sizeof(*pHandle));
        memcpy(pHandle->reserved, &a->ipc->key, sizeof(a->ipc->key));
    }
    sim_unlock();
    return rc;
}

CUresult
sim_IpcOpenMemHandle(CUdeviceptr *pdptr, CUipcMemHandle handle,
                     unsigned int Flags)
{
    sim_ipc_key k;
    sim_ipc *x;
    sim_alloc *a;
    sim_ctx *c;
    void *mem = NULL;
    CUresult rc;

    SIM_ENTER(IpcOpenMemHandle);
    memcpy(&k, handle.reserved, sizeof(k));
    if (pdptr == NULL
        || (Flags & ~(unsigned int)CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS)
        || k.magic != SIM_IPC_MAGIC || k.fd < 0 || k.size == 0
        || k.size > k.span || k.span > SIZE_MAX) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    sim_lock();
    rc = sim_current(&c);
    if (rc != CUDA_SUCCESS) {
        goto out;
    }
    if (k.pid == (uint32_t)getpid() && k.nonce == sim_ipc_nonce) {
        rc = CUDA_ERROR_INVALID_CONTEXT;
        goto out;
    }
    for (x = sim_ipc_imports; x != NULL; x = x->next) {
        if (x->key.pid == k.pid && x->key.nonce == k.nonce
            && x->key.id == k.id) {
            x->refs++;
            *pdptr = (CUdeviceptr)x->base;
            goto out;
        }
    }
    x = calloc(1, sizeof(*x));
    if (x == NULL) {
        rc = CUDA_ERROR_OUT_OF_MEMORY;
        goto out;
    }
    rc = sim_ipc_map(&k, &mem);
    if (rc == CUDA_SUCCESS) {
        rc = sim_alloc_add(c, mem, (size_t)k.size, 0, SIM_MEM_IPC, Flags);
        if (rc != CUDA_SUCCESS) {
            munmap(mem, (size_t)k.span);
        }
    }
    if (rc != CUDA_SUCCESS) {
        free(x);
        goto out;
    }
    a = sim_alloc_find((uintptr_t)mem);
    x->fd = -1;
    x->key = k;
    x->refs = 1;
    x->base = (uintptr_t)mem;
    x->next = sim_ipc_imports;
    sim_ipc_imports = x;
    a->ipc = x;
    *pdptr = (CUdeviceptr)(uintptr_t)mem;
out:
    sim_unlock();
    return rc;
}
