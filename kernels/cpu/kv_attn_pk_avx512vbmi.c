/*
 * kv_attn_pk_avx512vbmi.c: kv_attn_pk_scores_avx512vbmi(), the AVX-512
 * pair-coded-key score kernel with its codes unpacked by VBMI byte
 * permutes and multishifts instead of pdep; the same kernel otherwise
 * (one source, kv_attn_pk_avx512.c, compiled with PK5_VBMI set).
 */
#define PK5_VBMI 1
#include "kernels/cpu/kv_attn_pk_avx512.c"
