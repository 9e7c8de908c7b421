"""Whether two copies of solution.py compile a unit to the same PTX: the check of a pure refactor, on a machine
without a GPU (nvcc only; no import of either copy, so no core build). Each copy's module-level source strings are
run up to the build section, the unit's CUDA sources (solution._unit_sources' order) written to x.cu in a folder of
its own (the anonymous namespace's mangled name carries the file's name), compiled with the units' flags to PTX, and
compared with the anonymous namespace names (and internal-linkage prefixes, hashes of the file) and comments
taken out.

    python3 tools/ptx_same.py OLD.py NEW.py [--units chunk_sm90,backward_sm90] [--arch compute_90a] [--keep DIR]

OLD.py may be `git show REV:solution.py > /tmp/old.py`. Prints one line a unit (same, or the first differing
lines) and exits 1 if any unit differs. Same PTX gives the same machine code (ptxas sees the same input).
"""
import argparse
import os
import re
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor

FLAGS = ["-D__CUDA_NO_HALF_OPERATORS__", "-D__CUDA_NO_HALF_CONVERSIONS__", "-D__CUDA_NO_BFLOAT16_CONVERSIONS__",
         "-D__CUDA_NO_HALF2_OPERATORS__", "--expt-relaxed-constexpr", "-O3", "-std=c++20", "-ptx"]
CUT = "# Units built for one target"  # solution.py's build section starts here (after _UNIT_CUDA)


def unit_source(path, unit):
    """The unit's CUDA source as solution.py hands it to load_inline (its strings, concatenated)."""
    text = open(path).read()
    ns = {"__name__": "ptx_same_copy"}
    exec(compile(text[:text.index(CUT)], path, "exec"), ns)
    return "".join([ns["PRELUDE_SRC"], ns["DEVICE_SRC"]] + ns["_UNIT_CUDA"][unit])


def ptx(source, folder, arch, nvcc):
    """PTX of source, compiled as folder/x.cu, without anonymous namespace names and comments."""
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "x.cu"), "w") as f:
        f.write(source)
    subprocess.run([nvcc, *FLAGS, f"-arch={arch}", "x.cu", "-o", "x.ptx"], cwd=folder, check=True)
    text = open(os.path.join(folder, "x.ptx")).read()
    anon = re.compile(r"_GLOBAL__N__[0-9a-f_]+|_INTERNAL_[0-9a-f]+")
    return [anon.sub("ANON", line) for line in text.splitlines() if not line.startswith("//")]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("old")
    ap.add_argument("new")
    ap.add_argument("--units", default="chunk_sm90,backward_sm90,backward_sm90_fp32")
    ap.add_argument("--arch", default="compute_90a")
    ap.add_argument("--keep", help="write the folders here (default: a temporary folder)")
    args = ap.parse_args()
    nvcc = os.path.join(os.environ.get("CUDA_HOME", "/usr/local/cuda"), "bin", "nvcc")
    root = args.keep or tempfile.mkdtemp(prefix="ptx_same_")
    differ = False
    for unit in args.units.split(","):
        with ThreadPoolExecutor(2) as pool:
            old, new = pool.map(lambda a: ptx(unit_source(a[0], unit), os.path.join(root, unit, a[1]), args.arch, nvcc),
                                [(args.old, "old"), (args.new, "new")])
        if old == new:
            print(f"{unit}: same PTX ({len(old)} lines)")
            continue
        differ = True
        first = next(i for i, (a, b) in enumerate(zip(old + [""], new + [""])) if a != b)
        at = [x[first] if first < len(x) else "(end)" for x in (old, new)]
        print(f"{unit}: PTX differs ({len(old)} and {len(new)} lines), first at line {first + 1}:\n"
              f"  old: {at[0]}\n  new: {at[1]}")
    sys.exit(1 if differ else 0)


if __name__ == "__main__":
    main()
