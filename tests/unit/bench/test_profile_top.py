"""tools.profile_top reads py-spy's collapsed stacks: own time by leaf, time under a frame counted once per stack."""

from __future__ import annotations

import gzip

import pytest

from tools.profile_top import main, read_stacks, shares

RAW = """\
main (app.py:1);serve (server.py:9);encode (encoder.py:3);forward (torch/nn.py:5) 6
main (app.py:1);serve (server.py:9);json (pydantic.py:2) 3
main (app.py:1);recurse (app.py:4);recurse (app.py:4) 1
"""


def test_shares_count_leaves_and_frames_once_per_stack(tmp_path):
    path = tmp_path / "profile.txt"
    path.write_text(RAW)
    own, under, total = shares(read_stacks(path))
    assert total == 10
    assert own["forward (torch/nn.py:5)"] == 6 and own["json (pydantic.py:2)"] == 3
    assert under["main (app.py:1)"] == 10 and under["serve (server.py:9)"] == 9
    assert under["recurse (app.py:4)"] == 1  # a frame twice on one stack is one sample, not two
    _, ours, _ = shares(read_stacks(path), match=["server.py"])
    assert set(ours) == {"serve (server.py:9)"}
    own, _, total = shares(read_stacks(path, drop=["pydantic.py"]))  # a waiting thread's leaf, say
    assert total == 7 and "json (pydantic.py:2)" not in own
    packed = tmp_path / "profile.txt.gz"
    packed.write_bytes(gzip.compress(RAW.encode()))
    assert read_stacks(packed) == read_stacks(path)


def test_main_prints_shares_and_refuses_an_empty_profile(tmp_path, capsys):
    path = tmp_path / "profile.txt"
    path.write_text(RAW)
    main([str(path), "--top", "2"])
    out = capsys.readouterr().out
    assert "60.0%  forward (torch/nn.py:5)" in out and "100.0%  main (app.py:1)" in out
    (tmp_path / "empty.txt").write_text("")
    with pytest.raises(SystemExit, match="no samples"):
        main([str(tmp_path / "empty.txt")])
