"""Prepare -> call -> evaluate: prompt sets, --prompts, rescore; the needle and haystack kinds;
one trial-record definition (checked against docs/run-format.md)."""

import json
import re
from pathlib import Path

import pytest

from niah.errors import BadInput
from niah.prompts.needles import NeedleKind, trial_seed
from niah.prompts.builder import build_prompt
from niah.prompts.sets import SET_SCHEMA, read_set
from niah.runs.record import record_fields
from niah.sweep.scoring import score_values
from niah.runs.trials import load_run
from niah.sweep import SweepSpec, Target, run_sweep
from niah.tokens import length_tolerance
from niah.tokens import FALLBACK, load_tokenizer

ROOT = Path(__file__).resolve().parents[2]


def niah(*args, **kw):
    from cli_inproc import niah as run  # the entry point in this process (tests/cli_inproc.py)

    return run(*args, **kw)


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer(FALLBACK)


def test_prompt_set_built_then_run_gives_the_sets_hashes(oracle, tmp_path):
    """A set from `niah prompts build`, run with --prompts: trial hashes == the set's."""
    grid = ["--lengths", "400,1500", "--depths", "0,50,100", "--trials", "2"]
    r = niah("prompts", "build", "--endpoint", oracle.url, *grid, "--keys", "3", "--out", tmp_path / "set.jsonl")
    assert r.returncode == 0, r.stderr
    again = niah("prompts", "build", "--endpoint", oracle.url, *grid, "--keys", "3", "--out", tmp_path / "again.jsonl")
    assert again.returncode == 0 and (tmp_path / "set.jsonl").read_bytes() == (tmp_path / "again.jsonl").read_bytes()
    entries = read_set(tmp_path / "set.jsonl")
    assert len(entries) == 12 and all(e.schema_version == SET_SCHEMA and e.tokenizer == "server" for e in entries)
    e = entries[0]
    assert len(e.facts) == 3 and e.asked_keys == [e.facts[0]["key"]] and e.expected == [e.facts[0]["value"]]
    assert sorted(e.distractors) == sorted(f["value"] for f in e.facts[1:])
    content = e.messages[0]["content"]
    for f in e.facts:
        assert content[f["span"][0]:f["span"][1]].endswith(f"{f['value']}.")

    r = niah("sweep", "--endpoint", oracle.url, "--prompts", tmp_path / "set.jsonl", "--out", tmp_path / "run", "-q")
    assert r.returncode == 0, r.stderr
    manifest, recs = load_run(tmp_path / "run")
    by = {(x.length, x.depth, x.trial): x.prompt_sha256 for x in entries}
    assert len(recs) == 12
    for rec in recs:
        assert rec["prompt_sha256"] == by[(rec["length"], rec["depth"], rec["trial"])]
        assert rec["outcome"] == "correct" and rec["distractors"] and len(rec["distractors"]) == 2
    assert manifest["args"]["prompts"] == str(tmp_path / "set.jsonl")
    # a sweep without --prompts stores the set it built; that file runs as a set too
    run_sweep([Target(oracle.url)], SweepSpec(lengths=[400], depths=[50], trials=2), tmp_path / "built")
    stored = read_set(tmp_path / "built" / "prompts.jsonl")
    _, built = load_run(tmp_path / "built")
    assert {x.prompt_sha256 for x in stored} == {x["prompt_sha256"] for x in built}


def test_a_tampered_or_broken_set_is_refused(oracle, tmp_path):
    r = niah("prompts", "build", "--endpoint", oracle.url, "--lengths", "400", "--depths", "50",
             "--trials", "1", "--out", tmp_path / "set.jsonl")
    assert r.returncode == 0, r.stderr
    line = json.loads((tmp_path / "set.jsonl").read_text())
    line["messages"][0]["content"] = line["messages"][0]["content"].replace("magic", "MAGIC", 1)
    (tmp_path / "bad.jsonl").write_text(json.dumps(line) + "\n")
    r = niah("sweep", "--endpoint", oracle.url, "--prompts", tmp_path / "bad.jsonl", "--out", tmp_path / "run")
    assert r.returncode == 2 and "does not match its prompt_sha256" in r.stderr
    assert not (tmp_path / "run").exists()
    r = niah("sweep", "--endpoint", oracle.url, "--prompts", tmp_path / "set.jsonl", "--lengths", "900",
             "--out", tmp_path / "run")
    assert r.returncode == 2 and "--prompts fixes the prompts: --lengths would be ignored" in r.stderr


def test_rescore_reproduces_an_unchanged_run_and_fixes_a_changed_outcome(oracle_factory, tmp_path):
    """`niah rescore` reproduces the stored outcomes of an unchanged run."""
    srv = oracle_factory("--wrong-above", "1000")
    run = tmp_path / "run"
    run_sweep([Target(srv.url)], SweepSpec(lengths=[500, 1500], depths=[0, 100], trials=2, needles=2), run)
    before = (run / "trials.jsonl").read_bytes()
    r = niah("rescore", run)
    assert r.returncode == 0, r.stderr
    assert "8 trials re-scored: 0 outcome(s) changed" in r.stdout
    assert (run / "trials.jsonl").read_bytes() == before
    _, recs = load_run(run)
    assert {x["outcome"] for x in recs if x["length"] == 1500} == {"wrong"}
    # an outcome written by an older scorer is re-scored from the stored answer
    lines = [json.loads(x) for x in before.decode().splitlines()]
    lines[0]["outcome"], lines[0]["correct"] = "refused", False
    (run / "trials.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    r = niah("rescore", run)
    assert "1 outcome(s) changed" in r.stdout and "refused -> correct" in r.stdout
    assert (run / "trials.jsonl").read_bytes() == before


@pytest.mark.parametrize("kind", [
    NeedleKind(value="uuid", values=3),
    NeedleKind(key="word", value="word", keys=4, queries=2),
    NeedleKind(values=2, keys=3, queries=2),
])
def test_kinds_build_deterministic_prompts(tok, kind):
    p = build_prompt(tok, 2500, 30.0, trial_seed(0, 2500, 30, 0), kind=kind)
    q = build_prompt(tok, 2500, 30.0, trial_seed(0, 2500, 30, 0), kind=kind)
    assert p.content == q.content and abs(p.tokens - 2500) <= 2
    assert len(p.facts) == kind.keys * kind.values
    assert len(p.expected) == kind.queries * kind.values and len(p.asked_keys) == kind.queries
    for f in p.facts:
        assert p.content.count(f.value) == 1 and p.content[f.span[0]:f.span[1]] == kind.sentence(f.key, f.value)
    if kind.value == "uuid":
        assert all(re.fullmatch(r"[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}", v)
                   for v in p.expected)
    for key in p.asked_keys:
        assert key in p.content.rsplit("\n\n", 1)[1]  # every asked key is in the question


@pytest.mark.parametrize("haystack", ["book", "noise", "needles"])
def test_haystack_kinds(tok, haystack):
    p = build_prompt(tok, 3000, 50.0, trial_seed(0, 3000, 50, 0), haystack=haystack)
    assert abs(p.tokens - 3000) <= 2 and p.content.count(p.needle.value) == 1 and p.haystack == haystack
    hay = p.content[: p.needle_span[0]]
    if haystack == "book":
        assert "Elizabeth" in p.content or "Darcy" in p.content or "Bennet" in p.content
    if haystack == "noise":
        assert "The grass is green. The sky is blue." in hay
    if haystack == "needles":
        assert len(re.findall(r"The special magic number for \w+ is \d{7}\.", p.content)) > 50
    assert abs(p.depth_achieved - 50) < 3


def test_a_users_haystack_file(tok, tmp_path):
    text = " ".join(f"Sentence about the {w} in the garden." for w in ["rose", "tree", "pond", "wall"] * 150)
    (tmp_path / "mine.txt").write_text(text)
    p = build_prompt(tok, 1200, 50.0, 7, haystack=f"file:{tmp_path / 'mine.txt'}")
    assert "Sentence about the" in p.content and abs(p.tokens - 1200) <= 2
    with pytest.raises(BadInput, match="no such file"):
        build_prompt(tok, 1200, 50.0, 7, haystack=f"file:{tmp_path / 'none.txt'}")


def test_score_per_value():
    s = score_values(["1111111", "2222222", "3333333"], "It is 1111111 and 3,333,333.")
    assert s.outcome == "wrong" and s.hits == [True, False, True] and s.recall_share == pytest.approx(2 / 3)
    s = score_values(["walrus", "comet"], "Comet, walrus.")
    assert s.outcome == "correct" and s.hits == [True, True]
    assert score_values(["walrus"], "walruses").hits == [False]  # a whole word, not inside another
    assert score_values(["1111111", "2222222"], "1111111 2222222 9999999", distractors=["9999999"]).outcome == "wrong"


def test_uuid_multi_value_sweep_scores_per_value(oracle, tmp_path):
    """A uuid/multi-value sweep scores per value; the kinds are in the manifest
    and in each trial."""
    out = tmp_path / "run"
    r = niah("sweep", "--endpoint", oracle.url, "--lengths", "800,2000", "--depths", "20,80", "--trials", "1",
             "--needle-value", "uuid", "--values", "3", "--keys", "2", "--haystack", "book", "--max-tokens", "200",
             "--out", out, "-q")
    assert r.returncode == 0, r.stderr
    manifest, recs = load_run(out)
    assert manifest["args"]["needle_kind"] == {"key": "city", "value": "uuid", "values": 3, "keys": 2, "queries": 1}
    assert manifest["args"]["corpus"]["kind"] == "book"
    for rec in recs:
        assert rec["haystack"] == "book" and rec["needle_kind"]["values"] == 3
        assert len(rec["expected"]) == 3 and rec["hits"] == [True, True, True] and rec["recall_share"] == 1.0
        assert len(rec["distractors"]) == 3 and rec["outcome"] == "correct"
        assert abs(rec["prompt_tokens"] - rec["length"]) <= length_tolerance(rec["length"])


def test_one_trial_record_definition_matches_the_docs():
    doc = (ROOT / "docs" / "run-format.md").read_text()
    section = re.split(r"\n##+ ", doc.split("## trials.jsonl", 1)[1], maxsplit=1)[0]
    documented = re.findall(r"^\| `([a-z_0-9]+)` \|", section, flags=re.M)
    assert documented == record_fields()
    from niah.serving.matrix import run as matrix_run
    from niah.sweep import orchestrate

    src = Path(matrix_run.__file__).read_text() + Path(orchestrate.__file__).read_text()
    assert '"prompt_tokens_local": None' not in src  # no second copy of the layout


def test_one_definition_of_each_name_and_serving_needs_no_sweep_internals():
    import ast

    defs: dict[str, list[str]] = {}
    for f in [*ROOT.glob("niah/**/*.py"), *ROOT.glob("serving/**/*.py"), *ROOT.glob("kernels/**/*.py")]:
        if f.relative_to(ROOT).parts[:2] in (("niah", "serving"), ("niah", "kernels")):
            continue  # links to serving/ and kernels/, if a checkout has them (judged inside the checkout)
        for node in ast.parse(f.read_text()).body:
            names = [node.name] if isinstance(node, (ast.FunctionDef, ast.ClassDef)) else [
                t.id for t in getattr(node, "targets", []) if isinstance(t, ast.Name)]
            for n in names:
                defs.setdefault(n, []).append(str(f.relative_to(ROOT)))
    for name in ("run_matrix", "trials_frame", "check_spec", "register_form", "ROTATIONS", "error_record",
                 "length_tolerance", "comparable_axes"):
        assert len(defs.get(name, [])) == 1, (name, defs.get(name))
    # The matrix runs its configurations through the sweep's one orchestrator: it neither
    # calls the call stage nor reads or writes attestation segments or the manifest itself.
    src = (ROOT / "serving" / "matrix" / "run.py").read_text()
    assert "orchestrate(" in src
    for internal in ("run_target", "begin_segment", "end_segment", "read_server", "write_manifest"):
        assert internal not in src, internal


# The harness's layers, lowest first; a module imports only from its own package or a lower layer.
LAYERS = (("niah.errors", "niah.cache"), ("niah.axes", "niah.client", "niah.redact", "niah.regime"), ("niah.kernels",),
          ("niah.tokens",),
          ("niah.prompts",),
          ("niah.runs", "niah.attestation"), ("niah.sweep",), ("niah.report",))


def _harness_imports():
    """{module: {imported niah module, function-level imports too}} of the harness (niah/ but
    the command line)."""
    import ast

    out: dict[str, set[str]] = {}
    for f in ROOT.glob("niah/**/*.py"):
        rel = f.relative_to(ROOT / "niah").with_suffix("")
        if (rel.parts[0] in ("commands", "corpus", "serving", "kernels")
                or str(rel) in ("cli", "demo", "__main__", "__init__")):
            continue
        mod = ".".join(("niah", *rel.parts)).removesuffix(".__init__")
        names = out.setdefault(mod, set())
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.Import):
                names.update(a.name for a in node.names if a.name.startswith("niah"))
            elif isinstance(node, ast.ImportFrom) and not node.level and (node.module or "").startswith("niah"):
                names.add(node.module)
    return out


def test_the_harness_imports_only_downward_and_never_serving():
    def layer(mod: str) -> tuple[int, str] | None:
        for i, group in enumerate(LAYERS):
            for pkg in group:
                if mod == pkg or mod.startswith(pkg + "."):
                    return i, pkg
        return None

    for mod, names in _harness_imports().items():
        own = layer(mod)
        assert own is not None, mod
        for name in names:
            assert not name.startswith("niah.serving"), (mod, name)
            other = layer(name)
            assert other is None or other[1] == own[1] or other[0] < own[0], (mod, name)


def test_no_import_circles_in_the_harness():
    graph = _harness_imports()

    def resolve(name: str) -> str | None:  # the longest harness module the name lies in
        parts = name.split(".")
        return next((".".join(parts[:i]) for i in range(len(parts), 0, -1) if ".".join(parts[:i]) in graph), None)

    edges = {m: {t for n in names if (t := resolve(n)) and t != m and not m.startswith(t + ".")}
             for m, names in graph.items()}
    state: dict[str, int] = {}

    def visit(m: str, path: list[str]) -> None:
        state[m] = 1
        for t in edges[m]:
            assert state.get(t) != 1, " -> ".join([*path, m, t])
            if t not in state:
                visit(t, [*path, m])
        state[m] = 2

    for m in sorted(edges):
        if m not in state:
            visit(m, [])
