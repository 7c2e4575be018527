"""SGLang command lines for the fp8/bf16 x 512/1024 matrix, checked against 0.5.23's flags."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import zipfile

import pytest

from niah.errors import BadInput
from niah.serving.sglang import SGLangLaunch, build_sglang_command, format_command
from niah.serving.sglang.__main__ import split_niah_args
from sglang_source import sglang_wheel

PY = "/usr/bin/python3"


def _cfg(dtype, k, **kw):
    return SGLangLaunch(model_path="deepseek-ai/DeepSeek-V3.2-Exp", tp=8, port=31234,
                        index_dtype=dtype, index_topk=k, python=PY, **kw)


SGLANG_ARGS = ["--model-path", "deepseek-ai/DeepSeek-V3.2-Exp", "--tp-size", "8", "--host", "127.0.0.1",
               "--port", "31234"]


@pytest.mark.parametrize("k", [512, 1024])
def test_stock_is_plain_sglang_with_only_the_users_flags_and_env(k):
    user_env = {"CUDA_VISIBLE_DEVICES": "0,1"}
    argv, env = build_sglang_command(_cfg("fp8", k, extra_args=["--mem-fraction-static", "0.85"], env=user_env),
                                     environ={"HOME": "/h", "NIAH_INDEX_DTYPE": "bf16", "NIAH_CACHE": "/c"})
    assert argv == [PY, "-m", "sglang.launch_server", *SGLANG_ARGS,
                    "--json-model-override-args", json.dumps({"index_topk": k}), "--mem-fraction-static", "0.85"]
    # the user's env, and every NIAH_* variable of niah's environment removed (None): the plugin cannot run
    assert env == {"NIAH_CACHE": None, "NIAH_INDEX_DTYPE": None, **user_env}
    assert format_command(argv, env).startswith(
        f"env -u NIAH_CACHE -u NIAH_INDEX_DTYPE CUDA_VISIBLE_DEVICES=0,1 {PY} -m sglang.launch_server ")
    plain_argv, plain_env = build_sglang_command(_cfg("fp8", k), environ={"HOME": "/h"})
    assert plain_env == {} and format_command(plain_argv, plain_env).startswith(
        f"{PY} -m sglang.launch_server --model-path")


@pytest.mark.parametrize("dtype, kernels", [("bf16", "niah"), ("fp8", "niah")])
@pytest.mark.parametrize("k", [512, 1024, None])
def test_niah_arms_are_the_stock_command_plus_only_niahs_switches(dtype, kernels, k):
    extra, user_env = ["--trust-remote-code"], {"CUDA_VISIBLE_DEVICES": "0,1"}
    stock_argv, stock_env = build_sglang_command(_cfg("fp8", k, extra_args=extra, env=user_env), environ={})
    argv, env = build_sglang_command(_cfg(dtype, k, kernels=kernels, extra_args=extra, env=user_env),
                                     environ={"NIAH_INDEX_DTYPE": "fp8"})
    assert argv[:3] == [PY, "-m", "niah.serving.sglang"]
    assert argv[3:7] == ["--niah-index-dtype", dtype, "--niah-kernels", kernels]
    assert argv[7:] == stock_argv[3:]  # the very same SGLang arguments
    assert env == {**stock_env, "NIAH_INDEX_DTYPE": dtype, "NIAH_KERNELS": kernels}
    assert not any(a.startswith("--") and a[2:] in ("dsa-topk-backend", "disable-prefill-cuda-graph") for a in argv)
    assert not any(v.startswith("SGLANG_") for v in env)


def test_extra_args_and_env_are_appended_and_override():
    argv, env = build_sglang_command(_cfg("bf16", 1024, extra_args=["--mem-fraction-static", "0.85"],
                                          env={"SGLANG_DSA_FUSE_TOPK": "0", "CUDA_VISIBLE_DEVICES": "0,1"}))
    assert argv[-2:] == ["--mem-fraction-static", "0.85"]
    assert env["SGLANG_DSA_FUSE_TOPK"] == "0" and env["CUDA_VISIBLE_DEVICES"] == "0,1"


def test_model_default_topk_adds_no_override():
    argv, env = build_sglang_command(_cfg("fp8", None), environ={})
    assert "--json-model-override-args" not in argv and env == {}


@pytest.mark.parametrize("bad, field", [
    (dict(index_dtype="fp16"), "index_dtype"), (dict(index_topk=4096), "index_topk"),
    (dict(index_topk=0), "index_topk"), (dict(tp=0), "tp"), (dict(port=70000), "port"),
    (dict(model_path=""), "model_path"),
    (dict(extra_args=["--json-model-override-args", "{}"]), "--json-model-override-args"),
    (dict(index_dtype="bf16", kernels="stock"), "bf16 index keys run on niah's kernels"),
    (dict(kernels="deepgemm"), "kernels"),
    (dict(env={"NIAH_INDEX_DTYPE": "bf16"}), "env may not set NIAH_INDEX_DTYPE"),
    (dict(env={"NIAH_KERNELS": "niah"}, kernels="niah"), "env may not set NIAH_KERNELS"),
])
def test_bad_configuration_is_one_clear_error(bad, field):
    kw = dict(model_path="m", index_dtype="fp8", index_topk=512) | bad
    with pytest.raises(BadInput, match=field):
        build_sglang_command(SGLangLaunch(**kw))


def _sglang_fields(wheel) -> dict[str, ast.AnnAssign]:
    out = {}
    with zipfile.ZipFile(wheel) as z:
        for name in z.namelist():
            if name.startswith("sglang/srt/arg_groups/fields/") and name.endswith(".py"):
                for node in ast.walk(ast.parse(z.read(name))):
                    if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                        out[node.target.id] = node
    return out


def test_every_flag_and_env_var_exists_in_sglang_0_5_23():
    wheel = sglang_wheel()
    fields = _sglang_fields(wheel)
    with zipfile.ZipFile(wheel) as z:
        environ = z.read("sglang/srt/environ.py").decode()
    for dtype, kernels in (("fp8", "stock"), ("fp8", "niah"), ("bf16", "niah")):
        argv, env = build_sglang_command(_cfg(dtype, 512, kernels=kernels), environ={})
        flags = [a for a in argv[3:] if a.startswith("--") and not a.startswith("--niah-")]
        assert flags == ["--model-path", "--tp-size", "--host", "--port", "--json-model-override-args"]
        for flag in flags:
            assert flag[2:].replace("-", "_") in fields, f"{flag} is not an SGLang 0.5.23 server argument"
        assert not [v for v in env if v.startswith("SGLANG_")]
    assert "sglang/launch_server.py" in zipfile.ZipFile(wheel).namelist()  # the stock entry exists
    assert "    SGLANG_DISABLE_DSA_INDEXER_FUSION = EnvBool(False)" in environ  # fusion on by default
    assert "    SGLANG_DSA_FUSE_TOPK = EnvBool(True)" in environ  # SGLang's fused top-k by default


def test_split_niah_args():
    assert split_niah_args(["--niah-index-dtype", "bf16", "--port", "1"]) == ("bf16", None, ["--port", "1"])
    assert split_niah_args(["--port", "1", "--niah-index-dtype=fp8", "--niah-kernels", "niah"]) == (
        "fp8", "niah", ["--port", "1"])
    with pytest.raises(BadInput):
        split_niah_args(["--niah-index-dtype"])


def _run(args, **env):
    return subprocess.run([sys.executable, "-m", "niah.serving.sglang", *args], capture_output=True,
                          text=True, env=os.environ | env, timeout=60)


def test_launch_entry_refuses_without_sglang_in_one_line():
    r = _run(["--niah-index-dtype", "bf16", "--model-path", "x"])
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("niah: error: SGLang is not installed"), r.stderr


def test_launch_entry_rejects_unknown_dtype():
    r = _run(["--niah-index-dtype", "fp16"])
    assert r.returncode == 2 and "fp16" in r.stderr


def test_importing_the_plugin_package_imports_neither_sglang_nor_torch():
    code = ("import sys, niah.serving.sglang, niah.serving.sglang.contract, niah.serving.sglang.plugin;"
            "print('torch' in sys.modules, 'sglang' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]


def test_launch_entry_refuses_a_bad_arm_before_parsing():
    r = _run(["--niah-index-dtype", "bf16", "--niah-kernels", "stock", "--model-path", "x"])
    assert r.returncode == 2
    assert r.stderr.strip() == "niah: error: bf16 index keys run on niah's kernels only (kernels = \"niah\")"


def test_a_failure_while_patching_is_refused_naming_the_symbol():
    """apply_all turns any exception (here: the real import of an SGLang module that is
    not installed) into one PluginRefused line naming the symbol."""
    from niah.serving.sglang.plugin import PluginRefused, apply_all, patches_for

    patch = next(p for p in patches_for("bf16", "niah") if p.target.endswith("IndexKeyCache.move"))
    with pytest.raises(PluginRefused) as e:
        apply_all([patch])
    msg = str(e.value)
    assert msg.startswith("patching sglang.srt.mem_cache.index_key_cache.IndexKeyCache.move failed: "
                          "ModuleNotFoundError") and "\n" not in msg


def test_plugin_entry_point_exits_on_any_failure_in_one_line():
    """SGLang's loader swallows plugin exceptions; the entry point must not let any through."""
    code = ("import niah.serving.sglang.plugin as p\n"
            "def boom(*a):\n    raise RuntimeError('half-patched sglang.srt.x.y')\n"
            "p.install = boom\np.sglang_plugin()\nprint('served anyway')\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                       env=os.environ | {"NIAH_INDEX_DTYPE": "bf16"})
    assert r.returncode == 2 and "served anyway" not in r.stdout
    assert r.stderr.strip() == "niah: error: RuntimeError: half-patched sglang.srt.x.y"


def test_the_launcher_removes_niahs_variables_from_the_stock_servers_environment(tmp_path, monkeypatch):
    """The stock arm's env (None = removed) through serving/launch.py to a real process: no
    NIAH_* variable of niah's own environment reaches it; a niah arm gets exactly its two."""
    from niah.serving.launch import ServerProcess
    from lifecycle_helpers import tiny_command

    monkeypatch.setenv("NIAH_INDEX_DTYPE", "bf16")
    monkeypatch.setenv("NIAH_KERNELS", "niah")
    monkeypatch.setenv("NIAH_CACHE", str(tmp_path))
    seen = {}
    for dtype in ("fp8", "bf16"):
        _, env = build_sglang_command(_cfg(dtype, 512))
        argv = tiny_command("--print-env", "NIAH_")
        srv = ServerProcess(f"{dtype}-arm", lambda port: ([a.replace("{port}", str(port)) for a in argv], env),
                            log_path=tmp_path / f"{dtype}.log")
        with srv:
            pass
        seen[dtype] = [ln for ln in srv.log_path.read_text().splitlines() if ln.startswith("env ")]
    assert seen["fp8"] == ["env printed"]
    assert {f"env NIAH_CACHE={tmp_path}", "env NIAH_INDEX_DTYPE=bf16", "env NIAH_KERNELS=niah"} <= set(seen["bf16"])
