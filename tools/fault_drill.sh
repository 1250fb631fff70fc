#!/usr/bin/env bash
# Fault drill on a GPU: the crash-isolation sweep (test-only spec whose configs raise, abort, segfault,
# hang and make a real illegal memory access), then a real sweep killed with SIGKILL part-way and resumed.
# Checks that every candidate is stored exactly once and the store stays intact. Run from the repo root:
#   OUT=/tmp/drill bash tools/fault_drill.sh
set -u
OUT=${OUT:-/tmp/fault_drill}
mkdir -p "$OUT"
export PYTHONPATH=${PYTHONPATH:-.}
cli() { python -c "import sys; sys.path.insert(0, 'tests'); import crashy_spec; from moetune.cli import main; main()" "$@"; }

echo "== crash isolation (test.crashy, every mode)"
cli sweep --kernel test.crashy --model tiny --tokens 2 --strategy exhaustive --timeout 10 \
  --db "$OUT/crash.sqlite" --quiet
cli results --db "$OUT/crash.sqlite" --kernel test.crashy --wide

echo "== SIGKILL mid-sweep, then resume (gather_rows, DeepSeek-V3 TP8, every candidate once)"
args=(sweep --kernel gather_rows --model deepseek-v3 --tp 8 --tokens 1,64 --active 1 --strategy exhaustive
      --db "$OUT/kill.sqlite" --quiet)
python -m moetune "${args[@]}" > "$OUT/killed.txt" 2>&1 &
pid=$!
python - "$OUT/kill.sqlite" <<'PY'
import os, sqlite3, sys, time
t0 = time.time()
while time.time() - t0 < 240:
    try:
        n = sqlite3.connect(f"file:{sys.argv[1]}?mode=ro", uri=True).execute("select count(*) from measurements").fetchone()[0]
    except sqlite3.Error:
        n = 0
    if n >= 25:
        break
    time.sleep(0.2)
print("rows before the kill:", n)
PY
kill -9 "$pid"; wait "$pid" 2>/dev/null
before=$(python -c "import sqlite3,sys; print(sqlite3.connect(sys.argv[1]).execute('select count(*) from measurements').fetchone()[0])" "$OUT/kill.sqlite")
python -m moetune "${args[@]}" > "$OUT/resumed.txt" 2>&1
echo "resume rc $?"
python - "$OUT/kill.sqlite" "$before" <<'PY'
import sqlite3, sys
db = sqlite3.connect(sys.argv[1])
print("integrity:", db.execute("pragma integrity_check").fetchone()[0])
rows = db.execute("select tokens, config, count(*) from measurements group by tokens, config").fetchall()
dup = [r for r in rows if r[2] > 1]
per_point = db.execute("select tokens, count(*), group_concat(distinct status) from measurements group by tokens").fetchall()
print("rows:", sum(r[2] for r in rows), "before the kill:", sys.argv[2], "duplicated (point, config):", len(dup))
print("per point (tokens, rows, statuses):", per_point)
print("sweeps:", db.execute("select count(distinct sweep_id) from measurements").fetchone()[0])
PY
