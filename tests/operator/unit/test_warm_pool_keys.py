"""The warm pool's keys, bootstrap tokens and Pods (pure functions) and its settings: a pool of a
source claim is another pool than the shape's, a bootstrap token is derived per namespace,
shape and key (never a Sandbox's token) and named for its key, a pool Pod mounts its pool's
bootstrap Secret and, for a claim, that claim as the agent's only allowed root.
"""

from __future__ import annotations

import re

import pytest
from sandbox_operator.executors.agent_client import derive_token
from sandbox_operator.executors.warm_pool import (
    POOL_LABEL,
    bootstrap_secret,
    bootstrap_token,
    build_pool_pod,
    shape_of,
)
from sandbox_operator.settings import Settings, SettingsError

from sandbox_core.agent import wire

SETTINGS = Settings(workspace_image="example.test/workspace:1")
SHAPE = {"resources": {"requests": {"cpu": "10m"}}, "nodeSelector": {"pool": "a"}}
KEY = b"k" * 64


def test_a_source_claim_makes_another_pool_and_field_order_does_not() -> None:
    plain = shape_of(SETTINGS, SHAPE)
    assert shape_of(SETTINGS, dict(reversed(list(SHAPE.items())))) == plain
    assert shape_of(SETTINGS, {**SHAPE, "egress": [{"cidr": "10.0.0.0/8"}]}) == plain
    over = shape_of(SETTINGS, SHAPE, "shared-repo")
    assert over != plain and over == shape_of(SETTINGS, SHAPE, "shared-repo")
    assert shape_of(SETTINGS, SHAPE, "other-repo") not in (plain, over)
    assert re.fullmatch(r"[0-9a-f]{16}", over)


def test_bootstrap_tokens_differ_per_namespace_shape_and_key() -> None:
    token = bootstrap_token(KEY, "team-a", "0123456789abcdef")
    others = {
        bootstrap_token(KEY, "team-b", "0123456789abcdef"),
        bootstrap_token(KEY, "team-a", "fedcba9876543210"),
        bootstrap_token(b"j" * 64, "team-a", "0123456789abcdef"),
    }
    assert token not in others and len(others) == 3
    # Never the token of a Sandbox whose uid were the same text (a key of its own).
    for text in ("team-a|0123456789abcdef", "warm-pool|team-a|0123456789abcdef"):
        assert token != derive_token(KEY, text)
    secret = bootstrap_secret(KEY, "team-a", "0123456789abcdef")
    name = secret["metadata"]["name"]
    assert re.fullmatch(r"sbx-pool-0123456789abcdef-[0-9a-f]{8}-boot", name)
    assert secret["stringData"] == {"token": token}
    assert secret["metadata"]["labels"][POOL_LABEL] == "0123456789abcdef"
    assert "ownerReferences" not in secret["metadata"]
    rotated = bootstrap_secret(b"j" * 64, "team-a", "0123456789abcdef")
    assert rotated["metadata"]["name"] != name  # a rotated key: a new Secret, never an update


def test_a_pool_pod_mounts_its_bootstrap_secret_and_its_claim_only() -> None:
    pod = build_pool_pod("team-a", SETTINGS, SHAPE, bootstrap="sbx-pool-x-boot", claim="repo")
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    assert volumes["source"]["persistentVolumeClaim"] == {"claimName": "repo"}
    assert volumes["bootstrap"]["secret"]["secretName"] == "sbx-pool-x-boot"
    assert volumes["scratch"] == {"name": "scratch", "emptyDir": {}}
    container = pod["spec"]["containers"][0]
    env = {e["name"]: e["value"] for e in container["env"]}
    assert env[wire.ALLOWED_ROOTS_ENV] == "/workspace/source"
    assert env[wire.BOOTSTRAP_TOKEN_FILE_ENV] == wire.BOOTSTRAP_TOKEN_FILE
    assert wire.TOKEN_FILE_ENV not in env
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    assert mounts["bootstrap"] == {
        "name": "bootstrap",
        "mountPath": "/var/run/sandbox-pool",
        "readOnly": True,
    }
    assert pod["metadata"]["labels"][POOL_LABEL] == shape_of(SETTINGS, SHAPE, "repo")
    bare = build_pool_pod("team-a", SETTINGS, SHAPE, bootstrap="sbx-pool-x-boot")
    assert "source" not in {v["name"] for v in bare["spec"]["volumes"]}
    bare_env = {e["name"]: e["value"] for e in bare["spec"]["containers"][0]["env"]}
    assert bare_env[wire.ALLOWED_ROOTS_ENV] == ""


def test_the_pool_settings() -> None:
    off = Settings.from_env({"SANDBOX_OPERATOR_NAMESPACE": "a,b"})
    assert off.warm_pool_size == 0 and off.pool_namespaces == ()
    watched = Settings.from_env(
        {"SANDBOX_OPERATOR_NAMESPACE": "a, b", "SANDBOX_OPERATOR_WARM_POOL_SIZE": "2"}
    )
    assert watched.pool_namespaces == ("a", "b")
    chosen = Settings.from_env(
        {
            "SANDBOX_OPERATOR_NAMESPACE": "a,b",
            "SANDBOX_OPERATOR_WARM_POOL_SIZE": "2",
            "SANDBOX_OPERATOR_WARM_POOL_NAMESPACES": "c",
            "SANDBOX_OPERATOR_WARM_POOL_SOURCE_CLAIMS": "repo-1, repo-2",
        }
    )
    assert chosen.pool_namespaces == ("c",)
    assert chosen.warm_pool_source_claims == ("repo-1", "repo-2")
    every = Settings.from_env({"SANDBOX_OPERATOR_WARM_POOL_SIZE": "2"})
    assert every.pool_namespaces == ()  # all namespaces watched and none named: no pool
    with pytest.raises(SettingsError, match="SANDBOX_OPERATOR_WARM_POOL_SIZE must be >= 0"):
        Settings.from_env({"SANDBOX_OPERATOR_WARM_POOL_SIZE": "-1"})
