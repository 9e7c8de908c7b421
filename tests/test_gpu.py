"""GPU: correctness matrix (shapes, dtypes, gates, strides), outputs fully written, determinism,
NaN propagation, every kernel configuration. Skipped without CUDA."""
import pytest
import torch

import reference
from conftest import cuda
from helpers import inputs, ref64, rel_l2

pytestmark = cuda

TOL = {torch.float32: 1e-5, torch.float16: 1e-2, torch.bfloat16: 1e-2}
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
DTYPE_IDS = ["fp32", "fp16", "bf16"]


def poison_allocator(nbytes=64 << 20):
    """Fill freed allocator blocks with NaN so that an unwritten output element shows up."""
    torch.empty(nbytes // 4, device="cuda").fill_(float("nan"))
    torch.cuda.synchronize()


ALGOS = [None, "recurrent", "chunked"]  # None: the planned one


def run(sol, xs, algo=None, config=()):
    if algo is None and not config:
        return sol.gated_recurrence(*xs)
    return sol.gated_recurrence_with(*xs, algorithm=algo, config=config)


def check(sol, xs, tol=None, algo=None, config=()):
    poison_allocator()
    y = run(sol, xs, algo, config)
    ref = ref64(xs)
    assert y.shape == ref.shape and y.dtype == xs[0].dtype and y.device == xs[0].device
    assert not torch.isnan(y).any(), "unwritten or NaN output"
    err = rel_l2(y, ref)
    assert err <= (tol or TOL[xs[0].dtype]), f"rel-L2 {err:.3e}"
    return y


SHAPES = [(2, 128, 4, 24, 24), (1, 1, 1, 1, 1), (3, 63, 5, 7, 7), (2, 63, 3, 33, 33), (1, 40, 2, 100, 100),
          (1, 20, 2, 256, 256), (2, 50, 3, 24, 100), (1, 33, 2, 100, 7), (1, 17, 1, 256, 1), (1, 300, 2, 9, 13),
          (5, 3, 7, 64, 64), (1, 1000, 1, 128, 128)]


@pytest.mark.parametrize("algo", ALGOS, ids=["planned", "recurrent", "chunked"])
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("shape", SHAPES, ids=["x".join(map(str, s)) for s in SHAPES])
def test_shapes_and_dtypes(sol, shape, dtype, algo):
    check(sol, inputs(*shape, dtype=dtype), algo=algo)


CHUNK_CONFIGS = [("chunk_v1", (32, 32, 1)), ("chunk_v1", (32, 64, 3)), ("chunk_v1", (64, 32, 2)),
                 ("chunk_v1", (64, 64, 5)), ("chunk_v1", (64, 64, 1000)), ("chunk_v2", (32, 32, 1)),
                 ("chunk_v2", (32, 64, 3)), ("chunk_v2", (32, 32, 7)), ("chunk_v2", (32, 64, 1000)),
                 ("chunk_v3", (32, 32, 1)), ("chunk_v3", (32, 64, 3)), ("chunk_v3", (32, 32, 7)),
                 ("chunk_v3", (32, 64, 1000))]
V3_DTYPES = [torch.bfloat16]  # chunk_v3 takes bfloat16 only


@pytest.mark.parametrize("algo,cfg", CHUNK_CONFIGS, ids=lambda x: x if isinstance(x, str) else "C{}NV{}seg{}".format(*x))
@pytest.mark.parametrize("shape", [(2, 63, 3, 33, 33), (1, 300, 2, 9, 13), (2, 700, 3, 64, 100), (1, 257, 2, 128, 40),
                                   (1, 100, 1, 256, 70)],
                         ids=["63x33", "300x9x13", "700x64x100", "257x128x40", "100x256x70"])
def test_every_chunk_configuration(sol, shape, algo, cfg):
    """Both chunk kernels: every instantiation, ragged last chunks, segments (sequence parallelism) and the scan."""
    if shape[3] > 128 and cfg[0] == 64:
        pytest.skip("C = 64 with D_k = 256 is over the shared memory")
    for dtype in V3_DTYPES if algo == "chunk_v3" else DTYPES:
        check(sol, inputs(*shape, dtype=dtype), algo=algo, config=cfg)


def test_long_sequence_uses_segments(sol):
    shape = (1, 3000, 2, 64, 64)
    assert "segments=1 " not in sol.plan(*shape) + " " and sol.plan(*shape).startswith("chunk_v")
    check(sol, inputs(*shape))


@pytest.mark.parametrize("gate", [0.0, -0.5, 1.0, 1.02, (-1.2, 1.2), (0.0, 0.05), (0.99, 1.0)],
                         ids=["zero", "negative", "one", "above1", "mixed-sign", "near0", "near1"])
@pytest.mark.parametrize("algo", ["recurrent", "chunk_v1", "chunk_v2"])
@pytest.mark.parametrize("shape", [(2, 63, 3, 24, 24), (1, 100, 2, 100, 33), (1, 300, 2, 32, 32), (1, 130, 2, 64, 40),
                                   (1, 100, 1, 128, 64)],
                         ids=["63x24", "100x100x33", "300x32", "130x64x40", "100x128x64"])
def test_gate_strength_sweep(sol, shape, gate, algo):
    check(sol, inputs(*shape, gate=gate), algo=algo)


def bf16_floor(exact):
    """rel-L2 error of the exact answer rounded to bf16: no bf16 output can do better."""
    return rel_l2(exact.to(torch.bfloat16), exact)


@pytest.mark.parametrize("gate", [0.0, -0.5, 1.0, 1.02, (-1.2, 1.2), (0.0, 0.05), (0.99, 1.0)],
                         ids=["zero", "negative", "one", "above1", "mixed-sign", "near0", "near1"])
@pytest.mark.parametrize("shape", [(2, 63, 3, 24, 24), (1, 100, 2, 100, 33), (1, 300, 2, 32, 32), (1, 130, 2, 64, 40),
                                   (1, 100, 1, 128, 64), (1, 700, 2, 128, 128)],
                         ids=["63x24", "100x100x33", "300x32", "130x64x40", "100x128x64", "700x128"])
def test_chunk_v3_gate_sweep_near_bf16_rounding(sol, shape, gate):
    """bf16 mma with the fp32 operands split in two: within 1.5x of rounding the exact answer to bf16."""
    xs = inputs(*shape, gate=gate, dtype=torch.bfloat16)
    y = check(sol, xs, algo="chunk_v3")
    exact = ref64(xs)  # the float64 loop once (check() ran it too, for its own bound)
    assert rel_l2(y, exact) <= 1.5 * bf16_floor(exact) + 1e-6


def test_beta_zero_negative_large(sol):
    xs = inputs(2, 63, 3, 24, 24)
    xs[4] = torch.empty_like(xs[4]).uniform_(-3, 3)
    xs[4][:, ::5] = 0
    check(sol, xs)


def _views(B, T, H, Dk, Dv, dtype):
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


@pytest.mark.parametrize("algo", ["recurrent", "chunked"])
@pytest.mark.parametrize("layout", ["transposed", "sliced", "expanded", "time_minor"])
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_strided_inputs(sol, layout, dtype, algo):
    xs = _views(2, 63, 3, 33, 20, dtype)[layout]
    assert not all(x.is_contiguous() for x in xs)
    check(sol, xs, algo=algo)


BF16_REF_NOTE = ("the bf16 reference rounds its state to bf16 at every step; ours keeps it in fp32 and is "
                 "closer to float64 (test_more_accurate_than_low_precision_reference), so KernelBench's "
                 "bf16 allclose(1e-2) against that reference fails (measured max abs diff 0.125 on the H200)")


FP16_REF_NOTE = ("the fp16 reference also rounds its state every step; on random inputs a few elements can land "
                 "just outside allclose(1e-2) (measured on the H200: 1 of 24576 elements, |diff| 0.0117 where 0.0101 "
                 "was allowed), while ours stays closer to float64 (test_more_accurate_than_low_precision_reference)")


@pytest.mark.parametrize("dtype", [torch.float32,
                                   pytest.param(torch.float16, marks=pytest.mark.xfail(strict=False, reason=FP16_REF_NOTE)),
                                   pytest.param(torch.bfloat16, marks=pytest.mark.xfail(strict=True, reason=BF16_REF_NOTE))],
                         ids=DTYPE_IDS)
def test_spec_shape_kernelbench_allclose(sol, dtype):
    """KernelBench: allclose against the reference run in the same precision."""
    xs = [x.cuda().to(dtype) for x in reference.get_inputs()]
    ref_same = reference.Model()(*xs)
    y = check(sol, xs)
    tol = 1e-4 if dtype == torch.float32 else 1e-2
    torch.testing.assert_close(y, ref_same, atol=tol, rtol=tol)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_more_accurate_than_low_precision_reference(sol, dtype):
    xs = [x.cuda().to(dtype) for x in reference.get_inputs()]
    exact = ref64(xs)
    assert rel_l2(sol.gated_recurrence(*xs), exact) < rel_l2(reference.Model()(*xs), exact)


def test_empty_sequence(sol):
    y = sol.gated_recurrence(*inputs(2, 0, 3, 8, 5))
    assert y.shape == (2, 0, 3, 5) and y.dtype == torch.float32 and y.is_cuda


@pytest.mark.parametrize("T", [200, 900])
def test_deterministic_bitwise(sol, T):
    xs = inputs(2, T, 4, 64, 48)
    assert torch.equal(sol.gated_recurrence(*xs), sol.gated_recurrence(*xs))


@pytest.mark.parametrize("dk", [24, 64, 128], ids=["dk24", "dk64", "dk128"])  # chunk_v2/3: run-time and compiled D_k
@pytest.mark.parametrize("algo", ["recurrent", "chunk_v1", "chunk_v2", "chunk_v3"])
@pytest.mark.parametrize("where", ["q", "k", "v", "gate", "beta"])
def test_nan_propagates_like_reference(sol, where, algo, dk):
    dtype = torch.bfloat16 if algo == "chunk_v3" else torch.float32
    xs = inputs(2, 80, 3, dk, 20 if dk == 24 else 40, dtype=dtype)  # D_v > 32: the compiled-D_k kernels
    idx = {"q": (0, 5, 1, 3), "k": (1, 7, 2, 0), "v": (0, 41, 0, 4), "gate": (1, 11, 1), "beta": (0, 13, 2)}[where]
    xs["q k v gate beta".split().index(where)][idx] = float("nan")
    y, ref = run(sol, xs, algo), ref64(xs)
    assert torch.equal(torch.isnan(y), torch.isnan(ref))
    finite = ~torch.isnan(ref)
    assert rel_l2(y[finite], ref[finite]) <= TOL[dtype]


@pytest.mark.parametrize("algo", ["chunk_v2", "chunk_v3"])
def test_infinite_v_stays_in_its_column_and_future(sol, algo):
    """An infinite v: the masked zeros of its chunk's product never meet it (fp32 FMAs on the diagonal
    blocks), so y is finite exactly where the reference's is. Where it is not, NaN or inf depends on
    the order of the sum (the loop gives NaN from q . (+-inf), a chunked sum can give inf), so only
    finiteness is compared."""
    dtype = torch.bfloat16 if algo == "chunk_v3" else torch.float32
    xs = inputs(1, 300, 2, 64, 40, dtype=dtype, gate=(0.5, 1.0))
    xs[2][0, 100, 1, 3] = float("inf")
    y, ref = run(sol, xs, algo), ref64(xs)
    assert torch.equal(torch.isfinite(y), torch.isfinite(ref))
    finite = torch.isfinite(ref)
    assert rel_l2(y[finite], ref[finite]) <= TOL[dtype]


@pytest.mark.parametrize("cfg", [(8, 4, 8, 7), (6, 4, 8, 16), (4, 8, 4, 5), (6, 4, 8, 64), (8, 4, 8, 1),
                                 (8, 32, 8, 3), (6, 8, 32, 10), (6, 16, 2, 9)], ids=lambda c: "R{}G{}JB{}TC{}".format(*c))
def test_every_kernel_configuration(sol, cfg):
    """Non-default launch configurations: every template instantiation, chunk boundaries."""
    xs = inputs(2, 45, 3, 24, 21)
    if cfg[0] * cfg[1] < 24:
        pytest.skip("R * G does not cover D_k = 24")
    y = sol.gated_recurrence_config(*xs, *cfg)
    assert rel_l2(y, ref64(xs)) <= 1e-5


def test_current_stream_is_used(sol):
    xs = inputs(2, 64, 3, 24, 24)
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        torch.cuda._sleep(20_000_000)  # keeps s busy: a launch on another stream would finish first
        y = sol.gated_recurrence(*xs)
    s.synchronize()
    assert rel_l2(y, ref64(xs)) <= 1e-5


@pytest.mark.parametrize("shape", [(1, 1024, 2, 64, 64), (1, 2000, 1, 24, 20), (2, 128, 4, 24, 24)],
                         ids=["segments-dk64", "segments-general", "recurrent"])
def test_cuda_graph_capture_and_replay(sol, shape):
    """Captured once, replayed on new inputs: the chunked path with segments is three launches (the
    scan and the output phase as programmatic dependent launches on sm_90), all of which must land
    in the graph and read the static inputs, bitwise the same as an uncaptured call."""
    assert shape[1] < 256 or "state_scan_v1" in sol.plan(*shape)
    static = inputs(*shape)
    sol.gated_recurrence(*static)  # build and warm up outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y_static = sol.gated_recurrence(*static)
    for _ in range(2):
        fresh = inputs(*shape)
        for dst, src in zip(static, fresh):
            dst.copy_(src)
        y_static.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(y_static, sol.gated_recurrence(*fresh))
        assert rel_l2(y_static, ref64(fresh)) <= 1e-5


def test_device_mismatch_names_argument(sol):
    xs = inputs(1, 4, 1, 8)
    xs[2] = xs[2].cpu()
    with pytest.raises(ValueError, match=r"\bv is on cpu"):
        sol.gated_recurrence(*xs)


def test_modelnew_matches_model(sol):
    xs = [x.cuda() for x in reference.get_inputs()]
    torch.testing.assert_close(sol.ModelNew()(*xs), reference.Model()(*xs), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("T", [0, 5, 300])
@pytest.mark.parametrize("algo,config", [(None, ()), ("recurrent", ()), ("chunk_v1", ()), ("chunk_v1", (32, 64, 4)),
                                         ("chunk_v2", ()), ("chunk_v2", (32, 64, 4)), ("chunk_v3", ()),
                                         ("chunk_v3", (32, 64, 4))],
                         ids=["planned", "recurrent", "chunk_v1", "chunk_v1-segments", "chunk_v2", "chunk_v2-segments",
                              "chunk_v3-bf16", "chunk_v3-bf16-segments"])
def test_initial_and_final_state(sol, algo, config, T):
    """initial_state (strided) in, final state out, the same on both paths, against the float64 loop
    (chunk_v3: bf16 inputs, so y to bf16's error; its state stays fp32)."""
    import naive
    dtype = torch.bfloat16 if algo == "chunk_v3" else torch.float32
    xs = inputs(2, T, 3, 33, 20, dtype=dtype)
    s0 = torch.randn(2, 3, 33, 40, device="cuda")[..., ::2]
    if algo is None:
        y, sT = sol.gated_recurrence(*xs, initial_state=s0, output_final_state=True)
    else:
        y, sT = sol.gated_recurrence_with(*xs, algorithm=algo, config=config, initial_state=s0,
                                          output_final_state=True)
    ry, rs = naive.recurrent_naive(*xs, initial_state=s0)
    assert sT.dtype == torch.float32 and sT.shape == (2, 3, 33, 20)
    assert rel_l2(sT, rs) <= (1e-4 if dtype == torch.bfloat16 else 1e-5)
    if T:
        assert rel_l2(y, ry) <= TOL[dtype]


def test_state_chains_across_calls(sol):
    """Two calls chained through the state give the one-call answer (streaming use)."""
    xs = inputs(1, 700, 2, 64, 64)
    y, _ = sol.gated_recurrence(*xs, output_final_state=True)
    a, sa = sol.gated_recurrence(*[x[:, :333] for x in xs], output_final_state=True)
    b = sol.gated_recurrence(*[x[:, 333:] for x in xs], initial_state=sa)
    assert rel_l2(torch.cat([a, b], 1), y) <= 1e-5

