/* host_own_malloc: a program that defines the malloc family itself (a bump allocator over a
 * static arena; free keeps nothing), as programs with a built-in allocator do. The executable's
 * definitions come before any preloaded library's, so nothing can stand in front of them.
 *
 * usage: host_own_malloc      prints how many allocations main made; exits 3 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#define ARENA (64u << 20)
#define HEADER 16u /* the size, kept in front of each block, so realloc can copy */

static _Alignas(64) unsigned char arena[ARENA];
static size_t used;
static unsigned long calls;

void *memalign(size_t align, size_t n)
{
    if (align < HEADER)
        align = HEADER;
    size_t start = (used + HEADER + align - 1) & ~(align - 1);
    if (n > ARENA || start + n > ARENA) {
        errno = ENOMEM;
        return NULL;
    }
    used = start + n;
    calls++;
    memcpy(arena + start - sizeof n, &n, sizeof n);
    return arena + start;
}

void *malloc(size_t n)
{
    return memalign(HEADER, n);
}

void free(void *p)
{
    (void)p;
}

void *calloc(size_t k, size_t n)
{
    if (n && k > SIZE_MAX / n) {
        errno = ENOMEM;
        return NULL;
    }
    return malloc(k * n); /* the arena is never reused: still zero */
}

size_t malloc_usable_size(void *p)
{
    size_t n = 0;
    if (p)
        memcpy(&n, (unsigned char *)p - sizeof n, sizeof n);
    return n;
}

void *realloc(void *p, size_t n)
{
    void *q = malloc(n);
    size_t old = malloc_usable_size(p);
    if (q && p)
        memcpy(q, p, old < n ? old : n);
    return q;
}

int posix_memalign(void **out, size_t align, size_t n)
{
    void *p = memalign(align, n);
    if (!p)
        return ENOMEM;
    *out = p;
    return 0;
}

void *aligned_alloc(size_t align, size_t n)
{
    return memalign(align, n);
}

int main(void)
{
    unsigned long before = calls;
    for (int i = 0; i < 1000; i++) {
        char *s = malloc(32);
        if (!s)
            return 1;
        snprintf(s, 32, "%d", i);
        free(realloc(s, 64));
    }
    printf("own malloc: main made %lu allocations\n", calls - before);
    return 3;
}
