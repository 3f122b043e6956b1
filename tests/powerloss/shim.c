/* The power-loss recorder: an LD_PRELOAD shim that logs every call a process
 * makes that changes a file or a folder under RUNE_PL_DIR, in the order they
 * happened, to RUNE_PL_LOG (powerloss_model.py reads the log).
 *
 * Built by the tests themselves: cc -shared -fPIC -O1 -o shim.so shim.c -ldl -lpthread
 *
 * One record per call, a header line of tab-separated fields, then the data
 * of a write:
 *   O  fd flags existed path          open/openat/creat (existed: the path was there before)
 *   W  fd offset length path + data   write/pwrite/pwrite64/writev (the bytes written)
 *   T  fd length path                 ftruncate
 *   F  fd mode offset length path     fallocate / posix_fallocate (mode 0)
 *   SB fd id path                     fsync/fdatasync begins (files and folders alike)
 *   SE fd id result path              ... and returns
 *   R  old new                        rename/renameat/renameat2 (returned 0)
 *   U  path / RD path / M path        unlink / rmdir / mkdir (returned 0)
 *   C  fd                             close of a recorded fd
 *   DUP old new                       dup/dup2/dup3/fcntl(F_DUPFD*) of a recorded fd
 * A sync makes durable what was recorded before its SB, and counts once its
 * SE is recorded. Stores through a shared map (the tail's 24-byte durable
 * mark) are not seen: nothing a power loss could lose depends on them.
 *
 * Fault injection (tests/test_io_errors.py): RUNE_PL_FAIL="OP:PART:N" makes
 * the N-th call of OP (write, sync or read) on a file whose path holds PART
 * fail with EIO, touching nothing; the calls after it succeed again (as a
 * kernel that reported a failed writeback once does).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <unistd.h>

#define MAXFD 65536

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static char *fdpath[MAXFD];
static char root[PATH_MAX];
static size_t rootlen;
static int logfd = -2;
static long sync_ids;

#define REAL(name, ret, ...) \
    static ret (*real_##name)(__VA_ARGS__); \
    if (!real_##name) real_##name = dlsym(RTLD_NEXT, #name)

static void raw_write(const void *p, size_t n) {
    const char *c = p;
    while (n > 0) {
        long w = syscall(SYS_write, logfd, c, n);
        if (w < 0) { if (errno == EINTR) continue; abort(); }
        c += w; n -= (size_t)w;
    }
}

static int init(void) {
    if (logfd != -2) return logfd >= 0;
    const char *d = getenv("RUNE_PL_DIR"), *l = getenv("RUNE_PL_LOG");
    if (!d || !l || strlen(d) >= sizeof root) { logfd = -1; return 0; }
    strcpy(root, d);
    rootlen = strlen(root);
    while (rootlen > 1 && root[rootlen - 1] == '/') root[--rootlen] = 0;
    logfd = (int)syscall(SYS_openat, AT_FDCWD, l, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
    if (logfd < 0) abort();
    return 1;
}

/* the absolute, lexically normalised path of (dirfd, p) into out; 0 if not under root */
static int resolve(int dirfd, const char *p, char *out) {
    char buf[2 * PATH_MAX];
    if (!p) return 0;
    if (p[0] == '/') snprintf(buf, sizeof buf, "%s", p);
    else if (dirfd == AT_FDCWD) {
        char cwd[PATH_MAX];
        if (!getcwd(cwd, sizeof cwd)) return 0;
        snprintf(buf, sizeof buf, "%s/%s", cwd, p);
    } else {
        char base[PATH_MAX], link[64];
        if (dirfd >= 0 && dirfd < MAXFD && fdpath[dirfd]) snprintf(base, sizeof base, "%s", fdpath[dirfd]);
        else {
            snprintf(link, sizeof link, "/proc/self/fd/%d", dirfd);
            ssize_t n = readlink(link, base, sizeof base - 1);
            if (n < 0) return 0;
            base[n] = 0;
        }
        snprintf(buf, sizeof buf, "%s/%s", base, p);
    }
    /* normalise: drop "." and empty parts, resolve ".." */
    char *parts[PATH_MAX / 2];
    int np = 0;
    for (char *s = strtok(buf, "/"); s; s = strtok(NULL, "/")) {
        if (!strcmp(s, ".")) continue;
        if (!strcmp(s, "..")) { if (np) np--; continue; }
        parts[np++] = s;
    }
    size_t o = 0;
    out[0] = 0;
    for (int i = 0; i < np; i++) {
        size_t k = strlen(parts[i]);
        if (o + k + 2 >= PATH_MAX) return 0;
        out[o++] = '/';
        memcpy(out + o, parts[i], k);
        o += k;
    }
    if (!o) { out[0] = '/'; o = 1; }
    out[o] = 0;
    return !strncmp(out, root, rootlen) && (out[rootlen] == 0 || out[rootlen] == '/');
}

static void rec(const char *fmt, ...) {
    char line[3 * PATH_MAX + 256];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    raw_write(line, (size_t)n);
}

static char fail_op[16], fail_part[PATH_MAX];
static long fail_at = -1, fail_seen;

static void fail_init(void) {
    static int done;
    if (done) return;
    done = 1;
    const char *f = getenv("RUNE_PL_FAIL");
    if (!f) return;
    const char *c1 = strchr(f, ':'), *c2 = c1 ? strrchr(f, ':') : NULL;
    if (!c1 || c2 == c1 || (size_t)(c1 - f) >= sizeof fail_op || (size_t)(c2 - c1 - 1) >= sizeof fail_part) return;
    memcpy(fail_op, f, (size_t)(c1 - f));
    memcpy(fail_part, c1 + 1, (size_t)(c2 - c1 - 1));
    fail_at = atol(c2 + 1);
}

/* whether this call (OP on fd) is the one to fail; caller holds mu or not, it is atomic enough */
static int should_fail(const char *op, int fd) {
    fail_init();
    if (fail_at < 0 || strcmp(op, fail_op) || fd < 0 || fd >= MAXFD || !fdpath[fd]
            || !strstr(fdpath[fd], fail_part))
        return 0;
    return __atomic_add_fetch(&fail_seen, 1, __ATOMIC_SEQ_CST) == fail_at;
}

static const char *tracked(int fd) {
    return (fd >= 0 && fd < MAXFD) ? fdpath[fd] : NULL;
}

static void track(int fd, const char *path) {
    if (fd < 0 || fd >= MAXFD) return;
    free(fdpath[fd]);
    fdpath[fd] = path ? strdup(path) : NULL;
}

/* ----------------------------------------------------------------- opens */

static int do_open(int dirfd, const char *p, int flags, mode_t mode, int at) {
    REAL(openat, int, int, const char *, int, ...);
    char path[PATH_MAX];
    if (!init()) return real_openat(dirfd, p, flags, mode);
    pthread_mutex_lock(&mu);
    int mine = resolve(at ? dirfd : AT_FDCWD, p, path);
    int existed = mine ? (faccessat(AT_FDCWD, path, F_OK, AT_SYMLINK_NOFOLLOW) == 0) : 0;
    int fd = real_openat(at ? dirfd : AT_FDCWD, p, flags, mode);
    int e = errno;
    if (fd >= 0) {
        track(fd, mine ? path : NULL);
        if (mine) rec("O\t%d\t%d\t%d\t%s\n", fd, flags, existed, path);
    }
    pthread_mutex_unlock(&mu);
    errno = e;
    return fd;
}

#define OPEN_MODE(flags) mode_t mode = 0; \
    if ((flags) & (O_CREAT | __O_TMPFILE)) { va_list ap; va_start(ap, flags); mode = va_arg(ap, mode_t); va_end(ap); }

int open(const char *p, int flags, ...) { OPEN_MODE(flags); return do_open(AT_FDCWD, p, flags, mode, 0); }
int open64(const char *p, int flags, ...) { OPEN_MODE(flags); return do_open(AT_FDCWD, p, flags, mode, 0); }
int openat(int d, const char *p, int flags, ...) { OPEN_MODE(flags); return do_open(d, p, flags, mode, 1); }
int openat64(int d, const char *p, int flags, ...) { OPEN_MODE(flags); return do_open(d, p, flags, mode, 1); }
int __open_2(const char *p, int flags) { return do_open(AT_FDCWD, p, flags, 0, 0); }
int __open64_2(const char *p, int flags) { return do_open(AT_FDCWD, p, flags, 0, 0); }
int __openat_2(int d, const char *p, int flags) { return do_open(d, p, flags, 0, 1); }
int __openat64_2(int d, const char *p, int flags) { return do_open(d, p, flags, 0, 1); }
int creat(const char *p, mode_t m) { return do_open(AT_FDCWD, p, O_CREAT | O_WRONLY | O_TRUNC, m, 0); }
int creat64(const char *p, mode_t m) { return do_open(AT_FDCWD, p, O_CREAT | O_WRONLY | O_TRUNC, m, 0); }

int close(int fd) {
    REAL(close, int, int);
    if (!init() || !tracked(fd)) return real_close(fd);
    pthread_mutex_lock(&mu);
    int r = real_close(fd);
    int e = errno;
    if (tracked(fd)) { rec("C\t%d\n", fd); track(fd, NULL); }
    pthread_mutex_unlock(&mu);
    errno = e;
    return r;
}

static int after_dup(int old, int fd) {
    if (fd >= 0 && tracked(old)) {
        char *p = strdup(fdpath[old]);
        track(fd, p);
        free(p);
        rec("DUP\t%d\t%d\n", old, fd);
    } else if (fd >= 0 && tracked(fd)) {
        rec("C\t%d\n", fd);
        track(fd, NULL);
    }
    return fd;
}

int dup(int old) {
    REAL(dup, int, int);
    if (!init()) return real_dup(old);
    pthread_mutex_lock(&mu);
    int fd = real_dup(old), e = errno;
    after_dup(old, fd);
    pthread_mutex_unlock(&mu);
    errno = e;
    return fd;
}

int dup2(int old, int nfd) {
    REAL(dup2, int, int, int);
    if (!init()) return real_dup2(old, nfd);
    pthread_mutex_lock(&mu);
    int fd = real_dup2(old, nfd), e = errno;
    if (fd >= 0 && fd != old) { if (tracked(fd)) { rec("C\t%d\n", fd); track(fd, NULL); } after_dup(old, fd); }
    pthread_mutex_unlock(&mu);
    errno = e;
    return fd;
}

int dup3(int old, int nfd, int flags) {
    REAL(dup3, int, int, int, int);
    if (!init()) return real_dup3(old, nfd, flags);
    pthread_mutex_lock(&mu);
    int fd = real_dup3(old, nfd, flags), e = errno;
    if (fd >= 0) { if (tracked(fd)) { rec("C\t%d\n", fd); track(fd, NULL); } after_dup(old, fd); }
    pthread_mutex_unlock(&mu);
    errno = e;
    return fd;
}

static int do_fcntl(int (*real)(int, int, ...), int fd, int cmd, void *arg) {
    if (!init() || (cmd != F_DUPFD && cmd != F_DUPFD_CLOEXEC)) return real(fd, cmd, arg);
    pthread_mutex_lock(&mu);
    int r = real(fd, cmd, arg), e = errno;
    after_dup(fd, r);
    pthread_mutex_unlock(&mu);
    errno = e;
    return r;
}

int fcntl(int fd, int cmd, ...) {
    REAL(fcntl, int, int, int, ...);
    va_list ap; va_start(ap, cmd); void *arg = va_arg(ap, void *); va_end(ap);
    return do_fcntl(real_fcntl, fd, cmd, arg);
}

int fcntl64(int fd, int cmd, ...) {
    REAL(fcntl64, int, int, int, ...);
    va_list ap; va_start(ap, cmd); void *arg = va_arg(ap, void *); va_end(ap);
    if (!real_fcntl64) { REAL(fcntl, int, int, int, ...); return do_fcntl(real_fcntl, fd, cmd, arg); }
    return do_fcntl(real_fcntl64, fd, cmd, arg);
}

/* ---------------------------------------------------------------- writes */

static void rec_write(int fd, off_t off, const void *buf, ssize_t n) {
    rec("W\t%d\t%lld\t%zd\t%s\n", fd, (long long)off, n, fdpath[fd]);
    raw_write(buf, (size_t)n);
}

ssize_t write(int fd, const void *buf, size_t n) {
    REAL(write, ssize_t, int, const void *, size_t);
    if (!init() || !tracked(fd)) return real_write(fd, buf, n);
    if (should_fail("write", fd)) { errno = EIO; return -1; }
    pthread_mutex_lock(&mu);
    ssize_t w = real_write(fd, buf, n);
    int e = errno;
    if (w > 0 && tracked(fd)) rec_write(fd, lseek(fd, 0, SEEK_CUR) - w, buf, w);
    pthread_mutex_unlock(&mu);
    errno = e;
    return w;
}

ssize_t writev(int fd, const struct iovec *iov, int cnt) {
    REAL(writev, ssize_t, int, const struct iovec *, int);
    if (!init() || !tracked(fd)) return real_writev(fd, iov, cnt);
    pthread_mutex_lock(&mu);
    ssize_t w = real_writev(fd, iov, cnt);
    int e = errno;
    if (w > 0 && tracked(fd)) {
        off_t off = lseek(fd, 0, SEEK_CUR) - w;
        rec("W\t%d\t%lld\t%zd\t%s\n", fd, (long long)off, w, fdpath[fd]);
        ssize_t left = w;
        for (int i = 0; i < cnt && left > 0; i++) {
            size_t k = iov[i].iov_len < (size_t)left ? iov[i].iov_len : (size_t)left;
            raw_write(iov[i].iov_base, k);
            left -= (ssize_t)k;
        }
    }
    pthread_mutex_unlock(&mu);
    errno = e;
    return w;
}

static ssize_t do_pwrite(ssize_t (*real)(int, const void *, size_t, off_t), int fd, const void *buf, size_t n, off_t off) {
    if (!init() || !tracked(fd)) return real(fd, buf, n, off);
    if (should_fail("write", fd)) { errno = EIO; return -1; }
    pthread_mutex_lock(&mu);
    ssize_t w = real(fd, buf, n, off);
    int e = errno;
    if (w > 0 && tracked(fd)) rec_write(fd, off, buf, w);
    pthread_mutex_unlock(&mu);
    errno = e;
    return w;
}

ssize_t pwrite(int fd, const void *buf, size_t n, off_t off) {
    REAL(pwrite, ssize_t, int, const void *, size_t, off_t);
    return do_pwrite(real_pwrite, fd, buf, n, off);
}

ssize_t pwrite64(int fd, const void *buf, size_t n, off_t off) {
    REAL(pwrite64, ssize_t, int, const void *, size_t, off_t);
    return do_pwrite(real_pwrite64, fd, buf, n, off);
}

static int do_trunc(int (*real)(int, off_t), int fd, off_t len) {
    if (!init() || !tracked(fd)) return real(fd, len);
    pthread_mutex_lock(&mu);
    int r = real(fd, len), e = errno;
    if (r == 0 && tracked(fd)) rec("T\t%d\t%lld\t%s\n", fd, (long long)len, fdpath[fd]);
    pthread_mutex_unlock(&mu);
    errno = e;
    return r;
}

int ftruncate(int fd, off_t len) { REAL(ftruncate, int, int, off_t); return do_trunc(real_ftruncate, fd, len); }
int ftruncate64(int fd, off_t len) { REAL(ftruncate64, int, int, off_t); return do_trunc(real_ftruncate64, fd, len); }

static int do_falloc(int (*real)(int, int, off_t, off_t), int fd, int mode, off_t off, off_t len, int posix) {
    if (!init() || !tracked(fd)) return real(fd, mode, off, len);
    pthread_mutex_lock(&mu);
    int r = real(fd, mode, off, len), e = errno;
    /* fallocate returns -1 and sets errno; posix_fallocate returns the error */
    if (r == 0 && tracked(fd)) rec("F\t%d\t%d\t%lld\t%lld\t%s\n", fd, posix ? 0 : mode, (long long)off, (long long)len, fdpath[fd]);
    pthread_mutex_unlock(&mu);
    errno = e;
    return r;
}

static int posix_shape(int fd, int mode, off_t off, off_t len) {
    REAL(posix_fallocate, int, int, off_t, off_t);
    (void)mode;
    return real_posix_fallocate(fd, off, len);
}

static int posix64_shape(int fd, int mode, off_t off, off_t len) {
    REAL(posix_fallocate64, int, int, off_t, off_t);
    (void)mode;
    return real_posix_fallocate64(fd, off, len);
}

int fallocate(int fd, int mode, off_t off, off_t len) { REAL(fallocate, int, int, int, off_t, off_t); return do_falloc(real_fallocate, fd, mode, off, len, 0); }
int fallocate64(int fd, int mode, off_t off, off_t len) { REAL(fallocate64, int, int, int, off_t, off_t); return do_falloc(real_fallocate64, fd, mode, off, len, 0); }
int posix_fallocate(int fd, off_t off, off_t len) { return do_falloc(posix_shape, fd, 0, off, len, 1); }
int posix_fallocate64(int fd, off_t off, off_t len) { return do_falloc(posix64_shape, fd, 0, off, len, 1); }

/* ----------------------------------------------------------------- syncs */

static int do_sync(int (*real)(int), int fd) {
    if (!init() || !tracked(fd)) return real(fd);
    if (should_fail("sync", fd)) { errno = EIO; return -1; }
    pthread_mutex_lock(&mu);
    long id = ++sync_ids;
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s", fdpath[fd]);
    rec("SB\t%d\t%ld\t%s\n", fd, id, path);
    pthread_mutex_unlock(&mu);
    int r = real(fd), e = errno;
    pthread_mutex_lock(&mu);
    rec("SE\t%d\t%ld\t%d\t%s\n", fd, id, r, path);
    pthread_mutex_unlock(&mu);
    errno = e;
    return r;
}

/* reads are not recorded: only failed, when RUNE_PL_FAIL says so */
ssize_t read(int fd, void *buf, size_t n) {
    REAL(read, ssize_t, int, void *, size_t);
    if (init() && tracked(fd) && should_fail("read", fd)) { errno = EIO; return -1; }
    return real_read(fd, buf, n);
}

ssize_t pread(int fd, void *buf, size_t n, off_t off) {
    REAL(pread, ssize_t, int, void *, size_t, off_t);
    if (init() && tracked(fd) && should_fail("read", fd)) { errno = EIO; return -1; }
    return real_pread(fd, buf, n, off);
}

ssize_t pread64(int fd, void *buf, size_t n, off_t off) {
    REAL(pread64, ssize_t, int, void *, size_t, off_t);
    if (init() && tracked(fd) && should_fail("read", fd)) { errno = EIO; return -1; }
    return real_pread64(fd, buf, n, off);
}

int fsync(int fd) { REAL(fsync, int, int); return do_sync(real_fsync, fd); }
int fdatasync(int fd) { REAL(fdatasync, int, int); return do_sync(real_fdatasync, fd); }

/* ----------------------------------------------------------- dir entries */

static int do_rename(int od, const char *o, int nd, const char *n, unsigned flags, int kind) {
    REAL(rename, int, const char *, const char *);
    REAL(renameat, int, int, const char *, int, const char *);
    REAL(renameat2, int, int, const char *, int, const char *, unsigned);
    char po[PATH_MAX], pn[PATH_MAX];
    int r;
    if (!init()) goto plain;
    pthread_mutex_lock(&mu);
    int mo = resolve(od, o, po), mn = resolve(nd, n, pn);
    r = kind == 0 ? real_rename(o, n) : kind == 1 ? real_renameat(od, o, nd, n) : real_renameat2(od, o, nd, n, flags);
    int e = errno;
    if (r == 0 && (mo || mn)) {
        if (flags) { rec("X\trenameat2 flags %u\n", flags); }
        rec("R\t%s\t%s\n", mo ? po : "-", mn ? pn : "-");
    }
    pthread_mutex_unlock(&mu);
    errno = e;
    return r;
plain:
    return kind == 0 ? real_rename(o, n) : kind == 1 ? real_renameat(od, o, nd, n) : real_renameat2(od, o, nd, n, flags);
}

int rename(const char *o, const char *n) { return do_rename(AT_FDCWD, o, AT_FDCWD, n, 0, 0); }
int renameat(int od, const char *o, int nd, const char *n) { return do_rename(od, o, nd, n, 0, 1); }
int renameat2(int od, const char *o, int nd, const char *n, unsigned f) { return do_rename(od, o, nd, n, f, 2); }

static int do_unlink(int d, const char *p, int flags, int kind) {
    REAL(unlink, int, const char *);
    REAL(unlinkat, int, int, const char *, int);
    REAL(rmdir, int, const char *);
    char path[PATH_MAX];
    if (!init()) return kind == 0 ? real_unlink(p) : kind == 1 ? real_unlinkat(d, p, flags) : real_rmdir(p);
    pthread_mutex_lock(&mu);
    int mine = resolve(kind == 1 ? d : AT_FDCWD, p, path);
    int r = kind == 0 ? real_unlink(p) : kind == 1 ? real_unlinkat(d, p, flags) : real_rmdir(p);
    int e = errno;
    if (r == 0 && mine) rec("%s\t%s\n", (kind == 2 || (flags & AT_REMOVEDIR)) ? "RD" : "U", path);
    pthread_mutex_unlock(&mu);
    errno = e;
    return r;
}

int unlink(const char *p) { return do_unlink(AT_FDCWD, p, 0, 0); }
int unlinkat(int d, const char *p, int flags) { return do_unlink(d, p, flags, 1); }
int rmdir(const char *p) { return do_unlink(AT_FDCWD, p, 0, 2); }

static int do_mkdir(int d, const char *p, mode_t m, int at) {
    REAL(mkdir, int, const char *, mode_t);
    REAL(mkdirat, int, int, const char *, mode_t);
    char path[PATH_MAX];
    if (!init()) return at ? real_mkdirat(d, p, m) : real_mkdir(p, m);
    pthread_mutex_lock(&mu);
    int mine = resolve(at ? d : AT_FDCWD, p, path);
    int r = at ? real_mkdirat(d, p, m) : real_mkdir(p, m);
    int e = errno;
    if (r == 0 && mine) rec("M\t%s\n", path);
    pthread_mutex_unlock(&mu);
    errno = e;
    return r;
}

int mkdir(const char *p, mode_t m) { return do_mkdir(AT_FDCWD, p, m, 0); }
int mkdirat(int d, const char *p, mode_t m) { return do_mkdir(d, p, m, 1); }
