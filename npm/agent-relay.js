#!/usr/bin/env node
"use strict";
// The `agent-relay` command of the npm package: runs the binary from this
// platform's package (npm/binary.js) with the same arguments, standard streams
// and exit status. npm can only link a file of the main package into its bin
// folder, and no install script may put the binary there instead (the package
// installs where scripts are off), so this stays between the caller and the
// binary, and makes sure it is never left behind:
//
// * a signal the caller sends it (TERM, INT, HUP) goes on to the binary, and
//   the launcher leaves the way the binary did: the same code, or the same signal;
// * when its parent exits without a word (killed, its terminal gone), the
//   launcher is handed to another parent; it sees that, stops the binary
//   (TERM, then KILL after a grace) and leaves.
//
// Hosts that run the binary often (pi's extension, Claude Code's plugin) find
// the binary itself and skip this.

const { spawn } = require("node:child_process");
const { constants } = require("node:os");
const { findBinary } = require("./binary.js");

const FORWARDED = ["SIGTERM", "SIGINT", "SIGHUP"];
/** How often the launcher checks that its parent is still the one that started it. */
const PARENT_CHECK_MS = 500;
/** How long the binary has to stop after its caller is gone before it is killed. */
const KILL_AFTER_MS = 5000;

const found = findBinary();
if (found.problem) {
	process.stderr.write(`agent-relay: ${found.problem}\n`);
	process.exit(1);
}

const child = spawn(found.binary, process.argv.slice(2), { stdio: "inherit" });

const forward = (signal) => () => {
	if (child.exitCode === null && child.signalCode === null) child.kill(signal);
};
for (const signal of FORWARDED) process.on(signal, forward(signal));

const parent = process.ppid;
const watch = setInterval(() => {
	if (process.ppid === parent) return;
	clearInterval(watch);
	child.kill("SIGTERM");
	setTimeout(() => child.kill("SIGKILL"), KILL_AFTER_MS).unref();
}, PARENT_CHECK_MS);
watch.unref();

child.on("error", (error) => {
	process.stderr.write(`agent-relay: cannot run ${found.binary}: ${error.message}\n`);
	process.exit(1);
});

child.on("exit", (code, signal) => {
	clearInterval(watch);
	if (signal === null) process.exit(code ?? 1);
	// Leave by the same signal, so the caller sees what the binary saw.
	for (const forwarded of FORWARDED) process.removeAllListeners(forwarded);
	process.kill(process.pid, signal);
	// A signal Node ignores (SIGPIPE) leaves us here: exit as a shell reports it.
	process.exit(128 + (constants.signals[signal] ?? 0));
});
