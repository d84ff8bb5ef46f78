/* Unit tests of profiler/pprof.c: the gzipped profile.proto heap profile (gunzipped and decoded
 * here by a tiny protobuf reader, and read by `go tool pprof` when go is installed), that
 * writing it never calls malloc, and GNU build ids read from ELF files. */
#include <check.h>

#include "check_main.h"
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "pprof.h"

/* ---- the allocator, watched: pprof.c must not call it ----------------------------------- */

extern void *__libc_malloc(size_t);
extern void *__libc_calloc(size_t, size_t);
extern void *__libc_realloc(void *, size_t);
extern void __libc_free(void *);

static volatile int watching;
static volatile unsigned long alloc_calls;

#define EXPORTED __attribute__((visibility("default")))

EXPORTED void *malloc(size_t n)
{
    if (watching)
        alloc_calls++;
    return __libc_malloc(n);
}

EXPORTED void *calloc(size_t a, size_t b)
{
    if (watching)
        alloc_calls++;
    return __libc_calloc(a, b);
}

EXPORTED void *realloc(void *p, size_t n)
{
    if (watching)
        alloc_calls++;
    return __libc_realloc(p, n);
}

EXPORTED void free(void *p)
{
    if (watching && p)
        alloc_calls++;
    __libc_free(p);
}

/* The watch sees calls made from inside libc and zlib too (they go through the PLT). */
START_TEST(watch_sees_allocations)
{
    alloc_calls = 0;
    watching = 1;
    char *s = strdup("x");
    z_stream zs = { 0 };
    int zr = deflateInit2(&zs, 1, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY);
    if (zr == Z_OK)
        deflateEnd(&zs);
    free(s);
    watching = 0;
    ck_assert_int_eq(zr, Z_OK);
    ck_assert_uint_ge(alloc_calls, 4); /* strdup, free, zlib's own blocks and their frees */
}
END_TEST

static int write_watched(const char *path, const struct al_pprof_profile *p, char *err, size_t cap,
                         unsigned long *calls)
{
    /* Opened beforehand, as a process that writes a profile does at start-up: opening a
     * library allocates. */
    ck_assert(_al_pprof_libs_open());
    alloc_calls = 0;
    watching = 1;
    int r = _al_pprof_write(path, p, err, cap);
    watching = 0;
    *calls = alloc_calls;
    return r;
}

/* ---- reading it back ---------------------------------------------------------------------- */

/* Check records every passing ck_assert (a write to its pipe in fork mode): far too slow for
 * the million checks of decoding the large profile. REQUIRE only costs when it fails. */
#define REQUIRE(expr, ...)                                                          \
    do {                                                                            \
        if (!(expr))                                                                \
            ck_abort_msg("'" #expr "' failed" __VA_OPT__(": ") __VA_ARGS__);        \
    } while (0)

struct bytes {
    unsigned char *p;
    size_t n;
};

static struct bytes gunzip_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    REQUIRE(f != NULL, "cannot open %s", path);
    size_t cap = 1 << 16, n = 0;
    unsigned char *in = malloc(cap);
    size_t k;
    while ((k = fread(in + n, 1, cap - n, f)) > 0) {
        n += k;
        if (n == cap)
            in = realloc(in, cap *= 2);
    }
    fclose(f);
    ck_assert_uint_ge(n, 18);
    ck_assert_uint_eq(in[0], 0x1f); /* gzip magic */
    ck_assert_uint_eq(in[1], 0x8b);

    z_stream zs = { 0 };
    ck_assert_int_eq(inflateInit2(&zs, 15 + 16), Z_OK);
    struct bytes out = { malloc(1 << 16), 0 };
    size_t ocap = 1 << 16;
    zs.next_in = in;
    zs.avail_in = (uInt)n;
    int zr;
    do {
        if (out.n == ocap)
            out.p = realloc(out.p, ocap *= 2);
        zs.next_out = out.p + out.n;
        zs.avail_out = (uInt)(ocap - out.n);
        zr = inflate(&zs, Z_NO_FLUSH);
        REQUIRE(zr == Z_OK || zr == Z_STREAM_END, "inflate: %d", zr);
        out.n = ocap - zs.avail_out;
    } while (zr != Z_STREAM_END);
    ck_assert_uint_eq(zs.avail_in, 0); /* one gzip member, nothing after it */
    inflateEnd(&zs);
    free(in);
    return out;
}

/* A protobuf field: varint (wire type 0) or length-delimited (2); nothing else is expected. */
struct field {
    unsigned num, wire;
    uint64_t v;
    const unsigned char *p;
    size_t n;
};

static uint64_t get_varint(const unsigned char **p, const unsigned char *end)
{
    uint64_t v = 0;
    for (unsigned shift = 0;; shift += 7) {
        REQUIRE(*p < end, "truncated varint");
        REQUIRE(shift < 64);
        unsigned char c = *(*p)++;
        v |= (uint64_t)(c & 0x7f) << shift;
        if (!(c & 0x80))
            return v;
    }
}

static bool next_field(const unsigned char **p, const unsigned char *end, struct field *f)
{
    if (*p == end)
        return false;
    uint64_t key = get_varint(p, end);
    f->num = (unsigned)(key >> 3);
    f->wire = (unsigned)(key & 7);
    REQUIRE(f->num != 0);
    if (f->wire == 0) {
        f->v = get_varint(p, end);
    } else {
        REQUIRE(f->wire == 2, "field %u: unexpected wire type %u", f->num, f->wire);
        f->n = (size_t)get_varint(p, end);
        REQUIRE(f->n <= (size_t)(end - *p));
        f->p = *p;
        *p += f->n;
    }
    return true;
}

#define FOR_FIELDS(f, data, len)                                                    \
    for (const unsigned char *f##_p = (data), *f##_end = (data) + (len);           \
         next_field(&f##_p, f##_end, &(f));)

/* A packed repeated varint field, appended to an array. */
static void unpack(const struct field *f, uint64_t **arr, size_t *n)
{
    const unsigned char *p = f->p, *end = f->p + f->n;
    while (p < end) {
        *arr = realloc(*arr, (*n + 1) * sizeof **arr);
        (*arr)[(*n)++] = get_varint(&p, end);
    }
}

struct d_sample { uint64_t *loc; size_t nloc; uint64_t *val; size_t nval; };
struct d_mapping { uint64_t id, start, limit, offset, file, build_id, has_fn, has_file, has_line; };
struct d_location { uint64_t id, mapping, address, nlines, function, line; };
struct d_function { uint64_t id, name, system_name, file; };

struct decoded {
    uint64_t sample_type[8][2];
    size_t nsample_type;
    struct d_sample *samples;
    size_t nsamples;
    struct d_mapping *mappings;
    size_t nmappings;
    struct d_location *locations;
    size_t nlocations;
    struct d_function *functions;
    size_t nfunctions;
    char **strings;
    size_t nstrings;
    uint64_t time_nanos, duration_nanos, period, period_type[2], default_sample_type;
};

#define PUSH(arr, n) (arr = realloc(arr, ((n) + 1) * sizeof *(arr)), memset(&(arr)[n], 0, sizeof *(arr)), &(arr)[(n)++])

static void value_type(const struct field *f, uint64_t out[2])
{
    struct field g;
    FOR_FIELDS(g, f->p, f->n)
    {
        REQUIRE(g.wire == 0 && (g.num == 1 || g.num == 2));
        out[g.num - 1] = g.v;
    }
}

static struct decoded decode(struct bytes b)
{
    struct decoded d = { 0 };
    struct field f, g;
    FOR_FIELDS(f, b.p, b.n)
    {
        switch (f.num) {
        case 1:
            REQUIRE(d.nsample_type < 8);
            value_type(&f, d.sample_type[d.nsample_type++]);
            break;
        case 2: {
            struct d_sample *s = PUSH(d.samples, d.nsamples);
            FOR_FIELDS(g, f.p, f.n)
            {
                REQUIRE(g.wire == 2, "sample fields are packed");
                if (g.num == 1)
                    unpack(&g, &s->loc, &s->nloc);
                else if (g.num == 2)
                    unpack(&g, &s->val, &s->nval);
                else
                    ck_abort_msg("unexpected Sample field %u", g.num);
            }
            break;
        }
        case 3: {
            struct d_mapping *m = PUSH(d.mappings, d.nmappings);
            FOR_FIELDS(g, f.p, f.n)
            {
                REQUIRE(g.wire == 0 && g.num >= 1 && g.num <= 9);
                uint64_t *slot[] = { &m->id, &m->start, &m->limit, &m->offset, &m->file,
                                     &m->build_id, &m->has_fn, &m->has_file, &m->has_line };
                *slot[g.num - 1] = g.v;
            }
            break;
        }
        case 4: {
            struct d_location *l = PUSH(d.locations, d.nlocations);
            FOR_FIELDS(g, f.p, f.n)
            {
                if (g.num == 4) {
                    l->nlines++;
                    struct field h;
                    FOR_FIELDS(h, g.p, g.n)
                    {
                        REQUIRE(h.wire == 0 && (h.num == 1 || h.num == 2));
                        if (h.num == 1)
                            l->function = h.v;
                        else
                            l->line = h.v;
                    }
                    continue;
                }
                REQUIRE(g.wire == 0 && g.num >= 1 && g.num <= 3);
                uint64_t *slot[] = { &l->id, &l->mapping, &l->address };
                *slot[g.num - 1] = g.v;
            }
            break;
        }
        case 5: {
            struct d_function *fn = PUSH(d.functions, d.nfunctions);
            FOR_FIELDS(g, f.p, f.n)
            {
                REQUIRE(g.wire == 0 && g.num >= 1 && g.num <= 4);
                uint64_t *slot[] = { &fn->id, &fn->name, &fn->system_name, &fn->file };
                *slot[g.num - 1] = g.v;
            }
            break;
        }
        case 6: {
            REQUIRE(f.wire == 2);
            char **s = PUSH(d.strings, d.nstrings);
            *s = strndup((const char *)f.p, f.n);
            break;
        }
        case 9: d.time_nanos = f.v; break;
        case 10: d.duration_nanos = f.v; break;
        case 11: value_type(&f, d.period_type); break;
        case 12: d.period = f.v; break;
        case 14: d.default_sample_type = f.v; break;
        default: ck_abort_msg("unexpected Profile field %u", f.num);
        }
    }
    return d;
}

static const char *str(const struct decoded *d, uint64_t i)
{
    REQUIRE(i < d->nstrings);
    return d->strings[i];
}

static const struct d_location *location(const struct decoded *d, uint64_t id)
{
    REQUIRE(id >= 1);
    REQUIRE(id <= d->nlocations);
    REQUIRE(d->locations[id - 1].id == id);
    return &d->locations[id - 1];
}

static const struct d_function *function(const struct decoded *d, uint64_t id)
{
    REQUIRE(id >= 1);
    REQUIRE(id <= d->nfunctions);
    REQUIRE(d->functions[id - 1].id == id);
    return &d->functions[id - 1];
}

/* The function name at a location, or NULL. */
static const char *location_name(const struct decoded *d, uint64_t id)
{
    const struct d_location *l = location(d, id);
    return l->nlines ? str(d, function(d, l->function)->name) : NULL;
}

static void check_well_formed(const struct decoded *d)
{
    REQUIRE(d->nstrings >= 1);
    ck_assert_str_eq(d->strings[0], "");
    for (size_t i = 0; i < d->nstrings; i++)
        for (size_t j = i + 1; j < d->nstrings; j++)
            REQUIRE(strcmp(d->strings[i], d->strings[j]) != 0, "string '%s' twice", d->strings[i]);
    const char *types[4][2] = { { "alloc_objects", "count" }, { "alloc_space", "bytes" },
                                { "inuse_objects", "count" }, { "inuse_space", "bytes" } };
    REQUIRE(d->nsample_type == 4);
    for (int i = 0; i < 4; i++) {
        ck_assert_str_eq(str(d, d->sample_type[i][0]), types[i][0]);
        ck_assert_str_eq(str(d, d->sample_type[i][1]), types[i][1]);
    }
    ck_assert_str_eq(str(d, d->period_type[0]), "space");
    ck_assert_str_eq(str(d, d->period_type[1]), "bytes");
    for (size_t i = 0; i < d->nmappings; i++)
        REQUIRE(d->mappings[i].id == i + 1);
    for (size_t i = 0; i < d->nlocations; i++) {
        const struct d_location *l = location(d, i + 1);
        REQUIRE(l->mapping <= d->nmappings);
        REQUIRE(l->nlines <= 1);
        if (l->nlines)
            function(d, l->function);
        for (size_t j = 0; j < i; j++)
            REQUIRE(d->locations[j].address != l->address || d->locations[j].mapping != l->mapping);
    }
    for (size_t i = 0; i < d->nfunctions; i++) {
        const struct d_function *f = function(d, i + 1);
        REQUIRE(f->name != 0);
        REQUIRE(f->system_name == f->name);
        for (size_t j = 0; j < i; j++)
            REQUIRE(d->functions[j].name != f->name || d->functions[j].file != f->file);
    }
    for (size_t i = 0; i < d->nsamples; i++) {
        REQUIRE(d->samples[i].nval == 4);
        for (size_t j = 0; j < d->samples[i].nloc; j++)
            location(d, d->samples[i].loc[j]);
    }
}

static void decoded_free(struct decoded *d)
{
    for (size_t i = 0; i < d->nsamples; i++) {
        free(d->samples[i].loc);
        free(d->samples[i].val);
    }
    for (size_t i = 0; i < d->nstrings; i++)
        free(d->strings[i]);
    free(d->samples);
    free(d->mappings);
    free(d->locations);
    free(d->functions);
    free(d->strings);
}

/* ---- the small profile -------------------------------------------------------------------- */

static char tmpdir[] = "/tmp/alloclens-pprof-XXXXXX";
static char true_build_id[128];

enum { M_TRUE = 1, M_LIB = 2 };

static const struct al_pprof_frame f_main = { 0x401000, "main", "main.c", 10, M_TRUE, 0, NULL };
static const struct al_pprof_frame f_make = { 0x401100, "make_buffer", "buf.c", 42, M_TRUE, 0, NULL };
static const struct al_pprof_frame f_lib_anon = { 0x7f0000001234, NULL, NULL, 0, M_LIB, 0, NULL };
static const struct al_pprof_frame f_lib_helper = { 0x7f0000002000, "lib_helper", NULL, 0, M_LIB, 0, NULL };
static const struct al_pprof_frame f_unknown = { 0xdead0, NULL, NULL, 0, 0, 0, NULL };

static struct al_pprof_frame s1[2], s2[3], s3[3];
static struct al_pprof_mapping maps[2];
static struct al_pprof_sample samples[3];
static struct al_pprof_profile small_profile;

static void make_small(void)
{
    ck_assert_int_eq(_al_build_id("/bin/true", true_build_id, sizeof true_build_id), 0);
    maps[0] = (struct al_pprof_mapping){ 0x400000, 0x500000, 0, "/bin/true", true_build_id };
    maps[1] = (struct al_pprof_mapping){ 0x7f0000000000, 0x7f0000100000, 0x1000,
                                         "/nonexistent/libfoo.so", NULL };
    s1[0] = f_make, s1[1] = f_main;
    s2[0] = f_lib_anon, s2[1] = f_lib_helper, s2[2] = f_main;
    s3[0] = f_unknown, s3[1] = f_make, s3[2] = f_main;
    samples[0] = (struct al_pprof_sample){ 2, s1, 2, 2048, 1, 1024 };
    samples[1] = (struct al_pprof_sample){ 3, s2, 4, 8192, 4, 8192 };
    samples[2] = (struct al_pprof_sample){ 3, s3, 1, 512, 0, 0 };
    small_profile = (struct al_pprof_profile){
        .mappings = maps, .nmappings = 2, .samples = samples, .nsamples = 3,
        .period = 524288, .time_nanos = 1700000000123456789ll, .duration_nanos = 2500000000ll,
    };
}

static void setup(void)
{
    strcpy(tmpdir, "/tmp/alloclens-pprof-XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(tmpdir));
}

static void teardown(void)
{
    char cmd[256];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    if (system(cmd) != 0)
        fprintf(stderr, "cannot remove %s\n", tmpdir);
}

static void small_path(char *path, size_t cap)
{
    snprintf(path, cap, "%s/heap.pb.gz", tmpdir);
}

static void write_small(char *path, size_t cap)
{
    make_small();
    small_path(path, cap);
    char err[256] = "x";
    unsigned long calls;
    ck_assert_int_eq(write_watched(path, &small_profile, err, sizeof err, &calls), 0);
    ck_assert_str_eq(err, "");
    ck_assert_uint_eq(calls, 0);
}

START_TEST(small_profile_decodes)
{
    char path[512];
    write_small(path, sizeof path);
    struct bytes b = gunzip_file(path);
    struct decoded d = decode(b);
    check_well_formed(&d);

    ck_assert_uint_eq(d.period, 524288);
    ck_assert_uint_eq(d.time_nanos, 1700000000123456789ull);
    ck_assert_uint_eq(d.duration_nanos, 2500000000ull);

    /* Mappings: the build id of /bin/true; what every location of each one carries. */
    ck_assert_uint_eq(d.nmappings, 2);
    const struct d_mapping *m = &d.mappings[0];
    ck_assert_uint_eq(m->start, 0x400000);
    ck_assert_uint_eq(m->limit, 0x500000);
    ck_assert_uint_eq(m->offset, 0);
    ck_assert_str_eq(str(&d, m->file), "/bin/true");
    ck_assert_str_eq(str(&d, m->build_id), true_build_id);
    ck_assert(m->has_fn && m->has_file && m->has_line);
    m = &d.mappings[1];
    ck_assert_uint_eq(m->start, 0x7f0000000000);
    ck_assert_uint_eq(m->limit, 0x7f0000100000);
    ck_assert_uint_eq(m->offset, 0x1000);
    ck_assert_str_eq(str(&d, m->file), "/nonexistent/libfoo.so");
    ck_assert_uint_eq(m->build_id, 0);
    ck_assert(!m->has_fn && !m->has_file && !m->has_line); /* one frame without a name */

    /* Five distinct (address, mapping): main and make_buffer appear in several samples. */
    ck_assert_uint_eq(d.nlocations, 5);
    ck_assert_uint_eq(d.nfunctions, 3);

    uint64_t want[3][4] = { { 2, 2048, 1, 1024 }, { 4, 8192, 4, 8192 }, { 1, 512, 0, 0 } };
    const struct al_pprof_frame *frames[3] = { s1, s2, s3 };
    ck_assert_uint_eq(d.nsamples, 3);
    for (int i = 0; i < 3; i++) {
        const struct d_sample *s = &d.samples[i];
        for (int k = 0; k < 4; k++)
            ck_assert_uint_eq(s->val[k], want[i][k]);
        ck_assert_uint_eq(s->nloc, samples[i].nframes);
        for (size_t j = 0; j < s->nloc; j++) { /* leaf first, as given */
            const struct al_pprof_frame *f = &frames[i][j];
            const struct d_location *l = location(&d, s->loc[j]);
            ck_assert_uint_eq(l->address, f->address);
            ck_assert_uint_eq(l->mapping, f->mapping);
            const char *name = location_name(&d, s->loc[j]);
            if (!f->function) {
                ck_assert_ptr_null(name);
                continue;
            }
            ck_assert_str_eq(name, f->function);
            const struct d_function *fn = function(&d, l->function);
            ck_assert_str_eq(str(&d, fn->file), f->file ? f->file : "");
            ck_assert_uint_eq(l->line, (uint64_t)f->line);
        }
    }
    /* The same frame in two samples is the same location. */
    ck_assert_uint_eq(d.samples[0].loc[1], d.samples[1].loc[2]);
    ck_assert_uint_eq(d.samples[0].loc[0], d.samples[2].loc[1]);

    decoded_free(&d);
    free(b.p);
}
END_TEST

/* Many samples over many frames: the tables and buffers grow past their first size. */
START_TEST(large_profile_decodes)
{
    enum { NSAMPLES = 20000, NADDR = 6000, MAXDEPTH = 12 };
    static char names[NADDR][24];
    static struct al_pprof_frame pool[NADDR];
    struct al_pprof_mapping m[2] = { { 0x10000, 0x20000000, 0, "/usr/bin/big", "00ff" },
                                     { 0x7f0000000000, 0x7f1000000000, 0, "/lib/x.so", NULL } };
    for (int i = 0; i < NADDR; i++) {
        snprintf(names[i], sizeof names[i], "fn_%d", i / 2); /* two addresses per function */
        pool[i] = (struct al_pprof_frame){ 0x10000 + 16 * (uint64_t)i, i % 7 ? names[i] : NULL,
                                           i % 3 ? "big.c" : NULL, i % 5 ? i : 0, (uint32_t)(i % 3), 0, NULL };
    }
    struct al_pprof_frame *frames = calloc((size_t)NSAMPLES * MAXDEPTH, sizeof *frames);
    struct al_pprof_sample *ss = calloc(NSAMPLES, sizeof *ss);
    uint64_t x = 88172645463325252ull, tot[4] = { 0 };
    static bool used[NADDR];
    for (int i = 0; i < NSAMPLES; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        uint32_t depth = 1 + (uint32_t)(x % MAXDEPTH);
        for (uint32_t j = 0; j < depth; j++) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            uint32_t a = (uint32_t)(x % NADDR);
            frames[(size_t)i * MAXDEPTH + j] = pool[a];
            used[a] = true;
        }
        ss[i] = (struct al_pprof_sample){ depth, &frames[(size_t)i * MAXDEPTH], 1, 100 + i, i & 1, (i & 1) * (100 + i) };
        tot[0] += 1, tot[1] += 100 + (uint64_t)i, tot[2] += i & 1, tot[3] += (i & 1) * (100 + (uint64_t)i);
    }
    struct al_pprof_profile p = { .mappings = m, .nmappings = 2, .samples = ss, .nsamples = NSAMPLES,
                                  .period = 1, .time_nanos = 1, .duration_nanos = 0 };
    char path[512], err[256];
    snprintf(path, sizeof path, "%s/big.pb.gz", tmpdir);
    unsigned long calls;
    ck_assert_int_eq(write_watched(path, &p, err, sizeof err, &calls), 0);
    ck_assert_uint_eq(calls, 0);

    struct bytes b = gunzip_file(path);
    struct decoded d = decode(b);
    ck_assert_uint_eq(d.nsamples, NSAMPLES);
    /* Functions are (name, file) pairs: the two addresses of fn_k may differ in file. */
    size_t nused = 0, nfn = 0;
    static bool fn_used[NADDR / 2][2];
    for (int i = 0; i < NADDR; i++) {
        nused += used[i];
        if (used[i] && pool[i].function && !fn_used[i / 2][pool[i].file != NULL]) {
            fn_used[i / 2][pool[i].file != NULL] = true;
            nfn++;
        }
    }
    ck_assert_uint_eq(d.nlocations, nused);
    ck_assert_uint_eq(d.nfunctions, nfn);
    check_well_formed(&d);
    uint64_t got[4] = { 0 };
    for (size_t i = 0; i < d.nsamples; i++) {
        REQUIRE(d.samples[i].nloc == ss[i].nframes, "sample %zu", i);
        for (size_t j = 0; j < d.samples[i].nloc; j++) {
            const struct al_pprof_frame *f = &ss[i].frames[j];
            const struct d_location *l = location(&d, d.samples[i].loc[j]);
            REQUIRE(l->address == f->address && l->mapping == f->mapping, "sample %zu frame %zu", i, j);
            const char *name = location_name(&d, d.samples[i].loc[j]);
            REQUIRE(f->function ? name && strcmp(name, f->function) == 0 : !name, "sample %zu frame %zu", i, j);
        }
        for (int k = 0; k < 4; k++)
            got[k] += d.samples[i].val[k];
    }
    for (int k = 0; k < 4; k++)
        ck_assert_uint_eq(got[k], tot[k]);
    /* Neither mapping has every location named (every 7th has no name). */
    ck_assert(!d.mappings[0].has_fn && !d.mappings[1].has_fn);
    ck_assert_str_eq(str(&d, d.mappings[0].build_id), "00ff");
    decoded_free(&d);
    free(b.p);
    free(frames);
    free(ss);
}
END_TEST

START_TEST(empty_profile_and_bad_paths)
{
    struct al_pprof_profile p = { .period = 512 };
    char path[512], err[256];
    unsigned long calls;
    snprintf(path, sizeof path, "%s/empty.pb.gz", tmpdir);
    ck_assert_int_eq(write_watched(path, &p, err, sizeof err, &calls), 0);
    ck_assert_uint_eq(calls, 0);
    struct bytes b = gunzip_file(path);
    struct decoded d = decode(b);
    check_well_formed(&d);
    ck_assert_uint_eq(d.nsamples, 0);
    decoded_free(&d);
    free(b.p);

    /* A directory that does not exist: -ENOENT, and the path and reason in err. */
    snprintf(path, sizeof path, "%s/no/such/dir/heap.pb.gz", tmpdir);
    make_small();
    ck_assert_int_eq(write_watched(path, &small_profile, err, sizeof err, &calls), -ENOENT);
    ck_assert_uint_eq(calls, 0);
    char want[600];
    snprintf(want, sizeof want, "cannot write %s: %s", path, strerror(ENOENT));
    ck_assert_str_eq(err, want);

    /* A directory in the way. */
    ck_assert_int_eq(_al_pprof_write(tmpdir, &small_profile, err, sizeof err), -EISDIR);
    ck_assert(strncmp(err, "cannot write ", 13) == 0);

    /* A full disk: what write() said; the device that was there before stays. */
    struct stat st;
    if (access("/dev/full", W_OK) == 0) {
        ck_assert_int_eq(_al_pprof_write("/dev/full", &small_profile, err, sizeof err), -ENOSPC);
        ck_assert_str_eq(err, "cannot write /dev/full: No space left on device");
        ck_assert_int_eq(stat("/dev/full", &st), 0);
        ck_assert(S_ISCHR(st.st_mode));
    }

    /* A file that was there before is rewritten. */
    snprintf(path, sizeof path, "%s/old.pb.gz", tmpdir);
    FILE *f = fopen(path, "w");
    ck_assert_ptr_nonnull(f);
    fputs("an old profile, much longer than nothing", f);
    fclose(f);
    ck_assert_int_eq(_al_pprof_write(path, &small_profile, err, sizeof err), 0);
    b = gunzip_file(path);
    d = decode(b);
    ck_assert_uint_eq(d.nsamples, 3);
    decoded_free(&d);
    free(b.p);

    /* A small err buffer is cut, not overrun. */
    char tiny[8];
    memset(tiny, 'x', sizeof tiny);
    ck_assert_int_lt(_al_pprof_write("/no/such/dir/x", &small_profile, tiny, sizeof tiny), 0);
    ck_assert_str_eq(tiny, "cannot ");
}
END_TEST

/* ---- go tool pprof, when go is installed -------------------------------------------------- */

static char *run(const char *cmd)
{
    FILE *f = popen(cmd, "r");
    ck_assert_msg(f != NULL, "cannot run %s", cmd);
    size_t cap = 4096, n = 0, k;
    char *out = malloc(cap);
    while ((k = fread(out + n, 1, cap - n - 1, f)) > 0) {
        n += k;
        if (n + 1 == cap)
            out = realloc(out, cap *= 2);
    }
    out[n] = '\0';
    int st = pclose(f);
    ck_assert_msg(st == 0, "%s: exit status %d:\n%s", cmd, st, out);
    return out;
}

static bool have_go(void)
{
    if (system("command -v go >/dev/null 2>&1") == 0)
        return true;
    fprintf(stderr, "# go is not installed: not checking with go tool pprof\n");
    return false;
}

static char *go_pprof(const char *opts, const char *path)
{
    char cmd[1024];
    /* -symbolize=none: libfoo.so does not exist; the names are in the profile. */
    snprintf(cmd, sizeof cmd, "go tool pprof -symbolize=none %s '%s' 2>&1", opts, path);
    return run(cmd);
}

/* The line of a -top listing that ends in NAME; its flat and cum columns. */
static bool top_line(const char *top, const char *name, char *flat, char *cum)
{
    for (const char *l = top; *l; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : l + strlen(l)) {
        char f[64], fp[16], sp[16], c[64], cp[16], n[256];
        if (sscanf(l, "%63s %15s %15s %63s %15s %255s", f, fp, sp, c, cp, n) == 6 && strcmp(n, name) == 0) {
            strcpy(flat, f);
            strcpy(cum, c);
            return true;
        }
    }
    return false;
}

START_TEST(go_tool_pprof_reads_it)
{
    if (!have_go())
        return;
    char path[512];
    write_small(path, sizeof path);
    char *out, flat[64], cum[64];

    /* -raw: the sample types and every sample's values and stack. */
    out = go_pprof("-raw", path);
    ck_assert_msg(strstr(out, "alloc_objects/count alloc_space/bytes inuse_objects/count inuse_space/bytes"), "%s", out);
    ck_assert_msg(strstr(out, "2       2048          1       1024"), "%s", out);
    ck_assert_msg(strstr(out, "4       8192          4       8192"), "%s", out);
    ck_assert_msg(strstr(out, "1        512          0          0"), "%s", out);
    ck_assert_msg(strstr(out, "make_buffer buf.c:42"), "%s", out);
    ck_assert_msg(strstr(out, "lib_helper"), "%s", out);
    ck_assert_msg(strstr(out, true_build_id), "%s", out);
    free(out);

    /* inuse_space (the default, the last sample type): 9216 bytes in all. */
    out = go_pprof("-top -unit=B", path);
    ck_assert_msg(strstr(out, "Type: inuse_space"), "%s", out);
    ck_assert_msg(strstr(out, "of 9216B total"), "%s", out);
    ck_assert_msg(top_line(out, "main", flat, cum), "%s", out);
    ck_assert_str_eq(cum, "9216B");
    free(out);

    out = go_pprof("-top -unit=B -sample_index=alloc_space", path);
    ck_assert_msg(strstr(out, "Type: alloc_space"), "%s", out);
    ck_assert_msg(strstr(out, "of 10752B total"), "%s", out);
    ck_assert_msg(top_line(out, "make_buffer", flat, cum), "%s", out);
    ck_assert_str_eq(flat, "2048B");
    ck_assert_str_eq(cum, "2560B");
    ck_assert_msg(top_line(out, "main", flat, cum), "%s", out);
    ck_assert_str_eq(cum, "10752B");
    free(out);

    out = go_pprof("-top -sample_index=alloc_objects", path);
    ck_assert_msg(strstr(out, "Type: alloc_objects"), "%s", out);
    ck_assert_msg(strstr(out, "of 7 total"), "%s", out);
    ck_assert_msg(top_line(out, "lib_helper", flat, cum), "%s", out);
    ck_assert_str_eq(flat, "0");
    ck_assert_str_eq(cum, "4");
    free(out);
}
END_TEST

/* ---- build ids ---------------------------------------------------------------------------- */

static bool is_hex(const char *s, size_t n)
{
    if (strlen(s) != n)
        return false;
    for (size_t i = 0; i < n; i++)
        if (!strchr("0123456789abcdef", s[i]))
            return false;
    return true;
}

static void write_bytes(const char *path, const void *data, size_t n)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(write(fd, data, n), (ssize_t)n);
    close(fd);
}

START_TEST(build_ids)
{
    char hex[128];
    ck_assert_int_eq(_al_build_id("/bin/true", hex, sizeof hex), 0);
    ck_assert_msg(is_hex(hex, 40), "'%s'", hex); /* SHA-1, as Debian's toolchain makes them */

    /* The test binary itself, and cross-checked against file(1) when it is there. */
    char self[128];
    ck_assert_int_eq(_al_build_id("/proc/self/exe", self, sizeof self), 0);
    ck_assert_msg(is_hex(self, strlen(self)) && strlen(self) >= 16, "'%s'", self);
    if (system("command -v file >/dev/null 2>&1") == 0) {
        char *out = run("file -L /bin/true");
        ck_assert_msg(strstr(out, hex), "file says %s, we say %s", out, hex);
        free(out);
    }

    /* Too small a buffer. */
    char small[40];
    ck_assert_int_eq(_al_build_id("/bin/true", small, sizeof small), -ERANGE);
    ck_assert_str_eq(small, "");

    char path[512];
    snprintf(path, sizeof path, "%s/not-elf", tmpdir);
    write_bytes(path, "#!/bin/sh\necho this is not an ELF file at all\n", 47);
    ck_assert_int_eq(_al_build_id(path, hex, sizeof hex), -ENOEXEC);

    snprintf(path, sizeof path, "%s/empty", tmpdir);
    write_bytes(path, "", 0);
    ck_assert_int_lt(_al_build_id(path, hex, sizeof hex), 0);

    ck_assert_int_eq(_al_build_id("/no/such/file", hex, sizeof hex), -ENOENT);
    ck_assert_int_lt(_al_build_id(tmpdir, hex, sizeof hex), 0);

    /* An ELF header with no program or section headers: no build id. */
    unsigned char ehdr[64] = { 0x7f, 'E', 'L', 'F', 2, 1, 1 };
    snprintf(path, sizeof path, "%s/bare.elf", tmpdir);
    write_bytes(path, ehdr, sizeof ehdr);
    ck_assert_int_eq(_al_build_id(path, hex, sizeof hex), -ENOENT);

    /* A truncated copy of /bin/true (headers point past the end): an error, not a crash. */
    unsigned char head[300];
    FILE *f = fopen("/bin/true", "rb");
    ck_assert_ptr_nonnull(f);
    ck_assert_uint_eq(fread(head, 1, sizeof head, f), sizeof head);
    fclose(f);
    snprintf(path, sizeof path, "%s/cut.elf", tmpdir);
    write_bytes(path, head, sizeof head);
    ck_assert_int_lt(_al_build_id(path, hex, sizeof hex), 0);
}
END_TEST

/* The loaded objects' ids, read in memory: the same as their files', and with no allocation
 * (the report may be made where the allocator must not be called). */
START_TEST(build_ids_loaded)
{
    char file[128], mem[128];
    ck_assert_int_eq(_al_build_id("/proc/self/exe", file, sizeof file), 0);
    alloc_calls = 0;
    watching = 1;
    int r = _al_build_id_loaded((uintptr_t)&build_ids_loaded, mem, sizeof mem);
    watching = 0;
    ck_assert_int_eq(r, 0);
    ck_assert_str_eq(mem, file);
    ck_assert_uint_eq(alloc_calls, 0);

    Dl_info info;
    ck_assert(dladdr((void *)&strlen, &info) && info.dli_fname);
    ck_assert_int_eq(_al_build_id(info.dli_fname, file, sizeof file), 0);
    ck_assert_int_eq(_al_build_id_loaded((uintptr_t)info.dli_fbase + 4096 * 4, mem, sizeof mem), 0);
    ck_assert_str_eq(mem, file);

    ck_assert_int_eq(_al_build_id_loaded(16, mem, sizeof mem), -ESRCH);
    char small[8];
    ck_assert_int_eq(_al_build_id_loaded((uintptr_t)&build_ids_loaded, small, sizeof small), -ERANGE);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("pprof");
    TCase *tc = tcase_create("pprof");
    tcase_set_timeout(tc, 60);
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, watch_sees_allocations);
    tcase_add_test(tc, small_profile_decodes);
    tcase_add_test(tc, large_profile_decodes);
    tcase_add_test(tc, empty_profile_and_bad_paths);
    tcase_add_test(tc, go_tool_pprof_reads_it);
    tcase_add_test(tc, build_ids);
    tcase_add_test(tc, build_ids_loaded);
    suite_add_tcase(s, tc);
    return al_check_run(s);
}
