"""`tfm tokenize` through the CLI on the synthetic corpus and inline text: train, encode, decode round trip, bad input."""

from __future__ import annotations

from pathlib import Path

from conftest import run_cli, run_tfm_process

# Characters the synthetic training text never has (capitals, umlauts, punctuation, CJK, emoji):
# only byte fallback brings them back from ids.
UNSEEN_TEXT = "Ein Mann fährt Fahrrad auf der Straße.\n\"Zwei\" Hunde — 犬 🐕, ½ Preis!\n\n  the  dog\tsees\n"


def test_train_encode_decode_round_trip(tmp_path, synthetic):
    prefix = tmp_path / "spm"
    # 256 byte pieces + 4 special ids + 190 learnt pieces (the synthetic text supports at most ~230).
    result = run_cli(["tokenize", "train", synthetic["train.src"], synthetic["train.tgt"],
                      "-o", prefix, "--vocab-size", "450", "--byte-fallback"])
    assert result.exit_code == 0, result.stderr
    assert result.stdout == ""
    assert "450 pieces" in result.stderr
    assert (tmp_path / "spm.model").is_file() and (tmp_path / "spm.vocab").is_file()
    model = tmp_path / "spm.model"
    unseen = tmp_path / "unseen.txt"
    unseen.write_text(UNSEEN_TEXT, encoding="utf-8")
    for path in (synthetic["test.src"], synthetic["test.tgt"], unseen):
        original = path.read_text(encoding="utf-8")
        for extra in ([], ["--ids"]):
            encoded = run_cli(["tokenize", "encode", "-m", model, "-i", path, *extra])
            assert encoded.exit_code == 0, encoded.stderr
            assert encoded.stdout.count("\n") == original.count("\n")
            decoded = run_cli(["tokenize", "decode", "-m", model, *extra], input=encoded.stdout)
            assert decoded.exit_code == 0, decoded.stderr
            assert decoded.stdout == original


def test_special_ids_are_fixed(small_spm):
    from tfm_cli.tokenization.tokenizer import Tokenizer

    processor = Tokenizer.from_file(small_spm).processor
    assert (processor.pad_id(), processor.unk_id(), processor.bos_id(), processor.eos_id()) == (0, 1, 2, 3)


def test_empty_and_whitespace_lines_survive(small_spm):
    text = "Ein Hund.\n\n  zwei  Leerzeichen \n\tTab\n"
    encoded = run_cli(["tokenize", "encode", "-m", small_spm], input=text)
    assert encoded.stdout.split("\n")[1] == ""
    decoded = run_cli(["tokenize", "decode", "-m", small_spm], input=encoded.stdout)
    assert decoded.stdout == text


def test_crlf_input_gives_lf_lines(small_spm):
    encoded = run_cli(["tokenize", "encode", "-m", small_spm], input=b"Ein Hund\r\nzwei\r\n")
    assert encoded.stdout.count("\n") == 2 and "\r" not in encoded.stdout


def test_user_symbol_stays_one_piece(tmp_path, synthetic):
    result = run_cli(["tokenize", "train", synthetic["train.src"], "-o", tmp_path / "s",
                      "--vocab-size", "100", "--user-symbol", "<sep>", "--model-type", "bpe"])
    assert result.exit_code == 0, result.stderr
    encoded = run_cli(["tokenize", "encode", "-m", tmp_path / "s.model"], input="a<sep>b\n")
    assert "<sep>" in encoded.stdout.split()


def test_bad_inputs_give_one_clear_line(tmp_path, small_spm):
    cases = [
        (["tokenize", "encode", "-m", tmp_path / "none.model"], None, "no such"),
        (["tokenize", "encode", "-m", small_spm, "-i", tmp_path], None, "is a directory"),
        (["tokenize", "encode", "-m", small_spm], b"ok\n\xff\xfe bad\n", "<stdin>:2: invalid UTF-8"),
        (["tokenize", "decode", "-m", small_spm, "--ids"], "5 x 7\n", "not a piece id"),
        (["tokenize", "decode", "-m", small_spm, "--ids"], "5 99999\n", "outside the vocabulary"),
        (["tokenize", "train", tmp_path / "missing.txt", "-o", tmp_path / "x"], None, "no such file"),
        (["tokenize", "train", small_spm, "-o", tmp_path / "x", "--model-type", "word"], None, "unigram"),
    ]
    for args, stdin, fragment in cases:
        result = run_cli(args, input=stdin)
        assert result.exit_code == 1, (args, result)
        assert fragment in result.stderr, (args, result.stderr)
        assert len(result.stderr.strip().splitlines()) == 1, result.stderr
        assert "Traceback" not in result.stderr


def test_vocab_too_large_for_the_data(tmp_path):
    tiny = tmp_path / "tiny.txt"
    tiny.write_text("a b c\n")
    result = run_cli(["tokenize", "train", tiny, "-o", tmp_path / "t", "--vocab-size", "5000"])
    assert result.exit_code == 1
    assert "sentencepiece training failed" in result.stderr
    assert not Path(f"{tmp_path}/t.model").exists()


def test_encode_into_closed_pipe_is_quiet(small_spm):
    """`tfm tokenize encode | head -1`: no traceback when the reader goes away."""
    import subprocess
    import sys

    lines = b"Ein Hund.\n" * 20000
    process = subprocess.Popen(
        [sys.executable, "-m", "tfm_cli", "tokenize", "encode", "-m", str(small_spm)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )
    process.stdin.write(b"Ein Hund.\n")
    process.stdin.flush()
    process.stdout.readline()  # the answer to the first line arrives before stdin closes
    process.stdout.close()
    _, stderr = process.communicate(lines, timeout=60)
    assert b"Traceback" not in stderr and b"BrokenPipe" not in stderr
    assert process.returncode in (0, 141)


def test_ten_thousand_lines_through_a_pipe(small_spm):
    lines = "".join(f"Satz {i}\n" for i in range(10000)).encode()
    result = run_tfm_process(["tokenize", "encode", "-m", small_spm], input=lines)
    assert result.returncode == 0
    assert result.stdout.count(b"\n") == 10000


def test_training_twice_gives_the_same_bytes_and_sentencepieces_own_vocab_file(tmp_path, synthetic):
    import os

    import sentencepiece as spm

    from tfm_cli.tokenization.tokenizer import TokenizerTrainConfig, train_sentencepiece

    source = synthetic["train.tgt"]
    config = TokenizerTrainConfig(vocab_size=100)
    first = train_sentencepiece([source], tmp_path / "a" / "spm", config)
    second = train_sentencepiece([source], tmp_path / "b" / "spm", config)
    assert first.read_bytes() == second.read_bytes()  # no output or temp path recorded in the model
    assert str(tmp_path).encode() not in first.read_bytes() and b".spm-" not in first.read_bytes()
    # The reference: sentencepiece saving its own model and .vocab under a prefix, with tfm's settings.
    spm.SentencePieceTrainer.train(
        input=str(source), model_prefix=str(tmp_path / "reference"), vocab_size=100, model_type="unigram",
        character_coverage=1.0, byte_fallback=False, normalization_rule_name="identity",
        remove_extra_whitespaces=False, pad_id=0, unk_id=1, bos_id=2, eos_id=3,
        num_threads=max(1, min(os.cpu_count() or 1, 16)), minloglevel=2,
    )
    reference_vocab = (tmp_path / "reference.vocab").read_text(encoding="utf-8")
    assert (tmp_path / "a" / "spm.vocab").read_text(encoding="utf-8") == reference_vocab


def flat(text: str) -> str:
    """`text` with every run of whitespace (rich's line wrapping) as one space."""
    return " ".join(text.split())


def test_group_help_has_examples():
    result = run_cli(["tokenize", "--help"])
    assert result.exit_code == 0, result.stderr
    help_text = flat(result.stdout)
    assert "Examples:" in help_text
    for command in ("train", "encode", "decode"):
        assert f"tfm tokenize {command} " in help_text


def test_decode_help_says_ids_of_unknown_characters_do_not_round_trip():
    help_text = flat(run_cli(["tokenize", "decode", "--help"]).stdout)
    assert "exact inverse" not in help_text
    assert "<unk>" in help_text and "⁇" in help_text
    assert "tfm tokenize train --byte-fallback" in help_text


def test_unknown_characters_round_trip_as_pieces_but_not_as_ids(letters):
    # What decode --help says: the letters model knows a-h only, so x and y are outside its vocabulary.
    text = "a b xy c\n"
    pieces = run_cli(["tokenize", "encode", "-m", letters["spm"]], input=text).stdout
    assert run_cli(["tokenize", "decode", "-m", letters["spm"]], input=pieces).stdout == text
    ids = run_cli(["tokenize", "encode", "-m", letters["spm"], "--ids"], input=text).stdout
    assert "1" in ids.split()  # <unk>
    decoded = run_cli(["tokenize", "decode", "-m", letters["spm"], "--ids"], input=ids).stdout
    assert decoded != text and "⁇" in decoded


def test_train_reads_a_fifo_input_once(tmp_path, synthetic):
    # tfm checks the text (UTF-8) before sentencepiece reads it: a FIFO must be copied, not read twice.
    import os
    import threading

    fifo = tmp_path / "text.fifo"
    os.mkfifo(fifo)
    writer = threading.Thread(target=lambda: fifo.write_bytes(synthetic["train.src"].read_bytes()))
    writer.start()
    result = run_cli(["tokenize", "train", fifo, "-o", tmp_path / "spm", "--vocab-size", "100", "-q"])
    writer.join(timeout=60)
    assert result.exit_code == 0, result.stderr
    assert (tmp_path / "spm.model").is_file() and (tmp_path / "spm.vocab").is_file()


def test_sampling_keeps_limit_lines_uniformly_and_the_same_ones_every_time(tmp_path):
    from tfm_cli.tokenization.tokenizer import sample_sentences

    first, second = tmp_path / "a.txt", tmp_path / "b.txt"
    first.write_text("".join(f"a{i}\n" for i in range(3000)), encoding="utf-8")
    second.write_text("".join(f"b{i}\n" for i in range(1000)), encoding="utf-8")
    sample, total = sample_sentences([first, second], 400)
    assert total == 4000 and len(sample) == 400 and len(set(sample)) == 400
    assert sample == sample_sentences([first, second], 400)[0]  # seeded: the same sample again
    assert sample != sample_sentences([first, second], 400, seed=2)[0]
    # Uniform over both files together: a quarter of the lines come from the second (binomial sd ~9).
    assert 60 <= sum(line.startswith("b") for line in sample) <= 140
    assert sample_sentences([first, second], 4000) == (None, 4000)  # no more than the limit: all
    assert sample_sentences([first, second], 0) == (None, 4000)


def test_training_on_a_sample_is_reproducible_and_says_so(tmp_path, synthetic):
    lines = synthetic["train.src"].read_text(encoding="utf-8").splitlines()
    args = ["tokenize", "train", synthetic["train.src"], "--vocab-size", "100", "--max-sentences", "500"]
    first = run_cli([*args, "-o", tmp_path / "a" / "spm"])
    second = run_cli([*args, "-o", tmp_path / "b" / "spm"])
    assert first.exit_code == 0 and second.exit_code == 0, first.stderr + second.stderr
    assert f"learning from 500 of {len(lines):,} sentences (a seeded sample" in first.stderr
    assert (tmp_path / "a" / "spm.model").read_bytes() == (tmp_path / "b" / "spm.model").read_bytes()
    everything = run_cli([*args[:-2], "--max-sentences", "0", "-o", tmp_path / "c" / "spm"])
    assert everything.exit_code == 0 and "learning from" not in everything.stderr
    assert (tmp_path / "c" / "spm.model").read_bytes() != (tmp_path / "a" / "spm.model").read_bytes()
