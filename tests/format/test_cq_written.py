"""cq_written_entries with a hint: the hint is taken only where the entries
on either side of it say it is the written end; otherwise the search."""

from __future__ import annotations

import pytest

from tiered.format.codec import CQ_ENTRY_SIZE, cq_written_entries, encode_cq_entry


def _cq(written: int, entries: int = 64) -> bytes:
    body = b"".join(encode_cq_entry(100 * i, 50 + i, 7) for i in range(written))
    return body + bytes((entries - written) * CQ_ENTRY_SIZE)


@pytest.mark.parametrize("written", [0, 1, 31, 63, 64])
@pytest.mark.parametrize("hint", [None, 0, 1, 30, 31, 32, 63, 64, 65, -1])
def test_the_written_end_whatever_the_hint(written: int, hint: int | None) -> None:
    assert cq_written_entries(_cq(written), hint) == written


def test_a_stale_hint_after_the_file_grew_or_was_cut() -> None:
    assert cq_written_entries(_cq(40), 20) == 40  # grew since the last look
    assert cq_written_entries(_cq(10), 20) == 10  # cut back (broker recovery)
    assert cq_written_entries(_cq(20)[:10 * CQ_ENTRY_SIZE], 20) == 10  # a shorter file: the hint is past its end
