"""Input makers and the float64 reference used by the tests."""
import torch

import reference
from timing import rel_l2  # noqa: F401  (re-exported for the tests)


def inputs(B, T, H, Dk, Dv=None, dtype=torch.float32, device="cuda", seed=None, gate=None):
    """Fresh random inputs (never zeros). `gate`: None (sigmoid), a float, or (low, high) uniform."""
    gen = torch.Generator().manual_seed(seed) if seed is not None else None
    q, k, v, g, b = reference.make_inputs(B, T, H, Dk, Dv, dtype=torch.float32, generator=gen)
    if isinstance(gate, (int, float)):
        g = torch.full_like(g, float(gate))
    elif isinstance(gate, tuple):
        g = torch.empty_like(g).uniform_(*gate, generator=gen)
    return [x.to(device=device, dtype=dtype) for x in (q, k, v, g, b)]


def ref64(xs):
    """The spec's loop in float64 on upcast inputs."""
    with torch.no_grad():
        return reference.Model()(*[x.double() for x in xs])
