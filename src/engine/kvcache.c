/*
 * kvcache.c - KVC checkpoint files and the directory store (see kvcache.h).
 */
#include "engine/kvcache.h"

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <openssl/evp.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "text/strbuf.h"
#include "text/tokenizer.h"

#define IO_BUFFER   (8u << 20) /* streamed writes and reads, as ds4 */
#define HALF_LIFE_S (6.0 * 3600.0)

/* ------------------------------------------------------------ header */

static void put32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static void put64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static uint32_t get32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static uint64_t get64(const uint8_t *p) { return (uint64_t)get32(p) | (uint64_t)get32(p + 4) << 32; }

void ds4_kvc_header_encode(const ds4_kvc_header *h, uint8_t out[DS4_KVC_HEADER_BYTES]) {
    memset(out, 0, DS4_KVC_HEADER_BYTES);
    memcpy(out, "KVC", 3);
    out[3] = DS4_KVC_VERSION;
    out[4] = h->quant_bits;
    out[5] = h->reason;
    out[6] = h->ext;
    put32(out + 8, h->n_tokens);
    put32(out + 12, h->hits);
    put32(out + 16, h->ctx);
    put32(out + 20, h->checksum);
    put64(out + 24, h->created);
    put64(out + 32, h->last_used);
    put64(out + 40, h->payload_bytes);
}

int ds4_kvc_header_decode(const uint8_t in[DS4_KVC_HEADER_BYTES], ds4_kvc_header *h, ds4_err *err) {
    if (memcmp(in, "KVC", 3) != 0) return ds4_err_set(err, DS4_EFORMAT, "not a KVC file (bad magic)");
    if (in[3] != DS4_KVC_VERSION)
        return ds4_err_set(err, DS4_EUNSUPPORTED, "KVC version %u, expected %u", in[3], DS4_KVC_VERSION);
    if (in[4] != 2 && in[4] != 4) return ds4_err_set(err, DS4_EFORMAT, "KVC quant bits %u (must be 2 or 4)", in[4]);
    if (in[5] > DS4_KVC_AGENT_SESSION) return ds4_err_set(err, DS4_EFORMAT, "KVC save reason %u unknown", in[5]);
    if (in[6] & ~0x0Fu) return ds4_err_set(err, DS4_EFORMAT, "KVC extension flags 0x%02x unknown", in[6]);
    memset(h, 0, sizeof(*h));
    h->quant_bits = in[4];
    h->reason = in[5];
    h->ext = in[6];
    h->n_tokens = get32(in + 8);
    h->hits = get32(in + 12);
    h->ctx = get32(in + 16);
    h->checksum = h->ext & DS4_KVC_EXT_CHECKSUM ? get32(in + 20) : 0;
    /* ds4 rewrites the header of a file it loads (its hits and last use)
     * with bytes 20..23 zeroed and the flags kept: a zero checksum is no
     * checksum, and such a file loads unverified, as ds4's own do. */
    if (h->checksum == 0) h->ext &= (uint8_t)~DS4_KVC_EXT_CHECKSUM;
    h->created = get64(in + 24);
    h->last_used = get64(in + 32);
    h->payload_bytes = get64(in + 40);
    if (h->n_tokens == 0) return ds4_err_set(err, DS4_EFORMAT, "KVC file holds zero tokens");
    return 0;
}

void ds4_kvc_name(const char *text, size_t n, char out[48]) {
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned int len = 0;
    EVP_Digest(text, n, md, &len, EVP_sha1(), NULL);
    for (unsigned i = 0; i < 20; i++) snprintf(out + 2 * i, 3, "%02x", md[i]);
    memcpy(out + 40, ".kv", 4);
}

double ds4_kvc_score(const ds4_kvc_header *h, uint64_t file_size, uint64_t now) {
    double age = now > h->last_used ? (double)(now - h->last_used) : 0.0;
    double hits = (double)h->hits * pow(0.5, age / HALF_LIFE_S);
    if (hits < 0.01) hits = 0.0;
    return (hits + 1.0) * (double)h->n_tokens / (double)(file_size ? file_size : 1);
}

/* ------------------------------------------------------------ checksum */

/* The payload checksum: four lanes of 8-byte words, each multiplied and
 * shifted (bijective steps: one changed byte always changes its lane),
 * folded with the length into 32 bits.  Fast enough to run at the speed
 * of the reads and writes it rides on. */
typedef struct payload_hash {
    uint64_t lane[4];
    uint8_t tail[32];
    size_t ntail;
    uint64_t total;
} payload_hash;

#define HASH_MUL 0x9E3779B97F4A7C15ull

static void hash_init(payload_hash *h) {
    memset(h, 0, sizeof(*h));
    for (int i = 0; i < 4; i++) h->lane[i] = 0x243F6A8885A308D3ull * (uint64_t)(i + 1);
}

static void hash_block(payload_hash *h, const uint8_t *p) {
    for (int i = 0; i < 4; i++) {
        uint64_t w;
        memcpy(&w, p + 8 * i, 8);
        uint64_t x = (h->lane[i] ^ w) * HASH_MUL;
        h->lane[i] = x ^ (x >> 29);
    }
}

static void hash_update(payload_hash *h, const void *data, size_t n) {
    const uint8_t *p = data;
    h->total += n;
    if (h->ntail) {
        size_t k = 32 - h->ntail < n ? 32 - h->ntail : n;
        memcpy(h->tail + h->ntail, p, k);
        h->ntail += k, p += k, n -= k;
        if (h->ntail < 32) return;
        hash_block(h, h->tail);
        h->ntail = 0;
    }
    for (; n >= 32; p += 32, n -= 32) hash_block(h, p);
    memcpy(h->tail, p, n);
    h->ntail = n;
}

static uint32_t hash_final(payload_hash *h) {
    memset(h->tail + h->ntail, 0, 32 - h->ntail);
    hash_block(h, h->tail);
    uint64_t x = h->total * HASH_MUL;
    for (int i = 0; i < 4; i++) x = ((x ^ h->lane[i]) * HASH_MUL) ^ (x >> 31);
    return (uint32_t)(x ^ (x >> 32));
}

/* A FILE over another that hashes what goes through it; reads stop at
 * `left` bytes (the payload's end). */
typedef struct hashed_io {
    FILE *f;
    uint64_t left;
    payload_hash h;
} hashed_io;

static ssize_t hio_read(void *c, char *buf, size_t n) {
    hashed_io *io = c;
    if (n > io->left) n = (size_t)io->left;
    size_t r = n ? fread(buf, 1, n, io->f) : 0;
    io->left -= r;
    hash_update(&io->h, buf, r);
    return (ssize_t)r;
}

static ssize_t hio_write(void *c, const char *buf, size_t n) {
    hashed_io *io = c;
    size_t w = fwrite(buf, 1, n, io->f);
    hash_update(&io->h, buf, w);
    return w == n ? (ssize_t)n : -1;
}

static FILE *hio_open(hashed_io *io, FILE *f, uint64_t left, const char *mode) {
    io->f = f;
    io->left = left;
    hash_init(&io->h);
    cookie_io_functions_t fns = {.read = hio_read, .write = hio_write};
    FILE *c = fopencookie(io, mode, fns);
    if (c) setvbuf(c, NULL, _IOFBF, 1 << 20);
    return c;
}

/* ------------------------------------------------------------ writing */

static bool text_contains(const char *text, size_t n, const char *s, size_t sn) {
    return sn == 0 || (sn <= n && memmem(text, n, s, sn) != NULL);
}

static int write_all(FILE *f, const void *p, size_t n, const char *path, ds4_err *err) {
    if (n && fwrite(p, 1, n, f) != n) return ds4_err_set(err, DS4_EIO, "writing %s: %s", path, strerror(errno));
    return 0;
}

static int write_trailer(FILE *f, const char *text, size_t n, const ds4_kvc_tool *tools, size_t n_tools,
                         const char *path, ds4_err *err) {
    uint32_t count = 0;
    for (size_t i = 0; i < n_tools; i++)
        if (text_contains(text, n, tools[i].dsml, tools[i].dsml_len)) count++;
    uint8_t head[8] = {'K', 'T', 'M', 1};
    put32(head + 4, count);
    if (write_all(f, head, 8, path, err)) return -1;
    for (size_t i = 0; i < n_tools; i++) {
        if (!text_contains(text, n, tools[i].dsml, tools[i].dsml_len)) continue;
        uint8_t lens[8];
        put32(lens, tools[i].id_len);
        put32(lens + 4, tools[i].dsml_len);
        if (write_all(f, lens, 8, path, err) || write_all(f, tools[i].id, tools[i].id_len, path, err) ||
            write_all(f, tools[i].dsml, tools[i].dsml_len, path, err))
            return -1;
    }
    return 0;
}

static void fsync_dir_of(const char *path) {
    char dir[4096];
    snprintf(dir, sizeof(dir), "%s", path);
    char *slash = strrchr(dir, '/');
    if (slash) *slash = '\0';
    else snprintf(dir, sizeof(dir), ".");
    int fd = open(dir, O_RDONLY | O_DIRECTORY);
    if (fd >= 0) {
        fsync(fd);
        close(fd);
    }
}

int ds4_kvc_write(const char *path, ds4_kvc_header *h, const char *text, size_t text_len, const ds4_kv_state *st,
                  const ds4_kvc_tool *tools, size_t n_tools, ds4_err *err) {
    static atomic_uint counter;
    if (text_len > UINT32_MAX) return ds4_err_set(err, DS4_ERANGE, "KVC key text of %zu bytes is too long", text_len);
    if (st->n_tokens == 0) return ds4_err_set(err, DS4_EINVAL, "KVC: refusing to save an empty session");
    char tmp[4200];
    snprintf(tmp, sizeof(tmp), "%s.tmp-%d-%u", path, (int)getpid(), atomic_fetch_add(&counter, 1));
    int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0) return ds4_err_set(err, DS4_EIO, "cannot create %s: %s", tmp, strerror(errno));
    FILE *f = fdopen(fd, "wb");
    char *buf = malloc(IO_BUFFER);
    if (!f || !buf) {
        if (f) fclose(f);
        else close(fd);
        free(buf);
        unlink(tmp);
        return ds4_err_set(err, DS4_ENOMEM, "KVC write: out of memory");
    }
    setvbuf(f, buf, _IOFBF, IO_BUFFER);

    h->n_tokens = st->n_tokens;
    h->ext &= (uint8_t)~DS4_KVC_EXT_TOOLMAP;
    for (size_t i = 0; i < n_tools; i++)
        if (text_contains(text, text_len, tools[i].dsml, tools[i].dsml_len)) h->ext |= DS4_KVC_EXT_TOOLMAP;
    uint8_t head[DS4_KVC_HEADER_BYTES + 4] = {0};
    put32(head + DS4_KVC_HEADER_BYTES, (uint32_t)text_len);
    int rc = write_all(f, head, sizeof(head), tmp, err);
    if (rc == 0) rc = write_all(f, text, text_len, tmp, err);
    off_t start = ftello(f);
    hashed_io io;
    FILE *hf = rc == 0 ? hio_open(&io, f, 0, "wb") : NULL;
    if (rc == 0 && !hf) rc = ds4_err_set(err, DS4_ENOMEM, "KVC write: out of memory");
    if (rc == 0) rc = ds4_kv_state_save(st, hf, err);
    if (hf && fclose(hf) != 0 && rc == 0) rc = ds4_err_set(err, DS4_EIO, "writing %s: %s", tmp, strerror(errno));
    if (rc == 0) {
        h->payload_bytes = (uint64_t)(ftello(f) - start);
        h->checksum = hash_final(&io.h);
        h->ext |= DS4_KVC_EXT_CHECKSUM;
    }
    if (rc == 0 && (h->ext & DS4_KVC_EXT_TOOLMAP)) rc = write_trailer(f, text, text_len, tools, n_tools, tmp, err);
    if (rc == 0 && fflush(f) != 0) rc = ds4_err_set(err, DS4_EIO, "writing %s: %s", tmp, strerror(errno));
    if (rc == 0) {
        ds4_kvc_header_encode(h, head);
        if (pwrite(fileno(f), head, DS4_KVC_HEADER_BYTES, 0) != DS4_KVC_HEADER_BYTES || fsync(fileno(f)) != 0)
            rc = ds4_err_set(err, DS4_EIO, "writing %s: %s", tmp, strerror(errno));
    }
    if (fclose(f) != 0 && rc == 0) rc = ds4_err_set(err, DS4_EIO, "writing %s: %s", tmp, strerror(errno));
    free(buf);
    if (rc == 0 && rename(tmp, path) != 0) rc = ds4_err_set(err, DS4_EIO, "renaming %s: %s", tmp, strerror(errno));
    if (rc != 0) {
        unlink(tmp);
        return -1;
    }
    fsync_dir_of(path);
    return 0;
}

/* ------------------------------------------------------------ reading */

void ds4_kvc_file_free(ds4_kvc_file *f) {
    free(f->text);
    for (size_t i = 0; i < f->n_tools; i++) {
        free((char *)f->tools[i].id);
        free((char *)f->tools[i].dsml);
    }
    free(f->tools);
    memset(f, 0, sizeof(*f));
}

static int read_exact(FILE *f, void *p, size_t n, const char *what, ds4_err *err) {
    if (n && fread(p, 1, n, f) != n) return ds4_err_set(err, DS4_EFORMAT, "truncated while reading %s", what);
    return 0;
}

static int read_trailer(FILE *f, uint64_t remaining, size_t max_tools, ds4_kvc_file *out, ds4_err *err) {
    uint8_t head[8];
    if (remaining < 8 || read_exact(f, head, 8, "the tool-id trailer", err))
        return ds4_err_set(err, DS4_EFORMAT, "tool-id trailer truncated");
    remaining -= 8;
    if (memcmp(head, "KTM", 3) != 0 || head[3] != 1) return ds4_err_set(err, DS4_EFORMAT, "bad tool-id trailer magic");
    uint32_t count = get32(head + 4);
    if (count > max_tools)
        return ds4_err_set(err, DS4_EFORMAT, "tool-id trailer: %u entries (limit %zu)", count, max_tools);
    if ((uint64_t)count * 8 > remaining)
        return ds4_err_set(err, DS4_EFORMAT, "tool-id trailer: %u entries do not fit", count);
    out->tools = calloc(count ? count : 1, sizeof(*out->tools));
    if (!out->tools) return ds4_err_set(err, DS4_ENOMEM, "tool-id trailer: out of memory");
    for (uint32_t i = 0; i < count; i++) {
        uint8_t lens[8];
        if (remaining < 8 || read_exact(f, lens, 8, "a tool-id entry", err))
            return ds4_err_set(err, DS4_EFORMAT, "tool-id entry %u truncated", i);
        remaining -= 8;
        uint32_t il = get32(lens), dl = get32(lens + 4);
        if (il == 0 || il > DS4_KVC_MAX_ID || dl > DS4_KVC_MAX_DSML || (uint64_t)il + dl > remaining)
            return ds4_err_set(err, DS4_EFORMAT, "tool-id entry %u: id of %u bytes, block of %u bytes", i, il, dl);
        char *id = malloc(il + 1), *dsml = malloc((size_t)dl + 1);
        if (!id || !dsml) {
            free(id);
            free(dsml);
            return ds4_err_set(err, DS4_ENOMEM, "tool-id trailer: out of memory");
        }
        out->tools[out->n_tools++] = (ds4_kvc_tool){id, il, dsml, dl};
        if (read_exact(f, id, il, "a tool id", err) || read_exact(f, dsml, dl, "a tool block", err)) return -1;
        id[il] = dsml[dl] = '\0';
        remaining -= (uint64_t)il + dl;
    }
    if (remaining != 0)
        return ds4_err_set(err, DS4_EFORMAT, "%llu bytes after the tool-id trailer", (unsigned long long)remaining);
    return 0;
}

/* The payload tokens decode to the key text. */
static int check_key_text(const ds4_kv_state *st, const ds4_vocab *vocab, const ds4_kvc_file *out, ds4_err *err) {
    ds4_strbuf b = {0};
    int rc = ds4_detokenize(vocab, (const int32_t *)(const void *)st->tokens, st->n_tokens, &b, err);
    if (rc == 0 && (b.len != out->text_len || memcmp(b.p ? b.p : "", out->text, b.len) != 0))
        rc = ds4_err_set(err, DS4_EFORMAT, "the payload tokens do not spell the key text");
    ds4_strbuf_free(&b);
    return rc;
}

static int read_file(FILE *f, uint64_t size, ds4_kv_state *st, const ds4_vocab *vocab, const char *expect_name,
                     size_t max_tools, ds4_kvc_file *out, ds4_err *err) {
    uint8_t head[DS4_KVC_HEADER_BYTES + 4];
    if (size < sizeof(head))
        return ds4_err_set(err, DS4_EFORMAT, "%llu bytes, shorter than a KVC header", (unsigned long long)size);
    if (read_exact(f, head, sizeof(head), "the header", err) || ds4_kvc_header_decode(head, &out->h, err)) return -1;
    uint64_t text_len = get32(head + DS4_KVC_HEADER_BYTES);
    uint64_t payload_at = sizeof(head) + text_len;
    if (payload_at > size || out->h.payload_bytes > size - payload_at)
        return ds4_err_set(err, DS4_EFORMAT, "text of %llu bytes and payload of %llu bytes exceed the file size %llu",
                           (unsigned long long)text_len, (unsigned long long)out->h.payload_bytes,
                           (unsigned long long)size);
    out->text = malloc(text_len + 1);
    if (!out->text) return ds4_err_set(err, DS4_ENOMEM, "KVC read: out of memory");
    if (read_exact(f, out->text, text_len, "the key text", err)) return -1;
    out->text[text_len] = '\0';
    out->text_len = text_len;
    if (expect_name) {
        char name[48];
        ds4_kvc_name(out->text, out->text_len, name);
        if (strcmp(name, expect_name) != 0)
            return ds4_err_set(err, DS4_EFORMAT, "SHA1 of the key text is not the file name");
    }
    if (st) {
        hashed_io io;
        FILE *hf = hio_open(&io, f, out->h.payload_bytes, "rb");
        if (!hf) return ds4_err_set(err, DS4_ENOMEM, "KVC read: out of memory");
        int lrc = ds4_kv_state_load(st, hf, err);
        /* The load must have taken the payload to its last byte. */
        bool short_load = lrc == 0 && fgetc(hf) != EOF;
        fclose(hf);
        if (lrc) return -1;
        if (short_load || (uint64_t)ftello(f) != payload_at + out->h.payload_bytes || io.left)
            return ds4_err_set(err, DS4_EFORMAT, "payload length %llu does not match the header's %llu",
                               (unsigned long long)((uint64_t)ftello(f) - payload_at),
                               (unsigned long long)out->h.payload_bytes);
        if ((out->h.ext & DS4_KVC_EXT_CHECKSUM) && hash_final(&io.h) != out->h.checksum)
            return ds4_err_set(err, DS4_EFORMAT, "payload checksum mismatch (the file is damaged)");
        if (st->n_tokens != out->h.n_tokens)
            return ds4_err_set(err, DS4_EFORMAT, "payload holds %u tokens, header says %u", st->n_tokens,
                               out->h.n_tokens);
        bool visible = out->h.ext & (DS4_KVC_EXT_RESPONSES_VISIBLE | DS4_KVC_EXT_THINKING_VISIBLE);
        if (vocab && !visible && check_key_text(st, vocab, out, err)) return -1;
    } else if (fseeko(f, (off_t)(payload_at + out->h.payload_bytes), SEEK_SET) != 0) {
        return ds4_err_set(err, DS4_EIO, "seek: %s", strerror(errno));
    }
    uint64_t remaining = size - payload_at - out->h.payload_bytes;
    if (out->h.ext & DS4_KVC_EXT_TOOLMAP) return read_trailer(f, remaining, max_tools, out, err);
    if (remaining != 0) return ds4_err_set(err, DS4_EFORMAT, "%llu trailing bytes", (unsigned long long)remaining);
    return 0;
}

int ds4_kvc_read(const char *path, ds4_kv_state *st, const ds4_vocab *vocab, const char *expect_name, size_t max_tools,
                 ds4_kvc_file *out, ds4_err *err) {
    memset(out, 0, sizeof(*out));
    FILE *f = fopen(path, "rbe");
    if (!f) return ds4_err_set(err, DS4_EIO, "cannot open %s: %s", path, strerror(errno));
    struct stat sb;
    int rc = fstat(fileno(f), &sb) == 0 ? 0 : ds4_err_set(err, DS4_EIO, "stat %s: %s", path, strerror(errno));
    char *buf = st ? malloc(IO_BUFFER) : NULL;
    if (buf) setvbuf(f, buf, _IOFBF, IO_BUFFER);
    if (rc == 0) {
        out->file_size = (uint64_t)sb.st_size;
        rc = read_file(f, out->file_size, st, vocab, expect_name, max_tools, out, err);
    }
    fclose(f);
    free(buf);
    if (rc != 0) {
        if (st) ds4_kv_state_reset(st);
        ds4_kvc_file_free(out);
        ds4_err_prefix(err, "%s", path);
    }
    return rc;
}

/* ------------------------------------------------------------ store */

typedef struct entry {
    char name[48];
    ds4_kvc_header h;
    size_t text_len;
    uint64_t size;
} entry;

struct ds4_kvc_store {
    ds4_kvc_opts o;
    char *dir;
    pthread_mutex_t mu;
    entry *e;
    size_t n, cap;
    ds4_kvc_stats st;
};

static void logf_(ds4_kvc_store *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void logf_(ds4_kvc_store *s, const char *fmt, ...) {
    char msg[1400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    if (s->o.log) s->o.log(s->o.log_ctx, msg);
    else fprintf(stderr, "kvcache: %s\n", msg);
}

static void path_of(const ds4_kvc_store *s, const char *name, char *out, size_t n) {
    snprintf(out, n, "%s/%s", s->dir, name);
}

static bool is_kv_name(const char *name) {
    if (strlen(name) != 43 || strcmp(name + 40, ".kv") != 0) return false;
    for (int i = 0; i < 40; i++)
        if (!((name[i] >= '0' && name[i] <= '9') || (name[i] >= 'a' && name[i] <= 'f'))) return false;
    return true;
}

static int find_entry(const ds4_kvc_store *s, const char *name) {
    for (size_t i = 0; i < s->n; i++)
        if (strcmp(s->e[i].name, name) == 0) return (int)i;
    return -1;
}

static void drop_entry(ds4_kvc_store *s, size_t i, bool unlink_file) {
    if (unlink_file) {
        char p[4200];
        path_of(s, s->e[i].name, p, sizeof(p));
        unlink(p);
    }
    s->st.bytes -= s->e[i].size;
    s->e[i] = s->e[--s->n];
    s->st.files = s->n;
}

static int add_entry(ds4_kvc_store *s, const char *name, const ds4_kvc_header *h, size_t text_len, uint64_t size) {
    int at = find_entry(s, name);
    if (at >= 0) drop_entry(s, (size_t)at, false);
    if (s->n == s->cap) {
        size_t cap = s->cap ? 2 * s->cap : 16;
        entry *e = realloc(s->e, cap * sizeof(*e));
        if (!e) return -1;
        s->e = e;
        s->cap = cap;
    }
    entry *e = &s->e[s->n++];
    memcpy(e->name, name, sizeof(e->name));
    e->h = *h;
    e->text_len = text_len;
    e->size = size;
    s->st.bytes += size;
    s->st.files = s->n;
    return 0;
}

static size_t max_tools_of(const ds4_kvc_store *s) { return s->o.max_tools ? s->o.max_tools : 400000; }

/* Lowest score first; the protected entry only when it alone is left. */
static void evict_to_budget(ds4_kvc_store *s, const char *protect) {
    uint64_t now = (uint64_t)time(NULL);
    while (s->st.bytes > s->o.budget_bytes && s->n > 0) {
        int worst = -1;
        double ws = 0;
        for (size_t i = 0; i < s->n; i++) {
            if (protect && strcmp(s->e[i].name, protect) == 0 && s->n > 1) continue;
            double sc = ds4_kvc_score(&s->e[i].h, s->e[i].size, now);
            if (worst < 0 || sc < ws || (sc == ws && s->e[i].h.last_used < s->e[worst].h.last_used)) {
                worst = (int)i;
                ws = sc;
            }
        }
        if (worst < 0) break;
        logf_(s, "evicting %s (%u tokens, %llu bytes, score %.3g) to stay within %llu bytes", s->e[worst].name,
              s->e[worst].h.n_tokens, (unsigned long long)s->e[worst].size, ws, (unsigned long long)s->o.budget_bytes);
        drop_entry(s, (size_t)worst, true);
        s->st.evictions++;
    }
}

/* The writer's pid when `name` is a temporary ds4_kvc_write makes:
 * 40 hex digits, ".kv.tmp-", the pid, "-", a counter; else 0. */
static int temp_pid(const char *name) {
    for (int i = 0; i < 40; i++)
        if (!strchr("0123456789abcdef", name[i]) || !name[i]) return 0;
    if (strncmp(name + 40, ".kv.tmp-", 8) != 0) return 0;
    const char *p = name + 48;
    char *end;
    errno = 0;
    long pid = strtol(p, &end, 10);
    if (errno || end == p || *end != '-' || pid <= 0 || pid > INT32_MAX || !isdigit((unsigned char)*p)) return 0;
    p = end + 1;
    if (!*p) return 0;
    for (; *p; p++)
        if (!isdigit((unsigned char)*p)) return 0;
    return (int)pid;
}

static void scan_dir(ds4_kvc_store *s) {
    DIR *d = opendir(s->dir);
    if (!d) return;
    struct dirent *de;
    while ((de = readdir(d))) {
        char p[4200];
        path_of(s, de->d_name, p, sizeof(p));
        int pid = temp_pid(de->d_name);
        if (pid > 0 && pid != (int)getpid() && (kill(pid, 0) == 0 || errno == EPERM)) {
            logf_(s, "leaving %s: process %d, which may be writing it, is running", de->d_name, pid);
            continue;
        }
        if (pid > 0) {
            logf_(s, "removing an unfinished write %s", de->d_name);
            unlink(p);
            continue;
        }
        if (!is_kv_name(de->d_name)) continue;
        ds4_kvc_file f;
        ds4_err err = {0};
        if (ds4_kvc_read(p, NULL, NULL, de->d_name, max_tools_of(s), &f, &err) != 0) {
            logf_(s, "skipping corrupt cache file: %s", err.msg);
            s->st.corrupt++;
            unlink(p);
            continue;
        }
        add_entry(s, de->d_name, &f.h, f.text_len, f.file_size);
        ds4_kvc_file_free(&f);
    }
    closedir(d);
}

ds4_kvc_store *ds4_kvc_open(const ds4_kvc_opts *opts, ds4_err *err) {
    if (mkdir(opts->dir, 0700) != 0 && errno != EEXIST) {
        ds4_err_set(err, DS4_EIO, "cannot create the KV cache directory %s: %s", opts->dir, strerror(errno));
        return NULL;
    }
    struct stat sb;
    if (stat(opts->dir, &sb) != 0 || !S_ISDIR(sb.st_mode)) {
        ds4_err_set(err, DS4_EIO, "%s is not a directory", opts->dir);
        return NULL;
    }
    ds4_kvc_store *s = calloc(1, sizeof(*s));
    if (!s || !(s->dir = strdup(opts->dir))) {
        free(s);
        ds4_err_set(err, DS4_ENOMEM, "out of memory");
        return NULL;
    }
    s->o = *opts;
    s->o.dir = s->dir;
    pthread_mutex_init(&s->mu, NULL);
    scan_dir(s);
    evict_to_budget(s, NULL);
    return s;
}

void ds4_kvc_close(ds4_kvc_store *s) {
    if (!s) return;
    pthread_mutex_destroy(&s->mu);
    free(s->e);
    free(s->dir);
    free(s);
}

ds4_kvc_stats ds4_kvc_get_stats(const ds4_kvc_store *s) {
    ds4_kvc_store *m = (ds4_kvc_store *)s;
    pthread_mutex_lock(&m->mu);
    ds4_kvc_stats st = s->st;
    pthread_mutex_unlock(&m->mu);
    return st;
}

static bool usable(const ds4_kvc_store *s, const entry *e) {
    if (e->h.n_tokens < s->o.min_tokens || e->h.ctx > s->o.ctx || e->h.n_tokens >= s->o.ctx) return false;
    if (s->o.reject_different_quant && e->h.quant_bits != s->o.quant_bits) return false;
    return true;
}

static int by_len(const void *a, const void *b) {
    size_t x = *(const size_t *)a, y = *(const size_t *)b;
    return x < y ? -1 : x > y;
}

bool ds4_kvc_lookup(ds4_kvc_store *s, const char *text, size_t n, ds4_kvc_match *m) {
    pthread_mutex_lock(&s->mu);
    bool found = false;
    size_t *lens = malloc((s->n ? s->n : 1) * sizeof(size_t)), nl = 0;
    for (size_t i = 0; lens && i < s->n; i++)
        if (s->e[i].text_len <= n && usable(s, &s->e[i])) lens[nl++] = s->e[i].text_len;
    if (lens && nl) {
        /* One pass of SHA1 over the text, finishing a copy at each length. */
        qsort(lens, nl, sizeof(size_t), by_len);
        EVP_MD_CTX *ctx = EVP_MD_CTX_new(), *tmp = EVP_MD_CTX_new();
        size_t done = 0;
        EVP_DigestInit_ex(ctx, EVP_sha1(), NULL);
        for (size_t k = 0; ctx && tmp && k < nl; k++) {
            if (k && lens[k] == lens[k - 1]) continue;
            EVP_DigestUpdate(ctx, text + done, lens[k] - done);
            done = lens[k];
            unsigned char md[EVP_MAX_MD_SIZE];
            unsigned int mdlen;
            EVP_MD_CTX_copy_ex(tmp, ctx);
            EVP_DigestFinal_ex(tmp, md, &mdlen);
            char name[48];
            for (unsigned i = 0; i < 20; i++) snprintf(name + 2 * i, 3, "%02x", md[i]);
            memcpy(name + 40, ".kv", 4);
            int at = find_entry(s, name);
            if (at >= 0 && usable(s, &s->e[at])) {
                memcpy(m->name, name, sizeof(m->name));
                m->text_len = lens[k];
                m->n_tokens = s->e[at].h.n_tokens;
                found = true; /* keep going: a longer one wins */
            }
        }
        EVP_MD_CTX_free(ctx);
        EVP_MD_CTX_free(tmp);
    }
    free(lens);
    pthread_mutex_unlock(&s->mu);
    return found;
}

bool ds4_kvc_contains(ds4_kvc_store *s, const char *text, size_t n) {
    char name[48];
    ds4_kvc_name(text, n, name);
    pthread_mutex_lock(&s->mu);
    bool found = find_entry(s, name) >= 0;
    pthread_mutex_unlock(&s->mu);
    return found;
}

static void touch_header(ds4_kvc_store *s, const char *path, entry *e) {
    e->h.hits++;
    e->h.last_used = (uint64_t)time(NULL);
    int fd = open(path, O_WRONLY | O_CLOEXEC);
    if (fd < 0) return;
    uint8_t b[12];
    put32(b, e->h.hits);
    put64(b + 4, e->h.last_used);
    if (pwrite(fd, b, 4, 12) != 4 || pwrite(fd, b + 4, 8, 32) != 8) logf_(s, "cannot update the hit count of %s", path);
    close(fd);
}

int ds4_kvc_load(ds4_kvc_store *s, const ds4_kvc_match *m, ds4_kv_state *st, ds4_err *err) {
    pthread_mutex_lock(&s->mu);
    int at = find_entry(s, m->name);
    int rc = -1;
    char p[4200];
    path_of(s, m->name, p, sizeof(p));
    if (at < 0) {
        ds4_err_set(err, DS4_ENOTFOUND, "KV cache entry %s is gone", m->name);
        goto out;
    }
    ds4_kvc_file f;
    if (ds4_kvc_read(p, st, s->o.vocab, m->name, max_tools_of(s), &f, err) != 0) {
        logf_(s, "skipping corrupt cache file: %s", ds4_err_msg(err));
        s->st.corrupt++;
        s->st.load_failures++;
        drop_entry(s, (size_t)at, true);
        goto out;
    }
    ds4_kvc_file_free(&f);
    touch_header(s, p, &s->e[at]);
    s->st.loads++;
    rc = 0;
out:
    pthread_mutex_unlock(&s->mu);
    return rc;
}

int ds4_kvc_save(ds4_kvc_store *s, ds4_kvc_reason reason, uint8_t ext, const char *text, size_t n,
                 const ds4_kv_state *st, const ds4_kvc_tool *tools, size_t n_tools, ds4_err *err) {
    if (st->n_tokens < s->o.min_tokens || st->n_tokens == 0) return 0;
    char name[48], p[4200];
    ds4_kvc_name(text, n, name);
    path_of(s, name, p, sizeof(p));
    pthread_mutex_lock(&s->mu);
    int rc = 0;
    if (find_entry(s, name) >= 0) goto out;
    uint64_t now = (uint64_t)time(NULL);
    ds4_kvc_header h = {.quant_bits = (uint8_t)s->o.quant_bits,
                        .reason = (uint8_t)reason,
                        .ext = ext,
                        .ctx = st->ctx,
                        .created = now,
                        .last_used = now};
    if (ds4_kvc_write(p, &h, text, n, st, tools, n_tools, err) != 0) {
        rc = -1;
        goto out;
    }
    struct stat sb;
    uint64_t size = stat(p, &sb) == 0 ? (uint64_t)sb.st_size : 0;
    if ((double)size * 1.01 > (double)s->o.budget_bytes) {
        logf_(s, "not keeping %s: %llu bytes exceed the whole budget of %llu bytes", name, (unsigned long long)size,
              (unsigned long long)s->o.budget_bytes);
        unlink(p);
        s->st.store_skips++;
        goto out;
    }
    if (add_entry(s, name, &h, n, size) != 0) {
        unlink(p);
        rc = ds4_err_set(err, DS4_ENOMEM, "KV cache index: out of memory");
        goto out;
    }
    s->st.stores++;
    rc = 1;
    evict_to_budget(s, name);
out:
    pthread_mutex_unlock(&s->mu);
    return rc;
}

void ds4_kvc_remove(ds4_kvc_store *s, const char *name) {
    pthread_mutex_lock(&s->mu);
    int at = find_entry(s, name);
    if (at >= 0) drop_entry(s, (size_t)at, true);
    pthread_mutex_unlock(&s->mu);
}

void ds4_kvc_each_tool(ds4_kvc_store *s, void (*fn)(void *ctx, const ds4_kvc_tool *t), void *ctx) {
    pthread_mutex_lock(&s->mu);
    for (size_t i = 0; i < s->n; i++) {
        if (!(s->e[i].h.ext & DS4_KVC_EXT_TOOLMAP)) continue;
        char p[4200];
        path_of(s, s->e[i].name, p, sizeof(p));
        ds4_kvc_file f;
        ds4_err err = {0};
        if (ds4_kvc_read(p, NULL, NULL, s->e[i].name, max_tools_of(s), &f, &err) != 0) {
            logf_(s, "tool ids unreadable: %s", err.msg);
            continue;
        }
        for (size_t k = 0; k < f.n_tools; k++) fn(ctx, &f.tools[k]);
        ds4_kvc_file_free(&f);
    }
    pthread_mutex_unlock(&s->mu);
}

/* ------------------------------------------------------------ policy */

void ds4_kvc_policy_defaults(ds4_kvc_policy *p) {
    *p = (ds4_kvc_policy){.min_tokens = 512,
                          .cold_max_tokens = 30000,
                          .continued_interval = 10000,
                          .boundary_trim = 32,
                          .boundary_align = 2048};
}

int ds4_kvc_policy_check(const ds4_kvc_policy *p, ds4_err *err) {
    if (p->min_tokens == 0) return ds4_err_set(err, DS4_EINVAL, "--kv-cache-min-tokens must be positive");
    if (p->cold_max_tokens != 0 && p->cold_max_tokens < p->min_tokens)
        return ds4_err_set(err, DS4_EINVAL,
                           "--kv-cache-cold-max-tokens must be 0 or at least --kv-cache-min-tokens (%u)",
                           p->min_tokens);
    return 0;
}

uint32_t ds4_kvc_continued_step(const ds4_kvc_policy *p) {
    if (p->continued_interval == 0) return 0;
    if (p->boundary_align == 0) return p->continued_interval;
    uint64_t a = p->boundary_align;
    uint64_t step = ((uint64_t)p->continued_interval + a - 1) / a * a;
    return step > UINT32_MAX ? 0 : (uint32_t)step;
}

uint32_t ds4_kvc_cold_boundary(const ds4_kvc_policy *p, const int32_t *tokens, uint32_t n, int32_t user_tok,
                               int32_t assistant_tok) {
    if (p->cold_max_tokens == 0 || n < p->min_tokens || n > p->cold_max_tokens) return 0;
    uint32_t last_user = 0;
    for (uint32_t i = 0; i < n; i++) {
        if (tokens[i] == assistant_tok) break;
        if (tokens[i] == user_tok) last_user = i;
    }
    if (last_user >= p->min_tokens) return last_user;
    if (n <= p->boundary_trim) return 0;
    uint32_t b = n - p->boundary_trim;
    if (p->boundary_align) b -= b % p->boundary_align;
    return b >= p->min_tokens ? b : 0;
}
