"""Reading pod specs as a kubelet does, as pure functions: `$(VAR)` expansion, the
container environment (values, downward API, ConfigMap and Secret references), named
ports, the files of configMap / secret / downwardAPI volumes, label selectors and the
pod-template hash. `kubelet.py` and `runtime.py` do the I/O around them.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
from collections.abc import Callable, Mapping
from typing import Any

Obj = dict[str, Any]
# name -> object (or None when it does not exist): how a pod's ConfigMaps and Secrets are read.
Lookup = Callable[[str], Obj | None]
_INDEXED = re.compile(r"^metadata\.(labels|annotations)\['(.+)'\]$")


class ConfigError(Exception):
    """The container cannot be configured yet (CreateContainerConfigError): a missing
    ConfigMap, Secret or key, or an unsupported field."""


def expand(text: str, env: Mapping[str, str]) -> str:
    """Kubernetes' `$(VAR)` expansion of command, args and env values: `$(VAR)` becomes
    the variable's value when it is defined and stays as written otherwise; `$$` is a
    literal `$` (so `$$(VAR)` stays `$(VAR)`)."""
    out: list[str] = []
    i = 0
    while i < len(text):
        if text[i] == "$" and i + 1 < len(text):
            if text[i + 1] == "$":
                out.append("$")
                i += 2
                continue
            if text[i + 1] == "(":
                close = text.find(")", i + 2)
                if close != -1:
                    name = text[i + 2 : close]
                    out.append(env[name] if name in env else text[i : close + 1])
                    i = close + 1
                    continue
        out.append(text[i])
        i += 1
    return "".join(out)


def field_value(pod: Obj, path: str) -> str:
    """A downward-API `fieldRef.fieldPath` of the pod."""
    meta, spec, status = pod["metadata"], pod.get("spec") or {}, pod.get("status") or {}
    simple = {
        "metadata.name": meta.get("name"),
        "metadata.namespace": meta.get("namespace"),
        "metadata.uid": meta.get("uid"),
        "spec.nodeName": spec.get("nodeName"),
        "spec.serviceAccountName": spec.get("serviceAccountName") or "default",
        "status.podIP": status.get("podIP"),
        "status.hostIP": status.get("hostIP"),
    }
    if path in simple:
        return str(simple[path] or "")
    if indexed := _INDEXED.match(path):
        return str((meta.get(indexed.group(1)) or {}).get(indexed.group(2), ""))
    raise ConfigError(f"fieldRef {path!r} is not supported by the process kubelet")


def _data_of(obj: Obj) -> dict[str, str]:
    """The string data of a ConfigMap or Secret (Secrets' base64 `data` decoded)."""
    if obj.get("kind") == "Secret":
        data = {k: base64.b64decode(v).decode() for k, v in (obj.get("data") or {}).items()}
        data.update(obj.get("stringData") or {})
        return data
    return dict(obj.get("data") or {})


def _key_ref(ref: Mapping[str, Any], what: str, lookup: Lookup) -> str | None:
    found = lookup(ref.get("name", ""))
    data = None if found is None else _data_of(found)
    if data is None or ref["key"] not in data:
        if ref.get("optional"):
            return None
        missing = "" if data is None else f' has no key "{ref["key"]}"'
        raise ConfigError(f'{what} "{ref.get("name")}"{missing or " not found"}')
    return data[ref["key"]]


def container_env(
    pod: Obj,
    container: Obj,
    base: Mapping[str, str],
    config_maps: Lookup,
    secrets: Lookup,
) -> dict[str, str]:
    """The environment of a container: `base` (the image's and the node's variables),
    then `envFrom`, then `env` in order, each value expanded against what came before."""
    env = dict(base)
    for source in container.get("envFrom") or []:
        prefix = source.get("prefix", "")
        for kind, lookup in (("configMapRef", config_maps), ("secretRef", secrets)):
            if (ref := source.get(kind)) is None:
                continue
            found = lookup(ref.get("name", ""))
            if found is None and not ref.get("optional"):
                raise ConfigError(f'{kind} "{ref.get("name")}" not found')
            env.update({prefix + k: v for k, v in _data_of(found or {}).items()})
    for item in container.get("env") or []:
        value = _env_value(pod, item, env, config_maps, secrets)
        if value is not None:
            env[item["name"]] = value
    return env


def _env_value(
    pod: Obj, item: Mapping[str, Any], env: Mapping[str, str], config_maps: Lookup, secrets: Lookup
) -> str | None:
    if "valueFrom" not in item:
        return expand(str(item.get("value", "")), env)
    source = item["valueFrom"]
    if "fieldRef" in source:
        return field_value(pod, source["fieldRef"]["fieldPath"])
    if "configMapKeyRef" in source:
        return _key_ref(source["configMapKeyRef"], "configmap", config_maps)
    if "secretKeyRef" in source:
        return _key_ref(source["secretKeyRef"], "secret", secrets)
    raise ConfigError(f"env {item['name']}: {sorted(source)} is not supported by the kubelet")


def command_line(container: Obj, env: Mapping[str, str]) -> list[str]:
    """`command` + `args`, expanded. The image is not run, so a command is required."""
    command = [expand(str(c), env) for c in container.get("command") or []]
    if not command:
        raise ConfigError(
            f"container {container['name']!r} has no command: the process kubelet runs "
            "commands, not images, so every container needs an explicit command"
        )
    return command + [expand(str(a), env) for a in container.get("args") or []]


def resolve_port(pod: Obj, port: int | str) -> int | None:
    """A port number, or a named container port of the pod (None where there is none)."""
    if isinstance(port, int) or str(port).isdigit():
        return int(port)
    for container in (pod.get("spec") or {}).get("containers") or []:
        for item in container.get("ports") or []:
            if item.get("name") == port:
                return int(item["containerPort"])
    return None


# (pod, a projected volume's serviceAccountToken source) -> the token (the node agent asks
# the TokenRequest API); None where the kubelet has no tokens to give.
Tokens = Callable[[Obj, Obj], str] | None


def volume_files(
    pod: Obj, volume: Obj, config_maps: Lookup, secrets: Lookup, tokens: Tokens = None
) -> dict[str, str] | None:
    """The files (relative path -> text) of a configMap, secret, downwardAPI or projected
    volume; None for other volume types."""
    if "projected" in volume:
        files: dict[str, str] = {}
        for source in volume["projected"].get("sources") or []:
            if "serviceAccountToken" in source:
                if tokens is None:
                    raise ConfigError("serviceAccountToken volumes need a node agent's tokens")
                files[source["serviceAccountToken"]["path"]] = tokens(
                    pod, source["serviceAccountToken"]
                )
                continue
            found = _source_files(pod, source, volume["name"], config_maps, secrets)
            if found is None:
                raise ConfigError(f"projected source {sorted(source)} is not emulated")
            files.update(found)
        return files
    return _source_files(pod, volume, volume["name"], config_maps, secrets)


def _source_files(
    pod: Obj, volume: Obj, name: str, config_maps: Lookup, secrets: Lookup
) -> dict[str, str] | None:
    """The files of a configMap, secret or downwardAPI volume or projected source."""
    if "downwardAPI" in volume:
        return {
            item["path"]: field_value(pod, item["fieldRef"]["fieldPath"])
            for item in volume["downwardAPI"].get("items") or []
            if "fieldRef" in item
        }
    for kind, name_key, lookup in (
        ("configMap", "name", config_maps),
        ("secret", "secretName", secrets),
    ):
        if kind not in volume:
            continue
        source = volume[kind]
        # Projected sources name their Secret `name`, volumes `secretName`.
        ref = source.get(name_key) or source.get("name", "")
        found = lookup(ref)
        if found is None:
            if source.get("optional"):
                return {}
            raise ConfigError(f'{kind} "{ref}" of volume {name!r} not found')
        data = _data_of(found)
        if not source.get("items"):
            return data
        files = {}
        for item in source["items"]:
            if item["key"] not in data:
                if source.get("optional"):
                    continue
                raise ConfigError(f'{kind} "{ref}" has no key "{item["key"]}"')
            files[item["path"]] = data[item["key"]]
        return files
    return None


def matches(labels: Mapping[str, str], selector: Mapping[str, Any] | None) -> bool:
    """Whether labels match a LabelSelector (matchLabels and matchExpressions); an empty
    or missing selector matches everything."""
    selector = selector or {}
    if any(labels.get(k) != v for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr["key"], expr["operator"], expr.get("values") or []
        ok = {
            "In": key in labels and labels[key] in values,
            "NotIn": key not in labels or labels[key] not in values,
            "Exists": key in labels,
            "DoesNotExist": key not in labels,
        }[op]
        if not ok:
            return False
    return True


def template_hash(template: Mapping[str, Any]) -> str:
    """The `pod-template-hash` of a Deployment's pod template (a digest, like the
    ReplicaSet controller's; only equality matters)."""
    text = json.dumps(template, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:10]


def duration_s(text: str | None, default_s: float) -> float:
    """A Prometheus duration (`1s`, `500ms`, `1m`) in seconds."""
    if not text:
        return default_s
    found = re.fullmatch(r"(\d+(?:\.\d+)?)(ms|s|m|h)", text.strip())
    if found is None:
        return default_s
    scale = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}[found.group(2)]
    return float(found.group(1)) * scale
