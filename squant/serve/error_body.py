"""The JSON body of every error the server writes, in the shape its client reads.

TEI's routes answer {"error": message, "error_type": kind}. OpenAI's routes (under /v1/)
answer OpenAI's {"error": {"message", "type", "param", "code"}}: the openai SDK reads that
object into its exception (`e.message` from the text, `e.code` and `e.type` from the fields),
where a bare string left them empty. `code` is squant's kind either way."""

from __future__ import annotations

from typing import Any

OPENAI_PREFIX = "/v1/"


def error_body(path: str, status: int, message: str, kind: str) -> dict[str, Any]:
    if not path.startswith(OPENAI_PREFIX):
        return {"error": message, "error_type": kind}
    return {
        "error": {
            "message": message,
            "type": _openai_type(status),
            "param": None,
            "code": kind,
        }
    }


def _openai_type(status: int) -> str:
    # OpenAI's own classes of error; clients branch on the status, these are for people
    if status == 429:
        return "rate_limit_error"
    return "server_error" if status >= 500 else "invalid_request_error"
