/* host_leaf: the program other host programs exec. Allocates and frees N blocks, prints what
 * it saw and exits with the status it was given.
 *
 * usage: host_leaf STATUS [N] [TAG] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char **argv)
{
    int status = argc > 1 ? atoi(argv[1]) : 0;
    int n = argc > 2 ? atoi(argv[2]) : 1000;
    const char *tag = argc > 3 ? argv[3] : "leaf";
    unsigned long sum = 0;
    char **blocks = calloc((size_t)n, sizeof *blocks);
    if (!blocks)
        return 100;
    for (int i = 0; i < n; i++) {
        size_t size = 16 + (size_t)(i % 61) * 24;
        blocks[i] = malloc(size);
        if (!blocks[i])
            return 101;
        memset(blocks[i], i & 0xff, size);
        sum += size + (unsigned char)blocks[i][size - 1];
    }
    for (int i = 0; i < n; i++)
        free(blocks[i]);
    free(blocks);
    printf("%s: %d blocks, checksum %lu, exiting %d\n", tag, n, sum, status);
    return status;
}
