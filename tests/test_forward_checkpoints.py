"""chunk_bwd_sm90's checkpoints written by the forward: an eager autograd call whose plans are chunk_sm90 (bfloat16,
D_k = D_v = 128, one segment a (b, h)) and chunk_bwd_sm90 saves the state at every 64-step chunk start (float16
scaled a 16-column block, or float32 beside a float32 gate, as the backward reads them), and the backward skips its checkpoint kernel. GPU
(compute capability 9.0): the checkpoints against the float64 loop's states, autograd's gradients (forward
checkpoints) and the _backward_with hook's (the checkpoint kernel) against float64, the kernels each side launches,
what autograd saves, a second backward through the same graph, the checkpoint argument's checks, and no checkpoint
where no gradient is formed or the plan writes none. CPU: the pybind arguments (the registered operators' schemas
keep theirs)."""
import pytest
import torch

from helpers import poison_allocator, rel_l2, rounding_floor
from test_backward import NAMES, check_grads, check_nonfinite, kernel_grads, problem, reference_grads
from test_backward_sm90 import BF16, HOPPER, KERNEL, sm90

CKPT_KERNEL = "chunk_bwd_sm90_ckpt_kernel"
STATE_TOL = 1e-4  # rel-L2 of a float32 checkpoint against float64: fp32 state, fp32 operands as bf16 hi + lo
CK16 = 128 * 128 + 16  # a 16-bit checkpoint's row: S 2^s (float16 [dk][dv]), then 8 float32 2^-s (a 16-column block)
FP16 = torch.float16


def state_tol(exact, dtype):
    """A float32 checkpoint: STATE_TOL; a float16 one: twice the float64 state's own float16 rounding."""
    return STATE_TOL if dtype == torch.float32 else 2 * rounding_floor(exact, dtype) + 1e-6


def ck_shape(BH, T, dtype):
    return (BH, -(-T // 64), CK16) if dtype == FP16 else (BH, -(-T // 64), 128, 128)


def decoded(ck):
    """The states (B H, chunks, 128, 128) a checkpoint tensor holds, float32 (a float16 one times its 2^-s)."""
    if ck.dtype != FP16:
        return ck
    S = ck[..., :128 * 128].float().unflatten(-1, (128, 128))
    inv = ck[..., 128 * 128:].contiguous().view(torch.float32)  # (B H, chunks, 8)
    return S * inv.repeat_interleave(16, -1)[..., None, :]


def scaled_f16(S):
    """S (..., 128, 128) as the kernels round it: a 16-column block times 2^(140 - e) (e: the biased exponent of its
    largest finite |S|, at least 15) to float16, and back."""
    blocks = S.float().unflatten(-1, (8, 16))
    a = blocks.abs().where(blocks.abs().isfinite(), torch.zeros((), device=S.device))
    e = (torch.frexp(a.amax(dim=(-3, -1), keepdim=True)).exponent + 126).clamp_min(15)
    scale = torch.exp2((140 - e).float())
    return ((blocks * scale).half().float() / scale).flatten(-2)


def qualifying_shape(T=200):
    """(B, T, H, 128, 128) with B H >= the SMs: chunk_sm90 plans one segment a (b, h), the backward chunk_bwd_sm90."""
    sms = torch.cuda.get_device_properties(0).multi_processor_count if HOPPER else 132
    return (2, T, -(-sms // 2), 128, 128)


def assert_qualifies(sol, shape):
    fwd, bwd = sol.plan(*shape, dtype="bfloat16"), sol.plan_backward(*shape, dtype="bfloat16")
    assert fwd.startswith("chunk_sm90 ") and " segments=1 " in fwd, fwd
    assert bwd.startswith(KERNEL + " "), bwd


def forward_ex(sol, xs, s0, want_final=False, kernel="", config=(), want_ckpt=True):
    """The pybind forward as _EagerGrad calls it: [y, (S_T,) checkpoints or an empty tensor]."""
    return sol._call(sol._core.forward_ex, *xs, s0, want_final, kernel, list(config), False, want_ckpt)


def chunk_states(xs, s0):
    """S at steps 0, 64, 128, .. (before each chunk) by the float64 loop on the GPU: (B H, chunks, D_k, D_v)."""
    q, k, v, g, b = (x.double() for x in xs)
    B, T, H, Dk = q.shape
    S = torch.zeros(B, H, Dk, v.shape[-1], dtype=torch.float64, device=q.device) if s0 is None else s0.double()
    out = []
    for t in range(T):
        if t % 64 == 0:
            out.append(S)
        S = g[:, t, :, None, None] * S + b[:, t, :, None, None] * k[:, t, :, :, None] * v[:, t, :, None, :]
    return torch.stack(out, 2).flatten(0, 1)


def kernels_of(fn):
    """The names of the CUDA kernels fn launches (torch.profiler)."""
    from torch.profiler import ProfilerActivity, profile
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    names = [ev.key for ev in prof.key_averages() if ev.device_type.name == "CUDA"]
    if not names:
        pytest.skip("the profiler recorded no CUDA kernel here")
    return names


def saved_by_autograd(sol, xs, s0, grad=True):
    """The tensors autograd saves for a gated_recurrence call (saved-tensor hooks), its output and its leaves
    (the inputs, requiring grad where grad says so)."""
    leaves = [x.detach().requires_grad_(grad) for x in xs + ([s0] if s0 is not None else [])]
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        y = sol.gated_recurrence(*leaves[:5], initial_state=leaves[5] if s0 is not None else None)
    return saved, y, leaves


# ---- what the forward writes
@sm90
@pytest.mark.parametrize("gate", ["bf16", "fp32"])
@pytest.mark.parametrize("initial", [True, False], ids=["s0", "zero"])
@pytest.mark.parametrize("T", [200, 63], ids=["T200", "T63"])
def test_checkpoints_are_the_chunk_start_states(sol, T, initial, gate):
    """S before steps 0, 64, 128, 192 in the checkpoint kernel's layout ([dk][dv]; float16 scaled a 16-column block,
    or float32 beside a float32 gate, as the backward's plan reads them); chunk 0 is S_0 (or zero) as rounded to that
    format; y as without checkpoints. T = 63: one partial chunk, its checkpoint S_0 alone."""
    shape = qualifying_shape(T)
    assert_qualifies(sol, shape)
    xs, s0, _, _ = problem(shape, BF16, seed=21, initial=initial)
    if gate == "fp32":
        xs[3] = xs[3].float()
    dtype = torch.float32 if gate == "fp32" else FP16
    poison_allocator()
    y, ck = forward_ex(sol, xs, s0)
    B, T, H = shape[:3]
    assert ck.dtype == dtype and ck.shape == ck_shape(B * H, T, dtype) and ck.is_contiguous()
    want, got = chunk_states(xs, s0), decoded(ck)
    assert torch.equal(got[:, 0], want[:, 0].float() if dtype == torch.float32 else scaled_f16(want[:, 0]))
    for c in range(1, ck.shape[1]):
        err = rel_l2(got[:, c].double(), want[:, c])
        assert err <= state_tol(want[:, c], dtype), f"chunk {c}: rel-L2 {err:.3e}"
    assert torch.equal(y, forward_ex(sol, xs, s0, want_ckpt=False)[0])


# case: (shape, kernel, config, float32 gates and betas, the checkpoints' dtype or None)
CASES = {"planned": (qualifying_shape, "", (), False, FP16),
         "float32-gates": (qualifying_shape, "", (), True, torch.float32),
         # B H = half the SMs: two forward segments, the backward still chunk_bwd_sm90
         "segments": (lambda: (2, 200, torch.cuda.get_device_properties(0).multi_processor_count // 4, 128, 128),
                      "", (), False, None),
         "few-heads": (lambda: (1, 4096, 2, 128, 128), "", (), False, None),
         "chosen-kernel": (qualifying_shape, "chunk_sm90", (1,), False, None),
         "dk64": (lambda: (2, 256) + qualifying_shape()[2:3] + (64, 128), "", (), False, None)}  # (chunk_sm90's D_k 64)


@sm90
@pytest.mark.parametrize("case", list(CASES))
def test_which_plans_write_them(sol, case):
    """Written by a planned forward with one segment whose backward is chunk_bwd_sm90 (float16 rows; float32 beside
    float32 gates); not with segments (a later segment's start state is unknown while it runs), few heads
    (chunk_bwd's segments), a chosen kernel or configuration, or D_k = 64: an empty tensor in their place."""
    make, kernel, config, gates32, dtype = CASES[case]
    shape = make()
    if case == "segments":
        text = sol.plan(*shape, dtype="bfloat16")
        if " segments=1 " in text or not sol.plan_backward(*shape, dtype="bfloat16").startswith(KERNEL + " "):
            pytest.skip("this SM count has no B H with two forward segments and chunk_bwd_sm90")
    xs, s0, _, _ = problem(shape, BF16, seed=22)
    if gates32:
        xs[3], xs[4] = xs[3].float(), xs[4].float()
    out = forward_ex(sol, xs, s0, kernel=kernel, config=config)
    assert len(out) == 2 and out[1].dtype == (dtype or torch.float32)
    B, T, H = shape[:3]
    assert out[1].shape == (ck_shape(B * H, T, dtype) if dtype else (0,)), tuple(out[1].shape)


@sm90
def test_no_checkpoints_without_a_gradient(sol):
    """Without want_ckpt the outputs are forward_ex's own ([y] or [y, S_T]); gated_recurrence without an input that
    requires grad allocates no checkpoint (its peak memory stays below their size)."""
    shape = qualifying_shape()
    xs, s0, _, _ = problem(shape, BF16, seed=23)
    assert len(forward_ex(sol, xs, s0, want_ckpt=False)) == 1
    assert len(forward_ex(sol, xs, s0, want_final=True, want_ckpt=False)) == 2
    assert len(forward_ex(sol, xs, s0, want_final=True)) == 3
    B, T, H = shape[:3]
    ckpt_bytes = B * H * -(-T // 64) * 128 * 128 * 2
    sol.gated_recurrence(*xs, initial_state=s0)  # (units built, allocator warm)
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    y = sol.gated_recurrence(*xs, initial_state=s0)
    torch.cuda.synchronize()
    assert torch.cuda.max_memory_allocated() - base < ckpt_bytes, "more than y was allocated"
    saved, y, _ = saved_by_autograd(sol, xs, s0, grad=False)
    assert y.grad_fn is None and saved == []


# ---- autograd with them
@sm90
@pytest.mark.parametrize("case", ["both", "none", "fp32-gate"])
def test_gradients_match_float64(sol, case):
    """Autograd through gated_recurrence (the forward's checkpoints) and the _backward_with hook (the checkpoint
    kernel) both at the bf16 floor against float64 (a float32 gate's gradient at float32's, from float32
    checkpoints); initial state and S_T in the loss, or neither."""
    shape = qualifying_shape(T=130)
    assert_qualifies(sol, shape)
    states = case != "none"
    xs, s0, w, ws = problem(shape, BF16, seed=24, initial=states, final=states)
    if case == "fp32-gate":
        xs[3] = xs[3].float()
    want = reference_grads(xs, s0, w, ws)
    check_grads(kernel_grads(sol, xs, s0, w, ws), want, list(xs) + [s0])
    poison_allocator()
    hook = list(sol._backward_with(w, ws, *xs, s0))
    check_grads(hook, want, list(xs) + [s0])


@sm90
def test_autograd_saves_them_and_the_backward_skips_its_checkpoint_kernel(sol):
    """autograd saves the (B H, chunks, 128 * 128 + 16) float16 checkpoints beside the inputs; its backward launches
    chunk_bwd_sm90 alone, the _backward_with hook the checkpoint kernel first."""
    shape = qualifying_shape()
    assert_qualifies(sol, shape)
    xs, s0, w, _ = problem(shape, BF16, seed=25)
    saved, y, leaves = saved_by_autograd(sol, xs, s0)
    B, T, H = shape[:3]
    ckpts = [t for t in saved if t.shape == ck_shape(B * H, T, FP16)]
    assert len(ckpts) == 1 and ckpts[0].dtype == FP16, [tuple(t.shape) for t in saved]
    names = kernels_of(lambda: torch.autograd.grad(y, leaves, w))
    assert any(KERNEL + "_kernel" in n for n in names), names
    assert not any(CKPT_KERNEL in n for n in names), names
    hook = kernels_of(lambda: sol._backward_with(w, None, *xs, s0))
    assert any(CKPT_KERNEL in n for n in hook), hook


@sm90
def test_second_backward_through_the_same_graph(sol):
    """retain_graph: the saved checkpoints are only read, so a second backward gives the same gradients."""
    shape = qualifying_shape(T=130)
    xs, s0, w, _ = problem(shape, BF16, seed=26)
    leaves = [x.detach().requires_grad_() for x in xs] + [s0.detach().requires_grad_()]
    y = sol.gated_recurrence(*leaves[:5], initial_state=leaves[5])
    first = torch.autograd.grad(y, leaves, w, retain_graph=True)
    second = torch.autograd.grad(y, leaves, w)
    for name, a, b in zip(NAMES, first, second):
        assert torch.equal(a, b), name


@sm90
def test_wrong_checkpoints_are_refused(sol):
    """A checkpoint tensor the backward would read but of another shape or dtype: ValueError naming it."""
    shape = qualifying_shape(T=130)
    xs, s0, w, _ = problem(shape, BF16, seed=27)
    _, ck = forward_ex(sol, xs, s0)
    misaligned = torch.empty(ck.numel() + 1, dtype=ck.dtype, device=ck.device)[1:].view(ck.shape)
    strided = ck.transpose(0, 1).contiguous().transpose(0, 1)
    for bad in (ck[:, :2].contiguous(), ck.float(), ck.bfloat16(), ck.unsqueeze(2), strided, misaligned):
        with pytest.raises(ValueError, match=r"\bckpt\b"):
            sol._call(sol._core.backward, w, None, *xs, s0, "", 0, bad)
    got = sol._call(sol._core.backward, w, None, *xs, s0, "", 0, ck)
    want = sol._backward_with(w, None, *xs, s0)
    for name, a, b in zip(NAMES, got, want):
        assert rel_l2(a.double(), b.double()) <= 1e-2, name


# One NaN or inf at one step of an input (index 5: dy), through autograd with the forward's checkpoints.
NONFINITE = {"v-nan": (2, (0, 70, 1, 3), float("nan")), "q-inf": (0, (1, 20, 0, 5), float("inf")),
             "gate-nan": (3, (0, 100, 2), float("nan")), "dy-nan": (5, (1, 90, 3, 7), float("nan"))}


@sm90
@pytest.mark.parametrize("case", list(NONFINITE))
def test_nonfinite_input(sol, case):
    """Each gradient non-finite (NaN for a NaN input) exactly where float64 autograd through the loop is, with the
    checkpoints from the forward (a NaN or inf reaches them through S)."""
    which, at, value = NONFINITE[case]
    shape = qualifying_shape(T=130)
    assert_qualifies(sol, shape)
    xs, s0, w, ws = problem(shape, BF16, seed=28)
    (xs + [w])[which][at] = value
    got = kernel_grads(sol, xs, s0, w, ws)
    check_nonfinite(got, xs, s0, w, ws, case.endswith("nan"))


@sm90
def test_turned_off(sol, monkeypatch):
    """FORWARD_CHECKPOINTS = False: autograd saves the inputs alone, and its backward runs the checkpoint kernel."""
    monkeypatch.setattr(sol, "FORWARD_CHECKPOINTS", False)
    shape = qualifying_shape(T=130)
    xs, s0, w, _ = problem(shape, BF16, seed=29)
    saved, y, leaves = saved_by_autograd(sol, xs, s0)
    B, T, H = shape[:3]
    assert not any(t.shape == ck_shape(B * H, T, FP16) for t in saved), [tuple(t.shape) for t in saved]
    names = kernels_of(lambda: torch.autograd.grad(y, leaves, w))
    assert any(CKPT_KERNEL in n for n in names), names


# ---- CPU: the arguments
def test_pybind_arguments(sol):
    """forward_ex takes want_ckpt and backward ckpt, both optional; the registered forward_ex keeps its schema."""
    assert "want_ckpt: bool = False" in sol._core.forward_ex.__doc__
    assert "ckpt: object = None" in sol._core.backward.__doc__
    schema = str(getattr(torch.ops, sol._OPS_NS).forward_ex.default._schema)
    assert "want_ckpt" not in schema and schema.endswith("bool reference) -> Tensor[]"), schema
