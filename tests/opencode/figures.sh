#!/usr/bin/env bash
# OpenCode's figures beside Codex's, measured in the same run on this machine
# (issue 40): tap → command runs, phone → answer, and /new → first answer with
# the relay's share of it. Each is a diagnostic of an end-to-end test with the
# real program (tests/codex, tests/opencode); this runs those tests, in turn
# for each host, RUNS times (default 3), and prints every sample and the median.
#
# Needs what scripts/ci-codex-e2e and scripts/ci-opencode-e2e install: the
# debug binaries, tests/codex/node_modules and tests/opencode/node_modules.
#   bash tests/opencode/figures.sh            # RUNS=5 bash tests/opencode/figures.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
runs=${RUNS:-3}
export AGENT_RELAY_BIN="$PWD/target/debug/agent-relay"
export FAKE_BOT_API_BIN="$PWD/target/debug/fake-bot-api"
out=$(mktemp)
trap 'rm -f "$out"' EXIT

# The tests that print the figures, by host: the wrapper's first test (phone →
# answer), its approval test (tap → command ran) and the launch test (/new).
codex='^(the TUI.s thread gets a topic|a command asks on the phone|/new … codex runs)'
opencode='^(the TUI.s session gets a topic|a permission ask reaches the phone|/new … opencode runs)'

for run in $(seq "$runs"); do
  for host in codex opencode; do
    pattern=$codex
    [ "$host" = opencode ] && pattern=$opencode
    echo "run $run: $host" >&2
    (cd "tests/$host" && node --test --test-concurrency=1 --test-name-pattern="$pattern" relay.test.mjs launch.test.mjs) |
      sed -n 's/^# \(tap → command ran\|phone → answer\|from \/new to the first answer\)/\1/p' |
      sed "s/^/$host\t/" >>"$out"
  done
done

median() { sort -n | awk '{ a[NR] = $1 } END { if (NR) print a[int((NR + 1) / 2)]; else print "-" }'; }
figure() { # host, sed expression pulling one number out of a line
  grep "^$1	" "$out" | sed -n "$2" | median
}
printf '\n%-34s %12s %12s\n' "figure (median of $runs, ms)" "Codex" "OpenCode"
for host in codex opencode; do
  eval "tap_$host=\$(figure $host 's/.*tap → command ran: \([0-9]*\) ms.*/\1/p')"
  eval "answer_$host=\$(figure $host 's/.*phone → answer: \([0-9]*\) ms.*/\1/p')"
  eval "new_$host=\$(figure $host 's/.*first answer: \([0-9]*\) ms.*/\1/p')"
  eval "share_$host=\$(figure $host 's/.*relay.s share: \(-\{0,1\}[0-9]*\) ms.*/\1/p')"
done
printf '%-34s %12s %12s\n' "tap → command runs" "$tap_codex" "$tap_opencode"
printf '%-34s %12s %12s\n' "phone → answer" "$answer_codex" "$answer_opencode"
printf '%-34s %12s %12s\n' "/new → first answer" "$new_codex" "$new_opencode"
printf '%-34s %12s %12s\n' "  of which the relay's share" "$share_codex" "$share_opencode"
printf '\nevery sample:\n'
cat "$out"
