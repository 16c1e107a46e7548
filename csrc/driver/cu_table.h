/* SPDX-License-Identifier: MIT */
/*
 * driver/cu_table.h: the table of driver entry points (cm_cu) and the
 * simulator backend that can fill it, in plain C: no Python or NumPy
 * header, so that the simulator (csrc/sim/) and its C tests
 * (tests/csim) build without them.  The loader (driver.c) fills the table
 * from libcuda.so.1 or from the simulator; every layer above calls the
 * driver only through it (the checking macros are in driver/call.h).
 */
#ifndef CM_CU_TABLE_H
#define CM_CU_TABLE_H

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cudaProfilerTypedefs.h>

#include <stddef.h>
#include <stdint.h>

/* ------------------------------------------------------------------ */
/* The driver entry points                                             */
/* ------------------------------------------------------------------ */

/*
 * X(name, version): the entry point cu<name> at the ABI version whose
 * signature is PFN_cu<name>_v<version> in cudaTypedefs.h.  The loader asks
 * cuGetProcAddress for exactly that version; the simulator assigns
 * functions of exactly that type, so the compiler checks both.
 */
#define CM_CU_FUNCS(X)                  \
    X(GetErrorName, 6000)               \
    X(GetErrorString, 6000)             \
    X(Init, 2000)                       \
    X(DriverGetVersion, 2020)           \
    X(DeviceGet, 2000)                  \
    X(DeviceGetCount, 2000)             \
    X(DeviceGetName, 2000)              \
    X(DeviceGetAttribute, 2000)         \
    X(DeviceTotalMem, 3020)             \
    X(DeviceGetUuid, 11040)             \
    X(DeviceGetPCIBusId, 4010)          \
    X(DeviceCanAccessPeer, 4000)        \
    X(DevicePrimaryCtxRetain, 7000)     \
    X(DevicePrimaryCtxRelease, 11000)   \
    X(DevicePrimaryCtxReset, 11000)     \
    X(DevicePrimaryCtxGetState, 7000)   \
    X(CtxGetCurrent, 4000)              \
    X(CtxSetCurrent, 4000)              \
    X(CtxPushCurrent, 4000)             \
    X(CtxPopCurrent, 4000)              \
    X(CtxGetDevice, 2000)               \
    X(CtxSynchronize, 2000)             \
    X(CtxEnablePeerAccess, 4000)        \
    X(MemAlloc, 3020)                   \
    X(MemFree, 3020)                    \
    X(MemGetInfo, 3020)                 \
    X(MemAllocManaged, 6000)            \
    X(MemAllocAsync, 11020)             \
    X(MemFreeAsync, 11020)              \
    X(DeviceGetDefaultMemPool, 11020)   \
    X(MemPoolSetAttribute, 11020)       \
    X(MemPoolGetAttribute, 11020)       \
    X(MemPoolTrimTo, 11020)             \
    X(MemPoolCreate, 11020)             \
    X(MemPoolDestroy, 11020)            \
    X(MemPoolSetAccess, 11020)          \
    X(MemAllocFromPoolAsync, 11020)     \
    X(MemPoolExportToShareableHandle, 11020) \
    X(MemPoolImportFromShareableHandle, 11020) \
    X(MemPoolExportPointer, 11020)      \
    X(MemPoolImportPointer, 11020)      \
    X(MemAddressReserve, 10020)         \
    X(MemAddressFree, 10020)            \
    X(MemCreate, 10020)                 \
    X(MemRelease, 10020)                \
    X(MemMap, 10020)                    \
    X(MemUnmap, 10020)                  \
    X(MemSetAccess, 10020)              \
    X(MemGetAccess, 10020)              \
    X(MemGetAllocationGranularity, 10020) \
    X(MemGetAllocationPropertiesFromHandle, 10020) \
    X(MemRetainAllocationHandle, 11000) \
    X(MemExportToShareableHandle, 10020) \
    X(MemImportFromShareableHandle, 10020) \
    X(MemHostAlloc, 2020)               \
    X(MemFreeHost, 2000)                \
    X(MemHostRegister, 6050)            \
    X(MemHostUnregister, 4000)          \
    X(MemHostGetDevicePointer, 3020)    \
    X(MemHostGetFlags, 2030)            \
    X(MemGetAddressRange, 3020)         \
    X(PointerGetAttribute, 4000)        \
    X(PointerGetAttributes, 7000)       \
    X(MemcpyHtoD, 3020)                 \
    X(MemcpyDtoH, 3020)                 \
    X(MemcpyDtoD, 3020)                 \
    X(MemcpyHtoDAsync, 3020)            \
    X(MemcpyDtoHAsync, 3020)            \
    X(MemcpyDtoDAsync, 3020)            \
    X(Memcpy2D, 3020)                   \
    X(Memcpy2DAsync, 3020)              \
    X(Memcpy3D, 3020)                   \
    X(Memcpy3DAsync, 3020)              \
    X(MemcpyPeer, 4000)                 \
    X(MemcpyPeerAsync, 4000)            \
    X(MemsetD8, 3020)                   \
    X(MemsetD8Async, 3020)              \
    X(MemPrefetchAsync, 12020)          \
    X(MemAdvise, 12020)                 \
    X(StreamCreate, 2000)               \
    X(StreamDestroy, 4000)              \
    X(StreamSynchronize, 2000)          \
    X(StreamQuery, 2000)                \
    X(StreamWaitEvent, 3020)            \
    X(StreamAddCallback, 5000)          \
    X(LaunchHostFunc, 10000)            \
    X(StreamBeginCapture, 10010)        \
    X(StreamEndCapture, 10000)          \
    X(StreamIsCapturing, 10000)         \
    X(StreamGetCaptureInfo, 12030)      \
    X(ThreadExchangeStreamCaptureMode, 10010) \
    X(GraphInstantiateWithFlags, 11040) \
    X(GraphLaunch, 10000)               \
    X(GraphUpload, 11010)               \
    X(GraphDestroy, 10000)              \
    X(GraphKernelNodeSetParams, 12000)  \
    X(GraphExecDestroy, 10000)          \
    X(EventCreate, 2000)                \
    X(EventRecord, 2000)                \
    X(EventSynchronize, 2000)           \
    X(EventQuery, 2000)                 \
    X(EventDestroy, 4000)               \
    X(EventElapsedTime, 12080)          \
    X(IpcGetMemHandle, 4010)            \
    X(IpcOpenMemHandle, 11000)          \
    X(IpcCloseMemHandle, 4010)          \
    X(ModuleLoadData, 2000)             \
    X(ModuleUnload, 2000)               \
    X(ModuleGetFunction, 2000)          \
    X(ModuleGetGlobal, 3020)            \
    X(LaunchKernel, 4000)               \
    X(FuncSetAttribute, 9000)           \
    X(FuncGetAttribute, 2020)           \
    X(FuncGetParamInfo, 12040)          \
    X(ProfilerStart, 4000)              \
    X(ProfilerStop, 4000)

/* The type of cm_cu.sim_launch_checked (cm_sim_launch_checked says what
 * it does). */
typedef CUresult (*cm_launch_checked_fn)(CUstream h, CUhostFn fn, void *data,
                                         size_t size, int nranges,
                                         const uintptr_t *start,
                                         const size_t *len);

/* The type of cm_cu.sim_kbatch (cm_sim_kbatch says what it does). */
typedef CUresult (*cm_sim_kbatch_fn)(CUstream h, CUhostFn fn,
                                     const void *data, size_t size,
                                     int nranges, const uintptr_t *start,
                                     const size_t *len, uint64_t *seq,
                                     uint64_t *capid);

typedef struct {
#define CM_CU_FIELD(name, ver) PFN_cu##name##_v##ver name;
    CM_CU_FUNCS(CM_CU_FIELD)
#undef CM_CU_FIELD
    /* Not an entry point of the driver: the simulator's checked launch of
     * cudamem's internal kernels (cm_sim_launch_checked), filled by
     * cm_sim_fill; NULL on the driver, where those kernels are never
     * launched this way (their callers check the backend first). */
    cm_launch_checked_fn sim_launch_checked;
    /* Likewise: the simulator's batches of small copies in a capture
     * (cm_sim_kbatch), NULL on the driver. */
    cm_sim_kbatch_fn sim_kbatch;
} cm_cu_table;

/* Index of each entry point, for fault injection and name lookup. */
enum {
#define CM_CU_INDEX(name, ver) CM_CU_IDX_##name,
    CM_CU_FUNCS(CM_CU_INDEX)
#undef CM_CU_INDEX
    CM_CU_N_FUNCS
};

/* The process-wide table; entries are NULL until cm_driver_ensure. */
extern cm_cu_table cm_cu;
/* The base names ("MemAlloc"), indexed by CM_CU_IDX_*. */
extern const char *const cm_cu_names[CM_CU_N_FUNCS];
/* What a NULL entry returns: CUDA_ERROR_NOT_FOUND for the driver,
 * CUDA_ERROR_NOT_SUPPORTED for the simulator. */
extern CUresult cm_cu_missing;

/* Which backend filled the table. */
typedef enum {
    CM_BACKEND_NONE = 0,
    CM_BACKEND_DRIVER,
    CM_BACKEND_SIM
} cm_backend;

/* ------------------------------------------------------------------ */
/* sim/: the CPU simulator (sim/table.c fills the table)              */
/* ------------------------------------------------------------------ */

/* Fill every modelled entry of t; leave the others NULL.  per_thread:
 * whether stream handle 0 means the per-thread default stream. */
void cm_sim_fill(cm_cu_table *t, int per_thread);
/* Arm fault injection: the nth (1 = next) call of entry point idx returns
 * code.  nth 0 disarms.  0, or -1 if idx is out of range. */
int cm_sim_inject(int idx, long nth, CUresult code);
/* Arm a wait, for tests that force an order between threads: the nth
 * (1 = next) call of entry point idx, from any thread, waits on entry
 * until cm_sim_unblock(idx); nth 0 disarms.  The caller must not hold
 * what the unblocking thread needs (the GIL).  0, or -1 if idx is out of
 * range. */
int cm_sim_block(int idx, long nth);
/* Let the waiting call of idx (and any later armed one) go on. */
int cm_sim_unblock(int idx);
/* How many calls of idx are waiting now. */
int cm_sim_blocked(int idx);
/* Whether h is a stream the simulator has and has not destroyed (its
 * context included).  Simulator backend only. */
int cm_sim_stream_live(const void *h);
/* cuLaunchHostFunc(h, fn, data), queued only if each of the nranges
 * byte ranges [start[i], start[i] + len[i]) (empty ones skipped) lies
 * inside one live allocation, else CUDA_ERROR_INVALID_VALUE as the
 * simulator's copies answer; checked and queued atomically.  size > 0:
 * the simulator copies the size bytes at data into the operation and fn
 * gets that copy (freed with the operation; the caller keeps data), so
 * a capture can record it and a graph replay it; size 0: fn owns data
 * (runs once), and a capturing stream refuses it with
 * CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED.  For the internal kernels
 * (kernels.c, gather.c), which call it through the table
 * (cm_cu.sim_launch_checked): cm_sim_fill puts it there.  Simulator
 * backend only. */
CUresult cm_sim_launch_checked(CUstream h, CUhostFn fn, void *data,
                               size_t size, int nranges,
                               const uintptr_t *start, const size_t *len);

/* The simulator's record of a batch of small copies on a capturing
 * stream (context/kbatch.c): a node added, or the node *seq of capture
 * *capid changed where it is still the stream's only dependency
 * (sim/stream.c says more).  Simulator backend only. */
CUresult cm_sim_kbatch(CUstream h, CUhostFn fn, const void *data,
                       size_t size, int nranges, const uintptr_t *start,
                       const size_t *len, uint64_t *seq, uint64_t *capid);

#endif /* CM_CU_TABLE_H */
