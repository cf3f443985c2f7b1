/*
 * turbokv/client.h: libturbokv, the C client of the turbokvd daemon.
 *
 *   #include <turbokv/client.h>        cc app.c $(pkg-config --cflags --libs turbokv)
 *
 * A TkvClient is one connection to the daemon's Unix socket. The library
 * has no global state and never logs or prints: every function that can
 * fail returns 0 or a positive TkvErrorCode, and fills a TkvError (when the
 * caller passes one) with the same code and a human-readable message.
 *
 * Threads: a TkvClient is thread-compatible, not thread-safe. Use one per
 * thread (or serialise calls yourself). The one exception is tkv_cancel(),
 * which may be called at any time from any thread, from inside a
 * callback, and from a signal handler (it is async-signal-safe).
 *
 * Calls are blocking: tkv_generate() returns once the daemon has sent the
 * request's final Done or Error, calling the callbacks as Progress and
 * Token messages arrive.
 *
 * Socket path (tkv_client_connect() with path NULL), first that applies:
 *   1. $TURBOKV_SOCKET, if set and not empty;
 *   2. $XDG_RUNTIME_DIR/turbokv/turbokv.sock, if that file exists (the
 *      per-user daemon);
 *   3. /run/turbokv/turbokv.sock (the system daemon).
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define TKV_VERSION "0.1.0"

/*
 * Error codes. 1..22 are the daemon's ErrorCode values of the wire
 * protocol (turbokv.v1, proto/turbokv.proto), passed through unchanged;
 * 100 and up arise in the client itself. New values are only appended.
 */
typedef enum TkvErrorCode {
	TKV_OK = 0,
	/* Sent by the daemon (see turbokv.proto for when). */
	TKV_E_BAD_FRAME = 1,
	TKV_E_BAD_MESSAGE = 2,
	TKV_E_UNSUPPORTED_VERSION = 3,
	TKV_E_HELLO_REQUIRED = 4,
	TKV_E_TOO_MANY_REQUESTS = 5,
	TKV_E_REQUEST_ID_IN_USE = 6,
	TKV_E_UNKNOWN_REQUEST = 7,
	TKV_E_CONTEXT_OVERFLOW = 8,
	TKV_E_ATTACHMENT_NOT_MEMFD = 9,
	TKV_E_ATTACHMENT_NOT_SEALED = 10,
	TKV_E_ATTACHMENT_TOO_LARGE = 11,     /* also found client-side against the daemon's cap */
	TKV_E_ATTACHMENT_NOT_UTF8 = 12,      /* also found client-side before sending */
	TKV_E_ATTACHMENT_SIZE_MISMATCH = 13,
	TKV_E_SESSION_NOT_FOUND = 14,
	TKV_E_SESSION_BAD_NAME = 15,         /* also found client-side before sending */
	TKV_E_SESSION_QUOTA = 16,
	TKV_E_SESSION_CORRUPT = 17,
	TKV_E_SESSION_BUSY = 18,
	TKV_E_BUSY = 19,
	TKV_E_SHUTTING_DOWN = 20,
	TKV_E_CANCELLED = 21,                /* cancelled before any output */
	TKV_E_INTERNAL = 22,
	TKV_E_TIMEOUT = 23,                  /* no Hello in time, or idle too long: connect again */
	/* Client side. */
	TKV_E_CONNECT = 100,         /* the daemon's socket cannot be reached */
	TKV_E_PROTOCOL = 101,        /* the daemon sent something that breaks the protocol */
	TKV_E_SERVER_CLOSED = 102,   /* the daemon closed the connection (or it broke) */
	TKV_E_INVALID_ARGUMENT = 103,/* a bad argument (NULL, empty input, too large a frame) */
	TKV_E_IO = 104,              /* a local system call failed (reading a file, memfd); see sys_errno */
	TKV_E_NO_MEMORY = 105,
} TkvErrorCode;

/* The detail of a failure. */
typedef struct TkvError {
	int code;          /* a TkvErrorCode, equal to the function's return value */
	int sys_errno;     /* errno behind TKV_E_CONNECT / _IO / _SERVER_CLOSED, else 0 */
	char message[256]; /* human-readable, never empty on failure */
} TkvError;

/*
 * Stable name of a code, as scripts see it: "SESSION_NOT_FOUND", "CONNECT",
 * "PROTOCOL", "SERVER_CLOSED", "OK"; NULL for a value not defined here.
 */
const char *tkv_error_code_name(int code);

/* Whether a code comes from the daemon (1..99) rather than the client. */
bool tkv_error_is_server(int code);

typedef struct TkvClient TkvClient;

/* What the daemon said in its HelloReply. Strings are owned by the client. */
typedef struct TkvServerInfo {
	uint32_t protocol_version;       /* the version this connection speaks */
	uint32_t min_protocol_version;
	uint32_t max_protocol_version;
	const char *server_version;      /* "0.1.0" */
	const char *model_name;
	const char *model_fingerprint;
	const char *kv_type;             /* "tq3", "q8_0:tq3", ... */
	const char *device;              /* "cpu", "cuda:0 ..." */
	uint32_t context_size;           /* tokens */
	uint32_t n_threads;
	uint32_t max_frame_bytes;
	uint64_t max_attachment_bytes;
	uint32_t max_requests_in_flight;
} TkvServerInfo;

/*
 * Resolve the socket path as described at the top of this file into
 * buf[0..size). Returns 0, or TKV_E_INVALID_ARGUMENT if it does not fit.
 */
int tkv_socket_path_default(char *buf, size_t size, TkvError *err);

/*
 * Connect to the daemon at socket_path (NULL: the default path) and
 * exchange Hello. client_name names the program in the daemon's logs
 * (NULL: "libturbokv/" TKV_VERSION). Returns 0 and *ret_client (free with
 * tkv_client_free), TKV_E_CONNECT when the socket is missing or refuses,
 * TKV_E_UNSUPPORTED_VERSION (or another daemon code) when the daemon
 * refuses the Hello, TKV_E_PROTOCOL or TKV_E_SERVER_CLOSED.
 */
int tkv_client_connect(const char *socket_path, const char *client_name,
		       TkvClient **ret_client, TkvError *err);

/* Close the connection and free everything; NULL is fine. Returns NULL. */
TkvClient *tkv_client_free(TkvClient *client);

/* The daemon's HelloReply; valid until tkv_client_free(). */
const TkvServerInfo *tkv_client_server_info(const TkvClient *client);

/* The socket path this client connected to. */
const char *tkv_client_socket_path(const TkvClient *client);

/* --- Generate ----------------------------------------------------------- */

typedef enum TkvRole {
	TKV_ROLE_SYSTEM = 1,
	TKV_ROLE_USER = 2,
	TKV_ROLE_ASSISTANT = 3,
} TkvRole;

/* One chat message: UTF-8 text, NUL-terminated (so without NUL bytes). */
typedef struct TkvMessage {
	TkvRole role;
	const char *content;
} TkvMessage;

typedef enum TkvAttachmentKind {
	TKV_ATTACH_BUFFER = 0, /* data[0..size), copied into a new sealed memfd */
	TKV_ATTACH_FILE = 1,   /* the contents of path (any readable file, a pipe too) */
	TKV_ATTACH_MEMFD = 2,  /* memfd, already sealed by the caller (borrowed, sent as is) */
} TkvAttachmentKind;

/*
 * A document passed beside the request as a sealed memfd (never through the
 * socket). Its text enters the conversation ahead of the request's input.
 */
typedef struct TkvAttachment {
	TkvAttachmentKind kind;
	const char *name;  /* shown to the model; NULL: "" (FILE: the file's base name) */
	const char *mime;  /* NULL: text/plain */
	const void *data;  /* BUFFER */
	size_t size;       /* BUFFER */
	const char *path;  /* FILE */
	int memfd;         /* MEMFD */
} TkvAttachment;

/* TkvSampling.set: which optional fields are given (others: daemon defaults). */
enum {
	TKV_SAMPLING_TEMPERATURE = 1u << 0,
	TKV_SAMPLING_TOP_K = 1u << 1,
	TKV_SAMPLING_TOP_P = 1u << 2,
	TKV_SAMPLING_MIN_P = 1u << 3,
	TKV_SAMPLING_REPEAT_PENALTY = 1u << 4,
	TKV_SAMPLING_REPEAT_LAST_N = 1u << 5,
	TKV_SAMPLING_SEED = 1u << 6,
};

typedef struct TkvSampling {
	unsigned set;          /* TKV_SAMPLING_* bits */
	float temperature;     /* 0 means greedy */
	uint32_t top_k;
	float top_p;
	float min_p;
	float repeat_penalty;
	uint32_t repeat_last_n;
	uint64_t seed;
	bool greedy;           /* always the most likely token, whatever the rest says */
} TkvSampling;

/*
 * A policy other than TKV_CONTEXT_ERROR is the request's choice, and a
 * named session keeps it for later requests. TKV_CONTEXT_ERROR chooses
 * nothing: the session's kept policy applies, else the daemon's
 * --on-overflow (error unless configured). TKV_CONTEXT_ERROR_SET refuses
 * like TKV_CONTEXT_ERROR whatever the session or daemon says, and is kept.
 */
typedef enum TkvContextPolicy {
	TKV_CONTEXT_ERROR = 0,          /* refuse with TKV_E_CONTEXT_OVERFLOW (default) */
	TKV_CONTEXT_TRUNCATE_OLDEST = 1,/* drop whole oldest turns, reported in dropped_tokens */
	TKV_CONTEXT_STOP_AT_LIMIT = 2,  /* generate until the context is full */
	TKV_CONTEXT_ERROR_SET = 3,      /* TKV_CONTEXT_ERROR as an explicit choice */
} TkvContextPolicy;

typedef struct TkvRequest {
	/* Input: chat messages (rendered with the model's template), or, when
	 * n_messages is 0, raw_prompt (NULL: empty) tokenized as is. With a
	 * session, messages are the new turns, not the whole history. */
	const TkvMessage *messages;
	size_t n_messages;
	const char *raw_prompt;
	const TkvAttachment *attachments;   /* (n_attachments,), at most 16 */
	size_t n_attachments;
	const TkvSampling *sampling;        /* NULL: the daemon's defaults */
	uint32_t max_tokens;                /* 0: the daemon's answer limit (--answer-tokens, 1024) */
	const char *const *stop;            /* (n_stop,) stop strings */
	size_t n_stop;
	const char *session;                /* NULL or "": a one-off request */
	TkvContextPolicy context_policy;
	uint64_t request_id;                /* 0: the client picks one (see TkvResult) */
} TkvRequest;

typedef enum TkvFinishReason {
	TKV_FINISH_UNSPECIFIED = 0,
	TKV_FINISH_STOP = 1,          /* end-of-generation token */
	TKV_FINISH_LENGTH = 2,        /* max_tokens reached */
	TKV_FINISH_CANCELLED = 3,     /* tkv_cancel() (or a disconnect) */
	TKV_FINISH_CONTEXT_FULL = 4,
	TKV_FINISH_STOP_STRING = 5,
} TkvFinishReason;

/* "stop", "length", "cancelled", "context_full", "stop_string", "unspecified". */
const char *tkv_finish_reason_name(int reason);

/* The accounting of a finished generation (the daemon's Done). */
typedef struct TkvResult {
	uint64_t request_id;
	TkvFinishReason finish_reason;
	uint32_t prompt_tokens;       /* including session and attachment tokens */
	uint32_t cached_tokens;       /* prompt tokens reused from the session cache */
	uint32_t completion_tokens;
	uint32_t dropped_tokens;      /* TKV_CONTEXT_TRUNCATE_OLDEST only */
	double prefill_ms;
	double decode_ms;
	double ttft_ms;               /* request received to first token, queueing included */
} TkvResult;

/*
 * Streaming callbacks; each may be NULL. They run on the thread that called
 * tkv_generate(), and may call tkv_cancel() (but no other function on the
 * same client).
 *
 * on_token receives the bytes of each Token delta exactly as the daemon sent
 * them (UTF-8; not NUL-terminated; len may be 0). Concatenated, the deltas
 * are the answer.
 */
typedef struct TkvCallbacks {
	void (*on_progress)(uint64_t request_id, uint32_t prefilled_tokens, uint32_t total_tokens,
			    void *userdata);
	void (*on_token)(uint64_t request_id, const char *text, size_t len, uint32_t token_id,
			 void *userdata);
	void *userdata;
} TkvCallbacks;

/*
 * Send request and stream its answer until the daemon ends it. Returns 0
 * and fills *ret_result (if not NULL) when the daemon sent Done, also for
 * a cancelled request (finish_reason TKV_FINISH_CANCELLED); or the daemon's
 * Error code (TKV_E_CONTEXT_OVERFLOW, TKV_E_CANCELLED, ...) with its
 * message; or TKV_E_SERVER_CLOSED if the connection ends before Done;
 * TKV_E_PROTOCOL; TKV_E_INVALID_ARGUMENT, TKV_E_IO, TKV_E_ATTACHMENT_* or
 * TKV_E_SESSION_BAD_NAME for a request refused before sending. After
 * TKV_E_SERVER_CLOSED, TKV_E_PROTOCOL, or an Error the daemon sent for the
 * whole connection, the client is unusable: every later call returns
 * TKV_E_SERVER_CLOSED.
 */
int tkv_generate(TkvClient *client, const TkvRequest *request, const TkvCallbacks *callbacks,
		 TkvResult *ret_result, TkvError *err);

/*
 * Ask the daemon to stop a generation. request_id 0 means the one running
 * now; otherwise the generation with that id (also one about to start: a
 * TkvRequest with this request_id is cancelled as soon as it is sent).
 * A cancel with id 0 while nothing runs applies to the next tkv_generate(),
 * so a cancel racing with its start is not lost.
 *
 * This only sets a flag and wakes the generating thread (which sends the
 * Cancel message itself), so it is safe from any thread, a callback, or a
 * signal handler. The generation then ends with Done{TKV_FINISH_CANCELLED}
 * (tkv_generate returns 0) or, if no output was produced yet,
 * TKV_E_CANCELLED. Returns 0.
 */
int tkv_cancel(TkvClient *client, uint64_t request_id);

/* --- Status and sessions ------------------------------------------------- */

typedef struct TkvStatus {
	char *server_version;
	char *model_name;
	char *model_fingerprint;
	char *kv_type;
	char *device;
	uint32_t context_size;
	uint32_t n_threads;
	uint64_t uptime_ms;
	uint32_t connections;
	uint32_t requests_active;
	uint32_t requests_queued;
	uint32_t sessions_in_memory;
	uint64_t session_memory_bytes;
	uint64_t session_memory_budget_bytes;
	double kv_bits_per_value;
	uint64_t tokens_generated;
} TkvStatus;

/* The daemon's state. Returns 0 and *ret_status (free with tkv_status_free), or an error. */
int tkv_status(TkvClient *client, TkvStatus **ret_status, TkvError *err);
/* NULL is fine. Returns NULL. */
TkvStatus *tkv_status_free(TkvStatus *status);

#define TKV_SESSION_NAME_MAX 64

typedef struct TkvSessionInfo {
	char name[TKV_SESSION_NAME_MAX + 1];
	uint32_t tokens;
	uint64_t bytes_on_disk;
	int64_t last_used_unix_ms;
	bool in_memory;
} TkvSessionInfo;

typedef struct TkvSessionList {
	size_t n_sessions;
	TkvSessionInfo *sessions; /* (n_sessions,), most recently used first */
} TkvSessionList;

/* Whether name is a valid session name: [A-Za-z0-9._-]{1,64}, not "." or "..". */
bool tkv_session_name_valid(const char *name);

/*
 * The caller's sessions. Returns 0 and *ret_list (free with
 * tkv_session_list_free), or an error (the daemon's, for one that does not
 * serve sessions).
 */
int tkv_session_list(TkvClient *client, TkvSessionList **ret_list, TkvError *err);
TkvSessionList *tkv_session_list_free(TkvSessionList *list);

/* One session. Returns 0 and fills *ret_info, TKV_E_SESSION_NOT_FOUND, ... */
int tkv_session_show(TkvClient *client, const char *name, TkvSessionInfo *ret_info, TkvError *err);

/*
 * Write a session to disk now (durable when this returns 0) and fill
 * *ret_info. Returns 0, TKV_E_SESSION_NOT_FOUND, _BUSY, ...
 */
int tkv_session_save(TkvClient *client, const char *name, TkvSessionInfo *ret_info, TkvError *err);

/* Delete a session in memory and on disk. Returns 0, TKV_E_SESSION_NOT_FOUND, _BUSY, ... */
int tkv_session_delete(TkvClient *client, const char *name, TkvError *err);

#ifdef __cplusplus
}
#endif
