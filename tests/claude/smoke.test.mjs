// The real Claude Code (pinned in package.json) runs whole turns offline against
// the fake Anthropic API: text answers, a Bash call decided by a PermissionRequest
// hook, the hooks' stdin, an MCP server's handshake and tool call, and a
// --permission-prompt-tool. These pin the facts the Claude Code host adapter
// will rely on; a version bump that changes them fails here first.

import assert from "node:assert/strict";
import { existsSync } from "node:fs";
import { join } from "node:path";
import { test } from "node:test";
import { CLAUDE_VERSION } from "./claude-bin.mjs";
import { World } from "./harness.mjs";

const TEST_MS = 120_000;
const TOUCH = "touch made-by-bash.txt && echo hello";
const BASH_CUE = `run it [[tool:Bash ${JSON.stringify({ command: TOUCH })}]]`;
const HOOK_EVENTS = [
	"SessionStart",
	"UserPromptSubmit",
	"PreToolUse",
	"PermissionRequest",
	"PostToolUse",
	"Notification",
	"Stop",
	"SessionEnd",
];

/** The assistant's texts in a run's stream-json events. */
const assistantTexts = (run) =>
	run.events
		.filter((e) => e.type === "assistant")
		.flatMap((e) => e.message.content)
		.filter((b) => b.type === "text")
		.map((b) => b.text);

function assertOffline(world) {
	assert.deepEqual(world.fake.unknown, [], "Claude Code asked for nothing the fake does not serve, and no proxy tunnel");
}

test("claude -p answers with the fake model's text, offline", { timeout: TEST_MS }, async (t) => {
	const world = await World.create(t);
	const run = await world.run("hi");

	assert.equal(run.code, 0, run.stderr);
	assert.equal(run.init.claude_code_version, CLAUDE_VERSION);
	assert.equal(run.init.apiKeySource, "ANTHROPIC_API_KEY");
	assert.equal(run.result.subtype, "success");
	assert.equal(run.result.result, "echo: hi");
	assert.equal(run.result.session_id, run.init.session_id);
	assert.deepEqual(assistantTexts(run), ["echo: hi"]);

	const [turn] = world.fake.turns;
	assert.equal(world.fake.turns.length, 1);
	assert.equal(turn.path, "/v1/messages");
	assert.equal(turn.body.stream, true);
	assert.equal(turn.lastUserText, "hi");
	assert.ok(turn.tools.includes("Bash"), `Bash is offered: ${turn.tools}`);
	assert.equal(turn.headers["x-api-key"], "dummy");
	assertOffline(world);
});

for (const decision of ["allow", "deny"]) {
	test(`a PermissionRequest hook that answers ${decision} decides a Bash call`, { timeout: TEST_MS }, async (t) => {
		const world = await World.create(t);
		const settings = await world.hookSettings(HOOK_EVENTS);
		const run = await world.run(BASH_CUE, {
			args: ["--settings", settings],
			env: { HOOK_DECISION: decision, HOOK_REASON: "no from the phone" },
		});
		assert.equal(run.code, 0, run.stderr);
		const sessionId = run.init.session_id;

		const hooks = world.hooks();
		const byEvent = (name) => hooks.filter((h) => h.event === name).map((h) => h.input);
		// Print mode: no Notification; PostToolUse only when the tool ran.
		assert.deepEqual(
			hooks.map((h) => h.event),
			[
				"SessionStart",
				"UserPromptSubmit",
				"PreToolUse",
				"PermissionRequest",
				...(decision === "allow" ? ["PostToolUse"] : []),
				"Stop",
				"SessionEnd",
			],
		);
		for (const { input, env } of hooks) {
			assert.equal(input.session_id, sessionId);
			assert.equal(input.cwd, world.project);
			assert.match(input.transcript_path, new RegExp(`/\\.claude/projects/.+/${sessionId}\\.jsonl$`));
			assert.equal(env.CLAUDE_PROJECT_DIR, world.project);
			assert.equal(env.CLAUDE_CODE_SESSION_ID, sessionId);
		}
		const [start] = byEvent("SessionStart");
		assert.equal(start.source, "startup");
		const [submit] = byEvent("UserPromptSubmit");
		assert.equal(submit.prompt, BASH_CUE);
		const [pre] = byEvent("PreToolUse");
		assert.equal(pre.tool_name, "Bash");
		assert.deepEqual(pre.tool_input, { command: TOUCH });
		assert.match(pre.tool_use_id, /^toolu_/);

		const [ask] = byEvent("PermissionRequest");
		assert.equal(ask.tool_name, "Bash");
		assert.deepEqual(ask.tool_input, { command: TOUCH });
		assert.equal(ask.permission_mode, "default");
		assert.equal(ask.tool_use_id, undefined, "PermissionRequest carries no tool_use_id");
		assert.ok(Array.isArray(ask.permission_suggestions), "it suggests permission updates");

		const [stop] = byEvent("Stop");
		assert.equal(stop.stop_hook_active, false);
		assert.equal(stop.last_assistant_message, run.result.result);
		const [end] = byEvent("SessionEnd");
		assert.equal(end.reason, "other");

		const made = existsSync(join(world.project, "made-by-bash.txt"));
		if (decision === "allow") {
			assert.equal(made, true, "allow: the command ran");
			assert.equal(run.result.result, "tool Bash returned: hello");
			assert.deepEqual(run.result.permission_denials, []);
			const [post] = byEvent("PostToolUse");
			assert.equal(post.tool_use_id, pre.tool_use_id);
			assert.equal(post.tool_response.stdout, "hello");
		} else {
			assert.equal(made, false, "deny: the command did not run");
			assert.equal(run.result.result, "tool Bash failed: no from the phone", "the model sees the hook's message as an error");
			assert.deepEqual(run.result.permission_denials, [
				{ tool_name: "Bash", tool_use_id: pre.tool_use_id, tool_input: { command: TOUCH } },
			]);
			const denied = run.events.find((e) => e.type === "system" && e.subtype === "permission_denied");
			assert.equal(denied.decision_reason_type, "hook");
			assert.equal(denied.message, "no from the phone");
		}
		assertOffline(world);
	});
}

test("without a decision, print mode refuses a Bash call that needs permission", { timeout: TEST_MS }, async (t) => {
	const world = await World.create(t);
	const settings = await world.hookSettings(["PermissionRequest"]);
	const run = await world.run(BASH_CUE, { args: ["--settings", settings], env: { HOOK_DECISION: "none" } });
	assert.equal(run.code, 0, run.stderr);
	assert.equal(world.hooks().length, 1, "the hook was asked");
	assert.equal(existsSync(join(world.project, "made-by-bash.txt")), false);
	assert.match(run.result.result, /^tool Bash failed: .*needs approval/);
	assert.equal(run.result.permission_denials.length, 1);
});

test("a PermissionRequest hook that outlives its timeout decides nothing", { timeout: TEST_MS }, async (t) => {
	const world = await World.create(t);
	// `timeout` is in seconds; the hook would answer allow after 10 s.
	const settings = await world.hookSettings(["PermissionRequest"], { timeout: 2 });
	const started = Date.now();
	const run = await world.run(BASH_CUE, {
		args: ["--settings", settings],
		env: { HOOK_DECISION: "allow", HOOK_DELAY_MS: "10000" },
	});
	assert.equal(run.code, 0, run.stderr);
	assert.ok(Date.now() - started < 9_000, `Claude Code did not wait for the late hook (${Date.now() - started} ms)`);
	assert.equal(existsSync(join(world.project, "made-by-bash.txt")), false, "no allow was taken from it");
	assert.match(run.result.result, /^tool Bash failed: .*needs approval/);
});

test("an --mcp-config stdio server: discover, initialize, tools/list, tools/call with _meta", { timeout: TEST_MS }, async (t) => {
	const world = await World.create(t);
	const config = await world.mcpConfig();
	const run = await world.run('answer via [[tool:mcp__agent-relay__reply {"text":"hi there"}]]', {
		args: ["--mcp-config", config, "--allowedTools", "mcp__agent-relay__reply"],
	});
	assert.equal(run.code, 0, run.stderr);
	assert.deepEqual(run.init.mcp_servers, [{ name: "agent-relay", status: "connected", source: "dynamic" }]);
	assert.equal(run.result.result, "tool mcp__agent-relay__reply returned: sent: hi there");

	const log = world.mcp();
	const [env] = log.filter((e) => e.dir === "env");
	assert.equal(env.env.CLAUDE_CODE_SESSION_ID, run.init.session_id, "the server knows its session");
	assert.equal(env.env.CLAUDE_PROJECT_DIR, world.project);
	assert.equal(env.cwd, world.project);
	assert.equal(env.env.ANTHROPIC_BASE_URL, world.fake.url, "it inherits Claude Code's environment");

	const received = log.filter((e) => e.dir === "in").map((e) => e.message);
	assert.deepEqual(
		received.map((m) => m.method),
		["server/discover", "initialize", "notifications/initialized", "tools/list", "tools/call"],
	);
	const [discover, initialize, , , call] = received;
	assert.equal(discover.params._meta["io.modelcontextprotocol/clientInfo"].name, "claude-code");
	assert.equal(initialize.params.protocolVersion, "2025-11-25");
	assert.deepEqual(initialize.params.clientInfo.name, "claude-code");
	assert.equal(initialize.params.clientInfo.version, CLAUDE_VERSION);
	assert.deepEqual(initialize.params.capabilities, { roots: { listChanged: true }, elicitation: { form: {}, url: {} } });
	assert.equal(call.params.name, "reply");
	assert.deepEqual(call.params.arguments, { text: "hi there" });
	const toolUse = run.events.find((e) => e.type === "assistant" && e.message.content[0]?.type === "tool_use");
	assert.equal(call.params._meta["claudecode/toolUseId"], toolUse.message.content[0].id);
	assert.equal(typeof call.params._meta.progressToken, "number");

	// The server's instructions reach the model in a `system`-role entry of
	// `messages` (not in `system`), which also lists MCP tools as deferred: they are
	// not in `tools` until the model loads them with ToolSearch.
	const [turn] = world.fake.turns;
	const system = turn.body.messages.filter((m) => m.role === "system").map((m) => JSON.stringify(m.content));
	assert.ok(system.some((text) => text.includes("## agent-relay\\nTest server: use reply to answer the user.")), system.join());
	assert.ok(system.some((text) => text.includes("mcp__agent-relay__reply")));
	assert.ok(!turn.tools.includes("mcp__agent-relay__reply"), "MCP tools are deferred");
	assertOffline(world);
});

for (const decision of ["allow", "deny"]) {
	test(`--permission-prompt-tool: the MCP tool answers ${decision}`, { timeout: TEST_MS }, async (t) => {
		const world = await World.create(t);
		const config = await world.mcpConfig({ MCP_DECISION: decision });
		const run = await world.run(BASH_CUE, {
			args: ["--mcp-config", config, "--permission-prompt-tool", "mcp__agent-relay__decide"],
		});
		assert.equal(run.code, 0, run.stderr);
		const call = world
			.mcp()
			.filter((e) => e.dir === "in" && e.message.method === "tools/call")
			.map((e) => e.message.params);
		assert.equal(call.length, 1);
		assert.equal(call[0].name, "decide");
		assert.deepEqual(Object.keys(call[0].arguments).sort(), ["input", "tool_name", "tool_use_id"]);
		assert.equal(call[0].arguments.tool_name, "Bash");
		assert.deepEqual(call[0].arguments.input, { command: TOUCH });
		assert.equal(call[0].arguments.tool_use_id, call[0]._meta["claudecode/toolUseId"]);

		const made = existsSync(join(world.project, "made-by-bash.txt"));
		if (decision === "allow") {
			assert.equal(made, true);
			assert.equal(run.result.result, "tool Bash returned: hello");
		} else {
			assert.equal(made, false);
			assert.equal(run.result.result, "tool Bash failed: denied by the test MCP server");
			assert.equal(run.result.permission_denials.length, 1);
		}
		assertOffline(world);
	});
}
