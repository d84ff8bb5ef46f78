/* tls_plugin: tls_cycles's library: at load, blocks it keeps until it is unloaded; a
 * thread-local pointer to a block of its own (left to the process when the library goes, as
 * such pointers often are); and a few allocations per call. */
#include <stdlib.h>

static void *kept[100];
static __thread char *scratch;

__attribute__((constructor)) static void load(void)
{
    for (int i = 0; i < 100; i++)
        kept[i] = malloc(32 + (size_t)i);
}

__attribute__((destructor)) static void unload(void)
{
    for (int i = 0; i < 100; i++)
        free(kept[i]);
}

__attribute__((visibility("default"))) long tls_plugin_work(int n)
{
    if (!scratch)
        scratch = malloc(16);
    long sum = 0;
    for (int i = 0; i < n; i++) {
        char *p = malloc(100);
        if (!p)
            return -1;
        p[0] = (char)i;
        sum += p[0];
        free(p);
    }
    return sum;
}
