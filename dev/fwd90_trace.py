"""Where chunk_sm90's chunk time goes (the forward; dev/bwd90_trace.py is the backward's): a copy of solution.py with
clock stamps between the phases of each chunk of the bfloat16 block (chunk_sm90_bf16; its dense D_k = 128
instantiation only, the others compile without stamps; --dtype float32: the TF32 block instead, CHUNK_SM90_TF32_SRC's
tf32_aux and tf32_consumer, the lists CONS_F32 and AUX_F32: ptxas then spills 24 bytes where HEAD spills 4), on lane 0 of every warp of a few CTAs (TRACE_CTAS), each stamp
written to a global array (chunk, stamp) (register arrays spilled in bwd90_trace's first version), summed over the chunks
by a small kernel launched after each chunk_sm90 launch and printed there (device printf: a printf in chunk_sm90's own
kernel, an extern call, makes ptxas serialize every wgmma of it, 48 waits instead of HEAD's 10), then the cycles a phase
a chunk per role: the aux warpgroup's warp 0 (thread 0 issues the TMA loads) and its warps 1-3, and each consumer
warpgroup (the mean of its four warps; every warp in the JSON), the mean over the traced CTAs; each CTA's loop total
by warp; chunk nch / 2's stamps on one time axis. The copy is made here by inserting stamps at marker lines of
CHUNK_SM90_SRC (a marker that no longer matches is an error: update the list). Also the call's KernelBench median for
the copy without stamps (this solution.py, "head": cycles to us) and for the stamped copy (what the stamps cost).
Two forwards a shape: "plain" (no grad) and "ckpt" (q, k, v, gate, beta requiring grad: the autograd forward, which
writes chunk_bwd_sm90's checkpoints where forward_checkpoints allows: the put_ckpt phase).

    python3 dev/fwd90_trace.py [--dtype bfloat16|float32] [--shapes S4-bf16,S2-bf16] [--extra LABEL=PATH ...]
        [--trials 10] [--no-time-trace]
    python3 dev/fwd90_trace.py --build-only [--copy PATH]   (no GPU: the copy, its build and HEAD's, their resources)
    python3 dev/fwd90_trace.py --copy-only [--copy PATH]    (the copy alone: every marker checked)
(--extra: other solution.py copies timed beside it, e.g. variants written to scratch/; writes $OUT/fwd90_trace.json;
--build-only prints REG, STACK, LOCAL, the STL / LDL and WARPGROUP.DEPBAR instructions per chunk_sm90 instantiation)

How to read the stamps: each is the 32-bit %clock (a register fewer than clock64; differences modulo 2^32) of lane 0.
Non-aligned bar.sync compiles to BAR.SYNC.DEFER_BLOCKING (the warp runs on and blocks at its next dependent
instruction), so the stamps marked "sync" first read a shared word (a volatile ld.shared, which waits for the
barrier); the stamp after the consumers' FULL wait follows the mbarrier try-wait (a shared access) instead. Stamps
after an issue (wgmma, ldmatrix, TMA, global loads) time the issue only: the wait shows in the phase that first uses
the result. Phases that do not run in a chunk (the DONE waits for c < 2, O1 .. y in the state phase, U on the last chunk
without a final state) count 0: the kernel zeroes its rows first and a stamp not written takes the one before it.
The compiler may move plain arithmetic across a stamp (the clock read is ordered only against other volatile asm): a
phase's edges are approximate. Stamps between U's issue and its wait, and between its wait and the S update, spilled
(S, U0, U1 and U's A fragments fill the consumers' 216 registers there): U is one phase with the update.
"""
import argparse
import json
import os
import re
import subprocess
import sys

sys.path.insert(0, os.getcwd())

# (marker in CHUNK_SM90_SRC, phase name[, "sync"]). The stamp ends the phase: it goes after the marker's text, or
# before it with the prefix BEFORE. "sync": the stamp follows a bar.sync (see above).
CONS = [  # consumer warpgroups (in the order they run)
    ("  for (int c = 0; c < nch; ++c) {\n    const int t0 = sb + 64 * c;", "top"),
    ("    if ((tid & 127) == 0) bulk_wait_read<1>();  // y's buffer c % 2 read by its store (chunk c - 2)",
     "y buffer read (bulk_wait_read: the warpgroup's warp 0)"),
    ("    mbar_wait(bars + c % L::kStages, (c / L::kStages) & 1);  // (passes at once: the aux thread saw it)",
     "FULL + stage mbarrier"),
    ("        wgmma_rs64(Y, al, desc_at(dq, sw_kstep(kb)), 1);\n        wg_commit();\n      }",
     "O1 issued (k-steps 4-7 wait for 0-3: four groups in flight)"),
    ("      if (kCkpt && p.fwd_ckpt != nullptr) put_ckpt(c);  // while O1's last products run (S is no operand of them)",
     "put_ckpt"),
    ("BEFORE#pragma unroll\n      for (int i = 0; i < 32; ++i) Y[i] *= tb[kG + 8 * (i >> 2) + 2 * qd + (i & 1)];",
     "O1 done (wait)"),
    ("        ldm4_at<true>(vf[kb], va + sw_off<2>(s, dv));\n      }\n    }", "Y *= G + V^T fragments (issue)"),
    ("        wgmma_rs64(Y, vz[kb], desc_at(dpl, 2048 * kb), 1);\n      }\n      wg_commit();\n    }",
     "NaN check + Z = P' V issued"),
    ("                       uh[kb][r], ul[kb][r]);\n        }\n    }", "U's A split (V^T w hi + lo)"),
    ("      wg_wait<0>();  // P' V\n      acc_fence(Y);", "Z done (wait)"),
    ("BEFORE      fence_async_smem();\n      wg_barrier(wg);", "y staged (stmatrix; NaN path)"),
    ("      fence_async_smem();\n      wg_barrier(wg);", "warpgroup barrier", "sync"),
    ("        tma_store(&maps.y, ys, tb0 + t0, cw, cb.h, bc);\n      }\n    }", "y TMA store issued (warp 0)"),  # (the ragged varlen path: not here)
    # (stamps after U's issue or its wait spilled: see above)
    ("        for (int i = 0; i < 32; ++i) S[32 + i] = fmaf(gamma, S[32 + i], U1[i]);\n      }\n    }",
     "U = (V^T w) K issued, done + S update"),
    ("    bar_arrive(kBarDone + 2 * cw + (c & 1));  // every read of chunk c's stage and derived slot done",
     "DONE arrive"),
]
AUX = [  # the aux warpgroup (in the order they run)
    ("BEFORE      if (c >= 2) {  // both consumers done with chunk c - 2: its derived slot and raw stage are free",
     "top"),
    ("BEFORE        stage(c + 1);\n      }\n      mbar_wait(", "DONE waits (c >= 2)", "sync"),
    ("        stage(c + 1);\n      }", "stage(c + 1) (thread 0)"),
    ("      mbar_wait(bars + c % L::kStages, (c / L::kStages) & 1);  // chunk c staged", "stage mbarrier (chunk c)"),
    ("        for (int kb = 1; kb < NKB; ++kb) wgmma_ss64(P, desc_at(dq, sw_kstep(kb)), desc_at(dk, sw_kstep(kb)), 1);\n"
     "        wg_commit();\n      }", "P = Q K^T issued"),
    ("s + 1 < tc ? cb.beta.widen(nb1) : 0.f, wl, lane);\n      }", "tables written"),
    ("      if (c + 1 < nch) load_gates(c + 1);", "load_gates(c + 1) (issue)"),
    ("      wg_barrier(0);  // the tables written", "warpgroup barrier (tables)", "sync"),
    ("        wg_wait<0>();\n        acc_fence(P);", "P done (wait)"),
    ("          default: store_pprime<L, 3>(P, der, tb, g, qd); break;\n        }\n        fence_async_smem();\n      }",
     "P' stored"),
    ("BEFORE      bar_arrive(kBarFull + (c & 1));", "threadfence + warpgroup barrier", "sync"),
    ("      bar_arrive(kBarFull + 2 + (c & 1));", "FULL arrivals"),
]
# The float32 block (CHUNK_SM90_TF32_SRC: tf32_aux and tf32_consumer, --dtype float32), the same kinds of marker.
# The stamps inside U's products (U, S and vf live) are left out as in the bfloat16 list: U is one phase with the
# S update.
CONS_F32 = [
    ("BEFORE    const float* tb = reinterpret_cast<const float*>(sm + TL::kTB + (c & 1) * TL::kTabSlot);", "top"),
    ("      for (int kb = 0; kb < 8; ++kb) load_vf(kb);", "state phase: v landed, V^T fragments"),
    ("    bar_wait<384>(kBarFullQK);", "FULL_QK wait", "sync"),
    ("sw_desc(sm + TL::kQL + sw_kstep(kb), 16), kb == 0);\n      }\n    }",
     "O1 issued (k-steps 4-15 wait for 0-11: four groups in flight)"),
    ("      if (lane == 0) __stcs(d + 16384 + 4 * cw + wl, m);\n    }", "fwd_ckpt (S and max |S|, autograd only)"),
    ("Y[i] *= tb[kG + 8 * (i >> 2) + 2 * qd + (i & 1)];  // Y = O1 diag(G)\n    }", "O1 done (wait) + Y *= G"),
    ("    bar_arrive<384>(kBarQDone);", "Q_DONE arrive"),
    ("BEFORE#pragma unroll\n      for (int half = 0; half < 2; ++half) {", "v landed (mbarrier)"),
    ("sts_f(ys + y_off(i), Y[i]);\n      }\n    }", "V^T fragments + Y staged"),
    ("      bad = __any_sync(0xffffffffu, e != 0);\n    }", "NaN check"),
    ("      for (int i = 0; i < 64; ++i) S[i] = fmaf(gamma, S[i], U[i]);\n    } else {\n"
     "      bar_arrive<384>(kBarKTDone);\n    }", "U = (V^T w) K issued, done, KT_DONE + S update"),
    ("    bar_wait<384>(kBarFullP);", "FULL_P wait", "sync"),
    ("      wg_wait<0>();\n      acc_fence(Z);", "Z = V^T P'^T issued, done"),
    ("          Z[i] = acc;\n        }\n      }", "NaN path"),
    ("BEFORE      fence_async_smem();\n      wg_barrier(1 + cw);", "y = Y + Z in place"),
    ("      wg_barrier(1 + cw);", "warpgroup barrier", "sync"),
    ("        bulk_wait_read<0>();\n      }", "y TMA store + its read (thread 0)"),
    ("BEFORE    }\n  }\n  if (tid == 0) bulk_wait_all();", "VR_DONE arrive"),
]
# The float32 aux's tables wait for its gate loads at their first use: a use of all four first, so that the stamp after
# it splits the loads' latency from the scans (traced_source_f32 inserts it).
GATES_USED = "    asm volatile(\"\" ::\"f\"(tr_gu));  // (fwd90_trace: the gates used)"
GATES_USE_SRC = ("    float tr_gu;\n    asm volatile(\"add.f32 %0, %1, %2;\\n add.f32 %0, %0, %3;\\n add.f32 %0, %0, %4;\\n\""
                 " : \"=f\"(tr_gu) : \"f\"(g0), \"f\"(g1), \"f\"(b0), \"f\"(b1));\n" + GATES_USED)
AUX_F32 = [
    ("BEFORE    // 1. the gate tables of chunk c", "top"),
    (GATES_USED, "the gates' loads landed (a use of all four)"),
    ("    if (outputs || wl == 0) write_tables64<true>(tb, g0, g1, b0, b1, wl, lane);", "gate tables (float; GAMMA exact)"),
    ("    if (!outputs && c + 1 < sg.nch) load_gates(c + 1);", "state phase: the next gates' loads"),
    ("    else mbar_wait(bars + (c & 1), (c >> 1) & 1);", "q, k landed (mbarrier)"),
    ("    if (!outputs && c > 0) bar_wait<384>(kBarQDone);", "state phase: Q_DONE wait", "sync"),
    ("    if (c > 0) bar_wait<384>(kBarKTDone);", "KT_DONE wait (c > 0)", "sync"),
    ("BEFORE    wg_barrier(0);  // every raw k read", "K^T hi / lo stored"),
    ("    wg_barrier(0);  // every raw k read (and every table written) before QS lo is overwritten",
     "warpgroup barrier", "sync"),
    ("    if (!outputs && tid == 0 && c + 2 < sg.nch) load_k2(c + 2);  // (its buffer's raw k is read)",
     "state phase: k of c + 2 issued"),
    ("BEFORE    fence_async_smem();  // the generic stores before the wgmmas (async proxy) read QS and K^T",
     "q split in place"),
    ("    wg_barrier(0);       // (racecheck credits a store only when a barrier its thread waits on follows it)",
     "fence + warpgroup barrier", "sync"),
    ("    bar_arrive<384>(kBarFullQK);", "FULL_QK arrive"),
    ("    if (c > 0 || !outputs) bar_wait<384>(kBarVRDone);", "VR_DONE wait", "sync"),
    ("        load_v2(c + 2);\n      }\n    }", "v TMA issued (thread 0; state phase: c + 2's)"),
    ("      wg_wait<0>();\n      acc_fence(P);", "P^T = K Q^T issued, done"),
    ("        load_qk(c + 1);\n      }", "c + 1's gates' loads, Q_DONE wait, its q / k issued", "sync"),
    ("      __threadfence_block();  // (racecheck, as chunk_sm90's bfloat16 P' stores)\n    }", "P' stored"),
    ("BEFORE    bar_arrive<384>(kBarFullP);", "warpgroup barrier", "sync"),
    ("    bar_arrive<384>(kBarFullP);", "FULL_P arrive"),
]
TRACE_CTAS = (0, 1, 127, 131, 300)  # (S2-bf16 has 128 CTAs, S4-bf16 512 on 132 SMs: 300 is in the third wave)
TR_MAXC = 256  # chunks a launch with stamps (T up to 16384)
TR_NS = 32  # stamps a chunk, at most
TR_PRINT_MAX = 4 * 12 * len(TRACE_CTAS)  # slots printed a process: four launches' (the child's two calls)
ROLES = (("aux w0", (0,)), ("aux w1-3", (1, 2, 3)), ("cons 1", (4, 5, 6, 7)), ("cons 2", (8, 9, 10, 11)))
DEFAULT_COPY = "scratch/fwd90_trace_solution.py"

DEVICE_SRC = r"""
// ---- fwd90_trace: clock stamps (dev/fwd90_trace.py; 32-bit: a register fewer, differences modulo 2^32) ----
#define TR_MAXC %(maxc)d
#define TR_NS %(ns)d
#define TR_SLOTS (%(nctas)d * 12)
__device__ unsigned g_tr[TR_SLOTS * TR_MAXC * TR_NS];  // (traced CTA, warp, chunk, stamp)
__device__ int g_tr_hdr[TR_SLOTS * 8];  // a slot's launch: written, blockIdx, mode, seg, nch, stamps
__device__ int g_tr_prints;  // slots printed so far (this process): at most %(print_max)d
__device__ __forceinline__ int tr_cta_index(unsigned b) { %(cta_index)s return -1; }
__device__ __forceinline__ unsigned tr_clock() {
  unsigned t;
  asm volatile("mov.u32 %%0, %%%%clock;\n" : "=r"(t));
  return t;
}
// A stamp not written (0: the rows are zeroed first) takes the one before it.
__device__ __forceinline__ unsigned tr_eff(const unsigned* s, int c, int i) {
  for (; i > 0 && s[c * TR_NS + i] == 0; --i) {}
  return s[c * TR_NS + i];
}
// The sums, printed by a kernel of their own launched after the traced kernel's (a printf, an extern call, in the
// traced kernel makes ptxas serialize every wgmma there; dev/bwd90_trace.py's too, its rows in the order the chunks
// ran). Per slot (a traced warp) and stamp i: the sum over the chunks of
// (stamp i - the stamp before: i - 1, or the chunk before's last), the chunks where it ran, its time in chunk nch / 2.
__global__ void tr_print_kernel() {
  const int slot = threadIdx.x;
  if (slot >= TR_SLOTS) return;
  int* h = g_tr_hdr + slot * 8;
  if (h[0] == 0) return;
  h[0] = 0;
  if (atomicAdd(&g_tr_prints, 1) >= %(print_max)d) return;
  const unsigned* s = g_tr + (size_t)slot * (TR_MAXC * TR_NS);
  const int n = h[5], nc = min(h[4], TR_MAXC);
  for (int i = 0; i < n; ++i) {
    long long acc = 0;
    int runs = 0;
    for (int c = 0; c < nc; ++c) {
      const unsigned prev = i ? tr_eff(s, c, i - 1) : (c ? tr_eff(s, c - 1, n - 1) : s[0]);
      acc += (unsigned)(tr_eff(s, c, i) - prev);
      runs += s[c * TR_NS + i] != 0;
    }
    printf("TRACE cta %%d mode %%d seg %%d warp %%d i %%d %%lld %%d %%u\n", h[1], h[2], h[3], slot %% 12, i, acc, runs,
           tr_eff(s, nc / 2, i));
  }
}
"""
# the forward's stamps (c: the chunk, in the order they run; tr_at: DECL_SRC)
TRACE_SRC = r"""// (the index through an opaque move: the address is formed at the stamp, not held in registers through the chunk)
#define TRACE(i) do { if (tr_at >= 0 && c < TR_MAXC) { int tr_k = tr_at; \
  asm volatile("" : "+r"(tr_k)); g_tr[tr_k + c * TR_NS + (i)] = tr_clock(); } } while (0)
// after a bar.sync: a shared load first (it waits for the deferred barrier), then the clock
#define TRACE_SYNC(i) do { if (tr_at >= 0 && c < TR_MAXC) { unsigned tr_d; \
  asm volatile("ld.volatile.shared.u32 %%0, [%%1];\n" : "=r"(tr_d) : "r"((unsigned)__cvta_generic_to_shared(sm))); \
  int tr_k = tr_at; asm volatile("" : "+r"(tr_k)); g_tr[tr_k + c * TR_NS + (i)] = tr_clock(); } } while (0)
#define TRACE_END(n) do { if (tr_at >= 0) { int* h = g_tr_hdr + tr_at / (TR_MAXC * TR_NS) * 8; h[1] = (int)blockIdx.x; \
  h[2] = p.mode; h[3] = cb.seg; h[4] = nch; h[5] = (n); h[0] = 1; } } while (0)
"""
DECL_SRC = """  // fwd90_trace: lane 0 of each warp of the traced CTAs (the dense D_k = 128 block only); its rows zeroed first
  constexpr bool kTr = DK == 128 && !VARLEN;
  const int tr_cta = kTr ? tr_cta_index(blockIdx.x) : -1;
  // the warp's first stamp in g_tr (lane 0 of a traced warp), else -1: one register a thread
  const int tr_at = tr_cta >= 0 && lane == 0 ? (tr_cta * 12 + warp) * (TR_MAXC * TR_NS) : -1;
  if (tr_cta >= 0) {
    for (int e = lane; e < min(nch, TR_MAXC) * TR_NS; e += 32) g_tr[(tr_cta * 12 + warp) * (TR_MAXC * TR_NS) + e] = 0;
    __syncwarp();
  }
"""
# the float32 roles' declarations (WARP: the role's warp in the block) and their end (a Tf32Seg sg in scope)
DECL_F32_SRC = """  // fwd90_trace: lane 0 of each warp of the traced CTAs; its rows zeroed first
  const int tr_cta = tr_cta_index(blockIdx.x);
  const int tr_at = tr_cta >= 0 && lane == 0 ? (tr_cta * 12 + (%(warp)s)) * (TR_MAXC * TR_NS) : -1;
  if (tr_cta >= 0) {
    for (int e = lane; e < min(sg.nch, TR_MAXC) * TR_NS; e += 32) g_tr[(tr_cta * 12 + (%(warp)s)) * (TR_MAXC * TR_NS) + e] = 0;
    __syncwarp();
  }"""
TRACE_END_F32_SRC = r"""#define TRACE_END_F32(n) do { if (tr_at >= 0) { int* h = g_tr_hdr + tr_at / (TR_MAXC * TR_NS) * 8; \
  h[1] = (int)blockIdx.x; h[2] = p.mode; h[3] = sg.seg; h[4] = sg.nch; h[5] = (n); h[0] = 1; } } while (0)
"""
LAUNCH_OLD = "  return launch_threads(kernel, dim3((unsigned)blocks), kSm90Threads, pl.smem, s, pdl, p, maps);\n}"
LAUNCH_NEW = """  err = launch_threads(kernel, dim3((unsigned)blocks), kSm90Threads, pl.smem, s, pdl, p, maps);
  if (err == cudaSuccess && !f32 && pl.DK == 128 && !vl) {  // fwd90_trace: the stamps' sums
    tr_print_kernel<<<1, 64, 0, s>>>();
    err = cudaGetLastError();
  }
  return err;
}"""


def device_source(ctas, print_max):
    """DEVICE_SRC for these traced CTAs (12 slots each: a warp's lane 0) and prints a process (dev/bwd90_trace.py's
    too): g_tr, g_tr_hdr, tr_cta_index, tr_clock, tr_eff, tr_print_kernel."""
    cta_index = " ".join(f"if (b == {c}) return {j};" for j, c in enumerate(ctas))
    return DEVICE_SRC % dict(maxc=TR_MAXC, ns=TR_NS, nctas=len(ctas), cta_index=cta_index, print_max=print_max)


def sm90_span(text):
    """(start, end) of CHUNK_SM90_SRC's string in solution.py's text."""
    start = text.index('CHUNK_SM90_SRC = r"""')
    return start, text.index('\n"""', start + 25)


def insert(out, m, stamp, what):
    """out with stamp after the marker m's single match (before it with the prefix BEFORE)."""
    before = m.startswith("BEFORE")
    m = m.removeprefix("BEFORE")
    if out.count(m) != 1:
        raise SystemExit(f"fwd90_trace: marker {what}: {out.count(m)} matches for {m[:70]!r} (update the list)")
    return out.replace(m, stamp + "\n" + m if before else m + stamp + "\n" if m.endswith("\n") else m + "\n" + stamp)


def traced_source(src):
    """CHUNK_SM90_SRC with the stamps."""
    out = stamp_roles(src, CONS, AUX)
    dev = device_source(TRACE_CTAS, TR_PRINT_MAX) + TRACE_SRC % {}
    out = insert(out, "using bf16 = __nv_bfloat16;\n", dev, "device helpers")
    out = insert(out, "BEFORE  if (wg == 0) {\n    // The aux warpgroup", DECL_SRC.rstrip("\n"), "declarations")
    out = insert(out, "      bar_wait(kBarDone + 2 + (c & 1));\n    }\n", f"    TRACE_END({len(AUX)});", "aux end")
    out = insert(out, "  if ((tid & 127) == 0) bulk_wait_all();  // y written before the block ends",
                 f"  TRACE_END({len(CONS)});", "consumer end")
    if out.count(LAUNCH_OLD) != 1:
        raise SystemExit("fwd90_trace: marker launch: no single match (update LAUNCH_OLD)")
    out = out.replace(LAUNCH_OLD, LAUNCH_NEW)
    return insert(out, "BEFORE// ===================================== chunk_sm90: bfloat16", "#include <cstdio>", "include")


def stamp_roles(out, cons, aux):
    """out with the TRACE / TRACE_SYNC stamps of both roles' markers."""
    for role, marks in (("cons", cons), ("aux", aux)):
        assert len(marks) <= TR_NS
        for i, mark in enumerate(marks):
            macro = "TRACE_SYNC" if len(mark) > 2 and mark[2] == "sync" else "TRACE"
            out = insert(out, mark[0], f"    {macro}({i});", f"{role} {i} ({mark[1]})")
    return out


def traced_source_f32(src):
    """CHUNK_SM90_TF32_SRC with the stamps (the float32 block: D_k = D_v = 128, dense, its only instantiation)."""
    src = insert(src, "    float* tb = reinterpret_cast<float*>(sm + TL::kTB + (c & 1) * TL::kTabSlot);", GATES_USE_SRC,
                 "the gates' use")
    out = stamp_roles(src, CONS_F32, AUX_F32)
    dev = device_source(TRACE_CTAS, TR_PRINT_MAX) + TRACE_SRC % {} + TRACE_END_F32_SRC
    out = insert(out, "using TL = Sm90Tf32Layout;\n", dev, "device helpers")
    out = insert(out, "  const int hq = sg.h & maps.hm[0], bq = sg.b & maps.bm[0], hk = sg.h & maps.hm[1], bk = sg.b & maps.bm[1];",
                 DECL_F32_SRC % {"warp": "wl"}, "aux declarations")
    out = insert(out, "  const int dv0 = 64 * cw + 16 * wl + g;", DECL_F32_SRC % {"warp": "4 + 4 * cw + wl"},
                 "consumer declarations")
    out = insert(out, "BEFORE  if (!outputs && tid == 0) p.seg_decays[", f"  TRACE_END_F32({len(AUX_F32)});", "aux end")
    out = insert(out, "  if (tid == 0) bulk_wait_all();  // y written before the block ends",
                 f"  TRACE_END_F32({len(CONS_F32)});", "consumer end")
    return insert(out, "BEFORE// ===================================== chunk_sm90 on float32", "#include <cstdio>", "include")


def write_copy(path, dtype="bfloat16"):
    """solution.py with the stamps in CHUNK_SM90_SRC (bfloat16) or CHUNK_SM90_TF32_SRC (float32, and the launch's
    print kernel in CHUNK_SM90_SRC)."""
    text = open("solution.py").read()
    if dtype == "float32":
        start = text.index('CHUNK_SM90_TF32_SRC = r"""')
        end = text.index('\n"""', start + 25)
        text = text[:start] + traced_source_f32(text[start:end]) + text[end:]
        start, end = sm90_span(text)
        src = text[start:end]
        if src.count(LAUNCH_OLD) != 1:
            raise SystemExit("fwd90_trace: marker launch: no single match (update LAUNCH_OLD)")
        src = src.replace(LAUNCH_OLD, LAUNCH_NEW.replace("!f32 && pl.DK", "f32 && pl.DK"))
    else:
        start, end = sm90_span(text)
        src = traced_source(text[start:end])
        assert "#include <cstdio>" in src
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    open(path, "w").write(text[:start] + src + text[end:])
    return len(CONS), len(AUX)


# ---- the build and ptxas resources (no GPU) ----
BUILD_CODE = ("import importlib.util as u, sys; sys.path.insert(0, '.'); "
              "s = u.spec_from_file_location('trace_built', sys.argv[1]); m = u.module_from_spec(s); "
              "s.loader.exec_module(m); m.build(sys.argv[2]); print('SO', m._units[sys.argv[2]])")


def build_copies(paths, unit="chunk_sm90"):
    """Each copy's core and unit, one process a copy, at once; {path: the unit's library}."""
    procs = [subprocess.Popen([sys.executable, "-c", BUILD_CODE, p, unit], stdout=subprocess.PIPE, text=True)
             for p in paths]
    sos = {}
    for p, pr in zip(paths, procs):
        out, _ = pr.communicate()
        if pr.returncode != 0:
            raise SystemExit(f"fwd90_trace: the build of {p} failed")
        sos[p] = re.findall(r"^SO (.*)$", out, re.M)[-1]
    return sos


def find_cuobjdump():
    """CUDA_HOME's cuobjdump, else PATH's, else the one triton's wheel carries."""
    import shutil
    for c in [os.path.join(os.environ.get("CUDA_HOME", "/usr/local/cuda"), "bin", "cuobjdump"),
              shutil.which("cuobjdump") or ""]:
        if c and os.path.exists(c):
            return c
    try:
        import triton
        c = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
        if os.path.exists(c):
            return c
    except ImportError:
        pass
    raise SystemExit("fwd90_trace: no cuobjdump (set CUDA_HOME)")


def fwd_instantiation(name):
    """chunk_sm90_kernel's instantiation, from its mangled name: bf16<128,false>."""
    mm = re.search(r"Li(\d+)ELb(\d)E", name)
    return ("bf16" if "13__nv_bfloat16" in name else "f32") + f"<{mm.group(1)},{'true' if mm.group(2) == '1' else 'false'}>"


def res_usage(so, kernel="chunk_sm90_kernel", instantiation=fwd_instantiation):
    """{instantiation: (REG, STACK, LOCAL, STL + LDL instructions, WARPGROUP.DEPBAR instructions)} of the kernel
    in a unit's library (more wgmma waits than HEAD's: ptxas serialized the wgmmas)."""
    cuobjdump = find_cuobjdump()
    out = subprocess.run([cuobjdump, "-res-usage", so], capture_output=True, text=True).stdout
    sass = subprocess.run([cuobjdump, "-sass", so], capture_output=True, text=True).stdout
    spills = {}
    for part in re.split(r"\n\s*Function : ", sass)[1:]:
        spills[part.split("\n", 1)[0].strip()] = (len(re.findall(r"\b(?:STL|LDL)\b", part)),
                                                   len(re.findall(r"WARPGROUP\.DEPBAR", part)))
    res = {}
    for name, body in re.findall(r"Function (\S*" + kernel + r"\S*):\s*\n\s*(.*)", out):
        inst = instantiation(name)
        f = dict(re.findall(r"(\w+):(\d+)", body))
        res[inst] = (int(f["REG"]), int(f["STACK"]), int(f["LOCAL"])) + spills.get(name, (-1, -1))
    return res


def build_only(copy, dtype="bfloat16"):
    n_cons, n_aux = write_copy(copy, dtype)
    print(f"copy {copy}: {n_cons} consumer and {n_aux} aux stamps, every marker found")
    sos = build_copies(["solution.py", copy])
    for label, path in (("head", "solution.py"), ("trace", copy)):
        for inst, (reg, stack, local, sp, dep) in sorted(res_usage(sos[path]).items()):
            print(f"{label:6s} {inst:18s} REG {reg} STACK {stack} LOCAL {local} STL+LDL {sp} wgmma waits {dep}")


# ---- the device run ----
def inputs(name, seed=1):
    """reference.make_inputs' distributions (q, k, v ~ N(0, 1), gate, beta = sigmoid(N(0, 1))), drawn on the device
    (S4's 800 M draws on the host took seconds a process); the plain forward's and the autograd forward's."""
    import torch
    from bench import SHAPES
    B, T, H, D, dtype = SHAPES[name][:5]
    gen = torch.Generator("cuda").manual_seed(seed)
    xs = [torch.randn(B, T, H, D, device="cuda", generator=gen).to(dtype) for _ in range(3)]
    xs += [torch.sigmoid(torch.randn(B, T, H, device="cuda", generator=gen)).to(dtype) for _ in range(2)]
    return (B, T, H, D, dtype), xs, [x.detach().clone().requires_grad_() for x in xs]


def calls(m, xs, xg):
    """The two forwards: (label, fn, args)."""
    import torch

    def plain(*a):
        with torch.no_grad():
            return m.gated_recurrence(*a)
    return [("plain", plain, xs), ("ckpt", m.gated_recurrence, xg)]


def child(args):
    """One shape on the stamped copy: each forward once (its printf lines, then a marker line), then (with
    --time-trace) its KernelBench medians. The printing warps are counted on the device (TR_PRINT_MAX): the timed
    calls print nothing."""
    import ctypes
    import importlib.util
    import torch
    from timing import kernelbench_time
    spec = importlib.util.spec_from_file_location("fwd90_traced", args.copy)
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    libc = ctypes.CDLL(None)
    _, xs, xg = inputs(args.child)
    for label, fn, a in calls(m, xs, xg):
        y = fn(*a)
        try:  # (the autograd forward's saved tensors: the inputs, then the checkpoints or None)
            ck = y.grad_fn.saved_tensors[-1] if y.grad_fn is not None else None
        except (AttributeError, RuntimeError, IndexError):
            ck = None
        torch.cuda.synchronize()
        libc.fflush(None)  # the device printf lines (the C runtime's stdout) before the marker
        print(f"TRACE_END {label} ckpt_written={ck is not None}", flush=True)
        del y, ck
    for label, fn, a in calls(m, xs, xg) if args.time_trace else []:
        st = kernelbench_time(fn, a, trials=args.trials, warmup=8)  # (the warm-ups use up the prints left)
        libc.fflush(None)
        print(f"TIME {label} {json.dumps(st)}", flush=True)


def parse(out, names_by_warp):
    """{label: {(cta, mode, seg, warp): [(acc, runs, mid), ...]}} from the child's stdout, and the ckpt flags."""
    res, flags, cur = {}, {}, {}
    for line in out.splitlines():
        mm = re.match(r"TRACE cta (\d+) mode (\d+) seg (\d+) warp (\d+) i (\d+) (-?\d+) (\d+) (-?\d+)", line)
        if mm:
            cta, mode, seg, warp, i = (int(mm.group(k)) for k in range(1, 6))
            row = cur.setdefault((cta, mode, seg, warp), [None] * len(names_by_warp(warp)))
            if i < len(row):
                row[i] = (int(mm.group(6)), int(mm.group(7)), int(mm.group(8)))
            continue
        mm = re.match(r"TRACE_END (\w+) ckpt_written=(\w+)", line)
        if mm:
            res[mm.group(1)], flags[mm.group(1)], cur = cur, mm.group(2) == "True", {}
    return res, flags


LOG = []


def say(*a):
    """print, kept for $OUT/fwd90_trace.txt (the device call's output tail is short)."""
    print(*a)
    LOG.append(" ".join(str(x) for x in a))


def summarize(name, label, rows, nch, us_chunk):
    """Cycles a phase a chunk (over all nch chunks) per role, the mean over the traced CTAs and the role's warps;
    each CTA's loop total; chunk nch / 2's stamps on one axis (CTA 0). Returns the JSON part."""
    out = {"warps": {f"cta {c} mode {mo} seg {s} warp {w}": r for (c, mo, s, w), r in rows.items()}}
    for mode in sorted({k[1] for k in rows}):
        sel = {k: r for k, r in rows.items() if k[1] == mode and all(x is not None for x in r)}
        if not sel:
            continue
        tables = {}
        for role, warps in ROLES:
            rr = [r for (c, mo, s, w), r in sel.items() if w in warps]
            if rr:
                tables[role] = [sum(r[i][0] for r in rr) / len(rr) / nch for i in range(len(rr[0]))]
        clock = None
        for title, roles, marks in (("aux", ("aux w0", "aux w1-3"), AUX), ("consumers", ("cons 1", "cons 2"), CONS)):
            have = [r for r in roles if r in tables]
            if not have:
                continue
            tot = [sum(tables[r]) for r in have]
            clock = tot[0] / us_chunk / 1e3 if us_chunk else None
            say(f"{name} {label} mode {mode} {title}: cycles a chunk, mean of CTAs {sorted({k[0] for k in sel})}"
                  + (f" ({us_chunk:.2f} us a chunk from the head's time: {clock:.2f} GHz)" if us_chunk else ""))
            say("    " + "".join(f"{r:>10s}" for r in have) + "  phase")
            for i, mk in enumerate(marks):
                say("    " + "".join(f"{tables[r][i]:10.0f}" for r in have) + f"  {mk[1]}")
            say("    " + "".join(f"{t:10.0f}" for t in tot) + "  total")
        for cta in sorted({k[0] for k in sel}):
            tot = {w: sum(x[0] for x in r) / nch for (c, mo, s, w), r in sel.items() if c == cta}
            say(f"  cta {cta}: loop cycles a chunk by warp: " + " ".join(f"{w}:{tot[w]:.0f}" for w in sorted(tot)))
        cta0 = min(k[0] for k in sel)
        ref = [r for (c, mo, s, w), r in sel.items() if c == cta0][0][0][2]

        def rel(x):  # (32-bit clocks: differences modulo 2^32)
            return (x - ref + 2 ** 31) % 2 ** 32 - 2 ** 31
        t0 = min(rel(x[2]) for (c, mo, s, w), r in sel.items() if c == cta0 for x in r)
        say(f"  cta {cta0} chunk nch/2 on one axis (cycles from its first stamp; the phases' order as above):")
        for (c, mo, s, w), r in sorted(sel.items()):
            if c == cta0 and w in (0, 1, 4, 8):
                say(f"    warp {w}: " + " ".join(str(rel(x[2]) - t0) for x in r))
        out[f"mode {mode} cycles a chunk"] = {role: dict(zip([mk[1] for mk in (AUX if role.startswith("aux") else CONS)],
                                                             [round(x) for x in v])) for role, v in tables.items()}
        out[f"mode {mode} GHz from head"] = clock
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default=None, help="bench.py's shape names (default S4-bf16,S2-bf16; float32: S4,S2)")
    ap.add_argument("--dtype", choices=("bfloat16", "float32"), default="bfloat16",
                    help="the block to stamp: bfloat16 (CHUNK_SM90_SRC) or float32 (CHUNK_SM90_TF32_SRC)")
    ap.add_argument("--extra", action="append", default=[], help="LABEL=PATH of another solution.py, timed beside")
    ap.add_argument("--trials", type=int, default=10)
    ap.add_argument("--copy", default=DEFAULT_COPY, help="where the stamped copy is written")
    ap.add_argument("--no-time-trace", dest="time_trace", action="store_false", help="skip the stamped copy's times")
    ap.add_argument("--build-only", action="store_true", help="write the copy, build it and HEAD, ptxas resources")
    ap.add_argument("--copy-only", action="store_true", help="write the copy only (every marker checked)")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    global CONS, AUX
    if args.dtype == "float32":  # (parse and summarize read the lists)
        CONS, AUX = CONS_F32, AUX_F32
    args.shapes = args.shapes or ("S4,S2" if args.dtype == "float32" else "S4-bf16,S2-bf16")
    if args.child:
        return child(args)
    if args.copy_only:
        n_cons, n_aux = write_copy(args.copy, args.dtype)
        return say(f"copy {args.copy}: {n_cons} consumer and {n_aux} aux stamps, every marker found")
    if args.build_only:
        return build_only(args.copy, args.dtype)
    write_copy(args.copy, args.dtype)
    inst = ("f32" if args.dtype == "float32" else "bf16") + "<128,false>"
    from tools.common import load_copies, save
    sos = build_copies(["solution.py", args.copy] + [e.split("=", 1)[1] for e in args.extra])
    res = {"ptxas": {}}
    for p, so in sos.items():
        try:
            res["ptxas"][p] = res_usage(so)
            say(f"{p} {inst}: (REG, STACK, LOCAL, STL+LDL, wgmma waits) {res['ptxas'][p].get(inst)}")
        except (SystemExit, OSError, KeyError, AttributeError) as e:  # (no cuobjdump: not the run's point)
            say(f"{p}: no resource usage ({e})")
    import torch
    import solution
    from timing import kernelbench_time
    mods = {"head" if k == "new" else k: m for k, m in load_copies(args.extra, solution).items()}
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    for name in args.shapes.split(","):
        (B, T, H, D, dtype), xs, xg = inputs(name)
        plan = solution.plan(B, T, H, D, D, dtype)
        say(name, plan.splitlines()[0][:150])
        segs = int(re.search(r"segments=(\d+)", plan).group(1)) if "segments=" in plan else 1
        nch = (T + 63) // 64 // segs if segs > 1 else (T + 63) // 64
        waves = -(-B * H * segs // sms)
        times = {}
        for mlabel, m in mods.items():
            for label, fn, a in calls(m, xs, xg):
                st = kernelbench_time(fn, a, trials=args.trials)
                times[f"{label} {mlabel}"] = st
                say(f"{name} {label} {mlabel}: median {st['median'] * 1e3:.1f} us")
        child_cmd = [sys.executable, os.path.abspath(__file__), "--child", name, "--copy", args.copy,
                     "--trials", str(args.trials)] + ([] if args.time_trace else ["--no-time-trace"])
        ch = subprocess.run(child_cmd, capture_output=True, text=True)
        for mm in re.finditer(r"^TIME (\w+) (.*)$", ch.stdout, re.M):
            st = json.loads(mm.group(2))
            times[f"{mm.group(1)} trace"] = st
            say(f"{name} {mm.group(1)} trace (stamped copy): median {st['median'] * 1e3:.1f} us")
        traces, flags = parse(ch.stdout, lambda w: AUX if w < 4 else CONS)
        res[name] = {"plan": plan.splitlines()[0], "chunks a block": nch, "waves": waves, "ms": times,
                     "ckpt written": flags}
        for label, rows in traces.items():
            us_chunk = times[f"{label} head"]["median"] * 1e3 / (waves * nch)
            say(f"{name} {label}: checkpoints written {flags[label]}; head {times[f'{label} head']['median'] * 1e3:.1f}"
                  f" us over {waves} waves x {nch} chunks = {us_chunk:.2f} us a chunk")
            res[name][label] = summarize(name, label, rows, nch, us_chunk)
        if not traces or ch.returncode != 0:
            say(f"no stamps (rc {ch.returncode}):", ch.stdout[-1500:], ch.stderr[-3000:])
    save("fwd90_trace.json", res)
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "fwd90_trace.txt"), "w") as f:
            f.write("\n".join(LOG) + "\n")


if __name__ == "__main__":
    main()
