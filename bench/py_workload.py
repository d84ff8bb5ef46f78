"""A Python workload for bench/overhead.py: builds, serializes, parses and sorts nested dicts
and lists of strings, the kind of work where CPython allocates most (its small objects come
from its own arenas; strings, dicts and lists past those sizes from malloc).

    python3 bench/py_workload.py [ROUNDS]    (default 40; about 1 s on these VMs)

Prints one line, `rounds=N checksum=N elapsed_ns=N cpu_ns=N`: the work alone, in wall time
(time.perf_counter_ns) and in CPU time (time.process_time_ns, user + system), so interpreter
start-up and exit, and a profiler's report written at exit, are not in them. The checksum
depends only on ROUNDS.
"""
import json
import sys
import time


def one_round(r):
    table = {f"key{r}-{i}": [i, str(i) * (1 + i % 9), {"n": i, "tags": ["x" * (i % 13)] * 3}]
             for i in range(3000)}
    text = json.dumps(table)
    back = json.loads(text)
    rows = sorted(back.items(), key=lambda kv: (len(kv[1][1]), kv[0]))
    words = " ".join(k for k, _ in rows[:500]).split()
    return len(text) + len(rows) + len(set(words))


def main():
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 40
    t0, c0 = time.perf_counter_ns(), time.process_time_ns()
    checksum = sum(one_round(r) for r in range(rounds))
    elapsed, cpu = time.perf_counter_ns() - t0, time.process_time_ns() - c0
    print(f"rounds={rounds} checksum={checksum} elapsed_ns={elapsed} cpu_ns={cpu}")


if __name__ == "__main__":
    main()
