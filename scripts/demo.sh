#!/usr/bin/env bash
# The jobwarden demo in one command: installs nats-server and PostgreSQL when they are
# missing (scripts/ensure-servers.sh), builds jobwarden in release mode, then runs
# `jobwarden demo`, which starts a throwaway nats-server and PostgreSQL, three worker
# processes and a demo application, publishes a mixed workload and shows it drain.
#
# Usage: scripts/demo.sh [--workers N] [--jobs N] [--database-url URL] [--nats-url URL] [--hold]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
case ":$PATH:" in *:/usr/sbin:*) ;; *) PATH="$PATH:/usr/sbin" ;; esac
export PATH
bash scripts/ensure-servers.sh
cargo build --release --quiet
exec target/release/jobwarden demo "$@"
