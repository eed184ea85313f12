// How long `claude -p` takes with the relay and without it, in one run: the
// figure `scripts/bench` prints (issue 24: a session's end must not wait for
// Telegram). Each trial runs the real Claude Code against the fake Anthropic
// API; "with the relay" adds `agent-relay mcp` and its hooks against the fake
// Bot API, once with Telegram answering at once and once with it taking 1 s a
// message. Prints one JSON object: the medians in milliseconds.
//
//   node tests/claude/exit-time.mjs [trials]   (AGENT_RELAY_BIN: the binary)

import { join } from "node:path";
import { CHAT_ID, FakeBotApi, REPO } from "../pi/harness.mjs";
import { relayConfig, World } from "./harness.mjs";

const TRIALS = Number(process.argv[2] ?? 5);
const SIDECAR = process.env.AGENT_RELAY_BIN || join(REPO, "target", "debug", "agent-relay");

/** A stand-in for node:test's `t`: what `World.create` registers runs at the end. */
const cleanups = [];
const t = { after: (f) => cleanups.push(f) };

const median = (xs) => {
	const s = [...xs].sort((a, b) => a - b);
	return s[Math.floor(s.length / 2)];
};

async function main() {
	const world = await World.create(t);
	const telegram = await FakeBotApi.start();
	cleanups.push(() => telegram.stop());
	const relay = await relayConfig(world, { chatId: CHAT_ID, userId: 1001, token: telegram.token, url: telegram.url }, SIDECAR);
	const relayArgs = relay.args;
	const env = relay.env;
	const time = async (args, runEnv) => {
		const out = await world.run("say something", { args, env: runEnv });
		if (out.code !== 0) throw new Error(`claude -p failed: ${out.stderr}`);
		if (/Hook cancelled/.test(out.stderr)) throw new Error(`a hook was cancelled: ${out.stderr}`);
		return out.ms;
	};
	// Warm: the first run of each kind pays for caches the others reuse.
	await time([], {});
	await time(relayArgs, env);
	const without = [];
	const withRelay = [];
	const slow = [];
	for (let i = 0; i < TRIALS; i++) {
		without.push(await time([], {}));
		withRelay.push(await time(relayArgs, env));
	}
	await telegram.control("POST", "fault", { method: "sendMessage", fault: { kind: "delay", ms: 1000 }, until_cleared: true });
	for (let i = 0; i < TRIALS; i++) slow.push(await time(relayArgs, env));
	await telegram.control("POST", "clear_faults");
	return {
		trials: TRIALS,
		without_ms: median(without),
		with_relay_ms: median(withRelay),
		with_relay_telegram_1s_ms: median(slow),
	};
}

try {
	console.log(JSON.stringify(await main()));
} finally {
	for (const f of cleanups.reverse()) await f();
}
