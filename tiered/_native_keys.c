/* The keys a segment's key index holds, found and hashed in C.
 *
 * keys(buf, starts, ends) does in one call what keyindex.batch_keys followed
 * by keyindex.hash_spans do with numpy (tiered/format/keyindex.py): for each
 * record's properties buf[starts[i]:ends[i]] ("name \x01 value \x02 ..."),
 * each space-separated piece of the last KEYS value and the last UNIQ_KEY
 * value (empty pieces dropped), hashed with the version 2 key hash.
 *
 * Part of the native core (tiered._native, setup.py: an optional
 * extension); without it keyindex.record_key_hashes keeps the numpy path.
 * tests/format/test_keyscan.py holds the two to identical results.
 *
 * Why C: on the dispatch hot path the numpy version costs some twenty
 * array passes per window (joining the properties, a UTF-8 decode, name
 * matching, sorting out the last occurrences, splitting at spaces, one
 * gather per key length); here a record is read once, while it is in
 * cache: its properties validated, its two values found, its keys hashed
 * (some 35 ns a record against numpy's 320). The loop runs without the GIL.
 *
 * Output order is the numpy path's: first the KEYS pieces of all records
 * (record by record, left to right), then the UNIQ_KEY values of all
 * records. Properties that are not UTF-8 (strictly, as Python decodes:
 * no overlongs, surrogates, code points past U+10FFFF or truncated
 * sequences) stop the call: it reports the first such record and the
 * byte inside its properties where the bad sequence starts.
 */
#include "_native.h"
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

/* Keys found so far: owners and hashes, grown as needed (how many keys a
 * window holds is known only once its properties are read; counting them
 * first would read every record twice, the second time from memory
 * rather than cache). */
typedef struct {
    int64_t *owners;
    uint64_t *hashes;
    size_t n, cap;
} keys_t;

static int push(keys_t *k, int64_t owner, uint64_t hash) {
    if (k->n == k->cap) {
        size_t cap = k->cap ? 2 * k->cap : 1024;
        int64_t *owners = (int64_t *)realloc(k->owners, cap * sizeof(int64_t));
        if (owners == NULL) return -1;
        k->owners = owners;
        uint64_t *hashes = (uint64_t *)realloc(k->hashes, cap * sizeof(uint64_t));
        if (hashes == NULL) return -1;
        k->hashes = hashes;
        k->cap = cap;
    }
    k->owners[k->n] = owner;
    k->hashes[k->n++] = hash;
    return 0;
}

/* Each space-separated piece of buf[at:end], empty ones dropped. */
static int push_pieces(keys_t *k, int64_t owner, const uint8_t *buf, int64_t at, int64_t end) {
    int64_t piece = at;
    for (int64_t i = at; i <= end; i++) {
        if (i == end || buf[i] == ' ') {
            if (i > piece && push(k, owner, key_hash(buf + piece, (size_t)(i - piece))) < 0) return -1;
            piece = i + 1;
        }
    }
    return 0;
}

enum { SCAN_OK = 0, SCAN_NOT_UTF8 = 1, SCAN_OUTSIDE = 2, SCAN_NO_MEMORY = 3 };

/* One pass, without the GIL: each record's properties checked and their
 * keys hashed while they are in cache. The KEYS pieces go to keys, the
 * UNIQ_KEY values to uniq (the numpy path's order puts all of these
 * after all of those). For SCAN_NOT_UTF8 and SCAN_OUTSIDE, *bad is the
 * record (and *bad_at the byte of its properties where UTF-8 fails). */
static int scan(const uint8_t *buf, int64_t len, const int64_t *s, const int64_t *e, Py_ssize_t n,
                keys_t *keys, keys_t *uniq, Py_ssize_t *bad, int64_t *bad_at) {
    for (Py_ssize_t r = 0; r < n; r++) {
        int64_t start = s[r], end = e[r];  /* read once: the arrays are the caller's */
        if (start < 0 || end < start || end > len) { *bad = r; return SCAN_OUTSIDE; }
        int64_t err = utf8_error(buf + start, end - start);
        if (err >= 0) { *bad = r; *bad_at = err; return SCAN_NOT_UTF8; }
        found_t f;
        find_values(buf, start, end, &f);
        if (f.keys_at >= 0 && push_pieces(keys, r, buf, f.keys_at, f.keys_end) < 0) return SCAN_NO_MEMORY;
        if (f.uniq_at >= 0 && f.uniq_end > f.uniq_at
                && push(uniq, r, key_hash(buf + f.uniq_at, (size_t)(f.uniq_end - f.uniq_at))) < 0)
            return SCAN_NO_MEMORY;
    }
    return SCAN_OK;
}

static void release_all(Py_buffer *views, int n) {
    for (int k = 0; k < n; k++) PyBuffer_Release(&views[k]);
}

/* The two key lists one after the other, into a new bytearray. */
static PyObject *joined(const void *first, const void *second, size_t n1, size_t n2) {
    PyObject *out = PyByteArray_FromStringAndSize(NULL, (Py_ssize_t)((n1 + n2) * 8));
    if (out == NULL) return NULL;
    char *to = PyByteArray_AS_STRING(out);
    if (n1) memcpy(to, first, n1 * 8);
    if (n2) memcpy(to + n1 * 8, second, n2 * 8);
    return out;
}

/* keys(buf, starts, ends) -> (owners, hashes, bad_record, bad_at):
 * owners (int64) and hashes (uint64) as bytearrays, native byte order,
 * bad_record -1; or, for properties not UTF-8, empty outputs and the first
 * such record with the byte inside its properties. starts and ends are
 * int64 buffers of one length. */
static PyObject *py_keys(PyObject *self, PyObject *args) {
    (void)self;
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
    Py_ssize_t bad = -1;
    int64_t bad_at = 0;
    keys_t keys = {NULL, NULL, 0, 0}, uniq = {NULL, NULL, 0, 0};
    int status;
    Py_BEGIN_ALLOW_THREADS
    status = scan((const uint8_t *)views[0].buf, (int64_t)views[0].len, (const int64_t *)views[1].buf,
                  (const int64_t *)views[2].buf, views[1].len / 8, &keys, &uniq, &bad, &bad_at);
    Py_END_ALLOW_THREADS
    Py_ssize_t buf_len = views[0].len;
    release_all(views, 3);
    PyObject *owners = NULL, *hashes = NULL;
    if (status == SCAN_OUTSIDE)
        PyErr_Format(PyExc_ValueError, "span %zd outside a buffer of %zd bytes", bad, buf_len);
    else if (status == SCAN_NO_MEMORY)
        PyErr_NoMemory();
    else {
        size_t n1 = status == SCAN_OK ? keys.n : 0, n2 = status == SCAN_OK ? uniq.n : 0;
        owners = joined(keys.owners, uniq.owners, n1, n2);
        hashes = owners != NULL ? joined(keys.hashes, uniq.hashes, n1, n2) : NULL;
    }
    free(keys.owners); free(keys.hashes); free(uniq.owners); free(uniq.hashes);
    if (hashes == NULL) {
        Py_XDECREF(owners);
        return NULL;
    }
    return Py_BuildValue("(NNnL)", owners, hashes, status == SCAN_NOT_UTF8 ? bad : (Py_ssize_t)-1,
                         (long long)bad_at);
}

/* key_hash(data) -> int: the version 2 hash of one key's bytes. */
static PyObject *py_key_hash(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer view;
    if (!PyArg_ParseTuple(args, "y*", &view)) return NULL;
    uint64_t h = key_hash((const uint8_t *)view.buf, (size_t)view.len);
    PyBuffer_Release(&view);
    return PyLong_FromUnsignedLongLong(h);
}

/* tiered._native's key functions (the module is made in _native.c). */
PyMethodDef tiered_native_key_methods[] = {
    {"keys", py_keys, METH_VARARGS, "The records' keys (owner, version 2 hash), or the first bad record."},
    {"key_hash", py_key_hash, METH_VARARGS, "The version 2 key hash of one key's bytes."},
    {NULL, NULL, 0, NULL},
};
