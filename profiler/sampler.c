/* Where the memory goes: Poisson byte sampling of allocations, as tcmalloc and jemalloc do in
 * production.
 *
 * Each thread counts down bytes (requested size + 1 per allocation) from a draw of an
 * exponential distribution with mean R; the allocation that crosses zero is sampled: its call
 * stack is captured and it is kept in a table until freed. An allocation of Z bytes is thus
 * sampled with probability p = 1 - e^(-(Z+1)/R) (the +1 keeps zero-byte requests visible and
 * is part of p, so the estimate stays unbiased for tiny objects), and stands for 1/p objects
 * and Z/p bytes: each sample is unbiased first, then summed per call site.
 *
 * The hot path is one subtraction and one branch (in profiler.h); a free tests a mark in the
 * shadow table in full mode, in the byte it reads anyway for the object's record, and in the
 * other modes, only on a page whose bucket holds a live sample (sampler.h), the bucket's
 * addresses (see struct bucket). Everything else happens under one lock, only for sampled
 * objects.
 */
#include <errno.h>
#include <pthread.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#define UNW_LOCAL_ONLY
#include <libunwind.h>

#include "profiler.h"
#include "sampler.h"

#define SLOT_BITS_MIN 10
#define SLOT_BITS 19 /* the index at most half full: 2^18 live sampled objects at most (at
                        R = 512 KiB: 128 GiB live) */

struct sample {
    uintptr_t addr;
    uint32_t site;
    uint64_t size, born;  /* born: TSC */
    double objects, bytes;        /* what the sample stands for */
};

struct al_sampler _al_sampler;

/* Live samples sit densely in samples[0, nsamples) (a free moves the last one into the hole),
 * found by address through an open-addressing index. Both grow together, as the most live
 * samples so far need: what is mapped up front is address space the program's limit
 * (RLIMIT_AS) counts. */
struct slot {
    uintptr_t addr; /* 0: empty */
    uint32_t idx;
};

static struct {
    _Atomic uintptr_t lock;
    struct sample *samples;
    struct slot *slots;
    unsigned slot_bits; /* the index has 1 << slot_bits slots: twice what the most live
                           samples so far needed, so that it costs memory in proportion;
                           samples has room for half as many */
    uint64_t nsamples;
    _Atomic uint64_t thread_ordinal;
    double live_bytes;
    double residency_peak;  /* the peak's size (heap or estimate) when residency was last measured */
    bool residency_pending;
    bool residency_unreadable; /* the pagemap could not be opened: not tried again for sites */
    bool peak_set_current;  /* the live samples are still the peak's: none added or freed since */
    long rss_peak_kib;      /* without the heap's measure: the process's peak RSS at the last peak */
    /* getrusage's peak at start where it is an earlier image's, above this one's (exec keeps
     * it); 0 where it is not, or once this image's passed it. Below it, VmHWM. */
    _Atomic long inherited_kib;
    /* The peak is read at most about 1% of the time, and at least at every
     * (PEAK_SKIP_MAX + 1)th sampled event: not before the TSC reaches peak_next unless
     * PEAK_SKIP_MAX events skipped it; the last read's answer until. */
    _Atomic uint64_t peak_next;
    _Atomic unsigned peak_skipped;
    _Atomic long peak_last;
} s;

/* Where a free finds that its object is a live sample. Full mode marks it in the shadow table,
 * whose byte for the object its free reads anyway. The other modes keep the addresses of up
 * to BUCKET_ADDRS samples per bucket of _al_hot.sample_pages here, read by a free whose
 * bucket's bit is set without the lock: it looks only for its own address, which no other
 * thread adds or removes meanwhile. A bucket's further samples are only counted (over): a
 * free in a bucket with any looks its address up in the samples' index, under the lock. (They
 * were marked in the shadow table, whose records --mode sample never takes down: mimalloc's
 * big blocks, at ever new addresses and all in one bucket, grew it without bound.) */
#define BUCKET_ADDRS 3

static struct bucket {
    _Alignas(32) _Atomic uintptr_t addr[BUCKET_ADDRS];
    _Atomic uint32_t over;
} buckets[AL_SAMPLE_PAGES] AL_LARGE_BSS;

/* Lock held: p is a live sample now (ON) or no longer; outside full mode, the bit of its
 * bucket in _al_hot.sample_pages follows whether the bucket holds any. */
static void mark(const void *p, bool on)
{
    if (_al_hot.records) {
        _al_shadow_set_sampled(p, on);
        return;
    }
    unsigned b = _al_sample_page(p);
    struct bucket *k = &buckets[b];
    uintptr_t want = on ? 0 : (uintptr_t)p;
    unsigned i = 0;
    while (i < BUCKET_ADDRS && atomic_load_explicit(&k->addr[i], memory_order_relaxed) != want)
        i++;
    if (i < BUCKET_ADDRS) {
        atomic_store_explicit(&k->addr[i], on ? (uintptr_t)p : 0, memory_order_relaxed);
    } else {
        uint32_t over = atomic_load_explicit(&k->over, memory_order_relaxed);
        atomic_store_explicit(&k->over, on ? over + 1 : over - 1, memory_order_relaxed);
    }
    bool any = on || atomic_load_explicit(&k->over, memory_order_relaxed) != 0;
    for (i = 0; !any && i < BUCKET_ADDRS; i++)
        any |= atomic_load_explicit(&k->addr[i], memory_order_relaxed) != 0;
    /* Written only when it changes: the bitmap's lines are read by every free. */
    uint64_t bit = 1ull << (b % 64);
    _Atomic uint64_t *word = &_al_hot.sample_pages[b / 64];
    if (any && !(atomic_load_explicit(word, memory_order_relaxed) & bit))
        atomic_fetch_or_explicit(word, bit, memory_order_relaxed);
    else if (!any && (atomic_load_explicit(word, memory_order_relaxed) & bit))
        atomic_fetch_and_explicit(word, ~bit, memory_order_relaxed);
}

/* Not in full mode, whose frees read the shadow table's mark themselves (_al_waste_free). */
AL_NOINLINE void _al_sample_forget_slow(const void *p, struct al_sample_undo *u)
{
    const struct bucket *k = &buckets[_al_sample_page(p)];
    bool found = false;
    for (unsigned i = 0; i < BUCKET_ADDRS; i++)
        found |= atomic_load_explicit(&k->addr[i], memory_order_relaxed) == (uintptr_t)p;
    if (found || atomic_load_explicit(&k->over, memory_order_relaxed))
        _al_sample_free(p, u); /* which finds whether it is one */
}

/* The sampler's two locks (the table's, and unwinding's below) are owned locks (spin.h), not
 * ones that block signals: that costs two system calls, which at every sample cost malloc_bench
 * 2% of its time in --mode sample. A signal handler that interrupts the holder and comes back
 * to the lock (its fork, whose prepare handler takes both; its exit, whose report reads the
 * table) finds it its own and goes on without taking it. Before, such a fork spun for ever with
 * signals blocked (by the registry's lock, taken first), where SIGTERM could not end it. The
 * handler's own allocations come to neither: the thread is busy. */

/* False where the lock was this thread's already. */
static bool lock(void)
{
    return _al_owned_lock(&s.lock);
}

static void unlock(bool took)
{
    _al_owned_unlock(&s.lock, took);
}

/* ---- random draws -------------------------------------------------------------------------- */

static uint64_t splitmix(uint64_t *x)
{
    return _al_mix64(*x += 0x9e3779b97f4a7c15ull);
}

static int64_t next_countdown(struct al_thread *t)
{
    /* U uniform in (0, 1]: 53 random bits, never 0, so the log is finite. */
    double u = (double)((splitmix(&t->rng) >> 11) + 1) * 0x1.0p-53;
    double v = -_al_math_log(u) * _al_sampler.rate;
    return v >= 0x1.0p62 ? INT64_MAX : (int64_t)v;
}

void _al_sampler_thread_init(struct al_thread *t)
{
    if (!_al_sampler.rate) {
        t->sample_countdown = INT64_MAX;
        return;
    }
    /* With a seed, thread k of the run draws the same sequence every time. */
    uint64_t k = atomic_fetch_add(&s.thread_ordinal, 1);
    t->rng = _al_sampler.seed + k * 0x632be59bd9b4e019ull;
    splitmix(&t->rng);
    t->sample_countdown = next_countdown(t);
}

#define CHUNK_BYTES (AL_SITE_CHUNK * sizeof(struct al_site))

static size_t samples_bytes(void)
{
    return sizeof(struct sample) << (s.slot_bits - 1);
}

/* ---- set-up ---------------------------------------------------------------------------------- */

void _al_sampler_init(const struct al_settings *set, long hwm_kib)
{
    _al_sampler.rate = (double)set->sample_rate;
    _al_sampler.seed = set->seed;
    if (!_al_sampler.seed) {
        uint64_t x = _al_tsc() ^ ((uint64_t)getpid() << 32);
        _al_sampler.seed = splitmix(&x) | 1;
    }
    _al_code_of((const void *)unw_backtrace, &_al_unwinder_code);
    if (!set->sample_rate)
        return;
    s.slot_bits = SLOT_BITS_MIN;
    s.samples = _al_mem_map(samples_bytes());
    s.slots = _al_mem_map(sizeof(struct slot) << s.slot_bits);
    _al_sampler.slots = _al_mem_map(AL_SITE_SLOTS * sizeof(uint32_t));
    if (!s.samples || !s.slots || !_al_sampler.slots) {
        _al_log("no memory for the site sampler: sites are not reported");
        _al_sampler.rate = 0;
        return;
    }
    /* The kernel keeps the peak of the image that exec'd this one in getrusage's: where it is
     * above this image's own (VmHWM), this one's rises would not show there. */
    struct rusage ru;
    if (hwm_kib > 0 && getrusage(RUSAGE_THREAD, &ru) == 0 && ru.ru_maxrss > hwm_kib + 1024)
        s.inherited_kib = ru.ru_maxrss;
    _al_sampler.enabled = true;
}

void _al_sampler_atfork_child(bool took)
{
    /* The child's report covers its own allocations: it starts with no samples and no sites.
     * Its copies of the parent's sampled objects lose their mark, so their frees pass
     * unnoticed. Dropping the pages zeroes the tables without touching them. Not where the
     * fork came from a handler that interrupted this thread changing them (TOOK false): that
     * change is finished after the handler returns, and the child keeps the parent's samples
     * rather than a table torn in two. */
    if (_al_sampler.enabled && took) {
        for (uint64_t i = 0; i < s.nsamples; i++)
            mark((void *)s.samples[i].addr, false);
        madvise(s.samples, samples_bytes(), MADV_DONTNEED);
        madvise(s.slots, sizeof(struct slot) << s.slot_bits, MADV_DONTNEED);
        for (unsigned c = 0; c < AL_SITES_MAX / AL_SITE_CHUNK && _al_sampler.site_chunk[c]; c++)
            madvise(_al_sampler.site_chunk[c], CHUNK_BYTES, MADV_DONTNEED);
        madvise(_al_sampler.slots, AL_SITE_SLOTS * sizeof(uint32_t), MADV_DONTNEED);
        memset(&_al_sampler.unattributed, 0, sizeof _al_sampler.unattributed);
        _al_sampler.nsites = 0;
        _al_sampler.peak_bytes = 0;
        _al_sampler.peak_time = 0;
        _al_sampler.dropped = 0;
        s.nsamples = 0;
        s.live_bytes = s.residency_peak = 0;
        s.residency_pending = s.peak_set_current = false;
        s.rss_peak_kib = 0;
        /* A forked child's getrusage starts from its own copy of the memory: no earlier peak,
         * and its first sampled event reads it. */
        s.inherited_kib = 0;
        s.peak_next = 0;
        _al_sampler.peak_source = AL_PEAK_NONE;
    }
    unlock(took);
}

/* ---- sites ----------------------------------------------------------------------------------- */

static uint64_t hash_frames(const uintptr_t *f, unsigned n)
{
    uint64_t h = 0xcbf29ce484222325ull ^ n;
    for (unsigned i = 0; i < n; i++)
        h = (h ^ f[i]) * 0x100000001b3ull;
    return h ? h : 1;
}

/* Lock held: whether site ID has its place, making its chunk if it is the chunk's first. A
 * forked child keeps its parent's chunks (emptied). */
static bool site_room(uint32_t id)
{
    struct al_site **c = &_al_sampler.site_chunk[id / AL_SITE_CHUNK];
    if (!*c)
        *c = _al_mem_map(CHUNK_BYTES);
    return *c != NULL;
}

/* Lock held. */
static uint32_t site_of(const uintptr_t *frames, unsigned n)
{
    uint64_t h = hash_frames(frames, n);
    for (uint32_t i = (uint32_t)h & (AL_SITE_SLOTS - 1), probes = 0; probes < AL_SITE_SLOTS;
         i = (i + 1) & (AL_SITE_SLOTS - 1), probes++) {
        uint32_t id = _al_sampler.slots[i];
        if (!id) {
            if (_al_sampler.nsites >= AL_SITES_MAX || !site_room(_al_sampler.nsites))
                return AL_SITES_MAX; /* full: counted as unattributed */
            id = _al_sampler.nsites++;
            struct al_site *st = _al_site(id);
            st->hash = h;
            st->nframes = n;
            memcpy(st->frames, frames, n * sizeof *frames);
            _al_sampler.slots[i] = id + 1;
            return id;
        }
        struct al_site *st = _al_site(id - 1);
        if (st->hash == h && st->nframes == n && !memcmp(st->frames, frames, n * sizeof *frames))
            return id - 1;
    }
    return AL_SITES_MAX;
}

/* libunwind keeps its cache of unwind rules behind a pthread mutex of its own and does nothing
 * about it at fork: a fork while another thread unwound left the mutex held in the child,
 * whose threads then waited on it for good at their first sample. Unwinding is one thread at
 * a time under this lock, which fork takes first; unwind.c's table of frame rules is under it
 * too. A fork from a handler that interrupted the unwinding thread finds the lock its own
 * (an owned lock) and forks with that thread's unwind under way, to be finished in both
 * processes once the handler returns. */
static _Atomic uintptr_t unwind_lock;

bool _al_sampler_unwind_lock(void)
{
    return _al_owned_lock(&unwind_lock);
}

/* The loader's lock, which dl_iterate_phdr holds while its callbacks run, comes after the
 * unwind lock: a walk that meets code it has no rule for asks libunwind, which calls
 * dl_iterate_phdr. A program that allocates inside a callback of its own holds the loader's
 * lock, so its sample must not wait for a walk that waits for that lock: it took both the
 * program's threads down (host_dlopen iterate). The holder of the unwind lock says when it
 * enters dl_iterate_phdr (walker_in_loader); a thread inside one (in_loader) waits for the
 * unwind lock only until then (_al_owned_lock_unless), and otherwise gives its stack up (the
 * sample counts, under no site). Any other wait for the lock ends, since the loader's lock is
 * held only briefly. */
static __thread unsigned in_loader __attribute__((tls_model("initial-exec")));
static _Atomic bool walker_in_loader;

void _al_sampler_loader_enter(void)
{
    if (in_loader++ == 0 && _al_owned_by_me(&unwind_lock))
        atomic_store(&walker_in_loader, true);
}

void _al_sampler_loader_leave(void)
{
    if (--in_loader == 0 && _al_owned_by_me(&unwind_lock))
        atomic_store(&walker_in_loader, false);
}

void _al_sampler_unwind_unlock(bool took)
{
    _al_owned_unlock(&unwind_lock, took);
}

/* A walk reads the loader's counts (dl_iterate_phdr, the loader's lock held) before it takes the
 * unwind lock, and the C library's fork neither takes that lock nor sets it right in the child:
 * a fork while another thread read them left the child's loader lock held for good, and the
 * child waited on it at its first walk. A fork's prepare handler says it is coming
 * (forks_waiting) and waits until no other thread is reading them (readers, less this thread
 * where a signal handler interrupted it there) before it takes the unwind lock; a walk that
 * would read them meanwhile gives its stack up (the sample counts, under no site). */
static _Atomic unsigned forks_waiting, readers;
static __thread bool reading __attribute__((tls_model("initial-exec")));

void _al_sampler_fork_prepare(void)
{
    atomic_fetch_add(&forks_waiting, 1);
    for (unsigned n = 0; atomic_load(&readers) > (reading ? 1u : 0u); n++)
        _al_spin_wait(n);
}

void _al_sampler_fork_done(bool child)
{
    if (child) { /* the only thread */
        atomic_store(&readers, reading ? 1u : 0u);
        atomic_store(&forks_waiting, 0);
    } else {
        atomic_fetch_sub(&forks_waiting, 1);
    }
}

static bool loader_counts(struct al_loader_counts *c)
{
    atomic_fetch_add(&readers, 1);
    bool go = atomic_load(&forks_waiting) == 0;
    if (go) {
        bool was = reading;
        reading = true;
        _al_unwind_loader_counts(c);
        reading = was;
    }
    atomic_fetch_sub(&readers, 1);
    return go;
}

/* The loader brings a thread's table of dynamic TLS blocks up to date at the thread's first
 * access to such a block after a dlopen or dlclose, and frees a closed library's blocks then,
 * with the program's free: in a plain run, at the program's next access. libunwind's
 * thread-locals are such blocks, so that upkeep came inside the stack walk, where the thread
 * is busy and the free went uncounted (one free short per dlclose of a library with
 * thread-locals, a helper's stress run found). This access to one of ours, made first with
 * the thread not busy, leaves the upkeep's calls counted as the program's. */
static __thread char tls_upkeep_probe __attribute__((tls_model("global-dynamic")));

static AL_NOINLINE void tls_upkeep(struct al_thread *t)
{
    if (t->busy != 1)
        return;
    /* The compiler knows no call in a TLS access: fences keep both stores around it. */
    t->busy = 0;
    atomic_signal_fence(memory_order_seq_cst);
    char *volatile at = &tls_upkeep_probe;
    (void)at;
    atomic_signal_fence(memory_order_seq_cst);
    t->busy = 1;
}

int _al_sampler_backtrace(void **raw, int max)
{
    /* Where the program's seccomp filters may refuse what libunwind does, no stack: a sample
     * still counts, under a site with none. */
    if (!_al_seccomp_measures_ok())
        return 0;
    struct al_loader_counts loaded;
    if (!loader_counts(&loaded))
        return 0;
    bool took;
    if (!_al_owned_lock_unless(&unwind_lock, in_loader ? &walker_in_loader : NULL, &took))
        return 0;
    _al_fds_ours = true; /* libunwind checks memory through a pipe it makes when it needs one */
    int n = _al_unwind_backtrace(raw, max, &loaded);
    _al_fds_ours = false;
    _al_fds_walk_end();
    _al_sampler_unwind_unlock(took);
    return n;
}

static unsigned capture(uintptr_t *frames)
{
    void *raw[AL_SITE_FRAMES + 16];
    int n = _al_sampler_backtrace(raw, (int)(sizeof raw / sizeof raw[0]));
    unsigned k = 0;
    /* Drop our own frames: the stack starts at the program's call of malloc or new, and the
     * ones further out (a thread's start, a signal handler's call, a clone child's start)
     * are ours too, which the program's stacks do not have without us. */
    for (int i = 0; i < n && k < AL_SITE_FRAMES; i++)
        if (!_al_code_holds(&_al_self_code, raw[i]))
            frames[k++] = (uintptr_t)raw[i];
    return k;
}

/* ---- the table of live sampled objects (lock held) ------------------------------------------ */

static uint64_t slot_of(uintptr_t a)
{
    return _al_fib_hash(a >> 3, s.slot_bits);
}

static uint64_t slot_mask(void)
{
    return (1ull << s.slot_bits) - 1;
}

static struct slot *find_slot(uintptr_t a)
{
    /* A fresh index is untouched: its pages come in one by one, at samples. */
    _al_mem_touch(&s.slots[slot_of(a)]);
    for (uint64_t i = slot_of(a);; i = (i + 1) & slot_mask()) {
        if (s.slots[i].addr == a || !s.slots[i].addr)
            return &s.slots[i];
    }
}

static struct sample *find(uintptr_t a)
{
    struct slot *sl = find_slot(a);
    return sl->addr ? &s.samples[sl->idx] : NULL;
}

/* Backward-shift deletion from the index: no tombstones, so lookups stay short. */
static void unindex(struct slot *sl)
{
    uint64_t i = (uint64_t)(sl - s.slots);
    for (uint64_t j = (i + 1) & slot_mask();; j = (j + 1) & slot_mask()) {
        if (!s.slots[j].addr)
            break;
        uint64_t home = slot_of(s.slots[j].addr);
        /* Move j back to i when its home is not in (i, j] (cyclically). */
        if ((j > i && (home <= i || home > j)) || (j < i && home <= i && home > j)) {
            s.slots[i] = s.slots[j];
            i = j;
        }
    }
    s.slots[i].addr = 0;
}

/* Room for one more live sample: the index stays at most half full, twice as big, built again
 * from the samples, when it would not, and the samples move to room for twice as many. False
 * when there is no memory for that. */
static bool index_room(void)
{
    if (s.nsamples < 1ull << (s.slot_bits - 1))
        return true;
    if (s.slot_bits >= SLOT_BITS)
        return false;
    struct slot *old = s.slots;
    struct sample *old_samples = s.samples;
    size_t old_samples_bytes = samples_bytes();
    struct slot *bigger = _al_mem_map(sizeof(struct slot) << (s.slot_bits + 1));
    struct sample *more = _al_mem_map(old_samples_bytes * 2);
    if (!bigger || !more) {
        if (bigger)
            _al_mem_unmap(bigger, sizeof(struct slot) << (s.slot_bits + 1));
        if (more)
            _al_mem_unmap(more, old_samples_bytes * 2);
        return false;
    }
    memcpy(more, old_samples, s.nsamples * sizeof *more);
    _al_mem_unmap(old_samples, old_samples_bytes);
    s.samples = more;
    s.slots = bigger;
    s.slot_bits++;
    for (uint64_t i = 0; i < s.nsamples; i++) {
        struct slot *sl = find_slot(s.samples[i].addr);
        sl->addr = s.samples[i].addr;
        sl->idx = (uint32_t)i;
    }
    _al_mem_unmap(old, sizeof(struct slot) << (s.slot_bits - 1));
    return true;
}

static void erase(struct sample *e)
{
    unindex(find_slot(e->addr));
    struct sample *last = &s.samples[--s.nsamples];
    if (last != e) {
        *e = *last;
        find_slot(e->addr)->idx = (uint32_t)(e - s.samples);
    }
}

static void forget(struct sample *e, uint64_t now, struct al_sample_undo *u)
{
    struct al_site *st = e->site < AL_SITES_MAX ? _al_site(e->site) : &_al_sampler.unattributed;
    st->live_bytes -= e->bytes;
    st->live_objects -= e->objects;
    s.live_bytes -= e->bytes;
    /* A live sample stands for at least one object: below that, the sums hold only rounding
     * (a site with nothing live would print as -0). */
    if (st->live_objects < 0.5)
        st->live_bytes = st->live_objects = 0;
    if (s.nsamples == 1)
        s.live_bytes = 0;
    uint64_t life = now > e->born ? now - e->born : 0;
    unsigned bucket = _al_hist_bucket(life) / AL_LIFE_GROUP;
    st->life_cycles[bucket]++;
    st->nlife++;
    if (life > st->life_max)
        st->life_max = life;
    if (u)
        *u = (struct al_sample_undo){ e->addr, e->site, bucket, e->size, e->born, e->objects, e->bytes };
    mark((void *)e->addr, false);
    erase(e);
}

/* Lock held, room made: E is a live sample of site ST. */
static void add(const struct sample *e, struct al_site *st)
{
    struct slot *sl = find_slot(e->addr);
    sl->addr = e->addr;
    sl->idx = (uint32_t)s.nsamples;
    s.samples[s.nsamples++] = *e;
    mark((void *)e->addr, true);
    st->live_bytes += e->bytes;
    st->live_objects += e->objects;
    s.live_bytes += e->bytes;
}

/* ---- peak snapshots ------------------------------------------------------------------------ */

/* Lock held: bytes of [a, a+n) that are resident, swapped or never touched, from the pagemap.
 * Its entries are read into memory of their own, not the stack (a coroutine's may be a few
 * KiB). */
static void residency(int pagemap, uintptr_t a, uint64_t n, double out[3])
{
    uint64_t page = 4096, first = a / page, last = (a + n - 1) / page;
    static uint64_t entries[512];
    for (uint64_t p = first; p <= last;) {
        size_t k = _al_shadow_pagemap_read(pagemap, p, last - p + 1 < 512 ? last - p + 1 : 512, entries);
        if (!k)
            return;
        for (size_t j = 0; j < k; j++, p++) {
            uint64_t lo = p * page > a ? p * page : a;
            uint64_t hi = (p + 1) * page < a + n ? (p + 1) * page : a + n;
            unsigned kind = (entries[j] >> 63) & 1 ? 0 : (entries[j] >> 62) & 1 ? 1 : 2;
            out[kind] += (double)(hi - lo);
        }
    }
}

/* Lock held: where the bytes of the live samples are, from the pagemap, per site. */
static void measure_residency(void)
{
    s.residency_pending = false;
    for (uint32_t i = 0; i < _al_sampler.nsites; i++)
        memset(_al_site(i)->at_peak, 0, sizeof _al_site(i)->at_peak);
    memset(_al_sampler.unattributed.at_peak, 0, sizeof _al_sampler.unattributed.at_peak);
    if (!s.nsamples)
        return; /* a short program often has none: no pagemap to open */
    int pagemap = _al_proc_pagemap_open();
    s.residency_unreadable = pagemap < 0;
    for (uint64_t i = 0; i < s.nsamples; i++) {
        struct sample *e = &s.samples[i];
        struct al_site *st = e->site < AL_SITES_MAX ? _al_site(e->site) : &_al_sampler.unattributed;
        double r[3] = { 0, 0, 0 };
        residency(pagemap, e->addr, e->size ? e->size : 1, r);
        /* Scaled like the bytes: the sample stands for bytes/size times its own. */
        double scale = e->size ? e->bytes / (double)e->size : 0;
        for (int k = 0; k < 3; k++)
            st->at_peak[k] += r[k] * scale;
    }
    _al_proc_pagemap_close(pagemap);
}

/* Whether the peak is the heap's, measured by waste.c (full mode), rather than the process's
 * resident size's. */
static bool heap_measured(void)
{
    return _al_waste.enabled;
}

/* The process's peak resident size as the kernel tells it (KiB), or -1 (see rss_peak).
 * RUSAGE_THREAD's peak is the process's too (the kernel's, kept across exec, and the
 * memory's), without summing every thread's times under the signal lock as RUSAGE_SELF's
 * does: 220 ns against 435 on one thread (warm; 1-2 us inside a program whose data has pushed
 * the kernel's out of the caches), 1.5 us with 64. After an exec from a larger image (a small
 * program started by a shell or by `alloclens run`), until this image passes that one's peak,
 * VmHWM is read instead: about 8 us a read. */
static long read_peak(void)
{
    struct rusage ru;
    if (getrusage(RUSAGE_THREAD, &ru) != 0)
        return -1;
    long inherited = atomic_load_explicit(&s.inherited_kib, memory_order_relaxed);
    if (AL_LIKELY(ru.ru_maxrss > inherited)) {
        if (inherited)
            atomic_store_explicit(&s.inherited_kib, 0, memory_order_relaxed);
        return ru.ru_maxrss;
    }
    return _al_seccomp_measures_ok() ? _al_proc_status("VmHWM") : -1;
}

/* The process's peak resident size so far (KiB); -1 in full mode, which has the heap's, or
 * where it cannot be asked (a seccomp filter the program installed refuses getrusage, or the
 * /proc read VmHWM takes after exec). A sampled allocation or free that finds it higher than
 * at the last peak marks a new peak, before it changes the samples: a moment the sampler's
 * noise does not choose, as the highest of its own estimate would be (that overstates what
 * is live).
 * Read at every sampled allocation and free, the peak cost malloc_bench 4% of its time in
 * --mode sample (a system call each, cold), as much as all else the sampler does. So it is
 * read at most about 1% of the time, unless EVERY (the report's check), and in between the last
 * read stands: a rise is seen a little later (a few hundred microseconds), at a moment the
 * samples still do not choose. A read that took long (the thread was preempted in it) would
 * hold the next one off for a hundred times as long: after PEAK_SKIP_MAX events that skipped
 * it, it is read anyway (which, where sampled events come faster than every 100 reads' time,
 * costs more than 1%). */
#define PEAK_SKIP_MAX 16

static long rss_peak(bool every)
{
    if (heap_measured() || !_al_seccomp_rusage_ok())
        return -1;
    uint64_t t0 = _al_tsc();
    if (!every && t0 < atomic_load_explicit(&s.peak_next, memory_order_relaxed) &&
        atomic_fetch_add_explicit(&s.peak_skipped, 1, memory_order_relaxed) < PEAK_SKIP_MAX)
        return atomic_load_explicit(&s.peak_last, memory_order_relaxed);
    atomic_store_explicit(&s.peak_skipped, 0, memory_order_relaxed);
    long peak = read_peak();
    uint64_t t1 = _al_tsc();
    atomic_store_explicit(&s.peak_next, t1 + 99 * (t1 - t0), memory_order_relaxed);
    atomic_store_explicit(&s.peak_last, peak, memory_order_relaxed);
    return peak;
}

/* Lock held: a new peak of SIZE bytes (the heap's, the peak RSS, or the estimate: SOURCE). The
 * per-site live bytes are copied at every new peak. Residency is measured when the peak has
 * grown by an eighth since it was last measured, or when sites not measured then (none of
 * their samples was live) hold an eighth of its live bytes, and as late as the peak's set of
 * samples stands: at once for a sampled event's, else at the next sampled allocation or free,
 * or at the report. Measured as a heap peak is found (inside the allocation that made it), the
 * object that made it would always look untouched: its caller has not had it back yet. A
 * site's shares are applied to its bytes at the peak (report_sites.c). */
static void snapshot(uint64_t now, double size, enum al_peak_source source)
{
    _al_sampler.peak_bytes = s.live_bytes;
    _al_sampler.peak_time = now;
    _al_sampler.peak_source = source;
    double unmeasured = 0;
    for (uint32_t i = 0; i < _al_sampler.nsites; i++) {
        struct al_site *st = _al_site(i);
        st->peak_live_bytes = st->live_bytes;
        if (st->live_bytes > 0 && st->at_peak[0] + st->at_peak[1] + st->at_peak[2] <= 0)
            unmeasured += st->live_bytes;
    }
    _al_sampler.unattributed.peak_live_bytes = _al_sampler.unattributed.live_bytes;
    s.peak_set_current = true;
    if (size >= s.residency_peak * 1.125 ||
        (unmeasured > 0 && unmeasured >= s.live_bytes / 8 && !s.residency_unreadable)) {
        s.residency_peak = size;
        s.residency_pending = true;
    }
}

/* Lock held: the peak RSS read (RSS, KiB, 0 or more) makes a new peak if it rose since the
 * last one, or if STILL (the samples are still the peak's). */
static void rss_peak_seen(long rss, bool still, uint64_t now)
{
    if (rss > s.rss_peak_kib)
        s.rss_peak_kib = rss;
    else if (!still)
        return;
    snapshot(now, (double)s.rss_peak_kib * 1024, AL_PEAK_RSS);
}

/* Lock held, at a sampled event, before it changes the samples (RSS: rss_peak's answer
 * before the lock): without the heap's measure, a new peak if the peak RSS rose, or where that
 * cannot be asked, if the estimate of all live bytes passed its last peak by a MiB. Then the
 * residency of a peak's samples, still as they were at it, if due (not while the program's
 * seccomp filters may refuse the pagemap's reading: the report, which may, measures it then). */
static void sampled_event_peak(long rss, uint64_t now)
{
    if (rss >= 0)
        rss_peak_seen(rss, false, now);
    else if (!heap_measured() && (s.live_bytes > _al_sampler.peak_bytes + (1u << 20) || !_al_sampler.peak_time))
        snapshot(now, s.live_bytes, AL_PEAK_ESTIMATE);
    if (s.residency_pending && _al_seccomp_measures_ok())
        measure_residency();
}

/* ---- the slow paths ----------------------------------------------------------------------- */

static void sample_alloc(struct al_thread *t, size_t size, void *p);

/* The slow paths run inside the program's allocation calls: errno is the allocator's to set,
 * and the unwinder or the pagemap must not leave theirs behind. */
AL_NOINLINE void _al_sample_alloc(struct al_thread *t, size_t size, void *p)
{
    int saved = errno, cancel = _al_nocancel_begin();
    sample_alloc(t, size, p);
    _al_nocancel_end(cancel);
    errno = saved;
}

static void sample_alloc(struct al_thread *t, size_t size, void *p)
{
    t->sample_countdown = next_countdown(t);
    if (!p || !_al_sampler.enabled)
        return;
    uintptr_t frames[AL_SITE_FRAMES];
    tls_upkeep(t);
    unsigned n = capture(frames);
    uint64_t usable = _al_usable_size ? _al_usable_size(p) : size;
    double prob = _al_math_one_minus_exp_neg(((double)size + 1.0) / _al_sampler.rate);
    double objects = 1.0 / prob, bytes = (double)size / prob;
    long rss = rss_peak(false);
    uint64_t now = _al_tsc();
    bool took = lock();
    /* Before this sample is added: it would lift its site by a whole sample's weight at every
     * peak it finds. */
    sampled_event_peak(rss, now);
    s.peak_set_current = false;
    struct sample *old = find((uintptr_t)p);
    if (old) /* freed behind our back (a realloc racing with its free): forget the old one */
        forget(old, now, NULL);
    uint32_t id = site_of(frames, n);
    struct al_site *st = id < AL_SITES_MAX ? _al_site(id) : &_al_sampler.unattributed;
    if (index_room()) {
        add(&(struct sample){ (uintptr_t)p, id, size, now, objects, bytes }, st);
    } else {
        _al_sampler.dropped++;
    }
    st->alloc_bytes += bytes;
    st->alloc_objects += objects;
    st->frag_bytes += (double)(usable > size ? usable - size : 0) * objects;
    st->count++;
    unlock(took);
}

void _al_sampler_heap_peak(uint64_t heap, bool unless_lower)
{
    if (!_al_sampler.enabled)
        return;
    bool took = lock();
    if (!unless_lower || s.live_bytes >= _al_sampler.peak_bytes)
        snapshot(_al_tsc(), (double)heap, AL_PEAK_HEAP);
    unlock(took);
}

AL_NOINLINE void _al_sample_free(const void *p, struct al_sample_undo *u)
{
    int saved = errno, cancel = _al_nocancel_begin();
    long rss = rss_peak(false); /* p is marked sampled: it is, but for a race */
    uint64_t now = _al_tsc();
    bool took = lock();
    struct sample *e = find((uintptr_t)p);
    if (e) {
        sampled_event_peak(rss, now); /* a peak passed since the last sample: p still in it */
        forget(e, now, u);
        s.peak_set_current = false;
    }
    unlock(took);
    _al_nocancel_end(cancel);
    errno = saved;
}

/* The realloc failed: its object is the program's still, and a live sample again (the
 * lifetime its forgetting counted taken back). */
AL_NOINLINE void _al_sample_restore(const struct al_sample_undo *u)
{
    int saved = errno, cancel = _al_nocancel_begin();
    bool took = lock();
    struct al_site *st = u->site < AL_SITES_MAX ? _al_site(u->site) : &_al_sampler.unattributed;
    st->life_cycles[u->life]--;
    st->nlife--;
    if (!find(u->addr) && index_room())
        add(&(struct sample){ u->addr, u->site, u->size, u->born, u->objects, u->bytes }, st);
    s.peak_set_current = false;
    unlock(took);
    _al_nocancel_end(cancel);
    errno = saved;
}

void _al_sampler_collect(void)
{
    bool took = lock();
    _al_sampler.live_bytes_at_exit = s.live_bytes;
    /* Still at the peak: the residency of exactly the peak's samples can be had now. */
    if (s.residency_pending || (s.peak_set_current && s.nsamples))
        measure_residency();
    unlock(took);
}

void _al_sampler_report_begins(void)
{
    if (!_al_sampler.enabled || heap_measured())
        return;
    long rss = rss_peak(true);
    int64_t now = rss >= 0 ? _al_proc_rss() : -1;
    long now_kib = now >= 0 ? (long)(now / 1024) : -1;
    bool took = lock();
    /* Exit is the peak if the peak RSS rose since the last one, or if the process is about as
     * large as then (a MiB: the kernel's counts of resident pages lag) and the estimate is no
     * lower: the samples since are still live. */
    bool still = now_kib >= 0 && now_kib + 1024 >= s.rss_peak_kib && s.live_bytes >= _al_sampler.peak_bytes;
    if (rss >= 0)
        rss_peak_seen(rss, still, _al_tsc());
    else if (s.live_bytes > _al_sampler.peak_bytes)
        snapshot(_al_tsc(), s.live_bytes, AL_PEAK_ESTIMATE);
    unlock(took);
}

bool _al_sampler_lock(void)
{
    return lock();
}

uint64_t _al_sampler_live(void)
{
    return s.nsamples;
}

void _al_sampler_unlock(bool took)
{
    unlock(took);
}
