// A fake OpenAI-compatible chat-completions API on 127.0.0.1, enough for the real
// OpenCode to run whole turns offline as a custom provider (`provider.<id>.npm:
// "@ai-sdk/openai-compatible"`, `options.baseURL` this server's `/v1`; see
// `config()`). Dependency-free; scriptable from a test.
//
// What OpenCode 1.18 sends (docs/OPENCODE.md): `POST /v1/chat/completions`, always
// streamed (`stream: true`, `stream_options.include_usage`), `messages` (system,
// user — a string or text/image_url/file parts —, assistant with `tool_calls`,
// `tool` with `tool_call_id`) and `tools` (`{type:"function", function:{name,…}}`).
// A session's first prompt also brings a *side call*: the title, asked without
// tools ("You are a title generator…"). Every request carries `x-session-id`.
//
// What a request is answered with, first match wins:
// 1. A side call (no `tools`) — a short fixed title, never consuming the script.
// 2. The next step queued with `fake.queue(step, …)`, a step being `{ text }`,
//    `{ toolCall: { name, arguments, id? } }` (or `toolCalls: [...]`, with `text`
//    too if wanted), `{ error: { status, message } }` (an HTTP error, a 503 as an
//    overloaded provider sends it), `{ cut: text }` (the stream starts, says `text`
//    and the connection is cut before it ends, as a dropped connection does),
//    `{ hang: text }` (the stream starts and never ends until the client leaves:
//    a turn to interrupt; the record gets `aborted`), `{ hold: promise, …step }`
//    (answered when the promise settles: a turn the test lets end), or a function
//    of the request record returning one of these.
// 3. When the conversation ends in tool results — a text naming each one: `tool
//    <name> returned: <content>`, so a test sees whether the tool ran or was
//    refused, and why.
// 4. When the last user text holds a cue `[[tool:NAME {json}]]` — a call of tool
//    NAME with those arguments; `[[hang]]` — the `hang` step (`thinking…`).
// 5. Otherwise `echo: <last user text>`.
//
// The server, the script and the record are `tests/model-api/fake-api.mjs`'s.

import { FakeApi, HANG, halves, newId, printRequests, send, toolCue } from "../model-api/fake-api.mjs";

/** The text parts of an OpenAI message's content, joined. */
function textOf(content) {
	if (typeof content === "string") return content;
	if (!Array.isArray(content)) return "";
	return content
		.filter((p) => p?.type === "text")
		.map((p) => p.text)
		.join("\n");
}

/** The answer when the script has none (see the header, 3–5). */
function unscripted(record, messages) {
	if (record.toolResults.length > 0) {
		const names = new Map();
		for (const m of messages) for (const call of m.tool_calls ?? []) names.set(call.id, call.function?.name);
		return {
			text: record.toolResults.map((r) => `tool ${names.get(r.toolCallId) ?? r.toolCallId} returned: ${r.content}`).join("\n"),
		};
	}
	const cue = toolCue(record.lastUserText);
	if (cue) return { toolCall: { name: cue.name, arguments: cue.args } };
	if (record.lastUserText.includes(HANG)) return { hang: "thinking…" };
	return { text: `echo: ${record.lastUserText}` };
}

export class FakeOpenAICompatible extends FakeApi {
	constructor() {
		super();
		/** `http://127.0.0.1:<port>/v1`, the provider's `baseURL`. */
		this.url = "";
		/** Resolvers of `next()` waiters, called with each new turn request. */
		this.waiters = new Set();
	}

	static async start() {
		const fake = await new FakeOpenAICompatible().listen();
		fake.url = `${fake.origin}/v1`;
		return fake;
	}

	errorBody(message) {
		return JSON.stringify({ error: { message, type: "server_error", code: null } });
	}

	/** Tool-offering completion requests (a turn's), in order. */
	get turns() {
		return this.requests.filter((r) => r.kind === "turn");
	}

	/** The user texts of the turn requests that start a turn (not the follow-ups after tool results). */
	get prompts() {
		return this.turns.filter((r) => r.toolResults.length === 0).map((r) => r.lastUserText);
	}

	route(record, res) {
		if (record.method === "POST" && record.path === "/v1/chat/completions") return this.complete(record, res);
		if (record.method === "GET" && record.path === "/v1/models") {
			record.kind = "models";
			return send(res, 200, "application/json", JSON.stringify({ object: "list", data: [] }));
		}
		return this.notFound(record, res);
	}

	/** The next turn request that satisfies `test` (one already made counts). */
	next(test = () => true, ms = 30_000) {
		const seen = this.turns.find(test);
		if (seen) return Promise.resolve(seen);
		let waiter;
		const found = new Promise((done) => {
			waiter = (record) => {
				if (test(record)) done(record);
			};
			this.waiters.add(waiter);
		});
		let timer;
		const expired = new Promise((_, reject) => {
			timer = setTimeout(() => reject(new Error(`timed out after ${ms} ms waiting for a model request`)), ms);
		});
		return Promise.race([found, expired]).finally(() => {
			clearTimeout(timer);
			this.waiters.delete(waiter);
		});
	}

	async complete(record, res) {
		const body = record.body ?? {};
		const messages = Array.isArray(body.messages) ? body.messages : [];
		record.tools = (body.tools ?? []).map((t) => t.function?.name ?? t.name);
		record.model = body.model;
		record.sessionId = record.headers["x-session-id"];
		const lastUser = messages.findLast((m) => m.role === "user");
		record.lastUserText = textOf(lastUser?.content);
		const tail = [];
		for (let i = messages.length - 1; i >= 0 && messages[i].role === "tool"; i--) tail.unshift(messages[i]);
		record.toolResults = tail.map((m) => ({ toolCallId: m.tool_call_id, content: textOf(m.content) }));
		record.images = messages.flatMap((m) =>
			Array.isArray(m.content) ? m.content.filter((p) => p?.type === "image_url").map((p) => p.image_url?.url) : [],
		);
		record.kind = record.tools.length === 0 ? "side" : "turn";
		if (record.kind === "turn") for (const waiter of this.waiters) waiter(record);

		let step = record.kind === "side" ? { text: "Fake title" } : (this.takeStep(record) ?? unscripted(record, messages));
		if (step.hold) {
			const held = step.hold;
			await held.catch(() => {});
			if (res.destroyed || res.writableEnded) return;
			step = { ...step, hold: undefined };
		}
		record.answer = step;
		if (step.error) {
			const { status = 500, message = "fake error", retryAfterMs } = step.error;
			const headers = retryAfterMs === undefined ? {} : { "retry-after-ms": String(retryAfterMs) };
			return send(res, status, "application/json", this.errorBody(message), headers);
		}
		const id = newId("chatcmpl");
		const frames = [];
		const frame = (choices, extra = {}) =>
			frames.push(`data: ${JSON.stringify({ id, object: "chat.completion.chunk", created: 0, model: body.model, choices, ...extra })}\n\n`);
		frame([{ index: 0, delta: { role: "assistant", content: "" }, finish_reason: null }]);
		const said = step.text ?? step.cut ?? step.hang;
		for (const part of halves(said ?? "")) if (part) frame([{ index: 0, delta: { content: part }, finish_reason: null }]);
		if (step.hang !== undefined) return this.hold(record, res, frames.join(""));
		if (step.cut !== undefined) {
			// The answer starts, then the connection drops before it ends.
			res.writeHead(200, { "content-type": "text/event-stream", "cache-control": "no-cache" });
			res.write(frames.join(""));
			setTimeout(() => res.destroy(), 50);
			return;
		}
		const calls = step.toolCalls ?? (step.toolCall ? [step.toolCall] : []);
		calls.forEach((call, index) => {
			const args = typeof call.arguments === "string" ? call.arguments : JSON.stringify(call.arguments ?? {});
			const [first, rest] = halves(args);
			const head = { index, id: call.id ?? newId("call"), type: "function", function: { name: call.name, arguments: first } };
			frame([{ index: 0, delta: { tool_calls: [head] }, finish_reason: null }]);
			frame([{ index: 0, delta: { tool_calls: [{ index, function: { arguments: rest } }] }, finish_reason: null }]);
		});
		frame([{ index: 0, delta: {}, finish_reason: calls.length > 0 ? "tool_calls" : "stop" }]);
		frame([], { usage: { prompt_tokens: 10, completion_tokens: 5, total_tokens: 15 } });
		frames.push("data: [DONE]\n\n");
		return send(res, 200, "text/event-stream", frames.join(""), { "cache-control": "no-cache" });
	}

	/**
	 * OpenCode's configuration naming this server as provider `fake` with model
	 * `fake-model` (the default) and any `more` model ids.
	 */
	provider({ more = [] } = {}) {
		const models = Object.fromEntries(
			["fake-model", ...more].map((id) => [id, { name: id === "fake-model" ? "Fake Model" : id, tool_call: true, attachment: true, modalities: { input: ["text", "image"], output: ["text"] } }]),
		);
		return {
			fake: {
				npm: "@ai-sdk/openai-compatible",
				name: "Fake",
				options: { baseURL: this.url, apiKey: "fake-key" },
				models,
			},
		};
	}
}

// `node fake-openai-compatible.mjs` runs it alone, printing every request: handy
// to see what an OpenCode version sends.
if (import.meta.url === `file://${process.argv[1]}`) {
	const fake = await FakeOpenAICompatible.start();
	printRequests(fake, (record) => ({
		method: record.method,
		url: record.url,
		session: record.headers["x-session-id"],
		tools: record.body?.tools?.map((t) => t.function?.name),
		messages: record.body?.messages?.slice(1).map((m) => ({ role: m.role, content: m.content, tool_calls: m.tool_calls, id: m.tool_call_id })),
	}));
}
