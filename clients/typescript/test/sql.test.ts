// enqueue() and enqueueMany() against PostgreSQL, in a jobwarden schema of this run's own:
// the job is the caller's transaction's (committed with it, gone with a rollback), its
// options reach enqueue()'s named arguments, and PostgreSQL's refusals come through as raised.
import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import type pg from "pg";
import { InvalidJobError, enqueue, enqueueMany } from "../src/index.js";
import { connectDb, dropSchema, migrateSchema } from "./harness.js";

let schema: string;
let db: pg.Client;
let other: pg.Client;

before(async () => {
  schema = await migrateSchema();
  db = await connectDb();
  other = await connectDb();
});

after(async () => {
  await db?.end();
  await other?.end();
  if (schema) await dropSchema(schema);
});

const row = async (id: string) =>
  (await other.query(`SELECT * FROM "${schema}".jobs WHERE id = $1`, [id])).rows[0] as Record<string, unknown> | undefined;

test("a job enqueued in a transaction exists once it commits, with its options", async () => {
  await db.query("BEGIN");
  await db.query("CREATE TEMP TABLE orders (id int) ON COMMIT DROP");
  await db.query("INSERT INTO orders VALUES (42)");
  const id = await enqueue(db, "payments", { order: 42 }, {
    schema,
    idempotency_key: "order-42",
    priority: 2,
    max_attempts: 3,
    timeout_ms: 60_000,
    key: "customer-7",
    delay_ms: 60_000,
    expires_in: "1h",
    backoff: { kind: "fixed", base: "2s" },
    then: [{ queue: "email", payload: { order: 42 } }],
  });
  assert.equal(await row(id), undefined, "visible before the commit");
  await db.query("COMMIT");
  const r = (await row(id))!;
  assert.ok(r, "the committed job is there");
  assert.equal(r.queue, "payments");
  assert.deepEqual(r.payload, { order: 42 });
  assert.equal(r.status, "scheduled");
  assert.equal(r.priority, 2);
  assert.equal(r.max_attempts, 3);
  assert.equal(r.timeout_ms, 60_000);
  assert.equal(r.key, "customer-7");
  assert.equal(r.idempotency_key, "order-42");
  assert.deepEqual(r.then_jobs, [{ queue: "email", payload: { order: 42 } }]);
  const wait = (r.scheduled_at as Date).getTime() - Date.now();
  assert.ok(wait > 50_000 && wait <= 60_000, `due in ${wait} ms, not about 60 s`);
  const expiry = (r.expires_at as Date).getTime() - Date.now();
  assert.ok(expiry > 3_500_000 && expiry <= 3_600_000, `expires in ${expiry} ms, not about 1 h`);
  // The same idempotency key and payload is the same job.
  assert.equal(await enqueue(db, "payments", { order: 42 }, { schema, idempotency_key: "order-42" }), id);
});

test("a job enqueued in a transaction that rolls back never exists", async () => {
  await db.query("BEGIN");
  const id = await enqueue(db, "payments", { order: 43 }, { schema, id: "order-43-charge", run_at_ms: Date.now() });
  assert.equal(id, "order-43-charge");
  await db.query("ROLLBACK");
  assert.equal(await row(id), undefined);
});

test("PostgreSQL's refusal is raised as it is, and the caller's transaction holds nothing of it", async () => {
  await db.query("BEGIN");
  await assert.rejects(
    enqueue(db, "audit", { order: 44 }, { schema, depends_on: ["no-such-parent"] }),
    (err: Error & { code?: string }) => {
      assert.match(err.message, /depends_on names job 'no-such-parent', which does not exist; enqueue the parents first/);
      assert.ok(err.code, "the SQLSTATE is kept");
      return true;
    },
  );
  await db.query("ROLLBACK");
  await enqueue(db, "payments", { a: 1 }, { schema, idempotency_key: "k-45" });
  await assert.rejects(
    enqueue(db, "payments", { a: 2 }, { schema, idempotency_key: "k-45" }),
    /idempotency key 'k-45' of queue payments already belongs to job .* with another payload/,
  );
});

test("a bad field is refused before anything is sent, naming it", async () => {
  await assert.rejects(enqueue(db, "payments", {}, { schema, priority: 12 }), (err: unknown) => {
    assert.ok(err instanceof InvalidJobError);
    assert.equal(err.field, "priority");
    assert.match(err.message, /12 is not a whole number from 0 to 9/);
    return true;
  });
});

test("enqueueMany enqueues all or none, in the caller's transaction, and returns the ids in order", async () => {
  await db.query("BEGIN");
  const ids = await enqueueMany(db, [
    { queue: "email", payload: { to: "a@example.com" }, id: "nl-7-a" },
    { queue: "email", payload: { to: "b@example.com" }, delay_ms: 60_000 },
  ], { schema });
  assert.equal(ids.length, 2);
  assert.equal(ids[0], "nl-7-a");
  await db.query("ROLLBACK");
  assert.equal(await row("nl-7-a"), undefined);

  const kept = await enqueueMany(db, [{ queue: "email", payload: {}, id: "nl-8-a" }, { queue: "sms", payload: {}, id: "nl-8-b" }], { schema });
  assert.deepEqual(kept, ["nl-8-a", "nl-8-b"]);
  assert.equal((await row("nl-8-b"))!.queue, "sms");

  await assert.rejects(enqueueMany(db, [{ queue: "email", payload: {} }, { queue: "email", payload: {}, priority: 10 }], { schema }), (err: unknown) => {
    assert.ok(err instanceof InvalidJobError);
    assert.equal(err.field, "jobs[1].priority");
    return true;
  });
  // Two members with one id: PostgreSQL's own refusal.
  await assert.rejects(
    enqueueMany(db, [{ queue: "email", payload: {}, id: "dup" }, { queue: "email", payload: {}, id: "dup" }], { schema }),
    /jobs\[2\]\.id/,
  );
});
