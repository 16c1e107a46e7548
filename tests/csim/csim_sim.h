/* SPDX-License-Identifier: MIT */
/*
 * csim_sim.h: what the simulator's two general test programs share
 * (test_sim.c: devices, contexts, memory, copies, fork and IPC;
 * test_sim_streams.c: streams, events, host functions, per-thread
 * default streams and stream-ordered pools): sleep_ms, the calls the
 * simulator refuses by aborting (expect_abort, run in a grandchild) and
 * the gate, a host function that blocks its stream until opened.
 *
 * Where the driver would crash (it reads the object behind a stream,
 * event or pool handle without checking it), the simulator aborts with a
 * message instead.  Those cases run in a grandchild (expect_abort),
 * forked before the group calls cuInit: a child forked after cuInit
 * could not use the simulator.
 *
 * Included once per test program, after csim_check.h: everything here is
 * static.
 */
#ifndef CM_CSIM_SIM_H
#define CM_CSIM_SIM_H

#include "csim_check.h"

#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static void
sleep_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};

    nanosleep(&ts, NULL);
}

/* ------------------------------------------------------------------ */
/* Calls the simulator refuses by aborting the process                 */
/* ------------------------------------------------------------------ */

/* What the child of expect_abort must write to stderr before it aborts:
 * a page shared by every process of the run (mapped in main), written by
 * the child once it knows the handle. */
static char *abort_want;

#define ABORT_WANT_SIZE 4096

/* In the child of expect_abort, just before the call that must abort:
 * the simulator's message it must print (after its prefix).  A failed
 * check before this point makes the child exit instead. */
__attribute__((format(printf, 1, 2))) static void
abort_expect(const char *fmt, ...)
{
    va_list ap;
    int n;

    if (failures) {
        _exit(1);
    }
    n = snprintf(abort_want, ABORT_WANT_SIZE, "cudamem simulator: ");
    va_start(ap, fmt);
    n += vsnprintf(abort_want + n, ABORT_WANT_SIZE - (size_t)n, fmt, ap);
    va_end(ap);
    snprintf(abort_want + n, ABORT_WANT_SIZE - (size_t)n, "\n");
    fflush(stderr);
}

/* Run fn in a child process whose stderr is captured; check that it died
 * of SIGABRT having printed exactly what it announced with abort_expect.
 * Call it before cuInit. */
static void
expect_abort_(const char *file, int line, const char *name, void (*fn)(void))
{
    char out[ABORT_WANT_SIZE];
    char chunk[512];
    size_t n = 0;
    ssize_t r;
    int fds[2];
    int status = 0;
    pid_t pid;

    abort_want[0] = '\0';
    if (pipe(fds) != 0) {
        fprintf(stderr, "%s:%d: pipe failed\n", file, line);
        failures++;
        return;
    }
    fflush(stdout);
    fflush(stderr);
    pid = fork();
    if (pid == 0) {
        close(fds[0]);
        dup2(fds[1], STDERR_FILENO);
        close(fds[1]);
        fn();
        /* It returned: the call did not abort. */
        fprintf(stderr, "%s returned\n", name);
        _exit(1);
    }
    close(fds[1]);
    /* Read to the end (a long report past the buffer is dropped), so the
     * child never blocks on a full pipe. */
    while ((r = read(fds[0], chunk, sizeof(chunk))) > 0) {
        if ((size_t)r > sizeof(out) - 1 - n) {
            r = (ssize_t)(sizeof(out) - 1 - n);
        }
        memcpy(out + n, chunk, (size_t)r);
        n += (size_t)r;
    }
    out[n] = '\0';
    close(fds[0]);
    waitpid(pid, &status, 0);
    if (pid < 0 || !WIFSIGNALED(status) || WTERMSIG(status) != SIGABRT
        || abort_want[0] == '\0' || strcmp(out, abort_want) != 0) {
        fprintf(stderr, "%s:%d: %s: want death by SIGABRT printing\n  %s"
                "got status %d printing\n  %s\n", file, line, name,
                abort_want[0] ? abort_want : "(nothing announced)\n",
                status, out);
        failures++;
    }
}

#define expect_abort(fn) expect_abort_(__FILE__, __LINE__, #fn, fn)

/* ------------------------------------------------------------------ */
/* A gate: a host function that blocks its stream until opened         */
/* ------------------------------------------------------------------ */

typedef struct {
    pthread_mutex_t mu;     /* guards the fields */
    pthread_cond_t cv;      /* signalled on change */
    int open;               /* the host function may return */
    int entered;            /* the host function has started */
    pthread_t thread;       /* the thread it ran on */
} gate;

static void
gate_init(gate *g)
{
    pthread_mutex_init(&g->mu, NULL);
    pthread_cond_init(&g->cv, NULL);
    g->open = 0;
    g->entered = 0;
}

static void
gate_fini(gate *g)
{
    pthread_mutex_destroy(&g->mu);
    pthread_cond_destroy(&g->cv);
}

static void CUDA_CB
gate_fn(void *arg)
{
    gate *g = arg;

    pthread_mutex_lock(&g->mu);
    g->entered = 1;
    g->thread = pthread_self();
    pthread_cond_broadcast(&g->cv);
    while (!g->open) {
        pthread_cond_wait(&g->cv, &g->mu);
    }
    pthread_mutex_unlock(&g->mu);
}

static void
gate_open(gate *g)
{
    pthread_mutex_lock(&g->mu);
    g->open = 1;
    pthread_cond_broadcast(&g->cv);
    pthread_mutex_unlock(&g->mu);
}

static void
gate_wait_entered(gate *g)
{
    pthread_mutex_lock(&g->mu);
    while (!g->entered) {
        pthread_cond_wait(&g->cv, &g->mu);
    }
    pthread_mutex_unlock(&g->mu);
}

/* The program's main: map the page of abort_want (shared by every
 * process of the run), then run the groups (csim_check.h). */
static int
run_sim_groups(const group *groups, size_t n, int argc, char **argv)
{
    abort_want = mmap(NULL, ABORT_WANT_SIZE, PROT_READ | PROT_WRITE,
                      MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (abort_want == MAP_FAILED) {
        perror("mmap");
        return 1;
    }
    return run_groups(groups, n, argc, argv);
}

#endif /* CM_CSIM_SIM_H */
