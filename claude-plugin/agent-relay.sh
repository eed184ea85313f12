#!/bin/sh
# The Claude Code plugin's way to the agent-relay binary: its MCP server and
# hooks run `sh agent-relay.sh mcp` and `sh agent-relay.sh hook <event>`, and
# this finds the binary and runs it with those arguments.
#
# It looks where a user puts it: AGENT_RELAY_BIN (a path the user sets, in
# the environment Claude Code starts with or in its settings' "env"), then
# `agent-relay` on PATH, then where `cargo install` puts it
# (${CARGO_HOME:-~/.cargo}/bin), then where `npm i -g agent-relay` puts it
# (the bin folder of npm's global prefix), both of which Claude Code's PATH
# may lack. npm's `agent-relay` is a link to the package's Node launcher; the
# binary npm installed beside it (its platform's package) runs instead, so no
# Node starts for each hook. npm's prefix is found without running npm (which
# takes a third of a second): npm_config_prefix, the `prefix` line of
# ~/.npmrc, else the prefix of the `node` on PATH, which is npm's default.
#
# Without it the plugin says so instead of failing quietly: the SessionStart
# hook shows it to the user (a systemMessage), the MCP server fails with it on
# stderr (Claude Code's /mcp shows it), and the other hooks decide nothing and
# exit 0, as a hook that cannot help must.

# The npm platform (linux-x64, …) of this machine, as npm/binary.js names it.
# (Each hook runs this script: it forks as little as it can.)
npm_platform() {
	case $(uname -sm) in
	"Linux x86_64") echo linux-x64 ;;
	"Linux aarch64" | "Linux arm64") echo linux-arm64 ;;
	"Darwin x86_64") echo darwin-x64 ;;
	"Darwin arm64") echo darwin-arm64 ;;
	*) return 1 ;;
	esac
}

# Sets `relay` to $1, or, when $1 is npm's link to the package's launcher
# (<package>/npm/agent-relay.js), to the binary of the platform package npm
# installed with it (nested in the package, or beside it when hoisted).
use() {
	relay=$1
	link=$(readlink "$1" 2>/dev/null) || return 0
	case $link in
	*/npm/agent-relay.js) ;;
	*) return 0 ;;
	esac
	case $link in
	/*) ;;
	*) link="${1%/*}/$link" ;;
	esac
	package=${link%/npm/agent-relay.js}
	platform=$(npm_platform) || return 0
	for native in "$package/node_modules/agent-relay-$platform/bin/agent-relay" "$package/../agent-relay-$platform/bin/agent-relay"; do
		if [ -f "$native" ] && [ -x "$native" ]; then
			relay=$native
			return 0
		fi
	done
}

# npm's global prefix, as far as the environment and ~/.npmrc tell.
npm_prefix() {
	if [ -n "${npm_config_prefix:-${NPM_CONFIG_PREFIX:-}}" ]; then
		echo "${npm_config_prefix:-$NPM_CONFIG_PREFIX}"
		return 0
	fi
	npmrc=${npm_config_userconfig:-${NPM_CONFIG_USERCONFIG:-${HOME:-}/.npmrc}}
	prefix=""
	if [ -f "$npmrc" ]; then
		# The last `prefix = …` line wins, as in npm.
		while IFS='= 	' read -r key value || [ -n "$key" ]; do
			[ "$key" = prefix ] && prefix=$value
		done <"$npmrc"
		case $prefix in
		"~/"*) prefix="${HOME:-}/${prefix#"~/"}" ;;
		esac
	fi
	if [ -n "$prefix" ]; then
		echo "$prefix"
		return 0
	fi
	node=$(command -v node 2>/dev/null) || return 1
	node=${node%/*}
	echo "${node%/*}"
}

# Sets `relay` to the binary, or `why` to why there is none.
find_relay() {
	if [ -n "${AGENT_RELAY_BIN:-}" ]; then
		if [ -f "$AGENT_RELAY_BIN" ] && [ -x "$AGENT_RELAY_BIN" ]; then
			relay=$AGENT_RELAY_BIN
			return 0
		fi
		why="AGENT_RELAY_BIN is $AGENT_RELAY_BIN, which is not an executable file"
		return 1
	fi
	if found=$(command -v agent-relay 2>/dev/null) && [ -n "$found" ]; then
		use "$found"
		return 0
	fi
	cargo_bin="${CARGO_HOME:-${HOME:-}/.cargo}/bin/agent-relay"
	if [ -f "$cargo_bin" ] && [ -x "$cargo_bin" ]; then
		relay=$cargo_bin
		return 0
	fi
	npm_bin=""
	if prefix=$(npm_prefix) && [ -n "$prefix" ]; then
		npm_bin="$prefix/bin/agent-relay"
		if [ -f "$npm_bin" ] && [ -x "$npm_bin" ]; then
			use "$npm_bin"
			return 0
		fi
	fi
	why="there is no agent-relay on PATH, in $cargo_bin${npm_bin:+ or in $npm_bin}, and AGENT_RELAY_BIN is not set"
	return 1
}

if find_relay; then
	exec "$relay" "$@"
fi

# A marketplace added from a clone runs the plugin where it lies, inside that
# clone: then the command that installs the matching binary is exact.
checkout=$(cd "$(dirname "$0")/.." 2>/dev/null && pwd)
if [ -n "$checkout" ] && [ -f "$checkout/Cargo.toml" ] && [ -f "$checkout/.claude-plugin/marketplace.json" ]; then
	install="cargo install --locked --path '$checkout'"
else
	install="cargo install --locked --git <the agent-relay repository> agent-relay"
fi
message="agent-relay is not installed, so this session is not relayed to Telegram: $why. Install it with \`npm i -g agent-relay\` (or from source: \`$install\`), or set AGENT_RELAY_BIN to the binary; then restart Claude Code."

case "${1:-}" in
hook)
	# Claude Code writes the event on stdin; take it, so it never meets a closed pipe.
	cat >/dev/null
	if [ "${2:-}" = SessionStart ]; then
		escaped=$(printf '%s' "$message" | sed -e 's/\\/\\\\/g' -e 's/"/\\"/g' | tr -d '\n\r\t')
		printf '{"systemMessage": "%s"}\n' "$escaped"
	fi
	exit 0
	;;
*)
	printf 'agent-relay plugin: %s\n' "$message" >&2
	exit 1
	;;
esac
