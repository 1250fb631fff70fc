"""moetune.ops: the layers as torch.library custom ops (opcheck, bit-exact against the plain layers,
torch.compile(fullgraph=True) of a small MoE block). Triton interpreter on the CPU."""

import json
import subprocess
import sys

import pytest
import torch
from conftest import DEVICE

import moetune.ops as ops
from moetune.kernels.fp4_prefill.layer import fp4_prefill_moe
from moetune.kernels.fp8_decode.layer import fp8_decode_moe
from moetune.kernels.gather_rows.gather import gather_rows_with_scales
from moetune.quant import quantize_fp8_act, quantize_fp8_block, quantize_mxfp4
from moetune.routing import make_routes

FP8_FAST = {"ALGO": "route", "BLOCK_SIZE_N": 128, "BLOCK_SIZE_K": 256}
FP8_CFG = {"gate_up": FP8_FAST,
           "down": {"ALGO": "grouped", "BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 128}}
FP4_CFG = {"gate_up": dict(BLOCK_SIZE_M=16, BLOCK_SIZE_N=64, BLOCK_SIZE_K=64, num_warps=4,
                           DECODE="fp8_scaled", UNPACK="join"),
           "down": dict(BLOCK_SIZE_M=16, BLOCK_SIZE_N=32, BLOCK_SIZE_K=32, num_warps=4, DECODE="fp8",
                        UNPACK="join")}
GATHER_CFG = {"BLOCK_SIZE_K": 256, "ROWS_PER_PROGRAM": 4, "num_warps": 4}


def fp8_layer(m, h=300, i=200, e=4, top_k=2, active=0.5, seed=0):
    """H 300, I 200: partial N and K tiles and partial 128-blocks of scales in both GEMMs."""
    g = torch.Generator(DEVICE).manual_seed(seed)
    x = torch.randn(m, h, generator=g, device=DEVICE).to(torch.bfloat16)
    w13, s13 = quantize_fp8_block(torch.randn(e, 2 * i, h, generator=g, device=DEVICE) * 0.05)
    w2, s2 = quantize_fp8_block(torch.randn(e, h, i, generator=g, device=DEVICE) * 0.05)
    ids, rw = make_routes(m, top_k, e, active_fraction=active, generator=g, device=DEVICE)
    return [x, w13, s13, w2, s2, rw, ids]


def fp4_layer(m, h=160, i=96, e=4, top_k=2, active=0.5, seed=0):
    """2I 192, H 160: partial N tiles; K 160 and 96: partial K chunks."""
    g = torch.Generator(DEVICE).manual_seed(seed)
    x = torch.randn(m, h, generator=g, device=DEVICE).to(torch.bfloat16)
    w13 = quantize_mxfp4(torch.randn(e, 2 * i, h, generator=g, device=DEVICE) * 0.05)
    w2 = quantize_mxfp4(torch.randn(e, h, i, generator=g, device=DEVICE) * 0.05)
    ids, rw = make_routes(m, top_k, e, active_fraction=active, generator=g, device=DEVICE)
    return [x, *w13, *w2, rw, ids]


def fp4_biases(h=160, i=96, e=4, seed=0):
    g = torch.Generator().manual_seed(seed + 100)
    return (torch.randn(e, 2 * i, generator=g).to(DEVICE, torch.bfloat16),
            torch.randn(e, h, generator=g).to(DEVICE))


def gather_inputs(m, k, rows, seed=0):
    g = torch.Generator(DEVICE).manual_seed(seed)
    q, s = quantize_fp8_act(torch.randn(m, k, generator=g, device=DEVICE))
    idx = torch.randint(0, max(m, 1), (rows,), generator=g, dtype=torch.int32, device=DEVICE)
    return q, s, idx


def test_schemas():
    schemas = {name: str(getattr(torch.ops.moetune, name).default._schema)
               for name in ("fp8_decode_moe", "fp4_prefill_moe", "gather_rows_with_scales")}
    assert "float? swiglu_limit=None, str config=\"\"" in schemas["fp8_decode_moe"]
    assert schemas["fp8_decode_moe"].endswith("bool? pdl=None, float? active_share=None) -> Tensor")
    assert schemas["fp4_prefill_moe"].endswith(
        "str config=\"\", bool validate=False, float? active_share=None) -> Tensor")
    assert ("Tensor topk_ids, Tensor? w13_bias=None, Tensor? w2_bias=None, Tensor? w13_scale_max=None, "
            "Tensor? w2_scale_max=None, str activation") in schemas["fp4_prefill_moe"]
    assert schemas["gather_rows_with_scales"].endswith("-> (Tensor, Tensor)")


def test_import_moetune_registers_nothing_and_ops_define_no_kernels():
    """The ops are registered by ``import moetune.ops`` only, and the kernel modules (whose @triton.jit reads
    TRITON_INTERPRET when it runs) load on the first call."""
    code = ("import sys, torch, moetune; assert 'triton' not in sys.modules; "
            "assert not hasattr(torch.ops.moetune, 'fp8_decode_moe'); "
            "import moetune.ops; assert hasattr(torch.ops.moetune, 'fp8_decode_moe'); "
            "assert not [m for m in sys.modules if m.startswith('moetune.kernels')], 'kernels imported'")
    subprocess.run([sys.executable, "-c", code], check=True)


# ---- opcheck: schema, fake tensors, autograd registration, AOT dispatch with dynamic shapes -----------
FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)


def opcheck(op, args, kwargs):
    """torch.library.opcheck; with fp8 inputs its test_schema cannot run on the CPU (its mutation check
    compares them with torch.allclose, which has no fp8 CPU kernel), so the mutation check is done here on
    byte views instead."""
    if not any(isinstance(a, torch.Tensor) and a.dtype in FP8_DTYPES for a in args):
        torch.library.opcheck(op, args, kwargs)
        return
    before = [a.clone() for a in args]
    op(*args, **kwargs)
    for i, (a, b) in enumerate(zip(args, before, strict=True)):
        assert torch.equal(a.view(torch.uint8) if a.dtype in FP8_DTYPES else a,
                           b.view(torch.uint8) if b.dtype in FP8_DTYPES else b), f"argument {i} mutated"
    torch.library.opcheck(op, args, kwargs,
                          test_utils=("test_autograd_registration", "test_faketensor",
                                      "test_aot_dispatch_dynamic"))


@pytest.mark.parametrize("m", [3, 0], ids=["partial-tiles-inactive-routes", "zero-tokens"])
def test_opcheck_fp8_decode(m):
    args = fp8_layer(m)
    if m:
        assert (args[6] == -1).any() and (args[6] >= 0).any()
    opcheck(torch.ops.moetune.fp8_decode_moe.default, tuple(args),
            {"config": json.dumps(FP8_CFG), "swiglu_limit": 7.0})


@pytest.mark.parametrize("m", [5, 0], ids=["partial-tiles-inactive-routes", "zero-tokens"])
def test_opcheck_fp4_prefill(m):
    args = fp4_layer(m)
    opcheck(torch.ops.moetune.fp4_prefill_moe.default, tuple(args),
            {"config": json.dumps(FP4_CFG)})


@pytest.mark.parametrize("m, which", [(5, "both"), (3, "w2_bias"), (0, "both")],
                         ids=["both-biases", "down-bias-only", "zero-tokens"])
def test_opcheck_fp4_prefill_with_biases(m, which):
    """bf16 gate/up and fp32 down biases (gpt-oss's are bf16), as the op's Tensor? arguments."""
    b13, b2 = fp4_biases()
    kw = {"w13_bias": b13 if which == "both" else None, "w2_bias": b2}
    opcheck(torch.ops.moetune.fp4_prefill_moe.default, tuple(fp4_layer(m)),
            {"config": json.dumps(FP4_CFG), "activation": "swiglu", "swiglu_limit": 7.0, **kw})


@pytest.mark.parametrize("m, k, rows, dtype", [(7, 300, 13, torch.float8_e4m3fn), (7, 300, 13, torch.uint8),
                                                (7, 300, 0, torch.uint8), (0, 128, 0, torch.uint8)],
                         ids=["partial-k-tile-fp8", "partial-k-tile-bytes", "zero-rows", "zero-tokens"])
def test_opcheck_gather_rows(m, k, rows, dtype):
    q, s, idx = gather_inputs(m, k, rows)
    opcheck(torch.ops.moetune.gather_rows_with_scales.default, (q.view(dtype), s, idx),
            {"config": json.dumps(GATHER_CFG)})


# ---- the op's output is the layer's, bit for bit --------------------------------------------------------
def test_fp8_decode_op_equals_layer():
    args = fp8_layer(3, seed=1)
    assert torch.equal(ops.fp8_decode_moe(*args, config=FP8_CFG), fp8_decode_moe(*args, config=FP8_CFG))
    # "" / None: the picker chooses inside the op, as the layer's config=None does
    assert torch.equal(ops.fp8_decode_moe(*args, activation="swiglu", swiglu_limit=7.0),
                       fp8_decode_moe(*args, activation="swiglu", swiglu_limit=7.0))


def test_fp4_prefill_op_equals_layer():
    args = fp4_layer(5, seed=1)
    text = ops.config_json(FP4_CFG)
    assert torch.equal(ops.fp4_prefill_moe(*args, config=text, swiglu_limit=7.0),
                       fp4_prefill_moe(*args, config=FP4_CFG, swiglu_limit=7.0))
    b13, b2 = fp4_biases(seed=1)
    assert torch.equal(ops.fp4_prefill_moe(*args, config=text, w13_bias=b13, w2_bias=b2),
                       fp4_prefill_moe(*args, config=FP4_CFG, w13_bias=b13, w2_bias=b2))


def test_gather_rows_op_equals_layer():
    q, s, idx = gather_inputs(7, 300, 13, seed=1)
    got, want = ops.gather_rows_with_scales(q, s, idx, config=GATHER_CFG), gather_rows_with_scales(
        q, s, idx, config=GATHER_CFG)
    assert got[0].dtype == q.dtype
    assert torch.equal(got[0].view(torch.uint8), want[0].view(torch.uint8))
    assert torch.equal(got[1].view(torch.int32), want[1].view(torch.int32))


def test_bad_config_text():
    with pytest.raises(ValueError, match="not valid JSON"):
        ops.gather_rows_with_scales(*gather_inputs(7, 128, 3), config="{BLOCK_SIZE_K")
    with pytest.raises(ValueError, match="JSON object"):
        ops.gather_rows_with_scales(*gather_inputs(7, 128, 3), config="[1]")
    with pytest.raises(ValueError, match="config must be None"):
        ops.config_json(3)


def test_fake_checks_shapes_like_the_layer():
    args = fp8_layer(3)
    args[3] = args[3][:, :-1]  # w2 [E, H-1, I]
    with torch._subclasses.fake_tensor.FakeTensorMode() as mode:
        fake = [mode.from_tensor(t) for t in args]
        with pytest.raises(ValueError, match="w2 must be"):
            torch.ops.moetune.fp8_decode_moe(*fake)


def test_meta_tensors_give_output_shapes():
    meta = [t.to("meta") for t in fp8_layer(3)]
    out = torch.ops.moetune.fp8_decode_moe(*meta)
    assert (out.device.type, out.shape, out.dtype) == ("meta", (3, 300), torch.bfloat16)
    out = torch.ops.moetune.fp4_prefill_moe(*[t.to("meta") for t in fp4_layer(5)])
    assert (out.device.type, out.shape, out.dtype) == ("meta", (5, 160), torch.bfloat16)
    b13, b2 = (t.to("meta") for t in fp4_biases())
    out = torch.ops.moetune.fp4_prefill_moe(*[t.to("meta") for t in fp4_layer(5)], b13, b2)
    assert (out.device.type, out.shape) == ("meta", (5, 160))
    with pytest.raises(ValueError, match="w2_bias must be"):
        torch.ops.moetune.fp4_prefill_moe(*[t.to("meta") for t in fp4_layer(5)], b13, b2[:, :-1])
    q, s = torch.ops.moetune.gather_rows_with_scales(*[t.to("meta") for t in gather_inputs(7, 300, 13)])
    assert (q.shape, q.dtype, s.shape, s.dtype) == ((13, 300), torch.float8_e4m3fn, (13, 3), torch.float32)


# ---- torch.compile(fullgraph=True): a router -> top-k -> fp8 MoE block, no graph break ------------------
class MoeBlock(torch.nn.Module):
    def __init__(self, hidden, experts, top_k, weights, config):
        super().__init__()
        self.router = torch.nn.Linear(hidden, experts, bias=False)
        self.top_k, self.config = top_k, config
        for name, t in zip(("w13", "w13_scale", "w2", "w2_scale"), weights, strict=True):
            self.register_buffer(name, t)

    def forward(self, x):
        probs = torch.softmax(self.router(x.float()), dim=-1)
        weights, ids = torch.topk(probs, self.top_k, dim=-1)
        weights = weights / weights.sum(dim=-1, keepdim=True)
        out = ops.fp8_decode_moe(x, self.w13, self.w13_scale, self.w2, self.w2_scale, weights, ids,
                                 config=self.config)
        return x + out


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_compiled_moe_block_fullgraph(backend):
    torch.manual_seed(0)
    x, w13, s13, w2, s2, _, _ = fp8_layer(3, h=256, i=128, e=4)
    block = MoeBlock(256, 4, 2, (w13, s13, w2, s2), FP8_CFG).to(DEVICE)
    torch._dynamo.reset()
    compiled = torch.compile(block, fullgraph=True, backend=backend)
    with torch.no_grad():  # inference: the ops have no autograd formula
        want = block(x)
        got = compiled(x)
        assert torch.equal(got, want)
        x2 = torch.randn_like(x)
        assert torch.equal(compiled(x2), block(x2))


# ---- on the GPU: CUDA-graph capture of the ops, and inductor with CUDA graphs ------------------------------
def replay_matches(fn, static, fresh):
    """Capture ``fn(*static)`` in a CUDA graph, copy ``fresh`` into the static inputs, replay: equal to
    ``fn(*fresh)`` run eagerly."""
    fn(*static)  # warm-up: compiles the kernels, resolves the picker's configs
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn(*static)
    for s, f in zip(static, fresh, strict=True):
        s.copy_(f)
    graph.replay()
    torch.cuda.synchronize()
    want = fn(*fresh)
    outs, wants = (out, want) if isinstance(out, tuple) else ((out,), (want,))
    return all(torch.equal(o.view(torch.uint8), w.view(torch.uint8))
               for o, w in zip(outs, wants, strict=True))


@pytest.mark.gpu
def test_ops_capture_in_cuda_graphs():
    static = [t.cuda() for t in fp8_layer(4, h=1024, i=256, e=16, top_k=4, active=1.0, seed=3)]
    fresh = [t.cuda() for t in fp8_layer(4, h=1024, i=256, e=16, top_k=4, active=0.5, seed=4)]
    fresh[1:5] = static[1:5]  # same weights, new activations and routing
    assert replay_matches(ops.fp8_decode_moe, static, fresh)
    q, s, idx = (t.cuda() for t in gather_inputs(64, 4096, 384, seed=5))
    q2, s2, idx2 = (t.cuda() for t in gather_inputs(64, 4096, 384, seed=6))

    def gather(q, s, idx):
        return ops.gather_rows_with_scales(q, s, idx, experts=16, top_k=6)

    assert replay_matches(gather, [q, s, idx], [q2, s2, idx2])


@pytest.mark.gpu
@pytest.mark.parametrize("mode", [None, "reduce-overhead"])
def test_inductor_compiles_moe_block(mode):
    x, w13, s13, w2, s2, _, _ = (t.cuda() for t in fp8_layer(4, h=1024, i=256, e=16))
    block = MoeBlock(1024, 16, 4, (w13, s13, w2, s2), None).cuda()
    torch._dynamo.reset()
    compiled = torch.compile(block, fullgraph=True, mode=mode)
    with torch.no_grad():
        for _ in range(3):  # reduce-overhead records its graph on a later call
            got = compiled(x)
        torch.testing.assert_close(got, block(x), rtol=2e-2, atol=2e-2)
