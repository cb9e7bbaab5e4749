// Real servers for the tests: a throwaway nats-server (free port, temp store, killed at the
// end), a jobwarden schema of its own in the test database (migrated by the built binary,
// dropped at the end), and `jobwarden run` worker processes with a TOML config.
import { spawn, spawnSync, type ChildProcess } from "node:child_process";
import { existsSync, mkdtempSync, openSync, readFileSync, readdirSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import pg from "pg";

/** The repository's root (this file is clients/typescript/dist/test/harness.js). */
export const REPO = fileURLToPath(new URL("../../../../", import.meta.url));
export const DATABASE_URL = process.env.JOBWARDEN_TEST_DATABASE_URL ?? "postgres://postgres@127.0.0.1:5432/test";
export const JOBWARDEN_BIN = process.env.JOBWARDEN_BIN ?? join(REPO, "target", "debug", "jobwarden");

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** Polls `check` until it is true or `timeoutMs` passed; returns whether it became true. */
export async function waitFor(check: () => Promise<boolean> | boolean, timeoutMs = 20_000): Promise<boolean> {
  const end = Date.now() + timeoutMs;
  for (;;) {
    if (await check()) return true;
    if (Date.now() > end) return false;
    await sleep(50);
  }
}

function natsServerBinary(): string {
  if (process.env.NATS_SERVER) return process.env.NATS_SERVER;
  for (const dir of ["/usr/sbin", "/usr/bin", "/usr/local/bin", ...(process.env.PATH ?? "").split(":")]) {
    const p = join(dir, "nats-server");
    if (dir && existsSync(p)) return p;
  }
  throw new Error("nats-server not found (scripts/ensure-servers.sh installs it; or set NATS_SERVER)");
}

export interface NatsServer {
  url: string;
  stop(): Promise<void>;
}

/** Starts nats-server with JetStream on a free port, its store in a temp dir. */
export async function startNats(): Promise<NatsServer> {
  const dir = mkdtempSync(join(tmpdir(), "jobwarden-ts-nats-"));
  const child = spawn(natsServerBinary(), ["-js", "-sd", dir, "-a", "127.0.0.1", "-p", "-1", "--ports_file_dir", dir, "-l", join(dir, "nats.log")], {
    stdio: "ignore",
  });
  const forget = killOnExit(child);
  let url: string | undefined;
  const up = await waitFor(() => {
    const file = readdirSync(dir).find((f) => f.endsWith(".ports"));
    if (!file) return false;
    try {
      url = (JSON.parse(readFileSync(join(dir, file), "utf8")) as { nats: string[] }).nats[0];
    } catch {
      return false; // being written
    }
    return !!url;
  }, 10_000);
  if (!up || !url) {
    child.kill("SIGKILL");
    throw new Error(`nats-server did not start (log: ${join(dir, "nats.log")})`);
  }
  return {
    url,
    async stop() {
      await stopChild(child);
      forget();
      rmSync(dir, { recursive: true, force: true });
    },
  };
}

/** Kills `child` if this test process exits first (a failed hook, a crash): no orphans. */
function killOnExit(child: ChildProcess): () => void {
  const kill = () => {
    child.kill("SIGKILL");
  };
  process.once("exit", kill);
  return () => process.removeListener("exit", kill);
}

/** Stops a child: `signal`, then SIGKILL if it is still there after 10 s. */
async function stopChild(child: ChildProcess, signal: NodeJS.Signals = "SIGKILL"): Promise<void> {
  if (child.exitCode !== null || child.signalCode !== null) return;
  const exited = new Promise((r) => child.once("exit", r));
  child.kill(signal);
  const timer = setTimeout(() => child.kill("SIGKILL"), 10_000);
  await exited;
  clearTimeout(timer);
}

/** A jobwarden schema of its own: created and migrated by `jobwarden migrate`. */
export async function migrateSchema(prefix = "jw_ts"): Promise<string> {
  if (!existsSync(JOBWARDEN_BIN)) {
    throw new Error(`${JOBWARDEN_BIN} is missing: build it first (cargo build; scripts/test.sh does) or set JOBWARDEN_BIN`);
  }
  const schema = `${prefix}_${process.pid}_${Math.floor(Math.random() * 1e9).toString(36)}`;
  const run = spawnSync(JOBWARDEN_BIN, ["migrate"], {
    env: { ...process.env, JOBWARDEN_DATABASE__URL: DATABASE_URL, JOBWARDEN_DATABASE__SCHEMA: schema },
    encoding: "utf8",
    timeout: 120_000,
  });
  if (run.status !== 0) {
    throw new Error(`jobwarden migrate (schema ${schema}) exited ${run.status}: ${run.stderr}${run.stdout}`);
  }
  return schema;
}

export async function dropSchema(schema: string): Promise<void> {
  const c = new pg.Client({ connectionString: DATABASE_URL });
  await c.connect();
  try {
    await c.query(`DROP SCHEMA IF EXISTS "${schema}" CASCADE`);
  } finally {
    await c.end();
  }
}

export async function connectDb(): Promise<pg.Client> {
  const c = new pg.Client({ connectionString: DATABASE_URL });
  await c.connect();
  return c;
}

export interface Worker {
  log(): string;
  stop(): Promise<void>;
}

/**
 * Starts `jobwarden run` against `natsUrl` and `schema`, serving `queues` with an exec
 * handler that records each job's id and reads its payload (as a result).
 */
export function startWorker(opts: { schema: string; natsUrl: string; queues: string[]; hostname?: string }): Worker {
  const dir = mkdtempSync(join(tmpdir(), "jobwarden-ts-worker-"));
  const queues = opts.queues
    .map((q) => `[queues.${q}]\nconcurrency = 2\nmax_attempts = 2\nbackoff = { kind = "fixed", base = "100ms" }\n`)
    .join("\n");
  const script = `payload=$(cat); printf '{"result":{"ran":"%s","payload":%s}}\\n' "$JOB_ID" "$payload"`;
  const config = `[database]
url = ${JSON.stringify(DATABASE_URL)}
schema = ${JSON.stringify(opts.schema)}
pool_size = 4

[nats]
url = ${JSON.stringify(opts.natsUrl)}

[worker]
api_listen = "127.0.0.1:0"
ops_listen = "127.0.0.1:0"
scheduler_every = "100ms"

[handler]
kind = "exec"
command = ["/bin/sh", "-c", ${JSON.stringify(script)}]

${queues}`;
  const path = join(dir, "jobwarden.toml");
  writeFileSync(path, config);
  const logPath = join(dir, "worker.log");
  const child = spawn(JOBWARDEN_BIN, ["--config", path, "run"], {
    env: { ...process.env, JOBWARDEN_WORKER__HOSTNAME: opts.hostname ?? `ts-client-${process.pid}`, RUST_LOG: "warn" },
    stdio: ["ignore", "ignore", openSync(logPath, "w")],
  });
  const forget = killOnExit(child);
  return {
    log: () => (existsSync(logPath) ? readFileSync(logPath, "utf8") : ""),
    async stop() {
      await stopChild(child, "SIGTERM");
      forget();
      rmSync(dir, { recursive: true, force: true });
    },
  };
}
