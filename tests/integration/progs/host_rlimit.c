/* host_rlimit: a program run under an address-space limit (ulimit -v), as batch systems and
 * containers do. It sets RLIMIT_AS to 1.5 GiB, re-executes itself so the limit holds from
 * the start of the new image, then allocates seven 100 MiB blocks and says how many it got.
 * Without a profiler every one fits; what the profiler reserves for itself must not come out
 * of the program's budget to the point that the program's own allocations fail.
 *
 * usage: host_rlimit            (sets the limit and re-executes itself with "limited")
 *        host_rlimit limited */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

int main(int argc, char **argv)
{
    if (argc < 2 || strcmp(argv[1], "limited") != 0) {
        struct rlimit rl = { 1536ul << 20, 1536ul << 20 };
        if (setrlimit(RLIMIT_AS, &rl) != 0) {
            perror("setrlimit");
            return 1;
        }
        char *args[] = { argv[0], "limited", NULL };
        execv("/proc/self/exe", args);
        perror("execv");
        return 1;
    }
    int got = 0;
    void *blocks[7];
    for (int i = 0; i < 7; i++) {
        blocks[i] = malloc(100ul << 20);
        if (blocks[i]) {
            memset(blocks[i], 1, 4096);
            got++;
        }
    }
    printf("under a 1.5 GiB address-space limit: %d of 7 blocks of 100 MiB\n", got);
    for (int i = 0; i < 7; i++)
        free(blocks[i]);
    return got == 7 ? 0 : 1;
}
