"""Known-good starting points: small networks that train well on their kind of input.

A search's first population holds these next to its random genomes (``evolve.templates``
in the config; ``Strategy(initial=...)``), so the random draws compete with a sensible
baseline from the first evaluation. Every spatial input gets a small CNN with batch norm:
two stages of kernel 3 with max pooling between them, global average pooling and one dense
layer. Sequences also get the fully convolutional network that is the standard baseline of
time-series classification (FCN, Wang, Yan and Oates 2017: three conv blocks of kernel 7, 5
and 3 with batch norm at full resolution, then a global pooling; narrower here), ending in
global max pooling (the strongest response anywhere: a pattern at an unknown place; global
average pooling for a regression). A classifier of sequences or images also gets a detector:
one convolution of kernel 7 at full resolution, 32 wide, without batch norm, then global max
pooling (a small pattern anywhere in the input; fewer multiply-adds than the small CNN's
second stage); images also three stages (kernel 5, 5, 3) with max pooling for a wider field
of view; volumes the same as images. Flat tables get two MLPs (a funnel with dropout, and two
residual blocks with more dropout).

Chosen on the suite (``python scripts/search_problems.py templates --seeds 4``: each trained
alone, built as a searched network is, 4 splits, 20 epochs, patience 4; validation medians,
accuracy, R^2 for peaks, seconds for the 4 splits; 2026-11-25, 589 s):

| template | signals | textures | peaks | stripes |
|---|---|---|---|---|
| cnn (GAP) | 0.780 (11 s) | 0.997 (16 s) | 0.555 (16 s) | 0.852 (16 s) |
| cnn, global max pooling | 0.820 (9 s) | 0.997 (14 s) | 0.424 (13 s) | 0.822 (14 s) |
| FCN, global average pooling (sequence regression) | 0.805 (14 s) | 1.000 (66 s) | 0.520 (16 s) | 0.922 (38 s) |
| FCN, global max pooling (sequence classification) | 0.832 (10 s) | 1.000 (71 s) | 0.260 (18 s) | 0.938 (80 s) |
| detector (images) | 0.848 (9 s) | 1.000 (13 s) | 0.066 (5 s) | 0.968 (15 s) |
| detector with batch norm | 0.837 (10 s) | 1.000 (17 s) | 0.162 (10 s) | 0.943 (19 s) |
| three pooled stages (images, volumes) | 0.745 (11 s) | 0.998 (24 s) | 0.233 (17 s) | 0.845 (15 s) |

The FCN with global max pooling is a good start for classifying sequences and a poor, unstable
one for peaks' regression (without its dropout worse still, 0.082), so a regression's FCN ends
in global average pooling (``templates_for(shape, "regression")``): 0.520 there, beside the
small CNN's 0.555. The detector is the weakest start there with either pooling (0.066 with
max pooling, 0.490 with average pooling: ``python scripts/search_problems.py templates
--seeds 4 --problem peaks``, 2026-11-25 evening), so a regression leaves it out. It is the
best start on stripes by far and on signals too (0.848, ahead of the FCN, at less of its
time), so a classifier of sequences starts from it too. They are handed out best first for
the task (``BEST_FIRST``): on 2 workers the first population's first two train at once, so
those two are the first results a search sees (on signals, 2026-11-27: the first result
0.783-0.858 over 5 seeds, against 0.752-0.805 over 3 with the CNN and the FCN first;
docs/search-benchmark.md).

A small residual CNN (three stages of two blocks, strided) was a template until the suite
showed it dominated (validation 0.60-0.76 on signals and R^2 0.46-0.51 on peaks against
0.71-0.78 and 0.58-0.59 for the first CNN, and 3x its time on textures).
Each is moved into the search space (``repair``:
widths to the nearest allowed, no downsampling where the maps are too small, too many
parameters shrunk); one the space cannot hold is left out. In a free space a template is
its lowered layer list (``StructuredGenome.to_genome``), repaired into that space.
"""

from __future__ import annotations

from evolve.repair import repair
from evolve.space import SearchSpace
from evolve.structured import AnyGenome, Stage, StructuredGenome

_CNN = StructuredGenome(stages=(Stage(1, 32, 3), Stage(1, 64, 3, "maxpool", 2)), dense=(64,),
                        activation="relu", norm=True, residual=False, dropout=0.1,
                        reduction="global_average", optimizer="adam", learning_rate=1e-3, batch_size=32)
_DETECTOR = StructuredGenome(stages=(Stage(1, 32, 7),), dense=(), activation="relu", norm=False, residual=False,
                             dropout=0.1, reduction="global_max", optimizer="adam", learning_rate=1e-3, batch_size=32)
#: for sequences (samples of one spatial axis), by name
SEQUENCE_TEMPLATES: dict[str, StructuredGenome] = {
    "cnn": _CNN,
    "fcn": StructuredGenome(stages=(Stage(1, 32, 7), Stage(1, 64, 5), Stage(1, 64, 3)), dense=(),
                            activation="relu", norm=True, residual=False, dropout=0.1,
                            reduction="global_max", optimizer="adam", learning_rate=1e-3, batch_size=32),
    "detector": _DETECTOR,
}
#: for images and volumes, by name
IMAGE_TEMPLATES: dict[str, StructuredGenome] = {
    "cnn": _CNN,
    "detector": _DETECTOR,
    "deep": StructuredGenome(stages=(Stage(1, 16, 5), Stage(1, 32, 5, "maxpool", 2), Stage(1, 64, 3, "maxpool", 2)),
                             dense=(32,), activation="relu", norm=True, residual=False, dropout=0.1,
                             reduction="global_average", optimizer="adam", learning_rate=1e-3, batch_size=32),
}
#: for flat tables, by name
TABLE_TEMPLATES: dict[str, StructuredGenome] = {
    "mlp": StructuredGenome(stages=(), dense=(128, 64), activation="relu", norm=False, residual=False,
                            dropout=0.1, optimizer="adam", learning_rate=1e-3, batch_size=32),
    "resmlp": StructuredGenome(stages=(), dense=(256, 256), activation="relu", norm=False, residual=True,
                               dropout=0.2, optimizer="adam", learning_rate=1e-3, batch_size=64),
}


#: the templates a search starts from, per task, in the order it hands them out: best first, as each
#: scored alone on the suite (the table above: signals and stripes for a classifier, peaks for a
#: regression), so the first results a search gets back, while few workers hold the first
#: population, are its best starts. A regression leaves the detector out: it was the weakest
#: start for `peaks` (0.490 R^2 with average pooling, 0.066 with max pooling)
BEST_FIRST: dict[str, tuple[str, ...]] = {
    "classification": ("detector", "fcn", "cnn", "deep", "mlp", "resmlp"),
    "regression": ("cnn", "fcn", "deep", "mlp", "resmlp"),
}


def templates_for(input_shape: tuple[int, ...], task: str = "classification") -> dict[str, StructuredGenome]:
    """The templates of this input's kind and `task` ("classification" or "regression"), by
    name, best first (``BEST_FIRST``, which also leaves a regression's detector out): one
    sample's shape, channels last. A regression's FCN ends in global average pooling where a
    classifier's takes the maximum (measured above: max pooling is the best start for
    classifying sequences and the worst for `peaks`' R^2)."""
    rank = len(input_shape)
    kind = TABLE_TEMPLATES if rank == 1 else SEQUENCE_TEMPLATES if rank == 2 else IMAGE_TEMPLATES
    regression = task == "regression"
    order = BEST_FIRST["regression" if regression else "classification"]
    chosen = {name: kind[name] for name in order if name in kind}
    return {name: g.replace(reduction="global_average") if regression and g.reduction == "global_max" else g
            for name, g in chosen.items()}


def templates(space: SearchSpace, input_shape: tuple[int, ...], n_outputs: int,
              task: str = "classification") -> list[AnyGenome]:
    """The templates for this input's kind and `task`, each valid for ``space`` (distinct; in
    the order above)."""
    out: list[AnyGenome] = []
    for template in templates_for(tuple(input_shape), task).values():
        start: AnyGenome = template if space.structured else template.to_genome()
        fitted = repair(start, tuple(input_shape), n_outputs, space)
        if fitted is not None and all(fitted.key() != g.key() for g in out):
            out.append(fitted)
    return out
