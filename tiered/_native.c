/* The checks of tiered.format.batch.check_run, one record at a time in C.
 *
 * Built at install when a C compiler is there (pyproject.toml: an optional
 * extension); without it check_run keeps its numpy path, which makes the
 * same decisions. The two are held equal by tests/format/test_runcheck.py.
 *
 * Why C: in Python every record costs at least one call through the
 * interpreter (the body CRC over a memoryview slice, ~180 ns here), more
 * than a raw read of the record's bytes costs. Here a record costs its
 * CRC (linked at build time, below) and a few loads. The loop runs
 * without the GIL. check_copy_runs, the CommitLog pass's call, also copies
 * each record into its segment, checks it there and keeps the segment's
 * CRC-32, a window cut over POSIX threads.
 *
 * Layout (big-endian; tiered/format/codec.py):
 *   0 size i32 | 4 magic u32 | 8 body crc i32 | 12 queue id i32 | 16 flag i32
 *   20 queue offset i64 | 28 physical offset i64 | 36 sys flag i32
 *   40 born ts i64 | 48 born host (8, IPv6 20) | store ts i64 | store host
 *   (8, IPv6 20) | reconsume i32 | prepared i64 | body length i32 | body
 *   | topic length (v1 u8, v2 u16) | topic | properties length i16 | props
 * ConsumeQueue entry: phys i64 | size i32 | tags code i64 (20 bytes).
 */
#include "_native.h"
#include <stdint.h>
#include <string.h>
#include <pthread.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

/* CRC-32 (zlib's polynomial: the broker's body CRC), linked at build time:
 * ISA-L's folding crc32_gzip_refl where setup.py found the library (SIMD,
 * about four times zlib's table CRC here), else zlib's own crc32. Either
 * continues a CRC as zlib's does; crc32_combine is zlib's in both (it
 * works on CRCs, not on bytes). */
#include <zlib.h>
#ifdef TIERED_CRC_ISAL
#include <isa-l/crc.h>
#define CRC_LIBRARY "isa-l"
static inline uint32_t crc32_impl(uint32_t crc, const uint8_t *buf, uint32_t len) {
    return crc32_gzip_refl(crc, buf, len);
}
#else
#define CRC_LIBRARY "zlib"
static inline uint32_t crc32_impl(uint32_t crc, const uint8_t *buf, uint32_t len) {
    return (uint32_t)crc32(crc, buf, len);
}
#endif
static inline uint32_t crc32_combine_impl(uint32_t crc1, uint32_t crc2, int64_t len2) {
    return (uint32_t)crc32_combine(crc1, crc2, (z_off_t)len2);
}

#define FIXED_V4 88      /* the fixed part when both hosts are IPv4 */
#define BORN_HOST_AT 48
#define AFTER_STORE_HOST 16  /* reconsume i32, prepared i64, body length i32 */
#define CQ_ENTRY 20
#define CRC_MASK 0x7FFFFFFFu
#define OUTPUTS 6

/* big-endian fields, whatever the machine's order */
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
#define FROM_BE64(v) (v)
#define FROM_BE32(v) (v)
#else
#define FROM_BE64(v) __builtin_bswap64(v)
#define FROM_BE32(v) __builtin_bswap32(v)
#endif

static inline uint64_t load64(const uint8_t *p) {
    uint64_t v;
    memcpy(&v, p, 8);
    return FROM_BE64(v);
}

static inline uint32_t load32(const uint8_t *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return FROM_BE32(v);
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
    int check_phys;           /* 0: the archive's re-packed CommitLog (records keep the broker's offsets) */
    int64_t *out[OUTPUTS];    /* positions, sizes, tags, store ms, born ms, props at */
} run_t;

/* Whether the record at ``rec`` (``size`` bytes: its ConsumeQueue entry's,
 * at least the fixed part and the run's tail) is plainly valid as entry
 * ``phys`` of queue offset ``offset``: every check of check_run. Its store
 * timestamp and where its properties start (from the record's first byte)
 * go to *store_ms and *props_at. ``rec`` is the mapped CommitLog
 * (check_run) or the copy just made of it (check_copy_runs). */
static inline int record_ok(const run_t *run, const uint8_t *rec, int64_t size, int64_t phys, int64_t offset,
                            int64_t *store_ms, int64_t *props_at) {
    const int64_t topic_part = run->tail_len - 2;
    if ((int32_t)load32(rec) != size || load32(rec + 4) != run->magic
        || (int32_t)load32(rec + 12) != run->queue_id
        || (int64_t)load64(rec + 20) != offset || (run->check_phys && (int64_t)load64(rec + 28) != phys))
        return 0;
    const uint32_t sys_flag = load32(rec + 36);
    int64_t store_at = BORN_HOST_AT + 8, body_at = FIXED_V4;
    if (sys_flag & 0x30) {  /* IPv6 hosts move the fields behind them */
        store_at = BORN_HOST_AT + ((sys_flag & 0x10) ? 20 : 8);
        body_at = store_at + 8 + ((sys_flag & 0x20) ? 20 : 8) + AFTER_STORE_HOST;
        if (body_at + run->tail_len > size) return 0;
    }
    const int64_t body_len = (int32_t)load32(rec + body_at - 4);
    const int64_t body_end = body_at + body_len;
    if (body_len < 0 || body_end + run->tail_len > size) return 0;
    if (run->verify_crc) {
        const uint32_t crc = crc32_impl(0, rec + body_at, (uint32_t)body_len) & CRC_MASK;
        if ((int64_t)crc != (int64_t)(int32_t)load32(rec + 8)) return 0;
    }
    const uint8_t *tail = rec + body_end;
    if (memcmp(tail, run->tail, (size_t)topic_part) != 0) return 0;
    const int64_t props_len = ((int64_t)tail[topic_part] << 8) | tail[topic_part + 1];
    const int64_t props_from = body_end + run->tail_len;
    if (props_len >= 0x8000 || props_from + props_len != size) return 0;
    *store_ms = (int64_t)load64(rec + store_at);
    *props_at = props_from;
    return 1;
}

/* Whether entry ``size``/``pos`` can name a record of the run inside the
 * view at all: the first check, before any byte of the record is read. */
static inline int inside_view(const run_t *run, int64_t size, int64_t pos) {
    /* the caller keeps runs inside the view; checked anyway: never read outside it */
    return size >= FIXED_V4 + run->tail_len && pos >= 0 && pos <= run->len - size;
}

/* Record i's answers into the outputs (it passed record_ok). */
static inline void answer(const run_t *run, Py_ssize_t i, const uint8_t *entry, const uint8_t *rec, int64_t pos,
                          int64_t size, int64_t store_ms, int64_t props_at) {
    run->out[0][i] = pos;
    run->out[1][i] = size;
    run->out[2][i] = (int64_t)load64(entry + 12);
    run->out[3][i] = store_ms;
    run->out[4][i] = (int64_t)load64(rec + 40);
    run->out[5][i] = pos + props_at;
}

/* How many leading entries are plainly valid records; fills the outputs. */
static Py_ssize_t check(const run_t *run) {
    Py_ssize_t i;
    for (i = 0; i < run->count; i++) {
        const uint8_t *entry = run->entries + i * CQ_ENTRY;
        const int64_t phys = (int64_t)load64(entry);
        const int64_t size = (int32_t)load32(entry + 8);
        const int64_t pos = phys - run->base;
        if (!inside_view(run, size, pos)) break;
        const uint8_t *rec = run->buf + pos;
        int64_t store_ms, props_at;
        if (!record_ok(run, rec, size, phys, run->first_offset + i, &store_ms, &props_at)) break;
        answer(run, i, entry, rec, pos, size, store_ms, props_at);
    }
    return i;
}

static void release_all(Py_buffer *views, int n) {
    for (int k = 0; k < n; k++) PyBuffer_Release(&views[k]);
}

/* check_run(view, base, entries, tail, magic, queue_id, first_offset,
 *           verify_crc, check_phys, out) -> count
 * ``tail``: topic length + topic bytes; ``out``: a writable int64 buffer of
 * 6 x len(entries) items (positions, sizes, tags, store ms, born ms, props at). */
static PyObject *py_check_run(PyObject *self, PyObject *args) {
    PyObject *view_obj, *entries_obj, *tail_obj, *out_obj;
    long long base, first_offset;
    unsigned long magic;
    int queue_id, verify_crc, check_phys;
    if (!PyArg_ParseTuple(args, "OLOOkiLppO", &view_obj, &base, &entries_obj, &tail_obj, &magic, &queue_id,
                          &first_offset, &verify_crc, &check_phys, &out_obj))
        return NULL;
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
    run.check_phys = check_phys;
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

/* ---- check_copy_runs: check, copy and CRC a window's runs, on several threads ----
 *
 * The CommitLog pass's one call a window. Each run's records are copied
 * into the run's destination (its queue's segment buffer) one after the
 * other, each checked on the copy just made, hot in the cache (every check
 * of check_run, the same decisions: the bytes checked are the bytes
 * kept), and the CRC-32 of the destination is continued over each record
 * it keeps, so nothing reads the segment again for its CRC. A record that
 * fails a check is not counted; the bytes copied past a run's last kept
 * record are left in the destination, undefined (the caller hands out
 * only the bytes counted).
 *
 * On several threads: the window's bytes are cut into pieces of whole
 * records, a run cut wherever its bytes reach a piece's share (at 16
 * queues a window holds a few runs of many MiB). A record's place in the
 * destination is the sum of the sizes before it, known from the entries
 * before any record is read; a piece's CRC starts from 0 and is combined
 * (crc32_combine) behind the pieces before it. A piece that stops short
 * ends its run there: the pieces after it are discarded, skipped when not
 * begun. */
#define COPY_FIELDS 11
#define MAX_THREADS 64
#define PIECES_PER_THREAD 4  /* pieces are taken in turn: a slow one holds no thread idle for long */
#define PREFETCH_BYTES 4096
#define MIN_PIECE (256 << 10)
#define MIN_THREAD_BYTES (1 << 20)  /* below this a thread costs more to start than it saves */

typedef struct {
    run_t run;
    uint8_t *dst;             /* where its first record goes */
    int64_t planned;          /* leading entries inside the view: no record past them can be kept */
    uint32_t crc;             /* of the destination's bytes before its next record */
    int64_t done, done_bytes; /* entries kept so far (the stretches before), and their bytes */
    int64_t limit;            /* entries up to this one are taken in the current stretch */
    int ended;                /* a record it could not keep ended it */
    int64_t first_piece, pieces;
    int64_t stopped;          /* the first of its pieces that stopped short (atomic), or INT64_MAX */
} copy_run_t;

typedef struct {
    int64_t run;
    int64_t lo, hi;           /* entries of the run */
    int64_t at;               /* bytes of the run's destination before its first record */
    int64_t index;            /* among its run's pieces */
    int64_t kept, bytes;      /* answers: records kept, their bytes */
    uint32_t crc;             /* of those bytes, from 0 (the first piece of a run: from the run's CRC) */
} piece_t;

typedef struct {
    copy_run_t *runs;
    piece_t *pieces;
    int64_t count;
    int64_t next;             /* the next piece to take (atomic) */
} copy_job_t;

static void copy_piece(copy_run_t *cr, piece_t *p) {
    const run_t *run = &cr->run;
    uint8_t *const start = cr->dst + p->at;
    uint8_t *d = start;
    uint32_t crc = p->index == 0 ? cr->crc : 0;
    Py_ssize_t i, next = (Py_ssize_t)p->lo;  /* the first record not prefetched */
    int64_t ahead = 0;                        /* bytes prefetched, from record i */
    for (i = (Py_ssize_t)p->lo; i < (Py_ssize_t)p->hi; i++) {
        const uint8_t *entry = run->entries + i * CQ_ENTRY;
        const int64_t phys = (int64_t)load64(entry);
        const int64_t size = (int32_t)load32(entry + 8);
        const int64_t pos = phys - run->base;
        if (!inside_view(run, size, pos)) break;  /* never: pieces end at ``planned`` */
        /* the records ahead asked for: the source is read once, from memory, its
         * lines not next to each other when queues interleave (no stream the
         * hardware prefetcher follows across pages) */
        for (ahead -= size; ahead < PREFETCH_BYTES && next < (Py_ssize_t)p->hi; next++) {
            const uint8_t *e = run->entries + next * CQ_ENTRY;
            const int64_t at = (int64_t)load64(e) - run->base, n = (int32_t)load32(e + 8);
            if (at < 0 || n <= 0 || at > run->len - n) break;
            for (int64_t o = 0; o < n; o += 64) __builtin_prefetch(run->buf + at + o, 0, 0);
            ahead += n;
        }
        memcpy(d, run->buf + pos, (size_t)size);
        int64_t store_ms, props_at;
        if (!record_ok(run, d, size, phys, run->first_offset + i, &store_ms, &props_at)) break;
        answer(run, i, entry, d, pos, size, store_ms, props_at);
        crc = crc32_impl(crc, d, (uint32_t)size);
        d += size;
    }
    p->kept = i - p->lo;
    p->bytes = d - start;
    p->crc = crc;
    if (p->kept < p->hi - p->lo) {  /* the run ends here: its later pieces need not be done */
        int64_t seen = __atomic_load_n(&cr->stopped, __ATOMIC_RELAXED);
        while (p->index < seen
               && !__atomic_compare_exchange_n(&cr->stopped, &seen, p->index, 0, __ATOMIC_RELAXED, __ATOMIC_RELAXED))
            ;
    }
}

static void *copy_worker(void *arg) {
    copy_job_t *job = arg;
    for (;;) {
        const int64_t n = __atomic_fetch_add(&job->next, 1, __ATOMIC_RELAXED);
        if (n >= job->count) break;
        piece_t *p = &job->pieces[n];
        copy_run_t *cr = &job->runs[p->run];
        if (__atomic_load_n(&cr->stopped, __ATOMIC_RELAXED) < p->index) {
            p->kept = p->bytes = 0;  /* behind a piece that stopped short: never combined */
            continue;
        }
        copy_piece(cr, p);
    }
    return NULL;
}

/* Each run's stretch from its pieces, in order, up to the first that
 * stopped short (which ends the run), added to what the run kept before. */
static void combine_pieces(const copy_job_t *job, Py_ssize_t nruns) {
    for (Py_ssize_t r = 0; r < nruns; r++) {
        copy_run_t *cr = &job->runs[r];
        int64_t kept = 0, bytes = 0;
        uint32_t crc = cr->crc;
        for (int64_t n = cr->first_piece; n < cr->first_piece + cr->pieces; n++) {
            const piece_t *p = &job->pieces[n];
            crc = p->index == 0 ? p->crc : crc32_combine_impl(crc, p->crc, p->bytes);
            kept += p->kept;
            bytes += p->bytes;
            if (p->kept < p->hi - p->lo) {
                cr->ended = 1;
                break;
            }
        }
        cr->crc = crc;
        cr->done += kept;
        cr->done_bytes += bytes;
    }
}

/* The runs' entries of the current stretch (``done`` to ``limit``) cut into
 * pieces of about ``target`` bytes; returns the count. */
static int64_t cut_pieces(copy_run_t *runs, Py_ssize_t nruns, int64_t target, piece_t *pieces) {
    int64_t n = 0;
    for (Py_ssize_t r = 0; r < nruns; r++) {
        copy_run_t *cr = &runs[r];
        cr->first_piece = n;
        int64_t lo = cr->done, at = cr->done_bytes, acc = 0;
        for (int64_t i = cr->done; i < cr->limit; i++) {
            acc += (int32_t)load32(cr->run.entries + i * CQ_ENTRY + 8);
            if (acc >= target || i + 1 == cr->limit) {
                pieces[n] = (piece_t){.run = r, .lo = lo, .hi = i + 1, .at = at, .index = n - cr->first_piece};
                n++;
                lo = i + 1;
                at += acc;
                acc = 0;
            }
        }
        cr->pieces = n - cr->first_piece;
        cr->stopped = INT64_MAX;
    }
    return n;
}

typedef struct {
    copy_job_t *job;
    int64_t cpu_ns;           /* the thread's CPU time, when it is done */
} helper_t;

static void *helper_thread(void *arg) {
    helper_t *h = arg;
    copy_worker(h->job);
    struct timespec t;
    if (clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t) == 0) h->cpu_ns = (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
    return NULL;
}

/* The pieces done by ``threads`` threads, this one included; returns the
 * CPU time of the others (a thread's own clock does not count them). */
static int64_t run_pieces(copy_job_t *job, int threads) {
    pthread_t ids[MAX_THREADS];
    helper_t helpers[MAX_THREADS];
    int started = 0;
    for (; started < threads - 1; started++) {
        helpers[started] = (helper_t){.job = job, .cpu_ns = 0};
        if (pthread_create(&ids[started], NULL, helper_thread, &helpers[started]) != 0)
            break;  /* fewer: the others take more pieces */
    }
    copy_worker(job);
    int64_t cpu_ns = 0;
    for (int t = 0; t < started; t++) {
        pthread_join(ids[t], NULL);
        cpu_ns += helpers[t].cpu_ns;
    }
    return cpu_ns;
}

/* Run ``row`` of the table (checked) set up over ``views`` (view, entries,
 * tails, table, out), with how many of its leading entries name a record
 * inside the view; returns their bytes, the room its destination needs. */
static int64_t plan_run(copy_run_t *cr, const int64_t *row, const Py_buffer *views, int64_t base, int verify_crc,
                        Py_ssize_t count) {
    run_t *one = &cr->run;
    one->buf = views[0].buf;
    one->len = views[0].len;
    one->base = base;
    one->entries = (const uint8_t *)views[1].buf + row[0] * CQ_ENTRY;
    one->count = (Py_ssize_t)row[1];
    one->tail = (const uint8_t *)views[2].buf + row[5];
    one->tail_len = row[6] + 2;
    one->magic = (uint32_t)row[4];
    one->queue_id = (int32_t)row[2];
    one->first_offset = row[3];
    one->verify_crc = verify_crc;
    one->check_phys = 1;
    for (int k = 0; k < OUTPUTS; k++) one->out[k] = (int64_t *)views[4].buf + k * count + row[0];
    cr->crc = (uint32_t)row[9];
    int64_t need = 0;
    /* as check_run: no record is plainly valid in a view shorter than a fixed part */
    if (one->len >= FIXED_V4)
        for (; cr->planned < one->count; cr->planned++) {
            const uint8_t *entry = one->entries + cr->planned * CQ_ENTRY;
            const int64_t size = (int32_t)load32(entry + 8);
            if (!inside_view(one, size, (int64_t)load64(entry) - base)) break;
            need += size;
        }
    return need;
}

/* The threads for a window of ``total`` bytes (at most ``threads``) and the
 * bytes a piece (``piece`` when given, else a share of the window). */
static int piece_plan(int64_t total, int threads, int64_t piece, int64_t *target) {
    if (threads > MAX_THREADS) threads = MAX_THREADS;
    if (piece <= 0 && threads > total / MIN_THREAD_BYTES) threads = (int)(total / MIN_THREAD_BYTES);
    if (threads < 1) threads = 1;
    /* one thread: a piece a run, whole; else about PIECES_PER_THREAD pieces a thread */
    *target = piece > 0 ? piece : threads == 1 ? INT64_MAX : total / (threads * PIECES_PER_THREAD);
    if (piece <= 0 && *target < MIN_PIECE) *target = MIN_PIECE;
    return threads;
}

/* The leading entries of the run's remaining ones whose records end by
 * ``end`` (bytes of the view). */
static int64_t stretch_limit(const copy_run_t *cr, int64_t end) {
    int64_t i = cr->done;
    for (; i < cr->planned; i++) {
        const uint8_t *entry = cr->run.entries + i * CQ_ENTRY;
        if ((int64_t)load64(entry) - cr->run.base + (int32_t)load32(entry + 8) > end) break;
    }
    return i;
}

/* One stretch: each run's entries up to its limit, cut over the threads. */
static int64_t copy_stretch(copy_job_t *job, Py_ssize_t nruns, int threads, int64_t piece) {
    int64_t total = 0, target, helpers_ns = 0;
    for (Py_ssize_t r = 0; r < nruns; r++) {
        const copy_run_t *cr = &job->runs[r];
        for (int64_t i = cr->done; i < cr->limit; i++)
            total += (int32_t)load32(cr->run.entries + i * CQ_ENTRY + 8);
    }
    threads = piece_plan(total, threads, piece, &target);
    job->count = cut_pieces(job->runs, nruns, target, job->pieces);
    job->next = 0;
    if (threads > job->count) threads = job->count > 0 ? (int)job->count : 1;
    if (threads > 1)
        helpers_ns = run_pieces(job, threads);
    else
        copy_worker(job);
    combine_pieces(job, nruns);
    return helpers_ns;
}

/* The window in stretches of ``release`` bytes of the view, in order, each
 * stretch's pages given back behind it (MADV_DONTNEED: the view must be a
 * read-only shared mapping of a file, whose pages stay in the page cache);
 * ``release`` <= 0: the window in one stretch, nothing given back. A run's
 * records are in the stretch where they end; what it kept carries over. */
static int64_t copy_stretches(copy_job_t *job, Py_ssize_t nruns, const Py_buffer *view, int threads, int64_t piece,
                              int64_t release) {
    int64_t helpers_ns = 0, start = INT64_MAX;
    for (Py_ssize_t r = 0; r < nruns; r++) {
        copy_run_t *cr = &job->runs[r];
        cr->done = cr->done_bytes = 0;
        cr->ended = 0;
        if (cr->planned) {
            const int64_t pos = (int64_t)load64(cr->run.entries) - cr->run.base;
            if (pos < start) start = pos;
        }
    }
    if (release <= 0 || start == INT64_MAX) {
        for (Py_ssize_t r = 0; r < nruns; r++) job->runs[r].limit = job->runs[r].planned;
        return copy_stretch(job, nruns, threads, piece);
    }
    const uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE), at = (uintptr_t)view->buf;
    for (int64_t lo = start, left = 1; left; lo += release) {
        const int64_t hi = lo > view->len - release ? view->len : lo + release;
        left = 0;
        for (Py_ssize_t r = 0; r < nruns; r++) {
            copy_run_t *cr = &job->runs[r];
            cr->limit = cr->ended ? cr->done : stretch_limit(cr, hi);
        }
        helpers_ns += copy_stretch(job, nruns, threads, piece);
        for (Py_ssize_t r = 0; r < nruns; r++) left |= !job->runs[r].ended && job->runs[r].done < job->runs[r].planned;
        /* whole pages inside the view, from the one the last stretch kept to
         * the one holding ``hi`` (kept: the next stretch reads it) */
        uintptr_t from = (at + (uintptr_t)lo) & ~(page - 1);
        const uintptr_t to = (at + (uintptr_t)hi) & ~(page - 1);
        if (from < at) from = (at + page - 1) & ~(page - 1);
        if (to > from) madvise((void *)from, to - from, MADV_DONTNEED);  /* advisory: a failure changes nothing read */
        if (hi == view->len) break;
    }
    return helpers_ns;
}

/* check_copy_runs(view, base, entries, runs, tails, verify_crc, out, dsts, threads, piece[, release]) -> int
 * Many queues' runs of one window in one call (at 1,000 queues a call per
 * queue cost more than its records). ``entries``: the runs' ConsumeQueue
 * entries; ``runs``: an int64 buffer of COPY_FIELDS items a run: first
 * entry, entry count, queue id, first queue offset, magic, where its tail
 * starts in ``tails`` and how long it is (topic length + topic), its answer
 * (the count of leading plainly valid records, written), where its records
 * go in its destination, the CRC-32 of the destination's bytes before that
 * (replaced by the CRC-32 up to the end of the records kept) and the bytes
 * kept (written). ``dsts``: a list of writable buffers, one a run (runs
 * may share one when their bytes do not overlap). ``out``: 6 x
 * len(entries) int64 items (positions, sizes, tags, store ms, born ms,
 * props at), each run's rows at its entries' rows; rows past a run's
 * answer are undefined. Every run is checked exactly as check_run checks
 * it. Every run and destination is checked before a
 * byte is copied: a destination must hold the bytes of every entry of its
 * run that names a record inside the view. ``threads``: at most this many
 * (the calling one included), fewer for a small window; ``piece``: the
 * bytes a piece, 0 for a share of the window fit for ``threads`` (given,
 * the threads are not cut for a small window: the tests' cuts);
 * ``release``: see copy_stretches (the caller vouches that the view is a
 * read-only mapped file). Returns the CPU nanoseconds of the threads it
 * started. */
static PyObject *py_check_copy_runs(PyObject *self, PyObject *args) {
    PyObject *view_obj, *entries_obj, *runs_obj, *tails_obj, *out_obj, *dsts_obj;
    long long base, piece, release = 0;
    int verify_crc, threads;
    if (!PyArg_ParseTuple(args, "OLOOOpOO!iL|L", &view_obj, &base, &entries_obj, &runs_obj, &tails_obj, &verify_crc,
                          &out_obj, &PyList_Type, &dsts_obj, &threads, &piece, &release))
        return NULL;
    Py_buffer views[5];
    PyObject *objs[5] = {view_obj, entries_obj, tails_obj, runs_obj, out_obj};
    int held = 0;
    for (; held < 5; held++)
        if (PyObject_GetBuffer(objs[held], &views[held], held >= 3 ? PyBUF_WRITABLE : PyBUF_SIMPLE) != 0) {
            release_all(views, held);
            return NULL;
        }
    const Py_ssize_t count = views[1].len / CQ_ENTRY;
    int64_t *table = views[3].buf;
    const Py_ssize_t row_bytes = (Py_ssize_t)(COPY_FIELDS * sizeof(int64_t));
    const Py_ssize_t nruns = views[3].len / row_bytes;
    if (views[1].len % CQ_ENTRY != 0 || views[3].len % row_bytes != 0
        || views[4].len < (Py_ssize_t)(OUTPUTS * sizeof(int64_t)) * count || PyList_GET_SIZE(dsts_obj) != nruns) {
        release_all(views, 5);
        PyErr_SetString(PyExc_ValueError, "entries, runs, out or dsts of the wrong size");
        return NULL;
    }
    int64_t helpers_ns = 0;
    copy_run_t *runs = PyMem_Calloc(nruns ? (size_t)nruns : 1, sizeof(copy_run_t));
    Py_buffer *dsts = PyMem_Calloc(nruns ? (size_t)nruns : 1, sizeof(Py_buffer));
    piece_t *pieces = NULL;
    Py_ssize_t dsts_held = 0;
    if (runs == NULL || dsts == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    int64_t total = 0;
    for (Py_ssize_t r = 0; r < nruns; r++) {
        const int64_t *row = table + r * COPY_FIELDS;
        if (row[0] < 0 || row[1] < 0 || row[0] > count - row[1] || row[5] < 0 || row[6] < 0
            || row[5] > views[2].len - row[6] || row[4] < 0 || row[4] > 0xFFFFFFFFLL
            || row[2] < INT32_MIN || row[2] > INT32_MAX || row[9] < 0 || row[9] > 0xFFFFFFFFLL) {
            PyErr_Format(PyExc_ValueError, "run %zd outside the entries or tails given", r);
            goto done;
        }
        if (PyObject_GetBuffer(PyList_GET_ITEM(dsts_obj, r), &dsts[r], PyBUF_WRITABLE) != 0) goto done;
        dsts_held++;
        const int64_t need = plan_run(&runs[r], row, views, base, verify_crc, count);
        if (row[8] < 0 || row[8] > dsts[r].len || need > dsts[r].len - row[8]) {
            PyErr_Format(PyExc_ValueError, "run %zd: its records do not fit its destination", r);
            goto done;
        }
        runs[r].dst = (uint8_t *)dsts[r].buf + row[8];
        total += need;
    }
    /* a cut inside a run comes after at least a piece's bytes, in any stretch */
    int64_t most = total / (piece > 0 ? piece : MIN_PIECE) + 1 + nruns;
    pieces = PyMem_Calloc((size_t)most, sizeof(piece_t));
    if (pieces == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    copy_job_t job = {.runs = runs, .pieces = pieces, .count = 0, .next = 0};
    Py_BEGIN_ALLOW_THREADS
    helpers_ns = copy_stretches(&job, nruns, &views[0], threads, piece, release);
    Py_END_ALLOW_THREADS
    for (Py_ssize_t r = 0; r < nruns; r++) {
        int64_t *row = table + r * COPY_FIELDS;
        row[7] = runs[r].done;
        row[9] = (int64_t)runs[r].crc;
        row[10] = runs[r].done_bytes;
    }
done:
    for (Py_ssize_t r = 0; r < dsts_held; r++) PyBuffer_Release(&dsts[r]);
    PyMem_Free(dsts);
    PyMem_Free(runs);
    PyMem_Free(pieces);
    release_all(views, 5);
    if (PyErr_Occurred()) return NULL;
    return PyLong_FromLongLong(helpers_ns);
}

/* crc32_combine(crc1, crc2, len2) -> int (a self-test). */
static PyObject *py_crc32_combine(PyObject *self, PyObject *args) {
    unsigned long crc1, crc2;
    long long len2;
    if (!PyArg_ParseTuple(args, "kkL", &crc1, &crc2, &len2)) return NULL;
    if (crc1 > 0xFFFFFFFFul || crc2 > 0xFFFFFFFFul || len2 < 0) {
        PyErr_SetString(PyExc_ValueError, "CRCs are 32-bit, lengths not negative");
        return NULL;
    }
    return PyLong_FromUnsignedLong(crc32_combine_impl((uint32_t)crc1, (uint32_t)crc2, (int64_t)len2));
}

/* crc32(data) -> int (a self-test). */
static PyObject *py_crc32(PyObject *self, PyObject *arg) {
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

/* src[s[i]:e[i]] one after the other from out, each behind the byte sep
 * when sep >= 0 (the bounds checked by spans_total before). */
static void put_spans(uint8_t *out, const uint8_t *src, const int64_t *s, const int64_t *e, Py_ssize_t n,
                      int sep) {
    for (Py_ssize_t i = 0; i < n; i++) {
        size_t len = (size_t)(e[i] - s[i]);
        if (sep >= 0) *out++ = (uint8_t)sep;
        memcpy(out, src + s[i], len);
        out += len;
    }
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
    put_spans(out, src, s, e, n, -1);
    Py_END_ALLOW_THREADS
    release_all(views, 4);
    return PyLong_FromSsize_t(total);
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
    put_spans(out, src, s, e, n, sep);
    Py_END_ALLOW_THREADS
    release_all(views, 3);
    return result;
}

static PyMethodDef methods[] = {
    {"copy_spans", py_copy_spans, METH_VARARGS, "Copy spans of a buffer one after the other into another."},
    {"join_spans", py_join_spans, METH_VARARGS, "Spans of a buffer, each behind a one-byte separator."},
    {"crc32_rows", py_crc32_rows, METH_VARARGS, "CRC-32 of the same span of every row of a 2-D buffer."},
    {"check_copy_runs", py_check_copy_runs, METH_VARARGS, "Check, copy and CRC many runs of one window, on threads."},
    {"check_run", py_check_run, METH_VARARGS, "Validate a run of records; returns how many lead the run."},
    {"crc32_combine", py_crc32_combine, METH_VARARGS, "zlib's crc32_combine."},
    {"crc32", py_crc32, METH_O, "CRC-32 of a buffer, by the library linked (crc_library)."},
    {NULL, NULL, 0, NULL},
};

/* the digest of the sources it was built from (setup.py): tiered.native
 * refuses a core built from other sources than those beside it */
#ifndef TIERED_NATIVE_SOURCES
#define TIERED_NATIVE_SOURCES "unknown"
#endif

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_native", NULL, -1, NULL};

PyMODINIT_FUNC PyInit__native(void) {
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    /* the functions of every file of the core, into the one module */
    PyMethodDef *tables[] = {methods, tiered_native_key_methods, tiered_native_read_methods};
    for (size_t t = 0; t < sizeof tables / sizeof tables[0]; t++)
        if (PyModule_AddFunctions(m, tables[t]) != 0) {
            Py_DECREF(m);
            return NULL;
        }
    if (PyModule_AddStringConstant(m, "crc_library", CRC_LIBRARY) != 0
        || PyModule_AddStringConstant(m, "sources", TIERED_NATIVE_SOURCES) != 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
