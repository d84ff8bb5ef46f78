#!/usr/bin/env python3
"""CPython's own regression tests for threads, fork, signals, descriptors, mmap, the garbage
collector and exit, run by the interpreter under one allocator: plain (the allocator preloaded
alone), then under `alloclens run -a ALLOC` in full and in sample mode. Every test case must end
the same way profiled as plain (passed, failed, skipped), and the runner's exit status too: a
test suite written by others, for the program's own behaviour, is the check here, not ours.

Usage: test_cpython_suite.py ALLOC   (ALLOCLENS_CLI in the environment)

The modules are the quick ones among those that exercise what an interposer can break. One
case is known to end otherwise, and only in full mode: test_subprocess's
test_pass_fds_redirected lists a child's open descriptors and finds the timed modes' event
counters (README, known problems); it is told, not counted (sample mode, which keeps no
descriptor, must pass it as plain does). A case that ends differently is run again, alone,
both ways, twice: timing-sensitive cases on a loaded machine are then told apart from a real
difference, which repeats.
"""
import os
import subprocess
import sys
import xml.etree.ElementTree as ET

import altest

MODULES = ["test_threading", "test_fork1", "test_threadsignals", "test_thread", "test_os",
           "test_posix", "test_select", "test_mmap", "test_gc", "test_atexit", "test_pty",
           "test_resource", "test_tracemalloc", "test_sys", "test_zlib", "test_subprocess"]
MODES = ("full", "sample")
KNOWN = {("full", "test.test_subprocess.POSIXProcessTestCase.test_pass_fds_redirected"):
         "the child finds the event counters' descriptors (README, known problems)"}
TIMEOUT = 600          # seconds for one run of the modules; regrtest's own per-module limit below
RERUNS = 2

tap = altest.Tap()


def python():
    return "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else "python3"


def have_suite():
    r = subprocess.run([python(), "-c", "import test.libregrtest, test.test_fork1"],
                       capture_output=True)
    return r.returncode == 0


def outcomes(xml_path):
    """{case id: 'passed' | 'failed' | 'skipped'} from regrtest's JUnit file, or None."""
    try:
        root = ET.parse(xml_path).getroot()
    except (OSError, ET.ParseError):
        return None
    out = {}
    for tc in root.iter("testcase"):
        state = "passed"
        for child in tc:
            if child.tag in ("failure", "error"):
                state = "failed"
            elif child.tag == "skipped" and state == "passed":
                state = "skipped"
        # regrtest leaves classname empty and names the case in full: test.MODULE.CLASS.METHOD
        out[".".join(x for x in (tc.get("classname"), tc.get("name")) if x)] = state
    return out


def regrtest(alloc, path, mode, wd, name, modules, match=None):
    """Runs the modules plain (MODE None, ALLOC's library preloaded) or profiled; returns
    (exit status, outcomes or None, runner's output tail)."""
    xml = os.path.join(wd, f"{name}.xml")
    # Several modules at once where there are several: most of their time is waits (test_subprocess
    # sleeps, joins, timeouts), not CPU.
    jobs = ["-j", "4"] if len(modules) > 1 else []
    argv = [python(), "-m", "test", *jobs, "--timeout", str(TIMEOUT // 2), "--junit-xml", xml, *modules]
    if match:
        argv[3:3] = [a for case in match for a in ("-m", case)]
    env = altest.plain_env(TMPDIR=wd, LC_ALL="C.UTF-8")
    if mode is None:
        env["LD_PRELOAD"] = path
    else:
        argv = [altest.cli(), "run", "-a", alloc, "--mode", mode,
                "-o", os.path.join(wd, f"{name}.json"), "--text", os.path.join(wd, f"{name}.txt"),
                "--", *argv]
    try:
        r = subprocess.run(argv, cwd=wd, env=env, stdin=subprocess.DEVNULL,
                           capture_output=True, timeout=TIMEOUT)
    except subprocess.TimeoutExpired as e:
        return None, None, f"no end after {TIMEOUT} s\n" + (e.stdout or b"").decode(errors="replace")[-2000:]
    text = (r.stdout + r.stderr).decode(errors="replace")
    return r.returncode, outcomes(xml), text[-3000:]


def short(case):
    return case.rsplit(".", 2)[-2] + "." + case.rsplit(".", 1)[-1]


def settle(alloc, path, mode, wd, diffs, plain, prof):
    """The cases of DIFFS that still end differently when each is run again alone, plain and
    profiled, RERUNS times: those whose profiled ending never matched the plain one."""
    lasting = []
    for case in diffs:
        module = case.split(".")[1] if case.startswith("test.") else None
        name = case.rsplit(".", 1)[-1]
        if module not in MODULES:
            lasting.append(case)
            continue
        agreed = False
        for i in range(RERUNS):
            _, p, _ = regrtest(alloc, path, None, wd, f"again-plain-{mode}-{i}", [module], [name])
            _, q, _ = regrtest(alloc, path, mode, wd, f"again-{mode}-{i}", [module], [name])
            if p is not None and q is not None and p.get(case) == q.get(case) and q.get(case):
                agreed = True
                break
        if agreed:
            tap.diag(f"{alloc} {mode}: {short(case)} ended {prof.get(case)} (plain: {plain.get(case)}) "
                     "and the same both ways when run again: timing, not alloclens")
        else:
            lasting.append(case)
    return lasting


def main():
    alloc = sys.argv[1]
    if not have_suite():
        tap.skip(f"CPython's regression tests under {alloc}",
                 "CPython's test package is not installed (Debian: libpython3.11-testsuite)")
        tap.done()
    found = altest.allocators()
    if alloc not in found:
        tap.skip(f"CPython's regression tests under {alloc}", f"{alloc} is not installed")
        tap.done()
    path = found[alloc]
    altest.prime(alloc)
    wd = altest.tmpdir()

    status, plain, text = regrtest(alloc, path, None, wd, "plain", MODULES)
    if not tap.ok(plain, f"{alloc} plain: regrtest ran {len(MODULES)} modules and wrote its results",
                  text):
        tap.done()
    passed = sum(1 for s in plain.values() if s == "passed")
    tap.diag(f"{alloc} plain: {len(plain)} cases, {passed} passed, exit status {status}")

    for mode in MODES:
        pstatus, prof, ptext = regrtest(alloc, path, mode, wd, mode, MODULES)
        if not tap.ok(prof is not None, f"{alloc} {mode}: regrtest ran under alloclens and wrote its results",
                      ptext):
            continue
        diffs = sorted(c for c in set(plain) | set(prof) if plain.get(c) != prof.get(c))
        for c in [c for c in diffs if (mode, c) in KNOWN]:
            tap.diag(f"{alloc} {mode}: {short(c)} ended {prof.get(c)} (plain: {plain.get(c)}), "
                     f"as known: {KNOWN[(mode, c)]}")
        lasting = settle(alloc, path, mode, wd, [c for c in diffs if (mode, c) not in KNOWN],
                         plain, prof)
        tap.ok(not lasting, f"{alloc} {mode}: all {len(plain)} test cases end as they do plain",
               "\n".join(f"{short(c)}: plain {plain.get(c)}, profiled {prof.get(c)}" for c in lasting)
               + "\n" + ptext)
        tap.ok(pstatus == status or (diffs and not lasting),
               f"{alloc} {mode}: the runner's exit status is the plain run's ({status})",
               f"profiled: {pstatus}")
        tap.ok(os.path.exists(os.path.join(wd, f"{mode}.json")),
               f"{alloc} {mode}: the interpreter's report was written")
    tap.done()


if __name__ == "__main__":
    main()
