/* config/: the description of an allocator that alloclens needs (style, size classes, large
 * threshold, page size), its text format, and the size -> class lookup the hot path uses.
 *
 * The format is documented in docs/config-format.md: a version line, comments, one key per
 * line. The parser is strict: the first malformed line is reported as FILE:LINE: what is
 * wrong, and the whole file is rejected. Nothing here allocates: callers own the storage.
 */
#ifndef ALLOCLENS_ALLOC_CONFIG_H
#define ALLOCLENS_ALLOC_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define AL_CONFIG_VERSION 1
#define AL_CONFIG_MAX_CLASSES 16384
#define AL_CONFIG_PATH_MAX 4096

enum al_style { AL_STYLE_BIBOP, AL_STYLE_SEQUENTIAL };

struct al_file_identity {
    uint64_t dev, ino, size;
    int64_t mtime_ns;
};

/* COUNT classes: FIRST, FIRST + STEP, ... (STEP 0 where COUNT is 1). */
struct al_class_run {
    uint64_t first, step;
    uint32_t count;
};

struct al_alloc_config {
    char allocator[AL_CONFIG_PATH_MAX];   /* library path the description is for */
    struct al_file_identity identity;     /* of that file when probed: a changed file is re-probed */
    enum al_style style;
    uint64_t page_size;
    uint64_t large_threshold;             /* smallest request served as a large object */
    char confidence[256];                 /* the probe's own account of how sure it is */
    uint32_t nclasses;
    /* The classes are also kept as runs, filled by the parser (a file's single classes joined
     * where they are evenly spaced): glibc's 8190 are one. RUNS_ONLY: classes[] is not
     * filled yet (_al_config_load_runs, until _al_config_expand). */
    bool runs_only;
    uint32_t nruns;
    uint64_t classes[AL_CONFIG_MAX_CLASSES]; /* ascending; the last covers large_threshold - 1 */
    struct al_class_run runs[AL_CONFIG_MAX_CLASSES];
};

/* The largest class of a config the parser filled. */
static inline uint64_t _al_config_last_class(const struct al_alloc_config *c)
{
    const struct al_class_run *r = &c->runs[c->nruns - 1];
    return r->first + (r->count - 1) * r->step;
}

/* Parses TEXT (LEN bytes, need not be NUL-terminated). 0 on success; otherwise -EINVAL with
 * "NAME:LINE: what is wrong" in ERR, and OUT left empty (no classes): a file is taken whole or
 * not at all. */
int _al_config_parse(const char *text, size_t len, const char *name, struct al_alloc_config *out,
                     char *err, size_t errcap);

/* Reads and parses a file; errors as above ("NAME: cannot read: ..." for I/O). */
int _al_config_load(const char *path, struct al_alloc_config *out, char *err, size_t errcap);
/* The same, the classes left as runs (classes[] not written): what a process that only
 * reports them needs, without writing glibc's 8190 into 16 fresh pages. */
int _al_config_load_runs(const char *path, struct al_alloc_config *out, char *err, size_t errcap);
/* Fills classes[] from the runs, where _al_config_load_runs left them out. */
void _al_config_expand(struct al_alloc_config *c);

/* Writes the text form into BUF (CAP bytes); returns the length, or -ENOSPC. */
long _al_config_format(const struct al_alloc_config *c, char *buf, size_t cap);

/* The identity of a file now (0), or -errno. */
int _al_config_identity(const char *path, struct al_file_identity *ret);
bool _al_config_identity_equal(const struct al_file_identity *a, const struct al_file_identity *b);
const char *_al_config_style_name(enum al_style s);

/* ---- cache.c: where a probed config is kept ----------------------------------------------- */

/* The cache file for the allocator library at ALLOCATOR_PATH (0), or -errno; XDG and HOME are
 * the values of XDG_CACHE_HOME and HOME (NULL: unset), as the caller reads its environment. */
int _al_config_cache_path(const char *allocator_path, const char *xdg, const char *home, char *out, size_t cap);
/* Loads the cache file PATH of that library into OUT, its classes as runs (as
 * _al_config_load_runs): 0 when it describes the library as it is now; -ENOENT (none),
 * -ESTALE (the library changed since), -EINVAL (broken: ERR says). */
int _al_config_cache_lookup(const char *allocator_path, const char *path, struct al_alloc_config *out,
                            char *err, size_t errcap);

/* ---- size_class.c: O(1) request size -> class size ---------------------------------------- */

/* Two linear tables: one for requests up to AL_CLASS_SPLIT bytes, one above, each with the
 * coarsest power-of-two granularity that divides every class boundary in its range. Classes
 * that are one run with a power-of-two step (glibc's 8190, 24..131048/16) need neither tables
 * nor the list of classes: a class's index and size are worked out. */
#define AL_CLASS_SPLIT 65536u

struct al_class_table {
    uint64_t threshold;
    unsigned shift_lo, shift_hi;
    uint32_t n_lo, n_hi;
    uint32_t *lo, *hi;          /* class index for each granule */
    const uint64_t *classes;    /* the config's classes[]; NULL for one run */
    bool one_run;               /* classes first, first + 2^step_shift, ... */
    unsigned step_shift;
    uint64_t first;
};

/* Whether config C's classes are one run the table works out without classes[] (so a loader
 * that only builds the table need not expand the runs). */
bool _al_class_table_one_run(const struct al_alloc_config *c);
/* Bytes the tables need for config C (so callers can provide them from their own memory); 0
 * for one run, which needs none, and for an invalid config. */
size_t _al_class_table_bytes(const struct al_alloc_config *c);
/* Builds the tables in MEM (of _al_class_table_bytes bytes; none for one run); 0 or -EINVAL. */
int _al_class_table_build(struct al_class_table *t, const struct al_alloc_config *c, void *mem);

/* The index of the class serving a small request of SIZE bytes (below the threshold). */
static inline uint32_t _al_class_index(const struct al_class_table *t, uint64_t size)
{
    if (size == 0)
        size = 1;
    if (t->one_run)
        return size <= t->first ? 0 : (uint32_t)((size - t->first + (1ull << t->step_shift) - 1) >> t->step_shift);
    return size <= AL_CLASS_SPLIT ? t->lo[(size - 1) >> t->shift_lo] : t->hi[(size - AL_CLASS_SPLIT - 1) >> t->shift_hi];
}

/* The size of class K. */
static inline uint64_t _al_class_size(const struct al_class_table *t, uint32_t k)
{
    return t->one_run ? t->first + ((uint64_t)k << t->step_shift) : t->classes[k];
}

/* The class size serving a request of SIZE bytes; 0 when SIZE is large. */
static inline uint64_t _al_class_of(const struct al_class_table *t, uint64_t size)
{
    if (size >= t->threshold)
        return 0;
    return _al_class_size(t, _al_class_index(t, size));
}

#endif
