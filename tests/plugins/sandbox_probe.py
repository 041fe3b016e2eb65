"""A per-sample generate plugin that runs code through the configured `code_interpreter` tool
from inside the controller actor (as a model's tool call would), then runs the multi-turn loop.
Proves the manager's local sandbox and global limiter reach the rollout workers."""

from rollout_plugins.multi_turn import generate as multi_turn_generate
from slime.rollout.runtime import get_tool_set


async def generate(args, sample, sampling_params):
    tool = get_tool_set(args.tool_config_path)["code_interpreter"]
    instance_id, _ = await tool.create()
    try:
        response, _, _ = await tool.execute(instance_id, {"code": f"print({sample.index} * 7)"})
    finally:
        await tool.release(instance_id)
    sample = await multi_turn_generate(args, sample, sampling_params)
    sample.metadata["probe"] = response.text
    return sample
