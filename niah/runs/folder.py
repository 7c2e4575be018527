"""The run folder as the sweep starts it: refuse what is not ours, write the manifest's args, check a resume.

`check_ours` refuses a folder that is not a niah run's but holds a file a sweep writes
(another tool's manifest.json, a prompts.jsonl without a manifest), `check_resumable` a
`--resume` with no run to resume; `open_store`, called by niah.runs.run.Run.open under the
folder's lock, checks that a resume keeps the arguments that change prompts or answers,
writes the manifest's args (through niah.runs.manifest, the only manifest writer) and opens
the RunStore (niah.runs.trials). `check_same_tokenizers` refuses a resume that would mix
two servers or two counters under one configuration name.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import asdict, fields
from pathlib import Path

from niah import __version__
from niah.errors import BadInput
from niah.prompts.builder import corpus_info
from niah.prompts.haystacks import haystack_info
from niah.prompts.needles import NEEDLE, QUESTION
from niah.redact import redact_argv
from niah.runs.integrity import prompt_set as sent_prompts
from niah.runs.manifest import MANIFEST, change_manifest, read_manifest
from niah.runs.prompts import RUN_PROMPTS, RunPrompts
from niah.runs.record import now
from niah.runs.trials import ERRORS, TRIALS, RunStore

# Arguments that change the prompts or answers: a resumed run must keep them.
# A frozen set (--prompts) is compared by content (its sha256), never by the path as typed.
_FIXED_ON_RESUME = ("seed", "mode", "max_tokens", "needles", "needle_key", "needle_value", "values",
                    "queries", "haystack")


def _git_sha() -> str | None:
    try:
        r = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=Path(__file__).resolve().parent,
            capture_output=True, text=True, timeout=5,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return r.stdout.strip() or None if r.returncode == 0 else None


def _version() -> str:
    return __version__  # niah/__init__.py: the one place the version is set


def is_run_manifest(path: Path) -> bool:
    """Whether `path` (a manifest.json) is a niah run's: a JSON object with a schema_version
    and the args or configs a sweep writes."""
    try:
        data = json.loads(path.read_bytes())
    except (OSError, ValueError):
        return False
    return isinstance(data, dict) and "schema_version" in data and ("args" in data or "configs" in data)


def check_ours(out: Path | str) -> None:
    """BadInput when `out` exists but is not a niah run folder and holds a file a sweep
    would write (manifest.json, trials.jsonl, trials.errors.jsonl, prompts.jsonl): a
    project folder of its own is never written into, not one byte."""
    out = Path(out)
    if not out.is_dir():
        return
    if (out / MANIFEST).exists() and not is_run_manifest(out / MANIFEST):
        raise BadInput(f"{out} is not a niah run folder (its {MANIFEST} is not a niah run's); "
                       "nothing was written: choose another --out")
    if not (out / MANIFEST).exists():
        theirs = [n for n in (TRIALS, ERRORS, RUN_PROMPTS) if (out / n).exists()]
        if theirs:
            raise BadInput(f"{out} is not a niah run folder (it holds {theirs[0]} but no {MANIFEST}); "
                           "nothing was written: choose another --out")


def check_resumable(out: Path | str) -> None:
    """`--resume` needs a run folder to resume: BadInput when `out` holds no manifest (a
    mistyped folder would otherwise start a new run, silently) or another tool's."""
    out = Path(out)
    if not (out / MANIFEST).is_file():
        what = "does not exist" if not out.exists() else f"is not a niah run folder (no {MANIFEST})"
        raise BadInput(f"--resume: {out} {what}; nothing to resume (leave out --resume to start a new run)")
    check_ours(out)


def _check_resume(out: Path, spec, args: dict, prompt_set=None) -> None:
    """A resume keeps every argument that changes prompts or answers (BadInput)."""
    defaults = {f.name: f.default for f in fields(spec)}
    old = read_manifest(out).get("args", {})
    for k in _FIXED_ON_RESUME:
        if k == "seed" and args["prompts"] is not None:
            continue  # a frozen set's seeds are its own: the set is compared by content below
        if old.get(k, defaults[k]) != args[k]:
            raise BadInput(f"--resume with a different {k} ({args[k]!r}, the run has {old.get(k)!r}): "
                           "use another --out")
    if old.get("residues") != args.get("residues"):  # a residue block's trials share one seed
        raise BadInput(f"--resume with different --residues ({args.get('residues')!r}, the run has "
                       f"{old.get('residues')!r}): use another --out")
    if old.get("decode_first") != args.get("decode_first"):  # another prompt and max_tokens
        raise BadInput(f"--resume with a different --decode-first ({args.get('decode_first')!r}, the run has "
                       f"{old.get('decode_first')!r}): use another --out")
    if old.get("multi_turn") != args.get("multi_turn"):  # another prompt and scorer
        raise BadInput(f"--resume with a different --multi-turn ({args.get('multi_turn')!r}, the run has "
                       f"{old.get('multi_turn')!r}): use another --out")
    _check_same_set(out, old, args, prompt_set)


def _check_same_set(out: Path, old: dict, args: dict, prompt_set) -> None:
    """A resume runs the set the run ran, by content: the same file by another path
    resumes; a set rebuilt at the same path (other bytes) is refused (BadInput)."""
    was, now_ = old.get("prompts"), args["prompts"]
    if (was is None) != (now_ is None):
        raise BadInput(f"--resume with a different prompts ({now_!r}, the run has {was!r}): use another --out")
    if now_ is None:
        return
    new = args["prompt_set"] or {}
    recorded = (old.get("prompt_set") or {}).get("sha256")
    if recorded is not None and recorded != new.get("sha256"):
        raise BadInput(f"--resume with another prompt set: {now_} (sha256 {str(new.get('sha256'))[:12]}) is not "
                       f"the set the run ran (sha256 {recorded[:12]}, {was}); use another --out")
    if recorded is None and prompt_set is not None:  # no sha256 recorded: every prompt it sent must be the set's
        ours = {e.prompt_sha256 for e in prompt_set.by.values()}
        other = next((sha for sha in sent_prompts(out) or {} if sha not in ours), None)
        if other is not None:
            raise BadInput(f"--resume with another prompt set: the run sent prompt {other[:12]}, which "
                           f"{now_} does not hold; use another --out")


def open_store(out: Path, spec, resume: bool, prompt_set=None) -> RunStore:
    """Write the manifest's args (a resume checked first: BadInput, nothing changed) and
    open the trials; the caller holds the folder's lock. `spec` is a niah.sweep.SweepSpec,
    `prompt_set` the niah.prompts.sets.SetIndex of spec.prompts (its provenance is recorded)."""
    args = asdict(spec)
    if prompt_set is not None and getattr(prompt_set, "residues", None):  # a --residues set: its plan
        args["residues"] = prompt_set.residues
    for k in ("residues", "decode_first", "multi_turn"):  # an option unused: the manifest a sweep always wrote
        if args.get(k) is None:
            args.pop(k, None)
    if (cov := args.pop("coverage", None)) is not None:  # the preset's name, and what it expanded to
        args.update(coverage=cov["preset"], coverage_options=cov["options"], coverage_given=cov["given"])
    args["prompt_set"] = prompt_set.provenance() if prompt_set is not None else None
    if prompt_set is not None and prompt_set.base_seeds is None:
        args["seed"] = None  # a set that does not name its base seed: the trials carry theirs
    again = resume and (out / MANIFEST).exists()
    if again:
        _check_resume(out, spec, args, prompt_set)  # before opening the store: a refused resume changes nothing
    store = RunStore(out).open(resume)
    kind = spec.kind
    args["needle"] = {"sentence": NEEDLE, "question": QUESTION, "key": "city", "value": "7 digits"} if kind.default \
        else {"sentence": kind.sentence("{key}", "{value}"), "question": kind.question(["{key}"])}
    args["needle_kind"] = kind.as_dict()
    args["corpus"] = corpus_info() if spec.haystack == "prose" else haystack_info(spec.haystack, kind.value)

    def start(manifest: dict) -> None:
        if again:
            manifest.setdefault("resumed", []).append(now())
        manifest.update(niah_version=_version(), git_sha=_git_sha(), command=redact_argv(sys.argv), args=args)
        manifest.setdefault("created", now())
        manifest.setdefault("configs", {})

    change_manifest(out, start, fresh=not again)
    store.prompts = RunPrompts(out)  # what was sent, built here or taken from --prompts
    if store.skipped_lines:
        print(
            f"niah: {out / 'trials.jsonl'}: skipped unreadable line(s) {store.skipped_lines} "
            "(a write cut short); those trials run again",
            file=sys.stderr,
        )
    if store.retried:
        print(
            f"niah: {store.retried} trial(s) recorded as error run again "
            f"(the old records are kept in {out / 'trials.errors.jsonl'})",
            file=sys.stderr,
        )
    return store


def check_same_tokenizers(manifest: dict, prepared: list, force: bool = False) -> None:
    """A resumed configuration must be the same server (endpoint, model) counting tokens as
    before, or two servers' trials would merge under one name (`force`: allow another
    endpoint or model; the counter must still match, or the prompts would differ).
    `prepared`: niah.sweep.targets.PreparedTarget."""
    old = manifest.get("configs", {})
    for p in prepared:
        before = old.get(p.target.name, {})
        was = before.get("tokenizer")
        now_ = p.info["tokenizer"]
        if was and was != now_:
            raise BadInput(
                f"--resume: configuration {p.target.name!r} was measured with tokenizer {was}, "
                f"now {now_}; prompts would differ: pass --tokenizer {was}"
            )
        if force or p.target.lifecycle is not None:
            continue  # a launched server gets a new port each time; its settings are checked instead
        for key, new in (("endpoint", p.endpoint), ("model", p.model)):
            if before.get(key) and before[key] != new:
                raise BadInput(
                    f"--resume: configuration {p.target.name!r} was measured at {key} {before[key]}, "
                    f"now {new}; its trials would mix two servers: use another --out, or pass --force-config"
                )
