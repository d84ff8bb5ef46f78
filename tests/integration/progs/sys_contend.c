/* sys_contend T: T threads, started together on a barrier, each doing N malloc(48)/free pairs
 * in a tight loop. With T > 1 the threads also free each other's objects through a shared
 * array of slots, so objects cross threads (and arenas) and the allocator's locks are shared.
 * Prints T and the total number of pairs. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>

#define N 200000
#define SLOTS 64

static int T;
static pthread_barrier_t bar;
static _Atomic(void *) slots[SLOTS];

static void *worker(void *arg)
{
    long id = (long)arg;
    pthread_barrier_wait(&bar);
    for (long i = 0; i < N; i++) {
        void *p = malloc(48);
        if (!p)
            abort();
        *(volatile char *)p = (char)i;
        if (T > 1) {
            /* swap into a shared slot; free whatever another thread left there */
            void *old = atomic_exchange(&slots[(i * 7 + id) % SLOTS], p);
            free(old);
        } else {
            free(p);
        }
    }
    return NULL;
}

int main(int argc, char **argv)
{
    T = argc > 1 ? atoi(argv[1]) : 4;
    if (T < 1 || T > 256)
        return 2;
    pthread_t th[256];
    pthread_barrier_init(&bar, NULL, (unsigned)T);
    for (long i = 0; i < T; i++)
        if (pthread_create(&th[i], NULL, worker, (void *)i))
            return 1;
    for (int i = 0; i < T; i++)
        pthread_join(th[i], NULL);
    for (int i = 0; i < SLOTS; i++)
        free(atomic_exchange(&slots[i], NULL));
    printf("%d %ld\n", T, (long)T * N);
    return 0;
}
