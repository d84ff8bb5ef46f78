/* sites_pagemap: one large buffer of which only a quarter is ever touched, live until exit.
 *
 * site_touch_quarter allocates 64 MiB and writes its first quarter (16 MiB); the rest is never
 * read or written, so its pages are never faulted in. The buffer stays live until exit, and
 * nothing is allocated after it: the peak of live memory is reached by its malloc, before the
 * quarter is written, and lasts until exit.
 *
 * With --after, site_after_touch then allocates 8 MiB more and writes all of it, so the peak
 * comes only after the quarter was written. Both stay live until exit. The program prints its
 * truth ("after" is 0 without --after):
 *
 *   {"buffer":67108864,"touched":16777216,"after":8388608,"child":0}
 *
 * With --failed-realloc, a realloc of the buffer to more than any machine has then fails: the
 * buffer is the program's still, and its site's sample must stay live through the peak that
 * site_after_touch's 8 MiB then make.
 *
 * With --fork, the process first allocates, writes and frees 4 MiB (site_after_touch), so
 * that its pagemap has been read before; then a forked child does the above (without
 * --after) and exits, and its truth also says its pid ("child"), whose report is the one to
 * read. The parent only waits for it.
 *
 * With --threaded, the buffer is allocated by a thread of its own, and the 8 MiB of --after by
 * a SIGALRM handler (raised by main): their stacks must hold no frame of alloclens's (its thread
 * start and handler call are further out than the allocation).
 *
 * With --late-site, no buffer: site_early writes 64 objects of 1 MiB, frees half of them, and
 * site_late writes 36 more; the peak, 68 MiB, has grown by less than an eighth since the
 * early ones were measured, but site_late, measured never before, holds half of it. Then
 * every early object is freed, so the exit is not the peak. The truth names the late site's
 * bytes ("buffer") and says it touched all of them ("touched").
 *
 * The buffer is far larger than the sampling rate (p = 1 - e^(-64 MiB / R), 1 for any R of a
 * few MiB or less), so the site is sampled in every run.
 */
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define NOINL __attribute__((noinline, noclone))
#define MiB (1024ul * 1024ul)

static char *volatile buffer, *volatile after;

NOINL static void site_touch_quarter(size_t size, size_t touched)
{
    char *p = malloc(size);
    if (!p)
        abort();
    memset(p, 0x5a, touched);
    buffer = p;
}

NOINL static void site_after_touch(size_t size)
{
    char *p = malloc(size);
    if (!p)
        abort();
    memset(p, 0xa5, size);
    after = p;
}

NOINL static void *site_early(void)
{
    void *p = malloc(MiB);
    if (!p)
        abort();
    return memset(p, 0x11, MiB);
}

NOINL static void *site_late(void)
{
    void *p = malloc(MiB);
    if (!p)
        abort();
    return memset(p, 0x22, MiB);
}

static void *thread_main(void *arg)
{
    (void)arg;
    site_touch_quarter(64 * MiB, 16 * MiB);
    return NULL;
}

static void on_alarm(int sig)
{
    (void)sig;
    site_after_touch(8 * MiB);
}

static int threaded(void)
{
    pthread_t t;
    if (pthread_create(&t, NULL, thread_main, NULL) || pthread_join(t, NULL))
        return 1;
    signal(SIGALRM, on_alarm);
    raise(SIGALRM);
    printf("{\"buffer\":%lu,\"touched\":%lu,\"after\":%lu,\"child\":0}\n", 64 * MiB, 16 * MiB, 8 * MiB);
    return buffer[0] == 0x5a && after[0] == (char)0xa5 ? 0 : 1; /* live until exit */
}

static int late_site(void)
{
    static void *early[64], *late[36];
    for (int i = 0; i < 64; i++)
        early[i] = site_early();
    for (int i = 0; i < 32; i++)
        free(early[i]);
    for (int i = 0; i < 36; i++)
        late[i] = site_late();
    for (int i = 32; i < 64; i++)
        free(early[i]);
    printf("{\"buffer\":%lu,\"touched\":%lu,\"after\":0,\"child\":0}\n", 36 * MiB, 36 * MiB);
    return *(volatile char *)late[35] == 0x22 ? 0 : 1; /* live until exit */
}

int main(int argc, char **argv)
{
    const size_t size = 64 * MiB, touched = size / 4;
    if (argc > 1 && strcmp(argv[1], "--late-site") == 0)
        return late_site();
    if (argc > 1 && strcmp(argv[1], "--threaded") == 0)
        return threaded();
    bool failed_realloc = argc > 1 && strcmp(argv[1], "--failed-realloc") == 0;
    size_t more = argc > 1 && (strcmp(argv[1], "--after") == 0 || failed_realloc) ? 8 * MiB : 0;
    pid_t child = 0;
    char out[256];

    if (argc > 1 && strcmp(argv[1], "--fork") == 0) {
        site_after_touch(4 * MiB);
        free(after);
        child = fork();
        if (child < 0)
            return 1;
        if (child > 0) {
            int status;
            if (waitpid(child, &status, 0) != child)
                return 1;
            return WIFEXITED(status) ? WEXITSTATUS(status) : 1;
        }
        child = getpid();
    }
    site_touch_quarter(size, touched);
    if (failed_realloc) {
        size_t volatile huge = SIZE_MAX / 2;
        if (realloc(buffer, huge) != NULL)
            return 1;
    }
    if (more)
        site_after_touch(more);
    int len = snprintf(out, sizeof out, "{\"buffer\":%zu,\"touched\":%zu,\"after\":%zu,\"child\":%d}\n",
                       size, touched, more, (int)child);
    if (write(1, out, (size_t)len) != len)
        return 1;
    return buffer[0] == 0x5a && (!more || after[0] == (char)0xa5) ? 0 : 1; /* live until exit */
}
