"""GPU: initial and final states on every kernel (recurrent, chunk_tf32 with float32 and float16 inputs,
chunk_bf16, the planned path), with segments, at T = 0, and chained calls equal to one call. (The parallel
kernel serves T up to 256: its states and chained calls are test_parallel's; T = 0 is here.)"""
import pytest
import torch

from conftest import cuda
from helpers import check_chained, check_states, inputs, run, strided_state

pytestmark = cuda

FP32, FP16, BF16 = torch.float32, torch.float16, torch.bfloat16

# (id, kernel, dtype, config): None is the planned path (gated_recurrence itself).
STATE_CASES = [("planned", None, FP32, ()), ("recurrent-fp32", "recurrent", FP32, ()),
               ("recurrent-bf16", "recurrent", BF16, ()), ("chunk_tf32-fp32", "chunk_tf32", FP32, ()),
               ("chunk_tf32-fp32-segments", "chunk_tf32", FP32, (64, 4)), ("chunk_tf32-fp16", "chunk_tf32", FP16, ()),
               ("chunk_tf32-fp16-segments", "chunk_tf32", FP16, (64, 4)), ("chunk_bf16", "chunk_bf16", BF16, ()),
               ("chunk_bf16-segments", "chunk_bf16", BF16, (64, 4))]


@pytest.mark.parametrize("T", [0, 5, 300])
@pytest.mark.parametrize("name,kernel,dtype,config", STATE_CASES, ids=[c[0] for c in STATE_CASES])
def test_initial_and_final_state(sol, name, kernel, dtype, config, T):
    """A strided initial_state in, the final state out, against the float64 loop (y to its dtype's
    error, the fp32 state to STATE_TOL)."""
    check_states(sol, inputs(2, T, 3, 33, 20, dtype=dtype), strided_state(2, 3, 33, 20), kernel, config)


EMPTY_CASES = [(None, FP32), ("recurrent", FP32), ("parallel", BF16), ("chunk_tf32", FP16), ("chunk_bf16", BF16)]


@pytest.mark.parametrize("given", [False, True], ids=["zero-state", "initial-state"])
@pytest.mark.parametrize("kernel,dtype", EMPTY_CASES,
                         ids=["planned", "recurrent", "parallel", "chunk_tf32", "chunk_bf16"])
def test_empty_sequence_returns_the_initial_state(sol, kernel, dtype, given):
    """T = 0: y is empty and the final state is the initial one (zero without one), in a new tensor."""
    s0 = strided_state(2, 3, 8, 5) if given else None
    y, sT = run(sol, inputs(2, 0, 3, 8, 5, dtype=dtype), kernel, initial_state=s0, output_final_state=True)
    assert y.shape == (2, 0, 3, 5) and y.dtype == dtype and y.is_cuda
    assert sT.shape == (2, 3, 8, 5) and sT.dtype == torch.float32 and sT.is_cuda
    assert torch.equal(sT, s0 if given else torch.zeros_like(sT))
    assert s0 is None or sT.data_ptr() != s0.data_ptr()


CHAIN_CASES = [(None, FP32), ("recurrent", FP32), ("chunk_tf32", FP32), ("chunk_tf32", FP16), ("chunk_bf16", BF16)]


@pytest.mark.parametrize("split", [333, 320], ids=["mid-chunk", "chunk-boundary"])
@pytest.mark.parametrize("kernel,dtype", CHAIN_CASES,
                         ids=["planned", "recurrent", "chunk_tf32-fp32", "chunk_tf32-fp16", "chunk_bf16"])
def test_two_calls_chained_equal_one(sol, kernel, dtype, split):
    check_chained(sol, inputs(1, 700, 2, 64, 64, dtype=dtype), kernel, split)


@pytest.mark.parametrize("dtype", [FP32, FP16, BF16], ids=["fp32", "fp16", "bf16"])
def test_segmented_plan_with_states(sol, dtype):
    """The planned long-sequence path (state phase, segment_scan from the initial state, output phase)."""
    shape = (1, 2000, 2, 64, 64)
    assert "segment_scan" in sol.plan(*shape, dtype)
    check_states(sol, inputs(*shape, dtype=dtype), strided_state(1, 2, 64, 64))
