#!/usr/bin/env bash
# Run jobwarden's test suite: make sure the servers it needs are there
# (scripts/ensure-servers.sh), then build and run every target.
#
# Usage: scripts/test.sh [CARGO TEST ARGS...] [-- TEST BINARY ARGS...]
#   e.g. scripts/test.sh --test core          # one integration test file
#        scripts/test.sh claim -- --nocapture  # tests matching "claim", with output
#
# Runs: cargo build --all-targets
#       cargo test --all-targets [ARGS...] -- --test-threads=2 [TEST BINARY ARGS...]
#       bash clients/test.sh (the TypeScript and Python producer libraries; without ARGS only)
# (--all-targets is left out if ARGS choose targets, e.g. --test NAME or --lib:
# cargo would otherwise run every target as well; --test-threads=2 is left out
# if you pass your own --test-threads).
# Exits with cargo's exit code (or, when cargo passed, clients/test.sh's). Never
# prompts (also fine with CI=true and no terminal).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

# Split our arguments: before the first `--` for cargo test, after it for the
# test binaries.
cargo_args=()
harness_args=()
seen_sep=0
for arg in "$@"; do
    if ((seen_sep)); then
        harness_args+=("$arg")
    elif [[ $arg == "--" ]]; then
        seen_sep=1
    else
        cargo_args+=("$arg")
    fi
done
# Every target, unless the arguments choose some.
targets=(--all-targets)
for arg in "${cargo_args[@]}"; do
    case $arg in
    --test | --test=* | --tests | --lib | --bin | --bin=* | --bins | --example | --example=* | \
        --examples | --bench | --bench=* | --benches | --doc | --all-targets) targets=() ;;
    esac
done
threads=(--test-threads=2)
for arg in "${harness_args[@]}"; do
    [[ $arg == --test-threads* ]] && threads=()
done

# The test harness finds nats-server in /usr/sbin itself; this is for anything
# else that looks it up on PATH.
case ":$PATH:" in *:/usr/sbin:*) ;; *) PATH="$PATH:/usr/sbin" ;; esac
export PATH
export RUST_BACKTRACE="${RUST_BACKTRACE:-1}"

echo "==> jobwarden tests in $PWD${CI:+ (CI=$CI)}"
echo "==> scripts/ensure-servers.sh --browser --deploy-tools --faketime (nats-server, PostgreSQL at ${JOBWARDEN_TEST_DATABASE_URL:-postgres://postgres@127.0.0.1:5432/test}, chromium, k8s/Dockerfile validators, libfaketime)"
rc=0
bash scripts/ensure-servers.sh --browser --deploy-tools --faketime || rc=$?
if ((rc != 0)); then
    echo "==> FAILED: scripts/ensure-servers.sh exited with $rc (see its ERROR above): the tests' servers or tools are not in place" >&2
    exit "$rc"
fi

echo "==> $(cargo --version)"
echo "==> cargo build --all-targets"
cargo build --all-targets || rc=$?
if ((rc != 0)); then
    echo "==> FAILED: cargo build exited with $rc" >&2
    exit "$rc"
fi

test_cmd=(cargo test "${targets[@]}" "${cargo_args[@]}" -- "${threads[@]}" "${harness_args[@]}")
echo "==> ${test_cmd[*]}"
"${test_cmd[@]}" || rc=$?
if ((rc != 0)); then
    echo "==> FAILED: cargo test exited with $rc" >&2
else
    echo "==> all cargo tests passed"
fi

# The producer libraries (clients/typescript, clients/python): their own suites against the
# same servers and the binary just built, for the whole suite only (arguments that choose
# cargo targets or tests leave them out). Their last line, `clients: N passed, N failed`,
# ends the run; the exit code is cargo's if it failed, else theirs.
if ((${#cargo_args[@]} == 0)); then
    echo "==> bash clients/test.sh (TypeScript and Python producer libraries)"
    clients_rc=0
    bash clients/test.sh || clients_rc=$?
    if ((rc == 0)); then
        rc=$clients_rc
    fi
else
    echo "==> clients/test.sh left out (cargo arguments choose what runs: ${cargo_args[*]}); run it with: bash clients/test.sh"
fi
exit "$rc"
