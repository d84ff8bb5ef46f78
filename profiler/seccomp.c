/* The program's own seccomp filters, installed while it runs (a sandbox, sshd's privilege
 * separation, a daemon using libseccomp): seen through the prctl and syscall wrappers
 * (interpose/seccomp.c). From the moment one is being installed, nothing such a filter may
 * refuse is started any more: syscall user dispatch and event counting in later threads (their
 * prctl and perf_event_open end a sandboxed process under many filters), the symbolizer
 * helper at the report. A copy of each filter is kept, so that before a report is written the
 * filters can be asked what they would do to each system call writing it takes: classic BPF,
 * run here on the seccomp_data the kernel would give them. A filter installed some other way
 * (a raw system call instruction) is not seen: the process.c check covers those a program
 * starts under. */
#include <errno.h>
#include <fcntl.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <stddef.h>
#include <string.h>
#include <stdio.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "profiler.h"

#define KEPT_MAX 16 /* filters kept; past that the report is not risked */

static struct {
    _Atomic int lock;
    unsigned kept;
    bool unknown; /* a filter that could not be kept: what it would do is not known */
    bool strict;  /* strict mode: read, write, exit and sigreturn only */
    unsigned installing; /* installs begun and not yet ended */
    struct {
        struct sock_filter *insns;
        unsigned n;
    } filter[KEPT_MAX];
} state;

_Atomic bool _al_seccomp_on;

/* Whether the filters let through the system calls measuring takes while the program runs
 * (runtime_calls), and getrusage: false from the moment one is being installed until every
 * install under way has ended and its filter been read. Written only under state.lock. */
static _Atomic bool measures_ok = true, rusage_ok = true, stack_reads_ok = true;

static void decide_locked(void);

void _al_seccomp_installing(bool strict)
{
    if (strict)
        _al_process_before_strict();
    _al_spin_lock(&state.lock);
    state.installing++;
    atomic_store(&measures_ok, false);
    atomic_store(&rusage_ok, false);
    atomic_store(&stack_reads_ok, false);
    atomic_store(&_al_seccomp_on, true);
    _al_spin_unlock(&state.lock);
}

bool _al_seccomp_measures_ok(void)
{
    return atomic_load_explicit(&measures_ok, memory_order_relaxed);
}

bool _al_seccomp_stack_reads_ok(void)
{
    return atomic_load_explicit(&stack_reads_ok, memory_order_relaxed);
}

bool _al_seccomp_rusage_ok(void)
{
    return atomic_load_explicit(&rusage_ok, memory_order_relaxed);
}

void _al_seccomp_installed(bool strict, const struct sock_fprog *prog, bool ok)
{
    _al_spin_lock(&state.lock);
    state.installing--;
    if (ok && strict) {
        state.strict = true;
    } else if (ok) {
        size_t bytes = prog && prog->len ? prog->len * sizeof *prog->filter : 0;
        struct sock_filter *copy = bytes && state.kept < KEPT_MAX ? _al_mem_map(bytes) : NULL;
        if (copy) {
            memcpy(copy, prog->filter, bytes);
            state.filter[state.kept].insns = copy;
            state.filter[state.kept++].n = prog->len;
        } else {
            state.unknown = true;
        }
    }
    /* A failed install: no filter after all, unless another holds one or is under way. */
    if (!state.installing && !state.kept && !state.strict && !state.unknown)
        atomic_store(&_al_seccomp_on, false);
    decide_locked();
    _al_spin_unlock(&state.lock);
}

/* The value of word K of D (K a byte offset, 4-aligned as the kernel requires). */
static bool load_word(const struct seccomp_data *d, uint32_t k, uint32_t *v)
{
    if (k % 4 || k > sizeof *d - 4)
        return false;
    memcpy(v, (const char *)d + k, 4);
    return true;
}

static bool alu(uint16_t op, uint32_t *a, uint32_t v)
{
    switch (op) {
    case BPF_ADD: *a += v; return true;
    case BPF_SUB: *a -= v; return true;
    case BPF_MUL: *a *= v; return true;
    case BPF_DIV: if (!v) return false; *a /= v; return true;
    case BPF_MOD: if (!v) return false; *a %= v; return true;
    case BPF_OR: *a |= v; return true;
    case BPF_AND: *a &= v; return true;
    case BPF_XOR: *a ^= v; return true;
    case BPF_LSH: *a = v < 32 ? *a << v : 0; return true;
    case BPF_RSH: *a = v < 32 ? *a >> v : 0; return true;
    case BPF_NEG: *a = -*a; return true;
    default: return false;
    }
}

static bool jump_taken(uint16_t op, uint32_t a, uint32_t v)
{
    switch (op) {
    case BPF_JEQ: return a == v;
    case BPF_JGT: return a > v;
    case BPF_JGE: return a >= v;
    default: return (a & v) != 0; /* BPF_JSET */
    }
}

const char *_al_seccomp_note(void)
{
    return atomic_load(&_al_seccomp_on) ? "threads started after the program installed a seccomp filter are not measured"
                                        : NULL;
}

uint32_t _al_seccomp_run(const struct sock_filter *f, unsigned n, const struct seccomp_data *d)
{
    uint32_t a = 0, x = 0, mem[BPF_MEMWORDS] = { 0 };
    /* Jumps only go forward: at most n steps. What the kernel would not have loaded, or
     * would stop on, ends the run as it does: the process killed. */
    for (unsigned pc = 0; pc < n; pc++) {
        const struct sock_filter *i = &f[pc];
        uint32_t k = i->k, v = BPF_SRC(i->code) == BPF_X ? x : k;
        switch (BPF_CLASS(i->code)) {
        case BPF_LD:
        case BPF_LDX: {
            uint32_t *dst = BPF_CLASS(i->code) == BPF_LD ? &a : &x;
            switch (BPF_MODE(i->code)) {
            case BPF_ABS:
                if (BPF_CLASS(i->code) != BPF_LD || BPF_SIZE(i->code) != BPF_W || !load_word(d, k, dst))
                    return SECCOMP_RET_KILL_PROCESS;
                break;
            case BPF_LEN: *dst = sizeof *d; break;
            case BPF_IMM: *dst = k; break;
            case BPF_MEM:
                if (k >= BPF_MEMWORDS)
                    return SECCOMP_RET_KILL_PROCESS;
                *dst = mem[k];
                break;
            default: return SECCOMP_RET_KILL_PROCESS;
            }
            break;
        }
        case BPF_ST:
        case BPF_STX:
            if (k >= BPF_MEMWORDS)
                return SECCOMP_RET_KILL_PROCESS;
            mem[k] = BPF_CLASS(i->code) == BPF_ST ? a : x;
            break;
        case BPF_ALU:
            if (!alu(BPF_OP(i->code), &a, v))
                return SECCOMP_RET_KILL_PROCESS;
            break;
        case BPF_JMP:
            if (BPF_OP(i->code) == BPF_JA)
                pc += k;
            else
                pc += jump_taken(BPF_OP(i->code), a, v) ? i->jt : i->jf;
            break;
        case BPF_RET:
            return BPF_RVAL(i->code) == BPF_A ? a : k;
        default: /* BPF_MISC */
            if (BPF_MISCOP(i->code) == BPF_TAX)
                x = a;
            else
                a = x;
            break;
        }
    }
    return SECCOMP_RET_KILL_PROCESS; /* ran off the end */
}

/* The system calls writing a report takes (the symbolizer helper is not run once a filter is
 * on), with the arguments a filter may look at: files opened for reading (/proc) and for
 * writing (the report), the report descriptors' flags, anonymous memory. */
struct call {
    const char *name;
    long nr;
    uint64_t args[3];
};

static const struct call report_calls[] = {
    { "write", SYS_write, { STDERR_FILENO } }, /* first: whether a refusal can be said */
    { "openat", SYS_openat, { (uint64_t)AT_FDCWD, 0, O_RDONLY | O_CLOEXEC } },
    { "openat", SYS_openat, { (uint64_t)AT_FDCWD, 0, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC } },
    { "openat", SYS_openat, { (uint64_t)AT_FDCWD, 0, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC } },
    { "read", SYS_read, { 0 } },
    { "pread64", SYS_pread64, { 0 } },
    { "close", SYS_close, { 0 } },
    { "newfstatat", SYS_newfstatat, { 0 } },
    { "fstat", SYS_fstat, { 0 } },
    { "fcntl", SYS_fcntl, { 0, F_GETFD } },
    { "readlink", SYS_readlink, { 0 } },
    { "access", SYS_access, { 0 } },
    { "memfd_create", SYS_memfd_create, { 0 } },
    { "mmap", SYS_mmap, { 0, 0, PROT_READ | PROT_WRITE } },
    { "munmap", SYS_munmap, { 0 } },
    { "madvise", SYS_madvise, { 0 } },
    { "mincore", SYS_mincore, { 0 } },
    { "ioctl", SYS_ioctl, { 0 } },
    { "getpid", SYS_getpid, { 0 } },
    { "rt_sigprocmask", SYS_rt_sigprocmask, { 0 } },
    { "rt_sigaction", SYS_rt_sigaction, { 0 } },
    { "rt_sigpending", SYS_rt_sigpending, { 0 } },
};

static bool allowed(long nr, const uint64_t args[3])
{
    if (state.strict && nr != SYS_read && nr != SYS_write)
        return false;
    struct seccomp_data d = { .nr = (int)nr, .arch = AUDIT_ARCH_X86_64 };
    memcpy(d.args, args, 3 * sizeof *args);
    for (unsigned i = 0; i < state.kept; i++) {
        uint32_t action = _al_seccomp_run(state.filter[i].insns, state.filter[i].n, &d) & SECCOMP_RET_ACTION_FULL;
        if (action != SECCOMP_RET_ALLOW && action != SECCOMP_RET_LOG)
            return false;
    }
    return true;
}

/* The system calls measuring takes while the program runs, in its allocation calls: the heap's
 * and the process's resident size (/proc/self/statm, /proc/self/maps, the pagemap, mincore),
 * and libunwind's stack walks (it checks memory with mincore, and by writing it to a pipe it
 * makes, with signals blocked around its caches; the walk's end looks at the pipe before it
 * closes it). The sampler's getrusage is asked apart. */
static const struct call runtime_calls[] = {
    { "openat", SYS_openat, { (uint64_t)AT_FDCWD, 0, O_RDONLY | O_CLOEXEC } },
    { "read", SYS_read, { 0 } },
    { "pread64", SYS_pread64, { 0 } },
    { "close", SYS_close, { 0 } },
    { "newfstatat", SYS_newfstatat, { 0 } },
    { "mincore", SYS_mincore, { 0 } },
    { "pipe2", SYS_pipe2, { 0, O_NONBLOCK | O_CLOEXEC } },
    { "write", SYS_write, { 0 } },
    { "rt_sigprocmask", SYS_rt_sigprocmask, { 0 } },
};

static const struct call rusage_call[] = { { "getrusage", SYS_getrusage, { RUSAGE_THREAD } } };

/* The stack walk's checked reads past a frame without unwind information (profiler/unwind.c):
 * refused, such frames are walked by libunwind's steps. */
static const struct call stack_read_calls[] = {
    { "getpid", SYS_getpid, { 0 } },
    { "process_vm_readv", SYS_process_vm_readv, { 0 } },
};

#define CALLS(a) (a), sizeof(a) / sizeof((a)[0])

/* state.lock held: the first of the N calls C the filters refuse, or -1. */
static int first_refused(const struct call *c, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (!allowed(c[i].nr, c[i].args))
            return (int)i;
    return -1;
}

/* state.lock held: the two flags from the filters kept, while no install is under way. */
static void decide_locked(void)
{
    bool settled = !state.installing && !state.unknown;
    atomic_store(&measures_ok, settled && first_refused(CALLS(runtime_calls)) < 0);
    atomic_store(&rusage_ok, settled && first_refused(CALLS(rusage_call)) < 0);
    atomic_store(&stack_reads_ok, settled && first_refused(CALLS(stack_read_calls)) < 0);
}

const char *_al_seccomp_refuses_report(bool *can_say)
{
    static char why[128];
    *can_say = true;
    if (!atomic_load(&_al_seccomp_on))
        return NULL;
    _al_spin_lock(&state.lock);
    const char *refused = NULL;
    if (state.unknown) {
        refused = "a seccomp filter the program installed could not be read";
        *can_say = false;
    }
    int i = refused ? -1 : first_refused(CALLS(report_calls));
    if (i >= 0) {
        snprintf(why, sizeof why, "the program's seccomp filter refuses %s, which writing it takes",
                 report_calls[i].name);
        refused = why;
        *can_say = i > 0;
    }
    _al_spin_unlock(&state.lock);
    return refused;
}
