#!/usr/bin/env bash
# Install what the Kubernetes manifests' test (tests/e2e/k8s.rs) needs, idempotently:
#   - kubectl, whose built-in kustomize renders deploy/k8s/overlays/*: Debian's kubernetes-client
#     (apt-get; root, or sudo without a password) when there is no kubectl on the PATH. The
#     overlays need kustomize v5, in kubectl 1.27 and newer; an older kubectl (Debian bookworm's
#     kubernetes-client is 1.20) is reported, not replaced.
#   - kubernetes-validate, pinned, from PyPI into <project root>/.tools/kubernetes-validate (a
#     virtualenv), linked as .tools/bin/kubernetes-validate: it checks every rendered object
#     against the Kubernetes API's schemas (strict: unknown fields are errors).
set -euo pipefail

KUBERNETES_VALIDATE_VERSION=1.37.0
# kubectl 1.27 ships kustomize v5.0: components, `labels`, `patches` with regex targets.
KUBECTL_MIN_MINOR=27

root="$(cd "$(dirname "$0")/.." && pwd)"
venv="$root/.tools/kubernetes-validate"
link="$root/.tools/bin/kubernetes-validate"

as_root() {
    if [[ "$(id -u)" -eq 0 ]]; then
        "$@"
    else
        sudo -n "$@"
    fi
}

# Where a current kubectl comes from when Debian's is too old.
newer="the Kubernetes project's apt repository (https://pkgs.k8s.io, package kubectl)"

if ! command -v kubectl >/dev/null 2>&1; then
    if [[ "$(id -u)" -ne 0 ]] && ! sudo -n true 2>/dev/null; then
        echo "install-k8s-tools.sh: kubectl is missing; run as root (or with passwordless sudo) to" \
            "install Debian's kubernetes-client, or install kubectl 1.$KUBECTL_MIN_MINOR+ from $newer" >&2
        exit 1
    fi
    echo "install-k8s-tools.sh: installing Debian's kubernetes-client (apt-get)" >&2
    as_root env DEBIAN_FRONTEND=noninteractive apt-get update -qq >/dev/null ||
        as_root env DEBIAN_FRONTEND=noninteractive apt-get update -qq
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        kubernetes-client >/dev/null
fi
# `-o json` has both the client's minor version and, since 1.24, the kustomize version.
version_json="$(kubectl version --client -o json 2>/dev/null || true)"
minor="$(sed -n 's/.*"minor": *"\([0-9]*\).*/\1/p' <<<"$version_json" | head -n 1)"
if [[ -z "$minor" || "$minor" -lt "$KUBECTL_MIN_MINOR" ]]; then
    echo "install-k8s-tools.sh: $(command -v kubectl) is kubectl 1.${minor:-?}; deploy/k8s needs" \
        "1.$KUBECTL_MIN_MINOR or newer (its built-in kustomize v5). Debian bookworm's kubernetes-client" \
        "is 1.20: install kubectl from $newer and rerun" >&2
    exit 1
fi
kustomize="$(sed -n 's/.*"kustomizeVersion": *"\([^"]*\)".*/\1/p' <<<"$version_json")"
echo "kubectl 1.$minor (kustomize ${kustomize:-?}): $(command -v kubectl)"

# Read whole before matching: `pip show | grep -q` fails under pipefail when grep stops early.
installed="$("$venv/bin/python" -m pip show kubernetes-validate 2>/dev/null || true)"
if [[ -x "$link" ]] && grep -q "^Version: $KUBERNETES_VALIDATE_VERSION$" <<<"$installed"; then
    echo "kubernetes-validate $KUBERNETES_VALIDATE_VERSION already installed: $link"
    exit 0
fi
if ! command -v python3 >/dev/null 2>&1; then
    echo "install-k8s-tools.sh: python3 not found; install python3 and pip first" >&2
    exit 1
fi
rm -rf "$venv"
python3 -m venv "$venv"
PIP_ROOT_USER_ACTION=ignore "$venv/bin/python" -m pip install --quiet --disable-pip-version-check \
    "kubernetes-validate==$KUBERNETES_VALIDATE_VERSION"
mkdir -p "$(dirname "$link")"
# Relative, so the link survives moving or re-cloning the checkout.
ln -sfn ../kubernetes-validate/bin/kubernetes-validate "$link"
echo "kubernetes-validate $("$link" --version) installed: $link"
