"""`KubeEmulator`: the emulated API server on 127.0.0.1, served by its own event loop in a
background thread, with a kubeconfig and a small blocking API for tests.

The loop serving the emulator is never the one under test: kopf's `KopfRunner`, kubectl
subprocesses and blocking clients all reach it over HTTP. The blocking API runs store
operations on that loop, so they are atomic and produce the same watch events as API calls.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
import os
import subprocess
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any, Self, TypeVar

import aiohttp.web
import yaml

from tests.support.kube.kinds import ApiError
from tests.support.kube.kubectl import kubectl
from tests.support.kube.server import ApiServer
from tests.support.kube.store import Store

T = TypeVar("T")
PATCH_TYPES = {
    "merge": "application/merge-patch+json",
    "json": "application/json-patch+json",
    "strategic": "application/strategic-merge-patch+json",
    "apply": "application/apply-patch+yaml",
}


def load_yaml(source: Mapping[str, Any] | str | Path) -> list[dict[str, Any]]:
    """Documents from a dict, a YAML file path, or YAML text."""
    if isinstance(source, Mapping):
        return [dict(source)]
    text = source.read_text() if isinstance(source, Path) else source
    return [doc for doc in yaml.safe_load_all(text) if doc]


class KubeEmulator:
    """A Kubernetes API emulator for one test (or module); the `kube` fixture of
    tests/conftest.py gives a fresh one per test.

    A test of a kopf operator::

        def test_pipeline_gets_a_router(kube):
            kube.register_crd(ROOT / "helm/sloline-crds/files/predictionpipelines.sloline.dev.yaml")
            with kube.as_default(), KopfRunner(
                ["run", "-A", "--standalone", "-m", "sloline.operator"]
            ) as runner:
                kube.create(yaml_text_or_dict)
                kube.wait_for("deployments", "default", "p-router")
            assert runner.exit_code == 0, runner.output

    `as_default()` must enclose the runner: kopf's default login (`login_via_client`) and
    the kubernetes client read the default kubeconfig, which it points here. The operator
    needs no login handler of its own. Leave the runner before the emulator stops.

    `server` is the kmock handler: `list(kube.server)` are the requests it got, and kmock
    reactions on it inject faults. Resources are named as in kubectl (`deploy`,
    `Deployment`, `deployments.apps`, ...); `namespace` is None for cluster-scoped objects
    (and for all namespaces in `list`).
    """

    def __init__(
        self,
        workdir: str | Path | None = None,
        namespaces: tuple[str, ...] = ("default", "kube-system", "kube-public"),
    ) -> None:
        self._tempdir = tempfile.TemporaryDirectory(prefix="kube-") if workdir is None else None
        self.workdir = Path(workdir or self._tempdir.name)  # type: ignore[union-attr]
        self.kubeconfig_path = self.workdir / "kubeconfig"
        self.url = ""
        self._namespaces = namespaces
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping: asyncio.Event | None = None
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name="kube-emulator", daemon=True)
        self._error: BaseException | None = None
        self.server: ApiServer

    # -- lifecycle ----------------------------------------------------------------------------

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop(check=exc is None)

    def start(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self._thread.start()
        if not self._ready.wait(10) or self._error is not None:
            raise RuntimeError("the Kubernetes emulator did not start") from self._error
        context = {"cluster": "emulator", "user": "emulator", "namespace": "default"}
        self.kubeconfig_path.write_text(
            json.dumps(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "current-context": "emulator",
                    "clusters": [{"name": "emulator", "cluster": {"server": self.url}}],
                    "users": [{"name": "emulator", "user": {}}],
                    "contexts": [{"name": "emulator", "context": context}],
                }
            )
        )
        for namespace in self._namespaces:
            self.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})

    def stop(self, *, check: bool = True) -> None:
        """Stop serving; with `check`, raise the first emulator failure (a bug, not an API
        error) so that it cannot hide behind a client's retries."""
        if self._loop is not None and self._stopping is not None:
            self._loop.call_soon_threadsafe(self._stopping.set)
            self._thread.join(10)
        if self._tempdir is not None:
            self._tempdir.cleanup()
        if check and self.server.failures:
            failure = self.server.failures[0]
            raise AssertionError(
                f"the Kubernetes emulator failed {len(self.server.failures)} request(s); the "
                "first:\n" + "".join(traceback.format_exception(failure))
            )

    def _run(self) -> None:
        try:
            asyncio.run(self._serve())
        except BaseException as e:  # reported by start()
            self._error = e
            self._ready.set()

    async def _serve(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stopping = asyncio.Event()
        self.server = ApiServer()
        async with self.server:
            # handler_cancellation ends the watches of clients that hang up.
            server = aiohttp.web.Server(self.server, handler_cancellation=True, access_log=None)
            runner = aiohttp.web.ServerRunner(server, handle_signals=False, shutdown_timeout=1.0)
            await runner.setup()
            site = aiohttp.web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            host, port = runner.addresses[0][:2]
            self.url = f"http://{host}:{port}"
            self._ready.set()
            await self._stopping.wait()
            self.server.store.close()  # ends the watches, so shutdown does not wait for them
            await runner.cleanup()

    def call(self, fn: Callable[[Store], T]) -> T:
        """Run `fn(store)` on the emulator's loop and return a deep copy of its result."""
        assert self._loop is not None, "the emulator is not started"

        async def run() -> T:
            return copy.deepcopy(fn(self.server.store))

        return asyncio.run_coroutine_threadsafe(run(), self._loop).result(timeout=10)

    # -- the blocking API ---------------------------------------------------------------------

    def create(self, obj: Mapping[str, Any] | str) -> dict[str, Any]:
        """Create one object (a dict or a YAML document); its namespace defaults to default."""
        (body,) = load_yaml(obj)
        namespace = body.get("metadata", {}).get("namespace") or "default"
        return self.call(lambda s: s.create(s.kinds.kind_of(body), namespace, body))

    def load(self, source: str | Path) -> list[dict[str, Any]]:
        """Create every document of a YAML file (Path) or text, in order."""
        return [self.create(doc) for doc in load_yaml(source)]

    def register_crd(self, crd: Mapping[str, Any] | str | Path) -> dict[str, Any]:
        """Create a CustomResourceDefinition (dict, YAML text or file): as on a cluster, its
        resources are then served and discoverable, e.g. for `kubectl get <plural>`."""
        (body,) = load_yaml(crd)
        return self.create(body)

    def get(self, resource: str, namespace: str | None, name: str) -> dict[str, Any]:
        """The object, or ApiError (status 404) where it does not exist."""
        return self.call(lambda s: s.get(s.kinds.find(resource), namespace, name))

    def find(self, resource: str, namespace: str | None, name: str) -> dict[str, Any] | None:
        """The object, or None where it does not exist."""
        try:
            return self.get(resource, namespace, name)
        except ApiError as e:
            if e.status != 404:
                raise
            return None

    def list(
        self,
        resource: str,
        namespace: str | None = None,
        *,
        labels: str | None = None,
        fields: str | None = None,
    ) -> list[dict[str, Any]]:
        """Objects ordered by namespace and name, filtered as by `kubectl get -l ... `."""
        from tests.support.kube.selectors import field_selector, label_selector

        by_labels, by_fields = label_selector(labels), field_selector(fields)
        return self.call(
            lambda s: s.list(
                s.kinds.find(resource), namespace, lambda o: by_labels(o) and by_fields(o)
            )
        )

    def patch(
        self,
        resource: str,
        namespace: str | None,
        name: str,
        patch: Any,
        *,
        subresource: str | None = None,
        patch_type: str = "merge",
    ) -> dict[str, Any]:
        """Patch (`merge`, `json`, `strategic` or `apply`) the object or its `status` or
        `scale` subresource, as a PATCH request would."""
        content_type = PATCH_TYPES[patch_type]
        return self.call(
            lambda s: s.patch(
                s.kinds.find(resource), namespace, name, patch, content_type, subresource
            )
        )

    def replace(self, obj: Mapping[str, Any], *, subresource: str | None = None) -> dict[str, Any]:
        """PUT the object (with its resourceVersion, if any, as the precondition)."""
        meta = obj["metadata"]
        return self.call(
            lambda s: s.replace(
                s.kinds.kind_of(obj), meta.get("namespace"), meta["name"], obj, subresource
            )
        )

    def delete(
        self,
        resource: str,
        namespace: str | None,
        name: str,
        *,
        propagation: str | None = None,
    ) -> dict[str, Any]:
        """Delete as DELETE does: with finalizers it only marks the object deleted."""
        options = {"propagationPolicy": propagation} if propagation else None
        return self.call(lambda s: s.delete(s.kinds.find(resource), namespace, name, options))

    def history(self, resource: str, namespace: str | None, name: str) -> list[Any]:
        """Every stored version of the object, oldest first; None marks a deletion."""

        def versions(s: Store) -> list[Any]:
            kind = s.kinds.find(resource)
            found = s.objects[kind.resource, namespace if kind.namespaced else None, name]
            return [None if v is None else v.raw for v in found.history]

        return self.call(versions)

    def wait_for(
        self,
        resource: str,
        namespace: str | None,
        name: str,
        condition: Callable[[dict[str, Any]], bool] | None = None,
        *,
        timeout_s: float = 10.0,
    ) -> dict[str, Any]:
        """Poll until the object exists and `condition(obj)` (if given) holds; return it."""
        deadline, last = time.monotonic() + timeout_s, None
        while time.monotonic() < deadline:
            last = self.find(resource, namespace, name)
            if last is not None and (condition is None or condition(last)):
                return last
            time.sleep(0.02)
        raise TimeoutError(
            f"{resource} {namespace}/{name} did not satisfy the condition in "
            f"{timeout_s} s; last seen: {json.dumps(last, indent=1)}"
        )

    def wait_gone(
        self, resource: str, namespace: str | None, name: str, *, timeout_s: float = 10.0
    ) -> None:
        """Poll until the object does not exist."""
        deadline = time.monotonic() + timeout_s
        while self.find(resource, namespace, name) is not None:
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"{resource} {namespace}/{name} still exists after {timeout_s} s"
                )
            time.sleep(0.02)

    # -- clients ------------------------------------------------------------------------------

    def kubectl(
        self, *args: str, input: str | None = None, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        """Real kubectl against this emulator (see `tests.support.kube.kubectl`)."""
        return kubectl(*args, kubeconfig=self.kubeconfig_path, input=input, check=check)

    def api_client(self) -> Any:
        """A `kubernetes.client.ApiClient` for this emulator, leaving global config alone."""
        import kubernetes

        configuration = kubernetes.client.Configuration()
        kubernetes.config.load_kube_config(
            config_file=str(self.kubeconfig_path), client_configuration=configuration
        )
        return kubernetes.client.ApiClient(configuration)

    @contextlib.contextmanager
    def as_default(self) -> Iterator[None]:
        """Make this emulator "the cluster" of the process for the block: `$KUBECONFIG`, the
        kubernetes client's default location and default configuration (it reads
        `$KUBECONFIG` once, at import), without in-cluster variables. kopf's default login
        (`login_via_client`) then connects here: operator tests need no login handler."""
        import kubernetes
        from kubernetes.config import kube_config

        names = ("KUBECONFIG", "KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT")
        saved_env = {name: os.environ.get(name) for name in names}
        saved_location = kube_config.KUBE_CONFIG_DEFAULT_LOCATION
        saved_configuration = kubernetes.client.Configuration.get_default_copy()
        os.environ["KUBECONFIG"] = kube_config.KUBE_CONFIG_DEFAULT_LOCATION = str(
            self.kubeconfig_path
        )
        os.environ.pop("KUBERNETES_SERVICE_HOST", None)
        os.environ.pop("KUBERNETES_SERVICE_PORT", None)
        kubernetes.config.load_kube_config(config_file=str(self.kubeconfig_path))
        try:
            yield
        finally:
            kube_config.KUBE_CONFIG_DEFAULT_LOCATION = saved_location
            kubernetes.client.Configuration.set_default(saved_configuration)
            for name, value in saved_env.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value
