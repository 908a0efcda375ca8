#!/usr/bin/env bash
# Fault drills on the running compose stack: each drill breaks something for real, sends orders
# through the published gateway port, checks what a client must see, and repairs what it broke.
#
#   deploy/drills.sh [healthy|bank-slow|bank-hang|payment-killed|bank-cut-off|postgres-restart|all]...
#
# Settings come from deploy/.env, overridable by the environment: GATEWAY_HTTP_PORT,
# BANK_ADMIN_PORT, BANK_ADMIN_TOKEN, and COMPOSE, the command that reaches the stack (default:
# `docker compose` or `docker-compose`, run in deploy/). Exits non-zero when a check fails.
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
# shellcheck source=deploy/env.sh
source "$here/env.sh"
gateway="http://127.0.0.1:${GATEWAY_HTTP_PORT}"
admin="http://127.0.0.1:${BANK_ADMIN_PORT}"
if [[ -z "${COMPOSE:-}" ]]; then
    if docker compose version >/dev/null 2>&1; then COMPOSE="docker compose"; else COMPOSE="docker-compose"; fi
fi
cd "$here"
failures=0
body="$(mktemp)"
trap 'rm -f "$body"' EXIT

note() { printf '    %s\n' "$*"; }
check() { # check <description> <condition...>
    local description="$1"; shift
    if "$@"; then note "ok    $description"; else note "FAIL  $description"; failures=$((failures + 1)); fi
}
faults() { curl -sSf -X PUT "$admin/admin/faults" -H "X-Admin-Token: $BANK_ADMIN_TOKEN" -H 'content-type: application/json' -d "$1" >/dev/null; }
healthy_bank() { faults '{"latency_ms": {"mean": 20, "stddev": 5}, "error_rate": 0, "hang": false, "resource_exhausted_rate": 0, "pushback_ms": 0, "drop_reply_rate": 0, "decline_rate": 0, "ignores_deadlines": false}'; }
bank_charges() { curl -sSf "$admin/admin/stats" -H "X-Admin-Token: $BANK_ADMIN_TOKEN" | sed -E 's/.*"charges":([0-9]+).*/\1/'; }
# --all: a killed container is listed too (Compose v2 lists running ones only by default).
container() { $COMPOSE ps --all -q "$1"; }
healthy() { [[ "$(docker inspect -f '{{.State.Health.Status}}' "$(container "$1")" 2>/dev/null)" == healthy ]]; }
wait_healthy() { # wait_healthy <service> <seconds>
    local deadline=$((SECONDS + $2))
    until healthy "$1"; do (( SECONDS < deadline )) || return 1; sleep 0.5; done
}

# order <idempotency key> <timeout ms> → sets status, millis, ledger
order() {
    local out
    out="$(curl -s -o "$body" -D - -w '\n%{http_code} %{time_total}' -X POST "$gateway/v1/orders" \
        -H 'Authorization: Bearer demo-key-1' -H "Idempotency-Key: $1" -H "X-Request-Timeout-Ms: $2" \
        -H 'content-type: application/json' \
        -d '{"customer_id":"c-1","items":[{"sku":"sku-1","quantity":2}],"amount_minor":1299,"currency":"EUR"}' || true)"
    status="$(tail -n1 <<<"$out" | cut -d' ' -f1)"
    millis="$(tail -n1 <<<"$out" | awk '{printf "%d", $2 * 1000}')"
    ledger="$(grep -i '^x-deadline-ledger:' <<<"$out" | cut -d' ' -f2- | tr -d '\r' || true)"
    replayed="$(grep -ci '^idempotent-replayed: true' <<<"$out" || true)"
    note "POST key=$1 timeout=${2}ms → $status in ${millis} ms"
}
run_id="$(date +%s)"

drill_healthy() {
    echo "==> healthy: one order through the four hops"
    order "healthy-$run_id" 2000
    check "201 Created" test "$status" = 201
    note "ledger: $ledger"
    check "the ledger has four hops" test "$(grep -o 'received=' <<<"$ledger" | wc -l)" -eq 4
}

drill_bank_slow() {
    echo "==> bank-slow: the bank answers in 3 s, the client gives 1 s"
    faults '{"latency_ms": {"mean": 3000, "stddev": 0}}'
    order "slow-$run_id" 1000
    healthy_bank
    check "504 Gateway Timeout" test "$status" = 504
    check "answered by the deadline (≤ 2000 ms)" test "$millis" -le 2000
}

drill_bank_hang() {
    echo "==> bank-hang: the bank never answers, the client gives 1 s"
    faults '{"hang": true}'
    order "hang-$run_id" 1000
    healthy_bank
    check "504 Gateway Timeout" test "$status" = 504
    check "answered by the deadline (≤ 2000 ms)" test "$millis" -le 2000
}

drill_payment_killed() {
    echo "==> payment-killed: docker kill payment, then start it again"
    local charges_before key="killed-$run_id" payment
    charges_before="$(bank_charges)"
    payment="$(container payment)"
    docker kill "$payment" >/dev/null
    order "$key" 2000
    check "503 Service Unavailable" test "$status" = 503
    check "an honest answer, not a hang (≤ 3000 ms)" test "$millis" -le 3000
    docker start "$payment" >/dev/null
    check "payment healthy again" wait_healthy payment 60
    # The gateway was not restarted: its channel reconnects, its breaker probes.
    local deadline=$((SECONDS + 30))
    order "$key" 2000
    while [[ "$status" != 201 ]] && (( SECONDS < deadline )); do sleep 1; order "$key" 2000; done
    check "the same order succeeds after the restart" test "$status" = 201
    order "$key" 2000
    check "a repeat is replayed" test "$replayed" -eq 1
    check "charged exactly once" test "$(( $(bank_charges) - charges_before ))" -eq 1
}

drill_bank_cut_off() {
    echo "==> bank-cut-off: bank-mock disconnected from the network, then reconnected"
    local bank network
    bank="$(container bank-mock)"
    network="$(docker inspect -f '{{range $name, $_ := .NetworkSettings.Networks}}{{$name}}{{end}}' "$bank")"
    docker network disconnect "$network" "$bank"
    local opened=false
    for n in $(seq 1 12); do
        order "cut-$run_id-$n" 1500
        check "failed by the deadline (≤ 2500 ms)" test "$millis" -le 2500
        if grep -q 'circuit open' "$body"; then opened=true; note "the breaker in front of the bank is open"; break; fi
    done
    check "the breaker opened" $opened
    docker network connect --alias bank-mock "$network" "$bank"
    local deadline=$((SECONDS + 40))
    order "cut-$run_id-healed" 2000
    while [[ "$status" != 201 ]] && (( SECONDS < deadline )); do sleep 1; order "cut-$run_id-healed" 2000; done
    check "reconnected: the breaker closed and orders are paid again" test "$status" = 201
}

drill_postgres_restart() {
    echo "==> postgres-restart: PostgreSQL stopped, then started again"
    local postgres n
    postgres="$(container postgres)"
    docker stop "$postgres" >/dev/null
    for n in 1 2 3; do
        order "pg-$run_id-down-$n" 2000
        check "503 Service Unavailable" test "$status" = 503
        check "answered well before the deadline (≤ 1500 ms)" test "$millis" -le 1500
    done
    docker start "$postgres" >/dev/null
    check "PostgreSQL healthy again" wait_healthy postgres 60
    # No service was restarted: their pools connect again by themselves.
    local deadline=$((SECONDS + 30))
    order "pg-$run_id-up" 2000
    while [[ "$status" != 201 ]] && (( SECONDS < deadline )); do sleep 1; order "pg-$run_id-up" 2000; done
    check "orders are paid again" test "$status" = 201
    for service in orders payment webhook-sender; do
        check "$service still up and healthy" wait_healthy "$service" 30
    done
}

drills=("$@")
if [[ ${#drills[@]} -eq 0 || " ${drills[*]} " == *" all "* ]]; then
    drills=(healthy bank-slow bank-hang payment-killed bank-cut-off postgres-restart)
fi
for drill in "${drills[@]}"; do
    case "$drill" in
        healthy) drill_healthy ;;
        bank-slow) drill_bank_slow ;;
        bank-hang) drill_bank_hang ;;
        payment-killed) drill_payment_killed ;;
        bank-cut-off) drill_bank_cut_off ;;
        postgres-restart) drill_postgres_restart ;;
        *) echo "no drill $drill" >&2; exit 2 ;;
    esac
done
echo
if (( failures == 0 )); then echo "drills passed: ${drills[*]}"; else echo "drills FAILED: $failures check(s)"; exit 1; fi
