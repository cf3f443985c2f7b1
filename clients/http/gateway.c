/*
 * gateway.c: turbokv-http's HTTP server (see gateway.h): routing, limits,
 * authentication, and generation through libturbokv.
 *
 * libmicrohttpd runs each listener with a thread per connection
 * (MHD_USE_THREAD_PER_CONNECTION), so a handler may block. A generation is
 * a Job: a TkvClient connection to turbokvd of its own while it runs
 * (taken from and given back to the DaemonPool, daemonpool.h), and a
 * worker thread that runs tkv_generate() and appends what arrives to the
 * job's buffer under its lock. The connection's thread waits on that buffer: for a
 * whole answer until Done, for a stream until the first token (so that
 * an error before any output still gets its own HTTP status), then as
 * libmicrohttpd's content reader. While it waits it polls the client's
 * socket every WAIT_MS; a client that has gone (POLLRDHUP/POLLHUP) or a
 * gateway that stops cancels the generation (tkv_cancel, which only sets a
 * flag), and the job is freed once the worker has returned.
 *
 * Connection reuse: a job's connection goes back to the pool only when
 * its generation ended with Done and nothing ever called tkv_cancel on it
 * (a cancel that arrives after the end would stay pending in the client
 * and cancel its next request). A reused connection that turns out to be
 * dead (SERVER_CLOSED or TIMEOUT before any output: the daemon restarted
 * or timed it out while idle) is replaced by a fresh one and the request
 * sent again, once. The job's client pointer changes only then, under
 * the job's lock, which every tkv_cancel of a job holds.
 *
 * Limits: the body (max_body_bytes, 413), the request line and headers
 * (max_header_bytes, counted here so that the 431 is JSON like every other
 * error; libmicrohttpd's per-connection buffer is HEADER_POOL_FACTOR times
 * larger, and only a request past that gets its own plain 431), idle and
 * slow connections (timeout_s, libmicrohttpd closes them; switched off
 * once a generation runs, whose end the client's presence decides), and
 * max_requests concurrent requests (503).
 */
#include <errno.h>
#include <jansson.h>
#include <microhttpd.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/util.h"
#include "clients/http/daemonpool.h"
#include "clients/http/gateway.h"
#include "clients/http/httpreq.h"
#include "clients/http/reply.h"
#include "turbokv/client.h"

#define CLIENT_NAME "turbokv-http/" TKV_VERSION
#define WAIT_MS 100
#define SESSION_HEADER "X-Turbokv-Session"
/* libmicrohttpd's connection pool holds the request line, the headers and
 * the read buffer; twice our header limit plus slack lets us see and count
 * any request up to the limit and somewhat past it. */
#define HEADER_POOL_FACTOR 2
#define HEADER_POOL_SLACK 16384
/* Idle daemon connections kept (at most max_requests), and for how long. */
#define DAEMON_POOL_IDLE 4u
#define DAEMON_POOL_IDLE_S 60u

struct Gateway {
	GatewayConfig cfg;
	DaemonPool *pool;
	struct MHD_Daemon *mhd[GATEWAY_MAX_LISTENERS];
	size_t n_mhd;
	atomic_uint in_flight;
	atomic_bool stopping;
	atomic_ullong next_id;
};

typedef enum Route {
	ROUTE_NONE = 0,
	ROUTE_ROOT,
	ROUTE_HEALTH,
	ROUTE_OPENAI_CHAT,
	ROUTE_OPENAI_COMPLETION,
	ROUTE_OPENAI_MODELS,
	ROUTE_OLLAMA_CHAT,
	ROUTE_OLLAMA_GENERATE,
	ROUTE_OLLAMA_TAGS,
	ROUTE_OLLAMA_SHOW,
	ROUTE_OLLAMA_VERSION,
	ROUTE_OLLAMA_PS,
} Route;

static const struct {
	const char *path;
	const char *method;
	Route route;
} routes[] = {
	{ "/", "GET", ROUTE_ROOT },
	{ "/health", "GET", ROUTE_HEALTH },
	{ "/v1/chat/completions", "POST", ROUTE_OPENAI_CHAT },
	{ "/v1/completions", "POST", ROUTE_OPENAI_COMPLETION },
	{ "/v1/models", "GET", ROUTE_OPENAI_MODELS },
	{ "/api/chat", "POST", ROUTE_OLLAMA_CHAT },
	{ "/api/generate", "POST", ROUTE_OLLAMA_GENERATE },
	{ "/api/tags", "GET", ROUTE_OLLAMA_TAGS },
	{ "/api/show", "POST", ROUTE_OLLAMA_SHOW },
	{ "/api/version", "GET", ROUTE_OLLAMA_VERSION },
	{ "/api/ps", "GET", ROUTE_OLLAMA_PS },
};

/* A growing byte buffer. */
typedef struct Buf {
	char *data;
	size_t len, cap;
} Buf;

static int buf_append(Buf *b, const char *s, size_t n)
{
	size_t need;
	if (size_add_overflows(b->len, n + 1, &need))
		return -ENOMEM;
	if (need > b->cap) {
		size_t cap = MAX(need, b->cap * 2);
		char *d = realloc(b->data, cap);
		if (!d)
			return -ENOMEM;
		b->data = d;
		b->cap = cap;
	}
	memcpy(b->data + b->len, s, n);
	b->len += n;
	b->data[b->len] = 0;
	return 0;
}

/* One HTTP request, from its headers to its completion (libmicrohttpd's con_cls). */
typedef struct Exchange {
	Route route;
	bool openai;      /* errors in OpenAI's format (/v1/...), else Ollama's */
	Buf body;
	bool too_large;
} Exchange;

/* ------------------------------------------------------------------------ */
/* Responses */

static enum MHD_Result send_text(struct MHD_Connection *conn, unsigned status, const char *ctype,
				 char *body, const char *ignored)
{
	static const char oom[] = "{\"error\":\"out of memory\"}";
	struct MHD_Response *resp;
	if (body)
		resp = MHD_create_response_from_buffer(strlen(body), body, MHD_RESPMEM_MUST_FREE);
	else
		resp = MHD_create_response_from_buffer(sizeof(oom) - 1, (void *)oom, MHD_RESPMEM_PERSISTENT);
	if (!resp) {
		free(body);
		return MHD_NO;
	}
	if (!body)
		status = MHD_HTTP_INTERNAL_SERVER_ERROR;
	MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, ctype);
	if (ignored && ignored[0])
		MHD_add_response_header(resp, "X-Turbokv-Ignored", ignored);
	if (status == MHD_HTTP_UNAUTHORIZED)
		MHD_add_response_header(resp, MHD_HTTP_HEADER_WWW_AUTHENTICATE, "Bearer");
	enum MHD_Result r = MHD_queue_response(conn, status, resp);
	MHD_destroy_response(resp);
	return r;
}

static enum MHD_Result send_json(struct MHD_Connection *conn, unsigned status, char *body)
{
	return send_text(conn, status, "application/json", body, NULL);
}

/* Send j (reference stolen; NULL: out of memory). */
static enum MHD_Result send_json_value(struct MHD_Connection *conn, unsigned status, json_t *j)
{
	char *body = j ? json_dumps(j, JSON_COMPACT) : NULL;
	if (j)
		json_decref(j);
	return send_json(conn, status, body);
}

static enum MHD_Result send_error(struct MHD_Connection *conn, bool openai, unsigned status,
				  const char *type, const char *param, const char *code, const char *msg)
{
	return send_json(conn, status, reply_error(openai, false, type, param, code, msg));
}

/* The HTTP status, OpenAI error type and code of a libturbokv error. */
static unsigned status_of(int code, const char **ret_type)
{
	*ret_type = "invalid_request_error";
	switch (code) {
	case TKV_E_CONTEXT_OVERFLOW:
	case TKV_E_SESSION_BAD_NAME:
	case TKV_E_INVALID_ARGUMENT:
	case TKV_E_ATTACHMENT_NOT_UTF8:
		return 400;
	case TKV_E_SESSION_NOT_FOUND:
		return 404;
	case TKV_E_SESSION_BUSY:
		return 409;
	case TKV_E_SESSION_QUOTA:
		return 507;
	case TKV_E_TOO_MANY_REQUESTS:
	case TKV_E_BUSY:
	case TKV_E_SHUTTING_DOWN:
	case TKV_E_CONNECT:
	case TKV_E_TIMEOUT:
	case TKV_E_CANCELLED:
		*ret_type = "server_error";
		return 503;
	default:
		*ret_type = "server_error";
		return 502;
	}
}

static enum MHD_Result send_tkv_error(struct MHD_Connection *conn, bool openai, int code,
				      const TkvError *err)
{
	const char *type;
	unsigned status = status_of(code, &type);
	const char *name = tkv_error_code_name(code);
	char *lower = NULL;
	if (name && (lower = strdup(name)))
		for (char *p = lower; *p; p++)
			*p = (char)(*p >= 'A' && *p <= 'Z' ? *p + 32 : *p);
	if (code == TKV_E_CONTEXT_OVERFLOW) {
		free(lower);
		lower = strdup("context_length_exceeded");
	}
	enum MHD_Result r = send_error(conn, openai, status, type, NULL, lower,
				       err->message[0] ? err->message : "the daemon failed");
	free(lower);
	return r;
}

/* ------------------------------------------------------------------------ */
/* Generation jobs */

typedef struct Job {
	Gateway *gw;
	HttpReq *req;
	TkvRequest treq;
	ReplyCtx ctx;
	char *model;            /* the daemon's model name, when the client named none (ctx.model) */
	TkvClient *client;      /* from gw->pool; replaced only under lock (job_run) */
	bool reused;            /* client came from the pool's idle connections */
	int conn_fd;            /* the HTTP client's socket, borrowed, polled for hang-up */
	bool stream;
	pthread_t thread;
	bool thread_started, joined;
	pthread_mutex_t lock;
	pthread_cond_t cond;
	/* Under lock: */
	Buf out;                /* stream: framed bytes not sent yet (out.data[out_pos..len)) */
	size_t out_pos;
	Buf text;               /* whole answer: the text so far */
	bool got_token, done, oom;
	bool cancelled;         /* tkv_cancel was called on client: never reuse it */
	int rc;
	TkvError err;
	TkvResult result;
} Job;

static bool peer_gone(int fd)
{
	struct pollfd p = { .fd = fd, .events = POLLRDHUP };
	return fd >= 0 && poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL));
}

/* With j->lock held: cancel the generation, and mark the connection as not reusable. */
static void job_cancel_locked(Job *j)
{
	j->cancelled = true;
	tkv_cancel(j->client, 0);
}

/*
 * End the generation (cancelled unless it is done), wait for the worker,
 * and give the connection back to the pool, as reusable only if clean.
 * Called at the end of a stream (before its last chunk goes out, so that
 * the client's next request finds the connection idle) and by job_free.
 */
static void job_release(Job *j)
{
	if (j->thread_started && !j->joined) {
		pthread_mutex_lock(&j->lock);
		if (!j->done)
			job_cancel_locked(j);
		pthread_mutex_unlock(&j->lock);
		pthread_join(j->thread, NULL);
		j->joined = true;
	}
	/* The worker has returned: nobody else touches the client now. */
	bool clean = !j->thread_started ||
		     (j->done && j->rc == 0 && !j->oom && j->result.finish_reason != TKV_FINISH_CANCELLED);
	j->client = daemonpool_give(j->gw->pool, j->client, clean && !j->cancelled);
}

static void job_free(Job *j)
{
	if (!j)
		return;
	job_release(j);
	free(j->model);
	httpreq_free(j->req);
	free(j->out.data);
	free(j->text.data);
	pthread_mutex_destroy(&j->lock);
	pthread_cond_destroy(&j->cond);
	atomic_fetch_sub(&j->gw->in_flight, 1);
	free(j);
}

static void job_free_cb(void *cls)
{
	job_free(cls);
}

static void job_on_token(uint64_t request_id, const char *text, size_t len, uint32_t token_id,
			 void *userdata)
{
	Job *j = userdata;
	char *ev = j->stream ? reply_stream_delta(&j->ctx, text, len) : NULL;
	pthread_mutex_lock(&j->lock);
	int r = j->stream ? (ev ? buf_append(&j->out, ev, strlen(ev)) : -ENOMEM) :
			    buf_append(&j->text, text, len);
	if (r < 0) {
		j->oom = true;
		job_cancel_locked(j);
	}
	j->got_token = true;
	pthread_cond_broadcast(&j->cond);
	pthread_mutex_unlock(&j->lock);
	free(ev);
}

/*
 * After tkv_generate failed with *r: if the connection came from the pool
 * and was found dead before any output, swap in a fresh one (under the
 * lock, so that a concurrent cancel reaches one of the two and is not
 * lost). Returns true to send the request again; false with *r and *err
 * the error to report.
 */
static bool job_reconnect(Job *j, int *r, TkvError *err)
{
	TkvClient *fresh = NULL;

	pthread_mutex_lock(&j->lock);
	bool retry = j->reused && !j->got_token && !j->cancelled &&
		     (*r == TKV_E_SERVER_CLOSED || *r == TKV_E_TIMEOUT);
	j->reused = false;
	pthread_mutex_unlock(&j->lock);
	if (!retry)
		return false;
	int k = daemonpool_connect(j->gw->pool, &fresh, err);
	if (k != 0) {
		*r = k;
		return false;
	}
	pthread_mutex_lock(&j->lock);
	TkvClient *dead = j->client;
	j->client = fresh;
	if (j->cancelled) /* a cancel that reached the dead connection meanwhile */
		tkv_cancel(j->client, 0);
	pthread_mutex_unlock(&j->lock);
	tkv_client_free(dead);
	return true;
}

static void *job_run(void *arg)
{
	Job *j = arg;
	TkvResult res = { 0 };
	TkvError err = { 0 };
	TkvCallbacks cb = { .on_token = job_on_token, .userdata = j };
	char *end = NULL;

	int r;
	while ((r = tkv_generate(j->client, &j->treq, &cb, &res, &err)) != 0 && job_reconnect(j, &r, &err))
		;
	pthread_mutex_lock(&j->lock);
	bool started = j->got_token;
	pthread_mutex_unlock(&j->lock);
	if (j->stream && r == 0)
		end = reply_stream_end(&j->ctx, &res);
	else if (j->stream && started)
		end = reply_error(reply_api_is_openai(j->ctx.api), true, "server_error", NULL,
				  tkv_error_code_name(r), err.message);
	pthread_mutex_lock(&j->lock);
	if (end && buf_append(&j->out, end, strlen(end)) < 0)
		j->oom = true;
	j->rc = r;
	j->err = err;
	j->result = res;
	j->done = true;
	pthread_cond_broadcast(&j->cond);
	pthread_mutex_unlock(&j->lock);
	free(end);
	return NULL;
}

/* What job_wait() waits for, besides the end of the generation. */
typedef enum JobWait {
	JOB_WAIT_DONE = 0,  /* only the end */
	JOB_WAIT_FIRST,     /* a first token */
	JOB_WAIT_DATA,      /* stream bytes not sent yet */
} JobWait;

static bool job_ready(const Job *j, JobWait w)
{
	return j->done || (w == JOB_WAIT_FIRST && j->got_token) ||
	       (w == JOB_WAIT_DATA && j->out_pos < j->out.len);
}

/*
 * With j->lock held: wait until job_ready(j, w). Returns false if the
 * client hung up or the gateway stops.
 */
static bool job_wait(Job *j, JobWait w)
{
	while (!job_ready(j, w)) {
		if (peer_gone(j->conn_fd) || atomic_load(&j->gw->stopping))
			return false;
		struct timespec ts;
		clock_gettime(CLOCK_MONOTONIC, &ts);
		ts.tv_nsec += WAIT_MS * 1000000L;
		if (ts.tv_nsec >= 1000000000L) {
			ts.tv_sec++;
			ts.tv_nsec -= 1000000000L;
		}
		pthread_cond_timedwait(&j->cond, &j->lock, &ts);
	}
	return true;
}

/* libmicrohttpd's content reader of a stream. */
static ssize_t job_read(void *cls, uint64_t pos, char *buf, size_t max)
{
	Job *j = cls;
	pthread_mutex_lock(&j->lock);
	if (!job_wait(j, JOB_WAIT_DATA)) {
		if (!j->done)
			job_cancel_locked(j);
		pthread_mutex_unlock(&j->lock);
		return MHD_CONTENT_READER_END_WITH_ERROR;
	}
	size_t avail = j->out.len - j->out_pos;
	if (avail == 0) {
		pthread_mutex_unlock(&j->lock);
		job_release(j);
		return MHD_CONTENT_READER_END_OF_STREAM;
	}
	size_t n = MIN(avail, max);
	memcpy(buf, j->out.data + j->out_pos, n);
	j->out_pos += n;
	if (j->out_pos == j->out.len)
		j->out_pos = j->out.len = 0;
	pthread_mutex_unlock(&j->lock);
	return (ssize_t)n;
}

static Job *job_new(Gateway *gw, HttpReq *req)
{
	Job *j = calloc(1, sizeof(*j));
	if (!j)
		return NULL;
	j->gw = gw;
	j->req = req;
	j->conn_fd = -1;
	pthread_condattr_t ca;
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&j->cond, &ca);
	pthread_condattr_destroy(&ca);
	pthread_mutex_init(&j->lock, NULL);
	atomic_fetch_add(&gw->in_flight, 1);
	return j;
}

/* The TkvRequest of req: with a session, only the turns the daemon has not seen. */
static void job_fill_request(Job *j)
{
	HttpReq *req = j->req;
	size_t first = req->session ? httpreq_new_turns_start(req) : 0;
	j->treq = (TkvRequest){
		.messages = req->messages + first,
		.n_messages = req->n_messages - first,
		.raw_prompt = req->raw_prompt,
		.sampling = req->sampling.set ? &req->sampling : NULL,
		.max_tokens = req->max_tokens,
		.stop = (const char *const *)req->stop,
		.n_stop = req->n_stop,
		.session = req->session,
	};
	j->stream = req->stream;
	j->ctx = (ReplyCtx){ .api = req->api, .model = req->model, .created = time(NULL),
		.include_usage = req->include_usage };
	snprintf(j->ctx.id, sizeof(j->ctx.id), "%s-%llx%08llx",
		 req->api == HTTP_API_OPENAI_COMPLETION ? "cmpl" : "chatcmpl", (long long)j->ctx.created,
		 (unsigned long long)atomic_fetch_add(&j->gw->next_id, 1));
}

static void ignored_list(const HttpReq *req, char *buf, size_t size)
{
	buf[0] = 0;
	for (size_t i = 0, o = 0; i < req->n_ignored && o < size; i++)
		o += (size_t)snprintf(buf + o, size - o, "%s%s", i ? ", " : "", req->ignored[i]);
}

static enum MHD_Result serve_generate(Gateway *gw, Exchange *x, struct MHD_Connection *conn,
				      HttpApi api)
{
	HttpReq *req = NULL;
	HttpReqError perr;
	TkvError err = { 0 };
	char ignored[256];

	int r = httpreq_parse(api, x->body.data ? x->body.data : "", x->body.len, &req, &perr);
	if (r < 0)
		return send_json(conn, 500, NULL);
	if (r > 0)
		return send_error(conn, x->openai, perr.status, "invalid_request_error", perr.param, NULL,
				  perr.message);
	const char *hs = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, SESSION_HEADER);
	if (hs) {
		if (!tkv_session_name_valid(hs)) {
			httpreq_free(req);
			return send_error(conn, x->openai, 400, "invalid_request_error", SESSION_HEADER, NULL,
					  "a session name is 1 to 64 of [A-Za-z0-9._-]");
		}
		free(req->session);
		if (!(req->session = strdup(hs))) {
			httpreq_free(req);
			return send_json(conn, 500, NULL);
		}
	}
	ignored_list(req, ignored, sizeof(ignored));

	Job *j = job_new(gw, req);
	if (!j) {
		httpreq_free(req);
		return send_json(conn, 500, NULL);
	}
	if (atomic_load(&gw->in_flight) > gw->cfg.max_requests) {
		job_free(j);
		return send_error(conn, x->openai, 503, "server_error", NULL, "too_many_requests",
				  "too many requests in flight; try again");
	}
	job_fill_request(j);
	if (req->n_messages == 0 && !req->raw_prompt) {
		/* Ollama: a request without messages or prompt only loads the model. */
		TkvResult none = { .finish_reason = TKV_FINISH_STOP };
		bool stream = j->stream;
		char *body = stream ? reply_stream_end(&j->ctx, &none) : reply_whole(&j->ctx, &none, "", 0);
		job_free(j);
		return send_text(conn, 200, stream ? "application/x-ndjson" : "application/json", body,
				 ignored);
	}
	r = daemonpool_take(gw->pool, &j->client, &j->reused, &err);
	if (r != 0) {
		job_free(j);
		return send_tkv_error(conn, x->openai, r, &err);
	}
	if (!j->ctx.model[0]) { /* echo the daemon's model when the client named none */
		if (!(j->model = strdup(tkv_client_server_info(j->client)->model_name))) {
			job_free(j);
			return send_json(conn, 500, NULL);
		}
		j->ctx.model = j->model;
	}
	const union MHD_ConnectionInfo *ci = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
	j->conn_fd = ci ? ci->connect_fd : -1;
	MHD_set_connection_option(conn, MHD_CONNECTION_OPTION_TIMEOUT, 0u);
	if (j->stream) {
		char *start = reply_stream_start(&j->ctx);
		if (!start || buf_append(&j->out, start, strlen(start)) < 0) {
			free(start);
			job_free(j);
			return send_json(conn, 500, NULL);
		}
		free(start);
	}
	if (pthread_create(&j->thread, NULL, job_run, j) != 0) {
		job_free(j);
		return send_json(conn, 500, NULL);
	}
	j->thread_started = true;

	pthread_mutex_lock(&j->lock);
	bool ok = job_wait(j, j->stream ? JOB_WAIT_FIRST : JOB_WAIT_DONE);
	bool failed = j->done && (j->rc != 0 || j->oom) && (!j->stream || !j->got_token);
	pthread_mutex_unlock(&j->lock);
	if (!ok) { /* the client left: cancel, and close the connection */
		job_free(j);
		return MHD_NO;
	}
	if (failed) {
		enum MHD_Result res = j->oom ? send_json(conn, 500, NULL) :
					       send_tkv_error(conn, x->openai, j->rc, &j->err);
		job_free(j);
		return res;
	}
	if (!j->stream) {
		char *body = reply_whole(&j->ctx, &j->result, j->text.data, j->text.len);
		job_free(j);
		return send_text(conn, 200, "application/json", body, ignored);
	}
	struct MHD_Response *resp = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 4096, job_read,
								      j, job_free_cb);
	if (!resp) {
		job_free(j);
		return MHD_NO;
	}
	MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE,
				x->openai ? "text/event-stream" : "application/x-ndjson");
	MHD_add_response_header(resp, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
	if (ignored[0])
		MHD_add_response_header(resp, "X-Turbokv-Ignored", ignored);
	enum MHD_Result res = MHD_queue_response(conn, 200, resp);
	MHD_destroy_response(resp);
	return res;
}

/* ------------------------------------------------------------------------ */
/* Model information */

static json_t *ollama_details(const TkvServerInfo *si)
{
	return json_pack("{s:s,s:s,s:s,s:[s],s:s,s:s}", "parent_model", "", "format", "gguf", "family", "",
			 "families", "", "parameter_size", "", "quantization_level", si->kv_type);
}

static enum MHD_Result serve_info(Gateway *gw, Exchange *x, struct MHD_Connection *conn)
{
	TkvClient *c = NULL;
	TkvError err = { 0 };
	json_t *j = NULL;
	bool reused;

	int r = daemonpool_take(gw->pool, &c, &reused, &err);
	if (r == 0 && reused) {
		/* An idle connection may be dead (or from a daemon since replaced):
		 * a Status round trip proves it, else a fresh one answers. */
		TkvStatus *st = NULL;
		if (tkv_status(c, &st, &err) != 0) {
			c = daemonpool_give(gw->pool, c, false);
			r = daemonpool_connect(gw->pool, &c, &err);
		}
		tkv_status_free(st);
	}
	if (r != 0) {
		if (x->route == ROUTE_HEALTH)
			return send_json_value(conn, 503, json_pack("{s:s,s:s}", "status", "unavailable",
								    "error", err.message));
		return send_tkv_error(conn, x->openai, r, &err);
	}
	const TkvServerInfo *si = tkv_client_server_info(c);
	const char *name = si->model_name;
	char ts[32];
	time_t now = time(NULL);
	struct tm tm;
	gmtime_r(&now, &tm);
	strftime(ts, sizeof(ts), "%Y-%m-%dT%H:%M:%SZ", &tm);

	switch (x->route) {
	case ROUTE_HEALTH:
		j = json_pack("{s:s,s:s,s:s}", "status", "ok", "model", name, "server_version",
			      si->server_version);
		break;
	case ROUTE_OPENAI_MODELS:
		j = json_pack("{s:s,s:[{s:s,s:s,s:I,s:s}]}", "object", "list", "data", "id", name, "object",
			      "model", "created", (json_int_t)0, "owned_by", "turbokv");
		break;
	case ROUTE_OLLAMA_TAGS:
		j = json_pack("{s:[{s:s,s:s,s:s,s:I,s:s,s:o}]}", "models", "name", name, "model", name,
			      "modified_at", ts, "size", (json_int_t)0, "digest", si->model_fingerprint,
			      "details", ollama_details(si));
		break;
	case ROUTE_OLLAMA_PS:
		j = json_pack("{s:[{s:s,s:s,s:I,s:s,s:o,s:s,s:I,s:I}]}", "models", "name", name, "model", name,
			      "size", (json_int_t)0, "digest", si->model_fingerprint, "details",
			      ollama_details(si), "expires_at", "2999-12-31T00:00:00Z", "size_vram",
			      (json_int_t)0, "context_length", (json_int_t)si->context_size);
		break;
	case ROUTE_OLLAMA_SHOW:
		j = json_pack("{s:s,s:s,s:s,s:o,s:{s:I,s:s,s:s},s:[s],s:s}", "modelfile", "", "parameters", "",
			      "template", "", "details", ollama_details(si), "model_info",
			      "turbokv.context_length", (json_int_t)si->context_size, "turbokv.kv_type",
			      si->kv_type, "turbokv.device", si->device, "capabilities", "completion",
			      "modified_at", ts);
		break;
	default:
		break;
	}
	enum MHD_Result res = send_json_value(conn, 200, j); /* j holds copies of si's strings */
	daemonpool_give(gw->pool, c, true);
	return res;
}

/* ------------------------------------------------------------------------ */
/* libmicrohttpd callbacks */

static bool token_ok(const Gateway *gw, struct MHD_Connection *conn)
{
	const char *want = gw->cfg.token, *auth;
	if (!want || !want[0])
		return true;
	auth = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
	if (!auth || strncmp(auth, "Bearer ", 7) != 0)
		return false;
	auth += 7;
	size_t n = strlen(want), m = strlen(auth);
	unsigned char diff = n != m;
	for (size_t i = 0; i < n; i++) /* constant time in the token's length */
		diff |= (unsigned char)(want[i] ^ (i < m ? auth[i] : 0));
	return diff == 0;
}

static enum MHD_Result add_header_bytes(void *cls, enum MHD_ValueKind kind, const char *key,
					const char *value)
{
	(void)kind;
	size_t *n = cls;
	*n += strlen(key) + 4 + (value ? strlen(value) : 0); /* "key: value\r\n" */
	return MHD_YES;
}

/* Bytes of the request line and headers as the client sent them (near enough:
 * the version and separators are counted as a constant). */
static size_t request_head_bytes(struct MHD_Connection *conn, const char *method, const char *url)
{
	size_t n = strlen(method) + 1 + strlen(url) + 11; /* " HTTP/1.1\r\n" */
	MHD_get_connection_values(conn, MHD_HEADER_KIND, add_header_bytes, &n);
	return n;
}

/* The route of (method, url); *ret_bad_method when the path exists under another method. */
static Route route_of(const char *method, const char *url, bool *ret_bad_method)
{
	*ret_bad_method = false;
	for (size_t i = 0; i < ARRAY_SIZE(routes); i++) {
		if (strcmp(url, routes[i].path) != 0)
			continue;
		if (!strcmp(method, routes[i].method) ||
		    (!strcmp(method, "HEAD") && !strcmp(routes[i].method, "GET")))
			return routes[i].route;
		*ret_bad_method = true;
	}
	return ROUTE_NONE;
}

static enum MHD_Result serve(Gateway *gw, Exchange *x, struct MHD_Connection *conn)
{
	switch (x->route) {
	case ROUTE_ROOT:
		return send_text(conn, 200, "text/plain", strdup("turbokv-http is running\n"), NULL);
	case ROUTE_OLLAMA_VERSION:
		return send_json(conn, 200, strdup("{\"version\":\"" TKV_VERSION "\"}"));
	case ROUTE_OPENAI_CHAT:
		return serve_generate(gw, x, conn, HTTP_API_OPENAI_CHAT);
	case ROUTE_OPENAI_COMPLETION:
		return serve_generate(gw, x, conn, HTTP_API_OPENAI_COMPLETION);
	case ROUTE_OLLAMA_CHAT:
		return serve_generate(gw, x, conn, HTTP_API_OLLAMA_CHAT);
	case ROUTE_OLLAMA_GENERATE:
		return serve_generate(gw, x, conn, HTTP_API_OLLAMA_GENERATE);
	default:
		return serve_info(gw, x, conn);
	}
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url,
				  const char *method, const char *version, const char *upload_data,
				  size_t *upload_data_size, void **con_cls)
{
	Gateway *gw = cls;
	Exchange *x = *con_cls;

	if (!x) { /* headers only */
		bool bad_method;
		if (!(x = calloc(1, sizeof(*x))))
			return MHD_NO;
		*con_cls = x;
		x->route = route_of(method, url, &bad_method);
		x->openai = strncmp(url, "/api/", 5) != 0;
		if (request_head_bytes(conn, method, url) > gw->cfg.max_header_bytes)
			return send_error(conn, x->openai, 431, "invalid_request_error", NULL,
					  "headers_too_large",
					  "the request line and headers are too large");
		if (x->route == ROUTE_NONE)
			return send_error(conn, x->openai, bad_method ? 405 : 404, "invalid_request_error",
					  NULL, bad_method ? "method_not_allowed" : "not_found",
					  bad_method ? "method not allowed on this path" :
						       "no such route (see docs/http.md)");
		if (x->route != ROUTE_HEALTH && x->route != ROUTE_ROOT && !token_ok(gw, conn))
			return send_error(conn, x->openai, 401, "invalid_request_error", NULL,
					  "invalid_api_key", "a valid bearer token is required");
		const char *cl = MHD_lookup_connection_value(conn, MHD_HEADER_KIND,
							     MHD_HTTP_HEADER_CONTENT_LENGTH);
		if (cl && strtoull(cl, NULL, 10) > gw->cfg.max_body_bytes)
			return send_error(conn, x->openai, 413, "invalid_request_error", NULL,
					  "request_too_large", "the request body is too large");
		return MHD_YES;
	}
	if (*upload_data_size > 0) {
		size_t n = *upload_data_size;
		*upload_data_size = 0;
		if (!x->too_large && x->body.len + n > gw->cfg.max_body_bytes)
			x->too_large = true;
		if (x->too_large) {
			free(x->body.data);
			x->body = (Buf){ 0 };
			return MHD_YES;
		}
		return buf_append(&x->body, upload_data, n) < 0 ? MHD_NO : MHD_YES;
	}
	if (x->too_large)
		return send_error(conn, x->openai, 413, "invalid_request_error", NULL, "request_too_large",
				  "the request body is too large");
	return serve(gw, x, conn);
}

static void on_completed(void *cls, struct MHD_Connection *conn, void **con_cls,
			 enum MHD_RequestTerminationCode toe)
{
	Exchange *x = *con_cls;
	if (!x)
		return;
	free(x->body.data);
	free(x);
	*con_cls = NULL;
}

/* ------------------------------------------------------------------------ */

int gateway_new(const GatewayConfig *cfg, Gateway **ret)
{
	Gateway *gw = calloc(1, sizeof(*gw));
	if (!gw)
		return -ENOMEM;
	gw->cfg = *cfg;
	if (daemonpool_new(cfg->daemon_socket, CLIENT_NAME, MIN(cfg->max_requests, DAEMON_POOL_IDLE),
			   DAEMON_POOL_IDLE_S, &gw->pool) < 0) {
		free(gw);
		return -ENOMEM;
	}
	atomic_init(&gw->in_flight, 0);
	atomic_init(&gw->stopping, false);
	atomic_init(&gw->next_id, 1);
	*ret = gw;
	return 0;
}

int gateway_listen_fd(Gateway *gw, int fd)
{
	if (gw->n_mhd >= GATEWAY_MAX_LISTENERS)
		return -EINVAL;
	struct MHD_Daemon *d = MHD_start_daemon(
		MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_POLL |
			MHD_USE_ERROR_LOG,
		0, NULL, NULL, on_request, gw,
		MHD_OPTION_LISTEN_SOCKET, (MHD_socket)fd,
		MHD_OPTION_CONNECTION_LIMIT, (unsigned)(gw->cfg.max_requests + 16),
		MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)gw->cfg.timeout_s,
		MHD_OPTION_CONNECTION_MEMORY_LIMIT,
		(size_t)gw->cfg.max_header_bytes * HEADER_POOL_FACTOR + HEADER_POOL_SLACK,
		MHD_OPTION_NOTIFY_COMPLETED, on_completed, gw,
		MHD_OPTION_END);
	if (!d)
		return -EIO;
	gw->mhd[gw->n_mhd++] = d;
	return 0;
}

Gateway *gateway_free(Gateway *gw)
{
	if (!gw)
		return NULL;
	atomic_store(&gw->stopping, true);
	for (size_t i = 0; i < gw->n_mhd; i++)
		MHD_stop_daemon(gw->mhd[i]);
	gw->pool = daemonpool_free(gw->pool); /* every job has given its connection back */
	free(gw);
	return NULL;
}
