#!/usr/bin/env bash
# Session 22 (for the next session with device time), call 3, only if calls 1-2 show RING_SPLIT or MAXNREG 96
# faster: coordinate sweeps from each table pick with RING_SPLIT 1 (and the 16-row ring tile's MAXNREG 96
# variants), so the tuner can move the tile around the new loop (stages, BLOCK_SIZE_N, GROUP_SIZE_M,
# A_RESIDENT), at the SWAP_AB 1 band's route counts of down ($DOWN_ROUTES, default 1536,3072,6144) and gate/up
# ($GU_ROUTES, default 1536,6144). The store lands in $OUT; pool it into the tables as any sweep's:
# results/h200_tables/ + benchmarks/export_tables.sh.
#   OUT=/tmp/out bash results/lut_s22/call3.sh      (~8 minutes on one H200 with the defaults)
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
DB=/root/s22_split_polish.sqlite
rm -f $DB*
for g in down gate_up; do
  if [ $g = down ]; then routes=${DOWN_ROUTES:-1536,3072,6144}; else routes=${GU_ROUTES:-1536,6144}; fi
  python - "$g" "$routes" > /root/s22_split_starts_$g.json <<'PY'
import json, sys
sys.path.insert(0, "results/lut_s22")
from ab_split import starts
g, routes = sys.argv[1], sys.argv[2].split(",")
picks = [c for r in routes for c in starts(g, int(r)) if c["RING_SPLIT"]]
print(json.dumps(list({json.dumps(c, sort_keys=True): c for c in picks}.values())))
PY
  timeout 270 python -m moetune sweep --db $DB --budget ${BUDGET:-12} --time-limit ${TIME_LIMIT:-240} --quiet \
    -m deepseek-v4-flash --tp 2 -k fp4_prefill.$g --routes "$routes" --strategy coordinate \
    --start /root/s22_split_starts_$g.json 2>&1 | tail -40 > "$OUT/polish_$g.log"
done
python - <<PY
import sqlite3
con = sqlite3.connect("$DB"); con.execute("pragma wal_checkpoint(truncate)"); con.close()
PY
gzip -c $DB > "$OUT/split_polish_s22.sqlite.gz"
python -m moetune results --db $DB 2>&1 | tail -30
