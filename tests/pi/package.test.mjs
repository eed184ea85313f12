// The repository as a pi package, installed the way pi installs packages
// (pi-coding-agent docs/packages.md) into a scratch agent dir, offline:
//
// * `pi install <checkout>`: every pi session is relayed without `-e`, it gets
//   its topic and a message round-trips; `pi remove` takes it out again;
// * `pi install git:…` (git's `insteadOf` points the GitHub URL at a local
//   repository of the package's files; npm's registry is unreachable): pi
//   clones it and runs npm, the extension finds `agent-relay` on PATH or in
//   cargo's bin folder, names
//   the one command that installs it when it is missing, `pi update` follows
//   a new commit and `pi remove` deletes the clone;
// * a binary of another version than the extension's package is named once
//   and runs; one that speaks another protocol is stopped after the handshake,
//   before it joins the relay.
//
// `pi install npm:agent-relay`, from a registry, is tests/npm/install.test.mjs.

import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { randomUUID } from "node:crypto";
import { existsSync, readFileSync } from "node:fs";
import { chmod, copyFile, mkdir, readFile, symlink, writeFile } from "node:fs/promises";
import { delimiter, join, relative } from "node:path";
import { test } from "node:test";
import { REPO, World, eventually, isRunning, stripAnsi } from "./harness.mjs";

const TEST_MS = 180_000;
const OUR_COMMANDS = ["relay", "telegram-connect", "telegram-disconnect", "telegram-status"];
/** What the package is made of (package.json `files`), and Cargo.toml, which makes a checkout. */
const PACKAGE_FILES = ["package.json", "npm/agent-relay.js", "npm/binary.js", "scripts/pi-extension.ts", "extension-manifest.json", "Cargo.toml"];
const GIT_SOURCE = "git:github.com/agent-relay-test/agent-relay";

function packages(world) {
	const settings = JSON.parse(readFileSync(join(world.agentDir, "settings.json"), "utf8"));
	return settings.packages ?? [];
}

async function ourCommands(pi) {
	const { data } = await pi.request({ type: "get_commands" });
	return data.commands
		.filter((c) => c.source === "extension")
		.map((c) => c.name)
		.sort();
}

/** A message written in the session's topic reaches pi, and the answer lands in the topic. */
async function roundTrip(world, pi, name) {
	const topic = await world.topicOf(name);
	assert.ok(topic, `a topic for ${name}`);
	const text = `from the phone ${randomUUID()}`;
	const from = pi.mark();
	await world.bot.injectMessage(topic.thread_id, text);
	await pi.waitFor((e) => e.type === "agent_end", { ms: 30_000, from, what: "the relayed turn to end" });
	assert.deepEqual(world.model.prompts, [text]);
	await world.bot.said(topic.thread_id, (said) => said.includes(`echo: ${text}`), { what: "the answer in the topic" });
}

test("pi install <checkout> relays every pi session; pi remove takes it out", { timeout: TEST_MS }, async (t) => {
	const world = await World.create(t);
	const installed = await world.piCommand(["install", REPO]);
	assert.equal(installed.code, 0, installed.stderr);
	// pi stores a local path relative to its settings file (docs/packages.md).
	assert.deepEqual(packages(world), [relative(world.agentDir, REPO)]);
	const listed = await world.piCommand(["list"]);
	assert.match(listed.stdout, new RegExp(REPO.replaceAll("/", "\\/")));

	// No -e and no AGENT_RELAY_BIN: the package's extension, which finds the build
	// of the checkout it sits in.
	const pi = await world.startPi("alpha", { extension: null, env: { AGENT_RELAY_BIN: undefined } });
	await pi.bound();
	assert.deepEqual(await ourCommands(pi), OUR_COMMANDS);
	await roundTrip(world, pi, "alpha");
	await pi.close();

	const removed = await world.piCommand(["remove", REPO]);
	assert.equal(removed.code, 0, removed.stderr);
	assert.deepEqual(packages(world), []);
	const after = await world.startPi("beta", { extension: null });
	assert.deepEqual(await ourCommands(after), [], "no relay after pi remove");
	assert.deepEqual(after.sidecars(), []);
});

/** A git repository of the package's files as they are in this checkout. */
async function packageRepository(world) {
	const repo = join(world.root, "published");
	for (const file of PACKAGE_FILES) {
		await mkdir(join(repo, file, ".."), { recursive: true });
		await copyFile(join(REPO, file), join(repo, file));
	}
	const git = (...args) => execFileSync("git", args, { cwd: repo, env: gitEnv(world), stdio: "pipe" });
	git("init", "-q", "-b", "main");
	git("add", ".");
	git("commit", "-q", "-m", "the package");
	// pi clones https://github.com/…; git takes it from here instead, so nothing reaches the network.
	git("config", "--global", `url.file://${repo}.insteadOf`, "https://github.com/agent-relay-test/agent-relay");
	return { repo, git };
}

function gitEnv(world) {
	return {
		PATH: process.env.PATH,
		HOME: world.home,
		GIT_CONFIG_NOSYSTEM: "1",
		GIT_AUTHOR_NAME: "test",
		GIT_AUTHOR_EMAIL: "test@example.invalid",
		GIT_COMMITTER_NAME: "test",
		GIT_COMMITTER_EMAIL: "test@example.invalid",
	};
}

test("pi install git:… clones the package, finds agent-relay on PATH or says how to install it; update and remove follow", { timeout: TEST_MS }, async (t) => {
	const world = await World.create(t);
	const { repo, git } = await packageRepository(world);
	// npm runs in the clone (pi's git installs do); an unreachable registry proves it needs none.
	const offlineNpm = {
		...gitEnv(world),
		npm_config_registry: "http://127.0.0.1:9/",
		npm_config_audit: "false",
		npm_config_fund: "false",
		npm_config_update_notifier: "false",
		npm_config_cache: join(world.root, "npm-cache"),
	};
	const installed = await world.piCommand(["install", GIT_SOURCE], { env: offlineNpm });
	assert.equal(installed.code, 0, `${installed.stdout}\n${installed.stderr}`);
	const clone = join(world.agentDir, "git", "github.com", "agent-relay-test", "agent-relay");
	assert.ok(existsSync(join(clone, "scripts", "pi-extension.ts")), "pi cloned the package");
	assert.deepEqual(packages(world), [GIT_SOURCE]);

	// PATH without a folder that holds an agent-relay, should the developer's machine have one.
	const withoutRelay = process.env.PATH.split(delimiter)
		.filter((dir) => !existsSync(join(dir, "agent-relay")))
		.join(delimiter);
	// After `cargo install`: agent-relay on PATH, no build in the clone, no override.
	const bin = join(world.root, "bin");
	await mkdir(bin);
	await symlink(world.piEnv().AGENT_RELAY_BIN, join(bin, "agent-relay"));
	const nowhere = join(world.root, "no-cargo-home");
	const onPath = await world.startPi("alpha", {
		extension: null,
		env: { AGENT_RELAY_BIN: undefined, CARGO_HOME: nowhere, PATH: `${bin}${delimiter}${withoutRelay}` },
	});
	await onPath.bound();
	await onPath.close();
	// Or where `cargo install` puts it, when pi's PATH lacks that folder.
	const cargoHome = join(world.root, "cargo-home");
	await mkdir(join(cargoHome, "bin"), { recursive: true });
	await symlink(world.piEnv().AGENT_RELAY_BIN, join(cargoHome, "bin", "agent-relay"));
	const inCargoHome = await world.startPi("gamma", {
		extension: null,
		env: { AGENT_RELAY_BIN: undefined, CARGO_HOME: cargoHome, PATH: withoutRelay },
	});
	await inCargoHome.bound();
	await inCargoHome.close();

	// Without it: the status line says so and the notice names the command.
	const missing = await world.startPi("beta", {
		extension: null,
		env: { AGENT_RELAY_BIN: undefined, CARGO_HOME: nowhere, PATH: withoutRelay },
	});
	const notice = await missing.uiRequest("notify", (e) => String(e.message).startsWith("agent-relay not found"));
	assert.equal(notice.notifyType, "error");
	assert.ok(notice.message.includes(`\`cargo install --locked --path ${clone}\``), notice.message);
	const status = await missing.uiRequest("setStatus", (e) => e.statusKey === "relay");
	assert.equal(stripAnsi(status.statusText), "TG ✕ agent-relay missing");
	await missing.close();

	// `pi update` follows a new commit of the repository.
	await writeFile(join(repo, "NEWS"), "a new commit\n");
	git("add", "NEWS");
	git("commit", "-q", "-m", "news");
	const updated = await world.piCommand(["update", GIT_SOURCE], { env: { ...offlineNpm, PI_OFFLINE: undefined } });
	assert.equal(updated.code, 0, `${updated.stdout}\n${updated.stderr}`);
	assert.ok(existsSync(join(clone, "NEWS")), "pi update pulled the new commit");

	const removed = await world.piCommand(["remove", GIT_SOURCE], { env: offlineNpm });
	assert.equal(removed.code, 0, removed.stderr);
	assert.ok(!existsSync(clone), "pi remove deleted the clone");
	assert.deepEqual(packages(world), []);
});

/** The extension's files in a folder of their own, its package.json saying `version`. */
async function extensionOfVersion(world, version) {
	const dir = join(world.root, `extension-${version}`);
	for (const file of ["scripts/pi-extension.ts", "extension-manifest.json", "npm/binary.js"]) {
		await mkdir(join(dir, file, ".."), { recursive: true });
		await copyFile(join(REPO, file), join(dir, file));
	}
	const pkg = JSON.parse(await readFile(join(REPO, "package.json"), "utf8"));
	await writeFile(join(dir, "package.json"), JSON.stringify({ ...pkg, version }));
	return join(dir, "scripts", "pi-extension.ts");
}

const notices = (pi, pattern) =>
	pi.events.filter((e) => e.type === "extension_ui_request" && e.method === "notify" && pattern.test(String(e.message)));

test("a binary of another version is named once and runs; one of another protocol does not join the relay", { timeout: TEST_MS }, async (t) => {
	const world = await World.create(t);
	const binary = world.piEnv().AGENT_RELAY_BIN;
	// The binary's version is the crate's, which scripts/npm-pack keeps equal to package.json's.
	const { version } = JSON.parse(await readFile(join(REPO, "package.json"), "utf8"));
	const pi = await world.startPi("alpha", { extension: await extensionOfVersion(world, "0.0.1-older") });
	const said = await pi.uiRequest("notify", (e) => /is version/.test(String(e.message)));
	assert.equal(
		said.message,
		`agent-relay at ${binary} is version ${version}, this extension 0.0.1-older; it speaks the same protocol (1), so it runs.`,
	);
	await pi.bound();
	// The sidecar dies and /telegram-connect starts another: the handshake again, the notice not.
	const [first] = pi.sidecars();
	process.kill(first, "SIGKILL");
	await pi.uiRequest("notify", (e) => String(e.message).startsWith("agent-relay stopped"));
	const from = pi.mark();
	await pi.prompt("/telegram-connect", 60_000);
	await pi.bound({ from });
	assert.notDeepEqual(pi.sidecars(), [first]);
	assert.equal(notices(pi, /is version/).length, 1, "said once per pi process");
	await pi.close();

	// A sidecar that answers `initialize` with another protocol: stopped, never `initialized`.
	const log = join(world.root, "other-protocol.log");
	const fake = join(world.root, "other-protocol-sidecar");
	await writeFile(
		fake,
		`#!${process.execPath}
const fs = require("node:fs");
fs.appendFileSync(${JSON.stringify(log)}, \`pid \${process.pid}\\n\`);
let buffer = "";
process.stdin.on("data", (chunk) => {
	buffer += chunk;
	for (let nl = buffer.indexOf("\\n"); nl !== -1; nl = buffer.indexOf("\\n")) {
		const message = JSON.parse(buffer.slice(0, nl));
		buffer = buffer.slice(nl + 1);
		fs.appendFileSync(${JSON.stringify(log)}, \`\${message.method}\\n\`);
		if (message.id === undefined) continue;
		const result = message.method === "initialize"
			? { protocolVersion: 99, sidecar: { name: "agent-relay", version: "9.0.0" }, commands: [], statusKey: "relay" }
			: null;
		process.stdout.write(JSON.stringify({ jsonrpc: "2.0", id: message.id, result }) + "\\n");
	}
});
process.stdin.on("end", () => process.exit(0));
`,
	);
	await chmod(fake, 0o755);
	const other = await world.startPi("beta", { env: { AGENT_RELAY_BIN: fake } });
	const refused = await other.uiRequest("notify", (e) => /speaks protocol/.test(String(e.message)));
	assert.equal(
		refused.message,
		`agent-relay at ${fake} speaks protocol 99, this extension 1, so it does not run: install the agent-relay of this extension's version (${version}).`,
	);
	const pid = Number(/^pid (\d+)$/m.exec(readFileSync(log, "utf8"))[1]);
	await eventually(() => !isRunning(pid), 15_000, "the sidecar of another protocol to be stopped");
	const methods = readFileSync(log, "utf8").split("\n").filter((line) => line && !line.startsWith("pid "));
	assert.equal(methods[0], "initialize");
	assert.ok(!methods.includes("initialized"), `never let in: ${methods.join(", ")}`);
	assert.equal(await world.topicOf("beta"), undefined, "no topic for it");
});
