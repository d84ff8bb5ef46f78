"""liballoclens.so exports the interposed entry points and nothing else.

The expected list is read from interpose/entries.def (the one table the wrappers are made
from) plus the few hand-written entry points; any other dynamic symbol is a leak.
"""
import re
import subprocess
import sys

from altest import Tap

so, entries = sys.argv[1], sys.argv[2]
tap = Tap()
expected = set()
with open(entries) as f:
    for line in f:
        m = re.match(r"AL_ENTRY\(\s*\w+,\s*\w+,\s*(\w+),", line)
        if m:
            expected.add(m.group(1))
expected |= {"malloc_usable_size", "pthread_create", "execve", "execvpe", "execv", "execvp",
             "fexecve", "execl", "execlp", "execle", "pthread_mutex_lock", "pthread_mutex_trylock",
             "pthread_mutex_unlock", "pthread_spin_lock", "pthread_spin_trylock", "pthread_spin_unlock",
             "sigaction", "signal", "sigprocmask", "pthread_sigmask"}

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
tap.done()
