/* host_threads: many threads, short-lived threads, cancelled threads and thread-exit
 * destructors that allocate, all under the profiler.
 *
 * usage: host_threads MODE
 *   many     3000 short-lived threads one after another, then 5 waves of 64 at once; each
 *            allocates and frees
 *   keydtor  threads whose pthread_key destructors allocate and free at thread exit (after the
 *            thread's own code has ended), over several destructor rounds
 *   cancel   16 threads allocating in a loop with a cancellation point are cancelled and
 *            joined; their cleanup handlers free what they hold
 *   cancel-pending  a thread with a cancel pending makes 64 allocations of 4 MiB (each sampled
 *            all but certainly, at the default rate) and only then reaches a cancellation
 *            point: a profiler whose allocation path reads a file or a pipe (libunwind checks
 *            addresses through one) must not be cancelled there, holding its locks. The same
 *            allocations are made and freed once before the cancel, so the allocator has the
 *            memory already: tcmalloc's own growth path walks the stack with libunwind too, and
 *            would be cancelled inside malloc without any profiler. Then another thread with a
 *            cancel pending from the start makes 300 small malloc/free pairs: none of its first
 *            calls may be where the cancel acts
 *   signal-at-start  1000 threads, one after another, each sent SIGUSR1 as soon as it is
 *            created: the handler (which allocates: one valloc) often runs on the new thread
 *            before its function, which waits for it and then makes 5 vallocs of its own; prints
 *            valloc=6000. A handler that ran while the profiler made the thread's state made a
 *            second state inside the first: the C library's list of thread-exit destructors
 *            got a loop, and the process aborted on a double free
 *   detached-trim  two detached threads with 64 MiB stacks; the second one's exit frees
 *            the first one's cached stack, whose TLS block sits between a freed 1 MiB block and
 *            the heap's top: glibc's free then trims the heap with brk, on that thread's exit
 *            path, where glibc blocks every signal. Prints "detached-trim: done". The state
 *            made there for that late free used to turn syscall dispatch on, and the brk
 *            became a SIGSYS the thread had blocked: the kernel ended the process
 *   keys     creates pthread keys until none is left and prints how many it got: a profiler
 *            that takes keys for itself takes them from the program
 *   smallstack  8 threads with the smallest stack allowed (PTHREAD_STACK_MIN) allocate, then
 *            one more such thread calls exit(0): what runs at exit runs on that stack
 *   smallstack-exec LEAF  a thread with the smallest stack execs LEAF (status 4): what runs
 *            before the exec runs on that stack
 *   coroutine  a ucontext coroutine on a 5 KiB stack, a guard page under it, makes 2000
 *            allocations and frees each (run with most of them sampled): a sample's stack
 *            walk, the first one through those frames too, runs on a stack of alloclens's own,
 *            and what else a sampled allocation takes fits in what the program leaves (it
 *            needed 6 KiB while the walk ran on the program's stack) */
#include <limits.h>
#include <malloc.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

static atomic_long total;

static void *short_lived(void *arg)
{
    long id = (long)arg;
    long sum = 0;
    for (int i = 0; i < 20; i++) {
        size_t size = 16 + (size_t)((id + i) % 37) * 64;
        char *p = malloc(size);
        if (!p)
            exit(90);
        p[0] = 1;
        sum += (long)size;
        free(p);
    }
    atomic_fetch_add(&total, sum);
    return NULL;
}

static int many(void)
{
    for (long i = 0; i < 3000; i++) {
        pthread_t t;
        if (pthread_create(&t, NULL, short_lived, (void *)i) != 0) {
            printf("pthread_create failed at thread %ld\n", i);
            return 1;
        }
        pthread_join(t, NULL);
    }
    for (int wave = 0; wave < 5; wave++) {
        pthread_t t[64];
        for (long i = 0; i < 64; i++)
            if (pthread_create(&t[i], NULL, short_lived, (void *)(i + wave)) != 0) {
                printf("pthread_create failed in wave %d\n", wave);
                return 1;
            }
        for (int i = 0; i < 64; i++)
            pthread_join(t[i], NULL);
    }
    printf("many: 3320 threads, total %ld\n", atomic_load(&total));
    return 0;
}

static pthread_key_t key;
static atomic_int dtor_calls;

static void key_dtor(void *v)
{
    /* Runs after the thread function has returned: allocate, free, and set the value again
     * once, so that a second destructor round runs. */
    char *s = v;
    char *copy = malloc(strlen(s) + 100);
    strcpy(copy, s);
    strcat(copy, " (seen by the destructor)");
    free(s);
    int n = atomic_fetch_add(&dtor_calls, 1);
    if (strstr(copy, "round 2") == NULL) {
        char *again = malloc(64);
        snprintf(again, 64, "round 2 of %d", n);
        pthread_setspecific(key, again);
    }
    free(copy);
}

static void *with_key(void *arg)
{
    char *v = malloc(64);
    snprintf(v, 64, "thread %ld", (long)arg);
    pthread_setspecific(key, v);
    short_lived(arg);
    return NULL;
}

static int keydtor(void)
{
    pthread_key_create(&key, key_dtor);
    pthread_t t[32];
    for (long i = 0; i < 32; i++)
        pthread_create(&t[i], NULL, with_key, (void *)i);
    for (int i = 0; i < 32; i++)
        pthread_join(t[i], NULL);
    printf("keydtor: 32 threads, %d destructor calls\n", atomic_load(&dtor_calls));
    return atomic_load(&dtor_calls) == 64 ? 0 : 1;
}

static atomic_int started;

static void cleanup(void *p)
{
    free(*(void **)p);
    *(void **)p = NULL;
}

static void *cancellable(void *arg)
{
    long id = (long)arg;
    void *held = NULL;
    pthread_cleanup_push(cleanup, &held);
    atomic_fetch_add(&started, 1);
    for (long i = 0;; i++) {
        void *p = malloc(32 + (size_t)((i + id) % 50) * 100);
        free(held);
        held = p;
        if (i % 64 == 0)
            usleep(10); /* a cancellation point */
    }
    pthread_cleanup_pop(1);
    return NULL;
}

static int cancel(void)
{
    pthread_t t[16];
    for (long i = 0; i < 16; i++)
        pthread_create(&t[i], NULL, cancellable, (void *)i);
    while (atomic_load(&started) < 16)
        usleep(100);
    usleep(10000);
    int cancelled = 0;
    for (int i = 0; i < 16; i++) {
        pthread_cancel(t[i]);
        void *r;
        pthread_join(t[i], &r);
        cancelled += r == PTHREAD_CANCELED;
    }
    printf("cancel: %d of 16 threads cancelled\n", cancelled);
    return cancelled == 16 ? 0 : 1;
}

static atomic_int pending_ready, pending_sent, pending_made;

static void *pending(void *arg)
{
    (void)arg;
    void *held[64] = { 0 };
    pthread_cleanup_push(cleanup, &held[0]);
    for (int i = 0; i < 64; i++)
        if (!(held[i] = malloc(4u << 20)))
            exit(91);
    for (int i = 0; i < 64; i++)
        free(held[i]);
    atomic_store(&pending_ready, 1);
    while (!atomic_load(&pending_sent))
        ; /* no cancellation point: the cancel stays pending */
    for (int i = 0; i < 64; i++) {
        held[i] = malloc(4u << 20);
        if (!held[i])
            exit(91);
        ((volatile char *)held[i])[i * 4096] = 1;
        atomic_store(&pending_made, i + 1);
    }
    for (int i = 1; i < 64; i++)
        free(held[i]);
    pthread_testcancel();
    pthread_cleanup_pop(1);
    return NULL;
}

/* A thread whose first allocator calls all come with the cancel pending: the one that first
 * counts events (the 100th) opens the thread's counters, moving their descriptors out of the
 * program's way with close(2), a cancellation point. */
static void *pending_first(void *arg)
{
    (void)arg;
    atomic_store(&pending_ready, 1);
    while (!atomic_load(&pending_sent))
        ;
    for (int i = 0; i < 300; i++) {
        void *p = malloc(64);
        if (!p)
            exit(91);
        free(p);
        atomic_store(&pending_made, i + 1);
    }
    pthread_testcancel();
    return NULL;
}

static int cancel_pending(void *(*fn)(void *), int made)
{
    pthread_t t;
    atomic_store(&pending_ready, 0);
    atomic_store(&pending_sent, 0);
    atomic_store(&pending_made, 0);
    pthread_create(&t, NULL, fn, NULL);
    while (!atomic_load(&pending_ready))
        usleep(100);
    pthread_cancel(t);
    atomic_store(&pending_sent, 1);
    void *r;
    pthread_join(t, &r);
    /* malloc and free are no cancellation points: all are made before the thread is cancelled. */
    printf("cancel-pending: %s after %d allocations\n",
           r == PTHREAD_CANCELED ? "cancelled" : "not cancelled", atomic_load(&pending_made));
    return r == PTHREAD_CANCELED && atomic_load(&pending_made) == made ? 0 : 1;
}

static _Thread_local volatile sig_atomic_t handled;
static atomic_long vallocs;

static void on_usr1_allocate(int sig)
{
    (void)sig;
    void *p = valloc(64);
    if (!p)
        exit(92);
    ((volatile char *)p)[0] = 1;
    free(p);
    atomic_fetch_add(&vallocs, 1);
    handled = 1;
}

static void *after_signal(void *arg)
{
    while (!handled)
        ; /* no allocator call of ours is in progress when the handler runs */
    for (int i = 0; i < 5; i++) {
        void *p = valloc(100);
        if (!p)
            exit(92);
        free(p);
        atomic_fetch_add(&vallocs, 1);
    }
    return arg;
}

static int signal_at_start(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_usr1_allocate;
    sa.sa_flags = SA_RESTART;
    sigaction(SIGUSR1, &sa, NULL);
    for (int i = 0; i < 1000; i++) {
        pthread_t t;
        if (pthread_create(&t, NULL, after_signal, NULL) != 0)
            return 1;
        pthread_kill(t, SIGUSR1);
        pthread_join(t, NULL);
    }
    printf("signal-at-start: 1000 threads\nvalloc=%ld\n", atomic_load(&vallocs));
    return 0;
}

static pthread_barrier_t trim_barrier;
static atomic_int first_done;

static void *trim_second(void *arg)
{
    free(malloc(100));
    pthread_barrier_wait(&trim_barrier);
    return arg;
}

static void *trim_first(void *arg)
{
    free(malloc(100));
    atomic_store(&first_done, 1);
    return arg;
}

static int detached_trim(void)
{
    mallopt(M_MMAP_THRESHOLD, 8 << 20);
    pthread_barrier_init(&trim_barrier, NULL, 2);
    pthread_attr_t big;
    pthread_attr_init(&big);
    pthread_attr_setdetachstate(&big, PTHREAD_CREATE_DETACHED);
    pthread_attr_setstacksize(&big, 64 << 20);
    pthread_t t;
    if (pthread_create(&t, &big, trim_second, NULL) != 0)
        return 1;
    char *p = malloc(1 << 20);
    if (!p)
        return 1;
    memset(p, 1, 1 << 20);
    if (pthread_create(&t, &big, trim_first, NULL) != 0) /* its TLS right after p */
        return 1;
    free(p);
    while (!atomic_load(&first_done))
        usleep(1000);
    usleep(20000); /* the first thread gone, its stack cached */
    pthread_barrier_wait(&trim_barrier); /* the second exits: frees the first's stack */
    usleep(50000);
    printf("detached-trim: done\n");
    return 0;
}

static int keys(void)
{
    static pthread_key_t k[4096];
    int n = 0;
    while (n < 4096 && pthread_key_create(&k[n], NULL) == 0)
        n++;
    printf("keys: the program could create %d pthread keys\n", n);
    for (int i = 0; i < n; i++)
        pthread_key_delete(k[i]);
    return 0;
}

static void *small_exit(void *arg)
{
    short_lived(arg);
    printf("smallstack: exiting from a thread with a %ld-byte stack\n", (long)PTHREAD_STACK_MIN);
    fflush(stdout);
    exit(0);
}

static int smallstack(void)
{
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    if (pthread_attr_setstacksize(&attr, PTHREAD_STACK_MIN) != 0) {
        printf("smallstack: cannot set the stack size\n");
        return 1;
    }
    pthread_t t[8];
    for (long i = 0; i < 8; i++)
        if (pthread_create(&t[i], &attr, short_lived, (void *)i) != 0) {
            printf("smallstack: pthread_create failed\n");
            return 1;
        }
    for (int i = 0; i < 8; i++)
        pthread_join(t[i], NULL);
    printf("smallstack: 8 threads allocated, total %ld\n", atomic_load(&total));
    fflush(stdout);
    pthread_t e;
    if (pthread_create(&e, &attr, small_exit, (void *)9) != 0)
        return 1;
    pthread_join(e, NULL);
    return 1; /* not reached: the thread exits the process */
}

static void *small_exec(void *arg)
{
    char *args[] = { arg, "4", "100", "leaf exec'd from a small-stack thread", NULL };
    execv(arg, args);
    perror("execv");
    exit(1);
}

static int smallstack_exec(char *leaf)
{
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    if (pthread_attr_setstacksize(&attr, PTHREAD_STACK_MIN) != 0)
        return 1;
    printf("smallstack-exec: a %ld-byte stack thread execs the leaf\n", (long)PTHREAD_STACK_MIN);
    fflush(stdout);
    pthread_t e;
    if (pthread_create(&e, &attr, small_exec, leaf) != 0)
        return 1;
    pthread_join(e, NULL);
    return 1; /* not reached */
}

static ucontext_t co_main, co_self;

static void co_body(void)
{
    for (int i = 0; i < 2000; i++) {
        char *volatile p = malloc(16 + (size_t)(i % 200) * 8);
        if (!p)
            exit(91);
        p[0] = 1;
        free(p);
    }
}

static int coroutine(void)
{
    enum { GUARD = 4096, STACK = 5120 };
    char *m = mmap(NULL, GUARD + STACK, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED || mprotect(m, GUARD, PROT_NONE) != 0 || getcontext(&co_self) != 0)
        return 1;
    co_self.uc_stack.ss_sp = m + GUARD;
    co_self.uc_stack.ss_size = STACK;
    co_self.uc_link = &co_main;
    makecontext(&co_self, co_body, 0);
    if (swapcontext(&co_main, &co_self) != 0)
        return 1;
    printf("coroutine: 2000 allocations on a %d-byte stack\n", STACK);
    return 0;
}

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "many";
    if (!strcmp(mode, "many"))
        return many();
    if (!strcmp(mode, "keydtor"))
        return keydtor();
    if (!strcmp(mode, "cancel"))
        return cancel();
    if (!strcmp(mode, "cancel-pending"))
        return cancel_pending(pending, 64) | cancel_pending(pending_first, 300);
    if (!strcmp(mode, "signal-at-start"))
        return signal_at_start();
    if (!strcmp(mode, "detached-trim"))
        return detached_trim();
    if (!strcmp(mode, "keys"))
        return keys();
    if (!strcmp(mode, "smallstack"))
        return smallstack();
    if (!strcmp(mode, "smallstack-exec") && argc > 2)
        return smallstack_exec(argv[2]);
    if (!strcmp(mode, "coroutine"))
        return coroutine();
    fprintf(stderr, "host_threads: unknown mode %s\n", mode);
    return 2;
}
