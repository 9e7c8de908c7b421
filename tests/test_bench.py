"""CPU: bench.py writes its table into BENCHMARKS.md's generated section and nowhere else."""
import json
import os
import shutil
import sys

import bench
from conftest import ROOT

# The runs BENCHMARKS.md's generated section was made of (bench.py --from-json, in this order).
STORED_RUNS = [os.path.join(ROOT, "docs", f) for f in
               ("bench-2026-12-04-s42.json", "bench-sweep-2026-12-04-s42.json", "bench-train-2026-12-04-s39.json")]


def stored():
    """The stored runs merged as bench.py --from-json merges them."""
    return bench.merge_results([json.load(open(f)) for f in STORED_RUNS])


def shapes_only():
    """The stored run's shapes table alone (without the other tables BENCHMARKS.md's generated section holds)."""
    result = stored()
    for key in ("decode", "decode_floor", "command_decode", "rates_decode", "train", "commands"):
        result.pop(key, None)
    return result


def test_generated_section_is_replaced_and_the_rest_kept(tmp_path):
    path = tmp_path / "BENCHMARKS.md"
    shutil.copy(os.path.join(ROOT, "BENCHMARKS.md"), path)
    before = path.read_text()
    result = shapes_only()
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
    assert bench.markdown(stored()["rows"]) in text


def test_runs_split_over_processes_merge_in_order(tmp_path, monkeypatch):
    """--from-json A,B: the shapes rows, then the training rows, of runs stored apart; every command named."""
    runs = stored()
    a = {k: v for k, v in runs.items() if k not in ("train", "commands")}
    b = {**a, "command": "bench.py --shapes '' --train", "rows": [], "train": runs["train"][:1]}
    c = {**a, "command": "bench.py --shapes '' --train --train-shapes S2", "rows": [], "train": runs["train"][1:]}
    files = []
    for name, res in (("a", a), ("b", b), ("c", c)):
        files.append(tmp_path / f"{name}.json")
        files[-1].write_text(json.dumps(res))
    path = tmp_path / "BENCHMARKS.md"
    shutil.copy(os.path.join(ROOT, "BENCHMARKS.md"), path)
    monkeypatch.setattr(sys, "argv", ["bench.py", "--from-json", ",".join(map(str, files)), "--out",
                                      str(tmp_path / "out"), "--benchmarks", str(path)])
    bench.main()
    md = (tmp_path / "out" / "bench.md").read_text()
    assert md == bench.markdown(a["rows"]) + "\n\n" + bench.train_markdown(runs["train"]) + "\n"
    section = path.read_text().split(bench.BEGIN_MARK)[1].split(bench.END_MARK)[0]
    assert all(f"`python3 {r['command']}`" in section for r in (a, b, c)) and "(one process each)" in section


def test_file_without_the_section_is_left_alone(tmp_path):
    path = tmp_path / "other.md"
    path.write_text("# nothing generated here\n")
    assert not bench.update_benchmarks(str(path), stored())
    assert path.read_text() == "# nothing generated here\n"


def test_floor_table_follows_the_shapes_table():
    """With S0 measured, bench.md and the generated section also set ours beside its floor."""
    result = shapes_only()
    result["floor"] = [{"what": "floor: empty_like(v).zero_()", "dtype": "float32", "kb_median_us": 3.1,
                        "kb_mean_us": 3.4, "graph_us": 1.0, "host_us": 8.2}]
    text = bench.tables(result)
    assert text.startswith(bench.markdown(result["rows"]))
    assert "| floor: empty_like(v).zero_() | float32 | 3.10 us | 3.40 us | 1.00 us | 8.20 us |" in text
    del result["floor"]
    assert bench.tables(result) == bench.markdown(result["rows"])


def decode_result():
    """A run of table D1 alone (two rows, the second above the error check's B) with its launch floor."""
    row = {"T": 1, "H": 32, "D_k": 128, "D_v": 128, "dtype": "bfloat16", "plan": "decode (DECODE_SRC) grid=32x1"}
    return {"command": "bench.py --decode --shapes '' --out /root/out", "date": "2026-12-02", "device": "NVIDIA H200",
            "torch": "2.11.0+cu130", "rows": [], "rates": {"copy_TBps": 4.05},
            "decode": [{**row, "B": 1, "bytes": 4210696, "ours_kb_us": 5.43, "ours_graph_us": 2.61, "ours_TBps": 0.78,
                        "mem_floor_us": 1.04, "today_kb_us": 9.87, "fla_fused_recurrent_kb_us": 21.5, "y_err": 3.2e-3},
                       {**row, "B": 128, "bytes": 538968064, "ours_kb_us": 151.3, "ours_graph_us": 140.0,
                        "ours_TBps": 3.56, "mem_floor_us": 133.08, "today_kb_us": 301.5}],
            "decode_floor": {"what": "floor: empty_like(v).zero_()", "B": 1, "kb_median_us": 3.1, "kb_mean_us": 3.4,
                             "graph_us": 1.0, "host_us": 8.2, "graph_call_us": 2.2}}


def from_json(tmp_path, monkeypatch, result):
    """bench.py --from-json of `result` with --benchmarks on a copy of BENCHMARKS.md: (bench.md's text, the copy)."""
    src = tmp_path / "bench.json"
    src.write_text(json.dumps(result))
    path = tmp_path / "BENCHMARKS.md"
    shutil.copy(os.path.join(ROOT, "BENCHMARKS.md"), path)
    monkeypatch.setattr(sys, "argv", ["bench.py", "--from-json", str(src), "--out", str(tmp_path / "out"),
                                      "--benchmarks", str(path)])
    bench.main()
    return (tmp_path / "out" / "bench.md").read_text(), path


def test_decode_table_from_json(tmp_path, monkeypatch, capsys):
    """--from-json of a --decode run alone: bench.md and the generated section hold table D1 (its header, the
    rows, "-" where a row has no measurement, the launch floor) and no shapes table."""
    md, path = from_json(tmp_path, monkeypatch, decode_result())
    assert md.startswith("Decode step D1, `gated_recurrence_decode_` (T = 1, H = 32, D_k = 128, D_v = 128, bfloat16")
    assert "copy bandwidth of the same run (4.05 TB/s)" in md
    assert ("| B | plan | ours KB us | ours graph us | TB/s | memory floor us | ours / floor | today's path us "
            "| fla fused_recurrent us | y err |") in md
    assert "| 1 | decode (DECODE_SRC) grid=32x1 | 5.43 | 2.61 | 0.78 | 1.04 | 5.22x | 9.87 | 21.50 | 3.2e-03 |" in md
    assert "| 128 | decode (DECODE_SRC) grid=32x1 | 151.3 | 140.0 | 3.56 | 133.1 | 1.14x | 301.5 | - | - |" in md
    assert "KernelBench median 3.10 us, graph replay 2.20 us per call" in md
    assert "| shape |" not in md
    section = path.read_text().split(bench.BEGIN_MARK)[1].split(bench.END_MARK)[0]
    assert md.strip() in section and decode_result()["command"] in section
    assert md.strip() in capsys.readouterr().out


def test_decode_table_follows_the_other_tables():
    """With shapes, the floor table and a decode run in one result, the decode table comes last."""
    result = shapes_only()
    result["floor"] = [{"what": "floor: empty_like(v).zero_()", "dtype": "float32", "kb_median_us": 3.1,
                        "kb_mean_us": 3.4, "graph_us": 1.0, "host_us": 8.2}]
    result["decode"] = decode_result()["decode"]
    text = bench.tables(result)
    assert text.startswith(bench.markdown(result["rows"]) + "\n\n" + bench.floor_markdown(result["floor"]) + "\n\n")
    assert text.endswith(bench.decode_markdown(result["decode"], None, result["rates"]["copy_TBps"]))


def varlen_result():
    """A run of table V1 alone: ours (hinted, unhinted, uniform, uniform forced to varlen's kernel) and fla."""
    plan_v = "chunk_bf16 (CHUNK_BF16_SRC, unit chunk_bf16) C=64 NV=64 D_k=128 compiled segments=1 grid=4096x256"
    plan_u = "chunk_sm90 (CHUNK_SM90_SRC, unit chunk_sm90) C=64 D_k=128 compiled D_v=128 segments=1 grid=1024x384"

    def row(key, what, ms, tokens, plan):
        return {"key": key, "what": what, "ms": ms, "ms_rounds": [ms] * 3, "tokens": tokens,
                "mem_floor_ms": tokens * 32 * (4 * 128 + 2) * 2 / 4.0e12 * 1e3, "plan": plan}
    return {"command": "bench.py --shapes '' --varlen --trials 20 --out /root/out", "date": "2026-12-03",
            "device": "NVIDIA H200", "torch": "2.11.0+cu130", "rows": [], "rates": {"copy_TBps": 4.0},
            "varlen": {"N": 64, "H": 32, "D_k": 128, "D_v": 128, "dtype": "bfloat16", "lengths": [1] * 64,
                       "total": 140210, "max_seqlen": 4034, "uniform_B": 32, "uniform_T": 4382, "rounds": 3,
                       "trials": 20, "plan_varlen": plan_v, "plan_uniform": plan_u, "kernel_varlen": "chunk_bf16",
                       "kernel_uniform": "chunk_sm90", "fla_takes_cu_seqlens_cpu": False, "ours_err": 1.7e-3,
                       "fla_err": 2.9e-3, "no_hints_bitwise": True, "check": {"seqs": 4, "max_T": 512, "tokens": 2048},
                       "rows": [row("ours_varlen_hints", "ours varlen, hints", 1.2, 140210, plan_v),
                                row("ours_varlen", "ours varlen, no hints", 1.25, 140210, plan_v),
                                row("ours_uniform", "ours uniform", 1.0, 140224, plan_u),
                                row("ours_uniform_kernel", "ours uniform forced", 1.1, 140224, "chunk_bf16 forced"),
                                row("fla_varlen", "fla varlen", 2.4, 140210, "-"),
                                row("fla_uniform", "fla uniform", 2.0, 140224, "-")]}}


def test_varlen_table_from_json(tmp_path, monkeypatch):
    """--from-json of a --varlen run alone: bench.md and the generated section hold table V1 (its header, the
    ratios to the uniform batch of the same library and to fla varlen, both plans, the same-kernel ratio)."""
    result = varlen_result()
    md, path = from_json(tmp_path, monkeypatch, result)
    assert md.startswith("Packed variable-length prefill V1, `gated_recurrence(cu_seqlens=...)` (64 sequences")
    assert "140210 tokens, longest 4034" in md and "ceil(140210 / 32) = 4382 in one dense batch (14 tokens more)" in md
    assert "copy bandwidth of the same run (4.00 TB/s)" in md
    assert "first 4 sequences, each truncated to 512 tokens: ours 1.7e-03, fla 2.9e-03" in md
    assert "| V1 row | ms | tokens | / uniform | / fla varlen | memory floor ms | plan |" in md
    floor = 140210 * 32 * 514 * 2 / 4.0e12 * 1e3
    assert f"| ours varlen, hints | 1.200 | 140210 | 1.20x | 0.50x | {floor:.3f} | chunk_bf16 (CHUNK_BF16_SRC" in md
    assert "| ours uniform forced | 1.100 | 140224 | 1.10x | 0.46x |" in md
    assert "| fla varlen | 2.400 | 140210 | 1.20x | 1.00x |" in md
    assert "Plans: varlen `chunk_bf16 (CHUNK_BF16_SRC" in md and "uniform `chunk_sm90 (CHUNK_SM90_SRC" in md
    assert "ours varlen with hints / the uniform batch forced to it = 1.09x." in md
    assert "| shape |" not in md and "Decode step D1" not in md
    section = path.read_text().split(bench.BEGIN_MARK)[1].split(bench.END_MARK)[0]
    assert md.strip() in section and result["command"] in section


def test_varlen_table_comes_last():
    """With shapes, the floor table, decode and varlen in one result, table V1 comes after D1."""
    result = shapes_only()
    result["decode"] = decode_result()["decode"]
    result["varlen"] = varlen_result()["varlen"]
    text = bench.tables(result)
    assert text.endswith("\n\n" + bench.varlen_markdown(result["varlen"], result["rates"]["copy_TBps"]))
    assert text.index("Decode step D1") < text.index("Packed variable-length prefill V1")


def test_varlen_lengths_are_the_issue_draw():
    lengths = bench.varlen_lengths()
    assert lengths.shape == (64,) and int(lengths.min()) >= 1 and int(lengths.max()) <= 4096
    assert int(lengths.sum()) == 140210 and int(lengths.max()) == 4034
