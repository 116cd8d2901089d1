"""Hook server registration files from a hostile or broken writer: one ConfigError each, never a traceback."""

from __future__ import annotations

from pathlib import Path

import pytest

from runtimeproxy.hookconfig import MAX_REGISTRATION_BYTES, ConfigError, Registry, parse_registration

GOOD = ('{"remote-endpoint": "/run/koordlet/koordlet.sock", "failure-policy": "Ignore", '
        '"runtime-hooks": ["PreRunPodSandbox"]}')


@pytest.mark.parametrize("text,match", [
    ("[" * 100000 + "]" * 100000, "not valid JSON|larger than"),
    ("[" * 5000 + "]" * 5000, "nested too deep"),
    ('{"remote-endpoint": ' + "9" * 5000 + "}", "not valid JSON"),
    (" " * (MAX_REGISTRATION_BYTES + 1), "larger than"),
    ("\x00\x01", "not valid JSON"),
])
def test_bad_registration_is_one_config_error(text: str, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        parse_registration("bad.json", text)


def test_a_bad_file_beside_a_good_one_is_reported_and_the_good_one_kept(tmp_path: Path) -> None:
    (tmp_path / "a-good.json").write_text(GOOD)
    (tmp_path / "b-deep.json").write_text("[" * 5000 + "]" * 5000)
    (tmp_path / "c-huge.json").write_text(" " * (4 << 20))
    (tmp_path / "d-binary.json").write_bytes(bytes(range(256)))
    reported: list[str] = []
    config = Registry(str(tmp_path), on_error=lambda name, reason: reported.append(name))
    config.scan()
    assert [server.name for server in config.servers] == ["a-good.json"]
    assert sorted(reported) == ["b-deep.json", "c-huge.json", "d-binary.json"]


def test_a_hook_type_this_proxy_does_not_know_is_left_out_as_koordinator_does(
        caplog: pytest.LogCaptureFixture) -> None:
    """A newer hook server may list a hook added after this proxy: its file still works for the hooks it knows."""
    server = parse_registration("newer.json", '{"remote-endpoint": "/run/k.sock", "runtime-hooks": '
                                              '["PreRunPodSandbox", "PostCreateSomethingNew"]}')
    assert {h.value for h in server.hooks} == {"PreRunPodSandbox"}
    assert "PostCreateSomethingNew" in caplog.text
    with pytest.raises(ConfigError, match="no known runtime hook"):
        parse_registration("none.json", '{"remote-endpoint": "/run/k.sock", "runtime-hooks": ["Nope"]}')


def test_the_pod_level_resize_hook_is_a_hook_type() -> None:
    server = parse_registration("k.json", '{"remote-endpoint": "/run/k.sock", "runtime-hooks": '
                                          '["PreUpdatePodSandboxResources"]}')
    (hook,) = server.hooks
    assert hook.rpc_path == "/runtime.v1alpha1.RuntimeHookService/PreUpdatePodSandboxResourcesHook"
