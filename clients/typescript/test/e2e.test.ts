// End to end: a real `jobwarden run` worker (exec handler) runs to completion a job this
// client published through NATS and one it enqueued through SQL, and never one whose
// transaction rolled back.
import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import { connect, type NatsConnection } from "@nats-io/transport-node";
import { jetstreamManager } from "@nats-io/jetstream";
import type pg from "pg";
import { Producer, enqueue } from "../src/index.js";
import { connectDb, dropSchema, migrateSchema, startNats, startWorker, waitFor, type NatsServer, type Worker } from "./harness.js";

let server: NatsServer;
let schema: string;
let worker: Worker;
let nc: NatsConnection;
let db: pg.Client;

before(async () => {
  server = await startNats();
  schema = await migrateSchema("jw_ts_e2e");
  worker = startWorker({ schema, natsUrl: server.url, queues: ["ts-nats", "ts-sql"] });
  nc = await connect({ servers: server.url });
  db = await connectDb();
  const jsm = await jetstreamManager(nc);
  // The worker creates the stream and then its queues' consumers at start-up: once its
  // consumer is there, it is done provisioning.
  const provisioned = await waitFor(async () => {
    try {
      await jsm.consumers.info("JOBS", "jobwarden-ts-nats");
      return true;
    } catch {
      return false;
    }
  }, 30_000);
  assert.ok(provisioned, `the worker never created its consumer; its log:\n${worker.log()}`);
});

after(async () => {
  await worker?.stop();
  await nc?.close();
  await db?.end();
  await server?.stop();
  if (schema) await dropSchema(schema);
});

async function job(id: string) {
  const r = await db.query(`SELECT status, queue, result, last_error FROM "${schema}".jobs WHERE id = $1`, [id]);
  return r.rows[0] as { status: string; queue: string; result: { ran: string; payload: unknown } | null; last_error: string | null } | undefined;
}

test("a worker runs a job published through NATS and one enqueued through SQL to completion", async () => {
  const published = await new Producer(nc).publish("ts-nats", { via: "nats" }, { max_attempts: 2 });
  assert.equal(published.duplicate, false);

  await db.query("BEGIN");
  const sqlId = await enqueue(db, "ts-sql", { via: "sql" }, { schema });
  await db.query("COMMIT");

  await db.query("BEGIN");
  const rolledBack = await enqueue(db, "ts-sql", { via: "rolled back" }, { schema });
  await db.query("ROLLBACK");

  for (const [id, queue, via] of [[published.id, "ts-nats", "nats"], [sqlId, "ts-sql", "sql"]] as const) {
    const done = await waitFor(async () => (await job(id))?.status === "completed", 30_000);
    const j = await job(id);
    assert.ok(done, `job ${id} (${via}) did not complete: ${JSON.stringify(j)}; worker log:\n${worker.log()}`);
    assert.equal(j!.queue, queue);
    assert.deepEqual(j!.result, { ran: id, payload: { via } });
  }
  assert.equal(await job(rolledBack), undefined);
});
