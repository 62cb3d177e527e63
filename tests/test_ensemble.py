"""`tfm translate -m A -m B` and `tfm score -m A -m B`: one search over the weighted mean of the models'
log-probs. A model with itself gives the model's own output; two models give the mean of what each model
computes alone (full forwards with torch); an ensemble is batch-invariant; members that do not share
vocabularies or special ids, and bad weights, are one error line."""

from __future__ import annotations

import dataclasses
import json
import shutil

import pytest
import torch

from conftest import assert_one_line_error, run_cli, tiny_config
from tfm_cli.checkpoints.format import (
    load_model,
    make_checkpoint,
    model_weights,
    read_checkpoint,
    save_model,
    write_checkpoint,
)
from tfm_cli.config import DecodeConfig
from tfm_cli.errors import TfmError
from tfm_cli.inference.decoding import source_batch
from tfm_cli.inference.ensemble import Ensemble, EnsembleDecoder, ensemble_weights
from tfm_cli.inference.search_workers import SearchWorkers
from tfm_cli.inference.translation import BatchingConfig, TranslationStats, Translator
from tfm_cli.model import Transformer
from tfm_cli.tokenization.tokenizer import Tokenizer
from tfm_cli.tokenization.vocabulary import MappedTokenizer
from translate_support import held_out_sources, one_thread, trained_checkpoint  # noqa: F401 (one_thread: autouse fixture)

OTHER_MAX_POSITIONS = 64  # the second model's: the ensemble's limit (the trained model has 128)


@pytest.fixture(scope="module")
def paths(tmp_path_factory):
    """Checkpoints with the trained model's tokenizer: the trained model; a byte copy of it under another name;
    "other", its weights with Gaussian noise (0.2 x each tensor's std: it translates most lines differently)
    and a smaller max_positions; "small", an untrained model of another shape."""
    folder = tmp_path_factory.mktemp("ensemble")
    trained = trained_checkpoint()
    shutil.copyfile(trained, folder / "copy.safetensors")
    checkpoint, loaded = read_checkpoint(trained), load_model(trained)
    generator = torch.Generator().manual_seed(7)
    noisy = {name: tensor + 0.2 * tensor.std() * torch.randn(tensor.shape, generator=generator) if tensor.numel() > 1
             else tensor for name, tensor in checkpoint.weights.items()}
    config = dataclasses.replace(checkpoint.config, max_positions=OTHER_MAX_POSITIONS)
    save_model(folder / "other.safetensors", Transformer.with_weights(config, noisy).eval(), loaded.src_tokenizer,
               loaded.tgt_tokenizer)
    torch.manual_seed(7)
    vocab = loaded.tgt_tokenizer.vocab_size
    small = Transformer(tiny_config(src_vocab_size=vocab, tgt_vocab_size=vocab, n_enc_layers=1, d_ff=48)).eval()
    with torch.no_grad():  # larger than the init, so that its distributions are far from flat
        small.output_proj.weight.mul_(8.0)
    save_model(folder / "small.safetensors", small, loaded.src_tokenizer, loaded.tgt_tokenizer)
    return {"trained": trained, "copy": folder / "copy.safetensors", "other": folder / "other.safetensors",
            "small": folder / "small.safetensors"}


@pytest.fixture(scope="module")
def lines() -> list[str]:
    return held_out_sources()[:60]


def cli_output(args: list, lines: list[str]) -> str:
    result = run_cli(["translate", "-q", *args], input="\n".join(lines) + "\n")
    assert result.exit_code == 0, result.stderr
    assert len(result.stdout.splitlines()) == len(lines)
    return result.stdout


def columns_match(alone: str, ensembled: str, score_columns: set[int]) -> None:
    """The same lines and columns, text columns equal, score columns equal to within float tolerance."""
    for line_alone, line_ensembled in zip(alone.splitlines(), ensembled.splitlines(), strict=True):
        a, b = line_alone.split("\t"), line_ensembled.split("\t")
        assert len(a) == len(b)
        for index, (x, y) in enumerate(zip(a, b)):
            if index in score_columns:
                assert float(x) == pytest.approx(float(y), abs=1e-6)
            else:
                assert x == y


@pytest.mark.parametrize("options, score_columns", [
    (["-b", "1"], set()),
    (["-b", "4"], set()),
    (["-b", "4", "--nbest", "3", "--scores"], {1, 3, 5}),
    (["--sample", "--nbest", "2", "--seed", "5", "--top-k", "20", "--scores"], {1, 3}),
    (["-b", "3", "--alignment", "--scores"], {1}),
], ids=["greedy", "beam", "nbest", "sampling", "alignment"])
def test_a_model_ensembled_with_itself_translates_as_the_model_alone(paths, lines, options, score_columns):
    some = lines[:20]
    alone = cli_output(["-m", paths["trained"], *options], some)
    ensembled = cli_output(["-m", paths["trained"], "-m", paths["copy"], *options], some)
    columns_match(alone, ensembled, score_columns)
    assert len(set(alone.splitlines())) > 10, "outputs too uniform for a meaningful test"


def test_a_model_ensembled_with_itself_meets_constraints_and_keeps_markup_as_alone(paths, lines):
    references = (trained_checkpoint().parent / "test.tgt").read_text(encoding="utf-8").splitlines()
    constrained = [f"{line}\t{reference.split()[-1]}" for line, reference in zip(lines[:12], references)]
    options = ["--constraints", "-b", "3", "--json"]
    alone = cli_output(["-m", paths["trained"], *options], constrained)
    ensembled = cli_output(["-m", paths["trained"], "-m", paths["copy"], *options], constrained)
    for a, b in zip(map(json.loads, alone.splitlines()), map(json.loads, ensembled.splitlines()), strict=True):
        assert (a["translation"], a["constraints"], a["alignment"]) == (b["translation"], b["constraints"], b["alignment"])
        assert a["score"] == pytest.approx(b["score"], abs=1e-6)
    assert sum(record["constraints"][0]["met"] for record in map(json.loads, alone.splitlines())) >= 10
    tagged = [f"<b>{line.split()[0]}</b> {' '.join(line.split()[1:])}" for line in lines[:8]]
    markup = ["--markup", "html", "-b", "2"]
    assert cli_output(["-m", paths["trained"], *markup], tagged) == cli_output(
        ["-m", paths["trained"], "-m", paths["copy"], *markup], tagged)


def test_a_model_ensembled_with_itself_splits_sentences_as_alone(paths, lines):
    pytest.importorskip("sentencex")
    paragraphs = [f"{lines[i]}. {lines[i + 1]}." for i in range(0, 12, 2)]
    options = ["--split-sentences", "-b", "2", "--scores"]
    columns_match(cli_output(["-m", paths["trained"], *options], paragraphs),
                  cli_output(["-m", paths["trained"], "-m", paths["copy"], *options], paragraphs), {1})


def own_log_probs(model: Transformer, src_ids: list[int], forced: list[int]) -> torch.Tensor:
    """One sentence, no padding, the whole target at once: log_softmax(model(src, [BOS] + forced[:-1])), (T, V)."""
    config = model.config
    src = torch.tensor([src_ids + [config.eos_id]])
    tgt_in = torch.tensor([[config.bos_id] + forced[:-1]])
    with torch.no_grad():
        return torch.log_softmax(model(src, tgt_in)[0].double(), dim=-1)


@pytest.mark.parametrize("names, weights, expected_weights", [
    (["trained", "other"], "1,1", (0.5, 0.5)),
    (["trained", "other"], "0.7,0.3", (0.7, 0.3)),
    (["trained", "small"], "3,1", (0.75, 0.25)),
    (["trained", "other", "small"], "1,2,1", (0.25, 0.5, 0.25)),
])
def test_an_ensemble_step_is_the_weighted_mean_of_each_models_own_log_probs(paths, lines, names, weights, expected_weights):
    members = [load_model(paths[name]) for name in names]
    first = members[0]
    w = ensemble_weights(weights, len(names))
    assert w == pytest.approx(expected_weights)
    references = (trained_checkpoint().parent / "test.tgt").read_text(encoding="utf-8").splitlines()
    sources = [first.src_tokenizer.encode_ids(line) for line in lines[:6]]
    steps = 5
    forced = [first.tgt_tokenizer.encode_ids(reference)[:steps] for reference in references[:6]]
    assert all(len(ids) == steps for ids in forced)
    expected = [
        sum(weight * own_log_probs(member.model, src, ids) for weight, member in zip(w, members))
        for src, ids in zip(sources, forced)
    ]  # per sentence (T, V)
    alone = [own_log_probs(first.model, src, ids) for src, ids in zip(sources, forced)]
    ensemble = Ensemble([member.model for member in members], w)
    decoder = EnsembleDecoder(ensemble, source_batch(sources, ensemble.config))
    with torch.inference_mode():
        decoder.start(1, grouped=True)
        tokens = torch.full((len(sources),), first.config.bos_id)
        for step in range(steps):
            got = decoder.step(tokens)  # (N, V)
            want = torch.stack([sentence[step] for sentence in expected]).float()
            assert torch.allclose(got, want, atol=2e-5), (got - want).abs().max()
            # The second model counts: the first model's own log-probs are far from the mean.
            assert (got - torch.stack([sentence[step] for sentence in alone]).float()).abs().max() > 0.1
            tokens = torch.tensor([ids[step] for ids in forced])


def test_ensemble_scores_are_the_weighted_mean_of_each_models_score(paths, lines, tmp_path):
    # translate's scores are `score -m A -m B`'s, which are the weighted means of `score -m A` and `score -m B`.
    some = lines[:10]
    pair = ["-m", paths["trained"], "-m", paths["other"], "--ensemble-weights", "3,1"]
    translated = cli_output([*pair, "-b", "3", "--scores"], some).splitlines()
    (tmp_path / "src").write_text("\n".join(some) + "\n", encoding="utf-8")
    (tmp_path / "tgt").write_text("".join(line.split("\t")[0] + "\n" for line in translated), encoding="utf-8")
    files = ["--src", tmp_path / "src", "--tgt", tmp_path / "tgt", "-q"]

    def scores(models: list, normalize: str) -> list[float]:
        result = run_cli(["score", *models, *files, "--normalize", normalize])
        assert result.exit_code == 0, result.stderr
        return [float(value) for value in result.stdout.split()]

    ensembled = scores(pair, "length")
    assert ensembled == pytest.approx([float(line.split("\t")[1]) for line in translated], abs=1e-4)
    raw_first, raw_other = scores(["-m", paths["trained"]], "none"), scores(["-m", paths["other"]], "none")
    mean = [0.75 * a + 0.25 * b for a, b in zip(raw_first, raw_other)]
    assert scores(pair, "none") == pytest.approx(mean, abs=1e-4)
    assert raw_first != pytest.approx(mean, abs=1e-2)


@pytest.mark.parametrize("beam_size", [1, 4])
def test_an_ensemble_translates_a_sentence_alone_as_in_any_batch(paths, lines, beam_size):
    first, other = load_model(paths["trained"]), load_model(paths["other"])
    ensemble = Ensemble([first.model, other.model], (0.6, 0.4))
    decode = DecodeConfig(beam_size=beam_size, nbest=min(2, beam_size))

    def translated(batching: BatchingConfig) -> list[list[tuple[str, float]]]:
        translator = Translator(first, decode, batching, ensemble=ensemble)
        stats, answers = TranslationStats(), []
        for start in range(0, len(lines), batching.buffer_size):
            chunk = translator.translate_chunk(lines[start : start + batching.buffer_size], start, stats)
            answers += [[(output.text, output.raw_score) for output in line.outputs] for line in chunk]
        return answers

    batched = translated(BatchingConfig(buffer_size=60))
    assert translated(BatchingConfig(buffer_size=60, batch_size=7)) == batched
    assert translated(BatchingConfig(buffer_size=1)) == batched
    assert len({outputs[0][0] for outputs in batched}) > 25, "outputs too uniform for a meaningful test"
    alone = Translator(first, decode, BatchingConfig(buffer_size=60))
    first_alone = [[(o.text, o.raw_score) for o in line.outputs] for line in alone.translate_chunk(lines, 0, TranslationStats())]
    assert first_alone != batched  # the second model counts


def test_an_ensemble_in_worker_processes_translates_as_in_one(paths, lines):
    first, other = load_model(paths["trained"]), load_model(paths["other"])
    ensemble = Ensemble([first.model, other.model], (0.5, 0.5))
    decode, batching = DecodeConfig(beam_size=3), BatchingConfig(buffer_size=40, batch_size=5)

    def texts(translator: Translator) -> list[tuple[str, float]]:
        chunk = translator.translate_chunk(lines[:40], 0, TranslationStats())
        return [(line.outputs[0].text, line.outputs[0].raw_score) for line in chunk]

    one = texts(Translator(first, decode, batching, ensemble=ensemble))
    with SearchWorkers(ensemble, decode, 2) as workers:
        assert texts(Translator(first, decode, batching, ensemble=ensemble, workers=workers)) == one


def test_the_smallest_max_positions_of_the_members_holds(paths):
    long_line = " ".join(["dog"] * 200)
    result = run_cli(["translate", "-m", paths["trained"], "-m", paths["other"], "-b", "2"], input=long_line + "\n")
    assert result.exit_code == 0, result.stderr
    assert f"source tokens exceed the model's {OTHER_MAX_POSITIONS - 1}" in result.stderr
    assert "an ensemble of 2 models, weights 0.5, 0.5" in result.stderr
    # No EOS before the length limit: the output stops where the smaller model's positions end.
    forced_long = ["--min-len", "1000", "--max-len-b", "1000", "--json", "-b", "2"]
    result = run_cli(["translate", "-q", "-m", paths["trained"], "-m", paths["other"], *forced_long], input="the dog\n")
    assert result.exit_code == 0, result.stderr
    record = json.loads(result.stdout)
    assert len(record["tokens"]) == OTHER_MAX_POSITIONS - 2 and not record["nbest"][0]["finished"]


def test_the_precision_applies_to_every_member(paths, lines):
    from tfm_cli.model.precision import cpu_support, int8_layer_class

    if int8_layer_class(cpu_support()) is None:
        pytest.skip("this torch build has no int8 kernel")
    options = ["--dtype", "int8", "-b", "2", "--scores"]
    columns_match(cli_output(["-m", paths["trained"], *options], lines[:10]),
                  cli_output(["-m", paths["trained"], "-m", paths["copy"], *options], lines[:10]), {1})
    from tfm_cli.commands.model_runs import Placement, load_models

    from tfm_cli.model.precision import linear_layers

    int8 = Placement(torch.device("cpu"), "int8")
    _, ensemble = load_models([str(paths["trained"]), str(paths["other"])], None, int8, quiet=True)
    for member in ensemble.members:
        assert member.inference_dtype == "int8"
        assert {type(layer) for layer in linear_layers(member)} == {int8_layer_class(cpu_support())}


def mapped_checkpoint(path, tokenizer: Tokenizer, tgt_bytes: bytes | None = None, **ids) -> str:
    """A tiny random model whose tokenizers map `tokenizer`'s pieces through a table (as an imported model's
    do), with special ids `ids` and the target's sentencepiece model `tgt_bytes` (default the same)."""
    pieces = tuple(tokenizer.id_to_piece(i) for i in range(tokenizer.vocab_size))
    config = tiny_config(src_vocab_size=len(pieces), tgt_vocab_size=len(pieces), **ids)
    control = frozenset({config.pad_id, config.eos_id, config.bos_id})
    src = MappedTokenizer(tokenizer.model_bytes, pieces, config.unk_id, control)
    tgt = MappedTokenizer(tgt_bytes or tokenizer.model_bytes, pieces, config.unk_id, control)
    torch.manual_seed(0)
    write_checkpoint(path, make_checkpoint(config, model_weights(Transformer(config)), src, tgt))
    return str(path)


def test_members_that_do_not_share_vocabularies_or_special_ids_are_one_error_line(paths, tmp_path, letters, small_spm):
    letters_tokenizer = Tokenizer.from_file(letters["spm"])
    torch.manual_seed(0)
    vocab = letters_tokenizer.vocab_size
    small = Transformer(tiny_config(src_vocab_size=vocab, tgt_vocab_size=vocab))
    save_model(tmp_path / "letters.safetensors", small, letters_tokenizer, letters_tokenizer)
    tokenizer = Tokenizer.from_file(small_spm)
    plain = mapped_checkpoint(tmp_path / "mapped.safetensors", tokenizer)
    marian_bos = mapped_checkpoint(tmp_path / "bos.safetensors", tokenizer, bos_id=0)  # starts from padding, as Marian's
    other_spm = mapped_checkpoint(tmp_path / "spm.safetensors", tokenizer, tgt_bytes=letters_tokenizer.model_bytes)
    assert run_cli(["translate", "-q", "-m", plain, "-m", plain, "-b", "1"], input="the dog\n").exit_code == 0
    text = tmp_path / "text"
    text.write_text("the dog\n", encoding="utf-8")
    cases = [
        ([paths["trained"], tmp_path / "letters.safetensors"], r"their source vocabularies differ \(\d+ vs 20 pieces\)"),
        ([plain, marian_bos], r"their special ids differ \(bos_id 2 vs 0\)"),
        ([plain, other_spm], r"their target vocabularies differ \(the same pieces, but other sentencepiece models"),
    ]
    for (first, second), message in cases:
        scoring = ["score", "-m", first, "-m", second, "--src", text, "--tgt", text]
        for command in (["translate", "-m", first, "-m", second], scoring):
            result = run_cli([*command, "-q"], input="the dog\n")
            assert_one_line_error(result, rf"^error: {first} and {second} cannot be ensembled: {message}")
            assert result.exit_code == 1 and result.stdout == ""


def test_a_different_vocabulary_is_named_by_its_first_different_piece(small_spm, tmp_path):
    tokenizer = Tokenizer.from_file(small_spm)
    pieces = [tokenizer.id_to_piece(i) for i in range(tokenizer.vocab_size)]
    swapped = tuple(pieces[:10] + [pieces[11], pieces[10]] + pieces[12:])
    from tfm_cli.inference.ensemble import vocabulary_difference

    control = frozenset({0, 2, 3})
    a = MappedTokenizer(tokenizer.model_bytes, tuple(pieces), 1, control)
    b = MappedTokenizer(tokenizer.model_bytes, swapped, 1, control)
    assert vocabulary_difference(a, b) == f"piece 10 is {pieces[10]!r} vs {pieces[11]!r}"
    assert vocabulary_difference(a, a) is None
    assert vocabulary_difference(tokenizer, a) is None  # the same pieces and bytes, with or without a table


@pytest.mark.parametrize("weights, message", [
    ("0.6,0.4,0.2", r"--ensemble-weights gives 3 weight\(s\) for 2 model\(s\)"),
    ("1", r"--ensemble-weights gives 1 weight\(s\) for 2 model\(s\)"),
    ("0.6,0", r"--ensemble-weights must be positive numbers, got '0'"),
    ("-1,2", r"--ensemble-weights must be positive numbers, got '-1'"),
    ("nan,1", r"--ensemble-weights must be positive numbers, got 'nan'"),
    ("inf,1", r"--ensemble-weights must be positive numbers, got 'inf'"),
    ("²,1", r"--ensemble-weights must be positive numbers, got '²'"),
    ("0.5,", r"--ensemble-weights must be positive numbers, got ''"),
])
def test_bad_weights_are_one_error_line_before_any_model_is_loaded(weights, message, tmp_path):
    missing = tmp_path / "missing.safetensors"  # never read: the weights are checked first
    scoring = ["score", "-m", missing, "-m", missing, "--src", __file__, "--tgt", __file__]
    for command in (["translate", "-m", missing, "-m", missing], scoring):
        result = run_cli([*command, "--ensemble-weights", weights], input="a\n")
        assert_one_line_error(result, rf"^error: {message}")
    with pytest.raises(TfmError, match=message):
        ensemble_weights(weights, 2)


def test_weights_scale_to_one_and_a_single_model_takes_one(paths, lines):
    assert ensemble_weights(None, 3) == pytest.approx((1 / 3,) * 3)
    assert ensemble_weights("2, 2, 4", 3) == (0.25, 0.25, 0.5)
    assert ensemble_weights("5", 1) == (1.0,)
    assert ensemble_weights("1e308,1e308", 2) == (0.5, 0.5)
    assert ensemble_weights("1e-320,3e-320", 2) == pytest.approx((0.25, 0.75))
    alone = cli_output(["-m", paths["trained"], "-b", "2"], lines[:5])
    assert cli_output(["-m", paths["trained"], "--ensemble-weights", "5", "-b", "2"], lines[:5]) == alone
    result = run_cli(["translate", "-m", paths["trained"], "--ensemble-weights", "0.5,0.5"], input="a\n")
    assert_one_line_error(result, r"gives 2 weight\(s\) for 1 model\(s\)")
    result = run_cli(["score", "-r", __file__, "-i", __file__, "--ensemble-weights", "1,1"])
    assert_one_line_error(result, "--ensemble-weights weighs the models of -m/--model")
    with pytest.raises(ValueError):
        Ensemble([load_model(paths["trained"]).model], (1.0,))
