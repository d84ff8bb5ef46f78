#!/usr/bin/env python3
"""Memory waste at the peak and at exit, against programs that print their own truth, under
every allocator found.

argv: waste_frag waste_blowup waste_large waste_churn
"""
import os
import re
import sys

from altest import Tap, allocators, run, tmpdir

FRAG, BLOWUP, LARGE, CHURN = sys.argv[1:5]
# Allocators that keep memory freed by one thread in that thread's cache, out of reach of the
# thread that allocates next: tcmalloc's thread caches. glibc and jemalloc give it back to the
# arena the objects came from, mimalloc to the page's owner thread (its delayed free list), so
# the producer's next batch reuses it (reported, not asserted).
KEEPS_FREED_IN_OTHER_THREADS = {"tcmalloc"}

tap = Tap()
allocs = allocators()
wd = tmpdir()


def truth(proc):
    return {k: int(v) for k, v in (line.split() for line in proc.stdout.decode().splitlines())}


def within(got, want, rel):
    return abs(got - want) <= rel * max(want, 1)


def memory(rep):
    return (rep or {}).get("memory") or {}


for name in allocs:
    # (a) and (c): internal fragmentation at exit and at the peak; the total at the peak.
    proc, rep = run(name, [FRAG], wd, name=f"frag-{name}")
    mem = memory(rep)
    if not tap.ok(proc.returncode == 0 and mem.get("available"), f"waste_frag under {name}: ran, memory available",
                  proc.stderr.decode()[-2000:] + str(mem)[:500]):
        continue
    t = truth(proc)
    peak, final = mem["peak"], mem["final"]
    tap.ok(within(final["internal_fragmentation_bytes"], t["internal_final"], 0.01),
           f"waste_frag under {name}: internal fragmentation at exit {final['internal_fragmentation_bytes']} "
           f"within 1% of the program's {t['internal_final']}")
    tap.ok(within(peak["internal_fragmentation_bytes"], t["internal_peak"], 0.05),
           f"waste_frag under {name}: internal fragmentation at the peak {peak['internal_fragmentation_bytes']} "
           f"within 5% of the program's {t['internal_peak']}")
    tap.ok(within(peak["total_bytes"], t["heap_rss_peak"], 0.05),
           f"waste_frag under {name}: total at the peak {peak['total_bytes']} within 5% of the heap's "
           f"resident size in /proc/self/smaps, {t['heap_rss_peak']}")
    # The process's peak RSS, read by the library at exit, holds the heap the program measured
    # at its peak, and the shadow table (resident) is part of it.
    prof = rep.get("profiler") or {}
    tap.ok(prof.get("process_peak_rss_bytes", 0) >= t["heap_rss_peak"] + prof.get("shadow_bytes", 0) > 0,
           f"waste_frag under {name}: process peak RSS {prof.get('process_peak_rss_bytes')} holds the heap at "
           f"its peak ({t['heap_rss_peak']}) and the shadow table ({prof.get('shadow_bytes')})")
    # The shadow table is mostly a byte per granule of heap: 8 bytes (12.5%, and the page and line
    # entries), or under glibc, whose blocks are all 16-byte aligned, 16 bytes (6.25%).
    shadow_limit = 0.08 if name == "glibc" else 0.15
    tap.ok(0 < prof.get("shadow_bytes", 0) <= shadow_limit * t["heap_rss_peak"],
           f"waste_frag under {name}: shadow table {prof.get('shadow_bytes')} bytes, at most "
           f"{shadow_limit:.0%} of the heap at its peak ({t['heap_rss_peak']})")
    for key, s in (("peak", peak), ("final", final)):
        parts = (s["live_requested_bytes"] + s["internal_fragmentation_bytes"] + s["blowup_bytes"]
                 + s["external_fragmentation_bytes"] - s["unbacked_bytes"])
        tap.ok(parts == s["total_bytes"] and min(s[k] for k in s if k.endswith("_bytes")) >= 0,
               f"waste_frag under {name}: {key}: live + internal + blowup + external - unbacked = total, "
               f"none negative", str({k: v for k, v in s.items() if k != 'size_classes'}))
    small = [c for c in peak["size_classes"] if c["size"] != "large"]
    # The peak snapshot is the last the 1 MiB rule took: up to a few MiB before the last object.
    tap.ok(len(small) >= 2 and sum(c["live_objects"] for c in small) >= 0.97 * 200000,
           f"waste_frag under {name}: the peak's size classes hold the 200000 objects (3% for the "
           f"snapshot step)",
           str(peak["size_classes"][:4]))
    with open(f"{wd}/frag-{name}.txt") as f:
        text = f.read()
    tap.ok("memory       heap at the peak" in text and "internal" in text and "blowup" in text,
           f"waste_frag under {name}: text report shows the memory table")

    # Blocks bigger than their classes: aligned operator new; glibc's whole chunks.
    for mode in ("aligned", "split"):
        proc, rep = run(name, [FRAG, mode], wd, name=f"frag-{mode}-{name}")
        mem = memory(rep)
        if not tap.ok(proc.returncode == 0 and mem.get("available"), f"waste_frag {mode} under {name}: ran",
                      proc.stderr.decode()[-2000:]):
            continue
        t, final = truth(proc), mem["final"]["internal_fragmentation_bytes"]
        tap.ok(within(final, t["internal_final"], 0.01),
               f"waste_frag {mode} under {name}: internal fragmentation at exit {final} within 1% of "
               f"the program's {t['internal_final']}")
    # The peak after the last look an allocation made: blocks written later, half freed.
    proc, rep = run(name, [FRAG, "late"], wd, name=f"frag-late-{name}")
    mem = memory(rep)
    if tap.ok(proc.returncode == 0 and mem.get("available"), f"waste_frag late under {name}: ran",
              proc.stderr.decode()[-2000:]):
        live = mem["peak"]["live_requested_bytes"]
        tap.ok(within(live, truth(proc)["live_peak"], 0.01),
               f"waste_frag late under {name}: live bytes at the peak {live} within 1% of the "
               f"program's {truth(proc)['live_peak']} (the blocks written after their allocation)")

    # A block written after its allocation and freed, an earlier large free before it: the peak
    # is seen before its free, and the sites' peak holds it (it was forgotten by the sampler
    # before that look, and the site read nothing live at the peak). Every block sampled.
    proc, rep = run(name, [FRAG, "lastfree"], wd, name=f"frag-lastfree-{name}", extra=("--sample-rate", "4096"))
    mem = memory(rep)
    if tap.ok(proc.returncode == 0 and mem.get("available") and (rep.get("sites") or {}).get("available"),
              f"waste_frag lastfree under {name}: ran", proc.stderr.decode()[-2000:]):
        want, live = truth(proc)["live_peak"], mem["peak"]["live_requested_bytes"]
        tap.ok(within(live, want, 0.01),
               f"waste_frag lastfree under {name}: live bytes at the peak {live} within 1% of the "
               f"program's {want} (the 3 MiB block, freed after a 200 KiB one)")
        sites = rep["sites"]
        tap.ok(sites.get("live_bytes_at_peak", 0) >= want,
               f"waste_frag lastfree under {name}: the sites' live bytes at the peak hold the 3 MiB block",
               str(sites.get("live_bytes_at_peak")))

    # (b): blowup with a producer and consumers, none with one thread.
    for mode in ("threads", "single"):
        proc, rep = run(name, [BLOWUP, mode], wd, name=f"blowup-{mode}-{name}")
        mem = memory(rep)
        if not tap.ok(proc.returncode == 0 and mem.get("available"), f"waste_blowup {mode} under {name}: ran"):
            continue
        batch = truth(proc)["batch_bytes"]
        blowup = mem["peak"]["blowup_bytes"]
        if mode == "single":
            tap.ok(blowup <= 0.05 * batch, f"waste_blowup single under {name}: blowup at the peak {blowup} "
                   f"near zero (at most 5% of a {batch}-byte batch)")
        elif name in KEEPS_FREED_IN_OTHER_THREADS:
            tap.ok(blowup >= 0.25 * batch, f"waste_blowup threads under {name}: blowup at the peak {blowup} "
                   f"clearly above zero (at least 25% of a {batch}-byte batch)")
        else:
            tap.diag(f"waste_blowup threads under {name}: blowup at the peak {blowup} of a {batch}-byte batch")

    # Blowup is capped at what the heap holds beyond live and internal: batches of changing size,
    # all freed, in one thread. glibc serves every batch from the memory the last one freed, so
    # its count before the cap is many times the heap.
    proc, rep = run(name, [BLOWUP, "classes"], wd, name=f"blowup-classes-{name}")
    mem = memory(rep)
    if tap.ok(proc.returncode == 0 and mem.get("available"), f"waste_blowup classes under {name}: ran"):
        freed = truth(proc)["freed_bytes"]
        for key in ("peak", "final"):
            s = mem[key]
            room = s["total_bytes"] - s["live_requested_bytes"] - s["internal_fragmentation_bytes"]
            tap.ok(s["blowup_bytes"] <= max(room, 0) and s["unbacked_bytes"] == 0
                   and s["blowup_uncapped_bytes"] >= s["blowup_bytes"],
                   f"waste_blowup classes under {name}: {key}: blowup within the heap beyond live "
                   f"and internal, nothing unbacked, the count before the cap kept",
                   str({k: v for k, v in s.items() if k != "size_classes"}))
        f = mem["final"]
        if name == "glibc":
            # Freed objects count at their class size: at most a header and 15 bytes more.
            tap.ok(f["blowup_uncapped_bytes"] > 4 * f["total_bytes"]
                   and f["blowup_uncapped_bytes"] <= 1.1 * freed,
                   f"waste_blowup classes under glibc: the count before the cap is more than 4 "
                   f"times the heap at exit (at most 1.1 times the {freed} bytes freed)",
                   str({k: v for k, v in f.items() if k != "size_classes"}))

    # (d): large objects partly touched: only the tail of the last page is internal.
    proc, rep = run(name, [LARGE], wd, name=f"large-{name}")
    mem = memory(rep)
    if not tap.ok(proc.returncode == 0 and mem.get("available"), f"waste_large under {name}: ran"):
        continue
    want = truth(proc)["internal_large"]
    rows = [c for c in mem["final"]["size_classes"] if c["size"] == "large"]
    got = rows[0]["internal_fragmentation_bytes"] if rows else None
    tap.ok(rows and rows[0]["live_objects"] == 16 and within(got, want, 0.01),
           f"waste_large under {name}: large objects' internal fragmentation {got} within 1% of the "
           f"definition's {want} (whole pages, the most ever covered)", str(rows))
    tap.ok(mem["final"]["unbacked_bytes"] > 0,
           f"waste_large under {name}: the untouched three quarters show as live bytes never backed")
    # The text report's shares are of total + unbacked: live was 300% and more of the total.
    with open(f"{wd}/large-{name}.txt") as f:
        text = f.read()
    shares = [float(x) for x in re.findall(r"MiB +(-?[0-9.]+)%", text.split("memory       heap at")[-1].split("class at peak")[0])]
    tap.ok(re.search(r"^  unbacked +[0-9.]+ MiB", text, re.M) and shares and max(shares) <= 100.0,
           f"waste_large under {name}: the text report has an unbacked row and every share is at most 100%",
           f"shares {shares}")

# Big blocks allocated and freed, 8 live at a time: the profiler's tables do not grow by a region
# record's pages with each where the allocator maps each at a new address (mimalloc: 135 MiB
# of tables after 1000 blocks in full mode, 541 MiB after 4000, 135 KiB a block, none of it
# given back). What stays is a block's share of the address space's first level and, in full
# mode, of the heap bitmap (0.5 and 2.7 KiB a block under mimalloc, see the README): 3000 more
# blocks cost at most 12 MiB (4 KiB a block) in full mode, 3 MiB in --mode time, and nothing to
# speak of in --mode sample, which keeps no tables (it marked the samples its index had no room
# for in them: 3 KiB a block).
# Without meson's MALLOC_PERTURB_, with which glibc writes every byte of each block (16 s for
# 1000 of them).
GROWTH = {"full": 12 << 20, "time": 3 << 20, "sample": 256 << 10}
env = {k: v for k, v in os.environ.items() if k != "MALLOC_PERTURB_"}
for name in allocs:
    for mode in ("full", "time", "sample"):
        shadow = {}
        for n in (1000, 4000):
            proc, rep = run(name, [CHURN, str(n)], wd, name=f"churn-{name}-{mode}-{n}", extra=("--mode", mode),
                            env=env)
            shadow[n] = ((rep or {}).get("profiler") or {}).get("shadow_bytes") if proc.returncode == 0 else None
        ok = None not in shadow.values()
        tap.ok(ok and shadow[4000] <= shadow[1000] + GROWTH[mode],
               f"waste_churn under {name}, --mode {mode}: tables after 4000 blocks of 32 MiB at most "
               f"{GROWTH[mode] >> 10} KiB more than after 1000", f"shadow bytes {shadow}")

# --mode sample keeps no object records: the section says so.
name = next(iter(allocs))
proc, rep = run(name, [LARGE], wd, name="sample-mode", extra=["--mode", "sample"])
mem = memory(rep)
tap.ok(mem.get("available") is False and "sample" in mem.get("reason", ""),
       "--mode sample: memory section unavailable, with the reason", str(mem))
tap.done()
