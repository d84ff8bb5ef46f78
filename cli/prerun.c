/* alloclens prerun, and the config 'alloclens run' hands to the library: an explicit
 * --config / ALLOCLENS_CONFIG, else the cached probe result for the allocator, else a fresh
 * probe (said on one stderr line, cached for next time). A broken config is reported as
 * FILE:LINE: what is wrong, and the probe runs instead; a failed probe leaves the run to the
 * default threshold, never stops it. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

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

/* The cache file for the allocator library LIB, where this user's environment puts caches. */
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
    int r = _al_config_cache_lookup(alloc->path, path, &cfg, err, sizeof err);
    if (r == 0)
        return 0;
    if (r == -EINVAL)
        fprintf(stderr, "alloclens: ignoring the cached config: %s\n", err);
    char exe[4096];
    if (probe_exe(exe, sizeof exe) < 0)
        return -1;
    fprintf(stderr, "alloclens: %s %s: probing its size classes once (cached in %s)\n",
            r == -ESTALE ? "the library changed:" : "first run under", alloc->name, path);
    if (_al_prerun_probe(alloc->path, exe, &cfg, false, err, sizeof err) < 0 ||
        _al_prerun_write_config(path, &cfg, true, err, sizeof err) < 0) {
        fprintf(stderr, "alloclens: %s; running without a config\n", err);
        return -1;
    }
    return 0;
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
