"""CPU: bench.py writes its table into BENCHMARKS.md's generated section and nowhere else."""
import json
import os
import shutil

import bench
from conftest import ROOT

STORED = os.path.join(ROOT, "docs", "bench-2026-12-01-s10.json")


def test_generated_section_is_replaced_and_the_rest_kept(tmp_path):
    path = tmp_path / "BENCHMARKS.md"
    shutil.copy(os.path.join(ROOT, "BENCHMARKS.md"), path)
    before = path.read_text()
    result = json.load(open(STORED))
    result["rows"] = result["rows"][:2]  # a different table than the stored one
    result.pop("floor", None)
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


def test_floor_table_follows_the_shapes_table():
    """With S0 measured, bench.md and the generated section also set ours beside its floor."""
    result = json.load(open(STORED))
    result["floor"] = [{"what": "floor: empty_like(v).zero_()", "dtype": "float32", "kb_median_us": 3.1,
                        "kb_mean_us": 3.4, "graph_us": 1.0, "host_us": 8.2}]
    text = bench.tables(result)
    assert text.startswith(bench.markdown(result["rows"]))
    assert "| floor: empty_like(v).zero_() | float32 | 3.10 us | 3.40 us | 1.00 us | 8.20 us |" in text
    del result["floor"]
    assert bench.tables(result) == bench.markdown(result["rows"])
