"""benchmarks/RESULTS.md, the current results, made from the JSON the benchmarks write under benchmarks/results/.

    python benchmarks/results_page.py            # writes benchmarks/RESULTS.md
    python benchmarks/results_page.py --check    # exit 1 if RESULTS.md differs from what the JSON gives

Each user-facing benchmark is one entry of ``ENTRIES``: the JSON files it reads and a function that turns them into a
``Record`` (what was run, at which commit, on which machine under which load, whether gradients were checked, a
table and notes); ``format_record`` turns any record into Markdown.  A new benchmark's results are its JSON under
benchmarks/results/ plus one entry here.  A JSON file may carry ``annotations`` (load, source) where the benchmark
did not record them itself; a transcribed file (figures copied from a table of the last measured run, its per-run
rows not kept) says so there, and the page says so beside its table.  No torch import: the page builds anywhere.
"""

from __future__ import annotations

import argparse
import json
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parent))

import peak_table  # noqa: E402  (benchmarks/: the issue-15 table's settings and checks)
import zoo_checks  # noqa: E402  (benchmarks/: the zoo's table and checks)

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
PAGE = HERE / "RESULTS.md"
MIB = 2**20
WIDTH = 120  # prose lines of the page; tables and commands are left whole


@dataclass(frozen=True)
class Record:
    """One benchmark's results, as data: the page's section for it."""

    title: str
    about: str  # what the benchmark measures and how to read the table, a paragraph
    command: str
    commit: str
    machine: str
    load: str
    date: str
    gradients: str
    headers: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]
    notes: tuple[str, ...] = ()
    source: str = "measured: the JSON the benchmark wrote"


@dataclass(frozen=True)
class Entry:
    """A user-facing benchmark: its JSON files (relative to benchmarks/results/) and how they become a record."""

    files: tuple[str, ...]
    build: Callable[..., Record]


# ---- reading a run's provenance ---------------------------------------------------------------------------------


def load(name: str) -> dict[str, Any]:
    return json.loads((RESULTS / name).read_text())


def _short(commit: str | None) -> str:
    return f"`{commit[:7]}`" if commit else "not recorded"


def _machine(env: dict[str, Any], notes: dict[str, Any]) -> str:
    if notes.get("machine"):
        return notes["machine"]
    where = env.get("gpu") or f"{env.get('cpu', 'CPU')}, {env.get('cpu_count', '?')} cores"
    threads = f", {env['threads']} thread" + ("s" if env["threads"] != 1 else "") if env.get("threads") else ""
    return f"{where}{threads}, torch {env.get('torch', '?')}"


def _load(env: dict[str, Any], notes: dict[str, Any]) -> str:
    if notes.get("load"):
        return notes["load"]
    if env.get("load_avg_1min") is not None:
        return f"1-minute load average {env['load_avg_1min']:.1f} at the start"
    return "not recorded"


def _command(env: dict[str, Any]) -> str:
    words = list(env.get("command_line") or [])
    if words and "python" in Path(words[0]).name:
        words[0] = "python"
    return " ".join(words) if words else "not recorded"


def provenance(data: dict[str, Any]) -> dict[str, str]:
    """The ``Record`` fields every entry shares, from a benchmark JSON's ``environment`` and ``annotations``."""
    env, notes = data.get("environment") or {}, data.get("annotations") or {}
    return dict(
        command=_command(env),
        commit=_short(notes.get("git_commit") or env.get("git_commit")),
        machine=_machine(env, notes),
        load=_load(env, notes),
        date=str(notes.get("date") or env.get("date") or "not recorded")[:16].replace("T", " "),
        source=notes.get("source", Record.source) + (" (transcribed)" if notes.get("transcribed") else ""),
    )


def _mib(nbytes: float | None) -> str:
    return "" if nbytes is None else f"{nbytes / MIB:.2f}"


def _ratio(value: float | None) -> str:
    return "" if value is None else f"{value:.3f}x"


# ---- entries -----------------------------------------------------------------------------------------------------


def _step_cell(row: dict[str, Any] | None) -> str:
    return "" if row is None else _ratio(row.get("step_ratio_same_setting"))


def _sim_cell(row: dict[str, Any] | None) -> str:
    if row is None or row.get("error") or row.get("simulated_peak_bytes") is None:
        return ""
    return f"{_mib(row['simulated_peak_bytes'])} ({row['sim_error']:+.1%})"


def _side(row: dict[str, Any] | None) -> list[str]:
    if row is None:
        return ["", ""]
    return ["error"] * 2 if row.get("error") else [_mib(row.get("saved_bytes")), _mib(row.get("peak_bytes"))]


TRAINING_COMMAND = (
    "python benchmarks/run.py --size small --repeats 5 --configs issue15 --models MODEL; python "
    "benchmarks/step_interleaved.py --model MODEL --size small --steps 20 --repetitions 3 --configs ...; python "
    "benchmarks/peak_table.py RUN.json --steps STEPS.json"
)


def training_step_rows(runs: list[dict], steps: list[dict], flags: list) -> list[tuple[str, ...]]:
    """One row per model and setting that ran: PyTorch's and fxremat's saved bytes and peak, fxremat's simulated
    peak, the interleaved step ratio, and peak_table.py's flags."""
    interleaved = {(row["model"], row["config"]): row for row in steps}
    codes: dict[tuple[str, str], set[str]] = {}
    for flag in flags:
        codes.setdefault((flag.model, flag.config), set()).add(flag.code)
    out = []
    for model, rows in peak_table.by_model(runs).items():
        for setting in peak_table.SETTINGS:
            pytorch, fxremat = rows.get(setting.pytorch or ""), rows.get(setting.fxremat or "")
            if pytorch is None and fxremat is None:
                continue
            marks = codes.get((model, setting.pytorch), set()) | codes.get((model, setting.fxremat), set())
            cells = [model, setting.label, *_side(pytorch), *_side(fxremat), _sim_cell(fxremat)]
            out.append((*cells, _step_cell(interleaved.get((model, setting.fxremat))), ",".join(sorted(marks))))
    return out


def training_step(run_file: dict[str, Any], steps_file: dict[str, Any]) -> Record:
    runs, steps = run_file["rows"], steps_file["rows"]
    flags = peak_table.all_flags(runs, steps)
    graded = [row for row in runs if not row.get("error")]
    matched = sum(1 for row in graded if row.get("grads_matched"))
    steps_from = provenance(steps_file)
    return Record(
        title="Training step on a CPU: fxremat against PyTorch's partitioner (`run.py`, `step_interleaved.py`)",
        about="Eleven models at size `small` (2 layers, hidden 256, batch 2, seq 128), each setting compiled by "
        "Inductor in a fresh process with an empty cache. Saved: MiB autograd keeps for backward "
        "(`saved_tensors_hooks`); peak: MiB one step allocates above what was live at its start (the CPU "
        "profiler's memory events); simulated: fxremat's own estimate of that peak, and its error. Step: fxremat's "
        "median step over PyTorch's at the same setting, the two interleaved in one process (`step_interleaved.py`). "
        "Flags are `peak_table.py`'s (a)-(g) (`benchmarks/README.md`): (g) marks a step above 1.05x PyTorch's.",
        **{**provenance(run_file), "command": TRAINING_COMMAND},
        gradients=f"every parameter's gradient against eager: {matched} of {len(graded)} rows matched",
        headers=("model", "setting", "PyTorch saved", "PyTorch peak", "fxremat saved", "fxremat peak",
                 "simulated (error)", "step vs PyTorch", "flags"),
        rows=tuple(training_step_rows(runs, steps, flags)),
        notes=(f"Step ratios: {steps_from['load']}, at {steps_from['commit']} ({steps_from['date']}).",
               *(f"({f.code}) {f.model} / {f.config}: {f.text}" for f in flags)),
    )


def _lowest_peak(rows: dict[str, dict[str, Any]], prefix: str) -> int | None:
    peaks = [row["peak_bytes"] for config, row in rows.items()
             if config.startswith(prefix) and not row.get("error") and row.get("peak_bytes") is not None]
    return min(peaks, default=None)


def _fraction(ours: float | None, theirs: float | None) -> str:
    return "" if ours is None or not theirs else f"{ours / theirs:.2f}x"


def at_a_glance(run_file: dict[str, Any]) -> Record:
    """Per model: fxremat's default plan against PyTorch's default, and the lowest peak either reaches."""
    out = []
    for model, rows in peak_table.by_model(run_file["rows"]).items():
        ours, theirs = rows.get("fxremat_default", {}), rows.get("pytorch_default", {})
        low_ours, low_theirs = _lowest_peak(rows, "fxremat_"), _lowest_peak(rows, "pytorch_")
        out.append((model, _fraction(ours.get("saved_bytes"), theirs.get("saved_bytes")),
                    _fraction(ours.get("peak_bytes"), theirs.get("peak_bytes")),
                    f"{_mib(low_ours)} / {_mib(low_theirs)}", _fraction(low_ours, low_theirs)))
    return Record(
        title="At a glance: fxremat's default plan against PyTorch's default (CPU)",
        about="From the training-step table below: what fxremat's default plan keeps for backward and the step's "
        "measured peak, each over PyTorch's default partitioner's on the same model; and the lowest measured peak "
        "of any setting each partitioner was run at (`memory_budget` 1.0 to 0.0, and fxremat's `peak_budget`).",
        **{**provenance(run_file), "command": TRAINING_COMMAND},
        gradients="all matched eager (below)",
        headers=("model", "saved, default plan", "peak, default plan", "lowest peak MiB (fxremat / PyTorch)",
                 "lowest peak ratio"),
        rows=tuple(out),
    )


def _grad_row(model: str, rows: list[dict[str, Any]], worst: dict[str, dict]) -> tuple[str, ...]:
    ok = sum(1 for row in rows if row.get("status") == "ok" and not row.get("wrong_params"))
    errors = [row["worst_error"] for row in rows if row.get("worst_error") is not None]
    known = worst.get(model, {})
    value = max(errors) if errors else known.get("worst_error")
    eager = known.get("eager_worst_error")
    cell = "not kept" if value is None else f"{value:.1e}" + (f" (eager fp32 {eager:.1e})" if eager else "")
    return model, ", ".join(row["setting"] for row in rows), f"{ok} of {len(rows)}", cell


def gradients(data: dict[str, Any]) -> Record:
    by_model: dict[str, list[dict[str, Any]]] = {}
    for row in data["rows"]:
        by_model.setdefault(row["model"], []).append(row)
    worst = {w["model"]: w for w in (data.get("annotations") or {}).get("worst", [])}
    ok = sum(1 for row in data["rows"] if row.get("status") == "ok" and not row.get("wrong_params"))
    return Record(
        title="Gradients under real Inductor against fp64 (`grad_check.py`)",
        about="Each model and setting compiled by Inductor with fxremat, one training step, every parameter's "
        "gradient against an fp64 eager copy; a parameter is wrong above 1e-3 relative error and 10x eager fp32's "
        "own error (`grad_rule.py`). The whole sweep (16 models x 8 settings, 2-3 hours here) is "
        "`python benchmarks/grad_check.py`.",
        **provenance(data),
        gradients=f"{ok} of {len(data['rows'])} runs right",
        headers=("model", "settings", "right", "worst relative error"),
        rows=tuple(_grad_row(model, rows, worst) for model, rows in by_model.items()),
        notes=tuple(filter(None, [(data.get("annotations") or {}).get("note")])),
    )


def _compile_row(entry: dict[str, Any]) -> tuple[str, ...]:
    ind, fx = entry["inductor_default"], entry["fxremat_default"]
    kernels = " / ".join(f"{side['kernels_forward']:g}+{side['kernels_backward']:g}" for side in (ind, fx))
    pair = entry.get("paired_ratio") or {}
    paired = "" if pair.get("median") is None else f"{pair['median']:.3f}x [{pair['min']:.3f}-{pair['max']:.3f}]"
    spread = lambda s: f"{s['median']:.2f} s [{s['min']:.2f}-{s['max']:.2f}]"  # noqa: E731
    cpu = " / ".join(f"{side['process_cpu_s']['median']:.2f}" for side in (ind, fx))
    part = "" if fx.get("partition_s") is None else f"{fx['partition_s']:.3f}"
    return (entry["model"], entry["cache"], spread(ind["process_s"]), spread(fx["process_s"]), _ratio(entry["ratio"]),
            paired, kernels, cpu, _ratio(entry.get("cpu_ratio")), part)


def compile_time(data: dict[str, Any]) -> Record:
    cold = [e for e in data["summary"] if e["cache"] == "cold"]
    matched = all(e[config].get("grads_matched") for e in cold for config in ("fxremat_default", "inductor_default"))
    return Record(
        title="Compile time: Inductor's default partitioner against fxremat's defaults (`compile_time.py`)",
        about="A new user's first training step: a fresh process timed from its spawn to the end of the first step "
        "(imports, Dynamo, partition, Inductor, the step), on one thread; cold in an empty Inductor cache, then "
        "warm on the cache it filled. Median [min-max] of 5 repeats (15 warm runs); the paired ratio is fxremat "
        "over Inductor within each round (two adjacent processes); kernels are Inductor's generated kernels, "
        "forward+backward; CPU s counts the compiling process and the g++ runs it waited for.",
        **provenance(data),
        gradients="the first cold step of each model and configuration against eager: "
        + ("all matched" if matched else "not all matched"),
        headers=("model", "cache", "Inductor default", "fxremat default", "ratio", "paired ratio",
                 "kernels (fw+bw)", "CPU s (Inductor / fxremat)", "CPU ratio", "partition s"),
        rows=tuple(_compile_row(e) for e in data["summary"]),
        notes=tuple(filter(None, [(data.get("annotations") or {}).get("note")])),
    )


def _gpu_rows(data: dict[str, Any]) -> list[tuple[str, ...]]:
    out = []
    for row in data["rows"]:
        if row.get("error"):
            out.append((data["model"], row["config"], "error", "", "", ""))
            continue
        simulated = row.get("simulated_peak_bytes")
        sim = "" if simulated is None else f"{simulated / MIB:,.1f} ({simulated / row['peak_bytes'] - 1:+.1%})"
        step = f"{row['step_s'] * 1e3:.1f} ({row['step_s_spread'][0] * 1e3:.1f}-{row['step_s_spread'][1] * 1e3:.1f})"
        out.append((data["model"], row["config"], f"{row['peak_bytes'] / MIB:,.1f}", sim, step,
                    f"{row['tokens_per_s']:,.0f}"))
    return out


def gpu_check(*checks: dict[str, Any]) -> Record:
    first = checks[0]
    machine = (first.get("annotations") or {}).get("machine", first["device_name"])
    grads = "; ".join(f"{c['model']}: {c['gradients']['config']} against eager, max relative error "
                      f"{c['gradients']['max_error']:.1e}" + (" (ok)" if c["gradients"]["ok"] else " (WRONG)")
                      for c in checks)
    return Record(
        title=f"On a GPU: {first['device_name']} (`gpu_check.py`)",
        about="GPT-2 124M (bf16, batch 8, seq 1024) and a Llama-style model (8 layers, dim 2048, bf16, batch 4, "
        "seq 2048), each configuration in turn in one process: the measured peak "
        "(`torch.cuda.max_memory_allocated` above the step's start), fxremat's simulated peak beside it, the "
        "median of 20 CUDA-event steps (min-max) and tokens per second. The simulator's rules were checked "
        "against Inductor's C++ backend only, hence its error here.",
        **{**provenance(first), "command": "python benchmarks/gpu_check.py gpt2; python benchmarks/gpu_check.py llama",
           "machine": f"{machine}, torch {first['torch']}"},
        gradients=grads,
        headers=("model", "configuration", "peak MiB", "simulated MiB (error)", "step ms (min-max)", "tokens/s"),
        rows=tuple(row for check in checks for row in _gpu_rows(check)),
    )


def _opinfo_row(mode: str, rows: list[dict[str, Any]]) -> tuple[str, ...]:
    fail = [r for r in rows if r.get("fxremat_error")]
    theirs = [r for r in fail if r.get("pytorch_error")]
    skipped = sum(1 for r in rows if r.get("skipped"))
    return (mode, str(len(rows)), str(sum(r.get("samples", 0) for r in rows)), str(len(rows) - len(fail)),
            str(len(fail)), str(len(theirs)), str(skipped))


def opinfo(static: dict[str, Any], dynamic: dict[str, Any]) -> Record:
    failing = sorted({r["op"] for d in (static, dynamic) for r in d["rows"] if r.get("fxremat_error")})
    return Record(
        title="PyTorch's OpInfo database through `aot_autograd_check` (`opinfo_sweep.py`)",
        about="Every op variant of `op_db` with autograd and float32 on the CPU, through PyTorch's "
        "`aot_autograd_check` with fxremat's partitioner (`strict=True`) in place of PyTorch's; a variant that "
        "fails is run again on the same sample with PyTorch's partitioner.",
        **{**provenance(static), "command": "python benchmarks/opinfo_sweep.py --static-only|--dynamic "
           "--max-samples 3 --json FILE"},
        gradients="the check compares outputs and gradients with eager's, sample by sample",
        headers=("shapes", "variants", "samples", "pass", "fail", "of which fail under PyTorch's partitioner too",
                 "variants with samples skipped"),
        rows=(_opinfo_row("static", static["rows"]), _opinfo_row("dynamic", dynamic["rows"])),
        notes=(f"Failing variants: {', '.join(failing) or 'none'}.", f"Dynamic run: {provenance(dynamic)['load']}."),
    )


def _zoo_provenance(data: dict[str, Any]) -> dict[str, str]:
    envs = [r["environment"] for r in data["rows"] if r.get("environment")]
    loads = [env["load_avg_1min"] for env in envs]
    fields = provenance(data if data.get("environment") or not envs else dict(data, environment=envs[-1]))
    if loads and not (data.get("annotations") or {}).get("load"):
        fields["load"] = f"1-minute load average {min(loads):.1f}-{max(loads):.1f} over its rows"
    return fields


def zoo(data: dict[str, Any]) -> Record:
    rows = data["rows"]
    measured = [r for r in rows if r.get("error") is None]
    right = sum(bool(r["gradients"]["grads_right"]) for r in measured)
    headers, body = zoo_checks.measured_rows(rows)
    check_headers, checks = zoo_checks.check_rows(rows)
    return Record(
        title="Third-party models, the loss inside the compiled module or outside it (`zoo.py`)",
        about="Per model and loss side, each setting's measured step peak in MiB (CPU profiler, above the bytes "
        "live at the step's start), fxremat's simulated peak in brackets, and the step's median time; each row a "
        "fresh process with an empty Inductor cache, one thread. Below the table, the checks: peak_budget=0.0 "
        "against the lowest fxremat peak, memory_budget monotone in simulated peak, simulation within 10%, the "
        "fastest fxremat setting at a peak no higher than PyTorch's 0.5 and 0.2.",
        **_zoo_provenance(data),
        gradients=f"{right} of {len(measured)} rows right against an fp64 eager copy (grad_rule)",
        headers=tuple(headers),
        rows=tuple(map(tuple, body)),
        notes=tuple(filter(None, [(data.get("annotations") or {}).get("note")]))
        + tuple(" | ".join(f"{h}: {c}" for h, c in zip(check_headers, row)) for row in checks)
        + tuple(f"error: {r['model']} {r['loss_side']} {r['config']}: {r['error'][:160]}"
                for r in rows if r.get("error") is not None),
    )


def loss_peak(data: dict[str, Any]) -> Record:
    rows = data["rows"]
    def key(r):
        return r["model"], json.dumps(r["shape"]), bool(r.get("logits_returned"))

    inductor = {key(r): r["measured"] for r in rows if r["setting"] == "inductor"}
    body = []
    for r in rows:
        base = inductor.get(key(r))
        sim = r.get("simulated")
        chunks = ", ".join(str(row[3]) for row in r.get("loss_regions") or []) or "-"
        body.append((
            r["model"], f"{r['shape']['vocab']:,} x {r['shape']['tokens']:,}",
            r["setting"] + (" (logits returned)" if r.get("logits_returned") else ""), _mib(r["measured"]),
            _mib(sim), "" if not sim else f"{sim / r['measured'] - 1:+.1%}",
            "" if not base else _ratio(r["measured"] / base), chunks, _mib(r.get("floor") or None),
            f"{r['grad']:.1e}",
        ))
    return Record(
        title="The loss-side peak: the LM head and its cross-entropy in chunks (`loss_peak.py`)",
        about="Per model and setting, one step's measured peak in MiB (CPU profiler, above the bytes live at the "
        "step's start, the parameters' gradients allocated in the step), fxremat's simulated peak and its error, the "
        "measured peak against Inductor's default partitioner, the chunks the loss region ran in (0: as traced), and "
        "the floor no chunking goes below (the gradients backward returns at once, and where the logits are returned "
        "the logits and their gradient). The compiled function returns the loss alone, or with \"(logits returned)\" "
        "the loss and the logits (the step drops the logits, as transformers' Trainer does); each row a fresh "
        "process, one thread. Settings: inductor (its default partitioner), "
        "nochunk (fxremat, loss_chunks=0), default (fxremat: chunks only under a peak_budget), "
        "auto (loss_chunks=\"auto\"), kN (loss_chunks=N), pb0.0 "
        "(peak_budget=0.0).",
        **provenance(data),
        gradients="each row's worst relative gradient error against an eager copy (grad_rule), in the last column",
        headers=("model", "vocab x tokens", "setting", "measured MiB", "simulated MiB", "sim err", "vs inductor",
                 "chunks", "floor MiB", "grad err"),
        rows=tuple(body),
        notes=tuple(filter(None, [(data.get("annotations") or {}).get("note")])),
    )


ENTRIES = (
    Entry(("run_issue15.json",), at_a_glance),
    Entry(("run_issue15.json", "step_interleaved_issue15.json"), training_step),
    Entry(("grad_check.json",), gradients),
    Entry(("compile_time.json",), compile_time),
    Entry(("gpu_check_gpt2/gpu_check.json", "gpu_check_llama/gpu_check.json"), gpu_check),
    Entry(("opinfo_static_3samples.json", "opinfo_dynamic_3samples.json"), opinfo),
    Entry(("zoo.json",), zoo),
    Entry(("loss_peak.json",), loss_peak),
)


# ---- Markdown -----------------------------------------------------------------------------------------------------


def _table(headers: tuple[str, ...], rows: tuple[tuple[str, ...], ...]) -> list[str]:
    return ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers),
            *("| " + " | ".join(row) + " |" for row in rows)]


def _bullet(text: str) -> str:
    return textwrap.fill(text, WIDTH, initial_indent="- ", subsequent_indent="  ", break_on_hyphens=False)


def format_record(record: Record) -> str:
    lines = [
        f"## {record.title}",
        "",
        textwrap.fill(record.about, WIDTH, break_on_hyphens=False),
        "",
        _bullet(f"**Commit** {record.commit}, {record.date} UTC; **machine** {record.machine}; "
                f"**load** {record.load}."),
        _bullet(f"**Gradients**: {record.gradients}."),
        f"- **Command**: `{record.command}`",  # not wrapped: a command to copy
        _bullet(f"**Source**: {record.source}."),
        "",
        *_table(record.headers, record.rows),
    ]
    if record.notes:
        lines += ["", *(_bullet(note) for note in record.notes)]
    return "\n".join(lines) + "\n"


HEADER = """# fxremat: current results

What fxremat achieves at the commits stated, one section per user-facing benchmark. This page is generated: edit
the benchmarks' JSON under `benchmarks/results/` (each benchmark writes its own; `benchmarks/README.md` says how to
run them) and run `python benchmarks/results_page.py`, never this file. Byte counts and peaks are exact and
repeatable; step and compile times depend on the machine and its load, stated beside each table. Earlier
measurements, and the work log this page replaced, are in git history (`git log -p benchmarks/RESULTS.md`).
"""


def build_page() -> str:
    records = [entry.build(*(load(name) for name in entry.files)) for entry in ENTRIES]
    return HEADER + "".join("\n" + format_record(record) for record in records)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if RESULTS.md is not what the JSON gives")
    parser.add_argument("--out", type=Path, default=PAGE, help="where to write (default: benchmarks/RESULTS.md)")
    args = parser.parse_args(argv)
    page = build_page()
    if args.check:
        current = args.out.read_text() if args.out.exists() else ""
        if current != page:
            print(f"{args.out} is out of date: run python benchmarks/results_page.py", file=sys.stderr)
            return 1
        return 0
    args.out.write_text(page)
    print(f"wrote {args.out} ({page.count(chr(10))} lines)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
