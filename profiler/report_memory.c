/* The memory section of the reports: the waste snapshot at the peak and the state at exit, in
 * bytes and as shares of the total, and the size classes that hold the most. */
#include <stdio.h>
#include <string.h>

#include "profiler.h"

#define TOP_CLASSES 12

static const char *heap_source(void)
{
    return _al_syscalls.dispatch ? "the allocator's mmap/munmap/mremap/brk calls (syscall user dispatch), "
                                   "and the mappings holding its objects"
                                 : "the mappings holding its objects (/proc/self/maps)";
}

static double ns_since_start(const struct al_report *r, uint64_t tsc)
{
    return r->cycles_per_ns > 0 && tsc > r->start_tsc ? (double)(tsc - r->start_tsc) / r->cycles_per_ns : 0.0;
}

/* The rows worth showing: the most bytes held (live, internal, blowup), largest first. */
static unsigned top_rows(const struct al_waste_snapshot *s, uint32_t *rows)
{
    unsigned n = 0;
    for (uint32_t i = 0; i < _al_waste.nslots; i++) {
        if (!_al_table_row_written(s->pages, i, sizeof *s->cls))
            continue;
        int64_t w = s->cls[i][AL_SLOT_REQUESTED] + s->cls[i][AL_SLOT_INTERNAL] + s->cls[i][AL_SLOT_BLOWUP];
        if (w <= 0)
            continue;
        unsigned at = n < TOP_CLASSES ? n++ : TOP_CLASSES;
        if (at == TOP_CLASSES) {
            const int64_t *l = s->cls[rows[TOP_CLASSES - 1]];
            if (w <= l[AL_SLOT_REQUESTED] + l[AL_SLOT_INTERNAL] + l[AL_SLOT_BLOWUP])
                continue;
            at = TOP_CLASSES - 1;
        }
        while (at > 0) {
            const int64_t *p = s->cls[rows[at - 1]];
            if (p[AL_SLOT_REQUESTED] + p[AL_SLOT_INTERNAL] + p[AL_SLOT_BLOWUP] >= w)
                break;
            rows[at] = rows[at - 1];
            at--;
        }
        rows[at] = i;
    }
    return n;
}

/* A row's name: its class size, "small" (every small object, without a class table) or
 * "large". */
static const char *row_name(uint32_t i, char *buf, size_t cap)
{
    if (i >= _al_waste.nclasses)
        return i == _al_waste.slot_large ? "large" : "small";
    snprintf(buf, cap, "%llu", (unsigned long long)_al_class_size(&_al_waste.table, i));
    return buf;
}

static void snapshot_json(struct al_buf *b, const struct al_report *r, const char *key,
                          const struct al_waste_snapshot *s, bool last)
{
    _al_buf_printf(b, "    \"%s\": { \"time_ns\": %.0f, \"total_bytes\": %llu, \"live_requested_bytes\": %llu, "
                   "\"internal_fragmentation_bytes\": %llu, \"blowup_bytes\": %llu, \"blowup_uncapped_bytes\": %llu, "
                   "\"external_fragmentation_bytes\": %lld, \"unbacked_bytes\": %lld, \"live_objects\": %llu,\n"
                   "      \"size_classes\": [",
                   key, ns_since_start(r, s->tsc), (unsigned long long)s->total, (unsigned long long)s->live,
                   (unsigned long long)s->internal, (unsigned long long)s->blowup,
                   (unsigned long long)s->blowup_uncapped,
                   (long long)(s->external > 0 ? s->external : 0), (long long)(s->external < 0 ? -s->external : 0),
                   (unsigned long long)s->objects);
    uint32_t rows[TOP_CLASSES];
    unsigned n = top_rows(s, rows);
    for (unsigned k = 0; k < n; k++) {
        const int64_t *c = s->cls[rows[k]];
        char name[24];
        const char *n = row_name(rows[k], name, sizeof name);
        _al_buf_printf(b, rows[k] < _al_waste.nclasses ? "%s{ \"size\": %s" : "%s{ \"size\": \"%s\"",
                       k ? ",\n        " : "\n        ", n);
        _al_buf_printf(b, ", \"live_objects\": %lld, \"live_requested_bytes\": %lld, "
                       "\"internal_fragmentation_bytes\": %lld, \"blowup_bytes\": %lld }",
                       (long long)c[AL_SLOT_OBJECTS], (long long)c[AL_SLOT_REQUESTED], (long long)c[AL_SLOT_INTERNAL],
                       (long long)c[AL_SLOT_BLOWUP]);
    }
    _al_buf_puts(b, last ? " ] }\n" : " ] },\n");
}

void _al_report_memory_json(struct al_buf *b, const struct al_report *r)
{
    const struct al_waste_state *w = &_al_waste;
    if (!w->enabled || !w->final.taken) {
        _al_buf_puts(b, "  \"memory\": { \"available\": false, \"reason\": ");
        _al_buf_json_str(b, w->reason[0] ? w->reason : "not started");
        _al_buf_puts(b, ", \"peak\": null, \"final\": null },\n");
        return;
    }
    _al_buf_puts(b, "  \"memory\": { \"available\": true, \"heap_source\": ");
    _al_buf_json_str(b, heap_source());
    _al_buf_printf(b, ", \"snapshots\": %llu, \"snapshot_step_bytes\": %u, \"shadow_bytes\": %llu, "
                   "\"mappings_found_by_objects\": %llu,\n    \"size_classes_source\": ",
                   (unsigned long long)w->snapshots, AL_SNAP_STEP, (unsigned long long)r->shadow_bytes,
                   (unsigned long long)_al_heap_discovered());
    if (w->has_table)
        _al_buf_puts(b, "\"config\"");
    else
        _al_buf_json_str(b, w->classes_reason);
    _al_buf_puts(b, ",\n");
    snapshot_json(b, r, "peak", &w->peak, false);
    snapshot_json(b, r, "final", &w->final, true);
    _al_buf_puts(b, "  },\n");
}

void _al_report_memory_text(struct al_buf *b, const struct al_report *r)
{
    const struct al_waste_state *w = &_al_waste;
    if (!w->enabled || !w->final.taken) {
        _al_buf_printf(b, "memory       unavailable: %s\n", w->reason[0] ? w->reason : "not started");
        return;
    }
    const struct al_waste_snapshot *p = &w->peak, *f = &w->final;
    _al_buf_printf(b, "\nmemory       heap at the peak (%.3f s) and at exit; %llu snapshots\n",
                   ns_since_start(r, p->tsc) / 1e9, (unsigned long long)w->snapshots);
    _al_buf_puts(b, "                     peak              exit\n");
    /* Live objects on pages the kernel never backed (calloc'ed blocks never written) count in
     * live but not in the total: shares are then of both, every row under 100%. */
    const struct al_waste_snapshot *s[2] = { p, f };
    uint64_t unbacked[2], whole[2];
    for (unsigned j = 0; j < 2; j++) {
        unbacked[j] = s[j]->external < 0 ? (uint64_t)-s[j]->external : 0;
        whole[j] = s[j]->total + unbacked[j];
    }
    const char *names[6] = { "total", "live", "internal", "blowup", "external", "unbacked" };
    unsigned nrows = unbacked[0] || unbacked[1] ? 6 : 5;
    for (unsigned k = 0; k < nrows; k++) {
        _al_buf_printf(b, "  %-9s", names[k]);
        for (unsigned j = 0; j < 2; j++) {
            uint64_t v = k == 0 ? s[j]->total : k == 1 ? s[j]->live : k == 2 ? s[j]->internal : k == 3 ? s[j]->blowup
                       : k == 4 ? (uint64_t)(s[j]->external > 0 ? s[j]->external : 0) : unbacked[j];
            _al_buf_printf(b, " %9.2f MiB %5.1f%%", (double)v / 1048576.0,
                           whole[j] ? 100.0 * (double)v / (double)whole[j] : 0.0);
        }
        _al_buf_puts(b, "\n");
    }
    if (nrows == 6)
        _al_buf_puts(b, "  (unbacked: live objects' bytes on pages the kernel never backed, never written; "
                        "shares are of total + unbacked)\n");
    if (p->blowup_uncapped > p->blowup || f->blowup_uncapped > f->blowup)
        _al_buf_printf(b, "  (blowup capped at what the heap holds beyond live and internal: %.2f MiB at the "
                       "peak and %.2f MiB at exit were freed and not yet taken again by their class, "
                       "the rest given to other classes or back to the kernel)\n",
                       (double)p->blowup_uncapped / 1048576.0, (double)f->blowup_uncapped / 1048576.0);
    if (!w->has_table)
        _al_buf_printf(b, "  size classes: %s\n", w->classes_reason);
    uint32_t rows[TOP_CLASSES];
    unsigned n = top_rows(p, rows);
    if (n)
        _al_buf_puts(b, "  class at peak     objects    live MiB  internal MiB  blowup MiB\n");
    for (unsigned k = 0; k < n; k++) {
        const int64_t *c = p->cls[rows[k]];
        char name[24];
        _al_buf_printf(b, "  %-12s %12lld %11.2f %13.2f %11.2f\n", row_name(rows[k], name, sizeof name),
                       (long long)c[AL_SLOT_OBJECTS], (double)c[AL_SLOT_REQUESTED] / 1048576.0,
                       (double)c[AL_SLOT_INTERNAL] / 1048576.0, (double)c[AL_SLOT_BLOWUP] / 1048576.0);
    }
}
