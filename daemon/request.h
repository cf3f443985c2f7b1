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
 *
 * Context: a prompt that does not fit the context, or (with
 * CONTEXT_POLICY_ERROR and max_tokens > 0) that leaves less than
 * max_tokens of room, is refused with CONTEXT_OVERFLOW before anything
 * runs. Nothing is ever truncated; CONTEXT_POLICY_TRUNCATE_OLDEST is not
 * implemented yet and is refused with BAD_MESSAGE when it would apply.
 */
#pragma once

#include <stdbool.h>
#include <stdint.h>

#include "engine/kvcache.h"
#include "engine/sampler.h"
#include "manager.h"
#include "proto/protocol.h"
#include "stream.h"

typedef enum RequestState {
	REQUEST_QUEUED,   /* waiting for a slot: no KV cache yet */
	REQUEST_PREFILL,  /* evaluating the prompt, a chunk per step */
	REQUEST_DECODE,   /* generating, a token per step */
} RequestState;

struct Request {
	Connection *conn;       /* borrowed: the connection owns the request */
	uint64_t id;
	RequestState state;

	int32_t *tokens;        /* (n_tokens,) prompt, then output */
	size_t n_prompt, n_tokens, cap;
	size_t n_prefilled;
	uint32_t max_tokens;    /* 0: until the context is full */
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
 * One unit of work (a prefill chunk or a token), sending what it
 * produces. Returns 0 if the request goes on, 1 if it has sent its Done
 * or Error and is finished.
 */
int request_step(Request *r, Manager *m);

/*
 * End the request now because of a Cancel (Done(CANCELLED), or
 * Error(CANCELLED) while queued) or shutdown (Error(SHUTTING_DOWN) while
 * queued, Done(CANCELLED) once running).
 */
void request_cancel(Request *r, bool shutting_down);
