#!/usr/bin/env python3
"""Allocator system calls, lock contention and per-op event counters, against programs that
print their own truth; and a program's own SIGSYS / seccomp use unchanged by syscall user dispatch.

argv: sys_big sys_contend sys_faults sys_sigsys
"""
import json
import os
import re
import shutil
import signal
import subprocess
import sys

from altest import Tap, allocators, run, tmpdir

BIG, CONTEND, FAULTS, SIGSYS = sys.argv[1:5]
K = 20
BIG_SIZE = 33 << 20

tap = Tap()
allocs = allocators()
wd = tmpdir()


def syscalls(report):
    return {s["name"]: s for s in (report or {}).get("syscalls", [])}


def in_op(sc, name, key, field="by_op"):
    return sc.get(name, {}).get(field, {}).get(key, 0)


def profile(sc):
    return ", ".join(f"{n}={s['count']} {s.get('by_op_size_class', {})}"
                     for n, s in sc.items() if s.get("count"))


def strace_big_unmaps(lib):
    """munmap calls of at least 33 MiB the plain run (allocator preloaded) makes, by strace;
    None when strace cannot run here."""
    if not shutil.which("strace"):
        return None
    env = dict(os.environ)
    env.pop("LD_PRELOAD", None)
    if lib:
        env["LD_PRELOAD"] = lib
    p = subprocess.run(["strace", "-f", "-e", "trace=munmap", BIG], env=env,
                       capture_output=True, text=True)
    if p.returncode != 0:
        return None
    return sum(1 for m in re.finditer(r"munmap\(0x[0-9a-f]+, (\d+)\)", p.stderr)
               if int(m.group(1)) >= BIG_SIZE)


# 1. sys_big: K allocations of 33 MiB, one at a time.
glibc_prof = None
for name in allocs:
    proc, rep = run(name, [BIG], wd, name=f"big-{name}")
    if not tap.ok(proc.returncode == 0 and proc.stdout.decode().split() == [str(K)] and rep,
                  f"sys_big under {name}: ran, printed {K}, wrote a report",
                  proc.stderr.decode()[-2000:]):
        continue
    sc = syscalls(rep)
    info = rep.get("syscalls_info", {})
    tap.diag(f"{name} (large threshold {rep.get('allocator', {}).get('large_threshold')}): "
             f"{profile(sc) or 'no allocator syscalls'}")
    tap.ok(info.get("available") is True and info.get("source") == "syscall user dispatch",
           f"sys_big under {name}: syscalls_info available, source syscall user dispatch", info)
    if name == "glibc":
        glibc_prof = sc
        mm = in_op(sc, "mmap", "malloc/large", "by_op_size_class")
        mu = in_op(sc, "munmap", "free/large", "by_op_size_class")
        tap.ok(mm >= K, f"sys_big under glibc: mmap in malloc/large >= {K} (got {mm})", sc.get("mmap"))
        tap.ok(mu >= K, f"sys_big under glibc: munmap in free/large >= {K} (got {mu})", sc.get("munmap"))
        continue
    munmap_free = in_op(sc, "munmap", "free")
    madv = sc.get("madvise", {}).get("count", 0)
    differs = munmap_free != K or madv > 0
    if differs:
        tap.ok(True, f"sys_big under {name}: syscall profile differs from glibc's "
                     f"(munmap in free {munmap_free}, madvise {madv})")
    else:
        # Same shape as glibc (mimalloc 2.x maps and unmaps each huge segment itself): then the
        # count must be the truth, which strace of the plain run gives.
        truth = strace_big_unmaps(allocs[name])
        if truth is None:
            tap.skip(f"sys_big under {name}: munmap in free matches the plain run's strace",
                     "strace unusable here")
        else:
            tap.ok(munmap_free == truth,
                   f"sys_big under {name}: same profile as glibc; munmap in free {munmap_free} "
                   f"== {truth} unmaps of >= 33 MiB that strace sees in the plain run")

# 1b. sys_big started with SIGSYS blocked, as a program exec'd by a thread that blocked every
# signal is: a dispatched system call would end it, so the library unblocks SIGSYS; the
# program runs as plain and its allocator's system calls are counted.
def block_sigsys():
    signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGSYS])


for name in allocs:
    proc, rep = run(name, [BIG], wd, name=f"big-masked-{name}", preexec_fn=block_sigsys)
    info = (rep or {}).get("syscalls_info", {})
    tap.ok(proc.returncode == 0 and proc.stdout.decode().split() == [str(K)]
           and info.get("available") is True and sum(s["count"] for s in syscalls(rep).values()) > 0,
           f"sys_big started with SIGSYS blocked, under {name}: ran, printed {K}, its allocator's "
           "system calls counted", f"rc {proc.returncode}; {info}\n{proc.stderr.decode()[-2000:]}")

# 2. sys_contend under jemalloc, every malloc/free through one arena's bin lock.
if "jemalloc" in allocs:
    env = dict(os.environ, MALLOC_CONF="narenas:1,tcache:false")
    sums = {}
    for t in (1, 4):
        proc, rep = run("jemalloc", [CONTEND, str(t)], wd, name=f"contend-{t}", env=env)
        locks = (rep or {}).get("locks", {})
        ls = locks.get("locks", [])
        acq = sum(l.get("acquisitions", 0) for l in ls)
        cont = sum(l.get("contended", 0) for l in ls)
        sums[t] = (acq, cont)
        tap.ok(proc.returncode == 0 and proc.stdout.decode().split() == [str(t), str(t * 200000)]
               and locks.get("available") is True,
               f"sys_contend {t} under jemalloc: ran, locks section available",
               proc.stderr.decode()[-2000:])
        tap.diag(f"T={t}: {len(ls)} locks, acquisitions {acq}, contended {cont}, "
                 f"wait_cycles {sum(l.get('wait_cycles', 0) for l in ls)}, "
                 f"futex_waits {locks.get('futex_waits')}")
        tap.ok(acq > 0, f"sys_contend {t} under jemalloc: acquisitions > 0 (got {acq})")
    tap.ok(sums[4][1] > 0, f"sys_contend 4 under jemalloc: contended > 0 (got {sums[4][1]})")
    tap.ok(sums[1][1] == 0, f"sys_contend 1 under jemalloc: contended == 0 (got {sums[1][1]})")
else:
    tap.skip("sys_contend under jemalloc", "jemalloc not found")

# 3. sys_faults under glibc: one fresh page touched inside every malloc, every op sampled.
# task-clock, the call's cycles less its time switched out, is at most the call's wall time
# (a read(2) on each side of the call would add its own kernel time: many times a malloc's).
# Calls are preempted (by other threads, or by whatever else the machine runs), inside the
# timed call and just outside it: their wall time includes their share of the preemptions,
# their task-clock does not, so its floor is the typical call's time (the busiest row's
# median, which preemptions do not move), not the mean. A preemption just outside the call
# taken off it would drive task-clock to 0.
def check_task_clock(label, rep, tc, op, slack):
    rows = [r for r in rep.get("ops", []) if r["op"] == op]
    timed = sum(r["timed"] for r in rows)
    wall = sum(r["cycles_total"] for r in rows) / rep["timing"]["cycles_per_ns"] / max(timed, 1)
    p50 = max(rows, key=lambda r: r["timed"])["ns_p50"] if rows else float("nan")
    tap.ok(tc is not None and 0.3 * p50 <= tc <= 1.1 * wall + slack,
           f"{label}: task-clock per {op} {tc} ns, between 0.3 x the median call "
           f"({p50:.1f} ns) and the mean wall time ({wall:.1f} ns)", rep.get("counters"))

# MALLOC_PERTURB_ (meson sets a random one) makes glibc fill every block inside malloc: then
# each 1 MiB block (at offset 16 of its mapping) spans 257 pages, all touched in malloc.
for perturb in (None, "165"):
    env = dict(os.environ)
    env.pop("MALLOC_PERTURB_", None)
    if perturb:
        env["MALLOC_PERTURB_"] = perturb
    label = f"sys_faults under glibc (MALLOC_PERTURB_={perturb or 'unset'})"
    proc, rep = run("glibc", [FAULTS], wd, name=f"faults-{perturb}", env=env,
                    extra=["--events", "page-faults,task-clock", "--sample-every", "1"])
    out = proc.stdout.decode().split()
    ctr = (rep or {}).get("counters", {})
    tap.diag(f"{label}: counters {ctr}")
    # 257 faults in a call fit the ring (1024 records): no call is left out
    if not tap.ok(proc.returncode == 0 and len(out) == 2 and ctr.get("available") is True
                  and ctr.get("sample_every") == 1 and ctr.get("dropped_calls") == 0,
                  f"{label}: ran, counters available, sample_every 1, no call dropped",
                  proc.stderr.decode()[-2000:]):
        continue
    n = int(out[0])
    per_block = 257.0 if perturb else float(out[1])
    ops = ctr.get("counted_ops", {}).get("malloc", 0)
    # the program's other mallocs (stdio's buffer) touch no more than a few pages in all
    expect = n * per_block / ops if ops else float("nan")
    ev = {e["name"]: e for e in ctr.get("events", [])}
    per = ev.get("page-faults", {}).get("per_op", {})
    got = per.get("malloc")
    tap.ok(ops >= n and got is not None and abs(got - expect) <= 0.1 * expect,
           f"{label}: page-faults per malloc {got} within 10% of the truth "
           f"{n}*{per_block}/{ops} = {expect:.3f}", per)
    tap.ok(per.get("free", 1) <= 0.1, f"{label}: page-faults per free {per.get('free')} ~ 0 (munmap)")
    check_task_clock(label, rep, ev.get("task-clock", {}).get("per_op", {}).get("malloc"),
                     "malloc", 1000)

# 3b. The same bounds on a call far shorter than a system call: 200000 malloc(48)/free pairs,
# with 1 and with 4 threads.
for threads in (1, 4):
    proc, rep = run("glibc", [CONTEND, str(threads)], wd, name=f"contend-clock-{threads}",
                    env=dict(os.environ), extra=["--events", "task-clock", "--sample-every", "1"])
    ctr = (rep or {}).get("counters", {})
    label = f"sys_contend {threads} under glibc, task-clock on every call"
    if not tap.ok(proc.returncode == 0 and ctr.get("available") is True,
                  f"{label}: ran, counters available", proc.stderr.decode()[-2000:]):
        continue
    for op in ("malloc", "free"):
        check_task_clock(label, rep, ctr["events"][0]["per_op"].get(op), op, 20)

# 4. sys_sigsys: own SIGSYS handler and a seccomp filter, output and status as the plain run.
def plain(cmd, lib):
    env = dict(os.environ)
    env.pop("LD_PRELOAD", None)
    if lib:
        env["LD_PRELOAD"] = lib
    return subprocess.run(cmd, env=env, capture_output=True)


def both(name, path, cmd, tag, extra=()):
    """CMD plain (the allocator preloaded, unless glibc), then under alloclens -a NAME (EXTRA
    options): the plain run, the profiled run and its report."""
    return (plain(cmd, None if name == "glibc" else path), *run(name, cmd, wd, name=tag, extra=extra))


def side_reports(tag):
    """The reports of the processes a run tagged TAG started, beside its own TAG.json."""
    return [f for f in os.listdir(wd) if f.startswith(f"{tag}.") and f.endswith(".json")
            and f != f"{tag}.json"]


for name, path in allocs.items():
    a, b, _ = both(name, path, [SIGSYS], f"sigsys-{name}")
    if name == "glibc":
        tap.ok(a.returncode == 0 and b"seen=2" in a.stdout and b"errno=EPERM" in a.stdout
               and b"trapped=1" in a.stdout, "sys_sigsys plain run: 2 raised, EPERM, 1 trap",
               a.stdout.decode() + a.stderr.decode())
    tap.ok(a.returncode == b.returncode and a.stdout == b.stdout,
           f"sys_sigsys under {name}: stdout and exit status identical to the plain run",
           f"plain rc {a.returncode}:\n{a.stdout.decode()}\nalloclens rc {b.returncode}:\n"
           f"{b.stdout.decode()}\n{b.stderr.decode()[-2000:]}")

# 4b. sys_sigsys trapalloc: the program's seccomp filter traps munmap and madvise, which the
# allocator makes inside its calls, and its handler answers them: as plain, in the modes that
# dispatch system calls (our handler makes the call, and the program's SIGSYS comes inside it).
for name, path in allocs.items():
    for mode in ("full", "time"):
        a, b, _ = both(name, path, [SIGSYS, "trapalloc"], f"trapalloc-{name}-{mode}", extra=("--mode", mode))
        tap.ok(a.returncode == b.returncode == 0 and a.stdout == b.stdout and b"trapalloc: done" in a.stdout,
               f"sys_sigsys trapalloc under {name}, --mode {mode}: stdout and exit status as plain",
               f"plain rc {a.returncode}:\n{a.stdout.decode()}\nalloclens rc {b.returncode}:\n"
               f"{b.stdout.decode()}\n{b.stderr.decode()[-2000:]}")

# 4c. sys_sigsys strict: 1000 mallocs, then seccomp's strict mode (read, write and exit only,
# rdtsc off), then 5000 more. As plain in every mode; the report is the state as the thread
# entered strict mode (its 1000, not the 5000 after), and one line says so.
for name, path in allocs.items():
    for mode in ("full", "time", "sample"):
        for how in ("prctl", "syscall"):
            a, b, rep = both(name, path, [SIGSYS, "strict", how], f"strict-{name}-{mode}-{how}",
                             extra=("--mode", mode))
            desc = f"sys_sigsys strict ({how}) under {name}, --mode {mode}"
            tap.ok(a.returncode == b.returncode == 0 and a.stdout == b.stdout and b"5000" in a.stdout,
                   f"{desc}: stdout and exit status as plain",
                   f"plain rc {a.returncode}:\n{a.stdout.decode()}\nalloclens rc {b.returncode}:\n"
                   f"{b.stdout.decode()}\n{b.stderr.decode()[-2000:]}")
            mallocs = sum(r.get("count", 0) for r in (rep or {}).get("ops", []) if r.get("op") == "malloc")
            said = [l for l in b.stderr.decode().splitlines() if "seccomp strict mode" in l]
            tap.ok(rep is not None and 1000 <= mallocs < 5000 and len(said) == 1,
                   f"{desc}: the report holds the 1000 mallocs before strict mode, not the 5000 after; "
                   "one line says why", f"mallocs {mallocs}; lines {said}")

# 5. sys_big traced by strace -f: no system call dispatched (a tracer stops at each SIGSYS),
# and the report says why the section is empty.
if shutil.which("strace"):
    trace = os.path.join(wd, "trace")
    proc, _ = run("glibc", ["strace", "-f", "-o", trace, BIG], wd, name="traced")
    side = side_reports("traced")
    big = None
    for f in side:
        with open(os.path.join(wd, f)) as fh:
            r = json.load(fh)
        if r["program"]["argv"] == [BIG]:
            big = r
    info = (big or {}).get("syscalls_info", {})
    tap.ok(proc.returncode == 0 and proc.stdout.decode().split() == [str(K)] and big is not None,
           "sys_big traced by strace -f: ran, printed its count, wrote its own report",
           f"side reports {side}\n{proc.stderr.decode()[-2000:]}")
    tap.ok(info.get("available") is False and "traced" in info.get("reason", ""),
           "sys_big traced: syscalls_info unavailable, because the process is traced", info)
    with open(trace) as fh:
        sigsys = [l for l in fh if "--- SIGSYS" in l]
    tap.ok(not sigsys, "sys_big traced: strace saw no SIGSYS", "".join(sigsys[:5]))
else:
    tap.skip("sys_big traced by strace -f", "strace not installed")

# 6. sys_big started under a seccomp filter that ends the process at perf_event_open (as a
# systemd service's SystemCallFilter does): the program runs as plain; the report says why
# events and system calls were not measured. `sys_sigsys exec` installs the filter.
for name, path in allocs.items():
    a, b, rep = both(name, path, [SIGSYS, "exec", BIG], f"seccomp-{name}")
    tap.ok(a.returncode == b.returncode == 0 and a.stdout == b.stdout,
           f"sys_big under a seccomp filter, {name}: exit status and stdout as plain",
           f"plain rc {a.returncode}, alloclens rc {b.returncode}\n{b.stderr.decode()[-2000:]}")
    ctr, info = (rep or {}).get("counters", {}), (rep or {}).get("syscalls_info", {})
    tap.ok(ctr.get("available") is False and "seccomp" in ctr.get("reason", "")
           and info.get("available") is False and "seccomp" in info.get("reason", ""),
           f"sys_big under a seccomp filter, {name}: counters and syscalls unavailable, saying why",
           f"counters: {ctr.get('reason')}; syscalls: {info}")

# 7. A seccomp filter the running program installs (prctl, or the seccomp system call as
# libseccomp makes it) that ends the process at perf_event_open and at the prctl starting
# syscall user dispatch: the threads and child started after it run as plain, the reports say
# what they leave out. With a second filter ending it at any open creating a file (nofiles), no
# report can be written: each process says so in one line instead of being killed; so with one
# ending it at mincore (nomincore), which also stops the heap's measurements while the program
# runs (mincore, /proc/self/statm, maps, pagemap), lest the threads' allocations end it. With one
# ending it at getrusage (norusage), --mode sample's sampler, which asks it for the peak RSS at
# sampled allocations (densely sampled here), no longer does (the peak becomes where its own
# estimate was highest); its stack walks go on. With one ending it at prlimit64 (noprlimit), the
# reports are written without the room for descriptors a report raises the limit for.
NOTE = "threads started after the program installed a seccomp filter are not measured"
for name, path in allocs.items():
    for how in ("prctl", "syscall", "nofiles", "nomincore", "norusage", "noprlimit"):
        if how in ("nofiles", "nomincore", "norusage", "noprlimit") and name != "glibc":
            continue
        label = f"sys_sigsys later {how} under {name}"
        tag = f"later-{how}-{name}"
        extra = ("--mode", "sample", "--sample-rate", "4096") if how == "norusage" else ()
        a, b, rep = both(name, path, [SIGSYS, "later", how], tag, extra)
        tap.ok(a.returncode == b.returncode == 0 and a.stdout == b.stdout
               and b"child status 7" in a.stdout,
               f"{label}: exit status and stdout as plain", f"plain rc {a.returncode}, "
               f"alloclens rc {b.returncode}\n{b.stdout.decode()}\n{b.stderr.decode()[-2000:]}")
        side = side_reports(tag)
        lines = [l for l in b.stderr.decode().splitlines() if "no report" in l]
        if how in ("nofiles", "nomincore"):
            call = "openat" if how == "nofiles" else "mincore"
            tap.ok(rep is None and not side and len(lines) == 2 and all(
                l.endswith(f"no report: the program's seccomp filter refuses {call}, which writing "
                           "it takes") for l in lines),
                   f"{label}: no report, one line each for the process and its child saying why",
                   f"report {rep is not None}, side {side}\n{b.stderr.decode()[-2000:]}")
            continue
        if how == "norusage":
            sites = (rep or {}).get("sites", {})
            rows = sites.get("top_by_allocated") or []
            tap.ok(rep is not None and len(side) == 1 and not lines and sites.get("available")
                   and rows and all(r.get("stack") for r in rows),
                   f"{label}: reports for the process and its child, with sampled sites, every one "
                   "with its stack (the threads after the filter walk theirs)",
                   f"side {side}, sites {str(sites)[:500]}\n{b.stderr.decode()[-2000:]}")
            continue
        ctr, info = (rep or {}).get("counters", {}), (rep or {}).get("syscalls_info", {})
        tap.ok(rep is not None and len(side) == 1 and not lines
               and (rep or {}).get("threads", {}).get("total") == 5
               and all(sec.get("available") is False or sec.get("note") == NOTE for sec in (ctr, info)),
               f"{label}: reports for the process and its child; counters and syscalls say "
               "what they leave out", f"side {side}, threads {(rep or {}).get('threads')}, "
               f"counters note {ctr.get('note')}, syscalls {info}\n{b.stderr.decode()[-2000:]}")

tap.done()
