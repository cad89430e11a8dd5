"""The Responses API's output when tools allow calls: `function_call` (or
`custom_tool_call`) items or a message.

The output is read by chat's `CallReader` (server/openai/tools/calls.py): under tool_choice
"auto" it is either text (one assistant message) or calls (one `function_call` item each,
`call_id` being what the next turn's `function_call_output` names). A stream announces an
item only once the reader knows which it is, so a call never follows an empty message:

    response.created, response.in_progress, then for each call
    response.output_item.added (function_call, arguments ""),
    response.function_call_arguments.delta (per fragment), and at the end
    response.function_call_arguments.done, response.output_item.done, response.completed

(a custom call: the item is `custom_tool_call` with input "", its input streams as
response.custom_tool_call_input.delta and ends with response.custom_tool_call_input.done),
or, for text, the message events of ResponsesRenderer from output_item.added on. Text cut by
the budget under "auto" is free text: status "incomplete", as without tools. A thinking
request's reasoning item comes first (ResponsesRenderer), the calls or message after it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from pydantic import BaseModel

from gclm.server.engine.protocol import FinishEvent, TokenLogprob
from gclm.server.openai.reasoning import ReasoningParser
from gclm.server.openai.render import ChoiceOutput, Usage
from gclm.server.openai.responses.protocol import ResponsesRequest
from gclm.server.openai.responses.render import (
    CustomToolCallItem,
    FunctionCallItem,
    ResponseBody,
    ResponseEvent,
    ResponsesRenderer,
)
from gclm.server.openai.tools.calls import Call, CallReader


def call_item(
    call: Call, status: Literal["in_progress", "completed"]
) -> FunctionCallItem | CustomToolCallItem:
    """The output item of a call; its id is derived from the call id (one per call)."""
    if call.custom:
        return CustomToolCallItem(
            id="ctc_" + call.id.removeprefix("call_"),
            call_id=call.id,
            name=call.name,
            input=call.arguments if status == "completed" else "",
            status=status,
        )
    return FunctionCallItem(
        id="fc_" + call.id.removeprefix("call_"),
        call_id=call.id,
        name=call.name,
        arguments=call.arguments if status == "completed" else "",
        status=status,
    )


class ResponsesToolRenderer(ResponsesRenderer):
    """A ResponsesRenderer that reads the output as text or function calls."""

    def __init__(
        self, model: str, request: ResponsesRequest, parser: ReasoningParser | None = None
    ) -> None:
        super().__init__(model, request, parser)
        self._reader = CallReader()
        self._held: list[TokenLogprob] = []  # logprobs of text the reader holds back

    def finish_reason(self, event: FinishEvent) -> str:
        # Text under "auto" is free text: a budget cut is "length" (a call is never cut).
        return "length" if event.budget_cut else event.finish_reason

    def opening(self, n: int) -> list[BaseModel]:
        return self._started()  # the message (or the calls) announced once read

    def deltas(
        self, index: int, text: str, logprobs: Sequence[TokenLogprob] | None
    ) -> list[BaseModel]:
        content, events = self._reader.feed(text)
        self._held.extend(logprobs or ())
        out = self._end_reasoning()  # answer text: the thinking is over
        out += self._text_events(content) if content else []
        calls = self._reader.calls
        for event in events:
            call = calls[event[1]]
            if event[0] == "call":
                self._held.clear()  # the opener's tokens are no text
                item = call_item(call, "in_progress")
                out.append(
                    ResponseEvent(
                        type="response.output_item.added",
                        output_index=self.first + event[1],
                        item=item,
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

    def finish(self, index: int, finish_reason: str) -> list[BaseModel]:
        rest = self._reader.finish()
        out = self._end_reasoning()
        out += self._text_events(rest) if rest else []
        calls = self._reader.calls
        if not calls:
            if not self._announced:
                out += self._text_events("")  # an empty answer is an empty message
            return out + super().finish(index, finish_reason)
        self._finish_reason = finish_reason
        for i, call in enumerate(calls):
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
            out += [
                done,
                ResponseEvent(
                    type="response.output_item.done", output_index=self.first + i, item=item
                ),
            ]
        return out

    def closing(self, usage: Usage, include_usage: bool) -> list[BaseModel]:
        if not self._reader.calls:
            return super().closing(usage, include_usage)
        final = self._with_calls(self._reader.calls, self._streamed(), usage)
        return [ResponseEvent(type="response.completed", response=final)]

    def final(self, outputs: list[ChoiceOutput], usage: Usage) -> ResponseBody:
        [out] = outputs
        reader = CallReader()
        reader.feed(out.text)
        reader.finish()
        if not reader.calls:
            return super().final(outputs, usage)
        return self._with_calls(reader.calls, out, usage)

    def _with_calls(self, calls: list[Call], out: ChoiceOutput, usage: Usage) -> ResponseBody:
        # A call always completes: the constraint closes it within the budget.
        items = [call_item(c, "completed") for c in calls]
        return self._response("completed", [*self._reasoning_output(out), *items], usage)

    def _text_events(self, content: str) -> list[BaseModel]:
        """The message item's opening events the first time, then the text's delta."""
        out = self._announce_message()
        if content:
            logprobs, self._held = self._held, []
            with_logprobs = self.request.logprobs_count is not None
            out.append(self.delta(0, content, logprobs if with_logprobs else None))
        return out
