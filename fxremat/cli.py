"""fxremat-report: compile one training step of a model with fxremat and write its cut reports.

    fxremat-report TARGET [--budget B] [--format text|json|html] [--out DIR] [--device PROFILE] [--no-codegen]
                   [--diff-default] [--list] [--memory-price X]

Bad input (a missing file, a function that is not there or returns the wrong thing, a model that fails in eager,
an output directory that cannot be written, a bad option) is one line on stderr and exit status 2.
"""

from __future__ import annotations

import argparse
import importlib.util
import logging
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

PROG = "fxremat-report"
FORMATS = ("text", "json", "html")
EXTENSIONS = {"text": "txt", "json": "json", "html": "html"}

DESCRIPTION = """\
Compile one training step of a model with fxremat and write its cut reports: what is kept for backward, what
is recomputed, and the same figures for PyTorch's default partitioner. One report per compiled joint graph.

TARGET is PATH.py:FUNCTION, where FUNCTION() returns (model, example_inputs), or the name of a built-in example
(see --list). The step is out = model(*example_inputs) when example_inputs is a tuple or list, and
model(**example_inputs) when it is a dict (so a transformers model can take labels=). The loss is out.loss when
the output has a .loss attribute that is a tensor (summed if it is not a scalar); otherwise the first tensor
found in the output (a tensor, or the first tensor inside a tuple, list, dict or ModelOutput, depth first),
summed. Then loss.backward().
"""

EPILOG = """\
--no-codegen traces the same Dynamo graphs through AOTAutograd with no-op compilers instead of Inductor: the
same partitioner and reports, in seconds instead of minutes (no C++/Triton code is generated).

exit status: 0 done; 2 bad input (one line on stderr says what); 1 compiled, but no joint graph was produced.
"""


class CliError(Exception):
    """Bad input: main() prints it as one line on stderr and exits with status 2."""


# --- arguments -------------------------------------------------------------------------------------------------------


def parse_budget(text: str) -> float | int | str:
    """'0.5' -> 0.5 (a fraction), '1024' -> 1024 (bytes), anything else ('512MiB') as given for fxremat to parse."""
    if text.isdigit():
        return int(text)
    try:
        return float(text)
    except ValueError:
        return text


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG, description=DESCRIPTION, epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("target", nargs="?", metavar="TARGET", help="PATH.py:FUNCTION, or a built-in example name")
    parser.add_argument(
        "--budget",
        metavar="B",
        type=parse_budget,
        default=None,
        help="memory_budget: a fraction in [0, 1], bytes, or '512MiB'",
    )
    parser.add_argument("--format", choices=FORMATS, default="text", help="report format (default: text)")
    parser.add_argument(
        "--out", metavar="DIR", type=Path, default=None, help="write DIR/<graph_id>.txt|json|html instead of stdout"
    )
    parser.add_argument("--device", metavar="PROFILE", default=None, help="cost profile: auto, cpu, a100, h100, h200")
    parser.add_argument(
        "--memory-price", metavar="X", type=float, default=None, help="memory_price (default: fxremat's)"
    )
    parser.add_argument(
        "--no-codegen", action="store_true", help="AOTAutograd with no-op compilers instead of Inductor (fast)"
    )
    parser.add_argument(
        "--diff-default", action="store_true", help="also list the values only fxremat / only PyTorch default saves"
    )
    parser.add_argument("--list", action="store_true", help="print the built-in example names and exit")
    return parser


def backend_options(args: argparse.Namespace) -> dict[str, Any]:
    """Only the options the user gave: fxremat's own defaults (and $FXREMAT_REPORT_DIR) apply to the rest."""
    # an inspection tool: compare with PyTorch's default partition (off by default in fxremat.backend), and also
    # show where PyTorch's own budgets land on the memory/recompute chart
    options: dict[str, Any] = {"compare_default": True, "compare_budgets": True}
    if args.budget is not None:
        options["memory_budget"] = args.budget
    if args.device is not None:
        options["device"] = args.device
    if args.memory_price is not None:
        options["memory_price"] = args.memory_price
    return options


def make_options(args: argparse.Namespace):
    from .options import Options

    try:
        return Options.create(**backend_options(args))
    except NotImplementedError as error:
        raise CliError(f"--budget {args.budget}: {error}") from error
    except (TypeError, ValueError) as error:
        raise CliError(str(error)) from error


# --- the target ------------------------------------------------------------------------------------------------------


def _import_file(path: Path):
    """Import ``path`` as a module of its own, with its directory on sys.path (as ``python path`` would)."""
    name = f"_fxremat_target_{abs(hash(str(path.resolve())))}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise CliError(f"{path}: not a Python file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # Dynamo and inspect look modules up by name
    sys.path.insert(0, str(path.resolve().parent))
    try:
        spec.loader.exec_module(module)
    except Exception as error:
        raise CliError(f"{path}: import failed: {type(error).__name__}: {error}") from error
    return module


def load_target(target: str) -> tuple[Any, Any]:
    """(model, example_inputs) from PATH.py:FUNCTION or a built-in example name."""
    from .examples import EXAMPLES, example

    if ":" not in target:
        if target in EXAMPLES:
            return example(target)
        raise CliError(f"TARGET {target!r} is neither PATH.py:FUNCTION nor a built-in example ({', '.join(EXAMPLES)})")
    path_text, function_name = target.rsplit(":", 1)
    path = Path(path_text)
    if not path.is_file():
        raise CliError(f"{path}: no such file")
    function = getattr(_import_file(path), function_name, None)
    if not callable(function):
        raise CliError(f"{path}: no function {function_name!r}")
    try:
        returned = function()
    except Exception as error:
        raise CliError(f"{target}: {function_name}() raised {type(error).__name__}: {error}") from error
    return check_target(target, returned)


def check_target(target: str, returned: Any) -> tuple[Any, Any]:
    import torch

    if not (isinstance(returned, (tuple, list)) and len(returned) == 2):
        raise CliError(f"{target} must return (model, example_inputs); got {type(returned).__name__}")
    model, inputs = returned
    if not isinstance(model, torch.nn.Module):
        raise CliError(f"{target}: the model must be a torch.nn.Module; got {type(model).__name__}")
    if not isinstance(inputs, (tuple, list, dict)):
        raise CliError(f"{target}: example_inputs must be a tuple, list or dict; got {type(inputs).__name__}")
    return model, inputs


# --- one training step -----------------------------------------------------------------------------------------------


def call_model(model: Callable, inputs: Any) -> Any:
    return model(**inputs) if isinstance(inputs, dict) else model(*inputs)


def loss_of(out: Any):
    """``out.loss`` if it is a tensor, else the first tensor in ``out``; summed to a scalar for backward."""
    import torch

    from fxremat_passes.graph.costs import first_tensor

    loss = getattr(out, "loss", None)
    if not isinstance(loss, torch.Tensor):
        loss = first_tensor(out)
    if loss is None:
        raise CliError(f"the model's output ({type(out).__name__}) holds no tensor to take a loss from")
    return loss if loss.dim() == 0 else loss.sum()


def check_eager(model: Any, inputs: Any) -> None:
    """One eager forward first, so that a broken model is reported as the model's fault, in one line, and not as
    a compile error deep inside Dynamo."""
    try:
        loss = loss_of(call_model(model, inputs))
    except CliError:
        raise
    except Exception as error:
        raise CliError(f"the model fails in eager: {type(error).__name__}: {error}") from error
    if not loss.requires_grad:
        raise CliError("the loss does not require grad (no parameter or input requires grad): no backward to plan")


def _noop_compiler(gm, example_inputs):
    from fxremat_passes._torch_private import inductor_entry  # the CLI's start loads no torch internals

    return inductor_entry.boxed(gm.forward)


def compiled_step_reports(model: Any, inputs: Any, options, no_codegen: bool) -> list:
    """Compile and run forward+backward once; the reports fxremat made on the way, one per joint graph.

    Without codegen it is Dynamo + AOTAutograd with no-op compilers, set up as Inductor sets it up (not
    ``aot_module``): the same joint graphs the Inductor path partitions, with the module stacks and source lines
    the report shows, and Dynamo's graph breaks let models through that one trace rejects (a transformers
    model returns a DynamicCache).
    """
    import torch

    from .backend import FxrematBackend, make_partition_fn

    if no_codegen:
        from fxremat_passes import _torch_private as tp

        reports: list = []
        backend = tp.aot_autograd_as_inductor(make_partition_fn(options, reports), _noop_compiler)
    else:
        backend = FxrematBackend(options)
        reports = backend.reports
    compiled = torch.compile(model, backend=backend)
    loss_of(call_model(compiled, inputs)).backward()
    log.debug("%d report(s) from %s", len(reports), "aot_autograd" if no_codegen else "inductor")
    return list(reports)


# --- output ----------------------------------------------------------------------------------------------------------


def render(report, fmt: str, diff: bool) -> str:
    from .render import format_html, format_json, format_text

    if fmt == "json":
        return format_json(report, diff) + "\n"
    if fmt == "html":
        return format_html([report], title=f"fxremat cut report: {report.graph_id}", diff=diff)
    return format_text(report, diff=diff) + "\n"


def render_all(reports: Sequence, fmt: str, diff: bool, target: str) -> str:
    """Everything in one document, for stdout: a JSON array, one HTML page, or the text reports in turn."""
    from .render import format_html, format_json_many

    if fmt == "json":
        return format_json_many(reports, diff) + "\n"
    if fmt == "html":
        return format_html(reports, title=f"fxremat cut report: {target}", diff=diff)
    return "\n".join(render(r, fmt, diff) for r in reports)


def prepare_out_dir(directory: Path) -> None:
    """Create it before compiling: a bad --out must fail in a second, not after minutes of compilation."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
        probe = directory / ".fxremat-write-test"
        probe.write_text("")
        probe.unlink()
    except OSError as error:
        raise CliError(f"--out {directory}: cannot write there ({error.strerror or error})") from error


def write_reports(reports: Sequence, directory: Path, fmt: str, diff: bool) -> list[Path]:
    written = []
    for report in reports:
        path = directory / f"{report.graph_id}.{EXTENSIONS[fmt]}"
        try:
            path.write_text(render(report, fmt, diff), encoding="utf-8")
        except OSError as error:
            raise CliError(f"{path}: cannot write ({error.strerror or error})") from error
        written.append(path)
    return written


# --- main ------------------------------------------------------------------------------------------------------------


def run(args: argparse.Namespace) -> int:
    import torch

    from .examples import EXAMPLES

    if args.list:
        print("\n".join(EXAMPLES))
        return 0
    if args.target is None:
        raise CliError("TARGET is required (PATH.py:FUNCTION or an example name; --list shows the examples)")
    options = make_options(args)
    if args.out is not None:
        prepare_out_dir(args.out)
    torch.manual_seed(0)  # the same inputs, and so the same report, on every run of a built-in example
    model, inputs = load_target(args.target)
    check_eager(model, inputs)
    reports = compiled_step_reports(model, inputs, options, args.no_codegen)
    if not reports:
        print(f"{PROG}: error: no joint graph was compiled, so there is nothing to report", file=sys.stderr)
        return 1
    if args.out is None:
        sys.stdout.write(render_all(reports, args.format, args.diff_default, args.target))
    else:
        for path in write_reports(reports, args.out, args.format, args.diff_default):
            print(path)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exit_:  # --help (0) and usage errors (2): argparse has printed what to say
        return int(exit_.code or 0)
    try:
        return run(args)
    except CliError as error:
        # one line, even when the cause (a torch error, say) spans several
        message = "; ".join(line.strip() for line in str(error).splitlines() if line.strip())
        print(f"{PROG}: error: {message}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
