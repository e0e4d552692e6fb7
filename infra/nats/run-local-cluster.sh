#!/usr/bin/env bash
# A 3-node NATS JetStream cluster on this machine, for tests and demos.
#
#   infra/nats/run-local-cluster.sh          start n1..n3 in the background (any that are not
#                                            running), then wait until all are healthy and
#                                            a JetStream meta leader is elected
#   infra/nats/run-local-cluster.sh stop     stop them (SIGTERM, then SIGKILL after 15 s)
#   infra/nats/run-local-cluster.sh status   show which nodes run and who leads JetStream
#
# Clients: nats://127.0.0.1:4222,nats://127.0.0.1:4223,nats://127.0.0.1:4224
# Monitoring: http://127.0.0.1:8222 (n1), :8223 (n2), :8224 (n3)
# Stores, logs and pid files: infra/nats/data/ (delete the folder for a fresh cluster).
# Accounts: when infra/nats/auth/accounts.conf exists (allot nats-config --out infra/nats/auth),
# each node starts from data/nX.conf, which includes nats-X.conf and that file; else anonymous.
#
# Uses the project's pinned nats-server (.tools/bin/nats-server), installing it with
# scripts/install-nats.sh first if it is missing.
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
server="$root/.tools/bin/nats-server"
data="$here/data"
accounts="$here/auth/accounts.conf"
nodes=(1 2 3)
urls="nats://127.0.0.1:4222,nats://127.0.0.1:4223,nats://127.0.0.1:4224"

# The pid in data/n$1.pid if that process is alive and is a nats-server, else nothing.
running_pid() {
    local file="$data/n$1.pid" pid
    [[ -f "$file" ]] || return 0
    pid="$(cat "$file")"
    if [[ "$pid" =~ ^[0-9]+$ ]] && kill -0 "$pid" 2>/dev/null \
        && tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -q nats-server; then
        echo "$pid"
    fi
}

# The JetStream meta leader as node $1 sees it (empty if none, or no curl).
meta_leader() {
    command -v curl >/dev/null 2>&1 || return 0
    curl -sf --max-time 2 "http://127.0.0.1:$((8221 + $1))/jsz" 2>/dev/null \
        | tr -d ' \n' | sed -n 's/.*"meta_cluster":{[^}]*"leader":"\([^"]*\)".*/\1/p'
}

# True when every node's /healthz answers 200.
all_healthy() {
    local i
    for i in "${nodes[@]}"; do
        curl -sf --max-time 2 -o /dev/null "http://127.0.0.1:$((8221 + i))/healthz" || return 1
    done
}

start() {
    if [[ ! -x "$server" ]]; then
        echo "nats-server not found at $server; installing it" >&2
        "$root/scripts/install-nats.sh" >&2
    fi
    mkdir -p "$data"
    # The configs use store_dir ./data/nX, relative to the working directory: run from here.
    cd "$here"
    if [[ -f "$accounts" ]]; then
        echo "accounts: $accounts (anonymous clients are refused)"
    else
        echo "accounts: none (anonymous clients, default account)"
    fi
    for i in "${nodes[@]}"; do
        # A running node is left alone, so this also brings back a node stopped in a failover demo.
        if [[ -n "$(running_pid "$i")" ]]; then
            echo "n$i already runs (pid $(running_pid "$i"))"
            continue
        fi
        local config="nats-$i.conf"
        if [[ -f "$accounts" ]]; then
            # Includes are relative to the including file: data/ is one level down.
            config="data/n$i.conf"
            printf 'include "../nats-%s.conf"\ninclude "../auth/accounts.conf"\n' "$i" >"$config"
        fi
        # setsid: the servers outlive this script and the terminal's Ctrl-C.
        setsid "$server" -c "$config" >>"$data/n$i.log" 2>&1 </dev/null &
        echo $! >"$data/n$i.pid"
        echo "n$i started: pid $!, client nats://127.0.0.1:$((4221 + i)), log $data/n$i.log"
    done

    if ! command -v curl >/dev/null 2>&1; then
        echo "curl not found: not waiting for the cluster; check the logs in $data" >&2
        return 0
    fi
    local leader="" deadline=$((SECONDS + 30))
    while ((SECONDS < deadline)); do
        for i in "${nodes[@]}"; do
            if [[ -z "$(running_pid "$i")" ]]; then
                echo "n$i exited; its log ($data/n$i.log) ends with:" >&2
                tail -n 20 "$data/n$i.log" >&2
                stop
                exit 1
            fi
        done
        # Up means every node is healthy (routed, and current with the meta leader) and n1 names
        # the leader: a meta leader alone can be elected by two nodes while the third still
        # connects, and a stream created through that third then times out.
        leader="$(meta_leader 1)"
        [[ -n "$leader" ]] && all_healthy && break
        leader=""
        sleep 0.5
    done
    if [[ -z "$leader" ]]; then
        echo "not every node healthy with a JetStream meta leader after 30 s; see the logs in $data" >&2
        exit 1
    fi
    echo "cluster 'allot' is up; JetStream meta leader: $leader"
    if [[ -f "$accounts" ]]; then
        echo "ALLOT_CREDENTIALS=$here/auth/platform.credentials.json ALLOT_NATS_URL=$urls ALLOT_STREAM_REPLICAS=3"
    else
        echo "ALLOT_NATS_URL=$urls ALLOT_STREAM_REPLICAS=3"
    fi
}

stop() {
    local pids=() i pid
    for i in "${nodes[@]}"; do
        pid="$(running_pid "$i")"
        if [[ -n "$pid" ]]; then
            kill -TERM "$pid"
            pids+=("$pid")
            echo "n$i: sent SIGTERM to pid $pid"
        fi
    done
    local deadline=$((SECONDS + 15))
    for pid in "${pids[@]}"; do
        while kill -0 "$pid" 2>/dev/null && ((SECONDS < deadline)); do sleep 0.2; done
        if kill -0 "$pid" 2>/dev/null; then
            echo "pid $pid still runs after 15 s; sending SIGKILL" >&2
            kill -KILL "$pid" 2>/dev/null || true
        fi
    done
    rm -f "$data"/n*.pid
    ((${#pids[@]} > 0)) || echo "no node was running"
}

status() {
    local i pid
    for i in "${nodes[@]}"; do
        pid="$(running_pid "$i")"
        if [[ -n "$pid" ]]; then
            echo "n$i: running, pid $pid, meta leader as seen by n$i: $(meta_leader "$i")"
        else
            echo "n$i: stopped"
        fi
    done
}

case "${1:-start}" in
    start) start ;;
    stop) stop ;;
    status) status ;;
    *)
        sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'
        exit 2
        ;;
esac
