"""Small calls for compute-sanitizer (memcheck / racecheck): every kernel and dtype, padded rows and
columns, several chunks and segments, initial and final states, strided and aligned layouts.

    compute-sanitizer --tool memcheck python tools/sanitize_smoke.py
"""
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import reference  # noqa: E402
import solution  # noqa: E402

for dtype in (torch.float32, torch.float16, torch.bfloat16):
    for B, T, H, Dk, Dv in [(2, 37, 3, 24, 24), (1, 20, 2, 33, 100), (1, 9, 1, 256, 8), (1, 50, 1, 7, 5)]:
        xs = reference.make_inputs(B, T, H, Dk, Dv, dtype=dtype, device="cuda")
        solution.gated_recurrence(*xs)
        solution.gated_recurrence(*[x.transpose(1, 2).contiguous().transpose(1, 2) if x.dim() == 4 else x for x in xs])
    xs = reference.make_inputs(1, 40, 2, 24, 24, dtype=dtype, device="cuda")
    solution.gated_recurrence_config(*xs, 6, 4, 8, 7)  # 6 chunks with a ragged last one
    # chunk_v1 in every compiled (C, NV), with segments (state phase + state_scan_v1) and states
    for algo, cfg in [("chunk_v1", (32, 32, 3)), ("chunk_v1", (32, 64, 4)), ("chunk_v1", (64, 32, 2)),
                      ("chunk_v1", (64, 64, 3)), ("chunk_v2", (32, 32, 3)), ("chunk_v2", (32, 64, 4)),
                      ("chunk_v3", (32, 32, 3)), ("chunk_v3", (32, 64, 4))]:
        if algo == "chunk_v3" and dtype != torch.bfloat16:
            continue
        shapes = [(1, 150, 2, 33, 70), (2, 70, 1, 7, 5), (1, 40, 1, 100 if cfg[0] == 64 else 256, 40)]
        if algo != "chunk_v1" and cfg[1] == 64:  # the compiled-D_k kernels (aligned rows)
            shapes += [(1, 150, 2, 64, 72), (1, 150, 2, 128, 64)]
        for B, T, H, Dk, Dv in shapes:
            xs = reference.make_inputs(B, T, H, Dk, Dv, dtype=dtype, device="cuda")
            s0 = torch.randn(B, H, Dk, Dv, device="cuda")
            solution.gated_recurrence_with(*xs, algorithm=algo, config=cfg, initial_state=s0,
                                           output_final_state=True)
        xs = reference.make_inputs(1, 100, 1, 24, 20, dtype=dtype, device="cuda")
        xs[2][0, 40, 0, 3] = float("nan")  # the fp32 diagonal path for a non-finite v
        solution.gated_recurrence_with(*xs, algorithm=algo, config=cfg)
    xs = reference.make_inputs(1, 50, 2, 24, 24, dtype=dtype, device="cuda")
    solution.gated_recurrence_with(*xs, algorithm="recurrent", initial_state=torch.randn(1, 2, 24, 24, device="cuda"),
                                   output_final_state=True)
torch.cuda.synchronize()
print("sanitize smoke: done")
