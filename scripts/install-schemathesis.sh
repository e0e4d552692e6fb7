#!/usr/bin/env bash
# Install the pinned Schemathesis into <project root>/.tools/schemathesis (a virtualenv),
# idempotently. The gateway's API test (tests/e2e/api_fuzz.rs) runs it against the live
# OpenAPI document of an `allot up`.
set -euo pipefail

SCHEMATHESIS_VERSION=4.32.5

root="$(cd "$(dirname "$0")/.." && pwd)"
venv="$root/.tools/schemathesis"
link="$root/.tools/bin/st"

if [[ -x "$link" ]] && "$venv/bin/python" -m pip show schemathesis 2>/dev/null | grep -q "^Version: $SCHEMATHESIS_VERSION$"; then
    echo "schemathesis $SCHEMATHESIS_VERSION already installed: $link"
    exit 0
fi
if ! command -v python3 >/dev/null 2>&1; then
    echo "install-schemathesis.sh: python3 not found; install python3 and pip first" >&2
    exit 1
fi
rm -rf "$venv"
python3 -m venv "$venv"
PIP_ROOT_USER_ACTION=ignore "$venv/bin/python" -m pip install --quiet --disable-pip-version-check \
    "schemathesis==$SCHEMATHESIS_VERSION"
mkdir -p "$(dirname "$link")"
ln -sfn ../schemathesis/bin/st "$link"
"$link" --version
echo "schemathesis $SCHEMATHESIS_VERSION installed: $link"
