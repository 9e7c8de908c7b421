"""segment_state (GPU): each segment's own state as one product over its steps, walked backwards in blocks of
32 through a ring of kSegStages. Segments much longer than the ring (its slots reused many times), gates
whose products over a segment grow or vanish, every dtype, against the float64 loop; the planned long-sequence
paths run it through the chunk tests, the gate sweeps and the states tests."""
import pytest
import torch

from conftest import cuda
from helpers import CHUNK_KERNEL, DTYPE_IDS, DTYPES, STATE_TOL, TOL, inputs, ref64, rel_l2, run, strided_state

import naive


@cuda
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("gate", [None, 1.002, (0.9, 1.0), (-1.01, 1.01)], ids=["sigmoid", "above1", "near1", "mixed-sign"])
def test_long_segments_reuse_the_ring(sol, dtype, gate):
    """(1, 2100, 2, 64, 40) in 3 segments: 22 blocks of 32 steps a segment, the last one ragged."""
    xs = inputs(1, 2100, 2, 64, 40, dtype=dtype, gate=gate)
    s0 = strided_state(1, 2, 64, 40)
    y, fin = run(sol, xs, CHUNK_KERNEL[dtype], (64, 3), initial_state=s0, output_final_state=True)
    ey, es = naive.recurrent_naive(*xs, initial_state=s0)
    assert rel_l2(y, ey) <= TOL[dtype] and rel_l2(fin, es) <= STATE_TOL[dtype]


@cuda
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_wide_heads_in_row_and_column_tiles(sol, dtype):
    """D_k = 200, D_v = 130: four row tiles and three column tiles of 64, both ragged."""
    xs = inputs(1, 200, 1, 200, 130, dtype=dtype)
    y = run(sol, xs, CHUNK_KERNEL[dtype], (32, 5))
    assert rel_l2(y, ref64(xs)) <= TOL[dtype]
