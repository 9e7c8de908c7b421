"""The backward (issue 15): gated_recurrence and ModelNew record autograd, and every gradient (dq, dk, dv, dgate,
dbeta, d initial_state) matches float64 (naive.recurrent_backward_naive on the rounded inputs the kernel sees, or
autograd through naive.recurrent_naive) for the loss <y, W> + <S_T, W_S>. GPU: shapes (D = 1 to 256, D_k != D_v,
T = 0, 1, ragged), every gate class, initial and final states used and unused, strided inputs and dy (stride 0
included), the gradients' dtypes and shapes, determinism, NaN and inf, ModelNew, numerics="reference", the
_backward_with hook, the unit built on first use, torch.compile bitwise equal to eager. CPU: the unit and kernel
names, plan_backward, _backward_with's argument errors. Gradients come from torch.autograd.grad (fresh tensors, no
accumulation) on NaN-poisoned memory, so an unwritten element shows up."""
import json
import os
import subprocess
import sys

import pytest
import torch

import naive
from conftest import ROOT, cuda
from helpers import DTYPE_IDS, DTYPES, SPEC, inputs, poison_allocator, rel_l2, rounding_floor, shape_id

FP32, FP16, BF16 = torch.float32, torch.float16, torch.bfloat16
NAMES = ("dq", "dk", "dv", "dgate", "dbeta", "d_initial_state")
FP32_TOL = 1e-5  # rel-L2 of a float32 gradient against float64


def grad_tol(exact, dtype):
    """A float32 gradient: FP32_TOL; a 16-bit one: twice the error of the float64 gradient rounded to its dtype."""
    if dtype == FP32:
        return FP32_TOL
    return 2 * rounding_floor(exact, dtype) + 1e-6


def problem(shape, dtype=FP32, seed=0, gate=None, initial=True, final=True):
    """Inputs on the GPU in `dtype` (gate and beta too), S_0 (float32) or None, the loss weights W (y's dtype:
    dy = W exactly) and W_S (float32) or None."""
    B, T, H, Dk, Dv = shape
    xs = inputs(*shape, dtype=dtype, seed=seed, gate=gate)
    gen = torch.Generator().manual_seed(seed + 1000)
    s0 = torch.randn(B, H, Dk, Dv, generator=gen).cuda()
    w = torch.randn(B, T, H, Dv, generator=gen).to("cuda", dtype)
    ws = torch.randn(B, H, Dk, Dv, generator=gen).cuda()
    return xs, s0 if initial else None, w, ws if final else None


def kernel_grads(sol, xs, s0=None, w=None, ws=None, output_final_state=None, numerics="accurate"):
    """[dq, dk, dv, dgate, dbeta, d_initial_state (None without S_0)] by torch.autograd.grad through
    gated_recurrence, with dy = w and dS_T = ws (S_T returned when ws is given, or when output_final_state says
    so, and then left out of the loss when ws is None)."""
    leaves = [x.detach().requires_grad_() for x in xs] + ([s0.detach().requires_grad_()] if s0 is not None else [])
    final = ws is not None if output_final_state is None else output_final_state
    out = sol.gated_recurrence(*leaves[:5], initial_state=leaves[5] if s0 is not None else None,
                               output_final_state=final, numerics=numerics)
    y, sT = out if final else (out, None)
    assert y.grad_fn is not None and (sT is None or sT.grad_fn is not None)
    outs, weights = ([y, sT], [w, ws]) if ws is not None else ([y], [w])
    poison_allocator()
    grads = torch.autograd.grad(outs, leaves, weights)
    return list(grads) + ([None] if s0 is None else [])


def reference_grads(xs, s0, w, ws):
    """The float64 reverse loop on the same (rounded) inputs, on the CPU."""
    cpu = [x.detach().cpu() for x in xs]
    return naive.recurrent_backward_naive(*cpu, w.cpu(), initial_state=None if s0 is None else s0.cpu(),
                                          d_final_state=None if ws is None else ws.cpu())


def check_grads(got, want, likes):
    """Each gradient: the dtype, shape and device of its input (None where the input is None), finite, and
    within grad_tol of float64."""
    errors = {}
    for name, g, exact, like in zip(NAMES, got, want, likes):
        if like is None:
            assert g is None, f"{name}: a gradient for an input that is None"
            continue
        assert g is not None, f"{name}: no gradient"
        assert g.dtype == like.dtype and g.shape == like.shape and g.device == like.device, \
            f"{name}: {g.dtype} {tuple(g.shape)} {g.device} for an input {like.dtype} {tuple(like.shape)} {like.device}"
        assert torch.isfinite(g).all(), f"{name}: unwritten or non-finite elements"
        errors[name] = rel_l2(g.cpu(), exact)
        assert errors[name] <= grad_tol(exact, g.dtype), f"{name}: rel-L2 {errors[name]:.3e} (all: {errors})"
    return errors


def run_and_check(sol, xs, s0, w, ws, **kwargs):
    got = kernel_grads(sol, xs, s0, w, ws, **kwargs)
    check_grads(got, reference_grads(xs, s0, w, ws), xs + [s0])
    return got


# ---- correctness against float64: shapes and dtypes
# (B, T, H, D_k, D_v): the KernelBench shape, D = 1, ragged T and D = 33, a long T with D = 7, D = 100, D_k != D_v
# both ways, D = 256, D_v = 200 (over one column tile).
SHAPES = [(2, 128, 4, 24, 24), (1, 1, 1, 1, 1), (2, 63, 3, 33, 33), (1, 300, 2, 7, 7), (1, 40, 2, 100, 100),
          (2, 50, 2, 33, 100), (1, 33, 2, 128, 64), (1, 20, 1, 256, 256), (1, 70, 2, 64, 200)]
LOW_SHAPES = [(2, 128, 4, 24, 24), (1, 1, 1, 1, 1), (2, 63, 3, 33, 33), (1, 33, 2, 128, 64), (1, 70, 2, 64, 200)]
SHAPE_CASES = [(s, FP32) for s in SHAPES] + [(s, d) for d in (FP16, BF16) for s in LOW_SHAPES]


@cuda
@pytest.mark.parametrize("shape,dtype", SHAPE_CASES,
                         ids=[f"{shape_id(s)}-{DTYPE_IDS[DTYPES.index(d)]}" for s, d in SHAPE_CASES])
def test_gradients_match_float64(sol, shape, dtype):
    """Initial state given and the final state in the loss: all six gradients."""
    xs, s0, w, ws = problem(shape, dtype, seed=sum(shape))
    run_and_check(sol, xs, s0, w, ws)


@cuda
@pytest.mark.parametrize("final", ["used", "unused", "not-returned"])
@pytest.mark.parametrize("initial", [True, False], ids=["initial-state", "zero-state"])
def test_empty_sequence(sol, initial, final):
    """T = 0: empty gradients of the inputs' shapes and dtypes; d initial_state is W_S when S_T is in the loss,
    else zeros."""
    xs, s0, w, ws = problem((1, 0, 2, 8, 8), initial=initial, final=final == "used")
    got = kernel_grads(sol, xs, s0, w, ws, output_final_state=final != "not-returned")
    for name, g, x in zip(NAMES, got, xs):
        assert g.shape == x.shape and g.dtype == x.dtype and g.is_cuda, name
    if initial:
        assert got[5].dtype == FP32 and got[5].shape == s0.shape
        assert torch.equal(got[5], ws if final == "used" else torch.zeros_like(s0))
    else:
        assert got[5] is None


# ---- gates
GATE_SHAPE = (2, 130, 2, 32, 40)
GATE_CASES = {"sigmoid": None, "zero": 0.0, "zeros-at-steps": None, "negative": (-1.0, 0.0), "above1": (1.0, 1.05),
              "near1": (1 - 1e-4, 1 + 1e-4), "one": 1.0}
ZERO_STEPS = (0, 63, 64, 127)


@cuda
@pytest.mark.parametrize("gate", list(GATE_CASES))
def test_gate_classes(sol, gate):
    """fp32, initial and final states: exact zeros (everywhere, and at steps 0, 63, 64, 127 only: chunk and
    checkpoint edges), negative gates, gates above 1, near 1 and exactly 1. Nothing divides by a gate."""
    xs, s0, w, ws = problem(GATE_SHAPE, seed=21, gate=GATE_CASES[gate])
    if gate == "zeros-at-steps":
        xs[3][:, list(ZERO_STEPS)] = 0.0
    got = run_and_check(sol, xs, s0, w, ws)
    if gate == "zeros-at-steps":  # the gate gradient at a zero gate is not zero (<Sh_t, S_{t-1}>)
        assert all(got[3][:, t].abs().amax() > 0 for t in ZERO_STEPS)


# ---- states
@cuda
@pytest.mark.parametrize("final", ["used", "unused", "not-returned"])
@pytest.mark.parametrize("initial", [True, False], ids=["initial-state", "zero-state"])
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_initial_and_final_state(sol, dtype, initial, final):
    """With and without initial_state; the final state returned and in the loss, returned but not in the loss
    (its gradient None or zeros: no dfinal), or not returned."""
    xs, s0, w, ws = problem((2, 70, 3, 33, 20), dtype, seed=4, initial=initial, final=final == "used")
    run_and_check(sol, xs, s0, w, ws, output_final_state=final != "not-returned")


@cuda
@pytest.mark.parametrize("dtype", [FP32, BF16], ids=["fp32", "bf16"])
def test_forward_with_grad_equals_forward_without(sol, dtype):
    """Recording autograd does not change y or S_T: bitwise the no-grad call's."""
    xs, s0, _, _ = problem((2, 70, 3, 33, 20), dtype, seed=6)
    leaves = [x.detach().requires_grad_() for x in xs + [s0]]
    y, sT = sol.gated_recurrence(*leaves[:5], initial_state=leaves[5], output_final_state=True)
    with torch.no_grad():
        y0, s0T = sol.gated_recurrence(*leaves[:5], initial_state=leaves[5], output_final_state=True)
    assert y.grad_fn is not None and y0.grad_fn is None
    assert torch.equal(y.detach(), y0) and torch.equal(sT.detach(), s0T)


@cuda
@pytest.mark.parametrize("which", range(6), ids=list(NAMES))
def test_one_input_requiring_grad_gets_its_gradient(sol, which):
    """Any one of q, k, v, gate, beta, initial_state requiring grad makes the result differentiable."""
    xs, s0, w, ws = problem((2, 40, 3, 24, 20), seed=8)
    leaves = xs + [s0]
    leaf = leaves[which].detach().requires_grad_()
    args = [leaf if i == which else x for i, x in enumerate(leaves)]
    y, sT = sol.gated_recurrence(*args[:5], initial_state=args[5], output_final_state=True)
    assert y.grad_fn is not None and sT.grad_fn is not None
    poison_allocator()
    (g,) = torch.autograd.grad([y, sT], [leaf], [w, ws])
    exact = reference_grads(xs, s0, w, ws)[which]
    check_grads([None] * which + [g], [None] * which + [exact], [None] * which + [leaf])


# ---- layouts
STRIDED_SHAPE = (2, 64, 3, 32, 24)
STRIDED_CASES = ["bhtd-q-k", "head-broadcast-q-k", "gate-beta-slices", "strided-initial-state", "fp32-gates-bf16",
                 "dy-stride0", "dy-transposed"]


def strided_case(case):
    """(leaves on the GPU, build): build(leaves) -> (q, k, v, gate, beta, initial_state) as views of the leaves.
    The same build on float64 copies of the leaves gives the reference, so a leaf's gradient is the sum over
    the places it is read (expand) and zero where it is not (slices)."""
    B, T, H, Dk, Dv = STRIDED_SHAPE
    q, k, v, g, b = inputs(*STRIDED_SHAPE, seed=13)
    plain = lambda ls: (*ls, None)  # noqa: E731
    if case == "bhtd-q-k":  # (B, H, T, D) memory viewed as (B, T, H, D)
        return [q.transpose(1, 2).contiguous(), k.transpose(1, 2).contiguous(), v, g, b], \
            lambda ls: (ls[0].transpose(1, 2), ls[1].transpose(1, 2), *ls[2:], None)
    if case == "head-broadcast-q-k":  # one head of q and k read by every head (stride 0)
        return [q[:, :, :1].contiguous(), k[:, :, :1].contiguous(), v, g, b], \
            lambda ls: (ls[0].expand(B, T, H, Dk), ls[1].expand(B, T, H, Dk), *ls[2:], None)
    if case == "gate-beta-slices":  # every third head of gate, every other step of beta
        return [q, k, v, g.repeat(1, 1, 3), b.repeat(1, 2, 1)], \
            lambda ls: (*ls[:3], ls[3][:, :, 1::3], ls[4][:, ::2], None)
    if case == "strided-initial-state":
        return [q, k, v, g, b, torch.randn(B, H, Dk, 2 * Dv, device="cuda")], lambda ls: (*ls[:5], ls[5][..., ::2])
    if case == "fp32-gates-bf16":
        return [q.bfloat16(), k.bfloat16(), v.bfloat16(), g, b], plain
    return [q, k, v, g, b], plain


def loop64(q, k, v, gate, beta, initial_state=None, output_final_state=False):
    """naive.recurrent_naive with gated_recurrence's signature."""
    y, sT = naive.recurrent_naive(q, k, v, gate, beta, initial_state=initial_state)
    return (y, sT) if output_final_state else y


@cuda
@pytest.mark.parametrize("case", STRIDED_CASES)
def test_strided_inputs(sol, case):
    """Non-contiguous q, k, gate, beta and S_0, float32 gate and beta beside bf16 q, k, v (each gradient in its
    input's dtype), and dy of stride 0 (loss y.sum()) or transposed, against float64 autograd through the loop."""
    B, T, H, Dk, Dv = STRIDED_SHAPE
    leaves, build = strided_case(case)
    gen = torch.Generator().manual_seed(17)
    w = torch.randn(B, H, T, Dv, generator=gen).transpose(1, 2) if case == "dy-transposed" \
        else torch.randn(B, T, H, Dv, generator=gen)
    ws = torch.randn(B, H, Dk, Dv, generator=gen)

    def grads(ls, fn, weights):
        q, k, v, g, b, s0 = build(ls)
        out = fn(q, k, v, g, b, initial_state=s0, output_final_state=s0 is not None)
        y, sT = out if s0 is not None else (out, None)
        if case == "dy-stride0":
            return torch.autograd.grad(y.sum(), ls)
        outs = [y, sT] if sT is not None else [y]
        return torch.autograd.grad(outs, ls, weights[:len(outs)])

    w = w.to(leaves[0].dtype)  # y's dtype (dy = W exactly); the reference takes the same rounded W
    gpu = [x.detach().requires_grad_() for x in leaves]
    poison_allocator()
    got = grads(gpu, sol.gated_recurrence, [w.cuda(), ws.cuda()])
    cpu = [x.detach().cpu().double().requires_grad_() for x in leaves]
    want = grads(cpu, loop64, [w.double(), ws.double()])
    for i, (g, exact, like) in enumerate(zip(got, want, leaves)):
        assert g.dtype == like.dtype and g.shape == like.shape, f"leaf {i}: {g.dtype} {tuple(g.shape)}"
        assert torch.isfinite(g).all(), f"leaf {i}: unwritten or non-finite elements"
        err = rel_l2(g.cpu(), exact)
        assert err <= grad_tol(exact, g.dtype), f"leaf {i}: rel-L2 {err:.3e}"


# ---- dtypes and shapes through .backward()
DTYPE_CASES = {"fp32": (FP32, FP32), "fp16": (FP16, FP16), "bf16": (BF16, BF16), "bf16-fp32-gates": (BF16, FP32)}


@cuda
@pytest.mark.parametrize("case", list(DTYPE_CASES))
def test_gradient_dtypes_and_shapes(sol, case):
    """loss.backward() fills each leaf's .grad in its own dtype and shape: dq, dk, dv in q's, dgate and dbeta in
    gate's and beta's (float32 beside 16-bit q, k, v), d initial_state float32."""
    dtype, gate_dtype = DTYPE_CASES[case]
    xs, s0, w, ws = problem((2, 40, 3, 24, 20), dtype, seed=2)
    xs[3:] = [x.to(gate_dtype) for x in xs[3:]]
    leaves = [x.detach().requires_grad_() for x in xs + [s0]]
    y, sT = sol.gated_recurrence(*leaves[:5], initial_state=leaves[5], output_final_state=True)
    assert y.dtype == dtype and sT.dtype == FP32
    ((y * w).sum() + (sT * ws).sum()).backward()
    for name, leaf in zip(NAMES, leaves):
        g = leaf.grad
        assert g is not None, name
        assert g.dtype == leaf.dtype and g.shape == leaf.shape and g.is_cuda, f"{name}: {g.dtype} {tuple(g.shape)}"
        assert torch.isfinite(g).all(), name


# ---- determinism
@cuda
@pytest.mark.parametrize("dtype", [FP32, BF16], ids=["fp32", "bf16"])
def test_deterministic(sol, dtype):
    """The same inputs give bitwise the same gradients (no atomics), run to run."""
    xs, s0, w, ws = problem((2, 300, 2, 64, 96), dtype, seed=3)
    first = kernel_grads(sol, xs, s0, w, ws)
    second = kernel_grads(sol, xs, s0, w, ws)
    for name, a, b in zip(NAMES, first, second):
        assert torch.equal(a, b), name


# ---- NaN and inf
NONFINITE = {"v-nan": (2, (0, 41, 1, 3), float("nan")), "q-inf": (0, (1, 20, 0, 5), float("inf")),
             "q-nan": (0, (0, 33, 1, 2), float("nan")), "k-inf": (1, (1, 40, 0, 3), float("inf")),
             "gate-nan": (3, (0, 50, 1), float("nan"))}


def mask_diff(got, want):
    bad = (got != want).nonzero()
    return f"{len(bad)} elements differ, first at {bad[0].tolist() if len(bad) else None}"


def check_masks(name, g, exact, nan_input):
    """g non-finite exactly where exact is, and (a NaN input) NaN exactly where it is."""
    if nan_input:
        assert torch.equal(torch.isnan(g), torch.isnan(exact)), \
            f"{name} NaN mask: {mask_diff(torch.isnan(g), torch.isnan(exact))}"
    assert torch.equal(torch.isfinite(g), torch.isfinite(exact)), \
        f"{name} finite mask: {mask_diff(torch.isfinite(g), torch.isfinite(exact))}"


def check_nonfinite(got, xs, s0, w, ws, nan_input, tol=None):
    """got (the kernel's gradients of xs and s0 for <y, w> + <S_T, ws>) non-finite exactly where float64 autograd
    through the loop is (check_masks); with tol, within it (rel-L2) on the finite elements too."""
    leaves = [x.detach().cpu().double().requires_grad_() for x in xs + [s0]]
    y, sT = naive.recurrent_naive(*leaves[:5], initial_state=leaves[5])
    want = torch.autograd.grad([y, sT], leaves, [w.cpu().double(), ws.cpu().double()])
    for name, g, exact in zip(NAMES, got, want):
        check_masks(name, g.cpu(), exact, nan_input)
        keep = torch.isfinite(exact)
        if tol is not None and keep.any():
            err = rel_l2(g.cpu()[keep], exact[keep])
            assert err <= tol, f"{name}: rel-L2 {err:.3e} on the finite elements"


@cuda
@pytest.mark.parametrize("case", list(NONFINITE))
def test_nonfinite_input(sol, case):
    """One NaN or inf in an input at one step: each gradient is non-finite exactly where float64 autograd
    through the loop is, and for a NaN input NaN exactly where it is. (An inf input: the loop forms dS = q dy^T
    first, and dk_s = dS v_s then meets inf - inf, NaN; the chunked backward forms q (dy . v_s), +-inf, the
    limit. Both are non-finite; only the NaN / inf split differs. inf in q with the zero initial state:
    autograd's dgate at step 0 is <inf row, 0> = NaN.)"""
    which, at, value = NONFINITE[case]
    xs, _, w, _ = problem((2, 70, 2, 16, 16), seed=5, initial=False, final=False)
    xs[which][at] = value
    got = kernel_grads(sol, xs, None, w, None)
    leaves = [x.detach().cpu().double().requires_grad_() for x in xs]
    y, _ = naive.recurrent_naive(*leaves)
    want = torch.autograd.grad(y, leaves, w.cpu().double())
    assert any(torch.isnan(x).any() for x in want)  # the case bites
    for name, g, exact in zip(NAMES, got, want):
        g = g.cpu()
        check_masks(name, g, exact, case.endswith("nan"))
        keep = torch.isfinite(exact)
        err = rel_l2(g[keep], exact[keep])
        assert err <= FP32_TOL, f"{name}: rel-L2 {err:.3e} on the finite elements"


# ---- ModelNew, numerics="reference", the hook
@cuda
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_model_new_backward(sol, dtype):
    """ModelNew (reference numerics for fp16 and bf16): loss.backward() gives the float64 gradients."""
    xs, _, w, _ = problem(SPEC, dtype, seed=1, initial=False, final=False)
    leaves = [x.detach().requires_grad_() for x in xs]
    y = sol.ModelNew()(*leaves)
    assert y.grad_fn is not None
    poison_allocator()
    (y * w).sum().backward()
    check_grads([x.grad for x in leaves] + [None], reference_grads(xs, None, w, None), xs + [None])


@cuda
@pytest.mark.parametrize("dtype", [FP16, BF16], ids=["fp16", "bf16"])
def test_reference_numerics_backward(sol, dtype):
    """numerics="reference" records autograd; its backward is the accurate gradient of the exact recurrence at
    those inputs (states included)."""
    xs, s0, w, ws = problem((2, 70, 3, 33, 20), dtype, seed=12)
    run_and_check(sol, xs, s0, w, ws, numerics="reference")


@cuda
@pytest.mark.parametrize("states", ["none", "initial", "final", "both"])
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_backward_hook(sol, dtype, states):
    """_backward_with(dy, dfinal, ...) eagerly: the six gradients, d initial_state None without initial_state."""
    xs, s0, w, ws = problem((2, 63, 3, 33, 20), dtype, seed=14, initial=states in ("initial", "both"),
                            final=states in ("final", "both"))
    poison_allocator()
    got = sol._backward_with(w, ws, *xs, initial_state=s0)
    assert isinstance(got, tuple) and len(got) == 6
    check_grads(got, reference_grads(xs, s0, w, ws), xs + [s0])


# ---- the hook's argument errors (CPU tensors reach every dtype and shape check; CUDA ones must not launch)
ERROR_CASES = {
    "dy-shape": ("dy", lambda a: torch.randn(2, 5, 3, 7), ValueError, r"^dy "),
    "dy-time": ("dy", lambda a: torch.randn(2, 6, 3, 6), ValueError, r"^dy "),
    "dy-rank": ("dy", lambda a: torch.randn(2, 5, 18), ValueError, r"^dy "),
    "dy-dtype": ("dy", lambda a: torch.randn(2, 5, 3, 6, dtype=FP16), TypeError, r"\bdy\b"),
    "dy-float32-beside-bf16": ("dy", lambda a: torch.randn(2, 5, 3, 6), TypeError, r"\bdy\b"),
    "dfinal-shape": ("dfinal", lambda a: torch.randn(2, 3, 6, 4), ValueError, r"\bdfinal\b"),
    "dfinal-rank": ("dfinal", lambda a: torch.randn(3, 4, 6), ValueError, r"\bdfinal\b"),
    "dfinal-dtype": ("dfinal", lambda a: torch.randn(2, 3, 4, 6, dtype=torch.float64), TypeError, r"\bdfinal\b"),
    "dfinal-bf16": ("dfinal", lambda a: torch.randn(2, 3, 4, 6, dtype=BF16), TypeError, r"\bdfinal\b"),
}


def hook_args(device, dtype=FP32):
    """Valid _backward_with arguments at (2, 5, 3, 4, 6): dy, dfinal, [q, k, v, gate, beta], initial_state."""
    xs = inputs(2, 5, 3, 4, 6, dtype=dtype, device=device, seed=0)
    gen = torch.Generator().manual_seed(1)
    dy = torch.randn(2, 5, 3, 6, generator=gen).to(device, dtype)
    return {"dy": dy, "dfinal": torch.randn(2, 3, 4, 6, generator=gen).to(device), "xs": xs,
            "s0": torch.randn(2, 3, 4, 6, generator=gen).to(device)}


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=cuda)])
@pytest.mark.parametrize("case", list(ERROR_CASES))
def test_backward_hook_argument_errors(sol, case, device):
    name, bad, exc, pattern = ERROR_CASES[case]
    a = hook_args(device, BF16 if case in ("dy-float32-beside-bf16", "dfinal-bf16") else FP32)
    a[name] = bad(a).to(device)
    with pytest.raises(exc, match=pattern):
        sol._backward_with(a["dy"], a["dfinal"], *a["xs"], initial_state=a["s0"])


@pytest.mark.parametrize("states", [False, True], ids=["no-states", "states"])
def test_backward_hook_refuses_cpu_tensors(sol, states):
    a = hook_args("cpu")
    with pytest.raises(ValueError, match=r"(?i)cuda"):
        sol._backward_with(a["dy"], a["dfinal"] if states else None, *a["xs"], initial_state=a["s0"] if states else None)


# ---- unit, kernel, plan
def test_backward_unit_and_kernel_are_named(sol):
    assert "backward" in sol.UNITS and "recurrent_bwd" in sol.KERNELS and "chunk_bwd" in sol.KERNELS


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("shape", [SPEC, (2, 50, 2, 33, 100), (1, 300, 2, 64, 200)], ids=shape_id)
def test_plan_backward(sol, shape, dtype):
    """D_k, D_v <= 128 (on an H200's shared memory, or this GPU's where it has as much): chunk_bwd, which forms dq
    itself; else recurrent_bwd, whose dq line is the forward plan of (dy, v, k): D_k and D_v swapped. Forced
    recurrent_bwd names that plan too."""
    B, T, H, Dk, Dv = shape
    dq_line = [f"dq: {sol.plan(B, T, H, Dv, Dk, dtype)}"]
    text = sol.plan_backward(*shape, dtype=dtype)
    assert isinstance(text, str) and "unit backward" in text, text
    big = not torch.cuda.is_available() or torch.cuda.get_device_properties(0).shared_memory_per_block_optin >= 216000
    if max(Dk, Dv) <= 128 and big:
        assert text.startswith("chunk_bwd ") and "dq: in chunk_bwd" in text, text
    else:
        assert text.startswith("recurrent_bwd ") and [ln for ln in text.splitlines() if ln.startswith("dq: ")] == dq_line, text
    forced = sol.plan_backward(*shape, dtype=dtype, kernel="recurrent_bwd")
    assert forced.startswith("recurrent_bwd ") and [ln for ln in forced.splitlines() if ln.startswith("dq: ")] == dq_line


@cuda
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("shape", [(2, 100, 3, 33, 40), (1, 65, 2, 128, 128), (2, 31, 1, 7, 100)], ids=shape_id)
def test_both_backward_kernels(sol, shape, dtype):
    """chunk_bwd and recurrent_bwd, each forced through the hook, against float64 (chunk edges, a ragged end)."""
    if torch.cuda.get_device_properties(0).shared_memory_per_block_optin < 216000:
        pytest.skip("chunk_bwd needs Hopper's shared memory")
    xs, s0, w, ws = problem(shape, dtype, seed=5)
    want = reference_grads(xs, s0, w, ws)
    for kernel in ("chunk_bwd", "recurrent_bwd"):
        poison_allocator()
        got = sol._backward_with(w, ws, *xs, s0, kernel=kernel)
        check_grads(got, want, list(xs) + [s0])


UNITS_SCRIPT = """
import json, torch, solution
print(json.dumps(list(solution.built_units())), flush=True)
xs = [x.cuda().requires_grad_() for x in (torch.randn(1, 8, 1, 4), torch.randn(1, 8, 1, 4), torch.randn(1, 8, 1, 4),
                                          torch.rand(1, 8, 1), torch.rand(1, 8, 1))]
y = solution.gated_recurrence(*xs)
print(json.dumps(list(solution.built_units())), flush=True)
y.sum().backward()
print(json.dumps(list(solution.built_units())), flush=True)
"""


@cuda
def test_backward_unit_is_built_on_first_use(sol):
    """A fresh process: not loaded at import, loaded by the first backward."""
    proc = subprocess.run([sys.executable, "-c", UNITS_SCRIPT], cwd=ROOT, env=dict(os.environ), capture_output=True,
                          text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    at_import, _, after_backward = [json.loads(ln) for ln in proc.stdout.splitlines() if ln.startswith("[")]
    assert "backward" not in at_import and "core" in at_import
    assert "backward" in after_backward


LAYOUT_UNITS_SCRIPT = """
import torch, solution
# bfloat16 D = 128 with B*H*T >= 8192: contiguous inputs plan chunk_sm90 on Hopper; a stride-0 dy (y.sum()) and a
# q whose rows are not 16-byte aligned plan the mma.sync chunk unit, which nothing has built yet
B, T, H, D = 1, 8192, 1, 128
base = torch.randn(B, T, H, D + 1, device="cuda").bfloat16()
q = base[..., 1:].requires_grad_(False).detach().requires_grad_()  # rows start 2 bytes in
xs = [q] + [torch.randn(B, T, H, D, device="cuda").bfloat16().requires_grad_() for _ in range(2)] + \
     [torch.rand(B, T, H, device="cuda").bfloat16().requires_grad_() for _ in range(2)]
solution.gated_recurrence(*xs).float().sum().backward()
print("ok", all(torch.isfinite(x.grad.float()).all().item() for x in xs), flush=True)
"""


@cuda
def test_units_follow_the_call_layout(sol):
    """A fresh process: the units of the plans of the call's own layouts (not of contiguous inputs) are built before
    the registered operators run, forward and backward."""
    proc = subprocess.run([sys.executable, "-c", LAYOUT_UNITS_SCRIPT], cwd=ROOT, env=dict(os.environ),
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    assert "ok True" in proc.stdout, proc.stdout[-2000:]


@cuda
def test_double_backward_is_refused(sol):
    """create_graph=True through the backward, then a second gradient: a clear NotImplementedError, not silence."""
    xs, s0, w, ws = problem((1, 40, 2, 16, 16), seed=11)
    leaves = [x.detach().requires_grad_() for x in xs]
    y = sol.gated_recurrence(*leaves)
    g = torch.autograd.grad((y * w).sum(), leaves, create_graph=True)
    with pytest.raises(NotImplementedError, match="no double backward"):
        torch.autograd.grad(g[0].square().sum(), leaves, allow_unused=True)


@cuda
def test_forward_only_paths_refuse_under_compile(sol):
    """Compiled graphs do not reach the C++ grad check: cu_seqlens calls refuse in their backward, the decode step
    when it is traced; neither leaves the gradients out silently."""
    torch._dynamo.reset()
    xs = [x.detach().requires_grad_() for x in inputs(1, 20, 2, 8, 8, dtype=FP32, seed=3)]
    cu = torch.tensor([0, 7, 20], device="cuda", dtype=torch.int32)
    f = torch.compile(lambda *a: sol.gated_recurrence(*a, cu_seqlens=cu, max_seqlen=13).sum(), fullgraph=True)
    # AOT autograd traces the backward when it compiles, so the refusal may come wrapped (BackendCompilerFailed)
    with pytest.raises(Exception, match="cu_seqlens has no backward"):
        f(*xs).backward()
    torch._dynamo.reset()
    pool = torch.zeros(2, 2, 8, 8, device="cuda")
    step = [x.detach() for x in inputs(2, 1, 2, 8, 8, dtype=FP32, seed=4)]
    step[0].requires_grad_(True)
    g = torch.compile(lambda *a: sol.gated_recurrence_decode_(*a, pool), fullgraph=True)
    with pytest.raises(Exception, match="q requires grad"):
        g(*step)


# ---- torch.compile
COMPILED_FIRST_SCRIPT = """
import torch, solution
gen = torch.Generator().manual_seed(0)
xs = [x.cuda().requires_grad_() for x in (torch.randn(2, 64, 2, 32, generator=gen), torch.randn(2, 64, 2, 32, generator=gen),
                                          torch.randn(2, 64, 2, 32, generator=gen), torch.rand(2, 64, 2, generator=gen),
                                          torch.rand(2, 64, 2, generator=gen))]
w = torch.randn(2, 64, 2, 32, generator=gen).cuda()
torch.compile(lambda *a: (solution.gated_recurrence(*a) * w).sum(), fullgraph=True)(*xs).backward()
got = [x.grad.clone() for x in xs]
for x in xs:
    x.grad = None
(solution.gated_recurrence(*xs) * w).sum().backward()
assert all(torch.equal(a, x.grad) for a, x in zip(got, xs)), "compiled gradients differ from eager"
print("ok", flush=True)
"""


@cuda
def test_compiled_backward_first_in_a_process(sol, tmp_path):
    """A process whose first backward is compiled, twice with one compiler cache: the second process gets the
    compiled graphs from AOT autograd's cache, which traces no backward formula, so no backward fake builds the
    unit; the forward's fake must have (a real failure: "unit backward is not built")."""
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=str(tmp_path), TORCHINDUCTOR_FX_GRAPH_CACHE="1",
               TORCHINDUCTOR_AUTOGRAD_CACHE="1")
    for _ in range(2):
        proc = subprocess.run([sys.executable, "-c", COMPILED_FIRST_SCRIPT], cwd=ROOT, env=env, capture_output=True,
                              text=True, timeout=900)
        assert proc.returncode == 0 and "ok" in proc.stdout, proc.stdout[-2000:] + proc.stderr[-4000:]


@cuda
@pytest.mark.parametrize("states", [False, True], ids=["plain", "states"])
def test_compiled_backward_is_bitwise_eager(sol, states):
    """torch.compile(fullgraph=True) of the loss, then .backward(): the gradients bitwise eager's."""
    torch._dynamo.reset()
    shape = (2, 64, 2, 32, 32)
    xs, s0, w, ws = problem(shape, seed=9)

    def f(q, k, v, g, b, s=None):
        if not states:
            return (sol.gated_recurrence(q, k, v, g, b) * w).sum()
        y, sT = sol.gated_recurrence(q, k, v, g, b, initial_state=s, output_final_state=True)
        return (y * w).sum() + (sT * ws).sum()

    def grads(fn):
        leaves = [x.detach().clone().requires_grad_() for x in xs + ([s0] if states else [])]
        fn(*leaves).backward()
        return [x.grad for x in leaves]

    got = grads(torch.compile(f, fullgraph=True))
    want = grads(f)
    for name, a, b in zip(NAMES, got, want):
        assert torch.equal(a, b), name
