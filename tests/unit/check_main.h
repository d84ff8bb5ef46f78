/* The one main of every unit test: run the suite (CK_ENV: TAP output and verbosity from the
 * environment meson sets) and exit with its verdict. */
#ifndef ALLOCLENS_CHECK_MAIN_H
#define ALLOCLENS_CHECK_MAIN_H

#include <check.h>
#include <stdlib.h>

static inline int al_check_run(Suite *s)
{
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_ENV);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}

#endif
