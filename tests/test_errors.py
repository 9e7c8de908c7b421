"""CPU: every bad input raises ValueError / TypeError naming the argument (checks run in C++,
dtypes and shapes before devices, so CPU tensors reach every shape check)."""
import pytest
import torch

from helpers import inputs

NAMES = ["q", "k", "v", "gate", "beta"]


def good():
    return inputs(2, 5, 3, 4, 6, device="cpu", seed=0)


def replaced(name, value):
    xs = good()
    xs[NAMES.index(name)] = value
    return xs


CASES = {
    "q-rank": (replaced("q", torch.randn(2, 5, 3)), ValueError, r"q must have 4 dimensions"),
    "k-rank": (replaced("k", torch.randn(2, 5, 3, 4, 1)), ValueError, r"k must have 4 dimensions"),
    "v-rank": (replaced("v", torch.randn(10, 3, 6)), ValueError, r"v must have 4 dimensions"),
    "gate-rank": (replaced("gate", torch.rand(2, 5, 3, 1)), ValueError, r"gate must have 3 dimensions"),
    "beta-rank": (replaced("beta", torch.rand(2, 5)), ValueError, r"beta must have 3 dimensions"),
    "k-shape": (replaced("k", torch.randn(2, 5, 3, 5)), ValueError, r"k must have the shape of q"),
    "v-batch": (replaced("v", torch.randn(3, 5, 3, 6)), ValueError, r"v must be \(B, T, H, D_v\)"),
    "v-time": (replaced("v", torch.randn(2, 4, 3, 6)), ValueError, r"v must be \(B, T, H, D_v\)"),
    "v-heads": (replaced("v", torch.randn(2, 5, 2, 6)), ValueError, r"v must be \(B, T, H, D_v\)"),
    "gate-shape": (replaced("gate", torch.rand(2, 5, 4)), ValueError, r"gate must be \(B, T, H\)"),
    "beta-shape": (replaced("beta", torch.rand(1, 5, 3)), ValueError, r"beta must be \(B, T, H\)"),
    "Dk-too-large": ([torch.randn(1, 2, 1, 257), torch.randn(1, 2, 1, 257), torch.randn(1, 2, 1, 3),
                      torch.rand(1, 2, 1), torch.rand(1, 2, 1)], ValueError, r"D_k must be in 1\.\.256"),
    "Dk-zero": ([torch.randn(1, 2, 1, 0), torch.randn(1, 2, 1, 0), torch.randn(1, 2, 1, 3),
                 torch.rand(1, 2, 1), torch.rand(1, 2, 1)], ValueError, r"D_k must be in 1\.\.256"),
    "Dv-too-large": (replaced("v", torch.randn(2, 5, 3, 300)), ValueError, r"D_v must be in 1\.\.256"),
    "q-int": (replaced("q", torch.ones(2, 5, 3, 4, dtype=torch.int32)), TypeError, r"q must be float32, float16 or bfloat16"),
    "gate-bool": (replaced("gate", torch.ones(2, 5, 3, dtype=torch.bool)), TypeError, r"gate must be float32"),
    "q-float64": ([x.double() for x in good()], TypeError, r"q must be float32, float16 or bfloat16"),
    "mixed-dtypes": (replaced("v", torch.randn(2, 5, 3, 6, dtype=torch.float16)), TypeError, r"v has dtype float16 but q has float32"),
    "beta-bf16": (replaced("beta", torch.rand(2, 5, 3, dtype=torch.bfloat16)), TypeError, r"beta has dtype bfloat16"),
    "cpu-tensors": (good(), ValueError, r"q must be a CUDA tensor"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_bad_input_raises_named_error(sol, case):
    xs, exc, pattern = CASES[case]
    with pytest.raises(exc, match=pattern):
        sol.gated_recurrence(*xs)


@pytest.mark.parametrize("value", [None, 3.0, [1.0]], ids=["None", "float", "list"])
def test_non_tensor_argument_is_a_type_error(sol, value):
    with pytest.raises(TypeError):
        sol.gated_recurrence(*replaced("gate", value))


@pytest.mark.parametrize("cfg,pattern", [((3, 8, 4, 8), "not a compiled pair"), ((4, 3, 4, 8), "not a compiled pair"),
                                         ((2, 1, 32, 8), "R \\* G must cover"), ((4, 8, 3, 8), "G \\* JB must be"),
                                         ((4, 8, 4, 10**6), "bytes of shared memory")],
                         ids=["R", "G", "cover", "JB", "TC"])
def test_bad_launch_configuration_is_a_value_error(sol, cfg, pattern):
    with pytest.raises(ValueError, match=pattern):
        sol.gated_recurrence_config(*good(), *cfg)


@pytest.mark.parametrize("algo,cfg,pattern", [
    ("chunk_v1", (48, 64, 1), "not compiled for chunk_v1"), ("chunk_v1", (64, 48, 1), "not compiled for chunk_v1"),
    ("chunk_v2", (64, 64, 1), "not compiled for chunk_v2"), ("chunk_v2", (32, 64, 0), "segments must be at least 1"),
    ("chunked", (32, 64), "config must be")], ids=["v1-C", "v1-NV", "v2-C", "segments", "length"])
def test_bad_chunk_configuration_is_a_value_error(sol, algo, cfg, pattern):
    with pytest.raises(ValueError, match=pattern):
        sol.gated_recurrence_with(*good(), algorithm=algo, config=cfg)


def test_chunk_configuration_over_shared_memory_is_a_value_error(sol):
    xs = inputs(1, 5, 1, 256, 64, device="cpu", seed=0)
    with pytest.raises(ValueError, match="bytes of shared memory"):
        sol.gated_recurrence_with(*xs, algorithm="chunk_v1", config=(64, 64, 1))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
def test_chunk_v3_refuses_other_dtypes(sol, dtype):
    with pytest.raises(TypeError, match="chunk_v3 takes bfloat16 inputs, got " + str(dtype).replace("torch.", "")):
        sol.gated_recurrence_with(*[x.to(dtype) for x in good()], algorithm="chunk_v3")


def test_unknown_algorithm_is_a_value_error(sol):
    with pytest.raises(ValueError, match="algorithm must be"):
        sol.gated_recurrence_with(*good(), algorithm="fast")


STATE_CASES = {
    "dtype": (torch.zeros(2, 3, 4, 6, dtype=torch.float64), TypeError, r"initial_state must be float32, got float64"),
    "shape": (torch.zeros(2, 3, 6, 4), ValueError, r"initial_state must be \(B, H, D_k, D_v\) = \(2, 3, 4, 6\)"),
    "rank": (torch.zeros(3, 4, 6), ValueError, r"initial_state must be \(B, H, D_k, D_v\)"),
}


@pytest.mark.parametrize("case", list(STATE_CASES))
def test_bad_initial_state_raises_named_error(sol, case):
    s0, exc, pattern = STATE_CASES[case]
    with pytest.raises(exc, match=pattern):
        sol.gated_recurrence(*good(), initial_state=s0, output_final_state=True)


def test_good_initial_state_on_cpu_reaches_the_device_check(sol):
    with pytest.raises(ValueError, match="q must be a CUDA tensor"):
        sol.gated_recurrence(*good(), initial_state=torch.zeros(2, 3, 4, 6), output_final_state=True)
