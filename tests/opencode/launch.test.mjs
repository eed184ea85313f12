// OpenCode launched by the relay (docs/DESIGN.md, *Launching*): `agent-relay serve`
// runs the real `opencode serve` with the relay as its only client, and plays the host
// of its session. `/new project opencode …` starts it in its own topic, the first prompt
// is answered there, a second message is a second turn of the same process, a command
// asks on the phone and Allow runs it (and sees no bot token), `/stop` aborts a turn,
// `/model` lists OpenCode's providers' models and switches (the fake API sees the new
// name), a file comes back through the relay's send_file, `/end` then Resume keep the
// topic and the history, and serve killed and started again brings the session back in
// its topic.

import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { existsSync, readdirSync, readFileSync } from "node:fs";
import { writeFile } from "node:fs/promises";
import { join } from "node:path";
import { test } from "node:test";
import { button, deadline, eventually, isOpen, OPENCODE, World } from "./harness.mjs";

const WAIT = 60_000;

function buttons(message) {
	return (message.reply_markup?.inline_keyboard ?? []).flat();
}

/** Every text the model was given in a request. */
const history = (request) => JSON.stringify(request.body.messages);

/**
 * The first prompt to OpenCode alone (no relay): `opencode serve` spawned, a session
 * created, a prompt sent, to the session idle again, in ms — what of the time from
 * `/new` to the first answer is OpenCode's and the model's.
 */
async function opencodeAlone(world, text) {
	const asked = Date.now();
	const server = spawn(OPENCODE, ["serve", "--hostname", "127.0.0.1", "--port", "0"], {
		cwd: world.project,
		env: world.env,
		stdio: ["ignore", "pipe", "ignore"],
	});
	try {
		const url = await deadline(
			new Promise((done) => {
				let out = "";
				server.stdout.on("data", (c) => {
					out += c;
					const m = /listening on (http:\S+)/.exec(out);
					if (m) done(m[1]);
				});
			}),
			WAIT,
			"opencode serve to listen",
		);
		const call = async (method, path, body) => {
			const response = await fetch(`${url}${path}`, { method, headers: { "content-type": "application/json" }, body: body && JSON.stringify(body) });
			return response.status === 204 ? null : response.json();
		};
		const events = await fetch(`${url}/event`);
		const reader = events.body.getReader();
		const session = await call("POST", "/session", {});
		await call("POST", `/session/${session.id}/prompt_async`, { parts: [{ type: "text", text }] });
		let seen = "";
		await deadline(
			(async () => {
				for (;;) {
					const { value, done } = await reader.read();
					if (done) throw new Error("the event stream ended");
					seen += Buffer.from(value).toString("utf8");
					if (/"type":"session.status","properties":\{"sessionID":"[^"]+","status":\{"type":"idle"/.test(seen)) return;
				}
			})(),
			WAIT,
			"OpenCode alone to answer",
		);
		reader.cancel().catch(() => {});
		return Date.now() - asked;
	} finally {
		server.kill("SIGKILL");
	}
}

test("/new … opencode runs opencode serve in its own topic: turns, an approval, /stop, /model, a file back, /end and resume, serve restarted", async (t) => {
	const world = await World.create(t);
	const { telegram, fake } = world;
	let serve = await world.serve();
	const asked = Date.now();
	await telegram.injectMessage(null, "/new project opencode hello from the phone");
	const started = await telegram.said(null, (text) => text.includes("started"), { ms: WAIT, what: "the /new answer" });
	assert.match(started.plain_text, /▶ opencode started: [A-Z] · project/);
	const topic = await eventually(async () => (await telegram.topics()).find((x) => x.name.endsWith(" · project")), WAIT, "the topic");
	await telegram.said(topic.thread_id, (text) => text === "echo: hello from the phone", { ms: WAIT, what: "the first answer" });
	const firstAnswer = Date.now() - asked;
	const modelAsked = fake.turns[0].at - asked;
	const [pid] = serve.agents();
	assert.ok(pid, "opencode serve is serve's child");

	await telegram.injectMessage(topic.thread_id, "a second turn");
	await telegram.said(topic.thread_id, (text) => text === "echo: a second turn", { ms: WAIT, what: "the second turn" });
	assert.deepEqual(serve.agents(), [pid], "the same process, kept running between turns");
	assert.ok(history(fake.turns.at(-1)).includes("hello from the phone"), "one session");

	const made = join(world.project, "made-by-phone");
	const command = JSON.stringify({ command: "env > made-by-phone && echo made", description: "the test asks" });
	await telegram.injectMessage(topic.thread_id, `make it [[tool:bash ${command}]]`);
	const approval = await eventually(
		async () => (await telegram.messages(topic.thread_id)).find((m) => isOpen(m) && m.plain_text.includes("made-by-phone")),
		WAIT,
		"the approval on the phone",
	);
	assert.ok(!existsSync(made), "nothing runs before the tap");
	await telegram.tap(topic.thread_id, approval.message_id, button(approval, "Allow"));
	await telegram.said(topic.thread_id, (text) => text.includes("tool bash returned") && text.includes("made"), { ms: WAIT, what: "the command's result" });
	const seen = readFileSync(made, "utf8");
	assert.ok(!seen.includes(telegram.token) && !/^TELEGRAM_BOT_TOKEN=/m.test(seen), "no bot token for the model's commands");
	assert.match(seen, /^AGENT_RELAY_LAUNCH_ID=\w+$/m);

	await telegram.injectMessage(topic.thread_id, "a long one [[hang]]");
	const held = await fake.next((r) => r.lastUserText.includes("a long one"));
	await telegram.injectMessage(topic.thread_id, "/stop");
	await telegram.said(topic.thread_id, (text) => text === "⏹ Stopped.", { ms: WAIT, what: "the stop" });
	await eventually(() => held.aborted, WAIT, "the model's request given up");
	await telegram.injectMessage(topic.thread_id, "after the stop");
	await telegram.said(topic.thread_id, (text) => text === "echo: after the stop", { ms: WAIT, what: "a turn after /stop" });

	await telegram.injectMessage(topic.thread_id, "/model");
	const list = await telegram.said(topic.thread_id, (text) => text.startsWith("🧠 Model of opencode"), { ms: WAIT, what: "the models" });
	t.diagnostic(`/model offers: ${buttons(list).map((b) => b.text).join(" | ")}`);
	const other = buttons(list).find((b) => /other-model/.test(b.text));
	assert.ok(other, JSON.stringify(buttons(list)));
	await telegram.tap(topic.thread_id, list.message_id, other.callback_data);
	await telegram.said(topic.thread_id, (text) => text.startsWith("🧠 Model:"), { ms: WAIT, what: "the switch" });
	await telegram.injectMessage(topic.thread_id, "on another model");
	await telegram.said(topic.thread_id, (text) => text === "echo: on another model", { ms: WAIT, what: "a turn after the switch" });
	assert.equal(fake.turns.at(-1).model, "other-model", "the fake API sees the new model");

	await writeFile(join(world.project, "notes.md"), "# notes\n");
	const run = join(world.relayHome, "run");
	const folders = () => (existsSync(run) ? readdirSync(run) : []).filter((n) => n.startsWith("opencode-launch-"));
	assert.equal(folders().length, 1, "the tool's folder while OpenCode runs");
	fake.queue({ toolCall: { name: "agent_relay_send_file", arguments: { path: "notes.md", caption: "the notes" } } });
	await telegram.injectMessage(topic.thread_id, "send me the notes");
	const sent = await telegram.said(topic.thread_id, (text) => text === "the notes", { ms: WAIT, what: "the file in the topic" });
	assert.equal((await telegram.fileContent(sent.media.file_id)).toString("utf8"), "# notes\n");

	await telegram.injectMessage(topic.thread_id, "/end");
	const ended = await telegram.said(topic.thread_id, (text) => text.startsWith("⏹ Session ended"), { ms: WAIT, what: "the end" });
	await eventually(() => serve.agents().length === 0 && folders().length === 0, WAIT, "OpenCode and the tool's folder gone");
	await telegram.tap(topic.thread_id, ended.message_id, buttons(ended).find((b) => b.text.includes("Resume")).callback_data);
	await eventually(async () => (await telegram.topics()).find((x) => x.thread_id === topic.thread_id)?.closed === false, WAIT, "reopened");
	await telegram.injectMessage(topic.thread_id, "after the resume");
	await telegram.said(topic.thread_id, (text) => text === "echo: after the resume", { ms: WAIT, what: "a turn after the resume" });
	const resumed = history(fake.turns.at(-1));
	assert.ok(resumed.includes("hello from the phone") && resumed.includes("a second turn"), "the history came back");
	assert.equal(fake.turns.at(-1).model, "other-model", "the model chosen before the end");

	serve.child.kill("SIGKILL");
	await serve.exited;
	await eventually(() => serve.agents().length === 0, WAIT, "OpenCode gone with serve");
	serve = await world.serve();
	await eventually(() => serve.agents().length === 1, WAIT, "OpenCode back under the new serve");
	await telegram.injectMessage(topic.thread_id, "after serve came back");
	await telegram.said(topic.thread_id, (text) => text === "echo: after serve came back", { ms: WAIT, what: "a turn after serve came back" });
	assert.ok(history(fake.turns.at(-1)).includes("after the resume"), "the same session");
	assert.equal((await telegram.topics()).filter((x) => !x.deleted).length, 1, "still one topic");

	const alone = await opencodeAlone(world, "hello alone");
	t.diagnostic(
		`from /new to the first answer: ${firstAnswer} ms (the model asked at ${modelAsked} ms); OpenCode alone (spawn → answer): ${alone} ms; the relay's share: ${firstAnswer - alone} ms`,
	);
});
