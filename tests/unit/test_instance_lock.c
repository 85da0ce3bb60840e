/*
 * test_instance_lock.c - the process-wide instance lock (base/instance_lock.h)
 * between real processes: a live holder makes a second process fail with
 * DS4_EBUSY naming the holder's pid; once the holder is gone (even killed
 * with SIGKILL) the lock is free again; a lock file left with a dead pid
 * does not block; $DS4_LOCK_FILE chooses the file (empty: the default);
 * paths that cannot be a lock file give a clear error.
 *
 * The holder is a forked child that takes the lock itself (this process
 * does not hold it then, so the child starts from a clean state), tells
 * the parent through a pipe, and waits to be killed.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/instance_lock.h"
#include "common/st_build.h"

static char *dir;
static char path[1024];

static int setup(void **state) {
    (void)state;
    dir = st_tempdir();
    snprintf(path, sizeof(path), "%s/ds4.lock", dir);
    return 0;
}

static int teardown(void **state) {
    (void)state;
    st_rmdir(dir);
    free(dir);
    return 0;
}

static void read_file(const char *p, char *buf, size_t cap) {
    FILE *f = fopen(p, "r");
    assert_non_null(f);
    size_t n = fread(buf, 1, cap - 1, f);
    buf[n] = 0;
    fclose(f);
}

/* A child holding the lock on `lock_path` until killed; returns its pid
 * once it holds it. */
static pid_t spawn_holder(const char *lock_path) {
    int fds[2];
    assert_int_equal(pipe(fds), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        close(fds[0]);
        setenv("DS4_LOCK_FILE", lock_path, 1);
        ds4_err err = {0};
        char ok = ds4_instance_lock(&err) == 0 ? 'y' : 'n';
        if (write(fds[1], &ok, 1) != 1) _exit(3);
        for (;;) pause();
    }
    close(fds[1]);
    char ok = 0;
    assert_int_equal(read(fds[0], &ok, 1), 1);
    close(fds[0]);
    assert_int_equal(ok, 'y');
    return pid;
}

static void kill_holder(pid_t pid, int sig) {
    kill(pid, sig);
    int st;
    assert_int_equal(waitpid(pid, &st, 0), pid);
}

static void test_live_holder_blocks_until_killed(void **state) {
    (void)state;
    setenv("DS4_LOCK_FILE", path, 1);
    pid_t holder = spawn_holder(path);
    char want[128], buf[64];
    snprintf(want, sizeof(want), "%d\n", (int)holder);
    read_file(path, buf, sizeof(buf));
    assert_string_equal(buf, want);

    ds4_err err = {0};
    assert_int_equal(ds4_instance_lock(&err), -1);
    assert_int_equal(err.code, DS4_EBUSY);
    snprintf(want, sizeof(want), "another ds4 process is already running (pid %d)", (int)holder);
    if (!strstr(err.msg, want)) fail_msg("\"%s\" lacks \"%s\"", err.msg, want);
    assert_non_null(strstr(err.msg, path));

    /* SIGKILL gives the holder no chance to clean up: the kernel drops
     * the flock, and the file still names the dead pid. */
    kill_holder(holder, SIGKILL);
    assert_int_equal(ds4_instance_lock(&err), 0);
    snprintf(want, sizeof(want), "%d\n", (int)getpid());
    read_file(path, buf, sizeof(buf));
    assert_string_equal(buf, want);
    assert_int_equal(ds4_instance_lock(&err), 0); /* held: nothing to do */
    ds4_instance_unlock();
    read_file(path, buf, sizeof(buf));
    assert_string_equal(buf, "");
}

static void test_normal_exit_releases(void **state) {
    (void)state;
    setenv("DS4_LOCK_FILE", path, 1);
    pid_t holder = spawn_holder(path);
    ds4_err err = {0};
    assert_int_equal(ds4_instance_lock(&err), -1);
    kill_holder(holder, SIGTERM);
    assert_int_equal(ds4_instance_lock(&err), 0);
    ds4_instance_unlock();
}

static void test_stale_file_does_not_block(void **state) {
    (void)state;
    setenv("DS4_LOCK_FILE", path, 1);
    st_write_file(path, "2147483000\n", 11);
    ds4_err err = {0};
    assert_int_equal(ds4_instance_lock(&err), 0);
    char want[32], buf[64];
    snprintf(want, sizeof(want), "%d\n", (int)getpid());
    read_file(path, buf, sizeof(buf));
    assert_string_equal(buf, want);
    ds4_instance_unlock();
}

static void test_other_file_is_independent(void **state) {
    (void)state;
    char other[1100];
    snprintf(other, sizeof(other), "%s/other.lock", dir);
    pid_t holder = spawn_holder(other);
    setenv("DS4_LOCK_FILE", path, 1);
    ds4_err err = {0};
    assert_int_equal(ds4_instance_lock(&err), 0);
    ds4_instance_unlock();
    kill_holder(holder, SIGKILL);
}

static void test_path_from_environment(void **state) {
    (void)state;
    setenv("DS4_LOCK_FILE", "", 1);
    assert_string_equal(ds4_instance_lock_path(), "/tmp/ds4.lock");
    unsetenv("DS4_LOCK_FILE");
    assert_string_equal(ds4_instance_lock_path(), DS4_LOCK_FILE_DEFAULT);
    setenv("DS4_LOCK_FILE", path, 1);
    assert_string_equal(ds4_instance_lock_path(), path);
}

static void expect_unusable(const char *p, const char *needle) {
    setenv("DS4_LOCK_FILE", p, 1);
    ds4_err err = {0};
    assert_int_equal(ds4_instance_lock(&err), -1);
    assert_int_equal(err.code, DS4_EIO);
    if (!strstr(err.msg, p) || !strstr(err.msg, needle)) fail_msg("\"%s\" lacks %s / %s", err.msg, p, needle);
}

static void test_unusable_paths(void **state) {
    (void)state;
    char p[1200], target[1200];
    snprintf(p, sizeof(p), "%s/no/such/dir/ds4.lock", dir);
    expect_unusable(p, "No such file");
    expect_unusable(dir, "lock file"); /* a directory */
    /* A symlink planted at the path is not followed (nothing truncated). */
    snprintf(target, sizeof(target), "%s/precious.txt", dir);
    st_write_file(target, "keep me", 7);
    snprintf(p, sizeof(p), "%s/link.lock", dir);
    assert_int_equal(symlink(target, p), 0);
    expect_unusable(p, "lock file");
    char buf[32];
    read_file(target, buf, sizeof(buf));
    assert_string_equal(buf, "keep me");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_live_holder_blocks_until_killed), cmocka_unit_test(test_normal_exit_releases),
        cmocka_unit_test(test_stale_file_does_not_block),       cmocka_unit_test(test_other_file_is_independent),
        cmocka_unit_test(test_path_from_environment),           cmocka_unit_test(test_unusable_paths),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
