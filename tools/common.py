"""What the device tools share: their results go to $OUT (the folder the device call brings back)."""
import json
import os


def save(name, obj):
    """obj as indented JSON in $OUT/name (the current folder without OUT)."""
    with open(os.path.join(os.environ.get("OUT", "."), name), "w") as f:
        json.dump(obj, f, indent=1, default=str)


def prebuild(paths, units):
    """Build `units` of every solution.py copy in `paths` at once, one process a copy (each copy compiles its own
    core and units; in turn they would take a minute each of a device call). Later imports find the builds."""
    import subprocess
    import sys
    code = ("import importlib.util as u, sys; sys.path.insert(0, '.'); "
            "s = u.spec_from_file_location('prebuilt', sys.argv[1]); m = u.module_from_spec(s); "
            "s.loader.exec_module(m); m.build(*[x for x in sys.argv[2:] if x in m.UNITS])")  # (an older copy: its units)
    procs = [subprocess.Popen([sys.executable, "-c", code, path, *units]) for path in paths]
    failed = [path for path, p in zip(paths, procs) if p.wait() != 0]
    if failed:
        raise SystemExit(f"prebuild failed for {failed}")


def load_copies(baselines, this):
    """{"new": this} and each "LABEL=PATH" of baselines loaded as its own module (another solution.py: its
    own operator namespace and build units, so the copies run side by side in one process)."""
    import importlib.util
    mods = {"new": this}
    for b in baselines:
        label, path = b.split("=", 1)
        spec = importlib.util.spec_from_file_location(f"solution_{label}", path)
        mods[label] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mods[label])
    return mods


def add_copy_args(ap, shapes, reps, trials):
    """The arguments of the copy A/B tools (bwd_ab, train_ab): other solution.py copies, shapes, rounds, calls, and
    --profile (profile_kernels)."""
    ap.add_argument("--baseline", action="append", default=[], help="LABEL=PATH of another solution.py")
    ap.add_argument("--shapes", default=shapes)
    ap.add_argument("--reps", type=int, default=reps)
    ap.add_argument("--trials", type=int, default=trials)
    ap.add_argument("--profile", action="store_true", help="also each run's kernels' mean GPU times (torch.profiler)")


def copies(args, units):
    """{"new": the repo's solution, LABEL: each --baseline copy}, every copy's `units` built first, all at once."""
    prebuild(["solution.py"] + [b.split("=", 1)[1] for b in args.baseline], units)
    import solution
    return load_copies(args.baseline, solution)


def rounds(runs, reps, time_one, times, prefix):
    """Each (label, fn) of runs timed by time_one(label, fn) (ms) over reps rounds, each round in another order (no
    run is always first after the flush); appended to times[f"{prefix} {label}"]."""
    for rep in range(reps):
        for label, fn in runs[rep % len(runs):] + runs[:rep % len(runs)]:
            t = time_one(label, fn)
            times.setdefault(f"{prefix} {label}", []).append(round(t, 4))
            print(f"  {prefix} {label}: {t:.3f} ms", flush=True)


def profile_kernels(calls, xs, times, prefix, reps=5):
    """Each (label, fn) of calls run reps times under torch.profiler (no flush between calls): every CUDA kernel's
    mean time (ms), appended to times[f"{prefix} {label} kernel {name}"] (names cut at 70 characters)."""
    import torch
    from torch.profiler import profile, ProfilerActivity
    for label, call in calls:
        call(*xs)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(reps):
                call(*xs)
            torch.cuda.synchronize()
        for ev in prof.key_averages():
            if ev.device_type.name == "CUDA" and ev.count >= reps:
                us = ev.device_time_total / ev.count
                times.setdefault(f"{prefix} {label} kernel {ev.key[:70]}", []).append(round(us / 1000, 4))
                print(f"  {prefix} {label} kernel {ev.key[:60]}: {us:.1f} us ({ev.count // reps} a call)", flush=True)


def report(times, name, extra):
    """Each key's rounds and their min; $OUT/name with {"ms": times} and extra."""
    for key, v in times.items():
        print(f"{key:28s} ms {v}  min {min(v)}")
    if os.environ.get("OUT"):
        save(name, dict(extra, ms=times))
