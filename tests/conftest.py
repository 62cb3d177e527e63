"""Shared fixtures: tiny configs, synthetic data and a sentencepiece model for it, a CLI runner that keeps stderr apart.

Every fixture here except `multi30k_dir` builds its data from the project's own synthetic language
pair (tfm_cli/synthetic.py) or from inline text, in temp folders: the suite needs nothing outside
the repository. Only tests about Multi30k itself ask for `multi30k_dir`.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from tfm_cli.cli import app
from tfm_cli.config import ModelConfig

REPO_ROOT = Path(__file__).resolve().parents[1]
LETTERS = "abcdefgh"
MULTI30K_DIR = Path(os.environ.get("MULTI30K_DIR", REPO_ROOT.parent / "shared" / "data" / "multi30k"))

# pytest-xdist's workers (the README's `-n 2`) share the machine's cores: each gets its share of threads.
XDIST_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
torch.set_num_threads(max(1, min(2, (os.cpu_count() or 1) // XDIST_WORKERS)))


@dataclass
class CliResult:
    """What one CLI invocation produced."""

    exit_code: int
    stdout: str
    stderr: str


def run_cli(args: list[str], input: str | bytes | None = None) -> CliResult:
    """Run `tfm ARGS` in-process (Typer's CliRunner), with stdout and stderr kept separate."""
    result = CliRunner().invoke(app, [str(a) for a in args], input=input)
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return CliResult(result.exit_code, result.stdout, result.stderr)


def run_tfm_process(args: list[str], input: bytes | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    """Run `python -m tfm_cli ARGS` as a real process (for pipes, signals and import checks)."""
    return subprocess.run(
        [sys.executable, "-m", "tfm_cli", *map(str, args)], input=input, capture_output=True, timeout=timeout
    )


def read_line_within(process: subprocess.Popen, seconds: float) -> bytes:
    """One line from the process's stdout, or what came of it (b'' if nothing) when `seconds` run out."""
    import selectors
    import time

    selector = selectors.DefaultSelector()
    selector.register(process.stdout, selectors.EVENT_READ)
    deadline = time.monotonic() + seconds
    data = b""
    while not data.endswith(b"\n") and time.monotonic() < deadline:
        if selector.select(timeout=deadline - time.monotonic()):
            byte = os.read(process.stdout.fileno(), 1)
            if not byte:
                break
            data += byte
    return data


def tiny_config(**overrides) -> ModelConfig:
    """A small model config that runs in milliseconds."""
    values = dict(
        src_vocab_size=40, tgt_vocab_size=40, d_model=32, n_heads=4, d_ff=64,
        n_enc_layers=2, n_dec_layers=2, dropout=0.0, max_positions=128,
    )
    values.update(overrides)
    return ModelConfig(**values)


MULTI30K_FILES = [f"{split}.{lang}" for split in ("train", "val", "test_2016_flickr") for lang in ("de", "en")]


def running_in_ci() -> bool:
    """True where the environment variable CI is set (CI=true, as CI services set it)."""
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


@pytest.fixture(scope="session")
def multi30k_dir() -> Path:
    """The real Multi30k folder ($MULTI30K_DIR, default ../shared/data/multi30k), for tests about Multi30k only.

    Without the data those tests skip, saying where it was looked for; in CI (CI set) they fail instead,
    because CI must have the data.
    """
    missing = [name for name in MULTI30K_FILES if not (MULTI30K_DIR / name).is_file()]
    if missing:
        message = f"Multi30k data not found in {MULTI30K_DIR} (no {missing[0]}); set MULTI30K_DIR"
        if running_in_ci():
            pytest.fail(f"{message} (CI is set: CI must have the data)", pytrace=False)
        pytest.skip(message)
    return MULTI30K_DIR


# The synthetic corpus every data-needing fixture uses: distinct sentences, no sentence in two splits.
SYNTHETIC_SIZES = {"train_size": 2000, "valid_size": 100, "test_size": 200, "seed": 0}
# The quickstart's size. The synthetic lexicon (~230 word forms) supports at most ~230 unigram pieces,
# and at 200 most words are 2-4 pieces: real subword splits for the word-level tests.
SMALL_SPM_PIECES = 200


def write_synthetic_corpus(folder: Path) -> dict[str, Path]:
    """The synthetic corpus (tfm_cli/synthetic.py) in `folder`: {"train.src": Path, ..., "test.align": Path}.

    Source: English-like ("the two big dogs sees my cat"); target: verb-final "Verbish".
    """
    from tfm_cli.synthetic import write_corpus

    return write_corpus(folder, **SYNTHETIC_SIZES)


def train_joint_spm(corpus: dict[str, Path], prefix: Path) -> Path:
    """A SMALL_SPM_PIECES-piece joint unigram model on the corpus's train.src + train.tgt (~0.1 s)."""
    from tfm_cli.tokenization.tokenizer import TokenizerTrainConfig, train_sentencepiece

    return train_sentencepiece(
        [corpus["train.src"], corpus["train.tgt"]], prefix, TokenizerTrainConfig(vocab_size=SMALL_SPM_PIECES)
    )


@pytest.fixture(scope="session")
def synthetic(tmp_path_factory) -> dict[str, Path]:
    """The synthetic corpus: train (2000) / valid (100) / test (200) .src/.tgt files and test.align."""
    return write_synthetic_corpus(tmp_path_factory.mktemp("synthetic"))


@pytest.fixture(scope="session")
def small_spm(tmp_path_factory, synthetic) -> Path:
    """A 200-piece joint sentencepiece model (the default unigram) trained on the synthetic train split."""
    return train_joint_spm(synthetic, tmp_path_factory.mktemp("spm") / "joint")


@pytest.fixture(scope="session")
def random_checkpoint(tmp_path_factory, small_spm) -> Path:
    """An untrained tiny model (seeded random weights) with the small_spm tokenizer, as a checkpoint file."""
    return save_random_checkpoint(tmp_path_factory.mktemp("random_checkpoint") / "model.safetensors", small_spm, seed=0)


def save_random_checkpoint(path: Path, spm_model: Path, seed: int) -> Path:
    """Write an untrained tiny model (weights seeded with `seed`) with the `spm_model` tokenizer to `path`."""
    from tfm_cli.checkpoints.format import save_model
    from tfm_cli.model import Transformer
    from tfm_cli.tokenization.tokenizer import Tokenizer

    tokenizer = Tokenizer.from_file(spm_model)
    torch.manual_seed(seed)
    model = Transformer(tiny_config(src_vocab_size=tokenizer.vocab_size, tgt_vocab_size=tokenizer.vocab_size)).eval()
    save_model(path, model, tokenizer, tokenizer)
    return path


@pytest.fixture
def one_torch_thread():
    """Run a test with one torch thread, then restore the setting.

    On a machine whose cores are busy with other work, 2 intra-op threads made tiny-model steps
    ~70x slower than 1 thread (4.5 s vs 0.065 s per training step, measured at load average 9.5).
    """
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


def write_pairs(folder: Path, name: str, count: int, seed: int) -> tuple[Path, Path]:
    """`count` pairs of random letter sequences and their reversals, as NAME.src / NAME.tgt."""
    generator = torch.Generator().manual_seed(seed)
    lines = []
    for _ in range(count):
        length = int(torch.randint(3, 8, (1,), generator=generator))
        lines.append(" ".join(LETTERS[int(i)] for i in torch.randint(0, 8, (length,), generator=generator)))
    src, tgt = folder / f"{name}.src", folder / f"{name}.tgt"
    src.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    tgt.write_text("".join(" ".join(reversed(line.split())) + "\n" for line in lines), encoding="utf-8")
    return src, tgt


@pytest.fixture(scope="session")
def letters(tmp_path_factory) -> dict[str, Path]:
    """Small letter data (200 train, 20 valid pairs) and a 20-piece sentencepiece model for it."""
    folder = tmp_path_factory.mktemp("letters")
    train_src, train_tgt = write_pairs(folder, "train", 200, seed=1)
    valid_src, valid_tgt = write_pairs(folder, "valid", 20, seed=2)
    from tfm_cli.tokenization.tokenizer import TokenizerTrainConfig, train_sentencepiece

    spm = train_sentencepiece([train_src, train_tgt], folder / "spm", TokenizerTrainConfig(vocab_size=20))
    return {"train_src": train_src, "train_tgt": train_tgt, "valid_src": valid_src, "valid_tgt": valid_tgt, "spm": spm}


def letter_settings(letters: dict[str, Path], **values: object) -> list[str]:
    """`tfm train --set` options: the letter data and its tokenizer, then `values` ({"train.seed": 2, ...})."""
    settings = {
        "data.train_src": letters["train_src"], "data.train_tgt": letters["train_tgt"],
        "data.valid_src": letters["valid_src"], "data.valid_tgt": letters["valid_tgt"],
        "tokenizer.src_model": letters["spm"], **values,
    }
    return [item for key, value in settings.items() for item in ("--set", f"{key}={value}")]


def assert_one_line_error(result: CliResult, message: str) -> None:
    """The command failed, without a traceback, and stderr is one line matching the regular expression `message`."""
    assert result.exit_code != 0
    assert "Traceback" not in result.stderr
    assert len([line for line in result.stderr.splitlines() if line.strip()]) == 1, result.stderr
    assert re.search(message, result.stderr), result.stderr


def trained_tiny(run_dir: Path, settings: list[str]) -> dict[str, torch.Tensor]:
    """Train recipes/tiny.toml into `run_dir` in-process on one thread with `settings` (`--set` options),
    asserting it succeeded. Returns the weights of its checkpoint_last (tokenizer tensors left out)."""
    result = run_cli(["train", REPO_ROOT / "recipes" / "tiny.toml", "--run", run_dir, "--threads", "1", *settings])
    assert result.exit_code == 0, result.stderr
    return checkpoint_weights(run_dir / "checkpoint_last.safetensors")


def small_training_settings(letters: dict[str, Path], **values: object) -> list[str]:
    """letter_settings for short deterministic runs: no dropout, 200-token batches (16 updates cross into a
    second epoch), no validation within them; `values` added or overriding."""
    return letter_settings(letters, **{"model.dropout": 0.0, "train.max_tokens": 200, "train.valid_every": 1000,
                                       **values})


def assert_resume_is_exact_and_setting_used(tmp_path: Path, settings: list[str], off: dict[str, object]) -> None:
    """trained_tiny with `settings` for 16 updates straight, and for 9 then `tfm train --resume` to 16: asserts
    both end with the same weights, and that the same 16 updates with the `off` values end elsewhere."""
    expected = trained_tiny(tmp_path / "straight", [*settings, "--set", "train.max_steps=16"])
    trained_tiny(tmp_path / "resumed", [*settings, "--set", "train.max_steps=9"])
    result = run_cli(["train", "--run", tmp_path / "resumed", "--resume", "--threads", "1", "--set", "train.max_steps=16"])
    assert result.exit_code == 0, result.stderr
    got = checkpoint_weights(tmp_path / "resumed" / "checkpoint_last.safetensors")
    for name in expected:
        assert torch.equal(got[name], expected[name]), name
    off_settings = [item for key, value in off.items() for item in ("--set", f"{key}={value}")]
    without = trained_tiny(tmp_path / "off", [*settings, "--set", "train.max_steps=16", *off_settings])
    assert any(not torch.equal(without[name], expected[name]) for name in expected)


def checkpoint_weights(path: Path) -> dict[str, torch.Tensor]:
    """The tensors of checkpoint `path` but the tokenizer's."""
    from safetensors.torch import load_file

    return {k: v for k, v in load_file(str(path)).items() if not k.startswith("tokenizer.")}


def rewritten_checkpoint(source: Path, target: Path, metadata=None, tensors=None) -> Path:
    """A copy of checkpoint `source` at `target`, its metadata dict and/or tensor dict edited in place
    by the callbacks `metadata(meta)` and `tensors(weights)`; returns `target`."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    with safe_open(str(source), framework="pt") as f:
        meta = dict(f.metadata())
        weights = {name: f.get_tensor(name) for name in f.keys()}
    if metadata:
        metadata(meta)
    if tensors:
        tensors(weights)
    save_file(weights, str(target), metadata=meta)
    return target


# Test tiers (tests/README.md, "Test tiers"). Every test carries exactly one of these markers, so that
# `python -m pytest -m unit` is the inner loop (seconds) while plain `python -m pytest` (CI, the README)
# still runs everything. unit: pure functions and tiny in-process models, no files beyond a few small
# ones, no process, no training of more than a few steps, each test well under a second. integration:
# in-process CLI runs (run_cli), small trainings, checkpoints on disk. system: real processes
# (subprocess, run_tfm_process, Popen, torchrun), signals, pipes, mounts, the Multi30k data, the
# transformers / ctranslate2 references, a GPU.
TIERS = ("unit", "integration", "system")

# The one place that assigns tiers: each test module's tier, by module name. A new test module gets a line here.
MODULE_TIERS: dict[str, str] = {
    "test_align": "integration",
    "test_aligner": "integration",
    "test_alignment": "unit",
    "test_alignment_settings": "integration",
    "test_alignment_aer": "unit",
    "test_allocator": "system",
    "test_answers_each_line": "system",
    "test_attention": "unit",
    "test_average": "integration",
    "test_bad_input": "integration",
    "test_cache_command": "system",
    "test_checkpoint": "integration",
    "test_checkpoint_metadata": "integration",
    "test_constraints": "unit",
    "test_constrained_translate": "integration",
    "test_glossary": "unit",
    "test_cli": "integration",
    "test_corpus_cache": "integration",
    "test_corpus_filters": "unit",
    "test_cuda": "system",
    "test_data": "unit",
    "test_decode_section": "integration",
    "test_decode_settings": "integration",
    "test_decoder_state": "unit",
    "test_dependencies": "unit",
    "test_docs": "unit",
    "test_disk_full": "system",
    "test_dropout": "unit",
    "test_embedding_rows": "integration",
    "test_ensemble": "integration",
    "test_shortlist": "integration",
    "test_moving_average": "integration",
    "test_export": "system",
    "test_guided_alignment": "integration",
    "test_help": "integration",
    "test_hostile_align": "system",
    "test_hostile_markup": "system",
    "test_hostile_terminology": "system",
    "test_import_marian": "system",
    "test_inspect_attention": "integration",
    "test_inspect_synthetic": "integration",
    "test_kernels": "unit",
    "test_length_penalty": "unit",
    "test_lr_schedule": "integration",
    "test_markup": "unit",
    "test_markup_translate": "integration",
    "test_model": "unit",
    "test_module_layout": "unit",
    "test_multi30k_recipe": "system",
    "test_option_ranges": "integration",
    "test_precision": "integration",
    "test_score_metrics": "integration",
    "test_score_model": "integration",
    "test_search": "integration",
    "test_search_workers": "system",
    "test_search_scripted": "unit",
    "test_serve": "system",
    "test_serve_engine": "integration",
    "test_resegment": "unit",
    "test_sentence_splitting": "unit",
    "test_sentence_concatenation": "unit",
    "test_paragraphs": "integration",
    "test_step_masks": "unit",
    "test_step_threads": "integration",
    "test_streams": "system",
    "test_synthetic": "unit",
    "test_threads_option": "integration",
    "test_subword_sampling": "integration",
    "test_symmetrization": "unit",
    "test_tiers": "unit",
    "test_tokenize_cli": "integration",
    "test_train_cli": "integration",
    "test_train_config": "unit",
    "test_train_corpora": "integration",
    "test_train_distributed": "system",
    "test_train_init": "integration",
    "test_train_learns": "integration",
    "test_train_units": "unit",
    "test_train_validation": "integration",
    "test_translate": "integration",
    "test_translate_degenerate": "integration",
    "test_translate_process": "system",
    "test_translate_resume": "system",
    "test_usage_errors": "integration",
    "test_word_rule": "integration",
    "test_words": "unit",
    "test_wrong_shapes": "integration",
}

# Tests whose tier differs from their module's, by "module::test_function" (every parametrization of it).
TEST_TIERS: dict[str, str] = {
    # integration: `tfm train` runs on the letter data; the rest are pure functions
    "test_sentence_concatenation::test_training_with_joined_pairs_resumes_exactly_and_uses_them": "integration",
    "test_sentence_concatenation::test_bad_concatenation_settings_are_one_line": "integration",
    "test_sentence_concatenation::test_the_training_log_says_what_share_is_joined": "integration",
    # unit: textio.read_chunks on a generator, no process
    "test_answers_each_line::test_read_chunks_hands_out_the_lines_before_a_bad_one_then_raises": "unit",
    "test_answers_each_line::test_read_chunks_reads_at_most_two_chunks_ahead": "unit",
    # system: real processes, signals, pipes
    "test_bad_input::test_translate_ten_thousand_lines_through_a_pipe": "system",
    "test_bad_input::test_ctrl_c_during_translate_leaves_a_complete_prefix": "system",
    "test_bad_input::test_a_signal_while_writing_an_output_file_exits_128_plus_its_number_and_leaves_nothing": "system",
    "test_bad_input::test_sigkill_inside_a_checkpoint_write_keeps_the_previous_one": "system",
    "test_cache_command::test_a_missing_cache_folder_is_one_line": "integration",
    "test_cli::test_help_lists_every_subcommand_without_importing_torch": "system",
    "test_cli::test_python_dash_m_entry_point": "system",
    "test_cli::test_a_finished_process_keeps_its_buffered_output_and_its_exit_status": "system",
    "test_cli::test_a_profiler_still_gets_its_results_at_exit": "system",
    "test_corpus_cache::test_two_processes_preparing_the_same_entry_at_once_prepare_it_once": "system",
    "test_corpus_cache::test_only_temp_folders_that_tfm_made_and_whose_preparer_is_dead_are_removed": "system",
    "test_corpus_cache::test_a_training_run_starting_on_a_shared_cache_keeps_folders_it_did_not_make": "system",
    # unit: the settings rule itself, without a checkpoint
    "test_decode_settings::test_a_flag_beats_the_model_which_beats_the_built_in_default": "unit",
    "test_decode_settings::test_settings_that_do_not_fit_together_are_refused": "unit",
    # unit: two tokenizers compared, no checkpoint; system: forked worker processes
    "test_ensemble::test_a_different_vocabulary_is_named_by_its_first_different_piece": "unit",
    "test_ensemble::test_an_ensemble_in_worker_processes_translates_as_in_one": "system",
    "test_help::test_every_command_was_found": "unit",
    "test_help::test_every_extra_users_are_told_to_install_exists": "unit",
    "test_lr_schedule::test_linear_and_cosine_warm_up_then_reach_zero_at_the_end_of_the_budget": "unit",
    "test_lr_schedule::test_schedule_settings_that_cannot_work_are_refused": "unit",
    "test_module_layout::test_config_imports_no_other_tfm_module_but_errors_and_special_ids": "system",
    # unit: CPU capability flags, int8 and bf16 layers; the rest translates with the trained model
    "test_precision::test_cpu_support_reads_the_capability_flags": "unit",
    "test_precision::test_auto_picks_bf16_only_where_the_cpu_has_it": "unit",
    "test_precision::test_training_auto_precision_is_fp32_on_any_cpu_and_bf16_is_there_when_asked": "unit",
    "test_precision::test_explicit_bf16_without_native_support_runs_with_a_warning": "unit",
    "test_precision::test_int8_runs_with_or_without_vnni": "unit",
    "test_precision::test_int8_on_cuda_and_unknown_values_are_refused": "unit",
    "test_precision::test_int8_matrix_product_is_exact_at_the_extremes": "unit",
    "test_precision::test_int8_without_vnni_is_exact_where_16_bit_pair_sums_would_overflow": "unit",
    "test_precision::test_int8_linear_computes_its_quantised_product": "unit",
    "test_precision::test_quantize_rows_keeps_zero_rows_finite": "unit",
    "test_precision::test_reduced_linear_layers_are_close_and_batch_invariant": "unit",
    "test_score_metrics::test_a_terminal_gets_a_table": "system",
    "test_score_metrics::test_metric_scoring_does_not_import_torch": "system",
    "test_score_model::test_interactive_target_lines_are_scored_before_the_input_ends": "system",
    # unit: tiny random models and hand-made inputs; the rest searches the 150-step trained model
    "test_search::test_length_penalty_is_the_gnmt_formula": "unit",
    "test_search::test_beam_search_with_a_wide_beam_is_exact_search_over_a_tiny_vocabulary": "unit",
    "test_search::test_length_limit_closes_every_beam_with_eos": "unit",
    "test_search::test_top_k_and_top_p_filtering_by_hand": "unit",
    "test_search::test_decode_config_names_bad_values": "unit",
    "test_search::test_no_search_outputs_padding_or_bos_and_no_unk_bans_unk": "unit",
    "test_step_threads::test_only_a_passive_wait_policy_makes_threads_sleep": "unit",
    "test_step_threads::test_passive_steps_pick_their_mode_by_work": "unit",
    "test_step_threads::test_on_threads_gives_the_count_back": "unit",
    "test_step_threads::test_one_thread_gives_the_count_back": "unit",
    # integration: output files, devices and symbolic links, in-process; the rest are pipes, FIFOs and processes
    "test_streams::test_a_symlink_output_replaces_the_file_it_names_and_stays_a_link": "integration",
    "test_streams::test_a_device_output_is_written_in_place": "integration",
    "test_streams::test_a_symbolic_link_loop_is_named": "integration",
    "test_streams::test_a_link_to_dev_null_is_written_in_place": "integration",
    "test_streams::test_a_chain_of_links_to_a_regular_file_replaces_the_file_and_keeps_the_links": "integration",
    "test_tokenize_cli::test_special_ids_are_fixed": "unit",
    "test_tokenize_cli::test_encode_into_closed_pipe_is_quiet": "system",
    "test_tokenize_cli::test_ten_thousand_lines_through_a_pipe": "system",
    "test_train_cli::test_a_signal_saves_a_checkpoint_then_exits_128_plus_its_number": "system",
    "test_train_cli::test_a_second_sigterm_aborts_at_once_and_still_exits_143": "system",
    "test_train_cli::test_a_sigterm_while_the_data_is_prepared_exits_143": "system",
    "test_train_cli::test_sigkill_loses_only_the_steps_since_the_last_save": "system",
    "test_train_config::test_every_shipped_recipe_loads_and_points_at_existing_data": "system",
    "test_train_corpora::test_a_sweep_starting_together_on_a_shared_cache_prepares_everything_once": "system",
    "test_train_init::test_an_imported_marian_model_trains_on_its_own_special_ids": "system",
    # integration: these train a tiny model for tens of steps (seconds); the rest are formulas by hand
    "test_train_units::test_update_freq_accumulation_equals_one_big_batch": "integration",
    "test_train_units::test_fp16_loss_scaler_skips_and_reports_an_overflowing_update": "integration",
    "test_train_units::test_an_inf_nan_loss_skips_the_update_in_fp32": "integration",
    "test_train_units::test_the_padding_row_stays_zero_through_training": "integration",
    "test_train_validation::test_logged_validation_equals_a_fresh_evaluation_of_the_saved_checkpoint": "system",
    "test_translate::test_read_chunks_answers_a_pause_before_the_chunk_is_full": "unit",
    "test_translate::test_a_terminal_on_stdin_is_told_where_input_is_read": "system",
    "test_usage_errors::test_a_real_process_reports_usage_errors_the_same_way": "system",
    "test_wrong_shapes::test_a_recipe_read_from_a_pipe_works": "system",
}

TIER_PROBLEM = pytest.StashKey[str]()


def tier_of(item: pytest.Item) -> tuple[str | None, str | None]:
    """(the tier `item` belongs to, None) or (None, what is wrong): a tier marker written on the test or
    its module wins, then TEST_TIERS, then MODULE_TIERS."""
    module = item.path.stem
    key = f"{module}::{getattr(item, 'originalname', item.name)}"
    marked = sorted({mark.name for mark in item.iter_markers() if mark.name in TIERS})
    if len(marked) > 1:
        return None, f"{key} has more than one tier marker ({', '.join(marked)}): keep exactly one"
    if marked and key in TEST_TIERS:
        return None, (f"{key} has two tiers: @pytest.mark.{marked[0]} in its module and {TEST_TIERS[key]!r} "
                      f"in TEST_TIERS (tests/conftest.py): keep one")
    tier = marked[0] if marked else TEST_TIERS.get(key, MODULE_TIERS.get(module))
    if tier is None:
        return None, (f"{item.path.name} has no test tier: add \"{module}\": \"unit\" | \"integration\" | \"system\" "
                      f"to MODULE_TIERS in tests/conftest.py (tiers: tests/README.md, 'Test tiers')")
    return tier, None


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects by these markers
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark every test with its tier; a test without exactly one tier fails (pytest_runtest_setup)."""
    for item in items:
        tier, problem = tier_of(item)
        if problem:
            item.stash[TIER_PROBLEM] = problem
        elif not any(mark.name == tier for mark in item.iter_markers()):
            item.add_marker(getattr(pytest.mark, tier))


def pytest_runtest_setup(item: pytest.Item) -> None:
    """Fail a test that has no tier or more than one, before it runs, saying where to give it one."""
    problem = item.stash.get(TIER_PROBLEM, None)
    if problem:
        pytest.fail(problem, pytrace=False)
