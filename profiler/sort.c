/* Sorting for the report, without the C library's qsort: its merge sort takes its buffer from
 * the program's malloc for arrays over a kilobyte, and the report must not call the allocator
 * (one made by exit() in a signal handler that interrupted the allocator holding its lock
 * would wait for that lock for ever). The same stable merge sort, its buffer our own. */
#include <string.h>

#include "profiler.h"

static void merge_pass(const char *from, char *to, size_t n, size_t size, size_t width,
                       int (*cmp)(const void *, const void *))
{
    for (size_t lo = 0; lo < n; lo += 2 * width) {
        size_t mid = lo + width < n ? lo + width : n, hi = lo + 2 * width < n ? lo + 2 * width : n;
        size_t i = lo, j = mid, k = lo;
        while (i < mid && j < hi) {
            /* Ties from the left run first: stable, as glibc's qsort is in practice. */
            if (cmp(from + j * size, from + i * size) < 0)
                memcpy(to + k++ * size, from + j++ * size, size);
            else
                memcpy(to + k++ * size, from + i++ * size, size);
        }
        memcpy(to + k * size, from + i * size, (mid - i) * size);
        k += mid - i;
        memcpy(to + k * size, from + j * size, (hi - j) * size);
    }
}

/* Where the buffer cannot be had, an insertion sort in place: slow for long arrays, but the
 * report still comes. */
static void insertion(char *base, size_t n, size_t size, int (*cmp)(const void *, const void *))
{
    char tmp[256];
    for (size_t i = 1; i < n; i++) {
        size_t j = i;
        while (j > 0 && cmp(base + (j - 1) * size, base + i * size) > 0)
            j--;
        if (j == i)
            continue;
        for (size_t done = 0; done < size; done += sizeof tmp) {
            size_t part = size - done < sizeof tmp ? size - done : sizeof tmp;
            memcpy(tmp, base + i * size + done, part);
            for (size_t m = i; m > j; m--)
                memcpy(base + m * size + done, base + (m - 1) * size + done, part);
            memcpy(base + j * size + done, tmp, part);
        }
    }
}

void _al_sort(void *base, size_t n, size_t size, int (*cmp)(const void *, const void *))
{
    if (n < 2)
        return;
    size_t bytes = n * size;
    char *scratch = _al_mem_map(bytes);
    if (!scratch) {
        insertion(base, n, size, cmp);
        return;
    }
    char *from = base, *to = scratch;
    for (size_t width = 1; width < n; width *= 2) {
        merge_pass(from, to, n, size, width, cmp);
        char *t = from;
        from = to;
        to = t;
    }
    if (from != base)
        memcpy(base, from, bytes);
    _al_mem_unmap(scratch, bytes);
}
