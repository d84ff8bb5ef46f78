/* waste_churn N: N blocks of 32 MiB allocated, one page of each written, each freed 8 blocks
 * later (8 live at a time). Allocators that map such blocks at ever new addresses (mimalloc) make
 * the profiler's tables follow them: the tables of the MiBs the allocator unmaps must go too,
 * and --mode sample, whose sampled blocks here share one bucket of its index, must keep none.
 * Prints {"blocks":N}. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define LIVE 8

int main(int argc, char **argv)
{
    long n = argc > 1 ? atol(argv[1]) : 1000;
    char *ring[LIVE] = { 0 };
    for (long i = 0; i < n; i++) {
        free(ring[i % LIVE]);
        char *p = ring[i % LIVE] = malloc(32 << 20);
        if (!p)
            return 1;
        memset(p, 1, 4096);
        __asm__ volatile("" : : "r"(p) : "memory");
    }
    for (int i = 0; i < LIVE; i++)
        free(ring[i]);
    printf("{\"blocks\":%ld}\n", n);
    return 0;
}
