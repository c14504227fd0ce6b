#!/usr/bin/env bash
# The test command. Uses DATABASE_URL / REDIS_URL when set; otherwise starts
# throwaway Postgres and Redis (scripts/services.sh) and stops them after.
# Every test creates its own database and Redis key prefix, so the suite runs
# in parallel against one server pair. Extra arguments go to the test runner.
set -euo pipefail
cd "$(dirname "$0")/.."
# The chaos suite's clock-ahead fault preloads libfaketime (package faketime).
if ! command -v faketime >/dev/null 2>&1 && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "test.sh: installing faketime (chaos --faults clock-ahead)" >&2
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq faketime) >/dev/null 2>&1 \
        || echo "test.sh: could not install faketime; chaos --faults clock-ahead will report it" >&2
fi
if cargo nextest --version >/dev/null 2>&1; then
    runner=(cargo nextest run --workspace --no-fail-fast)
else
    echo "test.sh: cargo-nextest not found; using cargo test (install it with: cargo install cargo-nextest --locked)" >&2
    runner=(cargo test --workspace --no-fail-fast)
fi
# The clock-skew tests preload libfaketime (Debian package faketime).
if ! command -v faketime >/dev/null 2>&1 && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "test.sh: installing faketime (needed by the clock-skew tests)" >&2
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq faketime >/dev/null
fi
exec scripts/with-services "${runner[@]}" "$@"
