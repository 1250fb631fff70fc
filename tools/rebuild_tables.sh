#!/usr/bin/env bash
# Rebuild the shipped tables (moetune/configs/) from the stores under data/, then verify them.
#
#   bash tools/rebuild_tables.sh [--check] [extra.sqlite ...]
#
# Every store under data/<arch>/<family or mixed>/ and the replay reference set (data/reference/) are
# pooled in one `moetune export`, which takes from each store the rows of the kernels it holds; extra
# stores (a new sweep's) are pooled with them. The tables are exported from scratch into a temporary
# folder, so no entry survives that the stores no longer support, and then replace moetune/configs/
# (its README.md stays). With --check the script fails when the rebuilt tables differ from the
# committed ones (CI). A store whose rows the tables should keep belongs under data/: add it there
# (NN-<what it holds>.sqlite.gz, NN its place in the pooling order) and rebuild.
set -euo pipefail
cd "$(dirname "$0")/.."
check=0
if [ "${1:-}" = --check ]; then check=1; shift; fi
stores=(data/*/*/*.sqlite.gz data/reference/reference.csv.gz "$@")
args=()
for s in "${stores[@]}"; do args+=(--db "$s"); done
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python -m moetune export "${args[@]}" --out "$tmp" > "$tmp.log" || { cat "$tmp.log"; rm -f "$tmp.log"; exit 1; }
rm -f "$tmp.log"
find moetune/configs -mindepth 1 -maxdepth 1 ! -name README.md -exec rm -rf {} +
cp -r "$tmp"/. moetune/configs/
python -m moetune verify moetune/configs/ --schema-only
if [ "$check" = 1 ]; then
  git diff --exit-code --stat -- moetune/configs \
    || { echo "rebuilt tables differ from the committed ones (git diff moetune/configs)" >&2; exit 1; }
  untracked=$(git ls-files --others --exclude-standard -- moetune/configs)
  [ -z "$untracked" ] || { echo "rebuilt tables not committed: $untracked" >&2; exit 1; }
fi
