"""CPU (CI has no GPU): the autograd glue on meta tensors, where the registered operators run their fake
implementations. Which outputs the loss uses (y, S_T, both), which inputs require grad, gradient dtypes and
shapes, float32 gates beside bfloat16, ModelNew, double backward refused, torch.compile of the loss (static
and dynamic shapes) with .backward() outside. The values are the GPU tests' (tests/test_backward.py). Last,
the eager autograd.Function (_EagerGrad) with a stand-in core on CPU tensors (naive's float64 loop)."""
import pytest
import torch

import naive

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


# ---- the eager autograd.Function (_EagerGrad) with a stand-in core: the float64 loop on the CPU
class LoopCore:
    """forward_ex and backward as the pybind core answers them, computed by naive's float64 loop."""

    def forward_ex(self, q, k, v, g, b, s0, want_final, kernel, config, reference):
        y, s_t = naive.recurrent_naive(q, k, v, g, b, s0)
        return [y.to(q.dtype), s_t.float()] if want_final else [y.to(q.dtype)]

    def backward(self, dy, dfinal, q, k, v, g, b, s0, kernel, segments=0):
        out = naive.recurrent_backward_naive(q, k, v, g, b, dy, initial_state=s0, d_final_state=dfinal)
        return [o.to(x.dtype) for o, x in zip(out[:5], (q, k, v, g, b))] + \
            [out[5].float() if out[5] is not None else torch.empty(0)]


def cpu_leaves():
    gen = torch.Generator().manual_seed(0)
    xs = [torch.randn(B, T, H, DK, generator=gen), torch.randn(B, T, H, DK, generator=gen),
          torch.randn(B, T, H, DV, generator=gen), torch.rand(B, T, H, generator=gen), torch.rand(B, T, H, generator=gen),
          torch.randn(B, H, DK, DV, generator=gen)]
    return [x.requires_grad_() for x in xs]


@pytest.mark.parametrize("loss", ["y", "both", "final-state"])
def test_eager_function_gradients(sol, monkeypatch, loss):
    """_EagerGrad's plumbing: which outputs carry a gradient (None for an unused one), the state's, and the
    values against autograd through the float64 loop."""
    monkeypatch.setattr(sol, "_core", LoopCore())
    xs = cpu_leaves()
    want_final = loss != "y"
    out = sol._EagerGrad.apply(*xs, want_final, False, "", [])
    y, s_t = out if want_final else (out, None)
    value = {"y": lambda y, s: (y * y).sum(), "both": lambda y, s: (y * y).sum() + s.sum(),
             "final-state": lambda y, s: s.square().sum()}[loss]
    got = torch.autograd.grad(value(y, s_t), xs, allow_unused=True)
    l64 = [x.detach().double().requires_grad_() for x in xs]
    want = torch.autograd.grad(value(*naive.recurrent_naive(*l64)), l64, allow_unused=True)
    for name, a, b in zip(["q", "k", "v", "gate", "beta", "initial_state"], got, want):
        b = torch.zeros_like(a, dtype=torch.float64) if b is None else b  # (q does not reach S_T)
        assert a is not None and a.shape == b.shape, name
        assert torch.allclose(a.double(), b, rtol=1e-5, atol=1e-6), name


def test_eager_function_refuses_double_backward(sol, monkeypatch):
    monkeypatch.setattr(sol, "_core", LoopCore())
    xs = cpu_leaves()
    grads = torch.autograd.grad(sol._EagerGrad.apply(*xs, False, False, "", []).sum(), xs, create_graph=True)
    with pytest.raises(NotImplementedError, match="no double backward"):
        torch.autograd.grad(grads[0].sum(), xs, allow_unused=True)
