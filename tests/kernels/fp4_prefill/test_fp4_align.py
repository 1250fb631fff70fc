"""Route alignment: every active route once, blocks of one expert, padding and sentinels, worst-case sizes."""

import pytest
import torch

from moetune.kernels.fp4_prefill.align import align_routes, max_slots
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
    _check(ids, 16, block_m)


def test_empty_experts_skewed_and_single_expert():
    ids = torch.tensor([[5, 5], [5, 0], [5, -1], [-1, -1]], dtype=torch.int32)
    _check(ids, 8, 4)
    _check(torch.zeros(7, 1, dtype=torch.int64), 1, 16)


def test_all_inactive_and_zero_tokens():
    a = align_routes(torch.full((3, 2), -1, dtype=torch.int32), 4, 16)
    assert a.num_padded.item() == 0 and (a.expert_ids == -1).all() and (a.sorted_ids == 6).all()
    a = align_routes(torch.zeros(0, 2, dtype=torch.int32), 4, 16)
    assert a.num_padded.item() == 0 and a.routes == 0


def test_worst_case_exactly_fits():
    # every expert gets one route: each pads block_m - 1 rows, the most padding possible
    ids = torch.arange(8, dtype=torch.int32)[:, None]
    a = align_routes(ids, 8, 16)
    assert a.num_padded.item() == 128 and a.sorted_ids.numel() >= 128
    _check(ids, 8, 16)


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
