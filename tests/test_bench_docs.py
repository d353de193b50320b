"""bench/benchdocs.py: the benches write their own figures into
docs/performance.md, each between its markers, and nothing else on the page
changes (a wrong rewrite would lose the prose or put figures where nobody
reads them)."""

from __future__ import annotations

import argparse
import datetime
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

import benchdocs  # noqa: E402

PAGE = """# Performance

Prose before.

<!-- bench:alpha -->
old alpha figures
<!-- /bench:alpha -->

Prose between.

<!-- bench:beta -->
old beta figures
<!-- /bench:beta -->
"""


def test_a_section_is_replaced_between_its_markers_and_the_rest_is_kept() -> None:
    out = benchdocs.replace_section(PAGE, "alpha", "\nnew alpha\n\nsecond line\n")
    assert out == PAGE.replace("old alpha figures", "new alpha\n\nsecond line")
    assert benchdocs.replace_section(out, "alpha", "new alpha\n\nsecond line") == out  # rewriting is stable
    assert benchdocs.replace_section(out, "beta", "b") == out.replace("old beta figures", "b")


@pytest.mark.parametrize("page", [
    PAGE.replace("<!-- bench:alpha -->\n", ""),
    PAGE.replace("<!-- /bench:alpha -->\n", ""),
    PAGE + "<!-- bench:alpha -->\n<!-- /bench:alpha -->\n",
    PAGE.replace("<!-- bench:alpha -->", "<!-- tmp -->").replace("<!-- /bench:alpha -->", "<!-- bench:alpha -->")
        .replace("<!-- tmp -->", "<!-- /bench:alpha -->"),
])
def test_missing_repeated_or_swapped_markers_are_refused_naming_the_section(tmp_path: Path, page: str) -> None:
    with pytest.raises(ValueError, match="'alpha'"):
        benchdocs.replace_section(page, "alpha", "x")
    path = tmp_path / "performance.md"
    path.write_text(page)
    with pytest.raises(ValueError):
        benchdocs.write_section(path, "alpha", "x")
    assert path.read_text() == page
    assert [p.name for p in tmp_path.iterdir()] == ["performance.md"]


def test_write_section_rewrites_the_file_in_place(tmp_path: Path) -> None:
    path = tmp_path / "performance.md"
    path.write_text(PAGE)
    benchdocs.write_section(path, "beta", "new beta")
    assert path.read_text() == PAGE.replace("old beta figures", "new beta")
    assert [p.name for p in tmp_path.iterdir()] == ["performance.md"]


def test_the_command_shown_is_the_bench_run_without_the_option_that_wrote_the_page() -> None:
    script = str(ROOT / "bench" / "dispatch.py")
    assert benchdocs.command_line([script, "--size-mb", "64", "--write-docs", "--repeat", "1"]) == \
        "python bench/dispatch.py --size-mb 64 --repeat 1"
    assert benchdocs.command_line([script, "--write-docs", "/tmp/p.md", "--keep"]) == "python bench/dispatch.py --keep"
    assert benchdocs.command_line([script, "--write-docs=/tmp/p.md"]) == "python bench/dispatch.py"


def test_a_section_says_who_wrote_it_how_when_and_where() -> None:
    body = benchdocs.section_body("\nline 1\nline 2\n\n", command="python bench/x.py --n 1", cores=2,
                                  day=datetime.date(2026, 12, 2), commit="abc1234", tables=["| a |\n|---|"])
    assert body == ("Written by `python bench/x.py --n 1` on 2026-12-02, 2 cores, commit abc1234 (a shared or "
                    "small machine's figures are indicative):\n\n```text\nline 1\nline 2\n```\n\n| a |\n|---|")


def test_recorded_writes_what_the_bench_printed_and_nothing_when_it_fails(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "performance.md"
    path.write_text(PAGE)
    monkeypatch.setattr(sys, "argv", [str(ROOT / "bench" / "codec.py"), "--write-docs", str(path)])
    args = argparse.Namespace(write_docs=str(path))
    with benchdocs.recorded(args, "alpha") as rec:
        print("figure 1.25x")
        rec.tables.append("| t |")
    assert "figure 1.25x" in capsys.readouterr().out  # still printed
    text = path.read_text()
    section = text.split("<!-- bench:alpha -->\n")[1].split("<!-- /bench:alpha -->")[0]
    assert re.fullmatch(r"Written by `python bench/codec.py` on \d{4}-\d\d-\d\d, \d+ cores.*:\n\n"
                        r"```text\nfigure 1.25x\n```\n\n\| t \|\n", section, re.S)
    assert text.replace(section, "") == PAGE.replace("old alpha figures\n", "")
    with pytest.raises(RuntimeError), benchdocs.recorded(args, "beta"):
        print("half")
        raise RuntimeError("bench failed")
    assert path.read_text() == text
    with benchdocs.recorded(argparse.Namespace(write_docs=None), "beta"):
        print("not written")
    assert path.read_text() == text


def test_every_bench_that_writes_a_section_has_it_once_in_the_page() -> None:
    page = (ROOT / "docs" / "performance.md").read_text()
    # every name a call may pass: bench/dispatch.py picks one of two with a conditional expression
    names = {name for script in (ROOT / "bench").glob("*.py")
             for call in re.findall(r"recorded\(args, ([^)]*)\)", script.read_text())
             for name in re.findall(r'"([\w-]+)"', call)}
    assert {"dispatch", "dispatch-5x", "native", "spark_scan", "codec", "clean", "commit_growth", "produce", "image_size"} <= names
    for name in sorted(names):
        begin, end = benchdocs.markers(name)
        assert page.count(begin) == 1 and page.count(end) == 1, name
        benchdocs.replace_section(page, name, "x")
