"""The registered operators (TORCH_LIBRARY in HOST_RUN_SRC) that torch.compile and torch.export trace:
a namespace from the core's hashed name, fake implementations (shapes and dtypes without running a
kernel), whole-graph tracing of ModelNew and gated_recurrence, and the error contract through them.
CPU: registration, fake propagation, tracing, errors. GPU: torch.library.opcheck, torch.compile
(fullgraph) against eager, CUDA-graph capture of the operator."""
import importlib.util
import os

import pytest
import torch

import reference
from conftest import cuda
from helpers import SPEC, inputs, strided_state

FP32, BF16 = torch.float32, torch.bfloat16


def ops_of(sol):
    return getattr(torch.ops, sol._OPS_NS)


def test_namespace_is_the_core_build_name(sol):
    name = os.path.basename(sol._unit_paths()["core"])[:-3]
    assert sol._OPS_NS == name.replace("gated_recurrence_core_", "gated_recurrence_") != name
    assert "forward(Tensor q, Tensor k, Tensor v, Tensor gate, Tensor beta, bool reference) -> Tensor" in \
        str(ops_of(sol).forward.default._schema)
    assert "Tensor? initial_state, bool want_final, str kernel, int[] config" in str(ops_of(sol).forward_ex.default._schema)


def test_a_second_load_of_the_file_keeps_working(sol, monkeypatch):
    """eval.py loads solution.py beside an imported copy, and a notebook re-runs an unchanged cell: the
    same namespace, its fake implementations registered again without an error."""
    real = torch.library.register_fake

    def as_in_torch_2_11(op, *args, allow_override=False, **kwargs):  # newer torch allows a second fake by default
        assert allow_override or not str(op).startswith(sol._OPS_NS), "a second load registers its fakes again"
        return real(op, *args, allow_override=allow_override, **kwargs)

    monkeypatch.setattr(torch.library, "register_fake", as_in_torch_2_11)
    spec = importlib.util.spec_from_file_location("solution_second_load", sol.__file__)
    again = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(again)
    assert again._OPS_NS == sol._OPS_NS
    sol._register_fake(f"{sol._OPS_NS}::forward")(sol._forward_fake)  # the session's fakes: this module's again
    sol._register_fake(f"{sol._OPS_NS}::forward_ex")(sol._forward_ex_fake)
    with torch._subclasses.fake_tensor.FakeTensorMode():
        q = torch.empty(2, 5, 3, 4)
        y = ops_of(sol).forward(q, q, torch.empty(2, 5, 3, 6), torch.empty(2, 5, 3), torch.empty(2, 5, 3), False)
    assert y.shape == (2, 5, 3, 6)


@pytest.mark.parametrize("dtype", [FP32, BF16], ids=["fp32", "bf16"])
def test_fake_implementations_give_shapes_and_dtypes(sol, dtype):
    from torch._subclasses.fake_tensor import FakeTensorMode
    xs = inputs(2, 50, 3, 24, 20, dtype=dtype, device="cpu")
    with FakeTensorMode() as mode:
        fx = [mode.from_tensor(x) for x in xs]
        y = ops_of(sol).forward(*fx, True)
        y2, s = ops_of(sol).forward_ex(*fx, None, True, "", [], False)
    assert y.shape == y2.shape == (2, 50, 3, 20) and y.dtype == y2.dtype == dtype
    assert s.shape == (2, 3, 24, 20) and s.dtype == FP32


@pytest.mark.parametrize("dtype,numerics", [(FP32, False), (BF16, True)], ids=["fp32-accurate", "bf16-reference"])
def test_export_traces_model_new_to_the_operator(sol, dtype, numerics):
    """torch.export (fake tensors, no kernel runs) of ModelNew: one call of the operator, with Model's
    numerics for the dtype."""
    xs = inputs(*SPEC, dtype=dtype, device="cpu")
    ep = torch.export.export(sol.ModelNew(), tuple(xs))
    calls = [n for n in ep.graph.nodes if n.op == "call_function"]
    assert [str(n.target) for n in calls] == [f"{sol._OPS_NS}.forward.default"]
    assert calls[0].args[-1] is numerics


def test_dynamo_traces_whole_graphs(sol):
    """torch.compile(fullgraph=True) traces gated_recurrence without a graph break, states included (a
    recording backend: nothing runs on this CPU)."""
    graphs = []

    def recording(gm, example_inputs):
        graphs.append([str(n.target) for n in gm.graph.nodes if n.op == "call_function"])
        return lambda *args: (torch.zeros(2, 128, 4, 24), torch.zeros(2, 4, 24, 24))[:1 if len(graphs) == 1 else 2]

    xs = inputs(*SPEC, device="cpu")
    torch.compile(sol.ModelNew(), fullgraph=True, backend=recording)(*xs)
    s0 = torch.zeros(2, 4, 24, 24)
    torch.compile(lambda *x: sol.gated_recurrence(*x, initial_state=s0, output_final_state=True),
                  fullgraph=True, backend=recording)(*xs)
    assert graphs[0] == [f"{sol._OPS_NS}.forward"]
    assert f"{sol._OPS_NS}.forward_ex" in graphs[1]


def test_errors_keep_their_contract_through_the_operator(sol):
    ops = ops_of(sol)
    xs = inputs(*SPEC, device="cpu")
    with pytest.raises(ValueError, match="^k must have the shape of q"):
        ops.forward(xs[0], xs[1][:, :5], *xs[2:], False)
    with pytest.raises(TypeError, match="^gate must be float32, float16 or bfloat16, got int32"):
        ops.forward(*xs[:3], xs[3].int(), xs[4], False)
    with pytest.raises(ValueError, match="^q must be a CUDA tensor, got a tensor on cpu"):
        ops.forward(*xs, False)
    with pytest.raises(ValueError, match="numerics='reference' runs the recurrent kernel only"):
        ops.forward_ex(*xs, None, False, "parallel", [], True)
    xs[2].requires_grad_(True)  # differentiable (issue 15): the same device check as without grad
    with pytest.raises(ValueError, match="^q must be a CUDA tensor, got a tensor on cpu"):
        ops.forward(*xs, False)


def test_traced_calls_check_argument_types(sol):
    xs = inputs(*SPEC, device="cpu")
    with pytest.raises(TypeError, match="^gate must be a torch.Tensor, got float"):
        sol._traced_call(*xs[:3], 0.9, xs[4], None, False, "accurate")
    with pytest.raises(TypeError, match="^initial_state must be a torch.Tensor, got list"):
        sol._traced_call(*xs, [0.0], True, "accurate")
    with pytest.raises(ValueError, match="numerics must be"):
        sol._traced_call(*xs, None, False, "fast")


# ---- GPU
@cuda
@pytest.mark.parametrize("dtype,reference_numerics,wide_gates", [(FP32, False, False), (BF16, False, False),
                                                                 (BF16, True, False), (BF16, False, True)],
                         ids=["fp32", "bf16", "bf16-reference", "bf16-float32-gates"])
def test_opcheck(sol, dtype, reference_numerics, wide_gates):
    """opcheck calls the operator eagerly first; a direct call does not build units (its error says which
    to build; gated_recurrence and traced calls build them), so the reference unit is built here."""
    if reference_numerics:
        sol.build("reference")
    ops = ops_of(sol)
    xs = inputs(2, 40, 3, 24, 20, dtype=dtype)
    if wide_gates:
        xs[3:] = [x.float() for x in xs[3:]]
    torch.library.opcheck(ops.forward.default, (*xs, reference_numerics))
    s0 = strided_state(2, 3, 24, 20)
    torch.library.opcheck(ops.forward_ex.default, (*xs, s0, True, "", [], reference_numerics))


@cuda
def test_operators_record_autograd(sol):
    """forward and forward_ex are differentiable (issue 15): with an input that requires grad their outputs carry
    a grad_fn, the values those of the same call without grad."""
    ops = ops_of(sol)
    xs = inputs(*SPEC)
    s0 = strided_state(2, 4, 24, 24)
    want = ops.forward(*xs, False)
    want_ex = ops.forward_ex(*xs, s0, True, "", [], False)
    xs[2].requires_grad_(True)
    y = ops.forward(*xs, False)
    assert y.grad_fn is not None and torch.equal(y.detach(), want)
    s0.requires_grad_(True)
    out = ops.forward_ex(*xs, s0, True, "", [], False)
    assert all(o.grad_fn is not None for o in out)
    assert all(torch.equal(o.detach(), w) for o, w in zip(out, want_ex))


@cuda
@pytest.mark.parametrize("shape,dtype", [(SPEC, FP32), (SPEC, BF16), ((1, 300, 2, 64, 64), FP32),
                                         ((1, 300, 2, 64, 64), BF16)],
                         ids=["spec-fp32", "spec-bf16-reference", "chunk-fp32", "chunk-bf16-reference"])
def test_compile_fullgraph_equals_eager(sol, shape, dtype):
    xs = inputs(*shape, dtype=dtype)
    compiled = torch.compile(sol.ModelNew(), fullgraph=True)
    assert torch.equal(compiled(*xs), sol.ModelNew()(*xs))
    acc = torch.compile(lambda *x: sol.gated_recurrence(*x), fullgraph=True)
    assert torch.equal(acc(*xs), sol.gated_recurrence(*xs))


@cuda
def test_compile_with_states_equals_eager(sol):
    xs = inputs(2, 70, 3, 33, 20)
    s0 = strided_state(2, 3, 33, 20)
    fn = torch.compile(lambda *x: sol.gated_recurrence(*x, initial_state=s0, output_final_state=True), fullgraph=True)
    y, s = fn(*xs)
    ey, es = sol.gated_recurrence(*xs, initial_state=s0, output_final_state=True)
    assert torch.equal(y, ey) and torch.equal(s, es)


@cuda
def test_operator_in_a_cuda_graph(sol):
    ops = ops_of(sol)
    xs = inputs(*SPEC)
    ops.forward(*xs, False)  # warm-up outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = ops.forward(*xs, False)
    for seed in (1, 2):
        fresh = inputs(*SPEC, seed=seed)
        for x, f in zip(xs, fresh):
            x.copy_(f)
        graph.replay()
        assert torch.equal(y, sol.gated_recurrence(*fresh))


def test_autocast_leaves_the_inputs_alone(sol):
    """Under torch.autocast the operator runs in the dtype of its inputs: no autocast kernel is registered,
    so nothing casts them (traced here under CPU autocast: no cast in the graph, a float32 result)."""
    xs = inputs(*SPEC, device="cpu")
    with torch.autocast("cpu", dtype=BF16):
        ep = torch.export.export(sol.ModelNew(), tuple(xs))
    calls = [n for n in ep.graph.nodes if n.op == "call_function"]
    assert [str(n.target) for n in calls] == [f"{sol._OPS_NS}.forward.default"]
    assert calls[0].meta["val"].dtype == FP32
