#!/usr/bin/env bash
# Installs the pinned agent clients the tests in tests/agents/ drive into PREFIX (default .ci/agents):
#   PREFIX/node_modules/.bin/claude  @anthropic-ai/claude-code, a native binary (no Node needed)
#   PREFIX/node_modules/.bin/codex   @openai/codex, a Node launcher (Node >= 16) of a native binary
#   PREFIX/node_modules/.bin/gemini  @google/gemini-cli, a Node program (Node >= 20)
# Quiet on success; idempotent (a second run with both versions in place installs nothing). Where
# this machine's Node is missing or older than 16, Node 22 comes from npm's `node` package into the
# prefix, and PREFIX/node_modules/.bin must then be on PATH when codex runs.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
prefix="${1:-$here/../../.ci/agents}"
claude_version=2.1.332
codex_version=0.171.0
gemini_version=0.61.0
bin="$prefix/node_modules/.bin"

installed() {
  [ "$("$bin/claude" --version 2>/dev/null)" = "$claude_version (Claude Code)" ] &&
    [ "$(PATH="$bin:$PATH" "$bin/codex" --version 2>/dev/null)" = "codex-cli $codex_version" ] &&
    [ "$(PATH="$bin:$PATH" "$bin/gemini" --version 2>/dev/null)" = "$gemini_version" ]
}

mkdir -p "$prefix"
[ -e "$prefix/.gitignore" ] || echo '*' >"$prefix/.gitignore" # the prefix keeps itself out of git
installed && exit 0

packages=("@anthropic-ai/claude-code@$claude_version" "@openai/codex@$codex_version"
  "@google/gemini-cli@$gemini_version")
node_major="$(node -p 'process.versions.node.split(".")[0]' 2>/dev/null || echo 0)"
[ "$node_major" -ge 20 ] || packages+=("node@22")

log="$prefix/install.log"
if ! npm install --no-audit --no-fund --save-exact --loglevel=error --prefix "$prefix" "${packages[@]}" \
  >"$log" 2>&1; then
  cat "$log" >&2
  exit 1
fi
if ! installed; then
  echo "install_clients.sh: installed, but the clients do not report $claude_version / $codex_version / $gemini_version" >&2
  "$bin/claude" --version >&2 || true
  PATH="$bin:$PATH" "$bin/codex" --version >&2 || true
  PATH="$bin:$PATH" "$bin/gemini" --version >&2 || true
  exit 1
fi
rm -f "$log"
