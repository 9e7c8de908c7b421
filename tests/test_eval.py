"""eval.py rejects each deliberately wrong solution with its named reason and accepts honest ones.
Pure-torch fixtures run on the CPU (CI); those whose cheat needs CUDA run on the device."""
import os
import subprocess
import sys

import pytest

import eval as harness
from conftest import HAS_CUDA, ROOT, cuda

FIX = os.path.join(ROOT, "tests", "fixtures")
sys.path.insert(0, FIX)
REF = os.path.join(ROOT, "reference.py")
CPU_CASES = {  # fixture: (problem, check that must fail)
    "cheat_caching": ("reference.py", "cross_call_caching"),
    "cheat_mutation": ("reference.py", "input_mutation"),
    "cheat_persistent_buffer": ("reference.py", "output_integrity"),
    "cheat_zeros": ("tests/fixtures/tiny_problem.py", "correctness"),
    "cheat_static": ("reference.py", "static_rules"),
}
GPU_CASES = {"cheat_stale_memory": ("reference.py", "stale_memory"), "cheat_deferred": ("reference.py", "deferred_work")}


def run(fixture, problem="reference.py", device="cpu", timing=False):
    return harness.evaluate(os.path.join(ROOT, problem), os.path.join(FIX, fixture + ".py"), trials=2,
                            device=device, timing=timing)


@pytest.mark.parametrize("fixture", list(CPU_CASES))
def test_cheat_rejected_on_cpu(fixture):
    problem, check = CPU_CASES[fixture]
    res = run(fixture, problem)
    assert not res["correctness"]
    assert not res["checks"][check]["ok"], res["checks"]


def test_zeros_fail_for_their_scale_not_allclose():
    res = run("cheat_zeros", "tests/fixtures/tiny_problem.py")
    assert "relative L2" in res["checks"]["correctness"]["reason"] or "constant" in res["checks"]["correctness"]["reason"]


def test_honest_accepted_on_cpu():
    res = run("honest")
    assert res["correctness"], res["checks"]


@pytest.mark.parametrize("fixture, reason", [("cheat_no_backward", "no backward"), ("cheat_wrong_gradient", "input 3")])
def test_backward_cheat_rejected_on_cpu(fixture, reason):
    """--backward: a forward without autograd, and a backward that drops the gate's gradient."""
    res = harness.evaluate(REF, os.path.join(FIX, fixture + ".py"), trials=1, device="cpu", timing=False, backward=True)
    assert not res["correctness"] and not res["checks"]["gradients"]["ok"], res["checks"]
    assert reason in res["checks"]["gradients"]["reason"], res["checks"]["gradients"]


def test_backward_honest_accepted_on_cpu():
    res = harness.evaluate(REF, os.path.join(FIX, "honest.py"), trials=1, device="cpu", timing=False, backward=True)
    assert res["correctness"] and res["checks"]["gradients"]["ok"], res["checks"]
    assert "5 inputs" in res["checks"]["gradients"]["reason"]


@cuda
@pytest.mark.parametrize("fixture", list(GPU_CASES))
def test_cheat_rejected_on_gpu(fixture):
    problem, check = GPU_CASES[fixture]
    res = run(fixture, problem, device="cuda")
    assert not res["checks"][check]["ok"], res["checks"]


@cuda
def test_our_solution_passes_every_check(sol):
    res = harness.evaluate(REF, os.path.join(ROOT, "solution.py"), perf_trials=20)
    assert res["correctness"], res["checks"]
    assert res["runtime"] > 0 and res["ref_runtime"] > res["runtime"]


@cuda
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_our_solution_passes_the_backward_checks(sol, precision):
    res = harness.evaluate(REF, os.path.join(ROOT, "solution.py"), precision=precision, trials=1, perf_trials=5,
                           backward=True)
    assert res["correctness"] and res["checks"]["gradients"]["ok"], res["checks"]
    tr = res["metadata"]["training"]
    assert tr["candidate"]["median"] > 0 and tr["reference"]["median"] > tr["candidate"]["median"]


def test_eval_without_cuda_exits_nonzero_with_a_message():
    if HAS_CUDA:
        pytest.skip("a CUDA device is visible")
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "eval.py")], capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 2 and "no CUDA device" in proc.stderr


def test_static_rules_agree_with_the_shared_checker():
    """eval.py's rules give the shared script's verdict on our solution and on the static cheat."""
    shared = os.path.join(os.path.dirname(ROOT), "shared", "tools", "static_rules.py")
    if not os.path.exists(shared):
        pytest.skip("no ../shared/tools/static_rules.py beside this checkout")
    for path in (os.path.join(ROOT, "solution.py"), os.path.join(FIX, "cheat_static.py")):
        ours = not harness.static_rules(path)[0]
        theirs = subprocess.run([sys.executable, shared, path], capture_output=True).returncode == 0
        assert ours == theirs, path


def test_extra_shapes_are_checked():
    res = harness.evaluate(REF, os.path.join(FIX, "honest.py"), trials=1, device="cpu", timing=False,
                           shapes=[(1, 9, 2, 7, 5), (2, 4, 1, 33)])
    assert res["checks"]["extra_shapes"]["ok"] and len(res["shapes"]) == 2
    res = harness.evaluate(REF, os.path.join(FIX, "cheat_caching.py"), trials=1, device="cpu", timing=False,
                           shapes=[(1, 9, 2, 7, 5)])
    assert res["shapes"][0]["ok"]  # one call per shape: caching is not what this check is for


def test_cli_cpu_mode_report(capsys):
    assert harness.main(["--device", "cpu", "--solution", os.path.join(FIX, "honest.py"), "--trials", "1",
                         "--shapes", "1,5,1,3"]) == 0
    out = capsys.readouterr().out
    assert "verdict: CORRECT" in out and "cross_call_caching" in out


def test_cpu_mode_refuses_a_cuda_solution_at_once(capsys):
    """--device cpu with a solution that compiles CUDA: one line, exit 2, before anything is built."""
    assert harness.main(["--device", "cpu", "--solution", os.path.join(ROOT, "solution.py")]) == 2
    assert "compiles CUDA kernels and needs a CUDA device" in capsys.readouterr().err


def test_help_explains_every_option_with_its_default():
    text = subprocess.run([sys.executable, os.path.join(ROOT, "eval.py"), "--help"], capture_output=True, text=True,
                          cwd=ROOT).stdout
    for option in ("--ref", "--solution", "--precision", "--trials", "--perf-trials", "--seed", "--device",
                   "--shapes", "--compile", "--json"):
        assert option in text
    for default in ("(default: 5)", "(default: 100)", "(default: 42)", "(default: cuda)", "(default: fp32)"):
        assert default in " ".join(text.split()), default
