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
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int should_fail(int fd, const char *what)
{
    int saved = errno;
    int fail = 0;
    const char *trigger = getenv("FAILSYNC_TRIGGER");
    const char *match = getenv("FAILSYNC_PATH_MATCH");
    char link[64], path[4096];
    ssize_t n;

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
