// End-to-end: the real pi (the version pinned in package.json) loads
// scripts/pi-extension.ts, which spawns the real agent-relay sidecar, which talks
// to the fake Telegram Bot API. Driven over pi's RPC mode like any RPC client.

import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";
import { test } from "node:test";
import { EXTENSION, World, eventually, isRunning, stripAnsi } from "./harness.mjs";

const SIDECAR_COMMANDS = ["relay", "telegram-connect", "telegram-disconnect", "telegram-status"];
const TEST_MS = 120_000;

const notified = (pi, test, options = {}) =>
	pi.uiRequest("notify", (e) => test(String(e.message)), { what: "a notification", ...options });

async function topicOf(world, name) {
	const topics = await world.bot.topics();
	return topics.find((t) => t.name.endsWith(` · ${name}`));
}

test("pi lists the sidecar's commands and /telegram-status runs with the relay status set", { timeout: TEST_MS }, async (t) => {
	const world = await World.create(t);
	const pi = await world.startPi("alpha");

	const { data } = await pi.request({ type: "get_commands" });
	const ours = data.commands.filter((c) => c.source === "extension" && c.sourceInfo?.path === EXTENSION);
	assert.deepEqual(ours.map((c) => c.name).sort(), SIDECAR_COMMANDS);
	assert.ok(ours.every((c) => c.description), "every command has a description");

	const status = await pi.bound();
	assert.equal(status.statusKey, "relay");
	// An RPC client has no terminal: the status text comes without ANSI colours.
	assert.equal(status.statusText, stripAnsi(status.statusText));
	assert.match(status.statusText, /^TG [A-Z]·alpha ● leader/);

	const from = pi.mark();
	const response = await pi.prompt("/telegram-status");
	assert.equal(response.success, true);
	const report = await notified(pi, (m) => m.includes("binding:"), { from });
	assert.match(report.message, /binding: bound [A-Z] · alpha/);
	assert.match(report.message, /transport: leader/);
});

test("two pi processes get two topics; a message in the second reaches only the second pi", { timeout: TEST_MS }, async (t) => {
	const world = await World.create(t);
	const alpha = await world.startPi("alpha");
	const beta = await world.startPi("beta");
	await Promise.all([alpha.bound(), beta.bound()]);

	const topics = (await world.bot.topics()).filter((topic) => !topic.deleted);
	assert.equal(topics.length, 2, `one topic each: ${JSON.stringify(topics)}`);
	const betaTopic = await topicOf(world, "beta");
	const alphaTopic = await topicOf(world, "alpha");
	assert.ok(alphaTopic && betaTopic && alphaTopic.thread_id !== betaTopic.thread_id);

	const text = `from the phone ${randomUUID()}`;
	const fromAlpha = alpha.mark();
	const fromBeta = beta.mark();
	await world.bot.injectMessage(betaTopic.thread_id, text);

	const isOurs = (e) =>
		e.type === "message_start" &&
		e.message?.role === "user" &&
		JSON.stringify(e.message.content).includes(text);
	await beta.waitFor(isOurs, { ms: 30_000, from: fromBeta, what: "the relayed user message" });
	// The turn it started runs to its end on the fake model, so pi really took it as a prompt.
	await beta.waitFor((e) => e.type === "agent_end", { ms: 30_000, from: fromBeta, what: "the end of the turn" });
	assert.deepEqual(world.model.prompts, [text], "the model saw the message once, from beta");
	assert.equal(alpha.events.slice(fromAlpha).filter(isOurs).length, 0, "alpha never got it");
});

test("/telegram-disconnect asks pi to confirm: no keeps the topic, yes deletes it", { timeout: TEST_MS }, async (t) => {
	const world = await World.create(t);
	const pi = await world.startPi("alpha");
	await pi.bound();
	const topic = await topicOf(world, "alpha");
	assert.ok(topic && !topic.deleted);

	let from = pi.mark();
	const declined = pi.prompt("/telegram-disconnect", 60_000);
	const ask = await pi.uiRequest("confirm", (e) => e.title === "Disconnect from Telegram", { from });
	assert.match(ask.message, /alpha/);
	pi.send({ type: "extension_ui_response", id: ask.id, confirmed: false });
	assert.equal((await declined).success, true);
	// A "no" is the user's choice: told as information, not as an error in red.
	const cancelled = await notified(pi, (m) => m.includes("nothing changed"), { from });
	assert.equal(cancelled.notifyType, "info");
	assert.equal(cancelled.message, "Disconnect cancelled; nothing changed.");
	assert.equal((await topicOf(world, "alpha")).deleted, false);
	assert.ok(!(await world.bot.calls()).some((c) => c.method === "deleteForumTopic"), "no deletion was tried");

	from = pi.mark();
	const accepted = pi.prompt("/telegram-disconnect", 60_000);
	const again = await pi.uiRequest("confirm", (e) => e.title === "Disconnect from Telegram", { from });
	pi.send({ type: "extension_ui_response", id: again.id, confirmed: true });
	assert.equal((await accepted).success, true);
	await notified(pi, (m) => m.startsWith("Deleted"), { from });
	assert.equal((await topicOf(world, "alpha")).deleted, true);
});

test("/relay restart from one pi brings both sessions back: complete 2/2", { timeout: TEST_MS }, async (t) => {
	const world = await World.create(t);
	const alpha = await world.startPi("alpha");
	const beta = await world.startPi("beta");
	await Promise.all([alpha.bound(), beta.bound()]);

	const from = alpha.mark();
	const response = await alpha.prompt("/relay restart", 90_000);
	assert.equal(response.success, true);
	const outcome = await notified(alpha, (m) => m.startsWith("Relay restart"), { from, ms: 5_000 });
	assert.match(outcome.message, /^Relay restarted: complete 2\/2/);
});

test("closing pi's stdin ends its sidecar too", { timeout: TEST_MS }, async (t) => {
	const world = await World.create(t);
	const pi = await world.startPi("alpha");
	await pi.bound();
	const sidecars = pi.sidecars();
	assert.equal(sidecars.length, 1, "one sidecar per pi process");

	pi.child.stdin.end();
	const exit = await pi.exited;
	assert.deepEqual(exit, { code: 0, signal: null });
	await eventually(() => !isRunning(sidecars[0]), 10_000, "the sidecar to end");
});

test("a missing agent-relay binary is reported, not silent", { timeout: TEST_MS }, async (t) => {
	const world = await World.create(t);
	const pi = await world.startPi("alpha", { env: { AGENT_RELAY_BIN: `${world.root}/no-such-agent-relay` } });

	const notice = await notified(pi, (m) => m.startsWith("agent-relay not found"));
	assert.equal(notice.notifyType, "error");
	assert.match(notice.message, /AGENT_RELAY_BIN/);
	const status = await pi.uiRequest("setStatus", (e) => e.statusKey === "relay");
	assert.equal(stripAnsi(status.statusText), "TG ✕ agent-relay missing");

	// pi itself keeps working: its RPC still answers.
	const state = await pi.request({ type: "get_state" });
	assert.equal(state.success, true);
});
