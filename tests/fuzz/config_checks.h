/* The checks shared by the fuzz target (fuzz_config.c) and the replay test (replay.c): parse an
 * input; a rejected one must leave an empty config and a "NAME:LINE: ..." message naming a line
 * of the input; an accepted one must satisfy the format's invariants (its runs the same classes
 * as its classes), survive format -> parse unchanged (and format to the same text again), and
 * its class table must answer "smallest class >= size" for every class boundary and the sizes
 * around the threshold. */
#ifndef ALLOCLENS_FUZZ_CONFIG_CHECKS_H
#define ALLOCLENS_FUZZ_CONFIG_CHECKS_H

#include <inttypes.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alloc_config.h"

#define CHECK_NAME "input"
/* The largest table _al_class_table_build may be asked for: 64 Ki granules below the split and
 * 4 Mi + 1 above (one more than it accepts, so it must refuse). */
#define CHECK_TABLE_CAP (((size_t)65536 + (1u << 22) + 1) * sizeof(uint32_t))
#define CHECK_TABLE_MIN_REFUSED (((size_t)(1u << 22) + 1) * sizeof(uint32_t))

static struct al_alloc_config check_a, check_b;
static char check_text_a[1 << 20], check_text_b[1 << 20];

static int check_fail(char *why, size_t cap, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int check_fail(char *why, size_t cap, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, cap, fmt, ap);
    va_end(ap);
    return -1;
}

/* Smallest class >= size, or 0 at and above the threshold. */
static uint64_t check_brute_class(const struct al_alloc_config *c, uint64_t size)
{
    if (size >= c->large_threshold)
        return 0;
    uint32_t lo = 0, hi = c->nclasses; /* first class >= size in [lo, hi) */
    while (lo < hi) {
        uint32_t mid = lo + (hi - lo) / 2;
        if (c->classes[mid] < size)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < c->nclasses ? c->classes[lo] : UINT64_MAX;
}

static bool check_same(const struct al_alloc_config *x, const struct al_alloc_config *y)
{
    return strcmp(x->allocator, y->allocator) == 0 &&
           _al_config_identity_equal(&x->identity, &y->identity) && x->style == y->style &&
           x->page_size == y->page_size && x->large_threshold == y->large_threshold &&
           strcmp(x->confidence, y->confidence) == 0 && x->nclasses == y->nclasses &&
           memcmp(x->classes, y->classes, x->nclasses * sizeof x->classes[0]) == 0;
}

static int check_lookup(const struct al_class_table *t, const struct al_alloc_config *c, uint64_t size,
                        char *why, size_t cap)
{
    uint64_t want = check_brute_class(c, size), got = _al_class_of(t, size);
    if (got != want)
        return check_fail(why, cap, "class of %" PRIu64 ": table says %" PRIu64 ", truth is %" PRIu64,
                          size, got, want);
    return 0;
}

static int check_table(const struct al_alloc_config *c, const uint8_t *data, size_t size, char *why, size_t cap)
{
    /* One run with a power-of-two step is worked out, with no tables; other classes take
     * tables of a bounded size. */
    bool one_run = _al_class_table_one_run(c);
    size_t bytes = _al_class_table_bytes(c);
    if (one_run ? bytes != 0 : (bytes == 0 || bytes > CHECK_TABLE_CAP || bytes % sizeof(uint32_t)))
        return check_fail(why, cap, "table size %zu bytes for a valid config%s", bytes, one_run ? " of one run" : "");
    void *mem = bytes ? malloc(bytes) : NULL;
    if (bytes && !mem)
        return 0;
    struct al_class_table t;
    int r = _al_class_table_build(&t, c, mem);
    if (r < 0) {
        free(mem);
        /* Refused only when the granules above the split would be more than 4 Mi (a huge
         * threshold with fine class spacing above 64 KiB: a documented limit, not a bug). */
        if (one_run || bytes < CHECK_TABLE_MIN_REFUSED)
            return check_fail(why, cap, "table build refused a valid config needing %zu bytes", bytes);
        return 0;
    }
    if (t.one_run != one_run)
        return check_fail(why, cap, "table one_run %d for a config of %u runs", t.one_run, c->nruns);
    if (!one_run && (((size_t)t.n_lo + t.n_hi) * sizeof(uint32_t) != bytes || t.n_lo > 65536 || t.n_hi > (1u << 22)))
        return check_fail(why, cap, "table of %u + %u granules in %zu bytes", t.n_lo, t.n_hi, bytes);
    uint64_t th = c->large_threshold;
    uint64_t probes[] = { 0, 1, 2, th - 2, th - 1, th, th + 1, AL_CLASS_SPLIT - 1, AL_CLASS_SPLIT,
                          AL_CLASS_SPLIT + 1, UINT64_MAX };
    for (size_t i = 0; i < sizeof probes / sizeof probes[0]; i++)
        if (check_lookup(&t, c, probes[i], why, cap) < 0)
            goto bad;
    for (uint32_t i = 0; i < c->nclasses; i++) {
        uint64_t b = c->classes[i];
        if (check_lookup(&t, c, b - 1, why, cap) < 0 || check_lookup(&t, c, b, why, cap) < 0 ||
            check_lookup(&t, c, b + 1, why, cap) < 0)
            goto bad;
    }
    /* A few sizes taken from the input itself. */
    for (size_t i = 0; i + 4 <= size && i < 64; i += 4) {
        uint32_t v;
        memcpy(&v, data + i, 4);
        if (check_lookup(&t, c, th ? v % (th + 16) : v, why, cap) < 0)
            goto bad;
    }
    free(mem);
    return 0;
bad:
    free(mem);
    return -1;
}

/* 0 when INPUT passes every check, -1 with WHY filled in otherwise. */
static int check_config_input(const uint8_t *data, size_t size, char *why, size_t cap)
{
    char err[512];
    struct al_alloc_config *a = &check_a, *b = &check_b;
    a->nclasses = 12345;
    int r = _al_config_parse((const char *)data, size, CHECK_NAME, a, err, sizeof err);
    if (r < 0) {
        if (a->nclasses != 0 || a->allocator[0] || a->large_threshold)
            return check_fail(why, cap, "rejected (%s) but the config is not left empty", err);
        /* "input:LINE: ", LINE from 1 to the number of lines + 1 */
        size_t lines = 1;
        for (size_t i = 0; i < size; i++)
            lines += data[i] == '\n';
        unsigned line = 0;
        int used = 0;
        if (sscanf(err, CHECK_NAME ":%u: %n", &line, &used) != 1 || used == 0 || line == 0 || line > lines + 1 ||
            err[used] == '\0')
            return check_fail(why, cap, "bad error message '%s' (%zu lines)", err, lines);
        return 0;
    }
    if (r != 0)
        return check_fail(why, cap, "parse returned %d", r);
    if (a->nclasses == 0 || a->nclasses > AL_CONFIG_MAX_CLASSES)
        return check_fail(why, cap, "accepted with %u classes", a->nclasses);
    for (uint32_t i = 0; i < a->nclasses; i++)
        if (a->classes[i] == 0 || (i && a->classes[i] <= a->classes[i - 1]))
            return check_fail(why, cap, "accepted class %u = %" PRIu64 " out of order", i, a->classes[i]);
    /* The runs the parser filled beside them are the same classes. */
    uint32_t k = 0;
    for (uint32_t i = 0; i < a->nruns; i++)
        for (uint32_t j = 0; j < a->runs[i].count; j++, k++)
            if (k >= a->nclasses || a->classes[k] != a->runs[i].first + j * a->runs[i].step)
                return check_fail(why, cap, "run %u, class %u: not class %u", i, j, k);
    if (k != a->nclasses || a->runs_only)
        return check_fail(why, cap, "runs of %u classes for %u", k, a->nclasses);
    if (a->classes[0] >= a->large_threshold || a->classes[a->nclasses - 1] + 1 < a->large_threshold)
        return check_fail(why, cap, "accepted threshold %" PRIu64 " outside the classes", a->large_threshold);
    if (a->page_size < 512 || (a->page_size & (a->page_size - 1)))
        return check_fail(why, cap, "accepted page size %" PRIu64, a->page_size);
    if (a->allocator[0] != '/')
        return check_fail(why, cap, "accepted allocator '%s'", a->allocator);

    long n = _al_config_format(a, check_text_a, sizeof check_text_a);
    if (n <= 0 || (size_t)n >= sizeof check_text_a || strlen(check_text_a) != (size_t)n)
        return check_fail(why, cap, "format returned %ld", n);
    r = _al_config_parse(check_text_a, (size_t)n, "formatted", b, err, sizeof err);
    if (r < 0)
        return check_fail(why, cap, "the formatted text does not parse: %s", err);
    if (!check_same(a, b))
        return check_fail(why, cap, "format -> parse changed the config");
    long m = _al_config_format(b, check_text_b, sizeof check_text_b);
    if (m != n || memcmp(check_text_a, check_text_b, (size_t)n) != 0)
        return check_fail(why, cap, "formatting twice gives different text");
    /* Too small a buffer is -ENOSPC, never an overrun. */
    char small[64];
    if (_al_config_format(a, small, sizeof small) >= 0)
        return check_fail(why, cap, "format into 64 bytes did not fail");
    return check_table(a, data, size, why, cap);
}

#endif
