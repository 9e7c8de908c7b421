"""Our eval.py against KernelBench's own eval_kernel_against_ref, on the same problem pair.

KernelBench is not vendored: fetch ScalingIntelligence/KernelBench, put its src/ in an ignored
folder of this checkout (e.g. .kb/src), carry it to the device, then

    python tools/kernelbench_compare.py --kernelbench .kb/src [--precisions fp32,fp16,bf16] [--seeds 0,1,...]
                                        [--seq-lens 128,1024] [--ours] [--ref reference.py] [--solution solution.py]

Prints KernelBench's verdict (5 correctness trials a seed) and runtime (ms, first seed) per precision
and T. Keyword arguments are filtered by the installed KernelBench's signature, since it has changed
between versions.
"""
import argparse
import inspect
import json
import os
import re
import sys

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, HERE)


def stub_missing_modules():
    """kernelbench/utils.py imports LLM-client packages (openai, litellm, dotenv, ...) that its eval never
    calls; where the device lacks one, an empty stand-in module lets the import through."""
    import importlib.util
    import types

    class BaseModel:  # pydantic's, as far as KernelExecResult uses it
        def __init__(self, **kw):
            for cls in reversed(type(self).__mro__):
                for name in getattr(cls, "__annotations__", {}):
                    setattr(self, name, getattr(cls, name, None))
            for name, value in kw.items():
                setattr(self, name, value)

    stubs = {"dotenv": {"load_dotenv": lambda *a, **k: None}, "openai": {"OpenAI": object},
             "litellm": {"completion": None}, "tqdm": {"tqdm": lambda it=None, *a, **k: it},
             "requests": {}, "pydantic": {"BaseModel": BaseModel}}
    for name, attrs in stubs.items():
        if importlib.util.find_spec(name) is None:
            mod = types.ModuleType(name)
            mod.__dict__.update(attrs)
            sys.modules[name] = mod
            print(f"kernelbench_compare: stubbed missing module {name}", file=sys.stderr)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kernelbench", required=True, help="KernelBench's src/ folder")
    ap.add_argument("--ref", default=os.path.join(HERE, "reference.py"))
    ap.add_argument("--solution", default=os.path.join(HERE, "solution.py"))
    ap.add_argument("--perf-trials", type=int, default=100)
    ap.add_argument("--precisions", default="fp32", help="comma-separated: fp32, fp16, bf16")
    ap.add_argument("--seeds", default="42", help="comma-separated seed_num values (5 correctness trials each)")
    ap.add_argument("--seq-lens", default="", help="comma-separated T to run the problem at (reference.py's "
                                                   "seq_len rewritten); the file's own when empty")
    ap.add_argument("--ours", action="store_true", help="also run our eval.py at fp32 on the pair")
    args = ap.parse_args()
    sys.path.insert(0, os.path.abspath(args.kernelbench))
    stub_missing_modules()
    from kernelbench.eval import eval_kernel_against_ref  # noqa: E402  (path set above)
    import torch

    dtypes = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
    for prec in args.precisions.split(","):
        if prec not in dtypes:
            sys.exit(f"--precisions: {prec!r} is not one of fp32, fp16, bf16")
    ref_src, sol_src = open(args.ref).read(), open(args.solution).read()
    params = inspect.signature(eval_kernel_against_ref).parameters
    rows = []
    for T in [int(t) for t in args.seq_lens.split(",") if t] or [None]:
        src, n = (ref_src, 1) if T is None else re.subn(r"^seq_len = \d+", f"seq_len = {T}", ref_src, flags=re.M)
        if n != 1:
            sys.exit(f"{args.ref}: no single 'seq_len = N' line to set T={T} in")
        for prec in args.precisions.split(","):
            for i, seed in enumerate(int(x) for x in args.seeds.split(",")):
                wanted = {"seed_num": seed, "num_correct_trials": 5, "num_perf_trials": args.perf_trials,
                          "measure_performance": i == 0, "verbose": False, "device": torch.device("cuda:0"),
                          "backend": "cuda", "precision": dtypes[prec], "check_for_excessive_speedup": False}
                kb = eval_kernel_against_ref(src, sol_src, **{k: v for k, v in wanted.items() if k in params})
                meta = getattr(kb, "metadata", {}) or {}
                row = {"seq_len": T, "precision": prec, "seed": seed, "compiled": kb.compiled,
                       "correctness": kb.correctness, "trials": meta.get("correctness_trials"),
                       "runtime_ms": kb.runtime if i == 0 else None,
                       "ref_runtime_ms": getattr(kb, "ref_runtime", None) if i == 0 else None,
                       "max_difference": meta.get("max_difference")}
                rows.append(row)
                print(json.dumps(row, default=str), flush=True)
    if args.ours:
        import eval as ours
        mine = ours.evaluate(args.ref, args.solution, perf_trials=args.perf_trials)
        print(json.dumps({"ours_fp32": {"correctness": mine["correctness"], "runtime_ms": mine["runtime"],
                                        "median_ms": mine["runtime_stats"].get("median")}}, default=str))
    by = {}
    for r in rows:
        by.setdefault((r["seq_len"], r["precision"]), []).append(bool(r["correctness"]))
    for (T, prec), oks in by.items():
        print(f"KernelBench eval_kernel_against_ref T={T or 'file'} {prec}: correct at {sum(oks)} of {len(oks)} seeds")
    out = os.environ.get("OUT")
    if out:
        with open(os.path.join(out, "kernelbench.json"), "w") as f:
            json.dump(rows, f, indent=1, default=str)


if __name__ == "__main__":
    main()
