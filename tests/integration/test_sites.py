#!/usr/bin/env python3
"""Allocation sites: the sampler's estimates are unbiased and spread as theory says, the stacks
name the program's own functions, pagemap residency, determinism, --mode sample, pprof output.

usage: test_sites.py SITES_STATS SITES_PAGEMAP SITES_COUNTS PLUGIN_A PLUGIN_B
       test_sites.py --simulate ROUNDS   (the statistical checks on simulated samplers: how often
                                          each fails when the sampler is right; no alloclens)

The sampler (see the `sites` section of docs/report-schema.md): a per-thread countdown drawn from
an exponential distribution with mean R, decremented by size + 1 per allocation, so an object of
Z bytes is sampled with probability p = 1 - e^(-(Z+1)/R), and a sample stands for Z/p bytes and
1/p objects. For n objects of Z bytes the estimate is unbiased with variance n Z^2 (1-p)/p
(bytes) and n (1-p)/p (objects), the jemalloc notes' result (they write p = 1 - e^(-Z/R); the +1
of the countdown changes it by 1/Z, nothing for these checks).

SITES_STATS prints its truth per site (bytes, objects, live bytes at exit, request-size histogram,
malloc_usable_size per size). It runs under glibc with 20 seeds twice:
  - at the default rate (512 KiB): site_medium_objects (16384 x 64 KiB, p = 0.12, freed at once),
    site_mixed_sizes (8 B, 512 B, 64 KiB and 8 MiB requests, freed at once),
    site_small_objects (10^6 x 8 B, all live until exit, about 17 samples a run) and
    site_huge_objects (8 x 8 MiB, live until exit, p = 1: no spread at all);
  - at --sample-rate 2048 with --no-transient: site_small_objects gets about 4400 samples a run,
    so its mean over 20 seeds has a standard error of 0.34%, and 2% is a real bound.
For every site and estimate: the mean over the seeds is within max(2%, 4.5 standard errors) of
the truth; the sample variance across seeds is within [0.3, 3] times the theoretical one (a
chi-square with 19 degrees of freedom is inside [0.32, 2.4] times its mean 99.9% of the time);
where theory says there is no spread (p = 1) there is none. Per run: each sample weighs Z/p
exactly, sites that keep everything live until exit have live_bytes_at_peak equal to
allocated_bytes, sites that freed everything before the peak have none live at it.
A third series (20 seeds, --churn, in full mode and in --mode sample) puts the heap's peak, and
the process's peak RSS, at the end while the sampler's own estimate of what is live is highest
earlier, in a batch of transient objects: the sites' peak is the heap's (full mode) or the RSS's
(sample), so the batches hold nothing at it and the small objects all of theirs. The same
--mode sample runs again (5 seeds) exec'd by a process that peaked far higher (256 MiB), the
library preloaded directly: exec keeps that peak in getrusage, so the sampler must read the
image's own (VmHWM) to find the same peak.

`--simulate` runs the same statistical checks on binomially drawn samples (a correct sampler) and
prints how often each one fails: the false-alarm rate of this test. With 2000 rounds: each mean
check 0%, each variance check 0.1-0.4%, about 1% of rounds in all. The seeds are fixed, so a
given build on a given libc passes or fails every time; a false alarm would show as a variance
ratio just outside the band with the mean checks all passing.

The pagemap program and the --mode check use their own programs (see progs/sites_pagemap.c,
progs/sites_counts.c); the Rust check builds one at test time (RUST_SOURCE), where rustc is on
PATH. meson test sets MALLOC_PERTURB_, which makes glibc write every byte it
hands out; the runs here leave it out, so the pages a program touches are its own doing.
"""
import gzip
import json
import math
import os
import random
import re
import shutil
import statistics
import subprocess
import sys

import altest

ALLOC = "glibc"
SEEDS = list(range(1, 21))
DEFAULT_RATE = 512 * 1024
SMALL_RATE = 2048
LISTS = ("top", "top_by_internal_fragmentation", "top_by_allocated")
METRICS = ("allocated_bytes", "allocated_objects", "internal_fragmentation_bytes",
           "live_bytes_at_peak")
RUN_TIMEOUT = 120

# ---------------------------------------------------------------- report access


def frame_function(frame):
    """'func (file:line)' -> 'func'."""
    return str(frame).split(" (", 1)[0].strip()


def names(frame, name):
    return re.match(re.escape(name) + r"(\W|$)", frame_function(frame)) is not None


def site_rows(report):
    """Every row of the three sites lists, once each (keyed by stack)."""
    seen = {}
    sites = report.get("sites") or {}
    for lst in LISTS:
        for row in sites.get(lst) or []:
            seen.setdefault(tuple(row.get("stack") or ()), row)
    return list(seen.values())


def rows_of(rows, name):
    """Rows whose stack names function NAME anywhere."""
    return [r for r in rows if any(names(f, name) for f in r.get("stack") or ())]


def num(v):
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else 0.0


def site_value(rows, name, metric):
    return sum(num(r.get(metric)) for r in rows_of(rows, name))


def norm_stack(stack):
    return tuple(re.sub(r"0x[0-9a-fA-F]+", "0x?", str(f)) for f in stack)


def estimates_table(report):
    """{normalised stack: (estimates...)} for comparing two runs."""
    t = {}
    for r in site_rows(report):
        key = norm_stack(r.get("stack") or ())
        val = tuple(num(r.get(m)) for m in METRICS + ("count",))
        t[key] = tuple(a + b for a, b in zip(t.get(key, (0,) * len(val)), val))
    return t


# ---------------------------------------------------------------- theory


def prob(z, rate):
    return -math.expm1(-(z + 1) / rate)


def truth_values(t):
    frag = sum(n * (t["usable"][z] - int(z)) for z, n in t["sizes"].items())
    return {"allocated_bytes": t["bytes"], "allocated_objects": t["objects"],
            "internal_fragmentation_bytes": frag, "live_bytes_at_peak": t["live_bytes"]}


def keeps_all(t):
    """The site keeps every object live until exit (else it frees all before the peak)."""
    return t["live_bytes"] == t["bytes"]


def weight(metric, z, usable, live):
    return {"allocated_bytes": z, "allocated_objects": 1,
            "internal_fragmentation_bytes": usable - z,
            "live_bytes_at_peak": z if live else 0}[metric]


def theory_var(t, rate, metric):
    """Variance of one run's estimate of METRIC for site truth T at rate RATE."""
    var = 0.0
    for zs, n in t["sizes"].items():
        z = int(zs)
        p = prob(z, rate)
        w = weight(metric, z, t["usable"][zs], keeps_all(t))
        var += n * w * w * (1 - p) / p
    return var


# ---------------------------------------------------------------- statistical checks

MEAN_SIGMAS = 4.5
VAR_BAND = (0.3, 3.0)


def stat_checks(tap, label, truth, values_by_seed, rate):
    """values_by_seed: {seed: {site: {metric: value}}}. Mean and spread per site and metric."""
    seeds = sorted(values_by_seed)
    for site, t in truth.items():
        tv = truth_values(t)
        for metric in METRICS:
            want = tv[metric]
            vals = [values_by_seed[s].get(site, {}).get(metric, 0.0) for s in seeds]
            if want == 0:
                continue  # the transient sites' live bytes: checked per run
            var = theory_var(t, rate, metric)
            se = math.sqrt(var / len(vals))
            tol = max(0.02 * want, MEAN_SIGMAS * se)
            mean = statistics.fmean(vals)
            per_seed = ", ".join(f"{s}: {v:.6g}" for s, v in zip(seeds, vals))
            detail = (f"truth {want}, mean of {len(vals)} seeds {mean:.6g} "
                      f"(ratio {mean / want:.4f}), allowed +-{tol / want:.2%} "
                      f"(theory: {math.sqrt(var) / want:.2%} a run, standard error "
                      f"{se / want:.2%})\nper seed: {per_seed}")
            tap.ok(abs(mean - want) <= tol,
                   f"{label}: {site} {metric}: mean over {len(vals)} seeds within "
                   f"{tol / want:.1%} of the truth", detail)
            # The spread: only where it tells something new (objects differ from bytes only at a
            # site of several sizes; fragmentation and live bytes are fixed multiples of bytes
            # at one-size sites that keep everything).
            if metric == "allocated_objects" and len(t["sizes"]) == 1:
                continue
            if metric in ("internal_fragmentation_bytes", "live_bytes_at_peak"):
                continue
            obs = statistics.variance(vals)
            missed = len(vals) * sum(n * (1 - prob(int(z), rate)) for z, n in t["sizes"].items())
            if missed < 1e-3:  # all but certainly every object is sampled in every run
                tap.ok(math.sqrt(obs) <= 1e-3 * want,
                       f"{label}: {site} {metric}: no spread across seeds (p = 1)",
                       f"std dev across seeds {math.sqrt(obs):.6g} ({math.sqrt(obs) / want:.4%}),"
                       f" theory {math.sqrt(var):.3g} (objects left unsampled in all the runs, "
                       f"expected: {missed:.2g})\n{detail}")
            else:
                ratio = obs / var
                tap.ok(VAR_BAND[0] <= ratio <= VAR_BAND[1],
                       f"{label}: {site} {metric}: variance across seeds is "
                       f"{VAR_BAND[0]}..{VAR_BAND[1]} times n Z^2 (1-p)/p",
                       f"observed variance / theoretical = {ratio:.3f} (std dev "
                       f"{math.sqrt(obs) / want:.2%} of the truth, theory "
                       f"{math.sqrt(var) / want:.2%})\n{detail}")


# ---------------------------------------------------------------- simulation


def binomial(rng, n, p):
    if p >= 1.0:
        return n
    if p > 0.5:
        return n - binomial(rng, n, 1 - p)
    k, i, lq = 0, 0, math.log1p(-p)
    while True:
        i += int(math.log(1.0 - rng.random()) / lq) + 1
        if i > n:
            return k
        k += 1


def simulate(truth, rate, rng):
    out = {}
    for site, t in truth.items():
        v = dict.fromkeys(METRICS, 0.0)
        for zs, n in t["sizes"].items():
            z = int(zs)
            p = prob(z, rate)
            k = binomial(rng, n, p)
            for m in METRICS:
                v[m] += k * weight(m, z, t["usable"][zs], keeps_all(t)) / p
        out[site] = v
    return out


class CountingTap(altest.Tap):
    def __init__(self):
        super().__init__()
        self.fails = {}
        self.runs = {}

    def ok(self, cond, desc, detail=None):
        self.runs[desc] = self.runs.get(desc, 0) + 1
        if not cond:
            self.fails[desc] = self.fails.get(desc, 0) + 1
        return cond


def simulated_truth():
    """What SITES_STATS prints under glibc (x86-64)."""
    mixed = {"8": 131056, "512": 32768, "65536": 16384, "8388608": 16}
    usable = {"8": 24, "512": 520, "65536": 65544, "8388608": 8392688}
    full = {
        "site_medium_objects": {"bytes": 1 << 30, "objects": 16384, "live_bytes": 0,
                                "sizes": {"65536": 16384}, "usable": {"65536": 65544}},
        "site_mixed_sizes": {"bytes": sum(int(z) * n for z, n in mixed.items()),
                             "objects": sum(mixed.values()), "live_bytes": 0,
                             "sizes": mixed, "usable": usable},
        "site_small_objects": {"bytes": 8000000, "objects": 1000000, "live_bytes": 8000000,
                               "sizes": {"8": 1000000}, "usable": {"8": 24}},
        "site_huge_objects": {"bytes": 64 << 20, "objects": 8, "live_bytes": 64 << 20,
                              "sizes": {"8388608": 8}, "usable": {"8388608": 8388616}},
    }
    small = {k: full[k] for k in ("site_small_objects", "site_huge_objects")}
    return full, small


def run_simulation(rounds):
    rng = random.Random(12345)
    full, small = simulated_truth()
    tap = CountingTap()
    for _ in range(rounds):
        for label, truth, rate in (("default rate", full, DEFAULT_RATE),
                                   (f"rate {SMALL_RATE}", small, SMALL_RATE)):
            vals = {s: simulate(truth, rate, rng) for s in SEEDS}
            stat_checks(tap, label, truth, vals, rate)
    total = 0
    for desc, n in tap.runs.items():
        f = tap.fails.get(desc, 0)
        total += f
        print(f"{f / n:8.4%}  {desc}")
    print(f"rounds {rounds}: {total} failed checks in all, "
          f"{sum(tap.runs.values()) // rounds} checks a round")


# ---------------------------------------------------------------- running


def run(cmd, tmp, name, extra=(), env=None, **kw):
    """(proc, report, truth or None, why or None); KW goes to subprocess.run."""
    # meson test sets MALLOC_PERTURB_, and glibc then writes every byte it hands out: the pages
    # a program touches would no longer be its own doing.
    env = dict(os.environ if env is None else env)
    env.pop("MALLOC_PERTURB_", None)
    kw.update(timeout=RUN_TIMEOUT, env=env)
    try:
        proc, report = altest.run(ALLOC, cmd, tmp, name=name, extra=extra, **kw)
    except subprocess.TimeoutExpired:
        return None, None, None, f"{' '.join(cmd)}: no exit in {RUN_TIMEOUT} s"
    if proc.returncode != 0:
        return proc, report, None, (f"{' '.join(extra)} {' '.join(cmd)}: exit status "
                                    f"{proc.returncode}; stderr:\n"
                                    + proc.stderr.decode(errors="replace")[-2000:])
    if report is None:
        return proc, None, None, "no JSON report written"
    try:
        truth = json.loads(proc.stdout.decode())
    except ValueError as e:
        return proc, report, None, f"program output is not its truth ({e}): {proc.stdout[:300]!r}"
    sites = report.get("sites")
    if not isinstance(sites, dict) or sites.get("available") is not True:
        return proc, report, truth, f"sites not available: {json.dumps(sites)[:500]}"
    return proc, report, truth, None


def check_symbols(tap, prog, tmp, reports, label):
    """Frames are named by alloclens-symbolize (debug information: the program's file:line);
    the text report's sites give their three innermost frames, as the JSON's top sites; a copy
    of the library with no symbolizer beside it falls back to the dynamic symbol table and says
    why."""
    seed, first = next(iter(reports.items()))
    sites = first["sites"]
    src = os.path.basename(prog) + ".c:"
    tap.ok(sites.get("symbols") == "debug information" and sites.get("symbols_reason") is None,
           "frames are named from debug information", f"{sites.get('symbols')}: {sites.get('symbols_reason')}")
    tap.ok(any(src in f for row in sites["top"] for f in row["stack"]),
           f"the stacks give {src}LINE", show_rows(first))
    with open(os.path.join(tmp, run_name(label, seed) + ".txt")) as f:
        text = f.read().splitlines()
    at = next((i for i, l in enumerate(text) if l.split()[:1] == ["live@peak"]), None)
    lines = text[at + 1:at + 1 + len(sites["top"][:10])] if at is not None else []
    want = [" < ".join(row["stack"][:3]) for row in sites["top"][:10]]
    tap.ok(want and len(lines) == len(want) and all(
               l.split(None, 3)[3:] == [w] for l, w in zip(lines, want)),
           "text: each top site with its three innermost frames, as in the JSON",
           "\n".join(text[at or 0:(at or 0) + 12]) + "\nwant:\n" + "\n".join(want))
    lib = altest.so()
    if not tap.ok(os.path.exists(lib), "liballoclens.so under test found (meson passes it)", lib):
        return
    alone = os.path.join(tmp, "alone")
    os.makedirs(alone, exist_ok=True)
    shutil.copy(lib, alone)
    out = os.path.join(tmp, "alone.json")
    env = dict(os.environ, LD_PRELOAD=os.path.join(alone, "liballoclens.so"), ALLOCLENS_OUTPUT=out,
               ALLOCLENS_TEXT="off")
    env.pop("MALLOC_PERTURB_", None)
    proc = subprocess.run([prog], env=env, capture_output=True, timeout=RUN_TIMEOUT)
    try:
        with open(out) as f:
            alone_sites = json.load(f)["sites"]
    except (OSError, ValueError, KeyError) as e:
        tap.ok(False, "without the symbolizer: a report", f"{e}; exit {proc.returncode}")
        return
    tap.ok(proc.returncode == 0 and alone_sites.get("symbols") == "dynamic symbols"
           and "alloclens-symbolize is not installed" in (alone_sites.get("symbols_reason") or ""),
           "without the symbolizer: dynamic symbols, and the report says why",
           f"exit {proc.returncode}; {alone_sites.get('symbols')}: {alone_sites.get('symbols_reason')}")
    tap.ok(alone_sites.get("top") and all(row["stack"] for row in alone_sites["top"]),
           "without the symbolizer: every site still has its stack")


def show_rows(report, limit=12):
    out = []
    for r in site_rows(report)[:limit]:
        out.append(json.dumps({k: r.get(k) for k in ("stack", *METRICS, "count")})[:600])
    return "\n".join(out)


def run_name(label, seed):
    """The name of a series' run: its report is NAME.json, its text NAME.txt (altest.run)."""
    return f"{label}-{seed}".replace(" ", "_")


def run_series(tap, label, prog, args, rate, tmp, extra=(), seeds=SEEDS, **kw):
    """A run of PROG ARGS at RATE (None: the default) for each of SEEDS, with the alloclens
    options EXTRA (KW to subprocess.run). Returns ({seed: report}, truth) or (None, None) when
    the runs fail."""
    extra = (*(() if rate is None else ("--sample-rate", str(rate))), *extra)
    reports, truth, whys = {}, None, []
    for seed in seeds:
        proc, report, tr, why = run([prog, *args], tmp, run_name(label, seed),
                                    extra=(*extra, "--seed", str(seed)), **kw)
        if why:
            whys.append(f"seed {seed}: {why}")
            if len(whys) >= 2 and not reports:
                break  # not working at all: do not run 20 times to say so
            continue
        reports[seed] = report
        truth = tr["sites"]
    if not tap.ok(not whys, f"{label}: {len(seeds)} runs with --seed {seeds[0]}..{seeds[-1]} complete, "
                  f"sites available", "\n".join(whys)):
        if len(reports) < len(seeds):
            return None, None
    return reports, truth


INHERITED_MIB = 256


def touch_inherited():
    """In the child before it execs `alloclens run`: a peak RSS that exec keeps (the kernel's
    getrusage figure) and that the program's own never reaches."""
    big = b"\x01" * (INHERITED_MIB << 20)
    del big


def check_inherited_peak(tap, prog, tmp):
    """The --churn checks of --mode sample, in a program whose getrusage peak is an earlier
    image's: only the image's own peak (VmHWM) can place the sites' peak at the end."""
    label = "churn --mode sample after exec from a larger image"
    reports, truth = run_series(tap, label, prog, ["--churn"], None, tmp, ("--mode", "sample"),
                                seeds=SEEDS[:5], preexec_fn=touch_inherited)
    if reports is None:
        return
    peaks = [num(rep.get("profiler", {}).get("process_peak_rss_bytes")) for rep in reports.values()]
    # The regime under test: the image's own peak far below the one exec kept.
    tap.ok(all(0 < p < (INHERITED_MIB << 20) / 2 for p in peaks),
           f"{label}: the program's own peak RSS is under half the inherited {INHERITED_MIB} MiB",
           f"process_peak_rss_bytes {peaks}")
    tap.ok(all(r["sites"].get("peak_source") == "rss" for r in reports.values()),
           f"{label}: the sites' peak is the RSS's",
           str([r["sites"].get("peak_source") for r in reports.values()]))
    per_run_checks(tap, label, reports, truth, None, os.path.basename(prog) + ".c")


def per_run_checks(tap, label, reports, truth, rate, prog_file):
    want_rate = DEFAULT_RATE if rate is None else rate
    bad_hdr, bad_stack, bad_weight, bad_live, bad_transient, bad_life, bad_order, bad_res = (
        [] for _ in range(8))
    for seed, rep in sorted(reports.items()):
        sites = rep["sites"]
        if num(sites.get("sample_rate_bytes")) != want_rate or sites.get("seed") != seed:
            bad_hdr.append(f"seed {seed}: sample_rate_bytes {sites.get('sample_rate_bytes')!r} "
                           f"(want {want_rate}), seed {sites.get('seed')!r}")
        rows = site_rows(rep)
        for lst, key in (("top", "live_bytes_at_peak"), ("top_by_allocated", "allocated_bytes"),
                         ("top_by_internal_fragmentation", "internal_fragmentation_bytes")):
            vals = [num(r.get(key)) for r in sites.get(lst) or []]
            if not isinstance(sites.get(lst), list) or vals != sorted(vals, reverse=True):
                bad_order.append(f"seed {seed}: {lst} not a list by {key}, largest first: {vals}")
        for site, t in truth.items():
            mine = rows_of(rows, site)
            if not mine:
                # Possible only where a run expects few samples (8 B objects at 512 KiB: e^-17).
                bad_stack.append(f"seed {seed}: no row names {site}")
                continue
            for r in mine:
                st = r.get("stack") or []
                if not (st and re.match(re.escape(site) + r" \(.*" + re.escape(prog_file)
                                        + r":\d+\)$", st[0])
                        and any(frame_function(f) == "main" for f in st[1:])):
                    bad_stack.append(f"seed {seed}: {site}: stack {st}")
            # Each sample weighs Z/p bytes and 1/p objects: at a one-size site the estimates
            # are count times those, exactly (either p = 1-e^(-(Z+1)/R) or 1-e^(-Z/R)).
            count = sum(num(r.get("count")) for r in mine)
            if len(t["sizes"]) == 1:
                z = int(next(iter(t["sizes"])))
                got_b = site_value(rows, site, "allocated_bytes")
                got_o = site_value(rows, site, "allocated_objects")
                okw = False
                for p in (prob(z, want_rate), -math.expm1(-z / want_rate)):
                    eb, eo = count * z / p, count / p
                    if (abs(got_b - eb) <= 1e-6 * eb + 1 and abs(got_o - eo) <= 1e-6 * eo + 1):
                        okw = True
                if not okw:
                    bad_weight.append(
                        f"seed {seed}: {site}: count {count:g}, allocated_bytes {got_b:.10g}, "
                        f"allocated_objects {got_o:.10g}; count*Z/p = {count * z / prob(z, want_rate):.10g},"
                        f" count/p = {count / prob(z, want_rate):.10g} (p = 1-e^(-(Z+1)/R) = "
                        f"{prob(z, want_rate):.6g})")
            live = site_value(rows, site, "live_bytes_at_peak")
            alloc = site_value(rows, site, "allocated_bytes")
            lifes = [r.get("lifetime_ns") for r in mine]
            if keeps_all(t):
                if abs(live - alloc) > 1e-6 * alloc + 1:
                    bad_live.append(f"seed {seed}: {site}: live_bytes_at_peak {live:.10g} != "
                                    f"allocated_bytes {alloc:.10g}, and nothing was freed")
                if any(lf is not None for lf in lifes):
                    bad_life.append(f"seed {seed}: {site} frees nothing, lifetime_ns {lifes}")
                # Every byte of what is live at the peak is resident, swapped or untouched.
                aps = [r.get("at_peak") for r in mine]
                res = sum(num((ap or {}).get(k)) for ap in aps
                          for k in ("resident_bytes", "swapped_bytes", "untouched_bytes"))
                if not all(isinstance(ap, dict) for ap in aps) or abs(res - live) > 0.01 * live:
                    bad_res.append(f"seed {seed}: {site}: at_peak {aps} sums to {res:.10g}, "
                                   f"live_bytes_at_peak {live:.10g} (ratio "
                                   f"{res / live if live else float('nan'):.4f})")
            else:
                if live != 0:
                    bad_transient.append(f"seed {seed}: {site}: live_bytes_at_peak {live:.10g}, "
                                         "yet all its objects were freed before the peak")
                runtime = num(rep.get("program", {}).get("runtime_ns"))
                for lf in lifes:
                    if not (isinstance(lf, dict) and 0 <= num(lf.get("median"))
                            <= num(lf.get("p90")) and (not runtime or num(lf.get("p90")) <= runtime)):
                        bad_life.append(f"seed {seed}: {site}: lifetime_ns {lf} "
                                        f"(program runtime_ns {runtime:g})")
            if site == "site_huge_objects" and count != 8:
                bad_weight.append(f"seed {seed}: {site}: count {count:g}, want 8 (p = 1)")
    first = min(reports)
    tap.ok(not bad_hdr, f"{label}: sites.sample_rate_bytes is {want_rate}, sites.seed the --seed",
           "\n".join(bad_hdr[:10]))
    tap.ok(not bad_order, f"{label}: top, top_by_allocated, top_by_internal_fragmentation are "
           "sorted by their estimate", "\n".join(bad_order[:10]))
    tap.ok(not bad_stack, f"{label}: every site has rows whose stack starts with "
           f"'site_... ({prog_file}:LINE)' and goes on to main",
           "\n".join(bad_stack[:10]) + f"\nrows of seed {first}:\n" + show_rows(reports[first]))
    tap.ok(not bad_weight, f"{label}: one-size sites: allocated_bytes = count * Z/p, "
           "allocated_objects = count/p; 8 MiB objects always sampled",
           "\n".join(bad_weight[:10]))
    tap.ok(not bad_live, f"{label}: sites that keep everything: live_bytes_at_peak = "
           "allocated_bytes", "\n".join(bad_live[:10]))
    tap.ok(not bad_res, f"{label}: sites that keep everything: at_peak resident + swapped + "
           "untouched = live_bytes_at_peak (within 1%)", "\n".join(bad_res[:10]))
    tap.ok(not bad_transient, f"{label}: sites that freed everything before the peak: "
           "live_bytes_at_peak 0", "\n".join(bad_transient[:10]))
    tap.ok(not bad_life, f"{label}: lifetime_ns: null where nothing was freed, median <= p90 <= "
           "runtime where all was", "\n".join(bad_life[:10]))


def values(reports, truth):
    out = {}
    for seed, rep in reports.items():
        rows = site_rows(rep)
        out[seed] = {site: {m: site_value(rows, site, m) for m in METRICS} for site in truth}
    return out


def check_counts_mean(tap, label, reports, site, t, rate):
    """The number of samples itself: Binomial(n, p) per size, mean over the seeds."""
    n_p = sum(n * prob(int(z), rate) for z, n in t["sizes"].items())
    var = sum(n * prob(int(z), rate) * (1 - prob(int(z), rate)) for z, n in t["sizes"].items())
    cs = [sum(num(r.get("count")) for r in rows_of(site_rows(rep), site))
          for rep in reports.values()]
    mean = statistics.fmean(cs)
    tol = max(MEAN_SIGMAS * math.sqrt(var / len(cs)), 0.5)
    tap.ok(abs(mean - n_p) <= tol, f"{label}: {site}: mean count of samples is n p",
           f"mean {mean:.2f}, n p = {n_p:.2f}, allowed +-{tol:.2f}; counts {cs}")


def check_determinism(tap, prog, tmp, reports):
    """Same seed twice: identical estimates; other seeds: other estimates; the environment
    variables do what the options do."""
    proc, again, _, why = run([prog], tmp, "again-1", extra=("--seed", "1"))
    if why:
        tap.ok(False, "determinism: the seed-1 run again completes", why)
        return
    a, b = estimates_table(reports[1]), estimates_table(again)
    diff = [f"{k[:2]}: {a.get(k)} then {b.get(k)}" for k in sorted(set(a) | set(b))
            if a.get(k) != b.get(k)]
    tap.ok(not diff, "determinism: --seed 1 twice gives identical site estimates",
           "\n".join(diff[:20]))
    if 2 in reports:
        tap.ok(estimates_table(reports[2]) != a, "determinism: --seed 1 and --seed 2 differ")
    med = [site_value(site_rows(r), "site_medium_objects", "allocated_bytes")
           for r in reports.values()]
    tap.ok(len(set(med)) >= len(med) * 3 // 4,
           f"determinism: site_medium_objects estimates differ across the {len(med)} seeds",
           f"{len(set(med))} distinct: {med}")
    env = dict(os.environ, ALLOCLENS_SEED="1")
    proc, viaenv, _, why = run([prog], tmp, "env-1", env=env)
    tap.ok(not why and estimates_table(viaenv) == a and viaenv["sites"].get("seed") == 1,
           "ALLOCLENS_SEED=1 gives what --seed 1 gives",
           why or f"sites.seed {viaenv['sites'].get('seed')!r}\n{show_rows(viaenv)}")
    env = dict(os.environ, ALLOCLENS_SEED="1", ALLOCLENS_SAMPLE_RATE=str(SMALL_RATE))
    proc, viaenv, _, why = run([prog, "--no-transient"], tmp, "env-rate", env=env)
    tap.ok(not why and num(viaenv["sites"].get("sample_rate_bytes")) == SMALL_RATE,
           f"ALLOCLENS_SAMPLE_RATE={SMALL_RATE} sets sites.sample_rate_bytes",
           why or json.dumps({k: v for k, v in viaenv["sites"].items() if k not in LISTS}))


def check_pagemap(tap, prog, tmp, flag=None, mode="full"):
    """64 MiB, a quarter written after the malloc, live until exit: three quarters untouched.
    --after: 8 MiB more allocated (and written) after the quarter was written. --fork: the same
    in a forked child, whose parent had read its own pagemap before: the child's report must
    read the child's. --failed-realloc: a realloc of the buffer failed, which leaves it the
    program's (and its sample live), in each MODE."""
    label = "pagemap" + (f" {flag}" if flag else "") + (f" --mode {mode}" if mode != "full" else "")
    name = label.replace(" ", "")
    proc, rep, truth, why = run([prog, *([flag] if flag else [])], tmp, name,
                                extra=("--seed", "1", "--mode", mode))
    if not why and flag == "--fork":
        side = os.path.join(tmp, f"{name}.{truth['child']}.json")
        rep = json.load(open(side)) if os.path.exists(side) else None
        why = None if rep else f"no report from the child: {side}"
    if not tap.ok(not why, f"{label}: run completes, sites available", why):
        return
    rows = site_rows(rep)
    mine = rows_of(rows, "site_touch_quarter")
    if flag == "--late-site":
        late = rows_of(rows, "site_late")
        ap = late[0].get("at_peak") if len(late) == 1 else None
        live = num(late[0].get("live_bytes_at_peak")) if late else 0
        tot = sum(num((ap or {}).get(k)) for k in ("resident_bytes", "swapped_bytes", "untouched_bytes"))
        tap.ok(isinstance(ap, dict) and live > 0 and abs(tot - live) <= 0.01 * live
               and num(ap.get("untouched_bytes")) <= 0.05 * tot,
               f"{label}: site_late, first sampled after the last measure but half of the peak, "
               "measured: its bytes at the peak all resident or swapped", show_rows(rep))
        # Any other site with bytes at the peak: measured (its parts sum to them) or null.
        bad = [r for r in rows if num(r.get("live_bytes_at_peak")) > 0 and r.get("at_peak") is not None
               and abs(sum(num(r["at_peak"].get(k)) for k in ("resident_bytes", "swapped_bytes", "untouched_bytes"))
                       - num(r.get("live_bytes_at_peak"))) > 0.01 * num(r.get("live_bytes_at_peak"))]
        tap.ok(not bad, f"{label}: every site's at_peak sums to its bytes at the peak, or is null "
               "(none of its samples measured)", show_rows(rep))
        return
    if flag == "--fork":
        # A side report names frames from dynamic symbols only: the site is the buffer's size.
        mine = [r for r in rows if num(r.get("allocated_bytes")) == truth["buffer"]]
        sites = rep["sites"]
        tap.ok(sites.get("symbols") == "dynamic symbols" and "main one" in (sites.get("symbols_reason") or ""),
               f"{label}: the child's report says its names are dynamic symbols, and why",
               f"{sites.get('symbols')!r}: {sites.get('symbols_reason')!r}")
    if flag == "--threaded":
        ours = [f for r in rows for f in r.get("stack") or [] if "interpose/" in f or "liballoclens" in f]
        tap.ok(not ours, f"{label}: no frame of alloclens's in any stack (a thread's start, a "
               "signal handler's call)", f"{ours[:4]}")
    if not tap.ok(len(mine) == 1 and isinstance(mine[0].get("at_peak"), dict),
                  f"{label}: one row for site_touch_quarter, with at_peak", show_rows(rep)):
        return
    ap = mine[0]["at_peak"]
    res, swp, unt = (num(ap.get(k)) for k in ("resident_bytes", "swapped_bytes",
                                              "untouched_bytes"))
    tot = res + swp + unt
    frac = unt / tot if tot else float("nan")
    detail = (f"at_peak {ap}; untouched fraction {frac:.4f}; buffer {truth['buffer']}, "
              f"touched {truth['touched']} (written after the malloc)")
    tap.ok(tot and abs(tot - truth["buffer"]) <= 0.01 * truth["buffer"],
           f"{label}: resident + swapped + untouched bytes = the 64 MiB buffer (within 1%)",
           detail)
    tap.ok(tot and abs(frac - 0.75) <= 0.05,
           f"{label}: three quarters of the buffer never touched (0.75 +- 0.05)", detail)
    if flag == "--after":
        tap.diag(f"{label}: site_after_touch (8 MiB, all written after its malloc) at_peak: "
                 f"{[r.get('at_peak') for r in rows_of(rows, 'site_after_touch')]}")


def op_totals(report):
    t = {}
    for r in report.get("ops") or []:
        t[r["op"]] = t.get(r["op"], 0) + int(r["count"])
    return t


def check_mode_sample(tap, prog, tmp):
    results = {}
    for mode in ("full", "sample"):
        proc, rep, truth, why = run([prog], tmp, f"mode-{mode}",
                                    extra=("--mode", mode, "--seed", "5"))
        if not tap.ok(not why, f"--mode {mode}: run completes, sites available", why):
            return
        results[mode] = (rep, truth)
    (full, truth), (samp, _) = results["full"], results["sample"]
    tap.ok(full.get("mode") == "full" and samp.get("mode") == "sample",
           "--mode: the report's mode field says which", f"{full.get('mode')!r}, {samp.get('mode')!r}")
    peaks = {m: (rep["sites"].get("peak_source"), num(rep["sites"].get("peak_time_ns")),
                 num(rep["program"].get("runtime_ns"))) for m, (rep, _) in results.items()}
    tap.ok(peaks["full"][0] == "heap" and peaks["sample"][0] == "rss"
           and all(0 < t <= run for _, t, run in peaks.values()),
           "sites.peak_source: the heap's in full mode, the process's RSS in --mode sample; "
           "peak_time_ns within the run", str(peaks))
    env = dict(os.environ, ALLOCLENS_MODE="sample", ALLOCLENS_SEED="5")
    proc, viaenv, _, why = run([prog], tmp, "mode-env", env=env)
    tap.ok(not why and viaenv.get("mode") == "sample" and op_totals(viaenv) == op_totals(samp)
           and estimates_table(viaenv) == estimates_table(samp),
           "ALLOCLENS_MODE=sample (and ALLOCLENS_SEED=5) gives what --mode sample --seed 5 gives",
           why or f"mode {viaenv.get('mode')!r}, ops {op_totals(viaenv)}")
    ft, st = op_totals(full), op_totals(samp)
    tap.ok(ft.get("malloc", 0) >= truth["malloc"] and ft.get("malloc") == st.get("malloc"),
           f"--mode sample: malloc count identical to --mode full (>= the program's "
           f"{truth['malloc']})", f"full {ft}\nsample {st}")
    tap.ok(ft == st, "--mode sample: every op's count identical to --mode full",
           f"full {ft}\nsample {st}")
    rows_f, rows_s = site_rows(full), site_rows(samp)
    tap.ok(rows_of(rows_s, "site_counted_mallocs"),
           "--mode sample: the sites table has site_counted_mallocs", show_rows(samp))
    # Live bytes at the peak are not compared: full mode's peak is the heap's, measured; sample
    # mode has no heap measure, and its peak is the process's peak RSS.
    same = [m for m in METRICS if m != "live_bytes_at_peak"]
    ef = {m: site_value(rows_f, "site_counted_mallocs", m) for m in same}
    es = {m: site_value(rows_s, "site_counted_mallocs", m) for m in same}
    tap.ok(ef == es, "--mode sample: same seed, same site estimates as --mode full (all but the "
           "peak's)", f"full {ef}\nsample {es}")
    est = es["allocated_bytes"]
    # ~170 samples of mixed sizes: 4.5 standard errors is about 35%.
    tap.ok(abs(est - truth["bytes"]) <= 0.35 * truth["bytes"],
           "--mode sample: site_counted_mallocs allocated_bytes near the truth (+-35%)",
           f"estimate {est:.6g}, truth {truth['bytes']}")


def check_kept_samples(tap, prog, tmp):
    """100000 small objects live at once, then all freed, sampled at 256 bytes: about 11000
    live samples, a dozen on each page (past what a page bucket keeps the addresses of in
    --mode sample and time). Every sampled object's free must be seen: nothing live at exit."""
    for mode in ("sample", "time", "full"):
        proc, rep, truth, why = run([prog, "--keep", "100000"], tmp, f"kept-{mode}",
                                    extra=("--mode", mode, "--sample-rate", "256", "--seed", "3"))
        if not tap.ok(not why, f"--keep under --mode {mode}: run completes, sites available", why):
            continue
        sites = rep["sites"]
        est = site_value(site_rows(rep), "site_kept_mallocs", "allocated_bytes")
        tap.ok(sites.get("live_bytes_at_exit") == 0 and sites.get("samples_dropped") == 0
               and abs(est - truth["bytes"]) <= 0.05 * truth["bytes"],
               f"--keep under --mode {mode}: every sampled object's free seen (nothing live at "
               "exit, none dropped); site_kept_mallocs allocated_bytes within 5% of the truth",
               f"live at exit {sites.get('live_bytes_at_exit')}, dropped "
               f"{sites.get('samples_dropped')}, estimate {est}, truth {truth['bytes']}")


def check_many_sites(tap, prog, tmp):
    """More call paths than the site table holds, every allocation sampled: the samples past
    it form a row of their own, ranked with the others (before, they were in no list, no text
    and no pprof profile, and the biggest site, allocated last, was missing)."""
    proc, rep, truth, why = run([prog, "--many-sites"], tmp, "many-sites",
                                extra=("--sample-rate", "1", "--seed", "2"))
    if not tap.ok(not why, "many sites: run completes, sites available", why):
        return
    sites = rep["sites"]
    past = [r for r in sites.get("top") or [] if (r.get("stack") or [""])[0].startswith("(sites past the first")]
    big = max((num(r.get("live_bytes_at_peak")) for r in sites.get("top") or []), default=0)
    tap.ok(sites.get("sites", 0) < truth["paths"] and len(past) == 1 and big >= truth["big"],
           f"many sites: {truth['paths']} paths, more than the table's {sites.get('sites')} sites: the rest "
           f"in one row of the lists, which holds the {truth['big']} bytes allocated last",
           show_rows(rep))


def check_long_name(tap, prog, tmp):
    """A frame whose function's name is 1664 characters long is named whole, with its file
    and line, in the JSON and the pprof profile (they were cut at 1023 and 255 characters)."""
    pprof = os.path.join(tmp, "long-name.pb.gz")
    proc, rep, truth, why = run([prog, "--long-name"], tmp, "long-name",
                                extra=("--sample-rate", "1", "--pprof", pprof))
    if not tap.ok(not why, "long name: run completes, sites available", why):
        return
    frames = [f for r in site_rows(rep) for f in (r.get("stack") or [])[:1] if f.startswith("site_long_nam")]
    tap.ok(len(frames) == 1 and len(frames[0].split(" (")[0]) == truth["name"]
           and re.search(r"sites_counts\.c:\d+\)$", frames[0]),
           f"long name: the {truth['name']}-character function named whole, with its file and line",
           f"{[f[:40] + '...' + f[-40:] for f in frames]}")
    if shutil.which("go"):
        out = subprocess.run(["go", "tool", "pprof", "-raw", pprof], capture_output=True, text=True).stdout
        names = [w for w in out.split() if w.startswith("site_long_nam")]
        tap.ok(names and all(len(w) >= truth["name"] for w in names),
               "long name: the pprof profile names it whole", f"{[len(w) for w in names]}")


def check_inlined(tap, prog, tmp):
    """A call of malloc in a function inlined into two callers: each stack reads the inlined
    function with its line, then its own caller with the line of the inlined call, as
    addr2line -i does (the frame was one, named after the inlined function: the callers were
    lost, and the two sites could not be told apart; before that, the name was the caller's
    and the line the inlined function's). The pprof profile has them as one Location with two
    Lines, innermost first."""
    pprof = os.path.join(tmp, "inlined.pb.gz")
    proc, rep, truth, why = run([prog, "--inlined"], tmp, "inlined",
                                extra=("--sample-rate", "1", "--pprof", pprof))
    if not tap.ok(not why, "inlined: run completes, sites available", why):
        return
    src = r"\S*sites_counts\.c"
    helper = rf"site_inlined_helper \({src}:{truth['line']}\)"
    stacks = {num(r.get("allocated_bytes")): r.get("stack") or [] for r in site_rows(rep)}
    for size, caller, line in ((1 << 20, "site_inlined_caller", truth["a"]),
                               (2 << 20, "site_inlined_other_caller", truth["b"])):
        stack = stacks.get(size, [])
        tap.ok(len(stack) > 2 and re.fullmatch(helper, stack[0])
               and re.fullmatch(rf"{caller} \({src}:{line}\)", stack[1]) and names(stack[2], "main"),
               f"inlined: the {size >> 20} MiB site reads site_inlined_helper (sites_counts.c:{truth['line']}), "
               f"{caller} (sites_counts.c:{line}), main", f"{stack[:4]}")
    if shutil.which("go"):
        env = dict(os.environ, HOME=tmp, PPROF_TMPDIR=tmp)
        out = subprocess.run(["go", "tool", "pprof", "-raw", pprof], capture_output=True, text=True,
                             env=env, cwd=tmp).stdout
        locs = [rf"\d+: 0x[0-9a-f]+ M=\d+ site_inlined_helper {src}:{truth['line']} s=0\n"
                rf"\s+{caller} {src}:{line} s=0\n\s+\d+: "
                for caller, line in (("site_inlined_caller", truth["a"]),
                                     ("site_inlined_other_caller", truth["b"]))]
        tap.ok(all(re.search(loc, out) for loc in locs),
               "inlined: in the pprof profile, each caller's Location has two Lines, "
               "site_inlined_helper's then the caller's", out[-3000:])
    else:
        tap.skip("inlined: the pprof profile's Locations have a Line per function", "no `go` on PATH")


# A Rust program built at test time: allocations from a function kept out of line and from a
# closure, both under Rust's name mangling (legacy, and v0 in the standard library's newer
# symbols).
RUST_SOURCE = """
use std::hint::black_box;

#[inline(never)]
fn site_rust_named(n: usize) -> Vec<u8> {
    vec![1u8; n]
}

fn main() {
    let named = site_rust_named(black_box(1 << 20));
    let make = |n: usize| -> Vec<u64> { (0..n as u64).map(|i| i * 3).collect() };
    let made = black_box(make)(black_box(1 << 18));
    println!("{{\\"named\\":{},\\"made\\":{}}}", named.len(), made.len() * 8);
}
"""
MANGLED = re.compile(r"_ZN|\$LT\$|\$GT\$|\$u[0-9a-f]{2}\$|::h[0-9a-f]{16}\b|^_R[A-Za-z0-9_]")


def build_program(tap, tmp, desc, compilers, flags, name, source, timeout):
    """SOURCE written to TMP/NAME and built by the first of COMPILERS on PATH, with FLAGS, into
    TMP/NAME less its suffix: that path, or None (DESC skipped where there is no compiler, a
    failed check where the build fails, with the compiler's message)."""
    compiler = next((c for c in map(shutil.which, compilers) if c), None)
    if not compiler:
        tap.skip(desc, f"no {' or '.join(compilers)} on PATH")
        return None
    src = os.path.join(tmp, name)
    with open(src, "w") as f:
        f.write(source)
    exe = os.path.join(tmp, os.path.splitext(name)[0])
    built = subprocess.run([compiler, *flags, "-o", exe, src], capture_output=True, text=True,
                           timeout=timeout, cwd=tmp)
    what = f"{name} builds ({os.path.basename(compiler)} {' '.join(flags)})"
    return exe if tap.ok(built.returncode == 0, what, built.stderr[-2000:]) else None


def check_rust(tap, tmp):
    """Rust frames read as demangled Rust paths (legacy symbols were left half-demangled as C++,
    with their hash; v0 symbols not at all), and a closure's frame is the closure's (it was the
    function the closure was inlined into, with the closure's line)."""
    desc = "rust: frames read as demangled Rust paths, the named function's and the closure's"
    exe = build_program(tap, tmp, desc, ("rustc",), ["-g", "-O"], "sites_rust.rs", RUST_SOURCE, 300)
    if not exe:
        return
    proc, rep, truth, why = run([exe], tmp, "rust", extra=("--sample-rate", "1"))
    if not tap.ok(not why, "rust: run completes, sites available", why):
        return
    sites = rep["sites"]
    rows = site_rows(rep)
    frames = [frame_function(f) for r in rows for f in r.get("stack") or []]
    mangled = sorted({f for f in frames if MANGLED.search(f)})
    named = [r["stack"] for r in rows if any(frame_function(f) == "sites_rust::site_rust_named" for f in r["stack"])]
    closure = [r["stack"] for r in rows
               if any(re.fullmatch(r"sites_rust::main::\{\{closure\}\} \(\S*sites_rust\.rs:\d+\)", f)
                      for f in r["stack"])]
    tap.ok(sites.get("symbols") == "debug information" and not mangled and named and closure,
           desc + " (sites_rust::site_rust_named, sites_rust::main::{{closure}} (sites_rust.rs:N))",
           f"symbols: {sites.get('symbols')} {sites.get('symbols_reason')}\nmangled: {mangled[:10]}\n"
           f"named: {named[:1]}\nclosure: {closure[:1]}\n" + show_rows(rep))


def check_unloaded(tap, prog, plugins, tmp):
    """A library unloaded before exit, another loaded (most likely where it was): each frame is
    named after its own library's function, in JSON and pprof (the first was named after the
    second's, which was mapped at its address at exit); where the unloaded file is gone too,
    its frames read as its name and offset."""
    for mode, remove in (("full", None), ("sample", "--remove"), ("full", "--replace")):
        label = f"unloaded library, --mode {mode}" + {None: "", "--remove": ", its file deleted",
                                                      "--replace": ", its file rebuilt in place"}[remove]
        name = f"unloaded-{mode}{remove or ''}"
        a = os.path.join(tmp, f"{name}-a.so")
        shutil.copy(plugins[0], a)
        pprof = os.path.join(tmp, f"{name}.pb.gz")
        proc, rep, truth, why = run([prog, "--unloaded", a, plugins[1]] + ([remove] if remove else []),
                                    tmp, name,
                                    extra=("--mode", mode, "--sample-rate", "1", "--pprof", pprof))
        if not tap.ok(not why, f"{label}: run completes, sites available", why):
            continue
        rows = site_rows(rep)
        inner = {num(r.get("allocated_bytes")): (r.get("stack") or [""])[0] for r in rows}
        want_a = (re.escape(f"{name}-a.so") + r"\+0x[0-9a-f]+ \(unloaded\)" if remove
                  else r"site_plugin_a \(.*sites_plugin\.c:\d+\)")
        tap.ok(re.fullmatch(want_a, inner.get(truth["a"], "")) is not None
               and re.fullmatch(r"site_plugin_b \(.*sites_plugin\.c:\d+\)", inner.get(truth["b"], "")),
               f"{label}: the 1 MiB site's frame names the unloaded library's "
               + ("file and offset" if remove else "function") + ", the 2 MiB site's the library loaded "
               f"after it (loaded at the same address: {truth['same_place']})",
               f"{inner.get(truth['a'])!r} / {inner.get(truth['b'])!r}")
        if shutil.which("go") and not remove:
            out = subprocess.run(["go", "tool", "pprof", "-raw", pprof], capture_output=True, text=True).stdout
            maps = [line for line in out.splitlines() if line.rstrip().endswith("[FN][FL][LN]") and a in line]
            tap.ok(re.search(r" M=\d+ site_plugin_a .*sites_plugin\.c:\d+", out) and len(maps) == 1,
                   f"{label}: the pprof profile names site_plugin_a, in a mapping of the unloaded file",
                   out[-1500:])


UNITS = {"B": 1, "kB": 1 << 10, "MB": 1 << 20, "GB": 1 << 30, "TB": 1 << 40, "PB": 1 << 50}
VALUE = r"(-?[0-9.]+)(B|kB|MB|GB|TB|PB)?"


def pprof_value(s):
    """('64MB') -> (bytes, rounding error bound)."""
    m = re.fullmatch(VALUE, s)
    if not m:
        return None, None
    scale = UNITS.get(m.group(2) or "B", 1)
    # pprof prints %.2f of the scaled value (trimming ".00"); plain counts are exact.
    return float(m.group(1)) * scale, 0.005 * scale if m.group(2) else 0.0


def parse_pprof_top(out):
    """(total, {function: (flat, cum)}, rounding of total) from `go tool pprof -top`."""
    total = err = None
    funcs = {}
    for line in out.splitlines():
        m = re.search(r"of " + VALUE + r" total", line)
        if m:
            total, err = pprof_value(m.group(1) + (m.group(2) or ""))
            continue
        f = line.split()
        if len(f) >= 6 and f[1].endswith("%") and f[4].endswith("%"):
            flat, _ = pprof_value(f[0])
            cum, _ = pprof_value(f[3])
            if flat is not None and cum is not None:
                funcs[" ".join(f[5:])] = (flat, cum)
    return total, funcs, err


OWN_ZLIB_SOURCE = r"""
#include <stdio.h>
#include <stdlib.h>
/* zlib's names, the program's own and exported (-rdynamic), as node's bundled zlib is. */
static int own(const char *name) { fprintf(stderr, "the program's own %s called\n", name); abort(); }
int deflateReset(void *strm) { (void)strm; return own("deflateReset"); }
int deflateResetKeep(void *strm) { (void)strm; return own("deflateResetKeep"); }
int deflateEnd(void *strm) { (void)strm; return own("deflateEnd"); }
int deflate(void *strm, int flush) { (void)strm; (void)flush; return own("deflate"); }
int main(void)
{
    void *volatile p[64];
    for (int i = 0; i < 64; i++)
        p[i] = malloc(100 + i);
    for (int i = 0; i < 64; i++)
        free(p[i]);
    puts("{}");
    return 0;
}
"""


def check_own_zlib(tap, tmp):
    """--pprof in a program that exports zlib's names of its own (node): libz's deflateInit2_
    called the program's deflateReset on libz's state, and node died of SIGSEGV at its exit."""
    desc = "pprof: a program exporting zlib's names of its own runs to its end, profile written"
    exe = build_program(tap, tmp, desc, ("cc", "gcc"), ["-O1", "-rdynamic"], "own_zlib.c",
                        OWN_ZLIB_SOURCE, 120)
    if not exe:
        return
    pb = os.path.join(tmp, "own_zlib.pb.gz")
    proc, rep, truth, why = run([exe], tmp, "own-zlib", extra=("--sample-rate", "64", "--pprof", pb))
    try:
        with gzip.open(pb) as f:
            f.read()
        gz_why = None
    except (OSError, EOFError) as e:
        gz_why = f"{pb}: {e}"
    tap.ok(not why and not gz_why, desc, why or gz_why)


def check_pprof(tap, prog, tmp):
    pb = os.path.join(tmp, "sites.pb.gz")
    proc, rep, truth, why = run([prog], tmp, "pprof", extra=("--seed", "3", "--pprof", pb))
    if not tap.ok(not why, "pprof: run with --pprof completes", why):
        return
    ok = os.path.exists(pb) and os.path.getsize(pb) > 0
    if ok:
        with open(pb, "rb") as f:
            ok = f.read(2) == b"\x1f\x8b"
    if not tap.ok(ok, "pprof: --pprof writes a gzipped file", f"{pb}: "
                  + (f"{os.path.getsize(pb)} bytes" if os.path.exists(pb) else "missing")):
        return
    try:
        with gzip.open(pb) as f:
            f.read()
        gz_ok, gz_why = True, None
    except (OSError, EOFError) as e:
        gz_ok, gz_why = False, str(e)
    tap.ok(gz_ok, "pprof: the file decompresses", gz_why)
    go = shutil.which("go")
    version = None
    if go:
        try:
            v = subprocess.run([go, "version"], capture_output=True, text=True, timeout=60)
            version = v.stdout.strip() if v.returncode == 0 else None
        except (OSError, subprocess.TimeoutExpired):
            version = None
    rows = site_rows(rep)
    for index, metric in (("alloc_space", "allocated_bytes"),
                          ("alloc_objects", "allocated_objects")):
        desc = f"pprof: go tool pprof -top -sample_index={index}"
        if not version:
            tap.skip(f"{desc}: sites and total match the JSON report", "no usable `go` on PATH")
            continue
        env = dict(os.environ, HOME=tmp, PPROF_TMPDIR=tmp)
        p = subprocess.run([go, "tool", "pprof", "-top", f"-sample_index={index}",
                            "-nodefraction=0", "-edgefraction=0", pb],
                           capture_output=True, text=True, timeout=120, env=env, cwd=tmp)
        out = p.stdout + p.stderr
        total, funcs, err = parse_pprof_top(p.stdout)
        if not tap.ok(p.returncode == 0 and total is not None,
                      f"{desc}: reads the file ({version})", out[-3000:]):
            continue
        want = sum(num(r.get(metric)) for r in rows)
        tol = 0.01 * want + (err or 0)
        tap.ok(abs(total - want) <= tol,
               f"{desc}: total = sum of the JSON rows' {metric} (within 1%)",
               f"pprof total {total:.6g}, JSON sum {want:.6g} over {len(rows)} rows\n"
               + out[-3000:])
        bad = []
        for site in truth["sites"]:
            j = site_value(rows, site, metric)
            hit = [v for name, v in funcs.items() if names(name, site)]
            if not hit:
                bad.append(f"{site}: not listed (JSON {j:.6g})")
                continue
            cum = hit[0][1]
            if abs(cum - j) > 0.01 * j + (err or 0) * 2:
                bad.append(f"{site}: pprof cum {cum:.6g}, JSON {j:.6g}")
        tap.ok(not bad, f"{desc}: every site function listed, its value = the JSON's (1%)",
               "\n".join(bad) + "\n" + out[-3000:])


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "--simulate":
        run_simulation(int(sys.argv[2]))
        return
    if len(sys.argv) != 6:
        sys.exit(__doc__)
    stats, pagemap, counts = sys.argv[1:4]
    plugins = sys.argv[4:6]
    tap = altest.Tap()
    tmp = altest.tmpdir()

    h = subprocess.run([altest.cli(), "run", "--help"], capture_output=True, text=True)
    missing = [o for o in ("--sample-rate", "--seed", "--mode", "--pprof")
               if o not in h.stdout + h.stderr]
    tap.ok(not missing, "alloclens run --help lists --sample-rate, --seed, --mode, --pprof",
           f"missing {missing}")

    label = "default rate"
    reports, truth = run_series(tap, label, stats, [], None, tmp)
    if reports:
        per_run_checks(tap, label, reports, truth, None, os.path.basename(stats) + ".c")
        stat_checks(tap, label, truth, values(reports, truth), DEFAULT_RATE)
        check_counts_mean(tap, label, reports, "site_medium_objects",
                          truth["site_medium_objects"], DEFAULT_RATE)
        check_determinism(tap, stats, tmp, reports)
        check_symbols(tap, stats, tmp, reports, label)

    label = f"rate {SMALL_RATE}"
    reports, truth = run_series(tap, label, stats, ["--no-transient"], SMALL_RATE, tmp)
    if reports:
        per_run_checks(tap, label, reports, truth, SMALL_RATE, os.path.basename(stats) + ".c")
        stat_checks(tap, label, truth, values(reports, truth), SMALL_RATE)
        check_counts_mean(tap, label, reports, "site_small_objects",
                          truth["site_small_objects"], SMALL_RATE)

    for mode in ("full", "sample"):
        label = f"churn --mode {mode}"
        reports, truth = run_series(tap, label, stats, ["--churn"], None, tmp, ("--mode", mode))
        if reports:
            per_run_checks(tap, label, reports, truth, None, os.path.basename(stats) + ".c")
    check_inherited_peak(tap, stats, tmp)

    check_pagemap(tap, pagemap, tmp)
    check_pagemap(tap, pagemap, tmp, "--after")
    check_pagemap(tap, pagemap, tmp, "--fork")
    for mode in ("full", "time", "sample"):
        check_pagemap(tap, pagemap, tmp, "--failed-realloc", mode)
    for mode in ("full", "sample"):
        check_pagemap(tap, pagemap, tmp, "--late-site", mode)
        check_pagemap(tap, pagemap, tmp, "--threaded", mode)
    check_mode_sample(tap, counts, tmp)
    check_kept_samples(tap, counts, tmp)
    check_many_sites(tap, counts, tmp)
    check_long_name(tap, counts, tmp)
    check_inlined(tap, counts, tmp)
    check_rust(tap, tmp)
    check_unloaded(tap, counts, plugins, tmp)
    check_pprof(tap, stats, tmp)
    check_own_zlib(tap, tmp)
    tap.done()


if __name__ == "__main__":
    main()
