/* alloclens run: put liballoclens.so and the chosen allocator in front of a command and
 * exec it in place, so its stdin, stdout, stderr, signals and exit status are its own. The
 * report is written by the library when the program exits. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli.h"
#include "profiler.h"

static void run_usage(FILE *f)
{
    fprintf(f,
            "usage: alloclens run [-a ALLOCATOR] [-o REPORT.json] [options] -- CMD [ARGS...]\n"
            "\n"
            "Runs CMD with alloclens in front of ALLOCATOR and prints the report on stderr when\n"
            "it exits. CMD's output, signals and exit status are its own. Processes CMD forks\n"
            "or execs write REPORT.<pid>.json beside REPORT.json.\n"
            "\n"
            "  -a, --allocator NAME|PATH   glibc (default), jemalloc, tcmalloc, mimalloc, or the\n"
            "                              path of any shared library that exports malloc\n"
            "  -o, --output FILE           also write the JSON report to FILE\n");
    for (int i = 0; i < AL_OPT_N; i++) {
        const struct al_option *o = &_al_options[i];
        if (o->set_by_run || i == AL_OPT_OUTPUT)
            continue;
        fprintf(f, "      --%-22s %s (default '%s'; env %s)\n", o->name, o->desc, o->def, o->env);
    }
    fprintf(f, "  -h, --help                  this text\n"
               "\nEvery option is also an environment variable for direct use (empty: its default):\n"
               "  LD_PRELOAD=liballoclens.so ALLOCLENS_OUTPUT=r.json CMD\n"
               "\nExit status: CMD's own (run becomes CMD: a signal that ends CMD ends it), 127 when\n"
               "CMD is not found, 126 when it cannot be run, 2 for bad arguments (nothing runs).\n");
}

/* The options table as the README shows it (a test keeps the two identical). */
int _al_cli_cmd_options(int argc, char **argv)
{
    if (argc > 1 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))) {
        printf("usage: alloclens options\n\nPrints the table of every tunable as the README shows it: its\n"
               "environment variable, the run flag that sets it, its default, range and meaning.\n");
        return 0;
    }
    if (argc > 1) {
        fprintf(stderr, "alloclens: 'options' takes no arguments\n");
        return 2;
    }
    printf("| variable | run flag | default | range | description |\n|---|---|---|---|---|\n");
    for (int i = 0; i < AL_OPT_N; i++) {
        const struct al_option *o = &_al_options[i];
        char range[64] = "text";
        if (o->type != AL_OPT_STRING)
            snprintf(range, sizeof range, "%lld..%lld", o->min, o->max);
        char flag[64] = "(set by run)";
        if (!o->set_by_run)
            snprintf(flag, sizeof flag, "`--%s`", o->name);
        printf("| `%s` | %s | `%s` | %s | %s |\n", o->env, flag, o->def, range, o->desc);
    }
    return 0;
}

static const struct al_option *find_option(const char *name, size_t len)
{
    for (int i = 0; i < AL_OPT_N; i++) {
        const struct al_option *o = &_al_options[i];
        if (!o->set_by_run && strlen(o->name) == len && strncmp(o->name, name, len) == 0)
            return o;
    }
    return NULL;
}

/* A path the program's processes open, after they may have changed directory: absolute. */
static int absolute(const struct al_option *o, const char *path, char *out, size_t cap)
{
    int r = _al_path_absolute(path, out, cap);
    if (r == -ENAMETOOLONG)
        fprintf(stderr, "alloclens: --%s %s: the path is too long\n", o->name, path);
    else if (r < 0)
        fprintf(stderr, "alloclens: --%s %s: the current directory's name is lost (%s): give an "
                "absolute path\n", o->name, path, strerror(errno));
    return r < 0 ? -1 : 0;
}

static int set_value(const struct al_option *o, const char *value)
{
    if (o == &_al_options[AL_OPT_MODE] && _al_cli_check_mode(value) < 0)
        return -1;
    if (o->type != AL_OPT_STRING) {
        long long v;
        int r = _al_option_parse_num(o, value, &v);
        char shown[256];
        if (r == -ERANGE) {
            fprintf(stderr, "alloclens: --%s %s is out of range [%lld, %lld]\n", o->name,
                    _al_cli_escaped(value, shown, sizeof shown), o->min, o->max);
            return -1;
        }
        if (r < 0) {
            fprintf(stderr, "alloclens: --%s wants a number, not '%s'\n", o->name,
                    _al_cli_escaped(value, shown, sizeof shown));
            return -1;
        }
    }
    char abs[PATH_MAX];
    /* '' (not written, or the default), '-' (stderr) and 'off' are not paths. */
    bool path = o->written_at_exit || o == &_al_options[AL_OPT_CONFIG];
    if (path && value[0] && strcmp(value, "-") && strcmp(value, "off")) {
        if (absolute(o, value, abs, sizeof abs) < 0 ||
            (o->written_at_exit && _al_cli_check_writable(abs, value, "the report") < 0))
            return -1;
        value = abs;
    }
    setenv(o->env, value, 1);
    return 0;
}

/* Events named by the user (--events or ALLOCLENS_EVENTS, as SOURCE names it) that libpfm4
 * does not know: said once here, before anything runs, rather than by every process of the
 * run. */
static int check_events(const char *source)
{
    const char *events = getenv(_al_options[AL_OPT_EVENTS].env);
    if (!events || !*events || !strcmp(events, "off") || !strcmp(events, "default"))
        return 0;
    char name[sizeof ((struct al_event *)0)->name], err[192];
    bool too_long;
    int r = 0;
    for (const char *p = events; r == 0 && _al_event_next_name(&p, name, sizeof name, &too_long);) {
        struct perf_event_attr attr;
        if (too_long)
            snprintf(err, sizeof err, "event name '%s...' is too long", name);
        if (too_long || _al_event_resolve(name, &attr, err, sizeof err) != 0) {
            char shown[256];
            fprintf(stderr, "alloclens: %s: %s\n", source, _al_cli_escaped(err, shown, sizeof shown));
            r = -1;
        }
    }
    _al_event_names_done();
    return r;
}

/* The events named once here, with libpfm4, for every process of the run (see event_names.c). */
static void resolve_events_ahead(void)
{
    const char *events = getenv(_al_options[AL_OPT_EVENTS].env);
    const char *mode = getenv(_al_options[AL_OPT_MODE].env);
    static char attrs[AL_SETTING_STRING_MAX];
    if ((events && strcmp(events, "off") == 0) || _al_mode_parse(mode) == AL_MODE_SAMPLE ||
        _al_counters_resolve_ahead(events, attrs, sizeof attrs) == 0)
        unsetenv(_al_options[AL_OPT_EVENT_ATTRS].env); /* nothing to count, or nothing resolved */
    else
        setenv(_al_options[AL_OPT_EVENT_ATTRS].env, attrs, 1);
}

static int exec_profiled(const struct al_found_allocator *alloc, char **cmd, const char *events_source)
{
    if (check_events(events_source) < 0)
        return 2;
    const char *unreachable = _al_preload_unreachable(cmd[0], true);
    if (unreachable)
        fprintf(stderr, "alloclens: %s %s, so it runs unprofiled and writes no report\n", cmd[0],
                unreachable);
    char lib[PATH_MAX];
    if (_al_cli_sibling("../interpose/liballoclens.so", "liballoclens.so", lib, sizeof lib) < 0) {
        fprintf(stderr, "alloclens: cannot find liballoclens.so (looked beside this command and in %s)\n", lib);
        return 2;
    }
    if (strpbrk(lib, AL_PRELOAD_SEPARATORS)) {
        fprintf(stderr, "alloclens: liballoclens.so is %s, a path LD_PRELOAD cannot name (the loader "
                "splits it at spaces and colons): build or install alloclens elsewhere\n", lib);
        return 2;
    }
    const char *old = getenv("LD_PRELOAD");
    size_t len = strlen(lib) + strlen(alloc->path) + (old ? strlen(old) : 0) + 3;
    char *preload = malloc(len);
    if (!preload)
        return 2;
    snprintf(preload, len, "%s %s%s%s", lib, alloc->path, old && *old ? " " : "", old && *old ? old : "");
    setenv("LD_PRELOAD", preload, 1);
    setenv(_al_options[AL_OPT_ALLOCATOR].env, alloc->path, 1);
    char config[4096];
    /* A program the preload does not reach needs no config: no probe for it. */
    if (!unreachable && _al_cli_config_for_run(alloc, config, sizeof config) == 0)
        setenv(_al_options[AL_OPT_CONFIG].env, config, 1);
    else
        unsetenv(_al_options[AL_OPT_CONFIG].env);
    char pid[24];
    snprintf(pid, sizeof pid, "%d", (int)getpid());
    setenv(_al_options[AL_OPT_MAIN_PID].env, pid, 1);
    /* The stderr the text report is for, whatever the program later puts on fd 2 and execs. */
    struct stat st;
    char id[64] = "closed";
    if (fstat(STDERR_FILENO, &st) == 0)
        snprintf(id, sizeof id, "%llu:%llu", (unsigned long long)st.st_dev, (unsigned long long)st.st_ino);
    setenv(_al_options[AL_OPT_STDERR].env, id, 1);
    resolve_events_ahead();
    execvp(cmd[0], cmd);
    int e = errno;
    fprintf(stderr, "alloclens: cannot run %s: %s\n", cmd[0], strerror(e));
    return e == ENOENT ? 127 : 126;
}

/* Two reports asked into one file would leave only the one written last: said at once, naming
 * each by its flag or, where GIVEN has no value for it, by the variable it was inherited in. An
 * inherited value may be relative (set_value makes only the flags' absolute): it is taken from
 * here, as the profiled process will take it. */
static int same_report_paths(const char *const given[AL_OPT_N])
{
    static const enum al_opt_id ids[] = { AL_OPT_OUTPUT, AL_OPT_TEXT, AL_OPT_PPROF };
    const size_t n = sizeof ids / sizeof ids[0];
    char abs[3][PATH_MAX];
    const char *path[3];
    for (size_t a = 0; a < n; a++) {
        const char *v = getenv(_al_options[ids[a]].env);
        path[a] = NULL;
        /* '' (not written), '-' (stderr) and 'off' are not paths. */
        if (v && v[0] && strcmp(v, "-") && strcmp(v, "off") &&
            _al_path_absolute(v, abs[a], sizeof abs[a]) == 0)
            path[a] = abs[a];
    }
    for (size_t a = 0; a < n; a++) {
        for (size_t b = a + 1; b < n; b++) {
            if (path[a] && path[b] && _al_same_report_file(path[a], path[b])) {
                char name[2][64], shown[PATH_MAX];
                for (int k = 0; k < 2; k++) {
                    const struct al_option *o = &_al_options[ids[k ? b : a]];
                    snprintf(name[k], sizeof name[k], given[o - _al_options] ? "--%s" : "%s",
                             given[o - _al_options] ? o->name : o->env);
                }
                fprintf(stderr, "alloclens: %s and %s name the same file (%s): one report would "
                        "overwrite the other\n", name[0], name[1],
                        _al_cli_escaped(path[b], shown, sizeof shown));
                return -1;
            }
        }
    }
    return 0;
}

/* Which of run's options A is: the allocator's (*IS_ALLOC) or a row of the options table (*O),
 * with its value where A carries it after '=' (*VALUE); false for none of them. */
static bool run_option(const char *a, bool *is_alloc, const struct al_option **o, const char **value)
{
    *is_alloc = false;
    *o = NULL;
    *value = NULL;
    if (!strcmp(a, "-a") || !strcmp(a, "--allocator")) {
        *is_alloc = true;
    } else if (!strncmp(a, "--allocator=", 12)) {
        *is_alloc = true;
        *value = a + 12;
    } else if (!strcmp(a, "-o")) {
        *o = &_al_options[AL_OPT_OUTPUT];
    } else if (a[0] == '-' && a[1] == '-') {
        const char *eq = strchr(a + 2, '=');
        size_t len = eq ? (size_t)(eq - (a + 2)) : strlen(a + 2);
        *o = find_option(a + 2, len);
        if (eq)
            *value = eq + 1;
    }
    return *is_alloc || *o;
}

static bool is_run_option(const char *a)
{
    bool is_alloc;
    const struct al_option *o;
    const char *value;
    return !strcmp(a, "-h") || !strcmp(a, "--help") || run_option(a, &is_alloc, &o, &value);
}

int _al_cli_cmd_run(int argc, char **argv)
{
    const char *alloc_arg = "glibc";
    const char *alloc_given = NULL, *given[AL_OPT_N] = { NULL }; /* each option's value */
    int i = 1;
    for (; i < argc; i++) {
        char *a = argv[i];
        if (!strcmp(a, "--"))  {
            i++;
            break;
        }
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            run_usage(stdout);
            return 0;
        }
        if (a[0] != '-')
            break;
        const char *value;
        const struct al_option *o;
        bool is_alloc;
        if (!run_option(a, &is_alloc, &o, &value)) {
            char shown[256];
            fprintf(stderr, "alloclens: unknown option '%s' (see 'alloclens run --help')\n",
                    _al_cli_escaped(a, shown, sizeof shown));
            return 2;
        }
        if (!value) {
            if (i + 1 >= argc) {
                fprintf(stderr, "alloclens: option '%s' needs a value\n", a);
                return 2;
            }
            value = argv[++i];
            if (_al_cli_value_given(a, value, is_run_option(value)) < 0)
                return 2;
        }
        const char **before = is_alloc ? &alloc_given : &given[o - _al_options];
        if (_al_cli_once(a, *before, value) < 0)
            return 2;
        *before = value;
        if (is_alloc)
            alloc_arg = value;
        else if (set_value(o, value) < 0)
            return 2;
    }
    if (i >= argc) {
        fprintf(stderr, "alloclens: no command to run (usage: alloclens run [options] -- CMD [ARGS...])\n");
        return 2;
    }
    if (same_report_paths(given) < 0)
        return 2;
    struct al_found_allocator alloc;
    if (_al_cli_resolve_allocator(alloc_arg, &alloc) < 0)
        return 2;
    return exec_profiled(&alloc, argv + i, given[AL_OPT_EVENTS] ? "--events" : _al_options[AL_OPT_EVENTS].env);
}
