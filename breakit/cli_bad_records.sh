#!/bin/bash
# The CLI on hostile records: each must exit 2 with one line on stderr (no traceback).
# Usage: bash breakit/cli_bad_records.sh DIR   (DIR from the generator in the report; /tmp/breakit/bad)
PY=${PY:-.venv/bin/python}
for f in "$1"/*.json; do
  for cmd in "compare --replay" "report --from"; do
    err=$( { /usr/bin/time -f "maxrss_kb=%M" timeout 120 $PY -m kvlab $cmd "$f" >/dev/null; } 2>&1 ); rc=$?
    rss=$(echo "$err" | grep -o 'maxrss_kb=[0-9]*' | tail -1)
    body=$(echo "$err" | grep -v 'maxrss_kb=' | grep -v '^Command exited with non-zero status')
    lines=$(echo "$body" | grep -c .)
    flag=""; { [ "$lines" -gt 1 ] || echo "$body" | grep -q Traceback; } && flag="MULTI-LINE/TRACEBACK"
    printf '%-22s %-16s rc=%s lines=%s %s %s | %s\n' "$(basename $f)" "$cmd" "$rc" "$lines" "$rss" "$flag" "$(echo "$body" | tail -1 | cut -c1-160)"
  done
done
