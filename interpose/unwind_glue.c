/* The two unwinder entry points that wrappers.c's cleanups (-fexceptions) refer to: the C
 * personality routine and _Unwind_Resume, forwarded to the process's libgcc_s.
 *
 * Linking libgcc_s for them would load it into every program under alloclens, and its
 * constructor probes the CPU with cpuid, which traps on a virtual machine: 0.17 ms added to
 * the start of every process (/bin/true: 0.76 -> 0.93 ms of CPU), for calls that come only
 * when a C++ operator new throws through a wrapper. Whatever throws is C++, and the C++
 * runtime has libgcc_s loaded already: the real routines are looked up there at start-up
 * when it is loaded, else when first needed, without loading anything (_al_unwind_glue_resolve). */
#include <dlfcn.h>
#include <link.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "interpose.h"

/* The unwinder's types, opaque here: nothing of them is read, only passed on. */
struct _Unwind_Exception;
struct _Unwind_Context;
typedef int al_unwind_reason;
#define AL_URC_CONTINUE_UNWIND 8

typedef al_unwind_reason (*al_personality_fn)(int, int, uint64_t, struct _Unwind_Exception *,
                                              struct _Unwind_Context *);
typedef void (*al_resume_fn)(struct _Unwind_Exception *);

static _Atomic(al_personality_fn) real_personality;
static _Atomic(al_resume_fn) real_resume;

static int is_libgcc(struct dl_phdr_info *info, size_t size, void *found)
{
    (void)size;
    const char *slash = strrchr(info->dlpi_name, '/');
    *(bool *)found = strcmp(slash ? slash + 1 : info->dlpi_name, "libgcc_s.so.1") == 0;
    return *(bool *)found;
}

/* Both are looked up as the C++ runtime's own references to the unwinder were bound: the global
 * scope first. There _Unwind_Resume is that of the unwinder that raised the exception (libgcc_s,
 * or libunwind, which we load and which defines the same entry points), and libgcc_s's
 * personality routine reads the unwinder's context through its PLT, bound alike. (A runtime
 * bound otherwise, RTLD_DEEPBIND or -Bsymbolic, would raise with one unwinder and be resumed
 * with another.) libgcc_s itself may be only in a scope of its own (a C++ library dlopen'ed
 * RTLD_LOCAL by a C program): dlopen with RTLD_NOLOAD finds it there, loading nothing.
 * Nothing is looked up before libgcc_s is seen loaded: a failed dlopen or dlsym allocates its
 * message. Called with the thread busy (start-up; the wrappers, unwinding). */
void _al_unwind_glue_resolve(void)
{
    bool loaded = false;
    dl_iterate_phdr(is_libgcc, &loaded);
    void *gcc = loaded ? dlopen("libgcc_s.so.1", RTLD_NOW | RTLD_NOLOAD) : NULL;
    if (!gcc)
        return;
    void *p = dlsym(gcc, "__gcc_personality_v0");
    void *r = dlsym(RTLD_DEFAULT, "_Unwind_Resume");
    if (p && r) {
        atomic_store_explicit(&real_resume, (al_resume_fn)r, memory_order_release);
        atomic_store_explicit(&real_personality, (al_personality_fn)p, memory_order_release);
    }
}

al_unwind_reason __gcc_personality_v0(int version, int actions, uint64_t exception_class,
                                      struct _Unwind_Exception *e, struct _Unwind_Context *ctx);
al_unwind_reason __gcc_personality_v0(int version, int actions, uint64_t exception_class,
                                      struct _Unwind_Exception *e, struct _Unwind_Context *ctx)
{
    al_personality_fn p = atomic_load_explicit(&real_personality, memory_order_acquire);
    if (AL_UNLIKELY(!p)) {
        _al_unwind_glue_resolve();
        p = atomic_load_explicit(&real_personality, memory_order_acquire);
    }
    /* No libgcc_s: a C++ runtime on another unwinder (LLVM's libunwind, or one linked into a
     * library with -static-libgcc). The cleanup is passed over, so the thread stays marked
     * busy and its later calls go uncounted: said once, not hidden. */
    if (!p) {
        static _Atomic bool said;
        if (!atomic_exchange_explicit(&said, true, memory_order_relaxed))
            _al_log("a C++ exception unwound through alloclens's wrappers with no libgcc_s in the "
                    "process: the thread's later allocation calls are not counted");
        return AL_URC_CONTINUE_UNWIND;
    }
    return p(version, actions, exception_class, e, ctx);
}

/* Reached only from a cleanup that the real personality routine above installed. */
void _Unwind_Resume(struct _Unwind_Exception *e);
void _Unwind_Resume(struct _Unwind_Exception *e)
{
    al_resume_fn r = atomic_load_explicit(&real_resume, memory_order_acquire);
    if (!r)
        abort();
    r(e);
    abort(); /* _Unwind_Resume does not return */
}
