#!/usr/bin/env bash
# The test command. Uses DATABASE_URL / REDIS_URL when set; otherwise starts
# throwaway Postgres and Redis (scripts/with-services) and stops them after.
# Every test creates its own database and Redis key prefix, so the suite runs
# in parallel against one server pair. Extra arguments go to the test runner.
set -euo pipefail
cd "$(dirname "$0")/.."
# Tools some tests need, installed when missing and allowed (root with
# apt-get); otherwise those tests say why they skipped or failed:
# - faketime: the clock-skew tests and the chaos suite's clock-ahead fault
#   preload libfaketime;
# - chromium: the console's browser test drives headless Chromium.
missing=()
command -v faketime >/dev/null 2>&1 || missing+=(faketime)
command -v chromium >/dev/null 2>&1 || missing+=(chromium)
# - wordpress, mariadb-server, php-cli, php-mysql: the WordPress tests start
#   a throwaway WordPress of their own (testkit::server::OwnedWordPress).
[ -d /usr/share/wordpress ] || missing+=(wordpress)
command -v php >/dev/null 2>&1 || missing+=(php-cli php-mysql)
{ command -v mariadbd >/dev/null 2>&1 || [ -x /usr/sbin/mariadbd ]; } || missing+=(mariadb-server)
if [ "${#missing[@]}" -gt 0 ]; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        echo "test.sh: installing ${missing[*]}" >&2
        { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"; } >/dev/null 2>&1 \
            || echo "test.sh: could not install ${missing[*]}; the tests that need them will say so" >&2
    else
        echo "test.sh: ${missing[*]} not found and not root; the tests that need them will say so" >&2
    fi
fi
if cargo nextest --version >/dev/null 2>&1; then
    runner=(cargo nextest run --workspace --no-fail-fast)
else
    echo "test.sh: cargo-nextest not found; using cargo test (install it with: cargo install cargo-nextest --locked)" >&2
    runner=(cargo test --workspace --no-fail-fast)
fi
exec scripts/with-services "${runner[@]}" "$@"
