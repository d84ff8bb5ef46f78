/* The /proc files the profiler reads, with no stdio and no allocation, so that the rare paths
 * inside an allocator call may read them: the mappings (/proc/self/maps, a block at a time into
 * the caller's buffer), small files in one read, and a whole file appended to a report buffer. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "profiler.h"

uint64_t _al_proc_num(const char **s, unsigned base)
{
    uint64_t v = 0;
    for (;; (*s)++) {
        char c = **s;
        unsigned d = c >= '0' && c <= '9' ? (unsigned)(c - '0') : c >= 'a' && c <= 'f' ? (unsigned)(c - 'a' + 10) : 16;
        if (d >= base)
            return v;
        v = v * base + d;
    }
}

static const char *field(const char *s)
{
    while (*s && *s != ' ')
        s++;
    while (*s == ' ')
        s++;
    return s;
}

/* "lo-hi perms offset dev inode   path" */
static void parse(char *line, struct al_map *m)
{
    const char *s = line;
    m->lo = _al_proc_num(&s, 16);
    s++;
    m->hi = _al_proc_num(&s, 16);
    s = field(s);
    memcpy(m->perms, s, 4);
    m->perms[4] = '\0';
    s = field(s);
    m->offset = _al_proc_num(&s, 16);
    s = field(field(field(s)));
    m->path = s;
}

bool _al_maps_each(char *buf, size_t cap, bool (*fn)(const struct al_map *m, void *arg), void *arg)
{
    int fd = open("/proc/self/maps", O_RDONLY | O_CLOEXEC);
    bool stopped = false;
    size_t have = 0;
    while (fd >= 0 && !stopped) {
        ssize_t n = read(fd, buf + have, cap - 1 - have);
        if (n <= 0)
            break;
        have += (size_t)n;
        char *line = buf, *nl;
        while (!stopped && (nl = memchr(line, '\n', have - (size_t)(line - buf)))) {
            struct al_map m;
            *nl = '\0';
            parse(line, &m);
            stopped = fn(&m, arg);
            line = nl + 1;
        }
        have -= (size_t)(line - buf);
        memmove(buf, line, have);
    }
    if (fd >= 0)
        close(fd);
    return stopped;
}

ssize_t _al_proc_read(const char *path, char *buf, size_t cap)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    ssize_t n = read(fd, buf, cap - 1);
    close(fd);
    if (n <= 0)
        return -1;
    buf[n] = '\0';
    return n;
}

/* The file is read into memory of its own, not the stack: a sampled allocation reads it, on a
 * stack that may be a coroutine's few KiB. One reader at a time (an owned lock), the others
 * waiting for the few microseconds a read takes; a signal handler that interrupted this
 * thread's read gets no values rather than wait for it. */
static _Atomic uintptr_t status_reader;

void _al_proc_status_fields(const char *const fields[], long values[], unsigned n)
{
    static char status[4096];
    for (unsigned i = 0; i < n; i++)
        values[i] = -1;
    if (!_al_owned_lock(&status_reader))
        return;
    bool ok = _al_proc_read("/proc/self/status", status, sizeof status) >= 0;
    for (unsigned i = 0; ok && i < n; i++) {
        char key[64];
        size_t len = strlen(fields[i]);
        if (len + 3 > sizeof key)
            continue;
        key[0] = '\n';
        memcpy(key + 1, fields[i], len);
        memcpy(key + 1 + len, ":", 2);
        const char *f = strstr(status, key);
        if (!f)
            continue;
        f += len + 2;
        f += strspn(f, " \t");
        values[i] = (long)_al_proc_num(&f, 10);
    }
    _al_owned_unlock(&status_reader, true);
}

/* A fork child has only the thread that forked: a read another thread had under way is no
 * one's there. */
void _al_proc_after_fork_child(void)
{
    atomic_store(&status_reader, 0);
}

long _al_proc_status(const char *field)
{
    long v;
    _al_proc_status_fields(&field, &v, 1);
    return v;
}

int64_t _al_proc_rss(void)
{
    char buf[128];
    if (_al_proc_read("/proc/self/statm", buf, sizeof buf) < 0)
        return -1;
    const char *c = strchr(buf, ' '); /* "size resident shared ..." in pages */
    if (!c)
        return -1;
    c++;
    return (int64_t)_al_proc_num(&c, 10) * 4096;
}

int _al_proc_pagemap_open(void)
{
    return open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);
}

void _al_proc_pagemap_close(int fd)
{
    if (fd >= 0)
        close(fd);
}

bool _al_proc_append(const char *path, struct al_buf *b)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return false;
    char chunk[4096];
    ssize_t r;
    while ((r = read(fd, chunk, sizeof chunk)) > 0 || (r < 0 && errno == EINTR))
        if (r > 0)
            _al_buf_putn(b, chunk, (size_t)r);
    close(fd);
    return r == 0;
}

struct containing {
    uint64_t a;
    struct al_map_span *out;
};

static bool holds(const struct al_map *m, void *arg)
{
    struct containing *c = arg;
    if (c->a < m->lo || c->a >= m->hi)
        return false;
    c->out->lo = m->lo;
    c->out->hi = m->hi;
    if (c->out->path)
        snprintf(c->out->path, c->out->path_cap, "%s", m->path);
    return true;
}

bool _al_maps_find(uint64_t a, char *buf, size_t cap, struct al_map_span *out)
{
    struct containing c = { a, out };
    return _al_maps_each(buf, cap, holds, &c);
}
