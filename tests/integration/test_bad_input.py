#!/usr/bin/env python3
"""Bad input gets one clear line on stderr naming what is wrong; nothing crashes, nothing is
silently lost.

Direct use (LD_PRELOAD=liballoclens.so): a malformed ALLOCLENS_* variable or an unwritable
report path costs one line on stderr, and the program's stdout and exit status are those of the
plain run; the other reports are still written. The CLI refuses a bad option, an unwritable
report path or an unknown allocator with exit status 2 and one line, before running anything.

A statically linked program, or a set-user-ID one owned by another user (LD_PRELOAD reaches
neither), runs unchanged, and one line says that it writes no report; one that defines malloc
itself runs unchanged, and one line says nothing can stand in front of its allocator; so does a
Go program, with one line saying its end writes no report.

usage: test_bad_input.py LIBALLOCLENS.so HOST_LEAF HOST_FORK NOT_AN_ALLOCATOR.so HOST_EXEC
                         HOST_OWN_MALLOC [HOST_STATIC]
"""
import json
import os
import resource
import pwd
import shutil
import stat
import subprocess
import sys
import threading

import altest

SO = LEAF = FORK = NOT_ALLOC = EXEC = OWN_MALLOC = STATIC = None
TIMEOUT = 15
HANGS = 0
CACHE = None


def clean_env(**extra):
    # the probe cache of this test alone
    return altest.plain_env(**{"XDG_CACHE_HOME": CACHE, **extra})


def run(argv, env=None, cwd=None):
    """The finished process, or None when it hung (after 3 hangs nothing more is run: every
    later check fails at once rather than the whole test running into meson's timeout)."""
    global HANGS
    if HANGS >= 3:
        return None
    try:
        return subprocess.run(argv, env=env if env is not None else clean_env(),
                              capture_output=True, text=True, timeout=TIMEOUT, cwd=cwd)
    except subprocess.TimeoutExpired:
        HANGS += 1
        return None


def lines(text):
    return [l for l in text.splitlines() if l.strip()]


def show(p):
    if p is None:
        return f"hung for {TIMEOUT} s"
    return f"exit status {p.returncode}\nstdout:\n{p.stdout[-1500:]}\nstderr:\n{p.stderr[-1500:]}"


def one_line(tap, desc, p, *must, status=None):
    """p finished with `status` (when given), and stderr is exactly one line holding every
    string in `must`."""
    if not tap.ok(p is not None and p.returncode >= 0, f"{desc}: finishes, no crash", show(p)):
        return False
    ok = True
    if status is not None:
        ok &= tap.ok(p.returncode == status, f"{desc}: exit status {status}", show(p))
    err = lines(p.stderr)
    ok &= tap.ok(len(err) == 1, f"{desc}: exactly one line on stderr", show(p))
    if must:
        missing = [m for m in must if m not in p.stderr]
        ok &= tap.ok(not missing, f"{desc}: the line names {', '.join(repr(m) for m in must)}",
                     f"missing {missing}\n{show(p)}")
    return ok


def load(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def direct(tmp, prog_args, **env):
    """Runs a host program plain and with LD_PRELOAD=liballoclens.so plus `env`."""
    plain = run(prog_args, env=clean_env(), cwd=tmp)
    prof = run(prog_args, env=clean_env(LD_PRELOAD=SO, **env), cwd=tmp)
    return plain, prof


def same_as_plain(tap, desc, plain, prof):
    if prof is None or plain is None:
        tap.ok(False, f"{desc}: finishes", f"plain: {show(plain)}\nalloclens: {show(prof)}")
        return
    tap.ok(prof.stdout == plain.stdout, f"{desc}: stdout unchanged",
           f"plain:\n{plain.stdout}\nalloclens:\n{prof.stdout}")
    tap.ok(prof.returncode == plain.returncode, f"{desc}: exit status unchanged",
           f"plain {plain.returncode}, alloclens {prof.returncode}\n{prof.stderr[-1500:]}")


def bad_variable(tap, var, value, *must, status="2"):
    """VAR=VALUE in direct use: host_leaf (exiting STATUS) runs as plain, one line names VAR and
    MUST. Returns the description and the JSON report (or None)."""
    tmp = altest.tmpdir()
    desc = f"{var}={value}" if value.isprintable() else f"{var}={value!r}"  # one TAP line
    out = os.path.join(tmp, "r.json")
    plain, prof = direct(tmp, [LEAF, status, "100"], ALLOCLENS_OUTPUT=out, ALLOCLENS_TEXT="off",
                         **{var: value})
    same_as_plain(tap, desc, plain, prof)
    one_line(tap, desc, prof, var, *must)
    return desc, load(out)


def test_bad_variables(tap):
    """(a) malformed numeric variables: the program runs as it would, one line, and the
    reports are still written with the threshold a run without the variable has (the
    default, or the cached config's)."""
    tmp = altest.tmpdir()
    out = os.path.join(tmp, "r.json")
    run([LEAF, "3", "200"], env=clean_env(LD_PRELOAD=SO, ALLOCLENS_OUTPUT=out, ALLOCLENS_TEXT="off"), cwd=tmp)
    alloc = (load(out) or {}).get("allocator", {})
    want = baseline = (alloc.get("large_threshold"), alloc.get("large_threshold_source"))
    tap.ok(want[1] in ("default", "config") and (want[1] == "config" or want[0] == 131072),
           "no ALLOCLENS_LARGE_THRESHOLD: the default 131072 or the cached config's threshold", alloc)
    for value in ["abc", "-5", "99999999999999999999", "0", "12Q", "1T", "0x10"]:
        tmp = altest.tmpdir()
        out, txt = os.path.join(tmp, "r.json"), os.path.join(tmp, "r.txt")
        desc = f"ALLOCLENS_LARGE_THRESHOLD='{value}'"
        plain, prof = direct(tmp, [LEAF, "3", "200"], ALLOCLENS_OUTPUT=out, ALLOCLENS_TEXT=txt,
                             ALLOCLENS_LARGE_THRESHOLD=value)
        same_as_plain(tap, desc, plain, prof)
        one_line(tap, desc, prof, "ALLOCLENS_LARGE_THRESHOLD", value)
        r = load(out)
        got = (r or {}).get("allocator", {})
        tap.ok((got.get("large_threshold"), got.get("large_threshold_source")) == want,
               f"{desc}: JSON report written with the threshold of a run without it, {want[0]}",
               f"report: {got.get('large_threshold')} ({got.get('large_threshold_source')})")
        tap.ok(os.path.isfile(txt) and os.path.getsize(txt) > 0,
               f"{desc}: text report written", f"{txt} missing or empty")

    for value, want in [("64k", 65536), ("1M", 1 << 20), ("2G", 2 << 30), ("4096", 4096)]:
        tmp = altest.tmpdir()
        out = os.path.join(tmp, "r.json")
        desc = f"ALLOCLENS_LARGE_THRESHOLD='{value}' (valid)"
        plain, prof = direct(tmp, [LEAF, "0", "50"], ALLOCLENS_OUTPUT=out, ALLOCLENS_TEXT="off",
                             ALLOCLENS_LARGE_THRESHOLD=value)
        same_as_plain(tap, desc, plain, prof)
        tap.ok(prof is not None and prof.stderr == "", f"{desc}: nothing on stderr", show(prof))
        r = load(out)
        tap.ok(r is not None and r.get("allocator", {}).get("large_threshold") == want,
               f"{desc}: report's large_threshold is {want}",
               f"report: {None if r is None else r.get('allocator')}")

    # Set but empty: the default, as if unset, and nothing to say.
    tmp = altest.tmpdir()
    out = os.path.join(tmp, "r.json")
    desc = "ALLOCLENS_LARGE_THRESHOLD='' (empty: the default)"
    plain, prof = direct(tmp, [LEAF, "3", "200"], ALLOCLENS_OUTPUT=out, ALLOCLENS_TEXT="off",
                         ALLOCLENS_LARGE_THRESHOLD="")
    same_as_plain(tap, desc, plain, prof)
    got = (load(out) or {}).get("allocator", {})
    tap.ok(prof is not None and prof.stderr == ""
           and (got.get("large_threshold"), got.get("large_threshold_source")) == baseline,
           f"{desc}: nothing on stderr, the threshold of a run without it",
           f"report: {got.get('large_threshold')} ({got.get('large_threshold_source')})\n{show(prof)}")
    tmp = altest.tmpdir()
    desc = "ALLOCLENS_TEXT='' (empty: the default, stderr)"
    plain, prof = direct(tmp, [LEAF, "0", "100"], ALLOCLENS_TEXT="")
    same_as_plain(tap, desc, plain, prof)
    tap.ok(prof is not None and "== alloclens report" in prof.stderr,
           f"{desc}: the text report on stderr", show(prof))

    # The JSON and the text asked into one file: one line, the JSON kept, the text on stderr.
    tmp = altest.tmpdir()
    out = os.path.join(tmp, "same.json")
    desc = "ALLOCLENS_OUTPUT and ALLOCLENS_TEXT the same file"
    plain, prof = direct(tmp, [LEAF, "0", "100"], ALLOCLENS_OUTPUT=out, ALLOCLENS_TEXT=out)
    same_as_plain(tap, desc, plain, prof)
    said = [l for l in lines(prof.stderr if prof else "") if l.startswith("alloclens[")]
    tap.ok(len(said) == 1 and "ALLOCLENS_TEXT" in said[0] and "ALLOCLENS_OUTPUT" in said[0]
           and load(out) is not None and "== alloclens report" in prof.stderr,
           f"{desc}: one line naming both, the JSON report intact, the text on stderr", show(prof))

    # Every process of a run reads the same settings: only its main process tells what is
    # wrong with them, not each program a shell starts.
    for var, value in (("ALLOCLENS_SAMPLE_RATE", "junk"), ("ALLOCLENS_EVENTS", "no-such-event")):
        tmp = altest.tmpdir()
        desc = f"{var}={value}, a shell running three programs"
        argv = ["sh", "-c", f"{LEAF} 0 50; {LEAF} 0 50; {LEAF} 3 50"]
        plain, prof = direct(tmp, argv, ALLOCLENS_OUTPUT=os.path.join(tmp, "r.json"),
                             ALLOCLENS_TEXT="off", **{var: value})
        same_as_plain(tap, desc, plain, prof)
        one_line(tap, desc, prof, var, value)

    # A forking program: the children inherit the settings, not a second warning.
    tmp = altest.tmpdir()
    desc = "ALLOCLENS_LARGE_THRESHOLD=abc, program forks"
    plain, prof = direct(tmp, [FORK, "nested"], ALLOCLENS_OUTPUT=os.path.join(tmp, "r.json"),
                         ALLOCLENS_TEXT="off", ALLOCLENS_LARGE_THRESHOLD="abc")
    same_as_plain(tap, desc, plain, prof)
    one_line(tap, desc, prof, "ALLOCLENS_LARGE_THRESHOLD", "abc")

    bad_variable(tap, "ALLOCLENS_MAIN_PID", "xx", "xx", status="4")

    # Event encodings that are not what `alloclens run` writes: one line, and the events
    # resolved as without them.
    desc, r = bad_variable(tap, "ALLOCLENS_EVENT_ATTRS", "garbage=page-faults")
    tap.ok(r is not None and r.get("counters", {}).get("available"),
           f"{desc}: report written, events counted", f"report counters: {None if r is None else r.get('counters')}")

    # A mode that does not exist: one line, and the default mode's report.
    desc, r = bad_variable(tap, "ALLOCLENS_MODE", "fast", "fast")
    tap.ok(r is not None and r.get("mode") == "full", f"{desc}: report written in mode full",
           f"report mode: {None if r is None else r.get('mode')}")

    # Inherited by `alloclens run` from the user's environment.
    tmp = altest.tmpdir()
    desc = "alloclens run with ALLOCLENS_LARGE_THRESHOLD=abc in the environment"
    prof = run([altest.cli(), "run", "--text", "off", "-o", os.path.join(tmp, "r.json"), "--",
                LEAF, "5", "100"], env=clean_env(ALLOCLENS_LARGE_THRESHOLD="abc"))
    plain = run([LEAF, "5", "100"])
    same_as_plain(tap, desc, plain, prof)
    one_line(tap, desc, prof, "ALLOCLENS_LARGE_THRESHOLD", "abc")
    tap.ok(load(os.path.join(tmp, "r.json")) is not None, f"{desc}: report written")

    # Good settings, nothing to say: stderr stays the program's own.
    tmp = altest.tmpdir()
    desc = "ALLOCLENS_TEXT=off, no output"
    plain, prof = direct(tmp, [LEAF, "0", "100"], ALLOCLENS_TEXT="off")
    same_as_plain(tap, desc, plain, prof)
    tap.ok(prof is not None and prof.stderr == "", f"{desc}: nothing on stderr", show(prof))

    # An empty path is the default's "not written", not the current directory.
    tmp = altest.tmpdir()
    desc = "alloclens run --pprof '' -o ''"
    prof = run([altest.cli(), "run", "--text", "off", "--pprof", "", "-o", "", "--", LEAF, "0", "100"],
               cwd=tmp)
    plain = run([LEAF, "0", "100"])
    same_as_plain(tap, desc, plain, prof)
    tap.ok(prof is not None and prof.stderr == "" and os.listdir(tmp) == [],
           f"{desc}: nothing on stderr, nothing written", show(prof))


def test_unwritable_paths(tap):
    """(b) report paths that cannot be written."""
    tmp = altest.tmpdir()
    marker = os.path.join(tmp, "ran")
    touch = ["sh", "-c", f"touch {marker}"]
    for label, opt in [("-o", "-o"), ("--text", "--text"), ("--pprof", "--pprof")]:
        for path in ["/nonexistent/dir/r.json", tmp]:
            what = "a directory" if path == tmp else "in a missing directory"
            desc = f"alloclens run {label} {what}"
            p = run([altest.cli(), "run", opt, path, "--", *touch])
            one_line(tap, desc, p, path, status=2)
            tap.ok(not os.path.exists(marker), f"{desc}: the command is not run", show(p))
    # Two reports into one file: one would overwrite the other.
    same = os.path.join(tmp, "same.out")
    desc = "alloclens run -o and --text the same file"
    p = run([altest.cli(), "run", "-o", same, "--text", same, "--", *touch])
    one_line(tap, desc, p, "--output", "--text", same, status=2)
    tap.ok(not os.path.exists(marker), f"{desc}: the command is not run", show(p))

    for path, what in [("/nonexistent/dir/r.json", "in a missing directory"),
                       (tmp, "a directory")]:
        sub = altest.tmpdir()
        txt = os.path.join(sub, "r.txt")
        desc = f"direct ALLOCLENS_OUTPUT {what}"
        plain, prof = direct(sub, [LEAF, "3", "300"], ALLOCLENS_OUTPUT=path, ALLOCLENS_TEXT=txt)
        same_as_plain(tap, desc, plain, prof)
        one_line(tap, desc, prof, path)
        tap.ok(os.path.isfile(txt) and os.path.getsize(txt) > 0,
               f"{desc}: the text report is still written", f"{txt} missing or empty")

        sub = altest.tmpdir()
        out = os.path.join(sub, "r.json")
        desc = f"direct ALLOCLENS_TEXT {what}"
        plain, prof = direct(sub, [LEAF, "3", "300"], ALLOCLENS_OUTPUT=out, ALLOCLENS_TEXT=path)
        same_as_plain(tap, desc, plain, prof)
        one_line(tap, desc, prof, path)
        tap.ok(load(out) is not None, f"{desc}: the JSON report is still written")

    # A program that puts a file of its own on fd 2 gets nothing of ours in it: not the line
    # saying the report cannot be written, nor the text report meant for stderr.
    sub = altest.tmpdir()
    own = os.path.join(sub, "own.txt")
    desc = "direct ALLOCLENS_OUTPUT unwritable, program's own file on fd 2"
    plain, prof = direct(sub, ["sh", "-c", 'exec 2>"$0"; printf data >&2; exit 3', own],
                         ALLOCLENS_OUTPUT="/nonexistent/dir/r.json", ALLOCLENS_TEXT="-")
    same_as_plain(tap, desc, plain, prof)
    with open(own) as f:
        got = f.read()
    tap.ok(got == "data", f"{desc}: the program's file holds only what it wrote", repr(got[:500]))

    # Report paths are the command's, not the program's: one that changes directory before it
    # exits still writes them where `alloclens run` was started.
    top = altest.tmpdir()
    os.mkdir(os.path.join(top, "elsewhere"))
    p = run([altest.cli(), "run", "-o", "r.json", "--text", "r.txt", "--pprof", "r.pb.gz", "--",
             "sh", "-c", f"cd elsewhere && exec {LEAF} 2 100"], cwd=top)
    where = {n: [d for d in (top, os.path.join(top, "elsewhere"))
                 if os.path.exists(os.path.join(d, n))] for n in ("r.json", "r.txt", "r.pb.gz")}
    tap.ok(p is not None and all(w == [top] for w in where.values()),
           "relative -o, --text and --pprof are written where alloclens run was started, "
           "though the program changed directory", f"{where}\n{show(p)}")
    # The same with the library alone: the paths are the directory's the program started in.
    top = altest.tmpdir()
    os.mkdir(os.path.join(top, "elsewhere"))
    p = run(["sh", "-c", "cd elsewhere && :"], cwd=top,
            env=clean_env(LD_PRELOAD=SO, ALLOCLENS_OUTPUT="r.json", ALLOCLENS_TEXT="r.txt",
                          ALLOCLENS_PPROF="r.pb.gz"))
    where = {n: [d for d in (top, os.path.join(top, "elsewhere"))
                 if os.path.exists(os.path.join(d, n))] for n in ("r.json", "r.txt", "r.pb.gz")}
    tap.ok(p is not None and p.returncode == 0 and all(w == [top] for w in where.values()),
           "direct use: relative ALLOCLENS_OUTPUT, _TEXT and _PPROF are written where the "
           "program started, though it changed directory", f"{where}\n{show(p)}")

    # A forking program with an unwritable output: each process says so for its own report
    # (one line per process), and the program is unchanged.
    sub = altest.tmpdir()
    desc = "direct ALLOCLENS_OUTPUT unwritable, program forks"
    plain, prof = direct(sub, [FORK, "basic"], ALLOCLENS_OUTPUT="/nonexistent/dir/r.json",
                         ALLOCLENS_TEXT="off")
    same_as_plain(tap, desc, plain, prof)
    err = lines(prof.stderr) if prof else []
    tap.ok(len(err) == 2 and all("/nonexistent/dir/r." in l for l in err),
           f"{desc}: one line for the parent's report and one for the child's", show(prof))

    # A device as the output (-o /dev/null): the child's report goes there too, not to a file
    # made beside it in /dev.
    def beside_null():
        return {f for f in os.listdir("/dev") if f.startswith("null.")}
    before = beside_null()
    sub = altest.tmpdir()
    desc = "direct ALLOCLENS_OUTPUT=/dev/null, program forks"
    plain, prof = direct(sub, [FORK, "basic"], ALLOCLENS_OUTPUT="/dev/null", ALLOCLENS_TEXT="off")
    same_as_plain(tap, desc, plain, prof)
    made = beside_null() - before
    tap.ok(prof is not None and not lines(prof.stderr) and not made,
           f"{desc}: nothing on stderr, no file made in /dev", f"{sorted(made)}\n{show(prof)}")
    for f in made:
        os.unlink(os.path.join("/dev", f))
    # A failed exec's report is removed (the image goes on, and reports at its exit): never
    # the device itself.
    desc = "direct ALLOCLENS_OUTPUT=/dev/null, execs that fail"
    plain, prof = direct(sub, [EXEC, "enoent", LEAF], ALLOCLENS_OUTPUT="/dev/null", ALLOCLENS_TEXT="off")
    same_as_plain(tap, desc, plain, prof)
    tap.ok(os.path.exists("/dev/null") and stat.S_ISCHR(os.stat("/dev/null").st_mode),
           f"{desc}: /dev/null is still the device", show(prof))
    # A FIFO as -o, with a reader: the command's check that it can write there neither waits
    # for the reader nor ends its input; the report comes through.
    fifo = os.path.join(sub, "report.fifo")
    os.mkfifo(fifo)
    got = []
    reader = threading.Thread(target=lambda: got.append(open(fifo, "rb").read()), daemon=True)
    reader.start()
    p = run([altest.cli(), "run", "-o", fifo, "--text", "off", "--", LEAF, "3", "100"], cwd=sub)
    reader.join(TIMEOUT)
    try:
        parsed = json.loads(got[0]) if got else None
    except ValueError:
        parsed = None
    tap.ok(p is not None and p.returncode == 3 and parsed is not None
           and parsed["program"]["exit_status"] == 3,
           "-o a FIFO with a reader: the program's exit status, the report read from the FIFO",
           f"{len(got[0]) if got else 'no'} bytes read\n{show(p)}")


def test_same_report_file(tap):
    """(b) two of the reports (-o, --text, --pprof) asked into one file, by any of its names: the
    CLI refuses before running anything, the library writes the first and says one line."""
    tmp = altest.tmpdir()
    os.mkdir(os.path.join(tmp, "sub"))
    os.symlink("sub", os.path.join(tmp, "link"))
    with open(os.path.join(tmp, "made.json"), "w"):
        pass
    os.link(os.path.join(tmp, "made.json"), os.path.join(tmp, "hard.json"))
    marker = os.path.join(tmp, "ran")
    touch = ["sh", "-c", f"touch {marker}"]
    for desc, args, env, must in [
            ("alloclens run -o pp.json, ALLOCLENS_PPROF=pp.json (relative) inherited",
             ["-o", "pp.json"], {"ALLOCLENS_PPROF": "pp.json"}, ("--output", "ALLOCLENS_PPROF")),
            ("alloclens run --text t.txt --pprof sub/../t.txt",
             ["--text", "t.txt", "--pprof", "sub/../t.txt"], {}, ("--text", "--pprof")),
            ("alloclens run -o link/r.json --pprof sub/r.json (a linked directory)",
             ["-o", "link/r.json", "--pprof", "sub/r.json"], {}, ("--output", "--pprof")),
            ("alloclens run -o made.json --text hard.json (a hard link of it)",
             ["-o", "made.json", "--text", "hard.json"], {}, ("--output", "--text")),
            ("alloclens run --pprof p.out, ALLOCLENS_TEXT=./p.out and ALLOCLENS_OUTPUT=r.json inherited",
             ["--pprof", "p.out"], {"ALLOCLENS_TEXT": "./p.out", "ALLOCLENS_OUTPUT": "r.json"},
             ("ALLOCLENS_TEXT", "--pprof"))]:
        if os.path.exists(marker):
            os.remove(marker)
        p = run([altest.cli(), "run", *args, "--", *touch], env=clean_env(**env), cwd=tmp)
        one_line(tap, desc, p, *must, status=2)
        tap.ok(not os.path.exists(marker), f"{desc}: the command is not run", show(p))
    desc = "alloclens run -o r.json --pprof r.pprof (two files)"
    p = run([altest.cli(), "run", "--text", "off", "-o", "r.json", "--pprof", "r.pprof", "--", LEAF, "0", "100"],
            cwd=tmp)
    tap.ok(p is not None and p.returncode == 0 and load(os.path.join(tmp, "r.json")) is not None
           and os.path.getsize(os.path.join(tmp, "r.pprof")) > 0, f"{desc}: both written", show(p))

    # Direct use: the one read first is written, the later one left out with one line.
    for desc, env, first in [
            ("ALLOCLENS_OUTPUT=q.json and ALLOCLENS_PPROF=q.json (relative)",
             {"ALLOCLENS_OUTPUT": "q.json", "ALLOCLENS_PPROF": "q.json", "ALLOCLENS_TEXT": "off"}, "json"),
            ("ALLOCLENS_TEXT=t.txt and ALLOCLENS_PPROF=./t.txt",
             {"ALLOCLENS_TEXT": "t.txt", "ALLOCLENS_PPROF": "./t.txt"}, "text"),
            ("ALLOCLENS_OUTPUT=r.json and ALLOCLENS_TEXT=sub/../r.json",
             {"ALLOCLENS_OUTPUT": "r.json", "ALLOCLENS_TEXT": "sub/../r.json"}, "json")]:
        sub = altest.tmpdir()
        os.mkdir(os.path.join(sub, "sub"))
        names = [k for k in env if env[k] != "off"]
        plain, prof = direct(sub, [LEAF, "0", "100"], **env)
        same_as_plain(tap, desc, plain, prof)
        said = [l for l in lines(prof.stderr if prof else "") if l.startswith("alloclens[")]
        tap.ok(len(said) == 1 and all(n in said[0] for n in names),
               f"{desc}: one line naming both", show(prof))
        path = os.path.join(sub, env[names[0]])
        if first == "json":
            kept = load(path) is not None
        else:
            with open(path, "rb") as f:
                kept = b"== alloclens report" in f.read()  # text, not gzip
        tap.ok(kept, f"{desc}: the {first} report intact in the file", show(prof))


def test_stderr_pipe_closed(tap):
    """The text report on a stderr whose reader is gone: the write fails quietly; the program's
    exit status and output are its own, and the JSON report is still written."""
    tmp = altest.tmpdir()
    out = os.path.join(tmp, "r.json")
    r, w = os.pipe()
    os.close(r)
    try:
        plain = subprocess.run([LEAF, "3", "100"], stdout=subprocess.PIPE, stderr=w, timeout=TIMEOUT)
        prof = subprocess.run([altest.cli(), "run", "-o", out, "--", LEAF, "3", "100"],
                              stdout=subprocess.PIPE, stderr=w, env=clean_env(), timeout=TIMEOUT)
    finally:
        os.close(w)
    tap.ok(prof.returncode == plain.returncode == 3 and prof.stdout == plain.stdout,
           "text report to a stderr pipe nobody reads: exit status and stdout the program's own",
           f"plain {plain.returncode} {plain.stdout!r}; profiled {prof.returncode} {prof.stdout!r}")
    tap.ok(load(out) is not None, "text report to a stderr pipe nobody reads: JSON written")


def test_stderr_replaced(tap):
    """A program that puts a file of its own on fd 2 (a shell's `exec 2>>log`, a dup2): the text
    report goes to the stderr `alloclens run` was started with, kept as the program replaced
    it, never into the program's file; where the program then execs, into neither (the JSON
    has it)."""
    for label, script, status in [
            ("exec 2>>log", 'exec 2>>log; echo own >&2; true', 0),
            ("exec 2>>log, then exec", f'exec 2>>log; echo own >&2; exec {LEAF} 3 100', 3)]:
        tmp = altest.tmpdir()
        desc = f"program's own stderr ({label})"
        p = run([altest.cli(), "run", "-o", "r.json", "--", "bash", "-c", script], cwd=tmp)
        with open(os.path.join(tmp, "log")) as f:
            log = f.read()
        report = None
        try:
            with open(os.path.join(tmp, "r.json")) as f:
                report = json.load(f)
        except (OSError, ValueError):
            pass
        tap.ok(p is not None and p.returncode == status and log == "own\n" and report is not None,
               f"{desc}: the program's file holds only its own line; exit status, JSON report",
               f"log {log[:300]!r}\n{show(p)}")
        if status == 0:
            tap.ok(p is not None and "== alloclens report, pid" in p.stderr,
                   f"{desc}: the text report on the run's stderr", show(p))


def test_file_size_limit(tap):
    """A report bigger than the program's file size limit (ulimit -f 8): the program's exit status
    and output are its own (the write's SIGXFSZ would have ended it), one line says the report
    could not be written, and no cut-off report is left behind."""
    tmp = altest.tmpdir()
    out = os.path.join(tmp, "r.json")

    def limited():
        resource.setrlimit(resource.RLIMIT_FSIZE, (8192, 8192))

    plain = subprocess.run([LEAF, "3", "100"], capture_output=True, preexec_fn=limited, timeout=TIMEOUT)
    prof = subprocess.run([altest.cli(), "run", "-o", out, "--text", "off", "--", LEAF, "3", "100"],
                          capture_output=True, text=True, preexec_fn=limited, env=clean_env(), timeout=TIMEOUT)
    desc = "a report past the program's file size limit"
    tap.ok(prof.returncode == plain.returncode == 3 and prof.stdout.encode() == plain.stdout,
           f"{desc}: exit status and stdout the program's own",
           f"plain {plain.returncode} {plain.stdout!r}; profiled {show(prof)}")
    one_line(tap, desc, prof, out, "File too large", "removed")
    tap.ok(not os.path.exists(out), f"{desc}: no cut-off report left", out)


def test_allocators(tap):
    """(c), (d): unknown allocators."""
    tmp = altest.tmpdir()
    marker = os.path.join(tmp, "ran")
    touch = ["sh", "-c", f"touch {marker}"]
    names = list(altest.allocators())
    p = run([altest.cli(), "run", "-a", "nosuchalloc", "--", *touch])
    one_line(tap, "-a nosuchalloc", p, "nosuchalloc", *names, status=2)
    for path, why in [("/etc/passwd", "not a shared library"),
                      ("/nonexistent/libfoo.so", "missing file"),
                      (tmp, "a directory")]:
        p = run([altest.cli(), "run", "-a", path, "--", *touch])
        one_line(tap, f"-a {path} ({why})", p, path, status=2)
    tap.ok(not os.path.exists(marker), "no command run for an unknown allocator")

    # A real shared library that exports no malloc: refused, or run with one line naming it
    # (the calls then go to whatever malloc the process resolves).
    desc = "-a a shared library without malloc"
    p = run([altest.cli(), "run", "-a", NOT_ALLOC, "--text", "off", "--", LEAF, "0", "10"])
    base = os.path.basename(NOT_ALLOC)
    if one_line(tap, desc, p, base):
        tap.ok(p.returncode in (0, 2), f"{desc}: refused (2) or run (0)", show(p))


def test_cli_usage(tap):
    """(e)-(g): bad options, missing commands, usage and help."""
    tmp = altest.tmpdir()
    marker = os.path.join(tmp, "ran")
    touch = ["sh", "-c", f"touch {marker}"]
    cli = altest.cli()
    for value in ["xyz", "0", "-1", "12Q", "99999999999999999999"]:
        p = run([cli, "run", "--large-threshold", value, "--", *touch])
        one_line(tap, f"run --large-threshold {value}", p, "large-threshold", value, status=2)
    p = run([cli, "run", "--large-threshold=xyz", "--", *touch])
    one_line(tap, "run --large-threshold=xyz", p, "large-threshold", "xyz", status=2)
    p = run([cli, "run", "--bogus", "--", *touch])
    one_line(tap, "run --bogus", p, "--bogus", status=2)
    p = run([cli, "run", "--mode", "fast", "--", *touch])
    one_line(tap, "run --mode fast", p, "--mode", "fast", status=2)
    p = run([cli, "run", "-a"])
    one_line(tap, "run -a (no value)", p, "-a", status=2)
    p = run([cli, "run", "-o"])
    one_line(tap, "run -o (no value)", p, "-o", status=2)
    p = run([cli, "run"])
    one_line(tap, "run (no command)", p, status=2)
    p = run([cli, "run", "--"])
    one_line(tap, "run -- (no command)", p, status=2)
    tap.ok(not os.path.exists(marker), "no command run after a bad option")

    p = run([cli, "run", "--large-threshold=64k", "--text", "off", "--", LEAF, "0", "10"])
    tap.ok(p is not None and p.returncode == 0 and p.stderr == "",
           "run --large-threshold=64k: accepted, runs, nothing on stderr", show(p))

    p = run([cli, "run", "--", "/nonexistent/cmd"])
    one_line(tap, "run -- /nonexistent/cmd", p, "/nonexistent/cmd", status=127)
    p = run([cli, "run", "--", "alloclens-no-such-command"])
    one_line(tap, "run -- a command not on PATH", p, "alloclens-no-such-command", status=127)
    p = run([cli, "run", "--", "/etc/passwd"])
    one_line(tap, "run -- /etc/passwd (not executable)", p, "/etc/passwd", status=126)

    p = run([cli])
    tap.ok(p is not None and p.returncode == 2 and "usage" in (p.stdout + p.stderr).lower(),
           "alloclens with no arguments: exit 2 and the usage", show(p))
    tap.ok(p is not None and p.stdout == "", "alloclens with no arguments: usage on stderr",
           show(p))
    p = run([cli, "bogus"])
    one_line(tap, "alloclens bogus", p, "bogus", status=2)
    p = run([cli, "compare", "--bogus"])
    one_line(tap, "compare --bogus", p, "unknown option", "--bogus", status=2)
    p = run([cli, "prerun", "-a"])
    one_line(tap, "prerun -a (no value)", p, "-a", "needs a value", status=2)
    for value in ("-0", " 4096 "):
        p = run([cli, "run", "--text", "off", "--sample-rate", value, "--", LEAF, "0", "10"])
        tap.ok(p is not None and p.returncode == 0 and p.stderr == "",
               f"run --sample-rate '{value}': accepted", show(p))
    # What a command prints is not lost unsaid: stdout full or closed, one line, status 1.
    if os.path.exists("/dev/full"):
        for argv in (["allocators"], ["options"], ["--help"], ["run", "--help"]):
            with open("/dev/full", "w") as full:
                p = subprocess.run([cli, *argv], stdout=full, stderr=subprocess.PIPE, text=True,
                                   env=clean_env(), timeout=TIMEOUT)
            p.stdout = ""
            one_line(tap, f"alloclens {' '.join(argv)} > /dev/full", p, "stdout", os.strerror(28), status=1)
    p = subprocess.run(["sh", "-c", f"exec {cli} allocators >&-"], capture_output=True, text=True,
                       env=clean_env(), timeout=TIMEOUT)
    one_line(tap, "alloclens allocators with stdout closed", p, "stdout", status=1)
    for argv in (["--help"], ["help"], ["-h"]):
        p = run([cli, *argv])
        tap.ok(p is not None and p.returncode == 0 and "run" in p.stdout
               and "allocators" in p.stdout and p.stderr == "",
               f"alloclens {argv[0]}: exit 0, the commands on stdout", show(p))
    for argv in (["run", "--help"], ["run", "-h"]):
        p = run([cli, *argv])
        want = ["-a", "--allocator", "-o", "--output", "--text", "--large-threshold",
                "ALLOCLENS_TEXT", "ALLOCLENS_LARGE_THRESHOLD", "ALLOCLENS_OUTPUT"]
        missing = [w for w in want if p is None or w not in p.stdout]
        tap.ok(p is not None and p.returncode == 0 and not missing and p.stderr == "",
               f"alloclens {' '.join(argv)}: exit 0, every option and variable listed",
               f"missing {missing}\n{show(p)}")


def exact_line(tap, desc, p, line, status):
    """p finished with STATUS and stderr is exactly LINE."""
    tap.ok(p is not None and p.returncode == status and p.stderr == line + "\n",
           f"{desc}: exit status {status}, stderr exactly {line!r}", show(p))


def test_option_values(tap):
    """An option whose value was left out, so that the word after it is '--' or another option
    of the command: one line saying so, status 2, nothing run and no file made under that
    word's name (run -o -- wrote its report to a file named '--')."""
    cli = altest.cli()
    tmp = altest.tmpdir()
    marker = os.path.join(tmp, "ran")
    touch = ["sh", "-c", f"touch {marker}"]
    for argv, line in (
            (["run", "-o", "--", *touch], "option '-o' needs a value; got '--', which ends the options"),
            (["run", "-o", "--text", "off", "--", *touch], "option '-o' needs a value; got the option '--text'"),
            (["run", "--text", "--mode=time", "--", *touch], "option '--text' needs a value; got the option '--mode=time'"),
            (["run", "-a", "-o", "r.json", "--", *touch], "option '-a' needs a value; got the option '-o'"),
            (["run", "--seed", "--help", "--", *touch], "option '--seed' needs a value; got the option '--help'"),
            (["compare", "-o", "--", *touch], "option '-o' needs a value; got '--', which ends the options"),
            (["compare", "-a", "-n", "1", "--", *touch], "option '-a' needs a value; got the option '-n'"),
            (["compare", "--mode", "--runs", "1", "--", *touch], "option '--mode' needs a value; got the option '--runs'")):
        p = run([cli, *argv], cwd=tmp)
        exact_line(tap, " ".join(argv[:4]), p, "alloclens: " + line, 2)
    tap.ok(sorted(os.listdir(tmp)) == [], "an option's value left out: nothing run, no file made",
           f"{os.listdir(tmp)}")


def test_escaped_values(tap):
    """A value with a newline (or another control character) in it is shown escaped, so that
    the line about it stays one line; a message about a variable names it (ALLOCLENS_EVENTS
    too, from run and from the library)."""
    cli = altest.cli()
    tmp = altest.tmpdir()
    marker = os.path.join(tmp, "ran")
    touch = ["sh", "-c", f"touch {marker}"]
    for argv, line in (
            (["--seed", "5\n"], "--seed wants a number, not '5\\n'"),
            (["--sample-every=1\t2"], "--sample-every wants a number, not '1\\t2'"),
            (["--mode", "full\n"], "--mode takes full, time or sample, not 'full\\n'"),
            (["--bogus\x01"], "unknown option '--bogus\\x01' (see 'alloclens run --help')")):
        p = run([cli, "run", *argv, "--", *touch])
        exact_line(tap, f"run {' '.join(argv)!r}", p, "alloclens: " + line, 2)
    p = run([cli, "run", "--", *touch], env=clean_env(ALLOCLENS_EVENTS="bogus"))
    tap.ok(p is not None and p.returncode == 2 and p.stderr.startswith("alloclens: ALLOCLENS_EVENTS: unknown event 'bogus' (")
           and len(lines(p.stderr)) == 1, "ALLOCLENS_EVENTS=bogus alloclens run: one line naming the variable, status 2",
           show(p))
    p = run([cli, "run", "--events", "bogus", "--", *touch], env=clean_env(ALLOCLENS_EVENTS="page-faults"))
    tap.ok(p is not None and p.returncode == 2 and p.stderr.startswith("alloclens: --events: unknown event 'bogus' (")
           and len(lines(p.stderr)) == 1, "alloclens run --events bogus: one line naming the option, status 2", show(p))
    tap.ok(not os.path.exists(marker), "a bad value: nothing run")
    for var, value, shown in (("ALLOCLENS_SEED", "5\n", "ALLOCLENS_SEED='5\\n' is not a number"),
                              ("ALLOCLENS_MODE", "time\r\n", "ALLOCLENS_MODE='time\\r\\n' is none of"),
                              ("ALLOCLENS_EVENTS", "bogus", "ALLOCLENS_EVENTS: unknown event 'bogus'")):
        bad_variable(tap, var, value, shown)


def test_repeats_and_help(tap):
    """An option given twice is refused with one line naming both values (the later one used to
    take the first's place without a word); every command takes --help, exit 0, the usage on
    stdout; the help texts say which exit status an output file that cannot be made gives (2,
    checked before any work) and which a failed write (1)."""
    cli = altest.cli()
    tmp = altest.tmpdir()
    marker = os.path.join(tmp, "ran")
    touch = ["--", "sh", "-c", f"touch {marker}"]
    a, b = os.path.join(tmp, "a"), os.path.join(tmp, "b")
    for argv, line in (
            (["run", "-o", a, "--output", b, *touch], f"option '--output' given twice ('{a}', then '{b}')"),
            (["run", "--seed", "1", "--seed=2", *touch], "option '--seed' given twice ('1', then '2')"),
            (["run", "-a", "glibc", "--allocator=glibc", *touch], "option '--allocator' given twice ('glibc', then 'glibc')"),
            (["run", "--text", "off", "--text", "-", *touch], "option '--text' given twice ('off', then '-')"),
            (["compare", "-n", "1", "--runs", "2", *touch], "option '--runs' given twice ('1', then '2')"),
            (["compare", "-a", "glibc", "-a", "glibc", *touch], "option '-a' given twice ('glibc', then 'glibc')"),
            (["prerun", "-a", "glibc", "-o", a, "-o", b], f"option '-o' given twice ('{a}', then '{b}')"),
            (["report", "r.json", "--html", a, "--html", b], f"option '--html' given twice ('{a}', then '{b}')")):
        p = run([cli, *argv], cwd=tmp)
        exact_line(tap, " ".join(argv[:6]), p, f"alloclens: {line}: give it once", 2)
    tap.ok(sorted(os.listdir(tmp)) == [], "an option given twice: nothing run, no file made", f"{os.listdir(tmp)}")
    for command in ("run", "prerun", "compare", "report", "allocators", "demo", "options"):
        for flag in ("--help", "-h"):
            p = run([cli, command, flag])
            tap.ok(p is not None and p.returncode == 0 and p.stdout.startswith(f"usage: alloclens {command}")
                   and p.stderr == "", f"alloclens {command} {flag}: exit 0, the usage on stdout", show(p))
    p = run([cli, "report", "--help"])
    tap.ok(p is not None and "or an OUT.html that cannot be made (nothing is rendered); 1 when writing" in p.stdout,
           "report --help: an --html file that cannot be made is status 2, a failed write 1", show(p))
    p = run([cli, "--help"])
    tap.ok(p is not None and "2 for bad arguments (an output file that cannot be made among them" in p.stdout
           and "1 when its work or a write of its output failed" in p.stdout,
           "alloclens --help: the exit statuses of output files that cannot be made and of failed writes", show(p))


def unchanged(tap, desc, argv, out, status, text_off=True):
    """ARGV run plain and under `alloclens run -o OUT` (--text off unless TEXT_OFF is False):
    the same stdout, and exit STATUS both times (DESC says so). Returns the profiled run."""
    plain = run(argv)
    p = run([altest.cli(), "run", "-o", out, *(["--text", "off"] if text_off else []), "--", *argv])
    tap.ok(p is not None and plain is not None and p.stdout == plain.stdout
           and p.returncode == plain.returncode == status, desc, show(p))
    return p


def unreachable_program(tap, what, prog, status, said):
    """PROG, which LD_PRELOAD cannot reach, under `alloclens run`: its output and exit status
    (STATUS) its own, one line saying SAID and that there is no report, and none written."""
    out = os.path.join(altest.tmpdir(), "r.json")
    p = unchanged(tap, f"run -- {what}: its output and exit status unchanged",
                  [prog, str(status), "100"], out, status, text_off=False)
    one_line(tap, f"run -- {what}", p, said, "no report", status=status)
    tap.ok(not os.path.exists(out), f"run -- {what}: no report file")


GO_PROGRAM = """package main

// #include <stdlib.h>
import "C"

import (
	"fmt"
	"os"
	"unsafe"
)

func main() {
	for i := 0; i < 1000; i++ {
		C.free(unsafe.Pointer(C.malloc(C.size_t(16 + i))))
	}
	fmt.Println("go: 1000 allocations made in C")
	if len(os.Args) > 1 {
		C.exit(3)
	}
}
"""


def test_go_program(tap):
    """A Go program (cgo, so linked dynamically): its runtime ends the process with a system
    call of its own, past the exit handlers. Its output and status its own, one line saying no
    report will come at its end; when it ends through the C library's exit, the report does."""
    go = shutil.which("go")
    if not go:
        tap.skip("run -- a Go program", "no go on PATH")
        return
    tmp = altest.tmpdir()
    with open(os.path.join(tmp, "main.go"), "w") as f:
        f.write(GO_PROGRAM)
    with open(os.path.join(tmp, "go.mod"), "w") as f:
        f.write("module gocgo\n\ngo 1.19\n")
    prog = os.path.join(tmp, "gocgo")
    env = dict(os.environ, HOME=tmp, GOCACHE=os.path.join(tmp, "cache"), GOFLAGS="-mod=mod", CGO_ENABLED="1")
    b = subprocess.run([go, "build", "-o", prog, "."], cwd=tmp, env=env, capture_output=True, text=True)
    if b.returncode != 0:
        tap.skip("run -- a Go program", f"go build failed: {b.stderr[-300:]}")
        return
    for args, status in (([], 0), (["exit"], 3)):
        out = os.path.join(tmp, f"r{len(args)}.json")
        what = f"run -- a Go program{' ending with C exit(3)' if args else ''}"
        p = unchanged(tap, f"{what}: its output and exit status unchanged", [prog, *args], out, status)
        one_line(tap, what, p, "Go program", "no report at its end", status=status)
        rep = load(out)
        if args:
            tap.ok(rep is not None and rep["program"].get("exit_status") == 3,
                   f"{what}: the report written, exit status 3", (rep or {}).get("program"))
        else:
            tap.ok(rep is None, f"{what}: no report, as the line said")


def test_own_malloc(tap):
    """A program that defines the malloc family itself: its output and exit status its own, one
    line saying nothing can stand in front of its allocator, and a report that says the same
    (the allocator named for the program, the config for the allocator asked for not used)."""
    out = os.path.join(altest.tmpdir(), "r.json")
    p = unchanged(tap, "run -- a program with its own malloc: its output and exit status unchanged",
                  [OWN_MALLOC], out, 3)
    one_line(tap, "run -- a program with its own malloc", p, "defines malloc itself", OWN_MALLOC, status=3)
    rep = load(out)
    alloc = (rep or {}).get("allocator", {})
    tap.ok(alloc.get("program_defines_malloc") is True and alloc.get("path") == OWN_MALLOC
           and alloc.get("config", {}).get("available") is False,
           "run -- a program with its own malloc: the report names it, the config unused", alloc)


def test_static_program(tap):
    if not STATIC:
        tap.skip("run -- a statically linked program", "no static libc to build one with")
        return
    unreachable_program(tap, "a statically linked program", STATIC, 5, "statically linked")
    # Exec'd by the profiled program: its report will be missing, and one line says so.
    tmp = altest.tmpdir()
    out = os.path.join(tmp, "r.json")
    p = unchanged(tap, "a statically linked program exec'd: output and exit status unchanged",
                  [EXEC, "leaf", STATIC], out, 0)
    one_line(tap, "a statically linked program exec'd", p, "statically linked", "no report",
             os.path.basename(STATIC))
    # Started by posix_spawn and posix_spawnp, which exec inside the C library: a line each.
    p = unchanged(tap, "a statically linked program posix_spawn'd: output and exit status unchanged",
                  [EXEC, "spawn", STATIC], out, 0)
    lines = [] if p is None else [l for l in p.stderr.splitlines() if "statically linked" in l]
    tap.ok(len(lines) == 2 and lines[0].split()[1] == STATIC and lines[1].split()[1] == os.path.basename(STATIC)
           and all("no report" in l for l in lines),
           "a statically linked program posix_spawn'd, then posix_spawnp'd: a line each, naming it",
           show(p))


def test_setuid_program(tap):
    """host_leaf, set-user-ID and owned by nobody: the loader runs it securely, without our
    preload. Root can make such a file; a file system mounted nosuid ignores the bit."""
    tmp = altest.tmpdir()
    prog = os.path.join(tmp, "leaf_suid")
    shutil.copy(LEAF, prog)
    try:
        os.chown(prog, pwd.getpwnam("nobody").pw_uid, -1)
        os.chmod(prog, 0o4755)
    except (OSError, KeyError) as e:
        tap.skip("run -- a set-user-ID program", f"cannot make one here: {e}")
        return
    if os.statvfs(prog).f_flag & os.ST_NOSUID:
        tap.skip("run -- a set-user-ID program", f"{tmp} is mounted nosuid")
        return
    unreachable_program(tap, "a set-user-ID program", prog, 6, "set-user-ID")
    # It is not probed for either: with no config cached, still that one line, nothing cached.
    cache = altest.tmpdir()
    p = run([altest.cli(), "run", "-a", "glibc", "--", prog, "6", "100"], env=clean_env(XDG_CACHE_HOME=cache))
    tap.ok(p is not None and p.returncode == 6 and len(lines(p.stderr)) == 1 and "probing" not in p.stderr
           and not os.listdir(cache), "run -- a set-user-ID program, nothing cached: no probe, one line",
           f"cache: {os.listdir(cache)}\n{show(p)}")


def test_uncachable_config(tap):
    """The config cache cannot be written (here: XDG_CACHE_HOME a file, not a directory; as
    nobody with HOME=/root alike): the run uses the probed config all the same, kept in a
    private directory of the user's in $TMPDIR, says so once, and the next run takes it from
    there without a probe. A directory of that name that others may write is not used."""
    cli = altest.cli()
    tmp = altest.tmpdir()
    env = clean_env(XDG_CACHE_HOME="/dev/null", TMPDIR=tmp)
    out = os.path.join(tmp, "r.json")
    argv = [cli, "run", "-a", "glibc", "-o", out, "--text", "off", "--", LEAF, "0", "50"]
    kept = os.path.join(tmp, f"alloclens-{os.getuid()}", "alloclens")
    for n in (1, 2):
        p = run(argv, env=env)
        conf = (load(out) or {}).get("allocator", {}).get("config", {})
        said = lines(p.stderr) if p else []
        files = os.listdir(kept) if os.path.isdir(kept) else []
        path = os.path.join(kept, files[0]) if len(files) == 1 else None
        want = [] if n == 2 else [
            f"alloclens: first run under glibc: probing its size classes once (cached in /dev/null/alloclens/{files[0] if files else '?'})",
            f"alloclens: could not cache the config (cannot write /dev/null/alloclens/{files[0] if files else '?'}: "
            f"{os.strerror(20)}): kept in {path} instead"]
        tap.ok(p is not None and p.returncode == 0 and said == want and path and conf.get("available")
               and conf.get("path") == path, f"a cache that cannot be written, run {n}: "
               + ("probed, the config used, one line saying where it is kept" if n == 1 else "the kept config used, no probe, nothing said"),
               f"report's config: {conf}\nwant {want}\n{show(p)}")
    shared = altest.tmpdir()
    os.chmod(shared, 0o1777)
    os.mkdir(os.path.join(shared, f"alloclens-{os.getuid()}"), 0o777)
    os.chmod(os.path.join(shared, f"alloclens-{os.getuid()}"), 0o777)
    p = run(argv, env=clean_env(XDG_CACHE_HOME="/dev/null", TMPDIR=shared))
    tap.ok(p is not None and p.returncode == 0 and len(lines(p.stderr)) == 2
           and lines(p.stderr)[1].endswith("nor keep it in $TMPDIR; running without a config")
           and not os.listdir(os.path.join(shared, f"alloclens-{os.getuid()}")),
           "a cache that cannot be written, $TMPDIR's directory for it writable by others: not used, said",
           show(p))


def test_paths(tap):
    """Report, config and library paths: a symbolic link to nothing as -o is written through
    (the link kept); a relative path whose directory has lost its name is refused with one line;
    a relative --config is found after the program changes directory; a library path LD_PRELOAD
    cannot name (a space, a colon) is refused with one line; prerun -o replaces only a regular
    file (a FIFO is refused and kept, a link's file is replaced and the link kept) and makes no
    directory; events libpfm4 does not know are refused before anything runs."""
    cli = altest.cli()
    tmp = altest.tmpdir()
    link, target = os.path.join(tmp, "dangling.json"), os.path.join(tmp, "target.json")
    os.symlink(target, link)
    p = run([cli, "run", "--text", "off", "-o", link, "--", LEAF, "0", "50"])
    tap.ok(p is not None and p.returncode == 0 and os.path.islink(link) and load(target) is not None,
           "run -o a symbolic link to nothing: the report in the link's target, the link kept",
           f"link kept: {os.path.islink(link)}; target: {os.path.exists(target)}\n{show(p)}")

    gone = os.path.join(altest.tmpdir(), "gone")
    os.mkdir(gone)
    marker = os.path.join(tmp, "ran")
    proc = subprocess.Popen(["sh", "-c", f"cd {gone} && rmdir {gone} && exec {cli} run -o r.json -- touch {marker}"],
                            env=clean_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out, err = proc.communicate(timeout=TIMEOUT)
    p = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
    one_line(tap, "run -o r.json in a removed directory", p, "r.json", status=2)
    tap.ok(not os.path.exists(marker), "run -o r.json in a removed directory: nothing run")

    conf = os.path.join(tmp, "glibc.conf")
    p = run([cli, "prerun", "-a", "glibc", "-o", conf])
    if tap.ok(p is not None and p.returncode == 0, "prerun -a glibc -o FILE", show(p)):
        out = os.path.join(tmp, "rel.json")
        p = run([cli, "run", "--text", "off", "-o", out, "--config", "glibc.conf", "--",
                 "sh", "-c", f"cd / && exec {LEAF} 0 50"], cwd=tmp)
        r = load(out) or {}
        tap.ok(p is not None and p.returncode == 0 and p.stderr == ""
               and r.get("allocator", {}).get("large_threshold_source") == "config",
               "run --config RELATIVE, the program in another directory: the config is used",
               f"report allocator: {r.get('allocator')}\n{show(p)}")

    spaced = os.path.join(altest.tmpdir(), "with space")
    os.makedirs(os.path.join(spaced, "cli"))
    os.makedirs(os.path.join(spaced, "interpose"))
    shutil.copy2(cli, os.path.join(spaced, "cli"))
    shutil.copy2(SO, os.path.join(spaced, "interpose"))
    p = run([os.path.join(spaced, "cli", os.path.basename(cli)), "run", "--", "sh", "-c", f"touch {marker}"])
    one_line(tap, "alloclens installed under a path with a space", p, "liballoclens.so", "space", status=2)
    lib = os.path.join(spaced, "libc-copy.so")
    shutil.copy2(altest.allocators()["glibc"], lib)
    p = run([cli, "run", "-a", lib, "--", "sh", "-c", f"touch {marker}"])
    one_line(tap, "run -a a library under a path with a space", p, lib, status=2)
    tap.ok(not os.path.exists(marker), "a path LD_PRELOAD cannot name: nothing run")

    p = run([cli, "run", "--events", "page-faults,no-such-event", "--", "sh", "-c", f"touch {marker}"])
    one_line(tap, "run --events with an unknown event", p, "no-such-event", status=2)
    tap.ok(not os.path.exists(marker), "run --events with an unknown event: nothing run")

    fifo = os.path.join(tmp, "fifo")
    os.mkfifo(fifo)
    p = run([cli, "prerun", "-a", "glibc", "-o", fifo])
    one_line(tap, "prerun -o a FIFO", p, fifo, "not a regular file", status=2)
    tap.ok(stat.S_ISFIFO(os.lstat(fifo).st_mode), "prerun -o a FIFO: the FIFO is still there")
    nothing = os.path.join(tmp, "to-nothing.conf")
    os.symlink(os.path.join(tmp, "nothing"), nothing)
    p = run([cli, "prerun", "-a", "glibc", "-o", nothing])
    one_line(tap, "prerun -o a symbolic link to nothing", p, nothing, status=2)
    real, linked = os.path.join(tmp, "real.conf"), os.path.join(tmp, "linked.conf")
    with open(real, "w") as f:
        f.write("old\n")
    os.symlink(real, linked)
    p = run([cli, "prerun", "-a", "glibc", "-o", linked])
    with open(real) as f:
        head = f.read(64)
    tap.ok(p is not None and p.returncode == 0 and os.path.islink(linked) and head != "old\n",
           "prerun -o a symbolic link to a file: the file replaced, the link kept", show(p))
    missing_dir = os.path.join(tmp, "no", "such", "dir")
    p = run([cli, "prerun", "-a", "glibc", "-o", os.path.join(missing_dir, "x.conf")])
    one_line(tap, "prerun -o into a missing directory", p, missing_dir, status=2)
    tap.ok(not os.path.exists(os.path.join(tmp, "no")), "prerun -o into a missing directory: none made")


def test_configs(tap):
    """A malformed, missing or mismatched allocator config: one line naming the file (and the
    line, for a malformed one); the program runs as it would."""
    tmp = altest.tmpdir()
    cli = altest.cli()
    good = os.path.join(tmp, "good.conf")
    p = run([cli, "prerun", "-a", "glibc", "-o", good])
    if not tap.ok(p is not None and p.returncode == 0 and os.path.isfile(good),
                  "prerun -a glibc -o FILE writes a config", show(p)):
        return
    with open(good) as f:
        text = f.read()
    bad = os.path.join(tmp, "bad.conf")
    with open(bad, "w") as f:
        f.write(text.splitlines()[0] + "\nthis line is not a key\n")
    garbage = os.path.join(tmp, "garbage.conf")
    with open(garbage, "w") as f:
        f.write("\x00\x01 not a config at all\n")
    cut = os.path.join(tmp, "cut.conf")
    with open(cut, "w") as f:
        f.write(text[:len(text) // 2].rsplit(" ", 1)[0] + " 12x\n")
    missing = os.path.join(tmp, "missing.conf")
    plain = run([LEAF, "3", "200"])
    for path, must, what in [(bad, [bad + ":2"], "malformed line 2"),
                             (garbage, [garbage + ":1"], "not a config"),
                             (cut, [cut + ":"], "cut short, bad number"),
                             (missing, [missing], "missing file")]:
        desc = f"run --config ({what})"
        p = run([cli, "run", "--config", path, "--text", "off", "--", LEAF, "3", "200"])
        same_as_plain(tap, desc, plain, p)
        one_line(tap, desc, p, *must)
        sub = altest.tmpdir()
        out = os.path.join(sub, "r.json")
        desc = f"direct ALLOCLENS_CONFIG ({what})"
        plain2, p = direct(sub, [LEAF, "3", "200"], ALLOCLENS_CONFIG=path, ALLOCLENS_TEXT="off",
                           ALLOCLENS_OUTPUT=out)
        same_as_plain(tap, desc, plain2, p)
        one_line(tap, desc, p, *must)
        tap.ok(load(out) is not None, f"{desc}: the JSON report is still written")

    sub = altest.tmpdir()
    desc = "direct ALLOCLENS_CONFIG (a good one)"
    plain2, p = direct(sub, [LEAF, "0", "100"], ALLOCLENS_CONFIG=good, ALLOCLENS_TEXT="off")
    same_as_plain(tap, desc, plain2, p)
    tap.ok(p is not None and p.stderr == "", f"{desc}: nothing on stderr", show(p))

    others = [n for n in altest.allocators() if n != "glibc"]
    if not others:
        tap.skip("config of another allocator", "only glibc here")
        return
    other = os.path.join(tmp, "other.conf")
    p = run([cli, "prerun", "-a", others[0], "-o", other])
    if not tap.ok(p is not None and p.returncode == 0, f"prerun -a {others[0]} -o FILE", show(p)):
        return
    desc = f"direct ALLOCLENS_CONFIG of {others[0]} in front of glibc"
    plain2, p = direct(altest.tmpdir(), [LEAF, "3", "200"], ALLOCLENS_CONFIG=other, ALLOCLENS_TEXT="off")
    same_as_plain(tap, desc, plain2, p)
    one_line(tap, desc, p, other)


def test_no_proc(tap):
    """A process that cannot read /proc (a sandbox that does not mount it): the program runs as
    it would in each mode, its report is written, and the text says the peak RSS is unknown
    rather than 0 MiB."""
    probe = run(["unshare", "--mount", "sh", "-c", "umount -l /proc && ! test -e /proc/self/status"])
    if probe is None or probe.returncode != 0:
        tap.skip("no /proc", "cannot unmount /proc in a mount namespace of its own here")
        return
    for mode in ("full", "time", "sample"):
        tmp = altest.tmpdir()
        out, text = os.path.join(tmp, "r.json"), os.path.join(tmp, "r.txt")
        desc = f"no /proc, --mode {mode}"
        # Only the program itself preloaded, exec'd by env once /proc is gone.
        inside = ["unshare", "--mount", "sh", "-c", 'umount -l /proc && exec env "$@"', "sh"]
        plain = run(inside + [LEAF, "3", "100"], cwd=tmp)
        prof = run(inside + [f"LD_PRELOAD={SO}", f"ALLOCLENS_MODE={mode}", f"ALLOCLENS_OUTPUT={out}",
                             f"ALLOCLENS_TEXT={text}", LEAF, "3", "100"], cwd=tmp)
        same_as_plain(tap, desc, plain, prof)
        rep = load(out)
        tap.ok(rep is not None and rep["program"].get("exit_status") == 3, f"{desc}: the report written",
               show(prof))
        try:
            with open(text) as f:
                said = f.read()
        except OSError:
            said = ""
        tap.ok("process peak RSS unknown (/proc/self/status unreadable)" in said,
               f"{desc}: the text report says the peak RSS is unknown", said[-800:])


def main():
    global SO, LEAF, FORK, NOT_ALLOC, EXEC, OWN_MALLOC, STATIC, CACHE
    SO = altest.so()
    LEAF, FORK, NOT_ALLOC, EXEC, OWN_MALLOC = sys.argv[1:6]
    STATIC = sys.argv[6] if len(sys.argv) > 6 else None
    CACHE = altest.tmpdir()
    tap = altest.Tap()
    # The first run under glibc probes it and says so on stderr; do it once here, so that the
    # one-line checks below see only what the bad input causes.
    p = run([altest.cli(), "run", "--text", "off", "--", "true"])
    tap.ok(p is not None and p.returncode == 0, "first run (probe) exits 0", show(p))
    test_bad_variables(tap)
    test_unwritable_paths(tap)
    test_same_report_file(tap)
    test_stderr_pipe_closed(tap)
    test_stderr_replaced(tap)
    test_file_size_limit(tap)
    test_allocators(tap)
    test_cli_usage(tap)
    test_option_values(tap)
    test_escaped_values(tap)
    test_repeats_and_help(tap)
    test_own_malloc(tap)
    test_go_program(tap)
    test_static_program(tap)
    test_setuid_program(tap)
    test_uncachable_config(tap)
    test_configs(tap)
    test_paths(tap)
    test_no_proc(tap)
    tap.done()


if __name__ == "__main__":
    main()
