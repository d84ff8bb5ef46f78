/* waste_frag: 100k objects of 4100 bytes and 100k of 33, all written, then every other one
 * freed; the survivors are still live at exit. Prints its own truth:
 *   internal_peak N   sum of malloc_usable_size - requested over all objects, before the frees
 *   internal_final N  the same over the survivors
 *   heap_rss_peak N   resident bytes (/proc/self/smaps) of the mappings holding its objects,
 *                     read with every object live
 */
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

int main(void)
{
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
