/* tls_cycles: loads a library with thread-local data (tls_plugin) with dlopen, has it allocate
 * into its thread-local, and closes it with dlclose, N times (default 10). The C library's
 * loader gives the library's thread-local block a malloc at the first access of each load, and
 * frees the block of the load before at the thread's next access to any such block: calls of
 * the program's, which the absolute check counts with count_shim and alloclens alike.
 *
 * usage: tls_cycles TLS_PLUGIN.so [N] */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: tls_cycles TLS_PLUGIN.so [N]\n");
        return 2;
    }
    int n = argc > 2 ? atoi(argv[2]) : 10;
    long sum = 0;
    for (int i = 0; i < n; i++) {
        void *h = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
        if (!h) {
            fprintf(stderr, "tls_cycles: %s\n", dlerror());
            return 1;
        }
        long (*work)(int) = (long (*)(int))dlsym(h, "tls_plugin_work");
        if (!work) {
            fprintf(stderr, "tls_cycles: %s\n", dlerror());
            return 1;
        }
        sum += work(100);
        dlclose(h);
    }
    printf("tls_cycles: %d loads, sum %ld\n", n, sum);
    return 0;
}
