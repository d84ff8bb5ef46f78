/* The human report: what a person reads on stderr at exit. */
#include <stdio.h>
#include <string.h>

#include "profiler.h"

static void human_time(struct al_buf *b, double t_ns)
{
    if (t_ns >= 1e9)
        _al_buf_printf(b, "%.3f s", t_ns / 1e9);
    else if (t_ns >= 1e6)
        _al_buf_printf(b, "%.3f ms", t_ns / 1e6);
    else
        _al_buf_printf(b, "%.1f us", t_ns / 1e3);
}

/* Under a measured section: what it leaves out (see seccomp.c). */
static void text_note(struct al_buf *b)
{
    const char *n = _al_seccomp_note();
    if (n)
        _al_buf_printf(b, "  (%s)\n", n);
}

void _al_report_text(struct al_buf *b, const struct al_report *r)
{
    char head[64];
    size_t shown = (size_t)snprintf(head, sizeof head, "\n== alloclens report, pid %d:", (int)r->pid);
    _al_buf_puts(b, head);
    /* The line cut after about 4000 bytes of arguments (counted here: B may be streamed), and
     * said to be; the JSON has them all. */
    size_t i = 0, n;
    for (; i < r->argv_len && shown <= 4000; i += n + 1) {
        n = strnlen(r->argv + i, r->argv_len - i);
        _al_buf_puts(b, " ");
        _al_buf_shell_word(b, r->argv + i, n);
        shown += 1 + n;
    }
    _al_buf_puts(b, i < r->argv_len ? " ... (cut)\n" : "\n");
    const struct al_allocator_info *a = &r->allocator;
    _al_buf_printf(b, "allocator    %s%s%s (%s)\n", a->name, a->version[0] ? " " : "", a->version, a->path);
    if (a->requested[0])
        _al_buf_printf(b, "             asked for %s, which does not serve the calls\n", a->requested);
    if (a->config)
        _al_buf_printf(b, "style        %s, %u size classes (%llu .. %llu bytes), page %llu\n",
                       _al_config_style_name(a->config->style), a->config->nclasses,
                       (unsigned long long)a->config->runs[0].first,
                       (unsigned long long)_al_config_last_class(a->config),
                       (unsigned long long)a->config->page_size);
    else
        _al_buf_printf(b, "style        unknown: %s\n", a->config_reason);
    _al_buf_printf(b, "large        requests >= %llu bytes (threshold from the %s)\n",
                   (unsigned long long)r->large_threshold,
                   a->threshold_source && !strcmp(a->threshold_source, "config") ? "allocator's config"
                   : a->threshold_source && !strcmp(a->threshold_source, "option") ? "--large-threshold option"
                                                                                   : "default: no config");
    _al_buf_puts(b, "runtime      ");
    human_time(b, (double)r->runtime_ns);
    if (r->end_signal)
        _al_buf_printf(b, ", ended by SIG%s", sigabbrev_np(r->end_signal));
    _al_buf_printf(b, "; threads %llu in all, at most %llu at once; serial ",
                   (unsigned long long)r->threads.total, (unsigned long long)r->threads.max_live);
    human_time(b, _al_report_ns(r, (double)r->threads.serial_cycles));
    _al_buf_puts(b, ", parallel ");
    human_time(b, _al_report_ns(r, (double)r->threads.parallel_cycles));
    _al_buf_puts(b, "\n");

    uint64_t calls = 0;
    for (unsigned i = 0; i < AL_ROWS; i++)
        calls += r->rows[i].count;
    /* --mode sample times no call: its calls are counted, their time said to be unknown rather
     * than shown as 0. */
    if (_al_hot.timed) {
        double in_alloc = _al_report_ns(r, (double)_al_report_alloc_cycles(r));
        _al_buf_puts(b, "in allocator ");
        human_time(b, in_alloc);
        _al_buf_printf(b, " over %llu calls, all threads (%.1f%% of runtime)\n", (unsigned long long)calls,
                       r->runtime_ns ? 100.0 * in_alloc / (double)r->runtime_ns : 0.0);
        _al_buf_puts(b, "\nop              class  reuse   phase           count   mean cyc    p50    p99  p99.9   mean ns\n");
    } else {
        _al_buf_printf(b, "in allocator not timed (--mode sample); %llu calls, all threads\n",
                       (unsigned long long)calls);
        _al_buf_puts(b, "\nop              class  reuse   phase           count\n");
    }
    for (unsigned i = 0; i < AL_ROWS; i++) {
        const struct al_row *row = &r->rows[i];
        if (!row->count)
            continue;
        struct al_row_stats s;
        _al_report_row(r, i, &s);
        _al_buf_printf(b, "%-15s %-6s %-7s %-8s %12llu", s.op, s.size_class, s.reuse, s.phase,
                       (unsigned long long)row->count);
        if (_al_hot.timed)
            _al_buf_printf(b, " %10.1f %6llu %6llu %6llu %9.1f", s.mean, (unsigned long long)s.p50,
                           (unsigned long long)s.p99, (unsigned long long)s.p999, _al_report_ns(r, s.mean));
        _al_buf_puts(b, "\n");
    }
    if (r->first_excluded) {
        unsigned op, large, reuse, phase;
        _al_row_split(r->first_row, &op, &large, &reuse, &phase);
        _al_buf_printf(b, "(the process's first call, %s, took %llu cycles: counted above, kept out of the times)\n",
                       _al_op_name(op), (unsigned long long)r->first_cycles);
    }
    const struct al_counters_config *c = &_al_counters;
    if (c->available) {
        _al_buf_printf(b, "\ncounters     %s events, 1 op in %u%s%s\n", c->software ? "software" : "hardware",
                       c->sample_every, c->reason[0] ? ": " : "", c->reason);
        text_note(b);
        if (r->measure.ctr_dropped)
            _al_buf_printf(b, "  (%llu calls due to be counted left out: more records than the ring holds, "
                           "or a switch too early in the run to time)\n",
                           (unsigned long long)r->measure.ctr_dropped);
        for (unsigned e = 0; e < c->nevents; e++) {
            _al_buf_printf(b, "  %-22s", c->events[e].name);
            for (unsigned op = 0; op < AL_OP_COUNT; op++)
                if (r->measure.ctr_ops[op])
                    _al_buf_printf(b, " %s %.2f", _al_op_name(op), _al_report_counter(r, op, e));
            _al_buf_puts(b, "  (per op)\n");
        }
    } else {
        _al_buf_printf(b, "\ncounters     unavailable: %s\n", c->reason);
    }
    _al_report_memory_text(b, r);
    if (_al_syscalls.dispatch) {
        _al_buf_puts(b, "syscalls     inside allocator calls (syscall user dispatch):");
        for (unsigned k = 0; k < AL_SYS_N; k++) {
            uint64_t n, cyc;
            _al_report_syscall_total(r, k, &n, &cyc);
            if (n)
                _al_buf_printf(b, " %s %llu (%.1f us)", _al_syscall_name(k), (unsigned long long)n, _al_report_ns(r, (double)cyc) / 1e3);
        }
        _al_buf_puts(b, "\n");
        text_note(b);
    } else {
        _al_buf_printf(b, "syscalls     unavailable: %s\n", _al_syscalls.reason);
    }
    if (_al_locks) {
        uint64_t acq = 0, cont = 0, wait = 0;
        unsigned nlocks = 0;
        for (unsigned k = 0, n = _al_locks_claimed(); k < n; k++) {
            const struct al_lock_stats *l = _al_locks_at(k);
            if (!l)
                continue;
            nlocks++;
            acq += atomic_load(&l->acquisitions);
            cont += atomic_load(&l->contended);
            wait += atomic_load(&l->wait_cycles);
        }
        _al_buf_printf(b, "locks        %u pthread locks taken in allocator calls: %llu acquisitions, %llu contended "
                       "(%.1f us waiting); futex waits %llu\n", nlocks, (unsigned long long)acq,
                       (unsigned long long)cont, _al_report_ns(r, (double)wait) / 1e3, (unsigned long long)r->measure.sys.futex_waits);
    }
    _al_report_sites_text(b, r);
    _al_buf_printf(b, "profiler     %.1f MiB mapped for its own state, mostly never touched (shadow table %.1f MiB "
                   "resident); ", (double)r->profiler_bytes / 1048576.0, (double)r->shadow_bytes / 1048576.0);
    if (r->peak_rss_bytes)
        _al_buf_printf(b, "process peak RSS %.1f MiB, alloclens in it\n\n", (double)r->peak_rss_bytes / 1048576.0);
    else
        _al_buf_puts(b, "process peak RSS unknown (/proc/self/status unreadable)\n\n");
}
