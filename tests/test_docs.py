"""The documentation as a newcomer follows it: examples that run from a clone without stepping
on each other, no machine's paths or tracker numbers, files that exist, commands that do what
they say on a remote cluster, and figures that agree with the measurements they cite."""

from __future__ import annotations

import glob
import json
import re
import shlex
from pathlib import Path

import pytest

from conftest import REPO
from mlm_pipeline.config import PrepareConfig, settings_of

DOCS = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
SHIPPED_TEXT = [*DOCS, REPO / "sample" / "README.md", REPO / "tests" / "data" / "README.md",
                REPO / "mkdocs.yml", *sorted((REPO / "docs").rglob("*.py")),
                *sorted((REPO / "benchmarks").glob("*.py")), *sorted((REPO / "benchmarks" / "results").glob("*.json")),
                *sorted(p for p in (REPO / "deploy").rglob("*") if p.is_file()),
                *sorted((REPO / "scripts").glob("*"))]


def code_blocks(path: Path) -> list[str]:
    return re.findall(r"^\s*```[a-z]*\n(.*?)^\s*```", path.read_text(encoding="utf-8"), flags=re.S | re.M)


def shell_commands(text: str) -> list[list[str]]:
    """Commands of a shell snippet: continuation lines joined, comments dropped, split as a shell does."""
    joined = re.sub(r"\\\n", " ", text)
    out = []
    for line in joined.splitlines():
        line = re.sub(r"(^|\s)#.*$", "", line).strip()
        if line:
            try:
                out.append(shlex.split(line))
            except ValueError:
                continue
    return out


VALUE_FLAGS = {f for s in settings_of(PrepareConfig) if s.value_type is not bool for f in s.flags} | {"--config"}


def prepare_invocations() -> list[tuple[str, list[str], str]]:
    """(where, inputs, output) of every `mlm-pipeline prepare` in the README, the getting-started page
    (whose blocks run in the same clone after the README's) and the quickstart."""
    sources = [(page, block) for page in ("README.md", "docs/getting-started.md") for block in code_blocks(REPO / page)]
    sources.append(("scripts/quickstart.sh", (REPO / "scripts" / "quickstart.sh").read_text()))
    found = []
    for where, text in sources:
        for argv in shell_commands(text):
            starts = [i for i, a in enumerate(argv[:-1]) if a.endswith("mlm-pipeline") and argv[i + 1] == "prepare"]
            for i in starts:
                args, inputs, output, rest = argv[i + 2:], [], None, []
                k = 0
                while k < len(args):
                    a = args[k]
                    if a in ("-o", "--output"):
                        output, k = args[k + 1], k + 2
                    elif a in VALUE_FLAGS:
                        rest += [a, args[k + 1]]
                        k += 2
                    elif a.startswith("-") or a == '"$@"' or a == "$@":
                        rest.append(a)
                        k += 1
                    else:
                        inputs.append(a)
                        k += 1
                found.append((where, inputs, output, " ".join(sorted(rest))))
    return found


def test_readme_examples_that_run_from_a_clone_write_separate_outputs():
    runnable = [(w, i, o, r) for w, i, o, r in prepare_invocations()
                if i and all((REPO / p).exists() for p in i) and o]
    assert len(runnable) >= 6  # the quickstart, the five users' examples and the first run at least
    seen: dict[str, tuple] = {}
    for where, inputs, output, rest in runnable:
        key = output.rstrip("/").removeprefix("./")
        if key in seen:
            assert seen[key] == (inputs, rest), (
                f"{where}: prepare into {output} with other inputs or settings than an earlier example "
                f"({seen[key]}): the second would be refused")
        seen[key] = (inputs, rest)


MACHINE_PATH = re.compile(r"(?<![\w.~-])/(work|tmp|root|home/\w+)/")
TRACKER = re.compile(r"\bissues?\s+#?\d+|(?<![\w&#])#\d{2,}\b", re.I)


@pytest.mark.parametrize("path", SHIPPED_TEXT, ids=lambda p: str(p.relative_to(REPO)))
def test_no_machine_paths_or_tracker_numbers(path):
    text = path.read_text(encoding="utf-8", errors="replace")
    assert not MACHINE_PATH.search(text), MACHINE_PATH.search(text).group(0)
    assert not TRACKER.search(text), TRACKER.search(text).group(0)


REPO_PATH = re.compile(r"(?<![\w/.-])((?:sample|tests|benchmarks|docs|deploy|scripts|src)/[\w*./{}-]*[\w*}])")


def test_repository_paths_named_in_the_docs_exist():
    missing = []
    for doc in DOCS:
        text = doc.read_text(encoding="utf-8")
        for match in REPO_PATH.finditer(text):
            path = match.group(1)
            if re.search(r"(--json|--out|-o)\s+$", text[max(0, match.start() - 8):match.start()]):
                continue  # a file the command writes
            pattern = re.sub(r"\{[^}]*\}", "*", path)
            if not glob.glob(str(REPO / pattern)) and not (REPO / path).exists():
                missing.append(f"{doc.name}: {path}")
    assert not missing, missing


DATA_FLAGS = {"--input", "--zh-input", "--zh-vocab", "--vocab", "--tokenizer", "-t", "--held-out", "--held-out-zh",
              "--held-out-zh-vocab"}


def test_benchmark_commands_name_bundled_files_or_placeholders():
    """A benchmark command in the docs runs from a clone as written, or says where its data goes
    (``path/to/...``): no file of one machine named as if it were in the repository."""
    checked = 0
    for doc in DOCS:
        for block in code_blocks(doc):
            for argv in shell_commands(block):
                if not any(re.search(r"benchmarks/\w+\.py$", a) for a in argv):
                    continue
                for flag, value in zip(argv, argv[1:]):
                    if flag in DATA_FLAGS:
                        checked += 1
                        assert value.startswith(("path/to/", "/path/to/")) or (REPO / value).exists() \
                            or re.match(r"[\w-]+/vocab\.txt$", value), f"{doc.name}: {flag} {value}"
    assert checked >= 3


def test_remote_job_commands_quote_the_tilde():
    """``ray job submit -- ... ~/x``: an unquoted ``~`` is expanded by the laptop's shell, not the head's."""
    found = 0
    for path in [*DOCS, *(REPO / "deploy").rglob("*.yaml")]:
        text = re.sub(r"\\\n", " ", path.read_text(encoding="utf-8"))
        for line in text.splitlines():
            if "ray job submit" not in line or " -- " not in line:
                continue
            found += 1
            remote = line.split(" -- ", 1)[1]
            quoted = False
            for ch in remote:
                if ch == "'":
                    quoted = not quoted
                elif ch == "~" and not quoted:
                    pytest.fail(f"{path.name}: unquoted ~ in a remote command: {line.strip()}")
    assert found >= 3


def test_ray_is_pinned_to_one_version_everywhere():
    versions = {}
    for path in [REPO / "docs" / "cloud.md", REPO / "deploy" / "aws" / "cluster.yaml",
                 REPO / "deploy" / "gcp" / "cluster.yaml"]:
        text = path.read_text(encoding="utf-8")
        versions[path.name + str(path.parent.name)] = set(re.findall(r"ray\[default\]==([\d.]+)", text))
    for name in ("aws", "gcp"):  # the launcher's nodes install the version the laptop runs
        setup = (REPO / "deploy" / name / "cluster.yaml").read_text(encoding="utf-8")
        assert re.search(r"pip install [^\n]*ray\[default\]==[\d.]+", setup), name
    rayjob = (REPO / "deploy" / "kuberay" / "rayjob.yaml").read_text(encoding="utf-8")
    versions["rayjob"] = set(re.findall(r'rayVersion:\s*"([\d.]+)"', rayjob))
    assert all(versions.values()), versions
    assert len(set().union(*versions.values())) == 1, versions


def _performance_tf_d1() -> tuple[str, str]:
    row = next(line for line in (REPO / "docs" / "performance.md").read_text(encoding="utf-8").splitlines()
               if line.startswith("| English, NSP, static mask, TFRecord, dupe 1"))
    mb_s = re.search(r"; ([\d.]+) MB/s", row).group(1)
    rss = re.search(r"\| (\d+) MB \|\s*$", row).group(1)
    return mb_s, rss


def test_cloud_figures_are_the_measured_ones():
    mb_s, rss = _performance_tf_d1()
    cloud = (REPO / "docs" / "cloud.md").read_text(encoding="utf-8")
    assert f"**{mb_s} MB of text per second**" in cloud and f"peak RSS of {rss} MB" in cloud
    assert "about 2 MB/s" not in cloud and "220 MB" not in cloud
    assert "220 MB" not in (REPO / "deploy" / "kuberay" / "rayjob.yaml").read_text(encoding="utf-8")


def test_reference_mode_memory_claim_matches_its_measurement():
    rss = {}
    for size in (10, 30):
        result = json.loads((REPO / "benchmarks" / "results" / f"reference-memory-{size}MB.json").read_text())
        rss[size] = result["sizes"][f"{size}MB"]["variants"]["ref-d1"]["peak_rss_mb"]
    slope = (rss[30] - rss[10]) / 20
    readme = (REPO / "docs" / "objectives.md").read_text(encoding="utf-8")  # where `--reference` is described
    claimed = float(re.search(r"about\s+([\d.]+)\s+MB\s+of\s+RAM\s+per\s+MB\s+of\s+text", readme).group(1))
    assert abs(claimed - slope) <= 0.5, (claimed, slope)
    flat = " ".join(readme.split())
    assert f"peak RSS {rss[10]:.0f} MB for 10 MB" in flat and f"{rss[30]:.0f} MB for 30 MB" in flat


def test_readme_is_a_short_front_door_with_its_two_commands():
    """The README is what a newcomer reads in five minutes: the two commands as they always were,
    an example per kind of user, the results, and links into the documentation site."""
    text = (REPO / "README.md").read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 300
    assert "<!-- readme-test: writes out/manifest.json -->\n```bash\nbash scripts/quickstart.sh\n```" in text
    assert "<!-- readme-test: skip (the whole test suite, of which the README test is part) -->\n```bash\n" \
        "bash scripts/test.sh\n```" in text
    for example in ("--input_file=", ".xml.bz2", "--objective electra", "MLMDataset", "--claim"):
        assert example in text, example
    linked = set(re.findall(r"\]\(docs/([\w-]+\.md)", text))
    assert linked == {p.name for p in (REPO / "docs").glob("*.md")}, "every page linked, and only pages that exist"
