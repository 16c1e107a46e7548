/* SPDX-License-Identifier: MIT */
/*
 * memory/fdserve.c: the descriptors an exporting process offers for IPC
 * (the async manager's shareable pool, the pages of the pool on virtual
 * memory), handed to an importing process over a Unix socket where it may
 * not take them with pidfd_getfd.
 *
 * Owns:
 * - the offer table: each descriptor offered (cm_fd_offer) with the
 *   value its handle carries beside it (the pool's token, the page's
 *   id), until it is withdrawn (cm_fd_withdraw) before its close;
 * - the server: a thread of the exporting process, started at its first
 *   offer (again in a child after fork), listening on the abstract Unix
 *   socket "cudamem-fd-<pid>" (SOCK_SEQPACKET).  A request names a
 *   descriptor and its value; the reply carries a duplicate of it
 *   (SCM_RIGHTS) when the pair is on offer, and an errno otherwise
 *   (EBADF: not on offer).  Only a peer of the same user, or root, is
 *   answered (SO_PEERCRED);
 * - the client (cm_fd_fetch): the importer's side, which checks that the
 *   socket's listener is the process the handle names before it asks.
 *
 * pidfd_getfd needs ptrace access to the exporter, which a Yama
 * ptrace_scope of 1 (a child importing from its parent) or a container
 * without CAP_SYS_PTRACE refuses; a socket of the same network
 * namespace does not.  CUDAMEM_IPC_FD picks the way an importer takes a
 * descriptor: "auto" (pidfd_getfd, then the socket where it is refused),
 * "pidfd" or "socket".
 *
 * Locks and the GIL: cm_fds.mu guards the offer table and the server's
 * state; it is taken without the GIL held by this file (callers may hold
 * it: nothing here waits for Python), and the server thread holds it
 * while it sends a descriptor, so that a withdrawal, and the close after
 * it, waits for a send of that descriptor in progress.  The server
 * thread never touches Python.
 */
#include "memory/memory.h"

#include <errno.h>
#include <stddef.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

struct cm_fd_req {
    int32_t fd;
    uint64_t check;
};

struct cm_fd_rep {
    int32_t err;
};

/* A reply as sent and received: the errno, and room for one descriptor
 * (SCM_RIGHTS). */
typedef struct {
    struct cm_fd_rep r;
    struct msghdr m;
    struct iovec v;
    union {
        char buf[CMSG_SPACE(sizeof(int))];
        struct cmsghdr align;
    } u;
} cm_fd_msg;

static void
cm_fd_msg_init(cm_fd_msg *x)
{
    memset(x, 0, sizeof(*x));
    x->v.iov_base = &x->r;
    x->v.iov_len = sizeof(x->r);
    x->m.msg_iov = &x->v;
    x->m.msg_iovlen = 1;
    x->m.msg_control = x->u.buf;
    x->m.msg_controllen = sizeof(x->u.buf);
}

/* Sends and receives on c give up after seconds. */
static void
cm_fd_timeouts(int c, long seconds)
{
    struct timeval tv = {seconds, 0};

    (void)setsockopt(c, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    (void)setsockopt(c, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
}

struct cm_fd_offer_e {
    int fd;
    uint64_t check;
};

static struct {
    pthread_mutex_t mu;
    pid_t pid;                     /* the process serving; 0: none yet */
    int lfd;                       /* the listening socket */
    struct cm_fd_offer_e *offers;
    size_t n, cap;
} cm_fds = {PTHREAD_MUTEX_INITIALIZER, 0, -1, NULL, 0, 0};

/* The abstract socket name of process pid into *a; its length. */
static socklen_t
cm_fd_addr(struct sockaddr_un *a, long pid)
{
    int n;

    memset(a, 0, sizeof(*a));
    a->sun_family = AF_UNIX;
    /* sun_path[0] stays 0: the abstract namespace. */
    n = snprintf(a->sun_path + 1, sizeof(a->sun_path) - 1,
                 "cudamem-fd-%ld", pid);
    return (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1
                       + (size_t)n);
}

/* Whether (fd, check) is on offer (mutex held). */
static int
cm_fd_on_offer(int fd, uint64_t check)
{
    size_t i;

    for (i = 0; i < cm_fds.n; i++) {
        if (cm_fds.offers[i].fd == fd && cm_fds.offers[i].check == check) {
            return 1;
        }
    }
    return 0;
}

/* Answer one connection: a request, then the descriptor or an errno. */
static void
cm_fd_answer(int c)
{
    struct cm_fd_req q;
    struct ucred cr;
    socklen_t cl = sizeof(cr);
    cm_fd_msg x;
    struct cmsghdr *h;
    ssize_t got;

    cm_fd_timeouts(c, 1);
    if (getsockopt(c, SOL_SOCKET, SO_PEERCRED, &cr, &cl) != 0
        || (cr.uid != geteuid() && cr.uid != 0)) {
        return;
    }
    got = recv(c, &q, sizeof(q), 0);
    if (got != (ssize_t)sizeof(q)) {
        return;
    }
    cm_fd_msg_init(&x);
    pthread_mutex_lock(&cm_fds.mu);
    if (cm_fd_on_offer(q.fd, q.check)) {
        h = CMSG_FIRSTHDR(&x.m);
        h->cmsg_level = SOL_SOCKET;
        h->cmsg_type = SCM_RIGHTS;
        h->cmsg_len = CMSG_LEN(sizeof(int));
        memcpy(CMSG_DATA(h), &q.fd, sizeof(int));
    }
    else {
        x.r.err = EBADF;
        x.m.msg_control = NULL;
        x.m.msg_controllen = 0;
    }
    /* Held while a descriptor is sent: its withdrawal and close wait. */
    (void)sendmsg(c, &x.m, MSG_NOSIGNAL);
    pthread_mutex_unlock(&cm_fds.mu);
}

static void *
cm_fd_serve(void *arg)
{
    int lfd = (int)(intptr_t)arg;
    int c;

    for (;;) {
        c = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
        if (c < 0) {
            if (errno == EINTR || errno == ECONNABORTED) {
                continue;
            }
            if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS
                || errno == ENOMEM) {
                usleep(10000);
                continue;
            }
            return NULL;
        }
        cm_fd_answer(c);
        close(c);
    }
}

/* Start serving in this process if it does not yet (mutex held); 0, or
 * -1 with errno.  After a fork the child has neither the parent's thread
 * nor its offers' meaning: it starts afresh. */
static int
cm_fd_start(void)
{
    struct sockaddr_un a;
    socklen_t al;
    pthread_t t;
    pthread_attr_t at;
    pid_t me = getpid();
    int lfd;
    int rc;

    if (cm_fds.pid == me) {
        return 0;
    }
    if (cm_fds.pid != 0) {
        /* A child of a serving process: the listening socket is the
         * parent's (this copy is closed), the offers were the parent's. */
        if (cm_fds.lfd >= 0) {
            close(cm_fds.lfd);
        }
        cm_fds.lfd = -1;
        cm_fds.n = 0;
        cm_fds.pid = 0;
    }
    lfd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    if (lfd < 0) {
        return -1;
    }
    al = cm_fd_addr(&a, (long)me);
    if (bind(lfd, (struct sockaddr *)&a, al) != 0 || listen(lfd, 16) != 0) {
        rc = errno;
        close(lfd);
        errno = rc;
        return -1;
    }
    pthread_attr_init(&at);
    pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
    rc = pthread_create(&t, &at, cm_fd_serve, (void *)(intptr_t)lfd);
    pthread_attr_destroy(&at);
    if (rc != 0) {
        close(lfd);
        errno = rc;
        return -1;
    }
    cm_fds.lfd = lfd;
    cm_fds.pid = me;
    return 0;
}

int
cm_fdserve_init(void)
{
    /* A fork's child gets the mutex fresh (the server thread may have
     * held it); its first offer then starts its own server. */
    return cm_atfork_mutex_add(&cm_fds.mu);
}

int
cm_fd_offer(int fd, uint64_t check)
{
    struct cm_fd_offer_e *o;
    size_t cap;
    int rc = 0;

    pthread_mutex_lock(&cm_fds.mu);
    if (cm_fd_start() != 0) {
        rc = -1;
    }
    else if (!cm_fd_on_offer(fd, check)) {
        if (cm_fds.n == cm_fds.cap) {
            cap = cm_fds.cap ? 2 * cm_fds.cap : 16;
            o = realloc(cm_fds.offers, cap * sizeof(*o));
            if (o == NULL) {
                errno = ENOMEM;
                rc = -1;
            }
            else {
                cm_fds.offers = o;
                cm_fds.cap = cap;
            }
        }
        if (rc == 0) {
            cm_fds.offers[cm_fds.n].fd = fd;
            cm_fds.offers[cm_fds.n].check = check;
            cm_fds.n++;
        }
    }
    pthread_mutex_unlock(&cm_fds.mu);
    return rc;
}

void
cm_fd_withdraw(int fd)
{
    size_t i;

    pthread_mutex_lock(&cm_fds.mu);
    if (cm_fds.pid == getpid()) {
        for (i = 0; i < cm_fds.n; i++) {
            if (cm_fds.offers[i].fd == fd) {
                cm_fds.offers[i] = cm_fds.offers[--cm_fds.n];
                break;
            }
        }
    }
    pthread_mutex_unlock(&cm_fds.mu);
}

int
cm_fd_fetch(long pid, int fd, uint64_t check, int *err)
{
    struct sockaddr_un a;
    socklen_t al = cm_fd_addr(&a, pid);
    struct cm_fd_req q;
    struct ucred cr;
    socklen_t cl = sizeof(cr);
    cm_fd_msg x;
    struct cmsghdr *h;
    ssize_t got;
    int c;
    int out = -1;

    *err = 0;
    c = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    if (c < 0) {
        *err = errno;
        return -1;
    }
    cm_fd_timeouts(c, 5);
    if (connect(c, (struct sockaddr *)&a, al) != 0) {
        *err = errno;
        goto done;
    }
    /* The listener must be the process the handle names: any process
     * may bind a free abstract name. */
    if (getsockopt(c, SOL_SOCKET, SO_PEERCRED, &cr, &cl) != 0
        || (long)cr.pid != pid) {
        *err = EPERM;
        goto done;
    }
    memset(&q, 0, sizeof(q));
    q.fd = fd;
    q.check = check;
    if (send(c, &q, sizeof(q), MSG_NOSIGNAL) != (ssize_t)sizeof(q)) {
        *err = errno ? errno : EIO;
        goto done;
    }
    cm_fd_msg_init(&x);
    got = recvmsg(c, &x.m, MSG_CMSG_CLOEXEC);
    if (got != (ssize_t)sizeof(x.r)) {
        *err = got < 0 ? errno : EIO;
        goto done;
    }
    for (h = CMSG_FIRSTHDR(&x.m); h != NULL; h = CMSG_NXTHDR(&x.m, h)) {
        if (h->cmsg_level == SOL_SOCKET && h->cmsg_type == SCM_RIGHTS
            && h->cmsg_len == CMSG_LEN(sizeof(int))) {
            memcpy(&out, CMSG_DATA(h), sizeof(int));
        }
    }
    if (x.r.err != 0 || out < 0) {
        if (out >= 0) {
            close(out);
            out = -1;
        }
        *err = x.r.err != 0 ? x.r.err : EIO;
    }
done:
    close(c);
    return out;
}
