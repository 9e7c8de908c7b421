"""GPU: chunk_tf32, the chunked kernel of float32 (3xTF32) and float16 (one TF32 product) inputs: every
instantiation with one and several segments (several run segment_scan too), ragged last chunks and
states, the shapes list, gate and beta values, NaN and inf in v."""
import pytest
import torch

from conftest import cuda
from helpers import (CHUNK_INSTANCES, GATE_IDS, GATE_SHAPES, GATES, SEGMENTS, SHAPES, check, check_instance,
                     check_nonfinite, inputs, run, shape_id, v_with, with_beta_zero_negative_large)

pytestmark = cuda

KERNEL = "chunk_tf32"
FAMILY_DTYPES = [torch.float32, torch.float16]
FAMILY_IDS = ["fp32", "fp16"]


@pytest.mark.parametrize("dtype", FAMILY_DTYPES, ids=FAMILY_IDS)
@pytest.mark.parametrize("shape", SHAPES, ids=shape_id)
def test_shapes(sol, shape, dtype):
    check(sol, inputs(*shape, dtype=dtype), kernel=KERNEL)


@pytest.mark.parametrize("states", [False, True], ids=["no-state", "states"])
@pytest.mark.parametrize("dtype", FAMILY_DTYPES, ids=FAMILY_IDS)
@pytest.mark.parametrize("segments", SEGMENTS, ids=lambda n: f"seg{n}")
@pytest.mark.parametrize("name,shape,nv,layout", CHUNK_INSTANCES, ids=[c[0] for c in CHUNK_INSTANCES])
def test_every_instantiation(sol, name, shape, nv, layout, segments, dtype, states):
    check_instance(sol, KERNEL, dtype, shape, nv, layout, segments, states)


@pytest.mark.parametrize("gate", GATES, ids=GATE_IDS)
@pytest.mark.parametrize("shape", GATE_SHAPES, ids=shape_id)
def test_gate_values(sol, shape, gate):
    """Decays are direct products of gates: exact for gates 0, negative and above 1."""
    check(sol, inputs(*shape, gate=gate), kernel=KERNEL)


@pytest.mark.parametrize("dtype", FAMILY_DTYPES, ids=FAMILY_IDS)
@pytest.mark.parametrize("shape", [(2, 63, 3, 24, 24), (1, 300, 2, 64, 64)], ids=["generic", "compiled-dk64"])
def test_beta_zero_negative_large(sol, shape, dtype):
    check(sol, with_beta_zero_negative_large(inputs(*shape, dtype=dtype)), kernel=KERNEL)


@pytest.mark.parametrize("value", [float("nan"), float("inf")], ids=["nan", "inf"])
@pytest.mark.parametrize("shape", [(1, 300, 2, 64, 40), (1, 300, 2, 33, 20)], ids=["compiled-dk64", "generic-dk33"])
def test_nonfinite_v_stays_in_its_column_and_future(sol, shape, value):
    """A NaN or infinite v: the masked zeros of its chunk's product never meet it (fp32 FMAs on the
    diagonal blocks), so y is finite exactly where the reference's is. Where it is not, NaN or inf
    depends on the order of the sum (the loop gives NaN from q . (+-inf), a chunked sum can give inf),
    so only finiteness is compared."""
    check_nonfinite(sol, v_with(value, torch.float32, shape), KERNEL, same=torch.isfinite)


@pytest.mark.parametrize("dtype", FAMILY_DTYPES, ids=FAMILY_IDS)
def test_chunked_is_chunk_tf32_for_its_dtypes(sol, dtype):
    xs = inputs(1, 300, 2, 64, 64, dtype=dtype)
    assert torch.equal(run(sol, xs, "chunked"), run(sol, xs, KERNEL))
