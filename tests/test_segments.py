"""Sequence parallelism (GPU): segments much longer than a chunk (the state phase walks many chunks a segment)
with gates whose products over a segment grow or vanish, and wide heads in several column tiles, every dtype,
against the float64 loop, with states in and out. The planned long-sequence paths run segments through the
chunk tests, the gate sweeps and the states tests."""
import pytest
import torch

from conftest import cuda
from helpers import CHUNK_KERNEL, DTYPE_IDS, DTYPES, STATE_TOL, TOL, inputs, ref64, rel_l2, run, strided_state

import naive


# Known gap (issue 12's fp32 bar): chunk_tf32's fp32 error grows with the chunks a block walks in order; with a
# constant gate of 1.002 over 66 chunks y's rel-L2 is 2.2e-5 in one segment and 1.4e-5 in 3 (1.8e-6 in 22),
# against 1.0e-6 for the recurrent kernel (device, ninth session). Gate tables in double do not change it.
GROWING_FP32 = pytest.mark.xfail(strict=True, reason="chunk_tf32 fp32 error grows with chunks walked: 1.4e-5 here")


@cuda
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("gate", [None, 1.002, (0.9, 1.0), (-1.01, 1.01)], ids=["sigmoid", "above1", "near1", "mixed-sign"])
def test_long_segments(sol, dtype, gate, request):
    """(1, 2100, 2, 64, 40) in 3 segments: 22 chunks of 32 steps a segment, the last one ragged."""
    if gate == 1.002 and dtype == torch.float32:
        request.applymarker(GROWING_FP32)
    xs = inputs(1, 2100, 2, 64, 40, dtype=dtype, gate=gate)
    s0 = strided_state(1, 2, 64, 40)
    y, fin = run(sol, xs, CHUNK_KERNEL[dtype], (64, 3), initial_state=s0, output_final_state=True)
    ey, es = naive.recurrent_naive(*xs, initial_state=s0)
    assert rel_l2(y, ey) <= TOL[dtype] and rel_l2(fin, es) <= STATE_TOL[dtype]


@cuda
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_wide_heads_in_column_tiles(sol, dtype):
    """D_k = 200, D_v = 130: five column tiles of 32, the last one ragged, in five segments."""
    xs = inputs(1, 200, 1, 200, 130, dtype=dtype)
    y = run(sol, xs, CHUNK_KERNEL[dtype], (32, 5))
    assert rel_l2(y, ref64(xs)) <= TOL[dtype]
