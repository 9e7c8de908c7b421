"""CPU: every bad input raises ValueError / TypeError naming the argument (checks run in C++,
dtypes and shapes before devices, so CPU tensors reach every shape check)."""
import subprocess
import sys

import pytest
import torch

from conftest import HAS_CUDA, ROOT, cuda
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


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("value,type_name", [(None, "NoneType"), (0.9, "float"), ([1.0], "list")],
                         ids=["None", "float", "list"])
def test_non_tensor_argument_is_a_type_error_naming_it(sol, name, value, type_name):
    """One line naming the argument and what it got, on every entry point (not pybind's list of every
    argument printed in full)."""
    message = rf"^{name} must be a torch\.Tensor, got {type_name}$"
    with pytest.raises(TypeError, match=message):
        sol.gated_recurrence(*replaced(name, value))
    with pytest.raises(TypeError, match=message):
        sol.gated_recurrence(*replaced(name, value), output_final_state=True)
    with pytest.raises(TypeError, match=message):
        sol.ModelNew()(*replaced(name, value))


@pytest.mark.parametrize("value,type_name", [(0.5, "float"), ([[0.0]], "list")], ids=["float", "list"])
def test_initial_state_must_be_a_tensor_or_none(sol, value, type_name):
    with pytest.raises(TypeError, match=rf"^initial_state must be a torch\.Tensor, got {type_name}$"):
        sol.gated_recurrence(*good(), initial_state=value)


BF16 = [x.to(torch.bfloat16) for x in good()]


def cpu_inputs(T, Dk, Dv):
    return inputs(1, T, 1, Dk, Dv, device="cpu", seed=0)


# (kernel, inputs, config, exception, message): every check runs before the device check.
CONFIG_CASES = {
    "R": ("recurrent", good(), (3, 8, 4, 8), ValueError, r"not a compiled pair"),
    "G": ("recurrent", good(), (4, 3, 4, 8), ValueError, r"not a compiled pair"),
    "R4G8-dropped": ("recurrent", good(), (4, 8, 4, 8), ValueError, r"not a compiled pair"),
    "cover": ("recurrent", good(), (2, 1, 32, 8), ValueError, r"R \* G must cover D_k"),
    "JB": ("recurrent", good(), (6, 8, 3, 8), ValueError, r"G \* JB must be a multiple of 32"),
    "JB-over-256": ("recurrent", good(), (8, 32, 16, 8), ValueError, r"G \* JB must be a multiple of 32"),
    "TC": ("recurrent", good(), (6, 8, 4, 10**6), ValueError, r"TC=1000000\b"),
    "TC-zero": ("recurrent", good(), (6, 8, 4, 0), ValueError, r"TC=0\b"),
    "recurrent-length": ("recurrent", good(), (6, 8, 4), ValueError, r"config must be"),
    "chunked-length": ("chunked", good(), (64,), ValueError, r"config must be"),
    "tf32-old-3-tuple": ("chunk_tf32", good(), (32, 64, 4), ValueError, r"config must be"),
    "bf16-length": ("chunk_bf16", BF16, (64, 1, 1, 1), ValueError, r"config must be"),
    "tf32-NV48": ("chunk_tf32", good(), (48, 1), ValueError, r"NV must be 32 or 64"),
    "tf32-NV128": ("chunk_tf32", good(), (128, 1), ValueError, r"NV must be 32 or 64"),
    "bf16-NV16": ("chunk_bf16", BF16, (16, 1), ValueError, r"NV must be 32 or 64"),
    "chunked-NV0": ("chunked", good(), (0, 1), ValueError, r"NV must be 32 or 64"),
    "tf32-segments": ("chunk_tf32", good(), (64, 0), ValueError, r"segments must be at least 1"),
    "bf16-segments": ("chunk_bf16", BF16, (32, -2), ValueError, r"segments must be at least 1"),
    "tf32-bf16-inputs": ("chunk_tf32", BF16, (), TypeError,
                         r"chunk_tf32 takes float32 or float16 inputs, got bfloat16"),
    "bf16-fp32-inputs": ("chunk_bf16", good(), (), TypeError, r"chunk_bf16 takes bfloat16 inputs, got float32"),
    "bf16-fp16-inputs": ("chunk_bf16", [x.half() for x in good()], (64, 1), TypeError,
                         r"chunk_bf16 takes bfloat16 inputs, got float16"),
    "parallel-length": ("parallel", good(), (32, 1), ValueError, r"config must be \(NV,\) for parallel, got 2"),
    "parallel-recurrent-config": ("parallel", good(), (6, 8, 4, 8), ValueError, r"config must be \(NV,\) for parallel"),
    "parallel-NV12": ("parallel", good(), (12,), ValueError, r"NV must be a multiple of 8 in 8\.\.256, got 12"),
    "parallel-NV264-bf16": ("parallel", BF16, (264,), ValueError, r"NV must be a multiple of 8 in 8\.\.256"),
    "parallel-T257": ("parallel", cpu_inputs(257, 8, 8), (), ValueError, r"parallel serves T up to 256, got 257"),
    "parallel-T300-NV32": ("parallel", cpu_inputs(300, 8, 8), (32,), ValueError, r"parallel serves T up to 256"),
    "parallel-smem-nv32": ("parallel", cpu_inputs(256, 169, 32), (32,), ValueError,
                           r"parallel with NV=32, D_k=169 and T=256 needs \d+ bytes of shared memory"),
    "parallel-smem-nv64": ("parallel", cpu_inputs(256, 137, 64), (64,), ValueError,
                           r"parallel with NV=64, D_k=137 and T=256 needs \d+ bytes of shared memory"),
    "parallel-smem-planned": ("parallel", cpu_inputs(255, 256, 256), (), ValueError, r"shared memory"),
}


@pytest.mark.parametrize("case", list(CONFIG_CASES))
def test_bad_kernel_or_configuration_raises_named_error(sol, case):
    kernel, xs, cfg, exc, pattern = CONFIG_CASES[case]
    with pytest.raises(exc, match=pattern):
        sol._gated_recurrence_with(*xs, kernel=kernel, config=cfg)


@pytest.mark.parametrize("kernel", ["fast", "chunk_v1", "chunk_v2", "recurrent_v1", "segment_scan"])
def test_unknown_kernel_is_a_value_error(sol, kernel):
    with pytest.raises(ValueError, match="kernel must be one of"):
        sol._gated_recurrence_with(*good(), kernel=kernel)


LARGEST = [("chunk_tf32", torch.float32, (5, 256, 64), (64, 1000)),
           ("chunk_bf16", torch.bfloat16, (5, 256, 64), (64, 1000)),
           ("parallel", torch.float32, (256, 128, 32), (32,)), ("parallel", torch.bfloat16, (256, 80, 64), (64,))]


@pytest.mark.parametrize("kernel,dtype,size,config", LARGEST,
                         ids=["chunk_tf32", "chunk_bf16", "parallel-nv32-dk128", "parallel-nv64-dk80"])
def test_largest_configuration_passes_the_checks(sol, kernel, dtype, size, config):
    """The largest staging that fits an H200's shared memory (the limits plan() uses without a device):
    D_k = 256 with NV = 64 for the chunk kernels, T = 256 with D_k = 128 (NV = 32) or 80 (NV = 64) for
    parallel (one more D_k is over: CONFIG_CASES). The call gets as far as the device check."""
    if HAS_CUDA and torch.cuda.get_device_properties(0).shared_memory_per_block_optin < 227 * 1024:
        pytest.skip("a device with less shared memory per block than an H200")
    T, Dk, Dv = size
    with pytest.raises(ValueError, match="q must be a CUDA tensor"):
        sol._gated_recurrence_with(*inputs(1, T, 1, Dk, Dv, dtype=dtype, device="cpu", seed=0), kernel=kernel,
                                   config=config)


EMPTY_SCRIPT = """
import torch, solution
for B, H in [(0, 3), (2, 0)]:
    print(solution.plan(B, 300, H, 8, 5).split()[0], flush=True)
    xs = [torch.randn(B, 300, H, 8), torch.randn(B, 300, H, 8), torch.randn(B, 300, H, 5), torch.rand(B, 300, H),
          torch.rand(B, 300, H)]
    for call in (lambda: solution.gated_recurrence(*xs, output_final_state=True),
                 lambda: solution._gated_recurrence_with(*xs, kernel="chunk_tf32", config=(64, 4))):
        try:
            call()
        except ValueError as e:
            print("ValueError:", e, flush=True)
"""


def test_empty_batch_or_heads_is_not_a_division_by_zero(sol):
    """B = 0 or H = 0 (zero column tiles to share the GPU among): plan() answers and a call with states
    reaches the device check. In a subprocess: the bug this guards against was a SIGFPE."""
    proc = subprocess.run([sys.executable, "-c", EMPTY_SCRIPT], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.splitlines()
    assert lines[0::3] == ["chunk_tf32"] * 2, proc.stdout
    errors = [ln for i, ln in enumerate(lines) if i % 3]
    assert len(errors) == 4 and all(ln.startswith("ValueError: q must be a CUDA tensor") for ln in errors), proc.stdout


@cuda
def test_device_mismatch_names_argument(sol):
    xs = inputs(1, 4, 1, 8)
    xs[2] = xs[2].cpu()
    with pytest.raises(ValueError, match=r"\bv is on cpu"):
        sol.gated_recurrence(*xs)


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
