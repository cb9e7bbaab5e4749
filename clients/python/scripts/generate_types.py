#!/usr/bin/env python3
"""Generates src/jobwarden_client/schema.py from docs/message.schema.json (the job contract's
JSON Schema): a TypedDict or alias per definition, and SCHEMA_DEFS, the definitions without
their prose, which jobwarden_client.contract checks values against (so the client refuses
exactly what the schema states, with the limits it states).

    python scripts/generate_types.py           write the file
    python scripts/generate_types.py --check   exit 1 if the committed file differs (a test runs this)
    ... --schema PATH                          read another schema (the test's drift check)

The generator knows the keywords the schema uses today and refuses any other, so a schema that
grows a new kind of rule fails here (and in the drift test) instead of being ignored.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
SCHEMA = ROOT.parent.parent / "docs" / "message.schema.json"
OUT = ROOT / "src" / "jobwarden_client" / "schema.py"

KNOWN = {
    "$defs", "$schema", "$ref", "additionalProperties", "description", "enum", "items",
    "maxItems", "maxLength", "maximum", "minLength", "minimum", "not", "oneOf", "pattern",
    "properties", "propertyNames", "required", "title", "type",
}
PROSE = {"description", "title", "$schema"}


def pascal(name: str) -> str:
    head, *rest = name.split("_")
    return head[:1].upper() + head[1:] + "".join(p.title() for p in rest)


def check_keywords(node: Any, at: str) -> None:
    if not isinstance(node, dict):
        return
    for k, v in node.items():
        if k not in KNOWN:
            raise SystemExit(
                f'{at}: the schema uses the keyword "{k}", which the client does not check yet; '
                f'teach jobwarden_client/contract.py (and clients/typescript) the rule, then add "{k}" to KNOWN'
            )
        if k in ("properties", "$defs"):
            for p, sub in v.items():
                check_keywords(sub, f"{at}.{p}")
        elif k not in ("enum", "required"):
            if isinstance(v, list):
                for i, sub in enumerate(v):
                    check_keywords(sub, f"{at}.{k}[{i}]")
            else:
                check_keywords(v, f"{at}.{k}")


def bare(node: Any) -> Any:
    """The node without its prose, for SCHEMA_DEFS."""
    if isinstance(node, list):
        return [bare(n) for n in node]
    if not isinstance(node, dict):
        return node
    out = {}
    for k, v in node.items():
        if k in PROSE:
            continue
        out[k] = {p: bare(s) for p, s in v.items()} if k == "properties" else bare(v)
    return out


def literal(value: Any, indent: int = 0) -> str:
    """A Python literal for a JSON value, one key or item a line (stable across versions)."""
    pad = "    " * (indent + 1)
    if isinstance(value, dict):
        if not value:
            return "{}"
        items = "".join(f"{pad}{k!r}: {literal(v, indent + 1)},\n" for k, v in value.items())
        return "{\n" + items + "    " * indent + "}"
    if isinstance(value, list):
        if not value:
            return "[]"
        items = "".join(f"{pad}{literal(v, indent + 1)},\n" for v in value)
        return "[\n" + items + "    " * indent + "]"
    return repr(value)


def comment(node: dict, indent: str) -> str:
    text = node.get("description")
    return f"{indent}# {text}\n" if text else ""


def generate(schema: dict) -> str:
    check_keywords(schema, "schema")
    defs = schema["$defs"]
    classes: list[str] = []

    def py_type(node: dict, hint: str) -> str:
        if "enum" in node:
            return "Literal[" + ", ".join(json.dumps(v) for v in node["enum"]) + "]"
        if "oneOf" in node:
            return "Union[" + ", ".join(py_type(n, hint) for n in node["oneOf"]) + "]"
        if "type" in node:
            types = node["type"] if isinstance(node["type"], list) else [node["type"]]
            out = []
            for t in types:
                if t == "string":
                    out.append("str")
                elif t == "integer":
                    out.append("int")
                elif t == "number":
                    out.append("float")
                elif t == "boolean":
                    out.append("bool")
                elif t == "array":
                    out.append(f"list[{py_type(node['items'], hint)}]" if "items" in node else "list[Any]")
                elif t == "object":
                    if "properties" in node:
                        class_for(node, hint)
                        out.append(hint)
                    else:
                        out.append("dict[str, Any]")
                elif t != "null":
                    raise SystemExit(f"unsupported type {t}")
            joined = out[0] if len(out) == 1 else "Union[" + ", ".join(out) + "]"
            return f"Optional[{joined}]" if "null" in types else joined
        if "$ref" in node:
            name = node["$ref"].removeprefix("#/$defs/")
            target = defs[name]
            nullable = "properties" in target and "null" in (
                target["type"] if isinstance(target.get("type"), list) else [target.get("type")]
            )
            return f"Optional[{pascal(name)}]" if nullable else pascal(name)
        if node.get("not") == {}:
            return "Never"
        return "Any"

    def class_for(node: dict, name: str) -> None:
        required = set(node.get("required", []))
        body = ""
        for p, sub in node["properties"].items():
            body += comment(sub, "    ")
            t = py_type(sub, name + pascal(p))
            body += f"    {p}: {'Required[' + t + ']' if p in required else t}\n"
        text = node.get("description", "").replace('"""', "'''")
        doc = f'    r"""{text}"""\n\n' if text else ""
        extra = "" if node.get("additionalProperties") is False else "    # Other fields of a SQL enqueue() spec are allowed too.\n"
        classes.append(f"class {name}(TypedDict, total=False):\n{doc}{body}{extra}")

    aliases = []
    for name, node in defs.items():
        if "properties" in node:
            class_for(node, pascal(name))
        else:
            aliases.append(f"{comment(node, '')}{pascal(name)} = {py_type(node, pascal(name))}\n")
    root = f"{comment(schema, '')}JobMessage = {py_type(schema, 'JobMessage')}\n"
    keys = defs.get("envelopeKey", {}).get("enum", [])
    return (
        "# GENERATED by clients/python/scripts/generate_types.py from docs/message.schema.json;\n"
        "# do not edit: run `python scripts/generate_types.py` after the schema changes (a test checks this file).\n"
        '"""The job contract\'s types and definitions, generated from docs/message.schema.json."""\n\n'
        "from __future__ import annotations\n\n"
        "from typing import Any, Literal, Never, Optional, Required, TypedDict, Union\n\n"
        + "\n".join(aliases)
        + "\n\n"
        + "\n\n".join(classes)
        + "\n\n"
        + root
        + "\n# The keys of an envelope, in the schema's order.\n"
        + f"ENVELOPE_KEYS: tuple[str, ...] = tuple({literal(keys)})\n"
        + "\n# The schema's definitions without their prose: what jobwarden_client.contract checks against.\n"
        + f"SCHEMA_DEFS: dict[str, Any] = {literal(bare(defs))}\n"
    )


def main(argv: list[str]) -> int:
    schema_path = Path(argv[argv.index("--schema") + 1]) if "--schema" in argv else SCHEMA
    text = generate(json.loads(schema_path.read_text(encoding="utf-8")))
    if "--check" in argv:
        old = OUT.read_text(encoding="utf-8") if OUT.exists() else ""
        if old != text:
            print(
                f"{OUT} is not what {schema_path} generates; run `python scripts/generate_types.py` "
                "in clients/python and commit the result",
                file=sys.stderr,
            )
            return 1
        print(f"{OUT} is up to date with the schema")
        return 0
    OUT.write_text(text, encoding="utf-8")
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
