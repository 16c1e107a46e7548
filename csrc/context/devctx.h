/* SPDX-License-Identifier: MIT */
/*
 * context/devctx.h: what the files of devices and contexts share
 * (device.c, context.c, close.c, ctxtypes.c, ctxfuncs.c, lowest first:
 * the sections of one concept, kept in files of their own): the registry
 * of devices and contexts, its waits, the fork hooks and the device
 * look-ups (device.c), the context look-ups and peers (context.c), the
 * close of a device (close.c) and the type specs (ctxtypes.c).
 * Private to them: the rest of the folder and the layers above use
 * context/context.h.
 */
#ifndef CM_DEVCTX_H
#define CM_DEVCTX_H

#include "context/context.h"

extern int cm_ndev;                           /* device count, once known */

extern cm_device *cm_devs[CM_MAX_DEVICES];    /* strong, made on demand */

extern cm_context *cm_ctxs[CM_MAX_DEVICES];   /* strong, while retained */

extern unsigned long cm_ctx_gen;              /* last cm_context.gen */

/* NOTE: guarded by the GIL.  [i]: device i is being closed or reset, by
 * the thread cm_resetter[i]. */
extern unsigned char cm_resetting[CM_MAX_DEVICES];

extern unsigned long cm_resetter[CM_MAX_DEVICES];

/* Wait, GIL released, while another thread closes or resets device i;
 * -1 with ValueError when the caller is that thread (code run by the
 * reset itself, a plugin's say, asking for the device's context). */
int cm_context_wait_reset(int i);

/* Wait (GIL released) for all the work of the live contexts given peer
 * access to c's memory (c->peers_in): before c's memory goes, since
 * nothing of c's own orders their work.  Never raises. */
void cm_context_sync_peers(cm_context *c);

/* The runtime's part of a fork's child (device.c): 0, or -1 with an
 * exception set. */
int cm_runtime_fork_init(void);

/* ------------------------------------------------------------------ */
/* Device (device.c)                                                   */
/* ------------------------------------------------------------------ */

int cm_device_count(void);

/* Normalise a device ordinal (negative ones wrap); -1 with IndexError. */
int cm_device_index(Py_ssize_t i);

/* A device ordinal argument, normalised; -1 with an exception. */
int cm_device_arg(PyObject *arg);

/* Device i (already normalised): borrowed, made on first use. */
cm_device *cm_device_get(int i);

int cm_device_cc_at_least(cm_device *d, int major, int minor);

/* The PCI domain, bus and device ids of device h from the driver; 0 or
 * -1.  (cm_device_pci, in context/context.h, caches them on the
 * Device.) */
int cm_device_read_pci(CUdevice h, int pci[3]);

/* ------------------------------------------------------------------ */
/* Context (context.c)                                                 */
/* ------------------------------------------------------------------ */

/* The Context of device i, retaining its primary context if needed.
 * Borrowed reference. */
cm_context *cm_context_get(int i);

/* The registered Context whose handle is h, or NULL. */
cm_context *cm_context_find(CUcontext h);

/* Whether device a's contexts can map device b's memory (cached). */
int cm_peer_possible(int a, int b);

/* Pop every context of the calling thread. */
int cm_context_pop_all(void);

/* Forget device i's context: release and reset its primary context.
 * Another thread's reset of the device in progress is waited for.
 * (close.c) */
int cm_context_release_device(int i);

/* The Python types (ctxtypes.c). */
extern PyType_Spec cm_device_spec;
extern PyType_Spec cm_context_spec;

#endif /* CM_DEVCTX_H */
