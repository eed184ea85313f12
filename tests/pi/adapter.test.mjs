// The adapter's half of the host protocol, checked inside the real pi against a
// scripted stand-in sidecar (fixtures/scripted-sidecar.mjs): what pi tells the
// sidecar, and how pi serves the sidecar's requests.

import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";
import { existsSync, readFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { test } from "node:test";
import { fileURLToPath } from "node:url";
import { EXTENSION, World, eventually } from "./harness.mjs";

const here = dirname(fileURLToPath(import.meta.url));
const SCRIPTED = join(here, "fixtures", "scripted-sidecar.mjs");
const PI_VERSION = JSON.parse(readFileSync(join(here, "package.json"), "utf8")).devDependencies[
	"@mariozechner/pi-coding-agent"
];

function readLog(path) {
	if (!existsSync(path)) return [];
	return readFileSync(path, "utf8")
		.split("\n")
		.filter((line) => line !== "")
		.map((line) => JSON.parse(line));
}

test("the adapter speaks the host protocol from inside pi", { timeout: 120_000 }, async (t) => {
	const world = await World.create(t);
	const log = join(world.root, "sidecar.log");
	const text = `relayed ${randomUUID()}`;
	const pi = await world.startPi("alpha", {
		env: { AGENT_RELAY_BIN: SCRIPTED, SCRIPTED_LOG: log, SCRIPTED_TEXT: text },
	});

	// agent/sendUserMessage → a real user turn in pi, answered by the fake model.
	const isRelayed = (e) =>
		e.type === "message_start" && e.message?.role === "user" && JSON.stringify(e.message.content).includes(text);
	await pi.waitFor(isRelayed, { ms: 30_000, what: "the relayed user message" });
	await pi.waitFor((e) => e.type === "agent_end", { ms: 30_000, what: "the end of the turn" });
	assert.deepEqual(world.model.prompts, [text]);

	// ui/setStatus → pi's status line with the sidecar's text; over RPC (no terminal)
	// without colour codes.
	const status = await pi.uiRequest("setStatus", (e) => e.statusKey === "relay");
	assert.equal(status.statusText, "TG scripted");

	// Commands are the sidecar's: registered from its `initialize` answer.
	const { data } = await pi.request({ type: "get_commands" });
	assert.ok(data.commands.some((c) => c.name === "scripted-only"), "the sidecar's own command is listed");
	let from = pi.mark();
	await pi.prompt("/scripted-only some args");
	await pi.uiRequest("notify", (e) => e.message === "ran scripted-only some args", { from });
	from = pi.mark();
	await pi.prompt("/relay restart");
	await pi.uiRequest("notify", (e) => e.message === "ran relay restart", { from });

	const host = await eventually(
		() => {
			const entries = readLog(log).filter((m) => m.from === "host");
			return entries.some((m) => m.method === "agent/ended") ? entries : undefined;
		},
		10_000,
		"agent/ended to reach the sidecar",
	);
	const initialize = host.find((m) => m.method === "initialize");
	assert.equal(initialize.params.protocolVersion, 1);
	assert.deepEqual(initialize.params.host, { name: "pi", version: PI_VERSION });
	assert.equal(initialize.params.pid, pi.child.pid);
	assert.equal(initialize.params.cwd, join(world.root, "alpha"));
	assert.equal(initialize.params.hasUI, true);
	assert.ok(initialize.params.session.id, "pi's session id is passed on");

	const notification = (method) => host.find((m) => m.method === method && m.id === undefined);
	assert.ok(notification("initialized"));
	assert.deepEqual(notification("input/received").params, { text, source: "extension" });
	assert.ok(notification("agent/started"));
	assert.ok(notification("turn/started"));
	assert.deepEqual(notification("turn/ended").params, { assistantText: `echo: ${text}`, toolCalls: [] });
	// The end of a run is a request: the sidecar answers once the answer is handed over.
	const ended = host.find((m) => m.method === "agent/ended");
	assert.deepEqual(ended.params, { lastAssistantText: `echo: ${text}` });

	const reply = (id) => host.find((m) => m.id === id && m.method === undefined);
	assert.deepEqual(reply("send-1").result, { accepted: true });
	assert.equal(reply("unknown-1").error.code, -32601);

	// Quitting pi says goodbye, then closes the pipe.
	pi.child.stdin.end();
	assert.deepEqual(await pi.exited, { code: 0, signal: null });
	const tail = readLog(log).slice(-3);
	assert.deepEqual(
		tail.map((m) => m.method ?? m.event),
		["session/shutdown", "shutdown", "eof"],
	);
	assert.deepEqual(tail[0].params, { reason: "quit" });
});

test("a complete argument gets no completion list, so one Enter runs /relay status", async (t) => {
	// pi's own loader, as pi runs it: the extension registers its commands at load.
	const { discoverAndLoadExtensions } = await import("@mariozechner/pi-coding-agent");
	const world = await World.create(t);
	const { extensions, errors } = await discoverAndLoadExtensions([EXTENSION], world.root, world.agentDir);
	assert.deepEqual(errors, []);
	const relay = extensions.flatMap((e) => [...e.commands.values()]).find((c) => c.name === "relay");
	assert.ok(relay?.getArgumentCompletions, "/relay completes its argument");
	const complete = (prefix) => relay.getArgumentCompletions(prefix);
	assert.deepEqual(complete("sta"), [{ value: "status", label: "status" }]);
	assert.deepEqual(
		complete("").map((i) => i.value),
		["status", "restart"],
	);
	// While pi's TUI shows a list, Enter applies the selection instead of submitting.
	assert.equal(complete("status"), null);
	assert.equal(complete("restart"), null);
	assert.equal(complete("status "), null);
	assert.equal(complete("reboot"), null);
});
