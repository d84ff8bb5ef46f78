#!/usr/bin/env python3
"""Real programs, unchanged: python3, sqlite3, git, bash, perl and gcc, a C++ container workload
(also run by valgrind) and redis-server, each run plain and then under `alloclens run -a NAME` for every
allocator `alloclens allocators` finds, in each mode (full, time, sample: ALLOCLENS_MODE).
Output and exit status must be byte-identical to the plain run, and every profiled process must
leave a report naming the allocator that served it, with nonzero malloc-family counts.

Usage: test_real_programs.py CXX_CONTAINERS_BINARY   (ALLOCLENS_CLI in the environment)

Everything is generated in a fresh temporary directory; nothing is fetched and nothing outside
that directory is written. A workload whose program is not installed is skipped (TAP SKIP).
"""
import difflib
import glob
import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time

import altest

STEP_TIMEOUT = 120        # seconds for any one command
MODES = ("full", "time", "sample")
ALLOC_OPS = ("malloc", "calloc", "realloc", "posix_memalign", "aligned_alloc", "memalign",
             "valloc", "pvalloc", "new")
FREE_OPS = ("free", "delete")

tap = altest.Tap()


# ---------------------------------------------------------------------------------------------
# Workload description: a setup function that fills the work directory, then steps. A step is
# either a command (run plain or under alloclens, output compared) or a Python callable (file
# edits between commands, done the same way in both modes and never profiled).

class Cmd:
    def __init__(self, name, argv, stdin=None, status=0, children=False, report_argv=None):
        self.name = name            # short label for TAP lines and report file names
        self.argv = argv
        self.report_argv = report_argv or argv  # the command line the main report must name
        self.stdin = stdin          # bytes or None
        self.status = status        # exit status the plain run must have (negative: signal)
        self.children = children    # whether it forks/execs children that must get reports


class Workload:
    def __init__(self, name, programs, setup, steps, env=None):
        self.name = name
        self.programs = programs    # executables that must be installed
        self.setup = setup          # setup(workdir)
        self.steps = steps          # list of Cmd or callable(workdir)
        self.env = env or {}


def base_env(home, tmp):
    return altest.plain_env(HOME=home, TMPDIR=tmp, LC_ALL="C", LANG="C", TZ="UTC")


# ---------------------------------------------------------------------------------------------
# python3

PY_SCRIPT = r'''
import collections, json, subprocess, sys, threading

# dicts and lists
records = {f"key{i:05d}": {"n": i, "sq": i * i, "tags": [f"t{j}" for j in range(i % 7)],
                           "name": "item-" + "x" * (i % 13)} for i in range(20000)}
evens = [k for k, v in records.items() if v["n"] % 2 == 0]
print(f"records={len(records)} evens={len(evens)} last={evens[-1]}")

# json round trip
text = json.dumps(records, sort_keys=True)
back = json.loads(text)
assert back == records
print(f"json bytes={len(text)} keys={len(back)} tagged={sum(1 for v in back.values() if v['tags'])}")

# string formatting and counting
words = []
for i in range(30000):
    words.append("%s%d" % ("abcdefghij"[i % 10], i % 97))
counts = collections.Counter(words)
top = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:5]
print("top:", ", ".join("{}={:>4}".format(w, c) for w, c in top))
table = "\n".join("|{:<8}|{:>10.3f}|{:^6}|".format(w, c / 7, c % 5) for w, c in sorted(counts.items())[:8])
print(table)

# sets, tuples, sorting, slicing
pairs = sorted({(i % 101, (i * 7) % 53) for i in range(50000)})
print("pairs", len(pairs), pairs[:3], pairs[-3:])

# a few threads, each building its own structures
results = [None] * 3
def work(t):
    d = {}
    for i in range(20000):
        d.setdefault(i % (50 + t), []).append(str(i * t))
    results[t] = sum(len(v) for v in d.values()) + len(d)
threads = [threading.Thread(target=work, args=(t,)) for t in range(3)]
for th in threads:
    th.start()
for th in threads:
    th.join()
print("threads", results)

# a child process (fork/exec): it must get its own report under alloclens
child = subprocess.run([sys.executable, "-c", "print(sum(range(100000)))"],
                       capture_output=True, text=True, check=True)
print("child", child.stdout.strip())
print("done; a line on stderr follows", flush=True)
print("stderr line from the script", file=sys.stderr)
'''

PY_FAIL = "import sys\nprint('partial output')\nsys.stderr.write('failing on purpose\\n')\nsys.exit(3)\n"
PY_RAISE = "d = {i: str(i) for i in range(1000)}\nprint(len(d))\nraise ValueError('boom ' + d[7])\n"
PY_KILL = "import os, signal\nprint('before', flush=True)\nos.kill(os.getpid(), signal.SIGTERM)\n"
PY_ABORT = "import os\nl = [str(i) * 3 for i in range(1000)]\nprint(len(l), flush=True)\nos.abort()\n"


def python_path():
    # The system interpreter when there is one (what .ci/setup installs), else whatever python3
    # is on PATH, resolved to the real binary (a pyenv shim is a shell script).
    if os.access("/usr/bin/python3", os.X_OK):
        return "/usr/bin/python3"
    found = shutil.which("python3")
    return os.path.realpath(found) if found else None


def python_workload():
    py = python_path()

    def setup(wd):
        with open(os.path.join(wd, "script.py"), "w") as f:
            f.write(PY_SCRIPT)

    steps = [
        Cmd("script", [py, "script.py"], children=True),
        Cmd("exit3", [py, "-c", PY_FAIL], status=3),
        Cmd("raise", [py, "-c", PY_RAISE], status=1),
        Cmd("stdin", [py, "-"], stdin=b"import json\nprint(json.dumps({'a': [1, 2, {'b': None}]}))\n"),
        Cmd("sigterm", [py, "-c", PY_KILL], status=-signal.SIGTERM),
        Cmd("abort", [py, "-c", PY_ABORT], status=-signal.SIGABRT),
    ]
    return Workload("python3", [py or "python3"], setup, steps,
                    env={"PYTHONHASHSEED": "0", "PYTHONDONTWRITEBYTECODE": "1"})


# ---------------------------------------------------------------------------------------------
# sqlite3

class Lcg:
    def __init__(self, seed):
        self.s = seed

    def next(self, n):
        self.s = (self.s * 6364136223846793005 + 1442695040888963407) % (1 << 64)
        return (self.s >> 33) % n


def sqlite_workload():
    cities = ["Oslo", "Lima", "Pune", "Kobe", "Bari", "Nice", "Graz", "Cork", "Hue", "Ulm"]
    products = ["widget", "gadget", "doohickey", "sprocket", "gizmo", "thingamajig"]

    def setup(wd):
        rng = Lcg(12345)
        lines = [
            "CREATE TABLE customers(id INTEGER PRIMARY KEY, name TEXT NOT NULL, city TEXT);",
            "CREATE TABLE orders(id INTEGER PRIMARY KEY, customer INTEGER REFERENCES customers(id),"
            " product TEXT, qty INTEGER, price REAL, note TEXT);",
            "BEGIN;",
        ]
        for i in range(1, 501):
            lines.append(f"INSERT INTO customers VALUES({i}, 'customer {i:04d}', "
                         f"'{cities[rng.next(len(cities))]}');")
        for i in range(1, 4001):
            note = "'" + "n" * rng.next(30) + "'" if rng.next(3) else "NULL"
            lines.append(f"INSERT INTO orders VALUES({i}, {1 + rng.next(500)}, "
                         f"'{products[rng.next(len(products))]}', {1 + rng.next(20)}, "
                         f"{rng.next(10000) / 100:.2f}, {note});")
        lines += ["COMMIT;", "CREATE INDEX orders_customer ON orders(customer);"]
        with open(os.path.join(wd, "create.sql"), "w") as f:
            f.write("\n".join(lines) + "\n")

    queries = b"""
.headers on
.mode column
SELECT count(*) AS customers FROM customers;
SELECT count(*) AS orders, sum(qty) AS items, printf('%.2f', sum(qty * price)) AS revenue FROM orders;
SELECT c.city, count(*) AS n, sum(o.qty) AS items, printf('%.2f', avg(o.price)) AS avg_price
  FROM orders o JOIN customers c ON c.id = o.customer
  GROUP BY c.city ORDER BY items DESC, c.city;
SELECT product, count(*) AS n, max(qty) AS max_qty, min(price) AS min_price
  FROM orders GROUP BY product HAVING n > 10 ORDER BY product;
SELECT c.name, count(o.id) AS n, printf('%.2f', sum(o.qty * o.price)) AS spent
  FROM customers c LEFT JOIN orders o ON o.customer = c.id
  GROUP BY c.id ORDER BY sum(o.qty * o.price) DESC, c.id LIMIT 15;
SELECT product, group_concat(DISTINCT qty) AS qtys FROM
  (SELECT product, qty FROM orders WHERE qty > 17 ORDER BY qty) GROUP BY product ORDER BY product;
SELECT id, product, rank() OVER (PARTITION BY product ORDER BY price DESC, id) AS r
  FROM orders WHERE customer < 20 ORDER BY product, r LIMIT 25;
.mode csv
SELECT upper(city), length(group_concat(name)) FROM customers GROUP BY city ORDER BY 1;
"""
    update = b"""
BEGIN;
UPDATE orders SET qty = qty * 2 WHERE product = 'gizmo';
DELETE FROM orders WHERE note IS NULL AND price < 20;
INSERT INTO orders(customer, product, qty, price, note)
  SELECT customer, product || '-copy', qty, price, note FROM orders WHERE id % 9 = 0;
COMMIT;
VACUUM;
SELECT count(*), sum(qty), count(DISTINCT product) FROM orders;
"""
    db = "shop.db"
    steps = [
        Cmd("create", ["sqlite3", db], stdin=None),   # stdin filled in below
        Cmd("query", ["sqlite3", db], stdin=queries),
        Cmd("update", ["sqlite3", db], stdin=update),
        Cmd("dump", ["sqlite3", db, ".dump"]),
        Cmd("error", ["sqlite3", db, "SELECT * FROM nosuch;"], status=1),
    ]
    # The create script is big; read it from the file the setup wrote (same bytes both modes).
    steps[0].stdin_file = "create.sql"
    return Workload("sqlite3", ["sqlite3"], setup, steps)


# ---------------------------------------------------------------------------------------------
# git

GIT_ID = ["-c", "user.name=Alloc Lens", "-c", "user.email=alloclens@example.invalid"]


def write_tree(wd, files):
    for rel, text in files.items():
        path = os.path.join(wd, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(text)


def git_workload():
    rng = Lcg(777)
    vocab = ["alpha", "beta", "gamma", "delta", "malloc", "free", "arena", "chunk", "slab",
             "page", "span", "bin", "tcache", "extent", "region", "heap"]

    def text(nlines, seed_off=0):
        return "".join(" ".join(vocab[(rng.next(len(vocab)) + seed_off) % len(vocab)]
                                for _ in range(1 + rng.next(9))) + "\n" for _ in range(nlines))

    files1 = {f"doc/chapter{i}.txt": text(60 + 10 * i) for i in range(6)}
    files1.update({f"src/mod{i}/file{j}.c": f"/* module {i} file {j} */\n" + text(40)
                   for i in range(3) for j in range(4)})
    files1["README"] = "A small repository for the alloclens real-program test.\n"
    edits2 = {"doc/chapter1.txt": text(70, 3), "src/mod0/file0.c": "/* rewritten */\n" + text(30),
              "src/new/added.c": text(25)}
    edits3 = {"doc/chapter2.txt": text(90, 5), "README": "Changed, not committed.\n"}

    def setup(wd):
        write_tree(wd, files1)

    def second_change(wd):
        write_tree(wd, edits2)
        os.remove(os.path.join(wd, "src/mod2/file3.c"))

    def third_change(wd):
        write_tree(wd, edits3)

    g = ["git"]
    steps = [
        Cmd("init", g + ["-c", "init.defaultBranch=main", "init", "-q"]),
        Cmd("add", g + ["add", "-A"]),
        Cmd("commit1", g + GIT_ID + ["commit", "-m", "initial import"]),
        second_change,
        Cmd("add2", g + ["add", "-A"]),
        Cmd("commit2", g + GIT_ID + ["commit", "-m", "second: rewrite and add"]),
        third_change,
        Cmd("status", g + ["status"]),
        Cmd("porcelain", g + ["status", "--porcelain=v1"]),
        Cmd("diff", g + ["diff"]),
        Cmd("log-stat", g + ["log", "--stat"]),
        Cmd("log-graph", g + ["log", "--oneline", "--graph", "--all", "--decorate"]),
        Cmd("show", g + ["show", "--stat", "-p", "HEAD~1"]),
        Cmd("diff-tree", g + ["diff", "--numstat", "-M", "HEAD~1", "HEAD"]),
        Cmd("blame", g + ["blame", "-s", "doc/chapter1.txt"]),
        Cmd("grep", g + ["grep", "-n", "tcache"]),
        Cmd("bad-rev", g + ["rev-parse", "--verify", "no-such-branch"], status=128),
        Cmd("gc", g + ["gc", "-q"], children=True),
        Cmd("count", g + ["count-objects", "-v"]),
        Cmd("archive", g + ["archive", "--format=tar", "HEAD"]),
        Cmd("fsck", g + ["fsck", "--no-progress", "--strict"]),
    ]
    env = {"GIT_CONFIG_NOSYSTEM": "1", "GIT_AUTHOR_DATE": "2024-01-02T03:04:05+0000",
           "GIT_COMMITTER_DATE": "2024-01-02T03:04:05+0000", "GIT_PAGER": "cat", "PAGER": "cat",
           "GIT_TERMINAL_PROMPT": "0", "GIT_OPTIONAL_LOCKS": "0"}
    return Workload("git", ["git"], setup, steps, env=env)


# ---------------------------------------------------------------------------------------------
# bash: it defines getenv and setenv itself, answering from its own variable table, which
# tcmalloc's constructor starts before main (it calls setenv): alloclens must read its settings
# from the environment itself.

BASH_SCRIPT = r"""
declare -A count
words=(malloc free arena chunk slab page span bin tcache extent)
for ((i = 0; i < 3000; i++)); do
    w=${words[i % ${#words[@]}]}
    count[$w]=$(( ${count[$w]:-0} + i % 7 ))
    s+="${w:0:2}"
done
for w in "${!count[@]}"; do echo "$w ${count[$w]}"; done | sort
echo "${#s} $(printf '%s\n' "${words[@]}" | sort -r | head -3 | tr '\n' ' ')"
(cd / && echo "subshell in $PWD")
echo "to stderr" >&2
"""


def bash_workload():
    def setup(wd):
        with open(os.path.join(wd, "script.sh"), "w") as f:
            f.write(BASH_SCRIPT)

    steps = [
        Cmd("script", ["bash", "script.sh"], children=True),
        Cmd("exit4", ["bash", "-c", "x=$(seq 100 | tail -1); echo $x; exit 4"], status=4,
            children=True),
    ]
    return Workload("bash", ["bash"], setup, steps)


# ---------------------------------------------------------------------------------------------
# perl and the C toolchain: a hash-heavy perl script, then gcc compiling and linking a C file
# (its driver forks cc1, as, collect2 and ld, each reporting); the program it made runs, and its
# bytes are the same whatever allocator gcc ran under.

PERL_SCRIPT = r"""
use strict;
use warnings;
use Digest::MD5 qw(md5_hex);
my %count;
my @words = map { sprintf("w%05d", ($_ * 7919) % 30011) } 1 .. 120000;
$count{$_}++ for @words;
my @top = (sort { $count{$b} <=> $count{$a} || $a cmp $b } keys %count)[0 .. 4];
my $joined = join(",", map { "$_=$count{$_}" } @top);
my @parts = split /,/, $joined;
print scalar(keys %count), " ", $joined, " ", md5_hex(join("", sort @words)), "\n";
print STDERR "parts ", scalar(@parts), "\n";
exit 5;
"""

TOOLCHAIN_C = r"""
#include <stdio.h>
#include <stdlib.h>
struct node { struct node *next; char word[24]; };
int main(void)
{
    struct node *head = NULL;
    for (int i = 0; i < 5000; i++) {
        struct node *n = malloc(sizeof *n);
        snprintf(n->word, sizeof n->word, "w%05d", (i * 7919) % 5000);
        n->next = head;
        head = n;
    }
    unsigned long h = 5381;
    for (struct node *n = head; n; n = n->next)
        for (const char *c = n->word; *c; c++)
            h = h * 33 + (unsigned char)*c;
    printf("%lu\n", h);
    while (head) {
        struct node *next = head->next;
        free(head);
        head = next;
    }
    return 0;
}
"""


def toolchain_workload():
    def setup(wd):
        for name, text in (("words.pl", PERL_SCRIPT), ("prog.c", TOOLCHAIN_C)):
            with open(os.path.join(wd, name), "w") as f:
                f.write(text)

    steps = [
        Cmd("perl", ["perl", "words.pl"], status=5),
        Cmd("cc", ["gcc", "-O2", "-o", "prog", "prog.c"], children=True),
        Cmd("prog", ["./prog"]),
        Cmd("sum", ["sha256sum", "prog"]),
    ]
    return Workload("toolchain", ["perl", "gcc", "sha256sum"], setup, steps)


# ---------------------------------------------------------------------------------------------
# the C++ container program

def cxx_workload(binary):
    steps = [Cmd("run", [binary])]
    return Workload("cxx_containers", [binary], lambda wd: None, steps)


def valgrind_workload(binary):
    """The C++ program run by valgrind (its launcher, a script and a program, then its static
    tool, which loads the program itself with LD_PRELOAD): the program's report is the main one,
    the launchers write theirs beside it, and nothing is said about the static tool."""
    steps = [Cmd("none", ["valgrind", "-q", "--tool=none", binary], children=True, report_argv=[binary])]
    return Workload("valgrind", ["valgrind", binary], lambda wd: None, steps)


# ---------------------------------------------------------------------------------------------
# running and comparing

class Result:
    def __init__(self, status=None, stdout=b"", stderr=b"", error=None, report=None,
                 children=(), report_error=None):
        self.status = status
        self.stdout = stdout
        self.stderr = stderr
        self.error = error          # timeout or failure to start
        self.report = report
        self.report_error = report_error
        self.children = list(children)   # [(path, dict or exception text)]


def run_plain(cmd, wd, env):
    try:
        p = subprocess.run(cmd.argv, cwd=wd, env=env, input=stdin_of(cmd, wd),
                           capture_output=True, timeout=STEP_TIMEOUT)
        return Result(p.returncode, p.stdout, p.stderr)
    except subprocess.TimeoutExpired as e:
        return Result(None, e.stdout or b"", e.stderr or b"", error=f"timed out after {STEP_TIMEOUT} s")
    except OSError as e:
        return Result(None, error=f"could not start: {e}")


def run_profiled(alloc, cmd, wd, env, repdir, name):
    altest.prime(alloc)
    for old in glob.glob(os.path.join(repdir, name + ".*")):
        os.remove(old)
    res = Result()
    # As altest.run, but the process result survives a report that is not valid JSON.
    out = os.path.join(repdir, f"{name}.json")
    argv = [altest.cli(), "run", "-a", alloc, "-o", out, "--text", os.path.join(repdir, f"{name}.txt"),
            "--", *cmd.argv]
    try:
        p = subprocess.run(argv, cwd=wd, env=env, input=stdin_of(cmd, wd), capture_output=True,
                           timeout=STEP_TIMEOUT)
        res.status, res.stdout, res.stderr = p.returncode, p.stdout, p.stderr
    except subprocess.TimeoutExpired as e:
        res.stdout, res.stderr = e.stdout or b"", e.stderr or b""
        res.error = f"timed out after {STEP_TIMEOUT} s"
    except OSError as e:
        res.error = f"could not start alloclens: {e}"
    if os.path.exists(out):
        try:
            with open(out) as f:
                res.report = json.load(f)
        except (ValueError, OSError) as e:      # json.JSONDecodeError is a ValueError
            res.report_error = f"{os.path.basename(out)} unreadable ({os.path.getsize(out)} bytes): {e}"
    for path in sorted(glob.glob(os.path.join(repdir, name + ".*.json"))):
        try:
            with open(path) as f:
                res.children.append((path, json.load(f)))
        except (ValueError, OSError) as e:
            res.children.append((path, f"unreadable: {e}"))
    return res


def stdin_of(cmd, wd):
    if getattr(cmd, "stdin_file", None):
        with open(os.path.join(wd, cmd.stdin_file), "rb") as f:
            return f.read()
    return cmd.stdin


def fresh_dir(path):
    shutil.rmtree(path, ignore_errors=True)
    os.makedirs(path)


def tree_listing(root):
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for fn in sorted(filenames):
            out.append(os.path.relpath(os.path.join(dirpath, fn), root))
    return out


def run_workload(wl, wd, env, alloc=None, repdir=None):
    """Runs every step of WL in a fresh WD; plain when ALLOC is None. Returns [(Cmd, Result)]."""
    fresh_dir(wd)
    wl.setup(wd)
    results = []
    for i, step in enumerate(wl.steps):
        if not isinstance(step, Cmd):
            step(wd)
            continue
        if alloc is None:
            results.append((step, run_plain(step, wd, env)))
        else:
            results.append((step, run_profiled(alloc, step, wd, env, repdir,
                                               f"{wl.name}-{i:02d}-{step.name}")))
    return results


def show_bytes_diff(label, a, b, limit=25):
    if a == b:
        return ""
    ta = a.decode("utf-8", "replace").splitlines(keepends=True)
    tb = b.decode("utf-8", "replace").splitlines(keepends=True)
    diff = list(difflib.unified_diff(ta, tb, f"{label} plain", f"{label} alloclens", n=1))
    if not diff:   # differs only in bytes that decode alike, or in a trailing newline
        return f"{label}: {len(a)} bytes plain, {len(b)} bytes under alloclens, same text lines\n"
    more = f"... ({len(diff) - limit} more diff lines)\n" if len(diff) > limit else ""
    return "".join(line if line.endswith("\n") else line + "\n" for line in diff[:limit]) + more


def fmt_status(s):
    if s is None:
        return "none"
    return f"killed by signal {-s}" if s < 0 else str(s)


def op_total(report, ops):
    total = 0
    for row in report.get("ops", []) or []:
        if isinstance(row, dict) and row.get("op") in ops:
            total += int(row.get("count", 0) or 0)
    return total


def report_problems(report, alloc, mode, argv=None, status=None):
    """What is wrong with REPORT for a process run under ALLOC in MODE (empty list: nothing)."""
    if not isinstance(report, dict):
        return [f"report is not a JSON object: {report!r:.200}"]
    problems = []
    if report.get("schema") != "alloclens-report/1":
        problems.append(f"schema is {report.get('schema')!r}")
    name = (report.get("allocator") or {}).get("name")
    if name != alloc:
        problems.append(f"allocator.name is {name!r}, requested {alloc!r} "
                        f"(allocator.path {(report.get('allocator') or {}).get('path')!r})")
    if report.get("mode") != mode:
        problems.append(f"mode is {report.get('mode')!r}, ran in {mode!r}")
    prog = report.get("program") or {}
    if argv is not None and prog.get("argv") != list(argv):
        problems.append(f"program.argv is {prog.get('argv')!r:.300}, ran {list(argv)!r:.300}")
    if status is not None and status >= 0 and "exit_status" in prog and prog["exit_status"] != status:
        problems.append(f"program.exit_status is {prog['exit_status']!r}, process exited {status}")
    if status is not None and status < 0 and (prog.get("exit_status"), prog.get("signal")) != (None, -status):
        problems.append(f"program.exit_status is {prog.get('exit_status')!r} and program.signal "
                        f"{prog.get('signal')!r}, the process was killed by signal {-status}")
    allocs, frees = op_total(report, ALLOC_OPS), op_total(report, FREE_OPS)
    if allocs <= 0:
        problems.append(f"no allocation calls counted (ops: {summarize_ops(report)})")
    if frees <= 0:
        problems.append(f"no free/delete calls counted (ops: {summarize_ops(report)})")
    return problems


def summarize_ops(report):
    per = {}
    for row in report.get("ops", []) or []:
        if isinstance(row, dict):
            per[row.get("op")] = per.get(row.get("op"), 0) + int(row.get("count", 0) or 0)
    return ", ".join(f"{k}={v}" for k, v in sorted(per.items(), key=lambda kv: str(kv[0]))) or "none"


def mode_env(env, mode):
    return env if mode == "full" else dict(env, ALLOCLENS_MODE=mode)


def who(alloc, mode):
    return alloc if mode == "full" else f"{alloc} --mode {mode}"


def check_workload(wl, alloc, mode, plain, prof, wd_plain_listing, wd_prof_listing):
    for (step, a), (_, b) in zip(plain, prof):
        label = f"{who(alloc, mode)}: {wl.name} {step.name}"
        # 1. same exit status, stdout and stderr
        detail = ""
        if b.error:
            detail += f"alloclens run: {b.error}\n"
        if a.status != b.status:
            detail += f"exit status {fmt_status(a.status)} plain, {fmt_status(b.status)} under alloclens\n"
        detail += show_bytes_diff("stdout", a.stdout, b.stdout)
        detail += show_bytes_diff("stderr", a.stderr, b.stderr)
        shown = shlex.join(step.argv).replace("\n", "\\n")[:300]
        tap.ok(not detail, f"{label}: exit status, stdout and stderr identical to the plain run",
               f"command: {shown}\n{detail}")
        # 2. the report
        if b.report is None:
            tap.ok(False, f"{label}: report written",
                   f"{b.report_error or 'no report'}; stderr tail:\n"
                   f"{b.stderr[-2000:].decode('utf-8', 'replace')}")
        else:
            probs = report_problems(b.report, alloc, mode, step.report_argv, b.status)
            tap.ok(not probs, f"{label}: report names {alloc}, mode {mode}, and counts malloc-family calls",
                   "\n".join(probs))
        # 3. reports of forked/exec'd children
        if step.children:
            bad = []
            for path, rep in b.children:
                if isinstance(rep, str):
                    bad.append(f"{os.path.basename(path)}: {rep}")
                    continue
                for p in report_problems(rep, alloc, mode):
                    bad.append(f"{os.path.basename(path)}: {p}")
            tap.ok(b.children and not bad,
                   f"{label}: child processes wrote their own reports ({len(b.children)} found)",
                   "no FILE.<pid>.json next to the report" if not b.children else "\n".join(bad[:20]))
    # 4. alloclens left nothing behind in the working directory and the programs made the same files
    extra = sorted(set(wd_prof_listing) - set(wd_plain_listing))
    missing = sorted(set(wd_plain_listing) - set(wd_prof_listing))
    tap.ok(not extra and not missing,
           f"{who(alloc, mode)}: {wl.name}: working directory has the same files",
           f"only under alloclens: {extra[:20]}\nonly plain: {missing[:20]}")


def installed(prog):
    return os.path.isabs(prog) and os.access(prog, os.X_OK) or (not os.path.isabs(prog) and shutil.which(prog))


def check_baseline(wl, plain):
    bad = []
    for step, r in plain:
        if r.error or r.status != step.status:
            bad.append(f"{step.name}: exit status {fmt_status(r.status)}, expected "
                       f"{fmt_status(step.status)} {r.error or ''}\n"
                       f"stderr: {r.stderr[-500:].decode('utf-8', 'replace')}")
    return tap.ok(not bad, f"{wl.name}: plain run behaves as expected (baseline)", "\n".join(bad))


# ---------------------------------------------------------------------------------------------
# redis-server driven by redis-benchmark

def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def redis_ping(port):
    try:
        p = subprocess.run(["redis-cli", "-h", "127.0.0.1", "-p", str(port), "ping"],
                           capture_output=True, timeout=5)
        return p.returncode == 0 and p.stdout.strip() == b"PONG"
    except subprocess.TimeoutExpired:
        return False


def redis_session(alloc, top, env, mode="full"):
    """Starts redis-server (under alloclens when ALLOC), benchmarks it, shuts it down.
    Returns a dict describing what happened."""
    tag = f"{alloc}-{mode}" if alloc else "plain"
    wd = os.path.join(top, "redis", tag)
    fresh_dir(wd)
    port = free_port()
    server = ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
              "--appendonly", "no", "--daemonize", "no", "--dir", wd]
    rep_json = os.path.join(top, "redis", f"redis-{tag}.json")
    argv = server
    if alloc:
        argv = [altest.cli(), "run", "-a", alloc, "-o", rep_json,
                "--text", os.path.join(top, "redis", f"redis-{tag}.txt"), "--"] + server
    out = {"port": port, "server": server, "report": None, "report_path": rep_json}
    log = open(os.path.join(top, "redis", f"redis-{tag}.log"), "wb")
    t0 = time.monotonic()
    proc = subprocess.Popen(argv, cwd=wd, env=env, stdout=log, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL)
    try:
        ready = False
        while time.monotonic() - t0 < 30 and proc.poll() is None:
            if redis_ping(port):
                ready = True
                break
            time.sleep(0.1)
        out["ready"] = ready
        if ready:
            try:
                b = subprocess.run(["redis-benchmark", "-h", "127.0.0.1", "-p", str(port),
                                    "-n", "20000", "-c", "20", "-q", "-t", "set,get,lpush,lpop"],
                                   capture_output=True, timeout=STEP_TIMEOUT, env=env)
                out["bench_status"], out["bench_out"] = b.returncode, b.stdout + b.stderr
            except subprocess.TimeoutExpired as e:
                out["bench_status"], out["bench_out"] = None, (e.stdout or b"") + b"\n(timed out)"
            try:
                s = subprocess.run(["redis-cli", "-h", "127.0.0.1", "-p", str(port),
                                    "shutdown", "nosave"], capture_output=True, timeout=20)
                out["shutdown_out"] = s.stdout + s.stderr
            except subprocess.TimeoutExpired:
                out["shutdown_out"] = b"(redis-cli shutdown timed out)"
        try:
            out["status"] = proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            out["status"] = None
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        log.close()
    with open(os.path.join(top, "redis", f"redis-{tag}.log"), "rb") as f:
        out["log"] = f.read()
    out["files"] = tree_listing(wd)
    if alloc and os.path.exists(rep_json):
        try:
            with open(rep_json) as f:
                out["report"] = json.load(f)
        except ValueError as e:
            out["report"] = f"unreadable ({os.path.getsize(rep_json)} bytes): {e}"
    out["seconds"] = time.monotonic() - t0
    return out


def bench_ok(r):
    text = r.get("bench_out", b"").decode("utf-8", "replace")
    # -q prints one line per test, "SET: 123456.79 requests per second, p50=..." (after \r updates)
    done = [t for t in ("SET", "GET", "LPUSH", "LPOP")
            if any(line.split("\r")[-1].strip().startswith(t + ":") and "requests per second" in line
                   for line in text.splitlines())]
    return r.get("bench_status") == 0 and len(done) == 4, text


def check_redis(alloc, mode, plain, prof):
    label = f"{who(alloc, mode)}: redis-server"
    if not prof.get("ready"):
        tap.ok(False, f"{label}: server came up under alloclens",
               f"exit status {fmt_status(prof.get('status'))}; log:\n"
               + prof["log"][-3000:].decode("utf-8", "replace"))
        return
    ok, text = bench_ok(prof)
    tap.ok(ok, f"{label}: redis-benchmark set,get,lpush,lpop completed",
           f"redis-benchmark status {fmt_status(prof.get('bench_status'))}\n{text[-2000:]}")
    tap.ok(prof.get("status") == plain.get("status") == 0,
           f"{label}: shut down cleanly, exit status {fmt_status(prof.get('status'))} "
           f"(plain {fmt_status(plain.get('status'))})",
           "shutdown: " + prof.get("shutdown_out", b"").decode("utf-8", "replace")
           + "\nlog tail:\n" + prof["log"][-2000:].decode("utf-8", "replace"))
    rep = prof.get("report")
    if rep is None or isinstance(rep, str):
        tap.ok(False, f"{label}: report written",
               f"{prof['report_path']}: {rep or 'missing'}\nserver log tail (alloclens writes there too):\n"
               + prof["log"][-1500:].decode("utf-8", "replace"))
    else:
        probs = report_problems(rep, alloc, mode, prof["server"], prof.get("status"))
        tap.ok(not probs, f"{label}: report names {alloc}, mode {mode}, and counts malloc-family calls",
               "\n".join(probs))
    tap.ok(prof["files"] == plain["files"], f"{label}: working directory has the same files",
           f"plain {plain['files'][:20]}, under alloclens {prof['files'][:20]}")


# ---------------------------------------------------------------------------------------------

def main():
    if len(sys.argv) != 2:
        sys.exit("usage: test_real_programs.py CXX_CONTAINERS_BINARY")
    cxx_bin = os.path.abspath(sys.argv[1])
    start = time.monotonic()
    top = altest.tmpdir()
    home, tmp, reports = (os.path.join(top, d) for d in ("home", "tmp", "reports"))
    for d in (home, tmp, reports):
        os.makedirs(d)
    env0 = base_env(home, tmp)

    try:
        allocs = altest.allocators()
    except (subprocess.CalledProcessError, OSError) as e:
        tap.ok(False, "alloclens allocators runs", str(e))
        tap.done()
    names = sorted(allocs)
    tap.ok("glibc" in names, f"alloclens allocators found {', '.join(names) or 'nothing'}",
           "glibc missing from `alloclens allocators`")
    tap.diag(f"work directory {top}")

    workloads = [python_workload(), sqlite_workload(), git_workload(), bash_workload(),
                 toolchain_workload(), cxx_workload(cxx_bin), valgrind_workload(cxx_bin)]
    for wl in workloads:
        missing = [p for p in wl.programs if not p or not installed(p)]
        if missing:
            tap.skip(f"{wl.name}: real program", f"{', '.join(str(m) for m in missing)} not installed")
            continue
        env = dict(env0, **wl.env)
        wd = os.path.join(top, "work", wl.name)      # same path in every mode: output may name it
        t0 = time.monotonic()
        plain = run_workload(wl, wd, env)
        plain_listing = tree_listing(wd)
        if not check_baseline(wl, plain):
            continue
        for alloc in names:
            for mode in MODES:
                repdir = os.path.join(reports, alloc, mode)
                os.makedirs(repdir, exist_ok=True)
                prof = run_workload(wl, wd, mode_env(env, mode), alloc, repdir)
                check_workload(wl, alloc, mode, plain, prof, plain_listing, tree_listing(wd))
        tap.diag(f"{wl.name}: {time.monotonic() - t0:.1f} s for the plain run and {len(names)} "
                 f"allocators in {len(MODES)} modes")

    missing = [p for p in ("redis-server", "redis-benchmark", "redis-cli") if not shutil.which(p)]
    if missing:
        tap.skip("redis-server: real program", f"{', '.join(missing)} not installed")
    else:
        t0 = time.monotonic()
        plain = redis_session(None, top, env0)
        ok, text = bench_ok(plain)
        if tap.ok(plain.get("ready") and ok and plain.get("status") == 0,
                  "redis-server: plain run behaves as expected (baseline)",
                  f"ready {plain.get('ready')}, exit status {fmt_status(plain.get('status'))}\n"
                  f"{text[-1000:]}\nlog:\n{plain['log'][-1500:].decode('utf-8', 'replace')}"):
            for alloc in names:
                for mode in MODES:
                    prof = redis_session(alloc, top, mode_env(env0, mode), mode)
                    check_redis(alloc, mode, plain, prof)
                    tap.diag(f"{who(alloc, mode)}: redis-server session {prof['seconds']:.1f} s")
        tap.diag(f"redis-server: {time.monotonic() - t0:.1f} s")

    tap.diag(f"total {time.monotonic() - start:.1f} s")
    tap.done()


if __name__ == "__main__":
    main()
