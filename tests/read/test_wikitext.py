"""The wikitext cleaner: markup rules one by one, and quality on real articles against
mwparserfromhell (MIT; a full wikitext parser) as the oracle."""

from __future__ import annotations

import bz2
import re
import time
from collections import Counter
from pathlib import Path

import mwparserfromhell
import pytest

from mlm_pipeline.read.wikidump import dump_encoding, is_disambiguation, owned_pages, parse_page
from hypothesis import given, settings
from hypothesis import strategies as st

from mlm_pipeline.read.wikitext import (
    DROPPED_TAGS,
    _EXTERNAL_LINK,
    clean_wikitext,
    drop_external_links,
    drop_tables,
    drop_tags,
    drop_templates,
    is_reference_line,
    is_reference_section,
)

SAMPLE = (
    Path(__file__).resolve().parents[1]
    / "data"
    / "wiki"
    / "enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2"
)

# --------------------------------------------------------------------------- rules


@pytest.mark.parametrize(
    "wikitext, paragraphs",
    [
        # templates, nested, with parameters; parser functions; {{{parameters}}}
        ("a {{cite|x={{y|z}}|w}} b", ["a b"]),
        ("{{Infobox person\n| name = John\n| birth_date = {{birth date|1900|1|1}}\n}}\nJohn was.",
         ["John was."]),
        ("A {{{1|default}}} b {{a|{{{2}}}}} c {{#if:x|y|z}} d", ["A b c d"]),
        ("x {{never closed\ny stays", ["x y stays"]),
        ("x }} y", ["x }} y"]),  # a stray closing run is text (as MediaWiki shows it)
        # references: paired, named, self-closing, holding templates and links
        ("Fact.<ref name=a>{{cite web|url=http://x}} [[Link]]</ref> Next<ref name=\"b\" /> end.",
         ["Fact. Next end."]),
        ("A<ref>one</ref> b <ref>two</ref> c", ["A b c"]),
        ("See<references />.", ["See."]),
        # comments, extension tags without prose, HTML tags with prose
        ("a <!-- {{hidden}} [[x]] --> b", ["a b"]),
        ("x <math>e^{i\\pi}</math> y <gallery>\nA.jpg|cap\n</gallery> z", ["x y z"]),
        ("<span style=\"c\">kept</span> and<br/>more <small>small</small>", ["kept and more small"]),
        # internal links: label, target, pipe trick; namespaced links
        ("[[reflection (physics)|reflection]] of [[light]]s", ["reflection of lights"]),
        ("[[Foo (bar)|]] x", ["Foo (bar) x"]),
        ("[[File:A.jpg|thumb|A [[cat]] on a [[mat|rug]].]] The cat.", ["The cat."]),
        ("[[Image:B.png]] x [[category:Cats| ]] y [[de:Katze]] z", ["x y z"]),
        ("[[:Category:Cats|cat list]] and [[wikt:cat|cat]]", ["cat list and cat"]),
        # external links
        ("See [http://example.com the site] and [https://x.org].", ["See the site and."]),
        # quotes, magic words, entities
        ("'''Bold''' and ''italic'' and '''''both'''''__NOTOC__", ["Bold and italic and both"]),
        ("a&nbsp;b &ndash; &amp;c &#91;1&#93; &lt;x&gt;", ["a b – &c [1] <x>"]),
        # structure: headings dropped, lists itemised, lines joined, rules
        ("== History ==\nOne\ntwo.\n\nThree.\n* item\n# num\n: indent\n----\nAfter.",
         ["One two.", "Three.", "item", "num", "indent", "After."]),
        # tables dropped; rows left by templates dropped; empty brackets cleaned
        ("{| class=wikitable\n! H\n|-\n| a || b\n|}\nAfter.", ["After."]),
        ("{{Election box begin}}\n|-\n| Party || 5\n{{Election box end}}\nText.", ["Text."]),
        ("'''Albedo''' ({{IPAc-en|b}}) is ({{lang|x}}; born 1900) here .", ["Albedo is (born 1900) here."]),
        ("{{Infobox}}", []),
        ("[[Category:A]]\n\n.", []),
    ],
)
def test_rules(wikitext, paragraphs):
    assert clean_wikitext(wikitext) == paragraphs


def test_options():
    table = "{| class=wikitable\n|+ Caption\n! H1 !! H2\n|-\n| a || style=\"x\" | [[b|B]]\n|}\nAfter."
    assert clean_wikitext(table, keep_tables=True) == ["Caption", "H1", "H2", "a", "B", "After."]
    text = "Intro.\n== History ==\nBody.\n=== Sub ===\nMore."
    assert clean_wikitext(text) == ["Intro.", "Body.", "More."]
    assert clean_wikitext(text, keep_headings=True) == ["Intro.", "History", "Body.", "Sub", "More."]
    french = "[[Fichier:A.jpg|vignette|x]] Le chat. [[Catégorie:Chats]]"
    assert clean_wikitext(french, file_namespaces=["Fichier"], category_namespaces=["Catégorie"]) == [
        "Le chat."
    ]


PAGE_WITH_REFERENCES = """'''Widget''' is a thing.<ref>{{cite web|url=http://a.example}}</ref>
* a list item of prose
* ISBN 0-451-51679-6 (paperback, 1956)
* http://www.example.org/widgets The widget site
* Smith, J. ''Widgets'', Acme Press, 1990, ISBN 978-0-06-136050-3.
Prose citing ISBN 0-451-51679-6 stays, and so does www.example.org in a sentence.
== History ==
Made in 1900.
== See also ==
* [[Gadget]]
== Notes and references ==
{{reflist}}
=== Bibliography ===
Jones, K. (2001). ''All about widgets''.
=== Subsection of the references ===
More citations.
== Legacy ==
Still made.
==External links:==
* [http://www.example.org Official site]
* http://www.kas.de/proj/home/pub/8/2/index.html
"""

KEPT_PARAGRAPHS = [
    "Widget is a thing.",
    "a list item of prose",
    "ISBN 0-451-51679-6 (paperback, 1956)",
    "http://www.example.org/widgets The widget site",
    "Smith, J. Widgets, Acme Press, 1990, ISBN 978-0-06-136050-3.",
    "Prose citing ISBN 0-451-51679-6 stays, and so does www.example.org in a sentence.",
    "Made in 1900.",
    "Gadget",
    "Jones, K. (2001). All about widgets.",
    "More citations.",
    "Still made.",
    "Official site",
    "http://www.kas.de/proj/home/pub/8/2/index.html",
]


def test_reference_sections_and_citation_items_are_dropped():
    """A reference section goes up to the next heading of its level or higher (its subsections
    with it); a list item that opens with a bare URL or gives an ISBN goes anywhere; prose with
    an ISBN or a URL stays. ``keep_references`` keeps it all, as the cleaner did before."""
    assert clean_wikitext(PAGE_WITH_REFERENCES) == [
        "Widget is a thing.",
        "a list item of prose",
        "Prose citing ISBN 0-451-51679-6 stays, and so does www.example.org in a sentence.",
        "Made in 1900.",
        "Still made.",
    ]
    assert clean_wikitext(PAGE_WITH_REFERENCES, keep_references=True) == KEPT_PARAGRAPHS
    assert clean_wikitext(PAGE_WITH_REFERENCES, keep_headings=True) == [
        "Widget is a thing.",
        "a list item of prose",
        "Prose citing ISBN 0-451-51679-6 stays, and so does www.example.org in a sentence.",
        "History",
        "Made in 1900.",
        "Legacy",
        "Still made.",
    ]


@pytest.mark.parametrize(
    "title, expected",
    [
        ("External links", True), ("external links", True), ("Further reading", True),
        ("See also", True), ("References", True), ("Notes", True), ("Footnotes", True),
        ("Bibliography", True), ("Sources", True), ("Citations", True), ("Works cited", True),
        ("Notes and references", True), ("References and further reading", True),
        ("Notes, references &amp; sources", True), ("External links:", True),
        ("  Further   Reading ", True),
        ("History", False), ("Notes on the text", False), ("Sources of the Nile", False),
        ("Works", False), ("Editions", False), ("Literature", False), ("and", False), ("", False),
    ],
)
def test_is_reference_section(title, expected):
    assert is_reference_section(title) is expected


@pytest.mark.parametrize(
    "item, expected",
    [
        ("http://www.example.org", True), ("https://example.org/a?b=c site", True),
        ("www.cartage.org.lb", True), ("ISBN 0-8220-7009-X (e-book, 1999)", True),
        ("Alain Connes: Noncommutative Geometry, Academic Press, 1994, ISBN 978-0121858605", True),
        ("ISSN 0028-0836", True), ("ISBN-13: 978-0-06-136050-3", True),
        ("The site www.example.org was launched in 2006.", False), ("ISBN", False),
        ("Thebes: the oldest temple", False), ("DISBN 5", False), ("isbn lowercase 5", False),
    ],
)
def test_is_reference_line(item, expected):
    assert is_reference_line(item) is expected


def test_a_page_of_headings_and_items_is_cleaned_in_linear_time():
    """Dropping sections and citation items is one pass over the lines: 40,000 reference
    headings and items cost about what 40,000 lines of prose do."""
    n = 40_000
    baseline = _seconds("== History ==\n* a thing of prose IS here\n" * n)
    bound = 10 * baseline + 0.5
    assert _seconds("== References ==\n* ISBN 0-451-51679-6\n=== Sub ===\n" * n, bound) < bound
    assert _seconds("* " + "IS" * 200_000 + "\n", bound) < bound


def test_nested_scans_are_linear_in_the_text():
    deep = "{{a|" * 2000 + "x" + "}}" * 2000
    assert drop_templates("s " + deep + " e") == "s  e"
    # an unclosed opener drops the rest of its line; past 20 of them, only the braces go
    assert drop_templates("{{x\n" * 3000 + "end") == "\n" * 20 + "x\n" * 2980 + "end"
    tables = "{|\n" * 50 + "| x\n" + "|}\n" * 50 + "after"
    assert drop_tables(tables).strip() == "after"


# a page of markup that is opened and never closed: each kind used to cost a scan of the rest of
# the page (or line) per opening, so 16,000 of them took seconds and a 5 MB page of them stalled
UNCLOSED = {
    "ref": "Text <ref>a citation\n",
    "math": "x <math>y\n",
    "gallery": "<gallery>\nFile:a.jpg\n",
    "file link": "a [[File:x.jpg|thumb|b\n",
    "external link": "[http://example.org label ",
}
CLOSED = {
    "ref": "Text <ref>a citation</ref>\n",
    "math": "x <math>y</math>\n",
    "gallery": "<gallery>\nFile:a.jpg</gallery>\n",
    "file link": "a [[File:x.jpg|thumb|b]]\n",
    "external link": "[http://example.org label] ",
}


def _seconds(text: str, bound: float = float("inf")) -> float:
    """The fastest of 3 cleanings of ``text`` (fewer once one takes over ``bound``)."""
    best = float("inf")
    for _ in range(3):
        t = time.perf_counter()
        clean_wikitext(text)
        best = min(best, time.perf_counter() - t)
        if best > bound:
            break
    return best


@pytest.mark.parametrize("kind", sorted(UNCLOSED))
def test_16000_unclosed_openings_cost_what_closed_ones_do(kind):
    """16,000 openings never closed are cleaned in about the time of 16,000 closed ones (a
    linear baseline of the same size), not in seconds: the bound is generous (10x plus 0.5 s),
    a quadratic scan exceeds it hundreds of times over."""
    n = 16_000
    baseline = _seconds(CLOSED[kind] * n)
    bound = 10 * baseline + 0.5
    assert _seconds(UNCLOSED[kind] * n, bound) < bound


_OLD_DROPPED_TAG = re.compile(r"<(" + "|".join(DROPPED_TAGS) + r")\b(?:[^>]*?/>|[^>]*>.*?</\1\s*>)", re.S | re.I)
_PIECES = ["<ref>", "</ref>", "<REF name=a>", "</Ref >", "<ref/>", "<ref a/>", "<ref /", ">", "/", "x", " ", "\n",
           "<references>", "</references>", "<math>", "</math>", "<refs>", "</ref x>", "<gallery>", "</GALLERY\n>",
           "<\u017fcore>", "</score>", "</\u017fcore>", "<\u212aref>", "<ref", "<", "[http://a b", "[//x", "[ftp:x y]",
           "[", "]", "]]", "[[File:a"]


@settings(max_examples=400, deadline=None)
@given(st.lists(st.sampled_from(_PIECES), max_size=16))
def test_linear_scans_give_what_the_regexes_gave(pieces):
    """The linear tag and external-link passes give exactly what the regexes they replace gave
    (so well-formed pages are cleaned as before, to the byte)."""
    text = "".join(pieces)
    assert drop_tags(text) == _OLD_DROPPED_TAG.sub("", text)
    assert drop_external_links(text) == _EXTERNAL_LINK.sub(r"\1", text)


# --------------------------------------------------------------------------- quality


@pytest.fixture(scope="module")
def articles() -> list[tuple[str, str]]:
    data = bz2.decompress(SAMPLE.read_bytes())
    encoding = dump_encoding(data)
    pages = [parse_page(raw.decode(encoding)) for raw in owned_pages(iter([(data, True)]), encoding)]
    kept = [
        (p.title, p.text)
        for p in pages
        if p.ns == 0 and not p.redirect and not is_disambiguation(p.text)
    ]
    assert len(kept) == 98
    return kept


@pytest.fixture(scope="module")
def oracles(articles) -> list[str]:
    return [oracle_text(text) for _, text in articles]


@pytest.fixture(scope="module")
def cleaned(articles) -> list[list[str]]:
    return [clean_wikitext(text) for _, text in articles]


_ORACLE_DROPPED_TAGS = {
    "ref", "references", "math", "chem", "ce", "score", "timeline", "gallery", "imagemap",
    "graph", "templatedata", "syntaxhighlight", "source", "inputbox", "categorytree", "hiero",
}
_NAMESPACED = re.compile(r"\s*(file|image|category)\s*:", re.I)


def oracle_text(wikitext: str) -> str:
    """The article's text by mwparserfromhell's ``strip_code``, after removing from its parse
    tree what the cleaner removes by design: templates and ``{{{parameters}}}``, references and
    the other non-prose tags, tables, file and category links, headings, comments, and the
    reference sections (found by the parser's headings, named as ``is_reference_section``
    names them)."""
    code = mwparserfromhell.parse(_without_reference_sections(wikitext))
    _prune(code)
    return code.strip_code(normalize=True, collapse=True)


_HEADING_LINE = re.compile(r"^(=+)[ \t]*(.*?)[ \t]*\1[ \t]*$", re.M)


def _without_reference_sections(wikitext: str) -> str:
    """The wikitext without its reference sections, cut at its heading lines (the parser nests
    later headings inside tags it reads as unclosed, so its tree would miss some)."""
    kept, skipping, pos = [], 0, 0
    for m in _HEADING_LINE.finditer(wikitext):
        if not skipping:
            kept.append(wikitext[pos : m.start()])
        pos = m.start()
        level = len(m.group(1))
        if skipping and level <= skipping:
            skipping = 0
        title = mwparserfromhell.parse(m.group(2)).strip_code().strip()
        if not skipping and is_reference_section(title):
            skipping = level
    if not skipping:
        kept.append(wikitext[pos:])
    return "".join(kept)


def _doomed(node) -> bool:
    nodes = mwparserfromhell.nodes
    if isinstance(node, (nodes.Template, nodes.Argument, nodes.Heading, nodes.Comment)):
        return True
    if isinstance(node, nodes.Tag):
        return str(node.tag).lower() in _ORACLE_DROPPED_TAGS or node.wiki_markup == "{|"
    if isinstance(node, nodes.Wikilink):
        return bool(_NAMESPACED.match(str(node.title)))
    return False


def _prune(code) -> None:
    """Drop doomed nodes from every level of the tree (one walk; ``Wikicode.remove`` per node
    would search the tree each time)."""
    kept = []
    for node in code.nodes:
        if _doomed(node):
            continue
        for child in ("contents", "title", "text"):
            sub = getattr(node, child, None)
            if isinstance(sub, mwparserfromhell.wikicode.Wikicode):
                _prune(sub)
        kept.append(node)
    code.nodes = kept


_WORD = re.compile(r"\w+")


def test_word_recall_against_mwparserfromhell(oracles, cleaned):
    found = total = produced = 0
    for oracle, paragraphs in zip(oracles, cleaned):
        want = Counter(_WORD.findall(oracle))
        got = Counter(_WORD.findall("\n".join(paragraphs)))
        found += sum((want & got).values())
        total += sum(want.values())
        produced += sum(got.values())
    recall, precision = found / total, found / produced
    # measured: recall 0.9967 (what is missed: citation list items outside the reference sections,
    # which the cleaner drops by design; rows of tables that templates open, which the
    # cleaner drops and the oracle keeps), precision 0.9915 (prose the oracle loses to tags it
    # parses as unclosed)
    assert recall >= 0.97, recall
    assert precision >= 0.97, precision


LEAKS = ("{{", "}}", "[[", "]]", "<ref", "'''", "==", "|-", "{|", "&lt;")


def test_markup_leakage(cleaned):
    lines = [p for paragraphs in cleaned for p in paragraphs]
    leaky = [p for p in lines if any(m in p for m in LEAKS)]
    assert len(lines) > 7000  # (7,188; 8,668 with the reference sections)
    assert len(leaky) / len(lines) < 0.001, leaky[:5]


def test_no_template_parameter_text(articles, oracles, cleaned):
    """Names and values of template parameters never reach the output: no ``name =`` syntax,
    and none of the infobox values that the article text does not repeat."""
    text = "\n".join(p for paragraphs in cleaned for p in paragraphs)
    assert not re.search(r"\|\s*\w+\s*=", text)
    assert not re.search(r"\b[a-z]+_[a-z_]+\s*=", text)  # birth_date =, image_map =
    checked = 0
    for (_, wikitext), outside, paragraphs in zip(articles, oracles, cleaned):
        prose = " ".join(paragraphs)
        for template in mwparserfromhell.parse(wikitext).filter_templates(recursive=False):
            if not str(template.name).strip().lower().startswith("infobox"):
                continue
            rest = wikitext.replace(str(template), "")
            for param in template.params:
                value = param.value.strip_code().strip()
                if len(value) < 12 or "\n" in value or value in outside or value in rest:
                    continue  # short, or the article says it too
                checked += 1
                assert value not in prose, (str(template.name), str(param.name), value)
    assert checked > 50, checked
