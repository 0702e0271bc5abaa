"""Pod Security, as rules: `no-privileged` (level baseline, which team namespaces enforce) and
`hardened-pods` (level restricted, which the platform's own job pods meet)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from trainstack.policy.objects import Config, as_map, as_seq, containers, pods

# The Pod Security Standards' baseline level, as k8s.io/pod-security-admission v0.37.2
# checks it (policy/check_*.go of Level baseline), which every team namespace enforces:
# `no-privileged` holds Volcano Jobs to it, so that a job the rules accept never has its pods
# refused after admission, out of the member's sight (issue 19 #3).
BASELINE_CAPABILITIES = frozenset(
    {
        "AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD",
        "NET_BIND_SERVICE", "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT",
    }
)  # fmt: skip
BASELINE_SYSCTLS = frozenset(
    {
        "kernel.shm_rmid_forced", "net.ipv4.ip_local_port_range", "net.ipv4.tcp_syncookies",
        "net.ipv4.ping_group_range", "net.ipv4.ip_unprivileged_port_start",
        "net.ipv4.ip_local_reserved_ports", "net.ipv4.tcp_keepalive_time",
        "net.ipv4.tcp_fin_timeout", "net.ipv4.tcp_keepalive_intvl",
        "net.ipv4.tcp_keepalive_probes", "net.ipv4.tcp_rmem", "net.ipv4.tcp_wmem",
        "net.ipv4.tcp_slow_start_after_idle", "net.ipv4.tcp_notsent_lowat",
    }
)  # fmt: skip
BASELINE_SELINUX_TYPES = ("", "container_t", "container_init_t", "container_kvm_t",
                          "container_engine_t")  # fmt: skip
CONFINED_PROFILES = ("RuntimeDefault", "Localhost")  # seccomp and AppArmor profile types
APPARMOR_ANNOTATION = "container.apparmor.security.beta.kubernetes.io/"
PROBES = ("livenessProbe", "readinessProbe", "startupProbe")
HANDLERS = ("httpGet", "tcpSocket")


def _security_contexts(pod: Mapping[str, Any]) -> Iterator[tuple[str, Mapping[str, Any]]]:
    """(who, securityContext) for the pod and each of its containers."""
    yield "pod", as_map(pod.get("securityContext"))
    for c in containers(pod):
        yield f"container {c.get('name')}", as_map(c.get("securityContext"))


def _baseline(task: str, pod: Mapping[str, Any], annotations: Mapping[str, Any]) -> list[str]:
    """What Pod Security baseline refuses beyond host namespaces, privileged and hostPath."""
    found = _baseline_containers(task, pod)
    for who, sc in _security_contexts(pod):
        for key in ("seccompProfile", "appArmorProfile"):
            kind = as_map(sc.get(key)).get("type")
            if key in sc and kind not in CONFINED_PROFILES:
                found.append(f"task {task}, {who}: {key} {kind} is not allowed")
        selinux = as_map(sc.get("seLinuxOptions"))
        if selinux.get("type", "") not in BASELINE_SELINUX_TYPES or any(
            selinux.get(k) for k in ("user", "role")
        ):
            found.append(f"task {task}, {who}: seLinuxOptions {dict(selinux)} are not allowed")
        if as_map(sc.get("windowsOptions")).get("hostProcess") is True:
            found.append(f"task {task}, {who}: windowsOptions.hostProcess is not allowed")
    sysctls = {
        str(as_map(x).get("name"))
        for x in as_seq(as_map(pod.get("securityContext")).get("sysctls"))
    }
    if sysctls - BASELINE_SYSCTLS:
        found.append(f"task {task}: sysctls {sorted(sysctls - BASELINE_SYSCTLS)} are not allowed")
    for key, value in annotations.items():
        if str(key).startswith(APPARMOR_ANNOTATION) and not (
            value in ("", "runtime/default") or str(value).startswith("localhost/")
        ):
            found.append(f"task {task}: annotation {key}={value} is not allowed")
    return found


def _baseline_containers(task: str, pod: Mapping[str, Any]) -> list[str]:
    found = []
    for c in containers(pod):
        who = f"task {task}, container {c.get('name')}"
        sc = as_map(c.get("securityContext"))
        added = {str(a) for a in as_seq(as_map(sc.get("capabilities")).get("add"))}
        if added - BASELINE_CAPABILITIES:
            found.append(f"{who}: capabilities {sorted(added - BASELINE_CAPABILITIES)} not allowed")
        if sc.get("procMount", "Default") != "Default" and pod.get("hostUsers") is not False:
            found.append(f"{who}: procMount {sc.get('procMount')} is not allowed")
        if any(as_map(p).get("hostPort", 0) != 0 for p in as_seq(c.get("ports"))):
            found.append(f"{who}: hostPort is not allowed")
        lifecycle = as_map(c.get("lifecycle"))
        for probe in [as_map(c.get(k)) for k in PROBES] + [
            as_map(lifecycle.get(k)) for k in ("postStart", "preStop")
        ]:
            if any(as_map(probe.get(h)).get("host", "") != "" for h in HANDLERS):
                found.append(f"{who}: a probe or lifecycle handler sets host")
    return found


def no_privileged(job: Mapping[str, Any], cfg: Config) -> list[str]:
    del cfg
    found = []
    tasks = [as_map(t) for t in as_seq(as_map(job.get("spec")).get("tasks"))]
    annotations = [
        as_map(as_map(as_map(t.get("template")).get("metadata")).get("annotations")) for t in tasks
    ]
    for (task, pod), task_annotations in zip(pods(job), annotations, strict=True):
        for key in ("hostNetwork", "hostPID", "hostIPC"):
            if pod.get(key) is True:
                found.append(f"task {task}: {key} is not allowed")
        for c in containers(pod):
            if as_map(c.get("securityContext")).get("privileged") is True:
                found.append(f"task {task}, container {c.get('name')}: privileged is not allowed")
        for v in (as_map(x) for x in as_seq(pod.get("volumes"))):
            if "hostPath" in v:
                found.append(f"task {task}: volume {v.get('name')} is a hostPath")
        found += _baseline(task, pod, task_annotations)
    return found


# Pod Security `restricted` (k8s.io/pod-security-admission v0.37.2 policy/check_*.go of
# Level restricted), which the platform's own job pods meet (jobs/render.py RESTRICTED_POD),
# init containers included. Until issue 37 an init container could run as root with CHOWN,
# DAC_OVERRIDE and FOWNER, for the job layer's `checkpoint-dir` step; any member could use
# that exception with any image and command. The team's checkpoint directory is now made
# group-writable by the platform (builders/storage.py), so nothing of a team runs as root.
RESTRICTED_CAPABILITIES = frozenset({"NET_BIND_SERVICE"})  # check_capabilities_restricted.go
# check_restrictedVolumes.go: a volume passes if it has any of these sources.
RESTRICTED_VOLUMES = ("configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "image",
                      "persistentVolumeClaim", "projected", "secret")  # fmt: skip


def _hardened_container(who: str, c: Mapping[str, Any], pod_sc: Mapping[str, Any]) -> list[str]:
    sc = as_map(c.get("securityContext"))
    found = []
    if sc.get("allowPrivilegeEscalation") is not False:
        found.append(f"{who}: allowPrivilegeEscalation is not false")
    caps = as_map(sc.get("capabilities"))
    if "ALL" not in [str(x) for x in as_seq(caps.get("drop"))]:
        found.append(f"{who}: capabilities.drop does not hold ALL")
    added = {str(a) for a in as_seq(caps.get("add"))} - RESTRICTED_CAPABILITIES
    if added:
        found.append(f"{who}: adds capabilities {sorted(added)}")
    seccomp = sc.get("seccompProfile") if "seccompProfile" in sc else pod_sc.get("seccompProfile")
    if as_map(seccomp).get("type") not in CONFINED_PROFILES:
        found.append(f"{who}: no RuntimeDefault or Localhost seccomp profile")
    non_root = sc["runAsNonRoot"] if "runAsNonRoot" in sc else pod_sc.get("runAsNonRoot")
    if non_root is not True:
        found.append(f"{who}: runAsNonRoot is not true")
    if "runAsUser" in sc and float(sc["runAsUser"]) == 0:
        found.append(f"{who}: runAsUser is 0")
    return found


def hardened_pods(job: Mapping[str, Any], cfg: Config) -> list[str]:
    """Issue 19 #10: job pods meet Pod Security restricted (issue 37: init containers too)
    and do not mount the service-account token they never use."""
    del cfg
    found = []
    for task, pod in pods(job):
        if pod.get("automountServiceAccountToken") is not False:
            found.append(f"task {task}: automountServiceAccountToken is not false")
        pod_sc = as_map(pod.get("securityContext"))
        if "runAsUser" in pod_sc and float(pod_sc["runAsUser"]) == 0:
            found.append(f"task {task}: the pod's runAsUser is 0")
        for v in (as_map(x) for x in as_seq(pod.get("volumes"))):
            if not any(k in v for k in RESTRICTED_VOLUMES):
                found.append(f"task {task}: volume {v.get('name')} is not of a restricted type")
        for c in containers(pod):
            found += _hardened_container(f"task {task}, container {c.get('name')}", c, pod_sc)
    return found
