"""CPU emulation: chunk_bwd_sm90's products for float32 inputs under several split schemes (training-design.md 8).

The backward of one chunk is naive.chunked_backward_naive's (C = 64), written as the Hopper kernel forms it:
every product (R^T, QK, Dd, dq^T, Rk^T, dkt^T, KG, dv, M = E Lx^T, G's update) goes through mm(), everything
else (tables, masks, row dots, dgate's terms) is float32. Tables come from float64, each rounded once to float32.
The checkpoints S are made by an emulated float32 forward whose state update runs 3xTF32 (chunk_sm90's TF32 path).

mm() emulates a wgmma sequence: per k-step (16 for bf16 / fp16, 8 for TF32) and per split term, the exact
partial (float64) is added to a float32 accumulator, rounded to nearest (RN) or toward zero (--rz; wgmma's
accumulation rounding is unverified). Terms:
  f32      plain float32 products (what an FMA kernel would reach)
  tf32x3   (a) hi = RN_tf32(x), lo = x - hi, truncated to TF32 by the tensor core: hi.hi + hi.lo + lo.hi
  bf16x3   (b) hi = RN_bf16(x), lo = RN_bf16(x - hi): hi.hi + hi.lo + lo.hi (both operands split)
  bf16x4   (b) + lo.lo
  bf16x6   (c) three bf16 terms each: hh + hm + mh + hl + lh + mm
  fp16x3s  (d) fp16 hi / lo after a power-of-two scale per row of A and per column of B (max |x| to 2^15):
           hi.hi + hi.lo + lo.hi; the scales applied to the partial (optimistic: a kernel folds them into the
           accumulator)
  fp16x3t  (d) with one power-of-two scale a whole operand tile (max |x| of the matrix to 2^15) instead of a row /
           column's: a tile used on both sides of products needs one pair
  mixed    (d) bf16x3 everywhere except G's update and KG/Rk^T (the products on G, the chain) in bf16x6

Reference: naive.chunked_backward_naive in float64 on the same (float32) inputs. Prints rel-L2 per gradient.
--gjoin: G's update accumulated from zero and joined by one FMA (as the forward's S), instead of in place.
Run: python3 dev/fp32_split_emulation.py [--rz] [--gjoin] [--T 2048] [--BH 4]
"""
import argparse
import sys
import time

import torch

sys.path.insert(0, ".")
import naive  # noqa: E402
import reference  # noqa: E402

torch.set_grad_enabled(False)


def rn_tf32(x):
    b = x.contiguous().view(torch.int32)
    b = (b + 0x1000) & ~0x1FFF  # round half away (cvt.rna.tf32.f32); NaN / inf not exercised here
    return b.view(torch.float32)


def tr_tf32(x):
    return (x.contiguous().view(torch.int32) & ~0x1FFF).view(torch.float32)


def bf(x):
    return x.to(torch.bfloat16).to(torch.float32)


def split_bf16(x, n):
    parts, r = [], x
    for _ in range(n):
        h = bf(r)
        parts.append(h)
        r = r - h  # exact in float32 for n <= 3 (Sterbenz-like: r has at most 24 - 8 k significant bits)
    return parts


def pow2_scale(x, dim):
    m = x.abs().amax(dim=dim, keepdim=True).double()
    e = torch.where(m > 0, torch.ceil(torch.log2(m)) - 15, torch.zeros_like(m))
    return torch.exp2(e)


def terms(a, b, mode):
    """[(a_part, b_part, post_scale or None)], k-step size."""
    if mode == "tf32x3":
        ah, bh = rn_tf32(a), rn_tf32(b)
        al, bl = tr_tf32(a - ah), tr_tf32(b - bh)
        ah, bh = tr_tf32(ah), tr_tf32(bh)
        return [(ah, bh), (ah, bl), (al, bh)], 8, None
    if mode in ("bf16x3", "bf16x4"):
        (ah, al), (bh, bl) = split_bf16(a, 2), split_bf16(b, 2)
        t = [(ah, bh), (ah, bl), (al, bh)] + ([(al, bl)] if mode == "bf16x4" else [])
        return t, 16, None
    if mode == "bf16x6":
        (ah, am, al), (bh, bm, bl) = split_bf16(a, 3), split_bf16(b, 3)
        return [(ah, bh), (ah, bm), (am, bh), (ah, bl), (al, bh), (am, bm)], 16, None
    if mode == "fp16x3s":
        sa, sb = pow2_scale(a, -1), pow2_scale(b, -2)  # rows of A (M), columns of B (N)
        a_, b_ = (a.double() / sa).float(), (b.double() / sb).float()
        ah, bh = a_.half().float(), b_.half().float()
        al, bl = (a_ - ah).half().float(), (b_ - bh).half().float()
        return [(ah, bh), (ah, bl), (al, bh)], 16, sa * sb
    if mode == "fp16x3t":  # one scale a tile: max |x| of the whole (M, K) and (K, N) operand to 2^15
        sa, sb = pow2_scale(pow2_scale_in(a), -1), pow2_scale(pow2_scale_in(b), -1)
        a_, b_ = (a.double() / sa).float(), (b.double() / sb).float()
        ah, bh = a_.half().float(), b_.half().float()
        al, bl = (a_ - ah).half().float(), (b_ - bh).half().float()
        return [(ah, bh), (ah, bl), (al, bh)], 16, sa * sb
    if mode == "f32":
        return [(a, b)], 16, None
    raise ValueError(mode)


def pow2_scale_in(x):
    """x's (..., M, K) as (..., 1, M K): pow2_scale over its last dimension is then one scale a matrix."""
    return x.reshape(*x.shape[:-2], 1, -1)


RZ = False
GJOIN = False
OVERRIDE = {}  # product name -> mode (--override Rt=bf16x6,...): QK Dd Rt Rkt dq dkt KG dv M Gu


def pick(name, mode):
    return OVERRIDE.get(name, mode)


def add_round(acc, part):
    s = acc.double() + part
    f = s.float()
    if RZ:
        over = f.double().abs() > s.abs()
        f = torch.where(over, torch.nextafter(f, torch.zeros_like(f)), f)
    return f


def mm(a, b, mode, acc=None):
    """a (..., M, K) @ b (..., K, N), float32 in and out, the wgmma way (acc: the accumulator to add to)."""
    a, b = a.float(), b.float()
    K = a.shape[-1]
    out = torch.zeros(*a.shape[:-1], b.shape[-1], dtype=torch.float32) if acc is None else acc.float().clone()
    if mode == "f32":  # fp32 FMA-like: float32 partial sums of 16
        for k0 in range(0, K, 16):
            out = out + (a[..., k0:k0 + 16] @ b[..., k0:k0 + 16, :])
        return out
    tl, ks, post = terms(a, b, mode)
    for k0 in range(0, K, ks):
        for ap, bp in tl:
            p = ap[..., k0:k0 + ks].double() @ bp[..., k0:k0 + ks, :].double()
            if post is not None:
                p = p * post
            out = add_round(out, p)
    return out


def tables(gc):
    """float64 tables rounded once: L, A, w (as naive), Ah, Lx."""
    L = naive.decay_matrix(gc)
    A = torch.cumprod(gc, -1)
    w = L[..., -1, :]
    C = gc.shape[-1]
    Ah = torch.cat([torch.ones_like(A[..., :1]), A[..., :-1]], -1)
    Lx = torch.zeros_like(L)
    Lx[..., 1:, :] = L[..., :-1, :]
    Lx = Lx * torch.ones(C, C, dtype=torch.float64).tril(-1)
    return [x.float() for x in (L, A, w, Ah, Lx)]


def emulated_backward(q, k, v, gate, beta, dy, mode, chunk=64, gmode=None):
    """chunked_backward_naive in float32 with every product through mm(mode); gmode: the products on G (G's
    update, Rk^T, KG) and the checkpoints' R^T, if different."""
    gmode = gmode or mode
    q, k, v, gate, beta, dy = (x.float().transpose(1, 2) for x in (q, k, v, gate, beta, dy))
    B, H, T, Dk = q.shape
    Dv = v.shape[-1]
    gd = gate.double()
    S = torch.zeros(B, H, Dk, Dv, dtype=torch.float32)
    starts, tabs = [], []
    for c0 in range(0, T, chunk):  # the forward's checkpoints: 3xTF32 U from zero, then one FMA-like join
        sl = slice(c0, min(T, c0 + chunk))
        L, A, w, Ah, Lx = tables(gd[:, :, sl])
        starts.append(S)
        tabs.append((sl, L, A, w, Ah, Lx))
        kc, vc, bc = k[:, :, sl], v[:, :, sl], beta[:, :, sl]
        U = mm((kc * (w * bc)[..., None]).transpose(-1, -2), vc, "tf32x3")
        S = (A[..., -1, None, None].double() * S.double() + U.double()).float()
    G = torch.zeros(B, H, Dk, Dv, dtype=torch.float32)
    dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    dgate, dbeta = torch.zeros_like(gate), torch.zeros_like(beta)
    for S, (sl, L, A, w, Ah, Lx) in zip(reversed(starts), reversed(tabs)):
        Q, K, V, dY, bc = q[:, :, sl], k[:, :, sl], v[:, :, sl], dy[:, :, sl], beta[:, :, sl]
        C = Q.shape[2]
        low = torch.ones(C, C).tril()
        QK = mm(Q, K.transpose(-1, -2), pick("QK", mode))
        Dd = mm(dY, V.transpose(-1, -2), pick("Dd", mode))
        MP = L * bc[..., None, :] * QK * low
        MQ = L * bc[..., None, :] * Dd * low
        MD = L * Dd * low
        E = (bc[..., None, :] * QK * Dd) * torch.ones(C, C).tril(-1)
        Rt = mm(S, dY.transpose(-1, -2), pick("Rt", gmode))                    # R^T[i][t] = sum_j S[i][j] dY[t][j]
        Rkt = mm(G, V.transpose(-1, -2), pick("Rkt", gmode))                    # Rk^T[i][s] = sum_j G[i][j] V[s][j]
        f = (Q * Rt.transpose(-1, -2)).sum(-1)
        e = (K * Rkt.transpose(-1, -2)).sum(-1)
        c0 = (G * S).sum((-1, -2))
        dqt = mm(K.transpose(-1, -2), MQ.transpose(-1, -2), pick("dq", mode), acc=Rt * A[..., None, :])  # + K^T MQ^T
        dq[:, :, sl] = dqt.transpose(-1, -2)
        dkt = mm(Q.transpose(-1, -2), MD, pick("dkt", mode), acc=Rkt * w[..., None, :])                     # + Q^T MD
        dk[:, :, sl] = (bc[..., None, :] * dkt).transpose(-1, -2)
        dbeta[:, :, sl] = (K * dkt.transpose(-1, -2)).sum(-1)
        KG = mm(K, G, pick("KG", gmode)) * (bc * w)[..., None]
        dv[:, :, sl] = mm(MP.transpose(-1, -2), dY, pick("dv", mode), acc=KG)
        X = mm(E, Lx.transpose(-1, -2), pick("M", mode))
        dgate[:, :, sl] = (w * Ah * c0[..., None]
                           + w * (Lx @ (bc * e)[..., None])[..., 0]
                           + Ah * (L.transpose(-1, -2) @ f[..., None])[..., 0]
                           + (L * X).sum(-2))
        if GJOIN:  # the update from zero, joined by one FMA (the forward's fresh-U rule)
            U = mm((Q * A[..., None]).transpose(-1, -2), dY, pick("Gu", gmode))
            G = (A[..., -1, None, None].double() * G.double() + U.double()).float()
        else:  # as chunk_bwd_sm90: G scaled in its accumulator, the update's wgmmas added onto it
            G = mm((Q * A[..., None]).transpose(-1, -2), dY, pick("Gu", gmode), acc=A[..., -1, None, None] * G)
    return tuple(x.transpose(1, 2) for x in (dq, dk, dv, dgate, dbeta))


def rel(a, b):
    return ((a.double() - b).norm() / b.norm()).item()


def main():
    global RZ, GJOIN
    ap = argparse.ArgumentParser()
    ap.add_argument("--T", type=int, default=1024)
    ap.add_argument("--BH", type=int, default=2)
    ap.add_argument("--rz", action="store_true")
    ap.add_argument("--override", default="", help="name=mode,... per product")
    ap.add_argument("--gjoin", action="store_true", help="G's update from zero + one FMA join")
    ap.add_argument("--modes", default="f32,tf32x3,bf16x3,bf16x4,bf16x6,fp16x3s,mixed")
    ap.add_argument("--gates", default="sigmoid,near1,1.002")
    args = ap.parse_args()
    RZ, GJOIN = args.rz, args.gjoin
    OVERRIDE.update(x.split("=") for x in args.override.split(",") if x)
    if OVERRIDE:
        print("override:", OVERRIDE)
    gen = torch.Generator().manual_seed(15)
    names = ("dq", "dk", "dv", "dgate", "dbeta")
    print(f"T = {args.T}, B H = {args.BH}, D = 128, C = 64, accumulation {'RZ' if RZ else 'RN'}, G {'from zero + FMA join' if GJOIN else 'accumulated in place'}; rel-L2 vs float64")
    for gname in args.gates.split(","):
        q, k, v, gate, beta = reference.make_inputs(1, args.T, args.BH, 128, generator=gen)
        if gname == "near1":  # gates in [0.98, 1): memory over several chunks
            gate = 1 - 0.02 * torch.rand(gate.shape, generator=gen)
        elif gname != "sigmoid":
            gate = torch.full_like(gate, float(gname))
        dy = torch.randn(q.shape, generator=gen)
        ref = naive.chunked_backward_naive(q, k, v, gate, beta, dy, chunk=64)[:5]
        print(f"gates {gname}:")
        print(f"  {'mode':9s} " + " ".join(f"{n:>9s}" for n in names) + "      worst   (s)")
        for mode in args.modes.split(","):
            t0 = time.time()
            if mode == "mixed":
                out = emulated_backward(q, k, v, gate, beta, dy, "bf16x3", gmode="bf16x6")
            else:
                out = emulated_backward(q, k, v, gate, beta, dy, mode)
            errs = [rel(o, r) for o, r in zip(out, ref)]
            print(f"  {mode:9s} " + " ".join(f"{x:9.2e}" for x in errs) + f"  {max(errs):9.2e}  {time.time() - t0:4.0f}")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
