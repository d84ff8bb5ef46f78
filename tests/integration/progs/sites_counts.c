/* sites_counts: exactly 100000 mallocs (and as many frees) from one function, for comparing
 * `--mode sample` with `--mode full`: the op counts must be identical, and the sampler must see
 * the site in both. The program prints its truth: {"malloc":100000,"free":100000,"bytes":N}
 *
 * usage: sites_counts [N]          (N mallocs; default 100000)
 *        sites_counts --keep N   N mallocs of 16, 32 and 64 bytes, all live at once (many on
 *                                each page: at a small --sample-rate, many live samples share
 *                                a page), then all freed; nothing is live at exit
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define NOINL __attribute__((noinline, noclone))

static void *volatile sink;

/* Sizes cycle through 16 B .. 4 KiB, so the site's bytes (about 90 MB in all for N = 100000)
 * are sampled some 170 times at the default rate. */
NOINL static unsigned long site_counted_mallocs(unsigned long n)
{
    unsigned long bytes = 0;
    for (unsigned long i = 0; i < n; i++) {
        size_t sz = 16ul << (i % 9);
        void *p = malloc(sz);
        if (!p)
            abort();
        sink = p;
        free(p);
        bytes += sz;
    }
    return bytes;
}

NOINL static unsigned long site_kept_mallocs(void **keep, unsigned long n)
{
    unsigned long bytes = 0;
    for (unsigned long i = 0; i < n; i++) {
        size_t sz = 16ul << (i % 3);
        keep[i] = malloc(sz);
        if (!keep[i])
            abort();
        bytes += sz;
    }
    return bytes;
}

int main(int argc, char **argv)
{
    unsigned long n, bytes;
    if (argc > 2 && !strcmp(argv[1], "--keep")) {
        n = strtoul(argv[2], NULL, 10);
        static void *keep[1000000];
        if (n > sizeof keep / sizeof keep[0])
            return 2;
        bytes = site_kept_mallocs(keep, n);
        for (unsigned long i = 0; i < n; i++)
            free(keep[i]);
    } else {
        n = argc > 1 ? strtoul(argv[1], NULL, 10) : 100000;
        bytes = site_counted_mallocs(n);
    }
    char out[128];
    int len = snprintf(out, sizeof out, "{\"malloc\":%lu,\"free\":%lu,\"bytes\":%lu}\n", n, n, bytes);
    return write(1, out, (size_t)len) == len ? 0 : 1;
}
