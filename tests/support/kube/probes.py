"""Container probes as the kubelet runs them: `httpGet` (status 200-399 passes), `tcpSocket`
(a connection passes) and `exec` (exit 0 passes, run in the container's namespaces with
nsenter), each within `timeoutSeconds`. Every result carries a message for diagnostics.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
from collections.abc import Mapping
from typing import Any

from tests.support.kube.podspec import Obj, resolve_port

PROBE_DEFAULTS = {
    "initialDelaySeconds": 0,
    "periodSeconds": 10,
    "timeoutSeconds": 1,
    "successThreshold": 1,
    "failureThreshold": 3,
}


def setting(probe: Mapping[str, Any], name: str) -> float:
    return float(probe.get(name, PROBE_DEFAULTS[name]))


async def run_probe(
    probe: Mapping[str, Any], pod: Obj, pod_ip: str, pid: int | None, env: Mapping[str, str]
) -> tuple[bool, str]:
    """(passed, what happened) of one probe attempt."""
    timeout_s = setting(probe, "timeoutSeconds")
    try:
        if "httpGet" in probe:
            return await asyncio.wait_for(_http(probe["httpGet"], pod, pod_ip), timeout_s)
        if "tcpSocket" in probe:
            return await asyncio.wait_for(_tcp(probe["tcpSocket"], pod, pod_ip), timeout_s)
        if "exec" in probe:
            return await _exec(probe["exec"].get("command") or [], pid, env, timeout_s)
    except TimeoutError:
        return False, f"timed out after {timeout_s:g} s"
    except OSError as exc:
        return False, str(exc)
    return False, f"probe type {sorted(probe)} is not emulated by the process kubelet"


def _port(action: Mapping[str, Any], pod: Obj) -> int:
    port = resolve_port(pod, action["port"])
    if port is None:
        raise OSError(f"the pod has no container port named {action['port']!r}")
    return port


async def _http(action: Mapping[str, Any], pod: Obj, pod_ip: str) -> tuple[bool, str]:
    host, port = action.get("host") or pod_ip, _port(action, pod)
    path = action.get("path") or "/"
    url = f"http://{host}:{port}{path}"
    if (action.get("scheme") or "HTTP").upper() != "HTTP":
        return False, f"{url}: only scheme HTTP is emulated"
    reader, writer = await asyncio.open_connection(host, port)
    try:
        headers = {"Host": f"{host}:{port}", "User-Agent": "kube-probe/1.37", "Accept": "*/*"}
        headers.update({h["name"]: h["value"] for h in action.get("httpHeaders") or []})
        head = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
        writer.write(f"GET {path} HTTP/1.1\r\n{head}Connection: close\r\n\r\n".encode())
        await writer.drain()
        response = await reader.read(4096)
    finally:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()
    status_line, _, rest = response.partition(b"\r\n")
    parts = status_line.split()
    code = int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else 0
    body = rest.partition(b"\r\n\r\n")[2][:200].decode(errors="replace").strip()
    return 200 <= code < 400, f"HTTP {code or '(no answer)'} from {url}: {body}"


async def _tcp(action: Mapping[str, Any], pod: Obj, pod_ip: str) -> tuple[bool, str]:
    host, port = action.get("host") or pod_ip, _port(action, pod)
    _, writer = await asyncio.open_connection(host, port)
    writer.close()
    return True, f"connected to {host}:{port}"


async def _exec(
    command: list[str], pid: int | None, env: Mapping[str, str], timeout_s: float
) -> tuple[bool, str]:
    if pid is None:
        return False, "the container is not running"
    process = await asyncio.create_subprocess_exec(
        shutil.which("nsenter") or "nsenter",
        f"--target={pid}",
        "--mount",
        "--pid",
        "--uts",
        "--",
        *command,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        env=dict(env),
    )
    try:
        output, _ = await asyncio.wait_for(process.communicate(), timeout_s)
    except TimeoutError:
        process.kill()
        await process.wait()
        raise
    text = output[-200:].decode(errors="replace").strip()
    return process.returncode == 0, f"exit code {process.returncode}: {text}"
