/* host_exit_threads: the process ends while 4 detached threads are still allocating.
 *
 * usage: host_exit_threads MODE
 *   exit     main calls exit(3)
 *   return   main returns 4
 *   _exit    main calls _exit(5) (no exit handlers run)
 *   thread   one of the threads calls exit(6) while the others allocate */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static atomic_long iterations[4];
static const char *mode;
static atomic_int announced; /* main has printed its line: thread 2 may exit (mode thread) */

static void *worker(void *arg)
{
    long id = (long)arg;
    void *keep[32] = { 0 };
    long after = 0;
    for (long i = 0;; i++) {
        int slot = (int)(i & 31);
        free(keep[slot]);
        size_t size = 16 + (size_t)((i * 31 + id) % 113) * 56;
        if (i % 200 == 0)
            size += 256 * 1024;
        keep[slot] = (i & 1) ? malloc(size) : calloc(1, size);
        if (keep[slot])
            memset(keep[slot], (int)id, 16);
        if (i % 7 == 0) {
            void *r = realloc(keep[slot], size + 100);
            if (r)
                keep[slot] = r;
        }
        atomic_fetch_add(&iterations[id], 1);
        if (id == 2 && !strcmp(mode, "thread") && atomic_load(&announced) && ++after == 5000) {
            printf("thread 2: calling exit(6)\n");
            exit(6);
        }
    }
    return NULL;
}

int main(int argc, char **argv)
{
    mode = argc > 1 ? argv[1] : "exit";
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    for (long k = 0; k < 4; k++) {
        pthread_t t;
        if (pthread_create(&t, &attr, worker, (void *)k) != 0) {
            perror("pthread_create");
            return 1;
        }
    }
    for (int k = 0; k < 4; k++)
        while (atomic_load(&iterations[k]) < 2000)
            usleep(200);
    printf("main: 4 detached threads are allocating; mode %s\n", mode);
    fflush(stdout);
    atomic_store(&announced, 1);
    if (!strcmp(mode, "exit"))
        exit(3);
    if (!strcmp(mode, "return"))
        return 4;
    if (!strcmp(mode, "_exit"))
        _exit(5);
    if (!strcmp(mode, "thread")) {
        for (;;)
            pause();
    }
    fprintf(stderr, "host_exit_threads: unknown mode %s\n", mode);
    return 2;
}
