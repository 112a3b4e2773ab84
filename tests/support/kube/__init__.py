"""A Kubernetes API emulator for the operator's tests: kopf, the kubernetes client and the
real kubectl run against it on 127.0.0.1 as against a cluster without nodes or controllers.

It is kmock 0.8's `KubernetesScaffold` (discovery, Status errors, the reaction DSL for fault
injection) plus what kopf and kubectl rely on and kmock lacks:

- `kinds.py`: the served resources (built-ins, and CRDs created through the API) and errors;
- `store.py`: resourceVersion / uid / generation / timestamps, finalizers and
  deletionTimestamp, 201 / 404 / 409 AlreadyExists / 409 Conflict / 422, PUT, the status and
  scale subresources, owner garbage collection, namespaces, CRDs that register their
  resources when created, and a watch from any resourceVersion without replay or loss;
- `patches.py`: merge, JSON (with `test`) and (approximate) strategic merge patches;
- `selectors.py`: label and field selectors;
- `server.py`: the HTTP routing and discovery;
- `harness.py`: `KubeEmulator`, which serves it from its own event loop in a thread and
  offers a kubeconfig, a blocking API, `kubectl(...)` and `as_default()` for kopf;
- `kubectl.py`: the real kubectl binary.

Pods, controllers, Services and ServiceMonitors come to life with the process kubelet
(`kubelet.py`, opt-in: `ProcessKubelet(emulator, workdir)`; docs/e2e.md); without it,
nothing runs. `Store.admission` holds mutating admission hooks (tests post-process what
clients write).

Not emulated by the API server itself: controllers (no pods from deployments, no
deployment status: the process kubelet's job), validating admission and schema validation
(OpenAPI is not served; use `--validate=false`), defaulting beyond
`spec.replicas` of workloads, field managers of server-side apply (treated as a patch),
`dryRun`, protobuf, Table output (kubectl falls back to its own columns), list paging
(`limit` returns everything), 410 Gone (all history is kept), multi-version CRD conversion,
graceful pod termination, and garbage collection of objects whose owners never existed.
"""

from tests.support.kube.harness import KubeEmulator, load_yaml
from tests.support.kube.kinds import ApiError
from tests.support.kube.kubectl import KubectlError, kubectl
from tests.support.kube.server import ApiServer

__all__ = ["ApiError", "ApiServer", "KubeEmulator", "KubectlError", "kubectl", "load_yaml"]
