// host_throw: C++ operator new failing by throwing std::bad_alloc through alloclens's wrappers,
// caught by the program, which then carries on allocating.
//
// The main thread and then a second thread each ask every throwing operator new (plain, array,
// align_val_t, aligned array) for more memory than any machine has, ROUNDS times each: first
// with no new-handler (the C++ runtime or the allocator throws), then with a handler that
// throws bad_alloc itself. After that each thread makes VALLOCS valloc+free pairs. On stdout,
// one line of its own truth:
//
//   threw=N valloc=N handled=N
//
// The test checks the report against it: N failed operator new calls (large, address n/a), and
// every valloc counted (a call after an exception unwound through the wrappers must still be
// counted: before the wrappers had cleanups, none was, and the program threw fewer times).
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
#include <new>
#include <pthread.h>

namespace {

constexpr int ROUNDS = 8;
constexpr int VALLOCS = 1000;
constexpr size_t HUGE_REQUEST = SIZE_MAX / 4;

int handled;

void throwing_handler()
{
    __atomic_fetch_add(&handled, 1, __ATOMIC_RELAXED);
    throw std::bad_alloc();
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

int throws_then_work()
{
    int threw = 0;
    for (int r = 0; r < ROUNDS; r++)
        for (int k = 0; k < 4; k++)
            threw += try_new(k);
    for (int i = 0; i < VALLOCS; i++) {
        void *p = valloc(100);
        if (!p)
            std::exit(4);
        *static_cast<volatile char *>(p) = 1;
        free(p);
    }
    return threw;
}

void *thread_main(void *arg)
{
    *static_cast<int *>(arg) = throws_then_work();
    return nullptr;
}

int run_both()
{
    int threw = throws_then_work();
    int in_thread = 0;
    pthread_t tid;
    if (pthread_create(&tid, nullptr, thread_main, &in_thread) || pthread_join(tid, nullptr))
        std::exit(5);
    return threw + in_thread;
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
    std::printf("threw=%d valloc=%d handled=%d\n", threw, 4 * VALLOCS, handled);
    return 0;
}
