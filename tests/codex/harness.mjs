// A world for the real Codex CLI (pinned in package-lock.json) run offline: a
// scratch HOME and CODEX_HOME, a fake Responses API (fake-openai.mjs), the fake
// Bot API as Telegram, and `agent-relay codex` with Codex's terminal UI inside a
// tmux session of its own (a real pseudo-terminal, keys sent, the screen read).

import assert from "node:assert/strict";
import { execFile, spawn } from "node:child_process";
import { existsSync, readdirSync, readFileSync } from "node:fs";
import { mkdir, mkdtemp, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";
import { CHAT_ID, deadline, eventually, FakeBotApi, isOpen, isRunning, isSettled, REPO, Serve, USER_ID } from "../pi/harness.mjs";
import { FakeOpenAI } from "./fake-openai.mjs";

export { CHAT_ID, deadline, eventually, isOpen, isRunning, isSettled, USER_ID };
const here = dirname(fileURLToPath(import.meta.url));
const run = promisify(execFile);

export const SIDECAR = process.env.AGENT_RELAY_BIN || join(REPO, "target", "debug", "agent-relay");
/** The native binary the npm package unpacks (`bin/codex.js` only execs it). */
export const CODEX = join(here, "node_modules", "@openai", "codex-linux-x64", "vendor", "x86_64-unknown-linux-musl", "bin", "codex");

/** Every process id whose parent chain leads to `root` (the root included). */
export function treeOf(root) {
	const parents = new Map();
	for (const entry of readdirSync("/proc")) {
		if (!/^\d+$/.test(entry)) continue;
		try {
			const stat = readFileSync(`/proc/${entry}/stat`, "utf8");
			parents.set(Number(entry), Number(stat.slice(stat.lastIndexOf(")") + 2).split(" ")[1]));
		} catch {
			// gone while we looked
		}
	}
	const tree = new Set([root]);
	for (let grew = true; grew; ) {
		grew = false;
		for (const [pid, ppid] of parents) {
			if (!tree.has(pid) && tree.has(ppid)) {
				tree.add(pid);
				grew = true;
			}
		}
	}
	return [...tree].filter(isRunning);
}

/** Live processes that run `program` (by /proc/PID/exe). */
export function processesOf(program) {
	const found = [];
	for (const entry of readdirSync("/proc")) {
		if (!/^\d+$/.test(entry)) continue;
		try {
			const exe = readFileSync(`/proc/${entry}/cmdline`, "utf8");
			if (exe.startsWith(program) && isRunning(Number(entry))) found.push({ pid: Number(entry), cmdline: exe.split("\0").join(" ") });
		} catch {
			// gone while we looked
		}
	}
	return found;
}

/**
 * The fake model's steps to call the relay's `send_file` with `args`. Codex (0.171,
 * this model) defers MCP servers' tools behind its `tool_search`: the model searches,
 * then calls the tool in the namespace the search found, the relay's server's.
 */
export function relaySendFile(t, args) {
	return [
		{ search: { query: "send file telegram", limit: 8 } },
		(record) => {
			const found = record.body.input.findLast((i) => i?.type === "tool_search_output");
			const relay = found?.tools?.find((tool) => tool.type === "namespace" && tool.tools.some((f) => f.name === "send_file"));
			t.diagnostic(`Codex's tool search found the relay's tool as: ${JSON.stringify(relay)}`);
			assert.equal(relay?.name, "mcp__agent_relay", "the relay's MCP server under its name");
			return { call: { name: "send_file", namespace: relay.name, arguments: args } };
		},
	];
}

export class World {
	/**
	 * `features`: lines added to `[features]` of Codex's config.toml; `provider`:
	 * lines added to the fake model's `[model_providers.fake]` (its retries).
	 */
	static async create(t, { features = [], provider = [] } = {}) {
		assert.ok(existsSync(SIDECAR), `${SIDECAR} is missing: run \`cargo build --bins\` first`);
		assert.ok(existsSync(CODEX), `${CODEX} is missing: run \`npm ci --prefix tests/codex\` first`);
		const world = new World();
		world.root = await mkdtemp(join(tmpdir(), "agent-relay-codex-"));
		world.home = join(world.root, "home");
		world.codexHome = join(world.home, ".codex");
		world.project = join(world.root, "project");
		world.relayHome = join(world.root, "relay");
		for (const dir of [world.codexHome, world.project]) await mkdir(dir, { recursive: true });
		world.fake = await FakeOpenAI.start();
		world.telegram = await FakeBotApi.start();
		world.tmux = `agent-relay-codex-${process.pid}-${Date.now()}`;
		world.serves = [];
		t.after(() => world.stop());
		await writeFile(
			join(world.codexHome, "config.toml"),
			[
				'model = "gpt-5.5"',
				'model_provider = "fake"',
				"check_for_update_on_startup = false",
				"[model_providers.fake]",
				'name = "fake"',
				`base_url = "${world.fake.url}/v1"`,
				'wire_api = "responses"',
				'env_key = "FAKE_OPENAI_KEY"',
				...provider,
				"[features]",
				"plugins = false",
				"apps = false",
				"unbounded_connection_retries = false",
				...features,
				"[analytics]",
				"enabled = false",
				"[notice.model_migrations]",
				'"gpt-5.5" = "gpt-6-sol"',
				`[projects."${world.project}"]`,
				'trust_level = "trusted"',
				"",
			].join("\n"),
		);
		world.env = {
			PATH: process.env.PATH,
			HOME: world.home,
			CODEX_HOME: world.codexHome,
			FAKE_OPENAI_KEY: "dummy",
			TERM: "xterm-256color",
			AGENT_RELAY_CODEX_BIN: CODEX,
			AGENT_RELAY_HOME: world.relayHome,
			TELEGRAM_BOT_TOKEN: world.telegram.token,
			AGENT_RELAY_CHAT_ID: String(CHAT_ID),
			AGENT_RELAY_ALLOWED_USERS: "1001",
			AGENT_RELAY_API_URL: world.telegram.url,
			AGENT_RELAY_LOG: "debug",
		};
		return world;
	}

	/** `agent-relay codex [args]` in a tmux window; resolves once the wrapper runs. */
	async wrapper(args = []) {
		const script = join(this.root, `wrapper-${Date.now()}.sh`);
		this.exitFile = `${script}.exit`;
		const exports = Object.entries(this.env)
			.map(([k, v]) => `export ${k}='${String(v).replaceAll("'", "'\\''")}'`)
			.join("\n");
		await writeFile(
			script,
			`${exports}\ncd '${this.project}'\necho $$ > '${script}.pid'\n'${SIDECAR}' codex ${args.map((a) => `'${a}'`).join(" ")} 2> '${script}.stderr'\necho $? > '${this.exitFile}'\n`,
		);
		const existing = await this.tmuxRun(["has-session", "-t", "t"]).then(
			() => true,
			() => false,
		);
		if (existing) await this.tmuxRun(["respawn-pane", "-k", "-t", "t", `bash '${script}'`]);
		else await this.tmuxRun(["new-session", "-d", "-x", "160", "-y", "48", "-s", "t", `bash '${script}'; sleep 600`]);
		this.stderrFile = `${script}.stderr`;
		const shell = await eventually(() => existsSync(`${script}.pid`) && Number(readFileSync(`${script}.pid`, "utf8")), 10_000, "the wrapper's shell");
		this.wrapperPid = await eventually(
			() => treeOf(shell).find((pid) => pid !== shell && readFileSync(`/proc/${pid}/cmdline`, "utf8").startsWith(SIDECAR)),
			10_000,
			"the wrapper",
		);
		return this.wrapperPid;
	}

	tmuxRun(args) {
		return run("tmux", ["-L", this.tmux, ...args], { env: { ...process.env, TMUX: "" } });
	}

	async screen() {
		const { stdout } = await this.tmuxRun(["capture-pane", "-p", "-t", "t"]);
		return stdout;
	}

	/** Keys to the TUI (tmux key names: `Enter`, `C-c`; plain text is typed). */
	keys(...keys) {
		return this.tmuxRun(["send-keys", "-t", "t", ...keys]);
	}

	/**
	 * Quits the TUI as a person does: Ctrl-C on an idle composer, which quits
	 * at once or asks for a second Ctrl-C ("again to quit"), as the TUI's
	 * state has it. A Ctrl-C that met something still finishing (it
	 * interrupts instead) is followed by another try.
	 */
	async quit() {
		const gone = () => existsSync(this.exitFile);
		for (let attempt = 0; attempt < 3 && !gone(); attempt++) {
			await this.keys("C-c");
			const next = await eventually(
				async () => (gone() ? "gone" : /again to quit/.test(await this.screen().catch(() => "")) && "hint"),
				3_000,
				"the TUI to quit or offer to",
			).catch(() => "neither");
			if (next === "hint") await this.keys("C-c").catch(() => {});
			if (next !== "neither") return;
		}
	}

	/** Waits for the screen to show `pattern`. */
	shows(pattern, ms = 30_000, what = String(pattern)) {
		return eventually(async () => pattern.test(await this.screen()) && (await this.screen()), ms, `the terminal to show ${what}`);
	}

	/** The wrapper's exit code, once it exited. */
	exited(ms = 30_000) {
		const code = () => existsSync(this.exitFile) && readFileSync(this.exitFile, "utf8").trim();
		return eventually(code, ms, "the wrapper to exit").then(Number, 
			async (error) => {
				throw new Error(`${error.message}\nscreen:\n${await this.screen().catch(() => "?")}\nstderr:\n${this.stderr()}`);
			},
		);
	}

	stderr() {
		return this.stderrFile && existsSync(this.stderrFile) ? readFileSync(this.stderrFile, "utf8") : "";
	}

	/** The one live topic. */
	async topic() {
		const topics = await eventually(async () => {
			const live = (await this.telegram.topics()).filter((t) => !t.deleted);
			return live.length > 0 && live;
		}, 30_000, "the session's topic").catch(async (error) => {
			throw new Error(`${error.message}\nscreen:\n${await this.screen().catch(() => "?")}\nstderr:\n${this.stderr()}`);
		});
		assert.equal(topics.length, 1, JSON.stringify(topics));
		return topics[0];
	}

	/** Runs a program to its end (the hooks mode's `codex exec`, `install`). */
	exec(program, args, { env = {}, ms = 60_000 } = {}) {
		return new Promise((done, fail) => {
			const child = spawn(program, args, { cwd: this.project, env: { ...this.env, ...env }, stdio: ["ignore", "pipe", "pipe"] });
			let stdout = "";
			let stderr = "";
			child.stdout.on("data", (c) => {
				stdout += c;
			});
			child.stderr.on("data", (c) => {
				stderr += c;
			});
			const timer = setTimeout(() => {
				child.kill("SIGKILL");
				fail(new Error(`${program} ${args.join(" ")} took over ${ms} ms\n${stderr}`));
			}, ms);
			child.on("exit", (code) => {
				clearTimeout(timer);
				done({ code, stdout, stderr });
			});
		});
	}

	/**
	 * Starts `agent-relay serve` launching Codex (`[launch.commands] codex` = the pinned
	 * binary, `[launch] roots` = the world's root, so `/new project codex` is the world's
	 * project) and waits until it is on the relay's bus. Its environment is the world's:
	 * the token there too, which serve gives no agent.
	 */
	async serve() {
		const dir = join(this.relayHome, "config");
		await mkdir(dir, { recursive: true, mode: 0o700 });
		await writeFile(
			join(dir, "config.toml"),
			["[launch]", `roots = ${JSON.stringify([this.root])}`, `engine = "codex"`, "[launch.commands]", `codex = ${JSON.stringify([CODEX])}`, ""].join("\n"),
			{ mode: 0o600 },
		);
		const child = spawn(SIDECAR, ["serve"], { cwd: this.root, stdio: ["ignore", "pipe", "pipe"], env: this.env });
		const serve = new Serve(child);
		this.serves.push(serve);
		await eventually(async () => (await this.relayStatus()).includes(`serve: pid ${serve.pid}`), 60_000, `serve on the bus: ${serve.stderr}`);
		return serve;
	}

	/** What `agent-relay status` prints now ("" while no leader runs). */
	async relayStatus() {
		const child = spawn(SIDECAR, ["status"], { cwd: this.root, stdio: ["ignore", "pipe", "ignore"], env: this.env });
		let out = "";
		child.stdout.on("data", (c) => {
			out += c;
		});
		await deadline(new Promise((done) => child.once("exit", done)), 15_000, "agent-relay status");
		return out;
	}

	async stop() {
		await Promise.allSettled(this.serves.map((serve) => serve.stop()));
		// The wrapper's tree, before tmux goes (its SIGHUP ends the TUI, and
		// the wrapper then stops its app-server, which still writes to
		// CODEX_HOME for a moment).
		const tree = this.wrapperPid ? treeOf(this.wrapperPid) : [];
		await this.tmuxRun(["kill-server"]).catch(() => {});
		await eventually(() => tree.every((pid) => !isRunning(pid)), 15_000, "the wrapper's processes to end").catch(() => {
			for (const pid of tree.filter(isRunning)) process.kill(pid, "SIGKILL");
		});
		await this.fake.stop();
		await this.telegram.stop();
		if (!process.env.KEEP_WORLD) await rm(this.root, { recursive: true, force: true, maxRetries: 5, retryDelay: 200 });
	}
}
