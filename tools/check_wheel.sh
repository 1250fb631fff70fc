#!/usr/bin/env bash
# The wheel carries the shipped tables: build it, install it (no source tree on the path) into a fresh
# virtual environment that reuses this Python's packages, and check from outside the repository that the
# picker answers DeepSeek-V3 TP8 gate/up on an H200 from a packaged table and `moetune show` lists it.
set -euo pipefail
cd "$(dirname "$0")/.."
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# built from a copy of the tracked and unignored files: a stale build/ folder cannot leak into the wheel
mkdir "$tmp/src"
git ls-files -z --cached --others --exclude-standard | while IFS= read -r -d '' f; do
  [ -e "$f" ] && printf '%s\0' "$f"; done | tar -c --null -T - | tar -x -C "$tmp/src"
pip wheel -q --no-deps -w "$tmp/whl" "$tmp/src"
python -m venv "$tmp/venv" --system-site-packages
"$tmp/venv/bin/pip" install -q --no-deps "$tmp"/whl/*.whl
cd "$tmp"
"$tmp/venv/bin/python" - "$tmp/venv" <<'PY'
import sys
from pathlib import Path

import moetune

venv = Path(sys.argv[1]).resolve()
assert venv in Path(moetune.__file__).resolve().parents, f"moetune imported from {moetune.__file__}"
p = moetune.picker.pick_config_with_source("fp8_decode.gate_up", dict(E=256, N=512, K=7168, top_k=8), 8,
                                           device="NVIDIA H200")
assert p.source != "heuristic", p
assert venv in Path(p.path).resolve().parents, p.path
print("wheel picker:", p.source, p.path)
PY
COLUMNS=400 "$tmp/venv/bin/moetune" show --kernel fp8_decode.gate_up > show.txt
grep -q "fp8_decode.gate_up/nvidia_h200/E256_N512_K7168_topk8_bfloat16.json" show.txt \
  || { cat show.txt; echo "moetune show does not list the packaged tables" >&2; exit 1; }
echo "wheel show: $(grep -c '\.json' show.txt) table(s) of fp8_decode.gate_up"
