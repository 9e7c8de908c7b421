"""CPU: the spec's loop (reference.Model) against an independent float64 closed form."""
import pytest
import torch

import reference
from helpers import inputs


def closed_form(q, k, v, gate, beta):
    """y_t = sum_{s<=t} (prod_{r=s+1..t} gate_r) beta_s (q_t . k_s) v_s, by explicit products."""
    B, T, H, _ = q.shape
    y = torch.zeros(B, T, H, v.shape[-1], dtype=torch.float64)
    for t in range(T):
        for s in range(t + 1):
            decay = torch.prod(gate[:, s + 1:t + 1], dim=1) if s < t else torch.ones(B, H, dtype=torch.float64)
            w = decay * beta[:, s] * (q[:, t] * k[:, s]).sum(-1)  # (B, H)
            y[:, t] += w.unsqueeze(-1) * v[:, s]
    return y


@pytest.mark.parametrize("gate", [None, 0.0, -0.7, 1.3, (-1.5, 1.5)], ids=["sigmoid", "zero", "negative", "above1", "mixed"])
@pytest.mark.parametrize("shape", [(1, 5, 1, 3, 3), (2, 7, 3, 4, 6), (1, 9, 2, 1, 1)], ids=["1x5x1x3", "2x7x3x4x6", "Dk1Dv1"])
def test_reference_matches_closed_form(shape, gate):
    xs = [x.double() for x in inputs(*shape, device="cpu", seed=1, gate=gate)]
    y = reference.Model()(*xs)
    torch.testing.assert_close(y, closed_form(*xs), rtol=1e-12, atol=1e-12)


def test_reference_empty_sequence():
    xs = inputs(2, 0, 3, 4, 5, device="cpu", seed=0)
    assert reference.Model()(*xs).shape == (2, 0, 3, 5)


def test_get_inputs_is_the_spec_shape():
    q, k, v, g, b = reference.get_inputs()
    assert q.shape == k.shape == v.shape == (2, 128, 4, 24) and g.shape == b.shape == (2, 128, 4)
    assert q.device.type == "cpu" and q.dtype == torch.float32 and reference.get_init_inputs() == []
    assert ((g > 0) & (g < 1)).all() and ((b > 0) & (b < 1)).all()
