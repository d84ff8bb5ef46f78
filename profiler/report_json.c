/* The JSON report (schema in docs/report-schema.md, "alloclens-report/1"). Sections whose
 * measurements this build cannot make yet are present with "available": false and the reason,
 * never silently zero. */
#include <string.h>

#include "profiler.h"

static void unavailable(struct al_buf *b, const char *key, const char *reason, bool last)
{
    _al_buf_printf(b, "  \"%s\": { \"available\": false, \"reason\": ", key);
    _al_buf_json_str(b, reason);
    _al_buf_puts(b, last ? " }\n" : " },\n");
}

static void program(struct al_buf *b, const struct al_report *r)
{
    _al_buf_puts(b, "  \"program\": { \"argv\": [");
    size_t i = 0;
    bool first = true;
    while (i < r->argv_len) {
        /* Each argument ends in a NUL: the last one too (argv_len < sizeof argv, zeroed). */
        const char *arg = r->argv + i;
        size_t n = strlen(arg);
        if (!first)
            _al_buf_puts(b, ", ");
        _al_buf_json_str(b, arg);
        first = false;
        i += n + 1;
    }
    _al_buf_printf(b, "], \"pid\": %d, \"runtime_ns\": %llu, \"exit_status\": ", (int)r->pid,
                   (unsigned long long)r->runtime_ns);
    if (r->has_exit_status)
        _al_buf_printf(b, "%d", r->exit_status);
    else if (r->end_signal)
        _al_buf_printf(b, "null, \"exit_status_reason\": \"ended by signal %d (SIG%s)\", \"signal\": %d",
                       r->end_signal, sigabbrev_np(r->end_signal), r->end_signal);
    else
        _al_buf_puts(b, "null, \"exit_status_reason\": \"the image was replaced by exec\"");
    _al_buf_puts(b, " },\n");
}

static void allocator(struct al_buf *b, const struct al_report *r)
{
    const struct al_allocator_info *a = &r->allocator;
    _al_buf_puts(b, "  \"allocator\": { \"name\": ");
    _al_buf_json_str(b, a->name);
    _al_buf_puts(b, ", \"path\": ");
    _al_buf_json_str(b, a->path);
    _al_buf_puts(b, ", \"version\": ");
    if (a->version[0])
        _al_buf_json_str(b, a->version);
    else
        _al_buf_puts(b, "null");
    if (a->requested[0]) {
        _al_buf_puts(b, ", \"requested\": ");
        _al_buf_json_str(b, a->requested);
    }
    _al_buf_printf(b, ", \"program_defines_malloc\": %s", a->program_defines_malloc ? "true" : "false");
    const struct al_alloc_config *c = a->config;
    _al_buf_puts(b, ",\n    \"style\": ");
    if (c)
        _al_buf_json_str(b, _al_config_style_name(c->style));
    else
        _al_buf_puts(b, "null");
    _al_buf_printf(b, ", \"large_threshold\": %llu, \"large_threshold_source\": \"%s\",\n    \"size_classes\": [",
                   (unsigned long long)r->large_threshold, a->threshold_source ? a->threshold_source : "default");
    for (uint32_t i = 0; c && i < c->nruns; i++) {
        if (i)
            _al_buf_puts(b, ", ");
        _al_buf_u64_run(b, c->runs[i].first, c->runs[i].step, c->runs[i].count);
    }
    _al_buf_puts(b, "],\n    \"config\": { \"available\": ");
    if (c) {
        _al_buf_printf(b, "true, \"page_size\": %llu, \"path\": ", (unsigned long long)c->page_size);
        _al_buf_json_str(b, a->config_path);
        _al_buf_puts(b, ", \"confidence\": ");
        _al_buf_json_str(b, c->confidence);
    } else {
        _al_buf_puts(b, "false, \"reason\": ");
        _al_buf_json_str(b, a->config_reason);
    }
    _al_buf_puts(b, " } },\n");
}

static void ops(struct al_buf *b, const struct al_report *r)
{
    _al_buf_puts(b, "  \"ops\": [");
    bool first = true;
    for (unsigned i = 0; i < AL_ROWS; i++) {
        const struct al_row *row = &r->rows[i];
        if (!row->count)
            continue;
        struct al_row_stats s;
        _al_report_row(r, i, &s);
        _al_buf_printf(b,
            "%s\n    { \"op\": \"%s\", \"size_class\": \"%s\", \"reuse\": \"%s\", \"phase\": \"%s\", "
            "\"count\": %llu, \"timed\": %llu, ",
            first ? "" : ",", s.op, s.size_class, s.reuse, s.phase, (unsigned long long)row->count,
            (unsigned long long)row->timed);
        first = false;
        if (!_al_hot.timed) { /* --mode sample: not measured, rather than a time of 0 */
            _al_buf_puts(b, "\"cycles_total\": null, \"cycles_mean\": null, \"cycles_p50\": null, "
                            "\"cycles_p99\": null, \"cycles_p999\": null, \"ns_mean\": null, "
                            "\"ns_p50\": null, \"ns_p99\": null, \"ns_p999\": null }");
            continue;
        }
        _al_buf_printf(b,
            "\"cycles_total\": %llu, \"cycles_mean\": %.1f, "
            "\"cycles_p50\": %llu, \"cycles_p99\": %llu, \"cycles_p999\": %llu, "
            "\"ns_mean\": %.1f, \"ns_p50\": %.1f, \"ns_p99\": %.1f, \"ns_p999\": %.1f }",
            (unsigned long long)row->cycles, s.mean, (unsigned long long)s.p50,
            (unsigned long long)s.p99, (unsigned long long)s.p999, _al_report_ns(r, s.mean),
            _al_report_ns(r, (double)s.p50), _al_report_ns(r, (double)s.p99), _al_report_ns(r, (double)s.p999));
    }
    _al_buf_puts(b, "\n  ],\n");
}

/* A measured section's "note", after its first fields: what it leaves out (see seccomp.c). */
static void note(struct al_buf *b)
{
    const char *n = _al_seccomp_note();
    if (!n)
        return;
    _al_buf_puts(b, ", \"note\": ");
    _al_buf_json_str(b, n);
}

static void counters(struct al_buf *b, const struct al_report *r)
{
    const struct al_counters_config *c = &_al_counters;
    if (!c->available) {
        unavailable(b, "counters", c->reason[0] ? c->reason : "event counting was not set up", false);
        return;
    }
    _al_buf_printf(b, "  \"counters\": { \"available\": true, \"source\": \"%s\", \"sample_every\": %u",
                   c->software ? "software" : "hardware", c->sample_every);
    if (c->reason[0]) {
        _al_buf_puts(b, ", \"reason\": ");
        _al_buf_json_str(b, c->reason);
    }
    note(b);
    _al_buf_printf(b, ", \"dropped_calls\": %llu, \"counted_ops\": {",
                   (unsigned long long)r->measure.ctr_dropped);
    bool first = true;
    for (unsigned op = 0; op < AL_OP_COUNT; op++) {
        if (!r->measure.ctr_ops[op])
            continue;
        _al_buf_printf(b, "%s \"%s\": %llu", first ? "" : ",", _al_op_name(op),
                       (unsigned long long)r->measure.ctr_ops[op]);
        first = false;
    }
    _al_buf_puts(b, " },\n    \"events\": [");
    for (unsigned e = 0; e < c->nevents; e++) {
        _al_buf_printf(b, "%s\n      { \"name\": ", e ? "," : "");
        _al_buf_json_str(b, c->events[e].name);
        _al_buf_puts(b, ", \"per_op\": {");
        first = true;
        for (unsigned op = 0; op < AL_OP_COUNT; op++) {
            if (!r->measure.ctr_ops[op])
                continue;
            _al_buf_printf(b, "%s \"%s\": %.4f", first ? "" : ",", _al_op_name(op),
                           _al_report_counter(r, op, e));
            first = false;
        }
        _al_buf_puts(b, " } }");
    }
    _al_buf_puts(b, " ] },\n");
}

static void syscalls(struct al_buf *b, const struct al_report *r)
{
    const struct al_thread_syscalls *s = &r->measure.sys;
    _al_buf_puts(b, "  \"syscalls\": [");
    bool any = false;
    for (unsigned k = 0; _al_syscalls.dispatch && k < AL_SYS_N; k++) {
        uint64_t count, cycles;
        _al_report_syscall_total(r, k, &count, &cycles);
        _al_buf_printf(b, "%s\n    { \"name\": \"%s\", \"count\": %llu, \"cycles_total\": %llu, \"ns_total\": %.0f, \"by_op\": {",
                       any ? "," : "", _al_syscall_name(k), (unsigned long long)count, (unsigned long long)cycles,
                       _al_report_ns(r, (double)cycles));
        any = true;
        bool first = true;
        for (unsigned op = 0; op < AL_OP_COUNT; op++) {
            uint64_t n = s->count[k][op * 2] + s->count[k][op * 2 + 1];
            if (!n)
                continue;
            _al_buf_printf(b, "%s \"%s\": %llu", first ? "" : ",", _al_op_name(op), (unsigned long long)n);
            first = false;
        }
        _al_buf_puts(b, " }, \"by_op_size_class\": {");
        first = true;
        for (unsigned i = 0; i < AL_OP_COUNT * 2; i++) {
            if (!s->count[k][i])
                continue;
            _al_buf_printf(b, "%s \"%s/%s\": %llu", first ? "" : ",", _al_op_name(i / 2), i % 2 ? "large" : "small",
                           (unsigned long long)s->count[k][i]);
            first = false;
        }
        _al_buf_puts(b, " } }");
    }
    _al_buf_puts(b, "\n  ],\n  \"syscalls_info\": { \"available\": ");
    if (_al_syscalls.dispatch) {
        _al_buf_puts(b, "true, \"source\": \"syscall user dispatch\"");
        note(b);
        _al_buf_puts(b, " },\n");
    } else {
        _al_buf_puts(b, "false, \"reason\": ");
        _al_buf_json_str(b, _al_syscalls.reason[0] ? _al_syscalls.reason : "not set up");
        _al_buf_puts(b, " },\n");
    }
}

static void locks(struct al_buf *b, const struct al_report *r)
{
    if (!_al_locks) {
        unavailable(b, "locks", _al_hot.timed ? "no memory for the lock table" : "not measured in --mode sample", false);
        return;
    }
    _al_buf_puts(b, "  \"locks\": { \"available\": true, \"scope\": \"pthread mutexes and spin locks taken "
                    "inside allocator calls; allocators with private locks show futex_waits instead\", \"locks\": [");
    bool first = true;
    for (unsigned k = 0, n = _al_locks_claimed(); k < n; k++) {
        const struct al_lock_stats *l = _al_locks_at(k);
        if (!l)
            continue;
        uintptr_t id = atomic_load(&l->id);
        _al_buf_printf(b, "%s\n    { \"id\": \"0x%lx\", \"acquisitions\": %llu, \"contended\": %llu, "
                       "\"wait_cycles\": %llu, \"hold_cycles\": %llu }",
                       first ? "" : ",", (unsigned long)id, (unsigned long long)atomic_load(&l->acquisitions),
                       (unsigned long long)atomic_load(&l->contended), (unsigned long long)atomic_load(&l->wait_cycles),
                       (unsigned long long)atomic_load(&l->hold_cycles));
        first = false;
    }
    _al_buf_printf(b, "\n  ], \"futex_waits\": %llu },\n", (unsigned long long)r->measure.sys.futex_waits);
}

void _al_report_json(struct al_buf *b, const struct al_report *r)
{
    _al_buf_puts(b, "{\n  \"schema\": \"alloclens-report/1\",\n");
    _al_buf_printf(b, "  \"mode\": \"%s\",\n", _al_mode_name(_al_mode));
    program(b, r);
    allocator(b, r);
    _al_buf_printf(b, "  \"threads\": { \"total\": %llu, \"max_live\": %llu, \"serial_ns\": %.0f, "
                   "\"parallel_ns\": %.0f },\n",
                   (unsigned long long)r->threads.total, (unsigned long long)r->threads.max_live,
                   _al_report_ns(r, (double)r->threads.serial_cycles), _al_report_ns(r, (double)r->threads.parallel_cycles));
    ops(b, r);
    if (_al_hot.timed)
        _al_buf_printf(b, "  \"allocator_time_ns\": %.0f,\n", _al_report_ns(r, (double)_al_report_alloc_cycles(r)));
    else
        _al_buf_puts(b, "  \"allocator_time_ns\": null, \"allocator_time_reason\": \"--mode sample times no call\",\n");
    if (r->first_excluded) {
        unsigned op, large, reuse, phase;
        _al_row_split(r->first_row, &op, &large, &reuse, &phase);
        _al_buf_printf(b, "  \"first_call\": { \"op\": \"%s\", \"size_class\": \"%s\", \"cycles\": %llu, "
                       "\"ns\": %.0f, \"note\": \"counted in ops, kept out of their cycle figures\" },\n",
                       _al_op_name(op), large ? "large" : "small",
                       (unsigned long long)r->first_cycles, _al_report_ns(r, (double)r->first_cycles));
    }
    _al_buf_printf(b, "  \"timing\": { \"cycles_per_ns\": %.4f, \"rdtsc_overhead_cycles\": ", r->cycles_per_ns);
    if (_al_hot.timed)
        _al_buf_printf(b, "%llu },\n", (unsigned long long)_al_hot.tsc_overhead);
    else
        _al_buf_puts(b, "null },\n"); /* not measured: nothing to subtract it from */
    _al_buf_printf(b, "  \"profiler\": { \"mapped_bytes\": %llu, \"shadow_bytes\": %llu, \"process_peak_rss_bytes\": %llu },\n",
                   (unsigned long long)r->profiler_bytes, (unsigned long long)r->shadow_bytes,
                   (unsigned long long)r->peak_rss_bytes);
    counters(b, r);
    _al_report_memory_json(b, r);
    syscalls(b, r);
    locks(b, r);
    unavailable(b, "friendliness", "access sampling is not in this build yet", false);
    _al_report_sites_json(b, r);
    _al_buf_puts(b, "}\n");
}
