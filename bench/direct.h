/* bench/direct: an allocator's own malloc family, past anything interposed in front of it.
 *
 * The benchmarks time the calls a program makes through its symbols (which LD_PRELOAD may have
 * put alloclens in front of) beside the same calls made straight to the allocator, in turns
 * within one process, so that a slow moment of a shared machine falls on both alike. */
#ifndef ALLOCLENS_BENCH_DIRECT_H
#define ALLOCLENS_BENCH_DIRECT_H

#include <stddef.h>

struct bench_fns {
    void *(*malloc)(size_t);
    void *(*calloc)(size_t, size_t);
    void *(*realloc)(void *, size_t);
    void (*free)(void *);
};

/* The program's own symbols: whatever is interposed in front of the allocator. */
extern const struct bench_fns bench_symbols;

/* LIB's own functions (LIB: an allocator library the process has loaded already, libc.so.6 or
 * the one preloaded), each looked up in LIB itself; 0, or -1 after a line on stderr naming
 * PROG and what is wrong. */
int bench_direct(const char *prog, const char *lib, struct bench_fns *out);

#endif
