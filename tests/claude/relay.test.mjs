// The relay inside the real Claude Code (print mode, offline): `agent-relay mcp`
// configured with --mcp-config and `agent-relay hook <event>` with --settings, the
// fake Bot API as Telegram, the fake Anthropic API as the model.
//
// * the session gets its topic at start (SessionStart), the model's answer lands
//   in it (Stop), and the `reply` tool posts into it;
// * a Bash call that needs permission waits for the tap on the phone
//   (PermissionRequest), shown as waiting in the progress message, and runs
//   only on Allow; Deny reaches the model;
// * `--resume` brings the session back into its old topic;
// * nothing is lost when a session ends: with Telegram slow, the answer lands
//   though Claude Code kills its MCP server right after it; two sessions ending
//   together both land; a message written while the last turn runs reaches that
//   turn through the Stop hook (a session that ends before any turn took a
//   message leaves it for the session resumed: tests/handover.rs).
//
// Not testable offline: channel delivery into a turn. Print mode ignores
// `notifications/claude/channel`, and the terminal UI's channels sit behind a
// server-side flag that cannot be fetched offline; tests/claude_code.rs covers the
// notifications with an MCP client instead.

import assert from "node:assert/strict";
import { existsSync } from "node:fs";
import { join } from "node:path";
import { test } from "node:test";
import { CHAT_ID, eventually, FakeBotApi, isOpen, isSettled, REPO } from "../pi/harness.mjs";
import { relayConfig, World } from "./harness.mjs";

const telegramIds = { chatId: CHAT_ID, userId: 1001 };

const SIDECAR = process.env.AGENT_RELAY_BIN || join(REPO, "target", "debug", "agent-relay");
/** A world whose Claude Code runs the relay against its own fake Telegram. */
async function relayWorld(t) {
	assert.ok(existsSync(SIDECAR), `${SIDECAR} is missing: run \`cargo build --bins\` first`);
	const world = await World.create(t);
	const telegram = await FakeBotApi.start();
	t.after(() => telegram.stop());
	const relay = await relayConfig(world, { ...telegramIds, token: telegram.token, url: telegram.url }, SIDECAR, { log: "debug" });
	const run = (prompt, args = []) => world.run(prompt, { args: [...relay.args, ...args], env: relay.env });
	return { world, telegram, run };
}

async function topicOf(telegram) {
	const topics = await eventually(async () => {
		const live = (await telegram.topics()).filter((t) => !t.deleted);
		return live.length > 0 && live;
	}, 20_000, "the session's topic");
	assert.equal(topics.length, 1, JSON.stringify(topics));
	return topics[0];
}

test("the session gets its topic at start, reply posts into it, and the answer arrives through Stop", async (t) => {
	const { world, telegram, run } = await relayWorld(t);
	const cue = '[[tool:mcp__agent-relay__reply {"text":"**Tests** pass: 12 of 12"}]]';
	const out = await run(`report to the phone ${cue}`, ["--allowedTools", "mcp__agent-relay__reply"]);
	assert.equal(out.code, 0, out.stderr);
	assert.equal(out.result?.is_error, false, JSON.stringify(out.result));
	const topic = await topicOf(telegram);
	assert.equal(topic.name, "A · project");
	const reply = await telegram.said(topic.thread_id, (text) => text === "Tests pass: 12 of 12", { what: "the reply tool's message" });
	assert.match(reply.text, /<b>Tests<\/b>/, "Markdown rendered to Telegram HTML");
	const answer = await telegram.said(topic.thread_id, (text) => text.includes("returned: Sent to the Telegram topic."), {
		what: "the final answer, posted by the Stop hook",
	});
	assert.match(answer.plain_text, /^tool mcp__agent-relay__reply returned/);
	assert.deepEqual(world.fake.unknown ?? [], [], "Claude Code asked for nothing the fake does not serve");
});

test("a Bash call waits for the tap: Allow runs it, Deny blocks it and the model hears why", async (t) => {
	const { world, telegram, run } = await relayWorld(t);
	const allowFile = join(world.project, "allowed-by-phone");
	const tapWhenAsked = async (label) => {
		const topic = await topicOf(telegram);
		const asked = await eventually(
			async () => (await telegram.messages(topic.thread_id)).find((m) => isOpen(m) && m.plain_text.includes("wants to run")),
			30_000,
			"the approval message",
		);
		const button = asked.reply_markup.inline_keyboard.flat().find((b) => b.text.includes(label));
		assert.ok(button, JSON.stringify(asked.reply_markup));
		assert.ok(!existsSync(allowFile), "nothing runs before the tap");
		// The progress shows the call waiting (PermissionRequest names no call:
		// the tool's name finds PreToolUse's step).
		await telegram.said(topic.thread_id, (text) => text.startsWith("⏸ Waiting") && text.includes("🔐 Bash: ") && text.includes("— waits for your approval"), {
			what: "the progress message showing the call waiting",
		});
		await telegram.tap(topic.thread_id, asked.message_id, button.callback_data);
		return { topic, asked };
	};

	const allowed = run(`make the file [[tool:Bash {"command":"touch allowed-by-phone && echo made"}]]`);
	const { topic, asked } = await tapWhenAsked("✅ Allow");
	const out = await allowed;
	assert.equal(out.code, 0, out.stderr);
	assert.ok(existsSync(allowFile), "Allow ran the command");
	assert.match(out.result.result, /tool Bash returned: made/);
	const settled = await eventually(async () => {
		const m = await telegram.message(asked.message_id);
		return isSettled(m) && m;
	}, 20_000, "the approval message to settle");
	assert.match(settled.plain_text, /✅ Allow — \S+, \d\d:\d\d UTC$/, "who allowed it, and when");

	const denyFile = join(world.project, "denied-by-phone");
	// `--resume`: the same Claude Code session, so the same topic.
	const denied = run(`try again [[tool:Bash {"command":"touch denied-by-phone && echo made"}]]`, [
		"--resume",
		out.result.session_id,
	]);
	const second = await eventually(
		async () =>
			(await telegram.messages(topic.thread_id)).find(
				(m) => isOpen(m) && m.plain_text.includes("denied-by-phone"),
			),
		30_000,
		"the second approval message",
	);
	const deny = second.reply_markup.inline_keyboard.flat().find((b) => b.text.includes("Deny"));
	await telegram.tap(topic.thread_id, second.message_id, deny.callback_data);
	const out2 = await denied;
	assert.equal(out2.code, 0, out2.stderr);
	assert.ok(!existsSync(denyFile), "Deny blocked the command");
	assert.match(out2.result.result, /tool Bash failed: .*denied/i);
	assert.equal(out2.result.permission_denials?.length, 1, JSON.stringify(out2.result));
	assert.equal((await topicOf(telegram)).thread_id, topic.thread_id, "the resumed session kept its topic");
});

test("a message from the phone while a turn runs reaches that turn through the Stop hook", async (t) => {
	const { world, telegram, run } = await relayWorld(t);
	const running = run('take a while [[tool:Bash {"command":"sleep 4; echo slept"}]]', ["--allowedTools", "Bash"]);
	const topic = await topicOf(telegram);
	await eventually(() => world.fake.turns.length > 0, 20_000, "the turn under way");
	await telegram.injectMessage(topic.thread_id, "and also check the logs");
	const out = await running;
	assert.equal(out.code, 0, out.stderr);
	const continued = world.fake.turns.find((turn) => JSON.stringify(turn.body.messages).includes("and also check the logs"));
	assert.ok(continued, "the turn went on with the phone's message");
	assert.match(JSON.stringify(continued.body.messages), /sent these messages from Telegram while you were working/);
	const said = (await telegram.messages(topic.thread_id)).map((m) => m.plain_text);
	assert.ok(!said.some((text) => text.startsWith("📥")), `no "not taken" notice: ${JSON.stringify(said)}`);
	assert.ok(said.some((text) => text.includes("tool Bash returned: slept")), "the answer before the message reached the topic");
});

test("with Telegram taking 1 s a message, claude -p exits at once and its answer still lands", async (t) => {
	const { world, telegram, run } = await relayWorld(t);
	// Warm: the topic exists, so what is slow below is the answer alone.
	const first = await run("say hello");
	assert.equal(first.code, 0, first.stderr);
	const topic = await topicOf(telegram);
	await telegram.control("POST", "fault", { method: "sendMessage", fault: { kind: "delay", ms: 1000 }, until_cleared: true });
	const out = await run("the slow one", ["--resume", first.result.session_id]);
	assert.equal(out.code, 0, out.stderr);
	assert.doesNotMatch(out.stderr, /Hook cancelled/, "every hook ended in its time");
	// Claude Code SIGKILLs its MCP server 0.5 s after its answer; the answer
	// was handed over before, and a drain sends it.
	await telegram.said(topic.thread_id, (text) => text.includes("echo: the slow one"), {
		what: "the answer of a session that exited while Telegram was slow",
	});
	await telegram.control("POST", "clear_faults");
	t.diagnostic(`claude -p took ${out.ms} ms with the relay (the warm run ${first.ms} ms)`);
	assert.deepEqual(world.fake.unknown ?? [], []);
});

test("two sessions ending together both get their answers, Telegram slow", async (t) => {
	const { world, telegram, run } = await relayWorld(t);
	await telegram.control("POST", "fault", { method: "sendMessage", fault: { kind: "delay", ms: 300 }, until_cleared: true });
	const [one, two] = await Promise.all([run("first of two"), run("second of two")]);
	assert.equal(one.code, 0, one.stderr);
	assert.equal(two.code, 0, two.stderr);
	const topics = await eventually(async () => {
		const live = (await telegram.topics()).filter((x) => !x.deleted);
		return live.length === 2 && live;
	}, 20_000, "two topics");
	for (const text of ["echo: first of two", "echo: second of two"]) {
		const found = await eventually(async () => {
			for (const tp of topics) {
				const here = (await telegram.messages(tp.thread_id)).filter((m) => m.plain_text.includes(text));
				if (here.length > 0) return { tp, here };
			}
			return false;
		}, 30_000, `${text} in a topic`);
		assert.equal(found.here.length, 1, `${text} exactly once`);
	}
	await telegram.control("POST", "clear_faults");
});

test("Claude Code's own retries: a 503 it tries again is no failure; a turn whose every try fails is said once, with the error", async (t) => {
	const { world, telegram } = await relayWorld(t);
	const relay = await relayConfig(world, { ...telegramIds, token: telegram.token, url: telegram.url }, SIDECAR);
	// One more try after a failure (Claude Code's default is ten, over minutes).
	const env = { ...relay.env, CLAUDE_CODE_MAX_RETRIES: "1" };
	const run = (prompt, args = []) => world.run(prompt, { args: [...relay.args, ...args], env });
	const down = { error: { status: 503, type: "overloaded_error", message: "still down" } };

	world.fake.queue(down, { text: "the real answer" });
	const first = await run("hello");
	assert.equal(first.code, 0, first.stderr);
	const topic = await topicOf(telegram);
	await telegram.said(topic.thread_id, (text) => text === "the real answer", { what: "the answer after Claude Code tried again" });

	world.fake.queue(down, down);
	const failed = await run("and now?", ["--resume", first.result.session_id]);
	assert.equal(failed.result?.is_error, true, "Claude Code gave up after its one more try");
	assert.equal(world.fake.turns.length, 4, "two tries a turn");
	const said = await telegram.said(topic.thread_id, (text) => text.startsWith("⚠️ The turn failed:"), { what: "the failure in the topic" });
	assert.match(said.plain_text, /^⚠️ The turn failed: 503 still down\. .*No answer came of it\.$/s);
	// Settled: a third turn's answer is in the topic after everything of the second.
	world.fake.queue({ text: "the third answer" });
	const third = await run("and again?", ["--resume", first.result.session_id]);
	assert.equal(third.code, 0, third.stderr);
	await telegram.said(topic.thread_id, (text) => text === "the third answer", { what: "the next turn's answer" });
	const texts = (await telegram.messages(topic.thread_id)).map((m) => m.plain_text);
	assert.deepEqual(
		texts.filter((text) => !/^(🟢|🧑‍💻)/u.test(text)),
		["the real answer", said.plain_text, "the third answer"],
		`the answer once, the failure once, never Claude Code's error line as an answer: ${JSON.stringify(texts)}`,
	);
});
