"""Issue 37: a hostile member of the vision team tries every escape we could think of.

The member reads the same upstream source we do. Two levels, each where the boundary is:

**The API server**, with the prod platform deployed (its admission policies, PodSecurity
levels, RBAC and Volcano's webhooks): each attempt is submitted as a vision member, never as
an admin, and must be refused, by the policy that owns the boundary. Beside them, the
unchanged rendered job is admitted (the control: a suite that refused everything would pass
otherwise), and so is each attempt's honest twin where one exists. The attempts and what
each would have done before issue 37:

- Job-level `spec.volumes`: Volcano mounts them read-write into every container with no
  sub-path, and creates a claim from a `volumeClaim` spec verbatim (v1.15.1
  job_controller_util.go createJobPod; job_controller_actions.go createPVC);
- `volcano.sh/preemptable: "false"` and the other scheduling keys, on the Job or its
  templates, as labels or annotations, and added later by a metadata patch: pods off every
  preempt and reclaim list (pkg/scheduler/api/pod_info.go GetPodPreemptable), so borrowed
  GPUs are never returned; since issue 43 the key is allowed in the template annotations of
  one one-replica CPU task of at most 1 CPU and 1Gi (an elastic job's rendezvous pod, the
  honest twin), and refused on a GPU template, two replicas or 2Gi;
- a template `nodeName` (no scheduler, no queue, no taint), another scheduler, a system
  priority class for the Job, a class the team may not use, and one changed by an update; a
  confined team's GPU pod pinned to another team's pool;
- inline CSI volumes of a storage driver (fsx.csi.aws.com mounts whatever `mountname`
  says), the node cache mounted writable, a generic ephemeral volume whose claim names
  another team's PV, the datasets claim mounted writable;
- a root init container (the exception every member could use with any image, until now);
- job plugins that rewrite Secrets or delete NetworkPolicies named like the job (ssh, svc
  without --disable-network-policy) or add an init container of any image (pytorch
  --wait-master-image);
- and the mechanisms behind: a claim naming another team's PV stays Pending (the PV
  controller's claimRef check), PodSecurity `restricted` refuses a root pod in a team
  namespace whoever creates it.

**The kubelet and the kernel**, in a mount namespace of the test's own: the kubelet's real
sub-path code at the pinned version (`kubelet-subpath`, trainstack/sandbox/tools/kubernetes/
subpathprobe, called as makeMounts calls it) over a file system laid out as the platform lays
it out. A symlink a member plants in its checkpoint directory (relative, absolute, through a
chain, to another pod's volume on the node) reaches another team's files when the team's
volume is the whole file system, as before issue 37 (shown, so that the test would notice if
the kubelet stopped following links), and is refused now that it is rooted at the team's
directory; the job directory the kubelet makes is the trainer's through its group; the
datasets stay read-only even to root.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e import jobs
from tests.e2e.conftest import Deployed
from trainstack.builders.storage import TEAM_DIR_MODE, TRAINER_GID
from trainstack.kube import ApiError, becomes, wait_for
from trainstack.preview.engine import Previewer

Mutation = Callable[[dict[str, Any]], None]
POLICY = "trainstack-rule-"
TEAM, OTHER = "vision", "nlp"


# -- the API server ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def job(prod: Deployed) -> dict[str, Any]:
    """The vision team's job as its team stack renders it, on its reserved H100 pool."""
    return jobs.rendered(prod, jobs.spec(TEAM, "escape", pool="h100-reserved", gpus=8))


def _template(j: dict[str, Any], task: int = 0) -> dict[str, Any]:
    template: dict[str, Any] = j["spec"]["tasks"][task]["template"]
    return template


def _trainer(j: dict[str, Any]) -> dict[str, Any]:
    container: dict[str, Any] = _template(j)["spec"]["containers"][0]
    return container


def _meta(where: str, kind: str, key: str, value: str) -> Mutation:
    def mutate(j: dict[str, Any]) -> None:
        target = j["metadata"] if where == "job" else _template(j).setdefault("metadata", {})
        target.setdefault(kind, {})[key] = value

    return mutate


def _volume(volume: dict[str, Any], mount: dict[str, Any]) -> Mutation:
    def mutate(j: dict[str, Any]) -> None:
        _template(j)["spec"]["volumes"].append(volume)
        _trainer(j)["volumeMounts"].append({"name": volume["name"], **mount})

    return mutate


def _root_init(j: dict[str, Any]) -> None:
    """What the `checkpoint-dir` exception let any member run: its own image, as root."""
    _template(j)["spec"]["initContainers"] = [
        {
            "name": "checkpoint-dir",
            "image": _trainer(j)["image"],
            "command": ["sh", "-c", "cp -a /team/../nlp /checkpoints/loot"],
            "securityContext": {
                "runAsUser": 0,
                "runAsNonRoot": False,
                "allowPrivilegeEscalation": False,
                "capabilities": {"drop": ["ALL"], "add": ["CHOWN", "DAC_OVERRIDE", "FOWNER"]},
            },
            "resources": {"limits": {"cpu": "100m", "memory": "64Mi"}},
        }
    ]


def _pinned(*, replicas: int = 1, memory: str = "512Mi") -> Mutation:
    """Issue 43: a task like an elastic job's rendezvous appended to the job, a copy of its
    first task with one CPU container (500m CPU, `memory`, requests equal to limits) and
    `volcano.sh/preemptable: "false"` in its template annotations, `replicas` of it."""

    def mutate(j: dict[str, Any]) -> None:
        task = copy.deepcopy(j["spec"]["tasks"][0])
        task["name"] = "rendezvous"
        task["replicas"] = task["minAvailable"] = replicas
        amounts = {"cpu": "500m", "memory": memory}
        task["template"]["spec"]["containers"][0]["resources"] = {
            "requests": dict(amounts),
            "limits": dict(amounts),
        }
        meta = task["template"].setdefault("metadata", {})
        meta.setdefault("annotations", {})["volcano.sh/preemptable"] = "false"
        j["spec"]["tasks"].append(task)
        j["spec"]["minAvailable"] = sum(t["minAvailable"] for t in j["spec"]["tasks"])

    return mutate


WHOLE_FS = {"dnsname": "fs-0123456789abcdef0.fsx.us-east-1.amazonaws.com", "mountname": "fsx"}
# (attempt, mutation of the rendered job, policies any of which may refuse it)
ATTEMPTS: list[tuple[str, Mutation, set[str]]] = [
    (
        "a Job-level claim bound to another team's PV",
        lambda j: j["spec"].__setitem__(
            "volumes",
            [
                {
                    "mountPath": "/loot",
                    "volumeClaim": {
                        "accessModes": ["ReadWriteMany"],
                        "storageClassName": "",
                        "volumeName": f"{OTHER}-checkpoints",
                        "resources": {"requests": {"storage": "1Gi"}},
                    },
                }
            ],
        ),
        {"job-volumes"},
    ),
    (
        "the datasets claim as a Job-level volume, writable in every container",
        lambda j: j["spec"].__setitem__(
            "volumes", [{"mountPath": "/data-rw", "volumeClaimName": "datasets"}]
        ),
        {"job-volumes"},
    ),
    (
        "preemptable false on the Job",
        _meta("job", "annotations", "volcano.sh/preemptable", "false"),
        {"scheduling-keys"},
    ),
    (
        "preemptable as a Job label",
        _meta("job", "labels", "volcano.sh/preemptable", "false"),
        {"scheduling-keys"},
    ),
    (
        "preemptable, unparsable, on a template",
        _meta("template", "annotations", "volcano.sh/preemptable", "never"),
        {"scheduling-keys"},
    ),
    (
        "preemptable as a template label",
        _meta("template", "labels", "volcano.sh/preemptable", "false"),
        {"scheduling-keys"},
    ),
    # Issue 43: the one exception is a one-replica CPU task of at most 1 CPU and 1Gi (the
    # honest twin, test_a_small_cpu_task_may_opt_out_of_preemption); nothing larger.
    (
        "preemptable false on a GPU template",
        _meta("template", "annotations", "volcano.sh/preemptable", "false"),
        {"scheduling-keys"},
    ),
    ("preemptable false on a two-replica CPU task", _pinned(replicas=2), {"scheduling-keys"}),
    ("preemptable false on a CPU task of 2Gi", _pinned(memory="2Gi"), {"scheduling-keys"}),
    (
        "a preemption cooldown of ten years",
        _meta("job", "annotations", "volcano.sh/cooldown-time", "87600h"),
        {"scheduling-keys"},
    ),
    (
        "a revocable zone",
        _meta("job", "annotations", "volcano.sh/revocable-zone", "*"),
        {"scheduling-keys"},
    ),
    (
        "a task priority above the class",
        _meta("template", "annotations", "volcano.sh/task-priority", "2000000000"),
        {"scheduling-keys"},
    ),
    (
        "the bare sla key",
        _meta("job", "annotations", "sla-waiting-time", "1s"),
        {"scheduling-keys"},
    ),
    (
        "a node named in the template",
        lambda j: _template(j)["spec"].__setitem__("nodeName", "h100-reserved-0"),
        {"volcano-scheduled"},
    ),
    (
        "the default scheduler for a task",
        lambda j: _template(j)["spec"].__setitem__("schedulerName", "default-scheduler"),
        {"volcano-scheduled"},
    ),
    (
        "system-node-critical for the Job",
        lambda j: j["spec"].__setitem__("priorityClassName", "system-node-critical"),
        {"volcano-scheduled", "queue-ownership"},
    ),
    (
        "a class of the platform the team may not use",
        lambda j: j["spec"].__setitem__("priorityClassName", "trainstack-critical"),
        {"volcano-scheduled", "queue-ownership"},
    ),
    (
        "an inline FSx volume of the whole file system",
        _volume(
            {"name": "all", "csi": {"driver": "fsx.csi.aws.com", "volumeAttributes": WHOLE_FS}},
            {"mountPath": "/all"},
        ),
        {"pod-volumes"},
    ),
    (
        "an inline EFS volume",
        _volume({"name": "efs", "csi": {"driver": "efs.csi.aws.com"}}, {"mountPath": "/efs"}),
        {"pod-volumes"},
    ),
    (
        "the node cache, writable",
        _volume(
            {"name": "cache", "csi": {"driver": "cache.trainstack.io", "volumeAttributes": {}}},
            {"mountPath": "/cache"},
        ),
        {"pod-volumes"},
    ),
    (
        "a generic ephemeral volume bound to another team's PV",
        _volume(
            {
                "name": "eph",
                "ephemeral": {
                    "volumeClaimTemplate": {
                        "spec": {
                            "accessModes": ["ReadWriteMany"],
                            "storageClassName": "",
                            "volumeName": f"{OTHER}-checkpoints",
                            "resources": {"requests": {"storage": "1Gi"}},
                        }
                    }
                },
            },
            {"mountPath": "/eph"},
        ),
        {"pod-volumes"},
    ),
    (
        "the datasets claim mounted writable",
        _volume(
            {"name": "data-rw", "persistentVolumeClaim": {"claimName": "datasets"}},
            {"mountPath": "/data-rw"},
        ),
        {"pod-volumes"},
    ),
    ("a root init container with the old exception's capabilities", _root_init, {"hardened-pods"}),
    (
        "the ssh plugin (rewrites the Secret <job>-ssh)",
        lambda j: j["spec"]["plugins"].__setitem__("ssh", []),
        {"job-plugins"},
    ),
    (
        "svc managing a NetworkPolicy named like the job",
        lambda j: j["spec"]["plugins"].__setitem__("svc", []),
        {"job-plugins"},
    ),
    (
        "an init container of any image through pytorch's plugin",
        lambda j: j["spec"]["plugins"]["pytorch"].extend(
            ["--wait-master-enabled", "--wait-master-image=evil.example.com/x:1"]
        ),
        {"job-plugins"},
    ),
    (
        "the platform's PodGroup annotation on a template",
        _meta("template", "annotations", "scheduling.k8s.io/group-name", f"{OTHER}-x"),
        {"scheduling-keys"},
    ),
]


def _refused_by(prod: Deployed, job: dict[str, Any]) -> str | None:
    """The server's message refusing a dry-run create by a vision member, or None."""
    try:
        prod.kube.create(job, as_=prod.member(TEAM), dry_run=True)
    except ApiError as error:
        refusal = error
    else:
        return None
    if refusal.status not in (403, 422):
        raise refusal
    return refusal.message


@pytest.fixture(scope="module")
def enforced(prod: Deployed, job: dict[str, Any]) -> None:
    """The API server compiles policies from an informer: wait until the platform's newest
    rules (issue 37) refuse, and the control is admitted."""
    probe = copy.deepcopy(job)
    _template(probe)["spec"]["nodeName"] = "h100-reserved-0"
    wait_for("issue 37's policies enforced", lambda: _refused_by(prod, probe) is not None)
    assert _refused_by(prod, job) is None


def test_the_rendered_job_is_admitted(prod: Deployed, job: dict[str, Any], enforced: None) -> None:
    """The control: every refusal below is the attempt's, not the job's."""
    assert _refused_by(prod, job) is None


@pytest.mark.parametrize(
    ("attempt", "mutate", "policies"), ATTEMPTS, ids=[a for a, _, _ in ATTEMPTS]
)
def test_every_attempt_is_refused(
    attempt: str,
    mutate: Mutation,
    policies: set[str],
    prod: Deployed,
    job: dict[str, Any],
    enforced: None,
) -> None:
    escape = copy.deepcopy(job)
    mutate(escape)
    message = _refused_by(prod, escape)
    assert message is not None, f"{attempt}: admitted"
    names = {p if p == "queue-ownership" else POLICY + p for p in policies}
    assert any(name in message for name in names), message


def test_a_small_cpu_task_may_opt_out_of_preemption(
    prod: Deployed, job: dict[str, Any], enforced: None
) -> None:
    """The honest twin of the attempts above (issue 43): an elastic job's rendezvous pod, one
    replica, CPU only, 500m and 512Mi, with `volcano.sh/preemptable: "false"` in its
    template annotations, is admitted by every policy and Volcano's webhooks."""
    twin = copy.deepcopy(job)
    _pinned()(twin)
    assert _refused_by(prod, twin) is None


def test_a_confined_team_cannot_pin_another_pool(prod: Deployed, enforced: None) -> None:
    """recsys may use h200-burst only (prod's registry): a hand-made Job on h100-reserved,
    another team's guarantee, is refused; its own pool is admitted (issue 37)."""
    own = jobs.rendered(prod, jobs.spec("recsys", "escape-pool", pool="h200-burst", gpus=8))
    prod.kube.create(own, as_=prod.member("recsys"), dry_run=True)
    other = copy.deepcopy(own)
    for task in other["spec"]["tasks"]:
        for term in task["template"]["spec"]["affinity"]["nodeAffinity"][
            "requiredDuringSchedulingIgnoredDuringExecution"
        ]["nodeSelectorTerms"]:
            for expression in term["matchExpressions"]:
                if expression["key"] == "trainstack.io/pool":
                    expression["values"] = ["h100-reserved"]
    with pytest.raises(ApiError) as refused:
        prod.kube.create(other, as_=prod.member("recsys"), dry_run=True)
    assert f"{POLICY}gpu-placement" in refused.value.message


def test_scheduling_keys_added_later_by_a_patch_are_refused(
    prod: Deployed, job: dict[str, Any], enforced: None
) -> None:
    """A member may patch a Job's metadata at any time (Volcano's update webhook never looks:
    admit_job.go validateJobUpdate), and every pod created afterwards takes the Job's
    preemptable annotation (createJobPod, at each creation); the rule judges every UPDATE."""
    live = copy.deepcopy(job)
    live["metadata"]["name"] = "escape-patched"
    jobs.submit(prod, live)
    try:
        member = prod.member(TEAM)
        for kind in ("annotations", "labels"):
            with pytest.raises(ApiError) as refused:
                prod.kube.patch(
                    live, {"metadata": {kind: {"volcano.sh/preemptable": "false"}}}, as_=member
                )
            assert f"{POLICY}scheduling-keys" in refused.value.message
        with pytest.raises(ApiError) as refused:
            prod.kube.patch(
                live, {"spec": {"priorityClassName": "trainstack-critical"}}, as_=member
            )
        assert "priority" in refused.value.message
        # The honest update still goes through: a label of the team's own.
        prod.kube.patch(live, {"metadata": {"labels": {"owner": "ana"}}}, as_=member)
    finally:
        jobs.delete(prod, live)


def test_a_claim_naming_another_teams_volume_stays_pending(prod: Deployed) -> None:
    """What holds if a claim ever names another team's PV: the PV is pre-bound (claimRef)
    to the other namespace's claim, and the PV controller binds no other (k8s v1.37.2
    pv_controller.go syncUnboundClaim; component-helpers IsVolumeBoundToClaim). Members
    cannot create claims at all (their Role): this is the platform's own safety net."""
    member = prod.member(TEAM)
    claim = {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": "escape-claim", "namespace": TEAM},
        "spec": {
            "accessModes": ["ReadWriteMany"],
            "storageClassName": "",
            "volumeName": f"{OTHER}-checkpoints",
            "resources": {"requests": {"storage": "1Gi"}},
        },
    }
    with pytest.raises(ApiError) as denied:
        prod.kube.create(claim, as_=member)
    assert denied.value.status == 403
    prod.kube.create(claim)
    try:
        assert not becomes(
            lambda: (
                prod.kube.get("v1", "PersistentVolumeClaim", "escape-claim", TEAM)
                .get("status", {})
                .get("phase")
                == "Bound"
            ),
            5,
        )
        pv = prod.kube.get("v1", "PersistentVolume", f"{OTHER}-checkpoints")
        assert pv["spec"]["claimRef"]["namespace"] == OTHER
    finally:
        prod.kube.delete("v1", "PersistentVolumeClaim", "escape-claim", TEAM)


def test_the_namespace_refuses_a_root_pod_whoever_creates_it(prod: Deployed) -> None:
    """PodSecurity `restricted` in every team namespace judges the pods Volcano's controller
    creates too: a root container is refused at pod creation even past the Job rules."""
    namespace = prod.kube.get("v1", "Namespace", TEAM)
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "escape-root", "namespace": TEAM},
        "spec": {
            "containers": [
                {
                    "name": "c",
                    "image": "registry.example.com/x:1",
                    "securityContext": {"runAsUser": 0},
                }
            ]
        },
    }
    with pytest.raises(ApiError) as refused:
        prod.kube.create(pod, dry_run=True)  # as admin: PodSecurity has no exemption for it
    assert 'violates PodSecurity "restricted:latest"' in refused.value.message


def test_team_pods_cannot_reach_the_lustre_servers(prod: Deployed) -> None:
    """A pod that reached the file servers could speak LNet from user space, as any uid
    (lustre-release v2_15_0 lnet/lnet/acceptor.c). The kernel client mounts from the node;
    no team policy opens the Lustre ports to a pod."""
    policies = prod.kube.list("networking.k8s.io/v1", "NetworkPolicy", TEAM)
    ports = [
        port.get("port")
        for policy in policies
        for rule in policy["spec"].get("egress", [])
        for port in rule.get("ports", [])
    ]
    assert ports
    assert not {988, 1018} & set(ports), ports


# -- the kubelet and the kernel ----------------------------------------------------------------


def _mount_namespaces_work() -> bool:
    if shutil.which("unshare") is None or os.geteuid() != 0:
        return False
    probe = subprocess.run(["unshare", "-m", "true"], capture_output=True, check=False)
    return probe.returncode == 0


kernel = pytest.mark.skipif(
    not _mount_namespaces_work(),
    reason="needs root and a mount namespace (unshare -m), to bind-mount as the kubelet does",
)


class Node:
    """A node's view: the shared file system laid out as the platform lays it out, and the
    kubelet's pod directories, where each volume is published at its own mount point."""

    def __init__(self, root: Path) -> None:
        self.fs = root / "lustre"
        self.pods = root / "var/lib/kubelet/pods"
        for team in (TEAM, OTHER):
            directory = self.fs / "checkpoints" / team
            directory.mkdir(parents=True)
            os.chown(directory, 0, TRAINER_GID)
            directory.chmod(int(TEAM_DIR_MODE, 8))
        (self.fs / "checkpoints" / OTHER / "model.pt").write_text("nlp's weights")
        (self.fs / "datasets" / "imagenet" / "v1").mkdir(parents=True)
        (self.fs / "datasets" / "imagenet" / "v1" / "train.bin").write_text("data")
        self.job = self.fs / "checkpoints" / TEAM / "job"
        self.job.mkdir()
        os.chown(self.job, 10001, TRAINER_GID)

    def volume(self, pod: str, pv: str) -> Path:
        """Where the kubelet publishes a CSI PV for a pod (csi_mounter.go GetPath)."""
        return self.pods / pod / "volumes" / "kubernetes.io~csi" / pv / "mount"

    def kubelet(
        self,
        tool: Path,
        source: Path,
        sub_path: str,
        *,
        pod: str = "pod-a",
        read_only: bool = False,
        write: bool = False,
        also: tuple[tuple[Path, Path], ...] = (),
    ) -> dict[str, Any]:
        """In a mount namespace of its own: publish `source` as the pod's volume (a bind
        mount stands in for the CSI driver's fileset mount: its root is the directory,
        and `..` at it leaves the mount), then let the kubelet's code mount `sub_path`."""
        volume = self.volume(pod, "vision-checkpoints")
        mounts = [(source, volume, read_only), *((s, t, False) for s, t in also)]
        script = []
        for src, target, ro in mounts:
            target.mkdir(parents=True, exist_ok=True)
            script.append(f"mount --bind {src} {target}")
            if ro:  # what `ro` in the datasets PV's mountOptions gives the CSI driver's mount
                script.append(f"mount -o remount,bind,ro {target}")
        script.append(f'exec "$0" {volume} {sub_path} {self.pods / pod}')
        env = {**os.environ, "KUBELET_SUBPATH_WRITE": "1" if write else "0"}
        result = subprocess.run(
            ["unshare", "-m", "--propagation", "private", "sh", "-ec", "; ".join(script), tool],
            capture_output=True,
            text=True,
            check=True,
            env=env,
        )
        answer: dict[str, Any] = json.loads(result.stdout)
        return answer


@pytest.fixture
def node() -> Iterator[Node]:
    """Under a directory anyone may traverse, as a node's /var/lib/kubelet and the Lustre
    mount are (pytest's own temporary directories are root's alone, and the trainer's uid
    must reach its directory)."""
    root = Path(tempfile.mkdtemp(prefix="trainstack-node-"))
    root.chmod(0o755)
    try:
        yield Node(root)
    finally:
        shutil.rmtree(root)


LINKS = {
    "relative, to the other team": "../../nlp",
    # The pod's volume path is predictable: its uid (the downward API) and the PV's name.
    "absolute, through the volume's own path on the node": "{volume}/checkpoints/nlp",
    "through a chain of links": "hop",
    "to another pod's volume on this node": "{pods}/pod-b/volumes/kubernetes.io~csi/"
    "nlp-checkpoints/mount",
}


def _plant(node: Node, name: str) -> None:
    target = LINKS[name].format(pods=node.pods, volume=node.volume("pod-a", "vision-checkpoints"))
    if name == "through a chain of links":
        (node.job / "hop").symlink_to("../../nlp")
    (node.job / "x").symlink_to(target)


@kernel
@pytest.mark.parametrize("link", list(LINKS))
def test_a_planted_symlink_reaches_no_other_team(
    link: str, node: Node, tools: dict[str, Path]
) -> None:
    _plant(node, link)
    other_pod = ((node.fs / "checkpoints" / OTHER, node.volume("pod-b", "nlp-checkpoints")),)
    # Before issue 37: the team's volume was the whole file system, and the job mounted
    # checkpoints/vision/job/x. The kubelet resolves the link on the host and only checks
    # that the result stays inside the volume: the other team's files, read-write.
    if link != "to another pod's volume on this node":  # outside even the whole-fs volume
        before = node.kubelet(
            tools["kubelet-subpath"], node.fs, f"checkpoints/{TEAM}/job/x", also=other_pod
        )
        assert "model.pt" in before.get("entries", []), before
    # Now: the volume is the team's directory, and the job mounts job/x.
    now = node.kubelet(
        tools["kubelet-subpath"], node.fs / "checkpoints" / TEAM, "job/x", also=other_pod
    )
    # Refused before any mount: by SafeMakeDir when the resolved path does not exist under
    # the volume (it will not create through a link), else by PrepareSafeSubpath's check.
    assert now.get("stage") in ("mkdir", "bind"), now
    assert "entries" not in now, now
    assert not (node.fs / "checkpoints" / OTHER / "written-by-the-probe").exists()


@kernel
def test_dot_dot_at_a_volumes_root_stays_out_of_the_file_system(node: Node) -> None:
    """Inside the pod a path can only go up to the mount's root: `..` there is the mount
    point's parent in the pod's own file system (fs/namei.c follow_dotdot)."""
    mount = node.volume("pod-a", "vision-checkpoints")
    mount.mkdir(parents=True)
    script = (
        f"mount --bind {node.fs / 'checkpoints' / TEAM} {mount}; "
        f"stat -c %i {mount}/.. {mount.parent} {node.fs / 'checkpoints'}"
    )
    inodes = subprocess.run(
        ["unshare", "-m", "--propagation", "private", "sh", "-ec", script],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    up, parent, checkpoints = inodes
    assert up == parent != checkpoints


@kernel
def test_the_job_directory_the_kubelet_makes_is_the_trainers(
    node: Node, tools: dict[str, Path]
) -> None:
    """Why no root init container is needed: below a root:10001 2770 team directory the
    kubelet's SafeMakeDir (with GetMode of the volume root, as makeMounts passes it) makes the
    job's directory root:10001 2770, which uid 10001 writes through its group."""
    team = node.fs / "checkpoints" / TEAM
    made = node.kubelet(tools["kubelet-subpath"], team, "new-job")
    assert made["created"] is True, made
    assert "error" not in made, made
    st = os.stat(team / "new-job")
    assert (st.st_uid, st.st_gid, st.st_mode & 0o7777) == (0, TRAINER_GID, int(TEAM_DIR_MODE, 8))
    written = subprocess.run(
        ["sh", "-c", f"echo step > {team / 'new-job' / 'ckpt'} && mkdir {team / 'new-job' / 'd'}"],
        user=10001,
        group=10001,
        extra_groups=[],
        capture_output=True,
        text=True,
        check=False,
    )
    assert written.returncode == 0, written.stderr
    # Before issue 37 a job's directory was made below a root:root 0755 one, as root 0755:
    # the trainer could not write it, hence the root init container.
    old = node.fs / "old-layout"
    old.mkdir(mode=0o755)
    node.kubelet(tools["kubelet-subpath"], old, "job")
    refused = subprocess.run(
        ["sh", "-c", f"echo step > {old / 'job' / 'ckpt'}"],
        user=10001,
        group=10001,
        extra_groups=[],
        capture_output=True,
        check=False,
    )
    assert refused.returncode != 0


@kernel
def test_datasets_are_read_only_even_to_root(node: Node, tools: dict[str, Path]) -> None:
    """The datasets volume is mounted `ro` (its PV's mountOptions); the kubelet's bind of a
    version inside it copies the flag (fs/namespace.c clone_mnt), so nobody in the pod can
    write, root with DAC_OVERRIDE included: the probe runs as root."""
    result = node.kubelet(
        tools["kubelet-subpath"], node.fs / "datasets", "imagenet/v1", read_only=True, write=True
    )
    assert result["entries"] == ["train.bin"], result
    assert "read-only file system" in (result["writeError"] or ""), result
    writable = node.kubelet(
        tools["kubelet-subpath"], node.fs / "datasets", "imagenet/v1", write=True
    )
    assert writable["writeError"] == "", writable  # the control: the flag is what refuses


def test_the_platform_lays_out_what_these_tests_assume(previewer: Previewer) -> None:
    """The layout above is the platform's: each team's directory root:10001 2770, the team's
    volume rooted there, datasets `ro` (the plan, not a copy of it)."""
    plan = previewer.preview("prod")
    objects = {(o["kind"], o["metadata"]["name"]): o for _, o in plan.kubernetes_objects()}
    layout = next(o for (kind, name), o in objects.items() if kind == "Job" and "layout" in name)
    args = layout["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--gid") + 1] == str(TRAINER_GID)
    assert args[args.index("--mode") + 1] == TEAM_DIR_MODE
    pv = objects[("PersistentVolume", f"{TEAM}-checkpoints")]
    assert pv["spec"]["csi"]["volumeAttributes"]["mountname"].endswith(f"/checkpoints/{TEAM}")
    assert "ro" in objects[("PersistentVolume", f"{TEAM}-datasets")]["spec"]["mountOptions"]
