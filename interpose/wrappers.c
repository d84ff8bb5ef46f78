/* The exported allocation entry points, one per row of entries.def, all made by the macros
 * below, every kind laid out alike:
 *   timed_   the timed modes (full, time), the thread marked busy: time the real call with
 *            the cycle counter, record the object, count it;
 *   counted_ --mode sample, the thread marked busy: forget a sampled object, make the call,
 *            count it (and sample it); also a large request's way, rare enough;
 *   sampled_ --mode sample, the call counted already by the export: make it, sample it;
 *   slow_    anything unusual: first call of a thread, a nested call, start-up, the
 *            report written from _exit (served from our own pool: bootstrap.c);
 *   export   finds the thread's state and picks one of the above. It holds --mode sample's
 *            commonest paths itself (malloc-like calls and frees), so that those save no
 *            register: count the call, then jump to the allocator.
 * The profiler's own calls are forwarded uncounted thanks to the thread's busy flag. */
#include <errno.h>
#include <stdlib.h>

#include "interpose.h"

/* A throwing C++ operator new unwinds through these frames when the allocator is out of memory
 * and no new-handler helps: this file is compiled with -fexceptions, and a guard's cleanup
 * ends the call as a failed one. Without it the thread would stay busy, with the syscall
 * selector on "block", and none of its later calls would be counted. Only rows whose target
 * may throw (AL_THROWS_) have a guard (AL_IF_THROWS), made before the timed window and
 * disarmed as soon as the real call returns, so on the normal path its cleanup folds away. */
enum al_unwind_stage {
    AL_UNWIND_NONE,
    AL_UNWIND_TIMED,   /* inside AL_TIMED_CALL: end the call, record a failed allocation */
    AL_UNWIND_COUNTED, /* counted_: count a failed allocation */
};

struct al_unwind {
    enum al_unwind_stage stage;
    struct al_thread *t;
    unsigned call_op, call_large; /* the call's row, as the wrapper had them */
    bool counted;                 /* the call's events are being counted */
    size_t bytes;                 /* the request */
    uint64_t c0;                  /* the cycle counter before the call */
};

static AL_COLD void unwound(struct al_unwind *u)
{
    struct al_thread *t = u->t;
    if (u->stage == AL_UNWIND_TIMED) {
        uint64_t cycles = _al_tsc() - u->c0;
        _al_call_end(t, u->call_op, u->counted, cycles);
        _al_record_alloc(t, u->call_op, u->bytes, u->call_large, false, NULL, cycles);
    } else {
        _al_count_alloc(t, u->call_op, u->bytes, NULL);
    }
}

static inline void al_unwind_cleanup(struct al_unwind *u)
{
    if (AL_UNLIKELY(u->stage != AL_UNWIND_NONE))
        unwound(u);
}

/* A call counted already (--mode sample's sampled_ and export paths): only the busy flag to
 * clear, so the thread's pointer is the whole guard, NULL once disarmed. */
static AL_COLD void unwound_busy(struct al_thread *t)
{
    _al_unbusy(t);
}

static inline void al_busy_cleanup(struct al_thread **t)
{
    if (AL_UNLIKELY(*t != NULL))
        unwound_busy(*t);
}

/* The code after TARGET where that target may throw; nothing elsewhere. */
#define AL_CAT_(a, b) a##b
#define AL_CAT(a, b) AL_CAT_(a, b)
#define AL_IF_THROWS(target, ...) AL_CAT(AL_IF_THROWS_, AL_THROWS_##target)(__VA_ARGS__)
#define AL_IF_THROWS_0(...)
#define AL_IF_THROWS_1(...) __VA_ARGS__
#define AL_BUSY_GUARD(target)                                                          \
    AL_IF_THROWS(target, struct al_thread *busy_guard_ __attribute__((cleanup(al_busy_cleanup))) = t;)
#define AL_BUSY_DISARM(target) AL_IF_THROWS(target, busy_guard_ = NULL;)

/* Only the real call of an operator new runs with the thread marked AL_BUSY_NEW: its
 * new-handler's calls are the program's (_al_enter_call); our own work around it is not. */
#define AL_NEW_MARK(op)                                                                \
    do {                                                                               \
        if (AL_OP_##op == AL_OP_NEW)                                                   \
            t->busy = AL_BUSY_NEW;                                                     \
    } while (0)
#define AL_NEW_UNMARK(op)                                                              \
    do {                                                                               \
        if (AL_OP_##op == AL_OP_NEW)                                                   \
            t->busy = 1;                                                               \
    } while (0)

/* A slow path's state T for its call, made at RA: NULL where the call is only forwarded; a
 * call nested in an operator new sets the interrupted one aside until this frame ends. */
#define AL_ENTER_CALL(t)                                                               \
    struct al_nest nest_ __attribute__((cleanup(_al_nest_leave))) = { 0 };             \
    struct al_thread *t = _al_enter_call(ra, &nest_)

/* The real call CALL, timed: the cycle counter around it; around that, what the SIGSYS handler
 * and the lock wrappers need to know (which op, small or large), the syscall selector, and
 * the 1-in-N event counting. Leaves c0 and c1 for the caller. */
#define AL_TIMED_CALL(op, large, size, target, call)                                   \
    bool counted_ = _al_call_begin(t, AL_OP_##op, large);                              \
    AL_IF_THROWS(target, struct al_unwind guard_ __attribute__((cleanup(al_unwind_cleanup))) = { \
        .stage = AL_UNWIND_TIMED, .t = t, .call_op = AL_OP_##op, .call_large = (large), \
        .counted = counted_, .bytes = (size) };)                                       \
    uint64_t c0 = _al_tsc();                                                           \
    AL_IF_THROWS(target, guard_.c0 = c0;)                                              \
    AL_NEW_MARK(op);                                                                   \
    call;                                                                              \
    AL_NEW_UNMARK(op);                                                                 \
    uint64_t c1 = _al_tsc();                                                           \
    AL_IF_THROWS(target, guard_.stage = AL_UNWIND_NONE;)                               \
    _al_call_end(t, AL_OP_##op, counted_, c1 - c0)

#define WRAP_ALLOC(op, sym, params, args, size, align, target)                         \
    static AL_NOINLINE void *timed_##sym(AL_STRIP(params), struct al_thread *t)        \
    {                                                                                  \
        t->busy = 1;                                                                   \
        unsigned large = (size) >= _al_hot.large_threshold;                            \
        AL_TIMED_CALL(op, large, size, target, void *r = _al_real.sym args);           \
        _al_record_alloc(t, AL_OP_##op, (size), large, (align) != 0, r, c1 - c0);     \
        return r;                                                                      \
    }                                                                                  \
    /* --mode sample, the call already counted: this allocation is the one to sample. */ \
    static AL_NOINLINE void *sampled_##sym(AL_STRIP(params), struct al_thread *t)      \
    {                                                                                  \
        t->busy = 1;                                                                   \
        AL_BUSY_GUARD(target)                                                          \
        AL_NEW_MARK(op);                                                               \
        void *r = _al_real.sym args;                                                   \
        AL_NEW_UNMARK(op);                                                             \
        AL_BUSY_DISARM(target)                                                         \
        _al_sample_alloc(t, (size), r);                                                \
        _al_unbusy(t);                                                                 \
        return r;                                                                      \
    }                                                                                  \
    static AL_NOINLINE void *counted_##sym(AL_STRIP(params), struct al_thread *t)      \
    {                                                                                  \
        t->busy = 1;                                                                   \
        AL_IF_THROWS(target, struct al_unwind guard_ __attribute__((cleanup(al_unwind_cleanup))) = { \
            .stage = AL_UNWIND_COUNTED, .t = t, .call_op = AL_OP_##op, .bytes = (size) };) \
        AL_NEW_MARK(op);                                                               \
        void *r = _al_real.sym args;                                                   \
        AL_NEW_UNMARK(op);                                                             \
        AL_IF_THROWS(target, guard_.stage = AL_UNWIND_NONE;)                           \
        _al_count_alloc(t, AL_OP_##op, (size), r);                                     \
        return r;                                                                      \
    }                                                                                  \
    static AL_NOINLINE void *slow_##sym(AL_STRIP(params), const void *ra)              \
    {                                                                                  \
        if (AL_UNLIKELY(_al_own_memory))                                               \
            return _al_own_alloc((size), (align));                                     \
        AL_ENTER_CALL(t);                                                              \
        if (t)                                                                         \
            return _al_hot.timed ? timed_##sym(AL_STRIP(args), t) : counted_##sym(AL_STRIP(args), t); \
        if (AL_LIKELY(_al_real.sym != NULL)) {                                         \
            void *r = _al_thread_exit_entry((size), (align));                          \
            return AL_LIKELY(r == NULL) ? _al_real.sym args : r;                       \
        }                                                                              \
        return _al_bootstrap_alloc(size);                                              \
    }                                                                                  \
    AL_EXPORT void *sym params                                                         \
    {                                                                                  \
        struct al_thread *t = _al_tls;                                                 \
        if (AL_UNLIKELY(!t || t->busy))                                                \
            return slow_##sym(AL_STRIP(args), __builtin_return_address(0));            \
        /* Unhinted, GCC lays --mode sample's path out straight, the timed modes' jump. */\
        if (_al_hot.timed)                                                             \
            return timed_##sym(AL_STRIP(args), t);                                     \
        if (AL_UNLIKELY((size) >= _al_hot.large_threshold))                            \
            return counted_##sym(AL_STRIP(args), t);                                   \
        if (AL_UNLIKELY(!_al_count_alloc_first(t, AL_OP_##op, 0, (size))))             \
            return sampled_##sym(AL_STRIP(args), t);                                   \
        if (AL_TAIL_##target)                                                          \
            return _al_real.sym args;                                                  \
        t->busy = AL_OP_##op == AL_OP_NEW ? AL_BUSY_NEW : 1;                           \
        AL_BUSY_GUARD(target)                                                          \
        void *r = _al_real.sym args;                                                   \
        AL_BUSY_DISARM(target)                                                         \
        _al_unbusy(t);                                                                 \
        return r;                                                                      \
    }

/* An object given to realloc is retired (and forgotten by the sampler) first: once the
 * allocator has the address back another thread may get it, and record or sample it. */
#define WRAP_REALLOC(op, sym, params, args, size, align, target)                       \
    static AL_NOINLINE void *timed_##sym(AL_STRIP(params), struct al_thread *t)        \
    {                                                                                  \
        t->busy = 1;                                                                   \
        struct al_waste_undo undo;                                                     \
        struct al_sample_undo sampled = { 0 };                                         \
        unsigned had = 0, was_large = 0;                                               \
        if (AL_LIKELY(_al_hot.records) && p)                                           \
            had = _al_waste_free(t, p, &undo, &sampled);                               \
        else if (p)                                                                    \
            was_large = _al_mark_free(t, p, &sampled);                                 \
        unsigned large = (size) >= _al_hot.large_threshold;                            \
        AL_TIMED_CALL(op, large, size, target, void *r = _al_real.sym args);           \
        /* Failed: the old object is still the program's. */                           \
        if (AL_UNLIKELY((had | was_large | sampled.addr) && r == NULL && (size) != 0)) { \
            if (had)                                                                   \
                _al_waste_restore(t, p, &undo);                                        \
            else if (was_large)                                                        \
                _al_mark_alloc(t, p, 1);                                               \
            if (sampled.addr)                                                          \
                _al_sample_restore(&sampled);                                          \
        }                                                                              \
        _al_record_alloc(t, AL_OP_##op, (size), large, (align) != 0, r, c1 - c0);     \
        return r;                                                                      \
    }                                                                                  \
    static AL_NOINLINE void *counted_##sym(AL_STRIP(params), struct al_thread *t)      \
    {                                                                                  \
        t->busy = 1;                                                                   \
        struct al_sample_undo sampled = { 0 };                                         \
        _al_sample_forget(p, &sampled);                                                \
        void *r = _al_real.sym args;                                                   \
        if (AL_UNLIKELY(sampled.addr && r == NULL && (size) != 0))                     \
            _al_sample_restore(&sampled);                                              \
        _al_count_alloc(t, AL_OP_##op, (size), r);                                     \
        return r;                                                                      \
    }                                                                                  \
    static AL_NOINLINE void *slow_##sym(AL_STRIP(params), const void *ra)              \
    {                                                                                  \
        if (AL_UNLIKELY(_al_own_memory))                                               \
            return _al_own_realloc(p, (size));                                         \
        if (_al_bootstrap_owns(p))                                                     \
            return _al_bootstrap_realloc(p, (size));                                   \
        AL_ENTER_CALL(t);                                                              \
        if (t)                                                                         \
            return _al_hot.timed ? timed_##sym(AL_STRIP(args), t) : counted_##sym(AL_STRIP(args), t); \
        if (AL_LIKELY(_al_real.sym != NULL))                                           \
            return _al_real.sym args;                                                  \
        return _al_bootstrap_alloc(size);                                              \
    }                                                                                  \
    AL_EXPORT void *sym params                                                         \
    {                                                                                  \
        struct al_thread *t = _al_tls;                                                 \
        if (AL_UNLIKELY(!t || t->busy || _al_bootstrap_owns(p)))                       \
            return slow_##sym(AL_STRIP(args), __builtin_return_address(0));            \
        if (AL_LIKELY(_al_hot.timed))                                                  \
            return timed_##sym(AL_STRIP(args), t);                                     \
        return counted_##sym(AL_STRIP(args), t);                                       \
    }

/* A freed object's record is retired before the real free: once the allocator has the address
 * back, another thread may be handed it and record its own object there. */
#define WRAP_FREE(op, sym, params, args, size, align, target)                          \
    static AL_NOINLINE void timed_##sym(AL_STRIP(params), struct al_thread *t)         \
    {                                                                                  \
        t->busy = 1;                                                                   \
        unsigned large = !p                           ? 0                              \
                         : AL_LIKELY(_al_hot.records) ? _al_waste_free(t, p, NULL, NULL) & 1 \
                                                      : _al_mark_free(t, p, NULL);     \
        AL_TIMED_CALL(op, large, 0, target, _al_real.sym args);                        \
        _al_record_free(t, AL_OP_##op, large, c1 - c0);                                \
    }                                                                                  \
    static AL_NOINLINE void counted_##sym(AL_STRIP(params), struct al_thread *t)       \
    {                                                                                  \
        t->busy = 1;                                                                   \
        _al_sample_forget(p, NULL);                                                    \
        _al_real.sym args;                                                             \
        _al_count_free(t, AL_OP_##op);                                                 \
    }                                                                                  \
    static AL_NOINLINE void slow_##sym(AL_STRIP(params), const void *ra)               \
    {                                                                                  \
        if (AL_UNLIKELY(!_al_tls && _al_thread_exit_entry_free(p)))                    \
            return; /* ours, not the allocator's: see thread.c */                      \
        if (AL_UNLIKELY(_al_own_memory))                                               \
            return; /* the process is ending: kept, not handed back */                 \
        AL_ENTER_CALL(t);                                                              \
        if (t && _al_hot.timed)                                                        \
            timed_##sym(AL_STRIP(args), t);                                            \
        else if (t)                                                                    \
            counted_##sym(AL_STRIP(args), t);                                          \
        else if (AL_LIKELY(_al_real.sym != NULL))                                      \
            _al_real.sym args;                                                         \
    }                                                                                  \
    AL_EXPORT void sym params                                                          \
    {                                                                                  \
        if (AL_UNLIKELY(_al_bootstrap_owns(p)))                                        \
            return;                                                                    \
        struct al_thread *t = _al_tls;                                                 \
        if (AL_UNLIKELY(!t || t->busy)) {                                              \
            slow_##sym(AL_STRIP(args), __builtin_return_address(0));                   \
            return;                                                                    \
        }                                                                              \
        if (_al_hot.timed) {                                                           \
            timed_##sym(AL_STRIP(args), t);                                            \
            return;                                                                    \
        }                                                                              \
        /* --mode sample: a page that holds a sampled object takes the busy path (so   \
         * may free(NULL), when page 0's bucket is set: that path takes NULL too). */  \
        if (AL_UNLIKELY(_al_sample_page_maybe(p))) {                                   \
            counted_##sym(AL_STRIP(args), t);                                          \
            return;                                                                    \
        }                                                                              \
        _al_count_free_first(t, AL_OP_##op);                                           \
        if (AL_TAIL_##target) {                                                        \
            _al_real.sym args;                                                         \
            return;                                                                    \
        }                                                                              \
        t->busy = 1;                                                                   \
        _al_real.sym args;                                                             \
        _al_unbusy(t);                                                                 \
    }

/* posix_memalign while the thread is served from our pool: errno as the call found it. */
static AL_COLD int own_memalign(void **out, size_t alignment, size_t size)
{
    int saved = errno;
    void *r = _al_own_alloc(size, alignment);
    int e = r ? 0 : errno;
    errno = saved;
    if (r)
        *out = r;
    return e;
}

#define WRAP_MEMALIGN(op, sym, params, args, size, align, target)                      \
    static AL_NOINLINE int timed_##sym(AL_STRIP(params), struct al_thread *t)          \
    {                                                                                  \
        t->busy = 1;                                                                   \
        unsigned large = (size) >= _al_hot.large_threshold;                            \
        AL_TIMED_CALL(op, large, size, target, int rc = _al_real.sym args);            \
        _al_record_alloc(t, AL_OP_##op, (size), large, true, rc == 0 ? *out : NULL, c1 - c0); \
        return rc;                                                                     \
    }                                                                                  \
    static AL_NOINLINE int counted_##sym(AL_STRIP(params), struct al_thread *t)        \
    {                                                                                  \
        t->busy = 1;                                                                   \
        int rc = _al_real.sym args;                                                    \
        _al_count_alloc(t, AL_OP_##op, (size), rc == 0 ? *out : NULL);                 \
        return rc;                                                                     \
    }                                                                                  \
    static AL_NOINLINE int slow_##sym(AL_STRIP(params), const void *ra)                \
    {                                                                                  \
        if (AL_UNLIKELY(_al_own_memory))                                               \
            return own_memalign(out, (align), (size));                                 \
        AL_ENTER_CALL(t);                                                              \
        if (t)                                                                         \
            return _al_hot.timed ? timed_##sym(AL_STRIP(args), t) : counted_##sym(AL_STRIP(args), t); \
        if (AL_LIKELY(_al_real.sym != NULL))                                           \
            return _al_real.sym args;                                                  \
        return ENOMEM;                                                                 \
    }                                                                                  \
    AL_EXPORT int sym params                                                           \
    {                                                                                  \
        struct al_thread *t = _al_tls;                                                 \
        if (AL_UNLIKELY(!t || t->busy))                                                \
            return slow_##sym(AL_STRIP(args), __builtin_return_address(0));            \
        if (AL_LIKELY(_al_hot.timed))                                                  \
            return timed_##sym(AL_STRIP(args), t);                                     \
        return counted_##sym(AL_STRIP(args), t);                                       \
    }

/* --mode sample: which malloc-like and free targets may be jumped to with the thread not
 * marked busy: the allocators' malloc family does not call back into an interposed function on
 * the way (a call it made would be counted as the program's: the exact-count tests check it,
 * in --mode sample, under each allocator). Their own operators may: jemalloc's operator delete
 * calls free through its PLT, which is us; ours built on the C++ runtime's operator new call
 * back into malloc when the allocator fails. */
#define AL_TAIL_NEXT 1
#define AL_TAIL_OWN_OR_PVALLOC 0
#define AL_TAIL_OWN_OR_FREE 0
#define AL_TAIL_OWN_NEW 0
#define AL_TAIL_OWN_NEW_ALIGNED 0
#define AL_TAIL_OWN_DELETE 0

/* Which targets may throw: the C++ operator new rows (the nothrow ones never do, but share the
 * target; their guard is disarmed unused). The C functions return errors, and operator
 * delete is noexcept. */
#define AL_THROWS_NEXT 0
#define AL_THROWS_OWN_OR_PVALLOC 0
#define AL_THROWS_OWN_OR_FREE 0
#define AL_THROWS_OWN_OR_REALLOCARRAY 0
#define AL_THROWS_OWN_NEW 1
#define AL_THROWS_OWN_NEW_ALIGNED 1
#define AL_THROWS_OWN_DELETE 0

#define AL_ENTRY(kind, op, sym, params, args, size, align, target) WRAP_##kind(op, sym, params, args, size, align, target)
#include "entries.def"
#undef AL_ENTRY

/* Our own malloc, as the start-up check needs it: a plain reference to `malloc` here could
 * bind to a definition in the program itself. */
extern __typeof__(malloc) _al_own_malloc __attribute__((alias("malloc"), copy(malloc), visibility("hidden")));

/* Not an allocation: forwarded uncounted, but it must know the bootstrap pool. */
AL_EXPORT size_t malloc_usable_size(void *p)
{
    if (AL_UNLIKELY(_al_bootstrap_owns(p)))
        return _al_bootstrap_usable_size(p);
    if (AL_UNLIKELY(!_al_real.malloc_usable_size)) {
        struct al_thread *t = _al_enter_slow();
        if (t)
            _al_unbusy(t);
        if (!_al_real.malloc_usable_size)
            return 0;
    }
    return _al_real.malloc_usable_size(p);
}
