/* host_plugin: a shared library that host_dlopen loads, uses and unloads. Its constructor and
 * destructor allocate too, so the profiler sees calls from code that comes and goes. */
#include <stdlib.h>
#include <string.h>

static char *state;

__attribute__((constructor)) static void plugin_init(void)
{
    state = malloc(4096);
    if (state)
        strcpy(state, "plugin state");
}

__attribute__((destructor)) static void plugin_fini(void)
{
    free(state);
    state = NULL;
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
