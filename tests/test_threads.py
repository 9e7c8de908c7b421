"""Calls from a thread that has made no CUDA runtime call yet, as autograd's backward thread is: the TMA maps' driver
call (cuTensorMapEncodeTiled) needs a current context, which such a thread lacks until the call binds one (it failed
with "invalid argument" in chunk_bwd_sm90's checkpoint map when a process's first backward ran through autograd).
GPU (compute capability 9.0): the same bits on a fresh thread as on this one, for the bfloat16 and float32 forwards and
the backward that reads the forward's checkpoints."""
import threading

import pytest
import torch

import reference
from test_backward_sm90 import sm90
from test_forward_checkpoints import forward_ex, qualifying_shape


def on_a_new_thread(fn):
    """fn() on a thread of its own: its result, or the exception it raised."""
    box = {}

    def run():
        try:
            box["out"] = fn()
            torch.cuda.synchronize()
        except Exception as e:  # (handed back to the test)
            box["out"] = e

    th = threading.Thread(target=run)
    th.start()
    th.join()
    return box["out"]


@sm90
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
def test_forward(sol, dtype):
    xs = reference.make_inputs(2, 130, 3, 128, 128, dtype=dtype, device="cuda")
    here = sol.gated_recurrence(*xs)
    there = on_a_new_thread(lambda: sol.gated_recurrence(*xs))
    assert not isinstance(there, Exception), there
    assert torch.equal(here, there)


@sm90
def test_backward_with_the_forwards_checkpoints(sol):
    shape = qualifying_shape(T=130)
    B, T, H = shape[:3]
    xs = reference.make_inputs(B, T, H, 128, 128, dtype=torch.bfloat16, device="cuda")
    y, ck = forward_ex(sol, xs, None)
    assert ck.dtype == torch.float16, "the plan writes no 16-bit checkpoints at this shape"
    dy = torch.randn_like(y)
    backward = lambda: sol._call(sol._core.backward, dy, None, *xs, None, "", 0, ck)  # noqa: E731
    there = on_a_new_thread(backward)
    assert not isinstance(there, Exception), there
    for a, b in zip(backward()[:5], there[:5]):
        assert torch.equal(a, b)


@sm90
def test_autograd(sol):
    """The whole path: autograd's backward (its own thread) through the forward's checkpoints."""
    shape = qualifying_shape(T=130)
    B, T, H = shape[:3]
    leaves = [x.requires_grad_() for x in reference.make_inputs(B, T, H, 128, 128, dtype=torch.bfloat16,
                                                                  device="cuda")]
    y = sol.gated_recurrence(*leaves)
    grads = torch.autograd.grad(y, leaves, torch.randn_like(y))
    assert all(g is not None and torch.isfinite(g).all() for g in grads)
