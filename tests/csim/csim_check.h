/* SPDX-License-Identifier: MIT */
/*
 * csim_check.h: what the simulator's standalone C tests share (test_sim.c,
 * test_sim_streams.c, test_vmm.c, test_graph.c): the driver table they call through, the
 * checks that count failures, and the runner that gives each group of
 * tests a child process of its own with the environment it asks for
 * (the simulator reads its environment once, at cuInit, and cannot be
 * initialised again after a fork; the parent never calls cuInit).
 *
 * Included once per test program: everything here is static.
 */
#ifndef CM_CSIM_CHECK_H
#define CM_CSIM_CHECK_H

#include "driver/cu_table.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

static cm_cu_table cu;
static int failures;

#define CHECK(cond)                                                     \
    do {                                                                \
        if (!(cond)) {                                                  \
            fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__,      \
                    __LINE__, #cond);                                   \
            failures++;                                                 \
        }                                                               \
    } while (0)

/* Check that a call returns the expected CUresult. */
#define EXPECT(call, want)                                              \
    do {                                                                \
        CUresult got_ = (call);                                         \
        if (got_ != (want)) {                                           \
            const char *n_ = NULL;                                      \
            cu.GetErrorName(got_, &n_);                                 \
            fprintf(stderr, "%s:%d: %s returned %d (%s), want %s\n",    \
                    __FILE__, __LINE__, #call, (int)got_,               \
                    n_ ? n_ : "?", #want);                              \
            failures++;                                                 \
        }                                                               \
    } while (0)

#define OK(call) EXPECT(call, CUDA_SUCCESS)

/* Retain device dev's primary context and push it. */
static inline CUcontext
retain_and_push(int dev)
{
    CUcontext ctx = NULL;

    OK(cu.DevicePrimaryCtxRetain(&ctx, dev));
    OK(cu.CtxPushCurrent(ctx));
    return ctx;
}

/* A group of tests, run in a child process of its own. */
typedef struct {
    const char *name;       /* printed */
    void (*fn)(void);       /* the group */
    const char *env;        /* "NAME=value NAME=value", or NULL */
    int per_thread;         /* cm_sim_fill's second argument */
} group;

/* Set the variables of env ("NAME=value NAME=value", or NULL). */
static inline void
apply_env(const char *env)
{
    char buf[256], *tok, *save = NULL, *eq;

    if (env == NULL) {
        return;
    }
    snprintf(buf, sizeof(buf), "%s", env);
    for (tok = strtok_r(buf, " ", &save); tok != NULL;
         tok = strtok_r(NULL, " ", &save)) {
        eq = strchr(tok, '=');
        *eq = '\0';
        setenv(tok, eq + 1, 1);
    }
}

/* Run each of the n groups (only the one argv[1] names, if given) in a
 * child process with its environment and a freshly filled table; print
 * "ok" or "FAIL" per group.  The program's exit status: 1 if any
 * failed. */
static inline int
run_groups(const group *groups, size_t n, int argc, char **argv)
{
    size_t i;
    int bad = 0;

    for (i = 0; i < n; i++) {
        const group *g = &groups[i];
        pid_t pid;
        int status = 0;

        if (argc > 1 && strcmp(argv[1], g->name) != 0) {
            continue;
        }
        fflush(stdout);
        fflush(stderr);
        pid = fork();
        if (pid == 0) {
            apply_env(g->env);
            cm_sim_fill(&cu, g->per_thread);
            g->fn();
            exit(failures ? 1 : 0);
        }
        waitpid(pid, &status, 0);
        if (WIFEXITED(status) && WEXITSTATUS(status) == 0) {
            printf("ok   %s\n", g->name);
        }
        else {
            printf("FAIL %s (status %d)\n", g->name, status);
            bad = 1;
        }
    }
    return bad;
}

#endif /* CM_CSIM_CHECK_H */
