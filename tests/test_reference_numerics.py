"""numerics="reference": the PyTorch loop's rounding in the input dtype (the recurrent kernel with ROUND,
unit "reference"), which ModelNew uses by default for float16 and bfloat16 inputs so that KernelBench's
low-precision runs, which compare with Model run in that dtype, pass. GPU: against Model itself in each
dtype (bitwise but for the fp32 order of the D_k sum), gate classes, NaN, states and chained calls, T up
to 1024, autograd recorded when an input requires grad. CPU: the plan, the argument checks, and inputs that
require grad reaching the device check."""
import pytest
import torch

import reference
from conftest import cuda
from helpers import GATE_IDS, GATES, SPEC, inputs, rel_l2, ref64, shape_id, strided_state

LOW = [torch.float16, torch.bfloat16]
LOW_IDS = ["fp16", "bf16"]
# the KernelBench shape, odd sizes (D_k = 7 and 33 across lanes, D_v != D_k), T up to 1024
REF_SHAPES = [SPEC, (3, 63, 5, 7, 33), (2, 100, 3, 33, 20), (1, 1024, 4, 24, 24), (1, 300, 2, 64, 64)]


def model_in(xs, dtype):
    """What Model computes in `dtype` (KernelBench casts inputs and Model to the precision)."""
    return reference.Model()(*[x.to(dtype) for x in xs])


def close_to_model(y, ref):
    """Equal to Model's result but where the fp32 sum over D_k, in another order, rounds the other way
    (rarely): at least 99% of elements bitwise, the rest within 2 ulps, or within the fp32 sum's own error
    (a few fp32 ulps of the terms) where the sum cancels to a value far below its terms."""
    assert y.dtype == ref.dtype and y.shape == ref.shape
    assert torch.equal(torch.isnan(y), torch.isnan(ref))
    keep = ~torch.isnan(ref)
    y, ref = y[keep], ref[keep]
    same = (y == ref).float().mean().item() if y.numel() else 1.0
    assert same >= 0.99, f"{same:.4f} of elements bitwise equal to Model's"
    ulp = torch.finfo(ref.dtype).eps * ref.double().abs().clamp_min(torch.finfo(ref.dtype).tiny)
    slack = 1e-6 * ref.double().abs().max().item() if ref.numel() else 0.0
    assert bool(((y.double() - ref.double()).abs() <= 2 * ulp + slack).all())


@cuda
@pytest.mark.parametrize("dtype", LOW, ids=LOW_IDS)
@pytest.mark.parametrize("shape", REF_SHAPES, ids=shape_id)
def test_model_new_matches_model_in_low_precision(sol, shape, dtype):
    for seed in (0, 1, 2):
        xs = inputs(*shape, dtype=dtype, seed=seed)
        y = sol.ModelNew()(*xs)
        close_to_model(y, model_in(xs, dtype))
        assert torch.equal(y, sol.gated_recurrence(*xs, numerics="reference"))


# (D_k, R, G): each pair of GR_RG_PAIRS_REFERENCE where the plan picks it (D_v = 20: several column blocks)
REF_PAIRS = [(1, 1, 1), (2, 1, 2), (3, 1, 4), (7, 1, 8), (13, 1, 16), (24, 1, 32), (50, 2, 32), (100, 4, 32),
             (150, 6, 32), (256, 8, 32)]


def test_reference_tests_cover_every_pair(sol):
    import re
    found = re.search(r"#define GR_RG_PAIRS_REFERENCE\(X\)(.*)", "".join(sol.SOURCES.values()))
    pairs = sorted((int(a), int(b)) for a, b in re.findall(r"X\((\d+), (\d+)\)", found.group(1)))
    assert pairs == sorted((r, g) for _, r, g in REF_PAIRS)
    for dk, r, g in REF_PAIRS:
        assert f" R={r} G={g} " in sol.plan(1, 30, 2, dk, 20, "bfloat16", numerics="reference")


@cuda
@pytest.mark.parametrize("dtype", LOW, ids=LOW_IDS)
@pytest.mark.parametrize("dk", [p[0] for p in REF_PAIRS], ids=[f"R{p[1]}G{p[2]}" for p in REF_PAIRS])
def test_every_pair_matches_model(sol, dk, dtype):
    xs = inputs(1, 30, 2, dk, 20, dtype=dtype, seed=dk)
    close_to_model(sol.gated_recurrence(*xs, numerics="reference"), model_in(xs, dtype))


@cuda
@pytest.mark.parametrize("dtype", LOW, ids=LOW_IDS)
def test_kernelbench_allclose_at_every_seed(sol, dtype):
    """KernelBench's low-precision check (allclose at atol = rtol = 1e-2 against Model in that dtype), on
    get_inputs() drawn with seeds 0-9."""
    for seed in range(10):
        torch.manual_seed(seed)
        xs = [x.cuda().to(dtype) for x in reference.get_inputs()]
        assert torch.allclose(sol.ModelNew()(*xs), reference.Model()(*xs), atol=1e-2, rtol=1e-2)


@cuda
@pytest.mark.parametrize("gate", GATES, ids=GATE_IDS)
def test_gate_values(sol, gate):
    xs = inputs(2, 63, 3, 24, 24, dtype=torch.bfloat16, gate=gate)
    close_to_model(sol.gated_recurrence(*xs, numerics="reference"), model_in(xs, torch.bfloat16))


@cuda
@pytest.mark.parametrize("where", ["q", "k", "v", "gate", "beta"])
def test_nan_where_model_has_nan(sol, where):
    xs = inputs(2, 40, 3, 24, 24, dtype=torch.float16)
    xs[{"q": 0, "k": 1, "v": 2, "gate": 3, "beta": 4}[where]][0, 7, 1] = float("nan")
    close_to_model(sol.ModelNew()(*xs), model_in(xs, torch.float16))


@cuda
def test_fp32_reference_is_the_float32_loop(sol):
    """In float32 "reference" rounds like Model's float32 loop (no fused multiply-adds); ModelNew keeps the
    accurate kernels there."""
    xs = inputs(*SPEC, seed=3)
    y = sol.gated_recurrence(*xs, numerics="reference")
    assert rel_l2(y, model_in(xs, torch.float32)) <= 1e-6
    assert torch.equal(sol.ModelNew()(*xs), sol.gated_recurrence(*xs))


@cuda
@pytest.mark.parametrize("dtype", LOW, ids=LOW_IDS)
def test_accurate_is_the_functional_default(sol, dtype):
    """The functional API stays accurate (the exact answer rounded once); ModelNew("accurate") too."""
    xs = inputs(*SPEC, dtype=dtype, seed=4)
    exact = ref64(xs)
    acc = sol.gated_recurrence(*xs)
    assert torch.equal(acc, sol.ModelNew("accurate")(*xs))
    assert rel_l2(acc, exact) < rel_l2(sol.gated_recurrence(*xs, numerics="reference"), exact)


@cuda
@pytest.mark.parametrize("dtype", LOW, ids=LOW_IDS)
def test_states_chain_exactly(sol, dtype):
    """The state is held in the input dtype (an fp32 initial state is rounded to it first), so two chained
    calls equal one call bitwise, and the final state is what the loop's state holds."""
    xs = inputs(2, 90, 3, 33, 20, dtype=dtype, seed=5)
    y, s = sol.gated_recurrence(*xs, numerics="reference", output_final_state=True)
    first = [x[:, :37] for x in xs]
    rest = [x[:, 37:] for x in xs]
    y1, s1 = sol.gated_recurrence(*first, numerics="reference", output_final_state=True)
    y2, s2 = sol.gated_recurrence(*rest, numerics="reference", initial_state=s1, output_final_state=True)
    assert torch.equal(torch.cat([y1, y2], dim=1), y) and torch.equal(s2, s)
    assert torch.equal(s, s.to(dtype).float())
    s0 = strided_state(2, 3, 33, 20)
    ys = sol.gated_recurrence(*xs, numerics="reference", initial_state=s0)
    assert torch.equal(ys, sol.gated_recurrence(*xs, numerics="reference", initial_state=s0.to(dtype).float()))


@cuda
def test_inputs_that_require_grad_run_under_no_grad(sol):
    xs = inputs(*SPEC, dtype=torch.bfloat16)
    xs[0].requires_grad_(True)
    with torch.no_grad():
        y = sol.ModelNew()(*xs)
    assert y.grad_fn is None
    assert torch.equal(y, sol.ModelNew()(*[x.detach() for x in xs]))


@cuda
@pytest.mark.parametrize("dtype", LOW, ids=LOW_IDS)
def test_inputs_that_require_grad_record_autograd(sol, dtype):
    """With grad mode on (issue 15's backward), ModelNew's reference-numerics call records autograd, and y is
    bitwise the call's without grad."""
    xs = inputs(*SPEC, dtype=dtype)
    want = sol.ModelNew()(*xs)
    xs[0].requires_grad_(True)
    y = sol.ModelNew()(*xs)
    assert y.grad_fn is not None and torch.equal(y.detach(), want)


# ---- CPU: plan, arguments, gradients
def test_plan_names_the_reference_unit(sol):
    for dtype in ("float32", "float16", "bfloat16"):
        for shape in (SPEC, (8, 2048, 16, 128, 128)):
            text = sol.plan(*shape, dtype, numerics="reference")
            assert text.startswith("recurrent (RECURRENT_SRC, unit reference) ") and "numerics=reference" in text, text
    assert "numerics=" not in sol.plan(*SPEC, "bfloat16")


def test_numerics_must_be_named(sol):
    xs = inputs(*SPEC, device="cpu")
    for bad in ("fast", None, 1):
        with pytest.raises(ValueError, match="numerics must be 'accurate' or 'reference'"):
            sol.gated_recurrence(*xs, numerics=bad)
    with pytest.raises(ValueError, match="numerics"):
        sol.ModelNew("fp16")
    with pytest.raises(ValueError, match="numerics"):
        sol.plan(*SPEC, numerics="exact")


def test_reference_runs_only_the_recurrent_kernel(sol):
    xs = inputs(*SPEC, device="cpu")
    with pytest.raises(ValueError, match="numerics='reference' runs the recurrent kernel only"):
        sol._gated_recurrence_with(*xs, kernel="parallel", numerics="reference")


@pytest.mark.parametrize("which", [0, 1, 2, 3, 4, 5], ids=["q", "k", "v", "gate", "beta", "initial_state"])
def test_inputs_that_require_grad_reach_the_device_check(sol, which):
    """Differentiable (issue 15): an input that requires grad is no longer refused; with CPU tensors the call
    gets as far as the device check, as without grad."""
    xs = inputs(*SPEC, device="cpu")
    s0 = torch.zeros(2, 4, 24, 24)
    (xs + [s0])[which].requires_grad_(True)
    with pytest.raises(ValueError, match="^q must be a CUDA tensor"):
        if which == 5:
            sol.gated_recurrence(*xs, initial_state=s0)
        else:
            sol.ModelNew()(*xs)
