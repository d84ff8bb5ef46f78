/* The config cache: one file per allocator library under $XDG_CACHE_HOME/alloclens (or
 * ~/.cache/alloclens), named for the library and a hash of its path. An entry is used only
 * while the library file still has the identity (device, inode, size, mtime) it was probed
 * with: a changed library gets a fresh probe. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "prerun.h"

static uint64_t fnv1a(const char *s)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * 0x100000001b3ull;
    return h;
}

int _al_prerun_cache_path(const char *allocator_path, char *out, size_t cap)
{
    char real[AL_CONFIG_PATH_MAX];
    if (!realpath(allocator_path, real))
        return -errno;
    const char *xdg = getenv("XDG_CACHE_HOME");
    const char *home = getenv("HOME");
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

int _al_prerun_cache_lookup(const char *allocator_path, struct al_alloc_config *out)
{
    char path[AL_CONFIG_PATH_MAX], err[512];
    struct al_file_identity now;
    int r = _al_prerun_cache_path(allocator_path, path, sizeof path);
    if (r < 0)
        return r;
    if (_al_config_identity(allocator_path, &now) < 0)
        return -ENOENT;
    if (access(path, F_OK) < 0)
        return -ENOENT;
    if (_al_config_load(path, out, err, sizeof err) < 0) {
        fprintf(stderr, "alloclens: ignoring the cached config: %s\n", err);
        return -EINVAL;
    }
    return _al_config_identity_equal(&now, &out->identity) ? 0 : -ESTALE;
}

static int make_dirs(char *path)
{
    for (char *p = path + 1; *p; p++) {
        if (*p != '/')
            continue;
        *p = '\0';
        int r = mkdir(path, 0755);
        *p = '/';
        if (r < 0 && errno != EEXIST)
            return -errno;
    }
    return 0;
}

int _al_prerun_write_config(const char *path, const struct al_alloc_config *c, char *err, size_t errcap)
{
    static char text[1 << 20];
    long n = _al_config_format(c, text, sizeof text);
    if (n < 0) {
        snprintf(err, errcap, "%s: config too large to write", path);
        return -ENOSPC;
    }
    char tmp[AL_CONFIG_PATH_MAX + 16];
    snprintf(tmp, sizeof tmp, "%s.%d", path, (int)getpid());
    int r = make_dirs(tmp);
    int fd = r < 0 ? -1 : open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0 || write(fd, text, (size_t)n) != n || close(fd) < 0 || rename(tmp, path) < 0) {
        int e = errno;
        snprintf(err, errcap, "cannot write %s: %s", path, strerror(e));
        if (fd >= 0)
            unlink(tmp);
        return -e;
    }
    return 0;
}
