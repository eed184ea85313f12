// A world for the real OpenCode (pinned in package-lock.json) run offline: a scratch
// HOME (its XDG folders under it), OpenCode's configuration naming the fake
// OpenAI-compatible provider (fake-openai-compatible.mjs) as its model, the fake Bot
// API as Telegram, and `agent-relay opencode` with OpenCode's terminal UI inside a
// tmux session of its own (a real pseudo-terminal, keys sent, the screen read); or
// `agent-relay serve` launching `opencode serve` from `/new … opencode`.

import assert from "node:assert/strict";
import { execFile, spawn } from "node:child_process";
import { existsSync, readFileSync, readlinkSync } from "node:fs";
import { mkdir, mkdtemp, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";
import { processesOf, treeOf } from "../codex/harness.mjs";
import { CHAT_ID, deadline, eventually, FakeBotApi, isOpen, isRunning, isSettled, REPO, Serve, USER_ID } from "../pi/harness.mjs";
import { FakeOpenAICompatible } from "./fake-openai-compatible.mjs";

export { CHAT_ID, deadline, eventually, isOpen, isRunning, isSettled, processesOf, treeOf, USER_ID };
const here = dirname(fileURLToPath(import.meta.url));
const run = promisify(execFile);

export const SIDECAR = process.env.AGENT_RELAY_BIN || join(REPO, "target", "debug", "agent-relay");

/**
 * The native binary of the platform package npm installed (`opencode-ai`'s
 * `bin/opencode.exe` is a copy its install script makes, which `npm ci
 * --ignore-scripts` skips): the baseline build on a CPU without AVX2, as that
 * script chooses.
 */
export const OPENCODE = (() => {
	const avx2 = /(^|\s)avx2(\s|$)/.test(readFileSync("/proc/cpuinfo", "utf8"));
	return join(here, "node_modules", avx2 ? "opencode-linux-x64" : "opencode-linux-x64-baseline", "bin", "opencode");
})();

/** The first button of `message` whose label holds `label`: its callback data. */
export function button(message, label) {
	const found = (message.reply_markup?.inline_keyboard ?? []).flat().find((b) => b.text.includes(label));
	assert.ok(found, `no ${label} in ${JSON.stringify(message.reply_markup)}`);
	return found.callback_data;
}

export class World {
	/**
	 * `permission`: OpenCode's `permission` setting (by default a shell command asks
	 * first, so approvals reach the phone); `relayConfig`: lines of the relay's
	 * config.toml; `privateChat`: no group, the topics in the allowed user's
	 * private chat (where a turn shows as a draft).
	 */
	static async create(t, { permission = { bash: "ask" }, relayConfig = [], privateChat = false } = {}) {
		assert.ok(existsSync(SIDECAR), `${SIDECAR} is missing: run \`cargo build --bins\` first`);
		assert.ok(existsSync(OPENCODE), `${OPENCODE} is missing: run \`npm ci --prefix tests/opencode\` first`);
		const world = new World();
		world.root = await mkdtemp(join(tmpdir(), "agent-relay-opencode-"));
		world.home = join(world.root, "home");
		world.project = join(world.root, "project");
		world.relayHome = join(world.root, "relay");
		const config = join(world.home, ".config", "opencode");
		for (const dir of [config, world.project]) await mkdir(dir, { recursive: true });
		world.fake = await FakeOpenAICompatible.start();
		world.telegram = await FakeBotApi.start();
		world.tmux = `agent-relay-opencode-${process.pid}-${Date.now()}`;
		world.serves = [];
		t.after(() => world.stop());
		world.opencodeConfig = join(config, "opencode.json");
		await writeFile(
			world.opencodeConfig,
			JSON.stringify(
				{
					$schema: "https://opencode.ai/config.json",
					provider: world.fake.provider({ more: ["other-model"] }),
					// Only the fake's models: OpenCode's own free provider needs the network.
					enabled_providers: ["fake"],
					model: "fake/fake-model",
					autoupdate: false,
					share: "disabled",
					permission,
				},
				null,
				2,
			),
		);
		if (relayConfig.length > 0) {
			await mkdir(join(world.relayHome, "config"), { recursive: true, mode: 0o700 });
			await writeFile(join(world.relayHome, "config", "config.toml"), `${relayConfig.join("\n")}\n`, { mode: 0o600 });
		}
		world.env = {
			PATH: process.env.PATH,
			HOME: world.home,
			XDG_CONFIG_HOME: join(world.home, ".config"),
			XDG_DATA_HOME: join(world.home, ".local", "share"),
			XDG_CACHE_HOME: join(world.home, ".cache"),
			XDG_STATE_HOME: join(world.home, ".local", "state"),
			TERM: "xterm-256color",
			// Nothing from the network: no update check, no models.dev catalogue.
			OPENCODE_DISABLE_AUTOUPDATE: "1",
			OPENCODE_DISABLE_MODELS_FETCH: "1",
			OPENCODE_DISABLE_LSP_DOWNLOAD: "1",
			// OpenCode now and then opens an HTTPS connection of its own at start
			// (docs/OPENCODE.md): through a proxy that is a closed port of this
			// machine it goes nowhere; the fakes on 127.0.0.1 are reached directly.
			HTTP_PROXY: "http://127.0.0.1:9",
			HTTPS_PROXY: "http://127.0.0.1:9",
			http_proxy: "http://127.0.0.1:9",
			https_proxy: "http://127.0.0.1:9",
			NO_PROXY: "127.0.0.1,localhost",
			no_proxy: "127.0.0.1,localhost",
			AGENT_RELAY_OPENCODE_BIN: OPENCODE,
			AGENT_RELAY_HOME: world.relayHome,
			TELEGRAM_BOT_TOKEN: world.telegram.token,
			// Without a group the topics are in the allowed user's private chat.
			...(privateChat ? {} : { AGENT_RELAY_CHAT_ID: String(CHAT_ID) }),
			AGENT_RELAY_ALLOWED_USERS: String(USER_ID),
			AGENT_RELAY_API_URL: world.telegram.url,
			AGENT_RELAY_LOG: "debug",
		};
		return world;
	}

	/** `agent-relay opencode [args]` in a tmux window; resolves once the wrapper runs. */
	async wrapper(args = []) {
		const script = join(this.root, `wrapper-${Date.now()}.sh`);
		this.exitFile = `${script}.exit`;
		const exports = Object.entries(this.env)
			.map(([k, v]) => `export ${k}='${String(v).replaceAll("'", "'\\''")}'`)
			.join("\n");
		await writeFile(
			script,
			`${exports}\ncd '${this.project}'\necho $$ > '${script}.pid'\n'${SIDECAR}' opencode ${args.map((a) => `'${a}'`).join(" ")} 2> '${script}.stderr'\necho $? > '${this.exitFile}'\n`,
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

	/** Types `text` into the TUI's prompt and sends it (Enter a moment later, not read as a paste). */
	async type(text) {
		await this.shows(/Ask anything|Build ·/, 30_000, "the TUI's prompt");
		await this.keys("-l", text);
		await new Promise((done) => setTimeout(done, 300));
		await this.keys("Enter");
	}

	/** Quits the TUI as a person does: Ctrl-C on an empty prompt (twice if it asks). */
	async quit() {
		const gone = () => existsSync(this.exitFile);
		for (let attempt = 0; attempt < 4 && !gone(); attempt++) {
			await this.keys("C-c");
			await eventually(gone, 2_000, "the TUI to quit").catch(() => {});
		}
	}

	/** Waits for the screen to show `pattern`. */
	shows(pattern, ms = 30_000, what = String(pattern)) {
		return eventually(async () => pattern.test(await this.screen()) && (await this.screen()), ms, `the terminal to show ${what}`).catch(async (error) => {
			throw new Error(`${error.message}\nscreen:\n${await this.screen().catch(() => "?")}\nstderr:\n${this.stderr()}`);
		});
	}

	/** The wrapper's exit code, once it exited. */
	exited(ms = 30_000) {
		const code = () => existsSync(this.exitFile) && readFileSync(this.exitFile, "utf8").trim();
		return eventually(code, ms, "the wrapper to exit").then(Number, async (error) => {
			throw new Error(`${error.message}\nscreen:\n${await this.screen().catch(() => "?")}\nstderr:\n${this.stderr()}`);
		});
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

	/** The open message in `threadId` (a permission ask, a question) that mentions `text`. */
	asked(threadId, text, ms = 30_000) {
		return eventually(
			async () => (await this.telegram.messages(threadId)).find((m) => isOpen(m) && m.plain_text.includes(text)),
			ms,
			`the message on the phone about ${text}`,
		);
	}

	/** Waits until message `messageId` is settled (its buttons gone); it then. */
	settled(messageId, ms = 20_000) {
		return eventually(async () => {
			const m = await this.telegram.message(messageId);
			return isSettled(m) && m;
		}, ms, "the message to close");
	}

	/**
	 * Starts `agent-relay serve` launching OpenCode (`[launch.commands] opencode` = the
	 * pinned binary, `[launch] roots` = the world's root, so `/new project opencode` is
	 * the world's project) and waits until it is on the relay's bus.
	 */
	async serve(extra = []) {
		const dir = join(this.relayHome, "config");
		await mkdir(dir, { recursive: true, mode: 0o700 });
		const config = join(dir, "config.toml");
		const before = existsSync(config) ? readFileSync(config, "utf8") : "";
		if (!before.includes("[launch]")) {
			await writeFile(
				config,
				[before, "[launch]", `roots = ${JSON.stringify([this.root])}`, `engine = "opencode"`, ...extra, "[launch.commands]", `opencode = ${JSON.stringify([OPENCODE])}`, ""].join("\n"),
				{ mode: 0o600 },
			);
		}
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

	/** OpenCode's servers of this world (run in its project) still running. */
	servers() {
		const cwd = (pid) => {
			try {
				return readlinkSync(`/proc/${pid}/cwd`);
			} catch {
				return "";
			}
		};
		return processesOf(OPENCODE).filter((p) => p.cmdline.includes(" serve ") && cwd(p.pid) === this.project);
	}

	async stop() {
		await Promise.allSettled(this.serves.map((serve) => serve.stop()));
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
