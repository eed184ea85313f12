// What the three fake model APIs share (`tests/pi/fake-model.mjs`,
// `tests/claude/fake-anthropic.mjs`, `tests/codex/fake-openai.mjs`): an HTTP
// server on 127.0.0.1 that records every request and answers each with the
// next step of a test's script, and the pieces of the server-sent events they
// stream. Dependency-free, like them.
//
// Latency: Nagle is off and a finished answer goes out with its headers in one
// write (`send`), so a client never waits ~40 ms on a delayed ACK.

import http from "node:http";

/** `[[tool:NAME {json}]]` in a prompt: the model calls tool NAME with that JSON. */
const TOOL_CUE = /\[\[tool:([A-Za-z0-9_.:-]+)\s+(\{[\s\S]*?\})\]\]/;
/** `[[hang]]` in a prompt: the answer starts and never finishes. */
export const HANG = "[[hang]]";

/** The tool call a prompt's cue asks for, `{ name, args }`, or null. */
export function toolCue(text) {
	const cue = TOOL_CUE.exec(text);
	return cue ? { name: cue[1], args: JSON.parse(cue[2]) } : null;
}

let nextId = 1;
/** A fresh id: `<prefix>_fake000001`, … */
export const newId = (prefix) => `${prefix}_fake${String(nextId++).padStart(6, "0")}`;

/** A text in two deltas (the second may be empty), so a client's accumulation is exercised. */
export function halves(text) {
	const cut = Math.ceil(text.length / 2);
	return [text.slice(0, cut), text.slice(cut)];
}

/** One server-sent event whose data names its type too, as Anthropic and OpenAI's Responses API send them. */
export function event(type, data) {
	return `event: ${type}\ndata: ${JSON.stringify({ type, ...data })}\n\n`;
}

/** Headers and body in one write. */
export function send(res, status, contentType, body, headers = {}) {
	const buffer = Buffer.from(body, "utf8");
	res.writeHead(status, { "content-type": contentType, "content-length": buffer.length, ...headers });
	res.end(buffer);
}

/**
 * A fake API: a subclass answers `route(record, res)` (may be async) and says
 * what its errors look like (`errorBody(message, type)`; the type is
 * Anthropic's, the others leave it out). Every request is a record
 * `{ method, path, url, headers, body, at }` in `requests`, in arrival order.
 */
export class FakeApi {
	constructor() {
		/** Every request, in arrival order. */
		this.requests = [];
		/** Requests the fake has no route for (`METHOD url`), to learn what a client wants. */
		this.unknown = [];
		/** The script: the answers to the next requests, in order. */
		this.steps = [];
		this.server = null;
		/** `http://127.0.0.1:<port>`. */
		this.origin = "";
		/** Answers held open until the client leaves ([`hold`]), closed when the fake stops. */
		this.hanging = new Set();
	}

	/** Listens on a free port of 127.0.0.1. */
	async listen() {
		const server = http.createServer({ noDelay: true }, (req, res) => this.handle(req, res));
		server.on("connection", (socket) => socket.setNoDelay(true));
		await new Promise((done) => server.listen(0, "127.0.0.1", done));
		this.server = server;
		this.origin = `http://127.0.0.1:${server.address().port}`;
		return this;
	}

	/** Queues the answers to the next requests, in order. */
	queue(...steps) {
		this.steps.push(...steps);
		return this;
	}

	/** The next step of the script for `record` (a function step is called with it), or undefined. */
	takeStep(record) {
		if (this.steps.length === 0) return undefined;
		const step = this.steps.shift();
		return typeof step === "function" ? step(record) : step;
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
			const record = { method: req.method, path, url: req.url, headers: req.headers, body, at: Date.now() };
			this.requests.push(record);
			Promise.resolve()
				.then(() => this.route(record, res))
				.catch((error) => send(res, 500, "application/json", this.errorBody(String(error?.stack ?? error))));
		});
	}

	/** No route: a 404, and the request on record in `unknown`. */
	notFound(record, res) {
		record.kind = "unknown";
		this.unknown.push(`${record.method} ${record.url}`);
		return send(res, 404, "application/json", this.errorBody(`fake: no route ${record.method} ${record.path}`, "not_found_error"));
	}

	/** Starts a streamed answer with `text` and holds it open until the client leaves (`record.aborted` then). */
	hold(record, res, text) {
		res.writeHead(200, { "content-type": "text/event-stream", "cache-control": "no-cache" });
		res.write(text);
		this.hanging.add(res);
		record.aborted = false;
		res.once("close", () => {
			this.hanging.delete(res);
			record.aborted = true;
		});
	}

	stop() {
		if (!this.server) return Promise.resolve();
		for (const res of this.hanging) res.destroy();
		this.server.closeAllConnections();
		return new Promise((done) => this.server.close(() => done()));
	}
}

/** `node <fake>.mjs` runs a fake alone, printing what `show` makes of every request: handy to see what a client version sends. */
export function printRequests(fake, show) {
	console.log(`listening on ${fake.url}`);
	const push = fake.requests.push.bind(fake.requests);
	fake.requests.push = (record) => {
		console.log(JSON.stringify(show(record)));
		return push(record);
	};
}
