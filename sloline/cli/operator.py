"""`sloline operator`: the Kubernetes operator (kopf; the `k8s` extra)."""

from __future__ import annotations

import argparse

from sloline.cli.flags import port


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("operator", help="run the Kubernetes operator (kopf; the `k8s` extra)")
    p.add_argument("--config", help="settings file (default: $SLOLINE_OPERATOR_CONFIG)")
    p.add_argument(
        "-n", "--namespace", action="append", default=[], help="serve this namespace (repeat)"
    )
    p.add_argument(
        "-A", "--all-namespaces", action="store_true", help="serve every namespace (default)"
    )
    p.add_argument("--metrics-port", type=port, default=8080, help="/metrics port; 0 = off")
    p.add_argument("--liveness", help="kopf's health endpoint, e.g. http://0.0.0.0:8081/healthz")
    p.add_argument(
        "--webhook-port",
        type=port,
        default=0,
        help="serve the admission webhook (HTTPS) on this port; 0 = off (default)",
    )
    p.add_argument(
        "--webhook-dns",
        action="append",
        default=[],
        metavar="NAME",
        help="a DNS name (or IP) of the webhook's certificate, e.g. the Service's "
        "<svc>.<ns>.svc (repeat; default: localhost)",
    )
    p.add_argument(
        "--webhook-configuration",
        default="",
        metavar="NAME",
        help="the ValidatingWebhookConfiguration whose caBundle gets the certificate's CA",
    )
    p.add_argument("--standalone", action="store_true", help="no peering with other operators")
    # Also accepted after the command; SUPPRESS keeps `sloline -v operator` working.
    p.add_argument(
        "-v", "--verbose", action="store_true", default=argparse.SUPPRESS, help="debug logging"
    )
    p.set_defaults(func=cmd_operator)


def cmd_operator(args: argparse.Namespace) -> int:
    import os
    import sys

    from sloline.cli import EXIT_FAILURE
    from sloline.operator.admission import PublishError
    from sloline.operator.run import WebhookOptions, run_operator
    from sloline.operator.settings import load_settings

    try:
        run_operator(
            load_settings(args.config),  # else $SLOLINE_OPERATOR_CONFIG, else the defaults
            kubeconfig=os.environ.get("KUBECONFIG") or None,
            namespaces=[] if args.all_namespaces else args.namespace,
            standalone=args.standalone,
            metrics_port=args.metrics_port,
            liveness_endpoint=args.liveness,
            webhook=WebhookOptions(
                args.webhook_port,
                tuple(args.webhook_dns or ["localhost"]),
                args.webhook_configuration,
            )
            if args.webhook_port
            else None,
        )
    except PublishError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_FAILURE
    return 0
