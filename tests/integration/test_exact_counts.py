#!/usr/bin/env python3
"""Exact counts: every count in the JSON `ops` table equals the truth a program of ours prints.

usage: test_exact_counts.py PROG_C PROG_CXX COUNT_SHIM.so TLS_CYCLES TLS_PLUGIN.so
                            SINGLE_THREADED_PROG...

PROG_C (malloc family) and PROG_CXX (operator new/delete) make exactly known numbers of calls
from a serial part and a parallel part (4 threads + main) and print their truth per
(op, size_class, reuse, phase). Every call of the process is counted, libc's own included, so
each program runs twice under every allocator `alloclens allocators` finds: with --scale 0
(the same threads, none of its own calls) and --scale 1. For every key the difference of the
two reports' counts must equal the truth (absent keys count 0), ops the program never calls
included. The same again with --mode time (exactly the same table), and with --mode sample,
where the truth is compared as that mode tells it (no reuse, a free's size class unknown).

The difference cannot see a call alloclens makes for itself at start-up or exit and counts as
the program's: that is checked in absolute terms under glibc against count_shim.so, preloaded
alone in the same program, which counts every call that reaches the malloc family's symbols.
The totals of allocation calls, reallocs and frees must be the same under every mode. The
threaded programs are held to their allocations and reallocs only: how many thread stacks
glibc's cache hands back, with a free of the old TLS vector for each, varies from run to run.
TLS_CYCLES loads and unloads TLS_PLUGIN.so, whose thread-local blocks the loader allocates and
frees with the program's malloc and free, with every allocation sampled: the sampler's stack
walk must not make those calls in its stead, uncounted.
"""
import subprocess
import json
import os
import sys

import altest

ALLOCATORS = ("glibc", "jemalloc", "tcmalloc", "mimalloc")
C_OPS = ("malloc", "calloc", "realloc", "free", "posix_memalign", "aligned_alloc",
         "memalign", "valloc", "pvalloc")
CXX_OPS = ("new", "delete")
ALL_OPS = C_OPS + CXX_OPS


def table(rows):
    """{(op, size_class, reuse, phase): count} from a list of ops/truth rows."""
    t = {}
    for r in rows:
        key = (r["op"], r["size_class"], r["reuse"], r["phase"])
        t[key] = t.get(key, 0) + int(r["count"])
    return t


def fmt_key(k):
    return "/".join(k)


def run_scale(tap, alloc, prog, scale, tmp, extra=(), prog_extra=()):
    """One run under alloclens; returns (ops table or None, truth table or None, why)."""
    out = os.path.join(tmp, "report.json")
    if os.path.exists(out):
        os.unlink(out)
    proc, report = altest.run(alloc, [prog, "--scale", str(scale), *prog_extra], tmp,
                              name="report", extra=extra, timeout=120)
    if proc.returncode != 0:
        return None, None, (f"exit status {proc.returncode}; stderr:\n"
                            + proc.stderr.decode(errors="replace")[-2000:])
    if report is None:
        return None, None, "no JSON report written"
    try:
        truth = table(json.loads(proc.stdout.decode())["truth"])
    except (ValueError, KeyError) as e:
        return None, None, f"program output is not its truth JSON ({e}): {proc.stdout[:500]!r}"
    if "ops" not in report:
        return None, None, "report has no 'ops'"
    return table(report["ops"]), truth, None


def sample_view(t):
    """A table as --mode sample can tell it: no reuse, and a free's size class unknown."""
    v = {}
    for (op, size_class, reuse, phase), n in t.items():
        key = (op, "unknown" if op in ("free", "delete") else size_class, "n/a", phase)
        v[key] = v.get(key, 0) + n
    return v


def check_timed(tap, label, path, sample):
    """Every call is timed but the process's first allocation (first_call), none in --mode
    sample: a row's timed count is its count, one less in one row of first_call's op and size
    class."""
    with open(path) as f:
        report = json.load(f)
    first = report.get("first_call")
    odd = []
    for r in report["ops"]:
        key = fmt_key(tuple(r[k] for k in ("op", "size_class", "reuse", "phase")))
        missing = int(r["count"]) - int(r["timed"])
        if sample and int(r["timed"]) != 0 or not sample and missing != 0:
            odd.append((r, f"{key}: count {r['count']}, timed {r['timed']}"))
    ok = not odd
    if not sample and first:
        ok = (len(odd) == 1 and int(odd[0][0]["count"]) - int(odd[0][0]["timed"]) == 1
              and odd[0][0]["op"] == first["op"] and odd[0][0]["size_class"] == first["size_class"])
    tap.ok(ok, f"{label}: no call timed" if sample else f"{label}: every call timed but the first",
           "\n".join(d for _, d in odd[:10]) + f"\nfirst_call {first}")


def check_program(tap, label, alloc, prog, own_ops, extra=(), prog_extra=()):
    tmp = altest.tmpdir()
    sample = "sample" in extra
    ops0, truth0, why0 = run_scale(tap, alloc, prog, 0, tmp, extra, prog_extra)
    if sample and why0 is None:
        ops0 = sample_view(ops0)
    # The program classes its own requests as small or large; it must use the threshold the
    # report uses (the allocator's probed one, unless the test sets it).
    if not prog_extra and why0 is None:
        with open(os.path.join(tmp, "report.json")) as f:
            threshold = json.load(f)["allocator"]["large_threshold"]
        prog_extra = ("--large-threshold", str(threshold))
    ops1, truth1, why1 = run_scale(tap, alloc, prog, 1, tmp, extra, prog_extra)
    if not tap.ok(why0 is None and why1 is None, f"{label}: both runs (scale 0, 1) complete",
                  why0 or why1):
        return
    check_timed(tap, label, os.path.join(tmp, "report.json"), sample)
    if sample:
        ops1, truth1 = sample_view(ops1), sample_view(truth1)
    tap.ok(not truth0, f"{label}: scale 0 makes no calls of its own", truth0)

    # The program's truth must itself cover what the issue asks for: every op of its family,
    # serial and parallel, several hundred times.
    thin = []
    for op in own_ops:
        for phase in ("serial", "parallel"):
            n = sum(c for k, c in truth1.items() if k[0] == op and k[3] == phase)
            if n < 100:
                thin.append(f"{op}/{phase}: {n}")
    tap.ok(not thin, f"{label}: program exercises every op in both phases", "\n".join(thin))

    keys = set(ops0) | set(ops1) | set(truth1)
    bad = {}
    for k in sorted(keys):
        want = truth1.get(k, 0)
        got = ops1.get(k, 0) - ops0.get(k, 0)
        if got != want:
            bad.setdefault(k[0], []).append(
                f"{fmt_key(k)}: truth {want}, report diff {got} "
                f"(scale1 {ops1.get(k, 0)} - scale0 {ops0.get(k, 0)})")
    for op in ALL_OPS:
        if op in own_ops:
            desc = f"{label}: {op} counts equal the truth (size class, reuse, phase)"
        else:
            desc = f"{label}: {op} counts unchanged by the program (it makes none)"
        tap.ok(op not in bad, desc, "\n".join(bad.get(op, [])))
    unknown = sorted({k[0] for k in keys} - set(ALL_OPS))
    tap.ok(not unknown, f"{label}: no unknown op names", ", ".join(unknown))

    # Totals per phase, a coarser view that tells a phase mix-up from a reuse mix-up.
    if bad:
        for phase in ("serial", "parallel"):
            want = sum(c for k, c in truth1.items() if k[3] == phase)
            got = (sum(c for k, c in ops1.items() if k[3] == phase)
                   - sum(c for k, c in ops0.items() if k[3] == phase))
            tap.diag(f"{label}: all ops, {phase}: truth {want}, report diff {got}")
        # Is libc's own part stable? A second scale-0 run should give the same table.
        again, _, why = run_scale(tap, alloc, prog, 0, tmp, extra, prog_extra)
        if again is not None:
            again = sample_view(again) if sample else again
            drift = [f"{fmt_key(k)}: {ops0.get(k, 0)} then {again.get(k, 0)}"
                     for k in sorted(set(ops0) | set(again)) if ops0.get(k, 0) != again.get(k, 0)]
            tap.diag(f"{label}: second scale-0 run " + ("differs from the first:\n" + "\n".join(drift)
                                                        if drift else "is identical to the first"))


def shim_totals(shim, cmd, tmp):
    """(allocs, reallocs, frees) as count_shim.so counts them in CMD run without alloclens."""
    out = os.path.join(tmp, "shim.txt")
    env = altest.plain_env(LD_PRELOAD=shim, COUNT_SHIM_OUT=out)
    subprocess.run(cmd, env=env, capture_output=True, timeout=120, check=True)
    with open(out) as f:
        kv = dict(x.split("=") for x in f.read().split())
    return int(kv["allocs"]), int(kv["reallocs"]), int(kv["frees"])


def report_totals(report):
    ops = table(report["ops"])
    total = lambda names: sum(n for k, n in ops.items() if k[0] in names)
    allocs = total({"malloc", "calloc", "posix_memalign", "aligned_alloc", "memalign", "valloc",
                    "pvalloc", "new"})
    return allocs, total({"realloc"}), total({"free", "delete"})


def check_absolute(tap, shim, cmd, label, frees, extra=()):
    """Under glibc, in each mode: the report's totals equal the shim's count of the same run
    (EXTRA: further alloclens options)."""
    tmp = altest.tmpdir()
    try:
        want = shim_totals(shim, cmd, tmp)
    except (subprocess.SubprocessError, OSError, KeyError, ValueError) as e:
        tap.ok(False, f"{label}: counted without alloclens", str(e))
        return
    for mode in ("full", "time", "sample"):
        proc, report = altest.run("glibc", cmd, tmp, extra=("--mode", mode, *extra), timeout=120)
        if proc.returncode != 0 or report is None:
            tap.ok(False, f"{label}, --mode {mode}: every call and no other, in absolute terms",
                   f"exit {proc.returncode}; report {'missing' if report is None else 'there'}")
            continue
        got = report_totals(report)
        n = 3 if frees else 2
        tap.ok(got[:n] == want[:n], f"{label}, --mode {mode}: every call and no other, in absolute terms",
               f"(allocations, reallocs{', frees' if frees else ''}) alloclens {got[:n]}, "
               f"count_shim {want[:n]}")


def main():
    if len(sys.argv) < 6:
        sys.exit(__doc__)
    prog_c, prog_cxx, shim, tls_cycles, tls_plugin = sys.argv[1:6]
    single = sys.argv[6:]
    tap = altest.Tap()
    found = altest.allocators()
    tap.ok(found, "alloclens allocators finds allocators", "none found")
    for prog, kind, own_ops in ((prog_c, "C", C_OPS), (prog_cxx, "C++", CXX_OPS)):
        for alloc in ALLOCATORS:
            if alloc not in found:
                tap.skip(f"{kind} under {alloc}", "not installed")
                continue
            check_program(tap, f"{kind} under {alloc}", alloc, prog, own_ops)
            # --mode time tells new from reused addresses, and a free's size class, from marks
            # instead of records: the same table, exactly.
            check_program(tap, f"{kind} under {alloc}, --mode time", alloc, prog, own_ops,
                          extra=("--mode", "time"))
            # --mode sample counts before the call and lets the allocator return to the
            # program itself: a call the allocator made back into malloc would show here.
            check_program(tap, f"{kind} under {alloc}, --mode sample", alloc, prog, own_ops,
                          extra=("--mode", "sample"))
    # The large threshold is an option: with 8 KiB many of the program's small requests become
    # large ones, on both sides of the line.
    first = next((a for a in ALLOCATORS if a in found), None)
    if first:
        check_program(tap, f"C under {first}, --large-threshold 8192", first, prog_c, C_OPS,
                      extra=("--large-threshold", "8192"),
                      prog_extra=("--large-threshold", "8192"))
    if "glibc" in found:
        for prog in single:
            check_absolute(tap, shim, [prog], os.path.basename(prog), frees=True)
        check_absolute(tap, shim, [tls_cycles, tls_plugin, "10"],
                       "tls_cycles, a library with thread-locals loaded 10 times, every allocation sampled",
                       frees=True, extra=("--sample-rate", "1"))
        for prog in (prog_c, prog_cxx):
            check_absolute(tap, shim, [prog, "--scale", "1"], os.path.basename(prog), frees=False)
    else:
        tap.skip("every call and no other, in absolute terms", "glibc not found")
    tap.done()


if __name__ == "__main__":
    main()
