"""What the function roles may invoke on Amazon Bedrock, worked out from the catalog's `model_id` and `region`.

Pure (no CDK): the catalog checks at synth and the tests use it as it is; infra/functions.py turns it into
IAM statements. The ARNs keep `${AWS::Partition}` and `${AWS::AccountId}` for CloudFormation to fill in
(`Fn::Sub`), so the stack stays environment-agnostic.

Bedrock authorizes Converse and InvokeModel as `bedrock:InvokeModel` on the resource named in the call:
- a foundation model id: `arn:<partition>:bedrock:<region>::foundation-model/<id>`;
- a cross-Region (system-defined) inference profile id, `<geography>.<foundation model id>`: the profile,
  `arn:<partition>:bedrock:<region>:<account>:inference-profile/<id>`, AND the foundation model in every
  Region the profile routes to. Bedrock checks both. The destination Regions are AWS's to change, so the
  model's ARN takes Region `*` (AWS's documented pattern; a `*` also matches the empty Region of a global
  profile's model ARN), and that statement holds only for calls made through this one profile
  (condition `bedrock:InferenceProfileArn`);
- an ARN: used as it is. For an inference profile ARN, its foundation model as above; for an application
  inference profile (its id says nothing of its model) every foundation model, again only through that profile.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

PARTITION = "${AWS::Partition}"
ACCOUNT = "${AWS::AccountId}"

# What the functions call: Converse and InvokeModel (embeddings) both need bedrock:InvokeModel; ConverseStream
# (interactive `stream: true`, answered by the api function only) needs the stream action as well.
BEDROCK_STREAMING = True
INVOKE_ACTION = "bedrock:InvokeModel"
STREAM_ACTION = "bedrock:InvokeModelWithResponseStream"
# The condition key Bedrock sets on a call made through an inference profile: the profile's ARN.
PROFILE_CONDITION_KEY = "bedrock:InferenceProfileArn"

# Geography prefixes of the system-defined cross-Region inference profiles, `<prefix>.<foundation model id>`.
# A profile of another geography is named by its ARN in model_id (its prefix is then read from the ARN).
INFERENCE_PROFILE_PREFIXES = ("us", "us-gov", "eu", "apac", "jp", "au", "global")

# us-east-1, eu-central-2, ap-southeast-7, us-gov-west-1, cn-north-1, ...
_REGION = re.compile(r"[a-z]{2}(-[a-z]+){1,3}-\d{1,2}")
# A model or inference profile id: no wildcard, no `$` (the ARN is a Fn::Sub template), no space.
_MODEL_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]*")
_ARN = re.compile(
    r"arn:(?P<partition>aws[a-z-]*):bedrock:(?P<region>[a-z0-9-]*):(?P<account>\d{12})?:"
    r"(?P<type>[a-z-]+)/(?P<name>[A-Za-z0-9][A-Za-z0-9._:/-]*)"
)


def actions(streams: bool = False) -> list[str]:
    """The Bedrock actions a calling function gets: `streams` for the one that relays interactive streams."""
    return [INVOKE_ACTION, STREAM_ACTION] if streams and BEDROCK_STREAMING else [INVOKE_ACTION]


def is_region_name(region: str) -> bool:
    return bool(_REGION.fullmatch(region))


@dataclass(frozen=True)
class BedrockAccess:
    """One catalog model's Bedrock resources."""

    model_id: str  # the catalog id
    invoked: str  # the ARN the call names (a model, an inference profile, or the ARN given as is)
    # For an inference profile: the foundation model ARN(s) it routes to, allowed only through `invoked`.
    routed: str | None = None


def model_problem(bedrock_model_id: str, region: str) -> str | None:
    """What is wrong with a Bedrock entry's model_id and region as a deployment sees them, or None.
    The core catalog already requires both; here: the region's shape, and no id that would widen a grant."""
    if not is_region_name(region):
        return f"backend.region {region!r} is not an AWS Region name (like us-east-1)"
    if bedrock_model_id.startswith("arn:"):
        if not _ARN.fullmatch(bedrock_model_id):
            return (
                f"backend.model_id {bedrock_model_id!r} is not a Bedrock ARN "
                "(arn:<partition>:bedrock:<region>:<account>:<type>/<id>, no wildcard)"
            )
        return None
    if not _MODEL_ID.fullmatch(bedrock_model_id):
        return (
            f"backend.model_id {bedrock_model_id!r} is not a Bedrock model or inference profile id "
            "(letters, digits, '.', '_', ':', '-'; no wildcard)"
        )
    return None


def profile_model(profile_id: str) -> str | None:
    """The foundation model id of a cross-Region inference profile id (`us.anthropic...` ->
    `anthropic...`), or None when the id names a foundation model."""
    prefix, dot, rest = profile_id.partition(".")
    return rest if dot and rest and prefix in INFERENCE_PROFILE_PREFIXES else None


def access(model_id: str, bedrock_model_id: str, region: str) -> BedrockAccess:
    """The resources a Bedrock catalog entry needs (checked with `model_problem` first)."""
    match = _ARN.fullmatch(bedrock_model_id)
    if match:
        kind, name = match["type"], match["name"]
        routed = None
        if kind == "inference-profile":
            _, _, base = name.partition(".")
            routed = f"arn:{match['partition']}:bedrock:*::foundation-model/{base or name}"
        elif kind == "application-inference-profile":
            routed = f"arn:{match['partition']}:bedrock:*::foundation-model/*"
        return BedrockAccess(model_id, bedrock_model_id, routed)
    base = profile_model(bedrock_model_id)
    if base is None:
        return BedrockAccess(model_id, f"arn:{PARTITION}:bedrock:{region}::foundation-model/{bedrock_model_id}")
    return BedrockAccess(
        model_id,
        f"arn:{PARTITION}:bedrock:{region}:{ACCOUNT}:inference-profile/{bedrock_model_id}",
        f"arn:{PARTITION}:bedrock:*::foundation-model/{base}",
    )
