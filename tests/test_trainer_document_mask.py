"""model.document_mask: attention stays inside documents and rotary positions restart at each one."""
import pytest
import torch

from gristmill.errors import UsageError
from gristmill.loader.documents import segments_to_batch
from gristmill.trainer import model as model_mod
from gristmill.trainer.model import DocumentMask, Transformer, model_args

S, CUT = 24, 9  # two documents per row: tokens [0, 9) and [9, 24)


def build(document_mask: bool, **kw) -> Transformer:
    torch.manual_seed(0)
    return Transformer(model_args("tiny", 97, S, document_mask=document_mask, **kw)).eval()


def rows_and_positions(n: int = 2):
    g = torch.Generator().manual_seed(1)
    tokens = torch.randint(1, 97, (n, S), generator=g)
    starts = torch.zeros(n, S, dtype=torch.bool)
    starts[:, 0] = starts[:, CUT] = True
    return tokens, segments_to_batch(starts.numpy())["position_ids"]


@pytest.mark.parametrize("n_kv_heads", [4, 2])
def test_a_document_does_not_see_the_one_before_it(n_kv_heads):
    tokens, pos = rows_and_positions()
    other = tokens.clone()
    other[:, :CUT] = (other[:, :CUT] + 5) % 96 + 1  # a different first document, same second one
    masked, plain = build(True, n_kv_heads=n_kv_heads), build(False, n_kv_heads=n_kv_heads)
    with torch.no_grad():
        a, b = masked(tokens, pos), masked(other, pos)
        assert torch.allclose(a[:, CUT:], b[:, CUT:], atol=1e-6, rtol=0)
        assert not torch.allclose(a[:, :CUT], b[:, :CUT])  # the changed document's own logits do change
        # Positions restart: the second document scores as it would alone at the start of a row.
        alone = masked(tokens[:, CUT:], pos[:, CUT:])
        assert torch.allclose(a[:, CUT:], alone, atol=1e-5, rtol=0)
        # Without the mask the second document attends to the first one.
        assert not torch.allclose(plain(tokens)[:, CUT:], plain(other)[:, CUT:], atol=1e-3)


def test_masked_gradients_do_not_cross_documents():
    tokens, pos = rows_and_positions(1)
    m = build(True)
    emb = m.tok_embeddings
    h = emb(tokens).detach().requires_grad_(True)
    m.tok_embeddings = torch.nn.Identity()  # feed embeddings directly to take the gradient w.r.t. them
    m.tok_embeddings.weight = emb.weight
    logits = m(h, pos)
    logits[:, CUT:].sum().backward()
    assert h.grad[:, :CUT].abs().max() == 0 and h.grad[:, CUT:].abs().max() > 0


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
def test_flex_block_mask_agrees_with_the_dense_mask(monkeypatch):
    """The GPU path's block mask, run on CPU with eager flex attention (forward only on CPU)."""
    from torch.nn.attention.flex_attention import flex_attention

    tokens, pos = rows_and_positions()
    m = build(True)
    monkeypatch.setattr(model_mod, "_compiled_flex", flex_attention)  # eager: no compiler needed
    with torch.no_grad():
        dense = m(tokens, pos)
        monkeypatch.setattr(DocumentMask, "choose", staticmethod(lambda attention, x: "flex"))
        flex = m(tokens, pos)
    assert torch.allclose(dense, flex, atol=1e-5, rtol=0)


def test_document_mask_without_position_ids_is_refused():
    with pytest.raises(UsageError, match="documents=True"):
        build(True)(torch.ones(1, S, dtype=torch.long))


@pytest.mark.slow
def test_the_trainer_trains_with_the_document_mask(tmp_path):
    """model.document_mask=true end to end: the loader serves position ids, the loss falls, and the
    checkpoint records the setting (a kernel choice: resuming without it is allowed)."""
    from test_trainer import losses, meta, train
    from gristmill.manifests.synthetic import build_synthetic

    url = build_synthetic(str(tmp_path / "d"), dataset="count", vocab_size=64, shard_rows=(48, 48), val_rows=(16,),
                          tokens="counting", doc_tokens=(4, 12)).url
    run_dir = str(tmp_path / "run")
    train(url, run_dir, "model.document_mask=true")
    got = losses(run_dir)
    assert all(x == x for x in got) and got[-1] < got[0]
    assert meta(run_dir, 12)["model_args"]["document_mask"] is True
    train(url, run_dir, "run.steps=14", check=True)  # the same weights resume with the plain causal mask
