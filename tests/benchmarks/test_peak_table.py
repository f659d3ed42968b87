"""benchmarks/peak_table.py on literal rows (no compiling): which checks of issue #15 it flags, and the table."""

import json

import bench_measure as bm
import peak_table as pt

MIB = 2**20


def _row(config, peak, saved=1.0, step=2.0, sim=None, model="m", **extra):
    row = dict(
        model=model,
        config=config,
        saved_bytes=int(saved * MIB),
        peak_bytes=int(peak * MIB),
        step_ms=step,
        grads_matched=True,
        error=None,
    )
    row.update(extra)
    if sim is not None:
        row.update(simulated_peak_bytes=int(sim * MIB), sim_error=sim / peak - 1)
    return row


# A model that passes every check: fxremat's peak falls with the budget, stays at or below PyTorch's, peak_budget=0.0
# is the lowest, and every simulation is within 10%.
GOOD = [
    _row("pytorch_default", 10.0, saved=6.8),
    _row("pytorch_budget_0.5", 8.1, saved=3.0),
    _row("pytorch_budget_0.2", 6.8, saved=1.2),
    _row("pytorch_budget_0.0", 10.3, saved=0.0),
    _row("fxremat_default", 7.7, saved=3.8, sim=7.2),
    _row("fxremat_budget_0.5", 7.8, saved=1.8, sim=7.5),  # +1.3% over the default: within 3%
    _row("fxremat_budget_0.2", 6.8, saved=0.7, sim=6.9),
    _row("fxremat_budget_0.0", 9.0, saved=0.0, sim=8.5),
    _row("fxremat_at_pytorch_0.5", 7.0, saved=2.9, sim=7.1),
    _row("fxremat_at_pytorch_0.2", 6.7, saved=1.1, sim=6.8),
    _row("fxremat_peak_0.5", 6.9, saved=2.0, sim=7.0),
    _row("fxremat_peak_0.0", 6.8, saved=1.5, sim=6.96),
]

# issue #15's Llama stack as measured before the fix, with a failed row and a wrong gradient added.
BAD = [
    _row("pytorch_default", 9.70, saved=6.77, model="llama_stack"),
    _row("pytorch_budget_0.5", 8.10, saved=3.00, model="llama_stack"),
    _row("pytorch_budget_0.2", 6.79, saved=1.19, model="llama_stack"),
    _row("pytorch_budget_0.0", 10.0, saved=0.0, model="llama_stack"),
    _row("fxremat_default", 7.67, saved=3.77, sim=7.20, model="llama_stack"),
    _row("fxremat_budget_0.5", 10.08, saved=1.83, sim=8.08, model="llama_stack"),
    _row("fxremat_budget_0.2", 10.21, saved=0.70, sim=8.27, model="llama_stack"),
    _row("fxremat_budget_0.0", 10.28, saved=0.0, sim=9.48, model="llama_stack"),
    _row("fxremat_at_pytorch_0.5", 8.0, saved=2.9, sim=8.0, model="llama_stack", grads_matched=False),
    dict(model="llama_stack", config="fxremat_at_pytorch_0.2", error="RuntimeError: boom\ntraceback"),
    _row("fxremat_peak_0.5", 6.81, saved=2.0, sim=6.96, model="llama_stack"),
    _row("fxremat_peak_0.0", 7.50, saved=1.5, sim=7.40, model="llama_stack"),
]


def _codes(rows):
    return sorted((f.config, f.code) for f in pt.all_flags(rows))


def test_a_model_that_meets_every_check_has_no_flags():
    assert pt.all_flags(GOOD) == []
    assert "No flags." in pt.format_report(GOOD)


def test_issue_15s_llama_stack_is_flagged_on_every_check_it_fails():
    assert _codes(BAD) == [
        ("fxremat_at_pytorch_0.2", "x"),
        ("fxremat_at_pytorch_0.5", "f"),
        ("fxremat_budget_0.0", "b"),  # 10.28 above PyTorch's 10.0 at 0.0
        ("fxremat_budget_0.2", "a"),  # 10.21 against the default's 7.67
        ("fxremat_budget_0.2", "c"),  # above PyTorch 0.2's 6.79
        ("fxremat_budget_0.2", "e"),  # simulated -19%
        ("fxremat_budget_0.5", "a"),
        ("fxremat_budget_0.5", "c"),
        ("fxremat_budget_0.5", "e"),
        ("fxremat_peak_0.0", "d"),  # 7.50 against peak_budget 0.5's 6.81: more than 3% above
    ]


def test_monotone_check_compares_with_every_looser_setting():
    rows = [_row("fxremat_default", 10.0), _row("fxremat_budget_0.5", 9.0), _row("fxremat_budget_0.2", 9.5)]
    flags = pt.check_monotone("m", {r["config"]: r for r in rows})
    assert [(f.config, f.code) for f in flags] == [("fxremat_budget_0.2", "a")]  # +5.6% over 0.5's 9.0
    rows[2] = _row("fxremat_budget_0.2", 9.2)  # +2.2%: within 3%
    assert pt.check_monotone("m", {r["config"]: r for r in rows}) == []


def test_equal_bytes_row_is_judged_against_pytorch_at_the_same_setting():
    rows = {r["config"]: r for r in (_row("pytorch_budget_0.2", 6.0), _row("fxremat_at_pytorch_0.2", 6.1))}
    assert [(f.config, f.code) for f in pt.check_against_pytorch("m", rows)] == [("fxremat_at_pytorch_0.2", "c")]


def test_missing_rows_are_left_out_of_the_checks_that_need_them():
    rows = [_row("fxremat_budget_0.5", 20.0), _row("fxremat_peak_0.0", 5.0)]  # no default, no PyTorch rows
    assert pt.all_flags(rows) == []


def test_table_has_one_line_per_measured_setting_with_its_flags():
    lines = pt.table_lines(BAD, pt.all_flags(BAD))
    assert all(line.count("|") == len(pt.HEADERS) + 1 for line in lines)
    body = lines[2:]
    assert len(body) == 8  # 1.0, 0.5, 0.2, 0.0, two equal-bytes lines, two peak budgets; no 0.1 rows given
    half = next(line for line in body if "| memory_budget 0.5 |" in line)
    assert "| 8.10 | 2.0 |" in half and "| 10.08 | 8.08 (-19.8%) |" in half and half.endswith("| a,c,e |")
    failed = next(line for line in body if "0.2's saved bytes" in line)
    assert "| error | error |" in failed and failed.endswith("| x |")


def test_multi_graph_rows_say_so_instead_of_a_simulated_peak():
    row = _row("fxremat_default", 5.0, sim_note="2 Dynamo graph(s), 2 joint graph(s): no single simulated step")
    line = pt.table_lines([row], [])[2]
    assert "n/a (2 Dynamo graph(s), 2 joint graph(s))" in line


def test_every_configuration_has_a_line_in_the_table():
    # every partitioner's configuration; ``eager`` (the model uncompiled, for --checkpointed) is not a setting
    partitioned = set(bm.CONFIGS) - {bm.EAGER}
    assert partitioned <= {c for s in pt.SETTINGS for c in (s.pytorch, s.fxremat)}


def test_files_are_read_as_one_set_of_rows_later_files_winning(tmp_path):
    first, second = tmp_path / "a.json", tmp_path / "b.json"
    first.write_text(json.dumps(dict(rows=GOOD)))
    second.write_text(json.dumps(dict(rows=[_row("fxremat_peak_0.0", 9.0), *BAD])))
    rows = pt.load_rows([str(first), str(second)])
    assert len(rows) == len(GOOD) + len(BAD)
    assert ("fxremat_peak_0.0", "d") in _codes([r for r in rows if r["model"] == "m"])
    assert pt.main([str(first)]) == 0 and pt.main([str(second), "--strict"]) == 1


def test_interleaved_step_ratios_fill_their_column_and_flag_above_1_05():
    steps = [
        dict(
            model="m",
            config="fxremat_budget_0.5",
            step_ratio_same_setting=1.08,
            same_setting_as="pytorch_budget_0.5",
            step_ratio_same_setting_per_repetition=[1.07, 1.08, 1.09],
        ),
        dict(
            model="m",
            config="fxremat_default",
            step_ratio_same_setting=1.04,
            same_setting_as="pytorch_default",
            step_ratio_same_setting_per_repetition=[1.03, 1.04, 1.05],
        ),
        dict(model="m", config="pytorch_default", step_ratio_same_setting=None),
    ]
    flags = pt.all_flags(GOOD, steps)
    assert [(f.config, f.code) for f in flags] == [("fxremat_budget_0.5", "g")]
    assert "1.080x pytorch_budget_0.5's" in flags[0].text and "1.070 / 1.080 / 1.090" in flags[0].text
    lines = pt.table_lines(GOOD, flags, steps)
    column = pt.HEADERS.index("step vs PyTorch, interleaved")
    cells = {line.split(" | ")[1]: line[2:-2].split(" | ") for line in lines[2:]}
    assert cells["memory_budget 0.5"][column] == "1.080x" and cells["memory_budget 0.5"][-1] == "g"
    assert cells["memory_budget 1.0 (default)"][column] == "1.040x"
    assert cells["memory_budget 0.2"][column] == ""  # not timed interleaved


def test_a_setting_timed_only_interleaved_still_gets_its_line():
    steps = [dict(model="n", config="fxremat_at_pytorch_0.5", step_ratio_same_setting=0.98)]
    lines = pt.table_lines(GOOD, [], steps)
    assert lines[-1].startswith("| n | at PyTorch 0.5's saved bytes |") and "| 0.980x |" in lines[-1]
    assert len(lines) == 2 + 8 + 1  # GOOD: 12 rows on 8 lines (1.0, 0.5, 0.2, 0.0 pair up); one more for n
