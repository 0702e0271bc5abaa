"""Who can reach what: access changes between two plans (issue 23 #5).

Adding a cluster-admin principal from another account used to show as "2 to create" with no
names. Every resource that grants access is read here into who (the principal or subject) and
what (its policy, role, groups or rule): EKS access entries and their policy associations, the
cluster endpoint's public CIDRs, IAM roles (who may assume them), their inline and attached
policies, pod identities, RBAC roles and bindings, security groups and their rules,
NetworkPolicies, and bucket policies and public access blocks. A change names both, and flags
what a reviewer must not miss: cluster admin, a principal from an account new to the stack,
wildcard permissions, and anything open to the internet.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from trainstack.diff.plans import Change, changed_paths, get, limited, readable, show

OPEN_CIDRS = ("0.0.0.0/0", "::/0")
NAMESPACE_LABEL = "kubernetes.io/metadata.name"
IGNORED = ("tags", "tagsAll", "metadata.labels", "metadata.annotations")


@dataclass(frozen=True)
class Grant:
    """What one resource grants: who, to what, and what stands out."""

    kind: str
    subject: str
    grant: str
    flags: tuple[str, ...] = ()
    compared: Any = None  # the inputs that decide access (all of them when None)


@dataclass
class AccessChange:
    change: str  # added | removed | changed
    kind: str
    subject: str  # the principal or subject
    grant: str  # its policy, role, groups or rule (the head's, or the base's when removed)
    resource: str  # type and name in the plan
    flags: list[str] = field(default_factory=list)
    changes: list[Change] = field(default_factory=list)
    more: int = 0
    twin: str = ""  # an added grant that is another team's or pool's, renamed (twins.py)
    widened: list[str] = field(default_factory=list)  # what a changed grant allows that it did not


def _text(value: Any) -> str:
    return value if isinstance(value, str) else show(value)


def _names(values: Any) -> str:
    return ", ".join(_text(v) for v in values) if isinstance(values, list) else _text(values)


def arn_name(arn: Any) -> str:
    """An AWS-managed policy by its name (`AmazonEKSClusterAdminPolicy`), any other ARN whole."""
    if isinstance(arn, str) and ":aws:" in arn and arn.split(":")[4:5] == ["aws"]:
        return arn.rsplit("/", 1)[-1]
    return _text(arn)


def account(arn: Any) -> str | None:
    parts = arn.split(":") if isinstance(arn, str) else []
    return parts[4] if len(parts) > 5 and parts[0] == "arn" and parts[4] else None


def _document(value: Any) -> dict[str, Any]:
    """An IAM policy document (a JSON string in the plan)."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            return {}
    return value if isinstance(value, dict) else {}


def _statements(value: Any) -> list[dict[str, Any]]:
    found = _document(value).get("Statement") or []
    found = found if isinstance(found, list) else [found]
    return [s for s in found if isinstance(s, dict)]


def _as_list(value: Any) -> list[Any]:
    if value is None:
        return []
    return value if isinstance(value, list) else [value]


def _principals(statement: dict[str, Any]) -> list[str]:
    principal = statement.get("Principal")
    if principal == "*":
        return ["anyone (*)"]
    if not isinstance(principal, dict):
        return []
    return [f"{kind} {who}" for kind, whom in sorted(principal.items()) for who in _as_list(whom)]


Condition = tuple[tuple[str, str, tuple[str, ...]], ...]  # (operator, key, values), sorted


def _conditions(statement: dict[str, Any]) -> Condition:
    found = []
    for operator, keys in (statement.get("Condition") or {}).items():
        for key, values in (keys or {}).items() if isinstance(keys, dict) else ():
            found.append((str(operator), str(key), tuple(sorted(map(str, _as_list(values))))))
    return tuple(sorted(found))


def _condition_text(conditions: Condition) -> str:
    """` if s3:prefix like datasets/*`: the condition narrows the grant, so it is part of it
    (a prefix widened to the whole bucket changed only the condition, issue 41 #3)."""
    words = {"StringLike": "like", "StringEquals": "=", "Bool": "=", "ArnLike": "like"}
    parts = [f"{key} {words.get(op, op)} {' or '.join(values)}" for op, key, values in conditions]
    return f" if {' and '.join(parts)}" if parts else ""


def _policy_summary(value: Any) -> tuple[str, tuple[str, ...]]:
    """`Allow a:B, c:D on * if …; Deny …`, and flags for wildcards and public grants."""
    parts, flags = [], []
    for statement in _statements(value):
        effect = statement.get("Effect", "Allow")
        actions = _as_list(statement.get("Action")) or [
            f"all but {_names(statement.get('NotAction'))}"
        ]
        resources = _names(statement.get("Resource") or statement.get("NotResource") or "*")
        who = _principals(statement)
        text = f"{effect} {_names(actions)} on {resources}{_condition_text(_conditions(statement))}"
        parts.append(text + (f" for {', '.join(who)}" if who else ""))
        if effect == "Allow" and any(a == "*" or str(a).endswith(":*") for a in actions):
            flags.append("wildcard actions")
        if effect == "Allow" and ("anyone (*)" in who or "AWS *" in who):
            flags.append("public: anyone")
    return "; ".join(parts) or "(empty policy)", tuple(dict.fromkeys(flags))


def _access_entry(inputs: dict[str, Any]) -> Grant:
    groups = inputs.get("kubernetesGroups") or []
    grant = f"Kubernetes groups {_names(groups)}" if groups else "no Kubernetes groups"
    if inputs.get("type") not in (None, "STANDARD"):
        grant += f" (type {inputs['type']})"
    if inputs.get("userName"):
        grant += f" as user {inputs['userName']}"
    return Grant("EKS access entry", _text(inputs.get("principalArn")), grant)


def _access_policy(inputs: dict[str, Any]) -> Grant:
    policy = arn_name(inputs.get("policyArn"))
    scope = inputs.get("accessScope") or {}
    where = (
        f"namespaces {_names(scope.get('namespaces') or [])}"
        if scope.get("type") == "namespace"
        else "cluster-wide"
    )
    flags: tuple[str, ...] = ()
    if policy == "AmazonEKSClusterAdminPolicy":
        flags = ("cluster admin",)
    elif policy == "AmazonEKSAdminPolicy":
        flags = ("admin",)
    return Grant(
        "EKS access policy", _text(inputs.get("principalArn")), f"{policy} ({where})", flags
    )


def _cluster(inputs: dict[str, Any]) -> Grant:
    vpc = inputs.get("vpcConfig") or {}
    access = inputs.get("accessConfig") or {}
    public = vpc.get("endpointPublicAccess", True)
    cidrs = vpc.get("publicAccessCidrs") or ["0.0.0.0/0"]
    parts = [f"public endpoint from {_names(cidrs)}" if public else "no public endpoint"]
    parts.append("private endpoint" if vpc.get("endpointPrivateAccess") else "no private endpoint")
    if access.get("authenticationMode"):
        parts.append(f"authentication {access['authenticationMode']}")
    if access.get("bootstrapClusterCreatorAdminPermissions"):
        parts.append("creator is cluster admin")
    flags = ("public: the internet",) if public and set(cidrs) & set(OPEN_CIDRS) else ()
    compared = {
        "vpcConfig": {
            k: vpc.get(k)
            for k in ("endpointPublicAccess", "endpointPrivateAccess", "publicAccessCidrs")
        },
        "accessConfig": access,
    }
    return Grant("cluster endpoint", _text(inputs.get("name")), "; ".join(parts), flags, compared)


def _role(inputs: dict[str, Any], name: str) -> Grant:
    trusted: list[str] = []
    for statement in _statements(inputs.get("assumeRolePolicy")):
        who = _principals(statement)
        for operator in (statement.get("Condition") or {}).values():
            for key, value in (operator or {}).items():
                if str(key).endswith(":sub"):  # which service accounts or workflows
                    who = [f"{w} (sub {_names(value)})" for w in who]
        trusted += who
    flags = ("public: anyone",) if "anyone (*)" in trusted or "AWS *" in trusted else ()
    grant = f"assumable by {', '.join(trusted)}" if trusted else "assumable by no one"
    return Grant("IAM role", _text(inputs.get("name") or name), grant, flags)


def _role_policy(inputs: dict[str, Any], name: str) -> Grant:
    summary, flags = _policy_summary(inputs.get("policy"))
    label = inputs.get("name") or name
    return Grant("IAM inline policy", _text(inputs.get("role")), f"{label}: {summary}", flags)


def _policy(inputs: dict[str, Any], name: str) -> Grant:
    summary, flags = _policy_summary(inputs.get("policy"))
    return Grant("IAM policy", _text(inputs.get("name") or name), summary, flags)


def _attachment(inputs: dict[str, Any]) -> Grant:
    policy = arn_name(inputs.get("policyArn"))
    flags = ("administrator",) if policy == "AdministratorAccess" else ()
    return Grant("IAM policy attachment", _text(inputs.get("role")), policy, flags)


def _pod_identity(inputs: dict[str, Any]) -> Grant:
    subject = f"ServiceAccount {inputs.get('namespace')}/{inputs.get('serviceAccount')}"
    return Grant("EKS pod identity", subject, f"IAM role {_text(inputs.get('roleArn'))}")


def _binding(inputs: dict[str, Any]) -> Grant:
    subjects = []
    for subject in inputs.get("subjects") or []:
        namespace = f"{subject['namespace']}/" if subject.get("namespace") else ""
        subjects.append(f"{subject.get('kind')} {namespace}{subject.get('name')}")
    ref = inputs.get("roleRef") or {}
    namespace = get(inputs, "metadata", "namespace")
    where = f"in namespace {namespace}" if namespace else "cluster-wide"
    flags = ("cluster admin",) if ref.get("name") == "cluster-admin" else ()
    return Grant(
        f"RBAC {inputs.get('kind', 'binding')}",
        "; ".join(subjects) or "no subjects",
        f"{ref.get('kind')} {ref.get('name')} {where}",
        flags,
    )


def _rbac_role(inputs: dict[str, Any]) -> Grant:
    namespace = get(inputs, "metadata", "namespace")
    name = f"{namespace}/" if namespace else ""
    rules, flags = [], []
    for rule in inputs.get("rules") or []:
        verbs, resources = rule.get("verbs") or [], rule.get("resources") or []
        groups = [g or "core" for g in rule.get("apiGroups") or []]
        what = _names(resources or rule.get("nonResourceURLs") or [])
        rules.append(f"{_names(verbs)} on {what}" + (f" ({_names(groups)})" if groups else ""))
        if "*" in verbs or "*" in resources:
            flags.append("wildcard rules")
    subject = f"{inputs.get('kind', 'Role')} {name}{get(inputs, 'metadata', 'name')}"
    return Grant("RBAC role", subject, "; ".join(rules) or "no rules", tuple(dict.fromkeys(flags)))


def _ports(rule: dict[str, Any], protocol_key: str) -> str:
    protocol = str(rule.get(protocol_key, "-1"))
    if protocol in ("-1", "all"):
        return "all traffic"
    low, high = rule.get("fromPort"), rule.get("toPort")
    ports = f"{low}" if low == high else f"{low}-{high}"
    return f"{protocol} {ports}"


def _sg_rule(inputs: dict[str, Any], direction: str) -> Grant:
    peer = inputs.get("cidrIpv4") or inputs.get("cidrIpv6") or inputs.get("prefixListId")
    if peer is None and inputs.get("referencedSecurityGroupId"):
        referenced = inputs["referencedSecurityGroupId"]
        peer = "itself" if referenced == inputs.get("securityGroupId") else f"group {referenced}"
    side = "from" if direction == "ingress" else "to"
    grant = f"{direction} {side} {peer} ({_ports(inputs, 'ipProtocol')})"
    flags = ("public: the internet",) if direction == "ingress" and peer in OPEN_CIDRS else ()
    return Grant(
        "security group rule", f"security group {inputs.get('securityGroupId')}", grant, flags
    )


def _legacy_sg_rule(inputs: dict[str, Any]) -> Grant:
    direction = str(inputs.get("type", "ingress"))
    peers = [*(inputs.get("cidrBlocks") or []), *(inputs.get("ipv6CidrBlocks") or [])]
    if inputs.get("sourceSecurityGroupId"):
        peers.append(f"security group {inputs['sourceSecurityGroupId']}")
    if inputs.get("self"):
        peers.append("itself")
    side = "from" if direction == "ingress" else "to"
    grant = f"{direction} {side} {_names(peers)} ({_ports(inputs, 'protocol')})"
    public = direction == "ingress" and set(peers) & set(OPEN_CIDRS)
    flags = ("public: the internet",) if public else ()
    return Grant(
        "security group rule", f"security group {inputs.get('securityGroupId')}", grant, flags
    )


def _security_group(inputs: dict[str, Any], name: str) -> Grant:
    rules, public = [], False
    for direction in ("ingress", "egress"):
        for rule in inputs.get(direction) or []:
            peers = [*(rule.get("cidrBlocks") or []), *(rule.get("securityGroups") or [])]
            if rule.get("self"):
                peers.append("itself")
            side = "from" if direction == "ingress" else "to"
            rules.append(f"{direction} {side} {_names(peers)} ({_ports(rule, 'protocol')})")
            public = public or (direction == "ingress" and bool(set(peers) & set(OPEN_CIDRS)))
    grant = "; ".join(rules) or f"in {inputs.get('vpcId')} (rules are separate resources)"
    flags = ("public: the internet",) if public else ()
    return Grant("security group", _text(inputs.get("name") or name), grant, flags)


def _peer(peer: dict[str, Any]) -> str:
    if "ipBlock" in peer:
        block = peer["ipBlock"]
        except_ = f" except {_names(block['except'])}" if block.get("except") else ""
        return f"{block.get('cidr')}{except_}"
    parts = []
    if "namespaceSelector" in peer:
        labels = get(peer, "namespaceSelector", "matchLabels", default={}) or {}
        if list(labels) == [NAMESPACE_LABEL]:
            parts.append(f"namespace {labels[NAMESPACE_LABEL]}")
        else:
            parts.append(f"namespaces {_labels(peer['namespaceSelector'])}")
    if "podSelector" in peer:
        parts.append(f"pods {_labels(peer['podSelector'])}")
    return " ".join(parts) or _text(peer)


def _labels(selector: Any) -> str:
    """A label selector as `k=v, …` (`(all)` when it selects everything)."""
    labels = get(selector, "matchLabels", default={}) or {}
    expressions = get(selector, "matchExpressions", default=[]) or []
    parts = [f"{k}={v}" for k, v in sorted(labels.items())] + [_text(e) for e in expressions]
    return ", ".join(parts) or "(all)"


def _network_policy(inputs: dict[str, Any]) -> Grant:
    spec = inputs.get("spec") or {}
    parts, public = [], False
    for direction, key in (("ingress", "from"), ("egress", "to")):
        for rule in spec.get(direction) or []:
            peers = [_peer(p) for p in rule.get(key) or []] or ["anywhere"]
            ports = [f"{p.get('protocol', 'TCP')} {p.get('port')}" for p in rule.get("ports") or []]
            side = "from" if direction == "ingress" else "to"
            suffix = f" ({', '.join(ports)})" if ports else ""
            parts.append(f"{direction} {side} {', '.join(peers)}{suffix}")
            if direction == "ingress" and (
                peers == ["anywhere"] or any(p.split()[0] in OPEN_CIDRS for p in peers)
            ):
                public = True
    subject = f"{get(inputs, 'metadata', 'namespace')}/{get(inputs, 'metadata', 'name')}"
    subject += f" (pods {_labels(spec.get('podSelector'))})"
    types = spec.get("policyTypes") or []
    grant = "; ".join(parts) or f"deny all {_names(types)}"
    flags = ("public: the internet",) if public else ()
    return Grant("NetworkPolicy", subject, grant, flags)


ADMISSION_KIND = "admission policy"
GUARD_REMOVED = "admission guard removed"


def _admission_binding(inputs: dict[str, Any]) -> Grant:
    """A ValidatingAdmissionPolicyBinding: what holds an identity to its rules where RBAC
    cannot (the health agent's own-node policy, the teams' queue and job rules). Without
    `Deny` in its actions the policy only warns or audits (k8s.io/api v0.37
    admissionregistration/v1 ValidationAction): flagged, as is a removed binding."""
    spec = inputs.get("spec") or {}
    actions = [str(a) for a in spec.get("validationActions") or []]
    scope = get(spec, "matchResources", "namespaceSelector")
    where = f"namespaces {_labels(scope)}" if scope else "every object it matches"
    grant = f"{', '.join(actions) or 'no action'} on {where}"
    flags = () if "Deny" in actions else ("admission not enforced",)
    return Grant(ADMISSION_KIND, _text(spec.get("policyName")), grant, flags, compared=spec)


def _bucket_policy(inputs: dict[str, Any]) -> Grant:
    summary, flags = _policy_summary(inputs.get("policy"))
    return Grant("bucket policy", f"bucket {_text(inputs.get('bucket'))}", summary, flags)


def _public_access_block(inputs: dict[str, Any]) -> Grant:
    keys = ("blockPublicAcls", "blockPublicPolicy", "ignorePublicAcls", "restrictPublicBuckets")
    off = [k for k in keys if not inputs.get(k)]
    grant = f"not blocked: {', '.join(off)}" if off else "all public access blocked"
    flags = ("public access not blocked",) if off else ()
    return Grant("bucket public access", f"bucket {_text(inputs.get('bucket'))}", grant, flags)


Allow = tuple[str, str, str, Condition]  # (principal, action, resource, conditions)


def _iam_allows(document: Any) -> list[Allow]:
    """Every (principal, action, resource) an IAM document allows, with its conditions."""
    found: list[Allow] = []
    for statement in _statements(document):
        if statement.get("Effect", "Allow") != "Allow":
            continue
        not_action = statement.get("NotAction")
        actions = _as_list(statement.get("Action")) or [f"all but {_names(not_action)}"]
        not_resource = statement.get("NotResource")
        resources = _as_list(statement.get("Resource")) or (
            [f"all but {_names(not_resource)}"] if not_resource else ["*"]
        )
        conditions = _conditions(statement)
        for who in _principals(statement) or [""]:
            found += [(who, str(a), str(r), conditions) for a in actions for r in resources]
    return found


def _glob(pattern: str, value: str, *, fold: bool = False) -> bool:
    """Whether IAM's `pattern` (`*` and `?` wildcards) matches every string `value` (a pattern
    too) matches: true when it matches `value`'s text, its wildcards taken as characters."""
    regex = re.escape(pattern).replace(r"\*", ".*").replace(r"\?", ".")
    return re.fullmatch(regex, value, re.IGNORECASE if fold else 0) is not None


def _condition_covers(old: Condition, new: Condition) -> bool:
    """`new` asks at least what `old` asks: each of old's conditions is in new, with values
    that old's allow (a condition new adds narrows it further)."""
    for operator, key, values in old:
        like = "Like" in operator
        match = [v for op, k, v in new if (op, k) == (operator, key)]
        if not match or not all(
            any(_glob(o, n) if like else o == n for o in values) for n in match[0]
        ):
            return False
    return True


def _iam_widened(before: Any, after: Any) -> list[str]:
    """What the new document allows that the old one did not: new actions, wider resources,
    a principal more, a condition loosened or gone. Grouped by resource and condition."""
    old = _iam_allows(before)
    wider: dict[tuple[str, str, Condition], list[str]] = {}
    for who, action, resource, conditions in _iam_allows(after):
        if not any(
            _glob(o_who, who)
            and _glob(o_action, action, fold=True)
            and _glob(o_resource, resource)
            and _condition_covers(o_cond, conditions)
            for o_who, o_action, o_resource, o_cond in old
        ):
            wider.setdefault((who, resource, conditions), []).append(action)
    return [
        f"{', '.join(actions)} on {resource}{_condition_text(cond)}"
        + (f" for {who}" if who else "")
        for (who, resource, cond), actions in wider.items()
    ]


def _rbac_rules(inputs: dict[str, Any]) -> list[tuple[str, str, str, tuple[str, ...]]]:
    """(API group, resource, verb, resource names) an RBAC role grants."""
    found = []
    for rule in inputs.get("rules") or []:
        names = tuple(rule.get("resourceNames") or ())
        groups = rule.get("apiGroups") or [""]
        targets = rule.get("resources") or [f"URL {u}" for u in rule.get("nonResourceURLs") or []]
        found += [
            (str(g), str(t), str(v), names)
            for g in groups
            for t in targets
            for v in rule.get("verbs") or []
        ]
    return found


def _rbac_widened(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    """Verbs on resources the new role grants that the old one did not."""
    old = _rbac_rules(before)
    wider: dict[tuple[str, str, tuple[str, ...]], list[str]] = {}
    for group, target, verb, names in _rbac_rules(after):
        if not any(
            og in ("*", group)
            and ot in ("*", target)
            and ov in ("*", verb)
            and (not on or (names and set(names) <= set(on)))
            for og, ot, ov, on in old
        ):
            wider.setdefault((group or "core", target, names), []).append(verb)
    return [
        f"{', '.join(verbs)} on {target} ({group})" + (f" named {', '.join(n)}" if n else "")
        for (group, target, n), verbs in wider.items()
    ]


# Inputs holding an IAM document, per type; and RBAC roles, whose rules widen alike.
IAM_DOCUMENTS = {
    "aws:iam/role:Role": "assumeRolePolicy",
    "aws:iam/rolePolicy:RolePolicy": "policy",
    "aws:iam/policy:Policy": "policy",
    "aws:s3/bucketPolicy:BucketPolicy": "policy",
}
RBAC_ROLES = (
    "kubernetes:rbac.authorization.k8s.io/v1:Role",
    "kubernetes:rbac.authorization.k8s.io/v1:ClusterRole",
)


def widened(rtype: str, before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    """What a changed grant now allows that it did not (issue 41 #3: a dataset prefix widened
    to the whole bucket read as three changed policies, nothing flagged)."""
    if rtype in IAM_DOCUMENTS:
        key = IAM_DOCUMENTS[rtype]
        return _iam_widened(before.get(key), after.get(key))
    if rtype in RBAC_ROLES:
        return _rbac_widened(before, after)
    return []


Reader = Callable[[dict[str, Any], str], Grant]
READERS: dict[str, Reader] = {
    "aws:eks/accessEntry:AccessEntry": lambda i, _n: _access_entry(i),
    "aws:eks/accessPolicyAssociation:AccessPolicyAssociation": lambda i, _n: _access_policy(i),
    "aws:eks/cluster:Cluster": lambda i, _n: _cluster(i),
    "aws:eks/podIdentityAssociation:PodIdentityAssociation": lambda i, _n: _pod_identity(i),
    "aws:iam/role:Role": _role,
    "aws:iam/rolePolicy:RolePolicy": _role_policy,
    "aws:iam/policy:Policy": _policy,
    "aws:iam/rolePolicyAttachment:RolePolicyAttachment": lambda i, _n: _attachment(i),
    "aws:ec2/securityGroup:SecurityGroup": _security_group,
    "aws:ec2/securityGroupRule:SecurityGroupRule": lambda i, _n: _legacy_sg_rule(i),
    "aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule": (
        lambda i, _n: _sg_rule(i, "ingress")
    ),
    "aws:vpc/securityGroupEgressRule:SecurityGroupEgressRule": (
        lambda i, _n: _sg_rule(i, "egress")
    ),
    "aws:s3/bucketPolicy:BucketPolicy": lambda i, _n: _bucket_policy(i),
    "aws:s3/bucketPublicAccessBlock:BucketPublicAccessBlock": lambda i, _n: _public_access_block(i),
    "kubernetes:rbac.authorization.k8s.io/v1:RoleBinding": lambda i, _n: _binding(i),
    "kubernetes:rbac.authorization.k8s.io/v1:ClusterRoleBinding": lambda i, _n: _binding(i),
    "kubernetes:rbac.authorization.k8s.io/v1:Role": lambda i, _n: _rbac_role(i),
    "kubernetes:rbac.authorization.k8s.io/v1:ClusterRole": lambda i, _n: _rbac_role(i),
    "kubernetes:networking.k8s.io/v1:NetworkPolicy": lambda i, _n: _network_policy(i),
    "kubernetes:admissionregistration.k8s.io/v1:ValidatingAdmissionPolicyBinding": (
        lambda i, _n: _admission_binding(i)
    ),
}
PRINCIPAL_KINDS = ("EKS access entry", "EKS access policy")


def _grants(plan: dict[str, Any]) -> dict[tuple[str, str], tuple[Grant, dict[str, Any]]]:
    found: dict[tuple[str, str], tuple[Grant, dict[str, Any]]] = {}
    for resource in plan["resources"]:
        reader = READERS.get(resource.get("type", ""))
        if reader is None or not resource.get("custom", True):
            continue
        inputs = resource.get("inputs") or {}
        found[(resource["type"], resource["name"])] = (reader(inputs, resource["name"]), inputs)
    return found


def _compared(grant: Grant, inputs: dict[str, Any]) -> Any:
    return inputs if grant.compared is None else grant.compared


def _principal_accounts(grants: dict[tuple[str, str], tuple[Grant, dict[str, Any]]]) -> set[str]:
    return {
        acct
        for grant, _ in grants.values()
        if grant.kind in PRINCIPAL_KINDS and (acct := account(grant.subject))
    }


def access_section(
    base: dict[str, Any], head: dict[str, Any], twins: dict[tuple[str, str], str] | None = None
) -> list[AccessChange]:
    """Every access grant added, removed or changed, naming the subject and what it gets;
    `twins` labels added grants that are another team's or pool's, renamed."""
    old, new = _grants(base), _grants(head)
    known = _principal_accounts(old)
    changes: list[AccessChange] = []
    for ref in sorted(set(old) | set(new)):
        rtype, name = ref
        resource = f"{rtype.rsplit(':', 1)[-1]} {name}"
        if ref not in old:
            grant = new[ref][0]
            flags = list(grant.flags)
            acct = account(grant.subject) if grant.kind in PRINCIPAL_KINDS else None
            if acct and base["resources"] and acct not in known:
                flags.append(f"account {acct} new to this stack")
            twin = (twins or {}).get(ref, "")
            changes.append(
                AccessChange(
                    "added", grant.kind, grant.subject, grant.grant, resource, flags, twin=twin
                )
            )
            continue
        if ref not in new:
            grant = old[ref][0]
            flags = list(grant.flags) + ([GUARD_REMOVED] if grant.kind == ADMISSION_KIND else [])
            changes.append(
                AccessChange("removed", grant.kind, grant.subject, grant.grant, resource, flags)
            )
            continue
        (before, old_inputs), (after, new_inputs) = old[ref], new[ref]
        diffs = [
            d
            for d in changed_paths(_compared(before, old_inputs), _compared(after, new_inputs))
            if not d[0].startswith(IGNORED)
        ]
        if not diffs:
            continue
        shown = readable(diffs)
        flags = [f for f in after.flags if f not in before.flags]
        wider = widened(rtype, old_inputs, new_inputs)
        if wider:
            flags.append("widened")
        changes.append(
            AccessChange(
                "changed",
                after.kind,
                after.subject,
                after.grant,
                resource,
                flags,
                *limited(shown),
                widened=wider,
            )
        )
    changes.sort(key=lambda c: (c.kind, c.subject, c.grant, c.change, c.resource))
    return changes
