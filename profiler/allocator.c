/* Which allocator really serves the calls: the object where the real malloc resolved, named
 * and, where the allocator can tell, versioned. It also notices when the program itself
 * defines malloc (an allocator linked in statically), which no preload can stand in front of. */
#include <dlfcn.h>
#include <errno.h>
#include <gnu/libc-version.h>
#include <limits.h>
#include <link.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "profiler.h"

static const struct {
    const char *prefix;
    const char *name;
} known[] = {
    { "libc.so", "glibc" },
    { "libjemalloc", "jemalloc" },
    { "libtcmalloc", "tcmalloc" },
    { "libmimalloc", "mimalloc" },
};

struct object_query {
    uintptr_t a;
    struct al_object *out;
};

static int holds_address(struct dl_phdr_info *info, size_t size, void *arg)
{
    (void)size;
    struct object_query *q = arg;
    uintptr_t lo = UINTPTR_MAX, hi = 0;
    bool in = false;
    for (int i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        if (ph->p_type != PT_LOAD)
            continue;
        uintptr_t start = info->dlpi_addr + ph->p_vaddr;
        lo = start < lo ? start : lo;
        hi = start + ph->p_memsz > hi ? start + ph->p_memsz : hi;
        if (q->a >= start && q->a - start < ph->p_memsz) {
            in = true;
            q->out->seg_lo = start;
            q->out->seg_hi = start + ph->p_memsz;
        }
    }
    if (!in)
        return 0;
    q->out->base = lo;
    q->out->path = info->dlpi_name;
    q->out->bias = info->dlpi_addr;
    q->out->end = hi;
    q->out->dynamic = NULL;
    q->out->dynamic_relocated = false;
    for (int i = 0; i < info->dlpi_phnum; i++) {
        if (info->dlpi_phdr[i].p_type == PT_DYNAMIC) {
            q->out->dynamic = (const Elf64_Dyn *)(info->dlpi_addr + info->dlpi_phdr[i].p_vaddr);
            /* The loader turns the entries of a writable dynamic section into addresses in
             * place; a read-only one (the vDSO's) keeps offsets from the load bias. */
            q->out->dynamic_relocated = (info->dlpi_phdr[i].p_flags & PF_W) != 0;
        }
    }
    return 1;
}

/* Not dladdr: it searches the object's symbols for the nearest one too, which in libc and
 * libstdc++ (thousands of symbols, for each of the twenty-odd entry points resolved at
 * start-up) cost every profiled process a fifth of a millisecond. */
bool _al_object_of(const void *addr, struct al_object *out)
{
    struct object_query q = { (uintptr_t)addr, out };
    return addr && dl_iterate_phdr(holds_address, &q) != 0;
}

struct al_code _al_self_code, _al_unwinder_code;

void _al_code_of(const void *fn, struct al_code *c)
{
    struct al_object o;
    if (_al_object_of(fn, &o))
        *c = (struct al_code){ o.seg_lo, o.seg_hi };
}

bool _al_object_may_define(const struct al_object *o, const char *name)
{
    const uint32_t *gnu_hash = NULL;
    const Elf64_Sym *symtab = NULL;
    const char *strtab = NULL;
    for (const Elf64_Dyn *d = o->dynamic; d && d->d_tag != DT_NULL; d++) {
        uintptr_t p = o->dynamic_relocated ? d->d_un.d_ptr : o->bias + d->d_un.d_ptr;
        /* Anything but the object's own memory: not read, and no answer. */
        if ((d->d_tag == DT_GNU_HASH || d->d_tag == DT_SYMTAB || d->d_tag == DT_STRTAB) &&
            (p < o->base || p >= o->end))
            return true;
        if (d->d_tag == DT_GNU_HASH)
            gnu_hash = (const uint32_t *)p;
        else if (d->d_tag == DT_SYMTAB)
            symtab = (const Elf64_Sym *)p;
        else if (d->d_tag == DT_STRTAB)
            strtab = (const char *)p;
    }
    if (!gnu_hash || !symtab || !strtab)
        return true;
    uint32_t nbuckets = gnu_hash[0], symoffset = gnu_hash[1], bloom_words = gnu_hash[2], shift = gnu_hash[3];
    if (nbuckets == 0 || bloom_words == 0)
        return true;
    const uint64_t *bloom = (const uint64_t *)(gnu_hash + 4);
    const uint32_t *buckets = (const uint32_t *)(bloom + bloom_words);
    const uint32_t *chain = buckets + nbuckets;
    uint32_t h = 5381;
    for (const unsigned char *c = (const unsigned char *)name; *c; c++)
        h = h * 33 + *c;
    uint64_t word = bloom[(h / 64) % bloom_words];
    uint64_t mask = (1ull << (h % 64)) | (1ull << ((h >> shift) % 64));
    if ((word & mask) != mask)
        return false;
    for (uint32_t i = buckets[h % nbuckets]; i != 0 && i >= symoffset; i++) { /* 0: an empty bucket */
        uint32_t hi = chain[i - symoffset];
        if ((hi | 1) == (h | 1) && symtab[i].st_shndx != SHN_UNDEF && strcmp(strtab + symtab[i].st_name, name) == 0)
            return true;
        if (hi & 1)
            break;
    }
    return false;
}

static const char *base_name(const char *path)
{
    const char *s = strrchr(path, '/');
    return s ? s + 1 : path;
}

static void copy(char *dst, size_t cap, const char *src)
{
    size_t n = src ? strnlen(src, cap - 1) : 0;
    memcpy(dst, src ? src : "", n);
    dst[n] = '\0';
}

/* NAME in the allocator's own object (OBJ, open as HANDLE), without a failed lookup. */
static void *own_symbol(void *handle, const struct al_object *obj, const char *name)
{
    return _al_object_may_define(obj, name) ? dlsym(handle, name) : NULL;
}

/* Asks the allocator for its version through the introspection call it exports, if any. */
static void version_of(struct al_allocator_info *a, void *handle, const struct al_object *obj)
{
    if (strcmp(a->name, "glibc") == 0) {
        copy(a->version, sizeof a->version, gnu_get_libc_version());
        return;
    }
    if (!handle)
        return;
    int (*mallctl)(const char *, void *, size_t *, void *, size_t) = own_symbol(handle, obj, "mallctl");
    if (mallctl) {
        const char *v = NULL;
        size_t len = sizeof v;
        if (mallctl("version", &v, &len, NULL, 0) == 0 && v) {
            /* "5.3.0-0-g54eaed1d8b56b1aa528be3bdd1877e59c56fa90c": the release is enough. */
            copy(a->version, sizeof a->version, v);
            char *dash = strchr(a->version, '-');
            if (dash)
                *dash = '\0';
            return;
        }
    }
    const char *(*tc_version)(int *, int *, const char **) = own_symbol(handle, obj, "tc_version");
    if (tc_version) {
        int major = 0, minor = 0;
        const char *patch = "";
        tc_version(&major, &minor, &patch);
        snprintf(a->version, sizeof a->version, "%d.%d%s", major, minor, patch ? patch : "");
        return;
    }
    int (*mi_version)(void) = own_symbol(handle, obj, "mi_version");
    if (mi_version) {
        int v = mi_version();
        snprintf(a->version, sizeof a->version, "%d.%d.%d", v / 100, (v / 10) % 10, v % 10);
        return;
    }
}

/* By device and inode: two stat calls, not the readlinks of resolving both paths. */
static bool same_file(const char *x, const char *y)
{
    struct stat sx, sy;
    if (strcmp(x, y) == 0)
        return true;
    if (stat(x, &sx) < 0 || stat(y, &sy) < 0)
        return false;
    return sx.st_dev == sy.st_dev && sx.st_ino == sy.st_ino;
}

void _al_allocator_identify(struct al_allocator_info *a, const void *real_malloc,
                            const void *own_malloc, const char *requested)
{
    memset(a, 0, sizeof *a);
    const void *serving = real_malloc;
    void *def = dlsym(RTLD_DEFAULT, "malloc");
    Dl_info di;
    const ElfW(Sym) *sym = NULL;
    /* Something earlier in the search order than us (the program itself) defines malloc. A
     * non-PIE program that takes malloc's address has a symbol with a value too (its PLT
     * stub) without defining it: only a symbol with a section counts, which is what dladdr1
     * reports. */
    if (def && def != own_malloc && dladdr1(def, &di, (void **)&sym, RTLD_DL_SYMENT) && sym &&
        sym->st_shndx != SHN_UNDEF && di.dli_sname && strcmp(di.dli_sname, "malloc") == 0) {
        a->program_defines_malloc = true;
        serving = def;
    }
    struct al_object obj;
    if (!_al_object_of(serving, &obj) || !obj.path) {
        copy(a->name, sizeof a->name, "unknown");
        return;
    }
    if (obj.path[0] == '\0') { /* the program itself */
        ssize_t n = readlink("/proc/self/exe", a->path, sizeof a->path - 1);
        if (n > 0)
            a->path[n] = '\0';
    } else {
        copy(a->path, sizeof a->path, obj.path);
    }
    const char *base = base_name(a->path);
    copy(a->name, sizeof a->name, base);
    for (size_t i = 0; i < sizeof known / sizeof known[0]; i++) {
        if (strncmp(base, known[i].prefix, strlen(known[i].prefix)) == 0)
            copy(a->name, sizeof a->name, known[i].name);
    }
    void *handle = obj.path[0] ? dlopen(obj.path, RTLD_LAZY | RTLD_NOLOAD) : NULL;
    version_of(a, handle, &obj);
    if (handle)
        dlclose(handle);
    if (requested && *requested && !same_file(requested, a->path))
        copy(a->requested, sizeof a->requested, requested);
}

/* No config given (the library used without `alloclens run`): the one `alloclens run` or
 * `alloclens prerun` left in the cache for the allocator serving the calls, if it still
 * describes that library. 0, or a reason in A. */
static int load_cached(struct al_allocator_info *a, struct al_alloc_config *c)
{
    char path[AL_CONFIG_PATH_MAX], err[512];
    /* _al_env, not getenv: before main, a program's own getenv (bash's) may not know the
     * environment yet. */
    int r = a->path[0] ? _al_config_cache_path(a->path, _al_env("XDG_CACHE_HOME"), _al_env("HOME"), path, sizeof path)
                       : -ENOENT;
    if (r == 0)
        r = _al_config_cache_lookup(a->path, path, c, err, sizeof err);
    if (r == 0) {
        copy(a->config_path, sizeof a->config_path, path);
        return 0;
    }
    if (r == -ESTALE)
        snprintf(err, sizeof err, "the cached config %.200s is for an older %.200s: 'alloclens run' probes it again",
                 path, a->path);
    else if (r == -EINVAL)
        _al_log("ignoring the cached config: %s", err);
    else
        snprintf(err, sizeof err, "no allocator config given, none cached for %.200s: 'alloclens run' probes the "
                 "allocator, or set ALLOCLENS_CONFIG", a->path[0] ? a->path : "the allocator");
    copy(a->config_reason, sizeof a->config_reason, err);
    return -1;
}

void _al_allocator_load_config(struct al_allocator_info *a, const char *path, bool classes)
{
    struct al_alloc_config *c = _al_mem_map(sizeof *c);
    if (!c) {
        copy(a->config_reason, sizeof a->config_reason, "out of memory loading the allocator config");
        return;
    }
    if (!path || !*path) {
        if (load_cached(a, c) < 0) {
            _al_mem_unmap(c, sizeof *c);
            return;
        }
    } else {
        copy(a->config_path, sizeof a->config_path, path);
        char err[512];
        if (_al_config_load_runs(path, c, err, sizeof err) < 0) {
            _al_log("%s", err);
            copy(a->config_reason, sizeof a->config_reason, err);
            _al_mem_unmap(c, sizeof *c);
            return;
        }
        if (a->path[0] && !same_file(c->allocator, a->path)) {
            snprintf(err, sizeof err, "%.150s describes %.150s, but %.150s serves the calls: not used", path,
                     c->allocator, a->path);
            /* Where another allocator than the one asked for serves the calls, this follows from
             * that, which the main process says in a line (process.c) and every report records. */
            if (!a->requested[0] && !a->program_defines_malloc)
                _al_log("%s", err);
            copy(a->config_reason, sizeof a->config_reason, err);
            _al_mem_unmap(c, sizeof *c);
            return;
        }
    }
    if (classes && !_al_class_table_one_run(c))
        _al_config_expand(c);
    a->config = c;
}
