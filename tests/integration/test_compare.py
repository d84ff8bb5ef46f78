#!/usr/bin/env python3
"""alloclens compare: the same workload under several allocators, a table of medians.

usage: test_compare.py EXACT_COUNTS

EXACT_COUNTS (tests/integration/progs/exact_counts.c) makes the same calls on every run under a
given allocator, so the comparison's call count for each allocator must equal, exactly, the
total of the ops table of a plain `alloclens run` of the same command, in every run; each
median must be the median of that allocator's runs; the table and the "switching from" lines
must show every allocator. Also: CMD's stdin is /dev/null (a command reading it ends), a run
that writes no report is named on stderr and gives exit status 1, a command that cannot run
stops it at once with the status a shell gives (126, 127), and bad arguments get one
line on stderr and exit status 2 before anything runs (an allocator named twice, an empty name in -a's
list too); two libraries of one file name are labelled by their paths, and a label's version
is the allocator's own or none; SIGINT or SIGTERM stops it cleanly
(no run after, the temporary directory removed, ended by the signal). `alloclens demo` prints a report per
allocator found and the same table. `alloclens allocators` gives each allocator but glibc the
version of the Debian package that installed it, as dpkg-query tells it.
"""
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time

import altest

RUNS = 2


def listed_versions():
    """{name: version} as `alloclens allocators` lists them."""
    out = subprocess.run([altest.cli(), "allocators"], check=True, capture_output=True,
                         text=True, timeout=60).stdout
    return {f[0]: f[2] for f in (l.split("\t") for l in out.splitlines()) if len(f) == 3}


def package_version(path):
    """The version of the package dpkg says installed PATH (under its /usr-merged names too),
    or None."""
    real = os.path.realpath(path)
    for p in dict.fromkeys((path, real, "/usr" + path, real.removeprefix("/usr"))):
        s = subprocess.run(["dpkg-query", "-S", p], capture_output=True, text=True, timeout=60)
        owners = [l for l in s.stdout.splitlines() if not l.startswith("diversion ")]
        if s.returncode == 0 and owners:
            pkg = owners[0].split(": ")[0].split(", ")[0]
            v = subprocess.run(["dpkg-query", "-W", "-f", "${Version}", pkg],
                               capture_output=True, text=True, timeout=60)
            return v.stdout if v.returncode == 0 else None
    return None


def compare(args, tmp, timeout=300):
    return subprocess.run([altest.cli(), "compare", *args], capture_output=True, text=True,
                          cwd=tmp, timeout=timeout)


def total_calls(report):
    return sum(int(r["count"]) for r in report["ops"])


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    prog = sys.argv[1]
    tap = altest.Tap()
    found = altest.allocators()
    every = [a for a in ("glibc", "jemalloc", "tcmalloc", "mimalloc") if a in found]
    names = every[:3]
    tap.ok(names, "alloclens allocators finds allocators", "none found")
    listed = listed_versions()
    for a in (a for a in every if a != "glibc"):
        want = package_version(found[a]) if shutil.which("dpkg-query") else None
        if want is None:
            tap.skip(f"{a}: alloclens allocators gives its package's version",
                     f"no dpkg, or dpkg does not know {found[a]}")
            continue
        tap.ok(listed.get(a) == want, f"{a}: alloclens allocators gives its package's version "
               f"({want})", f"listed {listed.get(a)!r}")
    tmp = altest.tmpdir()
    for a in names:
        altest.prime(a)
    cmd = [prog, "--scale", "1", "--threads", "2"]
    out = os.path.join(tmp, "cmp.json")
    p = compare(["-a", ",".join(names), "-n", str(RUNS), "-o", out, "--", *cmd], tmp)
    tap.ok(p.returncode == 0, "compare exits 0 when every run wrote its report",
           f"status {p.returncode}\nstderr:\n{p.stderr[-2000:]}")
    try:
        with open(out) as f:
            cmp = json.load(f)
    except (OSError, ValueError) as e:
        tap.ok(False, "the comparison JSON is written and parses", str(e))
        tap.done()
    tap.ok(cmp.get("command") == cmd and cmp.get("runs") == RUNS and cmp.get("baseline") == names[0],
           "the comparison JSON names the command, the runs and the baseline",
           json.dumps({k: cmp.get(k) for k in ("command", "runs", "baseline")}))
    got = [a["name"] for a in cmp.get("allocators", [])]
    tap.ok(got == names, "one entry per allocator asked for, in order", f"{got} vs {names}")

    for a in cmp.get("allocators", []):
        name = a["name"]
        runs = a.get("each_run", [])
        tap.ok(a.get("runs_with_report") == RUNS and len(runs) == RUNS,
               f"{name}: every run's figures are there", f"{a.get('runs_with_report')} runs")
        proc, report = altest.run(name, cmd, tmp, name=f"direct-{name}")
        if not tap.ok(report is not None, f"{name}: a direct run writes its report",
                      proc.stderr.decode(errors="replace")[-1000:]):
            continue
        version = report.get("allocator", {}).get("version")
        tap.ok(version and a.get("version") == version and f"{name} {version}" in p.stdout,
               f"{name}: named with the version the allocator gives its report ({version}), "
               "in the JSON and the table", f"compare says {a.get('version')}")
        want = total_calls(report)
        calls = [r["calls"] for r in runs]
        tap.ok(all(c == want for c in calls),
               f"{name}: calls in every run equal the ops total of a direct run, exactly",
               f"compare {calls}, direct run {want}")
        for key in ("calls", "allocator_time_ns", "ns_per_alloc_call", "peak_heap_bytes"):
            vals = [r[key] for r in runs if r.get(key) is not None]
            med = a["median"].get(key)
            tap.ok(vals and med is not None and abs(med - statistics.median(vals)) <= 1e-6 * max(1, abs(med)),
                   f"{name}: median {key} is the median of its runs", f"{med} vs {vals}")
        tap.ok(a["median"].get("allocator_time_ns", 0) > 0 and a["median"].get("peak_heap_bytes", 0) > 0,
               f"{name}: time in the allocator and the heap at peak measured (full mode)",
               json.dumps(a["median"]))

    lines = p.stdout.splitlines()
    header = next((l for l in lines if names[0] in l and (len(names) < 2 or names[1] in l)), None)
    tap.ok(header is not None and any(l.startswith("calls") for l in lines)
           and any(l.startswith("heap at peak") for l in lines),
           "the table has a column per allocator and a row per figure", p.stdout[-2000:])
    if len(names) > 1:
        switch = [l for l in lines if l.startswith("  to ")]
        tap.ok(len(switch) == len(names) - 1 and p.stdout.count(f"switching from {names[0]}") == 1,
               "a 'switching from' line for each other allocator", p.stdout[-1500:])

    # --mode sample times no call: time in the allocator is n/a, in the table, the switching
    # lines and the JSON (null), never 0 or nan; so are the system calls it does not count.
    sample_out = os.path.join(tmp, "sample.json")
    p = compare(["-a", ",".join(names[:2]), "-n", "1", "--mode", "sample", "-o", sample_out, "--", *cmd], tmp)
    lines = p.stdout.splitlines()
    row = {l[:24].strip(): l[24:].split() for l in lines if l[:24].strip()}
    timed = ("time in the allocator", "/ run time (all thr.)", "per allocating call", "per free/delete",
             "allocator syscalls")
    switch = [l for l in lines if l.startswith("  to ")]
    tap.ok(p.returncode == 0 and all(set(row.get(k, ["?"])) == {"n/a"} for k in timed)
           and "nan" not in p.stdout.lower() and all("time in the allocator n/a" in l for l in switch),
           "compare --mode sample: time in the allocator and the system calls n/a, no nan",
           f"status {p.returncode}\n{p.stdout[-2000:]}\n{p.stderr[-500:]}")
    try:
        with open(sample_out) as f:
            sample = json.load(f)
    except (OSError, ValueError) as e:
        sample = {"error": str(e)}
    meds = [a.get("median", {}) for a in sample.get("allocators", [])]
    tap.ok(meds and all(m.get("calls", 0) > 0 and m.get("allocator_time_ns", 0) is None
                        and m.get("ns_per_alloc_call", 0) is None for m in meds),
           "compare --mode sample -o: calls counted, time in the allocator null", json.dumps(sample)[:1500])

    # CMD's stdin is /dev/null: a command that reads its input to the end finishes.
    p = compare(["-a", names[0], "-n", "1", "--", sys.executable, "-c",
                 "import sys; sys.stdin.read(); print('read-to-end')"], tmp, timeout=60)
    tap.ok(p.returncode == 0 and "read-to-end" in p.stdout, "CMD's stdin is /dev/null",
           f"status {p.returncode}\n{p.stdout[-500:]}\n{p.stderr[-500:]}")

    # A run that writes no report (killed) is left out, named on stderr, and the status says so.
    p = compare(["-a", names[0], "-n", "1", "--", "sh", "-c", "kill -9 $$"], tmp, timeout=60)
    tap.ok(p.returncode == 1 and "left out" in p.stderr and names[0] in p.stderr,
           "a run without a report: exit status 1, named on stderr",
           f"status {p.returncode}\nstderr:\n{p.stderr[-800:]}")

    # A command that cannot run: compare stops at the first run, with the line that run gave and
    # the status a shell gives (127 not found, 126 not executable), no table; its temporary
    # directory is removed. A command that exits 127 itself is run and measured.
    notexec = os.path.join(tmp, "not-executable")
    with open(notexec, "w") as f:
        f.write("#!/bin/sh\n")
    for command, status, why in (("/nonexistent/cmd", 127, os.strerror(2)), (notexec, 126, os.strerror(13))):
        tmpdir = os.path.join(tmp, f"tmpdir-{status}")
        os.mkdir(tmpdir)
        p = subprocess.run([altest.cli(), "compare", "-a", ",".join(names), "-n", "3", "--", command],
                           capture_output=True, text=True, cwd=tmp, timeout=60, env=dict(os.environ, TMPDIR=tmpdir))
        want = f"alloclens: cannot run {command}: {why}\n"
        tap.ok(p.returncode == status and p.stderr == want and not p.stdout and not os.listdir(tmpdir),
               f"compare -- a command that cannot run ({status}): stops at once, one line, status {status}",
               f"status {p.returncode}, want stderr {want!r}\nstderr:\n{p.stderr[-800:]}\nstdout:\n{p.stdout[-300:]}")
    p = compare(["-a", names[0], "-n", "1", "--", "sh", "-c", "exit 127"], tmp, timeout=60)
    tap.ok(p.returncode == 0 and "the command ended with exit status 127" in p.stderr and "calls" in p.stdout,
           "compare -- a command exiting 127 itself: measured, its status named",
           f"status {p.returncode}\nstderr:\n{p.stderr[-800:]}")

    # Stopped by a signal: SIGTERM to compare alone is passed on to the run in progress,
    # SIGINT to the whole group (as a terminal's Ctrl-C) reaches it anyway; either way no
    # further run starts, compare ends by that signal, and its temporary directory is gone.
    sleeper = [sys.executable, "-c", "import time; print('started', flush=True); time.sleep(60)"]
    for sig, group in ((signal.SIGTERM, False), (signal.SIGINT, True)):
        tmpdir = os.path.join(tmp, f"tmpdir-{sig.name}")
        os.mkdir(tmpdir)
        proc = subprocess.Popen([altest.cli(), "compare", "-a", names[0], "-n", "3", "--", *sleeper],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=tmp,
                                env=dict(os.environ, TMPDIR=tmpdir), start_new_session=True)
        started = proc.stdout.readline() == b"started\n"
        made = os.listdir(tmpdir)
        t0 = time.monotonic()
        if group:
            os.killpg(proc.pid, sig)
        else:
            proc.send_signal(sig)
        try:
            out, err = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate()
        took = time.monotonic() - t0
        tap.ok(started and len(made) == 1 and proc.returncode == -sig and took < 20
               and out.count(b"started") == 0 and not os.listdir(tmpdir),
               f"compare stopped by {sig.name}{' to its group' if group else ''}: the run in "
               "progress ends, no other starts, the temporary directory in $TMPDIR is removed, "
               "compare ends by the signal",
               f"first run started: {started}; made {made}; status {proc.returncode} after "
               f"{took:.1f} s; left {os.listdir(tmpdir)}\nstdout {out[-300:]!r}\nstderr {err[-500:]!r}")

    # Bad arguments: one line on stderr, status 2, nothing run.
    marker = os.path.join(tmp, "ran")
    touch = ["--", "sh", "-c", f"touch {marker}"]
    for args, what in ((["-a", "nosuch"], "nosuch"), (["-n", "0"], "-n"), (["-n", "x"], "-n"),
                       (["--mode", "fast"], "fast"), (["-o", "/nonexistent/dir/c.json"], "/nonexistent"),
                       (["--bogus", "1"], "--bogus")):
        p = compare([*args, *touch], tmp, timeout=60)
        err = p.stderr.strip().splitlines()
        tap.ok(p.returncode == 2 and len(err) == 1 and what in err[0] and not os.path.exists(marker),
               f"compare {' '.join(args)}: one line naming '{what}', status 2, nothing run",
               f"status {p.returncode}\nstderr:\n{p.stderr}")
    # An allocator named twice (by name or by path), or an empty name in the list: one line, 2.
    libc = os.path.realpath(found["glibc"])
    for lst, line in (("glibc,glibc", f"-a names the allocator {libc} twice ('glibc' and 'glibc')"),
                      (f"glibc,{found['glibc']}", f"-a names the allocator {libc} twice ('glibc' and '{found['glibc']}')"),
                      ("glibc,,glibc", "-a 'glibc,,glibc' has an empty name in it (names are separated by one comma)"),
                      ("glibc,", "-a 'glibc,' has an empty name in it (names are separated by one comma)"),
                      ("", "-a names no allocator")):
        p = compare(["-a", lst, *touch], tmp, timeout=60)
        tap.ok(p.returncode == 2 and p.stderr == f"alloclens: {line}\n" and not os.path.exists(marker),
               f"compare -a '{lst}': one line, status 2, nothing run", f"status {p.returncode}\nstderr:\n{p.stderr}")

    # Labels: two libraries of one file name are told apart by their paths; a label carries the
    # version the allocator gives, never the file name's suffix (libjemalloc.so.2's "2"), also
    # for an allocator none of whose runs left a report.
    other = next((a for a in every if a != "glibc"), None)
    if other is None:
        tap.skip("compare: labels of two libraries of one name", "only glibc here")
    else:
        lib = os.path.basename(found[other])
        copies = [os.path.join(tmp, d, lib) for d in ("one", "two")]
        for c in copies:
            os.makedirs(os.path.dirname(c))
            shutil.copy2(found[other], c)
        p = compare(["-a", ",".join(copies), "-n", "1", "--", *cmd], tmp)
        lines = p.stdout.splitlines()
        header = next((l for l in lines if copies[0] in l), "")
        tap.ok(p.returncode == 0 and all(header.count(f"{c} ") == 1 for c in copies)
               and f"switching from {copies[0]} " in p.stdout and f"  to {copies[1]} " in p.stdout,
               "compare of two libraries of one file name: each labelled by its path",
               f"status {p.returncode}\n{p.stdout[-1500:]}\n{p.stderr[-800:]}")
        out = os.path.join(tmp, "failed.json")
        p = compare(["-a", other, "-n", "1", "-o", out, "--", "sh", "-c", "kill -9 $$"], tmp, timeout=60)
        header = next((l for l in p.stdout.splitlines() if other in l and "compare" not in l), "")
        with open(out) as f:
            version = json.load(f)["allocators"][0]["version"]
        tap.ok(p.returncode == 1 and p.stderr == f"alloclens: run 1 under {other} (killed by signal 9) left out: "
               "no readable report (No such file or directory)\n" and header.split() == [other] and version is None,
               f"compare, no run of {other} with a report: labelled '{other}' (no version), on stderr, in the "
               "table and in the JSON", f"status {p.returncode}\nheader {header!r}; version {version!r}\n"
               f"stderr:\n{p.stderr[-800:]}")

    p = subprocess.run([altest.cli(), "compare", "-a", names[0], *touch], capture_output=True,
                       text=True, cwd=tmp, timeout=60, env=dict(os.environ, TMPDIR="/nonexistent"))
    err = p.stderr.strip().splitlines()
    tap.ok(p.returncode == 2 and len(err) == 1 and "/nonexistent" in err[0] and not os.path.exists(marker),
           "compare with TMPDIR a missing directory: one line naming it, status 2, nothing run",
           f"status {p.returncode}\nstderr:\n{p.stderr}")
    p = compare(["-a", names[0]], tmp, timeout=60)
    tap.ok(p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1,
           "compare with no command: one line, status 2", p.stderr)

    # alloclens demo: the bundled workload under every allocator found, each report on stderr,
    # then the table. Its calls are the workload's own (it prints them) plus the C library's.
    p = subprocess.run([altest.cli(), "demo"], capture_output=True, text=True, cwd=tmp, timeout=600)
    own = [int(l.split()[0].split("=")[1]) for l in p.stdout.splitlines() if l.startswith("calls=")]
    row = next((l.split()[1:] for l in p.stdout.splitlines() if l.startswith("calls ")), [])
    tap.ok(p.returncode == 0 and p.stderr.count("== alloclens report") == len(every)
           and all(f"######## {a}" in p.stderr for a in every),
           "demo: exit 0, a report for every allocator found", f"status {p.returncode}\n{p.stderr[-1500:]}")
    tap.ok(len(own) == len(every) == len(row)
           and all(int(c) >= o and int(c) - o < 1000 for c, o in zip(row, own)),
           "demo: the table counts the workload's own calls, plus the C library's few",
           f"workload says {own}; table row {row}\n{p.stdout[-1500:]}")
    tap.done()


if __name__ == "__main__":
    main()
