// Claude Code launched by the relay (docs/DESIGN.md, *Launching*): `agent-relay serve`
// runs the real Claude Code headless and kept running — `-p --input-format stream-json
// --output-format stream-json --verbose --permission-prompt-tool stdio`, `--session-id`
// new and `--resume` again — and plays the host of its session. `/new … claude` starts it
// in its own topic, the first prompt is answered there, a second message is a second turn
// of the same process, a Bash call waits for the tap on the phone (`can_use_tool`), `/model`
// switches (the fake API sees the new model), and `/end` then `/resume` keep the topic and
// the history (the fake API sees the earlier turns), the topic saying each. `/stop` aborts
// a turn the fake API holds open.

import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { existsSync } from "node:fs";
import { mkdir, writeFile } from "node:fs/promises";
import { join } from "node:path";
import { test } from "node:test";
import { CHAT_ID, eventually, FakeBotApi, isOpen, REPO, Serve, USER_ID } from "../pi/harness.mjs";
import { claudeBin } from "./claude-bin.mjs";
import { World } from "./harness.mjs";

const SIDECAR = process.env.AGENT_RELAY_BIN || join(REPO, "target", "debug", "agent-relay");
const WAIT = 60_000;

function buttons(message) {
	return (message.reply_markup?.inline_keyboard ?? []).flat();
}

/** A world with the fake Telegram, and `agent-relay serve` launching Claude Code. */
async function launchWorld(t, extraEnv = {}) {
	assert.ok(existsSync(SIDECAR), `${SIDECAR} is missing: run \`cargo build --bins\` first`);
	const world = await World.create(t);
	const telegram = await FakeBotApi.start();
	t.after(() => telegram.stop());
	const relayHome = join(world.root, "relay");
	// As if the user had the relay's Claude Code plugin: its MCP server and hooks step
	// aside in a Claude Code serve started, or the session would register twice.
	const hooks = {};
	for (const event of ["SessionStart", "UserPromptSubmit", "PreToolUse", "PermissionRequest", "Stop"]) {
		hooks[event] = [{ matcher: "", hooks: [{ type: "command", command: `${SIDECAR} hook ${event}`, timeout: 30 }] }];
	}
	const settings = await world.writeJson("user-settings.json", { hooks });
	const mcp = await world.writeJson("user-mcp.json", {
		mcpServers: { "agent-relay": { type: "stdio", command: SIDECAR, args: ["mcp"] } },
	});
	await mkdir(join(relayHome, "config"), { recursive: true, mode: 0o700 });
	await writeFile(
		join(relayHome, "config", "config.toml"),
		[
			`bot_token = ${JSON.stringify(telegram.token)}`,
			`chat_id = ${CHAT_ID}`,
			`allowed_users = [${USER_ID}]`,
			`api_url = ${JSON.stringify(telegram.url)}`,
			"[launch]",
			`roots = ${JSON.stringify([world.root])}`,
			`engine = "claude"`,
			"[launch.commands]",
			`claude = ${JSON.stringify([claudeBin(), "--settings", settings, "--mcp-config", mcp])}`,
		].join("\n"),
		{ mode: 0o600 },
	);
	const env = world.env({ AGENT_RELAY_HOME: relayHome, AGENT_RELAY_LOG: "debug", AGENT_RELAY_BIN: SIDECAR, ...extraEnv });
	const child = spawn(SIDECAR, ["serve"], { cwd: world.root, stdio: ["ignore", "pipe", "pipe"], env });
	const serve = new Serve(child);
	// The world's folders go only once serve and its Claude Code are gone: a Claude
	// Code still writing its session store would fail the removal.
	const destroy = world.destroy.bind(world);
	world.destroy = async () => {
		await serve.stop();
		await destroy();
	};
	t.after(() => serve.stop());
	const status = () =>
		new Promise((done) => {
			const s = spawn(SIDECAR, ["status"], { env, stdio: ["ignore", "pipe", "ignore"] });
			let out = "";
			s.stdout.on("data", (c) => {
				out += c;
			});
			s.once("exit", () => done(out));
		});
	await eventually(async () => (await status()).includes(`serve: pid ${serve.pid}`), WAIT, `serve on the bus: ${serve.stderr}`);
	return { world, telegram, serve };
}

test("/new … claude runs Claude Code headless in its own topic: turns, an approval, /model, /end and resume", async (t) => {
	const { world, telegram, serve } = await launchWorld(t);
	const asked = Date.now();
	await telegram.injectMessage(null, "/new project claude hello from the phone");
	const started = await telegram.said(null, (text) => text.includes("started"), { ms: WAIT, what: "the /new answer" });
	assert.match(started.plain_text, /▶ claude started: [A-Z] · project/);
	const topic = await eventually(async () => (await telegram.topics()).find((x) => x.name.endsWith(" · project")), WAIT, "the topic");
	await telegram.said(topic.thread_id, (text) => text === "echo: hello from the phone", { ms: WAIT, what: "the first answer" });
	t.diagnostic(`from /new to the first answer: ${Date.now() - asked} ms`);
	const [pid] = serve.agents();
	assert.ok(pid, "Claude Code is serve's child");

	await telegram.injectMessage(topic.thread_id, "a second turn");
	await telegram.said(topic.thread_id, (text) => text === "echo: a second turn", { ms: WAIT, what: "the second turn" });
	assert.deepEqual(serve.agents(), [pid], "the same process, kept running between turns");
	assert.ok(JSON.stringify(world.fake.turns.at(-1).body.messages).includes("hello from the phone"), "one session");

	const made = join(world.root, "project", "made-by-phone");
	await telegram.injectMessage(topic.thread_id, 'make it [[tool:Bash {"command":"touch made-by-phone && echo made"}]]');
	const approval = await eventually(
		async () => (await telegram.messages(topic.thread_id)).find((m) => isOpen(m) && m.plain_text.includes("wants to run")),
		WAIT,
		"the approval on the phone",
	);
	assert.ok(!existsSync(made), "nothing runs before the tap");
	const allow = buttons(approval).find((b) => b.text.includes("Allow"));
	await telegram.tap(topic.thread_id, approval.message_id, allow.callback_data);
	await telegram.said(topic.thread_id, (text) => text.includes("tool Bash returned: made"), { ms: WAIT, what: "the tool's result" });
	assert.ok(existsSync(made), "Allow ran it");

	await telegram.injectMessage(topic.thread_id, "/model");
	const list = await telegram.said(topic.thread_id, (text) => text.startsWith("🧠 Model of claude"), { ms: WAIT, what: "the models" });
	const haiku = buttons(list).find((b) => /haiku/i.test(b.text));
	assert.ok(haiku, JSON.stringify(buttons(list)));
	await telegram.tap(topic.thread_id, list.message_id, haiku.callback_data);
	await telegram.said(topic.thread_id, (text) => text.startsWith("🧠 Model:"), { ms: WAIT, what: "the switch" });
	await telegram.injectMessage(topic.thread_id, "on haiku");
	await telegram.said(topic.thread_id, (text) => text.endsWith("on haiku"), { ms: WAIT, what: "a turn after the switch" });
	assert.match(world.fake.turns.at(-1).body.model, /haiku/, "the fake API sees the new model");

	await telegram.injectMessage(topic.thread_id, "/end");
	const ended = await telegram.said(topic.thread_id, (text) => text.startsWith("⏹ Session ended"), { ms: WAIT, what: "the end" });
	await eventually(() => serve.agents().length === 0, WAIT, "Claude Code gone");
	assert.ok(buttons(ended).some((b) => b.text.includes("Resume")), "the end offers to resume");
	// `/resume` typed in the closed topic (the button is the pi suite's).
	await telegram.injectMessage(topic.thread_id, "/resume");
	await eventually(async () => (await telegram.topics()).find((x) => x.thread_id === topic.thread_id)?.closed === false, WAIT, "reopened");
	await telegram.said(topic.thread_id, (text) => text.startsWith("▶ Resumed: claude started again"), {
		ms: WAIT,
		what: "the resume said in the topic",
	});
	await telegram.injectMessage(topic.thread_id, "after the resume");
	await telegram.said(topic.thread_id, (text) => text.endsWith("after the resume"), { ms: WAIT, what: "a turn after the resume" });
	const history = JSON.stringify(world.fake.turns.at(-1).body.messages);
	assert.ok(history.includes("hello from the phone") && history.includes("a second turn"), "the history came back");
	assert.equal((await telegram.topics()).filter((x) => !x.deleted).length, 1, "still one topic");
	const resumed = (await telegram.messages(topic.thread_id)).filter((m) => m.plain_text.includes("Resumed"));
	assert.equal(resumed.length, 1, "the topic says it once");
	assert.deepEqual(world.fake.unknown ?? [], [], "Claude Code asked for nothing the fake does not serve");
});

test("/stop in a launched Claude Code aborts the running turn, the topic says so, and the next message is a turn", async (t) => {
	const { world, telegram, serve } = await launchWorld(t);
	await telegram.injectMessage(null, "/new project claude first");
	const topic = await eventually(async () => (await telegram.topics()).find((x) => x.name.endsWith(" · project")), WAIT, "the topic");
	await telegram.said(topic.thread_id, (text) => text === "echo: first", { ms: WAIT, what: "the first answer" });
	const [pid] = serve.agents();

	// `[[hang]]`: the fake API streams a word and holds the turn open.
	await telegram.injectMessage(topic.thread_id, "think it over [[hang]]");
	const held = await eventually(
		() => world.fake.turns.find((r) => r.lastUserText.includes("[[hang]]")),
		WAIT,
		"the turn the fake API holds open",
	);
	await telegram.injectMessage(topic.thread_id, "/stop");
	await telegram.said(topic.thread_id, (text) => text === "⏹ Stopped.", { ms: WAIT, what: "the stop said in the topic" });
	await eventually(() => held.aborted, WAIT, "Claude Code closed the API's stream");

	await telegram.injectMessage(topic.thread_id, "after the stop");
	await telegram.said(topic.thread_id, (text) => text.endsWith("after the stop"), { ms: WAIT, what: "a normal turn after /stop" });
	// Claude Code itself puts "[Request interrupted by user]" before the next prompt.
	assert.match(world.fake.turns.at(-1).lastUserText, /after the stop$/, "the turn after /stop is the new message");
	assert.deepEqual(serve.agents(), [pid], "the same process: /stop ends the turn, not the session");
	const said = (await telegram.messages(topic.thread_id)).map((m) => m.plain_text);
	t.diagnostic(`the topic:\n${said.join("\n")}`);
	assert.deepEqual(
		said.filter((text) => /Could not stop|ended|stopped by itself/.test(text)),
		[],
		"no failure or end said",
	);
});

test("a launched Claude Code's turn that fails for good is said once, with its error, never as an answer", async (t) => {
	// One more try after a failure (Claude Code's default is ten, over minutes).
	const { world, telegram } = await launchWorld(t, { CLAUDE_CODE_MAX_RETRIES: "1" });
	await telegram.injectMessage(null, "/new project claude first");
	const topic = await eventually(async () => (await telegram.topics()).find((x) => x.name.endsWith(" · project")), WAIT, "the topic");
	await telegram.said(topic.thread_id, (text) => text === "echo: first", { ms: WAIT, what: "the first answer" });

	const down = { error: { status: 503, type: "overloaded_error", message: "still down" } };
	world.fake.queue(down, down);
	await telegram.injectMessage(topic.thread_id, "and now?");
	const said = await telegram.said(topic.thread_id, (text) => text.startsWith("⚠️ The turn failed:"), { ms: WAIT, what: "the failure in the topic" });
	assert.match(said.plain_text, /^⚠️ The turn failed: 503 still down\. .*No answer came of it\.$/s);

	await telegram.injectMessage(topic.thread_id, "and again?");
	await telegram.said(topic.thread_id, (text) => text.endsWith("and again?"), { ms: WAIT, what: "the next turn's answer" });
	const texts = (await telegram.messages(topic.thread_id)).map((m) => m.plain_text);
	assert.deepEqual(
		texts.filter((text) => /API Error|The turn failed/.test(text)),
		[said.plain_text],
		`the failure once, never Claude Code's error line as an answer: ${JSON.stringify(texts)}`,
	);
});

test("⚡ Steer now in a launched Claude Code puts the message into the running turn, once", async (t) => {
	const { world, telegram } = await launchWorld(t);
	await telegram.injectMessage(null, "/new project claude first");
	const topic = await eventually(async () => (await telegram.topics()).find((x) => x.name.endsWith(" · project")), WAIT, "the topic");
	await telegram.said(topic.thread_id, (text) => text === "echo: first", { ms: WAIT, what: "the first answer" });

	// A Bash call that runs until the test writes the gate: a turn held open.
	const gate = join(world.root, "go");
	const wait = `while [ ! -e ${gate} ]; do sleep 0.1; done; echo released`;
	await telegram.injectMessage(topic.thread_id, `work [[tool:Bash ${JSON.stringify({ command: wait })}]]`);
	// Claude Code runs a command it deems read-only without asking; else Allow runs it.
	const running = await eventually(
		async () =>
			(await telegram.messages(topic.thread_id)).find(
				(m) => (isOpen(m) && m.plain_text.includes("wants to run")) || m.plain_text.startsWith("⚙️ Working"),
			),
		WAIT,
		"the Bash call running or asking",
	);
	if (isOpen(running)) {
		await telegram.tap(topic.thread_id, running.message_id, buttons(running).find((b) => b.text.includes("Allow")).callback_data);
	}

	const steered = "also mention the weather";
	const written = await telegram.injectMessage(topic.thread_id, steered);
	const steer = (m) => buttons(m).find((b) => b.callback_data === "steer");
	const progress = await eventually(
		async () => (await telegram.messages(topic.thread_id)).find((m) => steer(m)),
		WAIT,
		"the progress message with ⚡ Steer now",
	);
	assert.match(progress.plain_text, /📨 1 message waits for the next turn/);
	await telegram.tap(topic.thread_id, progress.message_id, "steer");
	// Taken (👀) once Claude Code has the line; then the Bash call may end.
	await eventually(
		async () =>
			(await telegram.calls()).some(
				(c) => c.method === "setMessageReaction" && c.params.message_id === written.message_id && JSON.stringify(c.params.reaction).includes("👀"),
			),
		WAIT,
		"the steered message taken",
	);
	await writeFile(gate, "");

	// Within the turn: the request after the Bash result has the message.
	const within = await eventually(
		() => world.fake.turns.find((r) => JSON.stringify(r.body.messages).includes(steered)),
		WAIT,
		"the model's request with the steered message",
	);
	const last = within.body.messages.at(-1);
	assert.ok(
		JSON.stringify(last.content).includes("tool_result"),
		`with the Bash call's result, in the same turn: ${JSON.stringify(last.content).slice(0, 600)}`,
	);
	await telegram.said(topic.thread_id, (text) => text.includes("tool Bash returned"), { ms: WAIT, what: "the turn's answer" });

	// Given once: the next message is a turn of its own, the steered one in its history once.
	await telegram.injectMessage(topic.thread_id, "and now?");
	await telegram.said(topic.thread_id, (text) => text.endsWith("and now?"), { ms: WAIT, what: "the next turn" });
	const history = JSON.stringify(world.fake.turns.at(-1).body.messages);
	assert.equal(history.split(steered).length - 1, 1, "the steered message is in the history once");
});
