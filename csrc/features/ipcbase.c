/* SPDX-License-Identifier: MIT */
/*
 * features/ipcbase.c: what the IPC files (ipc.c, ipcpool.c, ipcvmm.c,
 * ipchandle.c) share, beneath them all: the check of the classes the
 * package registered, the Context and size arguments of the opens, the
 * making of an IpcMemory, and taking a descriptor from another process
 * (pidfd_open + pidfd_getfd, or the exporter's socket: memory/fdserve.c).
 *
 * Locks and the GIL: no lock of its own; the GIL is held throughout but
 * for the wait on the exporter's socket (cm_fd_fetch, which touches
 * nothing of Python).
 */
#include "features/ipc.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

/* Check that the package registered what the export makes or calls in
 * Python (cm_state's IpcHandle ... MemoryPointer; _register checked
 * their bases).  0, or -1 with RuntimeError naming a missing one. */
int
cm_ipc_classes(void)
{
    if (CM_REGISTERED(MemoryPointer) == NULL
        || CM_REGISTERED(IpcRawHandle) == NULL
        || CM_REGISTERED(ipc_export_array) == NULL
        || CM_REGISTERED(IpcPointer) == NULL
        || CM_REGISTERED(IpcArrayHandle) == NULL
        || CM_REGISTERED(IpcHandle) == NULL) {
        return -1;
    }
    return 0;
}

/* The Context argument of the module functions: borrowed, or NULL with
 * TypeError. */
cm_context *
cm_ipc_context_arg(PyObject *obj)
{
    if (!PyObject_TypeCheck(obj, cm_st->Context_type)) {
        PyErr_Format(PyExc_TypeError, "expected a cudamem Context, got %.200s",
                     Py_TYPE(obj)->tp_name);
        return NULL;
    }
    return (cm_context *)obj;
}

/* The two non-negative sizes of an open: size, and offset (0 when
 * absent).  0, or -1 with an exception. */
int
cm_ipc_sizes(PyObject *size_arg, PyObject *off_arg, Py_ssize_t *size,
             Py_ssize_t *off)
{
    *off = 0;
    *size = PyNumber_AsSsize_t(size_arg, PyExc_OverflowError);
    if (*size == -1 && PyErr_Occurred()) {
        return -1;
    }
    if (off_arg != NULL) {
        *off = PyNumber_AsSsize_t(off_arg, PyExc_OverflowError);
        if (*off == -1 && PyErr_Occurred()) {
            return -1;
        }
    }
    if (*size < 0 || *off < 0) {
        PyErr_Format(PyExc_ValueError,
                     "size and offset must not be negative, got %zd and %zd",
                     *size, *off);
        return -1;
    }
    return 0;
}

/* The arguments every open shares: fname's nargs must be nmin, or nmin + 1
 * with the offset last; args[0] the Context, args[2] the size.  Also
 * checks the registered classes (cm_ipc_classes).  The Context
 * (borrowed) with *size and *off, or NULL with an exception. */
cm_context *
cm_ipc_open_args(const char *fname, PyObject *const *args,
                 Py_ssize_t nargs, Py_ssize_t nmin, Py_ssize_t *size,
                 Py_ssize_t *off)
{
    cm_context *ctx;

    if (nargs != nmin && nargs != nmin + 1) {
        PyErr_Format(PyExc_TypeError,
                     "%s() takes %zd or %zd arguments (%zd given)", fname,
                     nmin, nmin + 1, nargs);
        return NULL;
    }
    ctx = cm_ipc_context_arg(args[0]);
    if (ctx == NULL
        || cm_ipc_sizes(args[2], nargs == nmin + 1 ? args[nmin] : NULL,
                        size, off) < 0
        || cm_ipc_classes() < 0) {
        return NULL;
    }
    return ctx;
}

/* A new IpcMemory (an instance of cudamem._ipc._IpcPointer) over the
 * mapping at p of ctx, showing size bytes from p + off; imp as for the
 * field.  NULL with an exception (the mapping is then the caller's). */
cm_ipcmem *
cm_ipcmem_new(cm_context *ctx, CUdeviceptr p, Py_ssize_t off,
              Py_ssize_t size, void *imp)
{
    PyTypeObject *tp = (PyTypeObject *)cm_st->IpcPointer;
    /* tp_alloc zeroes the object and tracks it */
    cm_ipcmem *m = (cm_ipcmem *)tp->tp_alloc(tp, 0);

    if (m == NULL) {
        return NULL;
    }
    m->ctx = (cm_context *)Py_NewRef(ctx);
    m->ptr = p;
    m->off = (size_t)off;
    m->size = (size_t)size;
    m->closed = 0;
    m->imp = imp;
    return m;
}

/* OSError(err, why) for a descriptor of kind (CM_IPC_FD_*) that could
 * not be taken from pid: a subclass where the errno has one
 * (ProcessLookupError, PermissionError).  -1. */
static int
cm_ipc_take_fd_error(int err, long pid, int fd, int kind)
{
    PyObject *msg;

    switch (err) {
    case ESRCH:
        msg = PyUnicode_FromFormat(
            "cannot open the IPC handle: the exporting process (pid %ld) "
            "has exited", pid);
        break;
    case EBADF:
        msg = kind == CM_IPC_FD_PAGE
              ? PyUnicode_FromFormat(
                    "cannot open the IPC handle: process %ld no longer has "
                    "the pool page's file descriptor %d (the exported "
                    "array was freed and its page given back, the "
                    "exporting context was closed, or the handle is not "
                    "from that process)", pid, fd)
              : PyUnicode_FromFormat(
                    "cannot open the IPC handle: process %ld no longer has "
                    "the memory pool's file descriptor %d (the exporting "
                    "context was closed, or the handle is not from that "
                    "process)", pid, fd);
        break;
    case EPERM:
    case EACCES:
        msg = PyUnicode_FromFormat(
            "cannot open the IPC handle: not permitted to take file "
            "descriptor %d of process %ld: pidfd_getfd needs ptrace "
            "access to the exporting process (the same user and a Yama "
            "ptrace_scope that allows it, or CAP_SYS_PTRACE), and the "
            "process's cudamem socket did not hand it over (a process of "
            "another user, or a socket not the exporter's)", fd, pid);
        break;
    case ENOSYS:
        msg = PyUnicode_FromFormat(
            "cannot open the IPC handle: importing memory of the %s needs "
            "pidfd_open and pidfd_getfd (Linux 5.6 or later)",
            kind == CM_IPC_FD_PAGE
                ? "pool manager on virtual memory"
                : "async memory manager");
        break;
    default:
        msg = PyUnicode_FromFormat(
            "cannot open the IPC handle: taking file descriptor %d of "
            "process %ld failed (%s)", fd, pid, strerror(err));
        break;
    }
    return cm_raise_code_msg(PyExc_OSError, err, msg);
}

/* CUDAMEM_IPC_FD: 0 auto, 1 pidfd_getfd only, 2 the socket only; -1
 * with ValueError for another value. */
static int
cm_ipc_fd_way(void)
{
    const char *v = getenv("CUDAMEM_IPC_FD");

    if (v == NULL || *v == '\0' || strcmp(v, "auto") == 0) {
        return 0;
    }
    if (strcmp(v, "pidfd") == 0) {
        return 1;
    }
    if (strcmp(v, "socket") == 0) {
        return 2;
    }
    PyErr_Format(PyExc_ValueError,
                 "CUDAMEM_IPC_FD must be auto, pidfd or socket, not %.100s",
                 v);
    return -1;
}

int
cm_ipc_take_fd(long pid, int fd, uint64_t check, int kind)
{
    int pidfd = -1;
    int got = -1;
    int err = ENOSYS;
    int serr = 0;
    int way = cm_ipc_fd_way();

    if (way < 0) {
        return -1;
    }
    if (way != 2) {
#if defined(SYS_pidfd_open) && defined(SYS_pidfd_getfd)
        pidfd = (int)syscall(SYS_pidfd_open, (pid_t)pid, 0);
        if (pidfd >= 0) {
            got = (int)syscall(SYS_pidfd_getfd, pidfd, fd, 0);
        }
        err = errno;
        if (pidfd >= 0) {
            close(pidfd);
        }
#else
        (void)pidfd;
#endif
        if (got >= 0) {
            return got;
        }
    }
    /* Refused (ptrace access), or not there: ask the exporter's socket,
     * which checks check as well.  A process gone or serving none keeps
     * pidfd_getfd's reason. */
    if (way == 2 || (way == 0 && (err == EPERM || err == EACCES
                                  || err == ENOSYS))) {
        Py_BEGIN_ALLOW_THREADS
        got = cm_fd_fetch(pid, fd, check, &serr);
        Py_END_ALLOW_THREADS
        if (got >= 0) {
            return got;
        }
        if (way == 2 || serr == EBADF) {
            err = serr == ECONNREFUSED ? ESRCH : serr;
        }
    }
    return cm_ipc_take_fd_error(err, pid, fd, kind);
}
