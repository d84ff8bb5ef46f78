/* profiler/pprof.c: writing a heap profile in pprof's profile.proto format, gzipped, as Go's
 * heap profiles are (sample types alloc_objects/count, alloc_space/bytes, inuse_objects/count,
 * inuse_space/bytes), so `go tool pprof` reads it, after the run. The profile's buffers come
 * from mmap and zlib gets mmap-backed allocation functions; the build ids are read with
 * libelf, which allocates (the report is written with the thread marked busy). */
#ifndef ALLOCLENS_PPROF_H
#define ALLOCLENS_PPROF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct al_pprof_mapping {
    uint64_t start, limit, offset;
    const char *file;
    const char *build_id;      /* hex, or NULL */
};

/* A function that the code at a frame's address was inlined into, with the line of that call. */
struct al_pprof_line {
    const char *function;      /* NULL when unknown: no Line is written for it */
    const char *file;
    int64_t line;
};

struct al_pprof_frame {
    uint64_t address;
    const char *function;      /* NULL when unknown; in inlined code, the innermost inlined one */
    const char *file;          /* NULL when unknown */
    int64_t line;              /* 0 when unknown */
    uint32_t mapping;          /* 1-based index into mappings; 0 when unknown */
    /* In inlined code, the functions FUNCTION was inlined into, out to the one the code was
     * compiled into: the Location's Lines after the frame's own, innermost first, as
     * profile.proto has them. */
    uint32_t ninlined;
    const struct al_pprof_line *inlined;
};

struct al_pprof_sample {
    uint32_t nframes;
    const struct al_pprof_frame *frames; /* leaf first */
    int64_t alloc_objects, alloc_space, inuse_objects, inuse_space;
};

struct al_pprof_profile {
    const struct al_pprof_mapping *mappings;
    uint32_t nmappings;
    const struct al_pprof_sample *samples;
    uint32_t nsamples;
    int64_t period;            /* the sampling rate in bytes */
    int64_t time_nanos, duration_nanos;
};

/* Opens zlib and libelf for the two below (once; whether they are there). Where a profile is
 * to be written, at start-up: opening them as the report is written could be from a signal
 * handler that interrupted the dynamic loader. */
bool _al_pprof_libs_open(void);

/* Writes P gzipped to PATH; 0, or a negative errno with a one-line reason in ERR. */
int _al_pprof_write(const char *path, const struct al_pprof_profile *p, char *err, size_t errcap);

/* The GNU build id of an ELF file, as hex; 0 or a negative errno. */
int _al_build_id(const char *file, char *hex, size_t cap);
/* The same of the loaded object whose segments hold ADDR, read from its notes in memory: no
 * file read, nothing allocated (libelf allocates, and the report that writes the profile may
 * come from exit() in a handler that interrupted the allocator); -ESRCH where no loaded
 * object holds ADDR. */
int _al_build_id_loaded(uintptr_t addr, char *hex, size_t cap);

#endif
