#!/usr/bin/env python3
"""alloclens report: a saved JSON report rendered again, as text and as HTML.

usage: test_report.py EXACT_COUNTS

A report of EXACT_COUNTS under alloclens (full mode) is rendered both ways: every row of the
JSON ops table must be in the text and in the HTML page's ops table with its exact count; every
section is there (or says it is unavailable, with the report's reason, as memory waste does in
--mode time); the program's arguments are escaped in the HTML; bad input (no file, not JSON, not
a report, a report of another schema, JSON that only a lenient parser takes, an unwritable --html
path, the report itself as --html, wrong arguments) gets one line on stderr and status 2 (the
place of a JSON error as its offset in the file); '-' reads the report from stdin; a failed write one line with its reason and status 1; fields of other
shapes than the schema's are rendered as they are, never a crash.
Every field of the full-mode report is documented in docs/report-schema.md.
"""
import html.parser
import json
import os
import re
import subprocess
import sys

import altest

SECTIONS = ("Operations", "Memory waste", "The allocator's system calls", "Locks",
            "Events per call", "Allocation sites")


class Tables(html.parser.HTMLParser):
    """Every table of a page as rows of cell texts; h1 and h2 texts."""

    def __init__(self):
        super().__init__()
        self.tables, self.h1, self.h2 = [], [], []
        self.cell = None
        self.head = None

    def handle_starttag(self, tag, attrs):
        if tag == "table":
            self.tables.append([])
        elif tag == "tr":
            self.tables[-1].append([])
        elif tag in ("td", "th"):
            self.cell = ""
        elif tag in ("h1", "h2"):
            self.head = ""

    def handle_endtag(self, tag):
        if tag in ("td", "th") and self.cell is not None:
            self.tables[-1][-1].append(self.cell)
            self.cell = None
        elif tag in ("h1", "h2") and self.head is not None:
            (self.h1 if tag == "h1" else self.h2).append(self.head)
            self.head = None

    def handle_data(self, data):
        if self.cell is not None:
            self.cell += data
        if self.head is not None:
            self.head += data


SCHEMA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "docs", "report-schema.md")
# Objects whose keys are names (ops, syscalls by op and size class), not fields.
NAME_MAPS = {"counted_ops", "per_op", "by_op", "by_op_size_class"}


def undocumented(rep):
    """The report's field names docs/report-schema.md does not show as "name": ..., each with
    the first path it was found at."""
    with open(SCHEMA) as f:
        documented = set(re.findall(r'"([A-Za-z_][A-Za-z0-9_]*)"\s*:', f.read()))
    missing = {}

    def walk(o, path):
        if isinstance(o, dict):
            for k, v in o.items():
                if k not in documented:
                    missing.setdefault(k, f"{path}.{k}")
                if k not in NAME_MAPS:
                    walk(v, f"{path}.{k}")
        elif isinstance(o, list):
            for x in o:
                walk(x, f"{path}[]")
    walk(rep, "")
    return sorted(missing.values())


def report(args, tmp):
    return subprocess.run([altest.cli(), "report", *args], capture_output=True, text=True, cwd=tmp,
                          timeout=60)


def ops_rows(rep):
    return {(r["op"], r["size_class"], r["reuse"], r["phase"]): str(r["count"]) for r in rep["ops"]}


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    prog = sys.argv[1]
    tap = altest.Tap()
    tmp = altest.tmpdir()
    odd = '<b>&"x"'
    # Sampled densely, so that the sites section has rows to show.
    proc, rep = altest.run("glibc", [prog, "--scale", "1", "--threads", "2"], tmp, name="full",
                           extra=("--sample-rate", "4096"))
    if not tap.ok(rep is not None, "a full-mode report to render", proc.stderr.decode(errors="replace")[-800:]):
        tap.done()
    missing = undocumented(rep)
    tap.ok(rep["sites"].get("top") and rep["syscalls"] and not missing,
           "every field of the report (sites and syscalls rows included) is in docs/report-schema.md",
           f"undocumented: {missing}")
    path = os.path.join(tmp, "full.json")
    want = ops_rows(rep)
    th, runtime = rep["threads"], rep["program"]["runtime_ns"]
    tap.ok(abs(th["serial_ns"] + th["parallel_ns"] - runtime) <= 0.05 * runtime + 1e6,
           "serial and parallel time add up to the runtime (5%, 1 ms)",
           f"serial {th['serial_ns']} + parallel {th['parallel_ns']} against runtime {runtime}")

    p = report([path], tmp)
    tap.ok(p.returncode == 0 and not p.stderr, "report renders as text, exit 0", p.stderr)
    got = {}
    for line in p.stdout.splitlines():
        f = line.split()
        if len(f) >= 5 and (f[0], f[1], f[2], f[3]) in want:
            got[(f[0], f[1], f[2], f[3])] = f[4]
    tap.ok(got == want, "text: every ops row with its exact count",
           f"missing or different: {sorted(set(want.items()) ^ set(got.items()))[:10]}")
    missing = [s for s in SECTIONS if f"== {s}" not in p.stdout]
    tap.ok(not missing, "text: every section", f"missing: {missing}")
    peak = rep["memory"]["peak"]
    tap.ok(any(l.split()[:1] == ["peak"] and l.split()[-1] == str(peak["live_objects"])
               for l in p.stdout.splitlines()),
           "text: the peak's live objects", f"peak {peak['live_objects']}\n{p.stdout[-1500:]}")

    out = os.path.join(tmp, "r.html")
    p = report([path, "--html", out], tmp)
    tap.ok(p.returncode == 0 and not p.stdout and os.path.isfile(out), "report --html writes the page, exit 0",
           p.stderr)
    page = Tables()
    with open(out) as f:
        page.feed(f.read())
    ops = next((t for t in page.tables if t and t[0][:1] == ["op"]), [])
    got = {tuple(r[:4]): r[4] for r in ops[1:]}
    tap.ok(got == want, "html: every ops row with its exact count",
           f"missing or different: {sorted(set(want.items()) ^ set(got.items()))[:10]}")
    tap.ok(page.h2 == list(SECTIONS), "html: every section, in order", f"{page.h2}")

    # Escaping: a program argument with markup in it comes out as text.
    altest.run("glibc", [sys.executable, "-c", "pass", odd], tmp, name="odd")
    p = report([os.path.join(tmp, "odd.json"), "--html", "-"], tmp)
    page = Tables()
    page.feed(p.stdout)
    tap.ok(p.returncode == 0 and page.h1 and page.h1[0].endswith(f"$'{odd}'") and odd not in p.stdout,
           "html: the program's arguments are escaped", f"h1 {page.h1}")

    # Text mode: the arguments as shell words, as the program's own text report shows them, and
    # no control character of a report's strings reaches the terminal as it is.
    args = ["two\nlines", "a\ttab", "\x1b[31mred", "x\x01y", "it's", "sp ace", "plain"]
    altest.run("glibc", [sys.executable, "-c", "pass", *args], tmp, name="ctl")
    p = report([os.path.join(tmp, "ctl.json")], tmp)
    with open(os.path.join(tmp, "ctl.txt")) as f:
        own = next((l for l in f.read().splitlines() if l.startswith("== alloclens report")), None)
    first = p.stdout.splitlines()[:1]
    tap.ok(p.returncode == 0 and own is not None and first == [own]
           and own.endswith(" $'two\\nlines' $'a\\ttab' $'\\x1b[31mred' $'x\\x01y' $'it\\'s' $'sp ace' plain"),
           "text: the arguments as shell words, the line the program's own report begins with",
           f"report: {first}\nprogram's own: {own!r}")

    def controls(text):
        return sorted({c for c in text if (ord(c) < 0x20 and c != "\n") or ord(c) == 0x7f})

    crafted = json.loads(json.dumps(rep))
    bad = "\x1b[2J\x01\nnext\tline"
    crafted["allocator"].update(name="glibc" + bad, version=bad, path=bad, style=bad)
    crafted["mode"] = bad
    crafted["ops"][0]["op"] = bad
    crafted["memory"]["heap_source"] = bad
    crafted["sites"]["top"][0]["stack"][0] = bad
    crafted["sites"]["symbols"] = bad
    crafted["counters"] = dict(rep.get("counters") or {}, available=True, source=bad,
                               counted_ops={bad: 1, "malloc": 2},
                               events=[{"name": bad, "per_op": {bad: 1.0, "malloc": 2.0}}])
    crafted["syscalls"] = [{"name": bad, "count": 1, "ns_total": 2}]
    crafted["syscalls_info"] = dict(rep["syscalls_info"], available=True)
    crafted["locks"] = {"available": False, "reason": bad}
    with open(os.path.join(tmp, "crafted.json"), "w") as f:
        json.dump(crafted, f)
    p = subprocess.run([altest.cli(), "report", os.path.join(tmp, "crafted.json")], capture_output=True,
                       cwd=tmp, timeout=60)
    out = p.stdout.decode(errors="replace")
    tap.ok(p.returncode == 0 and not controls(out) and out.count("\\x1b[2J\\x01\\nnext\\tline") >= 12,
           "text: a crafted report's control characters (ESC, \\x01, newline, tab) written as escapes "
           "in every key-value line, note, table head, cell and stack frame",
           f"status {p.returncode}; raw controls {controls(out)}\n{out[:3000]}")

    # A section the report marks unavailable says so, with its reason.
    proc, rep3 = altest.run("glibc", [prog, "--scale", "0", "--threads", "1"], tmp, name="time",
                            extra=("--mode", "time"))
    p = report([os.path.join(tmp, "time.json")], tmp)
    reason = (rep3 or {}).get("memory", {}).get("reason", "?")
    tap.ok(p.returncode == 0 and f"unavailable: {reason}" in p.stdout,
           "text: memory waste in --mode time is unavailable, with the report's reason", p.stdout[-1200:])

    # --mode sample times no call: its times are null (with the reason), not 0, and read so by
    # the text report and by alloclens report, never as 0 or nan.
    proc, rep5 = altest.run("glibc", [prog, "--scale", "0", "--threads", "2"], tmp, name="sample",
                            extra=("--mode", "sample"))
    rep5 = rep5 or {"ops": []}
    timing_keys = ("cycles_total", "cycles_mean", "cycles_p50", "cycles_p99", "cycles_p999",
                   "ns_mean", "ns_p50", "ns_p99", "ns_p999")
    tap.ok(rep5["ops"] and "allocator_time_ns" in rep5 and rep5["allocator_time_ns"] is None
           and rep5.get("allocator_time_reason") == "--mode sample times no call"
           and rep5.get("timing", {}).get("rdtsc_overhead_cycles", 0) is None
           and all(r["count"] > 0 and r["timed"] == 0 and all(k in r and r[k] is None for k in timing_keys)
                   for r in rep5["ops"]),
           "--mode sample: allocator_time_ns null with its reason, every row's times null",
           json.dumps({k: rep5.get(k) for k in ("allocator_time_ns", "allocator_time_reason", "timing")})
           + "\n" + json.dumps(rep5["ops"][:2]))
    with open(os.path.join(tmp, "sample.txt")) as f:
        own = f.read()
    line = [l for l in own.splitlines() if l.startswith("in allocator")]
    head = [l for l in own.splitlines() if l.startswith("op ")]
    tap.ok(line and "not timed (--mode sample)" in line[0] and " us " not in line[0] and "%" not in line[0]
           and head and "ns" not in head[0] and "cyc" not in head[0],
           "--mode sample: the text report says the allocator is not timed, its ops table has no times",
           own[:1500])
    for args in ([os.path.join(tmp, "sample.json")], [os.path.join(tmp, "sample.json"), "--html", "-"]):
        p = report(args, tmp)
        ops_lines = [l for l in p.stdout.splitlines() if l.split()[:1] and l.split()[0] in ("malloc", "free")]
        tap.ok(p.returncode == 0 and not p.stderr and not re.search(r"\bnan\b", p.stdout, re.I)
               and "not timed: --mode sample times no call" in p.stdout
               and (len(args) > 1 or (ops_lines and all(l.split()[-4:] == ["-"] * 4 for l in ops_lines))),
               f"report{' --html' if len(args) > 1 else ''} of a --mode sample report: 'not timed' with the "
               "reason, '-' for the times, no nan", f"status {p.returncode}\n{p.stdout[:2500]}\n{p.stderr}")

    # Sites with no peak (the sampler saw none: no samples, getrusage refused) say so, in
    # words, not as "the none peak" at a time of 0.
    nopeak = json.loads(json.dumps(rep))
    nopeak["sites"].update(peak_source="none", peak_time_ns=0)
    with open(os.path.join(tmp, "nopeak.json"), "w") as f:
        json.dump(nopeak, f)
    p = report([os.path.join(tmp, "nopeak.json")], tmp)
    line = [l for l in p.stdout.splitlines() if "live at the peak" in l]
    tap.ok(p.returncode == 0 and len(line) == 1 and "(estimated, no peak seen)" in line[0]
           and "none" not in line[0], "text: sites with no peak seen say so", p.stdout[-1500:])

    # A process ended by a signal: its report has no exit status; the runtime line says why.
    proc, rep4 = altest.run("glibc", ["sh", "-c", "kill -TERM $$"], tmp, name="term")
    p = report([os.path.join(tmp, "term.json")], tmp)
    tap.ok(proc.returncode == -15 and (rep4 or {}).get("program", {}).get("signal") == 15
           and "ended by signal 15 (SIGTERM)" in p.stdout,
           "text: a process ended by SIGTERM: the runtime line says so",
           f"status {proc.returncode}; {(rep4 or {}).get('program')}\n{p.stdout[:600]}")

    # A report whose fields have other shapes than the schema's (edited by hand, or from another
    # tool): rendered with what it has, never a crash.
    def reshaped(edit):
        r = json.loads(json.dumps(rep))
        edit(r)
        return r
    counters = dict(rep.get("counters") or {}, available=True)
    shapes = {
        "counted_ops missing": lambda r: r.update(counters={k: v for k, v in counters.items() if k != "counted_ops"}),
        "counted_ops null": lambda r: r.update(counters=dict(counters, counted_ops=None)),
        "counted_ops an array": lambda r: r.update(counters=dict(counters, counted_ops=[1, 2])),
        "a size class without its size": lambda r: [c.pop("size", None) for c in r["memory"]["peak"]["size_classes"]],
        "size classes as numbers": lambda r: r["memory"]["peak"].update(size_classes=[1, 2, 3]),
        "argv and stacks of nulls": lambda r: (r["program"].update(argv=[None, 3]),
                                               [x.update(stack=[None, 1]) for x in r["sites"]["top"]]),
    }
    for what, edit in shapes.items():
        odd_path = os.path.join(tmp, "reshaped.json")
        with open(odd_path, "w") as f:
            json.dump(reshaped(edit), f)
        for args in ([odd_path], [odd_path, "--html", "-"]):
            p = report(args, tmp)
            tap.ok(p.returncode == 0 and p.stdout and not p.stderr,
                   f"report{' --html' if len(args) > 1 else ''}: {what}: rendered, status 0",
                   f"status {p.returncode}\nstderr:\n{p.stderr[-500:]}")

    # Bad input: one line, status 2.
    notjson = os.path.join(tmp, "notjson.json")
    with open(notjson, "w") as f:
        f.write("this is not json\n")
    empty = os.path.join(tmp, "empty.json")
    with open(empty, "w") as f:
        f.write("{}\n")
    for args, what in (([os.path.join(tmp, "missing.json")], "missing.json"), ([notjson], "notjson.json"),
                       ([empty], "not an alloclens report"), ([path, "--html", "/nonexistent/d/r.html"], "/nonexistent"),
                       ([], "no report"), ([path, path], "one report"), ([path, "--bogus"], "--bogus"),
                       ([path, "--html"], "--html"), ([path, "--html", path], "overwritten")):
        p = report(args, tmp)
        err = p.stderr.strip().splitlines()
        tap.ok(p.returncode == 2 and len(err) == 1 and what in err[0] and not p.stdout,
               f"report {' '.join(os.path.basename(a) for a in args)}: one line naming '{what}', status 2",
               f"status {p.returncode}\nstderr:\n{p.stderr}")
    with open(path) as f:
        tap.ok(json.load(f) == rep, "the report named by --html too is left as it was", "changed")

    # Only a report of this schema, read as strict JSON, is rendered: anything else is one line
    # naming the file and what was found in it, status 2.
    with open(path) as f:
        text = f.read().rstrip()
    body = text[:-1].rstrip()  # the report without its closing brace, to append fields to
    cases = {
        "no_schema.json": ('{"ops": 5}', r'no_schema\.json: not an alloclens report: it has no "schema" field'),
        "v99.json": ('{"schema": "alloclens-report/99", "ops": []}',
                     r'v99\.json: not an alloclens report of this version: its schema is "alloclens-report/99", '
                     r'this version reads "alloclens-report/1"$'),
        "array.json": ('[1, 2]', r'array\.json: not an alloclens report: the JSON is not an object$'),
        "garbage_after.json": (text + "\nGARBAGE {",
                               rf"garbage_after\.json: not JSON: 'GARBAGE' is not a JSON value at byte {len(text) + 1}$"),
        "brace_after.json": (text + " }", rf"brace_after\.json: not JSON: .* at byte {len(text) + 1}$"),
        "single_quote.json": (body + ", 'x': 1}", rf"single_quote\.json: not JSON: a single quote .* at byte {len(body) + 2}$"),
        "nan.json": (body + ', "x": NaN}', rf"nan\.json: not JSON: 'NaN' is not a JSON value at byte {len(body) + 7}$"),
        "infinity.json": (body + ', "x": -Infinity}', rf"infinity\.json: not JSON: '-Infinity' is not a JSON value at byte {len(body) + 7}$"),
        "comment.json": (body + ', /* c */ "x": 1}', rf"comment\.json: not JSON: .* at byte {len(body) + 2}$"),
        "trailing_comma.json": (body + ",}", rf"trailing_comma\.json: not JSON: .* at byte {len(body) + 1}$"),
        # An error past json-c's 64 KiB chunks is placed in the file, not in its last chunk.
        "late_error.json": (body + ', "pad": "' + "x" * 300000 + '", "x": tru}',
                            rf"late_error\.json: not JSON: .* at byte {len(body) + 300018}$"),
    }
    for name, (content, pattern) in cases.items():
        bad = os.path.join(tmp, name)
        with open(bad, "w") as f:
            f.write(content)
        p = report([bad], tmp)
        err = p.stderr.strip().splitlines()
        tap.ok(p.returncode == 2 and len(err) == 1 and re.search("^alloclens: cannot read .*" + pattern, err[0])
               and not p.stdout, f"report {name}: one line saying what is wrong and where, status 2",
               f"status {p.returncode}, want /{pattern}/\nstderr:\n{p.stderr}")
    # Whitespace after the report is no error; '-' reads the report from stdin.
    spaced = os.path.join(tmp, "spaced.json")
    with open(spaced, "w") as f:
        f.write(text + "\n \t\r\n")
    want_text = report([path], tmp).stdout
    p = report([spaced], tmp)
    tap.ok(p.returncode == 0 and not p.stderr and p.stdout == want_text,
           "report: whitespace after the JSON is no error", f"status {p.returncode}\nstderr:\n{p.stderr}")
    with open(path) as f:
        p = subprocess.run([altest.cli(), "report", "-"], stdin=f, capture_output=True, text=True, cwd=tmp, timeout=60)
    tap.ok(p.returncode == 0 and not p.stderr and p.stdout == want_text,
           "report -: the report read from stdin, rendered as from the file", f"status {p.returncode}\nstderr:\n{p.stderr}")
    p = subprocess.run([altest.cli(), "report", "-"], input='{"schema": 1}', capture_output=True, text=True,
                       cwd=tmp, timeout=60)
    tap.ok(p.returncode == 2 and p.stderr == "alloclens: cannot read the report on stdin: not an alloclens report "
           'of this version: its schema is 1, this version reads "alloclens-report/1"\n',
           "report - with a bad report: one line naming stdin, status 2", f"status {p.returncode}\nstderr:\n{p.stderr}")
    # A failed write says why, status 1.
    if os.path.exists("/dev/full"):
        p = report([path, "--html", "/dev/full"], tmp)
        err = p.stderr.strip().splitlines()
        tap.ok(p.returncode == 1 and len(err) == 1 and os.strerror(28) in err[0],
               "report --html /dev/full: one line with the reason, status 1",
               f"status {p.returncode}\nstderr:\n{p.stderr}")
    tap.done()


if __name__ == "__main__":
    main()
