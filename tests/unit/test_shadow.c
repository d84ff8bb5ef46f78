/* Unit tests of shadow/: new/reused detection, the large mark, concurrency, addresses the
 * table does not cover. */
#include <check.h>

#include "check_main.h"
#include <pthread.h>
#include <stdlib.h>

#include "shadow.h"

static void setup(void)
{
    if (!_al_shadow.dir)
        ck_assert_int_eq(_al_shadow_init(), 0);
}

START_TEST(mark_new_then_reused)
{
    char *base = (char *)(uintptr_t)0x7f0000100000ull;
    ck_assert(!_al_shadow_mark(base, false));
    ck_assert(_al_shadow_mark(base, false));
    /* Neighbouring granules are independent. */
    ck_assert(!_al_shadow_mark(base + 8, false));
    ck_assert(!_al_shadow_mark(base + 16, false));
    ck_assert(_al_shadow_mark(base + 8, false));
    /* Same granule, other offset: the same object start as far as the table cares. */
    ck_assert(_al_shadow_mark(base + 4, false));
}
END_TEST

START_TEST(large_mark_follows_the_object)
{
    char *p = (char *)(uintptr_t)0x7f0000300040ull;
    ck_assert(!(AL_SHADOW_LARGE & _al_shadow_flags(p)));
    _al_shadow_mark(p, true);
    ck_assert((AL_SHADOW_LARGE & _al_shadow_flags(p)));
    /* A small object at the same address later: no longer large. */
    _al_shadow_mark(p, false);
    ck_assert(!(AL_SHADOW_LARGE & _al_shadow_flags(p)));
    ck_assert(!(AL_SHADOW_LARGE & _al_shadow_flags((char *)(uintptr_t)0x7f0000500000ull))); /* no region there */
    /* The sampled mark is independent of the others and survives a re-mark of the object. */
    _al_shadow_set_sampled(p, true);
    ck_assert(_al_shadow_flags(p) & AL_SHADOW_SAMPLED);
    ck_assert(_al_shadow_mark(p, false));
    ck_assert(_al_shadow_flags(p) & AL_SHADOW_SAMPLED);
    _al_shadow_set_sampled(p, false);
    ck_assert(!(_al_shadow_flags(p) & AL_SHADOW_SAMPLED));
    ck_assert(_al_shadow_flags(p) & AL_SHADOW_SEEN);
}
END_TEST

START_TEST(region_boundaries)
{
    uint64_t before = atomic_load(&_al_shadow.regions);
    char *last = (char *)(uintptr_t)(0x7f0000700000ull - 8);
    char *first = (char *)(uintptr_t)0x7f0000700000ull;
    ck_assert(!_al_shadow_mark(last, false));
    ck_assert(!_al_shadow_mark(first, false));
    ck_assert_uint_eq(atomic_load(&_al_shadow.regions), before + 2);
    ck_assert_uint_ge(_al_shadow_footprint(), 2 * sizeof(struct al_shadow_region));
}
END_TEST

START_TEST(beyond_the_table)
{
    uint64_t before = atomic_load(&_al_shadow.untracked);
    void *far = (void *)(uintptr_t)(_al_shadow.dir_entries << AL_SHADOW_SLICE_SHIFT);
    ck_assert(!_al_shadow_mark(far, false));
    ck_assert_uint_eq(atomic_load(&_al_shadow.untracked), before + 1);
    ck_assert(_al_shadow_address_bits() == 47 || _al_shadow_address_bits() == 56);
}
END_TEST

#define THREADS 4
#define PER_THREAD 50000

static _Atomic uint64_t reused_total;

static void *marker(void *arg)
{
    /* All threads mark the same addresses: exactly one of them sees each one first. */
    (void)arg;
    uint64_t reused = 0;
    for (uint64_t i = 0; i < PER_THREAD; i++)
        reused += _al_shadow_mark((void *)(uintptr_t)(0x7f1000000000ull + i * 24), false);
    atomic_fetch_add(&reused_total, reused);
    return NULL;
}

START_TEST(concurrent_marks_are_exact)
{
    pthread_t t[THREADS];
    for (int i = 0; i < THREADS; i++)
        pthread_create(&t[i], NULL, marker, NULL);
    for (int i = 0; i < THREADS; i++)
        pthread_join(t[i], NULL);
    /* Addresses 24 bytes apart share no granule, so there are PER_THREAD distinct ones. */
    ck_assert_uint_eq(atomic_load(&reused_total), (uint64_t)(THREADS - 1) * PER_THREAD);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("shadow");
    TCase *tc = tcase_create("shadow");
    tcase_add_unchecked_fixture(tc, setup, NULL);
    tcase_add_checked_fixture(tc, setup, NULL);
    tcase_add_test(tc, mark_new_then_reused);
    tcase_add_test(tc, large_mark_follows_the_object);
    tcase_add_test(tc, region_boundaries);
    tcase_add_test(tc, beyond_the_table);
    tcase_add_test(tc, concurrent_marks_are_exact);
    suite_add_tcase(s, tc);
    return al_check_run(s);
}
