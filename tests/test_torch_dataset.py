"""GristmillDataset: the Loader inside torch's DataLoader (and torchdata's StatefulDataLoader), exact resume."""
import pytest
import torch
from torch.utils.data import DataLoader
from torchdata.stateful_dataloader import StatefulDataLoader

from helpers import build_dataset
from gristmill.errors import UsageError
from gristmill.loader import Caching, GristmillDataset, Loader, Sampling, Threads

B, STEPS = 4, 7
pytestmark = pytest.mark.filterwarnings("ignore:.set_vital. is deprecated")  # torchdata 0.11 on torch 2.13


@pytest.fixture(scope="module")
def pub(tmp_path_factory):
    return build_dataset(str(tmp_path_factory.mktemp("tds")))


@pytest.fixture(scope="module")
def reference(pub, tmp_path_factory):
    """The Loader's own first STEPS batches: what every DataLoader must reproduce, item for item."""
    out = []
    with Loader(pub.url, Sampling(global_batch=B, seed=5), caching=Caching(dir=str(tmp_path_factory.mktemp("c"))),
                threads=Threads(workers=0)) as ld:
        for batch in ld:
            out.append(batch)
            if len(out) == STEPS:
                break
    return out


def dataset(pub, tmp_path, **kw):
    return GristmillDataset(pub.url, batch_size=B, seed=5, cache_dir=str(tmp_path), **kw)


def take(loader, n):
    out = []
    for batch in loader:
        out.append(batch)
        if len(out) == n:
            break
    return out


def assert_same(got, want):
    assert len(got) == len(want)
    for a, b in zip(got, want):
        assert a["step"] == b["step"]
        assert torch.equal(a["indices"], b["indices"]) and torch.equal(a["tokens"], b["tokens"])


@pytest.mark.parametrize("num_workers", [0, 2])
def test_dataloader_serves_the_loader_order_and_resumes_exactly(pub, reference, tmp_path, num_workers):
    ds = dataset(pub, tmp_path)
    assert_same(take(DataLoader(ds, batch_size=None, num_workers=num_workers), STEPS), reference)
    # Resume a plain DataLoader after 3 items: the dataset state is one global index.
    resumed = dataset(pub, tmp_path)
    resumed.load_state_dict({"next_index": 3 * B, **{k: v for k, v in ds.state_dict().items() if k != "next_index"}})
    assert_same(take(DataLoader(resumed, batch_size=None, num_workers=num_workers), STEPS - 3), reference[3:])


@pytest.mark.parametrize("num_workers", [0, 2])
def test_stateful_dataloader_resumes_exactly(pub, reference, tmp_path, num_workers):
    dl = StatefulDataLoader(dataset(pub, tmp_path), batch_size=None, num_workers=num_workers)
    it = iter(dl)
    first = [next(it) for _ in range(3)]
    state = dl.state_dict()
    del it
    again = StatefulDataLoader(dataset(pub, tmp_path), batch_size=None, num_workers=num_workers)
    again.load_state_dict(state)
    assert_same(first + take(again, STEPS - 3), reference)


def test_worker_shares_are_disjoint_and_epochs_end(pub, tmp_path):
    ds = dataset(pub, tmp_path, epochs=1)
    items = list(DataLoader(ds, batch_size=None, num_workers=2))
    n = Loader(pub.url, caching=Caching(dir=str(tmp_path))).num_samples
    assert len(items) == n // B  # the last partial batch is dropped, as the Loader does
    seen = torch.cat([b["indices"] for b in items])
    assert seen.tolist() == list(range(n // B * B))


def test_a_state_of_another_order_is_refused(pub, tmp_path):
    ds = dataset(pub, tmp_path)
    with pytest.raises(UsageError, match="seed"):
        ds.load_state_dict({**ds.state_dict(), "seed": 6})
    with pytest.raises(UsageError, match="set by the dataset"):
        dataset(pub, tmp_path, global_batch=8)


def test_the_loader_itself_is_not_a_dataset(pub, tmp_path):
    """Why the wrapper exists: DataLoader(Loader) fails (a Loader holds threads and is not an IterableDataset)."""
    with Loader(pub.url, caching=Caching(dir=str(tmp_path)), threads=Threads(workers=0)) as ld, pytest.raises(TypeError):
        iter(DataLoader(ld, batch_size=None))


@pytest.mark.parametrize("num_workers", [0, 3])
def test_a_finite_mixture_serves_every_step_at_any_worker_count(tmp_path, num_workers):
    """A mixture that ends (a `stop` component) ends at the same step whatever the worker count:
    a worker's last round may stop short of the others' slots, never drop its own."""
    import os

    import yaml

    from gristmill.cli import main
    from gristmill.manifests.synthetic import build_synthetic

    for name, rows, seed in (("web", (30,), 1), ("code", (10,), 2)):
        build_synthetic(str(tmp_path), dataset=name, shard_rows=rows, val_rows=(), seed=seed)
    job = tmp_path / "m.yaml"
    job.write_text(yaml.safe_dump({"name": "m", "store": str(tmp_path / "store"), "components": [
        {"dataset": "web", "weight": 3}, {"dataset": "code", "weight": 1, "exhausted": "stop"}]}))
    assert main(["mix", str(job)]) == 0
    url = os.path.join(str(tmp_path), "store", "m")
    with Loader(url, Sampling(global_batch=B, seed=5), caching=Caching(dir=str(tmp_path / "c")),
                threads=Threads(workers=0)) as ld:
        want = list(ld)
    assert len(want) == 10  # 40 samples: 10 steps, which neither 3 workers (nor 4) divide
    ds = GristmillDataset(url, batch_size=B, seed=5, cache_dir=str(tmp_path / "c"))
    assert_same(list(DataLoader(ds, batch_size=None, num_workers=num_workers)), want)
