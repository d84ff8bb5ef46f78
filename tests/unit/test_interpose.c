/* Unit tests of interpose/: the bootstrap pool that serves dlsym's allocations while the real
 * allocator is being resolved, and the table-generated forwarding targets' shape. The test
 * provides the resolved-function table itself, so only the pool is linked in, not the
 * exported wrappers. */
#include <check.h>

#include "check_main.h"
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
    for (int i = 0; i < 1000; i++)
        _al_bootstrap_alloc(1024);
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
    tcase_add_test(tc, mul_size_saturates);
    suite_add_tcase(s, tc);
    return al_check_run(s);
}
