"""Known-good starting points: small networks that train well on their kind of input.

A search's first population holds these next to its random genomes (``evolve.templates``
in the config; ``Strategy(initial=...)``), so the random draws compete with a sensible
baseline from the first evaluation. Sequences, images and volumes get two small CNNs with
batch norm, max pooling, global average pooling and one dense layer: two stages of kernel 3,
and three stages (kernel 5, 5, 3) for a wider field of view; flat tables get two MLPs (a
funnel with dropout, and two residual blocks with more dropout). A small residual CNN
(three stages of two blocks, strided) was a template until the suite showed it dominated
(trained alone, 3 seeds each: validation 0.60-0.76 on signals and R^2 0.46-0.51 on peaks
against 0.71-0.78 and 0.58-0.59 for the first CNN, and 3x its time on textures).
Each is moved into the search space (``repair``:
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
