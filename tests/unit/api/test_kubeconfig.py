"""kubectl's kubeconfig resolution (api/kubeconfig.py): --kubeconfig, $KUBECONFIG (the first
file with the context), ~/.kube/config, in-cluster; each failure names the file and the fix."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from gpufed.api.kubeconfig import KubeconfigError, resolve_kubeconfig


def kubeconfig_file(path: Path, *contexts: str, current: str | None = None) -> Path:
    """A kubeconfig defining ``contexts`` (namespace ``ns-<name>``), current ``current``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": c, "cluster": {"server": f"https://{c}:6443"}} for c in contexts],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [
            {"name": c, "context": {"cluster": c, "user": "u", "namespace": f"ns-{c}"}}
            for c in contexts
        ],
    }
    if current:
        doc["current-context"] = current
    path.write_text(yaml.safe_dump(doc))
    return path


def test_the_flag_wins_over_the_environment(tmp_path: Path) -> None:
    flag = kubeconfig_file(tmp_path / "flag", "a", current="a")
    env = {"KUBECONFIG": str(kubeconfig_file(tmp_path / "env", "b", current="b"))}
    src = resolve_kubeconfig(flag, None, environ=env, home=tmp_path)
    assert (src.path, src.origin, src.namespace) == (flag, "--kubeconfig", "ns-a")


def test_kubeconfig_is_a_list_and_the_first_file_with_the_context_is_used(tmp_path: Path) -> None:
    one = kubeconfig_file(tmp_path / "one", "a", current="a")
    two = kubeconfig_file(tmp_path / "two", "b", current="b")
    env = {"KUBECONFIG": f"{tmp_path / 'missing'}:{one}:{two}"}
    assert resolve_kubeconfig(None, "b", environ=env, home=tmp_path).path == two
    assert resolve_kubeconfig(None, None, environ=env, home=tmp_path).path == one
    with pytest.raises(KubeconfigError, match="context 'c' is in none of \\$KUBECONFIG"):
        resolve_kubeconfig(None, "c", environ=env, home=tmp_path)


def test_home_config_then_in_cluster(tmp_path: Path) -> None:
    home_cfg = kubeconfig_file(tmp_path / ".kube" / "config", "h", current="h")
    assert resolve_kubeconfig(None, None, environ={}, home=tmp_path).path == home_cfg
    pod = resolve_kubeconfig(
        None, None, environ={"KUBERNETES_SERVICE_HOST": "10.0.0.1"}, home=tmp_path / "empty"
    )
    assert pod.in_cluster
    assert pod.origin == "in-cluster"


@pytest.mark.parametrize(
    ("setup", "context", "match"),
    [
        ("missing-flag", None, "--kubeconfig .*: no such file"),
        ("bad-context", "nope", "context 'nope' is not in .* \\(it has: a\\)"),
        ("no-current", None, "sets no current-context .*--context"),
        ("not-yaml", None, "not YAML at line"),
        ("nothing", None, "no kubeconfig: .*fix: pass --kubeconfig"),
        ("env-all-missing", None, "none of its files exists"),
    ],
)
def test_each_failure_names_the_file_and_the_fix(
    tmp_path: Path, setup: str, context: str | None, match: str
) -> None:
    flag: Path | None = None
    env: dict[str, str] = {}
    if setup == "missing-flag":
        flag = tmp_path / "nope"
    elif setup == "bad-context":
        flag = kubeconfig_file(tmp_path / "k", "a", current="a")
    elif setup == "no-current":
        flag = kubeconfig_file(tmp_path / "k", "a")
    elif setup == "not-yaml":
        flag = tmp_path / "k"
        flag.write_text("contexts: [\n  - a: b\n  c\n")
    elif setup == "env-all-missing":
        env = {"KUBECONFIG": str(tmp_path / "x")}
    with pytest.raises(KubeconfigError, match=match):
        resolve_kubeconfig(flag, context, environ=env, home=tmp_path)
