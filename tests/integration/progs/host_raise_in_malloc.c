/* host_raise_in_malloc: a malloc in front of the C library's that raises a signal from inside
 * its Nth call, so that the signal lands inside an allocator call every time.
 *
 * Preloaded (after liballoclens.so, as an allocator is); HOST_RAISE_AT=N picks the call,
 * HOST_RAISE_SIGNAL the signal (default SIGTERM), HOST_RAISE_HOW how it comes: "raise" (the
 * default), "twice" (raised twice in a row, as timeout(1) sends its signal to the process and
 * then to its group), "kill" (sent by another process, a child made at start-up that waits
 * for the call, while the call waits for it to exit), "locked" (raised as "raise" does, with
 * the call holding a lock of this allocator's, as a real one may be: a handler that ends the
 * process with exit() must not bring the process back into the allocator, where it would wait
 * for that lock for ever; any call that comes back says so on stderr and ends the process
 * with status 99 instead). Everything else is the C library's. */
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

extern void *__libc_malloc(size_t n);
extern void *__libc_calloc(size_t k, size_t n);
extern void *__libc_realloc(void *p, size_t n);
extern void __libc_free(void *p);

static unsigned long calls, at;
static int sig = SIGTERM;
static const char *how = "raise";
static int go = -1;
static pid_t sender;
static volatile int locked; /* "locked": the raising call holds the allocator's lock */

static void come_back(void)
{
    if (locked) {
        static const char line[] = "host_raise_in_malloc: the allocator was called again while its lock was held\n";
        (void)!write(2, line, sizeof line - 1);
        _exit(99);
    }
}

__attribute__((constructor)) static void setup(void)
{
    const char *a = getenv("HOST_RAISE_AT"), *s = getenv("HOST_RAISE_SIGNAL"), *h = getenv("HOST_RAISE_HOW");
    if (s)
        sig = atoi(s);
    if (a)
        at = strtoul(a, NULL, 10);
    if (h)
        how = h;
    int p[2];
    if (at && strcmp(how, "kill") == 0 && pipe(p) == 0) {
        pid_t parent = getpid();
        sender = fork();
        if (sender == 0) {
            char c;
            close(p[1]);
            if (read(p[0], &c, 1) == 1)
                kill(parent, sig);
            _exit(0);
        }
        close(p[0]);
        go = p[1];
    }
}

void *malloc(size_t n)
{
    if (at && ++calls == at) {
        if (go >= 0) {
            (void)!write(go, "k", 1);
            waitpid(sender, NULL, 0);
        } else {
            locked = strcmp(how, "locked") == 0;
            raise(sig);
            if (strcmp(how, "twice") == 0)
                raise(sig);
            locked = 0;
        }
    }
    come_back();
    return __libc_malloc(n);
}

void *calloc(size_t k, size_t n)
{
    come_back();
    return __libc_calloc(k, n);
}

void *realloc(void *p, size_t n)
{
    come_back();
    return __libc_realloc(p, n);
}

void free(void *p)
{
    come_back();
    __libc_free(p);
}
