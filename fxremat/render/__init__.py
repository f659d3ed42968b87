"""The renderings of ``CutReport`` (``fxremat/report.py`` is its data only): text (``text.py``, the CLI's default),
JSON (``json.py``), HTML (``html.py``) with its SVG charts (``svg.py``)."""

from .html import format_html
from .json import format_json, format_json_many, report_dict
from .svg import module_bytes, svg_memory_timelines, svg_module_bars, svg_pareto
from .text import baseline_status, format_bytes, format_diff_text, format_text, peak_status, short_source

__all__ = [
    "baseline_status",
    "format_bytes",
    "format_diff_text",
    "format_html",
    "format_json",
    "format_json_many",
    "format_text",
    "module_bytes",
    "peak_status",
    "report_dict",
    "short_source",
    "svg_memory_timelines",
    "svg_module_bars",
    "svg_pareto",
]
