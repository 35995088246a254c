"""Turn raw (x, y) into checked, split, normalised arrays ready to broadcast.

Splits are seeded (stratified for classification); normalisation is fitted on the
training split only and kept, so ``ensemble.predict`` applies the same transform.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from datafeed.readers import DataError, DataSettings
from datafeed.splits import split_from

SPLITS = ("train", "val", "test")


def infer_task(y: np.ndarray, setting: str) -> str:
    """``data.task`` if set, else classification for integer/string/bool labels; numbers in
    several columns (``data.label`` a list, or an (n, k) ``data.y``) are regression targets."""
    if setting != "auto":
        return setting
    if y.ndim == 2 and y.shape[1] > 1 and y.dtype.kind in "iuf":
        return "regression"
    if y.dtype.kind in "iubUSO":
        return "classification"
    if y.ndim == 1 and np.all(np.mod(y, 1) == 0) and len(np.unique(y)) <= max(20, len(y) // 50):
        return "classification"
    return "regression"


def with_run_task(data: DataSettings, then: dict | None) -> DataSettings:
    """``data`` as an existing run reads its data again (``then``: its ``data.json``): with
    ``data.task = "auto"``, the task the run recorded, not one inferred now. The inference may
    have changed since (before 2026-11-29, (n, 1) float labels of few whole values were a
    regression), and a run keeps the task its members were trained for."""
    if then and data.task == "auto" and then.get("task"):
        return data.replace(task=then["task"])
    return data


def missing_rows(y: np.ndarray) -> np.ndarray:
    """Indices of the rows whose target is missing: NaN, or None / NaN / pandas' NA in a column of
    objects (strings with gaps)."""
    flat = y.reshape(len(y), -1)
    if flat.dtype.kind == "f":
        return np.nonzero(np.isnan(flat).any(axis=1))[0]
    if flat.dtype.kind != "O":
        return np.zeros(0, dtype=np.int64)
    return np.nonzero([any(_missing(v) for v in row) for row in flat])[0]


def _missing(v) -> bool:
    """None, a NaN, or pandas' NA / NaT (whose comparisons give NA, not a bool)."""
    if v is None or type(v).__name__ in ("NAType", "NaTType"):
        return True
    return isinstance(v, (float, np.floating)) and v != v


def encode_labels(y: np.ndarray, class_names: list[str] | None) -> tuple[np.ndarray, list[str]]:
    """Map labels to 0..C-1; integer labels must already be 0..C-1 if class names were given.
    Whole numbers read as floats (3.0: a column pandas read with gaps) are integers; labels that
    count from 0 keep their values as codes (a class absent from these rows keeps its index),
    any others are coded in sorted order."""
    if y.ndim != 1:
        raise DataError(f"classification labels must be one value per sample, but have shape {y.shape}; "
                        "set `data.task = \"regression\"` for vector targets")
    if y.dtype.kind == "f" and len(y) and np.all(np.mod(y, 1) == 0):
        y = y.astype(np.int64)
    values, codes = np.unique(y, return_inverse=True)
    if class_names and y.dtype.kind in "iu":
        if values.min() < 0 or values.max() >= len(class_names):
            raise DataError(f"labels must lie in 0..{len(class_names) - 1} for the "
                            f"{len(class_names)} classes, but range {values.min()}..{values.max()}")
        return y.astype(np.int64), class_names
    if y.dtype.kind in "iu" and values.min() == 0 and values.max() < 2 * len(values):
        return y.astype(np.int64), [str(v) for v in range(int(values.max()) + 1)]
    return codes.astype(np.int64), [str(v) for v in values]


def check_arrays(x: np.ndarray, y: np.ndarray, names: Sequence[str] = (), impute: str = "none") -> None:
    """Reject data no network can train on, naming what is wrong (``names``: a table's feature
    columns, named with the non-finite values they hold); with ``impute`` (``data.impute``)
    other than "none", missing values (NaN) pass: ``impute_features`` fills them."""
    for what, a, key in (("features", x, "`data.x` (or `data.source`)"), ("targets", y, "`data.y` (or `data.label`)")):
        if np.ndim(a) == 0:
            raise DataError(f"the {what} are one number ({np.asarray(a).item()!r}), not one per sample: "
                            f"check {key}, which should name an array with a first axis of samples")
    if np.ndim(x) >= 2 and int(np.prod(np.shape(x)[1:])) == 0:
        raise DataError(f"the features hold no values per sample (shape {list(np.shape(x))}): check `data.x` (or "
                        "`data.features` / `data.exclude` for a table)")
    if len(x) != len(y):
        raise DataError(f"features and targets differ in length: x has {len(x)} samples, y has "
                        f"{len(y)}; check `data.x` / `data.y` (or `data.label`)")
    if len(x) < 10:
        raise DataError(f"the dataset has only {len(x)} samples; at least 10 are needed to split "
                        "into train/val/test")
    if x.dtype.kind not in "iufb":
        raise DataError(f"features must be numeric, but have dtype {x.dtype}")
    xf = np.asarray(x, dtype=np.float64)
    bad = np.isinf(xf) if impute != "none" else ~np.isfinite(xf)
    if bad.any():
        rows = np.unique(np.nonzero(bad)[0])
        where, empty = "", False
        per = bad.reshape(len(bad), -1).sum(axis=0)        # non-finite values per column
        if len(names) == len(per):
            cols = [f"{names[i]!r} ({int(per[i])}{' of ' + str(len(x)) if per[i] == len(x) else ''})"
                    for i in np.flatnonzero(per)]
            where = f" in column(s) {', '.join(cols[:8])}{', ...' if len(cols) > 8 else ''}"
            empty = bool((per == len(x)).any())
        raise DataError(f"features hold {int(bad.sum())} {'inf' if impute != 'none' else 'NaN/inf'} values{where} "
                        f"(first rows, counted from 0: {rows[:5].tolist()}); clean "
                        + ("them before training" if impute != "none" else
                           "or impute them before training, or set `data.impute = \"median\"` to fill the missing "
                           "ones with their feature's training median")
                        + (", or leave an empty column out with `data.exclude`" if empty else "")
                        + " (an HDF5/NetCDF fill value, `_FillValue` or `missing_value`, counts as NaN)")


def split_off(idx: np.ndarray, strata: np.ndarray | None, fraction: float,
              seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Seeded (rest, held) of ``idx``: ``ceil(fraction * len(idx))`` rows held out (at least
    one, and one left), in every stratum (``strata``, aligned with ``idx``; None: a plain
    shuffle) in proportion to its size, the remainders going to the largest fractional
    shares (ties at random). Numpy only: rank 0 draws the split before the workers can
    start, and importing scikit-learn for it cost seconds of CPU on that path."""
    idx = np.asarray(idx)
    n = len(idx)
    held_n = int(min(max(np.ceil(fraction * n), 1), n - 1)) if n > 1 else 0
    rng = np.random.default_rng(seed)
    order = rng.permutation(n)
    if strata is None:
        return idx[order[held_n:]], idx[order[:held_n]]
    _, codes = np.unique(np.asarray(strata), return_inverse=True)
    counts = np.bincount(codes)
    share = counts * (held_n / n)
    take = np.floor(share).astype(np.int64)
    short = held_n - int(take.sum())
    if short > 0:                                   # largest remainders first, ties at random
        ranked = np.lexsort((rng.random(len(counts)), -(share - take)))
        take[ranked[:short]] += 1
    grouped = order[np.argsort(codes[order], kind="stable")]     # shuffled within each stratum
    rank = np.arange(n) - np.repeat(np.cumsum(counts) - counts, counts)
    held = rank < take[codes[grouped]]
    return idx[grouped[~held]], idx[grouped[held]]


#: a class with fewer rows than this is kept whole in the training split (``split_indices``)
RARE_CLASS_ROWS = 3


def rare_classes(y: np.ndarray, counts: np.ndarray | None = None) -> np.ndarray:
    """Class codes with at least one and fewer than ``RARE_CLASS_ROWS`` rows (``counts``: the
    bincount of ``y``, when the caller has it)."""
    counts = np.bincount(y) if counts is None else counts
    return np.flatnonzero((counts > 0) & (counts < RARE_CLASS_ROWS))


def class_notes(y: np.ndarray, class_names: Sequence[str]) -> list[str]:
    """What ``check`` and the run say of the classes: too rare to split (``rare_note``), and
    labels that differ only by case or spaces ("cat", "cat ", "Cat": three classes)."""
    notes = [rare_note(y, class_names), empty_note(y, class_names)]
    groups: dict[str, list[str]] = {}
    for name in map(str, class_names):
        groups.setdefault(" ".join(name.split()).lower(), []).append(name)
    alike = [g for g in groups.values() if len(g) > 1]
    if alike:
        listed = "; ".join(", ".join(map(repr, g)) for g in alike[:4])
        notes.append(f"labels that differ only by case or spaces are different classes: {listed}; if each group "
                     "is one class, write its label one way in the data")
    return [n for n in notes if n]


def empty_note(y: np.ndarray, class_names: Sequence[str]) -> str | None:
    """Classes without a row: integer labels counting from 0 with gaps keep their numbers
    (``encode_labels``), so {0, 2, 5} makes 6 classes, 3 of them empty, which the networks
    then predict now and then. None when every class has rows."""
    counts = np.bincount(np.asarray(y), minlength=len(class_names))
    empty = np.flatnonzero(counts == 0)
    if not len(empty):
        return None
    listed = ", ".join(repr(class_names[c]) for c in empty[:8]) + (", ..." if len(empty) > 8 else "")
    return (f"{len(empty)} of {len(class_names)} classes have no rows ({listed}): integer labels counting from 0 "
            "keep their numbers as classes, so the networks have outputs for classes never seen, and may predict "
            "them; if the numbers are not every class there is, number the classes present 0, 1, 2, ... "
            "(np.unique(y, return_inverse=True)[1]) or use names")


def rare_note(y: np.ndarray, class_names: Sequence[str]) -> str | None:
    """What ``check`` and the run say of ``rare_classes`` (None when there are none)."""
    counts = np.bincount(np.asarray(y))
    rare = rare_classes(y, counts)
    if not len(rare):
        return None
    listed = ", ".join(f"{class_names[c]!r} ({counts[c]} row{'s' if counts[c] > 1 else ''})" for c in rare[:8])
    return (f"class(es) {listed}{', ...' if len(rare) > 8 else ''} have fewer than {RARE_CLASS_ROWS} rows: a random "
            "split keeps them all in training, so validation and test never score them; gather more rows of "
            "them, or merge or drop them")


#: a regression target this many robust standard deviations (1.4826 x MAD) from the median is named
OUTLIER_SDS = 50


def outlier_note(y: np.ndarray) -> str | None:
    """What ``check`` and the run say of regression targets far outside the bulk of the others
    (the standardised targets, and the mse, are then about those few rows); None if none."""
    y = np.asarray(y, dtype=np.float64).reshape(len(y), -1)
    med = np.median(y, axis=0)
    mad = 1.4826 * np.median(np.abs(y - med), axis=0)
    far = np.abs(y - med) > OUTLIER_SDS * np.where(mad > 0, mad, np.inf)
    rows = np.flatnonzero(far.any(axis=1))
    if not len(rows):
        return None
    shown = ", ".join(f"{y[r][far[r]][0]:.6g}" for r in rows[:3])
    return (f"{len(rows)} target value(s) lie more than {OUTLIER_SDS} robust standard deviations from the median "
            f"(such as {shown}{', ...' if len(rows) > 3 else ''}; the median is "
            f"{', '.join(f'{m:.6g}' for m in med)}): the standardised targets, and the mse, are about those rows; "
            "check them, or predict a transform of the target (its logarithm) instead")


def constant_note(y: np.ndarray, names: Sequence[str] = ()) -> str | None:
    """What ``check`` and the run say of regression targets with one value in every row: their
    R^2 is undefined (left out of the run's mean R^2) and they teach nothing."""
    y = np.asarray(y, dtype=np.float64).reshape(len(y), -1)
    same = np.flatnonzero((y == y[:1]).all(axis=0)) if len(y) else []
    if not len(same):
        return None
    if y.shape[1] == 1:
        return (f"the target is {y[0, 0]:.6g} in every row: there is nothing to learn; check `data.label` / "
                "`data.y`")
    named = [names[j] if len(names) == y.shape[1] else str(j) for j in same]
    listed = ", ".join(f"{n!r} (always {y[0, j]:.6g})" for n, j in zip(named, same))
    return (f"target(s) {listed} take one value in every row: there is nothing to learn there, their R^2 is "
            "undefined (left out of the run's r2); leave them out of `data.label` / `data.y`")


def channels_note(input_shape: Sequence[int]) -> str | None:
    """A sample shaped like a channels-first image ([3, 64, 64]: few leading channels, a larger
    square after them): Keras's convolutions take channels last, and would read it as 3 rows
    of 64 pixels with 64 channels, unsaid."""
    shape = list(input_shape)
    if len(shape) == 3 and shape[0] <= 4 and min(shape[1:]) >= 4 * shape[0] and shape[2] >= 8:
        return (f"samples of shape {shape} look channels-first (images of {shape[1]}x{shape[2]} with {shape[0]} "
                f"channel(s)?): Keras's convolutions take channels last and read them as {shape[0]} rows of "
                f"{shape[1]} pixels with {shape[2]} channels; if so, store them as np.moveaxis(x, 1, -1)")
    return None


def data_notes(info: dict, arrays: dict, meta: dict) -> list[str]:
    """What ``ensemble check`` prints and the run logs of data that will train but may mislead:
    feature columns like row numbers (``readers.id_like_columns``), text columns read as categories
    (``readers.categories_note``) and values of them another split's file holds that training lacks,
    classes too rare to split
    or alike but for case (``class_notes``), regression targets far from the rest
    (``outlier_note``) or the same in every row (``constant_note``), samples shaped like
    channels-first images (``channels_note``)."""
    from datafeed.readers import categories_note, id_like_note
    y = np.concatenate([arrays[f"y_{s}"] for s in SPLITS])
    notes = [id_like_note(info["id_like"])] if info.get("id_like") else []
    if info.get("categories"):
        notes.append(categories_note(info["categories"]))
    notes += info.get("unseen_notes") or []
    notes.append(impute_note(meta.get("impute")))
    notes.append(channels_note(meta.get("input_shape", ())))
    if meta.get("label_form") == ONE_HOT:
        notes.append(f"the targets are one-hot rows: read as the classes 0..{meta['n_outputs'] - 1} (the index "
                     "of each row's 1)")
    notes += class_notes(y, meta["class_names"]) if meta["task"] == "classification" else \
        [outlier_note(y), constant_note(y, meta.get("target_names", ()))]
    if meta.get("split_from", "random") != "random" and "x_train" in arrays and "x_test" in arrays:
        notes.append(outside_note(arrays["x_train"], arrays["x_test"], meta.get("feature_names") or ()))
    return [n for n in notes if n]


#: a test value further outside the training rows' range than this share of it is extrapolation
OUTSIDE_MARGIN = 0.1


def outside_note(x_train: np.ndarray, x_test: np.ndarray, names=()) -> str | None:
    """A test split the data gives (its own file, column or indices) whose rows lie outside the
    training rows' range in some feature (by more than ``OUTSIDE_MARGIN`` of it): the ensemble
    extrapolates there, and its spread need not grow (training e0 in [-2, 1], test in [-2, 3]:
    the std fell from 0.70 inside to 0.31 beyond 2, and the 90% interval covered 0.79). Tables
    only (up to 1,000 features); None when every test row is inside."""
    if x_train.ndim != 2 or x_test.ndim != 2 or not len(x_train) or not len(x_test) or x_train.shape[1] > 1000:
        return None
    lo, hi = np.nanmin(x_train, axis=0), np.nanmax(x_train, axis=0)
    margin = OUTSIDE_MARGIN * (hi - lo)
    out = (x_test < lo - margin) | (x_test > hi + margin)
    rows = int(out.any(axis=1).sum())
    if not rows:
        return None
    per = out.sum(axis=0)
    label = (lambda j: repr(str(names[j]))) if len(names) == x_train.shape[1] else (lambda j: f"feature {j}")
    worst = ", ".join(f"{label(int(j))} {int(per[j])}" for j in np.argsort(-per)[:3] if per[j])
    return (f"{rows} of {len(x_test)} test rows lie outside the training rows' range in some feature (rows per "
            f"feature: {worst}): there the ensemble extrapolates, its test metrics say how well, and its spread need "
            "not grow with the error (docs/ensembles.md, under shift)")


def split_indices(y: np.ndarray, task: str, val: float, test: float, seed: int) -> dict[str, np.ndarray]:
    """Seeded train/val/test index arrays, stratified by class for classification; the rows
    of a class too rare to be in every split (``rare_classes``) all go to training, where
    the networks can learn it (in validation alone, its output would never be trained)."""
    idx = np.arange(len(y))
    kept = np.zeros(0, dtype=idx.dtype)
    if task == "classification":
        rare = np.isin(y, rare_classes(y))
        if rare.any() and (~rare).sum() >= 3:
            idx, kept = idx[~rare], idx[rare]
    strata = y[idx] if task == "classification" else None
    stratify = strata is not None and np.unique(strata, return_counts=True)[1].min() >= RARE_CLASS_ROWS
    rest, test_idx = split_off(idx, strata if stratify else None, test, seed)
    train_idx, val_idx = split_off(rest, y[rest] if stratify else None, val / (1.0 - test), seed + 1)
    return {"train": np.sort(np.concatenate([train_idx, kept])), "val": np.sort(val_idx), "test": np.sort(test_idx)}


def draw_validation(y: np.ndarray, train: np.ndarray, task: str, fraction: float,
                    seed: int) -> tuple[np.ndarray, np.ndarray]:
    """A given split without validation rows: ``fraction`` of its training rows drawn as
    validation (seeded, stratified for classification as ``split_indices`` is); returns
    (train, val), each sorted."""
    if len(train) < 2:
        raise DataError(f"the given split has {len(train)} training row(s), too few to draw validation rows "
                        "from (`data.val_fraction`); give validation rows or more training rows")
    strata = y[train] if task == "classification" else None
    if strata is not None:
        counts = np.unique(strata, return_counts=True)[1]
        if counts.min() < 3 or np.ceil(fraction * len(train)) < len(counts):
            strata = None                 # a class too small to stratify: plain shuffle
    rest, val = split_off(train, strata, fraction, seed + 1)
    return np.sort(rest), np.sort(val)


#: rows normalised at once (``apply_normalizer``): bounds its float64 temporary
NORMALIZE_ROWS = 1 << 16


def feature_array(x) -> np.ndarray:
    """Features as held until normalised: float64 where the source is (a table's columns, an
    array of float64 or 32/64-bit integers: a Unix time or an absolute position keeps its
    digits), else float32 (images, float32 files). Never float32 before the shift: 1.6e9 + 30 z
    in float32 keeps 3 distinct values of 600."""
    x = np.asarray(x)
    wide = x.dtype == np.float64 or (x.dtype.kind in "iu" and x.dtype.itemsize >= 4)
    return x.astype(np.float64 if wide else np.float32, copy=False)


def fit_normalizer(x_train: np.ndarray, method: str) -> tuple[np.ndarray, np.ndarray]:
    """Per-feature (shift, scale) fitted on the training split, in float64 (kept so: the run
    saves them, predict applies them); x' = (x - shift) / scale."""
    flat = x_train.reshape(len(x_train), -1).astype(np.float64)
    if method == "standard":
        shift, scale = flat.mean(axis=0), flat.std(axis=0)
    elif method == "minmax":
        shift, scale = flat.min(axis=0), flat.max(axis=0) - flat.min(axis=0)
    else:
        shift, scale = np.zeros(flat.shape[1]), np.ones(flat.shape[1])
    scale = np.where(scale > 1e-12, scale, 1.0)          # constant features stay finite
    shape = x_train.shape[1:]
    return shift.reshape(shape), scale.reshape(shape)


def apply_normalizer(x: np.ndarray, shift: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """(x - shift) / scale in float64, as float32 (what the members take), ``NORMALIZE_ROWS``
    rows at a time."""
    x = np.asarray(x)
    shift, scale = np.asarray(shift, dtype=np.float64), np.asarray(scale, dtype=np.float64)
    out = np.empty(x.shape, dtype=np.float32)
    for i in range(0, len(x), NORMALIZE_ROWS):
        out[i:i + NORMALIZE_ROWS] = (x[i:i + NORMALIZE_ROWS].astype(np.float64) - shift) / scale
    return out


def reshape_features(x: np.ndarray, shape: Sequence[int] | None) -> np.ndarray:
    """Give each sample the configured ``data.reshape`` (e.g. [8, 8, 1] for Conv2D)."""
    if not shape:
        return x
    n_feat = int(np.prod(x.shape[1:]))
    if int(np.prod(shape)) != n_feat:
        raise DataError(f"`data.reshape` {list(shape)} holds {int(np.prod(shape))} values per sample, but "
                        f"each sample has {n_feat} (shape {list(x.shape[1:])})")
    return x.reshape((len(x), *shape))


def prepare(x: np.ndarray, y: np.ndarray, info: dict, data: DataSettings, seed: int) -> tuple[dict, dict]:
    """Check, encode, split and normalise. Returns (arrays to broadcast, small metadata)."""
    arrays, meta, _ = prepare_with_rows(x, y, info, data, seed)
    return arrays, meta


def prepare_with_rows(x: np.ndarray, y: np.ndarray, info: dict, data: DataSettings,
                      seed: int, rows: dict[str, np.ndarray] | None = None) -> tuple[dict, dict, dict[str, np.ndarray]]:
    """``prepare``, plus the split itself: ``{"train", "val", "test"}`` -> sorted int64 row
    indices into ``x``/``y`` as given (the file's rows as read), what the run saves as
    ``splits.npz`` so a baseline can use the same rows. ``rows``: a split given (a run's
    ``splits.npz``, or the data's own from ``datafeed.splits.read_data``), used as it is
    instead of drawing one; its ``val`` None: drawn from its train rows (``draw_validation``)."""
    x = np.asarray(x)
    y = np.asarray(y)
    names = info.get("feature_names") or ()
    check_arrays(x, y, names, data.impute)
    y, meta = prepare_targets(y, info, data)
    meta[FEATURES_DIGEST] = features_digest(x)
    x = reshape_features(feature_array(x), data.reshape)
    idx = choose_rows(y, meta, data, seed, rows)
    if meta["task"] == "classification":
        untrained_classes(y, idx, meta.get("class_names") or (), data)
    if data.impute != "none":
        x, meta["impute"] = impute_features(x, idx["train"], data.impute, names)
    shift, scale = fit_normalizer(x[idx["train"]], data.normalize)
    arrays = {"x_mean": shift, "x_scale": scale}
    for split in SPLITS:
        arrays[f"x_{split}"] = apply_normalizer(x[idx[split]], shift, scale)
        arrays[f"y_{split}"] = np.ascontiguousarray(y[idx[split]])
    meta["input_shape"] = list(x.shape[1:])
    meta["sizes"] = {s: int(len(idx[s])) for s in SPLITS}
    return arrays, meta, {s: idx[s].astype(np.int64) for s in SPLITS}


def untrained_classes(y: np.ndarray, idx: dict[str, np.ndarray], names: Sequence[str], data: DataSettings) -> None:
    """Refuse validation or test rows of a class no training row has (a split the data gives: a test
    file with a new label, or a typo): the networks could never predict it, and its rows would only
    count as wrong. A random split never does this (``split_indices`` keeps rare classes in training)."""
    from datafeed.splits import split_from
    seen = np.unique(y[idx["train"]])
    for split in ("val", "test"):
        unseen = ~np.isin(y[idx[split]], seen)
        rows = idx[split][unseen]
        if len(rows):
            classes = [repr(str(names[c])) if c < len(names) else str(c) for c in np.unique(y[rows])]
            where = {"sources": f"`data.{split}_source`", "column": "`data.split_column`",
                     "indices": "`data.split_file`"}.get(split_from(data), "the given split")
            first = np.flatnonzero(unseen)[:5].tolist()
            raise DataError(f"the {split} split ({where}) holds {len(rows)} row(s) of class(es) "
                            f"{', '.join(classes[:8])} that no training row has (first rows, counted from 0 in the "
                            f"{split} split: {first}): the networks could never predict them; correct those labels, "
                            "drop those rows, or give training rows of the class")


def impute_features(x: np.ndarray, train: np.ndarray, method: str,
                    names: Sequence[str] = ()) -> tuple[np.ndarray, dict]:
    """``data.impute``: the missing values (NaN) of ``x`` filled with their feature's ``method``
    ("median") over the ``train`` rows. Returns the features and what ``data.json`` keeps (the
    fill values, for ``predict``; the count filled per feature). A feature missing in every
    training row is an error naming it."""
    flat = np.asarray(x, dtype=np.float64).reshape(len(x), -1)
    missing = np.isnan(flat)
    train_missing = missing[train].all(axis=0)
    if train_missing.any():
        which = [repr(names[j]) if len(names) == flat.shape[1] else str(j) for j in np.flatnonzero(train_missing)]
        raise DataError(f"feature(s) {', '.join(which[:8])} are missing in every training row: `data.impute` has "
                        "nothing to fill them from; leave them out with `data.exclude`")
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)            # all-NaN slices: none left (refused above)
        fill = np.nanmedian(flat[train], axis=0)
    fill = np.where(np.isnan(fill), 0.0, fill)
    filled = np.where(missing, fill[None, :], flat)
    return filled.reshape(x.shape).astype(x.dtype, copy=False), \
        {"method": method, "values": fill.tolist(), "filled": int(missing.sum()),
         "per_feature": {(names[j] if len(names) == flat.shape[1] else str(j)): int(c)
                         for j, c in enumerate(missing.sum(axis=0)) if c}}


def impute_note(impute: dict | None) -> str | None:
    """What ``check`` and the run say of the values ``data.impute`` filled."""
    if not impute or not impute.get("filled"):
        return None
    per = impute.get("per_feature", {})
    listed = ", ".join(f"{k!r} ({v})" for k, v in list(per.items())[:8]) + (", ..." if len(per) > 8 else "")
    return (f"`data.impute = \"{impute['method']}\"` filled {impute['filled']} missing value(s) with their feature's "
            f"training {impute['method']}: {listed}")


#: ``meta["label_form"]`` of classification targets given as one-hot rows (``plain_labels``)
ONE_HOT = "one-hot"


def is_one_hot(y: np.ndarray) -> bool:
    """Rows of 0s and 1s with a single 1 each, in two or more columns: class labels one-hot."""
    if y.ndim != 2 or y.shape[1] < 2 or y.dtype.kind not in "iufb" or not len(y):
        return False
    values = np.asarray(y, dtype=np.float64)
    return bool(np.isin(values, (0.0, 1.0)).all() and (values.sum(axis=1) == 1).all())


def plain_labels(y: np.ndarray, setting: str) -> tuple[np.ndarray, str | None]:
    """Labels as one value a sample, where the file gives them otherwise: bytes decoded (h5py
    reads strings as bytes: classes were named "b'cat'"), an (n, 1) column of labels made (n,),
    one-hot rows made their class index (unless ``data.task`` is "regression"). Returns the
    targets and their form (``ONE_HOT``, or None)."""
    if y.dtype.kind == "S" or (y.dtype.kind == "O" and len(y) and all(isinstance(v, bytes) for v in y.flat)):
        y = np.array([v.decode("utf-8", "replace") for v in y.flat]).reshape(y.shape)
    if setting == "regression":
        return y, None
    if y.ndim == 2 and y.shape[1] == 1 and (setting == "classification" or y.dtype.kind in "iubUSO"
                                            or infer_task(y[:, 0], setting) == "classification"):
        return y[:, 0], None                    # (n, 1) floats 1., 2., 3. as (n,) ones: classes either way
    if is_one_hot(y):
        return np.argmax(y, axis=1).astype(np.int64), ONE_HOT
    return y, None


def data_changed(then: dict, now: dict, norm_then: tuple[np.ndarray, np.ndarray],
                 norm_now: tuple[np.ndarray, np.ndarray]) -> str | None:
    """Why the data prepared ``now`` is not the data a run was made with (``then``: its
    ``data.json``; the norms: (shift, scale), its ``normalization.npz``), or None: the same
    files (their number and rows, when streamed), split sizes, task and classes, and the same
    normalisation (fitted on the training rows: other rows there, or other values, give
    another). ``--resume``, ``ensemble.load(run).data`` and ``predict --data test`` ask it."""
    a, b = then.get("stream"), now.get("stream")     # both streamed (a job on a node with less memory may
    if a and b and (a["rows"] != b["rows"] or a["sample_shape"] != b["sample_shape"]):    # stream what one read whole)
        return (f"its files are not the same ({len(b['rows'])} files of {sum(b['rows'])} rows now, "
                f"{len(a['rows'])} files of {sum(a['rows'])} rows then)")
    if then.get("sizes") != now.get("sizes") or then.get("task") != now.get("task"):
        return (f"its split sizes {now.get('sizes')} and task {now.get('task')!r} are not the run's "
                f"{then.get('sizes')} and {then.get('task')!r}")
    if then.get("class_names") != now.get("class_names"):
        return f"its classes {now.get('class_names')} are not the run's {then.get('class_names')}"
    (shift, scale), (shift_now, scale_now) = norm_then, norm_now
    if np.shape(shift) != np.shape(shift_now) or not (np.allclose(shift, shift_now) and np.allclose(scale, scale_now)):
        return ("its training rows normalise otherwise than the run's normalization.npz says (other values, or "
                "the rows in another order)")
    # a run made before float64 targets hashed its regression targets as float32 (``as_run_made``)
    ours = TARGETS_DIGEST if then.get(TARGETS_DTYPE) or TARGETS_DIGEST_F32 not in now else TARGETS_DIGEST_F32
    if then.get(TARGETS_DIGEST) and now.get(ours) and then[TARGETS_DIGEST] != now[ours]:
        return ("its targets are not the run's (a label or target value changed, or the rows are in another "
                "order), though the features may be the same")
    if then.get(FEATURES_DIGEST) and now.get(FEATURES_DIGEST) and then[FEATURES_DIGEST] != now[FEATURES_DIGEST]:
        return ("its features are not the run's (values changed, or rows moved), though the targets and the "
                "training rows' means and spreads are the same")
    if a and b and a.get(FILES_DIGEST) and b.get(FILES_DIGEST) and a[FILES_DIGEST] != b[FILES_DIGEST]:
        return ("its files hold other values than the run's (a file rewritten with the same shape: their sampled "
                "contents differ)")
    return None


def target_setting(data: DataSettings) -> str:
    """The setting that names the targets: `data.label` for a table's column, else `data.y`."""
    from datafeed.readers import detect_format
    try:
        table = detect_format(data) in ("csv", "parquet")
    except DataError:
        table = bool(data.label) and not data.y
    return "`data.label`" if table else "`data.y`"


#: ``data.json``'s digest of the encoded targets in the file's row order (``targets_digest``); of
#: regression targets also as float32 (``TARGETS_DIGEST_F32``), what a run before float64 targets
#: hashed, and the targets' dtype (``TARGETS_DTYPE``: "float64"; absent in a run whose regression
#: targets were float32, which ``as_run_made`` keeps so)
TARGETS_DIGEST, TARGETS_DIGEST_F32, TARGETS_DTYPE = "targets_digest", "targets_digest_f32", "targets_dtype"


def targets_digest(y: np.ndarray) -> str:
    """A digest of encoded targets (class codes, or regression values) in row order: a resume, ``predict
    --data test`` and ``ensemble.load(run).data`` compare it (``data_changed``)."""
    import hashlib
    a = np.ascontiguousarray(y)
    h = hashlib.blake2b(digest_size=16)
    h.update(f"{a.dtype.str}{a.shape}".encode())
    h.update(a.tobytes())
    return h.hexdigest()


#: ``data.json``'s digest of the features read whole (``features_digest``), and of a streamed run's
#: files (``files_digest``, in ``meta["stream"]``)
FEATURES_DIGEST, FILES_DIGEST = "features_digest", "digest"
#: rows of the features ``features_digest`` hashes, evenly spaced (every row of a smaller dataset)
DIGEST_ROWS = 4096


def features_digest(x: np.ndarray) -> str:
    """A digest of the features as read (before any reshape or normalisation): their shape and up to
    ``DIGEST_ROWS`` rows evenly spaced, every row of a dataset that small (a few milliseconds either
    way). Rows swapped, or values changed, under the same targets and shape are seen there."""
    import hashlib
    a = np.asarray(x)
    rows = np.unique(np.linspace(0, len(a) - 1, min(len(a), DIGEST_ROWS)).astype(np.int64)) if len(a) else []
    h = hashlib.blake2b(digest_size=16)
    h.update(f"{a.dtype.str}{a.shape}".encode())
    h.update(np.ascontiguousarray(a[rows]).tobytes())
    return h.hexdigest()


def prepare_targets(y: np.ndarray, info: dict, data: DataSettings) -> tuple[np.ndarray, dict]:
    """The task, and the targets encoded for it (class codes, or float64 values: members train on them
    standardised in float64, then made float32, as features are), checked; returns (targets, metadata so
    far). Shared by the in-memory and the streaming path."""
    missing = missing_rows(y) if len(y) else []
    if len(missing):
        raise DataError(f"the targets ({target_setting(data)}) are missing in "
                        f"{len(missing)} of {len(y)} rows (first rows, counted from 0: {missing[:5].tolist()}); "
                        "drop those rows or fill them in")
    given = str(info["task"]) if data.task == "auto" and info.get("task") else data.task
    y, form = plain_labels(y, given)
    task = infer_task(y, given)
    meta: dict = {"task": task, "feature_names": info.get("feature_names", []), "split_from": split_from(data)}
    if info.get("categories"):                  # the text columns one-hot encoded (readers.one_hot)
        meta["categories"] = info["categories"]
    if form:
        meta["label_form"] = form
    if task == "classification":
        if y.dtype.kind == "f" and len(y) and not np.all(np.mod(y, 1) == 0) and len(np.unique(y)) > len(y) // 2:
            raise DataError(f"`data.task` is \"classification\", but the labels are fractional numbers with "
                            f"{len(np.unique(y))} distinct values in {len(y)} rows (a class per row or two); "
                            "set `data.task = \"regression\"` (or \"auto\")")
        y, names = encode_labels(y, info.get("class_names"))
        meta["class_names"], meta["n_outputs"] = names, len(names)
        if len(names) < 2:
            raise DataError("classification needs at least 2 classes, but the labels hold one")
    else:
        if y.dtype.kind not in "iuf":
            raise DataError(f"regression targets must be numeric, but have dtype {y.dtype}; "
                            "set `data.task = \"classification\"` for labels")
        # float64: a target such as a Unix time or a total energy (1.6e9 plus a spread of 100) kept 6
        # distinct values of 800 in float32, and the members, the baseline and the metrics saw only those
        y = y.astype(np.float64)
        if not np.isfinite(y).all():
            raise DataError("regression targets hold NaN/inf values; clean them before training")
        meta["n_outputs"] = 1 if y.ndim == 1 else int(np.prod(y.shape[1:]))
        if meta["n_outputs"] > 1:               # each target's name (its column), for its own metrics
            from datafeed.readers import label_columns
            names = label_columns(data.label) if data.label else []
            meta["target_names"] = names if len(names) == meta["n_outputs"] else \
                [str(j) for j in range(meta["n_outputs"])]
    meta[TARGETS_DIGEST] = targets_digest(y)
    if task == "regression":
        meta[TARGETS_DTYPE] = str(y.dtype)
        meta[TARGETS_DIGEST_F32] = targets_digest(y.astype(np.float32))
    return y, meta


def as_run_made(arrays: dict, meta: dict, then: dict) -> None:
    """Regression targets (``arrays``' ``y_*``, prepared now) and their ``meta`` as a run made before
    targets were float64 had them (``then``, its ``data.json``, names no ``TARGETS_DTYPE``): float32
    values, which its members were trained and scored on. Its resume, ``predict --data test`` and
    re-selection then score every member on the same targets (float64 ones scored the old members
    on 1.6e9-scale targets they were never given)."""
    if meta.get("task") != "regression" or then.get(TARGETS_DTYPE) or TARGETS_DIGEST_F32 not in meta:
        return
    for key in [k for k in arrays if k.startswith("y_")]:
        arrays[key] = np.asarray(arrays[key]).astype(np.float32)
    meta.pop(TARGETS_DTYPE, None)
    meta[TARGETS_DIGEST] = meta.pop(TARGETS_DIGEST_F32)


def choose_rows(y: np.ndarray, meta: dict, data: DataSettings, seed: int,
                rows: dict[str, np.ndarray] | None) -> dict[str, np.ndarray]:
    """The split as sorted row indices: ``rows`` as given (validation drawn from its train
    rows when it gives none), else drawn at random; notes ``val_drawn`` in ``meta``."""
    task = meta["task"]
    if rows is not None:
        given = {s: rows.get(s) for s in SPLITS}
        top = max((int(np.max(r)) for r in given.values() if r is not None and len(r)), default=-1)
        if top >= len(y):
            raise DataError(f"the split refers to row {top}, but the data has {len(y)} rows: it is not the "
                            "data the split was made for")
        idx = {s: np.asarray(r, dtype=np.int64) for s, r in given.items() if r is not None}
        meta["val_drawn"] = given["val"] is None
        if given["val"] is None:
            idx["train"], idx["val"] = draw_validation(y, idx["train"], task, data.val_fraction, seed)
    else:
        idx = split_indices(y, task, data.val_fraction, data.test_fraction, seed)
        meta["val_drawn"] = True
    return idx
