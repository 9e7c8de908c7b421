"""CPU: the CUDA source compiles without a compiler warning, unit by unit: `import solution` builds only
"core", a chunk unit builds on its first use or with build(), and no .so exports a process-wide symbol.
The fresh build here is CI's compile check of every unit."""
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

import pytest
import torch

from conftest import ROOT

WARNING = re.compile(r"\bwarning\b\s*(#|:)", re.I)

# Each step prints one JSON line: [step, built_units(), ...].
FRESH_SCRIPT = """
import json, solution
print(json.dumps(["import", list(solution.built_units())]), flush=True)
solution.build("chunk_bf16")
print(json.dumps(["build chunk_bf16", list(solution.built_units())]), flush=True)
solution.build()
solution.build()
print(json.dumps(["build", list(solution.built_units()), list(solution.UNITS), solution._unit_paths()]), flush=True)
"""


def compiler_warnings(log):
    return [ln for ln in log.splitlines() if WARNING.search(ln) and "UserWarning" not in ln]


@pytest.fixture(scope="module")
def fresh_build():
    """Every unit built from nothing in a fresh TORCH_EXTENSIONS_DIR, with the compiler's output:
    (steps by name, the finished process)."""
    folder = tempfile.mkdtemp(prefix="gr_fresh_")
    env = dict(os.environ, GATED_RECURRENCE_VERBOSE_BUILD="1", TORCH_EXTENSIONS_DIR=folder)
    proc = subprocess.run([sys.executable, "-c", FRESH_SCRIPT], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=1500)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    rows = [json.loads(ln) for ln in proc.stdout.splitlines() if ln.startswith('["')]
    yield {row[0]: row[1:] for row in rows}, proc
    shutil.rmtree(folder, ignore_errors=True)


def test_import_builds_the_extension(sol):
    assert callable(sol.gated_recurrence) and sol.ModelNew() and "core" in sol.built_units()


def test_build_has_no_compiler_warnings(build_log):
    if not re.search(r"\bcompiling\b", build_log, re.I):
        pytest.skip("the build was cached: no compiler output to read")
    assert compiler_warnings(build_log) == []


def test_import_builds_only_core(fresh_build):
    steps, _ = fresh_build
    assert steps["import"][0] == ["core"]


def test_build_of_one_unit_builds_that_unit(fresh_build):
    steps, _ = fresh_build
    assert sorted(steps["build chunk_bf16"][0]) == ["chunk_bf16", "core"]


def test_build_builds_every_unit_once(fresh_build):
    steps, proc = fresh_build
    built, units, _ = steps["build"]
    assert sorted(units) == ["backward", "backward_sm90", "backward_sm90_fp32", "chunk_bf16", "chunk_sm90", "chunk_tf32",
                             "core", "decode", "reference"]
    hopper = not torch.cuda.is_available() or torch.cuda.get_device_capability() == (9, 0)
    sm90a = ("chunk_sm90", "backward_sm90", "backward_sm90_fp32")  # sm_90a code where it runs
    assert sorted(built) == sorted(u for u in units if hopper or u not in sm90a)
    for unit in ("chunk_tf32", "chunk_bf16", "reference", "chunk_sm90", "decode", "backward", "backward_sm90",
                 "backward_sm90_fp32"):
        assert proc.stderr.count(f"compiling unit {unit} for ") == 1, proc.stderr[-4000:]


def test_every_unit_compiles_without_warnings(fresh_build):
    _, proc = fresh_build
    assert compiler_warnings(proc.stdout + proc.stderr) == []


def test_no_process_wide_symbols(fresh_build):
    """A static inside a template function is a GNU-unique symbol, shared by every .so in the process:
    a second build of solution.py (an edited copy re-run in a notebook) then skipped its shared-memory
    opt-in and its launches failed. Everything in a unit's kernel file but the entry points is internal."""
    if shutil.which("nm") is None:
        pytest.skip("nm (binutils) not installed")
    steps, _ = fresh_build
    paths = steps["build"][2]
    assert sorted(paths) == ["backward", "backward_sm90", "backward_sm90_fp32", "chunk_bf16", "chunk_sm90", "chunk_tf32",
                             "core", "decode", "reference"]
    for unit, path in paths.items():
        out = subprocess.run(["nm", "-C", "--defined-only", path], capture_output=True, text=True, check=True).stdout
        unique = [ln for ln in out.splitlines() if " u gr::" in ln]
        assert unique == [], f"{unit}: " + "\n".join(unique[:5])


def test_sm90_unit_is_built_for_sm90a_only(sol, fresh_build, monkeypatch):
    """chunk_sm90's wgmma is sm_90a code: its unit's nvcc line has that one target whatever
    TORCH_CUDA_ARCH_LIST says, and its build key follows the target."""
    _, proc = fresh_build
    assert "compiling unit chunk_sm90 for sm_90a " in proc.stderr, proc.stderr[-4000:]
    lines = [ln for ln in (proc.stdout + proc.stderr).splitlines() if "nvcc" in ln and "gated_recurrence_chunk_sm90_" in ln]
    assert lines, "no nvcc line of the chunk_sm90 unit in the verbose build"
    for ln in lines:
        assert "arch=compute_90a,code=sm_90a" in ln and not re.search(r"compute_(75|80|90)\b", ln), ln
    before = sol._unit_key("chunk_sm90")
    monkeypatch.setitem(sol._UNIT_GENCODE, "chunk_sm90", ["-gencode=arch=compute_100a,code=sm_100a"])
    assert sol._unit_key("chunk_sm90") != before


def test_core_key_covers_every_unit(sol, monkeypatch):
    """The core holds the table of attached units: a copy of the file with other kernels in any unit gets its
    own core (and operator namespace) instead of running the first copy's units; the other units' keys
    stay their own."""
    before = {u: sol._unit_key(u) for u in sol.UNITS}
    monkeypatch.setitem(sol._UNIT_CUDA, "chunk_bf16", sol._UNIT_CUDA["chunk_bf16"] + ["// edited\n"])
    after = {u: sol._unit_key(u) for u in sol.UNITS}
    assert after["core"] != before["core"] and after["chunk_bf16"] != before["chunk_bf16"]
    assert all(after[u] == before[u] for u in ("chunk_tf32", "reference", "chunk_sm90"))
