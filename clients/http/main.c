/*
 * main.c: turbokv-http, the OpenAI- and Ollama-compatible HTTP gateway of
 * turbokvd: options, the configuration file, the listening sockets
 * (own or socket-activated), signals and readiness. The HTTP side is
 * gateway.c; the request bodies httpreq.c; the answers reply.c.
 *
 *   turbokv-http [--listen HOST:PORT | --listen unix:PATH]... [--allow-remote]
 *                [--socket DAEMON_SOCKET] [--config FILE]
 *
 * Without --listen and without sockets from systemd: 127.0.0.1:11435.
 * A non-loopback address needs --allow-remote (or allow-remote = true).
 *
 * Configuration file (--config, else $TURBOKV_HTTP_CONFIG if set), lines
 * "key = value", '#' comments; command-line options win:
 *   listen = HOST:PORT | unix:PATH   (repeatable)
 *   allow-remote = true | false
 *   socket = PATH                    the daemon's socket
 *   token = SECRET                   require "Authorization: Bearer SECRET"
 *   max-body-bytes = N               default 8388608
 *   max-header-bytes = N             default 32768
 *   max-requests = N                 concurrent requests, default 16
 *   timeout = SECONDS                idle connections, default 30
 * The token may also come from $TURBOKV_HTTP_TOKEN (not from the command
 * line, where other users could read it).
 *
 * Exit codes: 0 after SIGTERM/SIGINT, 1 cannot listen, 2 usage or
 * configuration error.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <getopt.h>
#include <netdb.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <systemd/sd-daemon.h>
#include <unistd.h>

#include "base/util.h"
#include "clients/http/gateway.h"
#include "turbokv/client.h"

#define DEFAULT_LISTEN "127.0.0.1:11435"
#define MAX_LISTEN GATEWAY_MAX_LISTENERS

typedef struct Options {
	char *listen[MAX_LISTEN];
	size_t n_listen;
	bool allow_remote;
	char *socket;
	char *token;
	unsigned long long max_body, max_header, max_requests, timeout;
} Options;

static void usage(FILE *f)
{
	fprintf(f,
		"Usage: turbokv-http [OPTIONS]\n"
		"OpenAI (/v1/...) and Ollama (/api/...) HTTP API for turbokvd.\n\n"
		"  --listen HOST:PORT   listen on TCP (default " DEFAULT_LISTEN "; repeatable)\n"
		"  --listen unix:PATH   listen on a Unix socket\n"
		"  --allow-remote       allow a non-loopback listen address\n"
		"  --socket PATH        the daemon's socket (default as the turbokv CLI)\n"
		"  --config FILE        configuration file (see docs/http.md)\n"
		"  --help               this text\n");
}

static int add_listen(Options *o, const char *v)
{
	if (o->n_listen >= MAX_LISTEN) {
		fprintf(stderr, "turbokv-http: at most %d listen addresses\n", MAX_LISTEN);
		return -1;
	}
	if (!(o->listen[o->n_listen] = strdup(v)))
		return -1;
	o->n_listen++;
	return 0;
}

static int parse_num(const char *where, const char *v, unsigned long long lo, unsigned long long hi,
		     unsigned long long *out)
{
	char *end;
	errno = 0;
	unsigned long long n = strtoull(v, &end, 10);
	if (errno || end == v || *end || v[0] == '-' || n < lo || n > hi) {
		fprintf(stderr, "turbokv-http: %s: '%s' is not a number in %llu..%llu\n", where, v, lo, hi);
		return -1;
	}
	*out = n;
	return 0;
}

static char *trim(char *s)
{
	while (*s == ' ' || *s == '\t')
		s++;
	size_t n = strlen(s);
	while (n && (s[n - 1] == ' ' || s[n - 1] == '\t' || s[n - 1] == '\n' || s[n - 1] == '\r'))
		s[--n] = 0;
	return s;
}

/* Read path into o; cli_listen: --listen was given, so the file's are not used. */
static int config_load(Options *o, const char *path, bool cli_listen, bool cli_socket)
{
	FILE *f = fopen(path, "re");
	char line[4096], where[512];
	int n = 0;
	if (!f) {
		fprintf(stderr, "turbokv-http: %s: %s\n", path, strerror(errno));
		return -1;
	}
	while (fgets(line, sizeof(line), f)) {
		n++;
		snprintf(where, sizeof(where), "%s:%d", path, n);
		if (!strchr(line, '\n') && !feof(f)) {
			fprintf(stderr, "turbokv-http: %s: line too long\n", where);
			goto fail;
		}
		char *s = trim(line), *eq;
		if (!*s || *s == '#')
			continue;
		if (!(eq = strchr(s, '='))) {
			fprintf(stderr, "turbokv-http: %s: expected 'key = value'\n", where);
			goto fail;
		}
		*eq = 0;
		char *k = trim(s), *v = trim(eq + 1);
		int r = 0;
		if (!strcmp(k, "listen"))
			r = cli_listen ? 0 : add_listen(o, v);
		else if (!strcmp(k, "allow-remote")) {
			if (strcmp(v, "true") && strcmp(v, "false")) {
				fprintf(stderr, "turbokv-http: %s: allow-remote is true or false\n", where);
				goto fail;
			}
			o->allow_remote = o->allow_remote || !strcmp(v, "true");
		} else if (!strcmp(k, "socket")) {
			if (!cli_socket) {
				free(o->socket);
				r = (o->socket = strdup(v)) ? 0 : -1;
			}
		} else if (!strcmp(k, "token")) {
			free(o->token);
			r = (o->token = strdup(v)) ? 0 : -1;
		} else if (!strcmp(k, "max-body-bytes"))
			r = parse_num(where, v, 1024, 1ull << 30, &o->max_body);
		else if (!strcmp(k, "max-header-bytes"))
			r = parse_num(where, v, 4096, 1 << 20, &o->max_header);
		else if (!strcmp(k, "max-requests"))
			r = parse_num(where, v, 1, 4096, &o->max_requests);
		else if (!strcmp(k, "timeout"))
			r = parse_num(where, v, 1, 3600, &o->timeout);
		else {
			fprintf(stderr, "turbokv-http: %s: unknown key '%s'\n", where, k);
			goto fail;
		}
		if (r < 0)
			goto fail;
	}
	fclose(f);
	return 0;
fail:
	fclose(f);
	return -1;
}

static bool addr_is_loopback(const struct sockaddr *sa)
{
	if (sa->sa_family == AF_INET)
		return (ntohl(((const struct sockaddr_in *)sa)->sin_addr.s_addr) >> 24) == 127;
	if (sa->sa_family == AF_INET6)
		return IN6_IS_ADDR_LOOPBACK(&((const struct sockaddr_in6 *)sa)->sin6_addr);
	return false;
}

/* A listening socket for spec; returns the fd or -1 (said on stderr). */
static int open_listener(const char *spec, bool allow_remote)
{
	int fd;
	if (!strncmp(spec, "unix:", 5)) {
		struct sockaddr_un un = { .sun_family = AF_UNIX };
		const char *path = spec + 5;
		if (!path[0] || strlen(path) >= sizeof(un.sun_path)) {
			fprintf(stderr, "turbokv-http: --listen %s: bad socket path\n", spec);
			return -1;
		}
		strcpy(un.sun_path, path);
		fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
		if (fd < 0)
			return -1;
		struct stat st;
		if (lstat(path, &st) == 0 && S_ISSOCK(st.st_mode))
			unlink(path);
		if (bind(fd, (struct sockaddr *)&un, sizeof(un)) < 0 || listen(fd, 64) < 0) {
			fprintf(stderr, "turbokv-http: --listen %s: %s\n", spec, strerror(errno));
			close(fd);
			return -1;
		}
		return fd;
	}
	char host[256];
	const char *colon = strrchr(spec, ':');
	if (!colon || colon == spec || (size_t)(colon - spec) >= sizeof(host) || !colon[1]) {
		fprintf(stderr, "turbokv-http: --listen %s: expected HOST:PORT or unix:PATH\n", spec);
		return -1;
	}
	memcpy(host, spec, (size_t)(colon - spec));
	host[colon - spec] = 0;
	if (host[0] == '[' && host[strlen(host) - 1] == ']') {
		memmove(host, host + 1, strlen(host));
		host[strlen(host) - 1] = 0;
	}
	struct addrinfo hints = { .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
		.ai_flags = AI_PASSIVE | AI_NUMERICSERV }, *ai;
	int e = getaddrinfo(host, colon + 1, &hints, &ai);
	if (e) {
		fprintf(stderr, "turbokv-http: --listen %s: %s\n", spec, gai_strerror(e));
		return -1;
	}
	if (!addr_is_loopback(ai->ai_addr) && !allow_remote) {
		fprintf(stderr, "turbokv-http: --listen %s: not a loopback address; "
				"pass --allow-remote (and set a token) to serve other machines\n", spec);
		freeaddrinfo(ai);
		return -1;
	}
	fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
	int one = 1;
	if (fd < 0 || setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) < 0 ||
	    bind(fd, ai->ai_addr, ai->ai_addrlen) < 0 || listen(fd, 64) < 0) {
		fprintf(stderr, "turbokv-http: --listen %s: %s\n", spec, strerror(errno));
		if (fd >= 0)
			close(fd);
		freeaddrinfo(ai);
		return -1;
	}
	freeaddrinfo(ai);
	return fd;
}

static void options_free(Options *o)
{
	for (size_t i = 0; i < o->n_listen; i++)
		free(o->listen[i]);
	free(o->socket);
	free(o->token);
}

static int run(Options *o)
{
	int fds[MAX_LISTEN], n_fds = 0;
	Gateway *gw = NULL;
	sigset_t mask;
	int sig, rc = 1;

	/* Signals are taken synchronously; the server threads inherit the mask. */
	sigemptyset(&mask);
	sigaddset(&mask, SIGTERM);
	sigaddset(&mask, SIGINT);
	pthread_sigmask(SIG_BLOCK, &mask, NULL);
	signal(SIGPIPE, SIG_IGN);

	int n_act = sd_listen_fds(1);
	if (n_act > MAX_LISTEN) {
		fprintf(stderr, "turbokv-http: at most %d sockets from systemd\n", MAX_LISTEN);
		return 1;
	}
	for (int i = 0; i < n_act; i++)
		fds[n_fds++] = SD_LISTEN_FDS_START + i;
	if (n_act <= 0 && o->n_listen == 0 && add_listen(o, DEFAULT_LISTEN) < 0)
		return 1;
	for (size_t i = 0; n_act <= 0 && i < o->n_listen; i++) {
		int fd = open_listener(o->listen[i], o->allow_remote);
		if (fd < 0)
			goto out;
		fds[n_fds++] = fd;
	}
	GatewayConfig cfg = {
		.daemon_socket = o->socket,
		.token = o->token,
		.max_body_bytes = o->max_body,
		.max_header_bytes = o->max_header,
		.max_requests = (unsigned)o->max_requests,
		.timeout_s = (unsigned)o->timeout,
	};
	if (gateway_new(&cfg, &gw) < 0)
		goto out;
	for (int i = 0; i < n_fds; i++)
		if (gateway_listen_fd(gw, fds[i]) < 0) {
			fprintf(stderr, "turbokv-http: cannot serve on socket %d\n", fds[i]);
			goto out;
		}
	for (size_t i = 0; n_act <= 0 && i < o->n_listen; i++)
		fprintf(stderr, "turbokv-http: listening on %s\n", o->listen[i]);
	sd_notify(0, "READY=1\nSTATUS=serving");
	while (sigwait(&mask, &sig) != 0)
		;
	sd_notify(0, "STOPPING=1");
	rc = 0;
out:
	gw = gateway_free(gw);
	for (int i = 0; i < n_fds; i++)
		close(fds[i]);
	return rc;
}

int main(int argc, char **argv)
{
	enum { OPT_LISTEN = 256, OPT_ALLOW_REMOTE, OPT_SOCKET, OPT_CONFIG, OPT_HELP };
	static const struct option longopts[] = {
		{ "listen", required_argument, NULL, OPT_LISTEN },
		{ "allow-remote", no_argument, NULL, OPT_ALLOW_REMOTE },
		{ "socket", required_argument, NULL, OPT_SOCKET },
		{ "config", required_argument, NULL, OPT_CONFIG },
		{ "help", no_argument, NULL, OPT_HELP },
		{ NULL, 0, NULL, 0 },
	};
	Options o = { .max_body = 8u << 20, .max_header = 32768, .max_requests = 16, .timeout = 30 };
	const char *config = getenv("TURBOKV_HTTP_CONFIG");
	bool cli_socket = false;
	int c, rc = 2;

	while ((c = getopt_long(argc, argv, "", longopts, NULL)) != -1) {
		switch (c) {
		case OPT_LISTEN:
			if (add_listen(&o, optarg) < 0)
				goto out;
			break;
		case OPT_ALLOW_REMOTE:
			o.allow_remote = true;
			break;
		case OPT_SOCKET:
			free(o.socket);
			o.socket = strdup(optarg);
			cli_socket = true;
			break;
		case OPT_CONFIG:
			config = optarg;
			break;
		case OPT_HELP:
			usage(stdout);
			rc = 0;
			goto out;
		default:
			usage(stderr);
			goto out;
		}
	}
	if (optind < argc) {
		fprintf(stderr, "turbokv-http: unexpected argument '%s'\n", argv[optind]);
		goto out;
	}
	if (config && config[0] && config_load(&o, config, o.n_listen > 0, cli_socket) < 0)
		goto out;
	const char *env_token = getenv("TURBOKV_HTTP_TOKEN");
	if (env_token && env_token[0]) {
		free(o.token);
		o.token = strdup(env_token);
	}
	rc = run(&o);
out:
	options_free(&o);
	return rc;
}
