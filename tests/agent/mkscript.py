#!/usr/bin/env python3
# mkscript.py - write a ds4-agent test script (tests/agent/script.h): a JSON
# array with the exact text of each model round.  Rounds are given as
# arguments:
#   say:TEXT                 a plain answer, ended with the end token
#   think:REASONING|TEXT     reasoning, then an answer (thinking mode)
#   call:TOOL:K=V:K=V...     a tool-call block (V starting with '#' is
#                            written with string="false": numbers, booleans)
#   calls:TOOL:K=V,TOOL:...  several calls in one block (';' separates calls)
#   free                     the model samples this round
#   name:NAME                (--server) the X-DS4-Test-Output name
# Usage: mkscript.py OUT.json ROUND...
import json
import sys

EOS = "<｜end▁of▁sentence｜>"


def invoke(spec):
    name, *params = spec.split(":")
    s = '<｜DSML｜invoke name="%s">\n' % name
    for p in params:
        k, v = p.split("=", 1)
        raw = v.startswith("#")
        s += '<｜DSML｜parameter name="%s" string="%s">%s</｜DSML｜parameter>\n' % (
            k, "false" if raw else "true", v[1:] if raw else v.replace("\\n", "\n"))
    return s + "</｜DSML｜invoke>\n"


def block(pre, specs):
    return pre + "\n\n<｜DSML｜tool_calls>\n" + "".join(invoke(s) for s in specs) + "</｜DSML｜tool_calls>"


def item(arg):
    if arg == "free":
        return None
    kind, _, rest = arg.partition(":")
    if kind == "say":
        return rest + EOS
    if kind == "think":
        r, _, t = rest.partition("|")
        return r + "</think>" + t + EOS
    if kind == "call":
        return block("Calling a tool.", [rest])
    if kind == "calls":
        return block("Calling tools.", rest.split(";"))
    if kind == "name":
        return rest
    sys.exit("mkscript.py: unknown round " + arg)


json.dump([item(a) for a in sys.argv[2:]], open(sys.argv[1], "w"), ensure_ascii=False)
