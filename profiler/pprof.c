/* A heap profile in pprof's profile.proto format (github.com/google/pprof/proto/profile.proto),
 * gzipped, laid out as Go's heap profiles are so `go tool pprof` reads it.
 *
 * This runs inside the profiled process, in front of the allocator being measured: the encoder
 * calls no malloc (build ids are read from the loaded objects' notes in memory; elfutils, which
 * allocates, only reads a file some code mapped executable by hand). The message is encoded by
 * hand into mmap'd buffers (struct al_buf), strings, functions and locations are deduplicated
 * through open-addressing tables in mmap'd memory, and zlib allocates from an mmap'd bump
 * region given back at the end. Stack use stays small (the
 * report may be written on a PTHREAD_STACK_MIN stack).
 *
 * zlib and libelf are opened (_al_pprof_libs_open) only in a process that writes a profile,
 * and there at start-up, not when the report is written (which may be from a signal that
 * interrupted the dynamic loader): linked, they would be loaded into every profiled process. */
#include <dlfcn.h>
#include <gelf.h>
#include <errno.h>
#include <fcntl.h>
#include <link.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "pprof.h"
#include "profiler.h"

/* ---- protobuf encoding -------------------------------------------------------------------- */

enum { PB_VARINT = 0, PB_LEN = 2 };

/* profile.proto field numbers. */
enum {
    PROFILE_SAMPLE_TYPE = 1, PROFILE_SAMPLE = 2, PROFILE_MAPPING = 3, PROFILE_LOCATION = 4,
    PROFILE_FUNCTION = 5, PROFILE_STRING_TABLE = 6, PROFILE_TIME_NANOS = 9,
    PROFILE_DURATION_NANOS = 10, PROFILE_PERIOD_TYPE = 11, PROFILE_PERIOD = 12,
};
enum { VALUETYPE_TYPE = 1, VALUETYPE_UNIT = 2 };
enum { SAMPLE_LOCATION_ID = 1, SAMPLE_VALUE = 2 };
enum {
    MAPPING_ID = 1, MAPPING_MEMORY_START = 2, MAPPING_MEMORY_LIMIT = 3, MAPPING_FILE_OFFSET = 4,
    MAPPING_FILENAME = 5, MAPPING_BUILD_ID = 6, MAPPING_HAS_FUNCTIONS = 7,
    MAPPING_HAS_FILENAMES = 8, MAPPING_HAS_LINE_NUMBERS = 9,
};
enum { LOCATION_ID = 1, LOCATION_MAPPING_ID = 2, LOCATION_ADDRESS = 3, LOCATION_LINE = 4 };
enum { LINE_FUNCTION_ID = 1, LINE_LINE = 2 };
enum { FUNCTION_ID = 1, FUNCTION_NAME = 2, FUNCTION_SYSTEM_NAME = 3, FUNCTION_FILENAME = 4 };

static void pb_varint(struct al_buf *b, uint64_t v)
{
    unsigned char tmp[10];
    size_t n = 0;
    while (v >= 0x80) {
        tmp[n++] = (unsigned char)(v | 0x80);
        v >>= 7;
    }
    tmp[n++] = (unsigned char)v;
    _al_buf_putn(b, (const char *)tmp, n);
}

static void pb_tag(struct al_buf *b, unsigned field, unsigned wire)
{
    pb_varint(b, (uint64_t)field << 3 | wire);
}

/* A scalar field; zero is proto3's default and is left out. int64 values are written as their
 * two's-complement uint64, as protobuf does. */
static void pb_uint(struct al_buf *b, unsigned field, uint64_t v)
{
    if (v == 0)
        return;
    pb_tag(b, field, PB_VARINT);
    pb_varint(b, v);
}

static void pb_bytes(struct al_buf *b, unsigned field, const void *data, size_t n)
{
    pb_tag(b, field, PB_LEN);
    pb_varint(b, n);
    if (n)
        _al_buf_putn(b, data, n);
}

/* An embedded message (or a packed repeated field) built in M. */
static void pb_sub(struct al_buf *b, unsigned field, const struct al_buf *m)
{
    pb_bytes(b, field, m->data, m->len);
}

/* ---- mmap'd arrays and hash tables -------------------------------------------------------- */

/* Arrays of fixed-size records are kept in an al_buf (it grows by mmap). */
#define ARR_AT(buf, type, i) (((type *)(void *)(buf).data)[i])
#define ARR_LEN(buf, type) ((buf).len / sizeof(type))

/* Open addressing, linear probing, kept at most half full. A slot's v is the entry's index + 1
 * (0: empty); k1/k2 are its key, h its hash. Strings hash their bytes and keep their length in
 * k2; the bytes are compared against the string array on a hash match. */
struct slot {
    uint64_t h, k1, k2;
    uint64_t v;
};

struct table {
    struct slot *s;
    size_t cap, n;
    bool failed;
};

static uint64_t hash_pair(uint64_t a, uint64_t b)
{
    return _al_mix64(a * 0x9e3779b97f4a7c15ull ^ _al_mix64(b + 0x632be59bd9b4e5a9ull));
}

static uint64_t hash_bytes(const char *s, size_t n)
{
    uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a */
    for (size_t i = 0; i < n; i++) {
        h ^= (unsigned char)s[i];
        h *= 0x100000001b3ull;
    }
    return _al_mix64(h ^ n);
}

/* Room for one more entry; false when memory ran out. */
static bool table_reserve(struct table *t)
{
    if (t->failed)
        return false;
    if ((t->n + 1) * 2 <= t->cap)
        return true;
    size_t cap = t->cap ? t->cap * 2 : 1024;
    struct slot *s = _al_mem_map(cap * sizeof *s);
    if (!s) {
        t->failed = true;
        return false;
    }
    for (size_t i = 0; i < t->cap; i++) {
        if (!t->s[i].v)
            continue;
        size_t j = t->s[i].h & (cap - 1);
        while (s[j].v)
            j = (j + 1) & (cap - 1);
        s[j] = t->s[i];
    }
    if (t->s)
        _al_mem_unmap(t->s, t->cap * sizeof *t->s);
    t->s = s;
    t->cap = cap;
    return true;
}

static void table_free(struct table *t)
{
    if (t->s)
        _al_mem_unmap(t->s, t->cap * sizeof *t->s);
    t->s = NULL;
    t->cap = t->n = 0;
}

/* ---- the profile being built -------------------------------------------------------------- */

struct str_rec { const char *s; size_t n; };
struct func_rec { uint64_t name, file; };
struct line_rec { uint32_t function; int64_t line; };
struct loc_rec { uint64_t address; uint32_t mapping; size_t first_line, nlines; }; /* its Lines in lines */
struct map_stat { uint64_t locations, functions, files, lines; };

struct pp {
    const struct al_pprof_profile *p;
    struct al_buf out, msg, pk;          /* the profile; one message; one packed field */
    struct al_buf strs, funcs, locs, lines, mstat;
    struct table tstr, tfunc, tloc;
    bool failed;
};

/* Appends REC (SIZE bytes) to ARR and enters it in T at SL, a free slot whose key is set: its
 * id (its index + 1), or 0 when out of memory (the slot stays free). */
static uint64_t table_add(struct pp *w, struct table *t, struct slot *sl, struct al_buf *arr,
                          const void *rec, size_t size)
{
    _al_buf_putn(arr, rec, size);
    if (arr->failed) {
        w->failed = true;
        return 0;
    }
    sl->v = arr->len / size;
    t->n++;
    return sl->v;
}

static uint64_t intern_n(struct pp *w, const char *s, size_t n)
{
    uint64_t h = hash_bytes(s, n);
    if (!table_reserve(&w->tstr)) {
        w->failed = true;
        return 0;
    }
    struct table *t = &w->tstr;
    size_t i = h & (t->cap - 1);
    for (; t->s[i].v; i = (i + 1) & (t->cap - 1)) {
        struct slot *sl = &t->s[i];
        if (sl->h == h && sl->k2 == n) {
            const struct str_rec *r = &ARR_AT(w->strs, struct str_rec, sl->v - 1);
            if (memcmp(r->s, s, n) == 0)
                return sl->v - 1;
        }
    }
    t->s[i] = (struct slot){ .h = h, .k1 = h, .k2 = n };
    struct str_rec r = { s, n };
    uint64_t id = table_add(w, t, &t->s[i], &w->strs, &r, sizeof r);
    return id ? id - 1 : 0;
}

/* A string's index in the string table; NULL is "" (index 0). */
static uint64_t intern(struct pp *w, const char *s)
{
    return s ? intern_n(w, s, strlen(s)) : 0;
}

/* Looks (k1, k2) up in T: the entry's index + 1, or 0 with *slot_out where to insert it. */
static uint64_t table_find(struct table *t, uint64_t k1, uint64_t k2, struct slot **slot_out)
{
    uint64_t h = hash_pair(k1, k2);
    size_t i = h & (t->cap - 1);
    for (; t->s[i].v; i = (i + 1) & (t->cap - 1))
        if (t->s[i].h == h && t->s[i].k1 == k1 && t->s[i].k2 == k2)
            return t->s[i].v;
    t->s[i].h = h;
    t->s[i].k1 = k1;
    t->s[i].k2 = k2;
    *slot_out = &t->s[i];
    return 0;
}

/* The id (1-based) of the Function named NAME in FILE. */
static uint32_t function_id(struct pp *w, const char *name, const char *file)
{
    uint64_t n = intern(w, name), f = intern(w, file);
    if (w->failed || !table_reserve(&w->tfunc)) {
        w->failed = true;
        return 0;
    }
    struct slot *sl = NULL;
    uint64_t v = table_find(&w->tfunc, n, f, &sl);
    if (v)
        return (uint32_t)v;
    struct func_rec r = { n, f };
    return (uint32_t)table_add(w, &w->tfunc, sl, &w->funcs, &r, sizeof r);
}

/* A Line of the location being recorded, for function FN (none where FN is NULL): how many. */
static size_t add_line(struct pp *w, const char *fn, const char *file, int64_t line)
{
    if (!fn)
        return 0;
    struct line_rec r = { function_id(w, fn, file), line };
    _al_buf_putn(&w->lines, (const char *)&r, sizeof r);
    w->failed |= w->lines.failed;
    return 1;
}

/* The id (1-based) of the Location of frame F, deduplicated by (address, mapping). */
static uint64_t location_id(struct pp *w, const struct al_pprof_frame *f)
{
    uint32_t mapping = f->mapping <= w->p->nmappings ? f->mapping : 0;
    if (!table_reserve(&w->tloc)) {
        w->failed = true;
        return 0;
    }
    struct slot *sl = NULL;
    uint64_t v = table_find(&w->tloc, f->address, mapping, &sl);
    if (v)
        return v;
    /* The slot stays empty (v == 0) until the location is recorded: interning below may not
     * touch this table, so the pointer stays valid. */
    struct loc_rec r = { .address = f->address, .mapping = mapping,
                         .first_line = ARR_LEN(w->lines, struct line_rec) };
    if (f->function) {
        r.nlines += add_line(w, f->function, f->file, f->line);
        for (uint32_t i = 0; i < f->ninlined; i++)
            r.nlines += add_line(w, f->inlined[i].function, f->inlined[i].file, f->inlined[i].line);
    }
    if (w->failed)
        return 0;
    if (!table_add(w, &w->tloc, sl, &w->locs, &r, sizeof r))
        return 0;
    if (mapping) {
        struct map_stat *m = &ARR_AT(w->mstat, struct map_stat, mapping - 1);
        m->locations++;
        m->functions += f->function != NULL;
        m->files += f->function != NULL && f->file != NULL;
        m->lines += f->function != NULL && f->line > 0;
    }
    return sl->v;
}

static void value_type(struct pp *w, unsigned field, const char *type, const char *unit)
{
    w->msg.len = 0;
    pb_uint(&w->msg, VALUETYPE_TYPE, intern(w, type));
    pb_uint(&w->msg, VALUETYPE_UNIT, intern(w, unit));
    pb_sub(&w->out, field, &w->msg);
}

static void encode_samples(struct pp *w)
{
    const struct al_pprof_profile *p = w->p;
    for (uint32_t i = 0; i < p->nsamples && !w->failed; i++) {
        const struct al_pprof_sample *s = &p->samples[i];
        w->msg.len = 0;
        w->pk.len = 0;
        for (uint32_t j = 0; j < s->nframes; j++)
            pb_varint(&w->pk, location_id(w, &s->frames[j]));
        if (w->pk.len)
            pb_sub(&w->msg, SAMPLE_LOCATION_ID, &w->pk);
        w->pk.len = 0;
        int64_t values[4] = { s->alloc_objects, s->alloc_space, s->inuse_objects, s->inuse_space };
        for (int k = 0; k < 4; k++)
            pb_varint(&w->pk, (uint64_t)values[k]);
        pb_sub(&w->msg, SAMPLE_VALUE, &w->pk);
        pb_sub(&w->out, PROFILE_SAMPLE, &w->msg);
    }
}

/* has_functions and its siblings say that every location of the mapping already carries that
 * much: pprof then leaves the mapping alone instead of symbolizing it again from the binary (as
 * the Go runtime sets them). */
static void encode_mappings(struct pp *w)
{
    const struct al_pprof_profile *p = w->p;
    for (uint32_t i = 0; i < p->nmappings; i++) {
        const struct al_pprof_mapping *m = &p->mappings[i];
        const struct map_stat *st = &ARR_AT(w->mstat, struct map_stat, i);
        w->msg.len = 0;
        pb_uint(&w->msg, MAPPING_ID, i + 1);
        pb_uint(&w->msg, MAPPING_MEMORY_START, m->start);
        pb_uint(&w->msg, MAPPING_MEMORY_LIMIT, m->limit);
        pb_uint(&w->msg, MAPPING_FILE_OFFSET, m->offset);
        pb_uint(&w->msg, MAPPING_FILENAME, intern(w, m->file));
        pb_uint(&w->msg, MAPPING_BUILD_ID, intern(w, m->build_id));
        bool any = st->locations > 0;
        pb_uint(&w->msg, MAPPING_HAS_FUNCTIONS, any && st->functions == st->locations);
        pb_uint(&w->msg, MAPPING_HAS_FILENAMES, any && st->files == st->locations);
        pb_uint(&w->msg, MAPPING_HAS_LINE_NUMBERS, any && st->lines == st->locations);
        pb_sub(&w->out, PROFILE_MAPPING, &w->msg);
    }
}

static void encode_locations(struct pp *w)
{
    size_t n = ARR_LEN(w->locs, struct loc_rec);
    for (size_t i = 0; i < n; i++) {
        const struct loc_rec *l = &ARR_AT(w->locs, struct loc_rec, i);
        w->msg.len = 0;
        pb_uint(&w->msg, LOCATION_ID, i + 1);
        pb_uint(&w->msg, LOCATION_MAPPING_ID, l->mapping);
        pb_uint(&w->msg, LOCATION_ADDRESS, l->address);
        for (size_t k = 0; k < l->nlines; k++) { /* innermost first, as profile.proto has it */
            const struct line_rec *lr = &ARR_AT(w->lines, struct line_rec, l->first_line + k);
            w->pk.len = 0; /* Line { function_id, line } */
            pb_uint(&w->pk, LINE_FUNCTION_ID, lr->function);
            pb_uint(&w->pk, LINE_LINE, (uint64_t)lr->line);
            pb_sub(&w->msg, LOCATION_LINE, &w->pk);
        }
        pb_sub(&w->out, PROFILE_LOCATION, &w->msg);
    }
}

static void encode_functions(struct pp *w)
{
    size_t n = ARR_LEN(w->funcs, struct func_rec);
    for (size_t i = 0; i < n; i++) {
        const struct func_rec *f = &ARR_AT(w->funcs, struct func_rec, i);
        w->msg.len = 0;
        pb_uint(&w->msg, FUNCTION_ID, i + 1);
        pb_uint(&w->msg, FUNCTION_NAME, f->name);
        pb_uint(&w->msg, FUNCTION_SYSTEM_NAME, f->name);
        pb_uint(&w->msg, FUNCTION_FILENAME, f->file);
        pb_sub(&w->out, PROFILE_FUNCTION, &w->msg);
    }
}

static void encode_strings(struct pp *w)
{
    size_t n = ARR_LEN(w->strs, struct str_rec);
    for (size_t i = 0; i < n; i++) {
        const struct str_rec *s = &ARR_AT(w->strs, struct str_rec, i);
        pb_bytes(&w->out, PROFILE_STRING_TABLE, s->s, s->n);
    }
}

static int encode(struct pp *w)
{
    const struct al_pprof_profile *p = w->p;
    intern_n(w, "", 0); /* index 0 */
    for (uint32_t i = 0; i < p->nmappings; i++) {
        struct map_stat z = { 0 };
        _al_buf_putn(&w->mstat, (const char *)&z, sizeof z);
    }
    if (w->mstat.failed)
        return -ENOMEM;

    value_type(w, PROFILE_SAMPLE_TYPE, "alloc_objects", "count");
    value_type(w, PROFILE_SAMPLE_TYPE, "alloc_space", "bytes");
    value_type(w, PROFILE_SAMPLE_TYPE, "inuse_objects", "count");
    value_type(w, PROFILE_SAMPLE_TYPE, "inuse_space", "bytes");
    encode_samples(w);
    encode_mappings(w);
    encode_locations(w);
    encode_functions(w);
    pb_uint(&w->out, PROFILE_TIME_NANOS, (uint64_t)p->time_nanos);
    pb_uint(&w->out, PROFILE_DURATION_NANOS, (uint64_t)p->duration_nanos);
    value_type(w, PROFILE_PERIOD_TYPE, "space", "bytes");
    pb_uint(&w->out, PROFILE_PERIOD, (uint64_t)p->period);
    encode_strings(w); /* last: every string is interned by now */

    if (w->failed || w->out.failed || w->msg.failed || w->pk.failed || w->strs.failed ||
        w->funcs.failed || w->locs.failed || w->lines.failed)
        return -ENOMEM;
    return 0;
}

static void pp_free(struct pp *w)
{
    _al_buf_free(&w->out);
    _al_buf_free(&w->msg);
    _al_buf_free(&w->pk);
    _al_buf_free(&w->strs);
    _al_buf_free(&w->funcs);
    _al_buf_free(&w->locs);
    _al_buf_free(&w->lines);
    _al_buf_free(&w->mstat);
    table_free(&w->tstr);
    table_free(&w->tfunc);
    table_free(&w->tloc);
}

/* ---- zlib and libelf, opened where a profile is written ---------------------------------- */

static struct {
    bool tried, ok;
    char why[200];
    __typeof__(deflateInit2_) *deflate_init2;
    __typeof__(deflate) *deflate;
    __typeof__(deflateEnd) *deflate_end;
    __typeof__(elf_version) *elf_version;
    __typeof__(elf_begin) *elf_begin;
    __typeof__(elf_kind) *elf_kind;
    __typeof__(elf_end) *elf_end;
    __typeof__(elf_getphdrnum) *elf_getphdrnum;
    __typeof__(elf_getdata_rawchunk) *elf_getdata_rawchunk;
    __typeof__(elf_nextscn) *elf_nextscn;
    __typeof__(elf_getdata) *elf_getdata;
    __typeof__(gelf_getphdr) *gelf_getphdr;
    __typeof__(gelf_getshdr) *gelf_getshdr;
    __typeof__(gelf_getnote) *gelf_getnote;
} lib;

/* NAME of the library opened as HANDLE (SONAME; NULL: not opened, ERR says why) into *FN. */
static bool find(void *handle, const char *soname, const char *err, const char *name, void *fn)
{
    void *p = handle ? dlsym(handle, name) : NULL;
    if (!p && !lib.why[0]) {
        if (handle)
            snprintf(lib.why, sizeof lib.why, "%s lacks %s", soname, name);
        else
            snprintf(lib.why, sizeof lib.why, "%s cannot be loaded: %s", soname, err ? err : "not found");
    }
    memcpy(fn, &p, sizeof p);
    return p != NULL;
}

bool _al_pprof_libs_open(void)
{
    if (lib.tried)
        return lib.ok;
    lib.tried = true;
    static const char zso[] = "libz.so.1", eso[] = "libelf.so.1";
    char zerr[160] = "", eerr[160] = "";
    /* zlib's functions call one another through its PLT: a program that exports zlib's names
     * of its own (node, which bundles its own zlib, built otherwise) would have libz's
     * deflateInit2_ call the program's deflateReset on libz's state. RTLD_DEEPBIND: libz's
     * own first (its memory is ours, z_alloc, whatever malloc it would bind). */
    void *z = dlopen(zso, RTLD_NOW | RTLD_LOCAL | RTLD_DEEPBIND);
    if (!z)
        snprintf(zerr, sizeof zerr, "%s", dlerror());
    void *e = dlopen(eso, RTLD_NOW | RTLD_LOCAL);
    if (!e)
        snprintf(eerr, sizeof eerr, "%s", dlerror());
#define Z(field, sym) find(z, zso, zerr, #sym, &lib.field)
#define E(field, sym) find(e, eso, eerr, #sym, &lib.field)
    lib.ok = Z(deflate_init2, deflateInit2_) & Z(deflate, deflate) & Z(deflate_end, deflateEnd) &
             E(elf_version, elf_version) & E(elf_begin, elf_begin) & E(elf_kind, elf_kind) & E(elf_end, elf_end) &
             E(elf_getphdrnum, elf_getphdrnum) & E(elf_getdata_rawchunk, elf_getdata_rawchunk) &
             E(elf_nextscn, elf_nextscn) & E(elf_getdata, elf_getdata) & E(gelf_getphdr, gelf_getphdr) &
             E(gelf_getshdr, gelf_getshdr) & E(gelf_getnote, gelf_getnote);
#undef Z
#undef E
    if (!lib.ok) { /* nothing of either is called: neither stays loaded */
        if (z)
            dlclose(z);
        if (e)
            dlclose(e);
    }
    return lib.ok;
}

/* ---- gzip through zlib, with mmap'd memory ------------------------------------------------ */

/* deflate at windowBits 15, memLevel 8 asks for about 270 KiB in a handful of blocks, all
 * before the first byte is compressed; nothing is freed before deflateEnd. */
#define Z_REGION (1u << 20)
#define Z_CHUNK (64u << 10)

struct zregion {
    char *base;
    size_t used, cap;
};

static voidpf z_alloc(voidpf opaque, uInt items, uInt size)
{
    struct zregion *r = opaque;
    if (size && items > (SIZE_MAX - 64) / size)
        return Z_NULL;
    size_t n = ((size_t)items * size + 63) & ~(size_t)63;
    if (n > r->cap - r->used)
        return Z_NULL;
    void *p = r->base + r->used;
    r->used += n;
    return p;
}

static void z_free(voidpf opaque, voidpf address)
{
    (void)opaque;
    (void)address; /* the region goes back whole */
}

/* Compresses DATA into a gzip stream written to FD. */
static int gzip_to_fd(int fd, const char *data, size_t len, const char **why)
{
    struct zregion r = { .base = _al_mem_map(Z_REGION), .cap = Z_REGION - Z_CHUNK };
    if (!r.base)
        return -ENOMEM;
    unsigned char *chunk = (unsigned char *)r.base + r.cap;
    z_stream zs;
    memset(&zs, 0, sizeof zs);
    zs.zalloc = z_alloc;
    zs.zfree = z_free;
    zs.opaque = &r;
    int rc = lib.deflate_init2(&zs, Z_DEFAULT_COMPRESSION, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY,
                               ZLIB_VERSION, (int)sizeof zs);
    if (rc != Z_OK) {
        _al_mem_unmap(r.base, Z_REGION);
        return rc == Z_MEM_ERROR ? -ENOMEM : -EINVAL;
    }
    int ret = 0;
    size_t off = 0;
    int zr;
    do {
        /* avail_in is a uInt: feed very large profiles in slices. */
        if (zs.avail_in == 0 && off < len) {
            size_t n = len - off > (1u << 30) ? (1u << 30) : len - off;
            zs.next_in = (Bytef *)(uintptr_t)(data + off);
            zs.avail_in = (uInt)n;
            off += n;
        }
        zs.next_out = chunk;
        zs.avail_out = Z_CHUNK;
        zr = lib.deflate(&zs, off == len ? Z_FINISH : Z_NO_FLUSH);
        if (zr == Z_STREAM_ERROR || (zr == Z_BUF_ERROR && zs.avail_out == Z_CHUNK)) {
            *why = zs.msg ? zs.msg : "compression failed";
            ret = -EIO;
            break;
        }
        ret = _al_write_all(fd, chunk, Z_CHUNK - zs.avail_out);
    } while (ret == 0 && zr != Z_STREAM_END);
    lib.deflate_end(&zs);
    _al_mem_unmap(r.base, Z_REGION);
    return ret;
}

/* ---- the entry points --------------------------------------------------------------------- */

static int fail(char *err, size_t errcap, const char *path, int r, const char *why)
{
    if (err && errcap)
        snprintf(err, errcap, "cannot write %s: %s", path ? path : "(null)", why ? why : strerror(-r));
    return r;
}

int _al_pprof_write(const char *path, const struct al_pprof_profile *p, char *err, size_t errcap)
{
    if (err && errcap)
        err[0] = '\0';
    if (!path || !p)
        return fail(err, errcap, path, -EINVAL, NULL);
    if ((p->nmappings && !p->mappings) || (p->nsamples && !p->samples))
        return fail(err, errcap, path, -EINVAL, "invalid profile");
    if (!_al_pprof_libs_open())
        return fail(err, errcap, path, -ENOSYS, lib.why);
    for (uint32_t i = 0; i < p->nsamples; i++)
        if (p->samples[i].nframes && !p->samples[i].frames)
            return fail(err, errcap, path, -EINVAL, "invalid profile");
    for (uint32_t i = 0; i < p->nsamples; i++)
        for (uint32_t f = 0; f < p->samples[i].nframes; f++)
            if (p->samples[i].frames[f].ninlined && !p->samples[i].frames[f].inlined)
                return fail(err, errcap, path, -EINVAL, "invalid profile");

    struct pp *w = _al_mem_map(sizeof *w);
    if (!w)
        return fail(err, errcap, path, -ENOMEM, NULL);
    w->p = p;
    int r = encode(w);
    if (r < 0) {
        pp_free(w);
        _al_mem_unmap(w, sizeof *w);
        return fail(err, errcap, path, r, NULL);
    }

    /* A file this call created and could not finish is removed; one that was there before (a
     * device, a fifo, a file someone else named) is left alone. */
    const char *why = NULL;
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    bool created = fd >= 0;
    if (fd < 0 && errno == EEXIST)
        fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        r = -errno;
    } else {
        r = gzip_to_fd(fd, w->out.data, w->out.len, &why);
        if (close(fd) < 0 && r == 0 && errno != EINTR)
            r = -errno;
        if (r < 0 && created)
            unlink(path);
    }
    pp_free(w);
    _al_mem_unmap(w, sizeof *w);
    return r < 0 ? fail(err, errcap, path, r, why) : 0;
}

/* ---- GNU build ids ------------------------------------------------------------------------ */

/* The NT_GNU_BUILD_ID note in DATA (a section or segment of notes): its length, *ID pointing
 * at it; 0 when there is none. */
static size_t note_build_id(Elf_Data *data, const unsigned char **id)
{
    GElf_Nhdr nh;
    size_t off = 0, name_off, desc_off;
    while (data && (off = lib.gelf_getnote(data, off, &nh, &name_off, &desc_off)) > 0) {
        if (nh.n_type == NT_GNU_BUILD_ID && nh.n_namesz == 4 &&
            memcmp((const char *)data->d_buf + name_off, "GNU", 4) == 0 && nh.n_descsz > 0) {
            *id = (const unsigned char *)data->d_buf + desc_off;
            return nh.n_descsz;
        }
    }
    return 0;
}

/* The build id of ELF, from its PT_NOTE segments, or its SHT_NOTE sections for files without
 * program headers (as elfutils' own tools look for it). */
static size_t gnu_build_id(Elf *elf, const unsigned char **id)
{
    size_t nph = 0, n = 0;
    if (lib.elf_getphdrnum(elf, &nph) == 0) {
        for (size_t i = 0; i < nph && !n; i++) {
            GElf_Phdr ph;
            if (lib.gelf_getphdr(elf, (int)i, &ph) && ph.p_type == PT_NOTE)
                n = note_build_id(lib.elf_getdata_rawchunk(elf, (int64_t)ph.p_offset, ph.p_filesz,
                                                       ph.p_align == 8 ? ELF_T_NHDR8 : ELF_T_NHDR), id);
        }
        if (nph)
            return n;
    }
    for (Elf_Scn *scn = NULL; !n && (scn = lib.elf_nextscn(elf, scn));) {
        GElf_Shdr sh;
        if (lib.gelf_getshdr(scn, &sh) && sh.sh_type == SHT_NOTE)
            n = note_build_id(lib.elf_getdata(scn, NULL), id);
    }
    return n;
}

static int to_hex(const unsigned char *id, size_t n, char *hex, size_t cap)
{
    static const char digits[] = "0123456789abcdef";
    if (cap < n * 2 + 1)
        return -ERANGE;
    for (size_t i = 0; i < n; i++) {
        hex[2 * i] = digits[id[i] >> 4];
        hex[2 * i + 1] = digits[id[i] & 15];
    }
    hex[n * 2] = '\0';
    return 0;
}

/* The NT_GNU_BUILD_ID note among the LEN bytes of notes at P, aligned to ALIGN, in memory. */
static size_t mapped_note_build_id(const unsigned char *p, size_t len, size_t align, const unsigned char **id)
{
#define UP(x) (((x) + align - 1) & ~(align - 1))
    for (size_t off = 0; off + sizeof(ElfW(Nhdr)) <= len;) {
        const ElfW(Nhdr) *nh = (const void *)(p + off);
        size_t name = off + sizeof *nh, desc = UP(name + nh->n_namesz), next = UP(desc + nh->n_descsz);
        if (next > len || next <= off)
            break;
        if (nh->n_type == NT_GNU_BUILD_ID && nh->n_namesz == 4 && !memcmp(p + name, "GNU", 4) && nh->n_descsz) {
            *id = p + desc;
            return nh->n_descsz;
        }
        off = next;
    }
    return 0;
#undef UP
}

struct loaded_id {
    uintptr_t addr;
    const unsigned char *id;
    size_t n;
    bool found;
};

static int loaded_build_id(struct dl_phdr_info *info, size_t size, void *arg)
{
    (void)size;
    struct loaded_id *q = arg;
    for (int i = 0; i < info->dlpi_phnum && !q->found; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        uintptr_t lo = info->dlpi_addr + ph->p_vaddr;
        q->found = ph->p_type == PT_LOAD && q->addr >= lo && q->addr - lo < ph->p_memsz;
    }
    for (int i = 0; q->found && !q->n && i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        if (ph->p_type == PT_NOTE)
            q->n = mapped_note_build_id((const unsigned char *)(info->dlpi_addr + ph->p_vaddr), ph->p_memsz,
                                        ph->p_align == 8 ? 8 : 4, &q->id);
    }
    return q->found;
}

int _al_build_id_loaded(uintptr_t addr, char *hex, size_t cap)
{
    struct loaded_id q = { .addr = addr };
    dl_iterate_phdr(loaded_build_id, &q);
    if (!q.found)
        return -ESRCH;
    return q.n ? to_hex(q.id, q.n, hex, cap) : -ENOENT;
}

/* The NT_GNU_BUILD_ID note of an ELF file, as hex. */
int _al_build_id(const char *file, char *hex, size_t cap)
{
    if (!file || !hex || !cap)
        return -EINVAL;
    hex[0] = '\0';
    if (!_al_pprof_libs_open())
        return -ENOSYS;
    int fd = open(file, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    struct stat st;
    int r = fstat(fd, &st) < 0 ? -errno : S_ISDIR(st.st_mode) ? -EISDIR : -ENOEXEC;
    if (r != -ENOEXEC || !S_ISREG(st.st_mode) || st.st_size < EI_NIDENT) {
        close(fd);
        return r;
    }
    lib.elf_version(EV_CURRENT);
    Elf *elf = lib.elf_begin(fd, ELF_C_READ_MMAP, NULL);
    const unsigned char *id;
    if (elf && lib.elf_kind(elf) == ELF_K_ELF) {
        size_t n = gnu_build_id(elf, &id);
        r = n == 0 ? -ENOENT : to_hex(id, n, hex, cap);
    }
    if (elf)
        lib.elf_end(elf);
    close(fd);
    return r;
}
