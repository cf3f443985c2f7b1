/*
 * request.h: one Generate, from its frame to its Done.
 *
 * Owns the prompt's token ids (and the output appended to them), the
 * request's KvCache and Sampler once it is active, its TextStream and its
 * timings. The connection creates it; the scheduler steps it.
 *
 * The prompt: a Chat is rendered with the model's chat template (which
 * adds the template's default system prompt when there is no system
 * message); a raw prompt is tokenized as is (special tokens not parsed).
 * A BOS token goes first when the tokenizer wants one.
 *
 * Attachments: each attachment's text is placed, in order, before the
 * content of the request's last user message (or, for a raw prompt,
 * before the prompt), as
 *
 *   <attachment name="NAME">\n
 *   TEXT\n
 *   </attachment>\n\n
 *
 * so the model reads the documents and then the question about them. A
 * chat without a user message gets one holding just the attachments.
 * NAME is escaped as in XML: & " < > as &amp; &quot; &lt; &gt;, control
 * characters (tab, newline...) as &#N;, so a name can neither close the
 * tag nor fake the end of the document. Attachment texts and prompts
 * holding U+0000 are refused (ATTACHMENT_NOT_UTF8, BAD_MESSAGE), never
 * cut short.
 *
 * Answers: a request without max_tokens gets the daemon's --answer-tokens
 * (1024); an answer that reaches its limit or the end of the context ends
 * with FINISH_REASON_LENGTH (CONTEXT_FULL with STOP_AT_LIMIT), and its
 * session keeps it and goes on.
 *
 * Context: the policy is the request's (when it gives one:
 * context_policy_set, or a policy other than ERROR), else the one its
 * session stored, else --on-overflow. A prompt that leaves no room for an
 * answer token, or (CONTEXT_POLICY_ERROR) an explicit max_tokens beyond
 * the room, is refused with CONTEXT_OVERFLOW before anything runs,
 * nothing dropped, the message saying how to go on. With
 * CONTEXT_POLICY_TRUNCATE_OLDEST a session drops whole oldest turns (a
 * user message and the answers after it; never a system message, never a
 * pinned turn, one that held attachments, never the new turns), a raw
 * session its oldest tokens after BOS, until the prompt leaves
 * min(max_tokens, context / 2) tokens for the answer; the kept prompt is
 * prefilled again past the common prefix, Done.dropped_tokens counts what
 * went, and the session forgets the dropped turns. A chat without a
 * session (a stateless client sending its whole history) drops the same
 * way from its own messages: whole oldest turns, never a system message,
 * never the last user message or what follows it; a raw prompt without a
 * session has no turns and is refused.
 *
 * Sessions: a Generate naming a session continues it. A chat session
 * keeps its messages (the assistant's answers as generated text): the
 * prompt is the template's rendering of those plus the request's new
 * turns; a raw session's prompt is its token ids so far plus the new
 * text's. The session's KV cache is reused for the longest common token
 * prefix of what it holds and the new prompt (never all of it: the last
 * prompt token is always evaluated, for its logits), rewound there with
 * kvcache_set_n_tokens(), and only the rest is prefilled
 * (Done.cached_tokens). When the request ends, however it ends once it
 * has run, its cache, token ids, turns and answer go back to the session.
 */
#pragma once

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "daemon/manager.h"
#include "daemon/stream.h"
#include "engine/kv/kvcache.h"
#include "engine/model/sampler.h"
#include "proto/protocol.h"

typedef enum RequestState {
	REQUEST_QUEUED,   /* waiting for a slot: no KV cache yet */
	REQUEST_PREFILL,  /* evaluating the prompt, a chunk per step */
	REQUEST_DECODE,   /* generating, a token per batched decode round */
} RequestState;

struct Request {
	Manager *manager;       /* borrowed */
	Connection *conn;       /* borrowed: the connection owns the request; NULL once orphaned */
	uint64_t id;
	uid_t uid;              /* the caller's (SO_PEERCRED): sessions and prefix caches are its own */
	RequestState state;
	bool in_job;            /* the worker is evaluating it: the loop leaves kv, logits, tokens alone */
	bool orphaned;          /* left its connection during a job; the scheduler frees it after (scheduler.h) */

	int32_t *tokens;        /* (n_tokens,) prompt, then output */
	size_t n_prompt, n_tokens, cap;
	size_t n_prefilled;
	uint32_t max_tokens;    /* Generate.max_tokens, else the daemon's --answer-tokens; 0: until the context is full */
	int policy;             /* Turbokv__V1__ContextPolicy in effect (the request's, the session's or the daemon's) */
	int store_policy;       /* SessionPolicy the session keeps after this request (NONE: unchanged) */
	uint32_t n_dropped;     /* prompt tokens dropped by TRUNCATE_OLDEST (Done.dropped_tokens) */
	uint8_t *drop;          /* (n_drop,) non-zero: the session's message i is dropped (TRUNCATE_OLDEST) */
	size_t n_drop;
	uint32_t n_generated;
	SamplerParams sampling;

	KvCache *kv;
	Sampler *sampler;
	float *logits;          /* (n_vocab,) of the last evaluated token */

	uint8_t **stops;        /* (n_stops,) copies of Generate.stop */
	size_t *stop_lens;
	size_t n_stops;
	TextStream stream;

	uint64_t t_received, t_first_token;
	uint64_t prefill_ns, decode_ns;

	/* A named session (sessions.h): acquired at creation, given back by request_free(). */
	struct Session *session;
	size_t n_cached;        /* prompt tokens reused from the session's cache */
	int session_kind;       /* SessionKind of this request's input */
	struct SessionMessage *turns; /* (n_turns,) this request's chat turns, for the session */
	size_t n_turns;
};

/*
 * Build a request from a validated Generate and the descriptors of its
 * frame (consumed: closed whatever happens). Returns 0, a PROTOCOL_E_*
 * code with err saying what to tell the client, or -ENOMEM.
 */
int request_new_consume_fds(Manager *m, Connection *c, const Turbokv__V1__Generate *g, int *fds,
			    size_t n_fds, Request **ret, Error *err);
Request *request_free(Request *r);

/* Get a KV cache and sampler: QUEUED -> PREFILL. Returns 0 or -ENOMEM / engine code. */
int request_activate(Request *r, Manager *m);

/*
 * Stepping, driven by the scheduler. Each returns 0 if the request goes
 * on, 1 if it has sent its Done or Error and is finished.
 *
 * request_prefill_output(): n more prompt tokens were evaluated (on the
 * worker, by model_eval() of r->tokens + r->n_prefilled into r->kv and
 * r->logits) with result k in eval_ns: send Progress; when the prompt is
 * done the request turns DECODE and its first token is sampled and sent
 * in the same call, so time to first token is the prefill and no more.
 *
 * Decode is split around one model_eval_batch() for all decoding
 * requests: request_decode_input() gives the token r needs evaluated
 * (its last one), or finishes r when its cache is full;
 * request_decode_output() samples the next token from that
 * evaluation's logits (n_vocab,) (the sampler may modify them), streams
 * it and checks stop strings and limits; eval_ns is the batch's time.
 * request_decode_fail() ends r because the batch failed with k (an
 * engine code or -errno).
 */
int request_prefill_output(Request *r, Manager *m, size_t n, int k, uint64_t eval_ns);
int request_decode_input(Request *r, int32_t *ret_token);
int request_decode_output(Request *r, Manager *m, float *logits, uint64_t eval_ns);
int request_decode_fail(Request *r, int k);

/*
 * End the request now because of a Cancel (Done(CANCELLED), or
 * Error(CANCELLED) while queued) or shutdown (Error(SHUTTING_DOWN) while
 * queued, Done(CANCELLED) once running).
 */
void request_cancel(Request *r, bool shutting_down);
