/* The profiled process's life as alloclens sees it: start-up (resolving the real allocator,
 * which must work even when the first malloc comes before any constructor), fork (the child
 * counts afresh and writes its own report), exec (the image about to be replaced writes its
 * report first) and exit (the report, with the exit status), through exit() or _exit. */
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "pprof.h"
#include "profiler.h"

_Atomic int _al_state;
struct al_settings _al_settings;
struct al_allocator_info _al_allocator;
al_usable_size_fn *_al_usable_size;
const void *_al_real_posix_spawn;

/* glibc's own registration, which pthread_atfork calls with the caller's __dso_handle. */
extern int __register_atfork(void (*prepare)(void), void (*parent)(void), void (*child)(void), void *dso);

static __thread int initializing_here __attribute__((tls_model("initial-exec")));
static const struct al_process_hooks *hooks;
static pid_t image_pid;
static bool started;

static void set_mode(enum al_mode m)
{
    _al_mode = m;
    _al_hot.timed = m != AL_MODE_SAMPLE;
    _al_hot.records = m == AL_MODE_FULL;
    /* Only a timed call subtracts the counter's own cost: measured when first needed (some
     * 30 us of every process's start on these VMs, --mode sample spared). */
    if (_al_hot.timed && !_al_hot.tsc_overhead)
        _al_hot.tsc_overhead = _al_tsc_measure_overhead();
}

/* What every call needs: the real functions, the cycle counter's cost, the shadow table and
 * the thread registry. Runs on the first call or in our constructor, whichever comes first;
 * it may come before libc has set up its environment, so it reads no settings but the mode,
 * where the environment is there already (another library's constructor allocating before
 * ours runs): the calls it counts are then counted as that mode counts them. */
void _al_process_init(const struct al_process_hooks *h)
{
    int expected = AL_STATE_NEW;
    if (!atomic_compare_exchange_strong(&_al_state, &expected, AL_STATE_INITIALIZING)) {
        if (initializing_here)
            return;
        while (atomic_load(&_al_state) != AL_STATE_READY)
            sched_yield();
        return;
    }
    initializing_here = 1;
    hooks = h;
    _al_tsc_start_init();
    if (h->resolve() < 0) {
        static const char msg[] = "alloclens: cannot find the real malloc behind the preload; aborting\n";
        (void)!write(STDERR_FILENO, msg, sizeof msg - 1);
        abort();
    }
    _al_code_of((const void *)_al_process_init, &_al_self_code);
    _al_usable_size = h->usable_size();
    _al_real_posix_spawn = h->posix_spawn_addr();
    if (_al_shadow_init() < 0)
        _al_log("cannot reserve the shadow table: every address is reported as new");
    _al_threads_init();
    int mode = _al_mode_parse(_al_env(_al_options[AL_OPT_MODE].env));
    set_mode(mode >= 0 ? (enum al_mode)mode : _al_mode);
    image_pid = getpid();
    atomic_store(&_al_state, AL_STATE_READY);
    initializing_here = 0;
}

/* Whether this is the image's own process: a vfork child shares our memory and never ran the
 * fork handlers, so it must not write (nor withdraw) a report. */
static bool own_process(void)
{
    return getpid() == image_pid;
}

/* The status as the parent will see it (exit(256) is 0). */
static void on_exit_report(int status, void *arg)
{
    (void)arg;
    /* A vfork child that calls exit() shares our memory: no report, as in the paths below. */
    if (!own_process())
        return;
    _al_report_write(AL_REPORT_EXIT, true, status & 0xff);
}

/* The registry's lock first: it blocks signals (thread.c), so no handler can come to the
 * sampler's locks held here, nor to any in the child until it has set them right. No thread is
 * left inside libunwind (sampler.c) but this one, where the fork comes from a handler that
 * interrupted it there; whether each lock was taken here or so held is kept for the release. */
static bool fork_took_unwind, fork_took_samples;

void _al_process_atfork_prepare(void)
{
    _al_threads_atfork_prepare();
    _al_sampler_fork_prepare();
    fork_took_unwind = _al_sampler_unwind_lock();
    fork_took_samples = _al_sampler_lock();
}

void _al_process_atfork_parent(void)
{
    _al_sampler_unlock(fork_took_samples);
    _al_sampler_unwind_unlock(fork_took_unwind);
    _al_sampler_fork_done(false);
    _al_threads_atfork_parent();
}

void _al_process_atfork_child(void)
{
    image_pid = getpid();
    _al_stderr_after_fork_child();
    _al_threads_after_fork_child();
    _al_sampler_atfork_child(fork_took_samples);
    _al_sampler_unwind_unlock(fork_took_unwind);
    _al_sampler_fork_done(true);
    _al_waste_after_fork_child();
    _al_heap_after_fork_child();
    _al_shadow_after_fork_child();
    _al_proc_after_fork_child();
    _al_report_restart(0, NULL);
    _al_threads_fork_done();
}

/* What needs libc fully set up: settings from the environment, the exit and fork handlers,
 * naming the allocator. Called from our constructor. */
void _al_process_start(int argc, char *const argv[])
{
    if (started)
        return;
    started = true;
    int was_busy = _al_tls ? _al_tls->busy : 0;
    struct al_thread *t = _al_tls ? _al_tls : _al_thread_attach();
    if (t)
        t->busy = 1; /* what follows may allocate: forwarded, not counted */
    _al_settings_load(&_al_settings);
    _al_hot.large_threshold = _al_settings.large_threshold;
    set_mode(_al_settings.mode);
    /* What start-up needs of /proc/self/status, in one read of it. */
    static const char *const fields[] = { "Seccomp", "TracerPid", "VmHWM" };
    long status[3];
    _al_proc_status_fields(fields, status, 3);
    /* Under a seccomp filter from the start, the descriptor table is not grown (the filter may
     * end the process at fcntl). */
    bool filtered = status[0] > 0;
    _al_fds_init(!filtered);
    _al_sampler_init(&_al_settings, status[2]);
    /* Why the allocator's system calls, and the events, are not measured (NULL: they are).
     * Started under a seccomp filter (a systemd service's SystemCallFilter, a sandbox), the
     * dispatch's prctl and the events' perf_event_open are calls such filters refuse, some by
     * ending the process, so neither is made. */
    const char *no_syscalls = NULL, *no_events = NULL;
    if (!_al_hot.timed) {
        no_syscalls = no_events = "not measured in --mode sample";
    } else if (filtered) {
        no_syscalls = "not under a seccomp filter, which may refuse the prctl that starts it";
        no_events = "not under a seccomp filter, which may refuse perf_event_open";
    } else {
        static char traced[sizeof _al_syscalls.reason];
        if (!_al_settings.syscalls) {
            no_syscalls = "off (--syscalls 0)";
        } else if (_al_settings.under_valgrind) {
            /* Valgrind makes the program's system calls from its own code, with every signal
             * blocked: a call dispatched there would kill the process with SIGSYS. */
            no_syscalls = "not under valgrind, which makes the program's system calls from its own code";
        } else if (status[1] > 0) {
            /* A debugger stops the program at every signal it gets, SIGSYS included (gdb's
             * default). */
            snprintf(traced, sizeof traced,
                     "not while the process is traced (by pid %ld), whose tracer would stop at each SIGSYS "
                     "that counting them takes", status[1]);
            no_syscalls = traced;
        }
        if (!_al_settings.events || strcmp(_al_settings.events, "off") == 0)
            no_events = "off (--events off)";
    }
    if (_al_hot.timed)
        _al_locks_init();
    if (no_syscalls)
        snprintf(_al_syscalls.reason, sizeof _al_syscalls.reason, "%s", no_syscalls);
    else
        _al_syscalls_init();
    if (no_events) {
        _al_counters.available = false;
        snprintf(_al_counters.reason, sizeof _al_counters.reason, "%s", no_events);
    } else {
        _al_counters_init(strcmp(_al_settings.events, "default") ? _al_settings.events : NULL,
                          _al_settings.sample_every, _al_settings.event_attrs);
    }
    if (t) {
        _al_sampler_thread_init(t);
        _al_thread_measure_init(t);
    }
    if (_al_settings.main_pid == 0) {
        /* Used without the CLI: this process is the main one; its children will know. */
        char pid[24];
        snprintf(pid, sizeof pid, "%d", (int)getpid());
        setenv(_al_options[AL_OPT_MAIN_PID].env, pid, 1);
        _al_settings.main_pid = getpid();
    }
    /* The process that writes the pprof profile at its end opens zlib and libelf now (a
     * failure is told with the profile). */
    if (_al_report_writes_pprof())
        _al_pprof_libs_open();
    _al_report_restart(argc, argv);
    _al_threads_phase_restart();
    on_exit(on_exit_report, NULL);
    /* Registered for no library (pthread_atfork would name ours): exit's _dl_fini runs before
     * our report and takes a library's fork handlers away with it, so a fork racing exit on
     * another thread would run our prepare handler and never the one that unlocks. */
    __register_atfork(_al_process_atfork_prepare, _al_process_atfork_parent, _al_process_atfork_child, NULL);
    hooks->started();
    _al_allocator_identify(&_al_allocator, hooks->malloc_addr(), hooks->own_malloc(),
                           _al_settings.allocator);
    _al_allocator_load_config(&_al_allocator, _al_settings.config, _al_hot.records);
    _al_allocator.threshold_source = "default";
    if (_al_settings.large_threshold_set) {
        _al_allocator.threshold_source = "option";
    } else if (_al_allocator.config) {
        _al_hot.large_threshold = _al_allocator.config->large_threshold;
        _al_allocator.threshold_source = "config";
    }
    if (_al_hot.records)
        _al_waste_init(_al_allocator.config);
    else
        snprintf(_al_waste.reason, sizeof _al_waste.reason, "not measured in --mode %s",
                 _al_mode_name(_al_mode));
    if (_al_report_planned() && _al_program_is_go())
        _al_log("this is a Go program, whose runtime ends the process with a system call of its "
                "own, past the exit handlers: no report at its end, unless it calls the C "
                "library's exit");
    if (_al_allocator.program_defines_malloc)
        _al_log("the program defines malloc itself (%s): alloclens cannot stand in front of "
                "that allocator and counts only what reaches it", _al_allocator.path);
    else if (_al_allocator.requested[0] && getpid() == _al_settings.main_pid)
        _al_log("asked for the allocator %s, but malloc resolves to %s (%s): the report "
                "describes %s", _al_allocator.requested, _al_allocator.name, _al_allocator.path,
                _al_allocator.name);
    if (t && !was_busy)
        _al_unbusy(t);
}

bool _al_process_shared_child(void)
{
    return image_pid && !own_process();
}

void _al_process_say_unreachable(const char *file, bool search, char *const envp[])
{
    /* Valgrind's launcher execs its tool, a static program, naming itself in VALGRIND_LAUNCHER:
     * the tool then loads the program itself, LD_PRELOAD and all. */
    if (!started || !_al_report_planned() || _al_env_in(envp, "VALGRIND_LAUNCHER"))
        return;
    const char *unreachable = _al_preload_unreachable(file, search);
    if (unreachable)
        _al_log("%s %s, so it runs unprofiled and writes no report", file, unreachable);
}

void _al_process_before_exec(const char *file, bool search, char *const envp[])
{
    _al_process_say_unreachable(file, search, envp);
    if (own_process())
        _al_report_write(AL_REPORT_EXEC, false, 0);
}

/* seccomp's strict mode allows the thread read, write, exit and sigreturn only, and turns rdtsc
 * off for it (it faults): neither timing its calls, nor state for them, nor a report at the end
 * is possible after. So the report is written now, with one line saying why, and the thread's
 * calls go straight to the allocator from then on (its state busy for good, its dispatch off).
 * Should the request fail after all, the thread stays unmeasured. */
void _al_process_before_strict(void)
{
    if (atomic_load_explicit(&_al_state, memory_order_acquire) != AL_STATE_READY)
        return;
    struct al_thread *t = _al_tls ? _al_tls : _al_thread_attach();
    if (own_process() && _al_report_planned()) {
        _al_log("the program put a thread in seccomp strict mode (no system call but read, write and "
                "exit): the report is written now, and what follows is not measured");
        _al_report_write(AL_REPORT_STRICT, false, 0);
    }
    if (t) {
        t->busy = AL_BUSY_EXITING;
        _al_syscalls_thread_exit(t);
    }
}

void _al_process_exec_failed(void)
{
    if (own_process())
        _al_report_forget_exec();
}

/* The report of a process ending without exit(), perhaps from a signal handler. */
static void report_abrupt_end(enum al_report_kind kind, int status, bool *own_memory)
{
    if (atomic_load(&_al_state) != AL_STATE_READY || !started || !own_process())
        return;
    struct al_thread *t = _al_tls;
    if (t && t->busy) {
        /* A signal handler interrupted one of our calls: the state it left half-updated (and
         * the lock it may hold) cannot be reported from here. */
        if (kind == AL_REPORT_SIGNAL)
            _al_log("SIG%s came inside an allocator call: no report for this process",
                    sigabbrev_np(status));
        else
            _al_log("the program ended without exit() (status %d) from inside an allocator call "
                    "(a signal handler's?): no report for this process", status);
        return;
    }
    *own_memory = true;
    _al_report_write(kind, kind == AL_REPORT_EXIT, status);
}

void _al_process_before_exit_syscall(int status, bool *own_memory)
{
    report_abrupt_end(AL_REPORT_EXIT, status & 0xff, own_memory);
}

void _al_process_before_fatal_signal(int sig, bool *own_memory)
{
    report_abrupt_end(AL_REPORT_SIGNAL, sig, own_memory);
}
