"""output_problem: what a command may not write to, named before it writes."""

from __future__ import annotations

from schedkit.cli.files import output_problem


def test_what_cannot_take_a_new_file(tmp_path):
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "missing")
    existing = tmp_path / "there.yaml"
    existing.write_text("x")
    assert "dangling symbolic link" in output_problem(str(link), overwrite=True)
    assert "not a regular file" in output_problem("/dev/full", overwrite=True)
    assert "is a directory" in output_problem(str(tmp_path), overwrite=True)
    assert "does not exist" in output_problem(str(tmp_path / "a" / "b.yaml"), overwrite=True)
    assert output_problem(str(existing), overwrite=False).endswith("pass --force to overwrite it")
    assert output_problem(str(existing), overwrite=True) is None
    assert output_problem(str(tmp_path / "new.yaml"), overwrite=False) is None
