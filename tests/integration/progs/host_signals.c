/* host_signals: signals delivered while the program allocates.
 *
 * usage: host_signals MODE
 *   handlers      SIGALRM (interval timer, 500 us) and SIGUSR1 (sent 200 times by a second
 *                 thread) interrupt a main loop that allocates; the handlers only count (they
 *                 never allocate). Prints the counts it waited for and exits 0.
 *   term          allocates, then raise(SIGTERM): dies by SIGTERM
 *   term-threads  4 threads allocate without pause; main sends SIGTERM to the process
 *   abort         allocates, then abort(): dies by SIGABRT
 *   exit-handler  a SIGUSR1 handler calls _exit(5) while the main loop allocates
 *   mask          SIGUSR1 blocked around allocation, then delivered by sigsuspend; exits 0
 *   sigchld       a SIGCHLD handler that writes a line for each signal; allocates enough for
 *                 sampled sites (whose names the report finds at exit), starts no child and
 *                 returns 0: no line may appear */
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <unistd.h>

static volatile sig_atomic_t alarms, usr1s;

static void on_alarm(int sig)
{
    (void)sig;
    alarms++;
}

static void on_usr1(int sig)
{
    (void)sig;
    usr1s++;
}

static void on_chld(int sig)
{
    (void)sig;
    static const char line[] = "SIGCHLD\n";
    ssize_t w = write(1, line, sizeof line - 1);
    (void)w;
}

static void on_usr1_exit(int sig)
{
    (void)sig;
    _exit(5);
}

static void churn_once(int i)
{
    size_t size = 16 + (size_t)(i % 53) * 48;
    if (i % 97 == 0)
        size += 300000;
    void *p = malloc(size);
    if (!p)
        _exit(90);
    memset(p, 1, 16);
    void *q = realloc(p, size * 2);
    if (!q)
        _exit(91);
    free(q);
    void *r = calloc(4, size / 4 + 1);
    free(r);
}

static pthread_t main_thread;
static atomic_int stop;

static void *sender(void *arg)
{
    (void)arg;
    for (int i = 0; i < 200; i++) {
        pthread_kill(main_thread, SIGUSR1);
        /* wait until it has been handled, so none is merged with the next one */
        while (usr1s <= i)
            usleep(50);
    }
    return NULL;
}

static void *spinner(void *arg)
{
    int i = (int)(long)arg;
    while (!atomic_load(&stop))
        churn_once(i++);
    return NULL;
}

static void install(int sig, void (*fn)(int))
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = fn;
    sa.sa_flags = SA_RESTART;
    sigemptyset(&sa.sa_mask);
    sigaction(sig, &sa, NULL);
}

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "handlers";
    if (!strcmp(mode, "handlers")) {
        install(SIGALRM, on_alarm);
        install(SIGUSR1, on_usr1);
        main_thread = pthread_self();
        struct itimerval it = { { 0, 500 }, { 0, 500 } };
        setitimer(ITIMER_REAL, &it, NULL);
        pthread_t t;
        pthread_create(&t, NULL, sender, NULL);
        long i = 0;
        while (alarms < 100 || usr1s < 200)
            churn_once((int)i++);
        struct itimerval off = { { 0, 0 }, { 0, 0 } };
        setitimer(ITIMER_REAL, &off, NULL);
        pthread_join(t, NULL);
        printf("handlers: at least 100 SIGALRM and exactly %d SIGUSR1 handled while allocating\n",
               (int)usr1s);
        printf("handlers: the loop went on after them: %s\n", i > 0 ? "yes" : "no");
        return 0;
    }
    if (!strcmp(mode, "term")) {
        for (int i = 0; i < 5000; i++)
            churn_once(i);
        printf("term: about to raise SIGTERM\n");
        fflush(stdout);
        raise(SIGTERM);
        printf("term: still alive?\n");
        return 1;
    }
    if (!strcmp(mode, "term-threads")) {
        pthread_t t[4];
        for (long k = 0; k < 4; k++)
            pthread_create(&t[k], NULL, spinner, (void *)(k * 1000));
        usleep(20000);
        printf("term-threads: sending SIGTERM to the process\n");
        fflush(stdout);
        kill(getpid(), SIGTERM);
        for (;;)
            pause();
    }
    if (!strcmp(mode, "abort")) {
        for (int i = 0; i < 2000; i++)
            churn_once(i);
        printf("abort: calling abort()\n");
        fflush(stdout);
        abort();
    }
    if (!strcmp(mode, "exit-handler")) {
        install(SIGUSR1, on_usr1_exit);
        printf("exit-handler: the SIGUSR1 handler will _exit(5)\n");
        fflush(stdout);
        main_thread = pthread_self();
        for (int i = 0;; i++) {
            churn_once(i);
            if (i == 3000)
                pthread_kill(main_thread, SIGUSR1);
        }
    }
    if (!strcmp(mode, "mask")) {
        install(SIGUSR1, on_usr1);
        sigset_t block, old;
        sigemptyset(&block);
        sigaddset(&block, SIGUSR1);
        sigprocmask(SIG_BLOCK, &block, &old);
        raise(SIGUSR1);
        for (int i = 0; i < 3000; i++)
            churn_once(i);
        printf("mask: handled while blocked: %d\n", (int)usr1s);
        sigsuspend(&old);
        sigprocmask(SIG_SETMASK, &old, NULL);
        printf("mask: handled after sigsuspend: %d\n", (int)usr1s);
        return usr1s == 1 ? 0 : 1;
    }
    if (!strcmp(mode, "sigchld")) {
        install(SIGCHLD, on_chld);
        static void *keep[256];
        for (int i = 0; i < 256; i++)
            keep[i] = malloc(64 << 10);
        printf("sigchld: %d blocks of 64 KiB kept\n", (int)(sizeof keep / sizeof keep[0]));
        return keep[255] ? 0 : 1;
    }
    fprintf(stderr, "host_signals: unknown mode %s\n", mode);
    return 2;
}
