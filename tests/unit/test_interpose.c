/* Unit tests of interpose/: the bootstrap pool that serves dlsym's allocations while the real
 * allocator is being resolved (and the thread writing a report from _exit), and the
 * table-generated forwarding targets' shape. The test
 * provides the resolved-function table itself, so only the pool is linked in, not the
 * exported wrappers. */
#include <check.h>

#include "check_main.h"
#include <errno.h>
#include <malloc.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "interpose.h"

struct al_real_fns _al_real;

START_TEST(pool_serves_aligned_zeroed_memory)
{
    char *a = _al_bootstrap_alloc(10);
    char *b = _al_bootstrap_alloc(100);
    ck_assert_ptr_nonnull(a);
    ck_assert_ptr_nonnull(b);
    ck_assert_uint_eq((uintptr_t)a % 16, 0);
    ck_assert_uint_eq((uintptr_t)b % 16, 0);
    ck_assert(b >= a + 10);
    for (int i = 0; i < 100; i++)
        ck_assert_int_eq(b[i], 0);
    ck_assert(_al_bootstrap_owns(a));
    ck_assert(_al_bootstrap_owns(b + 99));
    ck_assert_uint_eq(_al_bootstrap_usable_size(a), 10);
    ck_assert_uint_eq(_al_bootstrap_usable_size(b), 100);
    char on_stack;
    ck_assert(!_al_bootstrap_owns(&on_stack));
    ck_assert(!_al_bootstrap_owns(NULL));
    void *heap = malloc(8);
    ck_assert(!_al_bootstrap_owns(heap));
    free(heap);
}
END_TEST

START_TEST(pool_realloc_copies_into_real_memory)
{
    _al_real.malloc = malloc;
    char *p = _al_bootstrap_alloc(6);
    memcpy(p, "hello", 6);
    char *q = _al_bootstrap_realloc(p, 64);
    ck_assert_ptr_nonnull(q);
    ck_assert(!_al_bootstrap_owns(q));
    ck_assert_str_eq(q, "hello");
    free(q);
    /* Shrinking copies only what fits. */
    p = _al_bootstrap_alloc(32);
    memset(p, 'x', 32);
    q = _al_bootstrap_realloc(p, 4);
    ck_assert_mem_eq(q, "xxxx", 4);
    free(q);
}
END_TEST

START_TEST(pool_exhaustion_aborts_with_a_message)
{
    /* More than the pool holds: the process must stop with a message, not hand out memory
     * it cannot account for (checked through the signal the forked test dies of). */
    for (size_t i = 0; i <= AL_BOOTSTRAP_POOL_SIZE / 1024; i++)
        _al_bootstrap_alloc(1024);
}
END_TEST

START_TEST(own_pool_honours_alignment)
{
    char *a = _al_own_alloc(10, 0);
    char *b = _al_own_alloc(100, 4096);
    char *c = _al_own_alloc(8, 64);
    ck_assert_ptr_nonnull(a);
    ck_assert_ptr_nonnull(b);
    ck_assert_ptr_nonnull(c);
    ck_assert_uint_eq((uintptr_t)a % 16, 0);
    ck_assert_uint_eq((uintptr_t)b % 4096, 0);
    ck_assert_uint_eq((uintptr_t)c % 64, 0);
    ck_assert(b >= a + 10 && c >= b + 100);
    for (int i = 0; i < 100; i++)
        ck_assert_int_eq(b[i], 0);
    ck_assert(_al_bootstrap_owns(b) && _al_bootstrap_owns(c + 7));
    ck_assert_uint_eq(_al_bootstrap_usable_size(b), 100);
    errno = 0;
    ck_assert_ptr_null(_al_own_alloc(8, 48));
    ck_assert_int_eq(errno, EINVAL);
}
END_TEST

START_TEST(own_pool_runs_out_without_abort)
{
    /* Unlike start-up, running out while a report is written is an ordinary failure. */
    size_t got = 0;
    while (got <= AL_BOOTSTRAP_POOL_SIZE && _al_own_alloc(4096, 0))
        got += 4096;
    ck_assert_uint_lt(got, AL_BOOTSTRAP_POOL_SIZE);
    ck_assert_uint_ge(got, AL_BOOTSTRAP_POOL_SIZE / (4096 + 16) * 4096); /* 16: each header */
    ck_assert_int_eq(errno, ENOMEM);
    ck_assert_ptr_null(_al_own_alloc(SIZE_MAX, 0));
    ck_assert_ptr_nonnull(_al_own_alloc(8, 0)); /* what is left still serves small requests */
}
END_TEST

START_TEST(own_realloc_never_reaches_the_allocator)
{
    _al_real.malloc = NULL; /* would crash if called */
    _al_real.malloc_usable_size = malloc_usable_size;
    _al_own_memory = true;
    char *p = _al_own_realloc(NULL, 6);
    ck_assert(_al_bootstrap_owns(p));
    memcpy(p, "hello", 6);
    char *q = _al_own_realloc(p, 100);
    ck_assert(_al_bootstrap_owns(q));
    ck_assert_str_eq(q, "hello");
    /* The allocator's object is copied into the pool and left where it is. */
    char *real = malloc(40);
    memset(real, 'r', 40);
    char *r = _al_own_realloc(real, 20);
    ck_assert(_al_bootstrap_owns(r));
    ck_assert_mem_eq(r, "rrrrrrrrrrrrrrrrrrrr", 20);
    ck_assert_int_eq(real[39], 'r');
    free(real);
}
END_TEST

START_TEST(mul_size_saturates)
{
    ck_assert_uint_eq(_al_mul_size(3, 5), 15);
    ck_assert_uint_eq(_al_mul_size(SIZE_MAX / 2, 3), SIZE_MAX);
    ck_assert_uint_eq(_al_mul_size(0, SIZE_MAX), 0);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("interpose");
    TCase *tc = tcase_create("interpose");
    tcase_add_test(tc, pool_serves_aligned_zeroed_memory);
    tcase_add_test(tc, pool_realloc_copies_into_real_memory);
    tcase_add_test_raise_signal(tc, pool_exhaustion_aborts_with_a_message, SIGABRT);
    tcase_add_test(tc, own_pool_honours_alignment);
    tcase_add_test(tc, own_pool_runs_out_without_abort);
    tcase_add_test(tc, own_realloc_never_reaches_the_allocator);
    tcase_add_test(tc, mul_size_saturates);
    suite_add_tcase(s, tc);
    return al_check_run(s);
}
