"""gather_rows_with_scales: byte-exact against torch indexing, tails, maps, configs, out=, bad input.

Every comparison is on integer views: random fp8 bytes are often NaN, and NaN != NaN.
"""

import pytest
import torch

import moetune
from moetune.kernels.gather_rows import gather as gr
from moetune.kernels.gather_rows.config import group_count
from moetune.kernels.gather_rows.gather import gather_rows_with_scales, gather_rows_with_scales_reference
from moetune.routing import make_routes
from moetune.specs.gather_rows import sorted_dst2src

# Wide tiles keep the interpreter's program count (and the suite's time) small.
FAST = {"BLOCK_SIZE_K": 4096, "ROWS_PER_PROGRAM": 4, "num_warps": 4}
DTYPES = [torch.float8_e4m3fn, torch.float8_e5m2, torch.int8, torch.uint8]


def make(m, k, dtype=torch.float8_e4m3fn, seed=0, device="cpu"):
    g = torch.Generator(device).manual_seed(seed)
    q = torch.randint(0, 256, (m, k), generator=g, dtype=torch.uint8, device=device).view(dtype)
    scales = torch.randn(m, group_count(k), generator=g, device=device)
    return q, scales


def bytes_of(t):
    return t.contiguous().view(torch.uint8)


def assert_gathered(got, q, scales, idx):
    """got == (q[idx], scales[idx]) byte for byte, checked row by row without the reference helper."""
    q_out, s_out = got
    assert q_out.dtype == q.dtype and s_out.dtype == torch.float32
    assert q_out.shape == (idx.numel(), q.shape[1]) and s_out.shape == (idx.numel(), scales.shape[1])
    qb, ob = q.view(torch.uint8), q_out.view(torch.uint8)
    for r, src in enumerate(idx.tolist()):
        assert torch.equal(ob[r], qb[src]), f"row {r} (source {src}) values differ"
        assert torch.equal(s_out[r].view(torch.int32), scales[src].view(torch.int32)), f"row {r} scales"


@pytest.mark.parametrize("k", [64, 128, 896, 2048, 7168])
def test_matches_torch_indexing_for_every_width(k, device):
    q, scales = make(7, k, DTYPES[k % 4], seed=k, device=device)
    idx = torch.randint(0, 7, (13,), generator=torch.Generator(device).manual_seed(1), dtype=torch.int32,
                        device=device)
    assert len(set(idx.tolist())) < idx.numel()  # duplicate sources, as routing produces
    assert_gathered(gather_rows_with_scales(q, scales, idx, config=FAST), q, scales, idx)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
def test_dtypes_and_index_dtypes(dtype, index_dtype, device):
    q, scales = make(5, 300, dtype, device=device)
    idx = torch.tensor([4, 0, 0, 2, 4, 1], dtype=index_dtype, device=device)
    got = gather_rows_with_scales(q, scales, idx, config=FAST)
    ref = gather_rows_with_scales_reference(q, scales, idx)
    assert torch.equal(bytes_of(got[0]), bytes_of(ref[0]))
    assert torch.equal(got[1].view(torch.int32), ref[1].view(torch.int32))
    assert_gathered(got, q, scales, idx)


@pytest.mark.parametrize("config", [
    {"BLOCK_SIZE_K": 128, "ROWS_PER_PROGRAM": 1, "num_warps": 1},
    {"BLOCK_SIZE_K": 256, "ROWS_PER_PROGRAM": 16, "num_warps": 2},
    {"BLOCK_SIZE_K": 512, "ROWS_PER_PROGRAM": 2, "num_warps": 8},
    {"BLOCK_SIZE_K": 8192, "ROWS_PER_PROGRAM": 8, "num_warps": 4},
    {"ROWS_PER_PROGRAM": 4},  # missing keys take the shipped default
])
def test_configs_with_routed_map(config, device):
    """The real map: tokens sorted by expert, each repeated once per expert it routes to."""
    ids, _ = make_routes(9, 3, 8, generator=torch.Generator(device).manual_seed(3), device=device)
    idx = sorted_dst2src(ids)
    q, scales = make(9, 640, device=device)
    assert_gathered(gather_rows_with_scales(q, scales, idx, config=config), q, scales, idx)


def test_nan_and_inf_byte_patterns_survive(device):
    k = 256
    q = torch.tensor([0x7F, 0xFF, 0x7C, 0xFC, 0x7E, 0x80, 0x00, 0x01] * (k // 8), dtype=torch.uint8,
                     device=device)
    q = torch.stack([q, q.flip(0)]).view(torch.float8_e4m3fn)
    # NaNs with payloads, +inf, a negative denormal
    special = torch.tensor([[0x7FC00001, -1], [0x7F800000, -0x7FBFFFFF]], dtype=torch.int32, device=device)
    scales = special.view(torch.float32)
    idx = torch.tensor([1, 0, 1], device=device)
    assert_gathered(gather_rows_with_scales(q, scales, idx, config=FAST), q, scales, idx)


def test_zero_rows_returns_empty_without_a_launch(monkeypatch, device):
    class NoLaunch:
        def __getitem__(self, grid):
            raise AssertionError("launched a kernel for R = 0")

    monkeypatch.setattr(gr, "_gather_rows_kernel", NoLaunch())
    q, scales = make(4, 896, device=device)
    q_out, s_out = gather_rows_with_scales(q, scales, torch.empty(0, dtype=torch.int32, device=device))
    assert q_out.shape == (0, 896) and q_out.dtype == q.dtype
    assert s_out.shape == (0, 7) and s_out.dtype == torch.float32


def test_out_is_written_in_place_and_may_be_strided(device):
    q, scales = make(6, 896, torch.float8_e5m2, device=device)
    idx = torch.tensor([5, 5, 0, 3], device=device)
    q_buf = torch.zeros(4, 1024, dtype=torch.uint8, device=device)
    s_buf = torch.zeros(4, 9, device=device)
    out = (q_buf[:, 64:64 + 896].view(torch.float8_e5m2), s_buf[:, 1:8])
    got = gather_rows_with_scales(q, scales, idx, config=FAST, out=out)
    assert got[0] is out[0] and got[1] is out[1]
    assert_gathered(got, q, scales, idx)
    assert not q_buf[:, :64].any() and not q_buf[:, 64 + 896:].any()  # nothing outside the view
    assert not s_buf[:, 0].any() and not s_buf[:, 8].any()


def test_strided_q_scales_and_map(device):
    base_q, base_s = make(8, 1200, torch.int8, device=device)
    q = base_q[1::2, 100:100 + 1000]  # row stride 2400, unit inner stride
    scales = base_s[1::2, :8]
    idx = torch.tensor([3, 0, 2, 2], device=device)
    assert_gathered(gather_rows_with_scales(q, scales, idx, config=FAST), q, scales, idx)
    strided_idx = torch.tensor([3, 9, 0, 9, 2, 9, 2], device=device)[::2]
    assert_gathered(gather_rows_with_scales(q, scales, strided_idx, config=FAST), q, scales, strided_idx)
    qt = base_q[:4, ::2][:, :384]  # inner stride 2 also works, through the strides
    assert_gathered(gather_rows_with_scales(qt, base_s[:4, :3], idx, config=FAST), qt, base_s[:4, :3], idx)


def test_config_none_uses_the_picker_and_public_export(device):
    q, scales = make(5, 384, device=device)
    idx = torch.tensor([0, 4, 4, 1], device=device)
    assert moetune.gather_rows_with_scales is gather_rows_with_scales
    got = gather_rows_with_scales(q, scales, idx, experts=8, top_k=2)
    assert_gathered(got, q, scales, idx)


def test_validate_rejects_out_of_range_indices(device):
    q, scales = make(4, 128, device=device)
    for bad in ([0, 4], [-1, 2]):
        with pytest.raises(ValueError, match="dst2src"):
            gather_rows_with_scales(q, scales, torch.tensor(bad, device=device), validate=True)
    idx = torch.tensor([3, 0], device=device)
    assert_gathered(gather_rows_with_scales(q, scales, idx, config=FAST, validate=True), q, scales, idx)


def _bad_inputs(device):
    q, scales = make(4, 256, device=device)
    idx = torch.tensor([1, 2], dtype=torch.int32, device=device)
    yield "q", (q.view(torch.uint8).to(torch.bfloat16), scales, idx)
    yield "q", (q[0], scales, idx)
    yield "q", ([[1, 2]], scales, idx)
    yield "scales", (q, scales.half(), idx)
    yield "scales", (q, scales[:, :1], idx)
    yield "scales", (q, scales[:3], idx)
    yield "dst2src", (q, scales, idx.float())
    yield "dst2src", (q, scales, idx.view(2, 1))
    yield "dst2src", (q, scales, idx.short())
    yield "dst2src", (q, scales, torch.empty(2, dtype=torch.int32, device="meta"))
    yield "scales", (q, scales.to("meta"), idx)


@pytest.mark.parametrize("case", range(11))
def test_bad_input_names_the_argument(case, device):
    name, args = list(_bad_inputs(device))[case]
    with pytest.raises(ValueError, match=name):
        gather_rows_with_scales(*args)


def test_bad_out_and_bad_config_raise(device):
    q, scales = make(4, 256, device=device)
    idx = torch.tensor([1, 2], device=device)
    good = (torch.empty(2, 256, dtype=q.dtype, device=device), torch.empty(2, 2, device=device))
    for out in (good[0], (good[0],), (good[0], good[1].double()), (good[0][:1], good[1]),
                (good[0].view(torch.int8), good[1]), (good[0], good[1].to("meta"))):
        with pytest.raises(ValueError, match="out"):
            gather_rows_with_scales(q, scales, idx, config=FAST, out=out)
    for config, key in (({"BLOCK_M": 64}, "BLOCK_M"), ({"BLOCK_SIZE_K": 96}, "BLOCK_SIZE_K"),
                        ({"ROWS_PER_PROGRAM": 3}, "ROWS_PER_PROGRAM"), ({"num_warps": True}, "num_warps"),
                        ({"num_warps": 64}, "num_warps")):
        with pytest.raises(ValueError, match=key):
            gather_rows_with_scales(q, scales, idx, config=config)
    wide, wide_s = make(1, 70000, device=device)
    with pytest.raises(ValueError, match="BLOCK_SIZE_K"):
        gather_rows_with_scales(wide, wide_s, idx[:1] * 0, config={"BLOCK_SIZE_K": 1})


@pytest.mark.gpu
def test_row_offsets_past_int32_on_gpu():
    """A source row beyond 2**31 bytes: int32 row bases would wrap."""
    m, k = (1 << 31) // 7168 + 8, 7168
    q = torch.empty(m, k, dtype=torch.uint8, device="cuda")
    q[-8:] = torch.randint(0, 256, (8, k), dtype=torch.uint8, device="cuda")
    scales = torch.randn(m, group_count(k), device="cuda")
    idx = torch.arange(m - 8, m, device="cuda").flip(0)
    assert_gathered(gather_rows_with_scales(q, scales, idx), q, scales, idx)
