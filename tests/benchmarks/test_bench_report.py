"""The orchestrator's bookkeeping and the output formatting, on hand-made rows (no compiling)."""

import json

import bench_report as br
import run


def _row(model, config, saved=100, peak=1000, step=2.0, **extra):
    return dict(model=model, config=config, saved_bytes=saved, peak_bytes=peak, step_ms=step, error=None, **extra)


def test_ratios_are_against_the_same_models_pytorch_default():
    rows = br.add_ratios(
        [_row("a", "pytorch_default"), _row("a", "fxremat_default", saved=50, step=3.0), _row("b", "fxremat_default")]
    )
    assert rows[1]["saved_ratio"] == 0.5 and rows[1]["step_ratio"] == 1.5 and rows[1]["peak_ratio"] == 1.0
    assert rows[2]["saved_ratio"] is None  # model b has no baseline row


def test_budget_comes_from_the_measured_pytorch_budget_row():
    rows = [_row("a", "pytorch_budget_0.5", saved=1234), _row("b", "pytorch_budget_0.5", saved=9)]
    assert run.budget_for("a", "fxremat_at_pytorch_0.5", rows) == (1234, None)
    assert run.budget_for("a", "fxremat_default", rows) == (None, None)
    budget, why = run.budget_for("a", "fxremat_at_pytorch_0.1", rows)
    assert budget is None and "pytorch_budget_0.1" in why


def test_plan_puts_budget_sources_before_their_users():
    runs = run.plan(["m"], ["fxremat_at_pytorch_0.1", "pytorch_budget_0.1", "pytorch_default"])
    assert runs == [("m", "pytorch_default"), ("m", "pytorch_budget_0.1"), ("m", "fxremat_at_pytorch_0.1")]


def test_a_failing_run_becomes_an_error_row_and_the_others_go_on():
    def runner(model, config, budget):
        if model == "bad":
            raise RuntimeError("boom")
        return _row(model, config)

    rows = run.run_all([("bad", "pytorch_default"), ("good", "pytorch_default")], runner, "tiny")
    assert rows[0]["error"] == "RuntimeError: boom" and rows[1]["error"] is None


def test_worker_output_is_the_last_marked_line():
    row = _row("a", "pytorch_default")
    stdout = f"noise\n{run.ROW_MARKER}{json.dumps({'old': 1})}\nmore noise\n{run.ROW_MARKER}{json.dumps(row)}\n"
    assert run.parse_worker_output(stdout) == row
    assert run.parse_worker_output("no result here") is None


def test_markdown_table_has_one_line_per_row_and_shows_errors():
    rows = br.add_ratios(
        [
            _row("a", "pytorch_default", grads_matched=True),
            dict(model="a", config="fxremat_default", error="ValueError: bad | thing\nmore"),
        ]
    )
    lines = br.markdown_table(rows).strip().splitlines()
    assert len(lines) == 4 and all(line.count("|") == len(br.HEADERS) + 1 for line in lines)
    assert "error: ValueError: bad / thing" in lines[3]


def test_a_missing_transformers_gives_an_error_row(monkeypatch):
    import sys

    import bench_measure as bm

    monkeypatch.setitem(sys.modules, "transformers", None)  # import transformers now raises ImportError
    row = bm.measure_or_error("gpt2", "tiny", "pytorch_default", 1, "cpu")
    assert row["model"] == "gpt2" and row["config"] == "pytorch_default"
    assert row["error"].startswith(("ModuleNotFoundError", "ImportError")), row["error"]


def test_issue15_configurations_exist_and_run_after_their_budget_sources():
    import bench_measure as bm

    assert set(bm.ISSUE15_CONFIGS) <= set(bm.CONFIGS) and set(bm.DEFAULT_CONFIGS) <= set(bm.CONFIGS)
    issue15 = (
        "fxremat_budget_0.5",
        "fxremat_budget_0.2",
        "fxremat_budget_0.0",
        "fxremat_peak_0.5",
        "fxremat_peak_0.0",
        "pytorch_budget_0.2",
        "pytorch_budget_0.0",
        "fxremat_at_pytorch_0.2",
    )
    assert set(issue15) <= set(bm.ISSUE15_CONFIGS)
    order = {config: i for i, config in enumerate(bm.CONFIGS)}
    for user, source in {**bm.BUDGET_SOURCES, **bm.PEAK_AT_SOURCES}.items():
        assert order[source] < order[user]


def test_configuration_sets_expand_on_the_command_line():
    import bench_measure as bm

    args = run.parse_args(["--configs", "issue15", "pytorch_default", "fxremat_peak_at_pytorch_0.5"])
    assert args.configs == [*bm.ISSUE15_CONFIGS, "fxremat_peak_at_pytorch_0.5"]
    assert run.parse_args([]).configs == list(bm.DEFAULT_CONFIGS)
    assert "llama_stack" in run.parse_args([]).models


def test_budget_at_pytorch_0_2_comes_from_its_own_row():
    rows = [_row("a", "pytorch_budget_0.5", saved=1234), _row("a", "pytorch_budget_0.2", saved=567)]
    assert run.budget_for("a", "fxremat_at_pytorch_0.2", rows) == (567, None)
    assert run.budget_for("a", "fxremat_budget_0.2", rows) == (None, None)  # a fraction: needs no PyTorch row
    failed = [dict(model="a", config="pytorch_budget_0.2", error="boom")]
    budget, why = run.budget_for("a", "fxremat_at_pytorch_0.2", failed)
    assert budget is None and "pytorch_budget_0.2" in why


def test_fxremat_budget_configurations_pass_the_fraction():
    import bench_measure as bm

    for config, fraction in bm.FXREMAT_BUDGETS.items():
        backend, _ = bm.make_backend(config, None)
        assert backend.options.memory_budget == fraction and backend.options.compare_default is False


class _Report:
    def __init__(self, simulated, at="backward:mm"):
        self.simulated_peak_bytes, self.simulated_peak_at = simulated, at


class _Backend:
    def __init__(self, *reports):
        self.reports = list(reports)


def test_simulated_peak_beside_the_measured_one():
    import bench_measure as bm

    facts = bm.simulated_facts(_Backend(_Report(1100)), peak_bytes=1000, graphs=1)
    assert facts["simulated_peak_bytes"] == 1100 and abs(facts["sim_error"] - 0.1) < 1e-12
    assert facts["simulated_peak_at"] == "backward:mm" and facts["sim_note"] is None
    assert bm.simulated_facts("inductor", 1000, 1) == {}  # a PyTorch row has no report


def test_several_graphs_give_no_single_simulated_step():
    import bench_measure as bm

    for backend, graphs in ((_Backend(_Report(10), _Report(20)), 2), (_Backend(_Report(10)), 2)):
        facts = bm.simulated_facts(backend, peak_bytes=1000, graphs=graphs)
        assert facts["simulated_peak_bytes"] is None and facts["sim_error"] is None
        assert "no single simulated step" in facts["sim_note"]
        assert facts["simulated_peak_bytes_per_graph"] == [r.simulated_peak_bytes for r in backend.reports]
    facts = bm.simulated_facts(_Backend(_Report(None)), peak_bytes=1000, graphs=1)
    assert facts["sim_error"] is None and "no simulation" in facts["sim_note"]


def test_markdown_shows_the_simulated_peak_and_its_error():
    row = _row("a", "fxremat_default", peak=2**20, simulated_peak_bytes=int(1.05 * 2**20), sim_error=0.05)
    cells = br.table_cells(br.add_ratios([row])[0])
    assert cells[br.HEADERS.index("sim peak MiB")] == "1.05" and cells[br.HEADERS.index("sim err")] == "+5.0%"


class _FailingReport:
    @property
    def simulated_peak_bytes(self):
        raise RuntimeError("no timeline")


def test_a_failing_simulation_keeps_the_row_and_says_why():
    import bench_measure as bm

    facts = bm.simulated_facts(_Backend(_FailingReport()), peak_bytes=1000, graphs=1)
    assert facts["simulated_peak_bytes"] is None and facts["sim_note"] == "simulation failed: RuntimeError: no timeline"
