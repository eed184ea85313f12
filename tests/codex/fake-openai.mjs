// A fake OpenAI Responses API on 127.0.0.1, enough for the real Codex CLI to run
// whole turns offline. Dependency-free; scriptable from a test.
//
// What it answers (every request is recorded in `fake.requests`):
// * `POST /v1/responses` — always streamed (Codex sends `"stream": true`): SSE
//   `response.created`, `response.output_item.added`, `response.output_text.delta`…,
//   `response.output_item.done`, `response.completed` (with `usage`).
// * `GET /v1/models` — an empty list, so a model refresh finds nothing to change.
// * anything else — 404, logged in `fake.unknown` so a test can tell what Codex
//   tried.
//
// What a /v1/responses call is answered with, first match wins:
// 1. A *side call* (no `tools` offered: a title or a summary; `fake.isSide` may say
//    otherwise) — a short fixed text, never consuming the script.
// 2. The next step queued with `fake.queue(step, …)`, a step being `{ text }`,
//    `{ exec: { cmd, …arguments } }` (an `exec_command` tool call), `{ call: { name,
//    arguments } }` (any function tool: `request_user_input`…), `{ custom: { name,
//    input } }` (a freeform tool: `apply_patch` and its patch), `{ search: { query } }`
//    (Codex's `tool_search`, which finds the tools it defers, MCP servers' among them;
//    a `call` may name the `namespace` it found one in), `{ hold: promise,
//    …step }` (answered when the promise settles: a turn that runs until the test
//    lets it end), `{ error: { status, message } }`, `{ cut: text }` (the answer
//    starts, says `text` and the connection drops before it ends), or a function of the request
//    returning one of these.
// 3. When the input ends in a tool's output — a text naming it: `tool exec_command
//    returned: <output>` (the tool's name as it was called), so a test sees whether
//    the command ran or was declined, and why.
// 4. When the last user text holds a cue `[[exec {json arguments}]]` — an
//    `exec_command` call with those arguments.
// 5. Otherwise `echo: <last user text>`.
//
// The server, the script and the recording are `tests/model-api/fake-api.mjs`'s.

import { FakeApi, event, halves, newId, printRequests, send } from "../model-api/fake-api.mjs";

const CUE = /\[\[exec\s+(\{[\s\S]*?\})\]\]/;

/** The text of a Responses API input item's content (string or parts). */
function textOf(content) {
	if (typeof content === "string") return content;
	if (!Array.isArray(content)) return "";
	return content
		.filter((p) => p?.type === "input_text" || p?.type === "output_text" || p?.type === "text")
		.map((p) => p.text)
		.join("\n");
}

export class FakeOpenAI extends FakeApi {
	constructor() {
		super();
		/** Resolvers of `next()` waiters, called with each new turn request. */
		this.waiters = new Set();
		/**
		 * Whether a request is Codex's own (a title, a summary) rather than a turn's. The
		 * models of Codex's catalogue other than the configured one are sent no `tools`
		 * (0.171), so a test that switches to one says which requests are side calls.
		 */
		this.isSide = (record) => record.tools.length === 0;
	}

	static async start() {
		const fake = await new FakeOpenAI().listen();
		fake.url = fake.origin;
		return fake;
	}

	errorBody(message) {
		return JSON.stringify({ error: { message } });
	}

	/** Tool-offering `/v1/responses` requests, in order. */
	get turns() {
		return this.requests.filter((r) => r.kind === "turn");
	}

	async route(record, res) {
		const { method, path } = record;
		if (method === "POST" && path === "/v1/responses") return this.responses(record, res);
		if (method === "GET" && path === "/v1/models") {
			record.kind = "models";
			return send(res, 200, "application/json", JSON.stringify({ data: [], object: "list" }));
		}
		return this.notFound(record, res);
	}

	async responses(record, res) {
		const body = record.body ?? {};
		const input = Array.isArray(body.input) ? body.input : [];
		const tools = Array.isArray(body.tools) ? body.tools : [];
		record.tools = tools.map((t) => t.name ?? t.type);
		const lastUser = input.findLast((i) => i?.role === "user");
		record.lastUserText = lastUser ? textOf(lastUser.content) : "";
		const last = input.at(-1);
		record.toolOutput = last?.type === "function_call_output" || last?.type === "custom_tool_call_output" ? last : undefined;
		/** The name the answered call had. */
		record.toolName = input.find((i) => (i?.type === "function_call" || i?.type === "custom_tool_call") && i.call_id === last?.call_id)?.name;
		record.kind = this.isSide(record) ? "side" : "turn";
		if (record.kind === "turn") for (const waiter of this.waiters) waiter(record);

		// A side call never consumes the script.
		const step = record.kind === "side" ? { text: "Fake title" } : (this.takeStep(record) ?? unscripted(record));
		if (step.hold) {
			const held = step.hold;
			// A request that waits may be given up by Codex (an interrupt): then
			// nothing is written.
			await held.catch(() => {});
			if (res.destroyed || res.writableEnded) return;
		}
		record.answer = step;
		if (step.error) {
			const { status = 500, message = "fake error" } = step.error;
			return send(res, status, "application/json", JSON.stringify({ error: { message, type: "server_error" } }));
		}
		if (step.cut !== undefined) {
			// The answer starts, then the connection drops before it ends.
			res.writeHead(200, { "content-type": "text/event-stream", "cache-control": "no-cache" });
			res.write(sse({ text: step.cut }, body.model ?? "fake", { cut: true }));
			setTimeout(() => res.destroy(), 50);
			return;
		}
		return send(res, 200, "text/event-stream", sse(step, body.model ?? "fake"), { "cache-control": "no-cache" });
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

}

/**
 * The answer when the script has none: what the tool returned, the command
 * a cue asks for, or the prompt echoed.
 */
function unscripted(record) {
	if (record.toolOutput) {
		const output = typeof record.toolOutput.output === "string" ? record.toolOutput.output : JSON.stringify(record.toolOutput.output);
		return { text: `tool ${record.toolName ?? "exec_command"} returned: ${output}` };
	}
	const cue = CUE.exec(record.lastUserText);
	return cue ? { exec: JSON.parse(cue[1]) } : { text: `echo: ${record.lastUserText.trim()}` };
}

/** One step as the server-sent events of a streamed Responses API answer. */
function sse(step, model, { cut = false } = {}) {
	const responseId = newId("resp");
	const events = [];
	const say = (type, data) => events.push(event(type, data));
	const response = (status, output) => ({ id: responseId, object: "response", model, status, output });
	say("response.created", { response: response("in_progress", []) });
	const output = [];
	let index = 0;
	if (step.text !== undefined) {
		const id = newId("msg");
		const item = { type: "message", id, role: "assistant", status: "in_progress", content: [] };
		say("response.output_item.added", { output_index: index, item });
		for (const part of halves(step.text)) {
			if (part) say("response.output_text.delta", { output_index: index, item_id: id, content_index: 0, delta: part });
		}
		if (cut) return events.join("");
		const done = { ...item, status: "completed", content: [{ type: "output_text", text: step.text, annotations: [] }] };
		say("response.output_item.done", { output_index: index, item: done });
		output.push(done);
		index += 1;
	}
	const call = step.exec ? { name: "exec_command", arguments: step.exec } : step.call;
	if (call) {
		const item = {
			type: "function_call",
			id: newId("fc"),
			call_id: newId("call"),
			name: call.name,
			...(call.namespace ? { namespace: call.namespace } : {}),
			arguments: JSON.stringify(call.arguments),
			status: "completed",
		};
		say("response.output_item.added", { output_index: index, item: { ...item, arguments: "" } });
		say("response.output_item.done", { output_index: index, item });
		output.push(item);
		index += 1;
	}
	if (step.search) {
		// Codex's client-run tool search: it answers with a `tool_search_output` item
		// in the next request's input, holding the tools it found.
		const item = { type: "tool_search_call", id: newId("ts"), call_id: newId("call"), execution: "client", arguments: step.search, status: "completed" };
		say("response.output_item.added", { output_index: index, item });
		say("response.output_item.done", { output_index: index, item });
		output.push(item);
		index += 1;
	}
	if (step.custom) {
		const item = { type: "custom_tool_call", id: newId("ctc"), call_id: newId("call"), name: step.custom.name, input: step.custom.input, status: "completed" };
		say("response.output_item.added", { output_index: index, item: { ...item, input: "" } });
		say("response.output_item.done", { output_index: index, item });
		output.push(item);
		index += 1;
	}
	say("response.completed", {
		response: {
			...response("completed", output),
			usage: { input_tokens: 10, input_tokens_details: { cached_tokens: 0 }, output_tokens: 5, output_tokens_details: { reasoning_tokens: 0 }, total_tokens: 15 },
		},
	});
	return events.join("");
}

// `node fake-openai.mjs` runs it alone, printing every request: handy to see what
// a Codex version sends.
if (import.meta.url === `file://${process.argv[1]}`) {
	printRequests(await FakeOpenAI.start(), (record) => ({
		method: record.method,
		url: record.url,
		tools: record.body?.tools?.map((t) => t.name ?? t.type),
		input: record.body?.input?.slice(-2),
	}));
}
