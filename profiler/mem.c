/* The profiler's own memory. It never comes from the allocator being measured (that would
 * distort the numbers and can recurse): page-sized blocks come straight from mmap, small
 * objects from a lock-free bump arena carved out of mmap'd chunks and never freed. */
#include <sys/mman.h>

#include "profiler.h"

#define ARENA_CHUNK (1u << 20)

static _Atomic size_t mapped_bytes;

struct arena_chunk {
    _Atomic size_t used;
    char data[];
};

static _Atomic(struct arena_chunk *) arena_cur;

void *_al_mem_map(size_t size)
{
    void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED)
        return NULL;
    atomic_fetch_add_explicit(&mapped_bytes, size, memory_order_relaxed);
    return p;
}

void _al_mem_unmap(void *p, size_t size)
{
    if (p && munmap(p, size) == 0)
        atomic_fetch_sub_explicit(&mapped_bytes, size, memory_order_relaxed);
}

void *_al_mem_alloc(size_t size)
{
    size = (size + 15) & ~(size_t)15;
    if (size > ARENA_CHUNK / 4)
        return _al_mem_map(size);
    for (;;) {
        struct arena_chunk *c = atomic_load_explicit(&arena_cur, memory_order_acquire);
        if (c) {
            size_t off = atomic_fetch_add_explicit(&c->used, size, memory_order_relaxed);
            if (off + size <= ARENA_CHUNK - sizeof(struct arena_chunk))
                return c->data + off;
        }
        /* Full or none yet: install a fresh chunk; a thread that loses the race unmaps its own. */
        struct arena_chunk *n = _al_mem_map(ARENA_CHUNK);
        if (!n)
            return NULL;
        if (!atomic_compare_exchange_strong(&arena_cur, &c, n))
            _al_mem_unmap(n, ARENA_CHUNK);
    }
}

size_t _al_mem_footprint(void)
{
    return atomic_load_explicit(&mapped_bytes, memory_order_relaxed);
}
