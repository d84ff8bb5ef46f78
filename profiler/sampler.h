/* The allocation-site sampler (sampler.c) and its report (report_sites.c). */
#ifndef ALLOCLENS_SAMPLER_H
#define ALLOCLENS_SAMPLER_H

#include <signal.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define AL_SITE_FRAMES 32
#define AL_SITES_MAX 16384             /* past them, samples count in one row (unattributed) */
#define AL_SITE_CHUNK 64              /* sites per mapping: the table grows a chunk at a time and
                                         never moves, so a report may read it while threads sample */
#define AL_SITE_SLOTS 32768           /* hash slots of the site table */

/* What made the sites' peak the peak (see _al_sampler_heap_peak): its name in the JSON report
 * and its words in the text ones, where the CLI's rendering of a saved report finds it by
 * name. */
enum al_peak_source { AL_PEAK_NONE, AL_PEAK_HEAP, AL_PEAK_RSS, AL_PEAK_ESTIMATE, AL_PEAK_SOURCES };
struct al_peak_words {
    const char *name, *text;
};
static inline const struct al_peak_words *_al_peak_words(unsigned source)
{
    static const struct al_peak_words w[AL_PEAK_SOURCES] = {
        [AL_PEAK_NONE] = { "none", "no peak seen" },
        [AL_PEAK_HEAP] = { "heap", "the heap's peak" },
        [AL_PEAK_RSS] = { "rss", "the process's RSS peak" },
        [AL_PEAK_ESTIMATE] = { "estimate", "the sampled estimate's peak" },
    };
    return &w[source];
}

/* The source whose JSON name is NAME, or AL_PEAK_SOURCES. */
static inline unsigned _al_peak_source_named(const char *name)
{
    unsigned k = 0;
    while (k < AL_PEAK_SOURCES && strcmp(name, _al_peak_words(k)->name) != 0)
        k++;
    return k;
}

/* Lifetimes go to the latency histogram's buckets taken AL_LIFE_GROUP at a time: 4 a power of
 * two (a bucket's midpoint within 12% of its values), in a quarter of the room. A site was
 * 2.9 KiB, most of it this histogram, and a program with 20000 call sites paid 46 MiB. */
#define AL_LIFE_GROUP 4
#define AL_LIFE_BUCKETS ((AL_HIST_BUCKETS + AL_LIFE_GROUP - 1) / AL_LIFE_GROUP)

struct al_site {
    uint64_t hash;
    uint32_t nframes;
    uintptr_t frames[AL_SITE_FRAMES];  /* return addresses, the program's caller first */
    double alloc_bytes, alloc_objects; /* estimated over the run */
    double live_bytes, live_objects;   /* estimated, now */
    double peak_live_bytes;            /* estimated, at the peak (_al_sampler_heap_peak) */
    double frag_bytes;                 /* estimated usable - requested over the run */
    double at_peak[3];                 /* resident, swapped, never touched bytes at the peak */
    uint64_t count;                    /* samples taken here */
    uint64_t nlife;                    /* samples freed, with their lifetimes: */
    uint64_t life_max;                 /* the longest, in cycles: no quantile reads above it */
    uint32_t life_cycles[AL_LIFE_BUCKETS];
};

struct al_sampler {
    bool enabled;
    double rate;
    uint64_t seed;
    struct al_site *site_chunk[AL_SITES_MAX / AL_SITE_CHUNK]; /* made as sites come */
    uint32_t nsites;
    uint32_t *slots;                   /* site id + 1 per hash slot, 0: empty */
    struct al_site unattributed;       /* samples past AL_SITES_MAX sites */
    double peak_bytes;
    uint64_t peak_time;                /* TSC of the peak */
    enum al_peak_source peak_source;
    uint64_t dropped;                  /* samples not kept (table full) */
    double live_bytes_at_exit;         /* estimated, when the report was gathered */
};

extern struct al_sampler _al_sampler;

/* Site ID (below _al_sampler.nsites). */
static inline struct al_site *_al_site(uint32_t id)
{
    return &_al_sampler.site_chunk[id / AL_SITE_CHUNK][id % AL_SITE_CHUNK];
}

/* A sample that realloc forgot before its call, kept to be put back if the call fails (the
 * object stays the program's): addr 0 where none was forgotten. */
struct al_sample_undo {
    uintptr_t addr;
    uint32_t site;
    unsigned life; /* the bucket its lifetime went to */
    uint64_t size, born;
    double objects, bytes;
};

void _al_sample_alloc(struct al_thread *t, size_t size, void *p);
/* p is no longer a live sample (U, may be NULL: what realloc needs to put it back). */
void _al_sample_free(const void *p, struct al_sample_undo *u);
void _al_sample_forget_slow(const void *p, struct al_sample_undo *u);
void _al_sample_restore(const struct al_sample_undo *u);

/* p is being freed or moved (--mode sample and time): forgotten by the sampler if it is a live
 * sample. Only a page whose bucket holds one costs a look further (sampler.c). (Full mode reads
 * the sample's mark in the shadow byte it reads anyway for the object's record.) */
static inline __attribute__((always_inline)) void _al_sample_forget(const void *p, struct al_sample_undo *u)
{
    if (__builtin_expect(p && _al_sample_page_maybe(p), 0))
        _al_sample_forget_slow(p, u);
}

/* HWM_KIB: the process's VmHWM now (-1: unknown). */
void _al_sampler_init(const struct al_settings *s, long hwm_kib);
void _al_sampler_thread_init(struct al_thread *t);
/* The sampler's state for the report, taken once before any writer runs: the last peak
 * snapshot, the residency of the peak's samples, the live bytes now. */
void _al_sampler_collect(void);
/* Full mode (waste.c): the heap was just measured at HEAP bytes, larger than ever, or about as
 * large at exit (UNLESS_LOWER): what the sites hold now is their peak, unless UNLESS_LOWER and
 * their estimate is lower than at the last one. (The other modes' peak: rss_peak, sampler.c.) */
void _al_sampler_heap_peak(uint64_t heap, bool unless_lower);
/* The report is about to be gathered: before it maps anything, whether the process's peak RSS
 * rose since the last peak (the other modes). */
void _al_sampler_report_begins(void);
/* The calling thread's return addresses, innermost first, into RAW (at most MAX); how many.
 * The thread must be busy: libunwind may allocate. */
int _al_sampler_backtrace(void **raw, int max);
/* unwind.c: the walk itself (the unwind lock held), and the loader's counts of objects loaded
 * and unloaded it is given, read before that lock is taken. */
struct al_loader_counts {
    unsigned long long adds, subs;
};
void _al_unwind_loader_counts(struct al_loader_counts *c);
int _al_unwind_backtrace(void **raw, int max, const struct al_loader_counts *loaded);
/* Walks made by libunwind's steps rather than the rules (for the tests). */
extern unsigned long _al_unwind_slow_walks;
/* Unwinding's lock (sampler.c), which fork takes first and releases last, and the table's.
 * Each lock returns false where the thread held it already (a signal handler interrupted
 * it there), and its unlock then leaves it held: pass what the lock returned. */
bool _al_sampler_unwind_lock(void);
void _al_sampler_unwind_unlock(bool took);
/* dl_iterate_phdr's, around the C library's (interpose/iterate_phdr.c): the loader's lock is
 * held in between. */
void _al_sampler_loader_enter(void);
void _al_sampler_loader_leave(void);
/* Fork's, before that lock is taken and after it is let go (sampler.c: the loader's counts). */
void _al_sampler_fork_prepare(void);
void _al_sampler_fork_done(bool child);
bool _al_sampler_lock(void);
void _al_sampler_unlock(bool took);
/* Live samples (lock held). */
uint64_t _al_sampler_live(void);
/* TOOK: what fork's _al_sampler_lock returned. */
void _al_sampler_atfork_child(bool took);

/* report_sites.c */
struct al_buf;
struct al_report;
void _al_report_sites_json(struct al_buf *b, const struct al_report *r);
void _al_report_sites_text(struct al_buf *b, const struct al_report *r);
void _al_report_pprof(const char *path, uint64_t runtime_ns);

#endif
