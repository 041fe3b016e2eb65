"""A rollout plugin with a bug on a known line (tests/test_cli_errors.py checks the report)."""


def generate_rollout(args, rollout_id, data_source, evaluation=False):
    groups = data_source.get_samples(1)
    return explode(groups)


def explode(groups):
    return {}["missing key"]  # line 10
