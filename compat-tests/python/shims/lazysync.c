/*
 * lazysync: an LD_PRELOAD library that records what a process has made
 * durable, so that after a kill -9 the fault harness can throw away what a
 * power loss would have thrown away ("lazyfs-lite"; Jepsen's lazyfs does it
 * with a FUSE page cache instead).
 *
 *   gcc -shared -fPIC -O2 -o liblazysync.so lazysync.c -ldl -lpthread
 *   LD_PRELOAD=./liblazysync.so LAZYSYNC_LOG=/x/durable.log \
 *       LAZYSYNC_KEEP=/x/keep tessera ...
 *
 * Lines appended to LAZYSYNC_LOG (one write(2) each, O_APPEND), replayed by
 * compat-tests/python/faults/lazyfs.py:
 *   S <ino> <size> <path>   fsync/fdatasync of a regular file succeeded: its
 *                           first <size> bytes are durable
 *   D <path>                fsync of a directory succeeded: the names created
 *                           or renamed in it so far are durable
 *   C <ino> <path>          open/openat with O_CREAT made a new file
 *   R <ino> <old> <new>     rename(old, new) succeeded (<ino> is the file moved)
 *   K <ino> <keep> <new>    that rename replaced file <ino>; a hard link to it
 *                           was kept at <keep> (inside LAZYSYNC_KEEP, which must
 *                           be on the same filesystem) so that the harness can
 *                           put it back if the rename is not durable; removed
 *                           again at the next fsync of <new>'s directory.
 * Not modelled: unlink (a deleted file stays deleted), O_SYNC/O_DSYNC opens,
 * sync/syncfs (tessera calls neither), mmap writes, a torn write inside the
 * durable prefix (the prefix is kept byte for byte).
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
#include <unistd.h>

#define NEXT(type, name) ((type)dlsym(RTLD_NEXT, name))

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static int log_fd = -2;
static unsigned long keep_seq;

/* Kept links waiting for a directory fsync: (directory, keep path). */
#define MAX_KEEPS 4096
static struct { char dir[PATH_MAX]; char keep[PATH_MAX]; } keeps[MAX_KEEPS];
static int nkeeps;

static void emit(const char *fmt, ...)
{
    char line[3 * PATH_MAX + 64];
    va_list ap;
    int n;

    pthread_mutex_lock(&lock);
    if (log_fd == -2) {
        const char *p = getenv("LAZYSYNC_LOG");
        /* The real open: ours would log this creation under the lock. */
        int (*real_open)(const char *, int, ...) =
            NEXT(int (*)(const char *, int, ...), "open");
        log_fd = (p && *p) ? real_open(p, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644) : -1;
    }
    pthread_mutex_unlock(&lock);
    if (log_fd < 0)
        return;
    va_start(ap, fmt);
    n = vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    if (n > 0 && n < (int)sizeof line)
        (void)!write(log_fd, line, n);
}

static int fd_path(int fd, char *out)
{
    char link[64];
    ssize_t n;
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    n = readlink(link, out, PATH_MAX - 1);
    if (n < 0)
        return -1;
    out[n] = '\0';
    return 0;
}

/* An absolute form of `path` relative to `dirfd` (AT_FDCWD or a directory). */
static void abs_path(int dirfd, const char *path, char *out)
{
    char base[PATH_MAX];
    if (path[0] == '/') {
        snprintf(out, PATH_MAX, "%s", path);
        return;
    }
    if (dirfd == AT_FDCWD) {
        if (!getcwd(base, sizeof base))
            base[0] = '\0';
    } else if (fd_path(dirfd, base) != 0) {
        base[0] = '\0';
    }
    snprintf(out, PATH_MAX, "%s/%s", base, path);
}

static void parent_of(const char *path, char *out)
{
    char *slash;
    snprintf(out, PATH_MAX, "%s", path);
    slash = strrchr(out, '/');
    if (slash && slash != out)
        *slash = '\0';
}

static void after_sync(int fd)
{
    int saved = errno;
    struct stat st;
    char path[PATH_MAX];
    if (fstat(fd, &st) != 0 || fd_path(fd, path) != 0)
        goto out;
    if (S_ISREG(st.st_mode)) {
        emit("S %lu %lld %s\n", (unsigned long)st.st_ino, (long long)st.st_size, path);
    } else if (S_ISDIR(st.st_mode)) {
        emit("D %s\n", path);
        /* The renames in this directory are durable: their kept links go. */
        pthread_mutex_lock(&lock);
        for (int i = 0; i < nkeeps;) {
            if (strcmp(keeps[i].dir, path) == 0) {
                unlink(keeps[i].keep);
                keeps[i] = keeps[--nkeeps];
            } else {
                i++;
            }
        }
        pthread_mutex_unlock(&lock);
    }
out:
    errno = saved;
}

int fsync(int fd)
{
    static int (*real)(int);
    int rc;
    if (!real)
        real = NEXT(int (*)(int), "fsync");
    rc = real(fd);
    if (rc == 0)
        after_sync(fd);
    return rc;
}

int fdatasync(int fd)
{
    static int (*real)(int);
    int rc;
    if (!real)
        real = NEXT(int (*)(int), "fdatasync");
    rc = real(fd);
    if (rc == 0)
        after_sync(fd);
    return rc;
}

static void after_open(int fd, int existed, int flags)
{
    int saved = errno;
    struct stat st;
    char path[PATH_MAX];
    if (fd >= 0 && (flags & O_CREAT) && !existed && fstat(fd, &st) == 0 &&
        S_ISREG(st.st_mode) && fd_path(fd, path) == 0)
        emit("C %lu %s\n", (unsigned long)st.st_ino, path);
    errno = saved;
}

static int exists_at(int dirfd, const char *path)
{
    int saved = errno;
    int e = faccessat(dirfd, path, F_OK, AT_SYMLINK_NOFOLLOW) == 0;
    errno = saved;
    return e;
}

#define OPEN_WRAPPER(name, ...)                                                \
    int name(__VA_ARGS__, int flags, ...)                                      \
    {                                                                          \
        static int (*real)();                                                  \
        mode_t mode = 0;                                                       \
        int existed = 0, fd;                                                   \
        if (!real)                                                             \
            real = NEXT(int (*)(), #name);                                     \
        if (flags & (O_CREAT | __O_TMPFILE)) {                                 \
            va_list ap;                                                        \
            va_start(ap, flags);                                               \
            mode = va_arg(ap, mode_t);                                         \
            va_end(ap);                                                        \
        }                                                                      \
        if (flags & O_CREAT)                                                   \
            existed = exists_at(DIRFD, path);                                  \
        fd = CALL;                                                             \
        after_open(fd, existed, flags);                                        \
        return fd;                                                             \
    }

#define DIRFD AT_FDCWD
#define CALL real(path, flags, mode)
OPEN_WRAPPER(open, const char *path)
OPEN_WRAPPER(open64, const char *path)
#undef DIRFD
#undef CALL
#define DIRFD dirfd
#define CALL real(dirfd, path, flags, mode)
OPEN_WRAPPER(openat, int dirfd, const char *path)
OPEN_WRAPPER(openat64, int dirfd, const char *path)
#undef DIRFD
#undef CALL

static int do_rename(int olddir, const char *old, int newdir, const char *new,
                     unsigned int rflags, int (*call)(void))
{
    struct stat moved, replaced;
    char aold[PATH_MAX], anew[PATH_MAX], keep[PATH_MAX], dir[PATH_MAX];
    const char *keepdir = getenv("LAZYSYNC_KEEP");
    int have_moved, have_replaced, kept = 0, rc, saved;

    (void)rflags;
    abs_path(olddir, old, aold);
    abs_path(newdir, new, anew);
    have_moved = lstat(aold, &moved) == 0;
    have_replaced = lstat(anew, &replaced) == 0 && S_ISREG(replaced.st_mode);
    if (have_replaced && keepdir && *keepdir) {
        pthread_mutex_lock(&lock);
        snprintf(keep, sizeof keep, "%s/%d-%lu", keepdir, (int)getpid(), ++keep_seq);
        pthread_mutex_unlock(&lock);
        kept = link(anew, keep) == 0;
    }
    rc = call();
    saved = errno;
    if (rc == 0) {
        if (have_moved)
            emit("R %lu %s %s\n", (unsigned long)moved.st_ino, aold, anew);
        if (kept) {
            emit("K %lu %s %s\n", (unsigned long)replaced.st_ino, keep, anew);
            parent_of(anew, dir);
            pthread_mutex_lock(&lock);
            if (nkeeps < MAX_KEEPS) {
                snprintf(keeps[nkeeps].dir, PATH_MAX, "%s", dir);
                snprintf(keeps[nkeeps].keep, PATH_MAX, "%s", keep);
                nkeeps++;
            }
            pthread_mutex_unlock(&lock);
        }
    } else if (kept) {
        unlink(keep);
    }
    errno = saved;
    return rc;
}

static const char *g_old, *g_new;
static int g_olddir, g_newdir;
static unsigned int g_flags;
static pthread_mutex_t rename_lock = PTHREAD_MUTEX_INITIALIZER;

static int call_rename(void)
{
    static int (*real)(const char *, const char *);
    if (!real)
        real = NEXT(int (*)(const char *, const char *), "rename");
    return real(g_old, g_new);
}

static int call_renameat(void)
{
    static int (*real)(int, const char *, int, const char *);
    if (!real)
        real = NEXT(int (*)(int, const char *, int, const char *), "renameat");
    return real(g_olddir, g_old, g_newdir, g_new);
}

static int call_renameat2(void)
{
    static int (*real)(int, const char *, int, const char *, unsigned int);
    if (!real)
        real = NEXT(int (*)(int, const char *, int, const char *, unsigned int), "renameat2");
    return real(g_olddir, g_old, g_newdir, g_new, g_flags);
}

/* Renames are rare (atomic replacements of small files): one at a time. */
#define RENAME_BODY(od, o, nd, n, f, fn)                                       \
    int rc;                                                                    \
    pthread_mutex_lock(&rename_lock);                                          \
    g_olddir = od; g_old = o; g_newdir = nd; g_new = n; g_flags = f;           \
    rc = do_rename(od, o, nd, n, f, fn);                                       \
    pthread_mutex_unlock(&rename_lock);                                        \
    return rc;

int rename(const char *old, const char *new)
{
    RENAME_BODY(AT_FDCWD, old, AT_FDCWD, new, 0, call_rename)
}

int renameat(int olddir, const char *old, int newdir, const char *new)
{
    RENAME_BODY(olddir, old, newdir, new, 0, call_renameat)
}

int renameat2(int olddir, const char *old, int newdir, const char *new, unsigned int flags)
{
    RENAME_BODY(olddir, old, newdir, new, flags, call_renameat2)
}
