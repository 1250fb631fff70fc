#!/usr/bin/env bash
# Session 20, call 6: the GPU tests, then the down table's picks at every density up to 49152 routes (V4-Flash
# TP2) with their OUT_DTYPE bf16 twins and A_RESIDENT (bf16) tiles for the DECODE_WARPS picks, checked and
# timed by the tuner (coordinate strategy from those starts, each start measured), the tables re-exported.
#   OUT=/tmp/out bash results/lut_s20/call6.sh      (~6 minutes on one H200)
# Then copy $OUT/fp4_cross_s20.sqlite.gz into results/h200_tables/, add it to benchmarks/export_tables.sh and
# re-export (the local export must match $OUT/configs_fp4.tgz).
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
MOETUNE_TEST_GPU=1 timeout 150 python -m pytest -q -m gpu tests/test_fp4_wgmma.py tests/test_moe_sum.py \
  tests/test_fp4_align.py > "$OUT/gpu_tests.log" 2>&1
tail -1 "$OUT/gpu_tests.log"; grep -E "^FAILED|^E  " "$OUT/gpu_tests.log" | head -20
grep -q " passed" "$OUT/gpu_tests.log" && ! grep -q "failed" "$OUT/gpu_tests.log" || exit 1
routes=$(python benchmarks/table_picks.py -k fp4_prefill.down -m deepseek-v4-flash --tp 2 \
  --starts "$OUT/picks_down.json" --max-routes 49152)
python - "$OUT/picks_down.json" <<'PY'
import json, sys
picks = json.load(open(sys.argv[1]))
starts = picks + [{**p, "OUT_DTYPE": "bf16"} for p in picks]
dw = [p for p in picks if p["DECODE_WARPS"]]
starts += [{**p, "OUT_DTYPE": "bf16", "A_RESIDENT": 1, "GROUP_SIZE_M": 1} for p in dw]
starts += [{**p, "BLOCK_SIZE_M": 64, "num_warps": 4, "OUT_DTYPE": "bf16", "A_RESIDENT": 1, "GROUP_SIZE_M": 1}
           for p in dw]
json.dump(starts, open(sys.argv[1], "w"))
print(len(starts), "starts")
PY
n=$(python -c "import json, sys; print(len(json.load(open(sys.argv[1]))))" "$OUT/picks_down.json")
timeout 420 python -m moetune sweep --db /root/cross20.sqlite --budget $((n + 1)) --time-limit 150 --quiet \
  -m deepseek-v4-flash --tp 2 -k fp4_prefill.down --routes "$routes" --strategy coordinate \
  --start "$OUT/picks_down.json" > "$OUT/cross.log" 2>&1
grep "measurement(s) written" "$OUT/cross.log"; tail -3 "$OUT/cross.log" | cut -c1-200
python -c "import sqlite3; sqlite3.connect('/root/cross20.sqlite').execute('PRAGMA wal_checkpoint(TRUNCATE)').close()"
gzip -c /root/cross20.sqlite > "$OUT/fp4_cross_s20.sqlite.gz"
bash benchmarks/export_tables.sh /root/cross20.sqlite > "$OUT/export.log" 2>&1; tail -1 "$OUT/export.log"
tar czf "$OUT/configs_fp4.tgz" configs/sm_90/fp4_prefill.*
