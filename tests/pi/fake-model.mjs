// A fake OpenAI chat-completions server on 127.0.0.1, so the real pi runs whole
// turns (tool calls included) offline. Dependency-free; scriptable from a test.
//
// pi reaches it as a custom provider in models.json with `api: "openai-completions"`
// (docs/models.md in @mariozechner/pi-coding-agent); pi's client is
// @mariozechner/pi-ai dist/providers/openai-completions.js, whose needs this
// mirrors:
// * pi POSTs `{baseUrl}/chat/completions` with `stream: true` and
//   `stream_options: {include_usage: true}` (unless compat.supportsUsageInStreaming
//   is false), `messages` (system, user — string or text/image_url parts —,
//   assistant with `tool_calls`, `tool` with `tool_call_id`) and `tools`
//   (`{type:"function", function:{name, description, parameters}}`).
// * It reads SSE `data:` chunks: `choices[0].delta.content` for text,
//   `choices[0].delta.tool_calls[]` (matched by `index`, then `id`; `function.name`
//   on the first fragment, `function.arguments` concatenated and parsed at the
//   end), `finish_reason` (`stop` → stop, `tool_calls` → toolUse, `length`, others
//   are errors), a `usage` chunk with empty `choices`, and `data: [DONE]`.
//
// What a request is answered with, first match wins:
// 1. The next step queued with `model.queue(step, …)`. A step is
//    `{ text }`, `{ toolCall: { name, arguments, id? } }` (or `toolCalls: [...]`,
//    optionally with `text` too), `{ error: { status, message } }` (an HTTP error;
//    each retry takes the next step, so the harness turns pi's retries off unless a
//    test wants them, as tests/pi/retries.test.mjs does),
//    `{ hang: true, text? }` (streams `text`, then never finishes until the client
//    goes away — for abort tests; the record gets `aborted: true`),
//    `{ text, cut: true, cutAfterMs? }` (streams `text`, then breaks the connection
//    mid-answer, as a proxy does: pi's error is `terminated`),
//    `{ chunks: [...], everyMs }` (streams each chunk of the answer's text
//    `everyMs` apart, then finishes — a model that writes slowly), or a function
//    of the request record returning one of these.
// 2. When the conversation ends in tool results — a text naming each one:
//    `tool <name> returned: <content>`, so a test sees whether the tool ran or was
//    blocked (pi puts the block reason in the result's content), and with what.
// 3. When the last user text holds a cue `[[tool:NAME {json arguments}]]` — a call
//    of tool NAME with those arguments; when it holds `[[hang]]` — the `hang` step
//    with the text `thinking…` (a turn held open for a process the test does not
//    script, such as a launched pi).
// 4. Otherwise `echo: <last user text>`.
//
// Every request is recorded in `model.requests` (parsed body, tool names offered,
// last user text, tool results, image parts); `model.prompts` lists the user texts
// of requests that start a turn (not the follow-ups after tool results).
//
// The server, the script and the recording are `tests/model-api/fake-api.mjs`'s.

import { FakeApi, HANG, halves, newId, send, toolCue } from "../model-api/fake-api.mjs";

/**
 * The answer when the script has none: what the tools returned, the call a
 * cue asks for, a turn held open, or the prompt echoed.
 */
function unscripted(record, messages) {
	if (record.toolResults.length > 0) {
		const names = new Map();
		for (const m of messages) for (const call of m.tool_calls ?? []) names.set(call.id, call.function?.name);
		return {
			text: record.toolResults
				.map((r) => `tool ${names.get(r.toolCallId) ?? r.toolCallId} returned: ${r.content}`)
				.join("\n"),
		};
	}
	const cue = toolCue(record.lastUserText);
	if (cue) return { toolCall: { name: cue.name, arguments: cue.args } };
	if (record.lastUserText.includes(HANG)) return { hang: true, text: "thinking…" };
	return { text: `echo: ${record.lastUserText}` };
}

/** The text parts of an OpenAI message's content, joined. */
function textOf(content) {
	if (typeof content === "string") return content;
	if (!Array.isArray(content)) return "";
	return content
		.filter((p) => p?.type === "text")
		.map((p) => p.text)
		.join("\n");
}

export class FakeModel extends FakeApi {
	constructor() {
		super();
		/** The user text of each request that starts a turn. */
		this.prompts = [];
		/** The OpenAI base URL, `http://127.0.0.1:<port>/v1` (pi appends `/chat/completions`). */
		this.url = "";
	}

	static async start() {
		const model = await new FakeModel().listen();
		model.url = `${model.origin}/v1`;
		return model;
	}

	/** Chat-completion requests, in order. */
	get completions() {
		return this.requests.filter((r) => r.kind === "completion");
	}

	route(record, res) {
		if (record.method === "POST" && record.path.endsWith("/chat/completions")) return this.complete(record, res);
		return this.notFound(record, res);
	}

	errorBody(message) {
		return JSON.stringify({ error: { message, type: "fake_error", code: null } });
	}

	complete(record, res) {
		record.kind = "completion";
		const body = record.body ?? {};
		const messages = Array.isArray(body.messages) ? body.messages : [];
		record.tools = (body.tools ?? []).map((t) => t.function?.name ?? t.name);
		const lastUser = messages.findLast((m) => m.role === "user");
		record.lastUserText = textOf(lastUser?.content);
		// Tool results at the end of the conversation (after the last assistant message).
		const tail = [];
		for (let i = messages.length - 1; i >= 0 && messages[i].role === "tool"; i--) tail.unshift(messages[i]);
		record.toolResults = tail.map((m) => ({ toolCallId: m.tool_call_id, content: textOf(m.content) }));
		record.images = messages.flatMap((m) =>
			Array.isArray(m.content)
				? m.content.filter((p) => p?.type === "image_url").map((p) => ({ role: m.role, url: p.image_url?.url }))
				: [],
		);
		if (record.toolResults.length === 0) this.prompts.push(record.lastUserText);

		const step = this.takeStep(record) ?? unscripted(record, messages);
		record.answer = step;

		if (step.error) {
			const { status = 500, message = "fake error" } = step.error;
			return send(res, status, "application/json", this.errorBody(message));
		}
		const frames = [];
		const frame = (choices, extra = {}) =>
			frames.push(
				`data: ${JSON.stringify({ id: record.id, object: "chat.completion.chunk", created: 0, model: body.model, choices, ...extra })}\n\n`,
			);
		record.id = newId("chatcmpl");
		frame([{ index: 0, delta: { role: "assistant", content: "" }, finish_reason: null }]);
		if (step.text) {
			for (const part of halves(step.text)) {
				if (part) frame([{ index: 0, delta: { content: part }, finish_reason: null }]);
			}
		}
		if (step.hang) return this.hold(record, res, frames.join(""));
		if (step.cut) return this.cut(record, res, frames.join(""), step.cutAfterMs);
		if (step.chunks) return this.trickle(record, res, frames, frame, step);
		const calls = step.toolCalls ?? (step.toolCall ? [step.toolCall] : []);
		calls.forEach((call, index) => {
			const id = call.id ?? newId("call");
			const args = typeof call.arguments === "string" ? call.arguments : JSON.stringify(call.arguments ?? {});
			const [first, rest] = halves(args);
			frame([
				{
					index: 0,
					delta: { tool_calls: [{ index, id, type: "function", function: { name: call.name, arguments: first } }] },
					finish_reason: null,
				},
			]);
			frame([{ index: 0, delta: { tool_calls: [{ index, function: { arguments: rest } }] }, finish_reason: null }]);
		});
		frame([{ index: 0, delta: {}, finish_reason: calls.length > 0 ? "tool_calls" : "stop" }]);
		frame([], { usage: { prompt_tokens: 10, completion_tokens: 5, total_tokens: 15 } });
		frames.push("data: [DONE]\n\n");
		return send(res, 200, "text/event-stream", frames.join(""), { "cache-control": "no-cache" });
	}

	/**
	 * Starts a streamed answer with `text` and breaks the connection mid-body `afterMs`
	 * later, as a proxy or a server that restarts does: the client reads the words,
	 * then a stream that ends without its last chunk (pi: `terminated`).
	 */
	cut(record, res, text, afterMs = 50) {
		res.writeHead(200, { "content-type": "text/event-stream", "cache-control": "no-cache" });
		res.write(text, () => setTimeout(() => res.socket?.destroy(), afterMs));
		record.cut = true;
	}

	/** Streams `step.chunks` one every `step.everyMs`, then ends the answer. */
	trickle(record, res, frames, frame, step) {
		res.writeHead(200, { "content-type": "text/event-stream", "cache-control": "no-cache" });
		res.write(frames.splice(0).join(""));
		const parts = [...step.chunks];
		const next = () => {
			if (res.destroyed) return;
			const part = parts.shift();
			if (part === undefined) {
				frame([{ index: 0, delta: {}, finish_reason: "stop" }]);
				frame([], { usage: { prompt_tokens: 10, completion_tokens: 5, total_tokens: 15 } });
				frames.push("data: [DONE]\n\n");
				res.end(frames.splice(0).join(""));
				return;
			}
			frame([{ index: 0, delta: { content: part }, finish_reason: null }]);
			res.write(frames.splice(0).join(""));
			setTimeout(next, step.everyMs ?? 500);
		};
		setTimeout(next, step.everyMs ?? 500);
	}

	/**
	 * pi's models.json naming this server as provider `fake`, model `echo`.
	 * `input` is the model's input kinds: pi replaces images with a placeholder for
	 * a model without "image" (pi-ai dist/providers/transform-messages.js).
	 */
	/** models.json for pi: provider `fake` with model `echo`, and any `more` model ids. */
	modelsJson({ input = ["text", "image"], more = [] } = {}) {
		return {
			providers: {
				fake: {
					baseUrl: this.url,
					api: "openai-completions",
					apiKey: "fake-key",
					compat: { supportsDeveloperRole: false, supportsReasoningEffort: false },
					models: ["echo", ...more].map((id) => ({
						id,
						reasoning: false,
						input,
						contextWindow: 32000,
						maxTokens: 1000,
						cost: { input: 0, output: 0, cacheRead: 0, cacheWrite: 0 },
					})),
				},
			},
		};
	}
}
