#!/usr/bin/env python3
"""Never break the host program: each host_* program is run plain and under
`alloclens run -a NAME`, for every allocator found, and its stdout, stderr and exit status
(death by signal included) must be identical. "Plain" for a non-glibc allocator means
LD_PRELOAD of that allocator alone, so the comparison is like for like. glibc is also run
without the CLI ("direct": LD_PRELOAD=liballoclens.so with ALLOCLENS_OUTPUT/ALLOCLENS_TEXT).
Every allocator is also run in --mode sample (whose entry points jump to the allocator with the
thread not marked busy), and glibc in --mode time.

Under alloclens, the main process's JSON report must be there and parse when the program
exits normally (with program.exit_status equal to the status), the text report must be in its
file, and processes forked or exec'd must have left their own REPORT.<pid>.json.

usage: test_host_behaviour.py LIBALLOCLENS.so PLUGIN.so RAISE_IN_MALLOC.so HOST_PROGRAM...
"""
import concurrent.futures
import glob
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import altest

TIMEOUT = 15  # seconds for one run; a hang is a failure, not a stuck test
MAX_HANGS = 2  # after this many hangs under one allocator, its remaining cases are not run
WARMUP_BUDGET = 150  # seconds for all the first runs (probes) together
HANGS = {}     # allocator -> runs that hung
DIRECT = "glibc direct"  # LD_PRELOAD=liballoclens.so without the CLI, in front of glibc
SO = None  # path of liballoclens.so


def case(label, prog, args=(), main_report=True, child_statuses=(),
         check=None, default_text=False, only=(), env=None, ignored=()):
    """One program run.

    main_report: the main process exits normally, so REPORT.json must hold its report.
    child_statuses: exit statuses that other processes' reports (REPORT.<pid>.json) must show,
        one report per entry.
    check: optional function(tap, desc, main, sides, stdout, stderr) for checks of its own
        (stdout, stderr: the profiled run's, bytes).
    default_text: no --text (the human report goes to stderr, as by default), so stderr is not
        compared. An argument "@data" is a file in the run's own directory, whose content must
        be the same in both runs.
    only: the allocators it runs under (every mode of each); empty: all of them.
    env: variables set for both runs (ALLOCLENS_* ones reach the profiled run's library).
    ignored: signals (INT, TERM...) the program starts with ignored, as a non-interactive
        shell's background job does.
    """
    return dict(label=label, prog=prog, args=list(args), main_report=main_report,
                child_statuses=list(child_statuses), check=check,
                default_text=default_text, only=only, env=env or {}, ignored=list(ignored))


def check_sigchld(tap, desc, main, sides, stdout, stderr):
    """host_signals sigchld: the symbolizer ran as a grandchild, whose exit raises no SIGCHLD in
    the program (its handler's line would be in stdout, compared with the plain run's), and the
    frames have names from debug information (before, it was not run at all: dynamic symbols
    only, as Go and node programs, which handle SIGCHLD, always had)."""
    sites = (main or {}).get("sites", {})
    names = [f for r in sites.get("top") or [] for f in r.get("stack") or []]
    tap.ok(sites.get("available") and sites.get("sites") and sites.get("symbols") == "debug information"
           and any(re.search(r"host_signals\.c:\d+\)$", f) for f in names),
           f"{desc}: sites sampled (16 MiB at 512 KiB), named from debug information",
           f"{sites.get('sites')} sites; {sites.get('symbols')}: {sites.get('symbols_reason')}; {names[:4]}")


def check_thread_memory(tap, desc, main, sides, stdout, stderr):
    """host_threads many: what alloclens maps does not grow with every thread the program ever
    started. A state for the C library's frees at a thread's very end, past its exit callback,
    was kept for good: 12 KiB a thread, 39 MiB for these 3320 (past 60 MiB in all in the timed
    modes). States are reused: what stays is about one per thread alive at once (64 here), and
    in the timed modes each has its class rows mapped (256 KiB under glibc)."""
    mapped = ((main or {}).get("profiler") or {}).get("mapped_bytes")
    most = 16 if "--mode sample" in desc else 48
    tap.ok(isinstance(mapped, int) and mapped < most << 20,
           f"{desc}: alloclens maps under {most} MiB after 3320 threads", f"profiler.mapped_bytes {mapped}")


def check_timer_threads(tap, desc, main, sides, stdout, stderr):
    """host_signals sigev-thread: the C library starts the timer's helper thread and a thread per
    expiry itself, past the interposed pthread_create; each is counted as it first allocates,
    and the calls made while they live are the parallel phase's."""
    threads = (main or {}).get("threads") or {}
    tap.ok(threads.get("total", 0) >= 3 and threads.get("max_live", 0) >= 2
           and threads.get("parallel_ns", 0) > 0,
           f"{desc}: the C library's own threads counted (main, the helper, one per expiry)",
           f"threads {threads}")


def check_stdclose(tap, desc, main, sides, stdout, stderr):
    """host_fds stdclose: the program closed stderr at its end; the text report, due there, still
    came (on a copy of that stderr kept as the program closed it)."""
    tap.ok(b"== alloclens report" in stderr, f"{desc}: the text report is on stderr",
           stderr.decode(errors="replace")[-1500:])


def check_closed(tap, desc, main, sides, stdout, stderr):
    """host_fds closed: the symbolizer's input and output are not the closed descriptors' numbers."""
    sites = (main or {}).get("sites", {})
    tap.ok(sites.get("available") and sites.get("sites") and sites.get("symbols") == "debug information",
           f"{desc}: sites sampled and named from debug information",
           f"{sites.get('sites')} sites; {sites.get('symbols')}: {sites.get('symbols_reason')}")


def check_listed(tap, desc, main, sides, stdout, stderr):
    """host_fds listed: stacks are still walked after the walk's pipe was closed (libunwind makes
    another when it needs one): both functions' sites are there, named."""
    sites = (main or {}).get("sites", {})
    frames = [f for r in sites.get("top_by_allocated") or [] for f in (r.get("stack") or [])[:1]]
    tap.ok(all(any(f.startswith(name + " (") for f in frames) for name in ("pages_first", "pages_then")),
           f"{desc}: sites of both functions that allocate, named", f"innermost frames {frames}")


def check_full(tap, desc, main, sides, stdout, stderr):
    """host_fds full: the report's files and the symbolizer had descriptors (the soft limit
    raised for the report's time): sites named from debug information."""
    sites = (main or {}).get("sites", {})
    tap.ok(sites.get("available") and sites.get("symbols") == "debug information",
           f"{desc}: sites named from debug information",
           f"{sites.get('symbols')}: {sites.get('symbols_reason')}")


def check_inplace(tap, desc, main, sides, stdout, stderr):
    """host_exec inplace: the pre-exec image wrote a side report; the leaf (same pid, the main
    process) wrote REPORT.json with status 6."""
    argv = (main or {}).get("program", {}).get("argv", [])
    tap.ok(main is not None and any("in-place leaf" in a for a in argv),
           f"{desc}: REPORT.json is the exec'd leaf's", f"argv {argv}")
    pre = [r for r in sides if any(a.endswith("host_exec") for a in r["program"].get("argv", []))]
    tap.ok(len(pre) == 1 and main and pre[0]["program"]["pid"] == main["program"]["pid"],
           f"{desc}: the image replaced by exec wrote REPORT.<pid>.json first",
           f"side reports: {[r['program'].get('argv') for r in sides]}")


def valloc_lines(stdout):
    return [int(l.split("=")[1]) for l in stdout.decode(errors="replace").splitlines()
            if l.startswith("valloc=")]


def report_vallocs(report):
    return sum(int(r["count"]) for r in report.get("ops", []) if r["op"] == "valloc")


def check_vallocs(tap, desc, main, sides, stdout, stderr):
    """The program's vallocs (it prints valloc=N, once or in parts) are the report's, exactly."""
    lines = valloc_lines(stdout)
    got = report_vallocs(main) if main else None
    tap.ok(lines and got == sum(lines), f"{desc}: every valloc counted",
           f"program says {lines}, report {got}")


def check_signal_at_start(tap, desc, main, sides, stdout, stderr):
    """host_threads signal-at-start: every valloc counted, and each thread counted once: the
    handler, when it ran before the thread's state was made, made one of its own."""
    check_vallocs(tap, desc, main, sides, stdout, stderr)
    threads = (main or {}).get("threads", {})
    tap.ok((threads.get("total"), threads.get("max_live")) == (1001, 2),
           f"{desc}: 1001 threads, at most 2 live at once", f"report: {threads}")


def check_throw(tap, desc, main, sides, stdout, stderr):
    """host_throw: every failed operator new counted (large, address n/a), and the calls the
    program makes after the exceptions unwound through the wrappers counted."""
    line = stdout.decode(errors="replace").strip()
    if line.startswith("mimalloc"):
        tap.skip(f"{desc}: failed operator new calls counted", line)
        return
    truth = dict(kv.split("=") for kv in line.split())
    ops = (main or {}).get("ops", [])
    threw = sum(int(r["count"]) for r in ops if r["op"] == "new" and r["size_class"] == "large")
    tap.ok(threw == int(truth["threw"]) and all(
        r["reuse"] == "n/a" for r in ops if r["op"] == "new" and r["size_class"] == "large"),
           f"{desc}: each failed operator new counted once, large, address n/a",
           f"program: {line}; report: {threw}")
    vallocs = report_vallocs(main or {})
    tap.ok(vallocs == int(truth["valloc"]),
           f"{desc}: every valloc after the exceptions and in the new-handler counted",
           f"program: {truth['valloc']}; report: {vallocs}")
    news = sum(int(r["count"]) for r in ops
               if r["op"] == "new" and r["size_class"] == "small" and r["phase"] == "parallel")
    tap.ok(news == int(truth["parallel_new"]), f"{desc}: the new-handler's own operator new calls counted",
           f"program: {truth['parallel_new']}; report: {news}")


def check_quick_exit(tap, desc, main, sides, stdout, stderr):
    """host_quick_exit: the process that ended with _exit counted every valloc; so did a forked
    child that did (its own report), and a vfork child left no report at all."""
    lines = valloc_lines(stdout)
    if not tap.ok(lines, f"{desc}: the program printed its valloc count", stdout):
        return
    got = report_vallocs(main or {})
    tap.ok(got == lines[-1], f"{desc}: the main report counts every valloc",
           f"program: {lines[-1]}; report: {got}")
    main_pid = (main or {}).get("program", {}).get("pid")
    children = sorted(report_vallocs(r) for r in sides if r["program"].get("pid") != main_pid)
    tap.ok(children == sorted(lines[:-1]),
           f"{desc}: a report for each forked child that ended with _exit, none for a vfork child",
           f"children's lines {lines[:-1]}; side reports count {children}")


def check_quick_exit_handler(tap, desc, main, sides, stdout, stderr):
    """host_quick_exit quick_exit: the report was written after the program's at_quick_exit
    handler, so it counts the handler's vallocs too, with quick_exit's status."""
    lines = valloc_lines(stdout)
    got = report_vallocs(main or {})
    tap.ok(len(lines) == 2 and got == sum(lines) and main["program"].get("exit_status") == 5,
           f"{desc}: the report counts every valloc, the handler's included, with status 5",
           f"program: {lines}; report: {got}, status {(main or {}).get('program', {}).get('exit_status')}")


def check_sh(tap, desc, main, sides, stdout, stderr):
    """host_quick_exit sh: /bin/sh (dash on Debian, which ends with _exit) exec'd in place wrote
    REPORT.json; the image it replaced wrote its side report with its 10 vallocs."""
    argv = (main or {}).get("program", {}).get("argv", [])
    tap.ok(argv[:2] == ["sh", "-c"], f"{desc}: REPORT.json is the shell's", f"argv {argv}")
    pre = [r for r in sides if any(a.endswith("host_quick_exit") for a in r["program"].get("argv", []))]
    tap.ok(len(pre) == 1 and report_vallocs(pre[0]) == valloc_lines(stdout)[0],
           f"{desc}: the image replaced by exec wrote REPORT.<pid>.json, every valloc counted",
           f"program: {valloc_lines(stdout)}; side reports: "
           f"{[(r['program'].get('argv'), report_vallocs(r)) for r in sides]}")


def report_or_why(key, value, what):
    """A check for a process that most likely ended inside an allocator call: either the report
    is there with program.KEY == VALUE (WHAT says so), or one line says why there is none."""
    def check(tap, desc, main, sides, stdout, stderr):
        said = b"no report for this process" in stderr
        tap.ok((main is not None and main["program"].get(key) == value and not said)
               or (main is None and said),
               f"{desc}: {what}, or a line saying why not",
               f"report: {None if main is None else main['program']}; stderr: {stderr[-500:]!r}")
    return check


# host_quick_exit in-malloc: _exit(7) from a handler that most likely interrupted the allocator
# (holding its lock); the report, if any, was written without the allocator.
check_in_malloc = report_or_why("exit_status", 7, "the report with exit status 7")
# host_signals overflow: abort() from a handler on a small alternate stack; the report is
# written on the caller's stack before the default is put back, unless the overflow came
# inside an allocator call.
check_overflow = report_or_why("signal", signal.SIGABRT, "the report, ended by SIGABRT")


CASES = [
    case("leaf exit 0", "host_leaf", ["0"]),
    case("leaf exit 42", "host_leaf", ["42", "5000"]),
    case("fork basic", "host_fork", ["basic"], child_statuses=[7]),
    case("fork nested", "host_fork", ["nested"], child_statuses=[4, 3]),
    case("fork with 4 threads allocating", "host_fork", ["threads"],
         child_statuses=[k % 8 for k in range(16)]),
    case("fork child atexit allocates", "host_fork", ["atexit"], child_statuses=[9]),
    case("children made by the clone, clone3 and fork system calls and by glibc's clone()",
         "host_fork", ["raw"], child_statuses=[11, 12, 13, 14]),
    case("a child calls daemon(): its parent side and the daemon each write a report",
         "host_fork", ["daemon"], child_statuses=[0, 0]),
    case("forks 4 levels deep while 2 threads at each allocate",
         "host_fork", ["tree"], child_statuses=[3, 2, 1, 0]),
    case("fork+execl /bin/echo", "host_exec", ["echo", "@leaf"]),
    case("fork+execvp echo", "host_exec", ["execvp", "@leaf"]),
    case("fork+execlp sh", "host_exec", ["execlp", "@leaf"]),
    case("fork+execle own env", "host_exec", ["execle", "@leaf"]),
    case("fork+execv host_leaf", "host_exec", ["leaf", "@leaf"], child_statuses=[5]),
    case("fork+fexecve host_leaf", "host_exec", ["fexecve", "@leaf"], child_statuses=[8]),
    case("posix_spawn, posix_spawnp host_leaf", "host_exec", ["spawn", "@leaf"], child_statuses=[9, 10]),
    case("execv in place", "host_exec", ["inplace", "@leaf"], check=check_inplace),
    case("failed execs then carry on", "host_exec", ["enoent", "@leaf"]),
    case("SIGALRM+SIGUSR1 handlers", "host_signals", ["handlers"]),
    case("a SIGALRM handler set by the rt_sigaction system call, unseen by alloclens",
         "host_signals", ["raw-sigaction"]),
    case("raise SIGTERM", "host_signals", ["term"]),
    case("SIGTERM with threads allocating", "host_signals", ["term-threads"]),
    case("SIGTERM to a thread inside the allocator", "host_signals", ["term-busy"]),
    case("write to a pipe nobody reads: SIGPIPE", "host_signals", ["pipe"]),
    case("dispositions as the program sees them; SIGINT at its default", "host_signals",
         ["dispositions"]),
    case("a one-shot SIGTERM handler (SA_RESETHAND) that raises it again", "host_signals",
         ["resethand"]),
    case("the same, SIGTERM ignored when the program started (a background job's)",
         "host_signals", ["resethand"], ignored=("TERM",)),
    case("SIGINT and SIGHUP ignored at start; the program sets SIGINT's default and raises it",
         "host_signals", ["dispositions"], ignored=("INT", "HUP")),
    case("abort", "host_signals", ["abort"]),
    case("abort() from a SIGSEGV handler on a small alternate stack (a stack overflow)",
         "host_signals", ["overflow"], main_report=False, default_text=True, check=check_overflow),
    case("a bad memory access: SIGSEGV", "host_signals", ["segv"]),
    case("division by zero while threads allocate: SIGFPE", "host_signals", ["fpe-threads"]),
    case("the program's own SIGSEGV handler recovers", "host_signals", ["segv-caught"]),
    case("_exit from a signal handler", "host_signals", ["exit-handler"]),
    case("a periodic SIGEV_THREAD timer whose function allocates", "host_signals", ["sigev-thread"],
         check=check_timer_threads),
    # Samples on the timer's helper thread: libunwind's locks block and restore signals with a
    # mask the C library sets without SIGTIMER, which the helper keeps blocked to wait for it.
    case("the same, a 100 us timer for 300 ms, allocations sampled every 256 bytes", "host_signals",
         ["sigev-thread", "100", "300"], env={"ALLOCLENS_SAMPLE_RATE": "256"}),
    # Every allocation sampled: most forks come while the main thread is inside the sampler,
    # holding its lock or unwinding; a child that ends inside a call says so on stderr. glibc
    # only: jemalloc's and tcmalloc's own fork handlers wait for their locks, which such a
    # fork can find held by the call it interrupted, and the plain run hangs.
    case("fork from a signal handler, the child's _exit at once", "host_signals", ["fork-handler"],
         default_text=True, env={"ALLOCLENS_SAMPLE_RATE": "1"}, only=("glibc", DIRECT)),
    case("a signal handler's pipe, often inside the sampler's stack walk", "host_signals",
         ["handler-pipe"], env={"ALLOCLENS_SAMPLE_RATE": "4096"}),
    case("blocked signal, sigsuspend", "host_signals", ["mask"]),
    case("the C library's older signal calls (sigset, sysv_signal, sighold, sigblock...); "
         "handlers that allocate inside sigsuspend, pselect, ppoll, epoll_pwait with every "
         "other signal masked", "host_signals", ["legacy"]),
    case("coroutines whose contexts block every signal (swapcontext, setcontext) allocate",
         "host_signals", ["contexts"]),
    case("a SIGCHLD handler sees no child of alloclens", "host_signals", ["sigchld"],
         check=check_sigchld),
    case("dlopen/dlclose plugin", "host_dlopen", ["@plugin"]),
    case("allocations inside dl_iterate_phdr callbacks while a plugin is loaded and unloaded "
         "and two threads allocate, every 64 bytes sampled", "host_dlopen",
         ["@plugin", "iterate"], env={"ALLOCLENS_SAMPLE_RATE": "64"}),
    case("a library whose constructor and destructor start a thread and wait for it (the "
         "constructor's starts one more)", "host_dlopen", ["@loader_threads"], check=check_vallocs),
    case("exit(3) with 4 detached threads allocating", "host_exit_threads", ["exit"]),
    case("exit(7) while 3 threads fork without pause and 2 allocate", "host_fork", ["exit-forking"]),
    case("return 4 from main with threads allocating", "host_exit_threads", ["return"]),
    case("_exit(5) with threads allocating", "host_exit_threads", ["_exit"]),
    case("_exit(3)", "host_quick_exit", ["_exit"], check=check_quick_exit),
    case("_Exit(4)", "host_quick_exit", ["_Exit"], check=check_quick_exit),
    case("exit(0) whose atexit handler calls _exit(9)", "host_quick_exit", ["atexit"],
         check=check_quick_exit),
    case("forked child ends with _exit(6)", "host_quick_exit", ["fork"], child_statuses=[6],
         check=check_quick_exit),
    case("vfork child ends with _exit(2)", "host_quick_exit", ["vfork"], check=check_quick_exit),
    case("quick_exit(5), whose handler allocates", "host_quick_exit", ["quick_exit"],
         check=check_quick_exit_handler),
    case("sh -c exec'd in place ends with _exit(3)", "host_quick_exit", ["sh"], check=check_sh),
    case("_exit(7) from a timer handler, likely inside the allocator", "host_quick_exit",
         ["in-malloc"], main_report=False, default_text=True, check=check_in_malloc),
    case("exit(6) from a thread while others allocate", "host_exit_threads", ["thread"]),
    case("pthread_exit from main", "host_pthread_exit"),
    case("3320 short-lived threads", "host_threads", ["many"], check=check_thread_memory),
    case("pthread_key destructors allocate at thread exit", "host_threads", ["keydtor"]),
    case("pthread_cancel threads that allocate", "host_threads", ["cancel"]),
    case("a cancel pending while the thread allocates", "host_threads", ["cancel-pending"]),
    case("as many pthread keys as plain", "host_threads", ["keys"]),
    case("a detached thread's exit frees another's cached stack, and glibc trims the heap",
         "host_threads", ["detached-trim"]),
    case("1000 threads each sent at once a signal whose handler allocates", "host_threads",
         ["signal-at-start"], check=check_signal_at_start),
    case("threads with the smallest stack; exit from one", "host_threads", ["smallstack"]),
    case("exec from a thread with the smallest stack", "host_threads",
         ["smallstack-exec", "@leaf"]),
    case("a coroutine on a 5 KiB stack allocates, nearly every allocation sampled",
         "host_threads", ["coroutine"], env={"ALLOCLENS_SAMPLE_RATE": "64"}),
    case("vfork+execve", "host_vfork"),
    case("posix_spawn, system, popen", "host_spawn"),
    case("errno and edge cases", "host_errno"),
    case("stderr closed, fd 2 reused for a data file", "host_fds", ["data", "@data"],
         default_text=True),
    case("no descriptors of alloclens left open in the program", "host_fds", ["count"]),
    case("stdin and stdout closed before exit", "host_fds", ["closed"], check=check_closed),
    case("stdout and stderr closed with fclose at exit, as coreutils do", "host_fds", ["stdclose"],
         default_text=True, check=check_stdclose),
    case("descriptors numbered as without alloclens; every one closed, then fork", "host_fds",
         ["numbers"]),
    case("the same after the program lowered its descriptor limit", "host_fds", ["lowered"]),
    case("every descriptor closed, then a pipe of the program's where libunwind had its own; "
         "allocations unwound: the pipe's bytes and ends are the program's", "host_fds", ["unwinder"]),
    case("the program lists its open descriptors after allocations unwound: none of alloclens's "
         "(event counters off; not tcmalloc, whose own libunwind pipe alloclens keeps open)",
         "host_fds", ["listed"], only=("glibc", DIRECT, "jemalloc", "mimalloc"),
         env={"ALLOCLENS_EVENTS": "off"}, check=check_listed),
    case("exit with every descriptor the limit allows open: the report still written",
         "host_fds", ["full"], check=check_full),
    case("allocations under a 1.5 GiB ulimit -v", "host_rlimit"),
    case("allocations under a 64 MiB ulimit -v", "host_rlimit", ["tight"]),
    case("no memory at all for the allocator under a 24 MiB ulimit -v", "host_rlimit",
         ["starved"], only=("mimalloc",)),
    case("a spin lock taken before alloclens started", "host_spin"),
    case("operator new throws bad_alloc, caught; the program goes on", "host_throw",
         check=check_throw),
    case("the same from a C++ library a C program loads with dlopen, RTLD_LOCAL",
         "host_throw_late", ["@throw_plugin"], check=check_throw),
]


def clean_env():
    env = altest.plain_env()
    # Both runs see the same environment; tcmalloc's large-allocation warnings print stack
    # addresses that differ from run to run (ASLR), so they are turned off for both.
    env["TCMALLOC_LARGE_ALLOC_REPORT_THRESHOLD"] = str(1 << 62)
    return env


def split_mode(alloc):
    """'NAME --mode MODE' -> (NAME, MODE); a plain name runs in the default mode."""
    name, _, mode = alloc.partition(" --mode ")
    return name, mode or None


def launch(argv, env, tmp, ignored):
    """Runs ARGV; with IGNORED signals, through env(1), which ignores them and execs it (the
    preload, if any, set for ARGV alone)."""
    if ignored:
        preload = [f"LD_PRELOAD={env.pop('LD_PRELOAD')}"] if "LD_PRELOAD" in env else []
        argv = ["env", "--ignore-signal=" + ",".join(ignored), *preload, *argv]
    return subprocess.run(argv, env=env, capture_output=True, timeout=TIMEOUT, cwd=tmp)


def run_plain(alloc, path, argv, tmp, extra, ignored):
    env = dict(clean_env(), **extra)
    if split_mode(alloc)[0] not in ("glibc", DIRECT):
        env["LD_PRELOAD"] = path
    return launch(argv, env, tmp, ignored)


def run_profiled(alloc, argv, tmp, default_text, extra, ignored):
    env = dict(clean_env(), **extra)
    out = os.path.join(tmp, "r.json")
    txt = os.path.join(tmp, "r.txt")
    if alloc == DIRECT:
        env.update(LD_PRELOAD=SO, ALLOCLENS_OUTPUT=out)
        if not default_text:
            env["ALLOCLENS_TEXT"] = txt
        return launch(argv, env, tmp, ignored)
    text = [] if default_text else ["--text", txt]
    name, mode = split_mode(alloc)
    if mode:
        env["ALLOCLENS_MODE"] = mode
    return launch([altest.cli(), "run", "-a", name, "-o", out, *text, "--", *argv],
                  env, tmp, ignored)


def one(alloc, path, c, progs, plugin):
    """Runs one case both ways, each in a directory of its own; returns (plain, profiled,
    plain's directory, profiled's directory); a run that hangs is the string 'timeout'."""
    def argv(tmp):
        subst = {"@leaf": progs["host_leaf"], "@plugin": plugin,
                 "@throw_plugin": os.path.join(os.path.dirname(plugin), "libhost_throw_plugin.so"),
                 "@loader_threads": os.path.join(os.path.dirname(plugin), "libhost_loader_threads.so"),
                 "@data": os.path.join(tmp, "data.out")}
        return [progs[c["prog"]]] + [subst.get(a, a) for a in c["args"]]
    if HANGS.get(alloc, 0) >= MAX_HANGS:
        return "skipped", "skipped", None, None
    ptmp, tmp = altest.tmpdir(), altest.tmpdir()
    t0 = time.monotonic()
    try:
        plain = run_plain(alloc, path, argv(ptmp), ptmp, c["env"], c["ignored"])
    except subprocess.TimeoutExpired:
        plain = "timeout"
    t1 = time.monotonic()
    try:
        prof = run_profiled(alloc, argv(tmp), tmp, c["default_text"], c["env"], c["ignored"])
    except subprocess.TimeoutExpired:
        prof = "timeout"
        HANGS[alloc] = HANGS.get(alloc, 0) + 1
    c.setdefault("times", {})[alloc] = (t1 - t0, time.monotonic() - t1)
    return plain, prof, ptmp, tmp


def read_bytes(path):
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as e:
        return f"<{e}>".encode()


def status_text(rc):
    if rc < 0:
        try:
            return f"{rc} (killed by {signal.Signals(-rc).name})"
        except ValueError:
            return f"{rc} (killed by signal {-rc})"
    return str(rc)


def load(path):
    try:
        with open(path) as f:
            return json.load(f), None
    except (OSError, ValueError) as e:
        return None, f"{path}: {e}"


def check(tap, alloc, c, plain, prof, ptmp, tmp):
    desc = f"{alloc}: {c['label']}"
    if plain == "skipped":
        tap.ok(False, f"{desc}: not run", f"{MAX_HANGS} earlier runs under {alloc} hung")
        return
    if plain == "timeout":
        tap.ok(False, f"{desc}: plain run finishes", f"plain run took over {TIMEOUT} s")
        return
    if not tap.ok(prof != "timeout", f"{desc}: finishes under alloclens",
                  f"hung for {TIMEOUT} s (plain run: status {status_text(plain.returncode)})"):
        return
    tap.ok(prof.returncode == plain.returncode, f"{desc}: exit status",
           f"plain {status_text(plain.returncode)}, alloclens {status_text(prof.returncode)}\n"
           f"alloclens stderr:\n{prof.stderr.decode(errors='replace')[-2000:]}")
    tap.ok(prof.stdout == plain.stdout, f"{desc}: stdout",
           f"plain:\n{plain.stdout.decode(errors='replace')}\n"
           f"alloclens:\n{prof.stdout.decode(errors='replace')}")
    if not c["default_text"]:
        tap.ok(prof.stderr == plain.stderr, f"{desc}: stderr",
               f"plain:\n{plain.stderr.decode(errors='replace')[-2000:]}\n"
               f"alloclens:\n{prof.stderr.decode(errors='replace')[-2000:]}")
    if "@data" in c["args"]:
        want = read_bytes(os.path.join(ptmp, "data.out"))
        got = read_bytes(os.path.join(tmp, "data.out"))
        same = len(os.path.commonprefix([want, got]))
        tap.ok(got == want, f"{desc}: the program's data file",
               f"plain {len(want)} bytes, alloclens {len(got)} bytes, the same for the first "
               f"{same}; from there, plain:\n{want[same:same + 300].decode(errors='replace')}\n"
               f"alloclens:\n{got[same:same + 600].decode(errors='replace')}")

    out = os.path.join(tmp, "r.json")
    main = None
    if c["main_report"]:
        main, err = load(out)
        if tap.ok(main is not None, f"{desc}: main report written and parseable", err):
            prog = main.get("program", {})
            if prof.returncode < 0:
                got = (prog.get("exit_status"), prog.get("signal"))
                tap.ok(got == (None, -prof.returncode),
                       f"{desc}: report's program.signal (exit_status null)",
                       f"report says {prog}, the process was killed by {-prof.returncode}")
            else:
                got = prog.get("exit_status")
                tap.ok(got == prof.returncode, f"{desc}: report's program.exit_status",
                       f"report says {got!r}, the process exited {prof.returncode}")
    elif os.path.exists(out):
        main, err = load(out)
        tap.ok(main is not None, f"{desc}: no main report expected; the file there parses", err)
    if c["main_report"] and not c["default_text"]:
        txt = os.path.join(tmp, "r.txt")
        tap.ok(os.path.isfile(txt) and os.path.getsize(txt) > 0, f"{desc}: text report written",
               f"{txt} missing or empty")

    sides, bad = [], []
    for p in sorted(glob.glob(os.path.join(tmp, "r.*.json"))):
        r, err = load(p)
        if r is None:
            bad.append(err)
        else:
            sides.append(r)
    tap.ok(not bad, f"{desc}: every side report parses", "\n".join(bad))
    main_pid = main.get("program", {}).get("pid") if main else None
    if c["child_statuses"]:
        got = sorted(r["program"].get("exit_status") for r in sides
                     if r.get("program", {}).get("pid") != main_pid)
        want = sorted(c["child_statuses"])
        missing = list(want)
        for s in got:
            if s in missing:
                missing.remove(s)
        tap.ok(not missing, f"{desc}: a report for each child (r.<pid>.json)",
               f"want exit statuses {want}, side reports show {got}\n"
               f"files: {sorted(os.listdir(tmp))}")
    if c["check"]:
        c["check"](tap, desc, main, sides, prof.stdout, prof.stderr)


def check_signal_in_allocator(tap, shim, leaf):
    """A signal raised from inside the allocator's malloc (host_raise_in_malloc, preloaded as an
    allocator is): it lands inside one of our calls every time. SIGTERM; SIGTERM twice in a
    row (the second comes with the first); SIGSEGV sent by another process (no crash: it waits
    for the call to end too). The process still dies by it, with its output its own, and the
    report is written, nothing said on stderr."""
    for how, sig in (("raise", signal.SIGTERM), ("twice", signal.SIGTERM), ("kill", signal.SIGSEGV)):
        signal_in_allocator(tap, shim, leaf, how, sig)


def check_exit_in_handler(tap, shim, prog):
    """A SIGUSR1 handler that calls exit(6), raised inside malloc while the allocator holds a
    lock of its own (host_raise_in_malloc, HOST_RAISE_HOW=locked): the report, made at that
    exit with sampled sites to name and a pprof profile to write, must not call the allocator (it would wait on that lock
    for ever; the shim ends the process with 99 instead and says so)."""
    argv = [prog, "exit-in-handler"]
    env = dict(clean_env(), HOST_RAISE_AT="3000", HOST_RAISE_SIGNAL=str(int(signal.SIGUSR1)),
               HOST_RAISE_HOW="locked")
    plain = subprocess.run(argv, env=dict(env, LD_PRELOAD=shim), capture_output=True, timeout=TIMEOUT)
    for mode in ("full", "time", "sample"):
        desc = f"exit() from a handler raised inside a locked malloc, --mode {mode}"
        tmp = altest.tmpdir()
        out = os.path.join(tmp, "r.json")
        try:
            prof = subprocess.run(argv, env=dict(env, LD_PRELOAD=f"{SO}:{shim}", ALLOCLENS_OUTPUT=out,
                                                 ALLOCLENS_TEXT="off", ALLOCLENS_MODE=mode,
                                                 ALLOCLENS_SAMPLE_RATE="4096",
                                                 ALLOCLENS_PPROF=os.path.join(tmp, "r.pb.gz")),
                                  capture_output=True, timeout=TIMEOUT)
        except subprocess.TimeoutExpired:
            tap.ok(False, f"{desc}: exits 6, output as plain", f"hung for {TIMEOUT} s")
            continue
        tap.ok(plain.returncode == prof.returncode == 6 and plain.stdout == prof.stdout,
               f"{desc}: exits 6, output as plain",
               f"plain {status_text(plain.returncode)}, alloclens {status_text(prof.returncode)}\n"
               f"{prof.stderr.decode(errors='replace')[-1000:]}")
        main, err = load(out)
        pprof = os.path.join(tmp, "r.pb.gz")
        tap.ok(main is not None and main["program"].get("exit_status") == 6
               and main["sites"].get("sites", 0) > 0 and os.path.exists(pprof) and os.path.getsize(pprof) > 0,
               f"{desc}: the report, with its sampled sites, and the pprof profile",
               err or f"{main['program']}; {pprof} exists: {os.path.exists(pprof)}")
        shutil.rmtree(tmp, ignore_errors=True)


def signal_in_allocator(tap, shim, leaf, how, sig):
    argv = [leaf, "0", "5000"]
    env = dict(clean_env(), HOST_RAISE_AT="2000", HOST_RAISE_SIGNAL=str(int(sig)), HOST_RAISE_HOW=how)
    plain = subprocess.run(argv, env=dict(env, LD_PRELOAD=shim), capture_output=True, timeout=TIMEOUT)
    for mode in ("full", "time", "sample"):
        desc = f"{sig.name} inside malloc ({how}), --mode {mode}"
        tmp = altest.tmpdir()
        out = os.path.join(tmp, "r.json")
        prof = subprocess.run(argv, env=dict(env, LD_PRELOAD=f"{SO}:{shim}", ALLOCLENS_OUTPUT=out,
                                             ALLOCLENS_TEXT="off", ALLOCLENS_MODE=mode),
                              capture_output=True, timeout=TIMEOUT)
        tap.ok(plain.returncode == prof.returncode == -sig and plain.stdout == prof.stdout,
               f"{desc}: dies by {sig.name}, output as plain",
               f"plain {status_text(plain.returncode)}, alloclens {status_text(prof.returncode)}")
        main, err = load(out)
        tap.ok(main is not None and main["program"].get("signal") == sig and prof.stderr == b"",
               f"{desc}: the report, ended by {sig.name}, and nothing on stderr",
               f"{err or main['program']}; stderr: {prof.stderr[-500:]!r}")
        shutil.rmtree(tmp, ignore_errors=True)


def main():
    global SO
    SO, plugin, shim = altest.so(), sys.argv[1], sys.argv[2]
    progs = {os.path.basename(p): p for p in sys.argv[3:]}
    tap = altest.Tap()
    allocs = altest.allocators()
    if "glibc" in allocs:
        allocs[DIRECT] = allocs["glibc"]
    tap.diag(f"allocators: {', '.join(f'{n} ({p})' for n, p in allocs.items())}")
    missing = [c["prog"] for c in CASES if c["prog"] not in progs]
    if missing:
        tap.ok(False, "host programs given on the command line", f"missing: {missing}")
        tap.done()
    # The first run under an allocator probes it (and says so on stderr) unless the user's
    # cache already holds its config; make sure of that here, so that the runs compared below
    # are the ordinary ones. (The cache is the ordinary one, so the probe is paid once.)
    deadline = time.monotonic() + WARMUP_BUDGET
    for a in allocs:
        if a == DIRECT:
            continue
        left = deadline - time.monotonic()
        if left < 1:
            tap.ok(False, f"{a}: first run (probe) exits 0",
                   f"not run: earlier first runs took the whole {WARMUP_BUDGET} s")
            HANGS[a] = MAX_HANGS
            continue
        try:
            p = subprocess.run([altest.cli(), "run", "-a", a, "--text", "off", "--", "true"],
                               env=clean_env(), capture_output=True, timeout=left)
            tap.ok(p.returncode == 0, f"{a}: first run (probe) exits 0",
                   f"exit status {p.returncode}\n{p.stderr.decode(errors='replace')}")
        except subprocess.TimeoutExpired:
            tap.ok(False, f"{a}: first run (probe) exits 0", f"hung for {left:.0f} s")
            HANGS[a] = MAX_HANGS
    for a in [a for a in allocs if a != DIRECT]:
        allocs[f"{a} --mode sample"] = allocs[a]
    if "glibc" in allocs:
        allocs["glibc --mode time"] = allocs["glibc"]
    jobs = [(a, p, c) for a, p in allocs.items() for c in CASES
            if not c["only"] or split_mode(a)[0] in c["only"]]
    workers = max(2, min(8, os.cpu_count() or 2))
    with concurrent.futures.ThreadPoolExecutor(max_workers=workers) as pool:
        futures = [pool.submit(one, a, p, c, progs, plugin) for a, p, c in jobs]
        for (a, p, c), f in zip(jobs, futures):
            plain, prof, ptmp, tmp = f.result()
            failed_before = tap.failed
            check(tap, a, c, plain, prof, ptmp, tmp)
            if tmp is None:
                continue
            shutil.rmtree(ptmp, ignore_errors=True)
            if tap.failed == failed_before:
                shutil.rmtree(tmp, ignore_errors=True)
            else:
                tap.diag(f"reports kept in {tmp}")
    check_signal_in_allocator(tap, shim, progs["host_leaf"])
    check_exit_in_handler(tap, shim, progs["host_signals"])
    slow = sorted(((t[1], t[0], a, c["label"]) for c in CASES
                   for a, t in c.get("times", {}).items()),
                  reverse=True)[:5]
    tap.diag("slowest runs (alloclens s / plain s):\n" + "\n".join(
        f"  {p:6.2f} / {q:6.2f}  {a}: {l}" for p, q, a, l in slow))
    tap.done()


if __name__ == "__main__":
    main()
