#!/usr/bin/env node
// Generates src/envelope.generated.ts from docs/message.schema.json (the job contract's
// JSON Schema): a TypeScript type per definition, and SCHEMA_DEFS, the definitions without
// their prose, which src/contract.ts checks values against (so the client refuses exactly
// what the schema states, with the limits it states).
//
//   node scripts/generate-types.mjs           write the file
//   node scripts/generate-types.mjs --check   exit 1 if the committed file differs (a test runs this)
//   ... --schema PATH                          read another schema (the test's drift check)
//
// The generator knows the keywords the schema uses today and refuses any other, so a schema
// that grows a new kind of rule fails here (and in the drift test) instead of being ignored.
import { readFileSync, writeFileSync } from "node:fs";
import { dirname, join, relative } from "node:path";
import { fileURLToPath } from "node:url";

const here = dirname(fileURLToPath(import.meta.url));
const root = join(here, "..");
const option = (name) => {
  const i = process.argv.indexOf(name);
  return i > 0 ? process.argv[i + 1] : undefined;
};
const SCHEMA = option("--schema") ?? join(root, "..", "..", "docs", "message.schema.json");
const OUT = join(root, "src", "envelope.generated.ts");

/** Keywords src/contract.ts understands (and the prose ones it skips). */
const KNOWN = new Set([
  "$defs", "$schema", "$ref", "additionalProperties", "description", "enum", "items",
  "maxItems", "maxLength", "maximum", "minLength", "minimum", "not", "oneOf", "pattern",
  "properties", "propertyNames", "required", "title", "type",
]);
const PROSE = new Set(["description", "title", "$schema"]);

const pascal = (s) => s.charAt(0).toUpperCase() + s.slice(1).replace(/_([a-z])/g, (_, c) => c.toUpperCase());
const refName = (ref) => {
  const m = /^#\/\$defs\/(\w+)$/.exec(ref);
  if (!m) throw new Error(`unsupported $ref ${JSON.stringify(ref)}: only #/$defs/<name> is generated`);
  return pascal(m[1]);
};
const doc = (node, indent) =>
  node.description ? `${indent}/** ${node.description.replaceAll("*/", "*\\/")} */\n` : "";

function checkKeywords(node, at) {
  if (node === null || typeof node !== "object" || Array.isArray(node)) return;
  for (const [k, v] of Object.entries(node)) {
    if (!KNOWN.has(k)) {
      throw new Error(
        `${at}: the schema uses the keyword "${k}", which the client does not check yet; ` +
          `teach src/contract.ts (and clients/python) the rule, then add "${k}" to KNOWN`,
      );
    }
    if (k === "properties" || k === "$defs") {
      for (const [p, sub] of Object.entries(v)) checkKeywords(sub, `${at}.${p}`);
    } else if (k !== "enum" && k !== "required" && typeof v === "object") {
      if (Array.isArray(v)) v.forEach((sub, i) => checkKeywords(sub, `${at}.${k}[${i}]`));
      else checkKeywords(v, `${at}.${k}`);
    }
  }
}

/** The node without its prose, for SCHEMA_DEFS. */
function bare(node) {
  if (Array.isArray(node)) return node.map(bare);
  if (node === null || typeof node !== "object") return node;
  const out = {};
  for (const [k, v] of Object.entries(node)) {
    if (PROSE.has(k)) continue;
    out[k] = k === "properties" ? Object.fromEntries(Object.entries(v).map(([p, s]) => [p, bare(s)])) : bare(v);
  }
  return out;
}

export function generate(schema) {
  checkKeywords(schema, "schema");
  const decls = []; // interfaces hoisted from inline objects, in order of appearance

  function tsType(node, hint) {
    if (node.enum) return node.enum.map((v) => JSON.stringify(v)).join(" | ");
    if (node.oneOf) return node.oneOf.map((n) => tsType(n, hint)).join(" | ");
    if (node.type) {
      const types = Array.isArray(node.type) ? node.type : [node.type];
      return types
        .map((t) => {
          switch (t) {
            case "string": return "string";
            case "integer": case "number": return "number";
            case "boolean": return "boolean";
            case "null": return "null";
            case "array": return node.items ? `Array<${tsType(node.items, hint)}>` : "unknown[]";
            case "object":
              if (node.properties) {
                interfaceFor(node, hint);
                return hint;
              }
              return "{ [key: string]: unknown }";
            default: throw new Error(`unsupported type ${t}`);
          }
        })
        .join(" | ");
    }
    if (node.$ref) {
      // An object definition is an interface; one that may be null is `Name | null` where used.
      const def = schema.$defs[node.$ref.replace("#/$defs/", "")];
      const nullable = def?.properties && [def.type].flat().includes("null");
      return refName(node.$ref) + (nullable ? " | null" : "");
    }
    if (node.not && Object.keys(node.not).length === 0) return "never";
    return "unknown";
  }

  function interfaceFor(node, name) {
    const required = new Set(node.required ?? []);
    let body = "";
    for (const [p, sub] of Object.entries(node.properties)) {
      body += doc(sub, "  ");
      body += `  ${p}${required.has(p) ? "" : "?"}: ${tsType(sub, name + pascal(p))};\n`;
    }
    if (node.additionalProperties !== false) body += "  [field: string]: unknown;\n";
    decls.push(`${doc(node, "")}export interface ${name} {\n${body}}\n`);
  }

  const parts = [];
  for (const [name, node] of Object.entries(schema.$defs)) {
    if (node.properties) interfaceFor(node, pascal(name));
    else parts.push(`${doc(node, "")}export type ${pascal(name)} = ${tsType(node, pascal(name))};\n`);
  }
  parts.push(`${doc(schema, "")}export type JobMessage = ${tsType(schema, "JobMessage")};\n`);

  const header =
    `// GENERATED by clients/typescript/scripts/generate-types.mjs from docs/message.schema.json;\n` +
    `// do not edit: run \`npm run generate\` after the schema changes (a test checks this file).\n\n`;
  const nodeType =
    `/** A schema definition without its prose, as src/contract.ts reads it. */\n` +
    `export interface SchemaNode {\n` +
    `  $ref?: string;\n  additionalProperties?: boolean | SchemaNode;\n  enum?: readonly unknown[];\n` +
    `  items?: SchemaNode;\n  maxItems?: number;\n  maxLength?: number;\n  maximum?: number;\n` +
    `  minLength?: number;\n  minimum?: number;\n  not?: SchemaNode;\n  oneOf?: readonly SchemaNode[];\n` +
    `  pattern?: string;\n  properties?: { readonly [field: string]: SchemaNode };\n` +
    `  propertyNames?: SchemaNode;\n  required?: readonly string[];\n  type?: string | readonly string[];\n}\n`;
  const keys = schema.$defs.envelopeKey?.enum ?? [];
  const consts =
    `/** The keys of an envelope, in the schema's order. */\n` +
    `export const ENVELOPE_KEYS: readonly EnvelopeKey[] = ${JSON.stringify(keys)};\n\n` +
    `/** The schema's definitions without their prose: what src/contract.ts checks against. */\n` +
    `export const SCHEMA_DEFS: { readonly [name: string]: SchemaNode } = ${JSON.stringify(bare(schema.$defs), null, 2)};\n`;
  return header + [...parts, ...decls].join("\n") + "\n" + nodeType + "\n" + consts;
}

function main() {
  const check = process.argv.includes("--check");
  const text = generate(JSON.parse(readFileSync(SCHEMA, "utf8")));
  if (check) {
    let old = "";
    try {
      old = readFileSync(OUT, "utf8");
    } catch {
      // missing: differs
    }
    if (old !== text) {
      console.error(
        `${relative(process.cwd(), OUT)} is not what ${relative(process.cwd(), SCHEMA)} generates; ` +
          `run \`npm run generate\` in clients/typescript and commit the result`,
      );
      process.exit(1);
    }
    console.log(`${relative(process.cwd(), OUT)} is up to date with the schema`);
    return;
  }
  writeFileSync(OUT, text);
  console.log(`wrote ${relative(process.cwd(), OUT)}`);
}

if (process.argv[1] && fileURLToPath(import.meta.url) === process.argv[1]) main();
