"""The three PATCH flavours of the Kubernetes API as pure functions on JSON documents.

JSON merge patch (RFC 7386) and JSON patch (RFC 6902, with `test`) are exact. Strategic merge
patch is an approximation good for what kubectl and the Python client send for built-in
kinds: lists named below merge by their key, `$patch: delete|replace`, `$retainKeys` and
`$deleteFromPrimitiveList/...` are honoured, `$setElementOrder/...` is accepted and ignored
(order is not emulated). The real server derives merge keys from the Go types.
"""

from __future__ import annotations

import copy
from typing import Any

# patchMergeKey of the list fields of built-in kinds that clients actually patch.
MERGE_KEYS = {
    "containers": "name",
    "initContainers": "name",
    "ephemeralContainers": "name",
    "env": "name",
    "volumes": "name",
    "volumeMounts": "mountPath",
    "volumeDevices": "devicePath",
    "imagePullSecrets": "name",
    "hostAliases": "ip",
    "conditions": "type",
    "ownerReferences": "uid",
    "topologySpreadConstraints": "topologyKey",
}
# Lists of scalars with patchStrategy=merge: a patch adds to them instead of replacing them.
MERGED_SCALAR_LISTS = {"finalizers"}


class PatchError(ValueError):
    """The patch cannot be applied: a failed `test`, a missing path, a malformed op."""


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386: objects merge recursively, `null` deletes, anything else replaces."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def strategic_merge_patch(target: Any, patch: Any) -> Any:
    """Kubernetes strategic merge patch, approximated (see the module docstring).

    Returns None where the patch deletes the whole target (`$patch: delete`)."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    directive = patch.get("$patch")
    if directive == "delete":
        return None
    if directive == "replace":
        return {k: copy.deepcopy(v) for k, v in patch.items() if k != "$patch"}
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if key in ("$patch", "$retainKeys") or key.startswith("$setElementOrder/"):
            continue
        if key.startswith("$deleteFromPrimitiveList/"):
            field = key.split("/", 1)[1]
            result[field] = [x for x in result.get(field, []) if x not in value]
        elif value is None:
            result.pop(key, None)
        elif isinstance(value, list) and isinstance(result.get(key), list):
            result[key] = _merge_list(key, result[key], value)
        else:
            merged = strategic_merge_patch(result.get(key), value)
            if merged is None:
                result.pop(key, None)
            else:
                result[key] = merged
    if "$retainKeys" in patch:
        result = {k: v for k, v in result.items() if k in patch["$retainKeys"]}
    return result


def _merge_list(field: str, current: list[Any], patch: list[Any]) -> list[Any]:
    if field in MERGED_SCALAR_LISTS:
        return current + [x for x in patch if x not in current]
    key = MERGE_KEYS.get(field)
    if field == "ports":  # container ports merge on containerPort, service ports on port
        key = "containerPort" if any("containerPort" in p for p in current + patch) else "port"
    items = [x for x in patch if x != {"$patch": "replace"}]
    if key is None or len(items) < len(patch) or not all(isinstance(x, dict) for x in items):
        return copy.deepcopy(items)
    result = copy.deepcopy(current)
    for item in items:
        index = next((i for i, x in enumerate(result) if x.get(key) == item.get(key)), None)
        if item.get("$patch") == "delete":
            if index is not None:
                del result[index]
        elif index is None:
            result.append(strategic_merge_patch({}, item))
        else:
            result[index] = strategic_merge_patch(result[index], item)
    return result


def json_patch(document: Any, operations: Any) -> Any:
    """RFC 6902 on a copy of the document: add, remove, replace, move, copy, test."""
    if not isinstance(operations, list):
        raise PatchError("a JSON patch must be a list of operations")
    doc = copy.deepcopy(document)
    for op in operations:
        if not isinstance(op, dict) or "path" not in op:
            raise PatchError(f"malformed JSON patch operation: {op!r}")
        kind, path = op.get("op"), op["path"]
        if kind == "test":
            if _get(doc, path) != op.get("value"):
                raise PatchError(f"test failed: {path} is not {op.get('value')!r}")
        elif kind == "add":
            doc = _add(doc, path, copy.deepcopy(op.get("value")))
        elif kind == "remove":
            doc = _remove(doc, path)[0]
        elif kind == "replace":
            doc = _add(_remove(doc, path)[0], path, copy.deepcopy(op.get("value")))
        elif kind == "move":
            doc, value = _remove(doc, op.get("from", ""))
            doc = _add(doc, path, value)
        elif kind == "copy":
            doc = _add(doc, path, copy.deepcopy(_get(doc, op.get("from", ""))))
        else:
            raise PatchError(f"unknown JSON patch operation {kind!r}")
    return doc


def _parts(pointer: str) -> list[str]:
    if pointer == "":
        return []
    if not pointer.startswith("/"):
        raise PatchError(f"a JSON pointer starts with '/': {pointer!r}")
    return [t.replace("~1", "/").replace("~0", "~") for t in pointer[1:].split("/")]


def _index(container: list[Any], part: str, pointer: str, *, append: bool = False) -> int:
    if append and part == "-":
        return len(container)
    if not part.isdigit() or int(part) > len(container) - (0 if append else 1):
        raise PatchError(f"no such list index in {pointer!r}")
    return int(part)


def _get(doc: Any, pointer: str) -> Any:
    for part in _parts(pointer):
        if isinstance(doc, dict) and part in doc:
            doc = doc[part]
        elif isinstance(doc, list):
            doc = doc[_index(doc, part, pointer)]
        else:
            raise PatchError(f"path not found: {pointer!r}")
    return doc


def _parent(doc: Any, pointer: str) -> tuple[Any, str]:
    *head, last = _parts(pointer)
    return _get(doc, "".join("/" + t.replace("~", "~0").replace("/", "~1") for t in head)), last


def _add(doc: Any, pointer: str, value: Any) -> Any:
    if pointer == "":
        return value
    parent, last = _parent(doc, pointer)
    if isinstance(parent, dict):
        parent[last] = value
    elif isinstance(parent, list):
        parent.insert(_index(parent, last, pointer, append=True), value)
    else:
        raise PatchError(f"cannot add at {pointer!r}: the parent is not an object or a list")
    return doc


def _remove(doc: Any, pointer: str) -> tuple[Any, Any]:
    if pointer == "":
        return None, doc
    parent, last = _parent(doc, pointer)
    if isinstance(parent, dict) and last in parent:
        return doc, parent.pop(last)
    if isinstance(parent, list):
        return doc, parent.pop(_index(parent, last, pointer))
    raise PatchError(f"path not found: {pointer!r}")
