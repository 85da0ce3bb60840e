/*
 * instance_lock.h - the process-wide instance lock (as ds4
 * has it; README.md): one model process per machine.
 *
 * A model process maps tens of gigabytes of weights and allocates the
 * context buffers; two at once on one machine usually means swapping or an
 * out-of-memory kill, so every program that runs the model takes this lock
 * before loading anything, and a second one refuses to start:
 *
 *     ds4: another ds4 process is already running (pid 1234); refusing to start
 *
 * The lock is an flock() on a file, /tmp/ds4.lock unless $DS4_LOCK_FILE
 * names another (empty means the default).  The holder writes its pid into
 * the file so the refusal can name it.  The kernel drops an flock when the
 * process ends however it ends (SIGKILL included), so a lock file left
 * behind by a dead process never blocks: only a live holder does.  The file
 * itself is never deleted: unlinking it while another process waits on the
 * old inode would let two processes hold "the" lock at once.
 *
 * Running two model processes on purpose (two GPUs, tests running programs
 * side by side) is done by giving each its own DS4_LOCK_FILE.
 */
#ifndef DS4_BASE_INSTANCE_LOCK_H
#define DS4_BASE_INSTANCE_LOCK_H

#include "base/error.h"

#define DS4_LOCK_FILE_DEFAULT "/tmp/ds4.lock"

/* The lock file this process uses: $DS4_LOCK_FILE or the default. */
const char *ds4_instance_lock_path(void);

/* Take the lock for the rest of the process's life (a second call while
 * held does nothing).  Fails with DS4_EBUSY and the message
 * "another ds4 process is already running (pid N)" when a live process
 * holds it, or DS4_EIO when the file cannot be opened or locked. */
int ds4_instance_lock(ds4_err *err);

/* Release it early (tests; programs simply exit). */
void ds4_instance_unlock(void);

#endif
