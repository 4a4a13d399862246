"""The arrival rule of a followed directory: complete files only, each once, in name order, waiting between
them."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from rectrain.datasets.follow import WAITING, DirectoryFollower, FollowConfig, arrived, follow, is_complete
from rectrain.datasets.rows import DataFileError
from rectrain.datasets.windows import BatchAt


def read_lines(path: Path, start_row: int) -> list[BatchAt]:
    """Each line of ``path`` from ``start_row`` as its own batch (the row index after it as the end)."""
    lines = path.read_text().splitlines()
    return [BatchAt(line, i + 1) for i, line in enumerate(lines) if i >= start_row]


def test_dot_names_and_tmp_files_are_never_complete(tmp_path):
    for name in ["b.tsv", ".a.tsv", "c.tsv.tmp", "a.tsv.gz", ".c.tsv.tmp"]:
        (tmp_path / name).write_text("x\n")
    assert arrived(tmp_path) == ["a.tsv.gz", "b.tsv"]
    assert not is_complete(".part") and not is_complete("x.tmp") and is_complete("x.tsv")


def test_files_are_read_once_in_name_order_waiting_in_between_and_resume_mid_file(tmp_path):
    (tmp_path / "002.tsv").write_text("c\nd\n")
    (tmp_path / "001.tsv").write_text("a\nb\n")
    config = FollowConfig(str(tmp_path), poll_s=0.001)
    stream = follow(config, read_lines)
    got = [(i.file, i.batch, i.end) for i in itertools.islice(stream, 4)]
    assert got == [("001.tsv", "a", 1), ("001.tsv", "b", 2), ("002.tsv", "c", 1), ("002.tsv", "d", 2)]
    assert next(stream) is WAITING and next(stream) is WAITING
    (tmp_path / ".003.tsv").write_text("e\nf\n")  # written under a dot-name, then renamed in
    assert next(stream) is WAITING
    (tmp_path / ".003.tsv").rename(tmp_path / "003.tsv")
    assert [next(stream).batch, next(stream).batch] == ["e", "f"]

    resumed = follow(config, read_lines, start_file="002.tsv", start_row=1)
    assert [(i.file, i.batch) for i in itertools.islice(resumed, 3)] == [
        ("002.tsv", "d"),
        ("003.tsv", "e"),
        ("003.tsv", "f"),
    ]


def test_a_file_arriving_out_of_name_order_is_an_error_not_skipped(tmp_path):
    (tmp_path / "005.tsv").write_text("a\n")
    follower = DirectoryFollower(tmp_path)
    assert follower.next_file() == "005.tsv" and follower.next_file() is None
    (tmp_path / "004.tsv").write_text("late\n")
    with pytest.raises(DataFileError, match="004.tsv arrived after 005.tsv was started but sorts before it"):
        follower.next_file()


def test_the_stream_ends_after_the_idle_time_without_new_files(tmp_path):
    (tmp_path / "001.tsv").write_text("a\n")
    now = iter(range(100))  # a clock advancing one second per reading
    config = FollowConfig(str(tmp_path), poll_s=0.001, idle_stop_s=3)
    items = list(follow(config, read_lines, clock=lambda: float(next(now))))
    assert [getattr(i, "batch", i) for i in items] == ["a", WAITING, WAITING]
