// Codex launched by the relay (docs/DESIGN.md, *Launching*): `agent-relay serve` runs the
// real Codex's `app-server` on stdio with the relay as its only client, and plays the
// host of its session. `/new project codex …` starts it in its own topic, the first
// prompt is answered there, a second message is a second turn of the same process,
// `/stop` interrupts a turn, `/model` lists Codex's models (`model/list`) and switches
// (the fake Responses API sees the new name), a command asks on the phone and Allow
// runs it (and sees no bot token), `/end` then Resume
// keep the topic and the history (`thread/resume`: the fake sees the earlier turns),
// and serve killed and started again brings the session back in its topic. A session
// ended before its first turn comes back too (Codex writes down only a named thread).

import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { existsSync, readdirSync, readFileSync } from "node:fs";
import { writeFile } from "node:fs/promises";
import { join } from "node:path";
import { test } from "node:test";
import { CODEX, deadline, eventually, isOpen, relaySendFile, World } from "./harness.mjs";

const WAIT = 60_000;

function buttons(message) {
	return (message.reply_markup?.inline_keyboard ?? []).flat();
}

/** A command the fake model runs with `require_escalated`: Codex asks before it runs. */
const escalated = (cmd) => `[[exec ${JSON.stringify({ cmd, sandbox_permissions: "require_escalated", justification: "the test asks" })}]]`;

/** The fake's history of a turn request: every text the model was given. */
const history = (request) => JSON.stringify(request.body.input);

/**
 * The first prompt to Codex's app-server alone (no relay): spawn, `initialize`,
 * `thread/start`, `turn/start`, to `turn/completed`, in ms — what of the time from
 * `/new` to the first answer is Codex's and the model's.
 */
async function codexAlone(world, text) {
	const asked = Date.now();
	const codex = spawn(CODEX, ["app-server"], { cwd: world.project, env: world.env, stdio: ["pipe", "pipe", "ignore"] });
	const waiting = new Map();
	let completed;
	const done = new Promise((resolve) => {
		completed = resolve;
	});
	let buffer = "";
	codex.stdout.on("data", (chunk) => {
		buffer += chunk;
		for (let cut = buffer.indexOf("\n"); cut >= 0; cut = buffer.indexOf("\n")) {
			const message = JSON.parse(buffer.slice(0, cut));
			buffer = buffer.slice(cut + 1);
			if (message.id !== undefined && !message.method) waiting.get(message.id)?.(message.result);
			if (message.method === "turn/completed") completed();
		}
	});
	let id = 0;
	const request = (method, params) =>
		new Promise((resolve) => {
			waiting.set(++id, resolve);
			codex.stdin.write(`${JSON.stringify({ id, method, params })}\n`);
		});
	try {
		await request("initialize", { clientInfo: { name: "test", title: "test", version: "0" } });
		codex.stdin.write(`${JSON.stringify({ method: "initialized" })}\n`);
		const { thread } = await request("thread/start", { cwd: world.project });
		await request("turn/start", { threadId: thread.id, input: [{ type: "text", text }] });
		await deadline(done, WAIT, "Codex alone to answer");
		return Date.now() - asked;
	} finally {
		codex.kill("SIGKILL");
	}
}

test("/new … codex runs Codex's app-server in its own topic: turns, an approval, /stop, /model, /end and resume, serve restarted", async (t) => {
	const world = await World.create(t);
	const { telegram, fake } = world;
	// Codex sends the catalogue's other models no `tools` (0.171), and compacts the
	// thread when the model changes: only that summary is a side call here.
	fake.isSide = (record) => record.lastUserText.includes("CONTEXT CHECKPOINT COMPACTION");
	let serve = await world.serve();
	const asked = Date.now();
	await telegram.injectMessage(null, "/new project codex hello from the phone");
	const started = await telegram.said(null, (text) => text.includes("started"), { ms: WAIT, what: "the /new answer" });
	assert.match(started.plain_text, /▶ codex started: [A-Z] · project/);
	const topic = await eventually(async () => (await telegram.topics()).find((x) => x.name.endsWith(" · project")), WAIT, "the topic");
	await telegram.said(topic.thread_id, (text) => text === "echo: hello from the phone", { ms: WAIT, what: "the first answer" });
	const firstAnswer = Date.now() - asked;
	// Where the time went: the model's first request on the test's clock, the topic and
	// the answer on the fake Bot API's.
	const modelAsked = fake.turns[0].at - asked;
	const calls = await telegram.calls();
	const at = (test) => calls.find(test)?.started_ms;
	const topicToAnswer =
		at((c) => c.method === "sendMessage" && String(c.params.text).includes("echo: hello from the phone")) - at((c) => c.method === "createForumTopic");
	const [pid] = serve.agents();
	assert.ok(pid, "Codex's app-server is serve's child");

	await telegram.injectMessage(topic.thread_id, "a second turn");
	await telegram.said(topic.thread_id, (text) => text === "echo: a second turn", { ms: WAIT, what: "the second turn" });
	assert.deepEqual(serve.agents(), [pid], "the same process, kept running between turns");
	assert.ok(history(fake.turns.at(-1)).includes("hello from the phone"), "one thread");

	const made = join(world.project, "made-by-phone");
	await telegram.injectMessage(topic.thread_id, `make it ${escalated("env > made-by-phone && echo made")}`);
	const approval = await eventually(
		async () => (await telegram.messages(topic.thread_id)).find((m) => isOpen(m) && m.plain_text.includes("made-by-phone")),
		WAIT,
		"the approval on the phone",
	);
	assert.ok(!existsSync(made), "nothing runs before the tap");
	t.diagnostic(`the approval: ${approval.plain_text} [${buttons(approval).map((b) => b.text).join(" | ")}]`);
	await telegram.tap(topic.thread_id, approval.message_id, buttons(approval).find((b) => b.text.includes("Allow")).callback_data);
	await telegram.said(topic.thread_id, (text) => text.includes("tool exec_command returned") && text.includes("made"), { ms: WAIT, what: "the command's result" });
	assert.ok(existsSync(made), "Allow ran it");
	// What a command Codex runs sees: serve's environment less the relay's secrets.
	const seen = readFileSync(made, "utf8");
	assert.ok(!seen.includes(telegram.token) && !/^TELEGRAM_BOT_TOKEN=/m.test(seen), "no bot token for the model's commands");
	assert.match(seen, /^AGENT_RELAY_LAUNCH_ID=\w+$/m);

	// /stop: the turn is interrupted, so the next message is answered while the model's
	// first request still hangs (joining the running turn, it would wait for it).
	let release;
	fake.queue({ hold: new Promise((done) => (release = done)), text: "too late" });
	t.after(() => release?.());
	await telegram.injectMessage(topic.thread_id, "a long one");
	await fake.next((r) => r.lastUserText.includes("a long one"));
	await telegram.injectMessage(topic.thread_id, "/stop");
	await telegram.said(topic.thread_id, (text) => text === "⏹ Stopped.", { ms: WAIT, what: "the stop" });
	await telegram.injectMessage(topic.thread_id, "after the stop");
	await telegram.said(topic.thread_id, (text) => text === "echo: after the stop", { ms: WAIT, what: "a turn after /stop" });
	release();
	assert.ok(!(await telegram.messages(topic.thread_id)).some((m) => m.plain_text.includes("too late")), "the interrupted turn's answer is not posted");

	await telegram.injectMessage(topic.thread_id, "/model");
	const list = await telegram.said(topic.thread_id, (text) => text.startsWith("🧠 Model of codex"), { ms: WAIT, what: "the models" });
	t.diagnostic(`/model offers: ${buttons(list).map((b) => b.text).join(" | ")}`);
	const other = buttons(list).find((b) => /astra/i.test(b.text));
	assert.ok(other, JSON.stringify(buttons(list)));
	await telegram.tap(topic.thread_id, list.message_id, other.callback_data);
	await telegram.said(topic.thread_id, (text) => text.startsWith("🧠 Model:"), { ms: WAIT, what: "the switch" });
	await telegram.injectMessage(topic.thread_id, "on another model");
	await telegram.said(topic.thread_id, (text) => text === "echo: on another model", { ms: WAIT, what: "a turn after the switch" });
	assert.match(fake.turns.at(-1).body.model, /astra/, "the fake API sees the new model");

	await telegram.injectMessage(topic.thread_id, "/end");
	const ended = await telegram.said(topic.thread_id, (text) => text.startsWith("⏹ Session ended"), { ms: WAIT, what: "the end" });
	await eventually(() => serve.agents().length === 0, WAIT, "Codex gone");
	await telegram.tap(topic.thread_id, ended.message_id, buttons(ended).find((b) => b.text.includes("Resume")).callback_data);
	await eventually(async () => (await telegram.topics()).find((x) => x.thread_id === topic.thread_id)?.closed === false, WAIT, "reopened");
	await telegram.injectMessage(topic.thread_id, "after the resume");
	await telegram.said(topic.thread_id, (text) => text === "echo: after the resume", { ms: WAIT, what: "a turn after the resume" });
	const resumed = history(fake.turns.at(-1));
	assert.ok(resumed.includes("hello from the phone") && resumed.includes("a second turn"), "the history came back");
	assert.match(fake.turns.at(-1).body.model, /astra/, "the model chosen before the end");

	// serve killed outright: started again, it resumes the thread in the same topic.
	serve.child.kill("SIGKILL");
	await serve.exited;
	await eventually(() => serve.agents().length === 0, WAIT, "Codex gone with serve");
	serve = await world.serve();
	await eventually(() => serve.agents().length === 1, WAIT, "Codex back under the new serve");
	await telegram.injectMessage(topic.thread_id, "after serve came back");
	await telegram.said(topic.thread_id, (text) => text === "echo: after serve came back", { ms: WAIT, what: "a turn after serve came back" });
	assert.ok(history(fake.turns.at(-1)).includes("after the resume"), "the same thread");
	assert.equal((await telegram.topics()).filter((x) => !x.deleted).length, 1, "still one topic");

	const alone = await codexAlone(world, "hello alone");
	t.diagnostic(
		`from /new to the first answer: ${firstAnswer} ms (the model asked at ${modelAsked} ms; the topic created ${topicToAnswer} ms before the answer was sent); Codex alone (spawn → answer): ${alone} ms; the relay's share: ${firstAnswer - alone} ms`,
	);
});

test("a Codex session ended before its first turn is resumed in its topic", async (t) => {
	const world = await World.create(t);
	const { telegram } = world;
	const serve = await world.serve();
	await telegram.injectMessage(null, "/new project codex");
	await telegram.said(null, (text) => text.includes("codex started"), { ms: WAIT, what: "the /new answer" });
	const topic = await eventually(async () => (await telegram.topics()).find((x) => x.name.endsWith(" · project")), WAIT, "the topic");
	await telegram.injectMessage(topic.thread_id, "/end");
	const ended = await telegram.said(topic.thread_id, (text) => text.startsWith("⏹ Session ended"), { ms: WAIT, what: "the end" });
	await eventually(() => serve.agents().length === 0, WAIT, "Codex gone");
	await telegram.tap(topic.thread_id, ended.message_id, buttons(ended).find((b) => b.text.includes("Resume")).callback_data);
	await eventually(async () => (await telegram.topics()).find((x) => x.thread_id === topic.thread_id)?.closed === false, WAIT, "reopened");
	await telegram.injectMessage(topic.thread_id, "the first turn at last");
	await telegram.said(topic.thread_id, (text) => text === "echo: the first turn at last", { ms: WAIT, what: "the first turn, after the resume" });
	assert.equal((await telegram.topics()).filter((x) => !x.deleted).length, 1, "still one topic");
});

test("a launched Codex sends a file back through the relay's send_file tool, and its socket's folder goes with it", async (t) => {
	const world = await World.create(t);
	const { telegram, fake } = world;
	const serve = await world.serve();
	await writeFile(join(world.project, "notes.md"), "# notes\n");
	await telegram.injectMessage(null, "/new project codex");
	await telegram.said(null, (text) => text.includes("codex started"), { ms: WAIT, what: "the /new answer" });
	const topic = await eventually(async () => (await telegram.topics()).find((x) => x.name.endsWith(" · project")), WAIT, "the topic");
	const run = join(world.relayHome, "run");
	const folders = () => (existsSync(run) ? readdirSync(run) : []).filter((n) => n.startsWith("codex-launch-"));
	assert.equal(folders().length, 1, "the tool's folder while Codex runs");
	fake.queue(...relaySendFile(t, { path: "notes.md", caption: "the notes" }));
	await telegram.injectMessage(topic.thread_id, "send me the notes");
	const sent = await telegram.said(topic.thread_id, (text) => text === "the notes", { ms: WAIT, what: "the file in the topic" });
	assert.equal(sent.media.kind, "document");
	assert.equal((await telegram.fileContent(sent.media.file_id)).toString("utf8"), "# notes\n");
	await telegram.said(topic.thread_id, (text) => text.includes("returned:") && text.includes("Sent notes.md"), { ms: WAIT, what: "the model's answer" });
	await telegram.injectMessage(topic.thread_id, "/end");
	await telegram.said(topic.thread_id, (text) => text.startsWith("⏹ Session ended"), { ms: WAIT, what: "the end" });
	await eventually(() => serve.agents().length === 0 && folders().length === 0, WAIT, "Codex and the tool's folder gone");
});
