// A real npm registry on 127.0.0.1 for the end-to-end test: verdaccio (pinned
// in package-lock.json beside this file) with a storage folder of its own and
// no uplink, so nothing is fetched from anywhere else, and the packages
// scripts/npm-pack writes published to it as the release workflow publishes
// them. Also: the scratch environment a person without a Rust toolchain has.

import { spawn } from "node:child_process";
import { readdirSync } from "node:fs";
import { mkdir, writeFile } from "node:fs/promises";
import { createServer } from "node:net";
import { basename, delimiter, dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { deadline, eventually } from "../pi/harness.mjs";

const here = dirname(fileURLToPath(import.meta.url));
export const REPO = resolve(here, "..", "..");
const VERDACCIO = join(here, "node_modules", "verdaccio", "bin", "verdaccio");
/** The binary the packages carry: the dev build earlier steps made (the release workflow packs dist/musl ones). */
export const BINARY = process.env.AGENT_RELAY_BIN || join(REPO, "target", "debug", "agent-relay");
const STARTUP_MS = 30_000;
const COMMAND_MS = 120_000;

/** Runs `command args` to its end (killed after `ms`): `{ code, signal, stdout, stderr, ms }`. */
export async function run(command, args, { env, cwd, ms = COMMAND_MS, input } = {}) {
	const started = Date.now();
	const child = spawn(command, args, { env, cwd, stdio: [input === undefined ? "ignore" : "pipe", "pipe", "pipe"] });
	if (input !== undefined) child.stdin.end(input);
	let stdout = "";
	let stderr = "";
	child.stdout.on("data", (c) => {
		stdout += c;
	});
	child.stderr.on("data", (c) => {
		stderr += c;
	});
	const exited = new Promise((done, fail) => {
		child.once("exit", (code, signal) => done({ code, signal }));
		child.once("error", fail);
	});
	try {
		const exit = await deadline(exited, ms, `${command} ${args.join(" ")}`);
		return { ...exit, stdout, stderr, ms: Date.now() - started };
	} finally {
		if (child.exitCode === null && child.signalCode === null) child.kill("SIGKILL");
	}
}

async function freePort() {
	const server = createServer();
	await new Promise((done) => server.listen(0, "127.0.0.1", done));
	const { port } = server.address();
	await new Promise((done) => server.close(done));
	return port;
}

/** Builds the packages with scripts/npm-pack into `out`; returns the tarballs, platform package first. */
export async function packPackages(out) {
	const packed = await run(join(REPO, "scripts", "npm-pack"), ["--binary", BINARY, "--out", out]);
	if (packed.code !== 0) throw new Error(`scripts/npm-pack failed: ${packed.stderr}`);
	const tarballs = readdirSync(out)
		.filter((f) => f.endsWith(".tgz"))
		.map((f) => join(out, f));
	// The main package names the platform's as a dependency: publish that first.
	const isMain = (tarball) => /^agent-relay-\d/.test(basename(tarball));
	tarballs.sort((a, b) => Number(isMain(a)) - Number(isMain(b)));
	return { tarballs, report: packed.stdout.trim() };
}

export class Registry {
	constructor(child, url, root) {
		this.child = child;
		this.url = url;
		this.root = root;
		this.log = "";
		child.stdout.on("data", (c) => {
			this.log = (this.log + c).slice(-8192);
		});
		child.stderr.on("data", (c) => {
			this.log = (this.log + c).slice(-8192);
		});
		/** A user config with a token: npm publishes nothing without one, even where anyone may. */
		this.npmrc = join(root, "npmrc");
	}

	/** verdaccio on a free port of 127.0.0.1, storing into `<root>/storage`. */
	static async start(root) {
		await mkdir(root, { recursive: true });
		const port = await freePort();
		const config = join(root, "config.yaml");
		await writeFile(
			config,
			[
				`storage: ${join(root, "storage")}`,
				// A platform package is bigger than verdaccio's default 10 MB (the dev binary, unstripped, much bigger).
				"max_body_size: 500mb",
				"uplinks: {}",
				"packages:",
				"  '**':",
				"    access: $all",
				"    publish: $all",
				"    unpublish: $all",
				"auth:",
				"  htpasswd:",
				`    file: ${join(root, "htpasswd")}`,
				"web:",
				"  enable: false",
				"log: { type: stdout, format: pretty, level: warn }",
				"",
			].join("\n"),
		);
		const child = spawn(process.execPath, [VERDACCIO, "--config", config, "--listen", `127.0.0.1:${port}`], {
			cwd: root,
			stdio: ["ignore", "pipe", "pipe"],
			env: { PATH: process.env.PATH, HOME: root },
		});
		const url = `http://127.0.0.1:${port}/`;
		const registry = new Registry(child, url, root);
		try {
			await eventually(
				async () => {
					if (child.exitCode !== null) throw new Error(`verdaccio exited: ${registry.log}`);
					return fetch(`${url}-/ping`).then((r) => r.ok).catch(() => false);
				},
				STARTUP_MS,
				"verdaccio to answer",
			);
		} catch (error) {
			child.kill("SIGKILL");
			throw error;
		}
		await writeFile(registry.npmrc, `registry=${url}\n//127.0.0.1:${port}/:_authToken=only-for-the-test\n`);
		return registry;
	}

	async publish(tarball) {
		const out = await run("npm", ["publish", tarball, "--userconfig", this.npmrc], {
			env: { PATH: process.env.PATH, HOME: this.root, npm_config_cache: join(this.root, "publish-cache") },
		});
		if (out.code !== 0) throw new Error(`npm publish ${tarball}: ${out.stdout}\n${out.stderr}`);
	}

	async stop() {
		if (this.child.exitCode !== null || this.child.signalCode !== null) return;
		const exited = new Promise((done) => this.child.once("exit", done));
		this.child.kill("SIGTERM");
		await deadline(exited, 10_000, "verdaccio to stop").catch(() => this.child.kill("SIGKILL"));
	}
}

/**
 * A person's environment without a Rust toolchain: HOME a scratch folder, PATH
 * built from nothing but npm's global bin folder (`<prefix>/bin`), node's folder
 * and the system's, npm pointed at `registry` with its own cache. `env` is added;
 * a key set to `undefined` is left out.
 */
export function personEnv({ home, prefix, cache, registry, path = [join(prefix, "bin")], env = {} }) {
	const all = {
		PATH: [...path, dirname(process.execPath), "/usr/bin", "/bin"].join(delimiter),
		HOME: home,
		npm_config_prefix: prefix,
		npm_config_cache: cache,
		npm_config_registry: registry.url,
		npm_config_userconfig: registry.npmrc,
		npm_config_audit: "false",
		npm_config_fund: "false",
		npm_config_update_notifier: "false",
		...env,
	};
	return Object.fromEntries(Object.entries(all).filter(([, value]) => value !== undefined));
}
