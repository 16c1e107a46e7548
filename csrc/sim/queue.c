/* SPDX-License-Identifier: MIT */
/*
 * sim/queue.c: the simulator's streams and their work queues: one worker
 * thread per stream running its operations in order (the section
 * "Streams and operations" of the simulator, split from sim.c), and the
 * per-thread state (sim_tls_get), whose destructor destroys a thread's
 * per-thread default streams when it exits.  The operations themselves
 * and the streams' and events' reference counts are sim/op.c's.
 *
 * Locks and the GIL: runs with sim.lock (sim.c) held unless noted, and
 * takes no other lock.  sim_wait and sim_drain wait on sim.cond, releasing
 * sim.lock meanwhile (refused on a worker, where the wait could be on
 * itself).  Each stream's worker (sim_worker) takes sim.lock, waits on its
 * stream's cv or on sim.cond, and gives the lock up while an operation runs
 * (a copy, memset, host function or callback), so a host function may call
 * back into the simulator; it broadcasts sim.cond when the operation is
 * done.  cm_sim_stream_live, and the per-thread state's destructor
 * (sim_tls_free, destroying the thread's per-thread default streams), take
 * sim.lock themselves.  Never the GIL: a worker does not hold it, and a
 * host function that needs it takes it itself with no simulator lock held.
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

/* ------------------------------------------------------------------ */
/* Streams and operations (lock held unless noted)                     */
/* ------------------------------------------------------------------ */

static void *sim_worker(void *arg);

/* A new stream of c with its worker started; NULL when out of memory
 * or threads. */
sim_stream *
sim_stream_new(sim_ctx *c, int kind)
{
    sim_stream *s = calloc(1, sizeof(*s));
    pthread_attr_t attr;
    pthread_t thread;
    sigset_t all, old;
    int err;

    if (s == NULL) {
        return NULL;
    }
    if (pthread_cond_init(&s->cv, NULL) != 0) {
        free(s);
        return NULL;
    }
    s->ctx = c;
    s->kind = kind;
    s->refs = 2;            /* the handle and the worker */
    if (pthread_attr_init(&attr) != 0) {
        pthread_cond_destroy(&s->cv);
        free(s);
        return NULL;
    }
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    /* Signals belong to the application's threads, not to workers; but
     * a fault in a worker (a host function's bug) must reach the
     * process's handlers (faulthandler, a sanitizer): were it blocked,
     * the kernel would kill the process without a word. */
    sigfillset(&all);
    sigdelset(&all, SIGSEGV);
    sigdelset(&all, SIGBUS);
    sigdelset(&all, SIGFPE);
    sigdelset(&all, SIGILL);
    sigdelset(&all, SIGABRT);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    err = pthread_create(&thread, &attr, sim_worker, s);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    pthread_attr_destroy(&attr);
    if (err != 0) {
        pthread_cond_destroy(&s->cv);
        free(s);
        return NULL;
    }
    s->next = c->streams;
    if (c->streams != NULL) {
        c->streams->prev = s;
    }
    c->streams = s;
    return s;
}

/* Drop the handle: queued work still runs, then the worker exits. */
void
sim_stream_destroy(sim_stream *s)
{
    if (s->destroyed) {
        return;
    }
    s->destroyed = 1;
    sim_set_del(&sim.streams, s);
    sim_capture_stream_gone(s);
    pthread_cond_signal(&s->cv);
    sim_stream_unref(s);
}

/* Whether op is a host function or callback of the program's (not one
 * of cudamem's kernels run as one): counted in its context's hostfns
 * from its enqueue to its end. */
static int
sim_op_is_hostfn(const sim_op *op)
{
    return op->kind == SIM_OP_CALLBACK
           || (op->kind == SIM_OP_HOSTFN && !op->u.hostfn.kernel);
}

/* Queue op on s behind its implicit dependencies.  Always consumes op;
 * on success s->submitted is op's ticket. */
CUresult
sim_enqueue(sim_stream *s, sim_op *op)
{
    sim_stream *t;
    CUresult rc;

    if (s->cap != NULL) {
        /* Recorded into the capture instead of run. */
        return sim_capture_record(s, op, -1, NULL, NULL);
    }
    rc = sim_capture_legacy(s, 1);
    if (rc != CUDA_SUCCESS) {
        sim_op_free(op);
        return rc;
    }
    if (s->kind == SIM_STREAM_LEGACY) {
        for (t = s->ctx->streams; t != NULL; t = t->next) {
            if (t != s && sim_blocking(t)
                && sim_op_dep(op, t, t->submitted) != 0) {
                sim_op_free(op);
                return CUDA_ERROR_OUT_OF_MEMORY;
            }
        }
    }
    else if (sim_blocking(s) && s->ctx->legacy != NULL) {
        t = s->ctx->legacy;
        if (sim_op_dep(op, t, t->submitted) != 0) {
            sim_op_free(op);
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
    }
    op->ticket = ++s->submitted;
    op->gseq = ++sim.gseq;
    s->ctx->hostfns += sim_op_is_hostfn(op);
    if (s->tail != NULL) {
        s->tail->next = op;
    }
    else {
        s->head = op;
    }
    s->tail = op;
    pthread_cond_signal(&s->cv);
    return CUDA_SUCCESS;
}

/* Frees tls at thread exit. */
static pthread_key_t tls_key;
static pthread_once_t tls_once = PTHREAD_ONCE_INIT;

static void
sim_tls_free(void *p)
{
    sim_tls *t = p;
    size_t i;

    if (atomic_load(&sim_state) == SIM_READY && t->nptds > 0) {
        sim_lock();
        for (i = 0; i < t->nptds; i++) {
            if (!t->ptds[i].ctx->destroyed) {
                sim_stream_destroy(t->ptds[i].stream);
            }
        }
        sim_unlock();
    }
    free(t->stack);
    free(t->ptds);
    free(t);
    tls = NULL;
}

static void
sim_tls_key_make(void)
{
    pthread_key_create(&tls_key, sim_tls_free);
}

/* This thread's state, made on first use; NULL when out of memory. */
sim_tls *
sim_tls_get(void)
{
    if (tls == NULL) {
        pthread_once(&tls_once, sim_tls_key_make);
        tls = calloc(1, sizeof(*tls));
        if (tls != NULL) {
            pthread_setspecific(tls_key, tls);
        }
    }
    return tls;
}

/* This thread's per-thread default stream for c, made on first use. */
static CUresult
sim_ptds_get(sim_ctx *c, sim_stream **out)
{
    sim_tls *t = sim_tls_get();
    size_t i, j;

    if (t == NULL) {
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    /* Forget the streams of destroyed contexts; they went with them. */
    for (i = j = 0; i < t->nptds; i++) {
        if (!t->ptds[i].ctx->destroyed) {
            t->ptds[j++] = t->ptds[i];
        }
    }
    t->nptds = j;
    for (i = 0; i < t->nptds; i++) {
        if (t->ptds[i].ctx == c) {
            *out = t->ptds[i].stream;
            return CUDA_SUCCESS;
        }
    }
    if (t->nptds == t->capptds) {
        size_t cap = t->capptds ? t->capptds * 2 : 4;
        sim_ptds *v = realloc(t->ptds, cap * sizeof(*v));
        if (v == NULL) {
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
        t->ptds = v;
        t->capptds = cap;
    }
    *out = sim_stream_new(c, SIM_STREAM_PER_THREAD);
    if (*out == NULL) {
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    t->ptds[t->nptds].ctx = c;
    t->ptds[t->nptds].stream = *out;
    t->nptds++;
    return CUDA_SUCCESS;
}

/* Where the driver would crash (it reads a handle's object without a
 * check): say why and abort, so a test sees the crash. */
__attribute__((noreturn, format(printf, 1, 2))) void
sim_fatal(const char *fmt, ...)
{
    va_list ap;

    fputs("cudamem simulator: ", stderr);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    abort();
}

/* The stream a handle names: 0, CU_STREAM_LEGACY, CU_STREAM_PER_THREAD
 * (these need a current context) or a live stream. */
CUresult
sim_stream_get(CUstream h, sim_stream **out)
{
    sim_ctx *c;
    CUresult rc;

    if (h == NULL) {
        h = atomic_load(&sim_per_thread) ? CU_STREAM_PER_THREAD
                                          : CU_STREAM_LEGACY;
    }
    if (h == CU_STREAM_LEGACY || h == CU_STREAM_PER_THREAD) {
        rc = sim_current(&c);
        if (rc != CUDA_SUCCESS) {
            return rc;
        }
        if (h == CU_STREAM_PER_THREAD) {
            return sim_ptds_get(c, out);
        }
        if (c->legacy == NULL) {
            c->legacy = sim_stream_new(c, SIM_STREAM_LEGACY);
            if (c->legacy == NULL) {
                return CUDA_ERROR_OUT_OF_MEMORY;
            }
        }
        *out = c->legacy;
        return CUDA_SUCCESS;
    }
    if (!sim_set_has(&sim.streams, h)) {
        /* The driver reads the object a handle points at without a
         * check: an unknown or destroyed stream crashes it. */
        sim_fatal("stream handle %p is not a live stream: the driver "
                  "would crash here", (void *)h);
    }
    if (((sim_stream *)(void *)h)->ctx->destroyed) {
        /* A context being destroyed still lists its streams while it
         * drains them, but they take no more work. */
        return CUDA_ERROR_INVALID_HANDLE;
    }
    *out = (sim_stream *)(void *)h;
    return CUDA_SUCCESS;
}

int
cm_sim_stream_live(const void *h)
{
    int live;

    sim_lock();
    live = sim_set_has(&sim.streams, h)
           && !((const sim_stream *)h)->ctx->destroyed;
    sim_unlock();
    return live;
}

/* Whether h is a live event: NULL is not (the driver refuses it); any
 * other handle that is not one would crash the driver, which reads the
 * object it points at. */
int
sim_event_known(CUevent h)
{
    if (h == NULL) {
        return 0;
    }
    if (!sim_set_has(&sim.events, h)) {
        sim_fatal("event handle %p is not a live event: the driver would "
                  "crash here", (void *)h);
    }
    return 1;
}

/* Wait until s has finished ticket (the lock is released meanwhile). */
CUresult
sim_wait(sim_stream *s, uint64_t ticket)
{
    if (s->completed >= ticket) {
        return CUDA_SUCCESS;
    }
    if (tls_worker != NULL) {
        /* A host function waiting on the simulator could wait on itself. */
        return CUDA_ERROR_NOT_PERMITTED;
    }
    s->refs++;
    while (s->completed < ticket) {
        pthread_cond_wait(&sim.cond, &sim.lock);
    }
    sim_stream_unref(s);
    return CUDA_SUCCESS;
}

/* Whether c has a stream still busy with work numbered <= g. */
int
sim_ctx_busy(const sim_ctx *c, uint64_t g)
{
    const sim_stream *s;

    for (s = c->streams; s != NULL; s = s->next) {
        if (s->head != NULL && s->head->gseq <= g) {
            return 1;
        }
    }
    return 0;
}

/* Wait for all work submitted so far on the streams of c, or of every
 * context (destroyed ones too, which may still be draining) if c is
 * NULL.  The lock is released meanwhile. */
CUresult
sim_drain(const sim_ctx *c)
{
    uint64_t g = sim.gseq;
    const sim_ctx *o;
    int d, busy;

    for (;;) {
        busy = 0;
        if (c != NULL) {
            busy = sim_ctx_busy(c, g);
        }
        else {
            for (d = 0; d < sim.ndev && !busy; d++) {
                o = sim.dev[d].primary;
                busy = o != NULL && sim_ctx_busy(o, g);
            }
            for (o = sim.dead; o != NULL && !busy; o = o->next_dead) {
                busy = sim_ctx_busy(o, g);
            }
        }
        if (!busy) {
            return CUDA_SUCCESS;
        }
        if (tls_worker != NULL) {
            return CUDA_ERROR_NOT_PERMITTED;
        }
        pthread_cond_wait(&sim.cond, &sim.lock);
    }
}

/* Whether op may run: everything it waits for is done. */
static int
sim_op_ready(const sim_op *op)
{
    size_t i;

    for (i = 0; i < op->ndeps; i++) {
        if (op->deps[i].stream->completed < op->deps[i].ticket) {
            return 0;
        }
    }
    return 1;
}

/* Do what op does; runs without the lock. */
static void
sim_op_run(sim_op *op)
{
    size_t y, z;

    switch (op->kind) {
    case SIM_OP_COPY:
        for (z = 0; z < op->u.copy.depth; z++) {
            for (y = 0; y < op->u.copy.height; y++) {
                memmove(op->u.copy.dst + z * op->u.copy.dslice
                        + y * op->u.copy.dpitch,
                        op->u.copy.src + z * op->u.copy.sslice
                        + y * op->u.copy.spitch,
                        op->u.copy.width);
            }
        }
        break;
    case SIM_OP_SET:
        memset(op->u.set.dst, op->u.set.value, op->u.set.n);
        break;
    case SIM_OP_HOSTFN:
        op->u.hostfn.fn(op->u.hostfn.data);
        break;
    case SIM_OP_CALLBACK:
        op->u.callback.fn(op->u.callback.handle, CUDA_SUCCESS,
                          op->u.callback.data);
        break;
    case SIM_OP_RECORD:
        op->u.record.time_ns = sim_now_ns();
        break;
    default:
        break;
    }
}

/* A stream's worker: runs its queue in order until it is destroyed and
 * empty, then frees its share of the stream. */
static void *
sim_worker(void *arg)
{
    sim_stream *s = arg;
    sim_op *op;
    sim_event *e;

    tls_worker = s;
    sim_lock();
    for (;;) {
        op = s->head;
        if (op == NULL) {
            if (s->destroyed) {
                break;
            }
            pthread_cond_wait(&s->cv, &sim.lock);
            continue;
        }
        if (!sim_op_ready(op)) {
            pthread_cond_wait(&sim.cond, &sim.lock);
            continue;
        }
        sim_unlock();
        if (sim.delay_us > 0) {
            sim_sleep_us(sim.delay_us);
        }
        sim_op_run(op);
        sim_lock();
        s->ctx->hostfns -= sim_op_is_hostfn(op);
        s->head = op->next;
        if (s->head == NULL) {
            s->tail = NULL;
        }
        s->completed = op->ticket;
        if (op->kind == SIM_OP_RECORD) {
            e = op->u.record.event;
            if (op->u.record.seq > e->done_seq) {
                e->done_seq = op->u.record.seq;
                e->time_ns = op->u.record.time_ns;
            }
        }
        sim_op_free(op);
        pthread_cond_broadcast(&sim.cond);
    }
    tls_worker = NULL;
    sim_stream_unref(s);
    sim_unlock();
    return NULL;
}
