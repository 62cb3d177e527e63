"""Model invariants: cached decoding equals a full forward, padding and future tokens change nothing."""

from __future__ import annotations

import pytest
import torch

from conftest import tiny_config
from tfm_cli.errors import TfmError
from tfm_cli.model import Transformer, parameter_shapes


def batch(seed: int = 0):
    """src (3, 9) with different padding per row, tgt_in (3, 6) starting with BOS."""
    generator = torch.Generator().manual_seed(seed)
    src = torch.randint(4, 40, (3, 9), generator=generator)
    src[1, 6:] = 0
    src[2, 2:] = 0
    tgt_in = torch.randint(4, 40, (3, 6), generator=generator)
    tgt_in[:, 0] = 2
    return src, tgt_in


@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("share_embeddings", [False, True])
def test_incremental_decoding_with_reorder_equals_full_forward(norm_first, share_embeddings):
    torch.manual_seed(0)
    model = Transformer(tiny_config(norm_first=norm_first, share_embeddings=share_embeddings)).eval()
    src, tgt_in = batch()
    with torch.no_grad():
        full = model(src, tgt_in)  # (3, 6, V)
        state = model.start_decoding(model.encode(src))
        # Reorder halfway through, as beam search does: rows become (2, 0, 0, 1).
        order = torch.tensor([2, 0, 0, 1])
        steps = []
        rows = torch.arange(3)
        for t in range(tgt_in.size(1)):
            if t == 3:
                state.select(order)
                rows = rows[order]
            steps.append((rows.clone(), model.decode_step(tgt_in[rows, t], state).logits))
    for t, (step_rows, logits) in enumerate(steps):
        torch.testing.assert_close(logits, full[step_rows, t], atol=1e-5, rtol=0)


def test_padding_changes_no_real_position():
    torch.manual_seed(0)
    model = Transformer(tiny_config()).eval()
    src, tgt_in = batch()
    with torch.no_grad():
        padded = model(src, tgt_in)[2]
        alone = model(src[2:3, :2], tgt_in[2:3])[0]
    torch.testing.assert_close(padded, alone, atol=1e-5, rtol=0)


def test_future_target_tokens_change_no_earlier_output():
    torch.manual_seed(0)
    model = Transformer(tiny_config()).eval()
    src, tgt_in = batch()
    changed = tgt_in.clone()
    changed[:, 4:] = 5
    with torch.no_grad():
        before, after = model(src, tgt_in), model(src, changed)
    torch.testing.assert_close(before[:, :4], after[:, :4], atol=0, rtol=0)
    assert not torch.allclose(before[:, 4:], after[:, 4:])


def test_tied_weights_are_one_tensor_and_embeddings_are_scaled():
    model = Transformer(tiny_config(share_embeddings=True))
    assert model.src_embed.weight is model.tgt_embed.weight is model.output_proj.weight
    names = [name for name, _ in model.named_parameters()]
    assert "src_embed.weight" in names and "output_proj.weight" not in names
    assert torch.all(model.src_embed.weight[0] == 0)  # padding row
    untied = Transformer(tiny_config(tie_output=False))
    assert untied.output_proj.weight is not untied.tgt_embed.weight


def test_config_validation_names_the_problem():
    with pytest.raises(TfmError, match="divisible"):
        tiny_config(d_model=30, n_heads=4)
    with pytest.raises(TfmError, match="share_embeddings"):
        tiny_config(share_embeddings=True, tgt_vocab_size=41)
    with pytest.raises(TfmError, match="distinct"):
        tiny_config(bos_id=3)
    with pytest.raises(TfmError, match="activation"):
        tiny_config(activation="tanh")


def test_gelu_dropout_and_training_mode_run_and_backpropagate():
    torch.manual_seed(0)
    model = Transformer(tiny_config(activation="gelu", dropout=0.1, attention_dropout=0.1)).train()
    src, tgt_in = batch()
    logits = model(src, tgt_in)
    logits.logsumexp(-1).mean().backward()
    assert all(p.grad is not None for p in model.parameters())
    assert torch.isfinite(logits).all()


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"share_embeddings": True},
        {"tie_output": False},
        {"norm_first": True, "output_bias": True, "tie_output": False},
        {"n_enc_layers": 3, "n_dec_layers": 1, "tgt_vocab_size": 52, "d_ff": 48},
    ],
)
def test_parameter_shapes_are_those_of_a_built_model(options):
    config = tiny_config(**options)
    built = {name: tuple(param.shape) for name, param in Transformer(config).named_parameters()}
    assert parameter_shapes(config) == built


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"share_embeddings": True},
        {"tie_output": False},
        {"norm_first": True, "output_bias": True, "tie_output": False, "sinusoid_layout": "halves"},
    ],
)
def test_a_model_built_with_given_weights_equals_one_built_then_overwritten(options):
    config = tiny_config(**options)
    torch.manual_seed(3)
    source = Transformer(config)
    weights = {name: param.detach().clone() for name, param in source.named_parameters()}
    rng_before = torch.get_rng_state()
    model = Transformer.with_weights(config, weights)
    assert torch.equal(torch.get_rng_state(), rng_before)  # nothing was drawn only to be overwritten
    assert model.training
    expected, built = source.state_dict(), model.state_dict()
    assert expected.keys() == built.keys()
    for name in expected:
        assert built[name].device.type == "cpu" and built[name].dtype == torch.float32
        assert torch.equal(built[name], expected[name]), name
    assert torch.equal(model.positions, source.positions)
    assert [n for n, _ in model.named_parameters()] == [n for n, _ in source.named_parameters()]
    assert (model.output_proj.weight is model.tgt_embed.weight) == (source.output_proj.weight is source.tgt_embed.weight)
    assert all(param.data_ptr() != weights[name].data_ptr() for name, param in model.named_parameters())
    # The same function, and the padding rows still get no gradient.
    src, tgt_in = batch()
    with torch.no_grad():
        torch.testing.assert_close(model(src, tgt_in), source(src, tgt_in), atol=0, rtol=0)
    model(src, tgt_in).logsumexp(-1).mean().backward()
    assert torch.all(model.src_embed.weight.grad[0] == 0) and torch.all(model.tgt_embed.weight.grad[0] == 0)
    assert model.src_embed.weight.grad.abs().sum() > 0
