"use strict";
// Where this npm package's agent-relay binary is. The binary ships in one
// package per platform (agent-relay-linux-x64, …), each an optional
// dependency of the main package that npm installs only where its `os` and
// `cpu` match, as Codex and esbuild ship theirs
// (docs/decisions/0009-npm-packages.md). The launcher (npm/agent-relay.js)
// and pi's extension (scripts/pi-extension.ts) both ask here.

const { join } = require("node:path");

/** The platforms a binary is published for, as npm names them (`${process.platform}-${process.arch}`). */
const PLATFORMS = ["linux-x64", "linux-arm64", "darwin-x64", "darwin-arm64"];

/** The main package's name, from its package.json (the repository's root). */
function mainPackage() {
	return require(join(__dirname, "..", "package.json")).name;
}

/** The name of the package that holds the binary for `platform`. */
function platformPackage(platform, main = mainPackage()) {
	return `${main}-${platform}`;
}

/**
 * The binary for this machine: `{ binary }`, its absolute path, or `{ problem }`,
 * sentences saying why there is none and what to do (the launcher prints them
 * after `agent-relay: `).
 */
function findBinary() {
	const main = mainPackage();
	const platform = `${process.platform}-${process.arch}`;
	if (process.platform === "win32") {
		return {
			problem:
				"Windows is not supported: agent-relay rests on Unix sockets and file locks (flock). Install it inside WSL, where it is Linux.",
		};
	}
	if (!PLATFORMS.includes(platform)) {
		return {
			problem: `there is no agent-relay binary for ${platform} (only for ${PLATFORMS.join(", ")}). Build it from source with cargo (README.md, "Install").`,
		};
	}
	const name = platformPackage(platform, main);
	try {
		return { binary: require.resolve(`${name}/bin/agent-relay`) };
	} catch {
		return {
			problem: `the package that holds the binary for ${platform}, ${name}, is not installed: npm leaves optional dependencies out with --omit=optional or --no-optional. Install ${main} again without that option.`,
		};
	}
}

module.exports = { PLATFORMS, findBinary, mainPackage, platformPackage };
