"""Tests of the mlexp core: data lookup and checks, tokenizer and batches, transformer parts, training, plots."""
import hashlib
import math
import os
from pathlib import Path

import pytest
import torch

from mlexp import data as D
from mlexp.train import count_params, train_lm
from mlexp.transformer import Attention, RMSNorm, SwiGLU, TinyLM, apply_rope, attention_lm, rope_cache

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


# --------------------------------------------------------------------------------------------
# Transformer parts
# --------------------------------------------------------------------------------------------


def test_rmsnorm_and_swiglu_shapes():
    x = torch.randn(2, 5, 8)
    y = RMSNorm(8)(x)
    assert torch.allclose(y.pow(2).mean(-1), torch.ones(2, 5), atol=1e-4)
    ffn = SwiGLU(8, 24)
    assert ffn(x).shape == x.shape and count_params(ffn) == 3 * 8 * 24


def test_rope_preserves_norms():
    cos, sin = rope_cache(32, 16, dtype=torch.float64)
    x = torch.randn(2, 3, 32, 16, dtype=torch.float64)
    out = apply_rope(x, cos, sin)
    assert torch.allclose(out.norm(dim=-1), x.norm(dim=-1))
    assert torch.allclose(out[:, :, 0], x[:, :, 0])  # position 0 is not rotated
    assert not torch.allclose(out[:, :, 1:], x[:, :, 1:])


def test_rope_scores_depend_only_on_relative_position():
    torch.manual_seed(0)
    D_ = 16
    cos, sin = rope_cache(64, D_, dtype=torch.float64)
    q, k = torch.randn(D_, dtype=torch.float64), torch.randn(D_, dtype=torch.float64)

    def score(m, n):  # q at position m, k at position n
        qm = apply_rope(q.expand(1, 1, 1, D_), cos, sin, offset=m)
        kn = apply_rope(k.expand(1, 1, 1, D_), cos, sin, offset=n)
        return (qm * kn).sum().item()

    for m, n in [(5, 2), (20, 10), (40, 3)]:
        shifted = [score(m + s, n + s) for s in (0, 7, 19)]
        assert shifted == pytest.approx([shifted[0]] * 3, abs=1e-9)
    assert score(5, 2) != pytest.approx(score(5, 4), abs=1e-6)
    with pytest.raises(ValueError, match="positions"):
        apply_rope(torch.randn(1, 1, 8, D_), cos, sin, offset=60)


def test_gqa_shapes_params_and_causality():
    torch.manual_seed(0)
    dim, T = 32, 12
    x = torch.randn(2, T, dim)
    for n_kv in (4, 2, 1):
        attn = Attention(dim, n_heads=4, n_kv_heads=n_kv)
        assert attn(x).shape == x.shape
        head_dim = dim // 4
        assert count_params(attn) == 2 * dim * dim + 2 * dim * n_kv * head_dim
        # causal: changing the future never changes the past
        x2 = x.clone()
        x2[:, 7:] = torch.randn(2, T - 7, dim)
        out, out2 = attn(x), attn(x2)
        assert torch.allclose(out[:, :7], out2[:, :7], atol=1e-6)
        assert not torch.allclose(out[:, 7:], out2[:, 7:])
    with pytest.raises(ValueError, match="multiple of n_kv_heads"):
        Attention(dim, n_heads=4, n_kv_heads=3)


def test_gqa_equals_mha_with_repeated_kv_weights():
    """A GQA layer computes what an MHA layer does whose kv heads are copies, group by group."""
    torch.manual_seed(0)
    dim, hd = 32, 8
    gqa, mha = Attention(dim, 4, n_kv_heads=2), Attention(dim, 4)
    with torch.no_grad():
        for name in ("q_proj", "o_proj"):
            getattr(mha, name).weight.copy_(getattr(gqa, name).weight)
        for name in ("k_proj", "v_proj"):  # kv head j serves query heads 2j and 2j+1
            w = getattr(gqa, name).weight.view(2, hd, dim)
            getattr(mha, name).weight.copy_(w.repeat_interleave(2, dim=0).reshape(4 * hd, dim))
    x = torch.randn(3, 10, dim)
    assert torch.allclose(gqa(x), mha(x), atol=1e-6)


def test_tiny_lm_parameter_count_and_errors():
    model = attention_lm(65)
    assert count_params(model) == 204_992  # lesson 00: "~205k parameters"
    assert model(torch.zeros(2, 9, dtype=torch.long)).shape == (2, 9, 65)
    with pytest.raises(ValueError, match="batch dimension"):
        model(torch.zeros(9, dtype=torch.long))
    with pytest.raises(ValueError, match="max_len"):
        attention_lm(65, max_len=8)(torch.zeros(1, 9, dtype=torch.long))
    sample = attention_lm(65, max_len=8).generate(torch.zeros(1, 3, dtype=torch.long), 10,
                                                  generator=torch.Generator().manual_seed(0))
    assert sample.shape == (1, 13) and sample.dtype == torch.long and int(sample.max()) < 65
    custom = TinyLM(10, 16, 2, lambda i: torch.nn.Identity(), ffn_hidden=8)
    assert count_params(custom) == 10 * 16 * 2 + 16 * 5 + 2 * 3 * 16 * 8


# --------------------------------------------------------------------------------------------
# Training and plotting
# --------------------------------------------------------------------------------------------


def _tiny_run(seed):
    torch.manual_seed(123)
    model = attention_lm(vocab_size=5, dim=16, n_layers=1, n_heads=2, max_len=16)
    ids = torch.tensor([0, 1, 2, 3, 4] * 100)  # a cycle: perfectly predictable
    return train_lm(model, ids[:400], ids[400:], steps=20, block_size=8, batch_size=8, lr=1e-2,
                    eval_every=10, eval_batches=2, seed=seed, device="cpu", log=False)


def test_train_lm_learns_and_is_reproducible():
    h1, h2, h3 = _tiny_run(0), _tiny_run(0), _tiny_run(1)
    assert h1["step"] == [0, 10, 20]
    assert set(h1) >= {"step", "train_loss", "val_loss"}
    assert all(type(v) is float for v in h1["val_loss"] + h1["train_loss"])
    assert h1["val_loss"][0] > math.log(5) - 0.5  # starts near chance
    assert h1["val_loss"][-1] < 0.5 * h1["val_loss"][0]
    assert h1["train_loss"] == h2["train_loss"] and h1["val_loss"] == h2["val_loss"]
    assert h1["val_loss"] != h3["val_loss"]  # the seed matters


def test_train_lm_rejects_bad_inputs():
    model = attention_lm(vocab_size=5, dim=16, n_layers=1, n_heads=2)
    with pytest.raises(ValueError, match="1-D integer"):
        train_lm(model, torch.randn(100), torch.arange(50) % 5, steps=1, log=False)
    flat = torch.nn.Sequential(torch.nn.Embedding(5, 5), torch.nn.Flatten())  # (B, T) -> (B, T*5)
    ids = torch.arange(50) % 5
    with pytest.raises(ValueError, match=r"\(B, T, vocab_size\)"):
        train_lm(flat, ids, ids, steps=1, block_size=4, eval_batches=1, log=False)


def test_plot_histories_returns_axes():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from mlexp.plot import plot_histories, setup_style

    setup_style()
    hist = {"step": [0, 10], "train_loss": [2.0, 1.0], "val_loss": [2.1, 1.2]}
    ax = plot_histories({"a": hist, "b": hist}, "two runs")
    assert isinstance(ax, matplotlib.axes.Axes) and ax.get_title() == "two runs"
    assert len(ax.lines) == 4  # val + train per run
    fig, given = plt.subplots()
    assert plot_histories({"a": hist}, "given axes", ax=given) is given
    with pytest.raises(TypeError, match="dict name -> history"):
        plot_histories(hist, "one history")
    plt.close("all")
