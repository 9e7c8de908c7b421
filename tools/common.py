"""What the device tools share: their results go to $OUT (the folder the device call brings back)."""
import json
import os


def save(name, obj):
    """obj as indented JSON in $OUT/name (the current folder without OUT)."""
    with open(os.path.join(os.environ.get("OUT", "."), name), "w") as f:
        json.dump(obj, f, indent=1, default=str)
