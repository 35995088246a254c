"""Members of one architecture reuse a worker's traced training step (``runtime.traced_models``,
``ensemble.train.traced``): a member trained on a kept model ends bit for bit as on a new one;
what a traced step depends on decides what is reused; the cache stays within its size."""

from __future__ import annotations

import json

import numpy as np
import pytest

from ensemble.results.records import REUSED_TRACE, Status
from ensemble.results.rundir import RunDirectory
from ensemble.train.traced import TracedModels, trace_key
from tests.ensemble.test_packed import make_data
from tests.ensemble.test_packed import spec as packed_spec

LAYERS = [{"type": "Dense", "units": 16, "activation": "relu"}, {"type": "BatchNormalization"},
          {"type": "Dropout", "rate": 0.3}, {"type": "Dense", "units": 8, "activation": "tanh"}]
TF = {"precision": "float32", "jit_compile": False}


def spec(i: int, **extra):
    """``test_packed``'s member spec (whose data ``make_data`` is) with Batch Normalization, AdamW
    and 6 epochs."""
    return packed_spec(i, **{"layers": LAYERS, "optimizer": "adamw", "epochs": 6, **extra})


#: members after the first: another seed (and a bootstrap), then another learning rate and batch size
CHANGES = [spec(1), spec(2, learning_rate=0.003, batch_size=16)]


@pytest.mark.slow                  # TensorFlow training: make test, not make test-fast
@pytest.mark.parametrize("task,precision", [("classification", "float32"),     # the others: make test-long
                                            pytest.param("regression", "float32", marks=pytest.mark.long),
                                            pytest.param("classification", "mixed_float16", marks=pytest.mark.long)])
def test_a_member_on_a_kept_model_ends_as_on_a_new_one(tmp_path, task, precision):
    import keras

    from ensemble.runtime.env import configure_tensorflow
    from ensemble.train.member import run_member
    from ensemble.train.traced import TRACED
    data, meta = make_data(task)
    TRACED.clear()
    configure_tensorflow(1, precision, traced_models=2)
    try:
        kept_dir, new_dir = RunDirectory(tmp_path / "kept"), RunDirectory(tmp_path / "new")
        first = run_member(spec(0), data, meta, kept_dir, 0)
        again = [run_member(s, data, meta, kept_dir, 0) for s in CHANGES]
        other = run_member(spec(3, optimizer="adam"), data, meta, kept_dir, 0)      # another key: traced anew
        assert REUSED_TRACE not in first and REUSED_TRACE not in other
        assert [r.get(REUSED_TRACE) for r in again] == [True] * len(CHANGES)
        assert len(TRACED) == 2                       # adamw and adam
        configure_tensorflow(1, precision, traced_models=0)      # the same members, each on a new model
        for changed, kept in zip(CHANGES, again, strict=True):
            new = run_member(changed, data, meta, new_dir, 0)
            assert new["status"] == kept["status"] == Status.OK.value and REUSED_TRACE not in new
            assert new["epochs"] == kept["epochs"] and new["stopped"] == kept["stopped"]
            assert new["val"] == kept["val"] and new["test"] == kept["test"]
            np.testing.assert_array_equal(new["payload"]["arrays"]["test_pred"],
                                          kept["payload"]["arrays"]["test_pred"])
            mine = keras.models.load_model(tmp_path / "kept" / kept["path"], compile=False)
            twin = keras.models.load_model(tmp_path / "new" / new["path"], compile=False)
            for w, v in zip(mine.get_weights(), twin.get_weights(), strict=True):
                np.testing.assert_array_equal(w, v)
            np.testing.assert_array_equal(mine(data["x_test"][:5]), twin(data["x_test"][:5]))
    finally:
        TRACED.clear()
        configure_tensorflow(1)


def tracings(function) -> int:
    """How often the most traced of the tf.functions behind Keras's ``train_function`` (the
    loop over the iterator, the step inside it) was traced."""
    counted, seen, todo = [], set(), [function]
    while todo:
        f = todo.pop()
        if id(f) in seen:
            continue
        seen.add(id(f))
        if hasattr(f, "experimental_get_tracing_count"):
            counted.append(f.experimental_get_tracing_count())
            f = getattr(f, "_python_function", f)
        for cell in getattr(f, "__closure__", None) or ():
            try:
                todo.extend([cell.cell_contents] if callable(cell.cell_contents) else [])
            except ValueError:              # an empty cell
                pass
    assert len(counted) >= 2, "the loop and the step tf.functions were not found behind the train_function"
    return max(counted)


@pytest.mark.slow
def test_a_new_models_training_step_is_traced_once_and_trains_as_before(tmp_path):
    """Keras 3 builds the optimizer's and the metrics' variables inside the first trace of the
    training step, and a tf.function that creates variables is traced again:
    ``build_training_state`` creates them first, with the values the trace would give."""
    import keras

    from datafeed.pipeline import make_dataset
    from ensemble.runtime.env import configure_tensorflow
    from ensemble.task import get_task
    from ensemble.train.architecture import build_model, build_training_state, make_optimizer
    configure_tensorflow(1)
    data, meta = make_data("regression")
    task = get_task("regression")
    trained = []
    for early in (False, True):
        keras.utils.set_random_seed(5)
        model = build_model(spec(0), tuple(meta["input_shape"]), meta["n_outputs"], task.name)
        loss, metrics = task.loss(True)                         # the Gaussian head: two outputs, own loss
        model.compile(optimizer=make_optimizer("adamw", 0.01), loss=loss, metrics=metrics)
        ds = make_dataset(data["x_train"], data["y_train"], np.arange(len(data["y_train"])), 16, 3)
        if early:
            build_training_state(model, ds)
            assert model.optimizer.built
        model.fit(ds, epochs=2, verbose=0)
        assert tracings(model.train_function) == (1 if early else 2)     # 2: what Keras alone does
        trained.append(model)
    for w, v in zip(trained[0].get_weights(), trained[1].get_weights(), strict=True):
        np.testing.assert_array_equal(w, v)
    for w, v in zip(trained[0].optimizer.variables, trained[1].optimizer.variables, strict=True):
        np.testing.assert_array_equal(np.asarray(w), np.asarray(v))
    # a member run builds it so
    from ensemble.runtime.env import TENSORFLOW
    from ensemble.train.member import run_member
    from ensemble.train.traced import TRACED, trace_key
    TRACED.clear()
    configure_tensorflow(1, traced_models=1)
    try:
        assert run_member(spec(0), data, meta, RunDirectory(tmp_path), 0)["status"] == Status.OK.value
        assert tracings(TRACED.take(trace_key(spec(0), meta, TENSORFLOW)).train_function) == 1
    finally:
        TRACED.clear()
        configure_tensorflow(1)


@pytest.mark.slow
def test_a_member_traced_ahead_ends_as_one_traced_by_itself_and_traces_once(tmp_path):
    from ensemble.runtime.env import TENSORFLOW, configure_tensorflow
    from ensemble.train.member import run_member
    from ensemble.train.traced import PRETRACE, TRACED, trace_key
    data, meta = make_data("classification")
    now, upcoming = spec(0), spec(1, layers=LAYERS[1:], batch_size=16)       # another architecture
    TRACED.clear()
    configure_tensorflow(1, traced_models=2)
    try:
        assert not PRETRACE.start(spec(2), now, data, meta, TENSORFLOW)     # the same steps as now's
        assert PRETRACE.start(upcoming, now, data, meta, TENSORFLOW)
        first = run_member(now, data, meta, RunDirectory(tmp_path / "a"), 0)          # while it traces
        ahead = run_member(upcoming, data, meta, RunDirectory(tmp_path / "a"), 0)
        assert REUSED_TRACE not in first and ahead[REUSED_TRACE] is True and PRETRACE.traced == 1
        model = TRACED.take(trace_key(upcoming, meta, TENSORFLOW))
        assert tracings(model.train_function) == 1          # traced ahead; the member's own fit traced nothing
        TRACED.keep(trace_key(upcoming, meta, TENSORFLOW), model)
        assert not PRETRACE.start(upcoming, now, data, meta, TENSORFLOW)     # kept already
        configure_tensorflow(1, traced_models=0)
        assert not PRETRACE.start(spec(3, layers=LAYERS[2:]), now, data, meta, TENSORFLOW)   # off
        alone = run_member(upcoming, data, meta, RunDirectory(tmp_path / "b"), 0)
        assert alone["val"] == ahead["val"] and alone["test"] == ahead["test"]
        assert alone["epochs"] == ahead["epochs"]
        np.testing.assert_array_equal(alone["payload"]["arrays"]["val_pred"], ahead["payload"]["arrays"]["val_pred"])
    finally:
        TRACED.clear()
        configure_tensorflow(1)


@pytest.mark.slow
def test_a_kept_model_whose_variables_differ_is_not_adopted():
    import keras

    from ensemble.runtime.env import configure_tensorflow
    from ensemble.train.architecture import build_model, make_optimizer
    from ensemble.train.traced import adopt
    configure_tensorflow(1)
    kept = build_model({"layers": LAYERS}, (6,), 3, "classification")
    kept.compile(optimizer=make_optimizer("adam", 0.01), loss="sparse_categorical_crossentropy")
    kept.optimizer.build(kept.trainable_variables)
    before = [w.copy() for w in kept.get_weights()]
    fresh = build_model({"layers": LAYERS[:1]}, (6,), 3, "classification")
    assert not adopt(kept, fresh, make_optimizer("adam", 0.01))
    other = build_model({"layers": LAYERS}, (6,), 3, "classification")     # same shapes, other optimizer
    assert not adopt(kept, other, keras.optimizers.SGD(learning_rate=0.01))
    for w, v in zip(kept.get_weights(), before, strict=True):
        np.testing.assert_array_equal(w, v)
    assert adopt(kept, other, make_optimizer("adam", 0.01))
    for w, v in zip(kept.get_weights(), other.get_weights(), strict=True):
        np.testing.assert_array_equal(w, v)


META = {"task": "classification", "input_shape": [6], "n_outputs": 3}


def test_the_key_holds_what_a_traced_step_depends_on_and_nothing_per_member():
    base = trace_key(spec(0), META, TF)
    assert base == trace_key(spec(1, epochs=99, patience=7, member_time_limit=5.0, report_every=1,
                                  inherit={"from": "e1", "path": "x"}), META, TF)
    assert json.loads(base)["spec"]["layers"] == LAYERS
    assert base == trace_key(spec(2, learning_rate=0.02, batch_size=64), META, TF)
    for changed in (spec(0, optimizer="adam"), spec(0, loss="mse"), spec(0, layers=LAYERS[:2])):
        assert trace_key(changed, META, TF) != base
    regression = {**META, "task": "regression", "n_outputs": 1}
    assert trace_key(spec(0), regression, TF) != base
    assert trace_key(spec(0), regression, TF) != trace_key(spec(0, loss="mse"), regression, TF)   # Gaussian head
    assert trace_key(spec(0), {**META, "input_shape": [7]}, TF) != base
    assert trace_key(spec(0), META, {**TF, "precision": "mixed_float16"}) != base
    assert trace_key(spec(0), META, {**TF, "jit_compile": True}) != base
    assert trace_key(spec(0, model="pkg.mod:build"), META, TF) is None     # a user's builder
    assert trace_key(spec(0), META, TF, group=object()) is None            # a member group


class Small:
    """A stand-in for a compiled model: ``variables`` of ``n`` float32 numbers, no optimizer."""

    def __init__(self, name: str, n: int = 10):
        self.name, self.variables = name, [np.zeros(n, dtype=np.float32)]

    def __eq__(self, other) -> bool:
        return isinstance(other, Small) and other.name == self.name


def test_the_cache_hands_a_model_out_once_and_keeps_at_most_its_size():
    from ensemble.train.traced import KEEP_BYTES
    cache = TracedModels(size=2)
    for key in ("a", "b", "c"):
        cache.keep(key, Small(f"model {key}"))
    assert len(cache) == 2 and cache.take("a") is None          # the least recently used went
    assert cache.take("b") == Small("model b") and cache.take("b") is None
    cache.keep("b", Small("model b"))
    cache.keep("d", Small("model d"))                           # "c" is now the oldest
    assert cache.take("c") is None and cache.take("b") == Small("model b")
    assert cache.take(None) is None
    cache.keep("big", Small("big", KEEP_BYTES // 4 + 1))           # over the memory bar: not kept
    assert "big" not in cache and cache.take("big") is None
    off = TracedModels(size=0)
    off.keep("a", Small("model a"))
    assert len(off) == 0 and off.take("a") is None
