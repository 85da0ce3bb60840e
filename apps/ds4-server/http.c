/*
 * http.c - HTTP on libmicrohttpd: routes, limits, auth, CORS, and moving
 * answers from the worker to the client (as ds4's server does).
 *
 * Thread per connection: each client's thread reads and checks the
 * request, parses, renders and tokenizes it, enqueues the job and then
 * waits for it, so a slow or queued request never blocks the others.
 * Non-streaming answers are sent when the job is done (the status is only
 * known then); streaming answers start at once (200, text/event-stream)
 * and the response callback hands out the job's SSE bytes as the worker
 * produces them, writing an SSE comment as keepalive while there is
 * nothing to send (queue wait, long prefill).  While waiting the thread
 * also polls the socket: a client that closed its connection cancels its
 * job (queued jobs are skipped, prefill and generation stop).
 *
 * Also: GET /v1/models, /v1/models/{id}, /health, /v1/ds4/stats (counters)
 * and POST /v1/messages/count_tokens (Anthropic's prompt token count).
 *
 * Limits: body size (413, checked from Content-Length before reading),
 * header size (MHD's memory limit), nesting depth and UTF-8 (request.c),
 * idle connections time out, uploads slower than the upload deadline get
 * 408, at most max_connections at once, a bounded job queue (429) and 503
 * while shutting down.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <microhttpd.h>
#include <netdb.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#include "engine/generate.h"
#include "server.h"

#define UPLOAD_DEADLINE_S 120.0

enum route { R_NONE, R_OPTIONS, R_MODELS, R_MODEL, R_STATS, R_HEALTH, R_API, R_COUNT };

typedef struct conn {
    enum route route;
    const api_adapter *api;
    char model_id[128];
    ds4_strbuf body;
    bool too_large;
    double t_start;
    job *j;
    struct MHD_Connection *c;
    double last_write;
} conn;

static struct MHD_Daemon *daemon_;
static server *S;
static int keepalive_ms = 5000;

void http_set_keepalive_ms(int ms) { keepalive_ms = ms; }

/* ------------------------------------------------------------ responses */

static void add_cors(struct MHD_Response *r) {
    if (!S->o.cors) return;
    MHD_add_response_header(r, "Access-Control-Allow-Origin", "*");
    MHD_add_response_header(r, "Access-Control-Allow-Methods", "GET, POST, OPTIONS");
    MHD_add_response_header(r, "Access-Control-Allow-Headers", "*");
}

static enum MHD_Result respond_json(struct MHD_Connection *c, int status, json_t *body) {
    char *s = json_dumps(body, JSON_COMPACT);
    json_decref(body);
    if (!s) return MHD_NO;
    struct MHD_Response *r = MHD_create_response_from_buffer(strlen(s), s, MHD_RESPMEM_MUST_FREE);
    if (!r) {
        free(s);
        return MHD_NO;
    }
    MHD_add_response_header(r, "Content-Type", "application/json");
    add_cors(r);
    enum MHD_Result ret = MHD_queue_response(c, (unsigned)status, r);
    MHD_destroy_response(r);
    return ret;
}

static enum MHD_Result respond_error(struct MHD_Connection *c, const api_adapter *api, const api_error *e) {
    return respond_json(c, e->status, api_error_body(api, e));
}

static enum MHD_Result fail(struct MHD_Connection *c, const api_adapter *api, int status, const char *msg) {
    api_error e = {0};
    api_fail(&e, status, "%s", msg);
    return respond_error(c, api, &e);
}

static json_t *model_object(void) {
    uint32_t maxc = S->o.default_max_tokens < S->o.ctx ? S->o.default_max_tokens : S->o.ctx;
    return json_pack("{s:s,s:s,s:i,s:s,s:s,s:i,s:{s:i,s:i,s:b},s:[s,s,s,s,s,s,s,s,s,s,s]}", "id", DS4_MODEL_ID, "object",
                     "model", "created", (json_int_t)DS4_MODEL_CREATED, "owned_by", "ds4.c", "name", "DeepSeek V4 Flash",
                     "context_length", (json_int_t)S->o.ctx, "top_provider", "context_length", (json_int_t)S->o.ctx,
                     "max_completion_tokens", (json_int_t)maxc, "is_moderated", 0, "supported_parameters", "tools",
                     "tool_choice", "max_tokens", "temperature", "top_p", "top_k", "min_p", "stop", "seed", "stream",
                     "reasoning_effort");
}

/* ------------------------------------------------------------ routing */

static void route(conn *k, const char *url, const char *method) {
    static const struct { const char *path; const api_adapter *api; } apis[] = {
        {"/v1/chat/completions", &API_CHAT_ADAPTER},
        {"/v1/completions", &API_COMPLETIONS_ADAPTER},
        {"/v1/responses", &API_RESPONSES_ADAPTER},
        {"/v1/messages", &API_MESSAGES_ADAPTER},
    };
    if (strcmp(method, "OPTIONS") == 0) {
        k->route = R_OPTIONS;
        return;
    }
    for (size_t i = 0; i < sizeof(apis) / sizeof(apis[0]); i++)
        if (strcmp(url, apis[i].path) == 0) {
            k->route = R_API;
            k->api = apis[i].api;
            return;
        }
    if (strcmp(url, "/v1/messages/count_tokens") == 0) {
        k->route = R_COUNT;
        k->api = &API_MESSAGES_ADAPTER;
    } else if (strcmp(url, "/v1/models") == 0) k->route = R_MODELS;
    else if (strncmp(url, "/v1/models/", 11) == 0) {
        k->route = R_MODEL;
        snprintf(k->model_id, sizeof(k->model_id), "%s", url + 11);
    } else if (strcmp(url, "/v1/ds4/stats") == 0) k->route = R_STATS;
    else if (strcmp(url, "/health") == 0) k->route = R_HEALTH;
}

static bool same_secret(const char *a, const char *b) {
    size_t na = strlen(a), nb = strlen(b);
    unsigned char diff = na != nb;
    for (size_t i = 0; i < na; i++) diff |= (unsigned char)(a[i] ^ b[i % (nb ? nb : 1)]);
    return diff == 0;
}

static bool authorized(struct MHD_Connection *c) {
    if (!S->o.api_key) return true;
    const char *x = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "x-api-key");
    if (x && same_secret(x, S->o.api_key)) return true;
    const char *a = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization");
    return a && strncasecmp(a, "Bearer ", 7) == 0 && same_secret(a + 7, S->o.api_key);
}

/* ------------------------------------------------------------ clients */

/* The peer closed its side (or the socket failed). */
static bool client_gone(struct MHD_Connection *c) {
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (!ci) return false;
    struct pollfd p = {.fd = ci->connect_fd, .events = POLLIN | POLLRDHUP};
    if (poll(&p, 1, 0) <= 0) return false;
    if (p.revents & (POLLHUP | POLLERR | POLLRDHUP | POLLNVAL)) return true;
    if (p.revents & POLLIN) {
        char b;
        return recv(ci->connect_fd, &b, 1, MSG_PEEK | MSG_DONTWAIT) == 0;
    }
    return false;
}

static void deadline_in(struct timespec *ts, int ms) {
    clock_gettime(CLOCK_REALTIME, ts);
    ts->tv_nsec += (long)ms * 1000000L;
    ts->tv_sec += ts->tv_nsec / 1000000000L;
    ts->tv_nsec %= 1000000000L;
}

static ssize_t sse_reader(void *cls, uint64_t pos, char *buf, size_t max) {
    (void)pos;
    conn *k = cls;
    job *j = k->j;
    pthread_mutex_lock(&j->mu);
    while (j->sse_pos == j->sse.len && !j->done) {
        struct timespec ts;
        deadline_in(&ts, 100);
        pthread_cond_timedwait(&j->cv, &j->mu, &ts);
        if (j->sse_pos < j->sse.len || j->done) break;
        if (client_gone(k->c)) {
            j->cancel = 1;
            pthread_mutex_unlock(&j->mu);
            return MHD_CONTENT_READER_END_WITH_ERROR;
        }
        if ((ds4_now() - k->last_write) * 1000.0 >= keepalive_ms) {
            pthread_mutex_unlock(&j->mu);
            static const char ka[] = ": keepalive\n\n";
            size_t n = sizeof(ka) - 1 < max ? sizeof(ka) - 1 : max;
            memcpy(buf, ka, n);
            k->last_write = ds4_now();
            return (ssize_t)n;
        }
    }
    if (j->sse_pos < j->sse.len) {
        size_t n = j->sse.len - j->sse_pos;
        if (n > max) n = max;
        memcpy(buf, j->sse.p + j->sse_pos, n);
        j->sse_pos += n;
        pthread_mutex_unlock(&j->mu);
        k->last_write = ds4_now();
        return (ssize_t)n;
    }
    pthread_mutex_unlock(&j->mu);
    return MHD_CONTENT_READER_END_OF_STREAM;
}

static enum MHD_Result start_stream(conn *k) {
    struct MHD_Response *r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384, sse_reader, k, NULL);
    if (!r) return MHD_NO;
    MHD_add_response_header(r, "Content-Type", "text/event-stream");
    MHD_add_response_header(r, "Cache-Control", "no-cache");
    add_cors(r);
    k->last_write = ds4_now();
    enum MHD_Result ret = MHD_queue_response(k->c, MHD_HTTP_OK, r);
    MHD_destroy_response(r);
    return ret;
}

/* Wait for a non-streaming job; MHD_NO (close) when the client left. */
static enum MHD_Result wait_and_answer(conn *k) {
    job *j = k->j;
    pthread_mutex_lock(&j->mu);
    while (!j->done) {
        struct timespec ts;
        deadline_in(&ts, 100);
        pthread_cond_timedwait(&j->cv, &j->mu, &ts);
        if (!j->done && client_gone(k->c)) {
            j->cancel = 1;
            pthread_mutex_unlock(&j->mu);
            return MHD_NO;
        }
    }
    json_t *body = j->body;
    j->body = NULL;
    int status = j->status;
    pthread_mutex_unlock(&j->mu);
    if (!body) return fail(k->c, j->api, 500, "no answer");
    return respond_json(k->c, status, body);
}

static enum MHD_Result handle_api(conn *k) {
    struct MHD_Connection *c = k->c;
    const api_adapter *api = k->api;
    if (k->too_large) {
        char msg[128];
        snprintf(msg, sizeof(msg), "request body larger than %llu MB", (unsigned long long)(S->o.max_body >> 20));
        return fail(c, api, 413, msg);
    }
    api_error e = {0};
    json_t *body = req_load_json(k->body.p, k->body.len, &e);
    if (!body) return respond_error(c, api, &e);
    job *j = job_new(api);
    if (!j) {
        json_decref(body);
        return fail(c, api, 500, "out of memory");
    }
    k->j = j;
    int rc = api->parse(body, &j->req, &e);
    json_decref(body);
    if (rc != 0) return respond_error(c, api, &e);
    const char *force = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "X-DS4-Test-Output");
    if (force && S->forced) {
        if (!json_object_get(S->forced, force)) return fail(c, api, 400, "unknown X-DS4-Test-Output name");
        j->req.force_name = strdup(force);
    }
    static const char *const prefix[] = {"chatcmpl-", "cmpl-", "resp_", "msg_"};
    random_id(j->id, sizeof(j->id), prefix[api->kind], 24);
    if (render_request(S, j, &e) != 0 || cont_prepare(S, j, &e) != 0) return respond_error(c, api, &e);
    trace_request(j, k->body.p, k->body.len);
    ds4_strbuf_free(&k->body);
    j->t_enqueued = ds4_now();
    rc = worker_enqueue(j);
    if (rc == -1) return fail(c, api, 429, "too many requests queued; retry later");
    if (rc == -2) return fail(c, api, 503, "server shutting down");
    return j->req.stream ? start_stream(k) : wait_and_answer(k);
}

/* Anthropic's token counting: the prompt as it would be rendered. */
static enum MHD_Result handle_count(conn *k) {
    api_error e = {0};
    if (k->too_large) return fail(k->c, k->api, 413, "request body too large");
    json_t *body = req_load_json(k->body.p, k->body.len, &e);
    if (!body) return respond_error(k->c, k->api, &e);
    job *j = job_new(k->api);
    if (!j) {
        json_decref(body);
        return fail(k->c, k->api, 500, "out of memory");
    }
    k->j = j;
    int rc = k->api->parse(body, &j->req, &e);
    json_decref(body);
    if (rc == 0) rc = render_request(S, j, &e);
    if (rc != 0 && !(e.code && strcmp(e.code, "context_length_exceeded") == 0)) return respond_error(k->c, k->api, &e);
    return respond_json(k->c, 200, json_pack("{s:i}", "input_tokens", (json_int_t)j->tokens.n));
}

static enum MHD_Result handle(conn *k, const char *method) {
    struct MHD_Connection *c = k->c;
    if (k->route == R_OPTIONS) {
        struct MHD_Response *r = MHD_create_response_from_buffer(0, (void *)"", MHD_RESPMEM_PERSISTENT);
        add_cors(r);
        enum MHD_Result ret = MHD_queue_response(c, MHD_HTTP_NO_CONTENT, r);
        MHD_destroy_response(r);
        return ret;
    }
    if (k->route == R_NONE) return fail(c, NULL, 404, "unknown endpoint");
    if (k->route == R_HEALTH) return respond_json(c, 200, json_pack("{s:s}", "status", S->stopping ? "stopping" : "ok"));
    if (!authorized(c)) return fail(c, k->api, 401, "invalid or missing API key");
    bool get = strcmp(method, "GET") == 0 || strcmp(method, "HEAD") == 0;
    if (k->route == R_API || k->route == R_COUNT) {
        if (strcmp(method, "POST") != 0) return fail(c, k->api, 405, "use POST");
        return k->route == R_API ? handle_api(k) : handle_count(k);
    }
    if (!get) return fail(c, NULL, 405, "use GET");
    switch (k->route) {
    case R_MODELS: return respond_json(c, 200, json_pack("{s:s,s:[o]}", "object", "list", "data", model_object()));
    case R_MODEL:
        if (strcmp(k->model_id, DS4_MODEL_ID) != 0) return fail(c, NULL, 404, "unknown model");
        return respond_json(c, 200, model_object());
    case R_STATS: return respond_json(c, 200, worker_stats());
    default: return fail(c, NULL, 404, "unknown endpoint");
    }
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                                  const char *version, const char *upload, size_t *upload_size, void **con_cls) {
    (void)cls, (void)version;
    conn *k = *con_cls;
    if (!k) {
        if (!(k = calloc(1, sizeof(*k)))) return MHD_NO;
        *con_cls = k;
        k->c = c;
        k->t_start = ds4_now();
        route(k, url, method);
        const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Length");
        if (cl) {
            char *end;
            errno = 0;
            unsigned long long n = strtoull(cl, &end, 10);
            if (errno || *end || n > S->o.max_body) {
                k->too_large = true;
                char msg[128];
                snprintf(msg, sizeof(msg), "request body larger than %llu MB", (unsigned long long)(S->o.max_body >> 20));
                return fail(c, k->api, 413, msg);
            }
        }
        return MHD_YES;
    }
    if (*upload_size) {
        if (!k->too_large) {
            if (k->body.len + *upload_size > S->o.max_body) {
                k->too_large = true;
                ds4_strbuf_free(&k->body);
            } else {
                ds4_strbuf_append(&k->body, upload, *upload_size);
                if (k->body.failed) return MHD_NO;
            }
        }
        *upload_size = 0;
        if (ds4_now() - k->t_start > UPLOAD_DEADLINE_S) return fail(c, k->api, 408, "request body too slow");
        return MHD_YES;
    }
    if (k->j) return MHD_YES; /* answered already (a response is queued) */
    return handle(k, method);
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode toe) {
    (void)cls, (void)c;
    conn *k = *con_cls;
    if (!k) return;
    if (k->j) {
        if (toe != MHD_REQUEST_TERMINATED_COMPLETED_OK) k->j->cancel = 1;
        job_unref(k->j);
    }
    ds4_strbuf_free(&k->body);
    free(k);
    *con_cls = NULL;
}

static void mhd_log(void *cls, const char *fmt, va_list ap) {
    (void)cls;
    char msg[1024];
    vsnprintf(msg, sizeof(msg), fmt, ap);
    size_t n = strlen(msg);
    while (n && msg[n - 1] == '\n') msg[--n] = '\0';
    srv_log("http", "%s", msg);
}

int http_start(server *s, ds4_err *err) {
    S = s;
    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = htons((uint16_t)s->o.port)};
    const char *host = strcmp(s->o.host, "localhost") == 0 ? "127.0.0.1" : s->o.host;
    if (inet_pton(AF_INET, host, &addr.sin_addr) != 1) {
        struct addrinfo hints = {.ai_family = AF_INET}, *res = NULL;
        if (getaddrinfo(host, NULL, &hints, &res) != 0 || !res)
            return ds4_err_set(err, DS4_EINVAL, "--host %s: not an IPv4 address or a resolvable name", s->o.host);
        addr.sin_addr = ((struct sockaddr_in *)res->ai_addr)->sin_addr;
        freeaddrinfo(res);
    }
    unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_POLL | MHD_USE_ERROR_LOG;
    daemon_ = MHD_start_daemon(flags, 0, NULL, NULL, on_request, NULL, MHD_OPTION_EXTERNAL_LOGGER, mhd_log, NULL,
                               MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&addr,
                               MHD_OPTION_CONNECTION_LIMIT, (unsigned)s->o.max_connections,
                               MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)s->o.connection_timeout_s,
                               MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)(128 * 1024), MHD_OPTION_NOTIFY_COMPLETED,
                               on_completed, NULL, MHD_OPTION_LISTENING_ADDRESS_REUSE, 1u, MHD_OPTION_LISTEN_BACKLOG_SIZE, 128u, MHD_OPTION_END);
    if (!daemon_) return ds4_err_set(err, DS4_EIO, "cannot listen on %s:%d (in use?)", s->o.host, s->o.port);
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(daemon_, MHD_DAEMON_INFO_BIND_PORT);
    srv_log("http", "listening on http://%s:%u", host, di ? di->port : (unsigned)s->o.port);
    return 0;
}

void http_stop(void) {
    if (daemon_) MHD_stop_daemon(daemon_);
    daemon_ = NULL;
}
