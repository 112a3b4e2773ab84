"""One pod on the process kubelet's node: its volumes, and each container as a local
process tree in its own PID, mount and UTS namespaces (`podexec.py`), with probes,
restarts and the Pod status a kubelet reports.

- Volumes are prepared once, when the pod starts: configMap, secret, downwardAPI and
  projected volumes as files in the pod's folder (read-only mounts; a projected
  serviceAccountToken from `Node.tokens`), emptyDir as a folder, hostPath
  as the host path. A missing ConfigMap or Secret keeps the pod Pending
  (ContainerCreating) until it appears; other volume types keep it Pending with a
  message saying they are not emulated.
- Each container gets, besides its volumeMounts: a private writable /tmp (the image's
  writable layer; the images' WORKDIR and HOME), the pod's hosts file at /etc/hosts (and
  an /etc/host.conf that makes a name on several lines resolve to all of them), the
  service-account folder (on the emulator: a kubeconfig, as `$KUBECONFIG`, instead of a
  token; a node agent's pods have the API server's projected volume there) and its own
  termination-message file at `terminationMessagePath`.
- Init containers run one after another, each to completion, before the containers
  start (`PodRuntime._initialize`). One that fails is restarted with the same backoff
  (restartPolicy Always or OnFailure: `CrashLoopBackOff`, `lastState`, `restartCount`)
  or, with Never, fails the pod; their states and termination messages are in
  `initContainerStatuses`, the containers wait as `PodInitializing` and the pod's
  `Initialized` condition is False (`ContainersNotInitialized`) meanwhile.
- Stop: a preStop `sleep` hook, then SIGTERM to the container's PID 1, SIGKILL to its
  whole PID namespace once the grace period (the hook's time included) is over.
  Restarts (restartPolicy Always, OnFailure on failure) back off exponentially from
  `restart_backoff_s`; liveness and startup failures restart too.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import json
import os
import shutil
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.support.kube.network import HOST_CONF
from tests.support.kube.podspec import (
    ConfigError,
    Obj,
    Tokens,
    command_line,
    container_env,
    volume_files,
)
from tests.support.kube.probes import run_probe, setting

PODEXEC = Path(__file__).with_name("podexec.py")
REPO_ROOT = Path(__file__).resolve().parents[3]
SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
MESSAGE_LIMIT = 4096
FALLBACK_LOG_LIMIT = 2048
# What the runtime images set (docker/Dockerfile.*); PATH gets the local venv first.
IMAGE_ENV = {
    "PYTHONDONTWRITEBYTECODE": "1",
    "PYTHONUNBUFFERED": "1",
    "HOME": "/tmp",
    "XDG_CACHE_HOME": "/tmp/.cache",
    "NUMBA_CACHE_DIR": "/tmp/numba-cache",
}
READ_ONLY_VOLUMES = ("configMap", "secret", "downwardAPI", "projected")


def tool(name: str) -> str:
    """The absolute path of a system tool (util-linux), or the bare name if not found."""
    return shutil.which(name) or name


# The container's namespaces: private mounts, its own PID 1 (whose death kills the rest)
# and hostname. `setpriv --pdeathsig` kills unshare when the kubelet's thread dies, and
# unshare's `--kill-child` then kills PID 1.
LAUNCH_NAMESPACES = (
    tool("setpriv"), "--pdeathsig", "KILL", "--",
    tool("unshare"), "--mount", "--propagation", "private", "--pid", "--fork",
    "--kill-child", "--mount-proc", "--uts",
)  # fmt: skip


def utc_now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class Node:
    """What the kubelet gives every pod: folders, credentials, lookups and settings."""

    name: str
    workdir: Path
    # The pods' kubeconfig (service account), or None where the API server mounts their
    # service-account folder (a projected volume whose token comes from `tokens`).
    kubeconfig: dict[str, Any] | None
    config_maps: Callable[[str, str], Obj | None]
    secrets: Callable[[str, str], Obj | None]
    log: Callable[[str], None]
    extra_env: dict[str, str] = field(default_factory=dict)
    restart_backoff_s: float = 0.5
    tokens: Tokens = None
    max_backoff_s: float = 8.0
    python: str = sys.executable

    @property
    def created_record(self) -> Path:
        """Where launchers record the mount points they had to create on the host."""
        return self.workdir / "created-mount-points.jsonl"

    def code_under_tmp(self) -> list[str]:
        """The host folders the containers' programs come from (this checkout, the venv)
        where they lie under /tmp, which each container gets a private one of (or a
        volume): they are bound into it again at the same paths, as an image carries them."""
        found = {str(REPO_ROOT), sys.prefix, os.path.dirname(os.path.dirname(self.python))}
        tmp = Path("/tmp").resolve()
        return sorted(p for p in found if Path(p).resolve().is_relative_to(tmp))

    def base_env(self) -> dict[str, str]:
        venv = os.path.dirname(self.python)
        path = f"{venv}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
        return {"PATH": path, **IMAGE_ENV}


class Container:
    """One container of a pod: its process (re)starts, probes and reported status. An
    init container (`init`) runs until it exits 0, has no probes, and is restarted only
    after a failure (unless the pod's restartPolicy is Never)."""

    def __init__(self, pod: PodRuntime, spec: Obj, *, init: bool = False) -> None:
        self.pod, self.spec, self.name, self.init = pod, spec, spec["name"], init
        self.dir = pod.dir / "containers" / self.name
        self.log_path = pod.node.workdir / "logs" / f"{pod.namespace}_{pod.name}_{self.name}.log"
        self.message_path = self.dir / "termination-log"
        self.process: asyncio.subprocess.Process | None = None
        self.env: dict[str, str] = {}
        self.restart_count = 0
        self.instances = 0
        self.ready = self.started = self.done = False
        self.state: Obj = {"waiting": {"reason": "ContainerCreating"}}
        self.last_state: Obj = {}
        self.exit_code: int | None = None
        self.problem = ""  # the latest probe failure or start problem, for diagnostics
        self.ended = ""  # why the last run ended, for diagnostics
        self._kill_reason = ""

    # -- life cycle -----------------------------------------------------------------------

    async def run(self, volumes: dict[str, Path]) -> None:
        backoff = self.pod.node.restart_backoff_s
        while not self.pod.stopping:
            try:
                spec_path = self._launch_spec(volumes)
            except ConfigError as exc:
                waiting = {"reason": "CreateContainerConfigError", "message": str(exc)}
                self._set_state({"waiting": waiting}, problem=str(exc))
                await self.pod.sleep(1.0)
                continue
            started = time.monotonic()
            terminated = await self._run_once(spec_path)
            if self.pod.stopping or not self._restarts(terminated["exitCode"]):
                self._set_state({"terminated": terminated})
                break
            if time.monotonic() - started > 10.0:
                backoff = self.pod.node.restart_backoff_s
            self.last_state = {"terminated": terminated}
            reason = f"back-off {backoff:g}s restarting failed container {self.name}"
            self._set_state({"waiting": {"reason": "CrashLoopBackOff", "message": reason}})
            await self.pod.sleep(backoff)
            backoff = min(backoff * 2, self.pod.node.max_backoff_s)
            self.restart_count += 1
        self.done = True
        self.pod.changed()

    def _restarts(self, code: int) -> bool:
        policy = self.pod.spec.get("restartPolicy") or "Always"
        if self.init:
            return code != 0 and policy != "Never"
        return policy == "Always" or (policy == "OnFailure" and code != 0)

    async def _run_once(self, spec_path: Path) -> Obj:
        """Run the container once; its `terminated` state."""
        self.message_path.write_bytes(b"")
        with self.log_path.open("ab") as log:
            log.write(f"[kubelet {utc_now()}] start #{self.instances}\n".encode())
            log.flush()
            self.process = process = await asyncio.create_subprocess_exec(
                *LAUNCH_NAMESPACES,
                "--",
                self.pod.node.python,
                "-I",
                "-S",
                str(PODEXEC),
                str(spec_path),
                stdin=asyncio.subprocess.DEVNULL,
                stdout=log,
                stderr=asyncio.subprocess.STDOUT,
                start_new_session=True,
            )
        self.instances += 1
        started_at = utc_now()
        self._set_state({"running": {"startedAt": started_at}}, problem="")
        self.pod.node.log(f"{self.pod.key}/{self.name}: started pid {process.pid}")
        if self.pod.stopping:  # stopped while it was being started
            await self.stop(0.0, "pod stopping")
        probes = None if self.init else asyncio.create_task(self._probe())
        code = await process.wait()
        if probes is not None:
            probes.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await probes
        self.exit_code = code = code if code >= 0 else 128 - code  # killed by signal -code
        self.ended = f"exit code {code}" + (f" ({self._kill_reason})" if self._kill_reason else "")
        self._kill_reason = ""
        self.pod.node.log(f"{self.pod.key}/{self.name}: {self.ended}")
        self.ready = self.started = False
        self.pod.changed()
        return {
            "exitCode": code,
            "reason": "Completed" if code == 0 else "Error",
            "message": self._message(code),
            "startedAt": started_at,
            "finishedAt": utc_now(),
            "containerID": f"process://{process.pid}",
        }

    def _message(self, code: int) -> str:
        """The termination message, truncated as Kubernetes does; with
        `FallbackToLogsOnError`, the log's tail when the file is empty and it failed."""
        text = self.message_path.read_bytes()[:MESSAGE_LIMIT]
        policy = self.spec.get("terminationMessagePolicy") or "File"
        if not text and code != 0 and policy == "FallbackToLogsOnError":
            text = self.log_path.read_bytes()[-FALLBACK_LOG_LIMIT:]
        return text.decode(errors="replace")

    async def stop(self, grace_s: float, why: str = "") -> None:
        """SIGTERM to the container's PID 1, SIGKILL to its PID namespace after grace_s."""
        process = self.process
        if process is None or process.returncode is not None:
            return
        if why:
            self._kill_reason = why
            self.pod.node.log(f"{self.pod.key}/{self.name}: stopping ({why})")
        # A preStop `sleep` runs first, inside the grace period (other hooks: not emulated).
        pause = ((self.spec.get("lifecycle") or {}).get("preStop") or {}).get("sleep") or {}
        if pause:
            started = time.monotonic()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(
                    asyncio.shield(process.wait()), min(grace_s, pause["seconds"])
                )
            grace_s = max(0.0, grace_s - (time.monotonic() - started))
        pid1 = await self._pid1(process.pid)
        if pid1 is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid1, signal.SIGTERM)
        try:
            await asyncio.wait_for(asyncio.shield(process.wait()), grace_s)
        except TimeoutError:
            self.pod.node.log(f"{self.pod.key}/{self.name}: SIGKILL after {grace_s:g} s")
            target = pid1 if pid1 is not None else process.pid
            with contextlib.suppress(ProcessLookupError):
                os.kill(target, signal.SIGKILL)
            await process.wait()

    @staticmethod
    async def _pid1(unshare_pid: int) -> int | None:
        """The container's PID 1 (unshare's only child), once unshare has forked it."""
        children = Path(f"/proc/{unshare_pid}/task/{unshare_pid}/children")
        for _ in range(50):
            try:
                found = children.read_text().split()
            except OSError:
                return None
            if found:
                return int(found[0])
            await asyncio.sleep(0.02)
        return None

    # -- the launch spec ------------------------------------------------------------------

    def _launch_spec(self, volumes: dict[str, Path]) -> Path:
        pod, node = self.pod, self.pod.node
        namespace = pod.namespace
        base = node.base_env()
        if pod.service_account:
            base["KUBECONFIG"] = f"{SERVICE_ACCOUNT_DIR}/kubeconfig"
        base.update(HOSTNAME=pod.name[:63], **node.extra_env)
        self.env = container_env(
            pod.object,
            self.spec,
            base,
            lambda n: node.config_maps(namespace, n),
            lambda n: node.secrets(namespace, n),
        )
        argv = command_line(self.spec, self.env)
        (self.dir / "tmp").mkdir(parents=True, exist_ok=True)
        self.message_path.touch()
        spec = {
            "argv": argv,
            "env": self.env,
            "cwd": self.spec.get("workingDir") or "/tmp",
            "hostname": pod.name[:63],
            "mounts": self._mounts(volumes),
            "created": str(node.created_record),
            "terminationMessageFile": str(self.message_path),
        }
        path = self.dir / f"launch-{self.instances}.json"
        path.write_text(json.dumps(spec, indent=1))
        return path

    def _mounts(self, volumes: dict[str, Path]) -> list[dict[str, Any]]:
        by_name = {v["name"]: v for v in self.pod.spec.get("volumes") or []}
        mounts = []
        targets = {m["mountPath"].rstrip("/") for m in self.spec.get("volumeMounts") or []}
        if "/tmp" not in targets:
            mounts.append({"source": str(self.dir / "tmp"), "target": "/tmp"})
        mounts.extend({"source": p, "target": p} for p in self.pod.node.code_under_tmp())
        for mount in self.spec.get("volumeMounts") or []:
            volume = by_name.get(mount["name"])
            if volume is None or mount["name"] not in volumes:
                raise ConfigError(f"volumeMount {mount['name']!r} names no volume of the pod")
            source = volumes[mount["name"]] / mount.get("subPath", "")
            read_only = bool(mount.get("readOnly")) or any(k in volume for k in READ_ONLY_VOLUMES)
            target = mount["mountPath"]
            mounts.append({"source": str(source), "target": target, "readOnly": read_only})
        mounts.append({"source": str(self.pod.hosts_path), "target": "/etc/hosts"})
        host_conf = str(self.pod.dir / "host.conf")
        mounts.append({"source": host_conf, "target": "/etc/host.conf", "readOnly": True})
        if self.pod.service_account:
            account = str(self.pod.dir / "serviceaccount")
            mounts.append({"source": account, "target": SERVICE_ACCOUNT_DIR, "readOnly": True})
        path = self.spec.get("terminationMessagePath") or "/dev/termination-log"
        mounts.append({"source": str(self.message_path), "target": path})
        return sorted(mounts, key=lambda m: len(Path(m["target"]).parts))

    # -- probes ---------------------------------------------------------------------------

    async def _probe(self) -> None:
        startup = self.spec.get("startupProbe")
        if startup is not None and not await self._watch("startup", startup):
            await self.stop(self.pod.grace_s, "startup probe failed")
            return
        self.started = True
        self.pod.changed()
        tasks = []
        if (readiness := self.spec.get("readinessProbe")) is not None:
            tasks.append(self._watch("readiness", readiness))
        else:
            self._set_ready(True)
        if (liveness := self.spec.get("livenessProbe")) is not None:
            tasks.append(self._watch("liveness", liveness))
        await asyncio.gather(*tasks)

    async def _watch(self, kind: str, probe: Obj) -> bool:
        """Run a probe every period. Readiness runs until cancelled; startup returns True
        on success; startup and liveness return False (and liveness restarts the
        container) once failureThreshold attempts in a row failed."""
        await asyncio.sleep(setting(probe, "initialDelaySeconds"))
        successes = failures = 0
        while True:
            pid = None
            if "exec" in probe and self.process is not None:
                pid = await self._pid1(self.process.pid)
            ok, message = await run_probe(probe, self.pod.object, self.pod.ip, pid, self.env)
            successes, failures = (successes + 1, 0) if ok else (0, failures + 1)
            if not ok:
                self.problem = f"{kind} probe failed: {message}"
            if kind == "startup" and ok:
                return True
            if kind == "readiness" and successes >= setting(probe, "successThreshold"):
                self._set_ready(True)
            if failures >= setting(probe, "failureThreshold"):
                if kind == "readiness":
                    self._set_ready(False)
                elif kind == "liveness":
                    await self.stop(self.pod.grace_s, f"{self.problem}; restarting")
                    return False
                else:
                    return False
            await asyncio.sleep(setting(probe, "periodSeconds"))

    def _set_ready(self, ready: bool) -> None:
        if ready != self.ready:
            self.ready = ready
            why = "" if ready else f" ({self.problem})"
            self.pod.node.log(f"{self.pod.key}/{self.name}: {'' if ready else 'not '}ready{why}")
            self.pod.changed()

    def _set_state(self, state: Obj, problem: str | None = None) -> None:
        self.state = state
        if problem is not None:
            self.problem = problem
        self.pod.changed()

    def status(self) -> Obj:
        status = {
            "name": self.name,
            "image": self.spec.get("image", ""),
            "imageID": "",
            "ready": self.ready,
            "started": self.started,
            "restartCount": self.restart_count,
            "state": self.state,
        }
        if self.process is not None:
            status["containerID"] = f"process://{self.process.pid}"
        if self.last_state:
            status["lastState"] = self.last_state
        return status


class PodRuntime:
    """A pod this node runs: its folder, IP, volumes and containers."""

    def __init__(self, node: Node, pod: Obj, ip: str, changed: Callable[[], None]) -> None:
        meta = pod["metadata"]
        self.node, self.ip, self.changed = node, ip, changed
        self.namespace, self.name, self.uid = meta["namespace"], meta["name"], meta["uid"]
        self.key = f"{self.namespace}/{self.name}"
        self.object = pod
        self.spec: Obj = pod.get("spec") or {}
        self.dir = node.workdir / "pods" / f"{self.namespace}_{self.name}_{self.uid[:8]}"
        self.hosts_path = self.dir / "hosts"
        self.service_account = node.kubeconfig is not None and (
            self.spec.get("automountServiceAccountToken", True) is not False
        )
        self.grace_s = float(self.spec.get("terminationGracePeriodSeconds", 30))
        self.containers = [Container(self, c) for c in self.spec.get("containers") or []]
        self.init_containers = [
            Container(self, c, init=True) for c in self.spec.get("initContainers") or []
        ]
        if self.init_containers:
            for container in self.containers:
                container.state = {"waiting": {"reason": "PodInitializing"}}
        self.init_failed = False  # an init container failed and the pod does not restart it
        self.stopping = False
        self.start_time = utc_now()
        self.pending = ""  # why the pod cannot start yet
        self._stop_event = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._conditions: dict[str, tuple[str, str]] = {}

    def start(self, hosts_text: str) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        (self.node.workdir / "logs").mkdir(parents=True, exist_ok=True)
        self.hosts_path.write_text(hosts_text)
        (self.dir / "host.conf").write_text(HOST_CONF)
        status = {**(self.object.get("status") or {}), "podIP": self.ip, "hostIP": "127.0.0.1"}
        self.object = {**self.object, "status": status}
        self._task = asyncio.create_task(self._run())

    def update_hosts(self, text: str) -> None:
        """Rewrite the hosts file in place (same inode: containers have it bind-mounted),
        padded so that it never shrinks under a reader."""
        with contextlib.suppress(FileNotFoundError), self.hosts_path.open("r+") as f:
            old = f.read()
            if old.rstrip("\n") == text.rstrip("\n"):
                return
            f.seek(0)
            f.write(text + "\n" * max(0, len(old) - len(text)))

    async def sleep(self, seconds: float) -> None:
        """Sleep, returning early when the pod is being stopped."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stop_event.wait(), seconds)

    async def _run(self) -> None:
        while not self.stopping:
            try:
                volumes = self._prepare_volumes()
                break
            except ConfigError as exc:
                if exc.args[0] != self.pending:
                    self.node.log(f"{self.key}: waiting: {exc}")
                self.pending = str(exc)
                self.changed()
                await self.sleep(0.5)
        else:
            return
        self.pending = ""
        if await self._initialize(volumes):
            await asyncio.gather(*(c.run(volumes) for c in self.containers))

    async def _initialize(self, volumes: dict[str, Path]) -> bool:
        """Run the init containers in order, each to completion (restarting a failed one
        as the pod's restartPolicy says); False when the pod stops or fails first."""
        for container in self.init_containers:
            await container.run(volumes)
            if self.stopping:
                return False
            if container.exit_code != 0:  # restartPolicy Never: the pod has failed
                self.node.log(f"{self.key}: init container {container.name} failed")
                self.init_failed = True
                self.changed()
                return False
        return True

    @property
    def initialized(self) -> bool:
        """Every init container has run to completion."""
        return not self.pending and all(c.done and c.exit_code == 0 for c in self.init_containers)

    def _prepare_volumes(self) -> dict[str, Path]:
        node, out = self.node, {}
        for volume in self.spec.get("volumes") or []:
            name = volume["name"]
            files = volume_files(
                self.object,
                volume,
                lambda n: node.config_maps(self.namespace, n),
                lambda n: node.secrets(self.namespace, n),
                node.tokens,
            )
            folder = self.dir / "volumes" / name
            if files is not None:
                shutil.rmtree(folder, ignore_errors=True)
                for relative, text in files.items():
                    (folder / relative).parent.mkdir(parents=True, exist_ok=True)
                    (folder / relative).write_text(text)
                folder.mkdir(parents=True, exist_ok=True)
            elif "emptyDir" in volume:
                folder.mkdir(parents=True, exist_ok=True)
            elif "hostPath" in volume:
                folder = self._host_path(volume["hostPath"])
            else:
                kinds = sorted(set(volume) - {"name"})
                raise ConfigError(f"volume {name!r}: {kinds} is not emulated by the kubelet")
            out[name] = folder
        if self.service_account:
            account = self.dir / "serviceaccount"
            account.mkdir(exist_ok=True)
            config = json.loads(json.dumps(self.node.kubeconfig or {}))
            for context in config.get("contexts") or []:
                context["context"]["namespace"] = self.namespace
            (account / "kubeconfig").write_text(json.dumps(config))
            (account / "namespace").write_text(self.namespace)
        return out

    @staticmethod
    def _host_path(source: Obj) -> Path:
        path, kind = Path(source["path"]), source.get("type") or ""
        if kind == "DirectoryOrCreate":
            path.mkdir(parents=True, exist_ok=True)
        elif kind == "FileOrCreate":
            path.parent.mkdir(parents=True, exist_ok=True)
            path.touch()
        if not path.exists():
            raise ConfigError(f"hostPath {path} does not exist")
        return path

    async def stop(self, grace_s: float | None = None) -> None:
        """Stop every container (SIGTERM, SIGKILL after the grace period) and wait."""
        self.stopping = True
        self._stop_event.set()
        grace = self.grace_s if grace_s is None else grace_s
        every = [*self.init_containers, *self.containers]
        await asyncio.gather(*(c.stop(grace, "pod stopping") for c in every))
        if self._task is not None:
            await self._task

    @property
    def finished(self) -> bool:
        return self._task is not None and self._task.done()

    # -- status ---------------------------------------------------------------------------

    def phase(self) -> str:
        if self.init_failed:
            return "Failed"
        if self.containers and all(c.done for c in self.containers):
            codes = [c.exit_code for c in self.containers]
            return "Succeeded" if all(code == 0 for code in codes) else "Failed"
        if self.containers and all(c.instances for c in self.containers):
            return "Running"
        return "Pending"

    def status(self) -> Obj:
        ready = bool(self.containers) and all(c.ready for c in self.containers)
        ready = ready and not self.stopping
        conditions = [
            self._condition("PodScheduled", True),
            self._condition("Initialized", self.initialized),
            self._condition("ContainersReady", ready),
            self._condition("Ready", ready),
        ]
        waiting = [c.name for c in self.init_containers if not (c.done and c.exit_code == 0)]
        if waiting and not self.pending:
            conditions[1]["reason"] = "ContainersNotInitialized"
            conditions[1]["message"] = f"containers with incomplete status: [{' '.join(waiting)}]"
        status: Obj = {
            "phase": self.phase(),
            "conditions": conditions,
            "hostIP": "127.0.0.1",
            "hostIPs": [{"ip": "127.0.0.1"}],
            "podIP": self.ip,
            "podIPs": [{"ip": self.ip}],
            "startTime": self.start_time,
            "containerStatuses": [c.status() for c in self.containers],
        }
        if self.init_containers:
            status["initContainerStatuses"] = [c.status() for c in self.init_containers]
        if self.pending:
            status["message"] = self.pending
            status["reason"] = "ContainerCreating"
        return status

    def _condition(self, type_: str, value: bool) -> Obj:
        text = "True" if value else "False"
        old = self._conditions.get(type_)
        if old is None or old[0] != text:
            self._conditions[type_] = (text, utc_now())
        return {"type": type_, "status": text, "lastTransitionTime": self._conditions[type_][1]}
