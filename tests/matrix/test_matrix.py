"""The matrix file: expansion as documented, errors that name the line, the dry run."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from niah.errors import BadInput
from niah.serving.matrix import load_matrix, matrix_commands, parse_matrix, server_command

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "serving" / "examples"


def error_of(text: str) -> str:
    with pytest.raises(BadInput) as e:
        parse_matrix(text, "m.toml")
    return str(e.value)


# -- expansion ---------------------------------------------------------------------------------
def test_axes_cross_in_file_order_with_explicit_configs_in_place():
    m = parse_matrix(
        'engine = "embedded"\n'
        'attention = "dsa"\n'
        "window = 32\n"
        "[[config]]\n"
        'name = "dense"\n'
        'attention = "dense"\n'
        "[axes]\n"
        'index_dtype = ["fp8", "bf16"]\n'
        "index_topk = [512, 1024]\n"
    )
    assert m.names() == ["dense", "fp8-k512", "fp8-k1024", "bf16-k512", "bf16-k1024"]
    by = {c.name: c for c in m.configs}
    assert by["bf16-k1024"].settings == {"attention": "dsa", "window": 32, "index_dtype": "bf16", "index_topk": 1024}
    assert by["bf16-k1024"].axes == {"index_dtype": "bf16", "index_topk": 1024}
    assert by["dense"].settings == {"attention": "dense", "window": 32}
    assert by["dense"].axes == {"attention": "dense"}
    assert all(c.engine == "embedded" and c.launched for c in m.configs)


def test_axis_names_for_every_axis_key():
    m = parse_matrix('engine = "embedded"\n[axes]\nattention = ["dsa"]\nwindow = [0, 64]\n')
    assert m.names() == ["dsa-w0", "dsa-w64"]
    m = parse_matrix('engine = "sglang"\nmodel_path = "m"\n[axes]\ntp = [4, 8]\n')
    assert m.names() == ["tp4", "tp8"]


def test_explicit_config_with_another_engine_keeps_only_its_keys():
    m = parse_matrix(
        'engine = "sglang"\nmodel_path = "deepseek-ai/DeepSeek-V3.2"\ntp = 8\nindex_topk = 2048\n'
        "[[config]]\n"
        'name = "router"\nengine = "external"\nendpoint = "http://10.0.0.5:30000"\n'
    )
    (c,) = m.configs
    assert (c.engine, c.launched) == ("external", False)
    # model_path / tp are not keys of an external engine; index_topk carries over as a label
    assert c.settings == {"endpoint": "http://10.0.0.5:30000", "index_topk": 2048}


def test_examples_expand_as_their_comments_say():
    emb = load_matrix(EXAMPLES / "embedded.toml")
    assert emb.names() == ["dense", "fp8-k128", "fp8-k512", "bf16-k128", "bf16-k512"]
    sg = load_matrix(EXAMPLES / "sglang.toml")
    assert sg.names() == SGLANG_ARMS
    assert {c.settings["model_path"] for c in sg.configs} == {"deepseek-ai/DeepSeek-V3.2"}
    demo = load_matrix(EXAMPLES / "demo.toml")
    assert demo.names()[0] == "dense" and demo.names()[-1] == "fp8-hadamard-k64"
    assert {(c.axes.get("index_dtype"), c.axes.get("index_topk")) for c in demo.configs[1:-1]} == {
        (d, k) for d in ("fp8", "bf16") for k in (64, 512)
    }
    assert {c.name: c.settings["index_rotation"] for c in demo.configs[1:]} == {
        **{f"{d}-k{k}": "none" for d in ("fp8", "bf16") for k in (64, 512)}, "fp8-hadamard-k64": "hadamard"}


# -- errors name the line ----------------------------------------------------------------------
@pytest.mark.parametrize(
    "text, expected",
    [
        ('engine = "vllm"\n[axes]\nindex_topk = [1]\n', "m.toml:1: unknown engine 'vllm'"),
        ('engine = "embedded"\n\n[[config]]\nname = "x"\nengine = "vllm"\n', "m.toml:5: unknown engine 'vllm'"),
        # the bad value sits on its own line of a multi-line array
        ('engine = "embedded"\n[axes]\nindex_dtype = [\n  "fp8",\n  "int4",\n]\n',
         "m.toml:5: axis 'index_dtype': must be one of 'fp8', 'fp4', 'bf16', 'fp32', 'fp8+bf16', 'fp4+bf16', "
         "not 'int4'"),
        ('engine = "embedded"\n[axes]\nindex_topk = [512, 0]\n',
         "m.toml:3: axis 'index_topk': must be an integer >= 1"),
        ('engine = "sglang"\nmodel_path = "m"\n[axes]\nindex_topk = [512, 4096]\n',
         "m.toml:4: axis 'index_topk': must be an integer between 1 and 2048, not 4096"),
        ('engine = "embedded"\n[axes]\ncolour = [1, 2]\n', "m.toml:3: unknown axis 'colour'"),
        ('engine = "embedded"\nattention = "dsa"\n[[config]]\nname = "a"\nmodel_path = "x"\n',
         "m.toml:5: unknown key 'model_path' for engine 'embedded' (it is a key of engine 'sglang')"),
        ('engine = "embedded"\ntopk = 5\n[[config]]\nname = "a"\n',
         "m.toml:2: unknown key 'topk' for engine 'embedded'"),
        ('engine = "sglang"\ntp = 8\n\n[axes]\nindex_topk = [512]\n', "m.toml:4: engine 'sglang' needs `model_path`"),
        ('engine = "embedded"\n[[config]]\nname = "a"\n[[config]]\nname = "b"\nengine = "sglang"\n',
         "m.toml:4: engine 'sglang' needs `model_path`"),
        ('engine = "external"\n[[config]]\nname = "a"\n', "m.toml:2: engine 'external' needs `endpoint`"),
        ('engine = "embedded"\n[axes]\nindex_topk = [512]\n[[config]]\nname = "k512"\n',
         "m.toml:4: configuration name 'k512' is used twice"),
        ('engine = "embedded"\n[[config]]\nname = "a b"\n', "m.toml:3: config name 'a b'"),
        ('engine = "embedded"\n[[config]]\nattention = "dense"\n', "m.toml:2: [[config]] needs a `name`"),
        ('engine = "embedded"\n[[config]]\nname = "a"\n[config.env]\n"A B" = "1"\n',
         "m.toml:4: env has an invalid variable name 'A B'"),
        ('engine = "embedded"\nargs = ["--port", "80"]\n[[config]]\nname = "a"\n',
         "m.toml:2: args may not set --port"),
        ('engine = "sglang"\nmodel_path = "m"\n[[config]]\nname = "a"\nargs = ["--json-model-override-args={}"]\n',
         "m.toml:5: args may not set --json-model-override-args (use index_topk)"),
        ('engine = "command"\n[[config]]\nname = "a"\ncommand = ["srv", "--port", "8000"]\n',
         "m.toml:4: command must contain {port}"),
        ('[axes]\nindex_topk = [1]\n', "m.toml:1: no engine given"),
        ('# nothing here\n', "m.toml:1: no configurations"),
        # TOML syntax errors: tomllib's line
        ('engine = "embedded"\n[axes]\nindex_topk = [512 1024]\n', "m.toml:3: TOML syntax error"),
        ('engine = "embedded"\nattention dsa\n', "m.toml:2: TOML syntax error"),
    ],
)
def test_bad_files_name_the_line(text, expected):
    assert expected in error_of(text)


def test_missing_file_is_bad_input(tmp_path):
    with pytest.raises(BadInput, match="no matrix file"):
        load_matrix(tmp_path / "nope.toml")


# -- commands ----------------------------------------------------------------------------------
def test_embedded_command_carries_every_setting():
    m = parse_matrix('engine = "embedded"\nwindow = 16\nargs = ["--threads", "2"]\n'
                     'env = { OMP_NUM_THREADS = 2 }\n[axes]\nindex_dtype = ["bf16"]\nindex_topk = [96]\n')
    argv, env = server_command(m.configs[0], 41234)
    assert argv[:4] == [sys.executable, "-m", "niah", "serve"]
    args = argv[4:]
    pairs = dict(zip(args[::2], args[1::2]))
    assert pairs == {"--index-dtype": "bf16", "--index-topk": "96", "--window": "16",
                     "--host": "127.0.0.1", "--port": "41234", "--threads": "2"}
    assert env == {"OMP_NUM_THREADS": "2"}


def test_embedded_command_carries_the_serving_paths():
    m = parse_matrix('engine = "embedded"\npage_size = 16\nprefill_chunk = 64\nprefix_cache = true\n'
                     'index_compress = 4\n[axes]\nindex_topk = [64]\n')
    args = server_command(m.configs[0], 41234)[0][4:]
    assert args[args.index("--page-size") + 1] == "16" and args[args.index("--prefill-chunk") + 1] == "64"
    assert args[args.index("--index-compress") + 1] == "4" and "--prefix-cache" in args
    off = parse_matrix('engine = "embedded"\nprefix_cache = false\n[axes]\nindex_topk = [64]\n')
    assert "--prefix-cache" not in server_command(off.configs[0], 1)[0]
    with pytest.raises(BadInput, match="use prefix_cache"):
        parse_matrix('engine = "embedded"\nargs = ["--prefix-cache"]\n[axes]\nindex_topk = [64]\n')


def test_command_engine_fills_placeholders():
    m = parse_matrix('engine = "command"\ncommand = ["srv", "--port={port}", "--k", "{index_topk}"]\n'
                     '[axes]\nindex_topk = [7, 9]\n')
    assert [server_command(c, 5000)[0] for c in m.configs] == [
        ["srv", "--port=5000", "--k", "7"], ["srv", "--port=5000", "--k", "9"]]


SGLANG_ARMS = ["fp8-k512", "fp8-k1024", "bf16-k512", "bf16-k1024"]


def _words(line: str) -> tuple[dict[str, str | None], list[str]]:
    """A dry-run line -> (env: NAME -> value, or None for `env -u NAME`; argv)."""
    words = shlex.split(line.replace("$PORT", "PORTVALUE"))
    env: dict[str, str | None] = {}
    if words[0] == "env":
        words = words[1:]
        while words[0] == "-u":
            env[words[1]] = None
            words = words[2:]
    while "=" in words[0] and words[0][0].isupper():
        k, v = words.pop(0).split("=", 1)
        env[k] = v
    return env, words


def test_sglang_dry_run_stock_is_plain_sglang_and_bf16_adds_only_niahs_switches(monkeypatch):
    monkeypatch.setenv("NIAH_INDEX_DTYPE", "bf16")  # inherited: removed from the stock arm's environment
    rows = matrix_commands(EXAMPLES / "sglang.toml")
    assert [c.name for c, _ in rows] == SGLANG_ARMS
    by_name = {c.name: _words(line) for c, line in rows}
    for cfg, _ in rows:
        env, argv = by_name[cfg.name]
        k = cfg.axes["index_topk"]
        sglang_args = ["--model-path", "deepseek-ai/DeepSeek-V3.2", "--tp-size", "8", "--host", "127.0.0.1",
                       "--port", "PORTVALUE", "--json-model-override-args", json.dumps({"index_topk": k}),
                       "--mem-fraction-static", "0.85", "--trust-remote-code"]  # the file's args, as written
        if cfg.axes["index_dtype"] == "fp8":
            assert argv[1:] == ["-m", "sglang.launch_server", *sglang_args]
            assert env["NIAH_INDEX_DTYPE"] is None and not [v for v in env.values() if v is not None]
        else:
            assert argv[1:] == ["-m", "niah.serving.sglang", "--niah-index-dtype", "bf16", "--niah-kernels", "niah",
                                *sglang_args]
            assert env == {"NIAH_INDEX_DTYPE": "bf16", "NIAH_KERNELS": "niah"}
        assert not [a for a in argv if a in ("--dsa-topk-backend", "--disable-prefill-cuda-graph")]


def _fp8_bf16_matrix(kernels_axis: bool) -> str:
    return ('engine = "sglang"\nmodel_path = "M"\ntp = 8\nargs = ["--trust-remote-code"]\n[axes]\n'
            'index_dtype = ["fp8", "bf16"]\n' + ('kernels = ["stock", "niah"]\n' if kernels_axis else "")
            + "index_topk = [512, 1024]\n")


def test_one_factor_at_a_time_arms_differ_only_in_their_axis(tmp_path, monkeypatch):
    """fp8/bf16 x 512/1024, with and without the kernels control arm: what differs per pair,
    counted (launcher, argument pieces, environment variables)."""
    from niah.serving.matrix import axis_differences

    for k in [k for k in os.environ if k.startswith("NIAH_")]:
        monkeypatch.delenv(k)
    path = tmp_path / "m.toml"
    path.write_text(_fp8_bf16_matrix(kernels_axis=True))
    by_axis: dict[str, list] = {}
    for d in axis_differences(load_matrix(path)):
        by_axis.setdefault(d["axis"], []).append(d)
    assert sorted(by_axis) == ["index_dtype", "index_topk", "kernels"]
    for d in by_axis["index_dtype"]:  # the kernels control arm vs bf16: the dtype switch only
        assert (d["a"], d["b"]) in {("fp8-niah-k512", "bf16-niah-k512"), ("fp8-niah-k1024", "bf16-niah-k1024")}
        assert d["launcher"] is None and d["count"] == 2
        assert d["argv"] == ["--niah-index-dtype fp8 -> --niah-index-dtype bf16"]
        assert d["env"] == {"NIAH_INDEX_DTYPE": ["fp8", "bf16"]}
    for d in by_axis["index_topk"]:
        assert d["count"] == 1 and d["env"] == {} and d["argv"] == [
            '--json-model-override-args {"index_topk": 512} -> --json-model-override-args {"index_topk": 1024}']
    for d in by_axis["kernels"]:  # stock SGLang vs the same through niah's entry, fp8 keys
        assert d["launcher"] == ["sglang.launch_server", "niah.serving.sglang"] and d["count"] == 5
        assert d["argv"] == ["+ --niah-index-dtype fp8", "+ --niah-kernels niah"]
        assert d["env"] == {"NIAH_INDEX_DTYPE": [None, "fp8"], "NIAH_KERNELS": [None, "niah"]}
    path.write_text(_fp8_bf16_matrix(kernels_axis=False))
    diffs = [d for d in axis_differences(load_matrix(path)) if d["axis"] == "index_dtype"]
    assert len(diffs) == 2
    for d in diffs:  # production fp8 vs bf16: niah's entry and switches, nothing of SGLang's
        assert d["launcher"] == ["sglang.launch_server", "niah.serving.sglang"] and d["count"] == 5
        assert d["argv"] == ["+ --niah-index-dtype bf16", "+ --niah-kernels niah"]
        assert d["env"] == {"NIAH_INDEX_DTYPE": [None, "bf16"], "NIAH_KERNELS": [None, "niah"]}


@pytest.mark.parametrize("example", ["embedded.toml", "demo.toml", "sglang.toml", "sglang-v4.toml"])
def test_every_example_matrix_changes_one_thing_per_axis(example):
    from niah.serving.matrix import axis_differences

    flag = {"index_dtype": ("--index-dtype", "--niah-index-dtype", "--niah-kernels",
                            "--enable-deepseek-v4-fp4-indexer"),
            "index_topk": ("--index-topk", "--json-model-override-args"), "kernels": ("--niah-kernels",),
            "index_rotation": ("--index-rotation",)}
    diffs = axis_differences(load_matrix(EXAMPLES / example))
    assert diffs
    for d in diffs:
        for seg in d["argv"]:
            assert re.sub(r"^[+-] ", "", seg).split()[0] in flag[d["axis"]], (example, d)
        assert d["launcher"] in (None, ["sglang.launch_server", "niah.serving.sglang"])
        assert not [k for k, (a, b) in d["env"].items()
                    if k not in ("NIAH_INDEX_DTYPE", "NIAH_KERNELS") and "(removed)" not in (a, b)], (example, d)


def test_bf16_stock_is_not_an_arm():
    m = parse_matrix(_fp8_bf16_matrix(kernels_axis=True), "m.toml")
    assert "bf16-stock-k512" not in m.names() and len(m.names()) == 6  # fp8-stock, fp8-niah, bf16-niah x 2
    with pytest.raises(BadInput, match=r"m.toml:5: sglang: bf16 index keys run on kernels = \"niah\""):
        parse_matrix('engine = "sglang"\nmodel_path = "M"\n[[config]]\nname = "a"\nkernels = "stock"\n'
                     'index_dtype = "bf16"\n', "m.toml")


def test_sglang_refusals_are_left_to_sglangs_parser():
    """What an arm cannot serve is decided on SGLang's own parse (tests/sglang/test_sglang_refusals.py
    runs it); where SGLang is not importable, as here, the commands are built and the launch
    entry decides."""
    m = parse_matrix('engine = "sglang"\nmodel_path = "M"\nargs = ["--enable-hier"]\n'
                     '[axes]\nindex_dtype = ["fp8", "bf16"]\n', "m.toml")
    assert [cfg.name for cfg, _ in matrix_commands(m)] == ["fp8", "bf16"]


def test_cli_dry_run_prints_each_configuration_and_starts_nothing(tmp_path):
    r = subprocess.run(
        [sys.executable, "-m", "niah", "sweep", "--matrix", str(EXAMPLES / "sglang.toml"), "--dry-run",
         "--out", str(tmp_path / "run")],
        capture_output=True, text=True, cwd=ROOT, timeout=120,
        env={k: v for k, v in os.environ.items() if not k.startswith("NIAH_")},
    )
    assert r.returncode == 0, r.stderr
    for name in SGLANG_ARMS:
        assert f"# {name}  [sglang]" in r.stdout
    assert r.stdout.count("--json-model-override-args '") == 4
    assert r.stdout.count(" -m sglang.launch_server --model-path ") == 2
    assert ("# index_dtype: fp8-k512 -> bf16-k512: 5 differences: launcher -m sglang.launch_server -> "
            "-m niah.serving.sglang; + --niah-index-dtype bf16; + --niah-kernels niah; ") in r.stdout
    assert "# arm bf16/niah: " in r.stdout and "query fp8, SGLang's own, upcast exactly to bf16" in r.stdout
    assert not (tmp_path / "run").exists()


def test_cli_bad_matrix_is_one_line_exit_2(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text('engine = "embedded"\n[axes]\nindex_dtype = ["fp8", "int4"]\n')
    r = subprocess.run(
        [sys.executable, "-m", "niah", "sweep", "--matrix", str(bad), "--dry-run"],
        capture_output=True, text=True, cwd=ROOT, timeout=120,
    )
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [
        f"niah: error: {bad}:3: axis 'index_dtype': must be one of 'fp8', 'fp4', 'bf16', 'fp32', 'fp8+bf16', "
        "'fp4+bf16', not 'int4'"]


def test_the_manifest_records_each_arm_and_the_counted_differences(tmp_path, monkeypatch):
    from niah.serving.matrix import axis_differences
    from niah.serving.matrix.run import manifest_matrix
    from niah.runs.manifest import read_manifest
    from niah.runs.run import Run
    from niah.sweep import SweepSpec

    for k in [k for k in os.environ if k.startswith("NIAH_")]:
        monkeypatch.delenv(k)
    matrix = load_matrix(EXAMPLES / "sglang.toml")
    with Run.open(tmp_path, SweepSpec(lengths=[300], depths=[50]), resume=False) as run:
        manifest_matrix(run, matrix)
    m = read_manifest(tmp_path)["matrix"]
    assert m["differences"] == axis_differences(matrix)
    assert {d["count"] for d in m["differences"] if d["axis"] == "index_dtype"} == {5}
    assert set(m["arms"]) == set(SGLANG_ARMS)
    assert m["arms"]["fp8-k512"]["arm"] == "fp8/stock" and m["arms"]["fp8-k512"]["plugin"].startswith("not loaded")
    bf16 = m["arms"]["bf16-k1024"]
    assert bf16["arm"] == "bf16/niah" and bf16["query"].startswith("fp8, SGLang's own, upcast exactly to bf16")
    assert bf16["top_k"] == "SGLang's" and "same norm, RoPE and rotation as fp8/stock" in bf16["index_keys"]
    assert m["commands"]["fp8-k512"].split()[1:3] == ["-m", "sglang.launch_server"]
