#!/usr/bin/env python3
"""Writes interpose/hot.ld: the functions of liballoclens.so that run before the exit report,
laid out first in its text, so that the pages the kernel maps around each fault (64 KiB
windows of the page cache: fault-around) are ones a run uses. The rest of the text (report
writers, pprof, the symbolizer's client, entry points a program does not call, other modes'
paths) is then not mapped until it runs, mostly only at exit.

    bench/text_layout.py --build BUILD [-o interpose/hot.ld]

It runs each workload under gdb with a breakpoint at every function of the library, in
--mode sample first and then in the timed modes, and lists the functions hit: --mode sample's
first (they fit the first 64 KiB window, the segment being aligned to 64 KiB), then those the
timed modes add. A traced process measures no system calls (syscall user dispatch is off under
a tracer), so their functions are added by name (EXTRA). Needs gdb; the build must be current.
"""
import argparse
import os
import subprocess
import sys
import tempfile

# What a run under gdb cannot reach: the timed modes' system call counting (syscalls.c; heap.c,
# which follows the allocator's mappings from it; the shadow table's release of what the
# allocator unmaps; the SIGSYS handler's check for a child sharing our memory), and the
# trampoline page whose system calls are not dispatched (al_sud_text, kept an output section of
# its own, whose bounds the linker gives as __start_ and __stop_al_sud_text).
EXTRA_TIMED = ["_al_process_shared_child", "_al_shadow_release", "spare_batch", "spare_push"]
EXTRA_TIMED_FILES = ["*libal_profiler.a:*syscalls.c.o(.text .text.*)",  # meson's are thin archives:
                     "*libal_profiler.a:*heap.c.o(.text .text.*)"]     # members named by path

GDB_SCRIPT = r'''
import gdb, os, subprocess
LIB = os.environ["AL_LIB"]
gdb.execute("set pagination off"); gdb.execute("set breakpoint pending on")
gdb.execute("set startup-with-shell off"); gdb.execute("set confirm off")
gdb.execute("set environment LD_PRELOAD=" + LIB)
for l in open(os.environ["AL_ENV"]):
    k, v = l.rstrip("\n").split("=", 1)
    gdb.execute("set environment %s=%s" % (k, v))
syms = []
for l in subprocess.run(["nm", "-S", "-n", LIB], capture_output=True, text=True).stdout.splitlines():
    f = l.split()
    if len(f) == 4 and f[2] in "tT":
        syms.append((int(f[0], 16), f[3]))
gdb.execute("break _dl_init")
gdb.execute("run")
pid = gdb.selected_inferior().pid
base = next(int(l.split("-")[0], 16) for l in open("/proc/%d/maps" % pid) if l.rstrip().endswith(LIB))
gdb.execute("delete")
stop = "_al_report_write"
bps = {}
for a, n in syms:
    if n != stop:
        b = gdb.Breakpoint("*0x%x" % (base + a), internal=True, temporary=True)
        bps[b.number] = n
gdb.Breakpoint(stop)
hit = set()
def on_stop(ev):
    if isinstance(ev, gdb.BreakpointEvent):
        hit.update(bps[b.number] for b in ev.breakpoints if b.number in bps)
gdb.events.stop.connect(on_stop)
while True:
    try:
        if gdb.selected_frame().name() == stop:
            break
        gdb.execute("continue", to_string=True)
    except gdb.error:
        break
with open(os.environ["AL_OUT"], "w") as f:
    f.write("\n".join(sorted(hit)) + "\n")
gdb.execute("kill")
'''


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", required=True)
    ap.add_argument("-o", "--output", default=os.path.join(os.path.dirname(__file__), "..", "interpose", "hot.ld"))
    args = ap.parse_args()
    b = os.path.abspath(args.build)
    lib = os.path.join(b, "interpose", "liballoclens.so")
    cli = os.path.join(b, "cli", "alloclens")
    libc = "/lib/x86_64-linux-gnu/libc.so.6"
    workloads = [[os.path.join(b, "bench", "malloc_bench"), "--direct", libc, "1", "200000", "42"],
                 [os.path.join(b, "bench", "malloc_bench"), "4", "100000", "42"],
                 [os.path.join(b, "tests", "integration", "cxx_containers")]]
    order = {}
    with tempfile.TemporaryDirectory() as tmp:
        gs = os.path.join(tmp, "trace.py")
        with open(gs, "w") as f:
            f.write(GDB_SCRIPT)
        for group, modes in ((0, ["sample"]), (1, ["full", "time"])):
            for mode in modes:
                envf = os.path.join(tmp, "env")
                # The environment `alloclens run` gives a program in this mode.
                m = [] if mode == "full" else ["--mode", mode]
                subprocess.run([cli, "run", "-a", "glibc", "-o", os.path.join(tmp, "r.json"), *m, "--", "sh", "-c",
                                "env | grep ^ALLOCLENS_ | grep -v '^ALLOCLENS_MAIN_PID\\|^ALLOCLENS_OUTPUT' > " + envf],
                               check=True, capture_output=True)
                with open(envf, "a") as f:
                    f.write("ALLOCLENS_OUTPUT=%s\n" % os.path.join(tmp, "r.json"))
                for w in workloads:
                    out = os.path.join(tmp, "hit")
                    subprocess.run(["gdb", "-q", "-batch", "-x", gs, "--args", *w], check=True,
                                   capture_output=True, env=dict(os.environ, AL_LIB=lib, AL_ENV=envf, AL_OUT=out))
                    for n in open(out).read().split():
                        order.setdefault(n, group)
                    print(f"{mode} {os.path.basename(w[0])}: {len(order)} functions so far", file=sys.stderr)
    for n in EXTRA_TIMED:
        order.setdefault(n, 1)
    with open(args.output, "w") as f:
        f.write("/* Generated by bench/text_layout.py: the functions of liballoclens.so that run before the\n"
                " * exit report, --mode sample's first, then those the timed modes add; laid out at the start\n"
                " * of the text (see the script). A function missing here only costs memory, never behaviour. */\n")
        f.write("SECTIONS\n{\n  .text.alloclens_hot :\n  {\n")
        f.write("    *(.text.startup .text.startup.*)\n    *crtbeginS.o(.text .text.*)\n"
                "    *libgcc.a:*(.text .text.*)\n    *libc_nonshared.a:*(.text .text.*)\n")
        for g in (0, 1):
            for n in sorted(k for k, v in order.items() if v == g):
                f.write("    *(.text.%s)\n" % n)
        for p in EXTRA_TIMED_FILES:
            f.write("    %s\n" % p)
        f.write("  }\n  al_sud_text : { *(al_sud_text) }\n}\nINSERT BEFORE .text;\n")


if __name__ == "__main__":
    main()
