"""Label and field selectors as the API server parses them from `labelSelector` and
`fieldSelector` query parameters: a selector becomes a predicate over an object.

Label selectors: `k=v`, `k==v`, `k!=v`, `k in (a,b)`, `k notin (a,b)`, `k`, `!k`, joined by
commas. Field selectors: `path=v`, `path==v`, `path!=v` on any dotted path (the real server
allows a few fields per kind, `metadata.name` and `metadata.namespace` everywhere).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

Predicate = Callable[[Mapping[str, Any]], bool]

_KEY = r"[A-Za-z0-9][-A-Za-z0-9_./]*"
_LABEL_REQUIREMENT = re.compile(
    rf"\s*(?:(?P<absent>!)\s*(?P<absent_key>{_KEY})"
    rf"|(?P<set_key>{_KEY})\s+(?P<set_op>in|notin)\s*\((?P<values>[^)]*)\)"
    rf"|(?P<key>{_KEY})\s*(?:(?P<op>==|=|!=)\s*(?P<value>[-A-Za-z0-9_.]*))?)\s*(?:,|$)"
)
_FIELD_REQUIREMENT = re.compile(
    r"\s*(?P<path>[\w.]+)\s*(?P<op>==|=|!=)\s*(?P<value>[^,]*?)\s*(?:,|$)"
)


class SelectorError(ValueError):
    """The selector does not parse; the message quotes it."""


def label_selector(text: str | None) -> Predicate:
    """A predicate over objects that is true where the labels satisfy the selector."""
    checks: list[Callable[[Mapping[str, str]], bool]] = []
    for m in _scan(_LABEL_REQUIREMENT, text or "", "label"):
        if m["absent"]:
            checks.append(lambda labels, k=m["absent_key"]: k not in labels)
        elif m["set_key"]:
            values = {v.strip() for v in m["values"].split(",") if v.strip()}
            wanted = m["set_op"] == "in"
            # `notin` also matches objects without the label, as in Kubernetes.
            checks.append(
                lambda labels, k=m["set_key"], vs=values, w=wanted: (labels.get(k) in vs) == w
            )
        elif m["op"] is None:
            checks.append(lambda labels, k=m["key"]: k in labels)
        else:
            equal = m["op"] != "!="
            checks.append(
                lambda labels, k=m["key"], v=m["value"], e=equal: (labels.get(k) == v) == e
            )

    def matches(obj: Mapping[str, Any]) -> bool:
        labels = obj.get("metadata", {}).get("labels") or {}
        return all(check(labels) for check in checks)

    return matches


def field_selector(text: str | None) -> Predicate:
    """A predicate over objects that is true where the fields satisfy the selector."""
    checks = [
        (m["path"].split("."), m["value"], m["op"] != "!=")
        for m in _scan(_FIELD_REQUIREMENT, text or "", "field")
    ]

    def matches(obj: Mapping[str, Any]) -> bool:
        return all((_field(obj, path) == value) == equal for path, value, equal in checks)

    return matches


def _field(obj: Any, path: list[str]) -> str:
    for part in path:
        obj = obj.get(part) if isinstance(obj, Mapping) else None
    return "" if obj is None else str(obj).lower() if isinstance(obj, bool) else str(obj)


def _scan(pattern: re.Pattern[str], text: str, what: str) -> list[re.Match[str]]:
    matches, pos = [], 0
    while pos < len(text):
        m = pattern.match(text, pos)
        if m is None or m.end() == pos:
            raise SelectorError(f"unable to parse the {what} selector {text!r} at {text[pos:]!r}")
        matches.append(m)
        pos = m.end()
    return matches
