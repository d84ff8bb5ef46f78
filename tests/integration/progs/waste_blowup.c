/* waste_blowup MODE: ROUNDS batches of BATCH objects of SIZE bytes, each written.
 *   threads: a producer thread allocates each batch; two consumer threads free it (half each);
 *            the producer starts the next batch once the last one is freed.
 *   single:  one thread allocates each batch and frees it, the same volume.
 *   classes: one thread, CLASS_ROUNDS batches, each of another size (SIZE + 48 bytes a
 *            round), allocated and freed: allocators that hand freed memory to other sizes
 *            (glibc merges its free chunks) serve every round from the same memory, so the
 *            freed bytes not taken again by their own class add up to far more than the heap.
 * Prints "batch_bytes N": the bytes of one batch (classes: of the first), and with classes
 * "freed_bytes N", all that was freed. Allocators that keep freed memory in the
 * freeing thread's cache cannot give it to the producer: its next batch takes new memory, and
 * the freed bytes not taken again are blowup. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define ROUNDS 8
#define BATCH 16384
#define SIZE 256
#define CONSUMERS 2
#define CLASS_ROUNDS 24

static void *batch[BATCH];
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
static int round_ready = -1, done_count;

static void *consumer(void *arg)
{
    int me = (int)(long)arg;
    /* A thread that only frees has no cache of its own in tcmalloc, which then hands what it
     * frees straight back to its central lists, where the producer takes it again. Consumers
     * that also allocate, as most threads do, have one: made here. */
    void *volatile own = malloc(SIZE);
    free(own);
    for (int r = 0; r < ROUNDS; r++) {
        pthread_mutex_lock(&mu);
        while (round_ready < r)
            pthread_cond_wait(&cv, &mu);
        pthread_mutex_unlock(&mu);
        for (int i = me; i < BATCH; i += CONSUMERS)
            free(batch[i]);
        pthread_mutex_lock(&mu);
        done_count++;
        pthread_cond_broadcast(&cv);
        pthread_mutex_unlock(&mu);
    }
    return NULL;
}

static void fill(size_t size)
{
    for (int i = 0; i < BATCH; i++) {
        batch[i] = malloc(size);
        if (!batch[i])
            exit(1);
        memset(batch[i], i, size);
    }
}

/* One thread's batch of SIZE-byte objects, made and freed by itself. */
static void fill_and_free(size_t size)
{
    fill(size);
    for (int i = 0; i < BATCH; i++)
        free(batch[i]);
}

static void *producer(void *arg)
{
    (void)arg;
    for (int r = 0; r < ROUNDS; r++) {
        fill(SIZE);
        pthread_mutex_lock(&mu);
        round_ready = r;
        pthread_cond_broadcast(&cv);
        while (done_count < (r + 1) * CONSUMERS)
            pthread_cond_wait(&cv, &mu);
        pthread_mutex_unlock(&mu);
    }
    return NULL;
}

int main(int argc, char **argv)
{
    if (argc != 2 || (strcmp(argv[1], "threads") && strcmp(argv[1], "single") &&
                      strcmp(argv[1], "classes"))) {
        fprintf(stderr, "usage: waste_blowup threads|single|classes\n");
        return 2;
    }
    if (!strcmp(argv[1], "classes")) {
        long freed = 0;
        for (int r = 0; r < CLASS_ROUNDS; r++) {
            size_t size = SIZE + 48 * (size_t)r;
            fill_and_free(size);
            freed += (long)(BATCH * size);
        }
        printf("batch_bytes %d\nfreed_bytes %ld\n", BATCH * SIZE, freed);
        return 0;
    }
    if (!strcmp(argv[1], "threads")) {
        pthread_t p, c[CONSUMERS];
        for (long i = 0; i < CONSUMERS; i++)
            pthread_create(&c[i], NULL, consumer, (void *)i);
        pthread_create(&p, NULL, producer, NULL);
        pthread_join(p, NULL);
        for (int i = 0; i < CONSUMERS; i++)
            pthread_join(c[i], NULL);
    } else {
        for (int r = 0; r < ROUNDS; r++)
            fill_and_free(SIZE);
    }
    printf("batch_bytes %d\n", BATCH * SIZE);
    return 0;
}
