"""CPU emulation of chunk_bwd_sm90 (bf16, C = 64, D_k = D_v = 128) with the state gradient G checkpointed in bf16
(docs/bwd-redesign-s36.md, stage S0: sections 3, 4 "Accuracy of bf16 ckptG", 5).

What it emulates: the bf16 kernel's backward, a chunk at a time as in solution.py's consumer()/dgate_m/dgate_dbeta
(naive.chunked_backward_naive's equations):
- inputs q, k, v, dy, gate, beta are bf16 values (reference.make_inputs, dtype bfloat16; gate classes as
  tests/test_backward_sm90.py draws them, uniform in float32 then rounded to bf16); S_0 and dS_T float32;
- the checkpoints S at chunk starts: the float64 forward's state (float32) in the kernel's format (--ckpt, checkpoint():
  f16, fp16 scaled a 16-column block since the thirty-ninth session; bf16 before, which put dgate past its bar at
  T = 2048-4096 with gates of 1 and above 1; f32);
- tables (L, A, Ah, w, Lx) from float64 products of the (bf16) gates, each rounded once to float32; beta w in fp32;
- every product through mm(): per k16 step and per split term, the exact partial added to a float32 accumulator
  (RN), terms in the kernel's order; an operand of n terms is hi = RN_bf16(x) (n = 1) plus lo = RN_bf16(x - hi)
  (n = 2); a pair of 2-term operands gives hi.hi + hi.lo + lo.hi;
- elementwise work (masks, weights, diag scalings, row dots f, e, c0, dbeta, dgate's sums) in float32;
- outputs dq, dk, dv, dgate, dbeta rounded to bf16 (the kernel's stores); dS_0 float32.
Products and their terms (docs/bwd-redesign-s36.md 1.2): R^T = S dY^T, QK, Dd, dgate's other X: 1 (exact bf16);
dq^T += K^T MQ^T, dkt^T += Q^T MD, dv += MP^T dY: weights W terms; M = E Lx^T: E x Lx (E terms x LX terms);
Rk^T = G V^T, KG = K G: G terms, c0 = sum S o G with G as hi + lo (2) or bf16(G) (1);
G <- A_63 G + (diag(A) Q)^T dY: (Q A) hi / lo, 2 terms, G float32 across chunks (pass A: every variant).
Variants (G products, c0's G, weights W, Lx, E terms):
  T    today's kernel: 2, 2, 2, 2, 2 (fp32 G, hi / lo G products) - the baseline, validates the emulation
  A    bf16 ckptG: G rounded to bf16 at every chunk boundary, single-term G products and c0: 1, 1, 2, 2, 2
  B'   A plus single-term weights (MP, MQ, MD) and Lx: 1, 1, 1, 1, 2
  B1   (extra) B' plus single-term E: every product single-term
  Ac0  (diagnostic) A with c0 from fp32 G (G products single-term): 1, 2, 2, 2, 2
  X    (check) everything float64, nothing rounded: equals the reference to ~1e-15 (the wiring)
Reference: naive.recurrent_backward_naive (float64 reverse loop; --ref chunked: naive.chunked_backward_naive, C = 64,
the same to ~1e-15 and faster) on the same bf16-rounded inputs. Bar (tests/test_backward.py grad_tol): 2
relL2(bf16(g64), g64) + 1e-6 for each of dq, dk, dv, dgate, dbeta (dS_0, float32, is reported for information: its
bar is 1e-5, and pass A makes it the same in every variant). GO for a variant if every gradient's err / bar <= 0.85
(--go) in every case; the summary also counts the cases over it where T (today) is not, and the largest rise of
err / bar over T's on the same draw.

Run from the repository root (CPU only; the defaults take about 35 s on 2 cores):
  python3 dev/bwd_ckptg_emulation.py [--T 256,1024,4096] [--BH 2] [--BH-long 1] [--long 4096]
      [--gates sigmoid,zero,negative,above1,near1,mixed-sign,near1w] [--states none,both]
      [--variants T,A,B'] [--ref loop|chunked] [--seed 0] [--seeds 1] [--go 0.85] [--ckpt f16|bf16|f32]
--BH: B H (B = 1) of a case; --BH-long: B H for T >= --long. --seeds N: N draws of each case. Gate classes:
sigmoid (reference.make_inputs), zero 0, one 1, negative U(-1, 0), above1 U(1, 1.05), above1s U(1, 1.02) (T = 4096
stays in range), near1 U(1 - 1e-3, 1 + 1e-3) (every
gate exactly 1.0 once in bf16), mixed-sign U(-1.2, 1.2), near1w U(0.99, 1.0) (bf16: 0.9921875, 0.99609375, 1). A
case whose float64 gradients pass bf16's range (above1 at T = 4096) is skipped and named. States: none (no S_0, no
dS_T) or both (S_0 and dS_T ~ N(0, 1), float32). Output: one markdown row per case and variant (err / bar = ratio),
then the summary and the verdict.
"""
import argparse
import sys
import time

import torch

sys.path.insert(0, ".")
import naive  # noqa: E402
import reference  # noqa: E402

torch.set_grad_enabled(False)
C = 64
NAMES = ("dq", "dk", "dv", "dgate", "dbeta")
# (G products, c0's G, weights, Lx, E) terms; None: float64, nothing rounded
VARIANTS = {"T": (2, 2, 2, 2, 2), "A": (1, 1, 2, 2, 2), "B'": (1, 1, 1, 1, 2), "B1": (1, 1, 1, 1, 1),
            "Ac0": (1, 2, 2, 2, 2), "X": None}
GATES = {"sigmoid": None, "zero": 0.0, "one": 1.0, "negative": (-1.0, 0.0), "above1": (1.0, 1.05), "above1s": (1.0, 1.02),
         "near1": (1 - 1e-3, 1 + 1e-3), "mixed-sign": (-1.2, 1.2), "near1w": (0.99, 1.0)}


class Num:
    """The arithmetic of one variant: float32 with bf16 operands, or (exact) float64 with nothing rounded."""

    def __init__(self, exact):
        self.exact = exact
        self.f = torch.float64 if exact else torch.float32

    def r32(self, x):  # a float32 result
        return x.to(self.f)

    def bf(self, x):  # rounded to bf16 (an operand term or a stored output)
        return x.to(self.f) if self.exact else x.to(torch.bfloat16).to(torch.float32)

    def split(self, x, n):
        if self.exact or n == 1:
            return [self.bf(x)]
        h = self.bf(x)
        return [h, self.bf(x - h)]

    def mm(self, a, b, na=1, nb=1, acc=None):
        """acc + a (..., M, K) @ b (..., K, N) the wgmma way: per k16 step, terms hi.hi, hi.lo, lo.hi (i + j <= 1)
        of the split operands, each exact partial added to the float32 accumulator (RN)."""
        out = torch.zeros(*a.shape[:-1], b.shape[-1], dtype=self.f) if acc is None else acc.to(self.f).clone()
        if self.exact:
            return out + a.double() @ b.double()
        ap, bp = self.split(a, na), self.split(b, nb)
        pairs = [(i, j) for i in range(len(ap)) for j in range(len(bp)) if i + j <= 1]
        for k0 in range(0, a.shape[-1], 16):
            for i, j in pairs:
                p = ap[i][..., k0:k0 + 16].double() @ bp[j][..., k0:k0 + 16, :].double()
                out = (out.double() + p).float()
        return out


def tables(g64, num):
    """L[t][s] = prod_{r=s+1..t} g_r (s <= t), A[t] = prod_{r<=t} g_r, w[s] = L[C-1][s], Ah[t] = A[t-1] (Ah[0] = 1),
    Lx[t][s] = L[t-1][s] (s < t): float64 running products, each rounded once."""
    L = naive.decay_matrix(g64)
    A = torch.cumprod(g64, -1)
    w = L[..., -1, :]
    Ah = torch.cat([torch.ones_like(A[..., :1]), A[..., :-1]], -1)
    Lx = torch.zeros_like(L)
    Lx[..., 1:, :] = L[..., :-1, :]
    Lx = Lx * torch.ones(C, C, dtype=torch.float64).tril(-1)
    return [num.r32(x) for x in (L, A, w, Ah, Lx)]


CKPT = "f16"  # the S checkpoints' format (--ckpt)


def checkpoint(S, num):
    """(c0's S, R^T's S) from a float32 checkpoint S as the kernel holds it: f16 (since the thirty-ninth session)
    fp16 of S 2^s, 2^s a power of two a 16-column block (its largest |S| below 2^14), back in float32 for c0 and
    rounded to bf16 for R^T; bf16 (before): S rounded to bf16 for both; f32 (a float32 gate's): S, R^T hi / lo."""
    if num.exact or CKPT == "f32":
        return S, S
    if CKPT == "bf16":
        return num.bf(S), num.bf(S)
    blocks = S.unflatten(-1, (8, 16))
    e = (torch.frexp(blocks.abs().amax(dim=(-3, -1), keepdim=True)).exponent + 126).clamp_min(15)
    scale = torch.exp2((140 - e).float())
    f = ((blocks * scale).half().float() / scale).flatten(-2)
    return f, num.bf(f)


def emulated_backward(q, k, v, gate, beta, dy, s0, dsT, variant):
    """(dq, dk, dv, dgate, dbeta, dS_0) of the emulated kernel. Inputs (B, T, H, ...) holding bf16 values; s0, dsT
    (B, H, D, D) float32 or None. variant: a key of VARIANTS."""
    terms = VARIANTS[variant]
    num = Num(terms is None)
    gt, ct, wt, lxt, et = terms or (1, 1, 1, 1, 1)
    B, T, H, D = q.shape
    assert T % C == 0, "T a multiple of 64 here"
    q, k, v, dy = (x.transpose(1, 2).reshape(B * H, T, D).to(num.f) for x in (q, k, v, dy))
    g64, b = gate.transpose(1, 2).reshape(B * H, T).double(), beta.transpose(1, 2).reshape(B * H, T).to(num.f)
    N = B * H
    # the forward's checkpoints: float64 state (float32 held), rounded once to bf16
    S = torch.zeros(N, D, D, dtype=torch.float64) if s0 is None else s0.reshape(N, D, D).double()
    ckpts, tabs = [], []
    for c in range(T // C):
        sl = slice(c * C, (c + 1) * C)
        ckpts.append(S.float() if not num.exact else S)
        tabs.append(tables(g64[:, sl], num))
        L64 = naive.decay_matrix(g64[:, sl])
        kw = k[:, sl].double() * (L64[:, -1, :] * b[:, sl].double())[..., None]
        S = torch.cumprod(g64[:, sl], -1)[:, -1, None, None] * S + kw.transpose(-1, -2) @ v[:, sl].double()
    G = torch.zeros(N, D, D, dtype=num.f) if dsT is None else num.r32(dsT.reshape(N, D, D))
    out = [torch.zeros(N, T, D, dtype=num.f) for _ in range(3)] + [torch.zeros(N, T, dtype=num.f) for _ in range(2)]
    low, slow = torch.ones(C, C, dtype=num.f).tril(), torch.ones(C, C, dtype=num.f).tril(-1)
    for c in reversed(range(T // C)):
        sl = slice(c * C, (c + 1) * C)
        Q, K, V, dY, bc = q[:, sl], k[:, sl], v[:, sl], dy[:, sl], b[:, sl]
        Sc, ScR = checkpoint(ckpts[c], num)  # c0's S, R^T's S
        L, A, w, Ah, Lx = tabs[c]
        bw = num.r32(bc * w)
        # the products on G: today G hi / lo (2 terms), c0 from hi + lo; ckptG: bf16(G), one term
        Gop = G if gt == 2 else num.bf(G)
        Gc0 = sum(num.split(G, 2)) if ct == 2 else num.bf(G)
        Rt = num.mm(ScR, dY.transpose(-1, -2), 2 if CKPT == "f32" else 1)  # R^T[i][t] = sum_j S[i][j] dY[t][j]
        QK = num.mm(Q, K.transpose(-1, -2))                            # [u][s]
        Dd = num.mm(dY, V.transpose(-1, -2))
        MP = QK * L * bc[:, None, :] * low                             # the weights (put_weights' order)
        MQ = Dd * L * bc[:, None, :] * low
        MD = Dd * L * low
        f = (Q * Rt.transpose(-1, -2)).sum(-1)                         # f_u = q_u . (S dy_u)
        dqt = num.mm(K.transpose(-1, -2), MQ.transpose(-1, -2), 1, wt, acc=Rt * A[:, None, :])  # R^T diag(A) + K^T MQ^T
        out[0][:, sl] = num.bf(dqt.transpose(-1, -2))
        E = bc[:, None, :] * QK * Dd * slow                            # E[u][s], s < u
        M = num.mm(E, Lx.transpose(-1, -2), et, lxt)                   # M[u][t] = sum_s E[u][s] Lx[t][s]
        td = (L * M).sum(-2)                                           # (d): sum_{u >= t} L[u][t] M[u][t]
        Rkt = num.mm(Gop, V.transpose(-1, -2), gt, 1)                  # Rk^T[i][s] = sum_j G[i][j] V[s][j]
        e = (K * Rkt.transpose(-1, -2)).sum(-1)                        # e_s = k_s . (G v_s)
        dkt = num.mm(Q.transpose(-1, -2), MD, 1, wt, acc=Rkt * w[:, None, :])  # Rk^T diag(w) + Q^T MD
        out[4][:, sl] = num.bf((K * dkt.transpose(-1, -2)).sum(-1))   # dbeta
        out[1][:, sl] = num.bf((dkt * bc[:, None, :]).transpose(-1, -2))  # dk = beta dkt
        KG = num.mm(K, Gop, 1, gt) * bw[..., None]                     # diag(beta w) K G
        out[2][:, sl] = num.bf(num.mm(MP.transpose(-1, -2), dY, wt, 1, acc=KG))  # + MP^T dY
        c0 = (Sc * Gc0).sum((-1, -2))
        sb = ((Lx * bc[:, None, :]) @ e[..., None])[..., 0]            # sum_{s<t} L[t-1][s] beta_s e_s (fp32 L)
        sc = (L.transpose(-1, -2) @ f[..., None])[..., 0]             # sum_{u>=t} L[u][t] f_u
        out[3][:, sl] = num.bf(w * (Ah * c0[:, None] + sb) + td + Ah * sc)
        # pass A (every variant): G <- A_63 G + (diag(A) Q)^T dY, (Q A) hi / lo, in the float32 accumulator
        G = num.mm((Q * A[..., None]).transpose(-1, -2), dY, 2, 1, acc=G * A[:, -1, None, None])
    res = [x.reshape(B, H, *x.shape[1:]).transpose(1, 2) for x in out]
    return (*res, G.reshape(B, H, D, D))


def rel(a, b):
    a, b = a.double(), b.double()
    if not torch.isfinite(a).all():
        return float("inf")
    den = b.norm().item()
    return (a - b).norm().item() / den if den > 0 else (a - b).norm().item()


def make_case(T, BH, gname, states, seed):
    gen = torch.Generator().manual_seed(seed)
    q, k, v, gate, beta = reference.make_inputs(1, T, BH, 128, dtype=torch.bfloat16, generator=gen)
    spec = GATES[gname]
    if isinstance(spec, float):
        gate = torch.full_like(gate, spec)
    elif isinstance(spec, tuple):
        gate = torch.empty(gate.shape).uniform_(*spec, generator=gen).to(torch.bfloat16)
    dy = torch.randn(q.shape, generator=gen).to(torch.bfloat16)
    s0 = torch.randn(1, BH, 128, 128, generator=gen) if states == "both" else None
    dsT = torch.randn(1, BH, 128, 128, generator=gen) if states == "both" else None
    return [q, k, v, gate, beta, dy], s0, dsT


def run_case(T, BH, gname, states, variants, ref_kind, seed, log):
    xs, s0, dsT = make_case(T, BH, gname, states, seed)
    t0 = time.time()
    if ref_kind == "loop":
        ref = naive.recurrent_backward_naive(*xs, initial_state=s0, d_final_state=dsT)
    else:
        ref = naive.chunked_backward_naive(*xs, initial_state=s0, d_final_state=dsT, chunk=C)
    tref = time.time() - t0
    big = max(r.abs().max().item() for r in ref[:5])
    if not (big < 1e36):  # past bf16's range: nothing to compare
        log(f"| {T} | {BH} | {gname} | {states} | skipped: float64 gradients reach {big:.1e} (past bf16's range) |")
        return None
    bars = [2 * rel(r.to(torch.bfloat16), r) + 1e-6 for r in ref[:5]]
    rows = {}
    for var in variants:
        t0 = time.time()
        got = emulated_backward(*xs, s0, dsT, var)
        errs = [rel(g, r) for g, r in zip(got[:5], ref[:5])]
        ratios = [e / bb for e, bb in zip(errs, bars)]
        ds0 = rel(got[5], ref[5]) if s0 is not None else float("nan")
        rows[var] = (errs, ratios)
        worst = max(range(5), key=lambda i: ratios[i])
        cells = " | ".join(f"{e:.2e} / {bb:.2e} = **{r:.2f}**" if r > GO else f"{e:.2e} / {bb:.2e} = {r:.2f}"
                           for e, bb, r in zip(errs, bars, ratios))
        log(f"| {T} | {BH} | {gname} | {states} | {var} | {cells} | {ratios[worst]:.2f} ({NAMES[worst]}) | "
            f"{ds0:.1e} | {time.time() - t0:.0f}+{tref:.0f} |")
    return rows


GO = 0.85


def summary(results, variants, log):
    """Per variant: the worst err / bar of each gradient over the cases (and where), the cases over GO, and those
    over GO where T (today) is not; with T run, the largest rise of err / bar over T's on the same case."""
    log(f"\n## summary over {len(results) // max(1, len(variants))} cases: worst err / bar per gradient (case)")
    log("| var | " + " | ".join(NAMES) + f" | cases > {GO} | of those, T <= {GO} | max rise over T |")
    log("|---" * 9 + "|")
    base = {r[0]: r[2] for r in results if r[1] == "T"}
    verdict = {}
    for var in variants:
        rows = [(case, ratios) for case, v, ratios in results if v == var]
        cells = []
        for i in range(5):
            case, ratios = max(rows, key=lambda r: r[1][i])
            cells.append(f"{ratios[i]:.2f} ({case})")
        over = [case for case, ratios in rows if max(ratios) > GO]
        new = [case for case in over if case in base and max(base[case]) <= GO]
        rise = max((max(r - b for r, b in zip(ratios, base[case])), case) for case, ratios in rows if case in base) \
            if base else (float("nan"), "-")
        log(f"| {var} | " + " | ".join(cells) + f" | {len(over)} | {len(new)} | {rise[0]:+.2f} ({rise[1]}) |")
        worst = max(max(ratios) for _, ratios in rows)
        verdict[var] = (worst, over, new)
    log(f"\n## verdict (GO: every err / bar <= {GO} in every case)")
    for var, (worst, over, new) in verdict.items():
        log(f"- {var}: worst err/bar {worst:.3f}; {'GO' if not over else 'NO-GO'}: {len(over)} cases over {GO}"
            + (f" ({len(new)} where T is not: {', '.join(new[:8])}{' ...' if len(new) > 8 else ''})" if over else ""))


def main():
    global GO, CKPT
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--T", default="256,1024,4096")
    ap.add_argument("--BH", type=int, default=2)
    ap.add_argument("--BH-long", type=int, default=1, help="B H for T >= --long")
    ap.add_argument("--long", type=int, default=4096)
    ap.add_argument("--gates", default=",".join(GATES))
    ap.add_argument("--states", default="none,both")
    ap.add_argument("--variants", default="T,A,B'")
    ap.add_argument("--ref", choices=("loop", "chunked"), default="loop")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--seeds", type=int, default=1, help="draws of each case (seeds seed .. seed + seeds - 1)")
    ap.add_argument("--go", type=float, default=0.85)
    ap.add_argument("--ckpt", choices=("f16", "bf16", "f32"), default="f16", help="the S checkpoints' format")
    args = ap.parse_args()
    GO = args.go
    CKPT = args.ckpt
    variants = args.variants.split(",")

    def log(s):
        print(s, flush=True)

    log(f"# bf16 ckptG emulation (C = 64, D = 128), reference {args.ref}; cell: err / bar = err/bar (bold over {GO})")
    log("| T | BH | gates | states | var | " + " | ".join(NAMES) + " | worst | dS0 (fp32) | s (emu+ref) |")
    log("|---" * 13 + "|")
    results = []
    for T in (int(x) for x in args.T.split(",")):
        BH = args.BH_long if T >= args.long else args.BH
        for gi, gname in enumerate(args.gates.split(",")):
            for si, states in enumerate(args.states.split(",")):
                for sd in range(args.seed, args.seed + args.seeds):
                    rows = run_case(T, BH, gname, states, variants, args.ref, 100000 * sd + 1000 * gi + 10 * si + T,
                                    log)
                    case = f"{T} {gname} {states}" + (f" s{sd}" if args.seeds > 1 else "")
                    results += [(case, var, ratios) for var, (errs, ratios) in (rows or {}).items()]
    summary(results, variants, log)


if __name__ == "__main__":
    main()
