/* The keys a segment's key index holds, found and hashed in C.
 *
 * keys(buf, starts, ends) does in one call what dispatcher.segment.batch_keys
 * followed by tiered.format.keyindex.hash_spans do with numpy: for each
 * record's properties buf[starts[i]:ends[i]] ("name \x01 value \x02 ..."),
 * each space-separated piece of the last KEYS value and the last UNIQ_KEY
 * value (empty pieces dropped), hashed with the version 2 key hash.
 *
 * Built at install when a C compiler is there (setup.py: an optional
 * extension); without it keyindex.record_key_hashes keeps the numpy path.
 * tests/tiered/test_keyscan.py holds the two to identical results.
 *
 * Why C: on the dispatch hot path the numpy version costs some twenty
 * array passes per window (joining the properties, a UTF-8 decode, name
 * matching, sorting out the last occurrences, splitting at spaces, one
 * gather per key length); here a record costs one validating pass over
 * its properties and one hash per key. The loops run without the GIL.
 *
 * Output order is the numpy path's: first the KEYS pieces of all records
 * (record by record, left to right), then the UNIQ_KEY values of all
 * records. Properties that are not UTF-8 (strictly, as Python decodes:
 * no overlongs, surrogates, code points past U+10FFFF or truncated
 * sequences) stop the call: it reports the first such record and the
 * byte inside its properties where the bad sequence starts.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define SEED 0xC2B2AE3D27D4EB4FULL
#define LEN_MUL 0x9E3779B97F4A7C15ULL
#define WORD_MUL 0x87C37B91114253D5ULL
#define ROUND_MUL 0x4CF5AD432745937FULL
#define FIN1 0xBF58476D1CE4E5B9ULL
#define FIN2 0x94D049BB133111EBULL

static inline uint64_t load_le64(const uint8_t *p, size_t n) {
    /* n <= 8 bytes, the rest zero: the hash's zero-padded last word */
    uint64_t v = 0;
    for (size_t i = 0; i < n; i++) v |= (uint64_t)p[i] << (8 * i);
    return v;
}

static inline uint64_t word_le64(const uint8_t *p) {
    uint64_t v;
    memcpy(&v, p, 8);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    v = __builtin_bswap64(v);
#endif
    return v;
}

static inline uint64_t round64(uint64_t h, uint64_t w) {
    h ^= w * WORD_MUL;
    h = (h << 31) | (h >> 33);
    return h * ROUND_MUL;
}

/* The version 2 key hash (tiered/format/keyindex.py: hash_spans). */
static uint64_t key_hash(const uint8_t *p, size_t len) {
    uint64_t h = ((uint64_t)len * LEN_MUL) ^ SEED;
    size_t i = 0;
    for (; i + 8 <= len; i += 8) h = round64(h, word_le64(p + i));
    if (i < len) h = round64(h, load_le64(p + i, len - i));
    h ^= h >> 30;
    h *= FIN1;
    h ^= h >> 27;
    h *= FIN2;
    h ^= h >> 31;
    return h;
}

/* Where the first byte that does not start a well-formed UTF-8 sequence
 * is (Unicode's table 3-7, which Python's strict decoder follows, and
 * whose error start is that byte), or -1 when all of p[0:n] is UTF-8. */
static int64_t utf8_error(const uint8_t *p, int64_t n) {
    int64_t i = 0;
    while (i < n) {
        /* ASCII, 8 bytes at a time: nearly all properties are */
        while (i + 8 <= n) {
            uint64_t w;
            memcpy(&w, p + i, 8);
            if (w & 0x8080808080808080ULL) break;
            i += 8;
        }
        if (i >= n) break;
        uint8_t c = p[i];
        if (c < 0x80) { i++; continue; }
        int need;
        uint8_t lo = 0x80, hi = 0xBF;  /* the second byte's range */
        if (c >= 0xC2 && c <= 0xDF) need = 1;
        else if (c >= 0xE0 && c <= 0xEF) {
            need = 2;
            if (c == 0xE0) lo = 0xA0;          /* overlong */
            else if (c == 0xED) hi = 0x9F;     /* surrogates */
        } else if (c >= 0xF0 && c <= 0xF4) {
            need = 3;
            if (c == 0xF0) lo = 0x90;          /* overlong */
            else if (c == 0xF4) hi = 0x8F;     /* past U+10FFFF */
        } else return i;                        /* continuation, C0, C1, F5-FF */
        if (i + need >= n) return i;  /* truncated by the end */
        if (p[i + 1] < lo || p[i + 1] > hi) return i;
        for (int k = 2; k <= need; k++)
            if ((p[i + k] & 0xC0) != 0x80) return i;
        i += need + 1;
    }
    return -1;
}

typedef struct {
    int64_t keys_at, keys_end;  /* the last KEYS value, keys_at -1 when none */
    int64_t uniq_at, uniq_end;  /* the last UNIQ_KEY value, uniq_at -1 when none */
} found_t;

static const uint8_t KEYS_NAME[5] = {'K', 'E', 'Y', 'S', 1};
static const uint8_t UNIQ_NAME[9] = {'U', 'N', 'I', 'Q', '_', 'K', 'E', 'Y', 1};

/* The last KEYS and UNIQ_KEY values of the properties at buf[s:e]
 * (absolute offsets into buf). Every property starts at s or after a
 * \x02; a value ends at the next \x02 or at e. */
static void find_values(const uint8_t *buf, int64_t s, int64_t e, found_t *f) {
    f->keys_at = f->uniq_at = -1;
    f->keys_end = f->uniq_end = -1;
    int64_t pos = s;
    for (;;) {
        int64_t left = e - pos;
        const uint8_t *sep = left > 0 ? memchr(buf + pos, 2, (size_t)left) : NULL;
        int64_t end = sep != NULL ? (int64_t)(sep - buf) : e;  /* of this property */
        /* a name holds no \x02, so a match lies before this property's end */
        if (end - pos >= 5 && memcmp(buf + pos, KEYS_NAME, 5) == 0) {
            f->keys_at = pos + 5;
            f->keys_end = end;
        } else if (end - pos >= 9 && memcmp(buf + pos, UNIQ_NAME, 9) == 0) {
            f->uniq_at = pos + 9;
            f->uniq_end = end;
        }
        if (sep == NULL) return;
        pos = end + 1;
    }
}

static Py_ssize_t keys_pieces(const uint8_t *buf, int64_t at, int64_t end) {
    Py_ssize_t n = 0;
    int64_t piece = at;
    for (int64_t i = at; i <= end; i++) {
        if (i == end || buf[i] == ' ') {
            n += i > piece;
            piece = i + 1;
        }
    }
    return n;
}

/* Pass one, without the GIL: each record's values, checking the spans'
 * bounds and the UTF-8; counts the keys. Returns 0, or -1 for a span
 * outside the buffer (record *bad), or 1 for properties not UTF-8
 * (record *bad, at byte *bad_at of them). */
static int scan(const uint8_t *buf, int64_t len, const int64_t *s, const int64_t *e, Py_ssize_t n,
                found_t *found, Py_ssize_t *nkeys, Py_ssize_t *bad, int64_t *bad_at) {
    Py_ssize_t count = 0;
    for (Py_ssize_t r = 0; r < n; r++) {
        int64_t start = s[r], end = e[r];  /* read once: the arrays are the caller's */
        if (start < 0 || end < start || end > len) { *bad = r; *bad_at = 0; return -1; }
        int64_t err = utf8_error(buf + start, end - start);
        if (err >= 0) { *bad = r; *bad_at = err; return 1; }
        found_t *f = &found[r];
        find_values(buf, start, end, f);
        if (f->keys_at >= 0) count += keys_pieces(buf, f->keys_at, f->keys_end);
        if (f->uniq_at >= 0) count += f->uniq_end > f->uniq_at;
    }
    *nkeys = count;
    return 0;
}

/* Pass two, without the GIL: the keys' owners and hashes, in the numpy
 * path's order (all KEYS pieces, then all UNIQ_KEY values). */
static void emit(const uint8_t *buf, const found_t *found, Py_ssize_t n, int64_t *owners, uint64_t *hashes) {
    Py_ssize_t k = 0;
    for (Py_ssize_t r = 0; r < n; r++) {
        const found_t *f = &found[r];
        if (f->keys_at < 0) continue;
        int64_t piece = f->keys_at;
        for (int64_t i = f->keys_at; i <= f->keys_end; i++) {
            if (i == f->keys_end || buf[i] == ' ') {
                if (i > piece) {
                    owners[k] = r;
                    hashes[k++] = key_hash(buf + piece, (size_t)(i - piece));
                }
                piece = i + 1;
            }
        }
    }
    for (Py_ssize_t r = 0; r < n; r++) {
        const found_t *f = &found[r];
        if (f->uniq_at < 0 || f->uniq_end <= f->uniq_at) continue;
        owners[k] = r;
        hashes[k++] = key_hash(buf + f->uniq_at, (size_t)(f->uniq_end - f->uniq_at));
    }
}

static void release_all(Py_buffer *views, int n) {
    for (int k = 0; k < n; k++) PyBuffer_Release(&views[k]);
}

/* keys(buf, starts, ends) -> (owners, hashes, bad_record, bad_at):
 * owners (int64) and hashes (uint64) as bytearrays, native byte order,
 * bad_record -1; or, for properties not UTF-8, empty outputs and the first
 * such record with the byte inside its properties. starts and ends are
 * int64 buffers of one length. */
static PyObject *py_keys(PyObject *self, PyObject *args) {
    PyObject *objs[3];
    if (!PyArg_ParseTuple(args, "OOO", &objs[0], &objs[1], &objs[2])) return NULL;
    Py_buffer views[3];
    int got = 0;
    for (; got < 3; got++)
        if (PyObject_GetBuffer(objs[got], &views[got], PyBUF_SIMPLE) < 0) { release_all(views, got); return NULL; }
    if (views[1].len != views[2].len || views[1].len % 8 != 0) {
        release_all(views, 3);
        PyErr_SetString(PyExc_ValueError, "starts and ends must be int64 arrays of one length");
        return NULL;
    }
    const uint8_t *buf = (const uint8_t *)views[0].buf;
    const int64_t *s = (const int64_t *)views[1].buf, *e = (const int64_t *)views[2].buf;
    Py_ssize_t n = views[1].len / 8, nkeys = 0, bad = -1;
    int64_t bad_at = 0;
    found_t *found = (found_t *)malloc(sizeof(found_t) * (size_t)(n ? n : 1));
    if (found == NULL) { release_all(views, 3); return PyErr_NoMemory(); }
    int status;
    Py_BEGIN_ALLOW_THREADS
    status = scan(buf, (int64_t)views[0].len, s, e, n, found, &nkeys, &bad, &bad_at);
    Py_END_ALLOW_THREADS
    if (status < 0) {
        PyErr_Format(PyExc_ValueError, "span %zd outside a buffer of %zd bytes", bad, views[0].len);
        free(found);
        release_all(views, 3);
        return NULL;
    }
    if (status > 0) nkeys = 0;
    PyObject *owners = PyByteArray_FromStringAndSize(NULL, nkeys * 8);
    PyObject *hashes = owners != NULL ? PyByteArray_FromStringAndSize(NULL, nkeys * 8) : NULL;
    if (hashes == NULL) {
        Py_XDECREF(owners);
        free(found);
        release_all(views, 3);
        return NULL;
    }
    if (status == 0 && nkeys) {
        int64_t *o = (int64_t *)PyByteArray_AS_STRING(owners);
        uint64_t *h = (uint64_t *)PyByteArray_AS_STRING(hashes);
        /* the bytearrays are ours alone until returned */
        Py_BEGIN_ALLOW_THREADS
        emit(buf, found, n, o, h);
        Py_END_ALLOW_THREADS
    }
    free(found);
    release_all(views, 3);
    return Py_BuildValue("(NNnL)", owners, hashes, status > 0 ? bad : (Py_ssize_t)-1, (long long)bad_at);
}

/* key_hash(data) -> int: the version 2 hash of one key's bytes. */
static PyObject *py_key_hash(PyObject *self, PyObject *args) {
    Py_buffer view;
    if (!PyArg_ParseTuple(args, "y*", &view)) return NULL;
    uint64_t h = key_hash((const uint8_t *)view.buf, (size_t)view.len);
    PyBuffer_Release(&view);
    return PyLong_FromUnsignedLongLong(h);
}

static PyMethodDef methods[] = {
    {"keys", py_keys, METH_VARARGS, "The records' keys (owner, version 2 hash), or the first bad record."},
    {"key_hash", py_key_hash, METH_VARARGS, "The version 2 key hash of one key's bytes."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_keyscan", NULL, -1, methods};

PyMODINIT_FUNC PyInit__keyscan(void) { return PyModule_Create(&module); }
