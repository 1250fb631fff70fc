#!/usr/bin/env bash
# Sweep the model list on an H200 host with the default strategy, export the tables, bench default /
# heuristic / tuned side by side, and check the picker between swept densities.
#
#   OUT=/tmp/out bash benchmarks/h200_tables.sh [stage ...]
#
# Stages (default: fp8 fp4 gather export bench direct picker pack): `more` sweeps the rest of the model
# list, `active` its active fractions 1/2 and 1/4, `splits` re-sweeps the other fp8 models at 1-16 tokens,
# `zipf` skewed routing for fp4, `polish` coordinate sweeps of fp4 from the tables' picks, `cross` every
# fp4 table pick at every density of its table, `refine` sweeps the midpoints where neighbouring fp4
# picks are different designs (CROSS: the cross stores), `retime` checks a sweep's first readings against
# a bench, `bench-off` benches partly active and skewed points, `grid` sweeps the 1.5x density midpoints
# for the two target shapes, `exhaustive` times the full exhaustive sweep from an empty Triton cache on
# GPU 0, `exhaustive_tables` sweeps DeepSeek-V3 TP8's two GEMMs (or $KERNEL) exhaustively over $TOKENS,
# `direct` sweeps densities off the tables' grid and `picker` benches the tables' choice there.
# Every sweep resumes from $DB, so a stage cut short by its time limit continues where it stopped when
# run again. `pack` puts everything under $OUT into one archive, $OUT/h200_tables.tgz. Knobs:
# BUDGET (measurements per point), LIMIT (seconds per sweep command), GPUS (--gpus value), POOL (stores
# whose rows `export` pools with $DB's, e.g. data/*/*/*.sqlite.gz). Everything a stage writes lands under
# $OUT; moetune/configs/ is exported in place and also packed into $OUT/configs.tgz. To keep a new store's
# rows in the shipped tables, add it under data/ and run tools/rebuild_tables.sh.
set -u
: "${OUT:?set OUT to a folder for the results}"
BUDGET=${BUDGET:-24}
LIMIT=${LIMIT:-200}
GPUS=${GPUS-all}  # empty: no --gpus (GPU 0, every point at once)
DB=${DB:-$OUT/h200_tables.sqlite}
# the picker check's points: densities no table entry holds
PICK_TOKENS=${PICK_TOKENS:-10,22,44}
PICK_ROUTES=${PICK_ROUTES:-2688}
export PYTHONPATH=${PYTHONPATH:-.} PYTHONUNBUFFERED=1
# A sweep needs no collective; keep NVLink multicast off in case anything initialises NCCL.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
mkdir -p "$OUT"
mt() { python -m moetune "$@"; }
sweep() { mt sweep --db "$DB" --budget "$BUDGET" ${GPUS:+--gpus "$GPUS"} --time-limit "$LIMIT" --quiet "$@"; }
stamp() { echo "== $(date -u +%H:%M:%S) $*" | tee -a "$OUT/stages.log"; }

stages=("$@")
[ ${#stages[@]} -eq 0 ] && stages=(fp8 fp4 gather export bench direct picker pack)
for st in "${stages[@]}"; do
  stamp "start $st"
  case $st in
    fp8)  # DeepSeek-V3 TP=8: the issue's roofline and vLLM comparison points, every active fraction
      sweep -m deepseek-v3 --tp 8 -k fp8_decode ;;
    fp4)  # DeepSeek-V4-Flash TP=2 over the prefill route grid, uniform and skewed routing
      sweep -m deepseek-v4-flash --tp 2 -k fp4_prefill --routing uniform,zipf:1.2 ;;
    gather)
      sweep -m deepseek-v4-flash --tp 2 -k gather_rows ;;
    exhaustive)  # DeepSeek-V3 TP8 gate/up at 16 tokens, every candidate, cold cache, one GPU
      TRITON_CACHE_DIR=$(mktemp -d) /usr/bin/time -v python -m moetune sweep -m deepseek-v3 --tp 8 \
        -k fp8_decode.gate_up --tokens 16 --active 1 --strategy exhaustive --gpus 0 \
        --db "$OUT/exhaustive.sqlite" --time-limit "$LIMIT" --quiet 2>&1 | tee "$OUT/exhaustive.log" \
        | grep -v '[│┃┏┡└]' ;;
    exhaustive_tables)  # every searched candidate of both DeepSeek-V3 TP8 GEMMs, one cache
      mt sweep -m deepseek-v3 --tp 8 -k "${KERNEL:-fp8_decode}" --tokens "${TOKENS:-1,2,3,4,6,8,12,16,24,32,48,64}" \
        --active 1 --strategy exhaustive ${GPUS:+--gpus "$GPUS"} --db "$OUT/exhaustive_tables.sqlite" \
        --time-limit "$LIMIT" --quiet ;;
    grid)  # the midpoints of the 1.5x density grid, for the issue's two target shapes
      sweep -m deepseek-v3 --tp 8 -k fp8_decode --tokens 3,6,12,24,48,96,192 --active 1
      sweep -m deepseek-v4-flash --tp 2 -k fp4_prefill --routes 1152,2304,4608,9216,18432,36864,73728 ;;
    more)  # the rest of the model list, active fraction 1
      sweep -m deepseek-v3 --tp 1 -k fp8_decode --active 1
      sweep -m kimi-k2 --tp 8 -k fp8_decode --active 1
      sweep -m qwen3-235b-a22b --tp 4 -k fp8_decode --active 1
      sweep -m qwen3-235b-a22b --tp 1 -k fp8_decode --active 1
      sweep -m qwen3-30b-a3b --tp 1 -k fp8_decode --active 1
      sweep -m qwen3-30b-a3b --tp 4 -k fp8_decode --active 1
      sweep -m deepseek-v4-flash --tp 1 -k fp4_prefill
      sweep -m gpt-oss-120b -k fp4_prefill ;;
    active)  # active fractions 1/2 and 1/4 for the fp8 models first swept at active 1 only
      for mt_ in deepseek-v3:1 kimi-k2:8 qwen3-235b-a22b:4 qwen3-235b-a22b:1 qwen3-30b-a3b:1 qwen3-30b-a3b:4; do
        sweep -m "${mt_%%:*}" --tp "${mt_##*:}" -k fp8_decode --active 0.5,0.25
      done ;;
    splits)  # refresh the other fp8 models' tables around what they pick (coordinate from the tables), at the densities where splits are chosen
      for mt_ in deepseek-v3:1 kimi-k2:8 qwen3-235b-a22b:4 qwen3-235b-a22b:1 qwen3-30b-a3b:1 qwen3-30b-a3b:4; do
        sweep -m "${mt_%%:*}" --tp "${mt_##*:}" -k fp8_decode --tokens 1,2,4,8,16 --active 1 \
          --strategy coordinate
      done ;;
    polish)  # coordinate sweeps from the tables' picks over V4-Flash TP2's route grid
      # ($ROUTES: only these route counts)
      sweep -m deepseek-v4-flash --tp 2 -k fp4_prefill --strategy coordinate ${ROUTES:+--routes "$ROUTES"} ;;
    cross)  # every pick of one model's tables ($PICKS: model, TP, family; V4-Flash TP2 fp4 by
      # default) measured at every density of its table up to $MAX_ROUTES, so no entry is slower there than
      # another entry's config (tools/table_picks.py)
      read -r pm pt pf <<< "${PICKS:-deepseek-v4-flash 2 fp4_prefill}"
      for g in gate_up down; do
        routes=$(python tools/table_picks.py -k "$pf.$g" -m "$pm" --tp "$pt" \
          --starts "$OUT/picks_$g.json" --max-routes "${MAX_ROUTES:-24576}")
        n=$(python -c "import json, sys; print(len(json.load(open(sys.argv[1]))))" "$OUT/picks_$g.json")
        mt sweep --db "$DB" --budget $((n + 1)) ${GPUS:+--gpus "$GPUS"} --time-limit "$LIMIT" --quiet \
          -m "$pm" --tp "$pt" -k "$pf.$g" --routes "$routes" --strategy coordinate --start "$OUT/picks_$g.json"
      done ;;
    refine)  # the midpoints of the intervals where two neighbouring picks are different designs,
      # each slower at the other's density, by $CROSS's measurements (cross stores), swept from both picks
      read -r pm pt pf <<< "${PICKS:-deepseek-v4-flash 2 fp4_prefill}"
      for g in gate_up down; do
        routes=$(python tools/table_picks.py -k "$pf.$g" -m "$pm" --tp "$pt" \
          --starts "$OUT/picks_$g.json" --max-routes "${MAX_ROUTES:-24576}" --boundaries ${CROSS:?set CROSS})
        [ -n "$routes" ] && mt sweep --db "$DB" --budget "$BUDGET" ${GPUS:+--gpus "$GPUS"} --time-limit "$LIMIT" \
          --quiet -m "$pm" --tp "$pt" -k "$pf.$g" --routes "$routes" --strategy coordinate \
          --start "$OUT/picks_$g.json"
      done ;;
    zipf)  # skewed routing for the fp4 prefill shapes
      sweep -m deepseek-v4-flash --tp 2 -k fp4_prefill --routing zipf:1.2
      sweep -m deepseek-v4-flash --tp 1 -k fp4_prefill --routing zipf:1.2
      sweep -m gpt-oss-120b -k fp4_prefill --routing zipf:1.2 ;;
    retime)  # a sweep's first readings against a bench of the same points
      DB=$OUT/retime.sqlite sweep -m deepseek-v4-flash --tp 2 -k fp4_prefill.gate_up --routes 24576,49152
      mt bench -m deepseek-v4-flash --tp 2 -k fp4_prefill.gate_up --routes 24576,49152 \
        --csv "$OUT/retime_bench.csv" ;;
    export)
      pooled=(--db "$DB"); for p in ${POOL:-}; do pooled+=(--db "$p"); done
      mt export "${pooled[@]}" --out moetune/configs | tee "$OUT/export.txt"
      tar czf "$OUT/configs.tgz" moetune/configs ;;
    bench|bench-fp8|bench-fp4)
      [ "$st" != bench-fp4 ] && mt bench -m deepseek-v3 --tp 8 -k fp8_decode --tokens 1,2,4,8,16,32,64,128,256 \
        --csv "$OUT/bench_fp8.csv" --markdown "$OUT/bench_fp8.md"
      [ "$st" != bench-fp8 ] && mt bench -m deepseek-v4-flash --tp 2 -k fp4_prefill \
        --csv "$OUT/bench_fp4.csv" --markdown "$OUT/bench_fp4.md" ;;
    bench-off)  # the tables at points off the uniform, fully active one: partly active decode, skewed prefill
      mt bench -m deepseek-v3 --tp 8 -k fp8_decode --tokens 1,4,16,64 --active 0.5,0.25 \
        --csv "$OUT/bench_fp8_active.csv"
      mt bench -m deepseek-v4-flash --tp 2 -k fp4_prefill --routing zipf:1.2 --csv "$OUT/bench_fp4_zipf.csv" ;;
    direct)  # direct sweeps at $PICK_TOKENS / $PICK_ROUTES, the picker check's reference (BUDGET=100 makes
      # one worth comparing with)
      DB=$OUT/direct.sqlite sweep \
        -m deepseek-v3 --tp 8 -k fp8_decode.gate_up --tokens "$PICK_TOKENS" --active 1
      DB=$OUT/direct.sqlite sweep \
        -m deepseek-v4-flash --tp 2 -k fp4_prefill.gate_up --routes "$PICK_ROUTES" ;;
    picker)  # the picker's choice at those densities, benched (set against `direct`'s best afterwards)
      mt bench -m deepseek-v3 --tp 8 -k fp8_decode.gate_up --tokens "$PICK_TOKENS" --csv "$OUT/picker_fp8.csv"
      mt bench -m deepseek-v4-flash --tp 2 -k fp4_prefill.gate_up --routes "$PICK_ROUTES" \
        --csv "$OUT/picker_fp4.csv" ;;
    pack)
      python - "$OUT" "$DB" <<'PY'
import sqlite3, sys
from pathlib import Path
for db in {Path(sys.argv[2]), *Path(sys.argv[1]).glob("*.sqlite")}:  # fold WAL files into the stores
    if db.exists():
        sqlite3.connect(db).execute("PRAGMA wal_checkpoint(TRUNCATE)").close()
PY
      [ -f "$DB" ] && case "$DB" in "$OUT"/*) ;; *) cp "$DB" "$OUT/" ;; esac
      (cd "$OUT" && tar czf /tmp/h200_tables.tgz --exclude='*-wal' --exclude='*-shm' . \
        && find . -mindepth 1 -delete && mv /tmp/h200_tables.tgz .) ;;
    *) echo "unknown stage $st" >&2; exit 2 ;;
  esac
  stamp "end $st"
done
