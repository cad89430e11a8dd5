"""The Responses API's output when tools allow calls: `function_call` (or `custom_tool_call`)
items or a message (ResponsesRenderer writes them, from what output.py's ToolCalls parser
read, handed to it by the serving pipeline).

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
request's reasoning item comes first, the calls or message after it.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel

from gclm.server.openai.tools.calls import Call


class FunctionCallItem(BaseModel):
    """A `function_call` output item: `call_id` is what the function_call_output answering
    it names."""

    type: Literal["function_call"] = "function_call"
    id: str
    call_id: str
    name: str
    arguments: str
    status: Literal["in_progress", "completed", "incomplete"]


class CustomToolCallItem(BaseModel):
    """A `custom_tool_call` output item: its `input` is the tool's free text."""

    type: Literal["custom_tool_call"] = "custom_tool_call"
    id: str
    call_id: str
    name: str
    input: str
    status: Literal["in_progress", "completed", "incomplete"]


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
