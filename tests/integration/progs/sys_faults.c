/* sys_faults: N allocations of 1 MiB, all live at once, then all freed. Under glibc each is
 * above the mmap threshold (128 KiB; the dynamic threshold only moves on free, and none is freed
 * before the last is made), so each malloc maps fresh memory and writes the chunk header into
 * its first page: exactly one page fault inside every such malloc, none in the program (it never
 * touches the blocks), and none in free (munmap). A block of 1 MiB plus header cannot hold an
 * aligned 2 MiB huge page, so THP does not change the count.
 * Prints N and the expected page faults per malloc. */
#include <stdio.h>
#include <stdlib.h>

#define N 200

int main(void)
{
    static void *v[N];
    for (int i = 0; i < N; i++)
        if (!(v[i] = malloc(1u << 20)))
            return 1;
    for (int i = 0; i < N; i++)
        free(v[i]);
    printf("%d 1.0\n", N);
    return 0;
}
