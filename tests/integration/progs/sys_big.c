/* sys_big: exactly K allocations of 33 MiB, one at a time (malloc, touch one byte, free).
 * Prints K. Large enough that every allocator maps them directly (or reuses a mapping). */
#include <stdio.h>
#include <stdlib.h>

#define K 20
#define SIZE (33u << 20)

int main(void)
{
    for (int i = 0; i < K; i++) {
        volatile char *p = malloc(SIZE);
        if (!p)
            return 1;
        p[0] = (char)i;
        free((void *)p);
    }
    printf("%d\n", K);
    return 0;
}
