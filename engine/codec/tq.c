/*
 * tq.c: the TurboQuant codec (see tq.h for the math and both byte
 * layouts): descriptors and their records, codec construction, scalar
 * reference encode / decode / inner product.
 *
 * Everything per vector works on stack buffers of TQ_MAX_DIM floats, so a
 * codec is immutable after tq_codec_new() and may be shared by threads.
 */
#include <assert.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/crc32c.h"
#include "engine/codec/codebook.h"
#include "engine/codec/tq.h"
#include "kernels/kv_kernel.h"

#define TQ_DEFAULT_ROT_SEED 0x74757262306b7631ull /* "turb0kv1" */
#define TQ_DEFAULT_QJL_SEED 0x716a6c5f73656564ull /* "qjl_seed" */
#define TQ_QJL_DOMAIN 0x514a4c2d532d6d78ull       /* separates S's stream from P's */
#define TQ_MAX_SCALE 65504.0                      /* largest finite fp16 */
#define TQ_MAX_S_FLOATS ((size_t)1 << 21)         /* m * dim bound for a Gaussian S */

typedef struct TqGroup {
	int dim;            /* coordinates in the group */
	int off;            /* first rotated coordinate */
	int scale;          /* index of its stored scale */
	Rotation *rot;
	uint16_t *channels; /* (dim,) input channels, ascending; NULL = identity */
} TqGroup;

struct TqCodec {
	TqDesc desc;
	TqLayout layout;
	int n_groups;
	TqGroup groups[2];
	const Codebook *cb_hi; /* (dim_hi, B+1) or NULL when n_hi = 0 */
	const Codebook *cb_lo; /* (dim_lo, B) or NULL when n_hi = dim */
	float *s;              /* (m, dim) Gaussian S, or NULL */
	Rotation *s_rot;       /* structured S, or NULL */
	float qjl_const;
};

/* ---- small pieces: checksum, seeds, the QJL stream ---- */

/* The record checksum is the session files' CRC-32C (crc32c.h): one implementation. */
uint32_t tq_crc32c(const void *data, size_t n)
{
	return crc32c(data, n);
}

static uint64_t splitmix64(uint64_t *state)
{
	uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

uint64_t tq_seed_mix(uint64_t seed)
{
	uint64_t s = seed ^ 0x6c6f2d67726f7570ull; /* "lo-group" */
	return splitmix64(&s);
}

/* The seed actually handed to S's generator (or to its rotation). */
static uint64_t qjl_stream_seed(uint64_t qjl_seed)
{
	uint64_t s = qjl_seed ^ TQ_QJL_DOMAIN;
	return splitmix64(&s);
}

/* Fill out (n,) with N(0,1): the QJL stream of rotation.h's generator. */
static void gaussian_fill(uint64_t seed, float *out, size_t n)
{
	Rng rng;
	double buf[1024]; /* even, so chunking keeps the Box-Muller pairs */
	rng_init(&rng, seed);
	for (size_t i = 0; i < n; i += ARRAY_SIZE(buf)) {
		size_t k = MIN(ARRAY_SIZE(buf), n - i);
		rng_fill_normal(&rng, buf, k);
		for (size_t j = 0; j < k; j++)
			out[i + j] = (float)buf[j];
	}
}

static bool is_pow2(int n)
{
	return n > 0 && (n & (n - 1)) == 0;
}

static int mask_popcount(const uint8_t *mask)
{
	int n = 0;
	for (int i = 0; i < TQ_MASK_BYTES; i++)
		n += __builtin_popcount(mask[i]);
	return n;
}

static bool mask_get(const uint8_t *mask, int c)
{
	return (mask[c >> 3] >> (c & 7)) & 1;
}

/* ---- descriptors ---- */

void tq_desc_init(TqDesc *d, int dim, int bits)
{
	*d = (TqDesc){
		.dim = dim,
		.bits = bits,
		.n_hi = 0,
		.group = TQ_GROUP_ROTATED_SLICE,
		.rotation = ROTATION_AUTO,
		.rounds = 2,
		.flags = 0,
		.qjl_m = 0,
		.rot_seed = TQ_DEFAULT_ROT_SEED,
		.qjl_seed = 0,
	};
}

/* The dimensions of the hi and lo rotation groups (one group under the slice rule). */
static void desc_group_dims(const TqDesc *d, int *ret_n, int dims[2])
{
	if (d->group == TQ_GROUP_OUTLIER_CHANNELS) {
		*ret_n = 2;
		dims[0] = d->n_hi;
		dims[1] = d->dim - d->n_hi;
	} else {
		*ret_n = 1;
		dims[0] = d->dim;
		dims[1] = 0;
	}
}

int tq_desc_validate(const TqDesc *d, Error *err)
{
	if (d->dim < 2 || d->dim > TQ_MAX_DIM)
		return error_set(err, TQ_E_BAD_DESC, "dim: %d not in [2, %d]", d->dim, TQ_MAX_DIM);
	if (d->bits < 1 || d->bits > CODEBOOK_MAX_BITS)
		return error_set(err, TQ_E_BAD_DESC, "bits: %d not in [1, 8]", d->bits);
	if (d->n_hi < 0 || d->n_hi > d->dim)
		return error_set(err, TQ_E_BAD_DESC, "n_hi: %d not in [0, dim %d]", d->n_hi, d->dim);
	if (d->n_hi > 0 && d->bits + 1 > CODEBOOK_MAX_BITS)
		return error_set(err, TQ_E_BAD_DESC, "bits: %d + 1 for n_hi > 0 exceeds 8", d->bits);
	if (d->group != TQ_GROUP_ROTATED_SLICE && d->group != TQ_GROUP_OUTLIER_CHANNELS)
		return error_set(err, TQ_E_BAD_DESC, "group: unknown rule %d", (int)d->group);

	int n_masked = mask_popcount(d->mask);
	if (d->group == TQ_GROUP_ROTATED_SLICE) {
		if (n_masked != 0)
			return error_set(err, TQ_E_BAD_DESC, "mask: set under the rotated-slice rule");
	} else {
		if (d->n_hi < 2 || d->n_hi > d->dim - 2)
			return error_set(err, TQ_E_BAD_DESC,
					 "n_hi: %d, outlier groups need 2..dim-2 channels", d->n_hi);
		if (n_masked != d->n_hi)
			return error_set(err, TQ_E_BAD_DESC, "mask: %d channels set, n_hi is %d",
					 n_masked, d->n_hi);
		for (int c = d->dim; c < TQ_MAX_DIM; c++)
			if (mask_get(d->mask, c))
				return error_set(err, TQ_E_BAD_DESC, "mask: channel %d >= dim %d", c,
						 d->dim);
	}

	if (d->rotation != ROTATION_AUTO && d->rotation != ROTATION_HADAMARD &&
	    d->rotation != ROTATION_DENSE)
		return error_set(err, TQ_E_BAD_DESC, "rotation: unknown kind %d", (int)d->rotation);
	if (d->rounds != 1 && d->rounds != 2)
		return error_set(err, TQ_E_BAD_DESC, "rounds: %d not 1 or 2", d->rounds);
	if (d->rotation == ROTATION_DENSE && d->rounds != 1)
		return error_set(err, TQ_E_BAD_DESC, "rounds: %d, dense rotations have 1", d->rounds);
	int n_groups, dims[2];
	desc_group_dims(d, &n_groups, dims);
	for (int g = 0; g < n_groups; g++)
		if (d->rotation == ROTATION_HADAMARD && !is_pow2(dims[g]))
			return error_set(err, TQ_E_BAD_DESC,
					 "rotation: Hadamard needs a power of two, group has %d",
					 dims[g]);

	if (d->flags & ~(uint32_t)TQ_FLAGS_KNOWN)
		return error_set(err, TQ_E_BAD_DESC, "flags: unknown bits 0x%x",
				 d->flags & ~(uint32_t)TQ_FLAGS_KNOWN);
	bool qjl = d->flags & TQ_FLAG_QJL;
	if ((d->flags & TQ_FLAG_QJL_STRUCTURED) && !qjl)
		return error_set(err, TQ_E_BAD_DESC, "flags: structured QJL without QJL");
	if (!qjl) {
		if (d->qjl_m != 0)
			return error_set(err, TQ_E_BAD_DESC, "qjl_m: %d without QJL", d->qjl_m);
		if (d->qjl_seed != 0)
			return error_set(err, TQ_E_BAD_DESC, "qjl_seed: set without QJL");
		return 0;
	}
	if (d->qjl_m < 1 || d->qjl_m > TQ_MAX_QJL_M)
		return error_set(err, TQ_E_BAD_DESC, "qjl_m: %d not in [1, %d]", d->qjl_m,
				 TQ_MAX_QJL_M);
	if ((size_t)d->qjl_m * (size_t)d->dim > TQ_MAX_S_FLOATS)
		return error_set(err, TQ_E_BAD_DESC, "qjl_m: %d x dim %d is too large", d->qjl_m,
				 d->dim);
	if ((d->flags & TQ_FLAG_QJL_STRUCTURED) && d->qjl_m != d->dim)
		return error_set(err, TQ_E_BAD_DESC, "qjl_m: %d, structured S needs m = dim %d",
				 d->qjl_m, d->dim);
	if (d->qjl_seed == d->rot_seed || d->qjl_seed == tq_seed_mix(d->rot_seed))
		return error_set(err, TQ_E_BAD_DESC, "qjl_seed: equals a rotation seed");
	return 0;
}

bool tq_desc_equal(const TqDesc *a, const TqDesc *b)
{
	return tq_desc_compare(a, b, NULL) == 0;
}

int tq_desc_compare(const TqDesc *stored, const TqDesc *expected, Error *err)
{
	const TqDesc *a = stored, *b = expected;
#define CMP_INT(f)                                                                          \
	if (a->f != b->f)                                                                   \
		return error_set(err, TQ_E_MISMATCH, #f ": stored %lld, expected %lld",     \
				 (long long)a->f, (long long)b->f)
	CMP_INT(dim);
	CMP_INT(bits);
	CMP_INT(n_hi);
	CMP_INT(group);
	CMP_INT(rotation);
	CMP_INT(rounds);
	CMP_INT(flags);
	CMP_INT(qjl_m);
#undef CMP_INT
	if (a->rot_seed != b->rot_seed)
		return error_set(err, TQ_E_MISMATCH, "rot_seed: stored 0x%llx, expected 0x%llx",
				 (unsigned long long)a->rot_seed, (unsigned long long)b->rot_seed);
	if (a->qjl_seed != b->qjl_seed)
		return error_set(err, TQ_E_MISMATCH, "qjl_seed: stored 0x%llx, expected 0x%llx",
				 (unsigned long long)a->qjl_seed, (unsigned long long)b->qjl_seed);
	for (int c = 0; c < TQ_MAX_DIM; c++)
		if (mask_get(a->mask, c) != mask_get(b->mask, c))
			return error_set(err, TQ_E_MISMATCH, "mask: channel %d stored %d, expected %d",
					 c, mask_get(a->mask, c), mask_get(b->mask, c));
	return 0;
}

typedef struct ChannelMag {
	double mag;
	int channel;
} ChannelMag;

static int channel_mag_cmp(const void *pa, const void *pb)
{
	const ChannelMag *a = pa, *b = pb;
	if (a->mag != b->mag)
		return a->mag > b->mag ? -1 : 1;
	return a->channel - b->channel;
}

int tq_desc_choose_outliers(const float *x, int n_rows, int dim, int n_hi, uint8_t *ret_mask)
{
	if (n_rows < 1 || dim < 2 || dim > TQ_MAX_DIM || n_hi < 0 || n_hi > dim)
		return -EINVAL;
	ChannelMag mags[TQ_MAX_DIM];
	for (int c = 0; c < dim; c++)
		mags[c] = (ChannelMag){ .mag = 0.0, .channel = c };
	for (int r = 0; r < n_rows; r++)
		for (int c = 0; c < dim; c++) {
			float v = x[(size_t)r * dim + c];
			if (!isfinite(v))
				return -EINVAL;
			mags[c].mag += fabs((double)v);
		}
	/* the sum orders channels as the mean does */
	qsort(mags, (size_t)dim, sizeof(mags[0]), channel_mag_cmp);
	memset(ret_mask, 0, TQ_MASK_BYTES);
	for (int i = 0; i < n_hi; i++)
		ret_mask[mags[i].channel >> 3] |= (uint8_t)(1u << (mags[i].channel & 7));
	return 0;
}

/* Parse a decimal number at *p (advanced); -1 if none or too large. */
static int parse_uint(const char **p)
{
	int v = 0, n = 0;
	while (**p >= '0' && **p <= '9' && n < 6) {
		v = v * 10 + (**p - '0');
		(*p)++;
		n++;
	}
	return n == 0 || (**p >= '0' && **p <= '9') ? -1 : v;
}

int tq_desc_from_name(const char *name, int dim, TqDesc *ret, Error *err)
{
	const char *p = name;
	TqDesc d;
	if (strncmp(p, "tq", 2) != 0)
		return error_set(err, TQ_E_BAD_DESC, "mode '%s': does not start with tq", name);
	p += 2;
	int total = parse_uint(&p);
	if (total < 1 || total > 9)
		return error_set(err, TQ_E_BAD_DESC, "mode '%s': bad bit count", name);
	tq_desc_init(&d, dim, total);
	if (strncmp(p, ".5", 2) == 0) {
		p += 2;
		d.n_hi = dim / 2;
	} else if (*p == 'h') {
		p++;
		d.n_hi = parse_uint(&p);
		if (d.n_hi < 0)
			return error_set(err, TQ_E_BAD_DESC, "mode '%s': bad hi count", name);
	}
	if (*p == 'o') {
		p++;
		d.group = TQ_GROUP_OUTLIER_CHANNELS;
	}
	if (strncmp(p, "+qjl", 4) == 0 || strncmp(p, "+sqjl", 5) == 0) {
		d.flags |= TQ_FLAG_QJL;
		if (p[1] == 's')
			d.flags |= TQ_FLAG_QJL_STRUCTURED;
		p += p[1] == 's' ? 5 : 4;
		d.bits = total - 1;
		d.qjl_m = dim;
		d.qjl_seed = TQ_DEFAULT_QJL_SEED;
	}
	if (strncmp(p, "_nc", 3) == 0) {
		p += 3;
		d.flags |= TQ_FLAG_NORM_CORRECT;
	}
	if (strcmp(p, "_r1") == 0) {
		p += 3;
		d.rounds = 1;
	}
	if (*p)
		return error_set(err, TQ_E_BAD_DESC, "mode '%s': unexpected '%s'", name, p);
	if (d.group == TQ_GROUP_OUTLIER_CHANNELS && d.n_hi >= 0 && d.n_hi <= TQ_MAX_DIM)
		for (int c = 0; c < d.n_hi; c++) /* placeholder: the first n_hi channels */
			d.mask[c >> 3] |= (uint8_t)(1u << (c & 7));
	int r = tq_desc_validate(&d, err);
	if (r)
		return r;
	*ret = d;
	return 0;
}

void tq_desc_name(const TqDesc *d, char *buf, size_t size)
{
	bool qjl = d->flags & TQ_FLAG_QJL;
	char split[16] = "";
	if (d->n_hi > 0 && d->n_hi == d->dim / 2)
		snprintf(split, sizeof(split), ".5");
	else if (d->n_hi > 0)
		snprintf(split, sizeof(split), "h%d", d->n_hi);
	snprintf(buf, size, "tq%d%s%s%s%s%s", d->bits + (qjl ? 1 : 0), split,
		 d->group == TQ_GROUP_OUTLIER_CHANNELS ? "o" : "",
		 !qjl ? "" : (d->flags & TQ_FLAG_QJL_STRUCTURED) ? "+sqjl" : "+qjl",
		 (d->flags & TQ_FLAG_NORM_CORRECT) ? "_nc" : "", d->rounds == 1 ? "_r1" : "");
}

/* ---- the record ---- */

int tq_desc_encode(const TqDesc *d, uint8_t out[TQ_DESC_RECORD_BYTES])
{
	int r = tq_desc_validate(d, NULL);
	if (r)
		return r;
	TqDescRecord rec;
	memset(&rec, 0, sizeof(rec));
	memcpy(rec.magic, "TQDS", 4);
	put_le(rec.version, TQ_DESC_VERSION, 2);
	put_le(rec.size, TQ_DESC_RECORD_BYTES, 2);
	put_le(rec.dim, (uint64_t)d->dim, 2);
	rec.bits = (uint8_t)d->bits;
	rec.group = (uint8_t)d->group;
	put_le(rec.n_hi, (uint64_t)d->n_hi, 2);
	rec.rotation = (uint8_t)d->rotation;
	rec.rounds = (uint8_t)d->rounds;
	put_le(rec.flags, d->flags, 4);
	put_le(rec.qjl_m, (uint64_t)d->qjl_m, 2);
	put_le(rec.rot_seed, d->rot_seed, 8);
	put_le(rec.qjl_seed, d->qjl_seed, 8);
	memcpy(rec.mask, d->mask, TQ_MASK_BYTES);
	put_le(rec.crc, tq_crc32c(&rec, offsetof(TqDescRecord, crc)), 4);
	memcpy(out, &rec, sizeof(rec));
	return 0;
}

static bool all_zero(const uint8_t *p, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if (p[i])
			return false;
	return true;
}

int tq_desc_decode(const void *bytes, size_t len, TqDesc *ret, Error *err)
{
	TqDescRecord rec;
	if (len < sizeof(rec))
		return error_set(err, TQ_E_CORRUPT, "descriptor: truncated, %zu of %d bytes", len,
				 TQ_DESC_RECORD_BYTES);
	if (len > sizeof(rec))
		return error_set(err, TQ_E_CORRUPT, "descriptor: %zu bytes, expected %d", len,
				 TQ_DESC_RECORD_BYTES);
	memcpy(&rec, bytes, sizeof(rec));
	if (memcmp(rec.magic, "TQDS", 4) != 0)
		return error_set(err, TQ_E_CORRUPT, "descriptor: bad magic");
	uint64_t version = get_le(rec.version, 2);
	if (version != TQ_DESC_VERSION)
		return error_set(err, TQ_E_VERSION, "descriptor: version %llu, this build reads %d",
				 (unsigned long long)version, TQ_DESC_VERSION);
	if (get_le(rec.size, 2) != TQ_DESC_RECORD_BYTES)
		return error_set(err, TQ_E_CORRUPT, "descriptor: size field %llu, expected %d",
				 (unsigned long long)get_le(rec.size, 2), TQ_DESC_RECORD_BYTES);
	uint32_t crc = tq_crc32c(&rec, offsetof(TqDescRecord, crc));
	if (get_le(rec.crc, 4) != crc)
		return error_set(err, TQ_E_CORRUPT, "descriptor: checksum 0x%08llx, computed 0x%08x",
				 (unsigned long long)get_le(rec.crc, 4), crc);
	if (!all_zero(rec.reserved0, sizeof(rec.reserved0)) ||
	    !all_zero(rec.reserved1, sizeof(rec.reserved1)))
		return error_set(err, TQ_E_BAD_DESC, "reserved: bytes not zero");
	if (rec.group > TQ_GROUP_OUTLIER_CHANNELS)
		return error_set(err, TQ_E_BAD_DESC, "group: unknown rule %u", rec.group);
	if (rec.rotation > ROTATION_DENSE)
		return error_set(err, TQ_E_BAD_DESC, "rotation: unknown kind %u", rec.rotation);

	TqDesc d = {
		.dim = (int)get_le(rec.dim, 2),
		.bits = rec.bits,
		.n_hi = (int)get_le(rec.n_hi, 2),
		.group = (TqGroupRule)rec.group,
		.rotation = (RotationKind)rec.rotation,
		.rounds = rec.rounds,
		.flags = (uint32_t)get_le(rec.flags, 4),
		.qjl_m = (int)get_le(rec.qjl_m, 2),
		.rot_seed = get_le(rec.rot_seed, 8),
		.qjl_seed = get_le(rec.qjl_seed, 8),
	};
	memcpy(d.mask, rec.mask, TQ_MASK_BYTES);
	int r = tq_desc_validate(&d, err);
	if (r)
		return r;
	*ret = d;
	return 0;
}

/* ---- codecs ---- */

TqCodec *tq_codec_free(TqCodec *c)
{
	if (!c)
		return NULL;
	for (int g = 0; g < 2; g++) {
		rotation_free(c->groups[g].rot);
		free(c->groups[g].channels);
	}
	rotation_free(c->s_rot);
	free(c->s);
	free(c);
	return NULL;
}

static void layout_compute(const TqDesc *d, int n_groups, TqLayout *L)
{
	bool qjl = d->flags & TQ_FLAG_QJL;
	uint32_t off = 0;
	*L = (TqLayout){
		.dim = d->dim,
		.n_hi = d->n_hi,
		.bits_hi = d->n_hi > 0 ? d->bits + 1 : 0,
		.bits_lo = d->n_hi < d->dim ? d->bits : 0,
		.qjl_m = qjl ? d->qjl_m : 0,
		.n_scales = n_groups,
	};
	L->off_scale[0] = off;
	off += 2;
	L->off_scale[1] = n_groups == 2 ? off : 0;
	off += n_groups == 2 ? 2 : 0;
	L->off_gamma = off;
	off += qjl ? 2 : 0;
	L->off_hi = off;
	off += (uint32_t)bitpack_bytes(L->bits_hi, (size_t)d->n_hi);
	L->off_lo = off;
	off += (uint32_t)bitpack_bytes(L->bits_lo, (size_t)(d->dim - d->n_hi));
	L->off_signs = off;
	off += qjl ? (uint32_t)bitpack_bytes(1, (size_t)d->qjl_m) : 0;
	L->code_bytes = off;
	assert(off <= TQ_MAX_CODE_BYTES);
}

static int codec_groups_new(TqCodec *c, Error *err)
{
	const TqDesc *d = &c->desc;
	int dims[2];
	desc_group_dims(d, &c->n_groups, dims);
	for (int g = 0; g < c->n_groups; g++) {
		TqGroup *G = &c->groups[g];
		G->dim = dims[g];
		G->off = g == 0 ? 0 : d->n_hi;
		G->scale = g;
		RotationKind kind = d->rotation;
		if (kind == ROTATION_AUTO)
			kind = is_pow2(G->dim) ? ROTATION_HADAMARD : ROTATION_DENSE;
		int rounds = kind == ROTATION_HADAMARD ? d->rounds : 1;
		uint64_t seed = g == 0 ? d->rot_seed : tq_seed_mix(d->rot_seed);
		int r = rotation_new(kind, G->dim, rounds, seed, &G->rot);
		if (r)
			return error_set(err, r, "rotation of group %d (dim %d): %s", g, G->dim,
					 strerror(-r));
		if (c->n_groups == 1)
			continue;
		G->channels = malloc_array((size_t)G->dim, sizeof(uint16_t));
		if (!G->channels)
			return error_set(err, -ENOMEM, "out of memory");
		int n = 0;
		for (int ch = 0; ch < d->dim; ch++)
			if (mask_get(d->mask, ch) == (g == 0))
				G->channels[n++] = (uint16_t)ch;
		assert(n == G->dim);
	}
	return 0;
}

/*
 * 1 / (d E|t|) for t a coordinate of a uniform point on the unit sphere
 * in R^d: E|t| = Gamma(d/2) / (sqrt(pi) Gamma((d+1)/2)), so the constant
 * is sqrt(pi) R(d) / d with R(d) = Gamma((d+1)/2) / Gamma(d/2), which
 * satisfies R(d+2) = R(d) (d+1) / d, R(1) = 1/sqrt(pi), R(2) = sqrt(pi)/2.
 */
static double structured_qjl_const(int d)
{
	double r = d % 2 ? 1.0 / sqrt(M_PI) : sqrt(M_PI) / 2.0;
	for (int k = d % 2 ? 1 : 2; k < d; k += 2)
		r *= (double)(k + 1) / k;
	return sqrt(M_PI) * r / d;
}

static int codec_qjl_new(TqCodec *c, Error *err)
{
	const TqDesc *d = &c->desc;
	uint64_t seed = qjl_stream_seed(d->qjl_seed);
	if (d->flags & TQ_FLAG_QJL_STRUCTURED) {
		int r = rotation_new(ROTATION_AUTO, d->dim, 2, seed, &c->s_rot);
		if (r)
			return error_set(err, r, "structured QJL matrix: %s", strerror(-r));
		c->qjl_const = (float)structured_qjl_const(d->dim);
		return 0;
	}
	size_t n = (size_t)d->qjl_m * (size_t)d->dim; /* bounded by validation */
	c->s = malloc_array(n, sizeof(float));
	if (!c->s)
		return error_set(err, -ENOMEM, "out of memory");
	gaussian_fill(seed, c->s, n);
	c->qjl_const = (float)(sqrt(M_PI / 2.0) / (double)d->qjl_m);
	return 0;
}

int tq_codec_new(const TqDesc *desc, TqCodec **ret, Error *err)
{
	int r = tq_desc_validate(desc, err);
	if (r)
		return r;
	_cleanup_(tq_codec_freep) TqCodec *c = calloc(1, sizeof(*c));
	if (!c)
		return error_set(err, -ENOMEM, "out of memory");
	c->desc = *desc;
	r = codec_groups_new(c, err);
	if (r)
		return r;
	const TqDesc *d = &c->desc;
	int dim_hi = c->n_groups == 2 ? c->groups[0].dim : d->dim;
	int dim_lo = c->n_groups == 2 ? c->groups[1].dim : d->dim;
	if (d->n_hi > 0 && (r = codebook_get(dim_hi, d->bits + 1, &c->cb_hi)) < 0)
		return error_set(err, r, "codebook (%d, %d): %s", dim_hi, d->bits + 1, strerror(-r));
	if (d->n_hi < d->dim && (r = codebook_get(dim_lo, d->bits, &c->cb_lo)) < 0)
		return error_set(err, r, "codebook (%d, %d): %s", dim_lo, d->bits, strerror(-r));
	if ((d->flags & TQ_FLAG_QJL) && (r = codec_qjl_new(c, err)) < 0)
		return r;
	layout_compute(d, c->n_groups, &c->layout);
	*ret = TAKE_PTR(c);
	return 0;
}

const TqDesc *tq_codec_desc(const TqCodec *c)
{
	return &c->desc;
}

const TqLayout *tq_codec_layout(const TqCodec *c)
{
	return &c->layout;
}

int tq_codec_check(const TqCodec *c, const void *bytes, size_t len, Error *err)
{
	TqDesc stored;
	int r = tq_desc_decode(bytes, len, &stored, err);
	if (r)
		return r;
	return tq_desc_compare(&stored, &c->desc, err);
}

size_t tq_code_bytes(const TqCodec *c)
{
	return c->layout.code_bytes;
}

size_t tq_codec_bytes(const TqCodec *c)
{
	size_t n = sizeof(*c);
	for (int g = 0; g < c->n_groups; g++) {
		if (c->groups[g].rot)
			n += rotation_bytes(c->groups[g].rot);
		if (c->groups[g].channels)
			n += (size_t)c->groups[g].dim * sizeof(uint16_t);
	}
	if (c->s)
		n += (size_t)c->desc.qjl_m * (size_t)c->desc.dim * sizeof(float);
	if (c->s_rot)
		n += rotation_bytes(c->s_rot);
	return n;
}

double tq_bits_per_value(const TqCodec *c)
{
	return (double)c->layout.code_bytes * 8.0 / (double)c->desc.dim;
}

const float *tq_codec_centroids(const TqCodec *c, bool hi)
{
	const Codebook *cb = hi ? c->cb_hi : c->cb_lo;
	return cb ? cb->centroids : NULL;
}

float tq_qjl_const(const TqCodec *c)
{
	return c->qjl_const;
}

/* ---- per vector ---- */

/* out (G.dim,) = P_g x[channels of g]. */
static void group_rotate(const TqGroup *G, const float *x, float *out)
{
	if (!G->channels) {
		rotation_apply(G->rot, x, out);
		return;
	}
	float tmp[TQ_MAX_DIM];
	for (int i = 0; i < G->dim; i++)
		tmp[i] = x[G->channels[i]];
	rotation_apply(G->rot, tmp, out);
}

/* x[channels of g] = P_g^T v (G.dim,). */
static void group_unrotate(const TqGroup *G, const float *v, float *x)
{
	if (!G->channels) {
		rotation_apply_inverse(G->rot, v, x);
		return;
	}
	float tmp[TQ_MAX_DIM];
	rotation_apply_inverse(G->rot, v, tmp);
	for (int i = 0; i < G->dim; i++)
		x[G->channels[i]] = tmp[i];
}

static const Codebook *coord_codebook(const TqCodec *c, int i)
{
	return i < c->desc.n_hi ? c->cb_hi : c->cb_lo;
}

static float saturate_scale(double s)
{
	return (float)(s > TQ_MAX_SCALE ? TQ_MAX_SCALE : s);
}

/* w (m,) = S v (dim,). */
static void qjl_sketch(const TqCodec *c, const float *v, float *w)
{
	int d = c->desc.dim, m = c->desc.qjl_m;
	if (c->s_rot) {
		rotation_apply(c->s_rot, v, w);
		return;
	}
	for (int i = 0; i < m; i++) {
		const float *row = c->s + (size_t)i * d;
		float acc = 0.0f;
		for (int j = 0; j < d; j++)
			acc += row[j] * v[j];
		w[i] = acc;
	}
}

/* QJL part of tq_encode: gamma and sign bits of r = y - rec. */
static void encode_qjl(const TqCodec *c, const float *y, const float *rec, uint8_t *code)
{
	const TqLayout *L = &c->layout;
	float r[TQ_MAX_DIM], w[TQ_MAX_QJL_M];
	double g2 = 0.0;
	for (int i = 0; i < L->dim; i++) {
		r[i] = y[i] - rec[i];
		g2 += (double)r[i] * r[i];
	}
	tq_store_f16(code + L->off_gamma, saturate_scale(sqrt(g2)));
	qjl_sketch(c, r, w);
	uint8_t *signs = code + L->off_signs;
	for (int i = 0; i < L->qjl_m; i++)
		if (w[i] >= 0.0f)
			signs[i >> 3] |= (uint8_t)(1u << (i & 7));
}

void tq_encode(const TqCodec *c, const float *x, uint8_t *code)
{
	const TqLayout *L = &c->layout;
	float y[TQ_MAX_DIM];   /* (dim,) P x, rotated domain */
	float rec[TQ_MAX_DIM]; /* (dim,) y~ */
	uint8_t idx[TQ_MAX_DIM];

	memset(code, 0, L->code_bytes);
	for (int g = 0; g < c->n_groups; g++) {
		const TqGroup *G = &c->groups[g];
		double n2 = 0.0;
		if (G->channels)
			for (int i = 0; i < G->dim; i++)
				n2 += (double)x[G->channels[i]] * x[G->channels[i]];
		else
			for (int i = 0; i < G->dim; i++)
				n2 += (double)x[i] * x[i];
		double n = sqrt(n2);
		group_rotate(G, x, y + G->off);

		float inv = n > 0.0 ? (float)(1.0 / n) : 0.0f;
		double c2 = 0.0;
		for (int i = G->off; i < G->off + G->dim; i++) {
			const Codebook *cb = coord_codebook(c, i);
			idx[i] = n > 0.0 ? codebook_quantize(cb, y[i] * inv) : 0;
			c2 += (double)cb->centroids[idx[i]] * cb->centroids[idx[i]];
		}
		double s = n;
		if ((c->desc.flags & TQ_FLAG_NORM_CORRECT) && n > 0.0 && c2 > 0.0)
			s = n / sqrt(c2);
		else if (n == 0.0)
			s = 0.0;
		tq_store_f16(code + L->off_scale[G->scale], saturate_scale(s));
		float sf = tq_load_f16(code + L->off_scale[G->scale]);
		for (int i = G->off; i < G->off + G->dim; i++)
			rec[i] = sf * coord_codebook(c, i)->centroids[idx[i]];
	}
	if (L->n_hi > 0)
		bitpack_pack(idx, (size_t)L->n_hi, L->bits_hi, code + L->off_hi);
	if (L->n_hi < L->dim)
		bitpack_pack(idx + L->n_hi, (size_t)(L->dim - L->n_hi), L->bits_lo, code + L->off_lo);
	if (c->desc.flags & TQ_FLAG_QJL)
		encode_qjl(c, y, rec, code);
}

/* The stored scale of the hi / lo stream. */
static float stream_scale(const TqCodec *c, const uint8_t *code, bool hi)
{
	const TqLayout *L = &c->layout;
	int k = hi || L->n_scales == 1 ? 0 : 1;
	return tq_load_f16(code + L->off_scale[k]);
}

void tq_decode(const TqCodec *c, const uint8_t *code, float *x)
{
	float v[TQ_MAX_DIM]; /* (dim,) rotated domain */
	tq_decode_rotated(c, code, v);
	tq_output_finish(c, v, x);
}

void tq_decode_rotated(const TqCodec *c, const uint8_t *code, float *v)
{
	const TqLayout *L = &c->layout;

	if (L->n_hi > 0)
		tq_unpack_scaled(code + L->off_hi, L->bits_hi, c->cb_hi->centroids, L->n_hi,
				 stream_scale(c, code, true), v);
	if (L->n_hi < L->dim)
		tq_unpack_scaled(code + L->off_lo, L->bits_lo, c->cb_lo->centroids,
				 L->dim - L->n_hi, stream_scale(c, code, false), v + L->n_hi);
	if (c->desc.flags & TQ_FLAG_QJL) {
		float gk = tq_load_f16(code + L->off_gamma) * c->qjl_const;
		const uint8_t *signs = code + L->off_signs;
		if (c->s_rot) {
			float z[TQ_MAX_DIM], t[TQ_MAX_DIM];
			for (int i = 0; i < L->dim; i++)
				z[i] = tq_sign_value(signs, i);
			rotation_apply_inverse(c->s_rot, z, t);
			for (int j = 0; j < L->dim; j++)
				v[j] += gk * t[j];
		} else {
			float t[TQ_MAX_DIM] = { 0 };
			for (int i = 0; i < L->qjl_m; i++) {
				const float *row = c->s + (size_t)i * L->dim;
				float z = tq_sign_value(signs, i);
				for (int j = 0; j < L->dim; j++)
					t[j] += z * row[j];
			}
			for (int j = 0; j < L->dim; j++)
				v[j] += gk * t[j];
		}
	}
}

void tq_query_prepare(const TqCodec *c, const float *q, TqQuery *query)
{
	for (int g = 0; g < c->n_groups; g++)
		group_rotate(&c->groups[g], q, query->rot + c->groups[g].off);
	if (c->desc.flags & TQ_FLAG_QJL)
		qjl_sketch(c, query->rot, query->sq);
}

void tq_inner_product_parts(const TqCodec *c, const TqQuery *query, const uint8_t *code,
			    float *ret_mse, float *ret_qjl)
{
	const TqLayout *L = &c->layout;
	float mse = 0.0f, qjl = 0.0f;
	if (L->n_hi > 0)
		mse += stream_scale(c, code, true) *
		       tq_dot_codes(query->rot, code + L->off_hi, L->bits_hi, c->cb_hi->centroids,
				    L->n_hi);
	if (L->n_hi < L->dim)
		mse += stream_scale(c, code, false) *
		       tq_dot_codes(query->rot + L->n_hi, code + L->off_lo, L->bits_lo,
				    c->cb_lo->centroids, L->dim - L->n_hi);
	if (c->desc.flags & TQ_FLAG_QJL)
		qjl = tq_load_f16(code + L->off_gamma) *
		      tq_dot_signs(query->sq, code + L->off_signs, L->qjl_m);
	*ret_mse = mse;
	*ret_qjl = qjl;
}

float tq_inner_product(const TqCodec *c, const TqQuery *query, const uint8_t *code)
{
	float mse, qjl;
	tq_inner_product_parts(c, query, code, &mse, &qjl);
	return mse + c->qjl_const * qjl;
}

void tq_value_axpy(const TqCodec *c, float a, const uint8_t *code, float *acc)
{
	const TqLayout *L = &c->layout;
	if (L->n_hi > 0) {
		float sa = a * stream_scale(c, code, true);
		for (int i = 0; i < L->n_hi; i++)
			acc[i] += sa * tq_code_value(code + L->off_hi, L->bits_hi, c->cb_hi->centroids, i);
	}
	if (L->n_hi < L->dim) {
		float sa = a * stream_scale(c, code, false);
		float *lo = acc + L->n_hi;
		for (int i = 0; i < L->dim - L->n_hi; i++)
			lo[i] += sa * tq_code_value(code + L->off_lo, L->bits_lo, c->cb_lo->centroids, i);
	}
}

void tq_output_finish(const TqCodec *c, const float *acc, float *x)
{
	for (int g = 0; g < c->n_groups; g++)
		group_unrotate(&c->groups[g], acc + c->groups[g].off, x);
}

/* ---- the kernel-side view (kv_kernel.h) ---- */

/* A blob being filled: arrays at 16-byte aligned offsets. */
typedef struct BlobCursor {
	uint8_t *base;
	size_t used;
} BlobCursor;

static int32_t blob_put(BlobCursor *b, const void *src, size_t bytes)
{
	size_t off = (b->used + 15) & ~(size_t)15;
	memcpy(b->base + off, src, bytes);
	b->used = off + bytes;
	return (int32_t)off;
}

/* Upper bound of the blob bytes of one rotation of dim d. */
static size_t rot_blob_bound(int d)
{
	return 2 * (size_t)d * (size_t)d * sizeof(float) + 2 * 16;
}

static void rot_flatten(const Rotation *r, BlobCursor *b, KvkRot *ret)
{
	size_t d = (size_t)rotation_dim(r);
	*ret = (KvkRot){ .kind = (int)rotation_kind(r), .dim = (int)d, .signs1 = -1, .signs2 = -1,
			 .p = -1, .pt = -1 };
	if (rotation_kind(r) == ROTATION_DENSE) {
		ret->p = blob_put(b, rotation_matrix(r), d * d * sizeof(float));
		ret->pt = blob_put(b, rotation_matrix_t(r), d * d * sizeof(float));
		return;
	}
	ret->signs1 = blob_put(b, rotation_signs_scaled(r), d * sizeof(float));
	if (rotation_signs(r, 2))
		ret->signs2 = blob_put(b, rotation_signs(r, 2), d * sizeof(float));
}

static void codebook_flatten(const Codebook *cb, BlobCursor *b, int32_t *ret_cb, int32_t *ret_bd,
			     int *ret_levels)
{
	*ret_cb = *ret_bd = -1;
	*ret_levels = 0;
	if (!cb)
		return;
	*ret_levels = cb->n_levels;
	*ret_cb = blob_put(b, cb->centroids, (size_t)cb->n_levels * sizeof(float));
	*ret_bd = blob_put(b, cb->boundaries, (size_t)(cb->n_levels - 1) * sizeof(float));
}

static_assert((int)TQ_FLAG_NORM_CORRECT == (int)KVK_FLAG_NORM_CORRECT && (int)TQ_FLAG_QJL == (int)KVK_FLAG_QJL,
	      "kv_kernel.h's flags are tq.h's");
static_assert(ROTATION_HADAMARD == 1 && ROTATION_DENSE == 2, "KvkRot.kind is a RotationKind");

int tq_codec_kernel(const TqCodec *c, KvkCodec *ret, uint8_t **ret_blob)
{
	const TqLayout *L = &c->layout;
	*ret_blob = NULL;
	if (L->dim > KVK_MAX_DIM || L->qjl_m > KVK_MAX_QJL_M)
		return -EINVAL;

	size_t bound = 4 * ((size_t)1 << CODEBOOK_MAX_BITS) * sizeof(float) + 4 * 16;
	for (int g = 0; g < c->n_groups; g++)
		bound += rot_blob_bound(c->groups[g].dim) + (size_t)c->groups[g].dim * 2 + 16;
	if (c->s)
		bound += (size_t)L->qjl_m * (size_t)L->dim * sizeof(float) + 16;
	if (c->s_rot)
		bound += rot_blob_bound(L->dim);
	BlobCursor b = { .base = calloc(1, bound) };
	if (!b.base)
		return -ENOMEM;

	KvkCodec k = {
		.dim = L->dim, .n_hi = L->n_hi, .bits_hi = L->bits_hi, .bits_lo = L->bits_lo,
		.qjl_m = L->qjl_m, .n_scales = L->n_scales,
		.off_scale = { L->off_scale[0], L->off_scale[1] }, .off_gamma = L->off_gamma,
		.off_hi = L->off_hi, .off_lo = L->off_lo, .off_signs = L->off_signs,
		.code_bytes = L->code_bytes,
		.flags = c->desc.flags & (TQ_FLAG_NORM_CORRECT | TQ_FLAG_QJL),
		.n_groups = c->n_groups, .s = -1, .qjl_const = c->qjl_const,
	};
	for (int g = 0; g < c->n_groups; g++) {
		const TqGroup *G = &c->groups[g];
		KvkGroup *kg = &k.groups[g];
		kg->dim = G->dim;
		kg->off = G->off;
		kg->scale = G->scale;
		kg->channels = G->channels ? blob_put(&b, G->channels, (size_t)G->dim * 2) : -1;
		rot_flatten(G->rot, &b, &kg->rot);
	}
	codebook_flatten(c->cb_hi, &b, &k.cb_hi, &k.bd_hi, &k.levels_hi);
	codebook_flatten(c->cb_lo, &b, &k.cb_lo, &k.bd_lo, &k.levels_lo);
	if (c->s)
		k.s = blob_put(&b, c->s, (size_t)L->qjl_m * (size_t)L->dim * sizeof(float));
	if (c->s_rot)
		rot_flatten(c->s_rot, &b, &k.s_rot);
	assert(b.used <= bound);
	k.blob_bytes = (uint32_t)b.used;
	k.blob = b.base;
	*ret = k;
	*ret_blob = b.base;
	return 0;
}
