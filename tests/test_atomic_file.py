"""slime.utils.atomic_file.write_atomic: a file replaced whole, or not at all, and no temporary left behind."""

from __future__ import annotations

import pytest

from slime.utils.atomic_file import write_atomic


@pytest.mark.parametrize("durable", [False, True])
def test_a_write_replaces_the_file_and_a_failed_one_leaves_the_old_file_and_no_temporary(tmp_path, durable):
    path = tmp_path / "state.json"
    write_atomic(path, "old", durable=durable)
    write_atomic(path, "new", durable=durable)
    assert path.read_text() == "new"
    with pytest.raises(TypeError):
        write_atomic(path, 123, durable=durable)  # type: ignore[arg-type] - the write itself fails
    assert path.read_text() == "new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state.json"]
