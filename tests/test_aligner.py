"""The trained word aligner (model/aligner.py) and `tfm train-aligner`: it learns given links from a
frozen model's states, leaves the model untouched, and every alignment path reads it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from conftest import rewritten_checkpoint, run_cli, tiny_config

from tfm_cli.checkpoints.format import load_model, read_checkpoint
from tfm_cli.config import AlignmentConfig
from tfm_cli.inference.alignment import aligning_attention
from tfm_cli.model import Transformer
from tfm_cli.model.aligner import ALIGNER_PREFIX, Aligner, aligner_shapes
from tfm_cli.training.aligner_training import AlignerBatch, aligner_loss

pytestmark = pytest.mark.usefixtures("one_torch_thread")

SIZES = ["--hidden", "64", "--dim", "32"]  # a small aligner for the tiny models


@pytest.mark.unit
@pytest.mark.parametrize("context", [False, True])
def test_aligner_shapes_are_the_modules_parameters(context):
    config = tiny_config(n_dec_layers=3)
    aligner = Aligner(config, hidden=48, dim=24, context=context)
    expected = {ALIGNER_PREFIX + name: tuple(param.shape) for name, param in aligner.named_parameters()}
    assert aligner_shapes(config, 48, 24, context) == expected


@pytest.mark.unit
def test_decode_keeps_each_layers_output_as_the_layers_compute_it():
    torch.manual_seed(0)
    model = Transformer(tiny_config()).eval()
    src, tgt_in = torch.randint(3, 40, (2, 5)), torch.randint(3, 40, (2, 4))
    encoded = model.encode(src)
    decoded = model.decode(tgt_in, encoded, keep_states=True)
    x = model.embed(model.tgt_embed, tgt_in)
    assert len(decoded.layer_states) == len(model.decoder_layers)
    for layer, kept in zip(model.decoder_layers, decoded.layer_states):
        x = layer(x, encoded.memory, encoded.src_mask[:, None, None, :])[0]
        torch.testing.assert_close(kept, x)
    torch.testing.assert_close(decoded.hidden, model.decode(tgt_in, encoded).hidden)


@pytest.mark.unit
@pytest.mark.parametrize("context", [False, True])
def test_aligner_attention_is_a_distribution_over_the_real_source_positions(context):
    torch.manual_seed(0)
    config = tiny_config()
    model, aligner = Transformer(config).eval(), Aligner(config, 16, 8, context).eval()
    src = torch.tensor([[5, 6, 7, 2], [5, 2, 0, 0]])  # the second row padded (pad id 0, EOS 2)
    tgt_in = torch.tensor([[1, 8, 9], [1, 8, 0]])
    with torch.no_grad():
        attention = aligning_attention(model, aligner, AlignmentConfig(aligner=True), src, tgt_in)  # (B, T, S)
        alone = aligning_attention(model, aligner, AlignmentConfig(aligner=True), src[1:, :2], tgt_in[1:, :2])
    assert attention.shape == (2, 3, 4)
    torch.testing.assert_close(attention.sum(dim=-1), torch.ones(2, 3))
    assert bool((attention[1, :, 2:] == 0).all()) and bool((attention[0] > 0).all())
    # Padding changes nothing on either side: the padded pair aligns as it does alone.
    torch.testing.assert_close(attention[1, :2, :2], alone[0])


@pytest.mark.unit
def test_the_target_context_lets_a_position_see_the_positions_after_it():
    torch.manual_seed(0)
    config = tiny_config()
    aligner = Aligner(config, 16, 8, context=True).eval()
    states, memory = torch.randn(1, 3, 2 * 32), torch.randn(1, 4, 32)
    src_mask, tgt_mask = torch.ones(1, 4, dtype=torch.bool), torch.ones(1, 3, dtype=torch.bool)
    changed = states.clone()
    changed[0, 2] += 1.0  # only the last target position
    with torch.no_grad():
        before, after = aligner(states, memory, src_mask, tgt_mask), aligner(changed, memory, src_mask, tgt_mask)
        causal = Aligner(config, 16, 8, context=False).eval()
        same = causal(states, memory, src_mask, tgt_mask)[0, 0], causal(changed, memory, src_mask, tgt_mask)[0, 0]
    assert not torch.allclose(before[0, 0], after[0, 0])
    torch.testing.assert_close(*same)


@pytest.mark.unit
def test_aligner_loss_is_the_cross_entropy_against_the_reference():
    torch.manual_seed(0)
    config = tiny_config()
    aligner = Aligner(config, 16, 8)
    states, memory = torch.randn(1, 2, 2 * 32), torch.randn(1, 3, 32)
    mask, tgt_mask = torch.tensor([[True, True, False]]), torch.tensor([[True, True]])
    reference = torch.tensor([[[0.0, 0.0, 0.0], [0.5, 0.5, 0.0]]])  # row 0 unsupervised
    loss, rows = aligner_loss(aligner, AlignerBatch(states.half(), memory.half(), mask, tgt_mask, reference))
    log_probs = aligner(states.half().float(), memory.half().float(), mask, tgt_mask)
    assert rows == 1
    torch.testing.assert_close(loss, -(0.5 * log_probs[0, 1, 0] + 0.5 * log_probs[0, 1, 1]))


def gold_recovered(gold: Path, hypothesis: str) -> float:
    """Fraction of the gold links (Pharaoh lines) that the hypothesis lines contain."""
    gold_lines = [set(line.split()) for line in gold.read_text().splitlines()]
    hypothesis_lines = [set(line.split()) for line in hypothesis.splitlines()]
    assert len(gold_lines) == len(hypothesis_lines)
    return sum(len(g & h) for g, h in zip(gold_lines, hypothesis_lines)) / sum(map(len, gold_lines))


@pytest.fixture(scope="module")
def trained_aligner(tmp_path_factory, random_checkpoint, synthetic) -> Path:
    """The random tiny model plus an aligner trained on 1,000 synthetic training pairs and their gold links."""
    folder = tmp_path_factory.mktemp("aligner")
    for name in ("src", "tgt", "align"):
        lines = synthetic[f"train.{name}"].read_text(encoding="utf-8").splitlines()[:1000]
        (folder / f"train.{name}").write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    output = folder / "aligned.safetensors"
    result = run_cli(["train-aligner", "-m", str(random_checkpoint), "--src", str(folder / "train.src"),
                      "--tgt", str(folder / "train.tgt"), "--links", str(folder / "train.align"), "-o", str(output),
                      "--epochs", "16", "--lr", "5e-3", *SIZES])
    assert result.exit_code == 0, result.stderr
    assert result.stdout == ""
    return output


def test_the_aligner_learns_links_the_models_attention_does_not_give(trained_aligner, random_checkpoint, synthetic):
    # The model is untrained: its attention knows nothing of the synthetic pair's verb-final word order;
    # the aligner learns it from the links and recovers most gold links of unseen test pairs.
    common = ["--src", str(synthetic["test.src"]), "--tgt", str(synthetic["test.tgt"])]
    learnt = run_cli(["align", "-m", str(trained_aligner), *common])
    attention = run_cli(["align", "-m", str(random_checkpoint), *common])
    assert learnt.exit_code == 0 and attention.exit_code == 0, learnt.stderr + attention.stderr
    assert gold_recovered(synthetic["test.align"], learnt.stdout) >= 0.7  # 0.79 measured
    assert gold_recovered(synthetic["test.align"], attention.stdout) < 0.5


def test_the_written_checkpoint_is_the_model_unchanged_plus_the_aligner(trained_aligner, random_checkpoint):
    before, after = read_checkpoint(random_checkpoint), read_checkpoint(trained_aligner)
    assert before.weights.keys() == after.weights.keys()
    assert all(torch.equal(before.weights[name], after.weights[name]) for name in before.weights)
    assert set(after.aligner_weights) == set(aligner_shapes(after.config, 64, 32, context=True))
    assert after.alignment["aligner"] is True
    assert after.provenance["aligner"]["pairs"] == 980 and after.provenance["aligner"]["held_out_pairs"] == 20  # 2%
    loaded = load_model(trained_aligner)
    assert loaded.aligner is not None and loaded.alignment.aligner and loaded.alignment.shift and loaded.alignment.null
    text = "the big dog sees a small cat\ntwo cats see the dog\n"
    plain = run_cli(["translate", "-m", str(random_checkpoint), "--beam", "2"], input=text)
    with_aligner = run_cli(["translate", "-m", str(trained_aligner), "--beam", "2"], input=text)
    assert plain.exit_code == 0 and plain.stdout == with_aligner.stdout


def aligner_links_of_pieces(checkpoint: Path, source: str, pieces: list[str]) -> str:
    """The Pharaoh links the checkpoint's aligner gives `source` and the target `pieces`, built from the
    alignment primitives: shifted rows, words from '▁' pieces, NULL when </s> outweighs every word."""
    from tfm_cli.inference.alignment import hard_alignment, merge_to_words, null_weights, pharaoh, piece_rows
    from tfm_cli.tokenization.words import word_spans

    loaded = load_model(checkpoint)
    config, src_tokenizer, tgt_tokenizer = loaded.config, loaded.src_tokenizer, loaded.tgt_tokenizer
    src_ids = src_tokenizer.encode_ids(source)
    src = torch.tensor([src_ids + [config.eos_id]])
    tgt_in = torch.tensor([[config.bos_id] + [tgt_tokenizer.piece_to_id(piece) for piece in pieces]])
    with torch.no_grad():
        attention = aligning_attention(loaded.model, loaded.aligner, loaded.alignment, src, tgt_in)[0]
    matrix = piece_rows(attention, len(pieces), shift=True)
    tgt_spans = word_spans(pieces)
    src_spans = word_spans([src_tokenizer.id_to_piece(i) for i in src_ids])
    words = merge_to_words(matrix, tgt_spans, src_spans)
    return pharaoh(hard_alignment(words, null_weights(matrix, tgt_spans, matrix.size(1) - 1)))


def test_translate_inspect_and_align_read_the_aligner_and_a_layer_flag_sets_it_aside(trained_aligner, synthetic):
    sources = synthetic["test.src"].read_text().splitlines()[:4]
    translated = run_cli(["translate", "-m", str(trained_aligner), "--alignment", "--beam", "1"],
                         input="".join(line + "\n" for line in sources))
    assert translated.exit_code == 0, translated.stderr
    outputs = [line.split("\t") for line in translated.stdout.splitlines()]
    pairs = "".join(f"{source} ||| {translation}\n" for source, (translation, _) in zip(sources, outputs))
    aligned = run_cli(["align", "-m", str(trained_aligner)], input=pairs)
    assert aligned.exit_code == 0
    # align and inspect-attention encode the given words; translate aligns the pieces it chose (an
    # untrained model's pieces are not the words' own, and the aligner sees the whole target).
    as_json = run_cli(["translate", "-m", str(trained_aligner), "--json", "--beam", "1"],
                      input="".join(line + "\n" for line in sources))
    chosen = [json.loads(line)["tokens"] for line in as_json.stdout.splitlines()]
    for source, (translation, links), aligned_links, pieces in zip(sources, outputs, aligned.stdout.splitlines(), chosen):
        inspected = run_cli(["inspect-attention", "-m", str(trained_aligner), source, "--target", translation,
                             "--words", "--format", "pharaoh"])
        assert inspected.exit_code == 0 and inspected.stdout.strip() == aligned_links
        assert links == aligner_links_of_pieces(trained_aligner, source, pieces)
    by_layer = run_cli(["align", "-m", str(trained_aligner), "--align-layer", "-1"], input=pairs)
    assert by_layer.exit_code == 0 and by_layer.stdout != aligned.stdout
    record = json.loads(run_cli(["inspect-attention", "-m", str(trained_aligner), sources[0], "--format", "json"]).stdout)
    assert record["head"] == "aligner"


def test_averaging_drops_the_aligner(trained_aligner, tmp_path):
    second = tmp_path / "second.safetensors"
    second.write_bytes(trained_aligner.read_bytes())
    averaged = tmp_path / "averaged.safetensors"
    result = run_cli(["average", str(trained_aligner), str(second), "-o", str(averaged)])
    assert result.exit_code == 0, result.stderr
    checkpoint = read_checkpoint(averaged)
    assert checkpoint.aligner_weights == {} and "aligner" not in checkpoint.alignment
    assert load_model(averaged).aligner is None


def test_aligner_tensors_without_settings_are_refused(trained_aligner, tmp_path):
    def drop_settings(meta):
        del meta["alignment"]

    crafted = rewritten_checkpoint(trained_aligner, tmp_path / "crafted.safetensors", metadata=drop_settings)
    result = run_cli(["align", "-m", str(crafted)], input="a ||| b\n")
    assert result.exit_code == 1 and "aligner tensors" in result.stderr and "Traceback" not in result.stderr


@pytest.mark.parametrize(
    "links, message",
    [
        ("0-0\n0-9\n", "train.align:2: link 0-9 is beyond the pair's words"),
        ("0-0\n0-x\n", "train.align:2:"),
        ("0-0\n", "line counts differ"),
    ],
)
def test_bad_links_are_one_clear_line_and_write_nothing(random_checkpoint, tmp_path, links, message):
    (tmp_path / "train.src").write_text("the dog\nthe big cat\n")
    (tmp_path / "train.tgt").write_text("la hundo\nla kato granda\n")
    (tmp_path / "train.align").write_text(links)
    output = tmp_path / "out.safetensors"
    result = run_cli(["train-aligner", "-m", str(random_checkpoint), "--src", str(tmp_path / "train.src"),
                      "--tgt", str(tmp_path / "train.tgt"), "--links", str(tmp_path / "train.align"), "-o", str(output)])
    assert result.exit_code == 1 and message in result.stderr, result.stderr
    assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) <= 2
    assert not output.exists()


def test_writing_over_the_model_is_refused(random_checkpoint, tmp_path):
    (tmp_path / "a").write_text("the dog\n")
    (tmp_path / "l").write_text("0-0\n")
    result = run_cli(["train-aligner", "-m", str(random_checkpoint), "--src", str(tmp_path / "a"), "--tgt",
                      str(tmp_path / "a"), "--links", str(tmp_path / "l"), "-o", str(random_checkpoint)])
    assert result.exit_code == 1 and "the output is also the model" in result.stderr


def test_states_beyond_the_memory_limit_stop_the_command_with_one_line(random_checkpoint, synthetic, tmp_path):
    output = tmp_path / "out.safetensors"
    result = run_cli(["train-aligner", "-m", str(random_checkpoint), "--src", str(synthetic["train.src"]),
                      "--tgt", str(synthetic["train.tgt"]), "--links", str(synthetic["train.align"]), "-o", str(output),
                      "--max-memory", "0.0001"])
    assert result.exit_code == 1 and "raise --max-memory" in result.stderr and "Traceback" not in result.stderr
    assert not output.exists()


def test_a_pair_given_k_times_is_kept_once_and_trained_k_times_an_epoch(random_checkpoint):
    from tfm_cli.training.aligner_training import prepare_batches

    first = ("the dog".split(), "la hundo".split())
    second = ("the big cat".split(), "la kato granda".split())
    pairs = [first, second, first, first, ([], ["x"])]
    links = [[(0, 0), (1, 1)], [(0, 0), (1, 2), (2, 1)], [(0, 0), (1, 1)], [(0, 0), (1, 1)], []]
    prepared = prepare_batches(load_model(random_checkpoint), pairs, links, batch_size=8)
    assert sorted((batch.states.size(0), batch.repeat) for batch in prepared.batches) == [(1, 1), (1, 3)]
    assert prepared.used == 4 and prepared.empty == 1
    # The same words with other links are another pair.
    prepared = prepare_batches(load_model(random_checkpoint), [first, first], [[(0, 0)], [(1, 1)]], batch_size=8)
    assert [(batch.states.size(0), batch.repeat) for batch in prepared.batches] == [(2, 1)]


@pytest.mark.unit
def test_a_small_batch_trained_often_weighs_as_its_rows_not_as_a_full_step_each_time():
    """32 rows linked to source 0 in one batch, and one row linked to source 1 in a batch trained 32
    times an epoch: both links weigh 32 rows, so the aligner ends between them, not on the small batch's."""
    from tfm_cli.training.aligner_training import AlignerTrainingConfig, train_aligner

    config = tiny_config()
    torch.manual_seed(0)
    states, memory = torch.randn(1, 1, config.n_dec_layers * 32), torch.randn(1, 2, 32)
    mask, tgt_mask = torch.ones(1, 2, dtype=torch.bool), torch.ones(1, 1, dtype=torch.bool)

    def batch(rows: int, column: int, repeat: int) -> AlignerBatch:
        reference = torch.zeros(rows, 1, 2)
        reference[:, 0, column] = 1.0
        return AlignerBatch(states.expand(rows, -1, -1).half(), memory.expand(rows, -1, -1).half(),
                            mask.expand(rows, -1), tgt_mask.expand(rows, -1), reference, repeat=repeat)

    aligner = train_aligner([batch(32, 0, 1), batch(1, 1, 32)], config,
                            AlignerTrainingConfig(epochs=4, hidden=16, dim=8, context=False, lr=1e-2)).aligner
    with torch.no_grad():
        to_second = aligner(states, memory, mask, tgt_mask).exp()[0, 0, 1].item()
    assert 0.25 < to_second < 0.75


FIXTURE = Path(__file__).parent / "data" / "aligner_before_held_out"


def test_an_aligner_checkpoint_written_before_held_out_training_aligns_as_it_did():
    # tests/data/aligner_before_held_out/README.md says how the files were made.
    common = ["-m", FIXTURE / "aligned.safetensors", "--threads", "1"]
    aligned = run_cli(["align", *common, "--src", FIXTURE / "pairs.src", "--tgt", FIXTURE / "pairs.tgt"])
    assert aligned.exit_code == 0, aligned.stderr
    assert aligned.stdout == (FIXTURE / "expected.align").read_text(encoding="utf-8")
    translated = run_cli(["translate", *common, "--alignment"], input=(FIXTURE / "pairs.src").read_text(encoding="utf-8"))
    assert translated.exit_code == 0, translated.stderr
    assert translated.stdout == (FIXTURE / "expected.translate").read_text(encoding="utf-8")


@pytest.mark.unit
def test_training_stops_when_the_held_out_loss_stops_falling_and_keeps_the_best_epoch():
    """The held-out pairs want the other link than the trained ones: each epoch moves the aligner away
    from them, so epoch 1 is the best, training stops `patience` epochs later, and epoch 1's aligner is returned."""
    from tfm_cli.training.aligner_training import AlignerTrainingConfig, train_aligner

    config = tiny_config()
    torch.manual_seed(0)
    states, memory = torch.randn(8, 1, config.n_dec_layers * 32), torch.randn(8, 2, 32)
    mask, tgt_mask = torch.ones(8, 2, dtype=torch.bool), torch.ones(8, 1, dtype=torch.bool)

    def batch(column: int) -> AlignerBatch:
        reference = torch.zeros(8, 1, 2)
        reference[:, 0, column] = 1.0
        return AlignerBatch(states.half(), memory.half(), mask, tgt_mask, reference)

    seen = []
    settings = AlignerTrainingConfig(epochs=10, hidden=16, dim=8, context=False, lr=1e-2, patience=2)
    trained = train_aligner([batch(0)], config, settings, held_out=[batch(1)], on_epoch=seen.append)
    assert [result.epoch for result in seen] == [1, 2, 3] and trained.best_epoch == 1
    assert seen[0].held_out_loss < seen[1].held_out_loss < seen[2].held_out_loss
    assert [result.best for result in seen] == [True, False, False]
    with torch.no_grad():  # the held-out loss of what was returned, computed here: epoch 1's
        log_probs = trained.aligner(states.half().float(), memory.half().float(), mask, tgt_mask)
    assert -log_probs[:, 0, 1].mean().item() == pytest.approx(seen[0].held_out_loss, rel=1e-5)


def test_train_aligner_reports_each_epochs_losses_and_records_the_best_epoch(random_checkpoint, synthetic, tmp_path):
    for name in ("src", "tgt", "align"):
        lines = synthetic[f"train.{name}"].read_text(encoding="utf-8").splitlines()[:400]
        (tmp_path / f"train.{name}").write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    common = ["train-aligner", "-m", random_checkpoint, "--src", tmp_path / "train.src", "--tgt", tmp_path / "train.tgt",
              "--links", tmp_path / "train.align", "--epochs", "3", "--lr", "5e-3", *SIZES, "--threads", "1"]
    held = run_cli([*common, "--held-out", "0.1", "-o", tmp_path / "held.safetensors"])
    assert held.exit_code == 0, held.stderr
    assert "360 of 400 pairs to learn from and 40 held out" in held.stderr
    epoch_lines = [line for line in held.stderr.splitlines() if line.startswith("aligner epoch")]
    assert len(epoch_lines) == 3 and all("held-out" in line for line in epoch_lines)
    record = read_checkpoint(tmp_path / "held.safetensors").provenance["aligner"]
    assert record["held_out_pairs"] == 40 and 1 <= record["best_epoch"] <= record["epochs"] == 3
    assert f"the aligner of epoch {record['best_epoch']} of 3 (held-out loss {record['held_out_loss']:.4f}" in held.stderr
    none = run_cli([*common, "--held-out", "0", "-o", tmp_path / "all.safetensors"])
    assert none.exit_code == 0 and "400 of 400 pairs to learn from and 0 held out" in none.stderr
    assert read_checkpoint(tmp_path / "all.safetensors").provenance["aligner"]["best_epoch"] == 3
    bad = run_cli([*common, "--held-out", "0.9", "-o", tmp_path / "bad.safetensors"])
    assert bad.exit_code == 1 and "--held-out" in bad.stderr and not (tmp_path / "bad.safetensors").exists()


def test_flags_that_contradict_a_trained_aligner_are_refused_or_warned_about(trained_aligner, synthetic):
    line = synthetic["test.src"].read_text(encoding="utf-8").splitlines()[0] + "\n"
    unshifted = run_cli(["translate", "-m", trained_aligner, "--alignment", "--no-align-shift"], input=line)
    assert unshifted.exit_code == 1 and unshifted.stdout == ""
    assert len(unshifted.stderr.strip().splitlines()) == 1 and "--no-align-shift contradicts" in unshifted.stderr
    pair = ["--src", synthetic["test.src"], "--tgt", synthetic["test.tgt"]]
    assert run_cli(["align", "-m", trained_aligner, *pair, "--no-align-shift"]).exit_code == 1
    no_null = run_cli(["translate", "-m", trained_aligner, "--alignment", "--no-align-null"], input=line)
    assert no_null.exit_code == 0 and "--no-align-null" in no_null.stderr and no_null.stdout
    # With the aligner set aside, the flags choose how the attention head is read: no contradiction.
    head = run_cli(["translate", "-m", trained_aligner, "--alignment", "--align-layer", "0", "--no-align-shift"], input=line)
    assert head.exit_code == 0 and "contradicts" not in head.stderr and "--no-align" not in head.stderr


def test_inspect_attention_warns_when_told_to_read_the_aligner_unshifted(trained_aligner):
    args = ["inspect-attention", "-m", trained_aligner, "the dog sees my cat", "--target", "la hundo vidas mian katon",
            "--words", "--format", "pharaoh"]
    plain = run_cli(args)
    unshifted = run_cli([*args, "--no-shift"])
    assert plain.exit_code == 0 and unshifted.exit_code == 0, plain.stderr + unshifted.stderr
    assert "trained aligner learnt shifted rows" in unshifted.stderr and "trained aligner" not in plain.stderr
