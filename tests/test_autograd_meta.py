"""CPU (CI has no GPU): the autograd glue on meta tensors, where the registered operators run their fake
implementations. Which outputs the loss uses (y, S_T, both), which inputs require grad, gradient dtypes and
shapes, float32 gates beside bfloat16, ModelNew, double backward refused, torch.compile of the loss (static
and dynamic shapes) with .backward() outside. The values are the GPU tests' (tests/test_backward.py)."""
import pytest
import torch

B, T, H, DK, DV = 2, 16, 3, 8, 6


def leaves(dtype=torch.float32, gate_dtype=None, requires=(True,) * 5):
    gate_dtype = gate_dtype or dtype
    xs = [torch.randn(B, T, H, DK, device="meta", dtype=dtype), torch.randn(B, T, H, DK, device="meta", dtype=dtype),
          torch.randn(B, T, H, DV, device="meta", dtype=dtype), torch.rand(B, T, H, device="meta", dtype=gate_dtype),
          torch.rand(B, T, H, device="meta", dtype=gate_dtype)]
    return [x.requires_grad_(r) for x, r in zip(xs, requires)]


def state():
    return torch.randn(B, H, DK, DV, device="meta", requires_grad=True)


def assert_like(grads, inputs):
    assert len(grads) == len(inputs)
    for g, x in zip(grads, inputs):
        assert g is not None and g.shape == x.shape and g.dtype == x.dtype and g.device == x.device, (g, x)


@pytest.mark.parametrize("loss", ["y", "final-state", "y-with-final-returned", "both"])
def test_gradients_for_every_loss(sol, loss):
    xs, s0 = leaves(), state()
    y, s_t = sol.gated_recurrence(*xs, initial_state=s0, output_final_state=True)
    out = {"y": y.sum(), "final-state": s_t.sum(), "y-with-final-returned": y.sum(), "both": y.sum() + s_t.sum()}[loss]
    assert y.grad_fn is not None and s_t.grad_fn is not None
    assert_like(torch.autograd.grad(out, xs + [s0]), xs + [s0])


def test_only_the_initial_state_requires_grad(sol):
    xs, s0 = leaves(requires=(False,) * 5), state()
    (g,) = torch.autograd.grad(sol.gated_recurrence(*xs, initial_state=s0).sum(), [s0])
    assert_like([g], [s0])


def test_gradient_dtypes_follow_each_input(sol):
    xs = leaves(torch.bfloat16, torch.float32)
    grads = torch.autograd.grad(sol.gated_recurrence(*xs).float().sum(), xs)
    assert [g.dtype for g in grads] == [torch.bfloat16] * 3 + [torch.float32] * 2
    assert_like(grads, xs)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_model_new_backward(sol, dtype):
    xs = leaves(dtype)
    sol.ModelNew()(*xs).float().sum().backward()
    assert_like([x.grad for x in xs], xs)


def test_double_backward_is_refused(sol):
    xs = leaves()
    grads = torch.autograd.grad(sol.gated_recurrence(*xs).sum(), xs, create_graph=True)
    with pytest.raises(NotImplementedError, match="no double backward"):
        torch.autograd.grad(grads[0].sum(), xs, allow_unused=True)


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
def test_compiled_loss_backward(sol, dynamic):
    """torch.compile(fullgraph=True) of the loss, .backward() outside; a second T reuses or recompiles."""
    torch._dynamo.reset()
    f = torch.compile(lambda *a: sol.gated_recurrence(*a).sum(), fullgraph=True, backend="aot_eager", dynamic=dynamic)
    for _ in range(2):
        xs = leaves()
        f(*xs).backward()
        assert_like([x.grad for x in xs], xs)
    torch._dynamo.reset()
