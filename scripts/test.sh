#!/usr/bin/env bash
# The test command. Uses DATABASE_URL / REDIS_URL when set; otherwise starts
# throwaway Postgres and Redis (scripts/with-services) and stops them after.
# Every test creates its own database and Redis key prefix, so the suite runs
# in parallel against one server pair. Extra arguments go to the test runner,
# `cargo nextest run` (e.g. `--locked`, `--profile ci`, `-E 'test(name)'`);
# `--locked` also locks the build of the services binary.
set -euo pipefail
cd "$(dirname "$0")/.."

# apt_install PKG...: installs the packages with apt-get, quietly; when that
# fails, says which packages and shows the end of apt-get's output (the
# whole of it stays in a temp file, whose name is printed).
apt_install() {
    local log
    log=$(mktemp "${TMPDIR:-/tmp}/test.sh-apt.XXXXXX")
    if { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@"; } >"$log" 2>&1; then
        rm -f "$log"
        return 0
    fi
    echo "test.sh: could not install $* (apt-get failed); the tests that need them will say so. The last lines of apt-get's output (all of it: $log):" >&2
    tail -n 20 "$log" | sed 's/^/test.sh:   | /' >&2
    return 1
}

# Tools some tests need, installed when missing and allowed (root with
# apt-get); otherwise those tests say why they skipped or failed:
# - faketime: the clock-skew tests and the chaos suite's clock-ahead fault
#   preload libfaketime;
# - chromium: the console's browser test drives headless Chromium (in CI,
#   CI set, it fails without one instead of skipping).
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
        apt_install "${missing[@]}" || true
    else
        echo "test.sh: ${missing[*]} not found and not root; the tests that need them will say so" >&2
    fi
fi

# The runner: cargo-nextest, installed from crates.io when missing (it runs
# each test in a process of its own, with the timeouts and test groups of
# .config/nextest.toml). Only when it cannot be had does the suite run under
# `cargo test`, through scripts/cargo-test-fallback, which says what that
# run does not do.
if ! cargo nextest --version >/dev/null 2>&1; then
    echo "test.sh: cargo-nextest not found; installing it (cargo install cargo-nextest --locked; a few minutes)" >&2
    log=$(mktemp "${TMPDIR:-/tmp}/test.sh-nextest.XXXXXX")
    if ! cargo install cargo-nextest --locked >"$log" 2>&1; then
        echo "test.sh: could not install cargo-nextest; the last lines of cargo install's output (all of it: $log):" >&2
        tail -n 20 "$log" | sed 's/^/test.sh:   | /' >&2
    elif ! cargo nextest --version >/dev/null 2>&1; then
        echo "test.sh: cargo-nextest was installed but \`cargo nextest\` does not find it: is the install's bin directory (\$CARGO_HOME/bin, or \$CARGO_INSTALL_ROOT/bin) on PATH? (cargo install's output: $log)" >&2
    else
        rm -f "$log"
    fi
    if ! cargo nextest --version >/dev/null 2>&1; then
        echo "test.sh: running the suite with cargo test instead (scripts/cargo-test-fallback: no per-test timeout, one process per test binary; see its comments)" >&2
    fi
fi
if cargo nextest --version >/dev/null 2>&1; then
    runner=(cargo nextest run --workspace --no-fail-fast)
else
    runner=(scripts/cargo-test-fallback)
fi
services=(scripts/with-services)
for a in "$@"; do
    [ "$a" = -- ] && break
    if [ "$a" = --locked ]; then
        services+=(--locked)
        break
    fi
done
exec "${services[@]}" "${runner[@]}" "$@"
