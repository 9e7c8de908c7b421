"""Where chunk_bwd_sm90's chunk time goes: a copy of solution.py with clock stamps between the phases of each chunk
(thread 0 of each warpgroup, WG0 and the two consumers, of a few CTAs: TRACE_CTAS), each stamp written to a global
array (chunk, stamp) (register arrays of them spilled), summed over the chunks by a small kernel launched after each
chunk_bwd_sm90 launch and printed there (dev/fwd90_trace.py's device_source and print kernel: a printf in
chunk_bwd_sm90's own kernel, an extern call, makes ptxas serialize every wgmma of it, 122 waits instead of HEAD's 12),
then the cycles a phase a chunk per role. The copy is made here by inserting stamps at marker lines of
BACKWARD_SM90_SRC (a marker that no longer matches is an error: update the list). Also the kernel's time (KernelBench
median) for the copy without stamps, to convert cycles to us.

    python3 dev/bwd90_trace.py [--shapes S4-bf16,S2-bf16] [--extra LABEL=PATH ...] [--ablate no_m,no_tables,...]
    python3 dev/bwd90_trace.py --build-only [--copy PATH]   (no GPU: the copy, its build and HEAD's, their resources)
    python3 dev/bwd90_trace.py --copy-only [--copy PATH]    (the copy alone: every marker checked)
(--extra: other solution.py copies timed beside it, e.g. variants written to scratch/; --ablate: copies with a piece
removed (ABLATIONS), timed beside it; writes $OUT/bwd90_trace.json; --build-only prints REG, STACK, LOCAL, the STL /
LDL and WARPGROUP.DEPBAR instructions of chunk_bwd_sm90's kernels)

The stamps are fwd90_trace's: the 32-bit %clock (differences modulo 2^32), a stamp not written (a phase that does not
run in a chunk) takes the one before it; a stamp after a barrier or an issue may come before the wait completes.
"""
import argparse
import os
import subprocess
import sys

sys.path.insert(0, os.getcwd())
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fwd90_trace as fwd  # noqa: E402  (the stamps' device code, the print kernel, the build and resources)

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
TR_PRINT_MAX = 2 * 3 * len(TRACE_CTAS)  # slots printed a process: two launches' (the child makes one)
DEFAULT_COPY = "scratch/trace_solution.py"
# the backward's stamps: the chunks run ch = nck - 1 .. 0, a row a chunk in that order (it = nck - 1 - ch); thread 0
# of a traced warpgroup stamps (slot: traced CTA, warp 0 / 4 / 8), its place found at each stamp from the special
# registers (volatile reads: no register held through the chunk; with tr_at held the consumers spilled more)
TRACE_SRC = r"""
__device__ __forceinline__ int tr_where() {  // the slot's first stamp in g_tr, or -1
  unsigned b, t;
  asm volatile("mov.u32 %0, %%ctaid.x;\n" : "=r"(b));
  asm volatile("mov.u32 %0, %%tid.x;\n" : "=r"(t));
  const int cta = tr_cta_index(b);
  return cta >= 0 && (t & 127) == 0 ? (cta * 12 + (int)(t >> 5)) * (TR_MAXC * TR_NS) : -1;
}
#define TRACE_C(i) do { const int tr_it = nck - 1 - ch, tr_at = tr_where(); \
  if (tr_at >= 0 && tr_it < TR_MAXC) g_tr[tr_at + tr_it * TR_NS + (i)] = tr_clock(); } while (0)
#define TRACE_A(i) TRACE_C(i)
#define TRACE_END(n) do { const int tr_at = tr_where(); if (tr_at >= 0) { \
  int* h = g_tr_hdr + tr_at / (TR_MAXC * TR_NS) * 8; h[1] = (int)blockIdx.x; \
  h[2] = 0; h[3] = 0; h[4] = nck; h[5] = (n); h[0] = 1; } } while (0)
"""
DECL_SRC = """  if ((threadIdx.x & 96) == 0 && tr_cta_index(blockIdx.x) >= 0) {  // bwd90_trace: the traced warp's rows zeroed first
    const int tr_row = (tr_cta_index(blockIdx.x) * 12 + (int)(threadIdx.x >> 5)) * (TR_MAXC * TR_NS);
    for (int e = threadIdx.x & 31; e < min(nck, TR_MAXC) * TR_NS; e += 32) g_tr[tr_row + e] = 0;
    __syncwarp();
  }
"""
LAUNCH_OLD = ("  return err != cudaSuccess ? err : launch_threads(bwd90::chunk_bwd_sm90_kernel<CK16>, dim3((unsigned)pl.blocks), 384,\n"
              "                                                   pl.smem, s, false, p);\n}")
LAUNCH_NEW = """  if (err == cudaSuccess)
    err = launch_threads(bwd90::chunk_bwd_sm90_kernel<CK16>, dim3((unsigned)pl.blocks), 384, pl.smem, s, false, p);
  if (err == cudaSuccess) {  // bwd90_trace: the stamps' sums
    bwd90::tr_print_kernel<<<1, 64, 0, s>>>();
    err = cudaGetLastError();
  }
  return err;
}"""


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
    # Stamps go to a global array (chunk, stamp) per traced role (register arrays of them spilled: WG0 runs at 56
    # registers); their sums are printed by fwd90_trace's print kernel, launched after the backward's kernel.
    dev = fwd.device_source(TRACE_CTAS, TR_PRINT_MAX) + TRACE_SRC
    assert out.count("namespace bwd90 {\n") == 1
    out = out.replace("namespace bwd90 {\n", "namespace bwd90 {\n" + dev, 1)
    out = out.replace('BACKWARD_SM90_SRC = ("', 'BACKWARD_SM90_SRC = ("#include <cstdio>\\n', 1)
    for head in ("__device__ void consumer(const Params& p, unsigned char* sm, int c, int64_t bh, int nck) {\n",
                 "__device__ void aux(const Params& p, unsigned char* sm, int64_t bh, int nck) {\n"):
        assert out.count(head) == 1, head
        out = out.replace(head, head + DECL_SRC)
    # the ends: the consumer's before its early return (no S_0), aux's after its loop
    m = "  if (p.ds0 == nullptr) return;  // (no initial state)"
    assert out.count(m) == 1
    out = out.replace(m, f"  TRACE_END({len(cons)});\n" + m)
    m = "  dgate_dbeta(p, sm, b, h, 0);\n}\n"
    assert out.count(m) == 1, "aux end"
    out = out.replace(m, m[:-2] + f"  TRACE_END({len(AUX)});\n}}\n")
    if out.count(LAUNCH_OLD) != 1:
        raise SystemExit("bwd90_trace: marker launch: no single match (update LAUNCH_OLD)")
    out = out.replace(LAUNCH_OLD, LAUNCH_NEW)
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
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    open(path, "w").write(text[:start] + src + text[end:])


def instantiation(name):
    """chunk_bwd_sm90's kernel (bwd, or the checkpoint pass ckpt) and CK16 (ck16: bf16 checkpoints), from its name."""
    return ("ckpt" if "ckpt" in name else "bwd") + (" ck16" if "ILb1E" in name else " f32ck")


def resources(so):
    """fwd90_trace.res_usage of chunk_bwd_sm90's kernels in a backward_sm90 library."""
    return fwd.res_usage(so, "chunk_bwd_sm90_", instantiation)


def build_only(copy):
    write_copy(copy)
    print(f"copy {copy}: every marker found")
    sos = fwd.build_copies(["solution.py", copy], "backward_sm90")
    for label, path in (("head", "solution.py"), ("trace", copy)):
        for inst, (reg, stack, local, sp, dep) in sorted(resources(sos[path]).items()):
            print(f"{label:6s} {inst:14s} REG {reg} STACK {stack} LOCAL {local} STL+LDL {sp} wgmma waits {dep}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="S4-bf16,S2-bf16")
    ap.add_argument("--extra", action="append", default=[])
    ap.add_argument("--trials", type=int, default=10)
    ap.add_argument("--ablate", default="", help=f"comma list of {sorted(ABLATIONS)}")
    ap.add_argument("--copy", default=DEFAULT_COPY, help="where the stamped copy is written")
    ap.add_argument("--build-only", action="store_true", help="write the copy, build it and HEAD, ptxas resources")
    ap.add_argument("--copy-only", action="store_true", help="write the copy only (every marker checked)")
    args = ap.parse_args()
    if args.copy_only:
        write_copy(args.copy)
        return print(f"copy {args.copy}: every marker found")
    if args.build_only:
        return build_only(args.copy)
    os.makedirs("scratch", exist_ok=True)
    write_copy(args.copy)
    text, start, end = bwd_source()
    cons = consumer_marks(text[start:end])
    for a in filter(None, args.ablate.split(",")):
        write_copy(f"scratch/ablate_{a}.py", a)
        args.extra.append(f"{a}=scratch/ablate_{a}.py")
    from tools.common import load_copies, save
    sos = fwd.build_copies(["solution.py", args.copy] + [e.split("=", 1)[1] for e in args.extra], "backward_sm90")
    res = {"ptxas": {}}
    for p in ("solution.py", args.copy):
        try:
            res["ptxas"][p] = resources(sos[p])
            print(f"{p}: (REG, STACK, LOCAL, STL+LDL, wgmma waits) {res['ptxas'][p]}", flush=True)
        except (SystemExit, OSError, KeyError, AttributeError) as e:  # (no cuobjdump: not the run's point)
            print(f"{p}: no resource usage ({e})", flush=True)
    import torch
    import solution
    import reference
    from bench import SHAPES
    from timing import kernelbench_time
    mods = load_copies(args.extra, solution)
    for name in args.shapes.split(","):
        B, T, H, D, dtype = SHAPES[name][:5]
        gen = torch.Generator().manual_seed(1)
        q, k, v, g, b = [x.cuda() for x in reference.make_inputs(B, T, H, D, D, dtype=dtype, generator=gen)]
        dy = torch.randn(B, T, H, D, generator=gen).to(dtype).cuda()
        for label, m in mods.items():
            fn = lambda m=m: m._backward_with(dy, None, q, k, v, g, b, kernel="chunk_bwd_sm90")  # noqa: E731
            st = kernelbench_time(fn, (), trials=args.trials)
            res[f"{name} {label}"] = st
            print(f"{name} {label}: {st}", flush=True)
        # the traced copy: one call in a child, the print kernel's lines through its stdout (device printf is the
        # process's C stdout: flushed before the end marker fwd90_trace.parse reads)
        code = ("import sys, ctypes, torch; sys.path.insert(0, '.'); import importlib.util as u; "
                f"s = u.spec_from_file_location('tr', {args.copy!r}); m = u.module_from_spec(s); "
                "s.loader.exec_module(m); import reference; from bench import SHAPES; "
                f"B, T, H, D, dt = SHAPES['{name}'][:5]; gen = torch.Generator().manual_seed(1); "
                "x = [t.cuda() for t in reference.make_inputs(B, T, H, D, D, dtype=dt, generator=gen)]; "
                "dy = torch.randn(B, T, H, D, generator=gen).to(dt).cuda(); "
                "m._backward_with(dy, None, *x, kernel='chunk_bwd_sm90'); torch.cuda.synchronize(); "
                "ctypes.CDLL(None).fflush(None); print('TRACE_END bwd ckpt_written=False', flush=True)")
        child = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
        out = child.stdout
        nck = (T + 63) // 64
        ncs = min(nck, fwd.TR_MAXC)  # (chunks stamped)
        traces, _ = fwd.parse(out, lambda w: AUX if w < 4 else cons)
        got = {(cta, w // 4): r for (cta, mo, sg, w), r in traces.get("bwd", {}).items() if all(x is not None for x in r)}
        rows = {}
        for (cta, wg), r in sorted(got.items()):
            names = [n for _, n in (AUX if wg == 0 else cons)]
            rows[f"cta {cta} wg {wg}"] = {n: x[0] / ncs for n, x in zip(names, r)}
        for key in sorted(rows):
            vals = rows[key]
            print(f"{name} {key}: cycles a chunk (total {sum(vals.values()):.0f})")
            for n, x in vals.items():
                print(f"    {x:8.0f}  {n}")
        for cta in TRACE_CTAS:
            if any((cta, w) not in got for w in (0, 1, 2)):
                continue
            ref = got[(cta, 0)][0][2]

            def rel(x):  # (32-bit clocks: differences modulo 2^32)
                return (x - ref + 2 ** 31) % 2 ** 32 - 2 ** 31
            absr = {w: [rel(x[2]) for x in got[(cta, w)]] for w in (0, 1, 2)}
            t0 = min(min(v) for v in absr.values())
            print(f"{name} cta {cta}: chunk ch = nck - 1 - nck/2 on one axis (cycles from its first stamp)")
            for w in (0, 1, 2):
                names = [n for _, n in (AUX if w == 0 else cons)]
                print(f"  wg {w}: " + ", ".join(f"{n} {x - t0}" for n, x in zip(names, absr[w])))
            rows[f"cta {cta} abs"] = {str(w): [x - t0 for x in absr[w]] for w in (0, 1, 2)}
        if not got or child.returncode != 0:  # (a fault in the traced copy: its error is on stderr)
            print(f"no stamps (rc {child.returncode}):", out[-1500:], child.stderr[-3000:])
        res[f"{name} trace"] = rows
    save("bwd90_trace.json", res)

if __name__ == "__main__":
    main()
