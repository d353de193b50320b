/* Many small file reads in one call, without the GIL: tiered.store.preads.
 *
 * Part of the native core (tiered._native, setup.py: an optional
 * extension); without it tiered.store.preads reads file by file with
 * os.open/os.pread/os.fstat/os.close, which gives the same answers (held
 * equal by tests/store/test_preads.py).
 *
 * Why C: the CommitLog pass reads a few KiB of ConsumeQueue entries for
 * each of up to thousands of queues. In Python each file costs four system
 * calls, each of which gives the GIL up; while the upload threads run,
 * getting it back costs the pass more than the read (measured: most of the
 * pass's wall time at 1,000 queues). Here the GIL is given up once for all
 * the files.
 */
#include "_native.h"
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <sys/stat.h>
#include <unistd.h>

#ifndef O_CLOEXEC
#define O_CLOEXEC 0
#endif

static int int64_buffer(PyObject *obj, Py_buffer *view, Py_ssize_t n, int writable, const char *name) {
    if (PyObject_GetBuffer(obj, view, writable ? PyBUF_WRITABLE : PyBUF_SIMPLE) < 0) return -1;
    if (view->len != n * 8) {
        PyErr_Format(PyExc_ValueError, "%s must be an int64 array of one item a file", name);
        PyBuffer_Release(view);
        return -1;
    }
    return 0;
}

/* read_files(paths, los, ns, out, ats, got, sizes, errs, want_size, kept) -> None
 * For each file i: bytes [los[i], los[i] + ns[i]) of paths[i] (fewer where
 * it ends) into out from byte ats[i], their count in got[i], the file's size
 * after the read in sizes[i] (when want_size; else -1), and the errno of a
 * failed open or read in errs[i] (0: none; then got[i] is 0). kept: None,
 * or an int64 array that receives each file's descriptor, left open (-1:
 * not open) for read_fds. Every array and slot is checked before a file
 * is opened. */
/* Bytes [off, off + n) of ``fd`` into ``dst``, short only at the end of
 * the file; their count, or what was read before a failure whose errno goes
 * to ``*err`` (0 otherwise). */
static int64_t read_span(int fd, uint8_t *dst, int64_t n, int64_t off, int64_t *err) {
    int64_t done = 0;
    *err = 0;
    while (done < n) {
        ssize_t r = pread(fd, dst + done, (size_t)(n - done), (off_t)(off + done));
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) {
            *err = errno;
            break;
        }
        if (r == 0) break;
        done += r;
    }
    return done;
}

/* Every span [ats[i], ats[i] + ns[i]) inside ``out_len`` bytes, at
 * offsets that are not negative: 1; else 0 with a ValueError set. */
static int spans_fit(const int64_t *los, const int64_t *ns, const int64_t *ats, Py_ssize_t n, Py_ssize_t out_len) {
    for (Py_ssize_t i = 0; i < n; i++)
        if (los[i] < 0 || ns[i] < 0 || ats[i] < 0 || ats[i] > out_len || ns[i] > out_len - ats[i]) {
            PyErr_Format(PyExc_ValueError, "file %zd: a negative offset, or its bytes do not fit out", i);
            return 0;
        }
    return 1;
}

static PyObject *py_read_files(PyObject *self, PyObject *args) {
    PyObject *paths, *objs[8];
    int want_size;
    if (!PyArg_ParseTuple(args, "O!OOOOOOOpO", &PyList_Type, &paths, &objs[0], &objs[1], &objs[2], &objs[3],
                          &objs[4], &objs[5], &objs[6], &want_size, &objs[7]))
        return NULL;
    const Py_ssize_t n = PyList_GET_SIZE(paths);
    Py_buffer views[8];
    static const char *names[8] = {"los", "ns", "out", "ats", "got", "sizes", "errs", "kept"};
    const int nviews = objs[7] == Py_None ? 7 : 8;
    int got_views = 0;
    for (; got_views < nviews; got_views++) {
        int rc;
        if (got_views == 2)
            rc = PyObject_GetBuffer(objs[2], &views[2], PyBUF_WRITABLE);
        else
            rc = int64_buffer(objs[got_views], &views[got_views], n, got_views >= 4, names[got_views]);
        if (rc < 0) break;
    }
    PyObject **encoded = NULL;
    Py_ssize_t held = 0;
    if (got_views == nviews) {
        if (spans_fit(views[0].buf, views[1].buf, views[3].buf, n, views[2].len)) {
            encoded = PyMem_Calloc(n ? (size_t)n : 1, sizeof(PyObject *));
            if (encoded == NULL) PyErr_NoMemory();
        }
        for (; encoded != NULL && held < n; held++)
            if (!PyUnicode_FSConverter(PyList_GET_ITEM(paths, held), &encoded[held])) break;
    }
    if (got_views == nviews && !PyErr_Occurred()) {
        const int64_t *los = views[0].buf, *ns = views[1].buf, *ats = views[3].buf;
        int64_t *got = views[4].buf, *sizes = views[5].buf, *errs = views[6].buf;
        int64_t *kept = nviews == 8 ? views[7].buf : NULL;
        uint8_t *out = views[2].buf;
        Py_BEGIN_ALLOW_THREADS
        for (Py_ssize_t i = 0; i < n; i++) {
            got[i] = 0;
            sizes[i] = -1;
            errs[i] = 0;
            if (kept) kept[i] = -1;
            int fd;
            do fd = open(PyBytes_AS_STRING(encoded[i]), O_RDONLY | O_CLOEXEC);
            while (fd < 0 && errno == EINTR);
            if (fd < 0) {
                errs[i] = errno;
                continue;
            }
            int64_t done = read_span(fd, out + ats[i], ns[i], los[i], &errs[i]);
            if (!errs[i]) {
                got[i] = done;
                struct stat st;
                if (want_size) {
                    if (fstat(fd, &st) == 0)
                        sizes[i] = (int64_t)st.st_size;
                    else {
                        errs[i] = errno;
                        got[i] = 0;
                    }
                }
            }
            if (kept && !errs[i])
                kept[i] = fd;
            else
                close(fd);
        }
        Py_END_ALLOW_THREADS
    }
    for (Py_ssize_t i = 0; i < held; i++) Py_DECREF(encoded[i]);
    PyMem_Free(encoded);
    for (int v = 0; v < got_views; v++) PyBuffer_Release(&views[v]);
    if (PyErr_Occurred()) return NULL;
    Py_RETURN_NONE;
}

/* read_fds(fds, los, ns, out, ats, got, errs) -> None
 * read_files over descriptors read_files kept: for each i with fds[i] >= 0,
 * bytes [los[i], los[i] + ns[i]) into out from ats[i], their count in
 * got[i], the errno of a failed read in errs[i]; then every descriptor is
 * closed and its fds[i] set to -1 (closed once: a descriptor's number is
 * the next open's). fds[i] < 0: got[i] = -1. */
static PyObject *py_read_fds(PyObject *self, PyObject *args) {
    PyObject *objs[7];
    if (!PyArg_ParseTuple(args, "OOOOOOO", &objs[0], &objs[1], &objs[2], &objs[3], &objs[4], &objs[5], &objs[6]))
        return NULL;
    Py_buffer views[7];
    static const char *names[7] = {"fds", "los", "ns", "out", "ats", "got", "errs"};
    int got_views = 0;
    Py_ssize_t n = 0;
    for (; got_views < 7; got_views++) {
        int rc;
        if (got_views == 0) {
            rc = PyObject_GetBuffer(objs[0], &views[0], PyBUF_WRITABLE);
            if (rc == 0 && views[0].len % 8) {
                PyErr_SetString(PyExc_ValueError, "fds must be an int64 array");
                PyBuffer_Release(&views[0]);
                rc = -1;
            }
            n = views[0].len / 8;
        } else if (got_views == 3) {
            rc = PyObject_GetBuffer(objs[3], &views[3], PyBUF_WRITABLE);
        } else {
            rc = int64_buffer(objs[got_views], &views[got_views], n, got_views >= 5, names[got_views]);
        }
        if (rc < 0) break;
    }
    if (got_views == 7) spans_fit(views[1].buf, views[2].buf, views[4].buf, n, views[3].len);
    if (got_views == 7 && !PyErr_Occurred()) {
        int64_t *fds = views[0].buf, *got = views[5].buf, *errs = views[6].buf;
        const int64_t *los = views[1].buf, *ns = views[2].buf, *ats = views[4].buf;
        uint8_t *out = views[3].buf;
        Py_BEGIN_ALLOW_THREADS
        for (Py_ssize_t i = 0; i < n; i++) {
            errs[i] = 0;
            if (fds[i] < 0) {
                got[i] = -1;
                continue;
            }
            int64_t done = read_span((int)fds[i], out + ats[i], ns[i], los[i], &errs[i]);
            got[i] = errs[i] ? 0 : done;
            close((int)fds[i]);
            fds[i] = -1;
        }
        Py_END_ALLOW_THREADS
    }
    for (int v = 0; v < got_views; v++) PyBuffer_Release(&views[v]);
    if (PyErr_Occurred()) return NULL;
    Py_RETURN_NONE;
}

/* tiered._native's read functions (the module is made in _native.c). */
PyMethodDef tiered_native_read_methods[] = {
    {"read_files", py_read_files, METH_VARARGS, "Read a span of each of many files, without the GIL."},
    {"read_fds", py_read_fds, METH_VARARGS, "Read a span of each of many open files, then close them."},
    {NULL, NULL, 0, NULL},
};
