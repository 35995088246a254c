"""In-situ inference in one process (placement "local", no MPI): the combined graph gives
``ensemble.predict``'s numbers at every batch size, is traced once, and refuses bad use
with messages that say what to do. The MPI placements: tests/mpi/test_insitu_mpi.py."""

from __future__ import annotations

import numpy as np
import pytest

from ensemble.inference import insitu
from ensemble.inference.load import PredictError


def test_rows_and_stack_are_inverse_on_nested_results():
    result = {"mean": np.arange(10.0), "std": np.ones((10, 2)), "intervals": {"90": np.arange(10.0) * 2}}
    parts = [insitu.rows(result, a, b) for a, b in ((0, 3), (3, 3), (3, 10))]
    assert [len(p["intervals"]["90"]) for p in parts] == [3, 0, 7]
    back = insitu.stack(parts)
    for key in ("mean", "std"):
        np.testing.assert_array_equal(back[key], result[key])
    np.testing.assert_array_equal(back["intervals"]["90"], result["intervals"]["90"])


def test_placement_is_checked_before_anything_is_read(tmp_path):
    with pytest.raises(PredictError, match="placement must be one of local, node, but got 'gpu'"):
        insitu.load(tmp_path / "nothing", placement="gpu")
    with pytest.raises(PredictError, match="placement 'node' needs an MPI communicator"):
        insitu.load(tmp_path / "nothing", placement="node")


@pytest.fixture(scope="module")
def reg_run(tmp_path_factory):
    from tests.mpi.test_predict_mpi import make_run
    base = tmp_path_factory.mktemp("insitu")
    rng = np.random.default_rng(0)
    x = rng.normal(size=(120, 5)).astype(np.float32) * [1, 10, 100, 0.1, 1] + 3
    np.savez(base / "d.npz", x=x, y=np.stack([x[:, 0] + 0.01 * x[:, 2], x[:, 1] * x[:, 3]], axis=1))
    make_run(base / "reg", {"source": str(base / "d.npz"), "task": "regression"},
             [{"id": "g-000", "weight": 0.6, "gaussian": True}, {"id": "plain-000", "weight": 0.4}])
    return base / "reg"


def flat(result: dict) -> dict:
    out = {f"{k}.{kk}": vv for k, v in result.items() if isinstance(v, dict) for kk, vv in v.items()}
    return {**out, **{k: v for k, v in result.items() if not isinstance(v, dict)}}


@pytest.mark.slow
def test_local_equals_predict_at_every_bucket_edge_and_traces_once(reg_run):
    from ensemble import load as load_ensemble
    session = insitu.load(reg_run, buckets=(16, 64))
    ens = load_ensemble(reg_run)
    assert session.traces == 1                          # traced and warmed at load
    rng = np.random.default_rng(3)
    for n in (0, 1, 15, 16, 17, 64, 65, 130, 200):     # padded to 16 or 64; over 64 in chunks; 0: none asked
        x = rng.normal(3.0, 20.0, size=(n, 5)).astype(np.float32)
        got = flat(session.predict(x))
        want = flat(ens.predict_details(x)) if n else {k: v[:0] for k, v in got.items()}    # predict needs rows
        assert set(got) == set(want) and "intervals.90" in got
        for key in want:
            assert got[key].shape == want[key].shape == (n, 2)
            # float32 rounding: a padded batch may sum in another order (oneDNN on AVX-512 CPUs)
            np.testing.assert_allclose(got[key], want[key], rtol=1e-5, atol=1e-5, err_msg=f"{n} {key}")
    mean, std = session.predict_mean_spread(x)
    np.testing.assert_array_equal(mean, got["mean"])
    assert (std > 0).all()
    assert session.traces == 1                          # no retracing for any batch size
    assert session.timings.calls == 10 and session.timings.rows == 1 + 15 + 16 + 17 + 64 + 65 + 130 + 200 + 200
    assert session._graph.bucket(17) == 64 and session._graph.bucket(1000) == 64


@pytest.mark.slow
def test_bad_input_and_use_say_what_to_do(reg_run):
    session = insitu.load(reg_run, buckets=(8,))
    with pytest.raises(PredictError, match="4 features per sample .* trained on 5"):
        session.predict(np.zeros((3, 4), np.float32))
    bad = np.zeros((3, 5), np.float32)
    bad[1, 2] = np.nan
    with pytest.raises(PredictError, match="NaN/inf"):
        session.predict(bad)
    with pytest.raises(PredictError, match="serve\\(\\) on a rank that does not serve"):
        session.serve()
    with session:
        pass
    with pytest.raises(PredictError, match="after close"):
        session.predict(np.zeros((3, 5), np.float32))
    with pytest.raises(PredictError, match="buckets must be positive"):
        insitu.load(reg_run, buckets=(0, 8))


class _Comm:
    """One rank of a world whose every node has ``size`` ranks (pure logic of NodeLink.make)."""

    def __init__(self, rank: int, size: int):
        self.rank, self.size = rank, size

    def Get_rank(self) -> int:
        return self.rank

    def Get_size(self) -> int:
        return self.size

    def allgather(self, value):
        return [value, value]

    def Split(self, color, key):
        return ("sim", color)

    def Free(self) -> None:
        pass


@pytest.mark.parametrize("asked, servers, warned", [(1, 1, False), (3, 3, False), (4, 3, True), (9, 3, True)])
def test_more_servers_than_a_node_can_keep_a_client_beside_are_fewer_and_said(asked, servers, warned, monkeypatch,
                                                                              recwarn):
    from ensemble.inference import insitu_serve
    monkeypatch.setattr(insitu_serve.mpi, "split_node", lambda comm: _Comm(comm.rank, 4))
    links = [insitu_serve.NodeLink.make(_Comm(rank, 8), asked) for rank in range(4)]
    assert [link.is_server for link in links] == [True] * servers + [False] * (4 - servers)
    said = [str(w.message) for w in recwarn.list]
    assert len(said) == int(warned)     # once, on rank 0 alone
    if warned:
        assert f"servers_per_node = {asked} leaves no client on a node of 4 ranks" in said[0]
        assert "runs 3 server(s) and 1 client" in said[0]


def test_one_error_on_many_ranks_is_said_once_with_its_ranks():
    """`buckets=()` on 3 ranks gave "rank 0: buckets must ...; rank 1: buckets must ...; rank 2: ..."."""
    from ensemble.inference.insitu_serve import collective

    class Three:                              # what the other ranks raised, as allgather returns it
        def Get_rank(self):
            return 0

        def allgather(self, mine):
            return [mine, mine, "another"]

    def make():
        raise PredictError("buckets must be positive")
    with pytest.raises(PredictError) as info:
        collective(Three(), make)
    assert str(info.value) == "ranks 0, 1: buckets must be positive; rank 2: another"
