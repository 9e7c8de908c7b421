"""CPU emulation: what chunk_sm90's float32 block would lose if some of its gate tables were scanned in float32, not
double (docs/perf-notes.md, fortieth session, Next: the aux's table phase is about a fifth of its chain).

The block's tables (write_tables64 in SM90_SRC): G, W, GAMMA from scans over the chunk's 64 steps, and SOUTB, ROWF,
LTABB within 16-step blocks. GAMMA and W carry the state from chunk to chunk, so their roundings add up along the
sequence. G scales the inter-chunk term once, and SOUTB / ROWF / LTABB scale one chunk's P' only, so none of those
four compounds. Everything else here runs in float64 (the products' own 3xTF32 error is another matter), so the
printed error is the tables' alone:
  double   every scan in double, each value rounded once to float32 (today's float32 block);
  mixed    G, W, GAMMA as today; SOUTB, ROWF, LTABB in float32 in write_tables64's order;
  float    every scan in float32 (the bfloat16 block's choice);
  gwf      every scan in float32 but GAMMA the exact product rounded once (the float32 block since the forty-first
           session: write_tables64<true>, warp_product_exact).
Relative L2 of y against the float64 recurrence. The bar is 1e-5; the block measures about 1e-6 in all (3xTF32).

    python3 dev/tf32_tables_emulation.py [--T 2048] [--D 16]
"""
import argparse

import numpy as np


def scans(x, seg, dt):
    """Inclusive prefix and suffix products of x (32 lanes) within segments of seg lanes, Hillis-Steele in dt, as
    warp_scans runs them."""
    pre, suf = x.astype(dt).copy(), x.astype(dt).copy()
    lane = np.arange(32)
    off = 1
    while off < seg:
        up = np.roll(pre, off)
        dn = np.roll(suf, -off)
        pre = np.where((lane % seg) >= off, pre * up, pre).astype(dt)
        suf = np.where((lane % seg) + off < seg, suf * dn, suf).astype(dt)
        off *= 2
    return pre, suf


def tables(g, b, dt_full, dt_block, gamma_double=False):
    """write_tables64's tables of one chunk (g, b: 64 steps), the full scans in dt_full, the block scans in
    dt_block, every value rounded to float32 at the end. Returns G, W, GAMMA, SOUTB, ROWF [t][bs], LTAB [t][s % 16]."""
    f32 = np.float32
    a0, a1 = g[0::2], g[1::2]
    b0, b1 = b[0::2], b[1::2]
    # warp 0: G, W, GAMMA
    A0, A1, B0, B1 = (x.astype(dt_full) for x in (a0, a1, b0, b1))
    pre, suf = scans(A0 * A1, 32, dt_full)
    pre_ex = np.concatenate([[dt_full(1)], pre[:-1]])
    suf_ex = np.concatenate([suf[1:], [dt_full(1)]])
    G = np.empty(64, f32)
    W = np.empty(64, f32)
    G[0::2], G[1::2] = (pre_ex * A0).astype(f32), pre.astype(f32)
    W[0::2], W[1::2] = (B0 * (A1 * suf_ex)).astype(f32), (B1 * suf_ex).astype(f32)
    gamma = f32(pre[31])
    if gamma_double:
        gamma = f32(np.prod((a0.astype(np.float64) * a1.astype(np.float64))))
    # warp 1: SOUTB, ROWF
    A0, A1, B0, B1 = (x.astype(dt_block) for x in (a0, a1, b0, b1))
    bpre, bsuf = scans(A0 * A1, 8, dt_block)
    lane = np.arange(32)
    bpre_ex = np.where(lane % 8 == 0, dt_block(1), np.roll(bpre, 1))
    bsuf_ex = np.where(lane % 8 == 7, dt_block(1), np.roll(bsuf, -1))
    soutb = np.empty(64, f32)
    soutb[0::2], soutb[1::2] = (B0 * (A1 * bsuf_ex)).astype(f32), (B1 * bsuf_ex).astype(f32)
    Bk1, Bk2 = bpre[15], bpre[23]
    rowf = np.zeros((64, 4), f32)
    for ln in range(32):
        bt = ln >> 3
        pin0, pin1 = bpre_ex[ln] * A0[ln], bpre[ln]
        for bs in range(4):
            m = dt_block(1)
            if bt == bs + 2:
                m = Bk1 if bs == 0 else Bk2
            if bt == 3 and bs == 0:
                m = Bk1 * Bk2
            rowf[2 * ln, bs], rowf[2 * ln + 1, bs] = f32(pin0 * m), f32(pin1 * m)
    # warps 2, 3: LTABB, running products down a block's rows
    ltab = np.zeros((64, 16), f32)
    gg, bb = g.astype(dt_block), b.astype(dt_block)
    for lb in range(4):
        for sl in range(16):
            run = dt_block(1)
            for r in range(16):
                if r > sl:
                    run = dt_block(run * gg[16 * lb + r])
                if r >= sl:
                    ltab[16 * lb + r, sl] = f32(run * bb[16 * lb + sl])
    return G, W, gamma, soutb, rowf, ltab


def chunked(q, k, v, g, b, mode):
    """y of one (b, h) by the block's chunk algorithm in float64 with its tables as `mode` rounds them."""
    T, Dk = q.shape
    Dv = v.shape[1]
    dts = {"double": (np.float64, np.float64), "mixed": (np.float64, np.float32), "float": (np.float32, np.float32),
           "gwf": (np.float32, np.float32)}
    dt_full, dt_block = dts[mode]
    S = np.zeros((Dk, Dv))
    y = np.zeros((T, Dv))
    for t0 in range(0, T, 64):
        n = min(64, T - t0)
        gc = np.ones(64, np.float32)
        bc = np.zeros(64, np.float32)
        gc[:n], bc[:n] = g[t0:t0 + n], b[t0:t0 + n]
        G, W, gamma, soutb, rowf, ltab = (np.asarray(x, np.float64) for x in tables(gc, bc, dt_full, dt_block, mode == "gwf"))
        qc = np.zeros((64, Dk)); kc = np.zeros((64, Dk)); vc = np.zeros((64, Dv))
        qc[:n], kc[:n], vc[:n] = q[t0:t0 + n], k[t0:t0 + n], v[t0:t0 + n]
        P = qc @ kc.T  # [t][s]
        Dm = np.zeros((64, 64))
        for t in range(64):
            for s in range(t + 1):
                if s // 16 == t // 16:
                    Dm[t, s] = ltab[t, s % 16]
                else:
                    Dm[t, s] = rowf[t, s // 16] * soutb[s]
        yc = G[:, None] * (qc @ S) + (P * Dm) @ vc
        y[t0:t0 + n] = yc[:n]
        S = gamma * S + (kc * W[:, None]).T @ vc
    return y


def exact(q, k, v, g, b):
    S = np.zeros((q.shape[1], v.shape[1]))
    y = np.zeros((q.shape[0], v.shape[1]))
    for t in range(q.shape[0]):
        S = g[t] * S + b[t] * np.outer(k[t], v[t])
        y[t] = q[t] @ S
    return y


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--T", type=int, default=2048)
    ap.add_argument("--D", type=int, default=16)
    args = ap.parse_args()
    rng = np.random.default_rng(40)
    T, D = args.T, args.D
    sig = lambda x: 1 / (1 + np.exp(-x))  # noqa: E731
    cases = {
        "gate 1.002 (coherent roundings)": np.full(T, 1.002),
        "gates U(1, 1.02)": rng.uniform(1, 1.02, T),
        "gates U(0.99, 1)": rng.uniform(0.99, 1, T),
        "gates sigmoid(N(0, 1))": sig(rng.standard_normal(T)),
        "gates U(-1, 1)": rng.uniform(-1, 1, T),
    }
    print(f"T = {T}, D = {D}; relative L2 of y against the float64 recurrence (the tables' error alone)")
    print(f"{'case':34s} {'double':>10s} {'mixed':>10s} {'float':>10s} {'gwf':>10s}")
    for name, g in cases.items():
        g = g.astype(np.float32)
        q, k, v = (rng.standard_normal((T, D)).astype(np.float32) for _ in range(3))
        b = sig(rng.standard_normal(T)).astype(np.float32)
        ref = exact(*(x.astype(np.float64) for x in (q, k, v, g, b)))
        errs = [np.linalg.norm(chunked(q, k, v, g, b, m) - ref) / np.linalg.norm(ref)
                for m in ("double", "mixed", "float", "gwf")]
        print(f"{name:34s} " + " ".join(f"{e:10.2e}" for e in errs))


if __name__ == "__main__":
    main()
