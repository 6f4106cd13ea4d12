"""The package without a GPU: the library loads, settings are checked, the
command-line check runs. CI runs these."""

import os
import subprocess
import sys

import pytest

import cachalot_torch


def _run(*args, conf=None, **pytorch):
    env = dict(os.environ)
    for var in ("CACHALOT_ALLOC_CONF", "PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF"):
        env.pop(var, None)
    if conf is not None:
        env["CACHALOT_ALLOC_CONF"] = conf
    env.update(pytorch)
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, env=env, timeout=600)


def test_library_is_found():
    assert os.path.exists(cachalot_torch.library_path())


def test_default_policy_is_pytorch():
    out = _run("-c", "import cachalot_torch, json; print(json.dumps(cachalot_torch.config()))")
    assert out.returncode == 0, out.stderr
    assert '"policy": "pytorch"' in out.stdout
    assert '"segments": "driver"' in out.stdout, "nothing intercepts cudaMalloc here"


def test_conf_selects_the_policy():
    out = _run("-c", "import cachalot_torch; print(cachalot_torch.config()['policy'])", conf="policy:cachalot")
    assert out.stdout.strip() == "cachalot", out.stderr


def test_the_segment_route_is_cachalots_setting():
    show = ("-c", "import cachalot_torch; print(cachalot_torch.config()['segments'])")
    assert _run(*show, conf="segments:runtime").stdout.strip() == "runtime"
    out = _run("-m", "cachalot_torch", PYTORCH_CUDA_ALLOC_CONF="segments:runtime")
    assert out.returncode == 1 and "'segments' is cachalot's key" in out.stdout, "refused in PyTorch's variable"
    out = _run("-m", "cachalot_torch")
    assert "segments" in out.stdout and "driver" in out.stdout


def test_pytorchs_settings_are_read_as_pytorch_reads_them():
    show = ("-c", "import cachalot_torch; print(cachalot_torch.config()['conf'])")
    out = _run(*show, PYTORCH_CUDA_ALLOC_CONF="expandable_segments:True")
    assert out.stdout.strip() == "expandable_segments:True", out.stderr
    out = _run(*show, conf="policy:cachalot", PYTORCH_ALLOC_CONF="max_split_size_mb:64",
               PYTORCH_CUDA_ALLOC_CONF="expandable_segments:True")
    assert out.stdout.strip() == "max_split_size_mb:64,policy:cachalot", out.stderr
    out = _run("-m", "cachalot_torch", PYTORCH_CUDA_ALLOC_CONF="max_split_size_mb:2")
    assert out.returncode == 1 and "max_split_size_mb" in out.stdout


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


def test_tags_without_a_gpu_are_checked_and_named():
    from cachalot_torch import sleep

    assert isinstance(sleep.tags(), list)
    with pytest.raises(cachalot_torch.CachalotError, match="no_such_tag"):
        sleep.pause("no_such_tag")
    with pytest.raises(cachalot_torch.CachalotError, match="non-empty"):
        sleep.resume("")
    with pytest.raises(cachalot_torch.CachalotError, match="backup must be None or 'host'"):
        sleep._backup_code("disk")
    assert cachalot_torch.pause is sleep.pause and cachalot_torch.region is sleep.region
