"""Shared helpers for alloclens integration tests: TAP output and running the CLI.

Every integration test prints TAP (one `ok`/`not ok` line per check), so meson counts each
check and tests/run can print one `N passed, N failed` line for the whole suite.
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile


class Tap:
    """Collects checks and prints them as TAP; exit status 1 when any check failed."""

    def __init__(self):
        self.n = 0
        self.failed = 0

    def ok(self, cond, desc, detail=None):
        self.n += 1
        if cond:
            print(f"ok {self.n} - {desc}", flush=True)
        else:
            self.failed += 1
            print(f"not ok {self.n} - {desc}", flush=True)
            if detail:
                for line in str(detail).splitlines():
                    print(f"# {line}", flush=True)
        return cond

    def skip(self, desc, why):
        self.n += 1
        print(f"ok {self.n} - {desc} # SKIP {why}", flush=True)

    def diag(self, msg):
        for line in str(msg).splitlines():
            print(f"# {line}", flush=True)

    def done(self):
        """Ends the test. The directories tmpdir() made are removed when every check passed,
        and kept for inspection (their paths printed) when one failed."""
        for d in _tmpdirs:
            if self.failed and os.path.isdir(d):
                self.diag(f"kept for inspection: {d}")
            elif not self.failed:
                shutil.rmtree(d, ignore_errors=True)
        print(f"1..{self.n}", flush=True)
        sys.exit(1 if self.failed else 0)


def cli():
    """Path of the alloclens command under test (meson passes it in ALLOCLENS_CLI)."""
    return os.environ["ALLOCLENS_CLI"]


def so():
    """Path of liballoclens.so under test, for direct use (meson passes it in ALLOCLENS_SO)."""
    return os.environ["ALLOCLENS_SO"]


def plain_env(**extra):
    """This process's environment without alloclens in it (no ALLOCLENS_* but the CLI's path,
    no LD_PRELOAD), EXTRA added: what a program run plain, or handed to `alloclens run`, gets."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("ALLOCLENS_") and k != "LD_PRELOAD"}
    env["ALLOCLENS_CLI"] = cli()
    env.update(extra)
    return env


def allocators():
    """{name: path} of the allocators `alloclens allocators` finds on this machine."""
    out = subprocess.run([cli(), "allocators"], check=True, capture_output=True, text=True).stdout
    found = {}
    for line in out.splitlines():
        fields = line.split("\t")
        if len(fields) >= 2:
            found[fields[0]] = fields[1]
    return found


_primed = set()


def prime(alloc):
    """Probes ALLOC into the config cache once, so a run's stderr is the program's alone (the
    first run under an allocator says on stderr that it probes)."""
    if alloc not in _primed:
        subprocess.run([cli(), "prerun", "-a", alloc], check=True, capture_output=True)
        _primed.add(alloc)


def run(alloc, cmd, tmpdir, name="report", extra=(), **kw):
    """Runs CMD under `alloclens run -a ALLOC`; returns (CompletedProcess, report dict or None).

    The text report goes to a file so the program's own stderr stays comparable.
    """
    prime(alloc)
    out = os.path.join(tmpdir, f"{name}.json")
    txt = os.path.join(tmpdir, f"{name}.txt")
    argv = [cli(), "run", "-a", alloc, "-o", out, "--text", txt, *extra, "--", *cmd]
    proc = subprocess.run(argv, capture_output=True, **kw)
    report = None
    if os.path.exists(out):
        with open(out) as f:
            report = json.load(f)
    return proc, report


_tmpdirs = []


def tmpdir():
    """A fresh directory for one test's files, removed by Tap.done() if every check passed."""
    d = tempfile.mkdtemp(prefix="alloclens-test-")
    _tmpdirs.append(d)
    return d
