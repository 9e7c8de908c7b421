"""KernelBench problem: a gated outer-product linear recurrence.

Per batch b and head h, with S_0 = 0 (a D_k x D_v state):

    S_t = gate_t * S_{t-1} + beta_t * k_t v_t^T
    y_t = S_t^T q_t            (y_t[j] = sum_i q_t[i] S_t[i, j])

q, k: (B, T, H, D_k); v, y: (B, T, H, D_v); gate, beta: (B, T, H).

`Model` is the specification: a plain PyTorch loop over t. `make_inputs` draws inputs of any
shape, dtype and device for eval.py, tests and benchmarks; KernelBench only uses `Model`,
`get_inputs` and `get_init_inputs`.
"""
import torch
import torch.nn as nn

batch_size = 2
seq_len = 128
num_heads = 4
head_dim = 24


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, q, k, v, gate, beta):
        B, T, H, Dk = q.shape
        Dv = v.shape[-1]
        state = torch.zeros(B, H, Dk, Dv, device=q.device, dtype=q.dtype)
        ys = []
        for t in range(T):
            g_t = gate[:, t].unsqueeze(-1).unsqueeze(-1)  # (B, H, 1, 1)
            b_t = beta[:, t].unsqueeze(-1).unsqueeze(-1)
            state = g_t * state + b_t * (k[:, t].unsqueeze(-1) * v[:, t].unsqueeze(-2))
            ys.append((q[:, t].unsqueeze(-1) * state).sum(dim=-2))  # (B, H, Dv)
        if not ys:
            return torch.zeros(B, 0, H, Dv, device=q.device, dtype=q.dtype)
        return torch.stack(ys, dim=1)  # (B, T, H, Dv)


def make_inputs(B=batch_size, T=seq_len, H=num_heads, Dk=head_dim, Dv=None, *,
                dtype=torch.float32, device="cpu", generator=None):
    """Inputs drawn like get_inputs() for any shape: q, k, v ~ N(0, 1), gate, beta = sigmoid(N(0, 1))."""
    Dv = Dk if Dv is None else Dv

    def randn(*shape):
        return torch.randn(*shape, generator=generator).to(device=device, dtype=dtype)

    q, k, v = randn(B, T, H, Dk), randn(B, T, H, Dk), randn(B, T, H, Dv)
    gate, beta = torch.sigmoid(randn(B, T, H)), torch.sigmoid(randn(B, T, H))
    return [q, k, v, gate, beta]


def get_inputs():
    return make_inputs()


def get_init_inputs():
    return []
