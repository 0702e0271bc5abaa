"""Kubernetes' own syntax rules (trainstack/config/k8s_syntax.py), against tables of cases.

Most cases are taken from the Go tests next to the code being ported, cited above each table;
the expected messages are Kubernetes' exact wording, written out here independently of the
module's constants so that a drifting message fails a test.
"""

from __future__ import annotations

import pytest

from trainstack.config import k8s_syntax as k

# --- Kubernetes' messages, verbatim (RegexError's "',  or '" double space is Go's) ------------

LABEL_REGEX = (
    "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', "
    "and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', "
    "regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')"
)
SUBDOMAIN_REGEX = (
    "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' "
    "or '.', and must start and end with an alphanumeric character (e.g. 'example.com', "
    "regex used for validation is "
    "'[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')"
)
NAME_PART_REGEX = (
    "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and "
    "end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', "
    "regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')"
)
TOO_MANY_SLASHES = (
    "a valid label key must consist of alphanumeric characters, '-', '_' or '.', and must "
    "start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or "
    "'123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]') with "
    "an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')"
)
LABEL_VALUE_REGEX = (
    "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or "
    "'.', and must start and end with an alphanumeric character (e.g. 'MyValue',  or "
    "'my_value',  or '12345', regex used for validation is "
    "'(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')"
)
ENV_EMPTY = "environment variable name must be non-empty"
ENV_CHARS = (
    "a valid environment variable name must consist only of printable ASCII characters "
    "other than '='"
)
Q_FORMAT = (
    "quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'"
)
Q_SUFFIX = "unable to parse quantity's suffix"
Q_NUMERIC = "unable to parse numeric part of quantity"
BAD_REF = "invalid reference format"
REPO_TOO_LONG = "repository name must not be more than 255 characters"

HEX64 = "1a3f5e7d9c1b3a5f7e9d1c3b5a7f9e1d3c5b7a9f1e3d5d7c9b1a3f5e7d9c1b3a"
SHA256 = "sha256:" + "f" * 64


def case(value: str, expected: list[str], name: str) -> object:
    """A table row whose value is too long (or too odd) to be a readable test id."""
    return pytest.param(value, expected, id=name)


# --- dns1123_label: k8s.io/apimachinery@v0.37.2 pkg/util/validation/validation_test.go
# --- TestIsDNS1123Label (goodValues / badValues) ------------------------------------------------

DNS1123_LABEL_CASES: list[object] = [
    ("a", []),
    ("a-1", []),
    ("a--1--2--b", []),
    ("0", []),
    ("1--a--b--2", []),
    case("a" * 63, [], "63-chars"),
    ("", [LABEL_REGEX]),
    ("A", [LABEL_REGEX]),
    ("aBc", [LABEL_REGEX]),
    ("-", [LABEL_REGEX]),
    ("a-", [LABEL_REGEX]),
    ("-a", [LABEL_REGEX]),
    ("_a", [LABEL_REGEX]),
    ("a_b", [LABEL_REGEX]),
    ("a.", [LABEL_REGEX]),
    (".a", [LABEL_REGEX]),
    ("a b", [LABEL_REGEX]),
    # A valid subdomain that is not a label gets Go's shorter message.
    ("a.b", ["must not contain dots"]),
    ("1.2", ["must not contain dots"]),
    case("a" * 64, ["must be no more than 63 characters"], "64-chars"),
    case("A" * 64, ["must be no more than 63 characters", LABEL_REGEX], "64-uppercase"),
    case(
        "a" * 31 + "." + "a" * 32,
        ["must be no more than 63 characters", "must not contain dots"],
        "64-chars-with-dot",
    ),
    # Go's `$` does not match before a trailing newline; Python's would.
    case("abc\n", [LABEL_REGEX], "trailing-newline"),
    case("é", [LABEL_REGEX], "non-ascii"),
]


@pytest.mark.parametrize(("value", "expected"), DNS1123_LABEL_CASES)
def test_dns1123_label(value: str, expected: list[str]) -> None:
    assert k.dns1123_label(value) == expected


# --- dns1123_subdomain: validation_test.go TestIsDNS1123Subdomain -------------------------------

DNS1123_SUBDOMAIN_CASES: list[object] = [
    ("a", []),
    ("a.b.c.d.e", []),
    ("1.2.3.4.5", []),
    ("a--1--2--b.a", []),
    ("012.a", []),
    ("example.com", []),
    case("a" * 253, [], "253-chars"),
    case(".".join(["a" * 63] * 3) + "." + "b" * 61, [], "253-chars-dotted"),
    ("", [SUBDOMAIN_REGEX]),
    ("A.a", [SUBDOMAIN_REGEX]),
    ("ab.A", [SUBDOMAIN_REGEX]),
    ("a..b", [SUBDOMAIN_REGEX]),
    (".a", [SUBDOMAIN_REGEX]),
    ("a.", [SUBDOMAIN_REGEX]),
    ("a-.b", [SUBDOMAIN_REGEX]),
    ("a.-b", [SUBDOMAIN_REGEX]),
    ("a_b", [SUBDOMAIN_REGEX]),
    ("a:b", [SUBDOMAIN_REGEX]),
    ("a@b", [SUBDOMAIN_REGEX]),
    ("a/b", [SUBDOMAIN_REGEX]),
    case("a" * 254, ["must be no more than 253 characters"], "254-chars"),
    case("A" * 254, ["must be no more than 253 characters", SUBDOMAIN_REGEX], "254-uppercase"),
    case("a.b\n", [SUBDOMAIN_REGEX], "trailing-newline"),
]


@pytest.mark.parametrize(("value", "expected"), DNS1123_SUBDOMAIN_CASES)
def test_dns1123_subdomain(value: str, expected: list[str]) -> None:
    assert k.dns1123_subdomain(value) == expected


# --- qualified_name: validation_test.go TestIsQualifiedName and
# --- pkg/api/validate/content/kube_test.go TestIsLabelKey (successCases / errorCases) ----------

QUALIFIED_NAME_CASES: list[object] = [
    ("simple", []),
    ("now-with-dashes", []),
    ("1-starts-with-num", []),
    ("1234", []),
    ("simple/simple", []),
    ("now.with.dots/simple", []),
    ("1-num.2-num/3-num", []),
    ("1234/5678", []),
    ("1.2.3.4/5678", []),
    ("Uppercase_Is_OK_123", []),
    ("example.com/Uppercase_Is_OK_123", []),
    ("requests.storage-foo", []),
    ("trainstack.io/team", []),
    ("a_b.c-D", []),
    case("a" * 63, [], "name-63"),
    case("a" * 253 + "/" + "b" * 63, [], "prefix-253-name-63"),
    ("", ["name part must be non-empty", NAME_PART_REGEX]),
    ("nospecialchars%^=@", [NAME_PART_REGEX]),
    ("cantendwithadash-", [NAME_PART_REGEX]),
    ("-cantstartwithadash-", [NAME_PART_REGEX]),
    ("_a", [NAME_PART_REGEX]),
    ("a.", [NAME_PART_REGEX]),
    ("only/one/slash", [TOO_MANY_SLASHES]),
    # Label keys keep the prefix lowercase (a DNS subdomain); annotation keys: see below.
    ("Example.com/abc", ["prefix part " + SUBDOMAIN_REGEX]),
    ("example_com/abc", ["prefix part " + SUBDOMAIN_REGEX]),
    ("-example.com/abc", ["prefix part " + SUBDOMAIN_REGEX]),
    ("example.com/", ["name part must be non-empty", NAME_PART_REGEX]),
    ("/simple", ["prefix part must be non-empty"]),
    ("/", ["prefix part must be non-empty", "name part must be non-empty", NAME_PART_REGEX]),
    case("a" * 64, ["name part must be no more than 63 bytes"], "name-64"),
    case("a" * 253 + "/" + "b" * 64, ["name part must be no more than 63 bytes"], "name-64-pfx"),
    case("a" * 254 + "/abc", ["prefix part must be no more than 253 bytes"], "prefix-254"),
    case("key\n", [NAME_PART_REGEX], "trailing-newline"),
]


@pytest.mark.parametrize(("value", "expected"), QUALIFIED_NAME_CASES)
def test_qualified_name(value: str, expected: list[str]) -> None:
    assert k.qualified_name(value) == expected


def test_annotation_keys_are_checked_lowercased() -> None:
    # pkg/api/validation/objectmeta.go ValidateAnnotations lowercases a key before
    # IsQualifiedName: an uppercase prefix is fine on an annotation, not on a label.
    assert k.qualified_name("Example.com/Note") != []
    assert k.qualified_name("Example.com/Note".lower()) == []


# --- label_value: validation_test.go TestIsValidLabelValue, content/kube_test.go TestIsLabelValue

LABEL_VALUE_CASES: list[object] = [
    ("", []),  # the empty label value is valid
    ("simple", []),
    ("now-with-dashes", []),
    ("1-starts-with-num", []),
    ("end-with-num-1", []),
    ("1234", []),
    ("My_Value.v2", []),
    case("a" * 63, [], "63-chars"),
    ("nospecialchars%^=@", [LABEL_VALUE_REGEX]),
    ("Tama-nui-te-rā.is.Māori.sun", [LABEL_VALUE_REGEX]),
    ("\\backslashes\\are\\bad", [LABEL_VALUE_REGEX]),
    ("-starts-with-dash", [LABEL_VALUE_REGEX]),
    ("ends-with-dash-", [LABEL_VALUE_REGEX]),
    (".starts.with.dot", [LABEL_VALUE_REGEX]),
    ("ends.with.dot.", [LABEL_VALUE_REGEX]),
    ("_starts_with_underscore", [LABEL_VALUE_REGEX]),
    ("a/b", [LABEL_VALUE_REGEX]),
    ("a b", [LABEL_VALUE_REGEX]),
    case("a" * 64, ["must be no more than 63 bytes"], "64-chars"),
    # 32 characters but 64 UTF-8 bytes: Go's len() counts bytes.
    case("ā" * 32, ["must be no more than 63 bytes", LABEL_VALUE_REGEX], "64-bytes"),
]


@pytest.mark.parametrize(("value", "expected"), LABEL_VALUE_CASES)
def test_label_value(value: str, expected: list[str]) -> None:
    assert k.label_value(value) == expected


# --- env_var_name: validation_test.go TestIsRelaxedEnvVarName (the 1.37 default rule) ----------

ENV_VAR_NAME_CASES: list[object] = [
    ("MY_VAR", []),
    ("my.env-name", []),
    ("-", []),
    (":", []),
    ("_", []),
    ("+a", []),
    ("a..", []),
    ("0a", []),  # a leading digit was refused before the relaxed rule
    ("0 a", []),
    ("a ", []),
    ("~a", []),
    ("'a", []),
    ("", [ENV_EMPTY]),
    ("=", [ENV_CHARS]),
    ("a=", [ENV_CHARS]),
    ("a=b", [ENV_CHARS]),
    case("\x01abc", [ENV_CHARS], "control-char"),
    case("\x7f", [ENV_CHARS], "delete"),
    case("a\n", [ENV_CHARS], "newline"),
    case("\x82abc", [ENV_CHARS], "latin1"),
    ("Ç ç", [ENV_CHARS]),
]


@pytest.mark.parametrize(("value", "expected"), ENV_VAR_NAME_CASES)
def test_env_var_name(value: str, expected: list[str]) -> None:
    assert k.env_var_name(value) == expected


# --- quantity: k8s.io/apimachinery@v0.37.2 pkg/api/resource/quantity_test.go TestQuantityParse
# --- (its table and its `invalid` list) and TestParseQuantityString -----------------------------

QUANTITY_CASES: list[object] = [
    ("0", []),
    ("1", []),
    ("1.5", []),
    ("100m", []),
    ("1Gi", []),
    ("1e3", []),
    ("+1", []),
    ("-1", []),  # syntax only: "no negative requests" is a different rule
    ("1.", []),
    (".5", []),
    ("5n", []),
    ("4u", []),
    ("8k", []),
    ("7M", []),
    ("1E", []),  # exa, not an exponent
    ("1E-3", []),
    ("1.3E+6", []),
    ("0.5e-9", []),
    ("1.G", []),
    ("100.035Ki", []),
    ("0.000000000001Ki", []),
    ("9Ei", []),  # too big: ParseQuantity caps it rather than refusing it
    ("9223372036854775807Ki", []),
    # Things written by trolls that ParseQuantity accepts as 0 (TestParseQuantityString).
    (".", []),
    ("-.", []),
    ("Gi", []),
    ("", [Q_FORMAT]),
    ("1Gb", [Q_FORMAT]),
    ("1 Gi", [Q_FORMAT]),
    (" 1", [Q_FORMAT]),  # JSON decoding would trim this; ParseQuantity does not
    ("1 ", [Q_FORMAT]),
    ("1.1.M", [Q_FORMAT]),
    ("1+1.0M", [Q_FORMAT]),
    ("0.1am", [Q_FORMAT]),
    ("aoeu", [Q_FORMAT]),
    ("1e3Gi", [Q_FORMAT]),
    case("1\n", [Q_FORMAT], "trailing-newline"),
    ("0.1mi", [Q_SUFFIX]),
    (".5i", [Q_SUFFIX]),
    ("1i", [Q_SUFFIX]),
    ("-3.01i", [Q_SUFFIX]),
    ("-3.01e-", [Q_SUFFIX]),
    ("1K", [Q_SUFFIX]),
    ("1ki", [Q_SUFFIX]),
    ("1e", [Q_SUFFIX]),
    ("1Ee3", [Q_SUFFIX]),
    ("1e9223372036854775807", []),
    ("1e9223372036854775808", [Q_SUFFIX]),  # the exponent must fit an int64
    # No digits at all, on ParseQuantity's arbitrary-precision path: nothing to parse.
    ("Pi", [Q_NUMERIC]),
    ("Ei", [Q_NUMERIC]),
    ("e-10", [Q_NUMERIC]),
    ("e-9", []),
    ("-e-10", [Q_NUMERIC]),
    ("1e-10", []),
]


@pytest.mark.parametrize(("value", "expected"), QUANTITY_CASES)
def test_quantity(value: str, expected: list[str]) -> None:
    assert k.quantity(value) == expected


# --- image_reference: github.com/distribution/reference@v0.6.0 normalize_test.go
# --- (TestValidateReferenceName, TestValidateRemoteName) and reference_test.go TestReferenceParse

IMAGE_REFERENCE_CASES: list[object] = [
    ("registry.example.com:5000/team/app:1.2", []),
    case("app@" + SHA256, [], "digest"),
    case("app:1.2@" + SHA256, [], "tag-and-digest"),
    case("app@sha512:" + "f" * 128, [], "sha512"),
    ("app", []),
    ("app:latest", []),
    ("library/app", []),
    ("localhost/app", []),
    ("localhost:5000/app:v1", []),
    ("127.0.0.1:5000/docker/docker", []),
    ("[fc00::1]:5000/docker", []),
    ("[2001:db8::1]:5000/repo:tag", []),
    ("xn--n3h.com/myimage:xn--n3h.com", []),
    ("b.gcr.io/test.example.com/my-app:test.example.com", []),
    ("dock__er/docker", []),
    ("docker---rules/docker", []),
    ("d/docker", []),
    ("app:Tag_With.Upper-1", []),  # tags may hold uppercase
    # An uppercase first component is taken as a registry host, not a repository path
    # (normalize.go splitDockerDomain; normalize_test.go accepts "Docker/docker").
    ("UPPER/app:1", []),
    case("docker.io/" + HEX64, [], "hex-path-with-domain"),
    case("app:" + "t" * 128, [], "tag-128"),
    # 247 + "library/" = 255: the limit is on the path, after normalization.
    case("a" * 247, [], "path-255-familiar"),
    case("example.com/" + "a" * 255, [], "path-255"),
    ("", ["Required value"]),
    ("team/UPPER:1", ["invalid reference format: repository name (team/UPPER) must be lowercase"]),
    (
        "docker.io/UPPER/app:1",
        ["invalid reference format: repository name (UPPER/app) must be lowercase"],
    ),
    (
        "Uppercase:tag",
        ["invalid reference format: repository name (library/Uppercase) must be lowercase"],
    ),
    ("app:", [BAD_REF]),
    (":justtag", [BAD_REF]),
    ("app:-tag", [BAD_REF]),
    ("app:.tag", [BAD_REF]),
    ("-docker", [BAD_REF]),
    ("docker-/docker", [BAD_REF]),
    ("docker///docker", [BAD_REF]),
    ("dock..er/docker", [BAD_REF]),
    ("docker/", [BAD_REF]),
    ("____/____", [BAD_REF]),
    ("https://github.com/docker/docker", [BAD_REF]),
    ("aa/asdf$$^/aa", [BAD_REF]),
    ("[fe80::1%eth0]:5000/repo", [BAD_REF]),
    ("[2001:db8::1]:5000", [BAD_REF]),
    case("app:" + "t" * 129, [BAD_REF], "tag-129"),
    case("a" * 248, [REPO_TOO_LONG], "path-256-familiar"),
    case("example.com/" + "a" * 256, [REPO_TOO_LONG], "path-256"),
    case(
        HEX64,
        [f"invalid repository name ({HEX64}), cannot specify 64-byte hexadecimal strings"],
        "bare-hex",
    ),
    case("app@sha256:" + "f" * 63, ["invalid checksum digest length"], "digest-short"),
    case("app@sha256:" + "F" * 64, ["invalid checksum digest format"], "digest-uppercase-hex"),
    case("app@md5:" + "f" * 32, ["unsupported digest algorithm"], "digest-md5"),
    case("app@m-d5:" + "f" * 32, ["unsupported digest algorithm"], "digest-unknown-algorithm"),
    # Uppercase in an algorithm is caught by go-digest's own pattern when a tag comes first
    # (without one, the lowercase check on everything before the first ':' catches it).
    case("app:v1@Md5:" + "f" * 32, ["invalid checksum digest format"], "digest-bad-algorithm"),
    case("app@sha256:" + "f" * 31, [BAD_REF], "digest-under-32"),
    # The value is echoed as-is, brackets and all: plain text, nothing escaped for markup.
    ("team/App[1]", ["invalid reference format: repository name (team/App[1]) must be lowercase"]),
    case(" app", ["must not have leading or trailing whitespace", BAD_REF], "leading-space"),
    case("app:1\n", ["must not have leading or trailing whitespace", BAD_REF], "newline"),
]


@pytest.mark.parametrize(("value", "expected"), IMAGE_REFERENCE_CASES)
def test_image_reference(value: str, expected: list[str]) -> None:
    assert k.image_reference(value) == expected


# --- annotations_size: k8s.io/apimachinery@v0.37.2 pkg/api/validation/objectmeta.go
# --- ValidateAnnotationsSize (TotalAnnotationSizeLimitB = 256 KiB, keys plus values) ----------

LIMIT = 256 * 1024


def too_big(total: int) -> list[str]:
    return [
        f"may not be more than {LIMIT} bytes "
        f"(annotations size {total} is larger than limit {LIMIT})"
    ]


ANNOTATIONS_SIZE_CASES: list[object] = [
    pytest.param({}, [], id="none"),
    pytest.param({"a": "x" * (LIMIT - 1)}, [], id="exactly-at-limit"),
    pytest.param({"a": "x" * LIMIT}, too_big(LIMIT + 1), id="one-over"),
    pytest.param({"ab": "x" * (LIMIT // 2 - 4), "cd": "y" * (LIMIT // 2)}, [], id="two-at-limit"),
    pytest.param(
        {"ab": "x" * (LIMIT // 2), "cd": "y" * (LIMIT // 2)}, too_big(LIMIT + 4), id="two-over"
    ),
    # 131073 characters, 262145 bytes: counted in bytes, as Go's len() does.
    pytest.param({"a": "é" * (LIMIT // 2)}, too_big(LIMIT + 1), id="multibyte-over"),
]


@pytest.mark.parametrize(("annotations", "expected"), ANNOTATIONS_SIZE_CASES)
def test_annotations_size(annotations: dict[str, str], expected: list[str]) -> None:
    assert k.annotations_size(annotations) == expected
