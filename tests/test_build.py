"""CPU: the CUDA source compiles (import solution) without a compiler warning."""
import re

import pytest


def test_import_builds_the_extension(sol):
    assert callable(sol.gated_recurrence) and sol.ModelNew()


def test_build_has_no_compiler_warnings(build_log):
    if "compiling the CUDA extension" not in build_log:
        pytest.skip("the build was cached: no compiler output to read")
    hits = [ln for ln in build_log.splitlines() if re.search(r"\bwarning\b\s*(#|:)", ln, re.I) and "UserWarning" not in ln]
    assert hits == [], "\n".join(hits)
