// The client's side of the contract, without servers: the generated types match the schema,
// messages are built as docs/message-format.md says, and refusals name field, value and fix.
import { test } from "node:test";
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { mkdtempSync, readFileSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { InvalidJobError, JobwardenError, buildEnqueue, buildMessage, newJobId } from "../src/index.js";
import { REPO } from "./harness.js";

const PKG = fileURLToPath(new URL("../../", import.meta.url));
const generator = (...args: string[]) =>
  spawnSync(process.execPath, ["scripts/generate-types.mjs", "--check", ...args], { cwd: PKG, encoding: "utf8" });

test("the generated types are what docs/message.schema.json generates", () => {
  const run = generator();
  assert.equal(run.status, 0, `${run.stderr}${run.stdout}`);
});

test("a schema changed without regenerating fails the check", () => {
  const schema = JSON.parse(readFileSync(join(REPO, "docs", "message.schema.json"), "utf8"));
  schema.$defs.envelope.properties.priority.maximum = 8;
  const path = join(mkdtempSync(join(tmpdir(), "jobwarden-ts-schema-")), "schema.json");
  writeFileSync(path, JSON.stringify(schema));
  const run = generator("--schema", path);
  assert.equal(run.status, 1);
  assert.match(run.stderr, /npm run generate/);
});

test("a schema with a keyword the client does not check is refused by the generator", () => {
  const schema = JSON.parse(readFileSync(join(REPO, "docs", "message.schema.json"), "utf8"));
  schema.$defs.envelope.properties.priority.multipleOf = 2;
  const path = join(mkdtempSync(join(tmpdir(), "jobwarden-ts-schema-")), "schema.json");
  writeFileSync(path, JSON.stringify(schema));
  const run = generator("--schema", path);
  assert.notEqual(run.status, 0);
  assert.match(run.stderr, /multipleOf/);
});

test("a message goes to its queue's subject, priority 5 to the bare one, with the job id as its id", () => {
  const m = buildMessage("email", { to: "a@example.com" }, { id: "order-42", max_attempts: 3 });
  assert.equal(m.subject, "jobs.email");
  assert.equal(m.id, "order-42");
  assert.deepEqual(JSON.parse(m.body), { id: "order-42", payload: { to: "a@example.com" }, max_attempts: 3 });
  assert.equal(buildMessage("email", {}, { priority: 0 }).subject, "jobs.email.0");
  assert.equal(buildMessage("email", {}, { priority: 5 }).subject, "jobs.email");
  assert.equal(buildMessage("email", {}, {}, { subjectPrefix: "acme.jobs" }).subject, "acme.jobs.email");
});

test("a job without an id gets a UUIDv7, in the body and as Nats-Msg-Id", () => {
  const m = buildMessage("email", { a: 1 });
  assert.match(m.id, /^[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/);
  assert.equal(JSON.parse(m.body).id, m.id);
  assert.ok(newJobId(1_000) < newJobId(2_000), "ids are ordered by time");
});

test("delay_ms becomes run_at_ms, headers and traceparent travel as headers", () => {
  const tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
  const m = buildMessage("email", {}, { delay_ms: 30_000, traceparent: tp, headers: { "X-Customer": "c-42" } }, { now: 1_000 });
  assert.equal(JSON.parse(m.body).run_at_ms, 31_000);
  assert.deepEqual(m.headers, { "X-Customer": "c-42", traceparent: tp });
});

/** Asserts that `f` throws an InvalidJobError for `field` whose message matches `words`. */
function refused(f: () => unknown, field: string, words: RegExp) {
  assert.throws(f, (err: unknown) => {
    assert.ok(err instanceof InvalidJobError, `not an InvalidJobError: ${err}`);
    assert.equal(err.field, field, err.message);
    assert.match(err.message, words);
    assert.ok(err.message.startsWith(`jobwarden: field \`${field}\``), err.message);
    return true;
  });
}

test("values outside the schema's limits are refused, naming the field, the value and the range", () => {
  refused(() => buildMessage("email", {}, { priority: 12 }), "priority", /12 is not a whole number from 0 to 9/);
  refused(() => buildMessage("email", {}, { max_attempts: 0 }), "max_attempts", /0 is not a whole number from 1 to 1000/);
  refused(() => buildMessage("email", {}, { timeout_ms: 1.5 }), "timeout_ms", /must be a whole number, found a number \(1.5\)/);
  refused(() => buildMessage("email", {}, { id: "order 42" }), "id", /contains U\+0020; an id may not hold/);
  refused(() => buildMessage("email", {}, { id: "a/b" }), "id", /contains '\/'/);
  refused(() => buildMessage("email", {}, { id: "é".repeat(101) }), "id", /is 202 bytes long, the limit is 200/);
  refused(() => buildMessage("email", {}, { id: ".." }), "id", /cannot be an id/);
  refused(() => buildMessage("email", {}, { key: "" }), "key", /must not be empty/);
  refused(() => buildMessage("email", {}, { expires_in: "soon" }), "expires_in", /"soon" is not a duration; write numbers with units/);
  refused(() => buildMessage("e mail", {}), "queue", /"e mail" contains U\+0020; a queue name is 1 to 64 ASCII letters/);
  refused(() => buildMessage("email", { s: "a\u0000b" }), "payload.s", /NUL character/);
  refused(() => buildMessage("email", [] as never), "payload", /must be an object, found an array/);
  refused(() => buildMessage("email", {}, { batch: { id: "b", size: 0 } }), "batch.size", /0 is not a whole number from 1 to 100000000/);
  refused(() => buildMessage("email", {}, { batch: { id: "b", size: 2, extra: 1 } as never }), "batch.extra", /is not a field of a batch; the fields are id, on_complete, on_success, size/);
});

test("the rules the schema states in words are checked too", () => {
  refused(() => buildMessage("email", {}, { backoff: { kind: "exponential", base: "10s", max: "1s" } }), "backoff.max", /must not be below base/);
  refused(() => buildMessage("email", {}, { backoff: { kind: "linear", base: "0s" } }), "backoff.base", /above zero/);
  refused(() => buildMessage("email", {}, { backoff: { kind: "fixed", base: "3651d" } }), "backoff.base", /longer than 3650 days/);
  refused(() => buildMessage("email", {}, { expires_in: "1h", expires_at_ms: 1 }), "expires_in", /give one of them/);
  refused(() => buildMessage("email", {}, { debounce_max_wait: "5s" }), "debounce_max_wait", /without debounce/);
  refused(() => buildMessage("email", {}, { debounce: "5s", debounce_max_wait: "1s" }), "debounce_max_wait", /shorter than debounce/);
  refused(() => buildMessage("email", {}, { unique_for: "1h" }), "unique_for", /needs an idempotency_key/);
  refused(() => buildMessage("email", {}, { then: [{ queue: "pdf", payload: {}, throttle: "1m" }] }), "then[0].throttle", /needs a key/);
  // A message's own debounce may take its key from the queue's key_from: not refused here.
  buildMessage("email", {}, { debounce: "5s" });
  let deep: Record<string, unknown> = { queue: "q", payload: {} };
  for (let i = 0; i < 8; i++) deep = { queue: "q", payload: {}, then: [deep] };
  refused(() => buildMessage("email", {}, { then: [deep] as never }), "then[0].then[0].then[0].then[0].then[0].then[0].then[0].then[0].then", /nested more than 8 deep/);
  const wide = Array.from({ length: 60 }, () => ({ queue: "q", payload: {}, then: [{ queue: "q", payload: {} }] }));
  refused(() => buildMessage("email", {}, { then: wide.slice(0, 51) }), "then[50]", /at most 100 jobs in all/);
});

test("what a message cannot carry is refused with the way to do it", () => {
  refused(() => buildMessage("email", {}, { depends_on: ["a"] } as never), "depends_on", /enqueue it through SQL/);
  refused(() => buildMessage("email", {}, { prio: 1 } as never), "prio", /is not an option of publish\(\); the options are id, priority/);
  refused(() => buildMessage("email", {}, { traceparent: "00-xyz" }), "traceparent", /not a W3C traceparent/);
  refused(() => buildMessage("email", {}, { headers: { "Nats-Msg-Id": "x" } }), "headers.Nats-Msg-Id", /give the option `id`/);
  refused(() => buildMessage("email", { big: "x".repeat(100) }, {}, { maxPayloadBytes: 64 }), "payload", /over the limit of 64 bytes \(worker.max_payload_bytes\)/);
  assert.throws(() => buildMessage("email", {}, {}, { subjectPrefix: "jobs.>" }), JobwardenError);
});

test("SQL enqueue() is called with named arguments, in the given schema", () => {
  const q = buildEnqueue("payments", { order: 42 }, {
    schema: "billing_jobs",
    idempotency_key: "order-42",
    priority: 2,
    delay_ms: 1000,
    then: [{ queue: "email", payload: {} }],
    depends_on: ["charge-42"],
  });
  assert.equal(
    q.text,
    `SELECT "billing_jobs".enqueue($1::text, $2::jsonb, idempotency_key => $3::text, priority => $4::integer, ` +
      `run_at => clock_timestamp() + $5::bigint * interval '1 millisecond', then_jobs => $6::jsonb, depends_on => $7::text[]) AS id`,
  );
  assert.deepEqual(q.values, ["payments", '{"order":42}', "order-42", 2, 1000, '[{"queue":"email","payload":{}}]', ["charge-42"]]);
  refused(() => buildEnqueue("payments", {}, { batch: { id: "b", size: 1 } } as never), "batch", /enqueue_batch/);
  refused(() => buildEnqueue("payments", {}, { depends_on: ["a b"] }), "depends_on[0]", /contains U\+0020/);
  assert.throws(() => buildEnqueue("payments", {}, { schema: "Robert'); DROP" }), /not a schema name/);
});
