"""CPU: KERNELS, the CUDA kernels in SOURCES and plan() agree; the dispatch boundary (chunk, parallel,
recurrent: helpers.BOUNDARY) and the chunk kernel of each dtype; the parallel kernel's column tile and
shared memory; segments fill one wave of the GPU and no more; plan()'s argument checks. Without a GPU
plan() answers for an H200 (132 SMs, 232448 bytes of shared memory a block)."""
import re

import pytest
import torch

from helpers import (BOUNDARY, CHUNK_INSTANCES, H200_SMEM, PAIR_CONFIGS, PARALLEL_ROWS, PARALLEL_TILES, SPEC,
                     chunk_kernel, parallel_nv, parallel_smem, planned_kernel, shape_id)

GLOBAL_KERNEL = r"__global__ void (?:__launch_bounds__\([^)]*\) )?(\w+)_kernel\("
DTYPE_NAMES = ["float32", "float16", "bfloat16"]
# The parallel kernel's fit depends on shared memory a block: BOUNDARY's parallel and recurrent rows are an
# H200's (plan() assumes one without a device).
SMEM = torch.cuda.get_device_properties(0).shared_memory_per_block_optin if torch.cuda.is_available() else H200_SMEM


def test_kernels_are_the_cuda_kernels(sol):
    assert sol.KERNELS == ("recurrent", "parallel", "chunk_tf32", "chunk_bf16", "chunk_sm90", "segment_scan",
                           "decode", "decode_persistent", "recurrent_bwd", "chunk_bwd", "chunk_bwd_prep",
                           "chunk_bwd_scan", "chunk_bwd_sm90", "chunk_bwd_sm90_ckpt", "chunk_bwd_sm90_fp32",
                           "chunk_bwd_sm90_fp32_dv")
    found = re.findall(GLOBAL_KERNEL, "".join(sol.SOURCES.values()))
    assert sorted(found) == sorted(sol.KERNELS)


def test_docstring_names_every_kernel(sol):
    assert [k for k in sol.KERNELS if not re.search(rf"\b{k}\b", sol.__doc__)] == []


COMPILED_PAIRS = [(1, 1), (2, 1), (4, 1), (6, 1), (8, 1), (6, 2), (8, 2), (6, 4), (8, 4), (6, 8), (8, 8), (6, 16),
                  (8, 16), (6, 32), (8, 32)]


def macro_pairs(sol, name):
    """The X(a, b) pairs of `#define name(X) ...` in SOURCES, or None where no source defines it."""
    found = re.search(rf"#define {name}\(X\)((?:.*\\\n)*.*)", "".join(sol.SOURCES.values()))
    return found and sorted((int(a), int(b)) for a, b in re.findall(r"X\((\d+), (\d+)\)", found.group(1)))


def test_recurrent_tests_cover_every_compiled_pair(sol):
    """test_recurrent runs one configuration of each compiled (R, G) pair (GR_RG_PAIRS in the sources)."""
    assert sorted(c[:2] for c in PAIR_CONFIGS) == sorted(COMPILED_PAIRS)
    assert macro_pairs(sol, "GR_RG_PAIRS") in (None, sorted(COMPILED_PAIRS))


def test_chunk_tests_cover_every_instantiation():
    """CHUNK_INSTANCES reach each (NV, compiled D_k or 0) instantiation (GR_CHUNK_INSTANCES in the
    sources): D_k padded to 16 equal to 64 or 128 with NV = 64 and aligned rows (D_k and D_v multiples
    of 8, contiguous) compile D_k in; the rest run the generic one."""
    def instantiation(shape, nv, layout):
        dkp = -(-shape[3] // 16) * 16
        aligned = layout == "contiguous" and shape[3] % 8 == 0 and shape[4] % 8 == 0
        return (nv, dkp) if nv == 64 and dkp in (64, 128) and aligned else (nv, 0)
    reached = {instantiation(shape, nv, layout) for _, shape, nv, layout in CHUNK_INSTANCES}
    assert reached == {(64, 64), (64, 128), (32, 0), (64, 0)}
    assert all(shape[1] % 32 for _, shape, _, _ in CHUNK_INSTANCES)  # ragged last chunks


def test_parallel_tiles_are_the_tested_ones(sol):
    found = re.search(r"#define GR_PARALLEL_TILES\(X\)(.*)", "".join(sol.SOURCES.values()))
    assert found is None or tuple(int(d) for d in re.findall(r"X\((\d+)\)", found.group(1))) == PARALLEL_TILES


def test_chunk_instantiations_are_the_tested_ones(sol):
    assert macro_pairs(sol, "GR_CHUNK_INSTANCES") in (None, [(32, 0), (64, 0), (64, 64), (64, 128)])


PLAN_SHAPES = [SPEC, (1, 1, 1, 1, 1), (1, 0, 1, 8, 8), (4, 1024, 8, 64, 64), (8, 2048, 16, 128, 128),
               (1, 8192, 8, 128, 128), (3, 63, 5, 33, 100), (1, 7, 1, 256, 7), (1, 300, 1, 256, 256),
               (1, 255, 1, 256, 256)]


@pytest.mark.parametrize("dtype", DTYPE_NAMES)
@pytest.mark.parametrize("shape", PLAN_SHAPES, ids=shape_id)
def test_plan_names_a_kernel_and_its_configuration(sol, shape, dtype):
    text = sol.plan(*shape, dtype)
    kernel = text.split()[0]
    assert kernel in sol.KERNELS and kernel != "segment_scan", text
    if kernel == "recurrent":
        assert re.search(r"\bR=\d+ G=\d+ JB=\d+ TC=\d+", text), text
    elif kernel == "parallel":
        assert re.search(r"\brow_tiles=\d+ NV=\d+ D_k=\d+ (compiled|run-time) split=\d+ loads=(16B|scalar) pdl=(on|off)\b", text), text
    else:
        segments = int(re.search(r"\bsegments=(\d+)", text).group(1))
        assert segments >= 1 and ("segment_scan" in text) == (segments > 1), text


@pytest.mark.parametrize("dtype", DTYPE_NAMES)
@pytest.mark.parametrize("shape,path", BOUNDARY, ids=[shape_id(s) for s, _ in BOUNDARY])
def test_dispatch_boundary(sol, shape, path, dtype):
    if path != "chunk" and SMEM != H200_SMEM:
        pytest.skip("BOUNDARY's short-sequence rows are for an H200's shared memory")
    assert sol.plan(*shape, dtype).split()[0] == planned_kernel(shape, dtype)


PARALLEL_PLANS = [shape for shape, path in BOUNDARY if path == "parallel"]


@pytest.mark.parametrize("dtype", DTYPE_NAMES)
@pytest.mark.parametrize("shape", PARALLEL_PLANS, ids=shape_id)
def test_parallel_plan(sol, shape, dtype):
    """Row tiles of PARALLEL_ROWS steps (one at T = 0), column tiles of at most 64 (balanced, multiples of
    8, halved while the staging does not fit), D_k padded to 8, the P V sums split over as many lanes as
    keep 256 threads busy, 16-byte copies where D_k and D_v rows are 16-byte multiples, a compiled tile
    (staged as float) where D_k = D_v = NV is one of GR_PARALLEL_TILES with 16-byte copies, pdl from sm_90 (the
    plan's default device without a GPU), and its shared memory (parallel_smem)."""
    B, T, H, Dk, Dv = shape
    nv_want = parallel_nv(T, Dk, Dv, SMEM, dtype)
    if nv_want is None:
        pytest.skip("does not fit this device's shared memory")
    text = sol.plan(*shape, dtype)
    found = re.fullmatch(r"parallel \(PARALLEL_SRC, unit core\) row_tiles=(\d+) NV=(\d+) D_k=(\d+) (compiled|run-time) "
                         r"split=(\d+) loads=(\w+) pdl=(on|off) grid=(\d+)x256 smem=(\d+)", text)
    assert found, text
    tiles, nv, dkp, compiled, split, loads, pdl, grid, smem = found.groups()
    hopper = not torch.cuda.is_available() or torch.cuda.get_device_capability() >= (9, 0)
    assert pdl == ("on" if hopper else "off"), text
    per16 = 4 if dtype == "float32" else 8
    assert int(tiles) == max(1, -(-T // PARALLEL_ROWS)) and int(nv) == nv_want, text
    assert int(dkp) == -(-Dk // 8) * 8, text
    combos = PARALLEL_ROWS * int(nv) // 4  # (row, 4 columns)
    assert int(split) == min(32, max(s for s in (1, 2, 4, 8, 16, 32) if combos * s <= 256 or s == 1)), text
    assert loads == ("16B" if Dk % per16 == 0 and Dv % per16 == 0 else "scalar"), text
    tile = Dk == Dv == int(nv) and Dk in PARALLEL_TILES and loads == "16B" and parallel_smem(Dk, Dk, T) <= SMEM
    assert compiled == ("compiled" if tile else "run-time"), text
    assert int(grid) == B * H * int(tiles) * -(-Dv // int(nv)), text
    assert int(smem) == parallel_smem(int(nv), Dk, T, "float32" if tile else dtype) <= SMEM, text  # tiles stage floats


@pytest.mark.parametrize("dtype", DTYPE_NAMES)
def test_chunk_kernel_by_dtype(sol, dtype):
    """bf16 inputs on chunk_sm90 (Hopper, D_v = 128, B*H*T >= 8192) or chunk_bf16, fp32 on chunk_sm90 (Hopper,
    D_k = D_v = 128, B*H*T >= 8192: its TF32 instantiation) or chunk_tf32, fp16 on chunk_tf32; a torch dtype or
    its name."""
    for name in (dtype, getattr(torch, dtype)):
        assert sol.plan(8, 2048, 16, 128, 128, name).split()[0] == planned_kernel((8, 2048, 16, 128, 128), name)
        assert sol.plan(*SPEC, name).split()[0] == planned_kernel(SPEC, name)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("shape", [(4, 1024, 8, 64, 64), (8, 2048, 16, 128, 128), (1, 8192, 8, 128, 128),
                                   (1, 65536, 8, 128, 128), (1, 300, 3, 24, 100), (2, 5000, 7, 64, 200)],
                         ids=["S1", "S2", "S3", "T65536", "300x24x100", "5000x64x200"])
def test_segments_fill_one_wave_and_no_more(sol, shape, dtype):
    """The output phase takes as many segments as fit its blocks on the SMs once, never a block more. The
    mma.sync kernels (chunk_tf32: float16 everywhere, float32 but where chunk_sm90 takes it): two blocks per
    SM; 17 segments at T = 65536 (272 blocks for 264 slots) took 2.70 ms on the H200 against 1.90 ms for 16.
    NV is read from the plan where it says it, else the rule (32 for D_v <= 32, else 64). chunk_sm90 (float32
    with D = 128 on Hopper, B*H*T >= 8192): one block of D_v = 128 an SM, chunks of 64, several segments where
    B*H leaves SMs idle."""
    sms = torch.cuda.get_device_properties(0).multi_processor_count if torch.cuda.is_available() else 132
    B, T, H, Dk, Dv = shape
    text = sol.plan(B, T, H, Dk, Dv, dtype)
    assert text.split()[0] == chunk_kernel(shape, dtype), text
    nseg = int(re.search(r"\bsegments=(\d+)", text).group(1))
    if text.startswith("chunk_sm90"):
        assert dtype == "float32" and Dk == Dv == 128, text
        tiles, chunks, slots = B * H, -(-T // 64), sms
        assert 1 <= nseg <= chunks, text
        assert tiles * nseg <= max(slots, tiles), text
        assert nseg > 1 or 2 * tiles > slots, text
        return
    found = re.search(r"\bNV=(\d+)", text)
    nv = int(found.group(1)) if found else (32 if Dv <= 32 else 64)
    tiles, chunks = B * H * -(-Dv // nv), -(-T // 32)
    assert 1 <= nseg <= chunks, text
    assert tiles * nseg <= max(2 * sms, tiles), text
    if sms == 132:  # the H200 (and CI's stand-in limits): the measured optimum of tools/chunk_configs.py
        expected = {(4, 1024): 8, (8, 2048): 1, (1, 8192): 16, (1, 65536): 16}.get((B, T))
        assert expected in (None, nseg), text


@pytest.mark.parametrize("args,pattern", [
    ((1, -1, 1, 8, 8), "T must be"), ((-1, 10, 1, 8, 8), "B must be"), ((1, 10, -1, 8, 8), "H must be"),
    ((1, 10, 1, 0, 8), r"D_k must be in 1\.\.256"), ((1, 300, 1, 257, 8), r"D_k must be in 1\.\.256"),
    ((1, 10, 1, 8, 300), r"D_v must be in 1\.\.256"), ((1, 300, 1, 8, 0), r"D_v must be in 1\.\.256")],
    ids=["T", "B", "H", "Dk-zero", "Dk-257-long", "Dv-300", "Dv-zero-long"])
def test_plan_rejects_bad_sizes(sol, args, pattern):
    with pytest.raises(ValueError, match=pattern):
        sol.plan(*args)


def test_plan_rejects_unknown_dtype(sol):
    with pytest.raises(ValueError, match="dtype must be"):
        sol.plan(1, 300, 1, 8, 8, "float64")
