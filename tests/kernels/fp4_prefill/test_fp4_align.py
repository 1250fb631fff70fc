"""Route alignment: every active route once, blocks of one expert, padding and sentinels, worst-case sizes."""

import pytest
import torch
from conftest import DEVICE

from moetune.kernels.fp4_prefill.align import align_routes, max_slots
from moetune.kernels.fp4_prefill.reference import align_routes_reference
from moetune.routing import make_routes


def _check(ids: torch.Tensor, num_experts: int, block_m: int) -> None:
    a = align_routes(ids, num_experts, block_m)
    flat = ids.reshape(-1).long()
    routes = flat.numel()
    assert a.sorted_ids.numel() == max_slots(routes, num_experts, block_m)
    assert a.expert_ids.numel() == a.sorted_ids.numel() // block_m
    counts = torch.bincount(flat[flat >= 0], minlength=num_experts)
    padded = int(((counts + block_m - 1) // block_m * block_m).sum())
    assert a.num_padded.tolist() == [padded]
    used = a.sorted_ids[:padded].long()
    real = used[used < routes]
    assert sorted(real.tolist()) == (flat >= 0).nonzero().squeeze(1).tolist()  # each active route once
    assert (a.sorted_ids[padded:] == routes).all()  # sentinels past the count
    blocks = padded // block_m
    assert (a.expert_ids[blocks:] == -1).all()
    for b in range(blocks):
        slot = used[b * block_m:(b + 1) * block_m]
        e = a.expert_ids[b].item()
        assert 0 <= e < num_experts and counts[e] > 0  # no block for an empty expert
        rows = slot[slot < routes]
        assert rows.numel() > 0 and (flat[rows] == e).all()
    assert a.expert_ids[:blocks].tolist() == sorted(a.expert_ids[:blocks].tolist())


@pytest.mark.parametrize("block_m", [1, 16, 64])
@pytest.mark.parametrize("routing", ["uniform", "zipf:3"])
def test_random_routes(block_m, routing):
    g = torch.Generator().manual_seed(block_m)
    ids, _ = make_routes(50, 4, 16, routing=routing, active_fraction=0.75, generator=g)
    _check(ids.to(DEVICE), 16, block_m)


def test_empty_experts_skewed_and_single_expert():
    ids = torch.tensor([[5, 5], [5, 0], [5, -1], [-1, -1]], dtype=torch.int32, device=DEVICE)
    _check(ids, 8, 4)
    _check(torch.zeros(7, 1, dtype=torch.int64, device=DEVICE), 1, 16)


def test_all_inactive_and_zero_tokens():
    a = align_routes(torch.full((3, 2), -1, dtype=torch.int32, device=DEVICE), 4, 16)
    assert a.num_padded.item() == 0 and (a.expert_ids == -1).all() and (a.sorted_ids == 6).all()
    a = align_routes(torch.zeros(0, 2, dtype=torch.int32, device=DEVICE), 4, 16)
    assert a.num_padded.item() == 0 and a.routes == 0


def test_worst_case_exactly_fits():
    # every expert gets one route: each pads block_m - 1 rows, the most padding possible
    ids = torch.arange(8, dtype=torch.int32, device=DEVICE)[:, None]
    a = align_routes(ids, 8, 16)
    assert a.num_padded.item() == 128 and a.sorted_ids.numel() >= 128
    _check(ids, 8, 16)


def _same_bytes(ids: torch.Tensor, num_experts: int, block_m: int, chunk: int) -> None:
    ids = ids.to(DEVICE)
    got = align_routes(ids, num_experts, block_m, chunk=chunk)
    want = align_routes_reference(ids, num_experts, block_m)
    assert (got.block_m, got.routes) == (want.block_m, want.routes)
    for name in ("sorted_ids", "expert_ids", "num_padded"):
        a, b = getattr(got, name), getattr(want, name)
        assert a.dtype == b.dtype == torch.int32 and torch.equal(a, b), name


@pytest.mark.parametrize("tokens,top_k,experts,block_m,chunk,routing,active", [
    (50, 4, 16, 16, 16, "uniform", 0.75),     # many chunks, the last one partial
    (37, 6, 13, 32, 32, "zipf:2", 1.0),        # E not a power of two, skewed
    (64, 2, 7, 1, 16, "zipf:4", 0.5),          # block_m 1, half the routes inactive
    (200, 6, 64, 64, 64, "uniform", 0.9),
    (100, 4, 256, 16, 128, "zipf:3", 0.8),     # E 256: dump bin past a power of two
    (90, 4, 128, 256, 1024, "uniform", 1.0),   # the default chunk, one program
])
def test_same_bytes_as_the_torch_reference(tokens, top_k, experts, block_m, chunk, routing, active):
    g = torch.Generator().manual_seed(tokens * experts + block_m)
    ids, _ = make_routes(tokens, top_k, experts, routing=routing, active_fraction=active, generator=g)
    _same_bytes(ids, experts, block_m, chunk)


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
def test_edge_cases_match_the_reference(dtype):
    _same_bytes(torch.zeros(0, 4, dtype=dtype), 8, 16, 16)              # zero routes
    _same_bytes(torch.zeros(0, 4, dtype=dtype), 0, 16, 16)              # nothing at all
    _same_bytes(torch.full((9, 2), -1, dtype=dtype), 5, 16, 16)          # all inactive
    _same_bytes(torch.zeros(21, 2, dtype=dtype), 1, 16, 16)              # one expert
    _same_bytes(torch.tensor([[3, -7], [9, 2], [-1, 4]], dtype=dtype), 5, 4, 16)  # out-of-range ids
    _same_bytes(torch.randint(-1, 3, (33,), dtype=dtype), 3, 8, 16)     # 1-D ids, 33 = 2 chunks + 1
    strided = torch.randint(0, 6, (40, 4), dtype=dtype).to(DEVICE)[:, ::2]
    _same_bytes(strided, 6, 16, 16)                                        # non-contiguous ids


def test_bad_arguments_are_refused():
    ids = torch.zeros(4, 2, dtype=torch.int32)
    for kwargs, match in (({"block_m": 0}, "block_m"), ({"num_experts": -1}, "num_experts"),
                          ({"chunk": 24}, "chunk"), ({"chunk": 8}, "chunk")):
        args = {"num_experts": 4, "block_m": 16, **kwargs}
        chunk = args.pop("chunk", 16)
        with pytest.raises(ValueError, match=match):
            align_routes(ids, args["num_experts"], args["block_m"], chunk=chunk)
    with pytest.raises(ValueError, match="topk_ids"):
        align_routes(ids.float(), 4, 16)


@pytest.mark.gpu
@pytest.mark.parametrize("routes,experts,top_k",
                         [(768, 256, 6), (49152, 256, 6), (98304, 128, 4), (3000, 100, 3)])
@pytest.mark.parametrize("block_m", [16, 128, 256])
def test_gpu_sizes_match_the_reference(routes, experts, top_k, block_m):
    g = torch.Generator().manual_seed(routes + block_m)
    ids, _ = make_routes(routes // top_k, top_k, experts, routing="zipf:2", active_fraction=0.9, generator=g)
    ids = ids.cuda()
    got = align_routes(ids, experts, block_m)
    want = align_routes_reference(ids, experts, block_m)
    for name in ("sorted_ids", "expert_ids", "num_padded"):
        assert torch.equal(getattr(got, name), getattr(want, name)), name


@pytest.mark.gpu
def test_alignment_is_captured_by_a_cuda_graph():
    """No host copies or syncs: a CUDA graph of align_routes replays to the eager result for new ids."""
    ids = torch.randint(-1, 8, (64, 4), device="cuda", dtype=torch.int32)
    align_routes(ids, 8, 16)  # warm-up outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = align_routes(ids, 8, 16)
    ids.copy_(torch.randint(-1, 8, (64, 4), device="cuda", dtype=torch.int32))
    graph.replay()
    eager = align_routes(ids, 8, 16)
    for got, want in ((captured.sorted_ids, eager.sorted_ids), (captured.expert_ids, eager.expert_ids),
                      (captured.num_padded, eager.num_padded)):
        assert torch.equal(got, want)


def test_both_launches_compile_for_sm90():
    """What the GPU runs (compiled for sm_90 without a GPU, by whichever Triton is installed): the
    interpreter accepts kernels that Triton's compiler refuses (a constexpr reassigned in a static loop)."""
    from sm90_compile import compile_sm90

    common = {"types": {"ids_ptr": "*i32", "hist_ptr": "*i32", "shift_ptr": "*i32", "sorted_ptr": "*i32",
                        "expert_ptr": "*i32", "padded_ptr": "*i32"}, "options": {"num_warps": 4}}
    jobs = [{"kernel": "moetune.kernels.fp4_prefill.align._chunk_histograms",
             "const": {"CHUNK": 1024, "E_P2": 256, "BINS": 512}, **common},
            {"kernel": "moetune.kernels.fp4_prefill.align._scatter_routes",
             "const": {"BLOCK_M": 64, "CHUNK": 1024, "LOG_CHUNK": 10, "E_P2": 256, "ROWS": 32}, **common}]
    got = compile_sm90(jobs)
    if isinstance(got, str):
        pytest.skip(f"cannot compile for sm_90 here: {got}")
    histograms, scatter = (g["ptx"] for g in got)
    assert "atom" not in scatter  # one program's sort and scatter, no atomics: deterministic order
    assert histograms.count("st.global") >= 2
