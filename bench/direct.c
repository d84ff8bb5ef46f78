/* bench/direct: an allocator's own malloc family (see direct.h). */
#include <dlfcn.h>
#include <link.h>
#include <stdio.h>
#include <stdlib.h>

#include "direct.h"

const struct bench_fns bench_symbols = { malloc, calloc, realloc, free };

/* SYM as LIB (handle H) itself defines it, not a definition found in one of its dependencies. */
static void *own_symbol(const char *prog, void *h, const char *lib, const char *sym)
{
    struct link_map *lib_map, *def_map;
    Dl_info info;
    void *f = dlsym(h, sym);
    if (!f || dlinfo(h, RTLD_DI_LINKMAP, &lib_map) != 0 ||
        !dladdr1(f, &info, (void **)&def_map, RTLD_DL_LINKMAP) || def_map != lib_map) {
        fprintf(stderr, "%s: %s does not define %s itself\n", prog, lib, sym);
        return NULL;
    }
    return f;
}

int bench_direct(const char *prog, const char *lib, struct bench_fns *out)
{
    /* RTLD_NOLOAD: the allocator the process already uses, never a second copy. */
    void *h = dlopen(lib, RTLD_LAZY | RTLD_NOLOAD);
    if (!h) {
        fprintf(stderr, "%s: %s is not loaded in this process\n", prog, lib);
        return -1;
    }
    out->malloc = (void *(*)(size_t))own_symbol(prog, h, lib, "malloc");
    out->calloc = (void *(*)(size_t, size_t))own_symbol(prog, h, lib, "calloc");
    out->realloc = (void *(*)(void *, size_t))own_symbol(prog, h, lib, "realloc");
    out->free = (void (*)(void *))own_symbol(prog, h, lib, "free");
    dlclose(h); /* NOLOAD took a reference; the library stays, the process loaded it */
    return out->malloc && out->calloc && out->realloc && out->free ? 0 : -1;
}
