#!/usr/bin/env bash
# Run the producer libraries' tests: clients/typescript (npm ci, tsc, node --test) and
# clients/python (a virtualenv, pip install -e, pytest), each against real servers.
#
# Usage: bash clients/test.sh          (scripts/test.sh runs it after cargo test)
#
# Needs what scripts/test.sh sets up first: PostgreSQL at $JOBWARDEN_TEST_DATABASE_URL
# (default postgres://postgres@127.0.0.1:5432/test), nats-server (each suite starts its
# own), and target/debug/jobwarden (cargo build; $JOBWARDEN_BIN overrides it).
# Node >= 20 with npm, and Python >= 3.11 with venv: a missing one is skipped with the
# reason, except in CI (CI=true), where it fails.
# The Python virtualenv lives in ${XDG_CACHE_HOME:-~/.cache}/jobwarden/clients-python
# (rebuilt when clients/python/requirements-test.txt or pyproject.toml change);
# node_modules in clients/typescript.
#
# Prints a line per language, and last `clients: N passed, N failed` (tests of both
# suites; a suite that could not run counts as one failed). Exits non-zero if any failed.
set -uo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/.." && pwd)
export JOBWARDEN_BIN="${JOBWARDEN_BIN:-$repo/target/debug/jobwarden}"
case ":$PATH:" in *:/usr/sbin:*) ;; *) PATH="$PATH:/usr/sbin" ;; esac
export PATH

passed=0
failed=0
logs=$(mktemp -d "${TMPDIR:-/tmp}/jobwarden-clients.XXXXXX")
trap 'rm -rf "$logs"' EXIT

say() { echo "==> clients/$*"; }

# A toolchain is missing: skip with the reason, or fail in CI.
missing() {
    local lang=$1 why=$2
    if [[ ${CI:-} == true || ${CI:-} == 1 ]]; then
        say "$lang: FAILED: $why (CI=${CI}: a missing toolchain fails the run)"
        failed=$((failed + 1))
    else
        say "$lang: skipped: $why"
    fi
}

# Runs a step quietly; on failure shows its output's tail and counts the suite as failed.
step() {
    local lang=$1 what=$2 log="$logs/$1-step.log" rc=0
    shift 2
    "$@" >"$log" 2>&1 || rc=$?
    if ((rc != 0)); then
        tail -n 40 "$log" >&2
        say "$lang: FAILED: $what (exit $rc, output above)"
        failed=$((failed + 1))
        return 1
    fi
}

# Adds the counts a runner printed to the totals; a run that failed without a failed test
# counts as one failure.
tally() {
    local lang=$1 rc=$2 p=$3 f=$4 detail=$5 log=$6
    if ((rc != 0)) && ((f == 0)); then
        f=1
    fi
    if ((rc != 0)); then
        tail -n 150 "$log"
    fi
    if ((rc == 0 && p == 0)); then
        tail -n 40 "$log"
        say "$lang: FAILED: no test ran"
        f=1
    fi
    passed=$((passed + p))
    failed=$((failed + f))
    if ((f == 0)); then
        say "$lang: $p passed, 0 failed ($detail)"
    else
        say "$lang: FAILED: $p passed, $f failed ($detail)"
    fi
}

run_typescript() {
    local dir="$here/typescript" major log="$logs/typescript.log" rc=0 p f
    if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
        missing typescript "node and npm not found (install Node.js 20 or newer, e.g. apt-get install nodejs npm)"
        return
    fi
    major=$(node -p 'process.versions.node.split(".")[0]' 2>/dev/null || echo 0)
    if ((major < 20)); then
        missing typescript "node $(node --version) is older than 20"
        return
    fi
    say "typescript: node $(node --version), npm $(npm --version): npm ci, tsc, node --test"
    cd "$dir" || return
    step typescript "npm ci" npm ci --no-audit --no-fund || return
    step typescript "tsc (npm run build)" npm run --silent build || return
    node --test --test-concurrency=1 --test-reporter=tap dist/test/*.test.js >"$log" 2>&1 || rc=$?
    p=$(grep -E '^# pass [0-9]+' "$log" | tail -n 1 | grep -oE '[0-9]+' || echo 0)
    f=$(grep -E '^# fail [0-9]+' "$log" | tail -n 1 | grep -oE '[0-9]+' || echo 0)
    grep -E '^not ok' "$log" | sed 's/^/    /'
    tally typescript "$rc" "$p" "$f" "node --test" "$log"
}

run_python() {
    local dir="$here/python" py="" venv stamp log="$logs/python.log" rc=0 p f e
    for cand in python3 /usr/bin/python3; do
        if command -v "$cand" >/dev/null 2>&1 &&
            "$cand" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
            py=$cand
            break
        fi
    done
    if [[ -z $py ]]; then
        missing python "no python3 of version 3.11 or newer found"
        return
    fi
    venv="${XDG_CACHE_HOME:-$HOME/.cache}/jobwarden/clients-python"
    stamp=$(cat "$dir/requirements-test.txt" "$dir/pyproject.toml" | sha256sum | cut -c1-16)-$("$py" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
    if [[ ! -x $venv/bin/python || $(cat "$venv/stamp" 2>/dev/null) != "$stamp" ]]; then
        mkdir -p "$(dirname "$venv")"
        if ! "$py" -m venv --clear "$venv" >"$logs/venv.log" 2>&1; then
            cat "$logs/venv.log" >&2
            missing python "$py -m venv failed (Debian: apt-get install python3-venv)"
            return
        fi
        step python "pip install -r requirements-test.txt -e clients/python" \
            "$venv/bin/python" -m pip install --disable-pip-version-check --no-input \
            -r "$dir/requirements-test.txt" -e "$dir" || return
        echo "$stamp" >"$venv/stamp"
    else
        # The package itself may have moved (a new clone): install it again, without deps.
        step python "pip install -e clients/python" \
            "$venv/bin/python" -m pip install --disable-pip-version-check --no-input --no-deps -e "$dir" || return
    fi
    say "python: $("$venv/bin/python" --version), venv $venv: pytest"
    cd "$dir" || return
    "$venv/bin/python" -m pytest -p no:cacheprovider -q -rfE tests >"$log" 2>&1 || rc=$?
    # pytest's last line: "N failed, N passed, N errors in 3.2s" (any order, any subset).
    local summary
    summary=$(tail -n 1 "$log")
    p=$(grep -oE '[0-9]+ passed' <<<"$summary" | grep -oE '[0-9]+' || echo 0)
    f=$(grep -oE '[0-9]+ failed' <<<"$summary" | grep -oE '[0-9]+' || echo 0)
    e=$(grep -oE '[0-9]+ errors?' <<<"$summary" | grep -oE '[0-9]+' || echo 0)
    grep -E '^(FAILED|ERROR) ' "$log" | sed 's/^/    /'
    tally python "$rc" "$p" "$((f + e))" "pytest" "$log"
}

run_typescript
run_python
echo "clients: $passed passed, $failed failed"
((failed == 0))
