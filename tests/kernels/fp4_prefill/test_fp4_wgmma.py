"""IMPL "gluon": the Gluon FP4 GEMM for sm_90 (moetune/kernels/fp4_prefill/gluon_*.py).

Gluon has no interpreter, so on the CPU: the activation K order, the config and problem constraints, the
refusal to launch off a GPU, and an offline sm_90 compile of the kernel with the installed Triton (its
wgmma async, the operand layouts trivially converted). The numbers themselves are checked on a GPU
(``gpu`` tests, MOETUNE_TEST_GPU=1 on an H200)."""

import pytest
import torch

from moetune.device import INTERPRETER, DeviceInfo
from moetune.kernels.fp4_prefill.config import GLUON_FIXED, normalize_config, smem_bytes

GLUON = {"IMPL": "gluon", **GLUON_FIXED, "SWAP_AB": 1, "BLOCK_SIZE_M": 32, "BLOCK_SIZE_N": 64, "num_warps": 4,
         "num_stages": 3, "GROUP_SIZE_M": 8}
# SWAP_AB 0: the activations as the wgmma's M side, decoded weights through shared memory
GLUON_SMEM = {**GLUON, "SWAP_AB": 0, "BLOCK_SIZE_M": 128, "num_warps": 8, "num_stages": 2}
H200 = DeviceInfo(name="NVIDIA H200", arch="sm_90", sm_count=132, max_shared_mem=232448, l2_bytes=60 << 20,
                  is_gpu=True)


def test_wgmma_k_order_puts_each_thread_group_in_its_lanes():
    from moetune.quant.fp8_act import to_wgmma_k_order

    a = torch.arange(3 * 256, dtype=torch.int32).remainder(251).to(torch.uint8).reshape(3, 256)
    out = to_wgmma_k_order(a.view(torch.float8_e4m3fn)).view(torch.uint8)
    for chunk in range(2):
        for b in range(4):
            for h in range(2):
                for q in range(4):
                    for i in range(4):
                        logical = chunk * 128 + 32 * b + 16 * h + 4 * q + i
                        real = chunk * 128 + 32 * q + 8 * b + 4 * h + i
                        assert torch.equal(out[:, logical], a[:, real])
    assert sorted(out[0].tolist()) == sorted(a[0].tolist())
    strided = torch.cat([a, a], dim=1)[:, 256:]  # a non-contiguous view: permuted like its copy
    assert torch.equal(to_wgmma_k_order(strided.view(torch.float8_e4m3fn)).view(torch.uint8), out)
    with pytest.raises(ValueError, match="multiple of 128"):
        to_wgmma_k_order(a[:, :192])


def test_producers_write_the_wgmma_k_order(device):
    """quantize_fp8_act and the swiglu quantizer write IMPL gluon's order directly: the same bytes as their
    real-order output permuted, the same scales."""
    from moetune.kernels.fp4_prefill.act_quant import swiglu_quant
    from moetune.quant import quantize_fp8_act
    from moetune.quant.fp8_act import to_wgmma_k_order

    g = torch.Generator().manual_seed(3)
    x = torch.randn(5, 384, generator=g) * torch.logspace(-2, 2, 5)[:, None]
    q, s = quantize_fp8_act(x)
    qw, sw = quantize_fp8_act(x, k_order="wgmma")
    assert torch.equal(sw, s) and qw.is_contiguous()
    assert torch.equal(qw.view(torch.uint8), to_wgmma_k_order(q).view(torch.uint8))
    with pytest.raises(ValueError, match="group must be 128"):
        quantize_fp8_act(x, 64, k_order="wgmma")
    with pytest.raises(ValueError, match="k_order"):
        quantize_fp8_act(x, k_order="mma")

    gu = torch.randn(4, 512, generator=g).to(device)
    w = (torch.rand(4, generator=g) + 0.1).to(device)
    ids = torch.tensor([0, -1, 2, 1], dtype=torch.int32, device=device)
    q, s = swiglu_quant(gu, w, ids, None)
    qw, sw = swiglu_quant(gu, w, ids, None, k_order="wgmma")
    act = ids >= 0
    assert torch.equal(sw[act], s[act])
    assert torch.equal(qw[act].view(torch.uint8), to_wgmma_k_order(q[act]).view(torch.uint8))
    with pytest.raises(ValueError, match="multiple of 128"):
        swiglu_quant(torch.randn(2, 192, device=device), w[:2], ids[:2], None, k_order="wgmma")


def test_wgmma_k_order_is_for_gluon_configs_only():
    from moetune.kernels.fp4_prefill.layer import grouped_gemm

    triton_cfg = normalize_config({})
    with pytest.raises(ValueError, match="a_k_order 'wgmma' is the K order of config IMPL 'gluon'"):
        grouped_gemm(*[None] * 6, a_div=1, config=triton_cfg, a_k_order="wgmma")


@pytest.mark.parametrize("key, value", [("DECODE", "fp8"), ("UNPACK", "halves"), ("BLOCK_SIZE_K", 64),
                                        ("W_TMA", 1), ("SCALE_AHEAD", 1)])
def test_gluon_config_runs_one_design_only(key, value):
    with pytest.raises(ValueError, match=key):
        normalize_config({**GLUON, key: value})


def test_gluon_config_values_are_checked():
    assert normalize_config(GLUON)["IMPL"] == "gluon"
    assert normalize_config({**GLUON, "SCALE_RING": 1})["SCALE_RING"] == 1
    with pytest.raises(ValueError, match="IMPL"):
        normalize_config({**GLUON, "IMPL": "cuda"})
    with pytest.raises(ValueError, match="SCALE_RING"):
        normalize_config({**GLUON, "SCALE_RING": 2})
    with pytest.raises(ValueError, match="SCALE_RING 1 is a switch of IMPL 'gluon'"):
        normalize_config({"SCALE_RING": 1})
    assert normalize_config({**GLUON, "RING_SPLIT": 1})["RING_SPLIT"] == 1
    assert normalize_config({**GLUON, "MAXNREG": 96})["MAXNREG"] == 96
    for other, match in (({"RING_SPLIT": 1}, "IMPL 'triton'"), ({**GLUON_SMEM, "RING_SPLIT": 1}, "SWAP_AB 0"),
                         ({**GLUON, "RING_SPLIT": True}, "RING_SPLIT must be 0 or 1"),
                         ({"MAXNREG": 96}, "MAXNREG 96 is a switch"),
                         ({**GLUON_SMEM, "MAXNREG": 96}, "SWAP_AB 0"),
                         ({**GLUON, "MAXNREG": 64}, r"MAXNREG must be one of \(0, 96\)"),
                         ({**GLUON, "MAXNREG": False}, "MAXNREG must be one of")):
        with pytest.raises(ValueError, match=match):
            normalize_config(other)
    assert normalize_config(GLUON_SMEM)["SWAP_AB"] == 0
    for bad in ({**GLUON_SMEM, "MMA_HALVES": 2}, {**GLUON_SMEM, "MMA_HALVES": True}):
        with pytest.raises(ValueError, match="MMA_HALVES must be"):
            normalize_config(bad)
    halves = {**GLUON_SMEM, "MMA_HALVES": 1, "num_stages": 3}
    assert normalize_config(halves)["MMA_HALVES"] == 1
    for other in ({**halves, "SWAP_AB": 1}, {**halves, "SCALE_RING": 1}, {"MMA_HALVES": 1}):
        with pytest.raises(ValueError, match="MMA_HALVES 1 is a switch of IMPL 'gluon' with SWAP_AB 0"):
            normalize_config(other)
    ws = {**GLUON_SMEM, "DECODE_WARPS": 4}
    assert normalize_config(ws)["DECODE_WARPS"] == 4
    for bad in ({**ws, "DECODE_WARPS": 2}, {**ws, "DECODE_WARPS": True}):
        with pytest.raises(ValueError, match="DECODE_WARPS must be"):
            normalize_config(bad)
    for other in ({**ws, "SWAP_AB": 1}, {**ws, "SCALE_RING": 1}, {**ws, "MMA_HALVES": 1, "num_stages": 3},
                  {"DECODE_WARPS": 4}):
        with pytest.raises(ValueError, match="DECODE_WARPS 4 is a switch of IMPL 'gluon' with SWAP_AB 0"):
            normalize_config(other)
    resident = {**ws, "A_RESIDENT": 1, "GROUP_SIZE_M": 1}
    assert normalize_config(resident)["A_RESIDENT"] == 1
    for bad in ({**resident, "A_RESIDENT": 2}, {**resident, "A_RESIDENT": True}):
        with pytest.raises(ValueError, match="A_RESIDENT must be"):
            normalize_config(bad)
    for other in ({**resident, "DECODE_WARPS": 0}, {**resident, "GROUP_SIZE_M": 8},
                  {"A_RESIDENT": 1, "SWAP_AB": 1}):
        with pytest.raises(ValueError, match="A_RESIDENT 1 is a switch of IMPL 'gluon' with SWAP_AB 1, or of "
                                             "DECODE_WARPS .* must be 1"):
            normalize_config(other)
    assert normalize_config({**GLUON, "A_RESIDENT": 1})["GROUP_SIZE_M"] == 8  # SWAP_AB 1: any group


def _problem(n=2048, k=4096, routes=6144):
    from moetune.problem import Problem
    from moetune.specs.registry import get_spec

    spec = get_spec("fp4_prefill.gate_up")
    return spec, Problem("fp4_prefill.gate_up", {"E": 256, "N": n, "K": k, "top_k": 6}, routes // 6, routes)


def test_gluon_constraint_needs_sm90_and_whole_k_trips():
    from moetune.problem import Problem
    from moetune.specs.registry import get_spec

    spec, problem = _problem()
    assert spec.constraint(GLUON, problem, H200) is None
    assert "sm_90" in spec.constraint(GLUON, problem, INTERPRETER)
    assert "K % 256" in spec.constraint(GLUON, _problem(k=4096 + 128)[1], H200)
    assert spec.constraint(GLUON, _problem(n=2048 + 32)[1], H200) is None  # a tail N tile
    assert "16 of BLOCK_SIZE_N" in spec.constraint({**GLUON, "num_warps": 8}, problem, H200)
    assert spec.constraint(GLUON_SMEM, problem, H200) is None  # 64 rows of M a warpgroup, any N tile
    assert spec.constraint({**GLUON_SMEM, "BLOCK_SIZE_N": 16}, problem, H200) is None
    assert "16 of BLOCK_SIZE_M" in spec.constraint({**GLUON_SMEM, "BLOCK_SIZE_M": 64}, problem, H200)
    assert "num_stages >= 2" in spec.constraint({**GLUON_SMEM, "num_stages": 1}, problem, H200)
    assert spec.constraint({**GLUON_SMEM, "num_stages": 1, "SCALE_RING": 1}, problem, H200) is None
    dense = _problem(routes=24576)[1]  # 96 rows an expert: a 256-row tile is in reach
    assert "BLOCK_SIZE_M <= 128" in spec.constraint({**GLUON_SMEM, "BLOCK_SIZE_M": 256}, dense, H200)
    assert spec.constraint({**GLUON_SMEM, "BLOCK_SIZE_M": 256, "SCALE_RING": 1}, dense, H200) is None
    halves = {**GLUON_SMEM, "MMA_HALVES": 1, "num_stages": 3}
    assert spec.constraint(halves, problem, H200) is None
    for tile in ({"num_stages": 2}, {"BLOCK_SIZE_N": 16}):
        assert "MMA_HALVES needs num_stages >= 3" in spec.constraint({**halves, **tile}, problem, H200)
    ws = {**GLUON_SMEM, "DECODE_WARPS": 4}
    assert spec.constraint(ws, problem, H200) is None
    assert "BLOCK_SIZE_M <= 128" in spec.constraint({**ws, "BLOCK_SIZE_M": 256}, dense, H200)
    # A_RESIDENT holds the M-block's K / 128 activation chunks: down's K 1024 at BM 128 fits with a bf16
    # output tile (~227 KB) but not an fp32 one, gate/up's K 4096 never
    resident = {**ws, "A_RESIDENT": 1, "GROUP_SIZE_M": 1, "BLOCK_SIZE_N": 128}
    down = Problem("fp4_prefill.down", {"E": 256, "N": 4096, "K": 1024, "top_k": 6}, 4096, 24576)
    down_spec = get_spec("fp4_prefill.down")
    assert down_spec.constraint({**resident, "OUT_DTYPE": "bf16"}, down, H200) is None
    assert "shared memory" in down_spec.constraint(resident, down, H200)
    assert down_spec.constraint({**resident, "BLOCK_SIZE_N": 64}, down, H200) is None
    assert "shared memory" in spec.constraint(resident, dense, H200)  # gate/up, K 4096
    small_k = Problem("fp4_prefill.down", {"E": 256, "N": 4096, "K": 256, "top_k": 6}, 4096, 24576)
    assert "K / 128 >= num_stages + 1" in down_spec.constraint({**resident, "BLOCK_SIZE_N": 64}, small_k,
                                                               H200)


def test_gluon_configs_are_candidates_once_per_tile():
    from moetune.specs.registry import get_spec

    spec = get_spec("fp4_prefill.gate_up")
    gluon = [c for c in spec.candidates() if c["IMPL"] == "gluon"]
    assert gluon and all(all(c[k] == v for k, v in GLUON_FIXED.items()) for c in gluon)
    tiles = {(c["BLOCK_SIZE_M"], c["BLOCK_SIZE_N"], c["GROUP_SIZE_M"], c["num_warps"], c["num_stages"],
              c["A_LAYOUT"], c["SCALE_RING"], c["SWAP_AB"], c["MMA_HALVES"], c["DECODE_WARPS"],
              c["A_RESIDENT"], c["RING_SPLIT"], c["MAXNREG"], c["W_TMA"]) for c in gluon}
    assert len(tiles) == len(gluon) and {c["SCALE_RING"] for c in gluon} == {0, 1}
    switches = ("SWAP_AB", "SCALE_RING", "MMA_HALVES", "DECODE_WARPS", "A_RESIDENT")
    swap = {(1, 0, 0, 0, 0), (1, 1, 0, 0, 0), (1, 0, 0, 0, 1), (1, 1, 0, 0, 1)}  # with RING_SPLIT, MAXNREG
    ws = {(0, 0, 0, dw, resident) for dw in (4, 8) for resident in (0, 1)}  # with W_TMA
    assert {tuple(c[k] for k in (*switches, "RING_SPLIT", "MAXNREG", "W_TMA")) for c in gluon} == {
        (0, 0, 0, 0, 0, 0, 0, 0), (0, 1, 0, 0, 0, 0, 0, 0), (0, 0, 1, 0, 0, 0, 0, 0),
        *((*s, 0, 0, tma) for s in ws for tma in (0, 1)),
        *((*s, split, cap, 0) for s in swap for split in (0, 1) for cap in (0, 96))}
    assert all(c["GROUP_SIZE_M"] == 1 for c in gluon if c["A_RESIDENT"] and c["DECODE_WARPS"])
    assert "OUT_DTYPE" not in spec.space  # down's only
    assert {c["OUT_DTYPE"] for c in get_spec("fp4_prefill.down").candidates()} == {"fp32", "bf16"}
    assert not any(c["MMA_HALVES"] or c["DECODE_WARPS"] or c["A_RESIDENT"] for c in spec.candidates()
                   if c["IMPL"] != "gluon")
    assert all(c["IMPL"] == "gluon" for c in spec.candidates() if c["SCALE_RING"])
    assert all(c["IMPL"] == "gluon" and c["SWAP_AB"] for c in spec.candidates()
               if c["RING_SPLIT"] or c["MAXNREG"])


def test_gluon_refuses_the_interpreter_before_any_launch():
    from moetune.kernels.fp4_prefill.layer import fp4_prefill_moe

    g = torch.Generator().manual_seed(0)
    from moetune.quant import quantize_mxfp4

    x = torch.randn(4, 256, generator=g).to(torch.bfloat16)
    w13 = quantize_mxfp4(torch.randn(2, 128, 256, generator=g) * 0.05)
    w2 = quantize_mxfp4(torch.randn(2, 256, 64, generator=g) * 0.05)
    ids = torch.tensor([[0, 1]] * 4, dtype=torch.int32)
    wts = torch.full((4, 2), 0.5)
    with pytest.raises(ValueError, match="sm_90 CUDA GPU"):
        fp4_prefill_moe(x, *w13, *w2, wts, ids, config={"gate_up": GLUON, "down": GLUON})


@pytest.mark.parametrize("config", [GLUON, {**GLUON, "SCALE_RING": 1}, GLUON_SMEM,
                                    {**GLUON_SMEM, "SCALE_RING": 1},
                                    {**GLUON_SMEM, "MMA_HALVES": 1, "num_stages": 3},
                                    {**GLUON_SMEM, "DECODE_WARPS": 4}, {**GLUON_SMEM, "DECODE_WARPS": 8},
                                    {**GLUON_SMEM, "DECODE_WARPS": 4, "W_TMA": 1},
                                    {**GLUON_SMEM, "DECODE_WARPS": 4, "A_RESIDENT": 1, "GROUP_SIZE_M": 1,
                                     "BLOCK_SIZE_N": 128, "OUT_DTYPE": "bf16"},
                                    {**GLUON, "SCALE_RING": 1, "A_RESIDENT": 1},
                                    {**GLUON, "SCALE_RING": 1, "RING_SPLIT": 1},
                                    {**GLUON, "num_stages": 2, "RING_SPLIT": 1},
                                    {**GLUON, "SCALE_RING": 1, "A_RESIDENT": 1, "RING_SPLIT": 1},
                                    {**GLUON, "BLOCK_SIZE_M": 16, "SCALE_RING": 1, "RING_SPLIT": 1,
                                     "MAXNREG": 96}],
                         ids=["swap", "swap-scale-ring", "smem", "smem-scale-ring", "smem-mma-halves",
                              "smem-decode-warps-4", "smem-decode-warps-8", "smem-decode-warps-tma",
                              "smem-resident-bf16",
                              "swap-resident", "swap-split", "swap-split-odd", "swap-resident-split",
                              "swap-split-maxnreg-96"])
def test_kernel_compiles_for_sm90_with_the_wgmma_async(config):
    """Offline compile (no GPU) with the installed Triton, in a process without TRITON_INTERPRET (the suite's
    interpreter cannot compile Gluon): catches Gluon API drift, and the A operand's layout chain must
    convert without data movement (assert_trivial inside the kernel)."""
    import json
    import os
    import subprocess
    import sys

    from moetune.kernels.fp4_prefill.gluon_gemm import _kernel

    code = (
        "import json, sys\n"
        "from moetune.kernels.fp4_prefill.gluon_gemm import compile_for_sm90\n"
        "cfg = json.loads(sys.argv[1])\n"
        "k = compile_for_sm90(cfg, out_dtype=cfg.get('OUT_DTYPE', 'fp32'))\n"
        "import re\n"
        "print(json.dumps({'async': 'isAsync = true' in k.asm['ttgir'], "
        "'wgmma': 'wgmma.mma_async' in k.asm['ptx'], 'shared': k.metadata.shared, "
        "'maxnreg': re.findall(r'\\.maxnreg\\s+(\\d+)', k.asm['ptx'])}))\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    run = subprocess.run([sys.executable, "-c", code, json.dumps(config)], capture_output=True, text=True,
                         env=env, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    got = json.loads(run.stdout.strip().splitlines()[-1])
    assert got["async"] and got["wgmma"]
    cap = _kernel(normalize_config(config, "down"), 6, False, 1024, 4096)[2].get("maxnreg")  # the launch's
    assert got["maxnreg"] == ([str(cap)] if cap else []) and (cap == 96) == bool(config.get("MAXNREG"))
    ring = config["num_stages"] + 1  # activation and packed-weight chunks, and SWAP_AB 0's decoded pair
    ring += ring % 2 * config.get("RING_SPLIT", 0)  # two halves of an odd ring
    bm, bn = config["BLOCK_SIZE_M"], config["BLOCK_SIZE_N"]
    acts = (1024 // 128 if config.get("A_RESIDENT") else ring) * bm * 128  # A_RESIDENT: all K (1024) of it
    staged = 0 if config["SWAP_AB"] else (2 + config.get("MMA_HALVES", 0)) * bn * 128
    if config.get("DECODE_WARPS"):  # a decoded buffer a slot, a packed-weight slot fewer, the output tile
        staged = ring * bn * 128 - bn * 64 + (2 if config.get("OUT_DTYPE") == "bf16" else 4) * bm * bn
    assert got["shared"] >= acts + ring * bn // 2 * 128 + staged
    assert got["shared"] <= smem_bytes(normalize_config(config, "down"), 1024)  # what the constraint checks


def _moe_inputs_on_gpu(*, h: int, i: int, seed: int, m: int = 40, e: int = 8):
    """fp4_prefill_moe's inputs on the GPU: skewed and partly inactive routes (empty experts, partial
    M-blocks), top_k 4."""
    from moetune.quant import quantize_mxfp4
    from moetune.routing import make_routes

    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, h, generator=g).to(torch.bfloat16).cuda()
    w13 = [t.cuda() for t in quantize_mxfp4(torch.randn(e, 2 * i, h, generator=g) * 0.05)]
    w2 = [t.cuda() for t in quantize_mxfp4(torch.randn(e, h, i, generator=g) * 0.05)]
    ids, wts = make_routes(m, 4, e, routing="zipf:1.2", active_fraction=0.75, generator=g, device="cuda")
    return x, w13, w2, wts, ids


@pytest.mark.gpu
@pytest.mark.parametrize("swap, bm, bn, warps, stages, layout, scale_ring", [
    (1, 16, 64, 4, 3, "indexed", 0), (1, 32, 64, 4, 2, "gathered", 0), (1, 64, 64, 4, 3, "indexed", 0),
    (1, 32, 64, 4, 3, "indexed", 1), (1, 64, 64, 4, 2, "gathered", 1), (1, 128, 128, 8, 2, "indexed", 1),
    (0, 64, 64, 4, 2, "indexed", 1), (0, 128, 64, 8, 2, "gathered", 1), (0, 128, 128, 8, 3, "indexed", 1),
    (0, 128, 32, 4, 1, "indexed", 1), (0, 64, 64, 4, 2, "indexed", 0), (0, 128, 64, 8, 2, "gathered", 0),
    (0, 128, 128, 8, 3, "indexed", 0), (0, 128, 32, 4, 2, "indexed", 0), (0, 256, 64, 8, 2, "indexed", 1)])
def test_gluon_matches_reference_on_gpu(swap, bm, bn, warps, stages, layout, scale_ring):
    """fp4_prefill_moe with IMPL gluon for both GEMMs against the fp32 reference, skewed and partly inactive
    routes (empty experts, partial M-blocks), K tails none (the kernel needs K % 256 == 0)."""
    from moetune.kernels.fp4_prefill.layer import fp4_prefill_moe
    from moetune.kernels.fp4_prefill.reference import fp4_prefill_moe_reference

    x, w13, w2, wts, ids = _moe_inputs_on_gpu(h=512, i=256, seed=5)
    cfg = {**GLUON, "SWAP_AB": swap, "BLOCK_SIZE_M": bm, "BLOCK_SIZE_N": bn, "num_stages": stages,
           "SCALE_RING": scale_ring, "num_warps": warps}
    config = {"gate_up": {**cfg, "A_LAYOUT": layout}, "down": cfg}
    out = fp4_prefill_moe(x, *w13, *w2, wts, ids, config=config)
    ref = fp4_prefill_moe_reference(x, *w13, *w2, wts, ids)
    assert torch.isfinite(out).all()
    assert ((out.double() - ref.double()).norm() / ref.double().norm()).item() < 1e-2


@pytest.mark.gpu
@pytest.mark.parametrize("swap, bm, bn, warps, stages", [(1, 16, 64, 4, 3), (0, 64, 64, 4, 2)])
def test_gluon_runs_weights_zero_padded_along_k_on_gpu(swap, bm, bn, warps, stages):
    """H 384 and I 160 (not multiples of 256) with both weight banks zero-padded to 512 and 256 (pad_mxfp4_k):
    IMPL gluon against the fp32 reference of the unpadded weights."""
    from moetune.kernels.fp4_prefill.layer import fp4_prefill_moe
    from moetune.kernels.fp4_prefill.reference import fp4_prefill_moe_reference
    from moetune.quant import pad_mxfp4_k

    x, w13, w2, wts, ids = _moe_inputs_on_gpu(h=384, i=160, seed=9)
    cfg = {**GLUON, "SWAP_AB": swap, "BLOCK_SIZE_M": bm, "BLOCK_SIZE_N": bn, "num_stages": stages,
           "num_warps": warps, "SCALE_RING": 1}
    out = fp4_prefill_moe(x, *pad_mxfp4_k(*w13, 512), *pad_mxfp4_k(*w2, 256), wts, ids,
                          config={"gate_up": cfg, "down": cfg})
    ref = fp4_prefill_moe_reference(x, *w13, *w2, wts, ids)
    assert torch.isfinite(out).all()
    assert ((out.double() - ref.double()).norm() / ref.double().norm()).item() < 1e-2


@pytest.mark.gpu
def test_gluon_reads_either_k_order_on_gpu():
    """grouped_gemm with A in real order (permuted by the launcher) and in the wgmma order (as the producers
    write it) gives the same bits; the pipeline mixes a Gluon gate/up with a Triton down."""
    from moetune.kernels.fp4_prefill.align import align_routes
    from moetune.kernels.fp4_prefill.layer import fp4_prefill_moe, grouped_gemm
    from moetune.kernels.fp4_prefill.reference import fp4_prefill_moe_reference
    from moetune.quant import quantize_fp8_act, quantize_mxfp4
    from moetune.routing import make_routes

    g = torch.Generator().manual_seed(7)
    m, h, i, e, top_k = 24, 768, 256, 4, 2
    x = torch.randn(m, h, generator=g).to(torch.bfloat16).cuda()
    w13 = [t.cuda() for t in quantize_mxfp4(torch.randn(e, 2 * i, h, generator=g) * 0.05)]
    w2 = [t.cuda() for t in quantize_mxfp4(torch.randn(e, h, i, generator=g) * 0.05)]
    ids, wts = make_routes(m, top_k, e, routing="uniform", active_fraction=1.0, generator=g, device="cuda")
    cfg = normalize_config({**GLUON, "SCALE_RING": 1})
    align = align_routes(ids, e, cfg["BLOCK_SIZE_M"])
    outs = []
    for order in ("real", "wgmma"):
        q, s = quantize_fp8_act(x, k_order=order)
        out = torch.full((m * top_k, 2 * i), float("nan"), device="cuda")
        grouped_gemm(q, s, *w13, out, align, a_div=top_k, config=cfg, a_k_order=order)
        outs.append(out)
    assert torch.isfinite(outs[0]).all() and torch.equal(outs[0], outs[1])
    out = fp4_prefill_moe(x, *w13, *w2, wts, ids, config={"gate_up": cfg, "down": {}})
    ref = fp4_prefill_moe_reference(x, *w13, *w2, wts, ids)
    assert ((out.double() - ref.double()).norm() / ref.double().norm()).item() < 1e-2


H, W4, W8 = {"MMA_HALVES": 1}, {"DECODE_WARPS": 4}, {"DECODE_WARPS": 8}
R, R8 = ({"DECODE_WARPS": w, "A_RESIDENT": 1, "GROUP_SIZE_M": 1} for w in (4, 8))


@pytest.mark.gpu
@pytest.mark.parametrize("switch, bm, bn, warps, stages, k, layout", [
    (H, 128, 128, 8, 3, 1024, "indexed"), (H, 128, 64, 8, 4, 256, "gathered"),
    (H, 64, 128, 4, 3, 4096, "indexed"), (H, 128, 32, 4, 3, 768, "indexed"),
    (H, 64, 64, 4, 3, 512, "gathered"), (W4, 128, 128, 8, 2, 1024, "indexed"),
    (W4, 128, 64, 8, 3, 256, "gathered"), (W4, 64, 128, 4, 3, 4096, "indexed"),
    (W4, 128, 32, 4, 2, 768, "indexed"), (W4, 64, 64, 4, 2, 512, "gathered"),
    (W8, 128, 128, 8, 2, 1024, "indexed"), (W8, 64, 128, 4, 3, 4096, "gathered"),
    (R, 128, 64, 8, 2, 1024, "indexed"), (R, 128, 32, 4, 3, 768, "gathered"),
    (R, 64, 128, 4, 2, 1024, "indexed"), (R8, 128, 64, 8, 2, 512, "indexed")])
def test_smem_variants_give_the_numbers_of_the_plain_loop_on_gpu(switch, bm, bn, warps, stages, k, layout):
    """MMA_HALVES (each wgmma in two N halves) and DECODE_WARPS (4 or 8 warps that copy and decode; with
    A_RESIDENT the M-block's activations held over its N tiles) run the SWAP_AB 0 SCALE_RING 0 arithmetic:
    against the plain loop, to fp32 rounding; every active route's row written (NaN-poisoned beforehand),
    skewed and partly inactive routes, K from 2 to 32 chunks."""
    from moetune.kernels.fp4_prefill.align import align_routes
    from moetune.kernels.fp4_prefill.layer import grouped_gemm
    from moetune.quant import quantize_fp8_act, quantize_mxfp4
    from moetune.routing import make_routes

    g = torch.Generator().manual_seed(11)
    e, n, tokens, top_k = 16, 1024, 768, 4
    ids, _ = make_routes(tokens, top_k, e, routing="zipf:1.1", active_fraction=0.9, generator=g,
                         device="cuda")
    w, ws = (t.cuda() for t in quantize_mxfp4(torch.randn(e, n, k, generator=g) * 0.05))
    q, s = quantize_fp8_act(torch.randn(tokens, k, generator=g).cuda(), k_order="wgmma")
    base = normalize_config({**GLUON_SMEM, "BLOCK_SIZE_M": bm, "BLOCK_SIZE_N": bn, "num_warps": warps,
                             "num_stages": max(stages, 2), "A_LAYOUT": layout})
    align = align_routes(ids, e, bm)
    outs = []
    for cfg in (base, {**base, "num_stages": stages, **switch}):
        out = torch.full((tokens * top_k, n), float("nan"), device="cuda")
        grouped_gemm(q, s, w, ws, out, align, a_div=top_k, config=cfg, a_k_order="wgmma")
        outs.append(out)
    active = ids.flatten() >= 0
    assert torch.isfinite(outs[0][active]).all() and outs[0][active].abs().sum() > 0
    torch.testing.assert_close(outs[1][active], outs[0][active], rtol=1e-5, atol=1e-6)


def _outputs_on_gpu(configs, *, e: int, n: int, k: int, tokens: int, top_k: int, seed: int,
                    dtype: torch.dtype = torch.float32):
    """grouped_gemm's per-route rows for each config (all of one BLOCK_SIZE_M) on one problem: skewed and
    partly inactive routes, the last expert routed, rows NaN-poisoned beforehand; and which rows are
    active. The first config's active rows are checked finite and not all zero."""
    from moetune.kernels.fp4_prefill.align import align_routes
    from moetune.kernels.fp4_prefill.layer import grouped_gemm
    from moetune.quant import quantize_fp8_act, quantize_mxfp4
    from moetune.routing import make_routes

    g = torch.Generator().manual_seed(seed)
    ids, _ = make_routes(tokens, top_k, e, routing="zipf:1.1", active_fraction=0.9, generator=g,
                         device="cuda")
    ids[0, 0] = e - 1
    w, ws = (t.cuda() for t in quantize_mxfp4(torch.randn(e, n, k, generator=g) * 0.05))
    q, s = quantize_fp8_act(torch.randn(tokens, k, generator=g).cuda(), k_order="wgmma")
    align = align_routes(ids, e, configs[0]["BLOCK_SIZE_M"])
    outs = []
    for cfg in configs:
        out = torch.full((tokens * top_k, n), float("nan"), dtype=dtype, device="cuda")
        grouped_gemm(q, s, w, ws, out, align, a_div=top_k, config=cfg, a_k_order="wgmma")
        outs.append(out)
    active = ids.flatten() >= 0
    assert torch.isfinite(outs[0][active]).all() and outs[0][active].abs().sum() > 0
    return [out[active] for out in outs]


@pytest.mark.gpu
@pytest.mark.parametrize("swap, scale_ring", [(1, 1), (1, 0), (0, 1)])
def test_stages_past_k_give_the_numbers_of_one_stage_on_gpu(swap, scale_ring):
    """K of two chunks with three stages: the ring's fill copies chunk 1 again for chunk 2 (never used)
    instead of reading past each weight row and the last one past the tensor. Bit for bit against one stage
    (SWAP_AB 1) or two (SWAP_AB 0)."""
    base = normalize_config({**(GLUON if swap else GLUON_SMEM), "SCALE_RING": scale_ring})
    one, three = _outputs_on_gpu([{**base, "num_stages": 1 if swap or scale_ring else 2},
                                  {**base, "num_stages": 3}], e=8, n=512, k=256, tokens=256, top_k=4, seed=23)
    assert torch.equal(three, one)


@pytest.mark.gpu
@pytest.mark.parametrize("bm, bn, warps, stages, k, n, layout, scale_ring", [
    (32, 64, 4, 3, 1024, 4096, "indexed", 1), (16, 64, 4, 3, 512, 1152, "gathered", 0),
    (64, 64, 4, 2, 768, 1088, "indexed", 1), (32, 128, 8, 3, 1024, 1024, "indexed", 1),
    (16, 64, 4, 2, 512, 1024, "gathered", 1)])
def test_swap_resident_gives_the_numbers_of_the_ring_on_gpu(bm, bn, warps, stages, k, n, layout, scale_ring):
    """SWAP_AB 1 with A_RESIDENT (a program's N tiles share its M-block's activations, copied once) against
    the same kernel with the ring, bit for bit: N / BN of 17, 18 and 64 tiles (programs of 1, 2 and 4), K of
    2-8 chunks."""
    from moetune.kernels.fp4_prefill.gluon_gemm import resident_n_tiles

    base = normalize_config({**GLUON, "BLOCK_SIZE_M": bm, "BLOCK_SIZE_N": bn, "num_warps": warps,
                             "num_stages": stages, "A_LAYOUT": layout, "SCALE_RING": scale_ring})
    assert resident_n_tiles(n, bn) == {17: 1, 18: 2}.get(n // bn, 4 if n // bn % 4 == 0 else 2)
    ring, resident = _outputs_on_gpu([base, {**base, "A_RESIDENT": 1}], e=16, n=n, k=k, tokens=512, top_k=4,
                                     seed=19)
    assert torch.equal(resident, ring)


@pytest.mark.gpu
@pytest.mark.parametrize("bm, bn, warps, stages, k, n, layout, scale_ring, resident", [
    (32, 64, 4, 3, 1024, 4096, "indexed", 1, 0), (32, 64, 4, 3, 256, 1024, "indexed", 1, 0),
    (16, 64, 4, 3, 512, 1152, "gathered", 0, 0), (64, 64, 4, 2, 768, 1088, "indexed", 1, 0),
    (32, 128, 8, 1, 512, 1024, "indexed", 1, 0), (16, 64, 4, 3, 1024, 4096, "indexed", 1, 1),
    (32, 64, 4, 2, 768, 1152, "gathered", 0, 1), (32, 128, 8, 3, 512, 1024, "indexed", 1, 1)])
def test_split_ring_gives_the_numbers_of_the_ring_on_gpu(bm, bn, warps, stages, k, n, layout, scale_ring,
                                                         resident):
    """RING_SPLIT (each ring two buffers by chunk parity, a commit group carrying the next chunk's weights)
    against the one-buffer rings, bit for bit: 1-3 stages (even and odd rings), K of 2-8 chunks (with three
    stages at two chunks the fill's copies past K), with and without A_RESIDENT (programs of 1, 2 and 4
    tiles)."""
    base = normalize_config({**GLUON, "BLOCK_SIZE_M": bm, "BLOCK_SIZE_N": bn, "num_warps": warps,
                             "num_stages": stages, "A_LAYOUT": layout, "SCALE_RING": scale_ring,
                             "A_RESIDENT": resident})
    ring, split = _outputs_on_gpu([base, {**base, "RING_SPLIT": 1}], e=16, n=n, k=k, tokens=512, top_k=4,
                                  seed=29)
    assert torch.equal(split, ring)


@pytest.mark.gpu
@pytest.mark.parametrize("dw, resident, k, n", [(4, 0, 1024, 1024), (8, 0, 3072, 2880), (4, 1, 1024, 2880),
                                                (8, 1, 768, 1024), (4, 0, 256, 4096)])
def test_tma_weights_give_the_numbers_of_the_copies_on_gpu(dw, resident, k, n):
    """W_TMA (the warp-specialized kernel's packed weights by TMA, rows past N zero-filled) against its
    cp.async copies, bit for bit: 4 and 8 decode warps, resident activations, K of 2-24 chunks, N with a tail
    tile (2880 = 22.5 x 128) and the last expert routed (its tail rows past the tensor's end)."""
    out = "bf16" if resident else "fp32"  # the resident tile's activations fit with bf16 rows
    base = normalize_config({**GLUON_SMEM, "BLOCK_SIZE_N": 128, "DECODE_WARPS": dw, "A_RESIDENT": resident,
                             "GROUP_SIZE_M": 1 if resident else 8, "OUT_DTYPE": out}, "down")
    copies, tma = _outputs_on_gpu([base, {**base, "W_TMA": 1}], e=16, n=n, k=k, tokens=1024, top_k=4,
                                  seed=37, dtype=torch.bfloat16 if resident else torch.float32)
    assert torch.equal(tma, copies)


@pytest.mark.gpu
@pytest.mark.parametrize("resident", [0, 1])
def test_register_cap_gives_the_numbers_of_the_launchers_on_gpu(resident):
    """MAXNREG 96 (five 4-warp CTAs an SM) with and without RING_SPLIT: the launcher's cap's bits."""
    base = normalize_config({**GLUON, "BLOCK_SIZE_M": 16, "SCALE_RING": 1, "A_RESIDENT": resident})
    outs = _outputs_on_gpu([base, *({**base, "RING_SPLIT": split, "MAXNREG": 96} for split in (0, 1))], e=16,
                           n=4096, k=1024, tokens=512, top_k=4, seed=31)
    assert all(torch.equal(out, outs[0]) for out in outs[1:])


@pytest.mark.gpu
@pytest.mark.parametrize("config", [
    {"IMPL": "triton", "DECODE": "fp8_row", "UNPACK": "lut", "BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": 64},
    {**GLUON, "BLOCK_SIZE_N": 64}, {**GLUON_SMEM, "BLOCK_SIZE_N": 64},
    {**GLUON_SMEM, "BLOCK_SIZE_N": 128, "DECODE_WARPS": 4},
    {**GLUON_SMEM, "BLOCK_SIZE_N": 128, "DECODE_WARPS": 4, "A_RESIDENT": 1, "GROUP_SIZE_M": 1}],
    ids=["triton", "swap", "smem", "decode-warps", "decode-warps-resident"])
def test_bf16_rows_are_the_fp32_rows_rounded_on_gpu(config):
    """OUT_DTYPE bf16 (down): every kernel's bf16 rows are its fp32 rows rounded, bit for bit; each active
    route's row written (NaN-poisoned beforehand). BM128 BN128 with A_RESIDENT fits only with bf16 rows."""
    from moetune.kernels.fp4_prefill.align import align_routes
    from moetune.kernels.fp4_prefill.layer import grouped_gemm
    from moetune.quant import quantize_fp8_act, quantize_mxfp4
    from moetune.routing import make_routes

    g = torch.Generator().manual_seed(17)
    e, n, k, routes = 16, 1024, 1024, 3072
    ids, _ = make_routes(routes // 4, 4, e, routing="zipf:1.1", active_fraction=0.9, generator=g,
                         device="cuda")
    w, ws = (t.cuda() for t in quantize_mxfp4(torch.randn(e, n, k, generator=g) * 0.05))
    order = "wgmma" if config["IMPL"] == "gluon" else "real"
    q, s = quantize_fp8_act(torch.randn(routes, k, generator=g).cuda(), k_order=order)
    align = align_routes(ids, e, config["BLOCK_SIZE_M"])
    active = ids.flatten() >= 0
    rows = {}
    for dtype, name in ((torch.float32, "fp32"), (torch.bfloat16, "bf16")):
        cfg = normalize_config({**config, "OUT_DTYPE": name}, "down")
        if name == "fp32" and cfg["A_RESIDENT"]:  # the same rows from the ring
            cfg.update(A_RESIDENT=0)
        rows[name] = torch.full((routes, n), float("nan"), dtype=dtype, device="cuda")
        grouped_gemm(q, s, w, ws, rows[name], align, a_div=1, config=cfg, a_k_order=order)
    assert torch.isfinite(rows["fp32"][active]).all() and rows["fp32"][active].abs().sum() > 0
    assert torch.equal(rows["bf16"][active], rows["fp32"][active].to(torch.bfloat16))


@pytest.mark.gpu
@pytest.mark.parametrize("switch", ["MMA_HALVES", "DECODE_WARPS"])
def test_smem_variants_match_reference_on_gpu(switch):
    """fp4_prefill_moe with MMA_HALVES or DECODE_WARPS for both GEMMs (K 1024 and 512; DECODE_WARPS' down with
    A_RESIDENT and bf16 rows) against the fp32 reference."""
    from moetune.kernels.fp4_prefill.layer import fp4_prefill_moe
    from moetune.kernels.fp4_prefill.reference import fp4_prefill_moe_reference
    from moetune.quant import quantize_mxfp4
    from moetune.routing import make_routes

    g = torch.Generator().manual_seed(13)
    m, h, i, e = 300, 1024, 512, 8
    x = torch.randn(m, h, generator=g).to(torch.bfloat16).cuda()
    w13 = [t.cuda() for t in quantize_mxfp4(torch.randn(e, 2 * i, h, generator=g) * 0.05)]
    w2 = [t.cuda() for t in quantize_mxfp4(torch.randn(e, h, i, generator=g) * 0.05)]
    ids, wts = make_routes(m, 4, e, routing="zipf:1.2", active_fraction=0.75, generator=g, device="cuda")
    cfg = {**GLUON_SMEM, "BLOCK_SIZE_N": 64, "num_stages": 3}
    on = {switch: 4 if switch == "DECODE_WARPS" else 1}
    down = {**cfg, "BLOCK_SIZE_N": 128, **on}
    if switch == "DECODE_WARPS":  # with down's activations resident and its rows in bf16
        down.update(A_RESIDENT=1, GROUP_SIZE_M=1, OUT_DTYPE="bf16", num_stages=2)
    config = {"gate_up": {**cfg, **on}, "down": down}
    out = fp4_prefill_moe(x, *w13, *w2, wts, ids, config=config)
    ref = fp4_prefill_moe_reference(x, *w13, *w2, wts, ids)
    assert torch.isfinite(out).all()
    assert ((out.double() - ref.double()).norm() / ref.double().norm()).item() < 1e-2
