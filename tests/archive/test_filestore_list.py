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


def test_directories_are_made_only_when_a_write_finds_them_missing(tmp_path: Path, monkeypatch) -> None:  # noqa: ANN001
    import shutil

    store = FileStore(tmp_path)
    made: list[Path] = []
    real = Path.mkdir

    def mkdir(self: Path, *args, **kw) -> None:  # noqa: ANN002, ANN003
        made.append(self)
        real(self, *args, **kw)

    monkeypatch.setattr(Path, "mkdir", mkdir)
    levels = [tmp_path / p for p in ("C", "C/B", "C/B/T", "C/B/T/0", "C/B/T/0/seg")]
    store.put("C/B/T/0/seg/1", b"one")
    assert made == levels  # each once, parents first
    made.clear()
    store.put("C/B/T/0/seg/2", b"two")  # the directory exists: no mkdir at all
    store.put_if_absent("C/B/T/0/seg/3", b"three")
    assert made == []
    shutil.rmtree(tmp_path / "C")  # removed behind the store's back: made again
    store.put("C/B/T/0/seg/4", b"four")
    assert made[-5:] == levels  # the remembered parents were gone: every level made again
    assert [o.key for o in store.list_keys("C/")] == ["C/B/T/0/seg/4"]
    assert store.get("C/B/T/0/seg/4") == b"four"
