"""CPU: the float64 backward references (naive.py; training-design.md section 1) against autograd through the
loop, for every gate class (sigmoid, exact zeros, negative, above 1, near 1, zeros on chunk edges), with and
without initial state and final-state gradient, odd shapes and D_k != D_v; and the chunk equations equal to
the reverse loop for ragged and whole chunks. What a backward kernel (issue 15) will be checked against."""
import pytest
import torch

from helpers import inputs
from naive import chunked_backward_naive, recurrent_backward_naive, recurrent_naive

GATES = {"sigmoid": None, "zero": 0.0, "negative": -0.8, "above1": 1.05, "mixed": (-1.5, 1.5),
         "near1": (1 - 1e-4, 1 + 1e-4)}
NAMES = ("dq", "dk", "dv", "dgate", "dbeta", "d_initial_state")


def problem(T, Dk, Dv, gate, seed, B=2, H=2, zeros_at=()):
    """float64 leaves: q, k, v, gate, beta, S_0, and the loss weights dy (for y) and dS_T (for S_T)."""
    xs = [x.double() for x in inputs(B, T, H, Dk, Dv, device="cpu", seed=seed, gate=gate)]
    for t in zeros_at:
        if t < T:
            xs[3][:, t] = 0.0
    gen = torch.Generator().manual_seed(seed + 100)
    s0 = torch.randn(B, H, Dk, Dv, dtype=torch.float64, generator=gen)
    dy = torch.randn(B, T, H, Dv, dtype=torch.float64, generator=gen)
    dst = torch.randn(B, H, Dk, Dv, dtype=torch.float64, generator=gen)
    return xs, s0, dy, dst


def autograd_grads(xs, s0, dy, dst):
    """Gradients of <y, dy> + <S_T, dS_T> through recurrent_naive (None parts left out of the loss)."""
    leaves = [x.clone().requires_grad_() for x in xs] + ([s0.clone().requires_grad_()] if s0 is not None else [])
    y, sT = recurrent_naive(*leaves[:5], initial_state=leaves[5] if s0 is not None else None)
    loss = (y * dy).sum() + ((sT * dst).sum() if dst is not None else 0.0)
    grads = torch.autograd.grad(loss, leaves, allow_unused=True)
    return list(grads) + ([None] if s0 is None else [])


def assert_same(got, want, tol=1e-10):
    for name, g, w in zip(NAMES, got, want):
        if w is None:
            continue
        torch.testing.assert_close(g, w, rtol=tol, atol=tol, msg=lambda m: f"{name}: {m}")


@pytest.mark.parametrize("gate", list(GATES), ids=list(GATES))
@pytest.mark.parametrize("T,Dk,Dv", [(1, 7, 5), (63, 7, 5), (40, 33, 10), (17, 4, 9)], ids=["T1", "T63", "Dk33", "T17"])
@pytest.mark.parametrize("states", ["none", "initial", "both"])
def test_reverse_loop_equals_autograd(gate, T, Dk, Dv, states):
    xs, s0, dy, dst = problem(T, Dk, Dv, GATES[gate], seed=T + Dk)
    s0 = None if states == "none" else s0
    dst = dst if states == "both" else None
    got = recurrent_backward_naive(*xs, dy, initial_state=s0, d_final_state=dst)
    assert_same(got, autograd_grads(xs, s0, dy, dst))


@pytest.mark.parametrize("gate", list(GATES), ids=list(GATES))
@pytest.mark.parametrize("T,chunk", [(63, 32), (64, 32), (65, 32), (100, 16), (5, 8), (1, 4), (40, 1), (70, 64)],
                         ids=["63c32", "64c32", "65c32", "100c16", "5c8", "1c4", "40c1", "70c64"])
def test_chunk_equations_equal_the_reverse_loop(gate, T, chunk):
    xs, s0, dy, dst = problem(T, 6, 5, GATES[gate], seed=T)
    want = recurrent_backward_naive(*xs, dy, initial_state=s0, d_final_state=dst)
    got = chunked_backward_naive(*xs, dy, initial_state=s0, d_final_state=dst, chunk=chunk)
    assert_same(got, want, tol=1e-9)


@pytest.mark.parametrize("where", [(0,), (31, 32), (15, 16, 17), (63,)], ids=["first", "chunk-edge", "run", "last"])
def test_zero_gates_on_chunk_edges(where):
    """Exact zeros where the chunk tables start and end: the gate gradient there is nonzero and right
    (no quotient by the gate anywhere)."""
    xs, s0, dy, dst = problem(64, 5, 4, None, seed=7, zeros_at=where)
    want = autograd_grads(xs, s0, dy, dst)
    for got in (recurrent_backward_naive(*xs, dy, initial_state=s0, d_final_state=dst),
                chunked_backward_naive(*xs, dy, initial_state=s0, d_final_state=dst, chunk=16)):
        assert_same(got, want, tol=1e-9)
        assert all(got[3][:, t].abs().max() > 0 for t in where)


def test_empty_sequence_passes_the_final_gradient_through():
    xs, s0, dy, dst = problem(0, 3, 4, None, seed=1)
    for fn in (recurrent_backward_naive, lambda *a, **kw: chunked_backward_naive(*a, **kw, chunk=4)):
        out = fn(*xs, dy, initial_state=s0, d_final_state=dst)
        assert all(g.numel() == 0 for g in out[:5]) and torch.equal(out[5], dst)
