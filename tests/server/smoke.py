"""smoke.py - end-to-end tests of ds4-server with the Python standard library
only (part of the default suite through tests/suite/server_smoke.sh).

Each endpoint streaming and not, thinking on and off; tool definitions ->
tool call -> tool result -> answer in all three chat APIs (forced model
output drives the real DSML parser and mapping); exact DSML replay and
prefix reuse proven by the counters; disk KV cache reuse after a restart
with identical greedy output; stop sequences; malformed DSML; error shapes
and statuses for bad requests; auth, CORS, body limits; client disconnects
cancel the work; keepalive comments while a request waits.

Every server here runs one session (--parallel 1): these cases pin down the
reuse ladder of a session and the queue in front of it, which a server of
many sessions runs per session (parallel.py covers many sessions at once).
"""
import json
import os
import shutil
import subprocess
import socket
import struct
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(__file__))
from harness import ROOT, TOKENIZER, Server as AnyServer, parse_sse  # noqa: E402


def Server(*args, **kw):
    """A ds4-server of one session (see above)."""
    return AnyServer("--parallel", "1", *args, **kw)


PASSED = []

TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Weather for a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                   "required": ["city"]}}}]
ANTHROPIC_TOOLS = [{"name": "get_weather", "description": "Weather for a city",
                    "input_schema": TOOLS[0]["function"]["parameters"]}]
RESPONSES_TOOLS = [{"type": "function", "name": "get_weather", "description": "Weather for a city",
                    "parameters": TOOLS[0]["function"]["parameters"]}]
SYSTEM = "You are a weather assistant. Answer briefly."
WEATHER = {"city": "Paris", "days": 3}


def check(cond, msg):
    if not cond:
        raise AssertionError(msg)


def test(fn):
    t0 = time.time()
    fn()
    PASSED.append(fn.__name__)
    print("ok %-40s %.2fs" % (fn.__name__, time.time() - t0), flush=True)
    return fn


def wait_running(s, timeout=30):
    deadline = time.time() + timeout
    while time.time() < deadline and not s.stats()["jobs"]["running"]:
        time.sleep(0.01)
    check(s.stats()["jobs"]["running"], "the worker never started the request")


def force(name):
    return {"X-DS4-Test-Output": name}


# ---------------------------------------------------------------- endpoints

def t_models(s):
    st, body = s.get("/v1/models")
    check(st == 200 and body["object"] == "list" and body["data"][0]["id"] == "deepseek-v4-flash", body)
    st, body = s.get("/v1/models/deepseek-v4-flash")
    check(st == 200 and body["context_length"] == 4096, body)
    check(body["owned_by"] == "ds4.c" and body["created"] == 1767225600 and body["object"] == "model", body)
    check(body["top_provider"] == {"context_length": 4096, "max_completion_tokens": 4096, "is_moderated": False}, body)
    st, body = s.get("/v1/models/nope")
    check(st == 404 and body["error"]["type"] == "not_found_error", body)


def t_count_tokens(s):
    st, b = s.post("/v1/messages/count_tokens", {"messages": [{"role": "user", "content": "Hi"}],
                                                  "thinking": {"type": "disabled"}})
    # BOS, <｜User｜>, "Hi", <｜Assistant｜>, </think>
    check(st == 200 and b == {"input_tokens": 5}, b)
    st, b = s.post("/v1/messages/count_tokens", {"messages": [{"role": "user", "content": "word " * 5000}]})
    check(st == 200 and b["input_tokens"] > 4096, b)
    st, b = s.post("/v1/messages/count_tokens", {"messages": 5})
    check(st == 400 and b["type"] == "error", b)


def t_chat_plain(s):
    for think in (False, True):
        st, b = s.post("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 6,
                                                "temperature": 0, "thinking": think})
        check(st == 200 and b["object"] == "chat.completion", b)
        msg = b["choices"][0]["message"]
        check(b["choices"][0]["finish_reason"] == "length" and b["usage"]["completion_tokens"] == 6, b)
        if think:
            check("reasoning_content" in msg, b)
        else:
            check("reasoning_content" not in msg and isinstance(msg["content"], str), b)
    # Streaming, with usage.
    ev = s.stream("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 5,
                                           "stream": True, "stream_options": {"include_usage": True}})
    data = [d for e, d in ev if e != ":"]
    check(data[-1] == "[DONE]", data[-3:])
    check(data[0]["choices"][0]["delta"]["role"] == "assistant", data[0])
    check(data[-2]["choices"] == [] and data[-2]["usage"]["completion_tokens"] == 5, data[-2])
    check(data[-3]["choices"][0]["finish_reason"] == "length", data[-3])


def t_greedy_is_deterministic(s):
    body = {"messages": [{"role": "user", "content": "Tell me a story"}], "max_tokens": 12, "temperature": 0,
            "thinking": False}
    a = s.post("/v1/chat/completions", body)[1]["choices"][0]["message"]["content"]
    b = s.post("/v1/chat/completions", body)[1]["choices"][0]["message"]["content"]
    last = s.stats()["last_prompt"]
    check(last["kv_source"] == "memory-checkpoint" and last["prefilled"] == 0, last)  # a retry prefills nothing
    body["stream"] = True
    c = "".join(d["choices"][0]["delta"].get("content", "") for e, d in s.stream("/v1/chat/completions", body)
                if e != ":" and d != "[DONE]" and d["choices"])
    check(a == b == c and len(a) > 0, (a, b, c))


def t_completions(s):
    st, b = s.post("/v1/completions", {"prompt": "Once", "max_tokens": 4, "thinking": False, "temperature": 0})
    check(st == 200 and b["object"] == "text_completion" and b["choices"][0]["finish_reason"] == "length", b)
    ev = s.stream("/v1/completions", {"prompt": ["Once"], "max_tokens": 4, "stream": True, "temperature": 0,
                                      "thinking": False})
    text = "".join(d["choices"][0]["text"] for e, d in ev if e != ":" and d != "[DONE]")
    check(text == b["choices"][0]["text"], (text, b))
    # Thinking: the raw text carries the reasoning and </think>.
    st, b = s.post("/v1/completions", {"prompt": "Once"}, headers=force("answer_think"))
    check(b["choices"][0]["text"] == "The tool said sunny.</think>It is sunny in Paris, 21 degrees.", b)


def t_responses(s):
    st, b = s.post("/v1/responses", {"input": "Hi", "max_output_tokens": 5, "reasoning": {"effort": "none"}})
    check(st == 200 and b["object"] == "response" and b["status"] == "incomplete", b)
    check(b["output"][0]["type"] == "message" and b["usage"]["output_tokens"] == 5, b)
    # Reasoning summary only when asked for.
    st, b = s.post("/v1/responses", {"input": "Hi", "reasoning": {"summary": "auto"}}, headers=force("answer_think"))
    check([o["type"] for o in b["output"]] == ["reasoning", "message"], b)
    check(b["output"][0]["summary"][0]["text"] == "The tool said sunny." and b["status"] == "completed", b)
    st, b = s.post("/v1/responses", {"input": "Hi"}, headers=force("answer_think"))
    check([o["type"] for o in b["output"]] == ["message"], b)
    ev = s.stream("/v1/responses", {"input": [{"role": "user", "content": [{"type": "input_text", "text": "Hi"}]}],
                                    "stream": True, "reasoning": {"summary": "auto"}}, headers=force("answer_think"))
    types = [d["type"] for e, d in ev if e != ":"]
    check(types[0] == "response.created" and types[-1] == "response.completed", types)
    seqs = [d["sequence_number"] for e, d in ev if e != ":"]
    check(seqs == list(range(len(seqs))), seqs)
    check("response.reasoning_summary_text.delta" in types and "response.output_text.delta" in types, types)
    final = [d for e, d in ev if e != ":"][-1]["response"]
    text = "".join(d["delta"] for e, d in ev if e != ":" and d["type"] == "response.output_text.delta")
    check(final["output"][1]["content"][0]["text"] == text == "It is sunny in Paris, 21 degrees.", final)


def t_messages(s):
    st, b = s.post("/v1/messages", {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 5,
                                    "thinking": {"type": "disabled"}})
    check(st == 200 and b["type"] == "message" and b["stop_reason"] == "max_tokens", b)
    check([c["type"] for c in b["content"]] == ["text"], b)
    st, b = s.post("/v1/messages", {"system": [{"type": "text", "text": "Be nice."}],
                                    "messages": [{"role": "user", "content": [{"type": "text", "text": "Hi"}]}],
                                    "max_tokens": 100}, headers=force("answer_think"))
    check([c["type"] for c in b["content"]] == ["thinking", "text"] and b["stop_reason"] == "end_turn", b)
    check(b["content"][0]["signature"] == b["id"], b)
    ev = s.stream("/v1/messages", {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 100,
                                   "stream": True}, headers=force("answer_think"))
    names = [e for e, d in ev if e != ":"]
    check(names[0] == "message_start" and names[-2:] == ["message_delta", "message_stop"], names)
    deltas = [d["delta"] for e, d in ev if e == "content_block_delta"]
    check(any(x["type"] == "signature_delta" for x in deltas), deltas)
    text = "".join(x.get("text", "") for x in deltas)
    check(text == "It is sunny in Paris, 21 degrees.", text)


# ---------------------------------------------------------------- tool calls

def t_chat_tools(s):
    msgs = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Weather in Paris?"}]
    st, b = s.post("/v1/chat/completions", {"messages": msgs, "tools": TOOLS, "thinking": False},
                   headers=force("weather_call"))
    check(st == 200 and b["choices"][0]["finish_reason"] == "tool_calls", b)
    m = b["choices"][0]["message"]
    call = m["tool_calls"][0]
    check(call["id"].startswith("call_") and len(call["id"]) == 37, call)
    check(call["function"]["name"] == "get_weather" and json.loads(call["function"]["arguments"]) == WEATHER, call)
    before = s.stats()
    # The client re-orders the arguments: exact replay makes that irrelevant.
    call2 = dict(call, function={"name": "get_weather", "arguments": json.dumps({"days": 3, "city": "Paris"})})
    msgs2 = msgs + [{"role": "assistant", "content": None, "tool_calls": [call2]},
                    {"role": "tool", "tool_call_id": call["id"], "content": "sunny, 21C"}]
    st, b2 = s.post("/v1/chat/completions", {"messages": msgs2, "tools": TOOLS, "thinking": False},
                    headers=force("answer"))
    check(b2["choices"][0]["message"]["content"] == "It is sunny in Paris, 21 degrees.", b2)
    check(b2["choices"][0]["finish_reason"] == "stop", b2)
    after = s.stats()
    check(after["tool_memory"]["history_turns_replayed_exact"] == before["tool_memory"]["history_turns_replayed_exact"] + 1, after)
    # Prompt 1 and the sampled call stay in the KV state: only the tool turn is prefilled.
    u = b2["usage"]
    check(u["prompt_tokens_details"]["cached_tokens"] >= b["usage"]["prompt_tokens"] + 40, u)
    check(u["prompt_tokens_details"]["cache_write_tokens"] < 30, u)
    check(after["last_prompt"]["kv_source"] in ("memory-token", "memory-text"), after["last_prompt"])
    # Streaming: each call once it is complete (a cut answer never carries a
    # partial call): id and name first, then its arguments.
    ev = s.stream("/v1/chat/completions", {"messages": msgs, "tools": TOOLS, "thinking": False, "stream": True},
                  headers=force("two_calls"))
    data = [d for e, d in ev if e != ":" and d != "[DONE]"]
    content = "".join(d["choices"][0]["delta"].get("content") or "" for d in data)
    check(content == "Let me check both.", content)
    calls = {}
    for d in data:
        for tc in d["choices"][0]["delta"].get("tool_calls", []):
            c = calls.setdefault(tc["index"], {"args": ""})
            if "id" in tc:
                c["id"], c["name"] = tc["id"], tc["function"]["name"]
            c["args"] += tc["function"].get("arguments", "")
    check(len(calls) == 2 and json.loads(calls[0]["args"]) == {"city": "Paris", "days": 1}, calls)
    check(json.loads(calls[1]["args"]) == {"city": "Rome"} and calls[1]["id"] != calls[0]["id"], calls)
    check(sum(1 for d in data for tc in d["choices"][0]["delta"].get("tool_calls", []) if "arguments" in tc["function"]
              and "id" not in tc) == 2, "one arguments delta per call")
    check(data[-1]["choices"][0]["finish_reason"] == "tool_calls", data[-1])
    # Thinking mode: reasoning, then the call.
    st, b = s.post("/v1/chat/completions", {"messages": msgs, "tools": TOOLS}, headers=force("weather_call_think"))
    m = b["choices"][0]["message"]
    check(m["reasoning_content"] == "The user asks about the weather, so I call the tool." and m["tool_calls"], m)


def t_responses_tools(s):
    inp = [{"role": "user", "content": "Weather in Paris?"}]
    st, b = s.post("/v1/responses", {"instructions": SYSTEM, "input": inp, "tools": RESPONSES_TOOLS,
                                     "reasoning": {"effort": "none"}}, headers=force("weather_call"))
    fc = [o for o in b["output"] if o["type"] == "function_call"]
    check(len(fc) == 1 and fc[0]["name"] == "get_weather" and json.loads(fc[0]["arguments"]) == WEATHER, b)
    check(fc[0]["call_id"].startswith("call_") and fc[0]["id"].startswith("fc_"), fc)
    inp2 = inp + [{"type": "function_call", "call_id": fc[0]["call_id"], "name": "get_weather",
                   "arguments": fc[0]["arguments"], "id": fc[0]["id"], "status": "completed"},
                  {"type": "function_call_output", "call_id": fc[0]["call_id"], "output": "sunny, 21C"}]
    st, b2 = s.post("/v1/responses", {"instructions": SYSTEM, "input": inp2, "tools": RESPONSES_TOOLS,
                                      "reasoning": {"effort": "none"}}, headers=force("answer"))
    check(b2["output"][0]["content"][0]["text"] == "It is sunny in Paris, 21 degrees.", b2)
    check(b2["usage"]["input_tokens_details"]["cached_tokens"] > b["usage"]["input_tokens"], b2["usage"])
    ev = s.stream("/v1/responses", {"instructions": SYSTEM, "input": inp, "tools": RESPONSES_TOOLS, "stream": True,
                                    "reasoning": {"effort": "none"}}, headers=force("two_calls"))
    data = [d for e, d in ev if e != ":"]
    args = {}
    for d in data:
        if d["type"] == "response.function_call_arguments.delta":
            args[d["output_index"]] = args.get(d["output_index"], "") + d["delta"]
    final = data[-1]["response"]
    check([o["type"] for o in final["output"]] == ["message", "function_call", "function_call"], final["output"])
    check(json.loads(args[1]) == {"city": "Paris", "days": 1} and json.loads(args[2]) == {"city": "Rome"}, args)
    check(final["output"][1]["arguments"] == args[1], final)


def t_messages_tools(s):
    msgs = [{"role": "user", "content": "Weather in Paris?"}]
    st, b = s.post("/v1/messages", {"system": SYSTEM, "messages": msgs, "tools": ANTHROPIC_TOOLS, "max_tokens": 200,
                                    "thinking": {"type": "disabled"}}, headers=force("weather_call"))
    check(b["stop_reason"] == "tool_use", b)
    tu = [c for c in b["content"] if c["type"] == "tool_use"]
    check(len(tu) == 1 and tu[0]["input"] == WEATHER and tu[0]["id"].startswith("toolu_"), b)
    msgs2 = msgs + [{"role": "assistant", "content": b["content"]},
                    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": tu[0]["id"],
                                                  "content": "sunny, 21C"}]}]
    st, b2 = s.post("/v1/messages", {"system": SYSTEM, "messages": msgs2, "tools": ANTHROPIC_TOOLS, "max_tokens": 200,
                                     "thinking": {"type": "disabled"}}, headers=force("answer"))
    check(b2["content"][0]["text"] == "It is sunny in Paris, 21 degrees." and b2["stop_reason"] == "end_turn", b2)
    check(b2["usage"]["cache_read_input_tokens"] > b["usage"]["cache_creation_input_tokens"], b2["usage"])
    ev = s.stream("/v1/messages", {"system": SYSTEM, "messages": msgs, "tools": ANTHROPIC_TOOLS, "max_tokens": 200,
                                   "stream": True}, headers=force("weather_call_think"))
    starts = [d["content_block"]["type"] for e, d in ev if e == "content_block_start"]
    check(starts == ["thinking", "tool_use"], starts)
    partial = "".join(d["delta"]["partial_json"] for e, d in ev if e == "content_block_delta"
                      and d["delta"]["type"] == "input_json_delta")
    check(json.loads(partial) == WEATHER, partial)
    check([d for e, d in ev if e == "message_delta"][0]["delta"]["stop_reason"] == "tool_use", ev[-2:])


# ---------------------------------------------------------------- KV reuse

def t_prefix_reuse(s):
    msgs = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Describe the sea."}]
    body = {"messages": msgs, "max_tokens": 8, "temperature": 0, "thinking": False}
    first = None
    for turn in range(3):
        st, b = s.post("/v1/chat/completions", body)
        u = b["usage"]
        if turn == 0:
            first = u
        else:
            # Everything up to the previous answer is reused; only the new user turn is prefilled.
            check(u["prompt_tokens_details"]["cached_tokens"] >= prev["prompt_tokens"] + prev["completion_tokens"] - 1, (u, prev))
            check(u["prompt_tokens_details"]["cache_write_tokens"] <= 16, u)
            check(s.stats()["last_prompt"]["kv_source"] in ("memory-token", "memory-text"), s.stats()["last_prompt"])
        prev = u
        msgs = msgs + [{"role": "assistant", "content": b["choices"][0]["message"]["content"]},
                       {"role": "user", "content": "And then? (turn %d)" % turn}]
        body = dict(body, messages=msgs)
    check(first["prompt_tokens_details"]["cached_tokens"] == 0 or True, first)


def t_memory_text(s):
    """Sampled tokens that are not the canonical tokenization of their text:
    the next turn keeps them (byte-prefix match) instead of re-prefilling."""
    msgs = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Describe the sea."}]
    st, b = s.post("/v1/chat/completions", {"messages": msgs, "thinking": False}, headers=force("split_tokens"))
    text = b["choices"][0]["message"]["content"]
    check(text == "The sea is blue and wide. It reflects the sky.", b)
    msgs = msgs + [{"role": "assistant", "content": text}, {"role": "user", "content": "Thanks."}]
    st, b2 = s.post("/v1/chat/completions", {"messages": msgs, "thinking": False, "max_tokens": 2})
    last = s.stats()["last_prompt"]
    check(last["kv_source"] == "memory-text", last)
    check(b2["usage"]["prompt_tokens_details"]["cached_tokens"] == b["usage"]["prompt_tokens"] + b["usage"]["completion_tokens"] - 1,
          (b["usage"], b2["usage"]))


def t_thinking_visible(s):
    """A thinking answer replayed without its reasoning keeps the live state."""
    msgs = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Weather?"}]
    st, b = s.post("/v1/chat/completions", {"messages": msgs}, headers=force("answer_think"))
    m = b["choices"][0]["message"]
    check(m["reasoning_content"] == "The tool said sunny." and m["content"] == "It is sunny in Paris, 21 degrees.", m)
    msgs2 = msgs + [{"role": "assistant", "content": m["content"]}, {"role": "user", "content": "Tomorrow?"}]
    st, b2 = s.post("/v1/chat/completions", {"messages": msgs2, "max_tokens": 2})
    check(s.stats()["last_prompt"]["kv_source"] == "thinking-visible", s.stats()["last_prompt"])
    u1, u2 = b["usage"], b2["usage"]
    check(u2["prompt_tokens_details"]["cached_tokens"] == u1["prompt_tokens"] + u1["completion_tokens"] - 1, (u1, u2))
    check(u2["prompt_tokens_details"]["cache_write_tokens"] < 12, u2)
    # With tools the template keeps reasoning; a client that does not send it back still reuses.
    st, b = s.post("/v1/chat/completions", {"messages": msgs, "tools": TOOLS}, headers=force("weather_call_think"))
    call = b["choices"][0]["message"]["tool_calls"][0]
    msgs3 = msgs + [{"role": "assistant", "content": "", "tool_calls": [call]},
                    {"role": "tool", "tool_call_id": call["id"], "content": "sunny"}]
    st, b3 = s.post("/v1/chat/completions", {"messages": msgs3, "tools": TOOLS, "max_tokens": 2})
    check(s.stats()["last_prompt"]["kv_source"] == "thinking-visible", s.stats()["last_prompt"])
    check(b3["usage"]["prompt_tokens_details"]["cache_write_tokens"] < 25, b3["usage"])
    # Sending the reasoning back is the plain text match.
    msgs4 = msgs + [{"role": "assistant", "content": "", "reasoning_content": b["choices"][0]["message"]["reasoning_content"],
                     "tool_calls": [call]}, {"role": "tool", "tool_call_id": call["id"], "content": "sunny"}]
    st, b = s.post("/v1/chat/completions", {"messages": msgs, "tools": TOOLS}, headers=force("weather_call_think"))
    call = b["choices"][0]["message"]["tool_calls"][0]
    msgs4[2]["tool_calls"] = [call]
    msgs4[3]["tool_call_id"] = call["id"]
    st, b4 = s.post("/v1/chat/completions", {"messages": msgs4, "tools": TOOLS, "max_tokens": 2})
    check(s.stats()["last_prompt"]["kv_source"] in ("memory-token", "memory-text"), s.stats()["last_prompt"])


def evict(s):
    """An unrelated chat request: the live session moves on."""
    st, b = s.post("/v1/chat/completions", {"messages": [{"role": "user", "content": "Unrelated"}], "max_tokens": 2,
                                            "thinking": False})
    check(st == 200 and s.stats()["last_prompt"]["kv_source"] == "cold", s.stats()["last_prompt"])


def responses_text(b):
    return "".join(c["text"] for o in b["output"] if o["type"] == "message" for c in o["content"])


def t_responses_continuations(s):
    """Live protocol continuations of the Responses API: a tool-output-only
    request appends just the tool turn, a replayed transcript keeps the live
    state (hidden reasoning included); both give the greedy answer of a cold
    prefill of the same conversation.  Unknown call ids are refused (400),
    lost state is reported (409)."""
    inp = [{"role": "user", "content": "Weather in Paris?"}]
    base = {"instructions": SYSTEM, "tools": RESPONSES_TOOLS, "reasoning": {"effort": "none"}}
    greedy = {"temperature": 0, "max_output_tokens": 8}

    def call_turn(headers="weather_call", **kw):
        st, b = s.post("/v1/responses", dict(base, input=inp, **kw), headers=force(headers))
        fc = [o for o in b["output"] if o["type"] == "function_call"]
        check(st == 200 and len(fc) == 1, b)
        u = b["usage"]
        return fc[0], u["input_tokens"] + u["output_tokens"] - 1  # the live tokens after it

    def replay(fc):
        return inp + [{"type": "function_call", "call_id": fc["call_id"], "name": fc["name"],
                       "arguments": fc["arguments"]}, output(fc)]

    def output(fc):
        return {"type": "function_call_output", "call_id": fc["call_id"], "output": "sunny, 21C"}

    fc, live = call_turn()
    st, b = s.post("/v1/responses", dict(base, input=[output(fc)], **greedy))
    last = s.stats()["last_prompt"]
    check(st == 200 and last["kv_source"] == "responses-tool-output", (st, b, last))
    u = b["usage"]
    # Kept: the whole live state; prefilled: the call's last token, EOS, <｜User｜>,
    # the tool result, <｜Assistant｜></think>.
    check(u["input_tokens_details"]["cached_tokens"] == live and u["input_tokens_details"]["cache_write_tokens"] < 20, u)
    # A lost state: 409; an id nobody issued: 400.
    evict(s)
    st, e = s.post("/v1/responses", dict(base, input=[output(fc)], **greedy))
    check(st == 409 and "Responses continuation state is not available" in e["error"]["message"], (st, e))
    bad = dict(output(fc), call_id="call_" + "0" * 32)
    st, e = s.post("/v1/responses", dict(base, input=[bad], **greedy))
    check(st == 400 and "not available for call_id call_000" in e["error"]["message"], (st, e))
    st, e = s.post("/v1/responses", dict(base, input=inp + [bad], **greedy))
    check(st == 400 and "replaying the full input history" in e["error"]["message"], (st, e))
    check(s.stats()["jobs"]["continuation_lost"] >= 1, s.stats())
    # The same conversation replayed in full, cold: the same prompt, the same answer.
    st, cold = s.post("/v1/responses", dict(base, input=replay(fc), **greedy))
    check(s.stats()["last_prompt"]["kv_source"] == "cold", s.stats()["last_prompt"])
    check(cold["usage"]["input_tokens"] == u["input_tokens"], (cold["usage"], u))
    check(responses_text(cold) == responses_text(b) and cold["usage"]["output_tokens"] == 8, (cold, b))
    # The replay right after the call turn: responses-visible, the same answer.
    fc, live = call_turn()
    st, b = s.post("/v1/responses", dict(base, input=replay(fc), **greedy))
    check(s.stats()["last_prompt"]["kv_source"] == "responses-visible", s.stats()["last_prompt"])
    check(b["usage"]["input_tokens_details"]["cached_tokens"] == live and b["usage"]["input_tokens"] == u["input_tokens"],
          b["usage"])
    check(responses_text(b) == responses_text(cold), (b, cold))
    # ... and after a plain answer, the next user turn too.
    st, a = s.post("/v1/responses", dict(base, input=inp), headers=force("answer"))
    st, b = s.post("/v1/responses", dict(base, input=inp + a["output"] + [{"role": "user", "content": "Tomorrow?"}],
                                         **greedy))
    check(s.stats()["last_prompt"]["kv_source"] == "responses-visible", s.stats()["last_prompt"])
    check(b["usage"]["input_tokens_details"]["cached_tokens"] == a["usage"]["input_tokens"] + a["usage"]["output_tokens"] - 1,
          (a["usage"], b["usage"]))
    # Thinking, no summary: the client never sees the reasoning, the live
    # state keeps it (every live token is reused).
    think = dict(base, reasoning={"effort": "high"})
    st, b = s.post("/v1/responses", dict(think, input=inp), headers=force("weather_call_think"))
    check([o["type"] for o in b["output"]] == ["function_call"], b)
    fc = b["output"][0]
    live = b["usage"]["input_tokens"] + b["usage"]["output_tokens"] - 1
    st, b2 = s.post("/v1/responses", dict(think, input=replay(fc), max_output_tokens=2))
    check(s.stats()["last_prompt"]["kv_source"] == "responses-visible", s.stats()["last_prompt"])
    check(b2["usage"]["input_tokens_details"]["cached_tokens"] == live, (b["usage"], b2["usage"]))
    # Tool output only, thinking on.
    st, b = s.post("/v1/responses", dict(think, input=inp), headers=force("weather_call_think"))
    live = b["usage"]["input_tokens"] + b["usage"]["output_tokens"] - 1
    st, b3 = s.post("/v1/responses", dict(think, input=[output(b["output"][0])], max_output_tokens=2))
    check(s.stats()["last_prompt"]["kv_source"] == "responses-tool-output", s.stats()["last_prompt"])
    check(b3["usage"]["input_tokens_details"]["cached_tokens"] == live, b3["usage"])
    check(b3["usage"]["input_tokens"] == b2["usage"]["input_tokens"], (b3["usage"], b2["usage"]))
    # The hidden reasoning is in both prompts: as long as a cold replay that carries it.
    evict(s)
    reasoning = {"type": "reasoning", "summary": [{"type": "summary_text",
                                                   "text": "The user asks about the weather, so I call the tool."}]}
    st, full = s.post("/v1/responses", dict(think, input=inp + [reasoning] + replay(fc)[1:], max_output_tokens=2))
    check(s.stats()["last_prompt"]["kv_source"] == "cold" and full["usage"]["input_tokens"] == b2["usage"]["input_tokens"],
          (full["usage"], b2["usage"]))
    # A stateless replay that lacks the reasoning, no live state to restore it: a warning.
    check("lower fidelity" not in s.text(), s.text()[-2000:])
    s.post("/v1/responses", dict(think, input=replay(fc), max_output_tokens=1))
    check(s.stats()["last_prompt"]["kv_source"] == "cold" and s.text().count("lower fidelity") == 1, s.text()[-2000:])


def t_messages_continuations(s):
    """anthropic-tool-output: tool_result blocks alone continue the live tool
    call; the greedy answer is that of a cold prefill of the whole history."""
    msgs = [{"role": "user", "content": "Weather in Paris?"}]
    base = {"system": SYSTEM, "tools": ANTHROPIC_TOOLS, "thinking": {"type": "disabled"}}
    st, b = s.post("/v1/messages", dict(base, messages=msgs, max_tokens=200), headers=force("two_calls"))
    tus = [c for c in b["content"] if c["type"] == "tool_use"]
    check(len(tus) == 2, b)
    live = b["usage"]["cache_creation_input_tokens"] + b["usage"]["output_tokens"] - 1
    # The results in the other order: rendered in the order of the calls.
    results = [{"type": "tool_result", "tool_use_id": tu["id"], "content": "sunny in %s" % tu["input"]["city"]}
               for tu in reversed(tus)]
    greedy = {"temperature": 0, "max_tokens": 8}
    st, b2 = s.post("/v1/messages", dict(base, messages=[{"role": "user", "content": results}], **greedy))
    check(st == 200 and s.stats()["last_prompt"]["kv_source"] == "anthropic-tool-output", (b2, s.stats()["last_prompt"]))
    u = b2["usage"]
    check(u["cache_read_input_tokens"] == live and u["cache_creation_input_tokens"] < 30, u)
    # Only one of the two results: not the live call set, 409.
    st, e = s.post("/v1/messages", dict(base, messages=[{"role": "user", "content": results[:1]}], **greedy))
    check(st == 409 and e["type"] == "error" and "Anthropic continuation state" in e["error"]["message"], e)
    st, e = s.post("/v1/messages", dict(base, messages=[{"role": "user", "content": [
        dict(results[0], tool_use_id="toolu_unknown")]}], **greedy))
    check(st == 400 and e["type"] == "error" and "tool_use_id toolu_unknown" in e["error"]["message"], e)
    evict(s)
    full = msgs + [{"role": "assistant", "content": b["content"]}, {"role": "user", "content": results}]
    st, cold = s.post("/v1/messages", dict(base, messages=full, **greedy))
    check(s.stats()["last_prompt"]["kv_source"] == "cold", s.stats()["last_prompt"])
    cu = cold["usage"]
    check(cu["cache_creation_input_tokens"] == u["cache_read_input_tokens"] + u["cache_creation_input_tokens"], (cu, u))
    check(cold["content"] == b2["content"] and cold["stop_reason"] == b2["stop_reason"], (cold, b2))


def canonicalized_tail(s):
    """A call sampled in a non-canonical spelling, exact replay off: after
    the turn the live tail is rewritten to the canonical rendering the
    client will send back (chat and Anthropic), so the next request is a
    token-prefix hit with the greedy answer of a cold prefill."""
    msgs = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Weather in Paris?"}]
    body = {"tools": TOOLS, "thinking": False}
    st, b = s.post("/v1/chat/completions", dict(body, messages=msgs), headers=force("weather_call_loose"))
    call = b["choices"][0]["message"]["tool_calls"][0]
    check(json.loads(call["function"]["arguments"]) == WEATHER, call)
    full = msgs + [{"role": "assistant", "content": None, "tool_calls": [call]},
                   {"role": "tool", "tool_call_id": call["id"], "content": "sunny"}]
    greedy = dict(body, messages=full, max_tokens=6, temperature=0)
    st, b2 = s.post("/v1/chat/completions", greedy)
    stats = s.stats()
    check(stats["tool_memory"]["live_tails_canonicalized"] == 1 and stats["last_prompt"]["kv_source"] == "memory-token", stats)
    u = b2["usage"]["prompt_tokens_details"]
    check(u["cache_write_tokens"] < 20 and u["cached_tokens"] > b["usage"]["prompt_tokens"] + 40, b2["usage"])
    evict(s)
    st, cold = s.post("/v1/chat/completions", greedy)
    check(s.stats()["last_prompt"]["kv_source"] == "cold" and cold["usage"]["prompt_tokens"] == b2["usage"]["prompt_tokens"],
          (s.stats()["last_prompt"], cold["usage"]))
    check(cold["choices"][0]["message"] == b2["choices"][0]["message"], (cold, b2))
    # Anthropic: the same for a tool_use block.
    amsgs = [{"role": "user", "content": "Weather in Paris?"}]
    abody = {"system": SYSTEM, "tools": ANTHROPIC_TOOLS, "thinking": {"type": "disabled"}}
    st, a = s.post("/v1/messages", dict(abody, messages=amsgs, max_tokens=200), headers=force("weather_call_loose"))
    tu = [c for c in a["content"] if c["type"] == "tool_use"][0]
    afull = amsgs + [{"role": "assistant", "content": a["content"]}, {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": tu["id"], "content": "sunny"}]}]
    st, a2 = s.post("/v1/messages", dict(abody, messages=afull, max_tokens=6, temperature=0))
    stats = s.stats()
    check(stats["tool_memory"]["live_tails_canonicalized"] == 2 and stats["last_prompt"]["kv_source"] == "memory-token", stats)
    check(a2["usage"]["cache_creation_input_tokens"] < 20, a2["usage"])


def t_no_needless_canonicalization(s):
    """With exact replay every tool-call turn above (thinking or not, chat
    and Anthropic) renders back as sampled: no live tail was rewritten."""
    check(s.stats()["tool_memory"]["live_tails_canonicalized"] == 0, s.stats()["tool_memory"])


def t_checkpoint_without_replay():
    """Exact replay off: the tool call comes back rendered canonically (here
    with its arguments reordered), which the live tokens do not spell; the
    in-memory checkpoint of the previous prompt still saves its prefill."""
    with Server("--disable-exact-dsml-tool-replay") as s:
        msgs = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Weather in Paris?"}]
        st, b = s.post("/v1/chat/completions", {"messages": msgs, "tools": TOOLS, "thinking": False},
                       headers=force("weather_call"))
        call = b["choices"][0]["message"]["tool_calls"][0]
        call["function"]["arguments"] = json.dumps({"days": 3, "city": "Paris"})
        msgs2 = msgs + [{"role": "assistant", "content": None, "tool_calls": [call]},
                        {"role": "tool", "tool_call_id": call["id"], "content": "sunny"}]
        st, b2 = s.post("/v1/chat/completions", {"messages": msgs2, "tools": TOOLS, "thinking": False, "max_tokens": 2})
        st = s.stats()
        check(st["tool_memory"]["history_turns_replayed_exact"] == 0 and st["last_prompt"]["kv_source"] == "memory-checkpoint", st)
        check(b2["usage"]["prompt_tokens_details"]["cached_tokens"] == b["usage"]["prompt_tokens"], b2["usage"])
        check(st["tool_memory"]["live_tails_canonicalized"] == 0, st)  # the sampled call was canonical already
        canonicalized_tail(s)
    with Server("--no-memory-checkpoint") as s:
        body = {"messages": [{"role": "user", "content": "Again"}], "max_tokens": 3, "temperature": 0, "thinking": False}
        s.post("/v1/chat/completions", body)
        s.post("/v1/chat/completions", body)
        check(s.stats()["last_prompt"]["kv_source"] == "cold", s.stats()["last_prompt"])


def t_disk_saves():
    """Continued checkpoints in prefill and generation, evict before an unrelated prompt."""
    kvdir = tempfile.mkdtemp(prefix="ds4-kv-")
    try:
        with Server("--kv-disk-dir", kvdir, "--kv-cache-min-tokens", "16", "--kv-cache-boundary-align-tokens", "16",
                    "--kv-cache-continued-interval-tokens", "32", "--kv-cache-cold-max-tokens", "0") as s:
            st, b = s.post("/v1/chat/completions", {"messages": [{"role": "user", "content": "word " * 40}],
                                                    "max_tokens": 40, "temperature": 0, "thinking": False})
            n = b["usage"]["prompt_tokens"] + b["usage"]["completion_tokens"] - 1
            saves = s.stats()["kvcache"]["files_written_by_reason"]
            check(saves["continued"] == n // 32 and saves["cold"] == 0, (saves, n))
            st, b = s.post("/v1/chat/completions", {"messages": [{"role": "user", "content": "Something else " * 5}],
                                                    "max_tokens": 2, "temperature": 0, "thinking": False})
            check(s.stats()["kvcache"]["files_written_by_reason"]["evict"] == 1, s.stats()["kvcache"])
        names = sorted(os.listdir(kvdir))
        check(all(len(f) == 43 and f.endswith(".kv") for f in names), names)
    finally:
        shutil.rmtree(kvdir)


def t_shutdown():
    """SIGTERM mid-generation: the stream ends with an error event, the live
    session is saved ("shutdown"), the process exits 0."""
    kvdir = tempfile.mkdtemp(prefix="ds4-kv-")
    try:
        s = Server("--kv-disk-dir", kvdir, "--kv-cache-min-tokens", "16").start()
        out = {}
        body = {"messages": [{"role": "user", "content": "Long story"}], "max_tokens": 3500, "stream": True,
                "thinking": False}
        th = threading.Thread(target=lambda: out.setdefault("ev", s.stream("/v1/chat/completions", body)))
        th.start()
        wait_running(s)
        time.sleep(0.3)
        rc = s.stop()
        th.join()
        check(rc == 0, "exit status %s" % rc)
        ev = out["ev"]
        errs = [d for e, d in ev if e == "error"]
        check(errs and errs[0]["error"]["message"] == "shutdown requested", ev[-3:])
        check("saved" in s.text() and "(shutdown" in s.text(), s.text()[-500:])
        check(len([f for f in os.listdir(kvdir) if f.endswith(".kv")]) == 1, os.listdir(kvdir))
        os.unlink(s.log.name)
    finally:
        shutil.rmtree(kvdir)


def disk_run(kvdir, body):
    with Server("--kv-disk-dir", kvdir, "--kv-cache-min-tokens", "16", "--kv-cache-boundary-align-tokens", "16",
                "--kv-cache-continued-interval-tokens", "0") as s2:
        st, b = s2.post("/v1/chat/completions", body)
        check(st == 200, b)
        return b, s2.stats()


def t_disk_restart():
    kvdir = tempfile.mkdtemp(prefix="ds4-kv-")
    try:
        long_sys = SYSTEM + " " + " ".join("Rule %d: be precise about the weather." % i for i in range(12))
        body = {"messages": [{"role": "system", "content": long_sys}, {"role": "user", "content": "Weather?"}],
                "max_tokens": 10, "temperature": 0, "thinking": False}
        b1, st1 = disk_run(kvdir, body)
        check(st1["kvcache"]["files_written_by_reason"]["cold"] == 1 and b1["usage"]["prompt_tokens_details"]["cached_tokens"] == 0, st1)
        files = [f for f in os.listdir(kvdir) if f.endswith(".kv")]
        check(len(files) == 2, files)  # the cold checkpoint + the shutdown save
        b2, st2 = disk_run(kvdir, body)
        check(st2["prompts_by_kv_source"]["disk"] == 1 and st2["kvcache"]["loads"] == 1, st2)
        cached = b2["usage"]["prompt_tokens_details"]["cached_tokens"]
        check(cached > 100 and cached < b2["usage"]["prompt_tokens"], b2["usage"])
        check(b1["choices"][0]["message"]["content"] == b2["choices"][0]["message"]["content"], (b1, b2))
        # A checkpoint whose payload has flipped bytes (the layout still
        # valid: a float of the state) fails its checksum before use: it is
        # skipped (logged, removed), and the answer is the same.
        for f in os.listdir(kvdir):
            p = os.path.join(kvdir, f)
            with open(p, "r+b") as fh:
                head = fh.read(52)
                text_len = int.from_bytes(head[48:52], "little")
                payload_bytes = int.from_bytes(head[40:48], "little")
                fh.seek(52 + text_len + payload_bytes - 64)
                fh.write(b"\x5a\x5a\x5a\x5a")
        b3, st3 = disk_run(kvdir, body)
        check(st3["kvcache"]["corrupt_files_deleted"] >= 1 and st3["prompts_by_kv_source"]["cold"] == 1, st3)
        check(b3["choices"][0]["message"]["content"] == b1["choices"][0]["message"]["content"], b3)
    finally:
        shutil.rmtree(kvdir)


# ---------------------------------------------------------------- misc

def t_stop_sequences(s):
    st, b = s.post("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "stop": ["STOP"],
                                            "thinking": False}, headers=force("stop_text"))
    check(b["choices"][0]["message"]["content"] == "Hello there. " and b["choices"][0]["finish_reason"] == "stop", b)
    st, b = s.post("/v1/messages", {"messages": [{"role": "user", "content": "x"}], "max_tokens": 50,
                                    "stop_sequences": ["STOP", "zzz"], "thinking": {"type": "disabled"}},
                   headers=force("stop_text"))
    check(b["stop_reason"] == "stop_sequence" and b["stop_sequence"] == "STOP", b)
    check(b["content"][0]["text"] == "Hello there. ", b)
    ev = s.stream("/v1/completions", {"prompt": "x", "stop": "STOP", "stream": True, "thinking": False},
                  headers=force("stop_text"))
    text = "".join(d["choices"][0]["text"] for e, d in ev if e != ":" and d != "[DONE]")
    check(text == "Hello there. ", text)


def t_malformed_dsml(s):
    st, b = s.post("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "tools": TOOLS,
                                            "thinking": False}, headers=force("bad_block"))
    check(st == 200 and b["choices"][0]["message"]["content"].startswith("Text before"), b)
    check("tool_calls" not in b["choices"][0]["message"], b)
    st, b = s.post("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "tools": TOOLS,
                                            "thinking": False}, headers=force("unterminated_call"))
    check(st == 500 and "unterminated" in b["error"]["message"], b)


def expect_error(s, path, raw, status, needle, anthropic=False, headers=None):
    st, hdrs, data = s.request("POST", path, raw=raw, headers=headers)
    check(st == status, (path, raw[:80], st, data[:300]))
    b = json.loads(data)
    if anthropic:
        check(b["type"] == "error" and needle in b["error"]["message"], b)
    else:
        check(needle in b["error"]["message"] and "type" in b["error"], b)
    return b


def t_bad_requests(s):
    C, M, R, P = "/v1/chat/completions", "/v1/messages", "/v1/responses", "/v1/completions"
    expect_error(s, C, b"{not json", 400, "invalid JSON")
    expect_error(s, M, b"{not json", 400, "invalid JSON", anthropic=True)
    expect_error(s, C, b"[1,2]", 400, "JSON object")
    expect_error(s, C, b'{"messages": "hi"}', 400, "messages must be an array")
    expect_error(s, C, b'{}', 400, "missing messages")
    expect_error(s, P, b'{}', 400, "missing prompt")
    expect_error(s, R, b'{}', 400, "missing input")
    expect_error(s, C, b'{"messages":[{"role":"user","content":"x"}],"temperature":"hot"}', 400, "temperature")
    expect_error(s, C, b'{"messages":[{"role":"user","content":"x"}],"max_tokens":-1}', 400, "max_tokens")
    expect_error(s, C, b'{"messages":[{"role":"wizard","content":"x"}]}', 400, "role")
    expect_error(s, C, b'{"messages":[{"role":"user","content":"x"}],"stream":"yes"}', 400, "stream")
    expect_error(s, C, b'{"messages":[{"role":"user","content":"\xff\xfe"}]}', 400, "invalid JSON")
    expect_error(s, C, b'{"messages":[{"role":"user","content":"x"}],"n":3}', 400, "n must be 1")
    expect_error(s, C, b"[" * 300 + b"]" * 300, 400, "nested")
    expect_error(s, M, b'{"messages":[{"role":"user","content":[{"type":"hologram","source":{}}]}]}', 400,
                 "not supported", anthropic=True)
    expect_error(s, R, b'{"input":"x","previous_response_id":"resp_1"}', 400, "previous_response_id")
    expect_error(s, R, b'{"input":"x","tool_choice":"required"}', 400, "the request has no tools")
    expect_error(s, R, b'{"input":[{"type":"mystery"}]}', 400, "mystery")
    expect_error(s, C, b'{"messages":[{"role":"user","content":"x"}],"reasoning_effort":"extreme"}', 400, "effort")
    b = expect_error(s, C, json.dumps({"messages": [{"role": "user", "content": "word " * 5000}]}).encode(), 400,
                     "context size")
    check(b["error"]["code"] == "context_length_exceeded" and b["error"]["n_ctx"] == 4096, b)
    b = expect_error(s, M, json.dumps({"messages": [{"role": "user", "content": "word " * 5000}]}).encode(), 400,
                     "context size", anthropic=True)
    check(b["error"]["n_prompt_tokens"] > 4096, b)
    st, hdrs, data = s.request("POST", "/v1/nothing", raw=b"{}")
    check(st == 404 and json.loads(data)["error"]["message"] == "unknown endpoint", data)
    st, hdrs, data = s.request("GET", "/v1/chat/completions")
    check(st == 405, st)
    # The server is still fine.
    check(s.get("/health")[0] == 200, "health")


def oversized_post(s, path, body, header):
    """(status, body bytes) of a POST whose body the server refuses early.
    The server answers 413 as soon as it sees Content-Length and closes the
    connection, so sending the rest of the body may fail with a broken pipe
    or a reset; the answer is read from the socket whatever happens."""
    sock = socket.create_connection(("127.0.0.1", s.port))
    sock.settimeout(30)
    head = ("POST %s HTTP/1.1\r\nHost: 127.0.0.1\r\n%s\r\nContent-Type: application/json\r\n"
            "Content-Length: %d\r\n\r\n" % (path, header, len(body))).encode()
    try:
        sock.sendall(head + body)
    except (BrokenPipeError, ConnectionResetError):
        pass
    reply = b""
    try:
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                break
            reply += chunk
    except (ConnectionResetError, socket.timeout):
        pass
    sock.close()
    head, _, data = reply.partition(b"\r\n\r\n")
    status = int(head.split(b" ")[1]) if head.startswith(b"HTTP/") else 0
    return status, data


def t_limits_auth_cors():
    with Server("--api-key", "sekrit", "--cors", "--max-body-mb", "1") as s:
        st, b = s.post("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}]})
        check(st == 401 and b["error"]["type"] == "authentication_error", b)
        st, b = s.post("/v1/messages", {"messages": [{"role": "user", "content": "x"}]}, headers={"x-api-key": "no"})
        check(st == 401 and b["type"] == "error", b)
        st, b = s.get("/v1/models", headers={"Authorization": "Bearer sekrit"})
        check(st == 200, b)
        st, b = s.post("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "max_tokens": 2},
                       headers={"x-api-key": "sekrit"})
        check(st == 200, b)
        st, hdrs, data = s.request("OPTIONS", "/v1/chat/completions")
        check(st == 204 and hdrs.get("Access-Control-Allow-Origin") == "*", (st, hdrs))
        big = json.dumps({"messages": [{"role": "user", "content": "x" * (2 << 20)}]}).encode()
        st, data = oversized_post(s, "/v1/chat/completions", big, "Authorization: Bearer sekrit")
        check(st == 413 and "larger than" in json.loads(data)["error"]["message"], (st, data[:200]))
        check(s.get("/health")[0] == 200, "health")


def t_disconnect_cancels(s):
    before = s.stats()
    body = json.dumps({"messages": [{"role": "user", "content": "Write a long essay."}], "max_tokens": 3000,
                       "stream": True, "thinking": False}).encode()
    sock = socket.create_connection(("127.0.0.1", s.port))
    sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                 b"Content-Length: %d\r\n\r\n" % len(body) + body)
    got = sock.recv(4096)
    check(b"200" in got.split(b"\r\n")[0], got[:100])
    time.sleep(0.3)
    sock.close()
    deadline = time.time() + 10
    while time.time() < deadline:
        st = s.stats()
        if sum(st["jobs"][k] for k in ("answered", "failed", "cancelled")) > \
                sum(before["jobs"][k] for k in ("answered", "failed", "cancelled")):
            break
        time.sleep(0.05)
    gen = s.stats()["tokens"]["generated"] - before["tokens"]["generated"]
    check(gen < 3000, "generation was not cancelled (%d tokens)" % gen)
    st, b = s.post("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "max_tokens": 2})
    check(st == 200, b)
    # Non-streaming: the client gives up while its request is being generated
    # (a reset: end of input alone may be a half-close, see protocol.py).
    before = s.stats()
    body = json.dumps({"messages": [{"role": "user", "content": "Another essay."}], "max_tokens": 3000,
                       "thinking": False}).encode()
    sock = socket.create_connection(("127.0.0.1", s.port))
    sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                 b"Content-Length: %d\r\n\r\n" % len(body) + body)
    time.sleep(0.5)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()
    deadline = time.time() + 10
    while time.time() < deadline and s.stats()["jobs"]["cancelled"] == before["jobs"]["cancelled"]:
        time.sleep(0.05)
    gen = s.stats()["tokens"]["generated"] - before["tokens"]["generated"]
    check(s.stats()["jobs"]["cancelled"] == before["jobs"]["cancelled"] + 1 and gen < 3000, "not cancelled (%d tokens)" % gen)


def t_trace():
    path = tempfile.mktemp(prefix="ds4-trace-")
    try:
        with Server("--trace", path) as s:
            s.post("/v1/chat/completions", {"messages": [{"role": "user", "content": "Trace me"}], "max_tokens": 3,
                                            "thinking": False})
        text = open(path, encoding="utf-8").read()
        for needle in ("=== request chatcmpl-", "--- request json", "Trace me", "--- rendered prompt",
                       "<｜User｜>Trace me<｜Assistant｜></think>", "kv reuse cold", "finish=length", "=== end"):
            check(needle in text, (needle, text[:2000]))
    finally:
        if os.path.exists(path):
            os.unlink(path)


def t_keepalive():
    with Server("--sse-keepalive-ms", "50") as s:
        busy = threading.Thread(target=s.post, args=("/v1/chat/completions", {
            "messages": [{"role": "user", "content": "Long answer please."}], "max_tokens": 400, "thinking": False}))
        busy.start()
        wait_running(s)
        ev = s.stream("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "max_tokens": 2,
                                               "stream": True})
        busy.join()
        check(ev[0][0] == ":" and ev[0][1] == "keepalive", ev[:3])
        check(ev[-1][1] == "[DONE]", ev[-1])


def t_mtp():
    """--mtp FILE turns speculative decoding on: greedy answers are the plain
    server's token for token, sampling answers, /v1/ds4/stats counts the
    verifications (null without a block)."""
    mtp = os.path.join(ROOT, "build", "models", "server-test.mtp.gguf")
    if not os.path.exists(mtp):
        scratch = mtp + ".model.gguf"
        os.makedirs(os.path.dirname(mtp), exist_ok=True)
        subprocess.run([os.path.join(ROOT, "ds4-mkmodel"), "--preset", "tiny", "--recipe", "q8_0", "--tokenizer", TOKENIZER, "--seed",
                        "7", "-q", "-o", scratch, "--mtp", mtp], check=True)
        os.unlink(scratch)
    body = {"messages": [{"role": "user", "content": "Tell me a long story"}], "max_tokens": 24, "temperature": 0,
            "thinking": False}
    with Server(force=False) as s:
        plain = s.post("/v1/chat/completions", body)[1]["choices"][0]["message"]["content"]
        check(s.stats()["mtp"] is None, s.stats()["mtp"])
    with Server("--mtp", mtp, "--mtp-draft", "3", "--mtp-margin", "0", force=False) as s:
        st, b = s.post("/v1/chat/completions", body)
        check(st == 200 and b["choices"][0]["message"]["content"] == plain, (plain, b))
        m = s.stats()["mtp"]
        check(m["draft"] == 3 and 0 < m["verifications"] and m["drafted"] <= 3 * m["verifications"], m)
        check(0 <= m["accepted"] <= m["drafted"] and 1 <= m["tokens_per_verification"] <= 4, m)
        st, b = s.post("/v1/chat/completions", dict(body, temperature=1.0, seed=5))
        check(st == 200 and b["usage"]["completion_tokens"] > 0, b)
        check(s.stats()["mtp"]["verifications"] > m["verifications"], s.stats()["mtp"])


def main():
    with Server() as s:
        for fn in (t_models, t_count_tokens, t_chat_plain, t_greedy_is_deterministic, t_completions, t_responses, t_messages,
                   t_chat_tools, t_responses_tools, t_messages_tools, t_prefix_reuse, t_memory_text, t_thinking_visible,
                   t_responses_continuations, t_messages_continuations, t_stop_sequences,
                   t_malformed_dsml, t_bad_requests, t_disconnect_cancels, t_no_needless_canonicalization):
            t0 = time.time()
            fn(s)
            PASSED.append(fn.__name__)
            print("ok %-32s %.2fs" % (fn.__name__, time.time() - t0), flush=True)
    for fn in (t_mtp, t_disk_restart, t_checkpoint_without_replay, t_disk_saves, t_shutdown, t_limits_auth_cors, t_trace, t_keepalive):
        t0 = time.time()
        fn()
        PASSED.append(fn.__name__)
        print("ok %-32s %.2fs" % (fn.__name__, time.time() - t0), flush=True)
    print("%d passed, 0 failed" % len(PASSED))


if __name__ == "__main__":
    main()
