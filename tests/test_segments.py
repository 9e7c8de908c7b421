"""Sequence parallelism (GPU): segments much longer than a chunk (the state phase walks many chunks a segment)
with gates whose products over a segment grow or vanish, and wide heads in several column tiles, every dtype,
against the float64 loop, with states in and out. The planned long-sequence paths run segments through the
chunk tests, the gate sweeps and the states tests."""
import pytest
import torch

from conftest import cuda
from helpers import CHUNK_KERNEL, DTYPE_IDS, DTYPES, STATE_TOL, TOL, inputs, ref64, rel_l2, run, strided_state

import naive


@cuda
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("gate", [None, 1.002, (0.9, 1.0), (-1.01, 1.01)], ids=["sigmoid", "above1", "near1", "mixed-sign"])
@pytest.mark.parametrize("segments", [1, 3], ids=["seg1", "seg3"])
def test_long_segments(sol, dtype, gate, segments):
    """(1, 2100, 2, 64, 40): 66 chunks of 32 steps walked in order, or 22 a segment, the last one ragged. A
    constant gate above 1 keeps every chunk's rounding in the state (fp32: it once grew to 2.2e-5)."""
    xs = inputs(1, 2100, 2, 64, 40, dtype=dtype, gate=gate)
    s0 = strided_state(1, 2, 64, 40)
    y, fin = run(sol, xs, CHUNK_KERNEL[dtype], (64, segments), initial_state=s0, output_final_state=True)
    ey, es = naive.recurrent_naive(*xs, initial_state=s0)
    assert rel_l2(y, ey) <= TOL[dtype] and rel_l2(fin, es) <= STATE_TOL[dtype]


@cuda
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_wide_heads_in_column_tiles(sol, dtype):
    """D_k = 200, D_v = 130: five column tiles of 32, the last one ragged, in seven segments of one chunk."""
    xs = inputs(1, 200, 1, 200, 130, dtype=dtype)
    y = run(sol, xs, CHUNK_KERNEL[dtype], (32, 7))
    assert rel_l2(y, ref64(xs)) <= TOL[dtype]
