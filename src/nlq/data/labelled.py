"""Labelled examples for encoder classifiers, prepared offline (`nlq prepare --source mnist1d --out DIR`):

- mnist1d[:N][:shuffled]  Greydanus's MNIST-1D, generated (never downloaded) by the `mnist1d` package from its
                          templates with its published arguments (seed 42): 4,000 train / 1,000 test signals of
                          length 40, 10 classes. `mnist1d:N` generates N examples (a multiple of 10: as many
                          of each class) with the same transformations (the same 80/20 split); `shuffled` is
                          the package's variant with each sequence's order permuted (`shuffle_seq`).
- digits                  scikit-learn's 8 x 8 handwritten digits (1,797 images, shipped with scikit-learn), split
                          1,437 / 360 by a permutation seeded 2357, recorded.
- cifar10:DIR             the CIFAR-10 python batches (data_batch_1..5, test_batch) that torchvision writes, read
                          from DIR or DIR/cifar-10-batches-py by an unpickler that builds numpy arrays and nothing
                          else (a pickle can run code): 50,000 / 10,000 images of 3 x 32 x 32.
- imagefolder:DIR         one subfolder per class of images (PNG, JPEG, ...), all of one size (there is no resize
                          rule), in RGB (or L when every one is grayscale); DIR/train and DIR/test if both exist,
                          else one folder split 80/20 by a permutation seeded 2357.

A prepared directory holds train_x.npy (N, length, channels) or (N, channels, height, width) float32, train_y.npy
int64, the same for test, and meta.json: the source, the generator's arguments, the split, the shapes, the classes
and a content hash of the arrays, so a result names exactly what it was trained and scored on.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import pickle
from pathlib import Path

import numpy as np

from nlq.errors import UserError
from nlq.fileio import atomic_directory, is_empty_dir, read_json, write_json
from nlq.lock import directory_lock

KIND = "labelled"
SOURCES = "mnist1d[:N][:shuffled], digits, cifar10:DIR or imagefolder:DIR"
SPLIT_SEED = 2357
MNIST1D_PUBLISHED = 5000  # the package's num_samples: 4,000 train + 1,000 test


def is_labelled(spec: str) -> bool:
    return spec.split(":")[0] in ("mnist1d", "digits", "cifar10", "imagefolder")


def generate(spec: str) -> tuple[dict[str, np.ndarray], dict]:
    """(arrays {train_x, train_y, test_x, test_y}, what made them) for a source spec; one-line errors."""
    name, *options = spec.split(":")
    if name in ("cifar10", "imagefolder"):
        folder = Path(spec.partition(":")[2])
        if not folder.is_dir():
            raise UserError(f"--source {spec}: give {name}:DIR, a directory of yours ({folder} is none)")
        return _cifar10(folder) if name == "cifar10" else _image_folder(folder)
    if name == "digits":
        if options:
            raise UserError(f"--source {spec}: digits takes no options (the 1,797 images scikit-learn ships)")
        return _digits()
    total, shuffled, counted = MNIST1D_PUBLISHED, False, False
    for option in options:
        if option == "shuffled":
            shuffled = True
        elif option.isdigit() and counted:
            raise UserError(f"--source {spec}: two counts; give one, mnist1d:N")
        elif option.isdigit() and int(option) >= 10 and int(option) % 10 == 0:
            total, counted = int(option), True
        elif option.isdigit() and int(option) >= 10:
            raise UserError(f"--source {spec}: {option} examples cannot be split evenly over 10 classes (the generator "
                            f"makes as many of each); give a multiple of 10, e.g. mnist1d:{int(option) // 10 * 10}")
        else:
            raise UserError(f"--source {spec}: {option!r} is not an option of mnist1d; give mnist1d, mnist1d:N (N a "
                            f"multiple of 10, at least 10) or mnist1d[:N]:shuffled")
    return _mnist1d(total, shuffled)


def _mnist1d(total: int, shuffled: bool) -> tuple[dict[str, np.ndarray], dict]:
    try:
        from mnist1d.data import get_dataset_args, make_dataset
    except ImportError:
        raise UserError("--source mnist1d needs the mnist1d package: pip install mnist1d (it generates the data "
                        "offline)") from None
    args = get_dataset_args()
    args.num_samples, args.shuffle_seq = total, shuffled
    data = make_dataset(args)  # a seeded generator (args.seed = 42): the same arrays every time
    arrays = {"train_x": data["x"][:, :, None], "train_y": data["y"], "test_x": data["x_test"][:, :, None],
              "test_y": data["y_test"]}
    arguments = {k: v for k, v in vars(args).items() if k != "url"}
    return arrays, {"generator": f"mnist1d=={importlib.metadata.version('mnist1d')} make_dataset",
                    "arguments": arguments}


def _digits() -> tuple[dict[str, np.ndarray], dict]:
    try:
        from sklearn.datasets import load_digits
    except ImportError:
        raise UserError("--source digits needs scikit-learn, which ships the images: pip install scikit-learn") \
            from None
    digits = load_digits()
    order = np.random.default_rng(SPLIT_SEED).permutation(len(digits.target))
    test, train = order[:360], order[360:]
    images = (digits.images / 16.0)[:, None]  # (N, 1, 8, 8), pixel values 0..16 scaled to 0..1
    arrays = {"train_x": images[train], "train_y": digits.target[train], "test_x": images[test],
              "test_y": digits.target[test]}
    return arrays, {"generator": f"scikit-learn=={importlib.metadata.version('scikit-learn')} load_digits",
                    "arguments": {"split_seed": SPLIT_SEED, "test_examples": 360, "scale": "pixels / 16"}}


class _ArraysOnly(pickle.Unpickler):
    """Unpickles dicts, lists, numbers, bytes and numpy arrays, and refuses every other global: a CIFAR batch
    file is a pickle, and a pickle from elsewhere could otherwise run any code."""

    ALLOWED = {(core, name) for core in ("numpy.core.multiarray", "numpy._core.multiarray")
               for name in ("_reconstruct", "scalar")}
    ALLOWED |= {("numpy", "ndarray"), ("numpy", "dtype"), ("_codecs", "encode")}

    def find_class(self, module: str, name: str):
        if (module, name) in self.ALLOWED:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"{module}.{name} is not part of a CIFAR batch")


def _cifar10(folder: Path) -> tuple[dict[str, np.ndarray], dict]:
    root = folder / "cifar-10-batches-py" if (folder / "cifar-10-batches-py").is_dir() else folder
    names = [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]
    missing = [n for n in names if not (root / n).is_file()]
    if missing:
        raise UserError(f"--source cifar10:{folder}: {root} lacks {', '.join(missing)}; give the folder torchvision's "
                        f"CIFAR10(download=True) writes (cifar-10-batches-py)")
    parts = {}
    for name in names:
        try:
            with (root / name).open("rb") as f:
                batch = _ArraysOnly(f, encoding="bytes").load()
            parts[name] = (np.asarray(batch[b"data"], dtype=np.uint8).reshape(-1, 3, 32, 32),
                           np.asarray(batch[b"labels"], dtype=np.int64))
        except (pickle.UnpicklingError, KeyError, ValueError, EOFError, TypeError) as e:
            raise UserError(f"--source cifar10:{folder}: {root / name} is no CIFAR-10 batch ({e})") from None
    train = [parts[n] for n in names[:5]]
    arrays = {"train_x": np.concatenate([x for x, _ in train]) / 255.0,
              "train_y": np.concatenate([y for _, y in train]),
              "test_x": parts["test_batch"][0] / 255.0, "test_y": parts["test_batch"][1]}
    return arrays, {"generator": "CIFAR-10 python batches", "arguments": {"folder": str(root.resolve()),
                                                                          "scale": "pixels / 255"}}


def _image_folder(folder: Path) -> tuple[dict[str, np.ndarray], dict]:
    from PIL import Image, UnidentifiedImageError

    split = (folder / "train").is_dir() and (folder / "test").is_dir()
    roots = {"train": folder / "train", "test": folder / "test"} if split else {"all": folder}
    classes = sorted({p.name for root in roots.values() for p in root.iterdir() if p.is_dir()})
    if len(classes) < 2:
        raise UserError(f"--source imagefolder:{folder}: found {len(classes)} class folder(s); give one subfolder "
                        f"per class (at least 2), each holding that class's images")
    images = {}
    for part, root in roots.items():
        xs, ys = [], []
        for label, name in enumerate(classes):
            for path in sorted((root / name).iterdir()) if (root / name).is_dir() else []:
                try:
                    with Image.open(path) as image:
                        xs.append(np.asarray(image.convert("RGB" if image.mode not in ("L", "1") else "L")))
                except (UnidentifiedImageError, OSError) as e:
                    raise UserError(f"--source imagefolder:{folder}: cannot read {path} as an image ({e}); remove it "
                                    f"or replace it") from None
                ys.append(label)
        if not xs:
            raise UserError(f"--source imagefolder:{folder}: {root} holds no images in its class folders")
        shapes = sorted({x.shape for x in xs})
        if len(shapes) > 1:
            raise UserError(f"--source imagefolder:{folder}: images of sizes {shapes[0]} and {shapes[-1]}; nlq has no "
                            f"resize rule: give images of one size (a square, side a multiple of the patch size)")
        x = np.stack(xs).astype(np.float32) / 255.0
        images[part] = (x[:, None] if x.ndim == 3 else x.transpose(0, 3, 1, 2), np.asarray(ys, dtype=np.int64))
    if not split:
        x, y = images.pop("all")
        order = np.random.default_rng(SPLIT_SEED).permutation(len(y))
        n_test = max(1, len(y) // 5)
        images = {"train": (x[order[n_test:]], y[order[n_test:]]), "test": (x[order[:n_test]], y[order[:n_test]])}
    if images["train"][0].shape[1:] != images["test"][0].shape[1:]:
        raise UserError(f"--source imagefolder:{folder}: train and test images differ in size; give one size")
    arrays = {"train_x": images["train"][0], "train_y": images["train"][1], "test_x": images["test"][0],
              "test_y": images["test"][1]}
    arguments = {"folder": str(folder.resolve()), "classes": classes, "scale": "pixels / 255",
                 "split": "train/ and test/" if split else f"80/20, permutation seeded {SPLIT_SEED}"}
    return arrays, {"generator": "image folder", "arguments": arguments}


def content_hash(arrays: dict[str, np.ndarray]) -> str:
    digest = hashlib.blake2b(digest_size=16)
    for key in sorted(arrays):
        digest.update(f"{key}{arrays[key].dtype}{arrays[key].shape}".encode())
        digest.update(np.ascontiguousarray(arrays[key]).tobytes())
    return digest.hexdigest()


def prepare_labelled(spec: str, out: str | Path, overwrite: bool = False, log=print) -> dict:
    """Generate the examples of `spec` into `out` (written whole or not at all); a directory already holding them
    is reused, one holding anything else is refused unless overwrite. Returns meta.json's content."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with directory_lock(out, f"data directory {out}"):  # study shards prepare the same directory
        return _prepare_labelled(spec, out, overwrite, log)


def _prepare_labelled(spec: str, out: Path, overwrite: bool, log) -> dict:
    arrays, made = generate(spec)
    arrays = {k: v.astype(np.float32) if k.endswith("_x") else v.astype(np.int64) for k, v in arrays.items()}
    meta = {"kind": KIND, "source": spec, **made, "content_hash": content_hash(arrays),
            "splits": {split: {"examples": int(len(arrays[f"{split}_y"])),
                               "shape": list(arrays[f"{split}_x"].shape[1:])} for split in ("train", "test")},
            "classes": int(max(arrays["train_y"].max(), arrays["test_y"].max()) + 1)}
    existing = out / "meta.json"
    if out.exists() and not is_empty_dir(out):
        earlier = read_json(existing, "the meta of a prepared dataset") if existing.is_file() else None
        if earlier is not None and earlier.get("content_hash") == meta["content_hash"]:
            log(f"{out} already holds {spec} (content hash {meta['content_hash'][:16]}); reusing it")
            return earlier
        if not overwrite or earlier is None:
            raise UserError(f"{out} holds {'other data' if earlier else 'files that are not an nlq dataset'}; choose "
                            f"another --out" + (" or pass --overwrite" if earlier else ""))
    with atomic_directory(out) as tmp:
        for key, value in arrays.items():
            np.save(tmp / f"{key}.npy", value)
        write_json(tmp / "meta.json", meta)
    log(f"prepared {out}: {spec}, {meta['splits']['train']['examples']:,} train / "
        f"{meta['splits']['test']['examples']:,} test examples of shape {meta['splits']['train']['shape']}, "
        f"{meta['classes']} classes")
    return meta


def seeded_split(arrays: dict[str, np.ndarray], seed: int) -> tuple[dict[str, np.ndarray], dict]:
    """The prepared examples pooled (train, then test) and split again, stratified by class, by a permutation drawn
    from `seed` (a run's train.seed: the two arms of a pair get the same split, two seeds different ones); each
    class keeps its share of the prepared test split (largest remainders), so the test split keeps its size. Returns
    the arrays and what identifies the split: the seed, its sizes and a hash of the pooled indices of its test
    examples."""
    x = np.concatenate([arrays["train_x"], arrays["test_x"]])
    y = np.concatenate([arrays["train_y"], arrays["test_y"]])
    labels, sizes = np.unique(y, return_counts=True)
    quota = sizes * len(arrays["test_y"]) / len(y)
    take = np.floor(quota).astype(int)  # then the largest remainders, so that the test split keeps its size
    take[np.argsort(-(quota - take), kind="stable")[:len(arrays["test_y"]) - take.sum()]] += 1
    rng = np.random.default_rng([SPLIT_SEED, seed])
    test = []
    for label, k in zip(labels, take):
        test.append(rng.permutation(np.flatnonzero(y == label))[:k])
    test = np.sort(np.concatenate(test))
    train = np.setdiff1d(np.arange(len(y)), test)
    split = {"seed": seed, "train_examples": int(len(train)), "test_examples": int(len(test)),
             "hash": hashlib.blake2b(test.astype(np.int64).tobytes(), digest_size=8).hexdigest()}
    return {"train_x": x[train], "train_y": y[train], "test_x": x[test], "test_y": y[test]}, split


def is_labelled_dir(directory: str | Path) -> bool:
    path = Path(directory) / "meta.json"
    return path.is_file() and read_json(path, "the meta of a prepared dataset").get("kind") == KIND


def load_labelled(directory: str | Path) -> tuple[dict[str, np.ndarray], dict]:
    """The arrays and meta of a prepared directory of labelled examples."""
    directory = Path(directory)
    meta_path = directory / "meta.json"
    meta = read_json(meta_path, "the meta of a prepared dataset") if meta_path.is_file() else {}
    if meta.get("kind") != KIND:
        raise UserError(f"{directory} holds no labelled examples (meta.json kind {meta.get('kind')!r}); prepare them "
                        f"with nlq prepare --source {SOURCES.split(' or ')[0]} --out DIR")
    arrays = {k: np.load(directory / f"{k}.npy") for k in ("train_x", "train_y", "test_x", "test_y")}
    if content_hash(arrays) != meta.get("content_hash"):
        raise UserError(f"{directory}: the arrays do not match the content hash meta.json records; prepare it again")
    return arrays, meta
