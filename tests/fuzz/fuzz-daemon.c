/*
 * fuzz-daemon.c: libFuzzer target for the daemon's message handling
 * (daemon/connection.c, request.c, stream.c; ipc/frame.c and fdpass.c;
 * proto/), not just frame decoding.
 *
 * A real Connection on one end of a socketpair, inside a Manager set up
 * as manager_startup() does but with no listener: the tiny qwen2 model of
 * tests/data/tiny (random weights, 256 tokens, its own byte tokenizer;
 * FUZZ_DATA_DIR or $TKV_TEST_DATA), one thread, a context of FUZZ_CTX
 * tokens, the scheduler (requests really run: prefill, batched decode,
 * sampling, stop strings, Done) and sessions in a scratch state directory.
 * The input is what a client sends: byte 0 sets the write chunk size
 * (1..256 bytes, so frames arrive split at every offset), the rest goes
 * down the socket, the loop running between chunks; then the client hangs
 * up.
 *
 * Promises checked for every input (a broken one aborts):
 *   - every reply is a frame of at most PROTOCOL_MAX_FRAME_BYTES holding a
 *     ServerMessage that decodes;
 *   - once the client has hung up, the connection is gone (freed with its
 *     requests) and the manager holds nothing; ASan's leak check covers
 *     the rest.
 * The seed corpus (corpus/daemon/, made by tests/fuzz/gen-daemon-corpus.py)
 * holds Hello then Generate (chat, raw, stop strings, sampling, bad
 * fields, over-long prompts, every context policy), Cancel, Status and the
 * Session* messages, and broken variants.
 */
#include <errno.h>
#include <ftw.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "daemon/connection.h"
#include "daemon/log.h"
#include "daemon/manager.h"
#include "daemon/scheduler.h"
#include "daemon/sessions.h"
#include "daemon/worker.h"
#include "engine/text/tokenizer.h"
#include "ipc/frame.h"
#include "proto/protocol.h"

#include "tests/fuzz/fuzz.h"

#define FUZZ_CTX 96 /* tokens: prompts and answers stay short */
#define FUZZ_MODEL "qwen2-f32.gguf"
#ifndef FUZZ_DATA_DIR
#define FUZZ_DATA_DIR "tests/data"
#endif

static Manager manager;
static bool verbose; /* $FUZZ_DAEMON_VERBOSE: print each reply's kind (to check the harness) */
static Config config;
static char state_dir[] = "/tmp/tkv-fuzz-daemon-XXXXXX";

static int remove_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
	return remove(path) < 0 ? -1 : 0;
}

/* The scratch state directory goes when the process ends. */
static void state_dir_remove(void)
{
	(void)nftw(state_dir, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
}

static void setup_failed(const char *what, int r, const Error *err)
{
	fprintf(stderr, "fuzz-daemon: %s: %d %s\n", what, r, err && err->msg[0] ? err->msg : "");
	abort();
}

/*
 * What manager_startup() does, minus the listener, signals and
 * notifications: the tiny model and its tokenizer, one thread, the
 * scheduler and the sessions (in a scratch state directory).
 */
static void manager_init(void)
{
	Manager *m = &manager;
	const char *dir = getenv("TKV_TEST_DATA");
	char path[4096];
	Error err = { 0 };
	int r;

	CHECK(mkdtemp(state_dir));
	atexit(state_dir_remove);
	verbose = getenv("FUZZ_DAEMON_VERBOSE") != NULL;
	config.kv_spec = (char *)"f32";
	config.threads = 1;
	config.client_buffer = CONFIG_CLIENT_BUFFER_MIN;
	config.session_memory = 64u << 20;
	config.state_dir = state_dir;
	m->config = &config;
	log_setup(LOG_EMERG); /* quiet: protocol errors are logged at info */
	CHECK(sd_event_new(&m->event) >= 0);

	snprintf(path, sizeof(path), "%s/tiny/" FUZZ_MODEL, dir && *dir ? dir : FUZZ_DATA_DIR);
	m->backend = backend_cpu();
	if ((r = model_load(path, &m->model, &err)) != 0)
		setup_failed(path, r, &err);
	if ((r = tokenizer_new_from_gguf(m->model->gguf, &m->tokenizer, &err)) != 0)
		setup_failed("tokenizer", r, &err);
	if (chat_template_from_gguf(m->model->gguf, &m->chat_template, &err) != 0)
		m->chat_template = CHAT_TEMPLATE_CHATML;
	m->n_ctx = FUZZ_CTX;
	m->max_piece_bytes = 1;
	for (int32_t id = 0; id < tokenizer_n_vocab(m->tokenizer); id++) {
		size_t len;
		tokenizer_piece(m->tokenizer, id, &len);
		m->max_piece_bytes = MAX(m->max_piece_bytes, len);
	}
	snprintf(m->model_name, sizeof(m->model_name), "fuzz");
	snprintf(m->fingerprint, sizeof(m->fingerprint), "0123456789abcdef");
	m->device_name = "cpu";
	m->start_ns = now_ns();
	if ((r = threadpool_new(1, &m->threads)) != 0)
		setup_failed("threads", r, NULL);
	if ((r = model_run_new(m->model, MANAGER_PREFILL_CHUNK, m->threads, &m->run)) != 0)
		setup_failed("model run", r, NULL);
	if ((r = worker_new(m->event, &m->worker)) != 0)
		setup_failed("worker", r, NULL);
	if ((r = scheduler_new(m, &m->scheduler)) != 0)
		setup_failed("scheduler", r, NULL);
	if ((r = sessions_new(m, &m->sessions)) != 0)
		setup_failed("sessions", r, NULL);
}

/* Run the loop until nothing is pending, the worker's jobs included. */
static void loop_settle(void)
{
	for (int i = 0; i < 10000; i++) {
		bool jobs = worker_pending(manager.worker) > 0;
		int r = sd_event_run(manager.event, jobs ? 1000000 : 0);
		CHECK(r >= 0);
		if (r == 0 && !jobs)
			return;
	}
}

/* Read what the daemon sent; every frame must hold a ServerMessage. Returns whether EOF was seen. */
static bool replies_check(int fd, FrameReader *rd)
{
	uint8_t buf[8192];
	Error err = { 0 };

	for (;;) {
		ssize_t n = recv(fd, buf, sizeof(buf), MSG_DONTWAIT);
		if (n < 0) {
			CHECK(errno == EAGAIN || errno == ECONNRESET);
			return errno == ECONNRESET;
		}
		if (n == 0)
			return true;
		CHECK(frame_reader_feed(rd, buf, (size_t)n, &err) == 0);
		Frame f;
		while (frame_reader_pop(rd, &f) == 0) {
			Turbokv__V1__ServerMessage *msg = turbokv__v1__server_message__unpack(NULL, f.len, f.data);
			CHECK(msg != NULL);
			CHECK(msg->msg_case != TURBOKV__V1__SERVER_MESSAGE__MSG__NOT_SET);
			if (verbose)
				fprintf(stderr, "reply %d%s\n", (int)msg->msg_case,
					msg->msg_case == TURBOKV__V1__SERVER_MESSAGE__MSG_ERROR ? msg->error->message : "");
			turbokv__v1__server_message__free_unpacked(msg, NULL);
		}
	}
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static bool ready;
	FrameReader *rd = NULL;
	Connection *c = NULL;
	int sv[2];

	if (!ready) {
		manager_init();
		ready = true;
	}
	if (size < 1)
		return 0;
	size_t chunk = (size_t)data[0] + 1;
	data++;
	size--;

	CHECK(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv) == 0);
	CHECK(connection_new_consume_fd(&manager, sv[0], &c) == 0);
	CHECK(frame_reader_new(PROTOCOL_MAX_FRAME_BYTES, &rd) == 0);

	for (size_t off = 0; off < size;) {
		size_t n = MIN(chunk, size - off);
		ssize_t w = send(sv[1], data + off, n, MSG_DONTWAIT | MSG_NOSIGNAL);
		if (w < 0) {
			/* The daemon closed on us (a protocol error), or its buffer is full for now. */
			CHECK(errno == EAGAIN || errno == EPIPE || errno == ECONNRESET);
			if (errno != EAGAIN)
				break;
			w = 0;
		}
		off += (size_t)w;
		loop_settle();
		if (replies_check(sv[1], rd))
			break;
	}
	/* Half-close first: replies still flow and are checked; then hang up. */
	shutdown(sv[1], SHUT_WR);
	for (int i = 0; i < 4 && manager.connections; i++) {
		loop_settle();
		if (replies_check(sv[1], rd))
			break;
	}
	close(sv[1]);
	loop_settle();
	/* The client hung up: the connection and its requests are gone. */
	CHECK(manager.connections == NULL && manager.n_connections == 0 && manager.n_dead == 0);
	frame_reader_free(rd);
	return 0;
}
