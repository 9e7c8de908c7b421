"""Gated outer-product linear recurrence on CUDA, one file (KernelBench drop-in: ModelNew).

Math, per batch b and head h, S_0 = 0 (a D_k x D_v state kept in fp32):

    S_t = gate_t * S_{t-1} + beta_t * k_t v_t^T
    y_t = S_t^T q_t            (y_t[j] = sum_i q_t[i] S_t[i, j])

q, k: (B, T, H, D_k); v, y: (B, T, H, D_v); gate, beta: (B, T, H); any strides; float32, float16 or
bfloat16 (q, k, v one dtype; gate and beta q's dtype or float32); 1 <= D_k, D_v <= 256. Arithmetic is fp32
(numerics below); y has q's dtype.
GPUs: compute capability 7.5 and newer (below 8.0 the plan uses only recurrent and parallel).

Kernels. make_plan() (HOST_SRC, section "plan") picks one per call and fills one Plan record with
everything the launch depends on; plan(B, T, H, D_k, D_v, dtype) prints that record.

    kernel        source / unit        serves                       how
    parallel      PARALLEL_SRC         T < 256 where the GPU is     no carried state: one block per (b, h, row tile of
                  unit core            not full (B*H*T <= 8192,     8 steps, column tile); each stages q, k, v, gate,
                  (built at import)    B*H*T^2 <= 2^20, T >= 32 or  beta up to its last row in one cp.async round trip
                                       D_k >= 96) or heads as wide  and computes y = (masked, decayed q k^T) v + A (q S_0)
                                       as T is long, where it fits  in fp32 FMAs; all tiles of a head at once.
                                       shared memory                Compiled tiles (D_k = D_v in GR_PARALLEL_TILES,
                                                                    aligned rows) stage as float; on sm_90 a
                                                                    programmatic dependent launch.
    recurrent     RECURRENT_SRC        the rest of T < 256          one block per (b, h, column block); each state
                  unit core                                         column is owned by G lanes of one warp (R rows a
                                                                    lane, S in registers); TC steps staged per barrier.
    recurrent     RECURRENT_SRC +      numerics="reference" (every  the same kernel rounding like reference.py's loop
    (reference)   REFERENCE_SRC        shape; ModelNew's default    in the input dtype, one row a lane, the D_k sums
                  unit reference       for float16 / bfloat16)      of 32 steps reduce-scattered at once.
    chunk_tf32    CHUNK_TF32_SRC       float16, and float32 where   chunkwise-parallel form (CHUNK_SRC has the math),
                  unit chunk_tf32      chunk_sm90 does not serve,   chunks of 32 steps: masked (q k^T) v + (decayed q) S,
                  (built on first use) with T >= 256, or D_k >= 96  then one state update, on TF32 mma.sync; fp32 inputs
                                       and B*H*T >= 8192            use 3xTF32 (hi/lo split: fp32-level error).
    chunk_bf16    CHUNK_BF16_SRC       bfloat16, as chunk_tf32      the same schedule on bf16 mma.sync m16n8k16; the
                  unit chunk_bf16                                   fp32 operands (masked product, state, scaled keys)
                  (built on first use)                              split into bf16 hi + lo terms.
    chunk_sm90    CHUNK_SM90_SRC +     chunks on compute capability chunks of 64 on Hopper wgmma, warp-specialised:
                  WGMMA_SRC + SM90_SRC 9.0 with B*H*T >= 8192,      an aux warpgroup loads q, k, v by TMA and forms
                  unit chunk_sm90      aligned rows and a nonzero   the gate tables and the masked product a chunk
                  (first use; sm_90a   t stride: bfloat16 with D_k  ahead; two consumer warpgroups keep the state in
                  code only)           64 or 128 and D_v 128 (the   their accumulators for a whole segment; y by TMA
                                       rest: chunk_bf16)            stores. bfloat16: fp32 operands as bf16 hi + lo.
                                                                    Eager autograd, D_k 128, one segment: it also
                                                                    writes chunk_bwd_sm90's checkpoints.
                  CHUNK_SM90_TF32_SRC  float32 with D_k = D_v = 128 float32: TF32 wgmma, every product 3xTF32, the
                                       and no cu_seqlens (the rest: k transpose and q split by the aux warpgroup.
                                       chunk_tf32)
    segment_scan  SEGMENT_SCAN_SRC     chunk plans with segments>1  sequence parallelism when B*H blocks cannot fill
                  in every chunk unit  (B*H too small for the GPU)  the GPU: the chunk kernel computes each segment's
                                                                    own state, this kernel chains them, then every
                                                                    segment's outputs run at once.
    decode        DECODE_SRC           gated_recurrence_decode_:    serving's step, in place: one block per (row, head,
                  unit decode          T (small) steps of a batch   32 or 128 state columns) reads the row's state from
                  (built on first use) from a pool of states; few   a pool slot (indices read on the device), advances
                                       rows, or a pool without      T steps in registers with the recurrent kernel's
                                       16-byte rows                 update, writes y and the state back. Unit-stride
                                                                    rows, D_k = 32, 64, 128 or 256 and whole 32-column
                                                                    tiles take the "rows=full" instantiation (no
                                                                    bounds, no stride products: few rows are latency).
    decode_persistent                  the decode step for many     the same step, bitwise, for memory's speed: one
                  DECODE_SRC,          rows (B*H >= 2 x SMs), D_k   block an SM walks the (row, head) items; the next
                  unit decode          <= 128, 16-byte pool rows    item's state streams into a shared-memory ring by
                                                                    cp.async while the current one is computed.
    chunk_bwd     BACKWARD_SRC         autograd's backward where    the chunked backward (docs/training-design.md 1.2,
                  unit backward        D_k, D_v <= 128 and 216 KB   1.3) on 3xTF32 mma.sync: one block per (b, h,
                  (built on first use) of shared memory fit         segment), chunks of 32; a forward phase saves the
                                       (Hopper and newer)           state at every chunk start, then the chunks
                                                                    run backwards with the state and its gradient in
                                                                    shared memory; dq, dk, dv, dgate (the "hole"
                                                                    products, no quotient), dbeta, dS_0.
                  chunk_bwd_prep,      chunk_bwd with segments > 1  sequence parallelism: each segment's own state and
                  chunk_bwd_scan       (B*H too small for the GPU)  gradient contributions from zero, then chained in
                                                                    segment order, so every segment starts at once.
    chunk_bwd_sm90 BACKWARD_SM90_SRC   the backward on compute      the chunked backward on Hopper wgmma (training-
                  unit backward_sm90   capability 9.0 for bfloat16  design.md 7), chunks of 64 backwards: one block of
                  (first use; sm_90a   with D_k = D_v = 128,        three warpgroups a (b, h) in lockstep; WG0 the gate
                  code only)           aligned rows and B*H at      tables and dgate, dbeta; two consumers keep the
                                       least half the SMs (fewer:   state's gradient in their accumulators; fp32
                                       chunk_bwd's segments)        operands as bf16 hi + lo; a chunk holding inf or
                                                                    NaN forms its masked sums by FMAs.
                  chunk_bwd_sm90_ckpt  chunk_bwd_sm90 calls whose   the state at every 64-step chunk start into the
                                       forward wrote no checkpoints workspace (wgmma state updates, k and v double-
                                       (forward_checkpoints), first buffered).
    chunk_bwd_sm90_fp32                the backward on compute      the float32 chunked backward on Hopper wgmma
                  BACKWARD_SM90_FP32_  capability 9.0 for float32   (training-design.md 8), chunks of 64 backwards,
                  SRC, unit backward_  with D_k = D_v = 128,        one block of three warpgroups a (b, h) as
                  sm90_fp32 (first     aligned rows, offsets below  chunk_bwd_sm90's: dq, dk, dgate, dbeta from the
                  use; sm_90a code)    2^31 and B*H at least half   forward's checkpoints (S and 8 maxima of |S| a
                                       the SMs, from the forward's  chunk); every product on fp16 wgmma, the fp32
                                       float32 checkpoints          operands as fp16 hi + lo after a power-of-two
                                                                    scale a tile (bf16 hi + lo misses float32's
                                                                    accuracy). Inf or NaN is flagged, not handled:
                                                                    the plan's chunk_bwd then recomputes every
                                                                    gradient (it exits at once without the flag).
                  chunk_bwd_sm90_fp32_dv  (its second launch)       dv and dS_0, the same design with a scale a step
                                                                    (a loss on few steps keeps their precision).
    recurrent_bwd BACKWARD_SRC         the rest of the backward     the reverse loop of the state's gradient, element by
                  unit backward        (dq: a forward plan with     element: one block per (b, h) walks the D_v tiles of
                                       (dy, v, k) and S_0^T, any    32 columns in order; the states come back from
                                       kernel above)                checkpoints every 64 steps, recomputed every TC
                                                                    steps, then per step into shared memory. Sums over
                                                                    columns add tile by tile (no atomics: deterministic).

The two mma.sync chunk kernels run one skeleton (CHUNK_SRC, run_chunks): block setup, segment bounds, the
barrier schedule and the state update; each family supplies its staging and matrix products. chunk_sm90
has its own schedule (the state lives in registers) on the same segments (execute_chunks). Decays are direct
products of gates (never logs or quotients), so gates of 0, < 0 and > 1 are exact everywhere.
D_k padded to 64 or 128 with 16-byte aligned rows runs a chunk instantiation with D_k compiled in.
Packed variable-length sequences (cu_seqlens) run on recurrent and every chunk kernel (with segments too;
the chunk kernels as VARLEN instantiations): a block reads its sequence's bounds on the device (seq_range)
and walks only its steps; the grid holds a capacity of segments a sequence, each sequence takes what it
needs; chunk_sm90 zeroes the rows of the next sequence in a ragged last tile and stores that tile's y by
rows. parallel takes no cu_seqlens (its shared memory is sized by T).

API:
    y = gated_recurrence(q, k, v, gate, beta)                                   # accurate numerics
    y, S_T = gated_recurrence(q, k, v, gate, beta, initial_state=S_0, output_final_state=True)
        S_0, S_T: (B, H, D_k, D_v) float32 (S_0 optional, any strides; S_T a new tensor)
    y = gated_recurrence(q, k, v, gate, beta, numerics="reference")              # the loop's own rounding
    y = ModelNew()(q, k, v, gate, beta)   # KernelBench: Model's numerics (float16/bfloat16: "reference")
    y = gated_recurrence_decode_(q, k, v, gate, beta, state_pool, state_indices)   # decode, pool in place
        state_pool: (P, H, D_k, D_v) float32; state_indices: (B,) int32/int64 (-1: padded row) or None (P = B)
    y, S = gated_recurrence(q, k, v, gate, beta, cu_seqlens=cu, max_seqlen=m, output_final_state=True)
        packed: q (1, T_total, H, D_k), cu (N + 1,) int32/int64 on q's device; S_0, S: (N, H, D_k, D_v);
        hints max_seqlen / cu_seqlens_cpu: no synchronization (without: cu is read back once)
    plan(B, T, H, D_k, D_v, dtype="float32", numerics="accurate", varlen=False)   # a call's launch, as text
    plan_decode(B, T, H, D_k, D_v, dtype="float32")               # the decode step's launch, as text
    plan_backward(B, T, H, D_k, D_v, dtype="float32")             # the backward's launches, as text
    loss.backward()   # gated_recurrence and ModelNew are differentiable in q, k, v, gate, beta, initial_state
        (gradients in each input's dtype, fp32 arithmetic, gates in linear space: exact at 0, < 0, > 1)
    torch.compile(ModelNew(), fullgraph=True)   # traced through torch.ops.<_OPS_NS>.forward / forward_ex
    build()  /  build("chunk_bf16")             # compile units ahead of their first use (servers, benchmarks)
    built_units()                               # the units loaded in this process
Numerics: "accurate" (the functional default) computes in fp32 and rounds y once to the input dtype
(fp32 rel-L2 ~1e-7 against float64; float16/bfloat16: the exact answer's own rounding). "reference"
rounds every operation to the input dtype as reference.py's Model does in that dtype (its error
against float64 is Model's own: float16 ~5e-4, bfloat16 ~4e-3), which KernelBench's low-precision runs
compare against; forward only, sequential, on the recurrent kernel.
Autograd: with grad mode on and an argument that requires grad, gated_recurrence runs through the
registered operators, whose backward saves only the inputs and recomputes the states (numerics
"reference" included: its gradient is the exact recurrence's); eager calls whose plans are chunk_sm90 (one
segment) and chunk_bwd_sm90 or chunk_bwd_sm90_fp32 also save the state at every 64-step chunk start, written by
the forward (bfloat16 q: rows of D_k*D_v + 16 float16 values, S scaled by a power of two a 16-column block and
the 8 inverse scales as floats, or D_k*D_v floats beside a float32 gate; float32 q: rows of D_k*D_v + 8 floats;
B*H*ceil(T/64) rows, held until the backward), which spares the backward's checkpoint launch
(solution.FORWARD_CHECKPOINTS = False: not held). cu_seqlens calls and the decode step
are forward only: an input that requires grad there raises NotImplementedError naming it.
Errors: a bad argument raises ValueError or TypeError naming it (checked in C++ before any launch);
a failed launch raises RuntimeError naming the launch. Timings live in BENCHMARKS.md.
"""
import ctypes
import hashlib
import importlib.util
import inspect
import os
import re
import shutil
import subprocess
import sys

import torch


def _find_cuda_home(environ=os.environ, default="/usr/local/cuda"):
    """The CUDA toolkit to build with: the first of CUDA_HOME, CUDA_PATH, the folder above the real nvcc
    on PATH, and `default` that holds bin/nvcc and include/cuda_runtime_api.h; None if none does. torch
    guesses on its own when torch.utils.cpp_extension is first imported, from an nvcc wrapper script
    on PATH too (then /usr/local, without headers: the build fails a minute later)."""
    nvcc = shutil.which("nvcc", path=environ.get("PATH", os.defpath))
    for home in (environ.get("CUDA_HOME"), environ.get("CUDA_PATH"),
                 os.path.dirname(os.path.dirname(os.path.realpath(nvcc))) if nvcc else None, default):
        if home and os.path.isfile(os.path.join(home, "bin", "nvcc")) and \
                os.path.isfile(os.path.join(home, "include", "cuda_runtime_api.h")):
            return home
    return None


# Set before torch.utils.cpp_extension reads it (and in it, if something imported it first).
_CUDA_HOME = _find_cuda_home()
if _CUDA_HOME:
    os.environ["CUDA_HOME"] = _CUDA_HOME
    if "torch.utils.cpp_extension" in sys.modules:
        sys.modules["torch.utils.cpp_extension"].CUDA_HOME = _CUDA_HOME
from torch.utils.cpp_extension import load_inline  # noqa: E402

__all__ = ["ModelNew", "gated_recurrence", "gated_recurrence_decode_", "plan", "plan_decode", "plan_backward", "build",
           "built_units", "KERNELS", "UNITS"]

# Every kernel a plan can name (tests check it against the __global__ kernels and plan()).
KERNELS = ("recurrent", "parallel", "chunk_tf32", "chunk_bf16", "chunk_sm90", "segment_scan", "decode",
           "decode_persistent", "recurrent_bwd", "chunk_bwd", "chunk_bwd_prep", "chunk_bwd_scan", "chunk_bwd_sm90",
           "chunk_bwd_sm90_ckpt", "chunk_bwd_sm90_fp32", "chunk_bwd_sm90_fp32_dv")
# Build units: core (host code, recurrent, parallel) at import; each chunk family and the reference rounding on first use.
UNITS = ("core", "chunk_tf32", "chunk_bf16", "reference", "chunk_sm90", "decode", "backward", "backward_sm90",
         "backward_sm90_fp32")

# ---------------------------------------------------------------------------------------------
# CUDA and C++ sources, one constant per kernel family. A unit is PRELUDE + DEVICE + its families
# (+ HOST for core); each chunk unit exports one C entry point that the core calls through a pointer.
# ---------------------------------------------------------------------------------------------
PRELUDE_SRC = r"""
// ===================================== prelude: what every unit and the host share ==========
#include <cuda_runtime_api.h>
#include <cstddef>
#include <cstdint>

namespace gr {
// Enumerators, not variables: no symbol, and no unused-variable warning in a unit that skips one.
enum : int {
  kMaxThreads = 256,             // every kernel's block
  kChunk = 32,                   // steps per chunk of the chunk kernels
  kGateTableFloats = 21 * kChunk,  // one chunk's gate tables (CHUNK_SRC, write_gate_tables)
  kParallelRows = 8,              // steps a row tile of the parallel kernel (even)
  kRingD = 128,                   // decode_persistent: a ring buffer holds a 128 x 128 fp32 state tile
  kDecodeRingSmem = 2 * kRingD * kRingD * 4,           // its two buffers (dynamic shared memory)
  kDecodeStaticSmem = 2 * (kMaxThreads / 32) * kRingD * 4  // its y partials (static)
};
enum class DType : int { f32 = 0, f16 = 1, bf16 = 2 };
enum class Kernel : int { recurrent = 0, parallel = 1, chunk_tf32 = 2, chunk_bf16 = 3, chunk_sm90 = 4, decode = 5,
                          decode_persistent = 6, recurrent_bwd = 7, chunk_bwd = 8, chunk_bwd_sm90 = 9,
                          chunk_bwd_sm90_fp32 = 10 };
enum class Unit : int { core = 0, chunk_tf32 = 1, chunk_bf16 = 2, reference = 3, chunk_sm90 = 4, decode = 5,
                        backward = 6, backward_sm90 = 7, backward_sm90_fp32 = 8 };  // a launch's build unit

struct Strides4 { int64_t b, t, h, d; };
struct Strides3 { int64_t b, t, h; };
struct StateStrides { int64_t b, h, i, j; };  // a (B, H, D_k, D_v) fp32 state

// The call's tensors: what every kernel reads, whatever the plan.
struct Problem {
  const void* q; const void* k; const void* v; const void* gate; const void* beta; void* y;
  Strides4 sq, sk, sv, sy;
  Strides3 sg, sb;
  int T, H, Dk, Dv;
  int64_t BH;
  const float* s_in; StateStrides ssi;  // initial state, or nullptr for zero
  float* s_out; StateStrides sso;       // final state, or nullptr
  bool g32, b32;  // gate / beta are float32 (beside 16-bit q, k, v; with float32 inputs it folds away)
  // decode: s_in == s_out is the pool of P states (ssi), row b's slot idx[b * idx_stride] (or b without idx)
  const void* idx = nullptr; int64_t idx_stride = 0; int64_t P = 0; bool idx64 = false;
  // varlen: one packed row of T tokens (the .b strides zero), b indexes sequences [cu[b], cu[b + 1])
  const void* cu = nullptr; int64_t cu_stride = 0; bool cu64 = false;
  // chunk_bwd_sm90's checkpoints ((B H, chunks of 64, 128, 128) [dk][dv]: S at each chunk start; kCk16 rows (fp16,
  // scaled) where fwd_ck16, else fp32) where the forward writes them (forward_checkpoints): chunk_sm90 writes them,
  // chunk_bwd_sm90 reads them instead of running its checkpoint kernel. nullptr elsewhere.
  void* fwd_ckpt = nullptr; bool fwd_ck16 = false;
};

// The backward's tensors beside the forward's (q, k, v, gate, beta, s_in = S_0; y unused): dy and the final
// state's gradient (or nullptr) in, the gradients out (ours: contiguous, each in its input's dtype; ds0
// float32 or nullptr). dq is not here: a forward plan computes it (make_plan_backward).
struct BwdProblem : Problem {
  const void* dy; Strides4 sdy;
  const float* dfinal; StateStrides sdf;
  void *dk, *dv, *dgate, *dbeta;
  float* ds0;
  // chunk_bwd_sm90_fp32: it sets *nonfinite (zeroed by the host) where it reads or writes a value that is not
  // finite; the plan's chunk_bwd then recomputes every gradient with the exact semantics of inf and NaN, and
  // exits at once where run_if (that flag) is 0. nullptr elsewhere (chunk_bwd always runs).
  int* nonfinite = nullptr;
  const int* run_if = nullptr;
};

// Everything a launch depends on, decided once by make_plan() (host) and only executed by a unit.
struct Plan {
  Kernel kernel;
  DType dtype;
  int64_t blocks;        // grid of the (output) launch, kMaxThreads threads a block (chunk_sm90: kSm90Threads)
  size_t smem;           // dynamic shared memory a block
  // recurrent
  int R, G;              // rows a lane, lanes a column (a compiled pair, GR_RG_PAIRS); decode: R row passes
  int JB, TC;            // state columns a block, steps staged at once
  bool round_ref;        // numerics "reference": the PyTorch loop's rounding in the input dtype
  int col_blocks;        // ceil(D_v / JB)
  bool vec;              // 16-byte staging loads (q, k, v rows aligned): recurrent, parallel
  // parallel and chunk kernels
  int rtiles;            // parallel: row tiles of kParallelRows steps
  int sp_log;            // parallel: each P V sum split over 2^sp_log lanes
  int NV, DK;            // column tile; D_k compiled in (chunk: 64 or 128; parallel: GR_PARALLEL_TILES) or 0
  int DKP;               // D_k padded to 16 (chunk kernels) or 8 (parallel)
  int vtiles;            // ceil(D_v / NV)
  int nseg, seg_chunks;  // segments a (b, h) sequence, chunks a segment
  bool vec_qk, vec_v, vec_y;  // 16-byte accesses legal for q and k / v / y
  bool pdl;              // programmatic dependent launches: parallel; segment_scan and the output phase
  int64_t work_floats;   // workspace: (nseg - 1) segment states and decays a (b, h)
  bool varlen;           // packed sequences (cu_seqlens): b is a sequence, nseg a capacity (seg_count)
  bool full;             // decode, 32-column tiles: unit-stride q, k, v rows, D_k = 32 R and whole tiles (no bounds)
  bool ck16;             // chunk_bwd_sm90: 16-bit checkpoints, kCk16 (the gate bf16: dgate's tolerance is bf16's)
  // recurrent_bwd: R rows a thread (D_k <= 32 R), TC steps a recomputed run in shared memory, vtiles
  // 32-column tiles (in order, in one block), blocks = B * H; workspace: checkpoints, then the tile sums
};

// parallel: prod-g doubles, then k (L rows), q (kParallelRows) and v (L rows) in the staged dtype (esize: the input
// dtype, float for compiled tiles) at pitch D + 16 bytes, then P (kParallelRows x (L + 4)), W (L), the diagonal table.
inline size_t parallel_smem(int NV, int DKP, int L, int esize) {
  const size_t pad = 16 / esize, R = kParallelRows;
  return 16 * sizeof(double) + esize * ((L + R) * (DKP + pad) + L * (NV + pad)) +
         sizeof(float) * (R * (L + 4) + L + R * R);
}
inline size_t recurrent_smem(int R, int G, int JB, int TC) {
  return sizeof(float) * (size_t)TC * (2 * G * R + JB + 2);
}
// chunk_tf32: q, k, v, y staged as fp32, the state slice, the masked product, the gate tables.
inline size_t chunk_tf32_smem(int NV, int DKP) {
  return sizeof(float) * (size_t)(2 * 32 * (DKP + 4) + 2 * 32 * (NV + 8) + DKP * (NV + 8) + 32 * 36 + 5 * 32 + 512);
}
// chunk_bf16: fp32 staged y and two sets of gate tables; bf16 P twice, S twice, two staging buffers of
// q and k (D_k padded to 32) and v.
inline size_t chunk_bf16_smem(int NV, int DKP) {
  const size_t dkq = (size_t)(DKP + 31) / 32 * 32;
  return sizeof(float) * (size_t)(32 * (NV + 8) + 2 * 21 * 32) +
         2 * (2 * 32 * 40 + 2 * (size_t)DKP * (NV + 8) + 2 * (2 * 32 * (dkq + 8) + 32 * (size_t)(NV + 8)));
}
// chunk_sm90 (bytes; one block of an aux and two consumer warpgroups a (b, h, segment); D_v = 128): three
// stages of q, k (64 x DK) and v (64 x 128) bf16 tiles; y staged for its TMA store, 64 x 64 bf16 a consumer
// warpgroup, twice; two slots of what the aux warpgroup forms for the consumers (P' hi and lo, 64 x 64 bf16,
// and the gate tables, kSm90Tab floats); an mbarrier a stage. The TMA regions (stages, y) come first: their
// 128-byte swizzled boxes need 1024-byte alignment.
enum : int { kSm90Tab = 464 + 64 * 16, kSm90Threads = 384 };  // kSm90Threads: aux + two consumer warpgroups
template <int DK>
struct Sm90Layout {
  static constexpr int kQ = 64 * DK * 2, kV = 64 * 128 * 2, kStage = 2 * kQ + kV, kStages = 3;
  static constexpr int kPh = 0, kPl = 8192, kTb = 16384, kDer = kTb + (kSm90Tab * 4 + 127) / 128 * 128;
  static constexpr int kYBuf = 64 * 64 * 2;  // one consumer warpgroup's y tile
  static constexpr int kY = kStages * kStage, kDer0 = kY + 2 * 2 * kYBuf, kBars = kDer0 + 2 * kDer;
  static constexpr int kBytes = kBars + 8 * kStages;
  static_assert(kQ % 1024 == 0 && kStage % 1024 == 0 && kY % 1024 == 0 && kYBuf % 1024 == 0, "swizzle atoms");
};
// chunk_sm90 on float32 (bytes; D_k = D_v = 128, CHUNK_SM90_TF32_SRC): q hi and lo (64 x 128 fp32 each; k lands
// in lo first), K^T hi and lo (rows padded to 2064 bytes), P' hi and lo (rows padded to 1040), v (then y staged
// over it), two slots of gate tables, two mbarriers. The TMA regions (q hi and lo, v and y's halves) are 1024-byte
// aligned: their 128-byte swizzled boxes need it.
enum : int { kCk32 = 128 * 128 + 8 };  // a float32 checkpoint: S [dk][dv], then 8 warps' max |S|
// a 16-bit checkpoint (chunk_bwd_sm90, the gate bf16): S 2^s [dk][dv] in fp16, then 8 floats 2^-s, one a 16-column
// block dv / 16 (ck16_scale)
enum : int { kCk16 = 128 * 128 + 16 };
struct Sm90Tf32Layout {
  static constexpr int kQH = 0, kQL = 32768, kKTH = 65536, kKTL = kKTH + 33024, kPPH = kKTL + 33024;
  static constexpr int kPPL = kPPH + 16640, kVR = kPPL + 16640, kTB = kVR + 32768;
  // The state phase (no q, no P') double-buffers k in QL and QH, and v in VR and kVR2 (inside the P' bytes).
  static constexpr int kVR2 = kVR - 32768;
  // mbarriers: the output phase's q and k (0) and v (1); the state phase's k buffers (0, 1) and v buffers (2, 3)
  static constexpr int kTabSlot = (kSm90Tab * 4 + 127) / 128 * 128, kBars = kTB + 2 * kTabSlot, kBytes = kBars + 32;
  static_assert(kQH % 1024 == 0 && kQL % 1024 == 0 && kVR % 1024 == 0 && kVR2 % 1024 == 0 && kVR2 >= kPPH,
                "swizzle atoms; kVR2 in P''s bytes");
};
inline size_t chunk_sm90_smem(int DK, DType dt) {
  return dt == DType::f32 ? Sm90Tf32Layout::kBytes : DK == 64 ? Sm90Layout<64>::kBytes : Sm90Layout<128>::kBytes;
}

// (R, G) pairs of the recurrent kernel: G = 1 with any R, else R in {6, 8} (plan_recurrent's rule).
#define GR_RG_PAIRS(X) X(1, 1) X(2, 1) X(4, 1) X(6, 1) X(8, 1) X(6, 2) X(8, 2) X(6, 4) X(8, 4) \
  X(6, 8) X(8, 8) X(6, 16) X(8, 16) X(6, 32) X(8, 32)
// The reference unit's pairs (numerics "reference"): one row a lane up to D_k = 32, then 32 lanes.
#define GR_RG_PAIRS_REFERENCE(X) X(1, 1) X(1, 2) X(1, 4) X(1, 8) X(1, 16) X(1, 32) X(2, 32) X(4, 32) X(6, 32) X(8, 32)
// (NV, DK) instantiations of each chunk kernel: compiled D_k for wide aligned heads, run-time D_k else.
#define GR_CHUNK_INSTANCES(X) X(64, 64) X(64, 128) X(32, 0) X(64, 0)
// Compiled tiles of the parallel kernel: D_k = D_v = D with rows 16-byte aligned (common small heads).
#define GR_PARALLEL_TILES(X) X(16) X(24) X(32) X(64)

// recurrent_bwd: states every kBwdCheckpoint steps a (b, h) in the workspace; the shared memory of TC states.
enum : int { kBwdCheckpoint = 64, kBwdStateFloats = kMaxThreads * 4 };  // a state: R x kBwdStateFloats floats
inline size_t recurrent_bwd_smem(int R, int TC) { return sizeof(float) * (size_t)TC * R * kBwdStateFloats; }
// chunk_bwd: steps a chunk, and its shared memory (S and G 128 x 132, q, k, v, dy 32 x 132, three 32 x 33
// products and the 32 x 33 table, 7 vectors, 16 warp sums; cb:: in BACKWARD_SRC checks it) and its threads.
enum : int { kBwdChunk = 32, kBwdThreads = 512,
             kChunkBwdSmem = 4 * (2 * 128 * 132 + 4 * 32 * 132 + 4 * 32 * 33 + 7 * 32 + kBwdThreads / 32) };
// chunk_bwd_sm90's shared memory (bwd90:: in BACKWARD_SM90_SRC lays it out and checks it).
enum : int { kChunkBwdSm90Smem = 231792 };
// chunk_bwd_sm90_fp32's shared memory: its dq kernel's and its dv kernel's (bwd32:: in BACKWARD_SM90_FP32_SRC lays
// them out and checks them).
enum : int { kChunkBwdSm90Fp32Smem = 217152, kChunkBwdSm90Fp32DvSmem = 232448 };
// Rows a thread of recurrent_bwd (D_k <= 32 R): its instantiations.
#define GR_BWD_ROWS(X) X(1) X(2) X(4) X(8)

// A unit's entry point: runs every launch of the plan on the stream; on failure returns the CUDA error
// and names the launch in *failed. `work` holds plan.work_floats floats (or is nullptr). The backward
// unit's Problem is a BwdProblem.
using ExecuteFn = int (*)(const Plan*, const Problem*, float* work, cudaStream_t, const char** failed);
}  // namespace gr
extern "C" int gr_execute_core(const gr::Plan*, const gr::Problem*, float*, cudaStream_t, const char**);
"""

DEVICE_SRC = r"""
// ===================================== device: what every kernel unit uses =================
// Conversions, tile loads, asynchronous copies, launches.
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <type_traits>

namespace gr {
namespace {  // internal linkage up to the entry point: two builds in one process keep their own statics

// Templates, so that a unit that never uses a dtype compiles no code for it (and warns of none).
template <typename T>
__device__ __forceinline__ float to_float(T x) {
  if constexpr (std::is_same<T, __half>::value) return __half2float(x);
  else if constexpr (std::is_same<T, __nv_bfloat16>::value) return __bfloat162float(x);
  else return x;
}
template <typename T>
__device__ __forceinline__ T from_float(float x) {
  if constexpr (std::is_same<T, __half>::value) return __float2half_rn(x);
  else if constexpr (std::is_same<T, __nv_bfloat16>::value) return __float2bfloat16_rn(x);
  else return x;
}

// Gate or beta of one (b, h) at element offset `off`: the input dtype, or float32 beside 16-bit q, k, v
// (`wide`, Problem::g32 / b32: models keep their gates in float32). For float32 inputs it folds away.
// WIDE = false: the instantiation is planned for gates in the input dtype only (compiled parallel tiles,
// numerics "reference"), so the loads carry no dtype branch.
template <typename scalar_t, bool WIDE = true>
struct GateSeq {
  const void* p;
  bool f32;
  __device__ __forceinline__ GateSeq(const void* base, int64_t off, bool wide)
      : f32(sizeof(scalar_t) == 4 || (WIDE && wide)) {
    p = f32 ? static_cast<const void*>(static_cast<const float*>(base) + off)
            : static_cast<const void*>(static_cast<const scalar_t*>(base) + off);
  }
  __device__ __forceinline__ float operator[](int64_t i) const {
    return f32 ? static_cast<const float*>(p)[i] : to_float(static_cast<const scalar_t*>(p)[i]);
  }
  // Element i's bits, unconverted (a 16-bit dtype's in the low half; widen converts): a load whose first use is
  // a chunk later leaves the warp free until then (operator[]'s conversion right after it waited for the load).
  __device__ __forceinline__ uint32_t bits(int64_t i) const {
    return f32 ? __float_as_uint(static_cast<const float*>(p)[i])
               : (uint32_t)*reinterpret_cast<const unsigned short*>(static_cast<const scalar_t*>(p) + i);
  }
  __device__ __forceinline__ float widen(uint32_t x) const {
    return f32 ? __uint_as_float(x) : to_float(*reinterpret_cast<const scalar_t*>(&x));
  }
  // f(pointer in the stored dtype): one branch around a loop of loads, which then stay in flight together
  // (a branch a load, as operator[] has, serialized warp 0's gate loads; BENCHMARKS.md, ninth session)
  template <typename F>
  __device__ __forceinline__ void visit(F&& f) const {
    if (f32) f(static_cast<const float*>(p));
    else f(static_cast<const scalar_t*>(p));
  }
};

// Sequence b's steps: [0, T) of its own row, or with cu_seqlens (varlen) [cu[b], cu[b + 1]) of the one
// packed row, clamped into [0, T) so that bad offsets never move an access out of bounds.
struct SeqRange { int64_t bos; int len; };
template <int = 0>
__device__ __forceinline__ SeqRange seq_range(const Problem& p, int64_t b) {
  if (p.cu == nullptr) return {0, p.T};
  int64_t s, e;
  if (p.cu64) {
    s = static_cast<const int64_t*>(p.cu)[b * p.cu_stride];
    e = static_cast<const int64_t*>(p.cu)[(b + 1) * p.cu_stride];
  } else {
    s = static_cast<const int*>(p.cu)[b * p.cu_stride];
    e = static_cast<const int*>(p.cu)[(b + 1) * p.cu_stride];
  }
  s = min(max(s, (int64_t)0), (int64_t)p.T);
  e = min(max(e, s), (int64_t)p.T);
  return {s, (int)(e - s)};
}

// V consecutive elements of a row: 16 bytes when vectorised, else one.
template <typename scalar_t, bool VEC>
struct Vec16 {
  static constexpr int V = VEC ? 16 / (int)sizeof(scalar_t) : 1;
  union { uint4 raw; scalar_t x[V]; } u;
};

// Not NaN and not infinite. Each value on its own: fmaxf drops a NaN operand (a NaN in v went unseen).
// A template: a unit that never asks (core) compiles no copy and warns of none.
template <typename F>
__device__ __forceinline__ bool finite(F x) { return fabsf((float)x) <= 3.4028235e38f; }
// rows x cols (cols a multiple of V) of a strided source into dst (pitch ld) as float; zero outside
// rows_valid x cols_valid. VEC: 16-byte loads (the plan checked alignment and cols_valid % V == 0).
// U jobs per thread are in flight at once. Returns whether this thread staged a NaN or inf.
template <typename scalar_t, bool VEC, int U = 8>
__device__ __forceinline__ bool load_tile(float* dst, int ld, const scalar_t* __restrict__ src, int64_t st,
                                          int64_t sd, int rows_valid, int cols_valid, int rows, int cols) {
  using L = Vec16<scalar_t, VEC>;
  bool nonfinite = false;
  const int per_row = cols / L::V, total = rows * per_row;
  for (int base = threadIdx.x; base < total; base += U * blockDim.x) {
    L buf[U];
    int off[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int e = base + u * blockDim.x;
      off[u] = -1;
      if (e < total) {
        const int r = e / per_row, c = (e - r * per_row) * L::V;
        off[u] = r * ld + c;
        if (r < rows_valid && c < cols_valid) {
          const scalar_t* s = src + r * st + c * sd;
          if constexpr (VEC) buf[u].u.raw = __ldg(reinterpret_cast<const uint4*>(s));
          else buf[u].u.x[0] = s[0];
        } else {
          buf[u].u.raw = make_uint4(0u, 0u, 0u, 0u);
        }
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u)
      if (off[u] >= 0) {
#pragma unroll
        for (int i = 0; i < L::V; ++i) {
          const float x = to_float(buf[u].u.x[i]);
          nonfinite |= !finite(x);
          dst[off[u] + i] = x;
        }
      }
  }
  return nonfinite;
}

template <typename scalar_t>
__device__ __forceinline__ bool load_tile_any(bool vec, float* dst, int ld, const scalar_t* src, int64_t st,
                                              int64_t sd, int rows_valid, int cols_valid, int rows, int cols) {
  if (vec) return load_tile<scalar_t, true>(dst, ld, src, st, sd, rows_valid, cols_valid, rows, cols);
  return load_tile<scalar_t, false>(dst, ld, src, st, sd, rows_valid, cols_valid, rows, cols);
}

// Four 8x8 b16 matrices (or 8x4 fp32 tiles) of shared memory in one instruction; lane l receives
// element (l / 4, l % 4) of tile i in r[i] (as 32-bit words), the mma fragment layout. `row` (or `a`, its
// shared-window address) is this lane's address: row l % 8 of tile l / 8 (16-byte aligned). TRANS: each 8x8 b16 tile transposed
// (lane l receives elements (2 (l % 4), l / 4) and (2 (l % 4) + 1, l / 4)).
template <bool TRANS = false>
__device__ __forceinline__ void ldm4_at(uint32_t (&r)[4], uint32_t a) {  // (a: the shared-window address)
  if constexpr (TRANS)
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a));
  else
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a));
}
template <bool TRANS = false>
__device__ __forceinline__ void ldm4(uint32_t (&r)[4], const void* row) {
  ldm4_at<TRANS>(r, (uint32_t)__cvta_generic_to_shared(row));
}

// BYTES (16, or 4: one element) global -> shared without passing through registers; `valid` false
// writes zeros (reads nothing). A template: a unit that never copies compiles no copy and warns of none.
template <int BYTES>
__device__ __forceinline__ void cp_async(void* dst, const void* src, bool valid) {
  static_assert(BYTES == 16 || BYTES == 4, "cp.async copies 16 bytes (.cg) or 4 (.ca)");
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800  // sm_75: no cp.async; a plain copy (the waits are no-ops)
  using W = typename std::conditional<BYTES == 16, uint4, uint32_t>::type;
  *reinterpret_cast<W*>(dst) = valid ? *reinterpret_cast<const W*>(src) : W{};
#else
  const uint32_t d = (uint32_t)__cvta_generic_to_shared(dst);
  if constexpr (BYTES == 16)
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(d), "l"(src), "r"(valid ? 16 : 0) : "memory");
  else
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(d), "l"(src), "r"(valid ? 4 : 0) : "memory");
#endif
}
template <int = 0>
__device__ __forceinline__ void cp_async_commit() {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}
// Waits until at most N of this thread's committed groups are still in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
#endif
}

// (x0, x1) as bf16x2 hi and lo, x0 in the low half (16 significant bits together). GUARD: lo is 0 where
// x - hi is NaN (x infinite or NaN, which hi already carries), so an infinite operand gives inf, not
// inf - inf; without it (chunk_sm90's state) an infinite x gives NaN, as non-finite. A template: a unit
// that never splits compiles no copy.
template <bool GUARD = true>
__device__ __forceinline__ void split_bf16x2(float x0, float x1, uint32_t& hi, uint32_t& lo) {
  const __nv_bfloat162 h = __floats2bfloat162_rn(x0, x1);
  float d0 = x0 - __low2float(h), d1 = x1 - __high2float(h);
  if constexpr (GUARD) {
    d0 = d0 == d0 ? d0 : 0.f;
    d1 = d1 == d1 ? d1 : 0.f;
  }
  const __nv_bfloat162 l = __floats2bfloat162_rn(d0, d1);
  hi = reinterpret_cast<const uint32_t&>(h);
  lo = reinterpret_cast<const uint32_t&>(l);
}

// hi = x rounded to TF32 (adding half a TF32 ulp to the bit pattern and clearing the 13 low bits
// rounds the magnitude to nearest: two integer instructions where __float_to_tf32 takes five);
// lo = x - hi (exact) as raw fp32 bits, which the tensor core truncates to TF32. Truncating hi
// instead doubled the error (rel-L2 1.02e-5 with gates of 1.02 over 300 steps, over the 1e-5 bound).
// NaN survives in lo: CUDA's NaN 0x7fffffff plus half an ulp carries into the sign bit (hi = -0), but
// x - hi is NaN again; rounding lo too would lose it (measured).
template <int = 0>
__device__ __forceinline__ uint32_t round_tf32(float x) { return (__float_as_uint(x) + 0x1000u) & 0xffffe000u; }

// Programmatic dependent launch (sm_90+): a kernel launched with pdl may start while the previous
// kernel in the stream still runs; it waits here before it touches memory, and the previous kernel
// lets it start by calling griddep_launch. Both are no-ops for a kernel launched without pdl.
// Templates: a unit that never waits compiles no copy.
template <int = 0>
__device__ __forceinline__ void griddep_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}
template <int = 0>
__device__ __forceinline__ void griddep_launch() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

// Every launch: kernel<<<grid, threads, smem, stream>>>(args), as a programmatic dependent launch when
// pdl is set; returns the launch's error. launch_ex: kMaxThreads threads, every kernel's but chunk_sm90's.
template <typename... Args>
cudaError_t launch_threads(void (*kernel)(Args...), dim3 grid, unsigned threads, size_t smem, cudaStream_t stream,
                           bool pdl, const Args&... args) {
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = dim3(threads);
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cfg.attrs = attr;
  cfg.numAttrs = pdl ? 1 : 0;
  return cudaLaunchKernelEx(&cfg, kernel, args...);
}
template <typename... Args>
cudaError_t launch_ex(void (*kernel)(Args...), dim3 grid, size_t smem, cudaStream_t stream, bool pdl,
                      const Args&... args) {
  return launch_threads(kernel, grid, kMaxThreads, smem, stream, pdl, args...);
}

// One attribute call per kernel and device for kernels that need more than 48 KB of shared memory.
// `done` is one flag per device, owned by the caller's kernel instantiation.
template <typename K>
cudaError_t allow_smem(K kernel, bool (&done)[64]) {
  int dev = 0;
  cudaError_t err = cudaGetDevice(&dev);
  if (err != cudaSuccess || (dev < 64 && done[dev])) return err;
  int optin = 0;
  cudaFuncAttributes fa = {};
  err = cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev);
  // the opt-in limit covers static and dynamic shared memory together
  if (err == cudaSuccess) err = cudaFuncGetAttributes(&fa, kernel);
  if (err == cudaSuccess)
    err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, optin - (int)fa.sharedSizeBytes);
  if (err == cudaSuccess && dev < 64) done[dev] = true;
  return err;
}

}  // namespace
}  // namespace gr
"""

RECURRENT_SRC = r"""
// ===================================== recurrent: one step at a time, S in registers ========
namespace gr {
namespace {

struct RecurrentParams : Problem {
  int JB, TC, col_blocks;
  int vec;  // q, k, v rows are 16-byte aligned runs: 16-byte loads
};

// Stages time steps [t0, t0 + tc) of q, k (rows of width Dk into pitch kp) and the block's v
// columns (nv of them into pitch JB) into shared memory as float. All jobs of the three tensors
// share one index space and go out U at a time, so a thread has U loads in flight.
template <typename scalar_t, bool VEC, int U = 8>
__device__ __forceinline__ void stage_qkv(float* q_s, float* k_s, float* v_s, int kp, int JB,
                                          const scalar_t* __restrict__ q, const scalar_t* __restrict__ k,
                                          const scalar_t* __restrict__ v, int64_t sqt, int64_t sqd,
                                          int64_t skt, int64_t skd, int64_t svt, int64_t svd,
                                          int tc, int Dk, int nv) {
  using L = Vec16<scalar_t, VEC>;
  constexpr int V = L::V;
  const int qrow = Dk / V, vrow = nv / V;  // jobs per row (VEC implies divisibility)
  const int nq = tc * qrow, total = 2 * nq + tc * vrow;
  for (int base = threadIdx.x; base < total; base += U * blockDim.x) {
    L buf[U];
    float* dst[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      int e = base + u * blockDim.x;
      dst[u] = nullptr;
      if (e < total) {
        const scalar_t* src;
        int64_t st, sd;
        int row, pitch;
        float* d;
        if (e < 2 * nq) {
          const bool isk = e >= nq;
          e -= isk ? nq : 0;
          src = isk ? k : q; st = isk ? skt : sqt; sd = isk ? skd : sqd; row = qrow; pitch = kp; d = isk ? k_s : q_s;
        } else {
          e -= 2 * nq;
          src = v; st = svt; sd = svd; row = vrow; pitch = JB; d = v_s;
        }
        const int tt = e / row, c = (e - tt * row) * V;
        src += tt * st + c * sd;
        if constexpr (VEC) buf[u].u.raw = __ldg(reinterpret_cast<const uint4*>(src));
        else buf[u].u.x[0] = src[0];
        dst[u] = d + tt * pitch + c;
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u)
      if (dst[u] != nullptr) {
#pragma unroll
        for (int i = 0; i < V; ++i) dst[u][i] = to_float(buf[u].u.x[i]);
      }
  }
}

// x rounded to T and back (the identity for float): what storing an fp32 result in a T tensor does.
template <typename T>
__device__ __forceinline__ float round_to(float x) { return to_float(from_float<T>(x)); }

// tc time steps of one column slice. __restrict__ lets loads of later steps go ahead of this step's
// y store. G is a template parameter: shuffles under a run-time `if (off < G)` compiled into
// divergence stubs.
template <typename scalar_t, int R, int G>
__device__ __forceinline__ void run_steps(float (&S)[R], const float* __restrict__ q_s, const float* __restrict__ k_s,
                                          const float* __restrict__ v_s, const float* __restrict__ g_s,
                                          const float* __restrict__ b_s, scalar_t* __restrict__ y, int64_t syt,
                                          int tc, int kp, int JB, int rows, bool writer) {
#pragma unroll 4
  for (int tt = 0; tt < tc; ++tt) {
    const float* qr = q_s + tt * kp;
    const float* kr = k_s + tt * kp;
    const float g = g_s[tt];
    const float bv = b_s[tt] * v_s[tt * JB];
    float acc = 0.f;
#pragma unroll
    for (int r = 0; r < R; ++r) {
      if (r < rows) {  // padded rows stay out: 0 * inf would be NaN
        S[r] = fmaf(g, S[r], kr[r] * bv);
        acc = fmaf(qr[r], S[r], acc);
      }
    }
#pragma unroll
    for (int off = G / 2; off > 0; off >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, off);
    if (writer) y[tt * syt] = from_float<scalar_t>(acc);
  }
}

// run_steps with the PyTorch loop's arithmetic in scalar_t (numerics "reference": reference.py's Model
// run in that dtype): every product and sum an fp32 operation rounded to scalar_t (k v^T, beta (k v^T),
// gate S, their sum, which is the state, and q S), no fused multiply-adds; the sum over D_k accumulates
// in fp32 and rounds once, as torch's reduction does. The rounding lengthens each step, so the sums over
// D_k leave the state's chain: 32 steps run with their partial sums kept in registers, then one
// reduce-scatter over the G lanes of a column (31 shuffles for 32 steps where a tree a step takes 160)
// leaves lane `lig` the totals of steps lig * (32 / G) + i, which it stores.
template <typename scalar_t, int R, int G>
__device__ __forceinline__ void run_steps_rounded(float (&S)[R], const float* __restrict__ q_s,
                                                  const float* __restrict__ k_s, const float* __restrict__ v_s,
                                                  const float* __restrict__ g_s, const float* __restrict__ b_s,
                                                  scalar_t* __restrict__ y, int64_t syt, int tc, int kp, int JB,
                                                  int rows, int lig, bool writer) {
  constexpr int PER = 32 / G;  // steps a lane stores from each group of 32
  // one step: the state update and this lane's part of the sum over D_k
  auto step = [&](int tt) {
    const float* qr = q_s + tt * kp;
    const float* kr = k_s + tt * kp;
    const float g = g_s[tt], bb = b_s[tt], vj = v_s[tt * JB];
    float acc = 0.f;
#pragma unroll
    for (int r = 0; r < R; ++r) {
      // padded rows stay out (0 * inf would be NaN) by selects, not a branch: a branch a step kept each
      // step's loads from being issued ahead of it
      const bool live = r < rows;
      const float kv = round_to<scalar_t>(__fmul_rn(kr[r], vj));
      const float sn = round_to<scalar_t>(__fadd_rn(round_to<scalar_t>(__fmul_rn(g, S[r])), round_to<scalar_t>(__fmul_rn(bb, kv))));
      const float sum = __fadd_rn(acc, round_to<scalar_t>(__fmul_rn(qr[r], sn)));
      S[r] = live ? sn : S[r];
      acc = live ? sum : acc;
    }
    return acc;
  };
#pragma unroll 1
  for (int tb = 0; tb < tc; tb += 32) {
    float part[32];
    if (tb + 32 <= tc) {  // a whole group: no branch between steps, so their loads are scheduled early
#pragma unroll
      for (int u = 0; u < 32; ++u) part[u] = step(tb + u);
    } else {
#pragma unroll
      for (int u = 0; u < 32; ++u) part[u] = tb + u < tc ? step(tb + u) : 0.f;
    }
    // round k: lanes with bit `off` set keep the upper half of the n values still held, the others the lower
#pragma unroll
    for (int off = G / 2, n = 16; off > 0; off >>= 1, n >>= 1) {
      // the selects as bit masks: a conditional pick between array slots became local-memory indexing
      const uint32_t m = (lig & off) != 0 ? 0xffffffffu : 0u;
#pragma unroll
      for (int i = 0; i < n; ++i) {
        const uint32_t a = __float_as_uint(part[i]), b = __float_as_uint(part[i + n]);
        const float keep = __uint_as_float((a & ~m) | (b & m)), send = __uint_as_float((b & ~m) | (a & m));
        part[i] = __fadd_rn(keep, __shfl_xor_sync(0xffffffffu, send, off));
      }
    }
#pragma unroll
    for (int i = 0; i < PER; ++i) {
      const int tt = tb + lig * PER + i;
      if (writer && tt < tc) y[tt * syt] = from_float<scalar_t>(part[i]);
    }
  }
}

// Grid: one block per (b, h, column block). Lane `lane` of column `col` keeps rows
// [lane * R, lane * R + R) of S[:, j] in registers; threads past G * JB only load.
template <typename scalar_t, int R, int G, bool ROUND>
__global__ void __launch_bounds__(kMaxThreads) recurrent_kernel(const RecurrentParams p) {
  extern __shared__ float smem[];
  constexpr int kp = G * R;  // D_k padded to whole lanes
  float* q_s = smem;
  float* k_s = q_s + p.TC * kp;
  float* v_s = k_s + p.TC * kp;
  float* g_s = v_s + p.TC * p.JB;
  float* b_s = g_s + p.TC;

  int blk = blockIdx.x;
  const int cb = blk % p.col_blocks;
  blk /= p.col_blocks;
  const int h = blk % p.H;
  const int b = blk / p.H;
  const SeqRange sr = seq_range(p, b);  // varlen: the sequence's steps of the packed row
  const int T = sr.len;

  const int tid = threadIdx.x;
  const int col = tid / G;
  const int lane = tid - col * G;
  const int j0 = cb * p.JB;
  const int nv = min(p.JB, p.Dv - j0);                // valid columns in this block
  const bool warp_active = ((tid & ~31) / G) < nv;  // shuffles need the whole warp
  const int i0 = lane * R;
  const int rows = max(0, min(R, p.Dk - i0));

  const scalar_t* q = static_cast<const scalar_t*>(p.q) + b * p.sq.b + sr.bos * p.sq.t + h * p.sq.h;
  const scalar_t* k = static_cast<const scalar_t*>(p.k) + b * p.sk.b + sr.bos * p.sk.t + h * p.sk.h;
  const scalar_t* v = static_cast<const scalar_t*>(p.v) + b * p.sv.b + sr.bos * p.sv.t + h * p.sv.h + j0 * p.sv.d;
  const GateSeq<scalar_t, !ROUND> gate(p.gate, b * p.sg.b + sr.bos * p.sg.t + h * p.sg.h, p.g32);  // "reference": one dtype
  const GateSeq<scalar_t, !ROUND> beta(p.beta, b * p.sb.b + sr.bos * p.sb.t + h * p.sb.h, p.b32);
  scalar_t* y = static_cast<scalar_t*>(p.y) + b * p.sy.b + sr.bos * p.sy.t + h * p.sy.h + (j0 + col) * p.sy.d;

  // Padding columns are never staged: zero them (all of shared memory) once.
  const int smem_floats = p.TC * (2 * kp + p.JB + 2);
  for (int e = tid; e < smem_floats; e += blockDim.x) smem[e] = 0.f;
  __syncthreads();

  const bool owner = warp_active && col < nv;  // this lane's rows of column j0 + col are real
  float S[R];
#pragma unroll
  for (int r = 0; r < R; ++r) {
    S[r] = (p.s_in != nullptr && owner && r < rows)
               ? p.s_in[b * p.ssi.b + h * p.ssi.h + (i0 + r) * p.ssi.i + (j0 + col) * p.ssi.j] : 0.f;
    if constexpr (ROUND) S[r] = round_to<scalar_t>(S[r]);  // the loop holds its state in scalar_t
  }

  for (int t0 = 0; t0 < T; t0 += p.TC) {
    const int tc = min(p.TC, T - t0);
    if (t0 > 0) __syncthreads();  // the previous chunk is fully consumed
    gate.visit([&](auto gp) {  // issued first: in flight with q, k, v
      beta.visit([&](auto bp) {
        for (int e = tid; e < tc; e += blockDim.x) {
          g_s[e] = to_float(gp[(t0 + e) * p.sg.t]);
          b_s[e] = to_float(bp[(t0 + e) * p.sb.t]);
        }
      });
    });
    if (p.vec)
      stage_qkv<scalar_t, true>(q_s, k_s, v_s, kp, p.JB, q + t0 * p.sq.t, k + t0 * p.sk.t, v + t0 * p.sv.t,
                                p.sq.t, p.sq.d, p.sk.t, p.sk.d, p.sv.t, p.sv.d, tc, p.Dk, nv);
    else
      stage_qkv<scalar_t, false>(q_s, k_s, v_s, kp, p.JB, q + t0 * p.sq.t, k + t0 * p.sk.t, v + t0 * p.sv.t,
                                 p.sq.t, p.sq.d, p.sk.t, p.sk.d, p.sv.t, p.sv.d, tc, p.Dk, nv);
    __syncthreads();
    if (!warp_active) continue;
    if constexpr (ROUND)
      run_steps_rounded<scalar_t, R, G>(S, q_s + i0, k_s + i0, v_s + col, g_s, b_s, y + t0 * p.sy.t, p.sy.t, tc, kp,
                                        p.JB, rows, lane, col < nv);
    else
      run_steps<scalar_t, R, G>(S, q_s + i0, k_s + i0, v_s + col, g_s, b_s, y + t0 * p.sy.t, p.sy.t, tc, kp, p.JB,
                                rows, lane == 0 && col < nv);
  }
  // (an empty varlen sequence leaves its initial state as given: "reference" rounded its copy in S)
  if (p.s_out != nullptr && owner)
#pragma unroll
    for (int r = 0; r < R; ++r)
      if (r < rows)
        p.s_out[b * p.sso.b + h * p.sso.h + (i0 + r) * p.sso.i + (j0 + col) * p.sso.j] =
            T > 0 || !ROUND || p.s_in == nullptr ? S[r]
                                                 : p.s_in[b * p.ssi.b + h * p.ssi.h + (i0 + r) * p.ssi.i + (j0 + col) * p.ssi.j];
}

// ROUND: the reference unit's instantiations (numerics "reference"); the core has the others.
template <typename scalar_t, bool ROUND>
cudaError_t launch_recurrent(const Plan& pl, const Problem& pr, cudaStream_t s) {
  RecurrentParams p;
  static_cast<Problem&>(p) = pr;
  p.JB = pl.JB; p.TC = pl.TC; p.col_blocks = pl.col_blocks; p.vec = pl.vec;
  // Always kMaxThreads: threads past G * JB only stage, which keeps more loads in flight.
#define GR_CASE(R_, G_) \
  if (pl.R == R_ && pl.G == G_) return launch_ex(recurrent_kernel<scalar_t, R_, G_, ROUND>, dim3((unsigned)pl.blocks), pl.smem, s, false, p);
  if constexpr (ROUND) {
    GR_RG_PAIRS_REFERENCE(GR_CASE)
  } else {
    GR_RG_PAIRS(GR_CASE)
  }
#undef GR_CASE
  return cudaErrorInvalidValue;
}

}  // namespace
}  // namespace gr

"""

REFERENCE_SRC = r"""
// ===================================== reference: the PyTorch loop's rounding ==============
// The recurrent kernel with ROUND (RECURRENT_SRC, run_steps): numerics "reference", what
// reference.py's Model computes in float16 or bfloat16 (KernelBench's low-precision runs compare with
// that). Its own unit, built on first use: only those calls need it.
extern "C" int gr_execute_reference(const gr::Plan* pl, const gr::Problem* pr, float*, cudaStream_t s,
                                    const char** failed) {
  using namespace gr;
  *failed = "numerics=reference";
  switch (pl->dtype) {
    case DType::f32: return (int)launch_recurrent<float, true>(*pl, *pr, s);
    case DType::f16: return (int)launch_recurrent<__half, true>(*pl, *pr, s);
    case DType::bf16: return (int)launch_recurrent<__nv_bfloat16, true>(*pl, *pr, s);
  }
  return (int)cudaErrorInvalidValue;
}
"""

TF32_MMA_SRC = r"""
// ===================================== tf32_mma: fp32-accurate products on TF32 mma.sync ======
// Raw mma.sync m16n8k8 TF32 with fragments loaded by plain shared loads or ldmatrix in the documented
// layouts (g = lane / 4, q = lane % 4):
//   A 16x8: a0 (g, q), a1 (g+8, q), a2 (g, q+4), a3 (g+8, q+4);  B 8x8: b0 (q, g), b1 (q+4, g);
//   C 16x8: c0 (g, 2q), c1 (g, 2q+1), c2 (g+8, 2q), c3 (g+8, 2q+1).
// SPLIT: each fp32 operand as hi + lo TF32 terms and three products (3xTF32, fp32-level error).
// Used by chunk_tf32.
namespace gr {
namespace {

__device__ __forceinline__ void mma_tf32(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
  __trap();  // TF32 mma.sync is sm_80+; make_plan never picks chunk_tf32 below (the unit still compiles)
#else
  asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#endif
}

template <int N>
__device__ __forceinline__ void split_tf32(const float (&x)[N], uint32_t (&hi)[N], uint32_t (&lo)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) {
    hi[i] = round_tf32(x[i]);
    lo[i] = __float_as_uint(x[i] - __uint_as_float(hi[i]));
  }
}

// d += a b, the lo terms' products first, then hi hi: a split (ah, al) or, !SPLIT_A, TF32 values in ah (al
// unused); b split here (SPLIT_B) or taken as TF32 values. Both split: fp32-level accuracy (3xTF32).
template <bool SPLIT_A, bool SPLIT_B>
__device__ __forceinline__ void mma_terms(float (&d)[4], const uint32_t (&ah)[4], const uint32_t (&al)[4],
                                          const float (&b)[2]) {
  uint32_t bh[2], bl[2];
  if constexpr (SPLIT_B) {
    split_tf32<2>(b, bh, bl);
  } else {
    bh[0] = __float_as_uint(b[0]); bh[1] = __float_as_uint(b[1]);
  }
  if constexpr (SPLIT_A) mma_tf32(d, al, bh);
  if constexpr (SPLIT_B) mma_tf32(d, ah, bl);
  mma_tf32(d, ah, bh);
}

// d += a b with fp32-level accuracy (SPLIT: lo*hi + hi*lo + hi*hi) or one TF32 product.
template <bool SPLIT>
__device__ __forceinline__ void mma3(float (&d)[4], const uint32_t (&ah)[4], const uint32_t (&al)[4],
                                     const float (&b)[2]) {
  mma_terms<SPLIT, SPLIT>(d, ah, al, b);
}

template <bool SPLIT>
__device__ __forceinline__ void prep_a(const float (&a)[4], uint32_t (&ah)[4], uint32_t (&al)[4]) {
  if constexpr (SPLIT) {
    split_tf32<4>(a, ah, al);
  } else {
#pragma unroll
    for (int i = 0; i < 4; ++i) { ah[i] = __float_as_uint(a[i]); al[i] = 0u; }
  }
}

__device__ __forceinline__ void ldm_x4(float (&r)[4], const float* row) {
  uint32_t x[4];
  ldm4(x, row);
  r[0] = __uint_as_float(x[0]); r[1] = __uint_as_float(x[1]); r[2] = __uint_as_float(x[2]); r[3] = __uint_as_float(x[3]);
}

// 16x8 A fragment at A (row-major, pitch ld a multiple of 4, A 16-byte aligned): tiles rows 0-7 /
// 8-15 by columns 0-3 / 4-7 give a0 (g, q), a1 (g+8, q), a2 (g, q+4), a3 (g+8, q+4).
__device__ __forceinline__ void frag_a(float (&a)[4], const float* A, int ld, int g, int q) {
  const int lane = 4 * g + q;
  ldm_x4(a, A + ((lane & 7) + ((lane >> 3) & 1) * 8) * ld + (lane >> 4) * 4);
}

// One 16x8 tile of q k^T: d += A B^T with A the 16 rows at a and B the 8 rows at bk (D_k along each
// row, pitch ld, dkp a multiple of 16). B^T's fragments come straight from k's rows (k's 8 rows x 16
// columns are four 8x4 tiles for ldmatrix); even and odd k-steps run as two chains.
template <bool SPLIT>
__device__ __forceinline__ void qk_tile(float (&d)[4], const float* a, const float* bk, int ld, int dkp, int lane) {
  const int g = lane >> 2, q4 = lane & 3;
  float d2[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll 4
  for (int kk = 0; kk < dkp; kk += 16) {
    float a1[4], a2[4], kb[4];
    ldm_x4(kb, bk + (lane & 7) * ld + kk + (lane >> 3) * 4);
    const float bb[2] = {kb[0], kb[1]}, bb2[2] = {kb[2], kb[3]};
    uint32_t ah[4], al[4], ah2[4], al2[4];
    frag_a(a1, a + kk, ld, g, q4);
    frag_a(a2, a + kk + 8, ld, g, q4);
    prep_a<SPLIT>(a1, ah, al);
    prep_a<SPLIT>(a2, ah2, al2);
    mma3<SPLIT>(d, ah, al, bb);
    mma3<SPLIT>(d2, ah2, al2, bb2);
  }
#pragma unroll
  for (int i = 0; i < 4; ++i) d[i] += d2[i];
}

// acc[n] += A (16 x kend, row-major at a, pitch lda) times B (kend x 8, row-major at b + n * 8, pitch ldb).
template <bool SPLIT, int N>
__device__ __forceinline__ void row_strip(float (&acc)[N][4], const float* a, int lda, const float* b, int ldb,
                                          int kend, int g, int q4) {
#pragma unroll
  for (int k0 = 0; k0 < kend; k0 += 8) {
    float af[4];
    uint32_t ah[4], al[4];
    frag_a(af, a + k0, lda, g, q4);
    prep_a<SPLIT>(af, ah, al);
#pragma unroll
    for (int n = 0; n < N; ++n) {
      const float* bp = b + k0 * ldb + n * 8 + g;
      const float bb[2] = {bp[q4 * ldb], bp[(q4 + 4) * ldb]};
      mma3<SPLIT>(acc[n], ah, al, bb);
    }
  }
}

// One warp's strip of S: rows 16 (at sp, pitch ldv) x N tiles of 8 columns.
// S = decay * S + sum_s (kscale[s] k_s)^T v_s over the chunk's 32 steps (staged as zeros, with
// kscale 0, past the end of the sequence); kc: k at this row block. The product accumulates from zero
// and S joins it in one fp32 FMA afterwards: carried through a chunk's mma.sync accumulations (12 with
// SPLIT, 4 without; their fp32 additions are not round-to-nearest), S lost a few ulps of itself every
// chunk, coherently (fp32 rel-L2 2.2e-5 after 66 chunks with gate 1.002). With the gate tables in double
// (write_gate_tables) as well it is 2.3e-6; the recurrent kernel 1.0e-6.
template <bool SPLIT, int N>
__device__ __forceinline__ void s_update_strip(float* sp, int ldv, const float* kc, int ldk, const float* vc,
                                               const float* kscale, float decay, int g, int q4) {
  float acc[N][4];
#pragma unroll
  for (int n = 0; n < N; ++n) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.f;
#pragma unroll
  for (int s0k = 0; s0k < 32; s0k += 8) {
    const float w0 = kscale[s0k + q4], w1 = kscale[s0k + q4 + 4];
    const float* k0 = kc + (s0k + q4) * ldk + g;
    const float* k1 = kc + (s0k + q4 + 4) * ldk + g;
    const float a[4] = {k0[0] * w0, k0[8] * w0, k1[0] * w1, k1[8] * w1};
    uint32_t ah[4], al[4];
    prep_a<SPLIT>(a, ah, al);
#pragma unroll
    for (int n = 0; n < N; ++n) {
      const float* bv = vc + s0k * ldv + n * 8 + g;
      const float bb[2] = {bv[q4 * ldv], bv[(q4 + 4) * ldv]};
      mma3<SPLIT>(acc[n], ah, al, bb);
    }
  }
#pragma unroll
  for (int n = 0; n < N; ++n) {
    float2* lo2 = reinterpret_cast<float2*>(sp + g * ldv + n * 8 + 2 * q4);
    float2* hi2 = reinterpret_cast<float2*>(sp + (g + 8) * ldv + n * 8 + 2 * q4);
    const float2 a = *lo2, b = *hi2;
    *lo2 = make_float2(fmaf(a.x, decay, acc[n][0]), fmaf(a.y, decay, acc[n][1]));
    *hi2 = make_float2(fmaf(b.x, decay, acc[n][2]), fmaf(b.y, decay, acc[n][3]));
  }
}

}  // namespace
}  // namespace gr
"""

PARALLEL_SRC = r"""
// ===================================== parallel: short sequences without a carried state ====
// For T <= 256 a head's outputs need no recurrence at all (naive.chunked_naive has the algebra):
//   y_t = sum_{s<=t} M[t][s] (q_t . k_s) v_s + A[t] (q_t^T S_0),  M[t][s] = beta_s prod_{r=s+1..t} g_r,
//   A[t] = prod_{r<=t} g_r;  S_T = A[T-1] S_0 + sum_s M[T-1][s] k_s v_s^T.
// Grid: one block per (b, h, row tile of RT = 8 steps, column tile of NV), so every row tile of a head
// runs at once (at the KernelBench shape the recurrent kernel's 128 dependent steps become 16 tiles).
// The problem is tiny and latency-bound: the time goes to dependent instructions (about 6 cycles each
// with two warps a scheduler) and to fetching code, not to arithmetic. So the block is built for few
// instructions a warp: q of its rows, k and v of every step up to its last row, gate and beta in ONE
// memory round trip (cp.async, q, k, v in the input dtype); fp32 FMAs only (exact fp32 products for every
// dtype, and no mask ever meets a NaN or inf: sums skip s > t); loops not unrolled beyond what hides
// shared-memory latency. With t0 the tile's first step, M splits as Grow[t] * W[s] for s < t0
// (Grow[t] = prod g[t0..t], W[s] = beta_s prod g[s+1..t0-1], a suffix scan in double rounded once) and
// a direct RT x RT table D for the diagonal block, both written while the copies fly. Two barriers:
// staged (and tables); P.
namespace gr {
namespace {

// How a tile of rows x (cols / V) copies of V elements maps onto the block's threads, from the host (no
// divisions in the kernel): copies a row, the rows and columns a thread advances by, and 1 / per_row.
struct StageMap { int per_row, dr, dc; float inv; };

struct ParallelParams : Problem {
  int vtiles, rtiles;  // column tiles of NV, row tiles of kParallelRows steps
  int NV, DKP;         // column tile and D_k, multiples of 8
  int L;               // steps the shared-memory layout holds: rtiles * kParallelRows
  int sp_log;          // each P V sum split over 1 << sp_log lanes
  int vec;             // 16-byte copies legal for q, k and v
  int vec_y;           // y rows of whole groups of 4 aligned (D_v % 4 == 0)
  StageMap map_k, map_v;  // q and k tiles, v tile
};

// Four consecutive staged elements (8- or 16-byte aligned) as float.
template <typename T>
__device__ __forceinline__ float4 lds4(const T* p) {
  if constexpr (sizeof(T) == 4) {
    return *reinterpret_cast<const float4*>(p);
  } else {
    union { uint2 raw; T x[4]; } u;
    u.raw = *reinterpret_cast<const uint2*>(p);
    return make_float4(to_float(u.x[0]), to_float(u.x[1]), to_float(u.x[2]), to_float(u.x[3]));
  }
}

// Two floats rounded to a 16-bit type, packed low first.
template <typename T>
__device__ __forceinline__ uint32_t pack2(float a, float b) {
  if constexpr (std::is_same<T, __half>::value)
    return (uint32_t)__half_as_ushort(__float2half_rn(a)) | ((uint32_t)__half_as_ushort(__float2half_rn(b)) << 16);
  else
    return (uint32_t)__bfloat16_as_ushort(__float2bfloat16_rn(a)) |
           ((uint32_t)__bfloat16_as_ushort(__float2bfloat16_rn(b)) << 16);
}

// rows x cols (padded, multiples of 8) of a strided source into dst (pitch ld), in the source dtype, zero
// outside rows_valid x cols_valid: cp.async of 16 bytes (vec) or of 4-byte elements, or (2-byte elements
// without vec) plain loads. Issues only; the caller waits. Not unrolled: code this kernel runs a few
// times costs more to fetch than its loop overhead.
template <typename T>
__device__ __forceinline__ void stage_async(bool vec, const StageMap& m, T* dst, int ld, const T* src, int64_t st,
                                            int64_t sd, int rows_valid, int cols_valid, int rows) {
  const int V = vec ? 16 / (int)sizeof(T) : 1;
  // tid / per_row exactly: (tid + 0.5) / per_row is at least 1 / 512 away from an integer
  int r = __float2int_rz(((float)threadIdx.x + 0.5f) * m.inv), c = threadIdx.x - r * m.per_row;
#pragma unroll 1
  while (r < rows) {
    const bool ok = r < rows_valid && c * V < cols_valid;
    T* d = dst + r * ld + c * V;
    const T* s = ok ? src + r * st + (int64_t)c * V * sd : src;
    if (vec) cp_async<16>(d, s, ok);
    else if constexpr (sizeof(T) == 4) cp_async<4>(d, s, ok);
    else *d = ok ? __ldg(s) : from_float<T>(0.f);
    r += m.dr;
    c += m.dc;
    if (c >= m.per_row) { c -= m.per_row; ++r; }
  }
}

// The rows of a compiled tile: PR 16-byte copies a row (unit column stride, every column valid), copy
// e = tid + j kMaxThreads for j < N (N kMaxThreads >= rows PR), zeros past rows_valid. Every copy of q,
// k and v goes out before the first completes: float rows by cp.async (issue), 16-bit rows into
// registers (load) and converted to float once (store), so the products read fp32 and convert nothing.
template <typename T, int PR, int N>
struct TileRows {
  enum : int { V = 16 / (int)sizeof(T) };  // an enumerator: no unused-member warning where V goes unused
  uint4 x[sizeof(T) == 2 ? N : 1];
  __device__ __forceinline__ static void issue(float* dst, int ld, const float* src, int64_t st, int rows_valid,
                                               int rows) {
#pragma unroll
    for (int j = 0; j < N; ++j) {
      const int e = threadIdx.x + j * kMaxThreads, r = e / PR, c = e - r * PR;
      if (r < rows) cp_async<16>(dst + r * ld + c * V, r < rows_valid ? src + r * st + c * V : src, r < rows_valid);
    }
  }
  __device__ __forceinline__ void load(const T* src, int64_t st, int rows_valid) {
#pragma unroll
    for (int j = 0; j < N; ++j) {
      const int e = threadIdx.x + j * kMaxThreads, r = e / PR, c = e - r * PR;
      x[j] = r < rows_valid ? __ldg(reinterpret_cast<const uint4*>(src + r * st + c * V)) : make_uint4(0u, 0u, 0u, 0u);
    }
  }
  __device__ __forceinline__ void store(float* dst, int ld, int rows) const {
#pragma unroll
    for (int j = 0; j < N; ++j) {
      const int e = threadIdx.x + j * kMaxThreads, r = e / PR, c = e - r * PR;
      if (r >= rows) continue;
      union { uint4 raw; T h[8]; } u;
      u.raw = x[j];
      float4* d = reinterpret_cast<float4*>(dst + r * ld + c * V);
      d[0] = make_float4(to_float(u.h[0]), to_float(u.h[1]), to_float(u.h[2]), to_float(u.h[3]));
      d[1] = make_float4(to_float(u.h[4]), to_float(u.h[5]), to_float(u.h[6]), to_float(u.h[7]));
    }
  }
};

// log2 of the lanes each P V sum is split over: as many as keep every thread busy (plan_parallel's rule;
// folded to a constant for a compiled tile).
__device__ __forceinline__ int parallel_split_log(int NV) {
  int sp = 0;
  while (sp < 5 && ((kParallelRows * NV / 4) << (sp + 1)) <= kMaxThreads) ++sp;
  return sp;
}

// DKC = NVC > 0: a compiled tile (D_k = D_v = DKC, rows 16-byte aligned, one column tile): every loop
// bound and pitch a constant, q, k and v staged as float; 0: the run-time instantiation serves every
// other shape and layout, staged in the input dtype.
template <typename scalar_t, int DKC, int NVC>
__global__ void __launch_bounds__(kMaxThreads) parallel_kernel(const ParallelParams p) {
  constexpr bool kCompiled = DKC > 0;
  using stage_t = typename std::conditional<kCompiled, float, scalar_t>::type;
  constexpr int RT = kParallelRows, PAD = 16 / (int)sizeof(stage_t), VE = 16 / (int)sizeof(scalar_t);
  extern __shared__ __align__(16) unsigned char par_smem[];
  const int b = blockIdx.x / p.H, h = blockIdx.x - b * p.H, rt = blockIdx.y, vt = blockIdx.z;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int DKP = kCompiled ? DKC : p.DKP, NV = kCompiled ? NVC : p.NV;
  const bool vec = kCompiled || p.vec;
  const int t0 = rt * RT, L = t0 + RT;  // this tile's first step; steps it stages
  const int j0 = vt * NV, nv = kCompiled ? NV : min(NV, p.Dv - j0), LDK = DKP + PAD, LDV = NV + PAD, LDP = p.L + 4;
  // Layout (parallel_smem): doubles, staged inputs, floats.
  double* Growd = reinterpret_cast<double*>(par_smem);  // RT: prod g[t0..t]; [RT]: prod g[0..t0-1]
  stage_t* Ks = reinterpret_cast<stage_t*>(par_smem + 16 * sizeof(double));  // p.L x LDK
  stage_t* Qs = Ks + p.L * LDK;                                               // RT x LDK
  stage_t* Vs = Qs + RT * LDK;                                                // p.L x LDV
  float* Ps = reinterpret_cast<float*>(Vs + p.L * LDV);  // RT x LDP: M (q . k), zero above the diagonal
  float* Wf = Ps + RT * LDP;                             // p.L: W[s], s < t0
  float* Dt = Wf + p.L;                                  // RT x RT: M[t0 + i][t0 + s'], s' <= i

  const scalar_t* q = static_cast<const scalar_t*>(p.q) + b * p.sq.b + h * p.sq.h;
  const scalar_t* k = static_cast<const scalar_t*>(p.k) + b * p.sk.b + h * p.sk.h;
  const scalar_t* v = static_cast<const scalar_t*>(p.v) + b * p.sv.b + h * p.sv.h + j0 * p.sv.d;
  const GateSeq<scalar_t, !kCompiled> gate(p.gate, b * p.sg.b + h * p.sg.h, p.g32);  // tiles: planned for one dtype
  const GateSeq<scalar_t, !kCompiled> beta(p.beta, b * p.sb.b + h * p.sb.h, p.b32);

  // ---- gates: warp 0's lanes own steps [l E, l E + E) of [0, t0), warp 1's lane i step t0 + i (1 and 0
  // past T); their loads go out first, then every thread's share of q, k and v (cp.async)
  const int E = (t0 + 31) / 32, s_lo = min(lane * E, t0), s_hi = min(s_lo + E, t0);
  float gw[8], bw[8];
  // launched with pdl (sm_90): everything above overlapped the previous kernel; no global access before
  griddep_wait<>();
  griddep_launch<>();
  if (warp == 0) {
    gate.visit([&](auto gp) {
      beta.visit([&](auto bp) {
        gp += (int64_t)s_lo * p.sg.t;
        bp += (int64_t)s_lo * p.sb.t;
#pragma unroll
        for (int e = 0; e < 8; ++e) {
          const bool in = s_lo + e < s_hi;
          gw[e] = in ? to_float(*gp) : 1.f;
          bw[e] = in ? to_float(*bp) : 0.f;
          gp += p.sg.t;  // past the end only where `in` is false, never read
          bp += p.sb.t;
        }
      });
    });
  } else if (warp == 1) {
    const bool in = lane < RT && t0 + lane < p.T;
    gw[0] = in ? gate[(int64_t)(t0 + lane) * p.sg.t] : 1.f;
    bw[0] = in ? beta[(int64_t)(t0 + lane) * p.sb.t] : 0.f;
  }
  const int Lv = min(L, p.T);
  // A compiled tile's rows: 16-byte copies a row, and how many a thread makes (L <= kParallelMaxT rows)
  constexpr int PRK = kCompiled ? DKC / VE : 1, PRV = kCompiled ? NVC / VE : 1, NQ = (RT * PRK + kMaxThreads - 1) / kMaxThreads;
  constexpr bool kConvert = kCompiled && sizeof(scalar_t) == 2;  // 16-bit rows through registers
  TileRows<scalar_t, PRK, NQ> rq;
  TileRows<scalar_t, PRK, PRK> rk;
  TileRows<scalar_t, PRV, PRV> rv;
  if constexpr (kConvert) {
    rq.load(q + (int64_t)t0 * p.sq.t, p.sq.t, Lv - t0);
    rk.load(k, p.sk.t, Lv);
    rv.load(v, p.sv.t, Lv);
  } else if constexpr (kCompiled) {
    TileRows<scalar_t, PRK, NQ>::issue(Qs, LDK, q + (int64_t)t0 * p.sq.t, p.sq.t, Lv - t0, RT);
    TileRows<scalar_t, PRK, PRK>::issue(Ks, LDK, k, p.sk.t, Lv, L);
    TileRows<scalar_t, PRV, PRV>::issue(Vs, LDV, v, p.sv.t, Lv, L);
  } else {
    stage_async<scalar_t>(vec, p.map_k, Qs, LDK, q + (int64_t)t0 * p.sq.t, p.sq.t, p.sq.d, Lv - t0, p.Dk, RT);
    stage_async<scalar_t>(vec, p.map_k, Ks, LDK, k, p.sk.t, p.sk.d, Lv, p.Dk, L);
    stage_async<scalar_t>(vec, p.map_v, Vs, LDV, v, p.sv.t, p.sv.d, Lv, nv, L);
  }
  cp_async_commit<>();

  // ---- gate tables while the copies fly, all in double, each value rounded once
  if (warp == 0) {
    // W[s] = beta_s prod g[s+1..t0-1] for s < t0: each lane's own product, a warp suffix scan joins them
    double own = 1.0;
#pragma unroll
    for (int e = 0; e < 8; ++e) own *= gw[e];
    double suf = own;  // inclusive suffix product over lanes l..31
#pragma unroll
    for (int off = 1; off < 32; off <<= 1) {
      const double z = __shfl_down_sync(0xffffffffu, suf, off);
      if (lane + off < 32) suf *= z;
    }
    double run = __shfl_down_sync(0xffffffffu, suf, 1);  // lanes after this one
    if (lane == 31) run = 1.0;
#pragma unroll
    for (int e = 7; e >= 0; --e) {
      if (s_lo + e < s_hi) Wf[s_lo + e] = (float)(bw[e] * run);
      run *= gw[e];
    }
    if (lane == 0) Growd[RT] = suf;  // prod g[0..t0-1]
  } else if (warp == 1) {
    // Row i of the diagonal block: D[i][s'] = beta prod g[t0+s'+1..t0+i]; Grow[i] = prod g[t0..t0+i].
    double run = 1.0;
#pragma unroll
    for (int s = RT - 1; s >= 0; --s) {
      const float g = __shfl_sync(0xffffffffu, gw[0], s), bb = __shfl_sync(0xffffffffu, bw[0], s);
      if (s <= lane && lane < RT) {
        Dt[lane * RT + s] = (float)(bb * run);
        run *= g;
      }
    }
    if (lane < RT) Growd[lane] = run;
  }
  if constexpr (kConvert) {
    rq.store(Qs, LDK, RT);
    rk.store(Ks, LDK, L);
    rv.store(Vs, LDV, L);
  }
  cp_async_wait<0>();
  __syncthreads();  // B1: staged, tables written

  // ---- P = M (q_t . k_s): thread (row pair rp, column cq) computes rows 2 rp, 2 rp + 1 at s = cq + CS m,
  // selected, not multiplied, above the diagonal (a NaN in q . k must not leak into a masked entry)
  constexpr int RP = RT / 2, CS = kMaxThreads / RP;
  const int rp = tid % RP, cq = tid / RP;
#pragma unroll 1
  for (int s = cq; s < L; s += CS) {
    const stage_t* kr = Ks + s * LDK;
    const stage_t* q0 = Qs + 2 * rp * LDK;
    float d0 = 0.f, d1 = 0.f;
#pragma unroll(kCompiled ? DKC / 4 : 2)
    for (int c = 0; c < DKP; c += 4) {
      const float4 kk = lds4(kr + c), a = lds4(q0 + c), e = lds4(q0 + LDK + c);
      d0 = fmaf(a.x, kk.x, fmaf(a.y, kk.y, fmaf(a.z, kk.z, fmaf(a.w, kk.w, d0))));
      d1 = fmaf(e.x, kk.x, fmaf(e.y, kk.y, fmaf(e.z, kk.z, fmaf(e.w, kk.w, d1))));
    }
    const int i = 2 * rp;
    const float w = s < t0 ? Wf[s] : 0.f;
    Ps[i * LDP + s] = s < t0 ? d0 * w : s <= t0 + i ? d0 * Dt[i * RT + s - t0] : 0.f;
    Ps[(i + 1) * LDP + s] = s < t0 ? d1 * w : s <= t0 + i + 1 ? d1 * Dt[(i + 1) * RT + s - t0] : 0.f;
  }
  __syncthreads();  // B2: P

  // ---- y = Grow[t] (P V)_{s < t0} + (P V)_{t0 <= s <= t} + A[t] (q_t^T S_0): thread (row i, columns
  // 4 jg .. 4 jg + 3, lane sp of SP), the sums over s split across the SP lanes, joined by shuffles
  const int sp_log = kCompiled ? parallel_split_log(NV) : p.sp_log;
  const int SP = 1 << sp_log, sp = tid & (SP - 1), NG = NV / 4, total = RT * NG;
  const double before = Growd[RT];
#pragma unroll 1
  for (int base = 0; base < total; base += kMaxThreads >> sp_log) {  // uniform across the block
    const int combo = base + (tid >> sp_log), i = combo % RT, jg = combo / RT, t = t0 + i;
    const bool active = combo < total;
    float off[4] = {0.f, 0.f, 0.f, 0.f}, dg[4] = {0.f, 0.f, 0.f, 0.f}, s0[4] = {0.f, 0.f, 0.f, 0.f};
    if (active) {
      const float* pr = Ps + i * LDP;
      const stage_t* vc = Vs + 4 * jg;
#pragma unroll 4
      for (int s = sp; s < t0; s += SP) {
        const float w = pr[s];
        const float4 x = lds4(vc + s * LDV);
        off[0] = fmaf(w, x.x, off[0]); off[1] = fmaf(w, x.y, off[1]);
        off[2] = fmaf(w, x.z, off[2]); off[3] = fmaf(w, x.w, off[3]);
      }
#pragma unroll 1
      for (int s = t0 + sp; s <= t; s += SP) {
        const float w = pr[s];
        const float4 x = lds4(vc + s * LDV);
        dg[0] = fmaf(w, x.x, dg[0]); dg[1] = fmaf(w, x.y, dg[1]);
        dg[2] = fmaf(w, x.z, dg[2]); dg[3] = fmaf(w, x.w, dg[3]);
      }
      if (p.s_in != nullptr) {
        const float* si = p.s_in + b * p.ssi.b + h * p.ssi.h + (j0 + 4 * jg) * p.ssi.j;
#pragma unroll 1
        for (int c = sp; c < p.Dk; c += SP) {
          const float qc = to_float(Qs[i * LDK + c]);
#pragma unroll
          for (int u = 0; u < 4; ++u)
            if (4 * jg + u < nv) s0[u] = fmaf(qc, si[c * p.ssi.i + u * p.ssi.j], s0[u]);
        }
      }
    }
    const float grow = (float)Growd[i], a = (float)(before * Growd[i]);
    float y[4];
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      // with no initial state a * 0: NaN where a gate up to t is NaN or inf, as the recurrence
      y[u] = fmaf(a, s0[u], fmaf(grow, off[u], dg[u]));
      for (int o = 1; o < SP; o <<= 1) y[u] += __shfl_xor_sync(0xffffffffu, y[u], o);
    }
    if (active && sp == 0 && t < p.T) {
      scalar_t* yr = static_cast<scalar_t*>(p.y) + b * p.sy.b + h * p.sy.h + (int64_t)t * p.sy.t + (j0 + 4 * jg) * p.sy.d;
      if (kCompiled || (p.vec_y && 4 * jg + 3 < nv)) {  // y is ours: contiguous, rows aligned when D_v % 4 == 0
        if constexpr (sizeof(scalar_t) == 4)
          *reinterpret_cast<float4*>(yr) = make_float4(y[0], y[1], y[2], y[3]);
        else
          *reinterpret_cast<uint2*>(yr) = make_uint2(pack2<scalar_t>(y[0], y[1]), pack2<scalar_t>(y[2], y[3]));
      } else {
#pragma unroll
        for (int u = 0; u < 4; ++u)
          if (4 * jg + u < nv) yr[u * p.sy.d] = from_float<scalar_t>(y[u]);
      }
    }
  }

  // ---- the final state, from the last row tile: S_T = A[T-1] S_0 + sum_s M[T-1][s] k_s v_s^T
  if (p.s_out == nullptr || rt != p.rtiles - 1) return;
  const int il = p.T - 1 - t0;  // the last step's row in this tile
  const float gl = (float)Growd[il], al = (float)(before * Growd[il]);
#pragma unroll 1
  for (int e = tid; e < p.Dk * NG; e += kMaxThreads) {
    const int i = e / NG, jg = e - i * NG;
    float acc[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll 2
    for (int s = 0; s < p.T; ++s) {
      const float w = (s < t0 ? Wf[s] * gl : Dt[il * RT + s - t0]) * to_float(Ks[s * LDK + i]);
      const float4 x = lds4(Vs + s * LDV + 4 * jg);
      acc[0] = fmaf(w, x.x, acc[0]); acc[1] = fmaf(w, x.y, acc[1]);
      acc[2] = fmaf(w, x.z, acc[2]); acc[3] = fmaf(w, x.w, acc[3]);
    }
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      const int j = 4 * jg + u;
      if (j >= nv) continue;
      // all * 0 without an initial state, as the other kernels (NaN where a gate is NaN or inf)
      const float sin = p.s_in != nullptr ? p.s_in[b * p.ssi.b + h * p.ssi.h + i * p.ssi.i + (j0 + j) * p.ssi.j] : 0.f;
      p.s_out[b * p.sso.b + h * p.sso.h + i * p.sso.i + (j0 + j) * p.sso.j] = fmaf(al, sin, acc[u]);
    }
  }
}

// One thread's start and step over a tile whose rows hold per_row copies.
inline StageMap stage_map(int per_row) {
  return {per_row, kMaxThreads / per_row, kMaxThreads % per_row, 1.f / (float)per_row};
}

template <typename scalar_t>
cudaError_t launch_parallel(const Plan& pl, const Problem& pr, cudaStream_t s) {
  ParallelParams p;
  static_cast<Problem&>(p) = pr;
  p.vtiles = pl.vtiles; p.rtiles = pl.rtiles; p.NV = pl.NV; p.DKP = pl.DKP; p.vec = pl.vec;
  p.L = pl.rtiles * kParallelRows;
  p.vec_y = pr.sy.d == 1 && pr.Dv % 4 == 0;
  p.sp_log = pl.sp_log;
  const int V = pl.vec ? 16 / (int)sizeof(scalar_t) : 1;
  p.map_k = stage_map(pl.DKP / V);
  p.map_v = stage_map(pl.NV / V);
  // grid (b * H + h, row tile, column tile): no divisions to find them
  const dim3 grid((unsigned)pr.BH, (unsigned)pl.rtiles, (unsigned)pl.vtiles);
#define GR_CASE(D_)                                                                   \
  if (pl.DK == D_) {                                                                  \
    static bool done[64] = {};                                                        \
    const auto kernel = parallel_kernel<scalar_t, D_, D_>;                            \
    const cudaError_t err = pl.smem > 48 * 1024 ? allow_smem(kernel, done) : cudaSuccess; \
    return err != cudaSuccess ? err : launch_ex(kernel, grid, pl.smem, s, pl.pdl, p); \
  }
  GR_CASE(0)
  GR_PARALLEL_TILES(GR_CASE)
#undef GR_CASE
  return cudaErrorInvalidValue;
}

}  // namespace
}  // namespace gr

// The core unit's entry point: the recurrent and parallel kernels.
extern "C" int gr_execute_core(const gr::Plan* pl, const gr::Problem* pr, float*, cudaStream_t s,
                               const char** failed) {
  using namespace gr;
  const bool rec = pl->kernel == Kernel::recurrent;
  *failed = rec ? "recurrent" : "parallel";
  switch (pl->dtype) {
    case DType::f32: return (int)(rec ? launch_recurrent<float, false>(*pl, *pr, s) : launch_parallel<float>(*pl, *pr, s));
    case DType::f16: return (int)(rec ? launch_recurrent<__half, false>(*pl, *pr, s) : launch_parallel<__half>(*pl, *pr, s));
    case DType::bf16:
      return (int)(rec ? launch_recurrent<__nv_bfloat16, false>(*pl, *pr, s) : launch_parallel<__nv_bfloat16>(*pl, *pr, s));
  }
  return (int)cudaErrorInvalidValue;
}
"""

CHUNK_SRC = r"""
// ===================================== chunk: what both chunk kernels share =================
// Chunkwise-parallel form. Within a chunk of C steps starting from state S (t, s in 0..C-1):
//   L[t][s] = prod_{r=s+1..t} g_r (s <= t),  A[t] = prod_{r=0..t} g_r,  w[s] = prod_{r=s+1..C-1} g_r
//   y_t   = sum_{s<=t} L[t][s] beta_s (q_t . k_s) v_s  +  A[t] (q_t^T S)
//   S_new = A[C-1] S + sum_s (w[s] beta_s k_s) v_s^T
// Decays are direct products of gates (never logs or quotients), so gates of 0, < 0 or > 1 are exact.
// A (b, h) sequence is cut into nseg segments of seg_chunks chunks. With nseg > 1 a state phase
// (mode 1) computes each segment's own state contribution and gate product, segment_scan chains them,
// and the output phase (mode 0) runs every segment from its start state.
// Grid: one block per (b, h, segment, column tile of NV state columns), the column tile fastest; a
// block walks the chunks of its segment in order with its D_k x NV slice of S in shared memory.
namespace gr {
namespace {

// One chunk's gate tables, consecutive arrays of C = 32 floats (ltab 16 C): rowd[t] = prod g[0..t],
// kscale[s] = beta_s prod g[s+1..31], the in-block prefix (pin) and suffix (sout) products of 16-step
// blocks, beta (bsm), and ltab[t][s % 16] = prod g[s+1..t] within a block.
// Templates below (<int = 0>): a unit that runs its own chunk schedule (chunk_sm90) compiles no copy.
struct GateTables { const float *rowd, *kscale, *pin, *sout, *bsm, *ltab; };
template <int = 0>
__device__ __forceinline__ GateTables gate_tables_at(const float* t) {
  return {t, t + kChunk, t + 2 * kChunk, t + 3 * kChunk, t + 4 * kChunk, t + 5 * kChunk};
}

// Writes the tables at t from one warp: lane s holds step s's gate g_reg and beta b_reg. The prefix,
// suffix and in-block products come from warp shuffles in Acc = double, each value rounded once (ltab,
// at most 15 factors within a 16-step block, stays a float running product): in fp32 a scan tree
// squares equal partial products, so a constant gate's rounding errors add up coherently (31 ulps at 32
// steps), and the chunk decays carry them along the whole sequence (fp32 rel-L2 2.1e-5 at T = 2100 with
// gate 1.002 in every segmentation, even with s_update_strip's FMA; 2.3e-6 with both).
// Inclusive prefix (pre) and suffix (suf) products over a warp's 32 lanes and within segments of SEG lanes
// (bpre, bsuf), by shuffles (Hillis-Steele), in the caller's type. chunk_sm90's tables use it too.
// FULL false: the segments' scans only (pre and suf untouched); SEG 1: the full scans only.
template <int SEG, typename Acc, bool FULL = true>
__device__ __forceinline__ void warp_scans(Acc& pre, Acc& suf, Acc& bpre, Acc& bsuf, int lane) {
  const unsigned full = 0xffffffffu;
#pragma unroll
  for (int off = 1; off < (FULL ? 32 : SEG); off <<= 1) {
    if (FULL) {
      const Acc x = __shfl_up_sync(full, pre, off), z = __shfl_down_sync(full, suf, off);
      if (lane >= off) pre *= x;
      if (lane + off < 32) suf *= z;
    }
    if (off < SEG) {
      const Acc x2 = __shfl_up_sync(full, bpre, off), z2 = __shfl_down_sync(full, bsuf, off);
      if ((lane & (SEG - 1)) >= off) bpre *= x2;
      if ((lane & (SEG - 1)) + off < SEG) bsuf *= z2;
    }
  }
}

template <typename Acc = double>
__device__ __forceinline__ void write_gate_tables(float* t, float g_reg, float b_reg, int lane) {
  float *rowd = t, *kscale = t + kChunk, *pin = t + 2 * kChunk, *sout = t + 3 * kChunk, *bsm = t + 4 * kChunk;
  float* ltab = t + 5 * kChunk;
  const unsigned full = 0xffffffffu;
  Acc pre = g_reg, suf = g_reg, bpre = g_reg, bsuf = g_reg;
  warp_scans<16>(pre, suf, bpre, bsuf, lane);
  const Acc suf_ex = __shfl_down_sync(full, suf, 1), bsuf_ex = __shfl_down_sync(full, bsuf, 1);
  rowd[lane] = (float)pre;
  kscale[lane] = (float)(b_reg * (lane == 31 ? Acc(1) : suf_ex));
  pin[lane] = (float)bpre;
  sout[lane] = (lane & 15) == 15 ? 1.f : (float)bsuf_ex;
  bsm[lane] = b_reg;
  const int base = lane & ~15, sl = lane & 15;  // lane = column s of its 16-block
  float run = 1.f;
#pragma unroll
  for (int r = 0; r < 16; ++r) {
    const float gt = __shfl_sync(full, g_reg, base + r);
    if (r > sl) run *= gt;
    ltab[(base + r) * 16 + sl] = r >= sl ? run : 0.f;
  }
}

// Entry (t, s) of the masked, decayed, beta-weighted product from its q . k accumulator d: zero above
// the diagonal (selected, not multiplied: a NaN in q . k must not leak into a masked entry).
template <int = 0>
__device__ __forceinline__ float masked_entry(float d, int t, int s, const GateTables& gt) {
  if (s > t) return 0.f;
  return d * (((t >> 4) == (s >> 4) ? gt.ltab[t * 16 + (s & 15)] : gt.pin[t] * gt.sout[s]) * gt.bsm[s]);
}

struct ChunkParams : Problem {
  int DKP;          // D_k rounded up to 16
  int vtiles;       // ceil(D_v / NV) column tiles
  int nseg, seg_chunks;
  int seg_launch;   // segments in this launch: nseg (outputs) or nseg - 1 (states)
  int mode;         // 0: outputs, 1: segment states only
  int vec_qk, vec_v, vec_y;  // 16-byte accesses are legal for q and k / v / y
  float* seg_states;  // (B, H, nseg - 1, D_k, D_v): contributions, then (after the scan) end states
  float* seg_decays;  // (B, H, nseg - 1)
};

// Segments of a sequence of len steps: the plan's nseg, or in varlen (nseg then a capacity) as many
// segments of seg_chunks chunks as it needs, at least one, the last taking any chunks beyond the capacity.
template <int = 0>
__device__ __forceinline__ int seg_count(const ChunkParams& p, int len, bool varlen = true) {
  if (!varlen || p.cu == nullptr) return p.nseg;
  const int chunks = (len + kChunk - 1) / kChunk;
  return max(1, min(p.nseg, (chunks + p.seg_chunks - 1) / p.seg_chunks));
}

// The block's coordinates and pointers; len and nseg_n: its sequence's steps and segments (varlen: the
// sequence's own; else T and nseg). varlen is a compile-time constant at every construction (the kernels'
// VARLEN): the dense instantiations keep T and nseg as kernel parameters, which cost no registers (at
// the 128-register cap a per-block length cost chunk_tf32 2-5%).
template <typename scalar_t>
struct ChunkBlock {
  int vt, seg, h, b, j0, nv, len, nseg_n;
  int64_t bh, bos;  // bos: the sequence's first step in the packed row (varlen; else 0)
  bool varlen;
  const scalar_t *q, *k, *v;
  GateSeq<scalar_t> gate, beta;
  scalar_t* y;
  __device__ __forceinline__ ChunkBlock(const ChunkParams& p, int NV, bool varlen_)
      : varlen(varlen_), gate(p.gate, 0, p.g32), beta(p.beta, 0, p.b32) {
    int blk = blockIdx.x;
    vt = blk % p.vtiles;
    blk /= p.vtiles;
    seg = blk % p.seg_launch;
    blk /= p.seg_launch;
    h = blk % p.H;
    b = blk / p.H;
    j0 = vt * NV;
    nv = min(NV, p.Dv - j0);
    bh = (int64_t)b * p.H + h;
    const SeqRange sr = varlen ? seq_range(p, b) : SeqRange{0, p.T};
    len = sr.len;
    bos = sr.bos;
    nseg_n = seg_count(p, len, varlen);
    q = static_cast<const scalar_t*>(p.q) + b * p.sq.b + sr.bos * p.sq.t + h * p.sq.h;
    k = static_cast<const scalar_t*>(p.k) + b * p.sk.b + sr.bos * p.sk.t + h * p.sk.h;
    v = static_cast<const scalar_t*>(p.v) + b * p.sv.b + sr.bos * p.sv.t + h * p.sv.h + j0 * p.sv.d;
    gate = GateSeq<scalar_t>(p.gate, b * p.sg.b + sr.bos * p.sg.t + h * p.sg.h, p.g32);
    beta = GateSeq<scalar_t>(p.beta, b * p.sb.b + sr.bos * p.sb.t + h * p.sb.h, p.b32);
    y = static_cast<scalar_t*>(p.y) + b * p.sy.b + sr.bos * p.sy.t + h * p.sy.h + j0 * p.sy.d;
  }
  // varlen: past its sequence's segments (the grid holds the capacity), a block has nothing to do
  __device__ __forceinline__ bool idle(const ChunkParams& p) const {
    return varlen && seg >= nseg_n - (p.mode != 0 ? 1 : 0);
  }
  __device__ __forceinline__ float* segment_state(const ChunkParams& p, int s) const {
    return p.seg_states + (bh * (p.nseg - 1) + s) * ((int64_t)p.Dk * p.Dv);
  }
};

// The state slice (DKP x NV) at the segment's start: the caller's initial state (segment 0 of the output
// phase), the scanned end state of the previous segment, or zero (the state phase computes each
// segment's own contribution).
template <typename scalar_t, typename State>
__device__ __forceinline__ void init_state(const State& st, int DKP, int NV, const ChunkParams& p,
                                           const ChunkBlock<scalar_t>& cb) {
  const float* s0 = nullptr;
  StateStrides s0s{0, 0, 0, 0};
  if (p.mode == 0 && cb.seg == 0) {
    s0 = p.s_in; s0s = p.ssi;
  } else if (p.mode == 0) {
    s0 = cb.segment_state(p, cb.seg - 1);
    s0s = {0, 0, p.Dv, 1};
  }
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, warps = blockDim.x >> 5;
  for (int i = warp; i < DKP; i += warps)
    for (int j = lane; j < NV; j += 32) {
      float x = 0.f;
      if (s0 != nullptr && i < p.Dk && j < cb.nv) x = s0[cb.b * s0s.b + cb.h * s0s.h + i * s0s.i + (cb.j0 + j) * s0s.j];
      st.set(i, j, x);
    }
}

// After the last chunk: the final state (last segment of the output phase), or the segment's own
// contribution and gate product (state phase).
template <typename scalar_t, typename State>
__device__ __forceinline__ void leave_state(const State& st, const ChunkParams& p, const ChunkBlock<scalar_t>& cb,
                                            float seg_decay) {
  float* dst = nullptr;
  StateStrides ds{0, 0, 0, 0};
  if (p.mode == 0 && cb.seg == cb.nseg_n - 1 && p.s_out != nullptr) {
    dst = p.s_out; ds = p.sso;
  } else if (p.mode != 0) {
    dst = cb.segment_state(p, cb.seg);
    ds = {0, 0, p.Dv, 1};
    if (cb.vt == 0 && threadIdx.x == 0) p.seg_decays[cb.bh * (p.nseg - 1) + cb.seg] = seg_decay;
  }
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, warps = blockDim.x >> 5;
  if (dst == nullptr) return;
  if (cb.varlen && cb.len == 0) {
    // an empty sequence ran no chunk: its initial state as given (the family's copy of it may be rounded,
    // chunk_bf16's split, and no barrier followed its writes)
    for (int i = warp; i < p.Dk; i += warps)
      for (int j = lane; j < cb.nv; j += 32)
        dst[cb.b * ds.b + cb.h * ds.h + i * ds.i + (cb.j0 + j) * ds.j] =
            p.s_in != nullptr ? p.s_in[cb.b * p.ssi.b + cb.h * p.ssi.h + i * p.ssi.i + (cb.j0 + j) * p.ssi.j] : 0.f;
    return;
  }
  for (int i = warp; i < p.Dk; i += warps)
    for (int j = lane; j < cb.nv; j += 32) dst[cb.b * ds.b + cb.h * ds.h + i * ds.i + (cb.j0 + j) * ds.j] = st.get(i, j);
}

// Gate and beta of step t0 + i into g, b: 1 and 0 (an identity step) past the sequence's end.
template <typename scalar_t>
__device__ __forceinline__ void load_gate_beta(const ChunkParams& p, const ChunkBlock<scalar_t>& cb, int t0, int i,
                                               int tc, float& g, float& b) {
  g = 1.f;
  b = 0.f;
  if (i < tc) {
    g = cb.gate[(int64_t)(t0 + i) * p.sg.t];
    b = cb.beta[(int64_t)(t0 + i) * p.sb.t];
  }
}

// y for steps [t0, t0 + tc) from the fp32 staged Ys; with `diagonal`, plus the diagonal 16x16 blocks
// of the masked product Ps in fp32 FMAs (s <= t only: a masked zero never meets a non-finite v). VEC
// (y's rows 16-byte aligned, unit column stride): without the diagonal, 16 bytes a store.
template <typename scalar_t, int C, int NV, bool VEC>
__device__ __forceinline__ void write_y(scalar_t* y, const ChunkParams& p, const float* Ys, int ldv, const float* Ps,
                                        int ldc, const float* Vs, int t0, int tc, int nv, bool diagonal) {
  if (VEC && !diagonal) {
    constexpr int V = 16 / (int)sizeof(scalar_t), PER_ROW = NV / V, N = (C * PER_ROW + kMaxThreads - 1) / kMaxThreads;
#pragma unroll
    for (int u = 0; u < N; ++u) {
      const int e = threadIdx.x + u * kMaxThreads, t = e / PER_ROW, j = (e % PER_ROW) * V;
      if (t < tc && j < nv) {  // t < tc also bounds e
        union { uint4 raw; scalar_t x[V]; } w;
#pragma unroll
        for (int i = 0; i < V; ++i) w.x[i] = from_float<scalar_t>(Ys[t * ldv + j + i]);
        *reinterpret_cast<uint4*>(y + (int64_t)(t0 + t) * p.sy.t + j) = w.raw;
      }
    }
    return;
  }
  for (int e = threadIdx.x; e < C * NV; e += blockDim.x) {
    const int t = e / NV, j = e % NV;
    float acc = Ys[t * ldv + j];
    if (diagonal) {
      const int s0d = t & ~15;
#pragma unroll
      for (int r = 0; r < 16; ++r)
        if (s0d + r <= t) acc = fmaf(Ps[t * ldc + s0d + r], Vs[(s0d + r) * ldv + j], acc);
    }
    if (t < tc && j < nv) y[(int64_t)(t0 + t) * p.sy.t + j * p.sy.d] = from_float<scalar_t>(acc);
  }
}

// Strips per row block of S in the S update: as many as the warps allow (a power of two <= NT8).
template <int = 0>
__host__ __device__ constexpr int s_splits(int MI, int NT8, int warps) {
  int ssplit = 1;
  while (ssplit * 2 <= NT8 && MI * ssplit * 2 <= warps) ssplit *= 2;
  return ssplit;
}

template <int N> struct Width {};  // a strip width as a type

// The schedule both chunk kernels run. A block walks the chunks of its segment in order:
//   stage the chunk (the family's stage(); B1 = __syncthreads_or of its "v not finite" flag),
//   with outputs the family's products (P = masked q k^T, B2, Y = P V + A q S, B3),
//   S = A[C-1] S + (w beta k)^T V in 16-row strips spread over the warps (skipped after the segment's
//   last chunk unless that state is read), with outputs the family's y stores, B4.
// Family (ChunkTF32, ChunkBF16) supplies DKP, state(), tables(set), begin(), stage(), outputs(),
// s_update() and epilogue(); `set` (0 or 1) alternates by chunk for double-buffered families.
template <int NV, typename scalar_t, typename Family>
__device__ __forceinline__ void run_chunks(const ChunkParams& p, const ChunkBlock<scalar_t>& cb, Family& f) {
  constexpr int C = kChunk, WARPS = kMaxThreads / 32, NT8 = NV / 8;
  // The warp index through a shuffle: provably warp-uniform, so the mma.sync under `warp` branches
  // needs no convergence handling (WARPSYNC / ENDCOLLECTIVE stubs in the SASS otherwise).
  const int warp = __shfl_sync(0xffffffffu, (int)threadIdx.x >> 5, 0), lane = threadIdx.x & 31;
  init_state(f.state(), f.DKP, NV, p, cb);
  // S update: row block mi of S, n-tiles n0 .. n0 + sgn - 1 (of 8 columns), ssplit strips per row block.
  const int MI = f.DKP / 16, ssplit = s_splits(MI, NT8, WARPS);
  const int sgn = NT8 / ssplit, s_tasks = MI * ssplit;
  const bool last_seg = cb.seg == cb.nseg_n - 1;
  const bool keep_state = p.mode != 0 || (last_seg && p.s_out != nullptr);
  const int chunks = (cb.len + C - 1) / C, c_begin = cb.seg * p.seg_chunks;
  const int c_end = last_seg ? chunks : min(c_begin + p.seg_chunks, chunks);
  float seg_decay = 1.f;
  f.begin(c_begin, c_end, warp, lane);
  for (int ch = c_begin; ch < c_end; ++ch) {
    const int t0 = ch * C, tc = min(C, cb.len - t0), set = (ch - c_begin) & 1;
    const bool vbad = __syncthreads_or(f.stage(ch, c_end, set, t0, tc, warp, lane));  // B1
    const GateTables gt = f.tables(set);
    const float chunk_decay = gt.rowd[C - 1];
    seg_decay *= chunk_decay;
    if (p.mode == 0) f.outputs(ch, c_end, set, t0, tc, vbad, gt, warp, lane);  // B2, B3 inside
    for (int task = warp; task < (ch + 1 < c_end || keep_state ? s_tasks : 0); task += WARPS) {
      const int mi = task / ssplit, n0 = (task - (task / ssplit) * ssplit) * sgn;
      switch (sgn) {  // the strip width as a constant: no per-tile branches between the mma chains
        case 1: f.s_update(Width<1>{}, set, mi, n0, gt.kscale, chunk_decay, lane); break;
        case 2: f.s_update(Width<2>{}, set, mi, n0, gt.kscale, chunk_decay, lane); break;
        case 4: f.s_update(Width<4>{}, set, mi, n0, gt.kscale, chunk_decay, lane); break;
        default: f.s_update(Width<NT8>{}, set, mi, n0, gt.kscale, chunk_decay, lane); break;
      }
    }
    if (p.mode == 0) f.epilogue(t0, tc, vbad);
    __syncthreads();  // B4
  }
  leave_state(f.state(), p, cb, seg_decay);
}

}  // namespace
}  // namespace gr
"""

SEGMENT_SCAN_SRC = r"""
// ===================================== segment_scan: sequence parallelism ===================
namespace gr {
namespace {

// Turns each segment's own state contribution into the state at its end, in place:
// S = initial (or 0); for each segment s but the last: S = decay_s S + contribution_s; store S.
__global__ void __launch_bounds__(kMaxThreads) segment_scan_kernel(const ChunkParams p) {
  griddep_wait<>();  // launched with pdl behind the state phase
  griddep_launch<>();
  const int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  const int64_t per_head = (int64_t)p.Dk * p.Dv;
  if (e >= p.BH * per_head) return;
  const int64_t bh = e / per_head, ij = e - bh * per_head;
  const int i = (int)(ij / p.Dv), j = (int)(ij - (ij / p.Dv) * p.Dv);
  const int b = (int)(bh / p.H), h = (int)(bh - (bh / p.H) * p.H);
  const int nseg = seg_count(p, seq_range(p, b).len);  // varlen: this sequence's segments
  float S = p.s_in != nullptr ? p.s_in[b * p.ssi.b + h * p.ssi.h + i * p.ssi.i + j * p.ssi.j] : 0.f;
  float* st = p.seg_states + bh * (p.nseg - 1) * per_head + ij;
  const float* dec = p.seg_decays + bh * (p.nseg - 1);
  // Eight segments' loads before their stores: one memory round trip per eight segments, not one
  // per segment (a load after a store to the same array is not moved above it by the compiler).
  constexpr int U = 8;
  for (int s0 = 0; s0 < nseg - 1; s0 += U) {
    float x[U], d[U];
#pragma unroll
    for (int u = 0; u < U; ++u)
      if (s0 + u < nseg - 1) { x[u] = st[(s0 + u) * per_head]; d[u] = dec[s0 + u]; }
#pragma unroll
    for (int u = 0; u < U; ++u)
      if (s0 + u < nseg - 1) {
        S = fmaf(d[u], S, x[u]);
        st[(s0 + u) * per_head] = S;
      }
  }
}

// ---- a chunk plan's launches. Kernels::get<NV, DK, VARLEN>() names a family's instantiation.
template <typename Kernels>
cudaError_t launch_chunk_kernel(const Plan& pl, const ChunkParams& p, int64_t blocks, bool pdl, cudaStream_t s) {
#define GR_CASE(NV_, DK_)                                                                  \
  if (pl.NV == NV_ && pl.DK == DK_) {                                                      \
    static bool done[2][64] = {};                                                          \
    const bool vl = p.cu != nullptr;                                                       \
    const auto kernel = vl ? Kernels::template get<NV_, DK_, true>() : Kernels::template get<NV_, DK_, false>(); \
    const cudaError_t err = allow_smem(kernel, done[vl]);                                  \
    return err != cudaSuccess ? err : launch_ex(kernel, dim3((unsigned)blocks), pl.smem, s, pdl, p); \
  }
  GR_CHUNK_INSTANCES(GR_CASE)
#undef GR_CASE
  return cudaErrorInvalidValue;
}

// With segments: the state phase, segment_scan, then the output phase (the last two as programmatic
// dependent launches behind our own kernels when the plan says pdl, which hides their launch latency).
template <typename Kernels>
cudaError_t execute_chunks(const Plan& pl, const Problem& pr, float* work, cudaStream_t s, const char** failed) {
  ChunkParams p;
  static_cast<Problem&>(p) = pr;
  p.DKP = pl.DKP; p.vtiles = pl.vtiles; p.nseg = pl.nseg; p.seg_chunks = pl.seg_chunks;
  p.vec_qk = pl.vec_qk; p.vec_v = pl.vec_v; p.vec_y = pl.vec_y;
  p.seg_states = work;
  p.seg_decays = work != nullptr ? work + pr.BH * (pl.nseg - 1) * ((int64_t)pr.Dk * pr.Dv) : nullptr;
  if (pl.nseg > 1) {
    p.mode = 1; p.seg_launch = pl.nseg - 1;
    *failed = "state phase";
    cudaError_t err = launch_chunk_kernel<Kernels>(pl, p, p.BH * p.seg_launch * p.vtiles, false, s);
    if (err != cudaSuccess) return err;
    *failed = "segment_scan";
    const int64_t n = p.BH * p.Dk * p.Dv;
    err = launch_ex(segment_scan_kernel, dim3((unsigned)((n + kMaxThreads - 1) / kMaxThreads)), 0, s, pl.pdl, p);
    if (err != cudaSuccess) return err;
  }
  p.mode = 0; p.seg_launch = pl.nseg;
  *failed = "output phase";
  return launch_chunk_kernel<Kernels>(pl, p, pl.blocks, pl.pdl, s);
}

}  // namespace
}  // namespace gr
"""

CHUNK_TF32_SRC = r"""
// ===================================== chunk_tf32: float32 and float16 on TF32 mma.sync =====
// TF32_MMA_SRC's products. Knowing the accumulator layout, the mask, the decays and beta are applied to P in registers, the
// decayed q rows become a scale of the (q S) accumulator rows, and w[s] beta_s scales the k' fragment
// as it is loaded, so no sweep over shared memory rescales anything. The diagonal 16x16 blocks of the
// masked product go through the tensor cores unless the chunk's v holds a NaN or inf (then fp32 FMAs,
// so that a masked zero never meets it). fp32 inputs: 3xTF32 (hi/lo split); fp16: one TF32 product
// (TF32 holds fp16 values exactly).
namespace gr {
namespace {

// The block's state slice in shared memory: fp32 at pitch ld.
struct StateF32 {
  float* s; int ld;
  __device__ __forceinline__ void set(int i, int j, float x) const { s[i * ld + j] = x; }
  __device__ __forceinline__ float get(int i, int j) const { return s[i * ld + j]; }
};

// A ROWS x COLS tile (compile-time) of a source with unit column stride and 16-byte aligned rows,
// held in registers between load() and store(): a caller issues every tile's loads before the first
// store, so a chunk waits for one memory round trip, not one per tile. Zero outside
// rows_valid x cols_valid (cols_valid a multiple of 16 bytes' worth).
template <typename scalar_t, int ROWS, int COLS>
struct TileRegs {
  static constexpr int V = 16 / (int)sizeof(scalar_t), PER_ROW = COLS / V, TOTAL = ROWS * PER_ROW;
  static constexpr int N = (TOTAL + kMaxThreads - 1) / kMaxThreads;
  uint4 buf[N];
  __device__ __forceinline__ void load(const scalar_t* __restrict__ src, int64_t st, int rows_valid, int cols_valid) {
#pragma unroll
    for (int u = 0; u < N; ++u) {
      const int e = threadIdx.x + u * kMaxThreads, r = e / PER_ROW, c = (e % PER_ROW) * V;
      buf[u] = make_uint4(0u, 0u, 0u, 0u);
      if (e < TOTAL && r < rows_valid && c < cols_valid) buf[u] = __ldg(reinterpret_cast<const uint4*>(src + r * st + c));
    }
  }
  // As float at pitch ld (a multiple of 4); returns whether a stored value is NaN or inf (CHECK only).
  template <bool CHECK>
  __device__ __forceinline__ bool store(float* dst, int ld) const {
    bool bad = false;
#pragma unroll
    for (int u = 0; u < N; ++u) {
      const int e = threadIdx.x + u * kMaxThreads, r = e / PER_ROW, c = (e % PER_ROW) * V;
      if (TOTAL % kMaxThreads == 0 || e < TOTAL) {
        union { uint4 raw; scalar_t x[V]; } w;
        w.raw = buf[u];
#pragma unroll
        for (int i = 0; i < V; i += 4) {
          const float4 f = make_float4(to_float(w.x[i]), to_float(w.x[i + 1]), to_float(w.x[i + 2]), to_float(w.x[i + 3]));
          if (CHECK) bad |= !(finite(f.x) && finite(f.y) && finite(f.z) && finite(f.w));
          *reinterpret_cast<float4*>(dst + r * ld + c + i) = f;
        }
      }
    }
    return bad;
  }
};

// The chunk_tf32 family's phases for run_chunks (one set of buffers: `set` is unused).
template <typename scalar_t, int NV, int DK>
struct ChunkTF32 {
  static constexpr int C = kChunk, YN = NV / 32, LDV = NV + 8, LDC = C + 4;
  static constexpr bool SPLIT = std::is_same<scalar_t, float>::value;
  // Pitches: 4 mod 32 floats for operands read as row-major A or col-major B (q, k, P), 8 mod 32 for
  // row-major B (v, S): fragment loads then hit 32 different banks.
  const ChunkParams& p;
  const ChunkBlock<scalar_t>& cb;
  const int DKP, LDK;
  float *Qs, *Ks, *Vs, *Ys, *Ss, *Ps, *tabs;
  __device__ __forceinline__ ChunkTF32(const ChunkParams& p_, const ChunkBlock<scalar_t>& cb_, float* buf)
      : p(p_), cb(cb_), DKP(DK > 0 ? DK : p_.DKP), LDK(DKP + 4) {
    Qs = buf;                // C x LDK
    Ks = Qs + C * LDK;       // C x LDK
    Vs = Ks + C * LDK;       // C x LDV
    Ys = Vs + C * LDV;       // C x LDV
    Ss = Ys + C * LDV;       // DKP x LDV
    Ps = Ss + DKP * LDV;     // C x LDC: masked, decayed, beta-weighted q . k
    tabs = Ps + C * LDC;     // the gate tables
  }
  __device__ __forceinline__ StateF32 state() const { return {Ss, LDV}; }
  __device__ __forceinline__ GateTables tables(int) const { return gate_tables_at(tabs); }
  __device__ __forceinline__ void begin(int, int, int, int) {}

  // k (and q with outputs) as C x DKP, v as C x NV; gate and beta of step threadIdx.x loaded first (in
  // flight while the tiles load), then the gate tables on warp 0. DK > 0 (D_k compiled; aligned rows
  // only) issues all of a chunk's loads before the first store (TileRegs).
  __device__ __forceinline__ bool stage(int, int, int, int t0, int tc, int warp, int lane) {
    float g_reg, b_reg;
    load_gate_beta(p, cb, t0, threadIdx.x, tc, g_reg, b_reg);
    bool v_bad;
    if constexpr (DK > 0) {
      TileRegs<scalar_t, C, DK> kr, qr;
      TileRegs<scalar_t, C, NV> vr;
      kr.load(cb.k + (int64_t)t0 * p.sk.t, p.sk.t, tc, p.Dk);
      if (p.mode == 0) qr.load(cb.q + (int64_t)t0 * p.sq.t, p.sq.t, tc, p.Dk);
      vr.load(cb.v + (int64_t)t0 * p.sv.t, p.sv.t, tc, cb.nv);
      kr.template store<false>(Ks, LDK);
      if (p.mode == 0) qr.template store<false>(Qs, LDK);
      v_bad = vr.template store<true>(Vs, LDV);
    } else {
      load_tile_any<scalar_t>(p.vec_qk, Ks, LDK, cb.k + (int64_t)t0 * p.sk.t, p.sk.t, p.sk.d, tc, p.Dk, kChunk, DKP);
      if (p.mode == 0)
        load_tile_any<scalar_t>(p.vec_qk, Qs, LDK, cb.q + (int64_t)t0 * p.sq.t, p.sq.t, p.sq.d, tc, p.Dk, kChunk, DKP);
      v_bad = load_tile_any<scalar_t>(p.vec_v, Vs, LDV, cb.v + (int64_t)t0 * p.sv.t, p.sv.t, p.sv.d, tc, cb.nv, kChunk, NV);
    }
    if (warp == 0) write_gate_tables(tabs, g_reg, b_reg, lane);
    return v_bad;
  }

  // P tiles (16 x 8) on or below the diagonal, masked and decayed in registers (warps 0-5), B2, then
  // Y = M V + A[t] (q S) staged in Ys, B3.
  __device__ __forceinline__ void outputs(int, int, int, int, int, bool vbad, const GateTables& gt, int warp,
                                          int lane) {
    const int g = lane >> 2, q4 = lane & 3;
    if (warp < 6) {
      const int pb = warp < 2 ? 0 : 1, pn = warp < 2 ? warp : warp - 2;
      float d[4] = {0.f, 0.f, 0.f, 0.f};
      qk_tile<SPLIT>(d, Qs + pb * 16 * LDK, Ks + pn * 8 * LDK, LDK, DKP, lane);
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int t = pb * 16 + g + 8 * half;
        const int s = pn * 8 + 2 * q4;
        *reinterpret_cast<float2*>(Ps + t * LDC + s) =
            make_float2(masked_entry(d[2 * half], t, s, gt), masked_entry(d[2 * half + 1], t, s + 1, gt));
      }
    }
    __syncthreads();  // B2

    const int yb = warp >> 2, yn0 = (warp & 3) * YN;
    float mv[YN][4], qs[YN][4];
#pragma unroll
    for (int n = 0; n < YN; ++n)
#pragma unroll
      for (int i = 0; i < 4; ++i) { mv[n][i] = 0.f; qs[n][i] = 0.f; }
    // The masked product's k range: up to the diagonal block (included unless v is not finite);
    // each range a constant, so the strip unrolls.
    const float* pr = Ps + yb * 16 * LDC;
    const float* vr = Vs + yn0 * 8;
    if (yb + (vbad ? 0 : 1) == 2) row_strip<SPLIT, YN>(mv, pr, LDC, vr, LDV, 32, g, q4);
    else if (yb + (vbad ? 0 : 1) == 1) row_strip<SPLIT, YN>(mv, pr, LDC, vr, LDV, 16, g, q4);
    row_strip<SPLIT, YN>(qs, Qs + yb * 16 * LDK, LDK, Ss + yn0 * 8, LDV, DKP, g, q4);
    const float r0 = gt.rowd[yb * 16 + g], r1 = gt.rowd[yb * 16 + g + 8];
#pragma unroll
    for (int n = 0; n < YN; ++n) {
      const int col = (yn0 + n) * 8 + 2 * q4;
      *reinterpret_cast<float2*>(Ys + (yb * 16 + g) * LDV + col) =
          make_float2(fmaf(r0, qs[n][0], mv[n][0]), fmaf(r0, qs[n][1], mv[n][1]));
      *reinterpret_cast<float2*>(Ys + (yb * 16 + g + 8) * LDV + col) =
          make_float2(fmaf(r1, qs[n][2], mv[n][2]), fmaf(r1, qs[n][3], mv[n][3]));
    }
    __syncthreads();  // B3: Y staged, every read of the old S done
  }

  // k' = w beta k is scaled while its fragment loads.
  template <int N>
  __device__ __forceinline__ void s_update(Width<N>, int, int mi, int n0, const float* kscale, float decay, int lane) {
    s_update_strip<SPLIT, N>(Ss + mi * 16 * LDV + n0 * 8, LDV, Ks + mi * 16, LDK, Vs + n0 * 8, kscale, decay,
                             lane >> 2, lane & 3);
  }

  // y (fp32 FMAs on the diagonal blocks when this chunk's v is not finite).
  __device__ __forceinline__ void epilogue(int t0, int tc, bool vbad) {
    write_y<scalar_t, C, NV, (DK > 0)>(cb.y, p, Ys, LDV, Ps, LDC, Vs, t0, tc, cb.nv, vbad);
  }
};

// DK: D_k padded to 16 as a compile-time constant (every loop unrolls), or 0 for any D_k at run time.
// VARLEN: packed sequences (cu_seqlens), each block reading its own bounds.
template <typename scalar_t, int NV, int DK, bool VARLEN>
__global__ void __launch_bounds__(kMaxThreads, 2) chunk_tf32_kernel(const ChunkParams p) {
  extern __shared__ __align__(128) float chunk_tf32_smem_buf[];
  // The output phase after segment_scan starts early (pdl): it waits here for the scanned states.
  griddep_wait<>();
  griddep_launch<>();
  const ChunkBlock<scalar_t> cb(p, NV, VARLEN);
  if (cb.idle(p)) return;
  ChunkTF32<scalar_t, NV, DK> f(p, cb, chunk_tf32_smem_buf);
  run_chunks<NV>(p, cb, f);
}

template <typename scalar_t>
struct ChunkTF32Kernels {
  template <int NV, int DK, bool VARLEN>
  static auto get() { return chunk_tf32_kernel<scalar_t, NV, DK, VARLEN>; }
};

}  // namespace
}  // namespace gr

extern "C" int gr_execute_chunk_tf32(const gr::Plan* pl, const gr::Problem* pr, float* work, cudaStream_t s,
                                     const char** failed) {
  using namespace gr;
  return (int)(pl->dtype == DType::f32 ? execute_chunks<ChunkTF32Kernels<float>>(*pl, *pr, work, s, failed)
                                       : execute_chunks<ChunkTF32Kernels<__half>>(*pl, *pr, work, s, failed));
}
"""

CHUNK_BF16_SRC = r"""
// ===================================== chunk_bf16: bfloat16 on bf16 mma.sync ===============
// chunk_tf32's schedule on bf16 mma.sync m16n8k16 with fp32 accumulation. q, k and v are staged as
// their raw bf16 values, so each of their fragments is one ldmatrix (.trans for v, and for k as the
// state update's A operand). The fp32 operands (the masked product P, the state S, the scaled keys
// w beta k) are split into two bf16 terms, hi = bf16(x) and lo = bf16(x - hi), 16 significant bits
// together, each multiplied by an exact bf16 input: y's error stays that of its own bf16 rounding,
// where one bf16 term would add about 2^-9 per product. S itself is kept as such a pair (a rel-L2
// error near 1e-5 in the returned fp32 state, far below y's bf16 rounding), which frees the shared
// memory for two staging buffers. fp16 inputs stay on chunk_tf32: TF32 holds fp16 values exactly and
// has fp32's range, while fp16 terms of S and P overflow at 65504 (gates above 1 get there).
namespace gr {
namespace {

__device__ __forceinline__ void mma_bf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
  __trap();  // bf16 mma.sync is sm_80+; make_plan never picks chunk_bf16 below (the unit still compiles)
#else
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#endif
}

// Eight raw bf16 values, all finite (exponent bits not all ones).
__device__ __forceinline__ bool finite_bf16x8(const uint4& w) {
  bool ok = true;
  const uint32_t x[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) ok = ok && (x[i] & 0x7f80u) != 0x7f80u && (x[i] & 0x7f800000u) != 0x7f800000u;
  return ok;
}

__device__ __forceinline__ float bf16_lo(uint32_t x) { return __uint_as_float(x << 16); }
__device__ __forceinline__ float bf16_hi(uint32_t x) { return __uint_as_float(x & 0xffff0000u); }

// This lane's row address for an x4 ldmatrix of the 16x16 b16 block at p (pitch ld): tiles (rows 0-7,
// cols 0-7), (8-15, 0-7), (0-7, 8-15), (8-15, 8-15). Plain, that is the row-major A fragment a0..a3;
// transposed, on a row-major k x n block, the B fragments (b0, b1) of n-tiles 0 and 1.
__device__ __forceinline__ const __nv_bfloat16* ldm_row(const __nv_bfloat16* p, int ld, int lane) {
  return p + ((lane & 7) + ((lane >> 3) & 1) * 8) * ld + (lane >> 4) * 8;
}

// B fragments (k 16 x n 8) of N n-tiles of the row-major bf16 block at p (k rows, pitch ld).
template <int N>
__device__ __forceinline__ void frag_b_kn(uint32_t (&b)[N][2], const __nv_bfloat16* p, int ld, int lane) {
#pragma unroll
  for (int n = 0; n + 1 < N; n += 2) {
    uint32_t r[4];
    ldm4<true>(r, ldm_row(p + n * 8, ld, lane));
    b[n][0] = r[0]; b[n][1] = r[1]; b[n + 1][0] = r[2]; b[n + 1][1] = r[3];
  }
  if constexpr (N % 2 == 1) {  // the last tile alone (tiles 2 and 3 repeat 0 and 1)
    uint32_t r[4];
    ldm4<true>(r, p + (N - 1) * 8 + ((lane & 7) + ((lane >> 3) & 1) * 8) * ld);
    b[N - 1][0] = r[0]; b[N - 1][1] = r[1];
  }
}

// 32 rows x cols of a bf16 source (row stride st, column stride sd) as raw values at pitch ld, zero
// outside rows_valid x cols_valid; 16 bytes a load with `vec` (rows 16-byte aligned, cols_valid a
// multiple of 8). CHECK: returns whether this thread stored a NaN or inf.
template <bool CHECK>
__device__ __forceinline__ bool raw_tile(bool vec, __nv_bfloat16* dst, int ld, const __nv_bfloat16* src, int64_t st,
                                         int64_t sd, int rows_valid, int cols_valid, int cols) {
  bool bad = false;
  if (vec) {
    const int per_row = cols / 8;
    for (int e = threadIdx.x; e < kChunk * per_row; e += blockDim.x) {
      const int r = e / per_row, c = (e - r * per_row) * 8;
      uint4 w = make_uint4(0u, 0u, 0u, 0u);
      if (r < rows_valid && c < cols_valid) w = __ldg(reinterpret_cast<const uint4*>(src + r * st + c));
      if (CHECK) bad |= !finite_bf16x8(w);
      *reinterpret_cast<uint4*>(dst + r * ld + c) = w;
    }
  } else {
    for (int e = threadIdx.x; e < kChunk * cols; e += blockDim.x) {
      const int r = e / cols, c = e - r * cols;
      __nv_bfloat16 x = __float2bfloat16_rn(0.f);
      if (r < rows_valid && c < cols_valid) x = src[r * st + c * sd];
      if (CHECK) bad |= !finite(__bfloat162float(x));
      dst[r * ld + c] = x;
    }
  }
  return bad;
}

// A 32 x COLS raw bf16 tile (16-byte aligned rows, unit column stride) by cp.async, zero outside
// rows_valid x cols_valid. This thread copies the 16-byte pieces threadIdx.x + 256 u.
template <int COLS>
__device__ __forceinline__ void tile_async(__nv_bfloat16* dst, int ld, const __nv_bfloat16* src, int64_t st,
                                           int rows_valid, int cols_valid) {
  constexpr int PER_ROW = COLS / 8, TOTAL = 32 * PER_ROW;
#pragma unroll
  for (int e0 = 0; e0 < TOTAL; e0 += kMaxThreads) {
    const int e = e0 + threadIdx.x, r = e / PER_ROW, c = (e % PER_ROW) * 8;
    const bool ok = r < rows_valid && c < cols_valid;
    if (TOTAL % kMaxThreads == 0 || e < TOTAL) cp_async<16>(dst + r * ld + c, src + (ok ? r * st + c : 0), ok);
  }
}

// Whether the pieces of such a tile that this thread copied (and has waited for) hold a NaN or inf.
template <int COLS>
__device__ __forceinline__ bool tile_bad(const __nv_bfloat16* dst, int ld) {
  constexpr int PER_ROW = COLS / 8, TOTAL = 32 * PER_ROW;
  bool bad = false;
#pragma unroll
  for (int e0 = 0; e0 < TOTAL; e0 += kMaxThreads) {
    const int e = e0 + threadIdx.x, r = e / PER_ROW, c = (e % PER_ROW) * 8;
    if (TOTAL % kMaxThreads == 0 || e < TOTAL) bad |= !finite_bf16x8(*reinterpret_cast<const uint4*>(dst + r * ld + c));
  }
  return bad;
}

// The block's state slice in shared memory as the bf16 pair hi + lo (set() splits, get() sums).
struct StateSplit {
  __nv_bfloat16 *hi, *lo; int ld;
  __device__ __forceinline__ void set(int i, int j, float x) const {
    const __nv_bfloat16 h = __float2bfloat16_rn(x);
    const float d = x - __bfloat162float(h);
    hi[i * ld + j] = h;
    lo[i * ld + j] = __float2bfloat16_rn(d == d ? d : 0.f);  // as split_bf16x2
  }
  __device__ __forceinline__ float get(int i, int j) const {
    return __bfloat162float(hi[i * ld + j]) + __bfloat162float(lo[i * ld + j]);
  }
};

// One warp's strip of S (16 rows x N tiles of 8 columns, held as the pair Sh + Sl): S = decay S +
// (w beta k)^T v over the chunk, the scaled keys split into hi + lo.
template <int N>
__device__ __forceinline__ void s_update_strip_bf16(__nv_bfloat16* shp, __nv_bfloat16* slp, int ldh,
                                                    const __nv_bfloat16* kc, int ldk, const __nv_bfloat16* vc,
                                                    const float* kscale, float decay, int lane) {
  const int g = lane >> 2, q4 = lane & 3;
  float acc[N][4];
#pragma unroll
  for (int n = 0; n < N; ++n) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int o = (g + 8 * r) * ldh + n * 8 + 2 * q4;
      const uint32_t h = *reinterpret_cast<const uint32_t*>(shp + o), l = *reinterpret_cast<const uint32_t*>(slp + o);
      acc[n][2 * r] = (bf16_lo(h) + bf16_lo(l)) * decay;
      acc[n][2 * r + 1] = (bf16_hi(h) + bf16_hi(l)) * decay;
    }
  }
#pragma unroll
  for (int s0 = 0; s0 < 32; s0 += 16) {
    // A = (w beta k)^T, 16 rows of D_k x 16 steps: k's tiles transposed; a0, a1 hold steps 2q, 2q + 1,
    // a2, a3 steps 2q + 8, 2q + 9.
    uint32_t kr[4], ah[4], al[4];
    ldm4<true>(kr, kc + (s0 + (lane >> 4) * 8 + (lane & 7)) * ldk + ((lane >> 3) & 1) * 8);
    const float w0 = kscale[s0 + 2 * q4], w1 = kscale[s0 + 2 * q4 + 1];
    const float w2 = kscale[s0 + 2 * q4 + 8], w3 = kscale[s0 + 2 * q4 + 9];
    split_bf16x2(bf16_lo(kr[0]) * w0, bf16_hi(kr[0]) * w1, ah[0], al[0]);
    split_bf16x2(bf16_lo(kr[1]) * w0, bf16_hi(kr[1]) * w1, ah[1], al[1]);
    split_bf16x2(bf16_lo(kr[2]) * w2, bf16_hi(kr[2]) * w3, ah[2], al[2]);
    split_bf16x2(bf16_lo(kr[3]) * w2, bf16_hi(kr[3]) * w3, ah[3], al[3]);
    uint32_t vb[N][2];
    frag_b_kn<N>(vb, vc + s0 * ldh, ldh, lane);
#pragma unroll
    for (int n = 0; n < N; ++n) {
      mma_bf16(acc[n], ah, vb[n][0], vb[n][1]);
      mma_bf16(acc[n], al, vb[n][0], vb[n][1]);
    }
  }
#pragma unroll
  for (int n = 0; n < N; ++n) {
    const int c = n * 8 + 2 * q4;
    uint32_t h0, l0, h1, l1;
    split_bf16x2(acc[n][0], acc[n][1], h0, l0);
    split_bf16x2(acc[n][2], acc[n][3], h1, l1);
    *reinterpret_cast<uint32_t*>(shp + g * ldh + c) = h0;
    *reinterpret_cast<uint32_t*>(slp + g * ldh + c) = l0;
    *reinterpret_cast<uint32_t*>(shp + (g + 8) * ldh + c) = h1;
    *reinterpret_cast<uint32_t*>(slp + (g + 8) * ldh + c) = l1;
  }
}

// The chunk_bf16 family's phases for run_chunks. With DK > 0 (16-byte aligned rows) the next chunk's
// q, k, v, gate and beta are in flight (cp.async into the other of two staging buffers, `set`) while
// this chunk computes, warp GW computes the next chunk's gate tables while warps 0-5 compute P (two
// sets of tables), and y is stored from the registers of the warps that computed it.
template <int NV, int DK>
struct ChunkBF16 {
  using bf16 = __nv_bfloat16;
  static constexpr int C = kChunk, YN = NV / 32;
  static constexpr int LDV = NV + 8, LDP = C + 8;  // pitch of the state's and v's rows (fp32 Ys too), P's pitch
  static constexpr int GW = 6;                      // the warp that computes the next chunk's gate tables
  const ChunkParams& p;
  const ChunkBlock<bf16>& cb;
  const int DKP, DKQ, LDK, stage_size;
  float *Ys, *tabs;
  bf16 *Ph, *Pl, *Sh, *Sl, *stage0;
  float g_next = 1.f, b_next = 0.f;  // the next chunk's gate and beta (lanes of warp GW)
  __device__ __forceinline__ ChunkBF16(const ChunkParams& p_, const ChunkBlock<bf16>& cb_, float* buf)
      : p(p_), cb(cb_), DKP(DK > 0 ? DK : p_.DKP), DKQ((DKP + 31) & ~31), LDK(DKQ + 8),
        stage_size(2 * C * LDK + C * LDV) {
    Ys = buf;                                       // C x LDV (run-time D_k only)
    tabs = Ys + C * LDV;                            // two sets of gate tables
    Ph = reinterpret_cast<bf16*>(tabs + 2 * kGateTableFloats);  // C x LDP: the masked product split in two
    Pl = Ph + C * LDP;
    Sh = Pl + C * LDP;                              // DKP x LDV: the state split in two
    Sl = Sh + DKP * LDV;
    stage0 = Sl + DKP * LDV;                        // staging buffer(s): q, k as C x LDK, v as C x LDV
  }
  __device__ __forceinline__ StateSplit state() const { return {Sh, Sl, LDV}; }
  __device__ __forceinline__ GateTables tables(int set) const { return gate_tables_at(tabs + set * kGateTableFloats); }
  __device__ __forceinline__ bf16* qbuf(int set) const { return stage0 + (DK > 0 ? set : 0) * stage_size; }

  // Chunk ch into staging buffer sb by cp.async, its gate and beta into g_next, b_next (warp GW).
  __device__ __forceinline__ void issue(int ch, int sb, int warp, int lane) {
    const int t0 = ch * C, tc = min(C, cb.len - t0);
    bf16* Qb = qbuf(sb);
    g_next = 1.f;
    b_next = 0.f;
    if (warp == GW) load_gate_beta(p, cb, t0, lane, tc, g_next, b_next);
    tile_async<DK>(Qb + C * LDK, LDK, cb.k + (int64_t)t0 * p.sk.t, p.sk.t, tc, p.Dk);
    if (p.mode == 0) tile_async<DK>(Qb, LDK, cb.q + (int64_t)t0 * p.sq.t, p.sq.t, tc, p.Dk);
    tile_async<NV>(Qb + 2 * C * LDK, LDV, cb.v + (int64_t)t0 * p.sv.t, p.sv.t, tc, cb.nv);
    cp_async_commit<>();
  }
  __device__ __forceinline__ void begin(int c_begin, int c_end, int warp, int lane) {
    if constexpr (DK > 0) {
      if (c_begin < c_end) issue(c_begin, 0, warp, lane);
      if (p.mode == 0 && warp == GW) write_gate_tables(tabs, g_next, b_next, lane);  // later sets: during P
    }
  }
  __device__ __forceinline__ bool stage(int ch, int c_end, int set, int t0, int tc, int warp, int lane) {
    bf16* Qh = qbuf(set);
    if constexpr (DK > 0) {
      const float g_reg = g_next, b_reg = b_next;
      // The other buffer was last read before the previous chunk's final barrier.
      if (ch + 1 < c_end) issue(ch + 1, set ^ 1, warp, lane);
      else cp_async_commit<>();  // an empty group keeps "all but the newest group" meaning this chunk
      if (p.mode != 0 && warp == GW) write_gate_tables(tabs + set * kGateTableFloats, g_reg, b_reg, lane);
      cp_async_wait<1>();
      return tile_bad<NV>(Qh + 2 * C * LDK, LDV);
    } else {
      float g_reg, b_reg;
      load_gate_beta(p, cb, t0, threadIdx.x, tc, g_reg, b_reg);
      raw_tile<false>(p.vec_qk, Qh + C * LDK, LDK, cb.k + (int64_t)t0 * p.sk.t, p.sk.t, p.sk.d, tc, p.Dk, DKQ);
      if (p.mode == 0) raw_tile<false>(p.vec_qk, Qh, LDK, cb.q + (int64_t)t0 * p.sq.t, p.sq.t, p.sq.d, tc, p.Dk, DKQ);
      const bool v_bad =
          raw_tile<true>(p.vec_v, Qh + 2 * C * LDK, LDV, cb.v + (int64_t)t0 * p.sv.t, p.sv.t, p.sv.d, tc, cb.nv, NV);
      if (warp == 0) write_gate_tables(tabs + set * kGateTableFloats, g_reg, b_reg, lane);
      return v_bad;
    }
  }

  // P tiles (16 x 8) on or below the diagonal: q k^T exact in fp32, masked and decayed in registers,
  // stored split (warps 0-5; warp GW meanwhile writes the next chunk's gate tables), B2, then
  // Y = M V + A[t] (q S), stored from registers (DK > 0: y's rows 16-byte aligned) or staged in Ys, B3.
  __device__ __forceinline__ void outputs(int ch, int c_end, int set, int t0, int tc, bool vbad, const GateTables& gt,
                                          int warp, int lane) {
    const int g = lane >> 2, q4 = lane & 3;
    const bf16* Qh = qbuf(set);
    const bf16* Kh = Qh + C * LDK;
    const bf16* Vh = Kh + C * LDK;
    if (warp < 6) {
      const int pb = warp < 2 ? 0 : 1, pn = warp < 2 ? warp : warp - 2;
      float d[4] = {0.f, 0.f, 0.f, 0.f}, d2[4] = {0.f, 0.f, 0.f, 0.f};
      const bf16* A = Qh + pb * 16 * LDK;
      const bf16* Bk = Kh + pn * 8 * LDK;
#pragma unroll 4
      for (int kk = 0; kk < DKQ; kk += 32) {
        uint32_t kb[4], a[4], a2[4];  // kb: B = K^T for k columns kk .. kk + 31 (rows of K are its columns)
        ldm4(kb, Bk + (lane & 7) * LDK + kk + (lane >> 3) * 8);
        ldm4(a, ldm_row(A + kk, LDK, lane));
        ldm4(a2, ldm_row(A + kk + 16, LDK, lane));
        mma_bf16(d, a, kb[0], kb[1]);
        mma_bf16(d2, a2, kb[2], kb[3]);
      }
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int t = pb * 16 + g + 8 * half, s = pn * 8 + 2 * q4;
        uint32_t hi, lo;
        split_bf16x2(masked_entry(d[2 * half] + d2[2 * half], t, s, gt),
                     masked_entry(d[2 * half + 1] + d2[2 * half + 1], t, s + 1, gt), hi, lo);
        *reinterpret_cast<uint32_t*>(Ph + t * LDP + s) = hi;
        *reinterpret_cast<uint32_t*>(Pl + t * LDP + s) = lo;
      }
    } else if (DK > 0 && warp == GW && ch + 1 < c_end) {
      // The next chunk's (that set was last read in the previous chunk).
      write_gate_tables(tabs + (set ^ 1) * kGateTableFloats, g_next, b_next, lane);
    }
    __syncthreads();  // B2

    const int yb = warp >> 2, yn0 = (warp & 3) * YN;
    float mv[YN][4], ml[YN][4], qs[YN][4], ql[YN][4];
#pragma unroll
    for (int n = 0; n < YN; ++n)
#pragma unroll
      for (int i = 0; i < 4; ++i) { mv[n][i] = 0.f; ml[n][i] = 0.f; qs[n][i] = 0.f; ql[n][i] = 0.f; }
    // The masked product up to the diagonal block, included unless this chunk's v is not finite.
    const int kend = (yb + (vbad ? 0 : 1)) * 16;
#pragma unroll
    for (int k0 = 0; k0 < C; k0 += 16) {
      if (k0 < kend) {
        uint32_t ph[4], pl[4], vb[YN][2];
        ldm4(ph, ldm_row(Ph + yb * 16 * LDP + k0, LDP, lane));
        ldm4(pl, ldm_row(Pl + yb * 16 * LDP + k0, LDP, lane));
        frag_b_kn<YN>(vb, Vh + k0 * LDV + yn0 * 8, LDV, lane);
#pragma unroll
        for (int n = 0; n < YN; ++n) {
          mma_bf16(mv[n], ph, vb[n][0], vb[n][1]);
          mma_bf16(ml[n], pl, vb[n][0], vb[n][1]);
        }
      }
    }
#pragma unroll 4
    for (int kk = 0; kk < DKP; kk += 16) {
      uint32_t a[4], sh[YN][2], sl[YN][2];
      ldm4(a, ldm_row(Qh + yb * 16 * LDK + kk, LDK, lane));
      frag_b_kn<YN>(sh, Sh + kk * LDV + yn0 * 8, LDV, lane);
      frag_b_kn<YN>(sl, Sl + kk * LDV + yn0 * 8, LDV, lane);
#pragma unroll
      for (int n = 0; n < YN; ++n) {
        mma_bf16(qs[n], a, sh[n][0], sh[n][1]);
        mma_bf16(ql[n], a, sl[n][0], sl[n][1]);
      }
    }
    if (vbad) {  // the diagonal block in fp32 FMAs, s <= t only: a masked zero never meets a non-finite v
#pragma unroll
      for (int n = 0; n < YN; ++n)
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int t = yb * 16 + g + 8 * (i >> 1), j = (yn0 + n) * 8 + 2 * q4 + (i & 1);
          float acc = 0.f;
          for (int s = yb * 16; s <= t; ++s)
            acc = fmaf(__bfloat162float(Ph[t * LDP + s]) + __bfloat162float(Pl[t * LDP + s]),
                       __bfloat162float(Vh[s * LDV + j]), acc);
          mv[n][i] += acc;
        }
    }
    const float r0 = gt.rowd[yb * 16 + g], r1 = gt.rowd[yb * 16 + g + 8];
#pragma unroll
    for (int n = 0; n < YN; ++n) {
      const int col = (yn0 + n) * 8 + 2 * q4;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int t = yb * 16 + g + 8 * h;
        const float r = h ? r1 : r0;
        const float y0 = fmaf(r, qs[n][2 * h] + ql[n][2 * h], mv[n][2 * h] + ml[n][2 * h]);
        const float y1 = fmaf(r, qs[n][2 * h + 1] + ql[n][2 * h + 1], mv[n][2 * h + 1] + ml[n][2 * h + 1]);
        if constexpr (DK > 0) {
          if (t < tc && col < cb.nv)  // nv is a multiple of 8 here
            *reinterpret_cast<__nv_bfloat162*>(cb.y + (int64_t)(t0 + t) * p.sy.t + col) = __floats2bfloat162_rn(y0, y1);
        } else {
          *reinterpret_cast<float2*>(Ys + t * LDV + col) = make_float2(y0, y1);
        }
      }
    }
    __syncthreads();  // B3: every read of the old S done (and Y staged)
  }

  template <int N>
  __device__ __forceinline__ void s_update(Width<N>, int set, int mi, int n0, const float* kscale, float decay,
                                           int lane) {
    const bf16* Kh = qbuf(set) + C * LDK;
    s_update_strip_bf16<N>(Sh + mi * 16 * LDV + n0 * 8, Sl + mi * 16 * LDV + n0 * 8, LDV, Kh + mi * 16, LDK,
                           Kh + C * LDK + n0 * 8, kscale, decay, lane);
  }

  __device__ __forceinline__ void epilogue(int t0, int tc, bool) {
    if (DK == 0) write_y<bf16, C, NV, false>(cb.y, p, Ys, LDV, nullptr, 0, nullptr, t0, tc, cb.nv, false);
  }
};

template <int NV, int DK, bool VARLEN>
__global__ void __launch_bounds__(kMaxThreads, 2) chunk_bf16_kernel(const ChunkParams p) {
  extern __shared__ __align__(128) float chunk_bf16_smem_buf[];
  griddep_wait<>();  // the output phase after segment_scan (pdl)
  griddep_launch<>();
  const ChunkBlock<__nv_bfloat16> cb(p, NV, VARLEN);
  if (cb.idle(p)) return;
  ChunkBF16<NV, DK> f(p, cb, chunk_bf16_smem_buf);
  run_chunks<NV>(p, cb, f);
}

struct ChunkBF16Kernels {
  template <int NV, int DK, bool VARLEN>
  static auto get() { return chunk_bf16_kernel<NV, DK, VARLEN>; }
};

}  // namespace
}  // namespace gr

extern "C" int gr_execute_chunk_bf16(const gr::Plan* pl, const gr::Problem* pr, float* work, cudaStream_t s,
                                     const char** failed) {
  return (int)gr::execute_chunks<gr::ChunkBF16Kernels>(*pl, *pr, work, s, failed);
}
"""


def _wgmma(n, rs, tb, zero, kind="bf16", ta=0):
    """One wgmma with fp32 accumulators d[n / 2], as an inline function for WGMMA_SRC: kind "bf16" (m64n{n}k16,
    named by n: wgmma_rs64...), "f16" (the same on fp16 operands, named wgmma_h_rs64...: chunk_bwd_sm90_fp32's) or
    "tf32" (m64n{n}k8, an overload on d's size: wgmma_tf32_rs...; TF32 has no transpose, so tb is 0; the dev/
    probes build the SS forms too, tools/sm90_build.py). SS (A and B shared-memory descriptors) or RS (A as four
    registers); tb: B is MN-major (transposed). zero: d = A B with d output only (the compiler keeps no earlier
    value of it alive), else d += A B, or d = A B where scale_d is 0. ta: A MN-major in shared memory (bf16 and f16
    SS only; named _a)."""
    assert not ta or (not rs and kind in ("bf16", "f16"))
    regs = n // 2
    outs = ",".join(f"%{i}" for i in range(regs))
    trans = "" if kind == "tf32" else f", {tb}"
    if rs:
        a, b, sc = f"{{%{regs},%{regs + 1},%{regs + 2},%{regs + 3}}}", f"%{regs + 4}", f"%{regs + 5}"
        ins, tail, sig = '"r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), ', f"p, 1, 1{trans}", \
            "const uint32_t (&a)[4], uint64_t db"
    else:
        a, b, sc = f"%{regs}", f"%{regs + 1}", f"%{regs + 2}"
        ins, tail, sig = '"l"(da), "l"(db), ', f"p, 1, 1{f', {ta}' if trans else ''}{trans}", "uint64_t da, uint64_t db"
    ins += '"r"(0)' if zero else '"r"(scale_d)'
    outs_c = ", ".join(f'"{"=" if zero else "+"}f"(d[{i}])' for i in range(regs))
    shape = f"m64n{n}k8.f32.tf32.tf32" if kind == "tf32" else f"m64n{n}k16.f32.{kind}.{kind}"
    body = (f'asm volatile("{{\\n.reg .pred p;\\nsetp.ne.b32 p, {sc}, 0;\\n'
            f'wgmma.mma_async.sync.aligned.{shape} {{{outs}}}, {a}, {b}, {tail};\\n}}\\n"'
            f' : {outs_c} : {ins});')
    name = (f"wgmma_tf32_{'rs' if rs else 'ss'}{'_z' if zero else ''}" if kind == "tf32" else
            f"wgmma_{'h_' if kind == 'f16' else ''}{'rs' if rs else 'ss'}{n}{'_a' if ta else ''}{'_t' if tb else ''}"
            f"{'_z' if zero else ''}")
    # (a template: a unit that issues only some forms compiles no other and warns of none)
    return (f"template <int = 0>\n__device__ __forceinline__ void {name}(float (&d)[{regs}], {sig}"
            f"{'' if zero else ', int scale_d'}) {{\n"
            f"#ifdef GR_WGMMA\n  {body}\n#endif\n}}\n")


# One k-step of a TF32 RS product in TERMS terms: hi hi (1), + hi lo + lo hi (3: 3xTF32, fp32-level error; lo =
# x - hi of A's and B's values); the first k-step overwrites d.
WGMMA_TF32_SRC = r"""
template <int TERMS, int N>
__device__ __forceinline__ void rs_terms(float (&d)[N], const uint32_t (&ah)[4], const uint32_t (&al)[4], uint64_t bh,
                                         uint64_t bl, bool first) {
  if (first) wgmma_tf32_rs_z(d, ah, bh);
  else wgmma_tf32_rs(d, ah, bh, 1);
  if constexpr (TERMS == 3) {
    wgmma_tf32_rs(d, ah, bl, 1);
    wgmma_tf32_rs(d, al, bh, 1);
  }
}
"""


# chunk_sm90's wgmma instructions (n, RS, B MN-major, zero), generated: each spells out its accumulators.
WGMMA_FORMS = ((64, False, 0, True), (64, False, 0, False), (64, True, 0, True), (64, True, 0, False),
               (64, True, 1, True), (64, True, 1, False))
# The warpgroup's helpers: fence, commit and wait around asynchronous wgmma, the setmaxnreg moves of a
# warp-specialised kernel's registers, the async-proxy fence, the accumulator pin and the warpgroup barrier
# (dev/tf32_probe.py builds on them too).
WGMMA_SYNC_SRC = r"""
__device__ __forceinline__ void wg_fence() {
#ifdef GR_WGMMA
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void wg_commit() {
#ifdef GR_WGMMA
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#endif
}
template <int N>
__device__ __forceinline__ void wg_wait() {
#ifdef GR_WGMMA
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
#endif
}
template <int N>
__device__ __forceinline__ void maxnreg_inc() {
#ifdef GR_WGMMA
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N));
#endif
}
template <int N>
__device__ __forceinline__ void maxnreg_dec() {
#ifdef GR_WGMMA
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N));
#endif
}
// Thread-written shared memory that wgmma (the async proxy) reads next.
__device__ __forceinline__ void fence_async_smem() {
#ifdef GR_WGMMA
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}
// Keeps the compiler from moving reads or writes of accumulators across a wgmma wait or issue.
template <int N>
__device__ __forceinline__ void acc_fence(float (&d)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i])::"memory");
}
template <int = 0>
__device__ __forceinline__ void wg_barrier(int wg) {  // the 128 threads of one warpgroup
  asm volatile("bar.sync %0, 128;\n" ::"r"(1 + wg) : "memory");
}
"""
# The bf16 units' transposing store of accumulator blocks (the y staging and both 16-bit checkpoint writers).
STSM_SRC = r"""
// Four 8 x 8 blocks of fp32 pairs rounded to bf16 (F16: times `scale`, rounded to fp16) and stored transposed by
// stmatrix: v[2 m], v[2 m + 1] are this lane's pair of block m (its row g, columns 2 q, 2 q + 1 of an accumulator);
// a is the shared address of the row this lane gives: row lane % 8 of block lane / 8, 16 bytes. (A template: a unit
// with no such store warns of none.)
template <bool F16 = false>
__device__ __forceinline__ void stsm_x4_trans(uint32_t a, const float (&v)[8], float scale = 1.f) {
  uint32_t x[4];
#pragma unroll
  for (int m = 0; m < 4; ++m) {
    if constexpr (F16) {
      const __half2 h = __floats2half2_rn(v[2 * m] * scale, v[2 * m + 1] * scale);
      x[m] = *reinterpret_cast<const uint32_t*>(&h);
    } else {
      const __nv_bfloat162 h = __floats2bfloat162_rn(v[2 * m], v[2 * m + 1]);
      x[m] = *reinterpret_cast<const uint32_t*>(&h);
    }
  }
  asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(a), "r"(x[0]),
               "r"(x[1]), "r"(x[2]), "r"(x[3]) : "memory");
}
// A 16-bit checkpoint's column block (one warp's 16 dv columns, 128 dk rows; kCk16): fp16 of S 2^s, 2^s the power of
// two that puts the block's largest finite |S| below 2^14, with 2^-s stored beside the blocks. fp16's 11 bits where
// bf16 has 8: dgate's term c0 = <G, S> cancels under long memory (gates near and above 1), where S rounded to bf16
// took dgate past its bar; the scale keeps fp16's range on S's. inf and NaN stay themselves. v: this lane's N values;
// returns 2^s, lane 0 writing 2^-s to *inv.
template <int N>
__device__ __forceinline__ float ck16_scale(const float (&v)[N], float* inv, int lane) {
  float m = 0.f;
#pragma unroll
  for (int i = 0; i < N; ++i) m = fabsf(v[i]) <= 3.4028235e38f ? fmaxf(m, fabsf(v[i])) : m;  // (not inf, NaN)
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
  const uint32_t e = max((__float_as_uint(m) >> 23) & 0xffu, 15u);  // m < 2^(e - 126): both powers normal
  if (lane == 0) *inv = __uint_as_float((e - 13u) << 23);           // 2^(e - 140)
  return __uint_as_float((267u - e) << 23);                         // 2^(140 - e)
}
"""
# Shared-memory operands (the dev/ probes have their own copy).
SM_DESC_SRC = r"""
// A no-swizzle shared-memory matrix descriptor: start address, LBO (core matrices adjacent in K), SBO
// (adjacent in M / N), bytes.
// The address goes through an opaque move: descriptors are rebuilt where they are used (a few integer
// operations) instead of being hoisted out of the chunk loop into two registers each. (Unused in the float32
// backward's unit, which adds offsets to one laundered start: od.)
[[maybe_unused]] __device__ __forceinline__ uint64_t sm_desc(const void* p, uint32_t lbo, uint32_t sbo) {
  uint32_t a = (uint32_t)__cvta_generic_to_shared(p);
  asm volatile("mov.b32 %0, %0;\n" : "+r"(a));
  return (uint64_t)((a & 0x3FFFF) >> 4) | ((uint64_t)(lbo >> 4) << 16) | ((uint64_t)(sbo >> 4) << 32);
}
"""
WGMMA_SRC = ("\n// ===================================== wgmma: the sm_90a units' instructions, generated ======\n"
             "#if defined(__CUDA_ARCH_FEAT_SM90_ALL)\n#define GR_WGMMA 1\n#endif\nnamespace gr {\nnamespace {\n" +
             WGMMA_SYNC_SRC + STSM_SRC + SM_DESC_SRC + "".join(_wgmma(*f) for f in WGMMA_FORMS) +
             "".join(_wgmma(n, True, 0, z, "tf32") for n in (64, 128) for z in (True, False)) + WGMMA_TF32_SRC +
             "}  // namespace\n}  // namespace gr\n")

# mbarriers for TMA loads (SM90_SRC; the dev probes read them from here).
MBAR_SRC = r"""// mbarriers for the TMA loads (one arrival: the aux thread that arms it with the byte count).
__device__ __forceinline__ void mbar_init(uint64_t* bar) {
#ifdef GR_WGMMA
  asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;\n" ::"r"((uint32_t)__cvta_generic_to_shared(bar)) : "memory");
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void mbar_expect(uint64_t* bar, uint32_t bytes) {
#ifdef GR_WGMMA
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n"
               ::"r"((uint32_t)__cvta_generic_to_shared(bar)), "r"(bytes) : "memory");
#endif
}
__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) {
#ifdef GR_WGMMA
  uint32_t done = 0;
  while (!done)
    asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
                 : "=r"(done) : "r"((uint32_t)__cvta_generic_to_shared(bar)), "r"(parity) : "memory");
#endif
}
"""
# The driver's cuTensorMapEncodeTiled for the TMA maps' host code (both sm_90a units; the dev/ TMA probes read it too).
TMA_ENCODE_SRC = r"""// The driver's cuTensorMapEncodeTiled, looked up once; nullptr where the driver lacks it (the map's caller
// returns CUDA_ERROR_NOT_SUPPORTED).
static PFN_cuTensorMapEncodeTiled_v12000 get_encode() {
  static PFN_cuTensorMapEncodeTiled_v12000 encode = nullptr;
  if (encode == nullptr) {
    cudaDriverEntryPointQueryResult found;
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", reinterpret_cast<void**>(&encode), 12000,
                                         cudaEnableDefault, &found) != cudaSuccess || found != cudaDriverEntryPointSuccess)
      encode = nullptr;
  }
  return encode;
}
// A TMA map from the driver's cuTensorMapEncodeTiled. The driver call needs a current context, which a thread that
// has made no runtime call yet lacks (autograd runs a backward on a thread of its own: CUDA_ERROR_INVALID_CONTEXT):
// then cudaSetDevice on the current device makes its primary context current, and the call is made again.
template <typename... A>
static CUresult encode_tiled(CUtensorMap* m, A... a) {
  const PFN_cuTensorMapEncodeTiled_v12000 encode = get_encode();
  if (encode == nullptr) return CUDA_ERROR_NOT_SUPPORTED;
  CUresult r = encode(m, a...);
  int dev = 0;
  if (r == CUDA_ERROR_INVALID_CONTEXT && cudaGetDevice(&dev) == cudaSuccess && cudaSetDevice(dev) == cudaSuccess)
    r = encode(m, a...);
  return r;
}
"""
SM90_SRC = r"""
// ===================================== sm90: what both chunk_sm90 instantiations share =========
// TMA loads and stores on mbarriers, shared-memory matrix descriptors, named barriers, the gate tables of a
// 64-step chunk and the TMA maps (host).
#include <cudaTypedefs.h>  // CUtensorMap, PFN_cuTensorMapEncodeTiled_v12000
namespace gr {
namespace {

""" + MBAR_SRC + TMA_ENCODE_SRC + r"""// One 64-step tile of a map (tile_map): its box at (0, t0, 0, h, b), landing in the map's layout (128-byte
// swizzled groups); completes on bar.
__device__ __forceinline__ void tma_tile(void* dst, const CUtensorMap* map, int t0, int h, int b, uint64_t* bar) {
#ifdef GR_WGMMA
  asm volatile("cp.async.bulk.tensor.5d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, %5, %6}], [%7];\n"
               ::"r"((uint32_t)__cvta_generic_to_shared(dst)), "l"(map), "r"(0), "r"(t0), "r"(0), "r"(h), "r"(b),
                 "r"((uint32_t)__cvta_generic_to_shared(bar)) : "memory");
#endif
}
// A consumer warpgroup's 64 columns of y (in the map's layout in shared memory) to global memory at
// (0, t0, cg0, h, b), cg0 in the map's column groups; rows past T are not written. One bulk group; wait_read<N>: at most N groups of this
// thread still reading shared memory (wait_all: written).
__device__ __forceinline__ void tma_store(const CUtensorMap* map, const void* src, int t0, int cg0, int h, int b) {
#ifdef GR_WGMMA
  asm volatile("cp.async.bulk.tensor.5d.global.shared::cta.bulk_group [%0, {%1, %2, %3, %4, %5}], [%6];\n"
               ::"l"(map), "r"(0), "r"(t0), "r"(cg0), "r"(h), "r"(b), "r"((uint32_t)__cvta_generic_to_shared(src))
               : "memory");
  asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
#endif
}
template <int N>
__device__ __forceinline__ void bulk_wait_read() {
#ifdef GR_WGMMA
  asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(N) : "memory");
#endif
}
__device__ __forceinline__ void bulk_wait_all() {
#ifdef GR_WGMMA
  asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory");
#endif
}
// The TMA maps of q, k, v and y (kernel parameters); h and b masks: 0 where that stride is 0 (a
// broadcast dimension, one entry read at coordinate 0), else all ones.
struct Sm90Maps {
  CUtensorMap q, k, v, y;
  int hm[3], bm[3];
};

__device__ __forceinline__ uint64_t desc_at(uint64_t d, uint32_t bytes) { return d + (bytes >> 4); }
// A descriptor of a 128-byte swizzled TMA tile (layout type 1, 128-byte swizzle, bits 62-63; base offset 0: every
// group 1024-byte aligned): K-major with lbo unused, or MN-major with lbo the next group of 128-byte columns.
__device__ __forceinline__ uint64_t sw_desc(const void* p, uint32_t lbo) { return sm_desc(p, lbo, 1024) | (1ull << 62); }
// A K-major swizzled tile's k-step kb (32 bytes: 16 bf16 or 8 tf32): along the 128-byte row, then the next 8 KB group.
__device__ __forceinline__ uint32_t sw_kstep(int kb) { return 32 * (kb & 3) + 8192 * (kb >> 2); }

// Named barriers (0 is __syncthreads, 1 + wg a warpgroup's own) of N threads: one side arrives, the other
// syncs.
template <int N = 256>
__device__ __forceinline__ void bar_arrive(int id) { asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "n"(N) : "memory"); }
template <int N = 256>
__device__ __forceinline__ void bar_wait(int id) { asm volatile("bar.sync %0, %1;\n" ::"r"(id), "n"(N) : "memory"); }

// Gate tables of a 64-step chunk (floats): G[t] = prod g[0..t], W[s] = beta_s prod g[s+1..63], GAMMA =
// prod g[0..63]; for the masked product D[t][s] beta_s (D[t][s] = prod g[s+1..t]) in 16-step blocks:
// LTABB[t][s % 16] = D[t][s] beta_s inside a block, else ROWF[t][bs] SOUTB[s] with ROWF[t][bs] = prod
// g[16 bs + 16 .. t] (the whole blocks between and t's own prefix) and SOUTB[s] = beta_s prod g[s+1 ..
// 16 bs + 15]. No quotient anywhere (gates 0, < 0, > 1 exact). The scans run in float (a value carries at
// most a few dozen fp32 roundings, 1e-6 relative; double scans were the longest phase of the float32 block's
// aux). For float32 inputs GAMMA is the exact product rounded once (kExactGamma): it carries the state
// from chunk to chunk, so a scan's roundings would add up along the sequence (2.1e-5 at T = 2100 with
// constant gates, perf-notes' ninth session); the other tables' roundings do not compound
// (dev/tf32_tables_emulation.py and perf-notes, forty-first session).
enum : int { kG = 0, kW = 64, kSoutb = 128, kRowf = 192, kGamma = 448, kLtab = 464 };
static_assert(kLtab + 64 * 16 == kSm90Tab, "PRELUDE's kSm90Tab is these tables' size");

// The product of the warp's 64 gates (every lane: a0 a1) in float-float (hi + lo, about 2^-44 relative),
// rounded once at the end. A product that is not finite stays hi alone (its error term would be NaN).
__device__ __forceinline__ float warp_product_exact(float a0, float a1) {
  const unsigned full = 0xffffffffu;
  float h = a0 * a1, l = fmaf(a0, a1, -h);
  if (!(fabsf(h) < INFINITY)) l = 0.f;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float oh = __shfl_xor_sync(full, h, o), ol = __shfl_xor_sync(full, l, o);
    const float pr = h * oh;
    float e = fmaf(h, oh, -pr);
    e = fmaf(h, ol, fmaf(l, oh, e));
    if (!(fabsf(pr) < INFINITY)) e = 0.f;
    h = pr + e;
    l = e - (h - pr);  // (fast two-sum: |pr| >= |e|)
    if (!(fabsf(h) < INFINITY)) l = 0.f;
  }
  return h;
}

// Aux warp `part` (0 .. 3) writes its share of the tables; every lane holds steps 2l, 2l+1 (g0, g1, b0,
// b1). Warp 0: G, W, GAMMA (scans over the 64 steps); warp 1: SOUTB, ROWF (scans within 16-step blocks);
// warps 2 and 3: LTABB of blocks 0-1 and 2-3, a column a lane.
template <bool kExactGamma = false>
__device__ __forceinline__ void write_tables64(float* tb, float a0, float a1, float b0, float b1, int part, int lane) {
  const unsigned full = 0xffffffffu;
  const int s = 2 * lane, bt = lane >> 3;
  if (part < 2) {
    const float pr = a0 * a1;
    float pre = pr, suf = pr, bpre = pr, bsuf = pr;  // over step pairs: 8 lanes are a 16-step block
    if (part == 0) warp_scans<1>(pre, suf, bpre, bsuf, lane);  // the scans a warp's tables need only
    else warp_scans<8, float, false>(pre, suf, bpre, bsuf, lane);
    if (part == 0) {
      float pre_ex = __shfl_up_sync(full, pre, 1), suf_ex = __shfl_down_sync(full, suf, 1);
      if (lane == 0) pre_ex = 1.f;
      if (lane == 31) suf_ex = 1.f;
      tb[kG + s] = pre_ex * a0;
      tb[kG + s + 1] = pre;
      tb[kW + s] = b0 * (a1 * suf_ex);
      tb[kW + s + 1] = b1 * suf_ex;
      if constexpr (kExactGamma) {
        const float all = warp_product_exact(a0, a1);
        if (lane == 0) tb[kGamma] = all;
      } else {
        const float all = __shfl_sync(full, pre, 31);
        if (lane == 0) tb[kGamma] = all;
      }
    } else {
      float bpre_ex = __shfl_up_sync(full, bpre, 1), bsuf_ex = __shfl_down_sync(full, bsuf, 1);
      if ((lane & 7) == 0) bpre_ex = 1.f;
      if ((lane & 7) == 7) bsuf_ex = 1.f;
      tb[kSoutb + s] = b0 * (a1 * bsuf_ex);
      tb[kSoutb + s + 1] = b1 * bsuf_ex;
      // Block products B_j (the in-block prefix at a block's last lane); ROWF[t][bs] for bs < bt.
      const float B1 = __shfl_sync(full, bpre, 15), B2 = __shfl_sync(full, bpre, 23);
      const float pin0 = bpre_ex * a0, pin1 = bpre;
#pragma unroll
      for (int bs = 0; bs < 4; ++bs) {
        float m = 1.f;  // the whole blocks strictly between bs and bt
        if (bt == bs + 2) m = bs == 0 ? B1 : B2;
        if (bt == 3 && bs == 0) m = B1 * B2;
        tb[kRowf + s * 4 + bs] = pin0 * m;
        tb[kRowf + (s + 1) * 4 + bs] = pin1 * m;
      }
    }
  } else {
    // LTABB of block lb, column sl: running products down the block's rows.
    const int lb = 2 * (part - 2) + (lane >> 4), sl = lane & 15, src = 8 * lb + (sl >> 1);
    const float e0 = __shfl_sync(full, b0, src), e1 = __shfl_sync(full, b1, src);
    const float bs = (sl & 1) ? e1 : e0;
    float run = 1.f;
#pragma unroll
    for (int r = 0; r < 16; ++r) {
      const float gt = __shfl_sync(full, (r & 1) ? a1 : a0, 8 * lb + (r >> 1));
      if (r > sl) run *= gt;
      tb[kLtab + (16 * lb + r) * 16 + sl] = r >= sl ? run * bs : 0.f;
    }
  }
}

// Byte offset of element (r, c) of such a tile of E-byte elements (E = 2: bf16, 4: fp32): 128 / E columns a group of
// 64 rows x 128 bytes (8 KB), the 16-byte piece (c / (16 / E)) % 8 of row r stored at piece (c / (16 / E) ^ r) % 8
// (CU_TENSOR_MAP_SWIZZLE_128B on a 1024-byte aligned group).
template <int E>
__device__ __forceinline__ uint32_t sw_off(int r, int c) {
  static_assert(E == 2 || E == 4, "bf16 or fp32");
  constexpr int LP = E == 2 ? 3 : 2;  // log2 of the elements a piece
  return (uint32_t)((c >> (LP + 3)) * 8192 + r * 128 + ((((c >> LP) ^ r) & 7) << 4) + (c & ((1 << LP) - 1)) * E);
}
// The TMA map of a (B, T, H, D) bf16 or fp32 tensor moved 64 steps at a time, in five dimensions (d % e, t,
// d / e, h, b), one box {e, 64, box_groups, 1, 1} a tile: [d / e][t][d % e] in shared memory. e = 128 bytes of
// elements (64 bf16, 32 fp32), each 64 x 128-byte group swizzled (CU_TENSOR_MAP_SWIZZLE_128B: the 16-byte piece j
// of row t at piece j ^ (t % 8); sw_off), 8 KB apart: a quarter of the load requests of 16-byte boxes
// (dev/tma_swizzle_probe.py measures both). Loads
// zero-fill rows past T, stores skip them. A broadcast h or b (stride 0) is one entry, read
// at coordinate 0 (mask 0).
CUresult tile_map(CUtensorMap* m, int& hmask, int& bmask, const void* base, DType dt, int D, int H, int T, int64_t B,
                  const Strides4& st, int box_groups) {
  hmask = st.h == 0 ? 0 : -1;
  bmask = st.b == 0 ? 0 : -1;
  const int es = dt == DType::f32 ? 4 : 2, ew = 128, e = ew / es;
  const cuuint64_t dims[5] = {(cuuint64_t)e, (cuuint64_t)T, (cuuint64_t)(D / e), st.h == 0 ? 1 : (cuuint64_t)H,
                              st.b == 0 ? 1 : (cuuint64_t)B};
  const cuuint64_t strides[4] = {(cuuint64_t)(st.t * es), (cuuint64_t)ew, st.h == 0 ? 16 : (cuuint64_t)(st.h * es),
                                 st.b == 0 ? 16 : (cuuint64_t)(st.b * es)};  // bytes, dimensions 1 .. 4
  const cuuint32_t box[5] = {(cuuint32_t)e, 64, (cuuint32_t)box_groups, 1, 1}, one[5] = {1, 1, 1, 1, 1};
  return encode_tiled(m, dt == DType::f32 ? CU_TENSOR_MAP_DATA_TYPE_FLOAT32 : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 5, const_cast<void*>(base), dims, strides, box, one,
                CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
                CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
}
}  // namespace
}  // namespace gr
"""

CHUNK_SM90_TF32_SRC = r"""
// ===================================== chunk_sm90 on float32: TF32 chunks of 64 ==============
// chunk_sm90's instantiation for float32 inputs with D_k = D_v = 128: the same block of three warpgroups a
// (b, h, segment) and the same segments, on TF32 wgmma (m64nNk8) with every product 3xTF32 (hi hi + hi lo
// + lo hi; hi rounded by round_tf32, since the tensor core truncates raw fp32; lo = x - hi passed raw), so
// y carries fp32-level error. TF32 operands in shared memory must be K-major, so the layout differs from
// the bfloat16 one (Sm90Tf32Layout). The TMA tiles (q, k, v, y) land as 128-byte swizzled groups of 32 columns
// (element (r, c) of a 64-row tile at sw_off<4>(r, c); descriptors sw_desc, K-major, SBO 1 KB, a k-step of 8 tf32
// +32 bytes along the row, sw_kstep); what threads write (K^T, P') is in "no-swizzle" core matrices of 8 rows x
// 16 bytes, SBO 128:
//   QS hi / lo   q [t][dk] (sw_off<4>) by TMA into hi, rounded in place, lo at the same offsets; k lands in lo first
//   K^T hi / lo  element (n, s) at (s / 4) 2064 + 16 n + 4 (s % 4): k transposed and split by the aux
//                warpgroup, n the sigma row of dk (dk = 8 (n / 8) + sigma(n % 8), sigma = 0 4 1 5 2 6 3 7), so
//                that the state's accumulator column p holds dk 8 (p / 8) + sigma(p % 8) and the state is its
//                own A operand of O1 (picked {c[4kb], c[4kb+2], c[4kb+1], c[4kb+3]}); rows padded to 2064
//                bytes so that the transposing stores hit 32 banks
//   PP hi / lo   P' (t, s) at (s / 4) 1040 + 16 t + 4 (s % 4); the 8 x 8 blocks above the diagonal zeroed once
//   VR           v [s][dv] (sw_off<4>) by TMA, then y staged over it (a consumer warpgroup's half, 64 columns at
//                16 KB cw: its store box, each element at the offset of the v element it replaces)
// Per chunk c of the output phase (mode 0), on 384-thread named barriers (one side arrives, the other syncs):
//   aux        chunk c's gate tables (float scans, GAMMA exact, from gates loaded during chunk c - 1); q, k
//              landed; [KT_DONE(c - 1)] k -> K^T hi / lo; q split in place; FULL_QK(c); [VR_DONE(c -
//              1)] v by TMA; P^T = K Q^T; the gates of c + 1, [Q_DONE(c)] q and k of c + 1 by TMA; P^T masked,
//              decayed, beta-scaled, split -> PP (each warp 18 of the triangle's values); FULL_P(c)
//   consumers  [FULL_QK] O1 = S^T Q^T; Q_DONE; Y = O1 diag(G) staged over the warp's own rows of VR once its
//              V^T fragments are in registers; U = (V^T diag w) K (one N = 128 product); KT_DONE; S^T =
//              fmaf(gamma, S^T, U) (U fresh: accumulating the state by scale-d cost 3e-5); [FULL_P] Z = V^T
//              P'^T; y = Y + Z in place, one TMA store a warpgroup, its read waited; VR_DONE
// The state phase (mode 1) skips q, P', O1, Z and y. Its k (QL, QH) and v (VR, kVR2) are double-buffered and
// loaded two chunks ahead; its consumers take v's fragments and arrive at VR_DONE before they wait for FULL_QK.
// A warp whose V^T fragments hold a NaN or inf recomputes its Z over s <= t in FMAs from global v (a masked zero
// of P' never meets it); the state needs nothing (U has no masked zeros).
namespace gr {
namespace {

using TL = Sm90Tf32Layout;
// Named barriers between the aux warpgroup and both consumers (384 threads).
enum : int { kBarFullQK = 4, kBarFullP = 5, kBarQDone = 6, kBarKTDone = 7, kBarVRDone = 8 };
// Registers a thread after setmaxnreg (the launch gives 168 each): the aux warpgroup's P^T and table
// scans, a consumer's S (64), U (64), V^T (32) and Y (32).
enum : int { kTf32AuxRegs = 88, kTf32ConsumerRegs = 208 };
static_assert(kTf32AuxRegs * 128 + kTf32ConsumerRegs * 256 <= 168 * kSm90Threads, "the split fits the launch's registers");

__device__ __forceinline__ void split_tf32_1(float x, uint32_t& hi, uint32_t& lo) {
  hi = round_tf32(x);
  lo = __float_as_uint(x - __uint_as_float(hi));
}
__device__ __forceinline__ float lds_f(const unsigned char* p) { return *reinterpret_cast<const float*>(p); }
__device__ __forceinline__ void sts_f(unsigned char* p, float v) { *reinterpret_cast<float*>(p) = v; }
__device__ __forceinline__ void sts_u(unsigned char* p, uint32_t v) { *reinterpret_cast<uint32_t*>(p) = v; }

// One 3xTF32 k-step of an RS product with A from four fp32 values: split, issued, committed (B hi / lo:
// descriptors); the first overwrites d.
template <int N>
__device__ __forceinline__ void rs3_split(float (&d)[N], const float (&x)[4], uint64_t bh, uint64_t bl, bool first) {
  uint32_t ah[4], al[4];
#pragma unroll
  for (int r = 0; r < 4; ++r) split_tf32_1(x[r], ah[r], al[r]);
  wg_fence();
  rs_terms<3>(d, ah, al, bh, bl, first);
  wg_commit();
}

// P' from the P^T accumulators of aux warp W. P^T's rows are permuted so that every warp stores the same share
// of the causal triangle: the warp's rows g hold key block 8 W + g, its rows g + 8 key block 8 (7 - W) + g (s =
// 8 sb + g with sb = W or 7 - W by (i >> 1) & 1; t = 8 (i >> 2) + 2 qd + (i & 1)): 18 of its 32 values each, not
// 32 / 24 / 16 / 8 (the 16-row blocks of the unpermuted tile kept warp 0's stores on the aux's critical path).
// Masked (selected, so a NaN in q . k cannot reach a masked zero), decayed, beta-scaled, split, stored [t][s];
// the 8 x 8 blocks above the diagonal (t < s throughout) are never written and stay zero.
template <int W>
__device__ __forceinline__ void store_pprime_tf32(const float (&P)[32], unsigned char* sm, const float* tb, int g,
                                                  int qd) {
#pragma unroll
  for (int i = 0; i < 32; ++i) {
    const int sb = ((i >> 1) & 1) ? 7 - W : W, tb8 = i >> 2;
    if (tb8 < sb) continue;
    const int s = 8 * sb + g, t = 8 * tb8 + 2 * qd + (i & 1);
    float x;
    if ((sb >> 1) == (tb8 >> 1)) x = s <= t ? P[i] * tb[kLtab + t * 16 + (s & 15)] : 0.f;
    else x = P[i] * tb[kRowf + t * 4 + (sb >> 1)] * tb[kSoutb + s];
    uint32_t hi, lo;
    split_tf32_1(x, hi, lo);
    const uint32_t off = (s >> 2) * 1040 + 16 * t + 4 * (s & 3);
    sts_u(sm + TL::kPPH + off, hi);
    sts_u(sm + TL::kPPL + off, lo);
  }
}

// V^T fragments of k-step kb (4 scalar LDS): f[r] = V^T[dv0 + 8 (r & 1)][s = 8 kb + qd + 4 (r >> 1)], v at vr +
// sw_off<4>(s, dv): the piece of (qd, dv0) with bits 1, 2 flipped by r & 1, r >> 1.
__device__ __forceinline__ void tf32_vf_step(float (&f)[4], const unsigned char* sm, int vr, int qd, int dv0, int kb) {
#pragma unroll
  for (int r = 0; r < 4; ++r) f[r] = lds_f(sm + (((vr + sw_off<4>(qd, dv0)) ^ (32 * r)) + 128 * (8 * kb + 4 * (r >> 1))));
}

// The block's segment: steps [sb, se) of sequence (b, h), nch chunks of 64.
struct Tf32Seg {
  int b, h, seg, sb, se, nch;
  __device__ __forceinline__ Tf32Seg(const ChunkParams& p) {
    int blk = blockIdx.x;
    seg = blk % p.seg_launch;
    blk /= p.seg_launch;
    h = blk % p.H;
    b = blk / p.H;
    sb = seg * p.seg_chunks * kChunk;
    se = seg == p.nseg - 1 ? p.T : min(sb + p.seg_chunks * kChunk, p.T);
    nch = (se - sb + 63) >> 6;
  }
};

// The aux warpgroup (tid 0 .. 127). OUTPUTS: the output phase (p.mode 0), compiled in: the consumers'
// registers do not fit both phases' paths through one loop (ptxas spills the state).
// Loads ahead of their chunk, so that their latency stays off the aux's chain (the q / k landing had been hidden only
// behind the gate tables): the output phase issues the gates, q and k of chunk c + 1 as soon as P^T and O1 of chunk c
// have read QS (Q_DONE), before P''s stores; the state phase, which reads no q and writes no P', double-buffers k (QL,
// QH) and v (VR and the P' bytes, kVR2) and loads them two chunks ahead, its gates one.
template <bool OUTPUTS>
__device__ __forceinline__ void tf32_aux(unsigned char* sm, const Sm90Maps& maps, const ChunkParams& p, int tid) {
  const Tf32Seg sg(p);  // (recomputed from the parameters in each role: values kept across the split spill)
  constexpr bool outputs = OUTPUTS;
  const int wl = tid >> 5, lane = tid & 31, g = lane >> 2, qd = lane & 3;
  const int hq = sg.h & maps.hm[0], bq = sg.b & maps.bm[0], hk = sg.h & maps.hm[1], bk = sg.b & maps.bm[1];
  uint64_t* bars = reinterpret_cast<uint64_t*>(sm + TL::kBars);  // TL::kBars' mbarriers
  if (outputs) {
    for (int e = tid; e < 2 * 16640 / 16; e += 128)  // P' hi and lo: the blocks above the diagonal stay zero
      *reinterpret_cast<uint4*>(sm + TL::kPPH + 16 * e) = make_uint4(0, 0, 0, 0);
    wg_barrier(0);  // before any P' store of another thread to the same bytes
  }
  float seg_decay = 1.f;  // the state phase: the segment's product of gates (its chunks' gammas)
  // q and k of chunk c (the output phase; QS free: both consumers' O1 of c - 1 done, our own P^T of c - 1 waited)
  auto load_qk = [&](int c) {
    if (tid == 0) {
      mbar_expect(bars, 2 * 32768);
      tma_tile(sm + TL::kQH, &maps.q, sg.sb + 64 * c, hq, bq, bars);
      tma_tile(sm + TL::kQL, &maps.k, sg.sb + 64 * c, hk, bk, bars);
    }
  };
  // the state phase's k, and v, of chunk c into buffer c & 1 (thread 0)
  auto load_k2 = [&](int c) {
    mbar_expect(bars + (c & 1), 32768);
    tma_tile(sm + ((c & 1) ? TL::kQH : TL::kQL), &maps.k, sg.sb + 64 * c, hk, bk, bars + (c & 1));
  };
  auto load_v2 = [&](int c) {
    mbar_expect(bars + 2 + (c & 1), 32768);
    tma_tile(sm + ((c & 1) ? TL::kVR2 : TL::kVR), &maps.v, sg.sb + 64 * c, sg.h & maps.hm[2], sg.b & maps.bm[2],
             bars + 2 + (c & 1));
  };
  // the gates and betas of chunk c (steps past the segment: gate 1, beta 0); offsets from the parameters
  float g0, g1, b0, b1;
  auto load_gates = [&](int c) {
    const int s = sg.sb + 64 * c + 2 * lane;
    const float* gp = static_cast<const float*>(p.gate) + (sg.b * p.sg.b + sg.h * p.sg.h);
    const float* bp = static_cast<const float*>(p.beta) + (sg.b * p.sb.b + sg.h * p.sb.h);
    g0 = 1.f, g1 = 1.f, b0 = 0.f, b1 = 0.f;
    if (s < sg.se) { g0 = gp[s * p.sg.t]; b0 = bp[s * p.sb.t]; }
    if (s + 1 < sg.se) { g1 = gp[(s + 1) * p.sg.t]; b1 = bp[(s + 1) * p.sb.t]; }
  };
  if (outputs) load_qk(0);
  else if (tid == 0) {
    for (int c = 0; c < min(sg.nch, 2); ++c) {
      load_k2(c);
      load_v2(c);
    }
  }
  load_gates(0);
  for (int c = 0; c < sg.nch; ++c) {
    const int t0 = sg.sb + 64 * c;
    // 1. the gate tables of chunk c (its slot: chunk c - 2's, whose last reader, the consumers' gamma, precedes
    // their VR_DONE of c - 2, which the aux has waited for)
    float* tb = reinterpret_cast<float*>(sm + TL::kTB + (c & 1) * TL::kTabSlot);
    // (the state phase reads only warp 0's W and GAMMA)
    if (outputs || wl == 0) write_tables64<true>(tb, g0, g1, b0, b1, wl, lane);
    if (!outputs && c + 1 < sg.nch) load_gates(c + 1);  // (the state phase: a chunk ahead)
    // 2. k (and q) of chunk c landed: the state phase's k in buffer c & 1
    const int kraw = outputs || (c & 1) == 0 ? TL::kQL : TL::kQH;
    if (outputs) mbar_wait(bars, c & 1);
    else mbar_wait(bars + (c & 1), (c >> 1) & 1);
    if (!outputs && c > 0) bar_wait<384>(kBarQDone);  // (the arrival of chunk c - 1: one a chunk)
    // 3. K^T hi / lo from raw k (after U of c - 1 read K^T), then q split in place
    if (c > 0) bar_wait<384>(kBarKTDone);
    {
      const int s = tid & 63, half = tid >> 6;
      // k [s][dk] (sw_off<4>): dk 64 half + 4 j at ko's piece ^ j % 8, + 8 KB (j / 8), ko = sw_off<4>(s, 64 half);
      // ko formed from an opaque tid each chunk (a base held through the table scans spilled at 88 registers)
      uint32_t ko = tid;
      asm volatile("mov.b32 %0, %0;\n" : "+r"(ko));
      ko = kraw + sw_off<4>(ko & 63, 64 * (ko >> 6));
#pragma unroll 4
      for (int j = 0; j < 16; ++j) {  // dk = 64 half + 4 j + e, its sigma row n
        const float4 v = *reinterpret_cast<const float4*>(sm + ((ko ^ (16 * (j & 7))) + 8192 * (j >> 3)));
        const float xs[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int n = 64 * half + 8 * (j >> 1) + 2 * e + (j & 1);
          const uint32_t off = (s >> 2) * 2064 + 16 * n + 4 * (s & 3);
          uint32_t hi, lo;
          split_tf32_1(xs[e], hi, lo);
          sts_u(sm + TL::kKTH + off, hi);
          sts_u(sm + TL::kKTL + off, lo);
        }
      }
    }
    wg_barrier(0);  // every raw k read (and every table written) before QS lo is overwritten
    if (!outputs && tid == 0 && c + 2 < sg.nch) load_k2(c + 2);  // (its buffer's raw k is read)
    if (!outputs && tid == 0) seg_decay *= tb[kGamma];
    if (outputs) {
#pragma unroll 4
      for (int j = 0; j < 16; ++j) {
        float4* ph = reinterpret_cast<float4*>(sm + TL::kQH) + 128 * j + tid;
        float4* pl = reinterpret_cast<float4*>(sm + TL::kQL) + 128 * j + tid;
        const float4 v = *ph;
        uint32_t hx, hy, hz, hw, lx, ly, lz, lw;
        split_tf32_1(v.x, hx, lx);
        split_tf32_1(v.y, hy, ly);
        split_tf32_1(v.z, hz, lz);
        split_tf32_1(v.w, hw, lw);
        *ph = make_float4(__uint_as_float(hx), __uint_as_float(hy), __uint_as_float(hz), __uint_as_float(hw));
        *pl = make_float4(__uint_as_float(lx), __uint_as_float(ly), __uint_as_float(lz), __uint_as_float(lw));
      }
    }
    fence_async_smem();  // the generic stores before the wgmmas (async proxy) read QS and K^T
    wg_barrier(0);       // (racecheck credits a store only when a barrier its thread waits on follows it)
    bar_arrive<384>(kBarFullQK);
    // 4. v of chunk c (the output phase), after chunk c - 1 is finished: its y store has read VR, its Z has read PP.
    // The state phase's consumers have read chunk c's v (VR_DONE, before they wait for FULL_QK); the buffer is
    // chunk c + 2's.
    if (c > 0 || !outputs) bar_wait<384>(kBarVRDone);
    if (tid == 0) {
      if (outputs) {
        mbar_expect(bars + 1, 32768);
        tma_tile(sm + TL::kVR, &maps.v, t0, sg.h & maps.hm[2], sg.b & maps.bm[2], bars + 1);
      } else if (c + 2 < sg.nch) {
        load_v2(c + 2);
      }
    }
    // 5. P^T = K Q^T (s 64 x t 64 x dk 128): A = K rows from K^T in store_pprime_tf32's row order (a0 (row g,
    // dk = qd), a1 (row g + 8, qd), a2 (g, qd + 4), a3 (g + 8, qd + 4); rows g: s = 8 wl + g, rows g + 8: s = 56 -
    // 8 wl + g; dk = 8 kb + qd + 4 j is sigma row 8 kb + 2 qd + j), B = QS; two k-steps in flight.
    if (outputs) {
      float P[32];
#pragma unroll
      for (int kb = 0; kb < 16; ++kb) {
        if (kb >= 2) wg_wait<1>();
        uint32_t ah[4], al[4];
#pragma unroll
        for (int r = 0; r < 4; ++r) {
          const int s = ((r & 1) ? 56 - 8 * wl : 8 * wl) + g, n = 8 * kb + 2 * qd + (r >> 1);
          const uint32_t off = (s >> 2) * 2064 + 16 * n + 4 * (s & 3);
          ah[r] = *reinterpret_cast<const uint32_t*>(sm + TL::kKTH + off);
          al[r] = *reinterpret_cast<const uint32_t*>(sm + TL::kKTL + off);
        }
        wg_fence();
        rs_terms<3>(P, ah, al, sw_desc(sm + TL::kQH + sw_kstep(kb), 16), sw_desc(sm + TL::kQL + sw_kstep(kb), 16),
                    kb == 0);
        wg_commit();
      }
      wg_wait<0>();
      acc_fence(P);
      // chunk c + 1's gates, then its q and k (QS read: our P^T and the consumers' O1 of chunk c), behind P''s
      // stores (the gates first, so that their small loads do not queue behind q and k's 64 KB)
      if (c + 1 < sg.nch) {
        load_gates(c + 1);
        bar_wait<384>(kBarQDone);
        load_qk(c + 1);
      }
      switch (wl) {  // the warp's key blocks, compiled in
        case 0: store_pprime_tf32<0>(P, sm, tb, g, qd); break;
        case 1: store_pprime_tf32<1>(P, sm, tb, g, qd); break;
        case 2: store_pprime_tf32<2>(P, sm, tb, g, qd); break;
        default: store_pprime_tf32<3>(P, sm, tb, g, qd); break;
      }
      fence_async_smem();
      __threadfence_block();  // (racecheck, as chunk_sm90's bfloat16 P' stores)
    }
    wg_barrier(0);
    bar_arrive<384>(kBarFullP);
  }
  if (!outputs && tid == 0) p.seg_decays[((int64_t)sg.b * p.H + sg.h) * (p.nseg - 1) + sg.seg] = seg_decay;
  // the last chunk's arrivals (every arrival met by its sync; the state phase's VR_DONE: in the loop)
  bar_wait<384>(kBarQDone);
  bar_wait<384>(kBarKTDone);
  if (outputs) bar_wait<384>(kBarVRDone);
}

// Consumer warpgroup cw (tid 0 .. 127 within it): dv rows 64 cw .. 64 cw + 63 of S^T.
template <bool OUTPUTS>
__device__ __forceinline__ void tf32_consumer(unsigned char* sm, const Sm90Maps& maps, const ChunkParams& p, int cw,
                                              int tid) {
  const Tf32Seg sg(p);
  constexpr bool outputs = OUTPUTS;
  const bool last_seg = sg.seg == p.nseg - 1;
  const bool keep_state = p.mode != 0 || (last_seg && p.s_out != nullptr);
  const int wl = tid >> 5, lane = tid & 31, g = lane >> 2, qd = lane & 3;
  const int dv0 = 64 * cw + 16 * wl + g;
  uint64_t* bars = reinterpret_cast<uint64_t*>(sm + TL::kBars);
  unsigned char* ys = sm + TL::kVR + 16384 * cw;  // this warpgroup's dv half of VR: y's staging
  // Y[i]'s byte offset in ys: (t, dvl) = (8 (i >> 2) + 2 qd + (i & 1), 16 wl + g) at sw_off<4>, i.e. the piece of
  // (2 qd, 16 wl + g) ^ (i & 3), rows 8 (i >> 2) + (i & 1) further
  auto y_off = [&](int i) { return (sw_off<4>(2 * qd, 16 * wl + g) ^ (16 * (i & 3))) + 128 * (8 * (i >> 2) + (i & 1)); };
  // S[i] = S^T[dv0 + 8 ((i >> 1) & 1)][physical column 8 (i >> 2) + 2 qd + (i & 1)], which holds
  // dk = 8 (i >> 2) + qd + 4 (i & 1) (K^T's sigma rows). Start: S_0 (output phase, segment 0), the scanned
  // state of the previous segment (output phase), or zero (state phase).
  float S[64];
  {
    const float* s0 = nullptr;
    StateStrides ss{0, 0, 0, 0};
    if (OUTPUTS && sg.seg == 0) { s0 = p.s_in; ss = p.ssi; }
    else if (outputs) {
      s0 = p.seg_states + (((int64_t)sg.b * p.H + sg.h) * (p.nseg - 1) + sg.seg - 1) * (128 * 128);
      ss = {0, 0, 128, 1};
    }
#pragma unroll
    for (int i = 0; i < 64; ++i) {
      const int dv = dv0 + 8 * ((i >> 1) & 1), dk = 8 * (i >> 2) + qd + 4 * (i & 1);
      S[i] = s0 != nullptr ? s0[sg.b * ss.b + sg.h * ss.h + dk * ss.i + dv * ss.j] : 0.f;
    }
  }
  for (int c = 0; c < sg.nch; ++c) {
    const int t0 = sg.sb + 64 * c;
    const float* tb = reinterpret_cast<const float*>(sm + TL::kTB + (c & 1) * TL::kTabSlot);
    // V^T fragments (32 scalar LDS): vf[kb][r] = V^T[dv0 + 8 (r & 1)][s = 8 kb + qd + 4 (r >> 1)]
    float vf[8][4];
    auto load_vf = [&](int kb) { tf32_vf_step(vf[kb], sm, outputs || (c & 1) == 0 ? TL::kVR : TL::kVR2, qd, dv0, kb); };
    if (!outputs) {  // the state phase: v first (buffer c & 1), released at once (chunk c + 2's)
      mbar_wait(bars + 2 + (c & 1), (c >> 1) & 1);
#pragma unroll
      for (int kb = 0; kb < 8; ++kb) load_vf(kb);
      bar_arrive<384>(kBarVRDone);
    }
    bar_wait<384>(kBarFullQK);
    // O1 = S^T Q^T (dv 64 x t 64 x dk 128): A = S picked (natural dk order for k-step kb), split; B = QS
    // hi / lo; four k-steps in flight.
    float Y[32];  // Y^T[dv0 + 8 ((i >> 1) & 1)][t = 8 (i >> 2) + 2 qd + (i & 1)]
    if (outputs) {
#pragma unroll
      for (int kb = 0; kb < 16; ++kb) {
        if (kb >= 4) wg_wait<3>();
        const float x[4] = {S[4 * kb], S[4 * kb + 2], S[4 * kb + 1], S[4 * kb + 3]};
        rs3_split(Y, x, sw_desc(sm + TL::kQH + sw_kstep(kb), 16), sw_desc(sm + TL::kQL + sw_kstep(kb), 16), kb == 0);
      }
    }
    if (outputs && p.fwd_ckpt != nullptr) {
      // the float32 backward's checkpoint of chunk c (one segment, so the output phase: c counts the sequence's
      // chunks): S at the chunk's start, [dk][dv], behind O1's products; then each warp's max |S| over its finite
      // values (the backward's tile scale)
      float* d = static_cast<float*>(p.fwd_ckpt) + ((int64_t)(sg.b * p.H + sg.h) * sg.nch + c) * kCk32;
      float m = 0.f;
#pragma unroll
      for (int i = 0; i < 64; ++i) {
        __stcs(d + (8 * (i >> 2) + qd + 4 * (i & 1)) * 128 + dv0 + 8 * ((i >> 1) & 1), S[i]);
        m = fmaxf(m, fabsf(S[i]) < INFINITY ? fabsf(S[i]) : 0.f);  // (finite values only: an inf scales nothing)
      }
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
      if (lane == 0) __stcs(d + 16384 + 4 * cw + wl, m);
    }
    if (outputs) {
      wg_wait<0>();
      acc_fence(Y);
#pragma unroll
      for (int i = 0; i < 32; ++i) Y[i] *= tb[kG + 8 * (i >> 2) + 2 * qd + (i & 1)];  // Y = O1 diag(G)
    }
    bar_arrive<384>(kBarQDone);
    // The output phase's V^T fragments, with Y staged over this warp's own 16 dv rows of VR as they are read
    // (not live through U; y (t, dv) at v (s = t, dv)'s offset, y's store box): steps 0 .. 31 first, then 32 .. 63,
    // so that Y, S and all of vf are never live at once.
    if (outputs) {
      mbar_wait(bars + 1, c & 1);
#pragma unroll
      for (int half = 0; half < 2; ++half) {
#pragma unroll
        for (int kb = 4 * half; kb < 4 * half + 4; ++kb) load_vf(kb);
        __syncwarp();  // the warp's reads of these steps before its stores over them
#pragma unroll
        for (int i = 16 * half; i < 16 * half + 16; ++i) sts_f(ys + y_off(i), Y[i]);
      }
    }
    // The warp's 16 dv rows x 64 steps (exactly the rows of Z it owns) hold a NaN or inf: its Z is
    // recomputed below without P''s masked zeros.
    bool bad = false;
    if (outputs) {
      uint32_t e = 0;
#pragma unroll
      for (int kb = 0; kb < 8; ++kb)
#pragma unroll
        for (int r = 0; r < 4; ++r) e |= (__float_as_uint(vf[kb][r]) & 0x7f800000u) == 0x7f800000u;
      bad = __any_sync(0xffffffffu, e != 0);
    }
    // U = (V^T diag w) K (dv 64 x n 128 x s 64): A = vf w split, B = K^T hi / lo (LBO 2064, k-step 4128),
    // two k-steps in flight; then S = fmaf(gamma, S, U). Skipped after the segment's last chunk unless its
    // state is read.
    if (c + 1 < sg.nch || keep_state) {
      float U[64];
#pragma unroll
      for (int kb = 0; kb < 8; ++kb) {
        if (kb >= 2) wg_wait<1>();
        const float w0 = tb[kW + 8 * kb + qd], w1 = tb[kW + 8 * kb + qd + 4];
        const float x[4] = {vf[kb][0] * w0, vf[kb][1] * w0, vf[kb][2] * w1, vf[kb][3] * w1};
        rs3_split(U, x, sm_desc(sm + TL::kKTH + 4128 * kb, 2064, 128), sm_desc(sm + TL::kKTL + 4128 * kb, 2064, 128),
                  kb == 0);
      }
      wg_wait<0>();
      acc_fence(U);
      bar_arrive<384>(kBarKTDone);
      const float gamma = tb[kGamma];
#pragma unroll
      for (int i = 0; i < 64; ++i) S[i] = fmaf(gamma, S[i], U[i]);
    } else {
      bar_arrive<384>(kBarKTDone);
    }
    // y = Y + Z: Z's accumulators start from the staged Y (each thread its own entries), read before FULL_P
    float Z[32];
    if (outputs) {
#pragma unroll
      for (int i = 0; i < 32; ++i) Z[i] = lds_f(ys + y_off(i));
    }
    bar_wait<384>(kBarFullP);
    if (outputs) {
      // Z = Y + V^T P'^T (dv 64 x t 64 x s 64): A = vf split, B = PP hi / lo (LBO 1040, k-step 2080).
#pragma unroll
      for (int kb = 0; kb < 8; ++kb) {
        if (kb >= 4) wg_wait<3>();
        rs3_split(Z, vf[kb], sm_desc(sm + TL::kPPH + 2080 * kb, 1040, 128),
                  sm_desc(sm + TL::kPPL + 2080 * kb, 1040, 128), false);
      }
      wg_wait<0>();
      acc_fence(Z);
      if (bad) {
        // Z met v's NaN / inf with P''s zeros (s > t): recomputed over s <= t in FMAs, P' = hi + lo (exact),
        // v re-read from global memory (VR's rows of this warp now hold Y); steps past the segment skipped.
        // Warp-uniform, no wgmma inside; slow, but only in a chunk whose v is not finite.
        const float* vg = static_cast<const float*>(p.v) + sg.b * p.sv.b + sg.h * p.sv.h + (int64_t)t0 * p.sv.t;
        const int last = sg.se - 1 - t0;
#pragma unroll
        for (int i = 0; i < 32; ++i) {
          const int dv = dv0 + 8 * ((i >> 1) & 1), t = 8 * (i >> 2) + 2 * qd + (i & 1), smax = min(t, last);
          float acc = 0.f;
#pragma unroll 1
          for (int s = 0; s <= smax; ++s) {
            const uint32_t off = (s >> 2) * 1040 + 16 * t + 4 * (s & 3);
            acc = fmaf(lds_f(sm + TL::kPPH + off) + lds_f(sm + TL::kPPL + off), vg[s * p.sv.t + dv], acc);
          }
          Z[i] = lds_f(ys + y_off(i)) + acc;
        }
      }
      // y over the staged Y (each thread its own entries), one TMA store a warpgroup; VR is released once the
      // store has read it.
#pragma unroll
      for (int i = 0; i < 32; ++i) sts_f(ys + y_off(i), Z[i]);
      fence_async_smem();
      wg_barrier(1 + cw);
      if (tid == 0) {
        tma_store(&maps.y, ys, t0, 2 * cw, sg.h, sg.b);
        bulk_wait_read<0>();
      }
      bar_arrive<384>(kBarVRDone);
    }
  }
  if (tid == 0) bulk_wait_all();  // y written before the block ends
  // The final state, or (state phase) the segment's own state contribution and gate product.
  float* dst = nullptr;
  StateStrides ds{0, 0, 0, 0};
  if (outputs && last_seg && p.s_out != nullptr) { dst = p.s_out; ds = p.sso; }
  else if (!outputs) {
    dst = p.seg_states + (((int64_t)sg.b * p.H + sg.h) * (p.nseg - 1) + sg.seg) * (128 * 128);
    ds = {0, 0, 128, 1};
  }
  if (dst != nullptr) {
#pragma unroll
    for (int i = 0; i < 64; ++i) {
      const int dv = dv0 + 8 * ((i >> 1) & 1), dk = 8 * (i >> 2) + qd + 4 * (i & 1);
      dst[sg.b * ds.b + sg.h * ds.h + dk * ds.i + dv * ds.j] = S[i];
    }
  }
}

// The block: mbarriers, then the roles.
template <int = 0>
__device__ __forceinline__ void chunk_sm90_tf32(const ChunkParams& p, const Sm90Maps& maps) {
  extern __shared__ __align__(1024) unsigned char sm[];
  const int tid = threadIdx.x, wg = __shfl_sync(0xffffffffu, tid >> 7, 0);
  uint64_t* bars = reinterpret_cast<uint64_t*>(sm + TL::kBars);
  if (tid == 0)
    for (int i = 0; i < 4; ++i) mbar_init(bars + i);
  __syncthreads();
  if (wg == 0) {
    maxnreg_dec<kTf32AuxRegs>();
    if (p.mode == 0) tf32_aux<true>(sm, maps, p, tid);
    else tf32_aux<false>(sm, maps, p, tid);
    return;
  }
  maxnreg_inc<kTf32ConsumerRegs>();
  if (p.mode == 0) tf32_consumer<true>(sm, maps, p, wg - 1, tid & 127);
  else tf32_consumer<false>(sm, maps, p, wg - 1, tid & 127);
}

}  // namespace
}  // namespace gr
"""

CHUNK_SM90_SRC = r"""
// ===================================== chunk_sm90: bfloat16 chunks of 64 on Hopper wgmma =======
// CHUNK_SRC's chunkwise form with chunks of 64 steps for bfloat16 inputs, D_k 64 or 128, D_v 128 (rows
// 16-byte aligned), built for sm_90a only (its own unit). One block of three warpgroups per (b, h,
// segment), warp-specialised, synchronised by named barriers (FULL: a chunk's operands ready; DONE: its
// buffers free) and never by the whole block:
//   aux warpgroup       one thread issues the TMA loads of q, k, v (a 5-d map whose box lands as 128-byte
//                       swizzled groups of 64 columns: element (r, c) of a 64-row tile at sw_off<2>(r, c)) into
//                       three stages on mbarriers, two chunks ahead;
//                       the four warps form chunk c's gate tables (fp32, no quotient) and
//                       P = Q K^T (SS), masked, decayed and beta-scaled, as P' bf16 hi + lo, a chunk
//                       ahead of the consumers (two slots).
//   consumers 1, 2      warpgroup cw keeps rows 64cw .. 64cw + 63 of S^T (D_v x D_k, fp32) in wgmma
//                       accumulators for the whole segment, so the state never goes through shared
//                       memory; per chunk:
//     O1  = S^T Q^T                 RS: the accumulators split into bf16 hi + lo a k-step at a time
//     Y^T = O1 diag(G) + V^T P'^T   RS: V^T fragments by ldmatrix.trans against P' hi and lo
//     y                             staged swizzled, one TMA store a warpgroup
//     U   = (V^T diag(w)) K         RS: V^T w split into hi + lo; K read MN-major from the same tile
// The wgmma descriptors of the swizzled tiles (dev/tma_swizzle_probe.py settled them): K-major, SBO 1 KB (8-row
// groups), a k-step +32 bytes inside the 128-byte row, +8 KB to the next 64 columns; MN-major (K read
// transposed), SBO 1 KB, LBO 8 KB (the next 64 columns), a k-step of 16 rows +2 KB. P' stays in the
// no-swizzle core-matrix layout (cm_off): threads write it.
//     S^T = gamma S^T + U           one fp32 FMA an element (an accumulator is not summed round-to-nearest)
// Each fp32 operand is two bf16 terms against exact bf16 inputs, as in chunk_bf16: y's error is its own
// bf16 rounding. setmaxnreg moves registers from the aux warpgroup to the consumers. A chunk whose v holds a
// NaN or inf: the consumer warps whose columns hold it add P' V in FMAs over s <= t instead (a masked zero
// never meets it). Segments: CHUNK_SRC's phases.
namespace gr {
namespace {

using bf16 = __nv_bfloat16;

// Byte offset of element (r, c) of a 64-row tile in the core-matrix layout (P'): column group c / 8 is 1 KB.
__device__ __forceinline__ uint32_t cm_off(int r, int c) { return (uint32_t)((c >> 3) * 1024 + r * 16 + (c & 7) * 2); }
// Whether a thread's V^T fragments hold a NaN or inf (exponent bits all ones in a half).
__device__ __forceinline__ bool frags_bad(const uint32_t (&f)[4][4]) {
  uint32_t bad = 0;
#pragma unroll
  for (int kb = 0; kb < 4; ++kb)
#pragma unroll
    for (int r = 0; r < 4; ++r) bad |= __vcmpeq2(f[kb][r] & 0x7f807f80u, 0x7f807f80u);
  return bad != 0;
}

// P' entries (t, s), (t, s + 1) from their q . k accumulators, key block bs of the row block bt: zero
// above the diagonal (selected, not multiplied: a NaN in q . k must not leak into a masked entry).
// bs and bt are warp-uniform, so the three cases are branches without divergence.
__device__ __forceinline__ void masked_pair(float& d0, float& d1, int t, int s, int bt, int bs, const float* tb) {
  if (bs < bt) {
    const float r = tb[kRowf + t * 4 + bs];
    d0 = d0 * r * tb[kSoutb + s];
    d1 = d1 * r * tb[kSoutb + s + 1];
  } else if (bs == bt) {
    const float2 l = *reinterpret_cast<const float2*>(tb + kLtab + t * 16 + (s & 15));
    d0 = s <= t ? d0 * l.x : 0.f;
    d1 = s + 1 <= t ? d1 * l.y : 0.f;
  } else {
    d0 = 0.f;
    d1 = 0.f;
  }
}

// P' = masked P, as hi and lo bf16 at [t][s] (core-matrix layout), for the aux warp of row block BT
// (P[i]: t = 16 BT + g + 8 ((i >> 1) & 1), s = 8 (i >> 2) + 2 qd + (i & 1)). Key blocks past BT are zero in
// every chunk: written once, at the kernel's start. L: the kernel's Sm90Layout.
template <typename L, int BT>
__device__ __forceinline__ void store_pprime(const float (&P)[32], unsigned char* der, const float* tb, int g, int qd) {
#pragma unroll
  for (int i = 0; i < 32; i += 2) {
    const int bs = i >> 3;
    if (bs > BT) continue;
    const int t = 16 * BT + g + 8 * ((i >> 1) & 1), s = 8 * (i >> 2) + 2 * qd;
    float d0 = P[i], d1 = P[i + 1];
    masked_pair(d0, d1, t, s, BT, bs, tb);
    uint32_t hi, lo;
    split_bf16x2(d0, d1, hi, lo);
    *reinterpret_cast<uint32_t*>(der + L::kPh + cm_off(t, s)) = hi;
    *reinterpret_cast<uint32_t*>(der + L::kPl + cm_off(t, s)) = lo;
  }
}


// Registers a thread after the split (setmaxnreg; the launch gives 168 each, 384 x 168 in all): the aux
// warpgroup needs P (32) and its masks, a consumer S (D_k / 2), its hi and lo fragments and Y.
enum : int { kAuxRegs = 72, kConsumerRegs = 216 };
// The pool is what the launch allocates: ptxas must report 168 registers for this kernel (-Xptxas -v), or
// the consumers' setmaxnreg.inc waits forever for registers that do not exist. Re-check on any change of
// the bounds, the split or the consumers' code.
static_assert(kAuxRegs * 128 + kConsumerRegs * 256 <= 168 * kSm90Threads, "the split fits the launch's registers");
// Named barriers: FULL + 2 cw + c % 2 is consumer
// warpgroup cw waiting for the aux warpgroup's chunk c; DONE + 2 cw + c % 2 the aux warpgroup waiting
// for consumer warpgroup cw to finish chunk c. 256 threads each: aux and one consumer warpgroup.
enum : int { kBarFull = 4, kBarDone = 8 };

// The bfloat16 block (D_k 64 or 128; VARLEN: packed sequences).
template <int DK, bool VARLEN>
__device__ __forceinline__ void chunk_sm90_bf16(const ChunkParams& p, const Sm90Maps& maps) {
  extern __shared__ __align__(1024) unsigned char sm[];
  using L = Sm90Layout<DK>;
  const ChunkBlock<bf16> cb(p, 128, VARLEN);
  if (cb.idle(p)) return;
  const int tid = threadIdx.x, warp = __shfl_sync(0xffffffffu, tid >> 5, 0), lane = tid & 31;
  const int wg = warp >> 2, wl = warp & 3, g = lane >> 2, qd = lane & 3;
  constexpr int NKB = DK / 16;  // k-steps over D_k
  const bool outputs = p.mode == 0;
  const bool last_seg = cb.seg == cb.nseg_n - 1;
  const bool keep_state = p.mode != 0 || (last_seg && p.s_out != nullptr);
  // steps [sb, se) of the sequence; its TMA coordinates start at bos (varlen: the packed row's)
  const int sb = cb.seg * p.seg_chunks * kChunk, se = last_seg ? cb.len : min(sb + p.seg_chunks * kChunk, cb.len);
  const int tb0 = (int)cb.bos, bc = VARLEN ? 0 : cb.b;  // varlen: one packed row (b = 0 in the maps)
  const int nch = (se - sb + 63) / 64;
  auto raw = [&](int c) { return sm + (c % L::kStages) * L::kStage; };
  auto derived = [&](int c) { return sm + L::kDer0 + (c & 1) * L::kDer; };
  uint64_t* bars = reinterpret_cast<uint64_t*>(sm + L::kBars);  // stage s's TMA loads complete
  if (tid == 0) {
    // the swizzled tiles' pattern follows address bits 7-9: the layout assumes a 1024-byte aligned base
    if (__cvta_generic_to_shared(sm) & 1023) __trap();
    for (int s = 0; s < L::kStages; ++s) mbar_init(bars + s);
  }
  __syncthreads();

  if (wg == 0) {
    // The aux warpgroup: stages chunk c + 1 while it forms chunk c's gate tables and masked product P'
    // (consumers work on chunk c - 1 meanwhile).
    maxnreg_dec<kAuxRegs>();
    auto stage = [&](int c) {  // one thread: three TMA tiles (q only where y is formed)
      if (tid == 0 && c < nch) {
        const int t0 = sb + 64 * c;
        unsigned char* st = raw(c);
        uint64_t* bar = bars + c % L::kStages;
        mbar_expect(bar, (outputs ? 2 * L::kQ : L::kQ) + L::kV);
        if (outputs) tma_tile(st, &maps.q, tb0 + t0, cb.h & maps.hm[0], bc & maps.bm[0], bar);
        tma_tile(st + L::kQ, &maps.k, tb0 + t0, cb.h & maps.hm[1], bc & maps.bm[1], bar);
        tma_tile(st + 2 * L::kQ, &maps.v, tb0 + t0, cb.h & maps.hm[2], bc & maps.bm[2], bar);
      }
    };
    // the next chunk's gates and betas (every aux warp), as loaded bits: converted when used, a chunk later
    uint32_t ng0 = 0u, ng1 = 0u, nb0 = 0u, nb1 = 0u;
    auto load_gates = [&](int c) {
      // Steps past T load the last step again (gate 1, beta 0 are set at use): no branch a pair, so ptxas issues
      // all four loads before any waits on them (a branch a pair put two round trips in the varlen build)
      const int t0 = sb + 64 * c, tc = min(64, se - t0), s = 2 * lane;
      if (tc <= 0) return;  // (an empty sequence: nothing to load)
      const int64_t i0 = t0 + min(s, tc - 1), i1 = t0 + min(s + 1, tc - 1);
      ng0 = cb.gate.bits(i0 * p.sg.t);
      nb0 = cb.beta.bits(i0 * p.sb.t);
      ng1 = cb.gate.bits(i1 * p.sg.t);
      nb1 = cb.beta.bits(i1 * p.sb.t);
    };
    stage(0);
    stage(1);
    stage(2);
    load_gates(0);
    static_assert(L::kTb == 16 * 1024, "P' hi and lo of a slot: 1024 pieces of 16 bytes");
    for (int e = tid; e < 2 * 1024; e += 128)  // both slots' P' (their zero blocks stay zero)
      *reinterpret_cast<uint4*>(sm + L::kDer0 + (e >> 10) * L::kDer + 16 * (e & 1023)) = make_uint4(0, 0, 0, 0);
    for (int c = 0; c < nch; ++c) {
      if (c >= 2) {  // both consumers done with chunk c - 2: its derived slot and raw stage are free
        bar_wait(kBarDone + (c & 1));
        bar_wait(kBarDone + 2 + (c & 1));
        stage(c + 1);
      }
      mbar_wait(bars + c % L::kStages, (c / L::kStages) & 1);  // chunk c staged
      if (VARLEN && se - (sb + 64 * c) < 64) {
        // The sequence's ragged last chunk: rows past it hold the next sequence's steps (dense: TMA's zero
        // fill). Zeros there, as the masks and the identity steps assume: a finite product with a masked
        // zero, never an inf or NaN of another sequence. The stage is (2 D_k / 64 + 2) swizzled groups of
        // 8 KB (q, k, v), a row 128 contiguous bytes of a group (the swizzle permutes pieces within a row).
        const int rem = se - (sb + 64 * c), rows = 64 - rem;
        unsigned char* stw = raw(c);
        for (int e = tid; e < rows * 8 * (2 * (DK / 64) + 2); e += 128)
          *reinterpret_cast<uint4*>(stw + (e / (8 * rows)) * 8192 + (rem + (e >> 3) % rows) * 128 + 16 * (e & 7)) =
              make_uint4(0, 0, 0, 0);
        fence_async_smem();  // before the wgmmas (async proxy) read the stage
        wg_barrier(0);
      }
      const unsigned char* st = raw(c);
      unsigned char* der = derived(c);
      float* tb = reinterpret_cast<float*>(der + L::kTb);
      float P[32];  // P[t = 16 wl + g + 8 ((i >> 1) & 1)][s = 8 (i >> 2) + 2 qd + (i & 1)]
      if (outputs) {
        wg_fence();
        const uint64_t dq = sw_desc(st, 16), dk = sw_desc(st + L::kQ, 16);
        wgmma_ss64_z(P, dq, dk);
#pragma unroll
        for (int kb = 1; kb < NKB; ++kb) wgmma_ss64(P, desc_at(dq, sw_kstep(kb)), desc_at(dk, sw_kstep(kb)), 1);
        wg_commit();
      }
      {  // while P runs
        const int tc = min(64, se - (sb + 64 * c)), s = 2 * lane;
        write_tables64(tb, s < tc ? cb.gate.widen(ng0) : 1.f, s + 1 < tc ? cb.gate.widen(ng1) : 1.f,
                       s < tc ? cb.beta.widen(nb0) : 0.f, s + 1 < tc ? cb.beta.widen(nb1) : 0.f, wl, lane);
      }
      if (c + 1 < nch) load_gates(c + 1);
      wg_barrier(0);  // the tables written
      if (outputs) {
        wg_wait<0>();
        acc_fence(P);
        switch (wl) {  // the warp's row block, compiled in: no branch a pair
          case 0: store_pprime<L, 0>(P, der, tb, g, qd); break;
          case 1: store_pprime<L, 1>(P, der, tb, g, qd); break;
          case 2: store_pprime<L, 2>(P, der, tb, g, qd); break;
          default: store_pprime<L, 3>(P, der, tb, g, qd); break;
        }
        fence_async_smem();
      }
      __threadfence_block();
      // Not needed for ordering (bar.arrive releases the stores to the consumers' bar.sync), but
      // compute-sanitizer racecheck credits a store only when a barrier its thread waits on follows it:
      // without this it reports every P' store the NaN path reads (dev/racecheck_named_barriers.py).
      wg_barrier(0);
      bar_arrive(kBarFull + (c & 1));
      bar_arrive(kBarFull + 2 + (c & 1));
    }
    for (int c = max(nch - 2, 0); c < nch; ++c) {  // every arrival of the consumers met
      bar_wait(kBarDone + (c & 1));
      bar_wait(kBarDone + 2 + (c & 1));
    }
    return;
  }

  // Consumer warpgroup cw: rows 64 cw .. 64 cw + 63 of S^T.
  maxnreg_inc<kConsumerRegs>();
  const int cw = wg - 1, dvw = 64 * cw + 16 * wl;  // this warp's first row of S^T (a state column)
  // The state: S[i] = S^T[dvw + g + 8 ((i >> 1) & 1)][8 (i >> 2) + 2 qd + (i & 1)] (m64n{DK} accumulator).
  float S[DK / 2];
  {
    const float* s0 = nullptr;
    StateStrides ss{0, 0, 0, 0};
    if (p.mode == 0 && cb.seg == 0) { s0 = p.s_in; ss = p.ssi; }
    else if (p.mode == 0) { s0 = cb.segment_state(p, cb.seg - 1); ss = {0, 0, p.Dv, 1}; }
#pragma unroll
    for (int i = 0; i < DK / 2; ++i) {
      const int dv = dvw + g + 8 * ((i >> 1) & 1), dk = 8 * (i >> 2) + 2 * qd + (i & 1);
      S[i] = s0 != nullptr ? s0[cb.b * ss.b + cb.h * ss.h + dk * ss.i + dv * ss.j] : 0.f;
    }
  }
  float seg_decay = 1.f;
  // chunk_bwd_sm90's checkpoints, where the host asks for them (p.fwd_ckpt; one segment, so c counts the
  // sequence's chunks, and every launch is the output phase): S holds chunk c's start state from the top of chunk
  // c until its update, so it is stored in between, behind O1's last products (there the consumer's registers
  // allow it without a spill), in the checkpoint kernel's layout. fp32: S[i] at [dk][dv] as it is. 16-bit
  // (fwd_ck16: kCk16, fp16 scaled by ck16_scale) as the checkpoint kernel stores them: the warp's 16 columns staged
  // transposed by stmatrix (its 8 x 8 blocks, the dv halves of a dk row swapped on rows 4..7: conflict-free), 64 dk
  // rows at a time in the warp's own 2 KB of this chunk's y buffer (free from the chunk's top until y is staged
  // there: bulk_wait_read and FULL), then 32-byte row pieces out as 16-byte stores. Streaming stores: the backward
  // reads them, not this kernel.
  constexpr bool kCkpt = DK == 128 && !VARLEN;  // the only instantiation forward_checkpoints allows
  auto put_ckpt = [&](int c) {  // S[i]: dv = dvw + g + 8 ((i >> 1) & 1), dk = 8 (i >> 2) + 2 qd + (i & 1)
    if (p.fwd_ck16) {
      __half* d = static_cast<__half*>(p.fwd_ckpt) + (cb.bh * nch + c) * kCk16;
      const float scale = ck16_scale(S, reinterpret_cast<float*>(d + 16384) + dvw / 16, lane);
      d += dvw;
      unsigned char* st = sm + L::kY + ((c & 1) * 2 + cw) * L::kYBuf + 2048 * wl;  // (y's columns of this warp)
      const int j = lane & 7, mi = lane >> 3;  // this lane's address: row j of matrix mi of each x4
#pragma unroll
      for (int r = 0; r < 2; ++r) {  // dk rows 64 r ..
#pragma unroll
        for (int m = 0; m < 4; ++m) {  // matrices (n, hh) = (8 r + 2 m + (mi >> 1), mi & 1)
          float v[8];
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int i = 4 * (8 * r + 2 * m + (e >> 1)) + 2 * (e & 1);
            v[2 * e] = S[i];
            v[2 * e + 1] = S[i + 1];
          }
          const int dk = 8 * (2 * m + (mi >> 1)) + j, hh = (mi & 1) ^ ((j >> 2) & 1);  // (within the 64 rows)
          stsm_x4_trans<true>((uint32_t)__cvta_generic_to_shared(st + dk * 32 + hh * 16), v, scale);
        }
        __syncwarp();
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int k = 32 * e + lane, dk = k >> 1, hh = (k & 1) ^ ((k >> 3) & 1);
          const uint4 v = *reinterpret_cast<const uint4*>(st + 16 * k);
          __stcs(reinterpret_cast<uint4*>(d + (64 * r + dk) * 128 + 8 * hh), v);
        }
        __syncwarp();
      }
    } else {
      float* d = static_cast<float*>(p.fwd_ckpt) + (cb.bh * nch + c) * 16384 + 2 * qd * 128 + dvw + g;
#pragma unroll
      for (int i = 0; i < DK / 2; ++i) __stcs(d + (8 * (i >> 2) + (i & 1)) * 128 + 8 * ((i >> 1) & 1), S[i]);
    }
  };
  for (int c = 0; c < nch; ++c) {
    const int t0 = sb + 64 * c;
    if ((tid & 127) == 0) bulk_wait_read<1>();  // y's buffer c % 2 read by its store (chunk c - 2)
    bar_wait(kBarFull + 2 * cw + (c & 1));
    mbar_wait(bars + c % L::kStages, (c / L::kStages) & 1);  // (passes at once: the aux thread saw it)
    const unsigned char* st = raw(c);
    const unsigned char *Qt = st, *Kt = st + L::kQ, *Vt = st + 2 * L::kQ;
    const unsigned char* der = derived(c);
    const float* tb = reinterpret_cast<const float*>(der + L::kTb);
    const float gamma = tb[kGamma];
    seg_decay *= gamma;
    float Y[32];  // Y^T[dvw + g + 8 ((i >> 1) & 1)][t = 8 (i >> 2) + 2 qd + (i & 1)]
    if (outputs) {  // O1 = S^T Q^T, then Y^T = O1 diag(G)
      // S's hi and lo fragments a k-step at a time, one group each, at most four in flight: their
      // registers are reused once a group is done (all of them beside S do not fit).
      const uint64_t dq = sw_desc(Qt, 16);
#pragma unroll
      for (int kb = 0; kb < NKB; ++kb) {
        if (kb >= 4) wg_wait<3>();
        uint32_t ah[4], al[4];
#pragma unroll
        for (int r = 0; r < 4; ++r) split_bf16x2<false>(S[8 * kb + 2 * r], S[8 * kb + 2 * r + 1], ah[r], al[r]);
        wg_fence();  // after the A fragments are written, before any wgmma reads them
        if (kb == 0) wgmma_rs64_z(Y, ah, dq);
        else wgmma_rs64(Y, ah, desc_at(dq, sw_kstep(kb)), 1);
        wgmma_rs64(Y, al, desc_at(dq, sw_kstep(kb)), 1);
        wg_commit();
      }
      if (kCkpt && p.fwd_ckpt != nullptr) put_ckpt(c);  // while O1's last products run (S is no operand of them)
      wg_wait<0>();
      acc_fence(Y);
#pragma unroll
      for (int i = 0; i < 32; ++i) Y[i] *= tb[kG + 8 * (i >> 2) + 2 * qd + (i & 1)];
    }
    // V^T fragments of this warp's 16 rows, kb over the 64 steps (loaded after O1: not live beside it).
    // (A 32-bit shared address plus the swizzled offset: through a generic pointer ptxas keeps 56 bytes of stack.)
    uint32_t vf[4][4];
    {
      const uint32_t va = (uint32_t)__cvta_generic_to_shared(Vt);
#pragma unroll
      for (int kb = 0; kb < 4; ++kb) {
        const int m = lane >> 3, s = 16 * kb + 8 * (m >> 1) + (lane & 7), dv = dvw + 8 * (m & 1);
        ldm4_at<true>(vf[kb], va + sw_off<2>(s, dv));
      }
    }
    bool bad = false;
    if (outputs) {
      bad = __any_sync(0xffffffffu, frags_bad(vf));
      // Y^T += V^T P'^T. A NaN or inf in v: this warp's A fragments are zeros, and its rows add P' V in
      // FMAs below instead (a masked zero must never meet it).
      uint32_t vz[4][4];
#pragma unroll
      for (int kb = 0; kb < 4; ++kb)
#pragma unroll
        for (int r = 0; r < 4; ++r) vz[kb][r] = bad ? 0u : vf[kb][r];
      acc_fence(Y);
      wg_fence();
      const uint64_t dph = sm_desc(der + L::kPh, 1024, 128), dpl = sm_desc(der + L::kPl, 1024, 128);
#pragma unroll
      for (int kb = 0; kb < 4; ++kb) {
        wgmma_rs64(Y, vz[kb], desc_at(dph, 2048 * kb), 1);
        wgmma_rs64(Y, vz[kb], desc_at(dpl, 2048 * kb), 1);
      }
      wg_commit();
    }
    // U's A operand, V^T diag(w) as hi + lo, while P' V runs.
    const bool update = c + 1 < nch || keep_state;
    uint32_t uh[4][4], ul[4][4];
    if (update) {
#pragma unroll
      for (int kb = 0; kb < 4; ++kb)
#pragma unroll
        for (int r = 0; r < 4; ++r) {
          const int s = 16 * kb + 8 * (r >> 1) + 2 * qd;
          const uint32_t x = vf[kb][r];
          split_bf16x2(__uint_as_float(x << 16) * tb[kW + s], __uint_as_float(x & 0xffff0000u) * tb[kW + s + 1],
                       uh[kb][r], ul[kb][r]);
        }
    }
    if (outputs) {
      wg_wait<0>();  // P' V
      acc_fence(Y);
      if (bad) {  // this warp's rows: P' V over s <= t only, in FMAs (a masked zero never meets a NaN or inf)
        // s outside, so that v's two swizzled addresses are formed once an s (each Y[i] still sums in s order)
#pragma unroll 1
        for (int s = 0; s < 64; ++s) {
          const float v0 = __bfloat162float(*reinterpret_cast<const bf16*>(Vt + sw_off<2>(s, dvw + g)));
          const float v1 = __bfloat162float(*reinterpret_cast<const bf16*>(Vt + sw_off<2>(s, dvw + g + 8)));
#pragma unroll
          for (int i = 0; i < 32; ++i) {
            const int t = 8 * (i >> 2) + 2 * qd + (i & 1);
            if (s <= t) {
              const float pv = __bfloat162float(*reinterpret_cast<const bf16*>(der + L::kPh + cm_off(t, s))) +
                               __bfloat162float(*reinterpret_cast<const bf16*>(der + L::kPl + cm_off(t, s)));
              Y[i] = fmaf(pv, (i >> 1) & 1 ? v1 : v0, Y[i]);
            }
          }
        }
      }
      // y: this warpgroup's 64 columns staged swizzled (one 8 KB group), then one TMA store (the buffer's
      // previous store, two chunks back, has read it: its thread waited before this chunk's FULL barrier).
      // Staged by stmatrix: Y^T's 8 x 8 blocks (dv rows, t columns) land transposed, as t rows of 8 dv (16 bytes),
      // four blocks an instruction instead of a 2-byte store an element.
      unsigned char* ys = sm + L::kY + ((c & 1) * 2 + cw) * L::kYBuf;
#pragma unroll
      for (int k = 0; k < 4; ++k) {  // blocks m: (n, hh) = (2 k + (m >> 1), m & 1)
        float v[8];
#pragma unroll
        for (int m = 0; m < 4; ++m) {
          const int i = 4 * (2 * k + (m >> 1)) + 2 * (m & 1);  // Y[i]: dv = 16 wl + g + 8 hh, t = 8 n + 2 qd
          v[2 * m] = Y[i];
          v[2 * m + 1] = Y[i + 1];
        }
        const int mi = lane >> 3, n = 2 * k + (mi >> 1), hh = mi & 1;
        stsm_x4_trans((uint32_t)__cvta_generic_to_shared(ys) + sw_off<2>(8 * n + (lane & 7), 16 * wl + 8 * hh), v);
      }
      fence_async_smem();
      wg_barrier(wg);
      if (VARLEN && se - t0 < 64) {
        // the ragged last chunk of a packed sequence: only its own rows (a TMA store would write the next
        // sequence's), 16 bytes a store from the staged swizzled rows
        for (int e = tid & 127; e < (se - t0) * 8; e += 128)
          *reinterpret_cast<uint4*>(cb.y + (int64_t)(t0 + (e >> 3)) * p.sy.t + 64 * cw + 8 * (e & 7)) =
              *reinterpret_cast<const uint4*>(ys + sw_off<2>(e >> 3, 8 * (e & 7)));
      } else if ((tid & 127) == 0) {
        tma_store(&maps.y, ys, tb0 + t0, cw, cb.h, bc);
      }
    }
    // U = (V^T diag(w)) K in halves of 64 state rows (D_k), both in flight (y is out: its registers are
    // free); then S^T = gamma S^T + U.
    if (update) {
      float U0[32], U1[32];
      wg_fence();
#pragma unroll
      for (int h = 0; h < DK / 64; ++h) {
        float (&U)[32] = h == 0 ? U0 : U1;
        const uint64_t dkm = sw_desc(Kt + 8192 * h, 8192);  // (K MN-major: 16 rows of s a k-step)
#pragma unroll
        for (int kb = 0; kb < 4; ++kb) {
          if (kb == 0) wgmma_rs64_t_z(U, uh[0], dkm);
          else wgmma_rs64_t(U, uh[kb], desc_at(dkm, 2048 * kb), 1);
          wgmma_rs64_t(U, ul[kb], desc_at(dkm, 2048 * kb), 1);
        }
      }
      wg_commit();
      wg_wait<0>();
      acc_fence(U0);
#pragma unroll
      for (int i = 0; i < 32; ++i) S[i] = fmaf(gamma, S[i], U0[i]);
      if constexpr (DK == 128) {
        acc_fence(U1);
#pragma unroll
        for (int i = 0; i < 32; ++i) S[32 + i] = fmaf(gamma, S[32 + i], U1[i]);
      }
    }
    bar_arrive(kBarDone + 2 * cw + (c & 1));  // every read of chunk c's stage and derived slot done
  }
  if ((tid & 127) == 0) bulk_wait_all();  // y written before the block ends
  // The final state, or (state phase) the segment's own state contribution and gate product.
  float* dst = nullptr;
  StateStrides ds{0, 0, 0, 0};
  if (p.mode == 0 && last_seg && p.s_out != nullptr) { dst = p.s_out; ds = p.sso; }
  else if (p.mode != 0) {
    dst = cb.segment_state(p, cb.seg);
    ds = {0, 0, p.Dv, 1};
    if (tid == 128) p.seg_decays[cb.bh * (p.nseg - 1) + cb.seg] = seg_decay;
  }
  if (dst != nullptr) {
#pragma unroll
    for (int i = 0; i < DK / 2; ++i) {
      const int dv = dvw + g + 8 * ((i >> 1) & 1), dk = 8 * (i >> 2) + 2 * qd + (i & 1);
      dst[cb.b * ds.b + cb.h * ds.h + dk * ds.i + dv * ds.j] = S[i];
    }
  }
}

// One kernel, its instantiation by dtype: bfloat16 (D_k 64 or 128, VARLEN) or float32 (TF32, D_k 128).
template <typename scalar_t, int DK, bool VARLEN>
__global__ void __launch_bounds__(kSm90Threads, 1) chunk_sm90_kernel(const ChunkParams p,
                                                                     const __grid_constant__ Sm90Maps maps) {
#if defined(__CUDA_ARCH__) && !defined(GR_WGMMA)
  __trap();  // built for sm_90a only (_UNIT_GENCODE); make_plan picks it on compute capability 9.0 only
#endif
  griddep_wait<>();
  griddep_launch<>();
  if constexpr (sizeof(scalar_t) == 4) chunk_sm90_tf32<>(p, maps);
  else chunk_sm90_bf16<DK, VARLEN>(p, maps);
}

struct ChunkSM90Kernels {};

// execute_chunks' launches for this family: its own instantiations (bfloat16 D_k 64 or 128, float32), three warpgroups a
// block, the maps of q, k, v and y encoded on the host for each launch (no device work).
template <>
cudaError_t launch_chunk_kernel<ChunkSM90Kernels>(const Plan& pl, const ChunkParams& p, int64_t blocks, bool pdl,
                                                  cudaStream_t s) {
  static bool done[3][2][64] = {};
  const bool vl = p.cu != nullptr, f32 = pl.dtype == DType::f32;
  const int which = f32 ? 2 : pl.DK == 64;
  const auto kernel = f32 ? chunk_sm90_kernel<float, 128, false>
                      : pl.DK == 64 ? (vl ? chunk_sm90_kernel<bf16, 64, true> : chunk_sm90_kernel<bf16, 64, false>)
                                    : (vl ? chunk_sm90_kernel<bf16, 128, true> : chunk_sm90_kernel<bf16, 128, false>);
  cudaError_t err = allow_smem(kernel, done[which][vl]);
  if (err != cudaSuccess) return err;
  alignas(64) Sm90Maps maps;
  const int64_t B = p.BH / p.H;
  const int e = f32 ? 32 : 64;  // a box's innermost extent: a 128-byte swizzled row (tile_map)
  int hy = 0, by = 0;  // y is ours: contiguous
  if (tile_map(&maps.q, maps.hm[0], maps.bm[0], p.q, pl.dtype, p.Dk, p.H, p.T, B, p.sq, p.Dk / e) != CUDA_SUCCESS ||
      tile_map(&maps.k, maps.hm[1], maps.bm[1], p.k, pl.dtype, p.Dk, p.H, p.T, B, p.sk, p.Dk / e) != CUDA_SUCCESS ||
      tile_map(&maps.v, maps.hm[2], maps.bm[2], p.v, pl.dtype, p.Dv, p.H, p.T, B, p.sv, p.Dv / e) != CUDA_SUCCESS ||
      tile_map(&maps.y, hy, by, p.y, pl.dtype, p.Dv, p.H, p.T, B, p.sy, 64 / e) != CUDA_SUCCESS)
    return cudaErrorInvalidValue;
  return launch_threads(kernel, dim3((unsigned)blocks), kSm90Threads, pl.smem, s, pdl, p, maps);
}

}  // namespace
}  // namespace gr

extern "C" int gr_execute_chunk_sm90(const gr::Plan* pl, const gr::Problem* pr, float* work, cudaStream_t s,
                                     const char** failed) {
  return (int)gr::execute_chunks<gr::ChunkSM90Kernels>(*pl, *pr, work, s, failed);
}
"""

DECODE_SRC = r"""
// ===================================== decode: T steps from a pool of states, in place ======
// Serving's step: each batch row reads its state from a pool slot, advances T (small) steps and writes the
// state back. Memory-bound (the state is read and written once), so the layout is the pool's: a block a
// (row, head, tile of 32 or 128 state columns); a thread 4 adjacent columns of every 32nd row (16-byte accesses,
// a warp 4 whole 128-byte rows a pass); the D_k sum of y per step over the warp's rows by shuffles, then
// over the 8 warps through shared memory in a fixed order (y is the same whatever B, T or the grid).
// The update is the recurrent kernel's expression (fmaf(g, S, k * (beta v))): the same state, bitwise.
namespace gr {
namespace {

struct DecodeParams : Problem {
  int vtiles;  // ceil(D_v / NV)
};

__device__ __forceinline__ int64_t slot_of(const Problem& p, int64_t b) {
  if (p.idx == nullptr) return b;
  return p.idx64 ? static_cast<const int64_t*>(p.idx)[b * p.idx_stride]
                 : (int64_t) static_cast<const int*>(p.idx)[b * p.idx_stride];
}

// One step's inputs for this thread: k and q of its NP rows, v of its 4 MC columns (times beta), the gate.
template <int NP, int MC>
struct DecodeStep {
  float k[NP], q[NP], bv[MC][4], g;
};

// The same inputs as loaded, not yet converted: nothing consumes a load, so decode_persistent keeps the next
// item's in flight while it computes (a conversion right after the load would wait for it). Gate and beta
// as bits (float32, or a 16-bit pattern).
template <typename scalar_t, int NP, int MC>
struct DecodeRaw {
  scalar_t k[NP], q[NP], v[MC][4];
  uint32_t g, b;
};

template <typename scalar_t>
__device__ __forceinline__ uint32_t gate_bits(const void* base, int64_t off, bool wide) {
  if (sizeof(scalar_t) == 4 || wide) return __float_as_uint(static_cast<const float*>(base)[off]);
  return static_cast<const uint16_t*>(base)[off];
}
template <typename scalar_t>
__device__ __forceinline__ float gate_value(uint32_t bits, bool wide) {
  if (sizeof(scalar_t) == 4 || wide) return __uint_as_float(bits);
  if constexpr (std::is_same<scalar_t, __half>::value) return __half2float(__ushort_as_half((unsigned short)bits));
  else return __bfloat162float(__ushort_as_bfloat16((unsigned short)bits));
}

// Step t's inputs for the thread's rows r0 + 32 r and columns jc + 32 m + e of row b, head h. Rows and
// columns past D_k and D_v load element 0 (in bounds) and become zeros in decode_convert. FULL (the plan's
// `full`): q, k and v rows of unit stride, D_k = 32 NP and whole tiles, so no bound and no stride product:
// at few rows the step is a chain of dependent latencies, and every instruction on it counts.
template <typename scalar_t, int NP, int MC, bool FULL = false>
__device__ __forceinline__ void decode_load_raw(const Problem& p, int64_t b, int h, int r0, int jc, int64_t t,
                                                DecodeRaw<scalar_t, NP, MC>& x) {
  const scalar_t* q = static_cast<const scalar_t*>(p.q) + b * p.sq.b + h * p.sq.h + t * p.sq.t;
  const scalar_t* k = static_cast<const scalar_t*>(p.k) + b * p.sk.b + h * p.sk.h + t * p.sk.t;
  const scalar_t* v = static_cast<const scalar_t*>(p.v) + b * p.sv.b + h * p.sv.h + t * p.sv.t;
  x.g = gate_bits<scalar_t>(p.gate, b * p.sg.b + h * p.sg.h + t * p.sg.t, p.g32);
  x.b = gate_bits<scalar_t>(p.beta, b * p.sb.b + h * p.sb.h + t * p.sb.t, p.b32);
#pragma unroll
  for (int m = 0; m < MC; ++m)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int j = jc + 32 * m + e;
      x.v[m][e] = FULL ? v[j] : v[(j < p.Dv ? j : 0) * p.sv.d];
    }
#pragma unroll
  for (int r = 0; r < NP; ++r) {
    const int i = FULL || r0 + 32 * r < p.Dk ? r0 + 32 * r : 0;
    x.k[r] = FULL ? k[i] : k[i * p.sk.d];
    x.q[r] = FULL ? q[i] : q[i * p.sq.d];
  }
}
template <typename scalar_t, int NP, int MC, bool FULL = false>
__device__ __forceinline__ void decode_convert(const Problem& p, int r0, int jc, const DecodeRaw<scalar_t, NP, MC>& x,
                                               DecodeStep<NP, MC>& s) {
  s.g = gate_value<scalar_t>(x.g, p.g32);
  const float bt = gate_value<scalar_t>(x.b, p.b32);
#pragma unroll
  for (int m = 0; m < MC; ++m)
#pragma unroll
    for (int e = 0; e < 4; ++e) s.bv[m][e] = FULL || jc + 32 * m + e < p.Dv ? bt * to_float(x.v[m][e]) : 0.f;
#pragma unroll
  for (int r = 0; r < NP; ++r) {
    const bool in = FULL || r0 + 32 * r < p.Dk;
    s.k[r] = in ? to_float(x.k[r]) : 0.f;
    s.q[r] = in ? to_float(x.q[r]) : 0.f;
  }
}
template <typename scalar_t, int NP, int MC, bool FULL = false>
__device__ __forceinline__ void decode_load_step(const Problem& p, int64_t b, int h, int r0, int jc, int64_t t,
                                                 DecodeStep<NP, MC>& s) {
  DecodeRaw<scalar_t, NP, MC> x;
  decode_load_raw<scalar_t, NP, MC, FULL>(p, b, h, r0, jc, t, x);
  decode_convert<scalar_t, NP, MC, FULL>(p, r0, jc, x, s);
}

// One step's y for the columns jt + [0, 32 MC): the thread's row sums (acc) over the warp's 4 row groups
// by shuffles, then over the 8 warps in a fixed order through red (y is the same whatever B, T or the
// grid). Its barrier also orders the reads of the other red buffer (the step before) before the next
// step rewrites it. Rows that do not run (own false) write fill.
template <int MC, bool FULL = false, typename scalar_t>
__device__ __forceinline__ void decode_write_y(float (&acc)[MC][4], float (&red)[kMaxThreads / 32][32 * MC],
                                               scalar_t* y, int jt, int Dv, int64_t sd, bool own, float fill) {
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
#pragma unroll
  for (int m = 0; m < MC; ++m)
#pragma unroll
    for (int e = 0; e < 4; ++e) {  // lanes 8 apart share columns
      acc[m][e] += __shfl_xor_sync(0xffffffffu, acc[m][e], 8);
      acc[m][e] += __shfl_xor_sync(0xffffffffu, acc[m][e], 16);
    }
  if (lane < 8)
#pragma unroll
    for (int m = 0; m < MC; ++m)
      *reinterpret_cast<float4*>(&red[warp][32 * m + 4 * lane]) = make_float4(acc[m][0], acc[m][1], acc[m][2], acc[m][3]);
  __syncthreads();
  if (tid < 32 * MC && (FULL || jt + tid < Dv)) {
    float sum = 0.f;
#pragma unroll
    for (int w = 0; w < kMaxThreads / 32; ++w) sum += red[w][tid];
    y[FULL ? jt + tid : (jt + tid) * sd] = from_float<scalar_t>(own ? sum : fill);
  }
}

// Threads: r0 = tid / 8 owns rows r0 + 32 r (r < NP); lane group c = tid % 8 the columns jt + 32 m + 4 c + e
// (m < MC, e < 4). MC = 1 (32-column tiles: many blocks, for few rows) or 4 (whole 128-column rows: twice
// the state in flight an SM, for many rows; plan_decode picks).
template <int NP, int MC>
constexpr int kDecodeBlocks = MC == 1 ? (NP <= 4 ? 4 : 2) : (NP <= 4 ? 2 : 1);  // blocks an SM (registers)
template <typename scalar_t, int NP, int MC, bool VEC, bool FULL>
__global__ void __launch_bounds__(kMaxThreads, kDecodeBlocks<NP, MC>) decode_kernel(const DecodeParams p) {
  __shared__ __align__(16) float red[2][kMaxThreads / 32][32 * MC];  // a step's y partials, a warp's row
  griddep_wait<>();    // the previous kernel (often the last step's) wrote the pool or the inputs
  griddep_launch<>();  // the next one may start; it waits for this grid in its own griddep_wait
  int blk = blockIdx.x;
  const int tile = blk % p.vtiles;
  blk /= p.vtiles;
  const int h = blk % p.H, b = blk / p.H;
  const int tid = threadIdx.x, r0 = tid >> 3;
  const int jt = 32 * MC * tile, jc = jt + 4 * (tid & 7);  // column 0 of chunk m: jc + 32 m
  // Step 0's inputs first: their addresses need no index, so their loads overlap the index's round trip.
  DecodeRaw<scalar_t, NP, MC> x0;
  if (p.T > 0) decode_load_raw<scalar_t, NP, MC, FULL>(p, b, h, r0, jc, 0, x0);
  const int64_t slot = slot_of(p, b);
  const bool valid = slot >= 0 && slot < p.P;
  float* pool = p.s_out + (valid ? slot : 0) * p.ssi.b + h * p.ssi.h;  // 64-bit offsets: pools past 2^31
  float S[NP][MC][4];
#pragma unroll
  for (int r = 0; r < NP; ++r)
#pragma unroll
    for (int m = 0; m < MC; ++m) {
      const int i = r0 + 32 * r, j = jc + 32 * m;
      if constexpr (VEC) {  // D_v % 4 == 0, unit column stride, 16-byte aligned rows
        float4 x = make_float4(0.f, 0.f, 0.f, 0.f);
        if (valid && (FULL || (i < p.Dk && j < p.Dv))) x = *reinterpret_cast<const float4*>(pool + i * p.ssi.i + j);
        S[r][m][0] = x.x; S[r][m][1] = x.y; S[r][m][2] = x.z; S[r][m][3] = x.w;
      } else {
#pragma unroll
        for (int e = 0; e < 4; ++e)
          S[r][m][e] = valid && i < p.Dk && j + e < p.Dv ? pool[i * p.ssi.i + (j + e) * p.ssi.j] : 0.f;
      }
    }
  scalar_t* y = static_cast<scalar_t*>(p.y) + b * p.sy.b + h * p.sy.h;
  DecodeStep<NP, MC> x;
  if (p.T > 0) decode_convert<scalar_t, NP, MC, FULL>(p, r0, jc, x0, x);
  // A slot that an earlier row also names (a usage error) stays that row's: this row writes nothing (its
  // state loads above may overlap the owner's stores; the values are discarded).
  bool dup = false;
  if (p.idx != nullptr && valid)
    for (int e = tid; e < b; e += blockDim.x) dup |= slot_of(p, e) == slot;
  const bool own = __syncthreads_or(dup) == 0 && valid;  // the barrier in every block (block-uniform anyway)
  // Rows that do not run: -1 (padding) gives zeros, any other unusable slot NaN (visible without a sync).
  const float fill = slot == -1 ? 0.f : __int_as_float(0x7fffffff);
  for (int t = 0; t < p.T; ++t) {
    if (t > 0) decode_load_step<scalar_t, NP, MC, FULL>(p, b, h, r0, jc, t, x);
    float acc[MC][4] = {};
    if (own) {
#pragma unroll
      for (int r = 0; r < NP; ++r)
        if (FULL || r0 + 32 * r < p.Dk) {  // padded rows stay out: 0 * inf would be NaN
#pragma unroll
          for (int m = 0; m < MC; ++m)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              S[r][m][e] = fmaf(x.g, S[r][m][e], x.k[r] * x.bv[m][e]);
              acc[m][e] = fmaf(x.q[r], S[r][m][e], acc[m][e]);
            }
        }
    }
    decode_write_y<MC, FULL>(acc, red[t & 1], y + t * p.sy.t, jt, p.Dv, p.sy.d, own, fill);
  }
  if (!own) return;
#pragma unroll
  for (int r = 0; r < NP; ++r) {
    const int i = r0 + 32 * r;
    if (!FULL && i >= p.Dk) continue;
#pragma unroll
    for (int m = 0; m < MC; ++m) {
      const int j = jc + 32 * m;
      if constexpr (VEC) {
        if (FULL || j < p.Dv)
          *reinterpret_cast<float4*>(pool + i * p.ssi.i + j) = make_float4(S[r][m][0], S[r][m][1], S[r][m][2], S[r][m][3]);
      } else {
#pragma unroll
        for (int e = 0; e < 4; ++e)
          if (j + e < p.Dv) pool[i * p.ssi.i + (j + e) * p.ssi.j] = S[r][m][e];
      }
    }
  }
}

// decode_persistent: the same step for many rows, with a 16-byte pool and D_k <= 128. A block an SM walks
// the items (row, head, 128-column tile) strided by the grid; while it computes one, the next item's state
// (64 KB) is already in flight by cp.async into the other half of a shared-memory ring and its step-0 inputs
// into registers, so an SM always has a whole state on its way (decode_kernel has state bytes in flight
// only for part of each block's life, as many as its registers hold). Each state element is read from
// shared memory, updated and stored from registers (the last step) or back to shared memory (T > 1). The
// arithmetic and every sum's order are decode_kernel's with NV = 128: y and the state are bitwise its.
template <typename scalar_t>
__global__ void __launch_bounds__(kMaxThreads, 1) decode_persistent_kernel(const DecodeParams p) {
  extern __shared__ __align__(16) float ring[];
  __shared__ __align__(16) float red[2][kMaxThreads / 32][kRingD];
  griddep_wait<>();
  griddep_launch<>();
  constexpr int NP = 4, MC = 4;
  const int tid = threadIdx.x, r0 = tid >> 3, jc = 4 * (tid & 7);  // as decode_kernel's, within the tile
  const int64_t items = p.BH * p.vtiles;
  struct Item {
    int64_t b, slot;
    int h, jt;
    bool valid;
  };
  auto row_of = [&](int64_t it) { return it / p.vtiles / p.H; };
  auto item_at = [&](int64_t it, int64_t slot) {
    Item d;
    d.jt = kRingD * (int)(it % p.vtiles);
    d.h = (int)(it / p.vtiles % p.H);
    d.b = row_of(it);
    d.slot = slot;
    d.valid = slot >= 0 && slot < p.P;
    return d;
  };
  auto state_of = [&](const Item& d) { return p.s_out + (d.valid ? d.slot : 0) * p.ssi.b + d.h * p.ssi.h + d.jt; };
  // the item's tile into buf: 128 rows of 32 pieces of 16 bytes, zeros outside D_k x D_v and for unusable slots
  auto issue = [&](const Item& d, float* buf) {
    const float* src = state_of(d);
    for (int e = tid; e < kRingD * kRingD / 4; e += kMaxThreads) {
      const int i = e >> 5, j = 4 * (e & 31);
      const bool in = d.valid && i < p.Dk && d.jt + j < p.Dv;
      cp_async<16>(buf + i * kRingD + j, in ? src + i * p.ssi.i + j : src, in);
    }
    cp_async_commit<>();
  };
  // The index of the item after next is loaded an item ahead of its use: the state's address never waits
  // on a load.
  const int64_t grid = gridDim.x;
  int64_t it = blockIdx.x;  // the plan's grid is at most the items
  Item cur = item_at(it, slot_of(p, row_of(it))), nxt = cur;
  int64_t slot_next = it + grid < items ? slot_of(p, row_of(it + grid)) : 0;
  DecodeStep<NP, MC> x;
  DecodeRaw<scalar_t, NP, MC> xn;  // the next item's, converted once its state is being computed
  issue(cur, ring);
  decode_load_step<scalar_t>(p, cur.b, cur.h, r0, cur.jt + jc, 0, x);
  for (int n = 0; it < items; ++n, it += grid) {
    float* S = ring + (n & 1) * kRingD * kRingD;
    if (it + grid < items) {
      // the other buffer's last reads (the item before) came before the last step's barrier
      nxt = item_at(it + grid, slot_next);
      issue(nxt, ring + ((n + 1) & 1) * kRingD * kRingD);
      decode_load_raw<scalar_t>(p, nxt.b, nxt.h, r0, nxt.jt + jc, 0, xn);
      if (it + 2 * grid < items) slot_next = slot_of(p, row_of(it + 2 * grid));
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    // duplicates as decode_kernel: the lowest row keeps the slot
    bool dup = false;
    if (p.idx != nullptr && cur.valid)
      for (int64_t e = tid; e < cur.b; e += blockDim.x) dup |= slot_of(p, e) == cur.slot;
    const bool own = __syncthreads_or(dup) == 0 && cur.valid;  // also: every thread's copies have landed
    const float fill = cur.slot == -1 ? 0.f : __int_as_float(0x7fffffff);
    float* pool = state_of(cur);
    scalar_t* y = static_cast<scalar_t*>(p.y) + cur.b * p.sy.b + cur.h * p.sy.h;
    for (int t = 0; t < p.T; ++t) {
      if (t > 0) decode_load_step<scalar_t>(p, cur.b, cur.h, r0, cur.jt + jc, t, x);
      const bool last = t == p.T - 1;
      float acc[MC][4] = {};
      if (own) {
#pragma unroll
        for (int r = 0; r < NP; ++r) {
          const int i = r0 + 32 * r;
          if (i >= p.Dk) continue;  // padded rows stay out: 0 * inf would be NaN
#pragma unroll
          for (int m = 0; m < MC; ++m) {
            const int j = jc + 32 * m;
            const float4 s = *reinterpret_cast<const float4*>(S + i * kRingD + j);
            float s4[4] = {s.x, s.y, s.z, s.w};
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              s4[e] = fmaf(x.g, s4[e], x.k[r] * x.bv[m][e]);
              acc[m][e] = fmaf(x.q[r], s4[e], acc[m][e]);
            }
            const float4 o = make_float4(s4[0], s4[1], s4[2], s4[3]);
            if (!last)
              *reinterpret_cast<float4*>(S + i * kRingD + j) = o;  // only this thread reads it back
            else if (cur.jt + j < p.Dv)
              *reinterpret_cast<float4*>(pool + i * p.ssi.i + j) = o;
          }
        }
      }
      decode_write_y<MC>(acc, red[t & 1], y + t * p.sy.t, cur.jt, p.Dv, p.sy.d, own, fill);
    }
    decode_convert<scalar_t>(p, r0, nxt.jt + jc, xn, x);  // (stale on the last item: unused)
    cur = nxt;
  }
}

template <typename scalar_t>
cudaError_t launch_decode(const Plan& pl, const Problem& pr, cudaStream_t s) {
  DecodeParams p;
  static_cast<Problem&>(p) = pr;
  p.vtiles = pl.vtiles;
  const dim3 grid((unsigned)pl.blocks);
  if (pl.kernel == Kernel::decode_persistent) {
    static bool done[64] = {};
    const cudaError_t err = allow_smem(decode_persistent_kernel<scalar_t>, done);
    return err != cudaSuccess ? err : launch_ex(decode_persistent_kernel<scalar_t>, grid, pl.smem, s, pl.pdl, p);
  }
#define GR_CASE(NP_, MC_)                                                                                  \
  if (pl.R == NP_ && pl.NV == 32 * MC_)                                                                    \
    return pl.vec ? launch_ex(decode_kernel<scalar_t, NP_, MC_, true, false>, grid, 0, s, pl.pdl, p)       \
                  : launch_ex(decode_kernel<scalar_t, NP_, MC_, false, false>, grid, 0, s, pl.pdl, p);
#define GR_FULL(NP_) \
  if (pl.R == NP_) return launch_ex(decode_kernel<scalar_t, NP_, 1, true, true>, grid, 0, s, pl.pdl, p);
  if (pl.full) {  // (plan_decode: NV = 32 and a 16-byte pool)
    GR_FULL(1) GR_FULL(2) GR_FULL(4) GR_FULL(8)
    return cudaErrorInvalidValue;
  }
  GR_CASE(1, 1) GR_CASE(2, 1) GR_CASE(4, 1) GR_CASE(8, 1) GR_CASE(1, 4) GR_CASE(2, 4) GR_CASE(4, 4)
#undef GR_FULL
#undef GR_CASE
  return cudaErrorInvalidValue;
}

}  // namespace
}  // namespace gr

extern "C" int gr_execute_decode(const gr::Plan* pl, const gr::Problem* pr, float*, cudaStream_t s, const char** failed) {
  using namespace gr;
  *failed = pl->kernel == Kernel::decode_persistent ? "decode_persistent" : "decode";
  switch (pl->dtype) {
    case DType::f32: return (int)launch_decode<float>(*pl, *pr, s);
    case DType::f16: return (int)launch_decode<__half>(*pl, *pr, s);
    case DType::bf16: return (int)launch_decode<__nv_bfloat16>(*pl, *pr, s);
  }
  return (int)cudaErrorInvalidValue;
}
"""

BACKWARD_SRC = r"""
// ===================================== recurrent_bwd: the reverse loop, element by element =====
// The state's gradient Sh_t = dL/dS_t (steps t = 1..T, S_t the state after step t) runs backwards:
//   Sh_T = G + q_T dy_T^T (G: the final state's gradient, or 0),   Sh_{t-1} = g_t Sh_t + q_{t-1} dy_{t-1}^T,
//   dS_0 = g_1 Sh_1,   u_t = Sh_t v_t,   dk_t = beta_t u_t,   dbeta_t = k_t . u_t,   dv_t = beta_t Sh_t^T k_t,
//   dgate_t = <Sh_t, S_{t-1}> (Frobenius).
// Products only, no division by a gate or beta: gates of 0, < 0 and > 1 are exact. dq_t = S_t dy_t is a
// forward pass, which the host plans (make_plan_backward). S_{t-1} is needed in reverse order: the block
// runs the forward once and keeps the state every kBwdCheckpoint steps (workspace); for each such span,
// backwards, it recomputes the state every TC steps (workspace), and for each run of TC steps, backwards,
// the TC states before its steps (shared memory; a thread reads back only what it wrote: no barrier).
// The update is the recurrent kernel's, fmaf(g, S, k (beta v)): the recomputed states are bitwise its.
// Layout: a block a (b, h), 256 threads; thread tid holds elements (tid / 8 + 32 r, 32 tile + 4 (tid % 8) + e),
// r < R, e < 4, of one 32-column tile of the state. The block walks the D_v tiles in order; dk, dgate and
// dbeta (sums over all columns) add up tile by tile in fp32 in the workspace: deterministic, no atomics.
namespace gr {
namespace {

struct BwdParams : BwdProblem {
  int vtiles, TC, nck, nsub;  // 32-column tiles; steps a recomputed run; checkpoints a (b, h); runs a span
  float* ckpt;                // a block's nck checkpoints, then its nsub run starts (put_state layout)
  float* acc;                 // tile sums, rows (b, t, h) of D_k + 2 floats (vtiles > 1), or nullptr
};

// This thread's R x 4 values of a state at [(r * 256 + tid) * 4 + e]: float4s, consecutive threads adjacent.
template <int R>
__device__ __forceinline__ void put_state(float* dst, const float (&S)[R][4]) {
#pragma unroll
  for (int r = 0; r < R; ++r)
    reinterpret_cast<float4*>(dst)[r * kMaxThreads + threadIdx.x] = make_float4(S[r][0], S[r][1], S[r][2], S[r][3]);
}
template <int R>
__device__ __forceinline__ void get_state(const float* src, float (&S)[R][4]) {
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const float4 x = reinterpret_cast<const float4*>(src)[r * kMaxThreads + threadIdx.x];
    S[r][0] = x.x; S[r][1] = x.y; S[r][2] = x.z; S[r][3] = x.w;
  }
}
// This thread's values of a (B, H, D_k, D_v) fp32 state (any strides) of (b, h); zero without one or past D.
template <int R>
__device__ __forceinline__ void load_state_tile(const float* base, StateStrides ss, int64_t b, int h, int Dk, int Dv,
                                                int r0, int j0, float (&S)[R][4]) {
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int i = r0 + 32 * r, j = j0 + e;
      S[r][e] = base != nullptr && i < Dk && j < Dv ? base[b * ss.b + h * ss.h + i * ss.i + j * ss.j] : 0.f;
    }
}

// One step's values for this thread: k (and q) of its rows, v (and dy) of its columns, gate, beta; zeros
// past D_k and D_v.
template <int R>
struct BwdStep { float k[R], q[R], v[4], dy[4], g, b; };

template <typename E, int R, bool GRADS>
__device__ __forceinline__ void load_bwd_step(const BwdParams& p, int64_t b, int h, int64_t t, int r0, int j0,
                                              BwdStep<R>& s) {
  s.g = GateSeq<E>(p.gate, b * p.sg.b + h * p.sg.h, p.g32)[t * p.sg.t];
  s.b = GateSeq<E>(p.beta, b * p.sb.b + h * p.sb.h, p.b32)[t * p.sb.t];
  const E* k = static_cast<const E*>(p.k) + b * p.sk.b + t * p.sk.t + h * p.sk.h;
  const E* v = static_cast<const E*>(p.v) + b * p.sv.b + t * p.sv.t + h * p.sv.h;
  const E* q = static_cast<const E*>(p.q) + b * p.sq.b + t * p.sq.t + h * p.sq.h;
  const E* dy = static_cast<const E*>(p.dy) + b * p.sdy.b + t * p.sdy.t + h * p.sdy.h;
#pragma unroll
  for (int r = 0; r < R; ++r) {  // rows: k (and q)
    const bool in = r0 + 32 * r < p.Dk;
    s.k[r] = in ? to_float(k[(r0 + 32 * r) * p.sk.d]) : 0.f;
    if constexpr (GRADS) s.q[r] = in ? to_float(q[(r0 + 32 * r) * p.sq.d]) : 0.f;
  }
#pragma unroll
  for (int e = 0; e < 4; ++e) {  // columns: v (and dy)
    const bool in = j0 + e < p.Dv;
    s.v[e] = in ? to_float(v[(j0 + e) * p.sv.d]) : 0.f;
    if constexpr (GRADS) s.dy[e] = in ? to_float(dy[(j0 + e) * p.sdy.d]) : 0.f;
  }
}

// Elements past D_k or D_v stay exactly 0: a NaN in a real v or dy must not reach them (0 * NaN).
template <int R>
__device__ __forceinline__ void advance_state(const BwdStep<R>& s, const bool (&ok)[R][4], float (&S)[R][4]) {
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int e = 0; e < 4; ++e)
      if (ok[r][e]) S[r][e] = fmaf(s.g, S[r][e], s.k[r] * (s.b * s.v[e]));
}

// A gate or beta gradient in that input's dtype (float32 beside 16-bit q, k, v: wide).
template <typename E>
__device__ __forceinline__ void store_gate_grad(void* out, int64_t i, float x, bool wide) {
  if (sizeof(E) == 4 || wide) static_cast<float*>(out)[i] = x;
  else static_cast<E*>(out)[i] = from_float<E>(x);
}
// A sum over the column tiles: tile 0 writes it, the others add in order, the last stores the result.
__device__ __forceinline__ float tile_sum(float* acc, float x, int tile, int vtiles, bool& last) {
  last = tile == vtiles - 1;
  if (acc == nullptr) return x;
  if (tile > 0) x += *acc;
  if (!last) *acc = x;
  return x;
}

template <typename E, int R>
__global__ void __launch_bounds__(kMaxThreads, 1) recurrent_bwd_kernel(const BwdParams p) {
  extern __shared__ __align__(16) float runs[];         // TC states, put_state layout
  __shared__ float red_v[2][kMaxThreads / 32][32];    // a step's column sums (dv) a warp, two steps' buffers
  __shared__ float red_s[2][kMaxThreads / 32][2];     // a step's (dgate, dbeta) sums a warp
  const int64_t bh = blockIdx.x, b = bh / p.H;
  const int h = (int)(bh - b * p.H);
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, r0 = tid >> 3;
  constexpr int kState = R * kBwdStateFloats;
  float* ck = p.ckpt + bh * (int64_t)(p.nck + p.nsub) * kState;  // checkpoints
  float* starts = ck + (int64_t)p.nck * kState;                    // run starts of the current span
  const int64_t H = p.H, Dk = p.Dk, Dv = p.Dv;
  int n = 0;  // steps done: the reduction buffers' parity
  for (int tile = 0; tile < p.vtiles; ++tile) {
    const int j0 = 32 * tile + 4 * (tid & 7);
    bool ok[R][4];
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
      for (int e = 0; e < 4; ++e) ok[r][e] = r0 + 32 * r < p.Dk && j0 + e < p.Dv;
    float S[R][4];
    BwdStep<R> s, nx;  // nx: the next step's values, loaded a step ahead (their latency under this step's work)
    load_state_tile(p.s_in, p.ssi, b, h, p.Dk, p.Dv, r0, j0, S);
    load_bwd_step<E, R, false>(p, b, h, 0, r0, j0, nx);
    for (int t = 0; t < p.T; ++t) {
      s = nx;
      if (t + 1 < p.T) load_bwd_step<E, R, false>(p, b, h, t + 1, r0, j0, nx);
      if (t % kBwdCheckpoint == 0) put_state(ck + (int64_t)(t / kBwdCheckpoint) * kState, S);
      advance_state(s, ok, S);
    }
    float G[R][4];  // Sh, without the current step's q dy^T until the step adds it
    load_state_tile(p.dfinal, p.sdf, b, h, p.Dk, p.Dv, r0, j0, G);
    for (int c = p.nck - 1; c >= 0; --c) {
      const int c0 = c * kBwdCheckpoint, c1 = min(p.T, c0 + kBwdCheckpoint);
      get_state(ck + (int64_t)c * kState, S);
      load_bwd_step<E, R, false>(p, b, h, c0, r0, j0, nx);
      for (int t = c0; t < c1; ++t) {
        s = nx;
        if (t + 1 < c1) load_bwd_step<E, R, false>(p, b, h, t + 1, r0, j0, nx);
        if ((t - c0) % p.TC == 0) put_state(starts + (int64_t)((t - c0) / p.TC) * kState, S);
        advance_state(s, ok, S);
      }
      for (int a = c0 + (c1 - 1 - c0) / p.TC * p.TC; a >= c0; a -= p.TC) {
        const int e1 = min(c1, a + p.TC);
        get_state(starts + (int64_t)((a - c0) / p.TC) * kState, S);
        load_bwd_step<E, R, false>(p, b, h, a, r0, j0, nx);
        for (int t = a; t < e1; ++t) {
          s = nx;
          if (t + 2 < e1) load_bwd_step<E, R, false>(p, b, h, t + 1, r0, j0, nx);
          put_state(runs + (t - a) * kState, S);
          if (t + 1 < e1) advance_state(s, ok, S);
        }
        load_bwd_step<E, R, true>(p, b, h, e1 - 1, r0, j0, nx);
        for (int t = e1 - 1; t >= a; --t, ++n) {
          s = nx;
          if (t > a) load_bwd_step<E, R, true>(p, b, h, t - 1, r0, j0, nx);
          float Sp[R][4];  // the state before step t
          get_state(runs + (t - a) * kState, Sp);
          float u[R], dvp[4] = {0.f, 0.f, 0.f, 0.f}, dgp = 0.f;
#pragma unroll
          for (int r = 0; r < R; ++r) {
            u[r] = 0.f;
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              if (ok[r][e]) G[r][e] = fmaf(s.q[r], s.dy[e], G[r][e]);  // Sh_t
              u[r] = fmaf(G[r][e], s.v[e], u[r]);
              dvp[e] = fmaf(G[r][e], s.k[r], dvp[e]);
              dgp = fmaf(G[r][e], Sp[r][e], dgp);
            }
          }
          // rows: the 8 lanes of a row group hold the tile's 32 columns
#pragma unroll
          for (int r = 0; r < R; ++r)
#pragma unroll
            for (int o = 1; o < 8; o <<= 1) u[r] += __shfl_xor_sync(0xffffffffu, u[r], o);
          float dbp = 0.f;  // k . u over this thread's rows; one lane a row group counts them
#pragma unroll
          for (int r = 0; r < R; ++r) dbp = fmaf(s.k[r], u[r], dbp);
          if ((lane & 7) != 0) dbp = 0.f;
          // columns: lanes 8 apart share them (the warp's 4 row groups)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            dvp[e] += __shfl_xor_sync(0xffffffffu, dvp[e], 8);
            dvp[e] += __shfl_xor_sync(0xffffffffu, dvp[e], 16);
          }
#pragma unroll
          for (int o = 16; o > 0; o >>= 1) {
            dgp += __shfl_xor_sync(0xffffffffu, dgp, o);
            dbp += __shfl_xor_sync(0xffffffffu, dbp, o);
          }
          if (lane < 8)
#pragma unroll
            for (int e = 0; e < 4; ++e) red_v[n & 1][warp][4 * lane + e] = dvp[e];
          if (lane == 0) {
            red_s[n & 1][warp][0] = dgp;
            red_s[n & 1][warp][1] = dbp;
          }
          const int64_t row = (b * p.T + t) * H + h;  // our outputs are contiguous (B, T, H, ...)
          if ((lane & 7) == 0)
#pragma unroll
            for (int r = 0; r < R; ++r) {
              const int i = r0 + 32 * r;
              if (i < p.Dk) {
                bool last;
                const float x = tile_sum(p.acc ? p.acc + row * (Dk + 2) + i : nullptr, s.b * u[r], tile, p.vtiles, last);
                if (last) static_cast<E*>(p.dk)[row * Dk + i] = from_float<E>(x);
              }
            }
          __syncthreads();  // also: the readers of step n - 1's buffers are done
          if (tid < 32 && 32 * tile + tid < p.Dv) {
            float sum = 0.f;
#pragma unroll
            for (int w = 0; w < kMaxThreads / 32; ++w) sum += red_v[n & 1][w][tid];
            static_cast<E*>(p.dv)[row * Dv + 32 * tile + tid] = from_float<E>(s.b * sum);
          }
          if (tid == 32) {
            float dg = 0.f, db = 0.f;
#pragma unroll
            for (int w = 0; w < kMaxThreads / 32; ++w) {
              dg += red_s[n & 1][w][0];
              db += red_s[n & 1][w][1];
            }
            bool last;
            float* a = p.acc ? p.acc + row * (Dk + 2) + Dk : nullptr;
            dg = tile_sum(a, dg, tile, p.vtiles, last);
            db = tile_sum(a ? a + 1 : nullptr, db, tile, p.vtiles, last);
            if (last) {
              store_gate_grad<E>(p.dgate, row, dg, p.g32);
              store_gate_grad<E>(p.dbeta, row, db, p.b32);
            }
          }
#pragma unroll
          for (int r = 0; r < R; ++r)
#pragma unroll
            for (int e = 0; e < 4; ++e)
              if (ok[r][e]) G[r][e] *= s.g;  // towards Sh_{t-1}
        }
      }
    }
    if (p.ds0 != nullptr)  // dS_0 = g_1 Sh_1: G after the last step's multiplication; ours, contiguous
#pragma unroll
      for (int r = 0; r < R; ++r)
#pragma unroll
        for (int e = 0; e < 4; ++e)
          if (ok[r][e]) p.ds0[(bh * Dk + r0 + 32 * r) * Dv + j0 + e] = G[r][e];
  }
}

// ===================================== chunk_bwd: the chunked backward on TF32 mma.sync ========
// docs/training-design.md 1.2-1.3. The C x C, C x D and D x D products on TF32 mma.sync with 3xTF32 splits
// (fp32-level results for every dtype; a staged 16-bit input is a TF32 value, so its lo term is dropped), the
// masked sums and the gate terms in fp32 FMAs. One block a (b, h, segment), kBwdThreads threads, chunks of
// kBwdChunk steps, D_k, D_v <= 128. S (the state before the chunk) and G (the gradient of the state after it) live in
// shared memory.
//   Phase F: the forward over the chunks, S at every chunk start into the workspace (recomputing every other one
//   in phase R instead halved the workspace but cost 5-6% at (8, 2048, 16, 128): perf-notes, twenty-first session).
//   Phase R, chunks backwards: S from the workspace; q, k, v, dy (as float) and the gate tables staged;
//     QK = Q K^T, Dd = dY V^T (C x C); R = dY S^T, Rk = V G^T, KG = K G (mma, then to S's space for the
//     FMA stages, S being dead by then); c0 = <G, S>; f_u = q_u . R_u, e_s = k_s . Rk_s;
//     E[u][s] = beta_s QK Dd (s < u);
//     dq_t = A_t R_t + sum_{s<=t} L[t][s] beta_s Dd[t][s] k_s
//     dk_s = beta_s dkt_s, dkt_s = w_s Rk_s + sum_{u>=s} L[u][s] Dd[u][s] q_u, dbeta_s = k_s . dkt_s
//     dv_s = beta_s w_s KG_s + sum_{u>=s} L[u][s] beta_s QK[u][s] dy_u
//     dgate_t = w_t Ah_t c0 + w_t sum_{s<t} L[t-1][s] beta_s e_s + Ah_t sum_{u>=t} L[u][t] f_u
//               + sum_{u>=t} L[u][t] sum_{s<t} E[u][s] L[t-1][s]     (the "hole" at t: no quotient)
//     G <- A_{C-1} G + sum_u (A_u q_u) dy_u^T (from zero, one FMA join), after G's last read.
// dS_0 = G at the end. Padded steps past T are identities (gate 1, beta 0, zero rows). Fixed-order sums.
// Segments (sequence parallelism, docs/training-design.md 1.4): a (b, h) sequence's chunks in nseg segments of
// seg_chunks (the last may be shorter; down to one chunk), a block each. Segment j starts from S at its first chunk and ends on
// Gamma, the gradient of the state after its last chunk; with nseg > 1 both come from chunk_bwd_prep (each
// segment's own contribution from zero, and its decay D_j, the product of its gates) and chunk_bwd_scan
// (S_{j+1} = D_j S_j + U_j forwards, Gamma_{j-1} = D_j Gamma_j + W_j backwards, elementwise in segment order).
struct ChunkBwdParams : BwdProblem {
  int nck;              // chunks of the sequence
  int nseg, seg_chunks;  // segments a (b, h), chunks a segment
  float* ckpt;          // (B H nseg, seg_chunks, D_k D_v): the state at each segment's chunk starts
  float* seg_s;         // (B H, nseg - 1, D_k D_v): U_j (prep), then S at segment j + 1's start (scan)
  float* seg_g;         // (B H, nseg - 1, D_k D_v): W_{j+1} (prep), then Gamma after segment j (scan)
  float* seg_d;         // (B H, nseg): D_j
};

namespace cb {
// P = DM + 4: rows 16-byte aligned (ldmatrix), and an mma fragment read at row g, column q (g < 8, q < 4) falls
// in 32 distinct banks; the FMA stages read along rows (lanes on consecutive columns).
// NT threads: 16 warps, 4 a scheduler (8 left the stages' latencies exposed). Warp w owns state rows
// 16 (w % 8) .. and columns 64 (w / 8) .. (st_i, st_j, rank_update).
constexpr int C = kBwdChunk, NT = kBwdThreads, NW = NT / 32, DM = 128, P = DM + 4, PC = C + 1;
// shared memory (floats): S, G (DM x P), Q, K, V, Y (C x P), QK, DD, EE, L (C x PC: the dgate loop reads L down a column), 7 vectors of C, warp sums
constexpr int kS = 0, kG = kS + DM * P, kQ = kG + DM * P, kK = kQ + C * P, kV = kK + C * P, kY = kV + C * P;
constexpr int kQK = kY + C * P, kDD = kQK + C * PC, kEE = kDD + C * PC, kL = kEE + C * PC;
constexpr int kGv = kL + C * PC, kBv = kGv + C, kA = kBv + C, kAh = kA + C, kW = kAh + C, kF = kW + C, kE = kF + C;
constexpr int kRed = kE + C, kFloats = kRed + NW;
static_assert(kFloats * 4 == (int)kChunkBwdSmem, "chunk_bwd_smem");
static_assert(3 * C * P + 3 * C * PC <= DM * P, "R, Rk, KG and the masked weights fit in S's space");

// This thread's state elements: i = 16 (warp % 8) + a (a < 16), j = 64 (warp / 8) + lane + 32 c (c < NC): the
// rows and columns rank_update gives the warp.
constexpr int NC = 2, RT = C / NW;  // RT: the masked stages' rows a warp
__device__ __forceinline__ int st_i(int a) { return 16 * ((threadIdx.x >> 5) & 7) + a; }
__device__ __forceinline__ int st_j(int c) { return 64 * (threadIdx.x >> 8) + (threadIdx.x & 31) + 32 * c; }

__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}

// M <- m M + sum_s (x1_s x2_s X[s][i]) Y[s][j] (x1, x2: per-step scales or nullptr): the state's update and its
// gradient's. The sum from zero on mma (k = the chunk's steps), M joins in one FMA. Warp w owns rows 16 (w % 8)
// .. + 15 and 8 tiles of 8 columns from 64 (w / 8) (as st_i, st_j). kExactY: Y's staged values are TF32 values
// (16-bit inputs).
template <bool kExactY>
__device__ __forceinline__ void rank_update(float* M, float m, const float* X, const float* x1, const float* x2,
                                            const float* Y) {
  const int lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3, i0 = 16 * ((threadIdx.x >> 5) & 7);
  const int j0 = 64 * (threadIdx.x >> 8);
  float acc[8][4];
#pragma unroll
  for (int n = 0; n < 8; ++n) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.f;
  // fp32: rolled, since three inlined copies unrolled missed the instruction cache (profile of the 8-warp
  // kernel); 16-bit inputs were faster unrolled
#pragma unroll(kExactY ? 4 : 1)
  for (int s0 = 0; s0 < C; s0 += 8) {
    const float c0 = (x1 ? x1[s0 + q] : 1.f) * (x2 ? x2[s0 + q] : 1.f);
    const float c1 = (x1 ? x1[s0 + q + 4] : 1.f) * (x2 ? x2[s0 + q + 4] : 1.f);
    const float* xa = X + (s0 + q) * P + i0 + g;
    const float a[4] = {c0 * xa[0], c0 * xa[8], c1 * xa[4 * P], c1 * xa[4 * P + 8]};
    uint32_t ah[4], al[4];
    split_tf32<4>(a, ah, al);
#pragma unroll
    for (int n = 0; n < 8; ++n) {
      const float* yb = Y + (s0 + q) * P + j0 + 8 * n + g;
      const float b[2] = {yb[0], yb[4 * P]};
      mma_terms<true, !kExactY>(acc[n], ah, al, b);  // 16-bit inputs: Y's lo terms are zero
    }
  }
#pragma unroll
  for (int n = 0; n < 8; ++n) {
    float2* r0 = reinterpret_cast<float2*>(M + (i0 + g) * P + j0 + 8 * n + 2 * q);
    float2* r1 = reinterpret_cast<float2*>(M + (i0 + g + 8) * P + j0 + 8 * n + 2 * q);
    const float2 u = *r0, v = *r1;
    *r0 = make_float2(fmaf(m, u.x, acc[n][0]), fmaf(m, u.y, acc[n][1]));
    *r1 = make_float2(fmaf(m, v.x, acc[n][2]), fmaf(m, v.y, acc[n][3]));
  }
}

// acc[n] += A B for a 16 x 8 NB strip: A the 16 rows at a (pitch P, k along the row, by ldmatrix), B[k][n] at
// b[n * P + k] (kBT: S^T, G^T, conflict-free) or b[k * P + n]; k < kend (a multiple of 8).
template <bool kExactA, bool kBT, int NB>
__device__ __forceinline__ void strip(float (&acc)[NB][4], const float* a, const float* b, int kend) {
  const int lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
#pragma unroll 2
  for (int k0 = 0; k0 < kend; k0 += 8) {
    float af[4];
    uint32_t ah[4], al[4];
    frag_a(af, a + k0, P, g, q);
    prep_a<!kExactA>(af, ah, al);
#pragma unroll
    for (int n = 0; n < NB; ++n) {
      const float* bp = kBT ? b + (8 * n + g) * P + k0 + q : b + (k0 + q) * P + 8 * n + g;
      const float bb[2] = {bp[0], kBT ? bp[4] : bp[4 * P]};
      mma_terms<!kExactA, true>(acc[n], ah, al, bb);  // 16-bit inputs: A's lo terms are zero
    }
  }
}

// Two independent strips in one k-loop (twice the accumulator chains in flight a warp): acc0 += A0 B0^T and
// acc1 += A1 B1^T, both with B^T rows (kBT), k < kend.
template <bool kExactA, int NB>
__device__ __forceinline__ void strip2(float (&acc0)[NB][4], const float* a0, const float* b0, float (&acc1)[NB][4],
                                       const float* a1, const float* b1, int kend) {
  const int lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
#pragma unroll 1
  for (int k0 = 0; k0 < kend; k0 += 8) {
    float af0[4], af1[4];
    uint32_t ah0[4], al0[4], ah1[4], al1[4];
    frag_a(af0, a0 + k0, P, g, q);
    frag_a(af1, a1 + k0, P, g, q);
    prep_a<!kExactA>(af0, ah0, al0);
    prep_a<!kExactA>(af1, ah1, al1);
#pragma unroll
    for (int n = 0; n < NB; ++n) {
      const float* bp0 = b0 + (8 * n + g) * P + k0 + q;
      const float* bp1 = b1 + (8 * n + g) * P + k0 + q;
      const float bb0[2] = {bp0[0], bp0[4]}, bb1[2] = {bp1[0], bp1[4]};
      mma_terms<!kExactA, true>(acc0[n], ah0, al0, bb0);
      mma_terms<!kExactA, true>(acc1[n], ah1, al1, bb1);
    }
  }
}

// Whether a (B, T, H, D) tensor's rows can be staged 16 bytes at a time: unit-stride rows, D a multiple of 8 (a
// thread's 8 columns all in or all out), and the base and the b, h, t strides 16-byte aligned.
template <typename E>
__device__ __forceinline__ bool rows16(const void* ptr, const Strides4& st, int D) {
  constexpr int64_t e = 16 / sizeof(E);
  return st.d == 1 && D % 8 == 0 && (reinterpret_cast<uintptr_t>(ptr) & 15) == 0 && st.b % e == 0 &&
         st.h % e == 0 && st.t % e == 0;
}

// Steps t0 .. t0 + C - 1 of a (B, T, H, D) tensor (any strides) for (b, h), zeros past T and D: load() issues
// this thread's C DM / NT elements into registers, store() writes them to shared memory (pitch P). Several
// tensors' loads go first and stay in flight together (a load a store in one loop waited out each load's
// latency in turn: a third of the kernel's time, ncu, eighteenth session). Vector form (rows16): a thread
// takes row tid / 16, columns 8 (tid % 16) .., one 16-byte load (two for fp32) kept raw until store(); else
// column tid % DM of rows tid / DM + 4n, an element a load.
template <typename E>
struct Staged {
  static constexpr int N = C * DM / NT;
  static_assert(DM == 16 * 8 && N == 8, "the vector form: 16 threads a row, 8 columns a thread");
  float x[N];  // the scalar form's values; the vector form's raw 16-byte words
  bool vec;
  __device__ __forceinline__ void load(const void* src, const Strides4& st, int64_t b, int h, int t0, int T, int D,
                                       bool v) {
    vec = v;
    if (vec) {
      const int r = threadIdx.x / 16, c = 8 * (threadIdx.x % 16);
      const bool in = t0 + r < T && c < D;
      const uint4* p4 = reinterpret_cast<const uint4*>(static_cast<const E*>(src) + b * st.b + h * st.h +
                                                       (int64_t)(t0 + r) * st.t + c);
      const uint4 z = make_uint4(0u, 0u, 0u, 0u);
#pragma unroll
      for (int u = 0; u < (int)sizeof(E) / 2; ++u) {  // fp32: two words, 16-bit: one
        const uint4 w = in ? __ldg(p4 + u) : z;
        x[4 * u] = __uint_as_float(w.x), x[4 * u + 1] = __uint_as_float(w.y);
        x[4 * u + 2] = __uint_as_float(w.z), x[4 * u + 3] = __uint_as_float(w.w);
      }
      return;
    }
    const int d = threadIdx.x % DM, r0 = threadIdx.x / DM;
    const int64_t step = (NT / DM) * st.t;  // one pointer stepped down the rows: no index products
    const E* ptr = static_cast<const E*>(src) + b * st.b + h * st.h + (int64_t)(t0 + r0) * st.t + (int64_t)d * st.d;
#pragma unroll
    for (int n = 0; n < N; ++n, ptr += step) x[n] = t0 + r0 + n * (NT / DM) < T && d < D ? to_float(*ptr) : 0.f;
  }
  __device__ __forceinline__ void store(float* dst) const {
    if (vec) {
      const int r = threadIdx.x / 16, c = 8 * (threadIdx.x % 16);
      float y[8];
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        if constexpr (sizeof(E) == 4) {
          y[e] = x[e];
        } else {  // element e is half e % 2 of word e / 2
          const uint32_t w = __float_as_uint(x[e / 2]);
          if constexpr (std::is_same<E, __half>::value) {
            y[e] = __half2float(__ushort_as_half((unsigned short)(e % 2 ? w >> 16 : w & 0xffffu)));
          } else {
            y[e] = __uint_as_float(e % 2 ? w & 0xffff0000u : w << 16);
          }
        }
      }
      // lanes l and l + 4 of a quarter-warp are 32 columns apart (the same banks): the odd quads store their
      // halves in the other order, so each 128-bit store phase meets 32 distinct banks
      float4* o = reinterpret_cast<float4*>(dst + r * P + c);
      const float4 lo4 = make_float4(y[0], y[1], y[2], y[3]), hi4 = make_float4(y[4], y[5], y[6], y[7]);
      const bool swap = (threadIdx.x >> 2) & 1;
      o[swap] = swap ? hi4 : lo4;
      o[!swap] = swap ? lo4 : hi4;
      return;
    }
    const int d = threadIdx.x % DM, r0 = threadIdx.x / DM;
#pragma unroll
    for (int n = 0; n < N; ++n) dst[(r0 + n * (NT / DM)) * P + d] = x[n];
  }
};
static_assert(NT % DM == 0 && C * DM % NT == 0 && NT == 16 * C && NW == 16, "the staging, warp and dgate mappings");

// The chunk's gate and beta (threads tid < C, step t0 + tid; padded steps gate 1, beta 0), loaded with the
// chunk's staging so that their latency is shared.
struct GateBeta {
  float g = 1.f, b = 0.f;
  template <typename E>
  __device__ __forceinline__ void load(const ChunkBwdParams& p, int64_t b_, int h, int t0) {
    const int t = t0 + (int)threadIdx.x;
    g = 1.f, b = 0.f;
    if (threadIdx.x < C && t < p.T) {
      g = GateSeq<E>(p.gate, b_ * p.sg.b + h * p.sg.h, p.g32)[t * p.sg.t];
      b = GateSeq<E>(p.beta, b_ * p.sb.b + h * p.sb.h, p.b32)[t * p.sb.t];
    }
  }
};

// An inclusive product scan in double over a warp's 32 lanes (lane l: one step's gate): kPrefix prod_{r<=l},
// else prod_{r>=l}.
template <bool kPrefix>
__device__ __forceinline__ double lane_scan(double x) {
  static_assert(C == 32, "a lane a step");
  const int l = threadIdx.x & 31;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const double y = kPrefix ? __shfl_up_sync(0xffffffffu, x, o) : __shfl_down_sync(0xffffffffu, x, o);
    if (kPrefix ? l >= o : l + o < 32) x *= y;
  }
  return x;
}

// The chunk's tables from its gates and betas, each a double product rounded once:
// L[t][s] = prod_{r=s+1..t} g_r (s <= t, else 0), A[t] = prod_{r<=t} g_r, Ah[t] = A[t-1] (Ah[0] = 1),
// w[s] = prod_{r>s} g_r. Warp 0 walks L's columns (lane s: a running product down t, the same roundings as
// a product per element), warp 1 the vectors by shuffle scans in double (lane t: step t; a serial loop a lane
// was up to 63 dependent products). Two barriers (the first also covers the caller's staging).
__device__ __forceinline__ void tables(float* sm, const GateBeta& gb) {
  const int tid = threadIdx.x;
  if (tid < C) {
    sm[kGv + tid] = gb.g;
    sm[kBv + tid] = gb.b;
  }
  __syncthreads();
  const float* g = sm + kGv;
  if (tid < C) {
    const int s = tid;
    double pr = 1.0;
    for (int t = 0; t < C; ++t) {
      if (t > s) pr *= (double)g[t];
      sm[kL + t * PC + s] = t >= s ? (float)pr : 0.f;
    }
  } else if (tid < 2 * C) {
    const int t = tid - C;
    const double pa = lane_scan<true>(g[t]), ps = lane_scan<false>(g[t]);  // prod_{r<=t}, prod_{r>=t}
    const double ph = __shfl_up_sync(0xffffffffu, pa, 1), pw = __shfl_down_sync(0xffffffffu, ps, 1);
    sm[kA + t] = (float)pa;
    sm[kAh + t] = t == 0 ? 1.f : (float)ph;
    sm[kW + t] = t == 31 ? 1.f : (float)pw;
  }
  __syncthreads();
}

// Whether (D_k, D_v) states from base on, D_k D_v floats apart, have 16-byte aligned rows (put_state's float4s).
__device__ __forceinline__ bool state_rows16(const float* base, int Dv) {
  return Dv % 4 == 0 && (reinterpret_cast<uintptr_t>(base) & 15) == 0;
}

// This warp's S elements (rows 16 (w % 8) .., columns 64 (w / 8) ..) into the row-major (D_k, D_v) state at dst:
// as float4s when v4 (D_v % 4 == 0: lanes 0-15 a row, 16-31 the next, 256-byte runs), else an element a lane.
// The warp's own elements only, so it needs no block barrier against the warp's own update after it (a
// __syncwarp: the lanes differ from rank_update's).
__device__ __forceinline__ void put_state(float* dst, const float* S, int Dk, int Dv, bool v4) {
  if (v4) {
    const int lane = threadIdx.x & 31, i0 = 16 * ((threadIdx.x >> 5) & 7), j0 = 64 * (threadIdx.x >> 8);
#pragma unroll
    for (int m = 0; m < 8; ++m) {
      const int f = lane + 32 * m, i = i0 + f / 16, j = j0 + 4 * (f % 16);
      if (i < Dk && j < Dv)
        *reinterpret_cast<float4*>(dst + i * Dv + j) = *reinterpret_cast<const float4*>(S + i * P + j);
    }
    return;
  }
#pragma unroll
  for (int ia = 0; ia < 16; ++ia)
#pragma unroll
    for (int c = 0; c < NC; ++c) {
      const int i = st_i(ia), j = st_j(c);
      if (i < Dk && j < Dv) dst[i * Dv + j] = S[i * P + j];
    }
}

// A state update's tables (phase F) by warp 0 from its registers (lane s: step s's gate
// and beta): t[s] = w[s] = prod_{r>s} g_r, t[C + s] = beta_s, t[2C] = A_{C-1} = prod_r g_r; suffix products in
// double by shuffles, each rounded once. No barrier of its own: the caller's publishes them.
__device__ __forceinline__ void update_tables(float* t, const GateBeta& gb) {
  if (threadIdx.x < 32) {
    const int s = threadIdx.x;
    const double x = lane_scan<false>(gb.g);  // prod_{r >= s} g_r
    const double next = __shfl_down_sync(0xffffffffu, x, 1);
    t[s] = s == 31 ? 1.f : (float)next;
    t[C + s] = gb.b;
    if (s == 0) t[2 * C] = (float)x;
  }
}

// Phase F: the forward over chunks c0 .. c0 + n - 1 of (b, h) from S (each warp's own elements, in place): S at
// every chunk start of the run but the last (phase R holds that one) into ck (unless nullptr), and the first nu
// chunks' updates (n - 1: the last chunk's is never needed; n: S ends as the state after the run). Chunk x's k, v
// and update tables sit in buffer x % 2 (K, V or Q, Y; the tables in EE's space, free until phase R). Right after
// chunk x's update the next chunk's go to the other buffer (its last reader, the previous update, is behind the
// last barrier) and the one after is loaded: one barrier a chunk, since each warp updates only its own S elements.
template <typename E>
__device__ __forceinline__ void forward_states(const ChunkBwdParams& p, float* sm, int64_t b, int h, int c0, int n,
                                               int nu, float* ck, bool vk, bool vv, bool v4) {
  constexpr bool kExact = !std::is_same<E, float>::value;
  float *S = sm + kS, *Q = sm + kQ, *K = sm + kK, *V = sm + kV, *Y = sm + kY, *EE = sm + kEE;
  float* const fT1 = EE + 2 * C + 4;  // buffer 1's tables (buffer 0's at EE)
  const int Dk = p.Dk, Dv = p.Dv;
  Staged<E> fk, fv;  // loaded one update ahead of their store
  GateBeta fg;
  if (nu > 0) {
    fk.load(p.k, p.sk, b, h, c0 * C, p.T, Dk, vk);
    fv.load(p.v, p.sv, b, h, c0 * C, p.T, Dv, vv);
    fg.load<E>(p, b, h, c0 * C);
    fk.store(K);
    fv.store(V);
    update_tables(EE, fg);
  }
  if (nu > 1) {
    fk.load(p.k, p.sk, b, h, (c0 + 1) * C, p.T, Dk, vk);
    fv.load(p.v, p.sv, b, h, (c0 + 1) * C, p.T, Dv, vv);
    fg.load<E>(p, b, h, (c0 + 1) * C);
  }
  __syncthreads();
  for (int x = 0;; ++x) {
    if (ck != nullptr && x + 1 < n) put_state(ck + (int64_t)x * Dk * Dv, S, Dk, Dv, v4);
    if (x == nu) break;
    __syncwarp();  // the checkpoint's reads of S (this warp's elements) before rank_update's writes
    const bool odd = x & 1;  // selects, not an indexed array: no local memory
    const float* t = odd ? fT1 : EE;
    rank_update<kExact>(S, t[2 * C], odd ? Q : K, t, t + C, odd ? Y : V);  // S <- A_{C-1} S + (w beta K)^T V
    if (x + 1 < nu) {
      fk.store(odd ? K : Q);
      fv.store(odd ? V : Y);
      update_tables(odd ? EE : fT1, fg);
    }
    if (x + 2 < nu) {
      fk.load(p.k, p.sk, b, h, (c0 + x + 2) * C, p.T, Dk, vk);
      fv.load(p.v, p.sv, b, h, (c0 + x + 2) * C, p.T, Dv, vv);
      fg.load<E>(p, b, h, (c0 + x + 2) * C);
    }
    __syncthreads();  // the stored buffer for the next update; this one's readers done
  }
}

// This warp's elements of a state M (pitch P): from src (a (D_k, D_v) state at those strides, b and h folded in
// by the caller; nullptr: zeros), zeros past D_k, D_v.
__device__ __forceinline__ void get_state(float* M, const float* src, int64_t si, int64_t sj, int Dk, int Dv) {
#pragma unroll
  for (int ia = 0; ia < 16; ++ia)
#pragma unroll
    for (int c = 0; c < NC; ++c) {
      const int i = st_i(ia), j = st_j(c);
      M[i * P + j] = src != nullptr && i < Dk && j < Dv ? src[i * si + j * sj] : 0.f;
    }
}

// The product of steps t0 .. t1 - 1's gates (double, rounded once) in every lane of warp 0: lane-strided
// products, then xor shuffles (each level multiplies the same two values in every lane pair: one result).
template <typename E>
__device__ __forceinline__ float segment_decay(const ChunkBwdParams& p, int64_t b, int h, int t0, int t1) {
  const GateSeq<E> g(p.gate, b * p.sg.b + h * p.sg.h, p.g32);
  double x = 1.0;
  for (int t = t0 + (int)(threadIdx.x & 31); t < t1; t += 32) x *= (double)g[t * p.sg.t];
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) x *= __shfl_xor_sync(0xffffffffu, x, o);
  return (float)x;
}
}  // namespace cb

// Segments' own contributions (nseg > 1), grid (B H (nseg - 1), 2). Role 0, segment j = x % (nseg - 1): phase F
// from zero over its chunks, U_j = the state after them, and D_j. Role 1, segment j = 1 + x % (nseg - 1): Gamma's
// update (phase R's last step) from zero over its chunks backwards, W_j; and the last segment's D_j.
template <typename E>
__global__ void __launch_bounds__(kBwdThreads, 1) chunk_bwd_prep_kernel(const ChunkBwdParams p) {
  using namespace cb;
  extern __shared__ __align__(16) float sm[];
  constexpr bool kExact = !std::is_same<E, float>::value;
  const int64_t bh = blockIdx.x / (p.nseg - 1), b = bh / p.H;
  const int h = (int)(bh - b * p.H), Dk = p.Dk, Dv = p.Dv;
  const bool role_g = blockIdx.y == 1;
  const int j = (int)(blockIdx.x % (p.nseg - 1)) + (role_g ? 1 : 0);
  const int c0 = j * p.seg_chunks, n = min(p.nck, c0 + p.seg_chunks) - c0;
  const bool v4 = state_rows16(p.ckpt, Dv);  // seg_s and seg_g sit D_k D_v floats apart from the checkpoints
  float* M = sm + (role_g ? kG : kS);
  get_state(M, nullptr, 0, 0, Dk, Dv);
  if (!role_g) {
    forward_states<E>(p, sm, b, h, c0, n, n, nullptr, rows16<E>(p.k, p.sk, Dk), rows16<E>(p.v, p.sv, Dv), v4);
  } else {
    const bool vq = rows16<E>(p.q, p.sq, Dk), vy = rows16<E>(p.dy, p.sdy, Dv);
    for (int ch = c0 + n - 1; ch >= c0; --ch) {
      Staged<E> sq, sy;
      GateBeta gb;
      sq.load(p.q, p.sq, b, h, ch * C, p.T, Dk, vq);
      sy.load(p.dy, p.sdy, b, h, ch * C, p.T, Dv, vy);
      gb.load<E>(p, b, h, ch * C);
      sq.store(sm + kQ);
      sy.store(sm + kY);
      tables(sm, gb);  // its first barrier publishes the staging
      rank_update<kExact>(M, sm[kA + C - 1], sm + kQ, sm + kA, nullptr, sm + kY);
      __syncthreads();  // Q, Y and the tables are restaged next
    }
  }
  const int64_t slot = bh * (p.nseg - 1) + (role_g ? j - 1 : j);
  put_state((role_g ? p.seg_g : p.seg_s) + slot * Dk * Dv, M, Dk, Dv, v4);  // after the last barrier
  if (threadIdx.x < 32 && (!role_g || j == p.nseg - 1)) {
    const float d = segment_decay<E>(p, b, h, c0 * C, min(p.T, (c0 + n) * C));
    if (threadIdx.x == 0) p.seg_d[bh * p.nseg + j] = d;
  }
}

// Segment boundaries (nseg > 1), an element of a (b, h) state a thread, in place over the prep's contributions:
// threads [0, n) run S forwards from S_0 (S_{j+1} = D_j S_j + U_j), threads [n, 2n) Gamma backwards from the final
// state's gradient (Gamma_{j-1} = D_j Gamma_j + W_j), in segment order: deterministic.
__global__ void __launch_bounds__(kMaxThreads) chunk_bwd_scan_kernel(const ChunkBwdParams p) {
  const int64_t per = (int64_t)p.Dk * p.Dv, n = p.BH * per;
  int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  const bool back = e >= n;
  if (back) e -= n;
  if (e >= n) return;
  const int64_t bh = e / per, ij = e - bh * per, b = bh / p.H;
  const int h = (int)(bh - b * p.H), i = (int)(ij / p.Dv), j = (int)(ij - (ij / p.Dv) * p.Dv), ns = p.nseg - 1;
  const float* d = p.seg_d + bh * p.nseg;
  float* m = (back ? p.seg_g : p.seg_s) + bh * ns * per + ij;
  if (!back) {
    float x = p.s_in != nullptr ? p.s_in[b * p.ssi.b + h * p.ssi.h + i * p.ssi.i + j * p.ssi.j] : 0.f;
    for (int s = 0; s < ns; ++s) {
      x = fmaf(d[s], x, m[s * per]);
      m[s * per] = x;
    }
  } else {
    float x = p.dfinal != nullptr ? p.dfinal[b * p.sdf.b + h * p.sdf.h + i * p.sdf.i + j * p.sdf.j] : 0.f;
    for (int s = ns; s >= 1; --s) {
      x = fmaf(d[s], x, m[(s - 1) * per]);
      m[(s - 1) * per] = x;
    }
  }
}

template <typename E>
__global__ void __launch_bounds__(kBwdThreads, 1) chunk_bwd_kernel(const ChunkBwdParams p) {
  using namespace cb;
  extern __shared__ __align__(16) float sm[];
  float *S = sm + kS, *G = sm + kG, *Q = sm + kQ, *K = sm + kK, *V = sm + kV, *Y = sm + kY;
  float *QK = sm + kQK, *DD = sm + kDD, *EE = sm + kEE;
  const float *L = sm + kL, *bv = sm + kBv, *A = sm + kA, *Ah = sm + kAh, *w = sm + kW;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int64_t bh = blockIdx.x / p.nseg, b = bh / p.H;
  const int h = (int)(bh - b * p.H), Dk = p.Dk, Dv = p.Dv;
  const int seg = (int)(blockIdx.x % p.nseg), c0 = seg * p.seg_chunks, n = min(p.nck, c0 + p.seg_chunks) - c0;
  constexpr bool kExact = !std::is_same<E, float>::value;  // staged 16-bit inputs are TF32 values
  if (p.run_if != nullptr && *p.run_if == 0) return;  // chunk_bwd_sm90_fp32 flagged nothing (BwdProblem)
  float* ck = p.ckpt + (int64_t)blockIdx.x * p.seg_chunks * Dk * Dv;  // the segment's checkpoints
  // The segment's first and last chunk, reread from shared memory in phase R: held in registers through it they
  // spilled (16-bit inputs, at the 128-register cap). Published by phase F's barriers.
  __shared__ int seg_c[2];
  if (tid == 0) seg_c[0] = c0, seg_c[1] = c0 + n - 1;
  const volatile int* sc = seg_c;
  // 16-byte forms: staged rows (rows16) and state rows (D_v % 4 == 0: the checkpoints' rows are then aligned)
  const bool vq = rows16<E>(p.q, p.sq, Dk), vk = rows16<E>(p.k, p.sk, Dk), vv = rows16<E>(p.v, p.sv, Dv);
  const bool vy = rows16<E>(p.dy, p.sdy, Dv), v4 = state_rows16(p.ckpt, Dv);

  // ---- phase F: S at the segment's chunk starts into the workspace
  const int64_t seg_slot = bh * (p.nseg - 1);  // segments after the first start from chunk_bwd_scan's S
  if (seg == 0) get_state(S, p.s_in ? p.s_in + b * p.ssi.b + h * p.ssi.h : nullptr, p.ssi.i, p.ssi.j, Dk, Dv);
  else get_state(S, p.seg_s + (seg_slot + seg - 1) * Dk * Dv, Dv, 1, Dk, Dv);
  forward_states<E>(p, sm, b, h, c0, n, n - 1, ck, vk, vv, v4);

  // ---- phase R (the last segment from the final state's gradient, the others from chunk_bwd_scan's Gamma)
  if (seg == p.nseg - 1) get_state(G, p.dfinal ? p.dfinal + b * p.sdf.b + h * p.sdf.h : nullptr, p.sdf.i, p.sdf.j, Dk, Dv);
  else get_state(G, p.seg_g + (seg_slot + seg) * Dk * Dv, Dv, 1, Dk, Dv);
  for (int ch = sc[1]; ch >= sc[0]; --ch) {
    const int t0 = ch * C, tc = min(C, p.T - t0);
    const bool first = ch == sc[1];  // S is phase F's last state, bitwise what the reload would give
    if (first) {  // its padding to zeros again (an overflowing gate product can have left NaN there); later
                  // chunks' S comes by cp.async during the chunk before (below)
#pragma unroll
      for (int ia = 0; ia < 16; ++ia)
#pragma unroll
        for (int c = 0; c < NC; ++c)
          if (st_i(ia) >= Dk || st_j(c) >= Dv) S[st_i(ia) * P + st_j(c)] = 0.f;
    }
    {
      Staged<E> sq, sk, sv, sy;
      GateBeta gb;
      sq.load(p.q, p.sq, b, h, t0, p.T, Dk, vq);
      sk.load(p.k, p.sk, b, h, t0, p.T, Dk, vk);
      sv.load(p.v, p.sv, b, h, t0, p.T, Dv, vv);
      sy.load(p.dy, p.sdy, b, h, t0, p.T, Dv, vy);
      gb.load<E>(p, b, h, t0);
      sq.store(Q);
      sk.store(K);
      sv.store(V);
      sy.store(Y);
      cp_async_wait<0>();
      tables(sm, gb);
    }
    {  // QK = Q K^T and Dd = dY V^T on mma: warp w the product w / 8, rows 16 (w / 4 % 2) .., columns 8 (w % 4) ..
      const bool dd = warp >= 8;
      const int mt = (warp >> 2) & 1, nb = 8 * (warp & 3), kp = ((dd ? Dv : Dk) + 15) & ~15;
      float d0[4] = {0.f, 0.f, 0.f, 0.f};
      qk_tile<!kExact>(d0, (dd ? Y : Q) + 16 * mt * P, (dd ? V : K) + nb * P, P, kp, lane);  // 16-bit: one exact product
      float* o = (dd ? DD : QK) + (16 * mt + (lane >> 2)) * PC + nb + 2 * (lane & 3);
      o[0] = d0[0], o[1] = d0[1], o[8 * PC] = d0[2], o[8 * PC + 1] = d0[3];
    }
    {  // R = dY S^T, Rk = V G^T (C x D_k) and KG = K G (C x D_v) on mma: warp w rows 16 (w % 2) .., columns
       // 16 (w / 2) ..; then c0 = <G, S>. Every read of S and G in this chunk is here, so after the barrier R,
       // Rk and KG go to S's space (C x P each) for the FMA stages' layout.
      const int mt = warp & 1, nb = 16 * (warp >> 1), kv = (Dv + 7) & ~7, kk = (Dk + 7) & ~7;
      float R[2][4], Rk[2][4], KG[2][4];
#pragma unroll
      for (int n = 0; n < 2; ++n)
#pragma unroll
        for (int x = 0; x < 4; ++x) R[n][x] = Rk[n][x] = KG[n][x] = 0.f;
      strip2<kExact>(R, Y + 16 * mt * P, S + nb * P, Rk, V + 16 * mt * P, G + nb * P, kv);
      strip<kExact, false>(KG, K + 16 * mt * P, G + nb, kk);
      float part = 0.f;  // c0: this thread's elements, the warp's, then (after the barriers) the warps' in order
#pragma unroll
      for (int ia = 0; ia < 16; ++ia)
#pragma unroll
        for (int c = 0; c < NC; ++c) part = fmaf(G[st_i(ia) * P + st_j(c)], S[st_i(ia) * P + st_j(c)], part);
      part = warp_sum(part);
      if (lane == 0) sm[kRed + warp] = part;
      __syncthreads();  // S is free
      const int row = 16 * mt + (lane >> 2), col = nb + 2 * (lane & 3);
#pragma unroll
      for (int n = 0; n < 2; ++n) {
        float* o = S + row * P + col + 8 * n;
        *reinterpret_cast<float2*>(o) = make_float2(R[n][0], R[n][1]);
        *reinterpret_cast<float2*>(o + 8 * P) = make_float2(R[n][2], R[n][3]);
        *reinterpret_cast<float2*>(o + C * P) = make_float2(Rk[n][0], Rk[n][1]);
        *reinterpret_cast<float2*>(o + C * P + 8 * P) = make_float2(Rk[n][2], Rk[n][3]);
        *reinterpret_cast<float2*>(o + 2 * C * P) = make_float2(KG[n][0], KG[n][1]);
        *reinterpret_cast<float2*>(o + 2 * C * P + 8 * P) = make_float2(KG[n][2], KG[n][3]);
      }
    }
    // The masked products' weights (each product in the loops' order), in S's space past R, Rk and KG:
    // MQ[t][s] = L[t][s] beta_s Dd[t][s], MD[u][t] = L[u][t] Dd[u][t], MP[u][t] = L[u][t] beta_t QK[u][t] (s <= t <= u)
    float *MQ = S + 3 * C * P, *MD = MQ + C * PC, *MP = MD + C * PC;
    for (int e = tid; e < C * C; e += NT) {
      const int u = e / C, s = e % C;
      const float l = L[u * PC + s], dd = DD[u * PC + s], qk = QK[u * PC + s];
      EE[u * PC + s] = s < u ? bv[s] * qk * dd : 0.f;
      MQ[u * PC + s] = l * bv[s] * dd;
      MD[u * PC + s] = l * dd;
      MP[u * PC + s] = l * bv[s] * qk;
    }
    __syncthreads();  // R, Rk, KG (Rs, Rks, KGs) and the weights complete
    const float *Rs = S, *Rks = S + C * P, *KGs = S + 2 * C * P;
#pragma unroll
    for (int r = 0; r < RT; ++r) {  // f_t = q_t . R_t, e_t = k_t . Rk_t for this warp's rows
      const int t = RT * warp + r;
      float pf = 0.f, pe = 0.f;
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        pf = fmaf(Q[t * P + lane + 32 * c], Rs[t * P + lane + 32 * c], pf);
        pe = fmaf(K[t * P + lane + 32 * c], Rks[t * P + lane + 32 * c], pe);
      }
      pf = warp_sum(pf);
      pe = warp_sum(pe);
      if (lane == 0) {
        sm[kF + t] = pf;
        sm[kE + t] = pe;
      }
    }
    float c0 = 0.f;
#pragma unroll
    for (int x = 0; x < NW; ++x) c0 += sm[kRed + x];
    // dq, dk, dbeta, dv: this warp's RT rows t = tw + r at once (each k_s, q_u, dy_u read once for them), this
    // lane's columns; s <= t and u >= t exactly (a masked weight never meets a non-finite input)
    const int tw = RT * warp;
    float dq[RT][4], dkt[RT][4], dv[RT][4];
#pragma unroll
    for (int r = 0; r < RT; ++r)
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        const int t = tw + r, i = t * P + lane + 32 * c;
        dq[r][c] = A[t] * Rs[i];
        dkt[r][c] = w[t] * Rks[i];
        dv[r][c] = bv[t] * w[t] * KGs[i];
      }
    for (int s = 0; s < tw; ++s) {  // s < t for every row
      float kc[4];
#pragma unroll
      for (int c = 0; c < 4; ++c) kc[c] = K[s * P + lane + 32 * c];
#pragma unroll
      for (int r = 0; r < RT; ++r) {
        const float m = MQ[(tw + r) * PC + s];
#pragma unroll
        for (int c = 0; c < 4; ++c) dq[r][c] = fmaf(m, kc[c], dq[r][c]);
      }
    }
#pragma unroll
    for (int x = 0; x < RT; ++x) {  // s = u = tw + x: rows r >= x take s, rows r <= x take u
      const int st = tw + x;
      float kc[4], qc[4], yc[4];
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        kc[c] = K[st * P + lane + 32 * c];
        qc[c] = Q[st * P + lane + 32 * c];
        yc[c] = Y[st * P + lane + 32 * c];
      }
#pragma unroll
      for (int r = 0; r < RT; ++r) {
        if (r >= x) {
          const float m = MQ[(tw + r) * PC + st];
#pragma unroll
          for (int c = 0; c < 4; ++c) dq[r][c] = fmaf(m, kc[c], dq[r][c]);
        }
        if (r <= x) {
          const float md = MD[st * PC + tw + r], mp = MP[st * PC + tw + r];
#pragma unroll
          for (int c = 0; c < 4; ++c) {
            dkt[r][c] = fmaf(md, qc[c], dkt[r][c]);
            dv[r][c] = fmaf(mp, yc[c], dv[r][c]);
          }
        }
      }
    }
    for (int u = tw + RT; u < C; ++u) {  // u > t for every row
      float qc[4], yc[4];
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        qc[c] = Q[u * P + lane + 32 * c];
        yc[c] = Y[u * P + lane + 32 * c];
      }
#pragma unroll
      for (int r = 0; r < RT; ++r) {
        const float md = MD[u * PC + tw + r], mp = MP[u * PC + tw + r];
#pragma unroll
        for (int c = 0; c < 4; ++c) {
          dkt[r][c] = fmaf(md, qc[c], dkt[r][c]);
          dv[r][c] = fmaf(mp, yc[c], dv[r][c]);
        }
      }
    }
#pragma unroll
    for (int r = 0; r < RT; ++r) {
      const int t = tw + r;
      float pb = 0.f;
#pragma unroll
      for (int c = 0; c < 4; ++c) pb = fmaf(K[t * P + lane + 32 * c], dkt[r][c], pb);
      pb = warp_sum(pb);
      if (t < tc) {
        const int64_t row = (b * p.T + t0 + t) * p.H + h;  // our outputs are contiguous (B, T, H, ...)
#pragma unroll
        for (int c = 0; c < 4; ++c) {
          const int i = lane + 32 * c;
          if (i < Dk) {
            static_cast<E*>(p.y)[row * Dk + i] = from_float<E>(dq[r][c]);
            static_cast<E*>(p.dk)[row * Dk + i] = from_float<E>(bv[t] * dkt[r][c]);
          }
          if (i < Dv) static_cast<E*>(p.dv)[row * Dv + i] = from_float<E>(dv[r][c]);
        }
        if (lane == 0) store_gate_grad<E>(p.dbeta, row, pb, p.b32);
      }
    }
    __syncthreads();  // f and e are complete; S's space is free
    if (ch > sc[0]) {  // the next chunk's S (zeros past D_k, D_v) by cp.async, in flight during dgate and G's update
      const float* src = ck + (int64_t)(ch - 1 - sc[0]) * Dk * Dv;
      if (v4) {  // 16 bytes a copy, any thread's (read only after the wait and a barrier)
#pragma unroll
        for (int m = 0; m < DM * DM / 4 / NT; ++m) {
          const int f = threadIdx.x + NT * m, i = f / (DM / 4), j = 4 * (f % (DM / 4));
          const bool in = i < Dk && j < Dv;
          cp_async<16>(S + i * P + j, src + (in ? i * Dv + j : 0), in);
        }
      } else {
#pragma unroll
        for (int ia = 0; ia < 16; ++ia)
#pragma unroll
          for (int c = 0; c < NC; ++c) {
            const int i = st_i(ia), j = st_j(c);
            const bool in = i < Dk && j < Dv;
            cp_async<4>(S + i * P + j, src + (in ? i * Dv + j : 0), in);
          }
      }
      cp_async_commit();
    }
    {  // dgate_t: 16 lanes a step (t = tid / 16; lane part x takes s and u = x mod 16), the 16 parts summed in a
       // fixed order (xor shuffles), so every warp shares the work (one warp alone left the rest at the barrier)
      const int t = tid >> 4, x = tid & 15;
      float tb = 0.f, tf = 0.f, td = 0.f;
      for (int s = x; s < t; s += 16) tb = fmaf(L[(t - 1) * PC + s] * bv[s], sm[kE + s], tb);
      for (int u = t + x; u < C; u += 16) {
        tf = fmaf(L[u * PC + t], sm[kF + u], tf);
        float e = 0.f;
        for (int s = 0; s < t; ++s) e = fmaf(EE[u * PC + s], L[(t - 1) * PC + s], e);
        td = fmaf(L[u * PC + t], e, td);
      }
#pragma unroll
      for (int o = 1; o < 16; o <<= 1) {
        tb += __shfl_xor_sync(0xffffffffu, tb, o);
        tf += __shfl_xor_sync(0xffffffffu, tf, o);
        td += __shfl_xor_sync(0xffffffffu, td, o);
      }
      if (x == 0 && t < tc)
        store_gate_grad<E>(p.dgate, (b * p.T + t0 + t) * p.H + h, w[t] * Ah[t] * c0 + w[t] * tb + Ah[t] * tf + td, p.g32);
    }
    // G <- A_{C-1} G + sum_u (A_u q_u) dy_u^T (own elements; every other read of G came before the barriers above)
    rank_update<kExact>(G, A[C - 1], Q, A, nullptr, Y);
    __syncthreads();  // the next chunk restages everything and reads G
  }
  // dS_0: ours, contiguous; after the loop's last barrier. An element a lane: the float4 form's code here spilled
  // 8 bytes at the 128-register cap (16-bit inputs, ptxas), for one store a block.
  if (p.ds0 != nullptr && seg == 0) put_state(p.ds0 + bh * Dk * Dv, G, Dk, Dv, false);
}

// The workspace: checkpoints (pl.blocks segments' seg_chunks states), then with segments U / S, W / Gamma
// (B H (nseg - 1) states each) and the decays (B H nseg), as make_plan_backward sizes it.
template <typename E>
cudaError_t launch_chunk_bwd(const Plan& pl, const BwdProblem& pr, float* work, cudaStream_t s, const char** failed) {
  ChunkBwdParams p;
  static_cast<BwdProblem&>(p) = pr;
  p.nck = (pr.T + kBwdChunk - 1) / kBwdChunk;
  p.nseg = pl.nseg;
  p.seg_chunks = pl.seg_chunks;
  const int64_t per = (int64_t)pr.Dk * pr.Dv, ns = pl.nseg - 1;
  p.ckpt = work;
  p.seg_s = work + pl.blocks * (int64_t)pl.seg_chunks * per;
  p.seg_g = p.seg_s + pr.BH * ns * per;
  p.seg_d = p.seg_g + pr.BH * ns * per;
  cudaError_t err = cudaSuccess;
  if (ns > 0) {
    static bool done_prep[64] = {};
    *failed = "chunk_bwd_prep";
    const auto prep = chunk_bwd_prep_kernel<E>;
    err = allow_smem(prep, done_prep);
    if (err == cudaSuccess) err = launch_threads(prep, dim3((unsigned)(pr.BH * ns), 2), kBwdThreads, pl.smem, s, false, p);
    if (err != cudaSuccess) return err;
    *failed = "chunk_bwd_scan";
    const int64_t n = 2 * pr.BH * per;
    err = launch_threads(chunk_bwd_scan_kernel, dim3((unsigned)((n + kMaxThreads - 1) / kMaxThreads)), kMaxThreads, 0, s,
                         false, p);
    if (err != cudaSuccess) return err;
  }
  static bool done[64] = {};
  *failed = "chunk_bwd";
  const auto kernel = chunk_bwd_kernel<E>;
  err = allow_smem(kernel, done);
  return err != cudaSuccess ? err : launch_threads(kernel, dim3((unsigned)pl.blocks), kBwdThreads, pl.smem, s, false, p);
}

template <typename E>
cudaError_t launch_recurrent_bwd(const Plan& pl, const BwdProblem& pr, float* work, cudaStream_t s) {
  BwdParams p;
  static_cast<BwdProblem&>(p) = pr;
  p.vtiles = pl.vtiles;
  p.TC = pl.TC;
  p.nck = (pr.T + kBwdCheckpoint - 1) / kBwdCheckpoint;
  p.nsub = kBwdCheckpoint / pl.TC;
  p.ckpt = work;
  p.acc = pl.vtiles > 1 ? work + pl.blocks * (int64_t)(p.nck + p.nsub) * pl.R * kBwdStateFloats : nullptr;
#define GR_CASE(R_)                                                                             \
  if (pl.R == R_) {                                                                             \
    static bool done[64] = {};                                                                  \
    const auto kernel = recurrent_bwd_kernel<E, R_>;                                            \
    const cudaError_t err = pl.smem > 48 * 1024 ? allow_smem(kernel, done) : cudaSuccess;       \
    return err != cudaSuccess ? err : launch_ex(kernel, dim3((unsigned)pl.blocks), pl.smem, s, false, p); \
  }
  GR_BWD_ROWS(GR_CASE)
#undef GR_CASE
  return cudaErrorInvalidValue;
}

}  // namespace
}  // namespace gr

// The backward unit's entry point: recurrent_bwd (its Problem is a BwdProblem).
extern "C" int gr_execute_backward(const gr::Plan* pl, const gr::Problem* pr, float* work, cudaStream_t s,
                                   const char** failed) {
  using namespace gr;
  const bool chunked = pl->kernel == Kernel::chunk_bwd;
  *failed = chunked ? "chunk_bwd" : "recurrent_bwd";
  const BwdProblem& bp = static_cast<const BwdProblem&>(*pr);
  switch (pl->dtype) {
    case DType::f32:
      return (int)(chunked ? launch_chunk_bwd<float>(*pl, bp, work, s, failed) : launch_recurrent_bwd<float>(*pl, bp, work, s));
    case DType::f16:
      return (int)(chunked ? launch_chunk_bwd<__half>(*pl, bp, work, s, failed) : launch_recurrent_bwd<__half>(*pl, bp, work, s));
    case DType::bf16:
      return (int)(chunked ? launch_chunk_bwd<__nv_bfloat16>(*pl, bp, work, s, failed)
                           : launch_recurrent_bwd<__nv_bfloat16>(*pl, bp, work, s));
  }
  return (int)cudaErrorInvalidValue;
}
"""

# A chunk's decay products L[t][s] = prod_{r=s+1..t} g_r (t > s; 1 at t = s), packed lower triangle at lp(t, s), by
# columns, and the pairs of Lx (L shifted down a row) by rows: chunk_bwd_sm90's tables, shared with the float32
# dev passes (dev/bwd_fp32_passA.py, dev/bwd_fp32_passB.py).
DECAY_TABLES_SRC = r"""
__device__ __forceinline__ int lp(int t, int s) { return (t * (t + 1) >> 1) + s; }
// Columns s and s + 1 of L by running products over one uniform loop in t (g_t is (t < 32 ? ga : gb) of lane t % 32
// of the calling warp); r0, r1 end as L[63][s], L[63][s + 1].
__device__ __forceinline__ void l_columns(float* L, float ga, float gb, int s, float& r0, float& r1) {
  r0 = 1.f;
  r1 = 1.f;
#pragma unroll 8
  for (int t = 0; t < 64; ++t) {
    const float gt = __shfl_sync(0xffffffffu, t < 32 ? ga : gb, t & 31);
    r0 = t > s ? r0 * gt : r0;
    r1 = t > s + 1 ? r1 * gt : r1;
    if (t >= s) L[lp(t, s)] = r0;
    if (t >= s + 1) L[lp(t, s + 1)] = r1;
  }
}
// Lx[t][s] = L[t-1][s] for s < t, else 0, by WG0 (128 threads): thread tid takes row t = tid % 64, columns
// 32 (tid / 64) + 2 k (k < 16); put(x0, x1, off) gets columns s, s + 1 and their byte offset in a bf16 tile
// [s / 8][t][8].
template <typename Put>
__device__ __forceinline__ void lx_pairs(const float* L, int tid, Put&& put) {
  const int t = tid & 63, s0 = 32 * (tid >> 6);
#pragma unroll 4
  for (int k = 0; k < 16; ++k) {
    const int s = s0 + 2 * k;
    put(s < t ? L[lp(t - 1, s)] : 0.f, s + 1 < t ? L[lp(t - 1, s + 1)] : 0.f, (s >> 3) * 1024 + t * 16 + (s & 7) * 2);
  }
}
"""
# chunk_bwd_sm90's wgmma forms beyond WGMMA_FORMS (n, RS, B MN-major, zero, kind, A MN-major).
BWD_SM90_FORMS = ((64, False, 0, False, "bf16", 1), (64, False, 1, False, "bf16", 1), (64, False, 1, True),
                  (64, False, 1, False), (128, True, 1, False), (32, False, 0, True), (32, False, 0, False),
                  (32, True, 0, True), (32, True, 0, False))
BACKWARD_SM90_SRC = ("#include <cudaTypedefs.h>  // CUtensorMap, PFN_cuTensorMapEncodeTiled_v12000 (the checkpoint's map)\n"
                     "namespace gr {\nnamespace {\n" + "".join(_wgmma(*f) for f in BWD_SM90_FORMS) + MBAR_SRC + TMA_ENCODE_SRC +
                     "}  // namespace\n}  // namespace gr\n" + r"""
// ===================================== chunk_bwd_sm90: the chunked backward on Hopper wgmma ==========
// docs/training-design.md section 7; its dev form (variants, its own check, bench) is dev/chunk_bwd_sm90.py at ae07d82.
// bfloat16 q, k, v (gates and betas bf16 or float32), D_k = D_v = 128, rows 16-byte aligned with unit d-stride,
// any (b, t, h) strides, any T; one CTA a (b, h) (no segments: the plan keeps small B H on chunk_bwd).
// Two launches: chunk_bwd_sm90_ckpt (S at every 64-step chunk start into the workspace), then chunk_bwd_sm90, chunks of 64
// backwards (everyone's barrier 6 at each chunk's start (1); the consumers' own at its end (6)):
// - the consumers: the chunk's q, k, v, dy tiles by cp.async into bf16 tiles [d / 8][t][8] (K-major for the sums
//   over d, MN-major for the sums over t; rows past T zero, their gates 1 and betas 0), all during the chunk before
//   (q and dy into its dead MD and MQ, which swap places with them every other chunk; k and v during G's update),
//   the checkpoint's rows into registers at the chunk's top (16-bit checkpoints: each consumer's 64 rows by one TMA
//   box into its own dead region, then ldmatrix), and the next chunk's rows and checkpoint prefetched into L2;
// - WG0 (setmaxnreg kAuxRegs), a chunk off the consumers' path both ways: during chunk ch, chunk ch + 1's dgate's
//   terms (a)-(c) from the consumers' row-dot partials plus term (d)'s, and dbeta (double-buffered partials;
//   fixed-order sums: deterministic), then chunk ch - 1's gate tables into the other of two buffers (L[t][s] =
//   prod_{r=s+1..t} g_r by columns in fp32, packed lower triangle; A, Ah, w, beta w; Lx = L shifted down a row, bf16
//   hi / lo, one buffer: written once the consumers have read it, barrier 4);
// - WG1, WG2 (kConsRegs), consumer c holding rows i = 64 c .. of G (the state gradient after the chunk) in a wgmma
//   accumulator across chunks: R^T = S dY^T (S rows from the checkpoint, split hi / lo; c0 = sum S o G); X = QK
//   (c = 0) or Dd = dY V^T (c = 1), the masked weights MP, MQ, MD (bf16 hi / lo); f's part; dq^T = R^T diag(A) +
//   K^T MQ^T; then its half of dgate's C^3 term as a product, M = E Lx^T over columns t = 32 c .. (E = beta QK Dd
//   below the diagonal, recast from the accumulators, 3 terms), and the column sums of L o M; Rk^T = G V^T (G's
//   accumulator recast), e's part; dkt^T = Rk^T diag(w) + Q^T MD, dbeta's part; KG = K G (G hi / lo from shared
//   memory, the consumer's 64 columns j); dv = diag(beta w) KG + MP^T dY; G <- A_63 G + (diag(A) Q)^T dY. dq, dk,
//   dv stored from the accumulators.
// Non-finite inputs: a chunk whose tiles, gates or betas hold inf or NaN (flagged by the consumers' QK and Dd and by
// WG0's gates, one reducing barrier) forms its four masked sums by FMAs (fma_t, fma_dv, fma_m) instead of products,
// where a mask's zero would meet the inf: NaN exactly where the float64 loop has it.
namespace gr {
namespace {
namespace bwd90 {
typedef __nv_bfloat16 bf16;
struct Params : BwdProblem {
  float* ckpt;  // (B H, nck, 128, 128): S at each chunk start (the workspace; with CK16, the gate bf16, kCk16 rows)
  int nck;      // chunks of 64 steps
};
// Step t's gate and beta in its stored dtype (past T: 1 and 0, identities in every table).
__device__ __forceinline__ float gate_at(const Params& p, int64_t b, int64_t h, int t) {
  if (t >= p.T) return 1.f;
  const int64_t o = b * p.sg.b + (int64_t)t * p.sg.t + h * p.sg.h;
  return p.g32 ? static_cast<const float*>(p.gate)[o] : __bfloat162float(static_cast<const bf16*>(p.gate)[o]);
}
__device__ __forceinline__ float beta_at(const Params& p, int64_t b, int64_t h, int t) {
  if (t >= p.T) return 0.f;
  const int64_t o = b * p.sb.b + (int64_t)t * p.sb.t + h * p.sb.h;
  return p.b32 ? static_cast<const float*>(p.beta)[o] : __bfloat162float(static_cast<const bf16*>(p.beta)[o]);
}
// dgate or dbeta at element o of its contiguous output, in its input's dtype.
__device__ __forceinline__ void put_gb(void* out, bool f32, int64_t o, float x) {
  if (f32) static_cast<float*>(out)[o] = x;
  else static_cast<bf16*>(out)[o] = __float2bfloat16_rn(x);
}

// Shared memory (bytes): bf16 tiles q, k, v, dy [d / 8][t][8]; G hi / lo [j / 8][i][8]; the masked weights hi / lo
// [s / 8][row][8]; Lx hi / lo (Lx[t][s] = L[t-1][s] for s < t, [s / 8][t][8]); two L (fp32, packed lower
// triangle: lp) and two tables (WG0 builds chunk ch - 1's in buffer (ch - 1) & 1 during chunk ch); the consumers'
// row-dot partials.
constexpr int kQ = 0, kK = 16384, kV = 32768, kY = 49152, kGH = 65536, kGL = 98304;
constexpr int kMQH = 131072, kMQL = 139264, kMDH = 147456, kMDL = 155648, kMPH = 163840, kMPL = 172032;
constexpr int kLxH = 180224, kLxL = 188416, kL = 196608, kLBuf = 64 * 65 / 2 * 4, kTab = kL + 2 * kLBuf;
constexpr int kTabBuf = 6 * 256, kPart = kTab + 2 * kTabBuf;
constexpr int kPartBuf = (3 * 8 * 64 + 8 + 2 * 64 + 4 * 64 + 4) * 4;  // (+ the non-finite flags, in buffer 0's)
constexpr int kBar = kPart + 2 * kPartBuf;  // consumer c's checkpoint mbarrier at kBar + 8 c (16-bit checkpoints)
constexpr int kSmem = kBar + 2 * 8;
static_assert(kBar % 8 == 0 && kMPH % 1024 == 0 && kMQH % 1024 == 0 && kY % 1024 == 0,
              "the mbarriers' alignment; the checkpoint boxes' (128-byte swizzle: 1024-byte aligned)");
static_assert(kSmem == kChunkBwdSm90Smem, "the plan's shared memory (PRELUDE)");
// q, dy and MD, MQ swap places every other chunk (the consumer's oQ ..): 16 KB regions each, a weight's lo after its hi
static_assert(kMQL == kMQH + 8192 && kMDL == kMDH + 8192 && kMDH == kMQH + 16384 && kK == kQ + 16384 &&
              kGH == kY + 16384, "the swap");
// tables (floats at kTab + buf kTabBuf): A 0, Ah 64, w 128, beta 192, beta w 256, gate 320
// partials (floats at kPart + buf kPartBuf, the chunk's parity: WG0 reads them during the chunk after): f [8][64]
// at 0, e at 512, dbeta at 1024 (slot c * 4 + warp), c0 [8] at 1536, then the sums f at 1544, e at 1608, then
// dgate's term (d) [4][64] at 1672 (a consumer's warp wl at [wl], its column half), then the non-finite flags (ints)
// [buf][warp] at 1928 (buffer 0's)
// L[t][s] (s <= t) at lp(t, s) of its buffer; every (t, s < 64) is inside it (a select may load the slot it discards).
""" + DECAY_TABLES_SRC + r"""
__device__ __forceinline__ float* tables(unsigned char* sm, int ch) {
  return reinterpret_cast<float*>(sm + kTab + (ch & 1) * kTabBuf);
}
__device__ __forceinline__ float* ltab(unsigned char* sm, int ch) {
  return reinterpret_cast<float*>(sm + kL + (ch & 1) * kLBuf);
}
__device__ __forceinline__ float* partials(unsigned char* sm, int ch) {
  return reinterpret_cast<float*>(sm + kPart + (ch & 1) * kPartBuf);
}
// chunk ch's non-finite flags of the gates and betas, one a warp of WG0's first two (in buffer 0's tail)
__device__ __forceinline__ int* gate_flags(unsigned char* sm, int ch) {
  return reinterpret_cast<int*>(sm + kPart) + 1928 + 2 * (ch & 1);
}
constexpr int kAuxRegs = 56, kConsRegs = 224;  // setmaxnreg split (at 40 / 232 WG0 spilled)
static_assert(kAuxRegs * 128 + kConsRegs * 256 <= 65536, "the split fits the register file");

__device__ __forceinline__ float ldb(const unsigned char* p) {
  return __bfloat162float(*reinterpret_cast<const bf16*>(p));
}
__device__ __forceinline__ float2 unpack(uint32_t w) {
  return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&w));
}
// Descriptors of a k16 step of a bf16 tile: K-major, stored [k / 8][row][8] (rows: its M or N extent), and
// MN-major, stored [mn / 8][k][8] (rows: its K extent).
__device__ __forceinline__ uint64_t kdesc(const unsigned char* sm, int off, int rows, int kb) {
  return sm_desc(sm + off + 2 * kb * rows * 16, rows * 16, 128);
}
__device__ __forceinline__ uint64_t mdesc(const unsigned char* sm, int off, int rows, int kb) {
  return sm_desc(sm + off + 2 * kb * 128, 128, rows * 16);
}
// Named barriers, non-aligned (barrier.sync, not bar.sync = barrier.sync.aligned): the roles reach the chunk's
// barriers from different code, which .aligned does not allow (synccheck: "divergent threads in block").
// 1: the consumers (256); 2 + c: consumer c (128; CK16, the checkpoint box); 5: WG0 (128); 6: everyone (384);
__device__ __forceinline__ void consumers_sync() { asm volatile("barrier.sync 1, 256;\n" ::: "memory"); }
// The consumers' barrier with the OR of their x.
__device__ __forceinline__ bool consumers_sync_or(bool x) {
  uint32_t r;
  asm volatile("{\n .reg .pred p, o;\n setp.ne.u32 p, %1, 0;\n barrier.red.or.pred o, 1, 256, p;\n"
               " selp.u32 %0, 1, 0, o;\n}\n" : "=r"(r) : "r"((uint32_t)x) : "memory");
  return r != 0;
}
__device__ __forceinline__ void wg0_sync() { asm volatile("barrier.sync 5, 128;\n" ::: "memory"); }
// 4: the consumers arrive after their last read of Lx in a chunk, WG0 waits before writing the next chunk's
__device__ __forceinline__ void lx_free_arrive() { asm volatile("barrier.arrive 4, 384;\n" ::: "memory"); }
__device__ __forceinline__ void lx_free_wait() { asm volatile("barrier.sync 4, 384;\n" ::: "memory"); }
template <int ID>
__device__ __forceinline__ void sync_all() { asm volatile("barrier.sync %0, 384;\n" ::"n"(ID) : "memory"); }

// The chunk's weights from the consumer's 64 x 64 accumulator X (rows r = 16 wl + g (+8), columns s = 8 n + 2 q
// (+1)): L[r][s] (beta_s) X[r][s] for s <= r, else 0; split, stored hi / lo at [s / 8][r][8].
template <bool BETA>
__device__ __forceinline__ void put_weights(unsigned char* sm, const float (&X)[32], const float* L, const float* tab,
                                            int off_h, int off_l, int wl, int g, int q) {
  const float* bt = tab + 192;
#pragma unroll
  for (int n = 0; n < 8; ++n)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = 16 * wl + g + 8 * h, s = 8 * n + 2 * q;
      const float b0 = BETA ? bt[s] : 1.f, b1 = BETA ? bt[s + 1] : 1.f;  // (inside the selects: a NaN beta stays
      const float x0 = s <= r ? X[4 * n + 2 * h] * L[lp(r, s)] * b0 : 0.f;  // out of the masked slots)
      const float x1 = s + 1 <= r ? X[4 * n + 2 * h + 1] * L[lp(r, s + 1)] * b1 : 0.f;
      uint32_t hi, lo;
      split_bf16x2<false>(x0, x1, hi, lo);
      const int off = (s >> 3) * 1024 + r * 16 + (s & 7) * 2;
      *reinterpret_cast<uint32_t*>(sm + off_h + off) = hi;
      *reinterpret_cast<uint32_t*>(sm + off_l + off) = lo;
    }
}

// Column u of a 64 x 64 accumulator (rows i = i0 + 16 wl + g (+8)) against row u of a bf16 tile, over this warp's
// 16 rows i: one partial a warp and column, at part[slot][u].
__device__ __forceinline__ void col_dots(unsigned char* sm, const float (&X)[32], int tile, int i0, float* part,
                                         int wl, int g, int q) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int m = 0; m < 4; ++m) {  // columns u of blocks n = 2 m, 2 m + 1
    uint32_t r[4];  // block j: rows i of half j & 1, columns of block n = 2 m + (j >> 1)
    const int j = lane >> 3;
    ldm4<true>(r, sm + tile + ((i0 + 16 * wl + 8 * (j & 1)) >> 3) * 1024 + (16 * m + 8 * (j >> 1) + (lane & 7)) * 16);
#pragma unroll
    for (int nn = 0; nn < 2; ++nn)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int n = 2 * m + nn, u = 8 * n + 2 * q + e;
        const float2 v0 = unpack(r[2 * nn]), v1 = unpack(r[2 * nn + 1]);
        float x = X[4 * n + e] * (e ? v0.y : v0.x) + X[4 * n + 2 + e] * (e ? v1.y : v1.x);
        x += __shfl_xor_sync(0xffffffffu, x, 4);
        x += __shfl_xor_sync(0xffffffffu, x, 8);
        x += __shfl_xor_sync(0xffffffffu, x, 16);
        if (g == 0) part[u] = x;
      }
  }
}

// acc = A B^T over 128 columns of d: A (64 x 128, fp32, the fragment order of an accumulator row pair) from
// a_values(kb, sv), eight values a k-step, split hi / lo in registers (2 terms); B a staged tile, K-major.
// a_values runs a k-step ahead (values it loads are in flight during the products: the fences' memory clobbers keep
// the compiler from hoisting such loads itself; two ahead spilled).
template <typename F>
__device__ __forceinline__ void rs_split_product(float (&acc)[32], const unsigned char* sm, int tile, F&& a_values) {
  float sv[2][8];
  a_values(0, sv[0]);
#pragma unroll
  for (int kb = 0; kb < 8; ++kb) {
    uint32_t ah[4], al[4];
#pragma unroll
    for (int r = 0; r < 4; ++r) split_bf16x2<false>(sv[kb & 1][2 * r], sv[kb & 1][2 * r + 1], ah[r], al[r]);
    if (kb + 1 < 8) a_values(kb + 1, sv[(kb + 1) & 1]);
    wg_fence();
    const uint64_t db = kdesc(sm, tile, 64, kb);
    if (kb == 0) wgmma_rs64_z(acc, ah, db);
    else wgmma_rs64(acc, ah, db, 1);
    wgmma_rs64(acc, al, db, 1);
  }
  wg_commit();
  wg_wait<0>();
  acc_fence(acc);
}

// acc += A W over the chunk's 64 steps: A MN-major from a staged tile, W the weights hi / lo (K-major B, or
// MN-major with BMN).
template <bool BMN>
__device__ __forceinline__ void weights_product(float (&acc)[32], const unsigned char* sm, int a_off, int wh, int wl_) {
#pragma unroll
  for (int kb = 0; kb < 4; ++kb) {
    wg_fence();
    const uint64_t da = mdesc(sm, a_off, 64, kb);
    if constexpr (BMN) {
      wgmma_ss64_a_t(acc, da, mdesc(sm, wh, 64, kb), 1);
      wgmma_ss64_a_t(acc, da, mdesc(sm, wl_, 64, kb), 1);
    } else {
      wgmma_ss64_a(acc, da, kdesc(sm, wh, 64, kb), 1);
      wgmma_ss64_a(acc, da, kdesc(sm, wl_, 64, kb), 1);
    }
  }
  wg_commit();
  wg_wait<0>();
  acc_fence(acc);
}

// A transposed 64 x 64 accumulator X[i][t] (rows i = i0 + 16 wl + g (+8), columns t) to out[t][i] (bf16, row
// stride ld elements), each element times scale[t] (or 1); GUARD: rows t < tc only (the last chunk).
template <bool GUARD>
__device__ __forceinline__ void store_t(bf16* out, int64_t ld, const float (&X)[32], const float* scale, int i0,
                                        int wl, int g, int q, int tc) {
#pragma unroll
  for (int n = 0; n < 8; ++n)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int t = 8 * n + 2 * q, i = i0 + 16 * wl + g + 8 * h;
      float x0 = X[4 * n + 2 * h], x1 = X[4 * n + 2 * h + 1];
      if (scale) x0 *= scale[t], x1 *= scale[t + 1];
      if (!GUARD || t < tc) out[t * ld + i] = __float2bfloat16_rn(x0);
      if (!GUARD || t + 1 < tc) out[(t + 1) * ld + i] = __float2bfloat16_rn(x1);
    }
}

// The consumers: their share of chunk ch's tiles (64 rows x 16 pieces of 16 bytes each) by cp.async, then (after
// their own work) the wait and the async-proxy fence before the chunk's barrier (1).
// kExact: a chunk whose q, k, v or dy tile, gates or betas hold a non-finite value forms its masked sums by FMAs,
// so that a masked zero never meets the inf or NaN inside a product (the float64 loop never forms those terms).
// The weights are the same bf16 hi / lo pairs the products read; the tiles are exact.
__device__ __forceinline__ float wsum(const unsigned char* sm, int hi, int lo, int off) {
  return ldb(sm + hi + off) + ldb(sm + lo + off);
}
// The transposed accumulators' masked sums, over steps r, for this thread's elements (i = ir (+8), x = 8 n + 2 q + e):
// DK false: dq^T[i][x = t] += sum_{r <= t} K[r][i] MQ[t][r]; DK true: dkt^T[i][x = s] += sum_{r >= s} Q[r][i] MD[r][s]
// (both weights stored [column / 8][row][8]).
template <bool DK>
__device__ __noinline__ void fma_t(float (&R)[32], const unsigned char* sm, int tile, int wh, int ir, int q) {
  const int wlo = wh + 8192;  // (the weights' lo after their hi)
  for (int r = 0; r < 64; ++r) {
    const float a0 = ldb(sm + tile + (ir >> 3) * 1024 + r * 16 + (ir & 7) * 2);
    const float a1 = ldb(sm + tile + ((ir + 8) >> 3) * 1024 + r * 16 + ((ir + 8) & 7) * 2);
#pragma unroll
    for (int n = 0; n < 8; ++n)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int x = 8 * n + 2 * q + e;
        if (DK ? r < x : r > x) continue;
        const int off = DK ? (x >> 3) * 1024 + r * 16 + (x & 7) * 2 : (r >> 3) * 1024 + x * 16 + (r & 7) * 2;
        const float w = wsum(sm, wh, wlo, off);
        R[4 * n + e] = fmaf(a0, w, R[4 * n + e]);
        R[4 * n + 2 + e] = fmaf(a1, w, R[4 * n + 2 + e]);
      }
  }
}
// dv[s][j] += sum_{u >= s} MP[u][s] dY[u][j] (s = sr (+8), j = j0 + 8 n + 2 q + e).
__device__ __noinline__ void fma_dv(float (&R)[32], const unsigned char* sm, int oy, int sr, int j0, int q) {
  for (int u = 0; u < 64; ++u) {
    const float w0 = u >= sr ? wsum(sm, kMPH, kMPL, (sr >> 3) * 1024 + u * 16 + (sr & 7) * 2) : 0.f;
    const float w1 = u >= sr + 8 ? wsum(sm, kMPH, kMPL, ((sr + 8) >> 3) * 1024 + u * 16 + ((sr + 8) & 7) * 2) : 0.f;
    if (u < sr) continue;  // (both weights zero: the term is not formed)
#pragma unroll
    for (int n = 0; n < 8; ++n)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int j = j0 + 8 * n + 2 * q + e;
        const float y = ldb(sm + oy + (j >> 3) * 1024 + u * 16 + (j & 7) * 2);
        R[4 * n + e] = fmaf(w0, y, R[4 * n + e]);
        if (u >= sr + 8) R[4 * n + 2 + e] = fmaf(w1, y, R[4 * n + 2 + e]);
      }
  }
}
// M[u][t] = sum_{s < t} E[u][s] L[t-1][s] (u = 16 wl + g (+8), t = 32 C + 8 n + 2 q + e), E in the quad's registers
// (E[u][s] is lane (g, (s % 8) / 2)'s X[4 (s / 8) + 2 h + s % 2]).
template <int C>
__device__ __forceinline__ void fma_m(float (&M)[16], const float (&E)[32], const float* L, int q, int lane) {
#pragma unroll
  for (int i = 0; i < 16; ++i) M[i] = 0.f;
#pragma unroll
  for (int s = 0; s < (C ? 63 : 31); ++s) {
    const int src = (lane & ~3) | ((s & 7) >> 1), r = 4 * (s >> 3) + (s & 1);
    const float e0 = __shfl_sync(0xffffffffu, E[r], src), e1 = __shfl_sync(0xffffffffu, E[r + 2], src);
#pragma unroll
    for (int n = 0; n < 4; ++n)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int t = 32 * C + 8 * n + 2 * q + e;
        if (s >= t) continue;
        const float lx = L[lp(t - 1, s)];
        M[4 * n + e] = fmaf(e0, lx, M[4 * n + e]);
        M[4 * n + 2 + e] = fmaf(e1, lx, M[4 * n + 2 + e]);
      }
  }
}
// An accumulator through a called FMA fallback by way of a copy: passed itself, its address would escape and keep it
// in local memory on the fast path too (a review found 256 B of stack there).
template <typename F>
__device__ __forceinline__ void exact(float (&acc)[32], F&& f) {
  float t[32];
#pragma unroll
  for (int i = 0; i < 32; ++i) t[i] = acc[i];
  f(t);
#pragma unroll
  for (int i = 0; i < 32; ++i) acc[i] = t[i];
}
// MASK: bit x loads tile x (q, k, v, dy) of (b, h) by the NT consumer threads (th: 0..NT-1); each tile's base and
// strides fixed at compile time (a selection by the element's tile at run time cost indexed constant loads, and
// bh / H a 64-bit division, every call: a sixth of the chunk on the roles that issued them).
template <int MASK, int NT>
__device__ __forceinline__ void load_tiles(const Params& p, unsigned char* sm, int64_t b, int64_t h, int ch, int th,
                                           int oq = kQ, int oy = kY) {
  static_assert(NT % 16 == 0 && 1024 % NT == 0, "whole rows a round, every row");
  const int r0 = th >> 4, c8 = th & 15, t0 = ch * 64 + r0;  // piece c8 of rows r0 + i NT / 16
  unsigned char* dst = sm + c8 * 1024 + r0 * 16;
#pragma unroll
  for (int tile = 0; tile < 4; ++tile) {
    if (!((MASK >> tile) & 1)) continue;
    const bf16* src = static_cast<const bf16*>(tile == 0 ? p.q : tile == 1 ? p.k : tile == 2 ? p.v : p.dy);
    const Strides4& st = tile == 0 ? p.sq : tile == 1 ? p.sk : tile == 2 ? p.sv : p.sdy;  // (d stride 1: the plan)
    const bf16* row = src + b * st.b + (int64_t)t0 * st.t + h * st.h + 8 * c8;
#pragma unroll
    for (int i = 0; i < 1024 / NT; ++i) {
      const bool valid = t0 + i * (NT / 16) < p.T;  // rows past T: zeros
      cp_async<16>(dst + (tile == 0 ? oq : tile == 3 ? oy : tile * 16384) + i * NT,
                   valid ? row + (int64_t)i * (NT / 16) * st.t : src, valid);
    }
  }
  cp_async_commit();
}
// Consumer c's 64 rows i = i0 .. of checkpoint `chunk` (fp16, (B H nck, kCk16) [i][j]) by TMA (ckpt_map): one box
// of two 128-byte swizzled groups (columns j < 64, j >= 64) of 64 rows x 128 bytes, 8 KB apart (1024-byte aligned):
// element (r, j) at (j / 64) 8192 + 128 r + ((((j / 8) & 7) ^ (r & 7)) << 4) + 2 (j % 8); completes on bar.
__device__ __forceinline__ void tma_ckpt(void* dst, const CUtensorMap* map, int i0, int chunk, uint64_t* bar) {
#ifdef GR_WGMMA
  asm volatile("cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, %5}], [%6];\n"
               ::"r"((uint32_t)__cvta_generic_to_shared(dst)), "l"(map), "r"(0), "r"(i0), "r"(0), "r"(chunk),
                 "r"((uint32_t)__cvta_generic_to_shared(bar)) : "memory");
#endif
}
// This thread's cp.async copies landed and visible to wgmma (the async proxy); the barrier after makes them
// everyone's.
__device__ __forceinline__ void tiles_landed() {
  cp_async_wait<0>();
  fence_async_smem();
}

// Chunk ch's checkpoint (64 KB; 32 KB and its scales with CK16) and its q, k, v, dy rows (256 B each) into L2 a
// chunk ahead of their use, by the 256 consumer threads (th: 0..255), two lines each of both (one of the checkpoint
// with CK16, and thread 0 the scales' line).
template <bool CK16>
__device__ __forceinline__ void prefetch_chunk(const Params& p, int64_t bh, int64_t b, int64_t h, int ch, int th) {
  const unsigned char* S = reinterpret_cast<const unsigned char*>(p.ckpt) +
                           (bh * p.nck + ch) * (CK16 ? 2 * kCk16 : 4 * 16384) + th * (CK16 ? 128 : 256);
  asm volatile("prefetch.global.L2 [%0];\n" ::"l"(S));
  if (!CK16) asm volatile("prefetch.global.L2 [%0];\n" ::"l"(S + 128));
  if (CK16 && th == 0) asm volatile("prefetch.global.L2 [%0];\n" ::"l"(S + 32768));
  const int tile = th >> 6, t = ch * 64 + (th & 63);
  if (t >= p.T) return;
  const bf16* src = static_cast<const bf16*>(tile == 0 ? p.q : tile == 1 ? p.k : tile == 2 ? p.v : p.dy);
  const Strides4& st = tile == 0 ? p.sq : tile == 1 ? p.sk : tile == 2 ? p.sv : p.sdy;
  const bf16* row = src + b * st.b + (int64_t)t * st.t + h * st.h;
  asm volatile("prefetch.global.L2 [%0];\n" ::"l"(row));
  asm volatile("prefetch.global.L2 [%0];\n" ::"l"(row + 64));
}

// dgate's term (d), consumer C's columns t = 32 C .. 32 C + 31: sum_{u >= t} L[u][t] M[u][t] over this warp's rows u
// into part[1672 + 64 wl + t], M = E Lx^T, E[u][s] = beta_s QK[u][s] Dd[u][s] (s < u). X holds the consumer's own
// product (QK for C = 0, Dd for C = 1) and becomes E; the other is recomputed: consumer 0's columns t < 32 need
// only s < 32 (Dd's half, two k-steps of M). The split keeps the two consumers level (on one it was a sixth of
// the chunk, which the other waited out at (5)).
template <int C>
__device__ __forceinline__ void dgate_m(unsigned char* sm, float (&X)[32], const float* L, const float* tab,
                                        float* part, bool bad, int oq, int oy, int wl, int g, int q, int lane) {
  constexpr int NE = C ? 32 : 16;  // E's registers (columns s < 64, or < 32)
  float Y[NE];  // the other product: Dd's columns s < 32 (C = 0) or QK (C = 1)
#pragma unroll
  for (int kb = 0; kb < 8; ++kb) {
    wg_fence();
    const uint64_t da = kdesc(sm, C ? oq : oy, 64, kb), db = kdesc(sm, C ? kK : kV, 64, kb);
    if constexpr (C == 0) {
      if (kb == 0) wgmma_ss32_z(Y, da, db);
      else wgmma_ss32(Y, da, db, 1);
    } else {
      if (kb == 0) wgmma_ss64_z(Y, da, db);
      else wgmma_ss64(Y, da, db, 1);
    }
  }
  wg_commit();
  wg_wait<0>();
  acc_fence(Y);
#pragma unroll
  for (int x = 0; x < NE; ++x) {
    const int u = 16 * wl + g + 8 * ((x >> 1) & 1), s = 8 * (x >> 2) + 2 * q + (x & 1);
    X[x] = s < u ? tab[192 + s] * X[x] * Y[x] : 0.f;
  }
  float M[16];
  if (bad) {
    fma_m<C>(M, X, L, q, lane);
  } else {
#pragma unroll
    for (int kb = 0; kb < NE / 8; ++kb) {  // E's accumulator as A fragments, hi / lo; 3 terms; B = Lx rows t
      uint32_t ah[4], al[4];
#pragma unroll
      for (int r = 0; r < 4; ++r) split_bf16x2<false>(X[8 * kb + 2 * r], X[8 * kb + 2 * r + 1], ah[r], al[r]);
      wg_fence();
      const uint64_t bh = kdesc(sm, kLxH + 512 * C, 64, kb), bl = kdesc(sm, kLxL + 512 * C, 64, kb);
      if (kb == 0) wgmma_rs32_z(M, ah, bh);
      else wgmma_rs32(M, ah, bh, 1);
      wgmma_rs32(M, ah, bl, 1);
      wgmma_rs32(M, al, bh, 1);
    }
    wg_commit();
    wg_wait<0>();
    acc_fence(M);
  }
#pragma unroll
  for (int n = 0; n < 4; ++n)
#pragma unroll
    for (int e = 0; e < 2; ++e) {  // column t's sum over this warp's rows u >= t
      const int t = 32 * C + 8 * n + 2 * q + e, u = 16 * wl + g;
      float x = (u >= t ? L[lp(u, t)] * M[4 * n + e] : 0.f) + (u + 8 >= t ? L[lp(u + 8, t)] * M[4 * n + 2 + e] : 0.f);
      x += __shfl_xor_sync(0xffffffffu, x, 4);
      x += __shfl_xor_sync(0xffffffffu, x, 8);
      x += __shfl_xor_sync(0xffffffffu, x, 16);
      if (g == 0) part[1672 + wl * 64 + t] = x;
    }
}

template <bool CK16>
__device__ void consumer(const Params& p, unsigned char* sm, int c, int64_t bh, int nck, const CUtensorMap* smap) {
  const int lt = threadIdx.x & 127, wl = lt >> 5, lane = lt & 31, g = lane >> 2, q = lane & 3;
  uint64_t* sbar = reinterpret_cast<uint64_t*>(sm + kBar) + c;  // this consumer's checkpoint boxes (CK16)
  if constexpr (CK16) {  // (its first wait is after (1), which orders the init before the other threads' waits)
    if (lt == 0) mbar_init(sbar);
    __syncwarp();  // racecheck counts the init as another lane's: without this, a warp-level hazard with lt 0's arm
  }
  const int i0 = 64 * c, ir = i0 + 16 * wl + g;  // this thread's state rows ir, ir + 8
  const int64_t b = bh / p.H, h = bh - b * p.H, rs = (int64_t)p.H * 128;  // rs: a step's row stride
  bf16 *dq = static_cast<bf16*>(p.y), *dk = static_cast<bf16*>(p.dk), *dv = static_cast<bf16*>(p.dv);  // contiguous
  float G[64];
#pragma unroll
  for (int n = 0; n < 16; ++n)
#pragma unroll
    for (int hh = 0; hh < 2; ++hh)
#pragma unroll
      for (int e = 0; e < 2; ++e)
        G[4 * n + 2 * hh + e] = p.dfinal ? p.dfinal[b * p.sdf.b + h * p.sdf.h + (ir + 8 * hh) * p.sdf.i +
                                                    (8 * n + 2 * q + e) * p.sdf.j]
                                         : 0.f;
  auto put_g = [&]() {  // G's hi / lo ([j / 8][i][8], MN-major for KG's B)
#pragma unroll
    for (int n = 0; n < 16; ++n)
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        const int i = ir + 8 * hh, j = 8 * n + 2 * q;
        uint32_t hi, lo;
        split_bf16x2<false>(G[4 * n + 2 * hh], G[4 * n + 2 * hh + 1], hi, lo);
        const int off = (j >> 3) * 2048 + i * 16 + (j & 7) * 2;
        *reinterpret_cast<uint32_t*>(sm + kGH + off) = hi;
        *reinterpret_cast<uint32_t*>(sm + kGL + off) = lo;
      }
    fence_async_smem();
  };
  put_g();
  prefetch_chunk<CK16>(p, bh, b, h, nck - 1, lt + 128 * c);
  for (int ch = nck - 1; ch >= 0; --ch) {
    const int64_t t0 = (int64_t)ch * 64, row0 = (b * p.T + t0) * rs + h * 128;  // element (t0, h, 0) of an output
    const int tc = min(64, p.T - (int)t0);  // the chunk's steps (rows past T are not stored)
    float X[32], R[32], Rk[32];
    const float *tab = tables(sm, ch), *L = ltab(sm, ch);  // this chunk's buffers
    float* part = partials(sm, ch);
    // q and dy alternate with MD and MQ (16 KB each): odd iterations hold q, dy where MD, MQ were, so that the next
    // chunk's q and dy load into this chunk's dead weights at (5), not at its top (k and v load during the update)
    const bool sw = ((nck - 1 - ch) & 1) != 0;
    const int oQ = sw ? kMDH : kQ, oY = sw ? kMQH : kY, oMQ = sw ? kY : kMQH, oMD = sw ? kQ : kMDH;
    if (ch == nck - 1) load_tiles<15, 256>(p, sm, b, h, ch, lt + 128 * c);  // (the first: all four)
    // S rows ir, ir + 8 from the checkpoint: R^T's A values (Sv[kb]: k-step kb's), loaded here to land while the
    // tiles do (loaded a k-step at a time inside R^T they cost a round trip each); R^T's k-step kb waits for its
    // own only, c0's part (sum S o G) is formed there
    // CK16: the values as fp16 pairs (kCk16), each k-step's made S (times its column block's 2^-s, Sv[kb][0]) for
    // c0 and rounded to bf16 for R^T's A fragments (one product a k-step)
    // CK16: this consumer's 64 rows (16 KB) by one TMA box into a region dead from (6) until its own writes after X:
    // consumer 0's into MP, consumer 1's into MQ (where the chunk before's dy was, read until (6)); read after (1) by
    // ldmatrix, the same 32-bit words as the global loads of the rows gave
    float Sv[8][CK16 ? 1 : 8], c0 = 0.f;
    uint32_t Sa[8][CK16 ? 4 : 1];
    const int oS = c ? oMQ : kMPH;
    if constexpr (CK16) {
      if (lt == 0) {
        mbar_expect(sbar, 16384);
        tma_ckpt(sm + oS, smap, 64 * c, (int)(bh * nck + ch), sbar);
      }
      const float4* inv = reinterpret_cast<const float4*>(reinterpret_cast<const __half*>(p.ckpt) +
                                                          (bh * nck + ch) * kCk16 + 16384);
      const float4 i0 = __ldg(inv), i1 = __ldg(inv + 1);
      Sv[0][0] = i0.x, Sv[1][0] = i0.y, Sv[2][0] = i0.z, Sv[3][0] = i0.w;
      Sv[4][0] = i1.x, Sv[5][0] = i1.y, Sv[6][0] = i1.z, Sv[7][0] = i1.w;
    } else {
      const float* S = p.ckpt + (bh * nck + ch) * 16384;
#pragma unroll
      for (int kb = 0; kb < 8; ++kb)
#pragma unroll
        for (int hh = 0; hh < 2; ++hh)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const float2 v = __ldg(reinterpret_cast<const float2*>(S + (ir + 8 * hh) * 128 + 16 * kb + 2 * q + 8 * e));
            Sv[kb][4 * e + 2 * hh] = v.x;
            Sv[kb][4 * e + 2 * hh + 1] = v.y;
          }
    }
    tiles_landed();
    sync_all<6>();  // (1) the chunk's tiles and tables
    if constexpr (CK16) {  // Sa[kb][2 e + hh]: rows ir + 8 hh, columns 16 kb + 8 e + 2 q (+1): ldmatrix x4, matrix
      // m = 2 e + hh, lane row 16 wl + 8 hh + lane % 8 (the 128-byte swizzle: piece (2 kb + e) % 8 ^ lane % 8)
      mbar_wait(sbar, (uint32_t)(nck - 1 - ch) & 1u);
      const int m = lane >> 3, x = lane & 7, e = m >> 1;
      const uint32_t a = (uint32_t)__cvta_generic_to_shared(sm + oS) + (16 * wl + 8 * (m & 1) + x) * 128;
#pragma unroll
      for (int kb = 0; kb < 8; ++kb) ldm4_at<false>(Sa[kb], a + (kb >> 2) * 8192 + ((((2 * kb + e) & 7) ^ x) << 4));
    }
    // R^T = S dY^T first (its values are loading; X's weights wait for the other consumer's at (2)); c0 from G as
    // put_g stored it, hi + lo (within 2^-17): G's registers, last written by a wgmma, read between R^T's wgmmas
    // made ptxas wait out each of them
    auto c0_part = [&](int kb, auto&& sval) {  // sval(r): S's value r of k-step kb (Sv's order)
#pragma unroll
      for (int hh = 0; hh < 2; ++hh)
#pragma unroll
        for (int nn = 0; nn < 2; ++nn) {  // G[8 kb + 4 nn + 2 hh + e]: row ir + 8 hh, column 8 (2 kb + nn) + 2 q + e
          const int off = (2 * kb + nn) * 2048 + (ir + 8 * hh) * 16 + 4 * q;
          const float2 gh = unpack(*reinterpret_cast<const uint32_t*>(sm + kGH + off));
          const float2 gl = unpack(*reinterpret_cast<const uint32_t*>(sm + kGL + off));
          c0 = fmaf(sval(4 * nn + 2 * hh), gh.x + gl.x, c0);
          c0 = fmaf(sval(4 * nn + 2 * hh + 1), gh.y + gl.y, c0);
        }
    };
    if constexpr (CK16) {
#pragma unroll
      for (int kb = 0; kb < 8; ++kb) {  // Sa[kb] made bf16 and c0's part from it before its product reads it (an
        // in-flight wgmma's A registers are not to be touched before its wait)
        float sv[8];
#pragma unroll
        for (int r = 0; r < 4; ++r) {
          const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&Sa[kb][r]));
          sv[2 * r] = f.x * Sv[kb][0];
          sv[2 * r + 1] = f.y * Sv[kb][0];
        }
        c0_part(kb, [&](int r) { return sv[r]; });
#pragma unroll
        for (int r = 0; r < 4; ++r) {
          const __nv_bfloat162 h = __floats2bfloat162_rn(sv[2 * r], sv[2 * r + 1]);
          Sa[kb][r] = *reinterpret_cast<const uint32_t*>(&h);
        }
        wg_fence();  // (Sa[kb] written before its product)
        const uint64_t db = kdesc(sm, oY, 64, kb);
        if (kb == 0) wgmma_rs64_z(R, Sa[kb], db);
        else wgmma_rs64(R, Sa[kb], db, 1);
      }
      wg_commit();
      wg_wait<0>();
      acc_fence(R);
    } else {
      rs_split_product(R, sm, oY, [&](int kb, float (&sv)[8]) {
#pragma unroll
        for (int r = 0; r < 8; ++r) sv[r] = Sv[kb][r];
        c0_part(kb, [&](int r) { return Sv[kb][r]; });
      });
    }
    // X = QK (c = 0) or Dd (c = 1)
#pragma unroll
    for (int kb = 0; kb < 8; ++kb) {
      wg_fence();
      const uint64_t da = kdesc(sm, c ? oY : oQ, 64, kb), db = kdesc(sm, c ? kV : kK, 64, kb);
      if (kb == 0) wgmma_ss64_z(X, da, db);
      else wgmma_ss64(X, da, db, 1);
    }
    wg_commit();
    wg_wait<0>();
    acc_fence(X);
    // CK16: the consumer's four warps have read its checkpoint box (ldmatrix) before any of them writes its weights
    // over it (MP for consumer 0, MQ for consumer 1)
    if constexpr (CK16) {  // (immediate barrier ids: a register id makes ptxas reserve all 16)
      if (c == 0) asm volatile("barrier.sync 2, 128;\n" ::: "memory");
      else asm volatile("barrier.sync 3, 128;\n" ::: "memory");
    }
    if (c == 0) {
      put_weights<true>(sm, X, L, tab, kMPH, kMPL, wl, g, q);  // MP[u][s] = L[u][s] beta_s QK[u][s]
    } else {
      put_weights<true>(sm, X, L, tab, oMQ, oMQ + 8192, wl, g, q);   // MQ[t][s] = L[t][s] beta_s Dd[t][s]
      put_weights<false>(sm, X, L, tab, oMD, oMD + 8192, wl, g, q);  // MD[u][s] = L[u][s] Dd[u][s]
    }
    fence_async_smem();
    // bad: a non-finite value in the chunk's tiles, gates or betas. QK (Dd) has a non-finite element iff the q or k
    // (dy or v) tile has one (inf 0 is NaN), or a product overflows (harmless: the exact path).
    bool nf = false;
#pragma unroll
    for (int i = 0; i < 32; ++i) nf |= !(fabsf(X[i]) <= 3.402823466e38f);
    const int* wg0_flag = gate_flags(sm, ch);  // the gates' and betas' (WG0)
    const bool bad = consumers_sync_or(nf) || wg0_flag[0] || wg0_flag[1];  // (2) the weights, and the flag
    if (ch > 0) prefetch_chunk<CK16>(p, bh, b, h, ch - 1, lt + 128 * c);  // the next chunk's tiles and checkpoint
    col_dots(sm, R, oQ, i0, part + (c * 4 + wl) * 64, wl, g, q);  // f_u's part
#pragma unroll
    for (int i = 0; i < 32; ++i) R[i] *= tab[8 * ((i >> 2) & 7) + 2 * q + (i & 1)];  // diag(A) on columns t
    if (bad) exact(R, [&](float (&t)[32]) { fma_t<false>(t, sm, kK, oMQ, ir, q); });
    else weights_product<false>(R, sm, kK + 8192 * c, oMQ, oMQ + 8192);  // dq^T += K^T MQ^T
    if (tc == 64) store_t<false>(dq + row0, rs, R, nullptr, i0, wl, g, q, tc);
    else store_t<true>(dq + row0, rs, R, nullptr, i0, wl, g, q, tc);  // the last chunk
    // dgate's term (d), each consumer its half of the columns t (after dq: R's registers are free)
    if (c == 0) dgate_m<0>(sm, X, L, tab, part, bad, oQ, oY, wl, g, q, lane);
    else dgate_m<1>(sm, X, L, tab, part, bad, oQ, oY, wl, g, q, lane);
    if (ch > 0) lx_free_arrive();  // (4) its reads of Lx done: WG0 writes the next chunk's
    // Rk^T = G V^T, G's accumulator recast as A fragments; e's part
    rs_split_product(Rk, sm, kV, [&](int kb, float (&sv)[8]) {
#pragma unroll
      for (int r = 0; r < 8; ++r) sv[r] = G[8 * kb + r];
    });
    col_dots(sm, Rk, kK, i0, part + 512 + (c * 4 + wl) * 64, wl, g, q);  // e_s's part
#pragma unroll
    for (int i = 0; i < 32; ++i) Rk[i] *= tab[128 + 8 * ((i >> 2) & 7) + 2 * q + (i & 1)];  // diag(w) on columns s
    if (bad) exact(Rk, [&](float (&t)[32]) { fma_t<true>(t, sm, oQ, oMD, ir, q); });
    else weights_product<true>(Rk, sm, oQ + 8192 * c, oMD, oMD + 8192);  // dkt^T += Q^T MD
    col_dots(sm, Rk, kK, i0, part + 1024 + (c * 4 + wl) * 64, wl, g, q);  // dbeta_s's part
    if (tc == 64) store_t<false>(dk + row0, rs, Rk, tab + 192, i0, wl, g, q, tc);  // dk = beta dkt
    else store_t<true>(dk + row0, rs, Rk, tab + 192, i0, wl, g, q, tc);
    // KG (columns j = 64 c ..) = K G, B = G hi / lo (MN-major); then dv = diag(beta w) KG + MP^T dY
#pragma unroll
    for (int kb = 0; kb < 8; ++kb) {
      wg_fence();
      const uint64_t da = kdesc(sm, kK, 64, kb);
      if (kb == 0) wgmma_ss64_t_z(R, da, mdesc(sm, kGH + 16384 * c, 128, kb));
      else wgmma_ss64_t(R, da, mdesc(sm, kGH + 16384 * c, 128, kb), 1);
      wgmma_ss64_t(R, da, mdesc(sm, kGL + 16384 * c, 128, kb), 1);
    }
    wg_commit();
    wg_wait<0>();
    acc_fence(R);
#pragma unroll
    for (int i = 0; i < 32; ++i) R[i] *= tab[256 + 16 * wl + g + 8 * ((i >> 1) & 1)];  // diag(beta w) on rows s
    if (bad) {
      exact(R, [&](float (&t)[32]) { fma_dv(t, sm, oY, 16 * wl + g, i0, q); });
    } else {
#pragma unroll
      for (int kb = 0; kb < 4; ++kb) {
        wg_fence();
        const uint64_t bd = mdesc(sm, oY + 8192 * c, 64, kb);
        wgmma_ss64_a_t(R, mdesc(sm, kMPH, 64, kb), bd, 1);
        wgmma_ss64_a_t(R, mdesc(sm, kMPL, 64, kb), bd, 1);
      }
      wg_commit();
      wg_wait<0>();
      acc_fence(R);
    }
#pragma unroll
    for (int n = 0; n < 8; ++n)
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        const int s = 16 * wl + g + 8 * hh, j = i0 + 8 * n + 2 * q;
        if (s < tc) *reinterpret_cast<__nv_bfloat162*>(dv + row0 + s * rs + j) =
            __floats2bfloat162_rn(R[4 * n + 2 * hh], R[4 * n + 2 * hh + 1]);
      }
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) c0 += __shfl_xor_sync(0xffffffffu, c0, o);
    if (lane == 0) part[1536 + c * 4 + wl] = c0;
    consumers_sync();  // (5) both consumers' KG have read G's hi / lo
    if (ch > 0) load_tiles<9, 256>(p, sm, b, h, ch - 1, lt + 128 * c, oMD, oMQ);  // the next q, dy: MD, MQ are dead
    // G <- A_63 G + (diag(A) Q)^T dY: A = Q^T fragments scaled and split
    const float a63 = tab[63];
#pragma unroll
    for (int i = 0; i < 64; ++i) G[i] *= a63;
    acc_fence(G);
#pragma unroll
    for (int kb = 0; kb < 4; ++kb) {
      uint32_t ah[4], al[4], qf[4];
      const int j = lane >> 3;  // block j: rows i of half j & 1, steps of half j >> 1
      ldm4<true>(qf, sm + oQ + ((i0 + 16 * wl + 8 * (j & 1)) >> 3) * 1024 + (16 * kb + 8 * (j >> 1) + (lane & 7)) * 16);
#pragma unroll
      for (int r = 0; r < 4; ++r) {  // a_r: row ir + 8 (r & 1), steps t = 16 kb + 2 q + 8 (r >> 1) (+1)
        const int t = 16 * kb + 2 * q + 8 * (r >> 1);
        const float2 v = unpack(qf[r]);
        split_bf16x2<false>(v.x * tab[t], v.y * tab[t + 1], ah[r], al[r]);
      }
      wg_fence();
      const uint64_t db = mdesc(sm, oY, 64, kb);
      wgmma_rs128_t(G, ah, db, 1);
      wgmma_rs128_t(G, al, db, 1);
    }
    wg_commit();
    if (ch > 0) load_tiles<6, 256>(p, sm, b, h, ch - 1, lt + 128 * c);  // k and v (KG was their last reader), during the update
    wg_wait<0>();
    acc_fence(G);
    put_g();
    consumers_sync();  // (6) the chunk is done (the next chunk's tiles overwrite what both read)
  }
  sync_all<6>();  // (7) the last chunk's partials, for WG0
  if (p.ds0 == nullptr) return;  // (no initial state)
#pragma unroll
  for (int n = 0; n < 16; ++n)
#pragma unroll
    for (int hh = 0; hh < 2; ++hh)
      *reinterpret_cast<float2*>(p.ds0 + bh * 16384 + (ir + 8 * hh) * 128 + 8 * n + 2 * q) =
          make_float2(G[4 * n + 2 * hh], G[4 * n + 2 * hh + 1]);
}

// WG0's tables of chunk ch into buffer ch & 1, from step tid's gate g and beta bt (tid < 64): the gates, the betas and
// the non-finite flags, then L by columns and A, Ah, w, beta w (warps 0, 1). Lx apart (build_lx): it has one buffer.
// By columns, one uniform loop over t (a row a thread in double took a third of the chunk: divergent trip counts
// and the conversions' latency in line): lane l of warp 0 runs columns s = 2 l, 2 l + 1 of L, L[t][s] =
// prod_{r=s+1..t} g_r (t > s; 1 at t = s); warp 1 runs A[t] = prod_{r<=t} g_r and Ah. fp32 products: 63 roundings,
// about 2^-18 at most, below the weights' hi / lo split (this unit is bf16 only).
__device__ __forceinline__ void build_tables(unsigned char* sm, int ch, float g, float bt) {
  const int tid = threadIdx.x, lane = tid & 31;
  float *tab = tables(sm, ch), *L = ltab(sm, ch);
  if (tid < 64) {
    tab[320 + tid] = g;
    tab[192 + tid] = bt;
    // a non-finite gate or beta meets the masks' zeros in M: the exact path (warps 0, 1 flag their halves)
    const unsigned m = __ballot_sync(0xffffffffu, !(isfinite(g) && isfinite(bt)));
    if (lane == 0) gate_flags(sm, ch)[tid >> 5] = m != 0u;
  }
  wg0_sync();
  if (tid >= 64) return;
  const float ga = tab[320 + lane], gb = tab[352 + lane];  // g_t = (t < 32 ? ga : gb) of lane t % 32
  if (tid < 32) {
    const int s = 2 * lane;
    float r0, r1;
    l_columns(L, ga, gb, s, r0, r1);
    tab[128 + s] = r0;  // w_s = L[63][s]
    tab[129 + s] = r1;
    tab[256 + s] = tab[192 + s] * r0;  // beta_s w_s
    tab[257 + s] = tab[193 + s] * r1;
  } else {
    float run = 1.f;
    if (lane == 0) tab[64] = 1.f;
#pragma unroll 8
    for (int t = 0; t < 64; ++t) {
      run *= __shfl_sync(0xffffffffu, t < 32 ? ga : gb, t & 31);
      if (lane == 0) {
        tab[t] = run;                   // A
        if (t < 63) tab[65 + t] = run;  // Ah[t + 1] = A[t]
      }
    }
  }
}
// Lx of chunk ch (Lx[t][s] = L[t-1][s] for s < t, else 0; bf16 hi / lo at [s / 8][t][8]) from its L, by all of WG0:
// row t = tid % 64, columns 32 (tid / 64) ..; then the fence that makes it visible to wgmma.
__device__ __forceinline__ void build_lx(unsigned char* sm, int ch) {
  lx_pairs(ltab(sm, ch), threadIdx.x, [&](float x0, float x1, int off) {
    uint32_t hi, lo;
    split_bf16x2<false>(x0, x1, hi, lo);
    *reinterpret_cast<uint32_t*>(sm + kLxH + off) = hi;
    *reinterpret_cast<uint32_t*>(sm + kLxL + off) = lo;
  });
  fence_async_smem();
}

// WG0: chunk ch's dgate and dbeta from the consumers' partials, its tables and the gates' terms (fixed-order sums).
__device__ __forceinline__ void dgate_dbeta(const Params& p, unsigned char* sm, int64_t b, int64_t h, int ch) {
  const int tid = threadIdx.x, t0 = ch * 64, tc = min(64, p.T - t0);
  const int64_t go = (b * p.T + t0) * p.H + h;  // (b, t0, h) in dgate / dbeta (contiguous)
  const float *tab = tables(sm, ch), *L = ltab(sm, ch);
  float* part = partials(sm, ch);
  const int t = tid >> 1, x = tid & 1;  // two threads a step
  float td = 0.f;
  {  // fixed-order sums of the 8 parts: f (threads 0..63) and e (64..127)
    const int u = tid & 63, base = tid < 64 ? 0 : 512;
    float acc = 0.f;
#pragma unroll
    for (int w = 0; w < 8; ++w) acc += part[base + w * 64 + u];
    part[1544 + (tid >> 6) * 64 + u] = acc;
  }
  wg0_sync();
  if (x == 0) {  // (a) + (b) + (d)
#pragma unroll
    for (int w = 0; w < 4; ++w) td += part[1672 + w * 64 + t];
    float c0 = 0.f;
#pragma unroll
    for (int w = 0; w < 8; ++w) c0 += part[1536 + w];
    float sb = 0.f;
    for (int s = 0; s < t; ++s) sb = fmaf(L[lp(t - 1, s)] * tab[192 + s], part[1608 + s], sb);
    td += tab[128 + t] * (tab[64 + t] * c0 + sb);
    float db = 0.f;
#pragma unroll
    for (int w = 0; w < 8; ++w) db += part[1024 + w * 64 + t];
    if (t < tc) put_gb(p.dbeta, p.b32, go + t * p.H, db);
  } else {  // (c)
    float sc = 0.f;
    for (int u = t; u < 64; ++u) sc = fmaf(L[lp(u, t)], part[1544 + u], sc);
    td = tab[64 + t] * sc;
  }
  td += __shfl_xor_sync(0xffffffffu, td, 1);  // x = 0's (a) + (b) + (d), x = 1's (c)
  if (x == 0 && t < tc) put_gb(p.dgate, p.g32, go + t * p.H, td);
}

// WG0: each chunk's tables a chunk ahead (during the chunk before), and its dgate and dbeta a chunk behind (during the
// chunk after, from the double-buffered partials): the consumers never wait for WG0 but at (1), where its tables
// have long been ready.
__device__ void aux(const Params& p, unsigned char* sm, int64_t bh, int nck) {
  const int tid = threadIdx.x;
  const int64_t b = bh / p.H, h = bh - b * p.H;
  {  // the first chunk's tables
    const int t = (nck - 1) * 64 + tid;
    build_tables(sm, nck - 1, tid < 64 ? gate_at(p, b, h, t) : 0.f, tid < 64 ? beta_at(p, b, h, t) : 0.f);
    wg0_sync();  // (L by warps 0, 1)
    build_lx(sm, nck - 1);
  }
  for (int ch = nck - 1; ch >= 0; --ch) {
    const int t0 = ch * 64;
    // (WG0's own barrier between its stores of the tables and (1): without it racecheck reports them against the
    // consumers' loads after (1))
    wg0_sync();
    sync_all<6>();  // (1)
    if (ch + 1 < nck) {  // the chunk before's dgate and dbeta, from its buffers, which the next tables overwrite
      dgate_dbeta(p, sm, b, h, ch + 1);
      wg0_sync();
    }
    if (ch > 0) {  // the next chunk's tables, while the consumers work on this one
      const int tn = t0 - 64 + tid;
      build_tables(sm, ch - 1, tid < 64 ? gate_at(p, b, h, tn) : 0.f, tid < 64 ? beta_at(p, b, h, tn) : 0.f);
      lx_free_wait();  // (4) the consumers have read this chunk's Lx (and WG0's L is WG0's)
      build_lx(sm, ch - 1);
    }
  }
  sync_all<6>();  // (7) the consumers' last partials
  dgate_dbeta(p, sm, b, h, 0);
}

template <bool CK16>
__global__ void __launch_bounds__(384, 1) chunk_bwd_sm90_kernel(const Params p, const __grid_constant__ CUtensorMap smap) {
#if defined(__CUDA_ARCH__) && !defined(GR_WGMMA)
  __trap();
#endif
  extern __shared__ __align__(1024) unsigned char sm[];
  const int64_t bh = blockIdx.x;
  const int nck = p.nck;
  const int wg = __shfl_sync(0xffffffffu, (int)threadIdx.x >> 7, 0);
  if (wg == 0) maxnreg_dec<kAuxRegs>();
  else maxnreg_inc<kConsRegs>();
  if (wg == 0) aux(p, sm, bh, nck);
  else consumer<CK16>(p, sm, wg - 1, bh, nck, &smap);
}

// The checkpoint pass: S at every chunk start into p.ckpt ((B H, chunks, 128, 128) [dk][dv], fp32, or with CK16 kCk16
// rows, fp16 scaled: half the bytes of this pass's stores and of the backward's loads, and R^T one product a k-step;
// each warp stages its 16 columns transposed by stmatrix and writes whole 32-byte row pieces, as the 4-byte stores of
// a shuffled 16-bit pair cost more than the bytes they saved), from S_0 (or zero). One CTA of 384 threads a (b, h), one barrier a chunk: the k
// and v tiles double-buffered (cp.async, zeros past T; chunk ch + 1's issued after chunk ch's barrier, landing during
// its product); WG0 (threads < 64) the gates and betas a chunk ahead in registers, then beta_s w_s (w_s = prod_{r>s}
// g_r, fp32) and A_63 into a double-buffered table; consumer c holds S^T rows dv = 64 c .. as one m64n128 accumulator,
// stores it, then S^T <- A_63 S^T + (V^T diag(beta w)) K: A from the v tile by ldmatrix.trans, scaled and split hi / lo
// in registers (2 terms), B the k tile as loaded (MN-major, exact).
// tiles k 0, v 16384 a buffer; the tables; the consumers' bf16 staging (CK16), 4 KB a warp
constexpr int cBuf = 32768, cTab = 2 * cBuf, cStage = cTab + 2 * 256 * 4, cSmem = cStage + 8 * 4096;
template <bool CK16>
__global__ void __launch_bounds__(384, 1) chunk_bwd_sm90_ckpt_kernel(const Params p) {
#if defined(__CUDA_ARCH__) && !defined(GR_WGMMA)
  __trap();
#endif
  extern __shared__ __align__(1024) unsigned char sm[];
  const int tid = threadIdx.x, lane = tid & 31, wg = __shfl_sync(0xffffffffu, tid >> 7, 0);
  const int64_t bh = blockIdx.x, b = bh / p.H, h = bh - b * p.H;
  const int nck = p.nck;
  if (nck == 0) return;  // (T = 0: never launched)
  const int lt = tid & 127, wl = lt >> 5, g = lane >> 2, q = lane & 3, c = wg - 1;
  auto load = [&](int ch) {  // chunk ch's k and v tiles into buffer ch & 1
    const int t0 = ch * 64;
    for (int e = tid; e < 2048; e += 384) {
      const int tile = e >> 10, r = (e >> 4) & 63, c8 = e & 15;
      const bf16* src = static_cast<const bf16*>(tile ? p.v : p.k);
      const Strides4& st = tile ? p.sv : p.sk;
      const int64_t sb = st.b, stt = st.t, sh = st.h;
      const bool valid = t0 + r < p.T;
      const bf16* row = src + b * sb + (int64_t)(t0 + r) * stt + h * sh + 8 * c8;
      cp_async<16>(sm + (ch & 1) * cBuf + tile * 16384 + c8 * 1024 + r * 16, valid ? row : src, valid);
    }
    cp_async_commit();
  };
  float gn = 1.f, bn = 0.f;  // WG0 threads < 64: step tid's gate and beta of the next chunk (past T: 1 and 0)
  auto gates = [&](int ch) {
    const int t = ch * 64 + tid;
    if (wg == 0 && tid < 64) gn = gate_at(p, b, h, t), bn = beta_at(p, b, h, t);
  };
  // consumers: S^T[64 c + 16 wl + g (+8)][8 n + 2 q (+1)] = S[4 n + 2 hh + e] (n = 0..15)
  float S[64];
  if (wg > 0)
#pragma unroll
    for (int x = 0; x < 64; ++x) {
      const int dv = 64 * c + 16 * wl + g + 8 * ((x >> 1) & 1), dk = 8 * (x >> 2) + 2 * q + (x & 1);
      S[x] = p.s_in ? p.s_in[b * p.ssi.b + h * p.ssi.h + dk * p.ssi.i + dv * p.ssi.j] : 0.f;
    }
  load(0);
  gates(0);
  for (int ch = 0; ch < nck; ++ch) {
    float* tab = reinterpret_cast<float*>(sm + cTab) + (ch & 1) * 256;  // gate 0, beta 64, beta w 128, A_63 192
    if (wg == 0) {
      if (tid < 64) tab[tid] = gn, tab[64 + tid] = bn;
      gates(ch + 1);  // (in flight during this chunk)
      wg0_sync();
      if (tid < 64) {  // beta_s w_s (w_s = prod_{r>s} g_r) and A_63: fp32 products in a uniform loop, as aux's tables
        const float ga = tab[lane], gb = tab[32 + lane];  // g_r = (r < 32 ? ga : gb) of lane r % 32
        float w = 1.f;
#pragma unroll 8
        for (int r = 63; r > 0; --r) {
          const float gr = __shfl_sync(0xffffffffu, r < 32 ? ga : gb, r & 31);
          w = r > tid ? w * gr : w;
        }
        tab[128 + tid] = w * tab[64 + tid];
        if (tid == 0) tab[192] = w * tab[0];
      }
      // WG0's own barrier between these writes and (the all-threads barrier) below: with the all-threads barrier
      // alone, racecheck reports the consumers' reads as races (perf-notes, twelfth session: its model of named
      // barriers wants the writers' own barrier first); one 128-thread barrier a chunk
      wg0_sync();
    } else if constexpr (CK16) {  // the checkpoint in fp16 (kCk16: scaled, ck16_scale): this warp's 16 dv columns x
      // 128 dk rows staged transposed by stmatrix (8 x 8 blocks, fragment rows dv -> memory rows dk; the two dv halves
      // of a dk row swapped on rows 4..7 of a block: conflict-free), then 32-byte row pieces out as 16-byte stores
      __half* d = reinterpret_cast<__half*>(p.ckpt) + (bh * nck + ch) * kCk16;
      const float scale = ck16_scale(S, reinterpret_cast<float*>(d + 16384) + 4 * c + wl, lane);
      d += 64 * c + 16 * wl;
      unsigned char* st = sm + cStage + (4 * c + wl) * 4096;
      const int j = lane & 7, mi = lane >> 3;  // this lane's address: row j of matrix mi of each x4
#pragma unroll
      for (int n2 = 0; n2 < 8; ++n2) {  // matrices (n, hh) = (2 n2 + (mi >> 1), mi & 1)
        float v[8];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int x = 4 * (2 * n2 + (i >> 1)) + 2 * (i & 1);
          v[2 * i] = S[x];
          v[2 * i + 1] = S[x + 1];
        }
        const int dk = 8 * (2 * n2 + (mi >> 1)) + j, hh = (mi & 1) ^ ((j >> 2) & 1);
        stsm_x4_trans<true>((uint32_t)__cvta_generic_to_shared(st + dk * 32 + hh * 16), v, scale);
      }
      __syncwarp();
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const int k = 32 * i + lane, dk = k >> 1, hh = (k & 1) ^ ((k >> 3) & 1);
        const uint4 v = *reinterpret_cast<const uint4*>(st + 16 * k);
        *reinterpret_cast<uint4*>(d + dk * 128 + 8 * hh) = v;
      }
      __syncwarp();
    } else {  // the checkpoint: S at the chunk's start
      float* d = p.ckpt + (bh * nck + ch) * 16384;
#pragma unroll
      for (int x = 0; x < 64; ++x) {
        const int dv = 64 * c + 16 * wl + g + 8 * ((x >> 1) & 1), dk = 8 * (x >> 2) + 2 * q + (x & 1);
        d[dk * 128 + dv] = S[x];
      }
    }
    tiles_landed();
    sync_all<6>();  // chunk ch's tiles and table; every reader of buffer (ch + 1) & 1 (chunk ch - 1's) is done
    if (ch == nck - 1) break;  // (the last chunk's end state is not a checkpoint)
    load(ch + 1);  // (ch + 1 < nck here)
    if (wg > 0) {
      const float a63 = tab[192];
      const unsigned char* buf = sm + (ch & 1) * cBuf;
#pragma unroll
      for (int x = 0; x < 64; ++x) S[x] *= a63;
      acc_fence(S);
#pragma unroll
      for (int kb = 0; kb < 4; ++kb) {
        uint32_t vf[4], ah[4], al[4];  // block j: rows dv of half j & 1, steps of half j >> 1
        const int j = lane >> 3;
        ldm4<true>(vf, buf + 16384 + ((64 * c + 16 * wl + 8 * (j & 1)) >> 3) * 1024 +
                        (16 * kb + 8 * (j >> 1) + (lane & 7)) * 16);
#pragma unroll
        for (int r = 0; r < 4; ++r) {  // a_r: row 64 c + 16 wl + g + 8 (r & 1), steps t = 16 kb + 2 q + 8 (r >> 1) (+1)
          const int t = 16 * kb + 2 * q + 8 * (r >> 1);
          const float2 v = unpack(vf[r]);
          split_bf16x2<false>(v.x * tab[128 + t], v.y * tab[128 + t + 1], ah[r], al[r]);
        }
        wg_fence();
        const uint64_t db = mdesc(sm, (ch & 1) * cBuf, 64, kb);  // B[t][dk]: the k tile
        wgmma_rs128_t(S, ah, db, 1);
        wgmma_rs128_t(S, al, db, 1);
      }
      wg_commit();
      wg_wait<0>();
      acc_fence(S);
    }
  }
}


}  // namespace bwd90

// The TMA map of the 16-bit checkpoints ((chunks, kCk16) rows, S [i][j] first) in four dimensions (j % 64, i, j / 64,
// chunk), one box {64, 64, 2, 1} a consumer's 64 rows (tma_ckpt), 128-byte swizzled.
CUresult ckpt_map(CUtensorMap* m, const void* base, int64_t chunks) {
  const cuuint64_t dims[4] = {64, 128, 2, (cuuint64_t)chunks}, strides[3] = {256, 128, 2 * kCk16};  // (bytes)
  const cuuint32_t box[4] = {64, 64, 2, 1}, one[4] = {1, 1, 1, 1};
  return encode_tiled(m, CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 4, const_cast<void*>(base), dims, strides, box, one,
                CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
                CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
}

template <bool CK16>
cudaError_t launch_bwd90(const Plan& pl, const bwd90::Params& p, bool ckpt_kernel, cudaStream_t s, const char** failed) {
  static bool done_ckpt[64] = {}, done_bwd[64] = {};
  cudaError_t err = cudaSuccess;
  if (ckpt_kernel) {
    *failed = "chunk_bwd_sm90_ckpt";
    err = allow_smem(bwd90::chunk_bwd_sm90_ckpt_kernel<CK16>, done_ckpt);
    if (err == cudaSuccess)
      err = launch_threads(bwd90::chunk_bwd_sm90_ckpt_kernel<CK16>, dim3((unsigned)pl.blocks), 384, bwd90::cSmem, s,
                           false, p);
    if (err != cudaSuccess) return err;
  }
  *failed = "chunk_bwd_sm90: its checkpoints' TMA map";
  alignas(64) CUtensorMap smap = {};  // (the float32 checkpoints' kernel takes none: its rows load as before)
  if (CK16 && ckpt_map(&smap, p.ckpt, (int64_t)pl.blocks * p.nck) != CUDA_SUCCESS) return cudaErrorInvalidValue;
  *failed = "chunk_bwd_sm90: its shared memory attribute";
  err = allow_smem(bwd90::chunk_bwd_sm90_kernel<CK16>, done_bwd);
  if (err != cudaSuccess) return err;
  *failed = "chunk_bwd_sm90";
  return launch_threads(bwd90::chunk_bwd_sm90_kernel<CK16>, dim3((unsigned)pl.blocks), 384, pl.smem, s, false, p, smap);
}
// The checkpoints (pl.work_floats floats of the workspace; CK16's are 16-bit), then the backward; where the forward
// wrote them (pr.fwd_ckpt, in pl.ck16's dtype: forward_checkpoints), the backward alone.
cudaError_t launch_chunk_bwd_sm90(const Plan& pl, const BwdProblem& pr, float* work, cudaStream_t s,
                                  const char** failed) {
  bwd90::Params p;
  static_cast<BwdProblem&>(p) = pr;
  const bool fwd = pr.fwd_ckpt != nullptr;
  p.ckpt = fwd ? static_cast<float*>(pr.fwd_ckpt) : work;
  p.nck = (pr.T + 63) / 64;
  return pl.ck16 ? launch_bwd90<true>(pl, p, !fwd, s, failed) : launch_bwd90<false>(pl, p, !fwd, s, failed);
}

}  // namespace
}  // namespace gr

// The backward_sm90 unit's entry point (its Problem is a BwdProblem; bfloat16 only, as planned).
extern "C" int gr_execute_backward_sm90(const gr::Plan* pl, const gr::Problem* pr, float* work, cudaStream_t s,
                                        const char** failed) {
  *failed = "chunk_bwd_sm90";
  if (pl->kernel != gr::Kernel::chunk_bwd_sm90 || pl->dtype != gr::DType::bf16) return (int)cudaErrorInvalidValue;
  return (int)gr::launch_chunk_bwd_sm90(*pl, static_cast<const gr::BwdProblem&>(*pr), work, s, failed);
}
""")

# ===================================== chunk_bwd_sm90_fp32: the float32 backward on Hopper wgmma ==========
# Its wgmma forms (n, RS, B MN-major, A MN-major), f16 operands (fp32 values as scaled fp16 hi + lo pairs); each
# form zeroing and accumulating (ss_product's and rs_kstep's first k-step is a test of an unrolled index).
BWD_SM90_FP32_FORMS = ((32, False, 0, 0), (64, False, 0, 1), (64, False, 1, 0), (64, False, 1, 1),
                       (128, False, 1, 1), (64, True, 0, 0))
# One k-step of a product as three wgmmas, and the products over shared-memory pairs: what chunk_bwd_sm90_fp32's two
# kernels issue (and dev/bwd_fp32_probe.py, on its own bf16 forms). It calls ss / ss_z <TA, TB> and rs / rs_z <TB>,
# overloaded on the accumulator's size, which the including text defines before it.
BWD_FP32_KSTEP_SRC = r"""
// One k-step of a product in TERMS terms (3: hi hi + hi lo + lo hi; 1: hi hi); FIRST: d = (not +=) the first.
template <int TERMS, int TA, int TB, bool FIRST, int R>
__device__ __forceinline__ void ss_terms(float (&d)[R], uint64_t ah, uint64_t al, uint64_t bh, uint64_t bl) {
  if constexpr (FIRST) ss_z<TA, TB>(d, ah, bh);
  else ss<TA, TB>(d, ah, bh);
  if constexpr (TERMS == 3) {
    ss<TA, TB>(d, ah, bl);
    ss<TA, TB>(d, al, bh);
  }
}
template <int TERMS, int TB, bool FIRST, int R>
__device__ __forceinline__ void rs_terms(float (&d)[R], const uint32_t (&ah)[4], const uint32_t (&al)[4], uint64_t bh,
                                         uint64_t bl) {
  if constexpr (FIRST) rs_z<TB>(d, ah, bh);
  else rs<TB>(d, ah, bh);
  if constexpr (TERMS == 3) {
    rs<TB>(d, ah, bl);
    rs<TB>(d, al, bh);
  }
}

// A pair tile's k-step descriptors: hi at off, lo at off + lo_off; step bytes a k16 step.
struct Op {
  int hi, lo, lbo, sbo, step;
};
__device__ __forceinline__ Op kmaj(int off, int lo_off, int rows) { return {off, off + lo_off, rows * 16, 128, 32 * rows}; }
__device__ __forceinline__ Op mnmaj(int off, int lo_off, int krows) { return {off, off + lo_off, 128, krows * 16, 256}; }
__device__ __forceinline__ uint64_t od(const unsigned char* sm, const Op& o, int kb, int lo) {
  // (the start's >> 4 laundered a descriptor, as sm_desc's address, so that they are not all computed ahead; then
  // one add: shared addresses stay below 2^18 and every offset is a multiple of 16, so the sum fits the 14-bit field
  // and the LBO bits add without carry)
  uint32_t a = (uint32_t)__cvta_generic_to_shared(sm) >> 4;
  asm volatile("mov.b32 %0, %0;\n" : "+r"(a));
  a += ((uint32_t)((lo ? o.lo : o.hi) + kb * o.step) >> 4) + ((uint32_t)(o.lbo >> 4) << 16);
  return (uint64_t)a | ((uint64_t)(o.sbo >> 4) << 32);
}
// d (=, or += with !ZERO) A B over KSTEPS k16 steps, both operands pairs in shared memory; one commit group.
template <int TERMS, int TA, int TB, int KSTEPS, bool ZERO, int R>
__device__ __forceinline__ void ss_product(float (&d)[R], const unsigned char* sm, const Op& a, const Op& b) {
  wg_fence();
  ss_terms<TERMS, TA, TB, ZERO>(d, od(sm, a, 0, 0), od(sm, a, 0, 1), od(sm, b, 0, 0), od(sm, b, 0, 1));
#pragma unroll
  for (int kb = 1; kb < KSTEPS; ++kb) {
    wg_fence();
    ss_terms<TERMS, TA, TB, false>(d, od(sm, a, kb, 0), od(sm, a, kb, 1), od(sm, b, kb, 0), od(sm, b, kb, 1));
  }
  wg_commit();
}
// Keeps a k-step's A fragments from being computed ahead of the previous k-step's issue (64 registers of hi / lo
// beside G and the accumulator otherwise).
__device__ __forceinline__ void pin(uint32_t (&ah)[4], uint32_t (&al)[4]) {
#pragma unroll
  for (int r = 0; r < 4; ++r) asm volatile("" : "+r"(ah[r]), "+r"(al[r]));
}
// k-step kb of an RS product over a k-major operand pair b: the first one zeroes d (kb is unrolled: no branch).
template <int TERMS, int TB, int R>
__device__ __forceinline__ void rs_kstep(float (&d)[R], const uint32_t (&ah)[4], const uint32_t (&al)[4],
                                         const unsigned char* sm, const Op& b, int kb) {
  if (kb == 0) rs_terms<TERMS, TB, true>(d, ah, al, od(sm, b, kb, 0), od(sm, b, kb, 1));
  else rs_terms<TERMS, TB, false>(d, ah, al, od(sm, b, kb, 0), od(sm, b, kb, 1));
}
// The two consumer warpgroups (named barrier 1; non-aligned, as chunk_bwd_sm90's)
__device__ __forceinline__ void consumers_sync() { asm volatile("barrier.sync 1, 256;\n" ::: "memory"); }
"""
# What both kernels of chunk_bwd_sm90_fp32 share, spliced into each one's namespace (it reads that kernel's layout
# constants: kTab, kTabBuf, kGates, kA, kWt, kBeta, kBW, kTile, kScl, kRawUnroll): the tables, the barriers, the raw
# rows' loads and their split into fp16 pairs, the tile exponents. kRawUnroll, the unroll count of the raw rows'
# cp.async loop: 1 in pass A, whose chunk loop is bound by instruction fetch (its code outgrew the instruction cache:
# docs/perf-notes.md), full in pass B, whose loop fits and loses time rolled.
BWD_FP32_SHARED_SRC = r"""
__device__ __forceinline__ float* ltab(unsigned char* sm, int ch) {
  return reinterpret_cast<float*>(sm + kTab + (ch & 1) * kTabBuf);
}
// Barriers: 1 the consumers (consumers_sync); 2 everyone, non-aligned (the roles reach it from different code); 5 WG0.
__device__ __forceinline__ void sync_all() { asm volatile("barrier.sync 2, 384;\n" ::: "memory"); }
__device__ __forceinline__ void wg0_sync() { asm volatile("barrier.sync 5, 128;\n" ::: "memory"); }
// Row t of a (B, T, H, 128) float32 input x of (b, t, h) strides st (elements; unit d-stride, 16-byte aligned rows:
// any stride a multiple of 4, 0 included). In 32 bits: the plan requires every element offset of q, k, v and dy
// below 2^31 (Layout::off32); the 64-bit form lengthened pass A's loop and slowed it
// (perf-notes, thirty-fourth session).
__device__ __forceinline__ const float* row_of(const void* x, const Strides4& st, int64_t b, int64_t h, int t) {
  return static_cast<const float*>(x) + ((int)b * (int)st.b + t * (int)st.t + (int)h * (int)st.h);
}
// The state gradient's rows ir, ir + 8 (m64n128 accumulator layout: columns 8 n + 2 q (+1)) at the start: (b, h)'s
// d_final_state (any strides), or zero where dfinal is nullptr.
__device__ __forceinline__ void load_g(float (&G)[64], const Params& p, int64_t b, int64_t h, int ir, int q) {
#pragma unroll
  for (int n = 0; n < 16; ++n)
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      float x0 = 0.f, x1 = 0.f;
      if (p.dfinal) {
        const float* d = p.dfinal + b * p.sdf.b + h * p.sdf.h + (ir + 8 * hh) * p.sdf.i + (8 * n + 2 * q) * p.sdf.j;
        x0 = d[0];
        x1 = d[p.sdf.j];
      }
      G[4 * n + 2 * hh] = x0;
      G[4 * n + 2 * hh + 1] = x1;
    }
}

// WG0: chunk ch's tables into buffer ch & 1, as chunk_bwd_sm90's build_tables: lane l of warp 0 runs columns 2 l,
// 2 l + 1 of L by running products (L[t][s] = L[t-1][s] g_t), then w and beta w; warp 1 runs A[t] = A[t-1] g_t.
// Gates and betas float32, any (b, t, h) strides; one that is not finite flags.
__device__ __forceinline__ void build_tables(const Params& p, unsigned char* sm, int64_t b, int64_t h, int ch) {
  const int tid = threadIdx.x, lane = tid & 31;
  float* L = ltab(sm, ch);
  float* gs = reinterpret_cast<float*>(sm + kGates);
  if (tid < 64) {
    const int t = ch * 64 + tid;
    const float* gate = static_cast<const float*>(p.gate) + b * p.sg.b + h * p.sg.h;
    const float* beta = static_cast<const float*>(p.beta) + b * p.sb.b + h * p.sb.h;
    const float gt = t < p.T ? gate[(int64_t)t * p.sg.t] : 1.f;  // past T: the identities
    const float bt = t < p.T ? beta[(int64_t)t * p.sb.t] : 0.f;
    flag_if(p, !(isfinite(gt) && isfinite(bt)));
    gs[tid] = gt;
    L[kBeta + tid] = bt;
  }
  wg0_sync();
  if (tid >= 64) return;
  const float ga = gs[lane], gb = gs[32 + lane];  // g_t = (t < 32 ? ga : gb) of lane t % 32
  if (tid < 32) {
    const int s = 2 * lane;
    float r0, r1;
    l_columns(L, ga, gb, s, r0, r1);
    L[kWt + s] = r0;  // w_s = L[63][s]
    L[kWt + s + 1] = r1;
    L[kBW + s] = L[kBeta + s] * r0;
    L[kBW + s + 1] = L[kBeta + s + 1] * r1;
  } else {
    float run = 1.f;
#pragma unroll 8
    for (int t = 0; t < 64; ++t) {
      run *= __shfl_sync(0xffffffffu, t < 32 ? ga : gb, t & 31);
      if (lane == 0) L[kA + t] = run;
    }
  }
}

// 8 fp32 values to a pair's hi and lo (16 bytes each, lo kTile after hi), each times scale.
// A pair: fp16 hi = RN(x), lo = RN(x - hi), x already times a power of two (its tile's, tile_exp, or its row's)
// that brings the values' max |x| near 2^15 (training-design 8.6, 8.7).
__device__ __forceinline__ void psplit(float x0, float x1, uint32_t& hi, uint32_t& lo) {
  const __half2 h = __floats2half2_rn(x0, x1);
  const __half2 l = __floats2half2_rn(x0 - __low2float(h), x1 - __high2float(h));
  hi = *reinterpret_cast<const uint32_t*>(&h);
  lo = *reinterpret_cast<const uint32_t*>(&l);
}
__device__ __forceinline__ void put_pair(unsigned char* dst, const float4& a, const float4& b, float scale) {
  uint4 hi, lo;
  psplit(a.x * scale, a.y * scale, hi.x, lo.x);
  psplit(a.z * scale, a.w * scale, hi.y, lo.y);
  psplit(b.x * scale, b.y * scale, hi.z, lo.z);
  psplit(b.z * scale, b.w * scale, hi.w, lo.w);
  *reinterpret_cast<uint4*>(dst) = hi;
  *reinterpret_cast<uint4*>(dst + kTile) = lo;
}
// The loads overlap the chunk before: a tile's raw fp32 rows (64 x 512 B, the size of its pair) land by cp.async
// in its own pair's space once the chunk before has read that pair, and the next top splits them in place. Row t's
// 16-byte piece c at t 512 + 16 (c ^ (t % 8)): the split's reads (8 rows, one piece, a quarter warp) hit every bank
// once. Rows past T: zero-filled (source size 0).
__device__ __forceinline__ uint32_t raw_off(int t, int c16) { return (uint32_t)(t * 512 + ((c16 ^ (t & 7)) << 4)); }
__device__ __forceinline__ void issue_raw(const Params& p, unsigned char* sm, int base, const void* x,
                                          const Strides4& st, int64_t b, int64_t h, int ch, int lt) {
  const int c16 = lt & 31;
#pragma unroll kRawUnroll
  for (int i = 0; i < 8; ++i) {
    const int t = (lt >> 5) + 8 * i;
    const bool valid = ch * 64 + t < p.T;
    const float* src = row_of(x, st, b, h, valid ? ch * 64 + t : 0) + 4 * c16;
    const uint32_t dst = (uint32_t)__cvta_generic_to_shared(sm + base + raw_off(t, c16));
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(valid ? 16 : 0)
                 : "memory");
  }
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
template <int N>
__device__ __forceinline__ void raw_wait() {  // this thread's groups but the newest N have landed
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}
// Thread lt's share of a raw tile: row t = 8 (lt / 32) + lt % 8, 8-column pieces kc = (lt / 8) % 4 + 4 m.
__device__ __forceinline__ void read_raw(const unsigned char* sm, int base, int lt, float4 (&v)[4][2]) {
  const int t = 8 * (lt >> 5) + (lt & 7), kq = (lt >> 3) & 3;
#pragma unroll
  for (int m = 0; m < 4; ++m)
#pragma unroll
    for (int e = 0; e < 2; ++e)
      v[m][e] = *reinterpret_cast<const float4*>(sm + base + raw_off(t, 2 * (4 * m + kq) + e));
}
// ... and its pieces written back as the tile's pair ([d / 8][t][8]: a quarter warp's 8 rows x 16 B, no conflicts).
__device__ __forceinline__ void write_pair(unsigned char* sm, int base, int lt, const float4 (&v)[4][2], float scale) {
  const int t = 8 * (lt >> 5) + (lt & 7), kq = (lt >> 3) & 3;
#pragma unroll
  for (int m = 0; m < 4; ++m) put_pair(sm + base + (4 * m + kq) * 1024 + t * 16, v[m][0], v[m][1], scale);
}
// The tile exponents: each warp's max |x| of a tile into its slot (8 floats a tile at kScl), then, after a barrier,
// the tile's exponent e over N of its slots from `first` (fp32_split_emulation's pow2_scale: e = ceil(log2 max) - 15,
// 0 for a zero tile; clamped at -126 so that 2^-e stays a normal float, where the emulation has no clamp: tiles of
// max |x| <= 2^-111 differ from it); values are split times 2^-e and a product's accumulator takes 2^e_A and 2^e_B.
// A warp's maximum keeps a NaN (fmax_nan): one that is not finite flags.
__device__ __forceinline__ void put_max(const Params& p, unsigned char* sm, int tile, int slot, float m) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) m = fmax_nan(m, __shfl_xor_sync(0xffffffffu, m, o));
  if ((threadIdx.x & 31) == 0) {
    reinterpret_cast<float*>(sm + kScl)[8 * tile + slot] = m;
    flag_if(p, !isfinite(m));
  }
}
__device__ __forceinline__ int max_exp(float m) {  // the exponent e of a tile of maximum m
  if (!(m > 0.f)) return 0;
  const int bits = __float_as_int(m);  // ceil(log2 m) from the bits, as pass B's row_exp (a subnormal m clamps)
  return max((bits >> 23) - 127 + ((bits & 0x7fffff) != 0) - 15, -126);
}
template <int N>
__device__ __forceinline__ int tile_exp(const unsigned char* sm, int tile, int first = 0) {
  const float* sl = reinterpret_cast<const float*>(sm + kScl) + 8 * tile + first;
  float m = sl[0];
#pragma unroll
  for (int w = 1; w < N; ++w) m = fmaxf(m, sl[w]);
  return max_exp(m);
}
// 2^e for one tile's exponent or its negation (|e| <= 126: a normal float); two tiles' scale is applied as two
// multiplies, never as the product exp2i(a) exp2i(b), which may overflow or underflow where the values do not.
__device__ __forceinline__ float exp2i(int e) { return __int_as_float((127 + e) << 23); }
__device__ __forceinline__ float max_abs(const float4 (&v)[4][2], float scale = 1.f) {
  float m = 0.f;
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int e = 0; e < 2; ++e)
      m = fmax_nan(m, fmax_nan(fmax_nan(fabsf(v[i][e].x * scale), fabsf(v[i][e].y * scale)),
                               fmax_nan(fabsf(v[i][e].z * scale), fabsf(v[i][e].w * scale))));
  return m;
}
template <int N>
__device__ __forceinline__ float max_abs(const float (&x)[N]) {
  float m = 0.f;
#pragma unroll
  for (int i = 0; i < N; ++i) m = fmax_nan(m, fabsf(x[i]));
  return m;
}
"""
BACKWARD_SM90_FP32_SRC = ("namespace gr {\nnamespace {\nnamespace bwd32 {\n" +
                          "".join(_wgmma(n, rs, tb, z, "f16", ta) for n, rs, tb, ta in BWD_SM90_FP32_FORMS
                                  for z in (True, False)) + r"""
// The forms by the accumulator's size (d[N / 2]) and the operands' majors (TA, TB: MN-major), for ss_terms and
// rs_terms; only BWD_SM90_FP32_FORMS exist.
template <int TA, int TB>
__device__ __forceinline__ void ss_z(float (&d)[16], uint64_t a, uint64_t b) {
  static_assert(!TA && !TB, "N = 32: K-major A and B");
  wgmma_h_ss32_z(d, a, b);
}
template <int TA, int TB>
__device__ __forceinline__ void ss(float (&d)[16], uint64_t a, uint64_t b) {
  static_assert(!TA && !TB, "N = 32: K-major A and B");
  wgmma_h_ss32(d, a, b, 1);
}
template <int TA, int TB>
__device__ __forceinline__ void ss_z(float (&d)[32], uint64_t a, uint64_t b) {
  static_assert(TA || TB, "N = 64: an MN-major A or B");
  if constexpr (TA && TB) wgmma_h_ss64_a_t_z(d, a, b);
  else if constexpr (TA) wgmma_h_ss64_a_z(d, a, b);
  else wgmma_h_ss64_t_z(d, a, b);
}
template <int TA, int TB>
__device__ __forceinline__ void ss(float (&d)[32], uint64_t a, uint64_t b) {
  static_assert(TA || TB, "N = 64: an MN-major A or B");
  if constexpr (TA && TB) wgmma_h_ss64_a_t(d, a, b, 1);
  else if constexpr (TA) wgmma_h_ss64_a(d, a, b, 1);
  else wgmma_h_ss64_t(d, a, b, 1);
}
template <int TA, int TB>
__device__ __forceinline__ void ss_z(float (&d)[64], uint64_t a, uint64_t b) {
  static_assert(TA && TB, "N = 128: MN-major A and B");
  wgmma_h_ss128_a_t_z(d, a, b);
}
template <int TA, int TB>
__device__ __forceinline__ void ss(float (&d)[64], uint64_t a, uint64_t b) {
  static_assert(TA && TB, "N = 128: MN-major A and B");
  wgmma_h_ss128_a_t(d, a, b, 1);
}
template <int TB>
__device__ __forceinline__ void rs_z(float (&d)[32], const uint32_t (&a)[4], uint64_t b) {
  static_assert(!TB, "RS: a K-major B");
  wgmma_h_rs64_z(d, a, b);
}
template <int TB>
__device__ __forceinline__ void rs(float (&d)[32], const uint32_t (&a)[4], uint64_t b) {
  static_assert(!TB, "RS: a K-major B");
  wgmma_h_rs64(d, a, b, 1);
}
""" + BWD_FP32_KSTEP_SRC + r"""
// ===================================== chunk_bwd_sm90_fp32: the float32 backward on Hopper wgmma ==========
// docs/training-design.md 8; its dev harness (models, emulation, --check, --bench) is dev/bwd_fp32_pass{A,B}.py.
// float32 q, k, v, dy (rows 16-byte aligned, unit d-stride, any (b, t, h) strides that are multiples of 4, 0
// included), gates and betas (any strides), D_k = D_v = 128, any T; one CTA of 384 threads a (b, h), chunks of 64
// steps backwards; WG0 (setmaxnreg down) the gate tables a chunk ahead, two consumer warpgroups (up) every product.
// Every product on f16 wgmma, three terms a k-step (hi hi + hi lo + lo hi): each fp32 operand matrix is split into
// an fp16 hi + lo pair after a power-of-two scale that brings its max |x| near 2^15 (the bf16 scheme's 2^-17 pairs
// miss the 1e-5 bar; fp16's 2^-22 at one scale a tile meet it: training-design 8.4-8.7), and each accumulator is
// taken back by the scales' powers of two. Two launches a call, sharing nothing but the inputs:
// - chunk_bwd_sm90_fp32_kernel (namespace pa, dev pass A): dq, dk, dgate, dbeta from the forward's checkpoints
//   (Problem::fwd_ckpt: (B H, chunks, kCk32) float32 rows, S at each chunk start [dk][dv] and 8 maxima), one
//   exponent a tile (split t);
// - chunk_bwd_sm90_fp32_dv_kernel (namespace pb, dev pass B): dv and dS_0 from dS_T, q, k and dy, with q, k, dy and
//   q A[t] at one exponent a step (split r: a loss on few steps keeps its small steps' precision).
// The non-finite rule: the kernels give inf and NaN no meaning (a mask's zero meets them inside the products), they
// flag them: *p.nonfinite = 1 where the dq kernel reads a value that is not finite (q, k, v, dy, gate, beta, dfinal,
// a checkpoint's S or maxima) or either kernel writes one (dq, dk, dgate, dbeta; dv, dS_0), and the host's chunk_bwd,
// launched after them, then recomputes every gradient with exact inf / NaN semantics (it returns at once where the
// flag is 0). The checks ride on the maxima the scales need anyway (fmax_nan keeps a NaN), c0's sum over the
// checkpoint, WG0's gate loads and each output as it is stored (an intermediate tile that overflows flags too: a false
// alarm costs the recompute only); a flag is a plain store of 1 (deterministic). A value that is not finite can only
// give a tile garbage exponents, never an address or a trip count.
struct Params : BwdProblem {
  const float* ckpt;  // fwd_ckpt's rows (the dq kernel)
  int nck;            // chunks of 64 steps
};
// max(a, b) that keeps a NaN (fmaxf drops it): the maxima the non-finite rule reads
__device__ __forceinline__ float fmax_nan(float a, float b) {
  float r;
  asm("max.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
}
__device__ __forceinline__ void flag_if(const Params& p, bool bad) {
  if (bad) *p.nonfinite = 1;
}
// A kernel's body, one CTA a (b, h): WG0 down to AUX registers (aux), the consumers up to CONS (consumer: c = 0, 1; the
// warpgroup index read from lane 0, so that the compiler sees it uniform); the split assumes 168 registers a thread.
template <int AUX, int CONS, void (*aux)(const Params&, unsigned char*, int64_t),
          void (*consumer)(const Params&, unsigned char*, int, int64_t)>
__device__ __forceinline__ void roles(const Params& p) {
#if defined(__CUDA_ARCH__) && !defined(GR_WGMMA)
  __trap();
#endif
  extern __shared__ __align__(1024) unsigned char sm[];
  const int wg = __shfl_sync(0xffffffffu, (int)threadIdx.x >> 7, 0);
  if (wg == 0) {
    maxnreg_dec<AUX>();
    aux(p, sm, blockIdx.x);
    return;
  }
  maxnreg_inc<CONS>();
  consumer(p, sm, wg - 1, blockIdx.x);
}
""" + DECAY_TABLES_SRC + r"""
namespace pb {
// ---- chunk_bwd_sm90_fp32_dv_kernel: dv and the state gradient's chain (dev pass B, split r)
// Per chunk (backwards), consumer c holding G's rows i = 64 c .. (dS after the chunk, from dS_T) in registers:
// QK's columns s = 32 c .. -> MP[u][s] = L[u][s] beta_s QK[u][s] (s <= u); KG = K G (B = G's pair);
// dv = diag(beta w) KG + MP^T dY; U = (diag(A) Q)^T dY from zero and G = fmaf(A_63, G, U) (wgmma's in-place
// accumulation truncates: G's chain never accumulates in place). q, k, dy land by cp.async during the chunk before in
// their pairs' space and are split in place at the top (q also as q A[t]'s pair), each row at its own exponent (four
// lanes a row), int8 tables of them in kScl; QK and KG take the row / column factors after the product; the two
// products over the steps read dy's pair as stored and compensate their other operand against it: MP (split after
// barrier (2a), rows u times 2^(e_y[u] - E)) and qA's pair (rescaled in place while KG runs, two fp16 multiplies), E
// each product's largest e_comp + e_y; zero rows of dy, MP or qA zeroed; G one exponent a tile.
// Shared memory (bytes). Pairs (hi at off, lo at off + kTile; [d / 8][t][8]): q, qA (q_t A[t]), k, dy; G's pair
// ([j / 8][i][8], hi then lo 32 KB each); MP's pair ([s / 8][u][8], lo at + kW); two table buffers; the gates.
constexpr int kTile = 16384, kW = 8192;
constexpr int kQ = 0, kQA = 32768, kK = 65536, kY = 98304, kGH = 131072, kGL = 163840, kMP = 196608, kTab = 212992;
// a table buffer (floats): L packed (lp) at 0, then A, w, beta, beta w (chunk_bwd_sm90's tables without Ah, gate)
constexpr int kA = 2080, kWt = kA + 64, kBeta = kA + 128, kBW = kA + 192, kTabBuf = (kA + 256) * 4;
// kScl: 512 B of exponents: G's tile slots, the steps' exponent tables and E's slots (kEq ..).
constexpr int kGates = kTab + 2 * kTabBuf, kScl = kGates + 256, kSmem = kScl + 512;
static_assert(kSmem == kChunkBwdSm90Fp32DvSmem, "the dv kernel's shared memory (PRELUDE)");
constexpr int kRawUnroll = 8;  // (BWD_FP32_SHARED_SRC)
constexpr int kAuxRegs = 40, kConsRegs = 232;
static_assert(kAuxRegs * 128 + kConsRegs * 256 <= 65536, "the split fits the register file");
""" + BWD_FP32_SHARED_SRC + r"""
// WG0: chunk ch's q, k, dy rows into L2 a chunk ahead of the consumers' loads (6 lines of 128 B a thread; not
// unrolled: unrolled, it spilled at WG0's 40 registers).
__device__ __forceinline__ void prefetch_chunk(const Params& p, int64_t b, int64_t h, int ch) {
#pragma unroll 1
  for (int m = 0; m < 6; ++m) {
    const int x = threadIdx.x + 128 * m, tile = x >> 8, r = (x >> 2) & 63, t = ch * 64 + r;
    if (t >= p.T) continue;
    const float* src = tile == 0 ? row_of(p.q, p.sq, b, h, t) : tile == 1 ? row_of(p.k, p.sk, b, h, t)
                                                                          : row_of(p.dy, p.sdy, b, h, t);
    asm volatile("prefetch.global.L2 [%0];\n" ::"l"(src + 32 * (x & 3)));
  }
}
enum { sG = 4 };  // G's slots (bytes 128 .. 160 of kScl)
// One exponent a step (training-design 8.7; the dev model's StepScaled): q, k, dy and q A[t] have an exponent a row
// (step), from the row's max |x| at its split (read_raw's layout: four lanes a row, two shuffles); int8 tables at
// kScl: e_q, e_k, e_y (kEq, kEk, kEy) and MP's row exponents over each consumer's 32 columns (kEmp, 64 c + u); E's
// slots (kEs: int, a warp's largest product exponent of dv's MP^T dY at 0 .., of U's at 8 ..); G's float slots (sG,
// bytes 128 ..). kNone: a zero row's exponent where it zeroes a product's step (dy, MP, qA); q's and k's zero rows
// take 0 (their factor 1, as StepScaled's scale of -inf).
constexpr int kEmp = kScl, kEs = kScl + 160, kEq = kScl + 256, kEk = kScl + 320, kEy = kScl + 384;
constexpr int kNone = -128, kLow = -1024;
__device__ __forceinline__ const signed char* etab(const unsigned char* sm, int off) {
  return reinterpret_cast<const signed char*>(sm + off);
}
// ceil(log2 m) - 15 of a maximum m (pow2_scale's, from m's bits), clamped at -126 as tile_exp; `none` for m = 0.
__device__ __forceinline__ int row_exp(float m, int none) {
  if (!(m > 0.f)) return none;
  const int bits = __float_as_int(m);
  return max((bits >> 23) - 127 + ((bits & 0x7fffff) != 0) - 15, -126);
}
// The max of m over the four lanes of a row in read_raw's layout (lanes l, l ^ 8, l ^ 16, l ^ 24).
__device__ __forceinline__ float row_max(float m) {
  m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 8));
  return fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 16));
}
// 2^d as two normal floats f1 f2 (d clamped to +-252; d >> 1 and d - (d >> 1) share d's sign, so x f1 f2 is x 2^d
// rounded once wherever x 2^d is a normal float)
__device__ __forceinline__ void exp2_pair(int d, float& f1, float& f2) {
  d = min(max(d, -252), 252);
  f1 = exp2i(d >> 1);
  f2 = exp2i(d - (d >> 1));
}
// 2^e in both halves of an fp16 pair, e in [-24, 0] (subnormal below -14)
__device__ __forceinline__ uint32_t h2pow(int e) {
  const uint32_t x = e >= -14 ? (uint32_t)(e + 15) << 10 : 1u << (e + 24);
  return x | x << 16;
}
__device__ __forceinline__ uint32_t hmul2(uint32_t a, uint32_t b) {
  const __half2 r = __hmul2(*reinterpret_cast<const __half2*>(&a), *reinterpret_cast<const __half2*>(&b));
  return *reinterpret_cast<const uint32_t*>(&r);
}
// q A[t]'s pair, split at its own row exponents at the top, rescaled in place once dy's are known: row t (read_raw's
// share: 4 pieces of hi and of lo) times 2^d, d = e_qa + e_y - E (none: zeroed), as two fp16 multiplies, 2^max(d,
// -24) then 2^max(d - max(d, -24), -24) (each product rounded to fp16, as the dev model's contract_r_qa).
__device__ __forceinline__ void rescale_qa(unsigned char* sm, int lt, int d, bool none) {
  const int t = 8 * (lt >> 5) + (lt & 7), kq = (lt >> 3) & 3, d1 = max(d, -24);
  const uint32_t f1 = none ? 0u : h2pow(d1), f2 = h2pow(max(d - d1, -24));
#pragma unroll
  for (int m = 0; m < 4; ++m)
#pragma unroll
    for (int lo = 0; lo < 2; ++lo) {
      uint4* x = reinterpret_cast<uint4*>(sm + kQA + lo * kTile + (4 * m + kq) * 1024 + t * 16);
      uint4 v = *x;
      v.x = hmul2(hmul2(v.x, f1), f2);
      v.y = hmul2(hmul2(v.y, f1), f2);
      v.z = hmul2(hmul2(v.z, f1), f2);
      v.w = hmul2(hmul2(v.w, f1), f2);
      *x = v;
    }
}
// MP's values (QK times its factors a row u, 2^e_q[u], and a column s, 2^e_k[s]; then L[u][s] beta_s for s <= u,
// else 0) and their row exponents over this consumer's 32 columns into kEmp (for E, after barrier (2)).
__device__ __forceinline__ void mp_values_r(float (&X)[16], const float* L, unsigned char* sm, int c, int wl, int g,
                                            int q) {
  const signed char *eq = etab(sm, kEq), *ek = etab(sm, kEk);
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    const int u = 16 * wl + g + 8 * hh;
    const float fu = exp2i(eq[u]);
    float m = 0.f;
#pragma unroll
    for (int n = 0; n < 4; ++n) {
      const int s = 32 * c + 8 * n + 2 * q;
      float& x0 = X[4 * n + 2 * hh];
      float& x1 = X[4 * n + 2 * hh + 1];
      x0 = s <= u ? x0 * fu * exp2i(ek[s]) * L[lp(u, s)] * L[kBeta + s] : 0.f;
      x1 = s + 1 <= u ? x1 * fu * exp2i(ek[s + 1]) * L[lp(u, s + 1)] * L[kBeta + s + 1] : 0.f;
      m = fmaxf(m, fmaxf(fabsf(x0), fabsf(x1)));
    }
    m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 1));
    m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 2));
    if (q == 0) reinterpret_cast<signed char*>(sm + kEmp)[64 * c + u] = (signed char)row_exp(m, kNone);
  }
}
// ... and taken to dv's product scale before their split: row u times 2^(e_y[u] - E) (zero where dy's row is zero).
__device__ __forceinline__ void mp_scale_r(float (&X)[16], const unsigned char* sm, int wl, int g, int ev) {
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    const int ey = etab(sm, kEy)[16 * wl + g + 8 * hh];
    float f1, f2;
    exp2_pair(ey - ev, f1, f2);
    if (ey == kNone) f1 = 0.f;
#pragma unroll
    for (int n = 0; n < 4; ++n) {
      X[4 * n + 2 * hh] = X[4 * n + 2 * hh] * f1 * f2;
      X[4 * n + 2 * hh + 1] = X[4 * n + 2 * hh + 1] * f1 * f2;
    }
  }
}
// MP from consumer c's 64 x 32 accumulator X (rows u = 16 wl + g (+8), columns s = 32 c + 8 n + 2 q (+1)), split,
// stored [s / 8][u][8] (chunk_bwd_sm90's put_weights), times scale.
__device__ __forceinline__ void put_mp(unsigned char* sm, const float (&X)[16], int c, int wl, int g, int q,
                                       float scale) {
#pragma unroll
  for (int n = 0; n < 4; ++n)
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      const int u = 16 * wl + g + 8 * hh, s = 32 * c + 8 * n + 2 * q;
      uint32_t hi, lo;
      psplit(X[4 * n + 2 * hh] * scale, X[4 * n + 2 * hh + 1] * scale, hi, lo);
      const int off = (s >> 3) * 1024 + u * 16 + (s & 7) * 2;
      *reinterpret_cast<uint32_t*>(sm + kMP + off) = hi;
      *reinterpret_cast<uint32_t*>(sm + kMP + kW + off) = lo;
    }
}
// G's rows ir, ir + 8 (all columns) as its pair ([j / 8][i][8], MN-major for KG's B).
__device__ __forceinline__ void put_g(unsigned char* sm, const float (&G)[64], int ir, int q, float scale) {
#pragma unroll
  for (int n = 0; n < 16; ++n)
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      const int i = ir + 8 * hh, j = 8 * n + 2 * q;
      uint32_t hi, lo;
      psplit(G[4 * n + 2 * hh] * scale, G[4 * n + 2 * hh + 1] * scale, hi, lo);
      const int off = (j >> 3) * 2048 + i * 16 + (j & 7) * 2;
      *reinterpret_cast<uint32_t*>(sm + kGH + off) = hi;
      *reinterpret_cast<uint32_t*>(sm + kGL + off) = lo;
    }
}

// Consumer c (0, 1): G's rows i = 64 c .. 64 c + 63 in its accumulator G (m64n128 layout: rows ir (+8), columns
// 8 n + 2 q (+1)); dv's columns j = 64 c ..
__device__ __forceinline__ void consumer(const Params& p, unsigned char* sm, int c, int64_t bh) {
  const int lt = threadIdx.x - 128, wl = (lt >> 5) & 3, lane = lt & 31, g = lane >> 2, q = lane & 3;
  const int ir = 64 * c + 16 * wl + g;
  const int64_t b = bh / p.H, h = bh - b * p.H;
  float G[64];
  {  // the last chunk's raw rows (later chunks': issued during the chunk before)
    const int cl = p.nck - 1;
    issue_raw(p, sm, kQ, p.q, p.sq, b, h, cl, lt);
    issue_raw(p, sm, kK, p.k, p.sk, b, h, cl, lt);
    issue_raw(p, sm, kY, p.dy, p.sdy, b, h, cl, lt);
  }
  load_g(G, p, b, h, ir, q);
  int eg;  // the exponent of G's pair: its tile's max |G| near 2^15
  put_max(p, sm, sG, lt >> 5, max_abs(G));
  consumers_sync();
  eg = tile_exp<8>(sm, sG);
  put_g(sm, G, ir, q, exp2i(-eg));
  fence_async_smem();
  sync_all();  // (0) G's pair; the last chunk's tables
  for (int ch = p.nck - 1; ch >= 0; --ch) {
    const float* L = ltab(sm, ch);
    int eq, eqa, ek, ey;  // this thread's rows' exponents
    int ev, eu;  // the product exponents E of dv's MP^T dY and of U
    {  // q and k: raw rows to pairs (qA = q A[t] in fp32, then split: one rounding); dy's may still be in flight
      raw_wait<1>();
      consumers_sync();  // (1a) every thread's q and k rows landed
      float4 vq[4][2], vk[4][2];
      read_raw(sm, kQ, lt, vq);
      read_raw(sm, kK, lt, vk);
      const float a = L[kA + 8 * (lt >> 5) + (lt & 7)];
      {  // this thread's row t's exponents; q's and k's into their tables
        const int t = 8 * (lt >> 5) + (lt & 7);
        eq = row_exp(row_max(max_abs(vq)), 0);
        eqa = row_exp(row_max(max_abs(vq, a)), kNone);
        ek = row_exp(row_max(max_abs(vk)), 0);
        if ((lt & 24) == 0) {
          reinterpret_cast<signed char*>(sm + kEq)[t] = (signed char)eq;
          reinterpret_cast<signed char*>(sm + kEk)[t] = (signed char)ek;
        }
      }
      consumers_sync();  // (1b) the raw tiles read: their space becomes the pairs
      write_pair(sm, kQ, lt, vq, exp2i(-eq));
      write_pair(sm, kQA, lt, vq, a * exp2i(eqa == kNone ? 0 : -eqa));  // (q (A[t] 2^-e) rounds as (q A[t]) 2^-e)
      write_pair(sm, kK, lt, vk, exp2i(-ek));
    }
    fence_async_smem();
    consumers_sync();  // (1) q, qA and k's pairs
    float X[16];  // QK[:, 32 c ..]: B = k's rows s = 32 c .. (K-major: LBO stays the tile's 1024)
    ss_product<3, 0, 0, 8, true>(X, sm, kmaj(kQ, kTile, 64), Op{kK + 512 * c, kK + 512 * c + kTile, 1024, 128, 2048});
    wg_wait<0>();
    acc_fence(X);
    mp_values_r(X, L, sm, c, wl, g, q);  // (split after (2a), dy's exponents known)
    raw_wait<0>();
    fence_async_smem();
    consumers_sync();  // (2) MP's row exponents; every thread's dy rows landed; both QKs have read q's pair
    float4 vy[4][2];
    read_raw(sm, kY, lt, vy);
    {  // dy's row exponent; the row's product exponents of dv (MP's row, both consumers') and U
      const int t = 8 * (lt >> 5) + (lt & 7);
      ey = row_exp(row_max(max_abs(vy)), kNone);
      const int em = max(etab(sm, kEmp)[t], etab(sm, kEmp)[64 + t]);
      int pv = ey == kNone || em == kNone ? kLow : ey + em, pu = ey == kNone || eqa == kNone ? kLow : ey + eqa;
#pragma unroll
      for (int o = 1; o < 8; o <<= 1) {  // the warp's 8 rows (a row's four lanes agree)
        pv = max(pv, __shfl_xor_sync(0xffffffffu, pv, o));
        pu = max(pu, __shfl_xor_sync(0xffffffffu, pu, o));
      }
      if ((lt & 31) == 0) {
        reinterpret_cast<int*>(sm + kEs)[lt >> 5] = pv;
        reinterpret_cast<int*>(sm + kEs)[8 + (lt >> 5)] = pu;
      }
      if ((lt & 24) == 0) reinterpret_cast<signed char*>(sm + kEy)[t] = (signed char)ey;
    }
    consumers_sync();  // (2a) dy's raw tile read; its row exponents, E's slots
    {
      const int* es = reinterpret_cast<const int*>(sm + kEs);
      ev = es[0];
      eu = es[8];
#pragma unroll
      for (int w = 1; w < 8; ++w) {
        ev = max(ev, es[w]);
        eu = max(eu, es[8 + w]);
      }
    }
    if (ch > 0) issue_raw(p, sm, kQ, p.q, p.sq, b, h, ch - 1, lt);
    float R[32];  // KG, then dv: rows s = 16 wl + g (+8), columns j = 64 c + 8 n + 2 q (+1)
    ss_product<3, 0, 1, 8, true>(R, sm, kmaj(kK, kTile, 64), mnmaj(kGH + 16384 * c, kGL - kGH, 128));
    write_pair(sm, kY, lt, vy, exp2i(ey == kNone ? 0 : -ey));  // (while KG runs)
    // (while KG runs) qA's pair rescaled, MP taken to dv's scale and split
    rescale_qa(sm, lt, eqa + ey - eu, eqa == kNone || ey == kNone);  // (the row's own exponents: none, d unused)
    if (ev == kLow) ev = 0;  // (no step where both sides are nonzero: every product zero)
    if (eu == kLow) eu = 0;
    mp_scale_r(X, sm, wl, g, ev);
    put_mp(sm, X, c, wl, g, q, 1.f);
    fence_async_smem();
    wg_wait<0>();
    acc_fence(R);
    consumers_sync();  // (2b) dy's pair whole; both KGs have read k's pair; MP's pair, qA's rescaled
    if (ch > 0) issue_raw(p, sm, kK, p.k, p.sk, b, h, ch - 1, lt);
    {  // MP^T dY from zero at 2^E while KG takes 2^e_k[s] 2^e_G and beta w; then one add
      float D[32];
      ss_product<3, 1, 1, 4, true>(D, sm, mnmaj(kMP, kW, 64), mnmaj(kY + 8192 * c, kTile, 64));
      const float k2 = exp2i(eg);
#pragma unroll
      for (int i = 0; i < 32; ++i) {
        const int s = 16 * wl + g + 8 * ((i >> 1) & 1);
        R[i] = R[i] * exp2i(etab(sm, kEk)[s]) * k2 * L[kBW + s];
      }
      wg_wait<0>();
      acc_fence(D);
      float v1, v2;
      exp2_pair(ev, v1, v2);
#pragma unroll
      for (int i = 0; i < 32; ++i) R[i] = R[i] + __fmul_rn(D[i] * v1, v2);
    }
    // G's update from zero (its wgmmas run while dv is stored): U = (diag(A) Q)^T dY, A = qA^T, B = dy, MN-major
    float U[64];
    ss_product<3, 1, 1, 4, true>(U, sm, mnmaj(kQA + 8192 * c, kTile, 64), mnmaj(kY, kTile, 64));
    {  // dv: (B, T, H, 128) contiguous, rows t < T; its maximum flags
      float m = 0.f;
#pragma unroll
      for (int n = 0; n < 8; ++n)
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
          const int s = 16 * wl + g + 8 * hh, t = ch * 64 + s;
          if (t < p.T) {
            const float2 x = make_float2(R[4 * n + 2 * hh], R[4 * n + 2 * hh + 1]);
            *reinterpret_cast<float2*>(static_cast<float*>(p.dv) + ((b * p.T + t) * p.H + h) * 128 + 64 * c + 8 * n +
                                       2 * q) = x;
            m = fmax_nan(m, fmax_nan(fabsf(x.x), fabsf(x.y)));
          }
        }
      flag_if(p, !isfinite(m));
    }
    wg_wait<0>();
    acc_fence(U);
    const float a63 = L[kA + 63];
    float u1, u2;
    exp2_pair(eu, u1, u2);
#pragma unroll
    for (int i = 0; i < 64; ++i) G[i] = fmaf(a63, G[i], U[i] * u1 * u2);  // one rounding: the join of 8.3
    put_max(p, sm, sG, lt >> 5, max_abs(G));
    consumers_sync();  // (3) both consumers' KG have read G's pair, both Us dy's and qA's; G's maximum
    if (ch > 0) issue_raw(p, sm, kY, p.dy, p.sdy, b, h, ch - 1, lt);
    eg = tile_exp<8>(sm, sG);
    put_g(sm, G, ir, q, exp2i(-eg));
    fence_async_smem();
    sync_all();  // (4) the chunk is done; WG0's tables of ch - 1
  }
  if (p.ds0 == nullptr) return;
  float m = 0.f;  // dS_0: (B, H, 128, 128) contiguous; its maximum flags
#pragma unroll
  for (int n = 0; n < 16; ++n)
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      const float2 x = make_float2(G[4 * n + 2 * hh], G[4 * n + 2 * hh + 1]);
      *reinterpret_cast<float2*>(p.ds0 + bh * 16384 + (ir + 8 * hh) * 128 + 8 * n + 2 * q) = x;
      m = fmax_nan(m, fmax_nan(fabsf(x.x), fabsf(x.y)));
    }
  flag_if(p, !isfinite(m));
}

// WG0: the tables a chunk ahead, and the L2 prefetch of the next chunk's rows; the block barriers (0) and (4).
__device__ __forceinline__ void aux(const Params& p, unsigned char* sm, int64_t bh) {
  const int64_t b = bh / p.H, h = bh - b * p.H;
  build_tables(p, sm, b, h, p.nck - 1);
  sync_all();  // (0)
  for (int ch = p.nck - 1; ch >= 0; --ch) {
    if (ch > 0) {
      prefetch_chunk(p, b, h, ch - 1);
      build_tables(p, sm, b, h, ch - 1);
    }
    sync_all();  // (4)
  }
}

__global__ void __launch_bounds__(384, 1) chunk_bwd_sm90_fp32_dv_kernel(const Params p) {
  roles<kAuxRegs, kConsRegs, aux, consumer>(p);
}
}  // namespace pb

namespace pa {
// ---- chunk_bwd_sm90_fp32_kernel: dq, dk, dgate, dbeta (dev pass A, split t)
// - WG0 (setmaxnreg 56): the tables (L packed, A, w, beta) and Lx's pair a chunk ahead, the checkpoint's exponent
//   (from its 8 maxima), the L2 prefetch of the next chunk's rows and checkpoint, dgate and dbeta a chunk behind from
//   the consumers' double-buffered row-dot partials (chunk_bwd_sm90's dgate_dbeta: fixed-order sums, deterministic);
// - two consumer warpgroups (224 registers), consumer c holding G's rows i = 64 c .. (the state gradient after the
//   chunk) in registers: k, v and dy's fp32 rows land by cp.async in their own pair's space during the chunk before,
//   as soon as it has read that pair (v after Rk^T, k after dbeta's row dots, dy once dy A[t] is made), and the top
//   splits them in place while q's rows load from global memory (q's pair is read until G's update). Dd and QK's
//   columns s = 32 c .. -> MQ, MD (split, shared) and E; M_c = E[:, s half] Lx[:, s half]^T (dgate's C^3 term split
//   over the contraction: WG0 adds the two halves' column sums); R^T = S dY^T (S's fp32 rows from the checkpoint,
//   split a k-step at a time; c0 = sum S o G from the same values), f's part, dq^T = R^T diag(A) + K^T MQ^T;
//   Rk^T = G V^T (G split a k-step at a time), e's part, dkt^T = Rk^T diag(w) + Q^T MD, dbeta's part, dk = beta dkt;
//   G's update in two N = 64 halves, each from zero, U = Q^T diag(A) dY (B = dy A[t] as a pair in MQ / MD's space,
//   from dy's pair), joined by G = fmaf(A_63, G, U). The row dots read the pairs' hi + lo times their tile's 2^e.
// - One exponent a tile, each the model's matrix: q, k, v, dy (each warp's maximum at the top's in-place split,
//   through 8 slots across a barrier it already has); MQ and MD (both consumers' halves) and E (consumer c's 64 x 32,
//   M_c's A) across one more barrier (1w); Lx per column half (WG0's, a set a chunk parity); S from the
//   forward's 8 maxima (WG0's); G (its maximum across barrier (4)); dy A[t] (across (4b)). Where a product
//   accumulates onto a result (dq^T onto R^T diag(A), dkt^T onto Rk^T diag(w)) the result is taken to the product's
//   scale first and back after, one power of two at a time.
// Shared memory (bytes). Pairs (hi at off, lo at off + kTile; [d / 8][t][8]): q, k, v, dy. The weights' pairs MQ,
// MD ([s / 8][row][8], lo at + kW), Lx's pair ([s / 8][t][8], one buffer: WG0 rewrites it once the consumers have
// read it, barrier 4); two table buffers (the dv kernel's: L packed, A, w, beta, beta w); the gates; two buffers of
// the consumers' row-dot partials (chunk ch's in ch & 1; WG0 reduces them during chunk ch - 1).
constexpr int kTile = 16384, kW = 8192;
constexpr int kQ = 0, kK = 32768, kV = 65536, kY = 98304, kMQ = 131072, kMD = 147456, kLx = 163840, kTab = 180224;
constexpr int kA = 2080, kWt = kA + 64, kBeta = kA + 128, kBW = kA + 192, kTabBuf = (kA + 256) * 4;
static_assert(kK == kQ + 2 * kTile && kV == kK + 2 * kTile && kY == kV + 2 * kTile && kMQ == kY + 2 * kTile &&
              kMD == kMQ + 2 * kW && kLx == kMD + 2 * kW && kTab == kLx + 2 * kW, "the pairs (a tile 32 KB)");
constexpr int kGates = kTab + 2 * kTabBuf, kPart = kGates + 256;
// partials (floats): f [8][64] at 0, e at 512, dbeta at 1024 (slot 4 c + warp), c0 [8] at 1536, the sums of f at
// 1544 and of e at 1608, dgate's term (d) [8][64] at 1672 (slot 4 c + warp: consumer c's half of M's contraction)
// kScl: the tile scales' slots, 8 floats a tile (sQ .. sLx below): a consumer warp's max |x| at 4 c + warp, Lx's
// (WG0's) at its warp; then (kES) the checkpoints' exponents, an int a chunk parity (WG0's, a chunk ahead); then Lx's
// slots of odd chunks (sLxOdd).
constexpr int kPartBuf = (1672 + 512) * 4, kScl = kPart + 2 * kPartBuf, kES = kScl + 320, kSmem = kScl + 512;
static_assert(kSmem == kChunkBwdSm90Fp32Smem, "the dq kernel's shared memory (PRELUDE)");
constexpr int kRawUnroll = 1;  // (BWD_FP32_SHARED_SRC)
constexpr int kAuxRegs = 56, kConsRegs = 224;  // (chunk_bwd_sm90's split: its WG0 spilled at 40 with dgate's sums)
static_assert(kAuxRegs * 128 + kConsRegs * 256 <= 65536, "the split fits the register file");
""" + BWD_FP32_SHARED_SRC + r"""
enum { sQ, sK, sV, sY, sMQ, sMD, sE, sG, sYA, sLx, sLxOdd = sLx + 2 };  // the tiles' slots (kES: between Lx's two)
static_assert(kES == kScl + 32 * (sLx + 1) && kScl + 32 * (sLxOdd + 1) <= kSmem, "the scales' slots");
__device__ __forceinline__ int lx_slot(int ch) { return (ch & 1) ? sLxOdd : sLx; }  // Lx's slots, a chunk parity
// A pair's 16-bit element (fp16) as float
__device__ __forceinline__ float ld16(const unsigned char* p) {
  return __half2float(*reinterpret_cast<const __half*>(p));
}
__device__ __forceinline__ float* parts(unsigned char* sm, int ch) {
  return reinterpret_cast<float*>(sm + kPart + (ch & 1) * kPartBuf);
}
// Barrier 4: the consumers arrive after their last read of Lx in a chunk; WG0 waits before writing the next one's.
__device__ __forceinline__ void lx_free_arrive() { asm volatile("barrier.arrive 4, 384;\n" ::: "memory"); }
__device__ __forceinline__ void lx_free_wait() { asm volatile("barrier.sync 4, 384;\n" ::: "memory"); }

// WG0: Lx of chunk ch (Lx[t][s] = L[t-1][s] for s < t, else 0; pair [s / 8][t][8]) from its L (chunk_bwd_sm90's
// build_lx, by lx_pairs): row t = tid % 64, columns 32 (tid / 64) ..; then the fence that makes it visible to wgmma.
// Each column half's max |Lx| first (warps 0, 1: half 0; 2, 3: half 1), its exponent from its two warps' slots
// (lx_slot's, of the chunk's parity: the consumers read chunk ch + 1's slots, and WG0 writes chunk ch - 1's in the
// same ones, on either side of an everyone-barrier (4); one set, ordered by barrier 3's arrive, racecheck flagged).
__device__ __forceinline__ void build_lx(const Params& p, unsigned char* sm, int ch) {
  float m = 0.f;
  lx_pairs(ltab(sm, ch), threadIdx.x, [&](float x0, float x1, int) { m = fmaxf(m, fmaxf(fabsf(x0), fabsf(x1))); });
  put_max(p, sm, lx_slot(ch), threadIdx.x >> 5, m);
  wg0_sync();
  const float sc = exp2i(-tile_exp<2>(sm, lx_slot(ch), 2 * (threadIdx.x >> 6)));
  lx_pairs(ltab(sm, ch), threadIdx.x, [&](float x0, float x1, int off) {
    uint32_t hi, lo;
    psplit(x0 * sc, x1 * sc, hi, lo);
    *reinterpret_cast<uint32_t*>(sm + kLx + off) = hi;
    *reinterpret_cast<uint32_t*>(sm + kLx + kW + off) = lo;
  });
  fence_async_smem();
}
// WG0 (warp 0): chunk ch's checkpoint exponent e_S, the tile exponent (max_exp) of the forward's 8 warp maxima of
// |S| (its row's last 8 floats), into kES's slot of the chunk's parity; a maximum that is not finite flags (c0's
// sum flags the S values themselves).
__device__ __forceinline__ void ckpt_exp(const Params& p, unsigned char* sm, int64_t bh, int ch) {
  if (threadIdx.x >= 32) return;
  float m = __ldg(p.ckpt + (bh * p.nck + ch) * kCk32 + 16384 + (threadIdx.x & 7));
#pragma unroll
  for (int o = 4; o > 0; o >>= 1) m = fmax_nan(m, __shfl_xor_sync(0xffffffffu, m, o));
  if (threadIdx.x == 0) {
    flag_if(p, !isfinite(m));
    reinterpret_cast<int*>(sm + kES)[ch & 1] = max_exp(m);
  }
}
// WG0: chunk ch's q, k, v, dy rows and its checkpoint row (kCk32 floats: 513 or 514 lines of 128 B, its start
// 16-byte aligned) into L2 a chunk ahead of the consumers' loads (13 lines a thread; not unrolled, for WG0's
// registers).
__device__ __forceinline__ void prefetch_chunk(const Params& p, int64_t bh, int64_t b, int64_t h, int ch) {
  const unsigned char* S = reinterpret_cast<const unsigned char*>(p.ckpt + (int64_t)((int)bh * p.nck + ch) * kCk32);
#pragma unroll 1
  for (int m = 0; m < 13; ++m) {
    const int x = threadIdx.x + 128 * m;
    if (x < 514) {  // (the last two: the lines of the row's byte 65536 and of its last float)
      asm volatile("prefetch.global.L2 [%0];\n" ::"l"(S + min(128 * x, 4 * kCk32 - 4)));
      continue;
    }
    const int y = x - 514, tile = y >> 8, t = ch * 64 + ((y >> 2) & 63);
    if (tile >= 4 || t >= p.T) continue;
    const float* src = tile == 0 ? row_of(p.q, p.sq, b, h, t) : tile == 1 ? row_of(p.k, p.sk, b, h, t)
                     : tile == 2 ? row_of(p.v, p.sv, b, h, t) : row_of(p.dy, p.sdy, b, h, t);
    asm volatile("prefetch.global.L2 [%0];\n" ::"l"(src + 32 * (y & 3)));
  }
}
// WG0: chunk ch's dgate and dbeta ((B, T, H) contiguous) from the consumers' partials and its tables
// (chunk_bwd_sm90's dgate_dbeta, every sum in a fixed order: deterministic), two threads a step t: x = 0 terms (a),
// (b), (d) and dbeta, x = 1 term (c). One that is not finite flags.
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
    if (t < tc) {
      static_cast<float*>(p.dbeta)[go + t * p.H] = db;
      flag_if(p, !isfinite(db));
    }
  } else {
    float sc = 0.f;
    for (int u = t; u < 64; ++u) sc = fmaf(L[lp(u, t)], part[1544 + u], sc);
    td = ah * sc;  // (c)
  }
  td += __shfl_xor_sync(0xffffffffu, td, 1);
  if (x == 0 && t < tc) {
    static_cast<float*>(p.dgate)[go + t * p.H] = td;
    flag_if(p, !isfinite(td));
  }
}

// The consumers (lt 0..255): chunk ch's rows of x from global memory into registers (read_raw's share: row t =
// 8 (lt / 32) + lt % 8, 8-column pieces kc = (lt / 8) % 4 + 4 m); rows past T zeros. q's, at the top: its pair is
// read until G's update, so q alone has no space to land in during the chunk before; its loads fly while k, v and dy
// are split.
__device__ __forceinline__ void load_rows(const void* x_in, const Strides4& st, const Params& p, int64_t b, int64_t h,
                                          int ch, int lt, float4 (&v)[4][2]) {
  const float* x = static_cast<const float*>(x_in);
  asm volatile("" : "+l"(x));  // (opaque: its row addresses are not hoisted above the chunk loop into registers)
  const int t = 8 * (lt >> 5) + (lt & 7), kq = (lt >> 3) & 3;
  const bool valid = ch * 64 + t < p.T;
#pragma unroll
  for (int m = 0; m < 4; ++m) {
    const float4* src =
        reinterpret_cast<const float4*>(row_of(x, st, b, h, valid ? ch * 64 + t : 0) + 8 * (4 * m + kq));
    v[m][0] = valid ? src[0] : make_float4(0.f, 0.f, 0.f, 0.f);  // (weak loads: not moved below barrier (1a))
    v[m][1] = valid ? src[1] : make_float4(0.f, 0.f, 0.f, 0.f);
  }
}
// A raw tile split in place into its pair: every thread's share read, then (barrier) written; the tile's maximum
// through its slots across that barrier, and its exponent returned.
__device__ __forceinline__ int split_in_place(const Params& p, unsigned char* sm, int base, int lt, int tile) {
  float4 v[4][2];
  read_raw(sm, base, lt, v);
  put_max(p, sm, tile, lt >> 5, max_abs(v));
  consumers_sync();
  const int e = tile_exp<8>(sm, tile);
  write_pair(sm, base, lt, v, exp2i(-e));
  return e;
}
// dy A[t] (G's update's B, MN-major) as a pair at kMQ (lo at + kTile: MQ and MD's space, free after Q^T MD), from
// dy's pair (its fp16 hi + lo times 2^e_y: the row dots' dy) times A[t] in fp32 (one rounding), split times 2^-e_ya
// (scale = A[t] 2^-e_ya: RN(x A[t]) 2^-e_ya); no second read of dy's rows from L2 (that variant spilled 44 B and
// emulated no better: perf-notes, thirty-first session). With PUT false, only this thread's max |x A[t]|, returned.
__device__ __forceinline__ void dy_words(const uint32_t (&hw)[4], const uint32_t (&lw)[4], float sy, float (&x)[8]) {
#pragma unroll
  for (int e = 0; e < 4; ++e) {  // (a pair word: element 2 e in its low half)
    const __half2 h = *reinterpret_cast<const __half2*>(&hw[e]), l = *reinterpret_cast<const __half2*>(&lw[e]);
    x[2 * e] = (__low2float(h) + __low2float(l)) * sy;
    x[2 * e + 1] = (__high2float(h) + __high2float(l)) * sy;
  }
}
template <bool PUT>
__device__ __forceinline__ float put_dya(unsigned char* sm, const float* L, int lt, float sy, float sya) {
  const int t = 8 * (lt >> 5) + (lt & 7), kq = (lt >> 3) & 3;
  const float a = L[kA + t];
  float mx = 0.f;
#pragma unroll 1
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
// sv) works on them just before the split (c0's part). B a pair (K-major, or MN-major with TB). The values are split
// times sc (the tile's 2^-e).
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
// their 2^-e), stored [s / 8][t][8]. With PUT false, only this thread's max |MD| and |MQ|.
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
// x[n] (n = 0..7) summed over the 8 lanes g (lane bits 2..4) by reduce-scatter: x[0] ends as the sum of n = g, in the
// butterfly's order (g ^ 1, then g ^ 2, then g ^ 4: the same roundings as x += shfl_xor(x, 4), (8), (16))
__device__ __forceinline__ float sum8_scatter(float (&x)[8], int g) {
#pragma unroll
  for (int s = 0; s < 3; ++s) {
    const bool up = (g >> s) & 1;
#pragma unroll
    for (int m = 0; m < (4 >> s); ++m) {
      const float a = x[2 * m], b = x[2 * m + 1];
      x[m] = (up ? b : a) + __shfl_xor_sync(0xffffffffu, up ? a : b, 4 << s);
    }
  }
  return x[0];
}
// A pair's value: its fp16 hi + lo times the tile's 2^e (sc), the row dots' operand (as the model's)
__device__ __forceinline__ float ldp(const unsigned char* p, float sc) { return (ld16(p) + ld16(p + kTile)) * sc; }
// Column u of a transposed 64 x 64 accumulator X[i][u] (rows i = ir (+8)) against row u of a pair tile, over this
// warp's 16 rows i: one partial a warp and column, at part[u].
__device__ __forceinline__ void col_dots(const unsigned char* sm, const float (&X)[32], int tile, int ir, float* part,
                                         int g, int q, float sc) {
#pragma unroll
  for (int e = 0; e < 2; ++e) {
    float x[8];
#pragma unroll
    for (int n = 0; n < 8; ++n) {
      const int u = 8 * n + 2 * q + e;
      x[n] = X[4 * n + e] * ldp(sm + tile + (ir >> 3) * 1024 + u * 16 + (ir & 7) * 2, sc) +
             X[4 * n + 2 + e] * ldp(sm + tile + ((ir >> 3) + 1) * 1024 + u * 16 + (ir & 7) * 2, sc);
    }
    part[8 * g + 2 * q + e] = sum8_scatter(x, g);  // (u = 8 g + 2 q + e)
  }
}
// A transposed accumulator X[i][t] (rows i = ir (+8), columns t = 8 n + 2 q + e) to out[(b, ch 64 + t, h)][i]
// ((B, T, H, 128) contiguous), times scale[t] (or 1); rows t < T only; their maximum flags. 32-bit offsets from one
// base (64-bit addresses of 16 rows, hoisted above the product before the store, were most of the consumers' spill).
__device__ __forceinline__ void store_t(void* out, const Params& p, int64_t b, int64_t h, int ch, const float (&X)[32],
                                        const float* scale, int ir, int q) {
  // (32-bit offsets: the plan requires B T H 128 <= 2^31, Layout::off32)
  float* o = static_cast<float*>(out) + ((((int)b * p.T + ch * 64 + 2 * q) * p.H + (int)h) * 128 + ir);  // row t = 2 q
  int rs = p.H * 128;  // a step's stride; rows 8 n + e < left exist
  const int left = p.T - ch * 64 - 2 * q;
  // (the stride opaque, so that its 16 row offsets are not hoisted above the chunk loop: they spilled)
  asm volatile("" : "+r"(rs));
  asm volatile("" : "+l"(o));  // (one 64-bit base: each row one wide multiply-add; st.global: o is a global address)
  float m = 0.f;
#pragma unroll
  for (int n = 0; n < 8; ++n)
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      if (8 * n + e >= left) continue;
      const float sc = scale ? scale[8 * n + 2 * q + e] : 1.f;
      float* r = o + (8 * n + e) * rs;
      const float x0 = X[4 * n + e] * sc, x1 = X[4 * n + 2 + e] * sc;
      asm volatile("st.global.f32 [%0], %1;\n" ::"l"(r), "f"(x0));
      asm volatile("st.global.f32 [%0+32], %1;\n" ::"l"(r), "f"(x1));
      m = fmax_nan(m, fmax_nan(fabsf(x0), fabsf(x1)));
    }
  flag_if(p, !isfinite(m));
}

// Consumer c (0, 1): G's rows i = 64 c .. 64 c + 63 in registers (m64n128 layout: rows ir (+8), columns 8 n + 2 q
// (+1)), dq^T's and dkt^T's rows i, dgate's M over the contraction's half s = 32 c ..
__device__ __forceinline__ void consumer(const Params& p, unsigned char* sm_in, int c_in, int64_t bh) {
  const int lt_in = threadIdx.x - 128;
  const int64_t b = bh / p.H, h = bh - b * p.H;
  float G[64];
  {  // the last chunk's raw k, v, dy rows (later chunks': issued during the chunk before, as each pair is read)
    const int cl = p.nck - 1;
    issue_raw(p, sm_in, kK, p.k, p.sk, b, h, cl, lt_in);
    issue_raw(p, sm_in, kV, p.v, p.sv, b, h, cl, lt_in);
    issue_raw(p, sm_in, kY, p.dy, p.sdy, b, h, cl, lt_in);
  }
  load_g(G, p, b, h, 64 * c_in + 16 * ((lt_in >> 5) & 3) + ((lt_in & 31) >> 2), lt_in & 3);  // (rows ir, ir + 8)
  put_max(p, sm_in, sG, lt_in >> 5, max_abs(G));  // (G's tile: both consumers' rows, read after (0))
  sync_all();  // (0) the last chunk's tables, Lx and checkpoint exponent
  for (int ch = p.nck - 1; ch >= 0; --ch) {
    // sm, the thread's index and c made opaque each chunk: the loop-invariant descriptors and offsets derived from
    // them, otherwise hoisted above the loop, were spilled (recomputed a chunk instead)
    unsigned char* sm = sm_in;
    asm volatile("" : "+l"(sm));
    int lt = lt_in;
    asm volatile("" : "+r"(lt));
    int c = c_in;
    asm volatile("" : "+r"(c));
    const int wl = (lt >> 5) & 3, lane = lt & 31, g = lane >> 2, q = lane & 3;
    const int ir = 64 * c + 16 * wl + g, slot = 4 * c + wl;  // this thread's state rows ir, ir + 8
    const float* L = ltab(sm, ch);
    float* part = parts(sm, ch);
    // this chunk's tile exponents: q, k, v, dy at the top's split, MQ and MD at (1w), G's from the chunk before's
    // barrier (4) (or (0))
    int eq, ek, ev, ey, emq, emd;
    {  // q's loads first; k, v, dy landed by cp.async during the chunk before (the last chunk's: before the loop)
      float4 vq[4][2];
      load_rows(p.q, p.sq, p, b, h, ch, lt, vq);
      raw_wait<0>();
      consumers_sync();  // (1a) every thread's raw rows landed
      ek = split_in_place(p, sm, kK, lt, sK);
      ev = split_in_place(p, sm, kV, lt, sV);
      put_max(p, sm, sQ, lt >> 5, max_abs(vq));  // (across dy's split's barrier)
      ey = split_in_place(p, sm, kY, lt, sY);
      eq = tile_exp<8>(sm, sQ);
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
      float ee, elx;  // E's and Lx's halves' 2^e, M's scales
      {
        {
          const float d1 = exp2i(ey), d2 = exp2i(ev);
#pragma unroll
          for (int i = 0; i < 16; ++i) X[i] = X[i] * d1 * d2;  // Dd
        }
        float mmd = 0.f, mmq = 0.f;
        put_weights<false>(sm, X, L, c, wl, g, q, 1.f, 1.f, mmd, mmq);
        put_max(p, sm, sMD, lt >> 5, mmd);
        put_max(p, sm, sMQ, lt >> 5, mmq);
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
        put_max(p, sm, sE, lt >> 5, max_abs(Y));
        consumers_sync();  // (1w) MQ's and MD's maxima (both consumers' halves), E's (this consumer's)
        emq = tile_exp<8>(sm, sMQ);
        emd = tile_exp<8>(sm, sMD);
        const int e_e = tile_exp<4>(sm, sE, 4 * c);
        put_weights<true>(sm, X, L, c, wl, g, q, exp2i(-emd), exp2i(-emq), mmd, mmq);
        fence_async_smem();
#pragma unroll
        for (int i = 0; i < 16; ++i) X[i] = Y[i] * exp2i(-e_e);  // E times 2^-e_E, as it is split (exact)
        ee = exp2i(e_e);
        elx = exp2i(tile_exp<2>(sm, lx_slot(ch), 2 * c));  // (WG0's, of this chunk's parity)
      }
      // dgate's term (d), consumer c's half of the contraction: M_c = E[:, s half] Lx[:, s half]^T (RS, 2 k-steps,
      // B = Lx's rows t, K-major), then sum_{u >= t} L[u][t] M_c[u][t] over this warp's rows u (WG0 adds the 8)
      float M[32];
      rs_split<2, 0>(M, sm, kmaj(kLx + 4096 * c, kW, 64), 1.f, [&](int kb, float (&sv)[8]) {
#pragma unroll
        for (int r = 0; r < 8; ++r) sv[r] = X[8 * kb + r];
      }, [](int, float (&)[8]) {});
      if (ch > 0) lx_free_arrive();  // (3) this consumer's reads of Lx are done: WG0 writes chunk ch - 1's
#pragma unroll
      for (int i = 0; i < 32; ++i) M[i] = M[i] * ee * elx;
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        float xs[8];
#pragma unroll
        for (int n = 0; n < 8; ++n) {
          const int t = 8 * n + 2 * q + e, u = 16 * wl + g;
          xs[n] = (u >= t ? L[lp(u, t)] * M[4 * n + e] : 0.f) + (u + 8 >= t ? L[lp(u + 8, t)] * M[4 * n + 2 + e] : 0.f);
        }
        part[1672 + slot * 64 + 8 * g + 2 * q + e] = sum8_scatter(xs, g);  // (t = 8 g + 2 q + e)
      }
    }
    // R^T = S dY^T: S's rows ir, ir + 8 from the checkpoint (fp32, L2: WG0 prefetched them), split a k-step at a
    // time times 2^-e_S (WG0's exponent of the whole checkpoint); c0's part (sum S o G) from the same values,
    // unscaled (a value of S that is not finite makes c0 so: its flag); B = dy K-major
    float c0 = 0.f;
    {
      float R[32];
      const float* S = p.ckpt + (int64_t)((int)bh * p.nck + ch) * kCk32;  // (row index: B H chunks < 2^31, off32)
      const int es = reinterpret_cast<const int*>(sm + kES)[ch & 1];
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
      {
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
      {
        const float s1 = exp2i(ek), s2 = exp2i(emq);
#pragma unroll
        for (int i = 0; i < 32; ++i) R[i] = R[i] * s1 * s2;
      }
      store_t(p.y, p, b, h, ch, R, nullptr, ir, q);  // dq
    }
    {  // Rk^T = G V^T (A = G's registers split a k-step), e's part; dkt^T = Rk^T diag(w) + Q^T MD, dbeta's part
      float Rk[32];
      const int eg = tile_exp<8>(sm, sG);
      rs_split<8, 0>(Rk, sm, kmaj(kV, kTile, 64), exp2i(-eg), [&](int kb, float (&sv)[8]) {
#pragma unroll
        for (int r = 0; r < 8; ++r) sv[r] = G[8 * kb + r];
      }, [](int, float (&)[8]) {});
      {
        const float s1 = exp2i(eg), s2 = exp2i(ev);
#pragma unroll
        for (int i = 0; i < 32; ++i) Rk[i] = Rk[i] * s1 * s2;
      }
      col_dots(sm, Rk, kK, ir, part + 512 + slot * 64, g, q, exp2i(ek));
      consumers_sync();  // (4a) both Rk^Ts have read v's pair: the next chunk's v rows land there
      if (ch > 0) issue_raw(p, sm, kV, p.v, p.sv, b, h, ch - 1, lt);
      {  // diag(w) on columns s (one rounding, as Rk^T w), then Q^T MD's accumulation scale
        const float d1 = exp2i(-eq), d2 = exp2i(-emd);
#pragma unroll
        for (int i = 0; i < 32; ++i) Rk[i] = Rk[i] * L[kWt + 8 * (i >> 2) + 2 * q + (i & 1)] * d1 * d2;
      }
      ss_product<3, 1, 1, 4, false>(Rk, sm, mnmaj(kQ + 8192 * c, kTile, 64), mnmaj(kMD, kW, 64));  // += Q^T MD
      wg_wait<0>();
      acc_fence(Rk);
      {
        const float s1 = exp2i(eq), s2 = exp2i(emd);
#pragma unroll
        for (int i = 0; i < 32; ++i) Rk[i] = Rk[i] * s1 * s2;
      }
      col_dots(sm, Rk, kK, ir, part + 1024 + slot * 64, g, q, exp2i(ek));
      store_t(p.dk, p, b, h, ch, Rk, L + kBeta, ir, q);  // dk = beta dkt
    }
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) c0 += __shfl_xor_sync(0xffffffffu, c0, o);
    if (lane == 0) {
      part[1536 + slot] = c0;
      flag_if(p, !isfinite(c0));
    }
    // dy A[t]'s maximum from dy's pair (stable since (1)), across (4b)
    put_max(p, sm, sYA, lt >> 5, put_dya<false>(sm, L, lt, exp2i(ey), 1.f));
    consumers_sync();  // (4b) both consumers past Q^T MD and dbeta's row dots: MQ, MD and k's pair are free
    if (ch > 0) issue_raw(p, sm, kK, p.k, p.sk, b, h, ch - 1, lt);
    const int eya = tile_exp<8>(sm, sYA);
    put_dya<true>(sm, L, lt, exp2i(ey), exp2i(-eya));
    fence_async_smem();
    consumers_sync();  // (4c) dy A[t]'s pair whole; dy's pair read: the next chunk's dy rows land there
    if (ch > 0) issue_raw(p, sm, kY, p.dy, p.sdy, b, h, ch - 1, lt);
    // G's update in two N = 64 halves, each from zero: U = Q^T diag(A) dY (A = q's pair, MN-major; B = dy A[t]'s
    // pair, MN-major), G = fmaf(A_63, G, U): wgmma's in-place accumulation truncates (perf-notes, thirtieth session);
    // U times 2^e_q and 2^e_ya, one at a time (exact), inside the one rounding
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
    put_max(p, sm, sG, lt >> 5, max_abs(G));  // (the next chunk's Rk^T reads it after (4))
    sync_all();  // (4) the chunk is done: its pairs and weights read, its partials written; WG0's next tables, Lx
  }
}

// WG0: the tables, Lx and the checkpoint's exponent a chunk ahead, the L2 prefetch of the next chunk, dgate and dbeta
// a chunk behind (from the double-buffered partials); the block barriers (0) and (4).
__device__ __forceinline__ void aux(const Params& p, unsigned char* sm, int64_t bh_in) {
  const int64_t b_in = bh_in / p.H, h_in = bh_in - b_in * p.H;
  int64_t bh = bh_in, b = b_in, h = h_in;
  build_tables(p, sm, b, h, p.nck - 1);
  wg0_sync();  // (L by warps 0, 1: build_tables' other threads left early)
  build_lx(p, sm, p.nck - 1);
  ckpt_exp(p, sm, bh, p.nck - 1);
  sync_all();  // (0)
  for (int ch = p.nck - 1; ch >= 0; --ch) {
    // (b, h opaque each chunk: the strided inputs' row and gate addresses, hoisted above the loop, spilled at WG0's
    // 56 registers)
    bh = bh_in, b = b_in, h = h_in;
    asm volatile("" : "+l"(bh), "+l"(b), "+l"(h));
    if (ch + 1 < p.nck) {  // the chunk after's, from its buffers, which the next tables overwrite
      dgate_dbeta(p, sm, b, h, ch + 1);
      wg0_sync();
    }
    if (ch > 0) {
      prefetch_chunk(p, bh, b, h, ch - 1);
      build_tables(p, sm, b, h, ch - 1);
      wg0_sync();
      lx_free_wait();  // (3) both consumers' M products have read Lx
      build_lx(p, sm, ch - 1);
      ckpt_exp(p, sm, bh, ch - 1);  // (its slot's last reader was chunk ch + 1, before the last (4))
    }
    sync_all();  // (4)
  }
  dgate_dbeta(p, sm, b, h, 0);
}

__global__ void __launch_bounds__(384, 1) chunk_bwd_sm90_fp32_kernel(const Params p) {
  roles<kAuxRegs, kConsRegs, aux, consumer>(p);
}
}  // namespace pa
}  // namespace bwd32

// One kernel's launch, one CTA of 384 threads a (b, h): its shared memory opted in once a device, its registers read
// once: the setmaxnreg split assumes 168 a thread, and with another count the consumers' setmaxnreg.inc would wait
// forever (an error instead, cudaErrorInvalidKernelImage with *failed = regs_failed).
template <typename K>
cudaError_t launch_bwd32(K kernel, bool (&done)[64], int& regs, size_t smem, const bwd32::Params& p, cudaStream_t s,
                         const char** failed, const char* regs_failed) {
  if (regs == 0) {
    cudaFuncAttributes fa = {};
    const cudaError_t err = cudaFuncGetAttributes(&fa, kernel);
    if (err != cudaSuccess) return err;
    regs = fa.numRegs;
  }
  if (regs != 168) {
    *failed = regs_failed;
    return cudaErrorInvalidKernelImage;
  }
  const cudaError_t err = allow_smem(kernel, done);
  return err != cudaSuccess ? err : launch_threads(kernel, dim3((unsigned)p.BH), 384, smem, s, false, p);
}
cudaError_t launch_chunk_bwd_sm90_fp32_dq(const bwd32::Params& p, cudaStream_t s, const char** failed) {
  static bool done[64] = {};
  static int regs = 0;
  *failed = "chunk_bwd_sm90_fp32";
  return launch_bwd32(bwd32::pa::chunk_bwd_sm90_fp32_kernel, done, regs, kChunkBwdSm90Fp32Smem, p, s, failed,
                      "chunk_bwd_sm90_fp32: not 168 registers a thread, which its setmaxnreg split assumes");
}
cudaError_t launch_chunk_bwd_sm90_fp32_dv(const bwd32::Params& p, cudaStream_t s, const char** failed) {
  static bool done[64] = {};
  static int regs = 0;
  *failed = "chunk_bwd_sm90_fp32_dv";
  return launch_bwd32(bwd32::pb::chunk_bwd_sm90_fp32_dv_kernel, done, regs, kChunkBwdSm90Fp32DvSmem, p, s, failed,
                      "chunk_bwd_sm90_fp32_dv: not 168 registers a thread, which its setmaxnreg split assumes");
}
// The two launches of a call: dq, dk, dgate, dbeta, then dv, dS_0. No launch without steps or heads; else
// pr.fwd_ckpt: the checkpoints ((B H, chunks, kCk32) float32), pr.nonfinite: the flag the host zeroed (both required).
cudaError_t launch_chunk_bwd_sm90_fp32(const BwdProblem& pr, cudaStream_t s, const char** failed) {
  bwd32::Params p;
  static_cast<BwdProblem&>(p) = pr;
  p.ckpt = static_cast<const float*>(pr.fwd_ckpt);
  p.nck = (pr.T + 63) / 64;
  if (p.nck == 0 || p.BH == 0) return cudaSuccess;
  if (p.ckpt == nullptr || p.nonfinite == nullptr) return cudaErrorInvalidValue;
  const cudaError_t err = launch_chunk_bwd_sm90_fp32_dq(p, s, failed);
  return err != cudaSuccess ? err : launch_chunk_bwd_sm90_fp32_dv(p, s, failed);
}

}  // namespace
}  // namespace gr

// The backward_sm90_fp32 unit's entry point (its Problem is a BwdProblem; float32 only, as planned). `work` is unused.
extern "C" int gr_execute_backward_sm90_fp32(const gr::Plan* pl, const gr::Problem* pr, float* work, cudaStream_t s,
                                             const char** failed) {
  (void)work;
  *failed = "chunk_bwd_sm90_fp32";
  if (pl->kernel != gr::Kernel::chunk_bwd_sm90_fp32 || pl->dtype != gr::DType::f32) return (int)cudaErrorInvalidValue;
  return (int)gr::launch_chunk_bwd_sm90_fp32(static_cast<const gr::BwdProblem&>(*pr), s, failed);
}
""")

HOST_SRC = r"""
// ===================================== host: argument checks, the plan, the launch ==========
// Only the headers it needs (torch/extension.h would triple the host compile time).
#include <torch/csrc/utils/pybind.h>
#include <torch/library.h>
#include <torch/csrc/autograd/python_variable.h>
#include <ATen/core/Tensor.h>
#include <ATen/core/grad_mode.h>
#include <ATen/MemoryOverlap.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/cuda/CUDAFunctions.h>
#include <algorithm>
#include <string>
#include <type_traits>
#include <initializer_list>
#include <utility>
#include <vector>

namespace gr {

constexpr int kMaxDim = 256;
constexpr size_t kRecurrentSmem = 48 * 1024;  // the recurrent kernel stays under the static limit
constexpr int64_t kChunkedMinT = 256;         // use_chunked(): from the crossover sweep (BENCHMARKS.md)
const char* const kKernelNames[] = {"recurrent", "parallel", "chunk_tf32", "chunk_bf16", "chunk_sm90", "decode",
                                    "decode_persistent", "recurrent_bwd", "chunk_bwd", "chunk_bwd_sm90",
                                    "chunk_bwd_sm90_fp32"};
const char* const kSourceNames[] = {"RECURRENT_SRC", "PARALLEL_SRC", "CHUNK_TF32_SRC", "CHUNK_BF16_SRC", "CHUNK_SM90_SRC",
                                    "DECODE_SRC", "DECODE_SRC", "BACKWARD_SRC", "BACKWARD_SRC", "BACKWARD_SM90_SRC",
                                    "BACKWARD_SM90_FP32_SRC"};
const char* const kUnitNames[] = {"core", "chunk_tf32", "chunk_bf16", "reference", "chunk_sm90", "decode", "backward",
                                  "backward_sm90", "backward_sm90_fp32"};
constexpr Unit kUnitOf[] = {Unit::core,       Unit::core,   Unit::chunk_tf32, Unit::chunk_bf16,
                            Unit::chunk_sm90, Unit::decode, Unit::decode,     Unit::backward,
                            Unit::backward,   Unit::backward_sm90, Unit::backward_sm90_fp32};
constexpr int kUnits = 9;
// The unit that runs a plan: its kernel's, except the recurrent kernel's rounding mode (its own unit).
inline int unit_of(const Plan& pl) { return pl.round_ref ? (int)Unit::reference : (int)kUnitOf[(int)pl.kernel]; }
constexpr int64_t kParallelMaxT = 256;  // warp 0's lanes hold at most 8 gates each (PARALLEL_SRC)
// Programmatic dependent launch of segment_scan and the output phase (0 to measure without).
#ifndef GR_PDL
#define GR_PDL 1
#endif
// Programmatic dependent launch of the parallel kernel (0 to measure without).
#ifndef GR_PARALLEL_PDL
#define GR_PARALLEL_PDL 1
#endif

// ---- errors. They are returned, not thrown: the entry points return an undefined tensor (None in
// Python) and last_error() gives "ExceptionName: message" for Python to raise. (On the device's torch
// 2.11 build every failing check crashed the process while messages went through an ostream.)
thread_local std::string g_error;
#define GR_REQUIRE(kind, cond, ...)                          \
  do {                                                       \
    if (!(cond)) {                                           \
      g_error = std::string(kind) + ": " + cat(__VA_ARGS__); \
      return false;                                          \
    }                                                        \
  } while (0)

// Messages are built by string appends only: inserting an integer into a std::ostream from an
// extension crashed the device's torch 2.11 process (std::to_string and appends were fine there).
inline std::string piece(const char* s) { return s; }
inline std::string piece(const std::string& s) { return s; }
template <typename T, typename = std::enable_if_t<std::is_integral_v<T> || std::is_enum_v<T>>>
inline std::string piece(T x) { return std::to_string(static_cast<long long>(x)); }

template <typename... Args>
std::string cat(const Args&... args) {
  std::string s;
  ((s += piece(args)), ...);
  return s;
}

std::string shape_str(at::IntArrayRef sizes) {
  std::string s = "(";
  for (size_t i = 0; i < sizes.size(); ++i) s += (i ? ", " : "") + std::to_string(sizes[i]);
  return s + (sizes.size() == 1 ? ",)" : ")");
}

const char* dtype_str(at::ScalarType st) {
  switch (st) {
    case at::kFloat: return "float32";
    case at::kHalf: return "float16";
    case at::kBFloat16: return "bfloat16";
    case at::kDouble: return "float64";
    case at::kInt: return "int32";
    case at::kLong: return "int64";
    case at::kShort: return "int16";
    case at::kChar: return "int8";
    case at::kByte: return "uint8";
    case at::kBool: return "bool";
    default: return "a non-float dtype";
  }
}
const char* dtype_str(DType dt) { return dt == DType::f32 ? "float32" : dt == DType::f16 ? "float16" : "bfloat16"; }
inline int elem_size(DType dt) { return dt == DType::f32 ? 4 : 2; }

std::string device_str(const at::Tensor& t) {
  return t.is_cuda() ? "cuda:" + std::to_string(t.get_device()) : t.is_cpu() ? std::string("cpu") : std::string("a non-CUDA device");
}

// ---- argument checks
bool check_input(const at::Tensor& t, const char* name, int64_t dims, const char* layout) {
  GR_REQUIRE("TypeError", t.defined(), name, " must be a tensor, got an undefined tensor");
  const auto st = t.scalar_type();
  GR_REQUIRE("TypeError", st == at::kFloat || st == at::kHalf || st == at::kBFloat16, name,
             " must be float32, float16 or bfloat16, got ", dtype_str(st));
  GR_REQUIRE("ValueError", t.dim() == dims, name, " must have ", dims, " dimensions ", layout, ", got shape ",
             shape_str(t.sizes()));
  return true;
}

// Dtypes and shapes first, devices last, so that every shape error is also reachable on a CPU.
bool check_shapes(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& gate,
                  const at::Tensor& beta, bool reference) {
  if (!check_input(q, "q", 4, "(B, T, H, D_k)") || !check_input(k, "k", 4, "(B, T, H, D_k)") ||
      !check_input(v, "v", 4, "(B, T, H, D_v)") || !check_input(gate, "gate", 3, "(B, T, H)") ||
      !check_input(beta, "beta", 3, "(B, T, H)"))
    return false;
  const std::pair<const at::Tensor*, const char*> others[] = {{&k, "k"}, {&v, "v"}};
  for (const auto& o : others)
    GR_REQUIRE("TypeError", o.first->scalar_type() == q.scalar_type(), o.second, " has dtype ",
               dtype_str(o.first->scalar_type()), " but q has ", dtype_str(q.scalar_type()),
               "; q, k and v must share one dtype");
  // gates may stay float32 beside 16-bit q, k, v, as models keep them (arithmetic is fp32 anyway); numerics
  // "reference" reproduces the loop run in ONE dtype (with float32 gates the loop would promote its state,
  // and its result, to float32: "accurate" is the faithful answer there)
  const std::pair<const at::Tensor*, const char*> gates[] = {{&gate, "gate"}, {&beta, "beta"}};
  for (const auto& o : gates) {
    const auto st = o.first->scalar_type();
    GR_REQUIRE("TypeError", st == q.scalar_type() || st == at::kFloat, o.second, " has dtype ", dtype_str(st),
               " but q has ", dtype_str(q.scalar_type()), "; gate and beta must have q's dtype or float32");
    GR_REQUIRE("ValueError", !reference || st == q.scalar_type(), o.second, " is ", dtype_str(st), " but q is ",
               dtype_str(q.scalar_type()),
               ": numerics='reference' rounds like the loop in one dtype; use numerics='accurate' for float32 gates");
  }
  const auto bth = q.sizes().slice(0, 3);
  GR_REQUIRE("ValueError", k.sizes() == q.sizes(), "k must have the shape of q ", shape_str(q.sizes()), ", got ",
             shape_str(k.sizes()));
  GR_REQUIRE("ValueError", v.sizes().slice(0, 3) == bth, "v must be (B, T, H, D_v) with (B, T, H) = ", shape_str(bth),
             " like q, got ", shape_str(v.sizes()));
  GR_REQUIRE("ValueError", gate.sizes() == bth, "gate must be (B, T, H) = ", shape_str(bth), ", got ",
             shape_str(gate.sizes()));
  GR_REQUIRE("ValueError", beta.sizes() == bth, "beta must be (B, T, H) = ", shape_str(bth), ", got ",
             shape_str(beta.sizes()));
  GR_REQUIRE("ValueError", q.size(3) >= 1 && q.size(3) <= kMaxDim, "q and k: D_k must be in 1..", kMaxDim, ", got ",
             q.size(3));
  GR_REQUIRE("ValueError", v.size(3) >= 1 && v.size(3) <= kMaxDim, "v: D_v must be in 1..", kMaxDim, ", got ",
             v.size(3));
  GR_REQUIRE("ValueError", q.size(1) <= INT32_MAX, "q: T must be below 2^31, got ", q.size(1));
  return true;
}

bool check_devices(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& gate,
                   const at::Tensor& beta) {
  const std::pair<const at::Tensor*, const char*> others[] = {{&k, "k"}, {&v, "v"}, {&gate, "gate"}, {&beta, "beta"}};
  GR_REQUIRE("ValueError", q.is_cuda(), "q must be a CUDA tensor, got a tensor on ", device_str(q));
  for (const auto& o : others)
    GR_REQUIRE("ValueError", o.first->device() == q.device(), o.second, " is on ", device_str(*o.first),
               " but q is on ", device_str(q), "; all inputs must be on one CUDA device");
  return true;
}

// The initial state: float32 (B, H, D_k, D_v), or with cu_seqlens (sequences >= 0) one state a sequence.
bool check_state(const at::Tensor& s, const at::Tensor& q, const at::Tensor& v, int64_t sequences = -1) {
  GR_REQUIRE("TypeError", s.scalar_type() == at::kFloat, "initial_state must be float32, got ", dtype_str(s.scalar_type()));
  const int64_t want[4] = {sequences >= 0 ? sequences : q.size(0), q.size(2), q.size(3), v.size(3)};
  GR_REQUIRE("ValueError", s.sizes() == at::IntArrayRef(want, 4), "initial_state must be ",
             sequences >= 0 ? "(N, H, D_k, D_v) = " : "(B, H, D_k, D_v) = ", shape_str(at::IntArrayRef(want, 4)),
             sequences >= 0 ? " with cu_seqlens (N + 1 entries)" : "", ", got ", shape_str(s.sizes()));
  return true;
}

// No two elements at one address: dimensions of size > 1 sorted by stride, each stride at least the span of
// the ones below it (sufficient, and what every slice, transpose or permutation of a dense tensor meets).
bool no_self_overlap(const at::Tensor& t) {
  std::vector<std::pair<int64_t, int64_t>> dims;  // (stride, size)
  for (int64_t d = 0; d < t.dim(); ++d)
    if (t.size(d) > 1) dims.emplace_back(t.stride(d), t.size(d));
  std::sort(dims.begin(), dims.end());
  int64_t span = 1;  // elements a step of the next dimension must clear
  for (const auto& d : dims) {
    if (d.first < span) return false;
    span = d.first * d.second;
  }
  return true;
}

// decode: the pool (P, H, D_k, D_v) float32, written in place; the indices (B,) int32 or int64. Dtypes and
// shapes first (reachable on a CPU), devices after check_devices.
bool check_pool(const at::Tensor& pool, const at::Tensor* idx, const at::Tensor& q, const at::Tensor& v) {
  GR_REQUIRE("TypeError", pool.defined(), "state_pool must be a tensor, got an undefined tensor");
  GR_REQUIRE("TypeError", pool.scalar_type() == at::kFloat, "state_pool must be float32, got ", dtype_str(pool.scalar_type()));
  const int64_t want[3] = {q.size(2), q.size(3), v.size(3)};
  GR_REQUIRE("ValueError", pool.dim() == 4 && pool.sizes().slice(1) == at::IntArrayRef(want, 3),
             "state_pool must be (P, H, D_k, D_v) with (H, D_k, D_v) = ", shape_str(at::IntArrayRef(want, 3)), ", got ",
             shape_str(pool.sizes()));
  GR_REQUIRE("ValueError", idx != nullptr || pool.size(0) == q.size(0), "state_pool has P = ", pool.size(0),
             " slots but q has B = ", q.size(0), " rows; without state_indices row b uses slot b (P must equal B)");
  GR_REQUIRE("ValueError", no_self_overlap(pool),
             "state_pool has elements that share memory (an expanded or overlapping view?); it is written in place");
  if (idx != nullptr) {
    const auto st = idx->scalar_type();
    GR_REQUIRE("TypeError", st == at::kInt || st == at::kLong, "state_indices must be int32 or int64, got ", dtype_str(st));
    GR_REQUIRE("ValueError", idx->dim() == 1 && idx->size(0) == q.size(0), "state_indices must be (B,) = (", q.size(0),
               ",), got ", shape_str(idx->sizes()));
  }
  return true;
}
bool check_pool_devices(const at::Tensor& pool, const at::Tensor* idx, const at::Tensor& q, const at::Tensor& k,
                        const at::Tensor& v, const at::Tensor& gate, const at::Tensor& beta) {
  GR_REQUIRE("ValueError", pool.device() == q.device(), "state_pool is on ", device_str(pool), " but q is on ",
             device_str(q));
  const std::pair<const at::Tensor*, const char*> inputs[] = {{&q, "q"}, {&k, "k"}, {&v, "v"}, {&gate, "gate"},
                                                              {&beta, "beta"}, {idx, "state_indices"}};
  for (const auto& x : inputs) {  // the pool is written while they are read
    if (x.first == nullptr) continue;
    const auto st = at::get_overlap_status(pool, *x.first);
    GR_REQUIRE("ValueError", st != at::MemOverlapStatus::Full && st != at::MemOverlapStatus::Partial,
               "state_pool shares memory with ", x.second, "; the pool is written in place while the inputs are read");
  }
  GR_REQUIRE("ValueError", idx == nullptr || idx->device() == q.device(), "state_indices is on ", device_str(*idx),
             " but q is on ", device_str(q), " (the indices are read on the device: no host copy)");
  return true;
}

// No backward yet: an input that requires grad would silently get none, so it is refused (under
// torch.no_grad() or with detached inputs the call runs).
// `state` is initial_state (gated_recurrence) or state_pool (the decode step), or nullptr.
// kind "NeedAutograd" (the dense pybind calls): not an error, Python reroutes the call through the registered
// operators, which carry the backward; the check is already here, so the no-grad path pays nothing for it.
bool check_no_grad(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& gate,
                   const at::Tensor& beta, const at::Tensor* state, const char* state_name = "initial_state",
                   const char* entry = "gated_recurrence", const char* kind = "NotImplementedError") {
  if (!at::GradMode::is_enabled()) return true;
  const std::pair<const at::Tensor*, const char*> all[] = {{&q, "q"}, {&k, "k"}, {&v, "v"}, {&gate, "gate"},
                                                           {&beta, "beta"}, {state, state_name}};
  for (const auto& a : all)
    GR_REQUIRE(kind, a.first == nullptr || !a.first->requires_grad(), a.second,
               " requires grad, but ", entry, " has no backward yet (forward only): call it under "
               "torch.no_grad() or give it detached tensors");
  return true;
}

// ===================================== plan ==================================================
struct Shape { int64_t B, T, H, Dk, Dv; };
struct Layout {
  bool q, k, v, y;   // rows 16-byte aligned with unit column stride: vector access legal
  bool wide_gates;   // gate or beta float32 beside 16-bit q, k, v (the kernels' run-time gate loads)
  bool steps = true; // q, k and v each move with t (a nonzero step stride: what a TMA map can describe)
  bool gate32 = false;  // the gate float32 (chunk_bwd_sm90 then keeps float32 checkpoints)
  bool off32 = true;    // every element offset of q, k and v below 2^31 (chunk_bwd_sm90_fp32's 32-bit row offsets)
};

// The current device's SM count, opt-in shared memory per block and compute capability (an H200's
// without a device, so that plan() also answers on a machine with no GPU).
struct DeviceLimits {
  int64_t sms;
  size_t smem;
  bool pdl;  // sm_90 or newer
  int arch;  // 10 * major + minor: the chunk kernels' mma.sync needs 80
};
DeviceLimits device_limits() {
  static DeviceLimits cache[64] = {};
  if (c10::cuda::device_count() == 0) return {132, 232448, true, 90};
  const int dev = c10::cuda::current_device();
  if (dev < 64 && cache[dev].sms > 0) return cache[dev];
  int sms = 0, smem = 0, major = 0, minor = 0;
  if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) != cudaSuccess)
    return {132, 49152, false, 75};  // unknown device: what every supported GPU can run
  const DeviceLimits lim{sms, (size_t)smem, major >= 9, 10 * major + minor};
  if (dev < 64) cache[dev] = lim;
  return lim;
}

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
inline int pow2_at_least(int64_t x) { int p = 1; while (p < x) p <<= 1; return p; }

bool check_sizes(const Shape& s) {
  GR_REQUIRE("ValueError", s.B >= 0, "B must be >= 0, got ", s.B);
  GR_REQUIRE("ValueError", s.T >= 0 && s.T <= INT32_MAX, "T must be in 0..2^31-1, got ", s.T);
  GR_REQUIRE("ValueError", s.H >= 0, "H must be >= 0, got ", s.H);
  GR_REQUIRE("ValueError", s.Dk >= 1 && s.Dk <= kMaxDim, "D_k must be in 1..", kMaxDim, ", got ", s.Dk);
  GR_REQUIRE("ValueError", s.Dv >= 1 && s.Dv <= kMaxDim, "D_v must be in 1..", kMaxDim, ", got ", s.Dv);
  return true;
}

// Chunked once the sequence is long enough for the recurrent kernel's per-step latency to dominate,
// or earlier for wide heads in large batches (the recurrent kernel then needs several waves).
bool use_chunked(const Shape& s) { return s.T >= kChunkedMinT || (s.Dk >= 96 && s.T >= 32 && s.B * s.H * s.T >= 8192); }
// Below that, parallel (O(T^2 D) work a head, its row tiles at once) where the GPU is not full and the
// tiles are short (latency-bound: B*H*T up to 8192, B*H*T^2 up to 2^20, T >= 32 or wide heads), or
// where heads are at least as wide as the sequence is long (its work is then no more than the
// recurrent kernel's O(T D^2)); else recurrent. From the crossover grid (dev/parallel_vs_recurrent.py).
bool use_parallel(const Shape& s) {
  const int64_t bht = s.B * s.H * s.T;
  return s.T <= kParallelMaxT &&
         ((bht <= 8192 && bht * s.T <= (int64_t(1) << 20) && (s.T >= 32 || s.Dk >= 96)) || (s.T >= 32 && s.T <= s.Dk));
}

// Recurrent: fewest lanes per column with at most 8 rows a lane, the smallest row count that covers
// D_k, all columns of a head in one block when they fit, as many steps as 48 KB hold; or config.
bool plan_recurrent(const Shape& s, const Layout& lay, const DeviceLimits& lim, const std::vector<int64_t>& config,
                    Plan& pl) {
  if (config.empty()) {
    // up to 8 rows a lane; with the reference rounding (five roundings a row and step) as few rows a lane
    // as 32 lanes allow, so that more warps share the steps (GR_RG_PAIRS_REFERENCE)
    pl.G = pl.round_ref ? (s.Dk <= 32 ? pow2_at_least(s.Dk) : 32) : pow2_at_least((s.Dk + 7) / 8);
    const int rows_needed = (int)ceil_div(s.Dk, pl.G);
    pl.R = rows_needed <= 1 ? 1 : rows_needed <= 2 ? 2 : rows_needed <= 4 ? 4 : rows_needed <= 6 ? 6 : 8;
    const int min_cols = pl.G >= 32 ? 1 : 32 / pl.G;  // whole warps
    const int max_cols = kMaxThreads / pl.G;
    pl.JB = std::min((int)ceil_div(s.Dv, min_cols) * min_cols, max_cols);
    if (pl.round_ref) {
      // each warp's chain of rounded steps sets the time: spread the columns over about one block an SM
      // (fewer columns a block) where B * H leaves SMs idle
      const int64_t want = std::max<int64_t>(1, lim.sms / std::max<int64_t>(1, s.B * s.H));
      pl.JB = (int)std::min<int64_t>(pl.JB, ceil_div(ceil_div(s.Dv, want), min_cols) * min_cols);
    }
    const int64_t tc = (int64_t)(kRecurrentSmem / recurrent_smem(pl.R, pl.G, pl.JB, 1));
    pl.TC = (int)(s.T < tc ? std::max<int64_t>(s.T, 1) : tc);
  } else {
    GR_REQUIRE("ValueError", config.size() == 4, "config must be (R, G, JB, TC) for recurrent, got ", config.size(),
               " values");
    bool compiled = false, compiled_ref = false;
#define GR_IS(R_, G_) compiled = compiled || (config[0] == R_ && config[1] == G_);
#define GR_IS_REF(R_, G_) compiled_ref = compiled_ref || (config[0] == R_ && config[1] == G_);
    GR_RG_PAIRS(GR_IS)
    GR_RG_PAIRS_REFERENCE(GR_IS_REF)
#undef GR_IS
#undef GR_IS_REF
    GR_REQUIRE("ValueError", pl.round_ref ? compiled_ref : compiled, "(R, G) = (", config[0], ", ", config[1],
               ") is not a compiled pair (", pl.round_ref ? "GR_RG_PAIRS_REFERENCE" : "GR_RG_PAIRS", ")");
    pl.R = (int)config[0]; pl.G = (int)config[1];
    GR_REQUIRE("ValueError", pl.R * pl.G >= s.Dk, "R * G must cover D_k, got ", pl.R * pl.G);
    GR_REQUIRE("ValueError", config[2] >= 1 && (pl.G * config[2]) % 32 == 0 && pl.G * config[2] <= kMaxThreads,
               "G * JB must be a multiple of 32 and at most ", kMaxThreads, ", got ", pl.G * config[2]);
    pl.JB = (int)config[2];
    GR_REQUIRE("ValueError", config[3] >= 1 && config[3] <= 65536 &&
                   recurrent_smem(pl.R, pl.G, pl.JB, (int)config[3]) <= kRecurrentSmem,
               "TC=", config[3], " needs more than ", kRecurrentSmem, " bytes of shared memory");
    pl.TC = (int)config[3];
  }
  pl.col_blocks = (int)ceil_div(s.Dv, pl.JB);
  pl.blocks = s.B * s.H * pl.col_blocks;
  GR_REQUIRE("ValueError", pl.blocks <= INT32_MAX, "B * H = ", s.B * s.H, " is too large for one launch");
  pl.smem = recurrent_smem(pl.R, pl.G, pl.JB, pl.TC);
  pl.vec = lay.q && lay.k && lay.v && pl.JB % (16 / elem_size(pl.dtype)) == 0;
  return true;
}

// Segments of a chunk plan: each (b, h) sequence of chunks of `steps` (32 or 64) in `want` segments (at
// most; none empty; seg_chunks counts 32-step chunks, as segment_scan and CHUNK_SRC read it), then pdl, the
// grid (pl.vtiles blocks a segment) and the workspace of segment states and decays.
bool plan_segments(const Shape& s, const DeviceLimits& lim, int64_t want, int steps, Plan& pl) {
  const int64_t chunks = std::max<int64_t>(1, ceil_div(s.T, steps));
  const int64_t per = ceil_div(chunks, std::min(want, chunks));
  pl.seg_chunks = (int)(per * (steps / kChunk));
  pl.nseg = (int)ceil_div(chunks, per);
  pl.pdl = pl.nseg > 1 && GR_PDL && lim.pdl;
  pl.blocks = s.B * s.H * pl.nseg * pl.vtiles;
  GR_REQUIRE("ValueError", pl.blocks <= INT32_MAX, "B * H = ", s.B * s.H, " is too large for one launch");
  pl.work_floats = pl.nseg > 1 ? s.B * s.H * (pl.nseg - 1) * (s.Dk * s.Dv + 1) : 0;
  return true;
}

// Chunk kernels: chunks of 32 steps, column tiles of 32 for narrow states (else 64, or 32 where 64
// does not fit the device's shared memory), and as many segments per (b, h) as fit the output phase
// into every SM slot once (sequence parallelism when B * H is small). Rounded down: one block over the
// slots is a second wave. Or config = (NV, segments).
bool plan_chunked(const Shape& s, const Layout& lay, const DeviceLimits& lim, const std::vector<int64_t>& config,
                  Plan& pl) {
  const char* name = kKernelNames[(int)pl.kernel];
  const bool planned = config.empty();
  GR_REQUIRE("ValueError", planned || config.size() == 2, "config must be (NV, segments) for ", name, ", got ",
             config.size(), " values");
  GR_REQUIRE("ValueError", planned || config[0] == 32 || config[0] == 64, "NV must be 32 or 64, got ", config[0]);
  GR_REQUIRE("ValueError", planned || config[1] >= 1, "segments must be at least 1, got ", config[1]);
  pl.DKP = (int)ceil_div(s.Dk, 16) * 16;
  auto smem_for = [&](int NV) {
    return pl.kernel == Kernel::chunk_bf16 ? chunk_bf16_smem(NV, pl.DKP) : chunk_tf32_smem(NV, pl.DKP);
  };
  pl.NV = !planned ? (int)config[0] : s.Dv <= 32 || smem_for(64) > lim.smem ? 32 : 64;
  pl.smem = smem_for(pl.NV);
  GR_REQUIRE("ValueError", pl.smem <= lim.smem, name, " with NV=", pl.NV, " and D_k=", s.Dk, " needs ", pl.smem,
             " bytes of shared memory a block, over this device's ", lim.smem);
  pl.vec_qk = lay.q && lay.k;
  pl.vec_v = lay.v;
  pl.vec_y = lay.y;
  pl.DK = pl.NV == 64 && pl.vec_qk && pl.vec_v && pl.vec_y && (pl.DKP == 64 || pl.DKP == 128) ? pl.DKP : 0;
  pl.vtiles = (int)ceil_div(s.Dv, pl.NV);
  const int64_t tiles = s.B * s.H * pl.vtiles;
  return plan_segments(s, lim, planned ? std::max<int64_t>(1, lim.sms * 2 / std::max<int64_t>(tiles, 1)) : config[1],
                       kChunk, pl);
}

// chunk_sm90 (wgmma, sm_90a code: compute capability 9.0 exactly) serves bfloat16 with D_k 64 or 128 and
// D_v 128, and float32 (TF32) with D_k = D_v = 128 (not packed), every row 16-byte aligned with unit column
// stride (its TMA maps), where its shared memory fits (plan_sm90 says which condition fails); planned from
// B*H*T = 8192 on: below, with one-chunk segments, chunk_bf16 was faster (0.82-0.93x at B*H*T <= 2048;
// 1.04-1.22x from 8192 on, docs/ab-sm90-2026-12-01-s10.json).
constexpr int64_t kSm90MinWork = 8192;
// Why chunk_sm90 cannot serve this call on this device, or nullptr: the one list of its limits.
const char* sm90_unfit(const Shape& s, DType dt, const Layout& lay, const DeviceLimits& lim, bool varlen) {
  if (lim.arch != 90) return "needs wgmma (compute capability 9.0)";
  if (dt == DType::f32 && !(s.Dk == 128 && s.Dv == 128)) return "serves float32 with D_k = D_v = 128";
  if (dt == DType::f32 && varlen) return "serves no float32 packed sequences (cu_seqlens)";
  if (!((s.Dk == 64 || s.Dk == 128) && s.Dv == 128)) return "serves D_k 64 or 128 with D_v 128";
  if (!(lay.q && lay.k && lay.v && lay.y)) return "needs q, k, v and y rows 16-byte aligned with unit column stride";
  if (!lay.steps) return "needs q, k and v with a nonzero step (t) stride, as its TMA maps describe them";
  if (chunk_sm90_smem((int)s.Dk, dt) > lim.smem) return "needs more shared memory a block than this device has";
  return nullptr;
}
bool use_sm90(const Shape& s, DType dt, const Layout& lay, const DeviceLimits& lim, bool varlen) {
  return dt != DType::f16 && s.B * s.H * s.T >= kSm90MinWork && sm90_unfit(s, dt, lay, lim, varlen) == nullptr;
}

// chunk_sm90: chunks of 64 steps, one block of two warpgroups per (b, h, segment), and as many segments
// per (b, h) as fill every SM once (one block an SM: its registers and shared memory). Segments are whole
// 64-step chunks (seg_chunks counts 32-step chunks, as segment_scan's other users do: it is even here).
// Or config = (segments,).
bool plan_sm90(const Shape& s, const Layout& lay, const DeviceLimits& lim, const std::vector<int64_t>& config,
               Plan& pl) {
  const bool planned = config.empty();
  GR_REQUIRE("ValueError", planned || config.size() == 1, "config must be (segments,) for chunk_sm90, got ",
             config.size(), " values");
  GR_REQUIRE("ValueError", planned || config[0] >= 1, "segments must be at least 1, got ", config[0]);
  const char* why = sm90_unfit(s, pl.dtype, lay, lim, pl.varlen);
  GR_REQUIRE("ValueError", why == nullptr, "chunk_sm90 ", why ? why : "", "; got D_k=", s.Dk, ", D_v=", s.Dv,
             ", compute capability ", lim.arch / 10, ".", lim.arch % 10, ", ", chunk_sm90_smem((int)s.Dk, pl.dtype), " of ",
             lim.smem, " bytes of shared memory a block");
  pl.NV = 128;
  pl.DK = pl.DKP = (int)s.Dk;
  pl.vtiles = 1;
  pl.vec_qk = pl.vec_v = pl.vec_y = true;
  pl.smem = chunk_sm90_smem(pl.DK, pl.dtype);
  const int64_t heads = s.B * s.H;
  return plan_segments(s, lim, planned ? std::max<int64_t>(1, lim.sms / std::max<int64_t>(heads, 1)) : config[0], 64, pl);
}

// Parallel: row tiles of kParallelRows steps; column tiles of at most 64, balanced, multiples of 8
// (halved while the staging does not fit the device's shared memory); the P V sums split over as many
// lanes as keep every thread busy. Or config = (NV,).
bool plan_parallel(const Shape& s, const Layout& lay, const DeviceLimits& lim, const std::vector<int64_t>& config,
                   Plan& pl) {
  const bool planned = config.empty();
  GR_REQUIRE("ValueError", planned || config.size() == 1, "config must be (NV,) for parallel, got ", config.size(),
             " values");
  GR_REQUIRE("ValueError", planned || (config[0] >= 8 && config[0] <= kMaxDim && config[0] % 8 == 0),
             "NV must be a multiple of 8 in 8..", kMaxDim, ", got ", config[0]);
  GR_REQUIRE("ValueError", s.T <= kParallelMaxT, "parallel serves T up to ", kParallelMaxT, ", got ", s.T);
  pl.rtiles = (int)std::max<int64_t>(1, ceil_div(s.T, kParallelRows));
  pl.DKP = (int)ceil_div(s.Dk, 8) * 8;
  const int L = pl.rtiles * kParallelRows, es = elem_size(pl.dtype);
  if (planned) {
    pl.NV = (int)ceil_div(ceil_div(s.Dv, ceil_div(s.Dv, 64)), 8) * 8;
    while (pl.NV > 8 && parallel_smem(pl.NV, pl.DKP, L, es) > lim.smem) pl.NV = (int)ceil_div(pl.NV / 2, 8) * 8;
  } else {
    pl.NV = (int)config[0];
  }
  pl.vec = lay.q && lay.k && lay.v;
  pl.DK = 0;  // a compiled tile: one column tile as wide as the head, D_k = D_v, aligned rows, staged as
              // float (16-bit inputs: where that fits too), gates in the input dtype
#define GR_TILE(D_) \
  if (pl.vec && !lay.wide_gates && s.Dk == D_ && s.Dv == D_ && pl.NV == D_ && parallel_smem(D_, D_, L, 4) <= lim.smem) \
    pl.DK = D_;
  GR_PARALLEL_TILES(GR_TILE)
#undef GR_TILE
  pl.smem = parallel_smem(pl.NV, pl.DKP, L, pl.DK > 0 ? 4 : es);
  GR_REQUIRE("ValueError", pl.smem <= lim.smem, "parallel with NV=", pl.NV, ", D_k=", s.Dk, " and T=", s.T, " needs ",
             pl.smem, " bytes of shared memory a block, over this device's ", lim.smem);
  pl.vtiles = (int)ceil_div(s.Dv, pl.NV);
  pl.sp_log = 0;
  const int combos = kParallelRows * pl.NV / 4;  // (row, group of 4 columns) pairs
  while (pl.sp_log < 5 && (combos << (pl.sp_log + 1)) <= kMaxThreads) ++pl.sp_log;
  // behind any kernel: it touches no memory before griddepcontrol.wait
  pl.pdl = GR_PARALLEL_PDL && lim.pdl;
  pl.blocks = s.B * s.H * pl.rtiles * pl.vtiles;
  GR_REQUIRE("ValueError", pl.blocks <= INT32_MAX, "B * H = ", s.B * s.H, " is too large for one launch");
  return true;
}

// The one place a launch is decided. kernel: "" (planned), "recurrent", "parallel", "chunked" (the
// planned chunk kernel for the dtype), "chunk_tf32", "chunk_bf16" or "chunk_sm90"; config: empty (planned) or the
// kernel's own. Planned: the chunk kernels for long sequences (use_chunked), else parallel where it
// wins (use_parallel) and its staging fits the device's shared memory, else recurrent. bfloat16 chunks
// run chunk_sm90 where use_sm90 allows (Hopper), else chunk_bf16; float32 chunk_sm90 where it allows, else
// chunk_tf32; float16 chunk_tf32.
// reference: numerics "reference" (the PyTorch loop's rounding, one step at a time), which only the
// recurrent kernel has.
// varlen (cu_seqlens; s.B = sequences, s.T = the longest, or its hint): the recurrent and the chunk
// kernels (segments of a fixed size, s.T's, capacity nseg: each sequence takes what it needs); parallel
// (shared memory sized by T) does not.
// decode: a block a (row, head, NV state columns), R = 32-row passes a thread (D_k rounded up to 32, 64,
// 128, 256); 16-byte pool accesses when the pool's rows allow them. NV = 128 (whole rows, twice the state in
// flight an SM) once there are two such blocks an SM, else 32 (four times the blocks, for few rows). There,
// with a 16-byte pool, D_k <= 128 and room for its ring, decode_persistent instead: one block an SM (at most
// one an item) walking the items with the next state in flight. nv > 0 forces a tile of decode_kernel,
// persistent 0 / 1 forbids / forces decode_persistent (-1: planned; tests, benchmarks). No workspace and
// nothing read back: nothing to allocate or synchronize (CUDA-graph capturable).
bool plan_decode(const Shape& s, DType dt, bool pool_vec, bool rows_unit, const DeviceLimits& lim, int64_t nv,
                 int64_t persistent, Plan& pl) {
  if (!check_sizes(s)) return false;
  GR_REQUIRE("ValueError", nv == 0 || nv == 32 || nv == 128, "decode: NV must be 32 or 128 (0: planned), got ", nv);
  GR_REQUIRE("ValueError", persistent >= -1 && persistent <= 1, "decode: persistent must be -1 (planned), 0 or 1, got ",
             persistent);
  pl = Plan{};
  pl.dtype = dt;
  const int64_t wide_items = s.B * s.H * ceil_div(s.Dv, 128);
  const bool wide = s.Dk <= 128 && s.Dv > 64 && wide_items >= 2 * lim.sms;
  const bool ring_fits = pool_vec && s.Dk <= 128 && lim.arch >= 80 &&
                         lim.smem >= (size_t)kDecodeRingSmem + (size_t)kDecodeStaticSmem;
  GR_REQUIRE("ValueError", persistent != 1 || nv == 0, "decode: persistent = 1 has its own tile (NV = 128), got NV = ", nv);
  GR_REQUIRE("ValueError", persistent != 1 || ring_fits, "decode: decode_persistent needs ",
             s.Dk > 128 ? cat("D_k <= 128, got ", s.Dk)
             : !pool_vec ? std::string("16-byte aligned pool rows with unit column stride (D_v % 4 == 0)")
                         : cat("sm_80 or newer with ", kDecodeRingSmem + kDecodeStaticSmem,
                               " bytes of shared memory a block, got sm_", lim.arch, " with ", lim.smem));
  if (persistent == 1 || (persistent == -1 && nv == 0 && wide && ring_fits)) {
    pl.kernel = Kernel::decode_persistent;
    pl.NV = kRingD;
    pl.vtiles = (int)ceil_div(s.Dv, kRingD);
    pl.R = 4;
    pl.blocks = std::min<int64_t>(wide_items, lim.sms);
    pl.smem = kDecodeRingSmem;
  } else {
    pl.kernel = Kernel::decode;
    pl.NV = nv > 0 ? (int)nv : wide ? 128 : 32;
    GR_REQUIRE("ValueError", pl.NV == 32 || s.Dk <= 128, "decode: NV = 128 serves D_k up to 128, got ", s.Dk);
    pl.vtiles = (int)ceil_div(s.Dv, pl.NV);
    pl.R = pow2_at_least(ceil_div(s.Dk, 32));
    pl.blocks = s.B * s.H * pl.vtiles;
    GR_REQUIRE("ValueError", pl.blocks <= INT32_MAX, "decode: B * H * ceil(D_v / NV) must be below 2^31, got ", pl.blocks);
    pl.full = pl.NV == 32 && pool_vec && rows_unit && s.Dk == 32 * pl.R && s.Dv % 32 == 0;
  }
  pl.DKP = (int)s.Dk;
  pl.vec = pool_vec;
  pl.pdl = lim.pdl;
  return true;
}

bool make_plan(const Shape& s, DType dt, const Layout& lay, const DeviceLimits& lim, const std::string& kernel,
               const std::vector<int64_t>& config, bool reference, Plan& pl, bool varlen = false) {
  pl = Plan{};
  pl.dtype = dt;
  pl.varlen = varlen;
  const Kernel chunked = use_sm90(s, dt, lay, lim, varlen) ? Kernel::chunk_sm90
                        : dt == DType::bf16                 ? Kernel::chunk_bf16
                                                            : Kernel::chunk_tf32;
  if (reference) {
    GR_REQUIRE("ValueError", kernel.empty() || kernel == "recurrent", "numerics='reference' runs the recurrent "
               "kernel only (it rounds one step at a time), got kernel '", kernel, "'");
    GR_REQUIRE("ValueError", config.empty() || !kernel.empty(), "config needs an explicit kernel");
    pl.kernel = Kernel::recurrent;
    pl.round_ref = true;
    return plan_recurrent(s, lay, lim, config, pl);
  }
  if (kernel.empty()) {
    GR_REQUIRE("ValueError", config.empty(), "config needs an explicit kernel");
    // below sm_80 (no mma.sync for TF32 or bf16) long sequences take the recurrent kernel
    pl.kernel = use_chunked(s) && lim.arch >= 80   ? chunked
                : !varlen && use_parallel(s)         ? Kernel::parallel
                                                     : Kernel::recurrent;
  } else if (kernel == "recurrent" || kernel == "chunked" || kernel == "parallel") {
    pl.kernel = kernel == "chunked" ? chunked : kernel == "parallel" ? Kernel::parallel : Kernel::recurrent;
  } else if (kernel == "chunk_tf32") {
    GR_REQUIRE("TypeError", dt != DType::bf16, "chunk_tf32 takes float32 or float16 inputs, got bfloat16");
    pl.kernel = Kernel::chunk_tf32;
  } else if (kernel == "chunk_sm90") {
    GR_REQUIRE("TypeError", dt != DType::f16, "chunk_sm90 takes bfloat16 or float32 inputs, got ", dtype_str(dt));
    pl.kernel = Kernel::chunk_sm90;
  } else {
    GR_REQUIRE("ValueError", kernel == "chunk_bf16", "kernel must be one of recurrent, parallel, chunked, "
               "chunk_tf32, chunk_bf16, chunk_sm90 or None, got '", kernel, "'");
    GR_REQUIRE("TypeError", dt == DType::bf16, "chunk_bf16 takes bfloat16 inputs, got ", dtype_str(dt));
    pl.kernel = Kernel::chunk_bf16;
  }
  GR_REQUIRE("ValueError", lim.arch >= 80 || pl.kernel == Kernel::recurrent || pl.kernel == Kernel::parallel ||
                               pl.kernel == Kernel::chunk_sm90,  // plan_sm90 names its own (9.0)
             kKernelNames[(int)pl.kernel], " needs mma.sync of compute capability 8.0 or newer; this device is ",
             lim.arch / 10, ".", lim.arch % 10);
  if (pl.kernel != Kernel::recurrent) {
    if (pl.kernel == Kernel::parallel     ? plan_parallel(s, lay, lim, config, pl)
        : pl.kernel == Kernel::chunk_sm90 ? plan_sm90(s, lay, lim, config, pl)
                                          : plan_chunked(s, lay, lim, config, pl))
      return true;
    if (!kernel.empty()) return false;  // an explicit request: its error stands
    g_error.clear();  // the planned kernel does not fit this device: the recurrent kernel serves
    pl = Plan{};
    pl.dtype = dt;
    pl.varlen = varlen;
    pl.kernel = Kernel::recurrent;
  }
  return plan_recurrent(s, lay, lim, config, pl);
}

}  // namespace gr
"""

HOST_RUN_SRC = r"""
// ===================================== host: describe, execute, entry points ================
namespace gr {

std::string describe(const Plan& pl) {
  const int k = (int)pl.kernel;
  const bool tf32_sm90 = pl.kernel == Kernel::chunk_sm90 && pl.dtype == DType::f32;
  std::string s = cat(kKernelNames[k], " (", tf32_sm90 ? "CHUNK_SM90_TF32_SRC" : kSourceNames[k], ", unit ",
                      kUnitNames[unit_of(pl)], ") ");
  if (pl.kernel == Kernel::recurrent)
    s += cat("R=", pl.R, " G=", pl.G, " JB=", pl.JB, " TC=", pl.TC, pl.vec ? " loads=16B" : " loads=scalar",
             pl.round_ref ? " numerics=reference" : "");
  else if (pl.kernel == Kernel::parallel)
    s += cat("row_tiles=", pl.rtiles, " NV=", pl.NV, " D_k=", pl.DKP, pl.DK > 0 ? " compiled" : " run-time",
             " split=", 1 << pl.sp_log, pl.vec ? " loads=16B" : " loads=scalar", pl.pdl ? " pdl=on" : " pdl=off");
  else if (pl.kernel == Kernel::decode)
    s += cat("NV=", pl.NV, " D_k=", pl.DKP, " row_passes=", pl.R, pl.vec ? " pool=16B" : " pool=scalar",
             pl.full ? " rows=full" : "", pl.pdl ? " pdl=on" : " pdl=off");
  else if (pl.kernel == Kernel::decode_persistent)
    s += cat("NV=", pl.NV, " D_k=", pl.DKP, " blocks=min(items, SMs) ring=2x", kRingD * kRingD * 4, "B cp.async",
             pl.pdl ? " pdl=on" : " pdl=off");
  else if (pl.kernel == Kernel::chunk_bwd)
    s += cat("C=", (int)kBwdChunk, " products=3xTF32 mma.sync (16-bit inputs: 2 terms), one block a (b, h, segment)"
             " segments=", pl.nseg, " of ", pl.seg_chunks, " chunks", pl.nseg > 1 ? " + chunk_bwd_prep + chunk_bwd_scan" : "",
             ", S and its gradient in shared memory, the state at every chunk start in the workspace=",
             pl.work_floats * 4, "B");
  else if (pl.kernel == Kernel::chunk_bwd_sm90)
    s += cat("C=64 products=bf16 wgmma (fp32 operands as hi + lo), one block a (b, h), a checkpoint launch first:"
             " the state at every chunk start in the workspace=", pl.work_floats * 4, "B (", pl.ck16 ? "fp16 scaled" : "fp32",
             ")");
  else if (pl.kernel == Kernel::chunk_bwd_sm90_fp32)
    s += cat("C=64 products=fp16 wgmma (fp32 operands as hi + lo, one power-of-two scale a tile; dv: a step), one block"
             " a (b, h), two launches: chunk_bwd_sm90_fp32 (dq, dk, dgate, dbeta, smem=", (int)kChunkBwdSm90Fp32Smem,
             ") then chunk_bwd_sm90_fp32_dv (dv, dS_0, smem=", (int)kChunkBwdSm90Fp32DvSmem, "), the state at every chunk "
             "start (float32 rows of ", (int)kCk32 * 4, "B) from the forward");
  else if (pl.kernel == Kernel::recurrent_bwd)
    s += cat("rows_a_thread=", pl.R, " column_tiles=", pl.vtiles, " (in order, one block a (b, h)) checkpoints=",
             (int)kBwdCheckpoint, " steps, recomputed runs of ", pl.TC, " workspace=", pl.work_floats * 4, "B");
  else if (pl.kernel == Kernel::chunk_sm90)
    s += cat("C=64 D_k=", pl.DK, " compiled D_v=128", tf32_sm90 ? " operands=3xTF32" : "", " segments=", pl.nseg,
             pl.nseg > 1 ? cat(" + segment_scan", pl.pdl ? " pdl=on" : " pdl=off") : "", " loads=TMA",
             pl.work_floats > 0 ? cat(" workspace=", pl.work_floats * 4, "B") : "");
  else
    s += cat("C=", kChunk, " NV=", pl.NV, " D_k=", pl.DK > 0 ? cat(pl.DK, " compiled") : cat(pl.DKP, " run-time"),
             " segments=", pl.nseg, pl.nseg > 1 ? cat(" + segment_scan", pl.pdl ? " pdl=on" : " pdl=off") : "",
             " loads=", pl.vec_qk && pl.vec_v && pl.vec_y ? "16B" : pl.vec_qk || pl.vec_v || pl.vec_y ? "mixed" : "scalar",
             pl.work_floats > 0 ? cat(" workspace=", pl.work_floats * 4, "B") : "");
  if (pl.varlen)
    s += pl.kernel == Kernel::recurrent ? " varlen" : " varlen (segments: a capacity; a sequence takes what it needs)";
  return s + cat(" grid=", pl.blocks, "x", pl.kernel == Kernel::chunk_sm90 || pl.kernel == Kernel::chunk_bwd_sm90 ||
                                                  pl.kernel == Kernel::chunk_bwd_sm90_fp32
                                              ? (int)kSm90Threads
                                          : pl.kernel == Kernel::chunk_bwd ? (int)kBwdThreads : (int)kMaxThreads,
                 " smem=", (int64_t)pl.smem);
}

inline Strides4 strides4(const at::Tensor& t) { return {t.stride(0), t.stride(1), t.stride(2), t.stride(3)}; }
inline Strides3 strides3(const at::Tensor& t) { return {t.stride(0), t.stride(1), t.stride(2)}; }
inline StateStrides state_strides(const at::Tensor* t) {
  return t ? StateStrides{t->stride(0), t->stride(1), t->stride(2), t->stride(3)} : StateStrides{0, 0, 0, 0};
}
inline DType dtype_of(const at::Tensor& t) {
  return t.scalar_type() == at::kFloat ? DType::f32 : t.scalar_type() == at::kHalf ? DType::f16 : DType::bf16;
}
inline Shape shape_of(const at::Tensor& q, const at::Tensor& v) {
  return {q.size(0), q.size(1), q.size(2), q.size(3), v.size(3)};
}
// 16-byte accesses are legal when every row starts on a 16-byte boundary (unit column stride).
inline bool rows_aligned(const at::Tensor& t) {
  const int64_t V = 16 / t.element_size();
  return t.stride(3) == 1 && reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0 && t.stride(0) % V == 0 &&
         t.stride(1) % V == 0 && t.stride(2) % V == 0 && t.size(3) % V == 0;
}
// y is ours: contiguous and allocator-aligned, so its rows are aligned when D_v is a multiple of V.
// The largest element offset of x (sizes times strides) below 2^31
inline bool offsets32(const at::Tensor& x) {
  int64_t m = 0;
  for (int64_t d = 0; d < x.dim(); ++d) m += std::max<int64_t>(x.size(d) - 1, 0) * x.stride(d);
  return m < ((int64_t)1 << 31);
}
inline Layout layout_of(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& gate,
                        const at::Tensor& beta) {
  return {rows_aligned(q), rows_aligned(k), rows_aligned(v), v.size(3) % (16 / v.element_size()) == 0,
          gate.scalar_type() != q.scalar_type() || beta.scalar_type() != q.scalar_type(),
          q.stride(1) != 0 && k.stride(1) != 0 && v.stride(1) != 0, gate.scalar_type() == at::kFloat,
          offsets32(q) && offsets32(k) && offsets32(v)};
}

Problem problem_of(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& gate,
                   const at::Tensor& beta, at::Tensor& y, const at::Tensor* s_in, at::Tensor* s_out) {
  Problem pr;
  pr.q = q.data_ptr(); pr.k = k.data_ptr(); pr.v = v.data_ptr();
  pr.gate = gate.data_ptr(); pr.beta = beta.data_ptr(); pr.y = y.data_ptr();
  pr.sq = strides4(q); pr.sk = strides4(k); pr.sv = strides4(v); pr.sy = strides4(y);
  pr.sg = strides3(gate); pr.sb = strides3(beta);
  pr.T = (int)q.size(1); pr.H = (int)q.size(2); pr.Dk = (int)q.size(3); pr.Dv = (int)v.size(3);
  pr.BH = q.size(0) * q.size(2);
  pr.g32 = gate.scalar_type() == at::kFloat; pr.b32 = beta.scalar_type() == at::kFloat;
  pr.s_in = s_in ? s_in->data_ptr<float>() : nullptr; pr.ssi = state_strides(s_in);
  pr.s_out = s_out ? s_out->data_ptr<float>() : nullptr; pr.sso = state_strides(s_out);
  return pr;
}

// Each unit's entry point, by Unit: the core's own; a chunk unit's once Python has built it and called
// attach() with its address.
namespace {
ExecuteFn g_execute[kUnits] = {gr_execute_core};
}  // namespace

// A plan whose unit is not loaded yet: Python builds it, attaches it and calls again.
bool unit_ready(const Plan& pl) {
  const int u = unit_of(pl);
  GR_REQUIRE("NeedUnit", g_execute[u] != nullptr, kUnitNames[u]);
  return true;
}

// Runs the plan on the current stream (a workspace for segment states when it has segments; the
// caching allocator reuses it only after this stream's work).
// work_in: a workspace of at least pl.work_floats floats that the caller holds (or nullptr: one is allocated).
bool execute(const Plan& pl, const Problem& pr, const at::Tensor& like, float* work_in = nullptr) {
  at::Tensor work;
  if (pl.work_floats > 0 && work_in == nullptr) work = at::empty({pl.work_floats}, like.options().dtype(at::kFloat));
  const char* failed = "";
  const int err = g_execute[unit_of(pl)](&pl, &pr, work.defined() ? work.data_ptr<float>() : work_in,
                                            c10::cuda::getCurrentCUDAStream(), &failed);
  GR_REQUIRE("RuntimeError", err == 0, kKernelNames[(int)pl.kernel], " (", failed, ") launch failed: ",
             cudaGetErrorString((cudaError_t)err));
  return true;
}

const std::string kPlanned;
const std::vector<int64_t> kNoConfig;

// The final states (B or N sequences): what the kernels write, or with no steps at all the initial ones
// (a copy) or zeros, with no launch.
at::Tensor final_states(int64_t B, int64_t T, const at::Tensor& q, const at::Tensor& v, const at::Tensor* s_in) {
  if (T > 0) return at::empty({B, q.size(2), q.size(3), v.size(3)}, q.options().dtype(at::kFloat));
  return s_in ? s_in->clone(at::MemoryFormat::Contiguous)
              : at::zeros({B, q.size(2), q.size(3), v.size(3)}, q.options().dtype(at::kFloat));
}

// The hot path: checks, the plan, one output allocation, the plan's launches.
at::Tensor run(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& gate,
               const at::Tensor& beta, bool reference) {
  if (!check_shapes(q, k, v, gate, beta, reference) ||
      !check_no_grad(q, k, v, gate, beta, nullptr, "initial_state", "gated_recurrence", "NeedAutograd") ||
      !check_devices(q, k, v, gate, beta))
    return at::Tensor();
  const c10::cuda::CUDAGuard guard(q.device());
  Plan pl;
  if (!make_plan(shape_of(q, v), dtype_of(q), layout_of(q, k, v, gate, beta), device_limits(), kPlanned, kNoConfig, reference, pl) ||
      !unit_ready(pl))
    return at::Tensor();
  at::Tensor y = at::empty({q.size(0), q.size(1), q.size(2), v.size(3)}, q.options());
  if (y.numel() == 0) return y;
  return execute(pl, problem_of(q, k, v, gate, beta, y, nullptr, nullptr), q) ? y : at::Tensor();
}

bool forward_checkpoints(const Plan* fwd, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                         const at::Tensor& gate, const at::Tensor& beta, const at::Tensor& dy,
                         bool* ck16);  // (below make_plan_backward)

// With states, or a chosen kernel and configuration (tests and benchmarks). Returns [y] or
// [y, final_state] in out; false when an argument was refused (see last_error). want_ckpt (the eager autograd
// forward): chunk_bwd_sm90's checkpoints too, last, where this planned forward writes them (forward_checkpoints;
// bfloat16 or float32 as the backward reads them), else an empty tensor; the backward then skips its checkpoint
// kernel.
bool run_ex(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& gate,
            const at::Tensor& beta, const c10::optional<at::Tensor>& initial_state, bool want_final,
            const std::string& kernel, const std::vector<int64_t>& config, bool reference, std::vector<at::Tensor>& out,
            bool want_ckpt = false) {
  if (!check_shapes(q, k, v, gate, beta, reference)) return false;
  c10::cuda::OptionalCUDAGuard guard;  // q's device before anything reads device limits
  if (q.is_cuda()) guard.set_device(q.device());
  const at::Tensor* s_in = initial_state.has_value() && initial_state->defined() ? &*initial_state : nullptr;
  if ((s_in && !check_state(*s_in, q, v)) ||
      !check_no_grad(q, k, v, gate, beta, s_in, "initial_state", "gated_recurrence", "NeedAutograd"))
    return false;
  Plan pl;
  if (!make_plan(shape_of(q, v), dtype_of(q), layout_of(q, k, v, gate, beta), device_limits(), kernel, config, reference, pl) ||
      !check_devices(q, k, v, gate, beta))
    return false;
  GR_REQUIRE("ValueError", !s_in || s_in->device() == q.device(), "initial_state is on ", device_str(*s_in),
             " but q is on ", device_str(q));
  if (!unit_ready(pl)) return false;
  const int64_t B = q.size(0), T = q.size(1), H = q.size(2), Dk = q.size(3), Dv = v.size(3);
  at::Tensor y = at::empty({B, T, H, Dv}, q.options());
  at::Tensor fin = want_final ? final_states(B, T, q, v, s_in) : at::Tensor();
  Problem pr = problem_of(q, k, v, gate, beta, y, s_in, want_final ? &fin : nullptr);
  at::Tensor ck;
  if (want_ckpt) {  // (a chosen kernel or configuration writes none: the backward's side of the rule plans the forward)
    bool ck16 = false;
    const bool write = y.numel() > 0 && kernel.empty() && config.empty() && !reference &&
                       forward_checkpoints(&pl, q, k, v, gate, beta, y, &ck16);
    ck = write && pl.dtype == DType::f32 ? at::empty({B * H, ceil_div(T, 64), kCk32}, q.options().dtype(at::kFloat))
       : write && ck16 ? at::empty({B * H, ceil_div(T, 64), kCk16}, q.options().dtype(at::kHalf))
       : write ? at::empty({B * H, ceil_div(T, 64), Dk, Dv}, q.options().dtype(at::kFloat))
               : at::empty({0}, q.options().dtype(at::kFloat));
    pr.fwd_ckpt = write ? ck.data_ptr() : nullptr;
    pr.fwd_ck16 = ck16;
  }
  if (y.numel() > 0 && !execute(pl, pr, q)) return false;
  out.push_back(y);
  if (want_final) out.push_back(fin);
  if (want_ckpt) out.push_back(ck);
  return true;
}

// ---- the backward (autograd): dq_t = S_t dy_t is the forward's y with (q, k, v) -> (dy, v, k) and S_0^T
// (S^T runs S^T_t = g_t S^T_{t-1} + beta_t v_t k_t^T), so `dq` is the forward plan of that problem (any
// kernel, the fastest that fits); `bwd`, recurrent_bwd, computes the rest (BACKWARD_SRC).
// chunk_bwd computes dq itself (dq_pass false) where it fits: D_k, D_v <= 128 and its shared memory (Hopper's
// and newer opt-in); recurrent_bwd elsewhere. chunk_bwd_sm90 (dq itself too) on compute capability 9.0 for
// bfloat16 with D_k = D_v = 128 and q, k, v, dy rows aligned (lay_fwd: layout_of(q, k, v, gate, beta); lay_dq has
// dy's, v's and k's), where B H is at least half the SMs (it has no segments: smaller B H keep chunk_bwd's).
// chunk_bwd_sm90_fp32 likewise for float32, where chunk_sm90's TF32 forward can also serve (q, k, v rows aligned,
// nonzero step strides): `dq` is then that forward's plan, which writes the backward's checkpoints where the
// forward did not (dq_pass false: dq is chunk_bwd_sm90_fp32's). kernel: "" (planned), "chunk_bwd",
// "chunk_bwd_sm90", "chunk_bwd_sm90_fp32" or "recurrent_bwd" (tests).
bool make_plan_backward(const Shape& s, DType dt, const Layout& lay_dq, const Layout& lay_fwd, const DeviceLimits& lim,
                        const std::string& kernel, int64_t segments, Plan& dq, Plan& bwd, bool& dq_pass) {
  GR_REQUIRE("ValueError", segments >= 0, "segments must be 0 (planned) or a count, got ", segments);
  GR_REQUIRE("ValueError", segments == 0 || kernel == "chunk_bwd", "segments apply to kernel chunk_bwd, got kernel '",
             kernel, "'");
  GR_REQUIRE("ValueError", kernel.empty() || kernel == "chunk_bwd" || kernel == "chunk_bwd_sm90" ||
                               kernel == "chunk_bwd_sm90_fp32" || kernel == "recurrent_bwd",
             "the backward's kernel must be chunk_bwd, chunk_bwd_sm90, chunk_bwd_sm90_fp32, recurrent_bwd or planned, got '",
             kernel, "'");
  const bool fits = s.Dk <= 128 && s.Dv <= 128 && (size_t)kChunkBwdSmem <= lim.smem;
  GR_REQUIRE("ValueError", kernel != "chunk_bwd" || fits, "chunk_bwd needs D_k, D_v <= 128 and ", kChunkBwdSmem,
             " bytes of shared memory a block, got D_k = ", s.Dk, ", D_v = ", s.Dv, " and ", lim.smem);
  bwd = Plan{};
  bwd.dtype = dt;
  bwd.blocks = s.B * s.H;
  GR_REQUIRE("ValueError", bwd.blocks <= INT32_MAX, "B * H must be below 2^31 for the backward, got ", bwd.blocks);
  const bool sm90 = lim.arch == 90 && dt == DType::bf16 && s.Dk == 128 && s.Dv == 128 && lay_fwd.q && lay_dq.q &&
                    lay_dq.k && lay_dq.v && (size_t)kChunkBwdSm90Smem <= lim.smem;
  GR_REQUIRE("ValueError", kernel != "chunk_bwd_sm90" || sm90, "chunk_bwd_sm90 needs compute capability 9.0, "
             "bfloat16, D_k = D_v = 128 and the rows of q, k, v and dy 16-byte aligned with unit column stride; got ",
             "compute capability ", lim.arch / 10, ".", lim.arch % 10, ", ", dtype_str(dt), ", D_k = ", s.Dk, ", D_v = ", s.Dv,
             lay_fwd.q && lay_dq.q && lay_dq.k && lay_dq.v ? ", aligned rows" : ", a row not 16-byte aligned");
  // float32: the checkpoints' forward (chunk_sm90's TF32 block, one segment, y into dq's memory) must fit too
  Layout lay_ck = lay_fwd;
  lay_ck.y = true;
  const char* unfit = sm90_unfit(s, DType::f32, lay_ck, lim, false);
  // (32-bit offsets in its loops: q, k, v, dy as laid out, and the gradients it writes, dense)
  const bool off32 = lay_dq.off32 && lay_fwd.off32 && (double)s.B * s.T * s.H * std::max(s.Dk, s.Dv) <= 2147483648.0;
  const bool sm90_fp32 = dt == DType::f32 && unfit == nullptr && lay_dq.q && off32 &&
                         (size_t)std::max<int>(kChunkBwdSm90Fp32Smem, kChunkBwdSm90Fp32DvSmem) <= lim.smem;
  GR_REQUIRE("ValueError", kernel != "chunk_bwd_sm90_fp32" || sm90_fp32, "chunk_bwd_sm90_fp32 needs float32, dy's "
             "rows 16-byte aligned with unit column stride, every element offset of q, k, v, dy and the gradients "
             "below 2^31, ",
             std::max<int>(kChunkBwdSm90Fp32Smem, kChunkBwdSm90Fp32DvSmem),
             " bytes of shared memory a block, and chunk_sm90's float32 forward for its checkpoints, which ",
             unfit ? unfit : "fits", "; got ", dtype_str(dt), ", D_k = ", s.Dk, ", D_v = ", s.Dv, ", compute capability ",
             lim.arch / 10, ".", lim.arch % 10, lay_dq.q ? ", dy's rows aligned" : ", dy's rows not aligned",
             off32 ? ", offsets below 2^31" : ", an offset at or above 2^31", ", ", lim.smem,
             " bytes");
  // the Hopper kernels have no segments: planned where B H is at least half the SMs (smaller B H keep chunk_bwd's)
  const bool fp32_90 = kernel == "chunk_bwd_sm90_fp32" || (kernel.empty() && sm90_fp32 && 2 * bwd.blocks >= lim.sms);
  if (fp32_90 || kernel == "chunk_bwd_sm90" || (kernel.empty() && sm90 && 2 * bwd.blocks >= lim.sms)) {
    dq_pass = false;
    bwd.kernel = fp32_90 ? Kernel::chunk_bwd_sm90_fp32 : Kernel::chunk_bwd_sm90;
    bwd.smem = fp32_90 ? (size_t)kChunkBwdSm90Fp32Smem : (size_t)kChunkBwdSm90Smem;
    bwd.nseg = 1;
    bwd.seg_chunks = (int)ceil_div(s.T, 64);
    if (fp32_90) {  // the checkpoints: the forward's, or run_backward's own buffer written by this forward plan
      bwd.work_floats = 0;
      const std::vector<int64_t> one{1};
      return make_plan(s, DType::f32, lay_ck, lim, "chunk_sm90", one, false, dq);
    }
    // 16-bit checkpoints (kCk16: fp16 scaled, 2^-12) where the gate is bf16: dgate then has a bf16 tolerance
    // (bf16's 2^-9 was not below it: c0 = <G, S> cancels under long memory); float32 gates keep float32
    // checkpoints (their dgate is held to 1e-5)
    bwd.ck16 = !lay_dq.gate32;
    bwd.work_floats = bwd.blocks * ceil_div(s.T, 64) * (bwd.ck16 ? kCk16 / 2 : s.Dk * s.Dv);  // the checkpoints
    return true;
  }
  if (fits && kernel != "recurrent_bwd") {
    dq_pass = false;
    bwd.kernel = Kernel::chunk_bwd;
    bwd.smem = kChunkBwdSmem;
    // Segments (sequence parallelism): as many as fill every SM once with one block a (b, h, segment), down to
    // one chunk each (at (2, 128, 4, 24) segments beat one segment, perf-notes, twenty-first session).
    // segments > 0 (tests) asks for that many.
    const int64_t nck = std::max<int64_t>(1, ceil_div(s.T, kBwdChunk));
    const int64_t want = segments > 0 ? segments : std::max<int64_t>(1, lim.sms / std::max<int64_t>(1, bwd.blocks));
    const int64_t per = ceil_div(nck, std::min(want, nck));  // chunks a segment
    bwd.nseg = (int)ceil_div(nck, per);
    bwd.seg_chunks = (int)per;
    bwd.blocks *= bwd.nseg;
    GR_REQUIRE("ValueError", bwd.blocks <= INT32_MAX, "B * H * segments must be below 2^31 for the backward, got ",
               bwd.blocks);
    const int64_t state = s.Dk * s.Dv, segs = s.B * s.H * (bwd.nseg - 1);
    bwd.work_floats = bwd.blocks * bwd.seg_chunks * state + (bwd.nseg > 1 ? 2 * segs * state + s.B * s.H * bwd.nseg : 0);
    return true;
  }
  dq_pass = true;
  if (!make_plan(Shape{s.B, s.T, s.H, s.Dv, s.Dk}, dt, lay_dq, lim, kPlanned, kNoConfig, false, dq)) return false;
  bwd.kernel = Kernel::recurrent_bwd;
  bwd.R = s.Dk <= 32 ? 1 : s.Dk <= 64 ? 2 : s.Dk <= 128 ? 4 : 8;  // GR_BWD_ROWS
  bwd.NV = 32;
  bwd.vtiles = (int)ceil_div(s.Dv, 32);
  // the longest run of states that fits beside the static reduction buffers (8 states: 1/8 of the
  // recompute's state stores go to the workspace)
  const size_t fixed = 2 * (kMaxThreads / 32) * (32 + 2) * sizeof(float) + 1024;
  for (int tc = std::min(8, 32 / bwd.R); tc >= 1 && bwd.TC == 0; tc /= 2)
    if (recurrent_bwd_smem(bwd.R, tc) + fixed <= lim.smem) bwd.TC = tc;
  GR_REQUIRE("ValueError", bwd.TC > 0, "recurrent_bwd needs ", recurrent_bwd_smem(bwd.R, 1) + fixed,
             " bytes of shared memory a block at D_k = ", s.Dk, "; this device has ", lim.smem);
  bwd.smem = recurrent_bwd_smem(bwd.R, bwd.TC);
  const int64_t states = ceil_div(s.T, kBwdCheckpoint) + kBwdCheckpoint / bwd.TC;
  bwd.work_floats = bwd.blocks * states * bwd.R * kBwdStateFloats + (bwd.vtiles > 1 ? s.B * s.T * s.H * (s.Dk + 2) : 0);
  return true;
}

// chunk_bwd_sm90's checkpoints written by the forward (Problem::fwd_ckpt): the one rule, which both sides apply to
// the same inputs. Whether the forward of q, k, v, gate, beta writes them for a backward whose dy is laid out as
// `dy` (run_ex: its y, which is what autograd hands on as a rule; run_backward: the real one): the forward's plan
// (run_ex: the one it runs; run_backward, fwd nullptr: the planned one) is chunk_sm90's bfloat16 block with
// D_k = 128 (its consumers hold S^T in the checkpoint kernel's fragment layout), dense, with one segment a (b, h)
// (a later segment's start state is not known while it runs), and the backward's plan is chunk_bwd_sm90. Or, for
// float32, chunk_sm90's TF32 block, dense, one segment, and chunk_bwd_sm90_fp32 (its rows of kCk32 floats).
// *ck16: that plan's checkpoint dtype (bf16, or fp32 beside a float32 gate; float32 rows for float32 q).
bool forward_checkpoints(const Plan* fwd, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                         const at::Tensor& gate, const at::Tensor& beta, const at::Tensor& dy, bool* ck16) {
  const Shape s = shape_of(q, v);
  const DType dt = dtype_of(q);
  const DeviceLimits lim = device_limits();
  Plan planned, dq, bwd;
  bool dq_pass = true;
  if (fwd == nullptr && make_plan(s, dt, layout_of(q, k, v, gate, beta), lim, kPlanned, kNoConfig, false, planned))
    fwd = &planned;
  const bool yes = fwd != nullptr && fwd->kernel == Kernel::chunk_sm90 && fwd->dtype == dt && dt != DType::f16 &&
                   fwd->DK == 128 && !fwd->varlen && fwd->nseg == 1 &&
                   make_plan_backward(s, dt, layout_of(dy, v, k, gate, beta), layout_of(q, k, v, gate, beta), lim,
                                      kPlanned, 0, dq, bwd, dq_pass) &&
                   bwd.kernel == (dt == DType::f32 ? Kernel::chunk_bwd_sm90_fp32 : Kernel::chunk_bwd_sm90);
  if (!yes) g_error.clear();  // a plan refused here is no error of the call: it runs without them
  *ck16 = yes && bwd.ck16;
  return yes;
}

// ---- the backward: [dq, dk, dv, dgate, dbeta, dS_0] of <y, dy> + <S_T, dfinal>, each in its input's dtype and
// shape (dS_0: float32; an empty tensor without initial_state). dy: y's gradient (any strides); dfinal: the
// final state's, or none. Two launches: dq by a forward plan, the rest by recurrent_bwd (make_plan_backward).
bool check_grads(const at::Tensor& dy, const at::Tensor* dfinal, const at::Tensor& q, const at::Tensor& v) {
  GR_REQUIRE("TypeError", dy.defined(), "dy must be a tensor, got an undefined tensor");
  GR_REQUIRE("TypeError", dy.scalar_type() == q.scalar_type(), "dy has dtype ", dtype_str(dy.scalar_type()),
             " but q has ", dtype_str(q.scalar_type()), "; dy is the gradient of y, which has q's dtype");
  const int64_t want[4] = {q.size(0), q.size(1), q.size(2), v.size(3)};
  GR_REQUIRE("ValueError", dy.sizes() == at::IntArrayRef(want, 4), "dy must be (B, T, H, D_v) = ",
             shape_str(at::IntArrayRef(want, 4)), " like y, got ", shape_str(dy.sizes()));
  if (dfinal != nullptr) {
    GR_REQUIRE("TypeError", dfinal->scalar_type() == at::kFloat, "dfinal (the final state's gradient) must be float32, got ",
               dtype_str(dfinal->scalar_type()));
    const int64_t ws[4] = {q.size(0), q.size(2), q.size(3), v.size(3)};
    GR_REQUIRE("ValueError", dfinal->sizes() == at::IntArrayRef(ws, 4), "dfinal must be (B, H, D_k, D_v) = ",
               shape_str(at::IntArrayRef(ws, 4)), ", got ", shape_str(dfinal->sizes()));
  }
  return true;
}

// chunk_bwd_sm90_fp32's non-finite fallback: chunk_bwd with one segment (a single launch, which reads the flag).
bool plan_nonfinite_fallback(const Shape& s, DType dt, const Layout& lay_dq, const Layout& lay_fwd, Plan& fb) {
  Plan unused;
  bool dq_pass = true;
  return make_plan_backward(s, dt, lay_dq, lay_fwd, device_limits(), "chunk_bwd", 1, unused, fb, dq_pass);
}

// The backward's checks and plans, and whether their units are loaded (NeedUnit names a missing one). kernel:
// make_plan_backward's; dq_pass: whether a forward plan computes dq.
bool plan_backward_call(const at::Tensor& dy, const at::Tensor* dfinal, const at::Tensor& q, const at::Tensor& k,
                        const at::Tensor& v, const at::Tensor& gate, const at::Tensor& beta, const at::Tensor* s_in,
                        const std::string& kernel, int64_t segments, Plan& pdq, Plan& pbw, bool& dq_pass) {
  if (!check_shapes(q, k, v, gate, beta, false) || (s_in && !check_state(*s_in, q, v)) || !check_grads(dy, dfinal, q, v) ||
      !check_devices(q, k, v, gate, beta))
    return false;
  const std::pair<const at::Tensor*, const char*> more[] = {{&dy, "dy"}, {dfinal, "dfinal"}, {s_in, "initial_state"}};
  for (const auto& m : more)
    GR_REQUIRE("ValueError", m.first == nullptr || m.first->device() == q.device(), m.second, " is on ",
               device_str(*m.first), " but q is on ", device_str(q));
  const c10::cuda::CUDAGuard guard(q.device());
  Plan fb;  // (chunk_bwd_sm90_fp32's fallback: its unit must be loaded too)
  return make_plan_backward(shape_of(q, v), dtype_of(q), layout_of(dy, v, k, gate, beta), layout_of(q, k, v, gate, beta),
                            device_limits(), kernel,
                            segments, pdq, pbw, dq_pass) &&
         ((!dq_pass && pbw.kernel != Kernel::chunk_bwd_sm90_fp32) || unit_ready(pdq)) && unit_ready(pbw) &&
         (pbw.kernel != Kernel::chunk_bwd_sm90_fp32 ||
          (plan_nonfinite_fallback(shape_of(q, v), dtype_of(q), layout_of(dy, v, k, gate, beta),
                                   layout_of(q, k, v, gate, beta), fb) && unit_ready(fb)));
}

// The registered operators cannot build a unit, and an eager call that records autograd goes through them:
// Python asks first, with the call's own tensors (their layout decides the plan), and builds what is missing.
bool forward_ready(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& gate,
                   const at::Tensor& beta, const at::Tensor* s_in, const std::string& kernel,
                   const std::vector<int64_t>& config, bool reference) {
  if (!check_shapes(q, k, v, gate, beta, reference) || (s_in && !check_state(*s_in, q, v)) ||
      !check_devices(q, k, v, gate, beta))
    return false;
  const c10::cuda::CUDAGuard guard(q.device());
  Plan pl;
  return make_plan(shape_of(q, v), dtype_of(q), layout_of(q, k, v, gate, beta), device_limits(), kernel, config,
                   reference, pl) &&
         unit_ready(pl);
}

// ckpt: chunk_bwd_sm90's checkpoints from run_ex (want_ckpt), or nullptr; used where the plan is chunk_bwd_sm90 and
// forward_checkpoints holds for these inputs (else ignored: the checkpoint kernel runs).
bool run_backward(const at::Tensor& dy, const at::Tensor* dfinal, const at::Tensor& q, const at::Tensor& k,
                  const at::Tensor& v, const at::Tensor& gate, const at::Tensor& beta, const at::Tensor* s_in,
                  const std::string& kernel, int64_t segments, std::vector<at::Tensor>& out,
                  const at::Tensor* ckpt = nullptr) {
  Plan pdq, pbw;
  bool dq_pass = true;
  if (!plan_backward_call(dy, dfinal, q, k, v, gate, beta, s_in, kernel, segments, pdq, pbw, dq_pass)) return false;
  const c10::cuda::CUDAGuard guard(q.device());
  bool ck16 = false;
  const bool fp32_90 = pbw.kernel == Kernel::chunk_bwd_sm90_fp32;
  const bool use_ckpt = ckpt != nullptr && ckpt->numel() > 0 && (pbw.kernel == Kernel::chunk_bwd_sm90 || fp32_90) &&
                        forward_checkpoints(nullptr, q, k, v, gate, beta, dy, &ck16) && ck16 == pbw.ck16;
  if (use_ckpt) {  // rows of kCk32 floats (float32) or kCk16 halves (ck16) a chunk (B H, chunks, row); else
    // (B H, chunks, D_k, D_v) floats
    const bool rows = fp32_90 || ck16;
    const int64_t want[4] = {q.size(0) * q.size(2), ceil_div(q.size(1), 64),
                             fp32_90 ? kCk32 : ck16 ? kCk16 : q.size(3), v.size(3)};
    const at::IntArrayRef want_ref(want, rows ? 3 : 4);
    const auto st = ck16 ? at::kHalf : at::kFloat;
    GR_REQUIRE("ValueError", ckpt->scalar_type() == st && ckpt->is_contiguous() && ckpt->device() == q.device() &&
                                 ckpt->sizes() == want_ref && reinterpret_cast<uintptr_t>(ckpt->data_ptr()) % 16 == 0,
               "ckpt must be the forward's checkpoints: contiguous, 16-byte aligned ", dtype_str(st), " ",
               shape_str(want_ref), " on q's device, got ", dtype_str(ckpt->scalar_type()), " ",
               shape_str(ckpt->sizes()), " on ", device_str(*ckpt));
    pbw.work_floats = 0;  // (the workspace held only the checkpoints)
  }
  at::Tensor dq = at::empty(q.sizes(), q.options()), dk = at::empty(k.sizes(), k.options()),
             dv = at::empty(v.sizes(), v.options()), dg = at::empty(gate.sizes(), gate.options()),
             db = at::empty(beta.sizes(), beta.options());
  at::Tensor ds0 = at::empty({0}, q.options().dtype(at::kFloat));
  if (s_in) ds0 = q.size(1) > 0 ? at::empty(s_in->sizes(), ds0.options())  // with no steps, S_T = S_0
                                : dfinal ? dfinal->clone(at::MemoryFormat::Contiguous) : at::zeros(s_in->sizes(), ds0.options());
  if (dq.numel() > 0 || dv.numel() > 0) {
    const at::Tensor s0t = s_in ? s_in->transpose(2, 3) : at::Tensor();  // a view: S_0^T for the dq pass
    if (dq_pass && !execute(pdq, problem_of(dy, v, k, gate, beta, dq, s_in ? &s0t : nullptr, nullptr), q)) return false;
    BwdProblem bp;
    static_cast<Problem&>(bp) = problem_of(q, k, v, gate, beta, dq, s_in, nullptr);
    bp.dy = dy.data_ptr(); bp.sdy = strides4(dy);
    bp.dfinal = dfinal ? dfinal->data_ptr<float>() : nullptr; bp.sdf = state_strides(dfinal);
    bp.dk = dk.data_ptr(); bp.dv = dv.data_ptr(); bp.dgate = dg.data_ptr(); bp.dbeta = db.data_ptr();
    bp.ds0 = s_in ? ds0.data_ptr<float>() : nullptr;
    bp.fwd_ckpt = use_ckpt ? ckpt->data_ptr() : nullptr;
    if (fp32_90) {
      // chunk_bwd_sm90_fp32: the checkpoints (the forward's, or pdq's TF32 forward writing them, y into dq's memory,
      // which the backward then overwrites), its two kernels, then chunk_bwd, which recomputes every gradient only
      // where they flagged an inf or NaN (no sync: it reads the flag itself). One buffer holds the checkpoints and
      // then chunk_bwd's workspace.
      Plan fb;
      if (!plan_nonfinite_fallback(shape_of(q, v), dtype_of(q), layout_of(dy, v, k, gate, beta),
                                   layout_of(q, k, v, gate, beta), fb))
        return false;
      const int64_t ck_floats = q.size(0) * q.size(2) * ceil_div(q.size(1), 64) * kCk32;
      at::Tensor work = at::empty({use_ckpt ? fb.work_floats : std::max<int64_t>(fb.work_floats, ck_floats)},
                                  q.options().dtype(at::kFloat));
      if (!use_ckpt) {
        Problem pc = problem_of(q, k, v, gate, beta, dq, s_in, nullptr);
        pc.fwd_ckpt = work.data_ptr();
        if (!execute(pdq, pc, q)) return false;
        bp.fwd_ckpt = work.data_ptr();
      }
      at::Tensor flag = at::zeros({1}, q.options().dtype(at::kInt));
      bp.nonfinite = flag.data_ptr<int>();
      if (!execute(pbw, bp, q)) return false;
      bp.nonfinite = nullptr;
      bp.run_if = flag.data_ptr<int>();
      bp.fwd_ckpt = nullptr;
      if (!execute(fb, bp, q, work.data_ptr<float>())) return false;
    } else if (!execute(pbw, bp, q)) {
      return false;
    }
  }
  out = {dq, dk, dv, dg, db, ds0};
  return true;
}

// ---- variable-length prefill (cu_seqlens): N sequences packed into one row of T tokens.
// cu_seqlens' values on the host (a CPU tensor, any stride): 0 first, non-decreasing, T last; the longest.
bool check_cu_values(const at::Tensor& c, const char* name, int64_t tokens, int64_t& longest) {
  const int64_t n = c.size(0), st = c.stride(0);
  const bool wide = c.scalar_type() == at::kLong;
  const void* base = c.data_ptr();
  auto at_ = [&](int64_t i) {
    return wide ? static_cast<const int64_t*>(base)[i * st] : (int64_t) static_cast<const int*>(base)[i * st];
  };
  GR_REQUIRE("ValueError", at_(0) == 0, name, "[0] must be 0, got ", at_(0));
  longest = 0;
  for (int64_t i = 1; i < n; ++i) {
    GR_REQUIRE("ValueError", at_(i) >= at_(i - 1), name, " must be non-decreasing: ", name, "[", i, "] = ", at_(i),
               " is below ", name, "[", i - 1, "] = ", at_(i - 1));
    longest = std::max(longest, at_(i) - at_(i - 1));
  }
  GR_REQUIRE("ValueError", at_(n - 1) == tokens, name, "[-1] must be the packed length T = ", tokens, " (q.shape[1]), got ",
             at_(n - 1));
  return true;
}

// What needs no device: cu_seqlens' dtype and shape, the packed batch, the state's shape, the hints (the
// values of cu_seqlens_cpu included). Sets the longest sequence where a hint tells it (else -1).
bool check_varlen(const at::Tensor& q, const at::Tensor& v, const at::Tensor& cu, const at::Tensor* cu_cpu,
                  int64_t max_seqlen, const at::Tensor* s_in, const std::string& kernel, int64_t& longest) {
  GR_REQUIRE("ValueError", kernel != "parallel", kernel,
             " does not take cu_seqlens (recurrent, chunked, chunk_tf32, chunk_bf16 and chunk_sm90 do)");
  const auto ct = cu.scalar_type();
  GR_REQUIRE("TypeError", ct == at::kInt || ct == at::kLong, "cu_seqlens must be int32 or int64, got ", dtype_str(ct));
  GR_REQUIRE("ValueError", cu.dim() == 1 && cu.size(0) >= 1, "cu_seqlens must be 1-D with N + 1 >= 1 entries, got shape ",
             shape_str(cu.sizes()));
  GR_REQUIRE("ValueError", q.size(0) == 1, "with cu_seqlens, q, k, v, gate and beta are packed as (1, T_total, H, ...), "
             "got q of shape ", shape_str(q.sizes()));
  const int64_t N = cu.size(0) - 1, T = q.size(1);
  GR_REQUIRE("ValueError", N > 0 || T == 0, "cu_seqlens has no sequence (shape (1,)) but q packs T = ", T, " tokens");
  if (s_in != nullptr && !check_state(*s_in, q, v, N)) return false;
  GR_REQUIRE("ValueError", max_seqlen >= -1, "max_seqlen must be >= 0, got ", max_seqlen);
  longest = max_seqlen;
  if (cu_cpu != nullptr) {
    const auto st = cu_cpu->scalar_type();
    GR_REQUIRE("TypeError", st == at::kInt || st == at::kLong, "cu_seqlens_cpu must be int32 or int64, got ", dtype_str(st));
    GR_REQUIRE("ValueError", cu_cpu->is_cpu(), "cu_seqlens_cpu must be a CPU tensor (the host copy of cu_seqlens), "
               "got a tensor on ", device_str(*cu_cpu));
    GR_REQUIRE("ValueError", cu_cpu->sizes() == cu.sizes(), "cu_seqlens_cpu must have cu_seqlens' shape ",
               shape_str(cu.sizes()), ", got ", shape_str(cu_cpu->sizes()));
    int64_t exact = 0;
    if (!check_cu_values(*cu_cpu, "cu_seqlens_cpu", T, exact)) return false;
    GR_REQUIRE("ValueError", max_seqlen < 0 || exact <= max_seqlen, "max_seqlen = ", max_seqlen,
               " is below the longest sequence of cu_seqlens_cpu, ", exact);
    longest = exact;
  }
  // on the host already (refused below as not on q's device): its values' errors come first
  if (cu.is_cpu() && cu_cpu == nullptr) {
    int64_t exact = 0;
    if (!check_cu_values(cu, "cu_seqlens", T, exact)) return false;
  }
  return true;
}

// gated_recurrence with cu_seqlens: y (1, T, H, D_v) and, with want_final, the (N, H, D_k, D_v) final
// states. With a hint (max_seqlen or cu_seqlens_cpu) nothing is read back from the device; without one,
// cu_seqlens is copied to the host once (a synchronization) and its values checked.
bool run_varlen(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& gate,
                const at::Tensor& beta, const at::Tensor& cu, const c10::optional<at::Tensor>& initial_state,
                bool want_final, int64_t max_seqlen, const c10::optional<at::Tensor>& cu_seqlens_cpu,
                const std::string& kernel, const std::vector<int64_t>& config, bool reference,
                std::vector<at::Tensor>& out) {
  if (!check_shapes(q, k, v, gate, beta, reference)) return false;
  c10::cuda::OptionalCUDAGuard guard;
  if (q.is_cuda()) guard.set_device(q.device());
  const at::Tensor* s_in = initial_state.has_value() && initial_state->defined() ? &*initial_state : nullptr;
  const at::Tensor* cu_cpu = cu_seqlens_cpu.has_value() && cu_seqlens_cpu->defined() ? &*cu_seqlens_cpu : nullptr;
  int64_t longest = -1;
  if (!check_varlen(q, v, cu, cu_cpu, max_seqlen, s_in, kernel, longest) || !check_no_grad(q, k, v, gate, beta, s_in, "initial_state", "gated_recurrence with cu_seqlens") ||
      !check_devices(q, k, v, gate, beta))
    return false;
  GR_REQUIRE("ValueError", cu.device() == q.device(), "cu_seqlens is on ", device_str(cu), " but q is on ",
             device_str(q), "; it belongs on q's device (a CPU copy goes in cu_seqlens_cpu)");
  GR_REQUIRE("ValueError", !s_in || s_in->device() == q.device(), "initial_state is on ", device_str(*s_in),
             " but q is on ", device_str(q));
  const int64_t N = cu.size(0) - 1, T = q.size(1), H = q.size(2), Dk = q.size(3), Dv = v.size(3);
  if (longest < 0) {  // no hint: the documented read-back
    const at::Tensor host = cu.to(at::kCPU);
    if (!check_cu_values(host, "cu_seqlens", T, longest)) return false;
  }
  Plan pl;
  if (!make_plan(Shape{N, longest, H, Dk, Dv}, dtype_of(q), layout_of(q, k, v, gate, beta), device_limits(), kernel,
                 config, reference, pl, true) ||
      !unit_ready(pl))
    return false;
  at::Tensor y = at::empty({1, T, H, Dv}, q.options());
  at::Tensor fin = want_final ? final_states(N, T, q, v, s_in) : at::Tensor();
  if (y.numel() > 0) {
    Problem pr = problem_of(q, k, v, gate, beta, y, s_in, want_final ? &fin : nullptr);
    pr.sq.b = pr.sk.b = pr.sv.b = pr.sy.b = pr.sg.b = pr.sb.b = 0;  // one packed row; b is the sequence
    pr.BH = N * H;
    pr.cu = cu.data_ptr();
    pr.cu64 = cu.scalar_type() == at::kLong;
    pr.cu_stride = cu.stride(0);
    if (!execute(pl, pr, q)) return false;
  }
  out.push_back(y);
  if (want_final) out.push_back(fin);
  return true;
}

// 16-byte pool accesses: unit column stride, D_v a multiple of 4, every row on a 16-byte boundary.
inline bool pool_aligned(const at::Tensor& pool) {
  return pool.stride(3) == 1 && pool.size(3) % 4 == 0 && reinterpret_cast<uintptr_t>(pool.data_ptr()) % 16 == 0 &&
         pool.stride(0) % 4 == 0 && pool.stride(1) % 4 == 0 && pool.stride(2) % 4 == 0;
}

// The decode step: checks, the plan, y, one launch; the pool is read and written in place on the device
// (indices included: nothing comes back to the host).
at::Tensor run_decode(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& gate,
                      const at::Tensor& beta, const at::Tensor& pool, const at::Tensor* idx, int64_t nv,
                      int64_t persistent) {
  if (!check_shapes(q, k, v, gate, beta, false) || !check_pool(pool, idx, q, v) ||
      !check_no_grad(q, k, v, gate, beta, &pool, "state_pool", "gated_recurrence_decode_") ||
      !check_devices(q, k, v, gate, beta) ||
      !check_pool_devices(pool, idx, q, k, v, gate, beta))
    return at::Tensor();
  const c10::cuda::CUDAGuard guard(q.device());
  Plan pl;
  const bool rows_unit = q.stride(3) == 1 && k.stride(3) == 1 && v.stride(3) == 1;  // (y is ours: contiguous)
  if (!plan_decode(shape_of(q, v), dtype_of(q), pool_aligned(pool), rows_unit, device_limits(), nv, persistent, pl))
    return at::Tensor();
  at::Tensor y = at::empty({q.size(0), q.size(1), q.size(2), v.size(3)}, q.options());
  if (y.numel() == 0) return y;  // (before unit_ready: an empty call builds nothing)
  if (!unit_ready(pl)) return at::Tensor();
  Problem pr = problem_of(q, k, v, gate, beta, y, &pool, const_cast<at::Tensor*>(&pool));
  pr.P = pool.size(0);
  if (idx != nullptr) {
    pr.idx = idx->data_ptr();
    pr.idx64 = idx->scalar_type() == at::kLong;
    pr.idx_stride = idx->stride(0);
  }
  if (!execute(pl, pr, q)) return at::Tensor();
  // what an in-place torch op does: autograd's saved copies of the pool now see it as modified
  if (!pool.is_inference()) pool.unsafeGetTensorImpl()->bump_version();
  return y;
}

std::string plan_decode_text(int64_t B, int64_t T, int64_t H, int64_t Dk, int64_t Dv, int64_t dtype, int64_t nv,
                             int64_t persistent) {
  Plan pl;
  return plan_decode(Shape{B, T, H, Dk, Dv}, static_cast<DType>(dtype), Dv % 4 == 0, true, device_limits(), nv, persistent,
                     pl)
             ? describe(pl) : std::string();
}

// The backward's two plans for contiguous inputs, as text: recurrent_bwd, then "dq: " and its forward plan.
std::string plan_backward_text(int64_t B, int64_t T, int64_t H, int64_t Dk, int64_t Dv, int64_t dtype, const std::string& kernel,
                               int64_t segments) {
  const Shape s{B, T, H, Dk, Dv};
  if (!check_sizes(s)) return std::string();
  const DType dt = static_cast<DType>(dtype);
  const int V = 16 / elem_size(dt);
  const Layout lay{Dv % V == 0, Dv % V == 0, Dk % V == 0, Dk % V == 0, false, true};
  Plan dq, bwd;
  bool dq_pass = true;
  // (off32 left true: for dense inputs make_plan_backward's B T H D check is the same condition)
  const Layout lay_fwd{Dk % V == 0, Dk % V == 0, Dv % V == 0, Dv % V == 0, false, true};
  if (!make_plan_backward(s, dt, lay, lay_fwd, device_limits(), kernel, segments, dq, bwd, dq_pass)) return std::string();
  std::string text = describe(bwd) + "\ndq: " + (dq_pass ? describe(dq) : cat("in ", kKernelNames[(int)bwd.kernel]));
  if (bwd.kernel == Kernel::chunk_bwd_sm90_fp32) {
    Plan fb;
    plan_nonfinite_fallback(s, dt, lay, lay_fwd, fb);
    text += "\ncheckpoints: " + describe(dq) + " (y discarded; skipped where the forward wrote them)" +
            "\nnon-finite values: " + describe(fb) + " (launched always; it exits at once unless chunk_bwd_sm90_fp32 "
            "read or wrote an inf or NaN, and then recomputes every gradient)";
  }
  return text;
}

// plan() for Python: the planned record for contiguous inputs of this shape and dtype, as text.
// With sms, smem and arch all given (nonzero), for a device with those limits instead (tests: the plan
// of every GPU family fits it).
std::string plan_text(int64_t B, int64_t T, int64_t H, int64_t Dk, int64_t Dv, int64_t dtype, int64_t sms,
                      int64_t smem, int64_t arch, bool reference, bool varlen) {
  const Shape s{B, T, H, Dk, Dv};
  if (!check_sizes(s)) return std::string();
  const DType dt = static_cast<DType>(dtype);
  const int V = 16 / elem_size(dt);
  const Layout lay{Dk % V == 0, Dk % V == 0, Dv % V == 0, Dv % V == 0, false};
  const DeviceLimits lim = sms > 0 && smem > 0 && arch > 0 ? DeviceLimits{sms, (size_t)smem, arch >= 90, (int)arch}
                                                           : device_limits();
  Plan pl;
  return make_plan(s, dt, lay, lim, kPlanned, kNoConfig, reference, pl, varlen) ? describe(pl) : std::string();
}

}  // namespace gr

namespace gr {
// The Python arguments as tensors, or a TypeError naming the first that is not one (pybind's own
// mismatch message would print every argument in full). THPVariable_Check is pybind's own test.
bool tensor_args(std::initializer_list<std::pair<pybind11::handle, const char*>> args,
                 std::initializer_list<const at::Tensor**> out) {
  auto o = out.begin();
  for (const auto& a : args) {
    GR_REQUIRE("TypeError", THPVariable_Check(a.first.ptr()), a.second, " must be a torch.Tensor, got ",
               Py_TYPE(a.first.ptr())->tp_name);
    **o++ = &THPVariable_Unpack(a.first.ptr());
  }
  return true;
}
// An optional argument: None leaves *out nullptr; anything else must be a tensor (tensor_args' TypeError).
bool optional_arg(pybind11::handle h, const char* name, const at::Tensor** out) {
  return h.is_none() || tensor_args({{h, name}}, {out});
}
}  // namespace gr

// ---- registered operators: what torch.compile traces (eager calls keep the pybind functions below,
// which cost less host time a call). The namespace comes from the unit's hashed name (GR_OPS_NS, set by
// the build): an edited copy of the file in the same process registers a new namespace instead of
// redefining one (which aborts). Refusals are thrown as the Python exception they name.
#ifndef GR_OPS_NS
#define GR_OPS_NS gated_recurrence_ops
#endif
namespace gr {
[[noreturn]] void throw_last_error() {
  const size_t colon = g_error.find(": ");
  const std::string kind = g_error.substr(0, colon), msg = colon == std::string::npos ? g_error : g_error.substr(colon + 2);
  if (kind == "ValueError") C10_THROW_ERROR(ValueError, msg);
  if (kind == "TypeError") C10_THROW_ERROR(TypeError, msg);
  if (kind == "NotImplementedError") C10_THROW_ERROR(NotImplementedError, msg);
  if (kind == "NeedUnit") C10_THROW_ERROR(Error, "solution.py: unit " + msg + " is not built; call solution.build('" + msg + "') first");
  C10_THROW_ERROR(Error, msg);
}

at::Tensor op_forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& gate,
                      const at::Tensor& beta, bool reference) {
  at::Tensor y = run(q, k, v, gate, beta, reference);
  if (!y.defined()) throw_last_error();
  return y;
}

std::vector<at::Tensor> op_forward_ex(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                      const at::Tensor& gate, const at::Tensor& beta,
                                      const c10::optional<at::Tensor>& initial_state, bool want_final,
                                      c10::string_view kernel, at::IntArrayRef config, bool reference) {
  std::vector<at::Tensor> out;
  if (!run_ex(q, k, v, gate, beta, initial_state, want_final, std::string(kernel), config.vec(), reference, out))
    throw_last_error();
  return out;
}

std::vector<at::Tensor> op_forward_varlen(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                          const at::Tensor& gate, const at::Tensor& beta, const at::Tensor& cu_seqlens,
                                          const c10::optional<at::Tensor>& initial_state, bool want_final,
                                          int64_t max_seqlen, const c10::optional<at::Tensor>& cu_seqlens_cpu,
                                          c10::string_view kernel, at::IntArrayRef config, bool reference) {
  std::vector<at::Tensor> out;
  if (!run_varlen(q, k, v, gate, beta, cu_seqlens, initial_state, want_final, max_seqlen, cu_seqlens_cpu,
                  std::string(kernel), config.vec(), reference, out))
    throw_last_error();
  return out;
}

std::vector<at::Tensor> op_backward(const at::Tensor& dy, const c10::optional<at::Tensor>& dfinal, const at::Tensor& q,
                                    const at::Tensor& k, const at::Tensor& v, const at::Tensor& gate, const at::Tensor& beta,
                                    const c10::optional<at::Tensor>& initial_state) {
  std::vector<at::Tensor> out;
  if (!run_backward(dy, dfinal.has_value() && dfinal->defined() ? &*dfinal : nullptr, q, k, v, gate, beta,
                    initial_state.has_value() && initial_state->defined() ? &*initial_state : nullptr, kPlanned, 0, out))
    throw_last_error();
  return out;
}

at::Tensor op_decode_(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& gate,
                      const at::Tensor& beta, const at::Tensor& state_pool, const c10::optional<at::Tensor>& state_indices) {
  const at::Tensor* idx = state_indices.has_value() && state_indices->defined() ? &*state_indices : nullptr;
  at::Tensor y = run_decode(q, k, v, gate, beta, state_pool, idx, 0, -1);
  if (!y.defined()) throw_last_error();
  return y;
}
}  // namespace gr

TORCH_LIBRARY(GR_OPS_NS, m) {
  m.def("forward(Tensor q, Tensor k, Tensor v, Tensor gate, Tensor beta, bool reference) -> Tensor");
  m.def("forward_ex(Tensor q, Tensor k, Tensor v, Tensor gate, Tensor beta, Tensor? initial_state, bool want_final, "
        "str kernel, int[] config, bool reference) -> Tensor[]");
  m.def("forward_varlen(Tensor q, Tensor k, Tensor v, Tensor gate, Tensor beta, Tensor cu_seqlens, "
        "Tensor? initial_state, bool want_final, int max_seqlen, Tensor? cu_seqlens_cpu, str kernel, int[] config, "
        "bool reference) -> Tensor[]");
  // (a!): the pool is written in place (functionalization and torch.compile see the mutation)
  m.def("decode_(Tensor q, Tensor k, Tensor v, Tensor gate, Tensor beta, Tensor(a!) state_pool, "
        "Tensor? state_indices) -> Tensor");
  // forward and forward_ex's autograd (registered from Python): [dq, dk, dv, dgate, dbeta, dS_0 or shape (0,)]
  m.def("backward(Tensor dy, Tensor? dfinal, Tensor q, Tensor k, Tensor v, Tensor gate, Tensor beta, "
        "Tensor? initial_state) -> Tensor[]");
}
TORCH_LIBRARY_IMPL(GR_OPS_NS, CUDA, m) {
  m.impl("forward", &gr::op_forward);
  m.impl("forward_ex", &gr::op_forward_ex);
  m.impl("forward_varlen", &gr::op_forward_varlen);
  m.impl("decode_", &gr::op_decode_);
  m.impl("backward", &gr::op_backward);
}
// CPU tensors reach the same checks, which refuse them by name (ValueError), as the eager call does.
TORCH_LIBRARY_IMPL(GR_OPS_NS, CPU, m) {
  m.impl("forward", &gr::op_forward);
  m.impl("forward_ex", &gr::op_forward_ex);
  m.impl("forward_varlen", &gr::op_forward_varlen);
  m.impl("decode_", &gr::op_decode_);
  m.impl("backward", &gr::op_backward);
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  using pybind11::handle;
  m.def("forward", [](handle q, handle k, handle v, handle gate, handle beta, bool reference) {
    const at::Tensor *tq, *tk, *tv, *tg, *tb;
    if (!gr::tensor_args({{q, "q"}, {k, "k"}, {v, "v"}, {gate, "gate"}, {beta, "beta"}}, {&tq, &tk, &tv, &tg, &tb}))
      return at::Tensor();
    return gr::run(*tq, *tk, *tv, *tg, *tb, reference);
  });
  // want_ckpt (the eager autograd forward, _EagerGrad): the backward's checkpoints as a last output (run_ex)
  m.def("forward_ex", [](handle q, handle k, handle v, handle gate, handle beta, handle initial_state, bool want_final,
                         const std::string& kernel, const std::vector<int64_t>& config, bool reference, bool want_ckpt) {
    std::vector<at::Tensor> out;
    const at::Tensor *tq, *tk, *tv, *tg, *tb, *ts = nullptr;
    if (!gr::tensor_args({{q, "q"}, {k, "k"}, {v, "v"}, {gate, "gate"}, {beta, "beta"}}, {&tq, &tk, &tv, &tg, &tb}) ||
        !gr::optional_arg(initial_state, "initial_state", &ts))
      return out;
    const c10::optional<at::Tensor> s0 = ts != nullptr ? c10::optional<at::Tensor>(*ts) : c10::nullopt;
    if (!gr::run_ex(*tq, *tk, *tv, *tg, *tb, s0, want_final, kernel, config, reference, out, want_ckpt)) out.clear();
    return out;
  }, pybind11::arg("q"), pybind11::arg("k"), pybind11::arg("v"), pybind11::arg("gate"), pybind11::arg("beta"),
     pybind11::arg("initial_state"), pybind11::arg("want_final"), pybind11::arg("kernel"), pybind11::arg("config"),
     pybind11::arg("reference"), pybind11::arg("want_ckpt") = false);
  m.def("forward_varlen", [](handle q, handle k, handle v, handle gate, handle beta, handle cu_seqlens,
                             handle initial_state, bool want_final, int64_t max_seqlen, handle cu_seqlens_cpu,
                             const std::string& kernel, const std::vector<int64_t>& config, bool reference) {
    std::vector<at::Tensor> out;
    const at::Tensor *tq, *tk, *tv, *tg, *tb, *tc, *ts = nullptr, *th = nullptr;
    if (!gr::tensor_args({{q, "q"}, {k, "k"}, {v, "v"}, {gate, "gate"}, {beta, "beta"}, {cu_seqlens, "cu_seqlens"}},
                         {&tq, &tk, &tv, &tg, &tb, &tc}) ||
        !gr::optional_arg(initial_state, "initial_state", &ts) ||
        !gr::optional_arg(cu_seqlens_cpu, "cu_seqlens_cpu", &th))
      return out;
    const c10::optional<at::Tensor> s0 = ts != nullptr ? c10::optional<at::Tensor>(*ts) : c10::nullopt;
    const c10::optional<at::Tensor> host = th != nullptr ? c10::optional<at::Tensor>(*th) : c10::nullopt;
    if (!gr::run_varlen(*tq, *tk, *tv, *tg, *tb, *tc, s0, want_final, max_seqlen, host, kernel, config, reference, out))
      out.clear();
    return out;
  });
  m.def("decode_", [](handle q, handle k, handle v, handle gate, handle beta, handle state_pool, handle state_indices,
                       int64_t nv, int64_t persistent) {
    const at::Tensor *tq, *tk, *tv, *tg, *tb, *tp, *ti = nullptr;
    if (!gr::tensor_args({{q, "q"}, {k, "k"}, {v, "v"}, {gate, "gate"}, {beta, "beta"}, {state_pool, "state_pool"}},
                         {&tq, &tk, &tv, &tg, &tb, &tp}) ||
        !gr::optional_arg(state_indices, "state_indices", &ti))
      return at::Tensor();
    return gr::run_decode(*tq, *tk, *tv, *tg, *tb, *tp, ti, nv, persistent);
  });
  // ckpt: forward_ex's checkpoints (want_ckpt), or None (run_backward)
  m.def("backward", [](handle dy, handle dfinal, handle q, handle k, handle v, handle gate, handle beta,
                       handle initial_state, const std::string& kernel, int64_t segments, handle ckpt) {
    std::vector<at::Tensor> out;
    const at::Tensor *tdy, *tq, *tk, *tv, *tg, *tb, *tf = nullptr, *ts = nullptr, *tc = nullptr;
    if (!gr::tensor_args({{dy, "dy"}, {q, "q"}, {k, "k"}, {v, "v"}, {gate, "gate"}, {beta, "beta"}},
                         {&tdy, &tq, &tk, &tv, &tg, &tb}) ||
        !gr::optional_arg(dfinal, "dfinal", &tf) || !gr::optional_arg(initial_state, "initial_state", &ts) ||
        !gr::optional_arg(ckpt, "ckpt", &tc))
      return out;
    if (!gr::run_backward(*tdy, tf, *tq, *tk, *tv, *tg, *tb, ts, kernel, segments, out, tc)) out.clear();
    return out;
  }, pybind11::arg("dy"), pybind11::arg("dfinal"), pybind11::arg("q"), pybind11::arg("k"), pybind11::arg("v"),
     pybind11::arg("gate"), pybind11::arg("beta"), pybind11::arg("initial_state"), pybind11::arg("kernel"),
     pybind11::arg("segments"), pybind11::arg("ckpt") = pybind11::none());
  // true, or None with last_error() (NeedUnit: the unit to build), for the operators' eager callers
  m.def("forward_ready", [](handle q, handle k, handle v, handle gate, handle beta, handle initial_state,
                            const std::string& kernel, const std::vector<int64_t>& config,
                            bool reference) -> pybind11::object {
    const at::Tensor *tq, *tk, *tv, *tg, *tb, *ts = nullptr;
    if (!gr::tensor_args({{q, "q"}, {k, "k"}, {v, "v"}, {gate, "gate"}, {beta, "beta"}}, {&tq, &tk, &tv, &tg, &tb}) ||
        !gr::optional_arg(initial_state, "initial_state", &ts) ||
        !gr::forward_ready(*tq, *tk, *tv, *tg, *tb, ts, kernel, config, reference))
      return pybind11::none();
    return pybind11::bool_(true);
  });
  m.def("backward_ready", [](handle dy, handle dfinal, handle q, handle k, handle v, handle gate, handle beta,
                             handle initial_state) -> pybind11::object {
    const at::Tensor *tdy, *tq, *tk, *tv, *tg, *tb, *tf = nullptr, *ts = nullptr;
    gr::Plan pdq, pbw;
    bool dq_pass = true;
    if (!gr::tensor_args({{dy, "dy"}, {q, "q"}, {k, "k"}, {v, "v"}, {gate, "gate"}, {beta, "beta"}},
                         {&tdy, &tq, &tk, &tv, &tg, &tb}) ||
        !gr::optional_arg(dfinal, "dfinal", &tf) || !gr::optional_arg(initial_state, "initial_state", &ts) ||
        !gr::plan_backward_call(*tdy, tf, *tq, *tk, *tv, *tg, *tb, ts, gr::kPlanned, 0, pdq, pbw, dq_pass))
      return pybind11::none();
    return pybind11::bool_(true);
  });
  m.def("plan", &gr::plan_text);
  m.def("plan_backward", &gr::plan_backward_text);
  m.def("plan_decode", &gr::plan_decode_text);
  m.def("last_error", [] { return gr::g_error; });
  // A chunk unit's entry point (its address from ctypes) for Unit index `unit`.
  m.def("attach", [](int64_t unit, int64_t address) {
    if (unit >= 1 && unit < gr::kUnits) gr::g_execute[unit] = reinterpret_cast<gr::ExecuteFn>(address);
  });
}
"""

SOURCES = {"prelude": PRELUDE_SRC, "device": DEVICE_SRC, "recurrent": RECURRENT_SRC, "reference": REFERENCE_SRC,
           "parallel": PARALLEL_SRC,
           "chunk": CHUNK_SRC,
           "segment_scan": SEGMENT_SCAN_SRC, "tf32_mma": TF32_MMA_SRC, "chunk_tf32": CHUNK_TF32_SRC, "chunk_bf16": CHUNK_BF16_SRC,
           "wgmma": WGMMA_SRC, "sm90": SM90_SRC, "chunk_sm90_tf32": CHUNK_SM90_TF32_SRC, "chunk_sm90": CHUNK_SM90_SRC, "decode": DECODE_SRC, "backward": BACKWARD_SRC,
           "backward_sm90": BACKWARD_SM90_SRC, "backward_sm90_fp32": BACKWARD_SM90_FP32_SRC, "host": HOST_SRC,
           "host_run": HOST_RUN_SRC}

# Each unit's CUDA sources (PRELUDE and DEVICE first) and C entry point; core adds the host file.
_UNIT_CUDA = {
    "core": [RECURRENT_SRC, PARALLEL_SRC],
    "chunk_tf32": [CHUNK_SRC, SEGMENT_SCAN_SRC, TF32_MMA_SRC, CHUNK_TF32_SRC],
    "chunk_bf16": [CHUNK_SRC, SEGMENT_SCAN_SRC, CHUNK_BF16_SRC],
    "reference": [RECURRENT_SRC, REFERENCE_SRC],
    "chunk_sm90": [CHUNK_SRC, SEGMENT_SCAN_SRC, WGMMA_SRC, SM90_SRC, CHUNK_SM90_TF32_SRC, CHUNK_SM90_SRC],
    "decode": [DECODE_SRC],
    "backward": [TF32_MMA_SRC, BACKWARD_SRC],
    "backward_sm90": [WGMMA_SRC, BACKWARD_SM90_SRC],
    "backward_sm90_fp32": [WGMMA_SRC, BACKWARD_SM90_FP32_SRC],
}
# Units built for one target whatever the device or TORCH_CUDA_ARCH_LIST (wgmma is sm_90a-only code).
_UNIT_GENCODE = {"chunk_sm90": ["-gencode=arch=compute_90a,code=sm_90a"],
                 "backward_sm90": ["-gencode=arch=compute_90a,code=sm_90a"],
                 "backward_sm90_fp32": ["-gencode=arch=compute_90a,code=sm_90a"]}
CUDA_FLAGS = ["-O3"]


# ---------------------------------------------------------------------------------------------
# Build: a unit is compiled once per (source, flags, torch, arch) into a named, hashed folder; the
# core at import, a chunk unit when a plan first needs it (or at build()).
# ---------------------------------------------------------------------------------------------
# TORCH_CUDA_ARCH_LIST as the user set it (a build without a device sets it for torch; the key must not see that)
_ARCH_ENV = os.environ.get("TORCH_CUDA_ARCH_LIST", "")


def _arch_list():
    """Build for the visible device (its own arch); without one, for TORCH_CUDA_ARCH_LIST or Hopper."""
    if torch.cuda.is_available():
        major, minor = torch.cuda.get_device_capability()
        return f"{major}.{minor}"
    return os.environ.get("TORCH_CUDA_ARCH_LIST", "9.0")


def _split_compile_flags():
    """nvcc >= 12.1 optimizes the kernels in parallel, one thread per core (a unit's build is mostly
    nvcc). The SASS is the same with and without it, so it is left out of the build key."""
    nvcc = os.path.join(_CUDA_HOME or "/usr/local/cuda", "bin", "nvcc")
    out = subprocess.run([nvcc, "--version"], capture_output=True, text=True).stdout if os.path.exists(nvcc) else ""
    found = re.search(r"release (\d+)\.(\d+)", out)
    return ["--split-compile=0"] if found and (int(found.group(1)), int(found.group(2))) >= (12, 1) else []


# torch >= 2.8 can leave out the torch/extension.h and torch/types.h that load_inline otherwise adds
# (about 20 s of compile time on 2 cores); the sources include what they use.
_LEAN = {"no_implicit_headers": True} if "no_implicit_headers" in inspect.signature(load_inline).parameters else {}


def _ops_namespace(name):
    """torch.ops namespace of a core build: its name (gated_recurrence_core_<hash>) without "core_"."""
    return name.replace("_core_", "_", 1)


def _unit_sources(unit):
    """(CUDA sources, C++ sources) of a unit."""
    cpp = [PRELUDE_SRC, HOST_SRC, HOST_RUN_SRC] if unit == "core" else ["// the kernels are in the .cu file\n"]
    return [PRELUDE_SRC, DEVICE_SRC] + _UNIT_CUDA[unit], cpp


def _unit_key(unit):
    """The hash in a unit's build name: its sources, flags, torch and arch. The core's also covers every
    other unit's sources: the core holds the table of attached units, so a second copy of this file with
    other kernels (a notebook cell re-run after an edit, an A/B copy) gets its own core and table instead
    of silently running the first copy's units (and its own operator namespace)."""
    cuda, cpp = _unit_sources(unit)
    others = [src for u in UNITS if u != "core" for src in _UNIT_CUDA[u]] if unit == "core" else []
    build = [" ".join(CUDA_FLAGS + _UNIT_GENCODE.get(unit, [])), torch.__version__, str(torch.version.cuda),
             _arch_list(), _ARCH_ENV, str(sorted(_LEAN))]
    key = "\n".join(cuda + cpp + others + build)
    return hashlib.sha1(key.encode()).hexdigest()[:12]


def _compile(unit):
    """The unit's library, compiled here unless an earlier build with the same key exists. Returns
    (module or None, path of the .so)."""
    arch = _arch_list()
    cuda, cpp = _unit_sources(unit)
    name = f"gated_recurrence_{unit}_{_unit_key(unit)}"
    root = os.environ.get("TORCH_EXTENSIONS_DIR") or os.path.join(
        os.path.expanduser("~"), ".cache", "torch_extensions", "gated_recurrence")
    build_dir = os.path.join(root, name)
    so_path = os.path.join(build_dir, name + ".so")
    if not os.path.exists(so_path):
        if _CUDA_HOME is None:
            raise RuntimeError("solution.py needs the CUDA toolkit to compile its kernels and found none (bin/nvcc "
                               "with include/cuda_runtime_api.h): set CUDA_HOME to its folder, e.g. /usr/local/cuda")
        os.makedirs(build_dir, exist_ok=True)
        targets = ", ".join("sm_" + a.replace(".", "") for a in re.split(r"[;\s]+", arch) if a) \
            if unit not in _UNIT_GENCODE else ", ".join(re.findall(r",code=(\w+)", " ".join(_UNIT_GENCODE[unit])))
        print(f"solution.py: compiling unit {unit} for {targets} "
              f"({'at import' if unit == 'core' else 'first use'}; once, cached in {build_dir})",
              file=sys.stderr, flush=True)
        if not torch.cuda.is_available():  # no device to query: torch reads the arch list from here
            os.environ.setdefault("TORCH_CUDA_ARCH_LIST", arch)
        # the core's operator namespace: its hashed name (not part of the key, which it is derived from)
        ops_ns = ["-DGR_OPS_NS=" + _ops_namespace(name)] if unit == "core" else []
        load_inline(name=name, cpp_sources=cpp, cuda_sources=cuda, extra_cflags=["-O3"] + ops_ns,
                    extra_cuda_cflags=CUDA_FLAGS + _UNIT_GENCODE.get(unit, []) + _split_compile_flags(),
                    build_directory=build_dir,
                    is_python_module=unit == "core", verbose=os.environ.get("GATED_RECURRENCE_VERBOSE_BUILD") == "1",
                    **_LEAN)
    if unit != "core":
        return None, so_path
    spec = importlib.util.spec_from_file_location(name, so_path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module, so_path


_core, _core_path = _compile("core")
_units = {"core": _core_path}  # unit -> path of its loaded library
_libraries = []                # ctypes handles of the chunk units, kept for the life of the process
# The registered operators (TORCH_LIBRARY in HOST_RUN_SRC): what torch.compile and torch.export trace.
_OPS_NS = _ops_namespace(os.path.basename(_core_path)[:-3])
_ops = getattr(torch.ops, _OPS_NS)


def _default_units():
    """What build() compiles without arguments: every unit, but the sm_90a units (_UNIT_GENCODE: chunk_sm90,
    backward_sm90, backward_sm90_fp32) only where they can run (a compute capability 9.0 device) or where no device
    says (a build or CI machine)."""
    hopper = not torch.cuda.is_available() or torch.cuda.get_device_capability() == (9, 0)
    return tuple(u for u in UNITS if u not in _UNIT_GENCODE or hopper)


def build(*units):
    """Compiles and loads the named units (by default every unit this machine can run: _default_units)
    now instead of at first use."""
    for unit in units or _default_units():
        if unit not in UNITS:
            raise ValueError(f"unit must be one of {UNITS}, got {unit!r}")
        if unit not in _units:
            _, path = _compile(unit)
            lib = ctypes.CDLL(path)
            entry = getattr(lib, f"gr_execute_{unit}")
            _core.attach(UNITS.index(unit), ctypes.cast(entry, ctypes.c_void_p).value)
            _libraries.append(lib)
            _units[unit] = path


def built_units():
    """The units loaded in this process."""
    return tuple(_units)


def _unit_paths():
    """unit -> path of its loaded library (tests read the symbols)."""
    return dict(_units)


# ---------------------------------------------------------------------------------------------
# Functional API and the KernelBench module.
# ---------------------------------------------------------------------------------------------
_ERRORS = {"ValueError": ValueError, "TypeError": TypeError, "RuntimeError": RuntimeError,
           "NotImplementedError": NotImplementedError}
NUMERICS = ("accurate", "reference")


def _reference(numerics):
    """numerics as the core's flag: True for "reference", False for "accurate"."""
    if numerics == "accurate":
        return False
    if numerics == "reference":
        return True
    raise ValueError(f"numerics must be 'accurate' or 'reference', got {numerics!r}")


_AUTOGRAD = object()  # _call's answer when a dense call records autograd: the caller takes the registered operators


def _call(fn, *args):
    """fn(*args) from the core; None (or []) means refused: raise what it reports, or build the unit
    the plan needs and call again; _AUTOGRAD where the call records autograd (the core checks that anyway)."""
    out = fn(*args)
    if out is None or (isinstance(out, list) and not out):
        kind, _, msg = _core.last_error().partition(": ")
        if kind == "NeedAutograd":
            return _AUTOGRAD
        if kind != "NeedUnit":
            raise _ERRORS[kind](msg)
        build(msg)
        return _call(fn, *args)
    return out


def _require_tensors(required, optional=()):
    """Before a registered operator (torch.ops turns None into an undefined tensor and refuses floats as
    RuntimeError): a TypeError naming the first (value, name) that is not a tensor (optional ones may be None)."""
    for x, name in list(required) + [(x, name) for x, name in optional if x is not None]:
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")


def _needs_grad(*xs):
    """Whether a call records autograd: grad mode on and a tensor argument that requires grad."""
    return torch.is_grad_enabled() and any(isinstance(x, torch.Tensor) and x.requires_grad for x in xs)


def _eager_cuda(x):
    """x is a real CUDA tensor outside any trace, so the core may read it (forward_ready, backward_ready). Not
    while Dynamo traces, nor while AOT autograd traces a backward formula (where x is a FunctionalTensor or a
    FakeTensor, whatever is_compiling() says): the fakes build the units there."""
    return not torch.compiler.is_compiling() and type(x) in (torch.Tensor, torch.nn.Parameter) and x.device.type == "cuda"


def _traced_call(q, k, v, gate, beta, initial_state, output_final_state, numerics, kernel="", config=()):
    """gated_recurrence through the registered operators: for torch.compile and torch.export, and for autograd
    (their registered backward); eagerly the unit the call needs is built first (the operator cannot)."""
    reference = _reference(numerics)
    _require_tensors(((q, "q"), (k, "k"), (v, "v"), (gate, "gate"), (beta, "beta")), ((initial_state, "initial_state"),))
    config = [int(x) for x in config]
    if _eager_cuda(q):  # the unit this call's plan needs (its own
        _call(_core.forward_ready, q, k, v, gate, beta, initial_state, kernel, config, reference)  # layout)
    if initial_state is None and not output_final_state and not kernel and not config:
        return _ops.forward(q, k, v, gate, beta, reference)
    out = _ops.forward_ex(q, k, v, gate, beta, initial_state, bool(output_final_state), kernel, config, reference)
    return (out[0], out[1]) if output_final_state else out[0]


def _prepare_units(q, v, reference):
    """At trace time (the fake implementations run there, not per call): build the units the call's plan
    may need, since the compiled graph calls the operator, which cannot build one itself. The plan of
    contiguous inputs, and where that is chunk_sm90 also the dtype's mma.sync chunk unit (a layout TMA cannot
    describe takes it); symbolic sizes: the chunk units of long sequences at these widths. Arguments the
    operator will refuse are left to it (its message names them)."""
    if q.device.type != "cuda" or q.dim() != 4 or v.dim() != 4 or str(q.dtype)[6:] not in _DTYPE_CODES:
        return
    dk, dv = (d if isinstance(d, int) else 64 for d in (q.shape[3], v.shape[3]))
    if not 1 <= dk <= 256 or not 1 <= dv <= 256:
        return
    dims = tuple(q.shape) + (v.shape[3],)
    if reference:
        plans = [(1, 1, 1, dk, dv)]
    elif all(isinstance(d, int) for d in dims):
        plans = [dims, (1, 4096, 1, dk, dv)]
    else:
        plans = [(2, 4096, 1, dk, dv), (1, 4096, 1, dk, dv)]
    units = {"reference"} if reference else {re.search(r"unit (\w+)", plan(*d, q.dtype)).group(1) for d in plans}
    if not reference and "chunk_sm90" not in units:  # the extra mma.sync plan only backs up chunk_sm90
        units = {re.search(r"unit (\w+)", plan(*plans[0], q.dtype)).group(1)}
    for unit in sorted(units - set(_units)):
        build(unit)


def _register_fake(qualname):
    """torch.library.register_fake that survives a second load of this file in one process (eval.py loads
    it beside an imported copy; a notebook re-runs an unchanged cell): the same source is the same
    namespace, whose fake implementation the newer load replaces (torch 2.11 refuses that by default)."""
    return torch.library.register_fake(qualname, allow_override=True)


@_register_fake(f"{_OPS_NS}::forward")
def _forward_fake(q, k, v, gate, beta, reference):
    return _fake_y(q, k, v, gate, beta, reference, None)


def _fake_y(q, k, v, gate, beta, reference, initial_state):
    """The forward operators' y at trace time, with the units the call needs built."""
    _prepare_units(q, v, reference)
    y = q.new_empty((q.shape[0], q.shape[1], q.shape[2], v.shape[3]))
    # Dynamo's trace, where inputs carry requires_grad: a backward may follow, so its units are built now. The
    # backward's own fake may never run: AOT autograd's cache can answer a second process without tracing it.
    if any(x is not None and x.requires_grad for x in (q, k, v, gate, beta, initial_state)):
        _prepare_backward(y, k)
    return y


@_register_fake(f"{_OPS_NS}::forward_ex")
def _forward_ex_fake(q, k, v, gate, beta, initial_state, want_final, kernel, config, reference):
    y = _fake_y(q, k, v, gate, beta, reference, initial_state)
    if not want_final:
        return [y]
    return [y, q.new_empty((q.shape[0], q.shape[2], q.shape[3], v.shape[3]), dtype=torch.float32)]


# ---------------------------------------------------------------------------------------------
# Autograd: forward and forward_ex carry a registered backward (the backward operator: chunk_bwd, or
# recurrent_bwd with dq by a forward plan). Only the inputs are saved; the backward recomputes the states.
# ---------------------------------------------------------------------------------------------
def _prepare_backward(dy, k):
    """The units a backward needs, built before its operator runs (eagerly, or at trace time in the fake):
    backward, every unit that the plan of contiguous inputs of this shape names (backward_sm90, backward_sm90_fp32
    and its checkpoints' chunk_sm90), and where dq is a forward plan (dy, v, k) that plan's unit."""
    if dy.device.type != "cuda":
        return
    if "backward" not in _units:
        build("backward")
    dims = tuple(dy.shape[:3]) + (k.shape[-1], dy.shape[-1]) if dy.dim() == 4 and k.dim() == 4 else None
    text = "" if dims is None or not all(isinstance(d, int) for d in dims) or str(dy.dtype)[6:] not in _DTYPE_CODES \
        or not 1 <= min(dims[3:]) <= max(dims[3:]) <= 256 else plan_backward(*dims, dy.dtype)
    for unit in re.findall(r"unit (\w+)", text):  # the backward's, and chunk_sm90 where it writes checkpoints
        if unit not in _units:
            build(unit)
    if "dq: in chunk_bwd" not in text:
        _prepare_units(dy, k, False)


@_register_fake(f"{_OPS_NS}::backward")
def _backward_fake(dy, dfinal, q, k, v, gate, beta, initial_state):
    _prepare_backward(dy, k)
    ds0 = q.new_empty(initial_state.shape if initial_state is not None else (0,), dtype=torch.float32)
    return [q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape), gate.new_empty(gate.shape),
            beta.new_empty(beta.shape), ds0]


def _backward_call(dy, dfinal, q, k, v, gate, beta, initial_state):
    """The backward operator (traceable): (dq, dk, dv, dgate, dbeta, dS_0 or None)."""
    if _eager_cuda(dy):  # the units this call's plans need (its
        _call(_core.backward_ready, dy, dfinal, q, k, v, gate, beta, initial_state)  # own layouts), built if missing
    out = _ops.backward(dy, dfinal, q, k, v, gate, beta, initial_state)
    return tuple(out[:5]) + (out[5] if initial_state is not None else None,)


def _setup_forward(ctx, inputs, output):
    ctx.save_for_backward(*inputs[:5])
    ctx.set_materialize_grads(False)  # an unused output's gradient stays None (no zeros, no work on them)


def _forward_backward(ctx, dy):
    if dy is None:
        return (None,) * 6
    return _backward_call(dy, None, *ctx.saved_tensors, None)[:5] + (None,)


def _setup_forward_ex(ctx, inputs, output):
    ctx.save_for_backward(*inputs[:6])
    ctx.set_materialize_grads(False)
    # the gradient of config must mirror its structure: torch's tensor-list support reads [] as an empty
    # list of tensors (a node, given the gradient []), any other list of ints as one leaf (None)
    ctx.config_grad = [] if len(inputs[8]) == 0 else None


def _forward_ex_backward(ctx, *grads):
    """grads: the gradients of [y] or [y, S_T] (a list for the Tensor[] output); None where unused."""
    if len(grads) == 1 and isinstance(grads[0], (list, tuple)):
        grads = grads[0]
    q, k, v, gate, beta, initial_state = ctx.saved_tensors
    dfinal = grads[1] if len(grads) > 1 else None
    if grads[0] is None and dfinal is None:
        return (None,) * 8 + (ctx.config_grad, None)
    dy = grads[0] if grads[0] is not None else q.new_zeros(q.shape[:3] + v.shape[3:])  # only S_T in the loss
    return _backward_call(dy, dfinal, q, k, v, gate, beta, initial_state) + (None, None, ctx.config_grad, None)


_NO_DOUBLE_BACKWARD = "gated_recurrence: no double backward (create_graph=True through its backward)"


def _no_double_backward(ctx, *grads):
    raise NotImplementedError(_NO_DOUBLE_BACKWARD)


# Eager autograd on Hopper (forward_checkpoints): the forward writes the backward's chunk-start states, held from
# the forward to the backward (bfloat16 q: twice q's bytes; beside a float32 gate, four times; float32 q: twice). False: nothing beyond
# the inputs is held, and the backward forms them itself (one more launch, during the backward only).
FORWARD_CHECKPOINTS = True


class _EagerGrad(torch.autograd.Function):
    """Eager calls that record autograd on CUDA tensors: the pybind entry points both ways. This skips torch's
    custom-op autograd machinery, most of a small training step's host time (perf-notes, seventeenth session).
    torch.compile traces the registered operators and their formulas (_traced_call) instead; both backwards
    run the same kernels. Saved: the inputs, and where the core's plans allow them (forward_checkpoints in
    HOST_RUN_SRC) the backward's checkpoints written by the forward (the state at every 64-step chunk start,
    (B H, chunks, 128 * 128 + 16) float16, S scaled a 16-column block and its 8 inverse scales, or (B H, chunks,
    128, 128) float32 beside a float32 gate; float32 q: (B H, chunks, 128 * 128 + 8), S and 8 maxima of |S|), so
    that the backward skips its checkpoint launch."""

    @staticmethod
    def forward(ctx, q, k, v, gate, beta, initial_state, want_final, reference, kernel, config):
        ctx.set_materialize_grads(False)  # an unused output's gradient stays None (no zeros, no work on them)
        # the checkpoints are asked for only where a gradient will be formed (and only of the CUDA core: a
        # stand-in core on the CPU takes the plain arguments)
        ckpt = FORWARD_CHECKPOINTS and q.is_cuda and any(ctx.needs_input_grad[:6])
        out = _call(_core.forward_ex, q, k, v, gate, beta, initial_state, want_final, kernel, config, reference,
                    *((True,) if ckpt else ()))
        ckpt = out[-1] if ckpt and out[-1].numel() > 0 else None  # (empty: this forward's plan writes none)
        ctx.save_for_backward(q, k, v, gate, beta, initial_state, ckpt)  # (saved-tensor hooks see the checkpoints)
        return (out[0], out[1]) if want_final else out[0]

    @staticmethod
    def backward(ctx, dy, dfinal=None):
        q, k, v, gate, beta, initial_state, ckpt = ctx.saved_tensors
        if dy is None and dfinal is None:
            return (None,) * 10
        if dy is None:  # only S_T in the loss
            dy = q.new_zeros(q.shape[:3] + v.shape[3:])
        out = _call(_core.backward, dy, dfinal, q, k, v, gate, beta, initial_state, "", 0,
                    *((ckpt,) if ckpt is not None else ()))
        grads = tuple(out[:5]) + (out[5] if initial_state is not None else None,)
        if torch.is_grad_enabled():  # create_graph=True: a second gradient through these refuses
            grads = _Refuse.apply(q, k, v, gate, beta, initial_state, *grads)
        return tuple(grads) + (None,) * 4


class _Refuse(torch.autograd.Function):
    """The gradients of _EagerGrad under create_graph=True, unchanged, attached to its six saved inputs (so they
    record a node when any of those requires grad); that node's backward refuses."""

    @staticmethod
    def forward(ctx, q, k, v, gate, beta, initial_state, *grads):
        return tuple(g if g is None else g.view_as(g) for g in grads)

    @staticmethod
    def backward(ctx, *grads):
        raise NotImplementedError(_NO_DOUBLE_BACKWARD)


def _autograd_call(q, k, v, gate, beta, initial_state, output_final_state, numerics, kernel="", config=()):
    """A dense call that records autograd: _EagerGrad on plain CUDA tensors, else the operators (_traced_call:
    meta tensors, tensor subclasses)."""
    if all(x is None or _eager_cuda(x) for x in (q, k, v, gate, beta, initial_state)):
        return _EagerGrad.apply(q, k, v, gate, beta, initial_state, bool(output_final_state), _reference(numerics),
                                kernel or "", [int(x) for x in config])
    return _traced_call(q, k, v, gate, beta, initial_state, output_final_state, numerics, kernel, config)


def _no_varlen_backward(ctx, *grads):
    raise NotImplementedError("gated_recurrence with cu_seqlens has no backward yet (forward only)")


def _setup_nothing(ctx, inputs, output):
    return None


# Once a process: a second load of this file (eval.py beside an imported copy, a re-run notebook cell) has the
# same source, so the same namespace and the same backward, which torch refuses to register twice. The
# backward operator and forward_varlen get formulas that refuse (without one, torch would only warn and
# leave the gradients out: in compiled graphs the C++ grad check does not see requires_grad).
for _name, _bwd, _setup in (("forward", _forward_backward, _setup_forward),
                            ("forward_ex", _forward_ex_backward, _setup_forward_ex),
                            ("backward", _no_double_backward, _setup_nothing),
                            ("forward_varlen", _no_varlen_backward, _setup_nothing)):
    if not torch._C._dispatch_has_kernel_for_dispatch_key(f"{_OPS_NS}::{_name}", "Autograd"):
        torch.library.register_autograd(f"{_OPS_NS}::{_name}", _bwd, setup_context=_setup)


def _backward_with(dy, dfinal, q, k, v, gate, beta, initial_state=None, kernel=None, segments=None):
    """Test and benchmark hook: the backward alone, eagerly: (dq, dk, dv, dgate, dbeta, dS_0 or None) of
    <y, dy> + <S_T, dfinal> (dfinal None: the final state unused); kernel "chunk_bwd", "chunk_bwd_sm90",
    "chunk_bwd_sm90_fp32" or "recurrent_bwd" (None: planned); segments: chunk_bwd's segments a (b, h) sequence (None: planned)."""
    out = _call(_core.backward, dy, dfinal, q, k, v, gate, beta, initial_state, kernel or "", int(segments or 0))
    return tuple(out[:5]) + (out[5] if initial_state is not None else None,)


def gated_recurrence(q, k, v, gate, beta, initial_state=None, output_final_state=False, numerics="accurate",
                     cu_seqlens=None, max_seqlen=None, cu_seqlens_cpu=None):
    """y (B, T, H, D_v) of the gated recurrence, in q's dtype. See the module docstring.

    initial_state: optional (B, H, D_k, D_v) float32 state S_0 (default zero). With
    output_final_state=True the result is (y, S_T), S_T a new float32 (B, H, D_k, D_v) tensor.
    numerics: "accurate" (fp32 arithmetic, y rounded once to the input dtype) or "reference" (the
    PyTorch loop's rounding in the input dtype, one step at a time: what reference.py's Model computes
    in float16 or bfloat16).
    Differentiable (autograd) in q, k, v, gate, beta and initial_state, through y and S_T: each gradient in
    its input's dtype; the backward recomputes the states from the inputs (eagerly on Hopper, where the plans
    allow, the forward also saves the state at every 64-step chunk start for it: B*H*ceil(T/64)*D_k*D_v
    elements, scaled float16 or beside a float32 gate float32; FORWARD_CHECKPOINTS = False turns this off).

    Variable-length (packed) sequences: cu_seqlens, int32 or int64 (N + 1,) on q's device, 0 first,
    non-decreasing, T_total last; q, k, v packed as (1, T_total, H, D), gate and beta as (1, T_total, H);
    sequence n is steps cu_seqlens[n] .. cu_seqlens[n + 1] - 1, from initial_state[n] ((N, H, D_k, D_v))
    or zero, its final state S[n] of (N, H, D_k, D_v) (an empty sequence's: its initial state). Host hints,
    as serving stacks hold them: max_seqlen (the longest sequence; plans only: a value too small stays
    exact) and cu_seqlens_cpu (a CPU copy, whose values are checked). With either, the call never waits
    on the GPU (CUDA-graph capturable); cu_seqlens' values are then not checked on the device: offsets are
    clamped into the packed row (no access out of bounds), y and the states of bad offsets unspecified.
    With neither, cu_seqlens is copied to the host once (a synchronization) and checked there.
    Forward only (no backward for packed sequences yet).
    """
    if cu_seqlens is not None or max_seqlen is not None or cu_seqlens_cpu is not None:  # (hints alone: refused there)
        return _gated_recurrence_with(q, k, v, gate, beta, None, (), initial_state, output_final_state, numerics,
                                      cu_seqlens, max_seqlen, cu_seqlens_cpu)
    if torch.compiler.is_compiling():  # traced: the registered operators (eager keeps the cheaper pybind calls)
        return _traced_call(q, k, v, gate, beta, initial_state, output_final_state, numerics)
    if initial_state is None and not output_final_state:
        y = _call(_core.forward, q, k, v, gate, beta, _reference(numerics))
        # recording autograd (the core found an input that requires grad): the operators, with their backward
        return y if y is not _AUTOGRAD else _autograd_call(q, k, v, gate, beta, None, False, numerics)
    return _gated_recurrence_with(q, k, v, gate, beta, None, (), initial_state, output_final_state, numerics)


def _max_seqlen_code(max_seqlen):
    """max_seqlen as the core's int (-1: no hint)."""
    if max_seqlen is None:
        return -1
    if isinstance(max_seqlen, bool) or not isinstance(max_seqlen, int):
        raise TypeError(f"max_seqlen must be an int or None, got {type(max_seqlen).__name__}")
    if max_seqlen < 0:
        raise ValueError(f"max_seqlen must be >= 0, got {max_seqlen}")
    return max_seqlen


def _varlen_call(q, k, v, gate, beta, kernel, config, initial_state, output_final_state, numerics, cu_seqlens,
                 max_seqlen, cu_seqlens_cpu):
    """gated_recurrence with cu_seqlens: the pybind function eagerly, the registered operator traced."""
    args = (cu_seqlens, initial_state, bool(output_final_state), _max_seqlen_code(max_seqlen), cu_seqlens_cpu,
            kernel or "", [int(x) for x in config], _reference(numerics))
    if torch.compiler.is_compiling():
        _require_tensors(((q, "q"), (k, "k"), (v, "v"), (gate, "gate"), (beta, "beta"), (cu_seqlens, "cu_seqlens")),
                         ((initial_state, "initial_state"), (cu_seqlens_cpu, "cu_seqlens_cpu")))
        return _ops.forward_varlen(q, k, v, gate, beta, *args)
    return _call(_core.forward_varlen, q, k, v, gate, beta, *args)


def _gated_recurrence_with(q, k, v, gate, beta, kernel=None, config=(), initial_state=None,
                           output_final_state=False, numerics="accurate", cu_seqlens=None, max_seqlen=None,
                           cu_seqlens_cpu=None):
    """Test and benchmark hook: a chosen kernel ("recurrent", "parallel", "chunked" (the planned chunk
    kernel), "chunk_tf32", "chunk_bf16") and configuration ((R, G, JB, TC) for recurrent, (NV,) for
    parallel, (NV, segments) for the chunk kernels, () for the planned one); cu_seqlens and its hints as
    gated_recurrence's."""
    if kernel is not None and not isinstance(kernel, str):
        raise TypeError(f"kernel must be a string or None, got {type(kernel).__name__}")
    if cu_seqlens is not None:
        out = _varlen_call(q, k, v, gate, beta, kernel, config, initial_state, output_final_state, numerics,
                           cu_seqlens, max_seqlen, cu_seqlens_cpu)
    else:
        if max_seqlen is not None or cu_seqlens_cpu is not None:
            raise ValueError("max_seqlen and cu_seqlens_cpu are hints for cu_seqlens, which is None")
        out = _call(_core.forward_ex, q, k, v, gate, beta, initial_state, bool(output_final_state), kernel or "",
                    [int(x) for x in config], _reference(numerics))
        if out is _AUTOGRAD:  # recording autograd
            return _autograd_call(q, k, v, gate, beta, initial_state, output_final_state, numerics, kernel or "", config)
    return (out[0], out[1]) if output_final_state else out[0]


@_register_fake(f"{_OPS_NS}::forward_varlen")
def _forward_varlen_fake(q, k, v, gate, beta, cu_seqlens, initial_state, want_final, max_seqlen, cu_seqlens_cpu,
                         kernel, config, reference):
    if q.device.type == "cuda":  # at trace time: the dtype's varlen chunk unit (or the reference one)
        unit = "reference" if reference else re.search(r"unit (\w+)", plan(1, 4096, 1, 64, 64, q.dtype, varlen=True)).group(1)
        if unit not in _units:
            build(unit)
    y = q.new_empty((q.shape[0], q.shape[1], q.shape[2], v.shape[3]))
    if not want_final:
        return [y]
    return [y, q.new_empty((cu_seqlens.shape[0] - 1, q.shape[2], q.shape[3], v.shape[3]), dtype=torch.float32)]


@_register_fake(f"{_OPS_NS}::decode_")
def _decode_fake(q, k, v, gate, beta, state_pool, state_indices):
    if q.device.type == "cuda" and "decode" not in _units:  # at trace time: the compiled graph cannot build it
        build("decode")
    return q.new_empty((q.shape[0], q.shape[1], q.shape[2], v.shape[3]))


def gated_recurrence_decode_(q, k, v, gate, beta, state_pool, state_indices=None):
    """The decode step, in place: advances every batch row T steps (T >= 1: one token, or several for
    speculation) from its state in a pool, writes the state back, returns y (B, T, H, D_v) in q's dtype.

    state_pool: (P, H, D_k, D_v) float32 on q's device, any strides without self-overlap; row b's state is
    state_pool[state_indices[b]] (without state_indices: state_pool[b], and P must equal B). state_indices:
    (B,) int32 or int64 on q's device, read there (no host synchronization; CUDA-graph capturable; the only
    allocation is y). -1 marks a padded row: its y rows are zeros and no slot is touched. Any other index
    outside 0..P-1 gives NaN y rows and touches nothing. Two rows naming one slot are a usage error: the
    lowest row runs and keeps the slot, every later one gets NaN y rows and writes nothing. Slots not
    named are never read or written.
    Numerics: fp32, the recurrent kernel's update (the state is bitwise what gated_recurrence's recurrent
    kernel leaves from the same initial state; one call of T steps equals T calls of one, bitwise).
    Forward only. Long prompts belong to gated_recurrence (initial_state=..., output_final_state=True), whose
    final state then goes into the pool.
    """
    if torch.compiler.is_compiling():
        _require_tensors(((q, "q"), (k, "k"), (v, "v"), (gate, "gate"), (beta, "beta"), (state_pool, "state_pool")),
                         ((state_indices, "state_indices"),))
        # the C++ check does not see requires_grad in a compiled graph (and decode_ has no autograd formula)
        for x, name in ((q, "q"), (k, "k"), (v, "v"), (gate, "gate"), (beta, "beta"), (state_pool, "state_pool")):
            if _needs_grad(x):
                raise NotImplementedError(f"{name} requires grad, but gated_recurrence_decode_ has no backward (forward "
                                          "only): call it under torch.no_grad() or give it detached tensors")
        return _ops.decode_(q, k, v, gate, beta, state_pool, state_indices)
    return _call(_core.decode_, q, k, v, gate, beta, state_pool, state_indices, 0, -1)


def _persistent_code(persistent):
    return -1 if persistent is None else int(bool(persistent))


def _decode_with(q, k, v, gate, beta, state_pool, state_indices=None, nv=0, persistent=None):
    """Test and benchmark hook: the decode step with a chosen kernel: decode_kernel's column tile (nv = 32
    or 128; 0: planned) or decode_persistent forced on (True) or off (False); None: planned."""
    return _call(_core.decode_, q, k, v, gate, beta, state_pool, state_indices, int(nv), _persistent_code(persistent))


_DTYPE_CODES = {"float32": 0, "float16": 1, "bfloat16": 2}


def plan(B, T, H, Dk, Dv, dtype="float32", numerics="accurate", varlen=False):
    """The launch the dispatch picks for contiguous inputs of this shape and dtype (a torch dtype or
    its name), as text: kernel, source constant, unit, configuration, grid and shared memory. Gate and
    beta in that dtype: float32 gates beside 16-bit inputs take the parallel kernel's run-time
    instantiation where this says "compiled". varlen: a cu_seqlens call of B sequences, the longest T."""
    return _plan_on(B, T, H, Dk, Dv, dtype, numerics=numerics, varlen=varlen)


def plan_backward(B, T, H, Dk, Dv, dtype="float32", kernel=None, segments=None):
    """The backward's launches for contiguous inputs of this shape and dtype, as text: the backward kernel's
    record, then "dq: " and where dq comes from (chunk_bwd itself, or for recurrent_bwd a forward plan with
    (dy, v, k): D_k and D_v swapped). kernel, segments: as _backward_with's."""
    return _call(lambda *a: _core.plan_backward(*a) or None, int(B), int(T), int(H), int(Dk), int(Dv),
                 _dtype_code(dtype), kernel or "", int(segments or 0))


def plan_decode(B, T, H, Dk, Dv, dtype="float32", nv=0, persistent=None):
    """The decode step's launch for this shape and input dtype, with a contiguous pool, as text (nv and
    persistent: a forced kernel, as _decode_with)."""
    return _call(lambda *a: _core.plan_decode(*a) or None, int(B), int(T), int(H), int(Dk), int(Dv), _dtype_code(dtype),
                 int(nv), _persistent_code(persistent))


def _dtype_code(dtype):
    name = str(dtype).replace("torch.", "")
    if name not in _DTYPE_CODES:
        raise ValueError(f"dtype must be float32, float16 or bfloat16, got {dtype!r}")
    return _DTYPE_CODES[name]


def _plan_on(B, T, H, Dk, Dv, dtype="float32", sms=0, smem=0, arch=0, numerics="accurate", varlen=False):
    """plan() for a device with these limits (SM count, opt-in shared memory a block, 10 * major +
    minor), or this one with zeros: tests check that each GPU family's plans fit it."""
    return _call(lambda *a: _core.plan(*a) or None, int(B), int(T), int(H), int(Dk), int(Dv), _dtype_code(dtype),
                 int(sms), int(smem), int(arch), _reference(numerics), bool(varlen))


class ModelNew(torch.nn.Module):
    """KernelBench's Model, on gated_recurrence.

    numerics=None (the default) computes what Model computes in the inputs' dtype: float16 and
    bfloat16 inputs get Model's own rounding ("reference"), float32 inputs the accurate kernels (which
    agree with Model's float32 loop to its own rounding). float32 gate or beta beside 16-bit q, k, v
    (Model's loop then promotes its state to float32) also get "accurate", with y in q's dtype.
    "accurate" or "reference" forces one.
    """

    def __init__(self, numerics=None):
        super().__init__()
        if numerics is not None:
            _reference(numerics)
        self.numerics = numerics

    def forward(self, q, k, v, gate, beta):
        numerics = self.numerics
        if numerics is None:
            # one 16-bit float dtype (other 16-bit dtypes are refused by the argument checks either way)
            dt = q.dtype if isinstance(q, torch.Tensor) and q.dtype.itemsize == 2 else None
            numerics = "reference" if dt is not None and getattr(gate, "dtype", dt) == dt and \
                getattr(beta, "dtype", dt) == dt else "accurate"
        return gated_recurrence(q, k, v, gate, beta, numerics=numerics)
