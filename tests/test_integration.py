"""GPU: the module as a caller sees it: CUDA-graph capture and replay, non-default streams, bitwise
determinism, strided, transposed and expanded views read in place, NaN propagation on every kernel, the
planned path (the shapes list, the spec shape through ModelNew, long sequences in segments) and the
lazily built units."""
import pytest
import torch

import reference
from conftest import cuda
from helpers import (BOUNDARY, DTYPE_IDS, DTYPES, LAYOUTS, SHAPES, SPEC, TOL, check, check_graph, check_nonfinite,
                     inputs, planned_kernel, ref64, rel_l2, shape_id, views, with_nan)

pytestmark = cuda

FP32, FP16, BF16 = torch.float32, torch.float16, torch.bfloat16

# The planned recurrent kernel: BOUNDARY's recurrent shape with the most steps over all heads.
RECURRENT_SHAPE = max((shape for shape, path in BOUNDARY if path == "recurrent"), key=lambda s: s[0] * s[1] * s[2])
GRAPH_CASES = [("segments-dk64", (1, 1024, 2, 64, 64), FP32, False),
               ("segments-general", (1, 2000, 1, 24, 20), FP32, False),
               ("segments-bf16", (1, 1024, 2, 64, 64), BF16, False),
               ("segments-states", (1, 1024, 2, 64, 64), FP32, True),
               ("recurrent", RECURRENT_SHAPE, FP32, False)]


@pytest.mark.parametrize("name,shape,dtype,states", GRAPH_CASES, ids=[c[0] for c in GRAPH_CASES])
def test_cuda_graph_capture_and_replay(sol, name, shape, dtype, states):
    """The chunked path with segments is three launches (the scan and the output phase may be
    programmatic dependent launches), all of which must land in the graph (check_graph)."""
    assert shape[1] < 256 or "segment_scan" in sol.plan(*shape, dtype)
    check_graph(sol, shape, dtype, states)


@pytest.mark.parametrize("shape,dtype", [((2, 64, 3, 24, 24), FP32), ((1, 1024, 2, 64, 64), FP32),
                                         ((1, 1024, 2, 64, 64), BF16)], ids=["short", "segments", "segments-bf16"])
def test_current_stream_is_used(sol, shape, dtype):
    xs = inputs(*shape, dtype=dtype)
    sol.gated_recurrence(*xs)  # the unit built outside the timed stream
    torch.cuda.synchronize()
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        torch.cuda._sleep(20_000_000)  # keeps s busy: a launch on another stream would finish first
        y = sol.gated_recurrence(*xs)
    s.synchronize()
    assert rel_l2(y, ref64(xs)) <= TOL[dtype]


@pytest.mark.parametrize("shape,dtype", [((2, 200, 4, 64, 48), FP32), (RECURRENT_SHAPE, FP32),
                                         ((2, 900, 4, 64, 48), FP32), ((2, 900, 4, 64, 48), FP16),
                                         ((2, 900, 4, 64, 48), BF16), ((1, 4096, 2, 64, 64), FP32),
                                         ((1, 4096, 2, 128, 128), FP32)],
                         ids=["short", "recurrent", "chunk_tf32", "chunk_tf32-fp16", "chunk_bf16", "segments",
                              "segments-d128"])  # d128: chunk_sm90's float32 instantiation on Hopper
def test_deterministic_bitwise(sol, shape, dtype):
    xs = inputs(*shape, dtype=dtype)
    assert torch.equal(sol.gated_recurrence(*xs), sol.gated_recurrence(*xs))


@pytest.mark.parametrize("kernel,shape", [("recurrent", (2, 63, 3, 33, 20)), ("chunked", (2, 63, 3, 33, 20)),
                                          ("chunked", (2, 300, 2, 64, 64))],
                         ids=["recurrent", "chunked-dk33", "chunked-dk64"])
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_strided_inputs_are_read_in_place(sol, layout, dtype, kernel, shape):
    xs = views(*shape, dtype)[layout]
    assert not all(x.is_contiguous() for x in xs)
    check(sol, xs, kernel=kernel)


@pytest.mark.parametrize("dk", [24, 64, 128], ids=["dk24", "dk64", "dk128"])  # chunk kernels: generic, compiled D_k
@pytest.mark.parametrize("kernel", ["recurrent", "parallel", "chunk_tf32", "chunk_bf16"])
@pytest.mark.parametrize("where", ["q", "k", "v", "gate", "beta"])
def test_nan_propagates_like_reference(sol, where, kernel, dk):
    dtype = BF16 if kernel == "chunk_bf16" else FP32
    xs = inputs(2, 80, 3, dk, 20 if dk == 24 else 40, dtype=dtype)  # D_v = 40: NV = 64, aligned rows
    check_nonfinite(sol, with_nan(xs, where), kernel)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("shape", SHAPES, ids=shape_id)
def test_planned_path(sol, shape, dtype):
    check(sol, inputs(*shape, dtype=dtype))


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_spec_shape_kernelbench_allclose(sol, dtype):
    """KernelBench: ModelNew against the reference run in the same precision, at the spec shape. In fp16
    and bf16 that reference rounds its state every step, and ModelNew does the same by default
    (numerics="reference"; test_reference_numerics has the rest)."""
    xs = [x.cuda().to(dtype) for x in reference.get_inputs()]
    numerics = "accurate" if dtype == FP32 else "reference"
    assert sol.plan(*SPEC, dtype, numerics=numerics).split()[0] == (planned_kernel(SPEC, dtype) if dtype == FP32
                                                                   else "recurrent")
    y = sol.ModelNew()(*xs)
    assert rel_l2(y, ref64(xs)) <= TOL[dtype]
    tol = 1e-4 if dtype == FP32 else 1e-2
    torch.testing.assert_close(y, reference.Model()(*xs), atol=tol, rtol=tol)


@pytest.mark.parametrize("dtype", [FP16, BF16], ids=["fp16", "bf16"])
def test_accurate_api_is_closer_to_float64_than_the_low_precision_reference(sol, dtype):
    """The functional API's default (fp32 arithmetic, one rounding) beats the loop's own rounding."""
    xs = [x.cuda().to(dtype) for x in reference.get_inputs()]
    exact = ref64(xs)
    assert rel_l2(sol.gated_recurrence(*xs), exact) < rel_l2(reference.Model()(*xs), exact)


@pytest.mark.parametrize("dtype", [FP32, BF16], ids=["fp32", "bf16"])
def test_long_sequence_uses_segments(sol, dtype):
    shape = (1, 3000, 2, 64, 64)
    text = sol.plan(*shape, dtype)
    assert text.split()[0] == ("chunk_bf16" if dtype == BF16 else "chunk_tf32") and "segment_scan" in text, text
    check(sol, inputs(*shape, dtype=dtype))


@pytest.mark.parametrize("shape", [(2, 0, 3, 8, 5), (0, 5, 3, 8, 5), (2, 5, 0, 8, 5), (0, 300, 3, 8, 5)],
                         ids=["T0", "B0", "H0", "B0-long"])
def test_empty_output(sol, shape):
    B, T, H, _, Dv = shape
    y = sol.gated_recurrence(*inputs(*shape))
    assert y.shape == (B, T, H, Dv) and y.dtype == FP32 and y.is_cuda


@pytest.mark.parametrize("dtype,unit", [(FP32, "chunk_tf32"), (FP16, "chunk_tf32"), (BF16, "chunk_bf16")],
                         ids=["fp32", "fp16", "bf16"])
def test_a_chunked_call_has_its_unit_loaded(sol, dtype, unit):
    check(sol, inputs(1, 300, 2, 64, 64, dtype=dtype))
    assert unit in sol.built_units() and "core" in sol.built_units()
    assert set(sol.built_units()) <= set(sol.UNITS)
