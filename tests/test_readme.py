"""README.md stays a front page, docs/results.md one page of the latest figures per machine (the
dated runs live on branch `results-history`), and every relative link in README.md and docs/*.md
resolves.

A link is a markdown link or image, `[text](target)`; `target` may be `path`, `path#anchor` or
`#anchor`. http(s) and mailto links are not checked. The path must exist (a file or a folder,
relative to the file holding the link); an anchor into a .md file must name one of its headings
under GitHub's slug rules: lowercase, punctuation dropped, spaces to '-', a repeated slug numbered
`-1`, `-2`, ... Links inside code (fenced blocks and `inline code`) are not links.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
MAX_README_LINES = 150
RESULTS = ROOT / "docs" / "results.md"
MAX_RESULTS_LINES = 300

_FENCE = re.compile(r"^\s*(```|~~~)")
_INLINE_CODE = re.compile(r"(`+)(?:(?!\1).)+?\1")
_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_HEADING = re.compile(r"^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$")


def _prose_lines(text: str) -> list[str]:
    """The file's lines outside fenced code blocks."""
    lines, fenced = [], False
    for line in text.splitlines():
        if _FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            lines.append(line)
    return lines


def slug(heading: str) -> str:
    """GitHub's anchor for a heading's text (before numbering repeats)."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link in a heading keeps its text
    text = text.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)  # drop punctuation (backticks, dots, apostrophes, ...)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    result = set()
    for line in _prose_lines(path.read_text(encoding="utf-8")):
        m = _HEADING.match(line)
        if not m:
            continue
        base = slug(m.group(2))
        n = seen.get(base, 0)
        seen[base] = n + 1
        result.add(base if n == 0 else f"{base}-{n}")
    return result


def links(path: Path) -> list[str]:
    found = []
    for line in _prose_lines(path.read_text(encoding="utf-8")):
        found += _LINK.findall(_INLINE_CODE.sub("", line))
    return found


def _documents() -> list[Path]:
    return [README, *sorted((ROOT / "docs").glob("*.md"))]


def test_readme_is_short():
    n = len(README.read_text(encoding="utf-8").splitlines())
    assert n <= MAX_README_LINES, f"README.md has {n} lines; at most {MAX_README_LINES} (move details to docs/)"


def test_results_is_one_page():
    n = len(RESULTS.read_text(encoding="utf-8").splitlines())
    assert n <= MAX_RESULTS_LINES, (
        f"docs/results.md has {n} lines; at most {MAX_RESULTS_LINES}: the latest figures per machine, "
        "the dated runs on branch results-history"
    )


@pytest.mark.parametrize("doc", _documents(), ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(doc: Path):
    broken = []
    for target in links(doc):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):  # http:, https:, mailto:
            continue
        path_part, _, anchor = target.partition("#")
        dest = (doc.parent / path_part).resolve() if path_part else doc
        if not dest.exists():
            broken.append(f"{target}: no such file")
            continue
        if anchor and dest.suffix == ".md" and dest.is_file() and anchor not in anchors(dest):
            broken.append(f"{target}: no heading with anchor #{anchor} in {dest.relative_to(ROOT)}")
    assert not broken, f"broken links in {doc.relative_to(ROOT)}:\n  " + "\n  ".join(broken)


def test_slug_rules():
    assert slug("Limits today") == "limits-today"
    assert slug("kiln's own capture (`kiln.compile`)") == "kilns-own-capture-kilncompile"
    assert slug("`kiln.explain`") == "kilnexplain"
    assert slug("C++") == "c"
    assert slug("Dumps: `KILN_DEBUG_DIR`") == "dumps-kiln_debug_dir"
    assert slug("The CPU fast path against Inductor's freezing (float32)") == (
        "the-cpu-fast-path-against-inductors-freezing-float32"
    )


def test_checker_sees_links(tmp_path: Path):
    doc = tmp_path / "a.md"
    doc.write_text("# Top\n\n[ok](#top) ![img](b.png) `[not](a link)`\n```\n[nor](this)\n```\n[x](b.md#sub-part)\n")
    assert links(doc) == ["#top", "b.png", "b.md#sub-part"]
    (tmp_path / "b.md").write_text("## Sub part\n## Sub part\n")
    assert anchors(tmp_path / "b.md") == {"sub-part", "sub-part-1"}
