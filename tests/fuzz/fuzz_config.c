/* libFuzzer target for the allocator-description parser (config/alloc_config.c) and the size ->
 * class table (config/size_class.c). Every input goes through check_config_input (see
 * config_checks.h); a failed check aborts, so libFuzzer keeps the input as a crash. See README.md. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "config_checks.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char why[1024];
    if (check_config_input(data, size, why, sizeof why) < 0) {
        fprintf(stderr, "fuzz_config: %s\n", why);
        abort();
    }
    return 0;
}
