/* sites_counts: exactly 100000 mallocs (and as many frees) from one function, for comparing
 * `--mode sample` with `--mode full`: the op counts must be identical, and the sampler must see
 * the site in both. The program prints its truth: {"malloc":100000,"free":100000,"bytes":N}
 *
 * usage: sites_counts [N]          (N mallocs; default 100000)
 *        sites_counts --keep N   N mallocs of 16, 32 and 64 bytes, all live at once (many on
 *                                each page: at a small --sample-rate, many live samples share
 *                                a page), then all freed; nothing is live at exit
 *        sites_counts --many-sites  2^15 mallocs of 100 bytes, each from a call path of its own
 *                                (15 levels of two call sites), then 8 of 8 MiB from
 *                                site_big, all live at exit: more sites than the table holds,
 *                                the biggest last. Prints {"paths":32768,"big":67108864}
 *        sites_counts --long-name  one malloc of 1 MiB, live at exit, from a function whose
 *                                name is 1664 characters long (as C++ templates' names run):
 *                                named whole. Prints {"name":1664}
 *        sites_counts --inlined  a malloc of 1 MiB from a function inlined into its caller,
 *                                and one of 2 MiB from the same function inlined into
 *                                another, both live at exit: each stack names the inlined
 *                                function with its own line, then its caller with the line
 *                                of the inlined call. Prints {"line":N,"a":A,"b":B}: the
 *                                malloc's line and the two callers' lines of their calls
 *        sites_counts --unloaded A B [--remove|--replace]  loads library A (sites_plugin.c),
 *                                mallocs 1 MiB from its site_plugin_a, unloads it (and with
 *                                --remove deletes its file, with --replace writes B's bytes
 *                                over it, in place: a rebuild), then loads B, most likely in its place,
 *                                and mallocs 2 MiB from its site_plugin_b; both live at exit.
 *                                Prints {"a":1048576,"b":2097152,"same_place":true|false}
 *                                (whether B was loaded where A was)
 */
#include <dlfcn.h>
#include <stdbool.h>
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

#define LEVELS 15

static void *paths[1u << LEVELS], *big[8];

NOINL static void site_path_leaf(unsigned path)
{
    paths[path] = malloc(100);
    __asm__ volatile("");
}

/* Each level calls the next from one of two places, as PATH's bit says: a stack per path. */
NOINL static void site_path(unsigned level, unsigned path)
{
    if (level == LEVELS)
        site_path_leaf(path);
    else if ((path >> level) & 1)
        site_path(level + 1, path);
    else
        site_path(level + 1, path);
    __asm__ volatile("");
}

NOINL static void site_big(void)
{
    for (int i = 0; i < 8; i++)
        big[i] = malloc(8 << 20);
    __asm__ volatile("");
}

/* site_long_name_ (13 characters) doubled 7 times. */
#define CAT_(a, b) a##b
#define CAT(a, b) CAT_(a, b)
#define TWICE(x) CAT(x, x)
#define LONG_NAME TWICE(TWICE(TWICE(TWICE(TWICE(TWICE(TWICE(site_long_nam)))))))

NOINL static void LONG_NAME(void)
{
    sink = malloc(1 << 20);
    __asm__ volatile("");
}

static inline __attribute__((always_inline)) void *site_inlined_helper(size_t n, int *line)
{
    *line = __LINE__ + 1;
    return malloc(n);
}

NOINL static void site_inlined_caller(int *line, int *call)
{
    *call = __LINE__ + 1;
    sink = site_inlined_helper(1 << 20, line);
    __asm__ volatile("");
}

static void *volatile sink_other;

NOINL static void site_inlined_other_caller(int *line, int *call)
{
    *call = __LINE__ + 1;
    sink_other = site_inlined_helper(2 << 20, line);
    __asm__ volatile("");
}

/* FROM's bytes written over TO, in place (the same inode): whether all were. */
static bool copy_over(const char *from, const char *to)
{
    static char buf[1 << 20];
    FILE *in = fopen(from, "rb"), *out = fopen(to, "r+b");
    size_t n = in ? fread(buf, 1, sizeof buf, in) : 0;
    bool ok = in && out && n > 0 && n < sizeof buf && fwrite(buf, 1, n, out) == n && ftruncate(fileno(out), (off_t)n) == 0;
    if (in)
        fclose(in);
    if (out && fclose(out) != 0)
        ok = false;
    return ok;
}

/* The library at PATH loaded, its function FN called for N bytes; the library's load address. */
static void *plugin_malloc(const char *path, const char *fn, size_t n, void **handle)
{
    *handle = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    void *(*f)(size_t) = *handle ? (void *(*)(size_t))dlsym(*handle, fn) : NULL;
    Dl_info info;
    if (!f || !dladdr((void *)f, &info))
        exit(3);
    sink = f(n);
    return info.dli_fbase;
}

int main(int argc, char **argv)
{
    unsigned long n, bytes;
    if (argc > 3 && !strcmp(argv[1], "--unloaded")) {
        void *ha, *hb;
        void *a = plugin_malloc(argv[2], "site_plugin_a", 1 << 20, &ha);
        void *kept = sink;
        if (dlclose(ha) != 0 || (argc > 4 && !strcmp(argv[4], "--remove") && unlink(argv[2]) != 0) ||
            (argc > 4 && !strcmp(argv[4], "--replace") && !copy_over(argv[3], argv[2])))
            return 4;
        void *b = plugin_malloc(argv[3], "site_plugin_b", 2 << 20, &hb);
        printf("{\"a\":%d,\"b\":%d,\"same_place\":%s}\n", 1 << 20, 2 << 20, a == b ? "true" : "false");
        return kept && sink ? 0 : 1;
    }
    if (argc > 1 && !strcmp(argv[1], "--inlined")) {
        int line, a, b;
        site_inlined_caller(&line, &a);
        site_inlined_other_caller(&line, &b);
        printf("{\"line\":%d,\"a\":%d,\"b\":%d}\n", line, a, b);
        return sink && sink_other ? 0 : 1;
    }
    if (argc > 1 && !strcmp(argv[1], "--long-name")) {
        LONG_NAME();
        printf("{\"name\":%u}\n", 13u << 7);
        return sink ? 0 : 1;
    }
    if (argc > 1 && !strcmp(argv[1], "--many-sites")) {
        for (unsigned p = 0; p < 1u << LEVELS; p++)
            site_path(0, p);
        site_big();
        printf("{\"paths\":%u,\"big\":%d}\n", 1u << LEVELS, 8 << 23);
        return paths[0] && big[7] ? 0 : 1;
    }
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
