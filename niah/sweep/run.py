"""The call stage: ask one prepared target every pending trial, score it, store it.

`run_target(prepared, spec, store, progress, dead)` takes each trial's prompt from the
frozen set (`prepared.prompts`, from `niah sweep --prompts`; the trial records the seed the
set's entry was built from) or builds it (and logs it to RUN/prompts.jsonl), sends it with
bounded retries in its cache state (niah.sweep.cache_state: once per state of
`--cache-state`, else once), scores it with niah.sweep.scoring (with `--decode-first`, the
reply after the count it asked for: niah.sweep.decode; with `--multi-turn`, a chat prompt
scored by prefix and similarity: niah.sweep.multiturn) and appends one
niah.runs.record.TrialRecord. niah.sweep.orchestrate runs it for every target.
"""

from __future__ import annotations

import asyncio
from dataclasses import asdict
from typing import Callable

import httpx

from niah.client import RequestConfig, make_client
from niah.errors import BadInput, LengthDrift, ServerError
from niah.prompts.builder import build_prompt
from niah.prompts.needles import trial_seed
from niah.prompts.sets import entry_from_prompt
from niah.runs.record import TrialRecord
from niah.runs.trials import trial_key
from niah.runs.side import append_detail
from niah.sweep.cache_state import ask, cold_lead
from niah.sweep.control import classify, pending_controls, sweep_values
from niah.sweep.decode import decode_plan, decode_tokens
from niah.sweep.decode import max_tokens as decode_max_tokens
from niah.sweep.multiturn import TurnFacts, build_turn_prompt, check_counter, score_reply, set_fields
from niah.sweep.multiturn import max_tokens as turn_max_tokens
from niah.sweep.indexer import request_fields, summarise
from niah.sweep.residues import block, parse_residues
from niah.sweep.judge import judge
from niah.sweep.reasoning import found_in, prefix_kept
from niah.sweep.scoring import scored_text
from niah.tokens import length_tolerance

# A residue sweep's cold trial whose nonce leaves no haystack size at exactly its length (the
# nearest fit a token off: another residue) draws another nonce, up to this many in all.
COLD_NONCES = 64

DeadFn = Callable[[], "str | None"]


def pending_trials(name: str, spec, done: set[str]) -> list[tuple[int, float, int, str | None]]:
    """(length, depth, trial, cache state) of this configuration not yet in the store."""
    return [
        (int(n), float(d), t, state)
        for n in spec.lengths
        for d in spec.depths
        for t in range(spec.trials)
        for state in (spec.cache_states or [None])
        if trial_key(name, n, d, t, cache_state=state) not in done
    ]


class _TargetRun:
    """One target's trials: the state the workers share."""

    def __init__(self, prepared, spec, store, progress, dead: DeadFn | None):
        self.p, self.spec, self.store, self.progress, self.dead = prepared, spec, store, progress, dead
        self.name = prepared.target.name
        self.cfg = RequestConfig(
            endpoint=prepared.endpoint, model=prepared.model, mode=spec.mode,
            max_tokens=spec.max_tokens, stream=spec.stream, timeout_s=spec.timeout_s,
            retries=spec.retries, api_key=prepared.target.api_key,
        )
        self.died: list[str] = []
        self.gone: list[str] = []  # the external server stopped answering (no dead() given)
        self.drift: list[str] = []  # a trial's length was not what was asked
        self.known: set[str] = set()  # every needle value of the sweep (for --control)
        # the sweep's --residues, or the plan a frozen --residues set was built with
        self.residues = parse_residues(spec.residues or getattr(prepared.prompts, "residues", None))
        self.counts: dict[tuple, dict] = {}  # (seed, depth) -> the builder's counts, shared by a residue block
        self.decode = None  # --decode-first: its DecodePlan (niah.sweep.decode), set before the first trial
        self.turn_facts: dict[str, TurnFacts] = {}  # --multi-turn: prompt hash -> what it asks
        if spec.control:
            self.known = sweep_values(spec)

    def check_dead(self) -> str | None:
        if not self.died and self.dead is not None:
            cause = self.dead()
            if cause:
                self.died.append(str(cause))
        return self.died[0] if self.died else None

    async def death_after_error(self, wait_s: float = 2.0) -> str | None:
        """check_dead after a failed request, given the time to see it: a killed server's
        sockets close before its process can be reaped, so the first look can miss the death
        that refused the connection. Waits only where there is a process to watch."""
        cause = self.check_dead()
        steps = int(wait_s / 0.05) if self.dead is not None else 0
        for _ in range(steps):
            if cause:
                break
            await asyncio.sleep(0.05)
            cause = self.check_dead()
        return cause

    async def unreachable(self, client) -> str | None:
        try:
            r = await client.get(self.p.endpoint + "/models", timeout=min(10.0, self.spec.timeout_s))
        except httpx.HTTPError as e:
            return f"{type(e).__name__}: {e}".rstrip(": ")
        return f"HTTP {r.status_code}" if r.status_code >= 500 else None

    def finish(self, rec: TrialRecord) -> None:
        line = rec.finish()
        self.store.append(line)
        if self.progress is not None:
            self.progress.advance(self.name, line)

    async def prompt(self, length: int, depth: float, trial: int, seed: int, control: bool,
                     state: str | None = None):
        """The trial's set entry: from the frozen set, or built now (and logged); a cold
        trial's prompt opens with its own nonce (niah.sweep.cache_state)."""
        if self.p.prompts is not None:
            entry = self.p.prompts.get(length, depth, trial)
        else:
            s = self.spec
            # a residue block shares the builder's counts; a cold prompt's own nonce shifts them: never shared
            counts = None if self.residues is None or state == "cold" else self.counts.setdefault((seed, depth), {})
            lead = cold_lead() if state == "cold" else ""
            if s.multi_turn:  # a chat of N alike poems (niah.sweep.multiturn); its own fit, no shared counts
                built, facts = await asyncio.to_thread(build_turn_prompt, self.p.tokenizer, s, length, depth, seed,
                                                       lead)
                self.turn_facts[built.sha256] = facts
            else:
                for _ in range(COLD_NONCES):
                    built = await asyncio.to_thread(build_prompt, self.p.tokenizer, length, depth, seed, s.mode,
                                                    s.needles, s.kind, s.haystack, control, counts, lead,
                                                    s.answer_prefix, self.decode.ask if self.decode else "")
                    if state != "cold" or self.residues is None or built.tokens == length:
                        break
                    lead = cold_lead()   # this nonce's tokens leave no exact fit: its residue would be another
            entry = entry_from_prompt(built, trial, control, base_seed=s.seed)
        log = getattr(self.store, "prompts", None)
        if log is not None:
            log.add(entry)
        return entry

    async def one(self, client, length: int, depth: float, trial: int, state: str | None, control: bool) -> None:
        # a frozen set's trial carries the seed its prompt was built from: what pairs it by seed
        base = length if self.residues is None else block(length, self.residues.modulus)
        seed = (self.p.prompts.get(length, depth, trial).seed if self.p.prompts is not None
                else trial_seed(self.spec.seed, base, depth, trial))
        rec = TrialRecord(config=self.name, model=self.p.model, length=length, depth=depth, trial=trial,
                          seed=seed, control=control, cache_state=state)
        if self.residues is not None:
            rec.base_length, rec.residue = base, length % self.residues.modulus
        cause = self.check_dead()
        if cause:
            rec.error = f"server died: {cause}"
            return self.finish(rec)
        try:
            entry = await self.prompt(length, depth, trial, seed, control, state)
        except Exception as e:  # ServerError or httpx errors from the counter
            talked = isinstance(e, (ServerError, httpx.HTTPError))   # a request failed: the server may be dying
            cause = await self.death_after_error() if talked else self.check_dead()
            if cause is None and self.dead is None and (lost := await self.unreachable(client)):
                self.gone.append(lost)
                return None
            msg = str(e) if isinstance(e, (ServerError, BadInput)) else f"{type(e).__name__}: {e}"
            rec.error = f"server died: {cause}" if cause else f"prompt building failed: {msg}"
            return self.finish(rec)
        rec.set_prompt(entry)
        if self.residues is not None and entry.tokens is not None:  # the residue it was counted at
            rec.residue = entry.tokens % self.residues.modulus
        turns = self.turn_facts.get(entry.prompt_sha256)  # one prompt's facts (cache states share it)
        if turns is not None:
            set_fields(rec, turns)
        extra = None if control or turns is not None else request_fields(self.p, entry)  # a span in the last message
        reply, facts = await ask(client, self.cfg, entry.body(), extra, state)
        for k, v in facts.items():
            setattr(rec, k, v)
        if reply.error and reply.connection_error:
            cause = await self.death_after_error()
            if cause:
                reply.error = f"server died: {cause}"
            elif self.dead is None and (lost := await self.unreachable(client)):
                self.gone.append(lost)
                return None
        self.score(rec, reply, entry, turns)
        if self.decode is not None:
            rec.decode_first = self.decode.first
            rec.decode_tokens = await asyncio.to_thread(decode_tokens, self.p.tokenizer,
                                                        scored_text(reply.answer, reply.reasoning), rec.needle,
                                                        self.decode.count_to)
        if reply.indexer is not None and not reply.error:
            append_detail(self.store.dir, asdict(rec), reply.indexer)
        self.finish(rec)
        self.check_length(rec)

    def score(self, rec: TrialRecord, reply, entry, turns=None) -> None:
        rec.prompt_tokens, rec.answer, rec.reasoning = reply.prompt_tokens, reply.answer, reply.reasoning
        rec.finish_reason, rec.completion_tokens = reply.finish_reason, reply.completion_tokens
        rec.latency_s, rec.ttft_s, rec.error = reply.latency_s, reply.ttft_s, reply.error
        rec.attempts, rec.selection_recall = reply.attempts, reply.selection_recall
        rec.indexer = summarise(reply.indexer)
        rec.cached_tokens = reply.cached_tokens
        if rec.control:  # no needle: the asked values are not in the prompt
            rec.needle, rec.expected = None, None
            rec.outcome = classify(scored_text(reply.answer, reply.reasoning), entry.content, self.known, reply.error)
            return
        if turns is not None:  # prefix and similarity, as MRCR scores (niah.sweep.multiturn)
            return score_reply(rec, turns, reply)
        j = judge(entry.expected, reply.answer, reply.reasoning, reply.finish_reason, reply.error,
                  distractors=entry.distractors, count_to=self.decode.count_to if self.decode else None,
                  keep_near=self.residues is not None)
        rec.outcome, rec.hits, rec.recall_share = j.outcome, j.hits, j.recall_share
        rec.near = j.near.as_dict() if j.near is not None else None
        answer, reasoning = j.answer, j.reasoning
        if self.decode is not None:
            rec.decode_count_to = self.decode.count_to
        if not reply.error:
            rec.answer_prefix_ok = prefix_kept(self.spec.answer_prefix, reply.answer, reply.reasoning)
            rec.found_in = found_in(entry.expected, answer, reasoning)

    def check_length(self, rec: TrialRecord) -> None:
        """Stop early when the server saw another length than was asked (not with
        --approximate-lengths: then every trial records both and the report flags it)."""
        if rec.prompt_tokens is None or self.spec.approximate_lengths:
            return
        dev = abs(rec.prompt_tokens - rec.length)
        if dev > length_tolerance(rec.length) and not self.drift:
            self.drift.append(
                f"{self.name}: length {rec.length}, depth {rec.depth:g}, trial {rec.trial} was "
                f"{rec.prompt_tokens} tokens as the server counts it (off by {dev}, tolerance "
                f"{length_tolerance(rec.length):g}) with counter {self.p.info.get('tokenizer')}; stopped after "
                "that trial (it is saved). Use another --tokenizer, or pass --approximate-lengths"
            )

    async def worker(self, client, queue: asyncio.Queue) -> None:
        while not self.gone and not self.drift:
            try:
                item = queue.get_nowait()
            except asyncio.QueueEmpty:
                return
            await self.one(client, *item)


async def run_target(prepared, spec, store, progress=None, dead: DeadFn | None = None) -> None:
    """Run this target's trials that are not yet in `store.done`.

    `dead()` (by default the target's lifecycle's) is polled before each trial and after
    each connection error; once it
    returns a cause, no request is sent any more and every remaining trial of this target
    is recorded as `error` with "server died: <cause>".

    Without `dead` (a server niah did not launch), a trial that fails to connect after
    its retries makes niah probe GET /v1/models; if the server is gone, that trial and
    every one after it are left unwritten (for --resume once the server is back) and
    ServerError is raised after the trials in flight finish. A trial whose server-counted
    length drifts beyond max(4, 0.5%) stops the target (LengthDrift) unless
    spec.approximate_lengths.
    """
    lifecycle = prepared.target.lifecycle
    run = _TargetRun(prepared, spec, store, progress, dead or (lifecycle.dead if lifecycle else None))
    todo = [(*t, False) for t in pending_trials(run.name, spec, store.done)]
    todo += [(n, d, 0, None, True) for n, d in pending_controls(run.name, spec, store.done)]
    if progress is not None:
        progress.start_target(run.name, total=len(todo), lengths=[n for n, *_ in todo])
    if not todo:
        return
    if spec.decode_first:  # the count's length under this target's counter: one search, before any trial
        run.decode = await asyncio.to_thread(decode_plan, prepared.tokenizer, spec.decode_first)
        run.cfg.max_tokens = decode_max_tokens(spec.max_tokens, run.decode)
    if spec.multi_turn:  # a counter that counts whole chats; room for the prefix and the poem
        await asyncio.to_thread(check_counter, prepared.tokenizer)
        run.cfg.max_tokens = turn_max_tokens(spec.max_tokens)
    queue: asyncio.Queue = asyncio.Queue()
    for item in todo:
        queue.put_nowait(item)
    async with make_client(run.cfg, spec.concurrency) as client:
        await asyncio.gather(*(run.worker(client, queue) for _ in range(min(spec.concurrency, len(todo)))))
    if run.drift:
        raise LengthDrift(run.drift[0])
    if run.gone:
        left = len(pending_trials(run.name, spec, store.done))
        raise ServerError(
            f"{prepared.endpoint} stopped answering ({run.gone[0]}); finished trials are saved, "
            f"{left} of {run.name!r} are left: rerun with --resume once it is back"
        )
