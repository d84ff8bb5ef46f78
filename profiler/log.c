/* The one place the profiler talks to the user while the program runs: a line on stderr,
 * formatted on the stack and written with write(2) (no stdio, no allocation), capped so a
 * misbehaving run cannot flood the program's stderr. */
#include <stdarg.h>
#include <stdio.h>
#include <unistd.h>

#include "profiler.h"

#define MAX_MESSAGES 32

static _Atomic int messages;

void _al_log(const char *fmt, ...)
{
    int n = atomic_fetch_add_explicit(&messages, 1, memory_order_relaxed);
    if (n >= MAX_MESSAGES)
        return;
    char line[1024];
    int off = snprintf(line, sizeof line, "alloclens[%d]: ", (int)getpid());
    va_list ap;
    va_start(ap, fmt);
    int len = vsnprintf(line + off, sizeof line - (size_t)off - 1, fmt, ap);
    va_end(ap);
    if (len < 0)
        return;
    size_t total = (size_t)off + (size_t)len;
    if (total > sizeof line - 2)
        total = sizeof line - 2;
    line[total++] = '\n';
    if (n == MAX_MESSAGES - 1) {
        static const char more[] = "alloclens: further messages suppressed\n";
        (void)!write(STDERR_FILENO, line, total);
        (void)!write(STDERR_FILENO, more, sizeof more - 1);
        return;
    }
    (void)!write(STDERR_FILENO, line, total);
}
