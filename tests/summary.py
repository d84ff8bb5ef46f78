"""Prints the suite's closing line, 'N passed, N failed[, N skipped]', from meson's test log.

A TAP test contributes one count per `ok`/`not ok` line; a test that died before printing its
plan (crash, timeout) counts as one failure on top of what it printed.
"""
import json
import re
import sys

passed = failed = skipped = 0
with open(sys.argv[1]) as log:
    for line in log:
        test = json.loads(line)
        out = test.get("stdout") or ""
        oks = re.findall(r"^(not ok|ok)\b.*$", out, re.M)
        if test.get("protocol") == "tap" or oks:
            for m in re.finditer(r"^(not ok|ok)\b(.*)$", out, re.M):
                if m.group(1) == "not ok":
                    failed += 1
                elif "# SKIP" in m.group(2):
                    skipped += 1
                else:
                    passed += 1
            if test["result"] not in ("OK", "SKIP", "EXPECTEDFAIL") and not re.search(r"^not ok", out, re.M):
                failed += 1
        elif test["result"] == "OK":
            passed += 1
        elif test["result"] == "SKIP":
            skipped += 1
        else:
            failed += 1
print(f"{passed} passed, {failed} failed" + (f", {skipped} skipped" if skipped else ""))
sys.exit(1 if failed else 0)
