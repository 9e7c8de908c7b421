"""float32 gate and beta beside float16 / bfloat16 q, k, v (models keep their gates in float32): every kernel
the dispatch can pick reads them as float32 and computes as with 16-bit gates, y in q's dtype. GPU: bitwise
equal to the all-16-bit call where the float32 gates hold 16-bit values, near float64 where they do not,
gate classes and states. CPU: the dtype rules, numerics="reference" refusing mixed dtypes, ModelNew's choice."""
import pytest
import torch

from conftest import cuda
import naive
from helpers import GATE_IDS, GATES, SPEC, inputs, ref64, rel_l2, rounding_floor, run, shape_id, strided_state

LOW = [torch.float16, torch.bfloat16]
LOW_IDS = ["fp16", "bf16"]
# which float32 tensors: gate, beta or both
WIDE = {"gate": (3,), "beta": (4,), "both": (3, 4)}
# (kernel, config, shape): every kernel family the dispatch picks, with sequence parallelism in the chunk ones
CASES = [
    ("parallel", (), SPEC),                 # a compiled tile for 16-bit gates; float32 gates take the run-time one
    ("parallel", (), (1, 100, 2, 33, 20)),  # the run-time instantiation
    ("recurrent", (), (2, 63, 3, 24, 40)),
    ("chunked", (), (1, 300, 2, 64, 64)),
    ("chunked", (64, 3), (1, 700, 2, 64, 72)),
]
CASE_IDS = [f"{k}-{shape_id(s)}" + ("-seg" if c else "") for k, c, s in CASES]


def widen(xs, which):
    """xs with the chosen gate/beta as float32 holding the same (16-bit) values."""
    return [x.float() if i in WIDE[which] else x for i, x in enumerate(xs)]


@cuda
@pytest.mark.parametrize("which", list(WIDE))
@pytest.mark.parametrize("dtype", LOW, ids=LOW_IDS)
@pytest.mark.parametrize("kernel,config,shape", CASES, ids=CASE_IDS)
def test_float32_gates_equal_16bit_gates(sol, kernel, config, shape, dtype, which):
    """The same values in float32 give bitwise the same y (arithmetic is fp32 either way), but where 16-bit
    gates get a compiled parallel tile (planned for one dtype): there y is as near the float64 answer."""
    xs = inputs(*shape, dtype=dtype, gate=(-1.2, 1.2))
    want = run(sol, xs, kernel, config)
    got = run(sol, widen(xs, which), kernel, config)
    assert got.dtype == dtype
    if kernel == "parallel" and shape == SPEC:
        exact = ref64(xs)
        assert rel_l2(got, exact) <= 1.1 * max(rounding_floor(exact, dtype), rel_l2(want, exact))
    else:
        assert torch.equal(got, want)


@cuda
@pytest.mark.parametrize("dtype", LOW, ids=LOW_IDS)
@pytest.mark.parametrize("kernel,config,shape", CASES, ids=CASE_IDS)
def test_float32_gates_near_float64(sol, kernel, config, shape, dtype):
    """Gates and betas that 16 bits cannot hold: y as near its float64 answer as the same kernel gets with
    16-bit gates (the exact answer's own rounding; float16 on chunk_tf32 adds its single TF32 products)."""
    xs = inputs(*shape, dtype=torch.float32)
    xs = [x.to(dtype) for x in xs[:3]] + xs[3:]
    y = run(sol, xs, kernel, config)
    exact = ref64(xs)
    assert y.dtype == dtype and not torch.isnan(y).any()
    narrow = xs[:3] + [x.to(dtype) for x in xs[3:]]
    bar = max(rounding_floor(exact, dtype), rel_l2(run(sol, narrow, kernel, config), ref64(narrow)))
    assert rel_l2(y, exact) <= 1.1 * bar


@cuda
@pytest.mark.parametrize("gate", GATES, ids=GATE_IDS)
def test_float32_gate_classes(sol, gate):
    """0, negative, above 1, near 0 and 1 in float32 beside bf16 q, k, v, with states in and out."""
    xs = inputs(1, 130, 2, 64, 40, gate=gate)
    xs = [x.bfloat16() for x in xs[:3]] + xs[3:]
    s0 = strided_state(1, 2, 64, 40)
    y, fin = sol.gated_recurrence(*xs, initial_state=s0, output_final_state=True)
    ey, es = naive.recurrent_naive(*xs, initial_state=s0)
    assert rel_l2(y, ey) <= 1.1 * rounding_floor(ey, torch.bfloat16) + 1e-6
    assert rel_l2(fin, es) <= 1e-4


@cuda
def test_modelnew_uses_accurate_numerics_for_float32_gates(sol):
    """ModelNew's default: Model's loop in one 16-bit dtype is "reference", float32 gates are "accurate"."""
    xs = inputs(*SPEC, dtype=torch.bfloat16)
    mixed = widen(xs, "both")
    assert torch.equal(sol.ModelNew()(*mixed), sol.gated_recurrence(*mixed))
    assert torch.equal(sol.ModelNew()(*xs), sol.gated_recurrence(*xs, numerics="reference"))


@pytest.mark.parametrize("which", ["gate", "beta"])
def test_reference_numerics_refuses_float32_gates(sol, which):
    xs = widen(inputs(2, 5, 3, 4, dtype=torch.bfloat16, device="cpu"), which)
    with pytest.raises(ValueError, match=rf"{which} is float32 but q is bfloat16: numerics='reference'"):
        sol.gated_recurrence(*xs, numerics="reference")


@pytest.mark.parametrize("q_dtype,g_dtype", [(torch.bfloat16, torch.float16), (torch.float32, torch.bfloat16),
                                             (torch.float16, torch.float64)], ids=["f16-beside-bf16",
                                                                                   "bf16-beside-f32", "f64"])
def test_other_gate_dtypes_are_refused(sol, q_dtype, g_dtype):
    xs = inputs(2, 5, 3, 4, dtype=q_dtype, device="cpu")
    xs[3] = xs[3].to(g_dtype)
    with pytest.raises(TypeError, match=r"gate "):
        sol.gated_recurrence(*xs)


def test_mixed_dtypes_reach_the_device_check(sol):
    """float32 gates beside bf16 q, k, v pass the dtype rules (a CPU tensor is then the only complaint)."""
    xs = widen(inputs(2, 5, 3, 4, dtype=torch.bfloat16, device="cpu"), "both")
    with pytest.raises(ValueError, match=r"q must be a CUDA tensor"):
        sol.gated_recurrence(*xs)
