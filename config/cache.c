/* Where a probed config is kept: one file per allocator library under
 * $XDG_CACHE_HOME/alloclens (or ~/.cache/alloclens), named for the library and a hash of its
 * path. An entry is used only while the library file still has the identity (device, inode,
 * size, mtime) it was probed with: a changed library needs a fresh probe. Read by the CLI
 * (which probes and writes, prerun/) and by the library used without it. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "alloc_config.h"

static uint64_t fnv1a(const char *s)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * 0x100000001b3ull;
    return h;
}

int _al_config_cache_path(const char *allocator_path, const char *xdg, const char *home, char *out, size_t cap)
{
    char real[AL_CONFIG_PATH_MAX];
    if (!realpath(allocator_path, real))
        return -errno;
    char dir[AL_CONFIG_PATH_MAX];
    if (xdg && xdg[0] == '/')
        snprintf(dir, sizeof dir, "%s/alloclens", xdg);
    else if (home && *home)
        snprintf(dir, sizeof dir, "%s/.cache/alloclens", home);
    else
        return -ENOENT;
    const char *base = strrchr(real, '/');
    base = base ? base + 1 : real;
    int n = snprintf(out, cap, "%s/%s-%016llx.conf", dir, base, (unsigned long long)fnv1a(real));
    return n > 0 && (size_t)n < cap ? 0 : -ENAMETOOLONG;
}

int _al_config_cache_lookup(const char *allocator_path, const char *path, struct al_alloc_config *out,
                            char *err, size_t errcap)
{
    struct al_file_identity now;
    if (_al_config_identity(allocator_path, &now) < 0 || access(path, F_OK) < 0)
        return -ENOENT;
    if (_al_config_load_runs(path, out, err, errcap) < 0)
        return -EINVAL;
    return _al_config_identity_equal(&now, &out->identity) ? 0 : -ESTALE;
}
