"""GPU: chunk_bf16, the chunked kernel of bfloat16 inputs on bf16 tensor cores (fp32 operands split into
two bf16 terms): every instantiation with one and several segments (several run segment_scan too),
ragged last chunks and states, the shapes list, gate values within 1.5x of the exact answer's own bf16
rounding, beta values, NaN and inf in v."""
import pytest
import torch

from conftest import cuda
from helpers import (CHUNK_INSTANCES, GATE_IDS, GATE_SHAPES, GATES, SEGMENTS, SHAPES, bf16_floor, check,
                     check_instance, check_nonfinite, inputs, ref64, rel_l2, run, shape_id, v_with,
                     with_beta_zero_negative_large)

pytestmark = cuda

KERNEL = "chunk_bf16"
BF16 = torch.bfloat16


@pytest.mark.parametrize("shape", SHAPES, ids=shape_id)
def test_shapes(sol, shape):
    check(sol, inputs(*shape, dtype=BF16), kernel=KERNEL)


@pytest.mark.parametrize("states", [False, True], ids=["no-state", "states"])
@pytest.mark.parametrize("segments", SEGMENTS, ids=lambda n: f"seg{n}")
@pytest.mark.parametrize("name,shape,nv,layout", CHUNK_INSTANCES, ids=[c[0] for c in CHUNK_INSTANCES])
def test_every_instantiation(sol, name, shape, nv, layout, segments, states):
    check_instance(sol, KERNEL, BF16, shape, nv, layout, segments, states)


@pytest.mark.parametrize("gate", GATES, ids=GATE_IDS)
@pytest.mark.parametrize("shape", GATE_SHAPES + [(1, 700, 2, 128, 128)], ids=shape_id)
def test_gate_values_near_bf16_rounding(sol, shape, gate):
    """Within 1.5x of rounding the exact answer to bf16 (check() bounds it by TOL first)."""
    xs = inputs(*shape, gate=gate, dtype=BF16)
    exact = ref64(xs)
    y = check(sol, xs, kernel=KERNEL, ref=exact)
    assert rel_l2(y, exact) <= 1.5 * bf16_floor(exact) + 1e-6


@pytest.mark.parametrize("shape", [(2, 63, 3, 24, 24), (1, 300, 2, 64, 64)], ids=["generic", "compiled-dk64"])
def test_beta_zero_negative_large(sol, shape):
    check(sol, with_beta_zero_negative_large(inputs(*shape, dtype=BF16)), kernel=KERNEL)


@pytest.mark.parametrize("value", [float("nan"), float("inf")], ids=["nan", "inf"])
@pytest.mark.parametrize("shape", [(1, 300, 2, 64, 40), (1, 300, 2, 33, 20)], ids=["compiled-dk64", "generic-dk33"])
def test_nonfinite_v_stays_in_its_column_and_future(sol, shape, value):
    """As chunk_tf32's test of the same name: finiteness agrees with the float64 loop."""
    check_nonfinite(sol, v_with(value, BF16, shape), KERNEL, same=torch.isfinite)


def test_chunked_is_chunk_bf16_for_bfloat16(sol):
    xs = inputs(1, 300, 2, 64, 64, dtype=BF16)
    assert torch.equal(run(sol, xs, "chunked"), run(sol, xs, KERNEL))
