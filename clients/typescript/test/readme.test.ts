// The README's two five-line examples run as written, against real servers: only the server
// addresses, the schema (the test's own) and a temp `orders` table are filled in.
import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { readFileSync, rmSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { connect } from "@nats-io/transport-node";
import { jetstreamManager } from "@nats-io/jetstream";
import { DATABASE_URL, connectDb, dropSchema, migrateSchema, startNats, type NatsServer } from "./harness.js";

const PKG = fileURLToPath(new URL("../../", import.meta.url));
const [natsExample, sqlExample] = [...readFileSync(join(PKG, "README.md"), "utf8").matchAll(/```js\n([\s\S]*?)```/g)].map((m) => m[1]!);

let server: NatsServer;
let schema: string;

before(async () => {
  server = await startNats();
  schema = await migrateSchema("jw_ts_readme");
});

after(async () => {
  await server?.stop();
  if (schema) await dropSchema(schema);
});

/** Runs `code` as an ES module inside the package (so it imports "@jobwarden/client" by name). */
function run(name: string, code: string): string {
  const path = join(PKG, "dist", `${name}.mjs`);
  writeFileSync(path, code);
  try {
    const r = spawnSync(process.execPath, [path], { encoding: "utf8", timeout: 30_000 });
    assert.equal(r.status, 0, `${name} failed:\n${code}\n${r.stderr}`);
    return r.stdout;
  } finally {
    rmSync(path, { force: true });
  }
}

const replaced = (text: string, from: string, to: string) => {
  assert.ok(text.includes(from), `the README example no longer has ${from}: update this test with it`);
  return text.replace(from, to);
};

test("the README's examples are five lines each", () => {
  assert.equal(natsExample?.trim().split("\n").length, 5, natsExample);
  assert.equal(sqlExample?.trim().split("\n").length, 5, sqlExample);
});

test("the README's NATS example publishes a job", async () => {
  const nc = await connect({ servers: server.url });
  await (await jetstreamManager(nc)).streams.add({ name: "JOBS", subjects: ["jobs.>"] });
  await nc.close();
  const code = replaced(natsExample!, "nats://127.0.0.1:4222", server.url) + "await nc.close();\n";
  assert.match(run("readme-nats", code), /^order-42-receipt 1 false$/m);
});

test("the README's SQL example enqueues a job in its transaction", async () => {
  let code = replaced(sqlExample!, "postgres://app@127.0.0.1:5432/app", DATABASE_URL);
  code = replaced(code, `await db.query("INSERT INTO orders`, `await db.query("CREATE TEMP TABLE orders (id int, amount int)"); await db.query("INSERT INTO orders`);
  code = replaced(code, `{ idempotency_key: "order-42" }`, `{ idempotency_key: "order-42", schema: ${JSON.stringify(schema)} }`);
  run("readme-sql", code + "console.log(id); await db.end();\n");
  const db = await connectDb();
  try {
    const r = await db.query(`SELECT queue, payload FROM "${schema}".jobs WHERE idempotency_key = 'order-42'`);
    assert.deepEqual(r.rows, [{ queue: "payments", payload: { order: 42 } }]);
  } finally {
    await db.end();
  }
});
