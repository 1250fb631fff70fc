#!/usr/bin/env bash
# Session 20, call 11: the SWAP_AB 1 picks of the down table (768-7524 routes) and their A_RESIDENT twins at each
# of those densities (call 10: -3% at 1536 routes, +6-15% at 6144), checked and timed by the tuner; the tables
# re-exported; down benched. The fixed GPU test case first.
#   OUT=/tmp/out bash results/lut_s20/call11.sh      (~3 minutes on one H200)
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
MOETUNE_TEST_GPU=1 timeout 100 python -m pytest -q -m gpu tests/test_fp4_wgmma.py -k swap_resident \
  > "$OUT/gpu_tests.log" 2>&1
tail -1 "$OUT/gpu_tests.log"
python benchmarks/table_picks.py -k fp4_prefill.down -m deepseek-v4-flash --tp 2 --starts "$OUT/picks.json" \
  --max-routes 49152 > /dev/null
python - "$OUT/picks.json" <<'PY'
import json, sys
picks = [p for p in json.load(open(sys.argv[1])) if p["IMPL"] == "gluon" and p["SWAP_AB"] == 1]
json.dump(picks + [{**p, "A_RESIDENT": 1} for p in picks], open(sys.argv[1], "w"))
print(len(picks) * 2, "starts")
PY
timeout 200 python -m moetune sweep --db /root/res20.sqlite --budget 5 --time-limit 60 --quiet \
  -m deepseek-v4-flash --tp 2 -k fp4_prefill.down --strategy coordinate --start "$OUT/picks.json" \
  --routes 768,1152,1536,2304,2688,3072,3402,3456,3762,3840,4608,5376,6144,6840,7524 > "$OUT/res.log" 2>&1
grep "measurement(s) written" "$OUT/res.log"
python -c "import sqlite3; sqlite3.connect('/root/res20.sqlite').execute('PRAGMA wal_checkpoint(TRUNCATE)').close()"
gzip -c /root/res20.sqlite > "$OUT/fp4_swap_resident_s20.sqlite.gz"
bash benchmarks/export_tables.sh /root/res20.sqlite > "$OUT/export.log" 2>&1; tail -1 "$OUT/export.log"
tar czf "$OUT/configs_fp4.tgz" configs/sm_90/fp4_prefill.*
timeout 120 python -m moetune bench -m deepseek-v4-flash --tp 2 -k fp4_prefill.down --routes 1536,6144,24576 \
  --csv "$OUT/bench_down.csv" --markdown "$OUT/bench_down.md" > "$OUT/bench_down.log" 2>&1
head -8 "$OUT/bench_down.md" | cut -d'|' -f2,5,12,13,16
