#!/usr/bin/env bash
# Mutation testing of the modules that decide (issue 28): cargo-mutants changes their code one
# small edit at a time (a `<` made `<=`, a `&&` made `||`, a function that returns a default)
# and runs the library's unit tests against each change; a change no test notices ("missed")
# is a rule no test holds. By hand, not in CI: it is slow (see the timing below).
#
# Usage: scripts/mutants.sh [MODULE...]
#   MODULE: liveness backoff job ledger config cron contract (all of them when none given)
#   e.g. scripts/mutants.sh backoff cron
#
# What it mutates and which tests it runs is in .cargo/mutants.toml: the pure modules, config
# validation only (not loading or redaction), and `cargo test --lib` minus the slow redact and
# handler tests, which call none of them. Mutants found equivalent (no test can tell them
# from the original) are excluded there too, each with its reason.
#
# Cost, measured on 2 cores shared with other builds: 5 to 13 s a mutant (an incremental
# build of the library's tests, 3 to 10 s, then under 1 s of tests). All 622 mutants took
# 52 min in one run; the time spent on each file's mutants was job 2 min, cron 2,
# liveness 3, backoff 4, ledger 5, config 14, contract 23 (a one-module run adds a baseline
# build and test, under a minute when target/ is fresh). Five mutants of
# contract::parse_duration_ns (an index that stops advancing) hang and are stopped at the
# timeout: they count as "timeout" and make the exit status 3.
#
# How it runs, on a machine shared with others: at nice 15, one mutant at a time, each
# test run killed after 30 s (the tests take about 1 s; a mutant that loops forever counts as
# "timeout"), in place:
# cargo-mutants edits the files of this checkout and restores each one after its mutant, so
# the build reuses target/ (a copy of the tree would rebuild every dependency). Do not edit
# src/ while it runs. If it is killed hard, look for the marker it leaves:
#   grep -rn 'changed by cargo-mutants' src/
#
# Output: counts per file and overall (mutants, caught, missed, unviable, timeouts), and the
# report in target/mutants/mutants.out/ (missed.txt, caught.txt, timeout.txt, unviable.txt,
# outcomes.json, a log per mutant under log/).
# Exit status: 0 when every mutant was caught or unviable, 2 when some were missed, 3 when
# some timed out (cargo-mutants' own codes), other codes for errors.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

if ! cargo mutants --version >/dev/null 2>&1; then
    echo "cargo-mutants is not installed; install it with: cargo install cargo-mutants --locked" >&2
    exit 1
fi
if grep -rlq 'changed by cargo-mutants' src/; then
    echo "src/ holds a mutant left by an interrupted run:" >&2
    grep -rln 'changed by cargo-mutants' src/ >&2
    echo "restore it first (git checkout -- FILE, or git diff to see it)" >&2
    exit 1
fi

all=(liveness backoff job ledger config cron contract)
files=()
for module in "${@:-${all[@]}}"; do
    case "$module" in
        liveness | backoff | job | config | cron | contract) files+=(-f "src/$module.rs") ;;
        ledger) files+=(-f src/worker/ledger.rs) ;;
        *)
            echo "unknown module '$module'; give any of: liveness backoff job ledger config cron contract" >&2
            exit 1
            ;;
    esac
done

out=target/mutants
mkdir -p "$out"
start=$(date +%s)
status=0
nice -n 15 cargo mutants --in-place --timeout 30 --build-timeout 600 \
    --output "$out" --no-shuffle "${files[@]}" || status=$?
elapsed=$(($(date +%s) - start))

report="$out/mutants.out"
if [[ ! -f $report/outcomes.json ]]; then
    echo "cargo-mutants wrote no report (exit status $status)" >&2
    exit "$status"
fi
echo
echo "mutation testing: $((elapsed / 60)) min $((elapsed % 60)) s"
# One line per file, then the total: outcomes.json holds every mutant's summary.
jq -r '
  def count(s): map(select(.summary == s)) | length;
  [.outcomes[] | select(.scenario != "Baseline")
   | {file: .scenario.Mutant.file, summary}] as $all
  | ($all | group_by(.file)[] | [.[0].file, length, count("CaughtMutant"),
       count("MissedMutant"), count("Unviable"), count("Timeout")]),
    ["total", ($all | length), ($all | count("CaughtMutant")), ($all | count("MissedMutant")),
       ($all | count("Unviable")), ($all | count("Timeout"))]
  | @tsv' "$report/outcomes.json" |
    awk 'BEGIN { printf "%-22s %7s %7s %7s %8s %8s\n", "file", "mutants", "caught", "missed", "unviable", "timeout" }
         { printf "%-22s %7s %7s %7s %8s %8s\n", $1, $2, $3, $4, $5, $6 }'
echo
echo "report: $report/ (missed.txt lists the mutants no test caught)"
if [[ -s $report/missed.txt ]]; then
    echo "missed:"
    sed 's/^/  /' "$report/missed.txt"
fi
exit "$status"
