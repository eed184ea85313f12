// A fake Anthropic Messages API on 127.0.0.1, enough for the real Claude Code to
// run whole turns offline. Dependency-free; scriptable from a test.
//
// What it answers (every request is recorded in `fake.requests`):
// * `POST /v1/messages` — streaming (SSE: message_start, content_block_start /
//   content_block_delta (text_delta, input_json_delta) / content_block_stop,
//   message_delta with stop_reason, message_stop) when the body says
//   `"stream": true`, else one JSON message.
// * `POST /v1/messages/count_tokens` — `{input_tokens}` (a rough length / 4).
// * `HEAD|GET /` and `/api/hello` — 200, so connectivity probes succeed.
// * anything else — 404 with an Anthropic-style error, and logged in
//   `fake.unknown` so a test can tell what Claude Code tried. That includes proxy
//   requests: pointed at as HTTPS_PROXY, it refuses every CONNECT tunnel.
//
// What a /v1/messages call is answered with, first match wins:
// 1. A *side call* (no `tools` offered: Claude Code's title/summary/topic calls) —
//    a short fixed text, never consuming the script. Tests that need to see
//    them read `fake.requests` (`kind: "side"`).
// 2. The next step queued with `fake.queue(step, …)`, a step being
//    `{ text }`, `{ toolUse: { name, input, id? } }` (or `toolUses: [...]`),
//    `{ error: { status, type, message } }`, or a function of the request
//    returning one of these.
// 3. When the conversation ends in a `tool_result` — a text naming each result:
//    `tool <name> returned: <content>` (`… failed: <content>` when is_error), so a
//    test sees whether the tool ran or was blocked, and why.
// 4. When the last user text holds a cue `[[tool:NAME {json input}]]` — a tool_use
//    of NAME with that input; when it holds `[[hang]]` — a stream that starts a
//    text block, says `thinking…` and never finishes until the client goes away (a
//    turn held open, for `/stop`; the record gets `aborted: true` when it goes).
// 5. Otherwise `echo: <last user text>`.
//
// The server, the script and the recording are `tests/model-api/fake-api.mjs`'s.

import { FakeApi, HANG, event, halves, newId, printRequests, send, toolCue } from "../model-api/fake-api.mjs";

/** The text of a message's content (string or blocks), tool results left out. */
function textOf(content) {
	if (typeof content === "string") return content;
	if (!Array.isArray(content)) return "";
	return content
		.filter((b) => b?.type === "text")
		.map((b) => b.text)
		.join("\n");
}

/**
 * What the user typed: Claude Code adds `<system-reminder>` blocks (git
 * attribution, context) to the user's message; those are not the prompt.
 */
function promptOf(content) {
	return textOf(content)
		.replace(/<system-reminder>[\s\S]*?<\/system-reminder>/g, "")
		.trim();
}

function toolResultText(block) {
	if (typeof block.content === "string") return block.content;
	if (Array.isArray(block.content)) return textOf(block.content);
	return "";
}

export class FakeAnthropic extends FakeApi {
	static async start() {
		const fake = await new FakeAnthropic().listen();
		// As an HTTPS proxy (the harness sets HTTPS_PROXY to this server), it refuses
		// every tunnel: nothing reaches the network, and the attempt is on record.
		fake.server.on("connect", (req, socket) => {
			fake.requests.push({ method: "CONNECT", path: req.url, url: req.url, headers: req.headers, kind: "unknown" });
			fake.unknown.push(`CONNECT ${req.url}`);
			socket.end("HTTP/1.1 403 Forbidden\r\ncontent-length: 0\r\n\r\n");
		});
		fake.url = fake.origin;
		return fake;
	}

	errorBody(message, type = "api_error") {
		return JSON.stringify({ type: "error", error: { type, message } });
	}

	/** Main-loop (tool-offering) `/v1/messages` requests, in order. */
	get turns() {
		return this.requests.filter((r) => r.kind === "turn");
	}

	/** `/v1/messages` requests that offered no tools (titles, summaries, …). */
	get sideCalls() {
		return this.requests.filter((r) => r.kind === "side");
	}

	route(record, res) {
		const { method, path, body } = record;
		if (method === "POST" && path === "/v1/messages/count_tokens") {
			record.kind = "count_tokens";
			const tokens = Math.max(1, Math.ceil(JSON.stringify(body ?? "").length / 4));
			return send(res, 200, "application/json", JSON.stringify({ input_tokens: tokens }));
		}
		if (method === "POST" && path === "/v1/messages") return this.messages(record, res);
		if ((method === "HEAD" || method === "GET") && (path === "/" || path === "/api/hello")) {
			record.kind = "probe";
			return send(res, 200, "application/json", method === "HEAD" ? "" : "{}");
		}
		return this.notFound(record, res);
	}

	messages(record, res) {
		const body = record.body ?? {};
		const messages = Array.isArray(body.messages) ? body.messages : [];
		// The last user message; Claude Code may put a `system`-role message after it.
		const last = messages.findLast((m) => m.role === "user" || m.role === "assistant");
		const tools = Array.isArray(body.tools) ? body.tools : [];
		record.tools = tools.map((t) => t.name);
		record.lastUserText = last?.role === "user" ? promptOf(last.content) : "";
		record.toolResults =
			last?.role === "user" && Array.isArray(last.content)
				? last.content.filter((b) => b?.type === "tool_result")
				: [];
		record.images = messages.flatMap((m) =>
			Array.isArray(m.content) ? m.content.filter((b) => b?.type === "image") : [],
		);
		record.kind = tools.length === 0 ? "side" : "turn";

		// A side call never consumes the script.
		const step =
			record.kind === "side" ? { text: "Fake title" } : (this.takeStep(record) ?? unscripted(record, messages, body));
		record.answer = step;

		if (step.error) {
			const { status = 500, type = "api_error", message = "fake error" } = step.error;
			return send(res, status, "application/json", this.errorBody(message, type));
		}
		if (step.hang) return this.hang(record, res, body);
		const content = [];
		if (step.text !== undefined) content.push({ type: "text", text: step.text });
		for (const use of step.toolUses ?? (step.toolUse ? [step.toolUse] : [])) {
			content.push({ type: "tool_use", id: use.id ?? newId("toolu"), name: use.name, input: use.input ?? {} });
		}
		const stopReason = content.some((b) => b.type === "tool_use") ? "tool_use" : "end_turn";
		const message = {
			id: newId("msg"),
			type: "message",
			role: "assistant",
			model: body.model ?? "fake",
			content,
			stop_reason: stopReason,
			stop_sequence: null,
			usage: { input_tokens: 10, output_tokens: 5, cache_creation_input_tokens: 0, cache_read_input_tokens: 0 },
		};
		if (!body.stream) return send(res, 200, "application/json", JSON.stringify(message));
		return send(res, 200, "text/event-stream", sse(message), { "cache-control": "no-cache" });
	}

	/** Starts a streamed answer, says a word, and holds it open until the client leaves. */
	hang(record, res, body) {
		const message = {
			id: newId("msg"),
			type: "message",
			role: "assistant",
			model: body.model ?? "fake",
			content: [],
			stop_reason: null,
			stop_sequence: null,
			usage: { input_tokens: 10, output_tokens: 1, cache_creation_input_tokens: 0, cache_read_input_tokens: 0 },
		};
		this.hold(
			record,
			res,
			event("message_start", { message }) +
				event("content_block_start", { index: 0, content_block: { type: "text", text: "" } }) +
				event("content_block_delta", { index: 0, delta: { type: "text_delta", text: "thinking…" } }),
		);
	}
}

/**
 * The answer when the script has none: what the tools returned, the call a
 * cue asks for, a turn held open, or the prompt echoed.
 */
function unscripted(record, messages, body) {
	if (record.toolResults.length > 0) {
		const names = new Map();
		for (const m of messages) {
			if (m.role !== "assistant" || !Array.isArray(m.content)) continue;
			for (const b of m.content) if (b.type === "tool_use") names.set(b.id, b.name);
		}
		return {
			text: record.toolResults
				.map(
					(r) =>
						`tool ${names.get(r.tool_use_id) ?? r.tool_use_id} ${r.is_error ? "failed" : "returned"}: ${toolResultText(r)}`,
				)
				.join("\n"),
		};
	}
	const cue = toolCue(record.lastUserText);
	if (cue) return { toolUse: { name: cue.name, input: cue.args } };
	if (record.lastUserText.includes(HANG) && body.stream) return { hang: true };
	return { text: `echo: ${record.lastUserText}` };
}

/** The message as the stream of server-sent events the Messages API sends. */
function sse(message) {
	const events = [];
	const say = (type, data) => events.push(event(type, data));
	say("message_start", {
		message: { ...message, content: [], stop_reason: null, usage: { ...message.usage, output_tokens: 1 } },
	});
	say("ping", {});
	message.content.forEach((block, index) => {
		if (block.type === "text") {
			say("content_block_start", { index, content_block: { type: "text", text: "" } });
			for (const part of halves(block.text)) {
				if (part) say("content_block_delta", { index, delta: { type: "text_delta", text: part } });
			}
		} else {
			say("content_block_start", { index, content_block: { type: "tool_use", id: block.id, name: block.name, input: {} } });
			for (const part of halves(JSON.stringify(block.input))) {
				say("content_block_delta", { index, delta: { type: "input_json_delta", partial_json: part } });
			}
		}
		say("content_block_stop", { index });
	});
	say("message_delta", {
		delta: { stop_reason: message.stop_reason, stop_sequence: null },
		usage: { output_tokens: message.usage.output_tokens },
	});
	say("message_stop", {});
	return events.join("");
}

// `node fake-anthropic.mjs` runs it alone, printing every request: handy to see
// what a Claude Code version sends.
if (import.meta.url === `file://${process.argv[1]}`) {
	printRequests(await FakeAnthropic.start(), (record) => ({ method: record.method, url: record.url, body: record.body }));
}
