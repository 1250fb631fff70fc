#!/usr/bin/env bash
# Session 23, call 5: RING_SPLIT 1 across the whole SWAP_AB 1 band of the DeepSeek-V4-Flash TP 2 tables.
# Calls 1-4 (results/lut_s22/*.sh) measured the split rings 2-5% faster at the five route counts they
# covered; here every other route count whose table pick is a Gluon SWAP_AB 1 config gets a coordinate
# sweep (budget $BUDGET a point) started from the band's picks with RING_SPLIT 1 (the 16-row ring tile
# also at MAXNREG 96), so the exported tables can move the whole band. The store lands in $OUT.
#   OUT=/tmp/out bash results/lut_s23/split_band.sh      (~3 minutes on one H200)
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
DB=/root/s23_split_band.sqlite
rm -f $DB*
for g in down gate_up; do
  python results/lut_s23/band_starts.py "$g" /root/s23_starts_$g.json > /root/s23_routes_$g.txt
  timeout 270 python -m moetune sweep --db $DB --budget ${BUDGET:-8} --time-limit ${TIME_LIMIT:-240} --quiet \
    -m deepseek-v4-flash --tp 2 -k fp4_prefill.$g --routes "$(cat /root/s23_routes_$g.txt)" \
    --strategy coordinate --start /root/s23_starts_$g.json 2>&1 | tail -8 > "$OUT/band_$g.log"
done
python - <<PY
import sqlite3
con = sqlite3.connect("$DB"); con.execute("pragma wal_checkpoint(truncate)"); con.close()
PY
gzip -c $DB > "$OUT/split_band_s23.sqlite.gz"
