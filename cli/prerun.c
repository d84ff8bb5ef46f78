/* alloclens prerun, and the config 'alloclens run' hands to the library: an explicit
 * --config / ALLOCLENS_CONFIG, else the cached probe result for the allocator, else a fresh
 * probe (said on one stderr line, cached for next time: where the cache cannot be written,
 * in a private directory in $TMPDIR, said on one more). A broken config is reported as
 * FILE:LINE: what is wrong, and the probe runs instead; a failed probe leaves the run to the
 * default threshold, never stops it. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "prerun.h"
#include "profiler.h"

static struct al_alloc_config cfg;

static int probe_exe(char *out, size_t cap)
{
    if (_al_cli_sibling("../prerun/alloclens-probe", "alloclens-probe", out, cap) < 0) {
        fprintf(stderr, "alloclens: cannot find the probe alloclens-probe (looked beside this command and in %s)\n", out);
        return -1;
    }
    return 0;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* The cache file for LIB, or -1 with a line ending in THEN. */
static int cache_path(const char *lib, char *out, size_t cap, const char *then)
{
    int r = _al_config_cache_path(lib, getenv("XDG_CACHE_HOME"), getenv("HOME"), out, cap);
    if (r == -ENOENT)
        fprintf(stderr, "alloclens: no cache directory (set XDG_CACHE_HOME or HOME); %s\n", then);
    else if (r < 0)
        fprintf(stderr, "alloclens: no cache file for %s: %s; %s\n", lib, strerror(-r), then);
    return r < 0 ? -1 : 0;
}

/* Where a run keeps the config of LIB when the cache cannot take it (a user whose HOME is
 * not theirs to write, as nobody's /root): a directory of this user's own in $TMPDIR (or
 * /tmp), made private (with MAKE), and used only while it is a real directory this user owns
 * and no one else may write (anyone may make names in /tmp). The next run finds it there and
 * probes no more. 0, or -errno. */
static int private_path(const char *lib, char *out, size_t cap, bool make)
{
    const char *tmp = getenv("TMPDIR");
    char dir[4096];
    if (snprintf(dir, sizeof dir, "%s/alloclens-%u", tmp && tmp[0] == '/' ? tmp : "/tmp", (unsigned)getuid()) >=
        (int)sizeof dir)
        return -ENAMETOOLONG;
    struct stat st;
    if (make && mkdir(dir, 0700) < 0 && errno != EEXIST)
        return -errno;
    if (lstat(dir, &st) < 0)
        return -errno;
    if (!S_ISDIR(st.st_mode) || st.st_uid != getuid() || (st.st_mode & 077))
        return -EPERM;
    return _al_config_cache_path(lib, dir, NULL, out, cap);
}

/* The config cached for ALLOC at PATH, into cfg: 0, or the lookup's -errno (a broken one
 * said on a line). */
static int cached(const struct al_found_allocator *alloc, const char *path)
{
    char err[1024];
    int r = _al_config_cache_lookup(alloc->path, path, &cfg, err, sizeof err);
    if (r == -EINVAL)
        fprintf(stderr, "alloclens: ignoring the cached config: %s\n", err);
    return r;
}

int _al_cli_config_for_run(const struct al_found_allocator *alloc, char *path, size_t cap)
{
    char err[1024];
    const char *given = getenv(_al_options[AL_OPT_CONFIG].env);
    if (given && *given) {
        if (_al_config_load(given, &cfg, err, sizeof err) == 0) {
            snprintf(path, cap, "%s", given);
            return 0;
        }
        fprintf(stderr, "alloclens: %s; probing the allocator instead\n", err);
    }
    if (cache_path(alloc->path, path, cap, "running without a config") < 0)
        return -1;
    int r = cached(alloc, path);
    if (r == 0)
        return 0;
    char private[4096];
    if (private_path(alloc->path, private, sizeof private, false) == 0 && cached(alloc, private) == 0) {
        snprintf(path, cap, "%s", private);
        return 0;
    }
    char exe[4096];
    if (probe_exe(exe, sizeof exe) < 0)
        return -1;
    fprintf(stderr, "alloclens: %s %s: probing its size classes once (cached in %s)\n",
            r == -ESTALE ? "the library changed:" : "first run under", alloc->name, path);
    if (_al_prerun_probe(alloc->path, exe, &cfg, false, err, sizeof err) < 0) {
        fprintf(stderr, "alloclens: %s; running without a config\n", err);
        return -1;
    }
    if (_al_prerun_write_config(path, &cfg, true, err, sizeof err) == 0)
        return 0;
    /* The probe's result is this run's all the same, and the next run's. */
    char why[1100];
    snprintf(why, sizeof why, "%s", err);
    if (private_path(alloc->path, private, sizeof private, true) == 0 &&
        _al_prerun_write_config(private, &cfg, true, err, sizeof err) == 0) {
        fprintf(stderr, "alloclens: could not cache the config (%s): kept in %s instead\n", why, private);
        snprintf(path, cap, "%s", private);
        return 0;
    }
    fprintf(stderr, "alloclens: could not cache the config (%s), nor keep it in $TMPDIR; running without "
            "a config\n", why);
    return -1;
}

int _al_cli_cmd_prerun(int argc, char **argv)
{
    const char *alloc_arg = NULL, *out = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            printf("usage: alloclens prerun -a ALLOCATOR [-o FILE]\n\n"
                   "Probes ALLOCATOR (a name from 'alloclens allocators' or a library path) in a child\n"
                   "process and writes what it found: style (bibop or sequential), every size class,\n"
                   "the large-object threshold and the page size, in the format of\n"
                   "docs/config-format.md. Without -o the result goes to the cache 'alloclens run'\n"
                   "reads; -o FILE is replaced whole, so it must be a regular file or not there yet\n"
                   "(a symbolic link's file is replaced, the link kept). The probe's own account of how\n"
                   "sure it is goes to stderr.\n"
                   "\n"
                   "Exit status: 0 when written, 1 when the probe or the write failed, 2 for bad\n"
                   "arguments.\n");
            return 0;
        }
        bool a = !strcmp(argv[i], "-a") || !strcmp(argv[i], "--allocator");
        bool o = !strcmp(argv[i], "-o") || !strcmp(argv[i], "--output");
        if ((a || o) && i + 1 >= argc) {
            fprintf(stderr, "alloclens: option '%s' needs a value\n", argv[i]);
            return 2;
        }
        if (a || o) {
            const char **value = a ? &alloc_arg : &out;
            if (_al_cli_once(argv[i], *value, argv[i + 1]) < 0)
                return 2;
            *value = argv[++i];
        } else {
            fprintf(stderr, "alloclens: prerun: unexpected argument '%s' (see 'alloclens prerun --help')\n", argv[i]);
            return 2;
        }
    }
    if (!alloc_arg) {
        fprintf(stderr, "alloclens: prerun needs -a ALLOCATOR\n");
        return 2;
    }
    struct al_found_allocator alloc;
    char exe[4096], path[4096], err[1024];
    if (_al_cli_resolve_allocator(alloc_arg, &alloc) < 0 || probe_exe(exe, sizeof exe) < 0)
        return 2;
    if (out) {
        if (_al_prerun_output_target(out, path, sizeof path, err, sizeof err) < 0) {
            fprintf(stderr, "alloclens: %s\n", err);
            return 2;
        }
        if (_al_cli_check_writable(path, out, "the config") < 0)
            return 2;
    } else {
        if (cache_path(alloc.path, path, sizeof path, "give -o FILE") < 0)
            return 2;
    }
    double t0 = now_s();
    if (_al_prerun_probe(alloc.path, exe, &cfg, true, err, sizeof err) < 0) {
        fprintf(stderr, "alloclens: %s\n", err);
        return 1;
    }
    if (_al_prerun_write_config(path, &cfg, !out, err, sizeof err) < 0) {
        fprintf(stderr, "alloclens: %s\n", err);
        return 1;
    }
    printf("%s: %s, %u size classes from %llu to %llu bytes, large from %llu bytes, page %llu (%.1f s)\n"
           "written to %s\n",
           alloc.name, _al_config_style_name(cfg.style), cfg.nclasses, (unsigned long long)cfg.classes[0],
           (unsigned long long)cfg.classes[cfg.nclasses - 1], (unsigned long long)cfg.large_threshold,
           (unsigned long long)cfg.page_size, now_s() - t0, out ? out : path);
    return 0;
}
