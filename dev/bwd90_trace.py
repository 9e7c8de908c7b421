"""Where chunk_bwd_sm90's chunk time goes: a copy of solution.py with clock64 stamps between the phases of
each chunk (consumer warps' lane 0 and WG0's thread 0 of a few CTAs), summed over the chunks and printed by the
kernel at its end (device printf), then the cycles a phase a chunk per role. The copy is made here by inserting
stamps at marker lines of BACKWARD_SM90_SRC (a marker that no longer matches is an error: update the list).
Also the kernel's time (KernelBench median) for the copy without stamps, to convert cycles to us.

    python3 dev/bwd90_trace.py [--shapes S4-bf16,S2-bf16] [--extra LABEL=PATH ...] [--ablate no_m,no_tables,...]
(--extra: other solution.py copies timed beside it, e.g. variants written to scratch/; --ablate: copies with a piece
removed (ABLATIONS), timed beside it; writes $OUT/bwd90_trace.json)
"""
import argparse
import os
import re
import subprocess
import sys

sys.path.insert(0, os.getcwd())

# (marker in BACKWARD_SM90_SRC, or a tuple of its forms in the kernel's versions; phase name). The stamp ends the
# phase: it goes after the marker's text, or before it with the prefix BEFORE.
CONS = [  # (in the order they run)
    ("    const int tc = min(64, p.T - (int)t0);  // the chunk's steps (rows past T are not stored)", "top"),
    ("    sync_all<6>();  // (1) the chunk's tiles and tables", "S loads + c0 + wait tiles+tables (1)"),
    ("BEFORE    // X = QK (c = 0) or Dd (c = 1)", "R^T"),  # (after R^T in every version, the ck16 patch's too)
    ("      if (kb == 0) wgmma_ss64_z(X, da, db);\n      else wgmma_ss64(X, da, db, 1);\n    }\n    wg_commit();\n"
     "    wg_wait<0>();", "X = QK | Dd"),
    ("    const bool bad = consumers_sync_or(nf) || wg0_flag[0] || wg0_flag[1];", "weights + (2)"),
    ("    else store_t<true>(dq + row0, rs, R, nullptr, i0, wl, g, q, tc);  // the last chunk", "f + dq prod + dq store"),
    ("    if (ch > 0) lx_free_arrive();  // (4) its reads of Lx done: WG0 writes the next chunk's", "dgate M (a half each)"),
    ("      for (int r = 0; r < 8; ++r) sv[r] = G[8 * kb + r];\n    });", "Rk^T"),
    ("    else store_t<true>(dk + row0, rs, Rk, tab + 192, i0, wl, g, q, tc);", "e + dkt prod + dbeta + dk store"),
    ("      wgmma_ss64_t(R, da, mdesc(sm, kGL + 16384 * c, 128, kb), 1);\n    }\n    wg_commit();\n    wg_wait<0>();",
     "KG"),
    ("            __floats2bfloat162_rn(R[4 * n + 2 * hh], R[4 * n + 2 * hh + 1]);\n      }", "dv prod + dv store"),
    ("    consumers_sync();  // (5) both consumers' KG have read G's hi / lo", "(5)"),
    ("      wgmma_rs128_t(G, al, db, 1);\n    }\n    wg_commit();\n    if (ch > 0) load_tiles<6, 256>(p, sm, b, h, ch - 1, lt + 128 * c);"
     "  // k and v (KG was their last reader), during the update\n    wg_wait<0>();", "G update + k,v loads"),
    ("    put_g();\n    consumers_sync();  // (6) the chunk is done (the next chunk's tiles overwrite what both read)",
     "put_g + (6)"),
]
# dev/chunk_bwd_sm90_s27_gearly.patch's order: G's update with Rk^T, (5) and the next chunk's loads right after KG
# (with the no6 patch, no barrier at the end)
CONS_GEARLY = CONS[:7] + [
    ("    acc_fence(Rk);\n    acc_fence(G);", "G update + Rk^T"),
    CONS[8],  # e + dkt prod + dbeta + dk store
    CONS[9],  # KG
    ("    if (ch > 0) load_tiles<15, 256>(p, sm, b, h, ch - 1, lt + 128 * c, oMD, oMQ);", "(5) + next tiles"),
    CONS[10],  # dv prod + dv store
    (("    put_g();  // (the update's G, formed since R^T; both consumers' KG have read the old at (5))\n"
      "    consumers_sync();  // (6) the chunk is done (the next chunk's tiles overwrite what both read)",
      "    // readers of it, and its writers of what this chunk's dv still reads (MQ / MD where q / dy were), come after"
      " (1))"), "put_g (+ (6))"),
]
AUX = [  # (in the order they run)
    ("  for (int ch = nck - 1; ch >= 0; --ch) {\n    const int t0 = ch * 64;", "top"),
    ("    sync_all<6>();  // (1)\n    if (ch + 1 < nck) {", "wait (1)"),
    ("      dgate_dbeta(p, sm, b, h, ch + 1);\n      wg0_sync();\n    }", "the chunk before's dgate"),
    ("BEFORE      lx_free_wait();  // (4)", "next chunk's tables"),
    ("      lx_free_wait();  // (4) the consumers have read this chunk's Lx (and WG0's L is WG0's)", "wait (4)"),
    ("      build_lx(sm, ch - 1);\n    }", "next chunk's Lx"),
]
TRACE_CTAS = (0, 1, 131)


def consumer_marks(src):
    """The consumer's marker list that matches this source: CONS (main), else CONS_GEARLY."""
    for marks in (CONS, CONS_GEARLY):
        if all(sum(src.count(m.removeprefix("BEFORE")) == 1 for m in ((a,) if isinstance(a, str) else a)) == 1
               for a, _ in marks):
            return marks
    return CONS  # (traced_source then names the marker that fails)


def traced_source(src):
    """BACKWARD_SM90_SRC with the stamps."""
    out = src
    cons = consumer_marks(src)
    for role, marks in (("c", cons), ("a", AUX)):
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
    # Stamps go to a global array (chunk, stamp) per traced role: register arrays of them spilled (WG0 runs at 56
    # registers), which slowed the roles they measured. Sums and the chunk nck / 2's stamps are printed at the end.
    decl = ("  const int tr_slot = (blockIdx.x == %s ? 0 : blockIdx.x == %s ? 1 : 2) * 3 + (int)(threadIdx.x >> 7);\n"
            "  const bool tr_on = (blockIdx.x == %s) && (threadIdx.x & 127) == 0;\n")
    cta = " || blockIdx.x == ".join(str(c) for c in TRACE_CTAS)
    macro = ("__device__ long long g_tr[9 * 512 * 16];\n"
             "#define TRACE_C(i) do { if (tr_on && ch < 512) g_tr[(tr_slot * 512 + ch) * 16 + (i)] = clock64(); } "
             "while (0)\n#define TRACE_A(i) TRACE_C(i)\n"
             "__device__ __forceinline__ void tr_print(int slot, int n, int nck) {\n"
             "  const long long* s = g_tr + slot * 512 * 16;\n"
             "  for (int i = 0; i < n; ++i) {\n"
             "    long long acc = 0;\n"
             "    for (int c = min(nck, 512) - 1; c >= 0; --c) {\n"
             "      const long long prev = i ? s[c * 16 + i - 1] : (c + 1 < min(nck, 512) ? s[(c + 1) * 16 + n - 1] : s[c * 16]);\n"
             "      acc += s[c * 16 + i] - prev;\n"
             "    }\n"
             "    printf(\"TRACE cta %d wg %d i %d %lld %lld\\n\", (int)blockIdx.x, (int)(threadIdx.x >> 7), i, acc,\n"
             "           s[(nck / 2) * 16 + i]);\n"
             "  }\n"
             "}\n")
    out = out.replace("namespace bwd90 {\n", "namespace bwd90 {\n" + macro, 1)
    out = out.replace('BACKWARD_SM90_SRC = ("', 'BACKWARD_SM90_SRC = ("#include <cstdio>\\n', 1)
    for head in ("__device__ void consumer(const Params& p, unsigned char* sm, int c, int64_t bh, int nck) {\n",
                 "__device__ void aux(const Params& p, unsigned char* sm, int64_t bh, int nck) {\n"):
        assert out.count(head) == 1, head
        out = out.replace(head, head + decl % (TRACE_CTAS[0], TRACE_CTAS[1], cta))
    # the prints: the consumer's before its early return (no S_0), aux's after its loop
    m = "  if (p.ds0 == nullptr) return;  // (no initial state)"
    assert out.count(m) == 1
    out = out.replace(m, f"  if (tr_on) tr_print(tr_slot, {len(cons)}, nck);\n" + m)
    m = "  dgate_dbeta(p, sm, b, h, 0);\n}\n"
    assert out.count(m) == 1, "aux end"
    out = out.replace(m, f"  if (tr_on) tr_print(tr_slot, {len(AUX)}, nck);\n" + m)
    return out


# Ablations (--ablate NAME,...): untraced copies with one piece of the chunk removed (their gradients are wrong),
# timed beside the others: the time a piece costs on the critical path, which stamps cannot show (a role blocked at
# a deferred barrier stamps early). Each is (old, new) replacements in BACKWARD_SM90_SRC.
ABLATIONS = {
    "no_m": [("    if (c == 0) dgate_m<0>(sm, X, L, tab, part, bad, oQ, oY, wl, g, q, lane);\n"  # dgate's M products,
              "    else dgate_m<1>(sm, X, L, tab, part, bad, oQ, oY, wl, g, q, lane);\n", "")],  # column sums
    "no_rt_loads": [("            const float2 v = __ldg(reinterpret_cast<const float2*>(S + (ir + 8 * hh) * 128 + 16 * kb + "
                     "2 * q + 8 * e));",  # R^T's checkpoint loads (G's values instead)
                     "            const float2 v = make_float2(G[8 * kb + 4 * e + 2 * hh], G[8 * kb + 4 * e + 2 * hh + 1]);")],
    "no_prefetch": [("    if (ch > 0) prefetch_chunk(p, bh, b, h, ch - 1, lt + 128 * c);", "")],
    "no_wg0_dgate": [("      dgate_dbeta(p, sm, b, h, ch + 1);\n", "")],
}


def bwd_source():
    """solution.py's text and the span of its BACKWARD_SM90_SRC."""
    import solution
    text = open(solution.__file__).read()
    start = text.index("BACKWARD_SM90_SRC = (")
    return text, start, text.index('\n""")\n', start)


def write_copy(path, ablation=None):
    """solution.py with the stamps (ablation None) or with an ablation applied."""
    text, start, end = bwd_source()
    src = text[start:end]
    if ablation is None:
        src = traced_source(src)
    else:
        for old, new in ABLATIONS[ablation]:
            if src.count(old) != 1:
                raise SystemExit(f"ablation {ablation}: no single match for {old[:60]!r}")
            src = src.replace(old, new)
    open(path, "w").write(text[:start] + src + text[end:])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="S4-bf16,S2-bf16")
    ap.add_argument("--extra", action="append", default=[])
    ap.add_argument("--trials", type=int, default=10)
    ap.add_argument("--ablate", default="", help=f"comma list of {sorted(ABLATIONS)}")
    args = ap.parse_args()
    os.makedirs("scratch", exist_ok=True)
    write_copy("scratch/trace_solution.py")
    text, start, end = bwd_source()
    cons = consumer_marks(text[start:end])
    for a in filter(None, args.ablate.split(",")):
        write_copy(f"scratch/ablate_{a}.py", a)
        args.extra.append(f"{a}=scratch/ablate_{a}.py")
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
        rows, absr = {}, {}
        for line in out.splitlines():
            mm = re.match(r"TRACE cta (\d+) wg (\d+) i (\d+) (-?\d+) (-?\d+)", line)
            if not mm:
                continue
            cta, wg, i = int(mm.group(1)), int(mm.group(2)), int(mm.group(3))
            names = [n for _, n in (AUX if wg == 0 else cons)]
            rows.setdefault(f"cta {cta} wg {wg}", {})[names[i]] = int(mm.group(4)) / nck
            absr.setdefault((cta, wg), {})[i] = int(mm.group(5))
        for key in sorted(rows):
            vals = rows[key]
            print(f"{name} {key}: cycles a chunk (total {sum(vals.values()):.0f})")
            for n, x in vals.items():
                print(f"    {x:8.0f}  {n}")
        absr = {k: [v[i] for i in sorted(v)] for k, v in absr.items()}
        for cta in TRACE_CTAS:
            if (cta, 0) not in absr:
                continue
            t0 = min(min(v) for (c, w), v in absr.items() if c == cta)
            print(f"{name} cta {cta}: chunk nck/2 on one axis (cycles from its first stamp)")
            for w in (0, 1, 2):
                names = [n for _, n in (AUX if w == 0 else cons)]
                print(f"  wg {w}: " + ", ".join(f"{n} {x - t0}" for n, x in zip(names, absr[(cta, w)])))
            rows[f"cta {cta} abs"] = {str(w): absr[(cta, w)] for w in (0, 1, 2)}
        if not rows:  # (a fault in the traced copy: its error is on stderr)
            print(f"no stamps (rc {child.returncode}):", out[-1500:], child.stderr[-3000:])
        res[f"{name} trace"] = rows
    save("bwd90_trace.json", res)


if __name__ == "__main__":
    main()
