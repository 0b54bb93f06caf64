"""``prepare --help``: every setting in its help panel, one compact row each.

The settings are many, so their help is laid out as a manual page is: the flag with its value
(``--max-seq-length N``, ``--format tfrecord|parquet``, a switch as ``--do-lower-case /
--no-do-lower-case``) beside its help, or above it when the flag is long, and the default at the
end. It is drawn from the settings themselves (:mod:`mlm_pipeline.config`), and text is shown as
written: ``[CLS]`` stays ``[CLS]``.
"""

from __future__ import annotations

import textwrap
from typing import Iterable

from rich.console import Console
from rich.panel import Panel
from rich.text import Text

from mlm_pipeline.config import Setting

FLAG_WIDTH = 24
"""Flags longer than this get a row of their own, their help below them."""

_TYPE_NAMES = {int: "N", float: "FLOAT", str: "TEXT"}


def flag_text(s: Setting) -> str:
    """How a setting is written on the command line: ``-o, --output TEXT``, ``INPUT...``."""
    if s.positional:
        return f"{s.metavar or s.name.upper()}..."
    names = ", ".join([f for f in s.flags if not f.startswith("--")] + [f for f in s.flags if f.startswith("--")])
    if s.value_type is bool:
        return f"{names} / --no-{s.flags[0][2:]}"
    value = s.metavar or ("|".join(map(str, s.choices)) if s.choices else _TYPE_NAMES.get(s.value_type, "TEXT"))
    return f"{names} {value}"


def default_text(s: Setting) -> str:
    if s.required or s.default is None or s.default == []:
        return ""
    if s.value_type is bool:
        return "default: " + ("on" if s.default else "off")
    return f"default: {s.default}"


def _rows(rows: list[tuple[str, str]], width: int) -> Text:
    """(flag, help) rows as a definition list ``width`` wide: help beside a flag of up to
    :data:`FLAG_WIDTH` characters, below a longer one."""
    text = Text()
    help_width = max(20, width - FLAG_WIDTH - 2)
    for flag, help_text in rows:
        lines = textwrap.wrap(help_text, help_width) or [""]
        if len(flag) > FLAG_WIDTH:
            text.append(flag + "\n", style="bold cyan")
            first = " " * (FLAG_WIDTH + 2)
        else:
            text.append(f"{flag:<{FLAG_WIDTH}}", style="bold cyan")
            first = "  "
        text.append(first + lines[0] + "\n")
        for line in lines[1:]:
            text.append(" " * (FLAG_WIDTH + 2) + line + "\n")
    text.rstrip()
    return text


def _setting_help(s: Setting) -> str:
    default = default_text(s)
    return s.help + (" Required." if s.required else "") + (f" ({default})" if default else "")


def param_row(ctx, param) -> tuple[str, str]:
    """A click parameter as a (flag, help) row: ``-o, --output TEXT``, a switch as ``--x / --no-x``,
    an argument as its name; the help with its default."""
    from rich.text import Text as _Text

    metavar = param.metavar
    if param.param_type_name == "argument":
        name = (metavar or param.name).upper()
        help_text = _Text.from_markup(param.help or "").plain + (" Required." if param.required else "")
        return f"{name}{'...' if param.nargs == -1 else ''}", help_text.strip()
    names = " / ".join(filter(None, [", ".join(param.opts), ", ".join(param.secondary_opts)]))
    if not metavar and not getattr(param, "is_flag", False):
        shown = str(param.display_type_rich(ctx)).strip("<>") if hasattr(param, "display_type_rich") else ""
        metavar = {"int": "N", "int range": "N", "float": "FLOAT", "float range": "FLOAT", "str": "TEXT",
                   "": "TEXT"}.get(shown, shown)
    flag = f"{names} {metavar.strip('<>')}".strip() if metavar else names
    help_text = _Text.from_markup(param.help or "").plain
    default = param.default
    flag_like = getattr(param, "is_flag", False)
    shown = getattr(param, "show_default", True) is not False and not callable(default) and (
        (not flag_like and default is not None and default is not False and default not in ((), [], ""))
        or (flag_like and bool(param.secondary_opts) and default is True))
    if param.required:
        help_text += " Required."
    elif shown:
        help_text += f" (default: {'on' if default is True else default})"
    return flag, help_text.strip()


def print_grouped_help(usage: str, description: str, settings: Iterable[Setting], panels: Iterable[str],
                       other_options: list[tuple[str, str]], *, arguments: list[tuple[str, str]] | None = None) -> None:
    """Usage, description, ``arguments`` and ``other_options`` (flag, help) under Options, then the
    settings panel by panel, in the order of ``panels``."""
    console = Console(highlight=False)
    console.print(Text(usage, style="bold"))
    console.print()
    for paragraph in description.split("\n\n"):
        console.print(Text(paragraph))
        console.print()
    settings = list(settings)
    inner = console.width - 4  # a panel's border and padding
    sections = []
    arguments = [*(arguments or []), *((flag_text(s), _setting_help(s)) for s in settings if s.positional)]
    if arguments:
        sections.append(("Arguments", arguments))
    sections.append(("Options", other_options))
    for panel in panels:
        rows = [(flag_text(s), _setting_help(s)) for s in settings if s.panel == panel and not s.positional]
        if rows:
            sections.append((panel.capitalize(), rows))
    for title, rows in sections:
        console.print(Panel(_rows(rows, inner), title=title, title_align="left", border_style="dim"))
