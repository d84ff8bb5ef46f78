/* host_rlimit: a program run under an address-space limit (ulimit -v), as batch systems and
 * containers do. It sets RLIMIT_AS, re-executes itself so the limit holds from the start of
 * the new image, then allocates and says how many blocks it got. What the profiler maps for
 * itself comes out of the program's budget: it must not take so much that the program's own
 * allocations fail, nor end the program where its allocator has nothing left to give.
 *
 * usage: host_rlimit            1.5 GiB; seven blocks of 100 MiB (every one fits plain)
 *        host_rlimit tight      64 MiB; sixteen blocks of 1 MiB (every allocator fits them in
 *                               about 40 MiB plain)
 *        host_rlimit starved    24 MiB; sixteen blocks of 1 MiB. Under mimalloc, whose first
 *                               segment does not fit, the program gets none, and goes on (the C
 *                               library must not end it over an allocation of alloclens's).
 *        host_rlimit MODE limited   (the re-executed image) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "wide";
    unsigned long mib = !strcmp(mode, "tight") ? 64 : !strcmp(mode, "starved") ? 24 : 1536;
    int n = mib == 1536 ? 7 : 16;
    size_t size = mib == 1536 ? 100ul << 20 : 1ul << 20;
    if (argc < 3 || strcmp(argv[2], "limited") != 0) {
        struct rlimit rl = { mib << 20, mib << 20 };
        if (setrlimit(RLIMIT_AS, &rl) != 0) {
            perror("setrlimit");
            return 1;
        }
        char *args[] = { argv[0], (char *)mode, "limited", NULL };
        execv("/proc/self/exe", args);
        perror("execv");
        return 1;
    }
    int got = 0;
    void *blocks[16];
    for (int i = 0; i < n; i++) {
        blocks[i] = malloc(size);
        if (blocks[i]) {
            memset(blocks[i], 1, 4096);
            got++;
        }
    }
    printf("under a %lu MiB address-space limit: %d of %d blocks of %zu MiB\n", mib, got, n, size >> 20);
    for (int i = 0; i < n; i++)
        free(blocks[i]);
    return got == n ? 0 : 1;
}
