"""Our eval.py against KernelBench's own eval_kernel_against_ref, on the same problem pair.

KernelBench is not vendored: fetch ScalingIntelligence/KernelBench, put its src/ in an ignored
folder of this checkout (e.g. .kb/src), carry it to the device, then

    python tools/kernelbench_compare.py --kernelbench .kb/src [--ref reference.py] [--solution solution.py]

Prints both verdicts and runtimes (ms). Keyword arguments are filtered by the installed
KernelBench's signature, since it has changed between versions.
"""
import argparse
import inspect
import json
import os
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
    args = ap.parse_args()
    sys.path.insert(0, os.path.abspath(args.kernelbench))
    stub_missing_modules()
    from kernelbench.eval import eval_kernel_against_ref  # noqa: E402  (path set above)
    import torch

    import eval as ours

    wanted = {"seed_num": 42, "num_correct_trials": 5, "num_perf_trials": args.perf_trials,
              "measure_performance": True, "verbose": False, "device": torch.device("cuda:0"),
              "backend": "cuda", "precision": torch.float32, "check_for_excessive_speedup": False}
    params = inspect.signature(eval_kernel_against_ref).parameters
    kb = eval_kernel_against_ref(open(args.ref).read(), open(args.solution).read(),
                                 **{k: v for k, v in wanted.items() if k in params})
    mine = ours.evaluate(args.ref, args.solution, perf_trials=args.perf_trials)
    rows = {
        "kernelbench": {"compiled": kb.compiled, "correctness": kb.correctness, "runtime_ms": kb.runtime,
                        "ref_runtime_ms": getattr(kb, "ref_runtime", None), "runtime_stats": kb.runtime_stats},
        "ours": {"compiled": mine["compiled"], "correctness": mine["correctness"], "runtime_ms": mine["runtime"],
                 "ref_runtime_ms": mine["ref_runtime"], "median_ms": mine["runtime_stats"].get("median")},
    }
    print(json.dumps(rows, indent=1, default=str))


if __name__ == "__main__":
    main()
