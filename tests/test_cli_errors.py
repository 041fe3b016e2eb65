"""A plugin's exception is reported with the plugin's own file and line, also across Ray."""

from __future__ import annotations

import json

from slime.cli.errors import describe, user_frames
from slime.cli.rollout import main


def test_local_exception_shows_only_user_frames():
    from tests.plugins import broken_rollout

    class Source:
        def get_samples(self, n):
            return [[]]

    try:
        broken_rollout.generate_rollout(None, 0, Source())
    except KeyError as e:
        frames = user_frames(e)
        text = describe(e, "slime-rollout")
    assert len(frames) == 3 and 'broken_rollout.py", line 10, in explode' in frames[-1]
    assert text.startswith("slime-rollout: error: KeyError: 'missing key'")
    assert 'return {}["missing key"]' in text and "slime/cli" not in text


def test_plugin_error_through_the_manager_names_file_and_line(tiny_model_dir, tmp_path, capsys, ray_cluster):
    data = tmp_path / "p.jsonl"
    data.write_text(json.dumps({"input": "hi", "label": "1"}) + "\n")
    rc = main(
        [
            "--rollout-backend",
            "hf",
            "--hf-checkpoint",
            str(tiny_model_dir),
            "--prompt-data",
            str(data),
            "--label-key",
            "label",
            "--rm-type",
            "exact",
            "--rollout-batch-size",
            "1",
            "--n-samples-per-prompt",
            "1",
            "--rollout-function-path",
            "tests.plugins.broken_rollout.generate_rollout",
            "--rollout-num-cpus-per-engine",
            "0.5",
            "--engine-threads",
            "1",
            "--log-dir",
            str(tmp_path),
        ]
    )
    err = capsys.readouterr().err
    assert rc == 1
    assert "slime-rollout: error: KeyError: 'missing key'" in err
    assert 'tests/plugins/broken_rollout.py", line 10, in explode' in err
    assert 'tests/plugins/broken_rollout.py", line 6, in generate_rollout' in err
