"""fxremat-report, run as users run it (a subprocess: ``python -m fxremat.cli``, the ``fxremat-report`` script,
``tools/cut_report.py``), in every format; its saved bytes against an independent saved_tensors_hooks measurement
of the same compile path; bad input; a tiny transformers GPT-2.  Mostly ``--no-codegen`` (seconds each); one real
Inductor run.  Error cases that need no subprocess call ``main()`` in-process: a second per case saved.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import textwrap
from html.parser import HTMLParser
from pathlib import Path

import pytest
import torch
from helpers import noop_compiler, run_fxremat_aot

import fxremat
from fxremat import cli
from fxremat.examples import EXAMPLES, example
from fxremat.measure import measure_saved
from fxremat.options import Options
from fxremat.render import format_bytes, format_html, module_bytes, svg_pareto
from fxremat.report import CutReport

REPO = Path(__file__).resolve().parents[2]

SMALL_TARGET = '''
import torch
import torch.nn as nn


class TwoOutputs(nn.Module):
    """Returns (y, aux): the tool's loss is the first tensor, summed."""

    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(32, 128)
        self.fc2 = nn.Linear(128, 32)

    def forward(self, x):
        h = torch.tanh(self.fc1(x))
        return self.fc2(h), h.detach()


def build():
    return TwoOutputs(), (torch.randn(16, 32),)


def not_a_pair():
    return TwoOutputs()


def broken():
    return nn.Linear(4, 4), (torch.randn(2, 5),)


class Raises(nn.Module):
    def forward(self, x):
        raise ValueError("first line\\nsecond line")


def raises_two_lines():
    return Raises(), [torch.randn(2)]
'''


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    """The subprocesses' environment: a private Inductor cache, and no inherited report dir."""
    values = dict(os.environ)
    values["TORCHINDUCTOR_CACHE_DIR"] = str(tmp_path_factory.mktemp("inductor-cache"))
    values.pop("FXREMAT_REPORT_DIR", None)
    return values


@pytest.fixture(scope="module")
def small_target(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("target") / "small_model.py"
    path.write_text(SMALL_TARGET)
    return path


def run_tool(args: list[str], env: dict, command: list[str] | None = None, timeout: float = 300):
    command = command or [sys.executable, "-m", "fxremat.cli"]
    return subprocess.run(
        [*command, *args], env=env, cwd=REPO, capture_output=True, text=True, timeout=timeout, check=False
    )


def console_script() -> str:
    """The installed ``fxremat-report``, next to this interpreter (a venv) or on PATH."""
    name = "fxremat-report.exe" if os.name == "nt" else "fxremat-report"
    beside = Path(sysconfig.get_path("scripts")) / name
    found = str(beside) if beside.exists() else shutil.which("fxremat-report")
    if found is None:
        pytest.skip("fxremat-report is not installed (pip install -e .)")
    return found


def assert_ok(result) -> None:
    assert result.returncode == 0, f"exit {result.returncode}\nstdout:\n{result.stdout}\nstderr:\n{result.stderr}"


def measured_saved_bytes(name: str) -> tuple[int, int]:
    """(saved bytes measured with saved_tensors_hooks, report.saved_bytes), for a built-in example compiled the
    way ``--no-codegen`` compiles it: Dynamo + AOTAutograd with no-op compilers and fxremat's partition_fn."""
    from fxremat_passes import _torch_private as tp

    torch.manual_seed(0)
    model, inputs = example(name)
    reports: list[CutReport] = []
    partition_fn = fxremat.make_partition_fn(Options.create(), reports)
    backend = tp.aot_autograd_as_inductor(partition_fn, noop_compiler)
    compiled = torch.compile(model, backend=backend)
    exclude = [*model.parameters(), *model.buffers(), *inputs]
    out, saved = measure_saved(lambda: compiled(*inputs), exclude)
    out.sum().backward()
    assert len(reports) == 1
    return saved.nbytes, reports[0].saved_bytes


# --- the three formats ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def json_out(env, tmp_path_factory) -> dict:
    """block_sdpa through the installed console script, JSON files into --out."""
    out = tmp_path_factory.mktemp("json-out")
    result = run_tool(
        ["block_sdpa", "--no-codegen", "--format", "json", "--diff-default", "--out", str(out)],
        env,
        command=[console_script()],
    )
    assert_ok(result)
    files = sorted(out.iterdir())
    assert [f.name for f in files] == ["graph_0.json"]
    assert result.stdout.strip() == str(files[0])
    return dict(text=files[0].read_text(), data=json.loads(files[0].read_text()))


def test_json_saved_bytes_equal_saved_tensor_hooks(json_out):
    measured, in_process = measured_saved_bytes("block_sdpa")
    assert json_out["data"]["saved_bytes"] == measured == in_process
    assert json_out["data"]["saved_bytes"] < json_out["data"]["baseline_saved_bytes"]


def test_batchnorm_model_in_process(tmp_path):
    """main() in-process (no interpreter start-up): a BatchNorm model, whose running stats are updated in the
    forward, through --no-codegen; its JSON against the measurement."""
    assert cli.main(["convnet", "--no-codegen", "--format", "json", "--out", str(tmp_path)]) == 0
    (written,) = tmp_path.glob("*.json")
    measured, _ = measured_saved_bytes("convnet")
    assert json.loads(written.read_text())["saved_bytes"] == measured


def test_json_is_stable_and_versioned(json_out):
    data = json_out["data"]
    assert json_out["text"] == json.dumps(data, indent=2, sort_keys=True) + "\n"  # sorted keys, one layout
    assert data["schema_version"] == 2 and "extra" not in data
    report = CutReport.from_dict(data)  # the schema round-trips
    assert CutReport.from_dict({**data, "schema_version": 1, "extra": {}}) == report  # schema 1's "extra" is dropped
    assert report.saved_bytes == data["saved_bytes"] and len(report.saved) == len(data["saved"])
    row_fields = {"name", "op", "shape", "dtype", "nbytes", "nbytes_expr", "storage", "counted", "source", "module"}
    assert all(set(row) == row_fields | {"storage_nbytes"} for row in data["saved"] + data["baseline_saved"])
    # the per-module bars add up to each partitioner's saved bytes (a saved slice counts its whole storage)
    assert sum(module_bytes(report.saved).values()) == report.saved_bytes
    assert sum(module_bytes(report.baseline_saved).values()) == report.baseline_saved_bytes
    assert {r["module"] for r in data["saved"] if r["counted"]} >= {"qkv", "fc1"}  # from Dynamo's module stack


def test_json_diff_default(json_out):
    data = json_out["data"]
    ours = {r["name"] for r in data["saved"]}
    theirs = {r["name"] for r in data["baseline_saved"]}
    diff = data["diff_default"]
    assert diff["only_fxremat"] and sorted(diff["only_fxremat"]) == sorted(ours - theirs)
    assert diff["only_default"] and sorted(diff["only_default"]) == sorted(theirs - ours)
    assert diff["both"] == sorted(ours & theirs)


def test_text_report_of_a_target_file(small_target, env):
    """Through the checkout's tools/cut_report.py wrapper."""
    wrapper = [sys.executable, str(REPO / "tools" / "cut_report.py")]
    result = run_tool([f"{small_target}:build", "--no-codegen", "--diff-default"], env, command=wrapper)
    assert_ok(result)
    text = result.stdout
    assert text.startswith("fxremat cut report: graph_0")
    assert "saved for backward" in text and "module" in text and "source" in text
    assert "small_model.py:" in text  # the source column names the user's file
    assert "saved only by fxremat" in text and "saved only by PyTorch default" in text


class _Collect(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: dict[str, int] = {}
        self.attrs: list[tuple[str, str | None]] = []
        self.text: list[str] = []
        self.svg_text: list[str] = []
        self._in_svg_text = 0

    def handle_starttag(self, tag, attrs):
        self.tags[tag] = self.tags.get(tag, 0) + 1
        self.attrs += attrs
        if tag == "text":
            self._in_svg_text += 1

    def handle_endtag(self, tag):
        if tag == "text":
            self._in_svg_text -= 1

    def handle_data(self, data):
        self.text.append(data)
        if self._in_svg_text:
            self.svg_text.append(data)


def test_html_report_is_self_contained(env):
    result = run_tool(["stack", "--no-codegen", "--format", "html"], env)
    assert_ok(result)
    page = _Collect()
    page.feed(result.stdout)
    assert page.tags["svg"] == 4  # per-module bars, memory vs recompute, memory timelines of both splits
    assert page.tags["table"] >= 3  # summary, saved, recomputed
    assert page.tags["rect"] > 10 and page.tags["circle"] >= 2
    assert not {"script", "link", "img", "iframe"} & set(page.tags)
    urls = [value for name, value in page.attrs if name in ("src", "href") and value and not value.startswith("#")]
    assert urls == [], urls  # nothing fetched: only in-page anchors
    text = " ".join(page.text)
    assert "saved bytes" in text and "PyTorch default" in text and "partition time" in text
    assert {"blocks.0.fc1", "blocks.1.qkv", "fxremat"} <= set(page.svg_text)


class _Timelines(HTMLParser):
    """Per memory-timeline chart (an svg labelled "memory timeline: ..."): its polyline's points and its texts."""

    def __init__(self):
        super().__init__()
        self.charts: dict[str, dict] = {}
        self.current: dict | None = None
        self.in_peak_label = False

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "svg" and (attrs.get("aria-label") or "").startswith("memory timeline: "):
            self.current = self.charts.setdefault(attrs["aria-label"], dict(points=None, peak=[], boundaries=0))
        elif self.current is not None and tag == "polyline" and attrs.get("class") == "timeline":
            self.current["points"] = (int(attrs["data-points"]), len(attrs["points"].split()))
        elif self.current is not None and tag == "line" and attrs.get("class") == "boundary":
            self.current["boundaries"] += 1
        self.in_peak_label = self.current is not None and tag == "text" and attrs.get("class") == "peak-label"

    def handle_endtag(self, tag):
        if tag == "svg":
            self.current = None
        self.in_peak_label = False

    def handle_data(self, data):
        if self.in_peak_label:
            self.current["peak"].append(data)


def test_html_memory_timeline_chart_has_every_point_and_labels_the_peak():
    model, inputs = example("stack")
    report = run_fxremat_aot(model, inputs, strict=True, compare_default=True)[3][0]
    assert report.memory_timeline and report.baseline_memory_timeline
    page = _Timelines()
    page.feed(format_html([report]))
    assert set(page.charts) == {"memory timeline: fxremat", "memory timeline: PyTorch default"}
    for label, timeline, peak, at in (
        ("fxremat", report.memory_timeline, report.simulated_peak_bytes, report.simulated_peak_at),
        (
            "PyTorch default",
            report.baseline_memory_timeline,
            report.baseline_simulated_peak_bytes,
            report.baseline_simulated_peak_at,
        ),
    ):
        chart = page.charts[f"memory timeline: {label}"]
        assert chart["points"] == (len(timeline), 2 * len(timeline))  # a step chart: two vertices per node
        assert chart["peak"] == [f"peak {format_bytes(peak)}", f"at {at}"]
        assert at in {f"{phase}:{node}" for phase, node, _ in timeline}  # the downsampled timeline keeps the peak
        assert max(b for _, _, b in timeline) == peak
        assert chart["boundaries"] == 1  # forward | backward


def test_a_report_without_the_comparison_says_so():
    """compare_default=False (the default): text and HTML say "not compared" where PyTorch's figures would be, never
    zeros or blanks; nothing of the comparison is drawn."""
    model, inputs = example("mlp")
    report = run_fxremat_aot(model, inputs, strict=True, compare_default=False)[3][0]
    assert report.baseline_saved_bytes is None and report.baseline_error is None
    text = fxremat.format_text(report, diff=True)
    assert "PyTorch default partition: not compared (compare_default=False)" in text
    assert "no PyTorch default partition to compare with: not compared (compare_default=False)" in text
    page = _Collect()
    page.feed(format_html([report], diff=True))
    words = " ".join(page.text)
    assert "PyTorch default partition: not compared (compare_default=False)." in words
    assert "ratio" not in words  # the summary has fxremat's column alone
    assert "PyTorch default" not in page.svg_text and "memory timeline: PyTorch default" not in words
    # a failed comparison says why instead
    failed = fxremat.format_text(report.with_changes(baseline_error="RuntimeError: boom"))
    assert "PyTorch default partition: failed: RuntimeError: boom" in failed


def test_pareto_chart_draws_a_frontier_when_the_report_has_one(json_out):
    report = CutReport.from_dict(json_out["data"])
    base = report.saved_bytes
    if not hasattr(report, "frontier"):  # reports from before the budget work have none
        pytest.skip("CutReport has no frontier field")
    plain = svg_pareto(report.with_changes(frontier=()))
    with_frontier = svg_pareto(report.with_changes(frontier=((2 * base, 1e-6, 0.0), (base // 2, 5e-5, 50.0))))
    assert "<polyline" not in plain and "<polyline" in with_frontier
    assert "memory_price 50" in with_frontier


# --- other ways in ----------------------------------------------------------------------------------------------


def test_list(capsys):
    assert cli.main(["--list"]) == 0
    assert capsys.readouterr().out.split() == list(EXAMPLES)


@pytest.mark.inductor
def test_real_inductor_and_report_dir(env, tmp_path):
    """One real Inductor compile (tens of seconds on CPU); FXREMAT_REPORT_DIR gets the same report."""
    report_dir = tmp_path / "report-dir"
    result = run_tool(
        ["mlp", "--format", "json", "--out", str(tmp_path / "out")], {**env, "FXREMAT_REPORT_DIR": str(report_dir)}
    )
    assert_ok(result)
    ours = json.loads((tmp_path / "out" / "graph_0.json").read_text())
    stored = [json.loads(p.read_text()) for p in report_dir.glob("*.json")]
    assert len(stored) == 1 and stored[0]["saved_bytes"] == ours["saved_bytes"] > 0
    measured, _ = measured_saved_bytes("mlp")
    assert ours["saved_bytes"] == measured
    assert ours["baseline_saved_bytes"] is not None and ours["fallback_reason"] is None


def test_transformers_gpt2_with_labels(tmp_path, env):
    pytest.importorskip("transformers")
    target = tmp_path / "gpt2_target.py"
    # the tests' transformers GPT-2 (benchmarks/bench_models.py), with two layers: the report names the second
    target.write_text(
        textwrap.dedent(
            f"""
            import sys
            sys.path.insert(0, {str(REPO / "benchmarks")!r})
            import bench_models

            def build():
                work = bench_models.hf_workload("gpt2", dict(bench_models.TEST_SHAPE, layers=2))
                return work.model, work.kwargs
            """
        )
    )
    result = run_tool([f"{target}:build", "--no-codegen", "--format", "json"], env)
    assert_ok(result)
    reports = json.loads(result.stdout)
    assert len(reports) >= 1 and all(r["fallback_reason"] is None for r in reports)
    saved = [row for r in reports for row in r["saved"]]
    assert any((row["module"] or "").startswith("transformer.h.1") for row in saved)
    # the loss was out.loss, computed in the graph from labels=: its cross-entropy keeps values for backward
    assert any("cross_entropy" in (row["source"] or "") for row in saved)


# --- bad input: one line on stderr, exit 2 -----------------------------------------------------------------------


def _fails(capsys, argv: list[str]) -> str:
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("fxremat-report: error: "), err
    return err


def test_missing_file(capsys, tmp_path):
    assert "no such file" in _fails(capsys, [f"{tmp_path / 'nope.py'}:build", "--no-codegen"])


def test_missing_function(capsys, small_target):
    assert "no function 'nope'" in _fails(capsys, [f"{small_target}:nope", "--no-codegen"])


def test_function_not_returning_model_and_inputs(capsys, small_target):
    assert "must return (model, example_inputs)" in _fails(capsys, [f"{small_target}:not_a_pair", "--no-codegen"])


def test_model_failing_in_eager(capsys, small_target):
    assert "fails in eager: RuntimeError" in _fails(capsys, [f"{small_target}:broken", "--no-codegen"])
    # a message of several lines still makes one line
    assert "ValueError: first line; second line" in _fails(capsys, [f"{small_target}:raises_two_lines"])


def test_unwritable_out_dir(capsys, tmp_path):
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    assert "cannot write there" in _fails(capsys, ["mlp", "--no-codegen", "--out", str(a_file / "reports")])


def test_unknown_target_and_bad_budget(capsys):
    assert "neither PATH.py:FUNCTION nor a built-in example" in _fails(capsys, ["not_an_example"])
    assert "memory_budget" in _fails(capsys, ["mlp", "--budget", "2.5"])


def test_error_in_a_subprocess_has_no_traceback(small_target, env):
    result = run_tool([f"{small_target}:nope", "--no-codegen"], env)
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines() == [f"fxremat-report: error: {small_target}: no function 'nope'"]


# --- pieces ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("text", "expected"), [("0.5", 0.5), ("1.0", 1.0), ("1024", 1024), ("512MiB", "512MiB")])
def test_parse_budget(text, expected):
    value = cli.parse_budget(text)
    assert value == expected and type(value) is type(expected)


def test_loss_of():
    t = torch.ones(2, 3, requires_grad=True)

    class WithLoss(dict):
        loss = None

    assert cli.loss_of(t).item() == 6.0
    assert cli.loss_of((None, [t * 2, t])).item() == 12.0  # first tensor, depth first
    assert cli.loss_of({"logits": t * 3}).item() == 18.0
    out = WithLoss(logits=t)
    assert cli.loss_of(out).item() == 6.0  # .loss is None: fall back to the first tensor
    out.loss = t.sum() * 10
    assert cli.loss_of(out).item() == 60.0
    with pytest.raises(cli.CliError, match="holds no tensor"):
        cli.loss_of(("no", "tensors"))
