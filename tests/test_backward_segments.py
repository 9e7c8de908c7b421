"""chunk_bwd's segments (sequence parallelism for small B*H, docs/training-design.md 1.4): the plan's segment count,
and every gradient against float64 with segments forced through the _backward_with hook (1, 2, 3 and one a chunk
pair), across segment edges: ragged ends, gate classes with zeros at segment boundaries, initial and final states
used and unused, NaN and inf, and bitwise determinism. CPU: plan_backward's segment counts and the argument errors."""
import re

import pytest
import torch

import naive
from conftest import cuda
from helpers import shape_id
from test_backward import FP32_TOL, NAMES, check_grads, mask_diff, problem, reference_grads, rel_l2

FP32, BF16 = torch.float32, torch.bfloat16


def sms():
    return torch.cuda.get_device_properties(0).multi_processor_count if torch.cuda.is_available() else 132


def planned_segments(text):
    m = re.search(r"segments=(\d+) of (\d+) chunks", text)
    assert m, text
    return int(m.group(1)), int(m.group(2))


def big_smem():
    return not torch.cuda.is_available() or torch.cuda.get_device_properties(0).shared_memory_per_block_optin >= 216000


# (B, T, H, D_k, D_v): expected segments from the rule (SMs // (B H) wanted, down to one chunk each); B H = 128
# with D_v = 64 (bfloat16 D = 128 there plans chunk_bwd_sm90, test_backward_sm90)
@pytest.mark.parametrize("shape", [(1, 8192, 8, 128, 128), (8, 2048, 16, 128, 64), (2, 128, 4, 24, 24),
                                   (1, 300, 1, 64, 128), (1, 100, 1, 32, 32)], ids=shape_id)
def test_planned_segments(sol, shape):
    """Segments fill the SMs once when B*H is small, down to one chunk each; one otherwise."""
    if not big_smem():
        pytest.skip("chunk_bwd needs Hopper's shared memory")
    B, T, H, Dk, Dv = shape
    nseg, per = planned_segments(sol.plan_backward(*shape, dtype="bfloat16"))
    nck = max(1, -(-T // 32))
    want = max(1, sms() // (B * H))
    expect_per = -(-nck // min(want, nck))
    expect = -(-nck // expect_per)
    assert nseg == expect and nseg * per >= nck, (nseg, per, expect)
    if shape == (1, 8192, 8, 128, 128) and sms() >= 128:
        assert nseg >= 16


def test_forced_segments_in_the_plan(sol):
    if not big_smem():
        pytest.skip("chunk_bwd needs Hopper's shared memory")
    text = sol.plan_backward(1, 1000, 1, 64, 64, kernel="chunk_bwd", segments=3)
    assert planned_segments(text) == (3, 11) and "chunk_bwd_prep" in text and "chunk_bwd_scan" in text, text
    assert planned_segments(sol.plan_backward(1, 100, 1, 8, 8, kernel="chunk_bwd", segments=50)) == (4, 1)


@pytest.mark.parametrize("kwargs,pattern", [({"kernel": "chunk_bwd", "segments": -1}, r"\bsegments\b"),
                                            ({"kernel": "recurrent_bwd", "segments": 2}, r"\bsegments\b"),
                                            ({"segments": 2}, r"\bsegments\b")], ids=["negative", "recurrent", "planned"])
def test_segments_argument_errors(sol, kwargs, pattern):
    with pytest.raises(ValueError, match=pattern):
        sol.plan_backward(1, 100, 1, 8, 8, **kwargs)


# ---- gradients with forced segments against float64
SEG_CASES = [((1, 1000, 1, 64, 64), FP32, 3), ((1, 1000, 1, 64, 64), BF16, 4), ((2, 300, 1, 33, 100), FP32, 2),
             ((1, 257, 2, 7, 5), FP32, 5), ((1, 200, 1, 128, 128), FP32, 4), ((1, 130, 2, 32, 40), BF16, 3),
             ((1, 100, 2, 16, 24), FP32, 4)]  # the last: every segment one chunk, the last chunk ragged


@cuda
@pytest.mark.parametrize("initial,final", [(True, True), (False, False), (True, False)],
                         ids=["states", "no-states", "initial-only"])
@pytest.mark.parametrize("shape,dtype,nseg", SEG_CASES,
                         ids=[f"{shape_id(s)}-{str(d)[6:]}-seg{n}" for s, d, n in SEG_CASES])
def test_segment_gradients_match_float64(sol, shape, dtype, nseg, initial, final):
    """Forced segments (ragged last segments included) give all six gradients within the float64 tolerances."""
    if not big_smem():
        pytest.skip("chunk_bwd needs Hopper's shared memory")
    xs, s0, w, ws = problem(shape, dtype, seed=sum(shape) + nseg, initial=initial, final=final)
    want = reference_grads(xs, s0, w, ws)
    for n in (nseg, 1):
        got = sol._backward_with(w, ws, *xs, s0, kernel="chunk_bwd", segments=n)
        check_grads(got, want, list(xs) + [s0])


GATES = {"zeros-at-edges": None, "negative": (-1.0, 0.0), "above1": (1.0, 1.05), "zero": 0.0}


@cuda
@pytest.mark.parametrize("gate", list(GATES))
def test_segment_gate_classes(sol, gate):
    """fp32, 4 segments of 2 chunks: exact zeros at segment edges (steps 63, 64, 128, 191, 192), negative gates,
    gates above 1, all zeros."""
    if not big_smem():
        pytest.skip("chunk_bwd needs Hopper's shared memory")
    xs, s0, w, ws = problem((1, 250, 2, 32, 48), seed=31, gate=GATES[gate])
    if gate == "zeros-at-edges":
        xs[3][:, [0, 63, 64, 128, 191, 192]] = 0.0
    want = reference_grads(xs, s0, w, ws)
    got = sol._backward_with(w, ws, *xs, s0, kernel="chunk_bwd", segments=4)
    check_grads(got, want, list(xs) + [s0])


NONFINITE = {"v-nan-seg0": (2, (0, 5, 0, 3), float("nan")), "q-inf-seg2": (0, (0, 140, 0, 5), float("inf")),
             "q-nan-seg1": (0, (0, 70, 0, 2), float("nan")), "k-inf-seg3": (1, (0, 200, 0, 3), float("inf")),
             "gate-nan-seg1": (3, (0, 80, 0), float("nan")), "gate-nan-last": (3, (0, 250, 0), float("nan"))}


@cuda
@pytest.mark.parametrize("case", list(NONFINITE))
def test_segment_nonfinite_input(sol, case):
    """A NaN or inf in one segment: each gradient non-finite exactly where float64 autograd is, NaN exactly where it
    is for a NaN input (as test_backward's test_nonfinite_input, across 4 segments)."""
    if not big_smem():
        pytest.skip("chunk_bwd needs Hopper's shared memory")
    which, at, value = NONFINITE[case]
    xs, _, w, _ = problem((1, 256, 1, 16, 16), seed=6, initial=False, final=False)
    xs[which][at] = value
    got = sol._backward_with(w, None, *xs, None, kernel="chunk_bwd", segments=4)
    leaves = [x.detach().cpu().double().requires_grad_() for x in xs]
    y, _ = naive.recurrent_naive(*leaves)
    want = torch.autograd.grad(y, leaves, w.cpu().double())
    for name, g, exact in zip(NAMES, got, want):
        g = g.cpu()
        if case.split("-")[1] == "nan":
            assert torch.equal(torch.isnan(g), torch.isnan(exact)), \
                f"{name} NaN mask: {mask_diff(torch.isnan(g), torch.isnan(exact))}"
        assert torch.equal(torch.isfinite(g), torch.isfinite(exact)), \
            f"{name} finite mask: {mask_diff(torch.isfinite(g), torch.isfinite(exact))}"
        keep = torch.isfinite(exact)
        if keep.any():
            err = rel_l2(g[keep], exact[keep])
            assert err <= FP32_TOL, f"{name}: rel-L2 {err:.3e} on the finite elements"


@cuda
@pytest.mark.parametrize("dtype", [FP32, BF16], ids=["fp32", "bf16"])
def test_segments_are_deterministic(sol, dtype):
    """Planned segments (B*H = 2 on a long T): bitwise the same gradients run to run."""
    if not big_smem():
        pytest.skip("chunk_bwd needs Hopper's shared memory")
    shape = (1, 2000, 2, 64, 64)
    assert planned_segments(sol.plan_backward(*shape, dtype=dtype))[0] > 1
    xs, s0, w, ws = problem(shape, dtype, seed=9)
    first = sol._backward_with(w, ws, *xs, s0)
    second = sol._backward_with(w, ws, *xs, s0)
    for name, a, b in zip(NAMES, first, second):
        assert torch.equal(a, b), name
