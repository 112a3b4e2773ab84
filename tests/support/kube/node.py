"""The process kubelet as the node agent of a real control plane, as a program:

    python -m tests.support.kube.node --kubeconfig NODE.kubeconfig \\
        --proxy-kubeconfig KUBE-PROXY.kubeconfig --workdir DIR \\
        --service-network 127.3.0.0/20 [--pod-network 198.18.0.0/20] [--name local] \\
        [--cpu 8] [--memory 16Gi] [--serving-cert C --serving-key K --client-ca CA]

`scripts/cluster.py up` starts it after the control plane (docs/e2e.md, "The node
agent"); it runs until SIGTERM or SIGINT, then stops its pods (SIGTERM, their grace
period, SIGKILL) and exits. Its log is `DIR/logs/kubelet.log`, the containers' beside it.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from pathlib import Path
from types import FrameType

from tests.support.kube.client import ClusterClient
from tests.support.kube.kubelet import NODE_NAME, ProcessKubelet, default_capacity


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--kubeconfig", required=True, help="the node's (system:node:<name>)")
    p.add_argument("--proxy-kubeconfig", required=True, help="kube-proxy's (system:kube-proxy)")
    p.add_argument("--workdir", required=True, help="pods' folders and logs")
    p.add_argument("--service-network", required=True, help="the apiserver's service CIDR")
    p.add_argument(
        "--pod-network", default="198.18.0.0/20", help="pod IPs (routed to lo while it runs)"
    )
    p.add_argument("--name", default=NODE_NAME, help="the Node's name")
    p.add_argument("--cpu", help="the Node's CPU capacity (default: this machine's)")
    p.add_argument("--memory", help="the Node's memory capacity (default: this machine's)")
    p.add_argument("--serving-cert", help="the kubelet API's TLS certificate (kubectl logs)")
    p.add_argument("--serving-key", help="its key")
    p.add_argument("--client-ca", help="the CA of the clients it serves (the apiserver's)")
    args = p.parse_args()
    tls = (args.serving_cert, args.serving_key, args.client_ca)
    serving = (Path(tls[0]), Path(tls[1]), Path(tls[2])) if all(tls) else None
    capacity = default_capacity()
    capacity.update({k: v for k, v in (("cpu", args.cpu), ("memory", args.memory)) if v})
    done = threading.Event()

    def stop(_signum: int, _frame: FrameType | None) -> None:
        done.set()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    client, proxy = ClusterClient(args.kubeconfig), ClusterClient(args.proxy_kubeconfig)
    try:
        with ProcessKubelet(
            client,
            args.workdir,
            proxy_api=proxy,
            serving_tls=serving,
            node_name=args.name,
            capacity=capacity,
            pod_network=args.pod_network,
            service_network=args.service_network,
            # The local Python environment stands for the images, its PYTHONPATH (this
            # checkout, from `scripts/cluster.py`) too: the pods run this checkout's code.
            extra_env={k: v for k, v in os.environ.items() if k == "PYTHONPATH"},
        ):
            while not done.wait(1.0):
                pass
    finally:
        client.close()
        proxy.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
