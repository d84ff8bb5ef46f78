// host_throw: C++ operator new failing by throwing std::bad_alloc through alloclens's wrappers,
// caught by the program, which then carries on allocating.
//
// The main thread and then a second thread each ask every throwing operator new (plain, array,
// align_val_t, aligned array) for more memory than any machine has, ROUNDS times each: first
// with no new-handler (the C++ runtime or the allocator throws), then with a handler that
// throws bad_alloc itself, then with one that allocates (a valloc and an operator new of its
// own, each freed) HELPS times before it gives up, so that the call throws. After each round
// each thread makes VALLOCS valloc+free pairs. On stdout, one line of its own truth:
//
//   threw=N valloc=N handled=N parallel_new=N aligned=K/M
//
// The test checks the report against it: N failed operator new calls (large, address n/a), and
// every valloc counted (a call after an exception unwound through the wrappers must still be
// counted: before the wrappers had cleanups, none was, and the program threw fewer times), the
// new-handler's too (they are the program's calls, made inside its operator new), and the
// handler's operator new calls: parallel_new is how many the second thread's handler made, the
// only small ones while two threads live (counted alone: tcmalloc's own start-up makes some
// before main). aligned: of M aligned operator new calls, K got at least
// their size rounded up to a multiple of the alignment, as libstdc++ asks for it (the same
// with and without alloclens: stdout is compared).
//
// mimalloc, built as C, aborts when a throwing operator new fails, whatever the handler: under
// it the program says so and throws nothing, the same with and without alloclens.
//
// Built with HOST_THROW_PLUGIN, the same is a library for host_throw_late.c, a C program that
// loads it (and with it the C++ runtime) with dlopen after alloclens has started: its entry
// point host_throw_run() does what main() does here.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <dlfcn.h>
#include <initializer_list>
#include <malloc.h>
#include <new>
#include <pthread.h>

namespace {

constexpr int ROUNDS = 8;
constexpr int VALLOCS = 1000;
constexpr size_t HUGE_REQUEST = SIZE_MAX / 4;

constexpr int HELPS = 3;

int handled, helped_vallocs, parallel_news;
thread_local int helps, helped_news;

void throwing_handler()
{
    __atomic_fetch_add(&handled, 1, __ATOMIC_RELAXED);
    throw std::bad_alloc();
}

// Allocates and frees, then gives up after HELPS calls for the same request: no handler is
// left, and the runtime or the allocator throws bad_alloc. The caller sets it again.
void allocating_handler()
{
    void *p = valloc(100);
    void *q = ::operator new(48);
    if (!p)
        std::exit(6);
    *static_cast<volatile char *>(p) = 1;
    *static_cast<volatile char *>(q) = 1;
    free(p);
    ::operator delete(q);
    __atomic_fetch_add(&helped_vallocs, 1, __ATOMIC_RELAXED);
    helped_news++;
    if (++helps == HELPS)
        std::set_new_handler(nullptr);
}

// One throwing operator new of kind K; returns 1 when it threw bad_alloc.
int try_new(int k)
{
    void *p = nullptr;
    try {
        switch (k) {
        case 0: p = ::operator new(HUGE_REQUEST); break;
        case 1: p = ::operator new[](HUGE_REQUEST); break;
        case 2: p = ::operator new(HUGE_REQUEST, std::align_val_t(64)); break;
        default: p = ::operator new[](HUGE_REQUEST, std::align_val_t(64)); break;
        }
    } catch (const std::bad_alloc &) {
        return 1;
    }
    std::fprintf(stderr, "host_throw: operator new of %zu bytes returned %p\n", HUGE_REQUEST, p);
    std::exit(3);
}

int throws_then_work(bool allocating_handler_on)
{
    int threw = 0;
    for (int r = 0; r < ROUNDS; r++)
        for (int k = 0; k < 4; k++) {
            if (allocating_handler_on) {
                helps = 0;
                std::set_new_handler(allocating_handler);
            }
            threw += try_new(k);
        }
    for (int i = 0; i < VALLOCS; i++) {
        void *p = valloc(100);
        if (!p)
            std::exit(4);
        *static_cast<volatile char *>(p) = 1;
        free(p);
    }
    return threw;
}

bool allocating_round;

void *thread_main(void *arg)
{
    *static_cast<int *>(arg) = throws_then_work(allocating_round);
    parallel_news += helped_news;
    return nullptr;
}

int run_both()
{
    int threw = throws_then_work(allocating_round);
    int in_thread = 0;
    pthread_t tid;
    if (pthread_create(&tid, nullptr, thread_main, &in_thread) || pthread_join(tid, nullptr))
        std::exit(5);
    return threw + in_thread;
}

// Aligned operator new calls whose block holds their size rounded up to the alignment.
int aligned_rounded(int *calls)
{
    int rounded = 0;
    for (size_t a = 16; a <= 4096; a *= 4)
        for (size_t n : { size_t(1), size_t(17), a + 1, 3 * a - 5 }) {
            void *p = ::operator new(n, std::align_val_t(a));
            rounded += malloc_usable_size(p) >= ((n + a - 1) & ~(a - 1));
            ++*calls;
            ::operator delete(p, std::align_val_t(a));
        }
    return rounded;
}

}  // namespace

#ifdef HOST_THROW_PLUGIN
extern "C" __attribute__((visibility("default"))) int host_throw_run()
#else
int main()
#endif
{
    if (dlsym(RTLD_DEFAULT, "mi_version")) {
        std::printf("mimalloc aborts on a failed throwing operator new: nothing thrown\n");
        return 0;
    }
    int threw = run_both();
    std::set_new_handler(throwing_handler);
    threw += run_both();
    std::set_new_handler(nullptr);
    allocating_round = true;
    threw += run_both();
    int aligned_calls = 0, aligned = aligned_rounded(&aligned_calls);
    std::printf("threw=%d valloc=%d handled=%d parallel_new=%d aligned=%d/%d\n", threw,
                6 * VALLOCS + helped_vallocs, handled, parallel_news, aligned, aligned_calls);
    return 0;
}
