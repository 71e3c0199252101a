"""The workspace Pod's seccomp profile: RuntimeDefault unless the chart names the Localhost
profile that lets an actor's commands build their jail (docs/security.md, "Commands in a
workspace Pod"); the pool Pods carry the same, and a pool of one profile never serves the
other; the profile the chart ships is RuntimeDefault plus exactly what bubblewrap needs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from sandbox_operator.executors.pod_manifests import build_workspace_pod
from sandbox_operator.executors.warm_pool import build_pool_pod, shape_of
from sandbox_operator.settings import Settings, SettingsError

from tests.support.targets import pod_target

PROFILE = "sandbox-operator/sandbox-workspace.json"
CHART_PROFILE = (
    Path(__file__).resolve().parents[3]
    / "charts/sandbox-operator/files/seccomp/sandbox-workspace.json"
)


def test_runtime_default_unless_a_localhost_profile_is_set() -> None:
    pod = build_workspace_pod(pod_target(), Settings(), None)
    assert pod["spec"]["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    settings = Settings(workspace_seccomp_profile=PROFILE)
    for spec in (
        build_workspace_pod(pod_target(), settings, None)["spec"],
        build_pool_pod("ns", settings, bootstrap="sbx-pool-x-boot")["spec"],
    ):
        assert spec["securityContext"]["seccompProfile"] == {
            "type": "Localhost",
            "localhostProfile": PROFILE,
        }
        # Set for the Pod only: no container overrides it.
        assert all("seccompProfile" not in c["securityContext"] for c in spec["containers"])


def test_a_pool_of_one_profile_never_serves_the_other() -> None:
    assert shape_of(Settings()) != shape_of(Settings(workspace_seccomp_profile=PROFILE))
    assert shape_of(Settings(workspace_seccomp_profile=PROFILE)) == shape_of(
        Settings(workspace_seccomp_profile=PROFILE)
    )


@pytest.mark.parametrize("bad", ["/var/lib/kubelet/seccomp/x.json", "../x.json", "a/../b", "a//b"])
def test_the_profile_is_a_plain_path_below_the_kubelets_seccomp_directory(bad: str) -> None:
    env = {"SANDBOX_OPERATOR_WORKSPACE_SECCOMP_PROFILE": bad}
    with pytest.raises(SettingsError, match="SANDBOX_OPERATOR_WORKSPACE_SECCOMP_PROFILE"):
        Settings.from_env(env)
    assert Settings.from_env({}).workspace_seccomp_profile == ""


def test_the_charts_profile_is_runtime_default_plus_what_bubblewrap_needs() -> None:
    profile = json.loads(CHART_PROFILE.read_text())
    assert profile["defaultAction"] == "SCMP_ACT_ERRNO"
    rules = profile["syscalls"]
    plain = {n for rule in rules if rule["action"] == "SCMP_ACT_ALLOW" and not rule.get("args")
             for n in rule["names"]}  # fmt: skip
    added = {"clone", "unshare", "mount", "umount2", "pivot_root", "sethostname"}
    assert added <= plain
    # clone3 stays ENOSYS (its flags cannot be filtered), as in RuntimeDefault.
    assert {"names": ["clone3"], "action": "SCMP_ACT_ERRNO", "errnoRet": 38} in rules
    # What neither RuntimeDefault nor the jail needs stays refused.
    never = {
        "setns", "chroot", "bpf", "keyctl", "add_key", "request_key", "init_module",
        "finit_module", "delete_module", "kexec_load", "reboot", "swapon", "open_by_handle_at",
        "name_to_handle_at", "fsopen", "fsmount", "move_mount", "open_tree", "mount_setattr",
        "umount", "setdomainname", "acct", "settimeofday", "clock_settime", "quotactl",
        "userfaultfd", "perf_event_open", "lookup_dcookie", "process_vm_writev",
    }  # fmt: skip
    assert not never & {n for rule in rules for n in rule["names"]}
