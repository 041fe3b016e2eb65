"""A ReAct coding agent on the OpenAI SDK, run by the harness inside a sandbox session.

It reads its task from SLIME_AGENT_PROMPT and talks to OPENAI_BASE_URL with OPENAI_API_KEY (the
gateway and the session key the harness sets). Tools: read_file, write_file, run_tests -- all
inside the working directory. At most --max-turns model calls; it stops when the model answers
without a tool call. The model's answers do not matter to the plumbing: a malformed call is
answered with an error message and the loop goes on.
"""

import argparse
import json
import os
import subprocess
import sys

import openai

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "read_file",
            "description": "Read a file of the working directory.",
            "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]},
        },
    },
    {
        "type": "function",
        "function": {
            "name": "write_file",
            "description": "Replace a file of the working directory with new content.",
            "parameters": {
                "type": "object",
                "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
                "required": ["path", "content"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "run_tests",
            "description": "Run the unit tests of the working directory.",
            "parameters": {"type": "object", "properties": {}},
        },
    },
]
SYSTEM = (
    "You fix bugs in small Python files. Use the tools to read the code, write the fixed file "
    "and run the tests. Reply without a tool call when the tests pass."
)
MAX_OUTPUT_CHARS = 2000


def inside(path: str) -> str:
    """`path` relative to the working directory; anything leaving it is refused."""
    full = os.path.realpath(path)
    if not full.startswith(os.getcwd() + os.sep):
        raise ValueError(f"{path!r} is outside the working directory")
    return full


def read_file(path: str) -> str:
    with open(inside(path)) as f:
        return f.read()[:MAX_OUTPUT_CHARS]


def write_file(path: str, content: str) -> str:
    with open(inside(path), "w") as f:
        f.write(content)
    return f"wrote {len(content)} characters to {path}"


def run_tests() -> str:
    done = subprocess.run([sys.executable, "-m", "unittest", "-q"], capture_output=True, text=True, timeout=60)
    return f"exit code {done.returncode}\n{(done.stdout + done.stderr)[-MAX_OUTPUT_CHARS:]}"


FUNCTIONS = {"read_file": read_file, "write_file": write_file, "run_tests": run_tests}


def call_tool(name: str, arguments: str) -> str:
    try:
        return str(FUNCTIONS[name](**json.loads(arguments or "{}")))
    except Exception as e:  # noqa: BLE001 - the model sees what went wrong and may try again
        return f"error: {type(e).__name__}: {e}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--max-turns", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=128)
    args = ap.parse_args()
    client = openai.OpenAI(max_retries=0, timeout=600)  # OPENAI_BASE_URL / OPENAI_API_KEY from the harness
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": os.environ["SLIME_AGENT_PROMPT"]}]
    for turn in range(args.max_turns):
        reply = client.chat.completions.create(
            model="slime-actor", messages=messages, tools=TOOLS, max_tokens=args.max_tokens
        ).choices[0]
        message = reply.message
        messages.append(message.model_dump(exclude_none=True))
        print(f"turn {turn}: finish={reply.finish_reason} tool_calls={len(message.tool_calls or [])}", flush=True)
        if not message.tool_calls:
            break
        for call in message.tool_calls:
            messages.append(
                {
                    "role": "tool",
                    "tool_call_id": call.id,
                    "content": call_tool(call.function.name, call.function.arguments),
                }
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
