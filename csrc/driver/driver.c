/* SPDX-License-Identifier: MIT */
/*
 * driver.c: loading the CUDA driver (or the simulator) at run time.
 *
 * Owns the process-wide entry-point table cm_cu, the backend choice, the
 * result of cuInit, and the translation of a CUresult into CudaAPIError.
 *
 * Locks and the GIL: cm_load_lock (a pthread mutex, taken through
 * cm_mu_lock) guards the table, the backend choice and cuInit, filled
 * once: cm_driver_ensure_slow takes it inside Py_BEGIN_ALLOW_THREADS and
 * holds it across the backend's cuInit (the simulator's takes sim_lock
 * inside); nothing under it touches Python, and no other lock of this file
 * nests with it.  cm_driver_ready_flag is published with a release store
 * after the table is complete, and read with an acquire load.  The
 * mutexes of cm_atfork_mutex_add are only made fresh in a fork's child,
 * and taken or given back all at once by a test aid
 * (cm_atfork_mutexes_pretend).  The GIL probe's counts are guarded by the
 * GIL.
 */
#include "driver/driver.h"
#include "driver/bytesize.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

cm_cu_table cm_cu;
CUresult cm_cu_missing = CUDA_ERROR_NOT_FOUND;
int cm_driver_ready_flag;
volatile int cm_forked;

/* The contexts being destroyed (driver/call.h, cm_ctx_dying_refused):
 * per device the handle (NULL when none) and the thread destroying it.
 * The thread is written before the handle is published (release), read
 * after it (acquire). */
int cm_ctx_dying_n;
static CUcontext cm_ctx_dying[CM_MAX_DEVICES];
static pthread_t cm_ctx_dying_by[CM_MAX_DEVICES];
static unsigned long cm_ctx_dying_epoch[CM_MAX_DEVICES];
_Thread_local unsigned long cm_call_epoch;
_Thread_local int cm_call_depth;

void
cm_ctx_dying_set(int device, CUcontext handle)
{
    if (device < 0 || device >= CM_MAX_DEVICES || handle == NULL
        || __atomic_load_n(&cm_ctx_dying[device], __ATOMIC_ACQUIRE) != NULL) {
        return;
    }
    cm_ctx_dying_by[device] = pthread_self();
    cm_ctx_dying_epoch[device] = __atomic_load_n(&cm_driver_epoch,
                                                 __ATOMIC_SEQ_CST);
    __atomic_store_n(&cm_ctx_dying[device], handle, __ATOMIC_RELEASE);
    (void)__atomic_add_fetch(&cm_ctx_dying_n, 1, __ATOMIC_SEQ_CST);
}

void
cm_ctx_dying_clear(int device)
{
    if (device < 0 || device >= CM_MAX_DEVICES
        || __atomic_load_n(&cm_ctx_dying[device], __ATOMIC_ACQUIRE) == NULL) {
        return;
    }
    __atomic_store_n(&cm_ctx_dying[device], NULL, __ATOMIC_RELEASE);
    (void)__atomic_sub_fetch(&cm_ctx_dying_n, 1, __ATOMIC_SEQ_CST);
}

int
cm_ctx_dying_check(void)
{
    CUcontext cur = NULL;
    int i;

    if (cm_cu.CtxGetCurrent == NULL || cm_cu.CtxGetCurrent(&cur)
                                           != CUDA_SUCCESS || cur == NULL) {
        return 0;
    }
    for (i = 0; i < CM_MAX_DEVICES; i++) {
        if (__atomic_load_n(&cm_ctx_dying[i], __ATOMIC_ACQUIRE) == cur
            && !pthread_equal(cm_ctx_dying_by[i], pthread_self())
            && !(cm_call_depth > 0
                 && cm_call_epoch <= cm_ctx_dying_epoch[i])) {
            return 1;
        }
    }
    return 0;
}

const char *const cm_cu_names[CM_CU_N_FUNCS] = {
#define CM_CU_NAME(name, ver) #name,
    CM_CU_FUNCS(CM_CU_NAME)
#undef CM_CU_NAME
};

/* NOTE: everything below is written under cm_load_lock, once. */
static pthread_mutex_t cm_load_lock = PTHREAD_MUTEX_INITIALIZER;
static cm_backend cm_backend_used;     /* which backend filled cm_cu */
static int cm_load_done;               /* a load was attempted */
static int cm_per_thread;              /* handle 0 is per-thread */
static char cm_init_error[1024];       /* why loading failed, or "" */
static pid_t cm_init_pid;              /* process that ran cuInit */
static void *cm_libcuda;               /* dlopen handle, never closed */

/* An environment variable read as a boolean flag ("1", "true", "yes"). */
static int
cm_env_flag(const char *name, int *out)
{
    const char *v = getenv(name);

    if (v == NULL || v[0] == '\0') {
        return 0;
    }
    *out = !(strcmp(v, "0") == 0 || strcasecmp(v, "false") == 0
             || strcasecmp(v, "no") == 0 || strcasecmp(v, "off") == 0);
    return 1;
}

/* The first of the named variables that is set decides; else dflt. */
static int
cm_env_first_flag(const char *const *names, int dflt)
{
    int v;

    for (; *names != NULL; names++) {
        if (cm_env_flag(*names, &v)) {
            return v;
        }
    }
    return dflt;
}

int
cm_env_simulator(void)
{
    static const char *const names[] = {
        "CUDAMEM_SIMULATOR", "NUMBA_ENABLE_CUDASIM", NULL};

    return cm_env_first_flag(names, 0);
}

/* What the child of a fork() makes fresh, in the order the layers above
 * added it: a mutex (cm_atfork_mutex_add) or a handler
 * (cm_atfork_child_add).  The mutexes come first, then the handlers. */
#define CM_ATFORK_MAX 16
typedef struct {
    void (*fn)(void);
    pthread_mutex_t *mu;
} cm_atfork_ent;
static cm_atfork_ent cm_atfork[CM_ATFORK_MAX];
static int cm_atfork_n;

/* In the child of a fork(): only the thread that forked exists.  Once
 * the driver was initialised here, every driver call refuses
 * (CM_CU_CALL_), so nothing waits on a lock or a thread of the driver's
 * that the fork left behind; the loader's lock is fresh, and each layer
 * above forgets what other threads held (its locks, counters of calls in
 * flight, worker threads). */
static void
cm_atfork_child(void)
{
    int i;

    if (cm_driver_ready_flag) {
        cm_forked = 1;
    }
    pthread_mutex_init(&cm_load_lock, NULL);
    for (i = 0; i < cm_atfork_n; i++) {
        if (cm_atfork[i].mu != NULL) {
            pthread_mutex_init(cm_atfork[i].mu, NULL);
        }
    }
    for (i = 0; i < cm_atfork_n; i++) {
        if (cm_atfork[i].fn != NULL) {
            cm_atfork[i].fn();
        }
    }
}

/* Add e, once (a second module exec adds it again); 0, or -1 with
 * RuntimeError when the table is full. */
static int
cm_atfork_add(cm_atfork_ent e)
{
    int i;

    for (i = 0; i < cm_atfork_n; i++) {
        if (cm_atfork[i].fn == e.fn && cm_atfork[i].mu == e.mu) {
            return 0;
        }
    }
    if (cm_atfork_n == CM_ATFORK_MAX) {
        PyErr_SetString(PyExc_RuntimeError, "too many fork handlers");
        return -1;
    }
    cm_atfork[cm_atfork_n++] = e;
    return 0;
}

int
cm_atfork_child_add(void (*fn)(void))
{
    return cm_atfork_add((cm_atfork_ent){fn, NULL});
}

int
cm_atfork_mutex_add(pthread_mutex_t *m)
{
    return cm_atfork_add((cm_atfork_ent){NULL, m});
}

int
cm_atfork_mutexes_free(void)
{
    int i;

    for (i = 0; i < cm_atfork_n; i++) {
        if (cm_atfork[i].mu == NULL) {
            continue;
        }
        if (pthread_mutex_trylock(cm_atfork[i].mu) != 0) {
            return 0;
        }
        pthread_mutex_unlock(cm_atfork[i].mu);
    }
    return 1;
}

void
cm_atfork_mutexes_pretend(int on)
{
    int i;

    for (i = 0; i < cm_atfork_n; i++) {
        if (cm_atfork[i].mu == NULL) {
            continue;
        }
        if (on) {
            pthread_mutex_lock(cm_atfork[i].mu);
        }
        else {
            pthread_mutex_unlock(cm_atfork[i].mu);
        }
    }
}

/* Resolve every entry of the table from the driver library. */
static int
cm_load_driver(void)
{
    PFN_cuGetProcAddress_v12000 gpa2;
    PFN_cuGetProcAddress_v11030 gpa1;
    cuuint64_t flags;
    const char *path = getenv("CUDAMEM_DRIVER_LIBRARY");

    if (path == NULL || path[0] == '\0') {
        path = "libcuda.so.1";
    }
    cm_libcuda = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (cm_libcuda == NULL) {
        const char *why = dlerror();

        snprintf(cm_init_error, sizeof(cm_init_error),
                 "Error at driver init: the CUDA driver library %s cannot "
                 "be loaded (%s). Install the NVIDIA driver, or set "
                 "CUDAMEM_SIMULATOR=1 to run on the CPU simulator.",
                 path, why ? why : "unknown reason");
        return -1;
    }
    *(void **)&gpa2 = dlsym(cm_libcuda, "cuGetProcAddress_v2");
    *(void **)&gpa1 = dlsym(cm_libcuda, "cuGetProcAddress");
    if (gpa2 == NULL && gpa1 == NULL) {
        snprintf(cm_init_error, sizeof(cm_init_error),
                 "Error at driver init: %s has no cuGetProcAddress; the "
                 "NVIDIA driver is too old (CUDA 11.3 or newer is needed). "
                 "Set CUDAMEM_SIMULATOR=1 to run on the CPU simulator.",
                 path);
        return -1;
    }
    flags = cm_per_thread ? CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM
                          : CU_GET_PROC_ADDRESS_DEFAULT;
    /* With the per-thread flag, entry points whose per-thread variant
     * came with CUDA 7.0 are only found when asked for at 7.0 or later;
     * their signatures are the same. */
#define CM_CU_RESOLVE(name, ver)                                           \
    do {                                                                   \
        void *p_ = NULL;                                                   \
        int v_ = (ver);                                                    \
        CUdriverProcAddressQueryResult q_;                                 \
        CUresult r_ = gpa2 ? gpa2("cu" #name, &p_, v_, flags, &q_)         \
                           : gpa1("cu" #name, &p_, v_, flags);             \
        if ((r_ != CUDA_SUCCESS || p_ == NULL) && cm_per_thread            \
            && v_ < 7000) {                                                \
            p_ = NULL;                                                     \
            r_ = gpa2 ? gpa2("cu" #name, &p_, 7000, flags, &q_)            \
                      : gpa1("cu" #name, &p_, 7000, flags);                \
        }                                                                  \
        *(void **)&cm_cu.name = (r_ == CUDA_SUCCESS) ? p_ : NULL;          \
    } while (0);
    CM_CU_FUNCS(CM_CU_RESOLVE)
#undef CM_CU_RESOLVE
    cm_cu_missing = CUDA_ERROR_NOT_FOUND;
    cm_backend_used = CM_BACKEND_DRIVER;
    return 0;
}

/* The name of rc: the driver's, else CUDA_ERROR_<n>. */
static const char *
cm_cu_error_name(CUresult rc, char *buf, size_t n)
{
    const char *name = NULL;

    if (cm_cu.GetErrorName == NULL
        || cm_cu.GetErrorName(rc, &name) != CUDA_SUCCESS || name == NULL) {
        snprintf(buf, n, "CUDA_ERROR_%d", (int)rc);
        return buf;
    }
    return name;
}

/* Load and initialise; runs without the GIL, under cm_load_lock. */
static void
cm_load_locked(void)
{
    static const char *const ptds_names[] = {
        "CUDAMEM_PER_THREAD_DEFAULT_STREAM",
        "NUMBA_CUDA_PER_THREAD_DEFAULT_STREAM",
        "CUDA_PYTHON_CUDA_PER_THREAD_DEFAULT_STREAM", NULL};
    int disabled = 0;
    CUresult rc;
    char buf[32];

    cm_load_done = 1;
    cm_per_thread = cm_env_first_flag(ptds_names, 0);
    if (cm_env_flag("NUMBA_DISABLE_CUDA", &disabled) && disabled
        && !cm_env_simulator()) {
        snprintf(cm_init_error, sizeof(cm_init_error),
                 "Error at driver init: \nCUDA is disabled due to setting "
                 "NUMBA_DISABLE_CUDA=1 in the environment, or because CUDA "
                 "is unsupported on 32-bit systems.:");
        return;
    }
    if (cm_env_simulator()) {
        cm_sim_fill(&cm_cu, cm_per_thread);
        cm_cu_missing = CUDA_ERROR_NOT_SUPPORTED;
        cm_backend_used = CM_BACKEND_SIM;
    }
    else if (cm_load_driver() < 0) {
        memset(&cm_cu, 0, sizeof(cm_cu));
        return;
    }
    rc = cm_cu.Init ? cm_cu.Init(0) : cm_cu_missing;
    if (rc != CUDA_SUCCESS) {
        snprintf(cm_init_error, sizeof(cm_init_error),
                 "Error at driver init: Call to cuInit results in %s (%d). "
                 "No usable GPU was found; set CUDAMEM_SIMULATOR=1 to run "
                 "on the CPU simulator.",
                 cm_cu_error_name(rc, buf, sizeof(buf)), (int)rc);
        return;
    }
    cm_init_pid = getpid();
    __atomic_store_n(&cm_driver_ready_flag, 1, __ATOMIC_RELEASE);
}

int
cm_driver_ensure_slow(void)
{
    if (cm_forked || (cm_driver_ready_flag && cm_init_pid != getpid())) {
        CM_RAISE(CudaDriverError, "CUDA initialized before forking");
        return -1;
    }
    if (!__atomic_load_n(&cm_driver_ready_flag, __ATOMIC_ACQUIRE)) {
        Py_BEGIN_ALLOW_THREADS
        cm_mu_lock(&cm_load_lock);
        if (!cm_load_done) {
            cm_load_locked();
        }
        cm_mu_unlock(&cm_load_lock);
        Py_END_ALLOW_THREADS
    }
    if (!__atomic_load_n(&cm_driver_ready_flag, __ATOMIC_ACQUIRE)) {
        CM_RAISE(CudaSupportError, "%s", cm_init_error);
        return -1;
    }
    return 0;
}

cm_backend
cm_driver_backend(void)
{
    return __atomic_load_n(&cm_driver_ready_flag, __ATOMIC_ACQUIRE)
               ? cm_backend_used : CM_BACKEND_NONE;
}

int
cm_driver_per_thread(void)
{
    return cm_per_thread;
}

int
cm_raise_code_msg(PyObject *cls, int code, PyObject *msg)
{
    PyObject *exc;

    if (msg == NULL) {
        return -1;
    }
    exc = PyObject_CallFunction(cls, "iO", code, msg);
    Py_DECREF(msg);
    if (exc != NULL) {
        PyErr_SetObject((PyObject *)Py_TYPE(exc), exc);
        Py_DECREF(exc);
    }
    return -1;
}

int
cm_raise_api_msg(CUresult rc, PyObject *msg)
{
    if (msg == NULL || CM_REGISTERED(CudaAPIError) == NULL) {
        Py_XDECREF(msg);
        return -1;
    }
    return cm_raise_code_msg(cm_st->CudaAPIError, (int)rc, msg);
}

int
cm_raise_cu(CUresult rc, const char *fn)
{
    char buf[32];
    const char *name;
    PyObject *cls;
    PyObject *exc;

    if (rc == CUDA_ERROR_NOT_INITIALIZED
        && (cm_forked || (cm_init_pid && cm_init_pid != getpid()))) {
        CM_RAISE(CudaDriverError, "CUDA initialized before forking");
        return -1;
    }
    name = cm_cu_error_name(rc, buf, sizeof(buf));
    if (rc == CUDA_ERROR_OUT_OF_MEMORY) {
        cls = CM_REGISTERED(CudaOutOfMemoryError);
    }
    else if (rc >= CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED
             && rc <= CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD) {
        /* A capture refused the call: one cudamem did not know of (it
         * refuses work during its own before asking the driver). */
        cls = CM_REGISTERED(StreamCaptureError);
    }
    else {
        cls = CM_REGISTERED(CudaAPIError);
    }
    if (cls == NULL) {
        return -1;
    }
    exc = PyObject_CallFunction(cls, "iss", (int)rc, fn, name);
    if (exc != NULL) {
        PyErr_SetObject(cls, exc);
        Py_DECREF(exc);
    }
    return -1;
}

/* ------------------------------------------------------------------ */
/* Python-level functions                                              */
/* ------------------------------------------------------------------ */

PyDoc_STRVAR(cm_init_driver_doc,
"_init_driver()\n--\n\n"
"Load the backend and run cuInit now; raise CudaSupportError if that "
"fails.");

static PyObject *
cm_init_driver(PyObject *mod, PyObject *unused)
{
    (void)mod;
    (void)unused;
    if (cm_driver_ensure() < 0) {
        return NULL;
    }
    Py_RETURN_NONE;
}

PyDoc_STRVAR(cm_init_error_doc,
"_init_error()\n--\n\n"
"The text of the driver initialisation error, or None.  Tries to load the "
"backend first.");

static PyObject *
cm_init_error_fn(PyObject *mod, PyObject *unused)
{
    (void)mod;
    (void)unused;
    if (cm_driver_ensure() == 0) {
        Py_RETURN_NONE;
    }
    if (!PyErr_ExceptionMatches(cm_st->CudaSupportError)) {
        return NULL;
    }
    PyErr_Clear();
    return PyUnicode_FromString(cm_init_error);
}

PyDoc_STRVAR(cm_backend_doc,
"_backend()\n--\n\n"
"'driver' or 'simulator' once the backend is loaded, else None.  Does not "
"load it.");

static PyObject *
cm_backend_fn(PyObject *mod, PyObject *unused)
{
    (void)mod;
    (void)unused;
    switch (cm_driver_backend()) {
    case CM_BACKEND_DRIVER:
        return PyUnicode_FromString("driver");
    case CM_BACKEND_SIM:
        return PyUnicode_FromString("simulator");
    default:
        Py_RETURN_NONE;
    }
}

PyDoc_STRVAR(cm_driver_version_doc,
"driver_version()\n--\n\n"
"The CUDA version the driver (or simulator) implements, as (major, "
"minor).");

static PyObject *
cm_driver_version(PyObject *mod, PyObject *unused)
{
    int v = 0;

    (void)mod;
    (void)unused;
    if (cm_driver_ensure() < 0 || CM_CU(DriverGetVersion, (&v)) < 0) {
        return NULL;
    }
    return Py_BuildValue("(ii)", v / 1000, (v % 1000) / 10);
}

/* Which CUDA headers the build used and where they came from, as
 * setup.py words it; _cuda_headers on the module. */
#ifndef CM_CUDA_HEADERS
#define CM_CUDA_HEADERS "CUDA headers of an unrecorded origin"
#endif

PyDoc_STRVAR(cm_runtime_version_doc,
"runtime_version()\n--\n\n"
"The version of the CUDA Toolkit headers cudamem was built with, as "
"(major, minor).");

static PyObject *
cm_runtime_version(PyObject *mod, PyObject *unused)
{
    (void)mod;
    (void)unused;
    return Py_BuildValue("(ii)", CUDA_VERSION / 1000,
                         (CUDA_VERSION % 1000) / 10);
}

PyDoc_STRVAR(cm_per_thread_doc,
"_per_thread_default_stream()\n--\n\n"
"Whether stream handle 0 means the per-thread default stream.");

static PyObject *
cm_per_thread_fn(PyObject *mod, PyObject *unused)
{
    (void)mod;
    (void)unused;
    if (cm_driver_ensure() < 0) {
        return NULL;
    }
    return PyBool_FromLong(cm_per_thread);
}

PyDoc_STRVAR(cm_sim_inject_doc,
"_sim_inject(name, nth, code)\n--\n\n"
"Simulator only: make the nth call from now (1 = the next) of the driver "
"entry point cu<name> return the CUresult code.  nth=0 disarms.");

/* The index of driver entry point name ("cuMemAlloc" or "MemAlloc") for
 * the simulator's test aids, which need the simulator backend; -1 with
 * an exception (what names the aid). */
static int
cm_sim_entry_index(const char *name, const char *what)
{
    int i;

    if (cm_driver_ensure() < 0) {
        return -1;
    }
    if (cm_driver_backend() != CM_BACKEND_SIM) {
        PyErr_Format(PyExc_RuntimeError,
                     "%s needs the simulator backend (CUDAMEM_SIMULATOR=1)",
                     what);
        return -1;
    }
    if (strncmp(name, "cu", 2) == 0) {
        name += 2;
    }
    for (i = 0; i < CM_CU_N_FUNCS; i++) {
        if (strcmp(cm_cu_names[i], name) == 0) {
            return i;
        }
    }
    PyErr_Format(PyExc_ValueError, "unknown driver entry point: cu%s",
                 name);
    return -1;
}

static PyObject *
cm_sim_inject_fn(PyObject *mod, PyObject *args)
{
    const char *name;
    long nth;
    int code;
    int i;

    (void)mod;
    if (!PyArg_ParseTuple(args, "sli:_sim_inject", &name, &nth, &code)) {
        return NULL;
    }
    if (nth < 0) {
        PyErr_Format(PyExc_ValueError, "bad count for %s: %ld", name, nth);
        return NULL;
    }
    if ((i = cm_sim_entry_index(name, "fault injection")) < 0) {
        return NULL;
    }
    cm_sim_inject(i, nth, (CUresult)code);
    Py_RETURN_NONE;
}

PyDoc_STRVAR(cm_sim_block_doc,
"_sim_block(name, nth)\n--\n\n"
"Simulator only, for tests that force an order between threads: the nth "
"call from now (1 = the next), from any thread, of the driver entry "
"point cu<name> waits on entry until _sim_unblock(name).  nth=0 "
"disarms.  The waiting thread must not hold the GIL (the call must be one "
"cudamem makes with the GIL released).");

static PyObject *
cm_sim_block_fn(PyObject *mod, PyObject *args)
{
    const char *name;
    long nth;
    int i;

    (void)mod;
    if (!PyArg_ParseTuple(args, "sl:_sim_block", &name, &nth)) {
        return NULL;
    }
    if (nth < 0) {
        PyErr_Format(PyExc_ValueError, "bad count for %s: %ld", name, nth);
        return NULL;
    }
    if ((i = cm_sim_entry_index(name, "_sim_block")) < 0) {
        return NULL;
    }
    cm_sim_block(i, nth);
    Py_RETURN_NONE;
}

PyDoc_STRVAR(cm_sim_unblock_doc,
"_sim_unblock(name)\n--\n\n"
"Simulator only: let the call of cu<name> that _sim_block armed go on "
"(now if it is waiting, at once when it comes).");

static PyObject *
cm_sim_unblock_fn(PyObject *mod, PyObject *arg)
{
    const char *name = PyUnicode_AsUTF8(arg);
    int i;

    (void)mod;
    if (name == NULL || (i = cm_sim_entry_index(name, "_sim_unblock")) < 0) {
        return NULL;
    }
    cm_sim_unblock(i);
    Py_RETURN_NONE;
}

PyDoc_STRVAR(cm_sim_blocked_doc,
"_sim_blocked(name)\n--\n\n"
"Simulator only: how many calls of cu<name> are waiting now (_sim_block).");

static PyObject *
cm_sim_blocked_fn(PyObject *mod, PyObject *arg)
{
    const char *name = PyUnicode_AsUTF8(arg);
    int i;

    (void)mod;
    if (name == NULL || (i = cm_sim_entry_index(name, "_sim_blocked")) < 0) {
        return NULL;
    }
    return PyLong_FromLong(cm_sim_blocked(i));
}

PyDoc_STRVAR(cm_sim_stream_live_doc,
"_sim_stream_live(handle)\n--\n\n"
"Whether the simulator has a live stream of this handle (a test aid).");

static PyObject *
cm_sim_stream_live_fn(PyObject *mod, PyObject *arg)
{
    void *h;

    (void)mod;
    h = PyLong_AsVoidPtr(arg);
    if (h == NULL && PyErr_Occurred()) {
        return NULL;
    }
    if (cm_driver_ensure() < 0) {
        return NULL;
    }
    if (cm_driver_backend() != CM_BACKEND_SIM) {
        PyErr_SetString(PyExc_RuntimeError,
                        "_sim_stream_live needs the simulator backend "
                        "(CUDAMEM_SIMULATOR=1)");
        return NULL;
    }
    return PyBool_FromLong(cm_sim_stream_live(h));
}

/* ------------------------------------------------------------------ */
/* The GIL probe (see cm_gil_probe_now in driver/call.h)              */
/* ------------------------------------------------------------------ */

/* Waits in bucket k are shorter than 2**(k + 8) ns; the last bucket
 * holds the longer ones. */
#define CM_PROBE_BUCKETS 17

int cm_gil_probe_on;
int cm_copy_keep_gil = CM_KEEP_GIL_AUTO;
_Thread_local CUstream cm_done_hint;
int cm_sync_copy_call[2] = {CM_SYNC_ASYNC, CM_SYNC_CALL};
size_t cm_sync_async_max = SIZE_MAX;

/* NOTE: guarded by the GIL: noted by a thread that took it back. */
static struct {
    unsigned long long releases;     /* GIL releases noted */
    unsigned long long released_ns;  /* time run with the GIL released */
    unsigned long long wait_ns;      /* time waited to take it back */
    unsigned long long max_wait_ns;  /* the longest such wait */
    unsigned long long hist[CM_PROBE_BUCKETS];  /* the waits by length */
} cm_probe[CM_PROBE_KINDS];

uint64_t
cm_gil_probe_clock(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* One release of kind: GIL released at t0, given back to the GIL's
 * waiters at t1, taken back now. */
void
cm_gil_probe_note(int kind, uint64_t t0, uint64_t t1)
{
    uint64_t wait = cm_gil_probe_clock() - t1;
    int k = 0;

    while (k < CM_PROBE_BUCKETS - 1 && wait >= ((uint64_t)256 << k)) {
        k++;
    }
    cm_probe[kind].releases++;
    cm_probe[kind].released_ns += t1 - t0;
    cm_probe[kind].wait_ns += wait;
    if (wait > cm_probe[kind].max_wait_ns) {
        cm_probe[kind].max_wait_ns = wait;
    }
    cm_probe[kind].hist[k]++;
}

PyDoc_STRVAR(cm_gil_probe_doc,
"_gil_probe(on, /)\n--\n\n"
"Switch the GIL probe on (its counts start from zero) or off.  While on,\n"
"every release of the GIL around driver calls records how long the\n"
"thread ran with the GIL released and how long it then waited to take\n"
"it back (_gil_probe_stats()).  A measuring aid for the benchmarks.");

static PyObject *
cm_gil_probe_fn(PyObject *mod, PyObject *arg)
{
    int on = PyObject_IsTrue(arg);

    (void)mod;
    if (on < 0) {
        return NULL;
    }
    if (on) {
        memset(cm_probe, 0, sizeof(cm_probe));
    }
    __atomic_store_n(&cm_gil_probe_on, on, __ATOMIC_RELAXED);
    Py_RETURN_NONE;
}

PyDoc_STRVAR(cm_gil_probe_stats_doc,
"_gil_probe_stats()\n--\n\n"
"The GIL probe's counts since it was last switched on: {'on': bool,\n"
"'nogil': {...}, 'drop': {...}}, 'nogil' for the driver calls made with\n"
"the GIL released, 'drop' for the GIL given up around a mutex or a call\n"
"while host callbacks are in flight; each with 'releases',\n"
"'released_ns', 'wait_ns', 'max_wait_ns' and 'wait_hist' (a list: item k\n"
"counts the waits shorter than 2**(k + 8) ns, the last the longer ones).");

static PyObject *
cm_gil_probe_kind(int kind)
{
    PyObject *hist = PyList_New(CM_PROBE_BUCKETS);
    PyObject *d;
    int k;

    if (hist == NULL) {
        return NULL;
    }
    for (k = 0; k < CM_PROBE_BUCKETS; k++) {
        PyObject *n = PyLong_FromUnsignedLongLong(cm_probe[kind].hist[k]);

        if (n == NULL) {
            Py_DECREF(hist);
            return NULL;
        }
        PyList_SET_ITEM(hist, k, n);   /* steals n */
    }
    /* "N" steals hist, also on failure. */
    d = Py_BuildValue("{sKsKsKsKsN}", "releases", cm_probe[kind].releases,
                      "released_ns", cm_probe[kind].released_ns,
                      "wait_ns", cm_probe[kind].wait_ns,
                      "max_wait_ns", cm_probe[kind].max_wait_ns,
                      "wait_hist", hist);
    return d;
}

static PyObject *
cm_gil_probe_stats_fn(PyObject *mod, PyObject *unused)
{
    PyObject *nogil;
    PyObject *drop;
    int on = __atomic_load_n(&cm_gil_probe_on, __ATOMIC_RELAXED);

    (void)mod;
    (void)unused;
    nogil = cm_gil_probe_kind(CM_PROBE_NOGIL);
    if (nogil == NULL) {
        return NULL;
    }
    drop = cm_gil_probe_kind(CM_PROBE_DROP);
    if (drop == NULL) {
        Py_DECREF(nogil);
        return NULL;
    }
    /* "N" steals nogil and drop, also on failure. */
    return Py_BuildValue("{sOsNsN}", "on", on ? Py_True : Py_False,
                         "nogil", nogil, "drop", drop);
}

PyDoc_STRVAR(cm_copy_keep_gil_doc,
"_copy_keep_gil(on=None, /)\n--\n\n"
"Whether an asynchronous copy_to_device / copy_to_host of one piece\n"
"between a device array and cudamem's page-locked host memory\n"
"(pinned_array, mapped_array) keeps the GIL around the driver call,\n"
"which only enqueues.  True: always; False: never (it is released, as\n"
"around every other copy); 'auto', the default: only while two or\n"
"more driver calls of other threads are in flight with the GIL\n"
"released; then also a host-to-device enqueue of up to 64 KiB from\n"
"any other host memory (the driver stages it at once) keeps it, and\n"
"so does a Stream.synchronize of the stream that the thread's last\n"
"copy into such memory went to, when a query first finds it done.\n"
"Sets it when on is given (a truth value or 'auto');\n"
"returns the previous setting (False, True or 'auto').");

static PyObject *
cm_copy_keep_gil_fn(PyObject *mod, PyObject *const *args, Py_ssize_t nargs)
{
    int old = __atomic_load_n(&cm_copy_keep_gil, __ATOMIC_RELAXED);
    int on;

    (void)mod;
    if (nargs > 1) {
        PyErr_SetString(PyExc_TypeError,
                        "_copy_keep_gil takes at most one argument");
        return NULL;
    }
    if (nargs == 1 && args[0] != Py_None) {
        if (PyUnicode_Check(args[0])) {
            if (PyUnicode_CompareWithASCIIString(args[0], "auto") != 0) {
                PyErr_Format(PyExc_ValueError,
                             "_copy_keep_gil: %R is not a mode (a truth "
                             "value or 'auto')", args[0]);
                return NULL;
            }
            on = CM_KEEP_GIL_AUTO;
        }
        else {
            on = PyObject_IsTrue(args[0]);
            if (on < 0) {
                return NULL;
            }
        }
        __atomic_store_n(&cm_copy_keep_gil, on, __ATOMIC_RELAXED);
    }
    if (old == CM_KEEP_GIL_AUTO) {
        return PyUnicode_FromString("auto");
    }
    return PyBool_FromLong(old);
}

/* The names of the CM_SYNC_* modes, in their order. */
static const char *const cm_sync_copy_names[] = {"sync", "async",
                                                  "async_wait"};

PyDoc_STRVAR(cm_sync_copy_call_doc,
"_sync_copy_call(mode=None, /)\n--\n\n"
"A test aid for the benchmarks: how a synchronous copy (no stream) of\n"
"one contiguous piece between a device array and pageable host memory is\n"
"made.  'sync': cuMemcpyHtoD / cuMemcpyDtoH.  'async': cuMemcpyHtoDAsync /\n"
"cuMemcpyDtoHAsync on the default stream (legacy, or per-thread), used\n"
"only where the host memory is known pageable.  'async_wait': the same,\n"
"and a copy into host memory then synchronizes that stream.  One mode\n"
"sets both directions; 'H/D' (for example 'async/sync', the default)\n"
"sets host to device to H and device to host to D.  Sets the modes when\n"
"given; returns the previous ones, one name when both were the same.\n"
"A new process reads them from CUDAMEM_SYNC_COPY_CALL (the same names)\n"
"when it is set.");

/* The mode named by the str s (of length n), or -1. */
static int
cm_sync_copy_mode(const char *s, Py_ssize_t n)
{
    int i;

    for (i = 0; i < 3; i++) {
        if ((size_t)n == strlen(cm_sync_copy_names[i])
            && memcmp(s, cm_sync_copy_names[i], (size_t)n) == 0) {
            return i;
        }
    }
    return -1;
}

/* The modes named by s (of length n): one mode for both directions, or
 * 'H/D'.  0, or -1 (no exception set). */
static int
cm_sync_copy_parse(const char *s, Py_ssize_t n, int *nh, int *nd)
{
    const char *slash = memchr(s, '/', (size_t)n);

    if (slash == NULL) {
        *nh = *nd = cm_sync_copy_mode(s, n);
    }
    else {
        *nh = cm_sync_copy_mode(s, slash - s);
        *nd = cm_sync_copy_mode(slash + 1, n - (slash - s) - 1);
    }
    return *nh < 0 || *nd < 0 ? -1 : 0;
}

static PyObject *
cm_sync_copy_call_fn(PyObject *mod, PyObject *const *args, Py_ssize_t nargs)
{
    int h = __atomic_load_n(&cm_sync_copy_call[CM_SYNC_HTOD],
                            __ATOMIC_RELAXED);
    int d = __atomic_load_n(&cm_sync_copy_call[CM_SYNC_DTOH],
                            __ATOMIC_RELAXED);
    const char *s;
    Py_ssize_t n;
    int nh;
    int nd;

    (void)mod;
    if (nargs > 1) {
        PyErr_SetString(PyExc_TypeError,
                        "_sync_copy_call takes at most one argument");
        return NULL;
    }
    if (nargs == 1 && args[0] != Py_None) {
        if (!PyUnicode_Check(args[0])) {
            PyErr_Format(PyExc_TypeError,
                         "_sync_copy_call: mode must be a str, not %.100s",
                         Py_TYPE(args[0])->tp_name);
            return NULL;
        }
        s = PyUnicode_AsUTF8AndSize(args[0], &n);
        if (s == NULL) {
            return NULL;
        }
        if (cm_sync_copy_parse(s, n, &nh, &nd) < 0) {
            PyErr_Format(PyExc_ValueError,
                         "_sync_copy_call: mode must be 'sync', 'async' or "
                         "'async_wait', or two of them as 'H/D' (host to "
                         "device / device to host), not %R", args[0]);
            return NULL;
        }
        __atomic_store_n(&cm_sync_copy_call[CM_SYNC_HTOD], nh,
                         __ATOMIC_RELAXED);
        __atomic_store_n(&cm_sync_copy_call[CM_SYNC_DTOH], nd,
                         __ATOMIC_RELAXED);
    }
    if (h == d) {
        return PyUnicode_FromString(cm_sync_copy_names[h]);
    }
    return PyUnicode_FromFormat("%s/%s", cm_sync_copy_names[h],
                                cm_sync_copy_names[d]);
}

PyDoc_STRVAR(cm_sync_async_max_doc,
"_sync_async_max(nbytes=None, /)\n--\n\n"
"A test aid for the benchmarks: the largest synchronous copy of pageable\n"
"memory that _sync_copy_call's 'async' and 'async_wait' modes make with\n"
"the ...Async call; a larger one gets the synchronous call.  None: no\n"
"limit (the default).  Sets it when given; returns the previous one.  A\n"
"new process reads it from CUDAMEM_SYNC_ASYNC_MAX (bytes, with an\n"
"optional K, M or G) when it is set.");

static PyObject *
cm_sync_async_max_fn(PyObject *mod, PyObject *const *args,
                     Py_ssize_t nargs)
{
    size_t old = __atomic_load_n(&cm_sync_async_max, __ATOMIC_RELAXED);
    size_t n;

    (void)mod;
    if (nargs > 1) {
        PyErr_SetString(PyExc_TypeError,
                        "_sync_async_max takes at most one argument");
        return NULL;
    }
    if (nargs == 1) {
        if (args[0] == Py_None) {
            n = SIZE_MAX;
        }
        else {
            n = PyLong_AsSize_t(args[0]);
            if (n == (size_t)-1 && PyErr_Occurred()) {
                if (PyErr_ExceptionMatches(PyExc_OverflowError)) {
                    PyErr_SetString(PyExc_ValueError,
                                    "_sync_async_max: nbytes must be None "
                                    "or an int from 0 to 2**64-1");
                }
                return NULL;
            }
        }
        __atomic_store_n(&cm_sync_async_max, n, __ATOMIC_RELAXED);
    }
    return old == SIZE_MAX ? Py_NewRef(Py_None) : PyLong_FromSize_t(old);
}

static PyMethodDef cm_driver_methods[] = {
    {"_copy_keep_gil", (PyCFunction)(void (*)(void))cm_copy_keep_gil_fn,
     METH_FASTCALL, cm_copy_keep_gil_doc},
    {"_sync_copy_call", (PyCFunction)(void (*)(void))cm_sync_copy_call_fn,
     METH_FASTCALL, cm_sync_copy_call_doc},
    {"_sync_async_max", (PyCFunction)(void (*)(void))cm_sync_async_max_fn,
     METH_FASTCALL, cm_sync_async_max_doc},
    {"_gil_probe", cm_gil_probe_fn, METH_O, cm_gil_probe_doc},
    {"_gil_probe_stats", cm_gil_probe_stats_fn, METH_NOARGS,
     cm_gil_probe_stats_doc},
    {"_init_driver", cm_init_driver, METH_NOARGS, cm_init_driver_doc},
    {"_init_error", cm_init_error_fn, METH_NOARGS, cm_init_error_doc},
    {"_backend", cm_backend_fn, METH_NOARGS, cm_backend_doc},
    {"driver_version", cm_driver_version, METH_NOARGS,
     cm_driver_version_doc},
    {"runtime_version", cm_runtime_version, METH_NOARGS,
     cm_runtime_version_doc},
    {"_per_thread_default_stream", cm_per_thread_fn, METH_NOARGS,
     cm_per_thread_doc},
    {"_sim_inject", cm_sim_inject_fn, METH_VARARGS, cm_sim_inject_doc},
    {"_sim_block", cm_sim_block_fn, METH_VARARGS, cm_sim_block_doc},
    {"_sim_unblock", cm_sim_unblock_fn, METH_O, cm_sim_unblock_doc},
    {"_sim_blocked", cm_sim_blocked_fn, METH_O, cm_sim_blocked_doc},
    {"_sim_stream_live", cm_sim_stream_live_fn, METH_O,
     cm_sim_stream_live_doc},
    {NULL, NULL, 0, NULL},
};

int
cm_driver_init(PyObject *mod, cm_state *st)
{
    static int atfork_done;
    const char *v = getenv("CUDAMEM_SYNC_COPY_CALL");
    int nh;
    int nd;

    (void)st;
    if (v != NULL && v[0] != '\0') {
        /* For an A/B of the modes on a GPU without changing the code. */
        if (cm_sync_copy_parse(v, (Py_ssize_t)strlen(v), &nh, &nd) < 0) {
            PyErr_Format(PyExc_ValueError,
                         "CUDAMEM_SYNC_COPY_CALL=%.100s: 'sync', 'async' or "
                         "'async_wait', or two of them as 'H/D' (host to "
                         "device / device to host)", v);
            return -1;
        }
        __atomic_store_n(&cm_sync_copy_call[CM_SYNC_HTOD], nh,
                         __ATOMIC_RELAXED);
        __atomic_store_n(&cm_sync_copy_call[CM_SYNC_DTOH], nd,
                         __ATOMIC_RELAXED);
    }
    v = getenv("CUDAMEM_SYNC_ASYNC_MAX");
    if (v != NULL && v[0] != '\0') {
        unsigned long long m;

        if (cm_parse_bytes(v, (unsigned long long)(SIZE_MAX - 1), &m) < 0) {
            PyErr_Format(PyExc_ValueError,
                         "CUDAMEM_SYNC_ASYNC_MAX=%.100s: a byte count "
                         "(digits, then an optional K, M or G)", v);
            return -1;
        }
        __atomic_store_n(&cm_sync_async_max, (size_t)m, __ATOMIC_RELAXED);
    }
    if (!atfork_done) {
        if (pthread_atfork(NULL, NULL, cm_atfork_child) != 0) {
            PyErr_SetString(PyExc_OSError, "pthread_atfork failed");
            return -1;
        }
        atfork_done = 1;
    }
    if (PyModule_AddStringConstant(mod, "_cuda_headers",
                                   CM_CUDA_HEADERS) < 0) {
        return -1;
    }
    return PyModule_AddFunctions(mod, cm_driver_methods);
}
