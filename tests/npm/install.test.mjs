// The npm packages as a person gets them, offline. scripts/npm-pack builds them
// from this checkout's binary (the platform package of this machine and the
// main package), they are published to a real registry on 127.0.0.1
// (verdaccio, registry.mjs), and installed in a home whose PATH has no cargo,
// no rustc and no checkout:
//
// * `npm i -g agent-relay`: `--version` names this commit, `demo` passes,
//   `npx agent-relay doctor` runs; `npm uninstall -g` leaves no binary; again
//   from npm's cache alone, with install scripts off;
// * the launcher: exit status and signals pass through, and the binary does
//   not outlive the launcher's parent; a project install without optional
//   dependencies, and Windows, are told in a sentence;
// * `pi install npm:agent-relay`: a real pi session (fake model) runs the
//   package's own binary, gets its topic and answers from the phone; `pi
//   remove` leaves no binary;
// * the Claude Code plugin from this repository's marketplace runs the
//   npm-installed binary: a `claude -p` turn's answer lands in its topic.

import assert from "node:assert/strict";
import { execFileSync, spawn } from "node:child_process";
import { randomUUID } from "node:crypto";
import { closeSync, existsSync, openSync, readFileSync, readdirSync, realpathSync, symlinkSync } from "node:fs";
import { mkdir, mkdtemp, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { delimiter, join } from "node:path";
import { after, before, test } from "node:test";
import { World as ClaudeWorld } from "../claude/harness.mjs";
import { CHAT_ID, FakeBotApi, World as PiWorld, eventually, isRunning } from "../pi/harness.mjs";
import { BINARY, REPO, Registry, packPackages, personEnv, run } from "./registry.mjs";

const TEST_MS = 240_000;
const PLATFORM = `${process.platform}-${process.arch}`;
/** Where `npm i -g` puts the binary under its prefix: the platform package, nested in the main one. */
const NATIVE = join("lib", "node_modules", "agent-relay", "node_modules", `agent-relay-${PLATFORM}`, "bin", "agent-relay");
const VERSION = JSON.parse(readFileSync(join(REPO, "package.json"), "utf8")).version;
/** What the binary's --version names: this checkout's commit (build.rs). */
const COMMIT = execFileSync("git", ["rev-parse", "--short=12", "HEAD"], { cwd: REPO, encoding: "utf8" }).trim();

let root;
let registry;

before(async () => {
	root = await mkdtemp(join(tmpdir(), "agent-relay-npm-"));
	const { tarballs, report } = await packPackages(join(root, "packages"));
	console.log(`# scripts/npm-pack --binary ${BINARY}\n${report.replaceAll(/^/gm, "#   ")}`);
	registry = await Registry.start(join(root, "registry"));
	for (const tarball of tarballs) await registry.publish(tarball);
});

after(async () => {
	await registry?.stop();
	if (root) await rm(root, { recursive: true, force: true, maxRetries: 10, retryDelay: 100 });
});

/** A fresh person: a home, an npm prefix and an npm cache of their own. */
async function person(name, options = {}) {
	const dir = join(root, name);
	const home = options.home ?? join(dir, "home");
	await mkdir(home, { recursive: true });
	const prefix = join(dir, "prefix");
	const cache = options.cache ?? join(dir, "npm-cache");
	const env = personEnv({ home, prefix, cache, registry, ...options });
	return { dir, home, prefix, cache, env };
}

/** Every file, folder and link under `dir` named `name`. */
function named(dir, name) {
	if (!existsSync(dir)) return [];
	return readdirSync(dir, { recursive: true, withFileTypes: true })
		.filter((entry) => entry.name === name)
		.map((entry) => join(entry.parentPath ?? entry.path, entry.name));
}

/** The live processes whose parent is `pid`. */
function childrenOf(pid) {
	return readdirSync("/proc")
		.filter((entry) => /^\d+$/.test(entry))
		.filter((entry) => {
			try {
				const stat = readFileSync(`/proc/${entry}/stat`, "utf8");
				return Number(stat.slice(stat.lastIndexOf(")") + 2).split(" ")[1]) === pid && isRunning(Number(entry));
			} catch {
				return false;
			}
		})
		.map(Number);
}

/** Kills `pids` (SIGKILL) when test `t` ends, should the test have left any. */
function reap(t, pids) {
	t.after(() => {
		for (const pid of pids) if (isRunning(pid)) process.kill(pid, "SIGKILL");
	});
}

test("npm i -g agent-relay installs and runs without a Rust toolchain; npm uninstall -g leaves no binary", { timeout: TEST_MS }, async () => {
	const me = await person("first");
	const toolchain = await run("sh", ["-c", "command -v cargo; command -v rustc"], { env: me.env });
	assert.equal(toolchain.stdout, "", "no cargo or rustc on this PATH");
	assert.ok(!me.env.PATH.split(delimiter).includes(REPO), "no checkout on this PATH");

	const started = Date.now();
	const installed = await run("npm", ["install", "--global", "agent-relay"], { env: me.env, cwd: me.home });
	assert.equal(installed.code, 0, `${installed.stdout}\n${installed.stderr}`);
	const version = await run("agent-relay", ["--version"], { env: me.env, cwd: me.home });
	assert.equal(version.stdout.trim(), `agent-relay ${VERSION} (${COMMIT})`, version.stderr);
	const demo = await run("agent-relay", ["demo"], { env: me.env, cwd: me.home });
	assert.equal(demo.code, 0, `${demo.stdout}\n${demo.stderr}`);
	assert.match(demo.stdout, /failover in \d+ ms/);
	const seconds = (Date.now() - started) / 1000;
	console.log(`# npm i -g agent-relay to a passing agent-relay demo: ${seconds.toFixed(1)} s (npm i: ${(installed.ms / 1000).toFixed(1)} s)`);

	// npx finds the installed package; the doctor's exit status (1: no token here) comes through the launcher.
	const doctor = await run("npx", ["--no-install", "agent-relay", "doctor"], { env: me.env, cwd: me.home });
	assert.match(doctor.stdout, /✗ token: no bot token configured/, doctor.stderr);
	assert.equal(doctor.code, 1, doctor.stderr);

	const removed = await run("npm", ["uninstall", "--global", "agent-relay"], { env: me.env, cwd: me.home });
	assert.equal(removed.code, 0, removed.stderr);
	assert.deepEqual(named(me.prefix, "agent-relay"), [], "no agent-relay left under npm's prefix");
	assert.deepEqual(named(me.prefix, `agent-relay-${PLATFORM}`), []);
});

test("npm installs it with install scripts off, and again from its cache alone", { timeout: TEST_MS }, async () => {
	const online = await person("online", { env: { npm_config_ignore_scripts: "true" } });
	const first = await run("npm", ["install", "--global", "agent-relay"], { env: online.env, cwd: online.home });
	assert.equal(first.code, 0, first.stderr);
	// A second prefix, the same cache (npm keys it by the registry's URL), and a
	// proxy nobody answers at, should npm try the network at all.
	const offline = await person("offline", {
		cache: online.cache,
		env: { npm_config_ignore_scripts: "true", npm_config_proxy: "http://127.0.0.1:9/" },
	});
	const again = await run("npm", ["install", "--global", "--offline", "agent-relay"], { env: offline.env, cwd: offline.home });
	assert.equal(again.code, 0, `${again.stdout}\n${again.stderr}`);
	const version = await run("agent-relay", ["--version"], { env: offline.env, cwd: offline.home });
	assert.equal(version.stdout.trim(), `agent-relay ${VERSION} (${COMMIT})`, version.stderr);
});

test("the launcher passes on exit status and signals, and the binary does not outlive its parent", { timeout: TEST_MS }, async (t) => {
	const me = await person("launcher");
	const installed = await run("npm", ["install", "--global", "agent-relay"], { env: me.env, cwd: me.home });
	assert.equal(installed.code, 0, installed.stderr);
	const launcher = join(me.prefix, "bin", "agent-relay");
	const native = realpathSync(join(me.prefix, NATIVE));
	const binaryUnder = async (pid) => {
		const [child] = await eventually(() => childrenOf(pid).length > 0 && childrenOf(pid), 15_000, "the binary under the launcher");
		assert.equal(realpathSync(`/proc/${child}/exe`), native);
		return child;
	};

	const usage = await run(launcher, ["no-such-command"], { env: me.env });
	assert.equal(usage.code, 2, "clap's usage error, as the binary exits");
	assert.match(usage.stderr, /unrecognized subcommand 'no-such-command'/);

	// SIGTERM to the launcher reaches the binary (`stdio` stops on it), and both are gone.
	const direct = spawn(launcher, ["stdio"], { env: me.env, cwd: me.home, stdio: ["pipe", "ignore", "ignore"] });
	const directExit = new Promise((done) => direct.once("exit", (code, signal) => done({ code, signal })));
	const binary = await binaryUnder(direct.pid);
	reap(t, [direct.pid, binary]);
	direct.kill("SIGTERM");
	await eventually(() => !isRunning(binary), 15_000, "the binary to stop on the launcher's SIGTERM");
	assert.deepEqual(await directExit, { code: 0, signal: null }, "the launcher leaves as the binary did");

	// The launcher's parent is killed. Its stdin stays open (a FIFO this test holds
	// open itself), so only the launcher's watch on its parent can stop the binary.
	const fifo = join(me.dir, "stdin");
	execFileSync("mkfifo", [fifo]);
	const writer = openSync(fifo, "r+");
	t.after(() => closeSync(writer));
	const parent = spawn("sh", ["-c", '"$0" stdio <"$1" & echo $!; wait', launcher, fifo], {
		env: me.env,
		cwd: me.home,
		stdio: ["ignore", "pipe", "ignore"],
	});
	reap(t, [parent.pid]);
	const launcherPid = await new Promise((done) => parent.stdout.once("data", (c) => done(Number(String(c).trim()))));
	const orphan = await binaryUnder(launcherPid);
	reap(t, [launcherPid, orphan]);
	parent.kill("SIGKILL");
	await eventually(() => !isRunning(orphan) && !isRunning(launcherPid), 20_000, "the binary and the launcher to leave after their parent");
});

test("without its platform's package, and on Windows, the install says why in a sentence", { timeout: TEST_MS }, async () => {
	const me = await person("project");
	const project = join(me.dir, "project");
	await mkdir(project, { recursive: true });
	await writeFile(join(project, "package.json"), JSON.stringify({ name: "a-project", version: "1.0.0", private: true }));
	// npm 11 ignores --omit=optional with -g; in a project folder it leaves the binary's package out.
	const installed = await run("npm", ["install", "agent-relay", "--omit=optional"], { env: me.env, cwd: project });
	assert.equal(installed.code, 0, installed.stderr);
	assert.ok(!existsSync(join(project, "node_modules", `agent-relay-${PLATFORM}`)));
	const launcher = join(project, "node_modules", ".bin", "agent-relay");
	const missing = await run(launcher, ["--version"], { env: me.env, cwd: project });
	assert.equal(missing.code, 1);
	assert.equal(
		missing.stderr,
		`agent-relay: the package that holds the binary for ${PLATFORM}, agent-relay-${PLATFORM}, is not installed: npm leaves optional dependencies out with --omit=optional or --no-optional. Install agent-relay again without that option.\n`,
	);

	// Windows, as npm and Node see it there: `process.platform` is win32.
	const windows = join(me.dir, "windows.cjs");
	await writeFile(windows, 'Object.defineProperty(process, "platform", { value: "win32" });\n');
	const env = { ...me.env, NODE_OPTIONS: `--require ${windows}` };
	const launched = await run(process.execPath, [join(project, "node_modules", "agent-relay", "npm", "agent-relay.js"), "--version"], { env });
	assert.equal(launched.code, 1);
	assert.match(launched.stderr, /^agent-relay: Windows is not supported: agent-relay rests on Unix sockets and file locks \(flock\)\./);
	const elsewhere = join(me.dir, "elsewhere");
	await mkdir(elsewhere);
	await writeFile(join(elsewhere, "package.json"), JSON.stringify({ name: "b-project", version: "1.0.0", private: true }));
	const refused = await run("npm", ["install", "agent-relay"], { env, cwd: elsewhere });
	assert.notEqual(refused.code, 0);
	assert.match(refused.stderr, /EBADPLATFORM/);
	assert.match(refused.stderr, /Unsupported platform for agent-relay@[\d.]+: wanted \{"os":"linux,darwin"\} \(current: \{"os":"win32"\}\)/);
	assert.doesNotMatch(refused.stderr, /\n\s+at /, "no stack trace");
});

test("pi install npm:agent-relay: pi runs the package's own binary, the session gets its topic and answers the phone", { timeout: TEST_MS }, async (t) => {
	const world = await PiWorld.create(t);
	// PATH without npm's bin folder: the extension finds the binary through its own package.
	const me = await person("pi", { home: world.home, path: [] });
	const env = { ...me.env, AGENT_RELAY_BIN: undefined };
	const installed = await world.piCommand(["install", "npm:agent-relay"], { env, ms: 120_000 });
	assert.equal(installed.code, 0, `${installed.stdout}\n${installed.stderr}`);
	const native = join(me.prefix, NATIVE);
	assert.ok(existsSync(native), "npm installed the platform's package under pi's global prefix");

	const pi = await world.startPi("alpha", { extension: null, env });
	await pi.bound();
	const [sidecar] = pi.sidecars();
	assert.equal(realpathSync(`/proc/${sidecar}/exe`), realpathSync(native), "the package's binary runs, not another");
	const topic = await world.topicOf("alpha");
	assert.ok(topic, "a topic for alpha");
	const text = `from the phone ${randomUUID()}`;
	const from = pi.mark();
	await world.bot.injectMessage(topic.thread_id, text);
	await pi.waitFor((e) => e.type === "agent_end", { ms: 30_000, from, what: "the relayed turn to end" });
	await world.bot.said(topic.thread_id, (said) => said.includes(`echo: ${text}`), { what: "the answer in the topic" });
	const notices = pi.events.filter((e) => e.type === "extension_ui_request" && e.method === "notify");
	assert.deepEqual(notices.filter((e) => /version|protocol/.test(e.message)), [], "the package's binary is of its own version");
	await pi.close();

	const removed = await world.piCommand(["remove", "npm:agent-relay"], { env });
	assert.equal(removed.code, 0, removed.stderr);
	assert.deepEqual(named(me.prefix, "agent-relay"), [], "no agent-relay left under npm's prefix");
});

test("the Claude Code plugin runs the npm-installed binary: a claude -p turn's answer lands in its topic", { timeout: TEST_MS }, async (t) => {
	const world = await ClaudeWorld.create(t);
	const telegram = await FakeBotApi.start();
	t.after(() => telegram.stop());
	const me = await person("claude", { home: world.home });
	const installed = await run("npm", ["install", "--global", "agent-relay"], { env: me.env, cwd: me.home });
	assert.equal(installed.code, 0, installed.stderr);

	// The plugin's launcher, node-less: a PATH with only the tools it uses and npm's
	// bin folder runs the binary (npm's `agent-relay` is a Node script); with npm's
	// bin folder off PATH it finds it through npm's prefix.
	const tools = join(me.dir, "tools");
	await mkdir(tools);
	for (const tool of ["uname", "readlink", "dirname", "sed", "tail"]) {
		symlinkSync(execFileSync("sh", ["-c", `command -v ${tool}`], { encoding: "utf8" }).trim(), join(tools, tool));
	}
	const script = join(REPO, "claude-plugin", "agent-relay.sh");
	const npmrc = join(me.dir, "npmrc");
	await writeFile(npmrc, `prefix = ${me.prefix}\n`);
	for (const [how, env] of [
		["on PATH", { PATH: `${join(me.prefix, "bin")}${delimiter}${tools}` }],
		["from npm_config_prefix", { PATH: tools, npm_config_prefix: me.prefix }],
		["from npm's user config", { PATH: tools, npm_config_userconfig: npmrc }],
	]) {
		const out = await run("/bin/sh", [script, "--version"], { env: { HOME: me.home, ...env } });
		assert.equal(out.stdout.trim(), `agent-relay ${VERSION} (${COMMIT})`, `${how}: ${out.stderr}`);
	}

	const env = {
		PATH: me.env.PATH,
		CARGO_HOME: join(world.root, "no-cargo-home"),
		AGENT_RELAY_HOME: join(world.root, "relay"),
		TELEGRAM_BOT_TOKEN: telegram.token,
		AGENT_RELAY_CHAT_ID: String(CHAT_ID),
		AGENT_RELAY_ALLOWED_USERS: "1001",
		AGENT_RELAY_API_URL: telegram.url,
	};
	for (const args of [
		["plugin", "marketplace", "add", REPO],
		["plugin", "install", "agent-relay@agent-relay"],
	]) {
		const out = await world.command(args, { env });
		assert.equal(out.code, 0, `claude ${args.join(" ")}: ${out.stdout}\n${out.stderr}`);
	}
	const prompt = `hello from npm ${randomUUID()}`;
	const out = await world.run(prompt, { env });
	assert.equal(out.code, 0, out.stderr);
	assert.deepEqual(
		out.init.mcp_servers.filter((s) => s.source === "plugin"),
		[{ name: "plugin:agent-relay:agent-relay", status: "connected", source: "plugin" }],
	);
	const [topic] = await eventually(async () => {
		const live = (await telegram.topics()).filter((topic) => !topic.deleted);
		return live.length > 0 && live;
	}, 20_000, "the session's topic");
	await telegram.said(topic.thread_id, (text) => text === `echo: ${prompt}`, { what: "the turn's answer in the topic" });
});
