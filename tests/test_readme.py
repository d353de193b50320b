"""The README opens with the run command and the test command; CI runs the latter."""

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _blocks() -> list[str]:
    text = (ROOT / "README.md").read_text()
    parts = text.split("```")
    return [p.split("\n", 1)[1].strip() for p in parts[1::2]]


def test_ci_runs_the_readme_test_command() -> None:
    run_cmd, test_cmd = _blocks()[:2]
    ci = (ROOT / ".ci" / "run").read_text()
    assert test_cmd in ci.splitlines()
    assert "python3 -m venv .venv" in run_cmd and "tiered" in run_cmd
