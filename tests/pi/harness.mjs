// The world an end-to-end test runs in: the fake Telegram Bot API, a fake model
// server, and real pi processes in RPC mode with scripts/pi-extension.ts loaded.
// Every wait has a deadline; everything spawned is killed when the test ends,
// pass or fail.

import { spawn } from "node:child_process";
import { existsSync, readFileSync, readlinkSync, readdirSync } from "node:fs";
import { mkdir, mkdtemp, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { basename, dirname, join, resolve } from "node:path";
import { StringDecoder } from "node:string_decoder";
import { fileURLToPath } from "node:url";
import { FakeModel } from "./fake-model.mjs";

export { FakeModel };

const here = dirname(fileURLToPath(import.meta.url));
export const REPO = resolve(here, "..", "..");
export const EXTENSION = join(REPO, "scripts", "pi-extension.ts");
const PI_CLI = join(here, "node_modules", "@mariozechner", "pi-coding-agent", "dist", "cli.js");
const SIDECAR = process.env.AGENT_RELAY_BIN || join(REPO, "target", "debug", "agent-relay");
const FAKE_BOT_API = process.env.FAKE_BOT_API_BIN || join(REPO, "target", "debug", "fake-bot-api");

/** A question still open: it has a button one may tap. */
export function isOpen(message) {
	return (message.reply_markup?.inline_keyboard ?? []).flat().some((b) => b.callback_data && !b.disabled);
}

/** A question settled: its buttons gave way to one disabled button saying how it ended. */
export function isSettled(message) {
	const buttons = (message.reply_markup?.inline_keyboard ?? []).flat();
	return buttons.length === 1 && Boolean(buttons[0].disabled) && !buttons[0].callback_data;
}

/** The fake's default world: a forum supergroup where the bot may manage topics. */
export const CHAT_ID = -1001000000001;
export const USER_ID = 1001;

const STARTUP_MS = 20_000;
const EXIT_MS = 10_000;

export function stripAnsi(text) {
	// biome-ignore lint/suspicious/noControlCharactersInRegex: ANSI escapes are what we strip
	return String(text ?? "").replace(/\x1b\[[0-9;]*m/g, "");
}

/** Resolves with `promise`, or rejects naming `what` once `ms` have passed. */
export function deadline(promise, ms, what) {
	let timer;
	const expired = new Promise((_, reject) => {
		timer = setTimeout(() => reject(new Error(`timed out after ${ms} ms waiting for ${what}`)), ms);
	});
	return Promise.race([promise, expired]).finally(() => clearTimeout(timer));
}

/** Polls `check` until it returns a truthy value; for state that has no event to await. */
export async function eventually(check, ms, what) {
	const until = Date.now() + ms;
	for (;;) {
		const value = await check();
		if (value) return value;
		if (Date.now() > until) throw new Error(`timed out after ${ms} ms waiting for ${what}`);
		await new Promise((r) => setTimeout(r, 50));
	}
}

/** Splits a byte stream into lines on `\n` only, as pi's RPC framing demands. */
function onLines(stream, handle) {
	const decoder = new StringDecoder("utf8");
	let buffer = "";
	stream.on("data", (chunk) => {
		buffer += decoder.write(chunk);
		for (let nl = buffer.indexOf("\n"); nl !== -1; nl = buffer.indexOf("\n")) {
			const line = buffer.slice(0, nl);
			buffer = buffer.slice(nl + 1);
			handle(line.endsWith("\r") ? line.slice(0, -1) : line);
		}
	});
}

function waitExit(child, ms) {
	if (child.exitCode !== null || child.signalCode !== null) return Promise.resolve(true);
	return new Promise((done) => {
		const timer = setTimeout(() => done(false), ms);
		child.once("exit", () => {
			clearTimeout(timer);
			done(true);
		});
	});
}

/** Whether a process still runs (a zombie has already ended; it only waits to be reaped). */
export function isRunning(pid) {
	try {
		const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
		const state = stat.slice(stat.lastIndexOf(")") + 2).split(" ")[0];
		return state !== "Z" && state !== "X";
	} catch {
		return false;
	}
}

/** Live `agent-relay` processes whose parent is `parentPid`. */
export function sidecarsOf(parentPid) {
	const found = [];
	for (const entry of readdirSync("/proc")) {
		if (!/^\d+$/.test(entry)) continue;
		try {
			const stat = readFileSync(`/proc/${entry}/stat`, "utf8");
			const ppid = Number(stat.slice(stat.lastIndexOf(")") + 2).split(" ")[1]);
			if (ppid !== parentPid) continue;
			if (basename(readlinkSync(`/proc/${entry}/exe`)) !== basename(SIDECAR)) continue;
			if (isRunning(Number(entry))) found.push(Number(entry));
		} catch {
			// the process ended while we looked
		}
	}
	return found;
}

// ------------------------------------------------------------------- fake Bot API

/** The question with buttons in the topic whose text contains `needle`. */
export function question(world, threadId, needle) {
	return eventually(
		async () =>
			(await world.bot.messages(threadId)).find((m) => (m.reply_markup?.inline_keyboard ?? []).flat().some((b) => b.callback_data) && m.plain_text.includes(needle)),
		30_000,
		`a question about ${needle}`,
	);
}

/** The callback data of the button whose label contains `label`. */
export function button(message, label) {
	for (const row of message.reply_markup.inline_keyboard) {
		for (const b of row) if (b.text.includes(label)) return b.callback_data;
	}
	throw new Error(`no button ${label} in ${JSON.stringify(message.reply_markup)}`);
}

/** How the bot answered the tap `id`. */
export function tapAnswer(world, id) {
	return eventually(
		async () => (await world.bot.callbackQueries()).find((q) => q.callback_query_id === id)?.answer,
		15_000,
		`the answer to tap ${id}`,
	);
}

export class FakeBotApi {
	constructor(child, url, token) {
		this.child = child;
		this.url = url;
		this.token = token;
	}

	static async start() {
		for (const binary of [FAKE_BOT_API, SIDECAR]) {
			if (!existsSync(binary)) throw new Error(`${binary} is missing: run \`cargo build --bins\` first`);
		}
		const child = spawn(FAKE_BOT_API, [], { stdio: ["ignore", "pipe", "pipe"] });
		let stderr = "";
		child.stderr.on("data", (c) => {
			stderr += c;
		});
		const banner = new Promise((done, fail) => {
			onLines(child.stdout, (line) => {
				const m = /listening on (http:\/\/\S+) token=(\S+)/.exec(line);
				if (m) done({ url: m[1], token: m[2] });
			});
			child.once("exit", (code) => fail(new Error(`fake-bot-api exited (${code}): ${stderr}`)));
		});
		try {
			const { url, token } = await deadline(banner, STARTUP_MS, "fake-bot-api to listen");
			return new FakeBotApi(child, url, token);
		} catch (error) {
			child.kill("SIGKILL");
			throw error;
		}
	}

	async control(method, route, body) {
		const response = await deadline(
			fetch(`${this.url}/control/${route}`, {
				method,
				headers: body ? { "content-type": "application/json" } : undefined,
				body: body ? JSON.stringify(body) : undefined,
			}),
			10_000,
			`control ${route}`,
		);
		const text = await response.text();
		if (!response.ok) throw new Error(`control ${route}: HTTP ${response.status} ${text}`);
		return JSON.parse(text);
	}

	topics() {
		return this.control("GET", `topics?chat_id=${CHAT_ID}`);
	}

	calls() {
		return this.control("GET", "calls");
	}

	/** The allowed user writes `text` in topic `threadId` (`null`: the General topic). */
	injectMessage(threadId, text, userId = USER_ID) {
		return this.control("POST", "inject_message", { chat_id: CHAT_ID, thread_id: threadId, user_id: userId, text });
	}

	/**
	 * A user posts a file into topic `threadId`: `media` is the fake's `MediaInject`
	 * (`{kind, data_base64, file_name?, mime_type?, duration?}`), `text` its caption.
	 */
	injectMedia(threadId, text, media, userId = USER_ID) {
		return this.control("POST", "inject_message", { chat_id: CHAT_ID, thread_id: threadId, user_id: userId, text, media });
	}

	/** The bytes of a file the fake holds (one the bot uploaded, or a user's). */
	async fileContent(fileId) {
		const response = await deadline(
			fetch(`${this.url}/control/file_content?file_id=${encodeURIComponent(fileId)}`),
			10_000,
			"control file_content",
		);
		if (!response.ok) throw new Error(`control file_content: HTTP ${response.status}`);
		return Buffer.from(await response.arrayBuffer());
	}

	/** A tap by `userId` (default: the allowed user) on a button of message `messageId`. */
	tap(threadId, messageId, data, userId = USER_ID) {
		return this.control("POST", "inject_callback_query", {
			chat_id: CHAT_ID,
			thread_id: threadId,
			user_id: userId,
			message_id: messageId,
			data,
		});
	}

	/** One message of the bot with its buttons and edit history. */
	message(messageId) {
		return this.control("GET", `message?chat_id=${CHAT_ID}&message_id=${messageId}`);
	}

	/** Every tap and how the bot answered it (`answer: null` until it did). */
	callbackQueries() {
		return this.control("GET", "callback_queries");
	}

	/** What the bot sent into topic `threadId` (`[SentMessage]`: text, plain_text, edited, …). */
	messages(threadId) {
		const thread = threadId === null || threadId === undefined ? "" : `&thread_id=${threadId}`;
		return this.control("GET", `messages?chat_id=${CHAT_ID}${thread}`);
	}

	/** The topics of the private chat with the allowed user (the private-chat mode). */
	privateTopics() {
		return this.control("GET", `topics?chat_id=${USER_ID}`);
	}

	/** What the bot sent into topic `threadId` of the private chat. */
	privateMessages(threadId) {
		return this.control("GET", `messages?chat_id=${USER_ID}&thread_id=${threadId}`);
	}

	/** The allowed user writes `text` into topic `threadId` of their private chat. */
	injectPrivate(threadId, text) {
		return this.control("POST", "inject_message", { chat_id: USER_ID, thread_id: threadId, user_id: USER_ID, text });
	}

	/** Every draft the bot streamed (`[DraftRecord]`: texts, can_stop, stopped, replaced_by). */
	drafts() {
		return this.control("GET", "drafts");
	}

	/** The drafts the bot streamed into topic `threadId` of the private chat. */
	async draftsIn(threadId) {
		return (await this.drafts()).filter((d) => d.thread_id === threadId);
	}

	/** The allowed user presses the stop button of draft `draftId` in their topic `threadId`. */
	pressStop(threadId, draftId) {
		return this.control("POST", "press_stop", { chat_id: USER_ID, thread_id: threadId, draft_id: draftId });
	}

	/** The first message the bot sent into `threadId` whose displayed text satisfies `test`. */
	said(threadId, test, { ms = 30_000, what = "a message in the topic" } = {}) {
		return eventually(
			async () => (await this.messages(threadId)).find((m) => test(m.plain_text)),
			ms,
			what,
		);
	}

	async stop() {
		this.child.kill("SIGTERM");
		if (!(await waitExit(this.child, EXIT_MS))) this.child.kill("SIGKILL");
	}
}

// ------------------------------------------------------------------- pi over RPC

/** One `pi --mode rpc` process, driven over stdin/stdout as pi's RPC clients do. */
export class Pi {
	constructor(name, child) {
		this.name = name;
		this.child = child;
		this.events = [];
		this.stderr = "";
		this.waiters = new Set();
		this.nextId = 1;
		/** Every sidecar pid seen under this pi, so cleanup can reach a straggler. */
		this.sidecarPids = new Set();
		onLines(child.stdout, (line) => {
			let event;
			try {
				event = JSON.parse(line);
			} catch {
				event = { type: "unparsed", line };
			}
			this.events.push(event);
			for (const waiter of this.waiters) waiter();
		});
		child.stderr.on("data", (c) => {
			this.stderr = (this.stderr + c).slice(-8192);
		});
		this.exited = new Promise((done) => child.once("exit", (code, signal) => done({ code, signal })));
		child.once("exit", () => {
			for (const waiter of this.waiters) waiter();
		});
	}

	send(command) {
		this.child.stdin.write(`${JSON.stringify(command)}\n`);
	}

	/** Sends an RPC command and resolves with its `response` (matched by id). */
	async request(command, ms = 15_000) {
		const id = `${this.name}-${this.nextId++}`;
		const from = this.events.length;
		this.send({ ...command, id });
		const response = await this.waitFor((e) => e.type === "response" && e.id === id, {
			ms,
			from,
			what: `the response to ${command.type}`,
		});
		return response;
	}

	/** Runs a slash command the way a user types it. */
	prompt(message, ms) {
		return this.request({ type: "prompt", message }, ms);
	}

	/** The index the next event will have, to wait only for what comes after it. */
	mark() {
		return this.events.length;
	}

	/** The first event from index `from` on that satisfies `predicate`. */
	waitFor(predicate, { ms = 15_000, from = 0, what = "an event" } = {}) {
		const found = () => this.events.slice(from).find(predicate);
		const existing = found();
		if (existing) return Promise.resolve(existing);
		let waiter;
		const arrived = new Promise((done, fail) => {
			waiter = () => {
				const event = found();
				if (event) done(event);
				else if (this.child.exitCode !== null || this.child.signalCode !== null)
					fail(new Error(`pi ${this.name} exited while waiting for ${what}; stderr: ${this.stderr}`));
			};
			this.waiters.add(waiter);
		});
		return deadline(arrived, ms, `${what} from pi ${this.name}`).finally(() => this.waiters.delete(waiter));
	}

	uiRequest(method, test = () => true, options = {}) {
		return this.waitFor((e) => e.type === "extension_ui_request" && e.method === method && test(e), {
			what: `a ${method} UI request`,
			...options,
		});
	}

	/** Waits until the relay status line shows this session bound to its topic. */
	bound(options = {}) {
		return this.uiRequest(
			"setStatus",
			(e) => e.statusKey === "relay" && new RegExp(`^TG [A-Z]·${this.name} ●`).test(stripAnsi(e.statusText)),
			{ ms: 30_000, what: `pi ${this.name} bound to its topic`, ...options },
		);
	}

	/** Records the live sidecars under this pi (for the no-orphan check and cleanup). */
	sidecars() {
		const pids = sidecarsOf(this.child.pid);
		for (const pid of pids) this.sidecarPids.add(pid);
		return pids;
	}

	/** Closes stdin, as a client that is done does; kills pi if it does not leave. */
	async close() {
		this.sidecars();
		this.child.stdin.end();
		if (!(await waitExit(this.child, EXIT_MS))) this.child.kill("SIGKILL");
		await waitExit(this.child, EXIT_MS);
		return this.exited;
	}
}

// ------------------------------------------------------------------- the world

/**
 * The scratch pi agent dir's settings.json (keys: pi-coding-agent docs/settings.md).
 * Retries are off so a failing fake answer is seen once, not retried with backoff.
 */
const PI_SETTINGS = {
	defaultProvider: "fake",
	defaultModel: "echo",
	quietStartup: true,
	enableInstallTelemetry: false,
	retry: { enabled: false, provider: { maxRetries: 0 } },
};

// ------------------------------------------------------------------- agent-relay serve

/** One `agent-relay serve` process (the machine's launcher), its stderr kept. */
export class Serve {
	constructor(child) {
		this.child = child;
		this.stderr = "";
		child.stderr.on("data", (c) => {
			this.stderr = (this.stderr + c).slice(-16384);
		});
		child.stdout.on("data", () => {});
		this.exited = new Promise((done) => child.once("exit", (code, signal) => done({ code, signal })));
	}

	get pid() {
		return this.child.pid;
	}

	/** The agents serve started (its children but its watcher, `serve-watcher`), by pid. */
	agents() {
		const found = [];
		for (const entry of readdirSync("/proc")) {
			if (!/^\d+$/.test(entry)) continue;
			try {
				const stat = readFileSync(`/proc/${entry}/stat`, "utf8");
				const ppid = Number(stat.slice(stat.lastIndexOf(")") + 2).split(" ")[1]);
				if (ppid !== this.child.pid || !isRunning(Number(entry))) continue;
				if (readFileSync(`/proc/${entry}/cmdline`, "utf8").split("\0").includes("serve-watcher")) continue;
				found.push(Number(entry));
			} catch {
				// the process ended while we looked
			}
		}
		return found;
	}

	/** Stops serve as systemd does (SIGTERM), killing it if it does not leave. */
	async stop() {
		if (this.child.exitCode !== null || this.child.signalCode !== null) return this.exited;
		this.child.kill("SIGTERM");
		if (!(await waitExit(this.child, 30_000))) this.child.kill("SIGKILL");
		return this.exited;
	}
}

export class World {
	constructor(root, bot, model) {
		this.root = root;
		this.bot = bot;
		this.model = model;
		this.home = join(root, "home");
		// pi's config dir: `PI_CODING_AGENT_DIR` overrides the default ~/.pi/agent
		// (pi-coding-agent README.md "Environment variables", docs/usage.md); it holds
		// models.json (docs/models.md) and settings.json (docs/settings.md).
		this.agentDir = join(this.home, ".pi", "agent");
		this.relayHome = join(root, "relay");
		/** Where launched agents may work (`[launch] roots`). */
		this.work = join(root, "work");
		this.pis = [];
		this.serves = [];
	}

	/**
	 * A fresh world for test `t`, torn down when `t` ends whatever its outcome: the
	 * fake Bot API, the fake model (tests/pi/fake-model.mjs) and a scratch agent dir
	 * naming it. `settings` is merged over PI_SETTINGS; `modelInput` is the fake
	 * model's input kinds (`["text"]` makes pi drop images).
	 */
	static async create(t, { settings = {}, modelInput, models = [] } = {}) {
		const root = await mkdtemp(join(tmpdir(), "agent-relay-pi-"));
		const world = new World(root, null, null);
		t.after(() => world.destroy());
		world.bot = await FakeBotApi.start();
		world.model = await FakeModel.start();
		await mkdir(world.agentDir, { recursive: true });
		await mkdir(world.relayHome, { recursive: true });
		await writeFile(
			join(world.agentDir, "models.json"),
			JSON.stringify(world.model.modelsJson({ ...(modelInput ? { input: modelInput } : {}), more: models }), null, 2),
		);
		await writeFile(join(world.agentDir, "settings.json"), JSON.stringify({ ...PI_SETTINGS, ...settings }, null, 2));
		return world;
	}

	/**
	 * Writes the relay's config.toml (private, as the relay requires) with `toml`;
	 * the token and chat stay in the environment.
	 */
	async relayConfig(toml) {
		const dir = join(this.relayHome, "config");
		await mkdir(dir, { recursive: true, mode: 0o700 });
		await writeFile(join(dir, "config.toml"), toml, { mode: 0o600 });
	}

	/**
	 * config.toml for `agent-relay serve`: everything in the file, the token too (serve
	 * passes TELEGRAM_BOT_TOKEN to no agent, and a launched pi's sidecar reads the file),
	 * `[launch] roots` (default: the world's work folder) and how to run pi with the
	 * relay's extension. `extra` is appended.
	 */
	async serveConfig({ roots = [this.work], extra = "", home = this.relayHome } = {}) {
		await mkdir(this.work, { recursive: true });
		const pi = [process.execPath, PI_CLI, "--offline", "-e", EXTENSION];
		const dir = join(home, "config");
		await mkdir(dir, { recursive: true, mode: 0o700 });
		await writeFile(
			join(dir, "config.toml"),
			[
				`bot_token = ${JSON.stringify(this.bot.token)}`,
				`chat_id = ${CHAT_ID}`,
				`allowed_users = [${USER_ID}]`,
				`api_url = ${JSON.stringify(this.bot.url)}`,
				"[launch]",
				`roots = ${JSON.stringify(roots)}`,
				"[launch.commands]",
				`pi = ${JSON.stringify(pi)}`,
				extra,
			].join("\n"),
			{ mode: 0o600 },
		);
	}

	/**
	 * The environment serve runs in: pi's (piEnv) without the relay's settings, which
	 * config.toml holds.
	 */
	serveEnv(env = {}) {
		return this.piEnv({
			TELEGRAM_BOT_TOKEN: undefined,
			AGENT_RELAY_CHAT_ID: undefined,
			AGENT_RELAY_ALLOWED_USERS: undefined,
			AGENT_RELAY_API_URL: undefined,
			AGENT_RELAY_LOG: "debug",
			...env,
		});
	}

	/** Starts `agent-relay serve` and waits until it is on the relay's bus. */
	async startServe({ env = {} } = {}) {
		const child = spawn(SIDECAR, ["serve"], {
			cwd: this.root,
			stdio: ["ignore", "pipe", "pipe"],
			env: this.serveEnv(env),
		});
		const serve = new Serve(child);
		this.serves.push(serve);
		await eventually(
			async () => (await this.relayStatus(env)).includes(`serve: pid ${serve.pid}`),
			STARTUP_MS,
			`agent-relay serve (pid ${serve.pid}) on the bus; its stderr: ${serve.stderr}`,
		);
		return serve;
	}

	/** What `agent-relay status` prints now ("" while no leader runs). */
	async relayStatus(env = {}) {
		const child = spawn(SIDECAR, ["status"], { cwd: this.root, stdio: ["ignore", "pipe", "pipe"], env: this.serveEnv(env) });
		let out = "";
		child.stdout.on("data", (c) => {
			out += c;
		});
		child.stderr.on("data", () => {});
		await deadline(new Promise((done) => child.once("exit", done)), 15_000, "agent-relay status");
		return out;
	}

	/** The live forum topic named `X · <name>`, if any. */
	async topicOf(name) {
		const topics = await this.bot.topics();
		return topics.find((topic) => !topic.deleted && topic.name.endsWith(` · ${name}`));
	}

	/**
	 * The environment pi runs in: nothing of the developer's pi or relay setup leaks
	 * in. `env` is added; a key set to `undefined` is left out.
	 */
	piEnv(env = {}) {
		const all = {
			PATH: process.env.PATH,
			HOME: this.home,
			PI_CODING_AGENT_DIR: this.agentDir,
			PI_OFFLINE: "1",
			TELEGRAM_BOT_TOKEN: this.bot.token,
			AGENT_RELAY_CHAT_ID: String(CHAT_ID),
			AGENT_RELAY_ALLOWED_USERS: String(USER_ID),
			AGENT_RELAY_API_URL: this.bot.url,
			AGENT_RELAY_HOME: this.relayHome,
			AGENT_RELAY_BIN: SIDECAR,
			...env,
		};
		return Object.fromEntries(Object.entries(all).filter(([, value]) => value !== undefined));
	}

	/**
	 * Starts pi in its own working directory `<root>/<name>`, so its topic is
	 * `X · <name>`; `args` are added to pi's command line, `env` to its environment
	 * (see `piEnv`). `extension` is loaded with `-e` (none when `null`: what pi's
	 * settings name, e.g. an installed package).
	 */
	async startPi(name, { env = {}, args = [], extension = EXTENSION } = {}) {
		const cwd = join(this.root, name);
		await mkdir(cwd, { recursive: true });
		// `--mode rpc`: JSON lines over stdin/stdout (docs/rpc.md); `--offline`: no
		// startup network (README.md); `--provider`/`--model` pick the fake from
		// models.json (docs/usage.md); `-e`: load our extension (docs/extensions.md).
		const load = extension === null ? [] : ["-e", extension];
		const child = spawn(
			process.execPath,
			[PI_CLI, "--mode", "rpc", "--no-session", "--offline", "--provider", "fake", "--model", "echo", ...load, ...args],
			{ cwd, stdio: ["pipe", "pipe", "pipe"], env: this.piEnv(env) },
		);
		const pi = new Pi(name, child);
		this.pis.push(pi);
		return pi;
	}

	/**
	 * Runs a pi command line (`pi install <source>`, `pi remove …`, `pi list`) in the
	 * world's environment; resolves with `{ code, stdout, stderr }` once it exits.
	 */
	async piCommand(args, { env = {}, cwd = this.root, ms = 60_000 } = {}) {
		const child = spawn(process.execPath, [PI_CLI, ...args], {
			cwd,
			stdio: ["ignore", "pipe", "pipe"],
			env: this.piEnv(env),
		});
		let stdout = "";
		let stderr = "";
		child.stdout.on("data", (c) => {
			stdout += c;
		});
		child.stderr.on("data", (c) => {
			stderr += c;
		});
		const exited = new Promise((done) => child.once("exit", (code) => done(code)));
		try {
			const code = await deadline(exited, ms, `pi ${args.join(" ")}`);
			return { code, stdout: stripAnsi(stdout), stderr: stripAnsi(stderr) };
		} finally {
			if (child.exitCode === null && child.signalCode === null) child.kill("SIGKILL");
		}
	}

	async destroy() {
		await Promise.allSettled(this.serves.map((serve) => serve.stop()));
		await Promise.allSettled(this.pis.map((pi) => pi.close()));
		const stragglers = this.pis.flatMap((pi) => [...pi.sidecarPids]).filter(isRunning);
		for (const pid of stragglers) process.kill(pid, "SIGKILL");
		// A killed process is gone only once the kernel reaped it; until then it
		// may still hold the state folder open.
		await eventually(() => !stragglers.some(isRunning), 10_000, "the killed sidecars to be gone").catch(() => {});
		await Promise.allSettled([this.bot?.stop(), this.model?.stop()]);
		// A sidecar that was leading may have started one more (a restart, a
		// disconnect's hand-over) whose last write lands as the folder goes:
		// Node retries ENOTEMPTY/EBUSY with a linear backoff.
		await rm(this.root, { recursive: true, force: true, maxRetries: 10, retryDelay: 100 });
	}
}
