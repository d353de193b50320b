"""Validate a run of records at once: the fast path of reading a queue.

A queue is read as runs of ConsumeQueue entries whose records lie in one
mapped CommitLog file. ``check_run`` makes every check ``decode_and_check``
makes (sizes, magic, queue id and offset, physical offset, topic, every
length consistent, body CRC) over the whole run at once, reading the
mapped file in place: in the native core's loop (tiered/_native.c, built
at install where a C compiler is there; a record costs its CRC and a few
loads, without the GIL), else with numpy (a record costs a few array
elements and one CRC call from Python), never a struct unpack, a dozen
comparisons and object creation in the interpreter. The run ends before the first record that is not plainly
valid; ``LocalStore`` reads that one through the field-by-field decoder,
which accepts it (an unusual layout) or raises the typed error naming the
file and offset. So the fast path decides nothing the decoder would not.

The CommitLog pass checks the runs of all the queues of a window in one
call that also copies each record into its queue's segment and keeps the
segment's CRC-32 (``check_copy_runs``: compiled, the record checked on its
copy, on several threads; else the same checks with numpy, then the copy).

Record layout as indexed here (big-endian; docs/design.md section 2)::

    0  total size i32 | 4 magic u32 | 8 body crc i32 | 12 queue id i32
    16 flag i32 | 20 queue offset i64 | 28 physical offset i64
    36 sys flag i32 | 40 born timestamp i64 | 48 born host (8, IPv6: 20)
    .. store timestamp i64 | store host (8, IPv6: 20) | reconsume i32
    .. prepared offset i64 | body length i32 | body
    .. topic length (v1: u8, v2: u16) | topic | properties length i16 | properties
"""

from __future__ import annotations

import mmap
from dataclasses import dataclass
from collections.abc import Sequence

import numpy as np

from tiered import native
from tiered.format.codec import CRC_MASK, MAGIC_V1, MAGIC_V2, Record, crc32, decode_record
from tiered.format.segbuffer import SegmentBuffer

# ConsumeQueue entry: CommitLog offset i64 | size i32 | tags code i64
CQ_DTYPE = np.dtype([("phys", ">i8"), ("size", ">i4"), ("tags", ">i8")])
# the fixed part of a record whose hosts are both IPv4 (sys flag bits 0x10
# and 0x20 clear); with an IPv6 host the fields after it move by 12 bytes
_FIXED = np.dtype([
    ("size", ">i4"), ("magic", ">u4"), ("crc", ">i4"), ("queue_id", ">i4"), ("flag", ">i4"),
    ("queue_offset", ">i8"), ("phys", ">i8"), ("sys_flag", ">i4"), ("born", ">i8"), ("born_host", "V8"),
    ("store", ">i8"), ("store_host", "V8"), ("reconsume", ">i4"), ("prepared", ">i8"), ("body_len", ">i4"),
])
_FIXED_SIZE = _FIXED.itemsize  # 88
_BORN_HOST_AT = 48
# after the store host: reconsume times, prepared offset, body length
_AFTER_STORE_HOST = 4 + 8 + 4
_I8 = np.dtype(">i8")
_I4 = np.dtype(">i4")


# the native core (tiered.native), or None: the numpy path; tests set it to
# None to run the Python twin of every function
_native = native.core


@dataclass(frozen=True, slots=True, eq=False, kw_only=True)
class RecordBatch:
    """Consecutive validated records of one queue, as arrays over ``view``,
    the mapped CommitLog file holding them."""

    first_offset: int  # queue offset of the first record
    view: memoryview
    source: str  # the CommitLog file, for error messages
    positions: np.ndarray  # int64: where each record starts in ``view``
    sizes: np.ndarray  # int64
    tags: np.ndarray  # int64: tags codes, from the ConsumeQueue
    store_ms: np.ndarray  # int64
    born_ms: np.ndarray  # int64
    props_at: np.ndarray  # int64: where each record's properties start (they end with it)

    @property
    def count(self) -> int:
        return len(self.positions)

    @property
    def nbytes(self) -> int:
        return int(self.sizes.sum())

    def record(self, i: int) -> Record:
        """Record ``i`` decoded (already validated, so without the CRC)."""
        return decode_record(self.view, int(self.positions[i]), self.source, verify_crc=False)

    @classmethod
    def of_record(cls, queue_offset: int, tags_code: int, rec: Record, view: memoryview) -> RecordBatch:
        """A batch of the one record ``rec``, decoded from ``view``."""
        size = len(rec.raw)
        return cls(first_offset=queue_offset, view=view, source=rec.source,
                   positions=np.array([rec.position], np.int64), sizes=np.array([size], np.int64),
                   tags=np.array([tags_code], np.int64), store_ms=np.array([rec.store_timestamp], np.int64),
                   born_ms=np.array([rec.born_timestamp], np.int64),
                   props_at=np.array([rec.position + size - len(rec.properties_raw)], np.int64))


def gather(view: memoryview | bytes, dtype: np.dtype, positions: np.ndarray) -> np.ndarray:
    """``dtype`` items read at arbitrary byte ``positions`` of ``view``: one
    gather over an overlapping, byte-strided view of the buffer (no copy of
    the buffer; positions must leave room for a whole item)."""
    # gathered as plain bytes, then viewed as ``dtype``: numpy copies a
    # structured item field by field, several times slower
    raw = np.dtype(f"V{dtype.itemsize}")
    items = np.ndarray(shape=(len(view) - dtype.itemsize + 1,), dtype=raw, buffer=view, strides=(1,))
    return items[positions].view(dtype)


def _int64(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a, np.int64)


def copy_spans(dst: SegmentBuffer | bytearray | memoryview, at: int, src: memoryview | bytes, starts: np.ndarray,
               ends: np.ndarray) -> int:
    """Copy ``src[starts[i]:ends[i]]`` one after the other into ``dst`` from
    byte ``at`` (which must have room); returns the bytes copied. Compiled:
    one call per batch, where Python pays a slice and a copy call per
    record (~0.1 CPU s per GB of 1 KiB records)."""
    native = getattr(_native, "copy_spans", None)
    if native is not None:
        return int(native(dst, at, src, _int64(starts), _int64(ends)))
    out = memoryview(dst).cast("B")
    pos = at
    for s, e in zip(starts.tolist(), ends.tolist()):
        out[pos:pos + e - s] = src[s:e]
        pos += e - s
    return pos - at


def join_spans(src: memoryview | bytes | SegmentBuffer, starts: np.ndarray, ends: np.ndarray, sep: bytes) -> bytes:
    """``sep + sep.join(src[starts[i]:ends[i]] ...)``, ``sep`` one byte."""
    native = getattr(_native, "join_spans", None)
    if native is not None:
        return native(src, _int64(starts), _int64(ends), sep[0])
    return sep + sep.join(map(src.__getitem__, map(slice, starts.tolist(), ends.tolist())))


def _first_false(ok: np.ndarray) -> int:
    bad = np.flatnonzero(~ok)
    return int(bad[0]) if len(bad) else len(ok)


def check_run(
    view: memoryview,
    base: int,
    entries: np.ndarray,
    *,
    topic: bytes,
    queue_id: int,
    first_offset: int,
    source: str,
    verify_crc: bool = True,
    check_phys: bool = True,
) -> RecordBatch | None:
    """The longest prefix of ``entries`` (CQ_DTYPE) whose records are plainly
    valid, as a batch; None when the first one is not.

    ``view`` maps the CommitLog file starting at byte ``base``; the caller
    guarantees every entry's record lies inside it (``0 <= phys - base`` and
    ``phys - base + size <= len(view)``) and that the entries are complete.

    ``check_phys=False`` skips the check of each record's physical offset
    against its entry's, for the archive's re-packed CommitLog, where a
    record keeps the broker's offset and the entries point into the segment.

    Compiled (tiered/_native.c) where the install built it, else with numpy
    (``check_run_numpy``): the same checks, the same answer.
    """
    native = _native
    if native is None:
        return check_run_numpy(view, base, entries, topic=topic, queue_id=queue_id, first_offset=first_offset,
                               source=source, verify_crc=verify_crc, check_phys=check_phys)
    n = len(entries)
    tlen = len(topic)
    if n == 0 or len(view) < _FIXED_SIZE or tlen > 0xFFFF:
        return None
    v2 = tlen > 127  # the broker writes the 2-byte topic length exactly then
    out = np.empty((6, n), np.int64)
    # as CQ_DTYPE: the loop reads big-endian, a numpy join hands back the native order
    k = native.check_run(view, base, np.ascontiguousarray(entries, CQ_DTYPE),
                         tlen.to_bytes(2 if v2 else 1, "big") + topic, MAGIC_V2 if v2 else MAGIC_V1, queue_id,
                         first_offset, verify_crc, check_phys, out)
    if k == 0:
        return None
    return RecordBatch(first_offset=first_offset, view=view, source=source, positions=out[0, :k], sizes=out[1, :k],
                       tags=out[2, :k], store_ms=out[3, :k], born_ms=out[4, :k], props_at=out[5, :k])


def _tail(topic: bytes) -> tuple[bytes, int] | None:
    """[topic length][topic] as a record of ``topic`` holds them, and its
    magic; None for a topic no record can hold."""
    tlen = len(topic)
    if tlen > 0xFFFF:
        return None
    v2 = tlen > 127  # the broker writes the 2-byte topic length exactly then
    return tlen.to_bytes(2 if v2 else 1, "big") + topic, MAGIC_V2 if v2 else MAGIC_V1


# columns of a ``check_copy_runs`` row: first entry, entry count, queue id, first
# queue offset, magic, tail at, tail length (in the blob), the answer (records
# kept); then where the run's records go in its destination, the CRC-32 of the
# destination's bytes before them (replaced by the CRC-32 up to the end of the
# records kept) and the bytes kept
COPY_FIELDS = 11


def run_tails(topics: list[bytes]) -> tuple[np.ndarray, bytes]:
    """For each of ``topics``: (magic, at, length) of its [topic length][topic]
    in the returned blob, each distinct topic once; magic 0 for a topic no
    record can hold. Columns 4:7 of a ``check_copy_runs`` row."""
    rows = np.zeros((len(topics), 3), np.int64)
    seen: dict[bytes, tuple[int, int, int]] = {}
    blob = bytearray()
    for r, topic in enumerate(topics):
        t = seen.get(topic)
        if t is None:
            made = _tail(topic)
            tail, magic = made if made is not None else (b"", 0)
            t = seen[topic] = (magic, len(blob), len(tail))
            blob += tail
        rows[r] = t
    return rows, bytes(blob)


def copies_in_stretches() -> bool:
    """Whether ``check_copy_runs`` gives a mapped view's pages back behind its
    copy (``release_bytes``): the compiled call does; the numpy path copies
    the window whole."""
    return getattr(_native, "check_copy_runs", None) is not None


def check_copy_runs(
    view: memoryview,
    base: int,
    entries: np.ndarray,
    table: np.ndarray,
    blob: bytes,
    dsts: Sequence[SegmentBuffer | bytearray],
    *,
    source: str,
    verify_crc: bool = True,
    out: np.ndarray | None = None,
    threads: int = 1,
    piece_bytes: int = 0,
    release_bytes: int = 0,
) -> tuple[np.ndarray, float]:
    """Many runs of ``check_run`` over one ``view`` at once, each run's
    records kept copied into ``dsts[r]`` from byte ``table[r, 8]`` one
    after the other and the CRC-32 in ``table[r, 9]`` continued over them:
    the CommitLog pass's one call a window, for a caller that builds the
    table (COPY_FIELDS columns, the topics' tails from ``run_tails``) with
    array operations (a Python tuple and a RecordBatch a queue a window
    cost more than the queue's records at 1,000 queues). Writes each run's
    answer (its leading valid records) into column 7, the CRC into 9, the
    bytes kept into 10. Returns the 6 x len(entries) int64 arrays
    (positions, sizes, tags, store ms, born ms, properties at), each run's
    at its entries' rows (into ``out`` when given; rows past a run's answer
    undefined, rows of no run untouched; the runs may take any rows of
    ``entries``, in any order), and the CPU seconds of the threads it
    started (the caller's own clock does not count them). The
    bytes copied past the last record kept are undefined too: only the
    bytes counted are the run's. A destination must have room for every
    entry of its run that names a record inside ``view`` (ValueError, before
    anything is copied).

    Compiled: each record copied, then checked on the copy (hot in the
    cache: the bytes checked and CRC'd are the bytes kept, the mapped
    CommitLog read once), the window cut by bytes over up to ``threads``
    threads without the GIL (a run cut into pieces, their CRCs combined;
    ``piece_bytes``: their size, 0 for a share of the window fit for
    ``threads``, which then start only for a window of a few MiB).
    ``release_bytes`` > 0: ``view`` is a read-only shared mapping of a
    file (never anonymous memory, whose pages would be lost), copied in
    stretches of that many of its bytes, in order, each stretch's whole
    pages given back behind it (``MADV_DONTNEED``): a wide window holds a
    stretch at a time in the resident set, not the window.
    Without the compiled module each run is checked by ``check_run_numpy``,
    then its records copied and their CRC computed over the copy: the same
    answers (nothing given back)."""
    out = _copy_runs_out(view, entries, table, dsts, out, release_bytes)
    table[:, 7] = 0
    table[:, 10] = 0
    native = getattr(_native, "check_copy_runs", None)
    if native is not None:
        # CQ_DTYPE as the loop reads it (big-endian), as for check_runs
        helpers_ns = native(view, base, np.ascontiguousarray(entries, CQ_DTYPE), table, blob, verify_crc, out, dsts,
                            threads, piece_bytes, release_bytes)
        return out, helpers_ns / 1e9
    _copy_runs_numpy(view, base, entries, table, blob, dsts, out, source=source, verify_crc=verify_crc)
    return out, 0.0


def _copy_runs_out(view: memoryview, entries: np.ndarray, table: np.ndarray, dsts: Sequence[SegmentBuffer | bytearray],
                   out: np.ndarray | None, release_bytes: int) -> np.ndarray:
    """``check_copy_runs``'s arguments checked as the compiled call checks
    them (ValueError), and the array its answers go to."""
    if out is None:
        out = np.empty((6, len(entries)), np.int64)
    elif out.shape != (6, len(entries)) or out.dtype != np.int64 or not out.flags.c_contiguous:
        raise ValueError(f"out must be a contiguous 6 x {len(entries)} int64 array")
    if table.ndim != 2 or table.shape[1] != COPY_FIELDS or table.dtype != np.int64 or not table.flags.c_contiguous:
        raise ValueError(f"the table must be a contiguous n x {COPY_FIELDS} int64 array")
    if len(dsts) != len(table):
        raise ValueError("entries, runs, out or dsts of the wrong size")
    if release_bytes > 0 and not (isinstance(view.obj, mmap.mmap) and view.readonly):
        # giving back the pages of anything else (memory of this process, a
        # private copy) would lose bytes, not only unmap them
        raise ValueError("release_bytes needs a view of a read-only mapped file")
    return out


def _copy_runs_numpy(view: memoryview, base: int, entries: np.ndarray, table: np.ndarray, blob: bytes,
                     dsts: Sequence[SegmentBuffer | bytearray], out: np.ndarray, *, source: str, verify_crc: bool) -> None:
    """``check_copy_runs`` without the compiled module: each run checked by
    ``check_run_numpy``, then its records copied and their CRC computed over
    the copy."""
    planned = _planned(view, base, entries, table, blob, dsts)
    for r, (row, _count, queue_id, first, magic, at, length) in enumerate(table[:, :7].tolist()):
        if not planned[r]:
            continue
        topic = blob[at + (2 if magic == MAGIC_V2 else 1):at + length]
        # (the entries naming records inside the view only: check_run's caller guarantees them)
        batch = check_run_numpy(view, base, entries[row:row + planned[r]], topic=topic, queue_id=queue_id,
                                first_offset=first, source=source, verify_crc=verify_crc)
        if batch is None:
            continue
        k = table[r, 7] = batch.count
        for i, column in enumerate((batch.positions, batch.sizes, batch.tags, batch.store_ms, batch.born_ms,
                                    batch.props_at)):
            out[i, row:row + k] = column
        dst_at = int(table[r, 8])
        kept = copy_spans(dsts[r], dst_at, view, batch.positions, batch.positions + batch.sizes)
        with memoryview(dsts[r]) as dst:
            table[r, 9] = crc32(dst[dst_at:dst_at + kept], int(table[r, 9]))
        table[r, 10] = kept


def _planned(view: memoryview, base: int, entries: np.ndarray, table: np.ndarray, blob: bytes,
             dsts: Sequence[SegmentBuffer | bytearray]) -> list[int]:
    """How many of each run's leading entries name a record inside ``view``
    (no record past them can be kept), every run and destination checked as
    the compiled ``check_copy_runs`` checks them: the destination holds
    those records' bytes."""
    planned = []
    for r, (row, count, queue_id, _first, magic, at, length, _k, dst_at, crc, _kept) in enumerate(table.tolist()):
        if (row < 0 or count < 0 or row > len(entries) - count or at < 0 or length < 0 or at > len(blob) - length
                or not 0 <= magic <= 0xFFFFFFFF or not -(1 << 31) <= queue_id < 1 << 31
                or not 0 <= crc <= 0xFFFFFFFF):
            raise ValueError(f"run {r} outside the entries or tails given")
        m = need = 0
        if count and len(view) >= _FIXED_SIZE:
            part = entries[row:row + count]
            size = part["size"].astype(np.int64)
            pos = part["phys"].astype(np.int64) - base
            m = _first_false((size >= _FIXED_SIZE + length + 2) & (pos >= 0) & (pos <= len(view) - size))
            need = int(size[:m].sum())
        if dst_at < 0 or dst_at > len(dsts[r]) or need > len(dsts[r]) - dst_at:
            raise ValueError(f"run {r}: its records do not fit its destination")
        planned.append(m)
    return planned


def check_run_numpy(
    view: memoryview,
    base: int,
    entries: np.ndarray,
    *,
    topic: bytes,
    queue_id: int,
    first_offset: int,
    source: str,
    verify_crc: bool = True,
    check_phys: bool = True,
) -> RecordBatch | None:
    """``check_run`` with numpy gathers and one CRC call per record from
    Python: where the compiled loop was not built."""
    n = len(entries)
    tlen = len(topic)
    v2 = tlen > 127  # the broker writes the 2-byte topic length exactly then
    tail_len = (2 if v2 else 1) + tlen + 2  # [topic length][topic][properties length]
    if n == 0 or len(view) < _FIXED_SIZE:
        return None
    phys = entries["phys"].astype(np.int64)
    size = entries["size"].astype(np.int64)
    pos = phys - base
    # the smallest record of this topic: the fixed part is inside every one
    n = _first_false(size >= _FIXED_SIZE + tail_len)
    if n == 0:
        return None
    pos, size, phys = pos[:n], size[:n], phys[:n]
    rec_end = pos + size
    # every field in one gather: one trip to memory per record, not one per field
    head = gather(view, _FIXED, pos)
    sys_flag = head["sys_flag"].astype(np.int64)
    store = head["store"].astype(np.int64)
    body_len = head["body_len"].astype(np.int64)
    body_at = pos + _FIXED_SIZE
    ok = ((head["size"] == size) & (head["magic"] == (MAGIC_V2 if v2 else MAGIC_V1))
          & (head["queue_id"] == queue_id) & ((head["phys"] == phys) | (not check_phys))
          & (head["queue_offset"] == np.arange(first_offset, first_offset + n, dtype=np.int64)))
    v6 = np.flatnonzero(sys_flag & 0x30)
    if len(v6):  # IPv6 hosts: the fields behind them, where they are
        store_at = pos[v6] + _BORN_HOST_AT + np.where(sys_flag[v6] & 0x10, 20, 8)
        body_at[v6] = store_at + 8 + np.where(sys_flag[v6] & 0x20, 20, 8) + _AFTER_STORE_HOST
        inside = body_at[v6] + tail_len <= rec_end[v6]
        ok[v6] &= inside
        safe = np.where(inside, store_at, pos[v6])
        store[v6] = gather(view, _I8, safe).astype(np.int64)
        body_len[v6] = gather(view, _I4, np.where(inside, body_at[v6] - 4, pos[v6])).astype(np.int64)
    body_end = body_at + body_len
    ok &= (body_len >= 0) & (body_end + tail_len <= rec_end)
    n = _first_false(ok)
    if n and verify_crc:
        # before the tail gather: reading the bodies brings the tails behind them into the cache
        crcs = np.fromiter(map(crc32, map(view.__getitem__, map(slice, body_at[:n].tolist(), body_end[:n].tolist()))),
                           dtype=np.int64, count=n)
        n = _first_false((crcs & CRC_MASK) == head["crc"][:n])
    if n == 0:
        return None
    tail = gather(view, np.dtype([("topic", f"V{tail_len - 2}"), ("props_len", ">u2")]), body_end[:n])
    props_len = tail["props_len"].astype(np.int64)
    props_at = body_end[:n] + tail_len
    n = _first_false((tail["topic"] == np.void(tlen.to_bytes(tail_len - tlen - 2, "big") + topic))
                     & (props_len < 0x8000) & (props_at + props_len == rec_end[:n]))
    if n == 0:
        return None
    return RecordBatch(first_offset=first_offset, view=view, source=source, positions=pos[:n], sizes=size[:n],
                       tags=entries["tags"][:n].astype(np.int64), store_ms=store[:n],
                       born_ms=head["born"][:n].astype(np.int64), props_at=props_at[:n])
