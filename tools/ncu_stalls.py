"""Where a kernel's warps wait, per SASS instruction: the warp-stall samples of Nsight Compute's source
page, summed over the stretches between synchronisation points (named barriers, mbarrier waits, wgmma
waits), the top instructions, and the totals by stall reason.

    ncu --section SourceCounters --section WarpStateStats --profile-from-start off -k regex:chunk_sm90 -c 1 \
        -o /tmp/rep python3 tools/ncu_profile.py 8 2048 16 128 float32
    ncu -i /tmp/rep.ncu-rep --page source --csv --print-source sass > /tmp/src.csv
    python3 tools/ncu_stalls.py /tmp/src.csv [--top 40]
"""
import argparse
import csv
import re
import sys


def number(x):
    try:
        return float(str(x).replace(",", ""))
    except ValueError:
        return 0.0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("csv")
    ap.add_argument("--top", type=int, default=40)
    a = ap.parse_args()
    lines = open(a.csv, encoding="utf-8", errors="replace").read().splitlines()
    start = next(i for i, l in enumerate(lines) if "Source" in l and "," in l)  # skip ncu's preamble
    rows = list(csv.DictReader(lines[start:]))
    cols = list(rows[0].keys())
    src = next(c for c in cols if c.strip() == "Source")
    addr = next((c for c in cols if c.strip() == "Address"), None)
    total = next(c for c in cols if "Sampling (All" in c)
    reasons = [c for c in cols if c.startswith("stall_") or "Stall" in c and c != total and "Not-issued" not in c]
    print("columns:", ", ".join(c.strip() for c in cols))
    all_samples = sum(number(r[total]) for r in rows)
    print(f"instructions {len(rows)}, samples {all_samples:.0f}")
    # stretches: a new one starts at each synchronisation instruction
    sync = re.compile(r"BAR\.|SYNCS|WARPGROUP\.DEPBAR|WARPGROUP\.ARRIVE|USETMAXREG|EXIT|DEPBAR")
    stretches, cur = [], None
    for r in rows:
        s = r[src].strip()
        if cur is None or sync.search(s):
            cur = {"first": f"{r[addr] if addr else ''} {s}", "n": 0, "samples": 0.0}
            stretches.append(cur)
        cur["n"] += 1
        cur["samples"] += number(r[total])
    print("\nstretches by samples (a stretch starts at its synchronisation instruction):")
    for st in sorted(stretches, key=lambda x: -x["samples"])[:a.top]:
        print(f"{st['samples']:9.0f} {100 * st['samples'] / max(all_samples, 1):5.1f}%  {st['n']:5d} instr  {st['first'][:100]}")
    print(f"\ntop {a.top} instructions:")
    for r in sorted(rows, key=lambda r: -number(r[total]))[:a.top]:
        print(f"{number(r[total]):9.0f} {100 * number(r[total]) / max(all_samples, 1):5.1f}%  {r[addr] if addr else ''}  {r[src].strip()[:90]}")
    if reasons:
        print("\nby reason:")
        sums = sorted(((sum(number(r[c]) for r in rows), c) for c in reasons), reverse=True)
        for v, c in sums[:20]:
            if v > 0:
                print(f"{v:9.0f}  {c.strip()}")


if __name__ == "__main__":
    sys.exit(main())
