"""file:// listing prunes the directories it walks and still lists exactly
the keys with the prefix, whatever the prefix cuts through."""

from __future__ import annotations

from pathlib import Path

import pytest

from tiered.archive.storage import FileStore

KEYS = ["C/B/T/0/manifest.json", "C/B/T/0/commitlog/0-10", "C/B/T/1/commitlog/0-10", "C/B/T/10/commitlog/5-9",
        "C/B/T/100/index/1-2", "C/B/Tx/0/manifest.json", "C/B/_catalog.json", "C/Bee/T/0/manifest.json", "top"]


# (A prefix naming an existing directory without its slash, "C/B/T/1", lists
# that directory only, not "C/B/T/10": so before this pruning too.)
@pytest.mark.parametrize("prefix", ["", "C", "C/", "C/B/", "C/B/T/", "C/B/T/1/", "C/B/T/2", "C/B/T/0/commitlog/",
                                    "C/B/T/0/commit", "C/B/_", "C/B/T/0/manifest.json", "t", "top", "C/B/T/2/",
                                    "nothing/"])
def test_list_is_exactly_the_keys_with_the_prefix(tmp_path: Path, prefix: str) -> None:
    store = FileStore(tmp_path)
    for key in KEYS:
        store.put(key, key.encode())
    assert [o.key for o in store.list_keys(prefix)] == sorted(k for k in KEYS if k.startswith(prefix))
