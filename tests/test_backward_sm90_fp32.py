"""chunk_bwd_sm90_fp32, the Hopper float32 backward (D_k = D_v = 128, fp16 wgmma on scaled hi + lo operands): GPU
(compute capability 9.0), forced through the _backward_with hook against float64 (T = 1, 63, 64, 100, 300; gate
classes; rows spread over 1e6; a loss on few steps; with and without both states; strided rows and states), inf and
NaN in each input (its chunk_bwd fallback), the checkpoints the forward writes (float32 rows of kCk32) and those it
recomputes (bitwise the same gradients), planned through autograd; CPU or Hopper: the plan's text. Its determinism,
refusals and the shapes it leaves to chunk_bwd: tests/test_backward_sm90.py."""
import pytest
import torch

from helpers import poison_allocator, rel_l2, shape_id, strided_state, with_layout
from test_backward import FP32_TOL, NAMES, check_grads, check_nonfinite, kernel_grads, problem, reference_grads
from test_backward_sm90 import GATES, HOPPER, NONFINITE, PLAN_SHAPES, SHAPES, check_forced, plan_only, sm90
from test_backward_sm90 import forced as forced_with
from test_forward_checkpoints import chunk_states, forward_ex, kernels_of

KERNEL = "chunk_bwd_sm90_fp32"
FP32 = torch.float32
CK32 = 128 * 128 + 8  # a checkpoint row: S [dk][dv], then 8 warps' max |S|


def forced(sol, xs, s0, w, ws, kernel=KERNEL):
    return forced_with(sol, xs, s0, w, ws, kernel)


def sms():
    return torch.cuda.get_device_properties(0).multi_processor_count if HOPPER else 132


# ---- correctness against float64 (test_backward_sm90's shapes)
@sm90
@pytest.mark.parametrize("states", ["both", "none"])
@pytest.mark.parametrize("shape", SHAPES, ids=shape_id)
def test_gradients_match_float64(sol, shape, states):
    check_forced(sol, shape + (128, 128), FP32, sum(shape), KERNEL, initial=states == "both", final=states == "both")


@sm90
@pytest.mark.parametrize("gate", ["zero", "negative", "above1", "near1", "mixed-sign"])
def test_gate_classes(sol, gate):
    """Gates 0, negative, above 1, near 1 (1e-4 here), both signs: direct products of the gates (no quotient, no log)."""
    spec = {"near1": (1 - 1e-4, 1 + 1e-4)}.get(gate, GATES[gate])
    check_forced(sol, (1, 130, 2, 128, 128), FP32, 7, KERNEL, gate=spec)


@sm90
def test_rows_across_six_decades(sol):
    """Rows of q, k, v and dy each scaled by 10^u, u in (-3, 3): one power-of-two scale a tile keeps the large rows'
    precision (the dev passes' "row scales" case)."""
    xs, s0, w, ws = problem((1, 300, 2, 128, 128), FP32, seed=11)
    gen = torch.Generator().manual_seed(11)
    scale = lambda: (10.0 ** (6 * torch.rand(1, 300, 2, 1, generator=gen) - 3)).cuda()  # noqa: E731
    xs[0], xs[1], xs[2], w = xs[0] * scale(), xs[1] * scale(), xs[2] * scale(), w * scale()
    check_grads(forced(sol, xs, s0, w, ws), reference_grads(xs, s0, w, ws), list(xs) + [s0])


@sm90
@pytest.mark.parametrize("case", ["dy-late", "last-token"])
def test_loss_on_few_steps(sol, case):
    """dy zero on each chunk's first 48 steps, or on every step but the last, with sigmoid gates: within a chunk the
    decays span more than fp16's range, and dS_0 comes from the tiny ones (dv's per-step scales keep them)."""
    T = 256 if case == "dy-late" else 60  # (last-token: dS_0 scales as the gates' product, representable in float32)
    xs, s0, w, ws = problem((1, T, 2, 128, 128), FP32, seed=19)
    t = torch.arange(T, device=w.device)
    w[:, (t % 64 < 48) if case == "dy-late" else (t < T - 1)] = 0
    check_grads(forced(sol, xs, s0, w, ws), reference_grads(xs, s0, w, ws), list(xs) + [s0])


@sm90
@pytest.mark.parametrize("layout", ["bhtd", "padded", "heads-broadcast"])
def test_strided_inputs(sol, layout):
    """q, k, v in (B, H, T, D) memory, with padded rows or q and k one head expanded; dy transposed, strided S_0 and
    dS_T, gate and beta slices."""
    xs, _, w, _ = problem((2, 100, 2, 128, 128), FP32, seed=9)
    xs = with_layout(xs, layout)
    xs[3] = torch.cat([xs[3], xs[3]], -1)[..., ::2]
    xs[4] = xs[4].transpose(1, 2).contiguous().transpose(1, 2)
    w = w.transpose(1, 2).contiguous().transpose(1, 2)
    s0, ws = strided_state(2, 2, 128, 128), strided_state(2, 2, 128, 128)
    check_grads(forced(sol, xs, s0, w, ws), reference_grads(xs, s0, w, ws), list(xs) + [s0])


@sm90
def test_finite_inputs_take_the_fast_path(sol):
    """With finite values the fallback exits at once: the gradients are the passes' own, not chunk_bwd's (they
    differ in their last bits)."""
    xs, s0, w, ws = problem((1, 130, 2, 128, 128), FP32, seed=23)
    ours, portable = forced(sol, xs, s0, w, ws), forced(sol, xs, s0, w, ws, kernel="chunk_bwd")
    assert any(not torch.equal(a, b) for a, b in zip(ours[:5], portable[:5]))


@sm90
def test_empty_sequence(sol):
    """T = 0: no launch; dS_0 = dS_T."""
    xs, s0, w, ws = problem((1, 0, 2, 128, 128), FP32, seed=1)
    got = forced(sol, xs, s0, w, ws)
    assert all(g.numel() == 0 for g in got[:5]) and torch.equal(got[5], ws)


@sm90
@pytest.mark.parametrize("case", list(NONFINITE))
def test_nonfinite_input(sol, case):
    """test_backward_sm90's cases: each gradient is NaN (a NaN input) or non-finite (an inf input) exactly where
    float64 autograd through the loop is, and within float32's bar on the finite elements: the kernels flag the
    value and chunk_bwd recomputes."""
    which, at, value = NONFINITE[case]
    xs, s0, w, ws = problem((2, 100, 2, 128, 128), FP32, seed=5)
    (xs + [w])[which][at] = value
    check_nonfinite(forced(sol, xs, s0, w, ws), xs, s0, w, ws, case.endswith("nan"), FP32_TOL)


# ---- checkpoints: written by the forward, or recomputed
def writing_shape(T=130):
    """B H just above the SMs / 2 and B H T >= 8192: chunk_sm90's TF32 forward plans one segment a (b, h) and writes
    the checkpoints; the backward is chunk_bwd_sm90_fp32."""
    return (2, T, sms() // 2 + 1, 128, 128)


@sm90
@pytest.mark.parametrize("initial", [True, False], ids=["s0", "zero"])
@pytest.mark.parametrize("T", [130, 63], ids=["T130", "T63"])
def test_forward_writes_float32_rows(sol, T, initial):
    """Rows of kCk32 floats: S before steps 0, 64, 128 as [dk][dv] (chunk 0 is S_0 exactly), then the 8 forward warps'
    max |S| over their 16 columns each; y as without them."""
    shape = writing_shape(T)
    assert sol.plan(*shape, dtype="float32").startswith("chunk_sm90 ")
    assert sol.plan_backward(*shape, dtype="float32").startswith(KERNEL + " ")
    xs, s0, _, _ = problem(shape, FP32, seed=21, initial=initial)
    poison_allocator()
    y, ck = forward_ex(sol, xs, s0)
    B, T, H = shape[:3]
    assert ck.dtype == FP32 and ck.shape == (B * H, -(-T // 64), CK32) and ck.is_contiguous()
    S = ck[..., :128 * 128].unflatten(-1, (128, 128))
    want = chunk_states(xs, s0)
    assert torch.equal(S[:, 0], want[:, 0].float())
    for c in range(1, S.shape[1]):
        err = rel_l2(S[:, c].double(), want[:, c])
        assert err <= 1e-5, f"chunk {c}: rel-L2 {err:.3e}"
    slots = S.abs().unflatten(-1, (8, 16)).amax(dim=(-3, -1))  # (B H, chunks, 8): columns 16 w .. 16 w + 15
    assert torch.equal(ck[..., 128 * 128:], slots)
    assert torch.equal(y, forward_ex(sol, xs, s0, want_ckpt=False)[0])


@sm90
def test_autograd_with_and_without_forward_checkpoints(sol, monkeypatch):
    """Autograd's gradients (the forward's checkpoints) equal bitwise those recomputed by the backward's own TF32
    forward (solution.FORWARD_CHECKPOINTS off), and both meet float64."""
    shape = writing_shape()
    xs, s0, w, ws = problem(shape, FP32, seed=31)
    want = reference_grads(xs, s0, w, ws)
    on = kernel_grads(sol, xs, s0, w, ws)
    check_grads(on, want, list(xs) + [s0])
    monkeypatch.setattr(sol, "FORWARD_CHECKPOINTS", False)
    off = kernel_grads(sol, xs, s0, w, ws)
    for name, a, b in zip(NAMES, on, off):
        assert torch.equal(a, b), name


@sm90
def test_planned_through_autograd(sol):
    """B H = half the SMs (66 on an H200) and B H T below chunk_sm90's threshold: the forward is another kernel, so
    the backward recomputes its checkpoints; gradients at float32's bar."""
    shape = (2, 70, -(-sms() // 4), 128, 128)
    assert sol.plan_backward(*shape, dtype="float32").startswith(KERNEL + " ")
    assert not sol.plan(*shape, dtype="float32").startswith("chunk_sm90 ")
    xs, s0, w, ws = problem(shape, FP32, seed=17)
    check_grads(kernel_grads(sol, xs, s0, w, ws), reference_grads(xs, s0, w, ws), list(xs) + [s0])
    assert {"backward_sm90_fp32", "chunk_sm90", "backward"} <= set(sol.built_units())


@sm90
def test_launches(sol):
    """The hook's backward: the TF32 forward (checkpoints), both kernels and chunk_bwd (the fallback, exiting)."""
    xs, s0, w, ws = problem((1, 130, 2, 128, 128), FP32, seed=2)
    names = " ".join(kernels_of(lambda: sol._backward_with(w, ws, *xs, s0, kernel=KERNEL)))
    for k in ("chunk_sm90_kernel", "chunk_bwd_sm90_fp32_kernel", "chunk_bwd_sm90_fp32_dv_kernel", "chunk_bwd_kernel"):
        assert k in names, (k, names)


# ---- the plan
@plan_only
@pytest.mark.parametrize("shape", PLAN_SHAPES, ids=shape_id)
def test_plan_takes_it_for_float32_d128_from_half_the_sms(sol, shape):
    text = sol.plan_backward(*shape, dtype="float32")
    assert text.startswith(KERNEL + " (BACKWARD_SM90_FP32_SRC, unit backward_sm90_fp32)"), text
    lines = text.split("\n")
    assert lines[1] == f"dq: in {KERNEL}", text
    assert lines[2].startswith("checkpoints: chunk_sm90 (CHUNK_SM90_TF32_SRC, unit chunk_sm90)") and \
        " segments=1 " in lines[2], text
    assert lines[3].startswith("non-finite values: chunk_bwd (BACKWARD_SRC, unit backward)") and \
        " segments=1 " in lines[3], text


# ---- 32-bit row offsets (the plan's Layout::off32)
@plan_only
@pytest.mark.parametrize("B,want", [(64, KERNEL), (66, "chunk_bwd")])
def test_plan_needs_offsets_below_2_31(sol, B, want):
    """(64, 8192, 32, 128) holds 2^31 elements (its last offset 2^31 - 1); two batches more pass it: chunk_bwd."""
    text = sol.plan_backward(B, 8192, 32, 128, 128, dtype="float32")
    assert text.startswith(want + " ("), text


@sm90
def test_offsets_past_2_31(sol):
    """q's second batch 2^31 elements into its storage (8 GiB): forced, the kernel names the offset; planned (B H
    above half the SMs), chunk_bwd's gradients, right."""
    shape = (2, 64, 33, 128, 128)
    xs, s0, w, ws = problem(shape, FP32, seed=3)
    far = xs[0].new_empty(2 ** 31 + 64 * 33 * 128).as_strided(xs[0].shape, (2 ** 31, 33 * 128, 128, 1))
    far.copy_(xs[0])
    xs = [far] + list(xs[1:])
    with pytest.raises(ValueError, match="an offset at or above 2\\^31"):
        forced(sol, xs, s0, w, ws)
    check_grads(forced(sol, xs, s0, w, ws, kernel=None), reference_grads(xs, s0, w, ws), list(xs) + [s0])


@sm90
def test_forced_refusal_of_misaligned_rows(sol):
    xs, s0, w, ws = problem((1, 64, 1, 128, 128), FP32, seed=1)
    flat = torch.cat([w.new_zeros(1), w.flatten()])
    w = flat[1:].view(w.shape)  # dy's rows 4 bytes off a 16-byte boundary
    with pytest.raises(ValueError, match=KERNEL + " needs float32, dy's rows 16-byte aligned"):
        sol._backward_with(w, ws, *xs, s0, kernel=KERNEL)
