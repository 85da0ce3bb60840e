"""test_sdk.py - ds4-server driven by the official `openai` and `anthropic`
Python SDKs (versions pinned in tests/server/requirements.txt; run with
tests/server/run.sh).

For each API: non-streaming and streaming (the SDKs' own stream parsers and
accumulating helpers), thinking on and off, and a whole tool round trip
(tool definitions -> tool call -> tool result -> answer) where the model's
output is forced through the test hook, so the server's real DSML parser
and API mapping produce what the SDK parses.  Prefix reuse is read from the
usage counters.  The server runs with --api-key, so the SDKs' own auth
headers (Bearer, x-api-key) are exercised too, and with one session
(--parallel 1), whose reuse ladder the cases pin down; many clients at once
are test_sdk_parallel.py.
"""
import json
import os
import sys
import time

import anthropic
import openai

sys.path.insert(0, os.path.dirname(__file__))
from harness import Server  # noqa: E402

KEY = "test-key-123"
PASSED = []
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Weather for a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                   "required": ["city"]}}}]
WEATHER = {"city": "Paris", "days": 3}
ANSWER = "It is sunny in Paris, 21 degrees."


def force(name):
    return {"X-DS4-Test-Output": name}


def check(cond, msg):
    if not cond:
        raise AssertionError(msg)


def t_openai_chat(oc):
    for think in (False, True):
        r = oc.chat.completions.create(model="deepseek-v4-flash", messages=[{"role": "user", "content": "Hi"}],
                                       max_tokens=6, temperature=0, extra_body={"thinking": think})
        check(r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 6, r)
        check((getattr(r.choices[0].message, "reasoning_content", None) is not None) == think, r)
    r = oc.chat.completions.create(model="x", messages=[{"role": "user", "content": "Hi"}], extra_headers=force("answer"),
                                   extra_body={"thinking": False})
    check(r.choices[0].message.content == ANSWER and r.model == "x", r)
    chunks = list(oc.chat.completions.create(model="x", messages=[{"role": "user", "content": "Hi"}], stream=True,
                                             stream_options={"include_usage": True}, extra_headers=force("answer_think")))
    reasoning = "".join(getattr(c.choices[0].delta, "reasoning_content", None) or "" for c in chunks if c.choices)
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    check(reasoning == "The tool said sunny." and content == ANSWER, (reasoning, content))
    check(chunks[-1].usage.completion_tokens > 5, chunks[-1])


def t_openai_multi_turn_reuse(oc):
    """Each turn reuses everything before it: only the new user turn is prefilled."""
    msgs = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Name a colour."}]
    prev = None
    for turn in range(4):
        r = oc.chat.completions.create(model="x", messages=msgs, max_tokens=6, temperature=0,
                                       extra_body={"thinking": False})
        u = r.usage
        written = u.prompt_tokens_details.cache_write_tokens  # a field of this SDK version
        check(u.prompt_tokens_details.cached_tokens + written == u.prompt_tokens, u)
        if prev:
            check(u.prompt_tokens_details.cached_tokens >= prev.prompt_tokens + prev.completion_tokens - 1, (prev, u))
            check(written <= 16, u)
        prev = u
        msgs += [{"role": "assistant", "content": r.choices[0].message.content},
                 {"role": "user", "content": "Another one (%d)." % turn}]


def t_openai_chat_tools(oc):
    msgs = [{"role": "system", "content": "You answer weather questions."},
            {"role": "user", "content": "Weather in Paris?"}]
    r = oc.chat.completions.create(model="x", messages=msgs, tools=TOOLS, extra_headers=force("weather_call"),
                                   extra_body={"thinking": False})
    m = r.choices[0].message
    check(r.choices[0].finish_reason == "tool_calls" and len(m.tool_calls) == 1, r)
    tc = m.tool_calls[0]
    check(tc.function.name == "get_weather" and json.loads(tc.function.arguments) == WEATHER, tc)
    msgs2 = msgs + [m.model_dump(exclude_none=True), {"role": "tool", "tool_call_id": tc.id, "content": "sunny, 21C"}]
    r2 = oc.chat.completions.create(model="x", messages=msgs2, tools=TOOLS, extra_headers=force("answer"),
                                    extra_body={"thinking": False})
    check(r2.choices[0].message.content == ANSWER, r2)
    cached = r2.usage.prompt_tokens_details.cached_tokens
    check(cached >= r.usage.prompt_tokens + r.usage.completion_tokens - 1, (r.usage, r2.usage))
    # Streaming tool calls, accumulated the way SDK users do.
    calls = {}
    for c in oc.chat.completions.create(model="x", messages=msgs, tools=TOOLS, stream=True,
                                        extra_headers=force("two_calls"), extra_body={"thinking": False}):
        for d in c.choices[0].delta.tool_calls or [] if c.choices else []:
            e = calls.setdefault(d.index, {"id": None, "name": None, "args": ""})
            e["id"] = d.id or e["id"]
            e["name"] = (d.function.name if d.function else None) or e["name"]
            e["args"] += (d.function.arguments or "") if d.function else ""
    check(json.loads(calls[0]["args"]) == {"city": "Paris", "days": 1} and calls[1]["name"] == "get_weather", calls)
    # Thinking on, with tools: reasoning kept for the replay.
    r = oc.chat.completions.create(model="x", messages=msgs, tools=TOOLS, extra_headers=force("weather_call_think"))
    check(r.choices[0].message.reasoning_content.startswith("The user asks"), r)


def t_openai_completions(oc):
    r = oc.completions.create(model="x", prompt="Once", max_tokens=4, temperature=0, extra_body={"thinking": False})
    check(r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 4, r)
    text = "".join(c.choices[0].text for c in oc.completions.create(
        model="x", prompt="Once", max_tokens=4, temperature=0, stream=True, extra_body={"thinking": False}) if c.choices)
    check(text == r.choices[0].text, (text, r))


def t_openai_responses(oc):
    r = oc.responses.create(model="x", input="Hi", max_output_tokens=5, reasoning={"effort": "none"})
    check(r.status == "incomplete" and r.usage.output_tokens == 5, r)
    r = oc.responses.create(model="x", input="Hi", reasoning={"effort": "high", "summary": "auto"},
                            extra_headers=force("answer_think"))
    check(r.output_text == ANSWER and r.output[0].type == "reasoning", r)
    with oc.responses.stream(model="x", input="Hi", extra_headers=force("answer_think"),
                             reasoning={"summary": "auto"}) as st:
        deltas = [e.delta for e in st if e.type == "response.output_text.delta"]
        final = st.get_final_response()
    check("".join(deltas) == ANSWER and final.output_text == ANSWER, final)
    # Tools.
    tools = [{"type": "function", "name": "get_weather", "description": "Weather for a city",
              "parameters": TOOLS[0]["function"]["parameters"]}]
    inp = [{"role": "user", "content": "Weather in Paris?"}]
    r = oc.responses.create(model="x", instructions="You answer weather questions.", input=inp, tools=tools,
                            reasoning={"effort": "none"}, extra_headers=force("weather_call"))
    fc = [o for o in r.output if o.type == "function_call"]
    check(len(fc) == 1 and json.loads(fc[0].arguments) == WEATHER, r)
    inp2 = inp + [o.model_dump(exclude_none=True) for o in r.output] + [
        {"type": "function_call_output", "call_id": fc[0].call_id, "output": "sunny, 21C"}]
    r2 = oc.responses.create(model="x", instructions="You answer weather questions.", input=inp2, tools=tools,
                             reasoning={"effort": "none"}, extra_headers=force("answer"))
    check(r2.output_text == ANSWER and r2.usage.input_tokens_details.cached_tokens > r.usage.input_tokens, r2)
    with oc.responses.stream(model="x", input=inp, tools=tools, reasoning={"effort": "none"},
                             extra_headers=force("two_calls")) as st:
        for _ in st:
            pass
        final = st.get_final_response()
    fcs = [o for o in final.output if o.type == "function_call"]
    check([json.loads(o.arguments) for o in fcs] == [{"city": "Paris", "days": 1}, {"city": "Rome"}], final)


def t_openai_structured_and_logprobs(oc):
    """The SDK's structured outputs (a Pydantic model as response_format)
    and logprobs types, parsed from what the server answers."""
    import typing

    import pydantic

    class Verdict(pydantic.BaseModel):
        ok: bool
        mood: typing.Literal["calm", "angry"]

    r = oc.chat.completions.parse(model="x", messages=[{"role": "user", "content": "Verdict?"}], response_format=Verdict,
                                  temperature=0, max_tokens=100, extra_body={"thinking": False},
                                  extra_headers=force("answer"))
    check(isinstance(r.choices[0].message.parsed, Verdict), r)
    r = oc.chat.completions.create(model="x", messages=[{"role": "user", "content": "Hi"}], max_tokens=4, temperature=0,
                                   logprobs=True, top_logprobs=2, extra_body={"thinking": False})
    lp = r.choices[0].logprobs.content
    check(len(lp) == 4 and len(lp[0].top_logprobs) == 2 and "".join(e.token for e in lp) == r.choices[0].message.content, lp)
    r = oc.responses.parse(model="x", input="Verdict?", text_format=Verdict, temperature=0, max_output_tokens=100,
                           reasoning={"effort": "none"}, extra_headers=force("answer"))
    check(isinstance(r.output_parsed, Verdict), r)


def t_openai_responses_codex(oc):
    """Codex's custom tools and tool_search as the SDK types them; text
    events with their logprobs field."""
    tools = [{"type": "custom", "name": "apply_patch", "description": "Edit files",
              "format": {"type": "grammar", "syntax": "lark", "definition": "start: /.+/"}},
             {"type": "tool_search", "execution": "client", "description": "Find tools",
              "parameters": {"type": "object", "properties": {"query": {"type": "string"}}}}]
    with oc.responses.stream(model="x", input="Patch it", tools=tools, reasoning={"effort": "none"},
                             extra_headers=force("custom_call")) as st:
        types = [e.type for e in st]
        final = st.get_final_response()
    item = final.output[-1]
    check(item.type == "custom_tool_call" and item.name == "apply_patch" and item.input.startswith("*** Begin Patch"), final)
    check("response.custom_tool_call_input.delta" in types, types)
    r = oc.responses.create(model="x", input="Find", tools=tools, reasoning={"effort": "none"},
                            extra_headers=force("search_call"))
    check(r.output[-1].type == "tool_search_call", r)
    with oc.responses.stream(model="x", input="Hi", reasoning={"effort": "none"}, max_output_tokens=3) as st:
        deltas = [e for e in st if e.type == "response.output_text.delta"]
    check(deltas and all(e.logprobs == [] for e in deltas), deltas)


def t_anthropic(ac):
    for think in ({"type": "disabled"}, {"type": "enabled", "budget_tokens": 1024}):
        m = ac.messages.create(model="x", max_tokens=5, messages=[{"role": "user", "content": "Hi"}], thinking=think)
        check(m.stop_reason == "max_tokens" and m.usage.output_tokens == 5, m)
        check((m.content[0].type == "thinking") == (think["type"] == "enabled"), m)
    m = ac.messages.create(model="x", max_tokens=100, messages=[{"role": "user", "content": "Hi"}],
                           extra_headers=force("answer_think"))
    check([c.type for c in m.content] == ["thinking", "text"] and m.content[1].text == ANSWER, m)
    with ac.messages.stream(model="x", max_tokens=100, messages=[{"role": "user", "content": "Hi"}],
                            extra_headers=force("answer_think")) as st:
        text = "".join(st.text_stream)
        final = st.get_final_message()
    check(text == ANSWER and final.content[0].thinking == "The tool said sunny.", final)


def t_anthropic_count_tokens(ac):
    r = ac.messages.count_tokens(model="x", messages=[{"role": "user", "content": "Hi"}],
                                 thinking={"type": "disabled"})
    check(r.input_tokens == 5, r)


def t_anthropic_tools(ac):
    tools = [{"name": "get_weather", "description": "Weather for a city",
              "input_schema": TOOLS[0]["function"]["parameters"]}]
    msgs = [{"role": "user", "content": "Weather in Paris?"}]
    m = ac.messages.create(model="x", max_tokens=300, system="You answer weather questions.", messages=msgs,
                           tools=tools, thinking={"type": "disabled"}, extra_headers=force("weather_call"))
    tu = [c for c in m.content if c.type == "tool_use"]
    check(m.stop_reason == "tool_use" and tu[0].input == WEATHER, m)
    msgs2 = msgs + [{"role": "assistant", "content": [c.model_dump() for c in m.content]},
                    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": tu[0].id,
                                                  "content": "sunny, 21C"}]}]
    m2 = ac.messages.create(model="x", max_tokens=300, system="You answer weather questions.", messages=msgs2,
                            tools=tools, thinking={"type": "disabled"}, extra_headers=force("answer"))
    check(m2.content[0].text == ANSWER and m2.usage.cache_read_input_tokens > m.usage.cache_creation_input_tokens, m2)
    with ac.messages.stream(model="x", max_tokens=300, messages=msgs, tools=tools,
                            extra_headers=force("weather_call_think")) as st:
        final = st.get_final_message()
    check([c.type for c in final.content] == ["thinking", "tool_use"] and final.content[1].input == WEATHER, final)


def evict(oc):
    """An unrelated request: the live session moves on."""
    oc.chat.completions.create(model="x", messages=[{"role": "user", "content": "Unrelated"}], max_tokens=2,
                               extra_body={"thinking": False})


def t_openai_responses_continuation(oc):
    """Tool outputs sent alone continue the live call turn (every live token
    reused); once the live state is gone the SDK sees 409 (ConflictError),
    an id nobody issued 400."""
    tools = [{"type": "function", "name": "get_weather", "description": "Weather for a city",
              "parameters": TOOLS[0]["function"]["parameters"]}]
    def call_turn():
        r = oc.responses.create(model="x", instructions="You answer weather questions.",
                                input=[{"role": "user", "content": "Weather in Paris?"}], tools=tools,
                                extra_headers=force("weather_call_think"))
        fc = [o for o in r.output if o.type == "function_call"][0]
        return r, [{"type": "function_call_output", "call_id": fc.call_id, "output": "sunny, 21C"}]

    r, out = call_turn()
    r2 = oc.responses.create(model="x", input=out, tools=tools, extra_headers=force("answer_think"))
    check(r2.output_text == ANSWER, r2)
    check(r2.usage.input_tokens_details.cached_tokens == r.usage.input_tokens + r.usage.output_tokens - 1, r2.usage)
    r, out = call_turn()
    evict(oc)
    try:
        oc.responses.create(model="x", input=out, tools=tools)
        raise AssertionError("no error")
    except openai.ConflictError as e:
        check("continuation state is not available" in e.message, e)
    try:
        oc.responses.create(model="x", input=[dict(out[0], call_id="call_nobody")], tools=tools)
        raise AssertionError("no error")
    except openai.BadRequestError as e:
        check("call_id call_nobody" in e.message, e)


def t_anthropic_tool_output(ac):
    tools = [{"name": "get_weather", "description": "Weather for a city",
              "input_schema": TOOLS[0]["function"]["parameters"]}]
    m = ac.messages.create(model="x", max_tokens=300, messages=[{"role": "user", "content": "Weather in Paris?"}],
                           tools=tools, extra_headers=force("weather_call_think"))
    tu = [c for c in m.content if c.type == "tool_use"][0]
    results = [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": tu.id, "content": "sunny"}]}]
    m2 = ac.messages.create(model="x", max_tokens=300, messages=results, tools=tools,
                            extra_headers=force("answer_think"))
    check(m2.content[-1].text == ANSWER, m2)
    check(m2.usage.cache_read_input_tokens == m.usage.cache_creation_input_tokens + m.usage.output_tokens - 1, m2.usage)
    try:
        ac.messages.create(model="x", max_tokens=5, messages=results, tools=tools)
        raise AssertionError("no error")
    except anthropic.ConflictError as e:
        check("continuation state is not available" in e.message, e)


def t_errors(oc, ac):
    try:
        oc.chat.completions.create(model="x", messages=[{"role": "wizard", "content": "x"}])
        raise AssertionError("no error")
    except openai.BadRequestError as e:
        check("role" in e.message, e)
    try:
        ac.messages.create(model="x", max_tokens=5, messages=[{"role": "user", "content": "word " * 5000}])
        raise AssertionError("no error")
    except anthropic.BadRequestError as e:
        check("context size" in e.message, e)
    bad = openai.OpenAI(base_url=oc.base_url, api_key="wrong", max_retries=0)
    try:
        bad.models.list()
        raise AssertionError("no error")
    except openai.AuthenticationError:
        pass
    check([m.id for m in oc.models.list()] == ["deepseek-v4-flash"], "models")


def main():
    with Server("--api-key", KEY, "--parallel", "1") as s:
        oc = openai.OpenAI(base_url=s.url + "/v1", api_key=KEY, max_retries=0)
        ac = anthropic.Anthropic(base_url=s.url, api_key=KEY, max_retries=0)
        for fn, args in ((t_openai_chat, (oc,)), (t_openai_multi_turn_reuse, (oc,)),
                         (t_openai_chat_tools, (oc,)), (t_openai_completions, (oc,)),
                         (t_openai_responses, (oc,)), (t_anthropic, (ac,)), (t_anthropic_count_tokens, (ac,)),
                         (t_anthropic_tools, (ac,)), (t_openai_responses_continuation, (oc,)),
                         (t_anthropic_tool_output, (ac,)), (t_errors, (oc, ac)),
                         (t_openai_structured_and_logprobs, (oc,)), (t_openai_responses_codex, (oc,))):
            t0 = time.time()
            fn(*args)
            PASSED.append(fn.__name__)
            print("ok %-24s %.2fs" % (fn.__name__, time.time() - t0), flush=True)
    print("openai %s, anthropic %s" % (openai.__version__, anthropic.__version__))
    print("%d passed, 0 failed" % len(PASSED))


if __name__ == "__main__":
    main()
