"""`tfm import`: a Hugging Face MarianMT folder becomes a tfm checkpoint that computes what MarianMT computes.

The references are tiny random MarianMTModels built here with transformers (the `bench` extra), saved
as OPUS-MT folders are (save_pretrained, plus source.spm/target.spm trained on the synthetic corpus,
vocab.json and tokenizer_config.json; MarianTokenizer loads each folder). For every configuration
OPUS-MT uses (swish and gelu/relu, tied and untied output, shared and separate vocabularies and
embeddings, a non-zero final_logits_bias, a multilingual `>>xx<<` model) the imported checkpoint must
give Hugging Face's token log-probs (`score -m`), greedy outputs (`translate -b 1`), beam scores and
cross-attention (`inspect-attention`). Folders tfm cannot run exactly are refused with one error line.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch

from conftest import rewritten_checkpoint, run_cli

transformers = pytest.importorskip("transformers")
import sentencepiece as spm  # noqa: E402

# MarianTokenizer asks for sacremoses, which it uses for nothing these tests touch.
pytestmark = pytest.mark.filterwarnings("ignore:Recommended. pip install sacremoses")

TOLERANCE = 1e-4
N_SENTENCES = 6
SPECIALS = ["</s>", "<unk>", "<pad>"]  # Marian's vocab.json starts with </s> and <unk>; pad goes last or third


@dataclass(frozen=True)
class Variant:
    """One MarianMT configuration to build and import."""

    name: str
    activation: str = "swish"
    separate_vocabs: bool = False  # vocab.json + target_vocab.json (and separate embeddings)
    share_embeddings: bool = True  # share_encoder_decoder_embeddings
    tie_output: bool = True  # tie_word_embeddings
    logits_bias: bool = False  # a random non-zero final_logits_bias
    tags: tuple[str, ...] = ()  # >>xx<< language tags in the vocabulary
    generation: dict = field(default_factory=dict)  # generation_config.json settings besides the token ids


VARIANTS = [
    Variant("swish-shared-tied-bias", logits_bias=True,
            generation={"num_beams": 3, "max_length": 12, "length_penalty": 1.0}),
    Variant("gelu-separate-untied", activation="gelu", separate_vocabs=True, share_embeddings=False, tie_output=False),
    Variant("relu-own-embeddings-tied", activation="relu", share_embeddings=False, logits_bias=True),
    Variant("swish-multilingual", tags=("abc", "xyz")),
]


def train_spm(lines_path: Path, vocab_size: int) -> bytes:
    """A unigram sentencepiece model as Marian's are: sentencepiece's default ids and normalization."""
    import io

    writer = io.BytesIO()
    spm.SentencePieceTrainer.train(
        input=str(lines_path), model_writer=writer, vocab_size=vocab_size, minloglevel=2, num_threads=1
    )
    return writer.getvalue()


def marian_vocabulary(models: list[bytes], tags: tuple[str, ...], pad_last: bool) -> dict[str, int]:
    """vocab.json for `models`' pieces: </s>, <unk>, the pieces, >>xx<< tags, <pad> last (or third)."""
    pieces = ["</s>", "<unk>"] + ([] if pad_last else ["<pad>"])
    for model in models:
        processor = spm.SentencePieceProcessor(model_proto=model)
        for i in range(processor.get_piece_size()):
            piece = processor.id_to_piece(i)
            if not processor.is_control(i) and not processor.is_unknown(i) and piece not in pieces:
                pieces.append(piece)
    pieces += [f">>{tag}<<" for tag in tags] + (["<pad>"] if pad_last else [])
    return {piece: index for index, piece in enumerate(pieces)}


def build_marian_folder(folder: Path, corpus: dict[str, Path], variant: Variant, seed: int = 0) -> Path:
    """Save a tiny random MarianMTModel of `variant` as an OPUS-MT folder; returns the folder."""
    from transformers import GenerationConfig, MarianConfig, MarianMTModel

    folder.mkdir(parents=True)
    src_spm, tgt_spm = train_spm(corpus["train.src"], 60), train_spm(corpus["train.tgt"], 70)
    (folder / "source.spm").write_bytes(src_spm)
    (folder / "target.spm").write_bytes(tgt_spm)
    if variant.separate_vocabs:
        src_vocab = marian_vocabulary([src_spm], (), pad_last=False)
        tgt_vocab = marian_vocabulary([tgt_spm], (), pad_last=False)
        (folder / "target_vocab.json").write_text(json.dumps(tgt_vocab), encoding="utf-8")
    else:
        src_vocab = tgt_vocab = marian_vocabulary([src_spm, tgt_spm], variant.tags, pad_last=True)
    (folder / "vocab.json").write_text(json.dumps(src_vocab), encoding="utf-8")
    pad_id = src_vocab["<pad>"]
    config = MarianConfig(
        vocab_size=len(src_vocab), decoder_vocab_size=len(tgt_vocab), d_model=16, encoder_layers=2, decoder_layers=2,
        encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=32, decoder_ffn_dim=32,
        max_position_embeddings=64, activation_function=variant.activation, scale_embedding=True,
        dropout=0.0, init_std=0.3, pad_token_id=pad_id, eos_token_id=0, decoder_start_token_id=pad_id,
        forced_eos_token_id=0, share_encoder_decoder_embeddings=variant.share_embeddings,
        tie_word_embeddings=variant.tie_output,
    )
    torch.manual_seed(seed)
    model = MarianMTModel(config).eval()
    if variant.logits_bias:
        with torch.no_grad():
            model.final_logits_bias.normal_(0.0, 1.0)
            # Random models like to stop at once: a lower EOS logit gives outputs of a few tokens.
            model.final_logits_bias[0, 0] -= 1.0
    # As OPUS-MT's: padding is a bad word (tfm never generates it anyway).
    model.generation_config = GenerationConfig(
        decoder_start_token_id=pad_id, eos_token_id=0, pad_token_id=pad_id, forced_eos_token_id=0,
        bad_words_ids=[[pad_id]], **variant.generation,
    )
    model.save_pretrained(folder)
    tokenizer_config = {
        "separate_vocabs": variant.separate_vocabs, "unk_token": "<unk>", "eos_token": "</s>", "pad_token": "<pad>",
        "model_max_length": 64, "tokenizer_class": "MarianTokenizer",
    }
    (folder / "tokenizer_config.json").write_text(json.dumps(tokenizer_config), encoding="utf-8")
    return folder


@dataclass
class Imported:
    """A built MarianMT folder, its Hugging Face model and tokenizer, and the tfm checkpoint imported from it."""

    variant: Variant
    folder: Path
    checkpoint: Path
    model: object
    tokenizer: object
    sources: list[str]
    targets: list[str]


@pytest.fixture(scope="module", params=VARIANTS, ids=lambda v: v.name)
def imported(request, tmp_path_factory, synthetic) -> Imported:
    """Each variant built, imported with `tfm import`, and loaded back in transformers (eager attention,
    which returns attention weights); the multilingual variant's sources carry their tags inline."""
    from transformers import MarianMTModel, MarianTokenizer

    variant = request.param
    root = tmp_path_factory.mktemp(variant.name)
    folder = build_marian_folder(root / "hf", synthetic, variant)
    checkpoint = root / "model.safetensors"
    result = run_cli(["import", folder, "-o", checkpoint])
    assert result.exit_code == 0, result.stderr
    assert result.stdout == ""
    model = MarianMTModel.from_pretrained(folder, attn_implementation="eager").eval()
    tokenizer = MarianTokenizer.from_pretrained(folder)
    sources = synthetic["test.src"].read_text(encoding="utf-8").splitlines()[:N_SENTENCES]
    targets = synthetic["test.tgt"].read_text(encoding="utf-8").splitlines()[:N_SENTENCES]
    if variant.tags:
        sources = [f">>{variant.tags[i % 2]}<< {line}" for i, line in enumerate(sources)]
    return Imported(variant, folder, checkpoint, model, tokenizer, sources, targets)


def hf_token_log_probs(imported: Imported, source: str, target_ids: list[int]) -> list[float]:
    """Hugging Face's log p(y_t | y_<t, x) of target_ids (EOS included) after the decoder start token."""
    model, tokenizer = imported.model, imported.tokenizer
    src = tokenizer([source], return_tensors="pt")
    decoder_input = torch.tensor([[model.config.decoder_start_token_id] + target_ids[:-1]])
    with torch.no_grad():
        logits = model(**src, decoder_input_ids=decoder_input).logits[0]  # (T, V)
    return torch.log_softmax(logits.double(), dim=-1).gather(1, torch.tensor(target_ids)[:, None])[:, 0].tolist()


def write_lines(path: Path, lines: list[str]) -> Path:
    """Write `lines` to `path`, one per line; returns `path`."""
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def test_marian_tokenizer_loads_the_folder(imported):
    # The folder is a valid OPUS-MT folder: MarianTokenizer encodes as tfm's imported tokenizer does.
    from tfm_cli.checkpoints.format import load_model

    loaded = load_model(imported.checkpoint)
    for source, target in zip(imported.sources, imported.targets):
        assert loaded.src_tokenizer.encode_ids(source) + [0] == imported.tokenizer([source]).input_ids[0]
        assert loaded.tgt_tokenizer.encode_ids(target) + [0] == imported.tokenizer(text_target=[target]).input_ids[0]
    # `tfm tokenize` reads the checkpoint's own tokenizers too.
    result = run_cli(["tokenize", "encode", "-m", imported.checkpoint, "--side", "tgt"], input=imported.targets[0] + "\n")
    assert result.stdout.split() == imported.tokenizer.convert_ids_to_tokens(
        imported.tokenizer(text_target=[imported.targets[0]]).input_ids[0][:-1]
    )


def test_forced_decoding_log_probs_equal_hugging_faces(imported, tmp_path):
    src = write_lines(tmp_path / "src", imported.sources)
    tgt = write_lines(tmp_path / "tgt", imported.targets)
    result = run_cli(["score", "-m", imported.checkpoint, "--src", src, "--tgt", tgt, "--json", "-q"])
    assert result.exit_code == 0, result.stderr
    worst = 0.0
    for record, source, target in zip(map(json.loads, result.stdout.splitlines()), imported.sources, imported.targets):
        target_ids = imported.tokenizer(text_target=[target]).input_ids[0]
        reference = hf_token_log_probs(imported, source, target_ids)
        assert len(record["token_log_probs"]) == len(reference)
        worst = max(worst, max(abs(a - b) for a, b in zip(record["token_log_probs"], reference)))
    print(f"{imported.variant.name}: token log-probs, max abs diff {worst:.2e}")
    assert worst <= TOLERANCE, worst


def tfm_translate(imported: Imported, tmp_path: Path, *options) -> list[dict]:
    """`tfm translate --json` records of the test sources (tags stay in the text: the tokenizer splits them)."""
    src = write_lines(tmp_path / "src", imported.sources)
    result = run_cli(["translate", "-m", imported.checkpoint, "-i", src, "--json", "-q", *options])
    assert result.exit_code == 0, result.stderr
    return [json.loads(line) for line in result.stdout.splitlines()]


def test_greedy_output_equals_generate(imported, tmp_path):
    max_new_tokens = 10
    records = tfm_translate(imported, tmp_path, "-b", "1", "--max-len-a", "0", "--max-len-b", str(max_new_tokens - 1))
    tokenizer = imported.tokenizer
    inputs = tokenizer(imported.sources, return_tensors="pt", padding=True)
    with torch.no_grad():
        generated = imported.model.generate(**inputs, num_beams=1, do_sample=False, max_new_tokens=max_new_tokens)
    lengths = []
    for record, row in zip(records, generated.tolist()):
        ids = [i for i in row[1:] if i != imported.model.config.pad_token_id]
        ids = ids[:-1] if ids and ids[-1] == 0 else ids  # EOS
        assert record["tokens"] == tokenizer.convert_ids_to_tokens(ids)
        if "<unk>" not in record["tokens"]:
            assert record["translation"] == tokenizer.decode(ids, skip_special_tokens=True, use_source_tokenizer=False)
        lengths.append(len(ids))
    assert max(lengths) >= 3  # the random model says something, not only EOS


def test_beam_scores_equal_hugging_faces(imported, tmp_path):
    records = tfm_translate(imported, tmp_path, "-b", "4", "--max-len-a", "0", "--max-len-b", "8")
    vocab_file = "target_vocab.json" if imported.variant.separate_vocabs else "vocab.json"
    vocab = json.loads((imported.folder / vocab_file).read_text(encoding="utf-8"))
    worst = 0.0
    for record, source in zip(records, imported.sources):
        target_ids = [vocab[piece] for piece in record["tokens"]] + [0]
        log_probs = hf_token_log_probs(imported, source, target_ids)
        # EOS forced at the length limit scores 0, as generate's forced_eos_token_id gives it.
        reference = sum(log_probs if record["nbest"][0]["finished"] else log_probs[:-1])
        worst = max(worst, abs(record["raw_score"] - reference))
    print(f"{imported.variant.name}: beam output scores, max abs diff {worst:.2e}")
    assert worst <= TOLERANCE, worst


@pytest.mark.parametrize("alpha", [None, 0.0, 2.0])  # None: the model's own (generate's default 1.0)
def test_beam_search_equals_generate(imported, tmp_path, alpha):
    # Imported models decode with the `hf` length penalty rule: n ** alpha and generate's beam stop,
    # EOS forced (score 0) at the length limit. So `tfm translate -b K` gives the K hypotheses and
    # normalised scores of generate(num_beams=K, num_return_sequences=K), in the same order.
    max_new_tokens = 10
    tokenizer, model = imported.tokenizer, imported.model
    pad_id = model.config.pad_token_id
    options = () if alpha is None else ("--alpha", str(alpha))
    agreed = 0
    for beam in range(1, 6):
        records = tfm_translate(imported, tmp_path, "-b", str(beam), "--nbest", str(beam), "--max-len-a", "0",
                                "--max-len-b", str(max_new_tokens - 1), *options)
        for record, source in zip(records, imported.sources):
            with torch.no_grad():
                out = model.generate(
                    **tokenizer([source], return_tensors="pt"), num_beams=beam, num_return_sequences=beam,
                    max_new_tokens=max_new_tokens, output_scores=True, return_dict_in_generate=True,
                    **({} if alpha is None else {"length_penalty": alpha}),
                )
            expected = []
            for index, row in enumerate(out.sequences.tolist()):
                ids = [i for i in row[1:] if i != pad_id]
                if beam > 1:
                    score = out.sequences_scores[index].item()
                else:  # generate's greedy search reports logits, not a score: the log-probs it took,
                    # EOS forced at the limit scoring 0
                    log_probs = hf_token_log_probs(imported, source, ids)
                    score = sum(log_probs[:-1] if len(ids) == max_new_tokens else log_probs)
                expected.append((tokenizer.convert_ids_to_tokens(ids[:-1] if ids[-1] == 0 else ids), score))
            key = "raw_score" if beam == 1 else "score"
            got = [(hypothesis["tokens"], hypothesis[key]) for hypothesis in record["nbest"]]
            assert [tokens for tokens, _ in got] == [tokens for tokens, _ in expected], (beam, source)
            for (_, ours), (_, theirs) in zip(got, expected):
                assert abs(ours - theirs) <= TOLERANCE, (beam, source)
            agreed += 1
    assert agreed == 5 * len(imported.sources)


def test_cross_attention_equals_hugging_faces(imported):
    config = imported.model.config
    source, target = imported.sources[0], imported.targets[0]
    src = imported.tokenizer([source], return_tensors="pt")
    target_ids = imported.tokenizer(text_target=[target]).input_ids[0]
    decoder_input = torch.tensor([[config.decoder_start_token_id] + target_ids[:-1]])
    with torch.no_grad():
        output = imported.model(**src, decoder_input_ids=decoder_input, output_attentions=True)
    worst = 0.0
    for layer in range(config.decoder_layers):
        for head in range(config.decoder_attention_heads):
            result = run_cli([
                "inspect-attention", source, "--target", target, "-m", imported.checkpoint, "--format", "json",
                "--layer", str(layer), "--head", str(head), "-q",
            ])
            assert result.exit_code == 0, result.stderr
            matrix = torch.tensor(json.loads(result.stdout)["matrix"], dtype=torch.float64)
            reference = output.cross_attentions[layer][0, head].double()
            assert matrix.shape == reference.shape
            worst = max(worst, float((matrix - reference).abs().max()))
    print(f"{imported.variant.name}: cross-attention, max abs diff {worst:.2e}")
    assert worst <= TOLERANCE, worst


def test_position_table_is_hugging_faces():
    from transformers.models.marian.modeling_marian import MarianSinusoidalPositionalEmbedding

    from tfm_cli.model.layers import sinusoidal_table

    for dims in (16, 15):
        reference = MarianSinusoidalPositionalEmbedding(64, dims).create_weight()
        assert torch.equal(sinusoidal_table(64, dims, "halves"), reference)


def test_imported_checkpoint_round_trips_through_average(tmp_path, imported):
    averaged = tmp_path / "avg.safetensors"
    result = run_cli(["average", imported.checkpoint, "-o", averaged, "-q"])
    assert result.exit_code == 0, result.stderr
    src = write_lines(tmp_path / "src", imported.sources[:2])
    outputs = [
        run_cli(["translate", "-m", path, "-i", src, "-b", "2", "--max-len-b", "5", "-q"]).stdout
        for path in (imported.checkpoint, averaged)
    ]
    assert outputs[0] == outputs[1] and outputs[0].count("\n") == 2


# ---- multilingual models, generation defaults ------------------------------------------------------


@pytest.fixture(scope="module")
def multilingual(tmp_path_factory, synthetic) -> Imported:
    """The multilingual variant (>>abc<< and >>xyz<< tags) imported, with untagged sources."""
    from transformers import MarianMTModel, MarianTokenizer

    root = tmp_path_factory.mktemp("multilingual")
    variant = VARIANTS[3]
    folder = build_marian_folder(root / "hf", synthetic, variant, seed=1)
    checkpoint = root / "model.safetensors"
    assert run_cli(["import", folder, "-o", checkpoint, "-q"]).exit_code == 0
    sources = synthetic["test.src"].read_text(encoding="utf-8").splitlines()[:4]
    return Imported(variant, folder, checkpoint, MarianMTModel.from_pretrained(folder, attn_implementation="eager").eval(),
                    MarianTokenizer.from_pretrained(folder), sources, [])


def test_target_lang_prepends_the_tag_as_marian_does(multilingual, tmp_path):
    src = write_lines(tmp_path / "src", multilingual.sources)
    for tag in ("abc", "xyz"):
        by_option = run_cli(["translate", "-m", multilingual.checkpoint, "-i", src, "--target-lang", tag, "-b", "1",
                             "--max-len-a", "0", "--max-len-b", "6", "--alignment", "-q"])
        tagged = write_lines(tmp_path / "tagged", [f">>{tag}<< {line}" for line in multilingual.sources])
        inline = run_cli(["translate", "-m", multilingual.checkpoint, "-i", tagged, "-b", "1",
                          "--max-len-a", "0", "--max-len-b", "6", "-q"])
        assert by_option.exit_code == 0, by_option.stderr
        assert [line.split("\t")[0] for line in by_option.stdout.splitlines()] == inline.stdout.splitlines()
        # The alignment names only the sentence's own words (the tag is no source word).
        for line, source in zip(by_option.stdout.splitlines(), multilingual.sources):
            pairs = [tuple(map(int, pair.split("-"))) for pair in line.split("\t")[1].split()]
            assert all(s < len(source.split()) for s, _ in pairs)


def test_unknown_target_lang_lists_the_tags(multilingual):
    result = run_cli(["translate", "-m", multilingual.checkpoint, "--target-lang", "fra"], input="a dog\n")
    assert result.exit_code == 1 and result.stdout == ""
    assert result.stderr.count("\n") == 1 and ">>fra<<" in result.stderr and "abc, xyz" in result.stderr


def test_target_lang_on_a_model_without_tags(random_checkpoint):
    result = run_cli(["translate", "-m", random_checkpoint, "--target-lang", "fra"], input="a dog\n")
    assert result.exit_code == 1 and "no >>xx<< language tags" in result.stderr


def test_generation_defaults_travel_and_flags_override(tmp_path, synthetic):
    from tfm_cli.checkpoints.format import read_checkpoint

    variant = VARIANTS[0]
    folder = build_marian_folder(tmp_path / "hf", synthetic, variant)
    checkpoint = tmp_path / "model.safetensors"
    assert run_cli(["import", folder, "-o", checkpoint, "-q"]).exit_code == 0
    pad_id = json.loads((folder / "vocab.json").read_text())["<pad>"]
    defaults = read_checkpoint(checkpoint).decode_defaults
    assert defaults == {"beam_size": 3, "length_penalty": 1.0, "length_penalty_kind": "hf", "forced_eos": True,
                        "max_len_a": 0.0, "max_len_b": 10, "banned_ids": (pad_id,), "min_len": 0}
    src = write_lines(tmp_path / "src", synthetic["test.src"].read_text().splitlines()[:3])
    record = json.loads(run_cli(["translate", "-m", checkpoint, "-i", src, "--json", "--nbest", "3", "-q"]).stdout.splitlines()[0])
    assert len(record["nbest"]) == 3 and record["score_normalisation"] == "raw / n ** 1.0, n = output tokens including EOS"
    refused = run_cli(["translate", "-m", checkpoint, "-i", src, "--nbest", "4", "-q"])
    assert refused.exit_code == 1 and "nbest must be between 1 and the beam size (3)" in refused.stderr
    overridden = run_cli(["translate", "-m", checkpoint, "-i", src, "--json", "-b", "5", "--nbest", "5", "--alpha", "0", "-q"])
    record = json.loads(overridden.stdout.splitlines()[0])
    assert len(record["nbest"]) == 5 and record["score"] == record["raw_score"]


def test_own_checkpoints_keep_tfms_defaults(random_checkpoint):
    from tfm_cli.checkpoints.format import load_model, read_checkpoint

    assert read_checkpoint(random_checkpoint).decode_defaults == {}
    assert load_model(random_checkpoint).decode_defaults == {}


# ---- refusals --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def good_folder(tmp_path_factory, synthetic) -> Path:
    """A valid OPUS-MT folder (the first variant) that the refusal tests copy and damage."""
    return build_marian_folder(tmp_path_factory.mktemp("good") / "hf", synthetic, VARIANTS[0])


def edit_json(path: Path, **changes) -> None:
    """Set keys of the JSON object in `path`."""
    values = json.loads(path.read_text(encoding="utf-8"))
    values.update(changes)
    path.write_text(json.dumps(values), encoding="utf-8")


def break_config(**changes):
    """A folder edit that sets config.json keys."""
    return lambda folder: edit_json(folder / "config.json", **changes)


def truncate_weights(folder: Path) -> None:
    data = (folder / "model.safetensors").read_bytes()
    (folder / "model.safetensors").write_bytes(data[: len(data) * 2 // 3])


def only_pickle(folder: Path) -> None:
    (folder / "model.safetensors").rename(folder / "pytorch_model.bin")


def vocab_out_of_range(folder: Path) -> None:
    edit_json(folder / "vocab.json", **{"▁zzz": 10_000})


def edit_weights(folder: Path, edit) -> None:
    """Rewrite the folder's model.safetensors after `edit(tensors)` changed the dict in place."""
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(folder / "model.safetensors"))
    edit(tensors)
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})


def differing_tied_copy(tensors: dict) -> None:
    tensors["lm_head.weight"] = tensors["model.shared.weight"] + 1.0


REFUSALS = {
    "missing vocab.json": (lambda folder: (folder / "vocab.json").unlink(), "no vocab.json"),
    "missing source.spm": (lambda folder: (folder / "source.spm").unlink(), "no source.spm"),
    "missing config.json": (lambda folder: (folder / "config.json").unlink(), "no config.json"),
    "vocab.json not an object": (lambda folder: (folder / "vocab.json").write_text("[1, 2]"), "expected a JSON object"),
    "vocab.json id out of range": (vocab_out_of_range, "outside the model's vocabulary"),
    "vocab.json not JSON": (lambda folder: (folder / "vocab.json").write_text("{"), "not valid JSON"),
    "target.spm not sentencepiece": (lambda folder: (folder / "target.spm").write_text("hello"), "not a sentencepiece model"),
    "truncated model.safetensors": (truncate_weights, "truncated"),
    "pytorch_model.bin only": (only_pickle, "never loads pickled weights"),
    "BART config": (break_config(model_type="bart"), "model_type 'bart' is not supported"),
    "T5 config": (break_config(model_type="t5"), "model_type 't5' is not supported"),
    "unknown activation": (break_config(activation_function="gelu_new"), "activation_function 'gelu_new'"),
    "normalize_before": (break_config(normalize_before=True), "normalize_before=true is not supported"),
    "add_final_layer_norm": (break_config(add_final_layer_norm=True), "add_final_layer_norm=true"),
    "unscaled embeddings": (break_config(scale_embedding=False), "scale_embedding=false"),
    "shared but untied": (break_config(tie_word_embeddings=False), "tie_word_embeddings=false"),
    "different head counts": (break_config(decoder_attention_heads=4), "decoder_attention_heads=4"),
    "more layers than tensors": (break_config(encoder_layers=3), "model.encoder.layers.2"),
    "sampling generation": (lambda folder: edit_json(folder / "generation_config.json", do_sample=True), "do_sample=true"),
    "unknown length penalty rule": (
        lambda folder: edit_json(folder / "generation_config.json", tfm_length_penalty_kind="wu"),
        'tfm_length_penalty_kind="wu" is not one of gnmt, hf, none',
    ),
    "length penalty rule not a name": (
        lambda folder: edit_json(folder / "generation_config.json", tfm_length_penalty_kind=["gnmt"]),
        'tfm_length_penalty_kind=["gnmt"] is not one of',
    ),
    "negative min_length": (lambda folder: edit_json(folder / "generation_config.json", min_length=-1), "min_length must be an integer >= 0"),
    "proportional limit not numbers": (
        lambda folder: edit_json(folder / "generation_config.json", tfm_max_len={"a": "1.5", "b": 10}),
        'tfm_max_len must be {"a": number, "b": integer}',
    ),
    "tied copy differs": (lambda folder: edit_weights(folder, differing_tied_copy), "differs from 'model.shared.weight'"),
    "an extra tensor": (lambda folder: edit_weights(folder, lambda t: t.update(extra=torch.zeros(2))), "'extra'"),
    "learned positions": (
        lambda folder: edit_weights(folder, lambda t: t.update({"model.encoder.embed_positions.weight": torch.ones(64, 16)})),
        "not Marian's sinusoidal table",
    ),
}


@pytest.mark.parametrize("case", list(REFUSALS))
def test_bad_folders_are_refused_with_one_line(case, good_folder, tmp_path):
    damage, fragment = REFUSALS[case]
    folder = tmp_path / "hf"
    shutil.copytree(good_folder, folder)
    damage(folder)
    output = tmp_path / "out" / "model.safetensors"
    output.parent.mkdir()
    result = run_cli(["import", folder, "-o", output])
    assert result.exit_code == 1
    assert result.stdout == ""
    assert result.stderr.startswith("error:") and result.stderr.count("\n") == 1, result.stderr
    assert fragment in result.stderr, result.stderr
    assert "Traceback" not in result.stderr
    assert list(output.parent.iterdir()) == []


def test_missing_folder_and_hub_ids(tmp_path, monkeypatch):
    result = run_cli(["import", tmp_path / "nowhere", "-o", tmp_path / "m.safetensors"])
    assert result.exit_code == 1 and "no such folder" in result.stderr
    monkeypatch.setitem(__import__("sys").modules, "huggingface_hub", None)  # as if it were not installed
    result = run_cli(["import", "Helsinki-NLP/opus-mt-xx-yy", "-o", tmp_path / "m.safetensors"])
    assert result.exit_code == 1 and result.stderr.count("\n") == 1
    assert "hf download Helsinki-NLP/opus-mt-xx-yy --local-dir DIR" in result.stderr
    assert not (tmp_path / "m.safetensors").exists()


def test_tied_weights_may_be_stored_under_any_of_their_names(good_folder, tmp_path):
    # Tools that deduplicate tied tensors keep one copy under any name: lm_head.weight alone must do.
    folder = tmp_path / "hf"
    shutil.copytree(good_folder, folder)
    edit_weights(folder, lambda t: t.update({"lm_head.weight": t.pop("model.shared.weight")}))
    results = []
    for source in (good_folder, folder):
        checkpoint = tmp_path / f"{source.name}-{len(results)}.safetensors"
        assert run_cli(["import", source, "-o", checkpoint, "-q"]).exit_code == 0
        results.append(run_cli(["translate", "-m", checkpoint, "-b", "2", "-q"], input="the dog sees my cat\n").stdout)
    assert results[0] == results[1] != ""


def test_imported_checkpoint_layout(imported):
    from safetensors import safe_open

    with safe_open(str(imported.checkpoint), framework="pt") as f:
        names, metadata = set(f.keys()), f.metadata()
    assert "tokenizer.src_vocab" in names and "tokenizer.tgt" in names  # source.spm and target.spm differ
    assert ("tokenizer.tgt_vocab" in names) == imported.variant.separate_vocabs
    assert ("output_proj.bias" in names) == imported.variant.logits_bias
    assert ("output_proj.weight" in names) == (not imported.variant.tie_output)
    config = json.loads(metadata["model_config"])
    assert config["sinusoid_layout"] == "halves" and config["bos_id"] == config["pad_id"]
    assert json.loads(metadata["provenance"])["imported_from"]["folder"] == str(imported.folder.resolve())


@pytest.mark.parametrize("decode_defaults, fragment", [
    ("[1]", "decode_defaults is not a JSON object"),
    ('{"beam_size": 0}', "beam size must be between 1 and 1024"),
    ('{"temperature": 2.0}', "unknown key 'temperature'"),
    ('{"banned_ids": [100000]}', "banned id 100000 is outside the target vocabulary"),
])
def test_damaged_decode_defaults_are_refused(decode_defaults, fragment, good_folder, tmp_path):
    checkpoint = tmp_path / "model.safetensors"
    assert run_cli(["import", good_folder, "-o", checkpoint, "-q"]).exit_code == 0
    damaged = rewritten_checkpoint(checkpoint, tmp_path / "damaged.safetensors",
                                   metadata=lambda meta: meta.update(decode_defaults=decode_defaults))
    result = run_cli(["translate", "-m", damaged], input="a dog\n")
    assert result.exit_code == 1 and result.stderr.count("\n") == 1 and fragment in result.stderr, result.stderr


def test_legacy_config_fields_and_generation_settings_in_config_json(good_folder, tmp_path):
    # Older OPUS-MT folders: BART-era fields with Marian's values, generation settings in config.json only.
    from tfm_cli.checkpoints.format import read_checkpoint

    folder = tmp_path / "hf"
    shutil.copytree(good_folder, folder)
    (folder / "generation_config.json").unlink()
    pad_id = json.loads((folder / "vocab.json").read_text())["<pad>"]
    edit_json(folder / "config.json", normalize_before=False, normalize_embedding=False, add_final_layer_norm=False,
              add_bias_logits=False, static_position_embeddings=True, extra_pos_embeddings=pad_id + 1,
              num_beams=6, max_length=40, bad_words_ids=[[pad_id]], architectures=["MarianMTModel"])
    checkpoint = tmp_path / "model.safetensors"
    result = run_cli(["import", folder, "-o", checkpoint])
    assert result.exit_code == 0, result.stderr
    assert read_checkpoint(checkpoint).decode_defaults == {  # generate's alpha 1.0, unstated, applied as generate does
        "beam_size": 6, "length_penalty": 1.0, "length_penalty_kind": "hf", "forced_eos": True, "max_len_a": 0.0,
        "max_len_b": 38, "banned_ids": (pad_id,), "min_len": 0
    }


EOS_BIAS = 4.0


@pytest.mark.parametrize("setting, min_len", [({"min_length": 4}, 3), ({"min_new_tokens": 2}, 2)])
def test_minimum_length_equals_generates(tmp_path, synthetic, setting, min_len):
    # generate's min_length counts the decoder start token, min_new_tokens only generated tokens; tfm's
    # min_len counts output tokens. A raised EOS bias makes the random model stop early, so the minimum decides.
    from transformers import MarianMTModel, MarianTokenizer

    from tfm_cli.checkpoints.format import read_checkpoint

    folder = build_marian_folder(tmp_path / "hf", synthetic, Variant("minimum", generation=setting))
    edit_weights(folder, lambda tensors: tensors["final_logits_bias"][0, 0].add_(EOS_BIAS))  # EOS (id 0) likely early
    checkpoint = tmp_path / "model.safetensors"
    assert run_cli(["import", folder, "-o", checkpoint, "-q"]).exit_code == 0
    assert read_checkpoint(checkpoint).decode_defaults["min_len"] == min_len
    model, tokenizer = MarianMTModel.from_pretrained(folder).eval(), MarianTokenizer.from_pretrained(folder)
    sources = synthetic["test.src"].read_text(encoding="utf-8").splitlines()[:N_SENTENCES]
    imported = Imported(Variant("minimum"), folder, checkpoint, model, tokenizer, sources, [])
    max_new_tokens = 10
    limit = ("--max-len-a", "0", "--max-len-b", str(max_new_tokens - 1))
    free = tfm_translate(imported, tmp_path, "-b", "1", "--min-len", "0", *limit)
    assert min(len(record["tokens"]) for record in free) < min_len  # without the minimum, some output is shorter
    for beam in (1, 3):
        records = tfm_translate(imported, tmp_path, "-b", str(beam), *limit)
        with torch.no_grad():
            generated = model.generate(**tokenizer(sources, return_tensors="pt", padding=True), num_beams=beam,
                                       max_new_tokens=max_new_tokens)
        for record, row in zip(records, generated.tolist()):
            ids = [i for i in row[1:] if i != model.config.pad_token_id]
            ids = ids[:-1] if ids and ids[-1] == 0 else ids  # EOS
            assert record["tokens"] == tokenizer.convert_ids_to_tokens(ids), (beam, record["tokens"])
            assert len(ids) >= min_len


def test_renormalized_scores_equal_generates(tmp_path, synthetic):
    # renormalize_logits: generate takes log_softmax again after banning bad_words_ids (padding, whose
    # zero row in Marian's converted embeddings gives it a logit of 0): tfm's scores must follow.
    from transformers import LogitNormalization, MarianMTModel, MarianTokenizer, NoBadWordsLogitsProcessor

    variant = Variant("renormalized", generation={"renormalize_logits": True})
    folder = build_marian_folder(tmp_path / "hf", synthetic, variant)
    checkpoint = tmp_path / "model.safetensors"
    assert run_cli(["import", folder, "-o", checkpoint, "-q"]).exit_code == 0
    model, tokenizer = MarianMTModel.from_pretrained(folder).eval(), MarianTokenizer.from_pretrained(folder)
    sources = synthetic["test.src"].read_text(encoding="utf-8").splitlines()[:N_SENTENCES]
    imported = Imported(variant, folder, checkpoint, model, tokenizer, sources, [])
    max_new_tokens = 10
    records = tfm_translate(imported, tmp_path, "-b", "1", "--max-len-a", "0", "--max-len-b", str(max_new_tokens - 1))
    inputs = tokenizer(sources, return_tensors="pt", padding=True)
    with torch.no_grad():
        out = model.generate(**inputs, num_beams=1, max_new_tokens=max_new_tokens, output_scores=True,
                             return_dict_in_generate=True)
    steps = model.compute_transition_scores(out.sequences, out.scores)  # (N, steps): generate's processed scores
    start, pad_id = model.config.decoder_start_token_id, model.config.pad_token_id
    renormalize = [NoBadWordsLogitsProcessor([[pad_id]], eos_token_id=0), LogitNormalization()]
    for record, source, row, generated in zip(records, sources, out.sequences.tolist(), steps.tolist()):
        ids = [i for i in row[1:] if i != pad_id]
        ids = ids if ids[-1] == 0 else ids + [0]
        assert record["tokens"] == tokenizer.convert_ids_to_tokens(ids[:-1])
        decoder_input = torch.tensor([[start] + ids[:-1]])
        with torch.no_grad():
            scores = torch.log_softmax(model(**tokenizer([source], return_tensors="pt"), decoder_input_ids=decoder_input).logits[0], -1)
        for processor in renormalize:  # one position at a time, as generate applies them
            scores = torch.stack([processor(decoder_input[:, : t + 1], scores[t : t + 1])[0] for t in range(len(ids))])
        token_scores = scores.gather(1, torch.tensor(ids)[:, None])[:, 0].tolist()
        # generate's own scores; EOS forced at its length limit scores 0 in both.
        closed = len(ids) == max_new_tokens
        for got, expected in zip(token_scores[: len(ids) - closed], generated):
            assert abs(got - expected) <= TOLERANCE
        assert abs(record["raw_score"] - sum(token_scores[: len(ids) - closed])) <= TOLERANCE
        assert abs(record["raw_score"] - sum(hf_token_log_probs(imported, source, ids)[: len(ids) - closed])) > 10 * TOLERANCE
    # score -m renormalises too: forced decoding of the reference targets, against the same processors.
    targets = synthetic["test.tgt"].read_text(encoding="utf-8").splitlines()[:N_SENTENCES]
    scored = run_cli(["score", "-m", checkpoint, "--src", write_lines(tmp_path / "src.txt", sources),
                      "--tgt", write_lines(tmp_path / "tgt.txt", targets), "--normalize", "none", "--json"])
    assert scored.exit_code == 0, scored.stderr
    for line, source, target in zip(scored.stdout.splitlines(), sources, targets):
        ids = tokenizer(text_target=[target]).input_ids[0]  # the target's ids, EOS last
        decoder_input = torch.tensor([[start] + ids[:-1]])
        with torch.no_grad():
            scores = torch.log_softmax(model(**tokenizer([source], return_tensors="pt"), decoder_input_ids=decoder_input).logits[0], -1)
        for processor in renormalize:
            scores = torch.stack([processor(decoder_input[:, : t + 1], scores[t : t + 1])[0] for t in range(len(ids))])
        expected = float(scores.gather(1, torch.tensor(ids)[:, None])[:, 0].double().sum())
        assert abs(json.loads(line)["raw"] - expected) <= TOLERANCE
        assert abs(expected - sum(hf_token_log_probs(imported, source, ids))) > 10 * TOLERANCE  # it matters
