/* host_raise_in_malloc: a malloc in front of the C library's that raises a signal from inside
 * its Nth call, so that the signal lands inside an allocator call every time.
 *
 * Preloaded (after liballoclens.so, as an allocator is); HOST_RAISE_AT=N picks the call,
 * HOST_RAISE_SIGNAL the signal (default SIGTERM). Everything else is the C library's. */
#include <signal.h>
#include <stdlib.h>

extern void *__libc_malloc(size_t n);

static unsigned long calls, at;
static int sig = SIGTERM;

__attribute__((constructor)) static void setup(void)
{
    const char *a = getenv("HOST_RAISE_AT"), *s = getenv("HOST_RAISE_SIGNAL");
    if (s)
        sig = atoi(s);
    if (a)
        at = strtoul(a, NULL, 10);
}

void *malloc(size_t n)
{
    if (at && ++calls == at)
        raise(sig);
    return __libc_malloc(n);
}
