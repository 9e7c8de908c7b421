"""CPU: the plan fits every GPU family a user brings: for each D_k from 1 to 256 and each dtype, the
planned kernel's shared memory is within the device's opt-in limit, and below sm_80 (no mma.sync for
TF32 or bf16: the T4) no chunk kernel is planned and an explicit request is a ValueError."""
import re

import pytest

# name: (SMs, opt-in shared memory a block, 10 * major + minor)
DEVICES = {"sm_75-T4": (40, 65536, 75), "sm_80-A100": (108, 166912, 80), "sm_86-A10": (72, 101376, 86),
           "sm_89-L4": (58, 101376, 89), "sm_90-H200": (132, 232448, 90), "sm_100-B200": (148, 232448, 100),
           "sm_120-RTX5090": (170, 101376, 120)}
# short (parallel or recurrent), the KernelBench-like middle, long (chunk kernels), long and narrow in heads
SHAPES = [(1, 200, 1), (2, 128, 4), (4, 2048, 8), (1, 8192, 2)]


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("device", list(DEVICES))
def test_every_plan_fits_the_device(sol, device, dtype):
    sms, smem, arch = DEVICES[device]
    for Dk in range(1, 257):
        for B, T, H in SHAPES:
            for Dv in sorted({Dk, 64}):
                text = sol._plan_on(B, T, H, Dk, Dv, dtype, sms=sms, smem=smem, arch=arch)
                kernel = text.split()[0]
                used = int(re.search(r"\bsmem=(\d+)", text).group(1))
                assert used <= smem, text
                if arch < 80:
                    assert kernel in ("recurrent", "parallel"), text
                if kernel.startswith("chunk"):  # the chunk kernels' segments fill this device's SMs, no more
                    segments = int(re.search(r"\bsegments=(\d+)", text).group(1))
                    assert segments == 1 or int(re.search(r"\bgrid=(\d+)", text).group(1)) <= 2 * sms, text


def test_long_sequences_below_sm80_take_the_recurrent_kernel(sol):
    """Where sm_80 and newer get a chunk kernel, a T4 gets the recurrent one (an explicit chunk request
    there is a ValueError naming the kernel and the compute capability: make_plan's first check)."""
    assert sol._plan_on(4, 2048, 8, 64, 64, "float32", sms=40, smem=65536, arch=75).split()[0] == "recurrent"
    assert sol._plan_on(4, 2048, 8, 64, 64, "float32", sms=108, smem=166912, arch=80).split()[0] == "chunk_tf32"
    assert sol._plan_on(4, 2048, 8, 64, 64, "bfloat16", sms=40, smem=65536, arch=75).split()[0] == "recurrent"


def test_the_h200_limits_are_plan_defaults_without_a_device(sol):
    if sol.torch.cuda.is_available():
        pytest.skip("plan() uses the visible device's limits")
    for shape in [(2, 128, 4, 24, 24), (8, 2048, 16, 128, 128), (1, 8192, 8, 128, 128)]:
        for dtype in ("float32", "bfloat16"):
            assert sol._plan_on(*shape, dtype, sms=132, smem=232448, arch=90) == sol.plan(*shape, dtype)
