"""A real control plane on 127.0.0.1: etcd, kube-apiserver, kube-controller-manager, Volcano's
scheduler, controllers and admission webhook, and kwok for simulated nodes. One implementation
for the e2e suite (tests/e2e/conftest.py) and the local sandbox (`trainstack sandbox up`).

Every process binds to 127.0.0.1 on a free port, writes its log into the session's temp dir,
and is stopped (SIGTERM, then SIGKILL) by `ControlPlane.stop`, which touches nothing it did
not start. Flags follow the upstream deployments: controller-runtime's envtest for the API
server, Volcano's rendered chart (`installer/volcano-development.yaml` at the tag) for the
Volcano components, whose webhook configurations are registered from that same file with a
URL client config instead of the in-cluster Service.
"""

from __future__ import annotations

import base64
import contextlib
import functools
import os
import shlex
import signal
import socket
import subprocess
import time
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from trainstack.builders import topology
from trainstack.builders.scheduling import VOLCANO_NAMESPACE
from trainstack.kube import ApiError, Kube, wait_for
from trainstack.sandbox import pki

KWOK_STAGES = Path(__file__).resolve().parent / "kwok-stages.yaml"
# Nodes kwok manages carry this annotation (kwok's own convention, `kwok.x-k8s.io/node`).
KWOK_ANNOTATION = "kwok.x-k8s.io/node"
SERVICE_CIDR = "10.96.0.0/16"
ADMIN = "trainstack-e2e-admin"
DEFAULT_SCHEDULER = "kube-scheduler"  # its key in ControlPlane.processes, when started


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Process:
    name: str
    argv: list[str]
    log: Path
    popen: subprocess.Popen[bytes] | None = None
    # A sandbox's processes outlive the command that started them (`trainstack sandbox up`
    # returns, they keep serving): a session of their own, so the terminal's Ctrl-C is not
    # theirs, and `sandbox down` stops them by the PIDs in its state file.
    detach: bool = False
    env: Mapping[str, str] = field(default_factory=dict)  # set beside the inherited ones

    def start(self) -> None:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        # Volcano's components open a debug socket in $DEBUG_SOCKET_DIR, /tmp/klog-socks by
        # default (pkg/util/socket.go): keep it inside the session's directory.
        env = dict(os.environ, DEBUG_SOCKET_DIR=str(self.log.parent.parent / "sockets"))
        env.update(self.env)
        with self.log.open("ab") as out:
            out.write(f"$ {shlex.join(self.argv)}\n".encode())
            out.flush()
            self.popen = subprocess.Popen(
                self.argv,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                start_new_session=self.detach,
            )

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def check(self) -> None:
        if not self.alive():
            code = None if self.popen is None else self.popen.returncode
            raise RuntimeError(f"{self.name} exited ({code}); log:\n{self.tail()}")

    def tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except FileNotFoundError:
            return "(no log)"

    def stop(self, timeout: float = 10) -> None:
        if self.popen is None or self.popen.poll() is not None:
            return
        self.popen.send_signal(signal.SIGTERM)
        try:
            self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            self.popen.wait(5)


@dataclass
class ControlPlane:
    """Start with `start()`; `kube` is an admin client; `stop()` ends every process."""

    tools: Mapping[str, Path]
    workdir: Path
    reference: Path
    processes: dict[str, Process] = field(default_factory=dict)
    # klog level of Volcano's scheduler: 3 explains each decision (what a failing scenario
    # needs), and writes tens of MB a minute at organisation scale (the benchmark uses 1).
    scheduler_verbosity: int = 3
    # Processes in sessions of their own, left running by the Python process (the sandbox).
    detach: bool = False

    def __post_init__(self) -> None:
        self.logs = self.workdir / "logs"
        self.pki_dir = self.workdir / "pki"
        self.ports: dict[str, int] = {}
        self.scheduler_conf = self.workdir / "volcano-scheduler.conf"
        self.scheduler_metrics = ""  # set when the scheduler starts

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self, scheduler_conf: Mapping[str, Any] | None = None) -> None:
        """Start every process; Volcano's scheduler with `scheduler_conf`, by default its own
        chart's (the reference folder's copy) until a stack brings its generated one."""
        if scheduler_conf is None:
            scheduler_conf = self.default_scheduler_conf()
        self._pki()
        self._etcd()
        self._apiserver()
        self._controller_manager()
        self._crds()
        self._volcano_webhooks()
        self._volcano_controllers()
        self.restart_scheduler(scheduler_conf)
        self._kwok()

    def default_scheduler_conf(self) -> dict[str, Any]:
        """Volcano's own chart configuration, as the reference folder holds it."""
        path = self.reference / "volcano" / "volcano-scheduler.conf"
        conf: dict[str, Any] = yaml.safe_load(path.read_text(encoding="utf-8"))
        return conf

    def stop(self) -> None:
        for process in reversed(list(self.processes.values())):
            process.stop()

    def _run(self, name: str, argv: list[str], env: Mapping[str, str] | None = None) -> Process:
        process = Process(name, argv, self.logs / f"{name}.log", detach=self.detach, env=env or {})
        process.start()
        self.processes[name] = process
        return process

    def pids(self) -> dict[str, int]:
        """Each running process's PID, by component name (the sandbox's state file)."""
        return {
            name: process.popen.pid
            for name, process in self.processes.items()
            if process.popen is not None and process.alive()
        }

    def check(self) -> None:
        """Fail with the component's log if any process died."""
        for process in self.processes.values():
            process.check()

    # -- certificates and kubeconfigs ----------------------------------------------------------

    def _pki(self) -> None:
        self.ca = pki.Authority(self.pki_dir)
        self.serving = self.ca.issue("apiserver", "kube-apiserver", server=True)
        self.admin = self.ca.issue("admin", ADMIN, orgs=("system:masters",), client=True)
        self.webhook_serving = self.ca.issue("volcano-webhook", "volcano-admission", server=True)
        self.sa_keys = pki.service_account_keys(self.pki_dir)

    def kubeconfig(self) -> Path:
        """The admin's kubeconfig (system:masters), written once."""
        path = self.workdir / "kubeconfig"
        if not path.exists():
            admin = {"client-certificate": str(self.admin.cert), "client-key": str(self.admin.key)}
            self.write_kubeconfig(path, "admin", admin)
        return path

    def write_kubeconfig(self, path: Path, user: str, credentials: Mapping[str, str]) -> Path:
        """A kubeconfig for this API server, verified against its CA, as `user` with these
        credentials: `client-certificate` and `client-key`, or a `token`."""
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "e2e",
                    "cluster": {"server": self.server, "certificate-authority": str(self.ca.cert)},
                }
            ],
            "users": [{"name": user, "user": dict(credentials)}],
            "contexts": [{"name": "e2e", "context": {"cluster": "e2e", "user": user}}],
            "current-context": "e2e",
        }
        path.write_text(yaml.safe_dump(config), encoding="utf-8")
        return path

    # -- etcd, API server, controller manager ---------------------------------------------------

    def _etcd(self) -> None:
        client, peer = free_port(), free_port()
        self.ports["etcd"] = client
        self._run(
            "etcd",
            [
                str(self.tools["etcd"]),
                "--name=e2e",
                f"--data-dir={self.workdir / 'etcd'}",
                f"--listen-client-urls=http://127.0.0.1:{client}",
                f"--advertise-client-urls=http://127.0.0.1:{client}",
                f"--listen-peer-urls=http://127.0.0.1:{peer}",
                f"--initial-advertise-peer-urls=http://127.0.0.1:{peer}",
                f"--initial-cluster=e2e=http://127.0.0.1:{peer}",
                "--listen-metrics-urls=",
                # A test database: durability buys nothing and fsync costs seconds per test.
                "--unsafe-no-fsync",
                "--log-level=warn",
            ],
        )

    def _apiserver(self) -> None:
        port = free_port()
        self.ports["apiserver"] = port
        self.server = f"https://127.0.0.1:{port}"
        ca = str(self.ca.cert)
        self._run(
            "kube-apiserver",
            [
                str(self.tools["kube-apiserver"]),
                f"--etcd-servers=http://127.0.0.1:{self.ports['etcd']}",
                "--bind-address=127.0.0.1",
                "--advertise-address=127.0.0.1",
                f"--secure-port={port}",
                f"--tls-cert-file={self.serving.cert}",
                f"--tls-private-key-file={self.serving.key}",
                f"--client-ca-file={ca}",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                f"--service-account-key-file={self.sa_keys.cert}",
                f"--service-account-signing-key-file={self.sa_keys.key}",
                # RBAC as on EKS; admission plugins left at their defaults (ResourceQuota,
                # LimitRanger, Priority, PodSecurity, webhooks, ValidatingAdmissionPolicy).
                "--authorization-mode=RBAC",
                "--allow-privileged=true",
                # No kubelets and no other API servers to reconcile the endpoints with.
                "--endpoint-reconciler-type=none",
                "--profiling=false",
                "--v=1",
            ],
        )
        self.kube = Kube(self.server, ca, str(self.admin.cert), str(self.admin.key))

        def ready() -> bool:
            self.processes["kube-apiserver"].check()
            try:
                self.kube.request("GET", "/readyz", timeout=5)
            except (ApiError, OSError, Exception):
                return False
            return True

        wait_for("kube-apiserver /readyz", ready, timeout=120, interval=0.5)

    def _controller_manager(self) -> None:
        self._run(
            "kube-controller-manager",
            [
                str(self.tools["kube-controller-manager"]),
                f"--kubeconfig={self.kubeconfig()}",
                "--bind-address=127.0.0.1",
                f"--secure-port={free_port()}",
                f"--authentication-kubeconfig={self.kubeconfig()}",
                f"--authorization-kubeconfig={self.kubeconfig()}",
                "--leader-elect=false",
                "--use-service-account-credentials=false",
                f"--service-account-private-key-file={self.sa_keys.key}",
                f"--root-ca-file={self.ca.cert}",
                f"--cluster-signing-cert-file={self.ca.cert}",
                f"--cluster-signing-key-file={self.ca.key}",
                "--v=1",
            ],
        )

        def default_sa() -> Any:
            self.processes["kube-controller-manager"].check()
            return self.kube.get_or_none("v1", "ServiceAccount", "default", "default")

        wait_for("the default ServiceAccount (controller manager up)", default_sa, timeout=120)

    # -- CRDs ---------------------------------------------------------------------------------

    def crd_files(self) -> list[Path]:
        return sorted((self.reference / "volcano" / "crd-bases").glob("*.yaml")) + sorted(
            (self.reference / "prometheus-operator").glob("*.yaml")
        )

    def _crds(self) -> None:
        """The reference CRDs (Volcano's five kinds trainstack uses, prometheus-operator's),
        then the rest of what Volcano's chart installs (CronJob, JobFlow, Numatopology, ...),
        which its controllers and scheduler watch, from the installer rendered at the tag."""
        names = []
        for path in self.crd_files():
            for crd in yaml.safe_load_all(path.read_text(encoding="utf-8")):
                if not crd or crd.get("kind") != "CustomResourceDefinition":
                    continue
                self.kube.apply(crd)
                names.append(crd["metadata"]["name"])
        for crd in self.installer():
            if crd["kind"] == "CustomResourceDefinition" and crd["metadata"]["name"] not in names:
                self.kube.apply(crd)
                names.append(crd["metadata"]["name"])

        def established(name: str) -> bool:
            crd = self.kube.get("apiextensions.k8s.io/v1", "CustomResourceDefinition", name)
            return any(
                c["type"] == "Established" and c["status"] == "True"
                for c in (crd.get("status") or {}).get("conditions") or []
            )

        for name in names:
            wait_for(f"CRD {name} established", functools.partial(established, name), timeout=60)
        self.kube.forget_discovery()

    # -- Volcano ------------------------------------------------------------------------------

    def installer(self) -> list[dict[str, Any]]:
        text = self.tools["volcano-development.yaml"].read_text(encoding="utf-8")
        return [d for d in yaml.safe_load_all(text) if d]

    def _deployment_args(self, name: str) -> list[str]:
        for doc in self.installer():
            if doc["kind"] == "Deployment" and doc["metadata"]["name"] == name:
                args = doc["spec"]["template"]["spec"]["containers"][0]["args"]
                return [a for a in args if not a.startswith("2>")]
        raise LookupError(f"the Volcano installer has no Deployment {name}")

    def _volcano_webhooks(self) -> None:
        args = self._deployment_args("volcano-admission")
        enabled = next(a.split("=", 1)[1] for a in args if a.startswith("--enabled-admission="))
        port = free_port()
        self.ports["volcano-webhook"] = port
        bundle = base64.b64encode(self.ca.cert.read_bytes()).decode()
        kinds = ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration")
        for doc in self.installer():
            if doc["kind"] not in kinds:
                continue
            for hook in doc["webhooks"]:
                service = hook["clientConfig"].pop("service")
                hook["clientConfig"] = {
                    "url": f"https://127.0.0.1:{port}{service['path']}",
                    "caBundle": bundle,
                }
            paths = {h["clientConfig"]["url"].split(str(port), 1)[1] for h in doc["webhooks"]}
            if paths <= set(enabled.split(",")):
                self.kube.apply(doc)
        self._run(
            "vc-webhook-manager",
            [
                str(self.tools["vc-webhook-manager"]),
                f"--kubeconfig={self.kubeconfig()}",
                f"--enabled-admission={enabled}",
                f"--tls-cert-file={self.webhook_serving.cert}",
                f"--tls-private-key-file={self.webhook_serving.key}",
                f"--ca-cert-file={self.ca.cert}",
                "--listen-address=127.0.0.1",
                f"--port={port}",
                f"--webhook-url=https://127.0.0.1:{port}",
                "--enable-healthz=true",
                f"--healthz-address=127.0.0.1:{free_port()}",
                "--logtostderr",
                "-v=2",
            ],
        )

        def serving() -> bool:
            self.processes["vc-webhook-manager"].check()
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 1):
                return True
            return False

        wait_for("the Volcano admission webhook", serving, timeout=120)

    def _healthy(self, name: str, port: int) -> None:
        """Wait for a Volcano component's /healthz (helpers.StartHealthz: plain HTTP)."""

        def ok() -> bool:
            self.processes[name].check()
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as r:
                    return bool(r.status == 200)
            except OSError:
                return False

        wait_for(f"{name} /healthz", ok, timeout=120)

    def _volcano_controllers(self) -> None:
        health = free_port()
        self._run(
            "vc-controller-manager",
            [
                str(self.tools["vc-controller-manager"]),
                f"--kubeconfig={self.kubeconfig()}",
                "--leader-elect=false",
                "--enable-healthz=true",
                f"--healthz-address=127.0.0.1:{health}",
                f"--listen-address=127.0.0.1:{free_port()}",
                "--worker-threads=3",
                "--worker-threads-for-gc=5",
                "--worker-threads-for-podgroup=5",
                "--logtostderr",
                "-v=2",
            ],
            # As the chart sets them (templates/controllers.yaml): the HyperNode controller
            # reads its network topology discovery from ConfigMap
            # `$HELM_RELEASE_NAME-controller-configmap` in `$KUBE_POD_NAMESPACE`, which
            # stacks.deploy_platform writes from the stack's chart values.
            env={
                "KUBE_POD_NAMESPACE": VOLCANO_NAMESPACE,
                "HELM_RELEASE_NAME": topology.VOLCANO_RELEASE,
            },
        )
        self._healthy("vc-controller-manager", health)

    def start_default_scheduler(self) -> bool:
        """kube-scheduler, for tests whose objects need pods of the default scheduler to run
        (a Deployment the Kubernetes provider waits for). Not started with the rest: the
        harness's other tests schedule only through Volcano. Stopped by `stop`. False, and
        nothing started, when one already runs: a second would leave the first unstopped."""
        if DEFAULT_SCHEDULER in self.processes:
            return False
        self._run(
            DEFAULT_SCHEDULER,
            [
                str(self.tools["kube-scheduler"]),
                f"--kubeconfig={self.kubeconfig()}",
                f"--authentication-kubeconfig={self.kubeconfig()}",
                f"--authorization-kubeconfig={self.kubeconfig()}",
                "--bind-address=127.0.0.1",
                f"--secure-port={free_port()}",
                "--leader-elect=false",
                "--v=1",
            ],
        )
        return True

    def stop_default_scheduler(self) -> None:
        process = self.processes.pop(DEFAULT_SCHEDULER, None)
        if process is not None:
            process.stop()

    def restart_scheduler(self, conf: Mapping[str, Any]) -> None:
        """(Re)start Volcano's scheduler with `conf`, the platform's generated configuration."""
        if "vc-scheduler" in self.processes:
            self.processes.pop("vc-scheduler").stop()
        self.scheduler_conf.write_text(yaml.safe_dump(dict(conf), sort_keys=False))
        health, metrics = free_port(), free_port()
        # Its Prometheus metrics (plain HTTP, /metrics): the scheduling benchmark reads the
        # session latency histogram there.
        self.scheduler_metrics = f"http://127.0.0.1:{metrics}/metrics"
        self._run(
            "vc-scheduler",
            [
                str(self.tools["vc-scheduler"]),
                f"--kubeconfig={self.kubeconfig()}",
                f"--scheduler-conf={self.scheduler_conf}",
                # An invalid configuration must fail the test, not fall back silently.
                "--disable-default-scheduler-config=true",
                "--schedule-period=1s",
                "--leader-elect=false",
                "--enable-healthz=true",
                f"--healthz-address=127.0.0.1:{health}",
                f"--listen-address=127.0.0.1:{metrics}",
                # /metrics is served only with this (v1.15.1 cmd/scheduler/app/server.go
                # startMetricsServer); the listen address alone serves nothing.
                "--enable-metrics=true",
                "--kube-api-qps=2000",
                "--kube-api-burst=2000",
                "--logtostderr",
                f"-v={self.scheduler_verbosity}",
            ],
        )
        self._healthy("vc-scheduler", health)

    # -- kwok -----------------------------------------------------------------------------------

    def _kwok(self) -> None:
        self._run(
            "kwok",
            [
                str(self.tools["kwok"]),
                f"--kubeconfig={self.kubeconfig()}",
                f"--config={KWOK_STAGES}",
                f"--manage-nodes-with-annotation-selector={KWOK_ANNOTATION}=fake",
                f"--server-address=127.0.0.1:{free_port()}",
                "--node-ip=127.0.0.2",
                "--cidr=10.244.0.1/16",
                "--node-lease-duration-seconds=40",
            ],
        )
        time.sleep(0.5)
        self.processes["kwok"].check()
