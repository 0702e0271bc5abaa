"""Kubernetes' own syntax rules for strings that trainstack puts into Kubernetes fields.

A name, label, env var, resource quantity or image that Kubernetes will refuse is cheaper to
report at config-load time, naming the config field, than as an API-server rejection (or a
kubelet ``InvalidImageName``) halfway through a deploy. So these checks are ports of the Go code
that makes the decision, at the versions trainstack pins, not rules of our own: the regexes,
length limits and messages below are the ones in that source, and each function's docstring
names the Go file and function it follows. Two deliberate consequences:

* Lengths are counted the way Go's ``len`` counts them, in UTF-8 bytes, not characters.
* Messages are Kubernetes' own wording, copied verbatim (including its odd ``',  or '``
  spacing), plain text, with regexes printed as-is, so they can be searched for.

Every function returns a list of problems, empty when the value is valid.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

# --- k8s.io/apimachinery@v0.37.2 pkg/util/validation/validation.go and
# --- pkg/api/validate/content/{dns,kube,errors}.go ---------------------------------------------

# Go's regexp `^...$` (no multi-line flag) anchors at the very ends of the text; Python's `$`
# also matches before a trailing newline, so every pattern is applied with `fullmatch`.
_DNS1123_LABEL_FMT = "[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_DNS1123_LABEL_ERR = (
    "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', "
    "and must start and end with an alphanumeric character"
)
_DNS1123_LABEL_MAX = 63
_DNS1123_SUBDOMAIN_FMT = _DNS1123_LABEL_FMT + "(\\." + _DNS1123_LABEL_FMT + ")*"
_DNS1123_SUBDOMAIN_ERR = (
    "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, "
    "'-' or '.', and must start and end with an alphanumeric character"
)
_DNS1123_SUBDOMAIN_MAX = 253
_DNS1123_LABEL_RE = re.compile(_DNS1123_LABEL_FMT)
_DNS1123_SUBDOMAIN_RE = re.compile(_DNS1123_SUBDOMAIN_FMT)

_LABEL_KEY_FMT = "([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]"
_LABEL_KEY_ERR = (
    "must consist of alphanumeric characters, '-', '_' or '.', "
    "and must start and end with an alphanumeric character"
)
_LABEL_KEY_MAX = 63
_LABEL_KEY_RE = re.compile(_LABEL_KEY_FMT)
_LABEL_KEY_EXAMPLES = ("MyName", "my.name", "123-abc")

_LABEL_VALUE_FMT = "(" + _LABEL_KEY_FMT + ")?"
_LABEL_VALUE_ERR = (
    "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' "
    "or '.', and must start and end with an alphanumeric character"
)
_LABEL_VALUE_MAX = 63
_LABEL_VALUE_RE = re.compile(_LABEL_VALUE_FMT)

_RELAXED_ENV_VAR_NAME_ERR = (
    "a valid environment variable name must consist only of printable ASCII characters "
    "other than '='"
)


def _byte_len(value: str) -> int:
    # Go's len() of a string is its UTF-8 byte count; the limits are defined in those terms.
    return len(value.encode("utf-8", "surrogatepass"))


def _max_len_error(length: int, unit: str) -> str:
    # util/validation's MaxLenError says "characters", content's says "bytes"; both count bytes.
    return f"must be no more than {length} {unit}"


def _regex_error(msg: str, fmt: str, *examples: str) -> str:
    """RegexError from both Go packages, byte for byte (the double space before 'or' is theirs)."""
    if not examples:
        return f"{msg} (regex used for validation is '{fmt}')"
    shown = " or ".join(f"'{example}', " for example in examples)
    return f"{msg} (e.g. {shown}regex used for validation is '{fmt}')"


def dns1123_label(value: str) -> list[str]:
    """A DNS-1123 label (most object names that become hostnames or path segments).

    Follows k8s.io/apimachinery@v0.37.2 pkg/util/validation/validation.go IsDNS1123Label.
    """
    problems = []
    if _byte_len(value) > _DNS1123_LABEL_MAX:
        problems.append(_max_len_error(_DNS1123_LABEL_MAX, "characters"))
    if not _DNS1123_LABEL_RE.fullmatch(value):
        if _DNS1123_SUBDOMAIN_RE.fullmatch(value):
            # Go's own shortcut: a valid subdomain that is not a valid label differs by dots.
            problems.append("must not contain dots")
        else:
            problems.append(
                _regex_error(_DNS1123_LABEL_ERR, _DNS1123_LABEL_FMT, "my-name", "123-abc")
            )
    return problems


def _subdomain(value: str, unit: str) -> list[str]:
    problems = []
    if _byte_len(value) > _DNS1123_SUBDOMAIN_MAX:
        problems.append(_max_len_error(_DNS1123_SUBDOMAIN_MAX, unit))
    if not _DNS1123_SUBDOMAIN_RE.fullmatch(value):
        problems.append(_regex_error(_DNS1123_SUBDOMAIN_ERR, _DNS1123_SUBDOMAIN_FMT, "example.com"))
    return problems


def dns1123_subdomain(value: str) -> list[str]:
    """A DNS-1123 subdomain (names of most namespaced objects: ConfigMaps, Jobs, ...).

    Follows k8s.io/apimachinery@v0.37.2 pkg/util/validation/validation.go IsDNS1123Subdomain.
    """
    return _subdomain(value, "characters")


def qualified_name(value: str) -> list[str]:
    """A label key or annotation key: ``[DNS-1123 subdomain prefix '/'] name``.

    Follows k8s.io/apimachinery@v0.37.2 pkg/util/validation/validation.go IsQualifiedName,
    which is pkg/api/validate/content/kube.go IsLabelKey (the prefix is checked with
    content/dns.go IsDNS1123Subdomain, whose length message says "bytes"). Label keys go
    through it unchanged (pkg/apis/meta/v1/validation/validation.go ValidateLabels).

    Annotation keys: pkg/api/validation/objectmeta.go ValidateAnnotations lowercases the key
    before this check, so an uppercase prefix ("Example.com/x") is fine there; call
    ``qualified_name(key.lower())`` for annotation keys.
    """
    problems: list[str] = []
    parts = value.split("/")
    if len(parts) == 1:
        name = parts[0]
    elif len(parts) == 2:
        prefix, name = parts
        if not prefix:
            problems.append("prefix part must be non-empty")
        else:
            problems.extend("prefix part " + msg for msg in _subdomain(prefix, "bytes"))
    else:
        return [
            "a valid label key "
            + _regex_error(_LABEL_KEY_ERR, _LABEL_KEY_FMT, *_LABEL_KEY_EXAMPLES)
            + " with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')"
        ]

    if not name:
        problems.append("name part must be non-empty")
    elif _byte_len(name) > _LABEL_KEY_MAX:
        problems.append("name part " + _max_len_error(_LABEL_KEY_MAX, "bytes"))
    if not _LABEL_KEY_RE.fullmatch(name):
        problems.append(
            "name part " + _regex_error(_LABEL_KEY_ERR, _LABEL_KEY_FMT, *_LABEL_KEY_EXAMPLES)
        )
    return problems


def label_value(value: str) -> list[str]:
    """A label value; the empty string is a valid one.

    Follows k8s.io/apimachinery@v0.37.2 pkg/util/validation/validation.go IsValidLabelValue
    (= pkg/api/validate/content/kube.go IsLabelValue), as used by
    pkg/apis/meta/v1/validation/validation.go ValidateLabels.
    """
    problems = []
    if _byte_len(value) > _LABEL_VALUE_MAX:
        problems.append(_max_len_error(_LABEL_VALUE_MAX, "bytes"))
    if not _LABEL_VALUE_RE.fullmatch(value):
        problems.append(
            _regex_error(_LABEL_VALUE_ERR, _LABEL_VALUE_FMT, "MyValue", "my_value", "12345")
        )
    return problems


def env_var_name(value: str) -> list[str]:
    """A container env var name, under the rule Kubernetes 1.37 applies by default.

    Follows k8s.io/apimachinery@v0.37.2 pkg/util/validation/validation.go IsRelaxedEnvVarName,
    chosen by k8s.io/kubernetes@v1.37.2 pkg/apis/core/validation/validation.go ValidateEnv.
    """
    # ValidateEnv uses the relaxed rule when opts.AllowRelaxedEnvironmentVariableValidation is
    # set, which pkg/api/pod/util.go does whenever the RelaxedEnvironmentVariableValidation
    # gate is on; pkg/features/kube_features.go has it GA since 1.34, default true and locked
    # to it, so in 1.37 every name is checked this way. (The older C-identifier-like
    # IsEnvVarName only applies to clusters before 1.32 or with the gate off.)
    problems = []
    if not value:
        problems.append("environment variable name must be non-empty")
    # Go's unicode.IsPrint over ASCII is exactly ' '..'~'; anything above 0x7F is refused.
    if any(not (" " <= char <= "~") or char == "=" for char in value):
        problems.append(_RELAXED_ENV_VAR_NAME_ERR)
    return problems


# --- k8s.io/apimachinery@v0.37.2 pkg/api/resource/quantity.go and suffix.go ----------------------

# The error texts ParseQuantity returns. The regex in the first is Go's "overly permissive" split
# pattern, quoted because it is what the API server prints, not what decides acceptance.
_QUANTITY_SPLIT_RE = "^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$"
_ERR_FORMAT_WRONG = "quantities must match the regular expression '" + _QUANTITY_SPLIT_RE + "'"
_ERR_NUMERIC = "unable to parse numeric part of quantity"
_ERR_SUFFIX = "unable to parse quantity's suffix"

# parseQuantityString is a deterministic left-to-right scanner: sign, digits, optional '.' and
# digits, a run of suffix letters, an optional sign, digits, end. Possessive quantifiers make
# this regex equally deterministic, so it accepts exactly what the scanner does and splits the
# string where the scanner would.
_QUANTITY_SCAN_RE = re.compile(
    r"[+-]?+(?P<num>[0-9]*+)(?:\.(?P<denom>[0-9]*+))?+(?P<suffix>[eEinumkKMGTP]*+[+-]?+[0-9]*+)"
)
_DECIMAL_SI_EXPONENTS = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6}
_DECIMAL_SI_EXPONENTS |= {"G": 9, "T": 12, "P": 15, "E": 18}
_BINARY_SI_EXPONENTS = {"Ki": 10, "Mi": 20, "Gi": 30, "Ti": 40, "Pi": 50, "Ei": 60}
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
_NANO_SCALE = -9  # amount.go Nano; scales below it take ParseQuantity's inf.Dec path
_MAX_INT64_FACTORS = 18  # math.go maxInt64Factors


def _int32(value: int) -> int:
    # Go converts the parsed exponent with int32(...), which wraps instead of failing.
    return (value + 2**31) % 2**32 - 2**31


def _quantity_exponent(suffix: str) -> tuple[bool, int] | None:
    """(binary?, exponent) for a suffix as suffix.go's interpret reads it; None if it can't."""
    if suffix in _DECIMAL_SI_EXPONENTS:
        return False, _DECIMAL_SI_EXPONENTS[suffix]
    if suffix in _BINARY_SI_EXPONENTS:
        return True, _BINARY_SI_EXPONENTS[suffix]
    # "e"/"E" then strconv.ParseInt(rest, 10, 64): optional sign, digits, within int64.
    if len(suffix) > 1 and suffix[0] in "eE" and re.fullmatch("[+-]?[0-9]+", suffix[1:]):
        exponent = int(suffix[1:])
        if _INT64_MIN <= exponent <= _INT64_MAX:
            return False, _int32(exponent)
    return None


def quantity(value: str) -> list[str]:
    """A resource quantity ("500m", "1.5", "16Gi", "1e3", ...), as the API server parses it.

    Follows k8s.io/apimachinery@v0.37.2 pkg/api/resource/quantity.go ParseQuantity (with
    parseQuantityString, and suffix.go's interpret for the suffixes).
    """
    # Not reproduced: the JSON/CBOR decoders (UnmarshalJSON) strip surrounding whitespace before
    # ParseQuantity, so " 1Gi" in a manifest is accepted; ParseQuantity itself refuses it, and so
    # do we, because trainstack's value should not depend on that leniency. Range is not checked
    # either: ParseQuantity caps or rounds huge and tiny values rather than refusing them, and
    # "no negative requests" is a separate rule of the core API validation, not of the syntax.
    if not value:
        return [_ERR_FORMAT_WRONG]
    if value == "0":
        return []
    scanned = _QUANTITY_SCAN_RE.fullmatch(value)
    if scanned is None:
        return [_ERR_FORMAT_WRONG]
    interpreted = _quantity_exponent(scanned["suffix"])
    if interpreted is None:
        return [_ERR_SUFFIX]
    binary, exponent = interpreted

    # Once the suffix is known, the number can only fail to parse when it has no digits at all
    # ("", ".", "+.": "Gi" and "." are quantities, meaning 0) AND ParseQuantity leaves its int64
    # fast path for the inf.Dec one, whose SetString needs a digit. Mirror that path choice.
    if scanned["num"] or scanned["denom"]:  # both groups hold ASCII digits only
        return []
    num = "0"  # what parseQuantityString hands on once the leading zeros are gone
    if binary:
        # ParseQuantity's precision estimate for the binary fast path; "Pi"/"Ei" exceed it.
        fast = 15 - len(num) - exponent * 3 // 10 - 1 >= 0
    else:
        fast = _MAX_INT64_FACTORS - len(num) >= 0 and exponent >= _NANO_SCALE
    return [] if fast else [_ERR_NUMERIC]


# --- github.com/distribution/reference@v0.6.0 regexp.go, reference.go, normalize.go -------------

_ALPHANUMERIC = r"[a-z0-9]+"
_SEPARATOR = r"(?:[._]|__|[-]+)"
_DOMAIN_NAME_COMPONENT = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_OPTIONAL_PORT = r"(?::[0-9]+)?"
# Go's RE2 \w is ASCII-only; re.ASCII below gives Python's \w the same meaning.
_TAG = r"[\w][\w.-]{0,127}"
_DIGEST = r"[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*[:][0-9A-Fa-f]{32,}"
_IPV6_ADDRESS = r"\[(?:[a-fA-F0-9:]+)\]"
_DOMAIN_NAME = _DOMAIN_NAME_COMPONENT + r"(?:\." + _DOMAIN_NAME_COMPONENT + ")*"
_DOMAIN_AND_PORT = "(?:" + _DOMAIN_NAME + "|" + _IPV6_ADDRESS + ")" + _OPTIONAL_PORT
_PATH_COMPONENT = _ALPHANUMERIC + "(?:" + _SEPARATOR + _ALPHANUMERIC + ")*"
_REMOTE_NAME = _PATH_COMPONENT + "(?:/" + _PATH_COMPONENT + ")*"
_NAME = "(?:" + _DOMAIN_AND_PORT + "/)?" + _REMOTE_NAME
_REFERENCE_RE = re.compile("(" + _NAME + ")(?::(" + _TAG + "))?(?:@(" + _DIGEST + "))?", re.ASCII)
_ANCHORED_NAME_RE = re.compile("(?:(" + _DOMAIN_AND_PORT + ")/)?(" + _REMOTE_NAME + ")")
_IDENTIFIER_RE = re.compile("[a-f0-9]{64}")
_REPOSITORY_NAME_MAX = 255  # reference.go RepositoryNameTotalLengthMax, on the path part only

# github.com/opencontainers/go-digest@v1.0.0 (digest.go Validate, algorithm.go): the algorithms
# the kubelet links in (crypto/sha256 and crypto/sha512), with their hex lengths.
_DIGEST_HEX_LENGTHS = {"sha256": 64, "sha384": 96, "sha512": 128}
_GO_DIGEST_RE = re.compile(r"[a-z0-9]+(?:[.+_-][a-z0-9]+)*:[a-zA-Z0-9=_-]+")

# Go's unicode.IsSpace (used by strings.TrimSpace): not quite Python's str.isspace().
_GO_SPACE = "\t\n\v\f\r \x85\xa0\u1680" + "".join(map(chr, range(0x2000, 0x200B)))
_GO_SPACE += "\u2028\u2029\u202f\u205f\u3000"


def _split_docker_domain(name: str) -> tuple[str, str]:
    """normalize.go splitDockerDomain: which part of a familiar name is the registry."""
    maybe_domain, slash, maybe_remote = name.partition("/")
    if not slash:
        return "docker.io", "library/" + name
    if maybe_domain == "localhost" or any(char in maybe_domain for char in ".:"):
        domain, remote = maybe_domain, maybe_remote
    elif maybe_domain == "index.docker.io":
        domain, remote = "docker.io", maybe_remote
    elif maybe_domain.lower() != maybe_domain:
        # Uppercase is illegal in repository paths, so an uppercase first component is taken
        # as a registry host: "UPPER/app" is registry "UPPER", path "app".
        domain, remote = maybe_domain, maybe_remote
    else:
        domain, remote = "docker.io", name
    if domain == "docker.io" and "/" not in remote:
        remote = "library/" + remote
    return domain, remote


def _digest_problem(digest: str) -> str | None:
    algorithm, _, encoded = digest.partition(":")
    if algorithm not in _DIGEST_HEX_LENGTHS:
        if not _GO_DIGEST_RE.fullmatch(digest):
            return "invalid checksum digest format"
        return "unsupported digest algorithm"
    if len(encoded) != _DIGEST_HEX_LENGTHS[algorithm]:
        return "invalid checksum digest length"
    if not re.fullmatch("[a-f0-9]+", encoded):
        return "invalid checksum digest format"
    return None


def _parse_normalized_named(value: str) -> str | None:
    if _IDENTIFIER_RE.fullmatch(value):
        return f"invalid repository name ({value}), cannot specify 64-byte hexadecimal strings"
    domain, remainder = _split_docker_domain(value)
    remote = remainder.partition(":")[0]
    if remote.lower() != remote:
        return f"invalid reference format: repository name ({remote}) must be lowercase"

    # reference.go Parse, on the normalized "domain/remainder".
    normalized = domain + "/" + remainder
    matched = _REFERENCE_RE.fullmatch(normalized)
    if matched is None:
        if _REFERENCE_RE.fullmatch(normalized.lower()):
            return "repository name must be lowercase"
        return "invalid reference format"
    name_match = _ANCHORED_NAME_RE.fullmatch(matched[1])
    path = name_match[2] if name_match else matched[1]
    if len(path) > _REPOSITORY_NAME_MAX:
        return f"repository name must not be more than {_REPOSITORY_NAME_MAX} characters"
    return _digest_problem(matched[3]) if matched[3] else None


def image_reference(value: str) -> list[str]:
    """A container image reference, as the kubelet parses it before asking the runtime to pull.

    Follows github.com/distribution/reference@v0.6.0 normalize.go ParseNormalizedNamed (with
    reference.go Parse, regexp.go, and github.com/opencontainers/go-digest@v1.0.0 digest.go
    Validate for the digest), which k8s.io/kubernetes@v1.37.2 pkg/util/parsers/parsers.go
    ParseImageName calls; plus the API server's own checks on the field in
    pkg/apis/core/validation/validation.go validateContainerCommon (required) and
    validateContainerOnlyForPod (no surrounding whitespace).
    """
    if not value:
        return ["Required value"]
    problems = []
    if value.strip(_GO_SPACE) != value:
        problems.append("must not have leading or trailing whitespace")
    parse_problem = _parse_normalized_named(value)
    if parse_problem is not None:
        problems.append(parse_problem)
    return problems


# --- k8s.io/apimachinery@v0.37.2 pkg/api/validation/objectmeta.go --------------------------------

_TOTAL_ANNOTATION_SIZE_LIMIT = 256 * (1 << 10)  # TotalAnnotationSizeLimitB, "256 kB"


def annotations_size(annotations: Mapping[str, str]) -> list[str]:
    """The total size of an object's annotations, keys plus values, in bytes.

    Follows k8s.io/apimachinery@v0.37.2 pkg/api/validation/objectmeta.go ValidateAnnotationsSize
    (the error is ValidateAnnotations' field.TooLong, with the size from the former). The key
    syntax part of ValidateAnnotations is ``qualified_name(key.lower())``.
    """
    total = sum(_byte_len(key) + _byte_len(value) for key, value in annotations.items())
    if total <= _TOTAL_ANNOTATION_SIZE_LIMIT:
        return []
    limit = _TOTAL_ANNOTATION_SIZE_LIMIT
    # field.TooLong's detail, then ValidateAnnotationsSize's own error for the numbers.
    return [
        f"may not be more than {limit} bytes "
        f"(annotations size {total} is larger than limit {limit})"
    ]
