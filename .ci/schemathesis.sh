#!/usr/bin/env bash
# Fuzzes the API of a live `herd server` with schemathesis, every check on,
# once with the admin token and once with a node token: any failure fails
# CI. The exclusions, each with its reason, are in .ci/schemathesis.toml.
# Needs target/debug/herd (the tests build it).
set -euo pipefail
cd "$(dirname "$0")/.."

venv=${SCHEMATHESIS_VENV:-/tmp/herd-schemathesis-venv}
if [ ! -x "$venv/bin/schemathesis" ]; then
    echo "--- installing schemathesis into $venv"
    python3 -m venv "$venv"
    "$venv/bin/pip" install -q "schemathesis==4.32.5"
fi

work=$(mktemp -d)
server_pid=
cleanup() {
    for pid in $(jobs -p); do kill "$pid" 2>/dev/null || true; done
    if [ -n "$server_pid" ]; then kill "$server_pid" 2>/dev/null || true; wait "$server_pid" 2>/dev/null || true; fi
    rm -rf "$work"
}
trap cleanup EXIT

admin=schemathesis-admin-token
join=schemathesis-join-token
HERD_ADMIN_TOKEN=$admin HERD_JOIN_TOKEN=$join target/debug/herd server \
    --listen 127.0.0.1:0 --data-dir "$work/server" >"$work/server.out" 2>"$work/server.log" &
server_pid=$!
for _ in $(seq 1 100); do
    grep -q "listening on" "$work/server.out" && break
    sleep 0.1
done
url=$(grep -o 'https://[0-9.:]*' "$work/server.out" | head -n 1)
[ -n "$url" ] || { cat "$work/server.log"; echo "the server did not start"; exit 1; }
# TLS as deployed: only the cluster CA is trusted.
ca="$work/server/ca.pem"

node_token=$(curl -sf --cacert "$ca" -H "Authorization: Bearer $join" -H 'Content-Type: application/json' \
    -d '{"nodeName": "fuzz-node", "agentBootId": "schemathesis"}' "$url/api/v1/join" \
    | python3 -c 'import json, sys; print(json.load(sys.stdin)["nodeToken"])')

# One worker per schemathesis process: CPython 3.11's ast module is not
# safe with several threads, and hypothesis parses lambdas while
# generating. Most of a run is waiting (each watch it sends streams for
# its one second), so the admin's run is split by path into four
# processes, run beside the node's.
admin_shards=(
    "--include-path-regex=^/api/v1/(nodes|replicas)(/|$)"
    "--include-path-regex=^/api/v1/(commands|members|leases)(/|$)"
    "--include-path-regex=^/api/v1/(operations|appclusters|apps)(/|$)"
    "--exclude-path-regex=^/api/v1/(nodes|replicas|commands|members|leases|operations|appclusters|apps)(/|$)"
)
fuzz() {
    local token=$1
    shift
    (cd .ci && "$venv/bin/schemathesis" run "$url/openapi.json" "$@" \
        -H "Authorization: Bearer $token" --tls-verify "$ca" \
        --phases coverage,fuzzing --max-examples "${SCHEMATHESIS_EXAMPLES:-10}" --workers 1 \
        --seed 1 --no-color)
}
runs=()
for i in "${!admin_shards[@]}"; do
    fuzz "$admin" "${admin_shards[$i]}" >"$work/admin-$i.log" 2>&1 &
    runs+=("$!:admin, ${admin_shards[$i]#--}:$work/admin-$i.log")
done
fuzz "$node_token" >"$work/node.log" 2>&1 &
runs+=("$!:node, every path:$work/node.log")
status=0
for run in "${runs[@]}"; do
    pid=${run%%:*}
    rest=${run#*:}
    what=${rest%:*}
    log=${rest##*:}
    if wait "$pid"; then outcome=passed; else outcome=FAILED; status=1; fi
    echo "--- schemathesis as $what: $outcome"
    cat "$log"
done
exit $status
