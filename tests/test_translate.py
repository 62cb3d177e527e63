"""`tfm translate` end to end: batch invariance on held-out sentences, order, empty lines, formats, bad input."""

from __future__ import annotations

import json
import sys

import pytest
import torch

from conftest import run_cli
from tfm_cli.inference.alignment import parse_pharaoh
from tfm_cli.checkpoints.format import load_model
from tfm_cli.config import DecodeConfig
from tfm_cli.length_penalty import GnmtPenalty
from tfm_cli.textio.streams import read_chunks
from tfm_cli.inference.translation import BatchingConfig, TranslationStats, Translator, translate_stream
from translate_support import held_out_sources, one_thread, trained_checkpoint  # noqa: F401 (one_thread: autouse fixture)


@pytest.fixture(scope="module")
def model_path():
    return trained_checkpoint()


@pytest.fixture(scope="module")
def test_lines() -> list[str]:
    """The trained model's 200 held-out synthetic source sentences (English-like)."""
    return held_out_sources()


def translate_all(translator: Translator, lines: list[str]) -> list[tuple[str, float]]:
    stats = TranslationStats()
    size = translator.batching.buffer_size
    results = []
    for start in range(0, len(lines), size):
        results += translator.translate_chunk(lines[start : start + size], start, stats)
    return [(r.outputs[0].text, r.outputs[0].raw_score) if r.outputs else ("", 0.0) for r in results]


@pytest.mark.parametrize("beam_size", [1, 4])
def test_batched_translation_equals_one_at_a_time_on_held_out_sentences(model_path, test_lines, beam_size):
    # 200 held-out sentences: all in one chunk (batches of many sentences), in odd batch sizes,
    # and one sentence per chunk. Translations and their float scores must be identical.
    loaded = load_model(model_path)
    lines = test_lines[:200]
    decode = DecodeConfig(beam_size=beam_size)
    batched = translate_all(Translator(loaded, decode, BatchingConfig(buffer_size=200)), lines)
    odd = translate_all(Translator(loaded, decode, BatchingConfig(buffer_size=67, batch_size=3)), lines)
    alone = translate_all(Translator(loaded, decode, BatchingConfig(buffer_size=1)), lines)
    assert len({text for text, _ in batched}) > 80, "outputs too uniform for a meaningful test"
    assert batched == alone
    assert odd == alone


@pytest.mark.parametrize("dtype", ["float32", "int8", "bf16"])
@pytest.mark.parametrize("full_context", [False, True])
def test_forced_attention_of_a_pair_has_the_same_bits_alone_and_among_other_widths(model_path, test_lines, dtype,
                                                                                  full_context):
    # What --alignment, --markup and the serve API's alignments read: a pair's attention must not depend on the
    # other pairs of its batch (their source and output widths, their number), as a search's result does not.
    from tfm_cli.config import AlignmentConfig
    from tfm_cli.inference.alignment import forced_attention
    from tfm_cli.inference.decoding import padded_length
    from tfm_cli.model.precision import cpu_support, int8_layer_class

    if dtype == "int8" and int8_layer_class(cpu_support()) is None:
        return  # this torch build has no int8 kernel for this CPU (tests/test_precision.py covers the refusal)
    loaded = load_model(model_path, dtype=dtype)
    sources = [loaded.src_tokenizer.encode_ids(line) for line in test_lines[:40]]
    outputs = [loaded.tgt_tokenizer.encode_ids(" ".join(line.split()[::-1])) for line in test_lines[40:80]]
    assert len({(padded_length(len(s) + 1), padded_length(len(o) + 1)) for s, o in zip(sources, outputs)}) >= 3
    alignment = AlignmentConfig(full_context=full_context)
    with torch.inference_mode():
        together = forced_attention(loaded.model, None, alignment, sources, outputs)
        for index in (0, 7, 19, 33, 39):
            alone = forced_attention(loaded.model, None, alignment, [sources[index]], [outputs[index]])[0]
            assert alone.shape == (len(outputs[index]) + 1, len(sources[index]) + 1)
            assert torch.equal(alone, together[index]), index
        pair = forced_attention(loaded.model, None, alignment, sources[5:7], outputs[5:7])
        assert all(torch.equal(a, b) for a, b in zip(pair, together[5:7]))


def test_forced_attention_pads_a_small_group_for_products_that_round_by_row_count():
    # Plain F.linear (MKL) multiplies fewer than ~12 rows with another kernel: a pair alone at width 8 (8 token
    # rows) must still get the bits it gets beside a second pair of its widths.
    from conftest import tiny_config
    from tfm_cli.config import AlignmentConfig
    from tfm_cli.inference.alignment import forced_attention
    from tfm_cli.model import Transformer

    torch.manual_seed(0)
    model = Transformer(tiny_config()).eval()  # not packed: F.linear products
    sources, outputs = [[5, 6, 7], [8, 9, 10, 11]], [[12, 13, 14], [15, 16]]
    with torch.inference_mode():
        together = forced_attention(model, None, AlignmentConfig(), sources, outputs)
        for index in range(2):
            alone = forced_attention(model, None, AlignmentConfig(), [sources[index]], [outputs[index]])[0]
            assert torch.equal(alone, together[index]), index


def test_cli_keeps_order_line_count_and_empty_lines(model_path, test_lines):
    lines = [test_lines[5], "", test_lines[0], "   ", test_lines[17], test_lines[5], ""]
    result = run_cli(["translate", "-m", model_path, "--beam", "3"], input="\n".join(lines) + "\n")
    assert result.exit_code == 0, result.stderr
    outputs = result.stdout.split("\n")[:-1]
    assert len(outputs) == len(lines)
    assert outputs[1] == outputs[3] == outputs[6] == ""
    assert outputs[0] == outputs[5] != ""
    for line, output in zip(lines, outputs):
        if line.strip():
            alone = run_cli(["translate", "-m", model_path, "--beam", "3"], input=line + "\n")
            assert alone.stdout == output + "\n"


def test_blank_input_gives_no_output(model_path):
    result = run_cli(["translate", "-m", model_path], input="")
    assert result.exit_code == 0 and result.stdout == ""
    result = run_cli(["translate", "-m", model_path], input="\n\n")
    assert result.exit_code == 0 and result.stdout == "\n\n"


def test_printed_scores_are_normalised_forced_decoding_log_probs(model_path, test_lines):
    lines = test_lines[20:26]
    alpha = 1.0
    result = run_cli(
        ["translate", "-m", model_path, "--scores", "--nbest", "2", "--length-penalty", alpha, "--json"],
        input="\n".join(lines) + "\n",
    )
    assert result.exit_code == 0, result.stderr
    loaded = load_model(model_path)
    model, config = loaded.model, loaded.config
    for line, record in zip(lines, map(json.loads, result.stdout.splitlines())):
        assert record["schema"] == "tfm-translate/1" and record["source"] == line
        assert len(record["nbest"]) == 2
        for hyp in record["nbest"]:
            ids = [loaded.tgt_tokenizer.piece_to_id(piece) for piece in hyp["tokens"]]
            src = torch.tensor([loaded.src_tokenizer.encode_ids(line) + [config.eos_id]])
            with torch.no_grad():
                logits = model(src, torch.tensor([[config.bos_id] + ids]))[0]  # (T, V)
            log_probs = torch.log_softmax(logits.double(), dim=-1)
            raw = sum(float(log_probs[t, token]) for t, token in enumerate(ids + [config.eos_id]))
            assert hyp["raw_score"] == pytest.approx(raw, abs=1e-4)
            assert hyp["score"] == pytest.approx(raw / GnmtPenalty(alpha).divisor(len(ids) + 1), abs=1e-4)
    plain = run_cli(["translate", "-m", model_path, "--scores", "--length-penalty", alpha], input=lines[0] + "\n")
    text, score = plain.stdout.rstrip("\n").split("\t")
    first = json.loads(result.stdout.splitlines()[0])
    assert text == first["translation"] and float(score) == pytest.approx(first["score"], abs=1e-6)


def test_alignment_is_word_level_pharaoh(model_path, test_lines):
    lines = test_lines[30:34]
    result = run_cli(
        ["translate", "-m", model_path, "--alignment", "--align-layer", "0", "--align-head", "1"],
        input="\n".join(lines) + "\n",
    )
    assert result.exit_code == 0, result.stderr
    for line, output in zip(lines, result.stdout.splitlines()):
        text, links = output.split("\t")
        pairs = parse_pharaoh(links)
        # One link per output word, pointing at a source word (words split on spaces).
        assert [tgt for _, tgt in pairs] == list(range(len(text.split(" "))))
        assert all(0 <= src < len(line.split()) for src, _ in pairs)
    json_result = run_cli(["translate", "-m", model_path, "--json"], input=lines[0] + "\n")
    record = json.loads(json_result.stdout)
    assert [lines[0][a:b] for a, b in record["source_words"]] == lines[0].split()
    assert len(parse_pharaoh(record["alignment"])) == len(record["target_words"])
    assert [record["translation"][a:b] for a, b in record["target_words"]] == record["translation"].split()
    bad_head = run_cli(["translate", "-m", model_path, "--alignment", "--align-head", "99"], input="a\n")
    assert bad_head.exit_code == 1 and "--align-head" in bad_head.stderr


def test_invalid_utf8_and_overlong_lines_are_repaired_and_counted(model_path):
    long_line = " ".join(["dog"] * 400)  # far beyond the tiny model's 128 positions
    data = b"the dog \xff\xfe s\xe9es my cat\n" + long_line.encode() + b"\nthe man sees the cat\n"
    result = run_cli(["translate", "-m", model_path, "--beam", "2"], input=data)
    assert result.exit_code == 0, result.stderr
    assert len(result.stdout.splitlines()) == 3
    assert "1 line(s) had invalid UTF-8 (line 1); bad bytes became U+FFFD" in result.stderr
    assert "line 2: its" in result.stderr and "source tokens exceed the model's 127" in result.stderr


def test_a_file_that_is_not_a_checkpoint_is_one_clear_error(tmp_path):
    fake = tmp_path / "model.safetensors"
    fake.write_bytes(b"\x80\x04\x95 this is a pickle, not safetensors")
    result = run_cli(["translate", "-m", fake], input="Hallo\n")
    assert result.exit_code == 1
    assert "not a safetensors file" in result.stderr and "Traceback" not in result.stderr


def test_read_chunks_answers_a_pause_before_the_chunk_is_full():
    import threading

    answered = threading.Event()
    waited = []

    def slow_lines():
        yield "a"
        yield "b"
        # "c" is typed only once the first chunk was handed out; a reader that waited for a full
        # chunk instead would get it only when this generous timeout ran out (waited == [False]).
        waited.append(answered.wait(120))
        yield "c"

    chunks = read_chunks(slow_lines(), size=100, pause_s=0.05)
    assert next(chunks) == ["a", "b"]
    answered.set()
    assert list(chunks) == [["c"]]
    assert waited == [True], "the first chunk came only after the next line was written"


@pytest.mark.skipif(sys.platform == "win32", reason="needs a pseudo-terminal")
@pytest.mark.parametrize("quiet", [False, True])
def test_a_terminal_on_stdin_is_told_where_input_is_read(random_checkpoint, quiet):
    import os
    import pty
    import subprocess

    # stdin a terminal (a pseudo-terminal here), as when someone runs `tfm translate -m M` and waits.
    terminal, terminal_side = pty.openpty()
    command = [sys.executable, "-m", "tfm_cli", "translate", "-m", random_checkpoint, "--beam", "1",
               "--max-len-a", "0", "--max-len-b", "4", "--threads", "1", *(["-q"] if quiet else [])]
    process = subprocess.Popen(command, stdin=terminal_side, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    os.close(terminal_side)
    try:
        os.write(terminal, b"the dog sees my cat\n\x04")  # one line, then Ctrl-D at the start of a line: end of input
        stdout, stderr = process.communicate(timeout=120)
    finally:
        os.close(terminal)
    assert process.returncode == 0, stderr.decode()
    assert len(stdout.decode().splitlines()) == 1
    told = "reading source lines from stdin (Ctrl-D to end)" in stderr.decode()
    assert told != quiet, stderr.decode()


def test_piped_input_gets_no_terminal_hint(random_checkpoint):
    result = run_cli(["translate", "-m", random_checkpoint, "--beam", "1", "--max-len-b", "4"], input="the dog sees my cat\n")
    assert result.exit_code == 0, result.stderr
    assert "Ctrl-D" not in result.stderr and "translated 1 lines" in result.stderr


def test_translation_time_leaves_out_waiting_for_input(random_checkpoint, monkeypatch):
    # Someone types a line, reads the answer, thinks for an hour, types the next: the summary's
    # "translated N lines in X s" must count the translating, not the hour. The hour passes on a
    # shifted clock (time.perf_counter + 1 h per line typed), not in the test.
    import threading
    import time

    decode = DecodeConfig(beam_size=1, max_len_a=0.0, max_len_b=4)
    translator = Translator(load_model(random_checkpoint), decode, BatchingConfig(buffer_size=1))
    hour, idle_hours, real_clock = 3600.0, [], time.perf_counter
    monkeypatch.setattr(time, "perf_counter", lambda: real_clock() + hour * len(idle_hours))
    answered = threading.Semaphore(0)

    def typed_lines():
        for number, line in enumerate(["the dog sees my cat", "two birds hears the farmer"]):
            if number:
                answered.acquire()  # the next line is typed only after the previous answer was shown
            idle_hours.append(1)
            yield line

    stats = TranslationStats()
    for chunk in translate_stream(translator, typed_lines(), stats):
        assert len(chunk) == 1
        answered.release()
    assert stats.lines == 2 and len(idle_hours) == 2
    assert 0 < stats.seconds < hour


def test_sampling_options_without_sample_are_named_as_ignored(model_path):
    plain = run_cli(["translate", "-m", model_path, "--beam", "2", "-q"], input="the dog sees my cat\n")
    shaped = run_cli(["translate", "-m", model_path, "--beam", "2", "-q", "--top-k", "5", "--temperature", "0.7"],
                     input="the dog sees my cat\n")
    assert shaped.exit_code == 0 and shaped.stdout == plain.stdout
    assert "ignored without --sample: --top-k, --temperature" in shaped.stderr
    sampled = run_cli(["translate", "-m", model_path, "--sample", "-q", "--top-k", "5"], input="the dog sees my cat\n")
    assert sampled.exit_code == 0 and "ignored" not in sampled.stderr


def test_an_empty_line_gets_the_same_empty_columns_as_the_other_lines(model_path):
    result = run_cli(["translate", "-m", model_path, "--beam", "3", "--nbest", "2", "--scores", "--alignment", "-q"],
                     input="the dog sees my cat\n\nmy cat\n")
    assert result.exit_code == 0, result.stderr
    rows = result.stdout.split("\n")[:-1]
    assert [row.count("\t") for row in rows] == [5, 5, 5]  # 2 hypotheses x (text, score, alignment)
    assert rows[1] == "\t" * 5
    plain = run_cli(["translate", "-m", model_path, "--beam", "2", "-q"], input="the dog sees my cat\n\n")
    assert plain.stdout.split("\n")[1] == ""  # one column: still an empty line


def test_search_batches_mix_source_widths_in_length_order_within_the_limits():
    from tfm_cli.inference.translation import BatchingConfig, length_sorted_batches

    sources = {0: [5] * 20, 1: [5] * 3, 2: [5] * 9, 3: [5] * 4, 4: [5] * 30}  # padded widths 24, 8, 16, 8, 32
    assert list(length_sorted_batches(sources, BatchingConfig())) == [[1, 3, 2, 0, 4]]
    assert list(length_sorted_batches(sources, BatchingConfig(batch_size=2))) == [[1, 3], [2, 0], [4]]
    # --max-tokens bounds sentences x the widest width: 3 x 16 fits 60, 4 x 24 and 2 x 32 do not.
    assert list(length_sorted_batches(sources, BatchingConfig(max_tokens=60))) == [[1, 3, 2], [0], [4]]
