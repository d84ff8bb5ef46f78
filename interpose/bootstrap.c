/* The bootstrap pool: memory of our own, for the two moments when calls must not reach the
 * real allocator.
 *
 * Start-up: resolving the real allocator with dlsym can itself allocate (dlerror's message
 * when an optional symbol is missing); those calls arrive before there is anything to forward
 * them to. Running out then means something unexpected is allocating: say so and abort,
 * rather than hand out memory we cannot account for.
 *
 * A report written from _exit (exit.c): _exit may be called from a signal handler that
 * interrupted the allocator while it held a lock, and the report's own allocations (posix_spawn's
 * file actions, elfutils) would then wait for that lock forever. So while the reporting thread
 * is marked (_al_own_memory), its allocations come from here and its frees are dropped (the
 * process is ending). Running out then is an ordinary allocation failure.
 *
 * The pool is static, so zeroed, and its pages cost nothing until used. free ignores pool
 * pointers; realloc of one copies it into real memory (into the pool while marked). */
#include <errno.h>
#include <string.h>
#include <unistd.h>
#include <stdlib.h>

#include "interpose.h"

#define ALIGN 16

struct pool_header {
    size_t size;
    size_t pad;
};

char _al_bootstrap_pool[AL_BOOTSTRAP_POOL_SIZE] __attribute__((aligned(ALIGN)));
static _Atomic size_t pool_used;
__thread bool _al_own_memory __attribute__((tls_model("initial-exec")));

/* SIZE bytes at an address aligned to ALIGNMENT (a power of two, at least ALIGN); NULL when
 * the pool cannot hold them. */
static void *pool_take(size_t size, size_t alignment)
{
    if (size > AL_BOOTSTRAP_POOL_SIZE || alignment > AL_BOOTSTRAP_POOL_SIZE)
        return NULL;
    size_t rounded = (size + ALIGN - 1) & ~(size_t)(ALIGN - 1);
    uintptr_t base = (uintptr_t)_al_bootstrap_pool;
    size_t off = atomic_load_explicit(&pool_used, memory_order_relaxed), start, end;
    do {
        start = ((base + off + sizeof(struct pool_header) + alignment - 1) & ~(uintptr_t)(alignment - 1)) - base;
        end = start + rounded;
        if (end > AL_BOOTSTRAP_POOL_SIZE)
            return NULL;
    } while (!atomic_compare_exchange_weak_explicit(&pool_used, &off, end, memory_order_relaxed,
                                                    memory_order_relaxed));
    struct pool_header *h = (struct pool_header *)(_al_bootstrap_pool + start) - 1;
    h->size = size;
    return h + 1;
}

void *_al_bootstrap_alloc(size_t size)
{
    void *p = pool_take(size, ALIGN);
    if (!p) {
        static const char msg[] = "alloclens: bootstrap pool exhausted during start-up; aborting\n";
        (void)!write(STDERR_FILENO, msg, sizeof msg - 1);
        abort();
    }
    return p;
}

void *_al_own_alloc(size_t size, size_t alignment)
{
    if (alignment < ALIGN)
        alignment = ALIGN;
    if (alignment & (alignment - 1)) {
        errno = EINVAL;
        return NULL;
    }
    void *p = pool_take(size, alignment);
    if (!p)
        errno = ENOMEM;
    return p;
}

size_t _al_bootstrap_usable_size(const void *p)
{
    return ((const struct pool_header *)p - 1)->size;
}

static void *copy_into(void *n, const void *p, size_t old, size_t size)
{
    if (n && size)
        memcpy(n, p, old < size ? old : size);
    return n;
}

void *_al_bootstrap_realloc(void *p, size_t size)
{
    void *n = _al_real.malloc ? _al_real.malloc(size) : _al_bootstrap_alloc(size);
    return copy_into(n, p, _al_bootstrap_usable_size(p), size);
}

void *_al_own_realloc(void *p, size_t size)
{
    /* The real allocator's object stays where it is: the process is ending. */
    size_t old = !p ? 0
                 : _al_bootstrap_owns(p) ? _al_bootstrap_usable_size(p)
                 : _al_real.malloc_usable_size ? _al_real.malloc_usable_size(p) : 0;
    return copy_into(_al_own_alloc(size, ALIGN), p, old, size);
}
