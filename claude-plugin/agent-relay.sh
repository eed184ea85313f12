#!/bin/sh
# The Claude Code plugin's way to the agent-relay binary: its MCP server and
# hooks run `sh agent-relay.sh mcp` and `sh agent-relay.sh hook <event>`, and
# this finds the binary and runs it with those arguments.
#
# It looks where a user puts it: AGENT_RELAY_BIN (a path the user sets, in
# the environment Claude Code starts with or in its settings' "env"), then
# `agent-relay` on PATH, then where `cargo install` puts it
# (${CARGO_HOME:-~/.cargo}/bin), which Claude Code's PATH may lack.
#
# Without it the plugin says so instead of failing quietly: the SessionStart
# hook shows it to the user (a systemMessage), the MCP server fails with it on
# stderr (Claude Code's /mcp shows it), and the other hooks decide nothing and
# exit 0, as a hook that cannot help must.

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
	if relay=$(command -v agent-relay 2>/dev/null) && [ -n "$relay" ]; then
		return 0
	fi
	cargo_bin="${CARGO_HOME:-${HOME:-}/.cargo}/bin/agent-relay"
	if [ -f "$cargo_bin" ] && [ -x "$cargo_bin" ]; then
		relay=$cargo_bin
		return 0
	fi
	why="there is no agent-relay on PATH or in $cargo_bin, and AGENT_RELAY_BIN is not set"
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
message="agent-relay is not installed, so this session is not relayed to Telegram: $why. Install it with \`$install\`, or set AGENT_RELAY_BIN to the binary; then restart Claude Code."

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
