/* lab.c: shared option handling, loading and output for turbokv-lab. */
#include <errno.h>
#include <getopt.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/kv/kvstore.h"
#include "engine/kv/kvtype.h"
#include "tools/turbokv-lab/lab.h"

const char *lab_default_model_path(char *buf, size_t size)
{
	const char *e = getenv("TURBOKV_MODEL");
	if (e && *e) {
		snprintf(buf, size, "%s", e);
		return buf;
	}
	return model_default_path(buf, size);
}

void lab_common_init(LabCommon *c)
{
	static char path[4096];
	long n = sysconf(_SC_NPROCESSORS_ONLN);
	*c = (LabCommon){
		.model_path = lab_default_model_path(path, sizeof(path)),
		.device = DEVICE_CPU, /* measurements stay on the reference path unless asked */
		.threads = (int)(n < 1 ? 1 : n > 8 ? 8 : n),
		.ctx = 0,
		.json = false,
	};
}

long lab_parse_long(const char *opt, const char *arg, long min, long max)
{
	char *end;
	errno = 0;
	long v = strtol(arg, &end, 10);
	if (errno || end == arg || *end || v < min || v > max) {
		fprintf(stderr, "turbokv-lab: %s: '%s' is not an integer in [%ld, %ld]\n", opt, arg, min,
			max);
		return -1;
	}
	return v;
}

double lab_parse_double(const char *opt, const char *arg, double min, double max)
{
	char *end;
	errno = 0;
	double v = strtod(arg, &end);
	if (errno || end == arg || *end || !(v >= min && v <= max)) {
		fprintf(stderr, "turbokv-lab: %s: '%s' is not a number in [%g, %g]\n", opt, arg, min, max);
		return -1e300;
	}
	return v;
}

int lab_common_option(LabCommon *c, int opt, const char *arg)
{
	long v;
	switch (opt) {
	case LAB_OPT_MODEL:
		c->model_path = arg;
		return 1;
	case LAB_OPT_THREADS:
		if ((v = lab_parse_long("--threads", arg, 1, 256)) < 0)
			return -1;
		c->threads = (int)v;
		return 1;
	case LAB_OPT_CTX:
		if ((v = lab_parse_long("--ctx", arg, 1, 1 << 24)) < 0)
			return -1;
		c->ctx = v;
		return 1;
	case LAB_OPT_JSON:
		c->json = true;
		return 1;
	case LAB_OPT_DEVICE:
		if (device_choice_from_name(arg, &c->device) != 0) {
			fprintf(stderr, "turbokv-lab: --device '%s': one of auto, cpu, cuda\n", arg);
			return -1;
		}
		return 1;
	default:
		return 0;
	}
}

/* The backend of lab_load(): one per process, released at exit after every model. */
static Backend *lab_backend;

static void lab_backend_release(void)
{
	lab_backend = backend_free(lab_backend);
}

int lab_load(const LabCommon *c, Model **ret_model, Tokenizer **ret_tok)
{
	Error err = { 0 };
	_cleanup_(model_freep) Model *m = NULL;
	int r;
	if (!lab_backend) {
		char why_not_gpu[256];
		if ((r = backend_open(c->device, &lab_backend, why_not_gpu, sizeof(why_not_gpu), &err)) != 0) {
			fprintf(stderr, "turbokv-lab: --device %s: %s\n", device_choice_name(c->device), err.msg);
			return -1;
		}
		atexit(lab_backend_release);
		if (c->device == DEVICE_AUTO && why_not_gpu[0])
			fprintf(stderr, "turbokv-lab: --device auto: on the CPU (%s)\n", why_not_gpu);
	}
	r = model_load_on(c->model_path, lab_backend, &m, &err);
	if (r != 0) {
		if (r < 0 && !err.msg[0])
			fprintf(stderr, "turbokv-lab: cannot load model %s: %s\n", c->model_path, strerror(-r));
		else
			fprintf(stderr, "turbokv-lab: cannot load model %s: %s\n", c->model_path, err.msg);
		if (r == -ENOENT)
			fprintf(stderr, "turbokv-lab: run scripts/setup.sh to fetch the default model\n");
		return -1;
	}
	if (ret_tok) {
		r = tokenizer_new_from_gguf(m->gguf, ret_tok, &err);
		if (r != 0) {
			fprintf(stderr, "turbokv-lab: %s: tokenizer: %s\n", c->model_path,
				r < 0 ? strerror(-r) : err.msg);
			return -1;
		}
	}
	*ret_model = TAKE_PTR(m);
	return 0;
}

int lab_kvcache_new(const Model *m, const char *spec, int64_t n_ctx, KvCache **ret, double *ret_bits)
{
	KvCacheShape shape = model_kv_shape(m, n_ctx);
	_cleanup_(kvplan_freep) KvPlan *plan = NULL;
	Error err = { 0 };
	int r = 0;
	/* every spelling of f32 everywhere is the exact f32 cache (kvcache_new_host) */
	if (spec)
		r = kvplan_from_text(spec, shape.n_layers, shape.n_kv_heads, shape.head_dim, &plan, &err);
	if (r == 0)
		r = model_kvcache_new(m, plan, 0, n_ctx, ret, &err);
	if (r != 0) {
		fprintf(stderr, "turbokv-lab: --kv %s: %s\n", spec ? spec : "f32",
			err.msg[0] ? err.msg : strerror(r < 0 ? -r : EINVAL));
		return -1;
	}
	if (ret_bits)
		*ret_bits = plan ? kvplan_bits_per_value(plan) : 32.0;
	return 0;
}

char *lab_read_file(const char *path, size_t *ret_len)
{
	FILE *f = strcmp(path, "-") == 0 ? stdin : fopen(path, "rb");
	if (!f) {
		fprintf(stderr, "turbokv-lab: cannot open %s: %s\n", path, strerror(errno));
		return NULL;
	}
	size_t cap = 1 << 16, len = 0, n;
	char *buf = malloc(cap + 1);
	while (buf && (n = fread(buf + len, 1, cap - len, f)) > 0) {
		len += n;
		if (len == cap) {
			char *nb = cap > (1u << 30) ? NULL : realloc(buf, cap * 2 + 1);
			if (!nb) {
				free(buf);
				buf = NULL;
				break;
			}
			buf = nb;
			cap *= 2;
		}
	}
	bool failed = ferror(f) || !buf;
	if (f != stdin)
		fclose(f);
	if (failed) {
		fprintf(stderr, "turbokv-lab: cannot read %s\n", path);
		free(buf);
		return NULL;
	}
	buf[len] = 0;
	*ret_len = len;
	return buf;
}

const char *lab_spec_resolve(const char *given)
{
	const KvPreset *preset = kvspec_preset(given);
	if (!preset)
		return given;
	fprintf(stderr, "turbokv-lab: --kv %s: %s\n", preset->name, preset->spec);
	return preset->spec;
}

int lab_specs_add(const char *arg, char **specs, int *n, int max)
{
	const char *p = arg;
	while (*p) {
		const char *end = p;
		/* extend over elements that are layer overrides */
		for (;;) {
			const char *c = strchr(end, ',');
			if (!c) {
				end += strlen(end);
				break;
			}
			const char *next_end = strchr(c + 1, ',');
			size_t next_len = next_end ? (size_t)(next_end - c - 1) : strlen(c + 1);
			if (!memchr(c + 1, '=', next_len)) {
				end = c;
				break;
			}
			end = c + 1 + next_len;
		}
		if (end == p || *n >= max) {
			fprintf(stderr, "turbokv-lab: --kv '%s': %s\n", arg,
				end == p ? "empty spec" : "too many specs");
			return -1;
		}
		/* a preset runs (and is printed) as the spec it stands for */
		char *given = strndup(p, (size_t)(end - p));
		if (given && kvspec_preset(given)) {
			char *spec = strdup(lab_spec_resolve(given));
			free(given);
			given = spec;
		}
		if (!(specs[*n] = given)) {
			fprintf(stderr, "turbokv-lab: out of memory\n");
			return -1;
		}
		(*n)++;
		p = *end ? end + 1 : end;
	}
	return 0;
}
