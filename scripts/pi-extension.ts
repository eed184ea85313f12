/**
 * agent-relay for pi: the host adapter that lets pi (`@mariozechner/pi-coding-agent`)
 * drive the `agent-relay` sidecar.
 *
 * pi loads extensions in-process and has no notion of a binary extension, so this
 * file spawns `agent-relay stdio` and speaks the host protocol (docs/DESIGN.md,
 * "The host protocol") with it
 * (JSON-RPC 2.0, one object per line). The repository is a pi package holding this
 * file (`package.json`'s `pi` key), published on npm with the binary
 * (docs/decisions/0009-npm-packages.md): `pi install npm:agent-relay`, `pi install
 * git:…` or `pi install <checkout>`; for one run, `pi -e
 * /path/to/scripts/pi-extension.ts` (README.md, "Use it with pi").
 *
 * One sidecar per pi process. pi re-runs extension factories on `/new`, `/resume`,
 * `/fork` and `/reload`, and every run gets a fresh `pi`/`ctx` pair whose
 * predecessor turns stale; so the sidecar lives in a process-global `Bridge` that
 * each run re-binds in `session_start` and un-binds in `session_shutdown`. Only
 * `session_shutdown` with reason `quit` stops the sidecar: pi does not reap
 * extension children.
 */

import { type ChildProcessWithoutNullStreams, spawn } from "node:child_process";
import { accessSync, constants, existsSync, readFileSync, statSync } from "node:fs";
import { readFile, stat } from "node:fs/promises";
import { createRequire } from "node:module";
import { homedir } from "node:os";
import { delimiter, dirname, join, resolve } from "node:path";
import { StringDecoder } from "node:string_decoder";
import { fileURLToPath } from "node:url";
import type { ExtensionAPI, ExtensionContext } from "@mariozechner/pi-coding-agent";
import { SettingsManager, VERSION } from "@mariozechner/pi-coding-agent";
import { Type } from "typebox";

const PROTOCOL_VERSION = 1;
/** The manifest's own limit: longer lines are dropped, never buffered without end. */
const MAX_LINE_BYTES = 1024 * 1024;
/**
 * Text projections sent to the sidecar are clipped to this many UTF-16 units: even
 * when every unit is escaped as `\uXXXX` the line stays under MAX_LINE_BYTES.
 */
const MAX_TEXT_UNITS = 100_000;
const MAX_TOOL_CALLS = 100;
const MAX_STDERR_TAIL = 4096;
/** Queued notifications while the sidecar is still initializing. */
const MAX_BACKLOG = 256;

const INITIALIZE_TIMEOUT_MS = 10_000;
/** `/relay restart` and `/telegram-disconnect` (which waits on a dialog) take a while. */
const COMMAND_TIMEOUT_MS = 5 * 60_000;
const DEFAULT_CONFIRM_TIMEOUT_MS = 2 * 60_000;
/**
 * How long a tool call may wait for its approval: the sidecar denies after the policy's
 * timeout (at most a day) and answers; this only bounds a sidecar that never does.
 */
const APPROVAL_TIMEOUT_MS = 25 * 3600_000;
/** Arguments sent with `tool/started`, clipped: enough to show what a call does. */
const MAX_ARGS_UNITS = 2_000;
/** How long pi waits for the answer of a turn to be the relay's. */
const ENDED_REPLY_MS = 5_000;
const SHUTDOWN_REPLY_MS = 1_000;
const EXIT_GRACE_MS = 1_500;
/** A relayed prompt that arrives while pi swaps sessions waits this long for the new one. */
const REBIND_WAIT_MS = 5_000;
/**
 * Sending a file: the sidecar answers within 2 s (an upload Telegram has not answered
 * goes on, and the answer says so); this bounds a sidecar that never answers.
 */
const FILE_SEND_TIMEOUT_MS = 15_000;
/**
 * Pictures from Telegram larger than this reach the model as a path only: model APIs refuse
 * big images (Anthropic's limit is 5 MB), and base64 makes them a third bigger.
 */
const MAX_IMAGE_BYTES = 5 * 1024 * 1024;
/** Image types models read; other pictures (BMP, HEIC, …) stay paths. */
const IMAGE_TYPES = new Set(["image/jpeg", "image/png", "image/gif", "image/webp"]);

const GLOBAL_KEY = Symbol.for("agent-relay.pi-extension.bridge");
/** How many relayed update ids are remembered to drop a redelivery. */
const SEEN_UPDATES = 4096;
/** How often the text being written goes to the sidecar, at most (`turn/text`; each supersedes the last). */
const WRITING_EVERY_MS = 500;
/**
 * How long past pi's own delay before a try again (its `retry` settings) a failed run
 * waits for that try before it counts as the turn's end: pi starts it from a timer.
 */
const RETRY_GRACE_MS = 3_000;
/** A failed run pi compacts after (a context overflow) waits at most this long for the try after it. */
const COMPACTION_WAIT_MS = 5 * 60_000;

type Tone = "info" | "success" | "warning" | "error" | "muted";
type NotifyLevel = "info" | "warning" | "error";

interface CommandSpec {
	name: string;
	description: string;
	args?: string;
}

interface Manifest {
	dir: string;
	/** The package's version (its package.json), to compare with the binary's. */
	version: string | undefined;
	command: string;
	args: string[];
	envOverride: string;
	commands: CommandSpec[];
}

interface JsonRpcError {
	code: number;
	message: string;
	data?: unknown;
}

type JsonValue = unknown;

/** A JSON-RPC error the sidecar should see as such, not as an internal failure. */
class RpcFault extends Error {
	constructor(
		readonly code: number,
		message: string,
	) {
		super(message);
	}
}

/** Why a request to the sidecar did not get its result. */
class SidecarUnavailable extends Error {}

// ------------------------------------------------------------------- spawning

/** The repository's `extension-manifest.json`, when this file still sits in `scripts/`. */
function readManifest(): Manifest {
	const fallback: Manifest = {
		dir: "",
		version: undefined,
		command: "agent-relay",
		args: ["stdio"],
		envOverride: "AGENT_RELAY_BIN",
		commands: [],
	};
	let here: string;
	try {
		here = dirname(fileURLToPath(import.meta.url));
	} catch {
		return fallback;
	}
	const path = resolve(here, "..", "extension-manifest.json");
	try {
		const raw = JSON.parse(readFileSync(path, "utf8")) as {
			spawn?: { command?: unknown; args?: unknown; envOverride?: unknown };
			commands?: unknown;
		};
		const spawnSpec = raw.spawn ?? {};
		return {
			dir: dirname(path),
			version: packageVersion(dirname(path)),
			command: typeof spawnSpec.command === "string" ? spawnSpec.command : fallback.command,
			args: Array.isArray(spawnSpec.args) ? spawnSpec.args.filter((a) => typeof a === "string") : fallback.args,
			envOverride: typeof spawnSpec.envOverride === "string" ? spawnSpec.envOverride : fallback.envOverride,
			commands: parseCommands(raw.commands),
		};
	} catch {
		return fallback;
	}
}

function packageVersion(dir: string): string | undefined {
	try {
		const { version } = JSON.parse(readFileSync(join(dir, "package.json"), "utf8")) as { version?: unknown };
		return typeof version === "string" ? version : undefined;
	} catch {
		return undefined;
	}
}

/**
 * The binary npm installed with this package (its platform's package, an optional
 * dependency, found from the package's folder as Node finds modules:
 * `npm/binary.js`), or why there is none. `undefined` for a checkout, whose own build
 * matches it, and where `npm/binary.js` is not beside the extension: then the places
 * `resolveBinary` looks next decide.
 */
function packageBinary(manifest: Manifest): { binary?: string; problem?: string } | undefined {
	if (manifest.dir === "" || existsSync(join(manifest.dir, "Cargo.toml"))) {
		// A checkout: its own build, not a package's, is the one that matches it.
		return undefined;
	}
	try {
		const require = createRequire(join(manifest.dir, "package.json"));
		return (require("./npm/binary.js") as { findBinary(): { binary?: string; problem?: string } }).findBinary();
	} catch {
		return undefined;
	}
}

/**
 * Which binary to run: the manifest's env override, else the binary npm installed
 * with this package (pi installs `npm:` packages with `npm install -g`, whose `bin`
 * folder pi's PATH may lack), else a build in the checkout the manifest belongs to
 * (release before debug), else the command on PATH, else where `cargo install` puts
 * it (`${CARGO_HOME:-~/.cargo}/bin`, which pi's PATH may lack). `undefined` when there
 * is none: `missingNotice` says how to install it.
 */
function resolveBinary(manifest: Manifest): string | undefined {
	const override = process.env[manifest.envOverride];
	if (override && override.trim() !== "") return override;
	const packaged = packageBinary(manifest)?.binary;
	if (packaged !== undefined) return packaged;
	if (manifest.dir !== "") {
		for (const profile of ["release", "debug"]) {
			const built = join(manifest.dir, "target", profile, manifest.command);
			if (existsSync(built)) return built;
		}
	}
	for (const dir of (process.env.PATH ?? "").split(delimiter)) {
		if (dir === "") continue;
		const candidate = join(dir, manifest.command);
		if (runnable(candidate)) return candidate;
	}
	const cargoBin = join(process.env.CARGO_HOME || join(homedir(), ".cargo"), "bin", manifest.command);
	return runnable(cargoBin) ? cargoBin : undefined;
}

function runnable(path: string): boolean {
	try {
		accessSync(path, constants.X_OK);
		return statSync(path).isFile();
	} catch {
		return false;
	}
}

/**
 * What pi shows when there is no binary: the one command that installs it. A package
 * installed from git or a path is a checkout of the repository, so `cargo install
 * --path` of that very folder builds the version that matches this extension; one
 * installed from npm says why its platform's binary is not there.
 */
function missingNotice(manifest: Manifest, tried: string | undefined): string {
	const packaged = tried === undefined ? packageBinary(manifest)?.problem : undefined;
	if (packaged !== undefined) {
		return `agent-relay not found: ${packaged} Or set ${manifest.envOverride} to the binary; then /telegram-connect.`;
	}
	const where = tried ?? `${manifest.command} (not in the checkout's target/, on PATH or in ~/.cargo/bin)`;
	const install =
		manifest.dir !== "" && existsSync(join(manifest.dir, "Cargo.toml"))
			? `cargo install --locked --path ${shellQuote(manifest.dir)}`
			: "npm i -g agent-relay";
	return `agent-relay not found: ${where}. Install it with \`${install}\`, or set ${manifest.envOverride} to the binary; then /telegram-connect.`;
}

function shellQuote(path: string): string {
	return /^[\w@%+=:,./-]+$/.test(path) ? path : `'${path.replaceAll("'", "'\\''")}'`;
}

function parseCommands(value: unknown): CommandSpec[] {
	if (!Array.isArray(value)) return [];
	const out: CommandSpec[] = [];
	for (const item of value) {
		if (typeof item !== "object" || item === null) continue;
		const { name, description, args } = item as Record<string, unknown>;
		if (typeof name !== "string" || name.trim() === "") continue;
		out.push({
			name: name.replace(/^\//, ""),
			description: typeof description === "string" ? description : "",
			args: typeof args === "string" ? args : undefined,
		});
	}
	return out;
}

// ------------------------------------------------------------------- the sidecar process

interface SidecarEvents {
	/** A request or notification from the sidecar; the returned value is the result. */
	onCall(method: string, params: JsonValue, isRequest: boolean, id: unknown): Promise<JsonValue> | JsonValue;
	/** The process is gone; `expected` when we stopped it. */
	onExit(description: string, expected: boolean): void;
}

interface Pending {
	resolve(value: JsonValue): void;
	reject(error: Error): void;
	timer: NodeJS.Timeout;
}

/**
 * One `agent-relay stdio` child and the JSON-RPC conversation with it. Writes never
 * wait; every request has a timeout; stdout is split on `\n` only, because JSON
 * strings may contain U+2028/U+2029, which Node's readline would treat as line ends.
 */
class Sidecar {
	private readonly child: ChildProcessWithoutNullStreams;
	private readonly pending = new Map<number, Pending>();
	private readonly decoder = new StringDecoder("utf8");
	private nextId = 1;
	private buffer = "";
	/** Set while the rest of an oversized line is being skipped. */
	private skipping = false;
	private stderrTail = "";
	private stopping = false;
	private exitedWith: string | undefined;
	private readonly exited: Promise<void>;
	private readonly killOnExit = () => {
		this.child.kill("SIGTERM");
	};

	constructor(
		readonly binary: string,
		args: string[],
		cwd: string,
		private readonly events: SidecarEvents,
	) {
		this.child = spawn(binary, args, { cwd, stdio: ["pipe", "pipe", "pipe"], windowsHide: true });
		// pi's own lifetime must not depend on ours (print mode exits when idle).
		this.child.unref();
		for (const stream of [this.child.stdin, this.child.stdout, this.child.stderr]) {
			(stream as unknown as { unref?: () => void }).unref?.();
		}
		this.exited = new Promise((done) => {
			this.child.once("close", (code, signal) => {
				done();
				this.finish(signal ? `killed by ${signal}` : `exit code ${code ?? "?"}`);
			});
			this.child.once("error", (error: NodeJS.ErrnoException) => {
				if (error.code === "ENOENT" || error.code === "EACCES") {
					done();
					this.finish(`cannot run ${binary}: ${error.code}`);
				}
			});
		});
		// EPIPE after the child died is reported through `close`; without a listener
		// it would crash pi.
		this.child.stdin.on("error", () => {});
		this.child.stdout.on("data", (chunk: Buffer) => this.receive(this.decoder.write(chunk)));
		this.child.stderr.on("data", (chunk: Buffer) => {
			this.stderrTail = (this.stderrTail + chunk.toString("utf8")).slice(-MAX_STDERR_TAIL);
		});
		process.once("exit", this.killOnExit);
	}

	get pid(): number | undefined {
		return this.child.pid;
	}

	get alive(): boolean {
		return this.exitedWith === undefined;
	}

	/** The last line the sidecar wrote to stderr, for the exit notice. */
	get lastError(): string {
		const lines = this.stderrTail.trim().split("\n");
		return lines[lines.length - 1]?.trim() ?? "";
	}

	request(method: string, params: JsonValue, timeoutMs: number): Promise<JsonValue> {
		if (!this.alive) return Promise.reject(new SidecarUnavailable(`agent-relay is not running (${this.exitedWith})`));
		const id = this.nextId++;
		return new Promise((resolveCall, rejectCall) => {
			const timer = setTimeout(() => {
				this.pending.delete(id);
				rejectCall(new SidecarUnavailable(`agent-relay did not answer ${method} within ${timeoutMs} ms`));
			}, timeoutMs);
			timer.unref();
			this.pending.set(id, { resolve: resolveCall, reject: rejectCall, timer });
			this.write({ jsonrpc: "2.0", id, method, params });
		});
	}

	notify(method: string, params: JsonValue): void {
		this.write({ jsonrpc: "2.0", method, params });
	}

	/**
	 * Ask politely (`shutdown`, then EOF on stdin), then insist. Bounded in time so
	 * pi's own exit is never held up by a wedged sidecar.
	 */
	async stop(reason: string): Promise<void> {
		if (!this.alive) return;
		this.stopping = true;
		// pi may be on its way out with nothing else keeping Node's loop alive; an
		// unreferenced child would let the process exit halfway through this goodbye.
		this.child.ref();
		(this.child.stdout as unknown as { ref?: () => void }).ref?.();
		await this.request("shutdown", { reason }, SHUTDOWN_REPLY_MS).catch(() => undefined);
		this.child.stdin.end();
		if (await this.exitsWithin(EXIT_GRACE_MS)) return;
		this.child.kill("SIGTERM");
		if (await this.exitsWithin(EXIT_GRACE_MS)) return;
		this.child.kill("SIGKILL");
		await this.exitsWithin(EXIT_GRACE_MS);
	}

	private exitsWithin(ms: number): Promise<boolean> {
		return new Promise((done) => {
			const timer = setTimeout(() => done(false), ms);
			void this.exited.then(() => {
				clearTimeout(timer);
				done(true);
			});
		});
	}

	private write(message: object): void {
		if (!this.alive || this.child.stdin.destroyed) return;
		this.child.stdin.write(`${JSON.stringify(message)}\n`);
	}

	private receive(text: string): void {
		let start = 0;
		for (let nl = text.indexOf("\n", start); nl !== -1; nl = text.indexOf("\n", start)) {
			const piece = text.slice(start, nl);
			start = nl + 1;
			if (this.skipping) {
				this.skipping = false;
				this.buffer = "";
				continue;
			}
			const line = this.buffer + piece;
			this.buffer = "";
			this.dispatch(line.endsWith("\r") ? line.slice(0, -1) : line);
		}
		if (this.skipping) return;
		this.buffer += text.slice(start);
		// Characters, not bytes, but a UTF-16 unit is at least one byte: a safe bound.
		if (this.buffer.length > MAX_LINE_BYTES) {
			this.buffer = "";
			this.skipping = true;
		}
	}

	private dispatch(line: string): void {
		if (line.trim() === "") return;
		let message: Record<string, unknown>;
		try {
			const parsed = JSON.parse(line) as unknown;
			if (typeof parsed !== "object" || parsed === null || Array.isArray(parsed)) return;
			message = parsed as Record<string, unknown>;
		} catch {
			return; // stdout carries only protocol; anything else is not ours to act on
		}
		if (typeof message.method === "string") {
			this.serve(message.method, message.params, message.id);
			return;
		}
		if (typeof message.id !== "number") return;
		const pending = this.pending.get(message.id);
		if (!pending) return; // answered after its timeout
		this.pending.delete(message.id);
		clearTimeout(pending.timer);
		const error = message.error as JsonRpcError | undefined;
		if (error && typeof error === "object") {
			pending.reject(new RpcFault(Number(error.code), String(error.message ?? "error")));
		} else {
			pending.resolve(message.result);
		}
	}

	private serve(method: string, params: unknown, id: unknown): void {
		const isRequest = id !== undefined && id !== null;
		void (async () => {
			try {
				const result = await this.events.onCall(method, params, isRequest, id);
				if (isRequest) this.write({ jsonrpc: "2.0", id, result: result ?? null });
			} catch (error) {
				if (!isRequest) return;
				const code = error instanceof RpcFault ? error.code : -32603;
				const text = error instanceof Error ? error.message : String(error);
				this.write({ jsonrpc: "2.0", id, error: { code, message: text } });
			}
		})();
	}

	private finish(description: string): void {
		if (this.exitedWith !== undefined) return;
		this.exitedWith = description;
		process.removeListener("exit", this.killOnExit);
		for (const [id, pending] of this.pending) {
			clearTimeout(pending.timer);
			pending.reject(new SidecarUnavailable(`agent-relay stopped (${description})`));
			this.pending.delete(id);
		}
		this.events.onExit(description, this.stopping);
	}
}

// ------------------------------------------------------------------- the bridge

/** What one run of the factory contributes: its live `pi`, the latest `ctx`. */
interface Binding {
	pi: ExtensionAPI;
	ctx: ExtensionContext;
	registerCommands(commands: CommandSpec[]): void;
}

/**
 * Process-global: the sidecar, what it told us, and which pi session is current.
 * Handlers read `binding` at call time, so a request that arrives after `/new`
 * reaches the new session, never a stale `ctx`.
 */
class Bridge {
	sidecar: Sidecar | undefined;
	/** The sidecar's commands once it answered `initialize`, else the manifest's. */
	commands: CommandSpec[];
	binding: Binding | undefined;
	private ready: Promise<boolean> | undefined;
	private initialized = false;
	private backlog: Array<[string, JsonValue]> = [];
	private readonly statuses = new Map<string, { text: string | null; tone: Tone }>();
	private readonly dialogs = new Set<AbortController>();
	/** Open dialogs by the sidecar's request id, so `$/cancelRequest` can close them. */
	private readonly dialogsById = new Map<string, AbortController>();
	/** The latest prompt came from Telegram (relayed), not from the keyboard. */
	fromTelegram = false;
	/** A failed run waiting to see whether pi tries again (`Failures`). */
	readonly failures = new Failures((params) => this.ended(params));
	private readonly rebindWaiters = new Set<() => void>();
	private versionNoticed = false;

	constructor(readonly manifest: Manifest) {
		this.commands = manifest.commands;
	}

	bind(binding: Binding): void {
		this.binding = binding;
		for (const [key, status] of this.statuses) this.showStatus(key, status.text, status.tone);
		for (const wake of this.rebindWaiters) wake();
		this.rebindWaiters.clear();
	}

	unbind(pi: ExtensionAPI): void {
		if (this.binding?.pi !== pi) return;
		this.binding = undefined;
		this.cancelDialogs();
	}

	/** Start the sidecar unless it runs; resolves true once it answered `initialize`. */
	ensureStarted(ctx: ExtensionContext): Promise<boolean> {
		if (this.sidecar?.alive && this.ready) return this.ready;
		this.initialized = false;
		const binary = resolveBinary(this.manifest);
		if (binary === undefined) {
			this.sidecar = undefined;
			this.ready = undefined;
			this.showMissing(undefined);
			return Promise.resolve(false);
		}
		const sidecar = new Sidecar(binary, this.manifest.args, ctx.cwd, {
			onCall: (method, params, isRequest, id) => this.serve(method, params, isRequest, id),
			onExit: (description, expected) => this.lost(sidecar, description, expected),
		});
		this.sidecar = sidecar;
		this.ready = this.initialize(sidecar, ctx);
		return this.ready;
	}

	/**
	 * `agent/ended`, asked rather than told once the handshake is done: the
	 * answer comes when the turn's answer is the relay's (on disk), so pi may
	 * exit right after it (`pi -p`) without losing it.
	 */
	async ended(params: JsonValue): Promise<void> {
		if (!this.sidecar?.alive || !this.initialized) {
			this.notify("agent/ended", params);
			return;
		}
		await this.sidecar.request("agent/ended", params, ENDED_REPLY_MS).catch(() => undefined);
	}

	/** Send a notification, in order, after the handshake. */
	notify(method: string, params: JsonValue): void {
		if (!this.sidecar?.alive) return;
		if (this.initialized) {
			this.sidecar.notify(method, params);
			return;
		}
		if (this.backlog.length >= MAX_BACKLOG) this.backlog.shift();
		this.backlog.push([method, params]);
	}

	async execute(name: string, args: string, ctx: ExtensionContext): Promise<void> {
		const ready = await this.ensureStarted(ctx);
		const sidecar = this.sidecar;
		if (!ready || !sidecar) return; // the failure was already shown
		try {
			const result = (await sidecar.request("command/execute", { name, args }, COMMAND_TIMEOUT_MS)) as {
				ok?: unknown;
				message?: unknown;
				cancelled?: unknown;
			} | null;
			const message = typeof result?.message === "string" ? result.message : "";
			const ok = result?.ok === true;
			// Declining a confirmation is the user's choice, not a failure.
			const level = ok || result?.cancelled === true ? "info" : "error";
			if (message !== "" || !ok) ctx.ui.notify(message || `/${name} failed`, level);
		} catch (error) {
			ctx.ui.notify(`/${name}: ${error instanceof Error ? error.message : String(error)}`, "error");
		}
	}

	async stop(reason: string): Promise<void> {
		const sidecar = this.sidecar;
		this.cancelDialogs();
		if (sidecar) await sidecar.stop(reason);
	}

	private async initialize(sidecar: Sidecar, ctx: ExtensionContext): Promise<boolean> {
		try {
			const result = (await sidecar.request(
				"initialize",
				{
					protocolVersion: PROTOCOL_VERSION,
					host: { name: "pi", version: VERSION },
					pid: process.pid,
					cwd: ctx.cwd,
					session: sessionInfo(ctx),
					hasUI: ctx.hasUI,
					// pi takes `deliverAs: "steer"` into the turn that runs: its next
					// model request has it (tests/pi/steer.test.mjs).
					canSteer: true,
				},
				INITIALIZE_TIMEOUT_MS,
			)) as { protocolVersion?: unknown; sidecar?: { version?: unknown }; commands?: unknown } | null;
			if (result?.protocolVersion !== PROTOCOL_VERSION) {
				// Another protocol is another program: it is not let into the relay.
				this.warn(
					`agent-relay at ${sidecar.binary} speaks protocol ${String(result?.protocolVersion)}, this extension ${PROTOCOL_VERSION}, so it does not run: install the agent-relay of this extension's version${this.manifest.version ? ` (${this.manifest.version})` : ""}.`,
				);
				void sidecar.stop("another protocol");
				return false;
			}
			this.noticeVersion(sidecar.binary, result?.sidecar?.version);
			const commands = parseCommands(result?.commands);
			if (commands.length > 0) {
				this.commands = commands;
				try {
					this.binding?.registerCommands(commands);
				} catch {
					// pi is swapping sessions; the next factory run registers `this.commands`
				}
			}
			sidecar.notify("initialized", {});
			this.initialized = true;
			for (const [method, params] of this.backlog.splice(0)) sidecar.notify(method, params);
			return true;
		} catch (error) {
			if (sidecar.alive) {
				this.warn(`agent-relay did not start: ${error instanceof Error ? error.message : String(error)}`);
				void sidecar.stop("initialize failed");
			}
			return false;
		}
	}

	private lost(sidecar: Sidecar, description: string, expected: boolean): void {
		if (this.sidecar !== sidecar) return;
		this.initialized = false;
		this.backlog = [];
		this.cancelDialogs();
		if (expected) return;
		if (description.startsWith("cannot run")) {
			this.showMissing(sidecar.binary);
			return;
		}
		const detail = sidecar.lastError ? `: ${sidecar.lastError}` : "";
		this.statuses.set("relay", { text: "TG ✕ relay stopped", tone: "error" });
		this.showStatus("relay", "TG ✕ relay stopped", "error");
		this.warn(`agent-relay stopped (${description})${detail}. Telegram relay is off; /telegram-connect starts it again.`);
	}

	/** No binary to run (`tried` is the one that would not start): the status line and a notice with the fix. */
	private showMissing(tried: string | undefined): void {
		this.statuses.set("relay", { text: "TG ✕ agent-relay missing", tone: "error" });
		this.showStatus("relay", "TG ✕ agent-relay missing", "error");
		this.warn(missingNotice(this.manifest, tried));
	}

	/** Once per pi process: the binary is of another version than this extension (same protocol, so it runs). */
	private noticeVersion(binary: string, version: unknown): void {
		const ours = this.manifest.version;
		if (this.versionNoticed || ours === undefined || typeof version !== "string" || version === ours) return;
		this.versionNoticed = true;
		try {
			this.binding?.ctx.ui.notify(
				`agent-relay at ${binary} is version ${version}, this extension ${ours}; it speaks the same protocol (${PROTOCOL_VERSION}), so it runs.`,
				"warning",
			);
		} catch {
			// a stale ctx: the next start says it
			this.versionNoticed = false;
		}
	}

	private warn(message: string): void {
		try {
			this.binding?.ctx.ui.notify(message, "error");
		} catch {
			// a ctx that turned stale between two sessions: the next bind shows the status
		}
	}

	/** Asks the sidecar whether a tool call may run; `undefined` when the relay does not decide. */
	async approve(toolCallId: string, tool: string, input: unknown, signal: AbortSignal | undefined): Promise<{ block: true; reason: string } | undefined> {
		const sidecar = this.sidecar;
		if (!sidecar?.alive || !this.initialized) {
			// Nobody can be asked. A turn from Telegram has nobody at the keyboard either:
			// its calls are denied rather than run unchecked.
			return this.fromTelegram
				? { block: true, reason: "agent-relay is not running, so nobody can approve this tool call." }
				: undefined;
		}
		const asked = sidecar.request(
			"approval/request",
			{ toolCallId, tool, input: clipArgs(input), fromTelegram: this.fromTelegram },
			APPROVAL_TIMEOUT_MS,
		) as Promise<{ decision?: unknown; reason?: unknown } | null>;
		const aborted = new Promise<"aborted">((done) => {
			if (signal?.aborted) done("aborted");
			signal?.addEventListener("abort", () => done("aborted"), { once: true });
		});
		let result: { decision?: unknown; reason?: unknown } | null | "aborted";
		try {
			result = await Promise.race([asked, aborted]);
		} catch {
			// The relay went away while asking: as above.
			return this.fromTelegram
				? { block: true, reason: "agent-relay stopped before this tool call was approved." }
				: undefined;
		}
		if (result === "aborted") return { block: true, reason: "The run was stopped before the tool call was approved." };
		if (result?.decision === "deny") {
			return { block: true, reason: typeof result.reason === "string" ? result.reason : "The user denied this tool call." };
		}
		return undefined;
	}

	/** The agent's own question to its user, through the relay (phone and terminal). */
	async ask(question: string, options: string[], allowText: boolean, signal: AbortSignal | undefined): Promise<string> {
		const sidecar = this.sidecar;
		if (!sidecar?.alive || !this.initialized) return "The user cannot be asked right now (agent-relay is not running).";
		const asked = sidecar.request("question/ask", { question, options, allowText }, APPROVAL_TIMEOUT_MS) as Promise<{
			answer?: unknown;
			by?: unknown;
			reason?: unknown;
		} | null>;
		const aborted = new Promise<null>((done) => signal?.addEventListener("abort", () => done(null), { once: true }));
		const result = await Promise.race([asked, aborted]).catch(() => null);
		if (result === null) return "The question was not answered (the run was stopped or the relay went away).";
		if (typeof result.answer === "string") {
			const where = result.by === "phone" ? "on the phone" : result.by === "terminal" ? "at the terminal" : "";
			return `The user answered${where ? ` ${where}` : ""}: ${result.answer}`;
		}
		if (result.by === "unavailable" && typeof result.reason === "string") return `Nobody could be asked: ${result.reason}.`;
		return result.by === "timeout" ? "The user did not answer in time." : "The user did not answer.";
	}

	private async serve(method: string, params: unknown, isRequest: boolean, id?: unknown): Promise<JsonValue> {
		const p = (typeof params === "object" && params !== null ? params : {}) as Record<string, unknown>;
		switch (method) {
			case "ui/setStatus": {
				const key = typeof p.key === "string" ? p.key : "relay";
				const text = typeof p.text === "string" ? p.text : null;
				const tone = isTone(p.tone) ? p.tone : "info";
				this.statuses.set(key, { text, tone });
				this.showStatus(key, text, tone);
				return null;
			}
			case "ui/notify": {
				const level: NotifyLevel = p.level === "warning" || p.level === "error" ? p.level : "info";
				if (typeof p.message === "string") this.binding?.ctx.ui.notify(p.message, level);
				return null;
			}
			case "ui/confirm":
				return { confirmed: await this.confirm(p, id) };
			case "ui/select":
				return await this.select(p, id);
			case "$/cancelRequest": {
				const key = p.id === undefined ? undefined : String(p.id);
				if (key !== undefined) this.dialogsById.get(key)?.abort();
				return null;
			}
			case "agent/sendUserMessage":
				return { accepted: await this.sendUserMessage(p) };
			case "agent/abort": {
				const binding = await this.awaitBinding();
				binding?.ctx.abort();
				// Stopped while pi waited to try again: it will not, and the run was stopped.
				void this.failures.settle({ aborted: true });
				return {};
			}
			default:
				if (isRequest) throw new RpcFault(-32601, `method not found: ${method}`);
				return null; // unknown notifications are ignored, as the protocol says
		}
	}

	private async confirm(p: Record<string, unknown>, id: unknown): Promise<boolean> {
		const binding = this.binding;
		if (!binding?.ctx.hasUI) return false;
		const title = typeof p.title === "string" ? p.title : "agent-relay";
		const message = typeof p.message === "string" ? p.message : "";
		return await this.dialog(id, p, (options) => binding.ctx.ui.confirm(title, message, options));
	}

	/** `ui/select`: a choice (or, with `allowText`, a written answer) at the terminal. */
	private async select(p: Record<string, unknown>, id: unknown): Promise<{ choice?: number; text?: string }> {
		const binding = this.binding;
		if (!binding?.ctx.hasUI) return {};
		const title = typeof p.title === "string" ? p.title : "agent-relay";
		const heading = typeof p.message === "string" && p.message !== "" ? `${title}\n${p.message}` : title;
		const options = Array.isArray(p.options) ? p.options.filter((o): o is string => typeof o === "string") : [];
		const write = "✎ Write an answer…";
		const offered = p.allowText === true ? [...options, write] : options;
		if (offered.length === 0) {
			const text = await this.dialog(id, p, (o) => binding.ctx.ui.input(heading, undefined, o));
			return text ? { text } : {};
		}
		const picked = await this.dialog(id, p, (o) => binding.ctx.ui.select(heading, offered, o));
		if (picked === undefined) return {};
		if (picked === write && p.allowText === true) {
			const text = await this.dialog(id, p, (o) => binding.ctx.ui.input(title, undefined, o));
			return text ? { text } : {};
		}
		const choice = options.indexOf(picked);
		return choice >= 0 ? { choice } : {};
	}

	/** Runs one dialog that the sidecar may withdraw (`$/cancelRequest`) or that times out. */
	private async dialog<T>(
		id: unknown,
		p: Record<string, unknown>,
		open: (options: { timeout: number; signal: AbortSignal }) => Promise<T>,
	): Promise<T> {
		const timeout =
			typeof p.timeoutMs === "number" && p.timeoutMs > 0 ? p.timeoutMs : DEFAULT_CONFIRM_TIMEOUT_MS;
		const abort = new AbortController();
		const key = id === undefined || id === null ? undefined : String(id);
		this.dialogs.add(abort);
		if (key !== undefined) this.dialogsById.set(key, abort);
		try {
			return await open({ timeout, signal: abort.signal });
		} finally {
			this.dialogs.delete(abort);
			if (key !== undefined) this.dialogsById.delete(key);
		}
	}

	private async sendUserMessage(p: Record<string, unknown>): Promise<boolean> {
		if (typeof p.text !== "string" || p.text === "") throw new RpcFault(-32602, "text must be a non-empty string");
		// origin.updateId is an idempotency key: a sidecar killed between our
		// answer and its acknowledgement hands the same message to its
		// successor. This set outlives sidecars (it lives with pi).
		const origin = p.origin as Record<string, unknown> | undefined;
		const updateId = typeof origin?.updateId === "number" ? origin.updateId : undefined;
		if (updateId !== undefined && seenUpdates.has(updateId)) return true;
		const binding = await this.awaitBinding();
		if (!binding) return false;
		if (updateId !== undefined) {
			seenUpdates.add(updateId);
			if (seenUpdates.size > SEEN_UPDATES) {
				const oldest = seenUpdates.values().next().value;
				if (oldest !== undefined) seenUpdates.delete(oldest);
			}
		}
		this.fromTelegram = true;
		// Pictures go to the model as images; every file is also named, with its path, in
		// the text the sidecar wrote.
		const images = await imagesOf(p.attachments);
		const content = images.length > 0 ? [{ type: "text" as const, text: p.text }, ...images] : p.text;
		if (binding.ctx.isIdle()) {
			binding.pi.sendUserMessage(content);
		} else {
			// pi refuses a prompt without a delivery mode while it streams.
			const deliverAs = p.deliverAs === "steer" ? "steer" : "followUp";
			binding.pi.sendUserMessage(content, { deliverAs });
		}
		return true;
	}

	/** The agent sends a file into its Telegram topic; resolves with what to tell the model, throws why not. */
	async sendFile(path: string, caption: string | undefined, as: string | undefined, signal: AbortSignal | undefined): Promise<string> {
		const sidecar = this.sidecar;
		if (!sidecar?.alive || !this.initialized) throw new Error("agent-relay is not running, so nothing can be sent to Telegram.");
		const params = { path, ...(caption ? { caption } : {}), ...(as === "photo" || as === "document" ? { as } : {}) };
		const sent = sidecar.request("file/send", params, FILE_SEND_TIMEOUT_MS) as Promise<{
			sentAs?: unknown;
			size?: unknown;
			kept?: unknown;
		} | null>;
		const aborted = new Promise<never>((_, fail) => {
			const stop = () => fail(new Error("The run was stopped; the file may or may not have reached Telegram."));
			if (signal?.aborted) stop();
			signal?.addEventListener("abort", stop, { once: true });
		});
		const result = await Promise.race([sent, aborted]);
		// Telegram has not answered yet: the upload goes on, and the topic hears if it fails.
		if (typeof result?.kept === "string") return `${path} is not in the user's Telegram topic yet: ${result.kept}.`;
		const how = result?.sentAs === "photo" ? "a photo" : "a document";
		const size = typeof result?.size === "number" ? ` (${result.size} bytes)` : "";
		return `Sent ${path} to the user's Telegram topic as ${how}${size}.`;
	}

	private awaitBinding(): Promise<Binding | undefined> {
		if (this.binding) return Promise.resolve(this.binding);
		return new Promise((done) => {
			const wake = () => {
				clearTimeout(timer);
				done(this.binding);
			};
			const timer = setTimeout(() => {
				this.rebindWaiters.delete(wake);
				done(undefined);
			}, REBIND_WAIT_MS);
			timer.unref();
			this.rebindWaiters.add(wake);
		});
	}

	private showStatus(key: string, text: string | null, tone: Tone): void {
		const ctx = this.binding?.ctx;
		if (!ctx?.hasUI) return;
		ctx.ui.setStatus(key, text === null ? undefined : colour(ctx, tone, text));
	}

	private cancelDialogs(): void {
		for (const dialog of this.dialogs) dialog.abort();
		this.dialogs.clear();
	}
}

/**
 * A failed run (its last model call ended with `stopReason: "error"`), held until pi
 * is seen to try again or not. pi tries a failed call again itself (docs/settings.md,
 * "Retry": by default 3 more tries, 2 s, 4 s and 8 s after the failure) and tells
 * extensions nothing of it (pi 0.73.1): `agent_end` comes before pi decides, the next
 * try is a new `agent_start`, and `auto_retry_*` reach RPC clients only. So:
 *
 * - a run that fails when pi will not try again (retries off, or the last try: pi's
 *   own settings say) is the turn's end at once, failed, with its error;
 * - else it is held. pi starting again (`agent_start`) makes it one try of the same
 *   turn: the relay hears nothing of its end. pi quiet once its delay for that try is
 *   past, a new prompt, a stop, or pi leaving make it the turn's end, failed.
 *
 * The relay hears of a failed turn once (`agent/ended {error}`), and an errored try's
 * text is never an answer (`turn/ended {error}`).
 */
class Failures {
	/** Failed runs in a row, as pi counts its tries (a model call that answers resets it). */
	private failed = 0;
	private held?: { params: Record<string, JsonValue>; timer: ReturnType<typeof setTimeout> };

	constructor(private readonly end: (params: JsonValue) => Promise<void>) {}

	/** A model call answered: the next failure is a first one again. */
	answered(): void {
		this.failed = 0;
	}

	/**
	 * A run started: true when it is pi trying a held failure again (the same turn for
	 * the relay), false for a turn of its own.
	 */
	resumed(): boolean {
		if (!this.held) {
			this.failed = 0;
			return false;
		}
		clearTimeout(this.held.timer);
		this.held = undefined;
		return true;
	}

	/** A run failed with `error` in `cwd`: its end, now or once pi did not try again. */
	async failedWith(error: string, cwd: string): Promise<void> {
		await this.settle({});
		this.failed += 1;
		const params = { error: clip(error, 2_000) };
		const delay = retryDelayMs(cwd, this.failed);
		if (delay === undefined) {
			this.failed = 0;
			await this.end(params);
			return;
		}
		this.held = { params, timer: this.timer(delay + RETRY_GRACE_MS) };
	}

	/** pi compacts the conversation, which a context overflow is followed by: the try after it may take long. */
	compacting(): void {
		if (this.held) this.rearm(COMPACTION_WAIT_MS);
	}

	/** The compaction is done: a try after it starts at once, or never. */
	compacted(): void {
		if (this.held) this.rearm(RETRY_GRACE_MS);
	}

	/** The held failure, if any, is the turn's end now (with `extra`, e.g. `aborted`). */
	async settle(extra: Record<string, JsonValue>): Promise<void> {
		const held = this.held;
		if (!held) return;
		clearTimeout(held.timer);
		this.held = undefined;
		this.failed = 0;
		await this.end({ ...held.params, ...extra });
	}

	private timer(ms: number): ReturnType<typeof setTimeout> {
		const timer = setTimeout(() => void this.settle({}), ms);
		// pi leaving is settled in `session_shutdown`; the timer keeps nobody alive.
		timer.unref();
		return timer;
	}

	private rearm(ms: number): void {
		if (!this.held) return;
		clearTimeout(this.held.timer);
		this.held.timer = this.timer(ms);
	}
}

/**
 * How long pi waits before it tries a failed run again for the `attempt`th time, by
 * its own reading of its settings (global and the project's); `undefined` when it will
 * not try again. Unreadable settings count as pi's documented defaults.
 */
function retryDelayMs(cwd: string, attempt: number): number | undefined {
	let settings = { enabled: true, maxRetries: 3, baseDelayMs: 2_000 };
	try {
		if (typeof SettingsManager?.create === "function") settings = SettingsManager.create(cwd).getRetrySettings();
	} catch {
		// a broken settings file: pi reads it the same way, with its defaults
	}
	if (!settings.enabled || attempt > settings.maxRetries) return undefined;
	return settings.baseDelayMs * 2 ** (attempt - 1);
}

function bridge(): Bridge {
	const store = globalThis as unknown as Record<symbol, Bridge | undefined>;
	let existing = store[GLOBAL_KEY];
	if (!existing) {
		existing = new Bridge(readManifest());
		store[GLOBAL_KEY] = existing;
	}
	return existing;
}

// ------------------------------------------------------------------- projections

/**
 * Relayed update ids already given to pi, oldest first (a Set keeps insertion
 * order). Process-global like the bridge, so a /reload that re-imports this
 * module keeps it.
 */
const seenUpdates: Set<number> = (() => {
	const store = globalThis as unknown as Record<symbol, Set<number> | undefined>;
	const key = Symbol.for("agent-relay.pi-extension.seen-updates");
	store[key] ??= new Set<number>();
	return store[key];
})();

const TONE_COLOURS = {
	info: "accent",
	success: "success",
	warning: "warning",
	error: "error",
	muted: "muted",
} as const;

function isTone(value: unknown): value is Tone {
	return typeof value === "string" && value in TONE_COLOURS;
}

/**
 * The argument completions for `prefix` (all text after the command's first space).
 * A word that is already complete gets none: while pi's TUI shows a list, Enter applies
 * the selected item instead of submitting, so offering `→ status` for `status` would
 * take a second Enter (pi-facts, "Command argument completions").
 */
function completeArgument(choices: string[], prefix: string): Array<{ value: string; label: string }> | null {
	const word = prefix.trim();
	if (choices.includes(word)) return null;
	const items = choices.filter((c) => c.startsWith(word)).map((c) => ({ value: c, label: c }));
	return items.length > 0 ? items : null;
}

/**
 * pi's theme paints with ANSI escapes, which only a terminal shows: an RPC client
 * (pi's stdout a pipe) gets the status text as it is.
 */
const TERMINAL = process.stdout.isTTY === true;

function colour(ctx: ExtensionContext, tone: Tone, text: string): string {
	if (!TERMINAL) return text;
	try {
		return ctx.ui.theme.fg(TONE_COLOURS[tone], text);
	} catch {
		return text; // no theme loaded (e.g. in tests of other hosts): plain text still informs
	}
}

function sessionInfo(ctx: ExtensionContext): { id: string; file?: string; name?: string } {
	const manager = ctx.sessionManager;
	const info: { id: string; file?: string; name?: string } = { id: manager.getSessionId() };
	const file = manager.getSessionFile();
	if (file) info.file = file;
	const name = manager.getSessionName();
	if (name) info.name = clip(name, 256);
	return info;
}

/** Cut to `max` UTF-16 units without splitting a surrogate pair. */
function clip(text: string, max: number = MAX_TEXT_UNITS): string {
	if (text.length <= max) return text;
	let end = max - 1;
	const last = text.charCodeAt(end - 1);
	if (last >= 0xd800 && last <= 0xdbff) end -= 1;
	return `${text.slice(0, end)}…`;
}

/** Tool arguments clipped for the wire: JSON of at most MAX_ARGS_UNITS, else a note. */
function clipArgs(args: unknown): unknown {
	try {
		const text = JSON.stringify(args ?? {});
		if (text.length <= MAX_TEXT_UNITS) return args ?? {};
		return { clipped: clip(text, MAX_ARGS_UNITS) };
	} catch {
		return {};
	}
}

/**
 * The pictures among a prompt's attachments, read as pi's image parts. A file that cannot
 * be read (removed meanwhile) is left out: the text still names its path.
 */
async function imagesOf(attachments: unknown): Promise<Array<{ type: "image"; data: string; mimeType: string }>> {
	if (!Array.isArray(attachments)) return [];
	const images: Array<{ type: "image"; data: string; mimeType: string }> = [];
	for (const item of attachments) {
		if (typeof item !== "object" || item === null) continue;
		const { kind, path, mimeType } = item as Record<string, unknown>;
		if (typeof path !== "string" || typeof mimeType !== "string" || !IMAGE_TYPES.has(mimeType)) continue;
		if (kind !== "photo" && kind !== "document") continue;
		try {
			if ((await stat(path)).size > MAX_IMAGE_BYTES) continue;
			images.push({ type: "image", data: (await readFile(path)).toString("base64"), mimeType });
		} catch {
			// gone or unreadable: the path in the text is all the model gets
		}
	}
	return images;
}

/** Whether a message ended because the run was stopped. */
function aborted(message: unknown): boolean {
	return (message as { stopReason?: unknown } | null)?.stopReason === "aborted";
}

/** The error a model call ended with, when it failed (`stopReason: "error"`). */
function failure(message: unknown): string | undefined {
	const { stopReason, errorMessage } = (message ?? {}) as { stopReason?: unknown; errorMessage?: unknown };
	if (stopReason !== "error") return undefined;
	return typeof errorMessage === "string" && errorMessage.trim() !== "" ? errorMessage : "the model call failed";
}

/** The text blocks of an assistant message, joined; other roles have none. */
function assistantText(message: unknown): string | undefined {
	if (typeof message !== "object" || message === null) return undefined;
	const { role, content } = message as { role?: unknown; content?: unknown };
	if (role !== "assistant") return undefined;
	if (typeof content === "string") return content;
	if (!Array.isArray(content)) return undefined;
	const parts = content
		.filter((block) => block?.type === "text" && typeof block.text === "string")
		.map((block) => block.text as string);
	return parts.length > 0 ? parts.join("\n") : undefined;
}

function toolCallNames(message: unknown): Array<{ name: string }> {
	const content = (message as { content?: unknown } | null)?.content;
	if (!Array.isArray(content)) return [];
	return content
		.filter((block) => block?.type === "toolCall" && typeof block.name === "string")
		.slice(0, MAX_TOOL_CALLS)
		.map((block) => ({ name: clip(block.name as string, 256) }));
}

// ------------------------------------------------------------------- the extension

export default function agentRelay(pi: ExtensionAPI): void {
	const relay = bridge();

	const registerCommands = (commands: CommandSpec[]): void => {
		for (const spec of commands) {
			const choices = spec.args && !/[[\]<>]/.test(spec.args) ? spec.args.split("|").map((c) => c.trim()) : [];
			pi.registerCommand(spec.name, {
				description: spec.args ? `${spec.description} — ${spec.args}` : spec.description,
				getArgumentCompletions: choices.length ? (prefix) => completeArgument(choices, prefix) : undefined,
				// `/relay restart` arrives as name `relay`, args `restart`: the sidecar parses both.
				handler: (args, ctx) => relay.execute(spec.name, args.trim(), ctx),
			});
		}
	};
	// Known before the sidecar answers, so pi lists them at once; the sidecar's own
	// list replaces this one when `initialize` returns.
	registerCommands(relay.commands);

	pi.on("session_start", (event, ctx) => {
		const first = !relay.sidecar?.alive;
		relay.bind({ pi, ctx, registerCommands });
		if (first) {
			// Not awaited: pi's startup must not wait for a slow sidecar.
			void relay.ensureStarted(ctx);
		} else {
			relay.notify("session/started", { reason: event.reason, session: sessionInfo(ctx) });
		}
	});

	pi.on("session_shutdown", async (event) => {
		// A failed run pi would have tried again: pi is leaving, so that was the turn's end.
		await relay.failures.settle({});
		relay.notify("session/shutdown", { reason: event.reason });
		relay.unbind(pi);
		if (event.reason === "quit") await relay.stop("quit");
	});

	pi.on("agent_start", () => {
		// pi trying a failed run again is the same turn for the relay.
		if (!relay.failures.resumed()) relay.notify("agent/started", {});
	});
	pi.on("agent_end", async (event, ctx) => {
		const error = failure(event.messages[event.messages.length - 1]);
		if (error !== undefined) {
			await relay.failures.failedWith(error, ctx.cwd);
			return;
		}
		let lastAssistantText: string | undefined;
		for (let i = event.messages.length - 1; i >= 0 && lastAssistantText === undefined; i--) {
			lastAssistantText = assistantText(event.messages[i]);
		}
		const last = event.messages[event.messages.length - 1];
		await relay.ended({
			...(lastAssistantText === undefined ? {} : { lastAssistantText: clip(lastAssistantText) }),
			...(aborted(last) ? { aborted: true } : {}),
		});
	});
	// The text as the model writes it, now and then: where the chat shows drafts (a private
	// chat) the sidecar shows it live; `turn/ended` still brings the whole.
	let writing: { text: string; timer?: ReturnType<typeof setTimeout> } = { text: "" };
	const sendWriting = (): void => {
		writing.timer = undefined;
		relay.notify("turn/text", { text: clip(writing.text) });
	};
	const stopWriting = (): void => {
		if (writing.timer !== undefined) clearTimeout(writing.timer);
		writing = { text: "" };
	};
	pi.on("message_update", (event) => {
		const type = event.assistantMessageEvent?.type;
		if (type !== "text_delta" && type !== "text_end") return;
		writing.text = assistantText(event.message) ?? "";
		if (writing.timer === undefined) writing.timer = setTimeout(sendWriting, WRITING_EVERY_MS);
	});
	pi.on("turn_start", () => {
		stopWriting();
		relay.notify("turn/started", {});
	});
	pi.on("turn_end", (event) => {
		stopWriting();
		// An errored try's text is broken (a stream cut mid-answer): the sidecar hears the
		// error with it, and never takes the text for an answer.
		const error = failure(event.message);
		if (error === undefined) relay.failures.answered();
		relay.notify("turn/ended", {
			assistantText: clip(assistantText(event.message) ?? ""),
			toolCalls: toolCallNames(event.message),
			...(aborted(event.message) ? { aborted: true } : {}),
			...(error === undefined ? {} : { error: clip(error, 2_000) }),
		});
	});
	// A context overflow is compacted, then tried again: that may take a while.
	pi.on("session_before_compact", () => relay.failures.compacting());
	pi.on("session_compact", () => relay.failures.compacted());
	pi.on("tool_execution_start", (event) =>
		relay.notify("tool/started", {
			toolName: clip(event.toolName, 256),
			toolCallId: clip(event.toolCallId, 256),
			args: clipArgs(event.args),
		}),
	);
	// Before a tool runs: the relay's approval policy decides (phone, terminal or
	// both); a denial blocks the call and its reason reaches the model.
	pi.on("tool_call", (event, ctx) => relay.approve(event.toolCallId, event.toolName, event.input, ctx.signal));
	pi.on("tool_execution_end", (event) =>
		relay.notify("tool/ended", { toolName: clip(event.toolName, 256), isError: event.isError === true }),
	);
	pi.on("input", (event) => {
		// A new prompt: a failed run held for pi's try again was the turn's end.
		void relay.failures.settle({});
		// A prompt typed at the keyboard: what follows is the person at the keyboard's turn.
		if (event.source !== "extension") relay.fromTelegram = false;
		relay.notify("input/received", { text: clip(event.text), source: event.source });
	});

	// The agent asks its user: on the phone (buttons, or a reply for free text) and at
	// the terminal; the first answer is the result.
	pi.registerTool({
		name: "ask_user",
		label: "Ask the user",
		description:
			"Ask the user a question and wait for the answer. The user may be away from the keyboard: the question also goes to their phone. Give options when the answer is one of a few choices.",
		parameters: Type.Object({
			question: Type.String({ description: "The question, one or two sentences." }),
			options: Type.Optional(Type.Array(Type.String(), { description: "Answers to choose from, if any." })),
			allowText: Type.Optional(Type.Boolean({ description: "Whether a written answer is welcome (default: when there are no options)." })),
		}),
		async execute(_toolCallId, params, signal) {
			const options = params.options ?? [];
			const allowText = params.allowText ?? options.length === 0;
			const text = await relay.ask(params.question, options, allowText, signal);
			return { content: [{ type: "text", text }], details: {} };
		},
	});

	// The agent shows the user a plot, a patch or a build artefact: the file goes into this
	// session's Telegram topic. The sidecar's leader checks the path (inside the working
	// directory, or a folder of `[files] send_from`) and its size; a refusal says why.
	pi.registerTool({
		name: "telegram_send_file",
		label: "Send a file to Telegram",
		description:
			"Send a file from the working directory to the user's Telegram chat for this session, with an optional caption. Pictures arrive as photos, other files as documents (at most 50 MB). Use it to show the user a plot, a screenshot, a patch or a build artefact.",
		parameters: Type.Object({
			path: Type.String({ description: "The file, relative to the working directory (or absolute, inside it)." }),
			caption: Type.Optional(Type.String({ description: "A short text shown under the file." })),
			as: Type.Optional(
				Type.String({ enum: ["photo", "document"], description: "Force a photo or a document; by default pictures go as photos." }),
			),
		}),
		async execute(_toolCallId, params, signal) {
			const text = await relay.sendFile(params.path, params.caption, params.as, signal);
			return { content: [{ type: "text", text }], details: {} };
		},
	});
}
