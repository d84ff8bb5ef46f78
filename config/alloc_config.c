/* The allocator description's text format: strict parser, writer, file identity.
 *
 *   alloclens-config 1
 *   # comments and blank lines anywhere after the version line
 *   allocator /usr/lib/x86_64-linux-gnu/libjemalloc.so.2
 *   identity 2049 1835122 751832 1667923200000000000     (dev ino size mtime_ns; mtime_ns may be < 0)
 *   style bibop                                          (or: sequential)
 *   page_size 4096
 *   large_threshold 14337
 *   size_classes 8 16 32 48 ...                          (ascending; may repeat the key to continue)
 *   size_classes 24..131048/16                           (a run: 24, 40, ..., 131048)
 *   confidence any free text
 *
 * Every key but confidence must appear (size_classes at least once); numbers are decimal.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "alloc_config.h"

#define MAX_FILE (4u << 20)

struct parser {
    const char *name;
    unsigned line;
    char *err;
    size_t errcap;
};

static int fail(struct parser *p, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static int fail(struct parser *p, const char *fmt, ...)
{
    if (p->err && p->errcap) {
        int n = snprintf(p->err, p->errcap, "%s:%u: ", p->name, p->line);
        if (n < 0 || (size_t)n >= p->errcap)
            n = 0;
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(p->err + n, p->errcap - (size_t)n, fmt, ap);
        va_end(ap);
    }
    return -EINVAL;
}

static bool is_space(char c)
{
    return c == ' ' || c == '\t';
}

static bool is_digit(char c)
{
    return (unsigned char)(c - '0') < 10;
}

/* The digits of one decimal number without sign or suffix, at most 2^63 - 1. */
static int scan_u64(struct parser *p, const char **s, const char *end, uint64_t *ret, const char *what)
{
    const char *c = *s;
    if (c >= end || !is_digit(*c))
        return fail(p, "%s: expected a decimal number", what);
    /* Up to 18 digits cannot pass 2^63 - 1: only digits after those are checked (a check on
     * every digit costs a sixth of the time a long class list takes to parse). */
    uint64_t v = 0;
    const char *unchecked = end - c > 18 ? c + 18 : end;
    while (c < unchecked && is_digit(*c))
        v = v * 10 + (unsigned)(*c++ - '0');
    while (c < end && is_digit(*c)) {
        unsigned d = (unsigned)(*c - '0');
        if (v > (UINT64_MAX / 2 - d) / 10)
            return fail(p, "%s: number too large", what);
        v = v * 10 + d;
        c++;
    }
    *s = c;
    *ret = v;
    return 0;
}

/* The end of a value's field: the blanks after it skipped. */
static int field_end(struct parser *p, const char **s, const char *end, const char *what)
{
    const char *c = *s;
    if (c < end && !is_space(*c))
        return fail(p, "%s: '%c' after a number", what, *c);
    while (c < end && is_space(*c))
        c++;
    *s = c;
    return 0;
}

/* One decimal number as a field of its own. */
static int parse_u64(struct parser *p, const char **s, const char *end, uint64_t *ret, const char *what)
{
    if (scan_u64(p, s, end, ret, what) < 0)
        return -EINVAL;
    return field_end(p, s, end, what);
}

/* A field of size_classes: one class N, or a run FIRST..LAST/STEP (FIRST, FIRST + STEP, ...,
 * LAST), into *FIRST, *LAST and *STEP (1 for a single class). */
static int parse_classes(struct parser *p, const char **s, const char *end, uint64_t *first, uint64_t *last,
                         uint64_t *step)
{
    static const char what[] = "size_classes";
    if (scan_u64(p, s, end, first, what) < 0)
        return -EINVAL;
    *last = *first;
    *step = 1;
    if (end - *s >= 2 && (*s)[0] == '.' && (*s)[1] == '.') {
        *s += 2;
        if (scan_u64(p, s, end, last, what) < 0)
            return -EINVAL;
        if (*s == end || **s != '/')
            return fail(p, "size_classes: %llu..%llu: expected /STEP after a run", (unsigned long long)*first,
                        (unsigned long long)*last);
        (*s)++;
        if (scan_u64(p, s, end, step, what) < 0)
            return -EINVAL;
        if (*step == 0 || *last <= *first || (*last - *first) % *step)
            return fail(p, "size_classes: %llu..%llu/%llu: not a run (LAST above FIRST, STEP dividing LAST - FIRST)",
                        (unsigned long long)*first, (unsigned long long)*last, (unsigned long long)*step);
    }
    return field_end(p, s, end, what);
}

static int expect_end(struct parser *p, const char *s, const char *end, const char *key)
{
    if (s != end)
        return fail(p, "%s: unexpected text after the value", key);
    return 0;
}

enum { K_ALLOCATOR, K_IDENTITY, K_STYLE, K_PAGE, K_THRESHOLD, K_CLASSES, K_CONFIDENCE, K_N };
static const char *const keys[K_N] = { "allocator", "identity", "style", "page_size",
                                       "large_threshold", "size_classes", "confidence" };

/* COUNT classes from FIRST, STEP apart, after those of C's runs: the last run goes on where
 * they continue it evenly (a file of single classes makes runs too), else a new one starts. */
static void add_run(struct al_alloc_config *c, uint64_t first, uint64_t step, uint32_t count)
{
    struct al_class_run *r = c->nruns ? &c->runs[c->nruns - 1] : NULL;
    if (count == 1 && r && (r->count == 1 || first - _al_config_last_class(c) == r->step)) {
        r->step = first - _al_config_last_class(c);
        r->count++;
        return;
    }
    c->runs[c->nruns++] = (struct al_class_run){ first, count > 1 ? step : 0, count };
}

static int parse_line(struct parser *p, const char *s, const char *end, struct al_alloc_config *c,
                      bool seen[K_N])
{
    const char *k = s;
    while (s < end && !is_space(*s))
        s++;
    size_t klen = (size_t)(s - k);
    while (s < end && is_space(*s))
        s++;
    int key = -1;
    for (int i = 0; i < K_N; i++)
        if (strlen(keys[i]) == klen && memcmp(keys[i], k, klen) == 0)
            key = i;
    if (key < 0)
        return fail(p, "unknown key '%.*s'", (int)(klen > 40 ? 40 : klen), k);
    if (seen[key] && key != K_CLASSES)
        return fail(p, "%s given twice", keys[key]);
    if (s == end && key != K_CONFIDENCE)
        return fail(p, "%s: missing value", keys[key]);
    seen[key] = true;
    switch (key) {
    case K_ALLOCATOR: {
        size_t n = (size_t)(end - s);
        if (n >= sizeof c->allocator)
            return fail(p, "allocator: path too long");
        if (s[0] != '/')
            return fail(p, "allocator: not an absolute path");
        memcpy(c->allocator, s, n);
        c->allocator[n] = '\0';
        return 0;
    }
    case K_IDENTITY: {
        uint64_t v[4];
        /* mtime_ns is signed (a file dated before 1970): the writer prints it with %lld. */
        bool neg = false;
        for (int i = 0; i < 4; i++) {
            if (i == 3 && s + 1 < end && s[0] == '-' && s[1] >= '0' && s[1] <= '9') {
                neg = true;
                s++;
            }
            if (parse_u64(p, &s, end, &v[i], "identity") < 0)
                return -EINVAL;
        }
        c->identity = (struct al_file_identity){ v[0], v[1], v[2], neg ? -(int64_t)v[3] : (int64_t)v[3] };
        return expect_end(p, s, end, "identity");
    }
    case K_STYLE: {
        size_t n = (size_t)(end - s);
        if (n == 5 && memcmp(s, "bibop", 5) == 0)
            c->style = AL_STYLE_BIBOP;
        else if (n == 10 && memcmp(s, "sequential", 10) == 0)
            c->style = AL_STYLE_SEQUENTIAL;
        else
            return fail(p, "style: expected 'bibop' or 'sequential'");
        return 0;
    }
    case K_PAGE:
        if (parse_u64(p, &s, end, &c->page_size, "page_size") < 0)
            return -EINVAL;
        if (c->page_size < 512 || (c->page_size & (c->page_size - 1)))
            return fail(p, "page_size: not a power of two of at least 512");
        return expect_end(p, s, end, "page_size");
    case K_THRESHOLD:
        if (parse_u64(p, &s, end, &c->large_threshold, "large_threshold") < 0)
            return -EINVAL;
        if (c->large_threshold < 2 || c->large_threshold > (1ull << 40))
            return fail(p, "large_threshold: outside 2..2^40");
        return expect_end(p, s, end, "large_threshold");
    case K_CLASSES:
        while (s < end) {
            uint64_t v, last, step;
            if (parse_classes(p, &s, end, &v, &last, &step) < 0)
                return -EINVAL;
            if (v == 0)
                return fail(p, "size_classes: a class of 0 bytes");
            if (c->nclasses && v <= _al_config_last_class(c))
                return fail(p, "size_classes: %llu is not above the class before it", (unsigned long long)v);
            uint64_t count = (last - v) / step + 1;
            if (count > AL_CONFIG_MAX_CLASSES - c->nclasses)
                return fail(p, "size_classes: more than %d classes", AL_CONFIG_MAX_CLASSES);
            add_run(c, v, step, (uint32_t)count);
            c->nclasses += (uint32_t)count;
        }
        return 0;
    case K_CONFIDENCE: {
        size_t n = (size_t)(end - s);
        if (n >= sizeof c->confidence) {
            n = sizeof c->confidence - 1;
            while (n && is_space(s[n - 1])) /* as the line itself is trimmed, or it won't read back */
                n--;
        }
        memcpy(c->confidence, s, n);
        c->confidence[n] = '\0';
        return 0;
    }
    }
    return 0;
}

/* Parses into the runs alone (classes[] not written). */
static int parse(const char *text, size_t len, const char *name, struct al_alloc_config *out, char *err,
                 size_t errcap)
{
    struct parser p = { name ? name : "config", 0, err, errcap };
    struct al_alloc_config *c = out;
    memset(c, 0, offsetof(struct al_alloc_config, classes));
    bool seen[K_N] = { false };
    bool version = false;
    const char *s = text, *end = text + len;
    int r = 0;
    while (s < end) {
        p.line++;
        const char *eol = memchr(s, '\n', (size_t)(end - s));
        const char *le = eol ? eol : end;
        const char *next = eol ? eol + 1 : end;
        if (le > s && le[-1] == '\r')
            le--;
        for (const char *q = s; q < le; q++) {
            if ((unsigned char)*q < 0x20 && *q != '\t') {
                r = fail(&p, "control character in the line");
                goto out;
            }
        }
        const char *a = s;
        while (a < le && is_space(*a))
            a++;
        const char *b = le;
        while (b > a && is_space(b[-1]))
            b--;
        if (!version) {
            static const char v[] = "alloclens-config";
            if ((size_t)(b - a) < sizeof v || memcmp(a, v, sizeof v - 1) != 0 || !is_space(a[sizeof v - 1])) {
                r = fail(&p, "expected the version line 'alloclens-config %d'", AL_CONFIG_VERSION);
                goto out;
            }
            const char *n = a + sizeof v;
            while (n < b && is_space(*n))
                n++;
            uint64_t ver;
            if (parse_u64(&p, &n, b, &ver, "version") < 0) {
                r = -EINVAL;
                goto out;
            }
            if (ver != AL_CONFIG_VERSION || n != b) {
                r = fail(&p, "unsupported version (this alloclens reads version %d)", AL_CONFIG_VERSION);
                goto out;
            }
            version = true;
        } else if (a < b && *a != '#') {
            if ((r = parse_line(&p, a, b, c, seen)) < 0)
                goto out;
        }
        s = next;
    }
    p.line++;
    if (!version) {
        r = fail(&p, "empty file: expected the version line 'alloclens-config %d'", AL_CONFIG_VERSION);
        goto out;
    }
    for (int i = 0; i < K_N; i++) {
        if (!seen[i] && i != K_CONFIDENCE) {
            r = fail(&p, "missing key '%s'", keys[i]);
            goto out;
        }
    }
    if (_al_config_last_class(c) + 1 < c->large_threshold) {
        r = fail(&p, "large_threshold %llu: requests from %llu up are in no size class",
                 (unsigned long long)c->large_threshold, (unsigned long long)_al_config_last_class(c) + 1);
        goto out;
    }
    if (c->runs[0].first >= c->large_threshold) {
        r = fail(&p, "large_threshold %llu: at or below the smallest size class",
                 (unsigned long long)c->large_threshold);
        goto out;
    }
    c->runs_only = true;
out:
    if (r < 0)
        memset(out, 0, offsetof(struct al_alloc_config, classes));
    return r;
}

int _al_config_parse(const char *text, size_t len, const char *name, struct al_alloc_config *out,
                     char *err, size_t errcap)
{
    int r = parse(text, len, name, out, err, errcap);
    if (r == 0)
        _al_config_expand(out);
    return r;
}

void _al_config_expand(struct al_alloc_config *c)
{
    if (!c->runs_only)
        return;
    uint32_t n = 0;
    for (uint32_t i = 0; i < c->nruns; i++)
        for (uint32_t k = 0; k < c->runs[i].count; k++)
            c->classes[n++] = c->runs[i].first + k * c->runs[i].step;
    c->runs_only = false;
}

int _al_config_load_runs(const char *path, struct al_alloc_config *out, char *err, size_t errcap)
{
    /* Non-blocking, so a FIFO given by mistake is refused by the check below, not waited on. */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) {
        int e = errno;
        snprintf(err, errcap, "%s: cannot read: %s", path, strerror(e));
        return -e;
    }
    struct stat st;
    if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode) || st.st_size > MAX_FILE) {
        snprintf(err, errcap, "%s: cannot read: not a regular file of at most %u bytes", path, MAX_FILE);
        close(fd);
        return -EINVAL;
    }
    char *text = mmap(NULL, (size_t)st.st_size + 1, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (text == MAP_FAILED) {
        close(fd);
        snprintf(err, errcap, "%s: cannot read: out of memory", path);
        return -ENOMEM;
    }
    size_t got = 0;
    while (got < (size_t)st.st_size) {
        ssize_t n = read(fd, text + got, (size_t)st.st_size - got);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            break;
        got += (size_t)n;
    }
    close(fd);
    int r = parse(text, got, path, out, err, errcap);
    munmap(text, (size_t)st.st_size + 1);
    return r;
}

int _al_config_load(const char *path, struct al_alloc_config *out, char *err, size_t errcap)
{
    int r = _al_config_load_runs(path, out, err, errcap);
    if (r == 0)
        _al_config_expand(out);
    return r;
}

const char *_al_config_style_name(enum al_style s)
{
    return s == AL_STYLE_SEQUENTIAL ? "sequential" : "bibop";
}

long _al_config_format(const struct al_alloc_config *c, char *buf, size_t cap)
{
    size_t off = 0;
#define PUT(...)                                                                  \
    do {                                                                          \
        int n_ = snprintf(buf + off, off < cap ? cap - off : 0, __VA_ARGS__);     \
        if (n_ < 0 || off + (size_t)n_ >= cap)                                    \
            return -ENOSPC;                                                       \
        off += (size_t)n_;                                                        \
    } while (0)
    PUT("alloclens-config %d\n", AL_CONFIG_VERSION);
    PUT("# What alloclens knows of this allocator, found by 'alloclens prerun'. Edit with care:\n"
        "# one key per line; see docs/config-format.md.\n");
    PUT("allocator %s\n", c->allocator);
    PUT("identity %llu %llu %llu %lld\n", (unsigned long long)c->identity.dev,
        (unsigned long long)c->identity.ino, (unsigned long long)c->identity.size,
        (long long)c->identity.mtime_ns);
    PUT("style %s\n", _al_config_style_name(c->style));
    PUT("page_size %llu\n", (unsigned long long)c->page_size);
    PUT("large_threshold %llu\n", (unsigned long long)c->large_threshold);
    /* Sixteen fields a line; a run of RUN_MIN classes or more evenly spaced (glibc's 8190,
     * 16 bytes apart) is one field, FIRST..LAST/STEP: every process under alloclens loads
     * the file, and glibc's class by class is 57 KB, some 15 times as long to load. */
    enum { RUN_MIN = 32 };
    for (uint32_t i = 0, fields = 0; i < c->nclasses; fields++) {
        if (fields % 16 == 0)
            PUT("%ssize_classes", fields ? "\n" : "");
        uint32_t j = i + 1;
        if (j < c->nclasses) {
            uint64_t step = c->classes[j] - c->classes[i];
            while (j + 1 < c->nclasses && c->classes[j + 1] - c->classes[j] == step)
                j++;
        }
        if (j - i + 1 >= RUN_MIN) {
            PUT(" %llu..%llu/%llu", (unsigned long long)c->classes[i], (unsigned long long)c->classes[j],
                (unsigned long long)(c->classes[i + 1] - c->classes[i]));
            i = j + 1;
        } else {
            PUT(" %llu", (unsigned long long)c->classes[i]);
            i++;
        }
    }
    if (c->nclasses)
        PUT("\n");
    if (c->confidence[0])
        PUT("confidence %s\n", c->confidence);
#undef PUT
    return (long)off;
}

int _al_config_identity(const char *path, struct al_file_identity *ret)
{
    struct stat st;
    if (stat(path, &st) < 0)
        return -errno;
    ret->dev = st.st_dev;
    ret->ino = st.st_ino;
    ret->size = (uint64_t)st.st_size;
    ret->mtime_ns = (int64_t)st.st_mtim.tv_sec * 1000000000 + st.st_mtim.tv_nsec;
    return 0;
}

bool _al_config_identity_equal(const struct al_file_identity *a, const struct al_file_identity *b)
{
    return a->dev == b->dev && a->ino == b->ino && a->size == b->size && a->mtime_ns == b->mtime_ns;
}
