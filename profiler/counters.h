/* profiler/counters.c: hardware (or, where the machine has no PMU, software) events counted
 * around one allocator call in N, per ops row.
 *
 * Events are named by the user (--events cache-misses,dTLB-load-misses,...) and resolved with
 * libpfm4, so any event the CPU's PMU lists can be named; on a machine without a hardware PMU
 * the default set falls back to software events (page-faults, context-switches, task-clock)
 * and the report says so and why. Each thread opens its perf_event group lazily, on its first
 * sampled call; counters are read with rdpmc where the kernel allows user-space reads and with
 * read() otherwise. A failure never touches the program: the section is reported unavailable
 * with the reason. */
#ifndef ALLOCLENS_COUNTERS_H
#define ALLOCLENS_COUNTERS_H

#include <stdbool.h>
#include <stdint.h>
#include <linux/perf_event.h>

#define AL_MAX_EVENTS 6

struct al_event {
    char name[64];                  /* as the user named it */
    struct perf_event_attr attr;    /* what it resolved to */
};

struct al_counters_config {
    bool available;
    bool software;                  /* fell back to software events */
    char reason[256];               /* why unavailable, or why software */
    unsigned nevents;
    struct al_event events[AL_MAX_EVENTS];
    unsigned sample_every;          /* count 1 op in N */
};

/* Per-thread counter state (embedded in struct al_thread). */
struct al_thread_counters {
    unsigned countdown;             /* ops until the next counted one (first: on every call) */
    int state;                      /* 0: not opened yet, 1: open, -1: failed for this thread */
    int fd[AL_MAX_EVENTS];
    void *page[AL_MAX_EVENTS];      /* perf mmap page for rdpmc, or NULL */
    uint64_t start[AL_MAX_EVENTS];
};

extern struct al_counters_config _al_counters;

/* Resolves the comma-separated EVENTS (NULL: the default set) and probes whether they can be
 * opened here; fills _al_counters. Never fails the program: see .available and .reason. */
void _al_counters_init(const char *events, unsigned sample_every);

/* Event-name resolution alone (unit-testable): NAME through libpfm4 into ATTR.
 * 0, or a negative errno with a one-line reason in ERR. */
int _al_event_resolve(const char *name, struct perf_event_attr *attr, char *err, size_t errcap);

/* Whether this call is the 1-in-N counted one (the hot path: one decrement, one branch). */
static inline __attribute__((always_inline)) bool _al_counters_due(struct al_thread_counters *c)
{
    return __builtin_expect(--c->countdown == 0, 0);
}

/* Reads the counters before and after the real call; AFTER adds the differences into SUMS
 * (one per event) and resets the countdown. Opens the thread's group on first use. */
void _al_counters_before(struct al_thread_counters *c);
void _al_counters_after(struct al_thread_counters *c, uint64_t *sums);
void _al_counters_thread_close(struct al_thread_counters *c);

/* The read paths, exposed for tests: rdpmc through the mmap page (-EAGAIN when the kernel
 * does not allow it), read() on the fd. */
int _al_counter_read_rdpmc(void *page, uint64_t *value);
int _al_counter_read_fd(int fd, uint64_t *value);

/* Perf ring buffer: parses the records between data_tail and data_head of an mmap'd buffer
 * (page + 2^n data pages), calling FN for each; returns records seen or a negative errno. A
 * record that wraps the end of the buffer is copied onto the stack, never to the heap. Meant
 * for sampled events with addresses (page faults by address): no report uses it yet. */
int _al_perf_ring_drain(void *base, size_t data_size,
                        void (*fn)(const struct perf_event_header *rec, void *arg), void *arg);

#endif
