"""`--version` as upstream's kube-proxy prints it, naming the release kubeproxy follows."""

from __future__ import annotations

import io
import re

import pytest

from kubeproxy import __version__
from kubeproxy.proxy import flags
from kubeproxy.proxy.kube_proxy import main
from kubeproxy.runtime.version import KUBERNETES_VERSION, VersionInfo


def run(*args: str) -> tuple[int, str]:
    out = io.StringIO()
    return main(list(args), stdout=out), out.getvalue()


@pytest.mark.parametrize("flag", ["--version", "--version=true", "--version=1", "--version=T"])
def test_version_line_starts_as_upstreams(flag: str) -> None:
    code, text = run(flag)
    assert code == 0
    assert text == f"Kubernetes {KUBERNETES_VERSION} (kubeproxy {__version__})\n"
    assert re.fullmatch(r"v1\.37\.\d+", KUBERNETES_VERSION)


def test_version_raw_is_gos_print_of_version_info() -> None:
    code, text = run("--version=raw")
    assert code == 0
    assert text.startswith('version.Info{Major:"1", Minor:"37", EmulationMajor:"", ')
    # Upstream's fields, in upstream's order (k8s.io/apimachinery/pkg/version.Info).
    names = re.findall(r"(\w+):\"", text)
    assert names == [
        "Major", "Minor", "EmulationMajor", "EmulationMinor", "MinCompatibilityMajor", "MinCompatibilityMinor",
        "GitVersion", "GitCommit", "GitTreeState", "BuildDate", "GoVersion", "Compiler", "Platform",
    ]
    assert f'GitVersion:"{KUBERNETES_VERSION}"' in text and text.endswith("}\n")


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("v1.36.1", f'version "v1.36.1" must match major/minor/patch of default version "{KUBERNETES_VERSION}"'),
        ("bogus", 'strconv.ParseBool: parsing "bogus": invalid syntax'),
    ],
)
def test_version_values_upstream_refuses(value: str, message: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, _ = run(f"--version={value}")
    assert code == 1
    assert f'Error: invalid argument "{value}" for "--version" flag: {message}' in capsys.readouterr().err


def test_a_matching_version_sets_the_reported_version_and_runs_on() -> None:
    parsed = flags.parse([f"--version={KUBERNETES_VERSION}-custom.1"])
    assert parsed.values["version"] == f"{KUBERNETES_VERSION}-custom.1"
    assert not flags.resolve(parsed).version  # not printed: the proxy carries on


def test_help_shows_upstreams_defaults() -> None:
    text = " ".join(flags.usage().split())
    for name, default in flags.HELP_DEFAULTS.items():
        assert re.search(rf"--{name} \S+ .*?\(default {re.escape(default)}\)", text), name
    assert "--version version[=true]" in text
    assert VersionInfo().major == "1"
