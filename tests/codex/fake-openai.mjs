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
//    lets it end), `{ error: { status, message } }`, or a function of the request
//    returning one of these.
// 3. When the input ends in a tool's output — a text naming it: `tool exec_command
//    returned: <output>` (the tool's name as it was called), so a test sees whether
//    the command ran or was declined, and why.
// 4. When the last user text holds a cue `[[exec {json arguments}]]` — an
//    `exec_command` call with those arguments.
// 5. Otherwise `echo: <last user text>`.

import http from "node:http";

const CUE = /\[\[exec\s+(\{[\s\S]*?\})\]\]/;

let nextId = 1;
const newId = (prefix) => `${prefix}_fake${String(nextId++).padStart(6, "0")}`;

/** The text of a Responses API input item's content (string or parts). */
function textOf(content) {
	if (typeof content === "string") return content;
	if (!Array.isArray(content)) return "";
	return content
		.filter((p) => p?.type === "input_text" || p?.type === "output_text" || p?.type === "text")
		.map((p) => p.text)
		.join("\n");
}

export class FakeOpenAI {
	constructor() {
		/** Every request: `{ method, path, body, kind, at (Date.now()), ... }`. */
		this.requests = [];
		/** Requests this fake has no answer for (method + path). */
		this.unknown = [];
		this.steps = [];
		this.server = null;
		this.url = "";
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
		const fake = new FakeOpenAI();
		const server = http.createServer({ noDelay: true }, (req, res) => fake.handle(req, res));
		server.on("connection", (socket) => socket.setNoDelay(true));
		await new Promise((done) => server.listen(0, "127.0.0.1", done));
		fake.server = server;
		fake.url = `http://127.0.0.1:${server.address().port}`;
		return fake;
	}

	/** Queues the answers to the next turn calls, in order. */
	queue(...steps) {
		this.steps.push(...steps);
		return this;
	}

	/** Tool-offering `/v1/responses` requests, in order. */
	get turns() {
		return this.requests.filter((r) => r.kind === "turn");
	}

	handle(req, res) {
		const chunks = [];
		req.on("data", (c) => chunks.push(c));
		req.on("end", () => {
			const raw = Buffer.concat(chunks).toString("utf8");
			let body;
			try {
				body = raw ? JSON.parse(raw) : undefined;
			} catch {
				body = raw;
			}
			const path = req.url.split("?")[0];
			const record = { method: req.method, path, url: req.url, body, at: Date.now() };
			this.requests.push(record);
			Promise.resolve()
				.then(() => this.route(record, res))
				.catch((error) => send(res, 500, "application/json", JSON.stringify({ error: { message: String(error?.stack ?? error) } })));
		});
	}

	async route(record, res) {
		const { method, path } = record;
		if (method === "POST" && path === "/v1/responses") return this.responses(record, res);
		if (method === "GET" && path === "/v1/models") {
			record.kind = "models";
			return send(res, 200, "application/json", JSON.stringify({ data: [], object: "list" }));
		}
		record.kind = "unknown";
		this.unknown.push(`${method} ${record.url}`);
		return send(res, 404, "application/json", JSON.stringify({ error: { message: `fake: no route ${method} ${path}` } }));
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

		let step;
		if (record.kind === "side") {
			step = { text: "Fake title" };
		} else if (this.steps.length > 0) {
			step = this.steps.shift();
			if (typeof step === "function") step = step(record);
		} else if (record.toolOutput) {
			const output = typeof record.toolOutput.output === "string" ? record.toolOutput.output : JSON.stringify(record.toolOutput.output);
			step = { text: `tool ${record.toolName ?? "exec_command"} returned: ${output}` };
		} else {
			const cue = CUE.exec(record.lastUserText);
			step = cue ? { exec: JSON.parse(cue[1]) } : { text: `echo: ${record.lastUserText.trim()}` };
		}
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

	stop() {
		if (!this.server) return Promise.resolve();
		this.server.closeAllConnections();
		return new Promise((done) => this.server.close(() => done()));
	}
}

/** One step as the server-sent events of a streamed Responses API answer. */
function sse(step, model) {
	const responseId = newId("resp");
	const events = [];
	const event = (type, data) => events.push(`event: ${type}\ndata: ${JSON.stringify({ type, ...data })}\n\n`);
	const response = (status, output) => ({ id: responseId, object: "response", model, status, output });
	event("response.created", { response: response("in_progress", []) });
	const output = [];
	let index = 0;
	if (step.text !== undefined) {
		const id = newId("msg");
		const item = { type: "message", id, role: "assistant", status: "in_progress", content: [] };
		event("response.output_item.added", { output_index: index, item });
		// Two deltas, so the client's accumulation is exercised.
		const cut = Math.ceil(step.text.length / 2);
		for (const part of [step.text.slice(0, cut), step.text.slice(cut)]) {
			if (part) event("response.output_text.delta", { output_index: index, item_id: id, content_index: 0, delta: part });
		}
		const done = { ...item, status: "completed", content: [{ type: "output_text", text: step.text, annotations: [] }] };
		event("response.output_item.done", { output_index: index, item: done });
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
		event("response.output_item.added", { output_index: index, item: { ...item, arguments: "" } });
		event("response.output_item.done", { output_index: index, item });
		output.push(item);
		index += 1;
	}
	if (step.search) {
		// Codex's client-run tool search: it answers with a `tool_search_output` item
		// in the next request's input, holding the tools it found.
		const item = { type: "tool_search_call", id: newId("ts"), call_id: newId("call"), execution: "client", arguments: step.search, status: "completed" };
		event("response.output_item.added", { output_index: index, item });
		event("response.output_item.done", { output_index: index, item });
		output.push(item);
		index += 1;
	}
	if (step.custom) {
		const item = { type: "custom_tool_call", id: newId("ctc"), call_id: newId("call"), name: step.custom.name, input: step.custom.input, status: "completed" };
		event("response.output_item.added", { output_index: index, item: { ...item, input: "" } });
		event("response.output_item.done", { output_index: index, item });
		output.push(item);
		index += 1;
	}
	event("response.completed", {
		response: {
			...response("completed", output),
			usage: { input_tokens: 10, input_tokens_details: { cached_tokens: 0 }, output_tokens: 5, output_tokens_details: { reasoning_tokens: 0 }, total_tokens: 15 },
		},
	});
	return events.join("");
}

/** Headers and body in one write. */
function send(res, status, contentType, body, headers = {}) {
	const buffer = Buffer.from(body, "utf8");
	res.writeHead(status, { "content-type": contentType, "content-length": buffer.length, ...headers });
	res.end(buffer);
}

// `node fake-openai.mjs` runs it alone, printing every request: handy to see what
// a Codex version sends.
if (import.meta.url === `file://${process.argv[1]}`) {
	const fake = await FakeOpenAI.start();
	console.log(`listening on ${fake.url}`);
	const push = fake.requests.push.bind(fake.requests);
	fake.requests.push = (record) => {
		console.log(JSON.stringify({ method: record.method, url: record.url, tools: record.body?.tools?.map((t) => t.name ?? t.type), input: record.body?.input?.slice(-2) }));
		return push(record);
	};
}
