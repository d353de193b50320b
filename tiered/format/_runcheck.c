/* The checks of tiered.format.batch.check_run, one record at a time in C.
 *
 * Built at install when a C compiler is there (pyproject.toml: an optional
 * extension); without it check_run keeps its numpy path, which makes the
 * same decisions. The two are held equal by tests/tiered/test_runcheck.py.
 *
 * Why C: in Python every record costs at least one call through the
 * interpreter (the body CRC over a memoryview slice, ~180 ns here), more
 * than a raw read of the record's bytes costs. Here a record costs its
 * CRC (zlib-ng's SIMD crc32, reached through the function pointer
 * tiered.format.batch hands over from the zlib_ng extension) and a few
 * loads. The loop runs without the GIL.
 *
 * Layout (big-endian; DESIGN.md section 2, tiered/format/codec.py):
 *   0 size i32 | 4 magic u32 | 8 body crc i32 | 12 queue id i32 | 16 flag i32
 *   20 queue offset i64 | 28 physical offset i64 | 36 sys flag i32
 *   40 born ts i64 | 48 born host (8, IPv6 20) | store ts i64 | store host
 *   (8, IPv6 20) | reconsume i32 | prepared i64 | body length i32 | body
 *   | topic length (v1 u8, v2 u16) | topic | properties length i16 | props
 * ConsumeQueue entry: phys i64 | size i32 | tags code i64 (20 bytes).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

typedef uint32_t (*crc32_fn)(uint32_t crc, const uint8_t *buf, uint32_t len);

static crc32_fn crc32_impl = NULL;

#define FIXED_V4 88      /* the fixed part when both hosts are IPv4 */
#define BORN_HOST_AT 48
#define AFTER_STORE_HOST 16  /* reconsume i32, prepared i64, body length i32 */
#define CQ_ENTRY 20
#define CRC_MASK 0x7FFFFFFFu
#define OUTPUTS 6

static inline uint64_t load64(const uint8_t *p) {
    uint64_t v;
    memcpy(&v, p, 8);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    return v;
#else
    return __builtin_bswap64(v);
#endif
}

static inline uint32_t load32(const uint8_t *p) {
    uint32_t v;
    memcpy(&v, p, 4);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    return v;
#else
    return __builtin_bswap32(v);
#endif
}

typedef struct {
    const uint8_t *buf;       /* the mapped CommitLog file */
    int64_t len;
    int64_t base;             /* its first byte's CommitLog offset */
    const uint8_t *entries;   /* ConsumeQueue entries, CQ_ENTRY bytes each */
    Py_ssize_t count;
    const uint8_t *tail;      /* topic length + topic, as the record holds them */
    int64_t tail_len;         /* that + the 2-byte properties length */
    uint32_t magic;
    int32_t queue_id;
    int64_t first_offset;
    int verify_crc;
    int64_t *out[OUTPUTS];    /* positions, sizes, tags, store ms, born ms, props at */
} run_t;

/* How many leading entries are plainly valid records; fills the outputs. */
static Py_ssize_t check(const run_t *run) {
    const int64_t min_size = FIXED_V4 + run->tail_len;
    const int64_t topic_part = run->tail_len - 2;
    Py_ssize_t i;
    for (i = 0; i < run->count; i++) {
        const uint8_t *entry = run->entries + i * CQ_ENTRY;
        const int64_t phys = (int64_t)load64(entry);
        const int64_t size = (int32_t)load32(entry + 8);
        const int64_t pos = phys - run->base;
        /* the caller keeps runs inside the view; checked anyway: never read outside it */
        if (size < min_size || pos < 0 || pos > run->len - size) break;
        const uint8_t *rec = run->buf + pos;
        if ((int32_t)load32(rec) != size || load32(rec + 4) != run->magic
            || (int32_t)load32(rec + 12) != run->queue_id
            || (int64_t)load64(rec + 20) != run->first_offset + i || (int64_t)load64(rec + 28) != phys)
            break;
        const uint32_t sys_flag = load32(rec + 36);
        int64_t store_at = BORN_HOST_AT + 8, body_at = FIXED_V4;
        if (sys_flag & 0x30) {  /* IPv6 hosts move the fields behind them */
            store_at = BORN_HOST_AT + ((sys_flag & 0x10) ? 20 : 8);
            body_at = store_at + 8 + ((sys_flag & 0x20) ? 20 : 8) + AFTER_STORE_HOST;
            if (body_at + run->tail_len > size) break;
        }
        const int64_t body_len = (int32_t)load32(rec + body_at - 4);
        const int64_t body_end = body_at + body_len;
        if (body_len < 0 || body_end + run->tail_len > size) break;
        if (run->verify_crc) {
            const uint32_t crc = crc32_impl(0, rec + body_at, (uint32_t)body_len) & CRC_MASK;
            if ((int64_t)crc != (int64_t)(int32_t)load32(rec + 8)) break;
        }
        const uint8_t *tail = rec + body_end;
        if (memcmp(tail, run->tail, (size_t)topic_part) != 0) break;
        const int64_t props_len = ((int64_t)tail[topic_part] << 8) | tail[topic_part + 1];
        const int64_t props_at = body_end + run->tail_len;
        if (props_len >= 0x8000 || props_at + props_len != size) break;
        run->out[0][i] = pos;
        run->out[1][i] = size;
        run->out[2][i] = (int64_t)load64(entry + 12);
        run->out[3][i] = (int64_t)load64(rec + store_at);
        run->out[4][i] = (int64_t)load64(rec + 40);
        run->out[5][i] = pos + props_at;
    }
    return i;
}

static void release_all(Py_buffer *views, int n) {
    for (int k = 0; k < n; k++) PyBuffer_Release(&views[k]);
}

/* check_run(view, base, entries, tail, magic, queue_id, first_offset,
 *           verify_crc, out) -> count
 * ``tail``: topic length + topic bytes; ``out``: a writable int64 buffer of
 * 6 x len(entries) items (positions, sizes, tags, store ms, born ms, props at). */
static PyObject *py_check_run(PyObject *self, PyObject *args) {
    PyObject *view_obj, *entries_obj, *tail_obj, *out_obj;
    long long base, first_offset;
    unsigned long magic;
    int queue_id, verify_crc;
    if (!PyArg_ParseTuple(args, "OLOOkiLpO", &view_obj, &base, &entries_obj, &tail_obj, &magic, &queue_id,
                          &first_offset, &verify_crc, &out_obj))
        return NULL;
    if (verify_crc && crc32_impl == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "set_crc32 was not called");
        return NULL;
    }
    Py_buffer views[4];
    int held = 0;
    PyObject *objs[4] = {view_obj, entries_obj, tail_obj, out_obj};
    for (; held < 4; held++) {
        int flags = held == 3 ? PyBUF_WRITABLE : PyBUF_SIMPLE;  /* C-contiguous bytes either way */
        if (PyObject_GetBuffer(objs[held], &views[held], flags) != 0) {
            release_all(views, held);
            return NULL;
        }
    }
    run_t run;
    run.buf = views[0].buf;
    run.len = views[0].len;
    run.base = base;
    run.entries = views[1].buf;
    run.count = views[1].len / CQ_ENTRY;
    run.tail = views[2].buf;
    run.tail_len = views[2].len + 2;
    run.magic = (uint32_t)magic;
    run.queue_id = queue_id;
    run.first_offset = first_offset;
    run.verify_crc = verify_crc;
    if (views[1].len % CQ_ENTRY != 0 || views[3].len < (Py_ssize_t)(OUTPUTS * sizeof(int64_t)) * run.count) {
        release_all(views, 4);
        PyErr_SetString(PyExc_ValueError, "entries not whole ConsumeQueue entries, or out too small");
        return NULL;
    }
    for (int k = 0; k < OUTPUTS; k++) run.out[k] = (int64_t *)views[3].buf + k * run.count;
    Py_ssize_t n;
    Py_BEGIN_ALLOW_THREADS
    n = check(&run);
    Py_END_ALLOW_THREADS
    release_all(views, 4);
    return PyLong_FromSsize_t(n);
}

/* check_runs(view, base, entries, runs, tails, verify_crc, out) -> None
 * Many queues' runs of one window in one call (the CommitLog pass: at
 * 1,000 queues a call per queue cost more than its records). ``entries``:
 * the runs' ConsumeQueue entries one after the other; ``runs``: an int64
 * buffer of 7 items a run: first entry, entry count, queue id, first queue
 * offset, magic, where its tail starts in ``tails`` and how long it is
 * (topic length + topic), its answer (the count of leading plainly valid
 * records) written into the 8th; ``out``: 6 x len(entries) int64 items
 * (positions, sizes, tags, store ms, born ms, props at), each run's rows at
 * its entries' rows. Every run is checked exactly as check_run checks it. */
#define RUN_FIELDS 8
static PyObject *py_check_runs(PyObject *self, PyObject *args) {
    PyObject *view_obj, *entries_obj, *runs_obj, *tails_obj, *out_obj;
    long long base;
    int verify_crc;
    if (!PyArg_ParseTuple(args, "OLOOOpO", &view_obj, &base, &entries_obj, &runs_obj, &tails_obj, &verify_crc,
                          &out_obj))
        return NULL;
    if (verify_crc && crc32_impl == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "set_crc32 was not called");
        return NULL;
    }
    Py_buffer views[5];
    PyObject *objs[5] = {view_obj, entries_obj, tails_obj, runs_obj, out_obj};
    int held = 0;
    for (; held < 5; held++) {
        int flags = held >= 3 ? PyBUF_WRITABLE : PyBUF_SIMPLE;
        if (PyObject_GetBuffer(objs[held], &views[held], flags) != 0) {
            release_all(views, held);
            return NULL;
        }
    }
    const Py_ssize_t count = views[1].len / CQ_ENTRY;
    int64_t *runs = (int64_t *)views[3].buf;
    const Py_ssize_t nruns = views[3].len / (Py_ssize_t)(RUN_FIELDS * sizeof(int64_t));
    if (views[1].len % CQ_ENTRY != 0 || views[3].len % (Py_ssize_t)(RUN_FIELDS * sizeof(int64_t)) != 0
        || views[4].len < (Py_ssize_t)(OUTPUTS * sizeof(int64_t)) * count) {
        release_all(views, 5);
        PyErr_SetString(PyExc_ValueError, "entries, runs or out of the wrong size");
        return NULL;
    }
    /* every run's entries and tail inside the buffers given, before any is read */
    for (Py_ssize_t r = 0; r < nruns; r++) {
        const int64_t *run = runs + r * RUN_FIELDS;
        if (run[0] < 0 || run[1] < 0 || run[0] > count - run[1] || run[5] < 0 || run[6] < 0
            || run[5] > views[2].len - run[6] || run[4] < 0 || run[4] > 0xFFFFFFFFLL
            || run[2] < INT32_MIN || run[2] > INT32_MAX) {
            release_all(views, 5);
            PyErr_Format(PyExc_ValueError, "run %zd outside the entries or tails given", r);
            return NULL;
        }
    }
    const uint8_t *entries = views[1].buf, *tails = views[2].buf;
    int64_t *out = views[4].buf;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t r = 0; r < nruns; r++) {
        int64_t *run = runs + r * RUN_FIELDS;
        run_t one;
        one.buf = views[0].buf;
        one.len = views[0].len;
        one.base = base;
        one.entries = entries + run[0] * CQ_ENTRY;
        one.count = (Py_ssize_t)run[1];
        one.tail = tails + run[5];
        one.tail_len = run[6] + 2;
        one.magic = (uint32_t)run[4];
        one.queue_id = (int32_t)run[2];
        one.first_offset = run[3];
        one.verify_crc = verify_crc;
        for (int k = 0; k < OUTPUTS; k++) one.out[k] = out + k * count + run[0];
        /* as check_run: no record is plainly valid in a view shorter than a fixed part */
        run[7] = (one.count == 0 || one.len < FIXED_V4) ? 0 : (int64_t)check(&one);
    }
    Py_END_ALLOW_THREADS
    release_all(views, 5);
    Py_RETURN_NONE;
}

/* set_crc32(address): zng_crc32 of the zlib_ng extension, as an integer. */
static PyObject *py_set_crc32(PyObject *self, PyObject *arg) {
    void *address = PyLong_AsVoidPtr(arg);
    if (address == NULL) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "null function address");
        return NULL;
    }
    crc32_impl = (crc32_fn)address;
    Py_RETURN_NONE;
}

/* crc32(data) -> int: through the pointer set_crc32 installed (a self-test). */
static PyObject *py_crc32(PyObject *self, PyObject *arg) {
    if (crc32_impl == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "set_crc32 was not called");
        return NULL;
    }
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) != 0) return NULL;
    uint32_t crc = 0;
    const uint8_t *p = view.buf;
    Py_ssize_t left = view.len;
    while (left > 0) {  /* the C signature takes 32-bit lengths */
        uint32_t step = left > 0x40000000 ? 0x40000000u : (uint32_t)left;
        crc = crc32_impl(crc, p, step);
        p += step;
        left -= step;
    }
    PyBuffer_Release(&view);
    return PyLong_FromUnsignedLong(crc);
}

/* crc32_rows(rows, at, row_size, length, out): the CRC-32 of ``length``
 * bytes at ``at`` of each ``row_size``-byte row of ``rows`` into the int64
 * buffer ``out`` (what `tiered produce` stamps into the records it builds). */
static PyObject *py_crc32_rows(PyObject *self, PyObject *args) {
    PyObject *rows_obj, *out_obj;
    Py_ssize_t at, row_size, length;
    if (!PyArg_ParseTuple(args, "OnnnO", &rows_obj, &at, &row_size, &length, &out_obj)) return NULL;
    if (crc32_impl == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "set_crc32 was not called");
        return NULL;
    }
    if (row_size <= 0 || at < 0 || length < 0 || length > 0x7FFFFFFF || at > row_size - length) {
        PyErr_SetString(PyExc_ValueError, "span outside the row");
        return NULL;
    }
    Py_buffer rows, out;
    if (PyObject_GetBuffer(rows_obj, &rows, PyBUF_SIMPLE) != 0) return NULL;
    if (PyObject_GetBuffer(out_obj, &out, PyBUF_WRITABLE) != 0) {
        PyBuffer_Release(&rows);
        return NULL;
    }
    const Py_ssize_t count = rows.len / row_size;
    if (rows.len % row_size != 0 || out.len < count * (Py_ssize_t)sizeof(int64_t)) {
        PyBuffer_Release(&rows);
        PyBuffer_Release(&out);
        PyErr_SetString(PyExc_ValueError, "rows not whole rows, or out too small");
        return NULL;
    }
    const uint8_t *base = rows.buf;
    int64_t *dst = out.buf;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < count; i++)
        dst[i] = crc32_impl(0, base + i * row_size + at, (uint32_t)length);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&rows);
    PyBuffer_Release(&out);
    Py_RETURN_NONE;
}

/* Spans src[starts[i]:ends[i]] (int64 arrays), checked against src's bounds.
 * Returns the total length, -1 with an exception set. */
static Py_ssize_t spans_total(const Py_buffer *src, const Py_buffer *starts, const Py_buffer *ends) {
    if (starts->len != ends->len || starts->len % 8) {
        PyErr_SetString(PyExc_ValueError, "starts and ends must be int64 arrays of one length");
        return -1;
    }
    const int64_t *s = (const int64_t *)starts->buf, *e = (const int64_t *)ends->buf;
    Py_ssize_t n = starts->len / 8, total = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (s[i] < 0 || e[i] < s[i] || e[i] > src->len) {
            PyErr_Format(PyExc_ValueError, "span %zd [%lld, %lld) outside a buffer of %zd bytes", i,
                         (long long)s[i], (long long)e[i], src->len);
            return -1;
        }
        total += (Py_ssize_t)(e[i] - s[i]);
    }
    return total;
}

/* copy_spans(dst, at, src, starts, ends) -> bytes copied: the spans of src,
 * one after the other, into the writable dst from byte at (the segment
 * builder's buffer: one call per batch instead of one Python operation per
 * record). */
static PyObject *py_copy_spans(PyObject *self, PyObject *args) {
    PyObject *dst_obj, *src_obj, *starts_obj, *ends_obj;
    Py_ssize_t at;
    if (!PyArg_ParseTuple(args, "OnOOO", &dst_obj, &at, &src_obj, &starts_obj, &ends_obj)) return NULL;
    Py_buffer views[4];
    int got = 0;
    if (PyObject_GetBuffer(dst_obj, &views[0], PyBUF_WRITABLE) < 0) return NULL;
    got = 1;
    PyObject *objs[3] = {src_obj, starts_obj, ends_obj};
    for (; got < 4; got++)
        if (PyObject_GetBuffer(objs[got - 1], &views[got], PyBUF_SIMPLE) < 0) { release_all(views, got); return NULL; }
    Py_ssize_t total = spans_total(&views[1], &views[2], &views[3]);
    if (total < 0) { release_all(views, 4); return NULL; }
    if (at < 0 || at > views[0].len || total > views[0].len - at) {
        release_all(views, 4);
        PyErr_SetString(PyExc_ValueError, "the spans do not fit the destination");
        return NULL;
    }
    uint8_t *out = (uint8_t *)views[0].buf + at;
    const uint8_t *src = (const uint8_t *)views[1].buf;
    const int64_t *s = (const int64_t *)views[2].buf, *e = (const int64_t *)views[3].buf;
    Py_ssize_t n = views[2].len / 8;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < n; i++) {
        size_t len = (size_t)(e[i] - s[i]);
        memcpy(out, src + s[i], len);
        out += len;
    }
    Py_END_ALLOW_THREADS
    release_all(views, 4);
    return PyLong_FromSsize_t(total);
}

/* copy_runs(src, dsts, ats, starts, ends, bounds) -> None: copy_spans for
 * many destinations in one call (the CommitLog pass: every queue's records
 * of a window into its own segment buffer). Run r is spans
 * [bounds[r], bounds[r + 1]) of starts/ends (int64), copied one after the
 * other into the writable dsts[r] from byte ats[r]. Every span and
 * destination is checked before any byte is copied. */
static PyObject *py_copy_runs(PyObject *self, PyObject *args) {
    PyObject *src_obj, *dsts_obj, *ats_obj, *starts_obj, *ends_obj, *bounds_obj;
    if (!PyArg_ParseTuple(args, "OO!OOOO", &src_obj, &PyList_Type, &dsts_obj, &ats_obj, &starts_obj, &ends_obj,
                          &bounds_obj))
        return NULL;
    Py_buffer views[5];
    PyObject *objs[5] = {src_obj, ats_obj, starts_obj, ends_obj, bounds_obj};
    int got = 0;
    for (; got < 5; got++)
        if (PyObject_GetBuffer(objs[got], &views[got], PyBUF_SIMPLE) < 0) { release_all(views, got); return NULL; }
    const Py_ssize_t nruns = PyList_GET_SIZE(dsts_obj);
    Py_ssize_t total = spans_total(&views[0], &views[2], &views[3]);
    const int64_t *ats = views[1].buf, *bounds = views[4].buf;
    const Py_ssize_t nspans = views[2].len / 8;
    if (total >= 0 && (views[1].len != nruns * 8 || views[4].len != (nruns + 1) * 8 || bounds[0] != 0
                       || bounds[nruns] != nspans)) {
        PyErr_SetString(PyExc_ValueError, "ats and bounds must be int64 arrays of one item a run (and one more)");
        total = -1;
    }
    for (Py_ssize_t r = 0; total >= 0 && r < nruns; r++)
        if (bounds[r + 1] < bounds[r]) {
            PyErr_Format(PyExc_ValueError, "run %zd: bounds going back", r);
            total = -1;
        }
    if (total < 0) { release_all(views, 5); return NULL; }
    Py_buffer *dsts = PyMem_Calloc(nruns ? (size_t)nruns : 1, sizeof(Py_buffer));
    if (dsts == NULL) { release_all(views, 5); return PyErr_NoMemory(); }
    const int64_t *s = views[2].buf, *e = views[3].buf;
    Py_ssize_t held = 0;
    for (; held < nruns; held++) {
        if (PyObject_GetBuffer(PyList_GET_ITEM(dsts_obj, held), &dsts[held], PyBUF_WRITABLE) < 0) break;
        int64_t need = 0;
        for (int64_t i = bounds[held]; i < bounds[held + 1]; i++) need += e[i] - s[i];
        if (ats[held] < 0 || ats[held] > dsts[held].len || need > dsts[held].len - ats[held]) {
            PyErr_Format(PyExc_ValueError, "run %zd: the spans do not fit its destination", held);
            held++;
            break;
        }
    }
    if (held == nruns && !PyErr_Occurred()) {
        const uint8_t *src = (const uint8_t *)views[0].buf;
        Py_BEGIN_ALLOW_THREADS
        for (Py_ssize_t r = 0; r < nruns; r++) {
            uint8_t *out = (uint8_t *)dsts[r].buf + ats[r];
            for (int64_t i = bounds[r]; i < bounds[r + 1]; i++) {
                size_t len = (size_t)(e[i] - s[i]);
                memcpy(out, src + s[i], len);
                out += len;
            }
        }
        Py_END_ALLOW_THREADS
    }
    for (Py_ssize_t r = 0; r < held; r++) PyBuffer_Release(&dsts[r]);
    PyMem_Free(dsts);
    release_all(views, 5);
    if (PyErr_Occurred()) return NULL;
    Py_RETURN_NONE;
}

/* join_spans(src, starts, ends, sep) -> bytes: sep, span 0, sep, span 1, ...
 * (sep one byte): the properties of many records in one buffer, as
 * b"\x02" + b"\x02".join(...) makes it, without a slice object per record. */
static PyObject *py_join_spans(PyObject *self, PyObject *args) {
    PyObject *src_obj, *starts_obj, *ends_obj;
    int sep;
    if (!PyArg_ParseTuple(args, "OOOi", &src_obj, &starts_obj, &ends_obj, &sep)) return NULL;
    Py_buffer views[3];
    PyObject *objs[3] = {src_obj, starts_obj, ends_obj};
    int got = 0;
    for (; got < 3; got++)
        if (PyObject_GetBuffer(objs[got], &views[got], PyBUF_SIMPLE) < 0) { release_all(views, got); return NULL; }
    Py_ssize_t total = spans_total(&views[0], &views[1], &views[2]);
    if (total < 0) { release_all(views, 3); return NULL; }
    Py_ssize_t n = views[1].len / 8;
    PyObject *result = PyBytes_FromStringAndSize(NULL, total + n + (n == 0));
    if (result == NULL) { release_all(views, 3); return NULL; }
    uint8_t *out = (uint8_t *)PyBytes_AS_STRING(result);
    const uint8_t *src = (const uint8_t *)views[0].buf;
    const int64_t *s = (const int64_t *)views[1].buf, *e = (const int64_t *)views[2].buf;
    if (n == 0) out[0] = (uint8_t)sep;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < n; i++) {
        size_t len = (size_t)(e[i] - s[i]);
        *out++ = (uint8_t)sep;
        memcpy(out, src + s[i], len);
        out += len;
    }
    Py_END_ALLOW_THREADS
    release_all(views, 3);
    return result;
}

/* grow(buffer, n): the bytearray ``buffer`` resized to ``n`` >= len bytes
 * without writing the new ones (bytearray(n) zeroes them: a memset, and the
 * page faults of a fresh segment's worth of memory, before the copy writes
 * every byte anyway). The new bytes are garbage until written: the segment
 * builder only ever hands out the bytes it copied in. */
static PyObject *py_grow(PyObject *self, PyObject *args) {
    PyObject *buffer;
    Py_ssize_t n;
    if (!PyArg_ParseTuple(args, "O!n", &PyByteArray_Type, &buffer, &n)) return NULL;
    if (n < PyByteArray_GET_SIZE(buffer)) {
        PyErr_Format(PyExc_ValueError, "grow to %zd bytes, below the %zd held", n, PyByteArray_GET_SIZE(buffer));
        return NULL;
    }
    /* PyByteArray_Resize refuses (BufferError) while a view is exported */
    if (PyByteArray_Resize(buffer, n) < 0) return NULL;
    Py_RETURN_NONE;
}

/* realign(buffer, n, keep, align): a bytearray of ``n`` bytes whose first
 * byte sits at a multiple of ``align`` (a power of two), for a segment
 * written to disk with O_DIRECT (tiered/archive/storage.py): ``buffer``
 * itself, resized in place, when its bytes start aligned and ``n`` fits its
 * allocation without CPython moving them; else a new bytearray holding
 * ``buffer``'s first ``keep`` bytes. Like ``grow``, the bytes past ``keep``
 * are not written (garbage until the caller copies into them).
 *
 * The new buffer is made with public calls only: ``n + align`` bytes, then
 * its unaligned head deleted, which CPython does without moving anything
 * (it advances the bytearray's logical start inside the same allocation).
 * Later resizes keep it in place as long as they stay in that allocation
 * and above half of it (PyByteArray_Resize's rules, mirrored below); one
 * that does not is moved by CPython to an unaligned block: the caller comes
 * back here. Alignment is an optimisation: nothing breaks without it.
 * Buffers under ``align`` bytes are not aligned (not worth a page). */
static int fits_in_place(PyByteArrayObject *b, Py_ssize_t n, size_t align) {
    size_t alloc = (size_t)b->ob_alloc;
    size_t offset = (size_t)(b->ob_start - b->ob_bytes);
    if (b->ob_start == NULL || ((uintptr_t)b->ob_start & (align - 1)) != 0) return 0;
    if (n == Py_SIZE(b)) return 1;
    return (size_t)n + offset + 1 <= alloc && (size_t)n >= alloc / 2;
}

static PyObject *py_realign(PyObject *self, PyObject *args) {
    PyObject *buffer;
    Py_ssize_t n, keep, align;
    if (!PyArg_ParseTuple(args, "O!nnn", &PyByteArray_Type, &buffer, &n, &keep, &align)) return NULL;
    PyByteArrayObject *b = (PyByteArrayObject *)buffer;
    if (align <= 0 || (align & (align - 1)) != 0) {
        PyErr_Format(PyExc_ValueError, "align %zd is not a power of two", align);
        return NULL;
    }
    if (n < 0 || keep < 0 || keep > n || keep > PyByteArray_GET_SIZE(buffer)) {
        PyErr_Format(PyExc_ValueError, "keep %zd bytes of %zd in %zd", keep, PyByteArray_GET_SIZE(buffer), n);
        return NULL;
    }
    if (b->ob_exports > 0 && n != Py_SIZE(b)) {  /* as PyByteArray_Resize refuses it */
        PyErr_SetString(PyExc_BufferError, "Existing exports of data: object cannot be re-sized");
        return NULL;
    }
    if (n < align || fits_in_place(b, n, (size_t)align)) {
        if (PyByteArray_Resize(buffer, n) < 0) return NULL;
        Py_INCREF(buffer);
        return buffer;
    }
    PyObject *fresh = PyByteArray_FromStringAndSize(NULL, 0);
    if (fresh == NULL) return NULL;
    if (PyByteArray_Resize(fresh, n + align) < 0) goto fail;
    Py_ssize_t pad = (Py_ssize_t)((align - ((uintptr_t)PyByteArray_AS_STRING(fresh) & (align - 1))) & (align - 1));
    if (pad && PySequence_DelSlice(fresh, 0, pad) < 0) goto fail;
    if (PyByteArray_Resize(fresh, n) < 0) goto fail;
    if (keep) memcpy(PyByteArray_AS_STRING(fresh), PyByteArray_AS_STRING(buffer), (size_t)keep);
    return fresh;
fail:
    Py_DECREF(fresh);
    return NULL;
}

/* address(buffer): where a bytearray's first byte is (tests and the store
 * check alignment with it; no buffer export, so nothing is pinned). */
static PyObject *py_address(PyObject *self, PyObject *buffer) {
    if (!PyByteArray_Check(buffer)) {
        PyErr_SetString(PyExc_TypeError, "address of a bytearray");
        return NULL;
    }
    return PyLong_FromVoidPtr(PyByteArray_AS_STRING(buffer));
}

static PyMethodDef methods[] = {
    {"realign", py_realign, METH_VARARGS, "A bytearray of n bytes starting at an aligned address, not zeroed."},
    {"address", py_address, METH_O, "The address of a bytearray's first byte."},
    {"grow", py_grow, METH_VARARGS, "Resize a bytearray up without initialising the new bytes."},
    {"copy_runs", py_copy_runs, METH_VARARGS, "copy_spans into many destinations in one call."},
    {"copy_spans", py_copy_spans, METH_VARARGS, "Copy spans of a buffer one after the other into another."},
    {"join_spans", py_join_spans, METH_VARARGS, "Spans of a buffer, each behind a one-byte separator."},
    {"crc32_rows", py_crc32_rows, METH_VARARGS, "CRC-32 of the same span of every row of a 2-D buffer."},
    {"check_runs", py_check_runs, METH_VARARGS, "Validate many queues' runs of one window in one call."},
    {"check_run", py_check_run, METH_VARARGS, "Validate a run of records; returns how many lead the run."},
    {"set_crc32", py_set_crc32, METH_O, "Install the crc32(crc, buf, len) function at this address."},
    {"crc32", py_crc32, METH_O, "CRC-32 of a buffer through the installed function."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_runcheck", NULL, -1, methods};

PyMODINIT_FUNC PyInit__runcheck(void) { return PyModule_Create(&module); }
