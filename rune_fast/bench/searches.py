"""The search lines of the comparison: one needle of each class
(:data:`rune_fast.bench.workload.NEEDLES`), with and without ``limit=20``, on
rune_fast, on SQLite and as a plain scan of the same content bytes, all in
one interleaved loop; then every store's answer checked against
``str.casefold`` (:func:`rune_fast.bench.workload.needle_truth`)."""
from __future__ import annotations

import gc
from typing import Any, Callable

from . import workload as wl
from .floors import ContentBuffer, decoder, hit_lines
from .report import Row, fmt_value
from .timing import interleaved, time_row

__all__ = ["LIMIT", "RARE", "FLAT_REPEATS", "search_rows", "limit_flatness_row", "even_turns", "check_answers",
           "hit_id"]

#: The ``limit`` of the limited search lines.
LIMIT = 20
#: What the plain loop of a search line is.
SCAN = "memmem scan of one buffer of the content bytes"
#: Needle classes held to the rare-needle targets (>= 10x SQLite, <= 3x the scan).
RARE = ("rare_ascii", "rare_nonascii", "expansion", "cjk")
#: Fewest samples of each side of the limit=20 growth line (a repeat costs
#: about a millisecond: four limited searches, twice each, and their warm-ups).
FLAT_REPEATS = 15


def hit_id(hit: Any) -> str:
    """The msg_id of a search hit (a SearchHit, a record or a plain dict)."""
    rec = getattr(hit, "record", hit)
    return rec["msg_id"] if isinstance(rec, dict) else rec.msg_id


def search_rows(messages: list[dict[str, Any]], buf: ContentBuffer, record_type: Any, s_rune: Any, s_sql: Any,
                repeats: int, say: Callable[[str], None]) -> list[Row]:
    """The two rows of each needle class (unlimited, then ``limit=20``): the
    unlimited searches and the scans interleaved, then the limited searches
    of both stores in :func:`even_turns`."""
    rows: list[Row] = []
    decode = decoder(record_type)
    for nd in wl.NEEDLES:
        q = nd.query
        say(f"  search {q!r} ({nd.cls}) ...")
        jobs: dict[str, Callable[[int], float]] = {
            "rune": _job(s_rune.search, q),
            "sql": _job(s_sql.search_ci, q),
        }
        base_vs = SCAN
        if nd.cls == "ten_pct":
            lines = hit_lines(messages, q)
            base_vs += f" + decoding its {len(lines):,} hits"
            jobs["base"] = _scan_decode_job(buf, q, lines, decode)
            jobs["scan"] = _scan_job(buf, q)
        else:
            jobs["base"] = _scan_job(buf, q)
        res = interleaved(jobs, repeats)
        vs = "SQLite instr(lower(content), lower(?)) scan"
        if nd.cls in RARE:
            target, min_ratio, max_base = ">= 10x, <= 3x loop", 10.0, 3.0
        elif nd.cls == "ten_pct":
            target, min_ratio, max_base = "<= 5x loop", None, 5.0
        else:
            target, min_ratio, max_base = "", None, None
        rows.append(time_row(f"search_{nd.cls}", f"search {q!r} ({nd.about.split(' (')[0].split(':')[0]})", res,
                             vs, target, min_ratio, base="base", base_vs=base_vs, max_base_ratio=max_base))
        # (the limited searches in turns of their own: among the full scans,
        # the one after a scan or the per-repeat collection starts cold, and
        # interleaved's turns gave that to rune_fast in 2 of 3 repeats and to
        # SQLite in 1: 'session' 1.75, 0.40, 1.59 ms against 0.34, 1.99, 0.34)
        res_l = even_turns({"rune_l": _job(s_rune.search, q, LIMIT), "sql_l": _job(s_sql.search_ci, q, LIMIT)},
                           max(repeats, FLAT_REPEATS))
        res_l["scan"] = res.get("scan", res["base"])
        rows.append(time_row(f"search_{nd.cls}_limit", f"search {q!r}, limit={LIMIT}", res_l,
                             vs + f" ORDER BY seq DESC LIMIT {LIMIT}", "", None, rune="rune_l", other="sql_l",
                             base="scan", base_vs=SCAN))
    return rows


def limit_flatness_row(n: int, small: int, s_rune: Any, s_sql: Any, s_rune_s: Any, s_sql_s: Any,
                       repeats: int) -> Row:
    """search(common needle, limit=20): cost on the N store / cost on the small store, both sides
    (samples taken by :func:`even_turns`, at least :data:`FLAT_REPEATS` of them)."""
    q = next(nd.query for nd in wl.NEEDLES if nd.cls == "common")
    res = even_turns({
        "rune": lambda _i: _one(lambda: s_rune.search(q, limit=LIMIT), 2),
        "sql": lambda _i: _one(lambda: s_sql.search_ci(q, limit=LIMIT), 2),
        "rune_s": lambda _i: _one(lambda: s_rune_s.search(q, limit=LIMIT), 2),
        "sql_s": lambda _i: _one(lambda: s_sql_s.search_ci(q, limit=LIMIT), 2),
    }, max(repeats, FLAT_REPEATS))
    big = time_row("x", "x", res, "", "", None)
    sm = time_row("x", "x", res, "", "", None, rune="rune_s", other="sql_s")
    gr = big.rune / sm.rune if big.rune and sm.rune else None
    gs = big.other / sm.other if big.other and sm.other else None
    return Row("search_limit_flatness", f"search {q!r}, limit={LIMIT}: cost growth {small:,} -> {n:,} "
               f"({fmt_value(sm.rune, 'ns')} -> {fmt_value(big.rune, 'ns')})", gr, gs, "x",
               "SQLite growth (ratio: sqlite/rune)", "rune <= 1.5x", None if gr is None else gr <= 1.5)


def even_turns(jobs: dict[str, Callable[[int], float]], repeats: int) -> dict[str, list[float]]:
    """Per repeat: a full collection, every job once untimed, then every job
    once timed, in an order that rotates from repeat to repeat; returns the
    timed samples (ns/op) by job.

    Each timed sample of a job thus follows, since that job's own last call,
    exactly one call of every other job, whichever job goes first. The
    jobs of a growth line are cheap (a limited search: ~0.1 ms) and
    their samples few, where :func:`interleaved`'s turns would bias them:
    a call right after its per-repeat ``gc.collect()`` (which walks every
    tracked object) starts from cold caches (limit=20 of 'session' at
    1,000,000 and 10,000 messages: ~195 and ~185 us right after it, ~128
    and ~115 us otherwise), and its rotation gives that turn to the first
    job in 2 of 3 repeats, to the third in 1, to the others never: the
    N store's median was a cold call and the small store's a warm one
    (1.7x of 1.1x)."""
    names = list(jobs)
    out: dict[str, list[float]] = {name: [] for name in names}
    for i in range(repeats):
        order = names[i % len(names):] + names[:i % len(names)]
        gc.collect()
        for name in order:
            jobs[name](-1)
        for name in order:
            out[name].append(jobs[name](i))
    return out


def check_answers(messages: list[dict[str, Any]], s_rune: Any, s_sql: Any, notes: list[str]) -> None:
    """Each needle's hits on both stores against str.casefold; wrong answers go into the notes.

    A rune_fast answer that differs is an engine bug (``WRONG:`` note); SQLite's
    ``lower()`` folds ASCII only, so its misses are reported as a correctness
    line, not an error."""
    truth = wl.needle_truth(messages, [nd.query for nd in wl.NEEDLES], keep=LIMIT)
    for nd in wl.NEEDLES:
        q = nd.query
        t = truth[q]
        got = s_rune.search(q)
        got_ids = [hit_id(h) for h in got]
        got_l = [hit_id(h) for h in s_rune.search(q, limit=LIMIT)]
        sql_n = len(s_sql.search_ci(q))
        sql_l = [hit_id(h) for h in s_sql.search_ci(q, limit=LIMIT)]
        want_l = list(t.newest)
        ok = len(got_ids) == t.count and got_ids[-LIMIT:] == want_l and got_l == want_l
        share = t.count / max(1, len(messages))
        line = (f"search {q!r} ({nd.cls}): expected {t.count:,} hits ({share:.2%} of messages, str.casefold), "
                f"rune_fast {len(got_ids):,}{'' if ok else ' WRONG'}, SQLite {sql_n:,}")
        if sql_n < t.count:
            line += f" (SQLite's ASCII-only lower() misses {t.count - sql_n:,})"
        if sql_l != want_l and sql_n == t.count:
            line += "; SQLite's limit=20 answer differs"
        notes.append(line)
        if not ok:
            detail = []
            if len(got_ids) != t.count:
                missing = len(set(want_l) - set(got_ids))
                detail.append(f"{len(got_ids)} hits for {t.count} expected ({missing} of the newest "
                              f"{len(want_l)} expected ids missing)")
            if got_l != want_l:
                detail.append(f"limit={LIMIT} returned {len(got_l)} ids, {len(set(got_l) & set(want_l))} of "
                              f"them among the expected newest {len(want_l)}"
                              + ("" if got_l[:1] == want_l[:1] else f" (first {got_l[:1]}, expected {want_l[:1]})"))
            if got_ids[-LIMIT:] != want_l and len(got_ids) == t.count:
                detail.append("the unlimited answer's order or last hits differ")
            notes.append(f"WRONG: rune_fast search({q!r}): " + "; ".join(detail))


def _job(search: Callable[..., Any], q: str, limit: int | None = None) -> Callable[[int], float]:
    if limit is None:
        return lambda _i: _one(lambda: search(q))
    return lambda _i: _one(lambda: search(q, limit=limit))


def _scan_job(buf: ContentBuffer, q: str) -> Callable[[int], float]:
    return lambda _i: buf.scan_ns(q)


def _scan_decode_job(buf: ContentBuffer, q: str, lines: list[bytes],
                     decode: Callable[[bytes], Any]) -> Callable[[int], float]:
    return lambda _i: buf.scan_ns(q) + _one(lambda: [decode(x) for x in lines])


def _one(fn: Callable[[], Any], count: int = 1) -> float:
    import gc
    import time

    gc_was = gc.isenabled()
    gc.disable()
    try:
        t0 = time.perf_counter_ns()
        for _ in range(count):
            fn()
        t1 = time.perf_counter_ns()
    finally:
        if gc_was:
            gc.enable()
    return (t1 - t0) / count
