/* host_dlopen: loads host_plugin with dlopen, calls it (the plugin allocates and frees), then
 * dlclose; twice, the second time with RTLD_LAZY|RTLD_LOCAL, and from a thread as well. Also a
 * dlopen of a missing library, which must fail as it does without the profiler. (A thread
 * that ends with pthread_exit runs first.)
 *
 * usage: host_dlopen PLUGIN.so */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

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

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: host_dlopen PLUGIN.so\n");
        return 2;
    }
    plugin = argv[1];
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
