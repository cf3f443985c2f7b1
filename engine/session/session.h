/*
 * session.h: the session file: one conversation's token ids, its chat
 * messages and its KV cache, saved so that it can be restored bit for bit
 * after a restart.
 *
 * Owns: the container below (header, sections, checksums), the atomic
 * writer and the validating reader, which rebuilds a fresh KvCache (f32
 * or compressed store) from the file. It knows lengths, tags and
 * checksums, never what a KV record means: each cache writes its own
 * blocks and records through kvcache.h's KvCacheFileOps, and in the
 * compressed store each KV format documents its record beside its code
 * (engine/kv/fmt_*.c). Not here: where files live, names, quotas, locking
 * (the daemon's session manager).
 *
 * == File layout (all integers little-endian, no padding) ==
 *
 * Header, SESSION_HEADER_BYTES = 64 bytes:
 *
 *   offset size field
 *   0      8    magic "TKVSESS\0"
 *   8      4    version, SESSION_VERSION = 6. Versions 4 and 5 (5 is 6
 *               with whole blocks in the LAYER sections and the records
 *               "PLN1", "TQD1", "CTR1", "PKY1"; 4 is 5 with bytes 56..59
 *               and the message flags 0) are read whole when their
 *               records are those this build writes (the f32 cache and
 *               the plain formats), else for their conversation only
 *               (SESSION_E_KV_TYPE, "saved by an older turbokv": the
 *               prompt is recomputed); so are versions 1 to 3, whose KV
 *               section the container itself laid out
 *   12     4    header size, 64
 *   16     8    model fingerprint: gguf_fingerprint() of the model
 *   24     4    n_layers
 *   28     4    n_kv_heads
 *   32     4    head_dim
 *   36     4    n_tokens: token ids in the TOKENS section, <= SESSION_MAX_TOKENS
 *   40     4    n_kv: tokens held by the KV cache (the first n_kv of the
 *               token ids, in order), <= n_tokens
 *   44     4    n_sections: 3 + n_layers
 *   48     8    file size in bytes, header included
 *   56     4    context policy the session keeps (SessionPolicy): 0 none
 *               chosen, 1 error, 2 drop oldest turns, 3 stop at the
 *               limit (version 4: 0)
 *   60     4    CRC-32C of bytes 0..59
 *
 * Then n_sections sections in this fixed order: KV, TOKENS, MESSAGES,
 * then one LAYER section per layer (layer 0 first). Each section is
 *
 *   16     section header: u32 id, u32 reserved (0), u64 payload length L
 *   L      payload
 *   4      CRC-32C of the section header and the payload (16 + L bytes)
 *
 * KV (id 1), the cache's type and state:
 *   0      4    kind: KvCacheFileOps.kind, 0 = the exact f32 cache
 *               (kvcache_new_f32), 1 = the compressed store
 *               (kvcache_new_quant)
 *   4      4    spec length S, 0..KVSPEC_MAX_LEN (the --kv text, for
 *               people; printable ASCII)
 *   8      8    cache seed (KvCacheFileOps.seed(); 0 for kind 0)
 *   16     S    spec text, not NUL-terminated
 *   then per layer (n_layers times):
 *          8    block bytes of the layer (those of its LAYER section)
 *          then per kv-head, K then V, one record:
 *          4    tag: four ASCII bytes naming who wrote it ("PLN1" plain,
 *               "TQD2" TurboQuant, "CTR2" centered, "PKY3" pair-coded
 *               keys, "F32 " the f32 cache)
 *          4    length L of the record for n_kv tokens
 *          L    the record, as its format documents it
 *   Block bytes, tags or lengths that are not those the cache built for
 *   the reader's plan writes make a file of another KV type
 *   (SESSION_E_KV_TYPE: the conversation is recomputed); the section is
 *   at most SESSION_MAX_KV_SECTION bytes.
 *
 * TOKENS (id 2): n_tokens x u32 token id, each < the model's vocabulary.
 *
 * MESSAGES (id 3), the conversation as the chat template renders it:
 *   0      4    kind: 0 = raw text (tokens were appended as is, no
 *               messages), 1 = chat
 *   4      4    n_messages, <= SESSION_MAX_MESSAGES (0 for raw)
 *   then per message: u8 role (0 system, 1 user, 2 assistant), u8 flags
 *   (bit 0: pinned, the message holds attachments and is never dropped
 *   to make room; other bits 0; version 4: 0), 2 bytes 0, u32 length,
 *   that many bytes of text (no NUL bytes). The texts
 *   together are at most SESSION_MAX_TEXT_BYTES.
 *
 * LAYER (id 4), the KV rows of one layer:
 *   0      4    layer index (the section's position: 0, 1, ...)
 *   4      4    n_blocks = ceil(n_kv / 32) - first, the blocks held
 *               from block first on: first = KvCacheFileOps.first_block(),
 *               0 except for a sliding-window layer of the compressed
 *               store, which holds only what a query at n_kv still sees
 *               (kvcache_window_first_block(): the block of n_kv - W + 1)
 *   8      8    block bytes: KvCacheFileOps.block_bytes() (the store's
 *               kvstore_block_bytes(); for kind 0 32 * 2 * head_dim * 4)
 *   16     kv-head 0's blocks first .. first + n_blocks - 1, then kv-head
 *          1's, ... Block i (positions 32 i .. 32 i + 31, n = min(32,
 *          n_kv - 32 i) of them below n_kv) as KvCacheFileOps.block_pack()
 *          gives it, block_file_bytes() long: its K region's bytes, then
 *          its V region's. A region is, by default, its first n rows as
 *          kvstore.h lays them out (n * row bytes; kind 0: n f32 K rows,
 *          then n f32 V rows); a format may keep less
 *          (KvFormatOps.region_file_bytes(): pk's block 0 and partial
 *          block take no bytes, their keys are in its record). Rows not
 *          in the file are zeros on load. Lengths follow from the types
 *          and n_kv, never from the file. (Versions 4 and 5: every block
 *          whole, block bytes long, rows >= n_kv zeros.)
 *
 * == Reading ==
 *
 * session_read() trusts nothing: it checks the magic, version and header
 * checksum, then every field against the caller's SessionExpect (the
 * model fingerprint and shape, the KV plan, the vocabulary, the
 * capacity) and the hard caps, every section's id, position, length
 * (computed from the header, never taken on faith) and checksum, before
 * anything is built; then every record's tag and length and each layer's
 * block size must be those of the cache built for the plan, the blocks
 * go in, and each record is handed to its format, which checks it
 * (TurboQuant: the descriptor matches the plan with the stored seed's
 * derived seeds; pk: coded blocks are readable). Each failure has its own
 * code below. A file that passes restores into a fresh cache whose blocks
 * and state equal the saved ones byte for byte: whatever a format keeps
 * exact besides its codes (block 0 of centered keys, pk's stage) it keeps
 * binary16-rounded in memory too, and what it derives (mu, pk's weights)
 * it rebuilds on load the way it computed it.
 *
 * == Writing ==
 *
 * session_save_at() writes "<file>.tmp" in the same directory (mode
 * 0600), fsyncs it, renames it over "<file>" and fsyncs the directory: a
 * crash or a full disk at any point leaves either the old file or the new
 * one, never a mix. The temporary file is removed on failure.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/util.h"
#include "engine/kv/kvcache.h"
#include "engine/kv/kvtype.h"

#define SESSION_MAGIC "TKVSESS"          /* 8 bytes with its NUL */
#define SESSION_VERSION 6u       /* blocks as each format keeps them; compact records */
#define SESSION_VERSION_BLOCKS 6u /* the first whose LAYER sections hold blocks as block_pack() gives them */
#define SESSION_VERSION_KV 4u    /* the oldest whose KV this build reads (KV records written by each format) */
#define SESSION_VERSION_FIRST 1u /* the oldest this build reads (for the conversation) */
#define SESSION_HEADER_BYTES 64u
#define SESSION_SECTION_HEADER_BYTES 16u
#define SESSION_MAX_TOKENS (1u << 24)
#define SESSION_MAX_MESSAGES 65536u
#define SESSION_MAX_TEXT_BYTES (256u << 20)
#define SESSION_MAX_FILE_BYTES (1ull << 34) /* 16 GiB */
#define SESSION_MAX_KV_SECTION (1ull << 30)

enum {
	SESSION_SECTION_KV = 1,
	SESSION_SECTION_TOKENS = 2,
	SESSION_SECTION_MESSAGES = 3,
	SESSION_SECTION_LAYER = 4,
};

/* Module error codes (positive; -errno for system errors). */
enum {
	SESSION_E_TRUNCATED = 1, /* the file ends before its structure does */
	SESSION_E_MAGIC,         /* not a session file */
	SESSION_E_VERSION,       /* a version this build cannot read */
	SESSION_E_HEADER,        /* header checksum, or a header field out of range or inconsistent */
	SESSION_E_MODEL,         /* saved for another model (fingerprint or shape) */
	SESSION_E_KV_TYPE,       /* saved with another KV type or by an older layout (recompute) */
	SESSION_E_KV_SECTION,    /* the KV section: checksum, id, length or content */
	SESSION_E_TOKENS,        /* the TOKENS section: checksum, id, length or a token id */
	SESSION_E_MESSAGES,      /* the MESSAGES section: checksum, id, length or content */
	SESSION_E_BLOCKS,        /* a LAYER section: checksum, id, length or block size */
	SESSION_E_TOO_LARGE,     /* more tokens than the cache holds, or beyond the caps */
};

typedef enum SessionKind {
	SESSION_KIND_RAW = 0,
	SESSION_KIND_CHAT = 1,
} SessionKind;

typedef enum SessionRole {
	SESSION_ROLE_SYSTEM = 0,
	SESSION_ROLE_USER = 1,
	SESSION_ROLE_ASSISTANT = 2,
} SessionRole;

/* The context policy a session keeps (stored; the daemon maps it to the protocol's). */
typedef enum SessionPolicy {
	SESSION_POLICY_NONE = 0,        /* none chosen: the daemon's default */
	SESSION_POLICY_ERROR = 1,
	SESSION_POLICY_DROP_OLDEST = 2,
	SESSION_POLICY_STOP_AT_LIMIT = 3,
	_SESSION_POLICY_MAX,
} SessionPolicy;

typedef struct SessionMessage {
	SessionRole role;
	bool pinned; /* holds attachments: never dropped to make room */
	char *text;  /* NUL-terminated, owned */
	size_t len;
} SessionMessage;

/*
 * A session in memory. The first kvcache_n_tokens(kv) entries of tokens
 * are the ones the cache holds. Owns everything it points to.
 */
typedef struct SessionState {
	SessionKind kind;
	int32_t *tokens;          /* (n_tokens,) */
	size_t n_tokens;
	SessionMessage *messages; /* (n_messages,) */
	size_t n_messages;
	SessionPolicy policy;     /* what the session does when the context is full */
	KvCache *kv;              /* f32 cache or compressed store */
} SessionState;

/* What the reader checks a file against. */
typedef struct SessionExpect {
	uint64_t fingerprint;
	KvCacheShape shape;       /* model shape; capacity = the restored cache's */
	int32_t n_vocab;
	const KvPlan *plan;       /* NULL: the plain f32 cache */
} SessionExpect;

/* Test hooks of the writer (all 0: none). */
typedef struct SessionSaveHooks {
	uint64_t fail_after_bytes;  /* writes fail with -ENOSPC past this many bytes */
	uint64_t pause_after_bytes; /* sleep pause_ms once this many bytes are written */
	unsigned pause_ms;
} SessionSaveHooks;

/* Header fields, for listings (session_peek). */
typedef struct SessionHeader {
	uint32_t version;
	uint64_t fingerprint;
	uint32_t n_layers, n_kv_heads, head_dim;
	uint32_t n_tokens, n_kv;
	uint64_t file_bytes;
	uint32_t policy;          /* SessionPolicy */
} SessionHeader;

SessionState *session_state_free(SessionState *s);
DEFINE_FREEP(SessionState, session_state_free)

/*
 * Write s (fingerprint of its model, kv_spec the --kv text) to fd at its
 * current position. Returns 0, -errno (-ENOSPC...) or -EINVAL (a state
 * the format cannot hold: more than SESSION_MAX_TOKENS tokens, an
 * unchosen outlier mask...), with err set; *ret_bytes (may be NULL) gets
 * the file size.
 */
int session_write_fd(int fd, const SessionState *s, uint64_t fingerprint, const char *kv_spec,
		     const SessionSaveHooks *hooks, uint64_t *ret_bytes, Error *err);

/*
 * Atomically replace file (a name inside dir_fd) with s, as described
 * above. Same returns as session_write_fd(); on failure the old file is
 * untouched and no temporary file is left behind.
 */
int session_save_at(int dir_fd, const char *file, const SessionState *s, uint64_t fingerprint,
		    const char *kv_spec, const SessionSaveHooks *hooks, uint64_t *ret_bytes,
		    Error *err);

/*
 * Validate the len bytes at data and rebuild the session. Returns 0, a
 * SESSION_E_* code, or -ENOMEM, with err naming what was wrong; *ret
 * written only on success. Safe on arbitrary input.
 */
int session_read(const void *data, size_t len, const SessionExpect *expect, SessionState **ret,
		 Error *err);

/* Read file inside dir_fd whole (regular files only) and session_read() it. */
int session_load_at(int dir_fd, const char *file, const SessionExpect *expect, SessionState **ret,
		    Error *err);

/*
 * The conversation of a file whose cache this reader cannot take
 * (session_read() said SESSION_E_KV_TYPE: saved with another KV type):
 * the tokens and messages, checked as session_read() checks them, and no
 * cache (ret->kv NULL), so the prompt is computed again when the
 * conversation goes on. The header must still match the model, and every
 * section's id, length and checksum is verified; the KV and LAYER
 * payloads are not interpreted. Same returns as session_read().
 */
int session_read_conversation(const void *data, size_t len, const SessionExpect *expect,
			      SessionState **ret, Error *err);

/* session_load_at(), then session_read_conversation() of the bytes. */
int session_load_conversation_at(int dir_fd, const char *file, const SessionExpect *expect,
				 SessionState **ret, Error *err);

/*
 * Check a header (magic, version, checksum, field ranges) without reading
 * the rest: for listings. Returns 0, SESSION_E_TRUNCATED, _MAGIC,
 * _VERSION or _HEADER.
 */
int session_peek(const void *data, size_t len, SessionHeader *ret, Error *err);

/* A short name of a SESSION_E_* code ("truncated", "bad magic", ...). */
const char *session_error_name(int code);
