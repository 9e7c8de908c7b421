"""Cold build times of solution.py's units, each in a fresh process and a fresh extension folder:
the first `import torch, solution` (the core unit) and each chunk unit's first use via build(unit).
Also the warm import (everything cached). Prints a table; writes $OUT/build_times.json.

    python3 tools/build_times.py [--repeat 1]
"""
import argparse
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import save  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def timed(code, ext_dir):
    """Wall seconds of `python3 -c code` in the repository root with TORCH_EXTENSIONS_DIR=ext_dir."""
    env = dict(os.environ, TORCH_EXTENSIONS_DIR=ext_dir)
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return time.perf_counter() - t0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=1)
    args = ap.parse_args()
    rows = []
    for r in range(args.repeat):
        ext = tempfile.mkdtemp(prefix="gr_build_")
        row = {"cold import (core, import torch included)": timed("import torch, solution", ext)}
        for unit in ("chunk_tf32", "chunk_bf16"):
            # the core is cached by now; the difference is the unit's build
            row[f"{unit} first use"] = timed(f"import solution; solution.build('{unit}')", ext) - \
                timed("import solution", ext)
        row["warm import (all cached)"] = timed("import torch, solution", ext)
        rows.append(row)
        print(f"round {r}: " + ", ".join(f"{k} {v:.1f} s" for k, v in row.items()), flush=True)
    save("build_times.json", rows)
    print("| what | seconds |\n|---|---|")
    for k in rows[0]:
        print(f"| {k} | {' / '.join(f'{row[k]:.1f}' for row in rows)} |")


if __name__ == "__main__":
    main()
