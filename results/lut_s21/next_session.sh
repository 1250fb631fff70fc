#!/usr/bin/env bash
# For session 22: the shipped Gluon module against its variant whose ring fill clamps every chunk
# (results/lut_s21/fill_variant.py; call 7: BM32 resident 0.2927 against 0.3064 ms at down 6144, the ring
# pick 0.2722 against 0.2682), A/B in the sweep's harness, same machine, alternating, twice: the down table's
# BM16 resident picks at 1536 and 3072 routes with their ring twins, and BM32 resident / ring at 6144. First
# the GPU tests written after this session's last device call (the fill's clamp at K of two chunks).
#   OUT=/tmp/out bash results/lut_s21/next_session.sh      (~5 minutes on one H200)
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
MOETUNE_TEST_GPU=1 timeout 200 python -m pytest -q -m gpu tests/test_fp4_wgmma.py -k "stages_past or swap_resident" \
  > "$OUT/gpu_tests.log" 2>&1; tail -1 "$OUT/gpu_tests.log"
rm -f /root/ns_*.sqlite*
cp moetune/kernels/fp4_wgmma.py /root/shipped.py
python results/lut_s21/fill_variant.py /root/fill_all.py
for run in 1 2; do
  for v in shipped fill_all; do
    cp /root/$v.py moetune/kernels/fp4_wgmma.py
    for point in 1536:bm16 3072:bm16 6144:bm32; do
      r=${point%:*}; s=${point#*:}
      timeout 100 python -m moetune sweep --db /root/ns_${v}_${r}_$run.sqlite --budget 3 --time-limit 90 --quiet \
        -m deepseek-v4-flash --tp 2 -k fp4_prefill.down --routes $r --strategy coordinate \
        --start results/lut_s21/start_$s.json >> "$OUT/ns_$v.log" 2>&1
    done
  done
done
cp /root/shipped.py moetune/kernels/fp4_wgmma.py
python - <<'PY' | tee "$OUT/ab.md"
import glob, json, sqlite3
print("| module | routes | run | BM | resident ms | ring ms |\n|---|---:|---:|---:|---:|---:|")
for f in sorted(glob.glob("/root/ns_*.sqlite")):
    v, r, run = f[len("/root/ns_"):-len(".sqlite")].rsplit("_", 2)
    rows, bm = {}, None
    for t, c in sqlite3.connect(f).execute("select time_ms, config from measurements where status='ok'"):
        c = json.loads(c)
        if c.get("IMPL") == "gluon":
            rows[c["A_RESIDENT"]], bm = round(t, 4), c["BLOCK_SIZE_M"]
    print(f"| {v} | {r} | {run} | {bm} | {rows.get(1)} | {rows.get(0)} |")
PY
