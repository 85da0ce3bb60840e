#!/usr/bin/env python3
# chat.py - one OpenAI chat request to a ds4-server for the agent's tests:
# the system message and tools come from an agent KV file (kvc.py tools), so
# the server renders the very prompt the agent wrote.  Prints the cached
# prompt tokens the server reports.
#   chat.py URL KVFILE FORCE_NAME|- MESSAGE_JSON...
import json
import subprocess
import sys
import urllib.request

url, kv, force = sys.argv[1], sys.argv[2], sys.argv[3]
st = json.loads(subprocess.check_output([sys.executable, "tests/agent/kvc.py", "tools", kv]))
messages = [{"role": "system", "content": st["system"]}] + [json.loads(m) for m in sys.argv[4:]]
body = {"model": "deepseek-v4-flash", "messages": messages, "tools": st["tools"], "thinking": False,
        "max_tokens": 8, "temperature": 0}
req = urllib.request.Request(url + "/v1/chat/completions", json.dumps(body).encode(),
                             {"Content-Type": "application/json"})
if force != "-":
    req.add_header("X-DS4-Test-Output", force)
with urllib.request.urlopen(req, timeout=120) as r:
    answer = json.load(r)
print(answer["usage"]["prompt_tokens_details"]["cached_tokens"])
