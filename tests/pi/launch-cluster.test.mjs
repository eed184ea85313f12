// Launching across machines (docs/DESIGN.md, *Launching*; docs/CLUSTER.md): two relay
// homes with distinct node names on one real `nats-server -js`, each with its own
// `agent-relay serve`. `/new box:…` in the control place starts pi on box, whichever
// machine answers the control place; `/sessions` lists the sessions of both machines.
// Needs `nats-server` (Debian's package; .ci/run installs it).

import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { existsSync } from "node:fs";
import { mkdir } from "node:fs/promises";
import { createServer } from "node:net";
import { join } from "node:path";
import { test } from "node:test";
import { World, eventually } from "./harness.mjs";

const WAIT = 90_000;

function natsBinary() {
	for (const dir of [...(process.env.PATH ?? "").split(":"), "/usr/sbin", "/usr/local/bin"]) {
		const candidate = join(dir, "nats-server");
		if (dir && existsSync(candidate)) return candidate;
	}
	throw new Error("nats-server is missing: `apt-get install nats-server` (.ci/run does)");
}

async function freePort() {
	const server = createServer();
	await new Promise((done) => server.listen(0, "127.0.0.1", done));
	const { port } = server.address();
	await new Promise((done) => server.close(done));
	return port;
}

/** A real nats-server with JetStream on loopback, killed when `t` ends. */
async function startNats(t, dir) {
	const port = await freePort();
	await mkdir(dir, { recursive: true });
	const child = spawn(natsBinary(), ["-js", "-a", "127.0.0.1", "-p", String(port), "-sd", join(dir, "store")], {
		stdio: ["ignore", "ignore", "pipe"],
	});
	let log = "";
	child.stderr.on("data", (c) => {
		log = (log + c).slice(-8192);
	});
	t.after(() => child.kill("SIGKILL"));
	await eventually(() => log.includes("Server is ready"), 20_000, `nats-server ready: ${log}`);
	return `nats://127.0.0.1:${port}`;
}

test("/new box:… starts pi on box, and /sessions lists every machine's sessions", async (t) => {
	const world = await World.create(t);
	const nats = await startNats(t, join(world.root, "nats"));
	const machines = {};
	for (const name of ["laptop", "box"]) {
		const home = join(world.root, `relay-${name}`);
		const work = join(world.work, name);
		await mkdir(join(work, "api"), { recursive: true });
		await world.serveConfig({
			home,
			roots: [work],
			extra: `[cluster]\nnats_url = ${JSON.stringify(nats)}\nnode_name = ${JSON.stringify(name)}\n`,
		});
		machines[name] = { home, work, serve: await world.startServe({ env: { AGENT_RELAY_HOME: home } }) };
	}
	// Both machines in the cluster, one of them polling Telegram.
	await eventually(
		async () => {
			const status = await world.relayStatus({ AGENT_RELAY_HOME: machines.laptop.home });
			return status.includes("2 machine(s)") && status.includes("polls Telegram (term");
		},
		WAIT,
		"both machines in the cluster",
	);

	await world.bot.injectMessage(null, `/new box:${join(machines.box.work, "api")} hello box`);
	await world.bot.said(null, (text) => text.includes("started: ") && text.includes("box"), { ms: WAIT, what: "started on box" });
	const onBox = await eventually(() => world.topicOf("box · api"), WAIT, "box's topic");
	await world.bot.said(onBox.thread_id, (text) => text === "echo: hello box", { ms: WAIT, what: "box answers" });
	assert.equal(machines.box.serve.agents().length, 1, "pi runs under box's serve");
	assert.equal(machines.laptop.serve.agents().length, 0, "and not under laptop's");

	await world.bot.injectMessage(null, `/new laptop:${join(machines.laptop.work, "api")} hello laptop`);
	const onLaptop = await eventually(() => world.topicOf("laptop · api"), WAIT, "laptop's topic");
	await world.bot.said(onLaptop.thread_id, (text) => text === "echo: hello laptop", { ms: WAIT, what: "laptop answers" });

	await world.bot.injectMessage(null, "/sessions");
	const list = await world.bot.said(null, (text) => text.startsWith("Sessions"), { ms: WAIT, what: "the session list" });
	// Who started each, named by the machine that shows the list, the other machine's too.
	assert.match(list.plain_text, /box · api — ● live · pi \(launched\) · by Alice · box/);
	assert.match(list.plain_text, /laptop · api — ● live · pi \(launched\) · by Alice · laptop/);
	const ends = (list.reply_markup?.inline_keyboard ?? []).flat().filter((b) => b.text.startsWith("⏹"));
	assert.equal(ends.length, 2, "an end button for each, wherever it runs");
});
