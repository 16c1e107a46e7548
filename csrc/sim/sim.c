/* SPDX-License-Identifier: MIT */
/*
 * sim.c: the CPU simulator of the CUDA driver, and its base: the shared
 * state, the locks, fault injection, error names, cuInit and fork, the
 * devices, the allocation registry and the context lookups, which every
 * other file of csrc/sim/ builds on (sim/sim.h lists them in order).
 *
 * When CUDAMEM_SIMULATOR=1 the entry-point table cm_cu is filled from the
 * simulator (sim/table.c) instead of libcuda.so.1, so that everything
 * above the table runs, and is tested, without a GPU.  The simulator aims
 * to be honest: what the real driver rejects it rejects with the same
 * CUresult, and what the real driver does asynchronously it does
 * asynchronously (every stream has its own worker thread), so a missing
 * synchronisation is a visible bug.  As in the driver, an asynchronous
 * copy from pageable host memory consumes its source before returning
 * (the simulator keeps a snapshot), and one into pageable host memory
 * returns only once it has completed; copies between page-locked host
 * memory and the device stay asynchronous.
 *
 * What it owns: CUDAMEM_SIM_DEVICES devices of CUDAMEM_SIM_MEMORY bytes
 * each (every pair peer-capable unless CUDAMEM_SIM_NO_PEER names it, as
 * "0-1,2-3" or "all"; with POSIX file-descriptor handles for memory
 * pools and cuMemCreate unless CUDAMEM_SIM_NO_FD_HANDLES=1, which makes
 * their attributes 0 and a request for them CUDA_ERROR_NOT_SUPPORTED,
 * as a device without them answers); one primary context per device; every allocation (device, managed,
 * pinned host, registered host), each a separate host allocation whose
 * address is the device pointer; streams with their worker threads and
 * queues of operations; events.  Destroyed contexts are kept (never freed)
 * so that stale handles are recognised; streams and events are reference
 * counted and freed once nothing (handle, worker, dependency, waiter,
 * pending record) refers to them.
 *
 * Locks and the GIL: one mutex, sim.lock (sim_lock, sim_unlock), guards
 * all shared state; sim.cond is broadcast whenever an operation completes,
 * and each stream's cv is signalled when work arrives on it or it is
 * destroyed.  The lock is never held while an operation or a host function
 * runs, so host functions may call back into the simulator; calls that
 * would have to wait are refused there with CUDA_ERROR_NOT_PERMITTED (the
 * driver allows that answer).  Here, cuInit takes sim.lock; the other
 * entry points of this file read what cuInit set and take none.  Two more
 * mutexes live here, both leaves: sim_sync_mu, behind the driver lock a
 * synchronous copy holds (sim_driver_lock_take and sim_driver_lock_give
 * take it briefly with sim.lock held; SIM_ENTER waits on sim_sync_cv for
 * it with no simulator lock), so the order is sim.lock then sim_sync_mu;
 * and blk_mu, on which a call armed to wait (cm_sim_block) waits with no
 * other lock held.  The per-thread context stack is thread-local and
 * needs no lock; fault injection uses atomics only.  In the child of a
 * fork() after cuInit the lock is never touched: every entry point answers
 * NOT_INITIALIZED.  The simulator never takes, holds or gives up the GIL
 * and never calls Python (see the end of this comment).
 *
 * Choices where the driver leaves room: frees (cuMemFree, cuMemFreeHost,
 * cuMemHostUnregister) wait for all queued work, as the driver's frees
 * synchronise; a thread's per-thread default streams are destroyed (after
 * draining) by a pthread key destructor when the thread exits; calls on an
 * explicit stream or event handle need no current context, calls on the
 * default streams and all memory calls do; boolean pointer attributes are
 * written as unsigned int.
 *
 * IPC (the section "Interprocess memory"): device allocations are
 * page-aligned and page-granular host memory, so that cuIpcGetMemHandle
 * can move one into a memfd (shared memory) in place; another process
 * opens it through /proc/<pid>/fd/<n>.  That section explains the choice.
 *
 * Stream-ordered allocation (cuMemAllocAsync / cuMemFreeAsync): each
 * device has one default pool, whose reserved memory (live and cached) is
 * charged to the device.  Both calls are operations on the stream.  A
 * freed chunk is reusable on its own stream at once and on others once
 * the free has run; a chunk is reused for requests of half its size up to
 * its size.  The pool releases cached chunks whose free has run down to
 * its release threshold (default 0) at every stream, event or context
 * synchronisation, and to the argument of cuMemPoolTrimTo; to grow, it
 * first releases its own idle chunks.  Destroying a context frees its
 * pool allocations and cached chunks; the pool's attributes stay.  Pools
 * made with cuMemPoolCreate behave the same; one made with the POSIX
 * file-descriptor handle type keeps its memory in a memfd, so that
 * another process can import the pool and its allocations (the section
 * "Shareable memory pools").
 *
 * Virtual memory management (vmm.c): reservations are PROT_NONE host
 * mappings, physical allocations memfds charged to their device, and each
 * cuMemMap mapping an allocation of the registry, so that every path
 * above finds it; vmm.c explains the model and what it refuses.
 *
 * Everything here is plain C11 and pthreads: it runs on worker threads
 * that never hold the GIL, so it must not call the Python API.
 */
#include "driver/cu_table.h"
#include "sim/sim.h"
#include "driver/bytesize.h"

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

#define SIM_DEFAULT_MEMORY ((size_t)1 << 30)

/* All shared state (struct sim_shared in sim.h). */
struct sim_shared sim = {
    .lock = PTHREAD_MUTEX_INITIALIZER,
    .cond = PTHREAD_COND_INITIALIZER,
};

/* SIM_*; read without the lock by every entry point. */
atomic_int sim_state;
/* Whether stream handle 0 is the per-thread default stream. */
atomic_int sim_per_thread;

/* This thread's stack and per-thread streams, or NULL. */
_Thread_local sim_tls *tls;
/* The stream whose worker this thread is, or NULL. */
_Thread_local sim_stream *tls_worker;

atomic_int sim_sync_holders;
_Thread_local int sim_holds_sync;
static pthread_mutex_t sim_sync_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t sim_sync_cv = PTHREAD_COND_INITIALIZER;

void
sim_driver_lock_wait_slow(void)
{
    pthread_mutex_lock(&sim_sync_mu);
    while (atomic_load_explicit(&sim_sync_holders, memory_order_acquire)
           > 0) {
        pthread_cond_wait(&sim_sync_cv, &sim_sync_mu);
    }
    pthread_mutex_unlock(&sim_sync_mu);
}

void
sim_driver_lock_take(void)
{
    pthread_mutex_lock(&sim_sync_mu);
    atomic_fetch_add_explicit(&sim_sync_holders, 1, memory_order_acq_rel);
    pthread_mutex_unlock(&sim_sync_mu);
    sim_holds_sync = 1;
}

void
sim_driver_lock_give(void)
{
    sim_holds_sync = 0;
    pthread_mutex_lock(&sim_sync_mu);
    atomic_fetch_sub_explicit(&sim_sync_holders, 1, memory_order_acq_rel);
    pthread_cond_broadcast(&sim_sync_cv);
    pthread_mutex_unlock(&sim_sync_mu);
}
/* Registers the fork handler. */
pthread_once_t fork_once = PTHREAD_ONCE_INIT;
/* Random, naming this process's exports (IPC and shareable pools); made
 * on first use (lock held), 0 until then. */
uint64_t sim_ipc_nonce;

/* The host bytes behind a device allocation of size bytes: whole pages
 * (SIZE_MAX when that overflows, which no allocation satisfies). */
size_t
sim_device_span(size_t size)
{
    size_t page = (size_t)sysconf(_SC_PAGESIZE);

    if (size > SIZE_MAX - (page - 1)) {
        return SIZE_MAX;
    }
    return (size + page - 1) & ~(page - 1);
}

/* Pages of their own for host or managed memory, as the driver maps
 * them (and unmaps them when they are freed or their context goes);
 * NULL when memory is short. */
void *
sim_host_map(size_t size)
{
    size_t span = sim_device_span(size);
    void *p;

    if (span == SIZE_MAX) {
        return NULL;
    }
    p = mmap(NULL, span, PROT_READ | PROT_WRITE,
             MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    return p == MAP_FAILED ? NULL : p;
}

/* ------------------------------------------------------------------ */
/* Fault injection                                                     */
/* ------------------------------------------------------------------ */

/* How many entry points have a fault armed. */
atomic_long inj_armed;
/* Per entry point: calls left until the fault (0: disarmed). */
static atomic_long inj_left[CM_CU_N_FUNCS];
/* Per entry point: the code the fault returns. */
static atomic_int inj_code[CM_CU_N_FUNCS];

int
cm_sim_inject(int idx, long nth, CUresult code)
{
    long old;

    if (idx < 0 || idx >= CM_CU_N_FUNCS || nth < 0) {
        return -1;
    }
    atomic_store(&inj_code[idx], (int)code);
    old = atomic_exchange(&inj_left[idx], nth);
    atomic_fetch_add(&inj_armed, (long)(nth > 0) - (long)(old > 0));
    return 0;
}

/* Per entry point: calls left until the one that waits (0: disarmed). */
static atomic_long blk_left[CM_CU_N_FUNCS];
/* NOTE: guarded by blk_mu.  Per entry point: calls waiting, and whether
 * they may go on. */
static int blk_waiting[CM_CU_N_FUNCS];
static int blk_open[CM_CU_N_FUNCS];
static pthread_mutex_t blk_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t blk_cv = PTHREAD_COND_INITIALIZER;

int
cm_sim_block(int idx, long nth)
{
    long old;

    if (idx < 0 || idx >= CM_CU_N_FUNCS || nth < 0) {
        return -1;
    }
    pthread_mutex_lock(&blk_mu);
    blk_open[idx] = 0;
    pthread_mutex_unlock(&blk_mu);
    old = atomic_exchange(&blk_left[idx], nth);
    atomic_fetch_add(&inj_armed, (long)(nth > 0) - (long)(old > 0));
    return 0;
}

int
cm_sim_unblock(int idx)
{
    if (idx < 0 || idx >= CM_CU_N_FUNCS) {
        return -1;
    }
    pthread_mutex_lock(&blk_mu);
    blk_open[idx] = 1;
    pthread_cond_broadcast(&blk_cv);
    pthread_mutex_unlock(&blk_mu);
    return 0;
}

int
cm_sim_blocked(int idx)
{
    int n;

    if (idx < 0 || idx >= CM_CU_N_FUNCS) {
        return 0;
    }
    pthread_mutex_lock(&blk_mu);
    n = blk_waiting[idx];
    pthread_mutex_unlock(&blk_mu);
    return n;
}

/* If this call of entry point idx is the one armed to wait, wait until
 * cm_sim_unblock opens the way (no simulator lock held). */
static void
sim_block_maybe(int idx)
{
    long left = atomic_load(&blk_left[idx]);

    while (left > 0) {
        if (atomic_compare_exchange_weak(&blk_left[idx], &left, left - 1)) {
            if (left == 1) {
                atomic_fetch_sub(&inj_armed, 1);
                pthread_mutex_lock(&blk_mu);
                blk_waiting[idx]++;
                while (!blk_open[idx]) {
                    pthread_cond_wait(&blk_cv, &blk_mu);
                }
                blk_waiting[idx]--;
                pthread_mutex_unlock(&blk_mu);
            }
            return;
        }
    }
}

/* Whether this call of entry point idx is the armed one; sets *rc.  A
 * call armed to wait waits first. */
int
sim_inject_slow(int idx, CUresult *rc)
{
    long left;

    sim_block_maybe(idx);
    left = atomic_load(&inj_left[idx]);

    while (left > 0) {
        if (atomic_compare_exchange_weak(&inj_left[idx], &left, left - 1)) {
            if (left == 1) {
                atomic_fetch_sub(&inj_armed, 1);
                *rc = (CUresult)atomic_load(&inj_code[idx]);
                return 1;
            }
            return 0;
        }
    }
    return 0;
}

/* The same for the entry points that work before cuInit. */
#define SIM_ENTER_NOINIT(name)                                          \
    do {                                                                \
        CUresult sim_rc_;                                               \
        if (sim_injected(CM_CU_IDX_##name, &sim_rc_)) {                 \
            return sim_rc_;                                             \
        }                                                               \
    } while (0)

/* ------------------------------------------------------------------ */
/* Small helpers                                                       */
/* ------------------------------------------------------------------ */

void
sim_lock(void)
{
    pthread_mutex_lock(&sim.lock);
}

void
sim_unlock(void)
{
    pthread_mutex_unlock(&sim.lock);
}

int64_t
sim_now_ns(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* This process's sim_ipc_nonce, made on the first call (lock held). */
uint64_t
sim_nonce(void)
{
    while (sim_ipc_nonce == 0) {
        if (getrandom(&sim_ipc_nonce, sizeof(sim_ipc_nonce), 0)
            != (ssize_t)sizeof(sim_ipc_nonce)) {
            sim_ipc_nonce = (uint64_t)sim_now_ns() ^ ((uint64_t)getpid() << 32);
        }
    }
    return sim_ipc_nonce;
}

void
sim_sleep_us(long us)
{
    struct timespec ts;

    ts.tv_sec = us / 1000000;
    ts.tv_nsec = (us % 1000000) * 1000;
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

/* An integer environment variable in [lo, hi], or dflt. */
static unsigned long long
sim_env_ull(const char *name, unsigned long long lo, unsigned long long hi,
            unsigned long long dflt)
{
    const char *s = getenv(name);
    char *end;
    unsigned long long v;

    if (s == NULL || *s < '0' || *s > '9') {
        return dflt;
    }
    errno = 0;
    v = strtoull(s, &end, 10);
    if (errno != 0 || *end != '\0' || v < lo || v > hi) {
        return dflt;
    }
    return v;
}

/* A size environment variable in [lo, hi], or dflt: a byte count as
 * CUDAMEM_DEVICE_MEMORY_LIMIT spells one (driver/bytesize.h; cudamem/
 * config.py checks the same at import). */
static unsigned long long
sim_env_size(const char *name, unsigned long long lo, unsigned long long hi,
             unsigned long long dflt)
{
    const char *s = getenv(name);
    unsigned long long v;

    if (s == NULL || cm_parse_bytes(s, hi, &v) < 0 || v < lo) {
        return dflt;
    }
    return v;
}

static int
sim_set_find(const sim_set *set, uintptr_t p, size_t *pos)
{
    size_t lo = 0, hi = set->n;

    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (set->v[mid] < p) {
            lo = mid + 1;
        }
        else {
            hi = mid;
        }
    }
    *pos = lo;
    return lo < set->n && set->v[lo] == p;
}

int
sim_set_has(const sim_set *set, const void *p)
{
    size_t pos;

    return sim_set_find(set, (uintptr_t)p, &pos);
}

/* 0, or -1 when out of memory. */
int
sim_set_add(sim_set *set, const void *p)
{
    size_t pos;

    if (sim_set_find(set, (uintptr_t)p, &pos)) {
        return 0;
    }
    if (set->n == set->cap) {
        size_t cap = set->cap ? set->cap * 2 : 16;
        uintptr_t *v = realloc(set->v, cap * sizeof(*v));
        if (v == NULL) {
            return -1;
        }
        set->v = v;
        set->cap = cap;
    }
    memmove(&set->v[pos + 1], &set->v[pos],
            (set->n - pos) * sizeof(set->v[0]));
    set->v[pos] = (uintptr_t)p;
    set->n++;
    return 0;
}

void
sim_set_del(sim_set *set, const void *p)
{
    size_t pos;

    if (sim_set_find(set, (uintptr_t)p, &pos)) {
        memmove(&set->v[pos], &set->v[pos + 1],
                (set->n - pos - 1) * sizeof(set->v[0]));
        set->n--;
    }
}

/* ------------------------------------------------------------------ */
/* Error names                                                         */
/* ------------------------------------------------------------------ */

/* One CUresult with its name and description. */
typedef struct {
    CUresult code;          /* the value */
    const char *name;       /* "CUDA_ERROR_INVALID_VALUE" */
    const char *text;       /* "invalid argument" */
} sim_err;

#define SIM_ERR(code, text) {code, #code, text}

/* Sorted by code for bsearch. */
static const sim_err sim_errs[] = {
/* Generated once from the CUDA 13.0 cuda.h (enum cudaError_enum): the
 * common codes carry the driver's own short strings, the rest the first
 * sentence of their cuda.h comment. */
    SIM_ERR(CUDA_SUCCESS,
            "no error"),
    SIM_ERR(CUDA_ERROR_INVALID_VALUE,
            "invalid argument"),
    SIM_ERR(CUDA_ERROR_OUT_OF_MEMORY,
            "out of memory"),
    SIM_ERR(CUDA_ERROR_NOT_INITIALIZED,
            "initialization error"),
    SIM_ERR(CUDA_ERROR_DEINITIALIZED,
            "driver shutting down"),
    SIM_ERR(CUDA_ERROR_PROFILER_DISABLED,
            "This indicates profiler is not initialized for this run"),
    SIM_ERR(CUDA_ERROR_PROFILER_NOT_INITIALIZED,
            "This error return is deprecated as of CUDA 5.0"),
    SIM_ERR(CUDA_ERROR_PROFILER_ALREADY_STARTED,
            "This error return is deprecated as of CUDA 5.0"),
    SIM_ERR(CUDA_ERROR_PROFILER_ALREADY_STOPPED,
            "This error return is deprecated as of CUDA 5.0"),
    SIM_ERR(CUDA_ERROR_STUB_LIBRARY,
            "This indicates that the CUDA driver that the application has "
            "loaded is a stub library"),
    SIM_ERR(CUDA_ERROR_CALL_REQUIRES_NEWER_DRIVER,
            "This indicates that the API call requires a newer CUDA driver "
            "than the one currently installed"),
    SIM_ERR(CUDA_ERROR_DEVICE_UNAVAILABLE,
            "This indicates that requested CUDA device is unavailable at "
            "the current time"),
    SIM_ERR(CUDA_ERROR_NO_DEVICE,
            "no CUDA-capable device is detected"),
    SIM_ERR(CUDA_ERROR_INVALID_DEVICE,
            "invalid device ordinal"),
    SIM_ERR(CUDA_ERROR_DEVICE_NOT_LICENSED,
            "This error indicates that the Grid license is not applied"),
    SIM_ERR(CUDA_ERROR_INVALID_IMAGE,
            "device kernel image is invalid"),
    SIM_ERR(CUDA_ERROR_INVALID_CONTEXT,
            "invalid device context"),
    SIM_ERR(CUDA_ERROR_CONTEXT_ALREADY_CURRENT,
            "This indicated that the context being supplied as a parameter "
            "to the API call was already the active context"),
    SIM_ERR(CUDA_ERROR_MAP_FAILED,
            "This indicates that a map or register operation has failed"),
    SIM_ERR(CUDA_ERROR_UNMAP_FAILED,
            "This indicates that an unmap or unregister operation has "
            "failed"),
    SIM_ERR(CUDA_ERROR_ARRAY_IS_MAPPED,
            "This indicates that the specified array is currently mapped "
            "and thus cannot be destroyed"),
    SIM_ERR(CUDA_ERROR_ALREADY_MAPPED,
            "resource already mapped"),
    SIM_ERR(CUDA_ERROR_NO_BINARY_FOR_GPU,
            "This indicates that there is no kernel image available that is"
            " suitable for the device"),
    SIM_ERR(CUDA_ERROR_ALREADY_ACQUIRED,
            "This indicates that a resource has already been acquired"),
    SIM_ERR(CUDA_ERROR_NOT_MAPPED,
            "This indicates that a resource is not mapped"),
    SIM_ERR(CUDA_ERROR_NOT_MAPPED_AS_ARRAY,
            "This indicates that a mapped resource is not available for "
            "access as an array"),
    SIM_ERR(CUDA_ERROR_NOT_MAPPED_AS_POINTER,
            "This indicates that a mapped resource is not available for "
            "access as a pointer"),
    SIM_ERR(CUDA_ERROR_ECC_UNCORRECTABLE,
            "This indicates that an uncorrectable ECC error was detected "
            "during execution"),
    SIM_ERR(CUDA_ERROR_UNSUPPORTED_LIMIT,
            "This indicates that the CUlimit passed to the API call is not "
            "supported by the active device"),
    SIM_ERR(CUDA_ERROR_CONTEXT_ALREADY_IN_USE,
            "This indicates that the CUcontext passed to the API call can "
            "only be bound to a single CPU thread at a time but is already "
            "bound to a CPU thread"),
    SIM_ERR(CUDA_ERROR_PEER_ACCESS_UNSUPPORTED,
            "peer access is not supported between these two devices"),
    SIM_ERR(CUDA_ERROR_INVALID_PTX,
            "a PTX JIT compilation failed"),
    SIM_ERR(CUDA_ERROR_INVALID_GRAPHICS_CONTEXT,
            "This indicates an error with OpenGL or DirectX context"),
    SIM_ERR(CUDA_ERROR_NVLINK_UNCORRECTABLE,
            "This indicates that an uncorrectable NVLink error was detected"
            " during the execution"),
    SIM_ERR(CUDA_ERROR_JIT_COMPILER_NOT_FOUND,
            "This indicates that the PTX JIT compiler library was not found"),
    SIM_ERR(CUDA_ERROR_UNSUPPORTED_PTX_VERSION,
            "This indicates that the provided PTX was compiled with an "
            "unsupported toolchain"),
    SIM_ERR(CUDA_ERROR_JIT_COMPILATION_DISABLED,
            "This indicates that the PTX JIT compilation was disabled"),
    SIM_ERR(CUDA_ERROR_UNSUPPORTED_EXEC_AFFINITY,
            "This indicates that the CUexecAffinityType passed to the API "
            "call is not supported by the active device"),
    SIM_ERR(CUDA_ERROR_UNSUPPORTED_DEVSIDE_SYNC,
            "This indicates that the code to be compiled by the PTX JIT "
            "contains unsupported call to cudaDeviceSynchronize"),
    SIM_ERR(CUDA_ERROR_CONTAINED,
            "This indicates that an exception occurred on the device that "
            "is now contained by the GPU's error containment capability"),
    SIM_ERR(CUDA_ERROR_INVALID_SOURCE,
            "This indicates that the device kernel source is invalid"),
    SIM_ERR(CUDA_ERROR_FILE_NOT_FOUND,
            "This indicates that the file specified was not found"),
    SIM_ERR(CUDA_ERROR_SHARED_OBJECT_SYMBOL_NOT_FOUND,
            "This indicates that a link to a shared object failed to "
            "resolve"),
    SIM_ERR(CUDA_ERROR_SHARED_OBJECT_INIT_FAILED,
            "This indicates that initialization of a shared object failed"),
    SIM_ERR(CUDA_ERROR_OPERATING_SYSTEM,
            "OS call failed or operation not supported on this OS"),
    SIM_ERR(CUDA_ERROR_INVALID_HANDLE,
            "invalid resource handle"),
    SIM_ERR(CUDA_ERROR_ILLEGAL_STATE,
            "This indicates that a resource required by the API call is not"
            " in a valid state to perform the requested operation"),
    SIM_ERR(CUDA_ERROR_LOSSY_QUERY,
            "This indicates an attempt was made to introspect an object in "
            "a way that would discard semantically important information"),
    SIM_ERR(CUDA_ERROR_NOT_FOUND,
            "named symbol not found"),
    SIM_ERR(CUDA_ERROR_NOT_READY,
            "device not ready"),
    SIM_ERR(CUDA_ERROR_ILLEGAL_ADDRESS,
            "an illegal memory access was encountered"),
    SIM_ERR(CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES,
            "This indicates that a launch did not occur because it did not "
            "have appropriate resources"),
    SIM_ERR(CUDA_ERROR_LAUNCH_TIMEOUT,
            "This indicates that the device kernel took too long to execute"),
    SIM_ERR(CUDA_ERROR_LAUNCH_INCOMPATIBLE_TEXTURING,
            "This error indicates a kernel launch that uses an incompatible"
            " texturing mode"),
    SIM_ERR(CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED,
            "peer access is already enabled"),
    SIM_ERR(CUDA_ERROR_PEER_ACCESS_NOT_ENABLED,
            "peer access has not been enabled"),
    SIM_ERR(CUDA_ERROR_PRIMARY_CONTEXT_ACTIVE,
            "This error indicates that the primary context for the "
            "specified device has already been initialized"),
    SIM_ERR(CUDA_ERROR_CONTEXT_IS_DESTROYED,
            "context is destroyed"),
    SIM_ERR(CUDA_ERROR_ASSERT,
            "A device-side assert triggered during kernel execution"),
    SIM_ERR(CUDA_ERROR_TOO_MANY_PEERS,
            "This error indicates that the hardware resources required to "
            "enable peer access have been exhausted for one or more of the "
            "devices passed to cuCtxEnablePeerAccess()"),
    SIM_ERR(CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED,
            "part or all of the requested memory range is already mapped"),
    SIM_ERR(CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED,
            "pointer does not correspond to a registered memory region"),
    SIM_ERR(CUDA_ERROR_HARDWARE_STACK_ERROR,
            "While executing a kernel, the device encountered a stack error"),
    SIM_ERR(CUDA_ERROR_ILLEGAL_INSTRUCTION,
            "While executing a kernel, the device encountered an illegal "
            "instruction"),
    SIM_ERR(CUDA_ERROR_MISALIGNED_ADDRESS,
            "While executing a kernel, the device encountered a load or "
            "store instruction on a memory address which is not aligned"),
    SIM_ERR(CUDA_ERROR_INVALID_ADDRESS_SPACE,
            "While executing a kernel, the device encountered an "
            "instruction which can only operate on memory locations in "
            "certain address spaces (global, shared, or local), but was "
            "supplied a memory address not belonging to an allowed address "
            "space"),
    SIM_ERR(CUDA_ERROR_INVALID_PC,
            "While executing a kernel, the device program counter wrapped "
            "its address space"),
    SIM_ERR(CUDA_ERROR_LAUNCH_FAILED,
            "unspecified launch failure"),
    SIM_ERR(CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE,
            "This error indicates that the number of blocks launched per "
            "grid for a kernel that was launched via either "
            "cuLaunchCooperativeKernel or "
            "cuLaunchCooperativeKernelMultiDevice exceeds the maximum "
            "number of blocks as allowed by "
            "cuOccupancyMaxActiveBlocksPerMultiprocessor or "
            "cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags times the"
            " number of multiprocessors as specified by the device "
            "attribute CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT"),
    SIM_ERR(CUDA_ERROR_TENSOR_MEMORY_LEAK,
            "An exception occurred on the device while exiting a kernel "
            "using tensor memory: the tensor memory was not completely "
            "deallocated"),
    SIM_ERR(CUDA_ERROR_NOT_PERMITTED,
            "operation not permitted"),
    SIM_ERR(CUDA_ERROR_NOT_SUPPORTED,
            "operation not supported"),
    SIM_ERR(CUDA_ERROR_SYSTEM_NOT_READY,
            "This error indicates that the system is not yet ready to start"
            " any CUDA work"),
    SIM_ERR(CUDA_ERROR_SYSTEM_DRIVER_MISMATCH,
            "This error indicates that there is a mismatch between the "
            "versions of the display driver and the CUDA driver"),
    SIM_ERR(CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE,
            "This error indicates that the system was upgraded to run with "
            "forward compatibility but the visible hardware detected by "
            "CUDA does not support this configuration"),
    SIM_ERR(CUDA_ERROR_MPS_CONNECTION_FAILED,
            "This error indicates that the MPS client failed to connect to "
            "the MPS control daemon or the MPS server"),
    SIM_ERR(CUDA_ERROR_MPS_RPC_FAILURE,
            "This error indicates that the remote procedural call between "
            "the MPS server and the MPS client failed"),
    SIM_ERR(CUDA_ERROR_MPS_SERVER_NOT_READY,
            "This error indicates that the MPS server is not ready to "
            "accept new MPS client requests"),
    SIM_ERR(CUDA_ERROR_MPS_MAX_CLIENTS_REACHED,
            "This error indicates that the hardware resources required to "
            "create MPS client have been exhausted"),
    SIM_ERR(CUDA_ERROR_MPS_MAX_CONNECTIONS_REACHED,
            "This error indicates the the hardware resources required to "
            "support device connections have been exhausted"),
    SIM_ERR(CUDA_ERROR_MPS_CLIENT_TERMINATED,
            "This error indicates that the MPS client has been terminated "
            "by the server"),
    SIM_ERR(CUDA_ERROR_CDP_NOT_SUPPORTED,
            "This error indicates that the module is using CUDA Dynamic "
            "Parallelism, but the current configuration, like MPS, does not"
            " support it"),
    SIM_ERR(CUDA_ERROR_CDP_VERSION_MISMATCH,
            "This error indicates that a module contains an unsupported "
            "interaction between different versions of CUDA Dynamic "
            "Parallelism"),
    SIM_ERR(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED,
            "This error indicates that the operation is not permitted when "
            "the stream is capturing"),
    SIM_ERR(CUDA_ERROR_STREAM_CAPTURE_INVALIDATED,
            "This error indicates that the current capture sequence on the "
            "stream has been invalidated due to a previous error"),
    SIM_ERR(CUDA_ERROR_STREAM_CAPTURE_MERGE,
            "This error indicates that the operation would have resulted in"
            " a merge of two independent capture sequences"),
    SIM_ERR(CUDA_ERROR_STREAM_CAPTURE_UNMATCHED,
            "This error indicates that the capture was not initiated in "
            "this stream"),
    SIM_ERR(CUDA_ERROR_STREAM_CAPTURE_UNJOINED,
            "This error indicates that the capture sequence contains a fork"
            " that was not joined to the primary stream"),
    SIM_ERR(CUDA_ERROR_STREAM_CAPTURE_ISOLATION,
            "This error indicates that a dependency would have been created"
            " which crosses the capture sequence boundary"),
    SIM_ERR(CUDA_ERROR_STREAM_CAPTURE_IMPLICIT,
            "This error indicates a disallowed implicit dependency on a "
            "current capture sequence from cudaStreamLegacy"),
    SIM_ERR(CUDA_ERROR_CAPTURED_EVENT,
            "This error indicates that the operation is not permitted on an"
            " event which was last recorded in a capturing stream"),
    SIM_ERR(CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD,
            "A stream capture sequence not initiated with the "
            "CU_STREAM_CAPTURE_MODE_RELAXED argument to "
            "cuStreamBeginCapture was passed to cuStreamEndCapture in a "
            "different thread"),
    SIM_ERR(CUDA_ERROR_TIMEOUT,
            "This error indicates that the timeout specified for the wait "
            "operation has lapsed"),
    SIM_ERR(CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE,
            "This error indicates that the graph update was not performed "
            "because it included changes which violated constraints "
            "specific to instantiated graph update"),
    SIM_ERR(CUDA_ERROR_EXTERNAL_DEVICE,
            "This indicates that an async error has occurred in a device "
            "outside of CUDA. If CUDA was waiting for an external device's "
            "signal before consuming shared data, the external device "
            "signaled an error indicating that the data is not valid for "
            "consumption"),
    SIM_ERR(CUDA_ERROR_INVALID_CLUSTER_SIZE,
            "Indicates a kernel launch error due to cluster "
            "misconfiguration"),
    SIM_ERR(CUDA_ERROR_FUNCTION_NOT_LOADED,
            "Indiciates a function handle is not loaded when calling an API"
            " that requires a loaded function"),
    SIM_ERR(CUDA_ERROR_INVALID_RESOURCE_TYPE,
            "This error indicates one or more resources passed in are not "
            "valid resource types for the operation"),
    SIM_ERR(CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION,
            "This error indicates one or more resources are insufficient or"
            " non-applicable for the operation"),
    SIM_ERR(CUDA_ERROR_KEY_ROTATION,
            "This error indicates that an error happened during the key "
            "rotation sequence"),
    SIM_ERR(CUDA_ERROR_UNKNOWN,
            "unknown error"),
};

static int
sim_err_cmp(const void *key, const void *elem)
{
    CUresult k = *(const CUresult *)key;
    CUresult e = ((const sim_err *)elem)->code;

    return (k > e) - (k < e);
}

static const sim_err *
sim_err_find(CUresult code)
{
    return bsearch(&code, sim_errs, sizeof(sim_errs) / sizeof(sim_errs[0]),
                   sizeof(sim_errs[0]), sim_err_cmp);
}

CUresult
sim_GetErrorName(CUresult error, const char **pStr)
{
    const sim_err *e;

    SIM_ENTER_NOINIT(GetErrorName);
    if (pStr == NULL) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    e = sim_err_find(error);
    *pStr = e ? e->name : NULL;
    return e ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

CUresult
sim_GetErrorString(CUresult error, const char **pStr)
{
    const sim_err *e;

    SIM_ENTER_NOINIT(GetErrorString);
    if (pStr == NULL) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    e = sim_err_find(error);
    *pStr = e ? e->text : NULL;
    return e ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

/* ------------------------------------------------------------------ */
/* Initialisation and fork                                             */
/* ------------------------------------------------------------------ */

static void
sim_atfork_child(void)
{
    if (atomic_load(&sim_state) == SIM_READY) {
        /* The workers are gone and the lock may be held by one of them:
         * never touch either again. */
        atomic_store(&sim_state, SIM_FORKED);
    }
    else if (atomic_load(&sim_state) == SIM_UNINIT) {
        /* Nothing was started; a cuInit racing the fork may have held
         * the lock, so start the child with a fresh one. */
        pthread_mutex_init(&sim.lock, NULL);
        pthread_cond_init(&sim.cond, NULL);
    }
}

void
sim_register_atfork(void)
{
    pthread_atfork(NULL, NULL, sim_atfork_child);
}

/* CUDAMEM_SIM_NO_PEER: pairs of devices that lack peer access, as
 * "0-1,2-3" (either order), or "all".  Lock held, from cuInit; bad
 * entries are ignored. */
static void
sim_parse_no_peer(void)
{
    const char *s = getenv("CUDAMEM_SIM_NO_PEER");
    char *end;
    long a;
    long b;
    int i;

    memset(sim.no_peer, 0, sizeof(sim.no_peer));
    if (s == NULL) {
        return;
    }
    if (strcmp(s, "all") == 0) {
        for (i = 0; i < SIM_MAX_DEVICES; i++) {
            sim.no_peer[i] = (uint16_t)~(1u << i);
        }
        return;
    }
    while (*s != '\0') {
        a = strtol(s, &end, 10);
        if (end == s || *end != '-') {
            return;
        }
        s = end + 1;
        b = strtol(s, &end, 10);
        if (end == s) {
            return;
        }
        s = *end == ',' ? end + 1 : end;
        if (a >= 0 && a < SIM_MAX_DEVICES && b >= 0 && b < SIM_MAX_DEVICES
            && a != b) {
            sim.no_peer[a] |= (uint16_t)(1u << b);
            sim.no_peer[b] |= (uint16_t)(1u << a);
        }
        if (*end != ',' && *end != '\0') {
            return;
        }
    }
}

CUresult
sim_Init(unsigned int Flags)
{
    int d;

    SIM_ENTER_NOINIT(Init);
    if (atomic_load(&sim_state) == SIM_FORKED) {
        return CUDA_ERROR_NOT_INITIALIZED;
    }
    if (Flags != 0) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    sim_lock();
    if (atomic_load(&sim_state) == SIM_UNINIT) {
        sim.ndev = (int)sim_env_ull("CUDAMEM_SIM_DEVICES", 1,
                                    SIM_MAX_DEVICES, 1);
        sim.capacity = (size_t)sim_env_size("CUDAMEM_SIM_MEMORY", 1,
                                            SIZE_MAX, SIM_DEFAULT_MEMORY);
        sim.delay_us = (long)sim_env_ull("CUDAMEM_SIM_DELAY_US", 0,
                                         60000000, 0);
        sim.capture_wait_s = (long)sim_env_ull("CUDAMEM_SIM_CAPTURE_WAIT_S",
                                               1, 3600, 10);
        sim.no_fd = (int)sim_env_ull("CUDAMEM_SIM_NO_FD_HANDLES", 0, 1, 0);
        sim_parse_no_peer();
        for (d = 0; d < SIM_MAX_DEVICES; d++) {
            sim.dev[d].pool.dev = d;
            sim.dev[d].pool.fd = -1;
            sim.dev[d].pool.access = (uint64_t)1 << d;
        }
        atomic_store_explicit(&sim_state, SIM_READY, memory_order_release);
    }
    sim_unlock();
    return CUDA_SUCCESS;
}

CUresult
sim_DriverGetVersion(int *driverVersion)
{
    SIM_ENTER_NOINIT(DriverGetVersion);
    if (driverVersion == NULL) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    *driverVersion = 13000;
    return CUDA_SUCCESS;
}

/* ------------------------------------------------------------------ */
/* Devices                                                             */
/* ------------------------------------------------------------------ */

int
sim_dev_ok(CUdevice dev)
{
    return dev >= 0 && dev < sim.ndev;
}

CUresult
sim_DeviceGet(CUdevice *device, int ordinal)
{
    SIM_ENTER(DeviceGet);
    if (device == NULL) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    if (!sim_dev_ok(ordinal)) {
        return CUDA_ERROR_INVALID_DEVICE;
    }
    *device = ordinal;
    return CUDA_SUCCESS;
}

CUresult
sim_DeviceGetCount(int *count)
{
    SIM_ENTER(DeviceGetCount);
    if (count == NULL) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    *count = sim.ndev;
    return CUDA_SUCCESS;
}

CUresult
sim_DeviceGetName(char *name, int len, CUdevice dev)
{
    SIM_ENTER(DeviceGetName);
    if (!sim_dev_ok(dev)) {
        return CUDA_ERROR_INVALID_DEVICE;
    }
    if (name == NULL || len <= 0) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    snprintf(name, (size_t)len, "%s", "cudamem simulator");
    return CUDA_SUCCESS;
}

/* One attribute value that is not 0. */
typedef struct {
    CUdevice_attribute attr;  /* the attribute */
    int value;                /* its value on every simulated device */
} sim_attr;

/* An H100-like device; everything absent here is 0. */
static const sim_attr sim_attrs[] = {
    {CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK, 1024},
    {CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X, 1024},
    {CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y, 1024},
    {CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z, 64},
    {CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X, 2147483647},
    {CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y, 65535},
    {CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z, 65535},
    {CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK, 49152},
    {CU_DEVICE_ATTRIBUTE_TOTAL_CONSTANT_MEMORY, 65536},
    {CU_DEVICE_ATTRIBUTE_WARP_SIZE, 32},
    {CU_DEVICE_ATTRIBUTE_MAX_PITCH, SIM_MAX_PITCH},
    {CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_BLOCK, 65536},
    {CU_DEVICE_ATTRIBUTE_CLOCK_RATE, 1980000},
    {CU_DEVICE_ATTRIBUTE_TEXTURE_ALIGNMENT, 512},
    {CU_DEVICE_ATTRIBUTE_GPU_OVERLAP, 1},
    {CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, 132},
    {CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY, 1},
    {CU_DEVICE_ATTRIBUTE_CONCURRENT_KERNELS, 1},
    {CU_DEVICE_ATTRIBUTE_ECC_ENABLED, 1},
    {CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE, 2619000},
    {CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH, 5120},
    {CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE, 52428800},
    {CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR, 2048},
    {CU_DEVICE_ATTRIBUTE_ASYNC_ENGINE_COUNT, 2},
    {CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING, 1},
    {CU_DEVICE_ATTRIBUTE_TEXTURE_PITCH_ALIGNMENT, 32},
    {CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, 9},
    {CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, 0},
    {CU_DEVICE_ATTRIBUTE_STREAM_PRIORITIES_SUPPORTED, 1},
    {CU_DEVICE_ATTRIBUTE_GLOBAL_L1_CACHE_SUPPORTED, 1},
    {CU_DEVICE_ATTRIBUTE_LOCAL_L1_CACHE_SUPPORTED, 1},
    {CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR, 233472},
    {CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_MULTIPROCESSOR, 65536},
    {CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY, 1},
    {CU_DEVICE_ATTRIBUTE_SINGLE_TO_DOUBLE_PRECISION_PERF_RATIO, 2},
    {CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS, 1},
    {CU_DEVICE_ATTRIBUTE_COMPUTE_PREEMPTION_SUPPORTED, 1},
    {CU_DEVICE_ATTRIBUTE_CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM, 1},
    {CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH, 1},
    {CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, 232448},
    {CU_DEVICE_ATTRIBUTE_HOST_REGISTER_SUPPORTED, 1},
    {CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, 1},
    {CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED, 1},
    {CU_DEVICE_ATTRIBUTE_MAX_BLOCKS_PER_MULTIPROCESSOR, 32},
    {CU_DEVICE_ATTRIBUTE_RESERVED_SHARED_MEMORY_PER_BLOCK, 1024},
    {CU_DEVICE_ATTRIBUTE_READ_ONLY_HOST_REGISTER_SUPPORTED, 1},
    {CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED, 1},
    {CU_DEVICE_ATTRIBUTE_MEMPOOL_SUPPORTED_HANDLE_TYPES,
     CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR},
    {CU_DEVICE_ATTRIBUTE_CLUSTER_LAUNCH, 1},
    {CU_DEVICE_ATTRIBUTE_IPC_EVENT_SUPPORTED, 1},
    {CU_DEVICE_ATTRIBUTE_UNIFIED_FUNCTION_POINTERS, 1},
};

CUresult
sim_DeviceGetAttribute(int *pi, CUdevice_attribute attrib, CUdevice dev)
{
    size_t i;

    SIM_ENTER(DeviceGetAttribute);
    if (pi == NULL || (int)attrib <= 0 || attrib >= CU_DEVICE_ATTRIBUTE_MAX) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    if (!sim_dev_ok(dev)) {
        return CUDA_ERROR_INVALID_DEVICE;
    }
    switch (attrib) {
    case CU_DEVICE_ATTRIBUTE_PCI_BUS_ID:
        *pi = dev + 1;
        return CUDA_SUCCESS;
    case CU_DEVICE_ATTRIBUTE_MULTI_GPU_BOARD_GROUP_ID:
        *pi = dev;
        return CUDA_SUCCESS;
    case CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED:
    case CU_DEVICE_ATTRIBUTE_MEMPOOL_SUPPORTED_HANDLE_TYPES:
        if (sim.no_fd) {
            *pi = 0;
            return CUDA_SUCCESS;
        }
        break;
    default:
        break;
    }
    *pi = 0;
    for (i = 0; i < sizeof(sim_attrs) / sizeof(sim_attrs[0]); i++) {
        if (sim_attrs[i].attr == attrib) {
            *pi = sim_attrs[i].value;
            break;
        }
    }
    return CUDA_SUCCESS;
}

CUresult
sim_DeviceTotalMem(size_t *bytes, CUdevice dev)
{
    SIM_ENTER(DeviceTotalMem);
    if (bytes == NULL) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    if (!sim_dev_ok(dev)) {
        return CUDA_ERROR_INVALID_DEVICE;
    }
    *bytes = sim.capacity;
    return CUDA_SUCCESS;
}

CUresult
sim_DeviceGetUuid(CUuuid *uuid, CUdevice dev)
{
    static const unsigned char base[16] = {
        0x63, 0x75, 0x64, 0x61, 0x6d, 0x65, 0x6d, 0x2d,   /* "cudamem-" */
        0x73, 0x69, 0x6d, 0x00, 0x00, 0x00, 0x00, 0x00,   /* "sim" */
    };
    int i;

    SIM_ENTER(DeviceGetUuid);
    if (uuid == NULL) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    if (!sim_dev_ok(dev)) {
        return CUDA_ERROR_INVALID_DEVICE;
    }
    for (i = 0; i < 16; i++) {
        uuid->bytes[i] = (char)base[i];
    }
    uuid->bytes[15] = (char)(dev + 1);
    return CUDA_SUCCESS;
}

CUresult
sim_DeviceGetPCIBusId(char *pciBusId, int len, CUdevice dev)
{
    SIM_ENTER(DeviceGetPCIBusId);
    if (!sim_dev_ok(dev)) {
        return CUDA_ERROR_INVALID_DEVICE;
    }
    if (pciBusId == NULL || len <= 0) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    snprintf(pciBusId, (size_t)len, "0000:%02x:00.0", (unsigned)(dev + 1));
    return CUDA_SUCCESS;
}

CUresult
sim_DeviceCanAccessPeer(int *canAccessPeer, CUdevice dev, CUdevice peerDev)
{
    SIM_ENTER(DeviceCanAccessPeer);
    if (canAccessPeer == NULL) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    if (!sim_dev_ok(dev) || !sim_dev_ok(peerDev)) {
        return CUDA_ERROR_INVALID_DEVICE;
    }
    *canAccessPeer = dev != peerDev
                     && !(sim.no_peer[dev] & (1u << peerDev));
    return CUDA_SUCCESS;
}

/* ------------------------------------------------------------------ */
/* The allocation registry (lock held)                                 */
/* ------------------------------------------------------------------ */

/* Index of the first allocation whose base is > p. */
static size_t
sim_alloc_upper(uintptr_t p)
{
    size_t lo = 0, hi = sim.nallocs;

    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (sim.allocs[mid]->base <= p) {
            lo = mid + 1;
        }
        else {
            hi = mid;
        }
    }
    return lo;
}

/* The allocation containing address p, dying or not, or NULL. */
sim_alloc *
sim_alloc_find_any(uintptr_t p)
{
    size_t i = sim_alloc_upper(p);
    sim_alloc *a;

    if (i == 0) {
        return NULL;
    }
    a = sim.allocs[i - 1];
    return p - a->base < a->size ? a : NULL;
}

/* The live allocation containing address p, or NULL. */
sim_alloc *
sim_alloc_find(uintptr_t p)
{
    sim_alloc *a = sim_alloc_find_any(p);

    return a != NULL && a->dying == SIM_DYING_NO ? a : NULL;
}

/* Whether [p, p + n) overlaps any registered range, dying ones included. */
int
sim_alloc_overlaps(uintptr_t p, size_t n)
{
    size_t i = sim_alloc_upper(p);

    if (sim_alloc_find_any(p) != NULL) {
        return 1;
    }
    return i < sim.nallocs && sim.allocs[i]->base - p < n;
}

/* 0, or -1 when out of memory. */
int
sim_alloc_insert(sim_alloc *a)
{
    size_t i;

    if (sim.nallocs == sim.capallocs) {
        size_t cap = sim.capallocs ? sim.capallocs * 2 : 64;
        sim_alloc **v = realloc(sim.allocs, cap * sizeof(*v));
        if (v == NULL) {
            return -1;
        }
        sim.allocs = v;
        sim.capallocs = cap;
    }
    i = sim_alloc_upper(a->base);
    memmove(&sim.allocs[i + 1], &sim.allocs[i],
            (sim.nallocs - i) * sizeof(sim.allocs[0]));
    sim.allocs[i] = a;
    sim.nallocs++;
    a->id = ++sim.next_id;
    return 0;
}

void
sim_alloc_remove(sim_alloc *a)
{
    size_t i = sim_alloc_upper(a->base);

    if (i > 0 && sim.allocs[i - 1] == a) {
        memmove(&sim.allocs[i - 1], &sim.allocs[i],
                (sim.nallocs - i) * sizeof(sim.allocs[0]));
        sim.nallocs--;
    }
}

/* Register a new allocation of size bytes at mem for the current
 * context; charged: bytes counted against the device. */
CUresult
sim_alloc_add(sim_ctx *c, void *mem, size_t size, size_t charged, int kind,
              unsigned int flags)
{
    sim_alloc *a = calloc(1, sizeof(*a));

    if (a == NULL) {
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    a->base = (uintptr_t)mem;
    a->size = size;
    a->charged = charged;
    a->kind = kind;
    a->ctx = c;
    a->flags = flags;
    if (sim_alloc_insert(a) != 0) {
        free(a);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    sim.dev[c->dev].used += charged;
    return CUDA_SUCCESS;
}

/* ------------------------------------------------------------------ */
/* Contexts (lock held unless noted)                                   */
/* ------------------------------------------------------------------ */

/* The top of this thread's context stack, destroyed or not. */
sim_ctx *
sim_top(void)
{
    return tls != NULL && tls->n > 0 ? sim_ctx_of(tls->stack[tls->n - 1])
                                     : NULL;
}

CUcontext
sim_ctx_handle(const sim_ctx *c)
{
    return (CUcontext)(void *)&sim.dev[c->dev].handle;
}

sim_ctx *
sim_ctx_of(CUcontext h)
{
    int d;

    for (d = 0; d < sim.ndev; d++) {
        if ((uintptr_t)h == (uintptr_t)&sim.dev[d].handle) {
            return sim.dev[d].primary != NULL ? sim.dev[d].primary
                                              : sim.dev[d].last;
        }
    }
    return NULL;
}

/* The current context, or why there is no usable one. */
CUresult
sim_current(sim_ctx **out)
{
    sim_ctx *c = sim_top();

    if (c == NULL) {
        return CUDA_ERROR_INVALID_CONTEXT;
    }
    if (c->destroyed) {
        return CUDA_ERROR_CONTEXT_IS_DESTROYED;
    }
    *out = c;
    return CUDA_SUCCESS;
}

/* Whether h is a live context, a destroyed one, or no context at all. */
CUresult
sim_ctx_check(CUcontext h)
{
    int d;

    for (d = 0; d < sim.ndev; d++) {
        if ((uintptr_t)h == (uintptr_t)&sim.dev[d].handle) {
            return sim.dev[d].primary != NULL
                       ? CUDA_SUCCESS
                       : (sim.dev[d].last != NULL
                              ? CUDA_ERROR_CONTEXT_IS_DESTROYED
                              : CUDA_ERROR_INVALID_CONTEXT);
        }
    }
    return CUDA_ERROR_INVALID_CONTEXT;
}
