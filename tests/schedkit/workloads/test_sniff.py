"""A trace read with the wrong --format names the format it looks like; a CSV's header picks
its format when none is given."""

import pytest

from schedkit.workloads.sniff import sniff_format
from schedkit.workloads.traces import guess_format, open_trace
from schedkit.workloads.workload import WorkloadError

AZURE = "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,374,44\n"
BURSTGPT = (
    "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
    "5,ChatGPT,472,18,490,Conversation log\n"
)
MOONCAKE = '{"timestamp": 0, "input_length": 10, "output_length": 2, "hash_ids": [1]}\n'
SHAREGPT = '[{"id": "a", "conversations": []}]'
JSONL = '{"prompt_len": 10, "max_new_tokens": 2}\n'


@pytest.mark.parametrize(
    ("text", "fmt"),
    [
        (AZURE, "azure"),
        (BURSTGPT, "burstgpt"),
        (MOONCAKE, "mooncake"),
        (SHAREGPT, "sharegpt"),
        (JSONL, "jsonl"),
    ],
)
def test_the_first_line_tells_the_format(tmp_path, text, fmt):
    path = tmp_path / "trace.txt"
    path.write_text(text)
    assert sniff_format(path)[0] == fmt


def test_a_wrong_format_names_the_right_one_first(tmp_path):
    path = tmp_path / "azure.jsonl"
    path.write_text(AZURE)
    with pytest.raises(WorkloadError) as info:
        open_trace(path, "mooncake")
    assert info.value.errors[0] == (
        f"{path}: this does not read as a mooncake trace, and looks like an azure one (its "
        "header is TIMESTAMP,ContextTokens,GeneratedTokens (an Azure CSV)): try --format azure"
    )


def test_a_csv_without_format_is_taken_by_its_header(tmp_path):
    (tmp_path / "a.csv").write_text(AZURE)
    (tmp_path / "b.csv").write_text(BURSTGPT)
    (tmp_path / "c.csv").write_text("time,tokens\n1,2\n")
    assert guess_format(tmp_path / "a.csv") == "azure"
    assert guess_format(tmp_path / "b.csv") == "burstgpt"
    with pytest.raises(ValueError, match="azure or burstgpt; say which with --format"):
        guess_format(tmp_path / "c.csv")
    assert open_trace(tmp_path / "a.csv", None).num_requests == 1
