/* Preloaded (LD_PRELOAD) into a test's subprocess: watches and fails the C
 * library calls made on files under SHIM_ROOT, whoever makes them (the
 * compiled write of tiered/archive/_filewrite.c, which Python-level
 * patches of os.* cannot see).
 *
 *   SHIM_ROOT  only paths under it are watched
 *   SHIM_LOG   each watched call appended as a line: "op path [detail]",
 *              the path relative to SHIM_ROOT
 *
 * Called from the watched process (ctypes.CDLL(None)):
 *   shim_arm("op:n:errno")  the n-th watched call of op from now on fails
 *              with errno (0: the process is killed with SIGKILL there
 *              instead). ops: open, open_direct, opendir, write,
 *              write_direct, setfl, fsync, fsync_dir, rename
 *   shim_mark("text")  a line "mark text" in the log
 *
 * An O_DIRECT open refused with EINVAL creates the file first, as Linux does.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <unistd.h>

#define MAX_FD 4096

static char root[4096];
static size_t root_len;
static int log_fd = -1;
static char fail_op[32];
static long fail_nth, seen;
static int fail_errno;
static char *names[MAX_FD];
static char is_dir[MAX_FD];

static int (*r_open)(const char *, int, ...);
static ssize_t (*r_write)(int, const void *, size_t);
static int (*r_fsync)(int);
static int (*r_close)(int);
static int (*r_rename)(const char *, const char *);
static int (*r_fcntl)(int, int, ...);

__attribute__((constructor)) static void init(void) {
    r_open = dlsym(RTLD_NEXT, "open");
    r_write = dlsym(RTLD_NEXT, "write");
    r_fsync = dlsym(RTLD_NEXT, "fsync");
    r_close = dlsym(RTLD_NEXT, "close");
    r_rename = dlsym(RTLD_NEXT, "rename");
    r_fcntl = dlsym(RTLD_NEXT, "fcntl");
    const char *s = getenv("SHIM_ROOT");
    if (s && strlen(s) < sizeof root - 2) {
        strcpy(root, s);
        if (root[strlen(root) - 1] != '/') strcat(root, "/");
        root_len = strlen(root);
    }
    const char *l = getenv("SHIM_LOG");
    if (l) log_fd = r_open(l, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
}

static const char *rel(const char *path) {
    return root_len && path && strncmp(path, root, root_len) == 0 ? path + root_len : NULL;
}

static const char *name_of(int fd) { return fd >= 0 && fd < MAX_FD ? names[fd] : NULL; }

static void say(const char *fmt, ...) {
    char line[9000];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    if (log_fd >= 0 && n > 0) r_write(log_fd, line, (size_t)n < sizeof line ? (size_t)n : sizeof line - 1);
}

/* 1 when this watched call of ``op`` is the one to fail (errno set); dies there when asked */
static int fails(const char *op, const char *path) {
    if (strcmp(op, fail_op) != 0 || ++seen != fail_nth) return 0;
    if (fail_errno == 0) {
        say("killed %s %s\n", op, path);
        kill(getpid(), SIGKILL);
    }
    say("failed %s %s %d\n", op, path, fail_errno);
    errno = fail_errno;
    return 1;
}

void shim_arm(const char *spec) {
    fail_op[0] = 0;
    fail_nth = fail_errno = 0;
    seen = 0;
    if (spec) sscanf(spec, "%31[^:]:%ld:%d", fail_op, &fail_nth, &fail_errno);
}

void shim_mark(const char *text) { say("mark %s\n", text); }

static int watched_open(const char *path, int flags, mode_t mode) {
    const char *r = rel(path);
    if (r == NULL) return r_open(path, flags, mode);
    const char *op = (flags & O_DIRECTORY) ? "opendir" : (flags & O_DIRECT) ? "open_direct" : "open";
    if (fails(op, r)) {
        if ((flags & O_DIRECT) && errno == EINVAL) {  /* Linux creates the file before it refuses O_DIRECT */
            int saved = errno, fd = r_open(path, flags & ~O_DIRECT, mode);
            if (fd >= 0) r_close(fd);
            errno = saved;
        }
        return -1;
    }
    int fd = r_open(path, flags, mode);
    if (fd >= 0 && fd < MAX_FD) {
        free(names[fd]);
        names[fd] = strdup(r);
        is_dir[fd] = (flags & O_DIRECTORY) != 0;
    }
    say("%s %s\n", op, r);
    return fd;
}

int open(const char *path, int flags, ...) {
    mode_t mode = 0;
    if (flags & (O_CREAT | O_TMPFILE)) {
        va_list ap;
        va_start(ap, flags);
        mode = va_arg(ap, mode_t);
        va_end(ap);
    }
    return watched_open(path, flags, mode);
}

/* (open64: the same function, where headers with 64-bit offsets call it) */
int open64(const char *path, int flags, ...) __attribute__((alias("open")));

ssize_t write(int fd, const void *buf, size_t n) {
    const char *r = name_of(fd);
    if (r == NULL) return r_write(fd, buf, n);
    int direct = (r_fcntl(fd, F_GETFL) & O_DIRECT) != 0;
    if (fails(direct ? "write_direct" : "write", r)) return -1;
    ssize_t w = r_write(fd, buf, n);
    say("write %s %zd %s\n", r, w, direct ? "direct" : "cached");
    return w;
}

int fsync(int fd) {
    const char *r = name_of(fd);
    if (r == NULL) return r_fsync(fd);
    const char *op = is_dir[fd] ? "fsync_dir" : "fsync";
    if (fails(op, r)) return -1;
    say("%s %s\n", op, r);
    return r_fsync(fd);
}

int close(int fd) {
    const char *r = name_of(fd);
    if (r != NULL) {
        say("close %s\n", r);
        free(names[fd]);
        names[fd] = NULL;
    }
    return r_close(fd);
}

int fcntl(int fd, int cmd, ...) {
    va_list ap;
    va_start(ap, cmd);
    long arg = va_arg(ap, long);
    va_end(ap);
    const char *r = name_of(fd);
    if (r != NULL && cmd == F_SETFL) {
        if (fails("setfl", r)) return -1;
        say("setfl %s %s\n", r, (arg & O_DIRECT) ? "direct" : "cached");
    }
    return r_fcntl(fd, cmd, arg);
}

/* (fcntl64: the same function, what glibc's headers call for fcntl with 64-bit offsets) */
int fcntl64(int fd, int cmd, ...) __attribute__((alias("fcntl")));

int rename(const char *from, const char *to) {
    const char *r = rel(from), *t = rel(to);
    if (r != NULL) {
        if (fails("rename", r)) return -1;
        say("rename %s %s\n", r, t ? t : to);
    }
    return r_rename(from, to);
}
