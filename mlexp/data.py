"""Corpora and tokenizers: TinyShakespeare (found, verified, cached), a character tokenizer, batches."""
import hashlib
import os
import tempfile
import urllib.request
import warnings
from pathlib import Path

import numpy as np
import torch

__all__ = [
    "TINYSHAKESPEARE_URL",
    "TINYSHAKESPEARE_SHA256",
    "TINYSHAKESPEARE_BYTES",
    "CorpusError",
    "CorpusUnavailableError",
    "CorpusChecksumError",
    "cache_dir",
    "find_tinyshakespeare",
    "load_tinyshakespeare",
    "CharTokenizer",
    "load_char_corpus",
    "get_batch",
]

# Karpathy's char-rnn copy of TinyShakespeare (40,000 lines of Shakespeare, 65 distinct characters).
TINYSHAKESPEARE_URL = (
    "https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt"
)
TINYSHAKESPEARE_SHA256 = "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed"
TINYSHAKESPEARE_BYTES = 1_115_394
FILENAME = "tinyshakespeare.txt"
DATA_DIR_ENV = "MLEXP_DATA_DIR"


class CorpusError(RuntimeError):
    """Base class for problems finding or verifying a corpus file."""


class CorpusUnavailableError(CorpusError, FileNotFoundError):
    """No verified copy of the corpus was found and it could not be downloaded."""


class CorpusChecksumError(CorpusError):
    """A corpus file exists but its bytes are not the expected ones (SHA-256 mismatch)."""


# ---------------------------------------------------------------------------------------------
# Finding the file: $MLEXP_DATA_DIR, then the user cache, then a verified download.
# ---------------------------------------------------------------------------------------------


def cache_dir() -> Path:
    """The user cache for mlexp: ``$XDG_CACHE_HOME/mlexp`` if that variable is set, else ``~/.cache/mlexp``."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "mlexp"


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _describe_mismatch(path, data: bytes) -> str:
    return (
        f"{path} has {len(data):,} bytes and SHA-256 {_sha256(data)}, expected "
        f"{TINYSHAKESPEARE_BYTES:,} bytes and SHA-256 {TINYSHAKESPEARE_SHA256}"
    )


def _download(url: str, timeout: float) -> bytes:
    """Fetch ``url`` and return its bytes (a separate function so tests can replace it)."""
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return response.read()


def _write_atomically(path: Path, data: bytes) -> None:
    """Write to a temporary file next to ``path``, then rename: readers never see half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".", suffix=".part")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


def find_tinyshakespeare(download: bool = True, timeout: float = 30.0) -> Path:
    """Return the path of a verified copy of TinyShakespeare, downloading it once if needed.

    Looks, in this order, at:
      1. ``$MLEXP_DATA_DIR/tinyshakespeare.txt`` when the environment variable is set;
      2. the user cache, ``cache_dir() / "tinyshakespeare.txt"``;
      3. a download from ``TINYSHAKESPEARE_URL`` (only if ``download``), written to the cache
         atomically and only after its SHA-256 matches.
    Every file is checked against ``TINYSHAKESPEARE_SHA256`` (1,115,394 bytes) before use.

    Args:
        download: allow step 3. ``timeout`` is in seconds, for the download only.

    Raises:
        CorpusChecksumError: the file in ``$MLEXP_DATA_DIR`` exists but has other bytes. That
            directory was chosen on purpose, so a wrong file there is an error, never skipped.
        CorpusUnavailableError (a FileNotFoundError and RuntimeError): nothing verified was
            found and the download failed or was off; the message lists each place tried.

    A wrong file in the cache is reported with a warning and replaced by a verified download.
    Source: Karpathy's char-rnn repository (data/tinyshakespeare/input.txt).
    """
    tried = []

    data_dir = os.environ.get(DATA_DIR_ENV)
    if data_dir:
        path = Path(data_dir).expanduser() / FILENAME
        if path.is_file():
            data = path.read_bytes()
            if _sha256(data) != TINYSHAKESPEARE_SHA256:
                raise CorpusChecksumError(
                    f"{_describe_mismatch(path, data)}. Replace it with the original file from "
                    f"{TINYSHAKESPEARE_URL}, or unset {DATA_DIR_ENV} to use the user cache."
                )
            return path
        tried.append(f"${DATA_DIR_ENV}: no file {path}")
    else:
        tried.append(f"${DATA_DIR_ENV}: not set")

    cached = cache_dir() / FILENAME
    if cached.is_file():
        data = cached.read_bytes()
        if _sha256(data) == TINYSHAKESPEARE_SHA256:
            return cached
        message = f"ignoring the cached copy: {_describe_mismatch(cached, data)}"
        warnings.warn(message + "; it will be replaced by a verified download.", stacklevel=2)
        tried.append(f"user cache: {message}")
    else:
        tried.append(f"user cache: no file {cached}")

    if not download:
        tried.append("download: switched off (download=False)")
    else:
        try:
            data = _download(TINYSHAKESPEARE_URL, timeout)
        except Exception as exc:  # any network failure: report it with the rest
            tried.append(f"download from {TINYSHAKESPEARE_URL}: failed ({type(exc).__name__}: {exc})")
        else:
            if _sha256(data) == TINYSHAKESPEARE_SHA256:
                _write_atomically(cached, data)
                return cached
            tried.append(
                f"download from {TINYSHAKESPEARE_URL}: rejected, "
                f"{_describe_mismatch('the downloaded file', data)}; nothing was written"
            )

    raise CorpusUnavailableError(
        "Could not find a verified copy of TinyShakespeare. Tried:\n  - "
        + "\n  - ".join(tried)
        + f"\nTo fix: download {TINYSHAKESPEARE_URL} on a machine with internet access, save it as "
        f"{FILENAME} in a folder, and set {DATA_DIR_ENV} to that folder (or copy it to {cached})."
    )


def load_tinyshakespeare(download: bool = True) -> str:
    """Return the TinyShakespeare text (1,115,394 ASCII characters). Raises as ``find_tinyshakespeare``."""
    return find_tinyshakespeare(download=download).read_text(encoding="utf-8")


# ---------------------------------------------------------------------------------------------
# Characters <-> integer ids, and random training windows.
# ---------------------------------------------------------------------------------------------


class CharTokenizer:
    """One token per distinct character of a text; ids follow the sorted order of the characters.

    ``encode(str) -> LongTensor (N,)`` and ``decode(ids) -> str`` are inverses for any text
    made of known characters. ``vocab_size`` is the number of distinct characters (65 for
    TinyShakespeare). Encoding a character the text did not contain raises ``ValueError``.
    """

    def __init__(self, text: str):
        if not text:
            raise ValueError("CharTokenizer needs a non-empty text to collect its characters from.")
        self.chars = sorted(set(text))
        self.stoi = {ch: i for i, ch in enumerate(self.chars)}
        # Sorted code points let encode() look up a whole string at once with searchsorted.
        self._codes = np.array([ord(ch) for ch in self.chars], dtype=np.uint32)

    @property
    def vocab_size(self) -> int:
        return len(self.chars)

    def encode(self, text: str) -> torch.Tensor:
        """Map a string of N characters to a LongTensor of N ids in [0, vocab_size)."""
        codes = np.frombuffer(text.encode("utf-32-le"), dtype="<u4")  # (N,) Unicode code points
        ids = np.searchsorted(self._codes, codes).clip(max=self.vocab_size - 1)
        unknown = self._codes[ids] != codes
        if unknown.any():
            missing = sorted({chr(c) for c in codes[unknown]})
            raise ValueError(
                f"Characters not in the tokenizer's vocabulary: {missing!r}. Build the "
                "CharTokenizer from a text that contains them."
            )
        return torch.from_numpy(ids.astype(np.int64))

    def decode(self, ids) -> str:
        """Map a sequence of ids (list, 1-D tensor or array) back to a string."""
        if isinstance(ids, torch.Tensor):
            ids = ids.tolist()
        try:
            return "".join(self.chars[i] for i in ids)
        except (IndexError, TypeError):
            raise ValueError(
                f"decode expects a flat sequence of ids in [0, {self.vocab_size}); "
                "decode one row of a batch at a time."
            ) from None

    def __repr__(self) -> str:
        return f"CharTokenizer(vocab_size={self.vocab_size})"


def load_char_corpus(val_fraction: float = 0.1, download: bool = True):
    """TinyShakespeare as character ids, split into a training and a validation part.

    Returns ``(tok, train_ids, val_ids)``: a CharTokenizer (vocab_size 65) and two 1-D
    LongTensors; the last ``val_fraction`` of the text (a contiguous tail, so no window straddles
    both parts) is validation. With 0.1: 1,003,855 training and 111,539 validation characters.

    Raises ``ValueError`` for ``val_fraction`` outside (0, 1), and the errors of
    ``find_tinyshakespeare`` when the file cannot be found or verified.
    """
    if not 0.0 < val_fraction < 1.0:
        raise ValueError(f"val_fraction must be between 0 and 1 (exclusive), got {val_fraction}.")
    text = load_tinyshakespeare(download=download)
    tok = CharTokenizer(text)
    ids = tok.encode(text)  # (N,) int64
    n_train = len(ids) - int(len(ids) * val_fraction)
    return tok, ids[:n_train], ids[n_train:]


def get_batch(ids, batch_size: int, block_size: int, generator=None, device=None):
    """Sample ``batch_size`` random windows of ``block_size`` tokens and their next-token targets.

    Args:
        ids: 1-D LongTensor of token ids, longer than ``block_size``.
        generator: an optional ``torch.Generator`` (on the CPU) for reproducible batches.
        device: where to put the result (default: the device of ``ids``).

    Returns:
        ``(x, y)``, two LongTensors of shape (batch_size, block_size) with
        ``y[b, t] == x[b, t + 1]``: y is x shifted one token left.

    Raises ``ValueError`` for a non 1-D or non-integer ``ids`` or one too short for the window.
    """
    if not isinstance(ids, torch.Tensor) or ids.dim() != 1 or ids.is_floating_point():
        raise ValueError("get_batch expects ids as a 1-D integer tensor, e.g. from tok.encode(text).")
    if len(ids) <= block_size:
        raise ValueError(
            f"ids has {len(ids)} tokens, too few for windows of block_size={block_size} plus one "
            "target; use a smaller block_size or more text."
        )
    starts = torch.randint(len(ids) - block_size, (batch_size,), generator=generator)  # (B,)
    offsets = (starts[:, None] + torch.arange(block_size)).to(ids.device)  # (B, T)
    x, y = ids[offsets], ids[offsets + 1]  # (B, T) each
    device = ids.device if device is None else device
    return x.to(device), y.to(device)
