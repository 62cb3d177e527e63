"""Embeddings that hold only the rows looked up, read from the checkpoint on first use
(model/embedding_rows.py): the same lookups and translations as the full table, little memory, and a
clear error when the file changes under a running model."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from conftest import rewritten_checkpoint
from tfm_cli.checkpoints.format import load_model, safetensors_offset
from tfm_cli.config import DecodeConfig
from tfm_cli.errors import TfmError
from tfm_cli.inference.decoding import source_batch
from tfm_cli.inference.search import beam_search
from tfm_cli.model.embedding_rows import (
    Embedding,
    RowsFromFile,
    consecutive_runs,
    row_checksums,
)


def saved_table(path: Path, rows: int, width: int, seed: int = 0) -> torch.Tensor:
    """A random (rows, width) float32 table saved in `path` as the safetensors tensor "table"."""
    table = torch.randn(rows, width, generator=torch.Generator().manual_seed(seed))
    save_file({"first": torch.arange(3, dtype=torch.int64), "table": table}, str(path))
    return table


def table_offset(path: Path, table: torch.Tensor) -> int:
    """Where saved_table's tensor starts in `path`."""
    offset = safetensors_offset(path, "table", tuple(table.shape))
    assert offset is not None
    return offset


def resident_anonymous_kib() -> int:
    """This process's resident anonymous memory (RssAnon in /proc/self/status), KiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("RssAnon:"):
            return int(line.split()[1])
    raise AssertionError("no RssAnon line")


def test_consecutive_runs():
    assert consecutive_runs([1, 2, 3, 7, 9, 10]) == [(1, 3), (7, 7), (9, 10)]
    assert consecutive_runs([5]) == [(5, 5)]
    assert consecutive_runs([]) == []


def test_rows_are_read_on_first_use_and_equal_the_file(tmp_path):
    path = tmp_path / "table.safetensors"
    table = saved_table(path, 1000, 16)
    rows = RowsFromFile(path, table_offset(path, table), (1000, 16), row_checksums(table))
    assert not rows.table.any()  # nothing read yet
    ids = torch.tensor([[3, 4, 5, 999], [3, 0, 500, 4]])
    rows.ensure(ids)
    wanted = sorted({3, 4, 5, 999, 0, 500})
    assert torch.equal(rows.table[wanted], table[wanted])
    assert rows.loaded.nonzero().view(-1).tolist() == wanted
    others = [i for i in range(1000) if i not in wanted]
    assert not rows.table[others].any()


def test_lookups_give_the_bits_of_the_full_embedding(tmp_path):
    path = tmp_path / "table.safetensors"
    table = saved_table(path, 300, 8, seed=1)
    full = Embedding(300, 8, padding_idx=0, _weight=table.clone())
    on_demand = Embedding(300, 8, padding_idx=0, _weight=table.clone())
    on_demand.use_rows_from_file(path, table_offset(path, table))
    tokens = torch.randint(0, 300, (5, 7), generator=torch.Generator().manual_seed(2))
    assert torch.equal(on_demand(tokens), full(tokens))
    assert int(on_demand.rows.loaded.sum()) == tokens.unique().numel()


def test_a_table_takes_memory_only_for_the_rows_read(tmp_path):
    if not sys.platform.startswith("linux"):
        pytest.skip("reads RssAnon from /proc (Linux)")
    path = tmp_path / "table.safetensors"
    table = saved_table(path, 16384, 1024)  # 64 MiB
    checksums, offset = row_checksums(table), table_offset(path, table)
    del table
    before = resident_anonymous_kib()
    rows = RowsFromFile(path, offset, (16384, 1024), checksums)
    rows.ensure(torch.arange(0, 16384, 1024))  # 16 rows of 4 KiB
    grown_mib = (resident_anonymous_kib() - before) / 1024
    assert grown_mib < 8, f"a table of 64 MiB with 16 rows read took {grown_mib:.1f} MiB"


def test_a_checkpoint_replaced_by_a_new_file_still_gives_the_loaded_rows(tmp_path):
    # safetensors, tfm train and tfm average write a new file and rename it over the old one: the open
    # file is still the old one.
    path = tmp_path / "table.safetensors"
    table = saved_table(path, 100, 8)
    rows = RowsFromFile(path, table_offset(path, table), (100, 8), row_checksums(table))
    rows.ensure(torch.tensor([1, 2]))
    saved_table(path, 100, 8, seed=5)
    rows.ensure(torch.tensor([7]))
    assert torch.equal(rows.table[[1, 2, 7]], table[[1, 2, 7]])


def test_a_checkpoint_changed_in_place_is_refused(tmp_path):
    path = tmp_path / "table.safetensors"
    table = saved_table(path, 100, 8)
    offset = table_offset(path, table)
    rows = RowsFromFile(path, offset, (100, 8), row_checksums(table))
    rows.ensure(torch.tensor([1, 2]))
    with open(path, "r+b") as file:  # the same file written over, as `cp new old` does
        file.seek(offset)
        file.write((table + 1).numpy().tobytes())
    with pytest.raises(TfmError, match="changed on disk"):
        rows.ensure(torch.tensor([7]))
    assert torch.equal(rows.table[[1, 2]], table[[1, 2]])  # what was read before stays
    assert not rows.loaded[7]


def test_a_checkpoint_that_cannot_be_read_any_more_is_one_error(tmp_path):
    path = tmp_path / "table.safetensors"
    table = saved_table(path, 100, 8)
    rows = RowsFromFile(path, table_offset(path, table), (100, 8), row_checksums(table))
    rows.file.close()  # as a file system that went away leaves it
    with pytest.raises(TfmError, match="cannot read the model's embedding rows"):
        rows.ensure(torch.tensor([3]))


@pytest.mark.parametrize("dtype", ["float32", "int8"])
def test_a_model_with_rows_on_demand_translates_as_the_full_one(random_checkpoint, dtype):
    full = load_model(random_checkpoint, dtype=dtype)
    on_demand = load_model(random_checkpoint, dtype=dtype, embedding_rows_on_demand=True)
    model = on_demand.model
    assert model.src_embed.rows is not None and not model.src_embed.rows.loaded.any()
    if dtype == "float32":  # the tied output layer keeps only its packed copy
        assert model.output_proj.plain_weight_freed
    generator = torch.Generator().manual_seed(3)
    sources = [torch.randint(4, full.config.src_vocab_size, (n,), generator=generator).tolist() for n in (3, 9, 5, 12)]
    for beam in (1, 4):
        config = DecodeConfig(beam_size=beam, max_len_a=0.0, max_len_b=12)
        with torch.inference_mode():
            expected = beam_search(full.model, source_batch(sources, full.config), config)
            got = beam_search(model, source_batch(sources, on_demand.config), config)
        assert [[h.tokens for h in n] for n in got] == [[h.tokens for h in n] for n in expected]
        assert [[h.score for h in n] for n in got] == [[h.score for h in n] for n in expected]
    loaded = model.src_embed.rows.loaded
    assert 0 < int(loaded.sum()) < loaded.numel()


def test_rows_on_demand_need_float32_rows_in_the_file(random_checkpoint, tmp_path):
    stored_bf16 = rewritten_checkpoint(
        random_checkpoint, tmp_path / "bf16.safetensors",
        tensors=lambda weights: weights.update({"src_embed.weight": weights["src_embed.weight"].to(torch.bfloat16)}),
    )
    shape = tuple(load_model(random_checkpoint).model.src_embed.weight.shape)
    assert safetensors_offset(random_checkpoint, "src_embed.weight", shape) is not None
    assert safetensors_offset(stored_bf16, "src_embed.weight", shape) is None
    assert safetensors_offset(random_checkpoint, "src_embed.weight", (shape[0] + 1, shape[1])) is None
    loaded = load_model(stored_bf16, embedding_rows_on_demand=True)
    assert loaded.model.src_embed.rows is None  # kept whole, as loaded
