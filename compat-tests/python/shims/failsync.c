/*
 * failsync: an LD_PRELOAD library that makes fsync-family calls fail with EIO
 * on demand, for the fault-injection test test_fsync_failure.py.
 *
 *   gcc -shared -fPIC -O2 -o libfailsync.so failsync.c -ldl
 *   LD_PRELOAD=./libfailsync.so FAILSYNC_TRIGGER=/tmp/x FAILSYNC_PATH_MATCH=/topics/ tessera ...
 *
 * fsync, fdatasync, syncfs and sync_file_range are wrapped (dlsym RTLD_NEXT).
 * A call fails -- returns -1 with errno EIO, without syncing anything -- when
 *   - the file named by FAILSYNC_TRIGGER exists, and
 *   - the fd's path (readlink /proc/self/fd/N) contains FAILSYNC_PATH_MATCH
 *     (any path when unset or empty).
 * Every injected failure is logged to stderr as a line starting "failsync: ".
 *
 * A hang instead of a failure (a disk that stops answering): while the file
 * named by FAILSYNC_HANG_TRIGGER exists, a matching call sleeps (polling the
 * trigger every 50 ms) and then syncs normally once the file is gone. The
 * first call that hangs logs "failsync: hang ...".
 *
 * A write that fails (a bad sector, a full disk): while the file named by
 * FAILSYNC_WRITE_TRIGGER exists, write, pwrite, pwrite64, writev and pwritev
 * on a matching fd fail with the errno FAILSYNC_WRITE_ERRNO names ("EIO",
 * the default, or "ENOSPC"), writing nothing; each logs "failsync: write".
 *
 * A disk that lies (the fault harness's deliberately broken broker): while
 * the file named by FAILSYNC_LIE_TRIGGER exists, a matching call returns 0
 * without syncing anything (nor telling a preloaded lazysync, which then
 * counts nothing of it as durable).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <sys/uio.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static int path_matches(int fd, char *path, size_t size)
{
    const char *match = getenv("FAILSYNC_PATH_MATCH");
    char link[64];
    ssize_t n;
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    n = readlink(link, path, size - 1);
    if (n < 0)
        return 0;
    path[n] = '\0';
    return !(match && *match && !strstr(path, match));
}

static void maybe_hang(int fd, const char *what)
{
    int saved = errno;
    const char *trigger = getenv("FAILSYNC_HANG_TRIGGER");
    char path[4096];
    struct timespec nap = {0, 50 * 1000 * 1000};
    if (!trigger || !*trigger || access(trigger, F_OK) != 0 || !path_matches(fd, path, sizeof path))
        goto out;
    dprintf(2, "failsync: hang %s(fd=%d, %s)\n", what, fd, path);
    while (access(trigger, F_OK) == 0)
        nanosleep(&nap, NULL);
out:
    errno = saved;
}

static int should_lie(int fd)
{
    int saved = errno;
    const char *trigger = getenv("FAILSYNC_LIE_TRIGGER");
    char path[4096];
    int lie = trigger && *trigger && access(trigger, F_OK) == 0 && path_matches(fd, path, sizeof path);
    errno = saved;
    return lie;
}

static int should_fail(int fd, const char *what)
{
    int saved = errno;
    int fail = 0;
    const char *trigger = getenv("FAILSYNC_TRIGGER");
    const char *match = getenv("FAILSYNC_PATH_MATCH");
    char link[64], path[4096];
    ssize_t n;

    maybe_hang(fd, what);
    if (!trigger || !*trigger || access(trigger, F_OK) != 0)
        goto out;
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    n = readlink(link, path, sizeof path - 1);
    if (n < 0)
        goto out;
    path[n] = '\0';
    if (match && *match && !strstr(path, match))
        goto out;
    fail = 1;
    dprintf(2, "failsync: %s(fd=%d, %s) -> EIO\n", what, fd, path);
out:
    errno = saved;
    return fail;
}

#define NEXT(type, name) ((type)dlsym(RTLD_NEXT, name))

int fsync(int fd)
{
    static int (*real)(int);
    if (!real)
        real = NEXT(int (*)(int), "fsync");
    if (should_fail(fd, "fsync")) {
        errno = EIO;
        return -1;
    }
    if (should_lie(fd))
        return 0;
    return real(fd);
}

int fdatasync(int fd)
{
    static int (*real)(int);
    if (!real)
        real = NEXT(int (*)(int), "fdatasync");
    if (should_fail(fd, "fdatasync")) {
        errno = EIO;
        return -1;
    }
    if (should_lie(fd))
        return 0;
    return real(fd);
}

int syncfs(int fd)
{
    static int (*real)(int);
    if (!real)
        real = NEXT(int (*)(int), "syncfs");
    if (should_fail(fd, "syncfs")) {
        errno = EIO;
        return -1;
    }
    return real(fd);
}

int sync_file_range(int fd, off64_t offset, off64_t nbytes, unsigned int flags)
{
    static int (*real)(int, off64_t, off64_t, unsigned int);
    if (!real)
        real = NEXT(int (*)(int, off64_t, off64_t, unsigned int), "sync_file_range");
    if (should_fail(fd, "sync_file_range")) {
        errno = EIO;
        return -1;
    }
    return real(fd, offset, nbytes, flags);
}

/* Whether a write to fd fails now; sets *err to the errno to fail with. */
static int write_fails(int fd, int *err)
{
    int saved = errno;
    const char *trigger = getenv("FAILSYNC_WRITE_TRIGGER");
    const char *name = getenv("FAILSYNC_WRITE_ERRNO");
    char path[4096];
    int fail = fd > 2 && trigger && *trigger && access(trigger, F_OK) == 0 &&
               path_matches(fd, path, sizeof path);
    *err = name && strcmp(name, "ENOSPC") == 0 ? ENOSPC : EIO;
    if (fail)
        dprintf(2, "failsync: write(fd=%d, %s) -> %s\n", fd, path, *err == ENOSPC ? "ENOSPC" : "EIO");
    errno = saved;
    return fail;
}

ssize_t write(int fd, const void *buf, size_t count)
{
    static ssize_t (*real)(int, const void *, size_t);
    int err;
    if (!real)
        real = NEXT(ssize_t (*)(int, const void *, size_t), "write");
    if (write_fails(fd, &err)) {
        errno = err;
        return -1;
    }
    return real(fd, buf, count);
}

ssize_t pwrite(int fd, const void *buf, size_t count, off_t offset)
{
    static ssize_t (*real)(int, const void *, size_t, off_t);
    int err;
    if (!real)
        real = NEXT(ssize_t (*)(int, const void *, size_t, off_t), "pwrite");
    if (write_fails(fd, &err)) {
        errno = err;
        return -1;
    }
    return real(fd, buf, count, offset);
}

ssize_t pwrite64(int fd, const void *buf, size_t count, off64_t offset)
{
    static ssize_t (*real)(int, const void *, size_t, off64_t);
    int err;
    if (!real)
        real = NEXT(ssize_t (*)(int, const void *, size_t, off64_t), "pwrite64");
    if (write_fails(fd, &err)) {
        errno = err;
        return -1;
    }
    return real(fd, buf, count, offset);
}

ssize_t writev(int fd, const struct iovec *iov, int iovcnt)
{
    static ssize_t (*real)(int, const struct iovec *, int);
    int err;
    if (!real)
        real = NEXT(ssize_t (*)(int, const struct iovec *, int), "writev");
    if (write_fails(fd, &err)) {
        errno = err;
        return -1;
    }
    return real(fd, iov, iovcnt);
}

ssize_t pwritev(int fd, const struct iovec *iov, int iovcnt, off_t offset)
{
    static ssize_t (*real)(int, const struct iovec *, int, off_t);
    int err;
    if (!real)
        real = NEXT(ssize_t (*)(int, const struct iovec *, int, off_t), "pwritev");
    if (write_fails(fd, &err)) {
        errno = err;
        return -1;
    }
    return real(fd, iov, iovcnt, offset);
}
