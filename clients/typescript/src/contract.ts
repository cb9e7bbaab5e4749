// The job contract, client side: a value is checked against the schema's own definitions
// (SCHEMA_DEFS, generated from docs/message.schema.json) and the rules the schema states in
// words but cannot express (its description's list): limits in UTF-8 bytes, the size of a
// `then` tree, backoff and window rules. A job refused here would be refused by jobwarden
// too (a published one kept as a dead job), so the caller hears it at once, with the field,
// the value and the fix.
import { SCHEMA_DEFS, type SchemaNode } from "./envelope.generated.js";

/** Anything this client refuses or cannot do. */
export class JobwardenError extends Error {
  override name = "JobwardenError";
}

/** A job field the contract refuses: `field` is a path (`then[2].priority`). */
export class InvalidJobError extends JobwardenError {
  override name = "InvalidJobError";
  constructor(
    readonly field: string,
    readonly value: unknown,
    reason: string,
  ) {
    super(`jobwarden: field \`${field}\` ${reason}`);
  }
}

/** The longest delay, window or backoff: 3650 days. */
const MAX_DURATION_MS = 3650 * 86_400_000;
/** A `then` tree: at most this many jobs in all, nested at most this deep. */
export const MAX_THEN_JOBS = 100;
export const MAX_THEN_DEPTH = 8;
/** Parents a job may wait for (SQL only). */
export const MAX_DEPENDS_ON = 100;
/** The workers' default worker.max_payload_bytes. */
export const DEFAULT_MAX_PAYLOAD_BYTES = 1_048_576;

/** What a string that breaks a definition's pattern should look like, by definition name. */
const HINTS: Record<string, string> = {
  id: "an id may not hold control characters, whitespace, invisible characters, / ? or #",
  jobKey: "a key may not hold control characters, whitespace, invisible characters, / ? or # (keys appear in URLs, command lines and logs)",
  key: "an idempotency key may not hold control or invisible characters",
  storable: "PostgreSQL jsonb cannot store the NUL character \\u0000; encode binary data as base64",
  queue: 'a queue name is 1 to 64 ASCII letters, digits, "_" or "-", e.g. "email"',
};

/** Shows a value in an error: JSON, cut at 80 characters. */
export function shown(value: unknown): string {
  let text: string;
  try {
    text = typeof value === "bigint" ? String(value) : (JSON.stringify(value) ?? String(value));
  } catch {
    text = String(value);
  }
  return text.length > 80 ? `${text.slice(0, 77)}...` : text;
}

function kind(value: unknown): string {
  if (value === null) return "null";
  if (Array.isArray(value)) return "an array";
  switch (typeof value) {
    case "string": return "a string";
    case "number": return Number.isInteger(value) ? "a whole number" : "a number";
    case "boolean": return "a boolean";
    case "object": return "an object";
    default: return `a ${typeof value}`;
  }
}

function isType(value: unknown, type: string): boolean {
  switch (type) {
    case "null": return value === null;
    case "string": return typeof value === "string";
    case "integer": return typeof value === "number" && Number.isSafeInteger(value);
    case "number": return typeof value === "number" && Number.isFinite(value);
    case "boolean": return typeof value === "boolean";
    case "array": return Array.isArray(value);
    case "object": return typeof value === "object" && value !== null && !Array.isArray(value);
    default: return false;
  }
}

const OBJECT_WORDS: Record<string, string> = {
  envelope: "a job", thenJob: "a then job", backoff: "a backoff", batch: "a batch",
};

const TYPE_WORDS: Record<string, string> = {
  string: "a string", integer: "a whole number", number: "a number", boolean: "a boolean",
  array: "an array", object: "an object", null: "null",
};

const join = (at: string, field: string) => (at ? `${at}.${field}` : field);
const bytes = (s: string) => Buffer.byteLength(s, "utf8");
const patterns = new Map<string, RegExp>();
const regex = (p: string) => {
  let re = patterns.get(p);
  if (!re) patterns.set(p, (re = new RegExp(p, "u")));
  return re;
};
const codePoint = (c: string) => `U+${c.codePointAt(0)!.toString(16).toUpperCase().padStart(4, "0")}`;

/** Why `s` breaks `pattern`, for the definition (or field) `what`. */
function patternReason(s: string, pattern: string, what: string): string {
  if (what === "duration") return `is invalid: ${shown(s)} is not a duration; write numbers with units, e.g. "1s", "250ms" or "1h 30m"`;
  const hint = HINTS[what];
  // The id-like patterns are one character class: name the first character it refuses.
  const bad = [...s].find((c) => !regex(pattern).test(c));
  if (bad !== undefined && hint) {
    const name = /[\p{L}\p{N}\p{P}\p{S}]/u.test(bad) ? `'${bad}'` : codePoint(bad);
    return `is invalid: ${shown(s)} contains ${name}; ${hint}`;
  }
  return `is invalid: ${shown(s)} does not match ${pattern}${hint ? `; ${hint}` : ""}`;
}

/**
 * Checks `value` at `path` against a schema node (a definition of SCHEMA_DEFS or a part of
 * one); `what` names the definition or field, for the hint of an error.
 */
export function checkNode(node: SchemaNode, value: unknown, path: string, what: string): void {
  if (node.not && Object.keys(node.not).length === 0 && value !== undefined) {
    throw new InvalidJobError(path, value, "is not taken here");
  }
  if (value === undefined) return;
  if (node.$ref) {
    const name = node.$ref.replace("#/$defs/", "");
    const def = SCHEMA_DEFS[name];
    if (!def) throw new JobwardenError(`the schema has no definition ${name}`);
    checkNode(def, value, path, name);
  }
  const types = node.type === undefined ? undefined : [node.type].flat();
  if (value === null && (types === undefined || types.includes("null"))) return; // null means absent
  if (types && !types.some((t) => isType(value, t))) {
    const want = types.filter((t) => t !== "null").map((t) => TYPE_WORDS[t] ?? t).join(" or ");
    throw new InvalidJobError(path, value, `must be ${want}, found ${kind(value)} (${shown(value)})`);
  }
  if (node.enum && !node.enum.includes(value)) {
    throw new InvalidJobError(path, value, `is invalid: ${shown(value)} is not one of ${node.enum.map(shown).join(", ")}`);
  }
  if (node.not?.enum?.includes(value)) {
    throw new InvalidJobError(path, value, `is invalid: ${shown(value)} cannot be an id or key (URL paths collapse it); add a letter or digit`);
  }
  if (typeof value === "number") {
    const lo = node.minimum ?? -Infinity;
    const hi = node.maximum ?? Infinity;
    if (value < lo || value > hi) {
      const whole = types?.includes("integer") ? "a whole number" : "a number";
      throw new InvalidJobError(path, value, `is invalid: ${value} is not ${whole} from ${lo} to ${hi}`);
    }
  }
  if (typeof value === "string") {
    // The schema's lengths are the contract's byte limits (its rule 1).
    const n = bytes(value);
    if (node.minLength !== undefined && n < node.minLength) {
      throw new InvalidJobError(path, value, `is invalid: must not be empty${node.maxLength ? ` (1 to ${node.maxLength} bytes)` : ""}`);
    }
    if (node.maxLength !== undefined && n > node.maxLength) {
      throw new InvalidJobError(path, value, `is invalid: is ${n} bytes long, the limit is ${node.maxLength}`);
    }
    if (node.pattern !== undefined && !regex(node.pattern).test(value)) {
      throw new InvalidJobError(path, value, patternReason(value, node.pattern, what));
    }
  }
  if (Array.isArray(value)) {
    if (node.maxItems !== undefined && value.length > node.maxItems) {
      throw new InvalidJobError(path, value, `is invalid: has ${value.length} items, the limit is ${node.maxItems}`);
    }
    if (node.items) value.forEach((item, i) => checkNode(node.items!, item, `${path}[${i}]`, what));
  }
  if (isType(value, "object")) checkObject(node, value as Record<string, unknown>, path, what);
}

function checkObject(node: SchemaNode, obj: Record<string, unknown>, path: string, what: string): void {
  for (const field of node.required ?? []) {
    if (obj[field] === undefined || obj[field] === null) {
      throw new InvalidJobError(join(path, field), undefined, "is required");
    }
  }
  const props = node.properties ?? {};
  for (const [field, value] of Object.entries(obj)) {
    const at = join(path, field);
    if (node.propertyNames?.pattern && !regex(node.propertyNames.pattern).test(field)) {
      throw new InvalidJobError(at, field, `is invalid: the key ${patternReason(field, node.propertyNames.pattern, what)}`);
    }
    const sub = props[field];
    if (sub) {
      checkNode(sub, value, at, what === "storable" ? what : field);
    } else if (node.additionalProperties === false) {
      throw new InvalidJobError(at, value, `is not a field of ${OBJECT_WORDS[what] ?? what}; the fields are ${Object.keys(props).join(", ")}`);
    } else if (typeof node.additionalProperties === "object") {
      checkNode(node.additionalProperties, value, at, what);
    }
  }
}

const UNITS: Array<[string, bigint]> = (() => {
  const s = 1_000_000_000n;
  const table: Array<[string[], bigint]> = [
    [["nanos", "nsec", "ns"], 1n],
    [["usec", "us", "µs"], 1_000n],
    [["millis", "msec", "ms"], 1_000_000n],
    [["seconds", "second", "secs", "sec", "s"], s],
    [["minutes", "minute", "mins", "min", "m"], 60n * s],
    [["hours", "hour", "hrs", "hr", "h"], 3600n * s],
    [["days", "day", "d"], 86_400n * s],
    [["weeks", "week", "wks", "wk", "w"], 604_800n * s],
    [["months", "month", "M"], 2_630_016n * s],
    [["years", "year", "yrs", "yr", "y"], 31_557_600n * s],
  ];
  return table.flatMap(([names, ns]) => names.map((n): [string, bigint] => [n, ns]));
})();

/** A duration text (already matched by the schema's pattern) in nanoseconds. */
export function durationNs(text: string): bigint {
  let total = 0n;
  for (const m of text.matchAll(/([0-9]+)(?:\.([0-9]+))?[ \t]*([^0-9 \t.]+)/gu)) {
    const per = UNITS.find(([name]) => name === m[3])?.[1];
    if (per === undefined) throw new JobwardenError(`unknown duration unit ${m[3]}`);
    const frac = m[2] ?? "";
    total += BigInt(m[1]!) * per + (frac ? (BigInt(frac) * per) / 10n ** BigInt(frac.length) : 0n);
  }
  return total;
}

/** Checks a duration field's length: at least 1ms where `atLeastMs`, at most 3650 days. */
function checkDuration(obj: Record<string, unknown>, field: string, at: string, atLeastMs: boolean): bigint | undefined {
  const text = obj[field];
  if (typeof text !== "string") return undefined;
  const ns = durationNs(text);
  const path = join(at, field);
  if (atLeastMs && ns < 1_000_000n) {
    throw new InvalidJobError(path, text, `is invalid: ${shown(text)} is under a millisecond; give at least "1ms" (or leave the field out)`);
  }
  if (ns > BigInt(MAX_DURATION_MS) * 1_000_000n) {
    throw new InvalidJobError(path, text, `is invalid: ${shown(text)} is longer than 3650 days, the longest allowed`);
  }
  return ns;
}

/** Where a spec comes in: a published message, SQL enqueue(), or a `then` spec inside either. */
export type Door = "message" | "sql" | "then";

/**
 * The rules the schema states in words (its description's list), for one spec (an
 * envelope, a SQL enqueue's fields, a then job) already checked against the schema.
 */
export function checkRules(spec: Record<string, unknown>, at: string, door: Door): void {
  const present = (f: string) => spec[f] !== undefined && spec[f] !== null;
  // (4) a backoff's max is not below its base; its base is above zero unless it is fixed.
  const backoff = spec.backoff as Record<string, unknown> | null | undefined;
  if (backoff) {
    const bat = join(at, "backoff");
    const base = checkDuration(backoff, "base", bat, false) ?? 0n;
    const max = checkDuration(backoff, "max", bat, false) ?? 3_600_000_000_000n;
    if (base === 0n && backoff.kind !== "fixed") {
      throw new InvalidJobError(join(bat, "base"), backoff.base, "is invalid: must be above zero for a linear or exponential backoff");
    }
    if (max < base) {
      throw new InvalidJobError(join(bat, "max"), backoff.max ?? null, "is invalid: must not be below base (a backoff without max has a max of 1h)");
    }
  }
  // (6) expires_at_ms or expires_in, never both; expires_in at least 1ms.
  if (present("expires_at_ms") && present("expires_in")) {
    throw new InvalidJobError(join(at, "expires_in"), spec.expires_in, "is given with expires_at_ms; give one of them");
  }
  checkDuration(spec, "expires_in", at, true);
  // (7) the windows and the rules between them.
  const debounce = checkDuration(spec, "debounce", at, true);
  const maxWait = checkDuration(spec, "debounce_max_wait", at, true);
  const throttle = checkDuration(spec, "throttle", at, true);
  checkDuration(spec, "unique_for", at, true);
  if (maxWait !== undefined && debounce === undefined) {
    throw new InvalidJobError(join(at, "debounce_max_wait"), spec.debounce_max_wait,
      'is given without debounce; it bounds how long a debounce may hold a job back: add "debounce" (e.g. "5s") or leave debounce_max_wait out');
  }
  if (maxWait !== undefined && debounce !== undefined && maxWait < debounce) {
    throw new InvalidJobError(join(at, "debounce_max_wait"), spec.debounce_max_wait,
      `is invalid: ${shown(spec.debounce_max_wait)} is shorter than debounce ${shown(spec.debounce)}; a debounced job runs at the latest max_wait after the first one came, so max_wait is at least the debounce`);
  }
  if (debounce !== undefined && throttle !== undefined) {
    throw new InvalidJobError(join(at, "throttle"), spec.throttle,
      "is given with debounce; a key's jobs are debounced (the last one runs) or throttled (the first one runs), not both: keep one");
  }
  // A message's key may come from its queue's key_from, which only the worker knows.
  if (door !== "message" && !present("key") && (debounce !== undefined || throttle !== undefined)) {
    const field = debounce !== undefined ? "debounce" : "throttle";
    throw new InvalidJobError(join(at, field), spec[field], 'needs a key: it applies to the jobs of one key; add "key" (e.g. "customer-42")');
  }
  if (present("unique_for") && !present("idempotency_key")) {
    throw new InvalidJobError(join(at, "unique_for"), spec.unique_for,
      'needs an idempotency_key: it is how long the job\'s idempotency key is held; add "idempotency_key" or leave unique_for out');
  }
  // (3) a `then` tree: at most 100 jobs in all, 8 deep (counted from the top spec only).
  if (door !== "then" && Array.isArray(spec.then)) checkThenTree(spec.then, join(at, "then"));
}

function checkThenTree(top: unknown[], path: string): void {
  let count = 0;
  const walk = (jobs: unknown[], at: string, depth: number) => {
    if (depth > MAX_THEN_DEPTH) {
      throw new InvalidJobError(at, undefined, `is invalid: a then chain is nested more than ${MAX_THEN_DEPTH} deep; flatten it`);
    }
    jobs.forEach((job, i) => {
      const jat = `${at}[${i}]`;
      count += 1;
      if (count > MAX_THEN_JOBS) {
        throw new InvalidJobError(jat, job, `is invalid: a then tree holds at most ${MAX_THEN_JOBS} jobs in all`);
      }
      const spec = job as Record<string, unknown>;
      checkRules(spec, jat, "then");
      if (Array.isArray(spec.then)) walk(spec.then, join(jat, "then"), depth + 1);
    });
  };
  walk(top, path, 1);
}

/** Checks a queue name as the contract does (the queue pattern of a then job). */
export function checkQueue(queue: unknown, path = "queue"): asserts queue is string {
  checkNode(SCHEMA_DEFS.thenJob!.properties!.queue!, queue, path, "queue");
  if (queue === undefined || queue === null) throw new InvalidJobError(path, queue, "is required");
}

/** Checks a payload: a JSON object without NUL. */
export function checkPayload(payload: unknown, path = "payload"): void {
  if (payload === undefined || payload === null) throw new InvalidJobError(path, payload, "is required: give the job's data as an object");
  checkNode(SCHEMA_DEFS.envelope!.properties!.payload!, payload, path, "payload");
}

/** Checks a whole envelope: the schema's envelope definition, then the rules in words. */
export function checkEnvelope(envelope: Record<string, unknown>, at = "", door: Door = "message"): void {
  checkNode(SCHEMA_DEFS.envelope!, envelope, at, "envelope");
  checkRules(envelope, at, door);
}

/** Checks `depends_on` (SQL only): at most 100 parent ids, each an id. */
export function checkDependsOn(value: unknown, path = "depends_on"): void {
  if (value === undefined || value === null) return;
  if (!Array.isArray(value)) throw new InvalidJobError(path, value, `must be an array of job ids, found ${kind(value)}`);
  if (value.length > MAX_DEPENDS_ON) throw new InvalidJobError(path, value, `is invalid: names ${value.length} parents, the limit is ${MAX_DEPENDS_ON}`);
  value.forEach((id, i) => {
    checkNode({ $ref: "#/$defs/id" }, id, `${path}[${i}]`, "id");
    if (typeof id !== "string") throw new InvalidJobError(`${path}[${i}]`, id, "must be a job id (a string)");
  });
}

/** A W3C traceparent (`00-<32 hex>-<16 hex>-<2 hex>`, lower case, ids not all zero). */
export function isTraceparent(value: string): boolean {
  const m = /^([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})$/.exec(value);
  return !!m && m[1] !== "ff" && /[^0]/.test(m[2]!) && /[^0]/.test(m[3]!);
}

/** A new job id: a UUID version 7 (time-ordered, as the Rust client makes them). */
export function newJobId(now = Date.now()): string {
  const b = crypto.getRandomValues(new Uint8Array(16));
  let ms = BigInt(now);
  for (let i = 5; i >= 0; i--) {
    b[i] = Number(ms & 0xffn);
    ms >>= 8n;
  }
  b[6] = (b[6]! & 0x0f) | 0x70;
  b[8] = (b[8]! & 0x3f) | 0x80;
  const hex = [...b].map((x) => x.toString(16).padStart(2, "0")).join("");
  return `${hex.slice(0, 8)}-${hex.slice(8, 12)}-${hex.slice(12, 16)}-${hex.slice(16, 20)}-${hex.slice(20)}`;
}
