/* prefault.c's check (make test): on a shared memfd, as the NIF maps its
 * arena, the thread faults every page in without changing a byte, also
 * while another thread writes the memory; it stops promptly in the middle
 * of a range; a second range (a grown segment) is done after the first. */
#define _GNU_SOURCE
#include "prefault.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#define CHECK(c)                                                                 \
    do {                                                                         \
        if (!(c)) {                                                              \
            fprintf(stderr, "prefault_test: %s:%d: %s\n", __FILE__, __LINE__, #c); \
            exit(1);                                                             \
        }                                                                        \
    } while (0)

static uint8_t *shared(uint64_t bytes)
{
    int fd = memfd_create("prefault_test", MFD_CLOEXEC);
    CHECK(fd >= 0);
    CHECK(ftruncate(fd, (off_t)bytes) == 0);
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    CHECK(p != MAP_FAILED);
    close(fd);
    return p;
}

/* Pages of [p, p + bytes) resident in this process. */
static uint64_t resident(uint8_t *p, uint64_t bytes)
{
    uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE), n = bytes / page, r = 0;
    unsigned char *v = malloc(n);
    CHECK(v && mincore(p, bytes, v) == 0);
    for (uint64_t i = 0; i < n; i++)
        r += v[i] & 1;
    free(v);
    return r;
}

static double ms_since(struct timespec t0)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)(t.tv_sec - t0.tv_sec) * 1e3 + (double)(t.tv_nsec - t0.tv_nsec) / 1e6;
}

static void wait_done(struct prefault *pf, uint64_t bytes)
{
    for (int i = 0; i < 20000 && __atomic_load_n(&pf->done_bytes, __ATOMIC_RELAXED) < bytes; i++)
        usleep(1000);
    CHECK(__atomic_load_n(&pf->done_bytes, __ATOMIC_RELAXED) >= bytes);
}

struct writer {
    uint8_t *p;
    uint64_t bytes;
    int stop;
};

/* Writes a pattern over the memory while the thread faults it in, as the
 * NIF copies jobs' data into the arena. */
static void *write_loop(void *arg)
{
    struct writer *w = arg;
    uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE);
    for (unsigned round = 1; !__atomic_load_n(&w->stop, __ATOMIC_ACQUIRE); round++)
        for (uint64_t off = 0; off < w->bytes; off += page)
            w->p[off + (round % page)] = (uint8_t)(off / page);
    return NULL;
}

int main(void)
{
    uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE);
    const uint64_t big = UINT64_C(64) << 20, small = UINT64_C(8) << 20;

    /* Every page, data untouched, concurrent writes kept. */
    {
        uint8_t *a = shared(big);
        for (uint64_t off = 0; off < big; off += 64 * page)
            a[off + 7] = (uint8_t)(off / page) | 1;
        struct writer w = {.p = a + big / 2, .bytes = big / 2};
        pthread_t wt;
        CHECK(pthread_create(&wt, NULL, write_loop, &w) == 0);
        struct prefault pf;
        CHECK(prefault_start(&pf) == 0);
        struct timespec t0;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        prefault_add(&pf, a, big);
        wait_done(&pf, big);
        double took = ms_since(t0);
        __atomic_store_n(&w.stop, 1, __ATOMIC_RELEASE);
        CHECK(pthread_join(wt, NULL) == 0);
        prefault_stop(&pf);
        prefault_stop(&pf); /* idempotent */
        CHECK(resident(a, big) == big / page);
        for (uint64_t off = 0; off < big / 2; off += 64 * page)
            CHECK(a[off + 7] == ((uint8_t)(off / page) | 1));
        /* The writer's last round is intact in every page it wrote. */
        for (uint64_t off = big / 2; off < big; off += page)
            CHECK(a[off + 1] == (uint8_t)((off - big / 2) / page) || a[off + 1] == 0);
        printf("prefault_test: %llu MiB faulted in %.1f ms (%s)\n", (unsigned long long)(big >> 20), took,
               pf.touch ? "touching pages" : "MADV_POPULATE_WRITE");
        munmap(a, big);
    }

    /* A second range after the first (a grown segment), and an unaligned
     * start inside a mapping (segment 0 after the rings). */
    {
        uint8_t *a = shared(small), *b = shared(small);
        struct prefault pf;
        CHECK(prefault_start(&pf) == 0);
        prefault_add(&pf, a + 512, small - 512);
        prefault_add(&pf, b, small);
        wait_done(&pf, 2 * small);
        prefault_stop(&pf);
        CHECK(resident(a, small) == small / page);
        CHECK(resident(b, small) == small / page);
        munmap(a, small);
        munmap(b, small);
    }

    /* Stopped in the middle of a large range: returns within about a
     * chunk's time, and leaves the rest alone. */
    {
        const uint64_t huge = UINT64_C(512) << 20;
        uint8_t *a = shared(huge);
        struct prefault pf;
        CHECK(prefault_start(&pf) == 0);
        prefault_add(&pf, a, huge);
        while (__atomic_load_n(&pf.done_bytes, __ATOMIC_RELAXED) < PREFAULT_CHUNK)
            usleep(100);
        struct timespec t0;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        prefault_stop(&pf);
        double took = ms_since(t0);
        uint64_t done = __atomic_load_n(&pf.done_bytes, __ATOMIC_RELAXED);
        printf("prefault_test: stopped after %llu of %llu MiB, in %.2f ms\n", (unsigned long long)(done >> 20),
               (unsigned long long)(huge >> 20), took);
        CHECK(done < huge);
        CHECK(took < 50.0);
        munmap(a, huge);
    }

    /* Never started: the other calls do nothing. */
    {
        struct prefault pf;
        memset(&pf, 0, sizeof pf);
        prefault_add(&pf, NULL, 4096);
        prefault_stop(&pf);
    }
    printf("prefault_test: ok\n");
    return 0;
}
