"""CPU: the chunkwise form (design of the chunked path) equals the loop, for every gate sign and
chunk boundary, with initial and final states; and the loop with no initial state is the spec."""
import pytest
import torch

import reference
from helpers import inputs
from naive import chunked_naive, recurrent_naive


@pytest.mark.parametrize("gate", [None, 0.0, -0.8, 1.1, (-1.5, 1.5)], ids=["sigmoid", "zero", "negative", "above1", "mixed"])
@pytest.mark.parametrize("T,chunk", [(63, 16), (64, 16), (5, 8), (1, 4), (40, 1)], ids=["63c16", "64c16", "5c8", "1c4", "40c1"])
def test_chunked_equals_loop(T, chunk, gate):
    xs = inputs(2, T, 3, 7, 5, device="cpu", seed=3, gate=gate)
    s0 = torch.randn(2, 3, 7, 5, dtype=torch.float64)
    y_ref, s_ref = recurrent_naive(*xs, initial_state=s0)
    y, s = chunked_naive(*xs, chunk=chunk, initial_state=s0)
    torch.testing.assert_close(y, y_ref, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(s, s_ref, rtol=1e-10, atol=1e-10)


def test_zero_gate_resets_exactly():
    xs = inputs(1, 12, 1, 4, 4, device="cpu", seed=0)
    xs[3][:, 6] = 0.0  # the state before step 6 is forgotten
    y, _ = chunked_naive(*xs, chunk=4)
    y_tail, _ = chunked_naive(*[x[:, 6:] for x in xs], chunk=4)
    torch.testing.assert_close(y[:, 6:], y_tail, rtol=0, atol=1e-12)


def test_loop_is_the_spec():
    xs = inputs(2, 20, 3, 6, 4, device="cpu", seed=1)
    torch.testing.assert_close(recurrent_naive(*xs)[0], reference.Model()(*[x.double() for x in xs]), rtol=1e-12, atol=1e-12)
