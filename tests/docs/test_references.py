"""Every "§" in the repository names a document of the repository, and every link in the
documents leads somewhere that exists.

A section reference is written ``docs/fq-protocol.md §4.2`` in code and
``[fq-protocol.md](fq-protocol.md) §4.2`` in the documents, on one line, so that a grep for
"§" shows what each one cites; several sections may follow one name (``§1.3, §9``,
``§1.3-§1.8``, ``§2.2-2.4``, ``§9 point 6``). The named file must be
under docs/ and have a heading numbered with each section cited. Inside a document, a bare
"§N" is that document's own section N, and must be one of its headings. Nothing may point
at the notes the project was written from, which are not in the repository.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
SCANNED = ["fqbroker", "docs", "tests", "bench", "examples", "conf", "pyspark_fqbroker"]
SUFFIXES = {".py", ".md", ".toml", ".js", ".html", ".css", ".txt", ".service", ".json"}
SKIP_DIRS = {"node_modules", "__pycache__", ".venv", ".git"}

# A document's name, as a path or a Markdown link, then its sections.
NUMBER = r"\d+(?:\.\d+)*"
GAP = r"[ \t]*"  # within a line: a reference is never wrapped
REFERENCE = re.compile(
    rf"(?P<file>[\w./-]+\.md)(?:\]\((?P<link>[^)\s]*)\))?[ \t]+"
    rf"(?P<sections>§{NUMBER}(?:{GAP}(?:,|/|-|\u2013|and|or){GAP}§?{NUMBER}|{GAP}point{GAP}\d+)*)"
)
SECTION = re.compile(rf"(?:§|[,/\u2013-]\s*§?|\b(?:and|or)\s+§?)({NUMBER})")
HEADING = re.compile(rf"^#{{1,6}} ({NUMBER})\.? ", re.M)
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
# What the project was written from, and is not in the repository.
OUTSIDE = re.compile(r"/work/shared|\.\./shared|\bspecs/\w+\.md|\bprotocols\.md|\bSTYLE\.md")


def scanned_files() -> Iterator[Path]:
    yield ROOT / "README.md"
    for top in SCANNED:
        for path in sorted((ROOT / top).rglob("*")):
            if SKIP_DIRS.intersection(path.relative_to(ROOT).parts):
                continue
            if path.is_file() and path.suffix in SUFFIXES:
                yield path


def sections_of(doc: Path) -> set[str]:
    return set(HEADING.findall(doc.read_text(encoding="utf-8")))


def cited(sections: str) -> list[str]:
    return SECTION.findall(sections)


def problems_in(path: Path) -> list[str]:
    text = path.read_text(encoding="utf-8", errors="replace")
    where = path.relative_to(ROOT)
    found: list[str] = []
    covered: set[int] = set()
    for m in REFERENCE.finditer(text):
        covered.update(i for i in range(m.start("sections"), m.end()) if text[i] == "§")
        name = m.group("link") or m.group("file")
        base = ROOT if name.startswith("docs/") else path.parent
        target = (base / name.split("#")[0]).resolve()
        if not target.is_relative_to(DOCS) or not target.is_file():
            found.append(f"{where}: {m.group(0)!r} names {name}, not a file under docs/")
            continue
        missing = [s for s in cited(m.group("sections")) if s not in sections_of(target)]
        if missing:
            found.append(f"{where}: {m.group(0)!r}: {name} has no section {missing}")
    own = sections_of(path) if path.suffix == ".md" and path.is_relative_to(DOCS) else set()
    for i, char in enumerate(text):
        if char != "§" or i in covered:
            continue
        bare = re.match(rf"§({NUMBER})", text[i:])
        if own and bare and bare.group(1) in own:
            continue  # a document's reference to its own section
        context = text[max(0, i - 60) : i + 20]
        found.append(f"{where}: a § that names no document of docs/: ...{context!r}")
    found += [
        f"{where}: points outside the repository: {m.group(0)!r}" for m in OUTSIDE.finditer(text)
    ]
    return found


@pytest.mark.parametrize("path", list(scanned_files()), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_section_reference_names_a_document_here(path: Path) -> None:
    if path == Path(__file__):
        return  # this file names what it looks for
    assert problems_in(path) == []


def anchor(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[`*_]|\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors_of(doc: Path) -> set[str]:
    text = re.sub(r"^```.*?^```", "", doc.read_text(encoding="utf-8"), flags=re.M | re.S)
    return {anchor(h) for h in re.findall(r"^#{1,6} (.+)$", text, re.M)}


@pytest.mark.parametrize(
    "doc", [ROOT / "README.md", *sorted(DOCS.glob("*.md"))], ids=lambda p: p.name
)
def test_every_link_of_the_documents_leads_somewhere(doc: Path) -> None:
    text = re.sub(r"^```.*?^```", "", doc.read_text(encoding="utf-8"), flags=re.M | re.S)
    broken = []
    for target in LINK.findall(text):
        if re.match(r"[a-z]+:", target):
            continue  # http:, https:, mailto:
        name, _, fragment = target.partition("#")
        path = (doc.parent / name).resolve() if name else doc
        if not path.exists():
            broken.append(f"{target}: no such file")
        elif fragment and path.suffix == ".md" and fragment not in anchors_of(path):
            broken.append(f"{target}: no heading #{fragment} in {path.name}")
    assert broken == []


def test_the_protocol_reference_keeps_its_numbering() -> None:
    """The sections code and documents cite, as the reference numbers them."""
    expected = {"1", "2", "3", "4", "5", "6", "7", "8", "9"}
    expected |= {f"1.{n}" for n in range(1, 15)} | {f"2.{n}" for n in range(1, 7)}
    expected |= {f"3.{n}" for n in range(1, 6)} | {"4.1", "4.2"}
    expected |= {f"5.{n}" for n in range(1, 5)} | {f"6.{n}" for n in range(1, 4)}
    expected |= {f"7.{n}" for n in range(1, 4)}
    assert sections_of(DOCS / "fq-protocol.md") == expected
