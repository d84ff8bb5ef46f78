/* Every tunable of the profiler: one row of one table (name, environment variable, default,
 * range, description). The CLI builds its option parsing and help from the same table, and a
 * test checks that the README lists every row. */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "profiler.h"

const struct al_option _al_options[AL_OPT_N] = {
    [AL_OPT_OUTPUT] = { "output", "ALLOCLENS_OUTPUT", AL_OPT_STRING, "", 0, 0,
        "JSON report path; other processes of the run write PATH.<pid>.json beside it "
        "(empty: no JSON)", .written_at_exit = true },
    [AL_OPT_TEXT] = { "text", "ALLOCLENS_TEXT", AL_OPT_STRING, "-", 0, 0,
        "human report of the main process: a file path, '-' for stderr, or 'off'",
        .written_at_exit = true },
    [AL_OPT_LARGE_THRESHOLD] = { "large-threshold", "ALLOCLENS_LARGE_THRESHOLD", AL_OPT_SIZE,
        "131072", 1, 1ll << 40,
        "smallest request (bytes; k/M/G suffixes) counted as a large object; overrides the "
        "allocator's config" },
    [AL_OPT_CONFIG] = { "config", "ALLOCLENS_CONFIG", AL_OPT_STRING, "", 0, 0,
        "allocator description (style, size classes, large threshold) from 'alloclens prerun'; "
        "without one, the cached probe result for the allocator serving the calls (left by 'alloclens run')" },
    [AL_OPT_MODE] = { "mode", "ALLOCLENS_MODE", AL_OPT_STRING, "full", 0, 0,
        "'full': time every call, track every object and its memory waste; 'time': time every "
        "call and tell new addresses from reused ones, no object records or waste; 'sample': op "
        "counts and the allocation-site sampler only, for always-on use" },
    [AL_OPT_SAMPLE_RATE] = { "sample-rate", "ALLOCLENS_SAMPLE_RATE", AL_OPT_SIZE, "524288", 0, 1ll << 40,
        "mean bytes allocated between two sampled allocations (Poisson byte sampling; 0: off)" },
    [AL_OPT_SEED] = { "seed", "ALLOCLENS_SEED", AL_OPT_INT, "0", 0, 1ll << 62,
        "seed of the sampler's random draws, for reproducible runs (0: a fresh seed each run)" },
    [AL_OPT_PPROF] = { "pprof", "ALLOCLENS_PPROF", AL_OPT_STRING, "", 0, 0,
        "also write the sampled sites as a gzipped pprof heap profile (go tool pprof reads it)",
        .written_at_exit = true },
    [AL_OPT_EVENTS] = { "events", "ALLOCLENS_EVENTS", AL_OPT_STRING, "default", 0, 0,
        "events counted per op, comma-separated, any name libpfm4 knows; 'default': instructions, "
        "cache-misses, dTLB-load-misses, page-faults (software events where there is no PMU); "
        "'off': none" },
    [AL_OPT_SAMPLE_EVERY] = { "sample-every", "ALLOCLENS_SAMPLE_EVERY", AL_OPT_INT, "100", 1, 1000000,
        "count events around 1 allocator call in N" },
    [AL_OPT_SYSCALLS] = { "syscalls", "ALLOCLENS_SYSCALLS", AL_OPT_INT, "1", 0, 1,
        "1: count the allocator's own system calls, with syscall user dispatch; 0: off" },
    [AL_OPT_ALLOCATOR] = { "allocator", "ALLOCLENS_ALLOCATOR", AL_OPT_STRING, "", 0, 0,
        "path of the allocator library asked for; the report warns when another one serves "
        "the calls (set by 'alloclens run -a')", true },
    [AL_OPT_MAIN_PID] = { "main-pid", "ALLOCLENS_MAIN_PID", AL_OPT_INT, "0", 0, 1ll << 30,
        "pid whose report is the OUTPUT file itself (0: the first process that loads alloclens; "
        "set by 'alloclens run')", true },
    [AL_OPT_STDERR] = { "stderr", "ALLOCLENS_STDERR", AL_OPT_STRING, "", 0, 0,
        "the stderr 'alloclens run' was started with, as DEVICE:INODE ('closed': none): the human "
        "report goes to fd 2 only while it is that file, in every image exec starts (set by "
        "'alloclens run'; empty: each image's fd 2 as it starts)", true },
    [AL_OPT_EVENT_ATTRS] = { "event-attrs", "ALLOCLENS_EVENT_ATTRS", AL_OPT_STRING, "", 0, 0,
        "the events' perf_event_attr encodings, resolved once with libpfm4 so that profiled "
        "processes need not load it (set by 'alloclens run'; empty: each process resolves them)",
        true },
};

int _al_option_parse_num(const struct al_option *o, const char *text, long long *ret)
{
    if (!text || !*text)
        return -EINVAL;
    const char *p = text;
    while (*p == ' ' || *p == '\t')
        p++;
    if (*p == '-' && strspn(p + 1, "0") == strlen(p + 1) && p[1])
        p += strlen(p) - 1; /* -0 is 0 */
    else if (*p == '-')
        return (p[1] >= '0' && p[1] <= '9') ? -ERANGE : -EINVAL; /* negative: a number, out of range */
    if (*p < '0' || *p > '9')
        return -EINVAL;
    errno = 0;
    char *end;
    unsigned long long v = strtoull(p, &end, 10);
    if (errno == ERANGE)
        return -ERANGE;
    unsigned shift = 0;
    if (o->type == AL_OPT_SIZE) {
        switch (*end) {
        case 'k': case 'K': shift = 10; end++; break;
        case 'm': case 'M': shift = 20; end++; break;
        case 'g': case 'G': shift = 30; end++; break;
        default: break;
        }
        if (shift && (*end == 'i' || *end == 'I') && (end[1] == 'b' || end[1] == 'B'))
            end += 2;
        else if (shift && (*end == 'b' || *end == 'B'))
            end++;
    }
    while (*end == ' ' || *end == '\t') /* blanks around, as before it */
        end++;
    if (*end != '\0')
        return -EINVAL;
    if (shift && v > (ULLONG_MAX >> shift))
        return -ERANGE;
    v <<= shift;
    if (v > (unsigned long long)o->max || (long long)v < o->min)
        return -ERANGE;
    *ret = (long long)v;
    return 0;
}

/* NAME's value in the environment, read from environ itself rather than through getenv: a
 * program may define getenv (bash does, answering from its own variable table), and our
 * settings are read before main, when bash's table holds only what some library's constructor
 * put there with setenv (tcmalloc's does): every other variable would look unset. */
const char *_al_env(const char *name)
{
    return _al_env_in(environ, name);
}

const char *_al_env_in(char *const env[], const char *name)
{
    size_t n = strlen(name);
    for (char *const *e = env; e && *e; e++)
        if (strncmp(*e, name, n) == 0 && (*e)[n] == '=')
            return *e + n + 1;
    return NULL;
}

/* Whether the settings' faults are this process's to leave untold (struct al_settings). */
static bool told;
#define settings_log(...)            \
    do {                             \
        if (!told)                   \
            _al_log(__VA_ARGS__);    \
    } while (0)

static long long num_setting(enum al_opt_id id, bool *given)
{
    *given = false;
    const struct al_option *o = &_al_options[id];
    long long def = 0;
    _al_option_parse_num(o, o->def, &def);
    const char *v = _al_env(o->env);
    if (!v || !*v)
        return def;
    long long val;
    int r = _al_option_parse_num(o, v, &val);
    if (r == 0) {
        *given = true;
        return val;
    }
    if (r == -ERANGE)
        settings_log("%s='%s' is out of range [%lld, %lld]; using the default %s", o->env, v, o->min,
                     o->max, o->def);
    else
        settings_log("%s='%s' is not a number; using the default %s", o->env, v, o->def);
    return def;
}

/* Copied, not kept as the environment's pointer: programs rewrite their environment block
 * (redis sets its process title over it) long before the report is written. */
static const char *str_setting(struct al_settings *s, enum al_opt_id id, size_t cap)
{
    const char *v = _al_env(_al_options[id].env);
    if (!v || !*v)
        v = _al_options[id].def;
    if (!*v)
        return NULL;
    size_t n = strlen(v);
    if (n >= cap || n >= sizeof s->strings - s->strings_used) {
        settings_log("%s is longer than %zu bytes; ignored", _al_options[id].env, cap - 1);
        return NULL;
    }
    char *store = s->strings + s->strings_used;
    memcpy(store, v, n + 1);
    s->strings_used += n + 1;
    return store;
}

/* A report's path as str_setting has it, a relative one taken from the directory the image
 * started in, as `alloclens run` makes its own absolute: a program that changes directory
 * before it exits still writes its report where it was asked to. Left relative where that
 * directory has no name any more (removed) or the two together are too long. */
int _al_path_absolute(const char *path, char *out, size_t cap)
{
    char cwd[PATH_MAX];
    if (path[0] != '/' && (!getcwd(cwd, sizeof cwd) || cwd[0] != '/'))
        return -1;
    int n = path[0] == '/' ? snprintf(out, cap, "%s", path) : snprintf(out, cap, "%s/%s", cwd, path);
    return n < 0 || (size_t)n >= cap ? -ENAMETOOLONG : 0;
}

static const char *path_setting(struct al_settings *s, enum al_opt_id id)
{
    const char *v = str_setting(s, id, AL_SETTING_STRING_MAX);
    if (!v || v[0] == '/' || !strcmp(v, "-") || !strcmp(v, "off"))
        return v;
    char abs[AL_SETTING_STRING_MAX];
    size_t at = (size_t)(v - s->strings), n;
    if (_al_path_absolute(v, abs, sizeof abs) < 0 || at + (n = strlen(abs) + 1) > sizeof s->strings)
        return v;
    memcpy(s->strings + at, abs, n); /* in place of the relative one, the last stored */
    s->strings_used = at + n;
    return s->strings + at;
}

bool _al_same_report_file(const char *x, const char *y)
{
    struct stat sx, sy;
    bool x_there = stat(x, &sx) == 0, y_there = stat(y, &sy) == 0;
    if ((x_there && !S_ISREG(sx.st_mode)) || (y_there && !S_ISREG(sy.st_mode)))
        return false;
    if (strcmp(x, y) == 0)
        return true;
    if (x_there && y_there)
        return sx.st_dev == sy.st_dev && sx.st_ino == sy.st_ino;
    const char *xs = strrchr(x, '/'), *ys = strrchr(y, '/');
    const char *xn = xs ? xs + 1 : x, *yn = ys ? ys + 1 : y;
    if (strcmp(xn, yn) != 0)
        return false;
    char dx[AL_SETTING_STRING_MAX + 2], dy[AL_SETTING_STRING_MAX + 2];
    snprintf(dx, sizeof dx, "%.*s./", (int)(xn - x), x);
    snprintf(dy, sizeof dy, "%.*s./", (int)(yn - y), y);
    return stat(dx, &sx) == 0 && stat(dy, &sy) == 0 && sx.st_dev == sy.st_dev && sx.st_ino == sy.st_ino;
}

static const char *const mode_names[AL_MODE_COUNT] = { "full", "time", "sample" };

const char *_al_mode_name(unsigned mode)
{
    return mode < AL_MODE_COUNT ? mode_names[mode] : "?";
}

int _al_mode_parse(const char *text)
{
    for (unsigned m = 0; text && m < AL_MODE_COUNT; m++)
        if (strcmp(text, mode_names[m]) == 0)
            return (int)m;
    return -1;
}

void _al_settings_load(struct al_settings *s)
{
    s->strings_used = 0;
    bool given;
    told = false;
    s->main_pid = (pid_t)num_setting(AL_OPT_MAIN_PID, &given);
    s->told_already = told = s->main_pid != 0 && s->main_pid != getpid();
    s->output = path_setting(s, AL_OPT_OUTPUT);
    s->text = path_setting(s, AL_OPT_TEXT);
    if (s->text && strcmp(s->text, "off") == 0)
        s->text = NULL;
    if (s->text && s->output && strcmp(s->text, "-") && _al_same_report_file(s->text, s->output)) {
        settings_log("%s and %s name the same file (%s): the text report goes to stderr instead",
                     _al_options[AL_OPT_TEXT].env, _al_options[AL_OPT_OUTPUT].env, s->text);
        s->text = "-";
    }
    s->large_threshold = (uint64_t)num_setting(AL_OPT_LARGE_THRESHOLD, &s->large_threshold_set);
    s->config = str_setting(s, AL_OPT_CONFIG, AL_SETTING_STRING_MAX);
    s->allocator = str_setting(s, AL_OPT_ALLOCATOR, AL_SETTING_STRING_MAX);
    s->pprof = path_setting(s, AL_OPT_PPROF);
    /* As the text above: the one read later gives way, here the profile. */
    for (int i = 0; i < 2 && s->pprof; i++) {
        const char *other = i == 0 ? s->output : s->text;
        if (other && strcmp(other, "-") && _al_same_report_file(s->pprof, other)) {
            settings_log("%s and %s name the same file (%s): no pprof profile is written",
                         _al_options[AL_OPT_PPROF].env, _al_options[i == 0 ? AL_OPT_OUTPUT : AL_OPT_TEXT].env,
                         s->pprof);
            s->pprof = NULL;
        }
    }
    s->sample_rate = (uint64_t)num_setting(AL_OPT_SAMPLE_RATE, &given);
    s->events = str_setting(s, AL_OPT_EVENTS, AL_SETTING_EVENTS_MAX);
    s->sample_every = (unsigned)num_setting(AL_OPT_SAMPLE_EVERY, &given);
    s->syscalls = num_setting(AL_OPT_SYSCALLS, &given) != 0;
    s->seed = (uint64_t)num_setting(AL_OPT_SEED, &given);
    const char *mode = _al_env(_al_options[AL_OPT_MODE].env);
    int m = _al_mode_parse(mode);
    s->mode = m < 0 ? AL_MODE_FULL : (enum al_mode)m;
    if (mode && *mode && m < 0)
        settings_log("%s='%s' is none of 'full', 'time' or 'sample'; using the default full",
                     _al_options[AL_OPT_MODE].env, mode);
    s->event_attrs = str_setting(s, AL_OPT_EVENT_ATTRS, AL_SETTING_STRING_MAX);
    s->stderr_id = str_setting(s, AL_OPT_STDERR, 64);
    const char *preload = _al_env("LD_PRELOAD");
    s->under_valgrind = preload && strstr(preload, "/vgpreload_core-");
}
