"""A traced request on the HTTP infer path: Triton's HTTP timestamps around the core's.

Only requests the trace setting samples come here (edged.frontends.http.infer checks ``tracing.enabled`` first);
HTTP_SEND_END is when the reply is handed to the connection.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from edged.core.request.inference import InferRequest, InferResponse
    from edged.core.service import InferencePath, ModelHandle
    from edged.core.trace_file import Trace
    from edged.frontends.http.infer import HttpOptions, Reply

    Run = Callable[[InferRequest, ModelHandle], Awaitable[InferResponse | None]]


class Answer(Protocol):
    def __call__(
        self,
        service: InferencePath,
        options: HttpOptions,
        path: str,
        model_name: str,
        version_text: str | None,
        headers: dict[str, str],
        read_body: Callable[[], Awaitable[bytes]],
        run: Run,
    ) -> Awaitable[Reply | None]: ...


async def answer_traced(
    answer: Answer,
    trace: Trace,
    service: InferencePath,
    options: HttpOptions,
    path: str,
    model_name: str,
    version_text: str | None,
    headers: dict[str, str],
    read_body: Callable[[], Awaitable[bytes]],
    run: Run,
) -> Reply | None:
    trace.stamp("HTTP_RECV_START")

    async def read() -> bytes:
        body = await read_body()
        trace.stamp("HTTP_RECV_END")
        return body

    async def traced_run(request: InferRequest, model: ModelHandle) -> InferResponse | None:
        request.trace = trace
        response = await run(request, model)
        trace.stamp("HTTP_SEND_START")
        return response

    try:
        reply = await answer(service, options, path, model_name, version_text, headers, read, traced_run)
        trace.stamp("HTTP_SEND_END")
        return reply
    finally:
        trace.close()
