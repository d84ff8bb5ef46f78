/* prerun/: the pre-run probe. alloclens-probe runs under an allocator (and under our tracer,
 * which counts the memory-mapping syscalls the allocator makes) and finds its style, size
 * classes and large-object threshold by experiment; the runner here starts it, collects its
 * config and keeps the cache that `alloclens run` uses. */
#ifndef ALLOCLENS_PRERUN_H
#define ALLOCLENS_PRERUN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "alloc_config.h"

/* The page the tracer shares with the probe: mmaps seen so far, and the bytes mapped and
 * unmapped. The tracer updates it while the probe is stopped at the syscall's exit, so the
 * probe reads exact numbers right after each call it makes. */
struct al_probe_counters {
    uint64_t magic;
    uint64_t mmaps;
    uint64_t mmap_bytes, munmap_bytes;
    uint64_t traced; /* 1 while a tracer is attached */
};

#define AL_PROBE_MAGIC 0x616c6c6f636c656eull
#define AL_PROBE_FD_ENV "ALLOCLENS_PROBE_FD"

/* runner.c: runs the probe under ALLOCATOR_PATH; OUT receives the config. VERBOSE echoes the
 * probe's own summary on stderr. 0, or a negative errno with a one-line reason in ERR. */
int _al_prerun_probe(const char *allocator_path, const char *probe_exe, struct al_alloc_config *out,
                     bool verbose, char *err, size_t errcap);

/* cache.c: writes C to PATH (making its directories with MAKE_PARENTS: the cache's); 0, or
 * -errno with a line in ERR. */
int _al_prerun_write_config(const char *path, const struct al_alloc_config *c, bool make_parents, char *err,
                            size_t errcap);
/* The file a user's PATH names, in TARGET: PATH itself, or the file a symbolic link names;
 * refused (-errno, a line in ERR) where PATH is there but no regular file. */
int _al_prerun_output_target(const char *path, char *target, size_t cap, char *err, size_t errcap);

#endif
