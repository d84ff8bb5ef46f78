#!/usr/bin/env python3
"""Where reports go, and what they say of the command line.

usage: test_report_paths.py

- `--text /dev/stderr` with the program's stderr appended to a log: the log keeps what it held
  and the program's lines, the report after them (it was emptied and overwritten);
- `-o /dev/stdout` with stdout on a file: the JSON whole, the program's output after it (its
  stdio buffer, flushed after the report, overwrote the JSON's first bytes);
- a report cut short by `ulimit -f` through a symbolic link: the link is not removed (the path
  was, whatever it named: as root, /dev/stderr itself);
- `-o /dev/stdout` with children: their reports on the same stream, not files in /dev;
- the program's stdout a socket: the report written on it (it could not be opened by name);
- `-o FIFO` with no reader: the program ends as it would, one line says why (it waited for a
  reader for ever with SIGTERM blocked);
- a side report whose name would pass PATH_MAX: one line, no file with a name cut short;
- 5000 arguments: all in the JSON (it stopped at 4 KiB, the last one cut), the text header says
  where it is cut; arguments with control bytes, spaces and quotes read as one shell word each
  in the text header, no escape sequence in it;
- jemalloc's start-up (the first call, made before the program's run began) is not counted in
  the run's share of time inside the allocator (/bin/true read 139%).
"""
import json
import os
import shutil
import subprocess

import altest

tap = altest.Tap()
tmp = altest.tmpdir()
A = altest.cli()
SH = "echo out-line; echo err-line >&2"


def run(args, **kw):
    return subprocess.run([A, "run", *args], capture_output=True, timeout=60, **kw)


# --text /dev/stderr, stderr appended to a log.
log = os.path.join(tmp, "log.txt")
with open(log, "w") as f:
    f.write("old line\n")
with open(log, "a") as err:
    p = subprocess.run([A, "run", "--text", "/dev/stderr", "--", "sh", "-c", SH], stdout=subprocess.PIPE,
                       stderr=err, timeout=60)
text = open(log).read()
tap.ok(p.returncode == 0 and text.startswith("old line\nerr-line\n") and "== alloclens report" in text,
       "--text /dev/stderr on an appended log: the log's line and the program's, then the report", text[:300])

# -o /dev/stdout, stdout on a file.
out = os.path.join(tmp, "out.txt")
with open(out, "w") as f:
    p = subprocess.run([A, "run", "-o", "/dev/stdout", "--text", "off", "--", "sh", "-c", SH], stdout=f,
                       stderr=subprocess.PIPE, timeout=60)
data = open(out).read()
# The program's line before or after the report (sh writes it at once; stdio at exit), neither cut.
body = data[len("out-line\n"):] if data.startswith("out-line\n") else data
try:
    rep, end = json.JSONDecoder().raw_decode(body)
    rest = (body[end:] if body is not data else body[end:].replace("out-line", "", 1)).strip()
except ValueError as e:
    rep, rest = None, str(e)
tap.ok(p.returncode == 0 and isinstance(rep, dict) and rep.get("schema", "").startswith("alloclens-report/")
       and rest == "" and data.splitlines().count("out-line") == 1,
       "-o /dev/stdout on a file: the JSON whole, and the program's output", data[:200] + " ... " + data[-200:])

# -o /dev/stdout with children: their reports go to the same stream (they were made as files
# /dev/stdout.<pid>.json, in /dev); a child that closed its stdout (coreutils) gets one line.
before = set(os.listdir("/dev"))
with open(os.path.join(tmp, "kids.txt"), "w") as f:
    p = subprocess.run([A, "run", "-o", "/dev/stdout", "--text", "off", "--", "sh", "-c", "echo hi; sh -c 'echo x'; true"],
                       stdout=f, stderr=subprocess.PIPE, timeout=60)
made = sorted(set(os.listdir("/dev")) - before)
for m in made:
    if m.startswith("stdout."):
        os.unlink(os.path.join("/dev", m))
data = open(os.path.join(tmp, "kids.txt")).read()
tap.ok(p.returncode == 0 and not [m for m in made if m.startswith("stdout.")] and data.count('"schema"') >= 2,
       "-o /dev/stdout with children: their reports on the same stream, no file made in /dev",
       f"made {made}; {data.count(chr(34) + 'schema' + chr(34))} reports; stderr {p.stderr.decode()[-300:]}")

# The program's stdout a socket (journald's streams): it cannot be opened by its name, and the
# report was lost with a line blaming a FIFO; it is written through the program's descriptor.
import socket
for args, what in ((["--text", "/dev/stdout"], "== alloclens report"), (["--text", "off", "-o", "/dev/stdout"], '"schema"')):
    a, b = socket.socketpair()
    p = subprocess.Popen([A, "run", *args, "--", "true"], stdout=b, stderr=subprocess.PIPE)
    b.close()
    got = b""
    while chunk := a.recv(65536):
        got += chunk
    a.close()
    err = p.communicate(timeout=60)[1].decode()
    tap.ok(p.returncode == 0 and what in got.decode(errors="replace") and not err,
           f"{' '.join(args)} with stdout a socket: the report on the socket, nothing on stderr", err[-300:])

# A report cut short through a symbolic link: the link stays.
link = os.path.join(tmp, "to-stderr")
os.symlink("/proc/self/fd/2", link)
errlog = os.path.join(tmp, "cut.txt")
with open(errlog, "w") as err:
    p = subprocess.run(["sh", "-c", f'ulimit -f 1; exec "$0" run --text "$1" -- /bin/true', A, link],
                       stderr=err, timeout=60)
tap.ok(os.path.islink(link) and p.returncode == 0,
       "a report cut short (ulimit -f) through a symbolic link: the link is not removed",
       f"status {p.returncode}, link there: {os.path.islink(link)}")

# -o FIFO with no reader.
fifo = os.path.join(tmp, "fifo")
os.mkfifo(fifo)
try:
    p = run(["-o", fifo, "--text", "off", "--", "sh", "-c", "exit 3"])
    lines = p.stderr.decode().splitlines()
    tap.ok(p.returncode == 3 and len(lines) == 1 and "FIFO with no reader" in lines[0] and fifo in lines[0],
           "-o FIFO with no reader: the program's status, one line naming the FIFO", p.stderr.decode())
except subprocess.TimeoutExpired:
    tap.ok(False, "-o FIFO with no reader: the program's status, one line naming the FIFO", "no exit in 60 s")
# Its children too (a side report opened the FIFO and waited for a reader).
try:
    p = run(["-o", fifo, "--text", "off", "--", "sh", "-c", "ls / >/dev/null; exit 4"])
    lines = p.stderr.decode().splitlines()
    tap.ok(p.returncode == 4 and len(lines) == 2 and all("FIFO with no reader" in l for l in lines),
           "-o FIFO with no reader, a child writing its own report: no wait, one line each", p.stderr.decode())
except subprocess.TimeoutExpired:
    tap.ok(False, "-o FIFO with no reader, a child writing its own report: no wait, one line each",
           "no exit in 60 s")

# A side report's name past PATH_MAX.
deep = tmp
while len(deep) < 4000:
    deep = os.path.join(deep, "d" * min(200, 4000 - len(deep) + 10))
os.makedirs(deep, exist_ok=True)
main = os.path.join(deep, "r" * (4095 - len(deep) - 6) + ".json")  # 4095 bytes; r.<pid>.json pass it
# The library itself (the CLI refuses such a path at once).
env = dict(os.environ, LD_PRELOAD=altest.so(), ALLOCLENS_OUTPUT=main, ALLOCLENS_TEXT="off")
p = subprocess.run(["sh", "-c", "ls / >/dev/null; true"], env=env, capture_output=True, timeout=60)
side = [f for f in os.listdir(deep) if f != os.path.basename(main)]
msgs = [m for m in p.stderr.decode().splitlines() if "File name too long" in m]
tap.ok(p.returncode == 0 and os.path.exists(main) and not side and len(msgs) >= 1,
       "a side report whose name passes PATH_MAX: one line saying so, no file under a name cut short",
       f"status {p.returncode}, other files {side}, stderr {p.stderr.decode()[-400:]}")
shutil.rmtree(os.path.join(tmp, "d" * 200), ignore_errors=True)

# 5000 arguments; control bytes, spaces and quotes.
many = [str(i) for i in range(1, 5001)]
js, txt = os.path.join(tmp, "many.json"), os.path.join(tmp, "many.txt")
p = run(["-o", js, "--text", txt, "--", "/bin/true", *many])
argv = json.load(open(js))["program"]["argv"] if os.path.exists(js) else []
head = open(txt).read().split("\n")[1] if os.path.exists(txt) else ""
tap.ok(argv == ["/bin/true", *many] and head.endswith(" ... (cut)"),
       "5000 arguments: every one in the JSON; the text header says it is cut",
       f"{len(argv)} arguments, last {argv[-1:]}, header ends {head[-30:]!r}")
odd = ["a b", "x\ny\x1b[31m", "it's", "plain", "h\u00e9llo"]
js, txt = os.path.join(tmp, "odd.json"), os.path.join(tmp, "odd.txt")
p = run(["-o", js, "--text", txt, "--", "/bin/echo", *odd])
argv = json.load(open(js))["program"]["argv"] if os.path.exists(js) else []
head = open(txt).read().split("\n")[1] if os.path.exists(txt) else ""
tap.ok(argv == ["/bin/echo", *odd] and "\x1b" not in head
       and head.endswith("/bin/echo $'a b' $'x\\ny\\x1b[31m' $'it\\'s' plain h\u00e9llo"),
       "arguments with control bytes, spaces and quotes: one shell word each in the text header, "
       "no escape sequence; as they are in the JSON", repr(head))

# jemalloc's start-up call is not in /bin/true's run.
if "jemalloc" in altest.allocators():
    altest.prime("jemalloc")
    js = os.path.join(tmp, "true.json")
    p = run(["-a", "jemalloc", "-o", js, "--text", "off", "--", "/bin/true"])
    r = json.load(open(js)) if os.path.exists(js) else {}
    share = r.get("allocator_time_ns", 0) / max(r.get("program", {}).get("runtime_ns", 0), 1)
    tap.ok(p.returncode == 0 and r and share <= 1.0,
           "/bin/true under jemalloc: time inside the allocator at most the run's", f"share {share:.2f}")
else:
    tap.skip("/bin/true under jemalloc: time inside the allocator at most the run's", "jemalloc not installed")

tap.done()
