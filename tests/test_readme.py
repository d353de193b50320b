"""The README opens with the run command and the test command; CI runs the latter."""

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _blocks() -> list[tuple[str, str]]:
    """(language, text) of each fenced block."""
    text = (ROOT / "README.md").read_text()
    parts = text.split("```")
    return [(p.split("\n", 1)[0], p.split("\n", 1)[1].strip()) for p in parts[1::2]]


def test_ci_runs_the_readme_test_command() -> None:
    (_, run_cmd), (_, test_cmd) = _blocks()[:2]
    ci = (ROOT / ".ci" / "run").read_text()
    assert test_cmd in ci.splitlines()
    assert "python3 -m venv .venv" in run_cmd and "tiered" in run_cmd


def test_the_configuration_example_loads(tmp_path: Path) -> None:
    from tiered.config import load_settings

    (example,) = [text for language, text in _blocks() if language == "yaml"]
    path = tmp_path / "tiered.yaml"
    path.write_text(example, encoding="utf-8")
    settings = load_settings(path)
    assert settings.retention.topics["Clicks"] == 7 * 24 and settings.s3.addressing == "path"
