"""One planned call of solution.gated_recurrence at a shape, for Nsight Compute: prints the plan, warms
up once (build, shared-memory opt-in, allocator), then makes the call to profile between
cudaProfilerStart and cudaProfilerStop.

    python3 tools/ncu_profile.py B T H D [dtype] [--backward]   (dtype: float32 (default), float16, bfloat16;
                                                                 --backward: the backward, _backward_with)
    ncu --profile-from-start off -k regex:chunk --section WarpStateStats python3 tools/ncu_profile.py 8 2048 16 128
    ncu --clock-control none --profile-from-start off -k regex:recurrent python3 tools/ncu_profile.py 2 128 4 24

With --profile-from-start off ncu sees only the second call. Without it, `-c 1` profiles the first
matching launch, the warm-up's (same kernel, same inputs).
"""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repo root
import reference  # noqa: E402
import solution  # noqa: E402


def main():
    backward = "--backward" in sys.argv
    if backward:
        sys.argv.remove("--backward")
    if len(sys.argv) not in (5, 6):
        sys.exit(__doc__)
    B, T, H, D = (int(x) for x in sys.argv[1:5])
    dtype = getattr(torch, sys.argv[5]) if len(sys.argv) > 5 else torch.float32
    xs = reference.make_inputs(B, T, H, D, dtype=dtype, device="cuda")
    if backward:
        dy = torch.randn_like(xs[2])
        print(solution.plan_backward(B, T, H, D, D, dtype), flush=True)
        call = lambda: solution._backward_with(dy, None, *xs)  # noqa: E731
    else:
        print(solution.plan(B, T, H, D, D, dtype), flush=True)
        call = lambda: solution.gated_recurrence(*xs)  # noqa: E731
    call()  # warm-up
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    call()  # the call to profile
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()


if __name__ == "__main__":
    main()
