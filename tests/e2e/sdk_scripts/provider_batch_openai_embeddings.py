"""An embeddings file batch on a Titan model's provider batch tier (Amazon Bedrock's batch inference) with the
official `openai` SDK, as a user sends it: the SDK's Files and Batches calls unchanged but for
`extra_body={"execution": "provider_batch"}`, then the output file read as usual. Needs FREEINFERENCE_BASE_URL,
FREEINFERENCE_API_KEY and TIER_MODEL. Prints one JSON object."""

import json
import os

import openai
from openai import OpenAI
from sdk_common import BASE, KEY, on_tier, wait

client = OpenAI(base_url=BASE, api_key=KEY)
# Bedrock's jobs take at least 100 records, one text each.
lines = [{"custom_id": f"e-{i}", "method": "POST", "url": "/v1/embeddings",
          "body": {"model": os.environ["TIER_MODEL"], "input": f"Passage {i} to index." if i % 2
                   else [f"Passage {i} to index."]}} for i in range(100)]
upload = client.files.create(file=("embed.jsonl", "".join(json.dumps(line) + "\n" for line in lines).encode()),
                             purpose="batch")
batch = client.batches.create(input_file_id=upload.id, endpoint="/v1/embeddings", completion_window="24h",
                              extra_body={"execution": "provider_batch"})
out = {"openai": openai.__version__, "created_execution": getattr(batch, "execution", None)}
batch = wait(client, batch.id, timeout=120)
out.update(on_tier(batch))
content = client.files.content(batch.output_file_id).text
out["output"] = {answer["custom_id"]: [[item["embedding"] for item in answer["response"]["body"]["data"]],
                                       answer["response"]["body"]["usage"]["prompt_tokens"]]
                 for answer in map(json.loads, filter(str.strip, content.splitlines()))}
print(json.dumps(out))
