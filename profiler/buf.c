/* A growable text buffer for the reports, backed by mmap so writing a report never calls the
 * allocator being measured (threads still running may be using it). */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "profiler.h"

/* A streaming buffer's text so far goes to its descriptor (after a failed write, nowhere). */
static void flush(struct al_buf *b)
{
    if (!b->werr && b->len)
        b->werr = _al_write_all(b->fd, b->data, b->len);
    b->len = 0;
}

static bool grow(struct al_buf *b, size_t need)
{
    if (b->failed)
        return false;
    if (b->len + need + 1 <= b->cap)
        return true;
    if (b->streaming && !b->held && b->len) {
        flush(b);
        if (need + 1 <= b->cap)
            return true;
    }
    /* A streamed report goes out a chunk at a time (more while held); other text, symbols.c's
     * list of addresses, is made whole, a long one grown by doubling. */
    size_t cap = b->cap ? b->cap : b->streaming ? AL_BUF_CHUNK : 1 << 17;
    while (cap < b->len + need + 1)
        cap *= 2;
    char *n = _al_mem_map(cap);
    if (!n) {
        b->failed = true;
        return false;
    }
    if (b->data) {
        memcpy(n, b->data, b->len);
        _al_mem_unmap(b->data, b->cap);
    }
    b->data = n;
    b->cap = cap;
    return true;
}

void _al_buf_putn(struct al_buf *b, const char *s, size_t n)
{
    if (!grow(b, n))
        return;
    memcpy(b->data + b->len, s, n);
    b->len += n;
    b->data[b->len] = '\0';
}

/* V in decimal at D (room for 20 digits); returns the end. Written in place from its last
 * digit back, two digits a division: every report lists the allocator's size classes, 8190
 * of them for glibc, and formatting them is most of a short program's report. */
static char *put_u64(char *d, uint64_t v)
{
    static const char pairs[] = "00010203040506070809101112131415161718192021222324252627282930313233343536373839"
                                "40414243444546474849505152535455565758596061626364656667686970717273747576777879"
                                "8081828384858687888990919293949596979899";
    unsigned n = 1; /* digits: one more for each power of ten up to V */
    for (uint64_t p = 10; n < 20 && v >= p; p *= 10)
        n++;
    char *e = d + n;
    while (v >= 100) {
        e -= 2;
        memcpy(e, pairs + 2 * (v % 100), 2);
        v /= 100;
    }
    if (v >= 10)
        memcpy(e - 2, pairs + 2 * v, 2);
    else
        e[-1] = (char)('0' + v);
    return d + n;
}

void _al_buf_u64_run(struct al_buf *b, uint64_t first, uint64_t step, uint32_t count)
{
    /* Room for a batch at once, not a check and a copy per number; batches a streaming
     * buffer's chunk holds. */
    enum { BATCH = AL_BUF_CHUNK / 2 / 22 };
    for (uint32_t i = 0; i < count;) {
        uint32_t k = count - i < BATCH ? count - i : BATCH;
        if (!grow(b, (size_t)k * 22))
            return;
        char *d = b->data + b->len;
        for (uint32_t end = i + k; i < end; i++) {
            if (i) {
                *d++ = ',';
                *d++ = ' ';
            }
            d = put_u64(d, first + i * step);
        }
        b->len = (size_t)(d - b->data);
        b->data[b->len] = '\0';
    }
}

void _al_buf_puts(struct al_buf *b, const char *s)
{
    _al_buf_putn(b, s, strlen(s));
}

void _al_buf_printf(struct al_buf *b, const char *fmt, ...)
{
    char tmp[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n < 0)
        return;
    if ((size_t)n < sizeof tmp) {
        _al_buf_putn(b, tmp, (size_t)n);
        return;
    }
    if (!grow(b, (size_t)n))
        return;
    va_start(ap, fmt);
    vsnprintf(b->data + b->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->len += (size_t)n;
}

/* A JSON string is UTF-8: bytes of a path or argument that are not (a Latin-1 file name, say)
 * become U+FFFD, as JSON readers that replace them show them; before, such a report did not
 * parse. */
void _al_buf_json_str(struct al_buf *b, const char *s)
{
    _al_buf_putn(b, "\"", 1);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p >= 0x80) {
            size_t n = _al_utf8_len(p);
            if (n) {
                _al_buf_putn(b, (const char *)p, n);
                p += n - 1;
            } else {
                _al_buf_putn(b, "\\ufffd", 6);
            }
            continue;
        }
        switch (*p) {
        case '"': _al_buf_putn(b, "\\\"", 2); break;
        case '\\': _al_buf_putn(b, "\\\\", 2); break;
        case '\n': _al_buf_putn(b, "\\n", 2); break;
        case '\r': _al_buf_putn(b, "\\r", 2); break;
        case '\t': _al_buf_putn(b, "\\t", 2); break;
        default:
            if (*p < 0x20 || *p == 0x7f)
                _al_buf_printf(b, "\\u%04x", *p);
            else
                _al_buf_putn(b, (const char *)p, 1);
        }
    }
    _al_buf_putn(b, "\"", 1);
}

static void put_buf(void *b, const char *p, size_t n)
{
    _al_buf_putn(b, p, n);
}

void _al_buf_shell_word(struct al_buf *b, const char *s, size_t n)
{
    _al_shell_word(s, n, put_buf, b);
}

void _al_buf_free(struct al_buf *b)
{
    if (b->data)
        _al_mem_unmap(b->data, b->cap);
    b->data = NULL;
    b->len = b->cap = 0;
}

int _al_buf_write_fd(const struct al_buf *b, int fd)
{
    return b->failed ? -ENOMEM : _al_write_all(fd, b->data, b->len);
}

void _al_buf_stream(struct al_buf *b, int fd)
{
    b->streaming = true;
    b->fd = fd;
}

void _al_buf_hold(struct al_buf *b, bool on)
{
    if (on && b->streaming)
        flush(b);
    b->held = on;
}

int _al_buf_finish(struct al_buf *b)
{
    flush(b);
    return b->werr ? b->werr : b->failed ? -ENOMEM : 0;
}
