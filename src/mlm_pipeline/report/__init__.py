"""Reading a prepared output back for people: ``mlm-pipeline report``.

- :mod:`.text`: the summary ``prepare`` prints (its plan, with ``--dry-run``) and the text report;
- :mod:`.data`: :func:`report_data`, everything the report knows (``report --json``), with what
  the run did not record listed and explained, never shown as 0;
- :mod:`.plots` and :mod:`.html`: the plots (matplotlib, the ``report`` extra), a self-contained
  HTML page (``report --html``) and PNG files (``report --png``).

``import mlm_pipeline.report`` does not import matplotlib; drawing does. Nor does it import
:mod:`.html` before :func:`write_report` is asked for (``prepare`` prints text only).
"""

from typing import TYPE_CHECKING

from mlm_pipeline.report.data import report_data
from mlm_pipeline.report.text import render_plan, render_report, render_summary

if TYPE_CHECKING:  # (what the API reference and type checkers see; imported on first use below)
    from mlm_pipeline.report.html import write_report

__all__ = ["render_plan", "render_report", "render_summary", "report_data", "write_report"]


def __getattr__(name: str):
    if name == "write_report":
        from mlm_pipeline.report.html import write_report

        return write_report
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
