// Publishing a job to NATS JetStream: the envelope the contract takes, on the subject of its
// queue and priority, with the job id as Nats-Msg-Id, confirmed by the stream's ack.
import { headers as natsHeaders, type NatsConnection } from "@nats-io/transport-node";
import { jetstream, type JetStreamClient } from "@nats-io/jetstream";
import {
  DEFAULT_MAX_PAYLOAD_BYTES,
  InvalidJobError,
  JobwardenError,
  checkEnvelope,
  checkNode,
  checkPayload,
  checkQueue,
  isTraceparent,
  newJobId,
  shown,
} from "./contract.js";
import { ENVELOPE_KEYS, SCHEMA_DEFS, type Envelope, type Payload } from "./envelope.generated.js";

/** The envelope's fields a producer may set (all but `payload`, and `depends_on`, which a message may not carry). */
export type JobFields = Omit<Envelope, "payload" | "depends_on">;

/** What `Producer.publish` takes besides the queue and the payload. */
export interface PublishOptions extends JobFields {
  /** Earliest start as a delay from now (this machine's clock): sets `run_at_ms`. Not with `run_at_ms`. */
  delay_ms?: number | null;
  /** W3C trace context (`00-<32 hex>-<16 hex>-<2 hex>`), handed to the job's handler. */
  traceparent?: string;
  /** More NATS headers (a queue's `key_from = "header:X-Customer"` reads one). */
  headers?: Record<string, string>;
}

export interface ProducerOptions {
  /** `nats.subject_prefix` of the workers: jobs of queue Q go to `<prefix>.Q` (default "jobs"). */
  subjectPrefix?: string;
  /** The workers' `worker.max_payload_bytes` (default 1048576): larger bodies are refused here. */
  maxPayloadBytes?: number;
  /** How long to wait for the stream's ack, in ms (default 5000). */
  ackTimeoutMs?: number;
}

/** A published job: its id, and where the stream stored it. */
export interface Published {
  id: string;
  subject: string;
  stream: string;
  seq: number;
  /** True when the stream already had a message with this id (within its duplicate window). */
  duplicate: boolean;
}

/** A message ready to publish. */
export interface Message {
  id: string;
  subject: string;
  body: string;
  headers: Record<string, string>;
}

const EXTRA = ["delay_ms", "traceparent", "headers"];
/** The envelope's fields, in the contract's order (ENVELOPE_KEYS). */
const FIELDS: string[] = ENVELOPE_KEYS.filter((f) => f !== "payload" && f !== "depends_on" && f in SCHEMA_DEFS.envelope!.properties!);

/** Checks a subject prefix as the workers' config does. */
export function checkSubjectPrefix(prefix: string): void {
  const bad = typeof prefix !== "string" || prefix === "" || /[\s*>]/u.test(prefix) ||
    prefix.startsWith(".") || prefix.endsWith(".") || prefix.includes("..");
  if (bad) {
    throw new JobwardenError(
      `jobwarden: subject prefix ${shown(prefix)} is not a subject prefix: give the workers' nats.subject_prefix ` +
        `(default "jobs"): not empty, no '*', '>' or whitespace, no empty token`,
    );
  }
}

/**
 * Builds the message for a job without sending it: checks the queue, the payload and every
 * option against the contract, and throws InvalidJobError naming the field otherwise.
 */
export function buildMessage(
  queue: string,
  payload: Payload,
  options: PublishOptions = {},
  config: { subjectPrefix?: string; maxPayloadBytes?: number; now?: number } = {},
): Message {
  const prefix = config.subjectPrefix ?? "jobs";
  checkSubjectPrefix(prefix);
  checkQueue(queue);
  checkPayload(payload);
  const opts = options as Record<string, unknown>;
  const fields: Record<string, unknown> = {};
  for (const [name, value] of Object.entries(opts)) {
    if (value === undefined || value === null || EXTRA.includes(name)) continue;
    if (name === "depends_on") {
      throw new InvalidJobError(name, value,
        "is not taken by a published message: a job that waits for others must be stored first; enqueue it through SQL (enqueue(db, queue, payload, { depends_on }))");
    }
    if (!FIELDS.includes(name)) {
      throw new InvalidJobError(name, value, `is not an option of publish(); the options are ${[...FIELDS, ...EXTRA].join(", ")}`);
    }
    fields[name] = value;
  }
  const delay = opts.delay_ms;
  if (delay !== undefined && delay !== null) {
    checkNode(SCHEMA_DEFS.thenJob!.properties!.delay_ms!, delay, "delay_ms", "delay_ms");
    if (fields.run_at_ms !== undefined) {
      throw new InvalidJobError("delay_ms", delay, "is given with run_at_ms; give one of them");
    }
    fields.run_at_ms = (config.now ?? Date.now()) + (delay as number);
  }
  const id = (fields.id as string | undefined) ?? newJobId(config.now);
  const envelope = { id, payload, ...fields };
  checkEnvelope(envelope);

  const priority = fields.priority as number | undefined;
  const subject = priority === undefined || priority === 5 ? `${prefix}.${queue}` : `${prefix}.${queue}.${priority}`;

  const headers: Record<string, string> = {};
  for (const [name, value] of Object.entries((opts.headers as Record<string, unknown> | undefined) ?? {})) {
    if (!/^[!-9;-~]+$/.test(name)) {
      throw new InvalidJobError(`headers.${name}`, value, "is not a header name: printable ASCII without ':' or spaces");
    }
    if (name.toLowerCase() === "nats-msg-id") {
      throw new InvalidJobError(`headers.${name}`, value, "is set by the client to the job id; give the option `id` instead");
    }
    if (typeof value !== "string" || /[\r\n]/.test(value)) {
      throw new InvalidJobError(`headers.${name}`, value, "must be a string without line breaks");
    }
    headers[name] = value;
  }
  const tp = opts.traceparent;
  if (tp !== undefined && tp !== null) {
    if (typeof tp !== "string" || !isTraceparent(tp)) {
      throw new InvalidJobError("traceparent", tp,
        "is not a W3C traceparent: 00-<32 lower-case hex>-<16 lower-case hex>-<2 hex>, ids not all zero (the worker would drop it)");
    }
    headers.traceparent = tp;
  }

  const body = JSON.stringify(envelope);
  const size = Buffer.byteLength(body, "utf8");
  const limit = config.maxPayloadBytes ?? DEFAULT_MAX_PAYLOAD_BYTES;
  if (size > limit) {
    throw new InvalidJobError("payload", undefined,
      `is invalid: the message body is ${size} bytes, over the limit of ${limit} bytes (worker.max_payload_bytes); store large data elsewhere and pass a reference`);
  }
  return { id, subject, body, headers };
}

/**
 * Publishes jobs to JetStream over a connection the caller owns (and closes).
 *
 *     const producer = new Producer(nc);
 *     const { id, seq } = await producer.publish("email", { to: "a@example.com" }, { max_attempts: 3 });
 */
export class Producer {
  readonly #nc: NatsConnection;
  readonly #js: JetStreamClient;
  readonly #config: Required<ProducerOptions>;

  constructor(nc: NatsConnection, options: ProducerOptions = {}) {
    this.#nc = nc;
    this.#js = jetstream(nc);
    this.#config = {
      subjectPrefix: options.subjectPrefix ?? "jobs",
      maxPayloadBytes: options.maxPayloadBytes ?? DEFAULT_MAX_PAYLOAD_BYTES,
      ackTimeoutMs: options.ackTimeoutMs ?? 5000,
    };
    checkSubjectPrefix(this.#config.subjectPrefix);
  }

  /**
   * Publishes one job and waits for the stream's ack. The job id (the option `id`, or a new
   * UUIDv7) is the envelope's `id` and the `Nats-Msg-Id`: publishing it again is safe (the
   * stream reports `duplicate`, the worker runs it once).
   */
  async publish(queue: string, payload: Payload, options: PublishOptions = {}): Promise<Published> {
    const msg = buildMessage(queue, payload, options, this.#config);
    const serverMax = this.#nc.info?.max_payload;
    const size = Buffer.byteLength(msg.body, "utf8");
    if (serverMax !== undefined && size > serverMax) {
      throw new InvalidJobError("payload", undefined,
        `is invalid: the message body is ${size} bytes, over the NATS server's max_payload of ${serverMax} bytes; store large data elsewhere and pass a reference`);
    }
    const h = natsHeaders();
    for (const [name, value] of Object.entries(msg.headers)) h.set(name, value);
    let ack;
    try {
      ack = await this.#js.publish(msg.subject, msg.body, { msgID: msg.id, headers: h, timeout: this.#config.ackTimeoutMs });
    } catch (err) {
      throw new JobwardenError(
        `jobwarden: publishing job ${msg.id} to ${msg.subject} got no ack from JetStream: ${(err as Error).message}; ` +
          `is a stream capturing ${this.#config.subjectPrefix}.> there (jobwarden workers create it at start-up)? ` +
          `Publishing again with the same id is safe`,
        { cause: err },
      );
    }
    return { id: msg.id, subject: msg.subject, stream: ack.stream, seq: ack.seq, duplicate: ack.duplicate };
  }
}
