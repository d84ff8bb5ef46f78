/* Memory waste: live requested bytes, internal fragmentation, blowup and external
 * fragmentation, at the peak and at exit.
 *
 * Every allocation counts its object in its thread's row for its size class (objects,
 * requested bytes, and the bytes the class table cannot tell: an odd object's usable size
 * beyond its class, a large object's span to the end of its last page). Internal
 * fragmentation of a class is then objects x class size + extra - requested, summed when a
 * snapshot is taken, not on every call. Blowup is the one global state: per class (and one
 * pool for large objects), the bytes freed and not yet taken again by an allocation of that
 * class; a thread keeps up to AL_CREDIT_FLUSH bytes of its own frees per class as credit
 * before adding them to it, so a thread that frees and allocates the same class (the common
 * case) takes no atomic. The total is the resident part of the allocator's heap (heap.c).
 *
 * A snapshot is taken when the total passes its previous peak by 1 MiB, looked at each time a
 * thread's allocations outgrow its frees by AL_SNAP_CHECK_BYTES; the last one is the peak of
 * the report (the state at exit replaces it only if it passed the largest footprint there may
 * have been at a look by more than the rule can miss).
 */
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "profiler.h"


struct al_waste_state _al_waste;

static struct {
    _Atomic int lock;
    uint64_t next_rss;         /* the resident size that triggers the next snapshot */
    uint64_t taken;
    /* The largest footprint there may have been at a look: measured, or between two
     * measurements the last one plus what the process has grown since (the heap cannot grow
     * by more). */
    _Atomic uint64_t highest;
    /* The last measurement and the resident size then, in pages, as one word (heap << 32 |
     * rss) so that a look never pairs one measurement's heap with another's size. */
    _Atomic uint64_t measured;
    /* The largest heap measured: when a measurement passes it, the sampler notes what its
     * sites hold (their live bytes at the peak are the heap's peak's, not their own estimate's
     * highest, which its noise would lift). */
    uint64_t sites_total;
    /* Zero between snapshots: a snapshot writes only the rows some thread has counts in, and
     * zeroes those again, so that in a forked child (whose tables are its parent's pages until
     * written) it copies a few pages, not the whole table. */
    int64_t (*sums)[AL_CLS_N];
    /* Cycles spent measuring the heap: measuring costs a walk of every mapped page of it
     * (mincore), so a program whose heap is mostly reserved and little touched (gigabytes of
     * big blocks) would pay that for each step of growth. */
    uint64_t spent;
    _Atomic uint64_t big_look_next; /* the TSC before which a big block's free makes no look */
} snap;

/* Measurements take at most a share of the run (1 / MEASURE_SHARE) past their first
 * MEASURE_FREE cycles (a fifth of a second or so: a short run's looks all go ahead), until
 * exit's. Cycles are wall time: on a loaded machine a measurement takes longer, and at a
 * twentieth with 40 ms free a heap of 500 MB grown by small objects (260 steps) ran out and
 * had its peak snapshot taken 10% short of the heap's peak. */
#define MEASURE_SHARE 10
#define MEASURE_FREE 500000000ull

static _Atomic unsigned next_tag;

static size_t array_bytes(size_t bytes)
{
    return (bytes + 4095) & ~(size_t)4095;
}

static void *map_array(size_t bytes)
{
    return _al_mem_map(array_bytes(bytes));
}

/* An object of class SLOT, REQ bytes requested, EXTRA beyond the class size, counted into
 * (SIGN 1) or out of (-1) its thread's row: the blowup side is the caller's. */
static void count_object(struct al_thread *t, uint32_t slot, int sign, uint64_t req, int64_t extra)
{
    AL_BUMP(t->cls[slot][AL_CLS_OBJECTS], sign);
    AL_BUMP(t->cls[slot][AL_CLS_REQUESTED], sign * (int64_t)req);
    AL_BUMP(t->cls[slot][AL_CLS_EXTRA], sign * extra);
}

/* 16-byte granules (half the shadow's granule bytes) where the allocator is glibc, which
 * documents that every block it returns is 16-byte aligned on 64-bit systems, and every size
 * class of C leaves the record room; C's classes are all there are, its blocks handed out by
 * memalign and the like included (glibc's usable sizes are 8 less than a multiple of 16, from
 * 24 up). Other allocators hand out 8-byte classes at 8-byte alignment. */
static unsigned granule_for(const struct al_alloc_config *c)
{
    unsigned shift = AL_SHADOW_GRANULE_SHIFT + 1;
    if (strcmp(_al_allocator.name, "glibc") != 0)
        return AL_SHADOW_GRANULE_SHIFT;
    for (uint32_t i = 0; i < c->nruns; i++) {
        const struct al_class_run *run = &c->runs[i];
        for (uint32_t k = 0; k < run->count; k++) {
            uint64_t size = run->first + k * run->step;
            if (size >= (uint64_t)AL_SHADOW_MAX_NIBBLES << shift)
                break; /* and so do the run's larger classes */
            if (!_al_shadow_record_fits(size, shift))
                return AL_SHADOW_GRANULE_SHIFT;
        }
    }
    return shift;
}

void _al_waste_init(const struct al_alloc_config *c)
{
    struct al_waste_state *w = &_al_waste;
    if (!_al_shadow.dir) {
        snprintf(w->reason, sizeof w->reason, "the shadow table could not be mapped");
        return;
    }
    if (c && c->large_threshold == _al_hot.large_threshold) {
        size_t bytes = _al_class_table_bytes(c); /* none for one run of classes */
        void *mem = bytes ? _al_mem_map(bytes) : NULL;
        if ((mem || !bytes) && _al_class_table_build(&w->table, c, mem) == 0) {
            w->has_table = true;
            w->inexact = c->style == AL_STYLE_SEQUENTIAL && _al_usable_size;
            w->nclasses = c->nclasses;
            /* A sample another thread took already was marked in an 8-byte granule, where its
             * free must find the mark: then the granule stays. */
            bool took = _al_sampler_lock();
            if (!_al_sampler_live())
                _al_shadow.granule_shift = granule_for(c);
            _al_sampler_unlock(took);
        }
    }
    w->slot_any = w->nclasses;
    w->slot_large = w->nclasses + 1;
    w->nslots = w->nclasses + 2;
    w->blowup = map_array(w->nslots * sizeof *w->blowup);
    w->exited = map_array(w->nslots * sizeof *w->exited);
    snap.sums = map_array(w->nslots * sizeof *snap.sums);
    w->peak.cls = map_array(w->nslots * sizeof *w->peak.cls);
    w->final.cls = map_array(w->nslots * sizeof *w->final.cls);
    if (!w->blowup || !w->exited || !snap.sums || !w->peak.cls || !w->final.cls) {
        snprintf(w->reason, sizeof w->reason, "out of memory for the waste tables");
        return;
    }
    if (!w->has_table)
        snprintf(w->classes_reason, sizeof w->classes_reason,
                 "no size classes for this allocator (%s): each object's class is its usable size, "
                 "all small classes in one row", _al_allocator.config_reason[0] ? _al_allocator.config_reason
                                                                                 : "the config does not match");
    if (!_al_usable_size && !w->has_table)
        snprintf(w->classes_reason, sizeof w->classes_reason,
                 "neither size classes nor malloc_usable_size: internal fragmentation of small objects "
                 "is not measured");
    if (_al_shadow_heap_init() < 0) {
        snprintf(w->reason, sizeof w->reason, "the heap page table could not be mapped");
        return;
    }
    _al_heap_init();
    /* A thread that exists already (another library's constructor made it) writes its first
     * record once it sees this, and must see the granule set above by then. */
    atomic_thread_fence(memory_order_release);
    w->enabled = true;
}

void _al_waste_thread_init(struct al_thread *t)
{
    t->tag = atomic_fetch_add_explicit(&next_tag, 1, memory_order_relaxed) % 255 + 1;
    t->snap_countdown = AL_SNAP_CHECK_BYTES;
    _al_waste_thread_rows(t);
}

/* The thread's class rows, made late where it started before memory waste was set up (the
 * main thread) or its first try found no memory: whether it has them now. */
AL_NOINLINE bool _al_waste_thread_rows(struct al_thread *t)
{
    if (!t->cls && _al_waste.enabled)
        t->cls = map_array(_al_waste.nslots * sizeof *t->cls);
    return t->cls != NULL;
}

/* Called with the thread registry locked: what an exiting thread counted stays counted (its
 * objects live on), and its rows start from zero for the next thread to use them. Only the
 * pages of its rows that are resident can hold counts (one mincore): glibc's 8190 classes make
 * 64 pages of rows, of which a thread writes a few, and reading them all (faulting each in
 * again) and giving them all back cost 190 us a thread, with the registry locked. */
void _al_waste_thread_retire(struct al_thread *t)
{
    if (!t->cls || !_al_waste.exited)
        return;
    size_t bytes = array_bytes(_al_waste.nslots * sizeof *t->cls), pages = bytes / 4096;
    unsigned char in[AL_TABLE_PAGES_MAX]; /* nslots is at most AL_CONFIG_MAX_CLASSES + 2 */
    /* Where the program's seccomp filter may refuse mincore, every page is read. */
    if (!_al_seccomp_measures_ok() || mincore(t->cls, bytes, in) != 0)
        memset(in, 1, pages);
    for (uint32_t s = 0; s < _al_waste.nslots; s++) {
        if (!(in[s * sizeof *t->cls / 4096] & 1))
            continue; /* never written: all zero */
        for (unsigned k = 0; k < AL_CLS_CREDIT; k++)
            _al_add_nonzero(&_al_waste.exited[s][k], AL_READ(t->cls[s][k]));
        int64_t credit = AL_READ(t->cls[s][AL_CLS_CREDIT]);
        if (credit) /* no thread of its own to take it back now */
            atomic_fetch_add_explicit(&_al_waste.blowup[s], credit, memory_order_relaxed);
    }
    /* Zero again, and no longer resident: each run of resident pages given back. */
    for (size_t i = 0, j; i < pages; i = j + 1) {
        for (j = i; j < pages && (in[j] & 1); j++)
            ;
        if (j > i)
            madvise((char *)t->cls + i * 4096, (j - i) * 4096, MADV_DONTNEED);
    }
}

static size_t usable(void *p)
{
    return _al_usable_size ? _al_usable_size(p) : 0;
}

/* The class row of an object, what the row's class size leaves out (EXTRA), and the bytes it
 * holds for blowup: the same answer at its allocation and at its free. MAYBE_ODD: ask the
 * allocator for its usable size; PAGES: what its record says (0: the pages it covers). */
static uint32_t classify(void *p, uint64_t a, uint64_t req, unsigned large, bool maybe_odd, uint32_t pages,
                         bool *odd, int64_t *extra, int64_t *bytes)
{
    *odd = false;
    *extra = 0;
    if (large) {
        if (!pages)
            pages = _al_shadow_pages_of(a, req);
        uint64_t span = (a & ~(uint64_t)4095) + (uint64_t)pages * 4096 - a;
        if (span < req)
            span = req;
        *extra = (int64_t)span;
        *bytes = (int64_t)span;
        return _al_waste.slot_large;
    }
    if (!_al_waste.has_table) {
        uint64_t u = usable(p);
        *odd = true;
        *extra = (int64_t)(u > req ? u : req);
        *bytes = *extra;
        return _al_waste.slot_any;
    }
    uint32_t slot = _al_class_index(&_al_waste.table, req);
    uint64_t c = _al_class_size(&_al_waste.table, slot);
    *bytes = (int64_t)c;
    if (maybe_odd) {
        uint64_t u = usable(p);
        if (u && u != c) {
            *odd = true;
            *extra = (int64_t)u - (int64_t)c;
        }
    }
    return slot;
}

AL_NOINLINE unsigned _al_waste_alloc_slow(struct al_thread *t, struct al_shadow_region *r, uint64_t a, uint64_t req,
                                          unsigned large, bool maybe_odd)
{
    if (!t->cls && !_al_waste_thread_rows(t)) { /* before start-up is done: no record */
        _al_heap_see(a);
        return __atomic_load_n(&r->granule[AL_SHADOW_GRANULE(a)], __ATOMIC_RELAXED) & AL_SHADOW_SEEN
                   ? AL_REUSE_REUSED : AL_REUSE_NEW;
    }
    uint32_t pages = 0, slot;
    bool odd, reused;
    int64_t extra, bytes;
    void *p = (void *)(uintptr_t)a;
    if (large) {
        /* The record first: a large object's span needs the pages its address ever covered. */
        reused = _al_shadow_object_new(r, a, req, false, t->tag, &pages);
        slot = classify(p, a, req, large, maybe_odd, pages, &odd, &extra, &bytes);
    } else {
        slot = classify(p, a, req, large, maybe_odd, pages, &odd, &extra, &bytes);
        reused = _al_shadow_object_new(r, a, req, odd, t->tag, &pages);
    }
    if (!reused)
        _al_heap_see(a);
    count_object(t, slot, 1, req, extra);
    _al_waste_take_blowup(t->cls[slot], slot, bytes);
    _al_waste_countdown(t, req);
    return reused ? AL_REUSE_REUSED : AL_REUSE_NEW;
}

static void look(void);

AL_NOINLINE unsigned _al_waste_count_free(struct al_thread *t, void *p, const struct al_shadow_object *o,
                                          struct al_waste_undo *undo)
{
    uint64_t a = (uint64_t)(uintptr_t)p;
    unsigned large = o->requested >= _al_hot.large_threshold;
    /* The footprint is looked at as allocations are made, before their pages are written: a
     * program that writes big blocks later and frees some before exit had its peak after the
     * last look. A look before the first large free after a while, and before the free of a
     * block as big as a snapshot's step (the object still counted live), sees it. The second
     * kind at most 1% of the time: a look reads /proc (2 us), and a program freeing a block of
     * 1 MiB every few microseconds ran 35% slower. */
    bool due = large && (t->free_look -= (int64_t)o->requested) < 0;
    bool big = large && !due && o->requested >= AL_SNAP_STEP &&
               _al_tsc() >= atomic_load_explicit(&snap.big_look_next, memory_order_relaxed);
    if (due || big) {
        t->free_look = AL_SNAP_FREE_LOOK_BYTES;
        uint64_t t0 = _al_tsc();
        look();
        uint64_t t1 = _al_tsc();
        if (big)
            atomic_store_explicit(&snap.big_look_next, t1 + 99 * (t1 - t0), memory_order_relaxed);
    }
    bool odd;
    int64_t extra, bytes;
    uint32_t slot = classify(p, a, o->requested, large, o->odd, o->pages, &odd, &extra, &bytes);
    _al_waste_countback(t, o->requested);
    count_object(t, slot, -1, o->requested, extra);
    _al_waste_raise_blowup(t->cls[slot], slot, bytes);
    if (undo) {
        undo->requested = o->requested;
        undo->slot = slot;
        undo->extra = extra;
        undo->bytes = bytes;
        undo->odd = o->odd;
    }
    return large | 2u;
}

void _al_waste_restore(struct al_thread *t, void *p, const struct al_waste_undo *u)
{
    uint64_t a = (uint64_t)(uintptr_t)p;
    struct al_shadow_region *r = _al_shadow_region(a);
    uint32_t pages;
    if (!r)
        return;
    _al_shadow_object_new(r, a, u->requested, u->odd, t->tag, &pages);
    count_object(t, u->slot, 1, u->requested, u->extra);
    _al_waste_take_blowup(t->cls[u->slot], u->slot, u->bytes);
}

/* ---- snapshots ------------------------------------------------------------------------------ */

/* Row I of snapshot S set to SRC, written only where it changed (see snap.sums). */
static void store_row(struct al_waste_snapshot *s, uint32_t i, const int64_t *src)
{
    if (memcmp(s->cls[i], src, sizeof *s->cls) == 0)
        return;
    memcpy(s->cls[i], src, sizeof *s->cls);
    _al_table_mark_row(s->pages, i, sizeof *s->cls);
}

/* The freed bytes not yet taken again by their class are not all in the heap when the
 * allocator hands them to other classes (glibc splits and merges its chunks) or back to the
 * kernel: counted as they are, they passed the whole heap under glibc with threads (70 MiB of
 * blowup in a 16 MiB heap). So blowup is capped at what the heap holds beyond the live objects
 * and their internal fragmentation, each class's share scaled alike; the count before the
 * cap stays in the snapshot. */
static void cap_blowup(struct al_waste_snapshot *s)
{
    s->blowup_uncapped = s->blowup;
    int64_t room = (int64_t)s->total - (int64_t)(s->live + s->internal);
    uint64_t cap = room > 0 ? (uint64_t)room : 0;
    if (s->blowup <= cap)
        return;
    uint64_t sum = 0;
    for (uint32_t i = 0; i < _al_waste.nslots; i++) {
        /* Only rows on pages marked written have blowup, and each one's shrinks (cap is below
         * the total): written in place, the page marked already. */
        int64_t *b = &s->cls[i][AL_SLOT_BLOWUP];
        if (!_al_table_row_written(s->pages, i, sizeof *s->cls) || *b <= 0)
            continue;
        *b = (int64_t)((unsigned __int128)*b * cap / s->blowup);
        sum += (uint64_t)*b;
    }
    s->blowup = sum;
}

/* The snapshot S of the heap whose resident total is TOTAL (just measured by the caller).
 * A row whose sums, blowup count and snapshot row are all on pages never written is zero in
 * the snapshot already: it is skipped. */
static void take(struct al_waste_snapshot *s, uint64_t total, int pagemap)
{
    struct al_waste_state *w = &_al_waste;
    static const int64_t zero[AL_CLS_N];
    uint64_t sums_written[AL_TABLE_WORDS], blowup_written[AL_TABLE_WORDS];
    _al_threads_sum_classes(snap.sums, w->nslots, pagemap);
    _al_table_written(pagemap, snap.sums, w->nslots, sizeof *snap.sums, sums_written);
    _al_table_written(pagemap, w->blowup, w->nslots, sizeof *w->blowup, blowup_written);
    _al_table_written(pagemap, s->cls, w->nslots, sizeof *s->cls, s->pages);
    s->tsc = _al_tsc();
    s->total = total;
    s->live = s->internal = s->blowup = s->objects = 0;
    for (uint32_t i = 0; i < w->nslots; i++) {
        if (!_al_table_row_written(sums_written, i, sizeof *snap.sums) &&
            !_al_table_row_written(blowup_written, i, sizeof *w->blowup) &&
            !_al_table_row_written(s->pages, i, sizeof *s->cls))
            continue;
        int64_t objects = snap.sums[i][AL_CLS_OBJECTS], req = snap.sums[i][AL_CLS_REQUESTED];
        int64_t size = i < w->nclasses ? (int64_t)_al_class_size(&w->table, i) : 0;
        int64_t internal = objects * size + snap.sums[i][AL_CLS_EXTRA] - req;
        int64_t blowup = atomic_load_explicit(&w->blowup[i], memory_order_relaxed);
        if (internal < 0 || (i == w->slot_any && !_al_usable_size))
            internal = 0;
        if (blowup < 0)
            blowup = 0;
        blowup += snap.sums[i][AL_CLS_CREDIT];
        if (memcmp(snap.sums[i], zero, sizeof zero) != 0)
            memset(snap.sums[i], 0, sizeof zero);
        int64_t row[AL_SLOT_N];
        row[AL_SLOT_OBJECTS] = objects;
        row[AL_SLOT_REQUESTED] = req;
        row[AL_SLOT_INTERNAL] = internal;
        row[AL_SLOT_BLOWUP] = blowup;
        store_row(s, i, row);
        s->objects += (uint64_t)(objects > 0 ? objects : 0);
        s->live += (uint64_t)(req > 0 ? req : 0);
        s->internal += (uint64_t)internal;
        s->blowup += (uint64_t)blowup;
    }
    cap_blowup(s);
    s->external = (int64_t)s->total - (int64_t)(s->live + s->internal + s->blowup);
    s->taken = true;
}

static void raise_highest(uint64_t bytes)
{
    uint64_t h = atomic_load_explicit(&snap.highest, memory_order_relaxed);
    while (bytes > h && !atomic_compare_exchange_weak_explicit(&snap.highest, &h, bytes, memory_order_relaxed,
                                                               memory_order_relaxed))
        ;
}

/* The process's resident size is the cheap first look (one read of /proc/self/statm): the
 * heap cannot have grown by a step unless it grew by one. Then the heap itself is measured,
 * and a snapshot taken only if it passed the peak by a step. */
static void check_footprint(void)
{
    if (!_al_seccomp_measures_ok())
        return; /* the snapshots taken stand; the state at exit is measured with the report */
    int64_t now = _al_proc_rss();
    uint64_t rss = now > 0 ? (uint64_t)now : 0;
    uint64_t last = atomic_load_explicit(&snap.measured, memory_order_relaxed);
    if (last) { /* before the first measurement there is nothing to add the growth to */
        uint64_t heap = (last >> 32) * 4096, at = (last & 0xffffffffu) * 4096;
        raise_highest(heap + (rss > at ? rss - at : 0));
    }
    if (rss < __atomic_load_n(&snap.next_rss, __ATOMIC_RELAXED))
        return;
    if (!_al_spin_trylock(&snap.lock))
        return; /* another thread is taking one */
    uint64_t begin = _al_tsc(), since = _al_tsc_start().tsc;
    if (snap.spent > MEASURE_FREE + (begin > since ? begin - since : 0) / MEASURE_SHARE) {
        _al_spin_unlock(&snap.lock);
        return; /* over its share: the next look measures */
    }
    int pagemap = _al_proc_pagemap_open();
    uint64_t total = _al_heap_resident(pagemap);
    atomic_store_explicit(&snap.measured, (total / 4096) << 32 | (rss / 4096 & 0xffffffffu),
                          memory_order_relaxed);
    raise_highest(total);
    if (total > snap.sites_total) {
        snap.sites_total = total;
        _al_sampler_heap_peak(total, false);
    }
    /* The heap cannot pass the mark before the process grows by what it lacks. */
    uint64_t lack = _al_waste.peak.taken && total < _al_waste.peak.total + AL_SNAP_STEP
                        ? _al_waste.peak.total + AL_SNAP_STEP - total : AL_SNAP_STEP;
    __atomic_store_n(&snap.next_rss, rss + (lack > AL_SNAP_STEP / 16 ? lack : AL_SNAP_STEP / 16), __ATOMIC_RELAXED);
    if (!_al_waste.peak.taken || total >= _al_waste.peak.total + AL_SNAP_STEP) {
        take(&_al_waste.peak, total, pagemap); /* every snapshot the rule takes is the new peak */
        snap.taken++;
    }
    _al_proc_pagemap_close(pagemap);
    snap.spent += _al_tsc() - begin;
    _al_spin_unlock(&snap.lock);
}

/* Inside the program's call: the pagemap's close(2) is a cancellation point. */
static void look(void)
{
    if (!_al_waste.enabled)
        return;
    int cancel = _al_nocancel_begin();
    check_footprint();
    _al_nocancel_end(cancel);
}

AL_NOINLINE void _al_waste_check(struct al_thread *t)
{
    t->snap_countdown = AL_SNAP_CHECK_BYTES;
    look();
}

void _al_waste_final(void)
{
    if (!_al_waste.enabled)
        return;
    _al_spin_lock(&snap.lock);
    struct al_waste_snapshot s = { .cls = _al_waste.final.cls };
    int pagemap = _al_proc_pagemap_open();
    take(&s, _al_heap_resident(pagemap), pagemap);
    _al_waste.final = s;
    /* The sites' peak is now if the heap at exit passed the largest measured by more than the
     * measurements can miss (as the memory section's, below). Within that of it (a step either
     * way: the last allocations may have found room in pages already counted), only if the
     * sites' estimate is no lower than at their last peak: a program that freed its objects
     * and kept their pages has its peak behind it. */
    if (s.total > snap.sites_total + AL_SNAP_STEP + AL_SNAP_CHECK_BYTES)
        _al_sampler_heap_peak(s.total, false);
    else if (s.total + AL_SNAP_STEP >= snap.sites_total)
        _al_sampler_heap_peak(s.total, true);
    /* The state at exit is the peak only if it passed the largest footprint there may have been
     * at a look during the run by more than the rule can miss (a step, plus what a thread
     * allocates between two looks): otherwise the peak is the snapshot taken when that
     * footprint was reached. Against the last snapshot alone, an allocator whose metadata grew
     * a little while the program freed half of its objects made the state at exit, half freed,
     * the peak. */
    uint64_t highest = atomic_load(&snap.highest);
    if (highest < _al_waste.peak.total)
        highest = _al_waste.peak.total;
    if (!_al_waste.peak.taken || s.total > highest + AL_SNAP_STEP + AL_SNAP_CHECK_BYTES) {
        struct al_waste_snapshot *peak = &_al_waste.peak;
        _al_table_written(pagemap, peak->cls, _al_waste.nslots, sizeof *peak->cls, peak->pages);
        for (uint32_t i = 0; i < _al_waste.nslots; i++)
            if (_al_table_row_written(s.pages, i, sizeof *s.cls) || _al_table_row_written(peak->pages, i, sizeof *s.cls))
                store_row(peak, i, s.cls[i]);
        int64_t (*keep)[AL_SLOT_N] = peak->cls;
        uint64_t pages[AL_TABLE_WORDS];
        memcpy(pages, peak->pages, sizeof pages);
        *peak = s;
        peak->cls = keep;
        memcpy(peak->pages, pages, sizeof pages);
    }
    _al_proc_pagemap_close(pagemap);
    _al_waste.snapshots = snap.taken;
    _al_spin_unlock(&snap.lock);
}

/* A forked child measures its own peak from now on (its heap is the parent's, still live). */
void _al_waste_after_fork_child(void)
{
    /* A thread of the parent was taking a snapshot: its half-summed rows are not zero. */
    if (atomic_exchange(&snap.lock, 0) && snap.sums)
        memset(snap.sums, 0, _al_waste.nslots * sizeof *snap.sums);
    snap.next_rss = 0;
    snap.taken = 0;
    snap.spent = 0;
    atomic_store(&snap.highest, 0);
    atomic_store(&snap.measured, 0);
    snap.sites_total = 0;
    _al_waste.peak.taken = false;
    _al_waste.peak.total = 0;
}
