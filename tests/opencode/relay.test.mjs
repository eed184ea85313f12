// `agent-relay opencode` with the real OpenCode TUI in a tmux pseudo-terminal (not a
// stand-in client): the TUI (`opencode attach`) and the relay are two clients of the
// wrapper's private `opencode serve`, the fake Bot API is Telegram, the fake
// OpenAI-compatible API the model.

import assert from "node:assert/strict";
import { existsSync, readdirSync, readFileSync, watch } from "node:fs";
import { writeFile } from "node:fs/promises";
import { join } from "node:path";
import { performance } from "node:perf_hooks";
import { test } from "node:test";
import { button, CHAT_ID, eventually, isRunning, treeOf, USER_ID, World } from "./harness.mjs";

/** A shell command the fake model runs through OpenCode's `bash` tool. */
const bash = (command) => `[[tool:bash ${JSON.stringify({ command, description: "the test asks" })}]]`;

/** Starts the wrapper and a session in it, typed at the terminal; the session's topic. */
async function session(world, args = []) {
	const wrapper = await world.wrapper(args);
	await world.type("hello from the terminal");
	const topic = await world.topic();
	await world.telegram.said(topic.thread_id, (text) => text.includes("echo: hello from the terminal"), { what: "the terminal's turn's answer" });
	return { wrapper, topic };
}

test("the TUI's session gets a topic, what is typed there is mirrored, a phone message is a turn the TUI shows, and nothing outlives the TUI", async (t) => {
	const world = await World.create(t);
	const { wrapper, topic } = await session(world);
	assert.match(topic.name, /project/);
	await world.telegram.said(topic.thread_id, (text) => text.includes("hello from the terminal") && !text.includes("echo"), { what: "the typed prompt, mirrored" });
	const asked = performance.now();
	await world.telegram.injectMessage(topic.thread_id, "hello from the phone");
	await world.shows(/hello from the phone/, 30_000, "the phone's message");
	await world.telegram.said(topic.thread_id, (text) => text.includes("echo: hello from the phone"), { what: "the answer" });
	t.diagnostic(`phone → answer: ${(performance.now() - asked).toFixed(0)} ms (the message injected into the fake Bot API → the answer sent to the topic)`);
	await world.shows(/echo: hello from the phone/, 30_000, "the answer in the TUI");
	const messages = await world.telegram.messages(topic.thread_id);
	assert.equal(messages.filter((m) => m.plain_text.includes("echo: hello from the phone")).length, 1, "one message for the turn");
	const tree = treeOf(wrapper);
	assert.ok(tree.length >= 3, `the wrapper, the TUI, the server: ${tree}`);
	await world.quit();
	assert.equal(await world.exited(), 0);
	await eventually(() => tree.every((pid) => !isRunning(pid)) && world.servers().length === 0, 15_000, "nothing of the wrapper to be running");
	assert.deepEqual(readdirSync(join(world.relayHome, "run")).filter((n) => n.startsWith("opencode-")), [], "the private folder is gone");
});
