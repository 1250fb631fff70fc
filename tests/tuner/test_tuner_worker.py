"""How the worker names failures, and the timing summary and roofline arithmetic."""

import pytest
from triton.runtime.errors import OutOfResources

from moetune.tuner.timing import roofline_frac, summarize
from moetune.tuner.worker import classify, describe

CUDA_TEXT = ("CUDA error: an illegal memory access was encountered\n"
             "CUDA kernel errors might be asynchronously reported at some other API call\n"
             "Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.")


class AcceleratorError(RuntimeError):
    """Stands in for torch.AcceleratorError (torch >= 2.8) on builds without it."""


@pytest.mark.parametrize("exc, on_gpu, expected", [
    (RuntimeError(CUDA_TEXT), True, ("crash", True)),
    (AcceleratorError("anything"), True, ("crash", True)),
    (OutOfResources(300_000, 232_448, "shared memory"), True, ("compile_error", False)),
    (ValueError("BLOCK_SIZE_K must divide 128"), True, ("invalid", False)),
    (KeyError("x"), True, ("crash", True)),  # unknown failure on a GPU: restart to be safe
    (KeyError("x"), False, ("crash", False)),
])
def test_classify(exc, on_gpu, expected):
    assert classify(exc, on_gpu) == expected


def test_describe_keeps_the_telling_line():
    first = CUDA_TEXT.splitlines()[0]
    assert describe(RuntimeError(CUDA_TEXT)) == f"RuntimeError: {first}"
    assert describe(ValueError("source excerpt\n  ^\nreal problem")) == "ValueError: real problem"
    assert len(describe(ValueError("x" * 1000))) == 400


def test_a_wide_reading_is_taken_again_and_the_steadiest_kept():
    from moetune.tuner.timing import TimingOptions, steadiest

    readings = iter([([1.0, 1.3, 1.0, 1.6, 1.0], 1), ([1.0, 1.0, 1.01, 1.0, 1.0], 2), ([9.0] * 5, 1)])
    stats, (samples, per), spent, n = steadiest(lambda: next(readings), TimingOptions(retime_spread=0.05))
    assert n == 2 and per == 2 and stats["spread"] <= 0.05 and samples[2] == 1.01
    assert spent == pytest.approx(5.9 + 2 * 5.01)  # the device time of both readings
    wild = iter([([1.0, 2.0, 3.0], 1)] * 3)
    stats, _, _, n = steadiest(lambda: next(wild), TimingOptions(retime_spread=0.05, retimes=2))
    assert n == 3 and stats["spread"] > 0.05  # gives up after `retimes` more readings
    once = iter([([1.0, 2.0, 3.0], 1)])
    assert steadiest(lambda: next(once), TimingOptions(retimes=0))[3] == 1


def test_summarize():
    s = summarize([float(x) for x in range(1, 11)])
    assert s["time_ms"] == 5.5 and s["min_ms"] == 1.0 and s["n_runs"] == 10
    assert s["spread"] == pytest.approx((8.2 - 2.8) / 5.5)
    assert summarize([2.0])["spread"] == 0.0


def test_roofline_frac():
    # 4.27 GB in 1 ms on an H200 is the copy ceiling; the larger of the two terms counts.
    assert roofline_frac("NVIDIA H200", 4_270_000_000, 0, 1000.0) == pytest.approx(1e-3)
    assert roofline_frac("NVIDIA H200", 0, 790e9, 1.0) == pytest.approx(1.0)
    assert roofline_frac("NVIDIA H200", 0, 1265e9, 1.0, mma="fp8") == pytest.approx(1.0)
    assert roofline_frac("cpu-interpreter", 10, 10, 1.0) is None
    assert roofline_frac("NVIDIA H200", 10, 10, None) is None


def test_far_slower_candidates_keep_their_first_samples():
    from moetune.tuner.timing import TimingOptions, _runs_for, steadiest

    opts = TimingOptions(target_ms=10.0, min_runs=10, max_runs=100, slow_ratio=1.5)
    assert _runs_for(0.2, opts) == 50  # no best yet: as many runs as the target time allows
    assert _runs_for(0.2, opts, best_ms=0.15) == 50  # within 1.5x of the best: timed in full
    assert _runs_for(0.4, opts, best_ms=0.15) == 0  # 2.7x slower: the estimating samples are the reading
    assert _runs_for(0.2, opts, best_ms=0.015, per=10) == 50  # a 10-run graph replay: 0.02 ms a run
    assert _runs_for(0.2, opts, best_ms=0.015) == 0  # the same sample as one run: far slower
    assert _runs_for(0.4, TimingOptions(slow_ratio=0.0), best_ms=0.15) == 25  # 0 turns it off
    wide = [0.40, 0.44, 0.48]  # spread 10%, far over retime_spread
    readings = iter([(wide, 1)] * 3)
    stats, _, _, n = steadiest(lambda: next(readings), opts, best_ms=0.15)
    assert n == 1 and stats["n_runs"] == 3  # far slower: its spread does not matter, no second reading
    readings = iter([(wide, 1)] * 3)
    assert steadiest(lambda: next(readings), opts, best_ms=0.4)[3] == 3  # a contender is re-timed


def test_compile_only_turns_launches_into_warmups(monkeypatch):
    from triton.runtime.jit import JITFunction

    from moetune.tuner.worker import compile_only

    seen = []
    monkeypatch.setattr(JITFunction, "run", lambda self, *a, grid, warmup, **kw: seen.append(warmup))
    patched = JITFunction.run
    with compile_only():
        JITFunction.run(object(), 1, grid=(1,), warmup=False)
    JITFunction.run(object(), 1, grid=(1,), warmup=False)
    assert seen == [True, False]  # inside: compile only; after: launches again
    assert JITFunction.run is patched
