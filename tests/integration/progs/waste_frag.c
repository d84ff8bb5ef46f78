/* waste_frag: 100k objects of 4100 bytes and 100k of 33, all written, then every other one
 * freed; the survivors are still live at exit. Prints its own truth:
 *   internal_peak N   sum of malloc_usable_size - requested over all objects, before the frees
 *   internal_final N  the same over the survivors
 *   heap_rss_peak N   resident bytes (/proc/self/smaps) of the mappings holding its objects,
 *                     read with every object live
 *
 * waste_frag aligned: 5000 objects of 100 bytes from the C++ runtime's operator new with a
 * 4096-byte alignment (found with dlsym, the runtime loaded by dlopen), every other one freed;
 * internal_final as above. Their blocks are far bigger than their classes.
 * waste_frag split: 20000 blocks of 2000 bytes, each followed by a small one that keeps them
 * apart, are freed; 20000 of 1990 bytes then reuse them (glibc hands a 2016-byte chunk over
 * whole: 16 bytes more than the class of 1990). internal_final as above, none freed.
 * waste_frag late: 64 blocks of 1 MiB + 100 bytes from calloc, all written afterwards, then every
 * other one freed: the peak (all 64 live) comes after the allocations' looks at the footprint.
 *   live_peak N       the bytes live at the peak
 * waste_frag lastfree: a block of 200 KiB written and freed, then one of 3 MiB written and
 * freed: the second, written after its allocation's look, is the peak. live_peak as above.
 */
#include <dlfcn.h>
#include <malloc.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define N 100000
#define MAX_MAPS 4096

static void *big[N], *small[N];

struct map {
    uintptr_t lo, hi;
    int used;
};
static struct map maps[MAX_MAPS];
static int nmaps;

static void read_maps(void)
{
    FILE *f = fopen("/proc/self/maps", "r");
    char line[512];
    while (f && nmaps < MAX_MAPS && fgets(line, sizeof line, f)) {
        unsigned long lo, hi;
        if (sscanf(line, "%lx-%lx", &lo, &hi) == 2)
            maps[nmaps++] = (struct map){ lo, hi, 0 };
    }
    if (f)
        fclose(f);
}

static void mark(const void *p)
{
    uintptr_t a = (uintptr_t)p;
    for (int i = 0; i < nmaps; i++)
        if (a >= maps[i].lo && a < maps[i].hi) {
            maps[i].used = 1;
            return;
        }
}

/* Sum of Rss over the mappings marked used. */
static unsigned long long heap_rss(void)
{
    FILE *f = fopen("/proc/self/smaps", "r");
    char line[512];
    unsigned long long total = 0;
    int in = 0;
    while (f && fgets(line, sizeof line, f)) {
        unsigned long lo, hi, kb;
        if (sscanf(line, "%lx-%lx ", &lo, &hi) == 2 && strchr(line, '-') < strchr(line, ' ')) {
            in = 0;
            for (int i = 0; i < nmaps; i++)
                if (maps[i].used && lo < maps[i].hi && hi > maps[i].lo)
                    in = 1;
        } else if (in && sscanf(line, "Rss: %lu kB", &kb) == 1) {
            total += kb * 1024ull;
        }
    }
    if (f)
        fclose(f);
    return total;
}

static int aligned(void)
{
    enum { K = 5000 };
    static void *p[K];
    void *(*anew)(size_t, size_t);
    void (*adelete)(void *, size_t);
    if (!dlopen("libstdc++.so.6", RTLD_NOW | RTLD_GLOBAL))
        return 1;
    *(void **)&anew = dlsym(RTLD_DEFAULT, "_ZnwmSt11align_val_t");
    *(void **)&adelete = dlsym(RTLD_DEFAULT, "_ZdlPvSt11align_val_t");
    if (!anew || !adelete)
        return 1;
    unsigned long long final = 0;
    for (int i = 0; i < K; i++)
        memset(p[i] = anew(100, 4096), 3, 100);
    for (int i = 0; i < K; i += 2)
        adelete(p[i], 4096);
    for (int i = 1; i < K; i += 2)
        final += malloc_usable_size(p[i]) - 100;
    printf("internal_final %llu\n", final);
    return 0;
}

static int split(void)
{
    enum { K = 20000 };
    static void *a[K], *guard[K], *b[K];
    for (int i = 0; i < K; i++) {
        a[i] = malloc(2000);
        guard[i] = malloc(16);
        if (!a[i] || !guard[i])
            return 1;
    }
    for (int i = 0; i < K; i++)
        free(a[i]);
    unsigned long long final = 0;
    for (int i = 0; i < K; i++) {
        b[i] = malloc(1990);
        if (!b[i])
            return 1;
        memset(b[i], 4, 1990);
        final += malloc_usable_size(b[i]) - 1990 + malloc_usable_size(guard[i]) - 16;
    }
    printf("internal_final %llu\n", final);
    return 0;
}

static int late(void)
{
    enum { K = 64, SIZE = (1 << 20) + 100 };
    static char *p[K];
    for (int i = 0; i < K; i++)
        if (!(p[i] = calloc(1, SIZE)))
            return 1;
    for (int i = 0; i < K; i++)
        memset(p[i], 5, SIZE);
    for (int i = 0; i < K; i += 2)
        free(p[i]);
    printf("live_peak %d\n", K * SIZE);
    return 0;
}

/* Written for real: a memset right before the free is a dead store the compiler removes. */
static void write_block(char *p, size_t n, int c)
{
    memset(p, c, n);
    __asm__ volatile("" : : "r"(p) : "memory");
}

static int lastfree(void)
{
    char *small = malloc(200 << 10);
    if (!small)
        return 1;
    write_block(small, 200 << 10, 1);
    free(small);
    char *big = malloc(3 << 20);
    if (!big)
        return 1;
    write_block(big, 3 << 20, 2);
    free(big);
    printf("live_peak %d\n", 3 << 20);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc > 1 && strcmp(argv[1], "aligned") == 0)
        return aligned();
    if (argc > 1 && strcmp(argv[1], "split") == 0)
        return split();
    if (argc > 1 && strcmp(argv[1], "late") == 0)
        return late();
    if (argc > 1 && strcmp(argv[1], "lastfree") == 0)
        return lastfree();
    unsigned long long peak = 0, final = 0;
    for (int i = 0; i < N; i++) {
        big[i] = malloc(4100);
        small[i] = malloc(33);
        if (!big[i] || !small[i])
            return 1;
        memset(big[i], 1, 4100);
        memset(small[i], 2, 33);
        peak += malloc_usable_size(big[i]) - 4100 + malloc_usable_size(small[i]) - 33;
    }
    read_maps();
    for (int i = 0; i < N; i++) {
        mark(big[i]);
        mark(small[i]);
    }
    unsigned long long rss = heap_rss();
    for (int i = 0; i < N; i += 2) {
        free(big[i]);
        free(small[i]);
    }
    for (int i = 1; i < N; i += 2)
        final += malloc_usable_size(big[i]) - 4100 + malloc_usable_size(small[i]) - 33;
    printf("internal_peak %llu\ninternal_final %llu\nheap_rss_peak %llu\n", peak, final, rss);
    return 0;
}
