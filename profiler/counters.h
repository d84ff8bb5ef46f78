/* profiler/counters.c: hardware (or, where the machine has no PMU, software) events counted
 * around one allocator call in N, per ops row.
 *
 * Events are named by the user (--events cache-misses,dTLB-load-misses,...) and resolved with
 * libpfm4, so any event the CPU's PMU lists can be named; on a machine without a hardware PMU
 * the default set falls back to software events (page-faults, context-switches, task-clock)
 * and the report says so and why. Each thread opens its events lazily, on its first counted
 * call. Hardware counters are read with rdpmc where the kernel allows user-space reads and with
 * read() otherwise. Software events are never read with a system call: each one writes a
 * record per occurrence into the thread's perf ring, and a counted call counts the records
 * written while it ran; task-clock and cpu-clock are the call's own cycles less the time the
 * kernel's switch records show it off the CPU. A failure never touches the program: the
 * section is reported unavailable with the reason. */
#ifndef ALLOCLENS_COUNTERS_H
#define ALLOCLENS_COUNTERS_H

#include <stdbool.h>
#include <stdint.h>
#include <linux/perf_event.h>

#define AL_MAX_EVENTS 6

enum al_event_kind {
    AL_EV_HARDWARE, /* a PMU counter: rdpmc or read() */
    AL_EV_RING,     /* a software event: one ring record per occurrence */
    AL_EV_CLOCK,    /* task-clock, cpu-clock: the call's cycles less its time switched out */
};

struct al_event {
    char name[64];                  /* as the user named it */
    struct perf_event_attr attr;    /* what it resolved to */
    enum al_event_kind kind;
};

struct al_counters_config {
    bool available;
    bool software;                  /* fell back to software events */
    char reason[256];               /* why unavailable, or why software */
    unsigned nevents;
    struct al_event events[AL_MAX_EVENTS];
    unsigned sample_every;          /* count 1 op in N */
};

/* The per-thread ring of the software events: one metadata page and this many data pages
 * (1024 records of 16 bytes: a call that faults more pages than that is not counted). */
#define AL_RING_PAGES 4

/* Per-thread counter state (embedded in struct al_thread). */
struct al_thread_counters {
    unsigned countdown;             /* ops until the next counted one (first: on every call) */
    int state;                      /* 0: not opened yet, 1: open, -1: failed for this thread */
    int fd[AL_MAX_EVENTS];          /* -1 for clock events, which have none */
    void *page[AL_MAX_EVENTS];      /* hardware: perf mmap page for rdpmc, or NULL */
    uint64_t id[AL_MAX_EVENTS];     /* the event's id (software: what its ring records carry) */
    uint64_t start[AL_MAX_EVENTS];
    int ring_fd;                    /* the ring's owner: a dummy event with switch records */
    uint64_t ring_id;
    void *ring;                     /* metadata page + AL_RING_PAGES data pages, or NULL */
    uint64_t ring_start;            /* the ring's head before the counted call */
};

/* One counted call's ring records, summed (AFTER below; exposed for tests). */
struct al_ring_window {
    const struct al_thread_counters *c;
    uint64_t count[AL_MAX_EVENTS];  /* records per event */
    uint64_t switched_out;          /* the last switch-out's time (perf clock, ns), or 0 */
    uint64_t off_cpu_ns;            /* time between switch-out and switch-in records */
};

extern struct al_counters_config _al_counters;

/* Resolves the comma-separated EVENTS (NULL: the default set) and probes whether they can be
 * opened here; fills _al_counters. RESOLVED: what _al_counters_resolve_ahead wrote for them in
 * 'alloclens run' (NULL: libpfm4 resolves them here). Never fails the program: see .available
 * and .reason. */
void _al_counters_init(const char *events, unsigned sample_every, const char *resolved);

/* ---- event_names.c: names to encodings ---------------------------------------------------- */

extern const char _al_events_default_hw[], _al_events_default_sw[];
/* Event-name resolution alone (unit-testable): NAME, from what was resolved ahead or through
 * libpfm4, into ATTR. 0, or a negative errno with a one-line reason in ERR. */
int _al_event_resolve(const char *name, struct perf_event_attr *attr, char *err, size_t errcap);
/* The encodings of EVENTS (NULL or "default": both default sets) into OUT (CAP bytes), as
 * _al_counters_init takes them; its length (0: none resolved). */
size_t _al_counters_resolve_ahead(const char *events, char *out, size_t cap);
/* Takes what _al_counters_resolve_ahead wrote; whether it all parsed (if not, none is used). */
bool _al_event_names_load(const char *text);
void _al_event_names_done(void); /* unloads libpfm4 */
/* The next comma-separated name of *S into NAME (NAMECAP); false at the end. Names too long
 * for NAME come back truncated with *TOO_LONG set. */
bool _al_event_next_name(const char **s, char *name, size_t namecap, bool *too_long);

/* Whether this call is the 1-in-N counted one (the hot path: one decrement, one branch). */
static inline __attribute__((always_inline)) bool _al_counters_due(struct al_thread_counters *c)
{
    return __builtin_expect(--c->countdown == 0, 0);
}

/* What AFTER made of a counted call. */
enum al_counted {
    AL_CTR_NONE,    /* the thread has no events (they could not open: said once on stderr) */
    AL_CTR_COUNTED, /* added in */
    AL_CTR_DROPPED, /* the ring overflowed, or it was too early to time a switch: left out */
};

/* Reads the counters before and after the real call, which took CYCLES (the raw difference
 * of the two rdtsc around it). AFTER resets the countdown and, when the call was counted,
 * adds the differences into SUMS (one per event; clock events in cycles) and the time it was
 * switched out into *OFF_CPU_NS. Opens the thread's events on first use. */
void _al_counters_before(struct al_thread_counters *c);
enum al_counted _al_counters_after(struct al_thread_counters *c, uint64_t cycles, uint64_t *sums,
                                   uint64_t *off_cpu_ns);
/* Closes the thread's events and forgets them (state 0). The thread that owned them must make
 * no further counted call on this state. In a fork child (FORK_CHILD), every copied state is
 * closed: its fds count the parent's threads, and its mappings were not copied. */
void _al_counters_thread_close(struct al_thread_counters *c, bool fork_child);

/* The read paths, exposed for tests: rdpmc through the mmap page (-EAGAIN when the kernel
 * does not allow it), read() on the fd. */
int _al_counter_read_rdpmc(void *page, uint64_t *value);
int _al_counter_read_fd(int fd, uint64_t *value);

/* Per op: an event's average over the counted calls of that op. Clock events: SUM cycles,
 * converted with CYCLES_PER_NS, less OFF_CPU_NS, in ns. */
double _al_counter_per_op(unsigned e, uint64_t sum, uint64_t off_cpu_ns, uint64_t ops,
                          double cycles_per_ns);

/* Perf ring buffer: parses the records between data_tail and data_head of an mmap'd buffer
 * (page + 2^n data pages), calling FN for each, and frees them; returns records seen or a
 * negative errno. A record that wraps the end of the buffer is copied onto the stack, never
 * to the heap. */
int _al_perf_ring_drain(void *base, size_t data_size,
                        void (*fn)(const struct perf_event_header *rec, void *arg), void *arg);

/* The ring-record callback of a counted call: ARG is a struct al_ring_window. */
void _al_ring_window_add(const struct perf_event_header *rec, void *arg);

#endif
