"""``recserve pipeline``: exports a pipeline; a mismatch is one line on stderr and exit code 2."""

from __future__ import annotations

import json

from recserve.cli import main


def test_pipeline_command_exports_and_refuses_in_one_line(pipeline_dir, tmp_path, capsys):
    stages = ["--retrieval", str(pipeline_dir / "retrieval"), "--ranking", str(pipeline_dir / "ranking")]
    catalogue = ["--catalogue", str(pipeline_dir.parent / "items.tsv")]
    out = tmp_path / "pipe"
    assert main(["pipeline", *stages, *catalogue, "--out", str(out), "--top-k", "5", "--max-k", "20"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["items"] == 300 and printed["index"]["type"] == "flat"
    assert json.loads((out / "manifest.json").read_text())["limits"]["top_k"] == 5
    code = main(["pipeline", *stages, *catalogue, "--out", str(tmp_path / "p2"), "--user-dense", "3"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "\n" not in err
    assert err.startswith("recserve pipeline: error: ranking: dense_in_features 3") and "not 3" in err
