"""CPU: the harness regex rules on solution.py. (The kernel names, the dispatch and plan() are
test_plan's.)"""
import os

import pytest

from conftest import ROOT
from eval import static_rules


def test_solution_passes_static_rules():
    errors, warnings = static_rules(os.path.join(ROOT, "solution.py"))
    assert errors == [] and warnings == [], (errors, warnings)


@pytest.mark.parametrize("bad", [
    "try:\n    x = 1\nexcept Exception:\n    x = 2\n",
    "class A:\n    pass\n",
    "import threading\n",
    "class T(torch.Tensor):\n    x = 1\n",
    "torch.cuda.synchronize = lambda: None\n",
], ids=["try-except", "pass", "threading", "tensor-subclass", "timer-patch"])
def test_static_rules_reject_cheats(tmp_path, bad):
    src = open(os.path.join(ROOT, "solution.py")).read() + "\n" + bad
    path = tmp_path / "bad_solution.py"
    path.write_text(src)
    assert static_rules(str(path))[0]
