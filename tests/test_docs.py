"""The user docs stay true and read as documentation, not as a work log.

User docs: README.md, docs/*.md except docs/research.md (the research record, where dates,
passes and who ran what belong), and firmware_bridge/*.md. Checked here:

* no work-log line: a numbered pass, "the lead", an issue number, a working "session",
  a date or time of day of the work;
* every ``file.py:NNN`` / ``file.c:NNN`` mention names an existing file with at least NNN
  lines, and no doc points at bare "line NNN" (mention the function instead);
* README: no table cell over 400 characters; every row of a table with a ``command``
  column names a command (``grpo-ctrl``, ``python`` or ``pytest``) and a CPU model;
* docs/grpo.md's settings table lists exactly the fields of ``GRPOConfig``;
* every image a doc shows exists, and every image under docs/ is shown by a user doc;
* every "docs/x.md §N" or "research §N" mention, in the docs and in the code, names a
  numbered section that exists.
"""
from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RESEARCH = ROOT / "docs" / "research.md"


def user_docs() -> list[Path]:
    docs = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")),
            *sorted((ROOT / "firmware_bridge").glob("*.md"))]
    return [p for p in docs if p != RESEARCH and p.exists()]


def doc_lines():
    for path in user_docs():
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            yield path.relative_to(ROOT), number, line


ORDINALS = ("first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|eleventh|"
            "twelfth|thirteenth|fourteenth|fifteenth")
MONTHS = ("January|February|March|April|May|June|July|August|September|October|November|"
          "December|Jan|Feb|Mar|Apr|Jun|Jul|Aug|Sep|Sept|Oct|Nov|Dec")
WORK_LOG = [
    ("a numbered pass", re.compile(rf"\b({ORDINALS})\s+pass\b", re.I)),
    ("a numbered pass", re.compile(r"\b\d+(st|nd|rd|th)\s+pass\b", re.I)),
    ("who ran it", re.compile(r"\bthe lead\b", re.I)),
    ("an issue number", re.compile(r"\bissues?\s+#?\d+", re.I)),
    ("a date of work", re.compile(rf"\b({MONTHS})\.?\s+\d{{1,2}}\b")),
    ("a date of work", re.compile(rf"\b\d{{1,2}}\s+({MONTHS})\b")),
    ("a date of work", re.compile(r"\b20\d\d-\d\d-\d\d\b")),
    ("a time of day", re.compile(r"\b\d{1,2}:\d\d(-\d{1,2}:\d\d)?\s*UTC\b")),
    ("a time of day", re.compile(r"\bat \d{1,2}:\d\d\b")),
]
SESSION = re.compile(r"\bsessions?\b", re.I)
# "session" as ONNX Runtime's word (export/session.py, PolicySession, an onnxruntime session)
SESSION_OK = re.compile(r"(onnx\w*|onnxruntime|tuned|default|inference)\s+session|"
                        r"session(\.py|\.run|\.intra_op|\s+helper)|\w+Session|\.session\b|"
                        r"\bone session is\b", re.I)
# "#16" as an issue, outside code spans (`USAT #16` is an instruction's immediate)
ISSUE_REF = re.compile(r"(?<![\w&/])#\d+\b")
CODE_SPAN = re.compile(r"`[^`]*`")


def work_log_reason(line: str) -> str | None:
    """Why ``line`` reads as a work-log line, or None."""
    for reason, pattern in WORK_LOG:
        if pattern.search(line):
            return reason
    if ISSUE_REF.search(CODE_SPAN.sub("", line)):
        return "an issue number"
    if SESSION.search(SESSION_OK.sub("", line)):
        return "a working session"
    return None


def test_work_log_detector_on_known_lines():
    log = ["### Fourteenth pass: the iteration's small costs (issue 16, December 2)",
           "Run by the lead on main, 2026-12-01 05:25-05:29 UTC", "as in the 3rd pass",
           "(§5, second session)", "see #16", "measured at 10:29 UTC", "Dec 1 10:29"]
    clean = ["The tuned session gains over the default one", "`export/session.py`",
             "pass the flag `--overlap false`", "#include <x.h>", "bypass 12 steps",
             "the sixth of the six categories", "`PolicySession(...)`, one ONNX session",
             "`VCVT.S32.F32` and `USAT #16`", "from grpo_ctrl.export.session import PolicySession"]
    assert all(work_log_reason(s) for s in log), [s for s in log if not work_log_reason(s)]
    assert not any(work_log_reason(s) for s in clean), [s for s in clean if work_log_reason(s)]


def test_no_work_log_lines():
    bad = [f"{p}:{n}: {why}: {line.strip()[:100]}" for p, n, line in doc_lines()
           if (why := work_log_reason(line))]
    assert not bad, "work-log lines in the user docs:\n" + "\n".join(bad[:40]) + \
        (f"\n... and {len(bad) - 40} more" if len(bad) > 40 else "")


SOURCE_REF = re.compile(r"([\w./-]+\.(?:py|c|h)):(\d+)(?:-(\d+))?")


def resolve(name: str, doc: Path) -> list[Path]:
    """The files ``name`` may mean: relative to the repository or the doc, else by name."""
    for base in (ROOT, (ROOT / doc).parent):
        if (base / name).is_file():
            return [base / name]
    return [p for p in ROOT.rglob(Path(name).name)
            if ".git" not in p.parts and p.is_file() and str(p).endswith(name)]


def test_line_references_point_into_existing_files():
    bad = []
    for doc, n, line in doc_lines():
        for m in SOURCE_REF.finditer(line):
            last = int(m.group(3) or m.group(2))
            files = resolve(m.group(1), doc)
            if not files:
                bad.append(f"{doc}:{n}: {m.group(0)}: no such file")
            elif not any(len(f.read_text(errors="replace").splitlines()) >= last
                         for f in files):
                bad.append(f"{doc}:{n}: {m.group(0)}: the file is shorter")
        if re.search(r"\blines?\s+\d+", line):
            bad.append(f"{doc}:{n}: a bare line number (name the function): {line.strip()[:80]}")
    assert not bad, "\n".join(bad)


def tables(text: str):
    """Each markdown table of ``text`` as a list of rows of cells (header first, no rule)."""
    rows: list[list[str]] = []
    for line in text.splitlines() + [""]:
        if line.lstrip().startswith("|"):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if not all(re.fullmatch(r":?-{3,}:?", c) for c in cells):
                rows.append(cells)
        elif rows:
            yield rows
            rows = []


README = ROOT / "README.md"
CPU_MODEL = re.compile(r"AMD EPYC|Intel|Xeon|Ryzen|Apple M\d|Graviton|Core i[3579]")


def test_readme_table_cells_are_short():
    long = [c[:60] + "..." for t in tables(README.read_text()) for row in t for c in row
            if len(c) > 400]
    assert not long, f"README table cells over 400 characters: {long}"


def test_readme_results_rows_name_command_and_cpu():
    result_tables = [t for t in tables(README.read_text())
                     if any(c.lower() == "command" for c in t[0])]
    assert result_tables, "README has no results table (one with a `command` column)"
    bad = []
    for t in result_tables:
        for row in t[1:]:
            text = " | ".join(row)
            if not re.search(r"grpo-ctrl|python|pytest", text):
                bad.append(f"no command: {text[:80]}")
            if not CPU_MODEL.search(text):
                bad.append(f"no CPU model: {text[:80]}")
    assert not bad, "\n".join(bad)


SETTINGS = re.compile(r"<!-- settings -->(.*?)<!-- /settings -->", re.S)


def test_settings_table_matches_grpo_config():
    from grpo_ctrl.grpo_config import GRPOConfig

    text = (ROOT / "docs" / "grpo.md").read_text()
    block = SETTINGS.search(text)
    assert block, "docs/grpo.md has no <!-- settings --> ... <!-- /settings --> block"
    documented = [m.group(1) for t in tables(block.group(1)) for row in t[1:]
                  if (m := re.fullmatch(r"`(\w+)`", row[0]))]
    fields = {f.name for f in dataclasses.fields(GRPOConfig)}
    assert len(documented) == len(set(documented)), "a setting is listed twice"
    assert not fields - set(documented), f"GRPOConfig fields not in docs/grpo.md: " \
        f"{sorted(fields - set(documented))}"
    assert not set(documented) - fields, f"docs/grpo.md lists settings GRPOConfig does not " \
        f"have: {sorted(set(documented) - fields)}"


IMAGE = re.compile(r"!\[[^\]]*\]\(([^)\s]+)")


def test_images_exist_and_every_image_is_shown():
    shown, bad = set(), []
    for doc in user_docs() + ([RESEARCH] if RESEARCH.exists() else []):
        for target in IMAGE.findall(doc.read_text()):
            path = (doc.parent / target).resolve()
            if not path.is_file():
                bad.append(f"{doc.relative_to(ROOT)}: {target} does not exist")
            if doc != RESEARCH:
                shown.add(path)
    unshown = [p.name for p in sorted((ROOT / "docs").glob("*.png")) if p.resolve() not in shown]
    assert not bad, "\n".join(bad)
    assert not unshown, f"images under docs/ that no user doc shows: {unshown}"


SECTION_REF = re.compile(r"(?:(?:docs/|firmware_bridge/)?(\w+)\.md|\b(research)) §(\d+)")


def sections(name: str) -> set[int] | None:
    """The numbered ``## N.`` sections of the doc ``name`` (research, grpo, ...), or None."""
    for folder in ("docs", "firmware_bridge", "."):
        path = ROOT / folder / f"{name}.md"
        if path.exists():
            return {int(n) for n in re.findall(r"^## (\d+)\.", path.read_text(), re.M)}
    return None


def section_reference_errors(paths) -> list[str]:
    bad = []
    for path in paths:
        for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            for m in SECTION_REF.finditer(line):
                name, number = m.group(1) or m.group(2), int(m.group(3))
                found = sections(name)
                if found is not None and number not in found:
                    bad.append(f"{path.relative_to(ROOT)}:{n}: {m.group(0)}: no such section")
    return bad


def test_section_references_in_docs():
    bad = section_reference_errors(user_docs() + [RESEARCH])
    assert not bad, "\n".join(bad)


def test_section_references_in_code():
    code = [p for folder in ("grpo_ctrl", "export", "firmware_bridge", "tests", "benchmarks")
            for p in sorted((ROOT / folder).rglob("*.py"))]
    bad = section_reference_errors(code)
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("doc", ["README.md", "docs/grpo.md", "docs/research.md"])
def test_docs_stay_short(doc):
    assert len((ROOT / doc).read_text().splitlines()) <= 600
