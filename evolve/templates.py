"""Known-good starting points: small networks that train well on their kind of input.

A search's first population holds these next to its random genomes (``evolve.templates``
in the config; ``Strategy(initial=...)``), so the random draws compete with a sensible
baseline from the first evaluation. Every spatial input gets a small CNN with batch norm:
two stages of kernel 3 with max pooling between them, global average pooling and one dense
layer. Sequences also get the fully convolutional network that is the standard baseline of
time-series classification (FCN, Wang, Yan and Oates 2017: three conv blocks of kernel 7, 5
and 3 with batch norm at full resolution, then a global pooling; narrower here), ending in
global max pooling (the strongest response anywhere: a pattern at an unknown place);
images and volumes, where convolving at full resolution costs several times more (5x on
the suite's 16x16 textures), get three stages (kernel 5, 5, 3) with max pooling for a wider
field of view instead. Flat tables get two MLPs (a funnel with dropout, and two residual
blocks with more dropout).

Chosen on the suite (``python scripts/search_problems.py templates --seeds 4``: each trained
alone, built as a searched network is, 4 splits, 20 epochs, patience 4; validation medians,
accuracy, R^2 for peaks; 2026-11-25):

| template | signals | textures | peaks |
|---|---|---|---|
| cnn (GAP) | 0.780 | 0.997 | 0.555 |
| cnn, global max pooling | 0.820 | 0.997 | 0.424 |
| FCN, global average pooling | 0.805 | 1.000 (4.8x the time) | 0.520 |
| FCN, global max pooling (sequences) | 0.832 | 1.000 (5x the time) | 0.260 (-0.20 to 0.41) |
| three pooled stages (images, volumes) | 0.745 | 0.998 | 0.233 |

The FCN with global max pooling is the best start for classifying sequences and a poor, unstable
one for peaks' regression (without its dropout worse still, 0.082), so a regression's FCN ends
in global average pooling (``templates_for(shape, "regression")``): 0.520 there, beside the
small CNN's 0.555.

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
#: for sequences (samples of one spatial axis), by name
SEQUENCE_TEMPLATES: dict[str, StructuredGenome] = {
    "cnn": _CNN,
    "fcn": StructuredGenome(stages=(Stage(1, 32, 7), Stage(1, 64, 5), Stage(1, 64, 3)), dense=(),
                            activation="relu", norm=True, residual=False, dropout=0.1,
                            reduction="global_max", optimizer="adam", learning_rate=1e-3, batch_size=32),
}
_DEEP = StructuredGenome(stages=(Stage(1, 16, 5), Stage(1, 32, 5, "maxpool", 2), Stage(1, 64, 3, "maxpool", 2)),
                         dense=(32,), activation="relu", norm=True, residual=False, dropout=0.1,
                         reduction="global_average", optimizer="adam", learning_rate=1e-3, batch_size=32)
#: for images, by name
IMAGE_TEMPLATES: dict[str, StructuredGenome] = {
    "cnn": _CNN,
    "detector": StructuredGenome(stages=(Stage(1, 32, 7),), dense=(), activation="relu", norm=False, residual=False,
                                 dropout=0.1, reduction="global_max", optimizer="adam", learning_rate=1e-3,
                                 batch_size=32),
    "deep": _DEEP,
}
#: for volumes, by name: no detector (a 7x7x7 kernel at full resolution costs 13 times the small CNN)
VOLUME_TEMPLATES: dict[str, StructuredGenome] = {"cnn": _CNN, "deep": _DEEP}
#: for flat tables, by name
TABLE_TEMPLATES: dict[str, StructuredGenome] = {
    "mlp": StructuredGenome(stages=(), dense=(128, 64), activation="relu", norm=False, residual=False,
                            dropout=0.1, optimizer="adam", learning_rate=1e-3, batch_size=32),
    "resmlp": StructuredGenome(stages=(), dense=(256, 256), activation="relu", norm=False, residual=True,
                               dropout=0.2, optimizer="adam", learning_rate=1e-3, batch_size=64),
}


#: a regression's sequence templates: the FCN ends in global average pooling (measured above:
#: global max pooling is the best start for classifying sequences, the worst for peaks' R^2)
SEQUENCE_REGRESSION_TEMPLATES: dict[str, StructuredGenome] = {
    **SEQUENCE_TEMPLATES, "fcn": SEQUENCE_TEMPLATES["fcn"].replace(reduction="global_average")}


def templates_for(input_shape: tuple[int, ...], task: str = "classification") -> dict[str, StructuredGenome]:
    """The templates of this input's kind and `task` ("classification" or "regression"), by
    name: one sample's shape, channels last."""
    rank = len(input_shape)
    if rank == 2:
        return SEQUENCE_REGRESSION_TEMPLATES if task == "regression" else SEQUENCE_TEMPLATES
    return TABLE_TEMPLATES if rank == 1 else IMAGE_TEMPLATES if rank == 3 else VOLUME_TEMPLATES


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
