"""Pass A of the float32 Hopper backward (docs/training-design.md 8.2 "Two passes", 8.4 option (b)): dq, dk, dgate,
dbeta, sm_90a, one standalone dev script run from the repository root. Pass B (dev/bwd_fp32_passB.py) makes dv and
dS_0; this file reuses its tables, splits and state load (its CUDA text) by import, and with it
dev/bwd_fp32_common.py's: the CUDA preamble and kernel entry, the host helpers, the build, the chunk models' products,
padding and tables, the cases, the check loops and the command line.

What it computes, for float32 q, k, v, dy (B, T, H, 128), gate, beta (B, T, H), all contiguous, the checkpoints ckpt
(B H, ceil(T / 64), 128, 128) float32 (S at each 64-step chunk start, [dk][dv]) and an optional d_final_state
(B, H, 128, 128): dq, dk (B, T, H, 128) and dgate, dbeta (B, T, H), float32. Any T: the last chunk's rows past T are
zero, their gates 1, betas 0. Non-finite inputs are not handled (an inf meets a mask's zero inside a product: NaN
where the float64 loop has a number; chunk_bwd_sm90's FMA fallback is not ported).

Design (per (b, h) one CTA of 384 threads, chunks of 64 steps backwards, chunk_bwd_sm90's math):
  - WG0 (setmaxnreg 56): pass B's tables (L packed, A, w, beta) and Lx's pair a chunk ahead, the L2 prefetch of the
    next chunk's rows and checkpoint, dgate and dbeta a chunk behind from the consumers' double-buffered row-dot
    partials (chunk_bwd_sm90's dgate_dbeta: fixed-order sums, deterministic);
  - two consumer warpgroups (224 registers), consumer c holding G's rows i = 64 c .. (the state gradient after the
    chunk) in registers: k, v and dy's fp32 rows land by cp.async in their own pair's space during the chunk
    before, as soon as it has read that pair (v after Rk^T, k after dbeta's row dots, dy once dy A[t] is made), and
    the top splits them in place into bf16 pairs (hi = RN(x), lo = RN(x - hi)) while q's rows load from global
    memory (q's pair is read until G's update); every product
    three bf16 wgmma terms a k-step (hh + hl + lh): Dd and QK's columns s = 32 c .. -> MQ, MD (split, shared) and
    E; M_c = E[:, s half] Lx[:, s half]^T (dgate's C^3 term split over the contraction: WG0 adds the two halves'
    column sums); R^T = S dY^T (S's fp32 rows from the checkpoint, split a k-step at a time; c0 = sum S o G from
    the same values), f's part, dq^T = R^T diag(A) + K^T MQ^T; Rk^T = G V^T (G split a k-step at a time), e's
    part, dkt^T = Rk^T diag(w) + Q^T MD, dbeta's part, dk = beta dkt; G's update in two N = 64 halves, each from
    zero, U = Q^T diag(A) dY (A = q's pair MN-major; B = dy A[t] as a pair in MQ / MD's space, from dy's pair times
    A[t], split), joined by G = fmaf(A_63, G, U) (wgmma's in-place accumulation truncates: perf-notes, thirtieth
    session). The row dots read the pairs' hi + lo (within 2^-17). (Thirty-first session: the loads overlapped and
    G's update from shared memory; before, all four tiles loaded at the top and the update's A from q's fp32 rows
    in L2, split a k-step at a time.)
  - --split t builds the kernel with training-design 8.6's scheme, as pass B's: the pairs fp16 hi / lo on f16 wgmma
    forms, every operand matrix of the chunk model's products split times one power of two 2^-e that brings its
    max |x| near 2^15, and each product's accumulator times 2^e_A and 2^e_B (one multiply each: their product may
    leave the float range); where a product accumulates onto a result (dq^T onto R^T diag(A), dkt^T onto
    Rk^T diag(w)) the result is taken to the product's scale first and back after. The tiles (each the model's
    matrix): q, k, v, dy (each warp's maximum at the top's in-place split, through 8 slots across a barrier it
    already has); MQ and MD (both consumers' halves) and E (consumer c's 64 x 32, M_c's A) across one more barrier;
    Lx per column half (WG0 takes it while building Lx and leaves it in slots that the consumers read before barrier
    3's arrival); S, R^T's A, whose rows stream a k-step at a time: its exponent is the host's, from the float32
    checkpoint (ckpt_exponents, an int32 (B H, nck) tensor: the forward that writes the checkpoints would write it
    too); G (both consumers' rows, its maximum across barrier (4)); dy A[t] (across (4b)). The row dots read a pair
    as fp16 hi + lo times its tile's 2^e, dy A[t] is made from dy's pair read the same way; c0 sums the unscaled
    S o G. Its --check compares against that scheme's emulation.
  Shared memory 216,640 B: pairs q, k, v, dy (32 KB each), MQ, MD (16 KB each), Lx (16 KB), two table buffers, the
  gates, two partial buffers; split t adds 512 B of tile scales' slots (217,152 B).

    python3 dev/bwd_fp32_passA.py --cpu-check [--split b|d|t] (no GPU, no build: the float64 chunk model against
                                  naive.chunked_backward_naive, and the emulation's error: b, the kernel's bf16 x3
                                  (default); d, 8.4's fallback, fp16 x3 with power-of-two scales, every product and
                                  the row dots' pairs; t, d with one scale a tile)
    python3 dev/bwd_fp32_passA.py --build-only [--split b|t]   (no GPU; CUDA_HOME=/usr/local/cuda
                                  TORCH_CUDA_ARCH_LIST=9.0a; --check and --bench take --split too)
    python3 dev/bwd_fp32_passA.py --check        (device: the four gradients against float64, the 1e-5 bar)
    python3 dev/bwd_fp32_passA.py --bench [--trials N]   (device: (16, 4096, 32, 128), us a chunk and SM)
  Results go to $OUT/bwd_fp32_passA.json where OUT is set.

Verified locally (no GPU, CUDA 13.0): --cpu-check: the float64 model (the kernel's tables and chunk formulas, the
checkpoints from the float64 forward loop) against naive.chunked_backward_naive at every case of --check (pass B's:
T = 1, 63, 64, 130, 300 x seven gate classes, (1, 2100, 2) at gate 1.002, d_final_state on every other case),
worst rel-L2 1.9e-14; the model in float32 with bf16 x3 products (rounding to nearest or truncating) and float32
checkpoints at 4-9e-6 for T >= 63, but dgate at (1, 63, 2) above1: 1.2e-5 / 1.4e-5 (RN / RZ: mostly its C^3
term, E = beta QK Dd: Dd or QK made exact in the emulation brings it to 8.1e-6 / 9.0e-6, the others change it
little), dgate at (1, 130, 2) near1: 1.26e-5 / 1.24e-5 since G's update takes dy A[t] from dy's pair (8.9e-6 /
9.6e-6 before), and T = 1, where dq, dk, dbeta are single products whose relative error follows one dot's
cancellation: up to 6.0e-5 (--check reports such a case as OVER with the emulation beside it). --build-only: 168
registers, 8 B spilled (a value hoisted above the chunk loop), no ptxas wgmma warning (the #177 lines are the
probe's unused helpers). On the device (thirty-first session), the version before the overlapped loads (b95939e):
--check equal to the bf16 x3 emulation in every case; its timing and ncu profile in perf-notes. This version has
not run; a helper reviewed its barriers, cp.async groups, fences and layouts (no problem found).
--split t (written after the thirty-first session's device time): compiled (168 registers, 20 / 20 B spilled; 88 / 144
before the warpgroup index and store_t's row stride were made opaque in t, as sm and the thread index are), emulated,
not run. --cpu-check --split t: 2.2e-6 worst. A CPU emulation of the kernel's own t arithmetic (its exponents from
the tiles' maxima, its order of multiplies, fp16 splits, three terms a k-step into float32 accumulators at the scaled
values) equals pass_a_model(split="t") bit for bit on every --check case, rounding to nearest and truncating: dq and
dk, and dgate and dbeta as sums of bit-equal products (the emulation sums them in the model's order; the kernel's
order is its own, as in the b build). Tiles of max |x| <= 2^-111 differ from the model (the exponent's clamp at
-126, pass B's): E, of the fourth order in the inputs, gets there when q, k, v and dy are all below about 1e-9
(with the clamp at -100, max |E| near 2^-110 put the emulated kernel's dgate 2.1e-4 from the model's).
The b build's SASS is the same as before but for the parameters' constant-bank offsets (Params gained ckexp).
"""
import math
import os
import sys

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # dev/ (pass B, the shared part)
import bwd_fp32_common as common  # noqa: E402
import bwd_fp32_passB as passb  # noqa: E402
import fp32_split_emulation as emu  # noqa: E402
import naive  # noqa: E402
from bwd_fp32_common import rel  # noqa: E402
from timing import kernelbench_time  # noqa: E402

torch.set_grad_enabled(False)


# ---------------------------------------------------------------------------------------------
# The chunk model: the kernel's tables and chunk formulas, plainly; float64, or float32 with the products as the
# kernel's bf16 x3 wgmma sequences, or (d)'s (fp32_split_emulation's mm, each k-step and term's exact partial added
# to an fp32 accumulator, rounded to nearest or, rz, truncated) and the row dots on the tiles' hi + lo, as the
# kernel's (bwd_fp32_common's model_mm and model_pair).
# ---------------------------------------------------------------------------------------------
def checkpoints(k, v, gate, beta):
    """S at each 64-step chunk start, (B, H, nck, D, D) float64, by the forward recurrence a step at a time (on k's
    device: --check makes them on the GPU)."""
    k, v, gate, beta = (x.double() for x in (k, v, gate, beta))
    B, T, H, D = k.shape
    S = torch.zeros(B, H, D, v.shape[-1], dtype=torch.float64, device=k.device)
    out = []
    for t in range(T):
        if t % 64 == 0:
            out.append(S)
        S = gate[:, t, :, None, None] * S + beta[:, t, :, None, None] * k[:, t, :, :, None] * v[:, t, :, None, :]
    return torch.stack(out, 2)


STATE = ("B", "T", "H", "D", "nck", "G", "dq", "dk", "dgate", "dbeta", "low", "strict", "zero")


def model_state(q, k, v, gate, beta, dy, ckpt, dsT, f):
    """What both chunk models start from: the padded inputs (B, H, 64 nck, D) in dtype f, the checkpoints, G (from
    dS_T or zero), the zeroed results, the masks (s <= t, s < t) and zero."""
    B, T, H, D = q.shape
    (q, k, v, dy), gate, beta, nck = common.model_inputs((q, k, v, dy), gate, beta, f)
    st = dict(B=B, T=T, H=H, D=D, nck=nck, q=q, k=k, v=v, dy=dy, gate=gate, beta=beta, ckpt=ckpt.to(f))
    st["G"] = torch.zeros(B, H, D, D, dtype=f) if dsT is None else dsT.to(f).clone()
    st["dq"], st["dk"] = torch.zeros(B, H, nck * 64, D, dtype=f), torch.zeros(B, H, nck * 64, D, dtype=f)
    st["dgate"], st["dbeta"] = torch.zeros(B, H, nck * 64, dtype=f), torch.zeros(B, H, nck * 64, dtype=f)
    st["low"], st["strict"] = torch.ones(64, 64, dtype=torch.bool).tril(), torch.ones(64, 64, dtype=torch.bool).tril(-1)
    st["zero"] = torch.zeros((), dtype=f)
    return st


def chunk_inputs(st, ch):
    """Chunk ch's slice, rows, checkpoint and tables by running products (WG0's, chunk_bwd_sm90's): L[t][s] =
    L[t-1][s] g_t, A[t] = A[t-1] g_t, Ah = A[t - 1], w = L[63], Lx[t][s] = L[t-1][s] for s < t."""
    sl = slice(64 * ch, 64 * ch + 64)
    Q, K, V, dY = (st[n][:, :, sl] for n in ("q", "k", "v", "dy"))
    g, bt = st["gate"][:, :, sl], st["beta"][:, :, sl]
    L, A = common.chunk_tables(g)
    Ah = torch.cat([torch.ones_like(A[..., :1]), A[..., :-1]], -1)
    Lx = torch.zeros_like(L)
    Lx[..., 1:, :] = L[..., :-1, :]
    Lx = torch.where(st["strict"], Lx, st["zero"])
    return sl, Q, K, V, dY, g, bt, st["ckpt"][:, :, ch], L, A, Ah, L[..., 63, :], Lx


def pass_a_model(q, k, v, gate, beta, dy, ckpt, dsT=None, emulate=None, split="b"):
    """(dq, dk (B, T, H, D), dgate, dbeta (B, T, H)) from the checkpoints ckpt (B, H, nck, D, D); emulate None
    (float64), "rn" or "rz" (float32, the products and pairs in split's scheme: b bf16 x3, d scaled fp16 x3)."""
    f = torch.float64 if emulate is None else torch.float32
    if emulate is not None and split in common.STEP_GROUP:
        return pass_a_model_steps(q, k, v, gate, beta, dy, ckpt, dsT, emulate, split)
    mm = common.model_mm(emulate, split)
    pair = common.model_pair(emulate, split)  # a tile as the row dots read it
    st = model_state(q, k, v, gate, beta, dy, ckpt, dsT, f)
    B, T, H, D, nck, G, dq, dk, dgate, dbeta, low, strict, zero = (st[n] for n in STATE)
    for ch in range(nck - 1, -1, -1):
        sl, Q, K, V, dY, g, bt, S, L, A, Ah, w, Lx = chunk_inputs(st, ch)
        Dd = mm(dY, V.transpose(-1, -2))  # consumer c: columns s = 32 c ..
        QK = mm(Q, K.transpose(-1, -2))
        MQ = torch.where(low, Dd * L * bt[..., None, :], zero)  # MQ[t][s] = L[t][s] beta_s Dd[t][s]
        MD = torch.where(low, Dd * L, zero)  # MD[u][s] = L[u][s] Dd[u][s]
        E = torch.where(strict, bt[..., None, :] * QK * Dd, zero)
        Rt = mm(S, dY.transpose(-1, -2))  # R^T[i][t] = sum_j S[i][j] dY[t][j]
        c0 = (S * G).sum((-1, -2))
        f_ = (pair(Q) * Rt.transpose(-1, -2)).sum(-1)
        dqt = mm(K.transpose(-1, -2), MQ.transpose(-1, -2), acc=Rt * A[..., None, :])  # R^T diag(A) + K^T MQ^T
        dq[:, :, sl] = dqt.transpose(-1, -2)
        Rkt = mm(G, V.transpose(-1, -2))  # Rk^T[i][s] = sum_j G[i][j] V[s][j]
        e = (pair(K) * Rkt.transpose(-1, -2)).sum(-1)
        dkt = mm(Q.transpose(-1, -2), MD, acc=Rkt * w[..., None, :])  # Rk^T diag(w) + Q^T MD
        dk[:, :, sl] = (bt[..., None, :] * dkt).transpose(-1, -2)
        dbeta[:, :, sl] = (pair(K) * dkt.transpose(-1, -2)).sum(-1)
        # dgate's term (d): M = E Lx^T, each consumer the columns s = 32 c .. of the contraction (a partial M whose
        # column sums WG0 adds)
        td = sum((L * mm(E[..., 32 * c:32 * c + 32], Lx[..., 32 * c:32 * c + 32].transpose(-1, -2))).sum(-2)
                 for c in (0, 1))
        dgate[:, :, sl] = (td + w * (Ah * c0[..., None] + (Lx @ (bt * e)[..., None])[..., 0])
                           + Ah * (L.transpose(-1, -2) @ f_[..., None])[..., 0])
        U = mm(Q.transpose(-1, -2), pair(dY) * A[..., :, None])  # from zero (B: dy's pair times A[t]), one FMA
        a63 = A[..., 63, None, None]
        G = a63 * G + U if emulate is None else (a63.double() * G.double() + U.double()).float()
    return (dq[:, :, :T].transpose(1, 2), dk[:, :, :T].transpose(1, 2), dgate[:, :, :T].transpose(1, 2),
            dbeta[:, :, :T].transpose(1, 2))


def passb_src(start, end):
    """Pass B's CUDA text from the line starting `start` up to `end` (its tables, barriers, row addressing, state
    load and put_pair), so that both passes build the same tables and splits."""
    src = passb.CUDA_SRC
    a = src.index(start)
    return src[a:src.index(end, a)]


# The kernel's CUDA text after tools/sm90_build.probe_cuda's head and the probe's k-step helpers (namespace pa).
CUDA_SRC = r"""
// Shared memory (bytes). Pairs (hi at off, lo at off + kTile; [d / 8][t][8]): q, k, v, dy. The weights' pairs MQ,
// MD ([s / 8][row][8], lo at + kW), Lx's pair ([s / 8][t][8], one buffer: WG0 rewrites it once the consumers have
// read it, barrier 4); two table buffers (pass B's: L packed, A, w, beta, beta w); the gates; two buffers of the
// consumers' row-dot partials (chunk ch's in ch & 1; WG0 reduces them during chunk ch - 1).
constexpr int kTile = 16384, kW = 8192;
constexpr int kQ = 0, kK = 32768, kV = 65536, kY = 98304, kMQ = 131072, kMD = 147456, kLx = 163840, kTab = 180224;
constexpr int kA = 2080, kWt = kA + 64, kBeta = kA + 128, kBW = kA + 192, kTabBuf = (kA + 256) * 4;
static_assert(kK == kQ + 2 * kTile && kV == kK + 2 * kTile && kY == kV + 2 * kTile && kMQ == kY + 2 * kTile &&
              kMD == kMQ + 2 * kW && kLx == kMD + 2 * kW && kTab == kLx + 2 * kW, "the pairs (a tile 32 KB)");
constexpr int kGates = kTab + 2 * kTabBuf, kPart = kGates + 256;
// partials (floats): f [8][64] at 0, e at 512, dbeta at 1024 (slot 4 c + warp), c0 [8] at 1536, the sums of f at
// 1544 and of e at 1608, dgate's term (d) [8][64] at 1672 (slot 4 c + warp: consumer c's half of M's contraction)
// kScl (split t): the tile scales' slots, 8 floats a tile (sQ .. sLx below): a consumer warp's max |x| at 4 c + warp,
// Lx's (WG0's) at its warp; none in the b build.
constexpr int kPartBuf = (1672 + 512) * 4, kScl = kPart + 2 * kPartBuf, kSmem = kScl + (SPLIT_T ? 512 : 0);
static_assert(kSmem <= 232448, "fits the opt-in shared memory of an H200");
constexpr int kAuxRegs = 56, kConsRegs = 224;  // (chunk_bwd_sm90's split: its WG0 spilled at 40 with dgate's sums)
static_assert(kAuxRegs * 128 + kConsRegs * 256 <= 65536, "the split fits the register file");

struct Params {
  const float *q, *k, *v, *dy, *gate, *beta, *ckpt, *dfinal;  // ckpt (B H, nck, 128, 128); dfinal: nullptr for zero
  const int* ckexp;  // (split t) (B H, nck): each checkpoint's tile exponent (the host's; unread in the b build)
  float *dq, *dk, *dgate, *dbeta;
  int T, H, nck;
};

DECAY_TABLES
PASSB_TABLES
PASSB_PUT_PAIR
// Split t's tile scales: pass A's tiles (put_max, tile_exp, exp2i, max_abs: pass B's, spliced above).
enum { sQ, sK, sV, sY, sMQ, sMD, sE, sG, sYA, sLx };
// A pair's 16-bit element as float: bf16 (b) or fp16 (t)
__device__ __forceinline__ float ld16(const unsigned char* p) {
  if constexpr (kT) return __half2float(*reinterpret_cast<const __half*>(p));
  else return ldb(p);
}
__device__ __forceinline__ float* parts(unsigned char* sm, int ch) {
  return reinterpret_cast<float*>(sm + kPart + (ch & 1) * kPartBuf);
}
// Barrier 4: the consumers arrive after their last read of Lx in a chunk; WG0 waits before writing the next one's.
__device__ __forceinline__ void lx_free_arrive() { asm volatile("barrier.arrive 4, 384;\n" ::: "memory"); }
__device__ __forceinline__ void lx_free_wait() { asm volatile("barrier.sync 4, 384;\n" ::: "memory"); }

// WG0: Lx of chunk ch (Lx[t][s] = L[t-1][s] for s < t, else 0; pair [s / 8][t][8]) from its L (chunk_bwd_sm90's
// build_lx, by solution.py's lx_pairs): row t = tid % 64, columns 32 (tid / 64) ..; then the fence that makes it
// visible to wgmma.
// Split t: each column half's max |Lx| first (warps 0, 1: half 0; 2, 3: half 1), its exponent from its two warps'
// slots (the consumers read the same slots before barrier 3's arrival: WG0 writes them again after its wait).
__device__ __forceinline__ void build_lx(unsigned char* sm, int ch) {
  float sc = 1.f;
  if constexpr (kT) {
    float m = 0.f;
    lx_pairs(ltab(sm, ch), threadIdx.x, [&](float x0, float x1, int) { m = fmaxf(m, fmaxf(fabsf(x0), fabsf(x1))); });
    put_max(sm, sLx, threadIdx.x >> 5, m);
    wg0_sync();
    sc = exp2i(-tile_exp<2>(sm, sLx, 2 * (threadIdx.x >> 6)));
  }
  lx_pairs(ltab(sm, ch), threadIdx.x, [&](float x0, float x1, int off) {
    uint32_t hi, lo;
    psplit(x0 * sc, x1 * sc, hi, lo);
    *reinterpret_cast<uint32_t*>(sm + kLx + off) = hi;
    *reinterpret_cast<uint32_t*>(sm + kLx + kW + off) = lo;
  });
  fence_async_smem();
}
// WG0: chunk ch's q, k, v, dy rows and its checkpoint (64 KB) into L2 a chunk ahead of the consumers' loads (12
// lines of 128 B a thread; not unrolled, for WG0's registers).
__device__ __forceinline__ void prefetch_chunk(const Params& p, int64_t bh, int64_t b, int64_t h, int ch) {
  const unsigned char* S = reinterpret_cast<const unsigned char*>(p.ckpt + (bh * p.nck + ch) * 16384);
#pragma unroll 1
  for (int m = 0; m < 12; ++m) {
    const int x = threadIdx.x + 128 * m;
    if (x < 512) {
      asm volatile("prefetch.global.L2 [%0];\n" ::"l"(S + 128 * x));
      continue;
    }
    const int y = x - 512, tile = y >> 8, t = ch * 64 + ((y >> 2) & 63);
    if (t >= p.T) continue;
    const float* src = row_of(tile == 0 ? p.q : tile == 1 ? p.k : tile == 2 ? p.v : p.dy, p, b, h, t) + 32 * (y & 3);
    asm volatile("prefetch.global.L2 [%0];\n" ::"l"(src));
  }
}
// WG0: chunk ch's dgate and dbeta from the consumers' partials and its tables (chunk_bwd_sm90's dgate_dbeta, every
// sum in a fixed order: deterministic), two threads a step t: x = 0 terms (a), (b), (d) and dbeta, x = 1 term (c).
__device__ __forceinline__ void dgate_dbeta(const Params& p, unsigned char* sm, int64_t b, int64_t h, int ch) {
  const int tid = threadIdx.x, t0 = ch * 64, tc = min(64, p.T - t0);
  const int64_t go = (b * p.T + t0) * p.H + h;  // (b, t0, h) of dgate / dbeta
  const float* L = ltab(sm, ch);
  float* part = parts(sm, ch);
  const int t = tid >> 1, x = tid & 1;
  {  // f (threads 0..63) and e (64..127): the 8 warps' parts
    const int u = tid & 63, base = tid < 64 ? 0 : 512;
    float acc = 0.f;
#pragma unroll
    for (int w = 0; w < 8; ++w) acc += part[base + w * 64 + u];
    part[1544 + (tid >> 6) * 64 + u] = acc;
  }
  wg0_sync();
  const float ah = t > 0 ? L[kA + t - 1] : 1.f;  // A[t - 1]
  float td = 0.f;
  if (x == 0) {
#pragma unroll
    for (int w = 0; w < 8; ++w) td += part[1672 + w * 64 + t];  // (d)
    float c0 = 0.f;
#pragma unroll
    for (int w = 0; w < 8; ++w) c0 += part[1536 + w];
    float sb = 0.f;
    for (int s = 0; s < t; ++s) sb = fmaf(L[lp(t - 1, s)] * L[kBeta + s], part[1608 + s], sb);
    td += L[kWt + t] * (ah * c0 + sb);  // (a) + (b)
    float db = 0.f;
#pragma unroll
    for (int w = 0; w < 8; ++w) db += part[1024 + w * 64 + t];
    if (t < tc) p.dbeta[go + t * p.H] = db;
  } else {
    float sc = 0.f;
    for (int u = t; u < 64; ++u) sc = fmaf(L[lp(u, t)], part[1544 + u], sc);
    td = ah * sc;  // (c)
  }
  td += __shfl_xor_sync(0xffffffffu, td, 1);
  if (x == 0 && t < tc) p.dgate[go + t * p.H] = td;
}

// The consumers (lt 0..255): chunk ch's rows of x from global memory into registers (pass B's read_raw share: row
// t = 8 (lt / 32) + lt % 8, 8-column pieces kc = (lt / 8) % 4 + 4 m); rows past T zeros. q's, at the top: its pair
// is read until G's update, so q alone has no space to land in during the chunk before; its loads fly while k, v
// and dy are split.
__device__ __forceinline__ void load_rows(const float* x, const Params& p, int64_t b, int64_t h, int ch, int lt,
                                          float4 (&v)[4][2]) {
  asm volatile("" : "+l"(x));  // (opaque: its row addresses are not hoisted above the chunk loop into registers)
  const int t = 8 * (lt >> 5) + (lt & 7), kq = (lt >> 3) & 3;
  const bool valid = ch * 64 + t < p.T;
#pragma unroll
  for (int m = 0; m < 4; ++m) {
    const float4* src = reinterpret_cast<const float4*>(row_of(x, p, b, h, valid ? ch * 64 + t : 0) + 8 * (4 * m + kq));
    v[m][0] = valid ? __ldg(src) : make_float4(0.f, 0.f, 0.f, 0.f);
    v[m][1] = valid ? __ldg(src + 1) : make_float4(0.f, 0.f, 0.f, 0.f);
  }
}
// A raw tile split in place into its pair: every thread's share read, then (barrier) written; split t: the tile's
// maximum through its slots across that barrier, and its exponent returned (0 in the b build).
__device__ __forceinline__ int split_in_place(unsigned char* sm, int base, int lt, int tile) {
  float4 v[4][2];
  read_raw(sm, base, lt, v);
  if constexpr (kT) put_max(sm, tile, lt >> 5, max_abs(v));
  consumers_sync();
  int e = 0;
  if constexpr (kT) e = tile_exp<8>(sm, tile);
  write_pair(sm, base, lt, v, exp2i(-e));
  return e;
}
// dy A[t] (G's update's B, MN-major) as a pair at kMQ (lo at + kTile: MQ and MD's space, free after Q^T MD), from
// dy's pair (hi + lo, within 2^-17 of dy: the row dots' operand) times A[t] in fp32, split; no second read of dy's
// rows from L2 (that variant spilled 44 B and emulated no better: perf-notes, thirty-first session).
// Split t: dy's pair decoded as fp16 hi + lo times 2^e_y (the row dots' dy), times A[t] (one rounding), split times
// 2^-e_ya (scale = A[t] 2^-e_ya: RN(x A[t]) 2^-e_ya); with PUT false, only this thread's max |x A[t]|, returned.
__device__ __forceinline__ void dy_words(const uint32_t (&hw)[4], const uint32_t (&lw)[4], float sy, float (&x)[8]) {
#pragma unroll
  for (int e = 0; e < 4; ++e) {  // (a pair word: element 2 e in its low half)
    if constexpr (kT) {
      const __half2 h = *reinterpret_cast<const __half2*>(&hw[e]), l = *reinterpret_cast<const __half2*>(&lw[e]);
      x[2 * e] = (__low2float(h) + __low2float(l)) * sy;
      x[2 * e + 1] = (__high2float(h) + __high2float(l)) * sy;
    } else {
      x[2 * e] = __uint_as_float(hw[e] << 16) + __uint_as_float(lw[e] << 16);
      x[2 * e + 1] = __uint_as_float(hw[e] & 0xffff0000u) + __uint_as_float(lw[e] & 0xffff0000u);
    }
  }
}
template <bool PUT>
__device__ __forceinline__ float put_dya(unsigned char* sm, const float* L, int lt, float sy, float sya) {
  const int t = 8 * (lt >> 5) + (lt & 7), kq = (lt >> 3) & 3;
  const float a = L[kA + t];
  float mx = 0.f;
#pragma unroll
  for (int m = 0; m < 4; ++m) {
    const int off = (4 * m + kq) * 1024 + t * 16;
    const uint4 hi = *reinterpret_cast<const uint4*>(sm + kY + off);
    const uint4 lo = *reinterpret_cast<const uint4*>(sm + kY + kTile + off);
    const uint32_t hw[4] = {hi.x, hi.y, hi.z, hi.w}, lw[4] = {lo.x, lo.y, lo.z, lo.w};
    float x[8];
    dy_words(hw, lw, sy, x);
    if constexpr (PUT) {
      put_pair(sm + kMQ + off, make_float4(x[0], x[1], x[2], x[3]), make_float4(x[4], x[5], x[6], x[7]), a * sya);
    } else {
#pragma unroll
      for (int e = 0; e < 8; ++e) mx = fmaxf(mx, fabsf(x[e] * a));
    }
  }
  return mx;
}

// acc = A B over KSTEPS k-steps, 3 terms, A fp32 values in registers split a k-step at a time (RS): load(kb, sv)
// fetches k-step kb's eight values (an accumulator row pair's fragment order) a k-step ahead of their use; prep(kb,
// sv) works on them just before the split (c0's part; the scale by A). B a pair (K-major, or MN-major with TB).
// The values are split times sc (split t: the tile's 2^-e; 1 in the b build).
template <int KSTEPS, int TB, int R, typename FL, typename FP>
__device__ __forceinline__ void rs_split(float (&acc)[R], const unsigned char* sm, const Op& b, float sc, FL&& load,
                                         FP&& prep) {
  float sv[2][8];
  load(0, sv[0]);
#pragma unroll
  for (int kb = 0; kb < KSTEPS; ++kb) {
    prep(kb, sv[kb & 1]);
    uint32_t ah[4], al[4];
#pragma unroll
    for (int r = 0; r < 4; ++r) psplit(sv[kb & 1][2 * r] * sc, sv[kb & 1][2 * r + 1] * sc, ah[r], al[r]);
    if (kb + 1 < KSTEPS) load(kb + 1, sv[(kb + 1) & 1]);
    pin(ah, al);
    wg_fence();
    rs_kstep<3, TB>(acc, ah, al, sm, b, kb);
    wg_commit();
    if (kb + 1 < KSTEPS) wg_wait<1>();  // (a k-step's A registers stay live until its wgmmas complete: two at most)
  }
  wg_wait<0>();
  acc_fence(acc);
}

// MQ[t][s] = L[t][s] beta_s Dd[t][s], MD[t][s] = L[t][s] Dd[t][s] (s <= t, else 0) from consumer c's columns
// s = 32 c .. of Dd (X: rows t = 16 wl + g (+8), columns 32 c + 8 n + 2 q (+1)); split (MD times smd, MQ times smq:
// split t's 2^-e), stored [s / 8][t][8]. With PUT false, only this thread's max |MD| and |MQ| (split t).
template <bool PUT>
__device__ __forceinline__ void put_weights(unsigned char* sm, const float (&X)[16], const float* L, int c, int wl,
                                            int g, int q, float smd, float smq, float& mmd, float& mmq) {
#pragma unroll
  for (int n = 0; n < 4; ++n)
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      const int t = 16 * wl + g + 8 * hh, s = 32 * c + 8 * n + 2 * q;
      const float d0 = s <= t ? X[4 * n + 2 * hh] * L[lp(t, s)] : 0.f;  // (every lp(t, s < 64) is inside L)
      const float d1 = s + 1 <= t ? X[4 * n + 2 * hh + 1] * L[lp(t, s + 1)] : 0.f;
      if constexpr (!PUT) {
        mmd = fmaxf(mmd, fmaxf(fabsf(d0), fabsf(d1)));
        mmq = fmaxf(mmq, fmaxf(fabsf(d0 * L[kBeta + s]), fabsf(d1 * L[kBeta + s + 1])));
        continue;
      }
      const int off = (s >> 3) * 1024 + t * 16 + (s & 7) * 2;
      uint32_t hi, lo;
      psplit(d0 * smd, d1 * smd, hi, lo);
      *reinterpret_cast<uint32_t*>(sm + kMD + off) = hi;
      *reinterpret_cast<uint32_t*>(sm + kMD + kW + off) = lo;
      psplit(d0 * L[kBeta + s] * smq, d1 * L[kBeta + s + 1] * smq, hi, lo);
      *reinterpret_cast<uint32_t*>(sm + kMQ + off) = hi;
      *reinterpret_cast<uint32_t*>(sm + kMQ + kW + off) = lo;
    }
}
// A pair's value hi + lo (within 2^-17 of the fp32 value: the row dots' operand, as the model's); split t: the fp16
// hi + lo times the tile's 2^e (sc)
__device__ __forceinline__ float ldp(const unsigned char* p, float sc) { return (ld16(p) + ld16(p + kTile)) * sc; }
// Column u of a transposed 64 x 64 accumulator X[i][u] (rows i = ir (+8)) against row u of a pair tile, over this
// warp's 16 rows i: one partial a warp and column, at part[u].
__device__ __forceinline__ void col_dots(const unsigned char* sm, const float (&X)[32], int tile, int ir, float* part,
                                         int g, int q, float sc) {
#pragma unroll
  for (int n = 0; n < 8; ++n)
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int u = 8 * n + 2 * q + e;
      float x = X[4 * n + e] * ldp(sm + tile + (ir >> 3) * 1024 + u * 16 + (ir & 7) * 2, sc) +
                X[4 * n + 2 + e] * ldp(sm + tile + ((ir >> 3) + 1) * 1024 + u * 16 + (ir & 7) * 2, sc);
      x += __shfl_xor_sync(0xffffffffu, x, 4);
      x += __shfl_xor_sync(0xffffffffu, x, 8);
      x += __shfl_xor_sync(0xffffffffu, x, 16);
      if (g == 0) part[u] = x;
    }
}
// A transposed accumulator X[i][t] (rows i = ir (+8), columns t = 8 n + 2 q + e) to out[(b, ch 64 + t, h)][i], times
// scale[t] (or 1); rows t < T only. 32-bit offsets from one base (64-bit addresses of 16 rows, hoisted above the
// product before the store, were most of the consumers' spill).
__device__ __forceinline__ void store_t(float* out, const Params& p, int64_t b, int64_t h, int ch, const float (&X)[32],
                                        const float* scale, int ir, int q) {
  float* o = out + ((b * p.T + ch * 64 + 2 * q) * p.H + h) * 128 + ir;  // row t = 2 q
  int rs = p.H * 128;  // a step's stride; rows 8 n + e < left exist
  const int left = p.T - ch * 64 - 2 * q;
  // (split t: the stride opaque, so that its 16 row offsets are not hoisted above the chunk loop: they spilled)
  if constexpr (kT) asm volatile("" : "+r"(rs));
#pragma unroll
  for (int n = 0; n < 8; ++n)
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      if (8 * n + e >= left) continue;
      const float sc = scale ? scale[8 * n + 2 * q + e] : 1.f;
      float* r = o + (8 * n + e) * rs;
      r[0] = X[4 * n + e] * sc;
      r[8] = X[4 * n + 2 + e] * sc;
    }
}

// Consumer c (0, 1): G's rows i = 64 c .. 64 c + 63 in registers (m64n128 layout: rows ir (+8), columns 8 n + 2 q
// (+1)), dq^T's and dkt^T's rows i, dgate's M over the contraction's half s = 32 c ..
__device__ __forceinline__ void consumer(const Params& p, unsigned char* sm_in, int c_in, int64_t bh) {
  const int lt_in = threadIdx.x - 128;
  const int64_t b = bh / p.H, h = bh - b * p.H;
  float G[64];
  {  // the last chunk's raw k, v, dy rows (later chunks': issued during the chunk before, as each pair is read)
    const int cl = p.nck - 1;
    issue_raw(p, sm_in, kK, p.k, b, h, cl, lt_in);
    issue_raw(p, sm_in, kV, p.v, b, h, cl, lt_in);
    issue_raw(p, sm_in, kY, p.dy, b, h, cl, lt_in);
  }
  load_g(G, p.dfinal, bh, 64 * c_in + 16 * ((lt_in >> 5) & 3) + ((lt_in & 31) >> 2), lt_in & 3);  // (rows ir, ir + 8)
  if constexpr (kT) put_max(sm_in, sG, lt_in >> 5, max_abs(G));  // (G's tile: both consumers' rows, read after (0))
  sync_all();  // (0) the last chunk's tables and Lx
  for (int ch = p.nck - 1; ch >= 0; --ch) {
    // sm and the thread's index made opaque each chunk: the loop-invariant descriptors and offsets derived from them,
    // otherwise hoisted above the loop, were spilled (136 B; now recomputed a chunk)
    unsigned char* sm = sm_in;
    asm volatile("" : "+l"(sm));
    int lt = lt_in;
    asm volatile("" : "+r"(lt));
    int c = c_in;  // (split t: opaque too, so that the offsets derived from it are not hoisted: they spilled)
    if constexpr (kT) asm volatile("" : "+r"(c));
    const int wl = (lt >> 5) & 3, lane = lt & 31, g = lane >> 2, q = lane & 3;
    const int ir = 64 * c + 16 * wl + g, slot = 4 * c + wl;  // this thread's state rows ir, ir + 8
    const float* L = ltab(sm, ch);
    float* part = parts(sm, ch);
    // (split t) this chunk's tile exponents: q, k, v, dy at the top's split, MQ and MD at (1w), G's from the chunk
    // before's barrier (4) (or (0)); 0 in the b build, where every scale below folds to 1
    int eq = 0, ek = 0, ev = 0, ey = 0, emq = 0, emd = 0;
    {  // q's loads first; k, v, dy landed by cp.async during the chunk before (the last chunk's: before the loop)
      float4 vq[4][2];
      load_rows(p.q, p, b, h, ch, lt, vq);
      raw_wait<0>();
      consumers_sync();  // (1a) every thread's raw rows landed
      ek = split_in_place(sm, kK, lt, sK);
      ev = split_in_place(sm, kV, lt, sV);
      if constexpr (kT) put_max(sm, sQ, lt >> 5, max_abs(vq));  // (across dy's split's barrier)
      ey = split_in_place(sm, kY, lt, sY);
      if constexpr (kT) eq = tile_exp<8>(sm, sQ);
      write_pair(sm, kQ, lt, vq, exp2i(-eq));
    }
    fence_async_smem();
    consumers_sync();  // (1) the chunk's pairs
    {
      float X[16], Y[16];  // Dd's and QK's columns s = 32 c .. (B: v's and k's rows s; K-major, LBO the tile's 1024)
      ss_product<3, 0, 0, 8, true>(X, sm, kmaj(kY, kTile, 64), Op{kV + 512 * c, kV + 512 * c + kTile, 1024, 128, 2048});
      ss_product<3, 0, 0, 8, true>(Y, sm, kmaj(kQ, kTile, 64), Op{kK + 512 * c, kK + 512 * c + kTile, 1024, 128, 2048});
      wg_wait<1>();  // (Dd's; QK's still running)
      acc_fence(X);
      float ee = 0.f, elx = 0.f;  // (split t) E's and Lx's halves' 2^e, M's scales
      if constexpr (!kT) {
        float m0 = 0.f, m1 = 0.f;
        put_weights<true>(sm, X, L, c, wl, g, q, 1.f, 1.f, m0, m1);
        fence_async_smem();
        wg_wait<0>();
        acc_fence(Y);
#pragma unroll
        for (int x = 0; x < 16; ++x) {  // E[u][s] = beta_s QK[u][s] Dd[u][s], s < u
          const int u = 16 * wl + g + 8 * ((x >> 1) & 1), s = 32 * c + 8 * (x >> 2) + 2 * q + (x & 1);
          X[x] = s < u ? L[kBeta + s] * Y[x] * X[x] : 0.f;
        }
      } else {
        {
          const float d1 = exp2i(ey), d2 = exp2i(ev);
#pragma unroll
          for (int i = 0; i < 16; ++i) X[i] = X[i] * d1 * d2;  // Dd
        }
        float mmd = 0.f, mmq = 0.f;
        put_weights<false>(sm, X, L, c, wl, g, q, 1.f, 1.f, mmd, mmq);
        put_max(sm, sMD, lt >> 5, mmd);
        put_max(sm, sMQ, lt >> 5, mmq);
        wg_wait<0>();
        acc_fence(Y);
        {
          const float d1 = exp2i(eq), d2 = exp2i(ek);
#pragma unroll
          for (int i = 0; i < 16; ++i) Y[i] = Y[i] * d1 * d2;  // QK
        }
#pragma unroll
        for (int x = 0; x < 16; ++x) {  // E[u][s] = beta_s QK[u][s] Dd[u][s], s < u (into Y: X, Dd, is split below)
          const int u = 16 * wl + g + 8 * ((x >> 1) & 1), s = 32 * c + 8 * (x >> 2) + 2 * q + (x & 1);
          Y[x] = s < u ? L[kBeta + s] * Y[x] * X[x] : 0.f;
        }
        put_max(sm, sE, lt >> 5, max_abs(Y));
        consumers_sync();  // (1w) split t: MQ's and MD's maxima (both consumers' halves), E's (this consumer's)
        emq = tile_exp<8>(sm, sMQ);
        emd = tile_exp<8>(sm, sMD);
        const int e_e = tile_exp<4>(sm, sE, 4 * c);
        put_weights<true>(sm, X, L, c, wl, g, q, exp2i(-emd), exp2i(-emq), mmd, mmq);
        fence_async_smem();
#pragma unroll
        for (int i = 0; i < 16; ++i) X[i] = Y[i] * exp2i(-e_e);  // E times 2^-e_E, as it is split (exact)
        ee = exp2i(e_e);
        elx = exp2i(tile_exp<2>(sm, sLx, 2 * c));  // (WG0's slots: rewritten only after barrier 3's arrival below)
      }
      // dgate's term (d), consumer c's half of the contraction: M_c = E[:, s half] Lx[:, s half]^T (RS, 2 k-steps,
      // B = Lx's rows t, K-major), then sum_{u >= t} L[u][t] M_c[u][t] over this warp's rows u (WG0 adds the 8)
      float M[32];
      rs_split<2, 0>(M, sm, kmaj(kLx + 4096 * c, kW, 64), 1.f, [&](int kb, float (&sv)[8]) {
#pragma unroll
        for (int r = 0; r < 8; ++r) sv[r] = X[8 * kb + r];
      }, [](int, float (&)[8]) {});
      if (ch > 0) lx_free_arrive();  // (3) this consumer's reads of Lx are done: WG0 writes chunk ch - 1's
      if constexpr (kT) {
#pragma unroll
        for (int i = 0; i < 32; ++i) M[i] = M[i] * ee * elx;
      }
#pragma unroll
      for (int n = 0; n < 8; ++n)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int t = 8 * n + 2 * q + e, u = 16 * wl + g;
          float x = (u >= t ? L[lp(u, t)] * M[4 * n + e] : 0.f) +
                    (u + 8 >= t ? L[lp(u + 8, t)] * M[4 * n + 2 + e] : 0.f);
          x += __shfl_xor_sync(0xffffffffu, x, 4);
          x += __shfl_xor_sync(0xffffffffu, x, 8);
          x += __shfl_xor_sync(0xffffffffu, x, 16);
          if (g == 0) part[1672 + slot * 64 + t] = x;
        }
    }
    // R^T = S dY^T: S's rows ir, ir + 8 from the checkpoint (fp32, L2: WG0 prefetched them), split a k-step at a
    // time (split t: times 2^-e_S, the host's exponent of the whole checkpoint); c0's part (sum S o G) from the same
    // values, unscaled; B = dy K-major
    float c0 = 0.f;
    {
      float R[32];
      const float* S = p.ckpt + (bh * p.nck + ch) * 16384;
      int es = 0;
      if constexpr (kT) es = p.ckexp[bh * p.nck + ch];
      rs_split<8, 0>(R, sm, kmaj(kY, kTile, 64), exp2i(-es), [&](int kb, float (&sv)[8]) {
#pragma unroll
        for (int hh = 0; hh < 2; ++hh)
#pragma unroll
          for (int e = 0; e < 2; ++e) {  // sv[4 e + 2 hh ..] = S[ir + 8 hh][16 kb + 8 e + 2 q ..], G's place
            const float2 v = __ldg(reinterpret_cast<const float2*>(S + (ir + 8 * hh) * 128 + 16 * kb + 8 * e + 2 * q));
            sv[4 * e + 2 * hh] = v.x;
            sv[4 * e + 2 * hh + 1] = v.y;
          }
      }, [&](int kb, float (&sv)[8]) {
#pragma unroll
        for (int r = 0; r < 8; ++r) c0 = fmaf(sv[r], G[8 * kb + r], c0);
      });
      if constexpr (kT) {
        const float s1 = exp2i(es), s2 = exp2i(ey);
#pragma unroll
        for (int i = 0; i < 32; ++i) R[i] = R[i] * s1 * s2;
      }
      col_dots(sm, R, kQ, ir, part + slot * 64, g, q, exp2i(eq));  // f_u's part
      {  // diag(A) on columns t (one rounding, as Rt A), then K^T MQ^T's accumulation scale (one power at a time)
        const float d1 = exp2i(-ek), d2 = exp2i(-emq);
#pragma unroll
        for (int i = 0; i < 32; ++i) R[i] = R[i] * L[kA + 8 * (i >> 2) + 2 * q + (i & 1)] * d1 * d2;
      }
      consumers_sync();  // (2) MQ and MD whole (both consumers' halves)
      ss_product<3, 1, 0, 4, false>(R, sm, mnmaj(kK + 8192 * c, kTile, 64), kmaj(kMQ, kW, 64));  // += K^T MQ^T
      wg_wait<0>();
      acc_fence(R);
      if constexpr (kT) {
        const float s1 = exp2i(ek), s2 = exp2i(emq);
#pragma unroll
        for (int i = 0; i < 32; ++i) R[i] = R[i] * s1 * s2;
      }
      store_t(p.dq, p, b, h, ch, R, nullptr, ir, q);
    }
    {  // Rk^T = G V^T (A = G's registers split a k-step), e's part; dkt^T = Rk^T diag(w) + Q^T MD, dbeta's part
      float Rk[32];
      int eg = 0;
      if constexpr (kT) eg = tile_exp<8>(sm, sG);
      rs_split<8, 0>(Rk, sm, kmaj(kV, kTile, 64), exp2i(-eg), [&](int kb, float (&sv)[8]) {
#pragma unroll
        for (int r = 0; r < 8; ++r) sv[r] = G[8 * kb + r];
      }, [](int, float (&)[8]) {});
      if constexpr (kT) {
        const float s1 = exp2i(eg), s2 = exp2i(ev);
#pragma unroll
        for (int i = 0; i < 32; ++i) Rk[i] = Rk[i] * s1 * s2;
      }
      col_dots(sm, Rk, kK, ir, part + 512 + slot * 64, g, q, exp2i(ek));
      consumers_sync();  // (4a) both Rk^Ts have read v's pair: the next chunk's v rows land there
      if (ch > 0) issue_raw(p, sm, kV, p.v, b, h, ch - 1, lt);
      {  // diag(w) on columns s (one rounding, as Rk^T w), then Q^T MD's accumulation scale
        const float d1 = exp2i(-eq), d2 = exp2i(-emd);
#pragma unroll
        for (int i = 0; i < 32; ++i) Rk[i] = Rk[i] * L[kWt + 8 * (i >> 2) + 2 * q + (i & 1)] * d1 * d2;
      }
      ss_product<3, 1, 1, 4, false>(Rk, sm, mnmaj(kQ + 8192 * c, kTile, 64), mnmaj(kMD, kW, 64));  // += Q^T MD
      wg_wait<0>();
      acc_fence(Rk);
      if constexpr (kT) {
        const float s1 = exp2i(eq), s2 = exp2i(emd);
#pragma unroll
        for (int i = 0; i < 32; ++i) Rk[i] = Rk[i] * s1 * s2;
      }
      col_dots(sm, Rk, kK, ir, part + 1024 + slot * 64, g, q, exp2i(ek));
      store_t(p.dk, p, b, h, ch, Rk, L + kBeta, ir, q);  // dk = beta dkt
    }
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) c0 += __shfl_xor_sync(0xffffffffu, c0, o);
    if (lane == 0) part[1536 + slot] = c0;
    // (split t) dy A[t]'s maximum from dy's pair (stable since (1)), across (4b)
    if constexpr (kT) put_max(sm, sYA, lt >> 5, put_dya<false>(sm, L, lt, exp2i(ey), 1.f));
    consumers_sync();  // (4b) both consumers past Q^T MD and dbeta's row dots: MQ, MD and k's pair are free
    if (ch > 0) issue_raw(p, sm, kK, p.k, b, h, ch - 1, lt);
    int eya = 0;
    if constexpr (kT) eya = tile_exp<8>(sm, sYA);
    put_dya<true>(sm, L, lt, exp2i(ey), exp2i(-eya));
    fence_async_smem();
    consumers_sync();  // (4c) dy A[t]'s pair whole; dy's pair read: the next chunk's dy rows land there
    if (ch > 0) issue_raw(p, sm, kY, p.dy, b, h, ch - 1, lt);
    // G's update in two N = 64 halves, each from zero: U = Q^T diag(A) dY (A = q's pair, MN-major; B = dy A[t]'s
    // pair, MN-major), G = fmaf(A_63, G, U): wgmma's in-place accumulation truncates (perf-notes, thirtieth session);
    // split t: U times 2^e_q and 2^e_ya, one at a time (exact), inside the one rounding
    const float a63 = L[kA + 63];
    const float u1 = exp2i(eq), u2 = exp2i(eya);
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      float U[32];
      ss_product<3, 1, 1, 4, true>(U, sm, mnmaj(kQ + 8192 * c, kTile, 64), mnmaj(kMQ + 8192 * half, kTile, 64));
      wg_wait<0>();
      acc_fence(U);
#pragma unroll
      for (int i = 0; i < 32; ++i) G[32 * half + i] = fmaf(a63, G[32 * half + i], U[i] * u1 * u2);
    }
    if constexpr (kT) put_max(sm, sG, lt >> 5, max_abs(G));  // (the next chunk's Rk^T reads it after (4))
    sync_all();  // (4) the chunk is done: its pairs and weights read, its partials written; WG0's next tables, Lx
  }
}

// WG0: the tables and Lx a chunk ahead, the L2 prefetch of the next chunk, dgate and dbeta a chunk behind (from the
// double-buffered partials); the block barriers (0) and (4).
__device__ __forceinline__ void aux(const Params& p, unsigned char* sm, int64_t bh) {
  const int64_t b = bh / p.H, h = bh - b * p.H;
  build_tables(p, sm, b, h, p.nck - 1);
  wg0_sync();  // (L by warps 0, 1: build_tables' other threads left early)
  build_lx(sm, p.nck - 1);
  sync_all();  // (0)
  for (int ch = p.nck - 1; ch >= 0; --ch) {
    if (ch + 1 < p.nck) {  // the chunk after's, from its buffers, which the next tables overwrite
      dgate_dbeta(p, sm, b, h, ch + 1);
      wg0_sync();
    }
    if (ch > 0) {
      prefetch_chunk(p, bh, b, h, ch - 1);
      build_tables(p, sm, b, h, ch - 1);
      wg0_sync();
      lx_free_wait();  // (3) both consumers' M products have read Lx
      build_lx(sm, ch - 1);
    }
    sync_all();  // (4)
  }
  dgate_dbeta(p, sm, b, h, 0);
}

// The kernel (its roles and setmaxnreg split), launch_kernel and func_attrs: bwd_fp32_common's, spliced here.
KERNEL_ENTRY

int pa_run(const float* q, const float* k, const float* v, const float* dy, const float* gate, const float* beta,
           const float* ckpt, const int* ckexp, const float* dfinal, float* dq, float* dk, float* dgate, float* dbeta,
           int B, int T, int H, cudaStream_t s) {
  return launch_kernel(Params{q, k, v, dy, gate, beta, ckpt, dfinal, ckexp, dq, dk, dgate, dbeta, T, H, (T + 63) / 64},
                       B * H, s);
}
int pa_attrs(int* res) { return func_attrs((const void*)passa_kernel, res); }
int pa_smem() { return kSmem; }
bool pa_split_t() { return kT; }
}  // namespace pa
"""

# The host text after bwd_fp32_common's HOST_PREAMBLE (check, f32, kernel_attrs).
HOST_SRC = r"""
namespace pa {
int pa_run(const float* q, const float* k, const float* v, const float* dy, const float* gate, const float* beta,
           const float* ckpt, const int* ckexp, const float* dfinal, float* dq, float* dk, float* dgate, float* dbeta,
           int B, int T, int H, cudaStream_t s);
int pa_attrs(int* res);
int pa_smem();
bool pa_split_t();
}
// q, k, v, dy, dq, dk (B, T, H, 128); gate, beta, dgate, dbeta (B, T, H); ckpt (B H, nck, 128, 128): S at each
// 64-step chunk start; ckexp (B H, nck) int32: each checkpoint's tile exponent (split t's S scale: ckpt_exponents;
// the b build does not read it, and may take it empty); dfinal (B, H, 128, 128) or empty (zero).
void passa(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& dy, const at::Tensor& gate,
           const at::Tensor& beta, const at::Tensor& ckpt, const at::Tensor& ckexp, const at::Tensor& dfinal,
           const at::Tensor& dq, const at::Tensor& dk, const at::Tensor& dgate, const at::Tensor& dbeta) {
  TORCH_CHECK(q.dim() == 4 && q.size(3) == 128 && k.sizes() == q.sizes() && v.sizes() == q.sizes() &&
              dy.sizes() == q.sizes() && dq.sizes() == q.sizes() && dk.sizes() == q.sizes(),
              "q, k, v, dy, dq, dk (B, T, H, 128)");
  const int B = (int)q.size(0), T = (int)q.size(1), H = (int)q.size(2), nck = (T + 63) / 64;
  TORCH_CHECK(T > 0, "T > 0");
  TORCH_CHECK(gate.numel() == (int64_t)B * T * H && beta.numel() == gate.numel() && dgate.numel() == gate.numel() &&
              dbeta.numel() == gate.numel(), "gate, beta, dgate, dbeta (B, T, H)");
  TORCH_CHECK(ckpt.numel() == (int64_t)B * H * nck * 16384, "ckpt (B H, ceil(T / 64), 128, 128)");
  TORCH_CHECK(dfinal.numel() == 0 || dfinal.numel() == (int64_t)B * H * 16384, "dfinal (B, H, 128, 128)");
  TORCH_CHECK((ckexp.numel() == 0 && !pa::pa_split_t()) ||
              (ckexp.numel() == (int64_t)B * H * nck && ckexp.scalar_type() == at::kInt && ckexp.is_cuda() &&
               ckexp.is_contiguous()), "ckexp (B H, nck) int32 (empty only in the b build)");
  check(pa::pa_run(f32(q), f32(k), f32(v), f32(dy), f32(gate), f32(beta), f32(ckpt),
                   ckexp.numel() ? ckexp.data_ptr<int>() : nullptr, dfinal.numel() ? f32(dfinal) : nullptr,
                   const_cast<float*>(f32(dq)), const_cast<float*>(f32(dk)), const_cast<float*>(f32(dgate)),
                   const_cast<float*>(f32(dbeta)), B, T, H,
                   c10::cuda::getCurrentCUDAStream()), "pass A launch");
}
std::vector<int64_t> passa_attrs() {  // (kernel_attrs', then the dynamic shared memory)
  std::vector<int64_t> r = kernel_attrs(pa::pa_attrs, "pass A attributes");
  r.push_back(pa::pa_smem());
  return r;
}
"""
def pass_a_model_steps(q, k, v, gate, beta, dy, ckpt, dsT, emulate, split):
    """pass_a_model's float32 emulation in split k or r (bwd_fp32_common.StepScaled: scales along the steps). q, k, v,
    dy stored once each with an exponent a group of steps; S (the checkpoint) and G one a tile (t's). Products that do
    not sum over the steps (Dd, QK, R^T, Rk^T) take their operands' exponents as outer factors; those that do (dq^T =
    K^T MQ^T, dk^T = Q^T MD, M_c = E_c Lx_c^T, U = Q^T diag(A) dY) read the shared tile (k, q, q) or the table (Lx,
    its columns' exponents: WG0's) as their natural side, the product's own operand (MQ's columns, MD's rows, E_c's
    columns, dy A[t]'s rows) compensated. The row dots read q and k at their rows' exponents."""
    emu.RZ = emulate == "rz"
    try:
        ss = common.StepScaled(common.STEP_GROUP[split])
        f = torch.float32
        st = model_state(q, k, v, gate, beta, dy, ckpt, dsT, f)
        B, T, H, D, nck, G, dq, dk, dgate, dbeta, low, strict, zero = (st[n] for n in STATE)
        for ch in range(nck - 1, -1, -1):
            sl, Q, K, V, dY, g, bt, S, L, A, Ah, w, Lx = chunk_inputs(st, ch)
            qp, kp, vp, yp = ss.nat(Q), ss.nat(K), ss.nat(V), ss.nat(dY)
            sp, gp = ss.nat(S, tile=True), ss.nat(G, tile=True)
            Dd = ss.outer(yp, ss.T(vp))
            QK = ss.outer(qp, ss.T(kp))
            MQ = torch.where(low, Dd * L * bt[..., None, :], zero)
            MD = torch.where(low, Dd * L, zero)
            E = torch.where(strict, bt[..., None, :] * QK * Dd, zero)
            Rt = ss.outer(sp, ss.T(yp))
            c0 = (S * G).sum((-1, -2))
            f_ = (ss.value(qp) * Rt.transpose(-1, -2)).sum(-1)
            # dq^T = R^T diag(A) + K^T MQ^T: A = k (natural, rows s), B = MQ^T compensated along s (MQ's columns)
            dqt = ss.contract(MQ.transpose(-1, -2), ss.T(kp), comp_is_a=False, acc=Rt * A[..., None, :])
            dq[:, :, sl] = dqt.transpose(-1, -2)
            Rkt = ss.outer(gp, ss.T(vp))
            kv = ss.value(kp)
            e = (kv * Rkt.transpose(-1, -2)).sum(-1)
            # dk^T = Rk^T diag(w) + Q^T MD: A = q (natural, rows u), B = MD compensated along u (its rows)
            dkt = ss.contract(MD, ss.T(qp), comp_is_a=False, acc=Rkt * w[..., None, :])
            dk[:, :, sl] = (bt[..., None, :] * dkt).transpose(-1, -2)
            dbeta[:, :, sl] = (kv * dkt.transpose(-1, -2)).sum(-1)
            # M_c = E_c Lx_c^T over consumer c's columns s: Lx natural (WG0's pair, its columns' exponents), E_c
            # compensated (registers)
            td = 0
            for c in (0, 1):
                lxp = ss.nat(Lx[..., 32 * c:32 * c + 32].transpose(-1, -2).contiguous())  # rows s
                Mc = ss.contract(E[..., 32 * c:32 * c + 32], lxp, comp_is_a=True)
                td = td + (L * Mc).sum(-2)
            dgate[:, :, sl] = (td + w * (Ah * c0[..., None] + (Lx @ (bt * e)[..., None])[..., 0])
                               + Ah * (L.transpose(-1, -2) @ f_[..., None])[..., 0])
            # U = Q^T diag(A) dY: A = q (natural, rows t), B = dy A[t] from dy's pair, compensated along t
            U = ss.contract(ss.value(yp) * A[..., :, None], ss.T(qp), comp_is_a=False)
            G = (A[..., 63, None, None].double() * G.double() + U.double()).float()
        return (dq[:, :, :T].transpose(1, 2), dk[:, :, :T].transpose(1, 2), dgate[:, :, :T].transpose(1, 2),
                dbeta[:, :, :T].transpose(1, 2))
    finally:
        emu.RZ = False


FUNCTIONS = ["passa", "passa_attrs"]


def build_module(split="b"):
    splices = (("PASSB_TABLES", passb_src("__device__ __forceinline__ float* ltab", "// WG0: chunk ch's q, k")),
               ("PASSB_PUT_PAIR", passb_src("// 8 fp32 values to a pair's hi and lo",
                                            "// Split t's tile scales")))
    return common.build_module("bwd_fp32_passA", "pa", "passa_kernel", CUDA_SRC, HOST_SRC, FUNCTIONS, splices, split)


def ckpt_exponents(ckpt):
    """Split t's exponent of each checkpoint S (B H, nck, 128, 128) float32 as one tile: (B H, nck) int32, e =
    ceil(log2 max |S|) - 15 (0 for a zero S; at least -126), the kernels' tile_exp and fp32_split_emulation's
    pow2_scale over the whole matrix (what the forward that writes the checkpoints will store beside them)."""
    m = ckpt.abs().amax((-1, -2))
    fr, ex = torch.frexp(m)  # m = fr 2^ex, fr in [0.5, 1): ceil(log2 m) = ex, or ex - 1 at fr = 0.5
    e = (torch.where(fr == 0.5, ex - 1, ex) - 15).clamp(min=-126)
    return torch.where(m > 0, e, torch.zeros_like(e)).to(torch.int32).contiguous()


NAMES = ("dq", "dk", "dgate", "dbeta")


def reference(q, k, v, gate, beta, dy, dsT):
    """(dq, dk, dgate, dbeta) by naive.chunked_backward_naive (float64, chunks of 32: other edges than the kernel's)."""
    out = naive.chunked_backward_naive(q, k, v, gate, beta, dy, d_final_state=dsT)
    return out[0], out[1], out[3], out[4]


def cpu_row(row):
    return (f"{str(row['shape']) + ' ' + row['gate']:34s} {'yes' if row['dsT'] else 'no':4s} "
            + " ".join(f"{row[f'model_{x}']:.1e}" for x in NAMES) + "    "
            + " ".join(f"{row[f'emu_rn_{x}']:.1e}" for x in NAMES) + " | "
            + " ".join(f"{row[f'emu_rz_{x}']:.1e}" for x in NAMES))


def emulated_worst(rows, label):
    worst = {x: max(max(r[f"emu_rn_{x}"], r[f"emu_rz_{x}"]) for r in rows) for x in NAMES}
    return worst, (f"{label} emulation against naive, worst rel-L2 per gradient (the device's expected error; bar "
                   "1e-5): " + ", ".join(f"{x} {worst[x]:.2e}" for x in NAMES))


def models(q, k, v, gate, beta, dy, dsT):
    """A case's chunk model as model(emulate, split), from the float64 checkpoints (float64) or those rounded once to
    float32 (emulated: the device's checkpoints)."""
    ck = checkpoints(k, v, gate, beta)
    ck32 = ck.float()
    return lambda emulate, split: pass_a_model(q, k, v, gate, beta, dy, ck if emulate is None else ck32, dsT,
                                               emulate=emulate, split=split)


def cpu_check(split):
    label = common.SPLITS[split][1]
    header = f"{'case':34s} {'dS_T':4s} model dq / dk / dgate / dbeta          {label} emulated, RN | RZ (worst of 4)"
    common.cpu_check(NAMES, header, reference, models, cpu_row, emulated_worst, split)


def run_kernel(mod, q, k, v, gate, beta, dy, ckpt, dsT=None):
    """(dq, dk, dgate, dbeta) by the kernel; every output NaN-poisoned first (an element it misses stays NaN)."""
    dq, dk = torch.full_like(q, float("nan")), torch.full_like(q, float("nan"))
    dgate, dbeta = torch.full_like(gate, float("nan")), torch.full_like(gate, float("nan"))
    mod.passa(q, k, v, dy, gate, beta, ckpt, ckpt_exponents(ckpt), dsT if dsT is not None else q.new_empty(0), dq, dk,
              dgate, dbeta)
    return dq, dk, dgate, dbeta


def measure(mod, q, k, v, gate, beta, dy, dsT, split="b"):
    """One case of --check: the kernel's row ({finite, dq, dk, dgate, dbeta}) and a thunk of the RZ emulation's
    errors."""
    ref = reference(q, k, v, gate, beta, dy, dsT)
    dev = [x.cuda().contiguous() for x in (q, k, v, gate, beta, dy)]
    ck = checkpoints(*[dev[i] for i in (1, 2, 3, 4)])  # float64 on the GPU, then rounded once
    B, T, H, _ = q.shape
    ck32 = ck.float().reshape(B * H, -1, 128, 128).contiguous()
    out = [x.cpu() for x in run_kernel(mod, *dev, ck32, dsT.cuda() if dsT is not None else None)]
    torch.cuda.synchronize()
    row = {"finite": all(bool(x.isfinite().all()) for x in out)}
    row.update({x: rel(o, r) for x, o, r in zip(NAMES, out, ref)})

    def emulated():  # (the same checkpoints, rounded once on the host)
        em = pass_a_model(q, k, v, gate, beta, dy, ck.cpu().float(), dsT, emulate="rz", split=split)
        return [rel(m, r) for m, r in zip(em, ref)]
    return row, emulated


def device_check(mod, split="b"):
    common.device_check(mod, NAMES, NAMES, measure, lambda row: " ".join(f"{row[f'emu_rz_{x}']:.1e}" for x in NAMES),
                        split)


def bench(mod, trials):
    B, T, H = 16, 4096, 32
    gen = torch.Generator(device="cuda").manual_seed(5)
    q, k, v, dy = (torch.randn(B, T, H, 128, device="cuda", generator=gen) for _ in range(4))
    gate = 0.98 + 0.02 * torch.rand(B, T, H, device="cuda", generator=gen)
    beta = torch.sigmoid(torch.randn(B, T, H, device="cuda", generator=gen))
    nck = math.ceil(T / 64)
    ckpt = torch.randn(B * H, nck, 128, 128, device="cuda", generator=gen)  # (timing only: any finite states)
    dsT = torch.randn(B, H, 128, 128, device="cuda", generator=gen)
    dq, dk = torch.empty_like(q), torch.empty_like(q)
    dgate, dbeta = torch.empty_like(gate), torch.empty_like(gate)
    ckexp = ckpt_exponents(ckpt)
    st = kernelbench_time(mod.passa, (q, k, v, dy, gate, beta, ckpt, ckexp, dsT, dq, dk, dgate, dbeta), trials=trials,
                          warmup=3, flush=True)
    finite = all(bool(x.isfinite().all()) for x in (dq, dk, dgate, dbeta))
    common.bench_report(st, (B, T, H), mod.passa_attrs, trials, finite)
    common.RESULT["bench"]["finite"] = finite  # (pass A's record has it too)


if __name__ == "__main__":
    common.main(__doc__, "bwd_fp32_passA.json", "device: dq, dk, dgate, dbeta against float64 naive", cpu_check,
                build_module, device_check, bench,
                before_launch=common.split_registers_guard("passa_attrs", "passa_kernel"), splits=("b", "t"))
