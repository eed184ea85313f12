// Where the real Claude Code binary is after `npm ci --ignore-scripts`.
//
// `@anthropic-ai/claude-code`'s `bin/claude.exe` is a stub until its postinstall
// (install.cjs) copies the native binary over it; we skip install scripts, so we
// run the native binary where npm unpacked it: the optional platform package
// `@anthropic-ai/claude-code-<platform>` (install.cjs's PLATFORMS table), file
// `claude`. Run as a script, it prints the path.

import { existsSync, readFileSync } from "node:fs";
import { arch, platform } from "node:os";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const here = dirname(fileURLToPath(import.meta.url));
const SCOPE = join(here, "node_modules", "@anthropic-ai");

/** Like install.cjs's getPlatformKey: linux-x64, linux-x64-musl, darwin-arm64, … */
function platformKey() {
	const os = platform();
	if (os !== "linux") return `${os}-${arch()}`;
	const glibc = process.report?.getReport?.().header?.glibcVersionRuntime;
	return `linux-${arch()}${glibc === undefined ? "-musl" : ""}`;
}

/** The pinned version (tests/claude/package.json). */
export const CLAUDE_VERSION = JSON.parse(readFileSync(join(here, "package.json"), "utf8")).devDependencies[
	"@anthropic-ai/claude-code"
];

/** Absolute path of the native `claude` binary; throws a sentence saying what to run when missing. */
export function claudeBin() {
	if (process.env.CLAUDE_BIN) return process.env.CLAUDE_BIN;
	const key = platformKey();
	const pkg = join(SCOPE, `claude-code-${key}`);
	const bin = join(pkg, platform() === "win32" ? "claude.exe" : "claude");
	if (!existsSync(bin)) {
		throw new Error(
			`Claude Code's native binary is missing at ${bin}: run \`npm ci --prefix tests/claude --ignore-scripts\` (it ships in the optional package @anthropic-ai/claude-code-${key})`,
		);
	}
	const { version } = JSON.parse(readFileSync(join(pkg, "package.json"), "utf8"));
	if (version !== CLAUDE_VERSION) {
		throw new Error(`${pkg} is ${version}, tests/claude/package.json pins ${CLAUDE_VERSION}: run npm ci again`);
	}
	return bin;
}

if (import.meta.url === `file://${process.argv[1]}`) console.log(claudeBin());
