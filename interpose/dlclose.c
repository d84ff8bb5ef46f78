/* dlclose: a library the program unloads takes its code, and the names of the sampled frames
 * in it, with it. What was loaded is noted before the C library's dlclose, and the frames in
 * what it unloaded are given lasting addresses after (profiler/unloaded.c). Libraries the
 * C library unloads itself (its NSS and iconv modules) do not pass here. */
#include <dlfcn.h>

#include "interpose.h"

static int (*next_dlclose)(void *);

void _al_dlclose_resolve(void)
{
    AL_NEXT(next_dlclose, "dlclose");
}

AL_EXPORT int dlclose(void *handle)
{
    if (AL_UNLIKELY(!next_dlclose))
        _al_dlclose_resolve(); /* a call of our own start-up's */
    struct al_objects *before = _al_unloaded_before();
    int r = next_dlclose(handle);
    _al_unloaded_after(before);
    return r;
}
