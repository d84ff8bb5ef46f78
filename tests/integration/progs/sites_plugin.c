/* A library for sites_counts --unloaded, built twice: as sites_plugin_a (PLUGIN_FN
 * site_plugin_a) and sites_plugin_b (site_plugin_b). Its one function mallocs N bytes. */
#include <stdlib.h>

__attribute__((visibility("default"), noinline)) void *PLUGIN_FN(size_t n)
{
    void *p = malloc(n);
    __asm__ volatile("" : : "r"(p) : "memory"); /* no sibling call: this frame stays */
    return p;
}
