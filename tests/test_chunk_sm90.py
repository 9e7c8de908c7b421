"""GPU (compute capability 9.0): chunk_sm90, the Hopper chunk kernel on wgmma (state in accumulators, chunks of
64), for bfloat16 inputs (its float32 instantiation on TF32 wgmma is test_chunk_sm90_tf32's): both bf16
instantiations (D_k 64, 128) with one and several segments, ragged last chunks and states, gate classes within
1.1x of the exact answer's own bf16 rounding, NaN and inf, float32 gates, a CUDA graph, and what the plan sends
to it and away from it."""
import pytest
import torch

from conftest import HAS_CUDA
from helpers import (GATE_IDS, GATES, SEGMENTS, bf16_floor, check, check_chained, check_graph, check_nonfinite,
                     check_states, inputs, misaligned, ref64, rel_l2, run, shape_id, strided_state, v_with,
                     with_beta_zero_negative_large, with_layout, with_nan)

HOPPER = HAS_CUDA and torch.cuda.get_device_capability() == (9, 0)
sm90 = pytest.mark.skipif(not HOPPER, reason="needs compute capability 9.0 (wgmma)")
# The plan and its refusals: on an H200, or on the CPU against plan()'s H200 stand-in.
plan_only = pytest.mark.skipif(HAS_CUDA and not HOPPER, reason="a GPU other than compute capability 9.0")
DEV = "cuda" if HAS_CUDA else "cpu"

KERNEL = "chunk_sm90"
BF16 = torch.bfloat16
# (B, T, H, D_k, D_v): one step, less than a chunk, ragged chunks, whole chunks; both compiled D_k.
SHAPES = [(1, 1, 1, 128, 128), (2, 33, 1, 64, 128), (2, 64, 2, 128, 128), (3, 130, 2, 64, 128),
          (1, 300, 3, 128, 128), (1, 1000, 1, 128, 128)]


def near_floor(sol, xs, config=(), factor=1.1):
    """Near the float64 loop (check's TOL) and within `factor` of its own bf16 rounding."""
    exact = ref64(xs)
    y = check(sol, xs, kernel=KERNEL, config=config, ref=exact)
    assert rel_l2(y, exact) <= factor * bf16_floor(exact) + 1e-6, f"{rel_l2(y, exact):.3e} vs {bf16_floor(exact):.3e}"
    return y


@sm90
@pytest.mark.parametrize("shape", SHAPES, ids=shape_id)
def test_shapes(sol, shape):
    near_floor(sol, inputs(*shape, dtype=BF16))


@sm90
@pytest.mark.parametrize("states", [False, True], ids=["no-state", "states"])
@pytest.mark.parametrize("segments", SEGMENTS, ids=lambda n: f"seg{n}")
@pytest.mark.parametrize("dk", [64, 128])
def test_segments(sol, dk, segments, states):
    xs = inputs(2, 700, 2, dk, 128, dtype=BF16)
    if states:
        check_states(sol, xs, strided_state(2, 2, dk, 128), KERNEL, (segments,))
    else:
        near_floor(sol, xs, (segments,))


@sm90
@pytest.mark.parametrize("gate", GATES, ids=GATE_IDS)
@pytest.mark.parametrize("dk", [64, 128])
def test_gate_values_near_bf16_rounding(sol, dk, gate):
    near_floor(sol, inputs(1, 300, 2, dk, 128, gate=gate, dtype=BF16), (3,))


@sm90
def test_beta_zero_negative_large(sol):
    near_floor(sol, with_beta_zero_negative_large(inputs(1, 300, 2, 128, 128, dtype=BF16)))


@sm90
@pytest.mark.parametrize("where", ["q", "k", "v", "gate", "beta"])
def test_nan_where_the_loop_has_nan(sol, where):
    check_nonfinite(sol, with_nan(inputs(2, 100, 3, 64, 128, dtype=BF16), where), KERNEL, (2,))


@sm90
@pytest.mark.parametrize("value", [float("nan"), float("inf")], ids=["nan", "inf"])
def test_nonfinite_v_stays_in_its_column_and_future(sol, value):
    """A NaN or inf v_s at s > t never reaches y_t (those chunks add P' V in FMAs over s <= t)."""
    check_nonfinite(sol, v_with(value, BF16, shape=(1, 300, 2, 128, 128)), KERNEL, same=torch.isfinite)


@sm90
def test_nonfinite_v_in_the_ragged_last_chunk(sol):
    xs = inputs(1, 300, 2, 128, 128, dtype=BF16, gate=(0.5, 1.0))
    xs[2][0, 290, 1, 3] = float("inf")
    check_nonfinite(sol, xs, KERNEL, same=torch.isfinite)


@sm90
@pytest.mark.parametrize("split", [64, 100])
def test_chained_calls_equal_one(sol, split):
    """x[:, :split] then x[:, split:] from its final state gives the one-call y and final state."""
    check_chained(sol, inputs(1, 300, 2, 128, 128, dtype=BF16), KERNEL, split)


@sm90
def test_float32_gates_beside_bfloat16(sol):
    xs = inputs(2, 300, 2, 128, 128, dtype=BF16)
    xs[3:] = [x.float().uniform_(0.8, 1.0) if i == 0 else x.float() for i, x in enumerate(xs[3:])]
    near_floor(sol, xs)


@sm90
def test_graph_capture(sol):
    check_graph(sol, (1, 300, 2, 128, 128), BF16, states=True, kernel=KERNEL)


@plan_only
@pytest.mark.parametrize("shape", [(8, 2048, 16, 128, 128), (1, 8192, 8, 128, 128), (4, 1024, 8, 64, 128),
                                   (1, 8192, 1, 128, 128), (8, 64, 16, 128, 128), (1, 8191, 1, 128, 128),
                                   (2, 300, 3, 128, 128)], ids=shape_id)
def test_plan_takes_it_for_bfloat16_on_hopper_from_8192(sol, shape):
    """From B*H*T = 8192 on (below, with one-chunk segments, chunk_bf16 measured faster)."""
    B, T, H, Dk, Dv = shape
    text = sol.plan(B, T, H, Dk, Dv, BF16)
    want = "chunk_sm90 (CHUNK_SM90_SRC, unit chunk_sm90) C=64" if B * H * T >= 8192 else "chunk_bf16 "
    assert text.startswith(want), text
    if B * H * T >= 8192:  # three warpgroups a block, TMA loads
        assert " loads=TMA " in text and "x384 smem=" in text, text


@sm90
def test_planned_call_is_chunk_sm90(sol):
    xs = inputs(4, 2048, 1, 128, 128, dtype=BF16)
    assert torch.equal(run(sol, xs), run(sol, xs, KERNEL))


@sm90
@pytest.mark.parametrize("case", ["heads-broadcast", "batch-broadcast", "bhtd", "padded-rows"])
@pytest.mark.parametrize("dk", [64, 128])
def test_layouts_stay_on_chunk_sm90(sol, dk, case):
    """Each layout through the TMA maps' strides (a broadcast head or batch as coordinate 0), planned."""
    xs = with_layout(inputs(2, 2100, 2, dk, 128, dtype=BF16), case)
    y = near_floor(sol, xs)
    assert torch.equal(run(sol, xs), y)


@sm90
@pytest.mark.parametrize("case", ["dv64", "dk96", "misaligned", "float16"])
def test_other_inputs_stay_on_chunk_bf16_or_tf32(sol, case):
    """The plan sends what chunk_sm90 does not serve to the mma.sync kernels, bitwise as asked by name
    (float16, D 128: chunk_tf32; float32 D 128 is test_chunk_sm90_tf32's)."""
    shape = {"dv64": (1, 300, 2, 64, 64), "dk96": (1, 300, 2, 96, 128)}.get(case, (1, 300, 2, 128, 128))
    xs = inputs(*shape, dtype=torch.float16 if case == "float16" else BF16)
    if case == "misaligned":
        xs[:3] = [misaligned(x) for x in xs[:3]]
    other = "chunk_tf32" if case == "float16" else "chunk_bf16"
    assert torch.equal(run(sol, xs), run(sol, xs, other))


@plan_only
@pytest.mark.parametrize("case", ["float16", "dk96", "dv64", "misaligned", "step-stride-0", "config"])
def test_refusals_name_the_reason(sol, case):
    xs = inputs(1, 100, 1, 128, 128, dtype=BF16, device=DEV)
    config = ()
    if case == "float16":
        xs, err, msg = [x.half() for x in xs], TypeError, "chunk_sm90 takes bfloat16 or float32 inputs, got float16"
    elif case == "dk96":
        xs, err, msg = inputs(1, 100, 1, 96, 128, dtype=BF16, device=DEV), ValueError, "D_k 64 or 128 with D_v 128"
    elif case == "dv64":
        xs, err, msg = inputs(1, 100, 1, 128, 64, dtype=BF16, device=DEV), ValueError, "D_k 64 or 128 with D_v 128"
    elif case == "misaligned":
        xs[:3] = [misaligned(x) for x in xs[:3]]
        err, msg = ValueError, "16-byte aligned"
    elif case == "step-stride-0":
        xs[0] = xs[0][:, :1].expand_as(xs[0])
        err, msg = ValueError, "nonzero step"
    else:
        config, err, msg = (2, 3), ValueError, r"config must be \(segments,\)"
    with pytest.raises(err, match=msg):
        sol._gated_recurrence_with(*xs, kernel=KERNEL, config=config)
