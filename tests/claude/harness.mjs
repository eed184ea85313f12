// Runs the real Claude Code (the version pinned in package.json) offline against
// the fake Anthropic API (fake-anthropic.mjs), in a scratch HOME and project dir.
// Every run has a deadline; the whole process group (Claude Code, its hooks, its
// MCP servers) is killed when a run ends, and the scratch dirs when the test ends.

import { spawn } from "node:child_process";
import { existsSync, readFileSync } from "node:fs";
import { mkdir, mkdtemp, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { claudeBin } from "./claude-bin.mjs";
import { FakeAnthropic } from "./fake-anthropic.mjs";

const here = dirname(fileURLToPath(import.meta.url));
export const HOOK = join(here, "fixtures", "hook.mjs");
export const MCP_SERVER = join(here, "fixtures", "mcp-server.mjs");
const RUN_MS = 60_000;

/** Resolves with `promise`, or rejects naming `what` once `ms` have passed. */
export function deadline(promise, ms, what) {
	let timer;
	const expired = new Promise((_, reject) => {
		timer = setTimeout(() => reject(new Error(`timed out after ${ms} ms waiting for ${what}`)), ms);
	});
	return Promise.race([promise, expired]).finally(() => clearTimeout(timer));
}

/** The JSON lines of a file (a hook's or MCP server's log); [] when it does not exist. */
export function readJsonLines(path) {
	if (!existsSync(path)) return [];
	return readFileSync(path, "utf8")
		.split("\n")
		.filter((line) => line.trim() !== "")
		.map((line) => JSON.parse(line));
}

function killGroup(pid, signal) {
	try {
		process.kill(-pid, signal);
	} catch {
		// already gone
	}
}

/** The hook events `agent-relay install claude-code` writes. */
export const RELAY_EVENTS = ["SessionStart", "UserPromptSubmit", "PreToolUse", "PostToolUse", "PermissionRequest", "Stop", "StopFailure", "SessionEnd"];

/**
 * The relay as `install claude-code` configures it, for `world`'s Claude Code:
 * `agent-relay mcp` and its hooks (binary `sidecar`) against the fake Bot API
 * `telegram`. Returns the `claude` arguments and the environment to run with.
 * `privateChat`: no group, the topics in the allowed user's private chat (the
 * default `setup` makes), where a turn shows as a draft.
 */
export async function relayConfig(world, telegram, sidecar, { log, privateChat = false } = {}) {
	const hooks = {};
	for (const event of RELAY_EVENTS) {
		const timeout = event === "PermissionRequest" ? 600 : 30;
		hooks[event] = [{ matcher: "", hooks: [{ type: "command", command: `${sidecar} hook ${event}`, timeout }] }];
	}
	const settings = await world.writeJson("relay-settings.json", { hooks });
	const mcp = await world.writeJson("relay-mcp.json", {
		mcpServers: { "agent-relay": { type: "stdio", command: sidecar, args: ["mcp"] } },
	});
	const env = {
		AGENT_RELAY_HOME: join(world.root, "relay"),
		TELEGRAM_BOT_TOKEN: telegram.token,
		...(privateChat ? {} : { AGENT_RELAY_CHAT_ID: String(telegram.chatId) }),
		AGENT_RELAY_ALLOWED_USERS: String(telegram.userId),
		AGENT_RELAY_API_URL: telegram.url,
		...(log ? { AGENT_RELAY_LOG: log } : {}),
	};
	return { args: ["--settings", settings, "--mcp-config", mcp, "--strict-mcp-config"], env };
}

export class World {
	constructor(root, fake) {
		this.root = root;
		this.fake = fake;
		this.home = join(root, "home");
		this.project = join(root, "project");
		this.tmp = join(root, "tmp");
	}

	/** A fresh world for test `t` (fake API, scratch HOME and project), torn down when `t` ends. */
	static async create(t) {
		const root = await mkdtemp(join(tmpdir(), "agent-relay-claude-"));
		const world = new World(root, null);
		t.after(() => world.destroy());
		world.fake = await FakeAnthropic.start();
		await mkdir(world.home, { recursive: true });
		await mkdir(world.project, { recursive: true });
		await mkdir(world.tmp, { recursive: true });
		return world;
	}

	/** Writes `value` as JSON to `<root>/<name>` and returns the path. */
	async writeJson(name, value) {
		const path = join(this.root, name);
		await writeFile(path, JSON.stringify(value, null, 2));
		return path;
	}

	/**
	 * A `--settings` file running fixtures/hook.mjs for each of `events` (logging to
	 * `<root>/hooks.jsonl`); `timeout` (seconds) is set on each hook when given.
	 */
	async hookSettings(events, { timeout } = {}) {
		this.hookLog = join(this.root, "hooks.jsonl");
		const hooks = {};
		for (const event of events) {
			const hook = { type: "command", command: `node ${HOOK} ${event}` };
			if (timeout !== undefined) hook.timeout = timeout;
			hooks[event] = [{ matcher: "", hooks: [hook] }];
		}
		return this.writeJson("settings.json", { hooks });
	}

	/** An `--mcp-config` file starting fixtures/mcp-server.mjs as server `agent-relay`. */
	async mcpConfig(env = {}) {
		this.mcpLog = join(this.root, "mcp.jsonl");
		return this.writeJson("mcp.json", {
			mcpServers: {
				"agent-relay": { type: "stdio", command: "node", args: [MCP_SERVER], env: { MCP_LOG: this.mcpLog, ...env } },
			},
		});
	}

	/**
	 * `claude -p <prompt> --output-format stream-json --verbose <args>` in the project
	 * dir, with nothing of the developer's environment but PATH. Resolves when it
	 * exits: `{ code, signal, events, result, stdout, stderr, ms }`.
	 */
	async run(prompt, { args = [], env = {}, ms = RUN_MS } = {}) {
		const started = Date.now();
		const child = spawn(claudeBin(), ["-p", prompt, "--output-format", "stream-json", "--verbose", ...args], {
			cwd: this.project,
			// Its own process group, so hooks and MCP servers die with it.
			detached: true,
			stdio: ["ignore", "pipe", "pipe"],
			env: this.env(env),
		});
		let stdout = "";
		let stderr = "";
		child.stdout.on("data", (c) => {
			stdout += c;
		});
		child.stderr.on("data", (c) => {
			stderr = (stderr + c).slice(-16384);
		});
		const exited = new Promise((done) => child.once("exit", (code, signal) => done({ code, signal })));
		let exit;
		try {
			exit = await deadline(exited, ms, `claude -p ${JSON.stringify(prompt)} to exit`);
		} catch (error) {
			killGroup(child.pid, "SIGKILL");
			throw new Error(`${error.message}; stderr: ${stderr}; stdout: ${stdout.slice(-4000)}`);
		} finally {
			killGroup(child.pid, "SIGKILL");
		}
		const events = stdout
			.split("\n")
			.filter((line) => line.trim() !== "")
			.map((line) => {
				try {
					return JSON.parse(line);
				} catch {
					return { type: "unparsed", line };
				}
			});
		return {
			...exit,
			events,
			result: events.find((e) => e.type === "result"),
			init: events.find((e) => e.type === "system" && e.subtype === "init"),
			stdout,
			stderr,
			ms: Date.now() - started,
		};
	}

	/**
	 * `claude <args>` (e.g. `plugin install …`) in the project dir, in the same
	 * environment as `run`; resolves with `{ code, stdout, stderr }` when it exits.
	 */
	async command(args, { env = {}, ms = RUN_MS } = {}) {
		const child = spawn(claudeBin(), args, {
			cwd: this.project,
			detached: true,
			stdio: ["ignore", "pipe", "pipe"],
			env: this.env(env),
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
			const code = await deadline(exited, ms, `claude ${args.join(" ")} to exit`);
			return { code, stdout, stderr };
		} finally {
			killGroup(child.pid, "SIGKILL");
		}
	}

	/**
	 * Nothing of the developer's environment but PATH, pointed at the fake; `env` is
	 * added, and a key set to `undefined` is left out.
	 */
	env(env = {}) {
		const proxy = this.fake.url;
		const all = {
			PATH: process.env.PATH,
			HOME: this.home,
			ANTHROPIC_BASE_URL: this.fake.url,
			ANTHROPIC_API_KEY: "dummy",
			// Without it Claude Code looks up api.anthropic.com and probes the base URL.
			CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC: "1",
			CLAUDE_CODE_DISABLE_OFFICIAL_MARKETPLACE_AUTOINSTALL: "1",
			DISABLE_TELEMETRY: "1",
			DISABLE_AUTOUPDATER: "1",
			// A safety net: any other HTTP(S) Claude Code tries goes to the fake as a
			// proxy request, which refuses it and records it in `fake.unknown`.
			HTTPS_PROXY: proxy,
			HTTP_PROXY: proxy,
			NO_PROXY: "127.0.0.1,localhost",
			// Claude Code keeps per-session scratch (and its messaging socket) under the
			// temp dir: inside the world, so nothing is left in /tmp.
			TMPDIR: this.tmp,
			CLAUDE_CODE_TMPDIR: this.tmp,
			HOOK_LOG: this.hookLog ?? join(this.root, "hooks.jsonl"),
			...env,
		};
		return Object.fromEntries(Object.entries(all).filter(([, value]) => value !== undefined));
	}

	hooks() {
		return readJsonLines(this.hookLog);
	}

	mcp() {
		return readJsonLines(this.mcpLog);
	}

	async destroy() {
		await this.fake?.stop();
		// Claude Code and the relay's sidecar may still be writing their last
		// files as a test ends: Node retries ENOTEMPTY/EBUSY with a backoff.
		await rm(this.root, { recursive: true, force: true, maxRetries: 10, retryDelay: 100 });
	}
}
