"""Input makers, the float64 references and the checks shared by the GPU tests."""
import torch

import naive
import reference
from timing import rel_l2  # noqa: F401  (re-exported for the tests)

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
DTYPE_IDS = ["fp32", "fp16", "bf16"]
TOL = {torch.float32: 1e-5, torch.float16: 1e-2, torch.bfloat16: 1e-2}  # rel-L2 of y against float64
# rel-L2 of the final state: fp32-level for fp32 inputs; fp16 inputs take one TF32 product on
# chunk_tf32, bf16 inputs the two-term bf16 split on chunk_bf16.
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


def strided_state(B, H, Dk, Dv):
    """A strided (every other column) float32 initial state."""
    return torch.randn(B, H, Dk, 2 * Dv, device="cuda")[..., ::2]


def ref64(xs):
    """The spec's loop in float64 on upcast inputs."""
    with torch.no_grad():
        return reference.Model()(*[x.double() for x in xs])


def bf16_floor(exact):
    """rel-L2 error of the exact answer rounded to bf16: no bf16 output can do better."""
    return rel_l2(exact.to(torch.bfloat16), exact)


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


def check_states(sol, xs, s0, kernel=None, config=()):
    """initial_state in, final state out, both against the float64 loop; returns (y, final state)."""
    poison_allocator()
    y, sT = run(sol, xs, kernel, config, initial_state=s0, output_final_state=True)
    ry, rs = naive.recurrent_naive(*xs, initial_state=s0)
    dtype = xs[0].dtype
    assert sT.dtype == torch.float32 and sT.shape == rs.shape and sT.device == xs[0].device
    assert y.shape == ry.shape and y.dtype == dtype
    err = rel_l2(sT, rs)
    assert err <= STATE_TOL[dtype], f"final state rel-L2 {err:.3e}"
    if y.numel():
        err = rel_l2(y, ry)
        assert err <= TOL[dtype], f"rel-L2 {err:.3e}"
    return y, sT


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


def v_with(value, dtype, shape=(1, 300, 2, 64, 40)):
    """Inputs with one element of v set to `value` (NaN or inf) mid-chunk, gates in (0.5, 1)."""
    xs = inputs(*shape, dtype=dtype, gate=(0.5, 1.0))
    xs[2][0, 100, 1, 3] = value
    return xs
