#!/usr/bin/env bash
# The run command: the whole system on this machine, on a compressed demo day
# of about a minute. `scripts/demo.sh --wordpress` runs a day against a local
# WordPress instead (scripts/demo-wordpress.sh).
#
#   migrate → load sample drafts → plan → 3 workers → duplicate deliveries
#   from several callers (trigger, backfill, redis-cli XADD) → report, and a
#   check that no draft was published twice → stop everything it started.
#
# Uses DATABASE_URL / REDIS_URL when set (a fresh database is created on that
# server when allowed, and a fresh Redis key prefix is always used); otherwise
# starts throwaway Postgres and Redis from the installed server binaries
# (scripts/with-services, which runs this script again under it).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -z "${SLOTGATE_SERVICES:-}" ]; then
    exec scripts/with-services "$(pwd)/scripts/demo.sh" "$@"
fi
root=$(pwd)

work=$(mktemp -d /tmp/slotgate-demo.XXXXXX)
chmod 755 "$work"
worker_pids=() # every background process the demo starts
demo_db=""
admin_url=""
cleanup() {
    local status=$?
    for p in "${worker_pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
    for p in "${worker_pids[@]}"; do wait "$p" 2>/dev/null || true; done
    if [ -n "$demo_db" ] && [ -n "$admin_url" ]; then
        psql -q "$admin_url" -c "DROP DATABASE IF EXISTS $demo_db WITH (FORCE)" >/dev/null 2>&1 || true
    fi
    if [ "$status" -ne 0 ]; then
        echo "demo: failed (status $status); logs kept in $work" >&2
    else
        rm -rf "$work"
    fi
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

echo "demo: building planner and worker (first build takes a few minutes)…" >&2
cargo build -q -p planner -p worker
P="$root/target/debug/planner"
W="$root/target/debug/worker"

# A database of our own on whatever server we were given.
admin_url="$DATABASE_URL"
demo_db="slotgate_demo_$$"
if psql -q "$admin_url" -c "CREATE DATABASE $demo_db" >/dev/null 2>&1; then
    DATABASE_URL=$(python3 -c 'import sys,urllib.parse as u; p=u.urlsplit(sys.argv[1]); print(u.urlunsplit(p._replace(path="/"+sys.argv[2])))' "$admin_url" "$demo_db" 2>/dev/null \
        || echo "${admin_url%/*}/$demo_db")
    export DATABASE_URL
else
    echo "demo: cannot create a database on the given server; using it as is" >&2
    demo_db=""
fi
export SLOTGATE_PREFIX="slotgate-demo-$$"
export SLOTGATE_CONFIG="$work/slotgate.toml"
redis() { redis-cli -u "$REDIS_URL" "$@"; }

# Wait for a minute boundary that leaves the whole demo day inside today (UTC).
while [ "$(date -u +%H%M)" -ge 2357 ]; do sleep 5; done
day=$(date -u +%F)
t0=$(date -u +%s)
at() { date -u -d "@$((t0 + $1))" +%H:%M:%S; }

# `--wordpress`: the day against a local, real WordPress instead.
if [ "${1:-}" = "--wordpress" ]; then
    # shellcheck source=scripts/demo-wordpress.sh
    . "$root/scripts/demo-wordpress.sh"
    exit 0
fi
article_slots=""; for s in 12 16 20 24 28 32 36 40 44 48 52 56; do article_slots+="\"$(at $s)\", "; done
news_slots=""; for s in 14 26 38 50 62; do news_slots+="\"$(at $s)\", "; done
today=$(date -u +%a | tr '[:upper:]' '[:lower:]')
tomorrow=$(date -u -d "@$((t0 + 86400))" +%a | tr '[:upper:]' '[:lower:]')
cat > "$SLOTGATE_CONFIG" <<TOML
# A compressed demo day: ${day} (a ${today}), slots within about a minute
# from now, on calendars: article runs on ${today}s (and ${tomorrow}s); news
# runs on ${tomorrow}s with a cap of 1 and has a list of its own with a cap
# of 3 for ${today}s; digest is blacked out today, so
# its slots are recorded skipped/blackout instead of leaving a gap.
[[kinds]]
name = "article"
timezone = "UTC"
slots = [${article_slots%, }]
weekdays = ["${today}", "${tomorrow}"]
jitter = "3s"
daily_cap = 4
starting_deadline = "10m"

[[kinds]]
name = "digest"
timezone = "UTC"
slots = ["$(at 20)", "$(at 40)"]
blackout = ["${day}"]
daily_cap = 2
starting_deadline = "10m"

[[kinds]]
name = "news"
timezone = "UTC"
slots = [${news_slots%, }]
weekdays = ["${tomorrow}"]
jitter = "2s"
daily_cap = 1
starting_deadline = "10m"

[[kinds.on]]
days = ["${today}"]
slots = [${news_slots%, }]
daily_cap = 3
TOML

"$P" migrate
"$P" drafts import examples/drafts.jsonl
"$P" plan --day "$day" >/dev/null
echo "demo: day $day planned: article 12 slots, cap 4, 6 drafts; news 5 slots (its ${today} list), cap 3, 2 drafts; digest 2 slots, blacked out" >&2

for i in 1 2 3; do
    "$W" --id "worker-$i" --concurrency 4 --lease-ttl 3s --visibility 10s >"$work/worker-$i.log" 2>&1 &
    worker_pids+=("$!")
done
echo "demo: 3 workers running (logs in $work)" >&2

# Duplicates from every kind of caller, once the first slots are done.
sleep 30
echo "demo: injecting duplicates: trigger, backfill, redis-cli XADD ×3" >&2
"$P" trigger --kind article --day "$day" --slot 1 >/dev/null
"$P" trigger --kind news --day "$day" --slot 1 >/dev/null
for _ in 1 2 3; do redis XADD "$SLOTGATE_PREFIX:ready" '*' slot "article:$day:2" caller redis-cli >/dev/null; done
"$P" backfill --kind article --from "$day" --to "$day" >/dev/null
sleep 25
"$P" trigger --kind article --day "$day" --slot 3 >/dev/null
for _ in 1 2; do redis XADD "$SLOTGATE_PREFIX:ready" '*' slot "news:$day:2" caller cron >/dev/null; done

# Wait until every slot has an outcome and nothing is queued (deadline 120 s).
deadline=$(( $(date +%s) + 120 ))
while :; do
    report=$("$P" report --day "$day" --json)
    status=$("$P" status --json)
    if ! grep -qE '"state":"(planned|claimed|publishing)"' <<<"$report" \
        && grep -q '"delayed":0,"ready":0,"pending":0' <<<"$status"; then
        break
    fi
    if [ "$(date +%s)" -ge "$deadline" ]; then
        echo "demo: slots still open after 120 s" >&2
        "$P" report --day "$day" >&2
        exit 1
    fi
    sleep 1
done

echo
"$P" report --day "$day"
echo
doubles=$(psql -qtA "$DATABASE_URL" -c "SELECT count(*) FROM (SELECT post_id FROM publish_slot WHERE state = 'published' GROUP BY post_id HAVING count(*) > 1) d")
published=$(psql -qtA "$DATABASE_URL" -c "SELECT count(*) FROM publish_slot WHERE state = 'published'")
blocked=$(psql -qtA "$DATABASE_URL" -c "SELECT count(*) FROM execution WHERE reason = 'slot_taken'")
blackout=$(psql -qtA "$DATABASE_URL" -c "SELECT count(*) FROM publish_slot WHERE state = 'skipped' AND reason = 'blackout'")
echo "demo: $published drafts published, $blocked duplicate deliveries blocked, $blackout blacked-out slots recorded, drafts published twice: $doubles"
if [ "$blackout" != "2" ]; then
    echo "demo: FAILED: the blacked-out day's 2 slots were not recorded skipped/blackout" >&2
    exit 1
fi
if [ "$doubles" != "0" ]; then
    echo "demo: FAILED: a draft was published twice" >&2
    exit 1
fi
echo "demo: OK — every slot ran once; no draft was published twice."

# The day ends with the runway: what the next week would publish with the
# drafts left (planner forecast reads only).
echo
echo "demo: the runway from here (planner forecast --days 7):"
"$P" forecast --days 7
