"""moe_sum: each token's active route rows summed in fp32 (interpreter on the CPU)."""

import pytest
import torch

from moetune.kernels.fp4_prefill.moe_sum import BLOCK_H, moe_sum, moe_sum_reference


def _case(m, top_k, h, inactive=0.3, seed=0, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 8, (m, top_k), generator=g, dtype=torch.int32)
    ids[torch.rand(m, top_k, generator=g) < inactive] = -1
    rows = torch.randn(m * top_k, h, generator=g)
    rows[ids.reshape(-1) < 0] = float("nan")  # never written by the GEMM: must never be read
    return rows.to(device), ids.to(device)


@pytest.mark.parametrize("m, top_k, h, dtype", [
    (5, 6, 96, torch.bfloat16), (3, 1, BLOCK_H + 40, torch.float32), (7, 4, 2 * BLOCK_H, torch.float16)])
def test_sums_the_active_routes_only(m, top_k, h, dtype, device):
    rows, ids = _case(m, top_k, h, device=device)
    out = moe_sum(rows, ids, dtype)
    assert out.dtype == dtype and out.shape == (m, h) and torch.isfinite(out).all()
    # bit-equal in fp32; in 16-bit types within one ulp (the interpreter's fp32 -> bf16 cast truncates, the
    # GPU's rounds to nearest)
    ulp = 0.0 if dtype == torch.float32 else torch.finfo(dtype).eps
    torch.testing.assert_close(out, moe_sum_reference(rows, ids, dtype), rtol=ulp, atol=0)
    # a token with every route inactive sums to zero
    ids[0] = -1
    assert moe_sum(rows, ids, dtype)[0].abs().sum() == 0


def test_reads_rows_with_a_row_stride_and_int64_ids(device):
    rows, ids = _case(4, 2, 64, device=device)
    wide = torch.full((8, 100), float("nan"), device=device)
    wide[:, :64] = rows
    out = moe_sum(wide[:, :64], ids.long(), torch.float32)
    torch.testing.assert_close(out, moe_sum_reference(rows, ids, torch.float32), rtol=0, atol=0)


def test_empty_and_bad_input(device):
    empty = moe_sum(torch.empty(0, 16, device=device), torch.empty(0, 6, dtype=torch.int32, device=device),
                    torch.bfloat16)
    assert empty.shape == (0, 16)
    rows, ids = _case(2, 3, 8, device=device)
    with pytest.raises(ValueError, match="rows must be a 2-D float tensor"):
        moe_sum(rows[:5], ids, torch.float32)
    with pytest.raises(ValueError, match="topk_ids must be a 2-D int32/int64"):
        moe_sum(rows, ids.float(), torch.float32)
    with pytest.raises(ValueError, match="unit stride along H"):
        moe_sum(rows.t().contiguous().t(), ids, torch.float32)
