/*
 * instance_lock.c - the process-wide instance lock (see instance_lock.h).
 */
#include "base/instance_lock.h"

#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static int lock_fd = -1;

const char *ds4_instance_lock_path(void) {
    const char *p = getenv("DS4_LOCK_FILE");
    return p && *p ? p : DS4_LOCK_FILE_DEFAULT;
}

/* Open (creating) the lock file.  O_NOFOLLOW: in a shared /tmp a symlink
 * planted at the path must not make us truncate someone else's file.  A
 * file we create is made writable by everyone so that other users' model
 * processes take the same lock; a file another user created and keeps
 * private can still be locked read-only (we then leave the pid out). */
static int open_lock_file(const char *path, bool *writable, ds4_err *err) {
    const int flags = O_CLOEXEC | O_NOFOLLOW;
    *writable = true;
    int fd = open(path, O_RDWR | O_CREAT | O_EXCL | flags, 0666);
    if (fd >= 0) {
        (void)fchmod(fd, 0666); /* whatever the umask */
    } else if (errno == EEXIST) {
        fd = open(path, O_RDWR | flags);
        if (fd < 0 && errno == EACCES) {
            fd = open(path, O_RDONLY | flags);
            *writable = false;
        }
    }
    if (fd < 0)
        return ds4_err_set(err, DS4_EIO, "instance lock file %s: %s (DS4_LOCK_FILE names another)", path,
                           strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return ds4_err_set(err, DS4_EIO, "instance lock file %s is not a regular file (DS4_LOCK_FILE names another)",
                           path);
    }
    return fd;
}

/* The holder's pid from the file, or 0.  The holder writes it just after
 * taking the lock, so a refusal that races its start waits a moment. */
static long holder_pid(int fd) {
    for (int attempt = 0; attempt < 50; attempt++) {
        char buf[32];
        ssize_t n = pread(fd, buf, sizeof(buf) - 1, 0);
        if (n > 0) {
            buf[n] = 0;
            char *end;
            long pid = strtol(buf, &end, 10);
            if (pid > 0 && end != buf && (*end == '\n' || *end == 0)) return pid;
        }
        struct timespec ts = {0, 10 * 1000000L};
        nanosleep(&ts, NULL);
    }
    return 0;
}

static int write_pid(int fd, ds4_err *err) {
    char buf[32];
    int len = snprintf(buf, sizeof(buf), "%ld\n", (long)getpid());
    if (ftruncate(fd, 0) != 0 || pwrite(fd, buf, (size_t)len, 0) != len)
        return ds4_err_set(err, DS4_EIO, "instance lock file %s: writing the pid: %s", ds4_instance_lock_path(),
                           strerror(errno));
    return 0;
}

int ds4_instance_lock(ds4_err *err) {
    if (lock_fd >= 0) return 0;
    const char *path = ds4_instance_lock_path();
    bool writable;
    int fd = open_lock_file(path, &writable, err);
    if (fd < 0) return -1;
    int rc;
    while ((rc = flock(fd, LOCK_EX | LOCK_NB)) != 0 && errno == EINTR) {}
    if (rc != 0) {
        int e = errno;
        long pid = e == EWOULDBLOCK ? holder_pid(fd) : 0;
        close(fd);
        if (e != EWOULDBLOCK) return ds4_err_set(err, DS4_EIO, "instance lock file %s: %s", path, strerror(e));
        if (pid > 0)
            return ds4_err_set(err, DS4_EBUSY,
                               "another ds4 process is already running (pid %ld); refusing to start "
                               "(lock file %s)",
                               pid, path);
        return ds4_err_set(err, DS4_EBUSY,
                           "another ds4 process is already running (pid unknown); refusing to start "
                           "(lock file %s)",
                           path);
    }
    if (writable && write_pid(fd, err) != 0) {
        close(fd);
        return -1;
    }
    lock_fd = fd;
    return 0;
}

void ds4_instance_unlock(void) {
    if (lock_fd < 0) return;
    /* An empty file: a later reader never names a pid that no longer
     * holds the lock.  Failing (a read-only descriptor) is harmless: a pid
     * without the flock blocks nobody. */
    int rc = ftruncate(lock_fd, 0);
    (void)rc;
    close(lock_fd);
    lock_fd = -1;
}
