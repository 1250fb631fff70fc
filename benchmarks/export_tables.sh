#!/usr/bin/env bash
# Re-export the committed sm_90 tables (configs/) from every committed H200 store, plus any stores given
# as arguments (a new sweep's), pooled per kernel family:
#
#   bash benchmarks/export_tables.sh [extra.sqlite ...]
#
# Each extra store is offered to all three families; `moetune export` takes only the rows of the family
# it exports. The lists are the union of the export commands in results/h200_tables/README.md (sessions
# 6, 7, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20 and 23), so a store added there belongs here too. Run from the repository root.
set -eu
H=results/h200_tables
fp8=(
  $H/fp8_decode_deepseek-v3_tp8.sqlite.gz
  $H/fp8_decode_deepseek-v3_tp8_s4.sqlite.gz
  $H/fp8_decode_qwen3-30b-tp1_kimi-k2-tp8_s4.sqlite.gz
  results/reference/reference.csv.gz
  $H/fp8_decode_qwen3-235b-tp4_s6.sqlite.gz
  $H/fp8_decode_deepseek-v3_tp8_s6.sqlite.gz
  $H/fp8_decode_dsv3-tp1_qwen3-tp4-tp1_gather_s6.sqlite.gz
  $H/fp8_decode_deepseek-v3_tp8_gate_up_s6_standin.sqlite.gz
  $H/fp8_decode_active_s7.sqlite.gz
  $H/fp8_decode_deepseek-v3-tp1_active_s9.sqlite.gz
  $H/picker_direct_s10.sqlite.gz
  $H/grid_s11.sqlite.gz
  $H/fp8_decode_deepseek-v3_tp8_tma_s11.sqlite.gz
  $H/picker_direct_s11.sqlite.gz
  $H/picker_neighbours_s11.sqlite.gz
  $H/fp8_decode_deepseek-v3_tp8_gemv_s12.sqlite.gz
  $H/fp8_decode_deepseek-v3_tp8_gemv1_s12.sqlite.gz
  $H/fp8_decode_deepseek-v3_tp8_gate_up_1_64_s12.sqlite.gz
  $H/fp8_decode_deepseek-v3_tp8_parts_s12.sqlite.gz
  $H/picker_direct_s12.sqlite.gz
  $H/fp8_decode_deepseek-v3_tp8_exhaustive_s13.sqlite.gz
  results/tuner_s13/exhaustive_searched.sqlite.gz
  results/tuner_s13/exhaustive_full_space.sqlite.gz
  $H/fp8_decode_deepseek-v3_tp8_down_2_6_s14.sqlite.gz
  $H/fp8_decode_deepseek-v3_tp8_down_8_s14.sqlite.gz
  results/tuner_s14/full_space_run1.sqlite.gz
  results/tuner_s14/full_space_run2.sqlite.gz
  $H/picker_direct_s14.sqlite.gz
  $H/picker_direct_s15.sqlite.gz
  $H/fp8_decode_deepseek-v3_tp8_cross_s16.sqlite.gz
)
fp4=(
  $H/fp4_prefill_deepseek-v4-flash_tp2.sqlite.gz
  results/reference/reference.csv.gz
  $H/fp4_prefill_deepseek-v4-flash_tp2_s6.sqlite.gz
  $H/fp4_prefill_deepseek-v4-flash-tp1_gpt-oss-120b_s6.sqlite.gz
  $H/fp4_prefill_deepseek-v4-flash_tp2_gate_up_s6_recheck.sqlite.gz
  $H/fp4_prefill_deepseek-v4-flash_tp2_gate_up_s6_standin.sqlite.gz
  $H/fp4_prefill_gpt-oss-120b_gate_up_s6_recheck.sqlite.gz
  $H/fp4_prefill_gpt-oss-120b_down_s6_recheck.sqlite.gz
  $H/fp4_prefill_zipf_s7.sqlite.gz
  $H/fp4_prefill_retime_s7.sqlite.gz
  $H/fp4_prefill_deepseek-v4-flash_tp2_s10.sqlite.gz
  $H/picker_direct_s10.sqlite.gz
  $H/grid_s11.sqlite.gz
  $H/fp4_prefill_deepseek-v4-flash_tp2_tma_s11.sqlite.gz
  $H/picker_direct_s11.sqlite.gz
  $H/fp4_prefill_deepseek-v4-flash_tp2_lut_s12.sqlite.gz
  $H/fp4_prefill_deepseek-v4-flash_tp2_lut_grid_s12.sqlite.gz
  $H/fp4_prefill_deepseek-v4-flash_tp2_start_s12.sqlite.gz
  $H/picker_direct_s12.sqlite.gz
  $H/fp4_prefill_deepseek-v4-flash_tp2_occ_s14.sqlite.gz
  $H/picker_direct_s14.sqlite.gz
  $H/fp4_prefill_deepseek-v4-flash_tp2_polish_s15.sqlite.gz
  $H/fp4_prefill_deepseek-v4-flash_tp2_ahead_s15.sqlite.gz
  $H/fp4_prefill_deepseek-v4-flash_tp2_cross_s15.sqlite.gz
  $H/fp4_prefill_deepseek-v4-flash_tp2_refine_s15.sqlite.gz
  $H/picker_direct_s15.sqlite.gz
  $H/picker_direct2_s15.sqlite.gz
  $H/picker_direct3_s15.sqlite.gz
  $H/fp4_prefill_deepseek-v4-flash_tp2_refine2_s16.sqlite.gz
  $H/fp4_prefill_deepseek-v4-flash_tp2_gluon_s16.sqlite.gz
  $H/fp4_prefill_deepseek-v4-flash_tp2_cross_s16.sqlite.gz
  $H/fp4_prefill_deepseek-v4-flash_tp2_ring_s17.sqlite.gz
  $H/fp4_prefill_deepseek-v4-flash_tp2_cross_s17.sqlite.gz
  $H/fp4_prefill_deepseek-v4-flash_tp2_smem_s17.sqlite.gz
  $H/fp4_prefill_deepseek-v4-flash_tp2_cross2_s17.sqlite.gz
  $H/fp4_prefill_deepseek-v4-flash_tp2_smem2_s17.sqlite.gz
  $H/fp4_prefill_deepseek-v4-flash_tp2_halves_s18.sqlite.gz
  $H/fp4_prefill_deepseek-v4-flash_tp2_cross_s18.sqlite.gz
  $H/fp4_prefill_deepseek-v4-flash_tp2_ws_s18.sqlite.gz
  $H/fp4_prefill_deepseek-v4-flash_tp2_cross_s19.sqlite.gz
  $H/fp4_prefill_deepseek-v4-flash_tp2_cross_s20.sqlite.gz
  $H/fp4_prefill_deepseek-v4-flash_tp2_coord6144_s20.sqlite.gz
  $H/fp4_prefill_deepseek-v4-flash_tp2_swap_resident_s20.sqlite.gz
  $H/fp4_prefill_deepseek-v4-flash_tp2_coord6144b_s20.sqlite.gz
  $H/fp4_prefill_deepseek-v4-flash_tp2_split_s23.sqlite.gz
  $H/fp4_prefill_deepseek-v4-flash_tp2_split2_s23.sqlite.gz
  $H/fp4_prefill_deepseek-v4-flash_tp2_split_band_s23.sqlite.gz
  $H/fp4_prefill_deepseek-v4-flash_tp1_gluon_s23.sqlite.gz
  $H/fp4_prefill_deepseek-v4-flash_dense_gluon_s23.sqlite.gz
  $H/fp4_prefill_deepseek-v4-flash_tp1_cross_s23.sqlite.gz
)
gather=($H/fp8_decode_dsv3-tp1_qwen3-tp4-tp1_gather_s6.sqlite.gz)

dbs() { for f in "$@"; do printf -- '--db\n%s\n' "$f"; done; }
export_family() {
  local family=$1; shift
  mapfile -t args < <(dbs "$@")
  python -m moetune export --kernel "$family" "${args[@]}" --out configs
}
export_family fp8_decode "${fp8[@]}" "$@"
export_family fp4_prefill "${fp4[@]}" "$@"
export_family gather_rows "${gather[@]}" "$@"
python -m moetune verify configs/ --schema-only
