"""The job contract, client side.

A value is checked against the schema's own definitions (``SCHEMA_DEFS``, generated from
docs/message.schema.json) and the rules the schema states in words but cannot express (its
description's list): limits in UTF-8 bytes, the size of a ``then`` tree, backoff and window
rules. A job refused here would be refused by jobwarden too (a published one kept as a dead
job), so the caller hears it at once, with the field, the value and the fix.
"""

from __future__ import annotations

import json
import math
import os
import re
import time
import unicodedata
from typing import Any, Literal, Mapping

from .schema import SCHEMA_DEFS


class JobwardenError(Exception):
    """Anything this client refuses or cannot do."""


class InvalidJobError(JobwardenError, ValueError):
    """A job field the contract refuses; ``field`` is a path (``then[2].priority``)."""

    def __init__(self, field: str, value: Any, reason: str) -> None:
        super().__init__(f"jobwarden: field `{field}` {reason}")
        self.field = field
        self.value = value


#: The longest delay, window or backoff: 3650 days, in nanoseconds.
MAX_DURATION_NS = 3650 * 86_400 * 10**9
#: A ``then`` tree: at most this many jobs in all, nested at most this deep.
MAX_THEN_JOBS = 100
MAX_THEN_DEPTH = 8
#: Parents a job may wait for (SQL only).
MAX_DEPENDS_ON = 100
#: The workers' default ``worker.max_payload_bytes``.
DEFAULT_MAX_PAYLOAD_BYTES = 1_048_576

#: What a string that breaks a definition's pattern should look like, by definition name.
HINTS = {
    "id": "an id may not hold control characters, whitespace, invisible characters, / ? or #",
    "jobKey": "a key may not hold control characters, whitespace, invisible characters, / ? or # "
    "(keys appear in URLs, command lines and logs)",
    "key": "an idempotency key may not hold control or invisible characters",
    "storable": "PostgreSQL jsonb cannot store the NUL character \\u0000; encode binary data as base64",
    "queue": 'a queue name is 1 to 64 ASCII letters, digits, "_" or "-", e.g. "email"',
}
OBJECT_WORDS = {"envelope": "a job", "thenJob": "a then job", "backoff": "a backoff", "batch": "a batch"}
TYPE_WORDS = {
    "string": "a string",
    "integer": "a whole number",
    "number": "a number",
    "boolean": "a boolean",
    "array": "an array",
    "object": "an object",
    "null": "null",
}


def shown(value: Any) -> str:
    """A value in an error: JSON, cut at 80 characters."""
    try:
        text = json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "a whole number"
    if isinstance(value, float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, (list, tuple)):
        return "an array"
    if isinstance(value, Mapping):
        return "an object"
    return f"a {type(value).__name__}"


def _is_type(value: Any, t: str) -> bool:
    if t == "null":
        return value is None
    if t == "string":
        return isinstance(value, str)
    if t == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if t == "number":
        return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if t == "boolean":
        return isinstance(value, bool)
    if t == "array":
        return isinstance(value, (list, tuple))
    if t == "object":
        return isinstance(value, Mapping)
    return False


def _join(at: str, field: str) -> str:
    return f"{at}.{field}" if at else field


_patterns: dict[str, re.Pattern[str]] = {}


def _regex(pattern: str) -> re.Pattern[str]:
    if pattern not in _patterns:
        _patterns[pattern] = re.compile(pattern)
    return _patterns[pattern]


def _char_name(c: str) -> str:
    printable = unicodedata.category(c)[0] in "LNPS"
    return f"'{c}'" if printable else f"U+{ord(c):04X}"


def _pattern_reason(s: str, pattern: str, what: str) -> str:
    if what == "duration":
        return f'is invalid: {shown(s)} is not a duration; write numbers with units, e.g. "1s", "250ms" or "1h 30m"'
    hint = HINTS.get(what)
    # The id-like patterns are one character class: name the first character it refuses.
    bad = next((c for c in s if not _regex(pattern).fullmatch(c)), None)
    if bad is not None and hint:
        return f"is invalid: {shown(s)} contains {_char_name(bad)}; {hint}"
    return f"is invalid: {shown(s)} does not match {pattern}" + (f"; {hint}" if hint else "")


def check_node(node: Mapping[str, Any], value: Any, path: str, what: str) -> None:
    """Checks ``value`` at ``path`` against a schema node (a definition of SCHEMA_DEFS or a
    part of one); ``what`` names the definition or field, for the hint of an error. A value
    of ``None`` where the node allows null (or says nothing of types) means absent."""
    if node.get("not") == {} and value is not None:
        raise InvalidJobError(path, value, "is not taken here")
    if "$ref" in node:
        name = node["$ref"].removeprefix("#/$defs/")
        check_node(SCHEMA_DEFS[name], value, path, name)
    types = node.get("type")
    types = None if types is None else (types if isinstance(types, list) else [types])
    if value is None:
        if types is None or "null" in types:
            return
    if types and not any(_is_type(value, t) for t in types):
        want = " or ".join(TYPE_WORDS.get(t, t) for t in types if t != "null")
        raise InvalidJobError(path, value, f"must be {want}, found {_kind(value)} ({shown(value)})")
    if "enum" in node and value not in node["enum"]:
        raise InvalidJobError(
            path, value, f"is invalid: {shown(value)} is not one of {', '.join(shown(v) for v in node['enum'])}"
        )
    if value in node.get("not", {}).get("enum", ()):
        raise InvalidJobError(
            path, value, f"is invalid: {shown(value)} cannot be an id or key (URL paths collapse it); add a letter or digit"
        )
    if _is_type(value, "number"):
        lo, hi = node.get("minimum", -math.inf), node.get("maximum", math.inf)
        if not lo <= value <= hi:
            whole = "a whole number" if types and "integer" in types else "a number"
            raise InvalidJobError(path, value, f"is invalid: {value} is not {whole} from {lo} to {hi}")
    if isinstance(value, str):
        # The schema's lengths are the contract's byte limits (its rule 1).
        n = len(value.encode("utf-8", "surrogatepass"))
        if "minLength" in node and n < node["minLength"]:
            limit = f" (1 to {node['maxLength']} bytes)" if "maxLength" in node else ""
            raise InvalidJobError(path, value, f"is invalid: must not be empty{limit}")
        if "maxLength" in node and n > node["maxLength"]:
            raise InvalidJobError(path, value, f"is invalid: is {n} bytes long, the limit is {node['maxLength']}")
        if "pattern" in node and not _regex(node["pattern"]).fullmatch(value):
            raise InvalidJobError(path, value, _pattern_reason(value, node["pattern"], what))
    if isinstance(value, (list, tuple)):
        if "maxItems" in node and len(value) > node["maxItems"]:
            raise InvalidJobError(path, value, f"is invalid: has {len(value)} items, the limit is {node['maxItems']}")
        if "items" in node:
            for i, item in enumerate(value):
                check_node(node["items"], item, f"{path}[{i}]", what)
    if isinstance(value, Mapping):
        _check_object(node, value, path, what)


def _check_object(node: Mapping[str, Any], obj: Mapping[str, Any], path: str, what: str) -> None:
    for field in node.get("required", ()):
        if obj.get(field) is None:
            raise InvalidJobError(_join(path, field), None, "is required")
    props = node.get("properties", {})
    names = node.get("propertyNames", {}).get("pattern")
    extra = node.get("additionalProperties")
    for field, value in obj.items():
        at = _join(path, field)
        if not isinstance(field, str):
            raise InvalidJobError(at, value, f"has the key {field!r}; JSON object keys are strings")
        if names and not _regex(names).fullmatch(field):
            raise InvalidJobError(at, field, "is invalid: the key " + _pattern_reason(field, names, what))
        if field in props:
            check_node(props[field], value, at, "storable" if what == "storable" else field)
        elif extra is False:
            raise InvalidJobError(
                at, value, f"is not a field of {OBJECT_WORDS.get(what, what)}; the fields are {', '.join(props)}"
            )
        elif isinstance(extra, Mapping):
            check_node(extra, value, at, what)


_UNITS: dict[str, int] = {}
for _names, _ns in (
    (("nanos", "nsec", "ns"), 1),
    (("usec", "us", "µs"), 1_000),
    (("millis", "msec", "ms"), 1_000_000),
    (("seconds", "second", "secs", "sec", "s"), 10**9),
    (("minutes", "minute", "mins", "min", "m"), 60 * 10**9),
    (("hours", "hour", "hrs", "hr", "h"), 3600 * 10**9),
    (("days", "day", "d"), 86_400 * 10**9),
    (("weeks", "week", "wks", "wk", "w"), 604_800 * 10**9),
    (("months", "month", "M"), 2_630_016 * 10**9),
    (("years", "year", "yrs", "yr", "y"), 31_557_600 * 10**9),
):
    for _n in _names:
        _UNITS[_n] = _ns
_TERM = re.compile(r"([0-9]+)(?:\.([0-9]+))?[ \t]*([^0-9 \t.]+)")


def duration_ns(text: str) -> int:
    """A duration text (already matched by the schema's pattern) in nanoseconds."""
    total = 0
    for whole, frac, unit in _TERM.findall(text):
        per = _UNITS.get(unit)
        if per is None:
            raise JobwardenError(f"unknown duration unit {unit!r}")
        total += int(whole) * per + (int(frac) * per // 10 ** len(frac) if frac else 0)
    return total


def _check_duration(obj: Mapping[str, Any], field: str, at: str, at_least_ms: bool) -> int | None:
    text = obj.get(field)
    if not isinstance(text, str):
        return None
    ns = duration_ns(text)
    path = _join(at, field)
    if at_least_ms and ns < 1_000_000:
        raise InvalidJobError(path, text, f'is invalid: {shown(text)} is under a millisecond; give at least "1ms" (or leave the field out)')
    if ns > MAX_DURATION_NS:
        raise InvalidJobError(path, text, f"is invalid: {shown(text)} is longer than 3650 days, the longest allowed")
    return ns


Door = Literal["message", "sql", "then"]


def check_rules(spec: Mapping[str, Any], at: str, door: Door) -> None:
    """The rules the schema states in words (its description's list), for one spec (an
    envelope, a SQL enqueue's fields, a then job) already checked against the schema."""

    def present(f: str) -> bool:
        return spec.get(f) is not None

    # (4) a backoff's max is not below its base; its base is above zero unless it is fixed.
    backoff = spec.get("backoff")
    if backoff:
        bat = _join(at, "backoff")
        base = _check_duration(backoff, "base", bat, False) or 0
        top = _check_duration(backoff, "max", bat, False)
        top = 3_600 * 10**9 if top is None else top
        if base == 0 and backoff.get("kind") != "fixed":
            raise InvalidJobError(_join(bat, "base"), backoff.get("base"), "is invalid: must be above zero for a linear or exponential backoff")
        if top < base:
            raise InvalidJobError(_join(bat, "max"), backoff.get("max"), "is invalid: must not be below base (a backoff without max has a max of 1h)")
    # (6) expires_at_ms or expires_in, never both; expires_in at least 1ms.
    if present("expires_at_ms") and present("expires_in"):
        raise InvalidJobError(_join(at, "expires_in"), spec["expires_in"], "is given with expires_at_ms; give one of them")
    _check_duration(spec, "expires_in", at, True)
    # (7) the windows and the rules between them.
    debounce = _check_duration(spec, "debounce", at, True)
    max_wait = _check_duration(spec, "debounce_max_wait", at, True)
    throttle = _check_duration(spec, "throttle", at, True)
    _check_duration(spec, "unique_for", at, True)
    if max_wait is not None and debounce is None:
        raise InvalidJobError(
            _join(at, "debounce_max_wait"), spec["debounce_max_wait"],
            'is given without debounce; it bounds how long a debounce may hold a job back: add "debounce" (e.g. "5s") or leave debounce_max_wait out',
        )
    if max_wait is not None and debounce is not None and max_wait < debounce:
        raise InvalidJobError(
            _join(at, "debounce_max_wait"), spec["debounce_max_wait"],
            f"is invalid: {shown(spec['debounce_max_wait'])} is shorter than debounce {shown(spec['debounce'])}; a debounced job "
            "runs at the latest max_wait after the first one came, so max_wait is at least the debounce",
        )
    if debounce is not None and throttle is not None:
        raise InvalidJobError(
            _join(at, "throttle"), spec["throttle"],
            "is given with debounce; a key's jobs are debounced (the last one runs) or throttled (the first one runs), not both: keep one",
        )
    # A message's key may come from its queue's key_from, which only the worker knows.
    if door != "message" and not present("key") and (debounce is not None or throttle is not None):
        field = "debounce" if debounce is not None else "throttle"
        raise InvalidJobError(_join(at, field), spec[field], 'needs a key: it applies to the jobs of one key; add "key" (e.g. "customer-42")')
    if present("unique_for") and not present("idempotency_key"):
        raise InvalidJobError(
            _join(at, "unique_for"), spec["unique_for"],
            "needs an idempotency_key: it is how long the job's idempotency key is held; add \"idempotency_key\" or leave unique_for out",
        )
    # (3) a `then` tree: at most 100 jobs in all, 8 deep (counted from the top spec only).
    if door != "then" and isinstance(spec.get("then"), (list, tuple)):
        _check_then_tree(spec["then"], _join(at, "then"))


def _check_then_tree(top: list[Any], path: str) -> None:
    count = 0

    def walk(jobs: list[Any], at: str, depth: int) -> None:
        nonlocal count
        if depth > MAX_THEN_DEPTH:
            raise InvalidJobError(at, None, f"is invalid: a then chain is nested more than {MAX_THEN_DEPTH} deep; flatten it")
        for i, job in enumerate(jobs):
            jat = f"{at}[{i}]"
            count += 1
            if count > MAX_THEN_JOBS:
                raise InvalidJobError(jat, job, f"is invalid: a then tree holds at most {MAX_THEN_JOBS} jobs in all")
            check_rules(job, jat, "then")
            if isinstance(job.get("then"), (list, tuple)):
                walk(job["then"], _join(jat, "then"), depth + 1)

    walk(top, path, 1)


def check_queue(queue: Any, path: str = "queue") -> None:
    """Checks a queue name as the contract does (the queue pattern of a then job)."""
    if queue is None:
        raise InvalidJobError(path, queue, "is required")
    check_node(SCHEMA_DEFS["thenJob"]["properties"]["queue"], queue, path, "queue")


def check_payload(payload: Any, path: str = "payload") -> None:
    """Checks a payload: a JSON object without NUL."""
    if payload is None:
        raise InvalidJobError(path, payload, "is required: give the job's data as a dict")
    check_node(SCHEMA_DEFS["envelope"]["properties"]["payload"], payload, path, "payload")


def check_envelope(envelope: Mapping[str, Any], at: str = "", door: Door = "message") -> None:
    """Checks a whole envelope: the schema's envelope definition, then the rules in words."""
    check_node(SCHEMA_DEFS["envelope"], envelope, at, "envelope")
    check_rules(envelope, at, door)


def check_depends_on(value: Any, path: str = "depends_on") -> None:
    """Checks ``depends_on`` (SQL only): at most 100 parent ids, each an id."""
    if value is None:
        return
    if not isinstance(value, (list, tuple)):
        raise InvalidJobError(path, value, f"must be a list of job ids, found {_kind(value)}")
    if len(value) > MAX_DEPENDS_ON:
        raise InvalidJobError(path, value, f"is invalid: names {len(value)} parents, the limit is {MAX_DEPENDS_ON}")
    for i, parent in enumerate(value):
        if not isinstance(parent, str):
            raise InvalidJobError(f"{path}[{i}]", parent, f"must be a job id (a string), found {_kind(parent)}")
        check_node({"$ref": "#/$defs/id"}, parent, f"{path}[{i}]", "id")


def to_json(value: Any, field: str = "payload") -> str:
    """Compact JSON, refusing what JSON cannot hold (NaN, sets, objects)."""
    try:
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as err:
        raise InvalidJobError(field, None, f"is not JSON: {err}; give dicts, lists, strings, numbers, booleans and None") from err


_TRACEPARENT = re.compile(r"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})")


def is_traceparent(value: str) -> bool:
    """A W3C traceparent (``00-<32 hex>-<16 hex>-<2 hex>``, lower case, ids not all zero)."""
    m = _TRACEPARENT.fullmatch(value) if isinstance(value, str) else None
    return bool(m) and m.group(1) != "ff" and m.group(2).strip("0") != "" and m.group(3).strip("0") != ""


def new_job_id(now_ms: int | None = None) -> str:
    """A new job id: a UUID version 7 (time-ordered, as the Rust client makes them)."""
    ms = int(time.time() * 1000) if now_ms is None else now_ms
    b = bytearray(ms.to_bytes(6, "big") + os.urandom(10))
    b[6] = (b[6] & 0x0F) | 0x70
    b[8] = (b[8] & 0x3F) | 0x80
    h = b.hex()
    return f"{h[0:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"
