"""The rendered Volcano Job, feature by feature, and its identity with what stacks deploy."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from pulumi.output import UNKNOWN
from pulumi.runtime import rpc
from pulumi.runtime.sync_await import _sync_await
from trainstack_runtime.contract import FATAL, RETRYABLE, ExitCode
from typer.testing import CliRunner

from tests.conftest import ROOT
from tests.jobs.test_elastic import resized
from trainstack.builders.storage import CACHE_DRIVER
from trainstack.cli import app
from trainstack.components.jobs import spec_or_fail
from trainstack.config import ConfigError
from trainstack.jobs.checks import platform_issues
from trainstack.jobs.lifecycle import replacement_key, volcano_max_retry
from trainstack.jobs.platform import PlatformView
from trainstack.jobs.render import render
from trainstack.jobs.spec import Data, JobSpec, Topology, load_job
from trainstack.outputs import team_output
from trainstack.preview.plan import Plan, normalise

DEMO = ROOT / "job_specs" / "vision" / "demo-train.yaml"
PS = ROOT / "job_specs" / "vision" / "embeddings-ps.yaml"
FSDP = ROOT / "job_specs" / "vision" / "fsdp-multinode.yaml"
ELASTIC = ROOT / "job_specs" / "vision" / "elastic-pretrain.yaml"


@pytest.fixture
def view(example_plans: dict[str, Plan]) -> PlatformView:
    return PlatformView(example_plans["prod"].outputs)


def job(spec: JobSpec, view: PlatformView) -> dict[str, Any]:
    return render(spec, view, "vision")


def container(manifest: dict[str, Any], task: str = "master") -> dict[str, Any]:
    t = next(t for t in manifest["spec"]["tasks"] if t["name"] == task)
    result: dict[str, Any] = t["template"]["spec"]["containers"][0]
    return result


def env(c: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e["value"] for e in c["env"] if "value" in e}


def test_gang_queue_priority_and_plugins(view: PlatformView) -> None:
    manifest = job(load_job(DEMO), view)
    spec = manifest["spec"]
    assert manifest["metadata"]["namespace"] == "vision"
    assert spec["queue"] == "vision"
    assert spec["priorityClassName"] == "trainstack-normal"
    assert spec["schedulerName"] == "volcano"
    assert spec["minAvailable"] == 2
    assert [(t["name"], t["replicas"]) for t in spec["tasks"]] == [("master", 1), ("worker", 1)]
    assert spec["plugins"]["pytorch"] == ["--master=master", "--worker=worker", "--port=23456"]
    assert spec["plugins"]["svc"] == ["--disable-network-policy=true"]
    assert spec["maxRetry"] == 104  # the spec's 3 failed runs and 100 preemptions (see below)


def test_every_field_volcanos_webhook_defaults_is_rendered(view: PlatformView) -> None:
    """Volcano's mutating webhook fills these at creation (v1.15.1 mutate_job.go:
    patchDefaultQueue, patchDefaultScheduler, patchDefaultMaxRetry, patchDefaultMinAvailable,
    mutateSpec). Server-side apply gives the defaults to the applier, so an apply that omits
    them removes them and Volcano refuses even a replicas-only update (shown on the real
    control plane by tests/e2e/test_lifecycle.py::test_what_volcano_updates_in_place_...)."""
    manifest = job(load_job(DEMO), view)
    spec = manifest["spec"]
    assert {"queue", "schedulerName", "maxRetry", "minAvailable"} <= set(spec)
    for task in spec["tasks"]:
        assert {"name", "minAvailable", "maxRetry"} <= set(task), task["name"]
        assert not task["template"]["spec"].get("hostNetwork")  # else dnsPolicy is defaulted
    assert {"svc"} <= set(spec["plugins"])  # patchDefaultPlugins adds svc for pytorch


def _runs(retries: int, preemptions: int, causes: str) -> tuple[int, str]:
    """Runs of a job whose run i ends as ``causes[i]`` ("f" failure, "p" preemption; the
    last repeats), under Volcano v1.15.1's count and the runtime's: each RestartJob counts
    (state/running.go RetryCount++), the job fails in the restarting state once RetryCount
    >= maxRetry (state/restarting.go); the runtime exits retries_exhausted (AbortJob) at the
    failed run beyond maxRetries (trainstack_runtime/crashes.py)."""
    max_retry = volcano_max_retry(retries, preemptions)
    runs, retry_count, failed = 1, 0, 0
    while True:
        cause = causes[min(runs - 1, len(causes) - 1)]
        if cause == "f":
            failed += 1
            if failed > retries:
                return runs, "Aborted"  # the runtime's verdict: 6 -> AbortJob
        retry_count += 1  # running -> Restarting
        if retry_count >= max_retry:
            return runs, "Failed"  # restarting -> Failed
        runs += 1  # restarting -> Pending -> Running


@pytest.mark.parametrize("retries", [1, 2, 3, 100])
def test_max_retries_means_failed_runs_after_the_first(retries: int) -> None:
    """Issue 15 #7, issue 40 #5; the e2e scenarios in tests/e2e/test_lifecycle.py show
    Volcano's side of it."""
    assert _runs(retries, 100, "f") == (1 + retries, "Aborted")
    # Preemptions in between do not spend the failure budget (they used to: issue 40 #5).
    assert _runs(retries, 100, "fp" * 200) == (2 * retries + 1, "Aborted")
    assert _runs(retries, 10, "p" * 10 + "f") == (10 + retries + 1, "Aborted")


@pytest.mark.parametrize("preemptions", [0, 1, 10, 1000])
def test_max_preemptions_is_a_ceiling_on_other_restarts(preemptions: int) -> None:
    """A job preempted (or restarted with no verdict) for ever stops at Volcano's maxRetry:
    maxPreemptions restarts beyond the failure budget still unspent."""
    assert _runs(3, preemptions, "p") == (1 + 3 + preemptions, "Failed")
    assert _runs(1, preemptions, "fp") == (1 + 1 + preemptions, "Failed")


def test_the_runtime_knows_its_budget_and_its_run(view: PlatformView) -> None:
    spec = dataclasses.replace(load_job(DEMO), max_retries=7, max_preemptions=20)
    manifest = job(spec, view)
    assert manifest["spec"]["maxRetry"] == 28
    for task in manifest["spec"]["tasks"]:
        env = {e["name"]: e for e in task["template"]["spec"]["containers"][0]["env"]}
        assert env["TRAINSTACK_MAX_FAILURES"]["value"] == "7"
        # Volcano v1.15.1 createJobPod stamps the retry count on every pod it creates.
        assert env["TRAINSTACK_JOB_RETRY"]["valueFrom"] == {
            "fieldRef": {"fieldPath": "metadata.annotations['volcano.sh/job-retry-count']"}
        }


def test_devices_and_env_come_from_the_pools_fabric(view: PlatformView) -> None:
    c = container(job(load_job(DEMO), view))
    assert c["resources"]["requests"] == {
        "cpu": "4",
        "hugepages-2Mi": "640Mi",
        "memory": "16Gi",
        "nvidia.com/gpu": "1",
        "vpc.amazonaws.com/efa": "4",  # p5.48xlarge: 32 EFA / 8 GPUs
    }
    assert c["resources"]["limits"] == c["resources"]["requests"]
    values = env(c)
    assert values["NCCL_TUNER_PLUGIN"].endswith("libnccl-ofi-tuner.so")
    assert "FI_EFA_FORK_SAFE" not in values
    assert values["DATA_VERSION"] == "v20250401"
    assert values["LEARNING_RATE"] == "0.001"
    assert values["TRAINSTACK_CHECKPOINT_INTERVAL_S"] == "600"
    assert values["TRAINSTACK_CHECKPOINT_KEEP"] == "3"
    assert values["TRAINSTACK_MAX_DURATION_S"] == "86400"
    assert values["TRAINSTACK_CHECKPOINT_DIR"] == "/checkpoints"


def test_h200_pool_halves_the_efa_share(view: PlatformView) -> None:
    spec = dataclasses.replace(load_job(DEMO), pool="h200-burst")
    c = container(job(spec, view))
    assert c["resources"]["requests"]["vpc.amazonaws.com/efa"] == "2"  # p5en: 16 / 8


def test_shm_volumes_and_mounts(view: PlatformView) -> None:
    manifest = job(load_job(DEMO), view)
    pod = manifest["spec"]["tasks"][0]["template"]["spec"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["dshm"] == {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "8Gi"}}
    # Issue 37: two claims, each rooted at its own directory: the job's checkpoint directory
    # is a sub-path of the team's volume, the dataset version one of the read-only datasets.
    assert volumes["checkpoints"]["persistentVolumeClaim"] == {"claimName": "checkpoints"}
    assert volumes["data"]["persistentVolumeClaim"] == {"claimName": "datasets", "readOnly": True}
    mounts = {m["mountPath"]: m for m in pod["containers"][0]["volumeMounts"]}
    assert mounts["/checkpoints"]["subPath"] == "demo-train"
    assert mounts["/mnt/data"] == {
        "name": "data",
        "mountPath": "/mnt/data",
        "subPath": "imagenet/v20250401",
        "readOnly": True,
    }


def test_policies_by_exit_code(view: PlatformView) -> None:
    policies = job(load_job(DEMO), view)["spec"]["policies"]
    by_code = {p["exitCode"]: p["action"] for p in policies if "exitCode" in p}
    for code in RETRYABLE:
        assert by_code[int(code)] == "RestartJob"
    for code in FATAL - {ExitCode.DEADLINE_EXCEEDED}:
        assert by_code[int(code)] == "AbortJob"
    assert by_code[int(ExitCode.DEADLINE_EXCEEDED)] == "TerminateJob"
    assert {"event": "PodEvicted", "action": "RestartJob"} in policies
    assert all("event" not in p for p in policies if "exitCode" in p)  # Volcano: never both


def test_finished_jobs_are_not_collected(view: PlatformView) -> None:
    """Issue 15 (also check): with a TTL, Volcano's collector deleted a finished job the team
    stack manages and the next `pulumi up` after a refresh ran it again; Aborted jobs were
    never collected at all (garbagecollector.go isJobFinished). See jobs/lifecycle.py."""
    assert "ttlSecondsAfterFinished" not in job(load_job(DEMO), view)["spec"]


@pytest.mark.parametrize(
    ("code", "action"),
    [(139, "RestartJob"), (143, "RestartJob"), (134, "RestartJob"), (1, "AbortJob"),
     (0, "RestartJob"), (127, "RestartJob"), (4, "TerminateJob")],
)  # fmt: skip
def test_every_failure_has_an_action(view: PlatformView, code: int, action: str) -> None:
    """Issue 15 (also check): signals the runtime did not catch (128 + n) and failed pods
    whose code no policy names (a kubelet eviction reports 0) restarted nothing before; now
    Volcano's first matching policy, in list order (applyPolicies), gives each an action."""
    policies = job(load_job(DEMO), view)["spec"]["policies"]

    def first_match(event: str, exit_code: int) -> str:
        for policy in policies:
            if policy.get("event") == event or (exit_code and policy.get("exitCode") == exit_code):
                return str(policy["action"])
        return "SyncJob"  # Volcano's default: the failed pod is not recreated

    assert first_match("PodFailed", code) == action
    assert first_match("PodEvicted", 0) == "RestartJob"


def test_scheduling_probe_grace_and_command(view: PlatformView) -> None:
    pod = job(load_job(DEMO), view)["spec"]["tasks"][0]["template"]["spec"]
    assert pod["restartPolicy"] == "Never"  # exit codes are read from Failed pods only
    assert pod["serviceAccountName"] == "training"
    assert pod["terminationGracePeriodSeconds"] == 300
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod[
        "tolerations"
    ]
    terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert terms["nodeSelectorTerms"][0]["matchExpressions"] == [
        {"key": "trainstack.io/pool", "operator": "In", "values": ["h100-reserved"]}
    ]
    c = pod["containers"][0]
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": 8080}
    assert c["ports"] == [{"name": "metrics", "containerPort": 8080}]
    assert c["command"] == [
        "python", "-m", "trainstack_runtime.supervisor", "--nproc-per-node", "1",
        "--", "-m", "train.main",
    ]  # fmt: skip
    assert c["args"] == ["--epochs=20", "--batch-size=128"]


def test_parameter_server_mode_and_topology(view: PlatformView) -> None:
    manifest = job(load_job(PS), view)
    spec = manifest["spec"]
    assert [(t["name"], t["replicas"]) for t in spec["tasks"]] == [("ps", 2), ("worker", 4)]
    assert "pytorch" not in spec["plugins"]
    assert spec["minAvailable"] == 6
    assert spec["networkTopology"] == {"mode": "hard", "highestTierAllowed": 1}
    ps = container(manifest, "ps")
    assert "nvidia.com/gpu" not in ps["resources"]["requests"]
    worker = container(manifest, "worker")
    assert worker["resources"]["requests"]["nvidia.com/gpu"] == "2"
    assert worker["resources"]["limits"]["cpu"] == "32"
    assert spec["priorityClassName"] == "trainstack-normal"  # high would not preempt: advice()


def image_user() -> int:
    """The uid the training images run as, from the base image's Dockerfile."""
    text = (ROOT / "images" / "base" / "Dockerfile").read_text()
    users = re.findall(r"^USER (\d+):\d+$", text, re.MULTILINE)
    assert len(users) == 1, users
    return int(users[0])


def test_no_pod_runs_anything_as_root(view: PlatformView) -> None:
    """Issue 37: the root `checkpoint-dir` init container is gone. The kubelet creates the
    job's checkpoint sub-path with the group and mode of the team's directory, which the
    platform makes root:10001 2770 (builders/storage.py TEAM_DIR_MODE; the real kubelet code
    does so in tests/e2e/test_escapes.py), so the trainer writes it through its group."""
    for path in (DEMO, PS):
        for task in job(load_job(path), view)["spec"]["tasks"]:
            pod = task["template"]["spec"]
            assert "initContainers" not in pod
            assert pod["securityContext"]["runAsUser"] == image_user()
            assert pod["securityContext"]["runAsGroup"] == image_user()
            for c in pod["containers"]:
                assert "runAsUser" not in c["securityContext"]
                assert c["securityContext"]["capabilities"] == {"drop": ["ALL"]}


def cache_job(cache_from: str | None = "s3://acme-datasets/imagenet/v1/") -> JobSpec:
    """The demo job reading its dataset from the node cache on dev's l40s pool."""
    spec = dataclasses.replace(
        load_job(DEMO),
        pool="l40s-dev",
        data=Data("imagenet", "v1", "/mnt/data", "cache", cache_from),
        topology=Topology("soft", "pool"),
    )
    return dataclasses.replace(spec, workers=dataclasses.replace(spec.workers, gpu_memory=None))


def test_nvme_cache_is_the_nodes_shared_copy_mounted_read_only(
    example_plans: dict[str, Plan],
) -> None:
    """Issue 24 #1: no per-pod claim and no init container: an inline CSI volume of the node
    cache agent, which fetches the version once per node, holds it while the pod runs and
    mounts it read-only; training starts only once the kubelet has it mounted."""
    dev = PlatformView(example_plans["dev"].outputs)
    pod = render(cache_job(), dev, "vision")["spec"]["tasks"][0]["template"]["spec"]
    assert "initContainers" not in pod
    (volume,) = (v for v in pod["volumes"] if v["name"] == "dataset")
    assert volume == {
        "name": "dataset",
        "csi": {
            "driver": "cache.trainstack.io",
            "readOnly": True,
            "volumeAttributes": {
                "source": "s3://acme-datasets/imagenet/v1/",
                "dataset": "imagenet",
                "version": "v1",
            },
        },
    }
    assert not any("ephemeral" in v or "hostPath" in v for v in pod["volumes"])
    (mount,) = (m for m in pod["containers"][0]["volumeMounts"] if m["name"] == "dataset")
    assert mount == {"name": "dataset", "mountPath": "/mnt/data", "readOnly": True}
    assert pod["containers"][0]["command"][:3] == ["python", "-m", "trainstack_runtime.supervisor"]


def test_the_driver_is_the_agents() -> None:
    from trainstack_prewarm.csi import DRIVER_NAME  # noqa: PLC0415 (the image's package)

    assert CACHE_DRIVER == DRIVER_NAME


def test_a_cache_source_the_agent_does_not_fetch_from_is_refused(
    example_plans: dict[str, Plan],
) -> None:
    dev = PlatformView(example_plans["dev"].outputs)
    assert issues_of(cache_job("s3://elsewhere/imagenet/v1/"), dev) == [
        "job.spec.data.cacheFrom: 's3://elsewhere/imagenet/v1/' is not under a source the node "
        "cache fetches from (s3://acme-datasets/); the platform adds one in "
        "storage.nvmeCache.sources"
    ]


@pytest.mark.parametrize("path", [DEMO, PS], ids=lambda p: p.stem)
def test_task_templates_are_valid_pods(path: Path, view: PlatformView) -> None:
    """Volcano's CRD leaves pod templates loosely typed; check them as real Pods."""
    for task in job(load_job(path), view)["spec"]["tasks"]:
        template = task["template"]
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": task["name"], **template["metadata"]},
            "spec": template["spec"],
        }
        kubernetes_validate.validate(normalise(pod), "1.33", strict=True)


def test_render_job_cli_equals_what_the_team_stack_registers(
    example_plans: dict[str, Plan],
) -> None:
    registered = {
        r.inputs["metadata"]["name"]: r.inputs
        for r in example_plans["vision"].resources
        if r.type == "kubernetes:batch.volcano.sh/v1alpha1:Job"
    }
    examples = {"demo-train": DEMO, "embeddings-ps": PS, "fsdp-multinode": FSDP,
                "elastic-pretrain": ELASTIC}  # fmt: skip
    assert set(registered) == set(examples)
    runner = CliRunner()
    for name, path in examples.items():
        result = runner.invoke(
            app, ["render-job", str(path), "--stack", "vision", "--project-dir", str(ROOT)]
        )
        assert result.exit_code == 0, result.output
        assert yaml.safe_load(result.output) == registered[name]


def test_the_team_stack_hands_the_sdk_tasks_it_need_not_walk(view: PlatformView) -> None:
    """TrainingJob's spec Output holds its tasks as a tuple (components/jobs.spec_or_fail):
    the same document, which the SDK walks for unknowns only at its top level. Both SDK
    behaviours it relies on are asserted against the installed pulumi: contains_unknowns
    descends into dicts and lists only, and serialize_property sends any Sequence as a list
    (pulumi 3.272.0 runtime/rpc.py contains_unknowns, serialize_property)."""
    spec = load_job(DEMO)
    handed = spec_or_fail(spec, view, "vision")
    assert isinstance(handed["tasks"], tuple)
    assert {**handed, "tasks": list(handed["tasks"])} == job(spec, view)["spec"]
    assert replacement_key(handed) == replacement_key(job(spec, view)["spec"])
    assert rpc.contains_unknowns({"a": [UNKNOWN]})
    assert not rpc.contains_unknowns(([UNKNOWN],))
    # On the SDK's own loop, as the preview runs it: asyncio.run would close the thread's
    # loop and leave the next test's mocks without one.
    sent = _sync_await(rpc.serialize_property(({"a": 1}, "b"), [], "tasks"))
    assert sent == [{"a": 1}, "b"]


def test_render_job_reports_platform_errors_cleanly(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(DEMO.read_text().replace("gpus: 1", "gpus: 3"))
    result = CliRunner().invoke(
        app, ["render-job", str(bad), "--stack", "vision", "--project-dir", str(ROOT)]
    )
    assert result.exit_code == 1
    assert (
        "job.spec.workers.gpus: pool h100-reserved: 3 GPUs per replica does not divide"
        in result.output
    )
    assert "Traceback" not in result.output


def test_every_variant_validates_against_the_volcano_crd(
    view: PlatformView, example_plans: dict[str, Plan], reference: Path
) -> None:
    from tests.conformance.crds import crd_errors  # noqa: PLC0415 (needs the reference folder)

    demo = load_job(DEMO)
    variants = [
        render(demo, view, "vision"),
        render(load_job(PS), view, "vision"),
        render(dataclasses.replace(demo, topology=Topology("soft", "zone")), view, "vision"),
        render(
            cache_job(),
            PlatformView(example_plans["dev"].outputs),
            "vision",
        ),
    ]
    for manifest in variants:
        assert crd_errors(reference, normalise(manifest)) == []


def test_torchs_watchdog_mode_is_not_overridden(example_plans: dict[str, Plan]) -> None:
    """Issue 22 #8. `TORCH_NCCL_ASYNC_ERROR_HANDLING=1` aborts the communicators in the
    watchdog, an abort known to hang (pytorch/pytorch#110723, which made 3 torch's default;
    torch 2.13 include/torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp). No pool's profile
    nor rendered job sets it: the runtime's supervisor passes torch's 3 to the workers."""
    for name, plan in example_plans.items():
        for pool in plan.outputs.get("gpuPools", []):
            assert "TORCH_NCCL_ASYNC_ERROR_HANDLING" not in pool["profile"]["env"], name
            assert pool["profile"]["env"]["TORCH_NCCL_DUMP_ON_TIMEOUT"] == "1", name
    prod = PlatformView(example_plans["prod"].outputs)
    for path in (DEMO, PS):
        manifest = job(load_job(path), prod)
        for task in manifest["spec"]["tasks"]:
            assert "TORCH_NCCL_ASYNC_ERROR_HANDLING" not in env(container(manifest, task["name"]))


def test_the_deadline_is_keyed_to_the_job_instance(view: PlatformView) -> None:
    """Issue 22 #10. The runtime's deadline marker lives in the checkpoint directory, which
    belongs to the job's name and outlives the job: a job created again under its name died
    at once. Every trainer gets the instance, Volcano's PodGroup name `<job>-<job uid>`
    (v1.15.1 job_controller_util.go createJobPod), through the downward API."""
    for path in (DEMO, PS):
        manifest = job(load_job(path), view)
        for task in manifest["spec"]["tasks"]:
            entries = {e["name"]: e for e in container(manifest, task["name"])["env"]}
            field = "metadata.annotations['scheduling.k8s.io/group-name']"
            assert entries["TRAINSTACK_JOB_INSTANCE"] == {
                "name": "TRAINSTACK_JOB_INSTANCE",
                "valueFrom": {"fieldRef": {"fieldPath": field}},
            }


# -- behaviours stated one at a time (issue 25) ------------------------------------------------


def with_team(view: PlatformView, team: str, **changes: Any) -> PlatformView:
    """The view with one team's slice changed: `storage` or `scheduling` replaced, or the
    team removed (`remove=True`)."""
    outputs = dict(view.outputs)
    if changes.pop("remove", False):
        del outputs[team_output(team)]
    else:
        slice_ = json.loads(outputs[team_output(team)])
        slice_ |= changes
        outputs[team_output(team)] = json.dumps(slice_)
    return PlatformView(outputs)


def issues_of(spec: JobSpec, view: PlatformView) -> list[str]:
    return [str(i) for i in platform_issues(spec, view, None)]


def test_a_team_missing_from_the_registry_is_named_and_stops_the_checks(
    view: PlatformView,
) -> None:
    """Without its team the platform gives a job no queue, storage or limits: the job is
    refused by that one reason, not by a cascade of others."""
    spec = load_job(DEMO)
    assert issues_of(spec, with_team(view, "vision", remove=True)) == [
        "job.metadata.team: team 'vision' is not in the platform registry"
    ]
    with pytest.raises(ConfigError):
        render(spec, with_team(view, "vision", remove=True))


def test_datasets_on_lustre_need_the_platforms_dataset_file_system(view: PlatformView) -> None:
    """A job reading its data from Lustre on a platform without a dataset file system would
    mount a claim that does not exist, and wait forever: refused, with the way out."""
    spec = load_job(DEMO)
    assert spec.data is not None
    assert spec.data.source == "lustre"
    storage = dict(view.storage("vision"))
    del storage["datasetClaim"]
    assert issues_of(spec, with_team(view, "vision", storage=storage)) == [
        "job.spec.data.source: the platform has no dataset file system (storage.lustre); use "
        "source: cache"
    ]
    assert (
        issues_of(dataclasses.replace(spec, data=None), with_team(view, "vision", storage=storage))
        == []
    )


def test_a_one_replica_job_has_a_master_and_no_empty_worker_task(view: PlatformView) -> None:
    """Volcano's pytorch plugin needs the master task; a worker task of 0 replicas would be
    an empty gang member (and WORLD_SIZE would count it)."""
    spec = load_job(DEMO)
    one = dataclasses.replace(spec, workers=dataclasses.replace(spec.workers, replicas=1))
    manifest = job(one, view)
    assert [(t["name"], t["replicas"]) for t in manifest["spec"]["tasks"]] == [("master", 1)]
    assert manifest["spec"]["minAvailable"] == 1
    three = dataclasses.replace(spec, workers=dataclasses.replace(spec.workers, replicas=3))
    tasks = job(three, view)["spec"]["tasks"]
    assert [(t["name"], t["replicas"], t["minAvailable"]) for t in tasks] == [
        ("master", 1, 1),
        ("worker", 2, 2),
    ]


@pytest.mark.parametrize(
    ("stack", "tier", "hypernode_tier"),
    [("prod", "pool", 1), ("prod", "zone", 4), ("onprem", "pool", 1), ("onprem", "zone", 2)],
)
def test_topology_tiers_are_the_hypernodes_tiers(
    stack: str, tier: str, hypernode_tier: int, example_plans: dict[str, Plan]
) -> None:
    """`highestTierAllowed` counts HyperNode tiers, which the platform publishes per team
    (`topologyTiers`). prod: Volcano discovers them from EKS's labels, zone, then network
    layers 1 to 3 (tier 1 the nearest, builders/topology.py), so `zone` is tier 4; onprem: the
    platform's own, a pool (tier 1) in a zone (tier 2, builders/scheduling.hypernodes)."""
    plan = example_plans[stack]
    team = next(k for k in plan.outputs if k.startswith("team/")).removeprefix("team/")
    assert PlatformView(plan.outputs).scheduling(team)["topologyTiers"][tier] == hypernode_tier
    if stack == "prod":
        spec = dataclasses.replace(load_job(PS), topology=Topology(mode="soft", tier=tier))  # type: ignore[arg-type]
        assert job(spec, PlatformView(plan.outputs))["spec"]["networkTopology"] == {
            "mode": "soft",
            "highestTierAllowed": hypernode_tier,
        }
    hypernodes = [r for r in plan.resources if r.type.endswith(":HyperNode")]
    release = next(r for r in plan.resources if r.inputs.get("chart") == "volcano")
    discovery = release.inputs["values"]["custom"].get("controller_config_override")
    if stack == "onprem":
        tiers = {r.inputs["spec"]["tierName"]: r.inputs["spec"]["tier"] for r in hypernodes}
        assert tiers[tier] == hypernode_tier
        assert discovery is None
    else:
        # no HyperNode of the platform's own beside the discovered ones: one tree
        assert hypernodes == []
        [source] = discovery["networkTopologyDiscovery"]
        [labels] = source["config"]["networkTopologyTypes"].values()
        # Volcano numbers tiers from the label above kubernetes.io/hostname (label.go parseCfg)
        keys = [entry["nodeLabel"] for entry in labels][:-1]
        wanted = "topology.kubernetes.io/zone" if tier == "zone" else keys[-1]
        assert len(keys) - keys.index(wanted) == hypernode_tier


def test_a_platform_that_publishes_no_tiers_gets_the_pool_and_zone_tiers(
    example_plans: dict[str, Plan],
) -> None:
    """A platform stack from before `topologyTiers` made pool and zone HyperNodes only."""
    outputs = dict(example_plans["prod"].outputs)
    slice_ = json.loads(outputs["team/vision"])  # a JSON string (trainstack/outputs.py)
    del slice_["scheduling"]["topologyTiers"]
    outputs["team/vision"] = json.dumps(slice_)
    spec = dataclasses.replace(load_job(PS), topology=Topology(mode="hard", tier="zone"))
    assert job(spec, PlatformView(outputs))["spec"]["networkTopology"] == {
        "mode": "hard",
        "highestTierAllowed": 2,
    }


@pytest.mark.parametrize(
    ("grace", "shutdown"), [(30, 10), (40, 10), (41, 11), (300, 270), (3600, 3570)]
)
def test_the_supervisor_gives_up_on_its_workers_before_the_kubelet_kills_the_pod(
    view: PlatformView, grace: int, shutdown: int
) -> None:
    """The kubelet kills the pod terminationGracePeriodSeconds after SIGTERM; the supervisor
    must stop waiting for its workers 30 s before that to record their verdict (exit codes,
    the termination log), but give them at least 10 s (docs/runtime.md, Preemption)."""
    spec = load_job(DEMO)
    spec = dataclasses.replace(
        spec, checkpoint=dataclasses.replace(spec.checkpoint, grace_seconds=grace)
    )
    pod = job(spec, view)["spec"]["tasks"][0]["template"]["spec"]
    assert pod["terminationGracePeriodSeconds"] == grace
    timeout = int(env(pod["containers"][0])["TRAINSTACK_SHUTDOWN_TIMEOUT_S"])
    assert timeout == shutdown
    assert timeout < grace


def test_the_specs_labels_are_on_the_job_and_every_pod(view: PlatformView) -> None:
    """Cost reports, dashboards and kubectl selectors read them: a spec's labels and
    trainstack's own (team, job, pool, manager) on the Job and on each task's pods, with the
    pod's role."""
    spec = dataclasses.replace(load_job(PS), labels=(("cost-centre", "cv"),))
    manifest = job(spec, view)
    own = {
        "cost-centre": "cv",
        "app.kubernetes.io/managed-by": "trainstack",
        "trainstack.io/team": "vision",
        "trainstack.io/job": spec.name,
        "trainstack.io/pool": spec.pool,
    }
    assert manifest["metadata"]["labels"] == own
    for task in manifest["spec"]["tasks"]:
        assert task["template"]["metadata"]["labels"] == {**own, "trainstack.io/role": task["name"]}


def test_rdma_replicas_request_the_shared_device_and_servers_do_not(
    example_plans: dict[str, Plan],
) -> None:
    """The RDMA shared device plugin's resource is the only way onto the HCAs: a replica
    without it trains over TCP at a fraction of the speed, silently."""
    view = PlatformView(example_plans["onprem"].outputs)
    pool = view.pool("a100-roce")
    assert pool is not None
    assert pool["profile"]["sharedDevices"] == ["rdma/rdma_shared_device_a"]
    spec = dataclasses.replace(load_job(DEMO), team="speech", pool="a100-roce")
    for task in render(spec, view, "speech")["spec"]["tasks"]:
        resources = task["template"]["spec"]["containers"][0]["resources"]
        assert resources["requests"]["rdma/rdma_shared_device_a"] == "1", task["name"]
        assert resources["limits"]["rdma/rdma_shared_device_a"] == "1", task["name"]


# A p5.48xlarge on the EKS AL2023 AMI (awslabs/amazon-eks-ami nodeadm kubelet/config.go):
# kubeReserved CPU 60 + 10 + 10 + 0.25 % of 188 cores = 550m; memory 11 x 100 max pods
# (eni-max-pods.txt) + 255 = 1355Mi, evictionHard 100Mi; the EFA pool's hugepages 8 x 640Mi.
P5_CPU_M = 192_000 - 550
P5_MEMORY_MI_AT_MOST = 2048 * 1024 - 1355 - 100 - 5120


@pytest.mark.parametrize(
    ("cpu", "memory", "problems"),
    [
        (f"{P5_CPU_M}m", f"{P5_MEMORY_MI_AT_MOST}Mi", []),  # all a p5.48xlarge gives pods
        ("191", "1800Gi", []),
        (f"{P5_CPU_M + 1}m", "1800Gi", ["job.spec.workers.cpu"]),
        ("191", f"{P5_MEMORY_MI_AT_MOST * 1024 + 1}Ki", ["job.spec.workers.memory"]),
        ("192", "2048Gi", ["job.spec.workers.cpu", "job.spec.workers.memory"]),  # the catalog's
    ],
    ids=["allocatable", "round", "cpu-over", "memory-over", "catalog-size"],
)
def test_a_replica_may_take_what_a_node_gives_pods_and_no_more(
    view: PlatformView, cpu: str, memory: str, problems: list[str]
) -> None:
    """A replica no node can hold keeps the gang pending forever, so it is refused. A node
    gives pods its allocatable, not its catalog size: issue 41 #1 found `cpu: "192"`,
    `memory: 2048Gi` (a whole p5.48xlarge) approved, which the scheduler can never place.
    Requests compare whatever units they are written in."""
    spec = load_job(DEMO)
    pool = view.pool(spec.pool)
    assert pool is not None
    assert pool["instanceType"] == "p5.48xlarge"
    resources = dataclasses.replace(
        spec.workers.resources, cpu=cpu, memory=memory, cpu_limit=cpu, memory_limit=memory
    )
    big = dataclasses.replace(spec, workers=dataclasses.replace(spec.workers, resources=resources))
    found = [i.split(":")[0] for i in issues_of(big, view)]
    assert found == problems


def test_the_allocatable_error_gives_the_numbers_and_their_source(view: PlatformView) -> None:
    spec = load_job(DEMO)
    resources = dataclasses.replace(spec.workers.resources, cpu="192", memory="2048Gi")
    big = dataclasses.replace(spec, workers=dataclasses.replace(spec.workers, resources=resources))
    assert issues_of(big, view) == [
        "job.spec.workers.cpu: 192 CPUs per replica, but a p5.48xlarge node gives pods at most "
        f"{P5_CPU_M}m of its 192 vCPUs (the EKS AMI's kubelet reserves 550m CPU and 6575Mi "
        "memory, hugepages and eviction threshold included; docs/jobs.md, Node allocatable); "
        f"request at most {P5_CPU_M}m, less what the node's daemons request",
        "job.spec.workers.memory: 2048Gi per replica, but a p5.48xlarge node gives pods less "
        f"than {P5_MEMORY_MI_AT_MOST}Mi of its 2048Gi (the EKS AMI's kubelet reserves 550m CPU "
        "and 6575Mi memory, hugepages and eviction threshold included; docs/jobs.md, Node "
        "allocatable); request at most 1887Gi (Karpenter's estimate of the memory the kernel "
        "leaves)",
    ]


def test_gpu_pods_read_their_own_nodes_gpu_evidence(view: PlatformView) -> None:
    """Issue 22 #6: hardware verdicts come from the node's DCGM evidence, not log text. The
    runtime reads TRAINSTACK_GPU_EVIDENCE; its node's dcgm-exporter runs on the host network,
    so the URL is built from status.hostIP, which the kubelet expands only from a variable
    listed earlier (Kubernetes: "Define dependent environment variables")."""
    assert view.outputs["monitoring"]["gpuEvidencePort"] == 9400
    for task in ("master", "worker"):
        variables = container(job(load_job(DEMO), view), task)["env"]
        names = [e["name"] for e in variables]
        assert variables[0] == {
            "name": "TRAINSTACK_NODE_IP",
            "valueFrom": {"fieldRef": {"fieldPath": "status.hostIP"}},
        }
        assert env({"env": variables})["TRAINSTACK_GPU_EVIDENCE"] == (
            "http://$(TRAINSTACK_NODE_IP):9400/metrics"
        )
        assert names.index("TRAINSTACK_NODE_IP") < names.index("TRAINSTACK_GPU_EVIDENCE")
    servers = container(job(load_job(PS), view), "ps")  # CPU nodes: no exporter there
    assert "TRAINSTACK_GPU_EVIDENCE" not in env(servers)
    assert all(e["name"] != "TRAINSTACK_NODE_IP" for e in servers["env"])
    operator = PlatformView(
        {**view.outputs, "monitoring": {**view.outputs["monitoring"], "gpuEvidencePort": None}}
    )
    assert "TRAINSTACK_GPU_EVIDENCE" not in env(container(job(load_job(DEMO), operator)))


def test_jobs_tier_checkpoints_and_hand_off_into_their_teams_prefixes(view: PlatformView) -> None:
    """On AWS every job copies its checkpoints to, and hands off into, its own folder of the
    team's prefixes in the platform's bucket; the report learns the job from its env."""
    spec = load_job(DEMO)
    storage = view.storage("vision")
    for task in job(spec, view)["spec"]["tasks"]:
        values = env(task["template"]["spec"]["containers"][0])
        assert values["TRAINSTACK_CHECKPOINT_S3_URI"] == (
            f"{storage['checkpointS3Uri']}{spec.name}/"
        )
        assert values["TRAINSTACK_CHECKPOINT_S3_URI"].startswith("s3://")
        assert values["TRAINSTACK_CHECKPOINT_S3_URI"].endswith(f"/teams/vision/{spec.name}/")
        assert values["TRAINSTACK_ARTIFACT_URI"].endswith(f"/artifacts/teams/vision/{spec.name}/")
        assert values["TRAINSTACK_IMAGE"] == spec.image
        assert values["TRAINSTACK_JOB"] == spec.name
        assert values["TRAINSTACK_TEAM"] == "vision"
        doc = json.loads(values["TRAINSTACK_JOB_SPEC"])
        assert doc["name"] == spec.name
        assert doc["image"] == spec.image
        assert "source" not in doc  # a path on the machine that rendered it


def test_the_spec_in_the_env_leaves_in_place_updates_in_place(view: PlatformView) -> None:
    """Priority is updated in place by Volcano; the spec the report reads from the pod's env
    must not turn that update into a replacement."""
    spec = load_job(DEMO)
    other = dataclasses.replace(spec, priority="high" if spec.priority != "high" else "normal")
    assert replacement_key(job(spec, view)["spec"]) == replacement_key(job(other, view)["spec"])
    # The number of workers of a fixed gang changes in place too (tests/diff/test_diff.py).
    bigger = dataclasses.replace(
        spec,
        workers=dataclasses.replace(
            spec.workers,
            replicas=4,
            scale=dataclasses.replace(spec.workers.scale, min=4, max=4, size=4),
        ),
    )
    assert replacement_key(job(spec, view)["spec"]) == replacement_key(job(bigger, view)["spec"])


def test_the_authors_env_can_turn_tiering_off(view: PlatformView) -> None:
    spec = dataclasses.replace(
        load_job(DEMO), env=(*load_job(DEMO).env, ("TRAINSTACK_CHECKPOINT_S3_URI", ""))
    )
    assert env(container(job(spec, view)))["TRAINSTACK_CHECKPOINT_S3_URI"] == ""


def test_an_existing_clusters_object_store_reaches_every_trainer(
    example_plans: dict[str, Plan],
) -> None:
    """On an existing cluster (onprem: MinIO on port 9000), jobs copy checkpoints and hand off
    to its bucket with the team's credentials from the Secret the store's owners keep; the
    rendezvous pod copies nothing and gets no credentials; the team's NetworkPolicy lets the
    trainers reach the store's port."""
    view = PlatformView(example_plans["onprem"].outputs)
    spec = dataclasses.replace(load_job(DEMO), team="speech", pool="a100-roce")
    manifest = render(spec, view, "speech")
    for task in manifest["spec"]["tasks"]:
        trainer = task["template"]["spec"]["containers"][0]
        values = env(trainer)
        assert (
            values["TRAINSTACK_CHECKPOINT_S3_URI"] == f"s3://dgx-training/teams/speech/{spec.name}/"
        )
        assert values["TRAINSTACK_ARTIFACT_URI"] == (
            f"s3://dgx-training/artifacts/teams/speech/{spec.name}/"
        )
        assert values["AWS_ENDPOINT_URL_S3"] == "https://minio.lab.internal:9000"
        assert values["AWS_DEFAULT_REGION"] == "us-east-1"
        assert trainer["envFrom"] == [{"secretRef": {"name": "trainstack-object-store"}}]
    elastic = resized(
        dataclasses.replace(load_job(ELASTIC), team="speech", pool="a100-roce"), 1, 2
    )  # within speech's 16 GPUs
    for task in render(elastic, view, "speech")["spec"]["tasks"]:
        trainer = task["template"]["spec"]["containers"][0]
        assert ("envFrom" in trainer) == (task["name"] != "rendezvous"), task["name"]
    policies = [
        r.inputs
        for r in example_plans["onprem"].resources
        if r.type.endswith("NetworkPolicy") and r.inputs["metadata"]["namespace"] == "speech"
    ]
    egress = [
        p
        for policy in policies
        for rule in policy["spec"].get("egress", [])
        for p in rule.get("ports", [])
    ]
    assert {"protocol": "TCP", "port": 9000} in egress
