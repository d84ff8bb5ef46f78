/* The bootstrap pool. Resolving the real allocator with dlsym can itself allocate (dlerror's
 * message when an optional symbol is missing); those calls arrive before there is anything to
 * forward them to. They are served from this static pool, which never reaches the real
 * allocator: free ignores pool pointers, realloc of one copies it into real memory. Running
 * out means something unexpected is allocating during start-up: say so and abort, rather
 * than hand out memory we cannot account for. */
#include <string.h>
#include <unistd.h>
#include <stdlib.h>

#include "interpose.h"

#define ALIGN 16

struct pool_header {
    size_t size;
    size_t pad;
};

char _al_bootstrap_pool[AL_BOOTSTRAP_POOL_SIZE] __attribute__((aligned(ALIGN)));
static _Atomic size_t pool_used;

void *_al_bootstrap_alloc(size_t size)
{
    size_t need = sizeof(struct pool_header) + ((size + ALIGN - 1) & ~(size_t)(ALIGN - 1));
    if (size > AL_BOOTSTRAP_POOL_SIZE)
        need = AL_BOOTSTRAP_POOL_SIZE + 1;
    size_t off = atomic_fetch_add(&pool_used, need);
    if (off + need > AL_BOOTSTRAP_POOL_SIZE) {
        static const char msg[] = "alloclens: bootstrap pool exhausted during start-up; aborting\n";
        (void)!write(STDERR_FILENO, msg, sizeof msg - 1);
        abort();
    }
    struct pool_header *h = (struct pool_header *)(_al_bootstrap_pool + off);
    h->size = size;
    return h + 1; /* the pool is static, hence already zeroed: calloc needs nothing more */
}

size_t _al_bootstrap_usable_size(const void *p)
{
    return ((const struct pool_header *)p - 1)->size;
}

void *_al_bootstrap_realloc(void *p, size_t size)
{
    size_t old = _al_bootstrap_usable_size(p);
    void *n = _al_real.malloc ? _al_real.malloc(size) : _al_bootstrap_alloc(size);
    if (n && size)
        memcpy(n, p, old < size ? old : size);
    return n;
}
