// The launch figures `scripts/bench` prints (issue 39), with the real pi and its
// fake model, in the world of tests/pi/launch.test.mjs:
//
// * `/new` → first answer: `/new <folder> …` injected into the control place →
//   the answer in the new topic; beside it pi alone doing the same work (pi
//   spawned in RPC mode with the same fake model, no relay → its answer), one
//   of each per trial, so the relay's share is the difference of a pair. Where
//   the time goes: each point after the injection, from the relay's milestones
//   and log (AGENT_RELAY_LOG), the fake Bot API's calls and the fake model's
//   requests, all on this machine's wall clock.
// * `serve` restarted: N launched sessions, serve SIGKILLed, a message typed
//   into each topic while it is down, serve started again; per session, from
//   its session joining the relay again ("session registered" in the leader's
//   log) to the answer in its topic. Reference: the same message → answer with
//   serve never killed, before it is.
//
// Prints one JSON object of samples in milliseconds; progress goes to stderr.
//
//   node tests/pi/bench.mjs [trials] [sessions,…] [restart rounds]
//   (AGENT_RELAY_BIN, FAKE_BOT_API_BIN: the binaries; default target/debug)
//
// serve, which leads the bus here, runs with the relay's pacing off
// (AGENT_RELAY_UNLIMITED=1), as the bench's other worlds do.

import { readFileSync, readdirSync } from "node:fs";
import { mkdir } from "node:fs/promises";
import { join } from "node:path";
import { World, eventually, isRunning } from "./harness.mjs";

const TRIALS = Number(process.argv[2] ?? 5);
const SESSIONS = String(process.argv[3] ?? "2,6")
	.split(",")
	.filter(Boolean)
	.map(Number);
const ROUNDS = Number(process.argv[4] ?? 1);
const WAIT = 120_000;
const FIRST = "hello from the phone";

/**
 * serve (which leads here) with the relay's pacing off, as the bench's own
 * worlds run: the trials' messages would spend the group's twenty a minute
 * and the figures would measure the wait for Telegram's budget.
 */
const SERVE = { env: { AGENT_RELAY_UNLIMITED: "1" } };

const say = (what) => process.stderr.write(`  pi bench: ${what}\n`);

/** A stand-in for node:test's `t`: what `World.create` registers runs at the end. */
function scope() {
	const cleanups = [];
	return {
		t: { after: (f) => cleanups.push(f) },
		end: async () => {
			for (const f of cleanups.reverse()) await f();
		},
	};
}

// ------------------------------------------------------------------- clocks

/**
 * The fake Bot API's clock (ms since it started, monotonic) against the wall
 * clock: a `getMe` of our own, timed from here, the tightest of a few.
 */
async function fakeClock(bot) {
	let best = null;
	for (let i = 0; i < 5; i++) {
		const before = Date.now();
		await fetch(`${bot.url}/bot${bot.token}/getMe`).then((r) => r.text());
		const after = Date.now();
		const call = (await bot.calls()).filter((c) => c.method === "getMe").at(-1);
		if (!best || after - before < best.spread) best = { spread: after - before, offset: (before + after) / 2 - call.started_ms };
	}
	return (fakeMs) => fakeMs + best.offset;
}

/** The relay's log lines (every process of the world writes the same files). */
function logLines(world) {
	const dir = join(world.relayHome, "state", "logs");
	return readdirSync(dir)
		.filter((f) => f.endsWith(".log"))
		.flatMap((f) => readFileSync(join(dir, f), "utf8").split("\n"));
}

/** `2026-12-03T17:00:00.123456Z …` → ms on the wall clock, with the µs. */
function lineMs(line) {
	const m = /^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(\.\d+)?Z/.exec(line);
	if (!m) return null;
	return Date.parse(`${m[1]}Z`) + Number(m[2] ?? 0) * 1000;
}

/** The relay's milestones (`src/logging.rs`): `{ step, id, ms }`, oldest first. */
function milestones(lines) {
	const found = [];
	for (const line of lines) {
		const m = /agent_relay::milestone: step="([^"]+)" id=(-?\d+) at_us=(\d+)/.exec(line);
		if (m) found.push({ step: m[1], id: Number(m[2]), ms: Number(m[3]) / 1000 });
	}
	return found.sort((a, b) => a.ms - b.ms);
}

/** When the leader registered the session in slot `slot`, each time, oldest first. */
function registrations(lines, slot) {
	return lines
		.filter((l) => l.includes("session registered") && new RegExp(`slot=${slot}\\b`).test(l))
		.map(lineMs)
		.filter((ms) => ms !== null)
		.sort((a, b) => a - b);
}

/** The fake's record of the bot's message into `threadId` whose text is `text`. */
async function sentCall(bot, threadId, text) {
	const calls = await bot.calls();
	return calls.find(
		(c) => c.method === "sendMessage" && c.ok && c.params?.message_thread_id === threadId && c.params?.text === text,
	);
}

// ------------------------------------------------------------------- /new

/** pi alone: spawned in RPC mode, the same first prompt, the same fake model. */
async function piAlone(world, name) {
	const completions = world.model.completions.length;
	const spawned = Date.now();
	const pi = await world.startPi(name, { extension: null });
	// As serve asks a launched pi: when it answers, it has started.
	await pi.request({ type: "get_state" }, WAIT);
	const ready = Date.now();
	const turn = pi.mark();
	pi.send({ type: "prompt", message: FIRST });
	await pi.waitFor((e) => e.type === "agent_end", { ms: WAIT, from: turn, what: "pi's answer without the relay" });
	const answered = Date.now();
	const asked = world.model.completions[completions].at;
	await pi.close();
	return { total: answered - spawned, ready: ready - spawned, asked: asked - spawned, answered: answered - spawned };
}

/** The points of a launch, in the order they happen, each after the injection. */
const POINTS = [
	["serve got /new", "the leader polled the update"],
	["serve ordered to start pi", "serve took the leader's start order"],
	["pi spawned", "serve spawned pi"],
	["pi answered serve", "pi answered get_state: its extensions loaded"],
	["extension joined", "the session the extension's sidecar runs registered with the leader"],
	["topic created", "createForumTopic answered"],
	["prompt framed", "the leader wrote the first prompt to the session's connection"],
	["sidecar received the prompt", "the session's sidecar read it off the bus"],
	["prompt reached the model", "the fake model got pi's first request"],
	["answer sent", "the answer's sendMessage into the topic answered"],
];

/** The same for pi alone, each after its spawn. */
const ALONE_POINTS = [
	["pi answered", "pi alone answered get_state"],
	["prompt reached the model", "the fake model got its first request"],
	["answer out of pi", "pi alone reported agent_end"],
];

async function launches() {
	const { t, end } = scope();
	try {
		const world = await World.create(t);
		await world.serveConfig();
		const serve = await world.startServe(SERVE);
		const wall = await fakeClock(world.bot);
		// Warm the disk cache for both: the first pi of a run pays for it.
		await piAlone(world, "warm");
		const trials = [];
		for (let i = 0; i < TRIALS; i++) {
			const alone = await piAlone(world, `alone-${i}`);
			const folder = `new-${i}`;
			await mkdir(join(world.work, folder), { recursive: true });
			const completions = world.model.completions.length;
			const injected = Date.now();
			const { update_id } = await world.bot.injectMessage(null, `/new ${folder} ${FIRST}`);
			const topic = await eventually(() => world.topicOf(folder), WAIT, `the topic of ${folder}`);
			const text = `echo: ${FIRST}`;
			const answer = await eventually(() => sentCall(world.bot, topic.thread_id, text), WAIT, `the answer in ${folder}`);
			const created = (await world.bot.calls()).find((c) => c.method === "createForumTopic" && c.ok && c.params?.name === topic.name);
			const asked = world.model.completions.slice(completions).find((r) => r.lastUserText === FIRST);
			trials.push({ injected, update_id, slot: topic.name.split(" · ")[0], created: wall(created.finished_ms), asked: asked.at, answered: wall(answer.finished_ms), alone });
			say(`/new ${i + 1}/${TRIALS}: ${Math.round(wall(answer.finished_ms) - injected)} ms; pi alone ${alone.total} ms`);
			await world.bot.injectMessage(topic.thread_id, "/end");
			await eventually(() => serve.agents().length === 0, WAIT, `${folder} ended`);
		}
		// The logs are written by a thread of each process: read them once all is done.
		await new Promise((done) => setTimeout(done, 300));
		const lines = logLines(world);
		const marks = milestones(lines);
		const after = (step, from, test = () => true) => marks.find((m) => m.step === step && m.ms >= from && test(m))?.ms;
		const out = {
			total_ms: [],
			alone_ms: [],
			share_ms: [],
			own_ms: [],
			points: POINTS.map(([name, how]) => ({ name, how, ms: [] })),
			alone_points: ALONE_POINTS.map(([name, how]) => ({ name, how, ms: [] })),
		};
		for (const trial of trials) {
			const from = trial.injected;
			const spawned = marks.find((m) => m.step === "agent-spawned" && m.ms >= from);
			const joined = registrations(lines, trial.slot).find((ms) => ms >= from);
			const at = [
				after("polled", from, (m) => m.id === trial.update_id),
				after("launch-order", from),
				spawned?.ms,
				after("agent-answered", from, (m) => m.id === spawned?.id),
				joined,
				trial.created,
				joined && after("framed", joined),
				joined && after("received", joined),
				trial.asked,
				trial.answered,
			];
			at.forEach((ms, i) => {
				if (ms !== undefined) out.points[i].ms.push(ms - from);
			});
			[trial.alone.ready, trial.alone.asked, trial.alone.answered].forEach((ms, i) => out.alone_points[i].ms.push(ms));
			// The steps only the relay takes, with nothing of pi's start in them: to
			// pi's spawn; from pi answering serve to the prompt at the session's
			// sidecar; the answer's way out beyond pi alone's from the model to agent_end.
			const [, , spawnedAt, answeredAt, , , , receivedAt] = at;
			if (![spawnedAt, answeredAt, receivedAt].includes(undefined)) {
				const answerOut = trial.answered - trial.asked - (trial.alone.answered - trial.alone.asked);
				out.own_ms.push(spawnedAt - from + Math.max(0, receivedAt - answeredAt) + answerOut);
			}
			const total = trial.answered - from;
			out.total_ms.push(total);
			out.alone_ms.push(trial.alone.total);
			out.share_ms.push(total - trial.alone.total);
		}
		return out;
	} finally {
		await end();
	}
}

// ------------------------------------------------------------------- serve restarted

async function restarted(sessions) {
	const { t, end } = scope();
	try {
		const world = await World.create(t);
		await world.serveConfig();
		let serve = await world.startServe(SERVE);
		const wall = await fakeClock(world.bot);
		const names = Array.from({ length: sessions }, (_, i) => `s${sessions}-${i}`);
		for (const name of names) {
			await mkdir(join(world.work, name), { recursive: true });
			await world.bot.injectMessage(null, `/new ${name} first of ${name}`);
		}
		const topics = [];
		for (const name of names) {
			const topic = await eventually(() => world.topicOf(name), WAIT, `the topic of ${name}`);
			await eventually(() => sentCall(world.bot, topic.thread_id, `echo: first of ${name}`), WAIT, `${name}'s first answer`);
			topics.push({ name, thread: topic.thread_id, slot: topic.name.split(" · ")[0] });
		}
		const out = { sessions, joined_to_answer_ms: [], serve_to_answer_ms: [], reference_ms: [] };
		for (let round = 0; round < ROUNDS; round++) {
			// The reference: a message and its answer, serve never killed.
			for (const { name, thread } of topics) {
				const text = `still there, ${name}, round ${round}`;
				const injected = Date.now();
				await world.bot.injectMessage(thread, text);
				const answer = await eventually(() => sentCall(world.bot, thread, `echo: ${text}`), WAIT, `${name}'s answer`);
				out.reference_ms.push(wall(answer.finished_ms) - injected);
			}
			const pids = serve.agents();
			serve.child.kill("SIGKILL");
			await serve.exited;
			await eventually(() => pids.every((pid) => !isRunning(pid)), WAIT, "the agents end with serve");
			const killed = Date.now();
			for (const { name, thread } of topics) await world.bot.injectMessage(thread, `typed while serve was down, ${name}, round ${round}`);
			const started = Date.now();
			serve = await world.startServe(SERVE);
			const answers = [];
			for (const { name, thread } of topics) {
				const text = `echo: typed while serve was down, ${name}, round ${round}`;
				answers.push(await eventually(() => sentCall(world.bot, thread, text), WAIT, `${name}'s answer after the restart`));
			}
			say(`serve restarted with ${sessions} sessions, round ${round + 1}/${ROUNDS}: all answered ${Math.round(wall(Math.max(...answers.map((a) => a.finished_ms))) - started)} ms after serve started`);
			await new Promise((done) => setTimeout(done, 300));
			const lines = logLines(world);
			topics.forEach(({ slot }, i) => {
				const answered = wall(answers[i].finished_ms);
				const joined = registrations(lines, slot).find((ms) => ms >= killed);
				if (joined !== undefined) out.joined_to_answer_ms.push(answered - joined);
				out.serve_to_answer_ms.push(answered - started);
			});
		}
		return out;
	} finally {
		await end();
	}
}

async function main() {
	say(`/new × ${TRIALS}, each beside pi alone`);
	const launch = await launches();
	const restarts = [];
	for (const sessions of SESSIONS) {
		say(`serve restarted with ${sessions} launched sessions × ${ROUNDS}`);
		restarts.push(await restarted(sessions));
	}
	return { trials: TRIALS, launch, restarts };
}

try {
	process.stdout.write(`${JSON.stringify(await main())}\n`);
	process.exit(0);
} catch (error) {
	process.stderr.write(`${error?.stack ?? error}\n`);
	process.exit(1);
}
