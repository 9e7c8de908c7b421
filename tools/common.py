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
            "s.loader.exec_module(m); m.build(*sys.argv[2:])")
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
