"""Where a training step's time beyond its kernels goes: host time of the forward's pieces (each after a
synchronize, no GPU wait inside), the step's host time, the CPU side of a profiled step by self time, and the
CUDA timeline of flushed steps (kernel starts and lengths, us from the first flush).

    python3 dev/step_host.py [S4-bf16,S2-bf16]     (bench.py's shape names; $OUT/step_host.json with OUT set)
"""
import json
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.getcwd())
import reference  # noqa: E402
import solution as sol  # noqa: E402
from bench import SHAPES  # noqa: E402
from timing import flush_l2, kernelbench_time  # noqa: E402


def host_us(fn, n=20, keep=False):
    """min / median / max host time of fn() in us (a synchronize after the flush and after each call); keep: the previous result stays alive during the next call,
    as in kernelbench_time's loop (out = fn(*args))."""
    ts, last = [], None
    for _ in range(n):
        flush_l2()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        r = fn()
        ts.append((time.perf_counter() - t0) * 1e6)
        last = r if keep else None
        del r
        torch.cuda.synchronize()
    del last
    return {"min": min(ts), "median": statistics.median(ts), "max": max(ts)}


def timeline(step, steps=3):
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            flush_l2()
            step()
            torch.cuda.synchronize()
    evs = sorted((ev for ev in prof.events() if ev.device_type == torch.autograd.DeviceType.CUDA),
                 key=lambda ev: ev.time_range.start)
    t0 = evs[0].time_range.start
    lines = [f"{ev.time_range.start - t0:10.1f} {ev.time_range.end - ev.time_range.start:9.1f}  {ev.name[:70]}"
             for ev in evs]
    return lines, prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=14, max_name_column_width=60)


def main():
    out = {}
    for name in (sys.argv[1] if len(sys.argv) > 1 else "S4-bf16,S2-bf16").split(","):
        B, T, H, D, dtype = SHAPES[name]
        gen = torch.Generator().manual_seed(0)
        xs = reference.make_inputs(B, T, H, D, dtype=dtype, device="cuda", generator=gen)
        dy = torch.randn(B, T, H, D, generator=gen).to("cuda", dtype)
        leaves = [x.detach().requires_grad_() for x in xs]
        step = lambda: torch.autograd.grad(sol.gated_recurrence(*leaves), leaves, dy)  # noqa: E731
        for _ in range(3):
            step()
        torch.cuda.synchronize()
        row = {
            "forward_ex with checkpoints (no grad)": host_us(lambda: sol._call(sol._core.forward_ex, *xs, None, False, "", [], False, True)),
            "forward_ex": host_us(lambda: sol._call(sol._core.forward_ex, *xs, None, False, "", [], False)),
            "forward (no grad)": host_us(lambda: sol._call(sol._core.forward, *xs, False)),
            "gated_recurrence (grad)": host_us(lambda: sol.gated_recurrence(*leaves)),
            "gated_recurrence (grad), the last y alive": host_us(lambda: sol.gated_recurrence(*leaves), keep=True),
            "step": host_us(step),
            "step, the last gradients alive": host_us(step, keep=True),
        }
        row["timeline"], table = timeline(step)
        row["kernelbench_step_ms"] = kernelbench_time(lambda: step(), [], trials=30)
        out[name] = row
        print(name)
        for k, v in row.items():
            if isinstance(v, dict):
                print(f"  {k:45s} " + " ".join(f"{a} {b:.4g}" for a, b in v.items()))
        print("\n".join(row["timeline"]))
        print(table)
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "step_host.json"), "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
