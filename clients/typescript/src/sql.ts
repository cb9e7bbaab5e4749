// Enqueueing through PostgreSQL: SQL `jobwarden.enqueue(...)` with named arguments, on the
// caller's connection, so the job commits or rolls back with the caller's transaction (the
// outbox). Any node-postgres Client or PoolClient works (or anything with the same query()).
import {
  InvalidJobError,
  JobwardenError,
  checkDependsOn,
  checkEnvelope,
  checkNode,
  checkPayload,
  checkQueue,
  shown,
} from "./contract.js";
import { SCHEMA_DEFS, type Envelope, type Payload } from "./envelope.generated.js";

/** What enqueue() needs of a connection: node-postgres' `query(text, values)`. */
export interface Queryable {
  query(text: string, values?: unknown[]): Promise<{ rows: Array<Record<string, unknown>> }>;
}

/** A job's fields as SQL enqueue() takes them. */
export interface JobSpecFields extends Omit<Envelope, "payload" | "depends_on" | "batch"> {
  /** Earliest start as a delay from the enqueue (the database's clock). Not with `run_at_ms`. */
  delay_ms?: number | null;
  /** Ids of jobs that must all complete first (at most 100; they must exist). */
  depends_on?: string[] | null;
}

export interface EnqueueOptions extends JobSpecFields {
  /** The schema jobwarden is installed in (`database.schema`, default "jobwarden"). */
  schema?: string;
}

/** One job of enqueueMany(). */
export interface BulkJob extends JobSpecFields {
  queue: string;
  payload: Payload;
}

/** Each option: the argument of enqueue() it becomes, and the SQL expression of its parameter. */
const ARGS: Record<string, [string, (p: string) => string]> = {
  priority: ["priority", (p) => `${p}::integer`],
  run_at_ms: ["run_at", (p) => `to_timestamp(${p}::float8 / 1000)`],
  delay_ms: ["run_at", (p) => `clock_timestamp() + ${p}::bigint * interval '1 millisecond'`],
  max_attempts: ["max_attempts", (p) => `${p}::integer`],
  idempotency_key: ["idempotency_key", (p) => `${p}::text`],
  id: ["id", (p) => `${p}::text`],
  timeout_ms: ["timeout_ms", (p) => `${p}::integer`],
  backoff: ["backoff", (p) => `${p}::jsonb`],
  depends_on: ["depends_on", (p) => `${p}::text[]`],
  then: ["then_jobs", (p) => `${p}::jsonb`],
  expires_at_ms: ["expires_at", (p) => `to_timestamp(${p}::float8 / 1000)`],
  expires_in: ["expires_in", (p) => `${p}::text`],
  key: ["key", (p) => `${p}::text`],
  debounce: ["debounce", (p) => `${p}::text`],
  debounce_max_wait: ["debounce_max_wait", (p) => `${p}::text`],
  throttle: ["throttle", (p) => `${p}::text`],
  unique_for: ["unique_for", (p) => `${p}::text`],
};
const JSONB = new Set(["backoff", "then"]);

/** The schema name, quoted; it must be a lowercase identifier, as `database.schema` is. */
export function quoteSchema(schema: string): string {
  if (typeof schema !== "string" || !/^[a-z_][a-z0-9_]{0,62}$/.test(schema)) {
    throw new JobwardenError(
      `jobwarden: schema ${shown(schema)} is not a schema name: give the workers' database.schema, a lowercase identifier (default "jobwarden")`,
    );
  }
  return `"${schema}"`;
}

/** Checks one job's fields for the SQL door; `at` prefixes the field paths (`jobs[3]`). */
function checkFields(fields: Record<string, unknown>, at: string, allowed: string[], what: string): Record<string, unknown> {
  const spec: Record<string, unknown> = {};
  const path = (f: string) => (at ? `${at}.${f}` : f);
  for (const [name, value] of Object.entries(fields)) {
    if (value === undefined || value === null) continue;
    if (name === "batch") {
      throw new InvalidJobError(path(name), value,
        "is for published messages; enqueue a batch whole with SQL enqueue_batch() (its callbacks run when every member has ended)");
    }
    if (!allowed.includes(name)) {
      throw new InvalidJobError(path(name), value, `is not ${what}; the fields are ${allowed.join(", ")}`);
    }
    spec[name] = value;
  }
  checkDependsOn(spec.depends_on, path("depends_on"));
  if (spec.delay_ms !== undefined) {
    checkNode(SCHEMA_DEFS.thenJob!.properties!.delay_ms!, spec.delay_ms, path("delay_ms"), "delay_ms");
    if (spec.run_at_ms !== undefined) {
      throw new InvalidJobError(path("delay_ms"), spec.delay_ms, "is given with run_at_ms; give one of them");
    }
  }
  const { depends_on: _d, delay_ms: _w, queue: _q, ...envelope } = spec;
  checkEnvelope(envelope as Record<string, unknown>, at, "sql");
  return spec;
}

/** The statement and parameters enqueue() runs (exported for tests). */
export function buildEnqueue(queue: string, payload: Payload, options: EnqueueOptions = {}): { text: string; values: unknown[] } {
  const { schema = "jobwarden", ...fields } = options;
  const qualified = quoteSchema(schema);
  checkQueue(queue);
  checkPayload(payload);
  const spec = checkFields({ payload, ...fields }, "", ["payload", ...Object.keys(ARGS)], "an option of enqueue()");
  const values: unknown[] = [queue, JSON.stringify(payload)];
  const args = ["$1::text", "$2::jsonb"];
  for (const [name, value] of Object.entries(spec)) {
    const arg = ARGS[name];
    if (!arg) continue; // payload
    values.push(JSONB.has(name) ? JSON.stringify(value) : value);
    args.push(`${arg[0]} => ${arg[1](`$${values.length}`)}`);
  }
  return { text: `SELECT ${qualified}.enqueue(${args.join(", ")}) AS id`, values };
}

/**
 * Enqueues one job through SQL `enqueue()` on `db`, inside whatever transaction `db` is in
 * (roll it back and the job is gone; commit and the workers publish it). Returns the job id.
 * A refusal by PostgreSQL (a missing parent, an idempotency key held with another payload)
 * is thrown as node-postgres raised it (SQLSTATE in `code`).
 */
export async function enqueue(db: Queryable, queue: string, payload: Payload, options: EnqueueOptions = {}): Promise<string> {
  const { text, values } = buildEnqueue(queue, payload, options);
  const result = await db.query(text, values);
  return result.rows[0]!.id as string;
}

/**
 * Enqueues many jobs in one call of SQL `enqueue_many()`, all or none, inside the caller's
 * transaction. Returns their ids in order.
 */
export async function enqueueMany(db: Queryable, jobs: BulkJob[], options: { schema?: string } = {}): Promise<string[]> {
  const qualified = quoteSchema(options.schema ?? "jobwarden");
  if (!Array.isArray(jobs)) throw new JobwardenError("jobwarden: enqueueMany() takes an array of jobs");
  if (jobs.length === 0) return [];
  const allowed = ["queue", "payload", ...Object.keys(ARGS)];
  jobs.forEach((job, i) => {
    checkQueue(job?.queue, `jobs[${i}].queue`);
    checkPayload(job.payload, `jobs[${i}].payload`);
    checkFields(job as unknown as Record<string, unknown>, `jobs[${i}]`, allowed, "a field of a job");
  });
  const result = await db.query(`SELECT n, id FROM ${qualified}.enqueue_many($1::jsonb) ORDER BY n`, [JSON.stringify(jobs)]);
  return result.rows.map((r) => r.id as string);
}
