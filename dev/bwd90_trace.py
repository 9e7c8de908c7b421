"""Where chunk_bwd_sm90's chunk time goes: a copy of solution.py with clock64 stamps between the phases of
each chunk (consumer warps' lane 0 and WG0's thread 0 of a few CTAs), summed over the chunks and printed by the
kernel at its end (device printf), then the cycles a phase a chunk per role. The copy is made here by inserting
stamps at marker lines of BACKWARD_SM90_SRC (a marker that no longer matches is an error: update the list).
Also the kernel's time (KernelBench median) for the copy without stamps, to convert cycles to us.

    python3 dev/bwd90_trace.py [--shapes S4-bf16,S2-bf16] [--extra LABEL=PATH ...]
(--extra: other solution.py copies timed beside it, e.g. variants written to scratch/; writes $OUT/bwd90_trace.json)
"""
import argparse
import os
import re
import subprocess
import sys

sys.path.insert(0, os.getcwd())

# (marker in BACKWARD_SM90_SRC, or a tuple of its forms in the kernel's versions; phase name). The stamp ends the
# phase: it goes after the marker's text, or before it with the prefix BEFORE.
CONS = [
    ("    const int tc = min(64, p.T - (int)t0);  // the chunk's steps (rows past T are not stored)", "top"),
    ("    sync_all<6>();  // (1) the chunk's tiles and tables", "wait tiles+tables (1)"),
    ("      if (kb == 0) wgmma_ss64_z(X, da, db);\n      else wgmma_ss64(X, da, db, 1);\n    }\n    wg_commit();\n"
     "    wg_wait<0>();", "X = QK | Dd"),
    ("    const bool bad = consumers_sync_or(nf) || wg0_flag[0] || wg0_flag[1];", "weights + (2)"),
    ("          if (g == 0) part[1672 + wl * 64 + t] = x;\n        }\n    }", "dgate M (c0 only)"),
    ("      for (int r = 0; r < 8; ++r) c0 = fmaf(sv[r], G[8 * kb + r], c0);\n    });", "R^T"),
    ("    else store_t<true>(dq + row0, rs, R, nullptr, i0, wl, g, q, tc);  // the last chunk", "f + dq prod + dq store"),
    ("    }, [](int, const float (&)[8]) {});", "Rk^T"),
    ("    else store_t<true>(dk + row0, rs, Rk, tab + 192, i0, wl, g, q, tc);", "e + dkt prod + dbeta + dk store"),
    ("      wgmma_ss64_t(R, da, mdesc(sm, kGL + 16384 * c, 128, kb), 1);\n    }\n    wg_commit();\n    wg_wait<0>();",
     "KG"),
    ("            __floats2bfloat162_rn(R[4 * n + 2 * hh], R[4 * n + 2 * hh + 1]);\n      }", "dv prod + dv store"),
    ("    consumers_sync();  // (5) both consumers' KG have read G's hi / lo", "(3) + (5)"),
    ("      wgmma_rs128_t(G, al, db, 1);\n    }\n    wg_commit();\n    if (ch > 0) load_tiles<6, 256>(p, sm, b, h, ch - 1, lt + 128 * c);"
     "  // k and v (KG was their last reader), during the update\n    wg_wait<0>();", "G update + k,v loads"),
    ("    put_g();\n    sync_all<6>();  // (6) the chunk is done", "put_g + (6)"),
]
AUX = [
    ("  for (int ch = nck - 1; ch >= 0; --ch) {\n    const int t0 = ch * 64, tc = min(64, p.T - t0);", "top"),
    ("      if ((tid & 31) == 0) reinterpret_cast<int*>(part)[1928 + (tid >> 5)] = m != 0u;\n    }\n    wg0_sync();",
     "gates + sync"),
    ("BEFORE    tiles_landed();\n    sync_all<6>();  // (1)\n    if (tid < 64 && ch > 0)", "tables"),
    ("    tiles_landed();\n    sync_all<6>();  // (1)\n    if (tid < 64 && ch > 0) g_next = gate_at(p, b, h, t0 - 64 + tid), "
     "b_next = beta_at(p, b, h, t0 - 64 + tid);", "wait (1)"),
    ("    sync_all<3>();    // (3) the partials", "wait (3)"),
    ("    if (x == 0 && t < tc) put_gb(p.dgate, p.g32, go + t * p.H, td);\n    sync_all<6>();  // (6)", "dgate + (6)"),
]
TRACE_CTAS = (0, 1, 131)


def traced_source(src):
    """BACKWARD_SM90_SRC with the stamps."""
    out = src
    for role, marks in (("c", CONS), ("a", AUX)):
        for i, (alts, _) in enumerate(marks):  # a marker, or its forms in the kernel's versions
            alts = (alts,) if isinstance(alts, str) else alts
            found = [m for m in alts if out.count(m.removeprefix("BEFORE")) == 1]
            if len(found) != 1:
                raise SystemExit(f"marker {i} of {role}: no single match among {[m[:60] for m in alts]}")
            m = found[0]
            stamp = f"    TRACE_{role.upper()}({i});"
            if m.startswith("BEFORE"):  # the stamp before the marker's text
                out = out.replace(m[6:], stamp + "\n" + m[6:])
            else:
                out = out.replace(m, m + "\n" + stamp)
    decl = ("  long long tr_last = clock64(), tr_acc[%d] = {}, tr_abs[%d] = {};\n"
            "  const bool tr_on = (blockIdx.x == %s) && (threadIdx.x & 127) == 0;\n")
    cta = " || blockIdx.x == ".join(str(c) for c in TRACE_CTAS)
    macro = ("#define TRACE_C(i) do { long long n_ = clock64(); tr_acc[i] += n_ - tr_last; tr_last = n_; "
             "if (ch == nck / 2) tr_abs[i] = n_; } while (0)\n"
             "#define TRACE_A(i) TRACE_C(i)\n")
    out = out.replace("namespace bwd90 {\n", "namespace bwd90 {\n" + macro, 1)
    out = out.replace('BACKWARD_SM90_SRC = ("', 'BACKWARD_SM90_SRC = ("#include <cstdio>\\n', 1)
    for head, n in (("__device__ void consumer(const Params& p, unsigned char* sm, int c, int64_t bh, int nck) {\n",
                     len(CONS)),
                    ("__device__ void aux(const Params& p, unsigned char* sm, int64_t bh, int nck) {\n", len(AUX))):
        assert out.count(head) == 1, head
        out = out.replace(head, head + decl % (n, n, cta))
    # the prints: the consumer's before its early return (no S_0), aux's after its loop
    pr_c = ("  if (tr_on) printf(\"TRACE cta %d wg %d" + " %lld" * len(CONS) + "\\n\", (int)blockIdx.x, (int)(threadIdx.x >> 7)"
            + "".join(f", tr_acc[{i}]" for i in range(len(CONS))) + ");\n"
            "  if (tr_on) printf(\"ABS cta %d wg %d" + " %lld" * len(CONS) + "\\n\", (int)blockIdx.x, (int)(threadIdx.x >> 7)"
            + "".join(f", tr_abs[{i}]" for i in range(len(CONS))) + ");\n")
    pr_a = ("  if (tr_on) printf(\"TRACE cta %d wg 0" + " %lld" * len(AUX) + "\\n\", (int)blockIdx.x"
            + "".join(f", tr_acc[{i}]" for i in range(len(AUX))) + ");\n"
            "  if (tr_on) printf(\"ABS cta %d wg 0" + " %lld" * len(AUX) + "\\n\", (int)blockIdx.x"
            + "".join(f", tr_abs[{i}]" for i in range(len(AUX))) + ");\n")
    m = "  if (p.ds0 == nullptr) return;  // (no initial state)"
    assert out.count(m) == 1
    out = out.replace(m, pr_c + m)
    m = ("    if (x == 0 && t < tc) put_gb(p.dgate, p.g32, go + t * p.H, td);\n    sync_all<6>();  // (6)\n"
         f"    TRACE_A({len(AUX) - 1});\n  }}\n")
    assert out.count(m) == 1, "aux end"
    out = out.replace(m, m + pr_a)
    return out


def write_copy(path):
    import solution
    text = open(solution.__file__).read()
    start = text.index("BACKWARD_SM90_SRC = (")
    end = text.index('\n""")\n', start)
    new_src = traced_source(text[start:end])
    open(path, "w").write(text[:start] + new_src + text[end:])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="S4-bf16,S2-bf16")
    ap.add_argument("--extra", action="append", default=[])
    ap.add_argument("--trials", type=int, default=10)
    args = ap.parse_args()
    os.makedirs("scratch", exist_ok=True)
    write_copy("scratch/trace_solution.py")
    from tools.common import load_copies, prebuild, save
    prebuild(["solution.py", "scratch/trace_solution.py"] + [e.split("=", 1)[1] for e in args.extra], ["backward_sm90"])
    import torch
    import solution
    import reference
    from bench import SHAPES
    from timing import kernelbench_time
    mods = load_copies(["trace=scratch/trace_solution.py"] + args.extra, solution)
    res = {}
    for name in args.shapes.split(","):
        B, T, H, D, dtype = SHAPES[name][:5]
        gen = torch.Generator().manual_seed(1)
        q, k, v, g, b = [x.cuda() for x in reference.make_inputs(B, T, H, D, D, dtype=dtype, generator=gen)]
        dy = torch.randn(B, T, H, D, generator=gen).to(dtype).cuda()
        for label, m in mods.items():
            if label == "trace":
                continue
            fn = lambda m=m: m._backward_with(dy, None, q, k, v, g, b, kernel="chunk_bwd_sm90")  # noqa: E731
            st = kernelbench_time(fn, (), trials=args.trials)
            res[f"{name} {label}"] = st
            print(f"{name} {label}: {st}", flush=True)
        # the traced copy: one call, its printf lines through a child's stdout (device printf is the process's stdout)
        code = ("import sys, torch; sys.path.insert(0, '.'); import importlib.util as u; "
                "s = u.spec_from_file_location('tr', 'scratch/trace_solution.py'); m = u.module_from_spec(s); "
                "s.loader.exec_module(m); import reference; from bench import SHAPES; "
                f"B, T, H, D, dt = SHAPES['{name}'][:5]; gen = torch.Generator().manual_seed(1); "
                "x = [t.cuda() for t in reference.make_inputs(B, T, H, D, D, dtype=dt, generator=gen)]; "
                "dy = torch.randn(B, T, H, D, generator=gen).to(dt).cuda(); "
                "m._backward_with(dy, None, *x, kernel='chunk_bwd_sm90'); torch.cuda.synchronize()")
        child = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
        out = child.stdout
        nck = (T + 63) // 64
        rows = {}
        for line in out.splitlines():
            mm = re.match(r"TRACE cta (\d+) wg (\d+) (.*)", line)
            if not mm:
                continue
            vals = [int(x) / nck for x in mm.group(3).split()]
            wg = int(mm.group(2))
            names = [n for _, n in (AUX if wg == 0 else CONS)]
            rows[f"cta {mm.group(1)} wg {wg}"] = dict(zip(names, vals))
            print(f"{name} cta {mm.group(1)} wg {wg}: cycles a chunk (total {sum(vals):.0f})")
            for n, x in zip(names, vals):
                print(f"    {x:8.0f}  {n}")
        absr = {}
        for line in out.splitlines():
            mm = re.match(r"ABS cta (\d+) wg (\d+) (.*)", line)
            if mm:
                absr[(int(mm.group(1)), int(mm.group(2)))] = [int(x) for x in mm.group(3).split()]
        for cta in TRACE_CTAS:
            if (cta, 0) not in absr:
                continue
            t0 = min(min(v) for (c, w), v in absr.items() if c == cta)
            print(f"{name} cta {cta}: chunk nck/2 on one axis (cycles from its first stamp)")
            for w in (0, 1, 2):
                names = [n for _, n in (AUX if w == 0 else CONS)]
                print(f"  wg {w}: " + ", ".join(f"{n} {x - t0}" for n, x in zip(names, absr[(cta, w)])))
            rows[f"cta {cta} abs"] = {str(w): absr[(cta, w)] for w in (0, 1, 2)}
        if not rows:  # (a fault in the traced copy: its error is on stderr)
            print(f"no stamps (rc {child.returncode}):", out[-1500:], child.stderr[-3000:])
        res[f"{name} trace"] = rows
    save("bwd90_trace.json", res)


if __name__ == "__main__":
    main()
