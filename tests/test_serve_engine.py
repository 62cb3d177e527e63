"""The serving engine's dynamic batching (tfm_cli/serving/engine.py), in-process on a tiny model: requests
queued together share one translate_chunk per distinct settings, each gets its own lines in order and the
same records as when translated alone; the token budget, a full queue and a cancelled request."""

from __future__ import annotations

import pytest

from conftest import assert_one_line_error, run_cli
from tfm_cli.checkpoints.format import load_model
from tfm_cli.inference.shortlist import load_shortlist
from tfm_cli.inference.translation import TranslationStats, Translator, json_record
from tfm_cli.serving.engine import Engine, QueueFull, RequestSettings


@pytest.fixture
def counted_chunks(monkeypatch):
    """The lines of every Translator.translate_chunk call, in order."""
    calls: list[list[str]] = []
    original = Translator.translate_chunk

    def counting(self, lines, first_index, stats):
        calls.append(list(lines))
        return original(self, lines, first_index, stats)

    monkeypatch.setattr(Translator, "translate_chunk", counting)
    return calls


def test_queued_requests_share_a_chunk_per_settings_and_each_gets_what_it_would_alone(random_checkpoint, counted_chunks, one_torch_thread):
    engine = Engine(load_model(random_checkpoint), "en", lambda glossary_id: None, max_wait_s=0.0)
    requests = [
        (RequestSettings(alignment=True), ["the dog sees a cat", ""]),
        (RequestSettings(alignment=True, nbest=2), ["my cat"]),
        (RequestSettings(alignment=True), ["a big dog", "the cat", "two dogs"]),
    ]
    futures = [engine.submit(settings, lines) for settings, lines in requests]  # queued before the thread runs
    engine.start()
    answers = [future.result(60) for future in futures]
    engine.stop()
    # One round: the two requests with the same settings in one chunk, in order of arrival.
    assert counted_chunks == [["the dog sees a cat", "", "a big dog", "the cat", "two dogs"], ["my cat"]]
    for (settings, lines), answer in zip(requests, answers):
        alone = engine.translator(settings).translate_chunk(lines, 0, TranslationStats())
        assert [json_record(line, answer.output_format) for line in answer.lines] == [
            json_record(line, answer.output_format) for line in alone
        ]
        assert [line.source for line in answer.lines] == lines


def test_the_token_budget_leaves_the_rest_for_the_next_round(random_checkpoint, counted_chunks, one_torch_thread):
    engine = Engine(load_model(random_checkpoint), "en", lambda glossary_id: None, max_tokens=10, max_wait_s=0.0)
    lines = ["the dog sees a big cat and my two dogs", "a cat", "the dog"]  # 10, 2 and 2 approximate tokens
    futures = [engine.submit(RequestSettings(), [line]) for line in lines]
    engine.start()
    assert [future.result(60).lines[0].source for future in futures] == lines
    engine.stop()
    assert counted_chunks == [[lines[0]], lines[1:]]


def test_a_full_queue_refuses_at_once_and_a_cancelled_request_is_not_translated(random_checkpoint, counted_chunks):
    engine = Engine(load_model(random_checkpoint), "en", lambda glossary_id: None, queue_size=2, max_wait_s=0.0)
    gone = engine.submit(RequestSettings(), ["a client that went away"])
    kept = engine.submit(RequestSettings(), ["the dog"])
    with pytest.raises(QueueFull):
        engine.submit(RequestSettings(), ["one too many"])
    assert gone.cancel()
    engine.start()
    assert [line.source for line in kept.result(60).lines] == ["the dog"]
    engine.stop()
    assert counted_chunks == [["the dog"]]


def test_settings_the_library_refuses_fail_that_request_only(random_checkpoint):
    engine = Engine(load_model(random_checkpoint), "en", lambda glossary_id: None, max_wait_s=0.0)
    missing = engine.submit(RequestSettings(glossary_id="deleted"), ["the dog"])
    fine = engine.submit(RequestSettings(), ["the dog"])
    engine.start()
    with pytest.raises(Exception, match="glossary_id: no glossary 'deleted'"):
        missing.result(60)
    assert fine.result(60).lines[0].outputs
    engine.stop()


def test_a_burst_of_requests_is_gathered_whole_and_a_pause_starts_a_new_round(random_checkpoint, counted_chunks, one_torch_thread):
    import time

    engine = Engine(load_model(random_checkpoint), "en", lambda glossary_id: None, max_wait_s=0.5)
    engine.start()
    burst = ["the dog", "a cat", "my two dogs", "the big cat"]
    futures = []
    for line in burst:  # each within max_wait_s of the one before: the burst lasts longer than one max_wait_s
        futures.append(engine.submit(RequestSettings(), [line]))
        time.sleep(0.2)
    assert [future.result(60).lines[0].source for future in futures] == burst
    time.sleep(1.0)  # a pause longer than max_wait_s
    assert engine.submit(RequestSettings(), ["a dog"]).result(60).lines[0].source == "a dog"
    engine.stop()
    assert counted_chunks == [burst, ["a dog"]]


def test_a_lone_client_is_not_kept_waiting_for_others(random_checkpoint, counted_chunks, one_torch_thread):
    import time

    engine = Engine(load_model(random_checkpoint), "en", lambda glossary_id: None, max_wait_s=5.0)
    engine.start()
    engine.submit(RequestSettings(), ["the dog"]).result(60)  # the first round waits for others
    started = time.monotonic()
    for line in ["a cat", "my two dogs"]:  # then one request at a time, each alone in its round
        assert engine.submit(RequestSettings(), [line]).result(60).lines[0].source == line
    assert time.monotonic() - started < 5.0  # neither waited max_wait_s
    engine.stop()
    assert counted_chunks == [["the dog"], ["a cat"], ["my two dogs"]]


def test_an_engine_with_a_shortlist_answers_as_translate_shortlist_does(random_checkpoint, synthetic, tmp_path, one_torch_thread):
    shortlist_path = tmp_path / "shortlist.safetensors"
    built = run_cli(["shortlist", "-q", "-m", random_checkpoint, "--src", synthetic["train.src"], "--tgt", synthetic["train.tgt"],
                     "-o", shortlist_path, "--frequent", "3", "--per-source", "2"])
    assert built.exit_code == 0, built.stderr
    lines = ["the dog sees a cat", "my two big dogs", "a cat"]

    def translated(*options: str) -> list[str]:
        result = run_cli(["translate", "-q", "-m", random_checkpoint, *options], input="\n".join(lines) + "\n")
        assert result.exit_code == 0, result.stderr
        return result.stdout.splitlines()

    engine = Engine(load_model(random_checkpoint), "en", lambda glossary_id: None, max_wait_s=0.0,
                    shortlist=load_shortlist(shortlist_path))
    future = engine.submit(RequestSettings(), lines)
    engine.start()
    answer = future.result(60)
    engine.stop()
    expected = translated("--shortlist", str(shortlist_path))
    assert [line.outputs[0].text for line in answer.lines] == expected
    assert expected != translated()  # 3 frequent + 2 per token: a real restriction


def test_a_shortlist_for_a_pair_not_served_is_one_line(random_checkpoint, tmp_path):
    result = run_cli(["serve", "-m", f"de-en={random_checkpoint}", "--shortlist", f"fr-en={tmp_path / 'x'}"])
    assert_one_line_error(result, "no -m serves fr-en")
    result = run_cli(["serve", "-m", f"de-en={random_checkpoint}", "--shortlist", str(tmp_path / "x")])
    assert_one_line_error(result, "name the language pair")
