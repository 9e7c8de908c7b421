"""GPU: parallel, the kernel of short sequences (T up to 256) without a carried state: one block per (b, h,
row tile of 8 steps, column tile of NV) computing y = (masked, decayed q k^T) v + A (q S_0) in fp32 FMAs
(fp32 products for every dtype). Every dtype (low precision within 1.1x of the exact answer's own
rounding), T across row tiles, D_k padded to 8, ragged column tiles of several NV, 16-byte and scalar
copies, strided views, gate and beta values, NaN and inf, initial and final states, chained calls, the
largest staging that fits, determinism and CUDA graphs. (NaN in each input in float32 is
test_integration's, with every kernel.)"""
import pytest
import torch

import naive
from conftest import cuda
from helpers import (BOUNDARY, DTYPE_IDS, DTYPES, GATE_IDS, GATES, H200_SMEM, LAYOUTS, PARALLEL_TILES, SPEC, check,
                     check_chained,
                     check_graph, check_nonfinite, check_states, inputs, misaligned, parallel_smem, ref64, rel_l2,
                     rounding_floor, run, shape_id, strided_state, v_with, views, with_beta_zero_negative_large,
                     with_nan)

pytestmark = cuda

KERNEL = "parallel"
FP32, FP16, BF16 = torch.float32, torch.float16, torch.bfloat16
STATE_FP32 = 1e-5  # the final state is summed in fp32 whatever the inputs' dtype

# T = 1, at and past the edges of row tiles (8), up to 256; D = 1, 7, 33, 100, 256 (D_k padded to 8);
# D_k != D_v both ways; D_v over 64 (several column tiles, the last ragged).
PAR_SHAPES = [SPEC, (1, 1, 1, 1, 1), (2, 17, 3, 16, 16), (3, 31, 5, 7, 7), (2, 32, 3, 33, 33), (2, 33, 3, 24, 40),
              (2, 48, 2, 48, 8), (1, 63, 2, 100, 100), (1, 64, 2, 64, 64), (1, 200, 2, 24, 100), (1, 255, 1, 33, 7),
              (1, 256, 1, 64, 130), (1, 20, 2, 256, 256)]


def check_near_rounding(sol, xs, config=()):
    """check() (TOL of the dtype), and for float16 and bfloat16 within 1.1x of rounding the exact answer
    to that dtype: the kernel's fp32 result is rounded once."""
    exact = ref64(xs)
    y = check(sol, xs, kernel=KERNEL, config=config, ref=exact)
    if xs[0].dtype != FP32:
        assert rel_l2(y, exact) <= 1.1 * rounding_floor(exact, xs[0].dtype) + 1e-6
    return y


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("shape", PAR_SHAPES, ids=shape_id)
def test_shapes_and_dtypes(sol, shape, dtype):
    check_near_rounding(sol, inputs(*shape, dtype=dtype))


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("T", [1, 100, 255])
@pytest.mark.parametrize("d", PARALLEL_TILES, ids=[f"tile{d}" for d in PARALLEL_TILES])
def test_compiled_tiles(sol, d, T, dtype):
    """Every compiled tile (D_k = D_v = d, aligned rows), at T = 1, mid-tile and the longest, with a strided
    initial state and the final state; the same shape one element off alignment runs the run-time one."""
    xs = inputs(2, T, 3, d, d, dtype=dtype)
    assert sol.plan(2, 100, 3, d, d, dtype).startswith("parallel") and " compiled " in sol.plan(2, 100, 3, d, d, dtype)
    check_near_rounding(sol, xs)
    check_states(sol, xs, strided_state(2, 3, d, d), KERNEL, state_tol=STATE_FP32)
    check_near_rounding(sol, [misaligned(x) for x in xs[:3]] + xs[3:])


@pytest.mark.parametrize("gate", GATES, ids=GATE_IDS)
@pytest.mark.parametrize("d", PARALLEL_TILES, ids=[f"tile{d}" for d in PARALLEL_TILES])
def test_compiled_tiles_gate_values(sol, d, gate):
    check_near_rounding(sol, inputs(1, 200, 2, d, d, gate=gate))


@pytest.mark.parametrize("where", ["q", "k", "v", "gate", "beta"])
def test_compiled_tile_nan(sol, where):
    check_nonfinite(sol, with_nan(inputs(2, 80, 3, 24, 24), where), KERNEL)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("layout", ["aligned", "misaligned"])
@pytest.mark.parametrize("nv", [8, 32, 64], ids=["nv8", "nv32", "nv64"])
def test_column_tiles_and_loads(sol, nv, layout, dtype):
    """config = (NV,): D_v = 104 is ragged for NV = 32 and 64; D_k and D_v are multiples of 8, so aligned rows
    take 16-byte loads in every dtype and rows one element off take scalar loads."""
    xs = inputs(2, 100, 2, 40, 104, dtype=dtype)
    if layout == "misaligned":
        xs[:3] = [misaligned(x) for x in xs[:3]]
    check_near_rounding(sol, xs, config=(nv,))


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_strided_inputs_are_read_in_place(sol, layout, dtype):
    xs = views(2, 70, 3, 32, 40, dtype)[layout]
    assert not all(x.is_contiguous() for x in xs)
    check_near_rounding(sol, xs)


@pytest.mark.parametrize("gate", GATES, ids=GATE_IDS)
@pytest.mark.parametrize("shape,dtype", [((2, 63, 3, 24, 24), FP32), ((1, 255, 2, 64, 40), FP32),
                                         ((1, 255, 2, 64, 40), BF16)], ids=["63x24-fp32", "255x64-fp32", "255x64-bf16"])
def test_gate_values(sol, shape, dtype, gate):
    """Decays across row tiles are direct products of gates: exact for gates 0, negative and above 1."""
    check_near_rounding(sol, inputs(*shape, dtype=dtype, gate=gate))


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_beta_zero_negative_large(sol, dtype):
    check_near_rounding(sol, with_beta_zero_negative_large(inputs(2, 100, 3, 24, 24, dtype=dtype)))


@pytest.mark.parametrize("dtype", [FP16, BF16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("where", ["q", "k", "v", "gate", "beta"])
def test_nan_propagates_like_reference_low_precision(sol, where, dtype):
    check_nonfinite(sol, with_nan(inputs(2, 80, 3, 64, 40, dtype=dtype), where), KERNEL)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_infinite_v_stays_in_its_column_and_future(sol, dtype):
    """As the chunk kernels: the masked zeros never meet v_s for s > t, so y is finite exactly where the
    float64 loop's is (NaN or inf where it is not depends on the order of the sum)."""
    check_nonfinite(sol, v_with(float("inf"), dtype, (1, 200, 2, 64, 40)), KERNEL, same=torch.isfinite)


@pytest.mark.parametrize("given", [False, True], ids=["zero-state", "initial-state"])
def test_nan_first_gate_reaches_the_final_state(sol, given):
    """A NaN gate at step 0 multiplies the initial state, zero or given: the float64 loop's y and final
    state are NaN everywhere from there, and so must the kernel's be (as the recurrent and chunk kernels,
    whose state update multiplies the state it starts from)."""
    xs = inputs(2, 40, 3, 24, 24)
    xs[3][:, 0] = float("nan")
    s0 = strided_state(2, 3, 24, 24) if given else None
    y, sT = run(sol, xs, KERNEL, initial_state=s0, output_final_state=True)
    ry, rs = naive.recurrent_naive(*xs, initial_state=s0)
    assert torch.equal(torch.isnan(y), torch.isnan(ry))
    assert torch.equal(torch.isnan(sT), torch.isnan(rs)), f"{int(torch.isnan(sT).sum())} of {rs.numel()} NaN"


@pytest.mark.parametrize("given", [False, True], ids=["zero-state", "initial-state"])
@pytest.mark.parametrize("nv", [32, 64], ids=["nv32", "nv64"])
@pytest.mark.parametrize("T", [0, 33, 256])
def test_initial_and_final_state(sol, T, nv, given):
    """A strided initial_state (or none) in, the final state from the last row tile out, every column
    tile of D_v = 70."""
    s0 = strided_state(2, 3, 33, 70) if given else None
    check_states(sol, inputs(2, T, 3, 33, 70), s0, KERNEL, (nv,), state_tol=STATE_FP32)


@pytest.mark.parametrize("dtype", [FP16, BF16], ids=["fp16", "bf16"])
def test_initial_and_final_state_low_precision(sol, dtype):
    check_states(sol, inputs(2, 100, 3, 33, 70, dtype=dtype), strided_state(2, 3, 33, 70), KERNEL,
                 state_tol=STATE_FP32)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("split", [100, 128], ids=["mid-tile", "tile-boundary"])
def test_two_calls_chained_equal_one(sol, split, dtype):
    check_chained(sol, inputs(1, 256, 2, 64, 64, dtype=dtype), KERNEL, split, state_tol=STATE_FP32)


@pytest.mark.parametrize("dtype", [FP32, BF16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("shape,nv", [((1, 256, 2, 168, 32), 32), ((1, 256, 1, 136, 64), 64)],
                         ids=["nv32-dk168", "nv64-dk136"])
def test_largest_staging_that_fits(sol, shape, nv, dtype):
    """T = 256 with the widest D_k whose float32 staging fits an H200 (D_k + 1, padded to the next 8, does
    not; 16-bit inputs stage half the bytes)."""
    _, T, _, Dk, _ = shape
    assert parallel_smem(nv, Dk, T) <= H200_SMEM < parallel_smem(nv, Dk + 1, T)
    if torch.cuda.get_device_properties(0).shared_memory_per_block_optin < H200_SMEM:
        pytest.skip("a device with less shared memory per block than an H200")
    xs = inputs(*shape, dtype=dtype)
    check_near_rounding(sol, xs, config=(nv,))
    check_states(sol, xs, strided_state(shape[0], shape[2], Dk, shape[4]), KERNEL, (nv,), state_tol=STATE_FP32)


@pytest.mark.parametrize("shape,dtype", [(SPEC, FP32), ((1, 250, 2, 100, 130), BF16)], ids=["spec", "250x100x130-bf16"])
def test_deterministic_bitwise(sol, shape, dtype):
    xs = inputs(*shape, dtype=dtype)
    assert torch.equal(run(sol, xs, KERNEL), run(sol, xs, KERNEL))


GRAPH_CASES = [("planned-spec", SPEC, FP32, False, None), ("planned-spec-bf16", SPEC, BF16, False, None),
               ("states", (2, 100, 3, 33, 70), FP32, True, KERNEL)]


@pytest.mark.parametrize("name,shape,dtype,states,kernel", GRAPH_CASES, ids=[c[0] for c in GRAPH_CASES])
def test_cuda_graph_capture_and_replay(sol, name, shape, dtype, states, kernel):
    check_graph(sol, shape, dtype, states, kernel)


@pytest.mark.parametrize("shape", [s for s, path in BOUNDARY if path == KERNEL][:2], ids=shape_id)
def test_planned_short_sequence_is_parallel(sol, shape):
    """Where BOUNDARY plans the parallel kernel, the public call is the hook's call, bitwise."""
    xs = inputs(*shape)
    assert torch.equal(sol.gated_recurrence(*xs), run(sol, xs, KERNEL))

