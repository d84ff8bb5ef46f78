/* dl_iterate_phdr: the C library's, with the loader's lock held around its callbacks, which the
 * sampler must know of (profiler/sampler.c: a thread holding that lock never waits for a stack
 * walk that waits for it). libunwind's calls, made inside a walk, come here too. */
#include <link.h>

#include "interpose.h"

static int (*next_iterate)(int (*)(struct dl_phdr_info *, size_t, void *), void *);

void _al_iterate_phdr_resolve(void)
{
    AL_NEXT(next_iterate, "dl_iterate_phdr");
}

AL_EXPORT int dl_iterate_phdr(int (*callback)(struct dl_phdr_info *, size_t, void *), void *data)
{
    if (AL_UNLIKELY(!next_iterate))
        _al_iterate_phdr_resolve(); /* a call of our own start-up's */
    _al_sampler_loader_enter();
    int r = next_iterate(callback, data);
    _al_sampler_loader_leave();
    return r;
}
