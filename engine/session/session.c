/*
 * session.c: the session file container of session.h: layout
 * computation, the streaming writer (with its checksums), the atomic
 * save, and the validating reader that restores a KvCache. What the KV
 * records and blocks hold is the cache's business (KvCacheFileOps).
 */
#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "base/crc32c.h"
#include "engine/kv/kvstore.h"
#include "engine/session/session.h"

#define BT KV_BLOCK_TOKENS
#define WRITE_BUF_BYTES (256u << 10)

/* session.h's layout: the header's fields end with its CRC at 60, sections have 16-byte headers. */
static_assert(SESSION_HEADER_BYTES == 64 && SESSION_SECTION_HEADER_BYTES == 16, "session.h's layout");
static_assert(KV_BLOCK_TOKENS == 32, "LAYER sections hold blocks of 32 positions");
static_assert(SESSION_VERSION_KV <= SESSION_VERSION_BLOCKS && SESSION_VERSION_BLOCKS <= SESSION_VERSION,
	      "versions in order");

const char *session_error_name(int code)
{
	switch (code) {
	case 0: return "ok";
	case SESSION_E_TRUNCATED: return "truncated";
	case SESSION_E_MAGIC: return "bad magic";
	case SESSION_E_VERSION: return "unsupported version";
	case SESSION_E_HEADER: return "bad header";
	case SESSION_E_MODEL: return "other model";
	case SESSION_E_KV_TYPE: return "other KV type";
	case SESSION_E_KV_SECTION: return "bad KV section";
	case SESSION_E_TOKENS: return "bad TOKENS section";
	case SESSION_E_MESSAGES: return "bad MESSAGES section";
	case SESSION_E_BLOCKS: return "bad LAYER section";
	case SESSION_E_TOO_LARGE: return "too large";
	default: return "system error";
	}
}

SessionState *session_state_free(SessionState *s)
{
	if (!s)
		return NULL;
	for (size_t i = 0; i < s->n_messages; i++)
		free(s->messages[i].text);
	free(s->messages);
	free(s->tokens);
	kvcache_free(s->kv);
	free(s);
	return NULL;
}

/* Bytes of one record entry of the KV section: tag, length, the record. */
static uint64_t record_entry_bytes(size_t record)
{
	return 8 + (uint64_t)record;
}

/* ---- the writer ---- */

typedef struct Out {
	int fd;
	uint8_t *buf;
	size_t len;
	uint64_t flushed;   /* bytes handed to write() so far */
	uint32_t crc;       /* running CRC of the current section */
	const SessionSaveHooks *hooks;
	bool paused;
	int error;          /* first -errno */
} Out;

static int out_write_all(Out *o, const uint8_t *p, size_t n)
{
	const SessionSaveHooks *h = o->hooks;
	while (n > 0) {
		size_t chunk = n;
		if (h && h->fail_after_bytes) {
			if (o->flushed >= h->fail_after_bytes)
				return -ENOSPC;
			chunk = (size_t)MIN((uint64_t)chunk, h->fail_after_bytes - o->flushed);
		}
		if (h && h->pause_after_bytes && !o->paused) {
			if (o->flushed >= h->pause_after_bytes) {
				struct timespec ts = { h->pause_ms / 1000, (long)(h->pause_ms % 1000) * 1000000 };
				o->paused = true;
				while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
					;
			} else
				chunk = (size_t)MIN((uint64_t)chunk, h->pause_after_bytes - o->flushed);
		}
		ssize_t w = write(o->fd, p, chunk);
		if (w < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		if (w == 0)
			return -EIO;
		p += w;
		n -= (size_t)w;
		o->flushed += (uint64_t)w;
	}
	return 0;
}

static void out_flush(Out *o)
{
	if (o->error || o->len == 0)
		return;
	o->error = out_write_all(o, o->buf, o->len);
	o->len = 0;
}

/* Append n bytes, into the section checksum too when crc is set. */
static void out_put_crc(Out *o, const void *data, size_t n, bool crc)
{
	const uint8_t *p = data;
	if (crc)
		o->crc = crc32c_update(o->crc, data, n);
	while (n > 0 && !o->error) {
		size_t k = MIN(n, WRITE_BUF_BYTES - o->len);
		memcpy(o->buf + o->len, p, k);
		o->len += k;
		p += k;
		n -= k;
		if (o->len == WRITE_BUF_BYTES)
			out_flush(o);
	}
}

static void out_put(Out *o, const void *data, size_t n)
{
	out_put_crc(o, data, n, true);
}

static void out_u32(Out *o, uint32_t v)
{
	uint8_t b[4];
	put_le(b, v, 4);
	out_put(o, b, 4);
}

static void out_u64(Out *o, uint64_t v)
{
	uint8_t b[8];
	put_le(b, v, 8);
	out_put(o, b, 8);
}

static void out_section_begin(Out *o, uint32_t id, uint64_t len)
{
	o->crc = 0;
	out_u32(o, id);
	out_u32(o, 0);
	out_u64(o, len);
}

static void out_section_end(Out *o)
{
	uint8_t b[4];
	put_le(b, o->crc, 4);
	out_put_crc(o, b, 4, false);
}

/* Payload lengths of every section, checked against the caps. */
typedef struct Layout {
	const KvCacheFileOps *file; /* the cache's */
	size_t max_record;     /* bytes of the largest record */
	int n_layers, n_kv_heads, head_dim;
	uint32_t n_kv, n_blocks;
	uint64_t kv_len, tokens_len, messages_len;
	uint64_t *layer_len;   /* (n_layers,) */
	size_t *block_bytes;   /* (n_layers,) */
	uint32_t *first_block; /* (n_layers,) the first block each LAYER section holds */
	uint64_t file_bytes;
} Layout;

static void layout_done(Layout *l)
{
	free(l->layer_len);
	free(l->block_bytes);
	free(l->first_block);
}

static uint64_t section_bytes(uint64_t payload)
{
	return SESSION_SECTION_HEADER_BYTES + payload + 4;
}

static int layout_compute(const SessionState *s, size_t spec_len, Layout *l, Error *err)
{
	const KvCache *kv = s->kv;
	const KvCacheShape *sh = &kv->shape;
	int64_t n_kv = kvcache_n_tokens(kv);

	*l = (Layout){ .file = kvcache_file(kv), .n_layers = sh->n_layers, .n_kv_heads = sh->n_kv_heads,
		       .head_dim = sh->head_dim };
	if (!l->file)
		return error_set(err, -EINVAL, "a %s cache cannot be saved", kv->ops->name);
	if (s->n_tokens > SESSION_MAX_TOKENS || n_kv < 0 || (uint64_t)n_kv > s->n_tokens)
		return error_set(err, -EINVAL, "%zu tokens, %lld in the cache: beyond the format", s->n_tokens,
				 (long long)n_kv);
	if (s->n_messages > SESSION_MAX_MESSAGES || spec_len > KVSPEC_MAX_LEN)
		return error_set(err, -EINVAL, "too many messages or too long a KV spec");
	l->n_kv = (uint32_t)n_kv;
	l->n_blocks = (uint32_t)((n_kv + BT - 1) / BT);
	l->layer_len = calloc_array((size_t)sh->n_layers, sizeof(uint64_t));
	l->block_bytes = calloc_array((size_t)sh->n_layers, sizeof(size_t));
	l->first_block = calloc_array((size_t)sh->n_layers, sizeof(uint32_t));
	if (!l->layer_len || !l->block_bytes || !l->first_block)
		return error_set(err, -ENOMEM, "out of memory");

	l->kv_len = 16 + spec_len;
	for (int i = 0; i < sh->n_layers; i++) {
		l->kv_len += 8; /* the layer's block bytes */
		for (int h = 0; h < sh->n_kv_heads; h++)
			for (int role = 0; role < 2; role++) {
				size_t rec = l->file->record_bytes(kv, i, h, role, n_kv);
				l->kv_len += record_entry_bytes(rec);
				l->max_record = MAX(l->max_record, rec);
			}
		l->block_bytes[i] = l->file->block_bytes(kv, i);
		l->first_block[i] = (uint32_t)MIN((int64_t)l->n_blocks, l->file->first_block(kv, i, n_kv));
		l->layer_len[i] = 16;
		for (int h = 0; h < sh->n_kv_heads; h++)
			for (uint32_t b = l->first_block[i]; b < l->n_blocks; b++)
				l->layer_len[i] += l->file->block_file_bytes(kv, i, h, b, n_kv);
	}
	if (l->kv_len > SESSION_MAX_KV_SECTION)
		return error_set(err, -EINVAL, "a KV section of %llu bytes: beyond the format",
				 (unsigned long long)l->kv_len);
	l->tokens_len = 4 * (uint64_t)s->n_tokens;
	l->messages_len = 8;
	uint64_t text = 0;
	for (size_t i = 0; i < s->n_messages; i++) {
		l->messages_len += 8 + s->messages[i].len;
		text += s->messages[i].len;
	}
	if (text > SESSION_MAX_TEXT_BYTES)
		return error_set(err, -EINVAL, "%llu bytes of messages: beyond the format",
				 (unsigned long long)text);
	l->file_bytes = SESSION_HEADER_BYTES + section_bytes(l->kv_len) + section_bytes(l->tokens_len) +
			section_bytes(l->messages_len);
	for (int i = 0; i < sh->n_layers; i++)
		l->file_bytes += section_bytes(l->layer_len[i]);
	if (l->file_bytes > SESSION_MAX_FILE_BYTES)
		return error_set(err, -EINVAL, "a %llu-byte file: beyond the format",
				 (unsigned long long)l->file_bytes);
	return 0;
}

static void write_header(Out *o, const Layout *l, const SessionState *s, uint64_t fingerprint)
{
	uint8_t h[SESSION_HEADER_BYTES] = { 0 };
	memcpy(h, SESSION_MAGIC, 8);
	put_le(h + 8, SESSION_VERSION, 4);
	put_le(h + 12, SESSION_HEADER_BYTES, 4);
	put_le(h + 16, fingerprint, 8);
	put_le(h + 24, (uint64_t)l->n_layers, 4);
	put_le(h + 28, (uint64_t)l->n_kv_heads, 4);
	put_le(h + 32, (uint64_t)l->head_dim, 4);
	put_le(h + 36, s->n_tokens, 4);
	put_le(h + 40, l->n_kv, 4);
	put_le(h + 44, 3 + (uint64_t)l->n_layers, 4);
	put_le(h + 48, l->file_bytes, 8);
	put_le(h + 56, (uint64_t)s->policy, 4);
	put_le(h + 60, crc32c(h, 60), 4);
	out_put_crc(o, h, sizeof(h), false);
}

static int write_kv_section(Out *o, const Layout *l, const SessionState *s, const char *spec,
			    size_t spec_len, Error *err)
{
	const KvCache *kv = s->kv;
	_cleanup_(freep) uint8_t *rec = malloc(l->max_record ? l->max_record : 1);
	if (!rec)
		return error_set(err, -ENOMEM, "out of memory");
	out_section_begin(o, SESSION_SECTION_KV, l->kv_len);
	out_u32(o, l->file->kind);
	out_u32(o, (uint32_t)spec_len);
	out_u64(o, l->file->seed(kv));
	out_put(o, spec, spec_len);
	for (int i = 0; i < l->n_layers; i++) {
		out_u64(o, l->block_bytes[i]);
		for (int h = 0; h < l->n_kv_heads; h++)
			for (int role = 0; role < 2; role++) {
				size_t n = l->file->record_bytes(kv, i, h, role, l->n_kv);
				int r = l->file->record_save(kv, i, h, role, l->n_kv, rec, err);
				if (r)
					return r;
				out_u32(o, l->file->record_tag(kv, i, h, role));
				out_u32(o, (uint32_t)n);
				out_put(o, rec, n);
			}
	}
	out_section_end(o);
	return 0;
}

static void write_tokens_section(Out *o, const Layout *l, const SessionState *s)
{
	out_section_begin(o, SESSION_SECTION_TOKENS, l->tokens_len);
	for (size_t i = 0; i < s->n_tokens; i++)
		out_u32(o, (uint32_t)s->tokens[i]);
	out_section_end(o);
}

static void write_messages_section(Out *o, const Layout *l, const SessionState *s)
{
	out_section_begin(o, SESSION_SECTION_MESSAGES, l->messages_len);
	out_u32(o, (uint32_t)s->kind);
	out_u32(o, (uint32_t)s->n_messages);
	for (size_t i = 0; i < s->n_messages; i++) {
		uint8_t h[8] = { (uint8_t)s->messages[i].role, s->messages[i].pinned ? 1 : 0, 0, 0 };
		put_le(h + 4, s->messages[i].len, 4);
		out_put(o, h, 8);
		out_put(o, s->messages[i].text, s->messages[i].len);
	}
	out_section_end(o);
}

static int write_layer_section(Out *o, const Layout *l, const SessionState *s, int layer, uint8_t *scratch)
{
	size_t bytes = l->block_bytes[layer];
	out_section_begin(o, SESSION_SECTION_LAYER, l->layer_len[layer]);
	out_u32(o, (uint32_t)layer);
	out_u32(o, l->n_blocks - l->first_block[layer]);
	out_u64(o, bytes);
	for (int h = 0; h < l->n_kv_heads; h++)
		for (uint32_t b = l->first_block[layer]; b < l->n_blocks; b++) {
			size_t n = l->file->block_file_bytes(s->kv, layer, h, b, l->n_kv);
			assert(n <= bytes);
			l->file->block_pack(s->kv, layer, h, b, l->n_kv, scratch);
			out_put(o, scratch, n);
		}
	out_section_end(o);
	return o->error;
}

int session_write_fd(int fd, const SessionState *s, uint64_t fingerprint, const char *kv_spec,
		     const SessionSaveHooks *hooks, uint64_t *ret_bytes, Error *err)
{
	_cleanup_(freep) uint8_t *buf = malloc(WRITE_BUF_BYTES);
	_cleanup_(freep) uint8_t *scratch = NULL;
	size_t spec_len = kv_spec ? strlen(kv_spec) : 0, max_block = 0;
	Layout l;
	int r;

	if (!buf)
		return error_set(err, -ENOMEM, "out of memory");
	if (!s || !s->kv || (s->n_tokens && !s->tokens))
		return error_set(err, -EINVAL, "no session state to write");
	/* A GPU cache is written from its host copy: the file does not say where it was computed. */
	SessionState host_view = *s;
	if ((r = kvcache_host(s->kv, &host_view.kv)) != 0)
		return error_set(err, r, "cannot copy the %s cache to the host", kvcache_device(s->kv));
	s = &host_view;
	for (size_t i = 0; i < spec_len; i++)
		if (kv_spec[i] < 0x20 || kv_spec[i] > 0x7e)
			return error_set(err, -EINVAL, "the KV spec is not printable ASCII");
	if ((r = layout_compute(s, spec_len, &l, err)) != 0) {
		layout_done(&l);
		return r;
	}
	for (int i = 0; i < l.n_layers; i++)
		max_block = MAX(max_block, l.block_bytes[i]);
	if (!(scratch = malloc(max_block ? max_block : 1))) {
		layout_done(&l);
		return error_set(err, -ENOMEM, "out of memory");
	}

	Out o = { .fd = fd, .buf = buf, .hooks = hooks };
	write_header(&o, &l, s, fingerprint);
	r = write_kv_section(&o, &l, s, kv_spec, spec_len, err);
	if (r == 0) {
		write_tokens_section(&o, &l, s);
		write_messages_section(&o, &l, s);
		for (int i = 0; i < l.n_layers && !o.error; i++)
			write_layer_section(&o, &l, s, i, scratch);
		out_flush(&o);
		if (o.error)
			r = error_set(err, o.error, "write failed after %llu bytes: %s",
				      (unsigned long long)o.flushed, strerror(-o.error));
		else if (o.flushed != l.file_bytes)
			r = error_set(err, -EIO, "wrote %llu bytes, expected %llu", (unsigned long long)o.flushed,
				      (unsigned long long)l.file_bytes);
	}
	if (r == 0 && ret_bytes)
		*ret_bytes = l.file_bytes;
	layout_done(&l);
	return r;
}

int session_save_at(int dir_fd, const char *file, const SessionState *s, uint64_t fingerprint,
		    const char *kv_spec, const SessionSaveHooks *hooks, uint64_t *ret_bytes, Error *err)
{
	char tmp[512];
	uint64_t bytes = 0;
	int r;

	if (!file || !file[0] || strchr(file, '/') || snprintf(tmp, sizeof(tmp), "%s.tmp", file) >= (int)sizeof(tmp))
		return error_set(err, -EINVAL, "bad file name");
	/*
	 * A new file, never one found there: O_EXCL | O_NOFOLLOW refuse a
	 * symlink or anything else planted under the temporary name (a FIFO
	 * would block an O_WRONLY open without O_NONBLOCK), so such a thing is
	 * removed and the create tried once more.
	 */
	int flags = O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK;
	int fd = openat(dir_fd, tmp, flags, 0600);
	if (fd < 0 && errno == EEXIST && unlinkat(dir_fd, tmp, 0) == 0)
		fd = openat(dir_fd, tmp, flags, 0600);
	if (fd < 0)
		return error_set(err, -errno, "cannot create %s: %s", tmp, strerror(errno));
	if (fchmod(fd, 0600) < 0)
		r = error_set(err, -errno, "chmod %s: %s", tmp, strerror(errno));
	else
		r = session_write_fd(fd, s, fingerprint, kv_spec, hooks, &bytes, err);
	if (r == 0 && fsync(fd) < 0)
		r = error_set(err, -errno, "fsync %s: %s", tmp, strerror(errno));
	if (close(fd) < 0 && r == 0)
		r = error_set(err, -errno, "close %s: %s", tmp, strerror(errno));
	if (r == 0 && renameat(dir_fd, tmp, dir_fd, file) < 0)
		r = error_set(err, -errno, "rename %s: %s", tmp, strerror(errno));
	if (r != 0) {
		(void)unlinkat(dir_fd, tmp, 0);
		return r;
	}
	if (fsync(dir_fd) < 0)
		return error_set(err, -errno, "fsync of the directory: %s", strerror(errno));
	if (ret_bytes)
		*ret_bytes = bytes;
	return 0;
}

/* ---- the reader ---- */

typedef struct In {
	const uint8_t *p;
	size_t len;
	size_t pos;
} In;

int session_peek(const void *data, size_t len, SessionHeader *ret, Error *err)
{
	const uint8_t *h = data;
	if (memcmp(h, SESSION_MAGIC, MIN(len, 8)) != 0)
		return error_set(err, SESSION_E_MAGIC, "not a session file (bad magic)");
	if (len < SESSION_HEADER_BYTES)
		return error_set(err, SESSION_E_TRUNCATED, "%zu bytes: shorter than the header", len);
	uint32_t version = (uint32_t)get_le(h + 8, 4);
	if (version < SESSION_VERSION_FIRST || version > SESSION_VERSION)
		return error_set(err, SESSION_E_VERSION, "version %u; this build reads versions %u to %u",
				 version, SESSION_VERSION_FIRST, SESSION_VERSION);
	if ((uint32_t)get_le(h + 60, 4) != crc32c(h, 60))
		return error_set(err, SESSION_E_HEADER, "header checksum mismatch");
	SessionHeader r = {
		.version = version,
		.fingerprint = get_le(h + 16, 8),
		.n_layers = (uint32_t)get_le(h + 24, 4),
		.n_kv_heads = (uint32_t)get_le(h + 28, 4),
		.head_dim = (uint32_t)get_le(h + 32, 4),
		.n_tokens = (uint32_t)get_le(h + 36, 4),
		.n_kv = (uint32_t)get_le(h + 40, 4),
		.file_bytes = get_le(h + 48, 8),
	};
	uint32_t hsize = (uint32_t)get_le(h + 12, 4), n_sections = (uint32_t)get_le(h + 44, 4);
	r.policy = (uint32_t)get_le(h + 56, 4);
	if (hsize != SESSION_HEADER_BYTES || r.policy >= _SESSION_POLICY_MAX ||
	    (version < 5 && r.policy != 0))
		return error_set(err, SESSION_E_HEADER, "header size %u or context policy %u not as the format says",
				 hsize, r.policy);
	if (r.n_layers < 1 || r.n_layers > KVSPEC_MAX_LAYERS || r.n_kv_heads < 1 || r.n_kv_heads > 4096 ||
	    r.head_dim < 1 || r.head_dim > TQ_MAX_DIM || n_sections != 3 + r.n_layers)
		return error_set(err, SESSION_E_HEADER, "shape %u layers x %u kv-heads x %u, %u sections: out of range",
				 r.n_layers, r.n_kv_heads, r.head_dim, n_sections);
	if (r.n_tokens > SESSION_MAX_TOKENS || r.n_kv > r.n_tokens)
		return error_set(err, SESSION_E_HEADER, "%u tokens, %u in the cache: out of range", r.n_tokens,
				 r.n_kv);
	if (r.file_bytes < SESSION_HEADER_BYTES || r.file_bytes > SESSION_MAX_FILE_BYTES)
		return error_set(err, SESSION_E_HEADER, "file size %llu out of range",
				 (unsigned long long)r.file_bytes);
	*ret = r;
	return 0;
}

/*
 * Open the next section: it must be there whole, carry id and exactly
 * expect_len payload bytes (any length up to max_len when expect_len is
 * UINT64_MAX), and match its checksum. *ret_payload points at the
 * payload. code is the section's error.
 */
static int in_section(In *in, uint32_t id, uint64_t expect_len, uint64_t max_len, int code,
		      const char *what, const uint8_t **ret_payload, uint64_t *ret_len, Error *err)
{
	if (in->len - in->pos < SESSION_SECTION_HEADER_BYTES)
		return error_set(err, SESSION_E_TRUNCATED, "%s: the file ends at its header", what);
	const uint8_t *h = in->p + in->pos;
	uint64_t len = get_le(h + 8, 8);
	if (get_le(h, 4) != id || get_le(h + 4, 4) != 0)
		return error_set(err, code, "%s: section id %u, expected %u", what, (unsigned)get_le(h, 4), id);
	if (expect_len != UINT64_MAX ? len != expect_len : len > max_len)
		return error_set(err, code, "%s: payload of %llu bytes, expected %llu", what,
				 (unsigned long long)len,
				 (unsigned long long)(expect_len != UINT64_MAX ? expect_len : max_len));
	uint64_t avail = in->len - in->pos - SESSION_SECTION_HEADER_BYTES;
	if (avail < 4 || len > avail - 4)
		return error_set(err, SESSION_E_TRUNCATED, "%s: the file ends inside the section", what);
	uint32_t crc = crc32c(h, SESSION_SECTION_HEADER_BYTES + (size_t)len);
	if ((uint32_t)get_le(h + SESSION_SECTION_HEADER_BYTES + len, 4) != crc)
		return error_set(err, code, "%s: checksum mismatch", what);
	*ret_payload = h + SESSION_SECTION_HEADER_BYTES;
	*ret_len = len;
	in->pos += SESSION_SECTION_HEADER_BYTES + (size_t)len + 4;
	return 0;
}

/*
 * The KV section: kind, spec and seed, then the cache for the plan is
 * built and every record's tag and length must be the ones that cache
 * writes (a file of another KV type otherwise: checksummed, so not
 * damage); *ret_records points at the first record. The records are
 * installed by load_records() once the blocks are in.
 */
static int read_kv(In *in, const SessionHeader *hd, const SessionExpect *e, KvCache **ret_kv,
		   const uint8_t **ret_records, Error *err)
{
	const uint8_t *p;
	uint64_t len;
	int r;

	if ((r = in_section(in, SESSION_SECTION_KV, UINT64_MAX, SESSION_MAX_KV_SECTION,
			    SESSION_E_KV_SECTION, "KV section", &p, &len, err)) != 0)
		return r;
	if (hd->version < SESSION_VERSION_KV)
		return error_set(err, SESSION_E_KV_TYPE,
				 "saved by an older turbokv (session file version %u): the cache is "
				 "laid out as this build no longer reads", hd->version);
	if (len < 16)
		return error_set(err, SESSION_E_KV_SECTION, "KV section: %llu bytes", (unsigned long long)len);
	uint32_t kind = (uint32_t)get_le(p, 4);
	uint64_t spec_len = get_le(p + 4, 4), seed = get_le(p + 8, 8);
	if (spec_len > KVSPEC_MAX_LEN || spec_len > len - 16)
		return error_set(err, SESSION_E_KV_SECTION, "KV section: a spec of %llu bytes",
				 (unsigned long long)spec_len);
	for (uint64_t i = 0; i < spec_len; i++)
		if (p[16 + i] < 0x20 || p[16 + i] > 0x7e)
			return error_set(err, SESSION_E_KV_SECTION, "KV section: the spec is not printable ASCII");
	if (kind > 1)
		return error_set(err, SESSION_E_KV_SECTION, "KV section: cache kind %u", kind);
	if (kind == 0 && seed != 0)
		return error_set(err, SESSION_E_KV_SECTION, "KV section: a seed for the f32 cache");

	_cleanup_(kvcache_freep) KvCache *kv = NULL;
	Error e2 = { 0 };
	r = kvcache_new_host(&e->shape, e->plan, seed, &kv, &e2);
	if (r != 0)
		return r < 0 ? error_set(err, r, "cannot build the cache: %s", e2.msg)
			     : error_set(err, SESSION_E_KV_TYPE, "cannot build the cache: %s", e2.msg);
	const KvCacheFileOps *fo = kvcache_file(kv);
	if (kind != fo->kind)
		return error_set(err, SESSION_E_KV_TYPE, "saved with the %s cache, this daemon uses the %s cache",
				 kind ? "compressed" : "f32", fo->kind ? "compressed" : "f32");
	uint64_t pos = 16 + spec_len;
	for (int i = 0; i < e->shape.n_layers; i++) {
		if (len - pos < 8 || get_le(p + pos, 8) != fo->block_bytes(kv, i))
			return error_set(err, SESSION_E_KV_TYPE, "layer %d: blocks of another KV type", i);
		pos += 8;
		for (int h = 0; h < e->shape.n_kv_heads; h++)
			for (int role = 0; role < 2; role++) {
				uint32_t tag = fo->record_tag(kv, i, h, role);
				uint64_t want = fo->record_bytes(kv, i, h, role, hd->n_kv);
				if (len - pos < 8 || get_le(p + pos, 4) != tag || get_le(p + pos + 4, 4) != want ||
				    want > len - pos - 8)
					return hd->version < SESSION_VERSION_BLOCKS
						? error_set(err, SESSION_E_KV_TYPE,
							    "layer %d head %d %c: saved by an older turbokv (session "
							    "file version %u), whose records of this KV type this build "
							    "no longer reads: the prompt is recomputed", i, h,
							    role ? 'V' : 'K', hd->version)
						: error_set(err, SESSION_E_KV_TYPE,
							    "layer %d head %d %c: saved with another KV type", i, h,
							    role ? 'V' : 'K');
				pos += 8 + want;
			}
	}
	if (pos != len)
		return error_set(err, SESSION_E_KV_SECTION, "KV section: %llu bytes after the last record",
				 (unsigned long long)(len - pos));
	*ret_records = p + 16 + spec_len;
	*ret_kv = TAKE_PTR(kv);
	return 0;
}

/* The records read_kv() checked, into kv, whose blocks are in. */
static int load_records(const uint8_t *p, const SessionHeader *hd, const SessionExpect *e, KvCache *kv,
			Error *err)
{
	const KvCacheFileOps *fo = kvcache_file(kv);
	for (int i = 0; i < e->shape.n_layers; i++) {
		p += 8; /* the layer's block bytes, checked by read_kv() */
		for (int h = 0; h < e->shape.n_kv_heads; h++)
			for (int role = 0; role < 2; role++) {
				uint32_t n = (uint32_t)get_le(p + 4, 4);
				Error e2 = { 0 };
				int r = fo->record_load(kv, i, h, role, hd->n_kv, p + 8, &e2);
				if (r < 0)
					return error_set(err, r, "%s", e2.msg);
				if (r)
					return error_set(err, r == KVCACHE_E_OTHER_TYPE ? SESSION_E_KV_TYPE
											: SESSION_E_KV_SECTION,
							 "KV section: %s", e2.msg);
				p += 8 + n;
			}
	}
	return 0;
}

static int read_tokens(In *in, const SessionHeader *hd, const SessionExpect *e, int32_t **ret, Error *err)
{
	const uint8_t *p;
	uint64_t len;
	int r = in_section(in, SESSION_SECTION_TOKENS, 4 * (uint64_t)hd->n_tokens, 0, SESSION_E_TOKENS,
			   "TOKENS section", &p, &len, err);
	if (r != 0)
		return r;
	int32_t *t = malloc_array(hd->n_tokens ? hd->n_tokens : 1, sizeof(int32_t));
	if (!t)
		return error_set(err, -ENOMEM, "out of memory");
	for (uint32_t i = 0; i < hd->n_tokens; i++) {
		uint32_t id = (uint32_t)get_le(p + 4 * (size_t)i, 4);
		if (id >= (uint32_t)e->n_vocab) {
			free(t);
			return error_set(err, SESSION_E_TOKENS, "token %u: id %u outside the vocabulary of %d", i,
					 id, e->n_vocab);
		}
		t[i] = (int32_t)id;
	}
	*ret = t;
	return 0;
}

static int read_messages(In *in, uint32_t version, SessionState *s, Error *err)
{
	const uint8_t *p;
	uint64_t len;
	int r = in_section(in, SESSION_SECTION_MESSAGES, UINT64_MAX,
			   8 + 8ull * SESSION_MAX_MESSAGES + SESSION_MAX_TEXT_BYTES, SESSION_E_MESSAGES,
			   "MESSAGES section", &p, &len, err);
	if (r != 0)
		return r;
	if (len < 8)
		return error_set(err, SESSION_E_MESSAGES, "MESSAGES section: %llu bytes", (unsigned long long)len);
	uint32_t kind = (uint32_t)get_le(p, 4), n = (uint32_t)get_le(p + 4, 4);
	if (kind > SESSION_KIND_CHAT || n > SESSION_MAX_MESSAGES || (kind == SESSION_KIND_RAW && n != 0))
		return error_set(err, SESSION_E_MESSAGES, "MESSAGES section: kind %u with %u messages", kind, n);
	s->kind = (SessionKind)kind;
	if (!(s->messages = calloc_array(n, sizeof(SessionMessage))))
		return error_set(err, -ENOMEM, "out of memory");
	uint64_t pos = 8, text = 0;
	for (uint32_t i = 0; i < n; i++) {
		if (len - pos < 8)
			return error_set(err, SESSION_E_MESSAGES, "message %u: past the section's end", i);
		const uint8_t *m = p + pos;
		uint64_t mlen = get_le(m + 4, 4);
		if (m[0] > SESSION_ROLE_ASSISTANT || m[1] > (version >= 5 ? 1 : 0) || m[2] || m[3])
			return error_set(err, SESSION_E_MESSAGES, "message %u: role %u, flags %u", i, m[0], m[1]);
		if (mlen > len - pos - 8 || (text += mlen) > SESSION_MAX_TEXT_BYTES)
			return error_set(err, SESSION_E_MESSAGES, "message %u: %llu bytes past the section's end", i,
					 (unsigned long long)mlen);
		if (memchr(m + 8, 0, (size_t)mlen))
			return error_set(err, SESSION_E_MESSAGES, "message %u: a NUL byte", i);
		char *t = malloc((size_t)mlen + 1);
		if (!t)
			return error_set(err, -ENOMEM, "out of memory");
		memcpy(t, m + 8, (size_t)mlen);
		t[mlen] = 0;
		s->messages[i] = (SessionMessage){ .role = (SessionRole)m[0], .pinned = m[1] & 1, .text = t,
						   .len = (size_t)mlen };
		s->n_messages++;
		pos += 8 + mlen;
	}
	if (pos != len)
		return error_set(err, SESSION_E_MESSAGES, "MESSAGES section: %llu bytes after the last message",
				 (unsigned long long)(len - pos));
	return 0;
}

/*
 * Bytes of the LAYER section of layer, holding blocks first.. in a file
 * of hd's version: whole blocks before version 6.
 */
static uint64_t layer_payload(const SessionHeader *hd, const KvCache *kv, int layer, uint32_t first)
{
	const KvCacheFileOps *fo = kvcache_file(kv);
	uint32_t end = (hd->n_kv + BT - 1) / BT;
	if (hd->version < SESSION_VERSION_BLOCKS)
		return 16 + (uint64_t)kv->shape.n_kv_heads * (end - first) * fo->block_bytes(kv, layer);
	uint64_t len = 16;
	for (int h = 0; h < kv->shape.n_kv_heads; h++)
		for (uint32_t b = first; b < end; b++)
			len += fo->block_file_bytes(kv, layer, h, b, hd->n_kv);
	return len;
}

/* A LAYER section into layer of kv. */
static int read_layer(In *in, const SessionHeader *hd, KvCache *kv, int layer, Error *err)
{
	const KvCacheShape *sh = &kv->shape;
	const KvCacheFileOps *fo = kvcache_file(kv);
	size_t bytes = fo->block_bytes(kv, layer);
	uint32_t end = (hd->n_kv + BT - 1) / BT;
	uint32_t first = (uint32_t)MIN((int64_t)end, fo->first_block(kv, layer, hd->n_kv));
	uint32_t n_blocks = end - first; /* a windowed layer's file holds what it still sees */
	uint64_t expect = layer_payload(hd, kv, layer, first);
	bool whole = hd->version < SESSION_VERSION_BLOCKS;
	char what[48];
	const uint8_t *p;
	uint64_t len;

	snprintf(what, sizeof(what), "LAYER section %d", layer);
	int r = in_section(in, SESSION_SECTION_LAYER, expect, 0, SESSION_E_BLOCKS, what, &p, &len, err);
	if (r != 0)
		return r;
	if (get_le(p, 4) != (uint64_t)layer || get_le(p + 4, 4) != n_blocks || get_le(p + 8, 8) != bytes)
		return error_set(err, SESSION_E_BLOCKS, "%s: layer %u, %u blocks of %llu bytes; expected %d, %u of %zu",
				 what, (unsigned)get_le(p, 4), (unsigned)get_le(p + 4, 4),
				 (unsigned long long)get_le(p + 8, 8), layer, n_blocks, bytes);
	p += 16;
	for (int h = 0; h < sh->n_kv_heads; h++)
		for (uint32_t b = first; b < end; b++) {
			r = whole ? fo->block_load(kv, layer, h, b, hd->n_kv, p)
				  : fo->block_unpack(kv, layer, h, b, hd->n_kv, p);
			if (r != 0)
				return error_set(err, r, "cannot restore a block: %s", strerror(-r));
			p += whole ? bytes : fo->block_file_bytes(kv, layer, h, b, hd->n_kv);
		}
	return 0;
}

/* session_read(), or with conversation_only session_read_conversation(). */
static int read_file(const void *data, size_t len, const SessionExpect *e, bool conversation_only,
		     SessionState **ret, Error *err)
{
	SessionHeader hd;
	int r;

	if ((r = session_peek(data, len, &hd, err)) != 0)
		return r;
	if (hd.fingerprint != e->fingerprint)
		return error_set(err, SESSION_E_MODEL, "saved for the model with fingerprint %016llx, this is %016llx",
				 (unsigned long long)hd.fingerprint, (unsigned long long)e->fingerprint);
	if (hd.n_layers != (uint32_t)e->shape.n_layers || hd.n_kv_heads != (uint32_t)e->shape.n_kv_heads ||
	    hd.head_dim != (uint32_t)e->shape.head_dim)
		return error_set(err, SESSION_E_MODEL, "saved for %u layers x %u kv-heads x %u, the model has %d x %d x %d",
				 hd.n_layers, hd.n_kv_heads, hd.head_dim, e->shape.n_layers, e->shape.n_kv_heads,
				 e->shape.head_dim);
	if (!conversation_only && (int64_t)hd.n_kv > e->shape.capacity)
		return error_set(err, SESSION_E_TOO_LARGE, "%u cached tokens, the context holds %lld", hd.n_kv,
				 (long long)e->shape.capacity);
	if (hd.file_bytes != len)
		return error_set(err, hd.file_bytes > len ? SESSION_E_TRUNCATED : SESSION_E_HEADER,
				 "the header says %llu bytes, the file has %zu", (unsigned long long)hd.file_bytes, len);

	_cleanup_(session_state_freep) SessionState *s = calloc(1, sizeof(*s));
	if (!s)
		return error_set(err, -ENOMEM, "out of memory");
	In in = { .p = data, .len = len, .pos = SESSION_HEADER_BYTES };
	const uint8_t *p;
	uint64_t n;
	const uint8_t *records = NULL;
	/* conversation only: the KV and LAYER sections' checksums are checked, nothing else */
	r = conversation_only ? in_section(&in, SESSION_SECTION_KV, UINT64_MAX, SESSION_MAX_KV_SECTION,
					   SESSION_E_KV_SECTION, "KV section", &p, &n, err)
			      : read_kv(&in, &hd, e, &s->kv, &records, err);
	if (r != 0)
		return r;
	if ((r = read_tokens(&in, &hd, e, &s->tokens, err)) != 0)
		return r;
	s->n_tokens = hd.n_tokens;
	if ((r = read_messages(&in, hd.version, s, err)) != 0)
		return r;
	s->policy = (SessionPolicy)hd.policy;
	for (int i = 0; i < e->shape.n_layers; i++) {
		r = conversation_only ? in_section(&in, SESSION_SECTION_LAYER, UINT64_MAX, SESSION_MAX_FILE_BYTES,
						   SESSION_E_BLOCKS, "LAYER section", &p, &n, err)
				      : read_layer(&in, &hd, s->kv, i, err);
		if (r != 0)
			return r;
	}
	if (in.pos != len)
		return error_set(err, SESSION_E_HEADER, "%zu bytes after the last section", len - in.pos);
	if (s->kv && (r = load_records(records, &hd, e, s->kv, err)) != 0)
		return r;
	if (s->kv)
		kvcache_set_n_tokens(s->kv, hd.n_kv);
	*ret = TAKE_PTR(s);
	return 0;
}

int session_read(const void *data, size_t len, const SessionExpect *e, SessionState **ret, Error *err)
{
	return read_file(data, len, e, false, ret, err);
}

int session_read_conversation(const void *data, size_t len, const SessionExpect *e, SessionState **ret,
			      Error *err)
{
	return read_file(data, len, e, true, ret, err);
}

/* Read exactly n bytes at buf from fd; 0, -errno, or SESSION_E_TRUNCATED if the file ends first. */
static int read_full(int fd, uint8_t *buf, size_t n)
{
	size_t got = 0;
	while (got < n) {
		ssize_t k = read(fd, buf + got, n - got);
		if (k < 0 && errno == EINTR)
			continue;
		if (k < 0)
			return -errno;
		if (k == 0)
			return SESSION_E_TRUNCATED;
		got += (size_t)k;
	}
	return 0;
}

static int load_file(int dir_fd, const char *file, const SessionExpect *expect, bool conversation_only,
		     SessionState **ret, Error *err)
{
	struct stat st;
	SessionHeader hd;
	/* O_NONBLOCK: a FIFO planted in place of a file must not stall the caller */
	int fd = openat(dir_fd, file, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY);
	if (fd < 0)
		return error_set(err, -errno, "cannot open %s: %s", file, strerror(errno));
	_cleanup_(closep) int fd_owned = fd;
	if (fstat(fd, &st) < 0)
		return error_set(err, -errno, "%s: %s", file, strerror(errno));
	if (!S_ISREG(st.st_mode))
		return error_set(err, -EINVAL, "%s: not a regular file", file);
	if ((uint64_t)st.st_size > SESSION_MAX_FILE_BYTES || (uint64_t)st.st_size > SIZE_MAX)
		return error_set(err, SESSION_E_TOO_LARGE, "%s: %lld bytes", file, (long long)st.st_size);
	/* the header first: its checks and its size before the body is read */
	size_t size = (size_t)st.st_size;
	uint8_t head[SESSION_HEADER_BYTES];
	int r = read_full(fd, head, MIN(size, sizeof(head)));
	if (r < 0)
		return error_set(err, r, "read %s: %s", file, strerror(-r));
	if (r > 0)
		return error_set(err, SESSION_E_TRUNCATED, "%s: shrank while read", file);
	if ((r = session_peek(head, MIN(size, sizeof(head)), &hd, err)) != 0)
		return r;
	if (hd.file_bytes != size)
		return error_set(err, hd.file_bytes > size ? SESSION_E_TRUNCATED : SESSION_E_HEADER,
				 "%s: the header says %llu bytes, the file has %zu", file,
				 (unsigned long long)hd.file_bytes, size);
	_cleanup_(freep) uint8_t *buf = malloc(size);
	if (!buf)
		return error_set(err, -ENOMEM, "out of memory for a %zu-byte session", size);
	memcpy(buf, head, sizeof(head));
	r = read_full(fd, buf + sizeof(head), size - sizeof(head));
	if (r < 0)
		return error_set(err, r, "read %s: %s", file, strerror(-r));
	if (r) /* shrank under us */
		return error_set(err, SESSION_E_TRUNCATED, "%s: shorter than its header says", file);
	return read_file(buf, size, expect, conversation_only, ret, err);
}

int session_load_at(int dir_fd, const char *file, const SessionExpect *expect, SessionState **ret,
		    Error *err)
{
	return load_file(dir_fd, file, expect, false, ret, err);
}

int session_load_conversation_at(int dir_fd, const char *file, const SessionExpect *expect,
				 SessionState **ret, Error *err)
{
	return load_file(dir_fd, file, expect, true, ret, err);
}
