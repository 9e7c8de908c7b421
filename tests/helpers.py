"""Input makers, the float64 references, the checks shared by the GPU tests and the dispatch table (BOUNDARY)."""
import torch

import naive
import reference
from timing import rel_l2  # noqa: F401  (re-exported for the tests)

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
DTYPE_IDS = ["fp32", "fp16", "bf16"]
TOL = {torch.float32: 1e-5, torch.float16: 1e-2, torch.bfloat16: 1e-2}  # rel-L2 of y against float64
# rel-L2 of the final state: fp32-level for fp32 inputs; fp16 inputs take one TF32 product on
# chunk_tf32, bf16 inputs the two-term bf16 split on chunk_bf16 and chunk_sm90.
STATE_TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1e-4}

# (B, T, H, D_k, D_v): T = 1, ragged T, D = 1, 7, 33, 100, 256, D_k != D_v both ways.
SHAPES = [(2, 128, 4, 24, 24), (1, 1, 1, 1, 1), (3, 63, 5, 7, 7), (2, 63, 3, 33, 33), (1, 40, 2, 100, 100),
          (1, 20, 2, 256, 256), (2, 50, 3, 24, 100), (1, 33, 2, 100, 7), (1, 17, 1, 256, 1), (1, 300, 2, 9, 13),
          (5, 3, 7, 64, 64), (1, 1000, 1, 128, 128)]

# Gate values for inputs(gate=...): a constant or a (low, high) uniform range (sigmoid gates otherwise).
GATES = [0.0, -0.5, 1.0, 1.02, (-1.2, 1.2), (0.0, 0.05), (0.99, 1.0)]
GATE_IDS = ["zero", "negative", "one", "above1", "mixed-sign", "near0", "near1"]
GATE_SHAPES = [(2, 63, 3, 24, 24), (1, 100, 2, 100, 33), (1, 300, 2, 32, 32), (1, 130, 2, 64, 40),
               (1, 100, 1, 128, 64)]

# Every compiled (R, G) pair of the recurrent kernel once, as (R, G, JB, TC, D_k, D_v): D_k up to R * G
# (rows past D_k idle), D_v a ragged number of column blocks of JB (JB above D_v too), TC from 1 to past
# the tests' T = 45.
PAIR_CONFIGS = [(1, 1, 64, 7, 1, 70), (2, 1, 32, 16, 2, 33), (4, 1, 128, 5, 3, 130), (6, 1, 96, 9, 6, 100),
                (8, 1, 256, 1, 7, 200), (6, 2, 16, 64, 12, 40), (8, 2, 32, 3, 13, 21), (6, 4, 8, 16, 24, 21),
                (8, 4, 8, 7, 30, 21), (6, 8, 32, 10, 48, 70), (8, 8, 4, 13, 64, 21), (6, 16, 2, 9, 90, 21),
                (8, 16, 16, 5, 128, 40), (6, 32, 8, 3, 192, 21), (8, 32, 4, 11, 256, 21)]

# Every instantiation of a chunk kernel: (id, shape, NV, layout). The compiled-D_k ones need D_k padded
# to 16 equal to 64 or 128, NV = 64 and 16-byte-aligned rows of q, k, v and y (D_k and D_v multiples
# of 8 for every dtype); anything else runs the generic one. Every T leaves a ragged last chunk of 32.
CHUNK_INSTANCES = [
    ("nv32-generic-dk33", (2, 300, 3, 33, 20), 32, "contiguous"),
    ("nv32-generic-dk256", (1, 100, 1, 256, 70), 32, "contiguous"),
    ("nv64-generic-dk33", (2, 300, 2, 33, 100), 64, "contiguous"),
    ("nv64-generic-dk64-misaligned", (1, 257, 2, 64, 64), 64, "misaligned"),
    ("nv64-generic-dk256", (1, 100, 1, 256, 70), 64, "contiguous"),
    ("nv64-dk56", (2, 300, 2, 56, 40), 64, "contiguous"),
    ("nv64-dk64", (1, 700, 3, 64, 72), 64, "contiguous"),
    ("nv64-dk120", (1, 257, 2, 120, 40), 64, "contiguous"),
    ("nv64-dk128", (1, 300, 2, 128, 128), 64, "contiguous"),
]
SEGMENTS = [1, 3, 1000]  # one; a few (the last one short where the chunks do not divide); one chunk each (clamped)

# The dispatch, (B, T, H, D_k, D_v) -> path, on an H200's limits (plan() uses them without a device): the
# one list to edit when the boundary moves. "chunk" from T = 256, or for D_k >= 96 with T >= 32 and
# B*H*T >= 8192; below that "parallel" where B*H*T <= 8192 and B*H*T^2 <= 2^20 with T >= 32 or D_k >= 96,
# or where 32 <= T <= D_k, and its staging fits shared memory (parallel_smem, which depends on the dtype:
# "parallel|float32:recurrent" names the exception); else "recurrent".
SPEC = (2, 128, 4, 24, 24)
BOUNDARY = [
    # T, D_k, B*H*T and B*H*T^2 around the parallel rule
    (SPEC, "parallel"), ((1, 1, 1, 1, 1), "recurrent"), ((1, 31, 1, 95, 95), "recurrent"),
    ((1, 32, 1, 95, 95), "parallel"), ((1, 31, 1, 96, 96), "parallel"), ((1, 7, 1, 256, 7), "parallel"),
    ((1, 0, 1, 128, 8), "parallel"), ((4, 128, 16, 64, 64), "parallel"), ((4, 129, 16, 64, 64), "recurrent"),
    ((1, 128, 64, 95, 64), "parallel"), ((1, 128, 65, 95, 64), "recurrent"), ((1, 128, 63, 128, 64), "parallel"),
    ((2, 255, 8, 64, 64), "parallel"), ((1, 255, 17, 64, 64), "recurrent"), ((1, 64, 8, 128, 128), "parallel"),
    ((3, 100, 5, 33, 100), "parallel"), ((1, 100, 1, 256, 33), "parallel"),
    # heads at least as wide as the sequence is long, in large batches
    ((8, 64, 64, 64, 64), "parallel"), ((8, 65, 64, 64, 64), "recurrent"), ((32, 32, 16, 32, 32), "parallel"),
    ((32, 32, 16, 31, 31), "recurrent"), ((32, 31, 16, 128, 128), "recurrent"),
    # shared memory: the widest D_k at T = 255 and 200 in float32 (bf16 and fp16 fit every D_k), one past
    ((1, 255, 1, 192, 32), "parallel"), ((1, 255, 1, 193, 32), "parallel|float32:recurrent"),
    ((1, 200, 1, 248, 64), "parallel"), ((1, 200, 1, 249, 64), "parallel|float32:recurrent"),
    ((1, 255, 1, 256, 256), "parallel|float32:recurrent"), ((1, 128, 1, 256, 256), "parallel"),
    # the chunk kernels
    ((2, 256, 4, 64, 64), "chunk"), ((1, 256, 1, 1, 1), "chunk"), ((8, 2048, 16, 128, 128), "chunk"),
    ((8, 64, 16, 128, 128), "chunk"), ((1, 128, 64, 96, 64), "chunk"), ((16, 32, 16, 96, 96), "chunk"),
    ((1, 256, 1, 128, 32), "chunk")]
CHUNK_KERNEL = {torch.float32: "chunk_tf32", torch.float16: "chunk_tf32", torch.bfloat16: "chunk_bf16"}
H200_SMEM = 232448  # shared memory a block (opt-in) on the H200, and plan()'s stand-in without a device
PARALLEL_ROWS = 8  # steps a row tile of the parallel kernel
PARALLEL_TILES = (16, 24, 32, 64)  # compiled tiles of the parallel kernel (GR_PARALLEL_TILES): D_k = D_v = NV
ELEM_SIZE = {"float32": 4, "float16": 2, "bfloat16": 2}


def chunk_kernel(shape, dtype):
    """The planned chunk kernel for contiguous inputs (dense, not packed): chunk_sm90 with B*H*T >= 8192 on
    compute capability 9.0 (or without a device: plan() then answers for an H200) for bfloat16 with D_k 64
    or 128 and D_v 128, and for float32 with D_k = D_v = 128 (its TF32 instantiation); else CHUNK_KERNEL's
    (float16 never runs chunk_sm90)."""
    dtype = getattr(torch, str(dtype).replace("torch.", ""))
    B, T, H, Dk, Dv = shape
    hopper = not torch.cuda.is_available() or torch.cuda.get_device_capability() == (9, 0)
    big = B * H * T >= 8192
    serves = (dtype == torch.bfloat16 and Dk in (64, 128) and Dv == 128) or \
        (dtype == torch.float32 and Dk == Dv == 128)
    if hopper and big and serves:
        return "chunk_sm90"
    return CHUNK_KERNEL[dtype]


def planned_kernel(shape, dtype):
    """The kernel BOUNDARY says the plan of `shape` names (dtype: a torch dtype or its name)."""
    name = str(dtype).replace("torch.", "")
    path, *exceptions = dict(BOUNDARY)[shape].split("|")
    path = dict(e.split(":") for e in exceptions).get(name, path)
    return chunk_kernel(shape, name) if path == "chunk" else path


def parallel_smem(nv, dk, T, dtype="float32"):
    """Bytes of shared memory the parallel kernel needs (PRELUDE_SRC's parallel_smem): 16 doubles; k (L
    rows), q (8 rows) and v (L rows) in the input dtype at pitch D + 16 bytes (D_k padded to 8); P (8 x
    (L + 4)), W (L) and the 8 x 8 diagonal table as floats; L = T rounded up to the row tile."""
    L, dkp, es = PARALLEL_ROWS * max(1, -(-T // PARALLEL_ROWS)), -(-dk // 8) * 8, ELEM_SIZE[str(dtype).replace("torch.", "")]
    pad = 16 // es
    return 128 + es * ((L + PARALLEL_ROWS) * (dkp + pad) + L * (nv + pad)) + 4 * (PARALLEL_ROWS * (L + 4) + L + 64)


def parallel_nv(T, dk, dv, limit=H200_SMEM, dtype="float32"):
    """The planned column tile of the parallel kernel: D_v split into the fewest tiles of at most 64,
    balanced and rounded up to 8, halved (to a multiple of 8) while the staging does not fit; None where
    not even 8 fits."""
    tiles = -(-dv // 64)
    nv = -(-(-(-dv // tiles)) // 8) * 8
    while nv > 8 and parallel_smem(nv, dk, T, dtype) > limit:
        nv = -(-(nv // 2) // 8) * 8
    return nv if parallel_smem(nv, dk, T, dtype) <= limit else None


def shape_id(shape):
    return "x".join(map(str, shape))


def inputs(B, T, H, Dk, Dv=None, dtype=torch.float32, device="cuda", seed=None, gate=None):
    """Fresh random inputs (never zeros). `gate`: None (sigmoid), a float, or (low, high) uniform."""
    gen = torch.Generator().manual_seed(seed) if seed is not None else None
    q, k, v, g, b = reference.make_inputs(B, T, H, Dk, Dv, dtype=torch.float32, generator=gen)
    if isinstance(gate, (int, float)):
        g = torch.full_like(g, float(gate))
    elif isinstance(gate, tuple):
        g = torch.empty_like(g).uniform_(*gate, generator=gen)
    return [x.to(device=device, dtype=dtype) for x in (q, k, v, g, b)]


def misaligned(x):
    """The same values one element past a 16-byte boundary (unit strides, rows not 16-byte aligned)."""
    flat = torch.cat([x.new_zeros(1), x.flatten()])
    return flat[1:].view(x.shape)


def with_layout(xs, case):
    """q, k, v in the layouts TMA maps describe: grouped heads (q and k one head expanded, stride 0), a
    broadcast batch, (B, H, T, D) memory viewed as (B, T, H, D), rows padded past D by 8 elements (16 bytes
    in 16-bit dtypes, 32 in float32: the rows stay 16-byte aligned)."""
    q, k, v, g, b = xs
    if case == "heads-broadcast":
        q, k = (x[:, :, :1].expand_as(x) for x in (q, k))
    elif case == "batch-broadcast":
        q, k = (x[:1].expand_as(x) for x in (q, k))
    elif case == "bhtd":
        q, k, v = (x.transpose(1, 2).contiguous().transpose(1, 2) for x in (q, k, v))
    else:
        q, k, v = (torch.nn.functional.pad(x, (0, 8))[..., :x.shape[-1]] for x in (q, k, v))
    return [q, k, v, g, b]


def instance_inputs(shape, layout, dtype, gate=None):
    xs = inputs(*shape, dtype=dtype, gate=gate)
    if layout == "misaligned":
        xs[:3] = [misaligned(x) for x in xs[:3]]
    return xs


def with_beta_zero_negative_large(xs):
    """beta uniform in (-3, 3) with every fifth step exactly 0."""
    beta = torch.empty_like(xs[4]).uniform_(-3, 3)
    beta[:, ::5] = 0
    return xs[:4] + [beta]


def views(B, T, H, Dk, Dv, dtype):
    """Non-contiguous layouts of the same shapes: head-major transposes, strided slices, expands."""
    q, k, v, g, b = inputs(B, T, H, Dk, Dv, dtype=dtype)
    bhtd = lambda x: x.transpose(1, 2).contiguous().transpose(1, 2)  # noqa: E731  (B,H,T,D) storage
    return {
        "transposed": [bhtd(q), bhtd(k), bhtd(v), g.transpose(1, 2).contiguous().transpose(1, 2), b],
        "sliced": [torch.cat([q, q], -1)[..., ::2], torch.cat([k, k], 1)[:, ::2], v.repeat(1, 1, 2, 1)[:, :, ::2],
                   g.repeat(1, 1, 3)[:, :, 1::3], b],
        "expanded": [q, k[:, :, :1].expand(B, T, H, Dk), v, g[:, :1].expand(B, T, H), b[:1].expand(B, T, H)],
        "time_minor": [x.permute(0, 2, 3, 1).contiguous().permute(0, 3, 1, 2) for x in (q, k, v)] + [g, b],
    }


LAYOUTS = ["transposed", "sliced", "expanded", "time_minor"]


def strided_state(B, H, Dk, Dv):
    """A strided (every other column) float32 initial state."""
    return torch.randn(B, H, Dk, 2 * Dv, device="cuda")[..., ::2]


def ref64(xs):
    """The spec's loop in float64 on upcast inputs."""
    with torch.no_grad():
        return reference.Model()(*[x.double() for x in xs])


def rounding_floor(exact, dtype):
    """rel-L2 error of the exact answer rounded to `dtype`: no output in that dtype can do better."""
    return rel_l2(exact.to(dtype), exact)


def bf16_floor(exact):
    return rounding_floor(exact, torch.bfloat16)


def poison_allocator(nbytes=64 << 20):
    """Fill freed allocator blocks with NaN so that an unwritten output element shows up."""
    torch.empty(nbytes // 4, device="cuda").fill_(float("nan"))
    torch.cuda.synchronize()


def run(sol, xs, kernel=None, config=(), **state):
    """The public path when nothing is chosen, else the test hook with that kernel and configuration."""
    if kernel is None and not config:
        return sol.gated_recurrence(*xs, **state)
    return sol._gated_recurrence_with(*xs, kernel=kernel, config=config, **state)


def check(sol, xs, tol=None, kernel=None, config=(), ref=None):
    """y on NaN-poisoned memory: right shape, dtype and device, fully written, near the float64 loop
    (`ref`: that loop's answer where the caller has it already)."""
    poison_allocator()
    y = run(sol, xs, kernel, config)
    ref = ref64(xs) if ref is None else ref
    assert y.shape == ref.shape and y.dtype == xs[0].dtype and y.device == xs[0].device
    assert not torch.isnan(y).any(), "unwritten or NaN output"
    err = rel_l2(y, ref)
    assert err <= (tol or TOL[xs[0].dtype]), f"rel-L2 {err:.3e}"
    return y


def check_states(sol, xs, s0, kernel=None, config=(), state_tol=None):
    """initial_state in, final state out, both against the float64 loop (the state to `state_tol`, else
    STATE_TOL); returns (y, final state)."""
    poison_allocator()
    y, sT = run(sol, xs, kernel, config, initial_state=s0, output_final_state=True)
    ry, rs = naive.recurrent_naive(*xs, initial_state=s0)
    dtype = xs[0].dtype
    assert sT.dtype == torch.float32 and sT.shape == rs.shape and sT.device == xs[0].device
    assert y.shape == ry.shape and y.dtype == dtype
    err = rel_l2(sT, rs)
    assert err <= (state_tol or STATE_TOL[dtype]), f"final state rel-L2 {err:.3e}"
    if y.numel():
        err = rel_l2(y, ry)
        assert err <= TOL[dtype], f"rel-L2 {err:.3e}"
    return y, sT


def check_chained(sol, xs, kernel, split, state_tol=None):
    """Streaming use: x[:, :split] then x[:, split:] from the first call's final state gives the one-call
    y (to TOL) and final state (to `state_tol`, else STATE_TOL)."""
    dtype = xs[0].dtype
    y, s = run(sol, xs, kernel, output_final_state=True)
    a, sa = run(sol, [x[:, :split] for x in xs], kernel, output_final_state=True)
    b, sb = run(sol, [x[:, split:] for x in xs], kernel, initial_state=sa, output_final_state=True)
    assert rel_l2(torch.cat([a, b], 1), y) <= TOL[dtype]
    assert rel_l2(sb, s) <= (state_tol or STATE_TOL[dtype])


def check_nonfinite(sol, xs, kernel=None, config=(), same=torch.isnan):
    """Inputs holding NaN or inf: `same` (isnan, isfinite) agrees with the float64 loop element by
    element, and the other elements are near it."""
    y, ref = run(sol, xs, kernel, config), ref64(xs)
    assert torch.equal(same(y), same(ref))
    keep = torch.isfinite(ref)
    assert rel_l2(y[keep], ref[keep]) <= TOL[xs[0].dtype]


def check_instance(sol, kernel, dtype, shape, nv, layout, segments, states):
    """One chunk instantiation with (NV, segments), without or with initial and final states."""
    xs = instance_inputs(shape, layout, dtype)
    if states:
        B, _, H, Dk, Dv = shape
        check_states(sol, xs, strided_state(B, H, Dk, Dv), kernel, (nv, segments))
    else:
        check(sol, xs, kernel=kernel, config=(nv, segments))


NAN_AT = {"q": (0, 5, 1, 3), "k": (1, 7, 2, 0), "v": (0, 41, 0, 4), "gate": (1, 11, 1), "beta": (0, 13, 2)}


def with_nan(xs, where):
    """xs with one NaN in the input named `where` (B >= 2, T >= 42, H >= 3; NAN_AT has the place)."""
    xs[["q", "k", "v", "gate", "beta"].index(where)][NAN_AT[where]] = float("nan")
    return xs


def v_with(value, dtype, shape=(1, 300, 2, 64, 40)):
    """Inputs with one element of v set to `value` (NaN or inf) mid-chunk, gates in (0.5, 1)."""
    xs = inputs(*shape, dtype=dtype, gate=(0.5, 1.0))
    xs[2][0, 100, 1, 3] = value
    return xs


def check_graph(sol, shape, dtype, states, kernel=None):
    """Captured once, replayed on new inputs: every launch of the call lands in the graph and reads the
    static inputs, bitwise the same as an uncaptured call and near the float64 loop."""
    B, _, H, Dk, Dv = shape

    def fresh():
        return inputs(*shape, dtype=dtype) + ([strided_state(B, H, Dk, Dv)] if states else [])

    def call(xs):
        if states:
            return run(sol, xs[:5], kernel, initial_state=xs[5], output_final_state=True)
        return (run(sol, xs, kernel),)

    static = fresh()
    call(static)  # builds the unit and warms up outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = call(static)
    for _ in range(2):
        new = fresh()
        for dst, src in zip(static, new):
            dst.copy_(src)
        for out in outs:
            out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        for out, want in zip(outs, call(new)):
            assert torch.equal(out, want)
        y_ref, _ = naive.recurrent_naive(*new[:5], initial_state=new[5] if states else None)
        assert rel_l2(outs[0], y_ref) <= TOL[dtype]
