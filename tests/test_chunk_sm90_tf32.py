"""GPU (compute capability 9.0): chunk_sm90's float32 instantiation, chunks of 64 on TF32 wgmma with 3xTF32
operands (hi + lo: fp32-level error, within the fp32 TOL of the float64 loop): D_k = D_v = 128 with one and
several segments, ragged last chunks, initial and final states of any strides, gate and beta classes, NaN and
inf as the loop has them, chained calls, a CUDA graph, the layouts its TMA maps describe (bitwise as planned);
what the plan sends to it (float32, D 128, B*H*T >= 8192, on an H200 or without a device) and away from it
(float16, other widths, misaligned or odd-strided rows, a zero step stride, packed sequences: chunk_tf32,
bitwise), and the refusals of an explicit request."""
import itertools
import re

import pytest
import torch

from conftest import HAS_CUDA
from helpers import (GATE_IDS, GATES, SEGMENTS, check, check_chained, check_graph, check_nonfinite, check_states,
                     inputs, misaligned, run, shape_id, strided_state, v_with, with_beta_zero_negative_large,
                     with_layout, with_nan)

HOPPER = HAS_CUDA and torch.cuda.get_device_capability() == (9, 0)
sm90 = pytest.mark.skipif(not HOPPER, reason="needs compute capability 9.0 (wgmma)")
# The plan and its refusals: on an H200, or on the CPU against plan()'s H200 stand-in.
plan_only = pytest.mark.skipif(HAS_CUDA and not HOPPER, reason="a GPU other than compute capability 9.0")
DEV = "cuda" if HAS_CUDA else "cpu"

KERNEL = "chunk_sm90"
FP32, FP16, BF16 = torch.float32, torch.float16, torch.bfloat16
D = 128  # the one width the float32 instantiation serves (D_k = D_v)
TF32_PLAN = "chunk_sm90 (CHUNK_SM90_TF32_SRC, unit chunk_sm90) C=64 D_k=128 compiled D_v=128 operands=3xTF32"
BF16_PLAN = "chunk_sm90 (CHUNK_SM90_SRC, unit chunk_sm90) C=64 D_k=128 compiled D_v=128 segments="
TF32_OTHER = "chunk_tf32 (CHUNK_TF32_SRC, unit chunk_tf32) "
# (B, T, H): one step, less than a chunk, one short of a chunk, one chunk, one past, ragged chunks, long.
SHAPES = [(1, 1, 1), (2, 33, 1), (2, 63, 2), (2, 64, 2), (2, 65, 1), (3, 130, 2), (1, 300, 3), (1, 1000, 1)]
# B*H*T = 8400: planned on chunk_sm90 where its conditions hold.
BIG = (2, 2100, 2)
# packed sequence lengths (an empty one, a ragged last chunk) with BIG's H: dense, these sizes would take chunk_sm90
PACKED = [2100, 0, 1500, 2100, 700]


def fp32(B, T, H, Dk=D, Dv=D, **kw):
    return inputs(B, T, H, Dk, Dv, dtype=FP32, **kw)


@sm90
@pytest.mark.parametrize("shape", SHAPES, ids=shape_id)
def test_shapes(sol, shape):
    check(sol, fp32(*shape), kernel=KERNEL)


@sm90
@pytest.mark.parametrize("states", [False, True], ids=["no-state", "states"])
@pytest.mark.parametrize("segments", SEGMENTS, ids=lambda n: f"seg{n}")
def test_segments(sol, segments, states):
    xs = fp32(2, 700, 2)
    if states:
        check_states(sol, xs, strided_state(2, 2, D, D), KERNEL, (segments,))
    else:
        check(sol, xs, kernel=KERNEL, config=(segments,))


def state_of(layout, B, H):
    """An initial state (B, H, D, D) float32: D_v-major memory (transposed), or one batch's expanded (stride 0)."""
    if layout == "transposed":
        return torch.randn(B, H, D, D, device="cuda").transpose(-1, -2)
    return torch.randn(1, H, D, D, device="cuda").expand(B, H, D, D)


@sm90
@pytest.mark.parametrize("layout", ["transposed", "batch-expanded"])
def test_initial_state_of_any_strides(sol, layout):
    check_states(sol, fp32(2, 300, 2), state_of(layout, 2, 2), KERNEL, (3,))


@sm90
@pytest.mark.parametrize("gate", GATES, ids=GATE_IDS)
def test_gate_values(sol, gate):
    """Decays are direct products of gates: 0, negative, above 1, mixed signs, near 0 and 1, to fp32's TOL."""
    check(sol, fp32(1, 300, 2, gate=gate), kernel=KERNEL, config=(3,))


@sm90
@pytest.mark.parametrize("segments", [1, 4], ids=lambda n: f"seg{n}")
def test_constant_gate_above_1_over_a_long_sequence(sol, segments):
    """Gate 1.002 for 4100 steps: GAMMA (a chunk's gate product) multiplies the state 65 times, so its roundings add
    up coherently. A float scan there measured 2e-5 at T = 2048 (dev/tf32_tables_emulation.py); the exact product
    keeps y within fp32's TOL."""
    check(sol, fp32(1, 4100, 2, gate=1.002), kernel=KERNEL, config=(segments,))


@sm90
def test_beta_zero_negative_large(sol):
    check(sol, with_beta_zero_negative_large(fp32(1, 300, 2)), kernel=KERNEL)


@sm90
@pytest.mark.parametrize("where", ["q", "k", "v", "gate", "beta"])
def test_nan_where_the_loop_has_nan(sol, where):
    check_nonfinite(sol, with_nan(fp32(2, 100, 3), where), KERNEL, (2,))


@sm90
@pytest.mark.parametrize("value", [float("nan"), float("inf")], ids=["nan", "inf"])
def test_nonfinite_v_stays_in_its_column_and_future(sol, value):
    """A NaN or inf v_s at s > t never reaches y_t; finiteness as the loop's (NaN or inf where it is not
    depends on the order of the sum)."""
    check_nonfinite(sol, v_with(value, FP32, shape=(1, 300, 2, D, D)), KERNEL, same=torch.isfinite)


@sm90
def test_nonfinite_v_in_the_ragged_last_chunk(sol):
    xs = fp32(1, 300, 2, gate=(0.5, 1.0))
    xs[2][0, 290, 1, 3] = float("inf")
    check_nonfinite(sol, xs, KERNEL, same=torch.isfinite)


@sm90
@pytest.mark.parametrize("split", [64, 100], ids=lambda n: f"split{n}")
def test_chained_calls_equal_one(sol, split):
    """x[:, :split] then x[:, split:] from its final state gives the one-call y and final state."""
    check_chained(sol, fp32(1, 300, 2), KERNEL, split)


@sm90
def test_graph_capture(sol):
    check_graph(sol, (1, 300, 2, D, D), FP32, states=True, kernel=KERNEL)


@sm90
@pytest.mark.parametrize("case", ["heads-broadcast", "batch-broadcast", "bhtd", "padded-rows"])
def test_layouts_stay_on_chunk_sm90(sol, case):
    """Each layout through the TMA maps' strides (a broadcast head or batch as coordinate 0; padded rows keep
    16-byte alignment), planned: bitwise the explicit call, near the float64 loop."""
    xs = with_layout(fp32(*BIG), case)
    y = check(sol, xs, kernel=KERNEL)
    assert torch.equal(run(sol, xs), y)


@sm90
def test_planned_call_is_chunk_sm90(sol):
    xs = fp32(4, 2048, 1)
    y = check(sol, xs)
    assert torch.equal(y, run(sol, xs, KERNEL))


def other_inputs(case, device="cuda"):
    """Inputs of BIG (planned on chunk_sm90 in float32 at D 128) that it does not serve, and extra arguments."""
    B, T, H = BIG
    if case == "float16":
        return inputs(B, T, H, D, D, dtype=FP16, device=device), {}
    if case in ("dk64", "dv64"):
        return inputs(B, T, H, *((64, D) if case == "dk64" else (D, 64)), device=device), {}
    xs = inputs(B, T, H, D, D, device=device)
    if case == "misaligned":
        xs[:3] = [misaligned(x) for x in xs[:3]]
    elif case == "odd-pitch":  # rows 130 floats apart: the base aligned, the row stride not a multiple of 4
        xs[:3] = [torch.nn.functional.pad(x, (0, 2))[..., :D] for x in xs[:3]]
    elif case == "step-stride-0":
        xs[0] = xs[0][:, :1].expand_as(xs[0])
    elif case == "varlen":  # packed: PACKED in one row, N*H*longest = 21000
        cu = torch.tensor([0] + list(itertools.accumulate(PACKED)), dtype=torch.int32, device=device)
        return inputs(1, sum(PACKED), H, D, D, device=device), {"cu_seqlens": cu, "max_seqlen": max(PACKED),
                                                                 "output_final_state": True}
    return xs, {}


OTHER_CASES = ["float16", "dk64", "dv64", "misaligned", "odd-pitch", "step-stride-0", "varlen"]


@sm90
@pytest.mark.parametrize("case", OTHER_CASES)
def test_other_inputs_stay_on_chunk_tf32(sol, case):
    """What the float32 instantiation does not serve (float16; D_k or D_v 64; rows not 16-byte aligned; a zero
    step stride; packed sequences) runs chunk_tf32 as planned, bitwise as asked by name."""
    xs, kwargs = other_inputs(case)
    planned, named = run(sol, xs, **kwargs), run(sol, xs, "chunk_tf32", **kwargs)
    if isinstance(planned, torch.Tensor):
        planned, named = [planned], [named]
    assert len(planned) == len(named) == (2 if kwargs else 1)
    assert all(torch.equal(a, b) for a, b in zip(planned, named))


@plan_only
@pytest.mark.parametrize("shape", [(8, 2048, 16, D, D), (1, 8192, 8, D, D), (1, 8192, 1, D, D), (8, 64, 16, D, D),
                                   (1, 8191, 1, D, D), (2, 300, 3, D, D), (4, 1024, 8, 64, 128),
                                   (4, 1024, 8, 128, 64), (4, 1024, 8, 64, 64)], ids=shape_id)
def test_plan_takes_it_for_float32_d128_on_hopper_from_8192(sol, shape):
    """float32 with D_k = D_v = 128 from B*H*T = 8192 on, as bfloat16 (whose text stays as it was); several
    segments where B*H is small; below 8192 or at other widths chunk_tf32."""
    B, T, H, Dk, Dv = shape
    text = sol.plan(B, T, H, Dk, Dv, FP32)
    assert text == sol.plan(B, T, H, Dk, Dv, "float32")
    if B * H * T >= 8192 and Dk == Dv == D:
        assert text.startswith(TF32_PLAN), text
        assert " loads=TMA " in text and "x384 smem=" in text, text  # three warpgroups a block, TMA loads
        segments = int(re.search(r"\bsegments=(\d+)", text).group(1))
        assert ("segment_scan" in text) == (segments > 1), text
        assert segments > 1 or B * H > 8, text
        bf16 = sol.plan(B, T, H, Dk, Dv, BF16)
        assert bf16.startswith(BF16_PLAN) and "TF32" not in bf16 and "operands=" not in bf16, bf16
    else:
        assert text.startswith(TF32_OTHER), text


@plan_only
@pytest.mark.parametrize("case", ["float16", "float32-varlen"])
@pytest.mark.parametrize("shape", [(8, 2048, 16, D, D), (1, 8192, 1, D, D)], ids=shape_id)
def test_plan_keeps_float16_and_packed_float32_on_chunk_tf32(sol, shape, case):
    text = sol.plan(*shape, FP16) if case == "float16" else sol.plan(*shape, FP32, varlen=True)
    assert text.startswith(TF32_OTHER), text
    assert ("varlen" in text) == (case == "float32-varlen"), text


REFUSALS = ["float16", "dk64", "dv64", "misaligned", "odd-pitch", "step-stride-0", "config", "segments-0"]


@plan_only
@pytest.mark.parametrize("case", REFUSALS)
def test_refusals_name_the_reason(sol, case):
    xs = inputs(1, 100, 1, D, D, dtype=FP32, device=DEV)
    config = ()
    if case == "float16":
        xs, err, msg = [x.half() for x in xs], TypeError, "chunk_sm90 takes bfloat16 or float32 inputs, got float16"
    elif case in ("dk64", "dv64"):
        dims = (64, D) if case == "dk64" else (D, 64)
        xs, err, msg = inputs(1, 100, 1, *dims, dtype=FP32, device=DEV), ValueError, "float32 with D_k = D_v = 128"
    elif case == "misaligned":
        xs[:3] = [misaligned(x) for x in xs[:3]]
        err, msg = ValueError, "16-byte aligned"
    elif case == "odd-pitch":
        xs[:3] = [torch.nn.functional.pad(x, (0, 2))[..., :D] for x in xs[:3]]
        err, msg = ValueError, "16-byte aligned"
    elif case == "step-stride-0":
        xs[0] = xs[0][:, :1].expand_as(xs[0])
        err, msg = ValueError, "nonzero step"
    elif case == "config":
        config, err, msg = (2, 3), ValueError, r"config must be \(segments,\)"
    else:
        config, err, msg = (0,), ValueError, "segments must be at least 1"
    with pytest.raises(err, match=msg):
        sol._gated_recurrence_with(*xs, kernel=KERNEL, config=config)


@sm90
def test_packed_float32_is_refused(sol):
    """float32 packed sequences by name: a ValueError (bfloat16's chunk_sm90 takes cu_seqlens; its float32
    instantiation does not). On the device: the varlen path checks devices before it plans."""
    xs, kwargs = other_inputs("varlen")
    with pytest.raises(ValueError, match="packed sequences"):
        run(sol, xs, KERNEL, **kwargs)
