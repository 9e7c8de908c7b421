"""What the device tools share: their results go to $OUT (the folder the device call brings back)."""
import json
import os


def save(name, obj):
    """obj as indented JSON in $OUT/name (the current folder without OUT)."""
    with open(os.path.join(os.environ.get("OUT", "."), name), "w") as f:
        json.dump(obj, f, indent=1, default=str)


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
