"""Archived records to Arrow, column by column, with no per-record Python.

A cold segment is a run of records laid end to end (the cold CommitLog) and
one 20-byte entry per record pointing into it (the cold ConsumeQueue), so a
run of records is one Arrow ``large_binary`` array built over the fetched
bytes without a copy: the entries give its offsets. Every fixed field is then
a ``binary_slice`` at a constant position, byte-reversed (big-endian on the
wire) and reinterpreted as an integer array. Record layout: ``tiered.format.codec``.

Positions after the hosts move with the IPv6 sys-flag bits, and the topic
length field with the magic version, so records are grouped by (magic,
born IPv6, store IPv6): inside a group every position before the body is a
constant. Groups other than the usual one (v1, IPv4, IPv4) are rare; they
are decoded separately and put back in queue order.

The body and what follows it (topic, properties) start at per-record
positions: one more ``large_binary`` array over the same bytes, whose offsets
interleave [body start, body end, next record start], yields bodies and tails
by taking every third element (one copy, in C++).

Every record is checked against its entry and the queue (size, magic, queue
id, queue offset, lengths within the record, topic, body CRC). An LMQ queue
holds its parent topics' records (``tiered.format.lmq``): each is checked
against the LMQ rule in Python, decoded as its parent queue's, and given the
LMQ queue's topic, queue id and offsets. A bad record
raises ``CorruptRecordError`` naming the object and the record's byte offset
in it; with ``skip_corrupt`` it is dropped and counted instead.
"""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc
from zlib_ng.zlib_ng import crc32

from tiered.format.codec import (
    CQ_ENTRY_SIZE,
    CQ_FILLER_SIZE,
    CRC_MASK,
    MAGIC_V1,
    MAGIC_V2,
    MIN_RECORD_SIZE,
    _host_of,
    decode_record,
    entry_problem,
)
from tiered.format.lmq import is_lmq
from tiered.format.compression import COMPRESSED_FLAG, BodyDecompressError, decompress
from tiered.errors import BadRecordsError, CorruptRecordError, TieredError
from tiered.query.spark_schema import ARROW_TYPES, COLUMN_NAMES, TIMESTAMP, arrow_schema

_FIXED_V4 = 88  # where the body length ends (and the body starts) with two IPv4 hosts
_V6_EXTRA = 12

# Properties whose first set value is the business topic (see spark_schema).
REAL_TOPIC_PROPS = ("RETRY_TOPIC", "DLQ_ORIGIN_TOPIC", "REAL_TOPIC")


@dataclass(frozen=True)
class Where:
    """Where a run of records lives, for checks and error messages."""

    cl_key: str  # cold CommitLog object
    cl_object_start: int  # cold CommitLog offset of the object's first byte
    cq_key: str  # cold ConsumeQueue object
    cq_object_start: int  # queue offset of the object's first entry


@dataclass(frozen=True)
class QueueInfo:
    cluster: str
    broker: str
    topic: str
    queue_id: int


def _offsets(arr: pa.Array) -> pa.Array:
    """The offsets of a (large) binary or string array, as an integer array of len + 1."""
    typ = pa.int64() if pa.types.is_large_binary(arr.type) or pa.types.is_large_string(arr.type) else pa.int32()
    return pa.Array.from_buffers(typ, len(arr) + 1, [None, arr.buffers()[1]], offset=arr.offset)


def _be_int(arr: pa.Array, start: int, width: int, typ: pa.DataType) -> pa.Array:
    """Big-endian integers of ``width`` bytes at ``start`` of every element
    (every element must be long enough: callers check lengths first)."""
    n = len(arr)
    if n == 0:
        return pa.array([], typ)
    part = pc.binary_slice(arr, start, start + width)
    if pa.types.is_fixed_size_binary(part.type):
        part = part.cast(pa.binary())
    rev = pc.binary_reverse(part)
    if rev.offset != 0 or _offsets(rev)[n].as_py() != n * width:
        raise ValueError("field beyond the end of an element")  # a caller bug, never input
    return pa.Array.from_buffers(typ, n, [None, rev.buffers()[2]])


def _as_binary8(arr: pa.Array) -> pa.Array:
    arr = arr.cast(pa.int64())
    if arr.offset:
        arr = pa.concat_arrays([arr])
    return pa.Array.from_buffers(pa.binary(8), len(arr), [None, arr.buffers()[1]]).cast(pa.binary())


def _any_of(checks: list[tuple[pa.Array, str]]) -> pa.Array:
    """The rows any check's mask flags."""
    bad = checks[0][0]
    for mask, _ in checks[1:]:
        bad = pc.or_(bad, mask)
    return bad


def _interleave(*cols: pa.Array) -> pa.Buffer:
    """One int64 buffer holding cols[0][0], cols[1][0], ..., cols[0][1], ..."""
    joined = pc.binary_join_element_wise(*[_as_binary8(c) for c in cols], b"")
    return joined.buffers()[2]


def _int64_buffer(values: pa.Array) -> pa.Buffer:
    values = values.cast(pa.int64())
    if values.offset:
        values = pa.concat_arrays([values])
    return values.buffers()[1]


def arange(start: int, n: int, step: int = 1) -> pa.Array:
    """``start``, ``start + step``, ... (``n`` of them) as an int64 array,
    built in Arrow (a cumulative sum) rather than from a Python range."""
    if n == 0:
        return pa.array([], pa.int64())
    ones = pa.repeat(pa.scalar(step, pa.int64()), n)
    return pc.add(pc.cumulative_sum(ones), start - step)


def _drop_empty(lists: pa.ListArray, typ: pa.DataType | None = None) -> pa.ListArray:
    """The same lists without their empty-string elements."""
    flat = lists.flatten()
    keep = pc.not_equal(flat, "")
    kept = pc.filter(flat, keep)
    before = pa.concat_arrays([pa.array([0], pa.int64()), pc.cumulative_sum(keep.cast(pa.int64()))])
    offsets = pc.take(before, pc.subtract(lists.offsets, lists.offsets[0]))
    return pa.ListArray.from_arrays(offsets.cast(pa.int32()), kept, type=typ)


# Internal decode steps return (batch, queue offsets of its rows): rows may be skipped.
Decoded = tuple[pa.RecordBatch, pa.Array]


class _Props:
    """Parsed properties: the map column, and its flattened keys and values
    for fast lookups (``map_lookup`` is several times slower)."""

    def __init__(self, map_: pa.MapArray, offsets: pa.Array, keys: pa.Array, values: pa.Array) -> None:
        self.map = map_
        self.offsets = offsets.cast(pa.int64())
        self.keys = keys
        self.values = values
        self.n = len(map_)
        self._codes: pa.Array | None = None
        self._names: dict[str, int] = {}

    def lookup(self, name: str) -> pa.Array:
        """The value of property ``name`` per row (null when absent)."""
        if self._codes is None:  # a few names repeat in every record: compare their codes, not strings
            enc = pc.dictionary_encode(self.keys)
            self._codes = enc.indices
            self._names = {v: i for i, v in enumerate(enc.dictionary.to_pylist())}
        code = self._names.get(name)
        if code is None:
            return pa.nulls(self.n, pa.string())
        match = pc.equal(self._codes, pa.scalar(code, self._codes.type))
        before = pa.concat_arrays([pa.array([0], pa.int64()), pc.cumulative_sum(match.cast(pa.int64()))])
        at = pc.take(before, self.offsets)
        per_row = pc.subtract(at.slice(1), at.slice(0, self.n))
        if pc.max(per_row).as_py() in (None, 0):
            return pa.nulls(self.n, pa.string())
        if pc.max(per_row).as_py() > 1:  # a name twice in one record: the first one, as the broker reads it
            return pc.map_lookup(self.map, name, "first")
        return pc.replace_with_mask(pa.nulls(self.n, pa.string()), pc.greater(per_row, 0),
                                    pc.filter(self.values, match))


def parse_entries(cq: bytes | memoryview | pa.Buffer, where: Where, first_queue_offset: int
                  ) -> tuple[pa.Array, pa.Array]:
    """(cold CommitLog offsets, sizes) of ConsumeQueue entries; the bytes must
    be whole entries."""
    buf = cq if isinstance(cq, pa.Buffer) else pa.py_buffer(cq)
    if buf.size % CQ_ENTRY_SIZE:
        raise CorruptRecordError(where.cq_key, (first_queue_offset - where.cq_object_start) * CQ_ENTRY_SIZE,
                                 f"{buf.size} bytes are not whole 20-byte entries")
    n = buf.size // CQ_ENTRY_SIZE
    fsb = pa.Array.from_buffers(pa.binary(CQ_ENTRY_SIZE), n, [None, buf])
    return _be_int(fsb, 0, 8, pa.int64()), _be_int(fsb, 8, 4, pa.int32())


def check_entries(offsets: pa.Array, sizes: pa.Array, cl_base: int, cl_len: int, where: Where,
                  first_queue_offset: int) -> None:
    """Entries must be records laid end to end from ``cl_base`` over exactly
    ``cl_len`` bytes: anything else is a corrupt ConsumeQueue."""
    n = len(offsets)
    if n == 0:
        return
    sizes64 = sizes.cast(pa.int64())
    ends = pc.cumulative_sum(sizes64)
    expected = pc.add(pc.subtract(ends, sizes64), cl_base)
    bad = pc.or_(pc.not_equal(offsets, expected),
                 pc.or_(pc.less(sizes, MIN_RECORD_SIZE), pc.equal(sizes, CQ_FILLER_SIZE)))
    if pc.any(bad).as_py():
        i = pc.index(bad, True).as_py()
        at = (first_queue_offset + i - where.cq_object_start) * CQ_ENTRY_SIZE
        raise CorruptRecordError(
            where.cq_key, at, f"entry for queue offset {first_queue_offset + i} points at "
            f"{offsets[i].as_py()} size {sizes[i].as_py()}; expected a record at {expected[i].as_py()}")
    if ends[n - 1].as_py() != cl_len:
        at = (first_queue_offset + n - 1 - where.cq_object_start) * CQ_ENTRY_SIZE
        raise CorruptRecordError(where.cq_key, at, f"entries cover {ends[n - 1].as_py()} bytes of the "
                                                   f"{cl_len} fetched from {where.cl_key}")


class BatchDecoder:
    """Decodes runs of one queue's records into RecordBatches of ``columns``."""

    def __init__(self, queue: QueueInfo, columns: tuple[str, ...] = COLUMN_NAMES, *, verify_crc: bool = True,
                 skip_corrupt: bool = False, decompress: bool = True) -> None:
        self.queue = queue
        self.decompress = decompress  # undo producer compression in ``body`` (tiered.format.compression)
        self.columns = tuple(columns)
        self.schema = arrow_schema(self.columns)
        self.verify_crc = verify_crc
        self.skip_corrupt = skip_corrupt
        self.skipped = 0
        self.skipped_at: list[str] = []  # "object @ offset: reason", first few
        topic = queue.topic.encode("utf-8")
        self._prefix = {MAGIC_V1: (bytes([len(topic)]) if len(topic) < 256 else None, 1),
                        MAGIC_V2: (len(topic).to_bytes(2, "big") if len(topic) < 65536 else None, 2)}
        self._topic = topic
        need = set(self.columns)
        self._need_props = bool(need & {"tags", "keys", "unique_key", "properties", "delay_level", "real_topic"})
        self._need_body = "body" in need
        self._lmq = is_lmq(queue.topic)

    # --- entry point -------------------------------------------------------------

    def decode(self, cl: pa.Buffer, cl_base: int, offsets: pa.Array, sizes: pa.Array, first_queue_offset: int,
               where: Where) -> pa.RecordBatch:
        """Records at cold CommitLog offsets ``offsets`` (sizes ``sizes``), laid
        end to end in ``cl`` which starts at cold offset ``cl_base``; the first is
        queue offset ``first_queue_offset``. Entries must have passed
        ``check_entries``."""
        n = len(offsets)
        if n == 0:
            return self._empty()
        rel = pc.subtract(offsets, cl_base)
        end = pc.add(rel, sizes.cast(pa.int64()))
        bounds = pa.concat_arrays([rel.slice(0, 1), end])
        records = pa.Array.from_buffers(pa.large_binary(), n, [None, _int64_buffer(bounds), cl])
        qoffs = arange(first_queue_offset, n)
        positions = pc.subtract(offsets, where.cl_object_start)
        return self._rows(records, qoffs, positions, where)[0]

    def _rows(self, records: pa.Array, qoffs: pa.Array, positions: pa.Array, where: Where) -> Decoded:
        if self._lmq:
            return self._decode_lmq(records, qoffs, positions, where)
        return self.decode_rows(records, qoffs, positions, where)

    # --- an LMQ queue: its parents' records -----------------------------------------

    def _decode_lmq(self, records: pa.Array, qoffs: pa.Array, positions: pa.Array, where: Where) -> Decoded:
        """Each record checked as entry ``qoffs[i]`` of this LMQ queue, then
        the records of each parent queue decoded as that queue's (their own
        offsets), with this queue's topic, queue id and offsets put back."""
        q = self.queue
        offsets = qoffs.to_pylist()
        bad: list[bool] = []
        reasons: list[str] = []
        groups: dict[tuple[str, int], list[tuple[int, int]]] = {}  # parent -> (row, parent offset)
        for i, raw in enumerate(records.to_pylist()):
            try:
                rec = decode_record(memoryview(raw), 0, where.cl_key, verify_crc=False)  # the group checks CRCs
                problem = entry_problem(rec, topic=self._topic, queue_id=q.queue_id, queue_offset=offsets[i])
                parent = (rec.topic, rec.queue_id)
            except TieredError as exc:
                problem = getattr(exc, "reason", str(exc))
            bad.append(problem is not None)
            if problem is not None:
                reasons.append(problem)
                continue
            groups.setdefault(parent, []).append((i, rec.queue_offset))
        if any(bad):
            mask = pa.array(bad)
            return self._handle_bad(records, qoffs, positions, where, mask, [(mask, reasons[0])])
        parts, kept = [], []
        for (topic, queue_id), rows in groups.items():
            sub = BatchDecoder(QueueInfo(q.cluster, q.broker, topic, queue_id), self.columns,
                               verify_crc=self.verify_crc, skip_corrupt=self.skip_corrupt, decompress=self.decompress)
            idx = pa.array([r for r, _ in rows], pa.int64())
            batch, done = sub.decode_rows(records.take(idx), pa.array([o for _, o in rows], pa.int64()),
                                          positions.take(idx), where)
            self.skipped += sub.skipped
            self.skipped_at.extend(sub.skipped_at[:max(0, 10 - len(self.skipped_at))])
            lmq_offset = {o: offsets[r] for r, o in rows}
            mine = pa.array([lmq_offset[o] for o in done.to_pylist()], pa.int64())
            parts.append(self._as_lmq(batch, mine))
            kept.append(mine)
        all_kept = pa.concat_arrays(kept) if kept else pa.array([], pa.int64())
        if not self.columns or not parts:
            return (rows_batch([], self.schema, len(all_kept)) if not self.columns else self._empty()), all_kept
        perm = pc.sort_indices(all_kept)
        out = pa.Table.from_batches(parts, schema=self.schema).take(perm).combine_chunks()
        return (out.to_batches()[0] if out.num_rows else self._empty()), all_kept.take(perm)

    def _as_lmq(self, batch: pa.RecordBatch, offsets: pa.Array) -> pa.RecordBatch:
        """A parent queue's rows as this LMQ queue's: its topic, queue id and offsets."""
        n, q = len(offsets), self.queue
        own = {"topic": pa.repeat(pa.scalar(q.topic, pa.string()), n),
               "queue_id": pa.repeat(pa.scalar(q.queue_id, pa.int32()), n), "queue_offset": offsets}
        arrays = [own[c].cast(self.schema.field(c).type) if c in own else batch.column(i)
                  for i, c in enumerate(self.columns)]
        return rows_batch(arrays, self.schema, n)

    def decode_made(self, records: list[bytes], queue_offsets: list[int], positions: list[int],
                    where: Where) -> pa.RecordBatch:
        """Records made apart from any object (a BatchCQ record's messages,
        ``tiered.query.batchscan``): ``positions`` name, for errors, where the
        record they came from lies in ``where.cl_key``."""
        if not records:
            return self._empty()
        return self.decode_rows(pa.array(records, pa.large_binary()), pa.array(queue_offsets, pa.int64()),
                                pa.array(positions, pa.int64()), where)[0]

    # --- rows, possibly in several layout groups -----------------------------------

    def decode_rows(self, records: pa.Array, qoffs: pa.Array, positions: pa.Array, where: Where) -> Decoded:
        """Whole records, one a row of ``records`` (queue offsets ``qoffs``,
        offsets in ``where.cl_key`` ``positions``) decoded as this queue's, not
        as an LMQ queue's: the rows and the queue offsets kept (corrupt ones
        skipped or raised, as ``skip_corrupt`` says). An LMQ queue's decoder
        calls it on a decoder of each parent queue."""
        magic = _be_int(records, 4, 4, pa.uint32())
        sys_flag = _be_int(records, 36, 4, pa.int32())
        # layout group: 4 x (magic v2) + 2 x (store host IPv6) + (born host IPv6)
        layout = pc.add(pc.multiply(pc.equal(magic, MAGIC_V2).cast(pa.int32()), 4),
                        pc.shift_right(pc.bit_wise_and(sys_flag, 0x30), 4))
        good_magic = pc.or_(pc.equal(magic, MAGIC_V1), pc.equal(magic, MAGIC_V2))
        first_layout = layout[0].as_py()
        if pc.all(good_magic).as_py() and pc.all(pc.equal(layout, first_layout)).as_py():
            return self._decode_group(records, qoffs, positions, where, first_layout)
        if not pc.all(good_magic).as_py():
            return self._handle_bad(records, qoffs, positions, where, pc.invert(good_magic),
                                    [(pc.invert(good_magic), "bad magic code")])
        # several layouts: decode each, then restore queue order
        parts, kept = [], []
        for value in pc.unique(layout).to_pylist():
            idx = pc.indices_nonzero(pc.equal(layout, value))
            batch, offs = self._decode_group(records.take(idx), qoffs.take(idx), positions.take(idx), where, value)
            parts.append(batch)
            kept.append(offs)
        all_kept = pa.concat_arrays(kept)
        if not self.columns:  # nothing to reorder: the row count is all there is
            return rows_batch([], self.schema, len(all_kept)), all_kept
        table = pa.Table.from_batches(parts, schema=self.schema)
        perm = pc.sort_indices(all_kept)
        out = table.take(perm).combine_chunks()
        batch = out.to_batches()[0] if out.num_rows else self._empty()
        return batch, all_kept.take(perm)

    def _handle_bad(self, records: pa.Array, qoffs: pa.Array, positions: pa.Array, where: Where,
                    bad: pa.Array, reasons: list[tuple[pa.Array, str]]) -> Decoded:
        i = pc.index(bad, True).as_py()
        reason = next((r for mask, r in reasons if mask[i].as_py()), "malformed record")
        err = CorruptRecordError(where.cl_key, positions[i].as_py(),
                                 f"queue offset {qoffs[i].as_py()}: {reason}")
        if not self.skip_corrupt:
            raise err
        nbad = pc.sum(bad.cast(pa.int64())).as_py()
        self.skipped += nbad
        if len(self.skipped_at) < 10:
            self.skipped_at.append(str(err))
        keep = pc.invert(bad)
        if nbad == len(records):
            return self._empty(), pa.array([], pa.int64())
        return self._rows(pc.filter(records, keep), pc.filter(qoffs, keep), pc.filter(positions, keep), where)

    def _empty(self) -> pa.RecordBatch:
        return pa.RecordBatch.from_arrays([pa.array([], self.schema.field(c).type) for c in self.columns],
                                          schema=self.schema)

    # --- one layout group: constant positions before the body -----------------------

    def _decode_group(self, records: pa.Array, qoffs: pa.Array, positions: pa.Array, where: Where,
                      layout: int) -> Decoded:
        n = len(records)
        q = self.queue
        v2, born6, store6 = bool(layout & 4), bool(layout & 1), bool(layout & 2)
        a = _V6_EXTRA if born6 else 0
        b = _V6_EXTRA if store6 else 0
        body_at = _FIXED_V4 + a + b
        prefix, len_bytes = self._prefix[MAGIC_V2 if v2 else MAGIC_V1]
        tail_fixed = len_bytes + len(self._topic) + 2  # topic length + topic + properties length

        lengths = pc.binary_length(records)
        short = pc.less(lengths, body_at + tail_fixed)
        if pc.any(short).as_py() or prefix is None:
            bad = short if prefix is not None else pc.not_equal(lengths, -1)
            return self._handle_bad(records, qoffs, positions, where, bad,
                                    [(bad, "record too short for its layout" if prefix is not None
                                      else "topic too long for the magic version")])
        size = _be_int(records, 0, 4, pa.int32())
        queue_id = _be_int(records, 12, 4, pa.int32())
        queue_offset = _be_int(records, 20, 8, pa.int64())
        body_len = _be_int(records, body_at - 4, 4, pa.int32())
        tail_len = pc.subtract(pc.subtract(lengths, body_at), body_len.cast(pa.int64()))
        checks = [
            (pc.not_equal(size.cast(pa.int64()), lengths), "total size differs from its ConsumeQueue entry"),
            (pc.not_equal(queue_id, q.queue_id), f"queue id differs from {q.queue_id}"),
            (pc.not_equal(queue_offset, qoffs), "queue offset differs from its position in the queue"),
            (pc.or_(pc.less(body_len, 0), pc.less(tail_len, tail_fixed)), "body length runs past the record"),
        ]
        bad = _any_of(checks)
        if pc.any(bad).as_py():
            return self._handle_bad(records, qoffs, positions, where, bad, checks)

        bodies, tails = self._bodies_and_tails(records, n, body_at, body_len)
        crc = _be_int(records, 8, 4, pa.int32())
        checks = self._tail_checks(tails, bodies, crc, prefix, tail_fixed)
        bad = _any_of(checks)
        if pc.any(bad).as_py():
            return self._handle_bad(records, qoffs, positions, where, bad, checks)
        if self.decompress and bodies is not None:
            try:
                bodies = _decompressed(bodies, _be_int(records, 36, 4, pa.int32()))
            except BadRecordsError as exc:
                return self._handle_bad(records, qoffs, positions, where, exc.mask, exc.reasons)

        props_map = None
        if self._need_props:
            raw_props = pc.binary_slice(tails, tail_fixed, tail_fixed + 0x8000)
            try:
                props_map = self._properties(raw_props)
            except BadRecordsError as exc:
                return self._handle_bad(records, qoffs, positions, where, exc.mask, exc.reasons)

        out = self._fixed(records, n, a, b, queue_id, queue_offset, bodies, crc)
        if props_map is not None:
            out.update(self._derived(props_map, n))
        return rows_batch([out[c] for c in self.columns], self.schema, n), qoffs

    def _bodies_and_tails(self, records: pa.Array, n: int, body_at: int,
                          body_len: pa.Array) -> tuple[pa.Array | None, pa.Array]:
        """Each record's body (None unless the body column is read) and its tail
        (topic length, topic, properties length and properties)."""
        # body and tail: one array over the same bytes, every third element
        starts = _offsets(records).slice(0, n)
        body_start = pc.add(starts, body_at)
        body_end = pc.add(body_start, body_len.cast(pa.int64()))
        next_start = _offsets(records).slice(1, n)
        pieces_off = _interleave(body_start, body_end, next_start)
        pieces = pa.Array.from_buffers(pa.large_binary(), 3 * n - 1, [None, pieces_off, records.buffers()[2]])
        # bodies copied and CRC-checked only for the body column (Parquet reads
        # and checksums no page of an unread column either)
        bodies = pieces.take(arange(0, n, 3)) if self._need_body else None
        return bodies, pieces.take(arange(1, n, 3))

    def _tail_checks(self, tails: pa.Array, bodies: pa.Array | None, crc: pa.Array, prefix: bytes,
                     tail_fixed: int) -> list[tuple[pa.Array, str]]:
        """The checks of the bytes after the body (topic, properties length),
        and of the body's CRC where bodies are read and checked."""
        props_len = _be_int(tails, tail_fixed - 2, 2, pa.int16())
        checks = [
            (pc.not_equal(pc.binary_slice(tails, 0, tail_fixed - 2), pa.scalar(prefix + self._topic, pa.binary())),
             f"topic differs from {self.queue.topic!r}"),
            (pc.not_equal(pc.add(props_len.cast(pa.int64()), tail_fixed), pc.binary_length(tails)),
             "properties length does not end at the total size"),
        ]
        if self.verify_crc and bodies is not None:
            mismatch = self._crc_mismatch(bodies, crc)
            if mismatch is not None:
                checks.append((mismatch, "body CRC mismatch"))
        return checks

    def _fixed(self, records: pa.Array, n: int, a: int, b: int, queue_id: pa.Array, queue_offset: pa.Array,
               bodies: pa.Array | None, crc: pa.Array) -> dict[str, pa.Array]:
        """The requested columns read at fixed positions (``a``, ``b``: the extra
        bytes of an IPv6 born / store host), plus the body and its CRC."""
        q = self.queue
        out: dict[str, pa.Array] = {}
        cols = self.columns
        for name in cols:
            if name == "topic":
                out[name] = pa.repeat(pa.scalar(q.topic, pa.string()), n)
            elif name == "cluster":
                out[name] = pa.repeat(pa.scalar(q.cluster, pa.string()), n)
            elif name == "broker":
                out[name] = pa.repeat(pa.scalar(q.broker, pa.string()), n)
            elif name == "queue_id":
                out[name] = queue_id
            elif name == "queue_offset":
                out[name] = queue_offset
            elif name == "commitlog_offset":
                out[name] = _be_int(records, 28, 8, pa.int64())
            elif name == "sys_flag":
                out[name] = _be_int(records, 36, 4, pa.int32())
            elif name == "flag":
                out[name] = _be_int(records, 16, 4, pa.int32())
            elif name == "born_timestamp":
                out[name] = pc.multiply(_be_int(records, 40, 8, pa.int64()), 1000).cast(TIMESTAMP)
            elif name == "store_timestamp":
                out[name] = pc.multiply(_be_int(records, 56 + a, 8, pa.int64()), 1000).cast(TIMESTAMP)
            elif name == "born_host":
                out[name] = _hosts(pc.binary_slice(records, 48, 56 + a))
            elif name == "store_host":
                out[name] = _hosts(pc.binary_slice(records, 64 + a, 72 + a + b))
            elif name == "reconsume_times":
                out[name] = _be_int(records, 72 + a + b, 4, pa.int32())
            elif name == "body" and bodies is not None:
                out[name] = bodies.cast(pa.binary())
            elif name == "body_crc":
                out[name] = crc
        return out

    @staticmethod
    def _crc_mismatch(bodies: pa.Array, crc: pa.Array) -> pa.Array | None:
        """None when every body matches its stored CRC, else the mismatch mask.
        (A Python loop, but over native buffers: zlib does the work.)"""
        n = len(bodies)
        data_buf = bodies.buffers()[2]
        data = memoryview(data_buf) if data_buf is not None else memoryview(b"")
        offs = memoryview(bodies.buffers()[1]).cast("q")[bodies.offset:bodies.offset + n + 1]
        stored = memoryview(crc.buffers()[1]).cast("i")[crc.offset:crc.offset + n]
        f = crc32  # zlib-ng: zlib's values, SIMD (tiered.format.codec)
        mask = CRC_MASK
        ok = all(f(data[offs[i]:offs[i + 1]]) & mask == stored[i] for i in range(n))
        if ok:
            return None
        return pa.array([f(data[offs[i]:offs[i + 1]]) & mask != stored[i] for i in range(n)])

    # --- properties ----------------------------------------------------------------

    def _properties(self, raw: pa.Array) -> _Props:
        try:
            text = raw.cast(pa.large_string())
        except pa.ArrowInvalid:
            bad = []
            for v in raw.to_pylist():
                try:
                    v.decode("utf-8")
                    bad.append(False)
                except UnicodeDecodeError:
                    bad.append(True)
            mask = pa.array(bad)
            raise BadRecordsError(mask, [(mask, "properties are not valid UTF-8")]) from None
        items = _drop_empty(pc.split_pattern(text, "\x02").cast(pa.list_(pa.large_string())))
        flat = items.flatten()
        kv = pc.split_pattern(flat, "\x01", max_splits=1)
        whole = pc.equal(pc.list_value_length(kv), 2)
        if len(whole) and not pc.all(whole).as_py():  # all() of nothing is null, not true
            parents = pc.list_parent_indices(items)
            bad_rows = pc.unique(pc.filter(parents, pc.invert(whole)))
            mask = pc.is_in(arange(0, len(raw)), value_set=bad_rows.cast(pa.int64()))
            raise BadRecordsError(mask, [(mask, "property without a value separator")])
        keys = pc.list_element(kv, 0).cast(pa.string())
        values = pc.list_element(kv, 1).cast(pa.string())
        offsets = items.offsets.cast(pa.int32())
        return _Props(pa.MapArray.from_arrays(offsets, keys, values, type=ARROW_TYPES["properties"]),
                      offsets, keys, values)

    def _derived(self, props: _Props, n: int) -> dict[str, pa.Array]:
        out: dict[str, pa.Array] = {}
        need = set(self.columns)
        prop = props.lookup

        if "properties" in need:
            out["properties"] = props.map
        if "tags" in need:
            out["tags"] = prop("TAGS")
        if "unique_key" in need:
            out["unique_key"] = prop("UNIQ_KEY")
        if "keys" in need:
            keys = pc.split_pattern(pc.fill_null(prop("KEYS"), ""), " ")
            out["keys"] = _drop_empty(keys, ARROW_TYPES["keys"])
        if "delay_level" in need:
            delay = prop("DELAY")
            try:
                out["delay_level"] = delay.cast(pa.int32())
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
                out["delay_level"] = pa.array([_int_or_none(v) for v in delay.to_pylist()], pa.int32())
        if "real_topic" in need:
            out["real_topic"] = pc.coalesce(*[prop(p) for p in REAL_TOPIC_PROPS],
                                            pa.scalar(self.queue.topic, pa.string()))
        return out


def _decompressed(bodies: pa.Array, sys_flag: pa.Array) -> pa.Array:
    """Bodies as consumers see them: the compressed ones (sys flag bit 0)
    decompressed (one Python call per compressed body: the codec does the work).
    A body that does not decompress marks its row bad."""
    flagged = pc.not_equal(pc.bit_wise_and(sys_flag, COMPRESSED_FLAG), 0)
    if not pc.any(flagged).as_py():
        return bodies
    values = bodies.to_pylist()
    flags = sys_flag.to_pylist()
    failed: list[bool] = [False] * len(values)
    reason = ""
    for i in pc.indices_nonzero(flagged).to_pylist():
        try:
            values[i] = decompress(values[i], flags[i])
        except BodyDecompressError as exc:
            failed[i] = True
            reason = reason or str(exc)
    if any(failed):
        mask = pa.array(failed)
        raise BadRecordsError(mask, [(mask, reason)])
    return pa.array(values, pa.large_binary())


def _int_or_none(value: str | None) -> int | None:
    try:
        v = int(value) if value is not None else None
    except ValueError:
        return None
    return v if v is not None and -(2 ** 31) <= v < 2 ** 31 else None


def _hosts(packed: pa.Array) -> pa.Array:
    """ip:port strings from the stored host bytes; hosts repeat, so each
    distinct value is formatted once."""
    enc = pc.dictionary_encode(packed)
    text = pa.array([str(_host_of(v)) for v in enc.dictionary.to_pylist()], pa.string())
    return text.take(enc.indices)


def rows_batch(arrays: list[pa.Array], schema: pa.Schema, n: int) -> pa.RecordBatch:
    """A batch of ``n`` rows; with no column at all it still carries ``n`` (a
    query such as count(*) over a source declared with no columns)."""
    if arrays:
        return pa.RecordBatch.from_arrays(arrays, schema=schema)
    return pa.record_batch([pa.nulls(n, pa.int8())], names=["n"]).select([])


def empty_batch(columns: tuple[str, ...] = COLUMN_NAMES) -> pa.RecordBatch:
    schema = arrow_schema(columns)
    return pa.RecordBatch.from_arrays([pa.array([], schema.field(c).type) for c in columns], schema=schema)
