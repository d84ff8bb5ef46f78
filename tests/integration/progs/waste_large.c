/* waste_large: large objects touched only in their first quarter. Round 1 makes K objects of
 * 3 MiB + 100 bytes and frees them; round 2 makes K of 1 MiB + 100 and keeps them live at
 * exit. Prints the internal fragmentation the definition gives for the live ones:
 *   internal_large N   sum over live objects of (end of the last page ever covered from the
 *                      object's first page) - (end of the object)
 * where "ever covered" counts the round-1 objects that started on the same page. Untouched
 * pages of an object count nowhere: only the tail of its last page is internal. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define K 16
#define PAGE 4096u

static uintptr_t first_addr[K];
static uint64_t first_pages[K];

static uint64_t pages_of(uintptr_t a, size_t n)
{
    return ((a + n - 1) / PAGE) - (a / PAGE) + 1;
}

int main(void)
{
    size_t s1 = (3u << 20) + 100, s2 = (1u << 20) + 100;
    for (int i = 0; i < K; i++) {
        char *p = malloc(s1);
        if (!p)
            return 1;
        memset(p, 1, s1 / 4);
        first_addr[i] = (uintptr_t)p;
        first_pages[i] = pages_of((uintptr_t)p, s1);
        free(p);
    }
    /* Allocators hand the same pages back (jemalloc at another offset in the first page). */
    static char *live[K];
    uint64_t internal = 0;
    for (int i = 0; i < K; i++) {
        live[i] = malloc(s2);
        if (!live[i])
            return 1;
        memset(live[i], 2, s2 / 4);
        uintptr_t a = (uintptr_t)live[i];
        uint64_t pages = pages_of(a, s2);
        for (int j = 0; j < K; j++)
            if (first_addr[j] / PAGE == a / PAGE && first_pages[j] > pages)
                pages = first_pages[j];
        internal += (a / PAGE) * PAGE + pages * PAGE - (a + s2);
    }
    printf("internal_large %llu\n", (unsigned long long)internal);
    return 0;
}
