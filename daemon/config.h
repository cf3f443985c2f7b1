/*
 * config.h: turbokvd's settings, from (lowest to highest precedence) the
 * built-in defaults, a config file, TURBOKV_* environment variables and
 * the command line.
 *
 * Every setting has one name used in all three places:
 *
 *   flag               config file key     environment
 *   --model PATH       model=PATH          TURBOKV_MODEL
 *   --kv SPEC          kv=SPEC             TURBOKV_KV
 *   --device D         device=D            TURBOKV_DEVICE      auto | cpu | cuda
 *   --threads N        threads=N           TURBOKV_THREADS     1..256
 *   --ctx N            ctx=N               TURBOKV_CTX         0 (model's, at most 8192) or 16..2^24
 *   --socket PATH      socket=PATH         TURBOKV_SOCKET
 *   --state-dir DIR    state-dir=DIR       TURBOKV_STATE_DIR
 *   --session-memory B session-memory=B    TURBOKV_SESSION_MEMORY  bytes, K/M/G suffixes
 *   --session-max N    session-max=N       TURBOKV_SESSION_MAX     sessions per uid, 1..4096 (64)
 *   --session-disk B   session-disk=B      TURBOKV_SESSION_DISK    session files per uid, bytes (8G)
 *   --client-buffer B  client-buffer=B     TURBOKV_CLIENT_BUFFER   bytes, 4K..64M (connection.h)
 *   --connections-per-user N  (same key)  TURBOKV_CONNECTIONS_PER_USER  1..256 (32; bounds.h)
 *   --idle-timeout S   idle-timeout=S      TURBOKV_IDLE_TIMEOUT    seconds, 0 never (1800; bounds.h)
 *   --answer-tokens N  answer-tokens=N     TURBOKV_ANSWER_TOKENS   answer limit of a request without
 *                                          max_tokens, 0..2^24, 0 none (1024)
 *   --prefix-cache N   prefix-cache=N      TURBOKV_PREFIX_CACHE    anonymous prefix caches kept per uid,
 *                                          0..64, 0 off (4; daemon/prefixcache.h)
 *   --prefix-spill N   prefix-spill=N      TURBOKV_PREFIX_SPILL    of those, files on disk per uid,
 *                                          0..64, 0 memory only (8; daemon/prefixspill.h)
 *   --on-overflow P    on-overflow=P       TURBOKV_ON_OVERFLOW     error | drop-oldest: the context
 *                                          policy of requests and sessions that choose none (error)
 *   --config FILE      -                   TURBOKV_CONFIG
 *
 * The config file holds `key = value` lines; blank lines and lines
 * starting with '#' are ignored; whitespace around key and value is
 * trimmed; an unknown key or a bad value is an error naming file and
 * line. Without --config or TURBOKV_CONFIG no file is read.
 *
 * Defaults: the model is $XDG_CACHE_HOME/turbokv/models/SmolLM2-135M-
 * Instruct.Q4_1.gguf (~/.cache when unset: the setup script's cache);
 * the socket is /run/turbokv/turbokv.sock for root and
 * $XDG_RUNTIME_DIR/turbokv/turbokv.sock for a user; the state directory
 * is $STATE_DIRECTORY (set by systemd's StateDirectory=), else
 * /var/lib/turbokv for root, else $XDG_STATE_HOME/turbokv
 * (~/.local/state/turbokv).
 */
#pragma once

#include <stdbool.h>
#include <stdint.h>

#include "base/util.h"
#include "engine/backend/backend.h"

typedef struct Config {
	char *model_path;
	char *kv_spec;          /* as given, checked by kvspec_parse() */
	bool kv_spec_default;   /* kv_spec is KV_DEFAULT_SPEC, not given */
	DeviceChoice device;
	int threads;
	int64_t ctx;            /* 0: the model's, at most 8192 */
	char *socket_path;
	char *state_dir;
	uint64_t session_memory; /* bytes of sessions kept in memory before the LRU ones spill to disk */
	unsigned session_max;    /* sessions per uid */
	uint64_t session_disk;   /* bytes of session files per uid */
	uint64_t client_buffer;  /* bytes of replies held for a client before its requests pause */
	unsigned connections_per_user; /* connections one uid may hold */
	unsigned idle_timeout_s; /* a connection with nothing in flight is closed after this; 0: never */
	uint32_t answer_tokens;  /* max_tokens of a request that gives none; 0: until the context is full */
	unsigned prefix_cache;   /* anonymous prefix caches per uid (prefixcache.h); 0: none */
	unsigned prefix_spill;   /* of those, files on disk per uid (prefixspill.h); 0: memory only */
	bool drop_oldest;        /* --on-overflow drop-oldest: the default policy is CONTEXT_POLICY_TRUNCATE_OLDEST */
	char *config_path;
	bool help;
	bool version;
} Config;

#define CONFIG_CLIENT_BUFFER_MIN (4u * 1024)
#define CONFIG_CLIENT_BUFFER_MAX (64u * 1024 * 1024)
#define CONFIG_MAX_CONNECTIONS 256u             /* = MANAGER_MAX_CONNECTIONS (bounds.h) */
#define CONFIG_CONNECTIONS_PER_USER_DEFAULT 32u
#define CONFIG_IDLE_TIMEOUT_DEFAULT_S 1800u
#define CONFIG_ANSWER_TOKENS_DEFAULT 1024u
#define CONFIG_PREFIX_CACHE_DEFAULT 4u
#define CONFIG_PREFIX_CACHE_MAX 64u /* = PREFIXCACHE_MAX_PER_UID */
#define CONFIG_PREFIX_SPILL_DEFAULT 8u
#define CONFIG_PREFIX_SPILL_MAX 64u
#define CONFIG_ANSWER_TOKENS_MAX (1u << 24) /* = PROTOCOL_MAX_MAX_TOKENS */

/* Positive codes of this module. */
enum {
	CONFIG_E_USAGE = 1, /* a bad flag, key or value; err says which */
};

/*
 * Fill *c from defaults, file, environment and argv. Returns 0,
 * CONFIG_E_USAGE or -errno (-ENOMEM, or the config file cannot be read),
 * with err set. c must be zeroed; free with config_done() in any case.
 */
int config_load(Config *c, int argc, char **argv, Error *err);
void config_done(Config *c);

/* Print the --help text. */
void config_usage(void);

