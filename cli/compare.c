/* alloclens compare: the same workload under several allocators, a side-by-side table of what
 * each one's reports say (medians over the runs), and what switching from the first to each
 * of the others would change, next to the run-to-run spread that tells a change from noise.
 * Each run is an `alloclens run` of this very command writing its JSON report to a temporary
 * directory; the reports are read back with json-c. `alloclens demo` is the same for the
 * bundled workload, one run each, with every run's own report shown too. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <json-c/json.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cli.h"
#include "profiler.h"

#define MAX_COMPARED 8
#define MAX_RUNS 50

/* What one report says, as the table shows it. NAN: the report has no such figure (memory
 * waste outside --mode full). */
enum metric {
    M_CALLS,
    M_ALLOC_NS,      /* time inside the allocator */
    M_ALLOC_SHARE,   /* ... against the run time, percent: summed over threads, it can pass 100 */
    M_NS_ALLOC_CALL, /* mean per allocating call (all ops but free and delete) */
    M_NS_FREE_CALL,  /* mean per free and delete */
    M_HEAP,          /* resident heap at the peak */
    M_REQUESTED,
    M_INTERNAL,
    M_BLOWUP,
    M_EXTERNAL,
    M_SYSCALLS,      /* the allocator's own system calls */
    M_RUNTIME_NS,    /* the program's run time, profiled */
    M_N
};

static const struct {
    const char *key;   /* in the comparison's JSON */
    const char *label; /* in the table */
    char unit;         /* n: count, t: nanoseconds, b: bytes, p: percent */
} metrics[M_N] = {
    [M_CALLS] = { "calls", "calls", 'n' },
    [M_ALLOC_NS] = { "allocator_time_ns", "time in the allocator", 't' },
    [M_ALLOC_SHARE] = { "allocator_time_percent", "  / run time (all thr.)", 'p' },
    [M_NS_ALLOC_CALL] = { "ns_per_alloc_call", "  per allocating call", 't' },
    [M_NS_FREE_CALL] = { "ns_per_free_call", "  per free/delete", 't' },
    [M_HEAP] = { "peak_heap_bytes", "heap at peak", 'b' },
    [M_REQUESTED] = { "peak_requested_bytes", "  requested (live)", 'b' },
    [M_INTERNAL] = { "peak_internal_fragmentation_bytes", "  internal frag.", 'b' },
    [M_BLOWUP] = { "peak_blowup_bytes", "  blowup", 'b' },
    [M_EXTERNAL] = { "peak_external_fragmentation_bytes", "  external frag.", 'b' },
    [M_SYSCALLS] = { "allocator_syscalls", "allocator syscalls", 'n' },
    [M_RUNTIME_NS] = { "runtime_ns", "run time (profiled)", 't' },
};

struct compared {
    struct al_found_allocator alloc;
    bool by_path; /* another allocator compared has the same name: labelled by its path */
    char label[PATH_MAX + 72];
    int nruns; /* runs with a report */
    double run[MAX_RUNS][M_N];
    double median[M_N], spread[M_N]; /* spread: (max - min) / median */
    bool failed;
};

static void usage(FILE *f)
{
    fprintf(f,
            "usage: alloclens compare [-a A,B,...] [-n RUNS] [-o COMPARISON.json] [--mode MODE] -- CMD [ARGS...]\n"
            "\n"
            "Runs CMD under each allocator, RUNS times each, taking turns, and prints a table of\n"
            "the medians of what their reports say: calls, time inside the allocator (summed over\n"
            "threads), cost per call, the heap and its waste at the peak, the allocator's system\n"
            "calls; then what switching from the first allocator to each of the others would\n"
            "change. The figures are those of CMD's own process (not of processes it starts).\n"
            "CMD runs several times, so its stdin is /dev/null; its stdout and stderr are its own.\n"
            "\n"
            "  -a, --allocators LIST   comma-separated names or library paths (default: every\n"
            "                          allocator found, as 'alloclens allocators' lists them)\n"
            "  -n, --runs N            runs under each allocator, 1..%d (default 3)\n"
            "  -o, --output FILE       also write the comparison as JSON (every run's figures)\n"
            "      --mode MODE         full (default), time or sample, as for 'alloclens run';\n"
            "                          memory waste is measured in full mode only\n"
            "  -h, --help              this text\n"
            "\n"
            "Exit status: 0 when every run wrote its report, 1 when some did not (they are left\n"
            "out of the table and named on stderr), 2 for bad arguments, 127 when CMD is not\n"
            "found and 126 when it cannot be run (compare stops at the first such run). A run\n"
            "whose command ends with another status than 0 is named on stderr, its figures kept.\n"
            "\n"
            "SIGINT, SIGTERM, SIGHUP or SIGQUIT stops it: no further run starts, the run in\n"
            "progress ends (SIGTERM is passed on to it), the temporary directory ($TMPDIR or /tmp)\n"
            "is removed, and compare ends by that signal, with no table.\n",
            MAX_RUNS);
}

/* C's name in the table and on stderr: its name (its path where two compared share a name),
 * and its version once a report of it tells the allocator's own. */
static void make_label(struct compared *c)
{
    const char *who = c->by_path ? c->alloc.path : c->alloc.name;
    if (c->alloc.version[0])
        snprintf(c->label, sizeof c->label, "%s %s", who, c->alloc.version);
    else
        snprintf(c->label, sizeof c->label, "%s", who);
}

/* The version the allocator gave its report, where the report is about the library C names. */
static void take_version(struct compared *c, json_object *r)
{
    json_object *a = _al_cli_get(r, "allocator");
    const char *v = _al_cli_str(a, "version");
    char mine[PATH_MAX], theirs[PATH_MAX];
    if (*v && strcmp(v, c->alloc.version) && realpath(c->alloc.path, mine) &&
        realpath(_al_cli_str(a, "path"), theirs) && !strcmp(mine, theirs)) {
        snprintf(c->alloc.version, sizeof c->alloc.version, "%s", v);
        make_label(c);
    }
}

/* One report's figures (and C's version, as the allocator gives it); false when it cannot be
 * read. */
static bool read_report(const char *path, struct compared *c, double m[M_N], char *why, size_t cap)
{
    char e[256];
    json_object *r = _al_cli_read_report(path, e, sizeof e);
    if (!r) {
        snprintf(why, cap, "no readable report (%s)", e);
        return false;
    }
    for (int k = 0; k < M_N; k++)
        m[k] = NAN;
    double calls = 0, timed[2] = { 0, 0 }, cycles[2] = { 0, 0 };
    json_object *ops = _al_cli_get(r, "ops");
    for (size_t i = 0; i < _al_cli_len(ops); i++) {
        json_object *row = json_object_array_get_idx(ops, i);
        const char *op = _al_cli_str(row, "op");
        int frees = !strcmp(op, "free") || !strcmp(op, "delete");
        calls += _al_cli_num(row, "count");
        timed[frees] += _al_cli_num(row, "timed");
        cycles[frees] += _al_cli_num(row, "cycles_total");
    }
    m[M_CALLS] = calls;
    double per_ns = _al_cli_num(_al_cli_get(r, "timing"), "cycles_per_ns");
    for (int k = 0; k < 2; k++)
        if (timed[k] > 0 && per_ns > 0)
            m[k ? M_NS_FREE_CALL : M_NS_ALLOC_CALL] = cycles[k] / timed[k] / per_ns;
    m[M_ALLOC_NS] = _al_cli_num(r, "allocator_time_ns");
    m[M_RUNTIME_NS] = _al_cli_num(_al_cli_get(r, "program"), "runtime_ns");
    if (m[M_RUNTIME_NS] > 0 && m[M_ALLOC_NS] >= 0)
        m[M_ALLOC_SHARE] = 100.0 * m[M_ALLOC_NS] / m[M_RUNTIME_NS];
    json_object *mem = _al_cli_get(r, "memory");
    if (_al_cli_available(mem)) {
        json_object *peak = _al_cli_get(mem, "peak");
        m[M_HEAP] = _al_cli_num(peak, "total_bytes");
        m[M_REQUESTED] = _al_cli_num(peak, "live_requested_bytes");
        m[M_INTERNAL] = _al_cli_num(peak, "internal_fragmentation_bytes");
        m[M_BLOWUP] = _al_cli_num(peak, "blowup_bytes");
        m[M_EXTERNAL] = _al_cli_num(peak, "external_fragmentation_bytes");
    }
    json_object *sys = _al_cli_get(r, "syscalls");
    /* None counted (--mode sample, no syscall user dispatch) is no figure, not 0 calls. */
    if (sys && json_object_get_type(sys) == json_type_array && _al_cli_available(_al_cli_get(r, "syscalls_info"))) {
        double n = 0;
        for (size_t i = 0; i < _al_cli_len(sys); i++)
            n += _al_cli_num(json_object_array_get_idx(sys, i), "count");
        m[M_SYSCALLS] = n;
    }
    take_version(c, r);
    json_object_put(r);
    return true;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static void summarize(struct compared *c)
{
    for (int k = 0; k < M_N; k++) {
        double v[MAX_RUNS];
        int n = 0;
        for (int i = 0; i < c->nruns; i++)
            if (!isnan(c->run[i][k]))
                v[n++] = c->run[i][k];
        if (!n) {
            c->median[k] = c->spread[k] = NAN;
            continue;
        }
        qsort(v, (size_t)n, sizeof *v, cmp_double);
        c->median[k] = n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
        c->spread[k] = c->median[k] != 0 ? (v[n - 1] - v[0]) / fabs(c->median[k]) : 0;
    }
}

static void format(char *out, size_t cap, double v, char unit)
{
    if (isnan(v)) {
        snprintf(out, cap, "n/a");
    } else if (unit == 'n') {
        snprintf(out, cap, "%.0f", v);
    } else if (unit == 'p') {
        snprintf(out, cap, "%.1f%%", v);
    } else if (unit == 't') {
        double a = fabs(v);
        if (a >= 1e9)
            snprintf(out, cap, "%.2f s", v / 1e9);
        else if (a >= 1e6)
            snprintf(out, cap, "%.1f ms", v / 1e6);
        else if (a >= 1e3)
            snprintf(out, cap, "%.1f us", v / 1e3);
        else
            snprintf(out, cap, "%.1f ns", v);
    } else {
        _al_cli_bytes(out, cap, v);
    }
}

/* A signal that asks compare to stop (Ctrl-C, kill, a closed terminal): no further run starts,
 * the one in progress ends, the temporary directory goes, and compare ends by that signal.
 * SIGTERM is passed on to the run, as make does; the terminal sends the others to the whole
 * process group already, and a second one could cut the program's own clean-up short. */
static const int stop_signals[] = { SIGHUP, SIGINT, SIGQUIT, SIGTERM };
static volatile sig_atomic_t stop_signal;
static volatile pid_t running; /* the run in progress, 0 between runs */

static void on_stop(int sig)
{
    stop_signal = sig;
    if (sig == SIGTERM && running > 0)
        kill(running, sig);
}

/* Our handler for each stop signal the shell did not leave ignored (nohup, a background job). */
static void catch_stop_signals(void)
{
    struct sigaction a = { .sa_handler = on_stop }, cur;
    sigfillset(&a.sa_mask);
    for (size_t i = 0; i < sizeof stop_signals / sizeof *stop_signals; i++)
        if (sigaction(stop_signals[i], NULL, &cur) == 0 && cur.sa_handler != SIG_IGN)
            sigaction(stop_signals[i], &a, NULL);
}

/* The stop signals blocked; the mask as it was. */
static sigset_t block_stop_signals(void)
{
    sigset_t set, old;
    sigemptyset(&set);
    for (size_t i = 0; i < sizeof stop_signals / sizeof *stop_signals; i++)
        sigaddset(&set, stop_signals[i]);
    sigprocmask(SIG_BLOCK, &set, &old);
    return old;
}

static void stop_signals_default(void)
{
    for (size_t i = 0; i < sizeof stop_signals / sizeof *stop_signals; i++) {
        struct sigaction cur;
        if (sigaction(stop_signals[i], NULL, &cur) == 0 && cur.sa_handler == on_stop)
            signal(stop_signals[i], SIG_DFL);
    }
}

/* Runs `alloclens run` for C once, its report to PATH; its wait status, or -1. */
static int run_once(const char *self, const struct compared *c, const char *mode, char **cmd,
                    const char *path, bool show_report)
{
    /* Blocked until the child is known, so that a SIGTERM now reaches it too; the child starts
     * with the defaults. */
    sigset_t old = block_stop_signals();
    pid_t pid = fork();
    if (pid == 0)
        stop_signals_default();
    else if (pid > 0)
        running = pid;
    sigprocmask(SIG_SETMASK, &old, NULL);
    if (pid < 0)
        return -1;
    if (pid == 0) {
        int null = open("/dev/null", O_RDONLY | O_CLOEXEC);
        if (null < 0 || dup2(null, 0) < 0)
            _exit(127);
        int n = 0;
        while (cmd[n])
            n++;
        char **args = calloc((size_t)n + 14, sizeof *args);
        if (!args)
            _exit(127);
        int k = 0;
        args[k++] = (char *)self;
        args[k++] = "run";
        args[k++] = "-a";
        args[k++] = (char *)c->alloc.path;
        args[k++] = "-o";
        args[k++] = (char *)path;
        args[k++] = "--text";
        args[k++] = show_report ? "-" : "off";
        if (mode) {
            args[k++] = "--mode";
            args[k++] = (char *)mode;
        }
        args[k++] = "--";
        for (int i = 0; i < n; i++)
            args[k++] = cmd[i];
        execv(self, args);
        _exit(127);
    }
    int status;
    while (waitpid(pid, &status, 0) < 0)
        if (errno != EINTR) {
            running = 0;
            return -1;
        }
    running = 0;
    return status;
}

/* Whether the run that ended with STATUS found CMD missing (127) or not executable (126), as
 * 'alloclens run' exits then, having said so on its line: it then wrote no report to PATH
 * (CMD exiting 126 or 127 itself writes one). No later run would fare better, so compare ends
 * there with that status, as a shell does. */
static bool cannot_run(int status, const char *path)
{
    return WIFEXITED(status) && (WEXITSTATUS(status) == 126 || WEXITSTATUS(status) == 127) &&
           access(path, F_OK) != 0;
}

static void describe_status(int status, char *out, size_t cap)
{
    if (status < 0)
        snprintf(out, cap, "not started");
    else if (WIFEXITED(status))
        snprintf(out, cap, "exit status %d", WEXITSTATUS(status));
    else
        snprintf(out, cap, "killed by signal %d", WTERMSIG(status));
}

static void print_table(struct compared *cs, int n, int runs, char **cmd)
{
    printf("alloclens compare:");
    for (char **a = cmd; *a; a++)
        printf(" %s", *a);
    printf("\n(%d run%s under each allocator, medians; 'spread' is (max - min) / median of the time\n"
           "in the allocator)\n\n", runs, runs == 1 ? "" : "s");
    /* Columns as wide as the longest label: labels are told apart by their ends too (two
     * libraries of one name, labelled by their paths). */
    int w = 16;
    for (int i = 0; i < n; i++)
        if ((int)strlen(cs[i].label) > w)
            w = (int)strlen(cs[i].label);
    printf("%-24s", "");
    for (int i = 0; i < n; i++)
        printf(" %*s", w, cs[i].label);
    printf("\n");
    for (int k = 0; k < M_N; k++) {
        printf("%-24s", metrics[k].label);
        for (int i = 0; i < n; i++) {
            char v[32];
            format(v, sizeof v, cs[i].failed ? NAN : cs[i].median[k], metrics[k].unit);
            printf(" %*s", w, v);
        }
        printf("\n");
    }
    printf("%-24s", "spread");
    for (int i = 0; i < n; i++) {
        char v[32];
        format(v, sizeof v, cs[i].failed ? NAN : 100 * cs[i].spread[M_ALLOC_NS], 'p');
        printf(" %*s", w, v);
    }
    printf("\n");
}

/* The change from the first allocator to each other one: time inside the allocator, and the
 * resident heap at the peak where both runs measured it. A change of time within the larger
 * of the two spreads is called noise. */
static void print_switching(struct compared *cs, int n)
{
    const struct compared *b = &cs[0];
    if (n < 2 || b->failed)
        return;
    printf("\nswitching from %s:\n", b->label);
    for (int i = 1; i < n; i++) {
        const struct compared *c = &cs[i];
        if (c->failed) {
            printf("  to %s: no runs to compare\n", c->label);
            continue;
        }
        char d[32];
        double dt = c->median[M_ALLOC_NS] - b->median[M_ALLOC_NS];
        format(d, sizeof d, dt, 't');
        if (isnan(dt)) { /* a run that timed no call: --mode sample */
            printf("  to %s: time in the allocator n/a (not timed)", c->label);
        } else {
            printf("  to %s: %s%s in the allocator", c->label, dt > 0 ? "+" : "", d);
            if (b->median[M_ALLOC_NS] > 0)
                printf(" (%+.1f%%)", 100 * dt / b->median[M_ALLOC_NS]);
            double noise = fmax(b->spread[M_ALLOC_NS], c->spread[M_ALLOC_NS]) * b->median[M_ALLOC_NS];
            if (fabs(dt) <= noise)
                printf(" [within the spread: noise]");
        }
        double dh = c->median[M_HEAP] - b->median[M_HEAP];
        if (!isnan(dh)) {
            format(d, sizeof d, dh, 'b');
            printf(", %s%s heap at peak", dh > 0 ? "+" : "", d);
            if (b->median[M_HEAP] > 0)
                printf(" (%+.1f%%)", 100 * dh / b->median[M_HEAP]);
        }
        printf("\n");
    }
}

static int write_json(const char *path, struct compared *cs, int n, int runs, const char *mode, char **cmd)
{
    json_object *root = json_object_new_object();
    json_object *argv = json_object_new_array();
    for (char **a = cmd; *a; a++)
        json_object_array_add(argv, json_object_new_string(*a));
    json_object_object_add(root, "command", argv);
    json_object_object_add(root, "mode", json_object_new_string(mode ? mode : "full"));
    json_object_object_add(root, "runs", json_object_new_int(runs));
    json_object_object_add(root, "baseline", json_object_new_string(cs[0].alloc.name));
    json_object *list = json_object_new_array();
    for (int i = 0; i < n; i++) {
        json_object *a = json_object_new_object();
        json_object_object_add(a, "name", json_object_new_string(cs[i].alloc.name));
        json_object_object_add(a, "path", json_object_new_string(cs[i].alloc.path));
        json_object_object_add(a, "version", cs[i].alloc.version[0] ? json_object_new_string(cs[i].alloc.version) : NULL);
        json_object_object_add(a, "runs_with_report", json_object_new_int(cs[i].nruns));
        json_object *med = json_object_new_object(), *spread = json_object_new_object();
        json_object *each = json_object_new_array();
        for (int k = 0; k < M_N; k++) {
            json_object_object_add(med, metrics[k].key,
                                   isnan(cs[i].median[k]) ? NULL : json_object_new_double(cs[i].median[k]));
            json_object_object_add(spread, metrics[k].key,
                                   isnan(cs[i].spread[k]) ? NULL : json_object_new_double(cs[i].spread[k]));
        }
        for (int r = 0; r < cs[i].nruns; r++) {
            json_object *one = json_object_new_object();
            for (int k = 0; k < M_N; k++)
                json_object_object_add(one, metrics[k].key,
                                       isnan(cs[i].run[r][k]) ? NULL : json_object_new_double(cs[i].run[r][k]));
            json_object_array_add(each, one);
        }
        json_object_object_add(a, "median", med);
        json_object_object_add(a, "spread", spread);
        json_object_object_add(a, "each_run", each);
        json_object_array_add(list, a);
    }
    json_object_object_add(root, "allocators", list);
    int rc = json_object_to_file_ext(path, root, JSON_C_TO_STRING_PRETTY);
    if (rc < 0)
        fprintf(stderr, "alloclens: cannot write the comparison to %s: %s\n", path, strerror(errno));
    json_object_put(root);
    return rc;
}

/* The temporary directory, with the reports of processes CMD started (REPORT.<pid>.json). */
static void remove_dir(const char *dir)
{
    DIR *d = opendir(dir);
    if (d) {
        for (struct dirent *e; (e = readdir(d));)
            if (strcmp(e->d_name, ".") && strcmp(e->d_name, ".."))
                unlinkat(dirfd(d), e->d_name, 0);
        closedir(d);
    }
    rmdir(dir);
}

/* -a's list: names or paths, comma-separated; every allocator found when there is none. */
static int parse_allocators(const char *list, struct compared *cs, int cap)
{
    if (!list) {
        struct al_found_allocator found[AL_MAX_ALLOCATORS];
        int n = _al_cli_find_allocators(found, AL_MAX_ALLOCATORS);
        for (int i = 0; i < n && i < cap; i++)
            cs[i].alloc = found[i];
        if (n == 0)
            fprintf(stderr, "alloclens: no allocator found on this machine\n");
        return n ? n : -1;
    }
    char copy[4096];
    if (snprintf(copy, sizeof copy, "%s", list) >= (int)sizeof copy) {
        fprintf(stderr, "alloclens: the allocator list is too long\n");
        return -1;
    }
    int n = 0;
    for (char *tok = copy, *next; tok; tok = next) {
        next = strchr(tok, ',');
        if (next)
            *next++ = '\0';
        if (!*list) {
            fprintf(stderr, "alloclens: -a names no allocator\n");
            return -1;
        }
        if (!*tok) {
            fprintf(stderr, "alloclens: -a '%s' has an empty name in it (names are separated by one comma)\n", list);
            return -1;
        }
        if (n == cap) {
            fprintf(stderr, "alloclens: at most %d allocators can be compared at once\n", cap);
            return -1;
        }
        if (_al_cli_resolve_allocator(tok, &cs[n].alloc) < 0)
            return -1;
        /* The same library twice would be compared with itself. */
        char real[PATH_MAX], other[PATH_MAX];
        const char *mine = realpath(cs[n].alloc.path, real) ? real : cs[n].alloc.path;
        for (int j = 0; j < n; j++) {
            if (!strcmp(mine, realpath(cs[j].alloc.path, other) ? other : cs[j].alloc.path)) {
                fprintf(stderr, "alloclens: -a names the allocator %s twice ('%s' and '%s')\n", mine,
                        cs[j].alloc.name, tok);
                return -1;
            }
        }
        n++;
    }
    return n;
}

/* Runs CMD RUNS times under each of CS[0..N), prints the table (and, with SHOW_REPORTS, each
 * run's own report on stderr first), writes OUTPUT if given; the command's exit status. */
static int compare(struct compared *cs, int n, int runs, const char *mode, const char *output, char **cmd,
                   bool show_reports)
{
    char self[PATH_MAX];
    if (_al_cli_self_exe(self, sizeof self) < 0) {
        fprintf(stderr, "alloclens: cannot find this command's own path\n");
        return 2;
    }
    const char *tmp = getenv("TMPDIR");
    char dir[PATH_MAX];
    if (!tmp || !*tmp)
        tmp = "/tmp";
    bool fits = snprintf(dir, sizeof dir, "%s/alloclens-compare-XXXXXX", tmp) < (int)sizeof dir;
    if (!fits || !mkdtemp(dir)) {
        fprintf(stderr, "alloclens: cannot make a temporary directory in %s: %s\n", tmp,
                strerror(fits ? errno : ENAMETOOLONG));
        return 2;
    }
    catch_stop_signals();
    /* The listing's version of a library other than the C library is its file name's suffix
     * (libjemalloc.so.2 says 2, the allocator 5.3.0): not shown as one. A label carries the
     * version the allocator itself gives (read from its first report), or none. */
    for (int k = 0; k < n; k++) {
        if (strcmp(cs[k].alloc.name, "glibc") != 0)
            cs[k].alloc.version[0] = '\0';
        for (int j = 0; j < n; j++)
            cs[k].by_path |= j != k && !strcmp(cs[k].alloc.name, cs[j].alloc.name);
        make_label(&cs[k]);
    }
    int missing = 0, cannot_run_status = 0;
    /* Turns: A B C, then C B A, ... so that drift on the machine hits every allocator alike. */
    for (int r = 0; r < runs && !stop_signal && !cannot_run_status; r++) {
        for (int j = 0; j < n && !stop_signal; j++) {
            struct compared *c = &cs[r % 2 ? n - 1 - j : j];
            char path[PATH_MAX + 32], why[320];
            snprintf(path, sizeof path, "%s/%d.%d.json", dir, (int)(c - cs), r);
            if (show_reports) {
                fprintf(stderr, "\n######## %s (%s) ########\n", c->label, c->alloc.path);
                fflush(stderr);
            }
            int status = run_once(self, c, mode, cmd, path, show_reports);
            if (stop_signal) {
                unlink(path);
                break;
            }
            if (cannot_run(status, path)) {
                cannot_run_status = WEXITSTATUS(status);
                break;
            }
            if (read_report(path, c, c->run[c->nruns], why, sizeof why)) {
                c->nruns++;
                if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
                    char how[48];
                    describe_status(status, how, sizeof how);
                    fprintf(stderr, "alloclens: run %d under %s: the command ended with %s (its figures "
                            "are in the table)\n", r + 1, c->label, how);
                }
            } else {
                char how[48];
                describe_status(status, how, sizeof how);
                fprintf(stderr, "alloclens: run %d under %s (%s) left out: %s\n", r + 1, c->label, how, why);
                missing++;
            }
            unlink(path);
        }
    }
    remove_dir(dir);
    if (stop_signal) {
        int sig = stop_signal;
        fflush(stdout);
        signal(sig, SIG_DFL);
        raise(sig);
        return 128 + sig; /* not reached */
    }
    if (cannot_run_status)
        return cannot_run_status;
    for (int k = 0; k < n; k++) {
        cs[k].failed = cs[k].nruns == 0;
        summarize(&cs[k]);
    }
    fflush(stderr);
    print_table(cs, n, runs, cmd);
    print_switching(cs, n);
    fflush(stdout);
    if (output && write_json(output, cs, n, runs, mode, cmd) < 0)
        return 1;
    return missing ? 1 : 0;
}

/* Where the value of compare's option A goes; NULL when A is none of them. */
static const char **compare_option(const char *a, const char **list, const char **output, const char **mode,
                                   const char **runs)
{
    return !strcmp(a, "-a") || !strcmp(a, "--allocators") ? list
           : !strcmp(a, "-o") || !strcmp(a, "--output")   ? output
           : !strcmp(a, "--mode")                         ? mode
           : !strcmp(a, "-n") || !strcmp(a, "--runs")     ? runs
                                                          : NULL;
}

int _al_cli_cmd_compare(int argc, char **argv)
{
    const char *list = NULL, *output = NULL, *mode = NULL, *runs_text = NULL;
    int runs = 3, i = 1;
    for (; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--")) {
            i++;
            break;
        }
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        }
        if (a[0] != '-')
            break;
        const char **value = compare_option(a, &list, &output, &mode, &runs_text);
        if (!value) {
            fprintf(stderr, "alloclens: unknown option '%s' (see 'alloclens compare --help')\n", a);
            return 2;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "alloclens: option '%s' needs a value\n", a);
            return 2;
        }
        const char *v = argv[++i];
        if (_al_cli_value_given(a, v, !strcmp(v, "-h") || !strcmp(v, "--help") ||
                                          compare_option(v, &list, &output, &mode, &runs_text)) < 0 ||
            _al_cli_once(a, *value, v) < 0)
            return 2;
        *value = v;
    }
    if (mode && _al_cli_check_mode(mode) < 0)
        return 2;
    if (runs_text) {
        char *end;
        errno = 0;
        long n = strtol(runs_text, &end, 10);
        if (errno || *end || end == runs_text || n < 1 || n > MAX_RUNS) {
            fprintf(stderr, "alloclens: -n wants a number of runs from 1 to %d, not '%s'\n", MAX_RUNS, runs_text);
            return 2;
        }
        runs = (int)n;
    }
    if (i >= argc) {
        fprintf(stderr, "alloclens: no command to run (usage: alloclens compare [options] -- CMD [ARGS...])\n");
        return 2;
    }
    char **cmd = argv + i;
    static struct compared cs[MAX_COMPARED];
    int n = parse_allocators(list, cs, MAX_COMPARED);
    if (n < 0)
        return 2;
    if (output && _al_cli_check_writable(output, output, "the comparison") < 0)
        return 2;
    return compare(cs, n, runs, mode, output, cmd, false);
}

int _al_cli_cmd_demo(int argc, char **argv)
{
    if (argc > 1 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))) {
        printf("usage: alloclens demo\n\nProfiles the bundled workload (malloc_bench: 4 threads, mixed sizes)\n"
               "under every allocator found, prints each report, then compares them side by side.\n");
        return 0;
    }
    if (argc > 1) {
        fprintf(stderr, "alloclens: 'demo' takes no arguments\n");
        return 2;
    }
    char bench[PATH_MAX];
    if (_al_cli_sibling("../bench/malloc_bench", "malloc_bench", bench, sizeof bench) < 0) {
        fprintf(stderr, "alloclens: cannot find the demo workload malloc_bench\n");
        return 2;
    }
    static struct compared cs[MAX_COMPARED];
    int n = parse_allocators(NULL, cs, MAX_COMPARED);
    if (n < 0)
        return 2;
    char *cmd[] = { bench, NULL };
    return compare(cs, n, 1, NULL, NULL, cmd, true);
}
