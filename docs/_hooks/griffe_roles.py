"""A griffe extension for the API reference: the docstrings' Sphinx roles (``:class:`~a.B```,
``:func:`x```) shown as code (``B``, ``x``), since the Markdown they are rendered as has no roles."""

from __future__ import annotations

import re

import griffe

ROLE = re.compile(r":(?:class|func|meth|data|mod|attr|exc|obj):`~?([\w.]+)`")


def _short(match: re.Match) -> str:
    name = match.group(1)
    return f"`{name.rsplit('.', 1)[-1] if match.group(0).find('`~') >= 0 else name}`"


class SphinxRolesAsCode(griffe.Extension):
    def on_instance(self, *, obj, **kwargs) -> None:
        if obj.docstring is not None:
            obj.docstring.value = ROLE.sub(_short, obj.docstring.value)
