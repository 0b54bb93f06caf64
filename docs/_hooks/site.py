"""MkDocs hooks that make two pages from the repository instead of from hand-written copies.

* ``index.md`` is the README, its ``docs/`` links made site links: one front door, on GitHub and
  on the site.
* ``cli.md``'s ``<!-- cli-reference -->`` marker becomes the reference of every command, generated
  from the code: ``prepare``'s settings from the settings model (:func:`settings_of`, panel by
  panel, as ``prepare --help`` shows them) and the other commands' options from their click
  parameters. A new setting or option appears here with nothing written by hand.

The hooks import this checkout's ``src/`` (not an installed copy), so the site documents the code
beside it.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
MARKER = "<!-- cli-reference -->"
PANEL_TITLES = {"input": "Input", "tokenizer": "Tokenizer", "instances": "Instances", "masking": "Masking",
                "output": "Output", "execution": "Execution", "cloud": "Cloud and cluster"}


def _import_src() -> None:
    src = str(REPO / "src")
    if sys.path[0] != src:
        sys.path.insert(0, src)
    for name in [m for m in sys.modules if m == "mlm_pipeline" or m.startswith("mlm_pipeline.")]:
        if not str(getattr(sys.modules[name], "__file__", "") or "").startswith(src):
            del sys.modules[name]  # an installed copy imported earlier: document this checkout


def readme_as_index(text: str) -> str:
    """The README with its links into ``docs/`` made relative to the site's root."""
    return re.sub(r"\]\(docs/", "](", text)


def _cell(text: str) -> str:
    """Plain help text as a Markdown table cell: nothing in it read as markup."""
    text = text.replace("\\", "\\\\").replace("|", "\\|").replace("*", "\\*").replace("`", "\\`")
    return text.replace("<", "&lt;").replace(">", "&gt;").replace("\n", " ")


def _description(help_text: str) -> str:
    """A command's help (rich markup, paragraphs) as Markdown: an ``Example:`` paragraph as a
    command block, the others as prose with nothing but their backticks read as markup."""
    from rich.text import Text

    out = []
    for paragraph in Text.from_markup(help_text or "").plain.split("\n\n"):
        paragraph = " ".join(paragraph.split())
        if paragraph.startswith("Example: "):
            out.append("Example:\n\n```bash\n" + paragraph.removeprefix("Example: ") + "\n```")
        elif paragraph:
            out.append(paragraph.replace("*", "\\*").replace("<", "&lt;").replace(">", "&gt;"))
    return "\n\n".join(out)


def _code(text: str) -> str:
    return f"`{text}`" if text else ""


def cli_reference() -> str:
    """Markdown reference of every command, from the settings model and the click commands."""
    _import_src()
    import click
    import typer

    from mlm_pipeline.cli import app
    from mlm_pipeline.cli_help import default_text, flag_text, param_row
    from mlm_pipeline.config import PANELS, settings_of

    group = typer.main.get_command(app)
    ctx = click.Context(group, info_name="mlm-pipeline")
    out = ["## `mlm-pipeline`", "", _description(group.help), "", "| option | meaning |", "|---|---|"]
    out += [f"| {_code(flag)} | {_cell(help_text)} |" for flag, help_text in
            (param_row(ctx, p) for p in group.get_params(ctx) if p.name != "help")]
    out.append("")

    settings = settings_of()
    for name, command in group.commands.items():
        sub = click.Context(command, info_name=name, parent=ctx)
        params = [p for p in command.get_params(sub) if p.name != "help" and not getattr(p, "hidden", False)]
        out += [f"## `mlm-pipeline {name}`", "", _description(command.help), ""]
        if name == "prepare":
            out += [
                "Each setting is a field of `PrepareConfig`: a flag here, a key of a `--config` file "
                "(YAML or TOML, `-` or `_` alike) and a keyword of `mlm_pipeline.prepare`. "
                "The Google column is the flag's name in Google's `create_pretraining_data.py`, "
                "accepted as written there (`--max_seq_length=128`).", ""]
            for panel in PANELS:
                rows = [s for s in settings if s.panel == panel]
                if not rows:
                    continue
                out += [f"### {PANEL_TITLES.get(panel, panel.capitalize())}", "",
                        "| flag | default | Google | meaning |", "|---|---|---|---|"]
                for s in rows:
                    default = "required" if s.required else default_text(s).removeprefix("default: ")
                    google = f"--{s.google}" if s.google else ""
                    out.append(f"| {_code(flag_text(s))} | {_code(default)} | {_code(google)} | {_cell(s.help)} |")
                out.append("")
            names = {s.name for s in settings}
            params = [p for p in params if p.name not in names]
            if params:
                out += ["### Other options", ""]
        out += ["| option | meaning |", "|---|---|"]
        out += [f"| {_code(flag)} | {_cell(help_text)} |" for flag, help_text in (param_row(sub, p) for p in params)]
        out.append("")
    return "\n".join(out)


def on_files(files, config):
    """Add the README as the site's home page."""
    from mkdocs.structure.files import File

    text = readme_as_index((REPO / "README.md").read_text(encoding="utf-8"))
    files.append(File.generated(config, "index.md", content=text))
    return files


def on_page_markdown(markdown, page, config, files):
    if MARKER in markdown:
        return markdown.replace(MARKER, cli_reference())
    return markdown
