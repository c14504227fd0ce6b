# shellcheck shell=bash
#
# scripts/services.sh -- PostgreSQL + Redis for slotgate's tests and tools.
#
# Source this file (do not run it), then:
#
#   slotgate_services_up     make sure a PostgreSQL and a Redis server are
#                            reachable; export DATABASE_URL and REDIS_URL
#                            (and SLOTGATE_SERVICES_DIR when it had to start
#                            throwaway servers).
#   slotgate_services_down   stop only what slotgate_services_up started and
#                            remove its temp dir. Silent and idempotent.
#
# If DATABASE_URL / REDIS_URL are already set they are used as they are (after
# a reachability check). Otherwise throwaway servers are started on free ports
# on 127.0.0.1, with all their files in a fresh `mktemp -d` directory. Existing
# servers (e.g. on 5432 / 6379) are never touched.
#
# Safe to source from scripts running under `set -euo pipefail`; the functions
# do not change the caller's shell options. Notes go to stderr, one line per
# service. See scripts/with-services for a wrapper that also cleans up on exit.

_slotgate_svc_note() { printf 'services: %s\n' "$*" >&2; }
_slotgate_svc_err() { printf 'services: error: %s\n' "$*" >&2; }

_slotgate_svc_is_root() { [ "$(id -u)" = 0 ]; }

# Hide a password in a URL (scheme://user:secret@host -> scheme://user:***@host).
_slotgate_svc_redact() {
    printf '%s' "$1" | sed -E 's#^([A-Za-z][A-Za-z0-9+.-]*://[^:/@]*):[^@/]*@#\1:***@#'
}

# Is something listening on TCP port $1 (any local address)?
_slotgate_svc_port_in_use() {
    local out
    if command -v ss >/dev/null 2>&1 && out=$(ss -Hltn "sport = :$1" 2>/dev/null); then
        [ -n "$out" ]
        return
    fi
    # Fallback without ss: can we connect to it?
    if (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; then
        return 0
    fi
    return 1
}

# Print a free TCP port, starting at a random point of 21000..28999 so that
# concurrent callers rarely pick the same one. The range lies below Linux's
# ephemeral ports (32768..60999 by default): a port there can be held by an
# outgoing connection, which `ss -ltn` does not show but which makes the
# server's bind fail. Ports listed in $_slotgate_svc_avoid are skipped.
_slotgate_svc_pick_port() {
    local start=$((21000 + RANDOM % 8000)) i p
    for ((i = 0; i < 500; i++)); do
        p=$((start + i))
        case " ${_slotgate_svc_avoid:-} " in *" $p "*) continue ;; esac
        if ! _slotgate_svc_port_in_use "$p"; then
            printf '%s\n' "$p"
            return 0
        fi
    done
    return 1
}

# Print the directory holding initdb/pg_ctl/postgres (highest version).
_slotgate_svc_pg_bindir() {
    local d best="" list
    list=$(find /usr/lib/postgresql -mindepth 2 -maxdepth 2 -name bin -type d 2>/dev/null | sort -V) || true
    while IFS= read -r d; do
        if [ -n "$d" ] && [ -x "$d/initdb" ] && [ -x "$d/pg_ctl" ] && [ -x "$d/postgres" ]; then
            best=$d
        fi
    done <<<"$list"
    if [ -z "$best" ] && command -v initdb >/dev/null 2>&1 && command -v pg_ctl >/dev/null 2>&1; then
        best=$(dirname "$(command -v pg_ctl)")
    fi
    [ -n "$best" ] || return 1
    printf '%s\n' "$best"
}

# Run "$@" in directory $1 as the user that owns the throwaway postgres
# (the `postgres` system user when we are root, else ourselves).
_slotgate_svc_as_pg() {
    local dir=$1
    shift
    if [ -n "${_slotgate_svc_pg_runas:-}" ]; then
        if command -v runuser >/dev/null 2>&1; then
            (cd "$dir" && exec runuser -u "$_slotgate_svc_pg_runas" -- "$@")
        else
            (cd "$dir" && exec su "$_slotgate_svc_pg_runas" -s /bin/bash -c "$(printf '%q ' "$@")")
        fi
    else
        (cd "$dir" && exec "$@")
    fi
}

# Run a command that leaves a daemon behind, without handing it our lock fd
# (otherwise the daemon would hold the lock for its whole life).
_slotgate_svc_spawn() {
    if [ -n "${_slotgate_svc_lockfd:-}" ]; then
        "$@" {_slotgate_svc_lockfd}<&-
    else
        "$@"
    fi
}

# Serialise "pick a port + start the server" between concurrent callers.
# Best effort: without flock we rely on re-trying with another port.
_slotgate_svc_lock() {
    local f=/tmp/slotgate-services.lock
    command -v flock >/dev/null 2>&1 || return 0
    if [ ! -e "$f" ]; then
        { : >>"$f" && chmod 0666 "$f"; } 2>/dev/null || true
    fi
    [ -r "$f" ] || return 0
    { exec {_slotgate_svc_lockfd}<"$f"; } 2>/dev/null || { _slotgate_svc_lockfd=; return 0; }
    if ! flock -w 120 "$_slotgate_svc_lockfd"; then
        _slotgate_svc_note "could not get $f within 120 s; going on without it"
    fi
    return 0
}

_slotgate_svc_unlock() {
    if [ -n "${_slotgate_svc_lockfd:-}" ]; then
        { exec {_slotgate_svc_lockfd}<&-; } 2>/dev/null || true
    fi
    _slotgate_svc_lockfd=
}

_slotgate_svc_state() { # KEY=VALUE lines appended to the state file
    if [ -n "${_slotgate_svc_dir:-}" ]; then
        printf '%s\n' "$@" >>"$_slotgate_svc_dir/state" 2>/dev/null || true
    fi
}

_slotgate_svc_reset() {
    _slotgate_svc_dir=
    _slotgate_svc_pg_started=
    _slotgate_svc_pg_bin=
    _slotgate_svc_pg_port=
    _slotgate_svc_pg_runas=
    _slotgate_svc_redis_started=
    _slotgate_svc_redis_port=
    _slotgate_svc_db_url=
    _slotgate_svc_redis_url=
    _slotgate_svc_avoid=
}

# --------------------------------------------------------------------------
# checks of servers given by the caller

_slotgate_svc_check_pg_url() {
    local url=$DATABASE_URL shown out bin pgisready=""
    shown=$(_slotgate_svc_redact "$url")
    if command -v pg_isready >/dev/null 2>&1; then
        pgisready=pg_isready
    elif bin=$(_slotgate_svc_pg_bindir) && [ -x "$bin/pg_isready" ]; then
        pgisready=$bin/pg_isready
    fi
    if [ -n "$pgisready" ]; then
        if ! out=$("$pgisready" -t 5 -d "$url" 2>&1); then
            _slotgate_svc_err "DATABASE_URL=$shown is not reachable (pg_isready: ${out:-no answer})"
            return 1
        fi
    elif command -v psql >/dev/null 2>&1; then
        if ! out=$(PGCONNECT_TIMEOUT=5 psql -X -w -Atq -d "$url" -c 'select 1' 2>&1); then
            _slotgate_svc_err "DATABASE_URL=$shown is not reachable (psql: ${out:-no answer})"
            return 1
        fi
    else
        _slotgate_svc_note "postgres from DATABASE_URL ($shown), not checked (no pg_isready/psql)"
        return 0
    fi
    _slotgate_svc_note "postgres from DATABASE_URL ($shown)"
}

_slotgate_svc_check_redis_url() {
    local url=$REDIS_URL shown out
    shown=$(_slotgate_svc_redact "$url")
    if ! command -v redis-cli >/dev/null 2>&1; then
        _slotgate_svc_note "redis from REDIS_URL ($shown), not checked (no redis-cli)"
        return 0
    fi
    out=$(_slotgate_svc_rcli -u "$url" ping 2>&1) || true
    case $out in
    PONG | *$'\n'PONG) ;;
    *)
        out=$(printf '%s\n' "$out" | grep -v '^Warning: Using a password' | tr '\n' ' ') || true
        _slotgate_svc_err "REDIS_URL=$shown is not reachable (redis-cli ping: ${out:-no answer})"
        return 1
        ;;
    esac
    _slotgate_svc_note "redis from REDIS_URL ($shown)"
}

# --------------------------------------------------------------------------
# throwaway servers

# Make sure the binaries exist; install them with apt-get when root.
_slotgate_svc_ensure_binaries() { # need_pg need_redis
    local need_pg=$1 need_redis=$2 pkgs="" log
    if [ "$need_pg" = 1 ] && ! _slotgate_svc_pg_bindir >/dev/null; then
        pkgs="postgresql"
    fi
    if [ "$need_redis" = 1 ]; then
        if ! command -v redis-server >/dev/null 2>&1; then
            pkgs="${pkgs:+$pkgs }redis-server"
        elif ! command -v redis-cli >/dev/null 2>&1; then
            pkgs="${pkgs:+$pkgs }redis-tools"
        fi
    fi
    [ -n "$pkgs" ] || return 0
    if ! _slotgate_svc_is_root; then
        _slotgate_svc_err "missing server binaries; install them with: sudo apt-get install $pkgs"
        return 1
    fi
    if ! command -v apt-get >/dev/null 2>&1; then
        _slotgate_svc_err "missing server binaries and no apt-get; install: $pkgs"
        return 1
    fi
    log=$(mktemp "${TMPDIR:-/tmp}/slotgate-apt-install.XXXXXX") || {
        _slotgate_svc_err "mktemp failed"
        return 1
    }
    _slotgate_svc_note "installing $pkgs with apt-get (log: $log)"
    # shellcheck disable=SC2086 # $pkgs is a word list
    if ! { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q $pkgs; } >"$log" 2>&1 </dev/null; then
        _slotgate_svc_err "apt-get install $pkgs failed; see $log"
        return 1
    fi
    rm -f -- "$log"
    if [ "$need_pg" = 1 ] && ! _slotgate_svc_pg_bindir >/dev/null; then
        _slotgate_svc_err "postgresql installed but no server binaries under /usr/lib/postgresql/*/bin"
        return 1
    fi
    if [ "$need_redis" = 1 ] && ! command -v redis-server >/dev/null 2>&1; then
        _slotgate_svc_err "redis-server installed but not found in PATH"
        return 1
    fi
}

_slotgate_svc_make_dir() { # need_pg
    local need_pg=$1 base=${TMPDIR:-/tmp} dir
    if [ ! -d "$base" ] || [ ! -w "$base" ] || [ "${#base}" -gt 60 ]; then
        base=/tmp # also keeps the postgres unix socket path short (max 107)
    fi
    if [ "$need_pg" = 1 ] && [ -n "${_slotgate_svc_pg_runas:-}" ] && [ "$base" != /tmp ] &&
        ! runuser -u "$_slotgate_svc_pg_runas" -- test -x "$base" 2>/dev/null; then
        base=/tmp # the postgres user must be able to reach its data dir
    fi
    if ! dir=$(mktemp -d "$base/slotgate-services.XXXXXX"); then
        _slotgate_svc_err "mktemp -d in $base failed"
        return 1
    fi
    _slotgate_svc_dir=$dir
    chmod 755 "$dir" || return 1
    if [ "$need_pg" = 1 ] && [ -n "${_slotgate_svc_pg_runas:-}" ]; then
        if ! chown "$_slotgate_svc_pg_runas:" "$dir"; then
            _slotgate_svc_err "chown $_slotgate_svc_pg_runas $dir failed"
            return 1
        fi
    fi
    _slotgate_svc_state "dir=$dir" "owner_pid=$$"
}

_slotgate_svc_pg_init() {
    local dir=$_slotgate_svc_dir bin=$_slotgate_svc_pg_bin
    if ! _slotgate_svc_as_pg "$dir" "$bin/initdb" -D "$dir/pgdata" --auth=trust -U postgres \
        -E UTF8 --locale=C >"$dir/initdb.log" 2>&1 </dev/null; then
        _slotgate_svc_err "initdb failed; see $dir/initdb.log"
        return 1
    fi
    if ! cat >>"$dir/pgdata/postgresql.conf" <<EOF

# --- slotgate throwaway server (scripts/services.sh) ---
listen_addresses = '127.0.0.1'
unix_socket_directories = '$dir'
fsync = off
max_connections = 300
shared_buffers = 128MB
EOF
    then
        _slotgate_svc_err "could not write $dir/pgdata/postgresql.conf"
        return 1
    fi
}

_slotgate_svc_pg_start() { # must be called with the lock held
    local dir=$_slotgate_svc_dir bin=$_slotgate_svc_pg_bin port
    for _ in 1 2 3 4 5; do
        if ! port=$(_slotgate_svc_pick_port); then
            _slotgate_svc_err "no free TCP port found for postgres"
            return 1
        fi
        printf 'port = %s\n' "$port" >>"$dir/pgdata/postgresql.conf"
        _slotgate_svc_pg_started=1
        _slotgate_svc_pg_port=$port
        _slotgate_svc_state "pg_bin=$bin" "pg_data=$dir/pgdata" "pg_port=$port" \
            "pg_user=${_slotgate_svc_pg_runas:-$(id -un)}"
        if _slotgate_svc_spawn _slotgate_svc_as_pg "$dir" "$bin/pg_ctl" -D "$dir/pgdata" \
            -l "$dir/postgres.log" -w -t 60 start >>"$dir/pg_ctl.log" 2>&1 </dev/null; then
            _slotgate_svc_avoid="${_slotgate_svc_avoid:-} $port"
            return 0
        fi
        # A postmaster still running is not a port problem: give up.
        # Otherwise the bind may have lost a race, or hit a port an outgoing
        # connection held (invisible to `ss -ltn`): try another port.
        if [ -f "$dir/pgdata/postmaster.pid" ]; then
            break
        fi
        _slotgate_svc_avoid="${_slotgate_svc_avoid:-} $port"
    done
    _slotgate_svc_err "postgres failed to start on 127.0.0.1:$port; see $dir/postgres.log and $dir/pg_ctl.log"
    return 1
}

_slotgate_svc_redis_pid() {
    local f=${_slotgate_svc_dir:-}/redis.pid pid=""
    if [ -n "${_slotgate_svc_dir:-}" ] && [ -r "$f" ]; then
        read -r pid <"$f" || true
    fi
    case $pid in '' | *[!0-9]*) return 1 ;; esac
    printf '%s\n' "$pid"
}

# redis-cli with a time limit (it waits forever on a listener that is not redis)
_slotgate_svc_rcli() {
    if command -v timeout >/dev/null 2>&1; then
        timeout 5 redis-cli "$@"
    else
        redis-cli "$@"
    fi
}

# Print the pidfile setting of the redis answering on 127.0.0.1:$1
# (ours if it is $_slotgate_svc_dir/redis.pid).
_slotgate_svc_redis_pidfile_of() {
    _slotgate_svc_rcli -h 127.0.0.1 -p "$1" config get pidfile 2>/dev/null | sed -n 2p
}

_slotgate_svc_redis_start() { # must be called with the lock held
    local dir=$_slotgate_svc_dir port end out pid remote
    for _ in 1 2 3 4 5; do
        if ! port=$(_slotgate_svc_pick_port); then
            _slotgate_svc_err "no free TCP port found for redis"
            return 1
        fi
        rm -f -- "$dir/redis.pid"
        _slotgate_svc_redis_started=1
        _slotgate_svc_redis_port=$port
        _slotgate_svc_state "redis_port=$port" "redis_pidfile=$dir/redis.pid"
        # (early errors, before redis opens its logfile, go to stderr: same log)
        # shellcheck disable=SC2094
        if ! _slotgate_svc_spawn redis-server --daemonize yes --bind 127.0.0.1 --port "$port" \
            --save "" --appendonly no --dir "$dir" --pidfile "$dir/redis.pid" \
            --logfile "$dir/redis.log" </dev/null >>"$dir/redis.log" 2>&1; then
            _slotgate_svc_err "redis-server failed to start; see $dir/redis.log"
            return 1
        fi
        end=$((SECONDS + 10))
        while :; do
            if grep -Eq "listening socket [^ ]*:$port: |Failed listening on port $port " \
                "$dir/redis.log" 2>/dev/null; then
                break # ours could not bind the port
            fi
            out=$(_slotgate_svc_rcli -h 127.0.0.1 -p "$port" ping 2>/dev/null) || true
            if [ "$out" = PONG ]; then
                # Is it really ours (and not another server on that port)?
                remote=$(_slotgate_svc_redis_pidfile_of "$port") || true
                if [ "$remote" = "$dir/redis.pid" ]; then
                    _slotgate_svc_avoid="${_slotgate_svc_avoid:-} $port"
                    return 0
                fi
                break # someone else answers on that port
            fi
            if pid=$(_slotgate_svc_redis_pid) && ! kill -0 "$pid" 2>/dev/null; then
                break # ours died
            fi
            if [ "$SECONDS" -ge "$end" ]; then
                _slotgate_svc_err "redis on 127.0.0.1:$port did not answer PING within 10 s; see $dir/redis.log"
                return 1
            fi
            sleep 0.1
        done
        # Ours died or is not the one answering: stop it, and try another
        # port only if this one has been taken by something else meanwhile.
        if pid=$(_slotgate_svc_redis_pid) && kill -0 "$pid" 2>/dev/null; then
            kill "$pid" 2>/dev/null || true
            sleep 0.5
        fi
        # Try another port: the bind may have failed on a port that an
        # outgoing connection held (invisible to `ss -ltn`).
        _slotgate_svc_avoid="${_slotgate_svc_avoid:-} $port"
    done
    _slotgate_svc_err "redis failed to start on 127.0.0.1:$port; see $dir/redis.log"
    return 1
}

# Stop what we started (postgres, redis); leaves the temp dir alone.
_slotgate_svc_stop_processes() {
    local dir=${_slotgate_svc_dir:-} pid remote i
    if [ -n "${_slotgate_svc_redis_started:-}" ] && [ -n "$dir" ]; then
        if pid=$(_slotgate_svc_redis_pid); then
            remote=$(_slotgate_svc_redis_pidfile_of "${_slotgate_svc_redis_port:-0}") || true
            if [ "$remote" = "$dir/redis.pid" ]; then
                _slotgate_svc_rcli -h 127.0.0.1 -p "$_slotgate_svc_redis_port" shutdown nosave >/dev/null 2>&1 || true
            elif kill -0 "$pid" 2>/dev/null; then
                kill "$pid" 2>/dev/null || true
            fi
            for ((i = 0; i < 100; i++)); do
                kill -0 "$pid" 2>/dev/null || break
                sleep 0.1
            done
            kill -9 "$pid" 2>/dev/null || true
        fi
        _slotgate_svc_redis_started=
    fi
    if [ -n "${_slotgate_svc_pg_started:-}" ] && [ -n "$dir" ]; then
        if [ -f "$dir/pgdata/postmaster.pid" ]; then
            if ! _slotgate_svc_as_pg "$dir" "$_slotgate_svc_pg_bin/pg_ctl" -D "$dir/pgdata" \
                -m fast -w -t 30 stop >>"$dir/pg_ctl.log" 2>&1 </dev/null; then
                pid=
                read -r pid <"$dir/pgdata/postmaster.pid" 2>/dev/null || true
                case $pid in '' | *[!0-9]*) ;; *)
                    kill -QUIT "$pid" 2>/dev/null || true
                    for ((i = 0; i < 50; i++)); do
                        kill -0 "$pid" 2>/dev/null || break
                        sleep 0.1
                    done
                    kill -9 "$pid" 2>/dev/null || true
                    ;;
                esac
            fi
        fi
        _slotgate_svc_pg_started=
    fi
    return 0
}

_slotgate_svc_up_impl() {
    local need_pg=0 need_redis=0 dir

    # Already started by an earlier call in this shell: nothing to do.
    if [ -n "${_slotgate_svc_dir:-}" ] && [ -d "$_slotgate_svc_dir" ]; then
        if [ -n "${_slotgate_svc_db_url:-}" ]; then export DATABASE_URL="$_slotgate_svc_db_url"; fi
        if [ -n "${_slotgate_svc_redis_url:-}" ]; then export REDIS_URL="$_slotgate_svc_redis_url"; fi
        export SLOTGATE_SERVICES_DIR="$_slotgate_svc_dir"
        return 0
    fi
    _slotgate_svc_reset

    # 1. Servers given by the caller.
    if [ -n "${DATABASE_URL:-}" ]; then
        _slotgate_svc_check_pg_url || return 1
        export DATABASE_URL
    else
        need_pg=1
    fi
    if [ -n "${REDIS_URL:-}" ]; then
        _slotgate_svc_check_redis_url || return 1
        export REDIS_URL
    else
        need_redis=1
    fi
    if [ "$need_pg" = 0 ] && [ "$need_redis" = 0 ]; then
        return 0
    fi

    # 2. Throwaway servers.
    _slotgate_svc_ensure_binaries "$need_pg" "$need_redis" || return 1
    if [ "$need_pg" = 1 ]; then
        _slotgate_svc_pg_bin=$(_slotgate_svc_pg_bindir) || return 1
        if _slotgate_svc_is_root; then
            # postgres refuses to run as root: use the postgres system user.
            if ! id -u postgres >/dev/null 2>&1; then
                if ! useradd --system --home /nonexistent --no-create-home \
                    --shell /usr/sbin/nologin postgres >/dev/null 2>&1; then
                    _slotgate_svc_err "useradd postgres failed (postgres cannot run as root)"
                    return 1
                fi
            fi
            _slotgate_svc_pg_runas=postgres
        fi
    fi
    _slotgate_svc_make_dir "$need_pg" || return 1
    dir=$_slotgate_svc_dir

    # initdb is slow and needs no port: do it before taking the lock.
    if [ "$need_pg" = 1 ]; then
        _slotgate_svc_pg_init || return 1
    fi

    _slotgate_svc_lock
    if [ "$need_pg" = 1 ]; then
        _slotgate_svc_pg_start || return 1
    fi
    if [ "$need_redis" = 1 ]; then
        _slotgate_svc_redis_start || return 1
    fi
    _slotgate_svc_unlock

    if [ "$need_pg" = 1 ]; then
        _slotgate_svc_db_url="postgres://postgres@127.0.0.1:$_slotgate_svc_pg_port/postgres"
        export DATABASE_URL="$_slotgate_svc_db_url"
        _slotgate_svc_state "DATABASE_URL=$DATABASE_URL"
        _slotgate_svc_note "postgres throwaway on 127.0.0.1:$_slotgate_svc_pg_port (data in $dir/pgdata, log $dir/postgres.log)"
    fi
    if [ "$need_redis" = 1 ]; then
        _slotgate_svc_redis_url="redis://127.0.0.1:$_slotgate_svc_redis_port/"
        export REDIS_URL="$_slotgate_svc_redis_url"
        _slotgate_svc_state "REDIS_URL=$REDIS_URL"
        _slotgate_svc_note "redis throwaway on 127.0.0.1:$_slotgate_svc_redis_port (dir $dir, log $dir/redis.log)"
    fi
    export SLOTGATE_SERVICES_DIR="$dir"
    return 0
}

slotgate_services_up() {
    # Called in an `if` so that the caller's `set -e` cannot abort us half-way
    # (every step checks its own errors); on failure stop whatever was started.
    if _slotgate_svc_up_impl; then
        return 0
    fi
    _slotgate_svc_unlock
    _slotgate_svc_stop_processes
    if [ -n "${_slotgate_svc_dir:-}" ] && [ -d "$_slotgate_svc_dir" ]; then
        rm -rf -- "$_slotgate_svc_dir/pgdata" 2>/dev/null || true
        _slotgate_svc_note "logs kept in $_slotgate_svc_dir (remove it when done)"
    fi
    _slotgate_svc_reset
    return 1
}

slotgate_services_down() {
    local dir=${_slotgate_svc_dir:-}
    _slotgate_svc_unlock
    _slotgate_svc_stop_processes
    if [ -n "$dir" ]; then
        case $dir in
        */slotgate-services.*) rm -rf -- "$dir" 2>/dev/null || true ;;
        esac
        if [ "${SLOTGATE_SERVICES_DIR:-}" = "$dir" ]; then
            unset SLOTGATE_SERVICES_DIR
        fi
        if [ -n "${_slotgate_svc_db_url:-}" ] && [ "${DATABASE_URL:-}" = "$_slotgate_svc_db_url" ]; then
            unset DATABASE_URL
        fi
        if [ -n "${_slotgate_svc_redis_url:-}" ] && [ "${REDIS_URL:-}" = "$_slotgate_svc_redis_url" ]; then
            unset REDIS_URL
        fi
    fi
    _slotgate_svc_reset
    return 0
}

_slotgate_svc_reset
_slotgate_svc_lockfd=
