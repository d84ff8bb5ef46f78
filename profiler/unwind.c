/* Stack walks for the sampler: one process-wide table of frame rules on top of libunwind.
 *
 * libunwind's fast walk (unw_backtrace) caches what it learns of each return address in a
 * table of every thread's own, 16384 entries of 16 bytes, all written when the thread first
 * walks: 256 KiB resident in each thread that ever samples, half the profiler's memory in a
 * four-thread program and 16 MiB in a server of 64. Here one table serves every thread: walks
 * are one at a time already (the sampler's unwind lock, which fork takes), so it needs no
 * atomics, and it starts at 16 KiB.
 *
 * A rule says how the frame at a return address finds its caller, in the form nearly every
 * frame has: the canonical frame address (CFA) is RSP or RBP plus a constant, the return
 * address lies just below it, and RBP is either unchanged or saved at a constant offset from
 * it. Rules are learned from libunwind, which reads the DWARF call frame information: the walk
 * that meets an unknown address is made with unw_step (what unw_backtrace falls back to), and
 * each new frame's rule is read off steps from copies of that frame's registers (learn). A
 * frame in no such form (a signal frame, a CFA computed by an expression or from another
 * register) is recorded as such, and walks through it are libunwind's own, as unw_backtrace's
 * are. Code without unwind information (hand-written assembly, JIT code, Go's) is walked by its
 * frame pointer, as unw_backtrace walked it: CFA = RBP + 16, each word read checked first, in
 * every walk, learned or not (see guess). Rules are forgotten when the loader loads or
 * unloads anything (rules_check), and so is libunwind's own cache of frames, which it keeps by
 * address too and on x86-64 never checks against what is loaded. */
#define UNW_LOCAL_ONLY
#include <libunwind.h>
#include <errno.h>
#include <link.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <ucontext.h>
#include <unistd.h>

#include "profiler.h"
#include "sampler.h"

enum rule_kind {
    RULE_NONE,  /* an empty slot */
    RULE_STEP,  /* the caller is found with the rule */
    RULE_LAST,  /* the outermost frame: no caller */
    RULE_SLOW,  /* only libunwind's own step finds the caller */
    RULE_GUESS, /* no unwind information: the frame pointer's chain (guess) */
};

struct rule {
    uintptr_t ip;
    int32_t cfa_off;  /* CFA = (RBP or RSP) + cfa_off */
    int16_t rbp_off;  /* the caller's RBP is saved at CFA + rbp_off; 0: RBP is unchanged */
    uint8_t kind;
    uint8_t from_rbp; /* the CFA is RBP's (1) or RSP's (0) */
};

#define RULE_BITS_MIN 10  /* 16 KiB */
#define RULE_BITS_MAX 16  /* 1 MiB: once half full, the table starts again empty (JIT code
                             makes new return addresses for as long as it runs) */
/* Learning tests a rule on a copy of a frame in scratch memory (copy_frame), with a page above
 * it, which a rule of another form may read; bigger frames (a function with a large array on
 * its stack) walk slowly. */
#define SCRATCH_BYTES (64u << 10)
#define SCRATCH_FRAME (SCRATCH_BYTES - 4096)
#define SCRATCH_ROOM 64 /* below the frame in the copy (zeros): what a step may read under its RSP */

static struct {
    struct rule *slot;
    unsigned bits, used;
    char *scratch;
} rules;

/* A walk's contexts and cursors, a KiB or two each, are kept here rather than on the stack of
 * the thread that allocates (threads may have 16 KiB in all): walks are one at a time. */
static struct {
    unw_context_t start; /* _al_unwind_backtrace's registers: where the walk starts */
    unw_context_t walk, step;
    unw_cursor_t walk_at, step_at;
} w;

/* Pages found readable in this walk (reads past a frame without unwind information are checked:
 * its RBP may be anything). */
static struct {
    uintptr_t page[8];
    unsigned n;
    pid_t pid;
    bool unable; /* process_vm_readv refused: such frames walk slowly, as libunwind steps */
} readable;

/* The loader's counts of objects loaded and unloaded the rules were learned under. */
static struct al_loader_counts rules_counts;
unsigned long _al_unwind_slow_walks;

static struct rule *rule_find(uintptr_t ip)
{
    if (AL_UNLIKELY(!rules.slot))
        return NULL;
    uint64_t mask = (1ull << rules.bits) - 1;
    for (uint64_t i = _al_fib_hash(ip, rules.bits);; i = (i + 1) & mask) {
        struct rule *r = &rules.slot[i];
        if (r->ip == ip)
            return r;
        if (!r->ip)
            return NULL;
    }
}

static bool rule_grow(void)
{
    unsigned bits = rules.slot ? rules.bits + 1 : RULE_BITS_MIN;
    if (bits > RULE_BITS_MAX)
        return false;
    struct rule *slot = _al_mem_map(sizeof *slot << bits), *old = rules.slot;
    if (!slot)
        return false;
    unsigned old_bits = rules.bits;
    rules.slot = slot;
    rules.bits = bits;
    uint64_t mask = (1ull << bits) - 1;
    for (uint64_t k = 0; old && k < 1ull << old_bits; k++) {
        if (!old[k].ip)
            continue;
        uint64_t i = _al_fib_hash(old[k].ip, bits);
        while (slot[i].ip)
            i = (i + 1) & mask;
        slot[i] = old[k];
    }
    if (old)
        _al_mem_unmap(old, sizeof *old << old_bits);
    return true;
}

static void rules_clear(void)
{
    if (rules.slot)
        memset(rules.slot, 0, sizeof *rules.slot << rules.bits);
    rules.used = 0;
}

static void rule_add(const struct rule *r)
{
    if ((!rules.slot || 2 * (rules.used + 1) > 1u << rules.bits) && !rule_grow()) {
        if (!rules.slot)
            return;
        rules_clear();
    }
    uint64_t mask = (1ull << rules.bits) - 1;
    uint64_t i = _al_fib_hash(r->ip, rules.bits);
    while (rules.slot[i].ip && rules.slot[i].ip != r->ip)
        i = (i + 1) & mask;
    if (!rules.slot[i].ip)
        rules.used++;
    rules.slot[i] = *r;
}

/* Rules hold for the code that was there: once an object is loaded or unloaded (the program's
 * dlopen and dlclose, the C library's own of its NSS and iconv modules) an address may hold
 * other code (a library mapped where another was, or where JIT code was). dl_iterate_phdr
 * gives the loader's counts with the first object; the rules are dropped when they moved.
 * They are read before the unwind lock is taken: dl_iterate_phdr takes the loader's lock,
 * which a thread allocating inside a dl_iterate_phdr callback of its own holds while it waits
 * for the unwind lock. A walker's counts may then be older than the table's; they still
 * describe every frame of its own stack (code it runs was loaded before it read them), and a
 * table learned under other counts is dropped first. */
static int loader_counts(struct dl_phdr_info *info, size_t size, void *counts)
{
    (void)size;
    struct al_loader_counts *c = counts;
    c->adds = info->dlpi_adds;
    c->subs = info->dlpi_subs;
    return 1;
}

void _al_unwind_loader_counts(struct al_loader_counts *c)
{
    *c = (struct al_loader_counts){ 0, 0 };
    dl_iterate_phdr(loader_counts, c);
}

static void rules_check(const struct al_loader_counts *c)
{
    if (AL_LIKELY(c->adds == rules_counts.adds && c->subs == rules_counts.subs))
        return;
    rules_counts = *c;
    rules_clear();
    /* libunwind's own cache of what it read of each return address's frame, which the rules
     * are learned from, is not kept up with the loader either. */
    unw_flush_cache(unw_local_addr_space, 0, 0);
}

/* ---- frames without unwind information --------------------------------------------------- */

static bool page_readable(uintptr_t page)
{
    for (unsigned i = 0; i < readable.n && i < 8; i++)
        if (readable.page[i] == page)
            return true;
    if (!readable.pid)
        readable.pid = getpid();
    char byte;
    struct iovec here = { &byte, 1 }, there = { (void *)page, 1 };
    if (process_vm_readv(readable.pid, &here, 1, &there, 1, 0) != 1) {
        if (errno == ENOSYS || errno == EPERM)
            readable.unable = true;
        return false;
    }
    readable.page[readable.n++ % 8] = page;
    return true;
}

/* Whether reads can be checked: process_vm_readv is there, and the program's seccomp filters
 * let it through (they may come at any time: asked at every walk that needs it). */
static bool can_check(void)
{
    return !readable.unable && _al_seccomp_stack_reads_ok();
}

/* The word at A, where it can be read. */
static bool read_word(uintptr_t a, uintptr_t *v)
{
    uintptr_t mask = ~(uintptr_t)4095;
    if (a > UINTPTR_MAX - 8 || !page_readable(a & mask) || !page_readable((a + 7) & mask))
        return false;
    memcpy(v, (const void *)a, sizeof *v);
    return true;
}

/* The step out of a frame without unwind information, as unw_backtrace took it: the frame
 * pointer's chain, RBP at or above RSP (not below: no frame there). libunwind's unw_step guesses
 * the same chain but gives the caller RSP + 16 for its stack pointer rather than RBP + 16, from
 * which a caller whose CFA is RSP's is then read wrong. False: the walk ends here. */
static bool guess(uintptr_t *ip, uintptr_t *sp, uintptr_t *bp)
{
    uintptr_t next_ip, next_bp;
    if (!*bp || *bp < *sp || !read_word(*bp + 8, &next_ip) || !read_word(*bp, &next_bp))
        return false;
    *ip = next_ip;
    *sp = *bp + 16;
    *bp = next_bp;
    return true;
}

/* Whether the frame at C has no unwind information: libunwind's unw_get_proc_info then makes
 * up a one-byte procedure at the IP (x86-64's, for _start), or fails. */
static bool no_unwind_info(unw_cursor_t *c, uintptr_t ip)
{
    unw_proc_info_t pi;
    if (unw_get_proc_info(c, &pi) < 0)
        return true;
    return pi.format == UNW_INFO_FORMAT_DYNAMIC && !pi.unwind_info && pi.start_ip == ip && pi.end_ip == ip + 1;
}

/* ---- learning --------------------------------------------------------------------------------- */

struct regs {
    unw_word_t ip, sp, bp, bx, r12, r13, r14, r15;
};

static bool regs_of(unw_cursor_t *c, struct regs *r)
{
    return unw_get_reg(c, UNW_REG_IP, &r->ip) == 0 && unw_get_reg(c, UNW_REG_SP, &r->sp) == 0 &&
           unw_get_reg(c, UNW_X86_64_RBP, &r->bp) == 0 && unw_get_reg(c, UNW_X86_64_RBX, &r->bx) == 0 &&
           unw_get_reg(c, UNW_X86_64_R12, &r->r12) == 0 && unw_get_reg(c, UNW_X86_64_R13, &r->r13) == 0 &&
           unw_get_reg(c, UNW_X86_64_R14, &r->r14) == 0 && unw_get_reg(c, UNW_X86_64_R15, &r->r15) == 0;
}

/* What one step of libunwind's from registers R finds: the caller's IP, RSP (the CFA), RBP,
 * and where it read the return address and RBP. The other registers are the walk's start's
 * (they do not matter to a frame whose rule uses only these). */
struct step {
    int ret;
    unw_word_t ip, cfa, bp;
    unw_save_loc_t ip_at, bp_at;
};

static void step_from(const struct regs *r, struct step *s)
{
    unw_context_t *uc = &w.step;
    *uc = w.start;
    greg_t *g = uc->uc_mcontext.gregs;
    g[REG_RIP] = (greg_t)r->ip;
    g[REG_RSP] = (greg_t)r->sp;
    g[REG_RBP] = (greg_t)r->bp;
    g[REG_RBX] = (greg_t)r->bx;
    g[REG_R12] = (greg_t)r->r12;
    g[REG_R13] = (greg_t)r->r13;
    g[REG_R14] = (greg_t)r->r14;
    g[REG_R15] = (greg_t)r->r15;
    unw_cursor_t *c = &w.step_at;
    s->ret = -1;
    if (unw_init_local(c, uc) < 0)
        return;
    s->ret = unw_step(c);
    if (s->ret < 0 || unw_get_reg(c, UNW_REG_IP, &s->ip) < 0 || unw_get_reg(c, UNW_REG_SP, &s->cfa) < 0 ||
        unw_get_reg(c, UNW_X86_64_RBP, &s->bp) < 0 || unw_get_save_loc(c, UNW_REG_IP, &s->ip_at) < 0 ||
        unw_get_save_loc(c, UNW_X86_64_RBP, &s->bp_at) < 0)
        s->ret = -1;
}

static bool at(const unw_save_loc_t *l, uintptr_t addr)
{
    return l->type == UNW_SLT_MEMORY && l->u.addr == addr;
}

/* Whether the step from a copy of the frame, one register moved to point into it by DELTA,
 * found the CFA moved with it, and read the return address and RBP where the rule says: that
 * register is the rule's base. */
static bool moved_with(const struct step *real, const struct step *copy, intptr_t delta, int16_t bp_off)
{
    return copy->ret > 0 && copy->cfa == real->cfa + (uintptr_t)delta && copy->ip == real->ip &&
           copy->bp == real->bp && at(&copy->ip_at, copy->cfa - 8) &&
           (!bp_off || at(&copy->bp_at, copy->cfa + (uintptr_t)(intptr_t)bp_off));
}

/* The copy a rule is tested on, of [LO, HI) to the start of scratch memory: only the words the
 * step read (the return address and a saved RBP: all a step by a rule of this form reads), the
 * rest zeros, a page above it too. Not the frame itself: a frame's range from RSP to its CFA
 * may cross from one stack to another, over a guard page (a function that calls on a new
 * stack), and other words would only let a step of another form find what it found. */
static intptr_t copy_frame(uintptr_t lo, uintptr_t hi, const struct step *real)
{
    memset(rules.scratch, 0, hi - lo + 4096);
    char *to = rules.scratch - lo;
    memcpy(to + (real->cfa - 8), (const void *)(real->cfa - 8), 8);
    if (real->bp_at.u.addr >= lo && real->bp_at.u.addr < hi)
        memcpy(to + real->bp_at.u.addr, (const void *)real->bp_at.u.addr, 8);
    return (intptr_t)((uintptr_t)rules.scratch - lo);
}

/* The rule of the frame at cursor C (a walk of this thread's), read off steps from
 * copies of its registers: one from the registers as they are, which gives the CFA, where the
 * return address and RBP were read; then one from a copy of the frame in scratch memory, RSP
 * pointing into the copy, which tells whether the CFA follows RSP; else one with RBP moved
 * there alike. Copies, not the stack itself moved: what a step reads is then memory that is
 * there, whatever the rule turns out to be. */
static struct rule learn(unw_cursor_t *c)
{
    struct regs r;
    struct rule out = { .kind = RULE_SLOW };
    if (!regs_of(c, &r))
        return out;
    out.ip = r.ip;
    if (unw_is_signal_frame(c) != 0)
        return out;
    if (no_unwind_info(c, r.ip)) {
        out.kind = RULE_GUESS;
        return out;
    }
    struct step real, copy;
    step_from(&r, &real);
    if (real.ret == 0) {
        out.kind = RULE_LAST;
        return out;
    }
    if (real.ret < 0 || real.cfa <= r.sp || !at(&real.ip_at, real.cfa - 8))
        return out;
    /* RBP: unchanged (still in the context's RBP) or read from the frame. Another of the
     * context's registers (DW_CFA_register) holding the same value now is no rule: it need not
     * the next time. */
    const char *ucb = (const char *)&w.step;
    int64_t bp_off = 0;
    if (at(&real.bp_at, (uintptr_t)&w.step.uc_mcontext.gregs[REG_RBP])) {
        if (real.bp != r.bp)
            return out;
    } else if (real.bp_at.type == UNW_SLT_MEMORY && real.bp_at.u.addr >= (uintptr_t)ucb &&
               real.bp_at.u.addr < (uintptr_t)(ucb + sizeof w.step)) {
        return out;
    } else if (real.bp_at.type == UNW_SLT_MEMORY) {
        bp_off = (int64_t)(real.bp_at.u.addr - real.cfa);
        if (bp_off >= 0 || bp_off < INT16_MIN || real.bp_at.u.addr < r.sp)
            return out; /* not in the frame */
    } else {
        return out;
    }
    if (!rules.scratch && !(rules.scratch = _al_mem_map(SCRATCH_BYTES)))
        return out;
    out.rbp_off = (int16_t)bp_off;
    /* The frame, from SCRATCH_ROOM below RSP up to the CFA: RSP's rule. */
    uintptr_t lo = r.sp - SCRATCH_ROOM, hi = real.cfa;
    if (hi - lo <= SCRATCH_FRAME) {
        intptr_t delta = copy_frame(lo, hi, &real);
        struct regs moved = r;
        moved.sp += (uintptr_t)delta;
        step_from(&moved, &copy);
        if (moved_with(&real, &copy, delta, out.rbp_off) && real.cfa - r.sp <= INT32_MAX) {
            out.kind = RULE_STEP;
            out.cfa_off = (int32_t)(real.cfa - r.sp);
            return out;
        }
    }
    /* RBP's rule: RBP points into the frame, a little below the CFA. */
    if (r.bp < r.sp || r.bp >= real.cfa || real.cfa - r.bp > 4096)
        return out;
    lo = r.bp - SCRATCH_ROOM;
    if (real.bp_at.u.addr < lo && bp_off)
        return out; /* RBP saved below the copy */
    intptr_t delta = copy_frame(lo, hi, &real);
    struct regs moved = r;
    moved.bp += (uintptr_t)delta;
    step_from(&moved, &copy);
    if (moved_with(&real, &copy, delta, out.rbp_off)) {
        out.kind = RULE_STEP;
        out.from_rbp = 1;
        out.cfa_off = (int32_t)(real.cfa - r.bp);
    }
    return out;
}

/* ---- walks ------------------------------------------------------------------------------------ */

/* libunwind's walk from the start, learning the rules of the frames it meets that have none. Past a
 * signal frame nothing is learned: the frame it interrupted is at an instruction, not a return
 * address, and its rule would be that of another place. */
static int slow_walk(void **raw, int max)
{
    unw_cursor_t *c = &w.walk_at;
    w.walk = w.start;
    _al_unwind_slow_walks++;
    if (unw_init_local(c, &w.walk) < 0)
        return 0;
    int n = 0;
    bool learning = true;
    while (n < max) {
        unw_word_t ip;
        if (unw_get_reg(c, UNW_REG_IP, &ip) < 0)
            break;
        raw[n++] = (void *)ip;
        const struct rule *known = learning ? rule_find(ip) : NULL;
        struct rule r = { .kind = RULE_NONE };
        if (learning && !known) {
            r = learn(c);
            if (r.ip)
                rule_add(&r);
            known = &r;
        }
        /* Without unwind information, by the frame pointer (as the fast walk), the walk going
         * on with libunwind from the caller's registers. */
        if (can_check() && (known ? known->kind == RULE_GUESS : unw_is_signal_frame(c) == 0 && no_unwind_info(c, ip))) {
            unw_word_t sp, bp;
            if (unw_get_reg(c, UNW_REG_SP, &sp) < 0 || unw_get_reg(c, UNW_X86_64_RBP, &bp) < 0 ||
                !guess(&ip, &sp, &bp) || ip < 0x4000)
                break;
            greg_t *g = w.walk.uc_mcontext.gregs;
            g[REG_RIP] = (greg_t)ip;
            g[REG_RSP] = (greg_t)sp;
            g[REG_RBP] = (greg_t)bp;
            if (unw_init_local(c, &w.walk) < 0)
                break;
            continue;
        }
        if (unw_is_signal_frame(c) > 0)
            learning = false;
        if (unw_step(c) <= 0)
            break;
    }
    return n;
}

/* The walk with the rules; -1 at the first frame with none, or none of this form. */
static int fast_walk(void **raw, int max)
{
    const greg_t *g = w.start.uc_mcontext.gregs;
    uintptr_t ip = (uintptr_t)g[REG_RIP], sp = (uintptr_t)g[REG_RSP], bp = (uintptr_t)g[REG_RBP];
    int n = 0;
    bool check = false; /* past a frame without unwind information: RBP was a guess */
    while (n < max) {
        const struct rule *r = rule_find(ip);
        if (!r || r->kind == RULE_SLOW || r->kind == RULE_NONE)
            return -1;
        raw[n++] = (void *)ip;
        if (r->kind == RULE_LAST)
            break;
        if (r->kind == RULE_GUESS) {
            if (!can_check())
                return -1;
            if (!guess(&ip, &sp, &bp))
                break;
            check = true;
            if (ip < 0x4000)
                break;
            continue;
        }
        uintptr_t cfa = (r->from_rbp ? bp : sp) + (uintptr_t)(intptr_t)r->cfa_off;
        if (AL_UNLIKELY(cfa <= sp))
            return -1; /* a caller's frame lies above its callee's */
        if (!check) {
            ip = *(const uintptr_t *)(cfa - 8);
            if (r->rbp_off)
                bp = *(const uintptr_t *)(cfa + r->rbp_off);
        } else if (!read_word(cfa - 8, &ip) || (r->rbp_off && !read_word(cfa + r->rbp_off, &bp))) {
            return -1;
        }
        sp = cfa;
        if (ip < 0x4000) /* as libunwind: the end of the chain, or nothing sensible */
            break;
    }
    return n;
}

/* The walk runs on a stack of its own: libunwind's steps, and the loader binding libunwind's
 * calls on their first use (an xsave area of some 3 KiB on AVX-512), took about 6 KiB of the
 * program's stack, and a coroutine on a 4 KiB stack that allocated crashed where it did not
 * without us. Walks are one at a time (the unwind lock): one stack serves every thread. A walk
 * nested in one under way on the same thread (its signal handler's, or a coroutine the handler
 * switched to) walks where it is, leaving the outer walk's frames alone. A signal that comes
 * during a walk has its handler run there, as it would have on the program's stack: the stack
 * is far bigger than a walk needs. Not made once a seccomp filter is on (mmap and mprotect are
 * calls it may refuse): walks stay on the program's stack. */
#define WALK_STACK (256u << 10)
#define WALK_GUARD 4096u

struct walk_call {
    void **raw;
    int max, n;
    const struct al_loader_counts *loaded;
};

static struct {
    char *base; /* WALK_GUARD below WALK_STACK, the guard's pages inaccessible */
    bool unable;
    bool in_use;
} own_stack;

static void walk(struct walk_call *c)
{
    readable.n = 0;
    readable.pid = 0; /* a fork's child has another */
    rules_check(c->loaded);
    int n = fast_walk(c->raw, c->max);
    c->n = n >= 0 ? n : slow_walk(c->raw, c->max);
}

/* FN(C) with the stack pointer at TOP (16-byte aligned), and back. Not swapcontext, as the
 * report's own stack is reached (report.c): it sets the signal mask, two system calls a walk. */
static void run_on_stack(void (*fn)(struct walk_call *), struct walk_call *c, char *top)
{
    __asm__ volatile("mov %%rsp, %%rbx\n\t"
                     "mov %[top], %%rsp\n\t"
                     "call *%[fn]\n\t"
                     "mov %%rbx, %%rsp"
                     : "+D"(c)
                     : [fn] "r"(fn), [top] "r"(top)
                     : "rax", "rbx", "rcx", "rdx", "rsi", "r8", "r9", "r10", "r11", "memory", "cc",
                       "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9",
                       "xmm10", "xmm11", "xmm12", "xmm13", "xmm14", "xmm15");
}

static bool own_stack_ready(void)
{
    if (own_stack.base)
        return true;
    if (own_stack.unable || atomic_load(&_al_seccomp_on))
        return false;
    char *m = _al_mem_map(WALK_GUARD + WALK_STACK);
    if (m && mprotect(m, WALK_GUARD, PROT_NONE) != 0) {
        _al_mem_unmap(m, WALK_GUARD + WALK_STACK);
        m = NULL;
    }
    own_stack.unable = !m;
    own_stack.base = m;
    return m != NULL;
}

/* Under the sampler's unwind lock; LOADED: what _al_unwind_loader_counts read before it was
 * taken. Not inlined: the walk starts from this function's frame, which must outlive it. */
AL_NOINLINE int _al_unwind_backtrace(void **raw, int max, const struct al_loader_counts *loaded)
{
    if (unw_getcontext(&w.start) < 0)
        return 0;
    struct walk_call c = { raw, max, 0, loaded };
    if (own_stack.in_use || !own_stack_ready()) {
        walk(&c);
    } else {
        own_stack.in_use = true;
        run_on_stack(walk, &c, own_stack.base + WALK_GUARD + WALK_STACK);
        own_stack.in_use = false;
    }
    return c.n;
}
