#!/usr/bin/env bash
# The test command. Uses DATABASE_URL / REDIS_URL when set; otherwise starts
# throwaway Postgres and Redis (scripts/services.sh) and stops them after.
# Every test creates its own database and Redis key prefix, so the suite runs
# in parallel against one server pair. Extra arguments go to the test runner.
set -euo pipefail
cd "$(dirname "$0")/.."
# The console's browser test drives headless Chromium (Debian's `chromium`);
# install it when missing and allowed, else that test says it skipped.
if ! command -v chromium >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        apt-get install -y --no-install-recommends chromium >/dev/null 2>&1 \
            || { apt-get update >/dev/null 2>&1 && apt-get install -y --no-install-recommends chromium >/dev/null 2>&1; } \
            || echo "test.sh: could not install chromium; the console's browser test will skip" >&2
    else
        echo "test.sh: chromium not found and not root; the console's browser test will skip" >&2
    fi
fi
if cargo nextest --version >/dev/null 2>&1; then
    runner=(cargo nextest run --workspace --no-fail-fast)
else
    echo "test.sh: cargo-nextest not found; using cargo test (install it with: cargo install cargo-nextest --locked)" >&2
    runner=(cargo test --workspace --no-fail-fast)
fi
exec scripts/with-services "${runner[@]}" "$@"
