#!/usr/bin/env bash
# Install what the dashboard's browser test needs, idempotently:
#   - Debian's chromium (apt-get; the test never downloads a browser of its own), and
#   - playwright-core, pinned in tests/browser/package.json + package-lock.json, into
#     tests/browser/node_modules (npm ci), to drive it.
# The browser test (tests/e2e/dashboard.rs) finds them there; ALLOT_CHROMIUM overrides the browser.
set -euo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
browser_dir="$root/tests/browser"

if ! command -v chromium >/dev/null 2>&1; then
    if [[ "$(id -u)" -ne 0 ]]; then
        echo "install-browser.sh: chromium is missing; run as root or: sudo apt-get install -y chromium" >&2
        exit 1
    fi
    echo "install-browser.sh: installing Debian's chromium (apt-get)" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >/dev/null || apt-get update -qq
    apt-get install -y -qq --no-install-recommends chromium >/dev/null
fi
echo "chromium: $(chromium --version 2>/dev/null || echo 'installed')"

if ! command -v npm >/dev/null 2>&1; then
    echo "install-browser.sh: npm not found; install Node.js and npm (apt-get install -y nodejs npm)" >&2
    exit 1
fi
want="$(sed -n 's/.*"playwright-core": *"\([^"]*\)".*/\1/p' "$browser_dir/package.json")"
installed="$browser_dir/node_modules/playwright-core/package.json"
have=""
if [[ -f "$installed" ]]; then
    have="$(sed -n 's/.*"version": *"\([^"]*\)".*/\1/p' "$installed" | head -n 1)"
fi
if [[ "$have" != "$want" ]]; then
    (cd "$browser_dir" && npm ci --no-audit --no-fund --loglevel=error)
fi
echo "playwright-core $want installed: $browser_dir/node_modules"
