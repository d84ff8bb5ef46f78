/* Libraries the program unloads: the sampled frames in their code keep their names.
 *
 * The sampler keeps return addresses and names them at exit (symbols.c), from what is mapped
 * then. A library the program dlclosed is gone by then, and another may have been loaded where
 * it was: its frames read as bare addresses or as the other library's functions. So around each
 * dlclose (interpose/dlclose.c) the objects that were loaded before and are not after have the
 * sites' frames in their code moved to addresses of their own, in a range no process has
 * (from AL_UNLOADED_BASE, AL_UNLOADED_SPAN per file): a frame at offset X of the file's load
 * bias becomes AL_UNLOADED_BASE + k * AL_UNLOADED_SPAN + X, the k-th unloaded file's. The
 * symbolizer is told where each such file is (its path and fake bias) and names its frames from
 * the file, if it is still the file it was (path, device, inode, size and modification time;
 * else the frames are named after the file and their offset only). A file loaded and unloaded
 * again gets the same k: its frames of every load are the same addresses. */
#include <limits.h>
#include <link.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "profiler.h"
#include "sampler.h"

#define PAGE_MASK_LOW ((uintptr_t)4095) /* x86-64 pages */

/* An object as dl_iterate_phdr saw it before the dlclose: its code's bounds, name copied. */
struct object {
    uintptr_t bias, lo, hi; /* code in [lo, hi) */
    uintptr_t offset;       /* the file offset of lo */
    size_t name_at;         /* in the snapshot's names */
};

struct al_objects {
    size_t bytes;           /* of this mapping */
    unsigned long long subs; /* objects unloaded so far in the process, when taken */
    size_t n, cap, names_len, names_cap;
    struct object *o;
    char *names;
};

/* Static, not mapped as they come: a mapping made at the dlclose would most likely take the
 * place the library left, where the next one loaded would have gone without us. */
static struct al_unloaded files[AL_UNLOADED_MAX] AL_LARGE_BSS;
static _Atomic unsigned nfiles;
static char paths[1 << 16] AL_LARGE_BSS;
static size_t paths_len;

struct walk {
    struct al_objects *s; /* NULL: only count */
    size_t n, names_len;
    unsigned long long subs;
};

/* The executable segments' bounds, page-aligned; false for an object without code. */
static bool code_of(const struct dl_phdr_info *info, uintptr_t *lo, uintptr_t *hi, uintptr_t *off)
{
    *lo = UINTPTR_MAX;
    *hi = 0;
    for (unsigned i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) *p = &info->dlpi_phdr[i];
        if (p->p_type != PT_LOAD || !(p->p_flags & PF_X))
            continue;
        uintptr_t a = (info->dlpi_addr + p->p_vaddr) & ~PAGE_MASK_LOW;
        if (a < *lo) {
            *lo = a;
            *off = p->p_offset & ~PAGE_MASK_LOW;
        }
        uintptr_t b = info->dlpi_addr + p->p_vaddr + p->p_memsz;
        if (b > *hi)
            *hi = b;
    }
    return *lo < *hi;
}

static int take(struct dl_phdr_info *info, size_t size, void *arg)
{
    struct walk *w = arg;
    w->subs = size >= offsetof(struct dl_phdr_info, dlpi_subs) + sizeof info->dlpi_subs ? info->dlpi_subs : 0;
    const char *name = info->dlpi_name;
    uintptr_t lo, hi, off;
    if (!name || !name[0] || !code_of(info, &lo, &hi, &off)) /* the main program: never unloaded */
        return 0;
    size_t len = strlen(name) + 1;
    struct al_objects *s = w->s;
    if (s) {
        if (s->n == s->cap || s->names_len + len > s->names_cap)
            return 1; /* loaded since it was counted: past the room, left out */
        s->o[s->n++] = (struct object){ .bias = info->dlpi_addr, .lo = lo, .hi = hi, .offset = off,
                                        .name_at = s->names_len };
        memcpy(s->names + s->names_len, name, len);
        s->names_len += len;
    }
    w->n++;
    w->names_len += len;
    return 0;
}

struct al_objects *_al_unloaded_before(void)
{
    if (!_al_sampler.enabled || _al_sampler.nsites == 0)
        return NULL; /* no frame to keep */
    struct walk w = { 0 };
    dl_iterate_phdr(take, &w);
    /* Room for a few loaded meanwhile (by another thread). */
    size_t cap = w.n + 16, names_cap = w.names_len + 16 * 256;
    size_t bytes = sizeof(struct al_objects) + cap * sizeof(struct object) + names_cap;
    struct al_objects *s = _al_mem_map(bytes);
    if (!s)
        return NULL;
    *s = (struct al_objects){ .bytes = bytes, .cap = cap, .names_cap = names_cap };
    s->o = (struct object *)(s + 1);
    s->names = (char *)(s->o + cap);
    w = (struct walk){ .s = s };
    dl_iterate_phdr(take, &w);
    s->subs = w.subs;
    return s;
}

static int still(struct dl_phdr_info *info, size_t size, void *arg)
{
    (void)size;
    const struct object *o = arg;
    uintptr_t lo, hi, off;
    return info->dlpi_addr == o->bias && code_of(info, &lo, &hi, &off) && lo == o->lo;
}

static int subs_now(struct dl_phdr_info *info, size_t size, void *arg)
{
    *(unsigned long long *)arg =
        size >= offsetof(struct dl_phdr_info, dlpi_subs) + sizeof info->dlpi_subs ? info->dlpi_subs : 0;
    return 1;
}

/* The index of the file at PATH among those unloaded, made if it is new; AL_UNLOADED_MAX when
 * the table is full. */
static unsigned file_of(const char *path, const struct object *o)
{
    /* A path relative to the directory the program was in at the dlopen (a dlopen of
     * "./x.so"): made whole now, while it most likely still is in it. */
    static char whole[PATH_MAX];
    if (path[0] != '/' && realpath(path, whole))
        path = whole;
    struct stat st = { 0 };
    if (stat(path, &st) != 0)
        memset(&st, 0, sizeof st);
    uint64_t mtime_ns = (uint64_t)st.st_mtim.tv_sec * 1000000000u + (uint64_t)st.st_mtim.tv_nsec;
    unsigned n = atomic_load(&nfiles);
    for (unsigned k = 0; k < n; k++)
        if (files[k].dev == st.st_dev && files[k].ino == st.st_ino && files[k].size == (uint64_t)st.st_size &&
            files[k].mtime_ns == mtime_ns && !strcmp(files[k].path, path))
            return k;
    size_t len = strlen(path) + 1;
    if (n == AL_UNLOADED_MAX || len > sizeof paths - paths_len)
        return AL_UNLOADED_MAX;
    char *copy = memcpy(paths + paths_len, path, len);
    paths_len += len;
    files[n] = (struct al_unloaded){
        .path = copy, .dev = st.st_dev, .ino = st.st_ino, .size = (uint64_t)st.st_size, .mtime_ns = mtime_ns,
        .bias = AL_UNLOADED_BASE + (uintptr_t)n * AL_UNLOADED_SPAN,
        .lo = o->lo - o->bias, .hi = o->hi - o->bias, .offset = o->offset };
    atomic_store(&nfiles, n + 1);
    return n;
}

/* Sampler lock held: the sites' frames in O's code moved to file K's addresses; whether any was
 * there (K is made only then). */
static void move_frames(const struct al_objects *s, const struct object *o)
{
    unsigned k = AL_UNLOADED_MAX;
    for (uint32_t i = 0; i < _al_sampler.nsites; i++) {
        struct al_site *st = _al_site(i);
        for (uint32_t f = 0; f < st->nframes; f++) {
            uintptr_t pc = st->frames[f];
            if (pc - 1 < o->lo || pc - 1 >= o->hi)
                continue;
            if (k == AL_UNLOADED_MAX && (k = file_of(s->names + o->name_at, o)) == AL_UNLOADED_MAX)
                return;
            st->frames[f] = files[k].bias + (pc - o->bias);
        }
    }
}

void _al_unloaded_after(struct al_objects *s)
{
    if (!s)
        return;
    unsigned long long subs = s->subs;
    dl_iterate_phdr(subs_now, &subs);
    if (subs != s->subs) { /* something was unloaded */
        /* Which, before the sampler's lock is taken: the loader's is not taken under it. */
        size_t gone = 0;
        for (size_t i = 0; i < s->n; i++)
            if (!dl_iterate_phdr(still, &s->o[i]))
                s->o[gone++] = s->o[i];
        bool took = _al_sampler_lock();
        for (size_t i = 0; i < gone; i++)
            move_frames(s, &s->o[i]);
        _al_sampler_unlock(took);
    }
    _al_mem_unmap(s, s->bytes);
}

bool _al_unloaded_same_file(const struct al_unloaded *u)
{
    struct stat st;
    return stat(u->path, &st) == 0 && (uint64_t)st.st_dev == u->dev && (uint64_t)st.st_ino == u->ino &&
           (uint64_t)st.st_size == u->size &&
           (uint64_t)st.st_mtim.tv_sec * 1000000000u + (uint64_t)st.st_mtim.tv_nsec == u->mtime_ns;
}

unsigned _al_unloaded_count(void)
{
    return atomic_load(&nfiles);
}

const struct al_unloaded *_al_unloaded_file(unsigned k)
{
    return &files[k];
}

const struct al_unloaded *_al_unloaded_of(uintptr_t pc)
{
    if (pc < AL_UNLOADED_BASE)
        return NULL;
    uintptr_t k = (pc - AL_UNLOADED_BASE) / AL_UNLOADED_SPAN;
    return k < atomic_load(&nfiles) ? &files[k] : NULL;
}
