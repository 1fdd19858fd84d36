"""scripts/lm_ablation.py: its table round-trips, reruns keep other rows, and the committed table
(read by lesson 00) has one parseable row per setting with gaps that match its losses."""
import importlib.util
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
spec = importlib.util.spec_from_file_location("lm_ablation", REPO / "scripts" / "lm_ablation.py")
lm_ablation = importlib.util.module_from_spec(spec)
spec.loader.exec_module(lm_ablation)


def test_committed_table_is_consistent():
    for folder in ("solutions", "lessons"):
        path = REPO / folder / "00_token_mixing" / "lm_ablation.md"
        table = lm_ablation.read_table(path)
        assert lm_ablation.format_table(table) + "\n" == path.read_text(), "not as the script writes it"
        assert set(table) == set(lm_ablation.SETTINGS), folder
        for name, r in table.items():
            for other in ("LSTM", "attention"):
                gap = float(r[other]) - float(r["conv"])
                assert abs(gap - float(r[f"{other} - conv"])) <= 0.0015, (name, other)


def test_rerun_replaces_its_rows_and_keeps_the_others(tmp_path, monkeypatch, capsys):
    losses = {"conv": 1.5, "LSTM": 1.75, "attention": 2.0}
    monkeypatch.setattr(lm_ablation, "run", lambda mixer, setting, seed, data: losses[mixer] + seed / 100)
    monkeypatch.setattr(lm_ablation, "load_char_corpus", lambda: None)
    out = tmp_path / "t.md"
    for argv in (["--seeds", "0", "--settings", "lr 1e-3", "batch 16"],
                 ["--seeds", "0", "2", "--settings", "batch 16"]):
        monkeypatch.setattr(sys, "argv", ["lm_ablation.py", *argv, "--out", str(out)])
        lm_ablation.main()
    table = lm_ablation.read_table(out)
    assert list(table) == ["lr 1e-3", "batch 16"]                   # SETTINGS order, both kept
    assert table["lr 1e-3"]["seeds"] == "0" and table["lr 1e-3"]["conv"] == "1.500"
    assert table["batch 16"]["seeds"] == "0 2" and table["batch 16"]["conv"] == "1.510"
    assert table["batch 16"]["attention - conv"] == "+0.500"


def test_unknown_setting_is_refused(monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["lm_ablation.py", "--settings", "lr 5"])
    with pytest.raises(SystemExit):
        lm_ablation.main()
    assert "unknown settings" in capsys.readouterr().err
