"""Small calls for compute-sanitizer (memcheck / racecheck / synccheck): every kernel and dtype, padded rows and
columns, several chunks and segments, initial and final states, strided and aligned layouts.

    compute-sanitizer --tool memcheck python tools/sanitize_smoke.py [--sm90-only | --decode-only | --varlen-only | --backward-only
                                                               | --backward-sm90-only | --backward-sm90-fp32-only]
"""
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import reference  # noqa: E402
import solution  # noqa: E402


def decode_smoke():
    """The decode step: both column tiles and decode_persistent (with more items than blocks too), the
    16-byte and the scalar pool path, padded, out-of-range and duplicate rows, several steps."""
    for dtype in (torch.float32, torch.bfloat16):
        for B, T, H, Dk, Dv in [(3, 2, 2, 128, 128), (2, 1, 3, 33, 100), (1, 3, 1, 7, 5), (70, 2, 4, 100, 200)]:
            xs = reference.make_inputs(B, T, H, Dk, Dv, dtype=dtype, device="cuda")
            pool = torch.randn(B + 2, H, Dk, Dv, device="cuda")
            idx = torch.tensor(([B + 1, -1, 0] + list(range(1, B - 2)))[:B], device="cuda")
            for nv in (32, 128):
                solution._decode_with(*xs, pool, idx, nv=nv)
            if Dv % 4 == 0:
                solution._decode_with(*xs, pool, idx, persistent=True)
            solution._decode_with(*xs, pool.transpose(2, 3).contiguous().transpose(2, 3), idx)  # scalar path
            if B >= 2:
                solution._decode_with(*xs, pool, torch.tensor([5, -2] + [1] * (B - 2), device="cuda"))  # out of range
                solution._decode_with(*xs, pool, torch.tensor([0, 0] + [1] * (B - 2), device="cuda", dtype=torch.int32))  # duplicate


def varlen_smoke():
    """Packed sequences (cu_seqlens) on every kernel that takes them: lengths 0, 1, ragged and several chunks,
    segments (the capacity larger than some sequences need), states, int32 and int64 offsets."""
    lens = [0, 1, 70, 33, 0, 150, 5]
    for dtype in (torch.float32, torch.bfloat16):
        kernel = "chunk_bf16" if dtype == torch.bfloat16 else "chunk_tf32"
        for Dk, Dv in [(33, 40), (64, 64)]:
            T = sum(lens)
            xs = reference.make_inputs(1, T, 2, Dk, Dv, dtype=dtype, device="cuda")
            cu = torch.tensor([0] + lens, device="cuda").cumsum(0)
            s0 = torch.randn(len(lens), 2, Dk, Dv, device="cuda")
            for name, cfg in [("recurrent", ()), (kernel, (64, 1)), (kernel, (32, 3)), (None, ())]:
                solution._gated_recurrence_with(*xs, kernel=name, config=cfg, initial_state=s0, output_final_state=True,
                                                cu_seqlens=cu.to(torch.int32), max_seqlen=max(lens))
                solution._gated_recurrence_with(*xs, kernel=name, config=cfg, cu_seqlens=cu, max_seqlen=max(lens))
    if torch.cuda.get_device_capability() == (9, 0):  # chunk_sm90: ragged tiles zeroed, their y stored by rows
        lens = [0, 200, 65, 1, 64]
        for Dk in (64, 128):
            xs = reference.make_inputs(1, sum(lens), 2, Dk, 128, dtype=torch.bfloat16, device="cuda")
            cu = torch.tensor([0] + lens, device="cuda").cumsum(0)
            for cfg in ((1,), (2,)):
                solution._gated_recurrence_with(*xs, kernel="chunk_sm90", config=cfg, cu_seqlens=cu, max_seqlen=200,
                                                initial_state=torch.randn(len(lens), 2, Dk, 128, device="cuda"),
                                                output_final_state=True)


def backward_smoke():
    """The backward (chunk_bwd with and without segments; recurrent_bwd, and dq by a forward plan; chunk_bwd_sm90 on
    Hopper): every dtype, rows a thread 1, 2, 4, 8, one and
    several column tiles, T past one checkpoint span with a ragged run, states in and out, a NaN in v,
    strided q and float32 gates beside bfloat16."""
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        for B, T, H, Dk, Dv in [(2, 1, 2, 7, 5), (1, 70, 2, 33, 100), (2, 130, 1, 128, 40), (1, 67, 1, 200, 64)]:
            xs = reference.make_inputs(B, T, H, Dk, Dv, dtype=dtype, device="cuda")
            dy = torch.randn(B, T, H, Dv, device="cuda").to(dtype)
            s0 = torch.randn(B, H, Dk, Dv, device="cuda")
            solution._backward_with(dy, torch.randn(B, H, Dk, Dv, device="cuda"), *xs, s0)
            solution._backward_with(dy, None, *xs)
        xs = reference.make_inputs(1, 200, 2, 64, 48, dtype=dtype, device="cuda")  # chunk_bwd's segments: 3, ragged
        solution._backward_with(torch.randn(1, 200, 2, 48, device="cuda").to(dtype), torch.randn(1, 2, 64, 48, device="cuda"),
                                *xs, torch.randn(1, 2, 64, 48, device="cuda"), kernel="chunk_bwd", segments=3)
    q, k, v, g, b = reference.make_inputs(2, 100, 3, 64, 64, dtype=torch.bfloat16, device="cuda")
    v[0, 50, 1, 3] = float("nan")
    qt = q.transpose(1, 2).contiguous().transpose(1, 2)
    solution._backward_with(torch.randn_like(v), None, qt, k, v, g.float(), b.float())
    backward_sm90_smoke()


def hopper_backward_smoke(kernel, dtype, wide_gates):
    """kernel (chunk_bwd_sm90 or chunk_bwd_sm90_fp32) on Hopper: T ragged, 1 and several chunks; both states; NaN in
    k; a transposed q; float32 gates (or sliced ones); an autograd step at B H just above half the SMs (the plan's
    bar) and two chunks, where the forward writes the backward's checkpoints (both sides of that hand-over)."""
    if torch.cuda.get_device_capability() != (9, 0):
        return
    for B, T, H in [(1, 100, 2), (2, 1, 1), (1, 200, 1)]:
        q, k, v, g, b = reference.make_inputs(B, T, H, 128, 128, dtype=dtype, device="cuda")
        dy = torch.randn_like(v)
        solution._backward_with(dy, torch.randn(B, H, 128, 128, device="cuda"), q, k, v, g, b,
                                torch.randn(B, H, 128, 128, device="cuda"), kernel=kernel)
        k[0, T // 2, 0, 3] = float("nan")
        g, b = (g.float(), b.float()) if wide_gates else (torch.cat([g, g], -1)[..., ::2], b)
        solution._backward_with(dy, None, q.transpose(1, 2).contiguous().transpose(1, 2), k, v, g, b, kernel=kernel)
        print(f"  {kernel} B T H = {B} {T} {H}: done", flush=True)
    # B H just at the plan's bar (SMs / 2), 2 chunks: small enough for racecheck in a few minutes
    H = torch.cuda.get_device_properties(0).multi_processor_count // 2 + 1
    xs = [x.requires_grad_() for x in reference.make_inputs(1, 65, H, 128, 128, dtype=dtype, device="cuda")]
    y = solution.gated_recurrence(*xs)
    torch.autograd.grad(y, xs, torch.randn_like(y))
    print(f"  {kernel} autograd step at B H = {H}: done", flush=True)


def backward_sm90_smoke():
    hopper_backward_smoke("chunk_bwd_sm90", torch.bfloat16, True)
    backward_sm90_fp32_smoke()


def backward_sm90_fp32_smoke():
    hopper_backward_smoke("chunk_bwd_sm90_fp32", torch.float32, False)


if "--backward-sm90-fp32-only" in sys.argv:
    backward_sm90_fp32_smoke()
    torch.cuda.synchronize()
    print("sanitize smoke (chunk_bwd_sm90_fp32 only): done")
    sys.exit(0)

if "--backward-sm90-only" in sys.argv:
    backward_sm90_smoke()
    torch.cuda.synchronize()
    print("sanitize smoke (chunk_bwd_sm90 only): done")
    sys.exit(0)

if "--backward-only" in sys.argv:
    backward_smoke()
    torch.cuda.synchronize()
    print("sanitize smoke (backward only): done")
    sys.exit(0)

if "--varlen-only" in sys.argv:
    varlen_smoke()
    torch.cuda.synchronize()
    print("sanitize smoke (varlen only): done")
    sys.exit(0)

if "--decode-only" in sys.argv:
    decode_smoke()
    torch.cuda.synchronize()
    print("sanitize smoke (decode only): done")
    sys.exit(0)

# chunk_sm90 (compute capability 9.0): bfloat16 with both D_k, ragged and whole chunks, segments, states, a NaN
# in v (the FMA path), float32 gates; then float32
if torch.cuda.get_device_capability() == (9, 0):
    for B, T, H, Dk, cfg in [(1, 150, 2, 128, (1,)), (2, 70, 1, 64, (2,)), (1, 300, 1, 128, (3,)), (1, 33, 1, 64, ())]:
        xs = reference.make_inputs(B, T, H, Dk, 128, dtype=torch.bfloat16, device="cuda")
        solution._gated_recurrence_with(*xs, kernel="chunk_sm90", config=cfg, initial_state=torch.randn(B, H, Dk, 128, device="cuda"),
                                        output_final_state=True)
        xs[2][0, T // 2, 0, 3] = float("nan")
        solution._gated_recurrence_with(*xs, kernel="chunk_sm90", config=cfg)
        solution._gated_recurrence_with(*xs[:3], xs[3].float(), xs[4].float(), kernel="chunk_sm90", config=cfg)
    # TMA maps of other layouts: q and k one head expanded (stride 0), v in (B, H, T, D) memory
    xs = reference.make_inputs(2, 100, 2, 128, 128, dtype=torch.bfloat16, device="cuda")
    xs[0], xs[1] = xs[0][:, :, :1].expand_as(xs[0]), xs[1][:, :, :1].expand_as(xs[1])
    xs[2] = xs[2].transpose(1, 2).contiguous().transpose(1, 2)
    solution._gated_recurrence_with(*xs, kernel="chunk_sm90", config=(2,))
    # float32 (TF32): ragged and whole chunks, segments (state phase), states, a NaN in v (its FMA path), the
    # layouts above
    for B, T, H, cfg in [(1, 150, 2, (1,)), (2, 70, 1, (2,)), (1, 300, 1, (3,)), (1, 33, 1, ())]:
        xs = reference.make_inputs(B, T, H, 128, 128, device="cuda")
        solution._gated_recurrence_with(*xs, kernel="chunk_sm90", config=cfg, initial_state=torch.randn(B, H, 128, 128, device="cuda"),
                                        output_final_state=True)
        xs[2][0, T // 2, 0, 3] = float("nan")
        solution._gated_recurrence_with(*xs, kernel="chunk_sm90", config=cfg)
    xs = reference.make_inputs(2, 100, 2, 128, 128, device="cuda")
    xs[0], xs[1] = xs[0][:, :, :1].expand_as(xs[0]), xs[1][:, :, :1].expand_as(xs[1])
    xs[2] = xs[2].transpose(1, 2).contiguous().transpose(1, 2)
    solution._gated_recurrence_with(*xs, kernel="chunk_sm90", config=(2,))
if "--sm90-only" in sys.argv:
    torch.cuda.synchronize()
    print("sanitize smoke (chunk_sm90 only): done")
    sys.exit(0)

for dtype in (torch.float32, torch.float16, torch.bfloat16):
    for B, T, H, Dk, Dv in [(2, 37, 3, 24, 24), (1, 20, 2, 33, 100), (1, 9, 1, 256, 8), (1, 50, 1, 7, 5)]:
        xs = reference.make_inputs(B, T, H, Dk, Dv, dtype=dtype, device="cuda")
        solution.gated_recurrence(*xs)
        solution.gated_recurrence(*[x.transpose(1, 2).contiguous().transpose(1, 2) if x.dim() == 4 else x for x in xs])
    xs = reference.make_inputs(1, 40, 2, 24, 24, dtype=dtype, device="cuda")
    solution._gated_recurrence_with(*xs, kernel="recurrent", config=(6, 4, 8, 7))  # 6 steps staged at once, ragged last
    # each chunk kernel in every (NV, D_k) instantiation, with segments (state phase + segment_scan) and states
    kernel = "chunk_bf16" if dtype == torch.bfloat16 else "chunk_tf32"
    for cfg in [(32, 3), (64, 4), (64, 1)]:
        shapes = [(1, 150, 2, 33, 70), (2, 70, 1, 7, 5), (1, 40, 1, 256, 40)]
        if cfg[0] == 64:  # the compiled-D_k instantiations (aligned rows)
            shapes += [(1, 150, 2, 64, 72), (1, 150, 2, 128, 64)]
        for B, T, H, Dk, Dv in shapes:
            xs = reference.make_inputs(B, T, H, Dk, Dv, dtype=dtype, device="cuda")
            s0 = torch.randn(B, H, Dk, Dv, device="cuda")
            solution._gated_recurrence_with(*xs, kernel=kernel, config=cfg, initial_state=s0, output_final_state=True)
        xs = reference.make_inputs(1, 100, 1, 24, 20, dtype=dtype, device="cuda")
        xs[2][0, 40, 0, 3] = float("nan")  # the fp32 diagonal path for a non-finite v
        solution._gated_recurrence_with(*xs, kernel=kernel, config=cfg)
    # segments on element copies (time-minor rows), and on wide heads (ragged column tiles)
    xs = reference.make_inputs(1, 700, 2, 33, 70, dtype=dtype, device="cuda")
    solution._gated_recurrence_with(*[x.transpose(1, 2).contiguous().transpose(1, 2) if x.dim() == 4 else x for x in xs],
                                    kernel=kernel, config=(64, 2))
    xs = reference.make_inputs(1, 100, 1, 200, 130, dtype=dtype, device="cuda")
    solution._gated_recurrence_with(*xs, kernel=kernel, config=(32, 3))
    if dtype != torch.float32:  # float32 gate and beta beside 16-bit q, k, v, on every planned kernel
        for B, T, H, Dk, Dv in [(2, 128, 4, 24, 24), (1, 100, 2, 33, 20), (8, 200, 16, 24, 24), (1, 300, 2, 64, 64)]:
            xs = reference.make_inputs(B, T, H, Dk, Dv, dtype=dtype, device="cuda")
            solution.gated_recurrence(*xs[:3], xs[3].float(), xs[4].float())
    # parallel: planned and chosen column tiles (ragged), ragged row tiles, states, 16-byte and scalar copies
    for cfg, (B, T, H, Dk, Dv) in [((), (2, 37, 3, 24, 24)), ((64,), (1, 200, 2, 33, 100)), ((32,), (1, 256, 1, 64, 40)),
                                   ((8,), (1, 9, 1, 256, 8)), ((), (1, 100, 2, 40, 104))]:
        xs = reference.make_inputs(B, T, H, Dk, Dv, dtype=dtype, device="cuda")
        solution._gated_recurrence_with(*xs, kernel="parallel", config=cfg, initial_state=torch.randn(B, H, Dk, Dv, device="cuda"),
                                        output_final_state=True)
        solution._gated_recurrence_with(*[x.transpose(1, 2).contiguous().transpose(1, 2) if x.dim() == 4 else x for x in xs],
                                        kernel="parallel", config=cfg)
    # parallel's compiled tiles (float staging; 16-bit rows through registers), longest T, states
    for D in (16, 24, 32, 64):
        for T in (100, 255):
            xs = reference.make_inputs(2, T, 3, D, D, dtype=dtype, device="cuda")
            solution._gated_recurrence_with(*xs, kernel="parallel", initial_state=torch.randn(2, 3, D, D, device="cuda"),
                                            output_final_state=True)
    xs = reference.make_inputs(1, 50, 2, 24, 24, dtype=dtype, device="cuda")
    solution._gated_recurrence_with(*xs, kernel="recurrent", initial_state=torch.randn(1, 2, 24, 24, device="cuda"),
                                    output_final_state=True)
    # numerics="reference" (the rounding recurrent kernel, its own unit): ModelNew's default for 16-bit inputs
    solution.ModelNew()(*reference.make_inputs(2, 37, 3, 24, 24, dtype=dtype, device="cuda"))
    xs = reference.make_inputs(1, 50, 2, 33, 20, dtype=dtype, device="cuda")
    solution.gated_recurrence(*xs, numerics="reference", initial_state=torch.randn(1, 2, 33, 20, device="cuda"),
                              output_final_state=True)
decode_smoke()
varlen_smoke()
torch.cuda.synchronize()
print("sanitize smoke: done")
