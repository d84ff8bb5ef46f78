/* Writing a probed config, to the cache (config/cache.c says where) or to a file of the
 * user's: whole or not at all, through a temporary file renamed into place (so only onto a
 * regular file: a link's own file is replaced, the link kept). */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "prerun.h"

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

int _al_prerun_output_target(const char *path, char *target, size_t cap, char *err, size_t errcap)
{
    struct stat st;
    if (stat(path, &st) < 0) {
        if (errno == ENOENT && lstat(path, &st) == 0) {
            snprintf(err, errcap, "cannot write %s: a symbolic link to a missing file", path);
            return -ENOENT;
        }
        if (errno != ENOENT) {
            int e = errno;
            snprintf(err, errcap, "cannot write %s: %s", path, strerror(e));
            return -e;
        }
        if (snprintf(target, cap, "%s", path) >= (int)cap) {
            snprintf(err, errcap, "cannot write %s: %s", path, strerror(ENAMETOOLONG));
            return -ENAMETOOLONG;
        }
        return 0;
    }
    /* A device, a FIFO or a directory would be replaced by the rename. */
    if (!S_ISREG(st.st_mode)) {
        snprintf(err, errcap, "cannot write %s: not a regular file", path);
        return -EINVAL;
    }
    char real[PATH_MAX];
    errno = 0;
    if (!realpath(path, real) || snprintf(target, cap, "%s", real) >= (int)cap) {
        int e = errno ? errno : ENAMETOOLONG;
        snprintf(err, errcap, "cannot write %s: %s", path, strerror(e));
        return -e;
    }
    return 0;
}

int _al_prerun_write_config(const char *path, const struct al_alloc_config *c, bool make_parents, char *err,
                            size_t errcap)
{
    static char text[1 << 20];
    long n = _al_config_format(c, text, sizeof text);
    if (n < 0) {
        snprintf(err, errcap, "%s: config too large to write", path);
        return -ENOSPC;
    }
    char tmp[AL_CONFIG_PATH_MAX + 16];
    snprintf(tmp, sizeof tmp, "%s.%d", path, (int)getpid());
    int r = make_parents ? make_dirs(tmp) : 0;
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
