"""tiered/format/segbuffer.py: a segment's bytes in a private anonymous
mapping, at a page whatever its length, its bytes kept across resizes,
never resized under a view."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tiered.format.segbuffer import SegmentBuffer

PAGE = 4096


def _address(buf: SegmentBuffer) -> int:
    return int(np.frombuffer(buf, np.uint8).ctypes.data)


@settings(max_examples=150, deadline=None)
@given(sizes=st.lists(st.integers(1, 3 * PAGE + 7), min_size=1, max_size=8))
def test_resizes_keep_the_bytes_below_both_lengths_at_a_page(sizes: list[int]) -> None:
    """The bytes a resize keeps are a bytearray's; every byte, old or added,
    can be written (a shared anonymous mapping would fault past its first
    size); the first byte stays at a page."""
    buf, model = SegmentBuffer(sizes[0]), bytearray(sizes[0])
    buf[:] = model
    for i, n in enumerate(sizes[1:]):
        kept = min(n, len(model))
        buf.resize(n)
        assert len(buf) == n and buf[:kept] == bytes(model[:kept])
        model = bytearray([i % 251 + 1]) * n
        buf[:] = model  # what the builder copies in
        assert bytes(buf) == bytes(model) and _address(buf) % PAGE == 0


def test_append_writes_behind_the_bytes_held() -> None:
    buf = SegmentBuffer(5000)
    buf[:5000] = b"r" * 5000
    buf.append(b"entries", b"", bytearray(b"index"), memoryview(b"desc"))
    assert len(buf) == 5016 and bytes(buf) == b"r" * 5000 + b"entriesindexdesc"


def test_no_resize_under_a_view_and_no_empty_buffer() -> None:
    buf = SegmentBuffer(10)
    view = memoryview(buf)
    with pytest.raises(BufferError):  # the view would point at unmapped memory
        buf.resize(1 << 20)
    with pytest.raises(BufferError):
        buf.append(b"x")
    view.release()
    buf.append(b"x")
    assert len(buf) == 11
    with pytest.raises(ValueError, match="at least a byte"):
        SegmentBuffer(0)
