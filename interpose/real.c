/* Resolving the real allocator behind alloclens, the forwarding targets the allocator does
 * not provide itself, and start-up.
 *
 * Every C entry point forwards to the next definition in the search order: the allocator
 * LD_PRELOADed right after us (libc.so.6 itself for glibc). The C++ operators forward to the
 * allocator's own operators when its library defines them (jemalloc, tcmalloc and mimalloc
 * do, with their own sized and aligned paths); otherwise they are built here on its malloc
 * family, falling back to the C++ runtime's operator only when the allocator fails, so the
 * new-handler and std::bad_alloc behave exactly as without us.
 */
#include <dlfcn.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "interpose.h"

struct al_real_fns _al_real, _al_next;

/* ---- targets built here ------------------------------------------------------------------ */

/* The code of the runtime's operators looked up so far: a call from there, nested in one of
 * ours, is its retry of the allocator (_al_enter_nested), not the program's. A slot is
 * claimed, then filled, its start last: one whose start is not there yet holds nothing. */
#define RUNTIME_NEWS 16
static struct al_code runtime_news[RUNTIME_NEWS];
static _Atomic unsigned nruntime_news;

static void runtime_new_found(const void *f)
{
    Dl_info info;
    const Elf64_Sym *sym = NULL;
    unsigned i = atomic_fetch_add(&nruntime_news, 1);
    if (i >= RUNTIME_NEWS || !dladdr1(f, &info, (void **)&sym, RTLD_DL_SYMENT) || !sym)
        return;
    __atomic_store_n(&runtime_news[i].hi, (uintptr_t)f + sym->st_size, __ATOMIC_RELAXED);
    __atomic_store_n(&runtime_news[i].lo, (uintptr_t)f, __ATOMIC_RELEASE);
}

/* The C++ runtime's own operator, for when the allocator fails (its new-handler loop and
 * std::bad_alloc). Looked up then if start-up did not find it: a program may load the runtime
 * after we started (a C program dlopening a C++ library), and into a scope of its own
 * (RTLD_LOCAL) that RTLD_NEXT does not search, where the runtime is found by its name. */
static AL_COLD void *next_cxx(void **slot, const char *name)
{
    static const char *const runtimes[] = { "libstdc++.so.6", "libc++abi.so.1", "libc++.so.1" };
    void *f = __atomic_load_n(slot, __ATOMIC_RELAXED);
    if (f)
        return f;
    f = dlsym(RTLD_NEXT, name);
    for (size_t i = 0; !f && i < sizeof runtimes / sizeof *runtimes; i++) {
        void *h = dlopen(runtimes[i], RTLD_NOW | RTLD_NOLOAD);
        if (h)
            f = dlsym(h, name);
    }
    if (f)
        runtime_new_found(f);
    __atomic_store_n(slot, f, __ATOMIC_RELAXED);
    return f;
}
/* R, else what the C++ runtime's SYM returns for ARGS; R (NULL) where no runtime of those
 * names is loaded (one under another name, loaded RTLD_LOCAL after we started). */
#define NEXT_CXX(r, sym, args)                                                          \
    do {                                                                                \
        __typeof__(_al_next.sym) next_ = (__typeof__(_al_next.sym))next_cxx((void **)&_al_next.sym, #sym); \
        if (next_)                                                                      \
            r = next_ args;                                                             \
    } while (0)

#define FALLBACK_NEXT(kind, sym, params, args)
#define FALLBACK_OWN_OR_FREE(kind, sym, params, args) \
    static void fb_##sym params { _al_real.free(p); }
#define FALLBACK_OWN_OR_PVALLOC(kind, sym, params, args)               \
    static void *fb_##sym params                                       \
    {                                                                  \
        size_t page = (size_t)getpagesize();                           \
        if (n > SIZE_MAX - page) {                                     \
            errno = ENOMEM;                                            \
            return NULL;                                               \
        }                                                              \
        size_t bytes = n ? (n + page - 1) & ~(page - 1) : page;        \
        void *r = NULL;                                                \
        int e = _al_real.posix_memalign(&r, page, bytes);              \
        if (e) {                                                       \
            errno = e;                                                 \
            return NULL;                                               \
        }                                                              \
        return r;                                                      \
    }
#define FALLBACK_OWN_OR_REALLOCARRAY(kind, sym, params, args)          \
    static void *fb_##sym params                                       \
    {                                                                  \
        size_t bytes;                                                  \
        if (__builtin_mul_overflow(k, n, &bytes)) {                    \
            errno = ENOMEM;                                            \
            return NULL;                                               \
        }                                                              \
        return _al_real.realloc(p, bytes);                             \
    }
#define FALLBACK_OWN_NEW(kind, sym, params, args)                      \
    static void *fb_##sym params                                       \
    {                                                                  \
        void *r = _al_real.malloc(n ? n : 1);                          \
        if (__builtin_expect(!r, 0))                                   \
            NEXT_CXX(r, sym, args);                                    \
        return r;                                                      \
    }
/* As libstdc++ makes it, so the allocator gets the same requests as without us: the size
 * rounded up to a multiple of the alignment (C11's aligned_alloc asks for that; the sum may
 * wrap, as there), and an alignment that is not a power of two left to the runtime, which
 * refuses it. */
#define FALLBACK_OWN_NEW_ALIGNED(kind, sym, params, args)              \
    static void *fb_##sym params                                       \
    {                                                                  \
        void *r = NULL;                                                \
        if (__builtin_expect(a != 0 && (a & (a - 1)) == 0, 1))         \
            r = _al_real.aligned_alloc(a, ((n ? n : 1) + a - 1) & ~(a - 1)); \
        if (__builtin_expect(!r, 0))                                   \
            NEXT_CXX(r, sym, args);                                    \
        return r;                                                      \
    }
#define FALLBACK_OWN_DELETE(kind, sym, params, args) \
    static void fb_##sym params { _al_real.free(p); }

#define AL_ENTRY(kind, op, sym, params, args, size, align, target) FALLBACK_##target(kind, sym, params, args)
#include "entries.def"
#undef AL_ENTRY

/* ---- resolution ------------------------------------------------------------------------- */

static uintptr_t object_base(const void *fn)
{
    struct al_object obj;
    return _al_object_of(fn, &obj) ? obj.base : 0;
}

#define RESOLVE_NEXT(sym) AL_NEXT(_al_real.sym, #sym);
/* _al_next.sym is left NULL where the allocator has no SYM (only the allocator's own is taken
 * at start-up); next_cxx looks the C++ runtime's up if it is ever needed. */
#define RESOLVE_OWN(sym)                                                                   \
    _al_next.sym = _al_object_may_define(&allocator, #sym)                                 \
                       ? (__typeof__(_al_next.sym))dlsym(RTLD_NEXT, #sym) : NULL;          \
    _al_real.sym = object_base((const void *)_al_next.sym) == allocator.base ? _al_next.sym : fb_##sym;
#define RESOLVE_OWN_NEW(sym) RESOLVE_OWN(sym)
#define RESOLVE_OWN_NEW_ALIGNED(sym) RESOLVE_OWN(sym)
#define RESOLVE_OWN_DELETE(sym) RESOLVE_OWN(sym)
#define RESOLVE_OWN_OR_FREE(sym) RESOLVE_OWN(sym)
#define RESOLVE_OWN_OR_REALLOCARRAY(sym) RESOLVE_OWN(sym)
#define RESOLVE_OWN_OR_PVALLOC(sym) RESOLVE_OWN(sym)

/* The allocator's code: calls from there are never the program's. */
static struct al_code allocator_code;

static int real_resolve(void)
{
    AL_NEXT(_al_real.malloc, "malloc");
    struct al_object allocator;
    if (!_al_object_of((const void *)_al_real.malloc, &allocator) || !allocator.base)
        return -ENOENT;
    allocator_code = (struct al_code){ allocator.seg_lo, allocator.seg_hi };
#define AL_ENTRY(kind, op, sym, params, args, size, align, target) RESOLVE_##target(sym)
#include "entries.def"
#undef AL_ENTRY
    AL_NEXT(_al_real.malloc_usable_size, "malloc_usable_size");
    _al_exec_resolve();
    _al_exit_resolve();
    _al_threads_resolve();
    _al_locks_resolve();
    _al_signals_resolve();
    _al_signal_compat_resolve();
    _al_fds_resolve();
    _al_seccomp_resolve();
    _al_clone_resolve();
    _al_dlclose_resolve();
    _al_iterate_phdr_resolve();
    if (!_al_real.free || !_al_real.calloc || !_al_real.realloc || !_al_real.posix_memalign)
        return -ENOENT;
    return 0;
}

/* ---- start-up -------------------------------------------------------------------------- */

extern void *_al_own_malloc(size_t);

static const void *real_malloc_addr(void)
{
    return (const void *)_al_real.malloc;
}

static const void *own_malloc_addr(void)
{
    return (const void *)_al_own_malloc;
}

static al_usable_size_fn *real_usable_size(void)
{
    return _al_real.malloc_usable_size;
}

static const struct al_process_hooks hooks = {
    .resolve = real_resolve,
    .malloc_addr = real_malloc_addr,
    .own_malloc = own_malloc_addr,
    .usable_size = real_usable_size,
    .posix_spawn_addr = _al_exec_real_posix_spawn,
    .started = _al_unwind_glue_resolve,
};

AL_NOINLINE struct al_thread *_al_enter_slow(void)
{
    if (_al_tls || _al_reporting)
        return NULL; /* nested inside one of our calls, or the report's own */
    if (AL_UNLIKELY(atomic_load_explicit(&_al_state, memory_order_acquire) != AL_STATE_READY)) {
        int saved = errno;
        _al_process_init(&hooks);
        errno = saved;
        if (atomic_load_explicit(&_al_state, memory_order_acquire) != AL_STATE_READY)
            return NULL; /* start-up is resolving symbols on this very thread */
    }
    return _al_thread_attach();
}

AL_COLD struct al_thread *_al_enter_nested(struct al_thread *t, const void *ra, struct al_nest *nest)
{
    /* The allocator's own calls; and ours: a slow path reached by a call, not a jump, has its
     * own return address where the caller's should be. */
    if (_al_code_holds(&allocator_code, ra) || _al_code_holds(&_al_self_code, ra))
        return NULL;
    unsigned n = atomic_load(&nruntime_news);
    for (unsigned i = 0; i < n && i < RUNTIME_NEWS; i++) {
        struct al_code c = { __atomic_load_n(&runtime_news[i].lo, __ATOMIC_ACQUIRE), 0 };
        c.hi = c.lo ? __atomic_load_n(&runtime_news[i].hi, __ATOMIC_RELAXED) : 0;
        if (_al_code_holds(&c, ra))
            return NULL;
    }
    _al_nest_enter(t, nest);
    return t;
}

/* glibc calls constructors with main's arguments (and the environment, not needed here). */
__attribute__((constructor)) static void alloclens_start(int argc, char **argv)
{
    if (atomic_load(&_al_state) != AL_STATE_READY)
        _al_process_init(&hooks);
    _al_process_start(argc, argv);
    _al_exit_start();
    _al_signals_start();
}
