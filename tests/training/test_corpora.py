"""Your own data (--data PATH): text, token shards, ArrayRecord; each
process's rows of a batch; every refusal is one line before compiling."""

import dataclasses
import pathlib
import re

import numpy as np
import pytest

from jaxnorm.training import (
  build,
  checkpoints,
  cli,
  config,
  corpora,
  data,
  trainer,
)
from tests.training import runs

SEQ = 16


def _validate(cfg):
  config.validate(cfg, build.registries_for(cfg))


def _shards(folder, train, val, dtype=np.uint16):
  """Writes token shards ``train_NNN.bin`` and ``val.bin`` in ``folder``."""
  folder.mkdir(exist_ok=True)
  for i, tokens in enumerate(train):
    np.asarray(tokens, dtype).tofile(folder / f"train_{i:03d}.bin")
  np.asarray(val, dtype).tofile(folder / "val.bin")
  return folder


def _load(path, **kw):
  options = {"vocab_size": 0, "dtype_name": "auto", **kw}
  return corpora.load(path, seq_len=SEQ, batch_size=4, **options)


def test_text_file_is_bytes_with_the_last_5_percent_for_validation(tmp_path):
  raw = bytes(np.random.default_rng(0).integers(0, 256, 4000, np.uint8))
  (tmp_path / "book.txt").write_bytes(raw)
  corpus = _load(tmp_path / "book.txt")
  assert corpus.vocab_size == 256
  cut = int(len(raw) * 0.95)
  assert bytes(corpus.train[0].astype(np.uint8)) == raw[: SEQ + 1]
  assert bytes(corpus.val[1].astype(np.uint8)) == raw[cut + SEQ :][: SEQ + 1]
  assert len(corpus.train) == (cut - 1) // SEQ
  assert 0 < corpus.baseline < np.log(256) + 0.1


def test_text_folder_concatenates_files_and_skips_hidden_ones(tmp_path):
  (tmp_path / "b").mkdir()
  (tmp_path / ".git").mkdir()
  (tmp_path / "a.txt").write_bytes(b"A" * 600)
  (tmp_path / "b" / "c.md").write_bytes(b"C" * 600)
  (tmp_path / ".git" / "x").write_bytes(b"X" * 600)
  (tmp_path / ".hidden").write_bytes(b"H" * 600)
  text = corpora.load_text(tmp_path)
  both = bytes(np.concatenate([text.train, text.val]))
  assert both == b"A" * 600 + b"C" * 600


def test_token_shards_windows_stay_within_a_shard(tmp_path):
  train = [np.arange(0, 40), np.arange(100, 190)]
  folder = _shards(tmp_path / "tok", train, np.arange(200, 300))
  corpus = _load(folder, vocab_size=500)
  assert corpus.vocab_size == 500
  # (40 - 1) // 16 = 2 windows in the first shard, (90 - 1) // 16 = 5 next.
  assert len(corpus.train) == 7 and len(corpus.val) == 6
  np.testing.assert_array_equal(corpus.train[1], np.arange(16, 33))
  np.testing.assert_array_equal(corpus.train[2], np.arange(100, 117))
  assert corpus.train[2].dtype == np.int32
  # No validation token occurs in training: add-one smoothing gives each
  # a probability 1 / (130 + 500).
  assert corpus.baseline == pytest.approx(np.log(630))


def test_uint32_shards_for_a_large_vocabulary(tmp_path):
  tokens = np.arange(70_000, 70_100)
  folder = _shards(tmp_path / "tok", [tokens], tokens, np.uint32)
  corpus = _load(folder, vocab_size=100_000)
  np.testing.assert_array_equal(corpus.train[0], tokens[: SEQ + 1])


def test_array_record_sequences(tmp_path):
  writer_module = pytest.importorskip("array_record.python.array_record_module")
  records = {
    "train.array_record": [np.arange(40), np.arange(50, 70), np.arange(40)],
    "val.array_record": [np.arange(100, 200)],
  }
  for name, seqs in records.items():
    writer = writer_module.ArrayRecordWriter(
      str(tmp_path / name), "group_size:1"
    )
    for seq in seqs:
      writer.write(np.asarray(seq, np.uint16).tobytes())
    writer.close()
  assert corpora.kind(tmp_path) == "array_record"
  corpus = _load(tmp_path, vocab_size=256)
  assert len(corpus.train) == 5 and len(corpus.val) == 6
  np.testing.assert_array_equal(corpus.train[2], np.arange(50, 67))


def test_missing_path(tmp_path):
  with pytest.raises(ValueError, match=r"nowhere: no such file or folder"):
    _load(tmp_path / "nowhere")


def test_array_record_needs_its_package(tmp_path, monkeypatch):
  (tmp_path / "train.array_record").write_bytes(b"x")
  monkeypatch.setattr(corpora.importlib.util, "find_spec", lambda name: None)
  with pytest.raises(ValueError, match=r"pip install array-record"):
    corpora.check(tmp_path, vocab_size=256, dtype_name="auto")


def _bad(tmp_path):
  """Each bad input: (path, extra config, message)."""
  cases = {}
  cases["empty file"] = (
    tmp_path / "empty.txt",
    {},
    r"empty.txt: the file is "
    r"empty \(0 bytes\); remove it or write its data",
  )
  (tmp_path / "empty.txt").write_bytes(b"")
  (tmp_path / "nothing").mkdir()
  cases["empty folder"] = (tmp_path / "nothing", {}, r"holds no files")
  (tmp_path / "tiny.txt").write_bytes(b"x" * 200)
  cases["short validation"] = (
    tmp_path / "tiny.txt",
    {},
    r"tiny.txt \(the last 5%, the val split\): 10 tokens give 0 windows "
    r"of --seq-len 16 \+ 1, fewer than one batch of --batch-size 8; add "
    r"data, or lower --batch-size or --seq-len",
  )
  cases["text vocab"] = (
    tmp_path / "tiny.txt",
    {"vocab_size": 512},
    r"text is read as bytes \(vocabulary 256\), got --vocab-size 512",
  )
  big = tmp_path / "big"
  _shards(big, [np.arange(600) % 300], np.arange(600) % 7)
  cases["token >= vocab"] = (
    big,
    {"vocab_size": 256},
    r"train_000.bin: token 256 at position 256 is >= --vocab-size 256; "
    r"pass the tokenizer's vocabulary size \(more than 299\)",
  )
  cases["no vocab"] = (
    big,
    {},
    r"needs the vocabulary size, got "
    r"--vocab-size 0; pass --vocab-size N",
  )
  cases["uint16 vocab"] = (
    big,
    {"vocab_size": 70_000, "token_dtype": "uint16"},
    r"--token-dtype uint16 holds ids below 65536",
  )
  odd = _shards(tmp_path / "odd", [np.arange(600)], np.arange(600))
  (odd / "train_000.bin").write_bytes(b"\0" * 1201)
  cases["odd size"] = (
    odd,
    {"vocab_size": 1000},
    r"train_000.bin: the shard is 1201 bytes, not a whole number of uint16 "
    r"tokens \(2 bytes each\)",
  )
  short = _shards(tmp_path / "short", [np.arange(600)], np.arange(100))
  cases["short val shard"] = (
    short,
    {"vocab_size": 1000},
    r"short \(val\*.bin\): 100 tokens give 6 windows .*fewer than one "
    r"batch of --batch-size 8",
  )
  no_val = _shards(tmp_path / "noval", [np.arange(600)], [1])
  (no_val / "val.bin").unlink()
  cases["no val shard"] = (
    no_val,
    {"vocab_size": 1000},
    r"needs train\*.bin and val\*.bin, and has no val\*.bin",
  )
  cases["missing"] = (
    tmp_path / "nowhere",
    {},
    r"--data '\S+nowhere' is not valid; choose one of shakespeare, kjv, "
    r"or the PATH of your own data .*no file or folder \S+nowhere exists",
  )
  return cases


@pytest.mark.parametrize(
  "case",
  [
    "empty file",
    "empty folder",
    "short validation",
    "text vocab",
    "token >= vocab",
    "no vocab",
    "uint16 vocab",
    "odd size",
    "short val shard",
    "no val shard",
    "missing",
  ],
)
def test_bad_input_is_one_line_before_anything_compiles(tmp_path, capsys, case):
  path, changes, match = _bad(tmp_path)[case]
  cfg = runs.tiny(tmp_path / "run", data=str(path), **changes)
  out = pathlib.Path(cfg.out_dir)
  assert cli.train_main(runs.cli_args(cfg)[3:]) == 2
  err = capsys.readouterr().err
  assert err.count("\n") == 1, err
  assert re.search(match, err), err
  assert not list(out.glob("checkpoints/*"))
  assert not (out / "metrics.jsonl").exists()


def test_data_fields_of_named_datasets(tmp_path):
  with pytest.raises(ValueError, match=r"--vocab-size 300 is only for token"):
    _validate(runs.tiny(tmp_path, vocab_size=300))
  with pytest.raises(ValueError, match=r"--token-dtype 'int8' is not valid"):
    _validate(runs.tiny(tmp_path, token_dtype="int8"))
  with pytest.raises(ValueError, match=r"--data-workers must be an integer"):
    _validate(runs.tiny(tmp_path, data_workers=-1))
  with pytest.raises(ValueError, match=r"--data 'x.txt' is not valid"):
    _validate(runs.tiny(tmp_path, model="cnn", data="x.txt", norm="batchnorm"))
  with pytest.raises(ValueError, match=r"--allow-change vocab_size: these"):
    _validate(runs.tiny(tmp_path, allow_change=("vocab_size",)))
  assert "data_workers" in config.RUN_CONTROL
  assert {"vocab_size", "token_dtype"} <= config.STRUCTURAL


def test_process_rows_make_up_each_global_batch():
  tokens = np.random.default_rng(0).integers(0, 256, 3000).astype(np.uint8)
  batches = data.text_windows(tokens, SEQ, batch_size=8, seed=3)
  windows = data.TokenWindows(data.ArrayReader([tokens]), SEQ)
  elements = data.window_elements(windows, seed=3)
  for start in (0, 5 * 8):  # From the start, and resumed at batch 5.
    parts = [
      iter(
        data.process_batches(
          elements, batch_size=8, start=start, rows=rows, workers=0
        )
      )
      for rows in ((0, 2), (2, 6), (6, 8))
    ]
    # 30 batches of 8 cross the epoch boundary (182 windows).
    for b in range(start // 8, start // 8 + 30):
      got = np.concatenate([next(p) for p in parts])
      np.testing.assert_array_equal(got, batches[b], err_msg=str(b))
    for p in parts:
      p.close()
  with pytest.raises(ValueError, match=r"rows \(3, 3\) are not a non-empty"):
    data.process_batches(elements, batch_size=8, start=0, rows=(3, 3))


@pytest.mark.slow
def test_lm_trains_on_token_shards_with_their_vocabulary(tmp_path):
  rng = np.random.default_rng(0)
  folder = _shards(
    tmp_path / "tok",
    [rng.integers(0, 300, 2000), rng.integers(0, 300, 1000)],
    rng.integers(0, 300, 400),
  )
  cfg = runs.tiny(
    tmp_path / "run", data=str(folder), vocab_size=300, steps=2, eval_every=2
  )
  summary = trainer.train(cfg)
  assert summary["steps"] == 2 and np.isfinite(summary["val_loss"])
  # The (tied) embedding follows --vocab-size: 300 rows of width 16.
  byte = trainer.train(
    dataclasses.replace(
      cfg,
      data="shakespeare",
      vocab_size=0,
      steps=1,
      out_dir=str(tmp_path / "bytes"),
    )
  )
  assert summary["params"] - byte["params"] == (300 - 256) * 16
  assert summary["baseline"] == pytest.approx(np.log(300), rel=0.05)
  # More training data: the saved position would pick other windows.
  np.arange(300, dtype=np.uint16).tofile(folder / "train_002.bin")
  before = sorted(p.name for p in pathlib.Path(cfg.out_dir).rglob("*"))
  with pytest.raises(
    checkpoints.CheckpointIncompatibleError,
    match=r"held 186 training examples when it was saved and holds 204 "
    r"now, .*; nothing on disk was changed",
  ):
    trainer.train(cfg)
  assert sorted(p.name for p in pathlib.Path(cfg.out_dir).rglob("*")) == before


@pytest.mark.slow
def test_worker_processes_give_the_in_process_batches():
  tokens = np.random.default_rng(0).integers(0, 256, 3000).astype(np.uint8)
  windows = data.TokenWindows(data.ArrayReader([tokens]), SEQ)
  elements = data.window_elements(windows, seed=3)
  kwargs = dict(batch_size=8, start=24, rows=(2, 6))
  workers = iter(data.process_batches(elements, workers=1, **kwargs))
  local = iter(data.process_batches(elements, workers=0, **kwargs))
  for _ in range(4):
    np.testing.assert_array_equal(next(workers), next(local))
  workers.close()
  local.close()
