"""An append's automatic compaction does not wait for the file work the
last compaction left to a thread (its unlinks and their folder sync, the
snapshot's write): it folds the tail and leaves the rest to a later one,
which joins the finished work first. Every read stays exact."""
from __future__ import annotations

import threading

from rune_fast._conv import tuning
from rune_fast._conv.compaction import Compaction

from test_background_compaction import _append_until_merging, check_reads, msg, open_repo


def test_appends_do_not_wait_for_the_file_work_of_the_last_compaction(tmp_path, monkeypatch):
    monkeypatch.setattr(tuning, "ROLL_BYTES", 2048)        # (segments roll and are reclaimed often)
    entered, release = threading.Event(), threading.Event()
    real = Compaction._remove_files

    def gated(self, *a, **kw):
        if threading.current_thread().name == "rune-fast-file work":
            entered.set()
            assert release.wait(60)
        return real(self, *a, **kw)
    monkeypatch.setattr(Compaction, "_remove_files", gated)
    stored: dict = {}
    with open_repo(tmp_path) as repo:
        i = _append_until_merging(repo, entered, stored, limit=5000,
                                  what="no compaction left file work to a thread")
        chore = repo._chore
        assert chore is not None and chore.running()
        before = repo.stats()["compactions"]
        for j in range(i, i + 100):             # (12 automatic compactions' worth)
            m = msg(j)
            repo.append(m)
            stored[m.msg_id] = m
        assert repo._chore is chore and chore.running()     # not waited for
        assert repo.stats()["compactions"] > before           # (they folded)
        check_reads(repo, stored)
        release.set()
        chore.thread.join()
        for j in range(i + 100, i + 200):
            m = msg(j)
            repo.append(m)
            stored[m.msg_id] = m
        assert repo._chore is not chore                     # joined by a later compaction
        check_reads(repo, stored)
    with open_repo(tmp_path) as repo:
        check_reads(repo, stored)
