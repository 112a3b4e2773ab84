#!/usr/bin/env python3
"""Start and stop a real Kubernetes control plane on 127.0.0.1.

    scripts/cluster.py up       etcd, kube-apiserver, kube-controller-manager, kube-scheduler
                                and the process kubelet as the node agent (`--no-node`: none);
                                waits for /readyz and the Node's Ready, then prints
                                KUBECONFIG=<path> on its own line
    scripts/cluster.py status   pids, ports and resident memory of what `up` started
    scripts/cluster.py down     stops everything `up` started (pid files), removes its temp dir

The binaries come from scripts/kube/build.sh (.tools/kube/<version>/bin). Everything else
(certificates, service-account keys, etcd data, logs, kubeconfigs) lives in a fresh temp dir;
.tools/kube/cluster.json (or $SLOLINE_CLUSTER_STATE) records where, and the pids. Only one
cluster per record.

The node is the process kubelet (tests/support/kube/node.py, docs/e2e.md "The node
agent"): pods run as local processes on a /20 of 198.18.0.0/16 (a network it routes to
`lo` while it runs: EndpointSlices refuse loopback addresses), Services get cluster IPs in
a /20 of 127.3.0.0/16, on which its kube-proxy listens. It needs root, util-linux and
iproute2; without it (`--no-node`) pods are scheduled nowhere and stay Pending.
etcd listens on plain HTTP, loopback only. Certificates need `cryptography` (the project's
venv has it); `down` and `status` need only the standard library.
"""

# Printing is this script's interface; /healthz of the controller-manager/scheduler is
# checked without verifying their self-signed serving certificates.
# ruff: noqa: T201, S323

from __future__ import annotations

import argparse
import datetime as dt
import ipaddress
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
KUBE_VERSION = "v1.37.2"
BIN_DIR = ROOT / ".tools" / "kube" / KUBE_VERSION / "bin"
# $SLOLINE_CLUSTER_STATE moves the record, e.g. for a test's own throwaway control plane.
STATE = Path(os.environ.get("SLOLINE_CLUSTER_STATE") or ROOT / ".tools" / "kube" / "cluster.json")
# Each cluster takes a /20 of both (`networks()`): Services in loopback, so that the node
# agent's kube-proxy can listen on the cluster IPs; pods in the benchmarking range, which
# the node agent routes to lo while it runs (EndpointSlices refuse loopback addresses).
SERVICE_RANGE = "127.3.0.0/16"
POD_RANGE = "198.18.0.0/16"
NODE_NAME = "local"
KUBELET = "process-kubelet"
ISSUER = "https://kubernetes.default.svc.cluster.local"
ORDER = ["etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# --- certificates -------------------------------------------------------------------------


def networks() -> tuple[str, str]:
    """(service CIDR, pod CIDR): the first /20 of SERVICE_RANGE and POD_RANGE whose pod
    network no running node agent has routed, so that clusters side by side do not share
    addresses."""
    routed = set()
    if ip := shutil.which("ip"):
        shown = subprocess.run(
            [ip, "route", "show", "table", "local"], capture_output=True, text=True, check=False
        )
        routed = {line.split()[1] for line in shown.stdout.splitlines() if line.startswith("local")}
    services = ipaddress.ip_network(SERVICE_RANGE).subnets(new_prefix=20)
    pods = ipaddress.ip_network(POD_RANGE).subnets(new_prefix=20)
    for service, pod in zip(services, pods, strict=True):
        if str(pod) not in routed:
            return str(service), str(pod)
    raise SystemExit(f"every /20 of {POD_RANGE} is routed: too many clusters running")


def write_pki(d: Path, service_ip: str) -> None:
    """CA, apiserver serving cert, client certs per component, service-account key pair."""
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec, rsa
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    d.mkdir(parents=True)
    now = dt.datetime.now(dt.UTC) - dt.timedelta(minutes=5)
    later = now + dt.timedelta(days=2)

    def key_pem(key) -> bytes:
        return key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )

    def name(cn: str, org: str | None = None) -> x509.Name:
        attrs = [x509.NameAttribute(NameOID.COMMON_NAME, cn)]
        if org:
            attrs.append(x509.NameAttribute(NameOID.ORGANIZATION_NAME, org))
        return x509.Name(attrs)

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = name("sloline-cluster-ca")
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(later)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), False)
        .sign(ca_key, hashes.SHA256())
    )
    (d / "ca.crt").write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    (d / "ca.key").write_bytes(key_pem(ca_key))

    def leaf(file: str, cn: str, org: str | None, server: bool) -> None:
        key = ec.generate_private_key(ec.SECP256R1())
        usage = [ExtendedKeyUsageOID.SERVER_AUTH] if server else [ExtendedKeyUsageOID.CLIENT_AUTH]
        b = (
            x509.CertificateBuilder()
            .subject_name(name(cn, org))
            .issuer_name(ca_name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now)
            .not_valid_after(later)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage(usage), critical=False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), False
            )
        )
        if server:
            dns = ["localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc"]
            dns.append("kubernetes.default.svc.cluster.local")
            ips = [ipaddress.ip_address("127.0.0.1"), ipaddress.ip_address(service_ip)]
            sans = [x509.DNSName(n) for n in dns] + [x509.IPAddress(i) for i in ips]
            b = b.add_extension(x509.SubjectAlternativeName(sans), critical=False)
        cert = b.sign(ca_key, hashes.SHA256())
        (d / f"{file}.crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        (d / f"{file}.key").write_bytes(key_pem(key))

    leaf("apiserver", "kube-apiserver", None, server=True)
    leaf("apiserver-kubelet-client", "kube-apiserver-kubelet-client", "system:masters", False)
    leaf("admin", "kubernetes-admin", "system:masters", server=False)
    leaf("controller-manager", "system:kube-controller-manager", None, server=False)
    leaf("scheduler", "system:kube-scheduler", None, server=False)
    leaf("node", f"system:node:{NODE_NAME}", "system:nodes", server=False)
    leaf("kube-proxy", "system:kube-proxy", None, server=False)
    leaf("kubelet", f"system:node:{NODE_NAME}", "system:nodes", server=True)  # kubectl logs

    sa = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    (d / "sa.key").write_bytes(key_pem(sa))
    (d / "sa.pub").write_bytes(
        sa.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )


def write_kubeconfig(path: Path, server: str, pki: Path, user: str) -> None:
    """kubeconfig with absolute file references (JSON is valid YAML)."""
    cfg = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "sloline",
                "cluster": {"server": server, "certificate-authority": str(pki / "ca.crt")},
            }
        ],
        "users": [
            {
                "name": user,
                "user": {
                    "client-certificate": str(pki / f"{user}.crt"),
                    "client-key": str(pki / f"{user}.key"),
                },
            }
        ],
        "contexts": [{"name": "sloline", "context": {"cluster": "sloline", "user": user}}],
        "current-context": "sloline",
    }
    path.write_text(json.dumps(cfg, indent=2) + "\n")


# --- processes ----------------------------------------------------------------------------


def cmdline(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [a.decode(errors="replace") for a in raw.split(b"\0") if a]


def ours(pid: int, command: str | list[str]) -> bool:
    """The pid is still the process we started (not a reused pid): its command line starts
    with the binary (or the recorded command)."""
    expected = [command] if isinstance(command, str) else command
    args = cmdline(pid)
    return bool(args) and args[: len(expected)] == expected


def rss_mib(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


# The Popen objects of this `up`: a child's exit is seen by poll(), not /proc (right after
# Popen, /proc/<pid>/cmdline can still read as the forking python's).
procs: dict[str, subprocess.Popen[bytes]] = {}


def start(run: Path, name: str, args: list[str], command: list[str] | None = None) -> int:
    """Start a binary of BIN_DIR (or `command`) with `args`, logging to logs/<name>.log."""
    log = open(run / "logs" / f"{name}.log", "ab")  # noqa: SIM115 - child owns it
    proc = subprocess.Popen(
        [*(command or [str(BIN_DIR / name)]), *args],
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,  # not killed by the caller's Ctrl-C; `down` stops it
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)} if command else None,
    )
    log.close()
    procs[name] = proc
    (run / "pids" / f"{name}.pid").write_text(f"{proc.pid}\n")
    return proc.pid


def https_ok(url: str, pki: Path, timeout: float = 2.0) -> tuple[bool, str]:
    ctx = ssl.create_default_context(cafile=str(pki / "ca.crt"))
    ctx.load_cert_chain(str(pki / "admin.crt"), str(pki / "admin.key"))
    try:
        with urllib.request.urlopen(url, context=ctx, timeout=timeout) as r:
            return r.status == 200, r.read().decode(errors="replace")
    except urllib.error.HTTPError as e:
        return False, e.read().decode(errors="replace")
    except (OSError, ssl.SSLError) as e:
        return False, str(e)


def http_ok(url: str, timeout: float = 2.0) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status == 200
    except OSError:
        return False


def wait_for(what: str, check, deadline: float, pids: dict[str, int]) -> None:
    """Poll `check` until true; fail early when one of the started processes exits."""
    while True:
        if check():
            return
        for name, pid in pids.items():
            if procs[name].poll() is not None:
                raise SystemExit(f"{name} (pid {pid}) exited while waiting for {what}")
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {what}")
        time.sleep(0.25)


def up(args: argparse.Namespace) -> int:  # noqa: PLR0915 - one linear start-up
    if STATE.exists():
        state = json.loads(STATE.read_text())
        alive = [n for n, p in state["pids"].items() if ours(p, state["binaries"][n])]
        if alive:
            print(f"already running ({', '.join(alive)}); `scripts/cluster.py down` first")
            print(f"KUBECONFIG={state['kubeconfig']}")
            return 1
        STATE.unlink()
    missing = [n for n in ORDER if not (BIN_DIR / n).is_file()]
    if missing:
        print(
            f"missing {', '.join(missing)} in {BIN_DIR}: run scripts/kube/build.sh", file=sys.stderr
        )
        return 2
    if args.node and (reason := node_unsupported()):
        print(f"no node here: {reason}; `up --no-node` starts the control plane alone")
        return 2

    t0 = time.monotonic()
    run = Path(tempfile.mkdtemp(prefix="sloline-cluster-"))
    for sub in ("logs", "pids"):
        (run / sub).mkdir()
    pki = run / "pki"
    service_cidr, pod_cidr = networks()
    # The first address of the service network is the `kubernetes` Service's.
    write_pki(pki, str(next(ipaddress.ip_network(service_cidr).hosts())))
    ports = {
        "etcd": free_port(),
        "etcd-peer": free_port(),
        "apiserver": args.port or free_port(),
        "controller-manager": free_port(),
        "scheduler": free_port(),
    }
    server = f"https://127.0.0.1:{ports['apiserver']}"
    kubeconfig = run / "admin.kubeconfig"
    write_kubeconfig(kubeconfig, server, pki, "admin")
    write_kubeconfig(run / "controller-manager.kubeconfig", server, pki, "controller-manager")
    write_kubeconfig(run / "scheduler.kubeconfig", server, pki, "scheduler")
    write_kubeconfig(run / "node.kubeconfig", server, pki, "node")
    write_kubeconfig(run / "kube-proxy.kubeconfig", server, pki, "kube-proxy")

    pids: dict[str, int] = {}
    state = {
        "version": KUBE_VERSION,
        "dir": str(run),
        "kubeconfig": str(kubeconfig),
        "server": server,
        "ports": ports,
        "networks": {"services": service_cidr, "pods": pod_cidr},
        "pids": pids,
        "binaries": {n: str(BIN_DIR / n) for n in ORDER},
    }

    def save() -> None:
        STATE.parent.mkdir(parents=True, exist_ok=True)
        STATE.write_text(json.dumps(state, indent=2) + "\n")

    deadline = time.monotonic() + args.timeout
    try:
        etcd_url = f"http://127.0.0.1:{ports['etcd']}"
        peer_url = f"http://127.0.0.1:{ports['etcd-peer']}"
        pids["etcd"] = start(
            run,
            "etcd",
            [
                "--name=default",
                f"--data-dir={run / 'etcd'}",
                f"--listen-client-urls={etcd_url}",
                f"--advertise-client-urls={etcd_url}",
                f"--listen-peer-urls={peer_url}",
                f"--initial-advertise-peer-urls={peer_url}",
                f"--initial-cluster=default={peer_url}",
                "--unsafe-no-fsync",  # throwaway data; fsync on a shared disk dominates start-up
                "--log-level=warn",
            ],
        )
        save()
        wait_for("etcd /health", lambda: http_ok(f"{etcd_url}/health"), deadline, pids)

        pids["kube-apiserver"] = start(
            run,
            "kube-apiserver",
            [
                "--advertise-address=127.0.0.1",
                # A loopback advertise address is refused by the endpoint reconciler: the
                # `kubernetes` Service gets no endpoints (no node could use them anyway).
                "--endpoint-reconciler-type=none",
                "--bind-address=127.0.0.1",
                f"--secure-port={ports['apiserver']}",
                f"--cert-dir={run / 'apiserver-certs'}",
                f"--etcd-servers={etcd_url}",
                f"--client-ca-file={pki / 'ca.crt'}",
                f"--tls-cert-file={pki / 'apiserver.crt'}",
                f"--tls-private-key-file={pki / 'apiserver.key'}",
                f"--kubelet-client-certificate={pki / 'apiserver-kubelet-client.crt'}",
                f"--kubelet-client-key={pki / 'apiserver-kubelet-client.key'}",
                f"--kubelet-certificate-authority={pki / 'ca.crt'}",
                "--kubelet-preferred-address-types=InternalIP",
                "--authorization-mode=Node,RBAC",
                # On top of the default plugins (PodSecurity among them), as kubeadm does.
                "--enable-admission-plugins=NodeRestriction",
                "--allow-privileged=true",
                f"--service-cluster-ip-range={service_cidr}",
                f"--service-account-issuer={ISSUER}",
                f"--service-account-key-file={pki / 'sa.pub'}",
                f"--service-account-signing-key-file={pki / 'sa.key'}",
                "--profiling=false",
            ],
        )
        save()
        wait_for(
            "kube-apiserver /readyz",
            lambda: https_ok(f"{server}/readyz", pki)[0],
            deadline,
            pids,
        )
        t_api = time.monotonic() - t0

        common = [
            "--bind-address=127.0.0.1",
            "--leader-elect=false",
        ]
        cm_cfg = str(run / "controller-manager.kubeconfig")
        pids["kube-controller-manager"] = start(
            run,
            "kube-controller-manager",
            [
                *common,
                f"--secure-port={ports['controller-manager']}",
                f"--cert-dir={run / 'controller-manager-certs'}",
                f"--kubeconfig={cm_cfg}",
                f"--authentication-kubeconfig={cm_cfg}",
                f"--authorization-kubeconfig={cm_cfg}",
                "--use-service-account-credentials=true",
                f"--root-ca-file={pki / 'ca.crt'}",
                f"--service-account-private-key-file={pki / 'sa.key'}",
                f"--cluster-signing-cert-file={pki / 'ca.crt'}",
                f"--cluster-signing-key-file={pki / 'ca.key'}",
                f"--service-cluster-ip-range={service_cidr}",
                "--controllers=*,bootstrapsigner,tokencleaner",
                "--cluster-name=sloline",
            ],
        )
        sched_cfg = str(run / "scheduler.kubeconfig")
        pids["kube-scheduler"] = start(
            run,
            "kube-scheduler",
            [
                *common,
                f"--secure-port={ports['scheduler']}",
                f"--cert-dir={run / 'scheduler-certs'}",
                f"--kubeconfig={sched_cfg}",
                f"--authentication-kubeconfig={sched_cfg}",
                f"--authorization-kubeconfig={sched_cfg}",
            ],
        )
        save()
        for name, port in (
            ("kube-controller-manager", ports["controller-manager"]),
            ("kube-scheduler", ports["scheduler"]),
        ):
            # /healthz is always allowed (no authn); the serving cert is self-signed.
            url = f"https://127.0.0.1:{port}/healthz"
            ctx = ssl._create_unverified_context()

            def healthy(url=url, ctx=ctx) -> bool:
                try:
                    with urllib.request.urlopen(url, context=ctx, timeout=2) as r:
                        return r.status == 200
                except OSError:
                    return False

            wait_for(f"{name} /healthz", healthy, deadline, pids)
        wait_for(
            "the default ServiceAccount (controller-manager working)",
            lambda: https_ok(f"{server}/api/v1/namespaces/default/serviceaccounts/default", pki)[0],
            deadline,
            pids,
        )
        if args.node:
            command = [sys.executable, "-m", "tests.support.kube.node"]
            state["binaries"][KUBELET] = command
            node = node_args(run, args.node_cpu, service_cidr, pod_cidr)
            pids[KUBELET] = start(run, KUBELET, node, command)
            save()
            wait_for(f"Node {NODE_NAME} Ready", lambda: node_ready(server, pki), deadline, pids)
    except BaseException:
        print_failure(run, list(pids))
        for proc in reversed(procs.values()):
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        STATE.unlink(missing_ok=True)
        raise
    t_all = time.monotonic() - t0
    state["startup_s"] = {"apiserver_ready": round(t_api, 2), "all_ready": round(t_all, 2)}
    save()
    node = f"; node {NODE_NAME} Ready (pods' logs in {run / 'node' / 'logs'})" if args.node else ""
    print(
        f"control plane {KUBE_VERSION} up at {server} in {t_all:.1f} s "
        f"(apiserver /readyz after {t_api:.1f} s){node}; logs in {run / 'logs'}"
    )
    print(f"KUBECONFIG={kubeconfig}")
    return 0


def node_unsupported() -> str | None:
    """Why the process kubelet cannot run here, or None."""
    sys.path.insert(0, str(ROOT))
    from tests.support.kube.kubelet import unsupported_reason

    if shutil.which("ip") is None:
        return "the node agent routes its pod network with `ip` (iproute2)"
    return unsupported_reason()


def print_failure(run: Path, names: list[str]) -> None:
    """The last lines of the logs of what was started (and of the kubelet's own log)."""
    print(f"start-up failed; logs in {run / 'logs'}", file=sys.stderr)
    for name in reversed(names):
        tail = (run / "logs" / f"{name}.log").read_text(errors="replace").splitlines()[-15:]
        print(f"--- {name} (last lines) ---", *tail, sep="\n", file=sys.stderr)
    kubelet_log = run / "node" / "logs" / "kubelet.log"
    if kubelet_log.exists():
        tail = kubelet_log.read_text(errors="replace").splitlines()[-15:]
        print(f"--- {kubelet_log} (last lines) ---", *tail, sep="\n", file=sys.stderr)


def node_args(run: Path, cpu: str | None, service_cidr: str, pod_cidr: str) -> list[str]:
    """The arguments of the node agent (tests/support/kube/node.py)."""
    return [
        f"--kubeconfig={run / 'node.kubeconfig'}",
        f"--proxy-kubeconfig={run / 'kube-proxy.kubeconfig'}",
        f"--workdir={run / 'node'}",
        f"--service-network={service_cidr}",
        f"--pod-network={pod_cidr}",
        f"--name={NODE_NAME}",
        f"--serving-cert={run / 'pki' / 'kubelet.crt'}",
        f"--serving-key={run / 'pki' / 'kubelet.key'}",
        f"--client-ca={run / 'pki' / 'ca.crt'}",
        *([f"--cpu={cpu}"] if cpu else []),
    ]


def node_ready(server: str, pki: Path) -> bool:
    ok, body = https_ok(f"{server}/api/v1/nodes/{NODE_NAME}", pki)
    if not ok:
        return False
    conditions = json.loads(body).get("status", {}).get("conditions") or []
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


def stop(state: dict, keep: bool) -> None:
    for name in [KUBELET, *reversed(ORDER)]:
        pid = state["pids"].get(name)
        if pid is None or not ours(pid, state["binaries"][name]):
            continue
        os.kill(pid, signal.SIGTERM)
        # The kubelet first stops its pods (SIGTERM, at most 10 s grace each, in parallel).
        for _ in range(300 if name == KUBELET else 100):
            if not ours(pid, state["binaries"][name]):
                break
            time.sleep(0.1)
        else:
            os.kill(pid, signal.SIGKILL)
        print(f"stopped {name} (pid {pid})")
    if not keep:
        shutil.rmtree(state["dir"], ignore_errors=True)
    STATE.unlink(missing_ok=True)


def down(args: argparse.Namespace) -> int:
    if not STATE.exists():
        print("no cluster recorded in .tools/kube/cluster.json")
        return 0
    state = json.loads(STATE.read_text())
    stop(state, keep=args.keep)
    if args.keep:
        print(f"kept {state['dir']}")
    return 0


def status(_args: argparse.Namespace) -> int:
    if not STATE.exists():
        print("no cluster recorded")
        return 1
    state = json.loads(STATE.read_text())
    total = 0.0
    for name in [*ORDER, KUBELET]:
        if name not in state["pids"]:
            continue
        pid = state["pids"][name]
        alive = ours(pid, state["binaries"][name])
        rss = rss_mib(pid) if alive else None
        total += rss or 0.0
        shown = f"{rss:.0f} MiB RSS" if rss is not None else "not running"
        print(f"{name:24} pid {pid}  {shown}")
    print(f"{'total':24} {total:.0f} MiB RSS")
    print(f"started in {state.get('startup_s')}; dir {state['dir']}")
    print(f"KUBECONFIG={state['kubeconfig']}")
    return 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    u = sub.add_parser("up", help="start the control plane")
    u.add_argument("--port", type=int, default=0, help="apiserver port (default: a free one)")
    u.add_argument("--timeout", type=float, default=180.0, help="seconds to wait for ready")
    u.add_argument(
        "--node",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="start the process kubelet as the node agent (default; --no-node: no node)",
    )
    u.add_argument("--node-cpu", help="the Node's CPU capacity (default: this machine's)")
    d = sub.add_parser("down", help="stop what `up` started")
    d.add_argument("--keep", action="store_true", help="keep the temp dir (logs, etcd data)")
    sub.add_parser("status", help="pids and memory")
    args = p.parse_args()
    return {"up": up, "down": down, "status": status}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
