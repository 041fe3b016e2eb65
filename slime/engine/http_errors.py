"""The two error shapes of SGLang's HTTP API: `{"error": {message, code}}` for generation and control
requests, `{"success": false, "message"}` for weight sync and memory occupation."""

from __future__ import annotations

from starlette.responses import JSONResponse


def error_response(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "code": status}}, status_code=status)


def released_response() -> JSONResponse:
    """503 for a generation request while the weights are released."""
    return error_response(
        503, "model weights are released (release_memory_occupation); call /resume_memory_occupation before generating"
    )


def refusal(status: int, message: str) -> JSONResponse:
    return JSONResponse({"success": False, "message": message}, status_code=status)


def weights_released_refusal() -> JSONResponse:
    """503 for a weight change or check while the weights are released."""
    return refusal(503, "model weights are released; call /resume_memory_occupation first")
