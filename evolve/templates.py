"""Known-good starting points: small networks that train well on their kind of input.

A search's first population holds these next to its random genomes (``evolve.templates``
in the config; ``Strategy(initial=...)``), so the random draws compete with a sensible
baseline from the first evaluation. Sequences, images and volumes get a small CNN (two
stages, batch norm, global average pooling, one dense layer) and a small residual CNN
(three stages of two blocks, strided); flat tables get two MLPs (a funnel with dropout, and
two residual blocks with more dropout). Only the first has batch norm: in a short training
its moving statistics lag behind (Keras' momentum 0.99), which on a quick try hurt the
residual CNN's validation accuracy badly. Each is moved into the search space (``repair``:
widths to the nearest allowed, no downsampling where the maps are too small, too many
parameters shrunk); one the space cannot hold is left out. In a free space a template is
its lowered layer list (``StructuredGenome.to_genome``), repaired into that space.
"""

from __future__ import annotations

from evolve.repair import repair
from evolve.space import SearchSpace
from evolve.structured import AnyGenome, Stage, StructuredGenome

#: for sequences, images and volumes, by name
SPATIAL_TEMPLATES: dict[str, StructuredGenome] = {
    "cnn": StructuredGenome(stages=(Stage(1, 32, 3), Stage(1, 64, 3, "maxpool", 2)), dense=(64,),
                            activation="relu", norm=True, residual=False, dropout=0.1,
                            reduction="global_average", optimizer="adam", learning_rate=1e-3, batch_size=32),
    "resnet": StructuredGenome(stages=(Stage(2, 32, 3), Stage(2, 64, 3, "stride", 2), Stage(2, 128, 3, "stride", 2)),
                               dense=(), activation="relu", norm=False, residual=True, dropout=0.0,
                               reduction="global_average", optimizer="adam", learning_rate=1e-3, batch_size=64),
}
#: for flat tables, by name
TABLE_TEMPLATES: dict[str, StructuredGenome] = {
    "mlp": StructuredGenome(stages=(), dense=(128, 64), activation="relu", norm=False, residual=False,
                            dropout=0.1, optimizer="adam", learning_rate=1e-3, batch_size=32),
    "resmlp": StructuredGenome(stages=(), dense=(256, 256), activation="relu", norm=False, residual=True,
                               dropout=0.2, optimizer="adam", learning_rate=1e-3, batch_size=64),
}


def templates(space: SearchSpace, input_shape: tuple[int, ...], n_outputs: int) -> list[AnyGenome]:
    """The templates for this input's kind, each valid for ``space`` (distinct; in the order above)."""
    chosen = SPATIAL_TEMPLATES if len(input_shape) > 1 else TABLE_TEMPLATES
    out: list[AnyGenome] = []
    for template in chosen.values():
        start: AnyGenome = template if space.structured else template.to_genome()
        fitted = repair(start, tuple(input_shape), n_outputs, space)
        if fitted is not None and all(fitted.key() != g.key() for g in out):
            out.append(fitted)
    return out
