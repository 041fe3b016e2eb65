"""Custom convert / reward post-process hooks for tests/test_train_data.py (slime's signatures)."""


def rewards_times_ten(args, samples):
    raw = [float(s.reward) for s in samples]
    return raw, [10 * r for r in raw]


def rewards_one_list(args, samples):
    return [float(s.reward) for s in samples]


def rewards_short(args, samples):
    return [1.0], [1.0]


def convert_minimal(args, samples):
    return {
        "tokens": [s.tokens for s in samples],
        "response_lengths": [s.response_length for s in samples],
        "rewards": [7.0 for _ in samples],
        "loss_masks": [[1] * s.response_length for s in samples],
    }


def convert_to_list(args, samples):
    return [s.tokens for s in samples]


def convert_bad_mask(args, samples):
    out = convert_minimal(args, samples)
    out["loss_masks"][1] = [1]
    return out
