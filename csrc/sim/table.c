/* SPDX-License-Identifier: MIT */
/*
 * sim/table.c: the top of the simulator: the table of driver entry
 * points that cm_sim_fill hands the loader (driver/cu_table.h), filled
 * from every file of csrc/sim/, and the profiler stubs.  Nothing in
 * csrc/sim/ calls up into it.
 *
 * Locks and the GIL: the profiler stubs take sim.lock to read the current
 * context; cm_sim_fill takes none (pthread_once registers the fork handler
 * once).  The GIL is never taken nor given up here.
 */
#include "driver/cu_table.h"
#include "sim/sim.h"

#include <pthread.h>
#include <stdatomic.h>
#include <string.h>

/* ------------------------------------------------------------------ */
/* Profiler                                                            */
/* ------------------------------------------------------------------ */

/* Nothing to profile; like the driver's, they need a current context. */
static CUresult
sim_profiler(void)
{
    sim_ctx *c;
    CUresult rc;

    sim_lock();
    rc = sim_current(&c);
    sim_unlock();
    return rc;
}

static CUresult
sim_ProfilerStart(void)
{
    SIM_ENTER(ProfilerStart);
    return sim_profiler();
}

static CUresult
sim_ProfilerStop(void)
{
    SIM_ENTER(ProfilerStop);
    return sim_profiler();
}

/* ------------------------------------------------------------------ */
/* The table                                                           */
/* ------------------------------------------------------------------ */

void
cm_sim_fill(cm_cu_table *t, int per_thread)
{
    pthread_once(&fork_once, sim_register_atfork);
    atomic_store(&sim_per_thread, per_thread != 0);
    memset(t, 0, sizeof(*t));
#define SIM_FILL(name) t->name = sim_##name;
    SIM_FILL(GetErrorName)
    SIM_FILL(GetErrorString)
    SIM_FILL(Init)
    SIM_FILL(DriverGetVersion)
    SIM_FILL(DeviceGet)
    SIM_FILL(DeviceGetCount)
    SIM_FILL(DeviceGetName)
    SIM_FILL(DeviceGetAttribute)
    SIM_FILL(DeviceTotalMem)
    SIM_FILL(DeviceGetUuid)
    SIM_FILL(DeviceGetPCIBusId)
    SIM_FILL(DeviceCanAccessPeer)
    SIM_FILL(DevicePrimaryCtxRetain)
    SIM_FILL(DevicePrimaryCtxRelease)
    SIM_FILL(DevicePrimaryCtxReset)
    SIM_FILL(DevicePrimaryCtxGetState)
    SIM_FILL(CtxGetCurrent)
    SIM_FILL(CtxSetCurrent)
    SIM_FILL(CtxPushCurrent)
    SIM_FILL(CtxPopCurrent)
    SIM_FILL(CtxGetDevice)
    SIM_FILL(CtxSynchronize)
    SIM_FILL(CtxEnablePeerAccess)
    SIM_FILL(MemAlloc)
    SIM_FILL(MemFree)
    SIM_FILL(MemGetInfo)
    SIM_FILL(MemAllocManaged)
    SIM_FILL(MemAllocAsync)
    SIM_FILL(MemFreeAsync)
    SIM_FILL(DeviceGetDefaultMemPool)
    SIM_FILL(MemPoolSetAttribute)
    SIM_FILL(MemPoolGetAttribute)
    SIM_FILL(MemPoolTrimTo)
    SIM_FILL(MemPoolCreate)
    SIM_FILL(MemPoolDestroy)
    SIM_FILL(MemPoolSetAccess)
    SIM_FILL(MemAllocFromPoolAsync)
    SIM_FILL(MemPoolExportToShareableHandle)
    SIM_FILL(MemPoolImportFromShareableHandle)
    SIM_FILL(MemPoolExportPointer)
    SIM_FILL(MemPoolImportPointer)
    SIM_FILL(MemAddressReserve)
    SIM_FILL(MemAddressFree)
    SIM_FILL(MemCreate)
    SIM_FILL(MemRelease)
    SIM_FILL(MemMap)
    SIM_FILL(MemUnmap)
    SIM_FILL(MemSetAccess)
    SIM_FILL(MemGetAccess)
    SIM_FILL(MemGetAllocationGranularity)
    SIM_FILL(MemGetAllocationPropertiesFromHandle)
    SIM_FILL(MemRetainAllocationHandle)
    SIM_FILL(MemExportToShareableHandle)
    SIM_FILL(MemImportFromShareableHandle)
    SIM_FILL(MemHostAlloc)
    SIM_FILL(MemFreeHost)
    SIM_FILL(MemHostRegister)
    SIM_FILL(MemHostUnregister)
    SIM_FILL(MemHostGetDevicePointer)
    SIM_FILL(MemHostGetFlags)
    SIM_FILL(MemGetAddressRange)
    SIM_FILL(PointerGetAttribute)
    SIM_FILL(PointerGetAttributes)
    SIM_FILL(MemcpyHtoD)
    SIM_FILL(MemcpyDtoH)
    SIM_FILL(MemcpyDtoD)
    SIM_FILL(MemcpyHtoDAsync)
    SIM_FILL(MemcpyDtoHAsync)
    SIM_FILL(MemcpyDtoDAsync)
    SIM_FILL(Memcpy2D)
    SIM_FILL(Memcpy2DAsync)
    SIM_FILL(Memcpy3D)
    SIM_FILL(Memcpy3DAsync)
    SIM_FILL(MemcpyPeer)
    SIM_FILL(MemcpyPeerAsync)
    SIM_FILL(MemsetD8)
    SIM_FILL(MemsetD8Async)
    SIM_FILL(MemPrefetchAsync)
    SIM_FILL(MemAdvise)
    SIM_FILL(StreamCreate)
    SIM_FILL(StreamDestroy)
    SIM_FILL(StreamSynchronize)
    SIM_FILL(StreamQuery)
    SIM_FILL(StreamWaitEvent)
    SIM_FILL(StreamAddCallback)
    SIM_FILL(LaunchHostFunc)
    SIM_FILL(StreamBeginCapture)
    SIM_FILL(StreamEndCapture)
    SIM_FILL(StreamIsCapturing)
    SIM_FILL(StreamGetCaptureInfo)
    SIM_FILL(ThreadExchangeStreamCaptureMode)
    SIM_FILL(GraphInstantiateWithFlags)
    SIM_FILL(GraphLaunch)
    SIM_FILL(GraphUpload)
    SIM_FILL(GraphDestroy)
    SIM_FILL(GraphExecDestroy)
    SIM_FILL(EventCreate)
    SIM_FILL(EventRecord)
    SIM_FILL(EventSynchronize)
    SIM_FILL(EventQuery)
    SIM_FILL(EventDestroy)
    SIM_FILL(EventElapsedTime)
    SIM_FILL(IpcGetMemHandle)
    SIM_FILL(IpcOpenMemHandle)
    SIM_FILL(IpcCloseMemHandle)
    SIM_FILL(ProfilerStart)
    SIM_FILL(ProfilerStop)
#undef SIM_FILL
    t->sim_launch_checked = cm_sim_launch_checked;
    t->sim_kbatch = cm_sim_kbatch;
}
