"""Wikitext -> plain paragraphs, written here from MediaWiki's markup rules (the help pages of
mediawiki.org), not ported from any extractor.

Why this shape: cleaning is the cost of reading a dump, so every step is one compiled regex
pass (guarded by a ``in`` test, so text without the markup costs one scan) or a linear scan
with ``re.finditer`` over delimiters (nested templates, tables and file links by a depth
count), and the line structure is one loop over lines; never a per-character Python loop.
The order matters, each step assumes the previous ones:

1. HTML comments; then tags whose content is not prose, with that content (``<ref>``,
   ``<math>``, ``<gallery>``, ``<timeline>``, ``<syntaxhighlight>``, ...: ``DROPPED_TAGS``).
2. Templates and parser functions ``{{…}}`` (nested, ``{{{…}}}`` parameters too), then tables
   ``{|…|}`` (nested; with ``keep_tables`` their caption and cells stay, one per paragraph).
3. File/image and category links (nested: a caption holds links; the dump's own namespace
   names too) and interlanguage links ``[[de:…]]``.
4. Internal links keep their label (``[[a|b]]`` -> ``b``, ``[[a]]`` -> ``a``); external links
   keep their text (``[http://x text]`` -> ``text``, ``[http://x]`` -> nothing); a bare URL is
   text and stays.
5. Remaining HTML tags (content kept), bold/italic quotes, magic words (``__TOC__``), brackets
   left empty by removed templates (``Albedo ({{IPA|…}}) is`` -> ``Albedo is``), doubled
   spaces, spaces before ``,`` and ``.``.
6. Lines: headings end a paragraph and are dropped (kept as their own paragraph with
   ``keep_headings``); list and indent items (``*#:;``) are paragraphs of their own; other
   lines join into one paragraph until a blank line, as MediaWiki renders them; lines that
   start with ``|`` (rows of tables that templates open and close) are dropped. A reference
   section (See also, Notes, References, Further reading, External links and their like:
   ``REFERENCE_SECTIONS``) is dropped up to the next heading of its level or higher, and so
   is a list item that is a citation (a bare URL, an ISBN), unless ``keep_references``: they
   hold lists of titles, publishers and URLs, not prose (WikiExtractor, by default, drops every
   list item and so loses them too).
7. Entities decoded (``&nbsp;``, ``&ndash;``, ``&#91;``); paragraphs without a letter or
   digit dropped.

The input is the page's wikitext with XML escaping already undone (``&lt;ref&gt;`` is ``<ref>``).
"""

from __future__ import annotations

import bisect
import html
import re
from typing import Iterable

# --------------------------------------------------------------------------- step 1

_COMMENT = re.compile(r"<!--.*?(?:-->|\Z)", re.S)

DROPPED_TAGS = (
    "references", "ref", "math", "chem", "ce", "score", "timeline", "gallery", "imagemap",
    "graph", "templatedata", "templatestyles", "syntaxhighlight", "source", "inputbox",
    "categorytree", "hiero", "mapframe", "maplink", "section", "indicator", "charinsert",
)
"""Extension tags whose content is not prose (citations, formulas, code, galleries, ...)."""

_TAG_NAMES = "|".join(DROPPED_TAGS)
_DROPPED_OPEN = re.compile(r"<(" + _TAG_NAMES + r")\b", re.I)
_DROPPED_CLOSE = re.compile(r"</(" + _TAG_NAMES + r")\s*>", re.I)

# --------------------------------------------------------------------------- step 2

_BRACES = re.compile(r"\{\{+|\}\}+")
_TABLE_EDGE = re.compile(r"\{\||\|\}")

# --------------------------------------------------------------------------- step 3-4

FILE_NAMESPACES = ("File", "Image")
CATEGORY_NAMESPACES = ("Category",)

_LINK_EDGE = re.compile(r"\[\[|\]\]")
_INTERLANGUAGE = re.compile(r"\[\[(?:[a-z]{2,3}(?:-[a-z]{1,8})*|simple):[^\[\]\n]*\]\]")
_LINK = re.compile(r"\[\[:?([^\[\]|\n]*)(?:\|([^\[\]]*))?\]\]")
_URL_SCHEMES = (
    "https?|ftps?|sftp|irc|ircs|news|nntp|mailto|gopher|telnet|svn|git|mms|ssh|xmpp|urn|sip|"
    "sips|tel|sms|bitcoin|magnet|geo|worldwind|redis"
)
_EXTERNAL_LINK = re.compile(
    r"\[(?:(?:" + _URL_SCHEMES + r"):|//)[^\s\[\]<>\"]*[ \t]*([^\]\n]*)\]", re.I
)
_EXTERNAL_OPEN = re.compile(r"\[(?:[a-z]+:|//)", re.I)  # (where one may start: cheap on "[[[[")

# --------------------------------------------------------------------------- step 5-7

_BREAK_TAG = re.compile(r"<(?:br|hr|p|div|li|dd|dt|td|th|tr)\b[^<>]*>", re.I)
_TAG = re.compile(r"</?[A-Za-z][A-Za-z0-9]*(?:\s[^<>]*)?/?>")
_QUOTES = re.compile("''+")
_MAGIC_WORD = re.compile(r"__[A-Z]+__")
_SPACES = re.compile("  +")
_EMPTY_PARENS = re.compile(r"\(\s*[,;:]?\s*\)")
_PARENS_LEAD = re.compile(r"\(\s*[,;]\s*")
_SPACE_STOP = re.compile(r" \.(?=\s|\Z)")  # (a literal prefix: a fast search; " +" is not)
_WORD = re.compile(r"\w")


def clean_wikitext(
    text: str,
    *,
    keep_headings: bool = False,
    keep_tables: bool = False,
    keep_references: bool = False,
    file_namespaces: Iterable[str] = FILE_NAMESPACES,
    category_namespaces: Iterable[str] = CATEGORY_NAMESPACES,
) -> list[str]:
    """The plain-text paragraphs of one page's wikitext, in order.

    ``file_namespaces``/``category_namespaces``: the names whose links are dropped (a
    language's own names, from the dump's ``<siteinfo>``, come on top of the English ones).
    """
    text = _strip_nested_markup(text, keep_tables)
    text = _strip_links(text, _namespace_prefixes(file_namespaces, category_namespaces))
    text = _strip_inline(text)
    return _paragraphs(text, keep_headings, keep_references)


# --------------------------------------------------------------------------- steps


def strip_comments(text: str) -> str:
    """``text`` without HTML comments (an unclosed one runs to the end, as MediaWiki reads it)."""
    return _COMMENT.sub("", text) if "<!--" in text else text


def _strip_nested_markup(text: str, keep_tables: bool) -> str:
    text = strip_comments(text)
    if "<" in text:
        text = drop_tags(text)
    if "{{" in text:
        text = drop_templates(text)
    if "{|" in text:
        text = drop_tables(text, keep_cells=keep_tables)
    return text


def drop_tags(text: str) -> str:
    """``text`` without the ``DROPPED_TAGS`` elements and their content: self-closing
    (``<ref name="x"/>``) or paired, the pair closed by the first closing tag of the same name
    (any case), so ``<ref>a</ref> b <ref>c</ref>`` keeps `` b ``. A tag never closed is left for
    the later steps (which drop the tag and keep what follows).

    One pass over the openings, each closing found by a binary search among the closing tags
    listed once: the same result as the regex ``<(name)\\b(?:[^>]*?/>|[^>]*>.*?</\\1\\s*>)``,
    whose lazy ``.*?`` rescans the rest of the page for every opening never closed (16,000
    unclosed ``<ref>`` took seconds, a page of them minutes).
    """
    openings = list(_DROPPED_OPEN.finditer(text))
    if not openings:
        return text
    closes: dict[str, list[tuple[int, int]]] = {}
    for m in _DROPPED_CLOSE.finditer(text):
        closes.setdefault(m.group(1).lower(), []).append((m.start(), m.end()))
    starts = {name: [a for a, _ in found] for name, found in closes.items()}
    out: list[str] = []
    pos = 0  # the end of the last element dropped
    gt = -1  # the first ">" at or after the current opening's name (-2: none left)
    for m in openings:
        if m.start() < pos:
            continue  # inside a dropped element
        if gt != -2 and gt < m.end():
            gt = text.find(">", m.end())
            if gt < 0:
                gt = -2
        if gt == -2:
            break  # no ">" left: no later opening is a tag
        if gt > m.end() and text[gt - 1] == "/":
            end = gt + 1  # self-closing
        else:
            key = m.group(1).lower()  # (as the regex's backreference compares)
            i = bisect.bisect_left(starts.get(key, ()), gt + 1)
            if i == len(starts.get(key, ())):
                continue  # never closed
            end = closes[key][i][1]
        out.append(text[pos : m.start()])
        pos = end
    if not out:
        return text
    out.append(text[pos:])
    return "".join(out)


def drop_templates(text: str) -> str:
    """``text`` without its templates, parser functions and ``{{{parameters}}}``, nested.

    Brace runs are paired as MediaWiki's preprocessor pairs them: ``{{{`` opens a parameter,
    other runs open templates two braces at a time, and a closing run closes the innermost
    openings first (``{{a|{{{1}}}}}`` is one template). A ``{{`` that is never closed is
    literal text: it is dropped with the rest of its line, so no braces leak. Each such opener
    costs a scan of the rest of the text, so after ``MAX_UNCLOSED`` of them the rest of the
    text only loses its brace runs (work stays linear on pages of stray braces).
    """
    out: list[str] = []
    pos = 0
    for _ in range(MAX_UNCLOSED):
        pos = _drop_templates_from(text, pos, out)
        if pos < 0:
            return "".join(out)
    out.append(_BRACES.sub("", text[pos:]))
    return "".join(out)


MAX_UNCLOSED = 20


def _drop_templates_from(text: str, pos: int, out: list[str]) -> int:
    """Append ``text[pos:]`` without its templates to ``out`` and return -1; at a template
    that is never closed, append only the text before it and return the end of its line."""
    stack: list[int] = []  # brace counts of the open constructs
    kept_from = pos  # start of the text after the last closed construct
    opened_at = pos  # where the outermost open construct began
    for m in _BRACES.finditer(text, pos):
        run = m.end() - m.start()
        if text[m.start()] == "{":
            if not stack:
                opened_at = m.start()
            if run == 3:
                stack.append(3)
            else:
                if run % 2:
                    stack.append(3)
                    run -= 3
                stack.extend([2] * (run // 2))
            continue
        if not stack:
            continue  # a stray closing run outside any template is text
        while run >= 2 and stack:
            top = stack.pop()
            run -= 3 if (top == 3 and run >= 3) else 2
        if not stack:
            out.append(text[kept_from:opened_at])
            kept_from = m.end() - run  # a left-over single brace stays outside
    if stack:
        out.append(text[kept_from:opened_at])
        line_end = text.find("\n", opened_at)
        return len(text) if line_end < 0 else line_end
    out.append(text[kept_from:])
    return -1


def drop_tables(text: str, keep_cells: bool = False) -> str:
    """``text`` without its tables (``{|`` … ``|}``, nested), or with each table replaced by
    the text of its caption and cells, one per line, when ``keep_cells``. A ``{|`` opens a
    table only at the start of a line (after spaces or ``:`` indents), a ``|}`` closes one only
    there too."""
    out: list[str] = []
    depth = 0
    kept_from = 0
    opened_at = 0
    for m in _TABLE_EDGE.finditer(text):
        line_start = text.rfind("\n", 0, m.start()) + 1
        indent = text[line_start : m.start()]
        if m.group() == "{|":
            if indent.strip(" \t:"):
                continue
            if depth == 0:
                opened_at = m.start()
            depth += 1
        elif depth and not indent.strip(" \t"):
            depth -= 1
            if depth == 0:
                out.append(text[kept_from:opened_at])
                if keep_cells:
                    out.append(_table_cells(text[opened_at : m.end()]))
                kept_from = m.end()
    if depth:  # an unclosed table runs to the end of the page (as MediaWiki renders it)
        out.append(text[kept_from:opened_at])
        if keep_cells:
            out.append(_table_cells(text[opened_at:]))
        return "".join(out)
    out.append(text[kept_from:])
    return "".join(out)


_CELL_SPLIT = re.compile(r"\|\||!!")
_CELL_ATTRIBUTES = re.compile(r"^[^|\[\]{}]*=[^|\[\]{}]*\|(?!\|)")


def _table_cells(table: str) -> str:
    """The caption and cell text of a table (already free of templates), one cell a line."""
    lines = ["\n"]
    for line in table.split("\n"):
        line = line.strip()
        if not line or line.startswith(("{|", "|}", "|-")):
            continue
        if line.startswith("|+"):
            cells = [line[2:]]
        elif line[0] in "|!":
            cells = _CELL_SPLIT.split(line[1:])
        else:  # a continuation line of the previous cell
            cells = [line]
        for cell in cells:
            cell = _CELL_ATTRIBUTES.sub("", cell, count=1).strip()
            if cell:
                lines.append(cell + "\n\n")
    return "".join(lines)


def _namespace_prefixes(file_ns: Iterable[str], category_ns: Iterable[str]) -> re.Pattern:
    names = {n.strip() for n in (*FILE_NAMESPACES, *CATEGORY_NAMESPACES, *file_ns, *category_ns)}
    key = tuple(sorted(n for n in names if n))
    pattern = _PREFIX_CACHE.get(key)
    if pattern is None:
        alternatives = "|".join(
            re.escape(n).replace(r"\ ", "[ _]+") for n in sorted(key, key=len, reverse=True)
        )
        pattern = re.compile(r"\[\[[ \t]*(?:" + alternatives + r")[ \t]*:", re.I)
        _PREFIX_CACHE[key] = pattern
    return pattern


_PREFIX_CACHE: dict[tuple[str, ...], re.Pattern] = {}


def _strip_links(text: str, namespaced: re.Pattern) -> str:
    if "[[" in text:
        text = _drop_namespaced_links(text, namespaced)
        if "[[" in text:
            text = _INTERLANGUAGE.sub("", text)
            text = _LINK.sub(_link_text, text)
    if "[" in text:
        text = drop_external_links(text)
    return text


def drop_external_links(text: str) -> str:
    """``text`` with each external link ``[url label]`` replaced by its label: what
    ``_EXTERNAL_LINK.sub(r"\\1", text)`` gives, without its cost on a line of links never closed
    (each would scan the rest of the line again: quadratic). A link closes at the first ``]``
    after its ``[``, on the same line; the regex runs only where one does."""
    out: list[str] = []
    pos = 0
    close = newline = -1  # the first "]" and line end at or after the current opening
    for m in _EXTERNAL_OPEN.finditer(text):
        start = m.start()
        if start < pos:
            continue
        if close != -2 and close < start:
            close = text.find("]", start)
            if close < 0:
                close = -2
        if close == -2:
            break  # no "]" left: no later link closes
        if newline != -2 and newline < start:
            newline = text.find("\n", start)
            if newline < 0:
                newline = -2
        if newline != -2 and newline < close:
            continue  # the line ends first: not a link
        link = _EXTERNAL_LINK.match(text, start)
        if link is None:
            continue
        out.append(text[pos:start])
        out.append(link.group(1))
        pos = link.end()
    if not out:
        return text
    out.append(text[pos:])
    return "".join(out)


def _link_text(m: re.Match) -> str:
    label = m.group(2)
    if label is None or not label.strip():  # ``[[a]]``, or the pipe trick ``[[a (b)|]]``
        return m.group(1)
    return label


def _drop_namespaced_links(text: str, namespaced: re.Pattern) -> str:
    """Drop ``[[File:…]]`` and ``[[Category:…]]`` links with everything inside them (a file
    caption may hold links of its own). ``[[:Category:X]]`` (leading colon) is an ordinary
    link and stays.

    A link never closed costs a scan of the rest of the text, so after ``MAX_UNCLOSED`` of
    them the later links are not looked for past their line (work stays linear on a page of
    such links)."""
    out: list[str] = []
    pos = 0
    unclosed = 0
    while True:
        m = namespaced.search(text, pos)
        if m is None:
            break
        depth = 0
        end = -1
        stop = len(text)
        if unclosed >= MAX_UNCLOSED:
            stop = text.find("\n", m.start())
            stop = len(text) if stop < 0 else stop
        for edge in _LINK_EDGE.finditer(text, m.start(), stop):
            depth += 1 if edge.group() == "[[" else -1
            if depth == 0:
                end = edge.end()
                break
        if end < 0:  # never closed: drop to the end of the line
            unclosed += 1
            nl = text.find("\n", m.start())
            end = len(text) if nl < 0 else nl
        out.append(text[pos : m.start()])
        pos = end
    out.append(text[pos:])
    return "".join(out)


def _strip_inline(text: str) -> str:
    if "<" in text:
        text = _BREAK_TAG.sub(" ", text)
        text = _TAG.sub("", text)
    if "''" in text:
        text = _QUOTES.sub("", text)
    if "__" in text:
        text = _MAGIC_WORD.sub("", text)
    if "(" in text:
        text = _EMPTY_PARENS.sub("", text)
        text = _PARENS_LEAD.sub("(", text)
    if "  " in text:
        text = _SPACES.sub(" ", text)
    if " ," in text:  # (spaces are single by now)
        text = text.replace(" ,", ",")
    if " ." in text:
        text = _SPACE_STOP.sub(".", text)
    return text


def _paragraphs(text: str, keep_headings: bool, keep_references: bool) -> list[str]:
    """Join text lines into paragraphs; headings, list items and rules end a paragraph. Unless
    ``keep_references``, a reference section (``is_reference_section``) is skipped up to the
    next heading of its level or higher, and so is a list item that is only a citation
    (``is_reference_line``)."""
    paragraphs: list[str] = []
    current: list[str] = []
    skipping = 0  # the level of the reference section being skipped (0: none)
    for line in text.split("\n"):
        line = line.strip()
        if skipping and not (line[:1] == "=" and line[-1] == "="):
            continue
        if not line:
            if current:
                _add(paragraphs, " ".join(current))
                current.clear()
            continue
        first = line[0]
        if first not in _STRUCTURE:
            current.append(line)
            continue
        if current:
            _add(paragraphs, " ".join(current))
            current.clear()
        if first == "=":
            if line[-1] != "=":  # not a heading: text that starts with "="
                current.append(line)
                continue
            title = line.strip("= \t")
            level = min(len(line) - len(line.lstrip("=")), len(line) - len(line.rstrip("=")))
            if skipping and level <= skipping:
                skipping = 0
            if not skipping and not keep_references and is_reference_section(title):
                skipping = level
            elif keep_headings and not skipping:
                _add(paragraphs, title)
        elif first in "*#:;":
            item = line.lstrip("*#:; \t")
            if keep_references or not is_reference_line(item):
                _add(paragraphs, item)
        elif first == "-":
            rest = line.lstrip("-").strip() if line.startswith("----") else line
            if rest:
                current.append(rest)
        elif first == "!" and "!!" not in line and "|" not in line:
            current.append(line)  # text that starts with "!"
        # other lines starting with "|" or "!": rows of tables built by removed templates
    if current:
        _add(paragraphs, " ".join(current))
    return paragraphs


_STRUCTURE = frozenset("=*#:;-|!")


REFERENCE_SECTIONS = frozenset({
    "see also", "notes", "note", "footnotes", "endnotes", "explanatory notes", "references",
    "reference", "general references", "additional references", "other references",
    "secondary references", "citations", "sources", "works cited", "cited works", "cited texts",
    "cited sources", "bibliography", "bibliographies", "selected bibliography", "further reading",
    "external links", "external link",
})
"""Titles of the sections at the end of an article that hold no prose for a model: where to
read on, the citations, the links out (Wikipedia's layout guide names them); ``is_reference_section``
also reads two or more of them joined (``Notes and references``)."""

_TITLE_JOINS = re.compile(r"\s*(?:,|&|\band\b)\s*")


def is_reference_section(title: str) -> bool:
    """Whether a heading's text (markup removed) names a section of ``REFERENCE_SECTIONS``, in
    any case, with a trailing colon, or several of them joined by ``and``, ``&`` or commas."""
    if "&" in title:
        title = html.unescape(title)
    title = " ".join(title.lower().split()).rstrip(":. ")
    if title in REFERENCE_SECTIONS:
        return True
    parts = [p for p in _TITLE_JOINS.split(title) if p]
    return len(parts) > 1 and all(p in REFERENCE_SECTIONS for p in parts)


_LINK_OUT = re.compile(r"(?:https?|ftps?)://|www\.", re.I)
_BOOK_NUMBER = re.compile(r"\b(?:ISBN|ISSN)(?:-1[03])?:?[ \t]*[0-9]")


def is_reference_line(item: str) -> bool:
    """Whether a list item's text is a citation: it opens with a bare URL (a link out, with at
    most its description) or it gives an ISBN or ISSN (a book or an edition in a list): what is
    left of bibliography entries outside the reference sections. Only list items are tested,
    never prose paragraphs."""
    return _LINK_OUT.match(item) is not None or (
        "IS" in item and _BOOK_NUMBER.search(item) is not None
    )


def _add(paragraphs: list[str], para: str) -> None:
    if "&" in para:
        para = " ".join(html.unescape(para).split())
    if para and para[0] in ".,;:":  # what a removed template or reference left in front
        para = para.lstrip(".,;: ")
    if para and _WORD.search(para):
        paragraphs.append(para)
