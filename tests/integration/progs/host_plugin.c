/* host_plugin: a shared library that host_dlopen loads, uses and unloads. Its constructor and
 * destructor allocate too, so the profiler sees calls from code that comes and goes.
 *
 * Built a second time with HOST_PLUGIN_THREADS (libhost_loader_threads.so): the constructor
 * and the destructor each start a thread that allocates (one valloc) and wait for it, as a
 * library setting up a background service does, inside the loader with its lock held. The
 * constructor's starts a thread of its own that does the same, and returns; the destructor's
 * ends with pthread_exit. The destructor then prints valloc=3. */
#include <malloc.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static char *state;

#ifdef HOST_PLUGIN_THREADS
static int vallocs;

enum how { RETURN, EXIT, NESTED };

static void run_worker(enum how how);

static void *worker(void *arg)
{
    enum how how = (enum how)(long)arg;
    void *p = valloc(100);
    if (!p)
        exit(93);
    free(p);
    __atomic_fetch_add(&vallocs, 1, __ATOMIC_RELAXED);
    if (how == NESTED)
        run_worker(RETURN); /* its creator is no constructor, but is waited for by one */
    if (how == EXIT)
        pthread_exit(NULL); /* unwinds the thread, the C library's cleanups run */
    return NULL;
}

static void run_worker(enum how how)
{
    pthread_t t;
    if (pthread_create(&t, NULL, worker, (void *)(long)how) != 0 || pthread_join(t, NULL) != 0)
        exit(94);
}
#endif

__attribute__((constructor)) static void plugin_init(void)
{
    state = malloc(4096);
    if (state)
        strcpy(state, "plugin state");
#ifdef HOST_PLUGIN_THREADS
    run_worker(NESTED);
#endif
}

__attribute__((destructor)) static void plugin_fini(void)
{
    free(state);
    state = NULL;
#ifdef HOST_PLUGIN_THREADS
    run_worker(EXIT);
    printf("valloc=%d\n", vallocs);
    fflush(stdout);
#endif
}

__attribute__((visibility("default"))) unsigned long plugin_work(int n)
{
    unsigned long sum = 0;
    void **v = calloc((size_t)n, sizeof *v);
    if (!v)
        return 0;
    for (int i = 0; i < n; i++) {
        size_t size = 32 + (size_t)(i % 29) * 64;
        v[i] = malloc(size);
        if (!v[i])
            return 0;
        memset(v[i], 3, size);
        sum += size;
    }
    for (int i = 0; i < n; i++) {
        v[i] = realloc(v[i], 100);
        free(v[i]);
    }
    free(v);
    return sum + (state ? strlen(state) : 0);
}
