#!/bin/sh
# A process-heavy workload for bench/overhead.py, the way shell scripts, builds and test
# suites are: this shell starts N short programs one after the other (/bin/true, and every
# tenth one a pipeline through sort), each a fresh process that loads, runs and exits.
#
#     sh bench/spawn.sh [N]      (default 200)
#
# Prints one line, `programs=N elapsed_ns=N`: the wall time from before the first start to
# after the last exit (the shell's own start-up and exit are not in it). Under alloclens
# every one of them is profiled and writes its own report.
n=${1:-200}
t0=$(date +%s%N)
i=0
while [ "$i" -lt "$n" ]; do
    if [ $((i % 10)) -eq 9 ]; then
        printf 'b\na\n' | sort >/dev/null
    else
        /bin/true
    fi
    i=$((i + 1))
done
t1=$(date +%s%N)
echo "programs=$n elapsed_ns=$((t1 - t0))"
