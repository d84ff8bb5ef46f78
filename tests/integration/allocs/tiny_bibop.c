/* tiny_bibop: a deliberately small BiBOP ("big bag of pages") allocator for the prerun tests.
 *
 * Every size class lives in bags of its own: 64 KiB mappings, aligned to 64 KiB, with a
 * 16-byte header at the bag start and objects packed at exactly class-size strides after it,
 * carved in ascending address order; a LIFO free list per class. The class of a small object is
 * found from its bag (address rounded down to 64 KiB), so small objects carry no header.
 * The classes are odd on purpose (24, 72, 200, 1000, 2992), so that a probe which assumes the
 * classes of a known allocator, or 16-byte steps, gets them wrong.
 *
 * Requests of LARGE_THRESHOLD bytes and more (and every alignment above 8) get a mapping of
 * their own: a header page (or ALIGN bytes, if larger) and the object, page-granular; the
 * mapping is again 64 KiB-aligned, so free() finds its header the same way. Usable size of a
 * large object = mapping size - header.
 *
 * Thread safety: one spinlock around the class state; fork-safe through pthread_atfork.
 * Exports the malloc family (no operator new: libstdc++'s calls malloc), and
 * tiny_bibop_truth() for the truth program.
 */
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define EXPORT __attribute__((visibility("default")))

#define BAG_SIZE ((size_t)65536)
#define BAG_MASK (~(uintptr_t)(BAG_SIZE - 1))
#define OS_PAGE ((size_t)4096)
#define MAGIC_SMALL 0x7462736du /* "tbsm" */
#define MAGIC_LARGE 0x74626c67u /* "tblg" */
#define NCLASSES 5
#define LARGE_THRESHOLD ((size_t)2993)
#define MAX_ALIGN ((size_t)32768) /* the header must sit in the same 64 KiB as the object */

static const size_t class_size[NCLASSES] = {24, 72, 200, 1000, 2992};

struct bag_header {
    uint32_t magic;
    uint32_t cls;        /* small: class index */
    size_t map_len;      /* large: length of the mapping; small: BAG_SIZE */
};
/* The first object starts right after the header, rounded up to 8. */
#define FIRST_OBJECT ((sizeof(struct bag_header) + 7) & ~(size_t)7)
/* Large: where the object starts inside its mapping (page-granular, at least one page). */
struct large_header {
    struct bag_header h;
    size_t offset;
};

struct class_state {
    void *free_list;     /* LIFO, next pointer in the object's first word */
    char *bump, *end;    /* the current bag's uncarved part, ascending */
};

static struct class_state classes[NCLASSES];
static atomic_flag lock = ATOMIC_FLAG_INIT;

static void lock_take(void)
{
    unsigned spins = 0;
    while (atomic_flag_test_and_set_explicit(&lock, memory_order_acquire)) {
        if (++spins >= 64) {
            spins = 0;
            sched_yield();
        }
    }
}

static void lock_give(void)
{
    atomic_flag_clear_explicit(&lock, memory_order_release);
}

__attribute__((constructor)) static void tiny_bibop_init(void)
{
    /* fork: the child must not inherit a lock held by another thread */
    pthread_atfork(lock_take, lock_give, lock_give);
}

static int class_of(size_t n)
{
    for (int i = 0; i < NCLASSES; i++)
        if (n <= class_size[i])
            return i;
    return -1;
}

/* A mapping of LEN bytes (a multiple of OS_PAGE) whose start is aligned to BAG_SIZE. */
static char *map_aligned(size_t len)
{
    size_t over = len + BAG_SIZE;
    if (over < len)
        return NULL;
    char *raw = mmap(NULL, over, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (raw == MAP_FAILED)
        return NULL;
    char *start = (char *)(((uintptr_t)raw + BAG_SIZE - 1) & BAG_MASK);
    if (start > raw)
        munmap(raw, (size_t)(start - raw));
    char *tail = start + len, *raw_end = raw + over;
    if (raw_end > tail)
        munmap(tail, (size_t)(raw_end - tail));
    return start;
}

static void *small_alloc(int c)
{
    struct class_state *s = &classes[c];
    void *p;
    lock_take();
    if (s->free_list) {
        p = s->free_list;
        s->free_list = *(void **)p;
    } else {
        if (!s->bump || (size_t)(s->end - s->bump) < class_size[c]) {
            char *bag = map_aligned(BAG_SIZE);
            if (!bag) {
                lock_give();
                errno = ENOMEM;
                return NULL;
            }
            struct bag_header *h = (struct bag_header *)bag;
            h->magic = MAGIC_SMALL;
            h->cls = (uint32_t)c;
            h->map_len = BAG_SIZE;
            s->bump = bag + FIRST_OBJECT;
            s->end = bag + BAG_SIZE;
        }
        p = s->bump;
        s->bump += class_size[c];
    }
    lock_give();
    return p;
}

static void *large_alloc(size_t n, size_t align)
{
    size_t off = align > OS_PAGE ? align : OS_PAGE;
    if (off > MAX_ALIGN) {
        errno = ENOMEM;
        return NULL;
    }
    if (n > SIZE_MAX - off - BAG_SIZE - OS_PAGE) {
        errno = ENOMEM;
        return NULL;
    }
    size_t body = (n + OS_PAGE - 1) & ~(OS_PAGE - 1);
    if (body == 0)
        body = OS_PAGE;
    size_t len = body + off;
    char *m = map_aligned(len);
    if (!m) {
        errno = ENOMEM;
        return NULL;
    }
    struct large_header *h = (struct large_header *)m;
    h->h.magic = MAGIC_LARGE;
    h->h.cls = 0;
    h->h.map_len = len;
    h->offset = off;
    return m + off;
}

static struct bag_header *header_of(const void *p)
{
    return (struct bag_header *)((uintptr_t)p & BAG_MASK);
}

EXPORT void *malloc(size_t n)
{
    int c = class_of(n);
    return c >= 0 ? small_alloc(c) : large_alloc(n, 0);
}

EXPORT void free(void *p)
{
    if (!p)
        return;
    struct bag_header *h = header_of(p);
    if (h->magic == MAGIC_SMALL) {
        struct class_state *s = &classes[h->cls];
        lock_take();
        *(void **)p = s->free_list;
        s->free_list = p;
        lock_give();
    } else if (h->magic == MAGIC_LARGE) {
        munmap(h, h->map_len);
    }
    /* anything else is not ours: leak it rather than crash */
}

EXPORT size_t malloc_usable_size(void *p)
{
    if (!p)
        return 0;
    struct bag_header *h = header_of(p);
    if (h->magic == MAGIC_SMALL)
        return class_size[h->cls];
    if (h->magic == MAGIC_LARGE)
        return h->map_len - ((struct large_header *)h)->offset;
    return 0;
}

EXPORT void *calloc(size_t nmemb, size_t size)
{
    size_t n;
    if (__builtin_mul_overflow(nmemb, size, &n)) {
        errno = ENOMEM;
        return NULL;
    }
    int c = class_of(n);
    if (c < 0)
        return large_alloc(n, 0);   /* fresh mapping: already zero */
    void *p = small_alloc(c);
    if (p)
        memset(p, 0, class_size[c]);
    return p;
}

EXPORT void *realloc(void *p, size_t n)
{
    if (!p)
        return malloc(n);
    if (n == 0) {
        free(p);
        return NULL;
    }
    struct bag_header *h = header_of(p);
    size_t old = malloc_usable_size(p);
    if (h->magic == MAGIC_SMALL && class_of(n) == (int)h->cls)
        return p;
    if (h->magic == MAGIC_LARGE && class_of(n) < 0 && n <= old && old - n < OS_PAGE)
        return p;
    void *q = malloc(n);
    if (!q)
        return NULL;
    memcpy(q, p, old < n ? old : n);
    free(p);
    return q;
}

static void *aligned(size_t align, size_t n)
{
    if (align <= 8)
        return malloc(n);
    return large_alloc(n, align);
}

EXPORT int posix_memalign(void **memptr, size_t align, size_t n)
{
    if (align == 0 || (align & (align - 1)) || align % sizeof(void *))
        return EINVAL;
    int saved = errno;
    void *p = aligned(align, n);
    if (!p) {
        errno = saved;
        return ENOMEM;
    }
    *memptr = p;
    return 0;
}

EXPORT void *aligned_alloc(size_t align, size_t n)
{
    if (align == 0 || (align & (align - 1))) {
        errno = EINVAL;
        return NULL;
    }
    return aligned(align, n);
}

EXPORT void *memalign(size_t align, size_t n)
{
    if (align & (align - 1)) {    /* like glibc: round up to a power of two */
        size_t a = 1;
        while (a < align && a)
            a <<= 1;
        if (!a) {
            errno = EINVAL;
            return NULL;
        }
        align = a;
    }
    return aligned(align, n);
}

EXPORT void *valloc(size_t n)
{
    return aligned(OS_PAGE, n);
}

EXPORT void *pvalloc(size_t n)
{
    if (n > SIZE_MAX - OS_PAGE) {
        errno = ENOMEM;
        return NULL;
    }
    return aligned(OS_PAGE, n ? (n + OS_PAGE - 1) & ~(OS_PAGE - 1) : OS_PAGE);
}

/* The allocator's own account of itself, for alloc_truth only. */
EXPORT void tiny_bibop_truth(int *nclasses, const size_t **sizes, size_t *threshold)
{
    *nclasses = NCLASSES;
    *sizes = class_size;
    *threshold = LARGE_THRESHOLD;
}
