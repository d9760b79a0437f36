"""Your own data for the language models: text, token shards, ArrayRecord.

``--data PATH`` (any value that is not a corpus name of
`jaxnorm.training.data`) names one of:

* a text file, or a folder of text files (every file below it whose path
  has no part starting with ``.``, in sorted order, concatenated): read as
  bytes, vocabulary 256; validation is the last `VAL_FRACTION` of the bytes;
* a folder of token shards ``train*.bin`` and ``val*.bin``: header-less
  little-endian token ids, nanoGPT's layout, with ``--vocab-size N``;
* a folder of ArrayRecord files ``train*.array_record`` and
  ``val*.array_record`` (needs the ``array-record`` package), each record
  one token sequence in the same raw little-endian form.

Token ids are ``uint16`` (``--token-dtype auto`` with ``--vocab-size`` up to
65536) or ``uint32``. Shards and records are read where they lie
(`numpy.memmap`, grain's ``ArrayRecordDataSource``), opened lazily, so
grain's worker processes reopen them instead of receiving their bytes.
Training windows are those of `jaxnorm.training.data.TokenWindows`: within
one shard or record, never across two.

`check` refuses what the file system alone shows (a missing path, a folder
with no data, an empty file, a shard whose size is not a whole number of
tokens, a missing ``--vocab-size``); `load` reads every token once, refusing
a token >= ``--vocab-size`` and a split shorter than one batch, and counts
the unigrams of the baseline. Every refusal is one line that names the path
and the fix, raised before the model is built.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import pathlib
from collections.abc import Sequence
from typing import Any, Literal

import numpy as np

from jaxnorm.training import data as data_lib

Kind = Literal["text", "shards", "array_record"]
VAL_FRACTION = 0.05
TOKEN_DTYPES: tuple[str, ...] = ("auto", "uint16", "uint32")
# Tokens counted per step of the validating scan (bounds its memory).
_CHUNK = 1 << 22
_SUFFIX = {"shards": ".bin", "array_record": ".array_record"}
_ARRAY_RECORD_INSTALL = "pip install array-record"


def _error(path: Any, problem: str, fix: str) -> ValueError:
  return ValueError(f"--data {path}: {problem}; {fix}")


def token_dtype(name: str, vocab_size: int) -> np.dtype:
  """The little-endian dtype of ``--token-dtype name`` (``auto``: by vocab)."""
  if name == "auto":
    name = "uint16" if vocab_size <= 1 << 16 else "uint32"
  return np.dtype(name).newbyteorder("<")


def _text_files(path: pathlib.Path) -> list[pathlib.Path]:
  if path.is_file():
    return [path]
  return [
    p
    for p in sorted(path.rglob("*"))
    if p.is_file()
    and not any(part.startswith(".") for part in p.relative_to(path).parts)
  ]


def kind(path: str | pathlib.Path) -> Kind:
  """What ``path`` holds: ``text``, token ``shards`` or ``array_record``."""
  path = pathlib.Path(path)
  if path.is_dir():
    names = [p.name for p in path.iterdir() if p.is_file()]
    if any(n.startswith("train") and n.endswith(".bin") for n in names):
      return "shards"
    if any(n.endswith(".array_record") for n in names):
      return "array_record"
  return "text"


def _splits(
  path: pathlib.Path, kind_: Kind
) -> tuple[list[pathlib.Path], list[pathlib.Path]]:
  suffix = _SUFFIX[kind_]
  files = sorted(p for p in path.iterdir() if p.is_file())
  train = [p for p in files if p.name.startswith("train")]
  val = [p for p in files if p.name.startswith("val")]
  train = [p for p in train if p.name.endswith(suffix)]
  val = [p for p in val if p.name.endswith(suffix)]
  for split, found in (("train", train), ("val", val)):
    if not found:
      raise _error(
        path,
        f"a folder of {suffix} token files needs train*{suffix} and "
        f"val*{suffix}, and has no {split}*{suffix}",
        f"add the {split} split (nanoGPT's prepare.py writes train.bin and "
        f"val.bin)",
      )
  return train, val


def _check_nonempty(path: pathlib.Path, files: Sequence[pathlib.Path]) -> None:
  if not files:
    raise _error(
      path,
      "the folder holds no files",
      "put text files in it, or token shards train*.bin and val*.bin",
    )
  for f in files:
    if f.stat().st_size == 0:
      raise _error(
        f, "the file is empty (0 bytes)", "remove it or write its data"
      )


def check(
  path: str | pathlib.Path, *, vocab_size: int, dtype_name: str
) -> Kind:
  """Checks what the file system shows about ``path`` (nothing is read).

  Args:
    path: a file or folder.
    vocab_size: ``--vocab-size`` (0: the data's own, 256 for text).
    dtype_name: ``--token-dtype``.

  Returns:
    The data's kind.

  Raises:
    ValueError: one line naming the path, the problem and the fix.
  """
  path = pathlib.Path(path)
  if not path.exists():
    raise _error(
      path,
      "no such file or folder",
      "give a text file or folder, or a folder of token shards",
    )
  kind_ = kind(path)
  if kind_ == "text":
    _check_nonempty(path, _text_files(path))
    if vocab_size not in (0, data_lib.BYTE_VOCAB):
      raise _error(
        path,
        f"text is read as bytes (vocabulary {data_lib.BYTE_VOCAB}), got "
        f"--vocab-size {vocab_size}",
        "drop --vocab-size, or give a folder of token shards "
        "train*.bin/val*.bin for another vocabulary",
      )
    return kind_
  if (
    kind_ == "array_record" and importlib.util.find_spec("array_record") is None
  ):
    raise _error(
      path,
      "ArrayRecord files need the array-record package, which is not installed",
      f"run `{_ARRAY_RECORD_INSTALL}`",
    )
  train, val = _splits(path, kind_)
  if vocab_size <= 0:
    raise _error(
      path,
      f"a folder of token files (train*{_SUFFIX[kind_]}) needs the "
      f"vocabulary size, got --vocab-size {vocab_size}",
      "pass --vocab-size N, the tokenizer's (50257 for GPT-2)",
    )
  if dtype_name == "uint16" and vocab_size > 1 << 16:
    raise _error(
      path,
      f"--token-dtype uint16 holds ids below 65536 but --vocab-size is "
      f"{vocab_size}",
      "pass --token-dtype uint32 (or auto)",
    )
  _check_nonempty(path, train + val)
  if kind_ == "shards":
    dtype = token_dtype(dtype_name, vocab_size)
    for f in train + val:
      size = f.stat().st_size
      if size % dtype.itemsize:
        raise _error(
          f,
          f"the shard is {size} bytes, not a whole number of {dtype.name} "
          f"tokens ({dtype.itemsize} bytes each)",
          "it is truncated or holds another dtype: rewrite it, or pass "
          "the --token-dtype it was written with",
        )
  return kind_


class ShardReader:
  """Header-less token shards as segments, memory-mapped on first use."""

  def __init__(self, paths: Sequence[pathlib.Path], dtype: np.dtype):
    self.paths = [str(p) for p in paths]
    self.dtype = dtype
    self.lengths = np.array(
      [pathlib.Path(p).stat().st_size // dtype.itemsize for p in self.paths],
      np.int64,
    )
    self._maps: dict[int, np.ndarray] = {}

  def __getstate__(self) -> dict[str, Any]:
    return {**self.__dict__, "_maps": {}}

  def array(self, segment: int) -> np.ndarray:
    """The whole of shard ``segment`` (a read-only memory map)."""
    if segment not in self._maps:
      self._maps[segment] = np.memmap(self.paths[segment], self.dtype, mode="r")
    return self._maps[segment]

  def read(self, segment: int, start: int, stop: int) -> np.ndarray:
    """Tokens ``start:stop`` of shard ``segment``."""
    return self.array(segment)[start:stop]


class RecordReader:
  """ArrayRecord records of raw token ids as segments, opened lazily."""

  def __init__(
    self,
    paths: Sequence[pathlib.Path],
    dtype: np.dtype,
    lengths: np.ndarray,
  ):
    self.paths = [str(p) for p in paths]
    self.dtype = dtype
    self.lengths = lengths
    self._source = None

  def __getstate__(self) -> dict[str, Any]:
    return {**self.__dict__, "_source": None}

  def read(self, segment: int, start: int, stop: int) -> np.ndarray:
    """Tokens ``start:stop`` of record ``segment`` (over all files)."""
    if self._source is None:
      import grain

      self._source = grain.sources.ArrayRecordDataSource(self.paths)
    return np.frombuffer(self._source[segment], self.dtype)[start:stop]


@dataclasses.dataclass(frozen=True)
class TokenCorpus:
  """Training and validation windows of one ``--data PATH``."""

  train: data_lib.TokenWindows
  val: data_lib.TokenWindows
  vocab_size: int
  baseline: float
  path: str


def _count(
  counts: np.ndarray, tokens: np.ndarray, vocab_size: int, where: Any
) -> None:
  """Adds ``tokens``' unigram counts; refuses an id >= ``vocab_size``."""
  for lo in range(0, len(tokens), _CHUNK):
    chunk = np.asarray(tokens[lo : lo + _CHUNK])
    found = np.bincount(chunk, minlength=vocab_size)
    if len(found) > vocab_size:
      at = lo + int(np.flatnonzero(chunk >= vocab_size)[0])
      raise _error(
        where,
        f"token {int(chunk[at - lo])} at position {at} is >= --vocab-size "
        f"{vocab_size}",
        f"pass the tokenizer's vocabulary size (more than "
        f"{int(chunk.max())}), or the --token-dtype the data was written "
        f"with",
      )
    counts += found


def _unigram_entropy(train: np.ndarray, val: np.ndarray) -> float:
  """Nats per validation token under add-one smoothed train unigrams."""
  logp = np.log((train + 1.0) / (train.sum() + len(train)))
  return float(-(val * logp).sum() / val.sum())


def _shards(files, dtype, vocab_size, counts):
  reader = ShardReader(files, dtype)
  for i, f in enumerate(files):
    _count(counts, reader.array(i), vocab_size, f)
  return reader


def _records(files, dtype, vocab_size, counts):
  import grain

  lengths = []
  for f in files:
    source = grain.sources.ArrayRecordDataSource([str(f)])
    for i in range(len(source)):
      raw = source[i]
      if len(raw) % dtype.itemsize:
        raise _error(
          f,
          f"record {i} is {len(raw)} bytes, not a whole number of "
          f"{dtype.name} tokens",
          "write each record as the raw bytes of a token array, or pass "
          "the --token-dtype it was written with",
        )
      tokens = np.frombuffer(raw, dtype)
      _count(counts, tokens, vocab_size, f"{f} (record {i})")
      lengths.append(len(tokens))
  return RecordReader(files, dtype, np.array(lengths, np.int64))


def _enough(
  where: Any, windows: data_lib.TokenWindows, tokens: int, batch_size: int
) -> None:
  if len(windows) < batch_size:
    raise _error(
      where,
      f"{tokens} tokens give {len(windows)} windows of --seq-len "
      f"{windows.seq_len} + 1, fewer than one batch of --batch-size "
      f"{batch_size}",
      "add data, or lower --batch-size or --seq-len",
    )


def load_text(path: str | pathlib.Path) -> data_lib.TextSplits:
  """The bytes of a text file or folder, split into train and validation."""
  path = pathlib.Path(path)
  tokens = np.concatenate([np.fromfile(f, np.uint8) for f in _text_files(path)])
  cut = int(len(tokens) * (1 - VAL_FRACTION))
  return data_lib.TextSplits(tokens[:cut], tokens[cut:], str(path))


def load(
  path: str | pathlib.Path,
  *,
  seq_len: int,
  batch_size: int,
  vocab_size: int,
  dtype_name: str,
) -> TokenCorpus:
  """Reads and checks ``--data PATH`` (see the module docstring).

  Args:
    path: a text file or folder, or a folder of token files.
    seq_len: tokens per input window.
    batch_size: the global batch size; each split must fill one batch.
    vocab_size: ``--vocab-size`` (0 for text).
    dtype_name: ``--token-dtype``.

  Returns:
    The windows of both splits, the vocabulary and the unigram baseline.

  Raises:
    ValueError: one line naming the path, the problem and the fix.
  """
  path = pathlib.Path(path)
  kind_ = check(path, vocab_size=vocab_size, dtype_name=dtype_name)
  if kind_ == "text":
    text = load_text(path)
    splits = {}
    for name, tokens in (("train", text.train), ("val", text.val)):
      splits[name] = data_lib.TokenWindows(
        data_lib.ArrayReader([tokens]), seq_len
      )
      part = "the first 95%" if name == "train" else "the last 5%"
      _enough(
        f"{path} ({part}, the {name} split)",
        splits[name],
        len(tokens),
        batch_size,
      )
    return TokenCorpus(
      splits["train"],
      splits["val"],
      data_lib.BYTE_VOCAB,
      text.unigram_entropy(),
      str(path),
    )
  dtype = token_dtype(dtype_name, vocab_size)
  read = _shards if kind_ == "shards" else _records
  splits, counts = {}, {}
  for name, files in zip(("train", "val"), _splits(path, kind_)):
    counts[name] = np.zeros(vocab_size, np.int64)
    reader = read(files, dtype, vocab_size, counts[name])
    splits[name] = data_lib.TokenWindows(reader, seq_len)
    _enough(
      f"{path} ({name}*{_SUFFIX[kind_]})",
      splits[name],
      int(reader.lengths.sum()),
      batch_size,
    )
  return TokenCorpus(
    splits["train"],
    splits["val"],
    vocab_size,
    _unigram_entropy(counts["train"], counts["val"]),
    str(path),
  )
