/* Names for the frames of the sampled sites, found after the run.
 *
 * Full names (function, file:line from debug information, and the functions the code at a
 * frame was inlined into) come from alloclens-symbolize, a program installed beside this
 * library, run once per report for every frame at once: the
 * debug information it reads (megabytes where libc6-dbg is installed) then never enters the
 * profiled process, nor comes from the allocator it measures. posix_spawn starts it without
 * the program's atfork handlers, signal handlers or signal mask, and without this library in
 * its environment; input and output are memory files, so a helper that dies early raises no
 * SIGPIPE here. Its exit raises SIGCHLD (exec gives every child that exit signal): in a program
 * that handles SIGCHLD (Go's runtime, node's libuv, servers that fork workers), whose handler
 * must see no child it never made, it runs as a grandchild instead (spawn_quiet). It is not
 * run once the program has installed a seccomp filter. Where it cannot run, and for the frames
 * it did not see, names come from the dynamic symbol table through dladdr, which costs
 * nothing. */
#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <link.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/pidfd.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "profiler.h"

#define HELPER "alloclens-symbolize"
#define HELPER_TIMEOUT_MS 120000

struct entry {
    uintptr_t pc;
    struct al_symbol s;
};

static struct {
    bool full;
    struct entry *e;       /* sorted by pc */
    size_t n, e_bytes;
    struct al_symbol *inl; /* the functions that inlined calls were inlined into */
    size_t inl_bytes;
    char *text;            /* the helper's output, its fields NUL-terminated in place */
    size_t text_bytes;
    char why[256];         /* why full names are missing; "" when they are not */
} sym;

static char *(*demangle)(const char *, char *, size_t *, int *);

static int cmp_pc(const void *a, const void *b)
{
    uintptr_t x = ((const struct entry *)a)->pc, y = ((const struct entry *)b)->pc;
    return x < y ? -1 : x > y;
}

/* Every distinct frame of every site, sorted, into sym.e; the caller holds the sampler lock. */
static bool collect_frames(void)
{
    size_t most = (size_t)_al_sampler.nsites * AL_SITE_FRAMES + 1;
    sym.e_bytes = most * sizeof *sym.e;
    sym.e = _al_mem_map(sym.e_bytes);
    if (!sym.e)
        return false;
    for (uint32_t i = 0; i < _al_sampler.nsites; i++)
        for (uint32_t f = 0; f < _al_site(i)->nframes; f++)
            sym.e[sym.n++].pc = _al_site(i)->frames[f];
    _al_sort(sym.e, sym.n, sizeof *sym.e, cmp_pc);
    size_t k = 0;
    for (size_t i = 0; i < sym.n; i++)
        if (k == 0 || sym.e[k - 1].pc != sym.e[i].pc)
            sym.e[k++].pc = sym.e[i].pc;
    sym.n = k;
    return true;
}

/* ---- finding and starting the helper ------------------------------------------------------- */

/* Installed beside this library, or in the build tree's profiler/ beside its interpose/. */
static bool helper_path(char *out, size_t cap)
{
    static char buf[8192] AL_LARGE_BSS, dir[PATH_MAX] AL_LARGE_BSS;
    struct al_map_span self = { .path = dir, .path_cap = sizeof dir };
    dir[0] = '\0';
    if (!_al_maps_find((uintptr_t)helper_path, buf, sizeof buf, &self) || dir[0] != '/')
        return false;
    *strrchr(dir, '/') = '\0';
    snprintf(out, cap, "%s/" HELPER, dir);
    if (access(out, X_OK) == 0)
        return true;
    snprintf(out, cap, "%s/../profiler/" HELPER, dir);
    return access(out, X_OK) == 0;
}

/* This process's environment less LD_PRELOAD and ALLOCLENS_*: the helper is not profiled. */
static char **helper_env(size_t *bytes)
{
    size_t n = 0;
    for (char **e = environ; e && *e; e++)
        n++;
    *bytes = (n + 1) * sizeof(char *);
    char **env = _al_mem_map(*bytes);
    if (!env)
        return NULL;
    size_t k = 0;
    for (char **e = environ; e && *e; e++)
        if (strncmp(*e, "LD_PRELOAD=", 11) != 0 && strncmp(*e, "ALLOCLENS_", 10) != 0)
            env[k++] = *e;
    return env;
}

/* True when PID has ended within HELPER_TIMEOUT_MS (or cannot be watched: the wait then
 * blocks as a plain waitpid would). Valgrind lacks pidfd_open and would say so on the
 * program's stderr. */
static bool ended_in_time(pid_t pid)
{
    int pfd = _al_settings.under_valgrind ? -1 : pidfd_open(pid, 0);
    if (pfd >= 0) {
        struct pollfd p = { .fd = pfd, .events = POLLIN };
        int r;
        while ((r = poll(&p, 1, HELPER_TIMEOUT_MS)) < 0 && errno == EINTR)
            ;
        close(pfd);
        return r != 0;
    }
    /* No pidfd (a kernel before 5.3, or a filter): look every 10 ms. */
    for (int ms = 0; ms < HELPER_TIMEOUT_MS; ms += 10) {
        siginfo_t si = { 0 };
        if (waitid(P_PID, (id_t)pid, &si, WEXITED | WNOHANG | WNOWAIT) < 0 || si.si_pid == pid)
            return true;
        nanosleep(&(struct timespec){ .tv_nsec = 10 * 1000 * 1000 }, NULL);
    }
    return false;
}

static int wait_helper(pid_t pid, int flags);

/* PATH started as posix_spawn would below, but as a grandchild: the child between is made by a
 * raw clone with no exit signal, waits for it, and exits with its status (128 + the signal
 * that ended it). So the program's SIGCHLD handler sees nothing of ours, and its waitpid(-1)
 * cannot reap the child (one without an exit signal needs __WALL). Both children are copies of
 * a multithreaded process: raw system calls only, from the page syscall user dispatch always
 * allows, every signal blocked until the exec (a program's handler must not run in them). The
 * helper dies with the child between (PR_SET_PDEATHSIG), which a timeout kills. The child
 * between's pid, or -1 with errno. */
static pid_t spawn_quiet(const char *path, char *const argv[], char *const env[], int in, int out)
{
    sigset_t old, none;
    sigemptyset(&none);
    _al_signals_block_all(&old);
    long pid = _al_sud_syscall(SYS_clone, 0, 0, 0, 0, 0, 0);
    if (pid == 0) {
        long g = _al_sud_syscall(SYS_clone, SIGCHLD, 0, 0, 0, 0, 0);
        if (g == 0) {
            _al_sud_syscall(SYS_prctl, PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0, 0);
            _al_sud_syscall(SYS_dup2, in, 0, 0, 0, 0, 0);
            _al_sud_syscall(SYS_dup2, out, 1, 0, 0, 0, 0);
            _al_sud_syscall(SYS_close_range, 3, ~0u, 0, 0, 0, 0);
            _al_sud_syscall(SYS_rt_sigprocmask, SIG_SETMASK, (long)&none, 0, _NSIG / 8, 0, 0);
            _al_sud_syscall(SYS_execve, (long)path, (long)argv, (long)env, 0, 0, 0);
            _al_sud_syscall(SYS_exit_group, 127, 0, 0, 0, 0, 0);
        }
        int status = 0;
        long r = -EINTR;
        while (g > 0 && r == -EINTR)
            r = _al_sud_syscall(SYS_wait4, g, (long)&status, 0, 0, 0, 0);
        int code = g < 0 || r < 0 ? 127 : WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        _al_sud_syscall(SYS_exit_group, code, 0, 0, 0, 0, 0);
    }
    _al_signals_restore(&old);
    if (pid < 0) {
        errno = (int)-pid;
        return -1;
    }
    return (pid_t)pid;
}

/* Runs PATH with IN as its input and OUT as its output, and none of the program's other
 * descriptors; its exit status, or -1 with why. The C library's posix_spawn, not our wrapper
 * of it (interpose/exec.c), whose check of whether LD_PRELOAD reaches the program is for the
 * program's children; or, where the program handles SIGCHLD (QUIET), spawn_quiet. */
static int run_helper(const char *path, int in, int out, bool quiet)
{
    int (*spawn)(pid_t *, const char *, const posix_spawn_file_actions_t *, const posix_spawnattr_t *,
                 char *const[], char *const[]) = (__typeof__(spawn))_al_real_posix_spawn;
    size_t env_bytes;
    char **env = helper_env(&env_bytes);
    if (!env) {
        snprintf(sym.why, sizeof sym.why, "out of memory starting %s", HELPER);
        return -1;
    }
    posix_spawn_file_actions_t fa;
    posix_spawnattr_t attr;
    sigset_t none;
    sigemptyset(&none);
    char *argv[] = { (char *)path, NULL };
    pid_t pid = -1;
    /* The actions' room is ours, as the public fields of the type allow: the C library's would
     * come from the program's allocator, a realloc per action, and a report made by exit()
     * in a signal handler that interrupted that allocator holding its lock waited for it for
     * ever (jemalloc, a helper's stress run). Each action takes a few dozen bytes; so never
     * destroyed, which would free the room. */
    static _Alignas(64) char action_room[1024];
    if (quiet) {
        pid = spawn_quiet(path, argv, env, in, out);
        _al_mem_unmap(env, env_bytes);
        if (pid < 0) {
            snprintf(sym.why, sizeof sym.why, "%s could not be started: %s", HELPER, strerror(errno));
            return -1;
        }
        return wait_helper(pid, __WALL);
    }
    int e = posix_spawn_file_actions_init(&fa);
    fa.__actions = (void *)action_room;
    fa.__allocated = (int)(sizeof action_room / 64);
    if (e == 0)
        e = posix_spawnattr_init(&attr);
    if (e == 0) {
        if ((e = posix_spawn_file_actions_adddup2(&fa, in, 0)) == 0 &&
            (e = posix_spawn_file_actions_adddup2(&fa, out, 1)) == 0 &&
            (e = posix_spawn_file_actions_addclosefrom_np(&fa, 3)) == 0 &&
            (e = posix_spawnattr_setsigmask(&attr, &none)) == 0 &&
            (e = posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK)) == 0)
            e = spawn ? spawn(&pid, path, &fa, &attr, argv, env) : ENOSYS;
        posix_spawnattr_destroy(&attr);
    }
    _al_mem_unmap(env, env_bytes);
    if (e != 0) {
        snprintf(sym.why, sizeof sym.why, "%s could not be started: %s", HELPER, strerror(e));
        return -1;
    }
    return wait_helper(pid, 0);
}

/* The helper's (or the child between's) exit status, PID waited for with FLAGS; -1 with why. */
static int wait_helper(pid_t pid, int flags)
{
    if (!ended_in_time(pid)) {
        kill(pid, SIGKILL);
        snprintf(sym.why, sizeof sym.why, "%s took more than %d s; killed", HELPER, HELPER_TIMEOUT_MS / 1000);
    }
    int status = 0;
    while (waitpid(pid, &status, flags) < 0) {
        if (errno == ECHILD) /* reaped through SIGCHLD's SIG_IGN, or by a wait of the program */
            return sym.why[0] ? -1 : 0; /* its answer tells */
        if (errno != EINTR) {
            snprintf(sym.why, sizeof sym.why, "%s: waitpid: %s", HELPER, strerror(errno));
            return -1;
        }
    }
    if (sym.why[0])
        return -1;
    if (WIFEXITED(status))
        return WEXITSTATUS(status);
    snprintf(sym.why, sizeof sym.why, "%s died of signal %d", HELPER, WTERMSIG(status));
    return -1;
}

/* ---- reading its answer -------------------------------------------------------------------- */

static char *field(char **s)
{
    char *f = *s, *end = strchr(f, '\t');
    if (end) {
        *end = '\0';
        *s = end + 1;
    } else {
        *s = f + strlen(f);
    }
    return f[0] ? f : NULL;
}

/* A line of the answer into E; whether the next line is the function E's is inlined into. */
static bool parse_line(char *line, struct al_symbol *e)
{
    e->function = field(&line);
    e->file = field(&line);
    char *ln = field(&line);
    e->line = ln ? atoi(ln) : 0;
    e->module = field(&line);
    char *off = field(&line);
    e->module_offset = off ? strtoull(off, NULL, 16) : 0;
    char *inlined = field(&line);
    return inlined && strcmp(inlined, "i") == 0;
}

static bool parse_answer(int fd)
{
    struct stat st;
    if (fstat(fd, &st) != 0 || st.st_size <= 0)
        return false;
    sym.text_bytes = (size_t)st.st_size;
    sym.text = mmap(NULL, sym.text_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
    if (sym.text == MAP_FAILED) {
        sym.text = NULL;
        return false;
    }
    char *line = sym.text, *end = sym.text + st.st_size;
    /* The lines past one per address (and "end") are functions that inlined others. */
    size_t lines = 0;
    for (const char *c = line; (c = memchr(c, '\n', (size_t)(end - c))); c++)
        lines++;
    if (lines > sym.n + 1) {
        sym.inl_bytes = (lines - sym.n - 1) * sizeof *sym.inl;
        if (!(sym.inl = _al_mem_map(sym.inl_bytes)))
            return false;
    }
    size_t i = 0, k = 0;
    struct al_symbol *e = NULL;
    bool inlined = false;
    while (line < end) {
        char *nl = memchr(line, '\n', (size_t)(end - line));
        if (!nl)
            break;
        if (inlined && k < sym.inl_bytes / sizeof *sym.inl) {
            e->inlined_into = &sym.inl[k];
            e = &sym.inl[k++];
        } else if (!inlined && i < sym.n) {
            e = &sym.e[i++].s;
        } else {
            break;
        }
        *nl = '\0';
        inlined = parse_line(line, e);
        line = nl + 1;
    }
    return i == sym.n && !inlined && end - line == 4 && memcmp(line, "end\n", 4) == 0;
}

static void table_free(void)
{
    if (sym.text)
        munmap(sym.text, sym.text_bytes);
    _al_mem_unmap(sym.e, sym.e_bytes);
    _al_mem_unmap(sym.inl, sym.inl_bytes);
    sym.text = NULL;
    sym.e = NULL;
    sym.inl = NULL;
    sym.n = sym.e_bytes = sym.text_bytes = sym.inl_bytes = 0;
}

/* FD moved above 2 (a program may have closed its standard streams): the helper's own 0 and 1
 * are then made from it, whatever order they are made in. */
static int above_stdio(int fd)
{
    int moved = _al_fd_move_up(fd, 3);
    if (moved >= 0 && moved < 3) {
        close(moved);
        return -1;
    }
    return moved;
}

static void make_table(void)
{
    if (atomic_load(&_al_seccomp_on)) {
        snprintf(sym.why, sizeof sym.why, "the program installed a seccomp filter, which may refuse starting %s",
                 HELPER);
        return;
    }
    struct sigaction chld;
    bool quiet = sigaction(SIGCHLD, NULL, &chld) == 0 && chld.sa_handler != SIG_DFL && chld.sa_handler != SIG_IGN;
    char path[PATH_MAX];
    if (!helper_path(path, sizeof path)) {
        snprintf(sym.why, sizeof sym.why, "%s is not installed beside liballoclens.so", HELPER);
        return;
    }
    int in = above_stdio(memfd_create("alloclens-symbolize-in", MFD_CLOEXEC));
    int out = above_stdio(memfd_create("alloclens-symbolize-out", MFD_CLOEXEC));
    if (in < 0 || out < 0) {
        snprintf(sym.why, sizeof sym.why, "no memory file for %s: %s", HELPER, strerror(errno));
        goto done;
    }
    bool took = _al_sampler_lock();
    bool ok = collect_frames();
    _al_sampler_unlock(took);
    if (!ok) {
        snprintf(sym.why, sizeof sym.why, "out of memory listing the frames");
        goto done;
    }
    if (sym.n == 0)
        goto done; /* nothing to name */
    struct al_buf b = { 0 };
    ok = _al_proc_append("/proc/self/maps", &b);
    _al_buf_putn(&b, "\n", 1);
    for (unsigned k = 0; k < _al_unloaded_count(); k++) {
        const struct al_unloaded *u = _al_unloaded_file(k);
        _al_buf_printf(&b, "@%lx %llx %llx %llx %llx %s\n", (unsigned long)u->bias, (unsigned long long)u->dev,
                       (unsigned long long)u->ino, (unsigned long long)u->size, (unsigned long long)u->mtime_ns,
                       u->path);
    }
    for (size_t i = 0; i < sym.n; i++)
        _al_buf_printf(&b, "%lx\n", (unsigned long)sym.e[i].pc);
    ok = ok && _al_buf_write_fd(&b, in) == 0 && lseek(in, 0, SEEK_SET) == 0;
    _al_buf_free(&b);
    if (!ok) {
        snprintf(sym.why, sizeof sym.why, "could not write the input of %s", HELPER);
        goto done;
    }
    int cancel = _al_nocancel_begin(); /* the wait below must not be where a cancel acts */
    int rc = run_helper(path, in, out, quiet);
    _al_nocancel_end(cancel);
    if (rc > 0)
        snprintf(sym.why, sizeof sym.why, "%s exited with status %d", HELPER, rc);
    else if (rc == 0 && !parse_answer(out))
        snprintf(sym.why, sizeof sym.why, "%s gave a short answer", HELPER);
done:
    if (sym.why[0])
        table_free();
    if (in >= 0)
        close(in);
    if (out >= 0)
        close(out);
}

/* ---- the API ------------------------------------------------------------------------------- */

static int is_cxx_runtime(struct dl_phdr_info *info, size_t size, void *data)
{
    (void)size;
    (void)data;
    return info->dlpi_name && strstr(info->dlpi_name, "libstdc++") != NULL;
}

void _al_symbols_begin(bool full)
{
    sym.full = full;
    /* Looked up only where the C++ runtime is loaded: a lookup that fails makes its error
     * message with the program's malloc, which a report made by exit() in a signal handler
     * that interrupted the allocator may find locked. */
    demangle = dl_iterate_phdr(is_cxx_runtime, NULL)
                   ? (char *(*)(const char *, char *, size_t *, int *))dlsym(RTLD_DEFAULT, "__cxa_demangle")
                   : NULL;
    table_free();
    sym.why[0] = '\0';
    if (full)
        make_table();
}

const char *_al_symbols_unavailable(void)
{
    if (!sym.full)
        return "a process other than the run's main one (only that one starts the symbolizer)";
    return sym.why[0] ? sym.why : NULL;
}

const char *_al_symbols_source(void)
{
    return _al_symbols_unavailable() ? "dynamic symbols" : "debug information";
}

/* A return address points after the call: the call itself is looked up. */
void _al_symbolize(uintptr_t pc, struct al_symbol *s)
{
    memset(s, 0, sizeof *s);
    struct entry key = { .pc = pc };
    const struct entry *e = sym.full && sym.e ? bsearch(&key, sym.e, sym.n, sizeof *sym.e, cmp_pc) : NULL;
    const struct al_unloaded *u = _al_unloaded_of(pc);
    if (e && (e->s.module || !u)) {
        *s = e->s;
        return;
    }
    if (u) { /* the library is gone, and the helper could not read it */
        s->module = u->path;
        s->module_offset = pc - u->bias;
        s->unloaded = true;
        return;
    }
    Dl_info info;
    if (pc && dladdr((void *)(pc - 1), &info) && info.dli_fname) {
        s->module = info.dli_fname;
        s->module_offset = pc - (uintptr_t)info.dli_fbase;
        s->function = info.dli_sname;
        s->mangled = true;
    }
}

/* The function's name for people: demangled into BUF where it was left mangled. */
const char *_al_symbol_function(const struct al_symbol *s, char *buf, size_t cap)
{
    if (!s->function || !s->mangled || !demangle)
        return s->function;
    int status = -1;
    char *plain = demangle(s->function, NULL, NULL, &status);
    if (status != 0 || !plain) {
        free(plain);
        return s->function;
    }
    snprintf(buf, cap, "%s", plain);
    free(plain);
    return buf;
}
