/* pthread_create: threads are counted from the moment they are asked for until they exit,
 * which decides the serial/parallel phase of every call. The new thread starts in a
 * trampoline that attaches its state before running the program's function, so its exit is
 * seen (through the thread-exit destructor it registers) however it ends: return,
 * pthread_exit or cancel. A thread started by a library's constructor or destructor, inside
 * the loader, registers none (that takes the loader's lock, which its creator holds): the end
 * of its function, however it ends, is its exit. */
/* This directory is built with -fexceptions (wrappers.c), under which pthread_cleanup_push
 * becomes a cleanup with a personality routine: a C program's thread cancelled or ended by
 * pthread_exit through such a frame had libgcc_s, which glibc loads for it in a scope of its
 * own, call through its PLT into libunwind's _Unwind_* functions (ours, in the global scope)
 * with its own context: a crash. The C library's setjmp-based cleanups need no personality. */
#undef __EXCEPTIONS
#include <dlfcn.h>
#include <errno.h>
#include <link.h>
#include <pthread.h>
#include <signal.h>
#include <sys/auxv.h>

#include "interpose.h"

struct start {
    void *(*fn)(void *);
    void *arg;
    bool from_loader; /* asked for by a library's constructor or destructor */
    sigset_t mask;    /* the creator's signal mask, the new thread's once its state is made */
    struct start *next;
};

/* Start records are recycled through a lock-free list: a thread start must not allocate
 * from the allocator being measured. The list head packs a pointer (our arena lives below
 * 2^47: mmap without a hint never goes higher) with a 17-bit tag that makes the pop safe
 * against ABA. */
#define PTR_BITS 47
#define PTR_MASK ((1ull << PTR_BITS) - 1)

static _Atomic uint64_t free_starts;

static struct start *start_get(void)
{
    uint64_t old = atomic_load(&free_starts), new;
    struct start *s;
    do {
        s = (struct start *)(uintptr_t)(old & PTR_MASK);
        if (!s)
            return _al_mem_alloc(sizeof(struct start));
        new = (((old >> PTR_BITS) + 1) << PTR_BITS) | ((uint64_t)(uintptr_t)s->next & PTR_MASK);
    } while (!atomic_compare_exchange_weak(&free_starts, &old, new));
    return s;
}

static void start_put(struct start *s)
{
    if ((uint64_t)(uintptr_t)s & ~PTR_MASK)
        return; /* cannot be packed: give it up rather than corrupt the list */
    uint64_t old = atomic_load(&free_starts), new;
    do {
        s->next = (struct start *)(uintptr_t)(old & PTR_MASK);
        new = (((old >> PTR_BITS) + 1) << PTR_BITS) | (uint64_t)(uintptr_t)s;
    } while (!atomic_compare_exchange_weak(&free_starts, &old, new));
}

static void end_cleanup(void *unused)
{
    (void)unused;
    _al_thread_end();
}

/* FN's end, however it comes, taken as the thread's exit (_al_thread_exit_at_end). */
static AL_NOINLINE void *run_to_end(void *(*fn)(void *), void *arg)
{
    void *r;
    pthread_cleanup_push(end_cleanup, NULL);
    r = fn(arg);
    pthread_cleanup_pop(1);
    return r;
}

static void *trampoline(void *p)
{
    struct start *s = p;
    void *(*fn)(void *) = s->fn;
    void *arg = s->arg;
    bool from_loader = s->from_loader;
    sigset_t mask = s->mask;
    start_put(s);
    _al_thread_announced();
    if (from_loader)
        _al_thread_exit_at_end();
    /* The thread starts with signals blocked (pthread_create): one sent to it at once waits
     * until its state is made and it is no longer busy, so a handler that allocates is counted
     * as the program's call it is, and its state is made as the thread's own (a thread started
     * inside the loader must not register an exit callback). */
    struct al_thread *t = _al_tls ? _al_tls : _al_enter_slow();
    if (t) {
        _al_thread_started(t);
        _al_unbusy(t);
    }
    _al_thread_signals_restore(t, &mask);
    return from_loader ? run_to_end(fn, arg) : fn(arg);
}

/* The dynamic loader's code, where it runs libraries' constructors and destructors (dlopen,
 * dlclose, exit) holding its lock: [lo, hi), or empty where the loader is unknown. */
static uintptr_t loader_lo, loader_hi;

static void find_loader(void)
{
    uintptr_t base = (uintptr_t)getauxval(AT_BASE);
    if (!base)
        return; /* the program was run by naming the loader, or is static */
    const ElfW(Ehdr) *eh = (const ElfW(Ehdr) *)base;
    const ElfW(Phdr) *ph = (const ElfW(Phdr) *)(base + eh->e_phoff);
    for (unsigned i = 0; i < eh->e_phnum; i++)
        if (ph[i].p_type == PT_LOAD && (ph[i].p_flags & PF_X)) {
            loader_lo = base + ph[i].p_vaddr;
            loader_hi = loader_lo + ph[i].p_memsz;
        }
}

/* Whether the calling thread runs inside the loader: a new thread's exit callback, whose
 * registration waits for the loader's lock, could then wait for a creator that waits for the
 * thread (a constructor that starts a thread and joins it). */
static bool inside_loader(void)
{
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, find_loader);
    if (_al_thread_exits_at_end())
        return true; /* started by such a thread, which its creator may be waiting for */
    struct al_thread *t = _al_tls;
    if (!t || t->busy || loader_lo == loader_hi)
        return false;
    t->busy = 1;
    void *raw[64];
    int n = _al_sampler_backtrace(raw, (int)(sizeof raw / sizeof raw[0]));
    _al_unbusy(t);
    for (int i = 0; i < n; i++)
        if ((uintptr_t)raw[i] >= loader_lo && (uintptr_t)raw[i] < loader_hi)
            return true;
    return false;
}

static int (*real_pthread_create)(pthread_t *, const pthread_attr_t *, void *(*)(void *), void *);

void _al_threads_resolve(void)
{
    AL_NEXT(real_pthread_create, "pthread_create");
}

AL_EXPORT int pthread_create(pthread_t *th, const pthread_attr_t *attr, void *(*fn)(void *), void *arg)
{
    if (AL_UNLIKELY(!real_pthread_create)) {
        struct al_thread *t = _al_enter_slow(); /* a thread started before any allocation */
        if (t)
            _al_unbusy(t);
        if (!real_pthread_create)
            return EAGAIN;
    }
    struct start *s = start_get();
    if (!s)
        return real_pthread_create(th, attr, fn, arg);
    s->fn = fn;
    s->arg = arg;
    s->from_loader = inside_loader();
    /* The new thread inherits the mask: every signal but SIGSYS blocked until the trampoline
     * has made its state (glibc puts the creator's mask back before the trampoline runs). */
    _al_signals_block_all(&s->mask);
    sigset_t mine = s->mask; /* s is the new thread's once it runs */
    _al_thread_spawning();
    int rc = real_pthread_create(th, attr, trampoline, s);
    _al_signals_restore(&mine);
    if (rc != 0) {
        _al_thread_spawn_failed();
        start_put(s);
    }
    return rc;
}
