"""CPU: solution.py finds the CUDA toolkit itself (CUDA_HOME, CUDA_PATH, the real nvcc on PATH,
/usr/local/cuda) before torch guesses, and says in one line what to set when there is none."""
import os
import subprocess
import sys

import pytest

from conftest import ROOT


def toolkit(folder):
    """A folder that looks like a CUDA toolkit: bin/nvcc and include/cuda_runtime_api.h."""
    os.makedirs(os.path.join(folder, "bin"))
    os.makedirs(os.path.join(folder, "include"))
    for f in ("bin/nvcc", "include/cuda_runtime_api.h"):
        open(os.path.join(folder, f), "w").close()
    os.chmod(os.path.join(folder, "bin", "nvcc"), 0o755)
    return str(folder)


def wrapper_dir(folder):
    """A folder on PATH with an nvcc wrapper script (torch takes its parent for CUDA_HOME)."""
    os.makedirs(folder)
    path = os.path.join(folder, "nvcc")
    with open(path, "w") as f:
        f.write("#!/bin/sh\nexec /nowhere/nvcc \"$@\"\n")
    os.chmod(path, 0o755)
    return str(folder)


def test_order_and_the_wrapper_script_on_path(sol, tmp_path):
    kit, other = toolkit(tmp_path / "kit"), toolkit(tmp_path / "other")
    wrap = wrapper_dir(tmp_path / "wrap")
    find = sol._find_cuda_home
    assert find({"PATH": wrap}, default=kit) == kit  # the wrapper's folder has no headers
    assert find({"PATH": wrap}, default=str(tmp_path / "none")) is None
    assert find({"PATH": wrap, "CUDA_HOME": other}, default=kit) == other
    assert find({"PATH": wrap, "CUDA_PATH": other}, default=kit) == other
    assert find({"PATH": wrap, "CUDA_HOME": str(tmp_path / "bad"), "CUDA_PATH": other}, default=kit) == other
    link = tmp_path / "links"
    os.makedirs(link)
    os.symlink(os.path.join(other, "bin", "nvcc"), link / "nvcc")  # the real nvcc through a symlink
    assert find({"PATH": str(link)}, default=kit) == other


@pytest.mark.skipif(not os.path.isfile("/usr/local/cuda/include/cuda_runtime_api.h"), reason="no toolkit here")
def test_import_overrides_torchs_guess_from_a_wrapper(sol, tmp_path):
    """With only a wrapper script on PATH and no CUDA_HOME, torch alone would guess its parent folder;
    solution.py sets the real toolkit before torch.utils.cpp_extension reads it."""
    env = {k: v for k, v in os.environ.items() if k not in ("CUDA_HOME", "CUDA_PATH")}
    env["PATH"] = wrapper_dir(tmp_path / "wrap") + os.pathsep + "/usr/bin:/bin"
    code = "import solution, torch.utils.cpp_extension as c; print(solution._CUDA_HOME, c.CUDA_HOME)"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split()[-2:] == ["/usr/local/cuda", "/usr/local/cuda"]


def test_no_toolkit_is_one_line_saying_what_to_set(sol, tmp_path):
    """A build that cannot find a toolkit stops at once with one line naming CUDA_HOME (not a ninja log
    a minute later)."""
    env = {k: v for k, v in os.environ.items() if k not in ("CUDA_HOME", "CUDA_PATH")}
    env["PATH"] = wrapper_dir(tmp_path / "wrap") + os.pathsep + "/usr/bin:/bin"
    # the core from the session's build folder, then a unit that is built nowhere yet
    code = (f"import os, solution; os.environ['TORCH_EXTENSIONS_DIR'] = {str(tmp_path / 'ext')!r}; "
            "solution._CUDA_HOME = None; solution._compile('chunk_bf16')")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert out.returncode != 0
    assert out.stderr.strip().splitlines()[-1].startswith("RuntimeError: solution.py needs the CUDA toolkit")
    assert "set CUDA_HOME" in out.stderr
