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
 * nothing to send (queue wait, long prefill).
 *
 * Also: GET /v1/models, /v1/models/{id}, /health, /v1/ds4/stats (counters)
 * and POST /v1/messages/count_tokens (Anthropic's prompt token count).
 *
 * Everything that can be decided from the headers is decided before the
 * body is read, and answered with the connection closed: the Host header
 * against the allow-list (a page that rebinds its DNS name to this
 * address must not reach a server without a key), the API key, the
 * method, Content-Type application/json on POST (a cross-site form cannot
 * send it without a CORS preflight, which is refused unless --cors), a
 * Content-Length over the body limit (413), and Content-Length together
 * with Transfer-Encoding (400: the two can disagree on where the body
 * ends, and a request smuggled after it must not be answered).
 *
 * Deadlines (the guard thread): a connection's headers must be complete
 * within --header-timeout seconds and its body within --body-timeout after
 * them; a client that trickles bytes to stay under the idle timeout is
 * shut down at its deadline, so a crowd of them cannot hold every
 * connection slot for long.  Other limits: header size (MHD's memory
 * limit), JSON nesting, values and memory (request.c), idle connections
 * (--timeout), at most max_connections at once, a bounded job queue (429)
 * and 503 while shutting down.  After a large request the memory it used
 * is handed back to the system (malloc_trim).
 *
 * A client that goes away cancels its job (queued jobs are skipped,
 * prefill and generation stop): a failed write, or a connection reset.
 * End of input alone is not enough, since a client may half-close its
 * sending side and still read the answer; a stream writes an SSE comment
 * at once on end of input, so that a peer that closed for good answers it
 * with a reset.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <malloc.h>
#include <microhttpd.h>
#include <netdb.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>

#include "engine/generate.h"
#include "server.h"

/* Bodies at least this large are followed by a malloc_trim. */
#define TRIM_AFTER_BYTES (1u << 20)

enum route { R_NONE, R_OPTIONS, R_MODELS, R_MODEL, R_STATS, R_HEALTH, R_API, R_COUNT };

/* A connection's deadline, watched by the guard thread. */
typedef struct guard {
    int fd;
    double deadline;  /* 0: none */
    const char *what; /* what has not arrived: "headers", "body" */
    bool fired;
    struct guard *prev, *next;
} guard;

typedef struct http_server {
    server *s;
    struct MHD_Daemon *daemon;
    char **hosts; /* extra allowed Host names (--allowed-hosts) */
    size_t n_hosts;
    bool any_host, any_ip;
    pthread_mutex_t mu; /* the guard list */
    pthread_cond_t cv;
    guard *guards;
    bool stop;
    pthread_t thread;
    bool thread_started;
} http_server;

typedef struct conn {
    http_server *h;
    enum route route;
    const api_adapter *api;
    char model_id[128];
    ds4_strbuf body;
    size_t body_bytes; /* received */
    bool answered;     /* an early answer is queued: ignore the rest */
    bool eof_probed;   /* end of input seen while streaming: probed once */
    double t_start;
    job *j;
    struct MHD_Connection *c;
    double last_write;
} conn;

/* ------------------------------------------------------------ responses */

static void add_cors(const http_server *h, struct MHD_Response *r) {
    if (!h->s->o.cors) return;
    MHD_add_response_header(r, "Access-Control-Allow-Origin", "*");
    MHD_add_response_header(r, "Access-Control-Allow-Methods", "GET, POST, OPTIONS");
    MHD_add_response_header(r, "Access-Control-Allow-Headers", "*");
}

static enum MHD_Result respond_json_ex(const http_server *h, struct MHD_Connection *c, int status, json_t *body,
                                       bool close) {
    char *s = json_dumps(body, JSON_COMPACT);
    json_decref(body);
    if (!s) return MHD_NO;
    struct MHD_Response *r = MHD_create_response_from_buffer(strlen(s), s, MHD_RESPMEM_MUST_FREE);
    if (!r) {
        free(s);
        return MHD_NO;
    }
    MHD_add_response_header(r, "Content-Type", "application/json");
    if (close) MHD_add_response_header(r, "Connection", "close");
    add_cors(h, r);
    enum MHD_Result ret = MHD_queue_response(c, (unsigned)status, r);
    MHD_destroy_response(r);
    return ret;
}

static enum MHD_Result respond_json(const http_server *h, struct MHD_Connection *c, int status, json_t *body) {
    return respond_json_ex(h, c, status, body, false);
}

static enum MHD_Result respond_error(const http_server *h, struct MHD_Connection *c, const api_adapter *api,
                                     const api_error *e) {
    return respond_json(h, c, e->status, api_error_body(api, e));
}

static enum MHD_Result fail(const http_server *h, struct MHD_Connection *c, const api_adapter *api, int status,
                            const char *msg) {
    api_error e = {0};
    api_fail(&e, status, "%s", msg);
    return respond_error(h, c, api, &e);
}

/* An answer decided from the headers, before the body was read: the
 * connection closes after it (the unread body must not be taken for the
 * next request). */
static enum MHD_Result refuse_early(conn *k, int status, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static enum MHD_Result refuse_early(conn *k, int status, const char *fmt, ...) {
    api_error e = {0};
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e.message, sizeof(e.message), fmt, ap);
    va_end(ap);
    e.status = status;
    k->answered = true;
    return respond_json_ex(k->h, k->c, status, api_error_body(k->api, &e), true);
}

static json_t *model_object(const server *s) {
    uint32_t maxc = s->o.default_max_tokens < s->o.ctx ? s->o.default_max_tokens : s->o.ctx;
    /* The id stays ds4's (clients name it); the name says which model runs. */
    const char *name = s->engine && s->engine->w ? ds4_config_name(&s->engine->w->cfg) : NULL;
    return json_pack("{s:s,s:s,s:i,s:s,s:s,s:i,s:{s:i,s:i,s:b},s:[s,s,s,s,s,s,s,s,s,s,s,s,s,s,s]}", "id", DS4_MODEL_ID,
                     "object", "model", "created", (json_int_t)DS4_MODEL_CREATED, "owned_by", "ds4.c", "name",
                     name ? name : "DeepSeek V4", "context_length", (json_int_t)s->o.ctx, "top_provider",
                     "context_length", (json_int_t)s->o.ctx, "max_completion_tokens", (json_int_t)maxc, "is_moderated",
                     0, "supported_parameters", "tools", "tool_choice", "max_tokens", "temperature", "top_p", "top_k",
                     "min_p", "stop", "seed", "stream", "reasoning_effort", "response_format", "logprobs",
                     "top_logprobs", "parallel_tool_calls");
}

/* ------------------------------------------------------------ routing */

static void route(conn *k, const char *url, const char *method) {
    static const struct {
        const char *path;
        const api_adapter *api;
    } apis[] = {
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

static bool authorized(const server *s, struct MHD_Connection *c) {
    if (!s->o.api_key) return true;
    const char *x = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "x-api-key");
    if (x && same_secret(x, s->o.api_key)) return true;
    const char *a = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization");
    return a && strncasecmp(a, "Bearer ", 7) == 0 && same_secret(a + 7, s->o.api_key);
}

/* ------------------------------------------------------------ hosts */

static bool is_ip_literal(const char *name) {
    unsigned char b[16];
    return inet_pton(AF_INET, name, b) == 1 || inet_pton(AF_INET6, name, b) == 1;
}

/* The host name of a Host header value: brackets of an IPv6 literal and
 * the port removed; false when it does not fit. */
static bool host_name(const char *v, char *out, size_t cap) {
    const char *end;
    if (*v == '[') {
        v++;
        if (!(end = strchr(v, ']'))) return false;
    } else {
        const char *colon = strchr(v, ':');
        end = colon && !strchr(colon + 1, ':') ? colon : v + strlen(v);
    }
    size_t n = (size_t)(end - v);
    if (n == 0 || n >= cap) return false;
    memcpy(out, v, n);
    out[n] = '\0';
    return true;
}

/* Loopback names and addresses, the --host value, the --allowed-hosts
 * names; any IP address when bound to every interface (a name is what a
 * rebinding attack needs); anything with "*". */
static bool host_allowed(const http_server *h, const char *value) {
    if (h->any_host) return true;
    if (!value) return true; /* HTTP/1.0: no Host, not a browser */
    char name[256];
    if (!host_name(value, name, sizeof(name))) return false;
    size_t n = strlen(name);
    if (n && name[n - 1] == '.') name[--n] = '\0';
    static const char *const local[] = {"localhost", "::1", NULL};
    for (int i = 0; local[i]; i++)
        if (strcasecmp(name, local[i]) == 0) return true;
    unsigned char a4[4];
    if (inet_pton(AF_INET, name, a4) == 1 && a4[0] == 127) return true;
    if (strcasecmp(name, h->s->o.host) == 0) return true;
    if (h->any_ip && is_ip_literal(name)) return true;
    for (size_t i = 0; i < h->n_hosts; i++)
        if (strcasecmp(name, h->hosts[i]) == 0) return true;
    return false;
}

static int parse_hosts(http_server *h, const char *list, ds4_err *err) {
    h->any_ip = strcmp(h->s->o.host, "0.0.0.0") == 0;
    if (!list) return 0;
    const char *p = list;
    while (*p) {
        size_t n = strcspn(p, ",");
        while (n && (*p == ' ')) p++, n--;
        while (n && p[n - 1] == ' ') n--;
        if (n == 1 && *p == '*') h->any_host = true;
        else if (n) {
            char **hs = realloc(h->hosts, (h->n_hosts + 1) * sizeof(*hs));
            if (!hs || !(hs[h->n_hosts] = strndup(p, n))) {
                if (hs) h->hosts = hs;
                return ds4_err_set(err, DS4_ENOMEM, "out of memory");
            }
            h->hosts = hs;
            h->n_hosts++;
        }
        p += strcspn(p, ",");
        if (*p == ',') p++;
    }
    return 0;
}

/* ------------------------------------------------------------ deadlines */

static void guard_set(http_server *h, struct MHD_Connection *c, double seconds, const char *what) {
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    guard *g = ci ? ci->socket_context : NULL;
    if (!g) return;
    pthread_mutex_lock(&h->mu);
    g->deadline = seconds > 0 ? ds4_now() + seconds : 0;
    g->what = what;
    pthread_mutex_unlock(&h->mu);
}

static void on_connection(void *cls, struct MHD_Connection *c, void **socket_context,
                          enum MHD_ConnectionNotificationCode toe) {
    http_server *h = cls;
    if (toe == MHD_CONNECTION_NOTIFY_STARTED) {
        const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
        guard *g = calloc(1, sizeof(*g));
        if (!g || !ci) {
            free(g);
            return;
        }
        g->fd = ci->connect_fd;
        g->deadline = ds4_now() + h->s->o.header_timeout_s;
        g->what = "headers";
        pthread_mutex_lock(&h->mu);
        g->next = h->guards;
        if (h->guards) h->guards->prev = g;
        h->guards = g;
        pthread_mutex_unlock(&h->mu);
        *socket_context = g;
        return;
    }
    guard *g = *socket_context;
    if (!g) return;
    /* MHD closes the socket after this notification: under the mutex, the
     * guard thread never shuts down a descriptor that was reused. */
    pthread_mutex_lock(&h->mu);
    if (g->prev) g->prev->next = g->next;
    else h->guards = g->next;
    if (g->next) g->next->prev = g->prev;
    pthread_mutex_unlock(&h->mu);
    free(g);
    *socket_context = NULL;
}

static void *guard_main(void *arg) {
    http_server *h = arg;
    pthread_mutex_lock(&h->mu);
    while (!h->stop) {
        double now = ds4_now();
        for (guard *g = h->guards; g; g = g->next) {
            if (!g->deadline || g->fired || now < g->deadline) continue;
            g->fired = true;
            /* logged first: the client sees the close only after it */
            srv_log("http", "closing a connection: its %s did not arrive in time", g->what);
            shutdown(g->fd, SHUT_RDWR);
        }
        ds4_cond_wait_for(&h->cv, &h->mu, 0.2);
    }
    pthread_mutex_unlock(&h->mu);
    return NULL;
}

/* ------------------------------------------------------------ clients */

enum { PEER_OK, PEER_EOF, PEER_GONE };

/* PEER_GONE: a reset or a socket error (the client closed for good, or a
 * write failed); PEER_EOF: it sent no more, which a half-close also does. */
static int peer_state(struct MHD_Connection *c) {
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (!ci) return PEER_OK;
    struct pollfd p = {.fd = ci->connect_fd, .events = POLLIN | POLLRDHUP};
    if (poll(&p, 1, 0) <= 0) return PEER_OK;
    if (p.revents & (POLLHUP | POLLERR | POLLNVAL)) return PEER_GONE;
    if (p.revents & POLLRDHUP) return PEER_EOF;
    if (p.revents & POLLIN) {
        char b;
        ssize_t r = recv(ci->connect_fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
        if (r == 0) return PEER_EOF;
        if (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) return PEER_GONE;
    }
    return PEER_OK;
}

static void deadline_in(struct timespec *ts, int ms) {
    clock_gettime(CLOCK_REALTIME, ts);
    ts->tv_nsec += (long)ms * 1000000L;
    ts->tv_sec += ts->tv_nsec / 1000000000L;
    ts->tv_nsec %= 1000000000L;
}

static ssize_t keepalive_comment(conn *k, char *buf, size_t max) {
    static const char ka[] = ": keepalive\n\n";
    size_t n = sizeof(ka) - 1 < max ? sizeof(ka) - 1 : max;
    memcpy(buf, ka, n);
    k->last_write = ds4_now();
    return (ssize_t)n;
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
        int peer = peer_state(k->c);
        if (peer == PEER_GONE) {
            job_cancel(k->h->s, j);
            pthread_mutex_unlock(&j->mu);
            return MHD_CONTENT_READER_END_WITH_ERROR;
        }
        bool probe = peer == PEER_EOF && !k->eof_probed;
        if (probe || (ds4_now() - k->last_write) * 1000.0 >= k->h->s->o.sse_keepalive_ms) {
            k->eof_probed |= probe;
            pthread_mutex_unlock(&j->mu);
            return keepalive_comment(k, buf, max);
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
    add_cors(k->h, r);
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
        if (!j->done && peer_state(k->c) == PEER_GONE) {
            job_cancel(k->h->s, j);
            pthread_mutex_unlock(&j->mu);
            return MHD_NO;
        }
    }
    json_t *body = j->body;
    j->body = NULL;
    int status = j->status;
    pthread_mutex_unlock(&j->mu);
    if (!body) return fail(k->h, k->c, j->api, 500, "no answer");
    return respond_json(k->h, k->c, status, body);
}

/* Parse the body with the route's adapter into a new job (k->j). */
static int parse_job(conn *k, api_error *e) {
    const api_adapter *api = k->api;
    json_t *body = req_load_json(k->body.p, k->body.len, e);
    if (!body) return -1;
    job *j = job_new(api);
    if (!j) {
        json_decref(body);
        return api_fail(e, 500, "out of memory");
    }
    k->j = j;
    int rc = api->parse(body, &j->req, e);
    json_decref(body);
    return rc;
}

static enum MHD_Result handle_api(conn *k) {
    struct MHD_Connection *c = k->c;
    const api_adapter *api = k->api;
    server *s = k->h->s;
    api_error e = {0};
    if (parse_job(k, &e) != 0) return respond_error(k->h, c, api, &e);
    job *j = k->j;
    const char *force = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "X-DS4-Test-Output");
    if (force && s->forced) {
        if (!json_object_get(s->forced, force)) return fail(k->h, c, api, 400, "unknown X-DS4-Test-Output name");
        j->req.force_name = strdup(force);
    }
    static const char *const prefix[] = {"chatcmpl-", "cmpl-", "resp_", "msg_"};
    random_id(j->id, sizeof(j->id), prefix[api->kind], 24);
    if (render_request(s, j, &e) != 0 || cont_prepare(s, j, &e) != 0) return respond_error(k->h, c, api, &e);
    trace_request(&s->trace, j, k->body.p, k->body.len);
    ds4_strbuf_free(&k->body);
    j->t_enqueued = ds4_now();
    ds4_err de = {0};
    if (ds4_dist_failed(s->engine->opts.dist, &de)) /* a rank of the pipeline is gone: until a restart */
        return fail(k->h, c, api, 503, de.msg);
    if (worker_enqueue(s, j, &e) != 0) return respond_error(k->h, c, api, &e);
    return j->req.stream ? start_stream(k) : wait_and_answer(k);
}

/* Anthropic's token counting: the prompt as it would be rendered. */
static enum MHD_Result handle_count(conn *k) {
    api_error e = {0};
    int rc = parse_job(k, &e);
    if (rc == 0) rc = render_count(k->h->s, k->j, &e);
    if (rc != 0) return respond_error(k->h, k->c, k->api, &e);
    return respond_json(k->h, k->c, 200, json_pack("{s:i}", "input_tokens", (json_int_t)k->j->tokens.n));
}

/* With the whole body: the routes that need it. */
static enum MHD_Result handle(conn *k) {
    struct MHD_Connection *c = k->c;
    server *s = k->h->s;
    if (k->route == R_API) return handle_api(k);
    if (k->route == R_COUNT) return handle_count(k);
    switch (k->route) {
    case R_MODELS:
        return respond_json(k->h, c, 200, json_pack("{s:s,s:[o]}", "object", "list", "data", model_object(s)));
    case R_MODEL:
        if (strcmp(k->model_id, DS4_MODEL_ID) != 0) return fail(k->h, c, NULL, 404, "unknown model");
        return respond_json(k->h, c, 200, model_object(s));
    case R_STATS: return respond_json(k->h, c, 200, worker_stats(s));
    default: return fail(k->h, c, NULL, 404, "unknown endpoint");
    }
}

/* The media type of a Content-Type value is application/json. */
static bool json_content_type(const char *v) {
    if (!v) return false;
    while (*v == ' ') v++;
    size_t n = strcspn(v, ";");
    while (n && v[n - 1] == ' ') n--;
    return n == 16 && strncasecmp(v, "application/json", 16) == 0;
}

/* Checks on the headers alone, before any of the body is read: MHD_YES
 * with nothing queued when the request goes on. */
static enum MHD_Result check_headers(conn *k, const char *method) {
    struct MHD_Connection *c = k->c;
    server *s = k->h->s;
    const char *host = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Host");
    if (!host_allowed(k->h, host))
        return refuse_early(k, 403, "Host \"%.200s\" is not allowed (DNS rebinding protection; see --allowed-hosts)",
                            host);
    const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Length");
    if (cl && MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Transfer-Encoding"))
        return refuse_early(k, 400, "Content-Length and Transfer-Encoding together are refused");
    if (k->route == R_OPTIONS) {
        struct MHD_Response *r = MHD_create_response_from_buffer(0, (void *)"", MHD_RESPMEM_PERSISTENT);
        add_cors(k->h, r);
        k->answered = true;
        enum MHD_Result ret = MHD_queue_response(c, MHD_HTTP_NO_CONTENT, r);
        MHD_destroy_response(r);
        return ret;
    }
    if (k->route == R_NONE) return refuse_early(k, 404, "unknown endpoint");
    if (k->route == R_HEALTH) {
        k->answered = true;
        return respond_json(k->h, c, 200, json_pack("{s:s}", "status", s->stopping ? "stopping" : "ok"));
    }
    if (!authorized(s, c)) return refuse_early(k, 401, "invalid or missing API key");
    bool post = strcmp(method, "POST") == 0;
    if (k->route == R_API || k->route == R_COUNT) {
        if (!post) return refuse_early(k, 405, "use POST");
        if (!json_content_type(MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Type")))
            return refuse_early(k, 415, "Content-Type must be application/json");
    } else if (strcmp(method, "GET") != 0 && strcmp(method, "HEAD") != 0) {
        return refuse_early(k, 405, "use GET");
    }
    if (cl) {
        char *end;
        errno = 0;
        unsigned long long n = strtoull(cl, &end, 10);
        if (errno || *end || end == cl || n > s->o.max_body)
            return refuse_early(k, 413, "request body larger than %llu MB", (unsigned long long)(s->o.max_body >> 20));
    }
    return MHD_YES;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                                  const char *version, const char *upload, size_t *upload_size, void **con_cls) {
    (void)version;
    http_server *h = cls;
    conn *k = *con_cls;
    if (!k) {
        if (!(k = calloc(1, sizeof(*k)))) return MHD_NO;
        *con_cls = k;
        k->h = h;
        k->c = c;
        k->t_start = ds4_now();
        route(k, url, method);
        guard_set(h, c, h->s->o.body_timeout_s, "body");
        return check_headers(k, method);
    }
    if (k->answered) {
        *upload_size = 0;
        return MHD_YES;
    }
    if (*upload_size) {
        k->body_bytes += *upload_size;
        if (k->body.len + *upload_size > h->s->o.max_body) {
            /* A chunked body past the limit: refused now, not at its end. */
            ds4_strbuf_free(&k->body);
            *upload_size = 0;
            return refuse_early(k, 413, "request body larger than %llu MB",
                                (unsigned long long)(h->s->o.max_body >> 20));
        }
        ds4_strbuf_append(&k->body, upload, *upload_size);
        if (k->body.failed) return MHD_NO;
        *upload_size = 0;
        return MHD_YES;
    }
    if (k->j) return MHD_YES; /* answered already (a response is queued) */
    guard_set(h, c, 0, NULL);
    return handle(k);
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode toe) {
    http_server *h = cls;
    conn *k = *con_cls;
    if (!k) return;
    /* A kept-alive connection waits (idle timeout) and then reads the next
     * request's headers. */
    guard_set(h, c, h->s->o.connection_timeout_s + h->s->o.header_timeout_s, "headers");
    if (k->j) {
        if (toe != MHD_REQUEST_TERMINATED_COMPLETED_OK) job_cancel(h->s, k->j);
        job_unref(k->j);
    }
    ds4_strbuf_free(&k->body);
    bool large = k->body_bytes >= TRIM_AFTER_BYTES;
    free(k);
    *con_cls = NULL;
    if (large) malloc_trim(0);
}

static void mhd_log(void *cls, const char *fmt, va_list ap) {
    (void)cls;
    char msg[1024];
    vsnprintf(msg, sizeof(msg), fmt, ap);
    size_t n = strlen(msg);
    while (n && msg[n - 1] == '\n') msg[--n] = '\0';
    srv_log("http", "%s", msg);
}

static void http_free(http_server *h) {
    if (!h) return;
    if (h->thread_started) {
        pthread_mutex_lock(&h->mu);
        h->stop = true;
        pthread_cond_broadcast(&h->cv);
        pthread_mutex_unlock(&h->mu);
        pthread_join(h->thread, NULL);
    }
    for (size_t i = 0; i < h->n_hosts; i++) free(h->hosts[i]);
    free(h->hosts);
    pthread_mutex_destroy(&h->mu);
    pthread_cond_destroy(&h->cv);
    free(h);
}

int http_start(server *s, ds4_err *err) {
    http_server *h = calloc(1, sizeof(*h));
    if (!h) return ds4_err_set(err, DS4_ENOMEM, "out of memory");
    h->s = s;
    pthread_mutex_init(&h->mu, NULL);
    pthread_cond_init(&h->cv, NULL);
    s->http = h;
    if (parse_hosts(h, s->o.allowed_hosts, err) != 0) return -1;
    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = htons((uint16_t)s->o.port)};
    const char *host = strcmp(s->o.host, "localhost") == 0 ? "127.0.0.1" : s->o.host;
    if (inet_pton(AF_INET, host, &addr.sin_addr) != 1) {
        struct addrinfo hints = {.ai_family = AF_INET}, *res = NULL;
        if (getaddrinfo(host, NULL, &hints, &res) != 0 || !res)
            return ds4_err_set(err, DS4_EINVAL, "--host %s: not an IPv4 address or a resolvable name", s->o.host);
        addr.sin_addr = ((struct sockaddr_in *)res->ai_addr)->sin_addr;
        freeaddrinfo(res);
    }
    if (pthread_create(&h->thread, NULL, guard_main, h) != 0)
        return ds4_err_set(err, DS4_EIO, "cannot start the connection guard thread");
    h->thread_started = true;
    unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_POLL | MHD_USE_ERROR_LOG;
    h->daemon = MHD_start_daemon(
        flags, 0, NULL, NULL, on_request, h, MHD_OPTION_EXTERNAL_LOGGER, mhd_log, NULL, MHD_OPTION_SOCK_ADDR,
        (struct sockaddr *)&addr, MHD_OPTION_CONNECTION_LIMIT, (unsigned)s->o.max_connections,
        MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)s->o.connection_timeout_s, MHD_OPTION_CONNECTION_MEMORY_LIMIT,
        (size_t)(128 * 1024), MHD_OPTION_NOTIFY_COMPLETED, on_completed, h, MHD_OPTION_NOTIFY_CONNECTION, on_connection,
        h, MHD_OPTION_LISTENING_ADDRESS_REUSE, 1u, MHD_OPTION_LISTEN_BACKLOG_SIZE, 128u, MHD_OPTION_END);
    if (!h->daemon) return ds4_err_set(err, DS4_EIO, "cannot listen on %s:%d (in use?)", s->o.host, s->o.port);
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(h->daemon, MHD_DAEMON_INFO_BIND_PORT);
    srv_log("http", "listening on http://%s:%u", host, di ? di->port : (unsigned)s->o.port);
    return 0;
}

void http_stop(server *s) {
    http_server *h = s->http;
    if (!h) return;
    if (h->daemon) MHD_stop_daemon(h->daemon);
    http_free(h);
    s->http = NULL;
}
