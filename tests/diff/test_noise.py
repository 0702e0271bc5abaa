"""Issue 41 #3: what hid the risk in a diff report, and the report that leads with it.

Adding a pool and a team to prod made a 23 KB report (the registry's JSON twice, a 3 KB CEL
expression twice, ten dependency rows that looked alike, every grant of the new team in
full), and a dataset prefix opened to the whole bucket was "3 access changes" with nothing
flagged and "No storage changes". Both scenarios run here as a user runs them: a copy of the
project, `trainstack preview` of the base and the head into folders, `trainstack diff`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner, Result

from tests.diff.conftest import Preview
from tests.diff.test_diff import PROD, prod_base, replace_once  # noqa: F401 (a fixture)
from tests.test_preview import make_project
from trainstack.cli import app
from trainstack.diff.access import widened
from trainstack.diff.plans import readable
from trainstack.diff.render import to_markdown
from trainstack.diff.report import DiffReport, diff_plans
from trainstack.diff.sections import data_paths

runner = CliRunner()

POOL = (
    "        size: {min: 3, max: 4}\n",
    "        size: {min: 3, max: 4}\n"
    "      - name: h200-extra\n"
    "        instanceType: p5en.48xlarge\n"
    "        fabric: efa\n"
    "        availabilityZone: us-east-1a\n"
    "        size: {min: 2, max: 4}\n",
)
TEAM = (
    "          pools: [h200-burst]\n",
    "          pools: [h200-burst]\n"
    "        - name: speech\n"
    "          group: product\n"
    "          owners: [speech-lead@example.com]\n"
    "          quota: {gpus: 8, deserved: 16, borrowLimit: 16}\n"
    "          pools: [h200-extra]\n",
)
WIDE_PREFIX = ("dataRepository: {bucket: acme-ml-datasets, prefix: datasets/}",
               'dataRepository: {bucket: acme-ml-datasets, prefix: ""}')  # fmt: skip
# bytes: the pool-and-team report was 25,471 before issue 41. Issue 42 added half a KiB that
# a reviewer should see: with the health gate on (prod), the alert on a pool's healthy nodes
# restates how many each pool's guarantees need, and the repair controller's eviction grant
# reaches the new team's namespace. Issue 44 added a row a reviewer should see, twice (under
# Storage and in the list): the bucket's lifecycle rules gain the new team's retention.
# Issue 45 added two rows (about 450 bytes): the fairness rules restate each team queue and its
# guarantee, which Volcano does not export (docs/reports.md), so a new team changes them.
REPORT_LIMIT = 7680


def previewed_change(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *edits: tuple[str, str]
) -> Result:
    """Preview a copy of the project into build/base, edit the copy's prod stack, preview it
    into build/head, and diff the two from inside the copy."""
    (tmp_path / "project").mkdir()
    project = make_project(tmp_path / "project", {"prod": PROD})
    stack = project / "stacks" / "Pulumi.prod.yaml"
    out = tmp_path / "out"
    for side in ("base", "head"):
        if side == "head":
            text = stack.read_text()
            for old, new in edits:
                text = replace_once(text, old, new)
            stack.write_text(text)
        where = ["--project-dir", str(project), "--out", str(out / side)]
        previewed = runner.invoke(app, ["preview", "prod", *where])
        assert previewed.exit_code == 0, previewed.output
    monkeypatch.chdir(project)
    result = runner.invoke(app, ["diff", str(out / "base"), str(out / "head")])
    assert result.exit_code == 0, result.output
    return result


def test_a_pool_and_a_team_make_a_short_report_that_names_the_teams_quota(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    report = previewed_change(tmp_path, monkeypatch, POOL, TEAM).stdout
    lines = report.splitlines()
    size = len(report.encode())
    assert size < REPORT_LIMIT, f"{size} bytes:\n{report}"
    expected = [
        # The new team's deserved share, borrowing limit and owners (only its guarantee and
        # pools were there).
        "| speech | added |  |  | group: product, owners: [speech-lead@example.com], "
        "quota (guaranteed GPUs): 8, deserved GPUs: 16, borrowLimit GPUs: 16, "
        "pools: [h200-extra] |",
        # A team on every pool gains the new one, not both lists whole.
        '| vision | changed | pools added | (absent) | ["h200-extra"] |',
        # The registry ConfigMap: the team it gained, not its 4 KB document twice.
        "| replace | kubernetes:core/v1:ConfigMap | trainstack-prod-services-registry | "
        "data.registry.json (json) teams[name=speech] added: data forces replacement |",
        # Three queues' capabilities grew alike: one row, the five values folded.
        "| update | Queue | trainstack-prod-volcano-queue-{group-product, group-research, "
        "trainstack} | spec.capability | cpu: 3136, hugepages-2Mi: 81920Mi, memory: 33792Gi, "
        "nvidia.com/gpu: 132, vpc.amazonaws.com/efa: 448 | cpu: 3904, hugepages-2Mi: "
        "102400Mi, memory: 41984Gi, nvidia.com/gpu: 164, vpc.amazonaws.com/efa: 512 |",
    ]
    missing = [line for line in expected if line not in lines]
    assert not missing, "\n".join(["missing:", *missing, "report:", *lines])
    # The placement policy's CEL expression by its edits, not 3 KB twice.
    [cel] = [line for line in lines if "gpu-placement-policy" in line]
    assert cel.startswith(
        "| update | ValidatingAdmissionPolicy | trainstack-prod-admission-gpu-placement-policy "
        "| spec.validations[0].expression (text, 2 edits) | "
    ), cel
    assert '"h200-extra": {"trainstack.io/pool": "h200-extra"} (4 places)' in cel
    # Twelve resources that only came to depend on the new queue, node pool and team
    # bindings (the health gate's DaemonSet and repair Deployment among them): one row. The
    # accounting PrometheusRule was a thirteenth until issue 45: its fairness group now names
    # the new team, a change of its own (its row above).
    [ordering] = [line for line in lines if "dependencies only" in line]
    assert "12 resources: dependencies only, nothing to update in the cloud" in ordering
    assert any(
        "PrometheusRule | trainstack-prod-monitoring-rules-trainstack-accounting | "
        "spec.groups[name=trainstack-fairness]" in line
        for line in lines
    )
    assert ordering.endswith(
        "| dependencies added | (absent) | RoleBinding "
        "trainstack-prod-health-rolebinding-speech-trainstack-health-repair-evict; "
        "RoleBinding trainstack-prod-deadlines-binding-speech; "
        # (no HyperNode for the new pool: prod's come from the nodes' network labels,
        # builders/topology.py)
        "Queue trainstack-prod-volcano-queue-speech |"
    ), ordering
    # The new team's and pool's resources that are another's renamed are counted under it;
    # what differs (its namespace, queue, node group) is named.
    twins = [line for line in lines if "each renamed" in line or "the same, renamed" in line]
    assert [line.split(" | ")[2] for line in twins if line.startswith("| create")] == [
        # 6: with its pre-pull DaemonSet (prod pre-pulls images); no HyperNode (labels)
        "6 of pool h200-extra (as h200-burst's), each renamed",
        # 16: the repair controller's eviction grant in the team namespace is among them.
        "16 of team speech (as nlp's), each renamed",
    ]
    assert (
        # 3 RoleBindings: the team's two and the health repair controller's eviction grant.
        "| added | IAM inline policy, IAM role, 2 NetworkPolicy, 3 RBAC RoleBinding, RBAC "
        "role | team speech (as nlp's) | each the same, renamed |  |  |  |" in lines
    )
    for named in ("NodeGroup | trainstack-prod-pool-h200-extra-nodes",
                  "Namespace | trainstack-prod-services-ns-speech",
                  "Queue | trainstack-prod-volcano-queue-speech"):  # fmt: skip
        assert f"| create | {named} |  |  |  |" in lines
    assert max(len(line) for line in lines) < 500, max(lines, key=len)


def test_a_dataset_prefix_opened_to_the_whole_bucket_is_flagged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`storage.lustre.dataRepository.prefix: ""`: every team reads the whole bucket."""
    lines = previewed_change(tmp_path, monkeypatch, WIDE_PREFIX).stdout.splitlines()
    expected = [
        "- **prod** (platform): 0 to create, 3 to update, 1 to replace, 0 to delete · "
        "⚠️ **1 data path(s) changed** · ⚠️ **3 grant(s) widened** · "
        "🔑 3 access change(s), 3 flagged",
        "#### ⚠️ Data paths and widened access",
        "- **DATA PATH** `DataRepositoryAssociation trainstack-prod-storage-datasets` (replace): "
        "dataRepositoryPath s3://acme-ml-datasets/datasets/ → s3://acme-ml-datasets/: wider: "
        "the new path holds the old one",
        "- **WIDENED** IAM inline policy `trainstack-prod-storage-team-{nlp, recsys, vision}`: "
        "now allows s3:ListBucket on arn:aws:s3:::acme-ml-datasets if s3:prefix like *; "
        "s3:GetObject on arn:aws:s3:::acme-ml-datasets/*",
        # Storage said "No storage changes" while the association was replaced.
        "| DataRepositoryAssociation trainstack-prod-storage-datasets | replaced | "
        "dataRepositoryPath (forces replacement) | s3://acme-ml-datasets/datasets/ | "
        "s3://acme-ml-datasets/ |",
        "Only storage ones under Storage.",
    ]
    missing = [line for line in expected if line not in lines]
    assert not missing, "\n".join(["missing:", *missing, "report:", *lines])
    assert "No storage changes." not in lines
    # Risk first: the data path and the widened grants before any other section.
    assert lines.index("#### ⚠️ Data paths and widened access") < lines.index("#### Teams")


def test_a_new_teams_resource_that_differs_from_its_twin_is_named(
    preview: Preview,
    prod_base: dict[str, Any],  # noqa: F811 (the fixture)
) -> None:
    """Twins are counted under their team only when identical but for the name: a policy of
    the new team's with one action more is a grant of its own, in full."""
    text = replace_once(replace_once(PROD, *POOL), *TEAM)
    head = preview("prod", prod=text)
    [policy] = [r for r in head["resources"] if r["name"] == "trainstack-prod-storage-team-speech"
                and r["type"] == "aws:iam/rolePolicy:RolePolicy"]  # fmt: skip
    document = json.loads(policy["inputs"]["policy"])
    document["Statement"][1]["Action"] = ["s3:GetObject", "s3:PutObject"]
    policy["inputs"]["policy"] = json.dumps(document)
    diff = diff_plans(prod_base, head)
    [own] = [a for a in diff.access if a.subject == "trainstack-prod-storage-team-speech"
             and a.kind == "IAM inline policy"]  # fmt: skip
    assert (own.change, own.twin) == ("added", "")
    assert "Allow s3:GetObject, s3:PutObject on arn:aws:s3:::acme-ml-datasets/datasets/*" in (
        own.grant
    )
    lines = to_markdown(DiffReport([diff])).splitlines()
    assert any(line.startswith("| added | IAM inline policy | trainstack-prod-storage-team-"
                               "speech | ") for line in lines)  # fmt: skip
    renamed = [r for r in diff.created_updated if r.twin]
    assert ("aws:iam/rolePolicy:RolePolicy", "trainstack-prod-storage-team-speech") not in {
        (r.type, r.name) for r in renamed
    }


def policy(*statements: dict[str, Any]) -> dict[str, Any]:
    return {"policy": json.dumps({"Version": "2012-10-17", "Statement": list(statements)})}


def allow(action: Any, resource: Any, **more: Any) -> dict[str, Any]:
    return {"Effect": "Allow", "Action": action, "Resource": resource, **more}


DATA = "arn:aws:s3:::data"
PREFIX = {"StringLike": {"s3:prefix": ["datasets/*"]}}
ROLE_POLICY = "aws:iam/rolePolicy:RolePolicy"
RBAC_ROLE = "kubernetes:rbac.authorization.k8s.io/v1:Role"


@pytest.mark.parametrize(
    ("rtype", "before", "after", "wider"),
    [
        (ROLE_POLICY, policy(allow("s3:GetObject", f"{DATA}/datasets/*")),
         policy(allow("s3:GetObject", f"{DATA}/*")), [f"s3:GetObject on {DATA}/*"]),
        (ROLE_POLICY, policy(allow("s3:GetObject", f"{DATA}/*")),
         policy(allow(["s3:GetObject", "s3:DeleteObject"], f"{DATA}/*")),
         [f"s3:DeleteObject on {DATA}/*"]),
        # A condition loosened, or gone.
        (ROLE_POLICY, policy(allow("s3:ListBucket", DATA, Condition=PREFIX)),
         policy(allow("s3:ListBucket", DATA, Condition={"StringLike": {"s3:prefix": ["*"]}})),
         [f"s3:ListBucket on {DATA} if s3:prefix like *"]),
        (ROLE_POLICY, policy(allow("s3:ListBucket", DATA, Condition=PREFIX)),
         policy(allow("s3:ListBucket", DATA)), [f"s3:ListBucket on {DATA}"]),
        # Narrower, reordered, or a wildcard that already covered it: nothing.
        (ROLE_POLICY, policy(allow("s3:GetObject", f"{DATA}/*")),
         policy(allow("s3:GetObject", f"{DATA}/datasets/*")), []),
        (ROLE_POLICY, policy(allow("s3:*", "*")), policy(allow("S3:GetObject", f"{DATA}/x")), []),
        (ROLE_POLICY, policy(allow("s3:ListBucket", DATA)),
         policy(allow("s3:ListBucket", DATA, Condition=PREFIX)), []),
        # Who may assume a role: one principal more.
        ("aws:iam/role:Role",
         {"assumeRolePolicy": json.dumps({"Statement": [allow("sts:AssumeRole", "*", Principal={
             "AWS": "arn:aws:iam::1:role/a"})]})},
         {"assumeRolePolicy": json.dumps({"Statement": [allow("sts:AssumeRole", "*", Principal={
             "AWS": ["arn:aws:iam::1:role/a", "arn:aws:iam::2:root"]})]})},
         ["sts:AssumeRole on * for AWS arn:aws:iam::2:root"]),
        # RBAC: a verb more; a named resource opened to all of its kind.
        (RBAC_ROLE, {"rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]}]},
         {"rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "delete"]}]},
         ["delete on pods (core)"]),
        (RBAC_ROLE, {"rules": [{"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"],
                                "resourceNames": ["a"]}]},
         {"rules": [{"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]}]},
         ["get on secrets (core)"]),
        (RBAC_ROLE, {"rules": [{"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]}]},
         {"rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]}]}, []),
    ],
    ids=["resource", "action", "condition-loosened", "condition-gone", "narrower",
         "covered-by-wildcard", "condition-added", "trust", "rbac-verb", "rbac-names",
         "rbac-covered"],
)  # fmt: skip
def test_what_a_changed_grant_newly_allows(
    rtype: str, before: dict[str, Any], after: dict[str, Any], wider: list[str]
) -> None:
    assert widened(rtype, before, after) == wider


def plan(*resources: tuple[str, str, dict[str, Any]]) -> dict[str, Any]:
    return {"resources": [{"type": t, "name": n, "inputs": i} for t, n, i in resources]}


DRA = "aws:fsx/dataRepositoryAssociation:DataRepositoryAssociation"
PV = "kubernetes:core/v1:PersistentVolume"


@pytest.mark.parametrize(
    ("rtype", "before", "after", "row"),
    [
        (DRA, {"dataRepositoryPath": "s3://b/data/"}, {"dataRepositoryPath": "s3://b/"},
         ("dataRepositoryPath", "s3://b/data/", "s3://b/",
          "wider: the new path holds the old one")),
        (DRA, {"dataRepositoryPath": "s3://b/"}, {"dataRepositoryPath": "s3://b/data/"},
         ("dataRepositoryPath", "s3://b/", "s3://b/data/", "narrower: inside the old path")),
        (DRA, {"fileSystemPath": "/datasets"}, {"fileSystemPath": "/other"},
         ("fileSystemPath", "/datasets", "/other", "points elsewhere")),
        (PV, {"spec": {"mountOptions": ["ro", "flock"]}}, {"spec": {"mountOptions": ["flock"]}},
         ("spec.mountOptions", ["ro", "flock"], ["flock"], "no longer read-only")),
        (PV, {"spec": {"csi": {"volumeAttributes": {"mountname": "fs/datasets"}}}},
         {"spec": {"csi": {"volumeAttributes": {"mountname": "fs"}}}},
         ("spec.csi.volumeAttributes.mountname", "fs/datasets", "fs",
          "wider: the new path holds the old one")),
        (DRA, {"dataRepositoryPath": "s3://b/data"}, {"dataRepositoryPath": "s3://b/database"},
         ("dataRepositoryPath", "s3://b/data", "s3://b/database", "points elsewhere")),
        (PV, {"spec": {"mountOptions": ["flock"]}}, {"spec": {"mountOptions": ["ro", "flock"]}},
         None),
        (DRA, {"dataRepositoryPath": "s3://b/", "tags": {"a": "1"}},
         {"dataRepositoryPath": "s3://b/", "tags": {"a": "2"}}, None),
    ],
    ids=["dra-wider", "dra-narrower", "dra-elsewhere", "pv-writable", "pv-mount-wider",
         "dra-sibling", "pv-read-only", "tags"],
)  # fmt: skip
def test_data_paths_that_changed(
    rtype: str, before: dict[str, Any], after: dict[str, Any], row: tuple[Any, ...] | None
) -> None:
    found = data_paths(plan((rtype, "x", before)), plan((rtype, "x", after)), set())
    assert [(p.field, p.before, p.after, p.note) for p in found] == ([row] if row else [])


CEL = (
    'has(p.x) && ns in {"a": {"pool": "a"}, "b": {"pool": "b"}}.map(n, {"a": {"pool": "a"}, '
    '"b": {"pool": "b"}}[n]) : [{"pool": "a"}, {"pool": "b"}] && size(p.y) > 0 && p.z == 1'
)


def test_a_long_expression_changes_by_its_edits() -> None:
    """An edit made in two places is one line, counted; each after a little of what precedes
    it. Short strings are shown whole, as before."""
    grown = CEL.replace('"b": {"pool": "b"}}', '"b": {"pool": "b"}, "c": {"pool": "c"}}')
    grown = grown.replace('{"pool": "b"}]', '{"pool": "b"}, {"pool": "c"}]')
    assert readable([("spec.expression", CEL, grown)]) == [
        (
            "spec.expression (text, 2 edits)",
            '…": {"pool": "b"} (2 places)\n…}, {"pool": "b"}',
            '…": {"pool": "b"}, "c": {"pool": "c"} (2 places)\n…}, {"pool": "b"}, {"pool": "c"}',
        )
    ]
    assert readable([("spec.expression", "a == 1", "a == 2")]) == [
        ("spec.expression", "a == 1", "a == 2")
    ]
