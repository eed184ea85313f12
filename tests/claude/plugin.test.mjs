// The relay as a Claude Code plugin, installed the way Claude Code installs
// plugins, offline, into a scratch HOME: `claude plugin marketplace add <this
// checkout>` (its `.claude-plugin/marketplace.json`), then `claude plugin install
// agent-relay@agent-relay`. No --settings, no --mcp-config: what runs is what the
// plugin declares (`claude-plugin/`), its launcher finding `agent-relay` on PATH
// as `cargo install` leaves it.
//
// * `claude -p` gets its topic, the plugin's `reply` tool posts into it and the
//   answer arrives through the Stop hook;
// * `agent-relay doctor` reports the plugin, refuses it beside `agent-relay
//   install claude-code` (two MCP servers, hooks twice: the answer comes twice),
//   and is content again
//   after `install claude-code --remove`; `claude plugin uninstall` takes it out;
// * without the binary, the SessionStart hook tells the user the command that
//   installs it, and Claude Code runs on without the relay.

import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { existsSync } from "node:fs";
import { mkdir, symlink } from "node:fs/promises";
import { delimiter, join } from "node:path";
import { test } from "node:test";
import { promisify } from "node:util";
import { CHAT_ID, FakeBotApi, REPO, eventually } from "../pi/harness.mjs";
import { World } from "./harness.mjs";

const SIDECAR = process.env.AGENT_RELAY_BIN || join(REPO, "target", "debug", "agent-relay");
const PLUGIN = "agent-relay@agent-relay";
/** Claude Code names a plugin's MCP server `plugin:<plugin>:<server>`, its tools so. */
const SERVER = "plugin:agent-relay:agent-relay";
const TOOL = (name) => `mcp__plugin_agent-relay_agent-relay__${name}`;

/** PATH without a folder that holds an agent-relay, should the developer's machine have one. */
const PATH_WITHOUT_RELAY = process.env.PATH.split(delimiter)
	.filter((dir) => !existsSync(join(dir, "agent-relay")))
	.join(delimiter);

/** A world with its own fake Telegram and the plugin installed from this checkout. */
async function pluginWorld(t) {
	assert.ok(existsSync(SIDECAR), `${SIDECAR} is missing: run \`cargo build --bins\` first`);
	const world = await World.create(t);
	const telegram = await FakeBotApi.start();
	t.after(() => telegram.stop());
	// After `cargo install`: agent-relay in a folder on PATH.
	const bin = join(world.root, "bin");
	await mkdir(bin);
	await symlink(SIDECAR, join(bin, "agent-relay"));
	const env = {
		PATH: `${bin}${delimiter}${PATH_WITHOUT_RELAY}`,
		CARGO_HOME: join(world.root, "no-cargo-home"),
		AGENT_RELAY_HOME: join(world.root, "relay"),
		TELEGRAM_BOT_TOKEN: telegram.token,
		AGENT_RELAY_CHAT_ID: String(CHAT_ID),
		AGENT_RELAY_ALLOWED_USERS: "1001",
		AGENT_RELAY_API_URL: telegram.url,
	};
	for (const args of [
		["plugin", "marketplace", "add", REPO],
		["plugin", "install", PLUGIN],
	]) {
		const out = await world.command(args, { env });
		assert.equal(out.code, 0, `claude ${args.join(" ")}: ${out.stdout}\n${out.stderr}`);
	}
	return { world, telegram, env, relay: join(bin, "agent-relay") };
}

/** `agent-relay <args>` (the built binary) in the world's environment. */
async function agentRelay(world, env, args) {
	try {
		const { stdout } = await promisify(execFile)(SIDECAR, args, { env: world.env(env), timeout: 30_000 });
		return { code: 0, stdout };
	} catch (error) {
		if (error.code === undefined || typeof error.code === "string") throw error;
		return { code: error.code, stdout: error.stdout };
	}
}

/** The doctor's Claude Code lines. */
async function doctorSays(world, env) {
	const { stdout } = await agentRelay(world, env, ["doctor"]);
	return stdout
		.split("\n")
		.filter((line) => line.includes("Claude Code:"))
		.join("\n");
}

async function topicOf(telegram) {
	const topics = await eventually(async () => {
		const live = (await telegram.topics()).filter((t) => !t.deleted);
		return live.length > 0 && live;
	}, 20_000, "the session's topic");
	assert.equal(topics.length, 1, JSON.stringify(topics));
	return topics[0];
}

test("the plugin relays claude -p; doctor reports it and refuses it beside install claude-code", async (t) => {
	const { world, telegram, env, relay } = await pluginWorld(t);
	const cue = `[[tool:${TOOL("reply")} {"text":"**Tests** pass: 12 of 12"}]]`;
	const out = await world.run(`report to the phone ${cue}`, { env, args: ["--allowedTools", TOOL("reply")] });
	assert.equal(out.code, 0, out.stderr);
	assert.equal(out.result?.is_error, false, JSON.stringify(out.result));
	assert.deepEqual(
		out.init.mcp_servers.filter((s) => s.source === "plugin"),
		[{ name: SERVER, status: "connected", source: "plugin" }],
	);
	const topic = await topicOf(telegram);
	assert.equal(topic.name, "A · project");
	await telegram.said(topic.thread_id, (text) => text === "Tests pass: 12 of 12", { what: "the reply tool's message" });
	await telegram.said(topic.thread_id, (text) => text.includes("returned: Sent to the Telegram topic."), {
		what: "the final answer, posted by the Stop hook",
	});
	assert.deepEqual(world.fake.unknown ?? [], [], "Claude Code asked for nothing the fake does not serve");

	// The plugin's version is Claude Code's: the checkout's commit (plugin.json has none).
	const reported = await doctorSays(world, env);
	assert.ok(reported.startsWith(`✓ Claude Code: the plugin ${PLUGIN} `), reported);
	assert.ok(reported.endsWith(` is enabled and runs ${relay}`), reported);

	// Both at once: two MCP servers in every session, every hook twice, so the
	// prompt and the answer reach the topic twice.
	const installed = await agentRelay(world, env, ["install", "claude-code"]);
	assert.equal(installed.code, 0, installed.stdout);
	const doubled = await world.run("said once", { env });
	assert.equal(doubled.code, 0, doubled.stderr);
	assert.equal(doubled.init.mcp_servers.length, 2, JSON.stringify(doubled.init.mcp_servers));
	// A new session: a topic of its own, which hears everything twice (and the
	// second server, when no hook named its session in time, opens a third).
	const answers = await eventually(
		async () => {
			for (const other of (await telegram.topics()).filter((t) => t.thread_id !== topic.thread_id)) {
				const said = await telegram.messages(other.thread_id);
				const found = said.filter((m) => m.plain_text === "echo: said once");
				if (found.length >= 2) return found;
			}
			return false;
		},
		20_000,
		"the answer twice in the new session's topic",
	);
	assert.equal(answers.length, 2);
	const both = await doctorSays(world, env);
	assert.match(both, /^✗ Claude Code: both the plugin agent-relay@agent-relay and `agent-relay install claude-code` are active/);
	assert.match(both, /`agent-relay install claude-code --remove` keeps the plugin/);
	const removed = await agentRelay(world, env, ["install", "claude-code", "--remove"]);
	assert.equal(removed.code, 0, removed.stdout);
	assert.match(await doctorSays(world, env), /^✓ Claude Code: the plugin/);

	const uninstalled = await world.command(["plugin", "uninstall", PLUGIN], { env });
	assert.equal(uninstalled.code, 0, `${uninstalled.stdout}\n${uninstalled.stderr}`);
	assert.match(await doctorSays(world, env), /Claude Code: not added/);
	const without = await world.run("hello", { env });
	assert.equal(without.code, 0, without.stderr);
	assert.deepEqual(without.init.mcp_servers.filter((s) => s.source === "plugin"), [], "no plugin server after uninstall");
});

test("without the binary the plugin says how to install it, and Claude Code runs on", async (t) => {
	const { world, telegram, env } = await pluginWorld(t);
	const missing = { ...env, PATH: PATH_WITHOUT_RELAY };
	const out = await world.run("hello", { env: missing });
	assert.equal(out.code, 0, out.stderr);
	assert.equal(out.result?.is_error, false, JSON.stringify(out.result));
	assert.deepEqual(
		out.init.mcp_servers.filter((s) => s.source === "plugin"),
		[{ name: SERVER, status: "failed", source: "plugin" }],
	);
	// The SessionStart hook's answer: a systemMessage, which Claude Code shows the user.
	const started = out.events.find(
		(e) => e.type === "system" && e.subtype === "hook_response" && e.hook_event === "SessionStart",
	);
	assert.ok(started, JSON.stringify(out.events.map((e) => e.subtype ?? e.type)));
	const said = JSON.parse(started.stdout || started.output);
	assert.match(said.systemMessage, /^agent-relay is not installed, so this session is not relayed to Telegram/);
	assert.ok(said.systemMessage.includes("Install it with `npm i -g agent-relay`"), said.systemMessage);
	assert.ok(said.systemMessage.includes(`\`cargo install --locked --path '${REPO}'\``), said.systemMessage);
	assert.deepEqual(await telegram.topics(), [], "no topic without the relay");

	assert.match(await doctorSays(world, missing), /^✗ Claude Code: the plugin agent-relay@agent-relay finds no binary/);
});
