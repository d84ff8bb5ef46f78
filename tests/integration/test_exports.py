"""liballoclens.so exports the interposed entry points and nothing else.

The expected list is read from interpose/entries.def (the one table the wrappers are made
from) plus the few hand-written entry points; any other dynamic symbol is a leak. Nor does it
keep in the program a library it only needs for a moment.
"""
import ctypes
import json
import os
import re
import subprocess
import sys
import tempfile

import altest
from altest import Tap

so, entries = altest.so(), sys.argv[1]
tap = Tap()
# C23's sized frees are interposed only where the C library has them (as glibc 2.36 does not):
# a program that looks them up finds what it would without us.
libc = ctypes.CDLL("libc.so.6")
libc_free_sized = hasattr(libc, "free_sized") and hasattr(libc, "free_aligned_sized")
expected, conditions = set(), []
with open(entries) as f:
    for line in f:
        if line.startswith("#if "):
            conditions.append(line.split()[1])
        elif line.startswith("#endif"):
            conditions.pop()
        m = re.match(r"AL_ENTRY\(\s*\w+,\s*\w+,\s*(\w+),", line)
        if m and all(c == "AL_LIBC_FREE_SIZED" and libc_free_sized for c in conditions):
            expected.add(m.group(1))
expected |= {"malloc_usable_size", "pthread_create", "execve", "execvpe", "execv", "execvp",
             "fexecve", "execl", "execlp", "execle", "posix_spawn", "posix_spawnp", "_exit", "_Exit",
             "quick_exit", "pthread_mutex_lock", "pthread_mutex_trylock",
             "pthread_mutex_unlock", "pthread_spin_lock", "pthread_spin_trylock", "pthread_spin_unlock",
             "sigaction", "__sigaction", "signal", "bsd_signal", "ssignal", "sigprocmask",
             "pthread_sigmask", "sysv_signal", "__sysv_signal", "sigset", "sigignore", "siginterrupt",
             "sighold", "sigrelse", "sigblock", "sigsetmask", "sigsuspend", "__sigsuspend", "__sigpause", "sigpause", "__xpg_sigpause", "pselect", "ppoll",
             "__ppoll_chk", "epoll_pwait", "epoll_pwait2", "setcontext", "swapcontext", "pipe2", "open", "read", "close", "fclose", "dup2", "dup3", "abort", "prctl", "syscall", "clone", "daemon", "dlclose", "dl_iterate_phdr"}

out = subprocess.run(["nm", "-D", "--defined-only", so], check=True, capture_output=True, text=True).stdout
exported = set()
for line in out.splitlines():
    fields = line.split()
    if len(fields) == 3:
        exported.add(fields[2].split("@")[0])

tap.ok(len(expected) > 40, "entries.def lists the allocation entry points", f"{len(expected)} found")
tap.ok(not (expected - exported), "every entry point is exported", sorted(expected - exported))
tap.ok(not (exported - expected), "nothing else leaks out of the .so", sorted(exported - expected))
versions = subprocess.run(["objdump", "-T", so], check=True, capture_output=True, text=True).stdout
tap.ok(not re.search(r"\bALLOCLENS", versions),
       "exports carry no version node of ours (they must match any version a program asks for)")

# libpfm4 names the events at start-up; once they are resolved it is unloaded (loaded, it is
# about 2 MiB resident for the whole run).
needed = subprocess.run(["readelf", "-d", so], check=True, capture_output=True, text=True).stdout
tap.ok("libpfm" not in needed, "libpfm4 is not a load-time dependency of the .so")
# The report's symbolizer is a program of its own (alloclens-symbolize): elfutils' libdw and
# the debug information it reads stay out of the profiled process.
tap.ok("libdw" not in needed, "libdw is not a dependency of the .so")
with tempfile.TemporaryDirectory() as d:
    report = os.path.join(d, "r.json")
    env = dict(os.environ, LD_PRELOAD=so, ALLOCLENS_OUTPUT=report, ALLOCLENS_TEXT="off",
               ALLOCLENS_EVENTS="default")
    maps = subprocess.run(["cat", "/proc/self/maps"], env=env, capture_output=True, text=True)
    with open(report) as f:
        counters = json.load(f)["counters"]
    tap.ok(counters["available"] and counters["events"],
           "events were resolved at start-up (so libpfm4 was loaded)", counters.get("reason"))
    tap.ok(maps.returncode == 0 and "libpfm" not in maps.stdout,
           "libpfm4 is no longer mapped once the program runs",
           [l for l in maps.stdout.splitlines() if "libpfm" in l])
tap.done()
