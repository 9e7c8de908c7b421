"""Device check of the chunked path in one process: correctness of chunk_v1 over shapes, dtypes,
launch configurations, gates, layouts, NaN and the state API; then the timing of configurations and
of the recurrent/chunked crossover. Writes $OUT/chunk_check.json and prints one line per case.

    python3 tools/chunk_check.py [--quick] [--no-timing]
"""
import argparse
import os
import sys
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
import naive  # noqa: E402
import reference  # noqa: E402
from timing import kernelbench_time, rel_l2  # noqa: E402
from common import save  # noqa: E402  (tools/common.py: the script's folder is on sys.path)

TOL = {torch.float32: 1e-5, torch.float16: 1e-2, torch.bfloat16: 1e-2}


def make(B, T, H, Dk, Dv, dtype=torch.float32, gate=None):
    q, k, v, g, b = reference.make_inputs(B, T, H, Dk, Dv, dtype=torch.float32, device="cuda")
    if isinstance(gate, float):
        g = torch.full_like(g, gate)
    elif isinstance(gate, tuple):
        g = torch.empty_like(g).uniform_(*gate)
    return [x.to(dtype) for x in (q, k, v, g, b)]


def ref64(xs, s0=None):
    return naive.recurrent_naive(*xs, initial_state=s0)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--no-timing", action="store_true")
    args = ap.parse_args()
    t0 = time.time()
    import solution as sol
    print(f"import solution: {time.time() - t0:.1f} s", flush=True)
    out = {"cases": [], "timing": []}
    bad = 0

    def record(name, err, tol, extra=""):
        nonlocal bad
        ok = err <= tol
        bad += not ok
        out["cases"].append({"case": name, "err": err, "ok": ok})
        print(f"{'ok ' if ok else 'BAD'} {name}: rel-L2 {err:.2e} (tol {tol:.0e}) {extra}", flush=True)

    shapes = [(2, 128, 4, 24, 24), (1, 1, 1, 1, 1), (3, 63, 5, 7, 7), (2, 63, 3, 33, 33), (1, 40, 2, 100, 100),
              (1, 20, 2, 256, 256), (2, 50, 3, 24, 100), (1, 33, 2, 100, 7), (1, 300, 2, 9, 13),
              (1, 1000, 1, 128, 128), (2, 700, 3, 64, 64), (1, 257, 2, 256, 40)]
    configs = [("chunked", ()), ("chunk_v1", (32, 32, 1)), ("chunk_v1", (64, 32, 2)), ("chunk_v1", (64, 64, 5)),
               ("chunk_v1", (64, 64, 1000)), ("chunk_v2", (32, 32, 1)), ("chunk_v2", (32, 64, 3)),
               ("chunk_v2", (32, 64, 1000))]
    for shape in shapes:
        for dtype in (torch.float32, torch.bfloat16, torch.float16):
            xs = make(*shape, dtype=dtype)
            ref, _ = ref64(xs)
            for algo, cfg in (configs if dtype == torch.float32 else configs[:1] + configs[-2:-1]):
                if cfg and cfg[0] == 64 and shape[3] > 128:
                    continue
                torch.empty(1 << 24, device="cuda").fill_(float("nan"))  # poison freed memory
                y = sol.gated_recurrence_with(*xs, algorithm=algo, config=cfg)
                nan = bool(torch.isnan(y).any())
                record(f"{shape} {str(dtype)[6:]} {algo} cfg={cfg or 'plan'}", float("inf") if nan else rel_l2(y, ref),
                       TOL[dtype], "NaN!" if nan else "")
    for gate in (0.0, -0.5, 1.0, 1.02, (-1.2, 1.2), (0.0, 0.05), (0.99, 1.0)):
        xs = make(2, 200, 3, 24, 40, gate=gate)
        y = sol.gated_recurrence_with(*xs, algorithm="chunked", config=(32, 64, 2))
        record(f"gate={gate}", rel_l2(y, ref64(xs)[0]), 1e-5)
    for where, idx in {"q": (0, 5, 1, 3), "k": (1, 7, 2, 0), "v": (0, 9, 0, 4), "gate": (1, 11, 1),
                       "beta": (0, 13, 2)}.items():
        xs = make(2, 100, 3, 24, 20)
        xs["q k v gate beta".split().index(where)][idx] = float("nan")
        y = sol.gated_recurrence_with(*xs, algorithm="chunked", config=(32, 32, 1))
        ref = ref64(xs)[0]
        same = torch.equal(torch.isnan(y), torch.isnan(ref))
        fin = ~torch.isnan(ref)
        record(f"nan in {where} (pattern {'same' if same else 'DIFFERENT'})",
               rel_l2(y[fin], ref[fin]) if same else float("inf"), 1e-5)
    for algo, cfg in (("recurrent", ()), ("chunked", ()), ("chunk_v2", (32, 64, 4)), ("chunk_v1", (64, 64, 1))):
        for T in (0, 5, 300):
            xs = make(2, T, 3, 33, 20)
            s0 = torch.randn(2, 3, 33, 40, device="cuda")[..., ::2]  # strided initial state
            y, sT = sol.gated_recurrence_with(*xs, algorithm=algo, config=cfg, initial_state=s0,
                                              output_final_state=True)
            ry, rs = ref64(xs, s0)
            err = max(rel_l2(y, ry) if T else 0.0, rel_l2(sT, rs))
            record(f"state API {algo} cfg={cfg or 'plan'} T={T}", err, 1e-5)
    layouts = {"transposed": lambda x: x.transpose(1, 2).contiguous().transpose(1, 2),
               "sliced": lambda x: torch.cat([x, x], -1)[..., ::2]}
    for lname, f in layouts.items():
        for dtype in (torch.float32, torch.bfloat16):
            xs = make(2, 300, 3, 32, 64, dtype=dtype)
            xs = [f(x) for x in xs[:3]] + xs[3:]
            y = sol.gated_recurrence_with(*xs, algorithm="chunked")
            record(f"layout {lname} {str(dtype)[6:]}", rel_l2(y, ref64(xs)[0]), TOL[dtype])
    xs = make(2, 500, 4, 64, 48)
    same = torch.equal(sol.gated_recurrence_with(*xs, algorithm="chunked"),
                       sol.gated_recurrence_with(*xs, algorithm="chunked"))
    record("bitwise deterministic", 0.0 if same else float("inf"), 0)
    print(f"correctness: {bad} bad of {len(out['cases'])}", flush=True)

    if not args.no_timing:
        def t(fn, xs, n=50):
            return kernelbench_time(fn, xs, trials=n)["median"]
        big = {"S1": (4, 1024, 8, 64, 64), "S2": (8, 2048, 16, 128, 128), "S3": (1, 8192, 8, 128, 128)}
        tcfgs = [(), (32, 64, 1), (32, 32, 1), (32, 64, 8), (32, 64, 16), (32, 64, 32), (32, 32, 8), (32, 32, 16)]
        for name, shape in big.items():
            for dtype in (torch.float32, torch.bfloat16):
                xs = make(*shape, dtype=dtype)
                for cfg in tcfgs:
                    ms = t(lambda *x, c=cfg: sol.gated_recurrence_with(*x, algorithm="chunked", config=c), xs)
                    row = {"shape": name, "dtype": str(dtype)[6:], "cfg": cfg or sol.plan(*shape), "ms": ms}
                    out["timing"].append(row)
                    print(f"time {name} {row['dtype']} {row['cfg']}: {ms * 1e3:.1f} us", flush=True)
        for (B, H, D) in ((2, 4, 24), (4, 8, 64), (8, 16, 128), (1, 8, 128)):
            for T in (64, 128, 192, 256, 384, 512, 1024):
                xs = make(B, T, H, D, D)
                r = t(lambda *x: sol.gated_recurrence_with(*x, algorithm="recurrent"), xs)
                c = t(lambda *x: sol.gated_recurrence_with(*x, algorithm="chunked"), xs)
                row = {"crossover": (B, T, H, D), "recurrent_ms": r, "chunked_ms": c, "plan": sol.plan(B, T, H, D, D)}
                out["timing"].append(row)
                print(f"crossover {(B, T, H, D)}: recurrent {r * 1e3:.1f} us, chunked {c * 1e3:.1f} us "
                      f"({row['plan']})", flush=True)
    save("chunk_check.json", out)
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
