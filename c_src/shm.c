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

    s->memfd = memfd_create("erlcuda", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (s->memfd < 0)
        goto fail_errno;
    if (ftruncate(s->memfd, (off_t)total) < 0)
        goto fail_errno;
    /* gpud maps the same pages: a shrink would turn its accesses into SIGBUS
     * in the middle of a kernel, so the size is fixed for good. */
    if (fcntl(s->memfd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) < 0)
        goto fail_errno;
    void *p = mmap(NULL, total, PROT_READ | PROT_WRITE, MAP_SHARED, s->memfd, 0);
    if (p == MAP_FAILED)
        goto fail_errno;
    s->base = p;
    s->total_bytes = total;
    s->hdr = (struct ec_header *)s->base;
    s->sq = (struct ec_sqe *)(s->base + sq_off);
    s->cq = (struct ec_cqe *)(s->base + cq_off);
    s->arena = s->base + arena_off;

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
    shm_destroy(s);
    return err;
}

static void close_fd(int *fd)
{
    if (*fd >= 0)
        close(*fd);
    *fd = -1;
}

void shm_destroy(struct shm *s)
{
    if (s->base)
        munmap(s->base, s->total_bytes);
    s->base = NULL;
    close_fd(&s->memfd);
    close_fd(&s->sq_efd);
    close_fd(&s->cq_efd);
    close_fd(&s->listen_fd);
    close_fd(&s->conn_fd);
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

static int send_hello(struct shm *s, int fd, uint32_t device)
{
    struct ec_hello hello = {
        .magic = EC_MAGIC,
        .abi_version = EC_ABI_VERSION,
        .device = device,
        .total_bytes = s->total_bytes,
    };
    int fds[3] = {s->memfd, s->sq_efd, s->cq_efd};
    union {
        struct cmsghdr h;
        char buf[CMSG_SPACE(sizeof fds)];
    } ctl;
    memset(&ctl, 0, sizeof ctl);
    struct iovec iov = {.iov_base = &hello, .iov_len = sizeof hello};
    struct msghdr msg = {
        .msg_iov = &iov,
        .msg_iovlen = 1,
        .msg_control = ctl.buf,
        .msg_controllen = sizeof ctl.buf,
    };
    struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof fds);
    memcpy(CMSG_DATA(c), fds, sizeof fds);
    ssize_t n;
    do {
        n = sendmsg(fd, &msg, MSG_NOSIGNAL);
    } while (n < 0 && errno == EINTR);
    if (n < 0)
        return -errno;
    return n == (ssize_t)sizeof hello ? 0 : -EIO;
}

int shm_accept(struct shm *s, uint32_t device, pid_t expect_pid, int timeout_ms)
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
        /* Only the gpud this VM spawned may have the arena: the kernel vouches
         * for the peer's pid and uid, a name in argv proves nothing. */
        if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &clen) < 0 ||
            cred.pid != expect_pid || cred.uid != getuid()) {
            saw_stranger = 1;
            close(fd);
            continue;
        }
        int e = send_hello(s, fd, device);
        if (e < 0) {
            close(fd);
            return e;
        }
        shm_disconnect(s);
        s->conn_fd = fd;
        return 0;
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
