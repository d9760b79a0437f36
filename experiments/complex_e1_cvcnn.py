"""E1: complex-valued CNN vs real CNNs of equal parameter count.

Claim (Chatterjee et al., arXiv:2302.04584, abstract; the body was not
retrievable): CV-CNNs beat both a CNN and a CNN with twice the trainable
parameters (CNNx2), so the gain is not merely the parameter count.

Data: Fashion-MNIST (train subset, full test set) made complex MRI-style,
``z = x exp(i(φ0 + a u + b v))`` with ``φ0 ~ U(-π, π)`` and ``a, b ~
U(-π/8, π/8)`` per image over pixel coordinates ``u, v in [-1, 1]``; labels
depend on the magnitude only. Control: the same runs with ``φ ≡ 0``. How
the study formed complex MRI inputs is unknown; this construction is the
spec's, not the paper's.

Models: CNN, 3 × (conv 3x3 stride 2, BN, ReLU) at widths 16/32/64, mean
pool, dense, input channels (Re, Im); CNNx2, the same with widths scaled
until its parameter count matches the CV-CNN's within 5%; CV-CNN
(`jaxnorm.nn.cplx.CVCNN`), complex widths 16/32/64 with complex batch norm,
CReLU, ``|.|`` after pooling and a real dense. Parameters in reals.

    python -m experiments.complex_e1_cvcnn [--quick] [--seeds 3]
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from experiments import complex_common as cc
from jaxnorm.nn import cplx as ncplx
from jaxnorm.optim import complex as copt
from jaxnorm.training import data

FULL = dict(dataset="fashion_mnist", train=20000, epochs=2, batch=128)
QUICK = dict(dataset="digits", train=64, epochs=1, batch=32)
WIDTHS = (16, 32, 64)


class RealCNN(nnx.Module):
  """3 × (conv 3x3 stride 2, BatchNorm, ReLU), mean pool, dense."""

  def __init__(self, widths, in_ch: int, classes: int, *, rngs: nnx.Rngs):
    """Builds the stages."""
    convs, norms = [], []
    for w in widths:
      convs.append(nnx.Conv(in_ch, w, (3, 3), strides=2, rngs=rngs))
      # Momentum 0.9 as the CV-CNN's complex batch norm (flax's 0.99
      # leaves the running statistics unconverged after a few hundred steps).
      norms.append(nnx.BatchNorm(w, momentum=0.9, rngs=rngs))
      in_ch = w
    self.convs, self.norms = nnx.List(convs), nnx.List(norms)
    self.head = nnx.Linear(in_ch, classes, rngs=rngs)

  def __call__(self, x: jax.Array) -> jax.Array:
    """Logits for real ``(N, H, W, C)`` images."""
    for conv, norm in zip(self.convs, self.norms):
      x = jax.nn.relu(norm(conv(x)))
    return self.head(jnp.mean(x, axis=(1, 2)))


def complexify(
  x: np.ndarray, rng: np.random.Generator, control: bool
) -> np.ndarray:
  """Complex images ``(N, H, W, 1)``: a per-image phase ramp (or none)."""
  n, h, w, _ = x.shape
  if control:
    return x.astype(np.complex64)
  u = np.linspace(-1, 1, w)[None, None, :]
  v = np.linspace(-1, 1, h)[None, :, None]
  phi0 = rng.uniform(-np.pi, np.pi, (n, 1, 1))
  a = rng.uniform(-np.pi / 8, np.pi / 8, (n, 1, 1))
  b = rng.uniform(-np.pi / 8, np.pi / 8, (n, 1, 1))
  phase = phi0 + a * u + b * v
  return (x[..., 0] * np.exp(1j * phase))[..., None].astype(np.complex64)


def real_count(widths, in_ch: int, classes: int) -> int:
  """Parameters of `RealCNN` in reals.

  Conv kernels and biases, BN scale and bias, dense (checked against the
  built model in `main`).
  """
  total = 0
  for w in widths:
    total += 9 * in_ch * w + w + 2 * w
    in_ch = w
  return total + in_ch * classes + classes


def matched_widths(target: int, classes: int) -> tuple[tuple[int, ...], int]:
  """CNNx2 widths whose real count is closest to ``target``."""
  best = None
  for m in np.linspace(1.2, 1.6, 81):
    widths = tuple(int(round(w * m)) for w in WIDTHS)
    count = real_count(widths, 2, classes)
    if best is None or abs(count - target) < abs(best[1] - target):
      best = (widths, count)
  return best


def build(name: str, classes: int, shape, widths2, seed: int) -> nnx.Module:
  """One model by name."""
  rngs = nnx.Rngs(seed)
  if name == "cvcnn":
    return ncplx.CVCNN(
      ncplx.CVCNNConfig(
        num_classes=classes, image_shape=shape, widths=WIDTHS, input="complex"
      ),
      rngs=rngs,
    )
  return RealCNN(WIDTHS if name == "cnn" else widths2, 2, classes, rngs=rngs)


def features(name: str, z: np.ndarray) -> np.ndarray:
  """The model input: complex for the CV-CNN, (Re, Im) channels else."""
  if name == "cvcnn":
    return z
  return np.concatenate([z.real, z.imag], axis=-1).astype(np.float32)


def loss_fn(model: nnx.Module, batch) -> jax.Array:
  """Softmax cross-entropy on the labels."""
  x, y = batch
  logits = model(x)
  return jnp.mean(optax.softmax_cross_entropy_with_integer_labels(logits, y))


def batches(x: np.ndarray, y: np.ndarray, size: int, seed: int):
  """Shuffled mini-batches, forever."""
  rng = np.random.default_rng(seed)
  while True:
    order = rng.permutation(len(x))
    for i in range(0, len(x) - size + 1, size):
      idx = order[i : i + size]
      yield jnp.asarray(x[idx]), jnp.asarray(y[idx])


def accuracy(model: nnx.Module, x: np.ndarray, y: np.ndarray) -> float:
  """Test accuracy in eval mode (running statistics)."""
  model.eval()
  predict = nnx.jit(lambda m, t: jnp.argmax(m(t), -1))
  hits = [
    np.asarray(predict(model, jnp.asarray(x[i : i + 500]))) == y[i : i + 500]
    for i in range(0, len(x), 500)
  ]
  return float(np.concatenate(hits).mean())


def main(argv: list[str] | None = None) -> dict[str, Any]:
  """Runs E1 and writes ``complex_e1_cvcnn.md``; returns the record."""
  args = cc.parser(__doc__.splitlines()[0]).parse_args(argv)
  c = QUICK if args.quick else FULL
  seeds = 1 if args.quick else args.seeds
  timer = cc.Timer()
  ds = data.load_images(c["dataset"])
  classes, shape = ds.num_classes, ds.train_x.shape[1:]
  cv_count = cc.count_params(build("cvcnn", classes, shape, None, 0))
  widths2, cnn2_count = matched_widths(cv_count, classes)
  counts = {
    "cnn": real_count(WIDTHS, 2, classes),
    "cnnx2": cnn2_count,
    "cvcnn": cv_count,
  }
  built = cc.count_params(build("cnnx2", classes, shape, widths2, 0))
  if built != cnn2_count:
    raise RuntimeError(f"E1: counted {cnn2_count} parameters, built {built}")
  steps = c["epochs"] * (c["train"] // c["batch"])
  tx = copt.complex_adam(2e-3)
  acc: dict[str, dict[str, list[float]]] = {"complex": {}, "control": {}}
  for seed in range(seeds):
    rng = np.random.default_rng(seed)
    for cond in acc:
      control = cond == "control"
      ztr = complexify(ds.train_x[: c["train"]], rng, control)
      zte = complexify(ds.val_x, rng, control)
      for name in counts:
        print(f"E1 seed {seed} {cond} {name} t={timer():.0f}s", flush=True)
        model = build(name, classes, shape, widths2, seed)
        cc.fit(
          model,
          loss_fn,
          tx,
          batches(
            features(name, ztr), ds.train_y[: c["train"]], c["batch"], seed
          ),
          steps,
        )
        acc[cond].setdefault(name, []).append(
          accuracy(model, features(name, zte), ds.val_y)
        )
  adv = {
    cond: [a - b for a, b in zip(acc[cond]["cvcnn"], acc[cond]["cnnx2"])]
    for cond in acc
  }
  (am, _), (cm, _) = (
    cc.mean_spread(adv["complex"]),
    cc.mean_spread(adv["control"]),
  )
  spread = max(
    cc.mean_spread(acc["complex"]["cvcnn"])[1],
    cc.mean_spread(acc["complex"]["cnnx2"])[1],
  )
  if am > spread and am > cm:
    result = "reproduced"
  elif am < -spread:
    result = "not reproduced at this scale"
  else:
    result = "inconclusive"
  record = {
    "config": c,
    "seeds": seeds,
    "counts": counts,
    "cnnx2_widths": widths2,
    "accuracy": acc,
    "advantage_cvcnn_minus_cnnx2": adv,
    "verdict": result,
    "seconds": timer(),
  }
  fig, (ax,) = cc.figure()
  names = list(counts)
  xpos = np.arange(len(names))
  for off, cond in zip((-0.2, 0.2), acc):
    ax.bar(
      xpos + off,
      [np.mean(acc[cond][n]) for n in names],
      0.4,
      yerr=[np.std(acc[cond][n]) for n in names],
      label=cond,
    )
  ax.set_xticks(xpos, [f"{n}\n{counts[n]} params" for n in names])
  ax.set(ylabel="test accuracy", title="E1: CNN vs CNNx2 vs CV-CNN")
  lo = min(np.mean(v) for d in acc.values() for v in d.values())
  ax.set_ylim(max(0.0, lo - 0.1), 1.0)
  ax.legend()
  rows = "\n".join(
    f"| {n} | {counts[n]} | {cc.fmt(acc['complex'][n])} | "
    f"{cc.fmt(acc['control'][n])} |"
    for n in names
  )
  md = f"""# E1: CV-CNN vs CNN vs CNNx2 (complex input vs parameter count)

{c["dataset"]}: first {c["train"]} training images, full test set,
{c["epochs"]} epochs, batch {c["batch"]}, complex Adam lr 2e-3, {seeds}
seeds (mean ± std). CNNx2 widths {widths2} (count within
{100 * abs(cnn2_count - cv_count) / cv_count:.1f}% of the CV-CNN's). Run
time {record["seconds"]:.0f} s.

| model | params (reals) | acc, complex input | acc, control φ ≡ 0 |
|---|---|---|---|
{rows}

CV-CNN minus CNNx2: complex input {cc.fmt(adv["complex"])}, control
{cc.fmt(adv["control"])}.

**Verdict (CV-CNN > CNNx2 on complex data by more than the seed spread, and
the advantage shrinks on the control): {result}.** The study's data (brain
MRI) and its complex input construction are not reproduced here.
"""
  cc.write_result(args.out, "e1_cvcnn", md, record, fig)
  return record


if __name__ == "__main__":
  main()
