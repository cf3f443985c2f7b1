/*
 * config.c: parsing and validation of turbokvd's settings (see config.h).
 * Owns the option table; knows nothing of models or sockets beyond their
 * paths.
 */
#include <ctype.h>
#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "daemon/config.h"
#include "engine/kv/kvtype.h"
#include "engine/model/model.h"

typedef enum Key {
	KEY_MODEL, KEY_KV, KEY_DEVICE, KEY_THREADS, KEY_CTX, KEY_SOCKET, KEY_STATE_DIR,
	KEY_SESSION_MEMORY, KEY_SESSION_MAX, KEY_SESSION_DISK, KEY_CLIENT_BUFFER, KEY_CONNECTIONS_PER_USER, KEY_IDLE_TIMEOUT, KEY_ANSWER_TOKENS, KEY_ON_OVERFLOW, KEY_PREFIX_CACHE, KEY_PREFIX_SPILL, KEY_CONFIG, KEY_HELP, KEY_VERSION, _KEY_MAX,
} Key;

/* Name as flag (--name), file key (name) and environment (TURBOKV_NAME, '-' as '_'). */
static const char *const key_names[_KEY_MAX] = {
	[KEY_MODEL] = "model", [KEY_KV] = "kv", [KEY_DEVICE] = "device",
	[KEY_THREADS] = "threads", [KEY_CTX] = "ctx", [KEY_SOCKET] = "socket",
	[KEY_STATE_DIR] = "state-dir", [KEY_SESSION_MEMORY] = "session-memory",
	[KEY_CLIENT_BUFFER] = "client-buffer",
	[KEY_CONNECTIONS_PER_USER] = "connections-per-user", [KEY_IDLE_TIMEOUT] = "idle-timeout",
	[KEY_ANSWER_TOKENS] = "answer-tokens", [KEY_ON_OVERFLOW] = "on-overflow",
	[KEY_PREFIX_CACHE] = "prefix-cache", [KEY_PREFIX_SPILL] = "prefix-spill",
	[KEY_SESSION_MAX] = "session-max", [KEY_SESSION_DISK] = "session-disk",
	[KEY_CONFIG] = "config", [KEY_HELP] = "help", [KEY_VERSION] = "version",
};

void config_usage(void)
{
	printf("usage: turbokvd [OPTIONS]\n\n"
	       "The turbokv inference daemon. Runs in the foreground; systemd supervises it.\n\n"
	       "  --model PATH           GGUF model (default: the setup script's cache)\n"
	       "  --kv SPEC|PRESET       KV cache type (default " KV_DEFAULT_SPEC ",\n"
	       "                         on a GPU " KV_DEFAULT_SPEC_GPU "); presets: default,\n"
	       "                         small (" KV_SMALL_SPEC ", 6x smaller than f16),\n"
	       "                         exact (" KV_EXACT_SPEC ", f16-level fidelity)\n"
	       "  --device auto|cpu|cuda where the model runs (default auto: the GPU when there is\n"
	       "                         one and this build has CUDA, else the CPU)\n"
	       "  --threads N            engine threads (default: CPUs, at most 8)\n"
	       "  --ctx N                context size in tokens (default: the model's, at most 8192)\n"
	       "  --socket PATH          socket to listen on when not socket-activated\n"
	       "  --state-dir DIR        where sessions are saved\n"
	       "  --session-memory BYTES memory budget of sessions (K, M, G suffixes)\n"
	       "  --session-max N        sessions per user (default 64)\n"
	       "  --session-disk BYTES   disk space of one user's sessions (default 8G)\n"
	       "  --client-buffer BYTES  replies held for a client that does not read, before\n"
	       "                         the daemon pauses its requests (4K..64M, default 256K)\n"
	       "  --connections-per-user N  connections one user may hold (1..256, default 32)\n"
	       "  --idle-timeout SEC     close connections idle this long (0: never; default 1800);\n"
	       "                         a connection must say Hello within min(10, SEC) s\n"
	       "  --answer-tokens N      answer limit of a request that sets none (0: until the\n"
	       "                         context is full; default 1024); it ends with reason LENGTH\n"
	       "  --prefix-cache N       caches of recent requests without a session kept per user,\n"
	       "                         so a client resending its history prefills only what is new\n"
	       "                         (0..64, 0 off; default 4)\n"
	       "  --prefix-spill N       of those, files kept on disk per user, so that they outlive\n"
	       "                         a restart or their eviction from memory (0..64, 0 memory\n"
	       "                         only; default 8; at most --session-disk / 8 bytes)\n"
	       "  --on-overflow error|drop-oldest  what a request or session that chose no context\n"
	       "                         policy does when it would not fit: refuse (default) or drop\n"
	       "                         the oldest turns\n"
	       "  --config FILE          read key=value settings from FILE\n"
	       "  --help, --version\n\n"
	       "Each setting may also come from TURBOKV_<NAME> in the environment\n"
	       "(TURBOKV_STATE_DIR...) or a `name = value` line of the config file;\n"
	       "flags win over the environment, which wins over the file.\n");
}

static int set_string(char **field, const char *value)
{
	char *s = strdup(value);
	if (!s)
		return -ENOMEM;
	free(*field);
	*field = s;
	return 0;
}

static int parse_int(const char *value, long long min, long long max, long long *ret)
{
	char *end;
	errno = 0;
	long long v = strtoll(value, &end, 10);
	if (errno || end == value || *end || v < min || v > max)
		return -EINVAL;
	*ret = v;
	return 0;
}

/* Bytes with an optional K, M, G or T suffix (powers of 1024). */
static int parse_bytes(const char *value, uint64_t *ret)
{
	char *end;
	errno = 0;
	if (!isdigit((unsigned char)value[0]))
		return -EINVAL;
	unsigned long long v = strtoull(value, &end, 10);
	if (errno || end == value)
		return -EINVAL;
	unsigned shift = 0;
	switch (*end) {
	case 0: break;
	case 'K': case 'k': shift = 10; end++; break;
	case 'M': case 'm': shift = 20; end++; break;
	case 'G': case 'g': shift = 30; end++; break;
	case 'T': case 't': shift = 40; end++; break;
	default: return -EINVAL;
	}
	if (*end == 'B' || *end == 'b')
		end++;
	if (*end || (shift && v > (UINT64_MAX >> shift)))
		return -EINVAL;
	*ret = (uint64_t)v << shift;
	return 0;
}

/* Apply one setting; `where` names its origin for messages ("--ctx", "turbokvd.conf:3"). */
static int config_set(Config *c, Key key, const char *value, const char *where, Error *err)
{
	long long v;
	int r = 0;

	switch (key) {
	case KEY_MODEL:
	case KEY_SOCKET:
	case KEY_STATE_DIR:
		if (!value[0] || strlen(value) >= PATH_MAX)
			return error_set(err, CONFIG_E_USAGE, "%s: empty or overlong path", where);
		if (key == KEY_SOCKET && strlen(value) >= 108)
			return error_set(err, CONFIG_E_USAGE,
					 "%s: socket path '%s' is longer than a Unix socket address allows (107 bytes)",
					 where, value);
		r = set_string(key == KEY_MODEL ? &c->model_path
			       : key == KEY_SOCKET ? &c->socket_path : &c->state_dir, value);
		break;
	case KEY_KV: {
		KvSpec spec;
		Error e = { 0 };
		if (kvspec_parse(value, &spec, &e) != 0)
			return error_set(err, CONFIG_E_USAGE, "%s: bad KV spec '%s': %s", where, value, e.msg);
		r = set_string(&c->kv_spec, value);
		c->kv_spec_default = false;
		break;
	}
	case KEY_DEVICE:
		if (device_choice_from_name(value, &c->device) != 0)
			return error_set(err, CONFIG_E_USAGE, "%s: '%s' is not one of auto, cpu, cuda", where, value);
		break;
	case KEY_THREADS:
		if (parse_int(value, 1, 256, &v) < 0)
			return error_set(err, CONFIG_E_USAGE, "%s: '%s' is not an integer in [1, 256]", where, value);
		c->threads = (int)v;
		break;
	case KEY_CTX:
		if (parse_int(value, 0, 1 << 24, &v) < 0 || (v != 0 && v < 16))
			return error_set(err, CONFIG_E_USAGE,
					 "%s: '%s' is not 0 (the model's) or an integer in [16, %d]", where, value, 1 << 24);
		c->ctx = v;
		break;
	case KEY_SESSION_MEMORY:
		if (parse_bytes(value, &c->session_memory) < 0)
			return error_set(err, CONFIG_E_USAGE,
					 "%s: '%s' is not a byte count (digits with an optional K, M, G or T)", where, value);
		break;
	case KEY_SESSION_MAX:
		if (parse_int(value, 1, 4096, &v) < 0)
			return error_set(err, CONFIG_E_USAGE, "%s: '%s' is not an integer in [1, 4096]", where, value);
		c->session_max = (unsigned)v;
		break;
	case KEY_SESSION_DISK:
		if (parse_bytes(value, &c->session_disk) < 0)
			return error_set(err, CONFIG_E_USAGE,
					 "%s: '%s' is not a byte count (digits with an optional K, M, G or T)", where, value);
		break;
	case KEY_CLIENT_BUFFER:
		if (parse_bytes(value, &c->client_buffer) < 0 || c->client_buffer < CONFIG_CLIENT_BUFFER_MIN ||
		    c->client_buffer > CONFIG_CLIENT_BUFFER_MAX)
			return error_set(err, CONFIG_E_USAGE, "%s: '%s' is not a byte count in [4K, 64M]", where, value);
		break;
	case KEY_CONNECTIONS_PER_USER:
		if (parse_int(value, 1, CONFIG_MAX_CONNECTIONS, &v) < 0)
			return error_set(err, CONFIG_E_USAGE, "%s: '%s' is not an integer in [1, %u]", where, value,
					 CONFIG_MAX_CONNECTIONS);
		c->connections_per_user = (unsigned)v;
		break;
	case KEY_IDLE_TIMEOUT:
		if (parse_int(value, 0, 7 * 24 * 3600, &v) < 0)
			return error_set(err, CONFIG_E_USAGE, "%s: '%s' is not a number of seconds in [0, 604800]",
					 where, value);
		c->idle_timeout_s = (unsigned)v;
		break;
	case KEY_ANSWER_TOKENS:
		if (parse_int(value, 0, CONFIG_ANSWER_TOKENS_MAX, &v) < 0)
			return error_set(err, CONFIG_E_USAGE, "%s: '%s' is not an integer in [0, %u]", where, value,
					 CONFIG_ANSWER_TOKENS_MAX);
		c->answer_tokens = (uint32_t)v;
		break;
	case KEY_PREFIX_CACHE:
		if (parse_int(value, 0, CONFIG_PREFIX_CACHE_MAX, &v) < 0)
			return error_set(err, CONFIG_E_USAGE, "%s: '%s' is not an integer in [0, %u]", where, value,
					 CONFIG_PREFIX_CACHE_MAX);
		c->prefix_cache = (unsigned)v;
		break;
	case KEY_PREFIX_SPILL:
		if (parse_int(value, 0, CONFIG_PREFIX_SPILL_MAX, &v) < 0)
			return error_set(err, CONFIG_E_USAGE, "%s: '%s' is not an integer in [0, %u]", where, value,
					 CONFIG_PREFIX_SPILL_MAX);
		c->prefix_spill = (unsigned)v;
		break;
	case KEY_ON_OVERFLOW:
		if (strcmp(value, "error") != 0 && strcmp(value, "drop-oldest") != 0)
			return error_set(err, CONFIG_E_USAGE, "%s: '%s' is not one of error, drop-oldest", where, value);
		c->drop_oldest = strcmp(value, "drop-oldest") == 0;
		break;
	case KEY_CONFIG:
		r = set_string(&c->config_path, value);
		break;
	case KEY_HELP:
		c->help = true;
		break;
	case KEY_VERSION:
		c->version = true;
		break;
	default:
		return error_set(err, CONFIG_E_USAGE, "%s: unknown setting", where);
	}
	if (r < 0)
		return error_set(err, r, "out of memory");
	return 0;
}

static Key key_from_name(const char *name)
{
	for (int k = 0; k < _KEY_MAX; k++)
		if (strcmp(key_names[k], name) == 0)
			return (Key)k;
	return _KEY_MAX;
}

static char *trim(char *s)
{
	while (isspace((unsigned char)*s))
		s++;
	size_t n = strlen(s);
	while (n > 0 && isspace((unsigned char)s[n - 1]))
		s[--n] = 0;
	return s;
}

static void fclosep(FILE **f)
{
	if (*f)
		fclose(*f);
}

static int config_read_file(Config *c, const char *path, Error *err)
{
	_cleanup_(fclosep) FILE *f = fopen(path, "re");
	char line[8192], where[PATH_MAX + 32];
	unsigned n = 0;

	if (!f)
		return error_set(err, -errno, "cannot open config file %s: %s", path, strerror(errno));
	while (fgets(line, sizeof(line), f)) {
		n++;
		snprintf(where, sizeof(where), "%s:%u", path, n);
		if (!strchr(line, '\n') && !feof(f))
			return error_set(err, CONFIG_E_USAGE, "%s: line longer than %zu bytes", where, sizeof(line) - 1);
		char *s = trim(line);
		if (!*s || *s == '#')
			continue;
		char *eq = strchr(s, '=');
		if (!eq)
			return error_set(err, CONFIG_E_USAGE, "%s: expected 'key = value'", where);
		*eq = 0;
		char *key = trim(s), *value = trim(eq + 1);
		Key k = key_from_name(key);
		if (k == _KEY_MAX || k == KEY_CONFIG || k == KEY_HELP || k == KEY_VERSION)
			return error_set(err, CONFIG_E_USAGE, "%s: unknown key '%s'", where, key);
		int r = config_set(c, k, value, where, err);
		if (r)
			return r;
	}
	if (ferror(f))
		return error_set(err, -EIO, "cannot read config file %s", path);
	return 0;
}

static int config_read_env(Config *c, Error *err)
{
	for (int k = 0; k < _KEY_MAX; k++) {
		char name[64];
		if (k == KEY_CONFIG || k == KEY_HELP || k == KEY_VERSION)
			continue;
		snprintf(name, sizeof(name), "TURBOKV_%s", key_names[k]);
		for (char *p = name; *p; p++)
			*p = *p == '-' ? '_' : (char)toupper((unsigned char)*p);
		const char *v = getenv(name);
		if (!v || !*v)
			continue;
		int r = config_set(c, (Key)k, v, name, err);
		if (r)
			return r;
	}
	return 0;
}

static int config_defaults(Config *c)
{
	char buf[PATH_MAX];
	const char *home = getenv("HOME") ? getenv("HOME") : "/";
	const char *xdg;
	bool root = geteuid() == 0;
	long n = sysconf(_SC_NPROCESSORS_ONLN);
	int len;

	c->threads = (int)(n < 1 ? 1 : n > 8 ? 8 : n);
	c->device = DEVICE_AUTO;
	c->session_memory = 1ull << 30;
	c->session_max = 64;
	c->session_disk = 8ull << 30;
	c->client_buffer = 256u * 1024;
	c->connections_per_user = CONFIG_CONNECTIONS_PER_USER_DEFAULT;
	c->idle_timeout_s = CONFIG_IDLE_TIMEOUT_DEFAULT_S;
	c->answer_tokens = CONFIG_ANSWER_TOKENS_DEFAULT;
	c->prefix_cache = CONFIG_PREFIX_CACHE_DEFAULT;
	c->prefix_spill = CONFIG_PREFIX_SPILL_DEFAULT;
	model_default_path(buf, sizeof(buf));
	if (set_string(&c->model_path, buf) < 0 || set_string(&c->kv_spec, KV_DEFAULT_SPEC) < 0)
		return -ENOMEM;
	c->kv_spec_default = true;

	/* The paths below come from the environment: a cut-off one would be another path. */
	if (root || !(xdg = getenv("XDG_RUNTIME_DIR")) || !*xdg)
		len = snprintf(buf, sizeof(buf), "/run/turbokv/turbokv.sock");
	else
		len = snprintf(buf, sizeof(buf), "%s/turbokv/turbokv.sock", xdg);
	if (len < 0 || (size_t)len >= sizeof(buf))
		return -ENAMETOOLONG;
	if (set_string(&c->socket_path, buf) < 0)
		return -ENOMEM;

	if ((xdg = getenv("STATE_DIRECTORY")) && *xdg) {
		/* systemd may list several, colon-separated: ours is the first. */
		len = snprintf(buf, sizeof(buf), "%.*s", (int)MIN(strcspn(xdg, ":"), sizeof(buf)), xdg);
	} else if (root)
		len = snprintf(buf, sizeof(buf), "/var/lib/turbokv");
	else if ((xdg = getenv("XDG_STATE_HOME")) && *xdg)
		len = snprintf(buf, sizeof(buf), "%s/turbokv", xdg);
	else
		len = snprintf(buf, sizeof(buf), "%s/.local/state/turbokv", home);
	if (len < 0 || (size_t)len >= sizeof(buf))
		return -ENAMETOOLONG;
	return set_string(&c->state_dir, buf);
}

int config_load(Config *c, int argc, char **argv, Error *err)
{
	static const struct option longopts[] = {
		{ "model", required_argument, NULL, KEY_MODEL },
		{ "kv", required_argument, NULL, KEY_KV },
		{ "device", required_argument, NULL, KEY_DEVICE },
		{ "threads", required_argument, NULL, KEY_THREADS },
		{ "ctx", required_argument, NULL, KEY_CTX },
		{ "socket", required_argument, NULL, KEY_SOCKET },
		{ "state-dir", required_argument, NULL, KEY_STATE_DIR },
		{ "session-memory", required_argument, NULL, KEY_SESSION_MEMORY },
		{ "client-buffer", required_argument, NULL, KEY_CLIENT_BUFFER },
		{ "session-max", required_argument, NULL, KEY_SESSION_MAX },
		{ "session-disk", required_argument, NULL, KEY_SESSION_DISK },
		{ "connections-per-user", required_argument, NULL, KEY_CONNECTIONS_PER_USER },
		{ "idle-timeout", required_argument, NULL, KEY_IDLE_TIMEOUT },
		{ "answer-tokens", required_argument, NULL, KEY_ANSWER_TOKENS },
		{ "on-overflow", required_argument, NULL, KEY_ON_OVERFLOW },
		{ "prefix-cache", required_argument, NULL, KEY_PREFIX_CACHE },
		{ "prefix-spill", required_argument, NULL, KEY_PREFIX_SPILL },
		{ "config", required_argument, NULL, KEY_CONFIG },
		{ "help", no_argument, NULL, KEY_HELP },
		{ "version", no_argument, NULL, KEY_VERSION },
		{}
	};
	int opt, r;
	char where[64];

	if ((r = config_defaults(c)) < 0)
		return error_set(err, r, "%s", r == -ENAMETOOLONG
				 ? "a default path from $XDG_RUNTIME_DIR, $STATE_DIRECTORY, $XDG_STATE_HOME or $HOME is too long"
				 : "out of memory");

	/* First pass: only --config, which decides the file read before the rest. */
	const char *path = getenv("TURBOKV_CONFIG");
	opterr = 0;
	optind = 1;
	while ((opt = getopt_long(argc, argv, "", longopts, NULL)) != -1)
		if (opt == KEY_CONFIG)
			path = optarg;
	if (path && *path) {
		if ((r = config_set(c, KEY_CONFIG, path, "--config", err)) ||
		    (r = config_read_file(c, path, err)))
			return r;
	}
	if ((r = config_read_env(c, err)))
		return r;

	opterr = 0;
	optind = 1;
	while ((opt = getopt_long(argc, argv, "", longopts, NULL)) != -1) {
		if (opt == '?' || opt == ':') {
			const char *bad = argv[optind - 1];
			return error_set(err, CONFIG_E_USAGE, "unknown option or missing value: '%s' (see --help)",
					 bad ? bad : "?");
		}
		if (opt == KEY_CONFIG)
			continue;
		snprintf(where, sizeof(where), "--%s", key_names[opt]);
		if ((r = config_set(c, (Key)opt, optarg ? optarg : "", where, err)))
			return r;
	}
	if (optind < argc)
		return error_set(err, CONFIG_E_USAGE, "unexpected argument '%s' (see --help)", argv[optind]);
	return 0;
}

void config_done(Config *c)
{
	free(c->model_path);
	free(c->kv_spec);
	free(c->socket_path);
	free(c->state_dir);
	free(c->config_path);
	*c = (Config){ 0 };
}
