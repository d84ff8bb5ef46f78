// exact_counts_cxx: the C++ twin of exact_counts.c. Makes exactly known numbers of operator new
// and operator delete calls (every variant: plain, array, nothrow, align_val_t, and the plain,
// sized, array, aligned and nothrow deletes), from a serial part (main thread only) and a
// parallel part (T threads + main, all alive), and prints its own truth on stdout:
//
//   {"truth":[{"op":"new","size_class":"small","reuse":"new","phase":"serial","count":N},...]}
//
// Every operator new variant counts as "new", every operator delete variant as "delete". The
// truth covers only this program's own calls; the test compares it with the difference of the
// reports of a --scale 0 and a --scale 1 run. As in the C program: a warm-up creates and joins
// the threads first, no iostream/stdio until the end (snprintf + write(2)), threads through
// pthread (std::thread would allocate its state with new), no heap memory for bookkeeping.
//
// usage: exact_counts_cxx [--scale N] [--threads T] [--large-threshold BYTES]
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <pthread.h>
#include <unistd.h>

namespace {

enum Op { OP_NEW, OP_DELETE, OP_COUNT };
const char *const op_names[OP_COUNT] = { "new", "delete" };
enum { SC_SMALL, SC_LARGE };
enum { RU_NEW, RU_REUSED, RU_NA };
enum { PH_SERIAL, PH_PARALLEL };
const char *const sc_names[] = { "small", "large" };
const char *const ru_names[] = { "new", "reused", "n/a" };
const char *const ph_names[] = { "serial", "parallel" };

unsigned long truth[OP_COUNT][2][3][2];
size_t large_threshold = 131072;
thread_local int cur_phase = PH_SERIAL;  // trivially constructed: static TLS, no allocation

// ---- every address any of our calls got back: lock-free open-addressing set (static) ----
constexpr unsigned SEEN_BITS = 20;
constexpr uint32_t SEEN_SLOTS = 1u << SEEN_BITS;
uintptr_t seen[SEEN_SLOTS];

// Inserts P; returns true when it was there already.
bool seen_insert(void *p)
{
    uintptr_t a = reinterpret_cast<uintptr_t>(p);
    uint64_t h = (static_cast<uint64_t>(a) * 0x9E3779B97F4A7C15ull) >> (64 - SEEN_BITS);
    for (uint32_t i = 0; i < SEEN_SLOTS; i++) {
        uintptr_t *slot = &seen[(h + i) & (SEEN_SLOTS - 1)];
        uintptr_t cur = __atomic_load_n(slot, __ATOMIC_ACQUIRE);
        if (cur == a)
            return true;
        if (cur == 0) {
            uintptr_t expect = 0;
            if (__atomic_compare_exchange_n(slot, &expect, a, false, __ATOMIC_ACQ_REL,
                                            __ATOMIC_ACQUIRE))
                return false;
            if (expect == a)
                return true;
        }
    }
    static const char msg[] = "exact_counts_cxx: address set full\n";
    (void)!write(2, msg, sizeof msg - 1);
    _exit(99);
}

int size_class(size_t n) { return n >= large_threshold ? SC_LARGE : SC_SMALL; }

void count(int op, int sc, int ru)
{
    __atomic_fetch_add(&truth[op][sc][ru][cur_phase], 1, __ATOMIC_RELAXED);
}

inline void sink(void *p)
{
    if (p)
        *static_cast<volatile char *>(p) = 1;
    __asm__ volatile("" : : "r"(p) : "memory");
}

void *note_new(size_t n, void *p)
{
    count(OP_NEW, size_class(n), p ? (seen_insert(p) ? RU_REUSED : RU_NEW) : RU_NA);
    sink(p);
    return p;
}

struct Rng {
    uint64_t s;
    uint32_t next()
    {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        return static_cast<uint32_t>(s >> 33);
    }
};

constexpr size_t LARGE_SIZE = 1u << 20;  // 1 MiB

size_t small_size(Rng &r)
{
    switch (r.next() % 4) {
    case 0: return 1 + r.next() % 64;
    case 1: return 1 + r.next() % 512;
    case 2: return 1 + r.next() % 4096;
    default: return 1 + r.next() % 16384;
    }
}

size_t any_size(Rng &r)
{
    return r.next() % 128 == 0 ? LARGE_SIZE + r.next() % 65536 : small_size(r);
}

// An object made by one of the operator new variants; `array` and `align` pick the matching
// delete family.
struct Obj {
    void *p = nullptr;
    size_t n = 0;
    size_t align = 0;  // 0: not an align_val_t new
    bool array = false;
};

void make(Obj &o, Rng &r)
{
    size_t n = any_size(r);
    size_t al = 0;
    void *p = nullptr;
    unsigned kind = r.next() % 8;
    bool array = kind % 2 == 1;
    if (kind >= 4) {
        static const size_t aligns[] = { 32, 64, 128, 256, 4096 };
        al = aligns[r.next() % 5];
    }
    switch (kind) {
    case 0: p = ::operator new(n); break;
    case 1: p = ::operator new[](n); break;
    case 2: p = ::operator new(n, std::nothrow); break;
    case 3: p = ::operator new[](n, std::nothrow); break;
    case 4: p = ::operator new(n, std::align_val_t(al)); break;
    case 5: p = ::operator new[](n, std::align_val_t(al)); break;
    case 6: p = ::operator new(n, std::align_val_t(al), std::nothrow); break;
    default: p = ::operator new[](n, std::align_val_t(al), std::nothrow); break;
    }
    note_new(n, p);
    o.p = p;
    o.n = p ? n : 0;
    o.align = al;
    o.array = array;
}

// Frees O with one of the deletes that match how it was made: plain, sized or nothrow.
void destroy(Obj &o, Rng &r)
{
    unsigned how = r.next() % 3;
    void *p = o.p;
    size_t n = o.n;
    std::align_val_t al = std::align_val_t(o.align);
    if (o.align == 0 && !o.array) {
        if (how == 0) ::operator delete(p);
        else if (how == 1) ::operator delete(p, n);
        else ::operator delete(p, std::nothrow);
    } else if (o.align == 0) {
        if (how == 0) ::operator delete[](p);
        else if (how == 1) ::operator delete[](p, n);
        else ::operator delete[](p, std::nothrow);
    } else if (!o.array) {
        if (how == 0) ::operator delete(p, al);
        else if (how == 1) ::operator delete(p, n, al);
        else ::operator delete(p, al, std::nothrow);
    } else {
        if (how == 0) ::operator delete[](p, al);
        else if (how == 1) ::operator delete[](p, n, al);
        else ::operator delete[](p, al, std::nothrow);
    }
    count(OP_DELETE, size_class(n), RU_NA);
    o = Obj();
}

// A fixed, seeded sequence of STEPS random operations on NSLOT slots, then everything deleted.
void churn(uint64_t seed, long steps, Obj *slots, int nslot)
{
    Rng r{ seed };
    for (long s = 0; s < steps; s++) {
        Obj &o = slots[r.next() % static_cast<unsigned>(nslot)];
        if (!o.p) {
            make(o, r);
            continue;
        }
        if (r.next() % 3)
            destroy(o, r);
        else {
            destroy(o, r);
            make(o, r);
        }
    }
    for (int i = 0; i < nslot; i++)
        if (slots[i].p)
            destroy(slots[i], r);
}

// LIFO new/delete of one size: the pattern whose addresses every allocator reuses.
void lifo(int rounds, int depth, size_t size)
{
    void *stack[64];
    for (int round = 0; round < rounds; round++) {
        for (int i = 0; i < depth; i++)
            stack[i] = note_new(size, ::operator new(size));
        for (int i = depth - 1; i >= 0; i--) {
            ::operator delete(stack[i], size);
            count(OP_DELETE, size_class(size), RU_NA);
        }
    }
}

// Deleting a null pointer is still a delete call (size class small).
void delete_nulls(int n)
{
    for (int i = 0; i < n; i++) {
        void *volatile p = nullptr;
        if (i % 2)
            ::operator delete(p);
        else
            ::operator delete[](p);
        count(OP_DELETE, SC_SMALL, RU_NA);
    }
}

// ---------------------------------- threads ----------------------------------
constexpr int MAX_THREADS = 16;
constexpr int SERIAL_SLOTS = 256;
constexpr int THREAD_SLOTS = 128;
constexpr int HANDOFF = 64;

int nthreads = 4;
long scale = 1;
pthread_t tid[MAX_THREADS];
pthread_barrier_t bar_warm, bar_start, bar_mid, bar_end;
Obj serial_slots[SERIAL_SLOTS];
Obj thread_slots[MAX_THREADS + 1][THREAD_SLOTS];
Obj handoff[MAX_THREADS + 1][HANDOFF];   // made by t, deleted by t+1
Obj leftover[MAX_THREADS + 1][HANDOFF];  // made in parallel, deleted after join

// Threads exit one at a time, in a fixed order: thread t joins thread t-1 first, main joins
// the last. libc frees per-thread buffers on the way out; this way the number of threads alive
// at each of those calls, so their phase, is the same in every run.
void exit_in_turn(int t)
{
    if (t > 0)
        pthread_join(tid[t - 1], nullptr);
}

void *warm_thread(void *arg)
{
    pthread_barrier_wait(&bar_warm);
    exit_in_turn(static_cast<int>(reinterpret_cast<intptr_t>(arg)));
    return nullptr;
}

// Creates nthreads threads running FN, which end with exit_in_turn.
void run_threads(pthread_attr_t *attr, void *(*fn)(void *))
{
    for (int t = 0; t < nthreads; t++)
        if (pthread_create(&tid[t], attr, fn, reinterpret_cast<void *>(static_cast<intptr_t>(t))))
            _exit(97);
}

// Addresses that libc, libstdc++ or the allocator's own initialisation got from the allocator
// and freed before main are invisible to the address set, but the workload may get them back,
// which alloclens rightly calls "reused". So before the measured work, in every run, we take a
// few objects of every size class up to 64 KiB, note their addresses, and give them back: such
// freed objects are the first an allocator hands out again, so they end up in the set.
constexpr int ABSORB_EACH = 4;
void *absorbed[2048];

void absorb()
{
    int n = 0;
    for (size_t size = 16; size <= 65536;
         size += size < 1024 ? 16 : size < 16384 ? 64 : 4096)
        for (int k = 0; k < ABSORB_EACH; k++) {
            void *p = ::operator new(size);
            seen_insert(p);
            sink(p);
            absorbed[n++] = p;
        }
    while (n > 0)
        ::operator delete(absorbed[--n]);
}

void parallel_work(int t)
{
    int parties = nthreads + 1;
    Rng r{ 2000 + static_cast<uint64_t>(t) };
    pthread_barrier_wait(&bar_start);
    if (scale > 0) {
        for (long s = 0; s < scale; s++) {
            churn(177 + 31 * static_cast<uint64_t>(t) + static_cast<uint64_t>(s), 1500,
                  thread_slots[t], THREAD_SLOTS);
            lifo(20, 16, 48 + 16 * static_cast<size_t>(t));
            delete_nulls(20);
        }
        for (int i = 0; i < HANDOFF; i++) {
            make(handoff[t][i], r);
            make(leftover[t][i], r);
        }
    }
    pthread_barrier_wait(&bar_mid);
    if (scale > 0)
        for (int i = 0; i < HANDOFF; i++)
            if (handoff[(t + 1) % parties][i].p)
                destroy(handoff[(t + 1) % parties][i], r);
    pthread_barrier_wait(&bar_end);
}

void *worker(void *arg)
{
    cur_phase = PH_PARALLEL;
    parallel_work(static_cast<int>(reinterpret_cast<intptr_t>(arg)));
    exit_in_turn(static_cast<int>(reinterpret_cast<intptr_t>(arg)));
    return nullptr;
}

// ---------------------------------- output ----------------------------------
char out[1 << 16];

void emit()
{
    size_t len = 0;
    len += static_cast<size_t>(snprintf(out + len, sizeof out - len,
        "{\"scale\":%ld,\"threads\":%d,\"large_threshold\":%zu,\"truth\":[",
        scale, nthreads, large_threshold));
    bool first = true;
    for (int op = 0; op < OP_COUNT; op++)
        for (int sc = 0; sc < 2; sc++)
            for (int ru = 0; ru < 3; ru++)
                for (int ph = 0; ph < 2; ph++) {
                    unsigned long c = truth[op][sc][ru][ph];
                    if (!c)
                        continue;
                    len += static_cast<size_t>(snprintf(out + len, sizeof out - len,
                        "%s\n{\"op\":\"%s\",\"size_class\":\"%s\",\"reuse\":\"%s\","
                        "\"phase\":\"%s\",\"count\":%lu}", first ? "" : ",",
                        op_names[op], sc_names[sc], ru_names[ru], ph_names[ph], c));
                    first = false;
                }
    len += static_cast<size_t>(snprintf(out + len, sizeof out - len, "]}\n"));
    for (size_t off = 0; off < len;) {
        ssize_t w = write(1, out + off, len - off);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            _exit(98);
        }
        off += static_cast<size_t>(w);
    }
}

[[noreturn]] void usage()
{
    static const char msg[] =
        "usage: exact_counts_cxx [--scale N] [--threads T] [--large-threshold BYTES]\n";
    (void)!write(2, msg, sizeof msg - 1);
    _exit(2);
}

}  // namespace

int main(int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--scale") && i + 1 < argc)
            scale = strtol(argv[++i], nullptr, 10);
        else if (!strcmp(argv[i], "--threads") && i + 1 < argc)
            nthreads = static_cast<int>(strtol(argv[++i], nullptr, 10));
        else if (!strcmp(argv[i], "--large-threshold") && i + 1 < argc)
            large_threshold = strtoull(argv[++i], nullptr, 10);
        else
            usage();
    }
    if (nthreads < 1 || nthreads > MAX_THREADS || scale < 0)
        usage();

    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setstacksize(&attr, 256 * 1024);

    // Warm-up: libc's own allocations for threads happen here, identically in every run.
    pthread_barrier_init(&bar_warm, nullptr, static_cast<unsigned>(nthreads) + 1);
    run_threads(&attr, warm_thread);
    pthread_barrier_wait(&bar_warm);
    pthread_join(tid[nthreads - 1], nullptr);
    absorb();

    // Serial part: main thread only.
    if (scale > 0) {
        for (long s = 0; s < scale; s++) {
            churn(54321 + static_cast<uint64_t>(s), 6000, serial_slots, SERIAL_SLOTS);
            lifo(40, 32, 100);
            lifo(4, 4, LARGE_SIZE);
            delete_nulls(100);
        }
    }

    // Parallel part: nthreads threads and main, all alive between bar_start and bar_end.
    pthread_barrier_init(&bar_start, nullptr, static_cast<unsigned>(nthreads) + 1);
    pthread_barrier_init(&bar_mid, nullptr, static_cast<unsigned>(nthreads) + 1);
    pthread_barrier_init(&bar_end, nullptr, static_cast<unsigned>(nthreads) + 1);
    run_threads(&attr, worker);
    cur_phase = PH_PARALLEL;
    parallel_work(nthreads);
    pthread_join(tid[nthreads - 1], nullptr);
    cur_phase = PH_SERIAL;

    // Serial again: delete what the threads left, then some more calls.
    if (scale > 0) {
        Rng r{ 4343 };
        for (int t = 0; t <= nthreads; t++)
            for (int i = 0; i < HANDOFF; i++)
                if (leftover[t][i].p)
                    destroy(leftover[t][i], r);
        for (long s = 0; s < scale; s++)
            churn(1999 + static_cast<uint64_t>(s), 1000, serial_slots, SERIAL_SLOTS);
    }
    pthread_attr_destroy(&attr);
    emit();
    return 0;
}
