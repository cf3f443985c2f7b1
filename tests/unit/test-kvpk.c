/*
 * test-kvpk.c: pair-coded keys (kvpk.h), against the header's definition
 * written out again here: the scale bytes, the greedy water filling
 * (checked by its optimality condition, not by running it again), each
 * code the nearest centroid, scores equal to the decoded rows' dot
 * products, the check of side data, and the point of the format: on keys
 * and queries whose energy is uneven across pairs, a lower weighted score
 * error than TurboQuant at the same bits, close to what the codebooks'
 * distortion predicts.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine/codec/kvpk.h"
#include "engine/codec/tq.h"
#include "engine/kv/kvtype.h"
#include "tests/unit/testutil.h"

enum { BT = KV_BLOCK_TOKENS, D = 64, P = D / 2 };

static KvPk codec(const char *name)
{
	KvType t;
	ck_assert_int_eq(kvtype_from_name(name, KV_ROLE_K, D, &t, NULL), 0);
	KvPk pk;
	ck_assert_int_eq(kvpk_init(&pk, D, t.code_bits), 0);
	return pk;
}

/* Rows with pair spreads sd[i] (both channels), zero mean. */
static void rows_fill(uint64_t *st, const double *sd, float *x, int n)
{
	for (int t = 0; t < n; t++)
		for (int j = 0; j < D; j++)
			x[t * D + j] = (float)(sd[j / 2] * test_rand_normal(st));
}

static double sigma_of(uint8_t s)
{
	return s ? exp2(((int)s - 128) / 8.0) : 0.0;
}

/* The header's definition, checked on one coded block of rows x (BT, D) and weights w. */
static void check_block(const KvPk *pk, const float *x, const float *w, const uint8_t *blk)
{
	const uint8_t *scales = blk + BT * (pk->rows.code_bits / 8), *nib = scales + P;
	int bits[P], sum = 0;
	double sig[P];
	for (int i = 0; i < P; i++) {
		double e = 0;
		for (int t = 0; t < BT; t++)
			e += pow(x[t * D + 2 * i], 2) + pow(x[t * D + 2 * i + 1], 2);
		double rms = sqrt(e / (2 * BT));
		int want = rms > 0 ? (int)lround(8 * log2(rms)) + 128 : 0;
		want = rms > 0 ? (want < 1 ? 1 : want > 255 ? 255 : want) : 0;
		ck_assert_int_eq(scales[i], want);
		sig[i] = sigma_of(scales[i]);
		bits[i] = (nib[i / 2] >> (4 * (i % 2))) & 15;
		ck_assert_int_le(bits[i], KVPK_MAX_BITS);
		sum += bits[i];
	}
	ck_assert_int_eq(sum, pk->rows.code_bits / 2);
	/* water filling: no bit would do more elsewhere than where it is */
	for (int i = 0; i < P; i++)
		for (int j = 0; j < P; j++) {
			if (bits[i] == 0 || bits[j] == KVPK_MAX_BITS || i == j)
				continue;
			double have = w[i] * sig[i] * sig[i] * (pk->mse[bits[i] - 1] - pk->mse[bits[i]]);
			double other = w[j] * sig[j] * sig[j] * (pk->mse[bits[j]] - pk->mse[bits[j] + 1]);
			ck_assert_msg(have >= other * (1 - 1e-6), "pair %d's bit %d is worth %g, pair %d's next %g",
				      i, bits[i], have, j, other);
		}
	/* each coordinate: the nearest centroid of its pair's codebook, times sigma */
	for (int t = 0; t < BT; t++) {
		float y[D];
		kvpk_decode_row(pk, blk, t, y);
		size_t col = 0; /* bit offset of coordinate j's column */
		for (int j = 0; j < D; j++) {
			int b = bits[j / 2];
			unsigned code = 0;
			for (int k = 0; k < b; k++) {
				size_t bit = col + (size_t)t * b + k;
				code |= (unsigned)(blk[bit / 8] >> (bit % 8) & 1) << k;
			}
			col += (size_t)BT * b;
			if (b > 0 && sig[j / 2] > 0)
				ck_assert_msg(y[j] == (float)(sig[j / 2] * pk->rows.centroids[b][code]) ||
					      fabsf(y[j] - (float)sig[j / 2] * pk->rows.centroids[b][code]) <=
						      1e-6f * fabsf(y[j]),
					      "row %d coord %d: %g, its code %u reads %g", t, j, y[j], code,
					      sig[j / 2] * pk->rows.centroids[b][code]);
			if (b == 0 || sig[j / 2] == 0) {
				ck_assert(y[j] == 0.0f);
				continue;
			}
			double u = x[t * D + j] / sig[j / 2], best = INFINITY;
			for (int c = 0; c < (1 << b); c++)
				best = fmin(best, fabs(u - pk->rows.centroids[b][c]));
			double got = fabs(u - y[j] / sig[j / 2]);
			ck_assert_msg(got <= best + 1e-5, "row %d coord %d: %g from the nearest %g", t, j, got, best);
		}
	}
}

START_TEST(block_follows_definition)
{
	uint64_t st = test_seed();
	const char *names[] = { "pk1", "pk2.5", "pk4", "pk5.125", "pk8" };
	for (size_t n = 0; n < ARRAY_SIZE(names); n++) {
		KvPk pk = codec(names[n]);
		double sd[P];
		float w[P], x[BT * D];
		for (int i = 0; i < P; i++) {
			sd[i] = exp2(6 * test_rand_uniform(&st) - 3);
			w[i] = (float)exp2(8 * test_rand_uniform(&st) - 4);
		}
		sd[3] = 0; /* a pair that is all zero */
		rows_fill(&st, sd, x, BT);
		uint8_t *blk = calloc(BT, pk.row_bytes);
		ck_assert_ptr_nonnull(blk);
		kvpk_encode_block(&pk, x, BT, NULL, w, blk);
		check_block(&pk, x, w, blk);
		ck_assert(kvpk_block_coded(&pk, blk));

		/* scores: the decoded rows' dot products */
		float q[3 * D], scores[3 * BT];
		for (int i = 0; i < 3 * D; i++)
			q[i] = test_rand_normal(&st);
		kv_attn_pk_scores_ref(&pk.rows, blk, q, 3, 20, 0.125f, scores, BT);
		for (int t = 0; t < 20; t++) {
			float y[D];
			kvpk_decode_row(&pk, blk, t, y);
			for (int g = 0; g < 3; g++) {
				double want = 0;
				for (int j = 0; j < D; j++)
					want += (double)q[g * D + j] * y[j];
				want *= 0.125;
				ck_assert_msg(fabs(scores[g * BT + t] - want) <= 1e-4 * (1 + fabs(want)),
					      "%s row %d head %d: %g vs %g", names[n], t, g, scores[g * BT + t], want);
			}
		}

		/* side data that cannot be read */
		uint8_t *nib = blk + BT * (pk.rows.code_bits / 8) + P;
		uint8_t keep = nib[0];
		nib[0] = (uint8_t)((keep & 0xf0) | 9);
		ck_assert(!kvpk_block_coded(&pk, blk));
		nib[0] = (uint8_t)(keep ^ 0x01); /* the widths no longer add up */
		ck_assert(!kvpk_block_coded(&pk, blk));
		memset(blk, 0, BT * pk.row_bytes);
		ck_assert(!kvpk_block_coded(&pk, blk));
		free(blk);
	}
}
END_TEST

/* Fewer rows than a block: the rest read as zero codes, the scales from those rows only. */
START_TEST(short_block)
{
	uint64_t st = test_seed() + 1;
	KvPk pk = codec("pk3");
	double sd[P];
	float w[P], x[BT * D] = { 0 };
	for (int i = 0; i < P; i++) {
		sd[i] = 1.0 + i;
		w[i] = 1.0f;
	}
	rows_fill(&st, sd, x, 7);
	uint8_t *blk = calloc(BT, pk.row_bytes), *whole = calloc(BT, pk.row_bytes);
	ck_assert(blk && whole);
	kvpk_encode_block(&pk, x, 7, NULL, w, blk);
	const uint8_t *scales = blk + BT * (pk.rows.code_bits / 8);
	for (int i = 0; i < P; i++) {
		double e = 0;
		for (int t = 0; t < 7; t++)
			e += pow(x[t * D + 2 * i], 2) + pow(x[t * D + 2 * i + 1], 2);
		ck_assert_int_eq(scales[i], (int)lround(8 * log2(sqrt(e / 14))) + 128);
	}
	/* columns of 32 codes; rows 7.. all zero bits */
	const uint8_t *nib = scales + P, *col = blk;
	for (int j = 0; j < D; j++) {
		int b = (nib[j / 4] >> (4 * (j / 2 % 2))) & 15;
		for (int bit = 7 * b; bit < BT * b; bit++)
			ck_assert_msg(!(col[bit / 8] >> (bit % 8) & 1), "coordinate %d, bit %d", j, bit);
		col += 4 * b;
	}
	free(blk);
	free(whole);
}
END_TEST

/*
 * The reason for the format. Keys whose pair spreads span 2^6 and queries
 * whose pair energies span 2^8 (real models are more uneven): the mean
 * squared score error <q, k - k~>^2 of pk4 against tq4_nc at the same code
 * bits (tq4 pays 0.25 bits for its norm, pk4 as much for its side data).
 * Theory for pk: per pair 2 w_i sigma_i^2 D(b_i) (D the normal codebook's
 * MSE per coordinate), for independent coordinates and queries.
 */
START_TEST(beats_tq_on_uneven_pairs)
{
	uint64_t st = test_seed() + 2;
	enum { BLOCKS = 64 };
	KvPk pk = codec("pk4");
	double sd[P], qsd[P];
	float w[P];
	for (int i = 0; i < P; i++) {
		sd[i] = exp2(6.0 * i / (P - 1) - 3);
		qsd[i] = exp2(4.0 * ((i * 7) % P) / (P - 1) - 2);
		w[i] = (float)(2 * qsd[i] * qsd[i]);
	}
	KvType t;
	ck_assert_int_eq(kvtype_from_name("tq4_nc", KV_ROLE_K, D, &t, NULL), 0);
	TqCodec *tq = NULL;
	ck_assert_int_eq(tq_codec_new(&t.tq, &tq, NULL), 0);
	uint8_t *blk = calloc(BT, pk.row_bytes), code[TQ_MAX_CODE_BYTES];
	float x[BT * D], y[D];
	ck_assert_ptr_nonnull(blk);
	double err_pk = 0, err_tq = 0, theory = 0;
	for (int b = 0; b < BLOCKS; b++) {
		rows_fill(&st, sd, x, BT);
		kvpk_encode_block(&pk, x, BT, NULL, w, blk);
		const uint8_t *scales = blk + BT * (pk.rows.code_bits / 8), *nib = scales + P;
		for (int i = 0; i < P; i++)
			theory += 2 * BT * w[i] * pow(sigma_of(scales[i]), 2) * pk.mse[(nib[i / 2] >> (4 * (i % 2))) & 15];
		for (int r = 0; r < BT; r++) {
			/* E<q, e>^2 over independent query coordinates = sum_j E[q_j^2] e_j^2 */
			kvpk_decode_row(&pk, blk, r, y);
			for (int j = 0; j < D; j++)
				err_pk += w[j / 2] / 2 * pow(x[r * D + j] - y[j], 2);
			tq_encode(tq, x + r * D, code);
			tq_decode(tq, code, y);
			for (int j = 0; j < D; j++)
				err_tq += w[j / 2] / 2 * pow(x[r * D + j] - y[j], 2);
		}
	}
	fprintf(stderr, "weighted score error, 4.25 bits: pk4 %.4g (theory %.4g), tq4_nc %.4g: %.2f bits better\n",
		err_pk, theory / 2, err_tq, 0.5 * log2(err_tq / err_pk));
	ck_assert_msg(err_pk < 0.25 * err_tq, "pk4 %g, tq4_nc %g", err_pk, err_tq);
	ck_assert_msg(fabs(err_pk / (theory / 2) - 1) < 0.2, "pk4 %g, theory %g", err_pk, theory / 2);
	tq_codec_free(tq);
	free(blk);
}
END_TEST

static Suite *kvpk_suite(void)
{
	Suite *s = suite_create("kvpk");
	TCase *tc = tcase_create("core");
	tcase_add_test(tc, block_follows_definition);
	tcase_add_test(tc, short_block);
	tcase_add_test(tc, beats_tq_on_uneven_pairs);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	return test_run_suite(kvpk_suite());
}
