"""copy_spans and join_spans (tiered/format/batch.py): compiled where the
install built tiered/_native.c, else in Python; both give the same bytes, and
spans outside the source or a destination without room are refused."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tiered.format import batch

from nativekit import need_native

SRC = bytes(range(256)) * 3


@pytest.fixture(params=["compiled", "python"])
def impl(request, monkeypatch):  # noqa: ANN001, ANN201
    if request.param == "python":
        monkeypatch.setattr(batch, "_native", None)
    else:
        assert getattr(need_native(), "copy_spans", None) is not None
    return request.param


_SPANS = st.lists(st.tuples(st.integers(0, len(SRC)), st.integers(0, 40)), max_size=30).map(
    lambda v: [(s, min(len(SRC), s + n)) for s, n in v])


def _arrays(spans: list[tuple[int, int]]) -> tuple[np.ndarray, np.ndarray]:
    return np.array([s for s, _ in spans], np.int64), np.array([e for _, e in spans], np.int64)


@settings(max_examples=200, deadline=None)
@given(spans=_SPANS, at=st.integers(0, 5))
def test_copy_and_join_give_the_spans_bytes(spans: list[tuple[int, int]], at: int) -> None:
    starts, ends = _arrays(spans)
    want = b"".join(SRC[s:e] for s, e in spans)
    for native in (batch._native, None):
        saved, batch._native = batch._native, native
        try:
            dst = bytearray(b"\xee" * (at + len(want) + 3))
            assert batch.copy_spans(dst, at, memoryview(SRC), starts, ends) == len(want)
            assert dst == b"\xee" * at + want + b"\xee" * 3  # nothing written outside
            joined = batch.join_spans(memoryview(SRC), starts, ends, b"\x02")
            assert joined == b"\x02" + b"\x02".join(SRC[s:e] for s, e in spans)
        finally:
            batch._native = saved


def test_compiled_copy_refuses_spans_outside_the_source_or_the_destination(impl: str) -> None:
    if impl == "python":
        pytest.skip("the Python path slices; bounds are the compiled code's to check")
    dst = bytearray(10)
    with pytest.raises(ValueError, match="outside a buffer of 768 bytes"):
        batch.copy_spans(dst, 0, SRC, np.array([760], np.int64), np.array([769], np.int64))
    with pytest.raises(ValueError, match=r"span 0 \[5, 4\)"):
        batch.join_spans(SRC, np.array([5], np.int64), np.array([4], np.int64), b"\x02")
    with pytest.raises(ValueError, match="do not fit the destination"):
        batch.copy_spans(dst, 5, SRC, np.array([0], np.int64), np.array([6], np.int64))
    assert dst == bytearray(10)  # refused before anything was copied
    with pytest.raises(BufferError):
        batch.copy_spans(b"read-only", 0, SRC, np.array([0], np.int64), np.array([1], np.int64))


def test_strided_offsets_are_made_contiguous(impl: str) -> None:
    # CommitLog offsets come as slices of wider arrays: not contiguous
    wide = np.array([[0, 99], [10, 99], [20, 99]], np.int64)
    dst = bytearray(9)
    assert batch.copy_spans(dst, 0, SRC, wide[:, 0], wide[:, 0] + 3) == 9
    assert bytes(dst) == SRC[0:3] + SRC[10:13] + SRC[20:23]


def test_spans_are_copied_into_a_segment_buffer(impl: str) -> None:
    from tiered.format.segbuffer import SegmentBuffer

    dst = SegmentBuffer(12)
    assert batch.copy_spans(dst, 3, SRC, np.array([0, 10, 20], np.int64), np.array([3, 13, 23], np.int64)) == 9
    assert dst[3:] == SRC[0:3] + SRC[10:13] + SRC[20:23]
