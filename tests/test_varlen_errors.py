"""CPU: the variable-length arguments' checks: cu_seqlens (dtype, rank, entries, values), q's batch of one,
initial_state's (N, H, D_k, D_v), max_seqlen, cu_seqlens_cpu (dtype, shape, values, max_seqlen below its longest
sequence), the hints without cu_seqlens, the kernels that do not take cu_seqlens (parallel, chunk_sm90) and inputs
that require grad, each raising its exception naming the argument, with every tensor on the CPU (a CPU cu_seqlens
beside CPU inputs is on q's device, and its values are read where they lie); valid CPU arguments get as far as the
device check; plan(..., varlen=True). GPU (cuda mark): cu_seqlens on another device than q, cu_seqlens_cpu on the
GPU, a CUDA cu_seqlens' values checked through its host copy, and bad offsets under max_seqlen alone (unchecked)
staying in bounds."""
import re
import subprocess
import sys

import pytest
import torch

from conftest import ROOT, cuda
from helpers import CHUNK_KERNEL, SPEC, inputs, shape_id

H, DK, DV = 3, 4, 6
LENGTHS = [2, 0, 3]  # N = 3, T_total = 5
N, TOKENS = len(LENGTHS), sum(LENGTHS)
GOOD_CU = [0, 2, 2, 5]
NAMES = ["q", "k", "v", "gate", "beta"]
# the message names the argument (\b: cu_seqlens alone, not inside cu_seqlens_cpu)
CU, CU_CPU, MAX, STATE = r"\bcu_seqlens\b", r"\bcu_seqlens_cpu\b", r"\bmax_seqlen\b", r"\binitial_state\b"
DEVICE_CHECK = r"q must be a CUDA tensor"


def good(dtype=torch.float32, device="cpu"):
    """Valid packed inputs of LENGTHS: (1, 5, 3, 4) q and k, (1, 5, 3, 6) v, (1, 5, 3) gate and beta."""
    xs = inputs(1, TOKENS, H, DK, DV, device=device, seed=0)
    return [x.to(dtype) for x in xs]


def cu_of(values, dtype=torch.int64, device="cpu"):
    return torch.tensor(values, dtype=dtype, device=device)


def state(n=N, device="cpu"):
    return torch.zeros(n, H, DK, DV, device=device)


def call(sol, xs=None, **kwargs):
    """gated_recurrence on `xs` (good() by default) with cu_seqlens = GOOD_CU unless given."""
    kwargs.setdefault("cu_seqlens", cu_of(GOOD_CU))
    return sol.gated_recurrence(*(good() if xs is None else xs), **kwargs)


def message(excinfo):
    return str(excinfo.value)


# ---- cu_seqlens: dtype, rank, entries
CU_CASES = {
    "float32": (torch.tensor([0.0, 2.0, 2.0, 5.0]), TypeError),
    "float64": (torch.tensor([0.0, 2.0, 2.0, 5.0], dtype=torch.float64), TypeError),
    "int16": (cu_of(GOOD_CU, torch.int16), TypeError),
    "uint8": (cu_of(GOOD_CU, torch.uint8), TypeError),
    "bool": (torch.tensor([False, True, True, True]), TypeError),
    "row": (cu_of([GOOD_CU]), ValueError),  # (1, N + 1)
    "column": (cu_of([[c] for c in GOOD_CU]), ValueError),  # (N + 1, 1)
    "scalar": (cu_of(0), ValueError),
    "empty": (cu_of([]), ValueError),  # no entries: not even cu[0]
}


@pytest.mark.parametrize("case", list(CU_CASES))
def test_bad_cu_seqlens_tensor_raises_named_error(sol, case):
    """cu_seqlens not int32 / int64 (TypeError), not 1-D or without entries (ValueError), naming cu_seqlens."""
    cu, exc = CU_CASES[case]
    with pytest.raises(exc, match=CU):
        call(sol, cu_seqlens=cu)


# ---- cu_seqlens' values (no hint: read on the host, here where they lie)
VALUE_CASES = {
    "first-not-zero": [1, 2, 2, 5],
    "negative": [0, -1, 2, 5],
    "decreasing": [0, 3, 2, 5],
    "last-short": [0, 2, 2, 4],
    "last-past-tokens": [0, 2, 2, 6],
    "huge": [0, 2, 2, 2**31 - 1],
    "one-entry-with-tokens": [0],  # N = 0 claims no tokens, q has 5
}


@pytest.mark.parametrize("idx_dtype", [torch.int32, torch.int64], ids=["int32", "int64"])
@pytest.mark.parametrize("case", list(VALUE_CASES))
def test_bad_cu_seqlens_values_raise_named_error(sol, case, idx_dtype):
    """Without a hint the values are checked: cu[0] == 0, non-decreasing, cu[N] == T_total; ValueError naming
    cu_seqlens, also with output_final_state and through the test hook."""
    cu = cu_of(VALUE_CASES[case], idx_dtype)
    with pytest.raises(ValueError, match=CU):
        call(sol, cu_seqlens=cu)
    with pytest.raises(ValueError, match=CU):
        call(sol, cu_seqlens=cu, output_final_state=True)
    with pytest.raises(ValueError, match=CU):
        sol._gated_recurrence_with(*good(), kernel="recurrent", cu_seqlens=cu)


# Decreasing at index 4 (70 after 90) and again at index 6 (80 after 100); values that are no index.
TWICE_DECREASING = [0, 20, 40, 90, 70, 100, 80, 120]


@pytest.mark.parametrize("where", ["cu_seqlens", "cu_seqlens_cpu"])
@pytest.mark.parametrize("idx_dtype", [torch.int32, torch.int64], ids=["int32", "int64"])
def test_decreasing_offsets_name_the_first_bad_index(sol, idx_dtype, where):
    """The message names the argument and the first index whose entry is below the one before it (4, not 6)."""
    xs = inputs(1, 120, 1, DK, DV, device="cpu", seed=0)
    bad = cu_of(TWICE_DECREASING, idx_dtype)
    if where == "cu_seqlens":
        kwargs = {"cu_seqlens": bad}
    else:
        kwargs = {"cu_seqlens": cu_of([0, 20, 40, 60, 70, 80, 100, 120], idx_dtype), "cu_seqlens_cpu": bad}
    with pytest.raises(ValueError, match=rf"\b{where}\b") as excinfo:
        sol.gated_recurrence(*xs, **kwargs)
    assert re.search(r"\b4\b", message(excinfo)) and not re.search(r"\b6\b", message(excinfo)), message(excinfo)


# ---- q's batch and initial_state's shape
@pytest.mark.parametrize("B", [2, 0], ids=["B2", "B0"])
def test_batch_other_than_one_raises(sol, B):
    """Packed sequences share one batch row: q of batch 2 (or 0) with cu_seqlens is a ValueError mentioning
    cu_seqlens."""
    xs = inputs(B, TOKENS, H, DK, DV, device="cpu", seed=0)
    with pytest.raises(ValueError, match=CU):
        call(sol, xs)


STATE_CASES = {
    "dense-batch-of-one": (torch.zeros(1, H, DK, DV), ValueError),  # the dense (B, H, D_k, D_v) shape
    "one-too-many": (torch.zeros(N + 1, H, DK, DV), ValueError),
    "Dk-Dv-swapped": (torch.zeros(N, H, DV, DK), ValueError),
    "heads": (torch.zeros(N, H + 1, DK, DV), ValueError),
    "rank3": (torch.zeros(H, DK, DV), ValueError),
    "float64": (torch.zeros(N, H, DK, DV, dtype=torch.float64), TypeError),
}


@pytest.mark.parametrize("case", list(STATE_CASES))
def test_bad_initial_state_raises_named_error(sol, case):
    """initial_state must be float32 (N, H, D_k, D_v), N = len(cu_seqlens) - 1."""
    s0, exc = STATE_CASES[case]
    with pytest.raises(exc, match=STATE):
        call(sol, initial_state=s0, output_final_state=True)
    with pytest.raises(exc, match=STATE):
        call(sol, initial_state=s0, max_seqlen=3)


# ---- max_seqlen
@pytest.mark.parametrize("value,exc", [(-1, ValueError), (-(2**40), ValueError), (3.0, TypeError), (2.5, TypeError),
                                       ("3", TypeError)], ids=["minus-1", "very-negative", "float", "fraction", "str"])
def test_bad_max_seqlen_raises_named_error(sol, value, exc):
    """max_seqlen: an int >= 0 (or None)."""
    with pytest.raises(exc, match=MAX):
        call(sol, max_seqlen=value)
    with pytest.raises(exc, match=MAX):
        call(sol, max_seqlen=value, cu_seqlens_cpu=cu_of(GOOD_CU))


@pytest.mark.parametrize("value", [0, 2], ids=["zero", "one-short"])
def test_max_seqlen_below_the_cpu_copys_longest_raises(sol, value):
    """With cu_seqlens_cpu the longest sequence is known (3): a max_seqlen below it is a ValueError naming
    max_seqlen (alone it is only a planning hint, test_varlen's)."""
    with pytest.raises(ValueError, match=MAX):
        call(sol, max_seqlen=value, cu_seqlens_cpu=cu_of(GOOD_CU))


@pytest.mark.parametrize("hints", [{"max_seqlen": 3}, {"cu_seqlens_cpu": cu_of(GOOD_CU)},
                                   {"max_seqlen": 3, "cu_seqlens_cpu": cu_of(GOOD_CU)}],
                         ids=["max_seqlen", "cu_seqlens_cpu", "both"])
def test_hints_without_cu_seqlens_raise(sol, hints):
    """max_seqlen or cu_seqlens_cpu describe cu_seqlens: without it they are a ValueError naming cu_seqlens (a dense
    batch of one, otherwise valid, on both entry points)."""
    with pytest.raises(ValueError, match=CU):
        sol.gated_recurrence(*good(), **hints)
    with pytest.raises(ValueError, match=CU):
        sol._gated_recurrence_with(*good(), kernel="recurrent", **hints)


# ---- cu_seqlens_cpu
CPU_COPY_CASES = {
    "float32": (torch.tensor([0.0, 2.0, 2.0, 5.0]), TypeError),
    "int16": (cu_of(GOOD_CU, torch.int16), TypeError),
    "bool": (torch.tensor([False, True, True, True]), TypeError),
    "one-entry-more": (cu_of(GOOD_CU + [5]), ValueError),
    "one-entry-less": (cu_of(GOOD_CU[:-1]), ValueError),
    "row": (cu_of([GOOD_CU]), ValueError),
    "scalar": (cu_of(0), ValueError),
    # values (cu_seqlens itself is good): checked on the copy
    "first-not-zero": (cu_of([1, 2, 2, 5]), ValueError),
    "decreasing": (cu_of([0, 3, 2, 5]), ValueError),
    "last-short": (cu_of([0, 2, 2, 4]), ValueError),
    "last-past-tokens": (cu_of([0, 2, 2, 6]), ValueError),
}


@pytest.mark.parametrize("case", list(CPU_COPY_CASES))
def test_bad_cu_seqlens_cpu_raises_named_error(sol, case):
    """cu_seqlens_cpu: int32 / int64 (TypeError), cu_seqlens' shape and valid offsets (ValueError), naming
    cu_seqlens_cpu, with max_seqlen or without."""
    copy, exc = CPU_COPY_CASES[case]
    with pytest.raises(exc, match=CU_CPU):
        call(sol, cu_seqlens_cpu=copy)
    with pytest.raises(exc, match=CU_CPU):
        call(sol, cu_seqlens_cpu=copy, max_seqlen=5, output_final_state=True)


# ---- kernels that do not take cu_seqlens
@pytest.mark.parametrize("kernel", ["parallel"])
def test_kernels_without_varlen_refuse_cu_seqlens(sol, kernel):
    """parallel has no varlen path (its shared memory is sized by T): a ValueError mentioning cu_seqlens,
    before the device check, with or without hints."""
    xs = good()
    for hints in ({}, {"max_seqlen": 3}, {"cu_seqlens_cpu": cu_of(GOOD_CU)}):
        with pytest.raises(ValueError, match=CU):
            sol._gated_recurrence_with(*xs, kernel=kernel, cu_seqlens=cu_of(GOOD_CU), **hints)


# ---- gradients
@pytest.mark.parametrize("name", NAMES + ["initial_state"])
def test_inputs_that_require_grad_are_refused(sol, name):
    """No backward: an input or the initial state requiring grad is a NotImplementedError naming it (as on the dense
    path); under torch.no_grad() the same call gets to the device check."""
    xs, s0 = good(), state()
    (xs + [s0])[(NAMES + ["initial_state"]).index(name)].requires_grad_(True)
    with pytest.raises(NotImplementedError, match=rf"^{name} requires grad"):
        call(sol, xs, initial_state=s0, output_final_state=True)
    with pytest.raises(NotImplementedError, match=rf"^{name} requires grad"):
        call(sol, xs, initial_state=s0, max_seqlen=3)
    with torch.no_grad(), pytest.raises(ValueError, match=DEVICE_CHECK):
        call(sol, xs, initial_state=s0, output_final_state=True)


# ---- valid CPU arguments reach the device check
def bf16():
    return good(torch.bfloat16)


def empty_inputs():
    return inputs(1, 0, H, DK, DV, device="cpu", seed=0)


# (inputs or None for good(), keyword arguments, kernel or None for gated_recurrence, config)
VALID = {
    "int64": (None, {}, None, ()),
    "int32": (None, {"cu_seqlens": cu_of(GOOD_CU, torch.int32)}, None, ()),
    "max_seqlen": (None, {"max_seqlen": 3}, None, ()),
    "max_seqlen-too-small": (None, {"max_seqlen": 0}, None, ()),  # unchecked alone: a planning hint
    "max_seqlen-above": (None, {"max_seqlen": 1000}, None, ()),
    "cu_seqlens_cpu": (None, {"cu_seqlens_cpu": cu_of(GOOD_CU)}, None, ()),
    "cu_seqlens_cpu-int32": (None, {"cu_seqlens": cu_of(GOOD_CU, torch.int32),
                                    "cu_seqlens_cpu": cu_of(GOOD_CU, torch.int32)}, None, ()),
    "both-hints": (None, {"max_seqlen": 3, "cu_seqlens_cpu": cu_of(GOOD_CU)}, None, ()),
    "states": (None, {"initial_state": state(), "output_final_state": True}, None, ()),
    "strided-state": (None, {"initial_state": torch.zeros(N, H, DK, 2 * DV)[..., ::2]}, None, ()),
    "one-sequence": (None, {"cu_seqlens": cu_of([0, TOKENS]), "initial_state": state(1)}, None, ()),
    "all-length-one": (inputs(1, 3, H, DK, DV, device="cpu", seed=0), {"cu_seqlens": cu_of([0, 1, 2, 3])}, None, ()),
    "N0": (empty_inputs(), {"cu_seqlens": cu_of([0]), "initial_state": state(0), "output_final_state": True},
           None, ()),
    "all-empty": (empty_inputs(), {"cu_seqlens": cu_of([0, 0, 0]), "initial_state": state(2),
                                   "output_final_state": True}, None, ()),
    "reference-numerics": (bf16(), {"numerics": "reference"}, None, ()),
    "float32-gates": (bf16()[:3] + good()[3:], {}, None, ()),
    "recurrent": (None, {}, "recurrent", ()),
    "recurrent-config": (None, {}, "recurrent", (6, 8, 4, 8)),
    "recurrent-reference": (bf16(), {"numerics": "reference"}, "recurrent", ()),
    "chunked": (None, {"max_seqlen": 3}, "chunked", ()),
    "chunked-segments": (None, {}, "chunked", (64, 3)),
    "chunk_tf32": (None, {}, "chunk_tf32", (32, 1)),
    "chunk_tf32-fp16": ([x.half() for x in good()], {}, "chunk_tf32", (64, 2)),
    "chunk_bf16": (bf16(), {"cu_seqlens_cpu": cu_of(GOOD_CU)}, "chunk_bf16", (64, 1000)),
}


@pytest.mark.parametrize("case", list(VALID))
def test_valid_cpu_arguments_reach_the_device_check(sol, case):
    """Valid offsets (int32 or int64; lengths 0 and 1; N = 0), hints, states, numerics and kernels pass every check
    but the device's (the positive control of the cases above)."""
    xs, kwargs, kernel, config = VALID[case]
    kwargs = dict(kwargs)
    kwargs.setdefault("cu_seqlens", cu_of(GOOD_CU))
    xs = good() if xs is None else xs
    with pytest.raises(ValueError, match=DEVICE_CHECK):
        if kernel is None:
            sol.gated_recurrence(*xs, **kwargs)
        else:
            sol._gated_recurrence_with(*xs, kernel=kernel, config=config, **kwargs)


EMPTY_SCRIPT = """
import torch, solution
for N, T, H in [(0, 0, 3), (2, 300, 0), (0, 0, 0)]:
    print(solution.plan(N, T, H, 8, 5, varlen=True).split()[0], flush=True)
    xs = [torch.randn(1, T, H, 8), torch.randn(1, T, H, 8), torch.randn(1, T, H, 5), torch.rand(1, T, H),
          torch.rand(1, T, H)]
    cu = torch.tensor([0] if N == 0 else [0, 100, 300])
    for call in (lambda: solution.gated_recurrence(*xs, cu_seqlens=cu, output_final_state=True),
                 lambda: solution._gated_recurrence_with(*xs, kernel="chunked", config=(64, 4), cu_seqlens=cu,
                                                         max_seqlen=T, output_final_state=True)):
        try:
            call()
        except ValueError as e:
            print("ValueError:", e, flush=True)
"""


def test_no_sequences_or_no_heads_is_not_a_division_by_zero(sol):
    """N = 0 or H = 0: plan(varlen=True) answers and a call with states reaches the device check. In a subprocess
    (the dense path's bug of this kind was a SIGFPE)."""
    proc = subprocess.run([sys.executable, "-c", EMPTY_SCRIPT], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.splitlines()
    assert len(lines) == 9, proc.stdout
    assert all(ln in ("recurrent", "chunk_tf32") for ln in lines[0::3]), proc.stdout
    errors = [ln for i, ln in enumerate(lines) if i % 3]
    assert all(ln.startswith("ValueError: " + DEVICE_CHECK) for ln in errors), proc.stdout


# ---- plan(..., varlen=True)
VARLEN_KERNELS = ("recurrent", "chunk_tf32", "chunk_bf16", "chunk_sm90")
# (N, longest T, H, D_k, D_v): shapes the dense plan sends to parallel (SPEC, D_k >= T) and to chunk_sm90 (bf16,
# D = 128), single tokens, many sequences, one very long one, T = 0.
PLAN_SHAPES = [SPEC, (1, 1, 1, 1, 1), (9, 300, 2, 64, 64), (3, 63, 5, 33, 100), (1, 7, 1, 256, 7),
               (1, 255, 1, 256, 256), (8, 2048, 16, 128, 128), (64, 4096, 32, 128, 128), (1, 65536, 8, 128, 128),
               (512, 1, 32, 128, 128), (4, 0, 2, 8, 8)]
DTYPE_NAMES = ["float32", "float16", "bfloat16"]


@pytest.mark.parametrize("dtype", DTYPE_NAMES)
@pytest.mark.parametrize("shape", PLAN_SHAPES, ids=shape_id)
def test_varlen_plan_names_a_varlen_kernel(sol, shape, dtype):
    """A varlen plan says "varlen" and runs recurrent or the dtype's chunk kernel (chunk_tf32 for float32 and
    float16; bfloat16 chunk_sm90 where the dense plan of the same shape takes it, else chunk_bf16), never
    parallel; segment_scan exactly where it plans segments; a torch dtype or its name alike."""
    text = sol.plan(*shape, dtype, varlen=True)
    assert text == sol.plan(*shape, getattr(torch, dtype), varlen=True)
    assert "varlen" in text, text
    assert not re.search(r"\bparallel\b|PARALLEL_SRC", text), text
    kernel = text.split()[0]
    assert kernel in VARLEN_KERNELS, text
    if kernel == "chunk_sm90":
        assert dtype == "bfloat16" and sol.plan(*shape, dtype).startswith("chunk_sm90"), text
    elif kernel != "recurrent":
        assert kernel == CHUNK_KERNEL[getattr(torch, dtype)], text
        found = re.search(r"\bsegments=(\d+)", text)
        if found:
            assert ("segment_scan" in text) == (int(found.group(1)) > 1), text


@pytest.mark.parametrize("dtype", DTYPE_NAMES)
def test_varlen_plan_with_reference_numerics(sol, dtype):
    for shape in (SPEC, (8, 2048, 16, 128, 128)):
        text = sol.plan(*shape, dtype, numerics="reference", varlen=True)
        assert text.startswith("recurrent (RECURRENT_SRC, unit reference) ") and "varlen" in text, text


def test_dense_plan_is_unchanged(sol):
    """varlen=False is the default: the same text as before, with no "varlen" in it."""
    for shape in (SPEC, (8, 2048, 16, 128, 128), (1, 1, 1, 1, 1)):
        for dtype in DTYPE_NAMES:
            text = sol.plan(*shape, dtype)
            assert text == sol.plan(*shape, dtype, varlen=False) and "varlen" not in text, text


@pytest.mark.parametrize("shape,match", [((2, 10, 1, 257, 8), r"D_k"), ((2, 10, 1, 8, 300), r"D_v"),
                                         ((2, 10, 1, 0, 8), r"D_k")], ids=["Dk257", "Dv300", "Dk0"])
def test_varlen_plan_refuses_sizes_out_of_range(sol, shape, match):
    with pytest.raises(ValueError, match=match):
        sol.plan(*shape, varlen=True)


# ---- GPU: devices, the CUDA offsets' host check, bad offsets under max_seqlen
@cuda
@pytest.mark.parametrize("hints", [{}, {"max_seqlen": 3}], ids=["no-hint", "max_seqlen"])
def test_cu_seqlens_on_another_device_names_it(sol, hints):
    """CUDA inputs, cu_seqlens on the CPU: a ValueError naming cu_seqlens that points to cu_seqlens_cpu for a CPU
    copy."""
    with pytest.raises(ValueError, match=CU) as excinfo:
        sol.gated_recurrence(*good(device="cuda"), cu_seqlens=cu_of(GOOD_CU), **hints)
    assert "cu_seqlens_cpu" in message(excinfo), message(excinfo)


@cuda
def test_cu_seqlens_cpu_on_the_gpu_names_it(sol):
    with pytest.raises(ValueError, match=CU_CPU):
        sol.gated_recurrence(*good(device="cuda"), cu_seqlens=cu_of(GOOD_CU, device="cuda"),
                             cu_seqlens_cpu=cu_of(GOOD_CU, device="cuda"))


@cuda
@pytest.mark.parametrize("idx_dtype", [torch.int32, torch.int64], ids=["int32", "int64"])
@pytest.mark.parametrize("case", list(VALUE_CASES))
def test_cuda_offsets_are_checked_through_their_host_copy(sol, case, idx_dtype):
    """Without a hint a CUDA cu_seqlens is copied to the host once and checked: the same ValueErrors naming
    cu_seqlens as for a CPU one."""
    cu = cu_of(VALUE_CASES[case], idx_dtype, device="cuda")
    with pytest.raises(ValueError, match=CU):
        sol.gated_recurrence(*good(device="cuda"), cu_seqlens=cu, output_final_state=True)


# Bad offsets for 64 tokens: past the end, decreasing, negative, huge, a first entry not 0.
BAD_OFFSETS = {"past-the-end-int32": ([0, 10, 2**31 - 1], torch.int32), "decreasing": ([0, 50, 20, 64], torch.int64),
               "negative": ([0, -50, 64], torch.int32), "huge-int64": ([0, 2**40, 64], torch.int64),
               "first-not-zero": ([-7, 30, 64], torch.int64), "beyond-by-a-million": ([0, 64, 10**6 + 64], torch.int64)}


@cuda
@pytest.mark.parametrize("kernel,config", [(None, ()), ("recurrent", ()), ("chunked", (64, 3))],
                         ids=["planned", "recurrent", "chunked-seg3"])
@pytest.mark.parametrize("case", list(BAD_OFFSETS))
def test_unchecked_bad_offsets_stay_in_bounds(sol, case, kernel, config):
    """With only max_seqlen the device offsets are not checked: results are unspecified, but the call stays in
    bounds (the device synchronizes without an error, y and the final states have their shapes) and a good call
    afterwards is bitwise what it was before."""
    values, idx_dtype = BAD_OFFSETS[case]
    xs = inputs(1, 64, 2, 32, 32, dtype=torch.bfloat16, seed=0)
    s0 = torch.randn(len(values) - 1, 2, 32, 32, device="cuda")
    good_cu = torch.tensor([0, 10, 64], dtype=idx_dtype, device="cuda")
    hook = (lambda *a, **k: sol.gated_recurrence(*a, **k)) if kernel is None else \
        (lambda *a, **k: sol._gated_recurrence_with(*a, kernel=kernel, config=config, **k))
    before = hook(*xs, cu_seqlens=good_cu, max_seqlen=54, initial_state=s0[:2].contiguous(), output_final_state=True)
    y, final = hook(*xs, cu_seqlens=torch.tensor(values, dtype=idx_dtype, device="cuda"), max_seqlen=64,
                    initial_state=s0, output_final_state=True)
    torch.cuda.synchronize()
    assert y.shape == (1, 64, 2, 32) and final.shape == (len(values) - 1, 2, 32, 32)
    after = hook(*xs, cu_seqlens=good_cu, max_seqlen=54, initial_state=s0[:2].contiguous(), output_final_state=True)
    assert torch.equal(after[0], before[0]) and torch.equal(after[1], before[1])
