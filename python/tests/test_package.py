"""The package without a GPU: the library loads, settings are checked, the
command-line check runs. CI runs these."""

import os
import subprocess
import sys

import pytest

import cachalot_torch


def _run(*args, conf=None):
    env = dict(os.environ)
    env.pop("CACHALOT_ALLOC_CONF", None)
    if conf is not None:
        env["CACHALOT_ALLOC_CONF"] = conf
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, env=env, timeout=600)


def test_library_is_found():
    assert os.path.exists(cachalot_torch.library_path())


def test_default_policy_is_pytorch():
    out = _run("-c", "import cachalot_torch, json; print(json.dumps(cachalot_torch.config()))")
    assert out.returncode == 0, out.stderr
    assert '"policy": "pytorch"' in out.stdout


def test_conf_selects_the_policy():
    out = _run("-c", "import cachalot_torch; print(cachalot_torch.config()['policy'])", conf="policy:cachalot")
    assert out.stdout.strip() == "cachalot", out.stderr


def test_a_bad_conf_is_refused_with_the_reason():
    out = _run("-m", "cachalot_torch", conf="no_such_key:1")
    assert out.returncode == 1
    assert "no_such_key" in out.stdout


def test_the_check_command_reports_what_is_installed():
    out = _run("-m", "cachalot_torch")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "cachalot_torch" in out.stdout and "policy" in out.stdout


def test_a_missing_library_is_a_clear_error(monkeypatch, tmp_path):
    monkeypatch.setattr(cachalot_torch, "__file__", str(tmp_path / "cachalot_torch" / "__init__.py"))
    monkeypatch.delenv("CACHALOT_TORCH_LIB", raising=False)
    with pytest.raises(cachalot_torch.CachalotError, match="not installed"):
        cachalot_torch.library_path()
