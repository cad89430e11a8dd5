"""The Responses API's bodies and stream events, in the shapes the openai SDK parses.

A response holds one output item, an assistant message with one `output_text` part (or,
when the model calls tools, `function_call` items: responses/function_calls.py). Its
`status` is "completed", or "incomplete" with `incomplete_details.reason` =
"max_output_tokens" when free text ran out of budget (a constrained output always completes
within its budget, so it is never incomplete). A stream is the Responses event sequence:

    response.created, response.in_progress, response.output_item.added,
    response.content_part.added, response.output_text.delta (per text piece),
    response.output_text.done, response.content_part.done, response.output_item.done,
    response.completed (or response.incomplete)

each sent as `event: <type>` plus `data: <json>` with a rising `sequence_number`, and no
[DONE]. An error mid-stream sends an `error` event and ends the stream.

A thinking request (a reasoning model's, server/openai/reasoning.py) has a `reasoning` item
first (output_index 0, its thinking as one `reasoning_text` part), then the message (or
calls) from output_index 1; its stream opens the reasoning item after response.in_progress,
sends `response.reasoning_text.delta` per piece, and closes it (response.reasoning_text.done,
response.output_item.done) before the answer's first item is added.

A stored response (responses/store.py) is the whole body as built here, completed or
incomplete: `settle` hands it to the router's `keep` before the last bytes are sent.
"""

from __future__ import annotations

import secrets
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from gclm.server.engine.protocol import TokenLogprob
from gclm.server.http.errors import as_gclm_error
from gclm.server.openai.output import PLAIN, Delta, Finished, OutputSpec
from gclm.server.openai.render import ChoiceOutput, Renderer, TopLogprob, Usage
from gclm.server.openai.responses.function_calls import (
    CustomToolCallItem,
    FunctionCallItem,
    call_item,
)
from gclm.server.openai.responses.protocol import ResponsesRequest
from gclm.server.openai.tools.calls import Call


class OutputTokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob]

    @classmethod
    def of(cls, lp: TokenLogprob) -> OutputTokenLogprob:
        top = [TopLogprob.of(t) for t in lp.top]
        data = None if lp.bytes is None else list(lp.bytes)
        return cls(token=lp.token, logprob=lp.logprob, bytes=data, top_logprobs=top)


class OutputText(BaseModel):
    type: Literal["output_text"] = "output_text"
    text: str
    annotations: list[Any] = []
    logprobs: list[OutputTokenLogprob] = []


class OutputMessage(BaseModel):
    type: Literal["message"] = "message"
    id: str
    role: Literal["assistant"] = "assistant"
    status: Literal["in_progress", "completed", "incomplete"]
    content: list[OutputText]


class ReasoningText(BaseModel):
    type: Literal["reasoning_text"] = "reasoning_text"
    text: str


class ReasoningItem(BaseModel):
    """A `reasoning` output item: the model's thinking, whole (no summary is made)."""

    type: Literal["reasoning"] = "reasoning"
    id: str
    summary: list[Any] = []
    content: list[ReasoningText]
    status: Literal["in_progress", "completed", "incomplete"]


class ResponseUsage(BaseModel):
    input_tokens: int
    input_tokens_details: dict[str, int]
    output_tokens: int
    output_tokens_details: dict[str, int]
    total_tokens: int

    @classmethod
    def of(cls, usage: Usage) -> ResponseUsage:
        return cls(
            input_tokens=usage.prompt_tokens,
            # gclm's prefix reuse charges no write: cache_write_tokens is always 0.
            input_tokens_details={
                "cached_tokens": usage.prompt_tokens_details.cached_tokens,
                "cache_write_tokens": 0,
            },
            output_tokens=usage.completion_tokens,
            output_tokens_details={
                "reasoning_tokens": usage.completion_tokens_details.reasoning_tokens
            },
            total_tokens=usage.total_tokens,
        )


class ResponseBody(BaseModel):
    """The response object; the request's settings are echoed back, as OpenAI does."""

    id: str
    object: Literal["response"] = "response"
    created_at: int
    status: Literal["in_progress", "completed", "incomplete"]
    error: None = None
    incomplete_details: dict[str, str] | None = None
    instructions: str | None
    max_output_tokens: int | None
    model: str
    output: list[ReasoningItem | OutputMessage | FunctionCallItem | CustomToolCallItem]
    parallel_tool_calls: bool
    previous_response_id: str | None = None
    reasoning: dict[str, Any] | None = None  # the request's, echoed
    store: bool  # whether it is stored (responses/store.py)
    temperature: float
    top_p: float
    top_logprobs: int | None
    text: dict[str, Any]
    tool_choice: str | dict[str, Any]
    tools: list[dict[str, Any]]
    truncation: str = "disabled"
    usage: ResponseUsage | None = None
    metadata: dict[str, Any] = {}


class ResponseEvent(BaseModel):
    """One stream event; its other fields depend on `type`."""

    model_config = ConfigDict(extra="allow")

    type: str
    sequence_number: int = 0


class ResponsesRenderer(Renderer):
    """Builds one response's body, or its events when streamed (a single output): what its
    output parsers read (server/openai/output.py) as a reasoning item, then a message or
    function calls (responses/function_calls.py)."""

    id_prefix = "resp_"
    done = None  # a Responses stream ends with response.completed, not [DONE]

    def __init__(
        self,
        model: str,
        request: ResponsesRequest,
        output: OutputSpec = PLAIN,
        keep: Callable[[ResponseBody], Awaitable[None]] | None = None,
    ) -> None:
        super().__init__(model, output)
        self.request = request
        self.keep = keep  # stores the whole response (None: not stored)
        self.whole: ResponseBody | None = None  # the response, once complete
        self.item_id = "msg_" + secrets.token_hex(12)
        self._sequence = 0
        self._text: list[str] = []
        self._logprobs: list[TokenLogprob] = []
        self._finish_reason = "stop"
        self._calls: list[Call] = []  # streamed: the calls the answer made, once finished
        self._announced = False  # the message item's added events are sent
        self._held: list[TokenLogprob] = []  # logprobs of text a call reader holds back
        # A thinking request's reasoning item comes first; the answer's items after it.
        self.parser = output.thinking
        self.reasoning_id = "rs_" + secrets.token_hex(12)
        self.first = 0 if self.parser is None else 1  # output_index of the answer's first item
        self._thought: list[str] = []
        self._reasoning_open = False  # streamed: the reasoning item is added, not yet done

    # --- the streamed events ---

    def frame(self, body: BaseModel) -> bytes:
        if isinstance(body, ResponseEvent):
            body.sequence_number = self._sequence
            self._sequence += 1
        data = body.model_dump_json()
        kind = getattr(body, "type", "message")
        return f"event: {kind}\ndata: {data}\n\n".encode()

    def failure(self, error: BaseException) -> list[bytes]:
        err = as_gclm_error(error)
        event = ResponseEvent(
            type="error", code=err.code or err.error_type, message=err.message, param=err.param
        )
        return [self.frame(event)]

    def opening(self, n: int) -> list[BaseModel]:
        started = self._started()
        if self.parser is not None or self.output.tool_calls:
            return started  # the message (or the calls) announced once read
        return started + self._announce_message()

    def _started(self) -> list[BaseModel]:
        """response.created and .in_progress; a thinking request's reasoning item opens."""
        started = self._response("in_progress", [])
        out: list[BaseModel] = [
            ResponseEvent(type="response.created", response=started),
            ResponseEvent(type="response.in_progress", response=started),
        ]
        if self.parser is not None:
            self._reasoning_open = True
            item = self._reasoning_item("in_progress", "")
            out.append(ResponseEvent(type="response.output_item.added", output_index=0, item=item))
        return out

    def reasoning_delta(self, index: int, text: str) -> list[BaseModel]:
        if self.parser is None:
            return []
        self._thought.append(text)
        return [
            ResponseEvent(
                type="response.reasoning_text.delta",
                item_id=self.reasoning_id,
                output_index=0,
                content_index=0,
                delta=text,
            )
        ]

    def _end_reasoning(self) -> list[BaseModel]:
        """The reasoning item's done events, once, before the answer's first item."""
        if not self._reasoning_open:
            return []
        self._reasoning_open = False
        text = "".join(self._thought)
        return [
            ResponseEvent(
                type="response.reasoning_text.done",
                item_id=self.reasoning_id,
                output_index=0,
                content_index=0,
                text=text,
            ),
            ResponseEvent(
                type="response.output_item.done",
                output_index=0,
                item=self._reasoning_item("completed", text),
            ),
        ]

    def _announce_message(self) -> list[BaseModel]:
        """The message item's added events, once (after the reasoning item's done)."""
        out = self._end_reasoning()
        if not self._announced:
            self._announced = True
            item = self._message("in_progress", "")
            out += [
                ResponseEvent(
                    type="response.output_item.added", output_index=self.first, item=item
                ),
                self._part_event("response.content_part.added", OutputText(text="")),
            ]
        return out

    def delta(self, piece: Delta) -> list[BaseModel]:
        if not self.output.tool_calls:
            return [*self._announce_message(), self._text_delta(piece.content, piece.logprobs)]
        self._held.extend(piece.logprobs or ())
        return [
            *self._end_reasoning(),
            *self._text_events(piece.content),
            *self._call_events(piece),
        ]

    def _text_delta(self, text: str, logprobs: Sequence[TokenLogprob] | None) -> BaseModel:
        self._text.append(text)
        self._logprobs.extend(logprobs or ())
        return ResponseEvent(
            type="response.output_text.delta",
            item_id=self.item_id,
            output_index=self.first,
            content_index=0,
            delta=text,
            logprobs=[OutputTokenLogprob.of(lp) for lp in logprobs or ()],
        )

    def finish(self, end: Finished) -> list[BaseModel]:
        out: list[BaseModel] = self._end_reasoning()
        if self.output.tool_calls:
            out += self._text_events(end.content)
        if end.calls:
            self._finish_reason, self._calls = end.finish_reason, end.calls
            return out + [e for i, call in enumerate(end.calls) for e in self._call_done(i, call)]
        if self.output.tool_calls and not self._announced:
            out += self._text_events("", announce=True)  # an empty answer is an empty message
        return out + self._message_done(end.finish_reason)

    def _message_done(self, finish_reason: str) -> list[BaseModel]:
        self._finish_reason = finish_reason
        text = "".join(self._text)
        part = self._part(text, self._logprobs)
        return [
            *self._announce_message(),
            ResponseEvent(
                type="response.output_text.done",
                item_id=self.item_id,
                output_index=self.first,
                content_index=0,
                text=text,
                logprobs=part.logprobs,
            ),
            self._part_event("response.content_part.done", part),
            ResponseEvent(
                type="response.output_item.done",
                output_index=self.first,
                item=self._message(self._status(finish_reason), text, self._logprobs),
            ),
        ]

    def _text_events(self, content: str, announce: bool = False) -> list[BaseModel]:
        """Answer text where calls may come: the message item's opening events the first
        time, then the text's delta (with the logprobs held back for it)."""
        if not content and not announce:
            return []
        out = self._announce_message()
        if content:
            logprobs, self._held = self._held, []
            with_logprobs = self.request.logprobs_count is not None
            out.append(self._text_delta(content, logprobs if with_logprobs else None))
        return out

    def _call_events(self, piece: Delta) -> list[BaseModel]:
        """A call's item once its name is read, then its arguments' deltas."""
        out: list[BaseModel] = []
        for event in piece.calls:
            call = piece.called[event[1]]
            if event[0] == "call":
                self._held.clear()  # the opener's tokens are no text
                out.append(
                    ResponseEvent(
                        type="response.output_item.added",
                        output_index=self.first + event[1],
                        item=call_item(call, "in_progress"),
                    )
                )
            else:
                kind = "custom_tool_call_input" if call.custom else "function_call_arguments"
                out.append(
                    ResponseEvent(
                        type=f"response.{kind}.delta",
                        item_id=call_item(call, "in_progress").id,
                        output_index=self.first + event[1],
                        delta=event[2],
                    )
                )
        return out

    def _call_done(self, i: int, call: Call) -> list[BaseModel]:
        item = call_item(call, "completed")
        done = (
            ResponseEvent(
                type="response.custom_tool_call_input.done",
                item_id=item.id,
                output_index=self.first + i,
                input=call.arguments,
            )
            if call.custom
            else ResponseEvent(
                type="response.function_call_arguments.done",
                item_id=item.id,
                output_index=self.first + i,
                name=call.name,
                arguments=call.arguments,
            )
        )
        return [
            done,
            ResponseEvent(type="response.output_item.done", output_index=self.first + i, item=item),
        ]

    def closing(self, usage: Usage, include_usage: bool) -> list[BaseModel]:
        """response.completed (or .incomplete): the whole response, as the stream sent it."""
        thought = "".join(self._thought)
        if self._calls:
            final = self._with_calls(self._calls, thought, usage)
            return [ResponseEvent(type="response.completed", response=final)]
        text = "".join(self._text)
        final = self._answer(self._finish_reason, text, self._logprobs, thought, usage)
        kind = "response.completed" if final.status == "completed" else "response.incomplete"
        return [ResponseEvent(type=kind, response=final)]

    async def settle(self) -> None:
        if self.keep is not None and self.whole is not None:
            await self.keep(self.whole)

    # --- the response object ---

    def final(self, outputs: list[ChoiceOutput], usage: Usage) -> ResponseBody:
        [out] = outputs
        if out.calls:
            return self._with_calls(out.calls, out.reasoning, usage)
        return self._answer(out.finish_reason, out.text, out.logprobs or (), out.reasoning, usage)

    def _answer(
        self,
        finish_reason: str,
        text: str,
        logprobs: Sequence[TokenLogprob],
        thought: str,
        usage: Usage,
    ) -> ResponseBody:
        """The response whose answer is text: a message, after a thinking request's thought."""
        status = self._status(finish_reason)
        message = self._message(status, text, logprobs)
        return self._response(status, [*self._reasoning_output(thought), message], usage)

    def _with_calls(self, calls: list[Call], thought: str, usage: Usage) -> ResponseBody:
        # A call always completes: the constraint closes it within the budget.
        items = [call_item(c, "completed") for c in calls]
        return self._response("completed", [*self._reasoning_output(thought), *items], usage)

    def _reasoning_output(self, thought: str) -> list[ReasoningItem]:
        """The reasoning item of a thinking request's output (none for another)."""
        if self.parser is None:
            return []
        return [self._reasoning_item("completed", self.parser.strip_start(thought))]

    def _reasoning_item(
        self, status: Literal["in_progress", "completed"], text: str
    ) -> ReasoningItem:
        content = [ReasoningText(text=text)] if status == "completed" else []
        return ReasoningItem(id=self.reasoning_id, content=content, status=status)

    def _status(self, finish_reason: str) -> Literal["completed", "incomplete"]:
        return "incomplete" if finish_reason == "length" else "completed"

    def _response(
        self,
        status: Literal["in_progress", "completed", "incomplete"],
        output: list[ReasoningItem | OutputMessage | FunctionCallItem | CustomToolCallItem],
        usage: Usage | None = None,
    ) -> ResponseBody:
        r = self.request
        fmt = r.text.format if r.text is not None else None
        text_format = fmt.model_dump(by_alias=True, exclude_none=True) if fmt else {"type": "text"}
        body = ResponseBody(
            id=self.id,
            created_at=self.created,
            status=status,
            incomplete_details={"reason": "max_output_tokens"} if status == "incomplete" else None,
            instructions=r.instructions,
            max_output_tokens=r.max_output_tokens,
            model=self.model,
            output=output,
            reasoning=r.reasoning,
            temperature=r.temperature,
            top_p=r.top_p,
            top_logprobs=r.top_logprobs,
            text={"format": text_format},
            parallel_tool_calls=r.parallel_tool_calls is not False,
            tool_choice=(
                r.tool_choice.model_dump()
                if isinstance(r.tool_choice, BaseModel)
                else r.tool_choice or "auto"
            ),
            tools=[t.model_dump() for t in r.tools or ()],
            usage=None if usage is None else ResponseUsage.of(usage),
            metadata=r.metadata if isinstance(r.metadata, dict) else {},
            previous_response_id=r.previous_response_id,
            store=self.keep is not None,
        )
        if status != "in_progress":
            self.whole = body
        return body

    def _part(self, text: str, logprobs: Sequence[TokenLogprob] = ()) -> OutputText:
        return OutputText(text=text, logprobs=[OutputTokenLogprob.of(lp) for lp in logprobs])

    def _part_event(self, kind: str, part: OutputText) -> ResponseEvent:
        return ResponseEvent(
            type=kind, item_id=self.item_id, output_index=self.first, content_index=0, part=part
        )

    def _message(
        self,
        status: Literal["in_progress", "completed", "incomplete"],
        text: str,
        logprobs: Sequence[TokenLogprob] = (),
    ) -> OutputMessage:
        content = [self._part(text, logprobs)] if status != "in_progress" else []
        return OutputMessage(id=self.item_id, status=status, content=content)
