/* Event counters around one allocator call in N (see counters.h).
 *
 * Init (start-up, once): names are resolved with libpfm4, which knows the CPU's own PMU events
 * and the generic perf names (cycles, cache-misses, page-faults, ...), then probed with
 * perf_event_open on the calling thread, the whole set as a thread will open it. libpfm4
 * is loaded for this and unloaded after; it allocates while it initializes and parses, which
 * happens here only, under the lead's start-up guard.
 *
 * Per thread (after init): the events are opened on the thread's first counted call. Hardware
 * counters are read with rdpmc where the kernel allows user-space reads of that counter, read(2)
 * otherwise. Software events have no user-space read, and a read(2) on each side of a call
 * costs more than the call and lands in the task-clock it measures (hundreds of ns per malloc
 * on these VMs), so each one samples every occurrence (period 1) into one ring per thread,
 * mapped here: a counted call notes the ring's head before and counts the records written
 * until after, without a system call. task-clock and cpu-clock cannot be sampled per
 * occurrence; the ring's owner, a dummy event, writes the kernel's switch-out and switch-in
 * records (with their perf-clock times), and a clock event's value for the call is its cycles
 * less the time between those records. Between counted calls the ring may fill; the kernel
 * then drops records (cheaply), and the next counted call frees it first. Nothing after init
 * allocates. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

/* The kernel's header first: libpfm4's own copy of its definitions then stands aside. */
#include "counters.h"
#include "profiler.h"

struct al_counters_config _al_counters = { .sample_every = 1 };

#define SAMPLE_EVERY_MAX 1000000u

/* An event on this thread, its descriptor out of the program's way (fds.c), and its id into
 * *ID (NULL: not wanted); -1 with errno set, nothing left open, when either fails. */
static long perf_open(struct perf_event_attr *attr, int group_fd, uint64_t *id)
{
    long fd = syscall(SYS_perf_event_open, attr, 0 /* this thread */, -1 /* any cpu */, group_fd,
                      PERF_FLAG_FD_CLOEXEC);
    if (fd < 0)
        return fd;
    fd = _al_fd_high((int)fd);
    if (id && ioctl((int)fd, PERF_EVENT_IOC_ID, id) != 0) {
        int e = errno;
        close((int)fd);
        errno = e;
        return -1;
    }
    return fd;
}

/* Closes FD only if it is still the event ID: a program may close every descriptor it did not
 * open and be given the number again for one of its own, which a fork child closing its copy
 * of our set must not take from it. A device is never one of ours, and is not asked: its
 * driver has ioctls of its own. */
static void close_event(int fd, uint64_t id)
{
    struct stat st;
    uint64_t now;
    if (fstat(fd, &st) == 0 && !S_ISCHR(st.st_mode) && !S_ISBLK(st.st_mode) &&
        ioctl(fd, PERF_EVENT_IOC_ID, &now) == 0 && now == id)
        close(fd);
}

static bool is_software(const struct perf_event_attr *attr)
{
    return attr->type == PERF_TYPE_SOFTWARE;
}

static enum al_event_kind kind_of(const struct perf_event_attr *a)
{
    if (!is_software(a))
        return AL_EV_HARDWARE;
    if (a->config == PERF_COUNT_SW_TASK_CLOCK || a->config == PERF_COUNT_SW_CPU_CLOCK)
        return AL_EV_CLOCK;
    return AL_EV_RING;
}

/* ---- init ------------------------------------------------------------------------------- */

/* kernel.perf_event_paranoid as text for a reason line ("unknown" when it cannot be read). */
static const char *paranoid_text(char buf[32])
{
    if (_al_proc_read("/proc/sys/kernel/perf_event_paranoid", buf, 32) < 0)
        return "unknown";
    const char *p = buf + (buf[0] == '-');
    const char *end = p;
    _al_proc_num(&end, 10);
    if (end == p)
        return "unknown";
    buf[end - buf] = '\0';
    return buf;
}

static bool is_no_pmu(int e)
{
    return e == ENOENT || e == EOPNOTSUPP || e == ENODEV;
}

static bool is_denied(int e)
{
    return e == EACCES || e == EPERM;
}

/* The kernel turns on a software event kind's hooks as the first event of that kind in the
 * system opens, and off as the last one closes, each time rewriting its code on every CPU
 * (a static key: an interrupt to each CPU, expensive in a VM). Opened and closed one after
 * the other, the probes below would turn them on and off again for each event and for the
 * group: each probe's software event is held until init ends instead, so the group opens with
 * the hooks on.
 * (Nothing is kept past init: a program finds no descriptor of ours before its first call.) */
static int held[AL_MAX_EVENTS + 1];
static unsigned nheld;

static void hold_probe(int fd)
{
    if (nheld < sizeof held / sizeof *held)
        held[nheld++] = fd;
    else
        close(fd);
}

static void release_probes(void)
{
    while (nheld)
        close(held[--nheld]);
}

/* Opens EV alone on this thread, holding it until init ends if it is a software event: 0 or
 * an errno. Software events are counted
 * kernel side too (a page fault is taken in the kernel); where perf_event_paranoid forbids
 * that, they fall back to user-mode only and *USER_ONLY says so. */
static int probe(struct al_event *ev, bool *user_only)
{
    struct perf_event_attr a = ev->attr;
    a.disabled = 1;
    if (is_software(&a))
        a.exclude_kernel = 0;
    long fd = perf_open(&a, -1, NULL);
    if (fd < 0 && is_software(&a) && is_denied(errno)) {
        a.exclude_kernel = 1;
        fd = perf_open(&a, -1, NULL);
        if (fd >= 0)
            *user_only = true;
    }
    if (fd < 0)
        return errno ? errno : EINVAL;
    /* A hardware event switches no hooks, and held, one of a PMU that takes a single event
     * at a time (intel_pt) would have the group's refused. */
    if (is_software(&a))
        hold_probe((int)fd);
    else
        close((int)fd);
    ev->attr.exclude_kernel = a.exclude_kernel;
    return 0;
}

static int open_set(struct al_thread_counters *c, unsigned *failed);
static void close_set(struct al_thread_counters *c, bool mapped);

/* Opens the whole set as a thread will, and closes it. 0 or an errno. */
static int probe_group(void)
{
    struct al_thread_counters c = { 0 };
    unsigned failed;
    int e = open_set(&c, &failed);
    close_set(&c, true);
    return e;
}

static __attribute__((format(printf, 1, 2))) void set_unavailable(const char *fmt, ...)
{
    _al_counters.available = false;
    _al_counters.software = false;
    _al_counters.nevents = 0;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(_al_counters.reason, sizeof _al_counters.reason, fmt, ap);
    va_end(ap);
}

/* Adds a note to the reason, after "; " when it has one already. */
static __attribute__((format(printf, 1, 2))) void add_reason(const char *fmt, ...)
{
    size_t len = strlen(_al_counters.reason);
    if (len && len + 2 < sizeof _al_counters.reason) {
        memcpy(_al_counters.reason + len, "; ", 3);
        len += 2;
    }
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(_al_counters.reason + len, sizeof _al_counters.reason - len, fmt, ap);
    va_end(ap);
}

/* Whether this process tells what is wrong with the events a user named: the run's main one
 * does, for all of its processes (struct al_settings). */
static bool tells(bool user)
{
    return user && !_al_settings.told_already;
}

/* Resolves LIST into _al_counters.events. User-named events that do not resolve are warned
 * about and dropped when USER; the default sets always resolve. */
static void resolve_list(const char *list, bool user)
{
    _al_counters.nevents = 0;
    const char *p = list;
    char name[sizeof _al_counters.events[0].name];
    bool too_long;
    while (_al_event_next_name(&p, name, sizeof name, &too_long)) {
        if (too_long) {
            if (tells(user))
                _al_log("%s: event '%s...': name too long, ignored", _al_options[AL_OPT_EVENTS].env, name);
            continue;
        }
        if (_al_counters.nevents == AL_MAX_EVENTS) {
            if (tells(user))
                _al_log("%s: event '%s' ignored: at most %d events are counted", _al_options[AL_OPT_EVENTS].env,
                        name, AL_MAX_EVENTS);
            continue;
        }
        struct al_event *ev = &_al_counters.events[_al_counters.nevents];
        char err[192];
        if (_al_event_resolve(name, &ev->attr, err, sizeof err) != 0) {
            if (tells(user))
                _al_log("%s: %s; not counted", _al_options[AL_OPT_EVENTS].env, err);
            continue;
        }
        memcpy(ev->name, name, strlen(name) + 1);
        ev->kind = kind_of(&ev->attr);
        _al_counters.nevents++;
    }
}

static void drop_event(unsigned i)
{
    memmove(&_al_counters.events[i], &_al_counters.events[i + 1],
            (_al_counters.nevents - i - 1) * sizeof _al_counters.events[0]);
    _al_counters.nevents--;
}

static void denied_reason(int e)
{
    char buf[32];
    set_unavailable("perf_event_open not permitted (kernel.perf_event_paranoid = %s: %s)",
                    paranoid_text(buf), strerror(e));
}

/* Probes every event; drops the ones this machine lacks (warning about user-named ones).
 * Returns 0, or the errno of a permission failure (the caller reports it). */
static int probe_all(bool user, bool *user_only)
{
    for (unsigned i = 0; i < _al_counters.nevents;) {
        int e = probe(&_al_counters.events[i], user_only);
        if (e == 0) {
            i++;
            continue;
        }
        if (is_denied(e))
            return e;
        if (tells(user))
            _al_log("event '%s' cannot be counted on this machine (perf_event_open: %s)%s; not counted",
                    _al_counters.events[i].name, strerror(e),
                    is_no_pmu(e) && !is_software(&_al_counters.events[i].attr) ? ": no hardware PMU" : "");
        drop_event(i);
    }
    return 0;
}

/* The set the user named: 0, the errno of a permission failure (the caller reports it), or -1
 * with the section already made unavailable. */
static int choose_named(const char *events, bool *user_only)
{
    resolve_list(events, true);
    if (_al_counters.nevents == 0) {
        set_unavailable("none of the events '%s' is known here", events);
        return -1;
    }
    int e = probe_all(true, user_only);
    if (e == 0 && _al_counters.nevents == 0) {
        set_unavailable("none of the events '%s' can be counted on this machine", events);
        return -1;
    }
    return e;
}

/* The default set, returning as choose_named: hardware where the machine has a PMU (the first
 * event decides), software events otherwise. */
static int choose_default(bool *user_only)
{
    resolve_list(_al_events_default_hw, false);
    int e = _al_counters.nevents ? probe(&_al_counters.events[0], user_only) : ENOENT;
    if (e == 0)
        return probe_all(false, user_only);
    if (is_denied(e))
        return e;
    if (!is_no_pmu(e)) {
        set_unavailable("perf_event_open failed for '%s': %s", _al_counters.events[0].name,
                        strerror(e));
        return -1;
    }
    resolve_list(_al_events_default_sw, false);
    snprintf(_al_counters.reason, sizeof _al_counters.reason,
             "no hardware PMU on this machine (perf_event_open: %s); software events instead",
             strerror(e));
    _al_counters.software = true;
    e = probe_all(false, user_only);
    if (e == 0 && _al_counters.nevents == 0) {
        set_unavailable("neither hardware nor software events can be counted here");
        return -1;
    }
    return e;
}

static void counters_init(const char *events, unsigned sample_every)
{
    memset(&_al_counters, 0, sizeof _al_counters);
    _al_tsc_start_init();
    if (sample_every < 1)
        sample_every = 1;
    if (sample_every > SAMPLE_EVERY_MAX)
        sample_every = SAMPLE_EVERY_MAX;
    _al_counters.sample_every = sample_every;

    char err[192];
    struct perf_event_attr probe_attr;
    if (_al_event_resolve("page-faults", &probe_attr, err, sizeof err) != 0) {
        set_unavailable("%s", err);
        return;
    }

    bool user = events && events[0];
    bool user_only = false;
    int e = user ? choose_named(events, &user_only) : choose_default(&user_only);
    if (e == 0) {
        e = probe_group();
        if (e && !is_denied(e)) {
            set_unavailable("the event group cannot be opened on this machine (perf_event_open: %s)",
                            strerror(e));
            return;
        }
    }
    if (e > 0)
        denied_reason(e);
    if (e)
        return;
    if (user_only) {
        char buf[32];
        add_reason("software events count user mode only (kernel.perf_event_paranoid = %s)", paranoid_text(buf));
    }
    for (unsigned i = 0; i < _al_counters.nevents; i++) {
        if (_al_counters.events[i].kind == AL_EV_CLOCK) {
            add_reason("%s: the call's cycles less its time switched out", _al_counters.events[i].name);
            break;
        }
    }
    /* A user-named set made only of software events is software too, and says so. */
    if (user) {
        bool all_sw = true;
        for (unsigned i = 0; i < _al_counters.nevents; i++)
            all_sw = all_sw && is_software(&_al_counters.events[i].attr);
        _al_counters.software = all_sw;
    }
    _al_counters.available = true;
}

void _al_counters_init(const char *events, unsigned sample_every, const char *resolved)
{
    if (resolved && !_al_event_names_load(resolved))
        _al_log("%s is not what 'alloclens run' writes there; event names resolved with libpfm4",
                _al_options[AL_OPT_EVENT_ATTRS].env);
    counters_init(events, sample_every);
    release_probes();
    _al_event_names_done();
}

/* ---- per-thread groups ------------------------------------------------------------------ */

static size_t page_size(void)
{
    static size_t ps;
    size_t v = __atomic_load_n(&ps, __ATOMIC_RELAXED);
    if (!v) {
        long l = sysconf(_SC_PAGESIZE);
        v = l > 0 ? (size_t)l : 4096;
        __atomic_store_n(&ps, v, __ATOMIC_RELAXED);
    }
    return v;
}

/* MAPPED: the ring and rdpmc pages are mapped in this process (the kernel does not copy them
 * into a fork child, where something else may be mapped there since). */
static void close_set(struct al_thread_counters *c, bool mapped)
{
    if (c->ring && mapped)
        munmap(c->ring, (1 + AL_RING_PAGES) * page_size());
    c->ring = NULL;
    for (unsigned i = AL_MAX_EVENTS; i-- > 0;) {
        if (c->page[i] && mapped)
            munmap(c->page[i], page_size());
        c->page[i] = NULL;
        if (c->fd[i] >= 0)
            close_event(c->fd[i], c->id[i]);
        c->fd[i] = -1;
    }
    if (c->ring_fd >= 0)
        close_event(c->ring_fd, c->ring_id);
    c->ring_fd = -1;
}

void _al_counters_thread_close(struct al_thread_counters *c, bool fork_child)
{
    if (c->state == 1)
        close_set(c, !fork_child);
    /* Back to "not opened": a state reused by another thread (or copied into a fork child,
     * where the fds count the parent's thread) opens its own. */
    c->state = 0;
}

/* The ring: a dummy event that writes nothing but, when a clock event needs them, the
 * thread's switch records with their times; the software events' samples are redirected
 * into it. Wakeups only when it is full: nobody waits on it. */
static int open_ring(struct al_thread_counters *c, bool switches)
{
    struct perf_event_attr a;
    memset(&a, 0, sizeof a);
    a.size = sizeof a;
    a.type = PERF_TYPE_SOFTWARE;
    a.config = PERF_COUNT_SW_DUMMY;
    a.exclude_kernel = 1;
    a.exclude_hv = 1;
    a.context_switch = switches;
    a.sample_id_all = 1;
    a.sample_type = PERF_SAMPLE_TIME;
    a.watermark = 1;
    a.wakeup_watermark = AL_RING_PAGES * (uint32_t)page_size();
    long fd = perf_open(&a, -1, &c->ring_id);
    if (fd < 0)
        return errno ? errno : EINVAL;
    c->ring_fd = (int)fd;
    void *base = mmap(NULL, (1 + AL_RING_PAGES) * page_size(), PROT_READ | PROT_WRITE, MAP_SHARED,
                      (int)fd, 0);
    if (base == MAP_FAILED)
        return errno ? errno : ENOMEM;
    c->ring = base;
    return 0;
}

/* Opens every event of the set on this thread into C, setting only its descriptors and
 * mappings (the countdown and state are the caller's). 0, or an errno with *FAILED the index
 * of the event that could not be opened (nevents: the ring). Hardware events share one group,
 * led by the first of them, so they are scheduled on the PMU together. */
static int open_set(struct al_thread_counters *c, unsigned *failed)
{
    c->ring_fd = -1;
    c->ring = NULL;
    for (unsigned i = 0; i < AL_MAX_EVENTS; i++) {
        c->fd[i] = -1;
        c->page[i] = NULL;
        c->id[i] = 0;
    }
    unsigned n = _al_counters.nevents;
    bool ring = false, clock = false;
    for (unsigned i = 0; i < n; i++) {
        ring = ring || _al_counters.events[i].kind != AL_EV_HARDWARE;
        clock = clock || _al_counters.events[i].kind == AL_EV_CLOCK;
    }
    *failed = n;
    int e;
    if (ring && (e = open_ring(c, clock)) != 0)
        return e;
    int leader = -1;
    for (unsigned i = 0; i < n; i++) {
        const struct al_event *ev = &_al_counters.events[i];
        if (ev->kind == AL_EV_CLOCK)
            continue;
        struct perf_event_attr a = ev->attr;
        a.disabled = 0;
        a.read_format = 0;
        a.inherit = 0;
        if (ev->kind == AL_EV_RING) {
            a.sample_period = 1;
            a.sample_type = PERF_SAMPLE_IDENTIFIER;
        }
        *failed = i;
        long fd = perf_open(&a, ev->kind == AL_EV_HARDWARE ? leader : -1, &c->id[i]);
        if (fd < 0)
            return errno ? errno : EINVAL;
        c->fd[i] = (int)fd;
        if (ev->kind == AL_EV_RING) {
            if (ioctl((int)fd, PERF_EVENT_IOC_SET_OUTPUT, c->ring_fd) != 0)
                return errno ? errno : EINVAL;
            continue;
        }
        if (leader < 0)
            leader = (int)fd;
        /* The mmap page tells whether user space may rdpmc this counter. */
        void *pg = mmap(NULL, page_size(), PROT_READ, MAP_SHARED, (int)fd, 0);
        if (pg != MAP_FAILED)
            c->page[i] = pg;
    }
    *failed = n;
    return 0;
}

static void open_group_now(struct al_thread_counters *c)
{
    if (!_al_counters.available || _al_counters.nevents == 0 ||
        atomic_load_explicit(&_al_seccomp_on, memory_order_relaxed)) {
        c->state = -1;
        return;
    }
    unsigned failed;
    int e = open_set(c, &failed);
    if (e == 0) {
        c->state = 1;
        return;
    }
    static _Atomic int warned;
    bool ev = failed < _al_counters.nevents;
    /* errno named, not strerror(): no gettext (which may allocate) after init */
    if (!atomic_exchange_explicit(&warned, 1, memory_order_relaxed))
        _al_log("counters: a thread could not open %s%s%s (%s); its calls are not counted",
                ev ? "event '" : "its perf ring", ev ? _al_counters.events[failed].name : "",
                ev ? "'" : "", strerrorname_np(e));
    close_set(c, true);
    c->state = -1;
}

/* Inside the program's allocator call, as read_one: the close(2) of moving a descriptor out of
 * the program's way is a cancellation point, where a pending cancel would end the thread. */
static AL_COLD void open_group(struct al_thread_counters *c)
{
    int cancel = _al_nocancel_begin();
    open_group_now(c);
    _al_nocancel_end(cancel);
}

int _al_counter_read_fd(int fd, uint64_t *value)
{
    uint64_t v;
    ssize_t n;
    do
        n = read(fd, &v, sizeof v);
    while (n < 0 && errno == EINTR);
    if (n < 0)
        return -errno;
    if (n != sizeof v)
        return -EIO;
    *value = v;
    return 0;
}

static inline uint64_t rdpmc(uint32_t counter)
{
    uint32_t lo, hi;
    __asm__ __volatile__("rdpmc" : "=a"(lo), "=d"(hi) : "c"(counter));
    return ((uint64_t)hi << 32) | lo;
}

/* The seqlock protocol documented in linux/perf_event.h (struct perf_event_mmap_page). */
int _al_counter_read_rdpmc(void *page, uint64_t *value)
{
    volatile struct perf_event_mmap_page *pc = page;
    if (!pc)
        return -EAGAIN;
    uint32_t seq, idx;
    uint64_t count;
    do {
        seq = pc->lock;
        __atomic_signal_fence(__ATOMIC_SEQ_CST);
        idx = pc->index;
        if (!pc->cap_user_rdpmc || idx == 0)
            return -EAGAIN;
        count = (uint64_t)pc->offset;
        uint16_t width = pc->pmc_width;
        if (width == 0 || width > 64)
            return -EAGAIN;
        int64_t pmc = (int64_t)rdpmc(idx - 1);
        pmc = (int64_t)((uint64_t)pmc << (64 - width)) >> (64 - width); /* sign-extend */
        count += (uint64_t)pmc;
        __atomic_signal_fence(__ATOMIC_SEQ_CST);
    } while (pc->lock != seq);
    *value = count;
    return 0;
}

#define READ_FAILED UINT64_MAX

static inline uint64_t read_one(struct al_thread_counters *c, unsigned i)
{
    uint64_t v;
    if (c->page[i] && _al_counter_read_rdpmc(c->page[i], &v) == 0)
        return v;
    /* Inside the program's allocator call: a cancel acted on in read(2) would leave the
     * thread marked busy while its cleanup handlers run. */
    int cancel = _al_nocancel_begin();
    int rc = _al_counter_read_fd(c->fd[i], &v);
    _al_nocancel_end(cancel);
    return rc == 0 ? v : READ_FAILED;
}

void _al_counters_before(struct al_thread_counters *c)
{
    if (AL_UNLIKELY(c->state == 0))
        open_group(c);
    if (c->state != 1)
        return;
    /* The ring's window first and the hardware counters last (the reverse after the call), so
     * that the counters see as little of our own work as they can. */
    if (c->ring) {
        /* What the ring holds is from before this call: freed unread. */
        struct perf_event_mmap_page *pc = c->ring;
        uint64_t head = __atomic_load_n(&pc->data_head, __ATOMIC_ACQUIRE);
        __atomic_store_n(&pc->data_tail, head, __ATOMIC_RELEASE);
        c->ring_start = head;
    }
    unsigned n = _al_counters.nevents;
    for (unsigned i = 0; i < n; i++)
        if (_al_counters.events[i].kind == AL_EV_HARDWARE)
            c->start[i] = read_one(c, i);
}

void _al_ring_window_add(const struct perf_event_header *rec, void *arg)
{
    struct al_ring_window *w = arg;
    if (rec->type == PERF_RECORD_SAMPLE && rec->size >= sizeof *rec + 8) {
        uint64_t id;
        memcpy(&id, rec + 1, sizeof id); /* PERF_SAMPLE_IDENTIFIER comes first */
        for (unsigned i = 0; i < _al_counters.nevents; i++)
            if (w->c->id[i] == id && _al_counters.events[i].kind == AL_EV_RING)
                w->count[i]++;
    } else if (rec->type == PERF_RECORD_SWITCH && rec->size >= sizeof *rec + 8) {
        uint64_t time;
        memcpy(&time, (const char *)rec + rec->size - 8, sizeof time); /* sample_id: the time */
        if (rec->misc & PERF_RECORD_MISC_SWITCH_OUT) {
            w->switched_out = time;
        } else if (w->switched_out && time >= w->switched_out) {
            w->off_cpu_ns += time - w->switched_out;
            w->switched_out = 0;
        }
    }
}

/* The TSC's rate against CLOCK_MONOTONIC since start-up (0 while that is under 100 us): coarse
 * at first, good enough to tell a call's time from a preemption's. */
static double rough_rate(void)
{
    static _Atomic double settled;
    double r = atomic_load_explicit(&settled, memory_order_relaxed);
    if (r > 0)
        return r;
    struct al_clock_pair now = _al_tsc_pair_now();
    r = _al_tsc_rate(_al_tsc_start(), now);
    if (now.ns - _al_tsc_start().ns >= 100000000) /* 0.1 s: kept */
        atomic_store_explicit(&settled, r, memory_order_relaxed);
    return r;
}

/* The ring's window is a little wider than the timed call (the ring's head is read on either
 * side of the two rdtsc): a switch-out in between shows as far more time off the CPU than the
 * call's cycles hold, and belongs to no call. 1: OFF_NS fits in CYCLES, 0: it does not,
 * -1: too early to tell. */
static AL_NOINLINE int off_cpu_inside(uint64_t cycles, uint64_t off_ns)
{
    double cpn = rough_rate();
    if (cpn <= 0)
        return -1;
    return (double)off_ns <= 1.25 * (double)cycles / cpn + 1000.0;
}

enum al_counted _al_counters_after(struct al_thread_counters *c, uint64_t cycles, uint64_t *sums,
                                   uint64_t *off_cpu_ns)
{
    unsigned every = _al_counters.sample_every;
    c->countdown = every ? every : 1;
    if (c->state != 1)
        return AL_CTR_NONE;
    uint64_t hw[AL_MAX_EVENTS];
    for (unsigned i = 0; i < _al_counters.nevents; i++)
        if (_al_counters.events[i].kind == AL_EV_HARDWARE)
            hw[i] = read_one(c, i);
    struct al_ring_window w = { .c = c };
    if (c->ring) {
        struct perf_event_mmap_page *pc = c->ring;
        size_t data = AL_RING_PAGES * page_size();
        uint64_t head = __atomic_load_n(&pc->data_head, __ATOMIC_ACQUIRE);
        /* Full (the kernel writes a record only where it fits whole): some were dropped. */
        if (head - c->ring_start > data - 64) {
            __atomic_store_n(&pc->data_tail, head, __ATOMIC_RELEASE);
            return AL_CTR_DROPPED;
        }
        if (head != c->ring_start)
            _al_perf_ring_drain(c->ring, data, _al_ring_window_add, &w);
        if (w.off_cpu_ns) {
            int inside = off_cpu_inside(cycles, w.off_cpu_ns);
            if (inside < 0)
                return AL_CTR_DROPPED;
            if (!inside)
                w.off_cpu_ns = 0;
        }
    }
    cycles = _al_tsc_net(cycles);
    for (unsigned i = _al_counters.nevents; i-- > 0;) {
        switch (_al_counters.events[i].kind) {
        case AL_EV_HARDWARE:
            if (hw[i] != READ_FAILED && c->start[i] != READ_FAILED && hw[i] >= c->start[i])
                AL_BUMP(sums[i], hw[i] - c->start[i]);
            break;
        case AL_EV_RING:
            AL_BUMP(sums[i], w.count[i]);
            break;
        case AL_EV_CLOCK:
            AL_BUMP(sums[i], cycles);
            break;
        }
    }
    AL_BUMP(*off_cpu_ns, w.off_cpu_ns);
    return AL_CTR_COUNTED;
}

double _al_counter_per_op(unsigned e, uint64_t sum, uint64_t off_cpu_ns, uint64_t ops,
                          double cycles_per_ns)
{
    if (ops == 0 || e >= _al_counters.nevents)
        return 0.0;
    if (_al_counters.events[e].kind != AL_EV_CLOCK)
        return (double)sum / (double)ops;
    double ns = cycles_per_ns > 0 ? (double)sum / cycles_per_ns - (double)off_cpu_ns : 0.0;
    return ns > 0 ? ns / (double)ops : 0.0;
}

/* ---- perf ring buffer ------------------------------------------------------------------- */

static void copy_out(const char *data, size_t mask, uint64_t pos, void *dst, size_t len)
{
    size_t off = (size_t)pos & mask;
    size_t first = mask + 1 - off;
    if (first >= len) {
        memcpy(dst, data + off, len);
    } else {
        memcpy(dst, data + off, first);
        memcpy((char *)dst + first, data, len - first);
    }
}

/* A record that wraps the end of the data area, reassembled on the stack (at most 64 KiB: the
 * header's size is 16 bits), never from the heap. Separate so the stack is only used when needed. */
static AL_NOINLINE void deliver_wrapped(const char *data, size_t mask, uint64_t pos, size_t size,
                                        void (*fn)(const struct perf_event_header *, void *), void *arg)
{
    uint64_t buf[(size + 7) / 8];
    copy_out(data, mask, pos, buf, size);
    fn((const struct perf_event_header *)buf, arg);
}

int _al_perf_ring_drain(void *base, size_t data_size,
                        void (*fn)(const struct perf_event_header *rec, void *arg), void *arg)
{
    if (!base || data_size < sizeof(struct perf_event_header) || (data_size & (data_size - 1)))
        return -EINVAL;
    struct perf_event_mmap_page *pc = base;
    size_t data_off = pc->data_offset ? (size_t)pc->data_offset : page_size();
    const char *data = (const char *)base + data_off;
    size_t mask = data_size - 1;

    uint64_t head = __atomic_load_n(&pc->data_head, __ATOMIC_ACQUIRE);
    uint64_t tail = __atomic_load_n(&pc->data_tail, __ATOMIC_RELAXED);
    int count = 0, ret = 0;
    if (head - tail > data_size) {
        ret = -EINVAL; /* the writer overran us: nothing in between can be trusted */
        tail = head;
    }
    while (tail != head) {
        struct perf_event_header hdr;
        if (head - tail < sizeof hdr) {
            ret = -EINVAL;
            tail = head;
            break;
        }
        copy_out(data, mask, tail, &hdr, sizeof hdr);
        if (hdr.size < sizeof hdr || hdr.size > data_size || hdr.size > head - tail) {
            /* Malformed: no way to find the next record; drop the rest so the ring recovers. */
            ret = -EINVAL;
            tail = head;
            break;
        }
        size_t off = (size_t)tail & mask;
        if (fn) {
            if (off + hdr.size <= data_size)
                fn((const struct perf_event_header *)(data + off), arg);
            else
                deliver_wrapped(data, mask, tail, hdr.size, fn, arg);
        }
        tail += hdr.size;
        count++;
    }
    __atomic_store_n(&pc->data_tail, tail, __ATOMIC_RELEASE);
    return ret ? ret : count;
}
