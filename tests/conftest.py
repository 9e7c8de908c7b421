"""Shared fixtures. The CUDA extension is built once per session, in a subprocess that keeps the
compiler's output (test_build reads it), then imported here from the same build folder."""
import atexit
import os
import shutil
import subprocess
import sys
import tempfile

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

# A fresh build folder unless the caller chose one (the device script shares one with bench.py); ours
# goes when the run ends.
if "TORCH_EXTENSIONS_DIR" not in os.environ:
    os.environ["TORCH_EXTENSIONS_DIR"] = tempfile.mkdtemp(prefix="gr_ext_")
    atexit.register(shutil.rmtree, os.environ["TORCH_EXTENSIONS_DIR"], ignore_errors=True)

HAS_CUDA = torch.cuda.is_available()
cuda = pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device")


@pytest.fixture(scope="session")
def build_log():
    """Output of the first import of solution.py (compiler lines when it compiled)."""
    env = dict(os.environ, GATED_RECURRENCE_VERBOSE_BUILD="1")
    proc = subprocess.run([sys.executable, "-c", "import solution"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    return proc.stdout + proc.stderr


@pytest.fixture(scope="session")
def sol(build_log):
    import solution
    return solution


@pytest.fixture(scope="session")
def ref_model():
    import reference
    return reference.Model()
