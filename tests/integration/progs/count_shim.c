/* count_shim: an independent count of a process's allocation calls, for the absolute-count
 * check of test_exact_counts.py. Preloaded alone in front of glibc (no alloclens), it counts
 * every call of the malloc family that reaches the `malloc`... symbols, whoever makes it (the
 * program, the C and C++ runtimes, the loader), forwards it to glibc's own functions, and at
 * exit writes `allocs=N reallocs=N frees=N` to the file $COUNT_SHIM_OUT. Under alloclens the
 * report's ops table must hold the same totals: a call alloclens makes for itself and counts
 * as the program's, or one of the program's it misses, shows as a difference.
 *
 * Only what the test programs and the runtimes call is here, with the alignments they pass. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

extern void *__libc_malloc(size_t n);
extern void *__libc_calloc(size_t k, size_t n);
extern void *__libc_realloc(void *p, size_t n);
extern void __libc_free(void *p);
extern void *__libc_memalign(size_t a, size_t n);
extern void *__libc_valloc(size_t n);
extern void *__libc_pvalloc(size_t n);

static unsigned long allocs, reallocs, frees;

static void count(unsigned long *c)
{
    __atomic_add_fetch(c, 1, __ATOMIC_RELAXED);
}

void *malloc(size_t n)
{
    count(&allocs);
    return __libc_malloc(n);
}

void *calloc(size_t k, size_t n)
{
    count(&allocs);
    return __libc_calloc(k, n);
}

void *realloc(void *p, size_t n)
{
    count(&reallocs);
    return __libc_realloc(p, n);
}

void *reallocarray(void *p, size_t k, size_t n)
{
    count(&reallocs);
    size_t bytes;
    if (__builtin_mul_overflow(k, n, &bytes)) {
        errno = ENOMEM;
        return NULL;
    }
    return __libc_realloc(p, bytes);
}

void free(void *p)
{
    count(&frees);
    __libc_free(p);
}

void *memalign(size_t a, size_t n)
{
    count(&allocs);
    return __libc_memalign(a, n);
}

void *aligned_alloc(size_t a, size_t n)
{
    count(&allocs);
    return __libc_memalign(a, n);
}

int posix_memalign(void **out, size_t a, size_t n)
{
    count(&allocs);
    if (a < sizeof(void *) || (a & (a - 1)))
        return EINVAL;
    void *p = __libc_memalign(a, n);
    if (!p)
        return ENOMEM;
    *out = p;
    return 0;
}

void *valloc(size_t n)
{
    count(&allocs);
    return __libc_valloc(n);
}

void *pvalloc(size_t n)
{
    count(&allocs);
    return __libc_pvalloc(n);
}

__attribute__((destructor)) static void write_counts(void)
{
    const char *path = getenv("COUNT_SHIM_OUT");
    if (!path)
        return;
    char line[128];
    int len = snprintf(line, sizeof line, "allocs=%lu reallocs=%lu frees=%lu\n", allocs, reallocs, frees);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0)
        return;
    if (write(fd, line, (size_t)len) != len)
        unlink(path);
    close(fd);
}
