/* The sites section of the report: the sampled call sites ranked by live bytes at the peak,
 * by internal fragmentation and by bytes allocated, their frames named after the run (never
 * on the hot path, see symbols.c); and the same sites as a pprof heap profile. */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pprof.h"
#include "profiler.h"

#define TOP 20

/* Frames' texts are made under the sampler's lock (under_lock), into buffers of their own here
 * rather than on the stack, which may be a signal handler's small one: C++ names run long. */
#define TEXT_CAP 8192

/* The text of one function of the frame at PC: S, the frame's innermost, or one that S's code
 * was inlined into (each is a frame of its own in the stack, innermost first). */
static void frame_text(char *out, size_t cap, uintptr_t pc, const struct al_symbol *s)
{
    static char plain[TEXT_CAP];
    const char *fn = _al_symbol_function(s, plain, sizeof plain);
    const char *mod = s->module ? strrchr(s->module, '/') : NULL;
    mod = mod ? mod + 1 : s->module;
    if (fn && s->file)
        snprintf(out, cap, "%s (%s:%d)", fn, s->file, s->line);
    else if (fn)
        snprintf(out, cap, "%s (%s)", fn, mod ? mod : "?");
    else if (mod && s->unloaded) /* its address then is of no use */
        snprintf(out, cap, "%s+0x%lx (unloaded)", mod, (unsigned long)s->module_offset);
    else if (mod)
        snprintf(out, cap, "0x%lx (%s+0x%lx)", (unsigned long)pc, mod, (unsigned long)s->module_offset);
    else
        snprintf(out, cap, "0x%lx", (unsigned long)pc);
}

/* Appends to TEXT (CAP bytes) " < " and the text of S, where there is room for them. */
static void text_append(char *text, size_t cap, uintptr_t pc, const struct al_symbol *s)
{
    size_t at = strlen(text);
    if (at) {
        if (at + 4 >= cap)
            return;
        memcpy(text + at, " < ", 4);
        at += 3;
    }
    frame_text(text + at, cap - at, pc, s);
}

/* ---- ranking ------------------------------------------------------------------------------- */

/* Comparators for _al_sort over site pointers: the largest FIELD first. */
#define BY(name, field)                                                                    \
    static int name(const void *a, const void *b)                                          \
    {                                                                                      \
        double x = (*(struct al_site *const *)a)->field, y = (*(struct al_site *const *)b)->field; \
        return x < y ? 1 : x > y ? -1 : 0;                                                 \
    }
BY(by_peak, peak_live_bytes)
BY(by_frag, frag_bytes)
BY(by_alloc, alloc_bytes)
#undef BY

/* The sites, and the row of the samples past the table's AL_SITES_MAX sites where it has any:
 * ranked with the others, so that what it holds is not left out of the lists. */
static struct al_site **ranked(int (*cmp)(const void *, const void *), uint32_t *n)
{
    bool past = _al_sampler.unattributed.count > 0;
    *n = _al_sampler.nsites + past;
    if (!*n) /* a short program's usual case: no mapping to make and unmap */
        return NULL;
    struct al_site **r = _al_mem_map(*n * sizeof *r);
    if (!r)
        return NULL;
    for (uint32_t i = 0; i < _al_sampler.nsites; i++)
        r[i] = _al_site(i);
    if (past)
        r[*n - 1] = &_al_sampler.unattributed;
    _al_sort(r, *n, sizeof *r, cmp);
    return r;
}

/* The one frame of the row of samples past the table's sites. */
#define AL_STR_(x) #x
#define AL_STR(x) AL_STR_(x)
#define PAST_TABLE "(sites past the first " AL_STR(AL_SITES_MAX) ", together)"

/* Residency was measured when the peak had last grown by an eighth, or sites not measured
 * then came to hold an eighth of it (or at the peak itself): its shares, applied to the site's
 * bytes at the peak. False for a site with bytes at the peak but none measured (its samples
 * all came after the last measurement): unknown, not zero. */
static bool at_peak(const struct al_site *st, double out[3])
{
    double sum = st->at_peak[0] + st->at_peak[1] + st->at_peak[2];
    for (int k = 0; k < 3; k++)
        out[k] = sum > 0 ? st->at_peak[k] / sum * st->peak_live_bytes : 0;
    return sum > 0 || st->peak_live_bytes <= 0;
}

/* Quantile Q of the site's lifetimes: the midpoint of the group of buckets holding it, at most
 * the longest lifetime seen. */
static double lifetime_ns(const struct al_site *st, double q, double cycles_per_ns)
{
    uint64_t rank = _al_hist_rank(st->nlife, q), seen = 0, c = 0;
    for (unsigned g = 0; rank && g < AL_LIFE_BUCKETS; g++) {
        seen += st->life_cycles[g];
        if (seen < rank)
            continue;
        unsigned last = (g + 1) * AL_LIFE_GROUP - 1;
        uint64_t lo = _al_hist_bucket_low(g * AL_LIFE_GROUP);
        uint64_t hi = last >= AL_HIST_BUCKETS - 1 ? lo : _al_hist_bucket_high(last);
        c = lo + (hi - lo) / 2;
        break;
    }
    if (c > st->life_max)
        c = st->life_max;
    return cycles_per_ns > 0 ? (double)c / cycles_per_ns : 0;
}

static void site_json(struct al_buf *b, const struct al_site *st, double cycles_per_ns)
{
    _al_buf_puts(b, "      { \"stack\": [");
    if (st == &_al_sampler.unattributed)
        _al_buf_json_str(b, PAST_TABLE);
    static char text[TEXT_CAP];
    for (uint32_t f = 0; f < st->nframes; f++) {
        struct al_symbol s;
        _al_symbolize(st->frames[f], &s);
        for (const struct al_symbol *in = &s; in; in = in->inlined_into) {
            frame_text(text, sizeof text, st->frames[f], in);
            if (f || in != &s)
                _al_buf_puts(b, ", ");
            _al_buf_json_str(b, text);
        }
    }
    _al_buf_printf(b, "],\n        \"live_bytes_at_peak\": %.0f, \"live_bytes_at_exit\": %.0f, \"allocated_bytes\": %.0f, "
                   "\"allocated_objects\": %.0f, \"internal_fragmentation_bytes\": %.0f, \"count\": %llu,\n        \"lifetime_ns\": ",
                   st->peak_live_bytes, st->live_bytes, st->alloc_bytes, st->alloc_objects, st->frag_bytes,
                   (unsigned long long)st->count);
    if (st->nlife)
        _al_buf_printf(b, "{ \"freed_samples\": %llu, \"median\": %.0f, \"p90\": %.0f }", (unsigned long long)st->nlife,
                       lifetime_ns(st, 0.5, cycles_per_ns), lifetime_ns(st, 0.9, cycles_per_ns));
    else
        _al_buf_puts(b, "null");
    double ap[3];
    if (at_peak(st, ap))
        _al_buf_printf(b, ",\n        \"at_peak\": { \"resident_bytes\": %.0f, \"swapped_bytes\": %.0f, \"untouched_bytes\": %.0f } }",
                       ap[0], ap[1], ap[2]);
    else
        _al_buf_puts(b, ",\n        \"at_peak\": null }");
}

static void list_json(struct al_buf *b, const char *key, int (*cmp)(const void *, const void *), double cycles_per_ns,
                      bool last)
{
    uint32_t n;
    struct al_site **r = ranked(cmp, &n);
    _al_buf_printf(b, "    \"%s\": [\n", key);
    for (uint32_t i = 0; r && i < n && i < TOP; i++) {
        site_json(b, r[i], cycles_per_ns);
        _al_buf_puts(b, i + 1 < n && i + 1 < TOP ? ",\n" : "\n");
    }
    _al_buf_puts(b, last ? "    ]\n" : "    ],\n");
    if (r)
        _al_mem_unmap(r, n * sizeof *r);
}

/* When the sites' peak was: ns since the process image started (a peak at exit, found while
 * the report is gathered, is the run's end). */
static double peak_ns(const struct al_report *r)
{
    double ns = _al_sampler.peak_time > r->start_tsc ? _al_report_ns(r, (double)(_al_sampler.peak_time - r->start_tsc)) : 0;
    return ns < (double)r->runtime_ns ? ns : (double)r->runtime_ns;
}

/* MAKE's text, made under the sampler's lock and written after it: B may be a stream, whose
 * writes must not hold up threads still taking samples. */
static void under_lock(struct al_buf *b, void (*make)(struct al_buf *, const struct al_report *),
                       const struct al_report *r)
{
    _al_buf_hold(b, true);
    bool took = _al_sampler_lock();
    make(b, r);
    _al_sampler_unlock(took);
    _al_buf_hold(b, false);
}

static void sites_json(struct al_buf *b, const struct al_report *r)
{
    double cycles_per_ns = r->cycles_per_ns;
    _al_buf_printf(b, "  \"sites\": { \"available\": true, \"sample_rate_bytes\": %.0f, \"seed\": %llu, \"sites\": %u, "
                   "\"live_bytes_at_peak\": %.0f, \"live_bytes_at_exit\": %.0f, \"samples_dropped\": %llu,\n"
                   "    \"peak_source\": \"%s\", \"peak_time_ns\": %.0f,\n",
                   _al_sampler.rate, (unsigned long long)_al_sampler.seed, _al_sampler.nsites, _al_sampler.peak_bytes,
                   _al_sampler.live_bytes_at_exit, (unsigned long long)_al_sampler.dropped,
                   _al_peak_words(_al_sampler.peak_source)->name, peak_ns(r));
    const char *why = _al_symbols_unavailable();
    _al_buf_puts(b, "    \"symbols\": ");
    _al_buf_json_str(b, _al_symbols_source());
    _al_buf_puts(b, ", \"symbols_reason\": ");
    if (why)
        _al_buf_json_str(b, why);
    else
        _al_buf_puts(b, "null");
    _al_buf_puts(b, ",\n");
    list_json(b, "top", by_peak, cycles_per_ns, false);
    list_json(b, "top_by_internal_fragmentation", by_frag, cycles_per_ns, false);
    list_json(b, "top_by_allocated", by_alloc, cycles_per_ns, true);
    _al_buf_puts(b, "  }\n");
}

void _al_report_sites_json(struct al_buf *b, const struct al_report *r)
{
    if (!_al_sampler.enabled) {
        _al_buf_puts(b, "  \"sites\": { \"available\": false, \"reason\": \"allocation-site sampling is off "
                        "(ALLOCLENS_SAMPLE_RATE=0)\" }\n");
        return;
    }
    under_lock(b, sites_json, r);
}

static void sites_text(struct al_buf *b, const struct al_report *rep)
{
    uint32_t n;
    struct al_site **r = ranked(by_peak, &n);
    _al_buf_printf(b, "\nsites        %u call sites sampled every %.0f bytes on average; live at peak %.1f MiB (estimated, ",
                   _al_sampler.nsites, _al_sampler.rate, _al_sampler.peak_bytes / 1048576.0);
    if (_al_sampler.peak_source == AL_PEAK_NONE)
        _al_buf_printf(b, "%s)\n", _al_peak_words(AL_PEAK_NONE)->text);
    else
        _al_buf_printf(b, "at %s, %.3f s)\n", _al_peak_words(_al_sampler.peak_source)->text, peak_ns(rep) / 1e9);
    const char *why = _al_symbols_unavailable();
    if (why)
        _al_buf_printf(b, "             names from the dynamic symbol table only: %s\n", why);
    _al_buf_puts(b, "   live@peak    allocated   int. frag  site\n");
    /* Three frames of the stack as the JSON lists it (inlined calls expanded), as the CLI's
     * rendering: the innermost alone is often the same function for many sites (an
     * interpreter's object allocator, a container's growth, a helper inlined everywhere). */
    static char text[TEXT_CAP];
    for (uint32_t i = 0; r && i < n && i < 10; i++) {
        bool past = r[i] == &_al_sampler.unattributed;
        unsigned shown = past;
        snprintf(text, sizeof text, "%s", past ? PAST_TABLE : "");
        uint32_t nf = (past || r[i]->nframes) ? r[i]->nframes : 1; /* a site with no frame: 0x0 */
        for (uint32_t k = 0; k < nf && shown < 3; k++) {
            uintptr_t pc = r[i]->nframes ? r[i]->frames[k] : 0;
            struct al_symbol s;
            _al_symbolize(pc, &s);
            for (const struct al_symbol *in = &s; in && shown < 3; in = in->inlined_into, shown++)
                text_append(text, sizeof text, pc, in);
        }
        _al_buf_printf(b, "%12.0f %12.0f %11.0f  %s\n", r[i]->peak_live_bytes, r[i]->alloc_bytes, r[i]->frag_bytes, text);
    }
    if (r)
        _al_mem_unmap(r, n * sizeof *r);
}

void _al_report_sites_text(struct al_buf *b, const struct al_report *rep)
{
    if (!_al_sampler.enabled) {
        _al_buf_puts(b, "sites        unavailable: sampling is off (ALLOCLENS_SAMPLE_RATE=0)\n");
        return;
    }
    under_lock(b, sites_text, rep);
}

/* ---- pprof --------------------------------------------------------------------------------- */

struct maps {
    struct al_pprof_mapping m[256];
    char names[256][PATH_MAX];
    char ids[256][48];
    uint32_t n;
    char buf[16384];
};

/* A mapping of code from PATH, for pprof's mapping table; whether the table is full. The build
 * id is read from memory where the file is still loaded there (LOADED), from the file else. */
static bool add_file(struct maps *mp, uint64_t lo, uint64_t hi, uint64_t offset, const char *path, bool loaded)
{
    struct al_pprof_mapping *m = &mp->m[mp->n];
    snprintf(mp->names[mp->n], sizeof mp->names[0], "%s", path);
    m->start = lo;
    m->limit = hi;
    m->offset = offset;
    m->file = mp->names[mp->n];
    int r = loaded ? _al_build_id_loaded(lo, mp->ids[mp->n], sizeof mp->ids[0]) : -ESRCH;
    if (r == -ESRCH) /* a file mapped executable by hand, or unloaded: read from the file */
        r = _al_build_id(m->file, mp->ids[mp->n], sizeof mp->ids[0]);
    m->build_id = r == 0 ? mp->ids[mp->n] : NULL;
    return ++mp->n == 256;
}

/* The executable file mappings of the process. */
static bool add_mapping(const struct al_map *map, void *arg)
{
    if (map->perms[2] != 'x' || map->path[0] != '/')
        return false;
    return add_file(arg, map->lo, map->hi, map->offset, map->path, true);
}

/* Room for the functions the first N sites' frames were inlined into, for the profile's
 * Lines; NULL where there are none (*N_LINES 0) or memory is out. */
static struct al_pprof_line *inlined_room(uint32_t n, size_t *n_lines)
{
    *n_lines = 0;
    for (uint32_t i = 0; i < n; i++)
        for (uint32_t f = 0; f < _al_site(i)->nframes; f++) {
            struct al_symbol s;
            _al_symbolize(_al_site(i)->frames[f], &s);
            for (const struct al_symbol *x = s.inlined_into; x; x = x->inlined_into)
                ++*n_lines;
        }
    return *n_lines ? _al_mem_map(*n_lines * sizeof(struct al_pprof_line)) : NULL;
}

void _al_report_pprof(const char *path, uint64_t runtime_ns)
{
    if (!_al_sampler.enabled) {
        _al_log("no pprof profile written to %s: sampling is off", path);
        return;
    }
    uint32_t n = _al_sampler.nsites;
    size_t frames_n = (size_t)n * AL_SITE_FRAMES + 1;
    struct al_pprof_line *lines = NULL;
    size_t n_lines = 0, used_lines = 0;
    struct maps *mp = _al_mem_map(sizeof *mp);
    struct al_pprof_sample *samples = _al_mem_map((n + 1) * sizeof *samples);
    struct al_pprof_frame *frames = _al_mem_map(frames_n * sizeof *frames);
    if (!mp || !samples || !frames) {
        _al_log("out of memory writing the pprof profile %s", path);
        goto out;
    }
    /* Then the libraries the program unloaded, where their frames were moved. */
    if (!_al_maps_each(mp->buf, sizeof mp->buf, add_mapping, mp))
        for (unsigned u = 0; u < _al_unloaded_count(); u++) {
            const struct al_unloaded *f = _al_unloaded_file(u);
            if (_al_unloaded_same_file(f) && add_file(mp, f->bias + f->lo, f->bias + f->hi, f->offset, f->path, false))
                break;
        }
    bool took = _al_sampler_lock();
    if (!(lines = inlined_room(n, &n_lines)) && n_lines) {
        _al_sampler_unlock(took);
        _al_log("out of memory writing the pprof profile %s", path);
        goto out;
    }
    size_t k = 0;
    for (uint32_t i = 0; i < n; i++) {
        const struct al_site *st = _al_site(i);
        samples[i].frames = &frames[k];
        samples[i].nframes = st->nframes;
        samples[i].alloc_objects = (int64_t)(st->alloc_objects + 0.5);
        samples[i].alloc_space = (int64_t)(st->alloc_bytes + 0.5);
        samples[i].inuse_objects = (int64_t)(st->live_objects + 0.5);
        samples[i].inuse_space = (int64_t)(st->live_bytes + 0.5);
        for (uint32_t f = 0; f < st->nframes; f++, k++) {
            struct al_pprof_frame *fr = &frames[k];
            struct al_symbol s;
            _al_symbolize(st->frames[f], &s);
            fr->address = st->frames[f] - 1;
            fr->function = s.function; /* the symbol table's: there until the process ends */
            fr->file = s.file;
            fr->line = s.file ? s.line : 0;
            fr->inlined = &lines[used_lines];
            for (const struct al_symbol *x = s.inlined_into; x; x = x->inlined_into, fr->ninlined++)
                lines[used_lines++] = (struct al_pprof_line){ x->function, x->file, x->file ? x->line : 0 };
            for (uint32_t m = 0; m < mp->n; m++)
                if (fr->address >= mp->m[m].start && fr->address < mp->m[m].limit)
                    fr->mapping = m + 1;
        }
    }
    const struct al_site *past = &_al_sampler.unattributed;
    uint32_t nsamples = n;
    if (past->count) { /* one frame of its own, named, with no address */
        samples[nsamples++] = (struct al_pprof_sample){
            .frames = &frames[k], .nframes = 1,
            .alloc_objects = (int64_t)(past->alloc_objects + 0.5), .alloc_space = (int64_t)(past->alloc_bytes + 0.5),
            .inuse_objects = (int64_t)(past->live_objects + 0.5), .inuse_space = (int64_t)(past->live_bytes + 0.5) };
        frames[k++] = (struct al_pprof_frame){ .function = PAST_TABLE };
    }
    _al_sampler_unlock(took);
    struct al_pprof_profile p = { .mappings = mp->m, .nmappings = mp->n, .samples = samples, .nsamples = nsamples,
                                  .period = (int64_t)_al_sampler.rate, .duration_nanos = (int64_t)runtime_ns };
    char err[512];
    if (_al_pprof_write(path, &p, err, sizeof err) < 0)
        _al_log("%s", err);
out: /* unmapping NULL does nothing */
    _al_mem_unmap(lines, n_lines * sizeof *lines);
    _al_mem_unmap(frames, frames_n * sizeof *frames);
    _al_mem_unmap(samples, (n + 1) * sizeof *samples);
    _al_mem_unmap(mp, sizeof *mp);
}
