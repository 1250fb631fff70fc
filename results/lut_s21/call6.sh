#!/usr/bin/env bash
# Session 21, call 6: A/B of the kernel module in the sweep's own harness, same machine, alternating: the
# session 20 module (results/lut_s21/fp4_wgmma_s20.py: copies past the last chunk re-read it) against this
# session's (masked copies), each timing the down 6144 pick, its resident twin and GROUP_SIZE_M 1.
#   OUT=/tmp/out bash results/lut_s21/call6.sh      (~3 minutes on one H200)
# Needs the session 20 module beside it first (not committed twice): from a clone,
#   git show 4964212:moetune/kernels/fp4_wgmma.py > results/lut_s21/fp4_wgmma_s20.py
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
cp moetune/kernels/fp4_wgmma.py /root/fp4_wgmma_s21.py
for run in 1 2 3; do
  for v in s20 s21; do
    if [ $v = s20 ]; then cp results/lut_s21/fp4_wgmma_s20.py moetune/kernels/fp4_wgmma.py
    else cp /root/fp4_wgmma_s21.py moetune/kernels/fp4_wgmma.py; fi
    timeout 120 python -m moetune sweep --db /root/ab_${v}_$run.sqlite --budget 4 --time-limit 100 --quiet \
      -m deepseek-v4-flash --tp 2 -k fp4_prefill.down --routes 6144 --strategy coordinate \
      --start results/lut_s21/start_ab.json > "$OUT/ab_${v}_$run.log" 2>&1
  done
done
cp /root/fp4_wgmma_s21.py moetune/kernels/fp4_wgmma.py
python - <<'PY' | tee "$OUT/ab.md"
import glob, json, sqlite3
print("| module | run | pick G8 ms | resident ms | G1 ms |\n|---|---:|---:|---:|---:|")
for f in sorted(glob.glob("/root/ab_*.sqlite"), key=lambda f: (f[-8], f)):
    rows = {}
    for t, c in sqlite3.connect(f).execute("select time_ms, config from measurements where status='ok'"):
        c = json.loads(c)
        if c.get("IMPL") == "gluon":
            rows["res" if c["A_RESIDENT"] else f"G{c['GROUP_SIZE_M']}"] = round(t, 4)
    v, run = f.split("_")[1], f.split("_")[2][0]
    print(f"| {v} | {run} | {rows.get('G8')} | {rows.get('res')} | {rows.get('G1')} |")
PY
