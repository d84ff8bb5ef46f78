/* A growable text buffer for the reports, backed by mmap so writing a report never calls the
 * allocator being measured (threads still running may be using it). */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "profiler.h"

static bool grow(struct al_buf *b, size_t need)
{
    if (b->failed)
        return false;
    if (b->len + need + 1 <= b->cap)
        return true;
    size_t cap = b->cap ? b->cap : 1 << 17; /* a JSON report with a long size-class list fits */
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

void _al_buf_u64(struct al_buf *b, uint64_t v)
{
    char tmp[20], *e = tmp + sizeof tmp, *d = e;
    do
        *--d = (char)('0' + v % 10);
    while (v /= 10);
    _al_buf_putn(b, d, (size_t)(e - d));
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

void _al_buf_json_str(struct al_buf *b, const char *s)
{
    _al_buf_putn(b, "\"", 1);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
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
