"""Packed variable-length sequences (cu_seqlens): q, k (1, T_total, H, D_k), v (1, T_total, H, D_v), gate, beta
(1, T_total, H); sequence n is rows cu[n]:cu[n+1], from initial_state[n] or zero, the state reset exactly at every
boundary. GPU: every dtype and kernel (planned, recurrent, chunked with and without segments) against the float64
loop run on each sequence alone; bitwise equal to dense calls per sequence of the same kernel and configuration;
reference numerics as the loop in the inputs' dtype; the host hints (none, max_seqlen, cu_seqlens_cpu) alike, int32
and int64 offsets, a strided cu_seqlens; a sequence holding NaN or inf leaves the others alone; gate classes on
segments; the same sequence anywhere in the pack gives the same bits; strided inputs and float32 gates; no host
synchronization with a hint; N = 0 and all-empty sequences; torch.compile. CPU: dynamo traces a varlen call whole
(the fake implementation's shapes). (Argument checks and plan(varlen=True) are test_varlen_errors'.)"""
import itertools
import random
from functools import lru_cache

import pytest
import torch

import naive
from conftest import cuda
from helpers import (CHUNK_KERNEL, DTYPE_IDS, DTYPES, GATE_IDS, GATES, LAYOUTS, STATE_TOL, TOL, inputs,
                     poison_allocator, rel_l2, run, views)

FP32, FP16, BF16 = torch.float32, torch.float16, torch.bfloat16
NAN, INF = float("nan"), float("inf")

# N = 9, T_total = 497: lengths 0 (first, inside and last), 1, 31, 32, 33 around a chunk of 32, 100 and 300
# (ten chunks, the last one ragged), shuffled.
LENGTHS = [0, 33, 300, 1, 32, 0, 100, 31, 0]
LONGEST = max(LENGTHS)
# (H, D_k, D_v): the generic chunk instantiation with D_k != D_v and two column tiles of 32; the compiled D_k = 64
# and 128 instantiations (NV = 64, 16-byte rows).
HEADS = [(3, 33, 40), (2, 64, 64), (2, 128, 128)]
HEAD_IDS = ["H3-33x40", "H2-64x64", "H2-128x128"]
# One compiled (R, G, JB, TC) of the recurrent kernel for each D_k above: R * G covers D_k, G * JB a multiple of 32.
RECURRENT_CONFIG = {33: (6, 8, 32, 10), 64: (8, 8, 4, 13), 128: (8, 16, 16, 5)}
# (id, kernel, segments): None is the planned path; "chunked" the dtype's chunk kernel with (NV, segments).
KERNEL_CASES = [("planned", None, None), ("recurrent", "recurrent", None), ("chunked-seg1", "chunked", 1),
                ("chunked-seg3", "chunked", 3)]
KERNEL_IDS = [c[0] for c in KERNEL_CASES]


# ---- helpers
def offsets(lengths, dtype=torch.int32, device="cuda"):
    """cu_seqlens of `lengths`: [0, l0, l0 + l1, ...]."""
    return torch.tensor([0] + list(itertools.accumulate(lengths)), dtype=dtype, device=device)


def spans(lengths):
    """(start, end) of each sequence's rows."""
    ends = list(itertools.accumulate(lengths))
    return [(e - n, e) for n, e in zip(lengths, ends)]


def packed(lengths, H, Dk, Dv, dtype, seed=0, gate=None):
    """Inputs of one packed row of sum(lengths) tokens."""
    return inputs(1, sum(lengths), H, Dk, Dv, dtype=dtype, seed=seed, gate=gate)


def states_of(N, H, Dk, Dv, seed=0):
    """A strided (every other column) float32 (N, H, D_k, D_v) initial state."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(N, H, Dk, 2 * Dv, generator=gen).cuda()[..., ::2]


def nv_for(Dv):
    return 32 if Dv < 64 else 64


def config_of(segments, Dv):
    """The forced configuration: the plan's (()) without segments, else (NV, segments) for the chunk kernels."""
    return () if segments is None else (nv_for(Dv), segments)


def varlen(sol, xs, cu, kernel=None, config=(), **kwargs):
    """gated_recurrence with cu_seqlens (the test hook when a kernel or configuration is chosen)."""
    return run(sol, xs, kernel, config, cu_seqlens=cu, **kwargs)


def per_sequence(xs, lengths, s0=None):
    """The float64 loop run on each sequence's rows alone from its own initial state (s0[n] or zero): y (1, T_total,
    H, D_v) and the final states (N, H, D_k, D_v), float64."""
    H, Dk, Dv = xs[0].shape[2], xs[0].shape[3], xs[2].shape[3]
    ys, finals = [], []
    for n, (a, b) in enumerate(spans(lengths)):
        y, s = naive.recurrent_naive(*[x[:, a:b] for x in xs], initial_state=None if s0 is None else s0[n:n + 1])
        ys.append(y)
        finals.append(s)
    y = torch.cat(ys, 1) if ys else torch.zeros(1, 0, H, Dv, dtype=torch.float64, device=xs[0].device)
    final = torch.cat(finals, 0) if finals else torch.zeros(0, H, Dk, Dv, dtype=torch.float64, device=xs[0].device)
    return y, final


def bits(x):
    return x.view(torch.int32) if x.dtype == FP32 else x.view(torch.int16)


def same_bits(a, b):
    """Bitwise equal, NaN payloads and signed zeros included."""
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(bits(a), bits(b))


def check_result(y, final, xs, lengths, s0, ry, rs, state_tol=None):
    """Shapes, dtypes, device; y fully written (no NaN on a poisoned allocator) and near the float64 loop over all
    tokens and sequence by sequence (TOL), the final states likewise (STATE_TOL); a length-0 sequence's final state
    its initial one exactly (zeros without one)."""
    dtype = xs[0].dtype
    N, H, Dk, Dv = len(lengths), xs[0].shape[2], xs[0].shape[3], xs[2].shape[3]
    state_tol = state_tol or STATE_TOL[dtype]
    assert y.shape == (1, sum(lengths), H, Dv) and y.dtype == dtype and y.is_cuda
    assert final.shape == (N, H, Dk, Dv) and final.dtype == FP32 and final.is_cuda
    assert not torch.isnan(y).any(), "unwritten or NaN output"
    assert not torch.isnan(final).any(), "NaN final state"
    if y.numel():
        err = rel_l2(y, ry)
        assert err <= TOL[dtype], f"rel-L2 {err:.3e}"
    err = rel_l2(final, rs)
    assert err <= state_tol, f"final state rel-L2 {err:.3e}"
    for n, (a, b) in enumerate(spans(lengths)):
        if a == b:
            want = torch.zeros_like(final[n]) if s0 is None else s0[n]
            assert torch.equal(final[n], want), f"sequence {n} (length 0): final state is not the initial one"
            continue
        err = rel_l2(y[:, a:b], ry[:, a:b])
        assert err <= TOL[dtype], f"sequence {n} (length {b - a}): rel-L2 {err:.3e}"
        err = rel_l2(final[n], rs[n])
        assert err <= state_tol, f"sequence {n} (length {b - a}): final state rel-L2 {err:.3e}"


@lru_cache(maxsize=None)
def reference_case(dtype, H, Dk, Dv, states, lengths=tuple(LENGTHS), seed=0, gate=None):
    """Inputs, initial state (or None) and the per-sequence float64 answer, built once per session for the tests
    that share them."""
    xs = packed(lengths, H, Dk, Dv, dtype, seed=seed, gate=gate)
    s0 = states_of(len(lengths), H, Dk, Dv, seed=seed) if states else None
    ry, rs = per_sequence(xs, lengths, s0)
    return xs, s0, ry, rs


# ---- against the float64 loop, sequence by sequence
@cuda
@pytest.mark.parametrize("states", [False, True], ids=["zero-state", "initial-state"])
@pytest.mark.parametrize("name,kernel,segments", KERNEL_CASES, ids=KERNEL_IDS)
@pytest.mark.parametrize("heads", HEADS, ids=HEAD_IDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_against_float64_per_sequence(sol, dtype, heads, name, kernel, segments, states):
    """LENGTHS packed in one row on a NaN-poisoned allocator: y and the final states against the float64 loop
    run on each sequence alone (check_result), with and without an initial state."""
    H, Dk, Dv = heads
    xs, s0, ry, rs = reference_case(dtype, H, Dk, Dv, states)
    poison_allocator()
    y, final = varlen(sol, xs, offsets(LENGTHS), kernel, config_of(segments, Dv), initial_state=s0,
                      output_final_state=True)
    check_result(y, final, xs, LENGTHS, s0, ry, rs)


SHORT = [1] * 24 + [0] * 4 + [2] * 8 + [5] * 4
random.Random(0).shuffle(SHORT)


@cuda
@pytest.mark.parametrize("name,kernel,segments", KERNEL_CASES, ids=KERNEL_IDS)
@pytest.mark.parametrize("dtype", [FP32, BF16], ids=["fp32", "bf16"])
def test_many_short_sequences(sol, dtype, name, kernel, segments):
    """40 sequences of 0, 1, 2 and 5 tokens (a batch of prompts the size of a decode step) from initial states:
    many blocks with little or nothing to do, each sequence against the float64 loop."""
    H, Dk, Dv = 2, 64, 40
    xs, s0, ry, rs = reference_case(dtype, H, Dk, Dv, True, lengths=tuple(SHORT), seed=1)
    poison_allocator()
    y, final = varlen(sol, xs, offsets(SHORT), kernel, config_of(segments, Dv), initial_state=s0,
                      output_final_state=True)
    check_result(y, final, xs, SHORT, s0, ry, rs)


# ---- bitwise: dense calls per sequence, reference numerics
@cuda
@pytest.mark.parametrize("states", [False, True], ids=["zero-state", "initial-state"])
@pytest.mark.parametrize("heads", HEADS[:2], ids=HEAD_IDS[:2])
@pytest.mark.parametrize("family", ["recurrent", "chunk"])
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_equals_dense_calls_per_sequence(sol, dtype, family, heads, states):
    """With the kernel and its configuration forced (recurrent with a fixed (R, G, JB, TC); the dtype's chunk
    kernel by name with (NV, 1)), y and the final states are bitwise the concatenation of one dense call a
    sequence with the same kernel and configuration (a length-0 sequence: no rows, its initial state)."""
    H, Dk, Dv = heads
    kernel, config = ("recurrent", RECURRENT_CONFIG[Dk]) if family == "recurrent" else \
        (CHUNK_KERNEL[dtype], (nv_for(Dv), 1))
    xs, s0, _, _ = reference_case(dtype, H, Dk, Dv, states)
    y, final = varlen(sol, xs, offsets(LENGTHS), kernel, config, initial_state=s0, output_final_state=True)
    ys, finals = [], []
    for n, (a, b) in enumerate(spans(LENGTHS)):
        init = None if s0 is None else s0[n:n + 1]
        if a == b:
            ys.append(torch.empty(1, 0, H, Dv, dtype=dtype, device="cuda"))
            finals.append(torch.zeros(1, H, Dk, Dv, device="cuda") if init is None else init)
            continue
        yd, sd = run(sol, [x[:, a:b] for x in xs], kernel, config, initial_state=init, output_final_state=True)
        ys.append(yd)
        finals.append(sd)
    assert torch.equal(y, torch.cat(ys, 1))
    assert torch.equal(final, torch.cat(finals, 0))


def dtype_loop(xs, s0=None):
    """reference.Model's loop in the inputs' dtype (every product and sum rounded to it), from s0 rounded to that
    dtype (or zero): (y, final state in the dtype)."""
    q, k, v, gate, beta = xs
    _, T, H, Dk = q.shape
    Dv = v.shape[-1]
    state = torch.zeros(1, H, Dk, Dv, device=q.device, dtype=q.dtype) if s0 is None else s0.to(q.dtype)
    ys = []
    for t in range(T):
        g_t = gate[:, t].unsqueeze(-1).unsqueeze(-1)
        b_t = beta[:, t].unsqueeze(-1).unsqueeze(-1)
        state = g_t * state + b_t * (k[:, t].unsqueeze(-1) * v[:, t].unsqueeze(-2))
        ys.append((q[:, t].unsqueeze(-1) * state).sum(dim=-2))
    y = torch.stack(ys, dim=1) if ys else torch.zeros(1, 0, H, Dv, device=q.device, dtype=q.dtype)
    return y, state


def close_to_loop(y, ref):
    """test_reference_numerics' close_to_model: at least 99% of elements bitwise, the rest within 2 ulps (the fp32
    D_k sum in another order rounds the other way, rarely), or within the fp32 sum's own error where it cancels."""
    assert y.dtype == ref.dtype and y.shape == ref.shape
    assert torch.equal(torch.isnan(y), torch.isnan(ref))
    keep = ~torch.isnan(ref)
    y, ref = y[keep], ref[keep]
    if not y.numel():
        return
    same = (y == ref).float().mean().item()
    assert same >= 0.99, f"{same:.4f} of elements bitwise equal to the loop's"
    ulp = torch.finfo(ref.dtype).eps * ref.double().abs().clamp_min(torch.finfo(ref.dtype).tiny)
    slack = 1e-6 * ref.double().abs().max().item()
    assert bool(((y.double() - ref.double()).abs() <= 2 * ulp + slack).all())


@cuda
@pytest.mark.parametrize("hint", ["none", "max_seqlen"])
@pytest.mark.parametrize("states", [False, True], ids=["zero-state", "initial-state"])
@pytest.mark.parametrize("dtype", [FP16, BF16], ids=["fp16", "bf16"])
def test_reference_numerics_is_the_loop_per_sequence(sol, dtype, states, hint):
    """numerics="reference" with cu_seqlens: each sequence's y as the loop in the inputs' dtype run on it alone
    (close_to_loop), its final state the loop's state (held in the dtype); a length-0 sequence's final state is
    compared in the dtype with its initial state (whether it comes back as given or rounded to the dtype first is
    not pinned down here)."""
    H, Dk, Dv = 3, 33, 20
    xs = packed(LENGTHS, H, Dk, Dv, dtype, seed=2)
    s0 = states_of(len(LENGTHS), H, Dk, Dv, seed=2) if states else None
    extra = {"max_seqlen": LONGEST} if hint == "max_seqlen" else {}
    y, final = sol.gated_recurrence(*xs, initial_state=s0, output_final_state=True, numerics="reference",
                                    cu_seqlens=offsets(LENGTHS), **extra)
    assert y.shape == (1, sum(LENGTHS), H, Dv) and y.dtype == dtype
    assert final.shape == (len(LENGTHS), H, Dk, Dv) and final.dtype == FP32
    for n, (a, b) in enumerate(spans(LENGTHS)):
        if b > a:
            assert torch.equal(final[n], final[n].to(dtype).float()), f"sequence {n}: state not held in {dtype}"
        ry, rs = dtype_loop([x[:, a:b] for x in xs], None if s0 is None else s0[n:n + 1])
        close_to_loop(y[:, a:b], ry)
        close_to_loop(final[n:n + 1].to(dtype), rs)


# ---- the host hints and the offsets' dtype
HINT_KERNELS = [("planned", None, ()), ("recurrent-fixed", "recurrent", RECURRENT_CONFIG[64]),
                ("chunked-seg1", "chunked", (64, 1)), ("chunked-seg3", "chunked", (64, 3))]
HINT_IDS = [c[0] for c in HINT_KERNELS]


def hint_modes(cu):
    """(name, keyword arguments) of every way to pass the host hints that describes cu exactly."""
    cpu = cu.cpu()
    return [("none", {}), ("max_seqlen", {"max_seqlen": LONGEST}), ("cu_seqlens_cpu", {"cu_seqlens_cpu": cpu}),
            ("both", {"max_seqlen": LONGEST, "cu_seqlens_cpu": cpu})]


@cuda
@pytest.mark.parametrize("name,kernel,config", HINT_KERNELS, ids=HINT_IDS)
@pytest.mark.parametrize("dtype", [FP32, BF16], ids=["fp32", "bf16"])
def test_hints_and_offset_dtypes_agree_bitwise(sol, dtype, name, kernel, config):
    """No hint, the exact max_seqlen, cu_seqlens_cpu, or both, with int32 or int64 cu_seqlens: the same plan, so
    bitwise the same y and final states (the first of them also near the float64 loop)."""
    H, Dk, Dv = 2, 64, 64
    xs, s0, ry, rs = reference_case(dtype, H, Dk, Dv, True)
    results = []
    for idx_dtype in (torch.int64, torch.int32):
        cu = offsets(LENGTHS, idx_dtype)
        for mode, hints in hint_modes(cu):
            y, final = varlen(sol, xs, cu, kernel, config, initial_state=s0, output_final_state=True, **hints)
            results.append((f"{idx_dtype}-{mode}", y, final))
    check_result(results[0][1], results[0][2], xs, LENGTHS, s0, ry, rs)
    for label, y, final in results[1:]:
        assert torch.equal(y, results[0][1]) and torch.equal(final, results[0][2]), label


@cuda
@pytest.mark.parametrize("name,kernel,config", HINT_KERNELS, ids=HINT_IDS)
@pytest.mark.parametrize("dtype", [FP32, BF16], ids=["fp32", "bf16"])
def test_max_seqlen_below_the_longest_is_still_exact(sol, dtype, name, kernel, config):
    """max_seqlen 0, 1 or a third of the longest sequence (alone, so unchecked): only the planning changes, the
    results stay near the float64 loop on every sequence; with the kernel and a one-segment configuration forced
    nothing is left to plan, so they are bitwise the exact hint's."""
    H, Dk, Dv = 2, 64, 64
    xs, s0, ry, rs = reference_case(dtype, H, Dk, Dv, True)
    cu = offsets(LENGTHS)
    fixed = kernel == "recurrent" or config == (64, 1)  # nothing left to plan
    want = varlen(sol, xs, cu, kernel, config, initial_state=s0, output_final_state=True, max_seqlen=LONGEST)
    for small in (0, 1, LONGEST // 3):
        poison_allocator()
        y, final = varlen(sol, xs, cu, kernel, config, initial_state=s0, output_final_state=True, max_seqlen=small)
        check_result(y, final, xs, LENGTHS, s0, ry, rs)
        if fixed:
            assert torch.equal(y, want[0]) and torch.equal(final, want[1]), f"max_seqlen={small}"


@cuda
@pytest.mark.parametrize("idx_dtype", [torch.int32, torch.int64], ids=["int32", "int64"])
def test_strided_cu_seqlens(sol, idx_dtype):
    """cu_seqlens as every other element of a tensor whose gaps hold out-of-range offsets: bitwise the results of
    a contiguous copy, with and without max_seqlen."""
    H, Dk, Dv = 2, 64, 40
    xs, s0, _, _ = reference_case(FP32, H, Dk, Dv, True)
    cu = offsets(LENGTHS, idx_dtype)
    big = torch.full((2 * cu.numel(),), 10**6, dtype=idx_dtype, device="cuda")
    big[::2] = cu
    strided = big[::2]
    assert not strided.is_contiguous()
    for hints in ({}, {"max_seqlen": LONGEST}):
        want = varlen(sol, xs, cu, initial_state=s0, output_final_state=True, **hints)
        got = varlen(sol, xs, strided, initial_state=s0, output_final_state=True, **hints)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


# ---- isolation and position independence
# Two poisoned sequences: sequence 1 (33 tokens, followed by the 300-token one) at its last step, sequence 6
# (100 tokens) at step 50; (head, element) of the poisoned input.
POISONED = {1: (32, 0, 3), 6: (50, 1, 5)}
# input index, value, and what of y and the state is compared with the float64 loop element by element: where a
# NaN shows for a NaN input; where y is finite for an infinite v (NaN or inf depends on the order of the sum).
POISON_CASES = {"k-nan": (1, NAN, torch.isnan), "v-inf": (2, INF, torch.isfinite), "gate-nan": (3, NAN, torch.isnan)}


@lru_cache(maxsize=None)
def poisoned_case(dtype, where):
    H, Dk, Dv = 2, 64, 40
    xs = packed(LENGTHS, H, Dk, Dv, dtype, seed=3)
    index, value, _ = POISON_CASES[where]
    for n, (step, h, e) in POISONED.items():
        row = spans(LENGTHS)[n][0] + step
        xs[index][(0, row, h) if index == 3 else (0, row, h, e)] = value
    s0 = states_of(len(LENGTHS), H, Dk, Dv, seed=3)
    ry, rs = per_sequence(xs, LENGTHS, s0)
    return xs, s0, ry, rs


@cuda
@pytest.mark.parametrize("name,kernel,segments", KERNEL_CASES, ids=KERNEL_IDS)
@pytest.mark.parametrize("where", list(POISON_CASES))
@pytest.mark.parametrize("dtype", [FP32, BF16], ids=["fp32", "bf16"])
def test_non_finite_input_stays_in_its_sequence(sol, dtype, where, name, kernel, segments):
    """A NaN k or gate, or an infinite v, in two sequences: every other sequence's y and final state finite and
    near the float64 loop; in the poisoned ones the NaN (or non-finite) pattern of y and of the final state is the
    loop's, and the rest near it."""
    xs, s0, ry, rs = poisoned_case(dtype, where)
    same = POISON_CASES[where][2]
    y, final = varlen(sol, xs, offsets(LENGTHS), kernel, config_of(segments, 40), initial_state=s0,
                      output_final_state=True)
    assert y.shape == ry.shape and final.shape == rs.shape
    for n, (a, b) in enumerate(spans(LENGTHS)):
        yn, rn = y[:, a:b], ry[:, a:b]
        if n in POISONED:
            assert torch.equal(same(yn), same(rn)), f"sequence {n}: y's non-finite pattern"
            assert torch.equal(same(final[n]), same(rs[n])), f"sequence {n}: the state's non-finite pattern"
            keep = torch.isfinite(rn)
            assert rel_l2(yn[keep], rn[keep]) <= TOL[dtype], f"sequence {n}"
            continue
        assert torch.isfinite(yn).all() and torch.isfinite(final[n]).all(), f"sequence {n} was reached"
        if b > a:
            assert rel_l2(yn, rn) <= TOL[dtype], f"sequence {n}"
        assert rel_l2(final[n], rs[n]) <= STATE_TOL[dtype], f"sequence {n}"


@cuda
@pytest.mark.parametrize("name,kernel,segments", KERNEL_CASES, ids=KERNEL_IDS)
@pytest.mark.parametrize("dtype", [FP32, BF16], ids=["fp32", "bf16"])
def test_same_sequence_anywhere_gives_the_same_bits(sol, dtype, name, kernel, segments):
    """One 100-token sequence at offset 0, after a 37-token one (offset 137, not a multiple of a chunk) and last,
    from the same initial state: chunks and segments start at each sequence's start, so its y rows and final
    states are bitwise the same in all three places."""
    H, Dk, Dv = 2, 64, 64
    a = packed([100], H, Dk, Dv, dtype, seed=4)
    other = packed([37], H, Dk, Dv, dtype, seed=5)
    xs = [torch.cat([x, o, x, o, x], 1) for x, o in zip(a, other)]
    lengths = [100, 37, 100, 37, 100]
    one = states_of(1, H, Dk, Dv, seed=4)
    s0 = torch.cat([one, states_of(1, H, Dk, Dv, seed=5)] * 2 + [one], 0)
    y, final = varlen(sol, xs, offsets(lengths), kernel, config_of(segments, Dv), initial_state=s0,
                      output_final_state=True)
    rows = [y[:, s:e] for s, e in spans(lengths)]
    assert same_bits(rows[2], rows[0]) and same_bits(rows[4], rows[0])
    assert same_bits(final[2], final[0]) and same_bits(final[4], final[0])
    ry, rs = per_sequence(xs, lengths, s0)
    check_result(y, final, xs, lengths, s0, ry, rs)


# ---- gates
@cuda
@pytest.mark.parametrize("gate", GATES, ids=GATE_IDS)
@pytest.mark.parametrize("dtype", [FP32, BF16], ids=["fp32", "bf16"])
def test_gate_values_on_segments(sol, dtype, gate):
    """Gates 0, negative, 1, above 1, mixed-sign, near 0 and near 1 (helpers.GATES) on the chunk kernel with three
    segments a sequence: decays are direct products, exact for every class, across segments too."""
    H, Dk, Dv = 2, 64, 40
    xs, s0, ry, rs = reference_case(dtype, H, Dk, Dv, True, seed=6, gate=gate)
    poison_allocator()
    y, final = varlen(sol, xs, offsets(LENGTHS), "chunked", (64, 3), initial_state=s0, output_final_state=True)
    check_result(y, final, xs, LENGTHS, s0, ry, rs)


# ---- layouts and dtypes
STRIDE_KERNELS = [("planned", None, None), ("recurrent", "recurrent", None), ("chunked-seg3", "chunked", 3)]


@cuda
@pytest.mark.parametrize("name,kernel,segments", STRIDE_KERNELS, ids=[c[0] for c in STRIDE_KERNELS])
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", [FP32, BF16], ids=["fp32", "bf16"])
def test_strided_inputs(sol, dtype, layout, name, kernel, segments):
    """q, k, v, gate, beta as views of B = 1 (helpers.views: head-major, sliced, expanded, time-minor), read in
    place: y and the final states near the float64 loop on each sequence."""
    H, Dk, Dv = 3, 64, 40
    torch.manual_seed(7)
    xs = views(1, sum(LENGTHS), H, Dk, Dv, dtype)[layout]
    assert not all(x.is_contiguous() for x in xs)
    s0 = states_of(len(LENGTHS), H, Dk, Dv, seed=7)
    ry, rs = per_sequence(xs, LENGTHS, s0)
    poison_allocator()
    y, final = varlen(sol, xs, offsets(LENGTHS), kernel, config_of(segments, Dv), initial_state=s0,
                      output_final_state=True)
    check_result(y, final, xs, LENGTHS, s0, ry, rs)


@cuda
@pytest.mark.parametrize("name,kernel,segments", STRIDE_KERNELS, ids=[c[0] for c in STRIDE_KERNELS])
@pytest.mark.parametrize("dtype", [FP16, BF16], ids=["fp16", "bf16"])
def test_float32_gates_beside_16bit_inputs(sol, dtype, name, kernel, segments):
    """float32 gate and beta beside 16-bit q, k, v: holding 16-bit values, bitwise the all-16-bit call (y in q's
    dtype); holding values 16 bits cannot, near the float64 loop."""
    H, Dk, Dv = 2, 64, 40
    wide = packed(LENGTHS, H, Dk, Dv, FP32, seed=8)
    narrow = [x.to(dtype) for x in wide]
    s0 = states_of(len(LENGTHS), H, Dk, Dv, seed=8)
    cu, config = offsets(LENGTHS), config_of(segments, Dv)
    want = varlen(sol, narrow, cu, kernel, config, initial_state=s0, output_final_state=True)
    got = varlen(sol, narrow[:3] + [x.float() for x in narrow[3:]], cu, kernel, config, initial_state=s0,
                 output_final_state=True)
    assert got[0].dtype == dtype and torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    mixed = narrow[:3] + wide[3:]
    ry, rs = per_sequence(mixed, LENGTHS, s0)
    y, final = varlen(sol, mixed, cu, kernel, config, initial_state=s0, output_final_state=True)
    check_result(y, final, mixed, LENGTHS, s0, ry, rs)


# ---- no host synchronization
@cuda
def test_no_host_synchronization_with_a_hint(sol):
    """With max_seqlen, cu_seqlens_cpu or both (exact or, for max_seqlen, too small), on the planned path, the
    recurrent kernel and the chunk kernel with segments: no call synchronizes (sync-debug mode "error"). Every
    tensor, the CPU copy included, is built and every unit loaded before the mode is on."""
    H, Dk, Dv = 2, 64, 64
    xs = packed(LENGTHS, H, Dk, Dv, BF16, seed=9)
    s0 = states_of(len(LENGTHS), H, Dk, Dv, seed=9)
    cu = offsets(LENGTHS)
    cpu = cu.cpu()
    hinted = [{"max_seqlen": LONGEST}, {"max_seqlen": 1}, {"cu_seqlens_cpu": cpu},
              {"max_seqlen": LONGEST, "cu_seqlens_cpu": cpu}]
    kernels = [(None, ()), ("recurrent", ()), ("chunked", (64, 3))]

    def calls():
        for kernel, config in kernels:
            for hints in hinted:
                varlen(sol, xs, cu, kernel, config, initial_state=s0, output_final_state=True, **hints)
                varlen(sol, xs, cu, kernel, config, **hints)

    calls()  # every unit built and every plan made outside the mode
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        calls()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()


# ---- empty
EMPTY_KERNELS = [("planned", None, ()), ("recurrent", "recurrent", ()), ("chunked-seg3", "chunked", (64, 3)),
                 ("chunk-by-name", "by-name", ())]


@cuda
@pytest.mark.parametrize("hint", ["none", "max_seqlen", "cu_seqlens_cpu"])
@pytest.mark.parametrize("name,kernel,config", EMPTY_KERNELS, ids=[c[0] for c in EMPTY_KERNELS])
@pytest.mark.parametrize("dtype", [FP32, BF16], ids=["fp32", "bf16"])
def test_no_tokens(sol, dtype, name, kernel, config, hint):
    """T_total = 0: with N = 0 (cu_seqlens = [0]) y is (1, 0, H, D_v) and the final state (0, H, D_k, D_v); with
    three sequences of length 0 the final states are the initial ones exactly, in a new tensor (zeros without
    one)."""
    H, Dk, Dv = 3, 8, 5
    kernel = CHUNK_KERNEL[dtype] if kernel == "by-name" else kernel
    xs = inputs(1, 0, H, Dk, Dv, dtype=dtype)
    for N in (0, 3):
        cu = torch.zeros(N + 1, dtype=torch.int32, device="cuda")
        hints = {"none": {}, "max_seqlen": {"max_seqlen": 0}, "cu_seqlens_cpu": {"cu_seqlens_cpu": cu.cpu()}}[hint]
        for s0 in (None, states_of(N, H, Dk, Dv, seed=N)):
            y, final = varlen(sol, xs, cu, kernel, config, initial_state=s0, output_final_state=True, **hints)
            assert y.shape == (1, 0, H, Dv) and y.dtype == dtype and y.is_cuda
            assert final.shape == (N, H, Dk, Dv) and final.dtype == FP32 and final.is_cuda
            assert same_bits(final, torch.zeros_like(final) if s0 is None else s0.contiguous())
            assert s0 is None or N == 0 or final.data_ptr() != s0.data_ptr()
            y = varlen(sol, xs, cu, kernel, config, **hints)
            assert y.shape == (1, 0, H, Dv) and y.dtype == dtype


# ---- torch.compile
@cuda
def test_compile_fullgraph_equals_eager(sol):
    """torch.compile(fullgraph=True) of a call with cu_seqlens and max_seqlen, states in and out: bitwise eager's;
    new offsets of the same shape (cu_seqlens is a graph input, not a constant) too."""
    H, Dk, Dv = 3, 33, 20
    xs = packed(LENGTHS, H, Dk, Dv, FP32, seed=10)
    s0 = states_of(len(LENGTHS), H, Dk, Dv, seed=10)
    total = sum(LENGTHS)

    def call(q, k, v, g, b, cu):
        return sol.gated_recurrence(q, k, v, g, b, initial_state=s0, output_final_state=True, cu_seqlens=cu,
                                    max_seqlen=total)

    compiled = torch.compile(call, fullgraph=True)
    other = [100, 0, 200, 97, 0, 50, 1, 49, 0]
    assert sum(other) == total and len(other) == len(LENGTHS)
    for lengths in (LENGTHS, other):
        cu = offsets(lengths)
        y, final = compiled(*xs, cu)
        ey, efinal = call(*xs, cu)
        assert torch.equal(y, ey) and torch.equal(final, efinal)


def test_dynamo_traces_a_varlen_call_whole(sol):
    """torch.compile(fullgraph=True) traces a call with cu_seqlens and max_seqlen without a graph break, through the
    registered operators, whose fake implementation shapes y (1, T_total, H, D_v) in q's dtype and the final states
    (N, H, D_k, D_v) float32 (a recording backend: nothing runs on this CPU)."""
    H, Dk, Dv = 3, 8, 5
    lengths = [4, 0, 7]
    xs = inputs(1, sum(lengths), H, Dk, Dv, dtype=BF16, device="cpu", seed=11)
    cu = offsets(lengths, device="cpu")
    s0 = torch.zeros(len(lengths), H, Dk, Dv)
    graphs = []

    def recording(gm, example_inputs):
        graphs.append(gm)
        return lambda *args: (torch.zeros(1, sum(lengths), H, Dv, dtype=BF16), torch.zeros(len(lengths), H, Dk, Dv))

    def call(*x):
        return sol.gated_recurrence(*x, initial_state=s0, output_final_state=True, cu_seqlens=cu, max_seqlen=7)

    torch.compile(call, fullgraph=True, backend=recording)(*xs)
    assert len(graphs) == 1
    graph = graphs[0].graph
    targets = [str(n.target) for n in graph.nodes if n.op == "call_function"]
    assert any(t.startswith(f"{sol._OPS_NS}.") for t in targets), targets
    out = next(n for n in graph.nodes if n.op == "output").args[0]
    y, final = [node.meta["example_value"] for node in out[:2]]
    assert tuple(y.shape) == (1, sum(lengths), H, Dv) and y.dtype == BF16
    assert tuple(final.shape) == (len(lengths), H, Dk, Dv) and final.dtype == FP32


# ---- chunk_sm90 (compute capability 9.0): TMA tiles of 64 steps inside one packed row
SM90 = pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0),
                          reason="chunk_sm90 needs compute capability 9.0")
# lengths around its chunk of 64: 0, 1, 63, 64, 65, 130 and 200 (= 3 x 64 + 8: its last tile holds 56 rows of
# the next sequence, which the kernel must zero, and whose y rows it must not store)
SM90_LENGTHS = [0, 64, 1, 200, 65, 0, 130, 63]


@cuda
@SM90
@pytest.mark.parametrize("segments", [1, 2])
@pytest.mark.parametrize("Dk", [64, 128])
def test_chunk_sm90_varlen(sol, Dk, segments):
    """chunk_sm90 with cu_seqlens (bf16, D_v = 128, with segments too) against the float64 loop per sequence;
    with one segment bitwise one dense chunk_sm90 call a sequence (its zeroed rows are TMA's zero fill there)."""
    H, Dv = 2, 128
    xs, s0, ry, rs = reference_case(BF16, H, Dk, Dv, True, lengths=tuple(SM90_LENGTHS), seed=5)
    poison_allocator()
    y, final = varlen(sol, xs, offsets(SM90_LENGTHS), "chunk_sm90", (segments,), initial_state=s0,
                      output_final_state=True, max_seqlen=max(SM90_LENGTHS))
    check_result(y, final, xs, SM90_LENGTHS, s0, ry, rs)
    if segments > 1:
        return
    for n, (a, b) in enumerate(spans(SM90_LENGTHS)):
        if a == b:
            continue
        yd, sd = run(sol, [x[:, a:b] for x in xs], "chunk_sm90", (1,), initial_state=s0[n:n + 1],
                     output_final_state=True)
        assert same_bits(y[:, a:b], yd), f"sequence {n}: y"
        assert same_bits(final[n:n + 1], sd), f"sequence {n}: final state"


@cuda
@SM90
@pytest.mark.parametrize("where", ["k", "v"])
def test_chunk_sm90_varlen_neighbour_inf(sol, where):
    """An inf in the first row of the sequence after a ragged one (k or v, inside the ragged sequence's last
    TMA tile): the ragged sequence stays finite and near the float64 loop."""
    H, Dk, Dv = 2, 128, 128
    xs = packed(SM90_LENGTHS, H, Dk, Dv, BF16, seed=6)
    a = spans(SM90_LENGTHS)[4][0]  # the 65-step sequence, 8 rows after the 200-step one's last full tile
    xs[1 if where == "k" else 2][0, a, 1, 3] = INF
    ry, rs = per_sequence(xs, SM90_LENGTHS)
    y, final = varlen(sol, xs, offsets(SM90_LENGTHS), "chunk_sm90", (1,), output_final_state=True)
    s, e = spans(SM90_LENGTHS)[3]
    assert torch.isfinite(y[:, s:e]).all() and torch.isfinite(final[3]).all()
    assert rel_l2(y[:, s:e], ry[:, s:e]) <= TOL[BF16] and rel_l2(final[3], rs[3]) <= STATE_TOL[BF16]
