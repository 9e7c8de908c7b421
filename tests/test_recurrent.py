"""GPU: the recurrent kernel's numerics: shapes (T = 1, ragged T, D from 1 to 256, D_k != D_v), dtypes,
gate values, beta values and every compiled (R, G) pair, each on NaN-poisoned memory so that an
output element left unwritten fails."""
import pytest
import torch

from conftest import cuda
from helpers import (DTYPE_IDS, DTYPES, GATE_IDS, GATE_SHAPES, GATES, PAIR_CONFIGS, SHAPES, check, inputs,
                     shape_id, with_beta_zero_negative_large)

pytestmark = cuda

KERNEL = "recurrent"


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("shape", SHAPES, ids=shape_id)
def test_shapes_and_dtypes(sol, shape, dtype):
    check(sol, inputs(*shape, dtype=dtype), kernel=KERNEL)


@pytest.mark.parametrize("gate", GATES, ids=GATE_IDS)
@pytest.mark.parametrize("shape", GATE_SHAPES, ids=shape_id)
def test_gate_values(sol, shape, gate):
    check(sol, inputs(*shape, gate=gate), kernel=KERNEL)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_beta_zero_negative_large(sol, dtype):
    check(sol, with_beta_zero_negative_large(inputs(2, 63, 3, 24, 24, dtype=dtype)), kernel=KERNEL)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("cfg", PAIR_CONFIGS, ids=lambda c: "R{}G{}JB{}TC{}-dk{}dv{}".format(*c))
def test_every_compiled_pair(sol, cfg, dtype):
    """Non-default launch configurations: every template instantiation, staging-chunk boundaries."""
    R, G, JB, TC, Dk, Dv = cfg
    check(sol, inputs(2, 45, 3, Dk, Dv, dtype=dtype), kernel=KERNEL, config=(R, G, JB, TC))
