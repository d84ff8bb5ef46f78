/* host_errno: the edge cases of the malloc family, where results and errno must be exactly
 * what the allocator gives without the profiler. Prints what it observes (whether a pointer is
 * NULL, alignments, errno names), never addresses.
 *
 * usage: host_errno */
#include <errno.h>
#include <malloc.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *en(int e)
{
    switch (e) {
    case 0: return "0";
    case ENOMEM: return "ENOMEM";
    case EINVAL: return "EINVAL";
    case EDOM: return "EDOM";
    case ERANGE: return "ERANGE";
    default: {
        static char buf[32];
        snprintf(buf, sizeof buf, "errno %d", e);
        return buf;
    }
    }
}

static const char *np(const void *p)
{
    return p ? "ptr" : "NULL";
}

static int aligned(const void *p, size_t a)
{
    return ((uintptr_t)p % a) == 0;
}

#define SENTINEL ((void *)(uintptr_t)0x5151)

/* Sizes through a volatile, so the compiler neither warns about nor folds the failing calls. */
static volatile size_t size_max = SIZE_MAX;

int main(void)
{
    void *p, *q;
    int rc;

    /* Some allocators set themselves up on the first call (mimalloc reads its options then,
     * leaving errno ENOENT); under alloclens that first call comes earlier. What is compared
     * here is the behaviour of calls made after that. */
    free(malloc(1));

    /* Successful calls leave errno as it was. */
    errno = EDOM;
    p = malloc(16);
    printf("malloc(16): %s errno %s\n", np(p), en(errno));
    errno = EDOM;
    free(p);
    printf("free(ptr): errno %s\n", en(errno));
    errno = EDOM;
    free(NULL);
    printf("free(NULL): errno %s\n", en(errno));

    errno = 0;
    p = malloc(size_max / 2);
    printf("malloc(SIZE_MAX/2): %s errno %s\n", np(p), en(errno));
    free(p);
    errno = 0;
    p = malloc(size_max);
    printf("malloc(SIZE_MAX): %s errno %s\n", np(p), en(errno));
    free(p);

    errno = EDOM;
    p = malloc(0);
    printf("malloc(0): %s errno %s\n", np(p), en(errno));
    free(p);

    errno = 0;
    p = calloc(size_max / 2, 4);
    printf("calloc overflow: %s errno %s\n", np(p), en(errno));
    errno = 0;
    p = calloc(size_max >> 31, size_max >> 31);
    printf("calloc 2^33 x 2^33: %s errno %s\n", np(p), en(errno));
    errno = EDOM;
    p = calloc(100, 10);
    int zero = 1;
    for (size_t i = 0; p && i < 1000; i++)
        zero &= ((unsigned char *)p)[i] == 0;
    printf("calloc(100,10): %s zeroed %d errno %s\n", np(p), zero, en(errno));
    free(p);
    errno = EDOM;
    p = calloc(0, 0);
    printf("calloc(0,0): %s errno %s\n", np(p), en(errno));
    free(p);

    errno = EDOM;
    p = realloc(NULL, 64);
    printf("realloc(NULL,64): %s errno %s\n", np(p), en(errno));
    strcpy(p, "kept by realloc");
    errno = 0;
    q = realloc(p, size_max / 2);
    printf("realloc(p,SIZE_MAX/2): %s errno %s, old block intact %d\n", np(q), en(errno),
           q == NULL && strcmp(p, "kept by realloc") == 0);
    if (q)
        p = q;
    errno = EDOM;
    q = realloc(p, 100000);
    printf("realloc grow: %s errno %s content %d\n", np(q), en(errno),
           q && strcmp(q, "kept by realloc") == 0);
    p = q;
    errno = EDOM;
    q = realloc(p, 0);
    printf("realloc(p,0): %s errno %s\n", np(q), en(errno));
    free(q);

    errno = 0;
    p = reallocarray(NULL, size_max / 4, 8);
    printf("reallocarray overflow: %s errno %s\n", np(p), en(errno));
    errno = EDOM;
    p = reallocarray(NULL, 10, 8);
    printf("reallocarray(NULL,10,8): %s errno %s\n", np(p), en(errno));
    free(p);

    p = SENTINEL;
    errno = EDOM;
    rc = posix_memalign(&p, 3, 16);
    printf("posix_memalign(align 3): rc %s, out %s, errno %s\n", en(rc),
           p == SENTINEL ? "untouched" : "changed", en(errno));
    p = SENTINEL;
    errno = EDOM;
    rc = posix_memalign(&p, sizeof(void *) / 2, 16);
    printf("posix_memalign(align %zu): rc %s, out %s, errno %s\n", sizeof(void *) / 2, en(rc),
           p == SENTINEL ? "untouched" : "changed", en(errno));
    p = SENTINEL;
    errno = EDOM;
    rc = posix_memalign(&p, 64, size_max / 2);
    printf("posix_memalign(64, SIZE_MAX/2): rc %s, out %s, errno %s\n", en(rc),
           p == SENTINEL ? "untouched" : "changed", en(errno));
    p = NULL;
    errno = EDOM;
    rc = posix_memalign(&p, 4096, 100);
    printf("posix_memalign(4096,100): rc %s, %s, aligned %d, errno %s\n", en(rc), np(p),
           aligned(p, 4096), en(errno));
    free(p);
    p = NULL;
    errno = EDOM;
    rc = posix_memalign(&p, 64, 0);
    printf("posix_memalign(64,0): rc %s, errno %s\n", en(rc), en(errno));
    free(p);

    errno = EDOM;
    p = aligned_alloc(64, 128);
    printf("aligned_alloc(64,128): %s aligned %d errno %s\n", np(p), aligned(p, 64), en(errno));
    free(p);
    errno = EDOM;
    p = aligned_alloc(1 << 16, 1 << 16);
    printf("aligned_alloc(64k,64k): %s aligned %d errno %s\n", np(p), aligned(p, 1 << 16),
           en(errno));
    free(p);
    errno = 0;
    p = aligned_alloc(64, size_max / 2);
    printf("aligned_alloc(64,SIZE_MAX/2): %s errno %s\n", np(p), en(errno));
    free(p);

    errno = EDOM;
    p = memalign(256, 1000);
    printf("memalign(256,1000): %s aligned %d errno %s\n", np(p), aligned(p, 256), en(errno));
    free(p);
    errno = EDOM;
    p = valloc(100);
    printf("valloc(100): %s page-aligned %d errno %s\n", np(p), aligned(p, 4096), en(errno));
    free(p);

    errno = EDOM;
    p = malloc(1000);
    printf("malloc_usable_size(malloc(1000)) >= 1000: %d errno %s\n",
           p && malloc_usable_size(p) >= 1000, en(errno));
    free(p);
    errno = EDOM;
    printf("malloc_usable_size(NULL): %zu errno %s\n", malloc_usable_size(NULL), en(errno));

    errno = EDOM;
    char *s = strdup("a string from strdup");
    printf("strdup: %s errno %s\n", s, en(errno));
    free(s);
    return 0;
}
