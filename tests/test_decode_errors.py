"""CPU: the decode step's argument checks (gated_recurrence_decode_): the pool's and the indices' dtypes, shapes
and layout, the library's q, k, v, gate, beta checks, gradients and non-tensors, all raised before any launch
and before the device check (CPU tensors reach every one); plan_decode without a GPU. GPU (cuda mark):
a pool or indices on another device than q, and errors leave the pool untouched."""
import re

import pytest
import torch

from conftest import cuda
from helpers import inputs

B, T, H, DK, DV, P = 2, 3, 3, 4, 6, 4
NAMES = ["q", "k", "v", "gate", "beta", "state_pool", "state_indices"]
POOL, IDX = r"\bstate_pool\b", r"\bstate_indices\b"  # the message names the argument


def good(device="cpu"):
    """Valid arguments: rows 0 and 1 on slots 2 and 0 of a four-slot pool."""
    xs = inputs(B, T, H, DK, DV, device=device, seed=0)
    return xs + [torch.zeros(P, H, DK, DV, device=device), torch.tensor([2, 0], device=device)]


def replaced(name, value):
    args = good()
    args[NAMES.index(name)] = value
    return args


def without_indices(pool):
    return good()[:5] + [pool, None]


def decode(sol, args):
    return sol.gated_recurrence_decode_(*args)


CASES = {
    # the pool: float32 (P, H, D_k, D_v), P == B without indices, no two elements sharing memory
    "pool-float64": (replaced("state_pool", torch.zeros(P, H, DK, DV, dtype=torch.float64)), TypeError, POOL),
    "pool-bf16": (replaced("state_pool", torch.zeros(P, H, DK, DV, dtype=torch.bfloat16)), TypeError, POOL),
    "pool-int32": (replaced("state_pool", torch.zeros(P, H, DK, DV, dtype=torch.int32)), TypeError, POOL),
    "pool-rank3": (replaced("state_pool", torch.zeros(H, DK, DV)), ValueError, POOL),
    "pool-rank5": (replaced("state_pool", torch.zeros(P, 1, H, DK, DV)), ValueError, POOL),
    "pool-heads": (replaced("state_pool", torch.zeros(P, H + 1, DK, DV)), ValueError, POOL),
    "pool-Dk-Dv-swapped": (replaced("state_pool", torch.zeros(P, H, DV, DK)), ValueError, POOL),
    "pool-Dv": (replaced("state_pool", torch.zeros(P, H, DK, DV + 1)), ValueError, POOL),
    "no-indices-P-not-B": (without_indices(torch.zeros(P, H, DK, DV)), ValueError, POOL),
    "no-indices-P0": (without_indices(torch.zeros(0, H, DK, DV)), ValueError, POOL),
    "pool-expanded-slots": (replaced("state_pool", torch.zeros(1, H, DK, DV).expand(P, H, DK, DV)), ValueError, POOL),
    "pool-expanded-columns": (replaced("state_pool", torch.zeros(P, H, DK, 1).expand(P, H, DK, DV)), ValueError, POOL),
    # slots 2 elements apart in a dense (D_k, D_v) block: has_internal_overlap cannot tell, the stride test can
    "pool-overlapping-view": (replaced("state_pool", torch.zeros(P * H * DK * DV).as_strided((P, H, DK, DV),
                                                                                       (2, H * DK * DV // 2, DV, 1))),
                              ValueError, POOL),
    # the indices: int32 or int64, shape (B,)
    "indices-float": (replaced("state_indices", torch.tensor([2.0, 0.0])), TypeError, IDX),
    "indices-int16": (replaced("state_indices", torch.tensor([2, 0], dtype=torch.int16)), TypeError, IDX),
    "indices-uint8": (replaced("state_indices", torch.tensor([2, 0], dtype=torch.uint8)), TypeError, IDX),
    "indices-bool": (replaced("state_indices", torch.tensor([True, False])), TypeError, IDX),
    "indices-too-long": (replaced("state_indices", torch.tensor([2, 0, 1])), ValueError, IDX),
    "indices-too-short": (replaced("state_indices", torch.tensor([2])), ValueError, IDX),
    "indices-2d": (replaced("state_indices", torch.tensor([[2], [0]])), ValueError, IDX),
    "indices-scalar": (replaced("state_indices", torch.tensor(2)), ValueError, IDX),
    # the library's checks of q, k, v, gate, beta (test_errors' messages)
    "q-rank": (replaced("q", torch.randn(B, T, H)), ValueError, r"q must have 4 dimensions"),
    "k-shape": (replaced("k", torch.randn(B, T, H, DK + 1)), ValueError, r"k must have the shape of q"),
    "v-batch": (replaced("v", torch.randn(B + 1, T, H, DV)), ValueError, r"v must be \(B, T, H, D_v\)"),
    "gate-shape": (replaced("gate", torch.rand(B, T, H + 1)), ValueError, r"gate must be \(B, T, H\)"),
    "q-float64": ([x.double() for x in good()[:5]] + good()[5:], TypeError, r"q must be float32, float16 or bfloat16"),
    "mixed-dtypes": (replaced("v", torch.randn(B, T, H, DV, dtype=torch.float16)), TypeError,
                     r"v has dtype float16 but q has float32"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_bad_argument_raises_named_error(sol, case):
    """Each bad argument: its exception, naming it, with every tensor on the CPU (dtypes, shapes and the pool's
    layout are checked before devices)."""
    args, exc, pattern = CASES[case]
    with pytest.raises(exc, match=pattern):
        decode(sol, args)


# Valid arguments on the CPU get as far as the device check (which then names q).
VALID = {
    "int64-indices": good(),
    "int32-indices": replaced("state_indices", torch.tensor([2, 0], dtype=torch.int32)),
    "strided-indices": replaced("state_indices", torch.tensor([2, 9, 0, 9])[::2]),
    "no-indices": without_indices(torch.zeros(B, H, DK, DV)),
    "strided-pool": replaced("state_pool", torch.zeros(P, H, DV, DK).transpose(2, 3)),
    "sliced-pool": replaced("state_pool", torch.zeros(P + 2, H, DK, DV)[1:P + 1]),
    "bf16-float32-gates": [x.bfloat16() for x in good()[:3]] + good()[3:],
    "fp16": [x.half() for x in good()[:5]] + good()[5:],
    "out-of-range-indices": replaced("state_indices", torch.tensor([P, -2])),  # NaN rows on the device, no error
    "duplicate-indices": replaced("state_indices", torch.tensor([1, 1])),
    "T0": inputs(B, 0, H, DK, DV, device="cpu", seed=0) + good()[5:],
}


@pytest.mark.parametrize("case", list(VALID))
def test_valid_cpu_arguments_reach_the_device_check(sol, case):
    """Valid dtypes, shapes and layouts pass every check but the device's; indices' values are not read on
    the host (out of range and duplicates are the device's business)."""
    with pytest.raises(ValueError, match=r"q must be a CUDA tensor"):
        decode(sol, VALID[case])


@pytest.mark.parametrize("name", NAMES[:6])
def test_inputs_that_require_grad_are_refused(sol, name):
    """No backward: an input or the pool requiring grad is a NotImplementedError naming it (before the device
    check); under torch.no_grad() the same arguments get to the device check."""
    args = good()
    args[NAMES.index(name)].requires_grad_(True)
    with pytest.raises(NotImplementedError, match=rf"\b{name} requires grad"):
        decode(sol, args)
    with torch.no_grad(), pytest.raises(ValueError, match=r"q must be a CUDA tensor"):
        decode(sol, args)


NON_TENSORS = [(None, "NoneType"), (0.9, "float"), ([1.0], "list")]


@pytest.mark.parametrize("value,type_name", NON_TENSORS, ids=["None", "float", "list"])
@pytest.mark.parametrize("name", NAMES[:6])
def test_non_tensor_argument_is_a_type_error_naming_it(sol, name, value, type_name):
    """One line naming the argument and what it got, as on the library's other entry points."""
    with pytest.raises(TypeError, match=rf"^{name} must be a torch\.Tensor\b.*\bgot {type_name}$"):
        decode(sol, replaced(name, value))


@pytest.mark.parametrize("value,type_name", [(0.5, "float"), ([2, 0], "list"), (2, "int")],
                         ids=["float", "list", "int"])
def test_indices_must_be_a_tensor_or_none(sol, value, type_name):
    with pytest.raises(TypeError, match=rf"^state_indices must be a torch\.Tensor\b.*\bgot {type_name}$"):
        decode(sol, replaced("state_indices", value))


# ---- plan_decode (no GPU needed)
PLAN_SHAPES = [(64, 1, 32, 128, 128), (1, 1, 1, 1, 1), (3, 4, 2, 33, 100), (2, 1, 2, 256, 8), (5, 0, 3, 7, 5),
               (0, 1, 2, 64, 64)]


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("shape", PLAN_SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_plan_decode_names_the_decode_unit(sol, shape, dtype):
    """A decode kernel, its source and unit, and a grid, for every dtype (a name or a torch dtype)."""
    for name in (dtype, getattr(torch, dtype)):
        text = sol.plan_decode(*shape, name)
        assert re.match(r"decode(_persistent)? \(DECODE_SRC, unit decode\)", text), text
        assert "unit decode" in text and re.search(r"\bgrid=\d+", text), text


SMS = torch.cuda.get_device_properties(0).multi_processor_count if torch.cuda.is_available() else 132


def test_plan_decode_grid_of_the_serving_shape(sol):
    """B = 64, H = 32, D_k = D_v = 128, T = 1 (2048 rows and heads, over two an SM): decode_persistent,
    a block an SM; without it, a block a (row, head) with all 128 state columns; B = 1 (32 heads):
    32-column tiles, 128 blocks."""
    for dtype in ("float32", "bfloat16"):
        text = sol.plan_decode(64, 1, 32, 128, 128, dtype)
        assert text.startswith("decode_persistent ") and f"grid={SMS}x256" in text and "smem=131072" in text, text
        text = sol.plan_decode(64, 1, 32, 128, 128, dtype, persistent=False)
        assert text.startswith("decode ") and "NV=128" in text and "grid=2048x256" in text, text
        text = sol.plan_decode(1, 1, 32, 128, 128, dtype)
        assert text.startswith("decode ") and "NV=32" in text and "grid=128x256" in text, text


@pytest.mark.parametrize("shape,grid", [((1, 1, 3, 7, 8), 3), ((2, 1, 1, 128, 256), 4), ((64, 1, 32, 100, 128), SMS)],
                         ids=["3-items", "4-items", "many"])
def test_plan_decode_forced_persistent_grid(sol, shape, grid):
    """Forced on, decode_persistent runs min(items, SMs) blocks (items: rows x heads x 128-column tiles)."""
    text = sol.plan_decode(*shape, "bfloat16", persistent=True)
    assert text.startswith("decode_persistent ") and f"grid={grid}x256" in text, text


@pytest.mark.parametrize("shape,nv,match", [((4, 1, 2, 256, 128), 0, "D_k <= 128"), ((4, 1, 2, 64, 126), 0, "aligned"),
                                            ((4, 1, 2, 64, 128), 32, "own tile")],
                         ids=["dk256", "dv126", "with-nv32"])
def test_plan_decode_refuses_persistent_where_it_cannot_run(sol, shape, nv, match):
    with pytest.raises(ValueError, match=match):
        sol.plan_decode(*shape, "float32", nv=nv, persistent=True)


def test_plan_decode_persistent_needs_a_pool_that_allows_it(sol):
    """A misaligned pool (a GPU call) at the serving shape: planned, the tile kernel; forced, a ValueError."""
    if not torch.cuda.is_available():
        pytest.skip("needs a GPU")
    B, H, D = 64, 4, 128
    xs = inputs(B, 1, H, D, D)
    big = torch.randn(B * H * D * D + 1, device="cuda")
    pool = big[1:].view(B, H, D, D)
    sol.gated_recurrence_decode_(*xs, pool)
    with pytest.raises(ValueError, match="aligned"):
        sol._decode_with(*xs, pool, persistent=True)


@pytest.mark.parametrize("nv,grid", [(32, 8192), (128, 2048)], ids=["nv32", "nv128"])
def test_plan_decode_forced_tile(sol, nv, grid):
    """nv forces the column tile (tests and benchmarks); the grid follows it."""
    text = sol.plan_decode(64, 1, 32, 128, 128, "bfloat16", nv=nv)
    assert f"NV={nv} " in text and f"grid={grid}x256" in text, text


@pytest.mark.parametrize("nv,dk", [(64, 128), (128, 256)], ids=["nv64", "nv128-dk256"])
def test_plan_decode_refuses_a_tile_it_has_not(sol, nv, dk):
    with pytest.raises(ValueError, match="NV"):
        sol.plan_decode(4, 1, 2, dk, 128, "float32", nv=nv)


# ---- GPU: devices, and refusals leave the pool as it was
@cuda
@pytest.mark.parametrize("indices", [True, False], ids=["indices", "no-indices"])
def test_pool_on_another_device_names_it(sol, indices):
    """A CPU pool beside CUDA inputs (CUDA indices or none): a ValueError naming state_pool, the pool as it was."""
    args = good("cuda")
    args[5] = torch.randn(P if indices else B, H, DK, DV)
    before = args[5].clone()
    with pytest.raises(ValueError, match=POOL):
        decode(sol, args if indices else args[:6] + [None])
    assert torch.equal(args[5], before)


GPU_REFUSALS = {
    "indices-on-cpu": (lambda a: a[:6] + [a[6].cpu()], ValueError, IDX),
    "indices-float": (lambda a: a[:6] + [a[6].float()], TypeError, IDX),
    "indices-shape": (lambda a: a[:6] + [a[6][:1]], ValueError, IDX),
    "k-on-cpu": (lambda a: a[:1] + [a[1].cpu()] + a[2:], ValueError, r"\bk is on cpu"),
    "v-requires-grad": (lambda a: a[:2] + [a[2].clone().requires_grad_(True)] + a[3:], NotImplementedError,
                        r"\bv requires grad"),
}


@cuda
@pytest.mark.parametrize("case", list(GPU_REFUSALS))
def test_refusals_leave_the_pool_untouched(sol, case):
    """Checks run before any launch: a refused call on a CUDA pool leaves every bit of it as it was."""
    args = good("cuda")
    args[5].normal_()
    before = args[5].clone()
    change, exc, pattern = GPU_REFUSALS[case]
    with pytest.raises(exc, match=pattern):
        decode(sol, change(args))
    torch.cuda.synchronize()
    assert torch.equal(args[5], before)


@cuda
@pytest.mark.parametrize("name", ["q", "v", "state_indices"])
def test_pool_sharing_memory_with_an_input_is_refused(sol, name):
    """The pool is written while the inputs are read: a pool that overlaps one of them is a ValueError."""
    args = good("cuda")
    pool = torch.zeros(P, H, DK, DV, device="cuda")
    flat = pool.view(-1)
    i = NAMES.index(name)
    if name == "state_indices":
        args[i] = flat.view(torch.int32)[:B]
        args[i].zero_()
    else:
        n = args[i].numel()
        args[i] = flat[:n].view(args[i].shape)
    args[5] = pool
    with pytest.raises(ValueError, match=POOL):
        decode(sol, args)


@cuda
def test_expanded_cuda_pool_is_refused(sol):
    """A CUDA pool whose slots share memory: written in place, it would race; refused."""
    args = good("cuda")
    args[5] = torch.zeros(1, H, DK, DV, device="cuda").expand(P, H, DK, DV)
    with pytest.raises(ValueError, match=POOL):
        decode(sol, args)
