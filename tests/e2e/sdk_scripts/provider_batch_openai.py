"""A file batch on a model's provider batch tier with the official `openai` SDK, as a user sends it: the SDK's
Files and Batches calls unchanged but for `extra_body={"execution": "provider_batch"}` (an extension), then the
output file read as usual. Needs FREEINFERENCE_BASE_URL and FREEINFERENCE_API_KEY. Prints one JSON object."""

import json

import openai
from openai import OpenAI
from sdk_common import BASE, KEY, on_tier, wait

client = OpenAI(base_url=BASE, api_key=KEY)
lines = [{"custom_id": f"t-{i}", "method": "POST", "url": "/v1/chat/completions",
          "body": {"model": "glm-5.3-flash", "messages": [{"role": "user", "content": f"Tier question {i}."}]}}
         for i in range(4)]
upload = client.files.create(file=("tier.jsonl", "".join(json.dumps(line) + "\n" for line in lines).encode()),
                             purpose="batch")
out = {"openai": openai.__version__}
try:
    client.batches.create(input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h",
                          extra_body={"execution": "cheap"})
except openai.APIStatusError as exc:
    out["refused"] = [type(exc).__name__, exc.status_code, exc.message]
batch = client.batches.create(input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h",
                              extra_body={"execution": "provider_batch"})
out["created_execution"] = getattr(batch, "execution", None)
batch = wait(client, batch.id, timeout=120)
out.update(on_tier(batch))
content = client.files.content(batch.output_file_id).text
out["output"] = sorted([answer["custom_id"], answer["response"]["body"]["choices"][0]["message"]["content"]]
                      for answer in map(json.loads, filter(str.strip, content.splitlines())))
print(json.dumps(out))
