"""The README's run command: `tiered demo` end to end, no other service."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path


def test_demo_archives_verifies_expires_and_leaves_data(tmp_path: Path) -> None:
    # no --dir: the demo goes under the state directory, not where it was started
    root, cwd = tmp_path / "state" / "demo", tmp_path / "cwd"
    cwd.mkdir()
    proc = subprocess.run([sys.executable, "-m", "tiered.cli", "demo", "--duration", "6", "--rate", "200"],
                          capture_output=True, text=True, timeout=300, cwd=cwd,
                          env={**os.environ, "TIERED_STATE_DIR": str(tmp_path / "state")})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert list(cwd.iterdir()) == [] and (root / "cold").is_dir()
    assert out.startswith(f"demo files:\n  {root}\nremove them with:\n  rm -rf {root}\n")
    assert f"\nthe demo's store, archive and state stay in:\n  {root}\nremove them with:\n  rm -rf {root}\n" in out
    assert "archive verified" in out and "OK:" in out
    expired_line = next(line for line in out.splitlines() if "segments expired by the cleaner" in line)
    assert int(expired_line.split("by the cleaner", 1)[1].split()[0]) >= 1
    # the store and the archive stay for the other commands
    status = subprocess.run([sys.executable, "-m", "tiered.cli", "status", "--store", str(root / "store"),
                             "--cold", f"file://{root / 'cold'}", "--broker", "demo-broker", "--json"],
                            capture_output=True, text=True, timeout=120,
                            # the demo's own topic selection: its delay topic is archived, so it has a lag row
                            env={**os.environ, "TIERED_TOPICS__INCLUDE": '["*", "SCHEDULE_TOPIC_XXXX"]'})
    assert status.returncode == 0, status.stderr
    rows = [r for r in map(json.loads, status.stdout.splitlines()) if "kind" not in r]  # queue rows
    topics = {r["topic"] for r in rows}
    assert {"Orders", "SCHEDULE_TOPIC_XXXX", "%RETRY%demo-consumers", "%DLQ%demo-consumers"} <= topics
    assert all(r["lag_messages"] == 0 for r in rows)
    # a second run replaces the demo's own directories, and refuses foreign ones
    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "precious.txt").write_text("keep")
    refused = subprocess.run([sys.executable, "-m", "tiered.cli", "demo", "--dir", str(foreign), "--duration", "5"],
                             capture_output=True, text=True, timeout=120)
    assert refused.returncode == 2 and (foreign / "precious.txt").read_text() == "keep"
