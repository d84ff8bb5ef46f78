#!/usr/bin/env python3
"""Prerun: `alloclens prerun` finds each allocator's style, size classes and large threshold
exactly as the allocator itself defines them.

usage: test_prerun.py ALLOC_TRUTH TINY_BIBOP_SO

ALLOC_TRUTH, run under an allocator (LD_PRELOAD, or plain for glibc), prints that allocator's
truth as JSON, measured from the allocator itself (usable size of every request below the
threshold, plus its own introspection: mallctl bins for jemalloc, where a freed block goes for
tcmalloc, page occupancy for mimalloc, the mmap decision for glibc; see allocs/alloc_truth.c).
TINY_BIBOP_SO is an allocator of ours with odd classes (24, 72, 200, 1000, 2992; large from
2993), so a probe that knows the usual allocators by heart fails on it.

For every allocator `alloclens allocators` finds, and tiny_bibop given as a path:
  - the truth is complete and fast, and its style agrees with the name-based expectation
    (glibc sequential, every other allocator BiBOP);
  - `alloclens prerun -a A -o FILE` exits 0 in under 10 s, prints a summary line saying how
    sure it is, and writes a config (format: `alloclens-config 1`, `key value` lines, `#`
    comments, size_classes may repeat) whose style, large_threshold and size_classes equal the
    truth exactly, and whose allocator/identity describe the library file;
  - `alloclens run -a A --config FILE -- /bin/true` uses it: the report's allocator.style,
    large_threshold and size_classes are the truth, and nothing is probed.
Then the cache (XDG_CACHE_HOME in a temporary directory): the first run under an allocator
says once on stderr that it is probing and writes a file under $XDG_CACHE_HOME/alloclens/; the
second run says nothing; a copy of the library given as a path is probed once, and again after
its mtime changes; a broken --config gets one `FILE:LINE: ...` line and the run goes on with a
probe instead, its report right.
"""
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import altest

PROBE_LIMIT_S = 10.0     # the limit for one probe
TRUTH_LIMIT_S = 2.0      # alloc_truth must stay cheap
CMD_TIMEOUT_S = 25       # a hung probe fails its checks instead of the whole test
REQUIRED_KEYS = ("allocator", "identity", "style", "page_size", "large_threshold",
                 "size_classes", "confidence")
SINGLE_KEYS = ("allocator", "identity", "style", "page_size", "large_threshold", "confidence")
PROBING_LINE = re.compile(r"prob", re.I)
# how sure: a count of agreeing trials (4/5), a percentage, or the words themselves
SURE = re.compile(r"\d+\s*/\s*\d+|\d+(\.\d+)?\s*%|confiden|certain|\bsure\b", re.I)


def expected_style(name):
    """Name-based expectation, a cross-check of the experiment in alloc_truth."""
    if name == "glibc":
        return "sequential"
    if name in ("jemalloc", "tcmalloc", "mimalloc", "tiny_bibop"):
        return "bibop"
    return None


def run_cmd(argv, env=None, timeout=CMD_TIMEOUT_S):
    """Runs ARGV in its own process group (a timeout kills the probe children too).
    Returns (returncode or None on timeout, stdout, stderr, seconds)."""
    t0 = time.monotonic()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
        rc = proc.returncode
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        rc = None
    return (rc, out.decode(errors="replace"), err.decode(errors="replace"),
            time.monotonic() - t0)


def env_with(**changes):
    env = dict(os.environ)
    for k, v in changes.items():
        if v is None:
            env.pop(k, None)
        else:
            env[k] = v
    return env


def status(rc, err, secs):
    if rc is None:
        return f"timed out after {secs:.1f} s; stderr:\n{err[-1500:]}"
    return f"exit status {rc} after {secs:.1f} s; stderr:\n{err[-1500:]}"


def class_field(field):
    """The classes of one size_classes field: N, or the run FIRST..LAST/STEP."""
    if ".." not in field:
        return [int(field)]
    first, rest = field.split("..")
    last, step = rest.split("/")
    first, last, step = int(first), int(last), int(step)
    if step <= 0 or last <= first or (last - first) % step:
        raise ValueError(field)
    return list(range(first, last + 1, step))


def parse_config(text):
    """The config as {key: value} (size_classes: list of int); raises ValueError with LINE."""
    lines = text.splitlines()
    if not lines or lines[0].strip() != "alloclens-config 1":
        raise ValueError(f"line 1: expected 'alloclens-config 1', got {lines[:1]!r}")
    conf, classes, unknown = {}, [], []
    for no, line in enumerate(lines[1:], start=2):
        s = line.strip()
        if not s or s.startswith("#"):
            continue
        parts = s.split(None, 1)
        key, value = parts[0], (parts[1].strip() if len(parts) > 1 else "")
        if key == "size_classes":
            try:
                classes += [c for field in value.split() for c in class_field(field)]
            except ValueError:
                raise ValueError(f"line {no}: size_classes: not classes: {value!r}")
            conf["size_classes"] = classes
        elif key in SINGLE_KEYS:
            if key in conf:
                raise ValueError(f"line {no}: {key} given twice")
            conf[key] = value
        else:
            unknown.append(f"line {no}: {key}")
    missing = [k for k in REQUIRED_KEYS if k not in conf]
    if missing:
        raise ValueError(f"missing keys: {', '.join(missing)}")
    for k in ("page_size", "large_threshold"):
        try:
            conf[k] = int(conf[k])
        except ValueError:
            raise ValueError(f"{k}: not an integer: {conf[k]!r}")
    conf["_unknown"] = unknown
    return conf


def class_diff(got, want, limit=8):
    """A readable account of how two class lists differ (empty when equal)."""
    if got == want:
        return ""
    lines = [f"got {len(got)} classes, truth has {len(want)}"]
    shown = 0
    for i in range(max(len(got), len(want))):
        g = got[i] if i < len(got) else None
        w = want[i] if i < len(want) else None
        if g != w:
            lines.append(f"  [{i}] got {g}, truth {w}")
            shown += 1
            if shown >= limit:
                break
    extra = sorted(set(got) - set(want))
    missing = sorted(set(want) - set(got))
    if extra:
        lines.append(f"  not classes: {extra[:10]}{' ...' if len(extra) > 10 else ''}")
    if missing:
        lines.append(f"  missed: {missing[:10]}{' ...' if len(missing) > 10 else ''}")
    return "\n".join(lines)


def summarize(truth):
    c = truth["size_classes"]
    return (f"{truth['style']}, large from {truth['large_threshold']}, {len(c)} classes "
            f"{c[:4]} ... {c[-3:]}")


def get_truth(tap, label, truth_prog, path, preload):
    env = env_with(LD_PRELOAD=path if preload else None)
    rc, out, err, secs = run_cmd([truth_prog], env=env, timeout=60)
    try:
        truth = json.loads(out)
    except ValueError:
        truth = None
    if not tap.ok(rc == 0 and truth is not None and not truth.get("errors"),
                  f"{label}: alloc_truth measures the allocator",
                  (truth or {}).get("errors") or status(rc, err, secs) + f"\nstdout: {out[:500]}"):
        return None
    tap.ok(secs < TRUTH_LIMIT_S, f"{label}: alloc_truth takes under {TRUTH_LIMIT_S:g} s",
           f"{secs:.2f} s")
    tap.diag(f"{label} truth: {summarize(truth)}")
    tap.diag(f"{label} derivation: {truth['derivation']}")
    for c in truth.get("crosschecks", []):
        tap.diag(f"{label} cross-check ok: {c}")
    want = expected_style(label)
    if want:
        tap.ok(truth["style"] == want, f"{label}: measured style agrees with the name ({want})",
               f"experiment says {truth['style']}: {truth['style_experiment']}")
    return truth


def check_report(tap, label, report, truth, what):
    a = (report or {}).get("allocator") or {}
    tap.ok(a.get("style") == truth["style"], f"{label}: {what} report allocator.style",
           f"report {a.get('style')!r}, truth {truth['style']!r}")
    tap.ok(a.get("large_threshold") == truth["large_threshold"],
           f"{label}: {what} report allocator.large_threshold",
           f"report {a.get('large_threshold')!r}, truth {truth['large_threshold']}")
    got = a.get("size_classes")
    tap.ok(got == truth["size_classes"], f"{label}: {what} report allocator.size_classes",
           class_diff(got if isinstance(got, list) else [], truth["size_classes"]))


def load_report(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def check_prerun(tap, label, alloc, path, truth, tmp):
    """prerun -a ALLOC -o FILE against the truth; then run --config FILE."""
    conf_path = os.path.join(tmp, f"{label}.conf")
    env = env_with(XDG_CACHE_HOME=os.path.join(tmp, f"cache-{label}"))
    rc, out, err, secs = run_cmd([altest.cli(), "prerun", "-a", alloc, "-o", conf_path],
                                 env=env)
    if not tap.ok(rc == 0 and os.path.exists(conf_path),
                  f"{label}: prerun exits 0 and writes the config", status(rc, err, secs)):
        tap.ok(False, f"{label}: prerun checks", "not run: no config")
        return
    tap.diag(f"{label} prerun output: {(out + err).strip()}")
    tap.ok(secs < PROBE_LIMIT_S, f"{label}: prerun takes under {PROBE_LIMIT_S:g} s",
           f"{secs:.2f} s")
    with open(conf_path) as f:
        text = f.read()
    try:
        conf = parse_config(text)
    except ValueError as e:
        tap.ok(False, f"{label}: config parses", f"{e}\n{text[:2000]}")
        return
    tap.ok(True, f"{label}: config parses")
    if conf["_unknown"]:
        tap.diag(f"{label}: keys this test does not know: {conf['_unknown']}")

    # summary: one line naming what it found and how sure it is
    lines = (out + "\n" + err).splitlines()
    summary = [ln for ln in lines if conf["style"] in ln and SURE.search(ln)]
    tap.ok(bool(summary), f"{label}: prerun prints a summary line with how sure it is",
           "output:\n" + (out + err)[-1500:])
    tap.ok(bool(conf["confidence"].strip()), f"{label}: config says how sure the probe is")

    # the library it describes, and that file's identity
    try:
        same = os.path.samefile(conf["allocator"], path)
    except OSError:
        same = False
    tap.ok(same, f"{label}: config 'allocator' is the library probed",
           f"{conf['allocator']!r} vs {path!r}")
    try:
        st = os.stat(conf["allocator"])
        ident = [int(v) for v in conf["identity"].split()]
        want = [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns]
        tap.ok(ident == want, f"{label}: config identity is the file's (dev ino size mtime_ns)",
               f"config {ident}, file {want}")
    except (OSError, ValueError) as e:
        tap.ok(False, f"{label}: config identity is the file's (dev ino size mtime_ns)", str(e))

    tap.ok(conf["style"] == truth["style"], f"{label}: prerun style",
           f"prerun {conf['style']!r}, truth {truth['style']!r}")
    tap.ok(conf["large_threshold"] == truth["large_threshold"], f"{label}: prerun large_threshold",
           f"prerun {conf['large_threshold']}, truth {truth['large_threshold']}")
    tap.ok(conf["size_classes"] == truth["size_classes"], f"{label}: prerun size_classes",
           class_diff(conf["size_classes"], truth["size_classes"]))
    ps = conf["page_size"]
    tap.ok(ps >= 4096 and ps & (ps - 1) == 0, f"{label}: prerun page_size is a power of two",
           str(ps))
    if ps != truth["page_size"]:
        tap.diag(f"{label}: prerun page_size {ps}, system page {truth['page_size']}")

    # run with that config
    out_json = os.path.join(tmp, f"{label}-report.json")
    rc, out, err, secs = run_cmd([altest.cli(), "run", "-a", alloc, "--config", conf_path,
                                  "-o", out_json, "--text", os.path.join(tmp, f"{label}.txt"),
                                  "--", "/bin/true"], env=env)
    report = load_report(out_json)
    if not tap.ok(rc == 0 and report is not None,
                  f"{label}: run --config exits 0 and writes a report", status(rc, err, secs)):
        return
    tap.ok(not [ln for ln in err.splitlines() if PROBING_LINE.search(ln)],
           f"{label}: run --config uses the config (no probe)", err[-1500:])
    check_report(tap, label, report, truth, "run --config")


def probing_lines(err):
    return [ln for ln in err.splitlines() if PROBING_LINE.search(ln)]


def cache_files(d):
    found = {}
    for root, _, files in os.walk(d):
        for f in files:
            p = os.path.join(root, f)
            found[p] = os.stat(p).st_mtime_ns
    return found


def check_cache(tap, label, alloc, path, truth, tmp):
    cache = os.path.join(tmp, "cache")
    env = env_with(XDG_CACHE_HOME=cache)
    cdir = os.path.join(cache, "alloclens")
    n = [0]

    def run(a, extra=()):
        n[0] += 1
        rep = os.path.join(tmp, f"cache-{n[0]}.json")
        rc, out, err, secs = run_cmd([altest.cli(), "run", "-a", a, *extra, "-o", rep,
                                      "--text", os.path.join(tmp, f"cache-{n[0]}.txt"),
                                      "--", "/bin/true"], env=env)
        return rc, err, secs, load_report(rep)

    def direct(cmd=("/bin/true",)):
        """CMD with the library preloaded directly, no CLI (the cache read, never written): its
        report's allocator config as well."""
        n[0] += 1
        rep = os.path.join(tmp, f"cache-{n[0]}.json")
        rc, out, err, secs = run_cmd(list(cmd), env=dict(
            env, LD_PRELOAD=f"{altest.so()}:{path}", ALLOCLENS_OUTPUT=rep, ALLOCLENS_TEXT="off"))
        report = load_report(rep)
        return rc, err, secs, report, ((report or {}).get("allocator") or {}).get("config") or {}

    # used directly before any run: no config, the report says none is cached
    rc, err, secs, _, cfg = direct()
    tap.ok(rc == 0 and not err and cfg.get("available") is False
           and "none cached" in cfg.get("reason", "") and not cache_files(cdir),
           f"cache: the library used directly under {label} before any run has no config, says "
           "none is cached, writes none", f"{cfg}\n{status(rc, err, secs)}")

    # first run: probes once, says so on one line, leaves a file in the cache
    rc, err, secs, report = run(alloc)
    first_ok = tap.ok(rc == 0 and report is not None, f"cache: first run under {label} works",
                      status(rc, err, secs))
    tap.ok(len(probing_lines(err)) == 1, "cache: first run prints one line saying it probes",
           err[-1500:] or "(stderr empty)")
    files1 = cache_files(cdir)
    tap.ok(bool(files1), f"cache: first run writes a file under {cdir}", str(files1))
    if first_ok:
        check_report(tap, label, report, truth, "first cached run")
    if not first_ok:
        tap.ok(False, "cache: later runs", "not run: the first probing run failed")
        return

    # second run: from the cache, silently
    rc, err, secs, report = run(alloc)
    tap.ok(rc == 0 and report is not None, "cache: second run works", status(rc, err, secs))
    tap.ok(not probing_lines(err), "cache: second run does not probe", err[-1500:])
    tap.ok(cache_files(cdir) == files1, "cache: second run leaves the cache as it was",
           f"{files1} -> {cache_files(cdir)}")

    # the library used directly: the cached config, as the runs had it
    rc, err, secs, report, cfg = direct()
    tap.ok(rc == 0 and not err and cfg.get("available") is True and cfg.get("path") in files1
           and cache_files(cdir) == files1,
           f"cache: the library used directly under {label} reads the cached config",
           f"{cfg}\n{status(rc, err, secs)}")
    if report is not None:
        check_report(tap, label, report, truth, "direct (LD_PRELOAD) run")
    # bash answers getenv itself, before main from a table it has not filled yet
    bash = shutil.which("bash")
    if bash:
        rc, err, secs, _, cfg = direct((bash, "-c", "true"))
        tap.ok(rc == 0 and not err and cfg.get("path") in files1,
               f"cache: the library used directly in bash under {label} reads the cached config",
               f"{cfg}\n{status(rc, err, secs)}")
    else:
        tap.skip("cache: the library used directly in bash", "bash not installed")

    # a copy of the library, by path: probed once; touched, probed again
    copy_dir = os.path.join(tmp, "copy")
    os.makedirs(copy_dir, exist_ok=True)
    copy = os.path.join(copy_dir, os.path.basename(os.path.realpath(path)))
    shutil.copy2(os.path.realpath(path), copy)
    rc, err, secs, report = run(copy)
    tap.ok(rc == 0 and len(probing_lines(err)) == 1, "cache: a copy given as a path is probed",
           status(rc, err, secs))
    rc, err, secs, report = run(copy)
    tap.ok(rc == 0 and not probing_lines(err), "cache: the copy's second run does not probe",
           status(rc, err, secs))
    st = os.stat(copy)
    os.utime(copy, ns=(st.st_atime_ns, st.st_mtime_ns + 2_000_000_000))
    before = cache_files(cdir)
    rc, err, secs, report = run(copy)
    tap.ok(rc == 0 and len(probing_lines(err)) == 1,
           "cache: touching the copy (new mtime) forces a fresh probe", status(rc, err, secs))
    tap.ok(cache_files(cdir) != before, "cache: the fresh probe updates the cache",
           f"{before} -> {cache_files(cdir)}")
    if report is not None:
        check_report(tap, label, report, truth, "re-probed copy")

    # a broken config: FILE:LINE: on one line, the run goes on with a probe
    bad = os.path.join(tmp, "broken.conf")
    with open(bad, "w") as f:
        f.write("alloclens-config 1\n# a comment\nstyle bibop\nlarge_threshold twelve\n")
    env["XDG_CACHE_HOME"] = os.path.join(tmp, "cache-broken")
    rc, err, secs, report = run(alloc, extra=("--config", bad))
    tap.ok(rc == 0 and report is not None, "broken config: the run still works",
           status(rc, err, secs))
    where = re.compile(r"(^|[\s'\"`])(\S*/)?broken\.conf:4: \S")
    hits = [ln for ln in err.splitlines() if where.search(ln)]
    tap.ok(len(hits) == 1, "broken config: one line 'FILE:4: ...' names the bad line",
           err[-1500:] or "(stderr empty)")
    tap.ok(len([ln for ln in err.splitlines() if "broken.conf" in ln]) == 1,
           "broken config: the complaint takes one line", err[-1500:])
    tap.ok(len(probing_lines(err)) >= 1, "broken config: the allocator is probed instead",
           err[-1500:])
    if report is not None:
        check_report(tap, label, report, truth, "broken-config run")


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    truth_prog, tiny = sys.argv[1], sys.argv[2]
    tap = altest.Tap()
    tmp = altest.tmpdir()

    found = altest.allocators()
    targets = [(name, name, path, name != "glibc") for name, path in found.items()]
    targets.append(("tiny_bibop", tiny, tiny, True))   # given as a path
    tap.diag("allocators: " + ", ".join(f"{n} ({p})" for n, _, p, _ in targets))

    truths = {}
    for label, alloc, path, preload in targets:
        truth = get_truth(tap, label, truth_prog, path, preload)
        if truth is not None:
            truths[label] = truth
            check_prerun(tap, label, alloc, path, truth, tmp)

    # the cache, under tcmalloc as the issue asks (another allocator where it is missing)
    for label, alloc, path, _ in ([t for t in targets if t[0] == "tcmalloc"]
                                  + [t for t in targets if t[0] == "tiny_bibop"])[:1]:
        if label in truths:
            check_cache(tap, label, alloc, path, truths[label], tmp)
        else:
            tap.ok(False, f"cache checks under {label}", "not run: no truth")

    tap.done()


if __name__ == "__main__":
    main()
