"""The one table renderer (tiered/cli/output.py), its human units, and
``tiered status``'s rows: ages from an injected time, compression only where
objects are compressed, and whatever problem text a row carries."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from dispatchkit import archive_all, new_dispatcher, new_writer
from tiered.archive.coldtier import ColdTier
from tiered.archive.storage import open_store
from tiered.cli.output import Col, human_bytes, human_duration, render_table
from tiered.cli.status import COLUMNS, problem_text, status_rows
from tiered.clock import ManualClock
from tiered.ops.status import QueueStatus, queue_status
from tiered.store.localstore import LocalStore

T0 = 1_700_000_000_000
SEC, MIN, HOUR, DAY = 1000, 60_000, 3_600_000, 86_400_000


@pytest.mark.parametrize(("n", "text"), [
    (None, "-"), (0, "0 B"), (1023, "1023 B"), (1024, "1.0 KiB"), (1_258_291, "1.2 MiB"), (1048575, "1.0 MiB"),
    (5 * 1024**3 // 2, "2.5 GiB"), (3 * 1024**4, "3.0 TiB"), (-2048, "-2.0 KiB")])
def test_human_bytes(n: int | None, text: str) -> None:
    assert human_bytes(n) == text


@pytest.mark.parametrize(("ms", "text"), [
    (None, "-"), (0, "0ms"), (850, "850ms"), (1000, "1s"), (59_999, "59s"), (3 * MIN + 12 * SEC, "3m12s"),
    (HOUR - 1, "59m59s"), (5 * HOUR + 2 * MIN + 59 * SEC, "5h02m"), (DAY - 1, "23h59m"),
    (3 * DAY + 4 * HOUR + 5 * MIN, "3d04h"), (99 * DAY + 23 * HOUR, "99d23h"), (412 * DAY + HOUR, "412d"),
    (-3 * SEC, "-3s")])
def test_human_duration(ms: int | None, text: str) -> None:
    assert human_duration(ms) == text


LONG = "%RETRY%payments-settlement-reconciliation-consumer-group"
COLS = [Col(name="topic"), Col(name="queue", right=True), Col(name="lag"), Col(name="archived up to"),
        Col(name="bytes", right=True, wide=True), Col(name="problem", wrap=True)]
ROWS = [("Orders", 0, "0", "2000 (5h02m ago)", "1.2 MiB", None),
        ("%DLQ%demo-consumers", 11, "12 (3m12s)", "45 (2s ago)", "20.0 KiB",
         "corrupt local data: /data/store/consumequeue/Orders/0/00000000000000000000 @ 120: size -1"),
        (LONG, 3, "0", "7 (1s ago)", "0 B", None)]


def test_table_off_a_terminal_is_one_line_per_row() -> None:
    lines = render_table(COLS, ROWS, width=None)
    assert len(lines) == 4 and lines[0].split() == ["TOPIC", "QUEUE", "LAG", "ARCHIVED", "UP", "TO", "PROBLEM"]
    assert lines[2].split(None, 4) == ["%DLQ%demo-consumers", "11", "12", "(3m12s)", "45 (2s ago)" + " " * 7 +
                                       ROWS[1][5]]
    # columns line up: every cell of a column starts where its header does (left) or ends there (right)
    at = lines[0].index("ARCHIVED")
    assert [ln[at:at + 4] for ln in lines[1:]] == ["2000", "45 (", "7 (1"]
    end = lines[0].index("QUEUE") + len("QUEUE")
    assert [ln[:end].split()[-1] for ln in lines[1:]] == ["0", "11", "3"]


@pytest.mark.parametrize("width", [80, 60, 45])
def test_table_fits_the_width_and_never_cuts_a_name(width: int) -> None:
    lines = render_table(COLS, ROWS, width=width)
    # only a name wider than the whole terminal is (alone on its line, whole)
    assert all(len(ln) <= width or ln == LONG for ln in lines), "\n".join(lines)
    assert all(any(ln.split()[:1] == [t] for ln in lines) for t, *_ in ROWS)  # each name whole, first on a line
    words = " ".join(ln[lines[0].index("PROBLEM"):] for ln in lines[1:] if len(ln) > lines[0].index("PROBLEM"))
    # the problem wraps within its column, in order (a word longer than the column is folded)
    assert "".join(ROWS[1][5].split()) in "".join(words.split())
    assert "BYTES" not in lines[0]


def test_a_name_longer_than_its_column_gets_a_line_of_its_own() -> None:
    lines = render_table(COLS, ROWS, width=80, wide=True)
    assert lines[0].split() == ["TOPIC", "QUEUE", "LAG", "ARCHIVED", "UP", "TO", "BYTES", "PROBLEM"]
    i = lines.index(LONG)
    assert lines[i + 1].split() == ["3", "0", "7", "(1s", "ago)", "0", "B", "-"]
    assert lines[1].startswith("Orders ") and lines[1].split()[1:3] == ["0", "0"]
    assert all(len(ln) <= 80 for ln in lines)


def test_a_too_narrow_terminal_wraps_columns_between_words() -> None:
    lines = render_table(COLS[:4], ROWS[:1], width=30)
    assert lines == ["TOPIC   QUEUE  LAG  ARCHIVED", "                    UP TO",
                     "Orders      0  0    2000", "                    (5h02m", "                    ago)"]


@dataclasses.dataclass(frozen=True)
class _Excluded(QueueStatus):
    reason: str | None = None  # as another part of the program may add


def test_problem_column_shows_any_text_a_row_carries() -> None:
    base = QueueStatus(topic="Orders", queue_id=0, local_min_offset=0, local_max_offset=10, archived_first_offset=0,
                       archived_next_offset=10, lag_messages=0, oldest_archived_ms=T0, newest_archived_ms=T0,
                       segments=1, nbytes=100, gaps=0)
    assert problem_text(base) is None
    assert problem_text(dataclasses.replace(base, problem="manifest unreadable: x")) == "manifest unreadable: x"
    row = _Excluded(**{**dataclasses.asdict(base), "problem": "stopped", "reason": "excluded: a system topic"})
    assert problem_text(row) == "stopped; excluded: a system topic"
    assert problem_text(_Excluded(**{**dataclasses.asdict(base), "reason": "excluded"})) == "excluded"
    # a compressed queue's codec is not a problem
    assert problem_text(dataclasses.replace(base, compression="zstd", compressed_ratio=2.5)) is None


def _status(tmp_path: Path, compression: str) -> tuple[list[QueueStatus], ManualClock]:
    clock = ManualClock(T0)
    root = tmp_path / "store"
    with new_writer(root) as w:
        for i in range(30):
            w.put("Orders", i % 2, b"order %d " % i * 40, store_timestamp=clock.now_ms(), born_timestamp=0)
            clock.advance(1)
    store = open_store(f"file://{tmp_path / 'cold'}")
    with LocalStore(root) as local:
        d = new_dispatcher(store, local, tmp_path / "state", clock, upload_bytes=1, max_delay_ms=0,
                           segment_bytes=4096, layout=2, compression=compression)
        archive_all(d, local, [("Orders", 0), ("Orders", 1)])
    with new_writer(root) as w:  # five more, not archived: the lag
        for i in range(5):
            w.put("Orders", 0, b"late", store_timestamp=clock.now_ms(), born_timestamp=0)
            clock.advance(60)
    cold = ColdTier(store, "TestCluster", "broker-a", state_dir=tmp_path / "state-r", writer="reader")
    with LocalStore(root) as local:
        return queue_status(cold, local), clock


def test_status_rows_ages_units_and_wide_columns(tmp_path: Path) -> None:
    rows, clock = _status(tmp_path, "none")
    q0, q1 = rows
    assert (q0.lag_messages, q0.pending_since_ms, q0.compression, q0.compressed_ratio) == (5, T0 + 30 * SEC, None, None)
    assert q0.compression_ratio is not None and q0.compression_ratio < 1  # the layout's overhead, not compression
    now = ManualClock(T0 + 30 * SEC + 3 * MIN + 12 * SEC)  # 3m12s after the first late record was stored
    cells = status_rows(rows, now.now_ms())
    # archived up to: the next offset, and how long ago its newest record was stored
    assert cells[0] == ("Orders", 0, "5 (3m12s)", "15 (3m14s ago)", "0..20", q0.segments, human_bytes(q0.nbytes), 0,
                        None, None)
    assert cells[1][:4] == ("Orders", 1, "0", "15 (3m13s ago)")
    assert q1.segments > 1 and cells[1][5:8] == (q1.segments, human_bytes(q1.nbytes), 0)
    lines = render_table(COLUMNS, cells, width=None, wide=True)
    assert lines[0].split() == ["TOPIC", "QUEUE", "LAG", "ARCHIVED", "UP", "TO", "LOCAL", "SEGMENTS", "BYTES",
                                "GAPS", "COMPRESSION", "PROBLEM"]
    assert lines[1].split()[-2:] == ["-", "-"]


def test_status_shows_compression_of_compressed_objects_only(tmp_path: Path) -> None:
    rows, clock = _status(tmp_path, "zstd")
    q0 = rows[0]
    assert q0.compression == "zstd" and q0.compressed_ratio is not None and q0.compressed_ratio > 2
    assert q0.segments > 1
    cell = status_rows(rows, clock.now_ms())[0][8]
    assert cell == f"zstd {q0.compressed_ratio:.2f}x"


def test_a_second_name_column_hangs_too_and_numbers_stay_whole() -> None:
    cols = [Col(name="group"), Col(name="topic", keep=True), Col(name="queue", right=True),
            Col(name="bytes", right=True), Col(name="state", wrap=True)]
    rows = [("settlement-reconciliation-consumer-group", "%RETRY%settlement-reconciliation-consumer-group", 0,
             "15.3 KiB", "local"), ("g1", "Orders", 1, "1.0 MiB", "archive_only (3 behind local)")]
    assert render_table(cols, rows, width=60) == [
        "GROUP  TOPIC   QUEUE     BYTES  STATE",
        "settlement-reconciliation-consumer-group",
        "       %RETRY%settlement-reconciliation-consumer-group",
        "                   0  15.3 KiB  local",
        "g1     Orders      1   1.0 MiB  archive_only (3 behind",
        "                                local)"]


def test_wrapping_headers_wins_over_hanging_every_name() -> None:
    # the demo's progress table at 80 columns: wrapping a header takes one line, hanging the names three
    cols = [Col(name="topic"), *(Col(name=n, right=True) for n in ("queues", "local messages", "archived up to",
                                                                    "lag", "segments", "bytes"))]
    rows = [(t, 1, 25, 25, 0, 2, "7.8 KiB") for t in ("%DLQ%demo-consumers", "%RETRY%demo-consumers",
                                                      "SCHEDULE_TOPIC_XXXX")]
    lines = render_table(cols, rows, width=80)
    assert lines[:3] == ["TOPIC                  QUEUES  LOCAL MESSAGES   ARCHIVED  LAG  SEGMENTS    BYTES",
                         "                                                   UP TO",
                         "%DLQ%demo-consumers         1              25         25    0         2  7.8 KiB"]
    assert len(lines) == 5
