// Producer.publish against a throwaway nats-server with a work-queue stream like the one
// jobwarden workers create: each message is read back from the stream (subject, headers,
// body), a second publish of one id is reported duplicate, and no stream is a clear error.
import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import { connect, nanos, type NatsConnection } from "@nats-io/transport-node";
import { RetentionPolicy, jetstreamManager, type JetStreamManager } from "@nats-io/jetstream";
import { InvalidJobError, JobwardenError, Producer } from "../src/index.js";
import { startNats, type NatsServer } from "./harness.js";

let server: NatsServer;
let nc: NatsConnection;
let jsm: JetStreamManager;

before(async () => {
  server = await startNats();
  nc = await connect({ servers: server.url });
  jsm = await jetstreamManager(nc);
  await jsm.streams.add({ name: "JOBS", subjects: ["jobs.>"], retention: RetentionPolicy.Workqueue, duplicate_window: nanos(120_000) });
  await jsm.streams.add({ name: "ACME", subjects: ["acme.jobs.>"], retention: RetentionPolicy.Workqueue });
});

after(async () => {
  await nc?.close();
  await server?.stop();
});

async function stored(stream: string, seq: number) {
  const m = await jsm.streams.getMessage(stream, { seq });
  assert.ok(m, `no message ${seq} in ${stream}`);
  return m;
}

test("a published job lands on its queue's subject with its id as Nats-Msg-Id and the envelope as body", async () => {
  const producer = new Producer(nc);
  const tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
  const got = await producer.publish("email", { to: "a@example.com" }, {
    id: "order-42-receipt",
    max_attempts: 3,
    key: "customer-7",
    traceparent: tp,
    headers: { "X-Customer": "c-7" },
  });
  assert.equal(got.id, "order-42-receipt");
  assert.equal(got.stream, "JOBS");
  assert.equal(got.subject, "jobs.email");
  assert.equal(got.duplicate, false);
  const m = await stored("JOBS", got.seq);
  assert.equal(m.subject, "jobs.email");
  assert.equal(m.header.get("Nats-Msg-Id"), "order-42-receipt");
  assert.equal(m.header.get("traceparent"), tp);
  assert.equal(m.header.get("X-Customer"), "c-7");
  assert.deepEqual(m.json(), { id: "order-42-receipt", payload: { to: "a@example.com" }, max_attempts: 3, key: "customer-7" });
});

test("a job without an id gets one, used as Nats-Msg-Id", async () => {
  const got = await new Producer(nc).publish("email", { to: "b@example.com" });
  const m = await stored("JOBS", got.seq);
  assert.equal(m.header.get("Nats-Msg-Id"), got.id);
  assert.deepEqual(m.json(), { id: got.id, payload: { to: "b@example.com" } });
});

test("the same id published again is reported duplicate, with the first message's sequence", async () => {
  const producer = new Producer(nc);
  const first = await producer.publish("email", { n: 1 }, { id: "dup-1" });
  const again = await producer.publish("email", { n: 1 }, { id: "dup-1" });
  assert.equal(first.duplicate, false);
  assert.equal(again.duplicate, true);
  assert.equal(again.seq, first.seq);
  assert.equal(again.id, "dup-1");
});

test("a priority picks the subject's band; the prefix is the workers' subject_prefix", async () => {
  const urgent = await new Producer(nc).publish("email", {}, { priority: 0 });
  assert.equal((await stored("JOBS", urgent.seq)).subject, "jobs.email.0");
  assert.equal((await stored("JOBS", urgent.seq)).json<{ priority: number }>().priority, 0);
  const acme = await new Producer(nc, { subjectPrefix: "acme.jobs" }).publish("email", {});
  assert.equal(acme.stream, "ACME");
  assert.equal((await stored("ACME", acme.seq)).subject, "acme.jobs.email");
});

test("a refused job is never sent", async () => {
  const before = (await jsm.streams.info("JOBS")).state.messages;
  await assert.rejects(new Producer(nc).publish("email", {}, { max_attempts: 1001 }), InvalidJobError);
  await assert.rejects(new Producer(nc, { maxPayloadBytes: 1000 }).publish("email", { s: "x".repeat(2000) }), /over the limit of 1000 bytes/);
  assert.equal((await jsm.streams.info("JOBS")).state.messages, before);
});

test("no stream for the subject is an error saying so", async () => {
  await assert.rejects(new Producer(nc, { subjectPrefix: "nostream", ackTimeoutMs: 1000 }).publish("email", {}), (err: unknown) => {
    assert.ok(err instanceof JobwardenError);
    assert.match(err.message, /got no ack from JetStream: .*is a stream capturing nostream\.> there/);
    return true;
  });
});
