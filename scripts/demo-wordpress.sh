# `scripts/demo.sh --wordpress`: a compressed day against a real, local
# WordPress (testkit's throwaway one: Debian's wordpress on php -S with its
# own MariaDB). Editors' drafts live in WordPress as "pending" posts; slotgate
# publishes the oldest ones at the planned times, at most 3, each once,
# while duplicate deliveries arrive from trigger and redis-cli, and an editor
# pulls one post back. Ends with the posts WordPress shows.
#
# Sourced by scripts/demo.sh after its common set-up: the work directory and
# its cleanup (which stops every pid in worker_pids and drops the demo's
# database), $P and $W, a database and Redis prefix of the demo's own,
# $SLOTGATE_CONFIG, and the day's clock (day, t0, at).

echo "demo: building the test WordPress…" >&2
cargo build -q -p testkit --bin wordpress
"$root/target/debug/wordpress" </dev/null >"$work/wordpress.env" 2>"$work/wordpress.log" &
worker_pids+=("$!")
deadline=$(( $(date +%s) + 120 ))
until grep -q '^WORDPRESS_APP_PASSWORD=' "$work/wordpress.env"; do
    if [ "$(date +%s)" -ge "$deadline" ]; then echo "demo: WordPress did not start:" >&2; cat "$work/wordpress.log" >&2; exit 1; fi
    sleep 0.5
done
# shellcheck disable=SC1091
set -a; . "$work/wordpress.env"; set +a
echo "demo: WordPress at $WORDPRESS_URL" >&2
wp() { curl -sf -u "$WORDPRESS_USER:$WORDPRESS_APP_PASSWORD" "$@"; }
post() { wp -X POST -H 'Content-Type: application/json' -d "$2" "$WORDPRESS_URL/wp-json/wp/v2/posts$1" | python3 -c 'import json,sys; print(json.load(sys.stdin)["id"])'; }
i=0
for t in "Oldest ready article" "Second article" "Third article" "Fourth article" "Newest article"; do
    i=$((i + 1))
    post "" "{\"title\": \"$t\", \"status\": \"pending\", \"date_gmt\": \"2026-01-0${i}T09:00:00\"}" >/dev/null
done
pulled=$(post "" '{"title": "An article the editor will pull back", "status": "pending", "date_gmt": "2025-12-31T09:00:00"}')
post "" '{"title": "Not ready yet (a plain draft)", "status": "draft"}' >/dev/null
show_posts() {
    wp "$WORDPRESS_URL/wp-json/wp/v2/posts?status=publish,pending,draft,trash&context=edit&per_page=50&orderby=id&order=asc&_fields=id,status,title,link" \
        | python3 -c 'import json,sys
for p in json.load(sys.stdin): print("  %3d  %-8s %-40s %s" % (p["id"], p["status"], p["title"]["raw"], p["link"]))'
}
echo "demo: WordPress posts before:"; show_posts

# The slots count from now, WordPress being up.
t0=$(date -u +%s)
cat > "$SLOTGATE_CONFIG" <<TOML
[[kinds]]
name = "article"
timezone = "UTC"
slots = ["$(at 10)", "$(at 14)", "$(at 18)", "$(at 22)", "$(at 26)"]
daily_cap = 3
starting_deadline = "10m"
[kinds.wordpress]
url = "$WORDPRESS_URL"
user = "$WORDPRESS_USER"
app_password_env = "WORDPRESS_APP_PASSWORD"
drafts = "pending"
refresh_every = "1s"
TOML
"$P" migrate
"$P" check
"$P" drafts sync
"$P" plan --day "$day" >/dev/null
echo "demo: day $day planned: 5 slots, cap 3; 6 pending posts, one to be pulled back" >&2
for i in 1 2; do
    "$W" --id "worker-$i" --concurrency 4 --lease-ttl 3s --visibility 10s >"$work/worker-$i.log" 2>&1 &
    worker_pids+=("$!")
done
sleep 5
echo "demo: an editor pulls post $pulled back to draft" >&2
wp -X POST -H 'Content-Type: application/json' -d '{"status": "draft"}' "$WORDPRESS_URL/wp-json/wp/v2/posts/$pulled" >/dev/null
sleep 10
echo "demo: duplicates: trigger slot 1, redis-cli XADD slot 2 ×2" >&2
"$P" trigger --kind article --day "$day" --slot 1 >/dev/null
for _ in 1 2; do redis XADD "$SLOTGATE_PREFIX:ready" '*' slot "article:$day:2" caller redis-cli >/dev/null; done
deadline=$(( $(date +%s) + 120 ))
while :; do
    report=$("$P" report --day "$day" --json)
    status=$("$P" status --json)
    if ! grep -qE '"state":"(planned|claimed|publishing)"' <<<"$report" \
        && grep -q '"delayed":0,"ready":0,"pending":0' <<<"$status"; then
        break
    fi
    if [ "$(date +%s)" -ge "$deadline" ]; then echo "demo: slots still open after 120 s" >&2; "$P" report --day "$day" >&2; exit 1; fi
    sleep 1
done
echo
"$P" report --day "$day"
echo
echo "demo: WordPress posts after:"; show_posts
published=$(wp "$WORDPRESS_URL/wp-json/wp/v2/posts?status=publish&context=edit&per_page=50&_fields=id" | python3 -c 'import json,sys; print(len(json.load(sys.stdin)))')
pulled_status=$(wp "$WORDPRESS_URL/wp-json/wp/v2/posts/$pulled?context=edit&_fields=status" | python3 -c 'import json,sys; print(json.load(sys.stdin)["status"])')
echo "demo: $published posts published (cap 3); the pulled-back post is $pulled_status"
if [ "$published" != 3 ] || [ "$pulled_status" = publish ]; then
    echo "demo: FAILED" >&2
    exit 1
fi
echo "demo: OK — the three oldest ready posts went out once each; the pulled-back post did not."
