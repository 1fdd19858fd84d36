"""Tests of mlexp.data: finding and checking TinyShakespeare, the tokenizer and batches."""
import hashlib
import os
from pathlib import Path

import pytest
import torch

from mlexp import data as D

# The test copy of the real file: $MLEXP_DATA_DIR when set (CI), else ../shared/data next to the repo.
SHARED_DATA = Path(os.environ.get("MLEXP_DATA_DIR") or Path(__file__).resolve().parents[2] / "shared" / "data")
FAKE_TEXT = b"To be, or not to be, that is the question.\n" * 40


# --------------------------------------------------------------------------------------------
# Finding TinyShakespeare. A small fake corpus stands in for the real one: the tests patch the
# expected hash and size to the fake's, so every branch runs without network or the 1 MB file.
# --------------------------------------------------------------------------------------------


@pytest.fixture
def fake_corpus(tmp_path, monkeypatch):
    """Point the cache into tmp_path, unset MLEXP_DATA_DIR, expect FAKE_TEXT, forbid the network."""
    monkeypatch.setattr(D, "TINYSHAKESPEARE_SHA256", hashlib.sha256(FAKE_TEXT).hexdigest())
    monkeypatch.setattr(D, "TINYSHAKESPEARE_BYTES", len(FAKE_TEXT))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv("MLEXP_DATA_DIR", raising=False)
    calls = []

    def no_network(url, timeout):
        calls.append(url)
        raise OSError("network disabled in tests")

    monkeypatch.setattr(D, "_download", no_network)
    return calls


def _write(folder: Path, content: bytes) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / D.FILENAME).write_bytes(content)
    return folder / D.FILENAME


def test_cache_dir_follows_xdg(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert D.cache_dir() == tmp_path / "mlexp"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert D.cache_dir() == Path.home() / ".cache" / "mlexp"


def test_data_dir_wins_over_cache(fake_corpus, tmp_path, monkeypatch):
    _write(D.cache_dir(), FAKE_TEXT)
    env_file = _write(tmp_path / "env", FAKE_TEXT)
    monkeypatch.setenv("MLEXP_DATA_DIR", str(tmp_path / "env"))
    assert D.find_tinyshakespeare() == env_file
    assert fake_corpus == []  # no download attempted


def test_cache_used_when_data_dir_lacks_file(fake_corpus, tmp_path, monkeypatch):
    cached = _write(D.cache_dir(), FAKE_TEXT)
    monkeypatch.setenv("MLEXP_DATA_DIR", str(tmp_path / "empty"))
    assert D.find_tinyshakespeare() == cached
    assert fake_corpus == []


def test_wrong_hash_in_data_dir_is_an_error(fake_corpus, tmp_path, monkeypatch):
    _write(D.cache_dir(), FAKE_TEXT)  # a good cache must not hide the bad explicit file
    bad = _write(tmp_path / "env", FAKE_TEXT[:-1] + b"?")
    monkeypatch.setenv("MLEXP_DATA_DIR", str(tmp_path / "env"))
    with pytest.raises(D.CorpusChecksumError) as info:
        D.find_tinyshakespeare()
    message = str(info.value)
    assert str(bad) in message and "SHA-256" in message and "MLEXP_DATA_DIR" in message
    assert isinstance(info.value, RuntimeError)


def test_download_is_verified_then_cached(fake_corpus, monkeypatch):
    monkeypatch.setattr(D, "_download", lambda url, timeout: FAKE_TEXT)
    path = D.find_tinyshakespeare()
    assert path == D.cache_dir() / D.FILENAME and path.read_bytes() == FAKE_TEXT
    assert [p.name for p in path.parent.iterdir()] == [D.FILENAME]  # no temporary file left


def test_corrupt_cache_warns_and_is_replaced_by_download(fake_corpus, monkeypatch):
    cached = _write(D.cache_dir(), b"truncated")
    monkeypatch.setattr(D, "_download", lambda url, timeout: FAKE_TEXT)
    with pytest.warns(UserWarning, match="SHA-256"):
        assert D.find_tinyshakespeare() == cached
    assert cached.read_bytes() == FAKE_TEXT


def test_bad_download_is_rejected_and_not_written(fake_corpus, monkeypatch):
    monkeypatch.setattr(D, "_download", lambda url, timeout: b"<html>rate limited</html>")
    with pytest.raises(D.CorpusUnavailableError, match="rejected") as info:
        D.find_tinyshakespeare()
    assert isinstance(info.value, FileNotFoundError) and isinstance(info.value, RuntimeError)
    assert not (D.cache_dir() / D.FILENAME).exists()


def test_error_lists_every_place_tried_and_the_fix(fake_corpus, tmp_path, monkeypatch):
    monkeypatch.setenv("MLEXP_DATA_DIR", str(tmp_path / "nowhere"))
    with pytest.raises(D.CorpusUnavailableError) as info:
        D.find_tinyshakespeare()
    message = str(info.value)
    assert str(tmp_path / "nowhere" / D.FILENAME) in message  # MLEXP_DATA_DIR tried
    assert str(D.cache_dir() / D.FILENAME) in message  # cache tried
    assert "network disabled in tests" in message  # download tried, reason given
    assert "set MLEXP_DATA_DIR" in message  # what to do
    assert fake_corpus == [D.TINYSHAKESPEARE_URL]


def test_download_can_be_switched_off(fake_corpus):
    with pytest.raises(D.CorpusUnavailableError, match="download=False"):
        D.find_tinyshakespeare(download=False)
    assert fake_corpus == []


@pytest.mark.skipif(not (SHARED_DATA / D.FILENAME).exists(), reason="shared test copy of TinyShakespeare absent")
def test_real_corpus_split(monkeypatch):
    monkeypatch.setenv("MLEXP_DATA_DIR", str(SHARED_DATA))
    tok, train_ids, val_ids = D.load_char_corpus(val_fraction=0.1)
    assert tok.vocab_size == 65
    assert train_ids.dtype == val_ids.dtype == torch.long
    assert len(train_ids) + len(val_ids) == D.TINYSHAKESPEARE_BYTES
    assert len(val_ids) == int(D.TINYSHAKESPEARE_BYTES * 0.1)
    assert tok.decode(train_ids[:14]) == "First Citizen:"


# --------------------------------------------------------------------------------------------
# Tokenizer and batches
# --------------------------------------------------------------------------------------------


def test_tokenizer_round_trip_and_errors():
    text = "hello, world!\nÄ bientôt"
    tok = D.CharTokenizer(text)
    assert tok.vocab_size == len(set(text))
    ids = tok.encode(text)
    assert ids.dtype == torch.long and ids.shape == (len(text),)
    assert tok.decode(ids) == text and tok.decode(ids.tolist()) == text
    assert tok.encode("lol").tolist() == [tok.stoi["l"], tok.stoi["o"], tok.stoi["l"]]
    with pytest.raises(ValueError, match="'z'"):
        tok.encode("zap")
    with pytest.raises(ValueError):
        D.CharTokenizer("")


def test_get_batch_shapes_and_shift():
    ids = torch.arange(100)
    gen = torch.Generator().manual_seed(0)
    x, y = D.get_batch(ids, batch_size=8, block_size=16, generator=gen)
    assert x.shape == y.shape == (8, 16) and x.dtype == torch.long
    assert torch.equal(y[:, :-1], x[:, 1:])
    assert torch.equal(y, x + 1)  # ids are positions here, so the target is the next position
    x2, _ = D.get_batch(ids, 8, 16, generator=torch.Generator().manual_seed(0))
    assert torch.equal(x, x2)
    with pytest.raises(ValueError, match="block_size"):
        D.get_batch(torch.arange(10), 2, 10)
