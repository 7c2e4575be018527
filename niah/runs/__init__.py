"""The run folder: everything that reads or writes RUN/.

    RUN/manifest.json   what was asked and who answered: niah.runs.manifest, its only writer
    RUN/trials.jsonl    one line per finished trial (niah.runs.record): niah.runs.trials
    RUN/.niah.lock      one sweep at a time: niah.runs.lock
    RUN/prompts.jsonl   the prompts a sweep built: niah.runs.prompts
    RUN/indexer/, logs/ side files (the indexer probe's detail, servers' logs): niah.runs.side
    RUN/parts/<config>/ a spread matrix's job folders, merged into RUN: niah.runs.parts

niah.runs.run.Run is the one way a sweep opens its folder (the plain sweep, the matrix, the
spread coordinator and its jobs): refusals first, then the lock, the manifest's args and the
trials (niah.runs.folder's checks), released however the sweep ends. niah.runs.export
writes the trials as one table. docs/run-format.md has the layout.
Nothing outside niah.runs opens a run folder's files for writing (tests/runs checks
the source tree); a report's pages are the report's own (niah.report).
"""
