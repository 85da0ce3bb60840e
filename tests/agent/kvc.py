#!/usr/bin/env python3
# kvc.py - read a KVC file's header and key text (bytes that are not UTF-8,
# which a model may sample, are kept as they are) (spec: docs/AGENT.md,
# "Sessions"; the layout is the disk KV cache's, engine/kvcache.h), with the
# standard library only, for the agent's shell tests.
#   kvc.py reason FILE   save reason (1 cold ... 5 agent-system, 6 agent-session)
#   kvc.py tokens FILE   cached token count
#   kvc.py text FILE     the key text (the transcript)
#   kvc.py ids FILE      the token ids of the session payload
#   kvc.py tools FILE    the system message and tools of the key text, as the
#                        OpenAI "messages"/"tools" JSON of a chat request
import json
import struct
import sys

REASONS = {0: "unknown", 1: "cold", 2: "continued", 3: "evict", 4: "shutdown", 5: "agent-system", 6: "agent-session"}


def read(path, ids=False):
    with open(path, "rb") as f:
        head = f.read(52)
        if head[:3] != b"KVC" or head[3] != 1:
            sys.exit("kvc.py: %s: not a KVC v1 file" % path)
        n_tokens = struct.unpack_from("<I", head, 8)[0]
        (text_len,) = struct.unpack_from("<I", head, 48)
        text = f.read(text_len).decode("utf-8", "surrogateescape")
        if ids:
            # DSV4 payload: 13 u32 (magic first, the token count 8th), then the ids
            p = struct.unpack("<13I", f.read(52))
            if p[0] != 0x34565344:
                sys.exit("kvc.py: %s: no DSV4 payload" % path)
            return list(struct.unpack("<%dI" % p[7], f.read(4 * p[7])))
    return head[5], n_tokens, text


BOS = "<｜begin▁of▁sentence｜>"
TOOLS_HEAD = "\n\n## Tools\n\n"
SCHEMAS = "### Available Tool Schemas\n\n"
TOOLS_TAIL = "\n\nYou MUST strictly follow the above defined tool name and parameter schemas to invoke tool calls.\n"


def main():
    what, path = sys.argv[1], sys.argv[2]
    if what == "ids":
        print(" ".join(map(str, read(path, True))))
        return
    reason, n, text = read(path)
    if what == "reason":
        print(REASONS[reason])
    elif what == "tokens":
        print(n)
    elif what == "text":
        sys.stdout.buffer.write(text.encode("utf-8", "surrogateescape"))
    elif what == "tools":
        # BOS + instructions + "## Tools" section with one schema per line
        body = text[len(BOS):]
        content, _, rest = body.partition(TOOLS_HEAD)
        schemas = rest.partition(SCHEMAS)[2].partition(TOOLS_TAIL)[0]
        tools = [{"type": "function", "function": json.loads(line)} for line in schemas.split("\n")]
        print(json.dumps({"system": content, "tools": tools}, ensure_ascii=False))
    else:
        sys.exit("kvc.py: unknown command " + what)


main()
