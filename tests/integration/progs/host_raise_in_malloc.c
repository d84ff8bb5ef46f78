/* host_raise_in_malloc: a malloc in front of the C library's that raises a signal from inside
 * its Nth call, so that the signal lands inside an allocator call every time.
 *
 * Preloaded (after liballoclens.so, as an allocator is); HOST_RAISE_AT=N picks the call,
 * HOST_RAISE_SIGNAL the signal (default SIGTERM), HOST_RAISE_HOW how it comes: "raise" (the
 * default), "twice" (raised twice in a row, as timeout(1) sends its signal to the process and
 * then to its group), "kill" (sent by another process, a child made at start-up that waits
 * for the call, while the call waits for it to exit). Everything else is the C library's. */
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

extern void *__libc_malloc(size_t n);

static unsigned long calls, at;
static int sig = SIGTERM;
static const char *how = "raise";
static int go = -1;
static pid_t sender;

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
            raise(sig);
            if (strcmp(how, "twice") == 0)
                raise(sig);
        }
    }
    return __libc_malloc(n);
}
