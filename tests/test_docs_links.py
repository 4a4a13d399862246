"""The docs name only what exists: every repository path and relative link in docs/*.md, README.md and
deploy/README.md resolves, and docs/benchmarks.md's results table is the README's (``python -m bench table``).

A path is a word starting with one of the repository's top folders (``bench/``, ``rectrain/``, ...) inside
backticks or a Markdown link, or anywhere when it ends in a file extension or ``/``; one holding a placeholder
(``<model>``, ``NAME``, ``*``, ``{m}``) is a pattern and one ending ``/s`` a rate (``examples/s``); both
are skipped.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = sorted((ROOT / "docs").glob("*.md")) + [ROOT / "README.md", ROOT / "deploy" / "README.md"]
TOPS = ("bench", "deploy", "docs", "examples", "protos", "recserve", "rectrain", "scripts", "tests")
_WORD = r"(?:" + "|".join(TOPS) + r")/[\w./<>{}*-]*"
_CODE = re.compile(r"`([^`]+)`")
_BARE = re.compile(r"(?<![\w./-])(" + _WORD + ")")
_LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")
_PLACEHOLDER = re.compile(r"[<>*{}]|\b[A-Z]{2,}\b")


def _is_pattern(path: str) -> bool:
    return bool(_PLACEHOLDER.search(path)) or path.endswith("/s")  # a rate (examples/s), not a path


def mentioned_paths(text: str) -> set[str]:
    """Repository paths a Markdown text names (see the module docstring)."""
    found = set()
    for span in _CODE.findall(text):
        found.update(_BARE.findall(span))
    for word in _BARE.findall(text):
        if re.search(r"\.\w+$", word) or word.endswith("/"):
            found.add(word)
    return {p.rstrip(".,:;") for p in found if not _is_pattern(p)}


def missing(doc: Path) -> list[str]:
    text = doc.read_text(encoding="utf-8")
    out = [f"path {p}" for p in sorted(mentioned_paths(text)) if not (ROOT / p).exists()]
    for target in _LINK.findall(text):
        if not target.startswith(("http://", "https://", "mailto:")) and not (doc.parent / target).exists():
            out.append(f"link {target}")
    return out


def test_the_checker_finds_paths_and_skips_patterns():
    text = "run `bench/gone.py --x`, see bench/old.md; `bench/NAME.py`, `models/<m>/1`, `tests/ examples/s`"
    assert mentioned_paths(text) == {"bench/gone.py", "bench/old.md", "tests/"}


def test_every_path_and_link_in_the_docs_exists():
    broken = [f"{doc.relative_to(ROOT)}: {found}" for doc in DOCS for found in missing(doc)]
    assert not broken, "docs name what does not exist:\n" + "\n".join(broken)


def test_benchmarks_md_shows_the_readmes_results_table():
    begin, end = "<!-- bench table: begin -->\n", "<!-- bench table: end -->"
    blocks = []
    for doc in (ROOT / "README.md", ROOT / "docs" / "benchmarks.md"):
        text = doc.read_text(encoding="utf-8")
        assert begin in text and end in text, f"{doc.name}: the bench table markers are missing"
        blocks.append(text.split(begin, 1)[1].split(end, 1)[0])
    assert blocks[0] == blocks[1], "docs/benchmarks.md's results table differs from README.md's"
