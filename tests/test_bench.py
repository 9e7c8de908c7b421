"""CPU: bench.py writes its table into BENCHMARKS.md's generated section and nowhere else."""
import json
import os
import shutil

import bench
from conftest import ROOT

STORED = os.path.join(ROOT, "docs", "bench-2026-11-29-s5.json")


def test_generated_section_is_replaced_and_the_rest_kept(tmp_path):
    path = tmp_path / "BENCHMARKS.md"
    shutil.copy(os.path.join(ROOT, "BENCHMARKS.md"), path)
    before = path.read_text()
    result = json.load(open(STORED))
    result["rows"] = result["rows"][:2]  # a different table than the stored one
    assert bench.update_benchmarks(str(path), result)
    after = path.read_text()
    head, rest = after.split(bench.BEGIN_MARK)
    section, tail = rest.split(bench.END_MARK)
    assert before.startswith(head) and before.endswith(tail)
    assert bench.markdown(result["rows"]) in section and result["command"] in section
    assert section.count("\n| ") == 3  # the header and two rows


def test_stored_run_is_the_table_in_benchmarks_md():
    """BENCHMARKS.md's generated section is what bench.py makes of the stored JSON (no hand edits)."""
    text = open(os.path.join(ROOT, "BENCHMARKS.md")).read()
    assert bench.markdown(json.load(open(STORED))["rows"]) in text


def test_file_without_the_section_is_left_alone(tmp_path):
    path = tmp_path / "other.md"
    path.write_text("# nothing generated here\n")
    assert not bench.update_benchmarks(str(path), json.load(open(STORED)))
    assert path.read_text() == "# nothing generated here\n"
