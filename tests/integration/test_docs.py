"""The README's option list is the options table itself (`alloclens options`), row for row."""
import os
import subprocess
import sys

from altest import Tap, cli

readme = sys.argv[1]
tap = Tap()
table = subprocess.run([cli(), "options"], check=True, capture_output=True, text=True).stdout
with open(readme) as f:
    text = f.read()
tap.ok(table.strip() in text, "README contains the output of `alloclens options` verbatim",
       "regenerate it with: build/cli/alloclens options")
rows = [l for l in table.splitlines()[2:] if l.startswith("| `ALLOCLENS_")]
tap.ok(len(rows) >= 5, "the options table has a row per tunable", table)
help_text = subprocess.run([cli(), "run", "--help"], check=True, capture_output=True, text=True).stdout
for row in rows:
    env = row.split("`")[1]
    flag_cell = row.split("|")[2].strip()
    if flag_cell.startswith("`--"):
        tap.ok(flag_cell.strip("`") in help_text, f"`alloclens run --help` documents {flag_cell.strip('`')}")
    tap.ok(env in text, f"README documents {env}")
tap.done()
