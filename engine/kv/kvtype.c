/*
 * kvtype.c: KV type names, the --kv spec grammar and its per-layer
 * resolution, and the storage cost of each type (see kvtype.h).
 */
#include "engine/kv/kvtype.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>

#include "engine/kv/kvformat.h"

#define KVTYPE_MAX_DIM TQ_MAX_DIM
#define KVSPEC_MAX_KV_HEADS 4096

/* ---- types: each format parses, names and sizes its own (kvformat.h) ---- */

/* The type without the "+c" suffix: the first format that knows the name. */
static int base_type_from_name(const char *name, KvRole role, int dim, KvType *ret, Error *err)
{
	if (dim < 1 || dim > KVTYPE_MAX_DIM)
		return error_set(err, KVTYPE_E_DIM, "KV type '%s': head_dim %d not in [1, %d]",
				 name, dim, KVTYPE_MAX_DIM);
	if (name[0] == '\0')
		return error_set(err, KVTYPE_E_UNKNOWN, "empty KV type name");
	for (size_t i = 0; kvformat_at(i); i++) {
		int r = kvformat_at(i)->parse(name, role, dim, ret, err);
		if (r != -ENOENT)
			return r;
	}
	return error_set(err, KVTYPE_E_UNKNOWN,
			 "unknown KV type '%s' (known: f32, f16, q8_0, q4_0, each with "
			 "optional +h, and tq<B>[.5][+qjl][_nc], B 1..8; keys may add +c, "
			 "or be pk<B>; pq, pq<B>[f])",
			 name);
}

/* "<base>+s": values with block 0 kept exact (kvtype.h, "+s"). */
static int sink_type_from_name(const char *name, KvRole role, int dim, KvType *ret, Error *err)
{
	size_t n = strlen(name);
	char base[KVTYPE_NAME_MAX];
	if (n - 2 >= sizeof(base))
		return error_set(err, KVTYPE_E_UNKNOWN, "unknown KV type '%s' (too long)", name);
	memcpy(base, name, n - 2);
	base[n - 2] = '\0';
	if (role == KV_ROLE_K)
		return error_set(err, KVTYPE_E_ROLE,
				 "K type '%s': +s (exact sink values) is for values only; centered "
				 "keys (+c, pk) keep block 0 exact already",
				 name);
	KvType t;
	int r = base_type_from_name(base, role, dim, &t, err);
	if (r)
		return r;
	if (t.centered || t.sink || !kvformat_of(&t)->to_stored)
		return error_set(err, KVTYPE_E_UNKNOWN,
				 "unknown KV type '%s': +s takes a plain or TurboQuant value type", name);
	t.sink = true;
	*ret = t;
	return 0;
}

int kvtype_from_name(const char *name, KvRole role, int dim, KvType *ret, Error *err)
{
	assert(name);
	size_t n = strlen(name);
	if (n >= 2 && strcmp(name + n - 2, "+s") == 0)
		return sink_type_from_name(name, role, dim, ret, err);
	if (n < 2 || strcmp(name + n - 2, "+c") != 0)
		return base_type_from_name(name, role, dim, ret, err);

	char base[KVTYPE_NAME_MAX];
	if (n - 2 >= sizeof(base))
		return error_set(err, KVTYPE_E_UNKNOWN, "unknown KV type '%s' (too long)", name);
	memcpy(base, name, n - 2);
	base[n - 2] = '\0';
	if (strlen(base) >= 2 && strcmp(base + strlen(base) - 2, "+c") == 0)
		return error_set(err, KVTYPE_E_UNKNOWN, "unknown KV type '%s': +c twice", name);
	if (role == KV_ROLE_V)
		return error_set(err, KVTYPE_E_ROLE,
				 "V type '%s': +c (centered keys) is for keys only; values are "
				 "not compared with each other, use '%s'",
				 name, base);
	KvType t;
	int r = base_type_from_name(base, role, dim, &t, err);
	if (r)
		return r;
	if (t.centered)
		return error_set(err, KVTYPE_E_UNKNOWN,
				 "unknown KV type '%s': %s keys are always centered, write '%s'", name,
				 kvformat_of(&t)->name, base);
	t.centered = true;
	*ret = t;
	return 0;
}

void kvtype_name(const KvType *t, char *buf, size_t size)
{
	if (size == 0)
		return;
	char base[KVTYPE_NAME_MAX];
	KvType b = *t;
	bool plus_c = t->centered && !kvformat_of(t)->centers;
	if (plus_c)
		b.centered = false;
	b.sink = false;
	kvformat_of(&b)->type_name(&b, base, sizeof(base));
	snprintf(buf, size, "%s%s", base, plus_c ? "+c" : t->sink ? "+s" : "");
}

bool kvtype_equal(const KvType *a, const KvType *b)
{
	if (a->format != b->format || a->hadamard != b->hadamard || a->centered != b->centered ||
	    a->sink != b->sink || a->dim != b->dim)
		return false;
	return kvformat_of(a)->type_equal(a, b);
}

size_t kvtype_vec_bytes(const KvType *t)
{
	return kvformat_of(t)->vec_bytes(t);
}

double kvtype_bits_per_value(const KvType *t)
{
	return (double)kvtype_vec_bytes(t) * 8.0 / (double)t->dim;
}

/* ---- specs ---- */

/* An index: optional '-', 1..5 digits, |value| <= KVSPEC_MAX_LAYERS. */
static bool parse_index(const char **p, const char *end, int *ret)
{
	const char *s = *p;
	bool neg = false;
	int v = 0, n = 0;

	if (s < end && *s == '-') {
		neg = true;
		s++;
	}
	while (s < end && *s >= '0' && *s <= '9') {
		v = v * 10 + (*s - '0');
		if (++n > 5 || v > KVSPEC_MAX_LAYERS)
			return false;
		s++;
	}
	if (n == 0 || (neg && v == 0))
		return false;
	*ret = neg ? -v : v;
	*p = s;
	return true;
}

static int parse_layers(const char *s, const char *end, KvSpecRule *rule, Error *err)
{
	const char *p = s;
	int len = (int)(end - s);

	if (!parse_index(&p, end, &rule->first))
		return error_set(err, KVTYPE_E_SYNTAX,
				 "bad layer range '%.*s' (want N, A-B, negative counting from "
				 "the end: -2--1)",
				 len, s);
	rule->last = rule->first;
	if (p < end) {
		if (*p != '-')
			return error_set(err, KVTYPE_E_SYNTAX, "bad layer range '%.*s'", len, s);
		p++;
		if (!parse_index(&p, end, &rule->last) || p != end)
			return error_set(err, KVTYPE_E_SYNTAX, "bad layer range '%.*s'", len, s);
	}
	/* Same sign: the order is known without the layer count. */
	if ((rule->first < 0) == (rule->last < 0) && rule->first > rule->last)
		return error_set(err, KVTYPE_E_RANGE,
				 "bad layer range '%.*s': first layer after the last", len, s);
	return 0;
}

static int copy_name(const char *s, const char *end, char *out, const char *item, int item_len,
		     Error *err)
{
	size_t n = (size_t)(end - s);
	if (n == 0)
		return error_set(err, KVTYPE_E_SYNTAX, "'%.*s': empty KV type", item_len, item);
	if (n >= KVTYPE_NAME_MAX)
		return error_set(err, KVTYPE_E_UNKNOWN, "unknown KV type '%.*s' (too long)",
				 (int)n, s);
	memcpy(out, s, n);
	out[n] = '\0';
	return 0;
}

/* "K[:V]" from s..end into rule->k, rule->v, checked as names. */
static int parse_pair(const char *s, const char *end, KvSpecRule *rule, const char *item,
		      int item_len, Error *err)
{
	const char *colon = memchr(s, ':', (size_t)(end - s));
	int r;

	if (colon && memchr(colon + 1, ':', (size_t)(end - colon - 1)))
		return error_set(err, KVTYPE_E_SYNTAX, "'%.*s': more than one ':' (want K[:V])",
				 item_len, item);
	r = copy_name(s, colon ? colon : end, rule->k, item, item_len, err);
	if (r)
		return r;
	r = colon ? copy_name(colon + 1, end, rule->v, item, item_len, err) : 0;
	if (r)
		return r;
	if (!colon)
		memcpy(rule->v, rule->k, sizeof(rule->v));

	/* The names must be valid at some head_dim; the largest accepts all. */
	KvType t;
	r = kvtype_from_name(rule->k, KV_ROLE_K, KVTYPE_MAX_DIM, &t, err);
	if (r)
		return r;
	return kvtype_from_name(rule->v, KV_ROLE_V, KVTYPE_MAX_DIM, &t, err);
}

static int parse_item(const char *item, int len, bool first_item, KvSpecRule *rule, Error *err)
{
	const char *end = item + len;
	const char *eq = memchr(item, '=', (size_t)len);

	*rule = (KvSpecRule){ .all = first_item };
	if (first_item) {
		if (eq)
			return error_set(err, KVTYPE_E_SYNTAX,
					 "'%.*s': a spec starts with the types of all layers "
					 "(K[:V]), then LAYERS=K[:V] overrides",
					 len, item);
		return parse_pair(item, end, rule, item, len, err);
	}
	if (!eq)
		return error_set(err, KVTYPE_E_SYNTAX,
				 "'%.*s': overrides are LAYERS=K[:V] (the default types come first)",
				 len, item);
	if (memchr(eq + 1, '=', (size_t)(end - eq - 1)))
		return error_set(err, KVTYPE_E_SYNTAX, "'%.*s': more than one '='", len, item);
	int r = parse_layers(item, eq, rule, err);
	if (r)
		return r;
	return parse_pair(eq + 1, end, rule, item, len, err);
}

/* ---- presets ---- */

static const KvPreset presets[] = {
	{ "default", KV_DEFAULT_SPEC, KV_DEFAULT_SPEC_GPU,
	  "the daemon's default, 4.5 bits per value" },
	{ "small", KV_SMALL_SPEC, KV_SMALL_SPEC_GPU,
	  "6x smaller than f16 (<= 2.67 bits per value)" },
	{ "exact", KV_EXACT_SPEC, KV_EXACT_SPEC, "f16-level fidelity, 8.25 bits per value" },
};

const KvPreset *kvspec_preset(const char *name)
{
	for (size_t i = 0; name && i < ARRAY_SIZE(presets); i++)
		if (strcmp(name, presets[i].name) == 0)
			return &presets[i];
	return NULL;
}

const KvPreset *kvspec_preset_at(size_t i)
{
	return i < ARRAY_SIZE(presets) ? &presets[i] : NULL;
}

int kvspec_parse(const char *text, KvSpec *ret, Error *err)
{
	_cleanup_(freep) KvSpec *spec = NULL;
	const KvPreset *preset = kvspec_preset(text);
	if (preset)
		text = preset->spec;
	size_t len = text ? strnlen(text, KVSPEC_MAX_LEN + 1) : 0;

	if (len == 0)
		return error_set(err, KVTYPE_E_SYNTAX, "empty KV spec");
	if (len > KVSPEC_MAX_LEN)
		return error_set(err, KVTYPE_E_SYNTAX, "KV spec longer than %d characters",
				 KVSPEC_MAX_LEN);
	spec = calloc(1, sizeof(*spec));
	if (!spec)
		return -ENOMEM;

	const char *p = text, *end = text + len;
	for (int i = 0;; i++) {
		const char *comma = memchr(p, ',', (size_t)(end - p));
		const char *item_end = comma ? comma : end;
		if (item_end == p)
			return error_set(err, KVTYPE_E_SYNTAX, "KV spec '%s': empty item %d", text,
					 i + 1);
		if (i == KVSPEC_MAX_RULES)
			return error_set(err, KVTYPE_E_SYNTAX, "KV spec: more than %d items",
					 KVSPEC_MAX_RULES);
		int r = parse_item(p, (int)(item_end - p), i == 0, &spec->rules[i], err);
		if (r)
			return r;
		spec->n_rules = i + 1;
		if (!comma)
			break;
		p = comma + 1;
	}
	*ret = *spec;
	return 0;
}

static void layers_name(const KvSpecRule *rule, char *buf, size_t size)
{
	if (rule->first == rule->last)
		snprintf(buf, size, "%d", rule->first);
	else
		snprintf(buf, size, "%d-%d", rule->first, rule->last);
}

void kvspec_name(const KvSpec *spec, char *buf, size_t size)
{
	size_t off = 0;

	if (size == 0)
		return;
	buf[0] = '\0';
	for (int i = 0; i < spec->n_rules && off < size; i++) {
		const KvSpecRule *rule = &spec->rules[i];
		char layers[32] = "";
		if (!rule->all)
			layers_name(rule, layers, sizeof(layers));
		bool same = strcmp(rule->k, rule->v) == 0;
		int n = snprintf(buf + off, size - off, "%s%s%s%s%s%s", i ? "," : "", layers,
				 rule->all ? "" : "=", rule->k, same ? "" : ":", same ? "" : rule->v);
		if (n < 0)
			return;
		off += (size_t)n;
	}
}

/* The rule's layers as [*ret_lo, *ret_hi] of n_layers, or KVTYPE_E_RANGE. */
static int rule_range(const KvSpecRule *rule, int n_layers, int *ret_lo, int *ret_hi, Error *err)
{
	char text[32];
	int lo = rule->first < 0 ? n_layers + rule->first : rule->first;
	int hi = rule->last < 0 ? n_layers + rule->last : rule->last;

	if (rule->all) {
		*ret_lo = 0;
		*ret_hi = n_layers - 1;
		return 0;
	}
	layers_name(rule, text, sizeof(text));
	if (lo < 0 || lo >= n_layers || hi < 0 || hi >= n_layers)
		return error_set(err, KVTYPE_E_RANGE,
				 "layer range '%s' outside the model's layers 0..%d", text,
				 n_layers - 1);
	if (lo > hi)
		return error_set(err, KVTYPE_E_RANGE,
				 "layer range '%s' is empty for %d layers (layers %d..%d)", text,
				 n_layers, lo, hi);
	*ret_lo = lo;
	*ret_hi = hi;
	return 0;
}

int kvspec_resolve(const KvSpec *spec, int n_layers, int n_kv_heads, int head_dim,
		   KvPlan **ret, Error *err)
{
	_cleanup_(kvplan_freep) KvPlan *plan = NULL;

	if (n_layers < 1 || n_layers > KVSPEC_MAX_LAYERS)
		return error_set(err, -EINVAL, "n_layers %d not in [1, %d]", n_layers,
				 KVSPEC_MAX_LAYERS);
	if (n_kv_heads < 1 || n_kv_heads > KVSPEC_MAX_KV_HEADS)
		return error_set(err, -EINVAL, "n_kv_heads %d not in [1, %d]", n_kv_heads,
				 KVSPEC_MAX_KV_HEADS);
	if (head_dim < 1 || head_dim > KVTYPE_MAX_DIM)
		return error_set(err, -EINVAL, "head_dim %d not in [1, %d]", head_dim,
				 KVTYPE_MAX_DIM);
	if (spec->n_rules < 1 || spec->n_rules > KVSPEC_MAX_RULES || !spec->rules[0].all)
		return error_set(err, -EINVAL, "KV spec has no default types");

	plan = calloc(1, sizeof(*plan));
	if (!plan)
		return -ENOMEM;
	plan->layers = calloc_array((size_t)n_layers, sizeof(*plan->layers));
	if (!plan->layers)
		return -ENOMEM;
	plan->n_layers = n_layers;
	plan->n_kv_heads = n_kv_heads;
	plan->head_dim = head_dim;

	for (int i = 0; i < spec->n_rules; i++) {
		const KvSpecRule *rule = &spec->rules[i];
		KvLayerTypes lt;
		int lo = 0, hi = -1, r;

		r = rule_range(rule, n_layers, &lo, &hi, err);
		if (r)
			return r;
		r = kvtype_from_name(rule->k, KV_ROLE_K, head_dim, &lt.k, err);
		if (r)
			return r;
		r = kvtype_from_name(rule->v, KV_ROLE_V, head_dim, &lt.v, err);
		if (r)
			return r;
		for (int l = lo; l <= hi; l++)
			plan->layers[l] = lt;
	}
	*ret = TAKE_PTR(plan);
	return 0;
}

int kvplan_from_text(const char *text, int n_layers, int n_kv_heads, int head_dim,
		     KvPlan **ret, Error *err)
{
	_cleanup_(freep) KvSpec *spec = calloc(1, sizeof(*spec));
	if (!spec)
		return -ENOMEM;
	int r = kvspec_parse(text, spec, err);
	if (r)
		return r;
	return kvspec_resolve(spec, n_layers, n_kv_heads, head_dim, ret, err);
}

KvPlan *kvplan_free(KvPlan *plan)
{
	if (plan) {
		free(plan->layers);
		free(plan);
	}
	return NULL;
}

size_t kvplan_bytes_per_token(const KvPlan *plan)
{
	size_t sum = 0;
	for (int l = 0; l < plan->n_layers; l++)
		sum += kvtype_vec_bytes(&plan->layers[l].k) + kvtype_vec_bytes(&plan->layers[l].v);
	return sum * (size_t)plan->n_kv_heads;
}

double kvplan_bits_per_value(const KvPlan *plan)
{
	double values = 2.0 * plan->n_layers * plan->n_kv_heads * plan->head_dim;
	return (double)kvplan_bytes_per_token(plan) * 8.0 / values;
}

bool kvplan_is_uniform(const KvPlan *plan)
{
	for (int l = 1; l < plan->n_layers; l++)
		if (!kvtype_equal(&plan->layers[l].k, &plan->layers[0].k) ||
		    !kvtype_equal(&plan->layers[l].v, &plan->layers[0].v))
			return false;
	return true;
}

bool kvplan_is_f32(const KvPlan *plan)
{
	for (int l = 0; l < plan->n_layers; l++)
		for (int role = 0; role < 2; role++) {
			const KvType *t = role ? &plan->layers[l].v : &plan->layers[l].k;
			if (t->format != KV_FORMAT_F32 || t->hadamard || t->centered || t->sink)
				return false;
		}
	return true;
}
