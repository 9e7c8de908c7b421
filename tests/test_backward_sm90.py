"""chunk_bwd_sm90, the Hopper backward (bfloat16, D_k = D_v = 128, wgmma): GPU (compute capability 9.0), forced
through the _backward_with hook against float64 (T = 1, 63, 64, 100, 300; gate classes; long memory at T = 1024 and
4096 with gates of 1 and above 1; with and without both states; (B, H, T, D)-transposed and padded rows; float32
gates and betas; strided states; NaN and inf in each input; bitwise determinism) and planned through autograd; CPU or Hopper: what the plan sends to it and away from it, and
its refusal naming the argument."""
import pytest
import torch

from conftest import HAS_CUDA
from helpers import poison_allocator, shape_id, strided_state, with_layout
from test_backward import NAMES, check_grads, check_nonfinite, kernel_grads, problem, reference_grads

HOPPER = HAS_CUDA and torch.cuda.get_device_capability() == (9, 0)
sm90 = pytest.mark.skipif(not HOPPER, reason="needs compute capability 9.0 (wgmma)")
plan_only = pytest.mark.skipif(HAS_CUDA and not HOPPER, reason="a GPU other than compute capability 9.0")
KERNEL = "chunk_bwd_sm90"
BF16 = torch.bfloat16


def forced(sol, xs, s0, w, ws, kernel=KERNEL):
    """The six gradients by `kernel` (chunk_bwd_sm90) through the hook, on NaN-poisoned memory."""
    poison_allocator()
    return list(sol._backward_with(w, ws, *xs, s0, kernel=kernel))


def check_forced(sol, shape, dtype, seed, kernel=KERNEL, **kw):
    """`kernel` on problem(shape, dtype, seed, **kw) against float64."""
    xs, s0, w, ws = problem(shape, dtype, seed=seed, **kw)
    check_grads(forced(sol, xs, s0, w, ws, kernel), reference_grads(xs, s0, w, ws), list(xs) + [s0])


# ---- correctness against float64
# (B, T, H): one step, less than a chunk, one whole chunk, ragged chunks, several chunks
SHAPES = [(1, 1, 1), (2, 63, 1), (1, 64, 2), (1, 100, 3), (1, 300, 2)]


@sm90
@pytest.mark.parametrize("states", ["both", "none"])
@pytest.mark.parametrize("shape", SHAPES, ids=shape_id)
def test_gradients_match_float64(sol, shape, states):
    check_forced(sol, shape + (128, 128), BF16, sum(shape), initial=states == "both", final=states == "both")


GATES = {"zero": 0.0, "negative": (-1.0, 0.0), "above1": (1.0, 1.05), "near1": (1 - 1e-3, 1 + 1e-3),
         "mixed-sign": (-1.2, 1.2)}


@sm90
@pytest.mark.parametrize("gate", list(GATES))
def test_gate_classes(sol, gate):
    """Gates 0, negative, above 1, near 1, both signs: the tables are direct products (no quotient, no log)."""
    check_forced(sol, (1, 130, 2, 128, 128), BF16, 7, gate=GATES[gate])


# Long memory (B H = 2, forced): dgate's c0 = <G, S> cancels, and S's checkpoint rounding (bf16's 2^-9) took dgate to
# 2.7x its bar on the first draw (gates U(1, 1.02), T = 4096) and 0.93-0.96 on the others; fp16 scaled checkpoints
# (2^-12) hold all of them near 0.5-0.7. (T, gates, seed): draws from the thirty-ninth session's device check.
LONG = {"T4096-above1": (4096, (1.0, 1.02), 4196), "T4096-one": (4096, 1.0, 4296), "T1024-above1": (1024, (1.0, 1.05), 1124)}


@sm90
@pytest.mark.parametrize("case", list(LONG))
def test_long_memory(sol, case):
    T, gate, seed = LONG[case]
    check_forced(sol, (1, T, 2, 128, 128), BF16, seed, gate=gate)


@sm90
@pytest.mark.parametrize("layout", ["bhtd", "padded"])
def test_strided_inputs(sol, layout):
    """q, k, v in (B, H, T, D) memory or with padded rows, dy transposed too, a strided S_0 and dS_T."""
    xs, _, w, _ = problem((2, 100, 2, 128, 128), BF16, seed=9)
    xs = with_layout(xs, layout)
    w = w.transpose(1, 2).contiguous().transpose(1, 2)
    s0, ws = strided_state(2, 2, 128, 128), strided_state(2, 2, 128, 128)
    check_grads(forced(sol, xs, s0, w, ws), reference_grads(xs, s0, w, ws), list(xs) + [s0])


@sm90
@pytest.mark.parametrize("wide", ["both", "gate", "beta"])
def test_float32_gates_and_betas(sol, wide):
    """Gates and / or betas kept in float32 beside bfloat16 q, k, v: read and differentiated in float32. A float32
    gate keeps float32 checkpoints (dgate held to float32's bar), a bfloat16 gate beside a float32 beta 16-bit ones."""
    xs, s0, w, ws = problem((1, 100, 2, 128, 128), BF16, seed=13)
    gen = torch.Generator().manual_seed(13)
    if wide in ("both", "gate"):
        xs[3] = torch.rand(1, 100, 2, generator=gen).cuda()
    if wide in ("both", "beta"):
        xs[4] = torch.rand(1, 100, 2, generator=gen).cuda()
    got = forced(sol, xs, s0, w, ws)
    assert got[3].dtype == xs[3].dtype and got[4].dtype == xs[4].dtype
    check_grads(got, reference_grads(xs, s0, w, ws), list(xs) + [s0])


@sm90
@pytest.mark.parametrize("kernel,dtype", [(KERNEL, BF16), (KERNEL + "_fp32", torch.float32)], ids=["bf16", "fp32"])
def test_deterministic(sol, kernel, dtype):
    xs, s0, w, ws = problem((1, 200, 2, 128, 128), dtype, seed=3)
    first, second = forced(sol, xs, s0, w, ws, kernel), forced(sol, xs, s0, w, ws, kernel)
    for name, a, b in zip(NAMES, first, second):
        assert torch.equal(a, b), name


# One NaN or inf at one step of each input and of dy (index 5).
NONFINITE = {"q-nan": (0, (0, 33, 1, 2), float("nan")), "q-inf": (0, (1, 20, 0, 5), float("inf")),
             "k-inf": (1, (1, 40, 0, 3), float("inf")), "v-nan": (2, (0, 41, 1, 3), float("nan")),
             "gate-nan": (3, (0, 50, 1), float("nan")), "beta-nan": (4, (1, 70, 0), float("nan")),
             "dy-nan": (5, (0, 90, 1, 7), float("nan"))}


@sm90
@pytest.mark.parametrize("case", list(NONFINITE))
def test_nonfinite_input(sol, case):
    """Each gradient is NaN (a NaN input) or non-finite (an inf input) exactly where float64 autograd through the
    loop is: the flagged chunk forms its masked sums by FMAs, where a product would meet the masks' zeros."""
    which, at, value = NONFINITE[case]
    xs, s0, w, ws = problem((2, 100, 2, 128, 128), BF16, seed=5)
    (xs + [w])[which][at] = value
    got = forced(sol, xs, s0, w, ws)
    check_nonfinite(got, xs, s0, w, ws, case.endswith("nan"))


@sm90
def test_planned_through_autograd(sol):
    """B H = half the SMs (66 on an H200): the plan takes it; autograd's gradients at the bf16 floor."""
    shape = (2, 70, -(-torch.cuda.get_device_properties(0).multi_processor_count // 4), 128, 128)
    assert sol.plan_backward(*shape, dtype="bfloat16").startswith(KERNEL + " ")
    xs, s0, w, ws = problem(shape, BF16, seed=17)
    check_grads(kernel_grads(sol, xs, s0, w, ws), reference_grads(xs, s0, w, ws), list(xs) + [s0])
    assert "backward_sm90" in sol.built_units()


# ---- the plan
# B H from half the SMs (132 on an H200) up, at D = 128: the Hopper backwards' shapes
PLAN_SHAPES = [(8, 2048, 16, 128, 128), (16, 4096, 32, 128, 128), (2, 64, 33, 128, 128)]


@plan_only
@pytest.mark.parametrize("shape", PLAN_SHAPES, ids=shape_id)
def test_plan_takes_it_for_bfloat16_d128_from_half_the_sms(sol, shape):
    text = sol.plan_backward(*shape, dtype="bfloat16")
    assert text.startswith(KERNEL + " (BACKWARD_SM90_SRC, unit backward_sm90)"), text
    assert f"dq: in {KERNEL}" in text and "workspace=" in text, text
    B, T, H = shape[:3]
    assert f"workspace={B * H * -(-T // 64) * (128 * 128 + 16) * 2}B (fp16 scaled)" in text, text  # 16-bit checkpoints


@plan_only
@pytest.mark.parametrize("shape,dtype", [((2, 2048, 4, 128, 128), "bfloat16"), ((2, 2048, 4, 128, 128), "float32"),
                                         ((8, 2048, 16, 128, 128), "float16"), ((8, 2048, 16, 64, 128), "bfloat16"),
                                         ((8, 2048, 16, 64, 128), "float32"), ((8, 2048, 16, 128, 64), "float32")],
                         ids=["few-heads", "fp32-few-heads", "fp16", "dk64", "fp32-dk64", "fp32-dv64"])
def test_plan_keeps_chunk_bwd_elsewhere(sol, shape, dtype):
    """Small B H (no segments yet), other dtypes and head sizes: chunk_bwd (float32 at D = 128 and many heads:
    chunk_bwd_sm90_fp32, tests/test_backward_sm90_fp32.py)."""
    assert sol.plan_backward(*shape, dtype=dtype).startswith("chunk_bwd "), shape


@plan_only
@pytest.mark.parametrize("kernel,dtype", [(KERNEL, "bfloat16"), (KERNEL + "_fp32", "float32")], ids=["bf16", "fp32"])
def test_forced_on_few_heads(sol, kernel, dtype):
    assert sol.plan_backward(1, 100, 1, 128, 128, dtype=dtype, kernel=kernel).startswith(kernel + " ")


REFUSED = {"fp32": (KERNEL, (1, 100, 1, 128, 128), "float32", "needs compute capability 9.0, bfloat16, D_k = D_v = 128"),
           "dk64": (KERNEL, (1, 100, 1, 64, 128), "bfloat16", "needs compute capability 9.0, bfloat16, D_k = D_v = 128"),
           "fp32-on-bf16": (KERNEL + "_fp32", (1, 100, 1, 128, 128), "bfloat16", "needs float32"),
           "fp32-dk64": (KERNEL + "_fp32", (1, 100, 1, 64, 128), "float32", "needs float32")}


@pytest.mark.parametrize("case", list(REFUSED))
def test_forced_refusal_names_the_kernel(sol, case):
    kernel, shape, dtype, message = REFUSED[case]
    with pytest.raises(ValueError, match=f"{kernel} {message}"):
        sol.plan_backward(*shape, dtype=dtype, kernel=kernel)


def test_units_and_kernels_are_named(sol):
    assert {"backward_sm90", "backward_sm90_fp32"} <= set(sol.UNITS)
    assert {KERNEL, KERNEL + "_fp32", KERNEL + "_fp32_dv"} <= set(sol.KERNELS)


@sm90
def test_forced_refusal_of_misaligned_rows(sol):
    xs, s0, w, ws = problem((1, 64, 1, 128, 128), BF16, seed=1)
    flat = torch.cat([xs[0].new_zeros(1), xs[0].flatten()])
    xs[0] = flat[1:].view(xs[0].shape)  # rows 2 bytes off a 16-byte boundary
    with pytest.raises(ValueError, match="rows of q, k, v and dy 16-byte aligned"):
        sol._backward_with(w, ws, *xs, s0, kernel=KERNEL)
