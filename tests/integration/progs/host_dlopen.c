/* host_dlopen: loads host_plugin with dlopen, calls it (the plugin allocates and frees), then
 * dlclose; twice, the second time with RTLD_LAZY|RTLD_LOCAL, and from a thread as well. Also a
 * dlopen of a missing library, which must fail as it does without the profiler. (A thread
 * that ends with pthread_exit runs first.)
 *
 * With "iterate": one thread allocates inside its dl_iterate_phdr callbacks, holding the
 * loader's lock, while another loads and unloads the plugin (so stacks meet code the unwinder
 * has no rules for yet) and two more allocate. A profiler whose stack walk takes the loader's
 * lock while other threads wait for the walk could deadlock here.
 *
 * usage: host_dlopen PLUGIN.so [iterate] */
#include <dlfcn.h>
#include <link.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef unsigned long (*work_fn)(int);

static int load_and_run(const char *path, int flags, const char *label)
{
    void *h = dlopen(path, flags);
    if (!h) {
        printf("%s: dlopen failed\n", label);
        return 1;
    }
    work_fn work = (work_fn)dlsym(h, "plugin_work");
    if (!work) {
        printf("%s: dlsym failed\n", label);
        return 1;
    }
    printf("%s: plugin_work(2000) = %lu\n", label, work(2000));
    int rc = dlclose(h);
    printf("%s: dlclose = %d\n", label, rc);
    return rc != 0;
}

static const char *plugin;

static void *exit_at_once(void *arg)
{
    pthread_exit(arg);
}

static void *thread_main(void *arg)
{
    (void)arg;
    return (void *)(long)load_and_run(plugin, RTLD_NOW, "thread");
}

static int allocate_in_callback(struct dl_phdr_info *info, size_t size, void *arg)
{
    (void)size;
    size_t *bytes = arg;
    for (int i = 0; i < 8; i++) {
        char *copy = strdup(info->dlpi_name ? info->dlpi_name : "");
        char *more = malloc(40 + 24 * (size_t)i);
        if (!copy || !more)
            exit(91);
        *bytes += strlen(copy) > 0;
        free(more);
        free(copy);
    }
    return 0;
}

static void *iterate_main(void *arg)
{
    size_t seen = 0;
    for (int i = 0; i < 4000; i++)
        dl_iterate_phdr(allocate_in_callback, &seen);
    *(size_t *)arg = seen > 0;
    return NULL;
}

static void *reload_main(void *arg)
{
    long bad = 0;
    for (int i = 0; i < 300; i++) {
        void *h = dlopen(plugin, RTLD_NOW | RTLD_LOCAL);
        work_fn work = h ? (work_fn)dlsym(h, "plugin_work") : NULL;
        bad += !work || work(10) == 0;
        bad += h && dlclose(h) != 0;
    }
    *(long *)arg = bad;
    return NULL;
}

static void *allocate_main(void *arg)
{
    unsigned long sum = 0;
    for (int i = 0; i < 200000; i++) {
        unsigned char *p = malloc(16 + (size_t)(i % 200));
        if (!p)
            exit(92);
        p[0] = (unsigned char)i;
        sum += p[0];
        free(p);
    }
    *(unsigned long *)arg = sum;
    return NULL;
}

static int iterate(void)
{
    pthread_t it, re, al[2];
    size_t seen = 0;
    long bad = 0;
    unsigned long sums[2] = { 0, 0 };
    pthread_create(&it, NULL, iterate_main, &seen);
    pthread_create(&re, NULL, reload_main, &bad);
    for (int i = 0; i < 2; i++)
        pthread_create(&al[i], NULL, allocate_main, &sums[i]);
    pthread_join(it, NULL);
    pthread_join(re, NULL);
    for (int i = 0; i < 2; i++)
        pthread_join(al[i], NULL);
    printf("iterate: names seen %zu, reload failures %ld, sums %lu %lu\n", seen, bad, sums[0],
           sums[1]);
    return bad != 0;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: host_dlopen PLUGIN.so [iterate]\n");
        return 2;
    }
    plugin = argv[1];
    if (argc > 2 && !strcmp(argv[2], "iterate"))
        return iterate();
    /* A thread ended by pthread_exit first: the C library loads its unwinder for that once,
     * with dlopen, which would wait for the loader's lock if it came from a thread a plugin's
     * constructor or destructor waits for. */
    pthread_t first;
    if (pthread_create(&first, NULL, exit_at_once, NULL) != 0 || pthread_join(first, NULL) != 0)
        return 1;
    int bad = 0;
    bad += load_and_run(plugin, RTLD_NOW | RTLD_GLOBAL, "first");
    bad += load_and_run(plugin, RTLD_LAZY | RTLD_LOCAL, "second");
    pthread_t t;
    void *r;
    pthread_create(&t, NULL, thread_main, NULL);
    pthread_join(t, &r);
    bad += (int)(long)r;
    void *missing = dlopen("liballoclens-no-such-plugin.so", RTLD_NOW);
    printf("missing: dlopen %s, dlerror %s\n", missing ? "succeeded" : "failed",
           dlerror() ? "set" : "empty");
    return bad ? 1 : 0;
}
