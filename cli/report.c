/* alloclens report: a saved JSON report rendered again, as text on stdout or as one
 * self-contained HTML page (no scripts, no external files). Both go through the same few
 * output calls (title, key-value lines, notes, tables), so the two always show the same
 * sections: the run, the ops table, memory waste at the peak, the allocator's system calls,
 * locks, event counts and the sampled allocation sites. A section the report marks
 * unavailable is shown with its reason. */
#include <errno.h>
#include <json-c/json.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli.h"
#include "profiler.h"

#define MAX_COLS 10
#define TOP_ROWS 15

struct out {
    FILE *f;
    bool html;
    int ncols;
    int width[MAX_COLS]; /* text tables: column width, negative for left-aligned */
};

/* S escaped between two pieces of HTML; the callers write the text form themselves. */
static void element(struct out *o, const char *open, const char *s, const char *close)
{
    fputs(open, o->f);
    for (; *s; s++) {
        switch (*s) {
        case '<': fputs("&lt;", o->f); break;
        case '>': fputs("&gt;", o->f); break;
        case '&': fputs("&amp;", o->f); break;
        case '"': fputs("&quot;", o->f); break;
        default: fputc(*s, o->f);
        }
    }
    fputs(close, o->f);
}

/* S as text, WIDTH wide (printf's: negative is left-aligned), its control characters written
 * as C escapes: a report's strings come from a file anyone can write, and a newline, tab or ESC
 * in one (an argument of the program, a crafted report) would split its line or reach the
 * terminal as a command. */
static void text(struct out *o, int width, const char *s)
{
    size_t cap = 4 * strlen(s) + 1; /* \xHH: four bytes for one */
    char *shown = malloc(cap);
    fprintf(o->f, "%*s", width, shown ? _al_cli_escaped(s, shown, cap) : "(out of memory)");
    free(shown);
}

static void heading(struct out *o, const char *s)
{
    if (o->html) {
        element(o, "<h2>", s, "</h2>\n");
    } else {
        fputs("\n== ", o->f);
        text(o, 0, s);
        fputc('\n', o->f);
    }
}

/* The printf-style arguments after FMT, into the array BUF. */
#define FORMAT(buf, fmt)                          \
    do {                                          \
        va_list ap_;                              \
        va_start(ap_, fmt);                       \
        vsnprintf(buf, sizeof buf, fmt, ap_);     \
        va_end(ap_);                              \
    } while (0)

static void __attribute__((format(printf, 3, 4))) kv(struct out *o, const char *key, const char *fmt, ...)
{
    char v[1024];
    FORMAT(v, fmt);
    if (o->html) {
        element(o, "<tr><th>", key, "</th>");
        element(o, "<td>", v, "</td></tr>\n");
    } else {
        text(o, -14, key);
        fputc(' ', o->f);
        text(o, 0, v);
        fputc('\n', o->f);
    }
}

static void kv_begin(struct out *o)
{
    if (o->html)
        fputs("<table class=\"kv\">\n", o->f);
}

static void kv_end(struct out *o)
{
    if (o->html)
        fputs("</table>\n", o->f);
}

static void __attribute__((format(printf, 2, 3))) note(struct out *o, const char *fmt, ...)
{
    char v[1024];
    FORMAT(v, fmt);
    if (o->html) {
        element(o, "<p>", v, "</p>\n");
    } else {
        text(o, 0, v);
        fputc('\n', o->f);
    }
}

/* A table of N columns: HEADS, and each column's text width (negative: left-aligned). */
static void table(struct out *o, int n, const char *const *heads, const int *width)
{
    o->ncols = n;
    memcpy(o->width, width, (size_t)n * sizeof *width);
    if (o->html)
        fputs("<table>\n<tr>", o->f);
    for (int i = 0; i < n; i++) {
        if (o->html) {
            element(o, "<th>", heads[i], "</th>");
        } else {
            fputs(i ? " " : "", o->f);
            text(o, width[i], heads[i]);
        }
    }
    fputs(o->html ? "</tr>\n" : "\n", o->f);
}

static void row(struct out *o, const char *const *cells)
{
    if (o->html)
        fputs("<tr>", o->f);
    for (int i = 0; i < o->ncols; i++) {
        if (o->html) {
            element(o, o->width[i] < 0 ? "<td>" : "<td class=\"n\">", cells[i], "</td>");
        } else {
            fputs(i ? " " : "", o->f);
            text(o, o->width[i], cells[i]);
        }
    }
    fputs(o->html ? "</tr>\n" : "\n", o->f);
}

static void table_end(struct out *o)
{
    if (o->html)
        fputs("</table>\n", o->f);
}

/* ---- reading the report ------------------------------------------------------------------ */

static void fmt_num(char *out, size_t cap, double v, int decimals)
{
    if (isnan(v))
        snprintf(out, cap, "-");
    else
        snprintf(out, cap, "%.*f", decimals, v);
}

/* ---- sections ---------------------------------------------------------------------------- */

/* Starts section TITLE about SEC; false, with the report's reason shown, when the report marks
 * it unavailable. */
static bool section(struct out *o, const char *title, json_object *sec)
{
    heading(o, title);
    if (_al_cli_available(sec))
        return true;
    note(o, "unavailable: %s", _al_cli_str(sec, "reason"));
    return false;
}

static void put_file(void *f, const char *p, size_t n)
{
    fwrite(p, 1, n, f);
}

/* S written to F as one shell word, as the report the program wrote shows it: a copy of the
 * command line that one can paste. */
static void shell_word(FILE *f, const char *s)
{
    _al_shell_word(s, strlen(s), put_file, f);
}

static void run_section(struct out *o, json_object *r)
{
    json_object *prog = _al_cli_get(r, "program"), *alloc = _al_cli_get(r, "allocator");
    json_object *th = _al_cli_get(r, "threads");
    char *title = NULL;
    size_t len = 0;
    FILE *t = open_memstream(&title, &len);
    if (!t) {
        fprintf(stderr, "alloclens: out of memory\n");
        return;
    }
    fprintf(t, "alloclens report, pid %.0f:", _al_cli_num(prog, "pid"));
    /* Cut after about 4000 bytes of arguments, and said to be: as the program's own report. */
    json_object *args = _al_cli_get(prog, "argv");
    size_t i = 0;
    for (; i < _al_cli_len(args) && ftell(t) <= 4000; i++) {
        fputc(' ', t);
        shell_word(t, _al_cli_text(json_object_array_get_idx(args, i)));
    }
    fputs(i < _al_cli_len(args) ? " ... (cut)" : "", t);
    if (fclose(t) != 0) {
        fprintf(stderr, "alloclens: out of memory\n");
        free(title);
        return;
    }
    if (o->html) {
        element(o, "<h1>", title, "</h1>\n");
    } else {
        fputs("== ", o->f);
        text(o, 0, title);
        fputc('\n', o->f);
    }
    free(title);
    kv_begin(o);
    kv(o, "allocator", "%s %s (%s)", _al_cli_str(alloc, "name"), _al_cli_str(alloc, "version"),
       _al_cli_str(alloc, "path"));
    kv(o, "style", "%s; large from %.0f bytes (%s)", _al_cli_str(alloc, "style"),
       _al_cli_num(alloc, "large_threshold"),
       _al_cli_str(alloc, "large_threshold_source"));
    kv(o, "mode", "%s", _al_cli_str(r, "mode"));
    double runtime = _al_cli_num(prog, "runtime_ns"), in_alloc = _al_cli_num(r, "allocator_time_ns");
    double status = _al_cli_num(prog, "exit_status");
    if (isnan(status)) /* ended by a signal, or replaced by exec */
        kv(o, "runtime", "%.3f ms; %s", runtime / 1e6, _al_cli_str(prog, "exit_status_reason"));
    else
        kv(o, "runtime", "%.3f ms; exit status %.0f", runtime / 1e6, status);
    kv(o, "threads", "%.0f in all, at most %.0f at once; serial %.3f ms, parallel %.3f ms",
       _al_cli_num(th, "total"), _al_cli_num(th, "max_live"), _al_cli_num(th, "serial_ns") / 1e6,
       _al_cli_num(th, "parallel_ns") / 1e6);
    if (!isnan(in_alloc))
        kv(o, "in allocator", "%.3f ms, all threads (%.1f%% of runtime)", in_alloc / 1e6,
           runtime > 0 ? 100 * in_alloc / runtime : 0);
    else if (*_al_cli_str(r, "allocator_time_reason")) /* null: not measured, and why */
        kv(o, "in allocator", "not timed: %s", _al_cli_str(r, "allocator_time_reason"));
    else
        kv(o, "in allocator", "not in the report");
    json_object *prof = _al_cli_get(r, "profiler");
    char mapped[32], shadow[32], peak[32];
    _al_cli_bytes(mapped, sizeof mapped, _al_cli_num(prof, "mapped_bytes"));
    _al_cli_bytes(shadow, sizeof shadow, _al_cli_num(prof, "shadow_bytes"));
    _al_cli_bytes(peak, sizeof peak, _al_cli_num(prof, "process_peak_rss_bytes"));
    kv(o, "profiler", "%s mapped, %s of it the shadow table (resident); process peak RSS %s", mapped, shadow, peak);
    kv_end(o);
}

static void ops_section(struct out *o, json_object *r)
{
    heading(o, "Operations");
    static const char *const heads[] = { "op", "class", "reuse", "phase", "count", "mean ns",
                                         "p50 ns", "p99 ns", "p99.9 ns" };
    static const int widths[] = { -14, -7, -7, -9, 12, 10, 10, 10, 10 };
    table(o, 9, heads, widths);
    json_object *ops = _al_cli_get(r, "ops");
    for (size_t i = 0; i < _al_cli_len(ops); i++) {
        json_object *x = json_object_array_get_idx(ops, i);
        char c[5][32];
        fmt_num(c[0], sizeof c[0], _al_cli_num(x, "count"), 0);
        fmt_num(c[1], sizeof c[1], _al_cli_num(x, "ns_mean"), 1);
        fmt_num(c[2], sizeof c[2], _al_cli_num(x, "ns_p50"), 1);
        fmt_num(c[3], sizeof c[3], _al_cli_num(x, "ns_p99"), 1);
        fmt_num(c[4], sizeof c[4], _al_cli_num(x, "ns_p999"), 1);
        const char *cells[] = { _al_cli_str(x, "op"), _al_cli_str(x, "size_class"), _al_cli_str(x, "reuse"),
                                _al_cli_str(x, "phase"), c[0], c[1], c[2], c[3], c[4] };
        row(o, cells);
    }
    table_end(o);
}

static void state_rows(struct out *o, const char *label, json_object *s)
{
    static const char *const keys[] = { "total_bytes", "live_requested_bytes", "internal_fragmentation_bytes",
                                        "blowup_bytes", "external_fragmentation_bytes", "unbacked_bytes" };
    char c[6][32];
    for (int k = 0; k < 6; k++)
        _al_cli_bytes(c[k], sizeof c[k], _al_cli_num(s, keys[k]));
    char objects[32];
    fmt_num(objects, sizeof objects, _al_cli_num(s, "live_objects"), 0);
    const char *cells[] = { label, c[0], c[1], c[2], c[3], c[4], c[5], objects };
    row(o, cells);
}

static void memory_section(struct out *o, json_object *r)
{
    json_object *m = _al_cli_get(r, "memory");
    if (!section(o, "Memory waste", m))
        return;
    note(o, "heap: %s; %.0f snapshots (every %.0f bytes of growth); size classes: %s",
         _al_cli_str(m, "heap_source"), _al_cli_num(m, "snapshots"), _al_cli_num(m, "snapshot_step_bytes"),
         _al_cli_str(m, "size_classes_source"));
    static const char *const heads[] = { "state", "total", "live", "internal", "blowup", "external",
                                         "unbacked", "objects" };
    static const int widths[] = { -6, 12, 12, 12, 12, 12, 12, 10 };
    table(o, 8, heads, widths);
    state_rows(o, "peak", _al_cli_get(m, "peak"));
    state_rows(o, "exit", _al_cli_get(m, "final"));
    table_end(o);
    json_object *classes = _al_cli_get(_al_cli_get(m, "peak"), "size_classes");
    if (!_al_cli_len(classes))
        return;
    note(o, "size classes at the peak, most bytes held first:");
    static const char *const cheads[] = { "size", "objects", "live", "internal", "blowup" };
    static const int cwidths[] = { 10, 10, 12, 12, 12 };
    table(o, 5, cheads, cwidths);
    for (size_t i = 0; i < _al_cli_len(classes) && i < TOP_ROWS; i++) {
        json_object *x = json_object_array_get_idx(classes, i);
        char c[4][32];
        fmt_num(c[0], sizeof c[0], _al_cli_num(x, "live_objects"), 0);
        _al_cli_bytes(c[1], sizeof c[1], _al_cli_num(x, "live_requested_bytes"));
        _al_cli_bytes(c[2], sizeof c[2], _al_cli_num(x, "internal_fragmentation_bytes"));
        _al_cli_bytes(c[3], sizeof c[3], _al_cli_num(x, "blowup_bytes"));
        const char *cells[] = { _al_cli_text(_al_cli_get(x, "size")), c[0], c[1], c[2], c[3] };
        row(o, cells);
    }
    table_end(o);
}

/* A table of a name and two counts (KEYS) from the first entries of ARRAY. */
static void name_counts(struct out *o, json_object *array, const char *const heads[3], const char *const keys[3],
                        int name_width)
{
    const int widths[] = { -name_width, 14, 14 };
    table(o, 3, heads, widths);
    for (size_t i = 0; i < _al_cli_len(array) && i < TOP_ROWS; i++) {
        json_object *x = json_object_array_get_idx(array, i);
        char c[2][32];
        fmt_num(c[0], sizeof c[0], _al_cli_num(x, keys[1]), 0);
        fmt_num(c[1], sizeof c[1], _al_cli_num(x, keys[2]), 0);
        const char *cells[] = { _al_cli_str(x, keys[0]), c[0], c[1] };
        row(o, cells);
    }
    table_end(o);
}

static void syscalls_section(struct out *o, json_object *r)
{
    if (!section(o, "The allocator's system calls", _al_cli_get(r, "syscalls_info")))
        return;
    static const char *const heads[] = { "call", "count", "total ns" };
    static const char *const keys[] = { "name", "count", "ns_total" };
    name_counts(o, _al_cli_get(r, "syscalls"), heads, keys, 10);
}

static void locks_section(struct out *o, json_object *r)
{
    json_object *l = _al_cli_get(r, "locks");
    if (!section(o, "Locks", l))
        return;
    note(o, "%s; futex waits: %.0f", _al_cli_str(l, "scope"), _al_cli_num(l, "futex_waits"));
    static const char *const heads[] = { "lock", "acquisitions", "contended" };
    static const char *const keys[] = { "id", "acquisitions", "contended" };
    if (_al_cli_len(_al_cli_get(l, "locks")))
        name_counts(o, _al_cli_get(l, "locks"), heads, keys, 20);
}

static void counters_section(struct out *o, json_object *r)
{
    json_object *c = _al_cli_get(r, "counters");
    if (!section(o, "Events per call", c))
        return;
    note(o, "%s events, around 1 call in %.0f%s%s", _al_cli_str(c, "source"), _al_cli_num(c, "sample_every"),
         *_al_cli_str(c, "reason") ? ": " : "", _al_cli_str(c, "reason"));
    json_object *ops = _al_cli_get(c, "counted_ops"), *events = _al_cli_get(c, "events");
    const char *heads[MAX_COLS] = { "event" };
    int widths[MAX_COLS] = { -18 }, n = 1;
    if (json_object_get_type(ops) == json_type_object) { /* json-c's walk takes objects only */
        json_object_object_foreach(ops, op, count)
        {
            (void)count;
            if (n < MAX_COLS) {
                heads[n] = op;
                widths[n++] = 12;
            }
        }
    }
    table(o, n, heads, widths);
    for (size_t i = 0; i < _al_cli_len(events); i++) {
        json_object *e = json_object_array_get_idx(events, i), *per = _al_cli_get(e, "per_op");
        char v[MAX_COLS][32];
        const char *cells[MAX_COLS] = { _al_cli_str(e, "name") };
        for (int k = 1; k < n; k++) {
            fmt_num(v[k], sizeof v[k], _al_cli_num(per, heads[k]), 4);
            cells[k] = v[k];
        }
        row(o, cells);
    }
    table_end(o);
}

static void sites_section(struct out *o, json_object *r)
{
    json_object *s = _al_cli_get(r, "sites");
    if (!section(o, "Allocation sites", s))
        return;
    char peak[32];
    _al_cli_bytes(peak, sizeof peak, _al_cli_num(s, "live_bytes_at_peak"));
    char when[160] = "";
    const char *source = _al_cli_str(s, "peak_source"); /* absent from older reports */
    unsigned k = _al_peak_source_named(source);
    double at = _al_cli_num(s, "peak_time_ns") / 1e9;
    if (k == AL_PEAK_NONE)
        snprintf(when, sizeof when, ", %s", _al_peak_words(k)->text);
    else if (k < AL_PEAK_SOURCES)
        snprintf(when, sizeof when, ", at %s, %.3f s", _al_peak_words(k)->text, at);
    else if (*source) /* a name this version does not know */
        snprintf(when, sizeof when, ", at the %s peak, %.3f s", source, at);
    note(o, "sampled every %.0f bytes on average; %s live at the peak (estimated%s); names from %s",
         _al_cli_num(s, "sample_rate_bytes"), peak, when, _al_cli_str(s, "symbols"));
    static const char *const heads[] = { "live at peak", "allocated", "objects", "internal", "where" };
    static const int widths[] = { 12, 12, 10, 11, -1 };
    table(o, 5, heads, widths);
    json_object *top = _al_cli_get(s, "top");
    for (size_t i = 0; i < _al_cli_len(top) && i < TOP_ROWS; i++) {
        json_object *x = json_object_array_get_idx(top, i), *stack = _al_cli_get(x, "stack");
        char c[4][32], where[1024] = "";
        _al_cli_bytes(c[0], sizeof c[0], _al_cli_num(x, "live_bytes_at_peak"));
        _al_cli_bytes(c[1], sizeof c[1], _al_cli_num(x, "allocated_bytes"));
        fmt_num(c[2], sizeof c[2], _al_cli_num(x, "allocated_objects"), 0);
        _al_cli_bytes(c[3], sizeof c[3], _al_cli_num(x, "internal_fragmentation_bytes"));
        size_t at = 0;
        for (size_t k = 0; k < _al_cli_len(stack) && k < 3 && at < sizeof where - 1; k++)
            at += (size_t)snprintf(where + at, sizeof where - at, "%s%s", k ? " < " : "",
                                   _al_cli_text(json_object_array_get_idx(stack, k)));
        const char *cells[] = { c[0], c[1], c[2], c[3], where };
        row(o, cells);
    }
    table_end(o);
}

static const char html_head[] =
    "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>alloclens report</title>\n<style>\n"
    "body{font-family:sans-serif;margin:2em;color:#222}\n"
    "table{border-collapse:collapse;margin:0.5em 0 1.5em}\n"
    "th,td{border:1px solid #ccc;padding:2px 8px;text-align:left;font-size:90%}\n"
    "th{background:#eee}\ntd.n{text-align:right;font-family:monospace}\n"
    "table.kv th{width:9em}\n</style></head><body>\n";

static void usage(FILE *f)
{
    fprintf(f, "usage: alloclens report REPORT.json [--html OUT.html]\n"
               "\n"
               "Renders a report that 'alloclens run -o' saved (REPORT.json, or '-' for stdin): as\n"
               "text on stdout, or with --html as one self-contained HTML page (OUT.html, or '-' for\n"
               "stdout). The report must be strict JSON with the schema this version writes\n"
               "(\"" AL_REPORT_SCHEMA "\").\n"
               "\n"
               "Exit status: 0 when rendered; 2 for bad arguments: a report that cannot be read or\n"
               "is none, or an OUT.html that cannot be made (nothing is rendered); 1 when writing\n"
               "the page or stdout failed.\n");
}

int _al_cli_cmd_report(int argc, char **argv)
{
    const char *in = NULL, *html = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            usage(stdout);
            return 0;
        }
        if (!strcmp(argv[i], "--html")) {
            if (i + 1 >= argc) {
                fprintf(stderr, "alloclens: --html needs a file name\n");
                return 2;
            }
            if (_al_cli_once("--html", html, argv[i + 1]) < 0)
                return 2;
            html = argv[++i];
        } else if (argv[i][0] == '-' && argv[i][1]) { /* '-' alone is stdin */
            fprintf(stderr, "alloclens: unknown option '%s' (see 'alloclens report --help')\n", argv[i]);
            return 2;
        } else if (in) {
            fprintf(stderr, "alloclens: one report at a time ('%s' and '%s')\n", in, argv[i]);
            return 2;
        } else {
            in = argv[i];
        }
    }
    if (!in) {
        fprintf(stderr, "alloclens: no report given (usage: alloclens report REPORT.json [--html OUT.html])\n");
        return 2;
    }
    char e[256];
    bool from_stdin = !strcmp(in, "-");
    json_object *r = _al_cli_read_report(in, e, sizeof e);
    if (!r) {
        fprintf(stderr, "alloclens: cannot read %s: %s\n", from_stdin ? "the report on stdin" : in, e);
        return 2;
    }
    struct out o = { .f = stdout, .html = html != NULL };
    struct stat si, so;
    if (html && strcmp(html, "-") && (from_stdin ? fstat(STDIN_FILENO, &si) : stat(in, &si)) == 0 &&
        stat(html, &so) == 0 &&
        si.st_dev == so.st_dev && si.st_ino == so.st_ino) {
        fprintf(stderr, "alloclens: --html %s is the report being read: it would be overwritten\n", html);
        json_object_put(r);
        return 2;
    }
    if (html && strcmp(html, "-")) {
        o.f = fopen(html, "w");
        if (!o.f) {
            fprintf(stderr, "alloclens: cannot write %s: %s\n", html, strerror(errno));
            json_object_put(r);
            return 2;
        }
    }
    if (o.html)
        fputs(html_head, o.f);
    run_section(&o, r);
    ops_section(&o, r);
    memory_section(&o, r);
    syscalls_section(&o, r);
    locks_section(&o, r);
    counters_section(&o, r);
    sites_section(&o, r);
    if (o.html)
        fputs("</body></html>\n", o.f);
    json_object_put(r);
    if (o.f == stdout)
        return 0; /* main says whether stdout was written */
    /* A write error sticks to the stream, and errno still tells it after a failed flush. */
    errno = 0;
    int failed = fflush(o.f) != 0 || ferror(o.f);
    int why = errno ? errno : EIO;
    if (fclose(o.f) != 0 && !failed) {
        failed = 1;
        why = errno;
    }
    if (failed) {
        fprintf(stderr, "alloclens: writing %s failed: %s\n", html, strerror(why));
        return 1;
    }
    return 0;
}
