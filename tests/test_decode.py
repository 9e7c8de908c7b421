"""GPU: the in-place decode step (gated_recurrence_decode_): T steps from states in a pool of slots, written
back. Against the float64 loop for every dtype and odd head sizes; index dtypes and strides; padded (-1),
out-of-range and duplicate rows; bitwise equal to the recurrent kernel's final state and to T calls of one
step; a long prefill then 100 steps; strided pools and inputs; CUDA graphs and allocations; a pool past
2^31 elements; empty calls. Each test runs twice: as planned, and with decode_persistent forced wherever it
serves the call (its planned shapes are large); the two kernels against each other bitwise at the end.
(Argument checks and plan_decode are test_decode_errors'.)"""
import pytest
import torch

from conftest import cuda
import naive
from helpers import LAYOUTS, STATE_TOL, TOL, inputs, poison_allocator, rel_l2, rounding_floor, views

pytestmark = cuda

FP32, FP16, BF16 = torch.float32, torch.float16, torch.bfloat16
DTYPES, DTYPE_IDS = [FP32, FP16, BF16], ["fp32", "fp16", "bf16"]
NAN = float("nan")
# The update is fp32 arithmetic on the inputs' values whatever their dtype, so the written states are at
# fp32 level against the float64 loop on the same (rounded) inputs: STATE_TOL's fp32 entry for every dtype.
DECODE_STATE_TOL = STATE_TOL[FP32]


KERNEL = {"forced": None}


@pytest.fixture(autouse=True, params=[None, True], ids=["planned", "persistent"])
def kernel(request):
    """decode() as planned, or with decode_persistent wherever it serves the call."""
    KERNEL["forced"] = request.param
    yield request.param
    KERNEL["forced"] = None


def ring_serves(pool, Dk):
    """decode_persistent's conditions (plan_decode): D_k <= 128 and 16-byte pool rows with unit column
    stride (on a GPU with its shared memory: every one these tests run on)."""
    return Dk <= 128 and pool.stride(3) == 1 and pool.shape[3] % 4 == 0 and pool.data_ptr() % 16 == 0 and \
        all(s % 4 == 0 for s in pool.stride()[:3])


def decode(sol, xs, pool, idx=None):
    if KERNEL["forced"] and ring_serves(pool, xs[0].shape[3]):
        return sol._decode_with(*xs, pool, idx, persistent=True)
    return sol.gated_recurrence_decode_(*xs, pool, idx)


def bits(x):
    """x as int32 bits: torch.equal on these compares NaN sentinels too."""
    return x.view(torch.int32)


def same_bits(a, b):
    return a.shape == b.shape and torch.equal(bits(a), bits(b))


def pool_of(P, H, Dk, Dv, used, sentinel=NAN):
    """Random float32 states in the slots `used`, `sentinel` in the others (a read of one shows up in y as
    NaN, a write as changed bits)."""
    pool = torch.randn(P, H, Dk, Dv, device="cuda")
    unused = [s for s in range(P) if s not in set(used)]
    pool[unused] = sentinel
    return pool


def guarded(P, H, Dk, Dv, used):
    """pool_of as big[1:P+1] of a NaN-guarded tensor: writes for slot -1 or P land in big[0] or big[P+1]."""
    big = torch.full((P + 2, H, Dk, Dv), NAN, device="cuda")
    big[1:P + 1] = pool_of(P, H, Dk, Dv, used)
    return big, big[1:P + 1]


def index(values, dtype=torch.int64):
    return torch.tensor(values, dtype=dtype, device="cuda")


def check_y(y, ry, dtype):
    """y near the float64 loop: TOL, and for 16-bit within 1.1x of rounding the exact answer (fp32
    arithmetic, one rounding)."""
    assert y.dtype == dtype and y.shape == ry.shape and y.is_cuda and y.is_contiguous()
    err = rel_l2(y, ry)
    assert err <= TOL[dtype], f"rel-L2 {err:.3e}"
    if dtype != FP32:
        assert err <= 1.1 * rounding_floor(ry, dtype) + 1e-6, f"rel-L2 {err:.3e}"


def check_states(got, want):
    err = rel_l2(got, want)
    assert err <= DECODE_STATE_TOL, f"state rel-L2 {err:.3e}"


# ---- against the float64 loop
HEAD_SIZES = [(128, 128), (7, 5), (33, 100), (64, 24), (256, 8)]


@pytest.mark.parametrize("T", [1, 4], ids=["T1", "T4"])
@pytest.mark.parametrize("Dk,Dv", HEAD_SIZES, ids=[f"{a}x{b}" for a, b in HEAD_SIZES])
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_against_float64_loop(sol, dtype, Dk, Dv, T):
    """Three rows on a permuted subset of five slots: y and the written slots against the float64 loop
    from the slots' states; the unindexed slots (NaN sentinels) bitwise unchanged; y fully written
    (NaN-poisoned allocator)."""
    B, H, P = 3, 2, 5
    idx = index([3, 0, 4])
    pool = pool_of(P, H, Dk, Dv, [3, 0, 4])
    before = pool.clone()
    xs = inputs(B, T, H, Dk, Dv, dtype=dtype)
    ry, rs = naive.recurrent_naive(*xs, initial_state=pool[idx])
    poison_allocator()
    y = decode(sol, xs, pool, idx)
    check_y(y, ry, dtype)
    check_states(pool[idx], rs)
    assert same_bits(pool[[1, 2]], before[[1, 2]])


def test_serving_shape(sol):
    """The plan's reference shape (B = 64, H = 32, D = 128, T = 1, bf16: 8192 blocks) on 64 of 80 slots."""
    B, H, D, P = 64, 32, 128, 80
    perm = torch.randperm(P)[:B].tolist()
    idx, pool = index(perm), pool_of(P, H, D, D, perm)
    before = pool.clone()
    xs = inputs(B, 1, H, D, D, dtype=BF16)
    ry, rs = naive.recurrent_naive(*xs, initial_state=pool[idx])
    y = decode(sol, xs, pool, idx)
    check_y(y, ry, BF16)
    check_states(pool[idx], rs)
    unused = [s for s in range(P) if s not in set(perm)]
    assert same_bits(pool[unused], before[unused])


# ---- indices
def strided(values, dtype):
    """The indices as every other element of a tensor whose gaps hold an out-of-range slot (99): a read
    with unit stride gives NaN rows."""
    big = torch.full((2 * len(values),), 99, dtype=dtype, device="cuda")
    big[::2] = index(values, dtype)
    return big[::2]


INDEX_KINDS = {"int32": lambda v: index(v, torch.int32), "strided-int64": lambda v: strided(v, torch.int64),
               "strided-int32": lambda v: strided(v, torch.int32)}


@pytest.mark.parametrize("kind", list(INDEX_KINDS))
@pytest.mark.parametrize("dtype", [FP32, BF16], ids=["fp32", "bf16"])
def test_index_dtypes_and_strides(sol, dtype, kind):
    """int32 and strided indices give bitwise the results (y and pool) of contiguous int64 ones."""
    B, T, H, Dk, Dv, P = 3, 2, 2, 33, 20, 5
    rows = [4, 1, 2]
    pool = pool_of(P, H, Dk, Dv, rows)
    xs = inputs(B, T, H, Dk, Dv, dtype=dtype)
    other = INDEX_KINDS[kind](rows)
    assert kind == "int32" or not other.is_contiguous()
    want_pool, got_pool = pool.clone(), pool.clone()
    want = decode(sol, xs, want_pool, index(rows))
    got = decode(sol, xs, got_pool, other)
    assert torch.equal(got, want) and same_bits(got_pool, want_pool)


def test_no_indices_is_slot_b_for_row_b(sol):
    """Without state_indices the batch is the pool (P == B): the same as indices arange(B), bitwise."""
    B, T, H, Dk, Dv = 3, 3, 2, 24, 40
    pool = torch.randn(B, H, Dk, Dv, device="cuda")
    xs = inputs(B, T, H, Dk, Dv, dtype=BF16)
    a, b = pool.clone(), pool.clone()
    ya = decode(sol, xs, a)
    yb = decode(sol, xs, b, torch.arange(B, device="cuda"))
    assert torch.equal(ya, yb) and torch.equal(a, b)
    assert torch.equal(sol.gated_recurrence_decode_(*xs, pool, state_indices=None), ya) and torch.equal(pool, a)


# ---- padded, out-of-range and duplicate rows
SPECIAL_DTYPES = [FP32, BF16]


@pytest.mark.parametrize("dtype", SPECIAL_DTYPES, ids=["fp32", "bf16"])
def test_padded_rows_are_zero_and_touch_nothing(sol, dtype):
    """-1 rows: y exactly zero (a read of any slot would bring NaN: every unused slot and the memory beside
    the pool is NaN), no slot written; the other rows as the float64 loop."""
    B, T, H, Dk, Dv, P = 4, 3, 2, 33, 20, 5
    rows = [3, -1, 0, -1]
    big, pool = guarded(P, H, Dk, Dv, [3, 0])
    before = big.clone()
    xs = inputs(B, T, H, Dk, Dv, dtype=dtype)
    ry, rs = naive.recurrent_naive(*[x[[0, 2]] for x in xs], initial_state=pool[[3, 0]])
    y = decode(sol, xs, pool, index(rows))
    assert torch.equal(y[[1, 3]], torch.zeros_like(y[[1, 3]]))
    check_y(y[[0, 2]].contiguous(), ry, dtype)
    check_states(pool[[3, 0]], rs)
    untouched = [0, 2, 3, 5, 6]  # big's guards and slots 1, 2, 4
    assert same_bits(big[untouched], before[untouched])


# Out-of-range slots: P, -2, and (int64) one whose low 32 bits name an unindexed slot, (int32) INT32_MIN.
OUT_OF_RANGE = {"int64": ([5, 1, -2, 2**32 + 3], torch.int64), "int32": ([5, 1, -2, -2**31], torch.int32)}


@pytest.mark.parametrize("kind", list(OUT_OF_RANGE))
@pytest.mark.parametrize("dtype", SPECIAL_DTYPES, ids=["fp32", "bf16"])
def test_out_of_range_rows_are_nan_and_touch_nothing(sol, dtype, kind):
    """Rows naming no slot (s < -1 or s >= P): y all NaN, nothing written (no truncation to 32 bits); the
    valid row bitwise as in a call where the others are padding (-1)."""
    B, T, H, Dk, Dv, P = 4, 2, 2, 24, 40, 5
    rows, idx_dtype = OUT_OF_RANGE[kind]
    big, pool = guarded(P, H, Dk, Dv, [1, 3])  # slot 3 holds a state: a truncated 2^32 + 3 would give finite y
    want_big = big.clone()
    xs = inputs(B, T, H, Dk, Dv, dtype=dtype)
    want = decode(sol, xs, want_big[1:P + 1], index([-1, 1, -1, -1], idx_dtype))
    y = decode(sol, xs, pool, index(rows, idx_dtype))
    assert torch.isnan(y[[0, 2, 3]]).all()
    assert torch.equal(y[1], want[1]) and not torch.isnan(y[1]).any()
    assert same_bits(big, want_big)  # slot 1 written as with padding, every other bit unchanged


# rows' slots, the same with every later duplicate replaced by -1 (what must be computed and written)
DUPLICATES = {"pair": ([1, 3, 0, 3], [1, 3, 0, -1]), "triple-from-row-0": ([2, 2, 0, 2], [2, -1, 0, -1])}


@pytest.mark.parametrize("case", list(DUPLICATES))
@pytest.mark.parametrize("dtype", SPECIAL_DTYPES, ids=["fp32", "bf16"])
def test_duplicate_slots(sol, dtype, case):
    """Rows sharing a slot (a usage error): the lowest row computes and writes it as if alone, every later
    one gets NaN y and writes nothing (y and pool bitwise those of the call with the later ones -1)."""
    B, T, H, Dk, Dv, P = 4, 2, 2, 24, 40, 5
    rows, alone = DUPLICATES[case]
    later = [b for b in range(B) if rows[b] != alone[b]]
    first = [b for b in range(B) if b not in later]
    big, pool = guarded(P, H, Dk, Dv, set(rows))
    want_big = big.clone()
    xs = inputs(B, T, H, Dk, Dv, dtype=dtype)
    want = decode(sol, xs, want_big[1:P + 1], index(alone))
    y = decode(sol, xs, pool, index(rows))
    assert torch.isnan(y[later]).all()
    assert torch.equal(y[first], want[first]) and not torch.isnan(y[first]).any()
    assert same_bits(big, want_big)


# ---- bitwise: the recurrent kernel's state, T calls of one step
@pytest.mark.parametrize("D", [33, 128], ids=["D33", "D128"])
@pytest.mark.parametrize("dtype", [FP32, BF16], ids=["fp32", "bf16"])
def test_state_bitwise_equal_to_recurrent_kernel(sol, dtype, D):
    """The same fmaf update as the recurrent kernel: the written states are bitwise its final state from
    the gathered slots; y agrees to rounding (its sums run in another order)."""
    B, T, H, P = 3, 7, 2, 5
    idx = index([4, 0, 2])
    pool = pool_of(P, H, D, D, [4, 0, 2])
    xs = inputs(B, T, H, D, D, dtype=dtype)
    y_r, s_r = sol._gated_recurrence_with(*xs, kernel="recurrent", initial_state=pool[idx], output_final_state=True)
    y = decode(sol, xs, pool, idx)
    assert torch.equal(pool[idx], s_r)
    assert rel_l2(y, y_r) <= TOL[dtype]


@pytest.mark.parametrize("dtype", [FP32, BF16], ids=["fp32", "bf16"])
def test_one_call_of_T_steps_equals_T_calls_of_one(sol, dtype):
    """T = 100 in one call: y and the state bitwise those of 100 calls of one step (each step's inputs a
    strided slice of the same tensors)."""
    B, T, H, Dk, Dv, P = 2, 100, 2, 33, 40, 3
    idx = index([2, 0])
    pool = pool_of(P, H, Dk, Dv, [2, 0])
    steps = pool.clone()
    xs = inputs(B, T, H, Dk, Dv, dtype=dtype)
    y = decode(sol, xs, pool, idx)
    ys = [decode(sol, [x[:, t:t + 1] for x in xs], steps, idx) for t in range(T)]
    assert torch.equal(torch.cat(ys, 1), y)
    assert same_bits(steps, pool)


@pytest.mark.parametrize("dtype", [FP32, BF16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("Dk,Dv,T", [(128, 128, 1), (100, 100, 3), (64, 72, 2), (7, 130, 1)],
                         ids=["D128", "D100-T3", "Dk64-Dv72-T2", "Dk7-Dv130"])
def test_both_column_tiles_agree_bitwise(sol, dtype, Dk, Dv, T):
    """The two tiles (32 columns: few rows; 128: many) share the row ownership and every sum's order, so
    y and the state are bitwise the same; each against the float64 loop too."""
    B, H, P = 3, 2, 4
    idx = index([3, 1, 0])
    xs = inputs(B, T, H, Dk, Dv, dtype=dtype)
    pool32 = pool_of(P, H, Dk, Dv, [3, 1, 0])
    pool128, s0 = pool32.clone(), pool32[idx].clone()
    y32 = sol._decode_with(*xs, pool32, idx, nv=32)
    y128 = sol._decode_with(*xs, pool128, idx, nv=128)
    assert torch.equal(y32, y128) and same_bits(pool32, pool128)
    ry, rs = naive.recurrent_naive(*xs, initial_state=s0)
    check_y(y128, ry, dtype)
    check_states(pool128[idx], rs)


@pytest.mark.parametrize("dtype", [FP32, BF16], ids=["fp32", "bf16"])
def test_prefill_then_100_decode_steps(sol, dtype):
    """Serving: gated_recurrence over a 300-step prompt from the slots' states, its final state put back
    into the pool, then 100 decode steps: the whole sequence against the float64 loop (y to TOL, the
    decode part alone too; the states to STATE_TOL), the other slots untouched."""
    B, H, D, P, prompt, steps = 2, 2, 64, 4, 300, 100
    idx = index([3, 1])
    pool = pool_of(P, H, D, D, [3, 1])
    before = pool.clone()
    xs = inputs(B, prompt + steps, H, D, D, dtype=dtype)
    ry, rs = naive.recurrent_naive(*xs, initial_state=pool[idx])
    y_pre, s_pre = sol.gated_recurrence(*[x[:, :prompt] for x in xs], initial_state=pool[idx], output_final_state=True)
    pool[idx] = s_pre
    ys = [decode(sol, [x[:, t:t + 1] for x in xs], pool, idx) for t in range(prompt, prompt + steps)]
    y = torch.cat([y_pre] + ys, 1)
    assert rel_l2(y, ry) <= TOL[dtype]
    assert rel_l2(y[:, prompt:], ry[:, prompt:]) <= TOL[dtype]
    assert rel_l2(pool[idx], rs) <= STATE_TOL[dtype]
    assert same_bits(pool[[0, 2]], before[[0, 2]])


# ---- layouts
def pool_layout(layout, P, H, Dk, Dv):
    """(the pool view, the tensor it lives in, a mask of the elements outside the view or None)."""
    if layout == "transposed":  # column stride D_k: the scalar path
        big = torch.randn(P, H, Dv, Dk, device="cuda")
        return big.transpose(2, 3), big, None
    if layout == "sliced":  # an offset into a bigger tensor, its first and last slot NaN guards
        big = torch.full((P + 2, H, Dk, Dv), NAN, device="cuda")
        big[1:P + 1] = torch.randn(P, H, Dk, Dv, device="cuda")
        outside = torch.ones_like(big, dtype=torch.bool)
        outside[1:P + 1] = False
        return big[1:P + 1], big, outside
    if layout == "misaligned":  # unit strides, one element past a 16-byte boundary: no 16-byte accesses
        big = torch.full((P * H * Dk * Dv + 1,), NAN, device="cuda")
        big[1:] = torch.randn(P * H * Dk * Dv, device="cuda")
        outside = torch.zeros_like(big, dtype=torch.bool)
        outside[0] = True
        return big[1:].view(P, H, Dk, Dv), big, outside
    big = torch.full((P, H, Dk, 2 * Dv), NAN, device="cuda")  # every other column, NaN between
    big[..., ::2] = torch.randn(P, H, Dk, Dv, device="cuda")
    outside = torch.ones_like(big, dtype=torch.bool)
    outside[..., ::2] = False
    return big[..., ::2], big, outside


@pytest.mark.parametrize("layout", ["transposed", "sliced", "misaligned", "strided-columns"])
@pytest.mark.parametrize("dtype", [FP32, BF16], ids=["fp32", "bf16"])
def test_strided_pool(sol, dtype, layout):
    """A pool that is a view (transposed, offset, misaligned, every other column): states bitwise those of a
    contiguous pool (the update is element-wise), y near the float64 loop, nothing outside the view written."""
    B, T, H, Dk, Dv, P = 3, 2, 2, 64, 40, 4
    idx = index([2, 3, 0])
    pool, big, outside = pool_layout(layout, P, H, Dk, Dv)
    assert pool.storage_offset() > 0 or not pool.is_contiguous()
    before, flat = big.clone(), pool.clone(memory_format=torch.contiguous_format)  # a copy, also where contiguous
    xs = inputs(B, T, H, Dk, Dv, dtype=dtype)
    ry, _ = naive.recurrent_naive(*xs, initial_state=pool[idx])
    decode(sol, xs, flat, idx)
    y = decode(sol, xs, pool, idx)
    check_y(y, ry, dtype)
    assert same_bits(pool, flat)
    assert outside is None or same_bits(big[outside], before[outside])


def test_float32_gates_beside_bf16(sol):
    """float32 gate and beta beside bf16 q, k, v: holding bf16 values, bitwise the all-bf16 call; holding
    values bf16 cannot, y and state near the float64 loop."""
    B, T, H, Dk, Dv, P = 3, 4, 2, 33, 64, 4
    idx = index([1, 3, 0])
    pool = pool_of(P, H, Dk, Dv, [1, 3, 0])
    xs = inputs(B, T, H, Dk, Dv)
    narrow = [x.bfloat16() for x in xs]
    a, b = pool.clone(), pool.clone()
    want = decode(sol, narrow, a, idx)
    got = decode(sol, narrow[:3] + [x.float() for x in narrow[3:]], b, idx)
    assert got.dtype == BF16 and torch.equal(got, want) and same_bits(a, b)
    wide = narrow[:3] + xs[3:]
    ry, rs = naive.recurrent_naive(*wide, initial_state=pool[idx])
    y = decode(sol, wide, pool, idx)
    check_y(y, ry, BF16)
    check_states(pool[idx], rs)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", [FP32, BF16], ids=["fp32", "bf16"])
def test_strided_inputs(sol, dtype, layout):
    """q, k, v, gate, beta as views (helpers.views: head-major, sliced, expanded, time-minor): states
    bitwise those from contiguous copies, y near the float64 loop."""
    B, T, H, Dk, Dv, P = 2, 3, 3, 24, 40, 3
    idx = index([2, 0])
    pool = pool_of(P, H, Dk, Dv, [2, 0])
    xs = views(B, T, H, Dk, Dv, dtype)[layout]
    ry, rs = naive.recurrent_naive(*xs, initial_state=pool[idx])
    flat = pool.clone()
    decode(sol, [x.contiguous() for x in xs], flat, idx)
    y = decode(sol, xs, pool, idx)
    check_y(y, ry, dtype)
    check_states(pool[idx], rs)
    assert same_bits(pool, flat)


# ---- CUDA graphs and allocations
@pytest.mark.parametrize("dtype", [FP32, BF16], ids=["fp32", "bf16"])
def test_cuda_graph_replays_new_indices_and_inputs(sol, dtype):
    """One call captured after a warm-up: replays on new inputs, pool values and indices (a padded row
    included) give bitwise an eager call's y and pool. The indices are read on the device."""
    B, T, H, Dk, Dv, P = 3, 1, 2, 64, 64, 6
    static = inputs(B, T, H, Dk, Dv, dtype=dtype) + [torch.randn(P, H, Dk, Dv, device="cuda"), index([0, 1, 2])]
    decode(sol, static[:5], static[5], static[6])  # builds the unit and warms up outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = decode(sol, static[:5], static[5], static[6])
    for rows in ([5, 3, 1], [2, -1, 4]):
        new = inputs(B, T, H, Dk, Dv, dtype=dtype) + [torch.randn(P, H, Dk, Dv, device="cuda"), index(rows)]
        for dst, src in zip(static, new):
            dst.copy_(src)
        y.fill_(NAN)
        graph.replay()
        torch.cuda.synchronize()
        want = decode(sol, new[:5], new[5], new[6])
        assert torch.equal(y, want) and torch.equal(static[5], new[5])


def round_up_512(n):
    return -(-n // 512) * 512


@pytest.mark.parametrize("shape", [(3, 1, 2, 64, 64), (64, 1, 32, 128, 128), (2, 5, 3, 33, 20)],
                         ids=["small", "serving", "T5-odd"])
def test_allocates_only_y(sol, shape):
    """No workspace: with y kept alive the allocator holds y's storage more (rounded to its 512-byte
    blocks) and never held more during the call."""
    B, T, H, Dk, Dv = shape
    P = B + 1
    xs = inputs(B, T, H, Dk, Dv, dtype=BF16)
    pool, idx = torch.randn(P, H, Dk, Dv, device="cuda"), torch.randperm(P, device="cuda")[:B]
    decode(sol, xs, pool, idx)  # builds the unit
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    y = decode(sol, xs, pool, idx)
    torch.cuda.synchronize()
    nbytes = y.numel() * y.element_size()
    assert nbytes <= torch.cuda.memory_allocated() - before <= round_up_512(nbytes)
    assert torch.cuda.max_memory_allocated() - before <= round_up_512(nbytes)


# ---- a pool past 2^31 elements
@pytest.mark.parametrize("P", [131073], ids=["pool-past-2^31"])
def test_pool_past_int32_elements(sol, P):
    """H = 1, D = 128, 131073 slots (2^31 + 16384 elements, 8.6 GB): slots 0 and P - 1 (its last element
    past 2^31) against the float64 loop; the rest, a sentinel, unchanged (32-bit offsets would wrap)."""
    if torch.cuda.mem_get_info()[0] < 12 * 2**30:
        pytest.skip("needs 12 GB of free device memory")
    H, D, T, sentinel = 1, 128, 2, 1234.5
    assert P * H * D * D > 2**31
    pool = torch.empty(P, H, D, D, device="cuda")
    pool.fill_(sentinel)  # not randn: another 8.6 GB
    idx = index([P - 1, 0])
    pool[idx] = torch.randn(2, H, D, D, device="cuda")
    xs = inputs(2, T, H, D, D)
    ry, rs = naive.recurrent_naive(*xs, initial_state=pool[idx])
    y = decode(sol, xs, pool, idx)
    check_y(y, ry, FP32)
    check_states(pool[idx], rs)
    for s in (1, P // 2, P - 2):
        assert torch.equal(pool[s], torch.full_like(pool[s], sentinel)), f"slot {s}"
    lo, hi = pool[1:P - 1].aminmax()  # the whole rest, without a pool-sized temporary
    assert lo.item() == hi.item() == sentinel
    del pool
    torch.cuda.empty_cache()


# ---- empty calls
@pytest.mark.parametrize("indices", [True, False], ids=["indices", "no-indices"])
def test_zero_steps(sol, indices):
    """T = 0: y empty (B, 0, H, D_v) in q's dtype, the pool bitwise unchanged."""
    B, H, Dk, Dv = 3, 2, 8, 5
    pool = torch.randn(B + 2 if indices else B, H, Dk, Dv, device="cuda")
    before = pool.clone()
    xs = inputs(B, 0, H, Dk, Dv, dtype=BF16)
    y = decode(sol, xs, pool, index([4, 0, 2]) if indices else None)
    assert y.shape == (B, 0, H, Dv) and y.dtype == BF16 and y.is_cuda
    assert same_bits(pool, before)


@pytest.mark.parametrize("indices", [True, False], ids=["indices", "no-indices"])
def test_empty_batch(sol, indices):
    """B = 0: y empty (0, T, H, D_v); with indices (shape (0,)) the pool is unchanged."""
    T, H, Dk, Dv = 3, 2, 8, 5
    pool = torch.randn(3 if indices else 0, H, Dk, Dv, device="cuda")
    before = pool.clone()
    xs = inputs(0, T, H, Dk, Dv)
    y = decode(sol, xs, pool, index([]) if indices else None)
    assert y.shape == (0, T, H, Dv) and y.dtype == FP32 and y.is_cuda
    assert same_bits(pool, before)


# ---- the operator: opcheck, torch.compile, autograd's view of the mutation
def test_opcheck_of_the_decode_operator(sol):
    """torch.library.opcheck: the schema (only the pool mutated), the fake's shapes and dtype."""
    xs = inputs(2, 1, 2, 16, 24, dtype=BF16)
    pool, idx = torch.randn(3, 2, 16, 24, device="cuda"), index([2, 0])
    torch.library.opcheck(getattr(torch.ops, sol._OPS_NS).decode_.default, (*xs, pool, idx),
                          test_utils=("test_schema", "test_faketensor"))


def test_compiled_call_equals_eager(sol):
    """torch.compile(fullgraph=True) through the registered operator: y and the written pool bitwise eager's."""
    xs = inputs(2, 2, 2, 32, 32, dtype=BF16)
    pool, idx = torch.randn(3, 2, 32, 32, device="cuda"), index([1, 2])
    eager_pool, compiled_pool = pool.clone(), pool.clone()
    y = sol.gated_recurrence_decode_(*xs, eager_pool, idx)
    step = torch.compile(lambda *a: sol.gated_recurrence_decode_(*a), fullgraph=True)
    yc = step(*xs, compiled_pool, idx)
    assert torch.equal(y, yc) and same_bits(eager_pool, compiled_pool)


def test_pool_version_counter_moves(sol):
    """As any in-place op: autograd's saved copies of the pool see it as modified."""
    xs = inputs(1, 1, 2, 8, 8)
    pool = torch.randn(1, 2, 8, 8, device="cuda")
    v0 = pool._version
    sol.gated_recurrence_decode_(*xs, pool)
    assert pool._version > v0



def test_no_host_synchronization(sol):
    """The indices stay on the device: under sync-debug mode "error" a call (and a graph-free second one) runs."""
    xs = inputs(3, 1, 2, 32, 32, dtype=BF16)
    pool, idx, idx32 = torch.randn(4, 2, 32, 32, device="cuda"), index([3, -1, 0]), index([0, 1, 2], torch.int32)
    decode(sol, xs, pool, idx)  # built and planned before the mode is on (the indices' copies sync too)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        decode(sol, xs, pool, idx)
        decode(sol, xs, pool, idx32)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()


@pytest.mark.parametrize("where", ["k", "v", "gate"])
def test_non_finite_inputs_as_the_float64_loop(sol, where):
    """An inf in k, v or the gate of one row and step, with D_k and D_v not multiples of the tiles: the NaN and
    inf pattern of y and of the state is the float64 loop's (the padded rows and columns stay out)."""
    B, T, H, Dk, Dv, P = 2, 3, 2, 33, 37, 3
    xs = inputs(B, T, H, Dk, Dv)
    target = {"k": (1, (0, 1, 0, 5)), "v": (2, (0, 1, 0, 7)), "gate": (3, (0, 1, 0))}[where]
    xs[target[0]][target[1]] = float("inf")
    idx = index([2, 0])
    pool = pool_of(P, H, Dk, Dv, [2, 0])
    s0 = pool[idx].clone()
    y = decode(sol, xs, pool, idx)
    ry, rs = naive.recurrent_naive(*xs, initial_state=s0)
    assert torch.equal(y.isnan(), ry.isnan()) and torch.equal(y.isinf(), ry.isinf())
    assert torch.equal(pool[idx].isnan(), rs.isnan()) and torch.equal(pool[idx].isinf(), rs.isinf())
    finite = ry.isfinite()
    assert rel_l2(y[finite], ry[finite]) <= TOL[FP32]


# ---- decode_persistent against decode_kernel, bitwise
# (B, T, H, D_k, D_v): items (rows x heads x 128-column tiles) beyond the 132 blocks, so each block walks
# several and the ring's two buffers alternate; D_k and D_v short of the tile; two column tiles.
RING_SHAPES = [(70, 1, 4, 128, 128), (37, 3, 4, 100, 200), (300, 2, 1, 7, 36), (5, 1, 3, 64, 256)]


@pytest.mark.parametrize("shape", RING_SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_persistent_equals_the_tile_kernel_bitwise(sol, kernel, dtype, shape):
    """The same update and every sum in the same order as decode_kernel's 128-column tile: y and the pool
    bitwise its, with padded (-1), out-of-range and duplicate rows mixed in, int32 indices, an inf in k and
    a NaN gate in some rows (their patterns come along), every unindexed slot a NaN sentinel."""
    if kernel:
        pytest.skip("forces both kernels itself")
    B, T, H, Dk, Dv = shape
    P = B + 3
    rows = torch.randperm(P)[:B]
    rows[1], rows[2], rows[3] = -1, P + 7, rows[0]  # padding, out of range, a duplicate of row 0
    idx = rows.to(device="cuda", dtype=torch.int32)
    xs = inputs(B, T, H, Dk, Dv, dtype=dtype)
    xs[1][4, 0, 0, 3] = float("inf")
    xs[3][B - 1, T - 1, 0] = NAN
    tile = pool_of(P, H, Dk, Dv, [r for r in rows.tolist() if 0 <= r < P])
    ring = tile.clone()
    assert "decode_persistent" in sol.plan_decode(B, T, H, Dk, Dv, dtype, persistent=True)
    want = sol._decode_with(*xs, tile, idx, nv=128)
    got = sol._decode_with(*xs, ring, idx, persistent=True)
    assert same_bits(got, want) and same_bits(ring, tile)
    assert torch.isnan(got[[2, 3]]).all() and torch.equal(got[1], torch.zeros_like(got[1]))


# ---- the full-rows path (plan "rows=full": unit-stride q, k, v rows, D_k = 32 R, whole 32-column tiles)
# against the general instantiation, bitwise: the same inputs with their rows at stride 2 take the latter.
@pytest.mark.parametrize("shape", [(1, 1, 32, 128, 128), (3, 2, 2, 64, 96), (2, 1, 3, 256, 32), (5, 3, 1, 32, 64)],
                         ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_full_rows_path_equals_the_general_path_bitwise(sol, kernel, dtype, shape):
    if kernel:
        pytest.skip("compares two instantiations of decode_kernel itself")
    B, T, H, Dk, Dv = shape
    P = B + 2
    assert "rows=full" in sol.plan_decode(B, T, H, Dk, Dv, dtype)
    rows = torch.randperm(P)[:B]
    if B > 2:
        rows[1], rows[2] = -1, rows[0]  # padding and a duplicate of row 0
    idx = rows.to("cuda")
    xs = inputs(B, T, H, Dk, Dv, dtype=dtype)
    xs[3][0, T - 1, 0] = NAN
    wide = [torch.stack([x, torch.full_like(x, NAN)], dim=-1).flatten(-2)[..., ::2] if x.dim() == 4 else x for x in xs]
    assert all(w.stride(3) == 2 for w in wide[:3]) and all(torch.equal(w, x) for w, x in zip(wide[:3], xs[:3]))
    full = pool_of(P, H, Dk, Dv, [r for r in rows.tolist() if r >= 0])
    general = full.clone()
    y_full = sol._decode_with(*xs, full, idx, nv=32)
    y_general = sol._decode_with(*wide, general, idx, nv=32)
    assert same_bits(y_full, y_general) and same_bits(full, general)
