/* host_pthread_exit: main calls pthread_exit while its threads are still working; the last
 * thread to finish prints the totals, and the process exits 0 when it ends.
 *
 * usage: host_pthread_exit */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum { WORKERS = 4 };
static pthread_t workers[WORKERS];
static unsigned long results[WORKERS];

static void *worker(void *arg)
{
    long id = (long)arg;
    unsigned long sum = 0;
    for (int i = 0; i < 20000; i++) {
        size_t size = 8 + (size_t)((i + id) % 71) * 24;
        char *p = malloc(size);
        if (!p)
            exit(90);
        memset(p, (int)i, size);
        sum += size + (unsigned char)p[size / 2];
        free(p);
    }
    results[id] = sum;
    return NULL;
}

static void *reporter(void *arg)
{
    (void)arg;
    usleep(20000); /* main is gone by now */
    unsigned long total = 0;
    for (int k = 0; k < WORKERS; k++) {
        pthread_join(workers[k], NULL);
        total += results[k];
    }
    char *line = malloc(128);
    snprintf(line, 128, "reporter: %d workers done after main left, total %lu", WORKERS, total);
    puts(line);
    free(line);
    return NULL;
}

int main(void)
{
    for (long k = 0; k < WORKERS; k++)
        pthread_create(&workers[k], NULL, worker, (void *)k);
    pthread_t r;
    pthread_create(&r, NULL, reporter, NULL);
    pthread_detach(r);
    printf("main: calling pthread_exit\n");
    fflush(stdout);
    pthread_exit(NULL);
}
