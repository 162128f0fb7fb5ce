"""cdk-nag (v3) wiring: the AwsSolutions pack as a CDK validation plugin, and reasoned acknowledgments.

cdk-nag 3 reports through CDK's policy-validation framework: registered on the app, it fails `app.synth()`
(and so `make synth`, `cdk synth`, `cdk deploy`) on any unacknowledged finding. Acknowledgments are
`Validations.of(construct).acknowledge(...)` on the construct (or an ancestor) that holds the resource;
wildcard findings are acknowledged one by one, e.g. `AwsSolutions-IAM5[Action::s3:GetObject*]`.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from aws_cdk import Acknowledgment, App, CfnResource, Stack, Validations
from cdk_nag import AwsSolutionsChecks
from constructs import IConstruct


def apply_nag(app: App) -> AwsSolutionsChecks:
    """Register the AwsSolutions pack so synthesis fails on unacknowledged findings."""
    pack = AwsSolutionsChecks(app)
    Validations.of(app).add_plugins(pack)
    return pack


# When set (tests only), acknowledgments are recorded here instead of applied, so a test can check that
# each one still matches a real finding: a stale acknowledgment is a reason nobody re-reads.
_recorded: list[tuple[str, str]] | None = None


def acknowledge(scope: IConstruct, rule_id: str, reason: str) -> None:
    """Acknowledge one cdk-nag finding on `scope` and everything under it, with the reason on record."""
    if len(reason.strip()) < 10:
        raise ValueError(f"acknowledging {rule_id} needs a real reason")
    if _recorded is not None:
        _recorded.append((scope.node.path, rule_id))
        return
    Validations.of(scope).acknowledge(Acknowledgment(id=rule_id, reason=reason))


@contextmanager
def recording_acknowledgments() -> Iterator[list[tuple[str, str]]]:
    """Within this block, `acknowledge` only records (construct path, rule id) pairs."""
    global _recorded
    previous, _recorded = _recorded, []
    try:
        yield _recorded
    finally:
        _recorded = previous


def acknowledge_all(scope: IConstruct, findings: dict[str, str]) -> None:
    """Acknowledge several findings on one scope: {rule id: reason}."""
    for rule_id, reason in findings.items():
        acknowledge(scope, rule_id, reason)


def nag_ref(resource: IConstruct, attribute: str = "Arn") -> str:
    """How cdk-nag prints a `Fn::GetAtt` of `resource` in a finding id: `<LogicalId.Arn>`."""
    cfn = resource if CfnResource.is_cfn_resource(resource) else resource.node.default_child
    if not isinstance(cfn, CfnResource):
        raise TypeError(f"{resource.node.path} has no CloudFormation resource")
    stack = Stack.of(cfn)
    logical_id = stack.resolve(cfn.logical_id)
    return f"<{logical_id}.{attribute}>"
