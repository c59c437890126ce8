#define _GNU_SOURCE
#include "shm.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

static uint64_t align_up(uint64_t v, uint64_t a) { return (v + a - 1) & ~(a - 1); }
static int sealed_memfd(uint64_t bytes, int *fd_out, uint8_t **base_out);

static socklen_t abstract_addr(const char *name, struct sockaddr_un *sa)
{
    size_t n = strlen(name);
    memset(sa, 0, sizeof *sa);
    sa->sun_family = AF_UNIX;
    /* sun_path[0] == '\0' puts the name in the abstract namespace: nothing
     * appears in the file system and it vanishes with the last fd. */
    memcpy(sa->sun_path + 1, name, n);
    return (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + n);
}

static int make_listener(struct shm *s, uint32_t device)
{
    uint64_t rnd = 0;
    if (getrandom(&rnd, sizeof rnd, 0) != (ssize_t)sizeof rnd)
        return -errno;
    snprintf(s->sock_name, sizeof s->sock_name, "erlcuda-%d-%u-%016llx",
             (int)getpid(), device, (unsigned long long)rnd);
    int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0)
        return -errno;
    struct sockaddr_un sa;
    socklen_t len = abstract_addr(s->sock_name, &sa);
    if (bind(fd, (struct sockaddr *)&sa, len) < 0 || listen(fd, 4) < 0) {
        int e = -errno;
        close(fd);
        return e;
    }
    s->listen_fd = fd;
    return 0;
}

int shm_create(struct shm *s, uint32_t device, uint32_t entries, uint64_t arena_bytes)
{
    int err;
    memset(s, 0, sizeof *s);
    s->memfd = s->sq_efd = s->cq_efd = s->listen_fd = s->conn_fd = -1;
    if (entries == 0 || (entries & (entries - 1)) != 0)
        return -EINVAL;

    uint64_t sq_off = EC_HEADER_BYTES;
    uint64_t cq_off = sq_off + (uint64_t)entries * sizeof(struct ec_sqe);
    uint64_t arena_off = align_up(cq_off + (uint64_t)entries * sizeof(struct ec_cqe), 4096);
    arena_bytes = align_up(arena_bytes, 4096);
    uint64_t total = arena_off + arena_bytes;

    uint8_t *p;
    if ((err = sealed_memfd(total, &s->memfd, &p)) < 0)
        goto fail;
    s->base = p;
    s->total_bytes = total;
    s->hdr = (struct ec_header *)s->base;
    s->sq = (struct ec_sqe *)(s->base + sq_off);
    s->cq = (struct ec_cqe *)(s->base + cq_off);
    s->seg[0].base = s->base + arena_off;
    s->seg[0].bytes = arena_bytes;
    s->seg[0].memfd = -1;
    s->nseg = 1;

    struct ec_header *h = s->hdr;
    h->magic = EC_MAGIC;
    h->abi_version = EC_ABI_VERSION;
    h->header_bytes = EC_HEADER_BYTES;
    h->sqe_bytes = sizeof(struct ec_sqe);
    h->cqe_bytes = sizeof(struct ec_cqe);
    h->sq_entries = entries;
    h->cq_entries = entries;
    h->sq_offset = sq_off;
    h->cq_offset = cq_off;
    h->arena_offset = arena_off;
    h->arena_bytes = arena_bytes;

    s->sq_efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    s->cq_efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (s->sq_efd < 0 || s->cq_efd < 0)
        goto fail_errno;
    if ((err = make_listener(s, device)) < 0)
        goto fail;
    return 0;

fail_errno:
    err = -errno;
fail:
    shm_close_fds(s);
    shm_unmap(s);
    return err;
}

static void close_fd(int *fd)
{
    if (*fd >= 0)
        close(*fd);
    *fd = -1;
}

void shm_close_fds(struct shm *s)
{
    close_fd(&s->memfd);
    close_fd(&s->sq_efd);
    close_fd(&s->cq_efd);
    close_fd(&s->listen_fd);
    close_fd(&s->conn_fd);
    for (uint32_t i = 1; i < s->nseg; i++)
        close_fd(&s->seg[i].memfd);
}

void shm_unmap(struct shm *s)
{
    for (uint32_t i = 1; i < s->nseg; i++) {
        if (s->seg[i].base)
            munmap(s->seg[i].base, s->seg[i].bytes);
        s->seg[i].base = NULL;
    }
    if (s->base)
        munmap(s->base, s->total_bytes);
    s->base = NULL;
    s->hdr = NULL;
    s->seg[0].base = NULL;
}

/* Creates a sealed memfd of `bytes` and maps it shared. */
static int sealed_memfd(uint64_t bytes, int *fd_out, uint8_t **base_out)
{
    int fd = memfd_create("erlcuda", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd < 0)
        return -errno;
    /* gpud maps the same pages: a shrink would turn its accesses into SIGBUS
     * in the middle of a kernel, so the size is fixed for good. */
    if (ftruncate(fd, (off_t)bytes) < 0 ||
        fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) < 0) {
        int e = -errno;
        close(fd);
        return e;
    }
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
        int e = -errno;
        close(fd);
        return e;
    }
    *fd_out = fd;
    *base_out = p;
    return 0;
}

static int send_with_fds(int sock, const void *msg, size_t len, const int *fds, size_t nfds)
{
    union {
        struct cmsghdr h;
        char buf[CMSG_SPACE(3 * sizeof(int))];
    } ctl;
    memset(&ctl, 0, sizeof ctl);
    struct iovec iov = {.iov_base = (void *)msg, .iov_len = len};
    struct msghdr m = {
        .msg_iov = &iov,
        .msg_iovlen = 1,
        .msg_control = ctl.buf,
        .msg_controllen = CMSG_SPACE(nfds * sizeof(int)),
    };
    struct cmsghdr *c = CMSG_FIRSTHDR(&m);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(nfds * sizeof(int));
    memcpy(CMSG_DATA(c), fds, nfds * sizeof(int));
    ssize_t n;
    do {
        n = sendmsg(sock, &m, MSG_NOSIGNAL);
    } while (n < 0 && errno == EINTR);
    if (n < 0)
        return -errno;
    return n == (ssize_t)len ? 0 : -EIO;
}

static int send_segment(int sock, const struct shm_segment *g, uint32_t index)
{
    struct ec_segment msg = {
        .magic = EC_SEGMENT_MAGIC,
        .segment = index,
        .bytes = g->bytes,
    };
    return send_with_fds(sock, &msg, sizeof msg, &g->memfd, 1);
}

int shm_add_segment(struct shm *s, uint64_t bytes)
{
    if (s->nseg >= EC_MAX_SEGMENTS)
        return -ENOSPC;
    bytes = align_up(bytes, 4096);
    struct shm_segment *g = &s->seg[s->nseg];
    int err = sealed_memfd(bytes, &g->memfd, &g->base);
    if (err < 0)
        return err;
    g->bytes = bytes;
    uint32_t index = s->nseg++;
    /* A gpud that misses this (it died) gets every segment at its handshake. */
    if (s->conn_fd >= 0 && send_segment(s->conn_fd, g, index) < 0)
        shm_disconnect(s);
    return (int)index;
}

void shm_reset_rings(struct shm *s)
{
    struct ec_header *h = s->hdr;
    __atomic_store_n(&h->sq_head, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&h->sq_tail, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&h->sq_flags, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&h->cq_head, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&h->cq_tail, 0, __ATOMIC_RELAXED);
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
}

static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int shm_handover(struct shm *s, int fd, uint32_t device)
{
    struct ec_hello hello = {
        .magic = EC_MAGIC,
        .abi_version = EC_ABI_VERSION,
        .device = device,
        .total_bytes = s->total_bytes,
        .segments = s->nseg - 1,
    };
    int fds[3] = {s->memfd, s->sq_efd, s->cq_efd};
    int err = send_with_fds(fd, &hello, sizeof hello, fds, 3);
    for (uint32_t i = 1; err == 0 && i < s->nseg; i++)
        err = send_segment(fd, &s->seg[i], i);
    if (err < 0) {
        close(fd);
        return err;
    }
    shm_disconnect(s);
    s->conn_fd = fd;
    return 0;
}

/* The parent of `pid` by /proc/<pid>/stat ("pid (comm) state ppid ..."; the
 * comm may hold spaces and parentheses, so the fields are read after the
 * last ')'), or -1. */
static pid_t parent_of(pid_t pid)
{
    char path[32], buf[512];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0)
        return -1;
    buf[n] = '\0';
    char *end = strrchr(buf, ')');
    int ppid;
    if (end == NULL || sscanf(end + 1, " %*c %d", &ppid) != 1)
        return -1;
    return (pid_t)ppid;
}

/* True when `pid` is `ancestor` or runs under it, within 8 generations: the
 * program the VM spawned may run gpud as a child (a profiler such as
 * Nsight Compute, `gpud` set to a wrapper that forks), and that child is
 * as much the VM's as the program itself. */
static int spawned_by(pid_t pid, pid_t ancestor)
{
    for (int gen = 0; gen <= 8 && pid > 1; gen++) {
        if (pid == ancestor)
            return 1;
        pid = parent_of(pid);
    }
    return 0;
}

int shm_accept_peer(struct shm *s, pid_t expect_pid, int timeout_ms)
{
    int64_t deadline = now_ms() + timeout_ms;
    int saw_stranger = 0;
    for (;;) {
        int64_t left = deadline - now_ms();
        if (left <= 0)
            return saw_stranger ? -EPERM : -ETIMEDOUT;
        struct pollfd pfd = {.fd = s->listen_fd, .events = POLLIN};
        int r = poll(&pfd, 1, (int)left);
        if (r < 0 && errno != EINTR)
            return -errno;
        if (r <= 0)
            continue;
        int fd = accept4(s->listen_fd, NULL, NULL, SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EAGAIN || errno == EINTR || errno == ECONNABORTED)
                continue;
            return -errno;
        }
        struct ucred cred;
        socklen_t clen = sizeof cred;
        /* Only the gpud this VM spawned (or a process under it) may have the
         * arena: the kernel vouches for the peer's pid and uid, a name in
         * argv proves nothing. */
        if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &clen) < 0 ||
            cred.uid != getuid() || !spawned_by(cred.pid, expect_pid)) {
            saw_stranger = 1;
            close(fd);
            continue;
        }
        return fd;
    }
}

void shm_disconnect(struct shm *s)
{
    close_fd(&s->conn_fd);
}

void shm_signal(int efd)
{
    uint64_t one = 1;
    ssize_t n;
    do {
        n = write(efd, &one, sizeof one);
    } while (n < 0 && errno == EINTR);
}

void shm_drain(int efd)
{
    uint64_t v;
    ssize_t n;
    do {
        n = read(efd, &v, sizeof v);
    } while (n < 0 && errno == EINTR);
}
