import pytest

from schedkit.runner.calibrate import CalibrationError
from schedkit.runner.calibration_csv import COLUMNS, read_steps


def test_a_one_request_prefill_may_give_context_tokens_instead_of_pairs(tmp_path):
    path = tmp_path / "steps.csv"
    path.write_text(
        "# measured on one H100\n"
        "mode,batch_size,new_tokens,context_tokens,step_time_ms\n"
        "\n"
        "prefill,1,512,1024,30.5\n"
        "decode,3,,3000,7.25\n"
    )
    prefill, decode = read_steps(path)
    assert prefill.attention_pairs == 512 * 512 + 512 * 513 // 2  # causal: prefix, then itself
    assert prefill.step_time == pytest.approx(0.0305)
    assert (decode.batch_size, decode.context_tokens) == (3, 3000)
    # A spreadsheet's byte-order mark is not part of the first column's name.
    path.write_bytes(b"\xef\xbb\xbf" + path.read_bytes().split(b"\n", 1)[1])
    assert read_steps(path) == [prefill, decode]


def test_bad_lines_are_reported_with_their_line_numbers(tmp_path):
    path = tmp_path / "steps.csv"
    path.write_text(
        "mode,batch_size,new_tokens,attention_pairs,context_tokens,step_time_ms\n"
        "prefill,1,100,10000,,12.0\n"
        "verify,1,100,10000,,12.0\n"
        "decode,0,,,500,7.0\n"
        "decode,2,,,,7.0\n"
        "prefill,2,100,,300,9\n"
        "decode,2,,,500,-1\n"
        "decode,2,,,500\n"
        "prefill,1,100,,50,9\n"
    )
    with pytest.raises(CalibrationError) as info:
        read_steps(path)
    assert info.value.errors == [
        f"{path}:3: mode: expected prefill or decode, got 'verify'",
        f"{path}:4: batch_size: expected a whole number in [1, 1048576], got '0'",
        f"{path}:5: context_tokens: missing (the sum of a decode step's request lengths)",
        f"{path}:6: attention_pairs: missing; give it (the sum of new x prefix + new x (new + 1) "
        "/ 2 over the requests), or context_tokens for a one-request step",
        f"{path}:7: step_time_ms: expected milliseconds in (0, 3600000], got '-1'",
        f"{path}:8: 5 fields, the header has 6",
        f"{path}:9: context_tokens: the request's length after the step (50) cannot be below "
        "its new_tokens (100)",
    ]


def test_the_header_is_checked_against_the_valid_columns(tmp_path):
    path = tmp_path / "steps.csv"
    path.write_text("mode,batch,step_time_ms,mode\nprefill,1,2\n")
    with pytest.raises(CalibrationError) as info:
        read_steps(path)
    assert info.value.errors == [
        f"{path}:1: unknown column 'batch'; valid columns: {', '.join(COLUMNS)}",
        f"{path}:1: column 'mode' given twice",
        f"{path}:1: missing column 'batch_size'; required: mode, batch_size, step_time_ms",
    ]


def test_empty_and_unreadable_files(tmp_path):
    empty = tmp_path / "empty.csv"
    empty.write_text("# nothing\n")
    with pytest.raises(CalibrationError, match="no header line"):
        read_steps(empty)
    header_only = tmp_path / "header.csv"
    header_only.write_text("mode,batch_size,step_time_ms\n")
    with pytest.raises(CalibrationError, match="no steps after the header"):
        read_steps(header_only)
    with pytest.raises(CalibrationError, match="cannot read"):
        read_steps(tmp_path / "missing.csv")
