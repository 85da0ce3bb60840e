"""protocol.py - ds4-server on the protocol edge cases agents hit (stdlib
only; tests/suite/server_protocol.sh).  Each case failed on the server
before its fix:

  - max_tokens ending inside a tool call (or inside the block's opening
    marker) answers the truncated turn, finish length, no partial call, no
    markup, in the three chat APIs, streaming or not;
  - a client that edits a call's arguments under the same id gets its own
    call rendered, not the remembered bytes;
  - a NUL character (a binary tool output) and images in the history:
    accepted, rendered as \\u0000 and as a stated placeholder in every API;
  - a client that half-closes its sending side still gets its answer;
  - tool_choice none / required / named and parallel_tool_calls false,
    enforced on what the model samples (the forced test output stands for
    the model: a constraint overrides it);
  - response_format json_schema / json_object (Responses text.format,
    Anthropic output_format): constrained decoding to valid JSON of the
    schema; a schema that cannot be enforced is refused naming the field;
    logprobs in chat, completions and Responses; several completions
    prompts refused;
  - Codex CLI's Responses tools: custom tools (apply_patch with its
    grammar), namespace groups, the hosted tool_search, the history items
    local_shell_call, web_search_call, image_generation_call,
    tool_search_call / tool_search_output; text events carry logprobs;
  - while the model thinks, ds4's sampling defaults (the client's
    temperature applies to the answer after </think>);
  - /v1/ds4/stats counters each counting what their name says.

The model is the generated tiny one (harness.py): its text is gibberish,
so answers are driven by forced outputs (tests/server/force.json) and
checked for structure; the trace file shows the rendered prompt and the
raw generated text.  DS4_TEST_KEEP_GOING=1 runs every case and lists the
failures instead of stopping at the first.
"""
import json
import os
import re
import socket
import sys
import tempfile
import time
import traceback

sys.path.insert(0, os.path.dirname(__file__))
from harness import Server, parse_sse  # noqa: E402

PASSED, FAILED = [], []
C, P, R, M = "/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/messages"
D = "\uff5cDSML\uff5c"
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather for a city",
                                           "parameters": {"type": "object", "properties": {"city": {"type": "string"},
                                                                                           "days": {"type": "integer"}}}}},
         {"type": "function", "function": {"name": "get_time", "description": "Time in a zone",
                                           "parameters": {"type": "object", "properties": {"zone": {"type": "string"}}}}}]
R_TOOLS = [dict(t["function"], type="function") for t in TOOLS]
M_TOOLS = [{"name": t["function"]["name"], "description": t["function"]["description"],
            "input_schema": t["function"]["parameters"]} for t in TOOLS]
USER = [{"role": "user", "content": "Weather in Paris?"}]
OK_SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}, "mood": {"enum": ["calm", "angry"]}},
             "required": ["ok", "mood"], "additionalProperties": False}


def check(cond, msg):
    if not cond:
        raise AssertionError(msg)


def force(name):
    return {"X-DS4-Test-Output": name}


class Trace:
    """The --trace file: rendered prompts and generated text by answer id."""

    def __init__(self, path):
        self.path = path

    def text(self):
        with open(self.path, encoding="utf-8", errors="replace") as f:
            return f.read()

    def generated(self, rid):
        t = self.text()
        at = t.index("--- %s: finish=" % rid)
        start = t.index("--- generated text\n", at) + len("--- generated text\n")
        end = min(i for i in (t.find("\n--- reasoning\n", start), t.find("\n--- content\n", start)) if i >= 0)
        return t[start:end]

    def prompt(self, rid):
        t = self.text()
        at = t.index("=== request %s " % rid)
        start = t.index("--- rendered prompt\n", at) + len("--- rendered prompt\n")
        m = re.compile(r"\n\[\d{4}-\d\d-\d\d \d\d:").search(t, start)
        return t[start:m.start() if m else len(t)]


def chat_text(b):
    return b["choices"][0]["message"].get("content") or ""


def responses_text(b):
    return "".join(c["text"] for o in b["output"] if o["type"] == "message" for c in o["content"])


def messages_text(b):
    return "".join(c.get("text", "") for c in b["content"] if c["type"] == "text")


# ---------------------------------------------------------------- cases

def t_truncated_tool_call(s, tr):
    """max_tokens inside the call (and inside the block's opening marker):
    the truncated turn, no partial call, no markup, in every API."""
    for n in (4, 12, 25):
        st, b = s.post(C, {"messages": USER, "tools": TOOLS, "thinking": False, "max_tokens": n}, headers=force("weather_call"))
        c = b["choices"][0] if st == 200 else b
        check(st == 200 and c["finish_reason"] == "length" and "tool_calls" not in c["message"], (n, st, b))
        check("DSML" not in chat_text(b) and "<" not in chat_text(b), (n, b))
        st, b = s.post(M, {"messages": USER, "tools": M_TOOLS, "thinking": {"type": "disabled"}, "max_tokens": n},
                       headers=force("weather_call"))
        check(st == 200 and b["stop_reason"] == "max_tokens" and all(c["type"] == "text" for c in b["content"]), (n, st, b))
        check("DSML" not in messages_text(b), b)
        st, b = s.post(R, {"input": USER, "tools": R_TOOLS, "reasoning": {"effort": "none"}, "max_output_tokens": n},
                       headers=force("weather_call"))
        check(st == 200 and b["status"] == "incomplete" and all(o["type"] == "message" for o in b["output"]), (n, st, b))
        check("DSML" not in responses_text(b), b)
    # Streaming: no call item or tool_calls delta ever goes out.
    ev = s.stream(C, {"messages": USER, "tools": TOOLS, "thinking": False, "max_tokens": 25, "stream": True},
                  headers=force("weather_call"))
    data = [d for e, d in ev if e != ":" and d != "[DONE]"]
    check(all("tool_calls" not in d["choices"][0]["delta"] for d in data if d["choices"]), data)
    check(data[-1]["choices"][0]["finish_reason"] == "length", data[-1])
    ev = s.stream(M, {"messages": USER, "tools": M_TOOLS, "thinking": {"type": "disabled"}, "max_tokens": 25,
                      "stream": True}, headers=force("weather_call"))
    check(all(d["content_block"]["type"] != "tool_use" for e, d in ev if e == "content_block_start"), ev)
    check([d for e, d in ev if e == "message_delta"][0]["delta"]["stop_reason"] == "max_tokens", ev[-2:])
    ev = s.stream(R, {"input": USER, "tools": R_TOOLS, "reasoning": {"effort": "none"}, "max_output_tokens": 25,
                      "stream": True}, headers=force("weather_call"))
    types = [d["type"] for e, d in ev if e != ":"]
    check(types[-1] == "response.incomplete" and "response.function_call_arguments.delta" not in types, types)
    # A complete first call stays when the second is cut.
    st, b = s.post(C, {"messages": USER, "tools": TOOLS, "thinking": False, "max_tokens": 60}, headers=force("two_calls"))
    m = b["choices"][0]["message"]
    check(b["choices"][0]["finish_reason"] == "length" and len(m["tool_calls"]) == 1, b)
    check(json.loads(m["tool_calls"][0]["function"]["arguments"]) == {"city": "Paris", "days": 1}, m)


def t_edited_tool_call(s, tr):
    """The client changes a call's arguments under its id: its call is
    rendered (canonically), not the remembered sampled bytes."""
    body = {"messages": USER, "tools": TOOLS, "thinking": False}
    st, b = s.post(C, body, headers=force("weather_call"))
    call = b["choices"][0]["message"]["tool_calls"][0]
    before = s.stats()["tool_memory"]
    edited = dict(call, function={"name": "get_weather", "arguments": json.dumps({"city": "Rome", "days": 3})})
    msgs = USER + [{"role": "assistant", "content": None, "tool_calls": [edited]},
                   {"role": "tool", "tool_call_id": call["id"], "content": "rainy"}]
    st, b2 = s.post(C, dict(body, messages=msgs, max_tokens=2))
    after = s.stats()["tool_memory"]
    check(after["history_turns_replayed_exact"] == before["history_turns_replayed_exact"], (before, after))
    check(after["history_turns_rendered_canonical"] == before["history_turns_rendered_canonical"] + 1, (before, after))
    prompt = tr.prompt(b2["id"])
    check('name="city" string="true">Rome<' in prompt and ">Paris<" not in prompt, prompt[-600:])
    # Unchanged (only respelled): the sampled bytes.
    same = dict(call, function={"name": "get_weather", "arguments": json.dumps({"days": 3, "city": "Paris"})})
    msgs[1] = {"role": "assistant", "content": None, "tool_calls": [same]}
    s.post(C, dict(body, messages=msgs, max_tokens=2))
    check(s.stats()["tool_memory"]["history_turns_replayed_exact"] == before["history_turns_replayed_exact"] + 1,
          s.stats()["tool_memory"])


PLACEHOLDER = "[image not shown: this model reads text only]"
PNG = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5ErkJggg=="


def t_nul_and_images(s, tr):
    """A NUL in a tool output and images in the history: accepted, and they
    keep working in later requests; the prompt shows \\u0000 and a
    placeholder that says an image was there, the same in every API."""
    st, b = s.post(C, {"messages": USER, "tools": TOOLS, "thinking": False}, headers=force("weather_call"))
    call = b["choices"][0]["message"]["tool_calls"][0]
    msgs = USER + [{"role": "assistant", "content": None, "tool_calls": [call]},
                   {"role": "tool", "tool_call_id": call["id"], "content": "PNG\u0000\u0001binary"}]
    for turn in range(2):
        st, b2 = s.post(C, {"messages": msgs, "tools": TOOLS, "thinking": False, "max_tokens": 2})
        check(st == 200, (st, b2))
        check("PNG\\u0000\u0001binary" in tr.prompt(b2["id"]), tr.prompt(b2["id"])[-300:])
        msgs = msgs + [{"role": "assistant", "content": chat_text(b2)}, {"role": "user", "content": "and then?"}]
    url = "data:image/png;base64," + PNG
    cases = [
        (C, {"messages": [{"role": "user", "content": [{"type": "text", "text": "What is this?"},
                                                       {"type": "image_url", "image_url": {"url": url}}]}],
             "max_tokens": 2}),
        (R, {"input": [{"role": "user", "content": [{"type": "input_text", "text": "What is this?"},
                                                    {"type": "input_image", "image_url": url}]}], "max_output_tokens": 2}),
        (M, {"messages": [{"role": "user", "content": [
            {"type": "text", "text": "What is this?"},
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PNG}}]}], "max_tokens": 2}),
        (M, {"messages": [{"role": "user", "content": "Screenshot?"},
                          {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_x", "name": "get_weather",
                                                             "input": {"city": "Paris"}}]},
                          {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_x", "content": [
                              {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PNG}}]}]}],
             "tools": M_TOOLS, "max_tokens": 2}),
    ]
    for path, body in cases:
        st, b = s.post(path, body)
        check(st == 200 and PLACEHOLDER in tr.prompt(b["id"]), (path, st, b))


def raw_request(port, body, stream=False):
    data = json.dumps(dict(body, stream=stream)).encode()
    return (b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b"Connection: close\r\nContent-Length: %d\r\n\r\n" % len(data)) + data


def t_half_close(s, tr):
    """A client that closes its sending side after the request still reads
    the answer, streaming or not."""
    body = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 20, "thinking": False}
    for stream in (False, True):
        sock = socket.create_connection(("127.0.0.1", s.port), timeout=30)
        sock.sendall(raw_request(s.port, body, stream))
        sock.shutdown(socket.SHUT_WR)
        got = b""
        while True:
            b = sock.recv(65536)
            if not b:
                break
            got += b
        sock.close()
        check(got.startswith(b"HTTP/1.1 200"), got[:200])
        if stream:
            check(b"data: [DONE]" in got and b'"finish_reason":"length"' in got, got[-300:])
        else:
            check(b'"finish_reason":"length"' in got, got[-300:])


def t_tool_choice(s, tr):
    """none: no call, whatever the model wants; required and named: the
    answer starts with a call (of that tool); parallel_tool_calls false:
    one call.  The same in the three chat APIs."""
    for path, body in ((C, {"messages": USER, "tools": TOOLS, "thinking": False, "tool_choice": "none"}),
                       (R, {"input": USER, "tools": R_TOOLS, "reasoning": {"effort": "none"}, "tool_choice": "none"}),
                       (M, {"messages": USER, "tools": M_TOOLS, "thinking": {"type": "disabled"}, "max_tokens": 40,
                            "tool_choice": {"type": "none"}})):
        st, b = s.post(path, dict(body, max_tokens=40) if path != R else dict(body, max_output_tokens=40),
                       headers=force("weather_call"))
        check(st == 200, (path, st, b))
        if path == C:
            check("tool_calls" not in b["choices"][0]["message"] and "DSML" not in chat_text(b), b)
        elif path == R:
            check(all(o["type"] == "message" for o in b["output"]) and "DSML" not in responses_text(b), b)
        else:
            check(all(c["type"] == "text" for c in b["content"]) and "DSML" not in messages_text(b), b)
        check(D not in tr.generated(b["id"]), tr.generated(b["id"]))
    opening = "\n\n<%stool_calls>\n<%sinvoke name=\"" % (D, D)
    for path, body, want in (
            (C, {"messages": USER, "tools": TOOLS, "thinking": False, "tool_choice": "required"}, None),
            (C, {"messages": USER, "tools": TOOLS, "thinking": False,
                 "tool_choice": {"type": "function", "function": {"name": "get_time"}}}, "get_time"),
            (R, {"input": USER, "tools": R_TOOLS, "reasoning": {"effort": "none"}, "tool_choice": "required"}, None),
            (R, {"input": USER, "tools": R_TOOLS, "reasoning": {"effort": "none"},
                 "tool_choice": {"type": "function", "name": "get_time"}}, "get_time"),
            (M, {"messages": USER, "tools": M_TOOLS, "thinking": {"type": "disabled"}, "tool_choice": {"type": "any"}}, None),
            (M, {"messages": USER, "tools": M_TOOLS, "thinking": {"type": "disabled"},
                 "tool_choice": {"type": "tool", "name": "get_time"}}, "get_time")):
        # (the tiny model may spell the markers byte by byte: room for that)
        limit = {"max_output_tokens": 90} if path == R else {"max_tokens": 90}
        st, b = s.post(path, dict(body, **limit), headers=force("answer"))
        gen = tr.generated(b["id"])
        check(gen.startswith(opening), (path, gen[:200]))
        name = gen[len(opening):].split('"', 1)[0]
        check(name == want if want else name in ("get_weather", "get_time"), (path, gen[:200]))
    # A named tool the model was about to call another: the name is the one asked for.
    st, b = s.post(C, {"messages": USER, "tools": TOOLS, "thinking": False, "max_tokens": 90,
                       "tool_choice": {"type": "function", "function": {"name": "get_time"}}}, headers=force("weather_call"))
    check(tr.generated(b["id"]).startswith(opening + 'get_time">'), tr.generated(b["id"])[:200])
    # One call when parallel calls are off.
    st, b = s.post(C, {"messages": USER, "tools": TOOLS, "thinking": False, "parallel_tool_calls": False},
                   headers=force("two_calls"))
    calls = b["choices"][0]["message"]["tool_calls"]
    check(len(calls) == 1 and b["choices"][0]["finish_reason"] == "tool_calls", b)
    check(tr.generated(b["id"]).endswith("</%sinvoke>\n</%stool_calls>" % (D, D)), tr.generated(b["id"])[-200:])
    st, b = s.post(R, {"input": USER, "tools": R_TOOLS, "reasoning": {"effort": "none"}, "parallel_tool_calls": False},
                   headers=force("two_calls"))
    check([o["type"] for o in b["output"]] == ["message", "function_call"] and b["parallel_tool_calls"] is False, b)
    st, b = s.post(M, {"messages": USER, "tools": M_TOOLS, "thinking": {"type": "disabled"}, "max_tokens": 200,
                       "tool_choice": {"type": "auto", "disable_parallel_tool_use": True}}, headers=force("two_calls"))
    check(sum(c["type"] == "tool_use" for c in b["content"]) == 1 and b["stop_reason"] == "tool_use", b)
    # Refusals name the field.
    st, b = s.post(C, {"messages": USER, "tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}})
    check(st == 400 and 'no tool named "nope"' in b["error"]["message"], b)
    st, b = s.post(C, {"messages": USER, "tool_choice": "required"})
    check(st == 400 and "no tools" in b["error"]["message"], b)


def fits(text):
    v = json.loads(text)
    return isinstance(v, dict) and set(v) == {"ok", "mood"} and isinstance(v["ok"], bool) and v["mood"] in ("calm", "angry")


def t_response_format(s, tr):
    """JSON answers by constrained decoding: the model wanted prose, the
    answer is JSON of the schema; what cannot be enforced is refused."""
    rf = {"type": "json_schema", "json_schema": {"name": "r", "strict": True, "schema": OK_SCHEMA}}
    st, b = s.post(C, {"messages": USER, "thinking": False, "temperature": 0, "max_tokens": 100, "response_format": rf},
                   headers=force("answer"))
    check(st == 200 and b["choices"][0]["finish_reason"] == "stop" and fits(chat_text(b)), b)
    check("## Response Format" in tr.prompt(b["id"]), tr.prompt(b["id"])[:400])
    ev = s.stream(C, {"messages": USER, "thinking": False, "temperature": 0, "max_tokens": 100, "response_format": rf,
                      "stream": True}, headers=force("answer"))
    text = "".join(d["choices"][0]["delta"].get("content") or "" for e, d in ev if e != ":" and d != "[DONE]" and d["choices"])
    check(fits(text), text)
    st, b = s.post(R, {"input": USER, "reasoning": {"effort": "none"}, "temperature": 0, "max_output_tokens": 100,
                       "text": {"format": {"type": "json_schema", "name": "r", "schema": OK_SCHEMA}}}, headers=force("answer"))
    check(st == 200 and b["status"] == "completed" and fits(responses_text(b)), b)
    check(b["text"]["format"]["type"] == "json_schema", b["text"])
    st, b = s.post(M, {"messages": USER, "thinking": {"type": "disabled"}, "temperature": 0, "max_tokens": 100,
                       "output_format": {"type": "json_schema", "schema": OK_SCHEMA}}, headers=force("answer"))
    check(st == 200 and b["stop_reason"] == "end_turn" and fits(messages_text(b)), b)
    # Thinking: the reasoning is free, the answer after </think> is JSON.
    st, b = s.post(C, {"messages": USER, "temperature": 0, "max_tokens": 100, "response_format": rf},
                   headers=force("answer_think"))
    m = b["choices"][0]["message"]
    check(m["reasoning_content"] == "The tool said sunny." and fits(m["content"]), m)
    st, b = s.post(C, {"messages": USER, "thinking": False, "temperature": 0, "max_tokens": 150,
                       "response_format": {"type": "json_object"}}, headers=force("answer"))
    text = chat_text(b)
    check(not text.startswith("It is") and text.lstrip().startswith("{"), text)
    if b["choices"][0]["finish_reason"] == "stop":
        check(isinstance(json.loads(text), dict), text)
    for path, body, field in ((C, {"messages": USER, "response_format": {"type": "json_schema", "json_schema": {
            "name": "r", "schema": {"type": "string", "pattern": "^a"}}}}, "response_format.json_schema.schema"),
                              (R, {"input": "x", "text": {"format": {"type": "json_schema", "name": "r", "schema": {
                                  "type": "integer", "minimum": 1}}}}, "text.format.schema"),
                              (M, {"messages": USER, "max_tokens": 5, "output_format": {"type": "json_schema", "schema": {
                                  "type": "object", "properties": {"a": {"type": "string", "pattern": "x"}}}}},
                               "output_format.schema")):
        st, b = s.post(path, body)
        msg = (b.get("error") or {}).get("message", "")
        check(st == 400 and field in msg and "is not supported" in msg, (path, st, b))


def t_logprobs(s, tr):
    """logprobs in chat (streaming and not), completions and Responses."""
    body = {"messages": [{"role": "user", "content": "Hi"}], "thinking": False, "max_tokens": 8, "temperature": 0,
            "logprobs": True, "top_logprobs": 3}
    st, b = s.post(C, body)
    lp = b["choices"][0]["logprobs"]["content"]
    check(len(lp) == 8 and "".join(e["token"] for e in lp) == chat_text(b), (lp, chat_text(b)))
    for e in lp:
        check(e["logprob"] <= 0 and len(e["top_logprobs"]) == 3 and bytes(e["bytes"]).decode() == e["token"], e)
        check(e["top_logprobs"][0]["logprob"] >= e["logprob"] - 1e-5, e)  # greedy: the chosen one is the top one
        check(e["top_logprobs"][0]["token"] == e["token"], e)
    ev = s.stream(C, dict(body, stream=True))
    chunks = [d for e, d in ev if e != ":" and d != "[DONE]" and d["choices"]]
    tokens = "".join(e["token"] for d in chunks if d["choices"][0]["logprobs"] for e in d["choices"][0]["logprobs"]["content"])
    check(tokens == chat_text(b), (tokens, chat_text(b)))
    st, b = s.post(C, dict(body, logprobs=False, top_logprobs=None))
    check(b["choices"][0]["logprobs"] is None, b)
    st, b = s.post(C, dict(body, logprobs=None, top_logprobs=2))
    check(st == 400 and "top_logprobs needs logprobs" in b["error"]["message"], b)
    st, b = s.post(P, {"prompt": "Hi", "thinking": False, "max_tokens": 5, "temperature": 0, "logprobs": 2})
    lp = b["choices"][0]["logprobs"]
    check("".join(lp["tokens"]) == b["choices"][0]["text"] and len(lp["top_logprobs"][0]) <= 2, lp)
    check(lp["text_offset"][0] == 0 and all(x <= 0 for x in lp["token_logprobs"]), lp)
    st, b = s.post(P, {"prompt": ["a", "b"], "max_tokens": 2})
    check(st == 400 and "2 prompts in one request" in b["error"]["message"], b)
    st, b = s.post(R, {"input": "Hi", "reasoning": {"effort": "none"}, "max_output_tokens": 5, "temperature": 0,
                       "top_logprobs": 2, "include": ["message.output_text.logprobs"]})
    part = b["output"][0]["content"][0]
    check(len(part["logprobs"]) == 5 and "".join(e["token"] for e in part["logprobs"]) == part["text"], part)
    ev = s.stream(R, {"input": "Hi", "reasoning": {"effort": "none"}, "max_output_tokens": 5, "stream": True})
    text_events = [d for e, d in ev if e != ":" and d["type"] in ("response.output_text.delta", "response.output_text.done")]
    check(text_events and all(d["logprobs"] == [] for d in text_events), text_events)


def t_codex_tools(s, tr):
    """Codex CLI's Responses tools and history items."""
    grammar = 'start: begin_patch hunk+ end_patch\nbegin_patch: "*** Begin Patch" LF\n'
    tools = [{"type": "custom", "name": "apply_patch", "description": "Edit files with a patch.",
              "format": {"type": "grammar", "syntax": "lark", "definition": grammar}},
             {"type": "namespace", "name": "mcp__fs__", "description": "File system",
              "tools": [{"type": "function", "name": "read_file", "description": "Read a file",
                         "parameters": {"type": "object", "properties": {"path": {"type": "string"}}}}]},
             {"type": "tool_search", "execution": "client", "description": "Find more tools",
              "parameters": {"type": "object", "properties": {"query": {"type": "string"}}}},
             {"type": "web_search"}]
    base = {"instructions": "You are Codex.", "tools": tools, "reasoning": {"effort": "none"}}
    inp = [{"role": "user", "content": "Add hello.txt"}]
    patch = "*** Begin Patch\n*** Add File: hello.txt\n+hello\n*** End Patch"
    st, b = s.post(R, dict(base, input=inp), headers=force("custom_call"))
    item = b["output"][-1]
    check(item["type"] == "custom_tool_call" and item["name"] == "apply_patch" and item["input"] == patch, b)
    prompt = tr.prompt(b["id"])
    check('"name": "apply_patch"' in prompt and "lark grammar" in prompt and "begin_patch hunk+" in prompt, prompt[:3000])
    check('"name": "mcp__fs__read_file"' in prompt and '"name": "tool_search"' in prompt, prompt[:3000])
    ev = s.stream(R, dict(base, input=inp, stream=True), headers=force("custom_call"))
    types = [d["type"] for e, d in ev if e != ":"]
    check("response.custom_tool_call_input.delta" in types and "response.custom_tool_call_input.done" in types, types)
    done = [d for e, d in ev if e != ":" and d["type"] == "response.custom_tool_call_input.done"][0]
    check(done["input"] == patch, done)
    # The client replays the call and its output: the sampled bytes come back.
    before = s.stats()["tool_memory"]["history_turns_replayed_exact"]
    replay = inp + [item, {"type": "custom_tool_call_output", "call_id": item["call_id"], "output": "Done!"}]
    st, b2 = s.post(R, dict(base, input=replay, max_output_tokens=2))
    check(st == 200 and s.stats()["tool_memory"]["history_turns_replayed_exact"] == before + 1, (st, b2))
    # A namespaced function comes back as the client named it.
    st, b = s.post(R, dict(base, input=inp), headers=force("namespaced_call"))
    item = b["output"][-1]
    check(item["type"] == "function_call" and item["name"] == "read_file" and item["namespace"] == "mcp__fs__", b)
    check(json.loads(item["arguments"]) == {"path": "/etc/hostname"}, item)
    before = s.stats()["tool_memory"]["history_turns_replayed_exact"]
    replay = inp + [item, {"type": "function_call_output", "call_id": item["call_id"], "output": "box"}]
    st, b2 = s.post(R, dict(base, input=replay, max_output_tokens=2))
    check(st == 200 and s.stats()["tool_memory"]["history_turns_replayed_exact"] == before + 1, (st, b2))
    # The hosted tool_search, run by the client.
    st, b = s.post(R, dict(base, input=inp), headers=force("search_call"))
    item = b["output"][-1]
    check(item["type"] == "tool_search_call" and item["execution"] == "client" and
          item["arguments"] == {"query": "file tools"}, b)
    # History items of hosted tools, and tools a search found.
    found = {"type": "function", "name": "write_file", "description": "Write a file",
             "parameters": {"type": "object", "properties": {"path": {"type": "string"}}}}
    history = inp + [
        {"type": "local_shell_call", "call_id": "call_sh", "status": "completed",
         "action": {"type": "exec", "command": ["ls", "-la"]}},
        {"type": "local_shell_call_output", "call_id": "call_sh", "output": "total 0"},
        {"type": "web_search_call", "id": "ws_1", "status": "completed", "action": {"type": "search", "query": "ds4"}},
        {"type": "image_generation_call", "id": "ig_1", "status": "completed", "result": PNG},
        {"type": "tool_search_call", "call_id": "call_ts", "status": "completed", "execution": "client",
         "arguments": {"query": "write"}},
        {"type": "tool_search_output", "call_id": "call_ts", "status": "completed", "execution": "client",
         "tools": [found]},
        {"role": "user", "content": "Now write it."}]
    st, b = s.post(R, dict(base, input=history, max_output_tokens=2))
    check(st == 200, (st, b))
    prompt = tr.prompt(b["id"])
    for needle in ('invoke name="local_shell"', "total 0", 'invoke name="web_search_call"', 'invoke name="tool_search"',
                   '"name": "write_file"'):
        check(needle in prompt, (needle, prompt[-2000:]))


def t_thinking_sampling(s, tr):
    """While the model thinks: ds4's defaults (temperature 1), so seeds
    differ even at temperature 0; the client's temperature 0 applies to the
    answer after </think>."""
    body = {"messages": [{"role": "user", "content": "Think about it."}], "temperature": 0, "max_tokens": 12}
    r1 = s.post(C, dict(body, seed=1))[1]["choices"][0]["message"]["reasoning_content"]
    r2 = s.post(C, dict(body, seed=2))[1]["choices"][0]["message"]["reasoning_content"]
    check(r1 != r2, (r1, r2))
    a1 = s.post(C, dict(body, seed=1, max_tokens=30), headers=force("think_only"))[1]["choices"][0]["message"]
    a2 = s.post(C, dict(body, seed=2, max_tokens=30), headers=force("think_only"))[1]["choices"][0]["message"]
    check(a1["content"] == a2["content"] and a1["content"], (a1, a2))
    off = dict(body, thinking=False)
    c1 = chat_text(s.post(C, dict(off, seed=1))[1])
    c2 = chat_text(s.post(C, dict(off, seed=2))[1])
    check(c1 == c2, (c1, c2))
    # --client-sampling-in-thinking: the client's temperature 0 while thinking too.
    with Server("--client-sampling-in-thinking", second=True) as s2:
        r1 = s2.post(C, dict(body, seed=1))[1]["choices"][0]["message"]["reasoning_content"]
        r2 = s2.post(C, dict(body, seed=2))[1]["choices"][0]["message"]["reasoning_content"]
        check(r1 == r2, (r1, r2))


def t_stats_counters():
    """Every queued job ends in exactly one outcome; token counters add up
    the answers' usage; tool-memory counters count the history turns of
    queued requests only."""
    with Server("--sse-keepalive-ms", "100") as s:
        usage = []
        st, b = s.post(C, {"messages": USER, "tools": TOOLS, "thinking": False}, headers=force("weather_call"))
        usage.append(b["usage"])
        call = b["choices"][0]["message"]["tool_calls"][0]
        msgs = USER + [{"role": "assistant", "content": None, "tool_calls": [call]},
                       {"role": "tool", "tool_call_id": call["id"], "content": "sunny"}]
        st, b = s.post(C, {"messages": msgs, "tools": TOOLS, "thinking": False, "max_tokens": 3})
        usage.append(b["usage"])
        st, b = s.post(C, {"messages": USER, "tools": TOOLS, "thinking": False}, headers=force("unterminated_call"))
        check(st == 500, b)
        st, b = s.post(R, {"input": [{"type": "function_call_output", "call_id": call["id"], "output": "x"}],
                           "tools": R_TOOLS})
        check(st == 400, b)  # not a Responses call: refused before the queue
        # count_tokens renders the same history: it moves no tool counter
        st, b = s.post("/v1/messages/count_tokens", {"messages": [
            {"role": "user", "content": "q"}, {"role": "assistant", "content": [
                {"type": "tool_use", "id": call["id"], "name": "get_weather", "input": {"city": "Paris"}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call["id"], "content": "x"}]}]})
        check(st == 200, b)
        # a cancelled stream
        sock = socket.create_connection(("127.0.0.1", s.port))
        sock.sendall(raw_request(s.port, {"messages": [{"role": "user", "content": "Long"}], "max_tokens": 3000,
                                          "thinking": False}, stream=True))
        sock.recv(4096)
        time.sleep(0.3)
        sock.close()
        deadline = time.time() + 10
        while time.time() < deadline and (s.stats()["jobs"]["running"] or s.stats()["jobs"]["waiting"]):
            time.sleep(0.05)
        j = s.stats()
        jobs = j["jobs"]
        check(jobs["queued"] == 4 and jobs["answered"] == 2 and jobs["failed"] == 1 and jobs["cancelled"] == 1, jobs)
        check(jobs["queued"] == jobs["answered"] + jobs["failed"] + jobs["cancelled"] + jobs["continuation_lost"], jobs)
        check(j["tokens"]["prompt"] >= sum(u["prompt_tokens"] for u in usage), (j["tokens"], usage))
        check(j["tool_memory"]["history_turns_replayed_exact"] == 1, j["tool_memory"])
        check(j["tool_memory"]["history_turns_rendered_canonical"] == 0, j["tool_memory"])
        check(sum(j["prompts_by_kv_source"].values()) == jobs["answered"] + jobs["failed"] + jobs["cancelled"], j)
        check(j["last_prompt"]["reused"] + j["last_prompt"]["prefilled"] > 0, j["last_prompt"])


# ---------------------------------------------------------------- runner

def run_case(fn, *args):
    t0 = time.time()
    try:
        fn(*args)
    except Exception:  # noqa: BLE001 - every kind of failure is reported the same way
        if not os.environ.get("DS4_TEST_KEEP_GOING"):
            raise
        FAILED.append(fn.__name__)
        print("FAIL %-26s\n%s" % (fn.__name__, traceback.format_exc(limit=3)), flush=True)
        return
    PASSED.append(fn.__name__)
    print("ok %-26s %.2fs" % (fn.__name__, time.time() - t0), flush=True)


def main():
    path = tempfile.mktemp(prefix="ds4-trace-")
    try:
        with Server("--trace", path) as s:
            tr = Trace(path)
            for fn in (t_truncated_tool_call, t_edited_tool_call, t_nul_and_images, t_half_close, t_tool_choice,
                       t_response_format, t_logprobs, t_codex_tools, t_thinking_sampling):
                run_case(fn, s, tr)
        run_case(t_stats_counters)
    finally:
        if os.path.exists(path):
            os.unlink(path)
    print("%d passed, %d failed%s" % (len(PASSED), len(FAILED), (": " + " ".join(FAILED)) if FAILED else ""))
    sys.exit(1 if FAILED else 0)


if __name__ == "__main__":
    main()
